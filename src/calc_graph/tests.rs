//! Calc graph tests: incremental updates against a from-scratch compile (NetworkPolicies and
//! ClusterNetworkPolicies), the tier layout, and the cost of label changes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kube::core::Expression;
use proptest::prelude::*;

use super::update::DesiredState;
use super::GraphConfig;
use crate::agent::Calculation;
use crate::iface_naming::{CalicoResolver, InterfaceResolver};
use crate::model::*;
use crate::rules::RuleConfig;

pub(crate) const NODE: &str = "node-1";
pub(crate) const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub(crate) const POD_NAMES: [&str; 4] = ["a", "b", "c", "d"];
pub(crate) const POLICY_NAMES: [&str; 3] = ["p1", "p2", "p3"];
pub(crate) const CLUSTER_POLICY_NAMES: [&str; 3] = ["c1", "c2", "c3"];

fn graph() -> Calculation {
    graph_with_union_min(RuleConfig::default().policy_union_min)
}

/// The test graph with `FELIX_POLICYUNIONMIN` = `min` (1: every isolated pod has union
/// sets; 0: none).
fn graph_with_union_min(min: usize) -> Calculation {
    Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4, IpFamily::V6],
            rules: RuleConfig {
                policy_union_min: min,
                ..RuleConfig::default()
            },
        },
        Box::new(CalicoResolver::default()),
    )
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) fn eq(k: &str, v: &str) -> Expression {
    Expression::Equal(k.into(), v.into())
}

// ---- generators ----

pub(crate) fn label_map(
    keys: &'static [(&'static str, &'static [&'static str])],
) -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::vec(proptest::option::of(0usize..3), keys.len()).prop_map(
        move |choices| {
            keys.iter()
                .zip(choices)
                .filter_map(|((k, vals), c)| {
                    c.map(|i| (k.to_string(), vals[i % vals.len()].to_string()))
                })
                .collect()
        },
    )
}

pub(crate) const POD_LABELS: &[(&str, &[&str])] = &[
    ("pod", &["a", "b", "c"]),
    ("app", &["web", "db"]),
    ("tier", &["1", "2"]),
];
pub(crate) const NS_LABELS: &[(&str, &[&str])] =
    &[("team", &["red", "blue"]), ("env", &["prod", "dev"])];

fn expression(
    keys: &'static [(&'static str, &'static [&'static str])],
) -> impl Strategy<Value = Expression> {
    (0..keys.len(), 0usize..6, 0usize..3, any::<bool>()).prop_map(move |(ki, op, vi, two)| {
        let (k, vals) = keys[ki];
        let v = vals[vi % vals.len()].to_string();
        let mut set: BTreeSet<String> = BTreeSet::from([v.clone()]);
        if two {
            set.insert(vals[(vi + 1) % vals.len()].to_string());
        }
        match op {
            0 => Expression::Equal(k.into(), v),
            1 => Expression::In(k.into(), set),
            2 => Expression::NotIn(k.into(), set),
            3 => Expression::Exists(k.into()),
            4 => Expression::DoesNotExist(k.into()),
            _ => Expression::Equal(k.into(), v),
        }
    })
}

fn selector(
    keys: &'static [(&'static str, &'static [&'static str])],
) -> impl Strategy<Value = LabelSel> {
    proptest::collection::vec(expression(keys), 0..3).prop_map(LabelSel::from_exprs)
}

fn ns_scope(own: &'static str) -> impl Strategy<Value = NamespaceScope> {
    prop_oneof![
        Just(NamespaceScope::Named(own.to_string())),
        selector(NS_LABELS).prop_map(NamespaceScope::Selector),
        (0..3usize).prop_map(|i| NamespaceScope::Selector(LabelSel::from_exprs(vec![eq(
            NAMESPACE_NAME_LABEL,
            NAMESPACES[i]
        )]))),
    ]
}

fn peer(own: &'static str) -> impl Strategy<Value = Peer> {
    prop_oneof![
        3 => (ns_scope(own), selector(POD_LABELS)).prop_map(|(namespaces, pods)| Peer::Pods { namespaces, pods }),
        1 => (0u8..4, any::<bool>()).prop_map(|(i, v6)| {
            if v6 {
                Peer::IpBlock { cidr: "fd00::/104".parse().unwrap(), except: vec![format!("fd00::{i}:0/112").parse().unwrap()] }
            } else {
                Peer::IpBlock { cidr: "10.0.0.0/16".parse().unwrap(), except: vec![format!("10.0.{i}.0/24").parse().unwrap()] }
            }
        }),
    ]
}

fn port_spec() -> impl Strategy<Value = PortSpec> {
    prop_oneof![
        Just(PortSpec {
            protocol: Protocol::Tcp,
            port: PortMatch::Range {
                first: 80,
                last: 80
            }
        }),
        Just(PortSpec {
            protocol: Protocol::Tcp,
            port: PortMatch::Range {
                first: 8000,
                last: 8080
            }
        }),
        Just(PortSpec {
            protocol: Protocol::Udp,
            port: PortMatch::Any
        }),
        Just(PortSpec {
            protocol: Protocol::Tcp,
            port: PortMatch::Named("http".into())
        }),
        Just(PortSpec {
            protocol: Protocol::Udp,
            port: PortMatch::Named("dns".into())
        }),
        Just(PortSpec {
            protocol: Protocol::Sctp,
            port: PortMatch::Range {
                first: 81,
                last: 81
            }
        }),
    ]
}

fn rule(own: &'static str) -> impl Strategy<Value = PolicyRule> {
    (
        proptest::collection::vec(port_spec(), 0..3),
        proptest::option::of(proptest::collection::vec(peer(own), 1..3)),
    )
        .prop_map(|(ports, peers)| PolicyRule { ports, peers })
}

