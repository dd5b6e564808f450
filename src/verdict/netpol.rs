//! The NetworkPolicy tier of one direction: isolated or not (and by which policies), the
//! policy, rule, peer and port entry that allowed, or the closest misses of a deny; and the
//! rules of ours that implement each deciding step.
//!
//! The match itself is Kubernetes' semantics on the model ([`allows`]); the rendered chains
//! are only consulted to name the rule the kernel meets first (chain order: policies by
//! namespace/name, then each policy's rules as `rules::policy` orders them).

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::model::{
    IpFamily, NamespaceScope, ObjectKey, Peer, PolicyInfo, PolicyRule, PortMatch, PortSpec,
};
use crate::rules::chains::profile_chains_traced;
use crate::rules::cluster::BASELINE_TIER_NAME;
use crate::rules::policy::{plan_policy, policy_chains_traced};
use crate::rules::provenance::{
    describe_peer, describe_port, describe_port_entries, ChainRole, PolicyRuleRole, PolicyStep,
    PortsRole, RuleRole, TracedChain,
};
use crate::rules::sets::set_name;
use crate::rules::union::UnionPlan;
use crate::rules::{policy_chain, Direction};

use super::{dir_index, Action, KernelRef, ResolvedFlow, State};

/// The NetworkPolicy tier's answer for one direction of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicyReport {
    /// The policies isolating the pod in this direction, in chain order, with their chain.
    pub policies: Vec<(ObjectKey, String)>,
    pub outcome: NpOutcome,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NpOutcome {
    /// No policy of this direction selects the pod: the tier passes (the namespace profile
    /// allows).
    NotIsolated {
        steps: Vec<KernelRef>,
    },
    Allowed(AllowMatch),
    /// Isolated and no rule matches.
    Denied {
        misses: Vec<Miss>,
        /// Rules that match neither the peer nor the port.
        unrelated_rules: usize,
        steps: Vec<KernelRef>,
    },
}

/// The rule that allowed: policy, rule index, peer and port entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowMatch {
    pub policy: ObjectKey,
    pub rule: usize,
    /// `None`: the rule has no peers (every peer).
    pub peer: Option<usize>,
    pub peer_text: String,
    /// `None`: the rule has no ports (every port and protocol).
    pub port: Option<usize>,
    pub port_text: String,
    pub steps: Vec<KernelRef>,
}

/// A rule of an isolating policy that nearly allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Miss {
    pub policy: ObjectKey,
    pub rule: usize,
    pub kind: MissKind,
    /// The allow rules of ours implementing that Kubernetes rule.
    pub rules: Vec<KernelRef>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissKind {
    /// A peer matched, no port entry did.
    PortNotMatched { peers: Vec<String>, ports: String },
    /// A port entry matched, no peer did.
    PeerNotMatched { ports: Vec<String>, peers: String },
    /// The address is in an ipBlock's CIDR but also in one of its excepted CIDRs.
    Excepted {
        peer: usize,
        peer_text: String,
        except: IpNet,
        port_matched: bool,
    },
}

impl NetworkPolicyReport {
    pub fn decision(&self) -> Option<Action> {
        match self.outcome {
            NpOutcome::NotIsolated { .. } => None,
            NpOutcome::Allowed(_) => Some(Action::Allow),
            NpOutcome::Denied { .. } => Some(Action::Deny),
        }
    }

