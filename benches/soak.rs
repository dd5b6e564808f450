//! Soak beside kube-proxy (issue 16): the real agent and a kube-proxy-like writer on one node
//! for a while, both rewriting iptables at once. Prints figures; the exit status says whether
//! anything was lost.
//!
//! `cargo bench --bench soak` (root; `-- --secs 600` for the ten minutes, default 60;
//! `--backends legacy,nft`; `--writer-hz 50`; `--change-ms 100`; `--keep DIR` keeps the
//! agent's log, the reads that found something lost and, on nft, an `nft monitor` record of
//! every commit, for finding out why; Ctrl-C or SIGTERM ends the churn early and still
//! reports and cleans up) runs, per backend, in a
//! network namespace of its own:
//! - the agent (`netpol-agent run --datastore dir:…`, IPv4) on a small synthetic cluster
//!   (`support/synthetic.rs`: 400 pods, 40 of them local, 40 policies);
//! - the writer: `iptables-<backend>-restore --noflush --wait` 50 times a second, each time
//!   redeclaring (so flushing) and refilling its own chains in `filter` (`KUBE-SERVICES`,
//!   `KUBE-FORWARD`) and `nat` (`KUBE-SERVICES`, ten `KUBE-SVC-*`, ten `KUBE-SEP-*`), every
//!   rule carrying the write's generation in a comment; its jumps from the built-in chains
//!   are put in once at the start, as kube-proxy does;
//! - a policy change every 100 ms: one policy of a namespace with local pods rewritten with a
//!   new port (`10000 + generation`) and a new peer selector, so every change needs an
//!   `ipset restore` and an `iptables-restore` from the agent;
//! - a checker, every 100 ms: reads both tables and counts a lost write of the writer when a
//!   chain of its holds an older generation than its last acknowledged write (or misses a
//!   chain or a jump), and a lost write of the agent when the generation of its churned rule
//!   goes back or is missing, or its jump from `FORWARD` is gone. A read that fails is
//!   counted apart and judges nothing: iptables-save (both backends) asks for the name of a
//!   `-m set` match's set only when it prints the rule, and exits 2 ("Set with index N in
//!   kernel doesn't exist") with its output cut short when the set was destroyed after it
//!   read the rules — here the agent's previous selector set, destroyed once no rule names
//!   it. Before the bench looked at the exit status, such reads were counted as the agent's
//!   rule missing.
//!
//! The writer and the checker run their tools from threads that joined the namespace
//! (`setns`), not through `ip netns exec`, which costs about 4 ms a start.
//!
//! At the end both stop; the writer's last write must be whole in the kernel, and the agent's
//! rules and sets must equal what `netpol-agent compile` renders. From the agent's metrics:
//! restore runs and failed ones (each failure is retried), applies that failed, times the
//! kernel checks found our rules or sets changed by someone (and those that could not tell), and the apply time (p50/p99, read off
//! the histogram's buckets, so an upper bound).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::write_atomic;
use common::Agent;
use netpol_agent::dataplane::owned::OwnedState;
use netpol_agent::model::IpFamily;
use synthetic::{Scale, APPS};

const SEED: u64 = 7;
const SERVICES: usize = 10;
const METRICS_PORT: u16 = 9091;
const CHURN_NS: &str = "ns-0";

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("npa-bench-{}-{tag}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name}");
        let ns = Netns(name);
        ns.sh("ip link set lo up");
        ns
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }

    fn sh(&self, script: &str) -> String {
        let out = self
            .cmd("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Moves the calling thread into the namespace, so the programs it starts run there
    /// without `ip netns exec` (about 4 ms a start here, a fifth of a restore's time).
    fn join_this_thread(&self) {
        let file = std::fs::File::open(format!("/run/netns/{}", self.0)).expect("netns file");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    }
}

/// Runs `program args` (from a thread that joined the namespace): its standard output, or why
/// it failed (exit status and standard error).
fn run_here(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Feeds `input` to `program args` (from a thread that joined the namespace); whether it
/// exited 0.
fn feed_here(program: &str, args: &[&str], input: &str) -> bool {
    let Ok(mut child) = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let wrote = child
        .stdin
        .take()
        .is_some_and(|mut s| s.write_all(input.as_bytes()).is_ok());
    child.wait().is_ok_and(|s| s.success()) && wrote
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scale() -> Scale {
    Scale {
        pods: 400,
        policies: 40,
        namespaces: 10,
        local: 40,
        dual: false,
        cluster_policies: 0,
    }
}

/// The churned policy, generation `g`: a new port and a new peer selector each time.
fn churn_policy(g: u64) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{name: soak-churn, namespace: {CHURN_NS}}}\n\
         spec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n\
         \x20 - from: [{{podSelector: {{matchLabels: {{app: app-{}}}}}}}]\n\
         \x20   ports: [{{port: {}, protocol: TCP}}]\n",
        g % APPS as u64,
        churn_port(g)
    )
}