pub(crate) fn policy() -> impl Strategy<Value = PolicyInfo> {
    (0..3usize, 0..3usize).prop_flat_map(|(ni, pi)| {
        let ns = NAMESPACES[ni];
        (
            selector(POD_LABELS),
            proptest::option::of(proptest::collection::vec(rule(ns), 0..3)),
            proptest::option::of(proptest::collection::vec(rule(ns), 0..3)),
        )
            .prop_map(move |(pod_selector, ingress, egress)| PolicyInfo {
                key: ObjectKey::new(ns, POLICY_NAMES[pi]),
                pod_selector,
                ingress: if ingress.is_none() && egress.is_none() {
                    Some(vec![])
                } else {
                    ingress
                },
                egress,
            })
    })
}

pub(crate) fn pod() -> impl Strategy<Value = PodInfo> {
    (
        0..3usize,
        0..4usize,
        label_map(POD_LABELS),
        any::<bool>(),
        0u8..2,
        proptest::collection::vec(0usize..3, 0..3),
    )
        .prop_map(|(ni, pi, labels, local, ip_variant, ports)| {
            let index = (ni * 4 + pi) as u8 + 1;
            let ips: Vec<IpAddr> = vec![
                format!("10.0.{ip_variant}.{index}").parse().unwrap(),
                format!("fd00::{ip_variant}:{index}").parse().unwrap(),
            ];
            let catalogue = [
                NamedPort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 80,
                },
                NamedPort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 8080,
                },
                NamedPort {
                    name: "dns".into(),
                    protocol: Protocol::Udp,
                    port: 53,
                },
            ];
            let mut named_ports: Vec<NamedPort> =
                ports.into_iter().map(|i| catalogue[i].clone()).collect();
            named_ports.sort();
            named_ports.dedup_by(|a, b| a.name == b.name && a.protocol == b.protocol);
            PodInfo {
                key: ObjectKey::new(NAMESPACES[ni], POD_NAMES[pi]),
                uid: None,
                node: Some(if local { NODE } else { "node-2" }.into()),
                labels,
                ips,
                named_ports,
                sandbox_id: None,
            }
        })
}

fn pod_selection() -> impl Strategy<Value = PodSelection> {
    (selector(NS_LABELS), selector(POD_LABELS))
        .prop_map(|(namespaces, pods)| PodSelection { namespaces, pods })
}

fn cluster_peer(egress: bool) -> impl Strategy<Value = ClusterPeer> {
    let networks = (0u8..4, any::<bool>()).prop_map(move |(i, v6)| {
        if !egress {
            // Ingress has no networks peer: a second pods peer instead.
            return ClusterPeer::Pods(PodSelection {
                namespaces: LabelSel::everything(),
                pods: LabelSel::from_exprs(vec![eq("pod", "a")]),
            });
        }
        let mut nets: Vec<ipnet::IpNet> = vec![format!("10.0.{i}.0/24").parse().unwrap()];
        if v6 {
            nets.push("fd00::/104".parse().unwrap());
        }
        ClusterPeer::Networks(nets)
    });
    prop_oneof![
        4 => pod_selection().prop_map(ClusterPeer::Pods),
        2 => networks,
        1 => Just(ClusterPeer::Unknown(vec!["futurePeer".into()])),
    ]
}

fn cluster_port() -> impl Strategy<Value = ClusterPort> {
    prop_oneof![
        Just(ClusterPort::Numeric {
            protocol: Protocol::Tcp,
            first: 80,
            last: 80
        }),
        Just(ClusterPort::Numeric {
            protocol: Protocol::Tcp,
            first: 8000,
            last: 8080
        }),
        Just(ClusterPort::Numeric {
            protocol: Protocol::Udp,
            first: 53,
            last: 53
        }),
        Just(ClusterPort::Numeric {
            protocol: Protocol::Sctp,
            first: 81,
            last: 81
        }),
        Just(ClusterPort::Named("http".into())),
        Just(ClusterPort::Named("dns".into())),
    ]
}

fn cluster_rule(egress: bool) -> impl Strategy<Value = ClusterRule> {
    (
        0..3usize,
        proptest::collection::vec(cluster_peer(egress), 1..3),
        proptest::option::of(proptest::collection::vec(cluster_port(), 1..3)),
    )
        .prop_map(|(action, peers, mut ports)| {
            // Validation refuses named ports beside a networks peer.
            if peers.iter().any(|p| matches!(p, ClusterPeer::Networks(_))) {
                if let Some(list) = &mut ports {
                    list.retain(|p| !matches!(p, ClusterPort::Named(_)));
                    if list.is_empty() {
                        ports = None;
                    }
                }
            }
            ClusterRule {
                name: None,
                action: [RuleAction::Accept, RuleAction::Deny, RuleAction::Pass][action],
                peers,
                ports,
            }
        })
}

pub(crate) fn cluster_policy() -> impl Strategy<Value = ClusterPolicyInfo> {
    (
        0..3usize,
        any::<bool>(),
        // Few values, so that ties happen.
        0u16..3,
        pod_selection(),
        proptest::collection::vec(cluster_rule(false), 0..3),
        proptest::collection::vec(cluster_rule(true), 0..3),
    )
        .prop_map(
            |(n, admin, priority, subject, ingress, egress)| ClusterPolicyInfo {
                name: CLUSTER_POLICY_NAMES[n].into(),
                tier: if admin { Tier::Admin } else { Tier::Baseline },
                priority,
                subject,
                ingress,
                egress,
            },
        )
}

