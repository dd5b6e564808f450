//! The ClusterNetworkPolicy tiers of one direction: Admin (before the NetworkPolicies) and
//! Baseline (after them). Within a tier the policies whose subject selects the pod and that
//! have rules in this direction run in (priority, name) order, each policy's rules in written
//! order; the first rule that matches decides: Accept allows and Deny denies (both final for
//! the direction), Pass leaves the tier. No match anywhere leaves the tier too.
//!
//! The match is upstream's semantics on the model, evaluated independently of
//! `rules::cluster`: a rule matches when one of its protocol entries matches (none: every
//! protocol and port) and one of its peers does. A pods peer matches the workload pods at the
//! other end's address (never host-network pods); networks match the address itself, pod
//! addresses included, each family only its own CIDRs; a named port resolves on the
//! destination pod (ingress: the subject pod; egress: the pods at the destination address)
//! with that pod's protocol and number. A peer with no known field fails closed: it matches
//! nothing in an Accept rule and makes a Deny or Pass rule a deny of everything.
//!
//! The rendered chains are consulted only to name the rules implementing a decision.

use std::net::IpAddr;

use serde_json::{json, Value};

use crate::model::{
    ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule, IpFamily, RuleAction, Tier,
};
use crate::rules::cluster::{
    cluster_policy_chain, cluster_policy_chains_traced, plan_cluster_policy, ADMIN_TIER_NAME,
    BASELINE_TIER_NAME,
};
use crate::rules::provenance::{
    describe_selector, ChainRole, ClusterPortsRole, ClusterStep, RuleRole, TracedChain,
};
use crate::rules::sets::set_name;
use crate::rules::Direction;

use super::{dir_index, Action, KernelRef, ResolvedFlow, State};

/// One ClusterNetworkPolicy tier's answer for one direction of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTierReport {
    pub tier: Tier,
    /// The tier's policies selecting the pod in this direction, in evaluation order:
    /// (name, priority, chain).
    pub policies: Vec<(String, u16, String)>,
    /// `None`: no rule matched, the tier passes the flow on.
    pub matched: Option<ClusterMatch>,
}

/// The rule that decided (or passed) in a tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMatch {
    pub policy: String,
    pub priority: u16,
    /// Index in `spec.ingress` / `spec.egress`.
    pub rule: usize,
    pub rule_name: Option<String>,
    /// The action as written.
    pub action: RuleAction,
    /// The peer that matched (index in `from` / `to`) and what it is.
    pub peer: usize,
    pub peer_text: String,
    /// The protocol entry that matched (index in `protocols`); `None`: the rule has none
    /// (every protocol and port), or it failed closed.
    pub port: Option<usize>,
    pub port_text: String,
    /// A Deny or Pass rule with a peer this version cannot read: a deny of everything.
    pub fail_closed: bool,
    pub steps: Vec<KernelRef>,
}

impl ClusterMatch {
    /// What the match does: a fail-closed rule denies whatever its written action.
    pub fn effect(&self) -> RuleAction {
        if self.fail_closed {
            RuleAction::Deny
        } else {
            self.action
        }
    }
}

impl ClusterTierReport {
    pub fn decision(&self) -> Option<Action> {
        match self.matched.as_ref().map(ClusterMatch::effect) {
            Some(RuleAction::Accept) => Some(Action::Allow),
            Some(RuleAction::Deny) => Some(Action::Deny),
            Some(RuleAction::Pass) | None => None,
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "policies": self.policies.iter().map(|(n, p, c)| json!({"policy": n, "priority": p, "chain": c})).collect::<Vec<_>>(),
        });
        match &self.matched {
            None => v["result"] = json!("no rule matched: next tier"),
            Some(m) => {
                v["result"] = json!(match m.effect() {
                    RuleAction::Accept => "accepted",
                    RuleAction::Deny => "denied",
                    RuleAction::Pass => "passed: the rest of the tier is skipped",
                });
                v["matched"] = json!({
                    "policy": m.policy,
                    "priority": m.priority,
                    "rule": m.rule,
                    "rule_name": m.rule_name,
                    "action": m.action.as_str(),
                    "fail_closed": m.fail_closed,
                    "peer": m.peer,
                    "peer_description": m.peer_text,
                    "port": m.port,
                    "port_description": m.port_text,
                    "kernel": m.steps.iter().map(KernelRef::to_json).collect::<Vec<_>>(),
                });
            }
        }
        v
    }
}

