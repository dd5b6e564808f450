//! `netpol-e2e chaos`: the agent killed at random moments, and the tools and the datastore
//! failing under it, on a simulated cluster with real pods and real probes.
//!
//! Two nodes, pods on both, the real agent on each; node 0's agent is the one abused. Each
//! round makes one random change (`gen`: policy add/edit/delete, pod or namespace relabel, pod
//! added or deleted) and SIGKILLs node 0's agent, with every process it started (its process
//! group, as a container's end takes them), at one of these moments:
//! - a random time 0–400 ms after the change was written;
//! - inside an `iptables-restore` or an `ipset restore`, before the real tool runs, with part
//!   of the input fed to it, or after it finished but before the agent heard (`shim`: the
//!   tools are stand-ins on the agent's `PATH` that say when they got there and wait, so the
//!   window is hit exactly, not by timing luck);
//! - before the change (the change happens while the agent is down);
//! - twice: once at random, then again inside the first restore after the restart.
//!
//! From just before the change until the restarted agent has converged, a prober sweeps every
//! pair and port that the objects deny both before and after the change (`oracle`, which
//! judges from the objects alone) and counts each one that connects: a violation. After the
//! restart the round measures the time until node 0's kernel holds exactly what `netpol-agent
//! compile` renders for the new objects (and still does after the agent's first full apply),
//! checks that nothing of ours leaked (no `cali` chain in any table or set beyond what compile
//! renders, no process left in the node besides the agent), and probes every pair against the
//! oracle. Conntrack is flushed on the nodes at the start of each round, so a UDP probe cannot
//! ride an entry left by an earlier round in which its pair was allowed.
//!
//! `--faults` then runs the fault scenarios (`faults`): restore tools failing and hanging, the
//! xtables lock held by someone else for 30 s (on a lock file of the node's own, through
//! `XTABLES_LOCKFILE`, never the host's `/run/xtables.lock`), and the manifest directory
//! removed: the rules in place stay (probes and kernel reads), and the agent recovers once the
//! fault ends.

mod faults;
mod gen;
pub mod oracle;
mod shim;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;

use crate::cluster::{diff, Backend, Cluster, ClusterConfig};
use crate::cni::Cni;
use crate::expect::{mismatches, render, TruthTable};
use crate::family::{addr_of, FamilyMode};
use crate::probe::{self, Job};
use crate::scenario::{PortKey, Protocol, World, WorldBuilder};
use crate::services::ServiceProxy;
use gen::Gen;
use oracle::Oracle;
use shim::{Kind, Point, Shims};

/// The node whose agent is killed.
const VICTIM: usize = 0;
const NODES: usize = 2;
/// What every round probes: the served TCP and UDP ports and a TCP port nothing serves.
const KEYS: [PortKey; 3] = [
    PortKey {
        protocol: Protocol::Tcp,
        port: 80,
    },
    PortKey {
        protocol: Protocol::Tcp,
        port: 81,
    },
    PortKey {
        protocol: Protocol::Udp,
        port: 81,
    },
];
/// How long a restarted agent may take before the round gives up waiting.
const CONVERGE_GIVE_UP: Duration = Duration::from_secs(15);
/// Where the agent's health server listens inside the node.
const HEALTH_PORT: u16 = 9099;