fn churn_port(g: u64) -> u64 {
    10_000 + g % 50_000
}

/// The writer's restore input, generation `g`.
fn writer_script(g: u64) -> String {
    let c = format!("-m comment --comment soak-gen-{g}");
    let mut s = String::from("*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n");
    s += &format!("-A KUBE-FORWARD -m conntrack --ctstate INVALID {c} -j DROP\n");
    s += &format!("-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 {c} -j ACCEPT\n");
    for k in 0..SERVICES {
        s += &format!("-A KUBE-SERVICES -d 10.96.1.{k}/32 -p tcp --dport 81 {c} -j REJECT\n");
    }
    s += "COMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n";
    for k in 0..SERVICES {
        s += &format!(":KUBE-SVC-{k:016} - [0:0]\n:KUBE-SEP-{k:016} - [0:0]\n");
    }
    for k in 0..SERVICES {
        s += &format!(
            "-A KUBE-SERVICES -d 10.96.0.{k}/32 -p tcp --dport 80 {c} -j KUBE-SVC-{k:016}\n\
             -A KUBE-SVC-{k:016} {c} -j KUBE-SEP-{k:016}\n\
             -A KUBE-SEP-{k:016} -p tcp {c} -j DNAT --to-destination 10.0.{}.{}:8080\n",
            g % 200,
            k + 1
        );
    }
    s + "COMMIT\n"
}

/// The jumps kube-proxy keeps in the built-in chains (table, chain, target).
const JUMPS: [(&str, &str, &str); 4] = [
    ("filter", "FORWARD", "KUBE-FORWARD"),
    ("filter", "OUTPUT", "KUBE-SERVICES"),
    ("nat", "PREROUTING", "KUBE-SERVICES"),
    ("nat", "OUTPUT", "KUBE-SERVICES"),
];

/// What a read of both tables says: the writer's chains' generations (all must agree with
/// each other and be at least `acked`), its jumps, the agent's churned port.
fn check(filter: &str, nat: &str, acked: u64) -> (Vec<String>, Option<u64>) {
    let mut problems = Vec::new();
    let gens = |text: &str, chain: &str| -> Vec<u64> {
        let prefix = format!("-A {chain} ");
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| {
                l.split("soak-gen-")
                    .nth(1)
                    .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse().ok())
            })
            .collect()
    };
    let mut chains = vec![
        (filter, "filter", "KUBE-FORWARD".to_string(), 2),
        (filter, "filter", "KUBE-SERVICES".to_string(), SERVICES),
        (nat, "nat", "KUBE-SERVICES".to_string(), SERVICES),
    ];
    for k in 0..SERVICES {
        chains.push((nat, "nat", format!("KUBE-SVC-{k:016}"), 1));
        chains.push((nat, "nat", format!("KUBE-SEP-{k:016}"), 1));
    }
    for (text, table, chain, rules) in chains {
        let g = gens(text, &chain);
        if g.len() != rules {
            problems.push(format!("{table} {chain}: {} rules, not {rules}", g.len()));
        } else if let Some(old) = g.iter().find(|&&x| x < acked) {
            problems.push(format!(
                "{table} {chain}: generation {old} after write {acked} was acknowledged"
            ));
        }
    }
    for (table, chain, target) in JUMPS {
        let text = if table == "filter" { filter } else { nat };
        let rule = format!("-A {chain} -j {target}");
        let n = text.lines().filter(|l| l.trim_end() == rule).count();
        if n != 1 {
            problems.push(format!("{table} {chain}: {n} jumps to {target}"));
        }
    }
    // The agent's churned rule: the port of a rule in one of our chains.
    let port = filter
        .lines()
        .filter(|l| l.starts_with("-A cali"))
        .filter_map(|l| {
            // One port renders as `--dport N` or `-m multiport --dports N`.
            l.split(" --dport")
                .nth(1)
                .map(|r| r.trim_start_matches('s'))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|p| p.parse::<u64>().ok())
        })
        .filter(|&p| p >= 10_000)
        .max();
    (problems, port)
}

