//! The union set of a workload chain's NetworkPolicy section: one `hash:ip,port` set holding
//! every (peer pod address, protocol:port) that the policies selecting the pod allow by a pod
//! selector and numeric ports, matched once before the per-policy jumps (issue 22, cost).
//!
//! Why: the first packet of every connection walks the NetworkPolicy section, about four rules
//! per policy (a guarded jump, the policy's rule with its set lookup, its return, "Return if
//! policy accepted"). At 1000 policies selecting a pod that is some 4000 rule evaluations per
//! new connection, 0.13 of the rate with no policy (docs/development/policy-layout.md has the
//! measurements of every layout tried). One hash lookup does not grow with the number of
//! policies.
//!
//! What it guarantees: the set only ever holds entries that one policy rule allows on its own
//! (a pod address of a selector peer with one of the rule's numeric ports), and NetworkPolicy
//! allows are a plain union (no deny, no pass, order does not decide the verdict), so
//! accepting on a hit changes no verdict. Everything the set cannot hold (ipBlock peers and
//! their excepts, peer-less rules, named ports, whole protocols, rules without ports, port
//! lists longer than [`MAX_PORTS_PER_ALTERNATIVE`]) is still decided by the per-policy
//! chains after it, exactly as without the set. ClusterNetworkPolicy tiers, whose Deny and
//! Pass are ordered, are untouched.
//!
//! What it costs, hence a threshold (`FELIX_POLICYUNIONMIN`, [`DEFAULT_MIN_POLICIES`]):
//! - a connection accepted by the set never reaches its policy's rule, so that rule's kernel
//!   counter (`netpol_rule_*`) does not count it; the union rule's own counter does;
//! - the set's entries are peers × ports of every eligible rule, per distinct policy list;
//! - with flow logs on the set is never used: a flow record names the policy rule that
//!   allowed, which the kernel tells only through the rule's own NFLOG copy.
//!
//! Below the threshold the chains are felix's, byte for byte.

use std::collections::BTreeSet;

use super::policy::{PlannedPeer, PlannedPorts, PolicyPlan};
use super::provenance::describe_set;
use super::{Direction, RuleConfig};
use crate::model::Protocol;
use crate::rules::sets::{unique_id, SetDef};

/// Pods selected by at least this many NetworkPolicies in one direction get the union set.
/// At 16 the walk is about 64 rules; below it the set saves little and costs the per-rule
/// counters.
pub const DEFAULT_MIN_POLICIES: usize = 16;

/// A port list (one multiport alternative) longer than this stays in the policy chain: the
/// set holds one entry per peer address and port.
pub const MAX_PORTS_PER_ALTERNATIVE: usize = 16;

/// One (peer selector, protocol, port) the union set holds the peer's addresses with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnionPart {
    /// The peer's set id (`SetDef::id`), whose members the union copies.
    pub peer_id: String,
    pub peer: SetDef,
    pub protocol: Protocol,
    pub port: u16,
}

/// The union set one direction of a workload chain matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnionPlan {
    /// `u:` + a digest of the parts: workloads selected by the same policies share the set.
    pub id: String,
    /// Sorted, without duplicates.
    pub parts: Vec<UnionPart>,
}

/// The set's `-m set` flags: the peer is the source on ingress, the destination on egress;
/// the port is always the destination's.
pub fn set_flags(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "src,dst",
        Direction::Egress => "dst,dst",
    }
}

/// The union set for one direction of a workload whose NetworkPolicy section lists `plans`
/// (the isolating policies of that direction), or `None`: the threshold is off or not
/// reached, flow logs are on, or no rule fits the set.
pub fn union_plan(
    cfg: &RuleConfig,
    direction: Direction,
    plans: &[&PolicyPlan],
) -> Option<UnionPlan> {
    if cfg.policy_union_min == 0 || plans.len() < cfg.policy_union_min || cfg.flow_log.is_some() {
        return None;
    }
    let mut parts: BTreeSet<UnionPart> = BTreeSet::new();
    for plan in plans {
        let dir_plan = match direction {
            Direction::Ingress => &plan.ingress,
            Direction::Egress => &plan.egress,
        };
        for rule in dir_plan.iter().flat_map(|d| &d.rules) {
            let (Some(protocol), PlannedPeer::Set(peer @ SetDef::Selector { .. })) =
                (rule.protocol, &rule.peer)
            else {
                continue;
            };
            let peer_id = peer.id();
            for alt in &rule.ports {
                let PlannedPorts::Numeric(ranges) = alt else {
                    continue;
                };
                let count: usize = ranges
                    .iter()
                    .map(|(a, b)| usize::from(b.saturating_sub(*a)) + 1)
                    .sum();
                if count > MAX_PORTS_PER_ALTERNATIVE {
                    continue;
                }
                for &(first, last) in ranges {
                    for port in first..=last {
                        parts.insert(UnionPart {
                            peer_id: peer_id.clone(),
                            peer: peer.clone(),
                            protocol,
                            port,
                        });
                    }
                }
            }
        }
    }
    if parts.is_empty() {
        return None;
    }
    let text: String = parts
        .iter()
        .map(|p| format!("{},{},{};", p.peer_id, p.protocol.as_str(), p.port))
        .collect();
    Some(UnionPlan {
        id: unique_id("u", &text),
        parts: parts.into_iter().collect(),
    })
}