/// felix's tier name (`kube-admin`, `kube-baseline`).
pub fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Admin => ADMIN_TIER_NAME,
        Tier::Baseline => BASELINE_TIER_NAME,
    }
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Admin => 0,
        Tier::Baseline => 1,
    }
}

/// Per pod, per tier, per direction: the indices (in evaluation order) of the policies
/// selecting it that have rules in that direction. `policies` is in evaluation order.
pub(super) fn selections(
    state: &State,
    policies: &[ClusterPolicyInfo],
) -> Vec<[[Vec<usize>; 2]; 2]> {
    state
        .pods
        .iter()
        .map(|pod| {
            let mut sel: [[Vec<usize>; 2]; 2] = Default::default();
            let Some(ns_labels) = state.namespace_labels(&pod.key.namespace) else {
                return sel;
            };
            for (i, p) in policies.iter().enumerate() {
                if !p.subject.matches(ns_labels, &pod.labels) {
                    continue;
                }
                let t = tier_index(p.tier);
                if !p.ingress.is_empty() {
                    sel[t][dir_index(Direction::Ingress)].push(i);
                }
                if !p.egress.is_empty() {
                    sel[t][dir_index(Direction::Egress)].push(i);
                }
            }
            sel
        })
        .collect()
}

fn rules_of(policy: &ClusterPolicyInfo, dir: Direction) -> &[ClusterRule] {
    match dir {
        Direction::Ingress => &policy.ingress,
        Direction::Egress => &policy.egress,
    }
}

/// How one rule matched: (peer index, protocol entry index, failed closed).
type Hit = (usize, Option<usize>, bool);

fn peer_matches(state: &State, peer: &ClusterPeer, ip: &IpAddr) -> bool {
    match peer {
        ClusterPeer::Pods(sel) => state.pods_at(ip).iter().any(|&q| {
            let pod = &state.pods[q];
            state
                .namespace_labels(&pod.key.namespace)
                .is_some_and(|ns| sel.matches(ns, &pod.labels))
        }),
        ClusterPeer::Networks(nets) => nets
            .iter()
            .any(|n| IpFamily::of_net(n) == IpFamily::of(ip) && n.contains(ip)),
        ClusterPeer::Unknown(_) => false,
    }
}

