//! The evaluator against hand-checked cases of every feature, and against the kernel
//! interpreter over `compile` output for random clusters (each proves the other).

use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use super::kernel::{self, KernelSets, KernelVerdict, NodeView, Ruleset, StepResult};
use super::*;
use crate::agent::Calculation;
use crate::calc_graph::tests::{
    cluster_policy, label_map, pod, policy, NAMESPACES, NODE, NS_LABELS,
};
use crate::calc_graph::update::RestoreScripts;
use crate::calc_graph::GraphConfig;
use crate::datastore::manifests::parse_manifests;
use crate::iface_naming::{CalicoResolver, InterfaceResolver};
use crate::rules::sets;

const FIXTURE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: b}}
---
apiVersion: v1
kind: Namespace
metadata: {name: z}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.1, hostIP: 192.168.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b1, namespace: x, labels: {app: b}}
spec:
  nodeName: n1
  containers:
  - name: c
    ports:
    - {name: http, containerPort: 80}
    - {name: dns, containerPort: 53, protocol: UDP}
status: {phase: Running, podIP: 10.0.1.2}
---
apiVersion: v1
kind: Pod
metadata: {name: b2, namespace: x, labels: {app: b}}
spec:
  nodeName: n2
  containers:
  - name: c
    ports: [{name: http, containerPort: 8080}]
status: {phase: Running, podIP: 10.0.1.3}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: y, labels: {app: c}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.2.1}
---
apiVersion: v1
kind: Pod
metadata: {name: e, namespace: y, labels: {app: e}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.2.2}
---
apiVersion: v1
kind: Pod
metadata: {name: d, namespace: z, labels: {app: d}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.3.1}
---
apiVersion: v1
kind: Pod
metadata: {name: d2, namespace: z, labels: {app: d}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.3.2}
---
apiVersion: v1
kind: Pod
metadata: {name: agent, namespace: x}
spec: {nodeName: n1, hostNetwork: true, containers: [{name: c}]}
status: {phase: Running, podIP: 192.168.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: done, namespace: x, labels: {app: b}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Succeeded, podIP: 10.0.1.9}
---
# No policyTypes: Ingress only. Named port per pod, a range with endPort, a UDP-only
# ipBlock with an except.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-ingress, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: http}]
  - from: [{namespaceSelector: {matchLabels: {team: b}}}]
    ports: [{port: 9000, endPort: 9010}]
  - from: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.3.0/24]}}]
    ports: [{protocol: UDP, port: 53}]
