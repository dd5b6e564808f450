//! The guard: local pods a policy isolates but whose host interface is not known yet, dropped
//! by address until it is. Pure: no I/O.
//!
//! Why: a pod's chains are reached through its interface (the dispatch chains), so a pod the
//! resolver has not named yet has no chains at all. The dispatch chains' "Unknown interface"
//! drop covers its traffic only when its interface matches a configured prefix; a pod the
//! routes or bridge resolver has not learned yet, a sandbox the runtime has not reported, and
//! every pod on a node whose wiring `FELIX_INTERFACENAMESCHEME=auto` has not seen yet would
//! otherwise answer anyone until it is named (issue 35: 2 of 20 probes answered on a fresh
//! node). Felix drops the traffic of a workload interface it does not know; the guard does the
//! same by the pod's addresses, which the datastore gives before any interface exists.
//!
//! `cali-wl-guard` holds, per guarded pod and address of the family, a drop to the address
//! when some policy isolates the pod for ingress and a drop from it when one isolates it for
//! egress (any NetworkPolicy or ClusterNetworkPolicy tier: the guard does not judge rules, it
//! holds everything until they can be judged). IPv6 neighbour discovery returns first, so a
//! guarded pod can still resolve its neighbours. Pods no policy selects are not guarded:
//! without policy their traffic is allowed anyway. `cali-FORWARD`, `cali-INPUT` and, in IPVS
//! mode, `cali-OUTPUT` (traffic IPVS forwards, whose source is not the host's) jump to it
//! first, and only while it holds a pod, so a node with every pod named renders exactly what
//! it did before the guard existed.
//!
//! The guard at two layers: which pods it holds in `calc_graph::guard`, its chain in
//! `rules::guard`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::deny;
use super::provenance::{ChainRole, Rendered, RuleList, RuleRole, TracedChain};
use super::{Action, Chain, Direction, Rule, RuleConfig};
use crate::model::{IpFamily, ObjectKey};

pub const GUARD_CHAIN: &str = "cali-wl-guard";

/// ICMPv6 neighbour discovery (router solicitation and advertisement, neighbour solicitation
/// and advertisement): let through, as every pod's own chains do.
const NEIGHBOUR_DISCOVERY: [u8; 4] = [133, 134, 135, 136];

/// A local pod without a known interface that some policy isolates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarded {
    pub pod: ObjectKey,
    pub ips: Vec<IpAddr>,
    /// Isolated for ingress: traffic to its addresses is dropped.
    pub ingress: bool,
    /// Isolated for egress: traffic from its addresses is dropped.
    pub egress: bool,
}

/// `cali-wl-guard` for `family`.
pub fn guard_chain(cfg: &RuleConfig, family: IpFamily, pods: &[Guarded]) -> Chain {
    render(cfg, family, pods, false).0
}

/// [`guard_chain`] with what each rule is for.
pub fn guard_chain_traced(cfg: &RuleConfig, family: IpFamily, pods: &[Guarded]) -> TracedChain {
    super::provenance::traced(vec![render(cfg, family, pods, true)])
        .pop()
        .expect("one chain rendered")
}