    pub fn to_json(&self) -> Value {
        let steps = |s: &[KernelRef]| s.iter().map(KernelRef::to_json).collect::<Vec<_>>();
        let mut v = json!({
            "isolated": !self.policies.is_empty(),
            "isolated_by": self.policies.iter().map(|(k, c)| json!({"policy": k.to_string(), "chain": c})).collect::<Vec<_>>(),
        });
        match &self.outcome {
            NpOutcome::NotIsolated { steps: s } => {
                v["result"] =
                    json!("not isolated: no NetworkPolicy of this direction selects the pod");
                v["kernel"] = json!(steps(s));
            }
            NpOutcome::Allowed(m) => {
                v["result"] = json!("allowed");
                v["allowed_by"] = json!({
                    "policy": m.policy.to_string(),
                    "rule": m.rule,
                    "peer": m.peer,
                    "peer_description": m.peer_text,
                    "port": m.port,
                    "port_description": m.port_text,
                    "kernel": steps(&m.steps),
                });
            }
            NpOutcome::Denied {
                misses,
                unrelated_rules,
                steps: s,
            } => {
                v["result"] = json!("denied: no rule of the isolating policies matches");
                v["closest_misses"] = json!(misses
                    .iter()
                    .map(|m| {
                        let mut o = match &m.kind {
                            MissKind::PortNotMatched { peers, ports } => json!({
                                "kind": "peer matched, port not",
                                "peers_matched": peers, "rule_ports": ports}),
                            MissKind::PeerNotMatched { ports, peers } => json!({
                                "kind": "port matched, peer not",
                                "ports_matched": ports, "rule_peers": peers}),
                            MissKind::Excepted {
                                peer,
                                peer_text,
                                except,
                                port_matched,
                            } => json!({
                                "kind": "excluded by ipBlock.except",
                                "peer": peer, "peer_description": peer_text,
                                "except": except.to_string(), "port_matched": port_matched}),
                        };
                        o["policy"] = json!(m.policy.to_string());
                        o["rule"] = json!(m.rule);
                        o["kernel"] = json!(steps(&m.rules));
                        o
                    })
                    .collect::<Vec<_>>());
                v["rules_matching_neither"] = json!(unrelated_rules);
                v["kernel"] = json!(steps(s));
            }
        }
        v
    }
}

/// How a peer relates to an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerResult {
    Match,
    NoMatch,
    Excepted(IpNet),
}

/// The other side's address for this direction.
fn peer_ip(dir: Direction, flow: &ResolvedFlow) -> IpAddr {
    match dir {
        Direction::Ingress => flow.src_ip,
        Direction::Egress => flow.dst_ip,
    }
}

fn peer_result(state: &State, peer: &Peer, ip: &IpAddr) -> PeerResult {
    match peer {
        Peer::IpBlock { cidr, except } => {
            if IpFamily::of_net(cidr) != IpFamily::of(ip) || !cidr.contains(ip) {
                return PeerResult::NoMatch;
            }
            match except.iter().find(|e| e.contains(ip)) {
                Some(e) => PeerResult::Excepted(*e),
                None => PeerResult::Match,
            }
        }
        Peer::Pods { namespaces, pods } => {
            let hit = state.pods_at(ip).iter().any(|&q| {
                let pod = &state.pods[q];
                let ns_ok = match namespaces {
                    NamespaceScope::Named(ns) => pod.key.namespace == *ns,
                    NamespaceScope::Selector(sel) => state
                        .namespace_labels(&pod.key.namespace)
                        .is_some_and(|labels| sel.matches(labels)),
                };
                ns_ok && pods.matches(&pod.labels)
            });
            if hit {
                PeerResult::Match
            } else {
                PeerResult::NoMatch
            }
        }
    }
}

