//! The agent against a real kube-apiserver (issue 40, item 1): the synthetic cluster as API
//! objects, and agents, one per simulated node, measured with the API server's own costs.
//! Driven by `scripts/kube-scale.sh`, which starts etcd, kube-apiserver and kwok in a network
//! namespace of their own and removes everything at the end; this program only owns the
//! agents' namespaces and processes (removed when it ends, also on a panic) and prints
//! figures. It asserts nothing about time.
//!
//! ```text
//! kube_real emit --out FILE --pods P --nodes N --namespaces NS --policies K [--local L]
//! kube_real agents --kubeconfig K --api-netns NS --api-pid PID --etcd-pid PID
//!     --metrics CMD --counts 1,4,8 [--rest S] [--churn CMD] [--probe CMD] [--probes K]
//!     [--check]
//! ```
//!
//! - emit: the cluster of `support/synthetic.rs` (the same draws as the other scale
//!   benchmarks: one app per pod, then the policies) as JSON lines for the loader
//!   (`e2e/k8s/build/kwok/scale-load`): namespaces, NetworkPolicies, then pods without status
//!   (kwok gives them addresses). Pods `0..L` (default 110, the kubelet's default maximum)
//!   are on `node-0`, the agent measured in full; the others are spread over `node-1` …
//!   `node-(N-1)` (the generator itself would make `P / L` nodes of `L` pods; the issue's
//!   cluster has 5k nodes of 30 pods around one of 110).
//! - agents: for each count N of `--counts`, N agents (`node-0` … `node-(N-1)`), each the real
//!   binary (`netpol-agent run --datastore kubernetes`, legacy iptables) with its real
//!   dataplane in a network namespace of its own, joined to the API server's namespace by a
//!   veth on its bridge (`br0`, 10.99.0.1/16); all N started at once, as after an API server
//!   restart or a DaemonSet rollout. Measured: each agent's time from start to its first full
//!   apply and RSS at rest; the API server's and etcd's CPU seconds and RSS (`/proc`);
//!   the bytes the API server's side of each veth sent (TCP and TLS included, so what the
//!   network carries per agent); the API server's watch events (`--metrics`, a command that
//!   prints its `/metrics`). Then `--rest` seconds at rest (default 60) and, with `--churn`,
//!   while that command runs (the loader's churn), the same figures as rates. N = 0 is the
//!   API server alone, the baseline each agent's cost is read against.
//! - With `--probe` (a command that runs `scale-load probe`): event → enforced for agent-0
//!   (`support/enforced.rs`), `--probes` probes (default 30, four a second) after the rest
//!   window, then one a second for as long as the churn runs. Each probe is three writes
//!   that every agent receives: the churn's figures include them.
//! - `--check` (the smoke in the test command): besides the figures, each round's outcomes
//!   are checks, printed and counted (`N passed, M failed` last; exit status 1 on a failure):
//!   every agent applied and was still running at the end, every probe was enforced (at
//!   least one, none timed out or failed; a probe whose sets churn changed under it is
//!   neither, and such probes may not outnumber the measured ones), and the churn's writes
//!   all succeeded. Never a time: the figures are for reading.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/enforced.rs"]
mod enforced;
#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{NetNs, TempDir};
use procfs::{cpu_seconds, line_time, status_kib};
use synthetic::{Rng, Scale, APPS};

/// How long an agent is left alone after its first apply before its RSS counts as at rest.
const SETTLE: Duration = Duration::from_secs(5);
/// Start-up limit for all agents of a round: 150k pods on two cores for dozens of agents.
const START_LIMIT: Duration = Duration::from_secs(3600);