/// What a union set holds (`rules::union`): `address,port of TCP 80 to pods app=web in
/// namespace x; ... (N entries in all)`, the first few parts.
pub fn describe(parts: &[UnionPart]) -> String {
    const SHOWN: usize = 3;
    let mut text: Vec<String> = parts
        .iter()
        .take(SHOWN)
        .map(|p| {
            format!(
                "{} {} of {}",
                p.protocol.as_str().to_ascii_uppercase(),
                p.port,
                describe_set(&p.peer)
            )
        })
        .collect();
    if parts.len() > SHOWN {
        text.push(format!("{} more", parts.len() - SHOWN));
    }
    format!(
        "union of the NetworkPolicies' allows (address,port): {}",
        text.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IpFamily, LabelSel, NamespaceScope, ObjectKey, Peer, PolicyRule};
    use crate::model::{PolicyInfo, PortMatch, PortSpec};
    use crate::rules::flow_log::FlowLogConfig;
    use crate::rules::policy::plan_policy;
    use crate::rules::sets::set_name;
    use kube::core::Expression;

    fn policy(name: &str, rule: PolicyRule) -> PolicyInfo {
        PolicyInfo {
            key: ObjectKey::new("x", name),
            pod_selector: LabelSel::everything(),
            ingress: Some(vec![rule]),
            egress: None,
        }
    }

    fn pods(app: &str) -> Peer {
        Peer::Pods {
            namespaces: NamespaceScope::Named("x".into()),
            pods: LabelSel::from_exprs(vec![Expression::Equal("app".into(), app.into())]),
        }
    }

    fn port(protocol: Protocol, port: PortMatch) -> PortSpec {
        PortSpec { protocol, port }
    }

    fn tcp(first: u16, last: u16) -> PortMatch {
        PortMatch::Range { first, last }
    }

    #[test]
    fn only_selector_peers_with_numeric_ports_go_into_the_set() {
        let ps = [
            policy(
                "a",
                PolicyRule {
                    peers: Some(vec![
                        pods("web"),
                        Peer::IpBlock {
                            cidr: "10.0.0.0/8".parse().unwrap(),
                            except: vec![],
                        },
                    ]),
                    ports: vec![
                        port(Protocol::Tcp, tcp(80, 81)),
                        port(Protocol::Tcp, PortMatch::Named("http".into())),
                        port(Protocol::Udp, PortMatch::Any),
                    ],
                },
            ),
            // Every port: stays a rule.
            policy(
                "b",
                PolicyRule {
                    peers: Some(vec![pods("db")]),
                    ports: vec![],
                },
            ),
            // Every peer: stays a rule.
            policy(
                "c",
                PolicyRule {
                    peers: None,
                    ports: vec![port(Protocol::Sctp, tcp(9, 9))],
                },
            ),
            // Too many ports for the set.
            policy(
                "d",
                PolicyRule {
                    peers: Some(vec![pods("api")]),
                    ports: vec![port(Protocol::Tcp, tcp(1000, 1100))],
                },
            ),
        ];
        let plans: Vec<_> = ps.iter().map(plan_policy).collect();
        let refs: Vec<&PolicyPlan> = plans.iter().collect();
        let cfg = RuleConfig {
            policy_union_min: 2,
            ..RuleConfig::default()
        };
        let u = union_plan(&cfg, Direction::Ingress, &refs).expect("four policies, min 2");
        let got: Vec<(Protocol, u16)> = u.parts.iter().map(|p| (p.protocol, p.port)).collect();
        assert_eq!(got, vec![(Protocol::Tcp, 80), (Protocol::Tcp, 81)]);
        assert!(u.parts.iter().all(|p| p.peer_id == p.peer.id()));
        assert_eq!(
            describe(&u.parts),
            "union of the NetworkPolicies' allows (address,port): TCP 80 of addresses of pods \
             app=web in namespace x; TCP 81 of addresses of pods app=web in namespace x"
        );
        assert!(set_name(IpFamily::V4, &u.id).starts_with("cali40u:"));
        assert_eq!(set_name(IpFamily::V4, &u.id).len(), 31);
        // No egress rules: no egress set.
        assert_eq!(union_plan(&cfg, Direction::Egress, &refs), None);
    }

    #[test]
    fn threshold_off_and_flow_logs_keep_the_walk() {
        let ps: Vec<PolicyInfo> = (0..3)
            .map(|i| {
                policy(
                    &format!("p{i}"),
                    PolicyRule {
                        peers: Some(vec![pods(&format!("a{i}"))]),
                        ports: vec![port(Protocol::Tcp, tcp(80, 80))],
                    },
                )
            })
            .collect();
        let plans: Vec<_> = ps.iter().map(plan_policy).collect();
        let refs: Vec<&PolicyPlan> = plans.iter().collect();
        let with = |min: usize| RuleConfig {
            policy_union_min: min,
            ..RuleConfig::default()
        };
        assert_eq!(union_plan(&with(0), Direction::Ingress, &refs), None);
        assert_eq!(union_plan(&with(4), Direction::Ingress, &refs), None);
        let three = union_plan(&with(3), Direction::Ingress, &refs).unwrap();
        assert_eq!(three.parts.len(), 3);
        // The same list in another order is the same set.
        let rev: Vec<&PolicyPlan> = plans.iter().rev().collect();
        assert_eq!(union_plan(&with(3), Direction::Ingress, &rev), Some(three));
        let logged = RuleConfig {
            flow_log: Some(FlowLogConfig::new(21, 100, 200, 64).unwrap()),
            ..with(1)
        };
        assert_eq!(union_plan(&logged, Direction::Ingress, &refs), None);
    }
}