---
# Egress only: an SCTP-only rule to app=c in any namespace (empty namespaceSelector), a rule
# without ports to an outside block, a named port resolved on each destination.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-egress, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: c}}}]
    ports: [{protocol: SCTP, port: 7777}]
  - to: [{ipBlock: {cidr: 8.8.8.0/24}}]
  - to: [{podSelector: {matchLabels: {app: b}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-c, namespace: y}
spec:
  podSelector: {matchLabels: {app: c}}
  policyTypes: [Ingress, Egress]
---
# No policyTypes but egress rules: Ingress and Egress; ingress has no rules (isolates).
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: own-namespace, namespace: z}
spec:
  podSelector: {}
  egress:
  - to: [{podSelector: {}}]
"#;

fn fixture() -> State {
    fixture_with(RuleConfig::default())
}

fn fixture_with(cfg: RuleConfig) -> State {
    let (objects, errors) = parse_manifests(FIXTURE, "fixture");
    assert!(errors.is_empty(), "{errors:?}");
    let (mut state, errors) = State::from_objects(cfg, &objects);
    assert!(errors.is_empty(), "{errors:?}");
    let resolver = CalicoResolver::default();
    let pods: Vec<PodInfo> = state.pods().to_vec();
    for p in pods {
        state.set_interface(&p.key, resolver.resolve(&p).unwrap());
    }
    state
}

fn flow(from: &str, to: &str, protocol: Protocol, port: u16) -> Flow {
    Flow {
        src: Endpoint::parse(from).unwrap(),
        dst: Endpoint::parse(to).unwrap(),
        protocol,
        port,
    }
}

fn explain(state: &State, from: &str, to: &str, protocol: Protocol, port: u16) -> Verdict {
    let r = state
        .resolve(&flow(from, to, protocol, port))
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    let v = state.explain(&r);
    assert_eq!(
        state.allowed(&r),
        v.action == Action::Allow,
        "allowed() and explain() disagree for {from} -> {to}"
    );
    v
}

fn np(d: &DirectionVerdict) -> &NetworkPolicyReport {
    d.tiers
        .iter()
        .find_map(|t| match &t.detail {
            TierDetail::NetworkPolicy(np) => Some(np),
            _ => None,
        })
        .expect("a NetworkPolicy tier")
}

fn allowed_by(d: &DirectionVerdict) -> &AllowMatch {
    match &np(d).outcome {
        NpOutcome::Allowed(m) => m,
        other => panic!("{:?} not allowed by a rule: {other:?}", d.direction),
    }
}

fn misses(d: &DirectionVerdict) -> &[Miss] {
    match &np(d).outcome {
        NpOutcome::Denied { misses, .. } => misses,
        other => panic!("{:?} not denied: {other:?}", d.direction),
    }
}

use crate::model::Protocol::{Sctp, Tcp, Udp};

/// Past the union threshold a flow the union set holds is accepted there (one step, the
/// union rule of the workload chain), the policy and rule named are still the first that
/// allows; a flow it cannot hold (a named port) still walks to its policy's rule.
#[test]
fn union_set_decides_what_it_holds_and_the_walk_the_rest() {
    let s = fixture_with(RuleConfig {
        policy_union_min: 1,
        ..RuleConfig::default()
    });
    let v = explain(&s, "x/a", "y/c", Sctp, 7777);
    let e = allowed_by(&v.egress);
    assert_eq!((e.policy.to_string().as_str(), e.rule), ("x/a-egress", 0));
    assert_eq!(e.steps.len(), 1, "{}", v.to_text());
    assert!(e.steps[0].chain.as_deref().unwrap().starts_with("cali-fw-"));
    assert!(e.steps[0].what.contains("union set"), "{}", e.steps[0].what);
    assert_eq!(e.steps[0].hash.as_ref().map(String::len), Some(16));
    // The named port http is no entry of the set: the walk to the policy's rule decides.
    let v = explain(&s, "x/a", "x/b1", Tcp, 80);
    let e = allowed_by(&v.egress);
    assert_eq!(e.steps.len(), 2, "{}", v.to_text());
    assert!(e.steps[1].chain.as_deref().unwrap().starts_with("cali-po-"));
}

#[test]
fn named_ports_resolve_on_each_destination_pod() {
    let s = fixture();
    // b1 calls port 80 "http", b2 calls 8080 "http": the same rules allow different ports.
    let v = explain(&s, "x/a", "x/b1", Tcp, 80);
    assert_eq!(v.action, Action::Allow, "{}", v.to_text());
    let e = allowed_by(&v.egress);
    assert_eq!(
        (e.policy.to_string().as_str(), e.rule, e.peer, e.port),
        ("x/a-egress", 2, Some(0), Some(0))
    );
    let i = allowed_by(&v.ingress);
    assert_eq!(
        (i.policy.to_string().as_str(), i.rule, i.peer, i.port),
        ("x/b-ingress", 0, Some(0), Some(0))
    );
    // The step that implements it is the policy chain's allow rule, with its hash.
    let allow = &i.steps[1];
    assert!(allow.chain.as_deref().unwrap().starts_with("cali-pi-"));
    assert_eq!(allow.hash.as_ref().map(String::len), Some(16));
    assert_eq!(explain(&s, "x/a", "x/b2", Tcp, 8080).action, Action::Allow);
    for (to, port) in [("x/b1", 8080), ("x/b2", 80)] {
        let v = explain(&s, "x/a", to, Tcp, port);
        assert_eq!(v.action, Action::Deny, "{to}:{port}");
        let m = misses(&v.egress);
        assert!(
            m.iter()
                .any(|m| m.rule == 2 && matches!(m.kind, MissKind::PortNotMatched { .. })),
            "{}",
            v.to_text()
        );
    }
}

#[test]
fn sctp_only_rules_never_match_tcp() {
    let s = fixture();
    let v = explain(&s, "x/a", "y/c", Sctp, 7777);
    // Egress allows the SCTP port; y/c's ingress is isolated by a policy without rules.
    assert_eq!(allowed_by(&v.egress).rule, 0);
    assert_eq!(v.ingress.action, Action::Deny);
    assert!(misses(&v.ingress).is_empty());
    let v = explain(&s, "x/a", "y/c", Tcp, 7777);
    assert_eq!(v.egress.action, Action::Deny);
    let m = misses(&v.egress);
    assert!(
        matches!(&m[0].kind, MissKind::PortNotMatched { ports, .. } if ports.contains("SCTP 7777"))
    );
    // The deny is the workload chain's "Drop if no policies passed packet".
    match &np(&v.egress).outcome {
        NpOutcome::Denied { steps, .. } => {
            assert!(steps[0]
                .chain
                .as_deref()
                .unwrap()
                .starts_with("cali-fw-cali"));
            assert!(steps[0].hash.is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rule_without_ports_allows_every_protocol() {
    let s = fixture();
    for (proto, port) in [(Udp, 53), (Tcp, 443), (Sctp, 9)] {
        let v = explain(&s, "x/a", "8.8.8.8", proto, port);
        assert_eq!(v.action, Action::Allow);
        let m = allowed_by(&v.egress);
        assert_eq!((m.rule, m.peer, m.port), (1, Some(0), None));
        assert_eq!(v.ingress.unpoliced, Some(Unpoliced::NotAPod));
    }
    assert_eq!(explain(&s, "x/a", "8.8.9.8", Tcp, 443).action, Action::Deny);
}

#[test]
fn end_port_ranges_and_namespace_selectors() {
    let s = fixture();
    for port in [9000, 9005, 9010] {
        let v = explain(&s, "y/e", "x/b1", Tcp, port);
        assert_eq!(v.action, Action::Allow, "{port}");
        assert_eq!(allowed_by(&v.ingress).rule, 1);
        assert_eq!(v.egress.tiers[0].decision, None, "y/e is not isolated");
    }
    let v = explain(&s, "y/e", "x/b1", Tcp, 9011);
    assert_eq!(v.action, Action::Deny);
    assert!(misses(&v.ingress)
        .iter()
        .any(|m| m.rule == 1 && matches!(m.kind, MissKind::PortNotMatched { .. })));
    // The same port from a namespace without team=b: port matched, peer not.
    let v = explain(&s, "z/d", "x/b1", Tcp, 9005);
    assert!(misses(&v.ingress)
        .iter()
        .any(|m| m.rule == 1 && matches!(m.kind, MissKind::PeerNotMatched { .. })));
}

#[test]
fn ip_blocks_and_their_excepts_apply_to_addresses() {
    let s = fixture();
    let v = explain(&s, "10.0.4.7", "x/b1", Udp, 53);
    assert_eq!(v.action, Action::Allow);
    assert_eq!(allowed_by(&v.ingress).rule, 2);
    assert_eq!(v.egress.unpoliced, Some(Unpoliced::NotAPod));
    // 10.0.3.0/24 is excepted: the closest miss says so and names the rule clearing it.
    let v = explain(&s, "10.0.3.7", "x/b1", Udp, 53);
    assert_eq!(v.action, Action::Deny);
    let m = misses(&v.ingress);
    let ex = m
        .iter()
        .find(|m| matches!(m.kind, MissKind::Excepted { .. }))
        .expect("an except miss");
    match &ex.kind {
        MissKind::Excepted {
            except,
            port_matched,
            ..
        } => {
            assert_eq!(except.to_string(), "10.0.3.0/24");
            assert!(port_matched);
        }
        _ => unreachable!(),
    }
    assert_eq!(ex.rules.len(), 1);
    // A pod's address counts as an address too (z/d is 10.0.3.1, excepted).
    let v = explain(&s, "z/d", "x/b1", Udp, 53);
    assert!(misses(&v.ingress)
        .iter()
        .any(|m| matches!(m.kind, MissKind::Excepted { .. })));
    // UDP-only: TCP from the block matches the peer, not the port.
    let v = explain(&s, "10.0.4.7", "x/b1", Tcp, 53);
    assert!(misses(&v.ingress)
        .iter()
        .any(|m| m.rule == 2 && matches!(m.kind, MissKind::PortNotMatched { .. })));
}

#[test]
fn policy_types_are_inferred() {
    let s = fixture();
    // own-namespace has egress rules and no policyTypes: it governs ingress (no rules) too.
    let v = explain(&s, "z/d", "z/d2", Tcp, 1234);
    assert_eq!(allowed_by(&v.egress).policy.to_string(), "z/own-namespace");
    assert_eq!(v.ingress.action, Action::Deny);
    assert_eq!(np(&v.ingress).policies[0].0.to_string(), "z/own-namespace");
    // b-ingress has no policyTypes and no egress: b1 is not isolated for egress.
    let v = explain(&s, "x/b1", "z/d", Tcp, 80);
    assert!(matches!(
        np(&v.egress).outcome,
        NpOutcome::NotIsolated { .. }
    ));
    // x/a-egress governs egress only: x/a's ingress is open.
    let v = explain(&s, "y/e", "x/a", Tcp, 80);
    assert_eq!(v.action, Action::Allow);
}

#[test]
fn non_endpoints_and_bad_input() {
    let s = fixture();
    // A host-network pod is its node's address; its node's traffic to a local pod is not
    // policed.
    let v = explain(&s, "x/agent", "x/b1", Tcp, 5555);
    assert_eq!(v.action, Action::Allow);
    assert_eq!(v.ingress.unpoliced, Some(Unpoliced::FromOwnNode));
    // From another node it is an ordinary outside address for b2 (on n2).
    let v = explain(&s, "x/agent", "x/b2", Tcp, 5555);
    assert_eq!(v.action, Action::Deny);
    // The pod to its own node passes its egress policy first.
    let v = explain(&s, "x/a", "192.168.0.1", Tcp, 10250);
    assert_eq!(v.action, Action::Deny);
    let err = |from: &str, to: &str| s.resolve(&flow(from, to, Tcp, 80)).unwrap_err().to_string();
    assert!(err("x/done", "x/a").contains("has finished"));
    assert!(err("x/nope", "x/a").contains("no such pod"));
    assert!(err("x/a", "fd00::1").contains("no IP family in common"));
    assert!(Endpoint::parse("not a pod").is_err());
    // A finished pod's address belongs to no endpoint any more.
    let v = explain(&s, "10.0.1.9", "x/b1", Tcp, 80);
    assert!(misses(&v.ingress)
        .iter()
        .any(|m| m.rule == 0 && matches!(m.kind, MissKind::PeerNotMatched { .. })));
    let text = v.to_text();
    assert!(text.starts_with("verdict: DENY"), "{text}");
    assert!(text.contains("port matched"), "{text}");
    let json = v.to_json();
    assert_eq!(json["verdict"], "deny");
    assert_eq!(json["ingress"]["verdict"], "deny");
    assert_eq!(json["egress"]["policed"], false);
}

// ---------------------------------------------------------------- evaluator vs kernel

const NODES: [&str; 2] = [NODE, "node-2"];

struct Compiled {
    /// (node, family) → tables.
    tables: BTreeMap<(usize, IpFamily), (Ruleset, KernelSets)>,
    provenance: BTreeMap<(usize, IpFamily), crate::rules::provenance::Provenance>,
}

fn compile(
    cfg: &RuleConfig,
    namespaces: &[NamespaceInfo],
    pods: &[PodInfo],
    policies: &[PolicyInfo],
    cluster_policies: &[ClusterPolicyInfo],
) -> Compiled {
    let mut tables = BTreeMap::new();
    let mut provenance = BTreeMap::new();
    for (n, node) in NODES.iter().enumerate() {
        let mut calc = Calculation::new(
            GraphConfig {
                node_name: node.to_string(),
                families: vec![IpFamily::V4, IpFamily::V6],
                rules: cfg.clone(),
            },
            Box::new(CalicoResolver::default()),
        );
        namespaces
            .iter()
            .for_each(|x| calc.upsert_namespace_info(x.clone()));
        pods.iter().for_each(|x| calc.upsert_pod_info(x.clone()));
        policies
            .iter()
            .for_each(|x| calc.upsert_policy_info(x.clone()));
        cluster_policies
            .iter()
            .for_each(|x| calc.upsert_cluster_policy_info(x.clone()));
        calc.flush();
        let state = calc.snapshot();
        for family in [IpFamily::V4, IpFamily::V6] {
            let fam = &state.families[&family];
            let RestoreScripts {
                ipsets: sets,
                iptables: text,
            } = fam.restore_scripts(cfg, family, sets::DEFAULT_MAX_SET_SIZE);
            let prov = calc.provenance(family);
            // Provenance describes exactly the chains the graph renders.
            assert_eq!(prov.chains.len(), fam.chains.len());
            for (name, chain) in &fam.chains {
                let traced = &prov.chains[name];
                assert_eq!(&traced.chain, &**chain);
                assert_eq!(traced.rules.len(), chain.rules.len());
            }
            tables.insert(
                (n, family),
                (Ruleset::parse(&text), KernelSets::parse(&sets)),
            );
            provenance.insert((n, family), prov);
        }
    }
    Compiled { tables, provenance }
}

fn node_of(pod: &PodInfo) -> usize {
    NODES
        .iter()
        .position(|n| pod.node.as_deref() == Some(n))
        .expect("generated pods are on one of the nodes")
}

/// The hashes of the rules that matched in a trace.
fn matched_hashes(t: &kernel::Trace) -> Vec<&str> {
    t.steps
        .iter()
        .filter(|s| matches!(s.result, StepResult::Matched(_)))
        .filter_map(|s| s.hash.as_deref())
        .collect()
}

/// The hash of the rule that decided a direction in the evaluator's report.
fn deciding_hash(d: &DirectionVerdict) -> Option<String> {
    let np = match &d.tiers.last()?.detail {
        TierDetail::NetworkPolicy(np) => np,
        TierDetail::Cluster(c) => {
            return match &c.matched {
                Some(m) => m.steps.first()?.hash.clone(),
                // The last tier passed the flow on: the namespace profile's allow decided.
                None => d.after.last()?.hash.clone(),
            };
        }
    };
    match &np.outcome {
        // The policy's allow rule, or the union set's when the kernel accepts there.
        NpOutcome::Allowed(m) => m.steps.last()?.hash.clone(),
        NpOutcome::Denied { steps, .. } => steps[0].hash.clone(),
        NpOutcome::NotIsolated { steps } => steps.last()?.hash.clone(),
    }
}

fn check_cluster(
    namespaces: Vec<NamespaceInfo>,
    pods: Vec<PodInfo>,
    policies: Vec<PolicyInfo>,
    cluster_policies: Vec<ClusterPolicyInfo>,
    bridge: bool,
    union: bool,
) -> Result<(), TestCaseError> {
    let cfg = RuleConfig {
        bridge: bridge.then(|| "cni0".to_string()),
        // Every isolated pod gets its union set (`rules::union`), or none does.
        policy_union_min: if union { 1 } else { 0 },
        ..RuleConfig::default()
    };
    let compiled = compile(&cfg, &namespaces, &pods, &policies, &cluster_policies);
    let mut state = State::new(cfg.clone(), namespaces, pods.clone(), policies);
    state.set_cluster_policies(cluster_policies);
    let resolver = CalicoResolver::default();
    for p in &pods {
        state.set_interface(&p.key, resolver.resolve(p).unwrap());
    }
    let view = NodeView {
        pod_prefixes: cfg.interface_prefixes.clone(),
        bridge: cfg.bridge.clone(),
    };
    let outside: [IpAddr; 4] = [
        "10.0.1.200".parse().unwrap(),
        "192.168.3.3".parse().unwrap(),
        "fd00::1:c8".parse().unwrap(),
        "2001:db8::3".parse().unwrap(),
    ];
    let ports = [
        (Protocol::Tcp, 80),
        (Protocol::Tcp, 8080),
        (Protocol::Udp, 53),
        (Protocol::Sctp, 81),
        (Protocol::Tcp, 9),
    ];
    // Flows by address, both families: pod to pod, outside to pod, pod to outside.
    let mut flows: Vec<(IpAddr, IpAddr)> = Vec::new();
    for a in &pods {
        for b in &pods {
            if a.key != b.key {
                for (x, y) in a.ips.iter().zip(&b.ips) {
                    flows.push((*x, *y));
                }
            }
        }
        for o in outside {
            for ip in a
                .ips
                .iter()
                .filter(|ip| IpFamily::of(ip) == IpFamily::of(&o))
            {
                flows.push((o, *ip));
                flows.push((*ip, o));
            }
        }
    }
    for (src, dst) in flows {
        for (protocol, port) in ports {
            let f = Flow {
                src: Endpoint::Ip(src),
                dst: Endpoint::Ip(dst),
                protocol,
                port,
            };
            let r = state.resolve(&f).map_err(|e| TestCaseError::fail(e.0))?;
            let v = state.explain(&r);
            let allowed = state.allowed(&r);
            prop_assert_eq!(allowed, v.action == Action::Allow);
            let family = r.family;
            let src_pod = match r.src {
                Side::Pod(i) => Some(state.pod_at(i).clone()),
                _ => None,
            };
            let dst_pod = match r.dst {
                Side::Pod(i) => Some(state.pod_at(i).clone()),
                _ => None,
            };
            // One pass per node holding a side (State::node_passes: the interfaces, bridge
            // ports and hook the kernel shows); the flow passes when every one accepts.
            let mut traces: Vec<(usize, kernel::Trace)> = Vec::new();
            for (n, node) in NODES.iter().enumerate() {
                let passes = state
                    .node_passes(&r, node)
                    .map_err(|e| TestCaseError::fail(e.0))?;
                let (rs, sets) = &compiled.tables[&(n, family)];
                for pass in passes {
                    traces.push((n, kernel::trace(rs, sets, &view, pass.hook, &pass.packet)));
                }
            }
            let sides = src_pod
                .iter()
                .chain(&dst_pod)
                .map(node_of)
                .collect::<std::collections::BTreeSet<_>>();
            prop_assert_eq!(traces.len(), sides.len());
            let mut kernel_allows = true;
            for (_, t) in &traces {
                match t.verdict.allowed() {
                    Some(a) => kernel_allows &= a,
                    None => {
                        return Err(TestCaseError::fail(format!(
                            "cannot evaluate compile output: {:?}",
                            t.verdict
                        )))
                    }
                }
            }
            prop_assert_eq!(
                kernel_allows,
                allowed,
                "{} -> {} {:?} {}: evaluator says {}, kernel {:?}\n{}\n{}",
                src,
                dst,
                protocol,
                port,
                v.action.as_str(),
                traces
                    .iter()
                    .map(|(_, t)| t.verdict.as_str())
                    .collect::<Vec<_>>(),
                v.to_text(),
                traces
                    .iter()
                    .map(|(n, t)| {
                        let p = &compiled.provenance[&(*n, family)];
                        t.to_text(&|c, h| p.describe(c, h))
                    })
                    .collect::<String>()
            );
            // The rule the report names as deciding is one the kernel really met.
            for (d, pod) in [(&v.egress, &src_pod), (&v.ingress, &dst_pod)] {
                let (Some(pod), None) = (pod, &d.unpoliced) else {
                    continue;
                };
                let Some(hash) = deciding_hash(d) else {
                    continue;
                };
                let Some((_, t)) = traces.iter().find(|(n, _)| *n == node_of(pod)) else {
                    continue;
                };
                // An egress deny on the same node ends the trace before the ingress side.
                let ended_before = d.direction == Direction::Ingress
                    && v.egress.action == Action::Deny
                    && src_pod.as_ref().is_some_and(|a| node_of(a) == node_of(pod));
                if !ended_before {
                    prop_assert!(
                        matched_hashes(t).contains(&hash.as_str()),
                        "{:?} of {}: deciding rule {} not met by the kernel\n{}",
                        d.direction,
                        pod.key,
                        hash,
                        v.to_text()
                    );
                }
            }
            prop_assert!(traces
                .iter()
                .all(|(_, t)| !matches!(t.verdict, KernelVerdict::CannotEvaluate(_))));
        }
    }
    Ok(())
}

fn namespaces() -> impl Strategy<Value = Vec<NamespaceInfo>> {
    proptest::collection::vec((0..3usize, label_map(NS_LABELS)), 0..3).prop_map(|v| {
        v.into_iter()
            .map(|(i, mut labels)| {
                labels.insert(NAMESPACE_NAME_LABEL.into(), NAMESPACES[i].into());
                NamespaceInfo {
                    name: NAMESPACES[i].into(),
                    labels,
                }
            })
            .collect()
    })
}

use crate::model::{ClusterPolicyInfo, RuleAction, Tier, NAMESPACE_NAME_LABEL};

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// For random small clusters the evaluator's verdict equals the kernel interpreter's over
    /// `compile` output, on both nodes, in both families, routed and in bridge mode, with and
    /// without union sets, and the rule the report names as
    /// deciding is one the kernel's trace matched.
    #[test]
    fn evaluator_agrees_with_the_kernel_interpreter(
        namespaces in namespaces(),
        pods in proptest::collection::vec(pod(), 1..7),
        policies in proptest::collection::vec(policy(), 0..5),
        bridge in any::<bool>(),
        union in any::<bool>(),
    ) {
        let mut seen = std::collections::BTreeSet::new();
        let pods: Vec<PodInfo> = pods.into_iter().rev().filter(|p| seen.insert(p.key.clone())).collect();
        check_cluster(namespaces, pods, policies, Vec::new(), bridge, union)?;
    }

    /// The same with ClusterNetworkPolicies of both tiers beside the NetworkPolicies (every
    /// action, priority ties, pods/networks/unknown peers, numeric and named ports).
    #[test]
    fn evaluator_agrees_with_the_kernel_interpreter_with_cluster_policies(
        namespaces in namespaces(),
        pods in proptest::collection::vec(pod(), 1..6),
        policies in proptest::collection::vec(policy(), 0..3),
        cluster_policies in proptest::collection::vec(cluster_policy(), 1..4),
        bridge in any::<bool>(),
        union in any::<bool>(),
    ) {
        let mut seen = std::collections::BTreeSet::new();
        let pods: Vec<PodInfo> = pods.into_iter().rev().filter(|p| seen.insert(p.key.clone())).collect();
        // One policy per name, as the API server keeps them.
        let mut names = std::collections::BTreeSet::new();
        let cluster_policies: Vec<ClusterPolicyInfo> = cluster_policies
            .into_iter()
            .rev()
            .filter(|p| names.insert(p.name.clone()))
            .collect();
        check_cluster(namespaces, pods, policies, cluster_policies, bridge, union)?;
    }
}

const CLUSTER_FIXTURE: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - name: pass-from-y
    action: Pass
    from: [{namespaces: {matchLabels: {team: b}}}]
  - name: deny-dns
    action: Deny
    from: [{pods: {namespaceSelector: {}, podSelector: {}}}]
    protocols: [{udp: {destinationPort: {number: 53}}}]
  egress:
  - name: metadata
    action: Deny
    to: [{networks: [10.0.3.0/24]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: floor}
spec:
  tier: Baseline
  priority: 0
  subject: {namespaces: {}}
  ingress:
  - name: deny-all
    action: Deny
    from: [{namespaces: {}}]
"#;

fn cluster_fixture() -> State {
    let text = format!("{FIXTURE}\n---\n{CLUSTER_FIXTURE}");
    let (objects, errors) = parse_manifests(&text, "fixture");
    assert!(errors.is_empty(), "{errors:?}");
    let (mut state, errors) = State::from_objects(RuleConfig::default(), &objects);
    assert!(errors.is_empty(), "{errors:?}");
    let resolver = CalicoResolver::default();
    let pods: Vec<PodInfo> = state.pods().to_vec();
    for p in pods {
        state.set_interface(&p.key, resolver.resolve(&p).unwrap());
    }
    state
}

fn cluster_tier(d: &DirectionVerdict, tier: Tier) -> &ClusterTierReport {
    d.tiers
        .iter()
        .find_map(|t| match &t.detail {
            TierDetail::Cluster(c) if c.tier == tier => Some(c),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {tier:?} tier in {:?}", d.tiers))
}

#[test]
fn cluster_tiers_run_around_the_network_policies() {
    let s = cluster_fixture();
    // y/c -> x/b1 (team a): Admin passes, x/b-ingress isolates b1 and allows 9000-9010 from
    // team b: the NetworkPolicy decides, Baseline never runs.
    let v = explain(&s, "y/e", "x/b1", Tcp, 9005);
    assert_eq!(v.ingress.action, Action::Allow, "{}", v.to_text());
    let admin = cluster_tier(&v.ingress, Tier::Admin);
    let m = admin.matched.as_ref().unwrap();
    assert_eq!(
        (m.policy.as_str(), m.rule, m.action, m.rule_name.as_deref()),
        ("guard", 0, RuleAction::Pass, Some("pass-from-y"))
    );
    assert!(m.steps[0]
        .chain
        .as_deref()
        .unwrap()
        .starts_with("cali-pi-kcnp/guard"));
    assert_eq!(m.steps[0].hash.as_ref().map(String::len), Some(16));
    assert_eq!(v.ingress.tiers.len(), 2, "{}", v.to_text());
    // Admin Deny decides before the NetworkPolicy tier runs.
    let v = explain(&s, "z/d", "x/b1", Udp, 53);
    assert_eq!(v.ingress.action, Action::Deny);
    assert_eq!(v.ingress.tiers.len(), 1);
    let m = cluster_tier(&v.ingress, Tier::Admin)
        .matched
        .clone()
        .unwrap();
    assert_eq!((m.rule, m.action), (1, RuleAction::Deny));
    assert!(
        v.to_text()
            .contains("DENY (final) by ClusterNetworkPolicy guard ingress rule 1 (deny-dns)"),
        "{}",
        v.to_text()
    );
    // x/a is not isolated for ingress by a NetworkPolicy: Admin does not match TCP from x,
    // then Baseline denies.
    let v = explain(&s, "x/b1", "x/a", Tcp, 80);
    assert_eq!(v.ingress.action, Action::Deny, "{}", v.to_text());
    let base = cluster_tier(&v.ingress, Tier::Baseline);
    assert_eq!(base.matched.as_ref().unwrap().policy, "floor");
    assert_eq!(v.ingress.tiers.len(), 3);
    // The NetworkPolicy tier hands the flow to the Baseline tier (the rule that starts it in
    // the workload chain), not to the namespace profile, which never sees it.
    let NpOutcome::NotIsolated { steps } = &np(&v.ingress).outcome else {
        panic!("x/a is not isolated: {}", v.to_text());
    };
    assert_eq!(steps.len(), 1, "{}", v.to_text());
    assert!(steps[0].what.contains("on to the Baseline tier"));
    assert!(steps[0].chain.as_deref().unwrap().starts_with("cali-tw-"));
    assert!(steps[0].hash.is_some(), "{}", v.to_text());
    assert!(v.ingress.after.is_empty(), "{}", v.to_text());
    let text = v.to_text();
    let ingress_text = text.split("ingress of x/a").nth(1).unwrap();
    assert!(!ingress_text.contains("namespace profile"), "{text}");
    // From outside the cluster the Baseline tier matches nothing: then the profile decides,
    // and the report ends with its allow.
    let v = explain(&s, "192.0.2.7", "x/a", Tcp, 80);
    assert_eq!(v.ingress.action, Action::Allow, "{}", v.to_text());
    assert!(cluster_tier(&v.ingress, Tier::Baseline).matched.is_none());
    let profile: Vec<&str> = v.ingress.after.iter().map(|r| r.what.as_str()).collect();
    assert_eq!(
        profile,
        [
            "not isolated: the workload chain goes to the namespace profile",
            "the namespace profile allows"
        ]
    );
    assert!(v.ingress.after.iter().all(|r| r.hash.is_some()));
    assert!(
        v.to_text()
            .contains("no ingress rule of these policies matches: on to the namespace profile"),
        "{}",
        v.to_text()
    );
    // Egress to networks, pod addresses included: x/a -> z/d (10.0.3.1) is denied by Admin
    // before x/a-egress's own-namespace-only rules are consulted.
    let v = explain(&s, "x/a", "z/d", Tcp, 80);
    assert_eq!(v.egress.action, Action::Deny);
    assert_eq!(
        cluster_tier(&v.egress, Tier::Admin)
            .matched
            .as_ref()
            .unwrap()
            .rule_name
            .as_deref(),
        Some("metadata")
    );
    let json = v.to_json();
    assert_eq!(
        json["egress"]["tiers"][0]["tier"],
        "ClusterNetworkPolicy Admin"
    );
    assert_eq!(json["egress"]["tiers"][0]["decision"], "deny");
}