fn main() {
    common::require_root();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let opt = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: usize| -> usize {
        opt(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} {v:?} is not a number"))
        })
    };
    let need = |name: &str| opt(name).unwrap_or_else(|| panic!("{name} is required"));
    match args.first().map(String::as_str) {
        Some("emit") => emit(
            Path::new(&need("--out")),
            Scale {
                pods: num("--pods", 1500),
                policies: num("--policies", 100),
                namespaces: num("--namespaces", 50),
                local: num("--local", 110),
                dual: false,
                cluster_policies: 0,
            },
            num("--nodes", 50),
        ),
        Some("agents") => {
            let counts: Vec<usize> = need("--counts")
                .split(',')
                .map(|c| {
                    c.trim()
                        .parse()
                        .expect("--counts: numbers, comma-separated")
                })
                .collect();
            let env = Env {
                kubeconfig: need("--kubeconfig"),
                api_netns: need("--api-netns"),
                api_pid: num("--api-pid", 0) as u32,
                etcd_pid: num("--etcd-pid", 0) as u32,
                metrics: need("--metrics"),
                probe: opt("--probe"),
                probes: num("--probes", 30),
            };
            let rest = Duration::from_secs(num("--rest", 60) as u64);
            let churn = opt("--churn");
            let mut checks = Checks::default();
            for (k, n) in counts.into_iter().enumerate() {
                round(&env, k, n, rest, churn.as_deref(), &mut checks);
            }
            if args.iter().any(|a| a == "--check") {
                println!("{} passed, {} failed", checks.passed, checks.failed);
                if checks.failed > 0 {
                    std::process::exit(1);
                }
            }
        }
        _ => panic!("kube_real emit|agents (see the header of benches/kube_real.rs)"),
    }
}

// ---- emit ----

fn emit(out: &Path, s: Scale, nodes: usize) {
    assert!(nodes >= 2, "--nodes: at least 2 (node-0 and the others)");
    let file = std::fs::File::create(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let mut w = BufWriter::new(file);
    let mut line = |v: &dyn erased::Json| {
        w.write_all(v.json().as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
    };
    for i in 0..s.namespaces {
        line(&synthetic::namespace(i));
    }
    let mut rng = Rng(42);
    let apps: Vec<usize> = (0..s.pods).map(|_| rng.below(APPS)).collect();
    for k in 0..s.policies {
        line(&synthetic::policy(k, s, &mut rng));
    }
    for (j, app) in apps.into_iter().enumerate() {
        let mut pod = synthetic::pod(j, s, app);
        let spec = pod.spec.as_mut().unwrap();
        let node = if j < s.local { 0 } else { 1 + j % (nodes - 1) };
        spec.node_name = Some(format!("node-{node}"));
        // The API server requires an image; kwok never pulls it.
        spec.containers[0].image = Some("registry.k8s.io/pause:3.10.2".into());
        // Status is kwok's to write (the API server drops it on create anyway).
        pod.status = None;
        line(&pod);
    }
    w.flush().unwrap();
}

/// `serde_json::to_string` behind a trait object, so one closure writes every kind.
mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap()
        }
    }
}

// ---- agents ----

struct Env {
    kubeconfig: String,
    api_netns: String,
    api_pid: u32,
    etcd_pid: u32,
    metrics: String,
    probe: Option<String>,
    probes: usize,
}

/// One agent and the namespace it programs; the agent is killed before its namespace goes
/// (fields drop in order).
struct Node {
    agent: common::Agent,
    veth: String,
    ns: NetNs,
}

impl Node {
    fn start(env: &Env, i: usize, work: &Path) -> Node {
        let ns = NetNs::new(&format!("kr{i}"));
        // The veth is made inside the agent's namespace and its peer sent straight to the API
        // server's: nothing of it ever exists in the host's namespace.
        let veth = format!("kr{i}");
        // A link of an earlier round whose namespace is still being torn down.
        let _ = common::run(
            "ip",
            &["netns", "exec", &env.api_netns, "ip", "link", "del", &veth],
        );
        ns.exec_ok(&[
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            &veth,
            "netns",
            &env.api_netns,
        ]);
        let api = |cmd: &str| {
            common::run_ok("ip", &["netns", "exec", &env.api_netns, "sh", "-c", cmd]);
        };
        api(&format!(
            "ip link set {veth} master br0 && ip link set {veth} up"
        ));
        ns.sh_ok(&format!(
            "ip addr add 10.99.{}.{}/16 dev eth0 && ip link set eth0 up",
            1 + i / 250,
            1 + i % 250
        ));
        let mut cmd = common::agent_in(&ns.name);
        cmd.args(["run", "--datastore", "kubernetes", "--node"])
            .arg(format!("node-{i}"))
            .env("KUBECONFIG", &env.kubeconfig)
            .env("FELIX_IPTABLESBACKEND", "legacy")
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_LOGSEVERITYSCREEN", "info");
        let agent = common::Agent::spawn(cmd, &work.join(format!("agent-{i}.log")));
        Node { agent, veth, ns }
    }

