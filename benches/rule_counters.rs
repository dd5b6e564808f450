//! Rule-counter read cost: what one read of the kernel's rule counters costs the agent at 110
//! and 1500 local pods (synthetic cluster of 10k pods, 1k policies, 300 namespaces, as the
//! other benchmarks), on the legacy and nft backends, against the baseline of spawning
//! `iptables-save -c -t filter` for the same table. Prints figures, asserts nothing about time.
//!
//! `cargo bench --bench rule_counters` must run as root. Per scale the graph is built and
//! flushed, the counter plan is built (timed, median of 5), and the complete IPv4 state is
//! loaded (`ipset restore`, `iptables-<backend>-restore`) into a fresh network namespace
//! (`npa-test-<pid>-*`, deleted on exit and on panic). Then, from a thread inside it:
//! - ours: `NPA_READS` (default 20) reads with `host::rule_counters::read_chains` of the plan's
//!   chains (what the agent's reader does), each rule looked up in the plan; wall time and the
//!   thread's CPU time (user + system, `getrusage(RUSAGE_THREAD)`: the kernel's copy of the
//!   table is system time); and the same for a read of the whole table
//!   (`rule_counters::read`), for comparison;
//! - baseline: 5 runs of `iptables-<backend>-save -c -t filter` spawned from the same thread;
//!   wall time and the children's CPU time (`RUSAGE_CHILDREN`).
//!
//! Per row: table rules and bytes handed over, counted rules, ms per read (wall / CPU), the
//! baseline's, the ratio, and the share of one core a read every 10, 30 and 60 s costs (per
//! family; an IPv6 table of a dual-stack node costs about as much again).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{in_netns, NetNs};
use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::host::rule_counters::{self, Family, Xtables};
use netpol_agent::model::IpFamily;
use netpol_agent::rules::{RuleConfig, RULE_HASH_PREFIX};
use netpol_agent::traffic::counters::CounterPlan;
use nix::libc;
use synthetic::{Rng, Scale};

