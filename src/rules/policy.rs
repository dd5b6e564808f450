//! Per-policy chains (`cali-pi-` ingress, `cali-po-` egress).
//!
//! A policy is first *planned*: each Kubernetes rule becomes one planned rule per protocol ×
//! peer × port alternative, naming the IP sets it needs (`SetDef`s). The calc graph takes
//! the sets from the plan to keep their members; rendering turns the plan into iptables rules
//! for one IP family.
//!
//! Every planned rule is an allow: on a match it sets the accept bit and the next rule returns.
//! OR within a rule (several port lists, numeric and named ports) is expressed as several
//! allows instead of felix's mark blocks, which is equivalent for allow-only policies. The one
//! AND-NOT, `ipBlock.except`, uses felix's scratch-mark technique exactly as in the seed
//! article: set scratch0, clear it for each excepted CIDR, require it on the allow.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::model::{IpFamily, NamespaceScope, Peer, PolicyInfo, PolicyRule, PortMatch, Protocol};
use crate::rules::sets::SetDef;

use super::flow_log::{self, FlowAction, FlowPrefix};
use super::provenance::{
    traced, ChainRole, PolicyRuleRole, PolicyStep, PortsRole, Rendered, RuleList, RuleRole,
    TracedChain,
};
use super::{policy_chain, Action, Chain, Direction, Rule, RuleConfig};

/// multiport takes at most 15 ports; a range takes two of those slots.
const MULTIPORT_SLOTS: usize = 15;

/// Who the traffic comes from (ingress) or goes to (egress).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PlannedPeer {
    Any,
    Set(SetDef),
    Cidr { cidr: IpNet, except: Vec<IpNet> },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PlannedPorts {
    Any,
    /// Inclusive ranges, merged and sorted, that fit one multiport match.
    Numeric(Vec<(u16, u16)>),
    /// Destination `ip,proto:port` set of a named port.
    Named(SetDef),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlannedRule {
    pub protocol: Option<Protocol>,
    pub peer: PlannedPeer,
    pub ports: Vec<PlannedPorts>,
    /// The Kubernetes rule and peer this planned rule comes from (provenance only).
    pub source: RuleSource,
}

/// Where a planned rule comes from: the index of the Kubernetes rule in `spec.ingress` /
/// `spec.egress`, and of the peer in its `from` / `to` (`None`: the rule has no peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleSource {
    pub rule: usize,
    pub peer: Option<usize>,
}

/// The rules of one direction of a policy, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirectionPlan {
    pub rules: Vec<PlannedRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyPlan {
    pub ingress: Option<DirectionPlan>,
    pub egress: Option<DirectionPlan>,
}

impl PolicyPlan {
    /// Every set the policy's chains reference, deduplicated, in a stable order.
    pub fn set_defs(&self) -> Vec<SetDef> {
        let mut defs: Vec<SetDef> = [&self.ingress, &self.egress]
            .into_iter()
            .flatten()
            .flat_map(|d| d.rules.iter())
            .flat_map(|r| {
                let peer = match &r.peer {
                    PlannedPeer::Set(d) => Some(d.clone()),
                    _ => None,
                };
                let ports = r.ports.iter().filter_map(|p| match p {
                    PlannedPorts::Named(d) => Some(d.clone()),
                    _ => None,
                });
                peer.into_iter().chain(ports)
            })
            .collect();
        defs.sort();
        defs.dedup();
        defs
    }
}

pub fn plan_policy(policy: &PolicyInfo) -> PolicyPlan {
    let direction = |rules: &Option<Vec<PolicyRule>>, dir: Direction| {
        rules.as_ref().map(|rules| DirectionPlan {
            rules: rules
                .iter()
                .enumerate()
                .flat_map(|(i, r)| plan_rule(policy, i, r, dir))
                .collect(),
        })
    };
    PolicyPlan {
        ingress: direction(&policy.ingress, Direction::Ingress),
        egress: direction(&policy.egress, Direction::Egress),
    }
}

#[derive(Default)]
struct ProtocolPorts {
    any: bool,
    ranges: Vec<(u16, u16)>,
    names: Vec<String>,
}

