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
//! # While auto has not seen the node's wiring
//!
//! The guard above needs a pod's address, which the datastore learns only when kubelet
//! reports it: after the CNI has wired the pod, and the pod may already be listening. On a
//! node whose wiring `FELIX_INTERFACENAMESCHEME=auto` has not seen yet there are no dispatch
//! chains either, so a pod wired there answered anyone until its address reached the agent
//! (a real cluster's join, 2 of 41 probes). So while the wiring is pending
//! (`RuleConfig::pending`), traffic to or from the node's pod address ranges (the Node's
//! `spec.podCIDRs`, when known) and traffic out of or into an interface with a configured
//! prefix (`FELIX_INTERFACEPREFIX`, `cali` by default: CNIs whose IPAM ignores the ranges name
//! their veths so) meets the pending chains: `cali-FORWARD` jumps to `cali-wl-pending-to` for
//! each range as destination and each prefix as output interface, and to
//! `cali-wl-pending-from` for each as source or input; `cali-INPUT` (and, in IPVS mode,
//! `cali-OUTPUT`) likewise, only for traffic whose source is not the host's own, so the host's
//! own addresses in a range (the bridge's gateway) never meet them. Each chain returns for the
//! addresses of the local pods the datastore knows (the guard has already held the isolated
//! ones) and drops the rest. Known pods no policy isolates keep working even if auto never
//! sees the wiring.
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
/// Traffic to an address of the node's pod ranges while auto's wiring is pending.
pub const PENDING_TO_CHAIN: &str = "cali-wl-pending-to";
/// Traffic from an address of the node's pod ranges while auto's wiring is pending.
pub const PENDING_FROM_CHAIN: &str = "cali-wl-pending-from";
/// Only traffic the host did not send itself (its own addresses in a pod range are its).
const NOT_FROM_HOST: &str = "-m addrtype ! --src-type LOCAL";

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
    neighbour_discovery(family, &mut rules);
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

fn neighbour_discovery(family: IpFamily, rules: &mut RuleList) {
    if family != IpFamily::V6 {
        return;
    }
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

/// What auto's pending state closes (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingWiring {
    /// The node's pod address ranges (its Node's `spec.podCIDRs`); empty when not known.
    pub pod_cidrs: Vec<IpNet>,
    /// The configured interface prefixes (`FELIX_INTERFACEPREFIX`): a pod on an interface
    /// named so is covered whatever its address.
    pub prefixes: Vec<String>,
}

/// Whether the pending chains are rendered (for some family).
pub fn is_pending(cfg: &RuleConfig) -> bool {
    cfg.pending
        .as_ref()
        .is_some_and(|p| !p.pod_cidrs.is_empty() || !p.prefixes.is_empty())
}

/// The pending chains' jumps for `family` and `direction` (ingress: to
/// `cali-wl-pending-to`, by destination range or output interface; egress: to
/// `cali-wl-pending-from`, by source range or input interface), without their hook's extra
/// matches.
fn pending_jumps(cfg: &RuleConfig, family: IpFamily, direction: Direction) -> Vec<Rule> {
    let Some(p) = &cfg.pending else {
        return Vec::new();
    };
    let target = match direction {
        Direction::Ingress => PENDING_TO_CHAIN,
        Direction::Egress => PENDING_FROM_CHAIN,
    };
    let jump = || Rule::new(Action::Jump(target.into()));
    let ranges = p
        .pod_cidrs
        .iter()
        .filter(|n| IpFamily::of(&n.addr()) == family)
        .map(|&net| match direction {
            Direction::Ingress => Rule {
                dst: Some(net),
                ..jump()
            },
            Direction::Egress => Rule {
                src: Some(net),
                ..jump()
            },
        });
    let ifaces = p.prefixes.iter().map(|prefix| match direction {
        Direction::Ingress => jump().out_iface(format!("{prefix}+")),
        Direction::Egress => jump().in_iface(format!("{prefix}+")),
    });
    ranges.chain(ifaces).collect()
}

