//! Synthetic clusters for the benchmarks (`calc_graph`, `dataplane`), included by both with
//! `#[path = "support/synthetic.rs"] mod synthetic;` so the generator is written once.
//!
//! Generated with a small fixed-seed PRNG (no dependency needed for benchmark data):
//! namespaces with team/env labels; pods with app/tier/version labels and named ports, the
//! first `Scale::local` of them on the benchmarked node (`NODE`); policies of five shapes (pod
//! selector peers, namespace+pod selector peers with named ports, ipBlock with except and port
//! ranges, default deny, namespace-selector peers), and with `Scale::cluster_policies` as
//! many ClusterNetworkPolicies in each of the Admin and Baseline tiers (five shapes per tier:
//! namespace and pod subjects, pods/namespaces/networks peers, numeric and named ports, every
//! action; drawn after everything else, so the rest of the cluster does not change). The
//! same seed gives the same cluster.
//! With `Scale::dual` every pod is dual-stack (its IPv4 address and `fd00::<the same 32
//! bits>`), every ipBlock peer comes in both families and the graph renders both; the draws
//! are the same, so the dual cluster is the IPv4 one plus its IPv6 half.
//!
//! [`write_cluster`] puts the same cluster on disk for the benchmarks that run the agent on
//! a directory datastore (`idle`, `soak`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::cluster_policy::{
    ClusterNetworkPolicySpec, EgressPeer, EgressRule, IngressPeer, IngressRule, NamespacedPod,
    Port, PortRange, ProtocolEntry, ProtocolPort, Subject,
};
use netpol_agent::model::{ClusterNetworkPolicy, IpFamily};
use netpol_agent::rules::RuleConfig;

/// The benchmarked node.
pub const NODE: &str = "node-0";
/// Distinct `app` label values (`app-0` … `app-49`).
pub const APPS: usize = 50;

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy)]
pub struct Scale {
    pub pods: usize,
    pub policies: usize,
    pub namespaces: usize,
    /// Pods on the benchmarked node: pods `0..local`.
    pub local: usize,
    /// Dual-stack pods, ipBlocks in both families, both families rendered.
    pub dual: bool,
    /// ClusterNetworkPolicies per tier (Admin and Baseline each).
    pub cluster_policies: usize,
}

impl Scale {
    pub fn families(&self) -> Vec<IpFamily> {
        if self.dual {
            vec![IpFamily::V4, IpFamily::V6]
        } else {
            vec![IpFamily::V4]
        }
    }
}

pub fn labels(pairs: &[(&str, String)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

pub fn sel(pairs: &[(&str, String)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(pairs),
        match_expressions: None,
    }
}

pub fn namespace(i: usize) -> Namespace {
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

pub fn pod_ip(j: usize) -> String {
    format!("10.{}.{}.{}", (j >> 16) & 0xff, (j >> 8) & 0xff, j & 0xff)
}

/// Pod `j`'s IPv6 address in a dual-stack cluster.
pub fn pod_ip6(j: usize) -> String {
    format!("fd00::a{:02x}:{:x}", (j >> 16) & 0xff, j & 0xffff)
}

/// Namespace index of pod `j`.
pub fn pod_namespace(j: usize, scale: Scale) -> usize {
    j % scale.namespaces
}

/// Pod `j` with label `app-<app>`; pods `0..scale.local` are on `NODE`, the others spread
/// over the remaining nodes.
pub fn pod(j: usize, scale: Scale, app: usize) -> Pod {
    let nodes = (scale.pods / scale.local.max(1)).max(2);
    let node = if j < scale.local {
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
            namespace: Some(format!("ns-{}", pod_namespace(j, scale))),
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
            pod_ips: Some(if scale.dual {
                vec![PodIP { ip: pod_ip(j) }, PodIP { ip: pod_ip6(j) }]
            } else {
                vec![PodIP { ip: pod_ip(j) }]
            }),
            ..Default::default()
        }),
    }
}

pub fn tcp(port: IntOrString, end: Option<i32>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(port),
        end_port: end,
        protocol: Some("TCP".into()),
    }
}