fn plan_rule(
    policy: &PolicyInfo,
    index: usize,
    rule: &PolicyRule,
    dir: Direction,
) -> Vec<PlannedRule> {
    // Ports grouped by protocol; no ports at all means every protocol and port.
    let mut groups: BTreeMap<Option<Protocol>, ProtocolPorts> = BTreeMap::new();
    if rule.ports.is_empty() {
        groups.insert(
            None,
            ProtocolPorts {
                any: true,
                ..ProtocolPorts::default()
            },
        );
    }
    for spec in &rule.ports {
        let group = groups.entry(Some(spec.protocol)).or_default();
        match &spec.port {
            PortMatch::Any => group.any = true,
            PortMatch::Range { first, last } => group.ranges.push((*first, *last)),
            PortMatch::Named(n) => group.names.push(n.clone()),
        }
    }

    let peers: Vec<&Peer> = rule.peers.iter().flatten().collect();
    let mut planned = Vec::new();
    for (protocol, group) in groups {
        let port_alternatives = |peer: Option<&Peer>| -> Vec<PlannedPorts> {
            if group.any {
                // An entry without a port allows the whole protocol, whatever else is listed.
                return vec![PlannedPorts::Any];
            }
            let mut alts: Vec<PlannedPorts> = split_multiport(merge_ranges(&group.ranges))
                .into_iter()
                .map(PlannedPorts::Numeric)
                .collect();
            let mut names = group.names.clone();
            names.sort();
            names.dedup();
            for name in names {
                let protocol = protocol.unwrap_or(Protocol::Tcp);
                alts.push(PlannedPorts::Named(named_port_set(
                    policy, peer, dir, protocol, name,
                )));
            }
            alts
        };
        if peers.is_empty() {
            planned.push(PlannedRule {
                protocol,
                peer: PlannedPeer::Any,
                ports: port_alternatives(None),
                source: RuleSource {
                    rule: index,
                    peer: None,
                },
            });
            continue;
        }
        for (peer_index, peer) in peers.iter().enumerate() {
            let ports = port_alternatives(Some(peer));
            let planned_peer = match peer {
                Peer::IpBlock { cidr, except } => PlannedPeer::Cidr {
                    cidr: *cidr,
                    except: except.clone(),
                },
                // An egress named port set already holds only the peer's pods.
                Peer::Pods { .. }
                    if dir == Direction::Egress
                        && ports.iter().all(|p| matches!(p, PlannedPorts::Named(_))) =>
                {
                    PlannedPeer::Any
                }
                Peer::Pods { namespaces, pods } => PlannedPeer::Set(SetDef::Selector {
                    namespaces: namespaces.clone(),
                    pods: pods.clone(),
                }),
            };
            planned.push(PlannedRule {
                protocol,
                peer: planned_peer,
                ports,
                source: RuleSource {
                    rule: index,
                    peer: Some(peer_index),
                },
            });
        }
    }
    planned
}

/// The destination pods that can own the named port: for ingress the pods the policy
/// selects; for egress the peer's pods, or every pod when the peer is an ipBlock or anyone.
fn named_port_set(
    policy: &PolicyInfo,
    peer: Option<&Peer>,
    dir: Direction,
    protocol: Protocol,
    port_name: String,
) -> SetDef {
    let (namespaces, pods) = match (dir, peer) {
        (Direction::Ingress, _) => (
            NamespaceScope::Named(policy.key.namespace.clone()),
            policy.pod_selector.clone(),
        ),
        (Direction::Egress, Some(Peer::Pods { namespaces, pods })) => {
            (namespaces.clone(), pods.clone())
        }
        (Direction::Egress, _) => (
            NamespaceScope::Selector(Default::default()),
            Default::default(),
        ),
    };
    SetDef::NamedPort {
        namespaces,
        pods,
        protocol,
        port_name,
    }
}

pub(super) fn merge_ranges(ranges: &[(u16, u16)]) -> Vec<(u16, u16)> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut merged: Vec<(u16, u16)> = Vec::new();
    for (first, last) in sorted {
        match merged.last_mut() {
            Some(prev) if u32::from(first) <= u32::from(prev.1) + 1 => prev.1 = prev.1.max(last),
            _ => merged.push((first, last)),
        }
    }
    merged
}