    /// Seconds from the agent's "running" line (after its preflight checks) to its first
    /// full apply, by the log's timestamps; `None` while it has not applied.
    fn first_apply(&mut self) -> Option<f64> {
        let log = self.agent.log();
        let at = line_time(&log, "first full apply done")?;
        let start = line_time(&log, "netpol-agent running").unwrap_or(at);
        Some((at - start).max(0.0))
    }

    /// Bytes the API server's namespace sent down this agent's link.
    fn bytes_in(&self, env: &Env) -> u64 {
        let out = common::run_ok(
            "ip",
            &[
                "netns",
                "exec",
                &env.api_netns,
                "cat",
                &format!("/sys/class/net/{}/statistics/tx_bytes", self.veth),
            ],
        );
        out.trim().parse().unwrap_or(0)
    }
}

/// Everything read at one moment of a round.
struct Snapshot {
    at: Instant,
    api_cpu: f64,
    api_rss_kib: u64,
    etcd_cpu: f64,
    etcd_rss_kib: u64,
    agent_cpu: Vec<f64>,
    agent_rss_kib: Vec<u64>,
    /// Peak RSS (`VmHWM`): the start-up's listing, which the RSS at rest no longer shows.
    agent_peak_kib: Vec<u64>,
    bytes_in: Vec<u64>,
    metrics: BTreeMap<String, f64>,
}

fn snapshot(env: &Env, nodes: &[Node]) -> Snapshot {
    Snapshot {
        at: Instant::now(),
        api_cpu: cpu_seconds(env.api_pid),
        api_rss_kib: status_kib(env.api_pid, "VmRSS:"),
        etcd_cpu: cpu_seconds(env.etcd_pid),
        etcd_rss_kib: status_kib(env.etcd_pid, "VmRSS:"),
        agent_cpu: nodes.iter().map(|n| cpu_seconds(n.agent.pid())).collect(),
        agent_rss_kib: nodes
            .iter()
            .map(|n| status_kib(n.agent.pid(), "VmRSS:"))
            .collect(),
        agent_peak_kib: nodes
            .iter()
            .map(|n| status_kib(n.agent.pid(), "VmHWM:"))
            .collect(),
        bytes_in: nodes.iter().map(|n| n.bytes_in(env)).collect(),
        metrics: api_metrics(env),
    }
}

/// The API server's watch figures, summed over label sets: events sent to watchers by
/// resource (`apiserver_watch_events_total`), their bytes, and the watches open.
fn api_metrics(env: &Env) -> BTreeMap<String, f64> {
    let out = Command::new("sh")
        .args(["-c", &env.metrics])
        .output()
        .expect("--metrics command");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches(['"', '}']).to_string())
                .unwrap_or_default()
        };
        let key = match name {
            "apiserver_watch_events_total" => format!("events {}", label("resource")),
            "apiserver_watch_events_sizes_sum" => format!("event bytes {}", label("resource")),
            "apiserver_longrunning_requests" if label("verb") == "WATCH" => {
                format!("watches {}", label("resource"))
            }
            _ => continue,
        };
        *m.entry(key).or_insert(0.0) += value;
    }
    m
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "-".into();
    }
    format!("median {:.2}, max {:.2}", v[v.len() / 2], v[v.len() - 1])
}

/// The kinds the agent watches, as the API server's metrics name them.
const AGENT_KINDS: [&str; 3] = ["pods", "namespaces", "networkpolicies"];