#[derive(Clone, Debug)]
enum Event {
    UpsertNamespace(NamespaceInfo),
    DeleteNamespace(String),
    UpsertPod(PodInfo),
    /// Only the labels of an existing pod change (IPs and ports stay).
    RelabelPod(ObjectKey, BTreeMap<String, String>),
    DeletePod(ObjectKey),
    UpsertPolicy(PolicyInfo),
    DeletePolicy(ObjectKey),
    UpsertClusterPolicy(ClusterPolicyInfo),
    DeleteClusterPolicy(String),
    Flush,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        2 => (0..3usize, label_map(NS_LABELS)).prop_map(|(i, mut labels)| {
            labels.insert(NAMESPACE_NAME_LABEL.into(), NAMESPACES[i].into());
            Event::UpsertNamespace(NamespaceInfo { name: NAMESPACES[i].into(), labels })
        }),
        1 => (0..3usize).prop_map(|i| Event::DeleteNamespace(NAMESPACES[i].into())),
        4 => pod().prop_map(Event::UpsertPod),
        5 => (0..3usize, 0..4usize, label_map(POD_LABELS))
            .prop_map(|(n, p, l)| Event::RelabelPod(ObjectKey::new(NAMESPACES[n], POD_NAMES[p]), l)),
        2 => (0..3usize, 0..4usize).prop_map(|(n, p)| Event::DeletePod(ObjectKey::new(NAMESPACES[n], POD_NAMES[p]))),
        4 => policy().prop_map(Event::UpsertPolicy),
        1 => (0..3usize, 0..3usize).prop_map(|(n, p)| Event::DeletePolicy(ObjectKey::new(NAMESPACES[n], POLICY_NAMES[p]))),
        3 => cluster_policy().prop_map(Event::UpsertClusterPolicy),
        1 => (0..3usize).prop_map(|n| Event::DeleteClusterPolicy(CLUSTER_POLICY_NAMES[n].into())),
        2 => Just(Event::Flush),
    ]
}

/// The objects that exist after a sequence of events.
#[derive(Default)]
struct World {
    namespaces: BTreeMap<String, NamespaceInfo>,
    pods: BTreeMap<ObjectKey, PodInfo>,
    policies: BTreeMap<ObjectKey, PolicyInfo>,
    cluster_policies: BTreeMap<String, ClusterPolicyInfo>,
}

fn apply(graph: &mut Calculation, world: &mut World, e: &Event, acc: &mut DesiredState) {
    match e.clone() {
        Event::UpsertNamespace(ns) => {
            world.namespaces.insert(ns.name.clone(), ns.clone());
            graph.upsert_namespace_info(ns);
        }
        Event::DeleteNamespace(n) => {
            world.namespaces.remove(&n);
            graph.remove_namespace(&n);
        }
        Event::UpsertPod(p) => {
            world.pods.insert(p.key.clone(), p.clone());
            graph.upsert_pod_info(p);
        }
        Event::RelabelPod(k, labels) => {
            if let Some(p) = world.pods.get_mut(&k) {
                p.labels = labels;
                graph.upsert_pod_info(p.clone());
            }
        }
        Event::DeletePod(k) => {
            world.pods.remove(&k);
            graph.remove_pod(&k);
        }
        Event::UpsertPolicy(p) => {
            world.policies.insert(p.key.clone(), p.clone());
            graph.upsert_policy_info(p);
        }
        Event::DeletePolicy(k) => {
            world.policies.remove(&k);
            graph.remove_policy(&k);
        }
        Event::UpsertClusterPolicy(p) => {
            world.cluster_policies.insert(p.name.clone(), p.clone());
            graph.upsert_cluster_policy_info(p);
        }
        Event::DeleteClusterPolicy(n) => {
            world.cluster_policies.remove(&n);
            graph.remove_cluster_policy(&n);
        }
        Event::Flush => acc.apply(&graph.flush()),
    }
}

fn from_scratch(world: &World, order: u8, union_min: usize) -> DesiredState {
    let mut g = graph_with_union_min(union_min);
    let cluster = |g: &mut Calculation, reverse: bool| {
        let mut all: Vec<&ClusterPolicyInfo> = world.cluster_policies.values().collect();
        if reverse {
            all.reverse();
        }
        all.into_iter()
            .for_each(|p| g.upsert_cluster_policy_info(p.clone()));
    };
    // Feed in different orders: the result must not depend on it.
    match order % 3 {
        0 => {
            cluster(&mut g, false);
            world
                .namespaces
                .values()
                .for_each(|n| g.upsert_namespace_info(n.clone()));
            world
                .pods
                .values()
                .for_each(|p| g.upsert_pod_info(p.clone()));
            world
                .policies
                .values()
                .for_each(|p| g.upsert_policy_info(p.clone()));
        }
        1 => {
            world
                .policies
                .values()
                .rev()
                .for_each(|p| g.upsert_policy_info(p.clone()));
            cluster(&mut g, true);
            world
                .pods
                .values()
                .rev()
                .for_each(|p| g.upsert_pod_info(p.clone()));
            world
                .namespaces
                .values()
                .for_each(|n| g.upsert_namespace_info(n.clone()));
        }
        _ => {
            world
                .pods
                .values()
                .for_each(|p| g.upsert_pod_info(p.clone()));
            world
                .namespaces
                .values()
                .for_each(|n| g.upsert_namespace_info(n.clone()));
            world
                .policies
                .values()
                .for_each(|p| g.upsert_policy_info(p.clone()));
            cluster(&mut g, false);
        }
    }
    let mut acc = DesiredState::default();
    acc.apply(&g.flush());
    assert_eq!(
        acc,
        g.snapshot(),
        "a single flush from empty must equal the snapshot"
    );
    acc
}

