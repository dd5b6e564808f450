//! Calc graph benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench --bench calc_graph` runs every scenario in its own child process (so each
//! peak RSS is its own) and prints:
//! - full compile (validation + calc graph + rendering of both scripts) of synthetic clusters:
//!   10k pods / 1k policies and 150k pods / 10k policies / 5k namespaces, with wall time and
//!   peak RSS above the process's baseline;
//! - one pod label change at 1k, 10k and 100k pods: median and p99 time from the event to the
//!   flushed update, and the update's size, plus the ratio to the 1k figure (noisy machines:
//!   compare ratios measured in the same run);
//! - the ClusterNetworkPolicy variant: the 10k cluster with 50 Admin and 50 Baseline
//!   ClusterNetworkPolicies beside its 1k NetworkPolicies, compiled, and one label change in
//!   it (local pods' changes re-evaluate the subjects too), each as a ratio to the same
//!   cluster without them measured in the same run.
//!
//! The synthetic cluster comes from `support/synthetic.rs` (shared with the dataplane
//! benchmark), with 110 pods on the benchmarked node.

#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::time::{Duration, Instant};

use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::sets;
use netpol_agent::rules::RuleConfig;

use synthetic::{build, pod, Rng, Scale, APPS};

/// Pods on the benchmarked node in every scenario.
const LOCAL_PODS: usize = 110;
/// ClusterNetworkPolicies per tier in the `-cnp` scenarios.
const CLUSTER_POLICIES: usize = 50;

fn scale_10k(cluster_policies: usize) -> Scale {
    Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local: LOCAL_PODS,
        dual: false,
        cluster_policies,
    }
}

fn rss_kib(field: &str) -> u64 {
    procfs::status_kib(std::process::id(), field)
}

fn full_compile(scale: Scale) -> Duration {
    let baseline = rss_kib("VmRSS:");
    let mut rng = Rng(42);
    let start = Instant::now();
    let (mut g, _) = build(scale, &mut rng);
    g.flush();
    let state = g.snapshot();
    let fam = &state.families[&IpFamily::V4];
    let cfg = RuleConfig::default();
    let RestoreScripts {
        ipsets: ipset_script,
        iptables: iptables_script,
    } = fam.restore_scripts(&cfg, IpFamily::V4, sets::DEFAULT_MAX_SET_SIZE);
    let elapsed = start.elapsed();
    let peak = rss_kib("VmHWM:");
    let members: usize = fam.sets.values().map(|s| s.members.len()).sum();
    println!(
        "full compile  pods={:>6} policies={:>5} cluster policies={:>3} namespaces={:>4} local={}: {:>8.1} ms, peak RSS {:>6.1} MiB (+{:.1} MiB over baseline) | active policies {} (cluster {}), sets {}, members {}, chains {}, ipset lines {}, iptables lines {}",
        scale.pods,
        scale.policies,
        2 * scale.cluster_policies,
        scale.namespaces,
        g.local_endpoint_count(),
        elapsed.as_secs_f64() * 1e3,
        peak as f64 / 1024.0,
        (peak.saturating_sub(baseline)) as f64 / 1024.0,
        g.active_policy_count(),
        g.active_cluster_policy_count(),
        fam.sets.len(),
        members,
        fam.chains.len(),
        ipset_script.lines().count(),
        iptables_script.lines().count(),
    );
    elapsed
}

struct LabelChange {
    median: Duration,
    p99: Duration,
    mean_update: f64,
    mean_evaluations: f64,
    active_sets: usize,
}