/// Rates between two snapshots: CPU as % of one core, bytes per agent per second, and the
/// watch events of the agent's kinds: the API server counts one per watcher it sends an
/// event to, so the count divided by the watches open on that kind is what each watcher (an
/// agent, or one of kwok's) received.
fn report_window(what: &str, a: &Snapshot, b: &Snapshot) {
    let secs = (b.at - a.at).as_secs_f64();
    let pct = |x: f64, y: f64| 100.0 * (y - x) / secs;
    let agents: Vec<f64> = a
        .agent_cpu
        .iter()
        .zip(&b.agent_cpu)
        .map(|(x, y)| pct(*x, *y))
        .collect();
    let bytes: Vec<f64> = a
        .bytes_in
        .iter()
        .zip(&b.bytes_in)
        .map(|(x, y)| (y - x) as f64 / secs)
        .collect();
    let mut line = format!(
        "{what} ({secs:.0} s): kube-apiserver {:.2} % of a core, etcd {:.2} %",
        pct(a.api_cpu, b.api_cpu),
        pct(a.etcd_cpu, b.etcd_cpu),
    );
    if !agents.is_empty() {
        line += &format!(
            "; agent-0 {:.2} %, agents mean {:.2} %; bytes to each agent: agent-0 {:.0} B/s, mean {:.0} B/s",
            agents[0],
            mean(&agents),
            bytes[0],
            mean(&bytes),
        );
    }
    println!("{line}");
    let delta = |k: &str| b.metrics.get(k).unwrap_or(&0.0) - a.metrics.get(k).unwrap_or(&0.0);
    let events: Vec<String> = AGENT_KINDS
        .iter()
        .map(|kind| {
            let sent = delta(&format!("events {kind}"));
            let watches = b.metrics.get(&format!("watches {kind}")).unwrap_or(&0.0);
            format!(
                "{kind} {sent:.0} to {watches:.0} watches ({:.1}/s each)",
                sent / watches.max(1.0) / secs
            )
        })
        .collect();
    println!("  watch events sent: {}", events.join(", "));
}

/// The outcomes `--check` counts.
#[derive(Default)]
struct Checks {
    passed: usize,
    failed: usize,
}

impl Checks {
    fn check(&mut self, ok: bool, what: &str) {
        if ok {
            self.passed += 1;
            println!("check ok: {what}");
        } else {
            self.failed += 1;
            println!("check FAILED {what}");
        }
    }

    fn probes(&mut self, r: &enforced::Results, what: &str) {
        self.check(
            !r.add.is_empty()
                && (r.add.len()..=r.add.len() + r.changed_under).contains(&r.delete.len())
                && r.changed_under <= r.add.len()
                && r.timed_out == 0
                && r.failed.is_empty(),
            &format!(
                "every probe {what} enforced ({} added, {} deleted, {} timed out, {} failed; {} whose sets churn changed under it, at most as many as measured)",
                r.add.len(),
                r.delete.len(),
                r.timed_out,
                r.failed.len(),
                r.changed_under
            ),
        );
    }
}