fn cpu(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes one struct rusage into the zeroed value on the stack.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    local: usize,
    backend: &'static str,
    chains: usize,
    whole_wall: Duration,
    whole_cpu: Duration,
    rules: usize,
    bytes: usize,
    counted: usize,
    ours_wall: Duration,
    ours_cpu: Duration,
    save_wall: Duration,
    save_cpu: Duration,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let reads = env_usize("NPA_READS", 20);
    let mut rows = Vec::new();
    let mut plan_times = Vec::new();
    for local in [110, 1500] {
        let scale = Scale {
            pods: 10_000,
            policies: 1_000,
            namespaces: 300,
            local,
            dual: false,
            cluster_policies: 0,
        };
        let (mut g, _) = synthetic::build(scale, &mut Rng(42));
        g.flush();
        let build = median(
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let p = CounterPlan::build(&g, true, true);
                    let e = t.elapsed();
                    std::hint::black_box(p);
                    e
                })
                .collect(),
        );
        let plan = CounterPlan::build(&g, true, true);
        plan_times.push((local, build, plan.len()));
        let state = g.snapshot();
        let fam = &state.families[&IpFamily::V4];
        let cfg = RuleConfig::default();
        let RestoreScripts {
            ipsets: sets,
            iptables: rules,
        } = fam.restore_scripts(&cfg, IpFamily::V4, 1_048_576);
        for (backend, xt) in [("legacy", Xtables::Legacy), ("nft", Xtables::Nft)] {
            let ns = NetNs::new(&format!("bench-counters-{local}-{backend}"));
            let dir = common::TempDir::new("bench-counters");
            std::fs::write(dir.path.join("sets"), &sets).unwrap();
            std::fs::write(dir.path.join("rules"), &rules).unwrap();
            ns.sh_ok(&format!(
                "ipset restore < '{}'",
                dir.path.join("sets").display()
            ));
            ns.sh_ok(&format!(
                "iptables-{backend}-restore -w < '{}'",
                dir.path.join("rules").display()
            ));
            let row = in_netns(&ns.name, || {
                let chains = plan.chains(IpFamily::V4);
                let read = |whole: bool| {
                    let mut counted = 0usize;
                    let mut each = |c: rule_counters::Counted<'_>| {
                        if let Some(hash) = c.comment.strip_prefix(RULE_HASH_PREFIX) {
                            if plan.lookup(IpFamily::V4, c.chain, hash).is_some() {
                                counted += 1;
                            }
                        }
                    };
                    let stats = if whole {
                        rule_counters::read(xt, Family::V4, "filter", "cali-", &mut each)
                    } else {
                        rule_counters::read_chains(xt, Family::V4, "filter", &chains, &mut each)
                    }
                    .expect("reading the counters");
                    (stats, counted)
                };
                let (stats, counted) = read(true);
                assert_eq!(read(false).1, counted, "both reads find every counted rule");
                let timed = |whole: bool| {
                    let (c0, t0) = (cpu(libc::RUSAGE_THREAD), Instant::now());
                    for _ in 0..reads {
                        std::hint::black_box(read(whole));
                    }
                    (
                        t0.elapsed() / reads as u32,
                        (cpu(libc::RUSAGE_THREAD) - c0) / reads as u32,
                    )
                };
                let (whole_wall, whole_cpu) = timed(true);
                let (ours_wall, ours_cpu) = timed(false);
                let runs = 5;
                let (c0, t0) = (cpu(libc::RUSAGE_CHILDREN), Instant::now());
                for _ in 0..runs {
                    let out = Command::new(format!("iptables-{backend}-save"))
                        .args(["-c", "-t", "filter"])
                        .stdin(Stdio::null())
                        .output()
                        .expect("iptables-save");
                    assert!(out.status.success());
                    std::hint::black_box(out.stdout.len());
                }
                let save_wall = t0.elapsed() / runs;
                let save_cpu = (cpu(libc::RUSAGE_CHILDREN) - c0) / runs;
                Row {
                    local,
                    backend,
                    chains: chains.len(),
                    whole_wall,
                    whole_cpu,
                    rules: stats.rules,
                    bytes: stats.bytes,
                    counted,
                    ours_wall,
                    ours_cpu,
                    save_wall,
                    save_cpu,
                }
            });
            rows.push(row);
        }
    }
    println!("rule counters: {reads} reads per row (IPv4 filter table), synthetic cluster 10k pods / 1k policies");
    for (local, build, len) in &plan_times {
        println!(
            "counter plan at {local} local pods: {len} counted rules, built in {:.2} ms (median of 5)",
            build.as_secs_f64() * 1e3
        );
    }
    println!(
        "{:>6} {:>7} {:>7} {:>9} {:>8} {:>7} {:>20} {:>11} {:>10} {:>11} {:>10} {:>7} {:>8} {:>8} {:>8}",
        "local",
        "backend",
        "rules",
        "bytes",
        "counted",
        "chains",
        "whole table wall/cpu",
        "ours wall",
        "ours cpu",
        "save wall",
        "save cpu",
        "cpu x",
        "@10s",
        "@30s",
        "@60s"
    );
    for r in &rows {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let share = |every: f64| 100.0 * r.ours_cpu.as_secs_f64() / every;
        println!(
            "{:>6} {:>7} {:>7} {:>9} {:>8} {:>7} {:>7.2}/{:>6.2} ms {:>8.2} ms {:>7.2} ms {:>8.2} ms {:>7.2} ms {:>6.1}x {:>7.3}% {:>7.3}% {:>7.3}%",
            r.local,
            r.backend,
            r.rules,
            r.bytes,
            r.counted,
            r.chains,
            ms(r.whole_wall),
            ms(r.whole_cpu),
            ms(r.ours_wall),
            ms(r.ours_cpu),
            ms(r.save_wall),
            ms(r.save_cpu),
            r.save_cpu.as_secs_f64() / r.ours_cpu.as_secs_f64().max(1e-9),
            share(10.0),
            share(30.0),
            share(60.0)
        );
    }
}