/// A short description of how two states differ (for readable failures).
fn state_diff(a: &DesiredState, b: &DesiredState) -> String {
    let mut out = Vec::new();
    for (fam, fa) in &a.families {
        let empty = Default::default();
        let fb = b.families.get(fam).unwrap_or(&empty);
        for (name, s) in &fa.sets {
            match fb.sets.get(name) {
                None => out.push(format!("{fam:?} set {name} only left")),
                Some(t) if t != s => out.push(format!(
                    "{fam:?} set {name}: {:?} vs {:?}",
                    s.members, t.members
                )),
                _ => {}
            }
        }
        for name in fb.sets.keys().filter(|n| !fa.sets.contains_key(*n)) {
            out.push(format!("{fam:?} set {name} only right"));
        }
        for (name, c) in &fa.chains {
            match fb.chains.get(name) {
                None => out.push(format!("{fam:?} chain {name} only left")),
                Some(d) if d != c => out.push(format!(
                    "{fam:?} chain {name}:\n  {:?}\n  {:?}",
                    c.rules.iter().map(|r| &r.body).collect::<Vec<_>>(),
                    d.rules.iter().map(|r| &r.body).collect::<Vec<_>>()
                )),
                _ => {}
            }
        }
        for name in fb.chains.keys().filter(|n| !fa.chains.contains_key(*n)) {
            out.push(format!("{fam:?} chain {name} only right"));
        }
    }
    out.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn incremental_deltas_reach_the_from_scratch_state(
        events in proptest::collection::vec(event(), 1..60),
        order in 0u8..3,
        // Union sets (rules::union) for every isolated pod, for pods of two policies or
        // more, or never: their members follow the peers' sets through every event.
        union_min in 0usize..3,
    ) {
        let mut g = graph_with_union_min(union_min);
        let mut world = World::default();
        let mut acc = DesiredState::default();
        for e in &events {
            apply(&mut g, &mut world, e, &mut acc);
        }
        acc.apply(&g.flush());
        // A second flush with nothing new emits nothing.
        prop_assert!(g.flush().is_empty());
        let snapshot = g.snapshot();
        prop_assert!(acc == snapshot, "updates vs snapshot:\n{}", state_diff(&acc, &snapshot));
        let scratch = from_scratch(&world, order, union_min);
        prop_assert!(acc == scratch, "incremental vs scratch:\n{}", state_diff(&acc, &scratch));
    }
}

// ---- targeted tests ----

pub(crate) fn local_pod(ns: &str, name: &str, ip: &str, l: &[(&str, &str)]) -> PodInfo {
    PodInfo {
        key: ObjectKey::new(ns, name),
        uid: None,
        node: Some(NODE.into()),
        labels: labels(l),
        ips: vec![ip.parse().unwrap()],
        named_ports: vec![],
        sandbox_id: None,
    }
}

pub(crate) fn allow_from(
    ns: &str,
    name: &str,
    target: &[(&str, &str)],
    from: Vec<Expression>,
) -> PolicyInfo {
    PolicyInfo {
        key: ObjectKey::new(ns, name),
        pod_selector: LabelSel::from_exprs(target.iter().map(|(k, v)| eq(k, v)).collect()),
        ingress: Some(vec![PolicyRule {
            ports: vec![],
            peers: Some(vec![Peer::Pods {
                namespaces: NamespaceScope::Named(ns.into()),
                pods: LabelSel::from_exprs(from),
            }]),
        }]),
        egress: None,
    }
}

#[test]
fn remote_label_change_touches_only_the_sets_that_name_its_values() {
    let mut g = graph();
    g.upsert_pod_info(local_pod("x", "server", "10.0.0.1", &[("role", "server")]));
    // 200 policies, each allowing from a different app value.
    for i in 0..200 {
        g.upsert_policy_info(allow_from(
            "x",
            &format!("p{i}"),
            &[("role", "server")],
            vec![eq("app", &format!("app{i}"))],
        ));
    }
    let mut client = local_pod("x", "client", "10.0.0.2", &[("app", "app3")]);
    client.node = Some("node-2".into());
    g.upsert_pod_info(client.clone());
    g.flush();

    let before = g.set_evaluations();
    client.labels = labels(&[("app", "app7")]);
    g.upsert_pod_info(client.clone());
    let update = g.flush();
    assert_eq!(
        g.set_evaluations() - before,
        2,
        "only the app3 and app7 sets are evaluated"
    );
    assert!(update.chains_upserted.is_empty() && update.chains_removed.is_empty());
    let added: Vec<_> = update.members_added.values().flatten().collect();
    let removed: Vec<_> = update.members_removed.values().flatten().collect();
    assert_eq!((added.len(), removed.len()), (1, 1));

    // A label no selector mentions costs nothing.
    let before = g.set_evaluations();
    client.labels.insert("unrelated".into(), "v".into());
    g.upsert_pod_info(client);
    assert!(g.flush().is_empty());
    assert_eq!(g.set_evaluations(), before);
}

#[test]
fn isolation_follows_policy_types_per_direction() {
    let mut g = graph();
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("pod", "a")]));
    g.upsert_policy_info(PolicyInfo {
        key: ObjectKey::new("x", "egress-only"),
        pod_selector: LabelSel::everything(),
        ingress: None,
        egress: Some(vec![]),
    });
    g.flush();
    let state = g.snapshot();
    let chains = &state.families[&IpFamily::V4].chains;
    let iface = crate::iface_naming::CalicoResolver::default();
    let name = crate::iface_naming::InterfaceResolver::resolve(
        &iface,
        &local_pod("x", "a", "10.0.0.1", &[]),
    )
    .unwrap();
    let tw = &chains[&format!("cali-tw-{name}")];
    let fw = &chains[&format!("cali-fw-{name}")];
    assert!(
        !tw.rules.iter().any(|r| r.body.contains("cali-pi-")),
        "ingress not isolated"
    );
    assert!(fw
        .rules
        .iter()
        .any(|r| r.body.contains("-j cali-po-knp/x/egress-only")));
    assert!(fw
        .rules
        .iter()
        .any(|r| r.body.contains("Drop if no policies passed packet")));
    assert!(chains.contains_key("cali-po-knp/x/egress-only"));
    assert!(!chains.contains_key("cali-pi-knp/x/egress-only"));
}