fn round(env: &Env, k: usize, n: usize, rest: Duration, churn: Option<&str>, checks: &mut Checks) {
    // The machine is shared: times depend on what else runs; CPU seconds do not.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    if n == 0 {
        println!("## no agent: the API server's own rest and churn (load average {load})");
    } else {
        println!(
            "## {n} agent(s), node-0 … node-{}, started together (load average {load})",
            n - 1
        );
    }
    let work = TempDir::new("kube-real");
    let before = snapshot(env, &[]);
    let mut nodes: Vec<Node> = (0..n).map(|i| Node::start(env, i, &work.path)).collect();
    let t0 = Instant::now();
    let mut applied: Vec<Option<f64>> = vec![None; n];
    while applied.iter().any(Option::is_none) {
        for (i, node) in nodes.iter_mut().enumerate() {
            if applied[i].is_none() {
                applied[i] = node.first_apply();
                if applied[i].is_none() && !node.agent.running() {
                    panic!("agent {i} exited:\n{}", tail(&node.agent.log()));
                }
            }
        }
        assert!(
            t0.elapsed() < START_LIMIT,
            "agents without a first apply after {START_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    if n > 0 {
        let all_applied = t0.elapsed();
        let started = snapshot(env, &nodes);
        let applied: Vec<f64> = applied.into_iter().map(Option::unwrap).collect();
        println!(
            "first full apply (from the agent's \"running\" log line): agent-0 {:.2} s; all {n}: {}; the last {:.1} s after the first start",
            applied[0],
            stats(applied.clone()),
            all_applied.as_secs_f64(),
        );
        // The agent logs each kind it falls back to paginated lists for (a server that
        // refuses or ignores streaming lists); silence is streaming lists.
        let fallbacks = nodes[0]
            .agent
            .log()
            .matches("using paginated lists")
            .count();
        println!(
            "agent-0's lists: {}",
            if fallbacks == 0 {
                "streaming (WatchList)".to_string()
            } else {
                format!("paginated ({fallbacks} kinds fell back)")
            }
        );
        let startup_bytes: Vec<f64> = started.bytes_in.iter().map(|b| *b as f64).collect();
        println!(
            "start-up: kube-apiserver {:.2} CPU s, etcd {:.2} CPU s; bytes to each agent: agent-0 {:.2} MiB, mean {:.2} MiB",
            started.api_cpu - before.api_cpu,
            started.etcd_cpu - before.etcd_cpu,
            startup_bytes[0] / (1 << 20) as f64,
            mean(&startup_bytes) / (1 << 20) as f64,
        );
        std::thread::sleep(SETTLE);
    }
    let settled = snapshot(env, &nodes);
    let rss: Vec<f64> = settled.agent_rss_kib.iter().map(|k| mib(*k)).collect();
    let mut line = format!(
        "RSS: kube-apiserver {:.0} MiB (before the agents {:.0} MiB), etcd {:.0} MiB",
        mib(settled.api_rss_kib),
        mib(before.api_rss_kib),
        mib(settled.etcd_rss_kib),
    );
    if n > 0 {
        let peak: Vec<f64> = settled.agent_peak_kib.iter().map(|k| mib(*k)).collect();
        line += &format!(
            "; agent-0 {:.1} MiB (peak {:.1}), agents {} MiB (all {n}: {:.0} MiB), peaks {} MiB",
            rss[0],
            peak[0],
            stats(rss.clone()),
            rss.iter().sum::<f64>(),
            stats(peak.clone()),
        );
    }
    println!("{line}");
    std::thread::sleep(rest);
    let rested = snapshot(env, &nodes);
    report_window("at rest", &settled, &rested);
    // Probes of agent-0 (the rounds' agents are numbered from 0 and each round has its own
    // pod names and addresses).
    let mut prober = match (&env.probe, nodes.first()) {
        (Some(cmd), Some(node)) => Some(enforced::Prober::new(
            &node.ns.name,
            cmd,
            k as u32 * 100_000,
        )),
        _ => None,
    };
    if let Some(p) = prober.as_mut() {
        let mut at_rest = enforced::Results::default();
        let mut started = 0;
        p.run(&mut at_rest, Duration::from_millis(250), || {
            started += 1;
            started <= env.probes
        });
        println!("{}", at_rest.report("at rest"));
        checks.probes(&at_rest, "at rest");
    }
    if let Some(cmd) = churn {
        let before_churn = snapshot(env, &nodes);
        let mut child = Command::new("sh")
            .args(["-c", cmd])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("--churn command");
        let mut under_churn = enforced::Results::default();
        if let Some(p) = prober.as_mut() {
            p.run(&mut under_churn, Duration::from_secs(1), || {
                matches!(child.try_wait(), Ok(None))
            });
        }
        let out = child.wait_with_output().expect("--churn command");
        // Agents still applying the last changes count in the window.
        std::thread::sleep(Duration::from_secs(3));
        let churned = snapshot(env, &nodes);
        println!(
            "  {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        report_window("under churn", &before_churn, &churned);
        checks.check(
            out.status.success(),
            &format!("the churn's writes ({})", out.status),
        );
        if prober.is_some() {
            println!("{}", under_churn.report("under churn"));
            checks.probes(&under_churn, "under churn");
        }
    }
    drop(prober);
    for (i, node) in nodes.iter_mut().enumerate() {
        let running = node.agent.running();
        if !running {
            println!(
                "agent {i} exited during the round:\n{}",
                tail(&node.agent.log())
            );
        }
        checks.check(
            running,
            &format!("agent {i} of {n} applied and ran to the round's end"),
        );
    }
    drop(nodes);
    println!();
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