fn label_change(pods: usize, cluster_policies: usize) -> LabelChange {
    let scale = Scale {
        pods,
        policies: (pods / 10).max(100),
        namespaces: (pods / 30).max(10),
        local: LOCAL_PODS,
        dual: false,
        cluster_policies,
    };
    let mut rng = Rng(7);
    let (mut g, mut apps) = build(scale, &mut rng);
    g.flush();
    let rounds = 400;
    let mut times = Vec::with_capacity(rounds);
    let mut sizes = 0usize;
    let evaluations_before = g.set_evaluations();
    for r in 0..rounds {
        // Alternate remote and local pods; each change moves the pod to another app.
        let j = if r % 4 == 0 {
            rng.below(scale.local)
        } else {
            scale.local + rng.below(pods - scale.local)
        };
        apps[j] = (apps[j] + 1 + rng.below(APPS - 1)) % APPS;
        let p = pod(j, scale, apps[j]);
        let start = Instant::now();
        g.upsert_pod(&p);
        let update = g.flush();
        times.push(start.elapsed());
        sizes += update.len();
    }
    times.sort();
    LabelChange {
        median: times[rounds / 2],
        p99: times[rounds * 99 / 100],
        mean_update: sizes as f64 / rounds as f64,
        mean_evaluations: (g.set_evaluations() - evaluations_before) as f64 / rounds as f64,
        active_sets: g.snapshot().families[&IpFamily::V4].sets.len(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--scenario") {
        match args.get(pos + 1).map(String::as_str) {
            Some("compile-10k") => {
                full_compile(scale_10k(0));
            }
            Some("compile-150k") => {
                full_compile(Scale {
                    pods: 150_000,
                    policies: 10_000,
                    namespaces: 5_000,
                    local: LOCAL_PODS,
                    dual: false,
                    cluster_policies: 0,
                });
            }
            Some("compile-10k-cnp") => {
                // Twice each, alternating, the second round counted: the first warms up.
                let mut figures = (Duration::ZERO, Duration::ZERO);
                for _ in 0..2 {
                    figures = (
                        full_compile(scale_10k(0)),
                        full_compile(scale_10k(CLUSTER_POLICIES)),
                    );
                }
                println!(
                    "full compile with {} ClusterNetworkPolicies: {:.2} x the time without (same run)",
                    2 * CLUSTER_POLICIES,
                    figures.1.as_secs_f64() / figures.0.as_secs_f64()
                );
            }
            Some("label-change-cnp") => {
                let base = label_change(10_000, 0);
                let with = label_change(10_000, CLUSTER_POLICIES);
                for (what, r) in [("without", &base), ("with", &with)] {
                    println!(
                        "label change  pods= 10000 {what:>7} {} ClusterNetworkPolicies: median {:>7.1} µs, p99 {:>7.1} µs, mean update size {:.2} items, {:.1} set evaluations per change ({} active sets) | median ratio to without: {:.2}",
                        2 * CLUSTER_POLICIES,
                        r.median.as_secs_f64() * 1e6,
                        r.p99.as_secs_f64() * 1e6,
                        r.mean_update,
                        r.mean_evaluations,
                        r.active_sets,
                        r.median.as_secs_f64() / base.median.as_secs_f64(),
                    );
                }
            }
            Some("label-change") => {
                let base = label_change(1_000, 0);
                let base_median = base.median;
                for (pods, r) in [
                    (1_000, base),
                    (10_000, label_change(10_000, 0)),
                    (100_000, label_change(100_000, 0)),
                ] {
                    println!(
                        "label change  pods={pods:>6}: median {:>7.1} µs, p99 {:>7.1} µs, mean update size {:.2} items, {:.1} set evaluations per change ({} active sets) | median ratio to 1k: {:.2}",
                        r.median.as_secs_f64() * 1e6,
                        r.p99.as_secs_f64() * 1e6,
                        r.mean_update,
                        r.mean_evaluations,
                        r.active_sets,
                        r.median.as_secs_f64() / base_median.as_secs_f64(),
                    );
                }
            }
            other => panic!("unknown scenario {other:?}"),
        }
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    for scenario in [
        "compile-10k",
        "compile-150k",
        "label-change",
        "compile-10k-cnp",
        "label-change-cnp",
    ] {
        let status = std::process::Command::new(&exe)
            .args(["--scenario", scenario])
            .status()
            .expect("run scenario");
        assert!(status.success(), "scenario {scenario} failed");
    }
    println!("targets: 150k pods / 10k policies under 2 s and 500 MB RSS; one label change under 1 ms, update size flat with cluster size");
}