#[test]
fn programmed_endpoints_name_the_policies_their_chains_jump_to() {
    let mut g = graph();
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("pod", "a")]));
    g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("pod", "b")]));
    let mut remote = local_pod("y", "r", "10.0.9.9", &[]);
    remote.node = Some("node-2".into());
    g.upsert_pod_info(remote);
    g.upsert_policy_info(allow_from("x", "in-a", &[("pod", "a")], vec![]));
    g.upsert_policy_info(PolicyInfo {
        key: ObjectKey::new("x", "eg-all"),
        pod_selector: LabelSel::everything(),
        ingress: None,
        egress: Some(vec![]),
    });
    // Selects no local pod: inactive, isolates nothing.
    g.upsert_policy_info(allow_from("x", "none", &[("pod", "zz")], vec![]));
    g.flush();
    let views: Vec<_> = g.programmed_endpoints().collect();
    assert_eq!(views.len(), 2, "only local pods with chains");
    let a = views.iter().find(|v| v.key.name == "a").unwrap();
    assert_eq!(a.ingress, vec![ObjectKey::new("x", "in-a")]);
    assert_eq!(a.egress, vec![ObjectKey::new("x", "eg-all")]);
    let b = views.iter().find(|v| v.key.name == "b").unwrap();
    assert!(b.ingress.is_empty());
    assert_eq!(b.egress, vec![ObjectKey::new("x", "eg-all")]);
    // The views agree with the chains: each listed policy is jumped to from the pod's chain.
    let state = g.snapshot();
    let chains = &state.families[&IpFamily::V4].chains;
    for v in &views {
        for (prefix, list, dir, jump) in [
            (
                "cali-tw-",
                &v.ingress,
                crate::rules::Direction::Ingress,
                " -j cali-pi-",
            ),
            (
                "cali-fw-",
                &v.egress,
                crate::rules::Direction::Egress,
                " -j cali-po-",
            ),
        ] {
            let chain = &chains[&format!("{prefix}{}", v.iface)];
            let jumps = chain.rules.iter().filter(|r| r.body.contains(jump)).count();
            assert_eq!(jumps, list.len(), "{}", chain.name);
            for p in list.iter() {
                let target = crate::rules::policy_chain(dir, &p.namespace, &p.name);
                assert!(chain
                    .rules
                    .iter()
                    .any(|r| r.body.ends_with(&format!("-j {target}"))));
            }
        }
    }
    let mut active: Vec<_> = g.active_policies().cloned().collect();
    active.sort();
    assert_eq!(
        active,
        vec![ObjectKey::new("x", "eg-all"), ObjectKey::new("x", "in-a")]
    );
    assert_eq!(
        g.pod(&ObjectKey::new("y", "r")).unwrap().ips[0].to_string(),
        "10.0.9.9"
    );
    assert!(g.pod(&ObjectKey::new("y", "gone")).is_none());
    assert_eq!(
        g.emitted_chains().count(),
        chains.len() + state.families[&IpFamily::V6].chains.len()
    );
}

#[test]
fn inactive_policies_cost_no_chains_or_sets() {
    let mut g = graph();
    let mut remote = local_pod("x", "a", "10.0.0.1", &[("pod", "a")]);
    remote.node = Some("elsewhere".into());
    g.upsert_pod_info(remote);
    g.upsert_policy_info(allow_from("x", "p", &[("pod", "a")], vec![eq("pod", "b")]));
    g.flush();
    let state = g.snapshot();
    let v4 = &state.families[&IpFamily::V4];
    assert!(v4.sets.is_empty());
    assert!(!v4.chains.keys().any(|c| c.starts_with("cali-pi-")));
    assert_eq!(g.active_policy_count(), 0);
}

#[test]
fn unresolvable_interface_is_reported_and_fail_closed() {
    let mut g = Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(crate::iface_naming::SandboxResolver::new("veth-").unwrap()),
    );
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[]));
    g.flush();
    assert_eq!(g.local_endpoint_count(), 0);
    assert_eq!(g.rejections().len(), 1);
    let state = g.snapshot();
    let dispatch = &state.families[&IpFamily::V4].chains["cali-from-wl-dispatch"];
    assert_eq!(dispatch.rules.len(), 1, "only the Unknown interface drop");
}

/// Names every pod's interface after its first label value, so tests can make two pods
/// claim one interface.
#[derive(Debug)]
struct LabelResolver;

impl crate::iface_naming::InterfaceResolver for LabelResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, crate::iface_naming::NamingError> {
        Ok(format!(
            "eth-{}",
            pod.labels.values().next().cloned().unwrap_or_default()
        ))
    }
    fn scheme(&self) -> &'static str {
        "test"
    }
}

#[test]
fn colliding_interfaces_program_one_endpoint_until_the_winner_leaves() {
    let mut g = Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(LabelResolver),
    );
    g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("n", "same")]));
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("n", "same")]));
    g.upsert_policy_info(allow_from(
        "x",
        "only-b",
        &[("n", "same"), ("extra", "b")],
        vec![],
    ));
    g.flush();
    let dispatch = |g: &Calculation| {
        g.snapshot().families[&IpFamily::V4].chains["cali-to-wl-dispatch"]
            .rules
            .len()
    };
    assert_eq!(dispatch(&g), 2, "one interface, one goto");
    assert_eq!(g.local_endpoint_count(), 2);

    // The first pod by key (x/a) owns the chains; when it goes, x/b takes over.
    g.remove_pod(&ObjectKey::new("x", "a"));
    let update = g.flush();
    assert!(
        update
            .chains_upserted
            .iter()
            .any(|(_, c)| c.name == "cali-tw-eth-same")
            || update.chains_upserted.is_empty()
    );
    assert_eq!(dispatch(&g), 2);
    let mut acc = DesiredState::default();
    let mut fresh = Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(LabelResolver),
    );
    fresh.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("n", "same")]));
    fresh.upsert_policy_info(allow_from(
        "x",
        "only-b",
        &[("n", "same"), ("extra", "b")],
        vec![],
    ));
    acc.apply(&fresh.flush());
    assert_eq!(acc, g.snapshot());
}

