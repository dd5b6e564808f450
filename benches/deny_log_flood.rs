//! Deny logging under a flood, end to end: the real agent with deny logging on (the default
//! rate, 10/s with a burst of 20, unless `NPA_FLOOD_RATE`/`NPA_FLOOD_BURST` say otherwise)
//! in a node namespace with pods (`tests/pod_node`), one pod flooding another, which policy
//! isolates, with denied TCP SYNs. Prints figures, asserts nothing about time.
//!
//! `cargo bench --bench deny_log_flood` must run as root. Pods: `x/server` (ingress allowed
//! only from `role=client`), `x/web` (no policy; a TCP echo server), `y/client` and
//! `y/attacker`. Two phases of `NPA_FLOOD_SECS` (default 10) seconds each, in one run:
//! - idle (the baseline): no flood;
//! - flood: `y/attacker` sends `NPA_FLOOD_PPS` (default 20000) SYNs per second to
//!   `x/server:80` from a raw socket, each from a new source port (every SYN a new flow: the
//!   worst case for deduplication);
//! - the same flood against the agent restarted with deny logging off: what the flood costs
//!   the node whatever the agent does (the kernel's forwarding and dropping, the sender).
//!
//! In both phases `y/client` runs TCP transactions against `x/web` (connect, one byte each
//! way, close) back to back, so other pods' traffic is measured under the same load: their
//! rate and p50/p99 latency, flood against idle and against the flood without deny logging.
//! Per phase: the agent's CPU time (all its threads, from each thread's `schedstat`) and its
//! deny-log thread's (`nflog-<group>`), as a share of one core; deny lines written (from the agent's log) and their rate; and from `/metrics` the NFLOG
//! messages read and lost and the packets the kernel counted as denied for `x/server`.
//! The machine's cores are shared by the flood's sender, the bystanders and the agent, so the
//! bystanders' figures include the sender's own CPU use.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/pod_node/mod.rs"]
mod pod_node;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pod_node::{deny_lines, syn_flood, PodNode, PodSpec};

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: TCP, port: 80}]
"#;

const GROUP: &str = "40";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds of the process's threads (all, and those named `thread`), from each thread's
/// `schedstat` (nanoseconds on the CPU; the tick-based `stat` fields are too coarse here).
fn agent_cpu(pid: u32, thread: &str) -> (f64, f64) {
    let (mut all, mut named) = (0.0, 0.0);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let ns: f64 = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0.0);
            all += ns / 1e9;
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == thread {
                named += ns / 1e9;
            }
        }
    }
    (all, named)
}

/// Echoes one byte per connection, forever (the thread ends with the process).
fn echo_server(node: &PodNode, pod: &str, port: u16) {
    let ip = node.pod(pod).v4;
    let listener = common::in_netns(&node.pod(pod).ns.name, || {
        TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port)).unwrap()
    });
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut b = [0u8; 1];
            if c.read_exact(&mut b).is_ok() {
                let _ = c.write_all(&b);
            }
        }
    });
}

/// Back-to-back transactions from `from` to `to:port` until `stop`: their latencies.
fn bystander(
    netns: String,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<Duration>, u64)> {
    std::thread::spawn(move || {
        let file = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut lat = Vec::new();
        let mut failed = 0;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let ok = (|| -> std::io::Result<()> {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(1))?;
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                s.write_all(b"x")?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b)
            })();
            match ok {
                Ok(()) => lat.push(t.elapsed()),
                Err(_) => failed += 1,
            }
        }
        (lat, failed)
    })
}

struct Phase {
    name: &'static str,
    wall: f64,
    sent: u64,
    agent_cpu: f64,
    thread_cpu: f64,
    lines: usize,
    bystander: usize,
    bystander_failed: u64,
    p50: Duration,
    p99: Duration,
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pps = env_u64("NPA_FLOOD_PPS", 20_000);
    let secs = env_u64("NPA_FLOOD_SECS", 10);
    let rate = std::env::var("NPA_FLOOD_RATE").unwrap_or_else(|_| "10".into());
    let burst = std::env::var("NPA_FLOOD_BURST").unwrap_or_else(|_| "20".into());
    let duration = Duration::from_secs(secs);
    let mut node = PodNode::new(
        "bench-denyflood",
        "nft",
        vec![
            PodSpec {
                namespace: "x",
                name: "server",
                labels: &[("app", "server")],
                n: 30,
                iface: Some("calisrv"),
            },
            PodSpec {
                namespace: "x",
                name: "web",
                labels: &[("app", "web")],
                n: 31,
                iface: Some("caliweb"),
            },
            PodSpec {
                namespace: "y",
                name: "client",
                labels: &[("role", "client")],
                n: 32,
                iface: Some("calicli"),
            },
            PodSpec {
                namespace: "y",
                name: "attacker",
                labels: &[("role", "attacker")],
                n: 33,
                iface: Some("caliatk"),
            },
        ],
    );
    node.write_policies(POLICIES);
    node.start_agent(&[
        ("FELIX_DENYLOGENABLED", "true"),
        ("FELIX_DENYLOGNFLOGGROUP", GROUP),
        ("FELIX_DENYLOGRATE", &rate),
        ("FELIX_DENYLOGBURST", &burst),
        ("FELIX_LOGFORMAT", "json"),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
        ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
        ("FELIX_POLICYCOUNTERSINTERVAL", "1"),
    ]);
    node.wait_converged(Duration::from_secs(30));
    echo_server(&node, "x/web", 8080);
    let web = SocketAddr::new(node.pod("x/web").v4.into(), 8080);
    let thread = format!("nflog-{GROUP}");
    let server = node.pod("x/server").v4;
    std::thread::sleep(Duration::from_secs(1));