/// `cali-wl-pending-to` and `cali-wl-pending-from` for `family`, when auto's wiring is pending
/// and something of the family is covered (a pod range of it, or a prefix; otherwise none):
/// each returns for `known`, the addresses of the local pods the datastore knows, and drops
/// the rest.
pub fn pending_chains(cfg: &RuleConfig, family: IpFamily, known: &[IpAddr]) -> Vec<Chain> {
    render_pending(cfg, family, known, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`pending_chains`] with what each rule is for.
pub fn pending_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    known: &[IpAddr],
) -> Vec<TracedChain> {
    super::provenance::traced(render_pending(cfg, family, known, true))
}

fn render_pending(
    cfg: &RuleConfig,
    family: IpFamily,
    known: &[IpAddr],
    traced: bool,
) -> Vec<Rendered> {
    if pending_jumps(cfg, family, Direction::Ingress).is_empty() {
        return Vec::new();
    }
    [
        (PENDING_TO_CHAIN, Direction::Ingress),
        (PENDING_FROM_CHAIN, Direction::Egress),
    ]
    .into_iter()
    .map(|(name, direction)| {
        let mut rules = RuleList::new(traced);
        neighbour_discovery(family, &mut rules);
        for ip in known.iter().filter(|ip| IpFamily::of(ip) == family) {
            let net = Some(IpNet::from(*ip));
            let rule = match direction {
                Direction::Ingress => Rule {
                    dst: net,
                    ..Rule::new(Action::Return)
                },
                Direction::Egress => Rule {
                    src: net,
                    ..Rule::new(Action::Return)
                },
            };
            rules.push(rule, || RuleRole::PendingKnownPod);
        }
        rules.push(
            Rule::new(deny(cfg))
                .comment("Address of no known pod: auto has not seen the wiring yet"),
            || RuleRole::PendingUnknownAddress { direction },
        );
        rules.finish(name, family, || ChainRole::Pending)
    })
    .collect()
}

/// The jumps into the pending chains in `cali-FORWARD`: per pod range of `family` and per
/// prefix, traffic to it and traffic from it.
pub(crate) fn pending_forward_jumps(cfg: &RuleConfig, family: IpFamily, out: &mut RuleList) {
    for direction in [Direction::Ingress, Direction::Egress] {
        for rule in pending_jumps(cfg, family, direction) {
            out.push(rule, || RuleRole::JumpToPending { direction });
        }
    }
}

/// The jumps in `cali-INPUT` (pods to their host: egress) or, in IPVS mode, `cali-OUTPUT`
/// (what IPVS forwards to pods: ingress), for traffic the host did not send itself.
pub(crate) fn pending_host_jumps(
    cfg: &RuleConfig,
    family: IpFamily,
    direction: Direction,
    out: &mut RuleList,
) {
    for rule in pending_jumps(cfg, family, direction) {
        out.push(rule.matching(NOT_FROM_HOST), || RuleRole::JumpToPending {
            direction,
        });
    }
}

/// The jump into the guard, first in `cali-FORWARD` and `cali-INPUT`.
pub(crate) fn jump() -> Rule {
    Rule::new(Action::Jump(GUARD_CHAIN.into()))
}