#[derive(Args)]
pub struct ChaosArgs {
    /// Kill-and-restart rounds.
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Seed of the random changes and kill moments (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Also run the fault scenarios (failing and hanging tools, the xtables lock, the
    /// manifest directory removed) after the rounds.
    #[arg(long)]
    faults: bool,
    /// How long a failing or hanging tool and a removed directory last, in seconds.
    #[arg(long, default_value_t = 10)]
    fault_secs: u64,
    /// How long someone else holds the xtables lock, in seconds.
    #[arg(long, default_value_t = 30)]
    lock_secs: u64,
    /// The bar: a restarted agent must have the kernel right within this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    converge_limit_ms: u64,
    /// iptables backend of the nodes (the agent detects it).
    #[arg(long, value_enum, default_value = "nft")]
    iptables_backend: Backend,
    #[arg(long, value_enum, default_value = "calico")]
    cni: Cni,
    #[arg(long, value_enum, default_value = "ipv4")]
    ip_family: FamilyMode,
    /// Timeout of one probe, in milliseconds.
    #[arg(long, default_value_t = 300)]
    probe_timeout_ms: u64,
    /// Probes in flight.
    #[arg(long, default_value_t = 24)]
    probe_workers: usize,
    /// The netpol-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
}

/// Entry point of the subcommand.
pub fn main(args: ChaosArgs, default_agent: PathBuf, stop: Arc<AtomicBool>) -> ExitCode {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("netpol-e2e: chaos needs root (it creates network namespaces)");
        return ExitCode::from(2);
    }
    let agent = args.agent.clone().unwrap_or(default_agent);
    if !agent.exists() {
        eprintln!(
            "netpol-e2e: agent binary {} not found (build it, or pass --agent)",
            agent.display()
        );
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!(
        "chaos: {} rounds{}, seed {seed}, backend {:?}, cni {}, ip family {}",
        args.rounds,
        if args.faults {
            " and the fault scenarios"
        } else {
            ""
        },
        args.iptables_backend,
        args.cni.name(),
        args.ip_family.name()
    );
    let started = Instant::now();
    let result = Harness::new(&args, agent, seed).and_then(|mut h| {
        let mut report = Report::default();
        for round in 1..=args.rounds {
            if stop.load(Ordering::Relaxed) {
                println!("interrupted");
                break;
            }
            let r = h.round(round)?;
            println!("{}", r.line);
            report.add(r);
        }
        let mut fault_results = Vec::new();
        if args.faults && !stop.load(Ordering::Relaxed) {
            fault_results = faults::run_all(&mut h, &args, &stop)?;
        }
        Ok((report, fault_results))
    });
    match result {
        Ok((report, fault_results)) => {
            let mut failed = report.print(args.converge_limit_ms);
            for f in &fault_results {
                println!(
                    "fault {}: {}",
                    f.name,
                    if f.passed { "ok" } else { "FAILED" }
                );
                failed |= !f.passed;
            }
            println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
            let total = report.rounds + fault_results.len();
            let bad = report.failed_rounds + fault_results.iter().filter(|f| !f.passed).count();
            println!("{} passed, {} failed", total - bad, bad);
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("netpol-e2e chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How node 0's agent is stopped in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    Timed(Duration),
    Tool(Kind, Point, u32),
    /// Killed before the change is written.
    Down,
    /// Killed at random, then again inside a restore of the restarted agent.
    Twice(Duration, Kind, Point),
}

impl Kill {
    fn pick(rng: &mut XorShiftRng) -> Kill {
        let point = |rng: &mut XorShiftRng| match rng.random_range(0..3) {
            0 => Point::Before,
            1 => Point::Mid(rng.random_range(0..1000)),
            _ => Point::After,
        };
        let kind = |rng: &mut XorShiftRng| {
            if rng.random_bool(0.55) {
                Kind::Iptables
            } else {
                Kind::Ipset
            }
        };
        match rng.random_range(0..20) {
            0..=4 => Kill::Timed(Duration::from_millis(rng.random_range(0..400))),
            5..=15 => {
                let k = kind(rng);
                let p = point(rng);
                // An apply runs `ipset restore` twice (additions, then removals) and one
                // `iptables-restore` per family.
                let skip = match k {
                    Kind::Ipset => rng.random_range(0..=1),
                    Kind::Iptables => 0,
                };
                Kill::Tool(k, p, skip)
            }
            16 | 17 => Kill::Down,
            _ => {
                let d = Duration::from_millis(rng.random_range(0..400));
                let k = kind(rng);
                let p = point(rng);
                Kill::Twice(d, k, p)
            }
        }
    }

    fn label(self) -> String {
        let point = |p: Point| match p {
            Point::Before => "before".to_string(),
            Point::Mid(m) => format!("mid {m}‰"),
            Point::After => "after".to_string(),
        };
        match self {
            Kill::Timed(d) => format!("timed {} ms", d.as_millis()),
            Kill::Tool(k, p, skip) => format!("{} {} (skip {skip})", k.name(), point(p)),
            Kill::Down => "down".into(),
            Kill::Twice(d, k, p) => {
                format!("timed {} ms, then {} {}", d.as_millis(), k.name(), point(p))
            }
        }
    }

    /// The tally key: which window was aimed at.
    fn window(self) -> String {
        match self {
            Kill::Timed(_) => "timed".into(),
            Kill::Tool(k, Point::Before, _) => format!("{} before", k.name()),
            Kill::Tool(k, Point::Mid(_), _) => format!("{} mid", k.name()),
            Kill::Tool(k, Point::After, _) => format!("{} after", k.name()),
            Kill::Down => "down".into(),
            Kill::Twice(..) => "twice".into(),
        }
    }
}

pub(crate) struct Harness {
    cluster: Cluster,
    shims: Shims,
    builder: WorldBuilder,
    gen: Gen,
    /// Node 0's agent environment beyond the cluster's.
    env: Vec<(String, String)>,
    families: FamilyMode,
    probe_timeout: Duration,
    probe_workers: usize,
    converge_limit: Duration,
    backend: Backend,
}

/// What one round found.
pub(crate) struct RoundResult {
    line: String,
    window: String,
    /// The window aimed at was hit (a tool run stopped there), for tool kills.
    hit: Option<bool>,
    violations: usize,
    sweeps: usize,
    probes: usize,
    converge: Option<Duration>,
    leaks: Vec<String>,
    mismatch: bool,
    passed: bool,
}

impl Harness {
    fn new(args: &ChaosArgs, agent: PathBuf, seed: u64) -> anyhow::Result<Harness> {
        let cfg = ClusterConfig {
            agent,
            cni: args.cni,
            backend: args.iptables_backend,
            converge_timeout: Duration::from_secs(30),
            family: args.ip_family,
            proxy: ServiceProxy::Iptables,
            deny_logs: false,
            flow_logs: false,
            spoof_observers: false,
            source_check: true,
            auto_wiring: false,
            policy_union_min: None,
        };
        let mut gen = Gen::new(XorShiftRng::seed_from_u64(seed), NODES);
        let builder = gen.initial()?;
        let tag = format!("chaos-{}", std::process::id());
        let mut cluster = Cluster::new(cfg, NODES, &tag)?;
        let shims = Shims::install(cluster.work_dir(), args.iptables_backend)?;
        cluster.sync(&builder.world)?;
        let lock = |i: usize| cluster.work_dir().join(format!("xtables-node-{i}.lock"));
        // Every agent of the harness takes a lock file of its node's own: the host's
        // /run/xtables.lock is shared with everything else on this machine.
        let env = vec![
            ("PATH".to_string(), shims.path_env()),
            (
                "XTABLES_LOCKFILE".into(),
                lock(VICTIM).display().to_string(),
            ),
            ("FELIX_LOGSEVERITYSCREEN".into(), "DEBUG".into()),
            ("FELIX_HEALTHENABLED".into(), "true".into()),
            ("FELIX_HEALTHHOST".into(), "127.0.0.1".into()),
            ("FELIX_HEALTHPORT".into(), HEALTH_PORT.to_string()),
            ("FELIX_DATAPLANEWATCHDOGTIMEOUT".into(), "5".into()),
        ];
        let other = vec![(
            "XTABLES_LOCKFILE".to_string(),
            lock(1).display().to_string(),
        )];
        cluster.start_agent(VICTIM, &env)?;
        cluster.start_agent(1, &other)?;
        cluster
            .wait_converged()
            .map_err(|e| anyhow::anyhow!("the first convergence: {e}"))?;
        Ok(Harness {
            cluster,
            shims,
            builder,
            gen,
            env,
            families: args.ip_family,
            probe_timeout: Duration::from_millis(args.probe_timeout_ms),
            probe_workers: args.probe_workers,
            converge_limit: Duration::from_millis(args.converge_limit_ms),
            backend: args.iptables_backend,
        })
    }

    fn round(&mut self, n: usize) -> anyhow::Result<RoundResult> {
        self.flush_conntrack();
        let old = self.builder.world.clone();
        let mut what = self.gen.change(&mut self.builder)?;
        let mid = self.builder.world.clone();
        let kill = Kill::pick(self.gen.rng());
        // A kill aimed at a restore needs one to happen: the nudge makes sure node 0 has an
        // `ipset restore` and an `iptables-restore` to run (see `nudge`).
        if matches!(kill, Kill::Tool(..) | Kill::Twice(..)) && self.nudge(n)? {
            what.push_str(" + nudge");
        }
        let new = self.builder.world.clone();
        let mut notes = Vec::new();

        // The nudge never denies a pod anything (it admits every pod), so what `old` and `new`
        // both deny, `mid` denies too.
        let watch = ProbeWatch::start(self, &self.must_block(&old, &new)?);
        let mut hit = None;
        match kill {
            Kill::Timed(d) => {
                self.cluster.sync(&new)?;
                std::thread::sleep(d);
                self.cluster.kill_agent(VICTIM);
            }
            Kill::Twice(d, ..) => {
                // The random change before the first kill, the nudge while the agent is down,
                // so the restarted agent has restores to run.
                self.cluster.sync(&mid)?;
                std::thread::sleep(d);
                self.cluster.kill_agent(VICTIM);
                self.cluster.sync(&new)?;
            }
            Kill::Tool(kind, point, skip) => {
                self.shims.arm(kind, point, skip)?;
                self.cluster.sync(&new)?;
                let reached = self.shims.wait_reached(Duration::from_millis(1500));
                hit = Some(reached.is_some());
                notes.push(reached.unwrap_or_else(|| "no such run: killed anyway".into()));
                self.cluster.kill_agent(VICTIM);
            }
            Kill::Down => {
                self.cluster.kill_agent(VICTIM);
                self.cluster.sync(&new)?;
            }
        }
        watch.set_phase("agent down");
        let down_at = Instant::now();
        // The outage lasts at least one full sweep of the probes, plus a random while.
        watch.wait_sweeps(1, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(self.gen.rng().random_range(0..300)));
        self.shims.reset()?;
        let want = self.cluster.want(VICTIM)?;
        if let Kill::Twice(_, kind, point) = kill {
            self.shims.arm(kind, point, 0)?;
            watch.set_phase("restarting");
            self.cluster.start_agent(VICTIM, &self.env)?;
            match self.shims.wait_reached(Duration::from_millis(1500)) {
                Some(said) => {
                    hit = Some(true);
                    notes.push(format!("second kill: {said}"));
                    self.cluster.kill_agent(VICTIM);
                    watch.set_phase("agent down");
                    watch.wait_sweeps(1, Duration::from_secs(10));
                    self.shims.reset()?;
                }
                None => {
                    hit = Some(false);
                    notes.push("no restore after the restart: second kill skipped".into());
                    self.shims.reset()?;
                }
            }
        }
        let down = down_at.elapsed();
        watch.set_phase("restarting");
        let applies_before = self.first_applies();
        let restarted = Instant::now();
        if self.cluster.agent_pid(VICTIM).is_none() {
            self.cluster.start_agent(VICTIM, &self.env)?;
        }
        let converge = self.converge(&want, restarted);
        let mut problems = Vec::new();
        match &converge {
            Ok(_) => {
                // Still right after the restarted agent's first full apply.
                if !self.wait_first_apply(applies_before + 1, Duration::from_secs(10)) {
                    problems.push("the restarted agent never finished its first apply".into());
                }
                let have = self.cluster.have(VICTIM)?;
                if have != want {
                    problems.push(format!(
                        "the kernel changed after the first apply: {}",
                        diffs(&want, &have)
                    ));
                }
            }
            Err(e) => problems.push(e.clone()),
        }
        let log = watch.finish();
        if let Err(e) = self.cluster.wait_converged() {
            problems.push(format!("the cluster did not converge: {e}"));
        }
        let leaks = self.leaks(&want)?;
        let mismatch = match self.check_all_pairs(&new)? {
            None => false,
            Some(text) => {
                problems.push(format!("probes disagree with the objects:\n{text}"));
                true
            }
        };
        let converge = converge.ok();
        let slow = converge.is_none_or(|d| d > self.converge_limit);
        let passed = log.violations.is_empty() && leaks.is_empty() && problems.is_empty() && !slow;
        let mut line = format!(
            "round {n}: {what} | kill: {} | down {:.2} s | ",
            kill.label(),
            down.as_secs_f64()
        );
        match converge {
            Some(d) => {
                let _ = write!(line, "converged {} ms after the restart", d.as_millis());
            }
            None => line.push_str("NOT converged"),
        }
        let _ = write!(
            line,
            " | {} sweeps, {} probes, {} violations | {}",
            log.sweeps,
            log.probes,
            log.violations.len(),
            if passed { "ok" } else { "FAILED" }
        );
        for note in &notes {
            let _ = write!(line, "\n    {note}");
        }
        for v in &log.violations {
            let _ = write!(line, "\n    VIOLATION: {v}");
        }
        for l in &leaks {
            let _ = write!(line, "\n    LEAK: {l}");
        }
        for p in &problems {
            let _ = write!(line, "\n    {p}");
        }
        if !passed {
            let _ = write!(
                line,
                "\n    node-0 agent log:\n{}",
                indent(&self.cluster.agent_log_tail(VICTIM, 40))
            );
        }
        Ok(RoundResult {
            line,
            window: kill.window(),
            hit,
            violations: log.violations.len(),
            sweeps: log.sweeps,
            probes: log.probes,
            converge,
            leaks,
            mismatch,
            passed,
        })
    }

    /// Rewrites the policy `chaos-nudge` in the namespace of a node-0 pod: it isolates that
    /// namespace's pods for ingress and admits every pod through a selector on a label key
    /// new in each round (`nudge-<round>` absent), so node 0 must create a set, rewrite a
    /// rule and remove the previous set. It admits every pod on every port, so no verdict
    /// between pods changes. False when no pod runs on node 0.
    fn nudge(&mut self, round: usize) -> anyhow::Result<bool> {
        let Some(ns) = self
            .builder
            .world
            .pods
            .values()
            .find(|p| p.node == VICTIM)
            .map(|p| p.namespace.clone())
        else {
            return Ok(false);
        };
        self.builder
            .world
            .policies
            .retain(|k, _| !k.ends_with("/chaos-nudge"));
        self.builder.apply(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {{name: chaos-nudge, namespace: {ns}}}\n\
             spec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n\
             \x20 - from: [{{podSelector: {{matchExpressions: [{{key: nudge-{round}, operator: DoesNotExist}}]}}}}]\n"
        ))?;
        Ok(true)
    }

    /// Established flows of earlier rounds must not answer for new probes (see the module
    /// documentation).
    fn flush_conntrack(&self) {
        for i in 0..self.cluster.node_count() {
            let _ = self
                .cluster
                .node_netns(i)
                .exec_ok("conntrack", &["-F"], None);
        }
    }

    /// Probe jobs for every pair and key that `old` and `new` both deny, between pods that
    /// exist (the same pods) in both.
    fn must_block(&self, old: &World, new: &World) -> anyhow::Result<Vec<Job>> {
        let (o, n) = (Oracle::new(old)?, Oracle::new(new)?);
        let same = |key: &str| match (old.pods.get(key), new.pods.get(key)) {
            (Some(a), Some(b)) => a.uid == b.uid,
            _ => false,
        };
        let mut jobs = Vec::new();
        for (from_key, from) in old.pods.iter().filter(|(k, _)| same(k)) {
            for (to_key, to) in old.pods.iter().filter(|(k, _)| same(k)) {
                if from_key == to_key {
                    continue;
                }
                for key in KEYS {
                    let (nf, nt) = (&new.pods[from_key], &new.pods[to_key]);
                    if !o.allowed(from, to, key) && !n.allowed(nf, nt, key) {
                        jobs.extend(self.jobs(from_key, to_key, key));
                    }
                }
            }
        }
        Ok(jobs)
    }

    /// One job per family for a pair, through the destination's ClusterIP.
    fn jobs(&self, from: &str, to: &str, key: PortKey) -> Vec<Job> {
        let (Some(f), Some(t)) = (self.cluster.pods.get(from), self.cluster.pods.get(to)) else {
            return Vec::new();
        };
        self.families
            .families()
            .iter()
            .map(|&family| Job {
                key,
                from: from.to_string(),
                from_netns: f.handle.clone(),
                to: to.to_string(),
                to_uid: t.pod.uid,
                addr: addr_of(t.pod.cluster_ip, family),
            })
            .collect()
    }

    /// Polls node 0 until it holds `want`; the time since `since`.
    fn converge(
        &mut self,
        want: &[netpol_agent::dataplane::owned::OwnedState],
        since: Instant,
    ) -> Result<Duration, String> {
        loop {
            let have = self.cluster.have(VICTIM).map_err(|e| format!("{e:#}"))?;
            if have == want {
                return Ok(since.elapsed());
            }
            if since.elapsed() > CONVERGE_GIVE_UP {
                return Err(format!(
                    "node-0 did not converge within {CONVERGE_GIVE_UP:?} of the restart: {}",
                    diffs(want, &have)
                ));
            }
            if self.cluster.agent_pid(VICTIM).is_none() {
                return Err("the restarted agent exited".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How many first full applies node 0's agents logged so far (the log is appended to
    /// across restarts).
    fn first_applies(&self) -> usize {
        let path = self.cluster.work_dir().join("agent-node-0.log");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .matches("first full apply done")
            .count()
    }

    fn wait_first_apply(&self, count: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.first_applies() >= count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// What of ours node 0 holds beyond `want`: chains in any table, sets of any family,
    /// processes other than the agent.
    fn leaks(
        &mut self,
        want: &[netpol_agent::dataplane::owned::OwnedState],
    ) -> anyhow::Result<Vec<String>> {
        let mut leaks = Vec::new();
        let agent = self.cluster.agent_pid(VICTIM);
        let netns = self.cluster.node_netns(VICTIM);
        let chains: std::collections::BTreeSet<&String> =
            want.iter().flat_map(|w| w.chains.keys()).collect();
        let sets: std::collections::BTreeSet<&String> =
            want.iter().flat_map(|w| w.sets.keys()).collect();
        for tool in [
            self.backend
                .tool_for(netpol_agent::model::IpFamily::V4, "save"),
            self.backend
                .tool_for(netpol_agent::model::IpFamily::V6, "save"),
        ] {
            // Our chains belong in the filter table of the families the agent programs.
            let programmed = tool.starts_with("iptables")
                || self.families.has(netpol_agent::model::IpFamily::V6);
            let text = netns.exec_ok(&tool, &[], None)?;
            let mut table = "";
            for line in text.lines() {
                if let Some(t) = line.strip_prefix('*') {
                    table = t;
                } else if let Some(decl) = line.strip_prefix(':') {
                    let name = decl.split_whitespace().next().unwrap_or_default();
                    let wanted =
                        programmed && table == "filter" && chains.contains(&name.to_string());
                    if name.starts_with("cali") && !wanted {
                        leaks.push(format!("chain {name} in {tool} -t {table}"));
                    }
                }
            }
        }
        for name in netns.exec_ok("ipset", &["list", "-n"], None)?.lines() {
            if name.starts_with("cali") && !sets.contains(&name.to_string()) {
                leaks.push(format!("set {name}"));
            }
        }
        for pid in processes_in(&format!("/run/netns/{}", netns.name))? {
            // The running agent and what it runs now (a restarted agent's first reads can
            // still be going when its rules already converged); a killed agent's leftovers
            // have lost it as their ancestor.
            if !agent.is_some_and(|a| descends_from(pid, a)) {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ");
                leaks.push(format!("process {pid} in the node: {}", cmd.trim()));
            }
        }
        Ok(leaks)
    }

    /// Probes every pair and key against the oracle, once more after a second if they
    /// differ; the failing tables, if any.
    fn check_all_pairs(&self, world: &World) -> anyhow::Result<Option<String>> {
        let oracle = Oracle::new(world)?;
        let pods: Vec<String> = world.pods.keys().cloned().collect();
        let mut tables = std::collections::BTreeMap::new();
        for key in KEYS {
            let mut t = TruthTable::all(&pods, false);
            for from in world.pods.values() {
                for to in world.pods.values() {
                    if from.uid != to.uid {
                        t.set(&from.key(), &to.key(), oracle.allowed(from, to, key));
                    }
                }
            }
            tables.insert(key, t);
        }
        let mut jobs = Vec::new();
        for from in &pods {
            for to in &pods {
                if from != to {
                    for key in KEYS {
                        jobs.extend(self.jobs(from, to, key));
                    }
                }
            }
        }
        let mut text = String::new();
        for attempt in 0..2 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(1));
            }
            let (seen, _) = probe::run(
                jobs.clone(),
                self.probe_workers,
                Duration::from_millis(1000),
                &self.cluster.sctp,
            );
            text.clear();
            for (&(family, key), observed) in &seen {
                let want = &tables[&key];
                if !mismatches(want, observed).is_empty() {
                    let _ = writeln!(
                        text,
                        "over {}:\n{}",
                        crate::family::family_name(family),
                        render(key, want, observed)
                    );
                }
            }
            if text.is_empty() {
                return Ok(None);
            }
        }
        let mut policies = String::new();
        for (k, doc) in &world.policies {
            let _ = writeln!(policies, "--- {k}\n{doc}");
        }
        Ok(Some(format!("{text}policies:\n{policies}")))
    }

    /// GET `path` of node 0's agent health server: the status code.
    fn health(&self, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let netns = self.cluster.node_netns(VICTIM);
        crate::netns::in_netns(&netns.handle, || {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", HEALTH_PORT)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            answer.split_whitespace().nth(1)?.parse().ok()
        })
        .ok()
        .flatten()
    }
}

fn diffs(
    want: &[netpol_agent::dataplane::owned::OwnedState],
    have: &[netpol_agent::dataplane::owned::OwnedState],
) -> String {
    want.iter()
        .zip(have)
        .map(|(w, h)| diff(w, h))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

/// Processes whose network namespace is the one bound at `ns_path`.
/// Whether `pid` is `ancestor` or one of its descendants (by parent process ids in /proc).
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut at = pid;
    // A chain of parents is short; the bound only guards against a /proc read racing exits.
    for _ in 0..64 {
        if at == ancestor {
            return true;
        }
        match parent_of(at) {
            Some(p) if p > 1 => at = p,
            _ => return false,
        }
    }
    false
}

/// The parent process id from /proc/<pid>/stat (the field after the `(comm)`, which may hold
/// spaces and parentheses itself).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

fn processes_in(ns_path: &str) -> anyhow::Result<Vec<u32>> {
    use std::os::unix::fs::MetadataExt;
    let target = std::fs::metadata(ns_path)?;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) {
            if m.ino() == target.ino() && m.dev() == target.dev() {
                out.push(pid);
            }
        }
    }
    Ok(out)
}

/// What the continuous prober saw.
#[derive(Default)]
struct ProbeLog {
    sweeps: usize,
    probes: usize,
    violations: Vec<String>,
}

/// Sweeps a fixed list of probes that must all stay blocked, again and again, on a thread of
/// its own, until finished; every probe that connects is a violation, noted with the phase
/// of the round it happened in.
struct ProbeWatch {
    stop: Arc<AtomicBool>,
    sweeps: Arc<AtomicUsize>,
    phase: Arc<Mutex<&'static str>>,
    handle: JoinHandle<ProbeLog>,
}

impl ProbeWatch {
    fn start(h: &Harness, jobs: &[Job]) -> ProbeWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let sweeps = Arc::new(AtomicUsize::new(0));
        let phase = Arc::new(Mutex::new("change written"));
        let (jobs, workers, timeout, sctp) = (
            jobs.to_vec(),
            h.probe_workers,
            h.probe_timeout,
            h.cluster.sctp.clone(),
        );
        let (s, n, p) = (stop.clone(), sweeps.clone(), phase.clone());
        let handle = std::thread::spawn(move || {
            let mut log = ProbeLog::default();
            while !s.load(Ordering::Relaxed) {
                if jobs.is_empty() {
                    n.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let (seen, _) = probe::run(jobs.clone(), workers, timeout, &sctp);
                let now = *p.lock().expect("not poisoned");
                for (&(family, key), observed) in &seen {
                    for ((from, to), outcome) in observed {
                        log.probes += 1;
                        if outcome.connected() {
                            log.violations.push(format!(
                                "{from} -> {to} {key} over {} connected while {now}",
                                crate::family::family_name(family)
                            ));
                        }
                    }
                }
                log.sweeps += 1;
                n.fetch_add(1, Ordering::Relaxed);
            }
            log
        });
        ProbeWatch {
            stop,
            sweeps,
            phase,
            handle,
        }
    }

    fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().expect("not poisoned") = phase;
    }

    /// Waits until `n` more sweeps completed.
    fn wait_sweeps(&self, n: usize, timeout: Duration) {
        let target = self.sweeps.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + timeout;
        while self.sweeps.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn finish(self) -> ProbeLog {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// The figures over all rounds.
#[derive(Default)]
struct Report {
    rounds: usize,
    failed_rounds: usize,
    violations: usize,
    sweeps: usize,
    probes: usize,
    converge: Vec<Duration>,
    not_converged: usize,
    leaks: usize,
    mismatches: usize,
    /// Window → (aimed, hit).
    windows: std::collections::BTreeMap<String, (usize, usize)>,
}

impl Report {
    fn add(&mut self, r: RoundResult) {
        self.rounds += 1;
        self.failed_rounds += usize::from(!r.passed);
        self.violations += r.violations;
        self.sweeps += r.sweeps;
        self.probes += r.probes;
        match r.converge {
            Some(d) => self.converge.push(d),
            None => self.not_converged += 1,
        }
        self.leaks += r.leaks.len();
        self.mismatches += usize::from(r.mismatch);
        let slot = self.windows.entry(r.window).or_default();
        slot.0 += 1;
        slot.1 += usize::from(r.hit.unwrap_or(true));
    }

    /// Prints the figures; whether anything failed.
    fn print(&self, limit_ms: u64) -> bool {
        if self.rounds == 0 {
            return false;
        }
        let mut c = self.converge.clone();
        c.sort();
        let pct = |p: f64| -> String {
            if c.is_empty() {
                return "-".into();
            }
            let i = ((c.len() as f64 * p).ceil() as usize).clamp(1, c.len()) - 1;
            format!("{}", c[i].as_millis())
        };
        let over = c
            .iter()
            .filter(|d| d.as_millis() > u128::from(limit_ms))
            .count();
        println!("== chaos figures");
        println!("rounds: {} ({} failed)", self.rounds, self.failed_rounds);
        println!(
            "violations: {} (in {} sweeps, {} probes of pairs denied before and after each change)",
            self.violations, self.sweeps, self.probes
        );
        println!(
            "convergence after the restart: p50 {} ms, p99 {} ms, max {} ms; over {limit_ms} ms: {over}; not converged: {}",
            pct(0.50),
            pct(0.99),
            c.last().map_or(0, |d| d.as_millis()),
            self.not_converged
        );
        println!("leaks: {}", self.leaks);
        println!(
            "rounds whose probes disagreed with the objects: {}",
            self.mismatches
        );
        let windows: Vec<String> = self
            .windows
            .iter()
            .map(|(w, (aimed, hit))| format!("{w} {hit}/{aimed}"))
            .collect();
        println!("kill windows (hit/aimed): {}", windows.join(", "));
        self.failed_rounds > 0
    }
}

#[cfg(test)]
mod tests {
    use super::descends_from;
    use std::time::{Duration, Instant};

    #[test]
    fn a_grandchild_descends_from_us_and_init_does_not() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        // The grandchild: a process whose parent is the shell.
        let deadline = Instant::now() + Duration::from_secs(5);
        let grandchild = loop {
            let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                (super::parent_of(pid) == Some(child.id())).then_some(pid)
            });
            if let Some(pid) = found {
                break pid;
            }
            assert!(Instant::now() < deadline, "the shell started no sleep");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(descends_from(grandchild, me));
        assert!(descends_from(grandchild, child.id()));
        assert!(!descends_from(child.id(), grandchild));
        assert!(!descends_from(1, me));
        let _ = child.kill();
        let _ = child.wait();
        // The orphaned sleep: reparented away from us, no longer ours.
        let deadline = Instant::now() + Duration::from_secs(5);
        while descends_from(grandchild, me) {
            assert!(Instant::now() < deadline, "the orphan still counts as ours");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