/// A resolver whose answers change over time, as the container runtime's or the routing
/// table's do.
#[derive(Debug, Default, Clone)]
pub(crate) struct LearningResolver(
    pub(crate) std::sync::Arc<std::sync::Mutex<BTreeMap<String, String>>>,
);

impl crate::iface_naming::InterfaceResolver for LearningResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, crate::iface_naming::NamingError> {
        self.0
            .lock()
            .unwrap()
            .get(&pod.key.to_string())
            .cloned()
            .ok_or(crate::iface_naming::NamingError::NotMapped {
                pod: pod.key.clone(),
            })
    }
    fn scheme(&self) -> &'static str {
        "learning"
    }
}

#[test]
fn refresh_interfaces_follows_what_the_resolver_learned_and_nothing_else() {
    let names = LearningResolver::default();
    let mut g = Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(names.clone()),
    );
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("app", "a")]));
    g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("app", "b")]));
    g.flush();
    assert_eq!(g.local_endpoint_count(), 0, "nothing is known yet");

    names
        .0
        .lock()
        .unwrap()
        .insert("x/a".into(), "veth-aaaa".into());
    g.interfaces_changed();
    let update = g.flush();
    assert_eq!(g.local_endpoint_count(), 1);
    let chains: Vec<&str> = update
        .chains_upserted
        .iter()
        .map(|(_, c)| c.name.as_str())
        .collect();
    assert!(chains.contains(&"cali-tw-veth-aaaa"), "{chains:?}");
    assert!(
        update.members_added.is_empty(),
        "no set changes: {update:?}"
    );

    g.interfaces_changed();
    assert!(
        g.flush().is_empty(),
        "a refresh that learned nothing writes nothing"
    );

    names
        .0
        .lock()
        .unwrap()
        .insert("x/a".into(), "veth-a2".into());
    g.interfaces_changed();
    let update = g.flush();
    let removed: Vec<&str> = update
        .chains_removed
        .iter()
        .map(|(_, n)| n.as_str())
        .collect();
    assert!(removed.contains(&"cali-tw-veth-aaaa"), "{removed:?}");
    assert_eq!(g.local_endpoint_count(), 1);

    names.0.lock().unwrap().clear();
    g.interfaces_changed();
    g.flush();
    assert_eq!(
        g.local_endpoint_count(),
        0,
        "a lost interface is no endpoint"
    );
}

#[test]
fn programming_starts_follow_local_rule_changes_only() {
    use std::time::{Duration, Instant};
    let mut g = graph();
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_millis(5);
    let t2 = t0 + Duration::from_millis(9);

    // Unstamped events report nothing.
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("role", "server")]));
    g.flush();
    assert!(g.take_programming_starts().is_empty());

    // A new local pod: one start, its sighting.
    g.set_event_time(Some(t0));
    g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("role", "server")]));
    g.flush();
    assert_eq!(g.take_programming_starts(), vec![t0]);

    // The same pod again: no rule changes, no start.
    g.set_event_time(Some(t1));
    g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("role", "server")]));
    g.flush();
    assert!(g.take_programming_starts().is_empty());

    // A remote pod: sets only, no start.
    let mut remote = local_pod("x", "r", "10.0.0.9", &[("app", "c")]);
    remote.node = Some("node-2".into());
    g.upsert_pod_info(remote);
    g.flush();
    assert!(g.take_programming_starts().is_empty());

    // A policy selecting both local pods: one start each, from the policy's event.
    g.set_event_time(Some(t1));
    g.upsert_policy_info(allow_from(
        "x",
        "p",
        &[("role", "server")],
        vec![eq("app", "c")],
    ));
    g.set_event_time(Some(t2));
    g.flush();
    assert_eq!(g.take_programming_starts(), vec![t1, t1]);

    // Editing it (only the policy chain changes) still touches both.
    g.upsert_policy_info(allow_from(
        "x",
        "p",
        &[("role", "server")],
        vec![eq("app", "d")],
    ));
    g.flush();
    assert_eq!(g.take_programming_starts(), vec![t2, t2]);
}