/// Whether a port entry matches; a named port is resolved on the destination pod (the
/// policed pod for ingress, the pods at the destination address for egress), as the kernel's
/// `ip,proto:port` sets hold them.
fn port_matches(
    state: &State,
    spec: &PortSpec,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> bool {
    if spec.protocol != flow.protocol {
        return false;
    }
    match &spec.port {
        PortMatch::Any => true,
        PortMatch::Range { first, last } => (*first..=*last).contains(&flow.port),
        PortMatch::Named(name) => {
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

fn peer_ok(state: &State, rule: &PolicyRule, ip: &IpAddr) -> bool {
    match &rule.peers {
        None => true,
        Some(peers) => peers
            .iter()
            .any(|p| peer_result(state, p, ip) == PeerResult::Match),
    }
}

fn ports_ok(
    state: &State,
    rule: &PolicyRule,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> bool {
    rule.ports.is_empty()
        || rule
            .ports
            .iter()
            .any(|s| port_matches(state, s, dir, pod, flow))
}

fn rules_of(policy: &PolicyInfo, dir: Direction) -> &[PolicyRule] {
    let rules = match dir {
        Direction::Ingress => &policy.ingress,
        Direction::Egress => &policy.egress,
    };
    rules.as_deref().unwrap_or_default()
}

/// Whether the NetworkPolicy tier lets the flow through this direction of `pod` (not
/// isolated, or a rule of an isolating policy matches).
pub(super) fn allows(state: &State, dir: Direction, pod: usize, flow: &ResolvedFlow) -> bool {
    let isolating = &state.selected[pod][dir_index(dir)];
    if isolating.is_empty() {
        return true;
    }
    let ip = peer_ip(dir, flow);
    isolating.iter().any(|&p| {
        rules_of(&state.policies[p], dir)
            .iter()
            .any(|r| peer_ok(state, r, &ip) && ports_ok(state, r, dir, pod, flow))
    })
}

/// The rendered chains a report points into, built on demand.
struct Chains<'a> {
    state: &'a State,
    family: IpFamily,
    dir: Direction,
    pod: usize,
}

impl Chains<'_> {
    fn policy(&self, p: usize) -> Option<TracedChain> {
        let info = &self.state.policies[p];
        let plan = plan_policy(info);
        let family = self.family;
        policy_chains_traced(&self.state.cfg, family, info, &plan, &|d| {
            set_name(family, &d.id())
        })
        .into_iter()
        .find(|c| matches!(&c.role, ChainRole::Policy { direction, .. } if *direction == self.dir))
    }

    fn workload(&self) -> Option<TracedChain> {
        self.state.workload_chain(self.pod, self.dir, self.family)
    }

    fn profile(&self) -> Option<TracedChain> {
        let ns = &self.state.pods[self.pod].key.namespace;
        profile_chains_traced(&self.state.cfg, self.family, ns)
            .into_iter()
            .find(|c| matches!(&c.role, ChainRole::Profile { direction, .. } if *direction == self.dir))
    }

    /// The jump to the namespace profile and the profile's allow: what decides for a pod no
    /// tier decided for.
    fn profile_steps(&self, workload: &Option<TracedChain>) -> Vec<KernelRef> {
        let mut steps = vec![self.workload_ref(
            workload,
            &RuleRole::JumpToProfile,
            "not isolated: the workload chain goes to the namespace profile",
        )];
        if let Some(profile) = self.profile() {
            steps.push(rule_ref(
                &profile,
                |r| *r == RuleRole::ProfileAllow,
                "the namespace profile allows",
            ));
        }
        steps
    }

    /// The workload chain's rule with `role`, or a reference saying the chain is unknown.
    fn workload_ref(&self, chain: &Option<TracedChain>, role: &RuleRole, what: &str) -> KernelRef {
        match chain {
            Some(c) => rule_ref(c, |r| r == role, what),
            None => {
                let key = &self.state.pods[self.pod].key;
                let prefix = match self.dir {
                    Direction::Ingress => crate::rules::TO_WORKLOAD_PREFIX,
                    Direction::Egress => crate::rules::FROM_WORKLOAD_PREFIX,
                };
                KernelRef {
                    chain: None,
                    hash: None,
                    number: None,
                    what: format!(
                        "{what} (in {prefix}<interface of {key}>: the pod's interface is not known here)"
                    ),
                }
            }
        }
    }
}

/// What decides when no tier did: the workload chain's jump to the namespace profile and the
/// profile's allow.
pub(super) fn profile_steps(
    state: &State,
    dir: Direction,
    pod: usize,
    family: IpFamily,
) -> Vec<KernelRef> {
    let chains = Chains {
        state,
        family,
        dir,
        pod,
    };
    chains.profile_steps(&chains.workload())
}

/// The first rule of `chain` whose role satisfies `pick`.
fn rule_ref(chain: &TracedChain, pick: impl Fn(&RuleRole) -> bool, what: &str) -> KernelRef {
    let n = chain.rules.iter().position(pick);
    KernelRef {
        chain: Some(chain.chain.name.clone()),
        hash: n.map(|n| chain.chain.rules[n].hash.clone()),
        number: n.map(|n| n + 1),
        what: what.to_string(),
    }
}

fn peer_text(rule: &PolicyRule, peer: Option<usize>) -> String {
    match (peer, &rule.peers) {
        (None, _) | (_, None) => "any peer (the rule has no from/to)".to_string(),
        (Some(i), Some(peers)) => peers.get(i).map_or_else(
            || format!("peer {i}"),
            |p| format!("peer {i}: {}", describe_peer(p)),
        ),
    }
}

fn port_text(rule: &PolicyRule, port: Option<usize>) -> String {
    match port.and_then(|i| rule.ports.get(i).map(|s| (i, s))) {
        None => "every port and protocol (the rule has no ports)".to_string(),
        Some((i, spec)) => format!("port {i}: {}", describe_port(spec)),
    }
}

fn all_peers_text(rule: &PolicyRule) -> String {
    match &rule.peers {
        None => "any peer".into(),
        Some(peers) => peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("peer {i}: {}", describe_peer(p)))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn all_ports_text(rule: &PolicyRule) -> String {
    if rule.ports.is_empty() {
        return "every port and protocol".into();
    }
    describe_port_entries(&rule.ports, &(0..rule.ports.len()).collect::<Vec<_>>())
}

/// Whether the pod's union set of `dir` (`rules::union`) holds the flow: a part with the
/// flow's protocol and port whose peer selector matches the peer's address.
fn union_covers(state: &State, union: &UnionPlan, dir: Direction, flow: &ResolvedFlow) -> bool {
    let ip = peer_ip(dir, flow);
    union.parts.iter().any(|p| {
        p.protocol == flow.protocol
            && p.port == flow.port
            && peer_result(
                state,
                &Peer::Pods {
                    namespaces: p.peer.namespaces().clone(),
                    pods: p.peer.pods().clone(),
                },
                &ip,
            ) == PeerResult::Match
    })
}

/// Whether a rendered allow rule's role matches the flow (its Kubernetes rule, peer,
/// protocol and port entries): the kernel's first such rule decides.
fn role_matches(
    state: &State,
    rules: &[PolicyRule],
    role: &PolicyRuleRole,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
) -> Option<Option<usize>> {
    let PolicyStep::Allow { ports } = &role.step else {
        return None;
    };
    let rule = rules.get(role.rule)?;
    let ip = peer_ip(dir, flow);
    let peer_matches = match (role.peer, &rule.peers) {
        (None, None) => true,
        (Some(i), Some(peers)) => peers
            .get(i)
            .is_some_and(|p| peer_result(state, p, &ip) == PeerResult::Match),
        _ => false,
    };
    if !peer_matches || role.protocol.is_some_and(|p| p != flow.protocol) {
        return None;
    }
    match ports {
        PortsRole::AllProtocols => Some(None),
        other => other
            .entries()
            .iter()
            .copied()
            .find(|&e| {
                rule.ports
                    .get(e)
                    .is_some_and(|s| port_matches(state, s, dir, pod, flow))
            })
            .map(Some),
    }
}

/// The full report of the NetworkPolicy tier for one direction of `pod`.
/// The NetworkPolicy tier's report. `baseline_follows`: a ClusterNetworkPolicy Baseline tier
/// selects the pod in this direction, so a pod no NetworkPolicy isolates goes on to it (not
/// straight to its namespace profile, see [`profile_steps`]).
pub(super) fn report(
    state: &State,
    dir: Direction,
    pod: usize,
    flow: &ResolvedFlow,
    baseline_follows: bool,
) -> NetworkPolicyReport {
    let isolating = &state.selected[pod][dir_index(dir)];
    let chains = Chains {
        state,
        family: flow.family,
        dir,
        pod,
    };
    let policies: Vec<(ObjectKey, String)> = isolating
        .iter()
        .map(|&p| {
            let k = &state.policies[p].key;
            (k.clone(), policy_chain(dir, &k.namespace, &k.name))
        })
        .collect();
    let workload = chains.workload();
    if isolating.is_empty() {
        let steps = if baseline_follows {
            vec![chains.workload_ref(
                &workload,
                &RuleRole::StartOfTier {
                    tier: BASELINE_TIER_NAME,
                },
                "not isolated: the workload chain goes on to the Baseline tier",
            )]
        } else {
            chains.profile_steps(&workload)
        };
        return NetworkPolicyReport {
            policies,
            outcome: NpOutcome::NotIsolated { steps },
        };
    }

    let ip = peer_ip(dir, flow);
    // The first isolating policy (in chain order) with a matching rule decides.
    for &p in isolating {
        let info = &state.policies[p];
        let rules = rules_of(info, dir);
        if !rules
            .iter()
            .any(|r| peer_ok(state, r, &ip) && ports_ok(state, r, dir, pod, flow))
        {
            continue;
        }
        let traced = chains.policy(p);
        // The kernel's first matching allow rule in that chain.
        let found = traced.as_ref().and_then(|c| {
            c.rules.iter().enumerate().find_map(|(n, role)| match role {
                RuleRole::Policy(r) => {
                    role_matches(state, rules, r, dir, pod, flow).map(|port| (n, r.clone(), port))
                }
                _ => None,
            })
        });
        let (rule, peer, port, allow_ref) = match (found, &traced) {
            (Some((n, r, port)), Some(c)) => (
                r.rule,
                r.peer,
                port,
                KernelRef {
                    chain: Some(c.chain.name.clone()),
                    hash: Some(c.chain.rules[n].hash.clone()),
                    number: Some(n + 1),
                    what: "the policy's allow rule sets the accept mark".into(),
                },
            ),
            // Not expected (the renderer implements every match); fall back to the model.
            _ => {
                let (ri, r) = rules
                    .iter()
                    .enumerate()
                    .find(|(_, r)| peer_ok(state, r, &ip) && ports_ok(state, r, dir, pod, flow))
                    .expect("a matching rule was found above");
                let peer = r.peers.as_ref().and_then(|ps| {
                    ps.iter()
                        .position(|x| peer_result(state, x, &ip) == PeerResult::Match)
                });
                let port = r
                    .ports
                    .iter()
                    .position(|s| port_matches(state, s, dir, pod, flow));
                (
                    ri,
                    peer,
                    port,
                    KernelRef {
                        chain: traced.as_ref().map(|c| c.chain.name.clone()),
                        hash: None,
                        number: None,
                        what: "no rendered rule found for this match (please report)".into(),
                    },
                )
            }
        };
        let key = info.key.clone();
        let jump = chains.workload_ref(
            &workload,
            &RuleRole::JumpToPolicy {
                policy: key.clone(),
            },
            &format!("the workload chain jumps to {key}"),
        );
        let r = &rules[rule];
        // Past the union threshold the kernel accepts at the union set when it holds the
        // flow (any eligible rule of any isolating policy): the policy chains never run.
        let steps = match state
            .union_plan(pod, dir)
            .filter(|u| union_covers(state, u, dir, flow))
        {
            Some(union) => vec![chains.workload_ref(
                &workload,
                &RuleRole::UnionAccept {
                    set: set_name(flow.family, &union.id),
                },
                "the union set of the policies' allows holds the peer address and port",
            )],
            None => vec![jump, allow_ref],
        };
        return NetworkPolicyReport {
            policies,
            outcome: NpOutcome::Allowed(AllowMatch {
                policy: key,
                rule,
                peer,
                peer_text: peer_text(r, peer),
                port,
                port_text: port_text(r, port),
                steps,
            }),
        };
    }

    // Denied: the closest misses of every isolating policy.
    let mut misses = Vec::new();
    let mut unrelated_rules = 0;
    for &p in isolating {
        let info = &state.policies[p];
        let rules = rules_of(info, dir);
        let mut traced: Option<Option<TracedChain>> = None;
        for (ri, rule) in rules.iter().enumerate() {
            let results: Vec<PeerResult> = rule
                .peers
                .iter()
                .flatten()
                .map(|x| peer_result(state, x, &ip))
                .collect();
            let peer_matched = rule.peers.is_none() || results.contains(&PeerResult::Match);
            let ports_matched: Vec<usize> = rule
                .ports
                .iter()
                .enumerate()
                .filter(|(_, s)| port_matches(state, s, dir, pod, flow))
                .map(|(i, _)| i)
                .collect();
            let port_matched = rule.ports.is_empty() || !ports_matched.is_empty();
            let excepted = results.iter().enumerate().find_map(|(i, r)| match r {
                PeerResult::Excepted(e) => Some((i, *e)),
                _ => None,
            });
            let kind = if let (Some((peer, except)), false) = (excepted, peer_matched) {
                MissKind::Excepted {
                    peer,
                    peer_text: peer_text(rule, Some(peer)),
                    except,
                    port_matched,
                }
            } else if peer_matched && !port_matched {
                MissKind::PortNotMatched {
                    peers: match &rule.peers {
                        None => vec![peer_text(rule, None)],
                        Some(_) => results
                            .iter()
                            .enumerate()
                            .filter(|(_, r)| **r == PeerResult::Match)
                            .map(|(i, _)| peer_text(rule, Some(i)))
                            .collect(),
                    },
                    ports: all_ports_text(rule),
                }
            } else if !peer_matched && port_matched {
                MissKind::PeerNotMatched {
                    ports: if rule.ports.is_empty() {
                        vec![port_text(rule, None)]
                    } else {
                        ports_matched
                            .iter()
                            .map(|&i| port_text(rule, Some(i)))
                            .collect()
                    },
                    peers: all_peers_text(rule),
                }
            } else {
                unrelated_rules += 1;
                continue;
            };
            let chain = traced.get_or_insert_with(|| chains.policy(p));
            let refs = chain
                .as_ref()
                .map(|c| {
                    c.rules
                        .iter()
                        .enumerate()
                        .filter(|(_, role)| match role {
                            RuleRole::Policy(r) if r.rule == ri => match (&kind, &r.step) {
                                (
                                    MissKind::Excepted { peer, except, .. },
                                    PolicyStep::ExceptClear { cidr },
                                ) => r.peer == Some(*peer) && cidr == except,
                                (MissKind::Excepted { .. }, _) => false,
                                (_, PolicyStep::Allow { .. }) => true,
                                _ => false,
                            },
                            _ => false,
                        })
                        .map(|(n, _)| KernelRef {
                            chain: Some(c.chain.name.clone()),
                            hash: Some(c.chain.rules[n].hash.clone()),
                            number: Some(n + 1),
                            what: match &kind {
                                MissKind::Excepted { .. } => {
                                    "clears the scratch mark for the excepted CIDR".into()
                                }
                                _ => "allow rule of this Kubernetes rule (did not match)".into(),
                            },
                        })
                        .collect()
                })
                .unwrap_or_default();
            misses.push(Miss {
                policy: info.key.clone(),
                rule: ri,
                kind,
                rules: refs,
            });
        }
    }
    let steps = vec![chains.workload_ref(
        &workload,
        &RuleRole::DropIfNoPolicyPassed,
        "no policy allowed: Drop if no policies passed packet",
    )];
    NetworkPolicyReport {
        policies,
        outcome: NpOutcome::Denied {
            misses,
            unrelated_rules,
            steps,
        },
    }
}