/// Policy `k` (`pol-<k>` in namespace `ns-<k % namespaces>`), of shape `k % 5`.
pub fn policy(k: usize, scale: Scale, rng: &mut Rng) -> NetworkPolicy {
    let app = |rng: &mut Rng| format!("app-{}", rng.below(APPS));
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
            let except = rng.below(200);
            let mut to = vec![NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: "10.0.0.0/8".into(),
                    except: Some(vec![format!("10.{except}.0.0/16")]),
                }),
                ..Default::default()
            }];
            if scale.dual {
                // The same block for the IPv6 half of the pods (fd00::a<b>:<cd> for 10.b.c.d).
                to.push(NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: "fd00::a00:0/104".into(),
                        except: Some(vec![format!("fd00::a{except:02x}:0/112")]),
                    }),
                    ..Default::default()
                });
            }
            spec.egress = Some(vec![NetworkPolicyEgressRule {
                to: Some(to),
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

/// The `app-<n>` a policy's pod selector asks for, if it selects by app.
pub fn selected_app(np: &NetworkPolicy) -> Option<usize> {
    np.spec
        .as_ref()?
        .pod_selector
        .as_ref()?
        .match_labels
        .as_ref()?
        .get("app")?
        .strip_prefix("app-")?
        .parse()
        .ok()
}

fn number(protocol: &str, n: i64) -> ProtocolEntry {
    let port = Some(ProtocolPort {
        destination_port: Some(Port {
            number: Some(n),
            ..Default::default()
        }),
    });
    match protocol {
        "udp" => ProtocolEntry {
            udp: port,
            ..Default::default()
        },
        _ => ProtocolEntry {
            tcp: port,
            ..Default::default()
        },
    }
}

fn tcp_range(start: i64, end: i64) -> ProtocolEntry {
    ProtocolEntry {
        tcp: Some(ProtocolPort {
            destination_port: Some(Port {
                range: Some(PortRange {
                    start: Some(start),
                    end: Some(end),
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

fn named(name: &str) -> ProtocolEntry {
    ProtocolEntry {
        destination_named_port: Some(name.into()),
        ..Default::default()
    }
}

fn ns_subject(s: LabelSelector) -> Subject {
    Subject {
        namespaces: Some(s),
        ..Default::default()
    }
}

fn pods_of(ns: LabelSelector, pods: LabelSelector) -> NamespacedPod {
    NamespacedPod {
        namespace_selector: Some(ns),
        pod_selector: Some(pods),
    }
}

fn in_from(
    action: &str,
    from: Vec<IngressPeer>,
    protocols: Option<Vec<ProtocolEntry>>,
) -> IngressRule {
    IngressRule {
        name: None,
        action: Some(action.into()),
        from: Some(from),
        protocols,
    }
}

fn out_to(action: &str, to: Vec<EgressPeer>, protocols: Option<Vec<ProtocolEntry>>) -> EgressRule {
    EgressRule {
        name: None,
        action: Some(action.into()),
        to: Some(to),
        protocols,
    }
}

fn ns_in(s: LabelSelector) -> IngressPeer {
    IngressPeer {
        namespaces: Some(s),
        ..Default::default()
    }
}

fn pods_in(p: NamespacedPod) -> IngressPeer {
    IngressPeer {
        pods: Some(p),
        ..Default::default()
    }
}

fn ns_out(s: LabelSelector) -> EgressPeer {
    EgressPeer {
        namespaces: Some(s),
        ..Default::default()
    }
}

fn pods_out(p: NamespacedPod) -> EgressPeer {
    EgressPeer {
        pods: Some(p),
        ..Default::default()
    }
}

fn nets_out(v4: &str, v6: &str, dual: bool) -> EgressPeer {
    let mut networks = vec![v4.to_string()];
    if dual {
        networks.push(v6.to_string());
    }
    EgressPeer {
        networks: Some(networks),
        ..Default::default()
    }
}

/// ClusterNetworkPolicy `k` of a tier (`admin-<k>` or `baseline-<k>`), of shape `k % 5`.
pub fn cluster_policy(k: usize, admin: bool, scale: Scale, rng: &mut Rng) -> ClusterNetworkPolicy {
    let app = |rng: &mut Rng| sel(&[("app", format!("app-{}", rng.below(APPS)))]);
    let team = |rng: &mut Rng| sel(&[("team", format!("team-{}", rng.below(20)))]);
    let env = |e: &str| sel(&[("env", e.to_string())]);
    let tier = |t: &str| sel(&[("tier", t.to_string())]);
    let all = LabelSelector::default;
    let dual = scale.dual;
    let mut spec = ClusterNetworkPolicySpec {
        tier: Some(if admin { "Admin" } else { "Baseline" }.into()),
        priority: Some((k * 37 % 1001) as i64),
        ..Default::default()
    };
    match (admin, k % 5) {
        (true, 0) => {
            spec.subject = Some(ns_subject(env("prod")));
            spec.ingress = Some(vec![
                in_from(
                    "Deny",
                    vec![ns_in(team(rng))],
                    Some(vec![number("tcp", 8080)]),
                ),
                in_from("Accept", vec![pods_in(pods_of(all(), app(rng)))], None),
            ]);
        }
        (true, 1) => {
            spec.subject = Some(Subject {
                pods: Some(pods_of(team(rng), tier("db"))),
                ..Default::default()
            });
            let r = rng.below(200);
            spec.egress = Some(vec![
                out_to(
                    "Accept",
                    vec![pods_out(pods_of(all(), app(rng)))],
                    Some(vec![named("http")]),
                ),
                out_to("Pass", vec![ns_out(env("dev"))], None),
                out_to(
                    "Deny",
                    vec![nets_out(
                        &format!("10.{r}.0.0/16"),
                        &format!("fd00::a{r:02x}:0/112"),
                        dual,
                    )],
                    None,
                ),
            ]);
        }
        (true, 2) => {
            spec.subject = Some(ns_subject(all()));
            spec.egress = Some(vec![out_to(
                "Deny",
                vec![nets_out("169.254.169.254/32", "fd00:ec2::254/128", dual)],
                None,
            )]);
        }
        (true, 3) => {
            spec.subject = Some(Subject {
                pods: Some(pods_of(env("prod"), tier("web"))),
                ..Default::default()
            });
            spec.ingress = Some(vec![
                in_from(
                    "Pass",
                    vec![ns_in(env("dev"))],
                    Some(vec![tcp_range(8000, 8100)]),
                ),
                in_from("Accept", vec![ns_in(team(rng))], None),
            ]);
        }
        (true, _) => {
            spec.subject = Some(ns_subject(team(rng)));
            spec.ingress = Some(vec![in_from(
                "Accept",
                vec![pods_in(pods_of(all(), tier("api")))],
                Some(vec![number("udp", 53), number("tcp", 9090)]),
            )]);
        }
        (false, 0) => {
            spec.subject = Some(ns_subject(team(rng)));
            spec.ingress = Some(vec![in_from("Deny", vec![ns_in(all())], None)]);
        }
        (false, 1) => {
            spec.subject = Some(ns_subject(env("dev")));
            spec.egress = Some(vec![out_to(
                "Deny",
                vec![pods_out(pods_of(all(), app(rng)))],
                None,
            )]);
        }
        (false, 2) => {
            spec.subject = Some(Subject {
                pods: Some(pods_of(all(), tier("db"))),
                ..Default::default()
            });
            spec.ingress = Some(vec![
                in_from(
                    "Accept",
                    vec![pods_in(pods_of(all(), tier("api")))],
                    Some(vec![named("metrics")]),
                ),
                in_from("Deny", vec![ns_in(all())], None),
            ]);
        }
        (false, 3) => {
            spec.subject = Some(ns_subject(all()));
            spec.egress = Some(vec![out_to(
                "Accept",
                vec![nets_out("10.0.0.0/8", "fd00::a00:0/104", dual)],
                Some(vec![number("tcp", 443)]),
            )]);
        }
        (false, _) => {
            spec.subject = Some(ns_subject(team(rng)));
            spec.egress = Some(vec![
                out_to("Pass", vec![ns_out(env("prod"))], None),
                out_to("Deny", vec![nets_out("0.0.0.0/0", "::/0", dual)], None),
            ]);
        }
    }
    ClusterNetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("{}-{k}", if admin { "admin" } else { "baseline" })),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// The ClusterNetworkPolicies of a scale: the Admin ones, then the Baseline ones.
pub fn cluster_policies(scale: Scale, rng: &mut Rng) -> Vec<ClusterNetworkPolicy> {
    let mut out = Vec::with_capacity(2 * scale.cluster_policies);
    for admin in [true, false] {
        for k in 0..scale.cluster_policies {
            out.push(cluster_policy(k, admin, scale, rng));
        }
    }
    out
}

// Included here rather than reached through `common`: most benchmarks that include this
// file do not include `tests/common`, and need not for this one self-contained file. Those
// that include both load it twice, as two modules whose types nothing mixes.
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/common/cluster.rs"]
mod cluster;

/// The cluster `build` feeds when its generator starts as `Rng(seed)`, as manifests in the
/// datastore directory `dir`: `namespaces.yaml`, `pods.yaml`, `policies.yaml`. `wide` more
/// policies of [`wide_policy`] (`wide_apps` apps each) follow the others in
/// `policies.yaml`; drawn last, they leave the rest of the cluster as it is without them.
pub fn write_cluster(dir: &Path, scale: Scale, seed: u64, wide: usize, wide_apps: usize) {
    // `build` draws the ClusterNetworkPolicies right after the policies, where the wide
    // ones are drawn here: the two cannot both be the same cluster as `build`'s.
    assert_eq!(
        scale.cluster_policies, 0,
        "write_cluster writes no ClusterNetworkPolicies"
    );
    let mut rng = Rng(seed);
    let mut namespaces = cluster::Manifest::new();
    for i in 0..scale.namespaces {
        namespaces.object(&namespace(i));
    }
    // The same draws as `build`: one app per pod, then the policies.
    let mut pods = cluster::Manifest::new();
    for j in 0..scale.pods {
        let app = rng.below(APPS);
        pods.object(&pod(j, scale, app));
    }
    let mut policies = cluster::Manifest::new();
    for k in 0..scale.policies {
        policies.object(&policy(k, scale, &mut rng));
    }
    for k in 0..wide {
        policies.object(&wide_policy(k, scale, &mut rng, wide_apps));
    }
    namespaces.write(dir, "namespaces.yaml");
    pods.write(dir, "pods.yaml");
    policies.write(dir, "policies.yaml");
}

pub fn new_graph(families: Vec<IpFamily>) -> Calculation {
    Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families,
            rules: RuleConfig::default(),
        },
        Box::new(CalicoResolver::default()),
    )
}

/// Feeds a whole synthetic cluster; objects are built and dropped one at a time, as a watch
/// would deliver them. Returns the graph and the app label value of each pod.
pub fn build(scale: Scale, rng: &mut Rng) -> (Calculation, Vec<usize>) {
    let mut g = new_graph(scale.families());
    for i in 0..scale.namespaces {
        g.upsert_namespace(&namespace(i));
    }
    // `policies` below repeats these draws: keep the two in step.
    let mut apps = Vec::with_capacity(scale.pods);
    for j in 0..scale.pods {
        let app = rng.below(APPS);
        apps.push(app);
        g.upsert_pod(&pod(j, scale, app));
    }
    for k in 0..scale.policies {
        g.upsert_policy(&policy(k, scale, rng));
    }
    for cnp in cluster_policies(scale, rng) {
        g.upsert_cluster_policy(&cnp);
    }
    (g, apps)
}

/// The policies `build` feeds when its generator starts as `Rng(seed)`, generated again, for
/// scenarios that need to know them (without slowing `build` down).
pub fn policies(scale: Scale, seed: u64) -> impl Iterator<Item = NetworkPolicy> {
    let mut rng = Rng(seed);
    // `build` draws one app per pod before the policies.
    for _ in 0..scale.pods {
        rng.below(APPS);
    }
    (0..scale.policies).map(move |k| policy(k, scale, &mut rng))
}

/// Policy `k` of a peer-heavy supplement (`wide-<k>` in namespace `ns-<k % namespaces>`),
/// for a node whose IP sets are many and large (the idle benchmark's `--wide`): it applies
/// to every pod of its namespace (so to that namespace's local pods) and admits TCP 8080 from
/// pods of `apps` distinct apps (`app In [...]`) in the namespaces of one `env`: one set of
/// about `pods / 3 * apps / APPS` members per policy (200 at 10k pods and 3 apps), nearly
/// every one distinct. Nothing else draws from `rng` after these, so adding them leaves the
/// rest of the cluster as it was.
pub fn wide_policy(k: usize, scale: Scale, rng: &mut Rng, apps: usize) -> NetworkPolicy {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    let mut values: Vec<String> = Vec::new();
    while values.len() < apps.clamp(1, APPS) {
        let a = format!("app-{}", rng.below(APPS));
        if !values.contains(&a) {
            values.push(a);
        }
    }
    values.sort();
    let spec = NetworkPolicySpec {
        pod_selector: Some(LabelSelector::default()),
        ingress: Some(vec![NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(sel(&[(
                    "env",
                    ["prod", "dev", "staging"][k % 3].to_string(),
                )])),
                pod_selector: Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "app".into(),
                        operator: "In".into(),
                        values: Some(values),
                    }]),
                }),
                ip_block: None,
            }]),
            ports: Some(vec![tcp(IntOrString::Int(8080), None)]),
        }]),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("wide-{k}")),
            namespace: Some(format!("ns-{}", k % scale.namespaces)),
            ..Default::default()
        },
        spec: Some(spec),
    }
}