    let mut phases = Vec::new();
    let mut metrics = String::new();
    for (name, flood, logging) in [
        ("idle", false, true),
        ("flood", true, true),
        ("flood, deny logging off", true, false),
    ] {
        if !logging {
            // The same agent without deny logging: what the flood costs the node anyway.
            if let Some(mut agent) = node.agent.take() {
                let _ = agent.kill();
                let _ = agent.wait();
            }
            node.start_agent(&[
                ("FELIX_LOGFORMAT", "json"),
                ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
                ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
                ("FELIX_PROMETHEUSMETRICSPORT", "9092"),
            ]);
            node.wait_converged(Duration::from_secs(30));
            std::thread::sleep(Duration::from_secs(1));
        }
        let pid = node.agent_pid();
        let lines_before = deny_lines(&node.log()).len();
        let stop = Arc::new(AtomicBool::new(false));
        let by = bystander(node.pod("y/client").ns.name.clone(), web, stop.clone());
        let (cpu0, thread0) = agent_cpu(pid, &thread);
        let t0 = Instant::now();
        let sent = if flood {
            syn_flood(&node, "y/attacker", server, 80, pps, duration)
        } else {
            std::thread::sleep(duration);
            0
        };
        let wall = t0.elapsed().as_secs_f64();
        let (cpu1, thread1) = agent_cpu(pid, &thread);
        stop.store(true, Ordering::Relaxed);
        let (mut lat, failed) = by.join().unwrap();
        lat.sort();
        // Lines of packets the kernel logged near the end reach the log within a moment.
        std::thread::sleep(Duration::from_millis(500));
        let lines = deny_lines(&node.log()).len() - lines_before;
        if flood && logging {
            std::thread::sleep(Duration::from_millis(1500));
            metrics = common::http_get(&node.node.name, 9091, "/metrics")
                .unwrap()
                .1;
        }
        phases.push(Phase {
            name,
            wall,
            sent,
            agent_cpu: cpu1 - cpu0,
            thread_cpu: thread1 - thread0,
            lines,
            bystander: lat.len(),
            bystander_failed: failed,
            p50: lat.get(lat.len() / 2).copied().unwrap_or_default(),
            p99: lat.get(lat.len() * 99 / 100).copied().unwrap_or_default(),
        });
    }

    println!(
        "deny-log flood: {pps} denied SYNs/s for {secs} s from y/attacker to x/server:80 (new source port each), deny-log rate {rate}/s burst {burst}, nft backend"
    );
    println!(
        "{:<24} {:>8} {:>7} {:>9} {:>11} {:>11} {:>12} {:>10} {:>10} {:>8}",
        "phase",
        "sent",
        "lines",
        "lines/s",
        "agent cpu",
        "nflog thr",
        "bystander/s",
        "p50 ms",
        "p99 ms",
        "failed"
    );
    for p in &phases {
        println!(
            "{:<24} {:>8} {:>7} {:>9.1} {:>10.3}% {:>10.3}% {:>12.0} {:>10.3} {:>10.3} {:>8}",
            p.name,
            p.sent,
            p.lines,
            p.lines as f64 / p.wall,
            100.0 * p.agent_cpu / p.wall,
            100.0 * p.thread_cpu / p.wall,
            p.bystander as f64 / p.wall,
            p.p50.as_secs_f64() * 1e3,
            p.p99.as_secs_f64() * 1e3,
            p.bystander_failed
        );
    }
    let (idle, flood, off) = (&phases[0], &phases[1], &phases[2]);
    let rate = |p: &Phase| p.bystander as f64 / p.wall;
    let cpu = |p: &Phase| p.agent_cpu / p.wall;
    println!(
        "flood vs idle: agent cpu {:.2}x, bystander rate {:.2}x, bystander p99 {:.2}x",
        cpu(flood) / cpu(idle).max(1e-9),
        rate(flood) / rate(idle).max(1e-9),
        flood.p99.as_secs_f64() / idle.p99.as_secs_f64().max(1e-9)
    );
    println!(
        "flood with deny logging vs without: agent cpu {:.2}x, bystander rate {:.2}x, bystander p99 {:.2}x",
        cpu(flood) / cpu(off).max(1e-9),
        rate(flood) / rate(off).max(1e-9),
        flood.p99.as_secs_f64() / off.p99.as_secs_f64().max(1e-9)
    );
    println!(
        "metrics: nflog messages {}, lost {}, overruns {}, lines {}, suppressed {}, denied packets counted by the kernel for x/server {}",
        metric(&metrics, "netpol_deny_log_messages_total"),
        metric(&metrics, "netpol_deny_log_lost_total"),
        metric(&metrics, "netpol_deny_log_overruns_total"),
        metric(&metrics, "netpol_deny_log_lines_total"),
        metric(&metrics, "netpol_deny_log_suppressed_total"),
        metric(&metrics, "netpol_denied_packets_total{direction=\"ingress\",namespace=\"x\",pod=\"server\"}")
    );
}