pub(super) fn split_multiport(ranges: Vec<(u16, u16)>) -> Vec<Vec<(u16, u16)>> {
    let mut chunks: Vec<Vec<(u16, u16)>> = Vec::new();
    let mut used = MULTIPORT_SLOTS;
    for range in ranges {
        let slots = if range.0 == range.1 { 1 } else { 2 };
        if used + slots > MULTIPORT_SLOTS {
            chunks.push(Vec::new());
            used = 0;
        }
        used += slots;
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(range);
        }
    }
    chunks
}

/// Renders the chains of an *active* policy for one family; `set_name` maps a set to its
/// kernel name in that family.
pub fn policy_chains(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &PolicyInfo,
    plan: &PolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
) -> Vec<Chain> {
    render_policy(cfg, family, policy, plan, set_name, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`policy_chains`] with provenance: for each rule, the Kubernetes rule, peer, protocol and
/// port entries it implements (the same chains, byte for byte).
pub fn policy_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &PolicyInfo,
    plan: &PolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
) -> Vec<TracedChain> {
    traced(render_policy(cfg, family, policy, plan, set_name, true))
}

fn render_policy(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &PolicyInfo,
    plan: &PolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
    traced: bool,
) -> Vec<Rendered> {
    let mut chains = Vec::new();
    for (dir, dplan, krules) in [
        (Direction::Ingress, &plan.ingress, &policy.ingress),
        (Direction::Egress, &plan.egress, &policy.egress),
    ] {
        let Some(dplan) = dplan else { continue };
        let name = policy_chain(dir, &policy.key.namespace, &policy.key.name);
        let mut rules = RuleList::new(traced);
        for rule in &dplan.rules {
            let source = krules.as_ref().and_then(|r| r.get(rule.source.rule));
            render_rule(cfg, family, dir, &name, rule, source, set_name, &mut rules);
        }
        let description = format!(
            "KubernetesNetworkPolicy {}/{} {}",
            policy.key.namespace,
            policy.key.name,
            dir.as_str()
        );
        match rules.rules.first_mut() {
            Some(first) => first.comments.insert(0, description),
            // No rule (or none for this family): the chain only carries its description, so
            // the endpoint chain's "Drop if no policies passed packet" applies.
            None => rules.push(
                Rule {
                    action: Some(Action::None),
                    ..Rule::default().comment(description)
                },
                || RuleRole::PolicyDescription,
            ),
        }
        chains.push(rules.finish(name, family, || ChainRole::Policy {
            policy: policy.key.clone(),
            direction: dir,
        }));
    }
    chains
}