fn render(cfg: &RuleConfig, family: IpFamily, pods: &[Guarded], traced: bool) -> Rendered {
    let mut rules = RuleList::new(traced);
    if family == IpFamily::V6 {
        for t in NEIGHBOUR_DISCOVERY {
            rules.push(
                Rule {
                    protocol: Some("ipv6-icmp"),
                    ..Rule::new(Action::Return).matching(format!("-m icmp6 --icmpv6-type {t}"))
                },
                || RuleRole::GuardNeighbourDiscovery,
            );
        }
    }
    let drop = deny(cfg);
    for pod in pods {
        for ip in pod.ips.iter().filter(|ip| IpFamily::of(ip) == family) {
            let net = IpNet::from(*ip);
            for (isolated, direction) in [
                (pod.ingress, Direction::Ingress),
                (pod.egress, Direction::Egress),
            ] {
                if !isolated {
                    continue;
                }
                let rule = Rule::new(drop.clone()).comment(format!(
                    "{} {}: interface not known yet",
                    pod.pod,
                    match direction {
                        Direction::Ingress => "ingress",
                        Direction::Egress => "egress",
                    }
                ));
                let rule = match direction {
                    Direction::Ingress => Rule {
                        dst: Some(net),
                        ..rule
                    },
                    Direction::Egress => Rule {
                        src: Some(net),
                        ..rule
                    },
                };
                rules.push(rule, || RuleRole::GuardUnnamedPod {
                    pod: pod.pod.clone(),
                    direction,
                });
            }
        }
    }
    rules.finish(GUARD_CHAIN, family, || ChainRole::Guard)
}

/// The jump into the guard, first in `cali-FORWARD` and `cali-INPUT`.
pub(crate) fn jump() -> Rule {
    Rule::new(Action::Jump(GUARD_CHAIN.into()))
}

/// The jump in `cali-OUTPUT` (IPVS mode): only traffic whose source is not the host's, which
/// is what IPVS forwards for pods; host-to-pod traffic (kubelet probes) is never policed.
pub(crate) fn output_jump() -> Rule {
    jump().matching("-m addrtype ! --src-type LOCAL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ips: &[&str], ingress: bool, egress: bool) -> Guarded {
        Guarded {
            pod: ObjectKey::new("x", name),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ingress,
            egress,
        }
    }

    fn bodies(chain: &Chain) -> Vec<String> {
        chain.rules.iter().map(|r| r.body.clone()).collect()
    }

    #[test]
    fn drops_by_address_in_each_isolated_direction() {
        let pods = [
            pod("a", &["10.0.0.5", "fd00::5"], true, false),
            pod("b", &["10.0.0.6"], true, true),
        ];
        let v4 = guard_chain(&RuleConfig::default(), IpFamily::V4, &pods);
        assert_eq!(v4.name, GUARD_CHAIN);
        let rules = bodies(&v4);
        assert_eq!(rules.len(), 3, "{rules:#?}");
        assert!(rules[0].contains("-d 10.0.0.5/32") && rules[0].ends_with("-j DROP"));
        assert!(rules[1].contains("-d 10.0.0.6/32"));
        assert!(rules[2].contains("-s 10.0.0.6/32"));
        assert!(rules.iter().all(|r| r.contains("interface not known yet")));
        let v6 = bodies(&guard_chain(&RuleConfig::default(), IpFamily::V6, &pods));
        // Neighbour discovery first, then pod a's one IPv6 address.
        assert_eq!(v6.len(), 5, "{v6:#?}");
        assert!(v6[..4]
            .iter()
            .all(|r| r.contains("icmpv6-type") && r.ends_with("-j RETURN")));
        assert!(v6[4].contains("-d fd00::5/128"));
    }

    #[test]
    fn reject_when_the_deny_action_says_so() {
        let cfg = RuleConfig {
            deny_action: super::super::DenyAction::Reject,
            ..RuleConfig::default()
        };
        let chain = guard_chain(&cfg, IpFamily::V4, &[pod("a", &["10.0.0.5"], true, false)]);
        assert!(
            chain.rules[0].body.contains("-j REJECT"),
            "{:?}",
            chain.rules
        );
    }

    #[test]
    fn traced_roles_name_the_pod() {
        let traced = guard_chain_traced(
            &RuleConfig::default(),
            IpFamily::V4,
            &[pod("a", &["10.0.0.5"], false, true)],
        );
        assert_eq!(traced.chain.rules.len(), 1);
        assert!(matches!(
            traced.rules.as_slice(),
            [RuleRole::GuardUnnamedPod {
                direction: Direction::Egress,
                ..
            }]
        ));
    }
}