/// `name{labels} value` lines of a Prometheus text page whose name and labels start with
/// `prefix`, summed.
fn metric(page: &str, prefix: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// p-quantile of a Prometheus histogram (bucket upper bounds).
fn quantile(page: &str, name: &str, p: f64) -> String {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(String, f64)> = page
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|r| {
            let (le, rest) = r.split_once("\"}")?;
            Some((le.to_string(), rest.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, n)| *n >= total * p)
        .map_or("-".into(), |(le, _)| match le.parse::<f64>() {
            Ok(s) => format!("≤{:.0} ms", s * 1000.0),
            Err(_) => le.clone(),
        })
}

struct Options {
    secs: u64,
    /// Set by SIGINT or SIGTERM: the run ends early, still cleaning up and reporting.
    interrupted: Arc<AtomicBool>,
    backends: Vec<String>,
    writer_hz: u64,
    change_ms: u64,
    keep: Option<PathBuf>,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    Options {
        secs: value("--secs").and_then(|v| v.parse().ok()).unwrap_or(60),
        interrupted: Arc::new(AtomicBool::new(false)),
        backends: value("--backends")
            .unwrap_or("legacy,nft".into())
            .split(',')
            .filter(|b| matches!(*b, "legacy" | "nft"))
            .map(String::from)
            .collect(),
        writer_hz: value("--writer-hz")
            .and_then(|v| v.parse().ok())
            .unwrap_or(50),
        change_ms: value("--change-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(100),
        keep: value("--keep").map(PathBuf::from),
    }
}

/// One backend's soak; whether nothing was lost.
fn soak(agent_bin: &Path, backend: &str, opts: &Options) -> bool {
    let ipt = format!("iptables-{backend}");
    let ns = Arc::new(Netns::new(&format!("soak-{backend}")));
    let dir = TempDir(
        std::env::temp_dir().join(format!("npa-bench-soak-{}-{backend}", std::process::id())),
    );
    let manifests = dir.0.join("cluster");
    std::fs::create_dir_all(&manifests).unwrap();
    synthetic::write_cluster(&manifests, scale(), SEED, 0, 0);
    write_atomic(&manifests, "churn.yaml", &churn_policy(0));

    // The writer's chains and jumps are there before the agent, as on a node.
    assert!(
        std::thread::scope(|sc| sc
            .spawn(|| {
                ns.join_this_thread();
                feed_here(&format!("{ipt}-restore"), &["--noflush"], &writer_script(0))
            })
            .join()
            .unwrap()),
        "the writer's first restore"
    );
    for (table, chain, target) in JUMPS {
        ns.sh(&format!("{ipt} -t {table} -A {chain} -j {target}"));
    }

    let log = dir.0.join("agent.log");
    let mut cmd = ns.cmd(&agent_bin.display().to_string());
    cmd.args(["run", "--node", synthetic::NODE, "--datastore"])
        .arg(format!("dir:{}", manifests.display()))
        .env("FELIX_IPTABLESBACKEND", backend)
        .env("FELIX_IPV6SUPPORT", "false")
        .env("FELIX_LOGSEVERITYSCREEN", "Info")
        .env("FELIX_PROMETHEUSMETRICSENABLED", "true")
        .env("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1")
        .env("FELIX_PROMETHEUSMETRICSPORT", METRICS_PORT.to_string());
    let agent = Agent::spawn(cmd, &log);
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("first full apply done")
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{backend}: no first apply in 60 s:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The churned policy is in force before the clock starts.
    let start = Instant::now();
    loop {
        let filter = ns.sh(&format!("{ipt}-save -t filter"));
        if check(&filter, "", 0).1 == Some(churn_port(0)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{backend}: the churned policy never reached the kernel:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let scrape = || ns.sh(&format!("curl -s http://127.0.0.1:{METRICS_PORT}/metrics"));
    let page0 = scrape();
    let monitor = match (&opts.keep, backend) {
        (Some(keep), "nft") => {
            std::fs::create_dir_all(keep).unwrap();
            let out = std::fs::File::create(keep.join("nft-monitor.txt")).unwrap();
            ns.cmd("nft")
                .args(["-a", "monitor"])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(Stdio::null())
                .spawn()
                .ok()
                .map(|child| Agent::adopt(child, None))
        }
        _ => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, acked, ns, ipt) = (stop.clone(), acked.clone(), ns.clone(), ipt.clone());
        let period = Duration::from_micros(1_000_000 / opts.writer_hz.max(1));
        std::thread::spawn(move || {
            ns.join_this_thread();
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut g = 0;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                g += 1;
                if feed_here(
                    &format!("{ipt}-restore"),
                    &["--noflush", "--wait", "5"],
                    &writer_script(g),
                ) {
                    acked.store(g, Ordering::SeqCst);
                    ok += 1;
                } else {
                    failed += 1;
                }
                next += period;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                } else {
                    next = Instant::now();
                }
            }
            (ok, failed, g)
        })
    };
    let checker = {
        let (stop, acked, ns, ipt) = (stop.clone(), acked.clone(), ns.clone(), ipt.clone());
        std::thread::spawn(move || {
            ns.join_this_thread();
            let (mut reads, mut writer_lost, mut agent_lost) = (0u64, 0u64, 0u64);
            let mut failed_reads = (0u64, None);
            let mut last_port = 0;
            let mut examples = Vec::new();
            let mut missed_reads = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let before = acked.load(Ordering::SeqCst);
                // A save that fails says nothing about the kernel: its output stops short.
                // iptables-save names the set of a `-m set` match only while printing, so a
                // set destroyed after the rules were read (the agent's old selector set, once
                // no rule of the new ruleset names it) fails the whole read.
                let save = format!("{ipt}-save");
                let read = run_here(&save, &["-t", "filter"])
                    .and_then(|f| Ok((f, run_here(&save, &["-t", "nat"])?)));
                let (filter, nat) = match read {
                    Ok(both) => both,
                    Err(why) => {
                        failed_reads.0 += 1;
                        failed_reads.1.get_or_insert(why);
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                reads += 1;
                let (problems, port) = check(&filter, &nat, before);
                if !problems.is_empty() {
                    writer_lost += 1;
                    if examples.len() < 5 {
                        examples.push(problems.join("; "));
                    }
                }
                let jump = filter.lines().any(|l| l.contains("-j cali-FORWARD"));
                match port {
                    Some(p) if p >= last_port && jump => last_port = p,
                    _ => {
                        agent_lost += 1;
                        if missed_reads.len() < 20 {
                            missed_reads.push(filter.clone());
                        }
                        if examples.len() < 5 {
                            examples.push(format!(
                                "agent: churned port {port:?} after {last_port}, jump {jump}"
                            ));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (
                reads,
                writer_lost,
                agent_lost,
                examples,
                missed_reads,
                failed_reads,
            )
        })
    };
    let mut changes = 0u64;
    let run = Duration::from_secs(opts.secs);
    let began = Instant::now();
    while began.elapsed() < run && !opts.interrupted.load(Ordering::Relaxed) {
        changes += 1;
        write_atomic(&manifests, "churn.yaml", &churn_policy(changes));
        std::thread::sleep(Duration::from_millis(opts.change_ms));
    }
    stop.store(true, Ordering::Relaxed);
    let (w_ok, w_failed, w_last) = writer.join().unwrap();
    let (reads, writer_lost, agent_lost, examples, missed_reads, failed_reads) =
        checker.join().unwrap();

    // Settled: the writer's last acknowledged write whole, the agent's state as compiled.
    let acked = acked.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = compiled(agent_bin, &manifests, backend, &dir.0);
    let settled = loop {
        let filter = ns.sh(&format!("{ipt}-save -t filter"));
        let nat = ns.sh(&format!("{ipt}-save -t nat"));
        let (problems, port) = check(&filter, &nat, acked);
        let mut have = OwnedState::default();
        have.add_iptables(&filter, &netpol_agent::agent::OWNERSHIP);
        have.add_ipsets(&ns.sh("ipset save"), IpFamily::V4);
        let mut settled = problems;
        if port != Some(churn_port(changes)) {
            settled.push(format!(
                "agent: churned port {port:?}, not the last change's"
            ));
        } else if have != want {
            settled.push("agent: the kernel differs from what compile renders".into());
        }
        if settled.is_empty() || Instant::now() > deadline {
            break settled;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let page = scrape();
    drop(agent);
    drop(monitor);
    if let Some(keep) = &opts.keep {
        std::fs::create_dir_all(keep).unwrap();
        let _ = std::fs::copy(&log, keep.join(format!("agent-{backend}.log")));
        for (i, read) in missed_reads.iter().enumerate() {
            std::fs::write(keep.join(format!("missed-{backend}-{i}.txt")), read).unwrap();
        }
    }
    let delta = |prefix: &str| metric(&page, prefix) - metric(&page0, prefix);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let retry_lines = log_text.lines().filter(|l| l.contains("retrying")).count();
    let secs = began.elapsed().as_secs_f64();
    println!(
        "soak {backend:6} {:.0} s: writer {w_ok} writes ({:.1}/s), {w_failed} failed, last {w_last}; agent {changes} changes ({:.1}/s)",
        secs,
        w_ok as f64 / secs,
        changes as f64 / secs
    );
    println!(
        "soak {backend:6}   lost writes: writer {writer_lost}, agent {agent_lost} (in {reads} reads of both tables); settled: {}",
        if settled.is_empty() {
            "writer's last write whole, agent's state as compiled".to_string()
        } else {
            settled.join("; ")
        }
    );
    if let (n @ 1.., Some(why)) = failed_reads {
        println!("soak {backend:6}   reads that failed (not counted): {n}, e.g. {why}");
    }
    println!(
        "soak {backend:6}   agent: iptables-restore {} runs, {} failed (retried); ipset {} runs, {} failed; applies {} ({} failed); kernel checks that found ours changed by someone {} (could not tell, so read: {}); log lines 'retrying' {retry_lines}",
        delta("netpol_iptables_restore_calls_total"),
        delta("netpol_iptables_restore_errors_total"),
        delta("netpol_ipset_calls_total"),
        delta("netpol_ipset_errors_total"),
        delta("netpol_dataplane_apply_seconds_count"),
        delta("netpol_dataplane_apply_failures_total"),
        delta("netpol_dataplane_kernel_checks_total{result=\"changed\"}"),
        delta("netpol_dataplane_kernel_checks_total{result=\"unknown\"}"),
    );
    println!(
        "soak {backend:6}   agent apply time (whole run incl. the first apply): p50 {}, p99 {}; mean {:.1} ms",
        quantile(&page, "netpol_dataplane_apply_seconds", 0.50),
        quantile(&page, "netpol_dataplane_apply_seconds", 0.99),
        delta("netpol_dataplane_apply_seconds_sum") * 1000.0
            / delta("netpol_dataplane_apply_seconds_count").max(1.0)
    );
    for e in &examples {
        println!("soak {backend:6}   e.g. {e}");
    }
    writer_lost == 0 && agent_lost == 0 && settled.is_empty()
}

/// What `netpol-agent compile` renders for the node (IPv4).
fn compiled(agent_bin: &Path, manifests: &Path, backend: &str, work: &Path) -> OwnedState {
    let (sets, rules) = (work.join("want.ipset"), work.join("want.iptables"));
    let out = Command::new(agent_bin)
        .args(["compile", "--node", synthetic::NODE, "--manifests"])
        .arg(manifests)
        .arg("--ipsets-out")
        .arg(&sets)
        .arg("--iptables-out")
        .arg(&rules)
        .env("FELIX_IPTABLESBACKEND", backend)
        .env("FELIX_IPV6SUPPORT", "false")
        .stdin(Stdio::null())
        .output()
        .expect("netpol-agent compile");
    assert!(
        out.status.success(),
        "compile: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut state = OwnedState::default();
    state.add_iptables(
        &std::fs::read_to_string(&rules).unwrap(),
        &netpol_agent::agent::OWNERSHIP,
    );
    state.add_ipsets(&std::fs::read_to_string(&sets).unwrap(), IpFamily::V4);
    state
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") && std::env::args().any(|a| a == "--list") {
        return;
    }
    if !nix_root() {
        eprintln!("soak: needs root (network namespaces); skipped");
        return;
    }
    let opts = options();
    // Interrupted, the run stops its churn and still settles, reports and removes its
    // namespace (a default SIGINT would leave it behind, as Drop never runs).
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(signal, opts.interrupted.clone()) {
            eprintln!("soak: cannot catch signal {signal}: {e}");
        }
    }
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_netpol-agent"));
    let mut ok = true;
    for backend in &opts.backends {
        if opts.interrupted.load(Ordering::Relaxed) {
            break;
        }
        ok &= soak(&agent, backend, &opts);
    }
    if opts.interrupted.load(Ordering::Relaxed) {
        eprintln!("soak: interrupted; what ran is reported above, and its namespace is gone");
        ok = false;
    }
    if !ok {
        std::process::exit(1);
    }
}

fn nix_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