/// The port entries (indices in the Kubernetes rule's `ports`) a port alternative implements.
fn ports_role(
    protocol: Option<Protocol>,
    ports: &PlannedPorts,
    source: Option<&PolicyRule>,
) -> PortsRole {
    let Some(protocol) = protocol else {
        return PortsRole::AllProtocols;
    };
    let specs = source.map(|r| r.ports.as_slice()).unwrap_or_default();
    let of_protocol = || {
        specs
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.protocol == protocol)
    };
    match ports {
        PlannedPorts::Any => PortsRole::AllPorts {
            entries: of_protocol().map(|(i, _)| i).collect(),
        },
        PlannedPorts::Numeric(ranges) => PortsRole::Numeric {
            entries: of_protocol()
                .filter(|(_, s)| match s.port {
                    PortMatch::Range { first, last } => {
                        ranges.iter().any(|(a, b)| *a <= first && last <= *b)
                    }
                    _ => false,
                })
                .map(|(i, _)| i)
                .collect(),
        },
        PlannedPorts::Named(def) => {
            let name = match def {
                SetDef::NamedPort { port_name, .. } => port_name.clone(),
                SetDef::Selector { .. } => String::new(),
            };
            PortsRole::Named {
                entries: of_protocol()
                    .filter(|(_, s)| s.port == PortMatch::Named(name.clone()))
                    .map(|(i, _)| i)
                    .collect(),
                name,
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn render_rule(
    cfg: &RuleConfig,
    family: IpFamily,
    dir: Direction,
    chain: &str,
    rule: &PlannedRule,
    source: Option<&PolicyRule>,
    set_name: &dyn Fn(&SetDef) -> String,
    out: &mut RuleList,
) {
    let marks = cfg.marks;
    let role = |step: PolicyStep| {
        RuleRole::Policy(PolicyRuleRole {
            rule: rule.source.rule,
            peer: rule.source.peer,
            protocol: rule.protocol,
            step,
        })
    };
    let peer_side = match dir {
        Direction::Ingress => "src",
        Direction::Egress => "dst",
    };
    let mut base = Rule {
        protocol: rule.protocol.map(Protocol::as_str),
        ..Rule::new(Action::SetMark {
            value: marks.accept,
            mask: marks.accept,
        })
    };
    match &rule.peer {
        PlannedPeer::Any => {}
        PlannedPeer::Set(def) => {
            base.matches
                .push(format!("-m set --match-set {} {peer_side}", set_name(def)));
        }
        PlannedPeer::Cidr { cidr, except } => {
            if IpFamily::of_net(cidr) != family {
                return;
            }
            match dir {
                Direction::Ingress => base.src = Some(*cidr),
                Direction::Egress => base.dst = Some(*cidr),
            }
            if !except.is_empty() {
                // scratch0 = "not in an excepted CIDR"; scratch1 is cleared with it, as felix does.
                out.push(
                    Rule::new(Action::SetMark {
                        value: marks.scratch0,
                        mask: marks.scratch0 | marks.scratch1,
                    }),
                    || role(PolicyStep::ExceptStart),
                );
                for ex in except {
                    let mut clear = Rule::new(Action::SetMark {
                        value: 0,
                        mask: marks.scratch0,
                    });
                    match dir {
                        Direction::Ingress => clear.src = Some(*ex),
                        Direction::Egress => clear.dst = Some(*ex),
                    }
                    out.push(clear, || role(PolicyStep::ExceptClear { cidr: *ex }));
                }
            }
        }
    }
    let needs_scratch =
        matches!(&rule.peer, PlannedPeer::Cidr { except, .. } if !except.is_empty());
    for ports in &rule.ports {
        let mut allow = base.clone();
        match ports {
            PlannedPorts::Any => {}
            PlannedPorts::Numeric(ranges) => {
                let list: Vec<String> = ranges
                    .iter()
                    .map(|(a, b)| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}:{b}")
                        }
                    })
                    .collect();
                allow
                    .matches
                    .push(format!("-m multiport --dports {}", list.join(",")));
            }
            PlannedPorts::Named(def) => {
                allow
                    .matches
                    .push(format!("-m set --match-set {} dst,dst", set_name(def)));
            }
        }
        if needs_scratch {
            allow = allow.mark_match(marks.scratch0, marks.scratch0);
        }
        // Flow logs: the copy before the allow matches exactly what the allow matches.
        flow_log::push_with_copy(
            out,
            cfg.flow_log.as_ref(),
            allow,
            || FlowPrefix {
                action: FlowAction::Allow,
                direction: dir,
                rule: Some(rule.source.rule),
                chain: chain.to_string(),
            },
            || {
                role(PolicyStep::Allow {
                    ports: ports_role(rule.protocol, ports, source),
                })
            },
        );
        out.push(
            Rule::new(Action::Return).mark_match(marks.accept, marks.accept),
            || role(PolicyStep::ReturnIfAllowed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSel, ObjectKey, PortSpec};
    use kube::core::Expression;

    fn policy(ingress: Vec<PolicyRule>) -> PolicyInfo {
        PolicyInfo {
            key: ObjectKey::new("ns", "p"),
            pod_selector: LabelSel::everything(),
            ingress: Some(ingress),
            egress: None,
        }
    }

    fn render(p: &PolicyInfo, family: IpFamily) -> Vec<String> {
        let plan = plan_policy(p);
        let chains = policy_chains(&RuleConfig::default(), family, p, &plan, &|d| {
            format!("SET-{}", &d.id()[2..6])
        });
        chains[0]
            .rules
            .iter()
            .map(|r| {
                let hash = format!("-m comment --comment \"cali:{}\" ", r.hash);
                r.body.replace(&hash, "")
            })
            .collect()
    }

    fn tcp(first: u16, last: u16) -> PortSpec {
        PortSpec {
            protocol: Protocol::Tcp,
            port: PortMatch::Range { first, last },
        }
    }

    #[test]
    fn ranges_merge_and_split_at_fifteen_slots() {
        assert_eq!(
            merge_ranges(&[(80, 80), (81, 81), (83, 90), (85, 86)]),
            [(80, 81), (83, 90)]
        );
        let singles: Vec<(u16, u16)> = (1..=16).map(|p| (p * 2, p * 2)).collect();
        let chunks = split_multiport(singles);
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [15, 1]);
        let ranges: Vec<(u16, u16)> = (1..=8).map(|p| (p * 10, p * 10 + 1)).collect();
        assert_eq!(
            split_multiport(ranges)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [7, 1]
        );
    }

    #[test]
    fn protocol_only_entry_allows_every_port_of_it() {
        let p = policy(vec![PolicyRule {
            ports: vec![
                tcp(80, 80),
                PortSpec {
                    protocol: Protocol::Tcp,
                    port: PortMatch::Any,
                },
            ],
            peers: None,
        }]);
        let body = render(&p, IpFamily::V4);
        assert_eq!(body.len(), 2);
        assert!(
            body[0].starts_with(
                "-p tcp -m comment --comment \"KubernetesNetworkPolicy ns/p ingress\" -j MARK"
            ),
            "{}",
            body[0]
        );
    }

    #[test]
    fn sctp_and_udp_rules_name_their_protocol() {
        let p = policy(vec![PolicyRule {
            ports: vec![
                PortSpec {
                    protocol: Protocol::Sctp,
                    port: PortMatch::Range {
                        first: 80,
                        last: 80,
                    },
                },
                PortSpec {
                    protocol: Protocol::Udp,
                    port: PortMatch::Range {
                        first: 53,
                        last: 54,
                    },
                },
            ],
            peers: None,
        }]);
        let body = render(&p, IpFamily::V4);
        assert!(body[0].starts_with("-p udp "), "{}", body[0]);
        assert!(body[0].contains("-m multiport --dports 53:54"));
        assert!(body[2].starts_with("-p sctp ") && body[2].contains("--dports 80"));
        assert!(!body.iter().any(|b| b.contains("-p tcp")));
    }

    #[test]
    fn empty_rules_leave_a_comment_only_chain() {
        let body = render(&policy(vec![]), IpFamily::V4);
        assert_eq!(
            body,
            ["-m comment --comment \"KubernetesNetworkPolicy ns/p ingress\""]
        );
    }

    #[test]
    fn ip_blocks_of_the_other_family_never_widen_the_rule() {
        let p = policy(vec![PolicyRule {
            ports: vec![],
            peers: Some(vec![Peer::IpBlock {
                cidr: "fd00::/64".parse().unwrap(),
                except: vec![],
            }]),
        }]);
        assert_eq!(
            render(&p, IpFamily::V4).len(),
            1,
            "only the description rule"
        );
        let v6 = render(&p, IpFamily::V6);
        assert!(v6[0].starts_with("-s fd00::/64 "));
    }

    #[test]
    fn named_ports_use_dst_sets_and_egress_pod_peers_fold_into_them() {
        let peer = Peer::Pods {
            namespaces: NamespaceScope::Named("ns".into()),
            pods: LabelSel::from_exprs(vec![Expression::Equal("a".into(), "b".into())]),
        };
        let rule = PolicyRule {
            ports: vec![
                PortSpec {
                    protocol: Protocol::Tcp,
                    port: PortMatch::Named("http".into()),
                },
                tcp(443, 443),
            ],
            peers: Some(vec![peer.clone()]),
        };
        let ingress = plan_policy(&policy(vec![rule.clone()]));
        let irules = &ingress.ingress.as_ref().unwrap().rules;
        assert!(matches!(irules[0].peer, PlannedPeer::Set(_)));
        assert_eq!(irules[0].ports.len(), 2);
        let egress_only_named = PolicyInfo {
            ingress: None,
            egress: Some(vec![PolicyRule {
                ports: vec![rule.ports[0].clone()],
                peers: Some(vec![peer]),
            }]),
            ..policy(vec![])
        };
        let eplan = plan_policy(&egress_only_named);
        let erule = &eplan.egress.as_ref().unwrap().rules[0];
        assert_eq!(erule.peer, PlannedPeer::Any);
        match &erule.ports[0] {
            PlannedPorts::Named(SetDef::NamedPort { pods, .. }) => assert!(!pods.is_everything()),
            other => panic!("{other:?}"),
        }
        assert_eq!(eplan.set_defs().len(), 1);
    }
}