#[test]
fn bridge_mode_dispatches_routed_traffic_by_the_resolved_pods_addresses() {
    let names = LearningResolver::default();
    let rules = RuleConfig {
        interface_prefixes: vec!["veth".into()],
        bridge: Some("cni0".into()),
        ..RuleConfig::default()
    };
    let mut g = Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules,
        },
        Box::new(names.clone()),
    );
    let addr_dispatch = |g: &Calculation| -> Vec<String> {
        g.snapshot().families[&IpFamily::V4].chains["cali-to-wl-addr-dispatch"]
            .rules
            .iter()
            .map(|r| {
                r.body
                    .split("-m comment --comment \"cali:")
                    .next()
                    .unwrap()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    g.upsert_pod_info(local_pod("x", "a", "10.244.0.2", &[("app", "a")]));
    g.upsert_pod_info(local_pod("x", "b", "10.244.0.3", &[("app", "b")]));
    g.flush();
    assert_eq!(
        addr_dispatch(&g),
        [""],
        "only the drop while no port is known"
    );

    names
        .0
        .lock()
        .unwrap()
        .insert("x/b".into(), "veth0000000b".into());
    g.interfaces_changed();
    g.flush();
    assert_eq!(addr_dispatch(&g), ["-d 10.244.0.3/32", ""]);

    // A changed address of a resolved pod moves its entry.
    g.upsert_pod_info(local_pod("x", "b", "10.244.0.9", &[("app", "b")]));
    let update = g.flush();
    assert!(update
        .chains_upserted
        .iter()
        .any(|(_, c)| c.name == "cali-to-wl-addr-dispatch"));
    assert_eq!(addr_dispatch(&g), ["-d 10.244.0.9/32", ""]);

    g.remove_pod(&ObjectKey::new("x", "b"));
    g.flush();
    assert_eq!(addr_dispatch(&g), [""]);
}

pub(crate) fn cluster(
    name: &str,
    tier: Tier,
    priority: u16,
    ingress: bool,
    egress: bool,
    subject_ns: &[(&str, &str)],
) -> ClusterPolicyInfo {
    let rule = || ClusterRule {
        name: None,
        action: RuleAction::Deny,
        peers: vec![ClusterPeer::Pods(PodSelection {
            namespaces: LabelSel::everything(),
            pods: LabelSel::from_exprs(vec![eq("pod", "evil")]),
        })],
        ports: None,
    };
    ClusterPolicyInfo {
        name: name.into(),
        tier,
        priority,
        subject: PodSelection {
            namespaces: LabelSel::from_exprs(subject_ns.iter().map(|(k, v)| eq(k, v)).collect()),
            pods: LabelSel::everything(),
        },
        ingress: if ingress { vec![rule()] } else { vec![] },
        egress: if egress { vec![rule()] } else { vec![] },
    }
}

/// The rule bodies of a chain without their hash comments.
pub(crate) fn bodies(g: &Calculation, chain: &str) -> Vec<String> {
    g.snapshot().families[&IpFamily::V4].chains[chain]
        .rules
        .iter()
        .map(|r| {
            r.body
                .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "")
        })
        .collect()
}

#[test]
fn workload_chains_list_the_tiers_in_order_and_only_networkpolicies_isolate() {
    let mut g = graph();
    g.upsert_namespace_info(NamespaceInfo {
        name: "x".into(),
        labels: labels(&[(NAMESPACE_NAME_LABEL, "x"), ("team", "red")]),
    });
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("pod", "a")]));
    g.upsert_policy_info(allow_from("x", "np", &[("pod", "a")], vec![eq("pod", "b")]));
    let red = [("team", "red")];
    g.upsert_cluster_policy_info(cluster("b-admin", Tier::Admin, 5, true, false, &red));
    g.upsert_cluster_policy_info(cluster("a-admin", Tier::Admin, 5, true, false, &red));
    g.upsert_cluster_policy_info(cluster("first", Tier::Admin, 1, false, true, &red));
    g.upsert_cluster_policy_info(cluster("base", Tier::Baseline, 0, true, true, &red));
    g.upsert_cluster_policy_info(cluster(
        "elsewhere",
        Tier::Admin,
        0,
        true,
        true,
        &[("team", "blue")],
    ));
    g.flush();
    let iface = CalicoResolver::default()
        .resolve(&local_pod("x", "a", "10.0.0.1", &[]))
        .unwrap();
    let tw = bodies(&g, &format!("cali-tw-{iface}"));
    let jump = |chain: &str| format!("-m mark --mark 0x0/0x20000 -j {chain}");
    let ret = "-m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN";
    assert_eq!(
        tw[1..tw.len() - 3],
        [
            "-m comment --comment \"Start of tier kube-admin\" -j MARK --set-xmark 0x0/0x20000".to_string(),
            jump("cali-pi-kcnp/a-admin"),
            ret.into(),
            jump("cali-pi-kcnp/b-admin"),
            ret.into(),
            "-m comment --comment \"Start of policies\" -j MARK --set-xmark 0x0/0x20000".into(),
            jump("cali-pi-knp/x/np"),
            ret.into(),
            "-m comment --comment \"Drop if no policies passed packet\" -m mark --mark 0x0/0x20000 -j DROP".into(),
            "-m comment --comment \"Start of tier kube-baseline\" -j MARK --set-xmark 0x0/0x20000".into(),
            jump("cali-pi-kcnp/base"),
            ret.into(),
        ]
    );
    let fw = bodies(&g, &format!("cali-fw-{iface}"));
    assert_eq!(
        fw[2..fw.len() - 3],
        [
            "-m comment --comment \"Start of tier kube-admin\" -j MARK --set-xmark 0x0/0x20000"
                .to_string(),
            jump("cali-po-kcnp/first"),
            ret.into(),
            "-m comment --comment \"Start of tier kube-baseline\" -j MARK --set-xmark 0x0/0x20000"
                .into(),
            jump("cali-po-kcnp/base"),
            ret.into(),
        ],
        "no NetworkPolicy tier and no drop: a ClusterNetworkPolicy never isolates"
    );
    let chains = g.snapshot().families[&IpFamily::V4].chains.clone();
    assert!(
        !chains.contains_key("cali-pi-kcnp/elsewhere"),
        "inactive: no chains"
    );
    assert!(
        !chains.contains_key("cali-po-kcnp/a-admin"),
        "no egress rules: no chain"
    );
    assert_eq!(g.active_cluster_policy_count(), 4);

    // The namespace relabelled out of the subjects: the tiers and their chains go, the
    // NetworkPolicy tier stays as it was.
    g.upsert_namespace_info(NamespaceInfo {
        name: "x".into(),
        labels: labels(&[(NAMESPACE_NAME_LABEL, "x"), ("team", "blue")]),
    });
    let update = g.flush();
    assert!(update
        .chains_removed
        .iter()
        .any(|(_, c)| c == "cali-pi-kcnp/base"));
    let tw = bodies(&g, &format!("cali-tw-{iface}"));
    assert!(tw.iter().any(|r| r.ends_with("-j cali-pi-kcnp/elsewhere")));
    assert!(!tw
        .iter()
        .any(|r| r.contains("kcnp/a-admin") || r.contains("baseline")));
    assert_eq!(g.active_cluster_policy_count(), 1);
}