fn port_matches(
    state: &State,
    port: &ClusterPort,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> bool {
    match port {
        ClusterPort::Numeric {
            protocol,
            first,
            last,
        } => *protocol == flow.protocol && (*first..=*last).contains(&flow.port),
        ClusterPort::Named(name) => {
            let has = |q: usize| {
                state.pods[q].named_ports.iter().any(|np| {
                    np.name == *name && np.protocol == flow.protocol && np.port == flow.port
                })
            };
            match dir {
                Direction::Ingress => has(pod),
                Direction::Egress => state.pods_at(&flow.dst_ip).iter().any(|&q| has(q)),
            }
        }
    }
}

fn rule_hit(
    state: &State,
    rule: &ClusterRule,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> Option<Hit> {
    if rule.action != RuleAction::Accept {
        if let Some(i) = rule
            .peers
            .iter()
            .position(|p| matches!(p, ClusterPeer::Unknown(_)))
        {
            return Some((i, None, true));
        }
    }
    let port = match &rule.ports {
        None => None,
        Some(ports) => Some(
            ports
                .iter()
                .position(|p| port_matches(state, p, dir, pod, flow))?,
        ),
    };
    let ip = match dir {
        Direction::Ingress => flow.src_ip,
        Direction::Egress => flow.dst_ip,
    };
    let peer = rule
        .peers
        .iter()
        .position(|p| peer_matches(state, p, &ip))?;
    Some((peer, port, false))
}

/// The first matching rule of the tier: (policy index, rule index, hit).
fn first_hit(
    state: &State,
    tier: Tier,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> Option<(usize, usize, Hit)> {
    state.cluster_selected[pod][tier_index(tier)][dir_index(dir)]
        .iter()
        .find_map(|&p| {
            rules_of(&state.cluster[p], dir)
                .iter()
                .enumerate()
                .find_map(|(r, rule)| Some((p, r, rule_hit(state, rule, dir, pod, flow)?)))
        })
}

/// The tier's decision for this direction of `pod`: `Some(true)` accepted, `Some(false)`
/// denied, `None` passed on (a Pass, or no match).
pub(super) fn decides(
    state: &State,
    tier: Tier,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> Option<bool> {
    let (p, r, (_, _, fail_closed)) = first_hit(state, tier, dir, pod, flow)?;
    let action = if fail_closed {
        RuleAction::Deny
    } else {
        rules_of(&state.cluster[p], dir)[r].action
    };
    match action {
        RuleAction::Accept => Some(true),
        RuleAction::Deny => Some(false),
        RuleAction::Pass => None,
    }
}

/// Whether the pod has policies of `tier` in this direction (the tier appears in its
/// workload chain).
pub(super) fn has_tier(state: &State, tier: Tier, dir: Direction, pod: usize) -> bool {
    !state.cluster_selected[pod][tier_index(tier)][dir_index(dir)].is_empty()
}

/// The names of the policies of each tier in the pod's workload chain of `dir`:
/// (Admin, Baseline).
pub(super) fn chain_names(state: &State, dir: Direction, pod: usize) -> [Vec<String>; 2] {
    let names = |t: Tier| {
        state.cluster_selected[pod][tier_index(t)][dir_index(dir)]
            .iter()
            .map(|&p| state.cluster[p].name.clone())
            .collect()
    };
    [names(Tier::Admin), names(Tier::Baseline)]
}

fn policy_chain_traced(
    state: &State,
    family: IpFamily,
    p: &ClusterPolicyInfo,
    dir: Direction,
) -> Option<TracedChain> {
    let plan = plan_cluster_policy(p);
    cluster_policy_chains_traced(state.config(), family, p, &plan, &|d| {
        set_name(family, &d.id())
    })
    .into_iter()
    .find(|c| matches!(&c.role, ChainRole::ClusterPolicy { direction, .. } if *direction == dir))
}

fn peer_text(peer: &ClusterPeer) -> String {
    match peer {
        ClusterPeer::Pods(sel) => {
            let pods = if sel.pods.is_everything() {
                "every pod".to_string()
            } else {
                format!("pods {}", describe_selector(&sel.pods))
            };
            let ns = if sel.namespaces.is_everything() {
                "in every namespace".to_string()
            } else {
                format!("in namespaces {}", describe_selector(&sel.namespaces))
            };
            format!("{pods} {ns}")
        }
        ClusterPeer::Networks(nets) => format!(
            "networks {}",
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ClusterPeer::Unknown(fields) => format!("unknown peer field(s) {}", fields.join(", ")),
    }
}

fn port_text(port: &ClusterPort) -> String {
    match port {
        ClusterPort::Numeric {
            protocol,
            first,
            last,
        } => {
            let proto = protocol.as_str().to_ascii_uppercase();
            if first == last {
                format!("{proto} {first}")
            } else {
                format!("{proto} {first}-{last}")
            }
        }
        ClusterPort::Named(name) => format!("named port {name}"),
    }
}

/// The full report of one tier for one direction of `pod`. `workload` is the pod's traced
/// workload chain of that direction, when its interface is known.
pub(super) fn report(
    state: &State,
    tier: Tier,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
    workload: Option<&TracedChain>,
) -> ClusterTierReport {
    let policies = state.cluster_selected[pod][tier_index(tier)][dir_index(dir)]
        .iter()
        .map(|&p| {
            let info = &state.cluster[p];
            (
                info.name.clone(),
                info.priority,
                cluster_policy_chain(dir, &info.name),
            )
        })
        .collect();
    let matched =
        first_hit(state, tier, dir, pod, flow).map(|(p, r, (peer, port, fail_closed))| {
            let info = &state.cluster[p];
            let rule = &rules_of(info, dir)[r];
            let mut m = ClusterMatch {
                policy: info.name.clone(),
                priority: info.priority,
                rule: r,
                rule_name: rule.name.clone(),
                action: rule.action,
                peer,
                peer_text: rule.peers.get(peer).map(peer_text).unwrap_or_default(),
                port,
                port_text: match (port, &rule.ports) {
                    (Some(i), Some(ports)) => ports.get(i).map(port_text).unwrap_or_default(),
                    _ if fail_closed => "every protocol and port (fail closed)".to_string(),
                    _ => "every protocol and port".to_string(),
                },
                fail_closed,
                steps: Vec::new(),
            };
            m.steps = steps(state, info, dir, flow, &m, workload);
            m
        });
    ClusterTierReport {
        tier,
        policies,
        matched,
    }
}

/// The rules of ours implementing a match: the policy chain's rule the packet meets first for
/// that API rule, and for an Accept the workload chain's return.
fn steps(
    state: &State,
    info: &ClusterPolicyInfo,
    dir: Direction,
    flow: &ResolvedFlow,
    m: &ClusterMatch,
    workload: Option<&TracedChain>,
) -> Vec<KernelRef> {
    let mut out = Vec::new();
    let what = match m.effect() {
        RuleAction::Accept => "the rule sets the accept mark and returns",
        RuleAction::Deny => "the rule drops (deny action)",
        RuleAction::Pass => {
            "the rule sets the pass mark and returns: the rest of the tier is skipped"
        }
    };
    let chain = policy_chain_traced(state, flow.family, info, dir);
    match chain {
        Some(c) => {
            // The kernel's first rule of that API rule that matches: the matched peer, the
            // packet's protocol, the matched protocol entry.
            let entry = m
                .port
                .and_then(|i| rules_of(info, dir)[m.rule].ports.as_ref()?.get(i));
            let n = c.rules.iter().position(|role| {
                let RuleRole::ClusterPolicy(r) = role else {
                    return false;
                };
                let ClusterStep::Match {
                    peer,
                    protocol,
                    ports,
                } = &r.step
                else {
                    return false;
                };
                r.rule == m.rule
                    && *peer == m.peer
                    && protocol.is_none_or(|p| p == flow.protocol)
                    && match (ports, entry) {
                        (ClusterPortsRole::Any, _) => true,
                        (ClusterPortsRole::Numeric(ranges), _) => {
                            ranges.iter().any(|(a, b)| (*a..=*b).contains(&flow.port))
                        }
                        (ClusterPortsRole::Named(n), Some(ClusterPort::Named(e))) => n == e,
                        (ClusterPortsRole::Named(_), _) => false,
                    }
            });
            out.push(KernelRef {
                chain: Some(c.chain.name.clone()),
                hash: n.map(|n| c.chain.rules[n].hash.clone()),
                number: n.map(|n| n + 1),
                what: format!("{what} ({} rule {}, peer {})", dir.as_str(), m.rule, m.peer),
            });
        }
        None => out.push(KernelRef {
            chain: Some(cluster_policy_chain(dir, &info.name)),
            hash: None,
            number: None,
            what: what.to_string(),
        }),
    }
    if m.effect() == RuleAction::Accept {
        let role = RuleRole::ReturnIfClusterPolicyAccepted {
            tier: tier_name(info.tier),
            name: info.name.clone(),
        };
        if let Some(w) = workload {
            let n = w.rules.iter().position(|r| *r == role);
            out.push(KernelRef {
                chain: Some(w.chain.name.clone()),
                hash: n.map(|n| w.chain.rules[n].hash.clone()),
                number: n.map(|n| n + 1),
                what: "the workload chain returns: accepted".into(),
            });
        }
    }
    out
}
