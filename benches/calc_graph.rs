//! Calc graph benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench --bench calc_graph` runs every scenario in its own child process (so each
//! peak RSS is its own) and prints:
//! - full compile (validation + calc graph + rendering of both scripts) of synthetic clusters:
//!   10k pods / 1k policies and 150k pods / 10k policies / 5k namespaces, with wall time and
//!   peak RSS above the process's baseline;
//! - one pod label change at 1k, 10k and 100k pods: median and p99 time from the event to the
//!   flushed update, and the update's size, plus the ratio to the 1k figure (noisy machines:
//!   compare ratios measured in the same run).
//!
//! The synthetic cluster is generated with a small fixed-seed PRNG (no dependency needed for
//! benchmark data): namespaces with team/env labels; pods with app/tier/version labels and
//! named ports, 110 of them on the benchmarked node; policies of five shapes (pod selector
//! peers, namespace+pod selector peers with named ports, ipBlock with except and port ranges,
//! default deny, namespace-selector peers).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use netpol_agent::calc_graph::model::IpFamily;
use netpol_agent::calc_graph::{CalcGraph, GraphConfig};
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::ipsets;
use netpol_agent::rules::{chains::kernel_chain_rules, render, RuleConfig};

const NODE: &str = "node-0";
const LOCAL_PODS: usize = 110;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy)]
struct Scale {
    pods: usize,
    policies: usize,
    namespaces: usize,
}

fn labels(pairs: &[(&str, String)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

fn sel(pairs: &[(&str, String)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(pairs),
        match_expressions: None,
    }
}

fn namespace(i: usize) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(format!("ns-{i}")),
            labels: labels(&[
                ("team", format!("team-{}", i % 20)),
                ("env", ["prod", "dev", "staging"][i % 3].to_string()),
            ]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn pod_ip(j: usize) -> String {
    format!("10.{}.{}.{}", (j >> 16) & 0xff, (j >> 8) & 0xff, j & 0xff)
}

fn pod(j: usize, scale: Scale, app: usize) -> Pod {
    let nodes = (scale.pods / LOCAL_PODS).max(2);
    let node = if j < LOCAL_PODS {
        0
    } else {
        1 + j % (nodes - 1)
    };
    let port = |name: &str, p: i32| ContainerPort {
        name: Some(name.into()),
        container_port: p,
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{j}")),
            namespace: Some(format!("ns-{}", j % scale.namespaces)),
            labels: labels(&[
                ("app", format!("app-{app}")),
                ("tier", ["web", "api", "db"][j % 3].to_string()),
                ("version", format!("v{}", j % 5)),
            ]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(format!("node-{node}")),
            containers: vec![Container {
                name: "main".into(),
                ports: Some(vec![port("http", 8080), port("metrics", 9090)]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(vec![PodIP { ip: pod_ip(j) }]),
            ..Default::default()
        }),
    }
}

fn tcp(port: IntOrString, end: Option<i32>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(port),
        end_port: end,
        protocol: Some("TCP".into()),
    }
}

fn policy(k: usize, scale: Scale, rng: &mut Rng) -> NetworkPolicy {
    let app = |rng: &mut Rng| format!("app-{}", rng.below(50));
    let pods_peer = |s: LabelSelector| NetworkPolicyPeer {
        pod_selector: Some(s),
        ..Default::default()
    };
    let mut spec = NetworkPolicySpec {
        pod_selector: Some(sel(&[("app", app(rng))])),
        ..Default::default()
    };
    match k % 5 {
        0 => {
            // "from app X in any namespace": a cluster-wide set that label changes move pods
            // in and out of.
            spec.ingress = Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![
                    NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector::default()),
                        pod_selector: Some(sel(&[("app", app(rng))])),
                        ip_block: None,
                    },
                    pods_peer(sel(&[("tier", "web".into())])),
                ]),
                ports: Some(vec![tcp(IntOrString::Int(8080), None)]),
            }])
        }
        1 => {
            spec.pod_selector = Some(sel(&[("tier", "db".into())]));
            spec.ingress = Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(sel(&[("team", format!("team-{}", rng.below(20)))])),
                    pod_selector: Some(sel(&[("app", app(rng))])),
                    ip_block: None,
                }]),
                ports: Some(vec![tcp(IntOrString::String("http".into()), None)]),
            }])
        }
        2 => {
            spec.policy_types = Some(vec!["Egress".into()]);
            spec.egress = Some(vec![NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: "10.0.0.0/8".into(),
                        except: Some(vec![format!("10.{}.0.0/16", rng.below(200))]),
                    }),
                    ..Default::default()
                }]),
                ports: Some(vec![
                    tcp(IntOrString::Int(443), None),
                    tcp(IntOrString::Int(8000), Some(8100)),
                ]),
            }])
        }
        3 => {
            spec.pod_selector = Some(LabelSelector::default());
            spec.ingress = Some(vec![]);
        }
        _ => {
            spec.pod_selector = Some(sel(&[("version", format!("v{}", rng.below(5)))]));
            spec.ingress = Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(sel(&[("env", "prod".into())])),
                    ..Default::default()
                }]),
                ports: None,
            }])
        }
    }
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("pol-{k}")),
            namespace: Some(format!("ns-{}", k % scale.namespaces)),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