#[test]
fn without_cluster_policies_the_workload_chains_keep_the_pre_tier_layout() {
    let mut g = graph();
    g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("pod", "a")]));
    g.upsert_policy_info(allow_from("x", "np", &[("pod", "a")], vec![eq("pod", "b")]));
    g.flush();
    let iface = CalicoResolver::default()
        .resolve(&local_pod("x", "a", "10.0.0.1", &[]))
        .unwrap();
    assert_eq!(
        bodies(&g, &format!("cali-tw-{iface}")),
        [
            "-j cali-wl-start",
            "-m comment --comment \"Start of policies\" -j MARK --set-xmark 0x0/0x20000",
            "-m mark --mark 0x0/0x20000 -j cali-pi-knp/x/np",
            "-m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            "-m comment --comment \"Drop if no policies passed packet\" -m mark --mark 0x0/0x20000 -j DROP",
            "-j cali-pri-kns.x",
            "-m comment --comment \"Return if profile accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            "-m comment --comment \"Drop if no profiles matched\" -j DROP",
        ]
    );
}

/// `rules::union`: past the threshold a workload's NetworkPolicy section matches one union
/// set first; its members follow the peers' pods, workloads of the same policies share it,
/// and it goes when the threshold is no longer met.
#[test]
fn union_sets_follow_peers_and_thresholds() {
    let mut g = graph_with_union_min(3);
    for (name, ip) in [("s1", "10.0.0.1"), ("s2", "10.0.0.2")] {
        g.upsert_pod_info(local_pod("x", name, ip, &[("role", "server")]));
    }
    let web80 = |i: usize| {
        let mut p = allow_from(
            "x",
            &format!("p{i}"),
            &[("role", "server")],
            vec![eq("app", &format!("app{i}"))],
        );
        if let Some(rules) = p.ingress.as_mut() {
            rules[0].ports = vec![PortSpec {
                protocol: Protocol::Tcp,
                port: PortMatch::Range {
                    first: 80 + i as u16,
                    last: 80 + i as u16,
                },
            }];
        }
        p
    };
    let unions = |g: &Calculation| -> BTreeMap<String, BTreeSet<String>> {
        g.snapshot().families[&IpFamily::V4]
            .sets
            .iter()
            .filter(|(n, _)| n.starts_with("cali40u:"))
            .map(|(n, s)| (n.clone(), s.members.iter().map(|m| m.to_string()).collect()))
            .collect()
    };
    let union_rules = |g: &Calculation| -> usize {
        g.snapshot().families[&IpFamily::V4]
            .chains
            .values()
            .flat_map(|c| &c.rules)
            .filter(|r| r.body.contains("--match-set cali40u:"))
            .count()
    };
    g.upsert_policy_info(web80(0));
    g.upsert_policy_info(web80(1));
    let mut client = local_pod("x", "c0", "10.0.1.5", &[("app", "app0")]);
    client.node = Some("node-2".into());
    g.upsert_pod_info(client.clone());
    g.flush();
    assert!(unions(&g).is_empty(), "two policies, threshold three");
    assert_eq!(union_rules(&g), 0);

    g.upsert_policy_info(web80(2));
    g.flush();
    let u = unions(&g);
    assert_eq!(u.len(), 1, "both servers share one set: {u:?}");
    let (name, members) = u.into_iter().next().unwrap();
    assert_eq!(members, BTreeSet::from(["10.0.1.5,tcp:80".to_string()]));
    assert_eq!(union_rules(&g), 2, "one match per server's ingress chain");

    // A peer pod arriving, relabelled and leaving moves only members.
    let mut other = local_pod("x", "c2", "10.0.1.6", &[("app", "app2")]);
    other.node = Some("node-2".into());
    g.upsert_pod_info(other.clone());
    let update = g.flush();
    assert!(update.chains_upserted.is_empty());
    assert_eq!(
        update.members_added[&name]
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>(),
        vec!["10.0.1.6,tcp:82".to_string()]
    );
    other.labels = labels(&[("app", "app1")]);
    g.upsert_pod_info(other.clone());
    g.flush();
    assert_eq!(
        unions(&g)[&name],
        BTreeSet::from(["10.0.1.5,tcp:80".to_string(), "10.0.1.6,tcp:81".to_string()])
    );
    g.remove_pod(&other.key);
    g.remove_pod(&client.key);
    g.flush();
    assert!(unions(&g)[&name].is_empty());

    // A policy changing its port makes another set; below the threshold there is none.
    let mut changed = web80(2);
    if let Some(rules) = changed.ingress.as_mut() {
        rules[0].ports[0].port = PortMatch::Range {
            first: 90,
            last: 90,
        };
    }
    g.upsert_policy_info(changed);
    g.flush();
    let u = unions(&g);
    assert_eq!(u.len(), 1);
    assert!(!u.contains_key(&name), "a new list of parts, a new set");
    g.remove_policy(&ObjectKey::new("x", "p2"));
    let update = g.flush();
    assert!(unions(&g).is_empty());
    assert_eq!(union_rules(&g), 0);
    let removed: Vec<&String> = update
        .sets_removed
        .iter()
        .map(|(_, n)| n)
        .filter(|n| n[5..].starts_with("0u:"))
        .collect();
    assert_eq!(
        removed.len(),
        2,
        "the union set, both families: {removed:?}"
    );
}