/// The jump in `cali-OUTPUT` (IPVS mode): only traffic whose source is not the host's, which
/// is what IPVS forwards for pods; host-to-pod traffic (kubelet probes) is never policed.
pub(crate) fn output_jump() -> Rule {
    jump().matching(NOT_FROM_HOST)
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

    fn pending(cidrs: &[&str], prefixes: &[&str]) -> RuleConfig {
        RuleConfig {
            interface_prefixes: Vec::new(),
            pending: Some(PendingWiring {
                pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
                prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            }),
            ..RuleConfig::default()
        }
    }

    fn pending_cfg() -> RuleConfig {
        pending(&["10.77.0.0/24", "fd77::/64"], &[])
    }

    #[test]
    fn pending_chains_pass_known_pods_and_drop_the_rest_of_the_ranges() {
        let known: Vec<IpAddr> = vec!["10.77.0.5".parse().unwrap(), "fd77::5".parse().unwrap()];
        let v4 = pending_chains(&pending_cfg(), IpFamily::V4, &known);
        let names: Vec<&str> = v4.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [PENDING_TO_CHAIN, PENDING_FROM_CHAIN]);
        let to = bodies(&v4[0]);
        assert_eq!(to.len(), 2, "{to:#?}");
        assert!(to[0].starts_with("-d 10.77.0.5/32") && to[0].ends_with("-j RETURN"));
        assert!(
            to[1].ends_with("-j DROP") && !to[1].contains("-d "),
            "{to:#?}"
        );
        let from = bodies(&v4[1]);
        assert!(from[0].starts_with("-s 10.77.0.5/32") && from[0].ends_with("-j RETURN"));
        // IPv6: neighbour discovery first, then the one known address, then the drop.
        let v6 = pending_chains(&pending_cfg(), IpFamily::V6, &known);
        let to6 = bodies(&v6[0]);
        assert_eq!(to6.len(), 6, "{to6:#?}");
        assert!(to6[4].starts_with("-d fd77::5/128"));
        // No ranges (auto's wiring seen, or the node's ranges unknown): nothing.
        assert!(pending_chains(&RuleConfig::default(), IpFamily::V4, &known).is_empty());
        let v4_only = pending(&["10.77.0.0/24"], &[]);
        assert!(pending_chains(&v4_only, IpFamily::V6, &known).is_empty());
        // A prefix covers every family.
        let prefix_only = pending(&[], &["cali"]);
        assert!(is_pending(&prefix_only));
        assert_eq!(pending_chains(&prefix_only, IpFamily::V6, &known).len(), 2);
        assert!(!is_pending(&pending(&[], &[])));
    }

    #[test]
    fn pending_jumps_per_range_and_never_for_the_hosts_own_traffic() {
        let forward_jumps = |cfg: &RuleConfig| {
            let mut forward = RuleList::new(false);
            pending_forward_jumps(cfg, IpFamily::V4, &mut forward);
            bodies(
                &forward
                    .finish("cali-FORWARD", IpFamily::V4, || ChainRole::Forward)
                    .0,
            )
        };
        let cfg = pending_cfg();
        let rules = forward_jumps(&cfg);
        assert_eq!(rules.len(), 2, "{rules:#?}");
        assert!(rules[0].starts_with("-d 10.77.0.0/24") && rules[0].ends_with(PENDING_TO_CHAIN));
        assert!(rules[1].starts_with("-s 10.77.0.0/24") && rules[1].ends_with(PENDING_FROM_CHAIN));
        let mut input = RuleList::new(false);
        pending_host_jumps(&cfg, IpFamily::V6, Direction::Egress, &mut input);
        let (rendered, _) = input.finish("cali-INPUT", IpFamily::V6, || ChainRole::Input);
        let rules = bodies(&rendered);
        assert_eq!(rules.len(), 1, "{rules:#?}");
        assert!(rules[0].starts_with("-s fd77::/64"));
        assert!(rules[0].contains("--src-type LOCAL") && rules[0].ends_with(PENDING_FROM_CHAIN));

        // Prefixes: by interface, after the ranges.
        let rules = forward_jumps(&pending(&["10.77.0.0/24"], &["cali"]));
        assert_eq!(rules.len(), 4, "{rules:#?}");
        assert!(rules[1].starts_with("-o cali+") && rules[1].ends_with(PENDING_TO_CHAIN));
        assert!(rules[3].starts_with("-i cali+") && rules[3].ends_with(PENDING_FROM_CHAIN));
    }
}