fn new_graph() -> CalcGraph {
    CalcGraph::new(GraphConfig {
        node_name: NODE.into(),
        families: vec![IpFamily::V4],
        rules: RuleConfig::default(),
        resolver: Box::new(CalicoResolver::default()),
    })
}

/// Feeds a whole synthetic cluster; objects are built and dropped one at a time, as a watch
/// would deliver them.
fn build(scale: Scale, rng: &mut Rng) -> (CalcGraph, Vec<usize>) {
    let mut g = new_graph();
    for i in 0..scale.namespaces {
        g.upsert_namespace(&namespace(i));
    }
    let mut apps = Vec::with_capacity(scale.pods);
    for j in 0..scale.pods {
        let app = rng.below(50);
        apps.push(app);
        g.upsert_pod(&pod(j, scale, app));
    }
    for k in 0..scale.policies {
        g.upsert_policy(&policy(k, scale, rng));
    }
    (g, apps)
}

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn full_compile(scale: Scale) {
    let baseline = rss_kib("VmRSS:");
    let mut rng = Rng(42);
    let start = Instant::now();
    let (mut g, _) = build(scale, &mut rng);
    g.flush();
    let state = g.snapshot();
    let fam = &state.families[&IpFamily::V4];
    let cfg = RuleConfig::default();
    let ipset_script = ipsets::restore_script(&fam.sets, ipsets::DEFAULT_MAX_SET_SIZE);
    let iptables_script = render::restore_script(
        &fam.chains,
        &kernel_chain_rules(&cfg, IpFamily::V4),
        cfg.insert_mode,
    );
    let elapsed = start.elapsed();
    let peak = rss_kib("VmHWM:");
    let members: usize = fam.sets.values().map(|s| s.members.len()).sum();
    println!(
        "full compile  pods={:>6} policies={:>5} namespaces={:>4} local={}: {:>8.1} ms, peak RSS {:>6.1} MiB (+{:.1} MiB over baseline) | active policies {}, sets {}, members {}, chains {}, ipset lines {}, iptables lines {}",
        scale.pods,
        scale.policies,
        scale.namespaces,
        g.local_endpoint_count(),
        elapsed.as_secs_f64() * 1e3,
        peak as f64 / 1024.0,
        (peak.saturating_sub(baseline)) as f64 / 1024.0,
        g.active_policy_count(),
        fam.sets.len(),
        members,
        fam.chains.len(),
        ipset_script.lines().count(),
        iptables_script.lines().count(),
    );
}

struct LabelChange {
    median: Duration,
    p99: Duration,
    mean_update: f64,
    mean_evaluations: f64,
    active_sets: usize,
}

fn label_change(pods: usize) -> LabelChange {
    let scale = Scale {
        pods,
        policies: (pods / 10).max(100),
        namespaces: (pods / 30).max(10),
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
            rng.below(LOCAL_PODS)
        } else {
            LOCAL_PODS + rng.below(pods - LOCAL_PODS)
        };
        apps[j] = (apps[j] + 1 + rng.below(49)) % 50;
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
            Some("compile-10k") => full_compile(Scale {
                pods: 10_000,
                policies: 1_000,
                namespaces: 300,
            }),
            Some("compile-150k") => full_compile(Scale {
                pods: 150_000,
                policies: 10_000,
                namespaces: 5_000,
            }),
            Some("label-change") => {
                let base = label_change(1_000);
                let base_median = base.median;
                for (pods, r) in [
                    (1_000, base),
                    (10_000, label_change(10_000)),
                    (100_000, label_change(100_000)),
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
    for scenario in ["compile-10k", "compile-150k", "label-change"] {
        let status = std::process::Command::new(&exe)
            .args(["--scenario", scenario])
            .status()
            .expect("run scenario");
        assert!(status.success(), "scenario {scenario} failed");
    }
    println!("targets: 150k pods / 10k policies under 2 s and 500 MB RSS; one label change under 1 ms, update size flat with cluster size");
}
