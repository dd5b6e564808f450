//! What a rule and a chain are for, in words: the text `explain` and `audit` print for a
//! [`ChainRole`] and a [`RuleRole`], and the readings of policy parts (peers, ports,
//! selectors, sets) it is made of. Kept apart from the roles themselves, which the renderers
//! fill in, so that the wording can grow without crowding the record.

use std::fmt;

use kube::core::Expression;

use crate::model::{
    LabelSel, NamespaceScope, ObjectKey, Peer, PolicyInfo, PolicyRule, PortMatch, PortSpec,
};
use crate::rules::sets::SetDef;

use super::*;

impl fmt::Display for ChainRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainRole::Kernel => f.write_str("kernel chain (our rules in it)"),
            ChainRole::Forward => f.write_str("static: pod traffic in FORWARD to the dispatch"),
            ChainRole::Input => f.write_str("static: pod-to-host traffic in INPUT"),
            ChainRole::WorkloadToHost => {
                f.write_str("static: egress policy of pods for traffic to their host")
            }
            ChainRole::Output => f.write_str("static: host-to-pod traffic in OUTPUT"),
            ChainRole::WorkloadStart => {
                f.write_str("static: the start of every workload chain (conntrack, marks cleared)")
            }
            ChainRole::Guard => f.write_str(
                "guard: isolated local pods whose interface is not known yet, by address",
            ),
            ChainRole::Pending => f.write_str(
                "guard: the node's pod ranges while auto has not seen how pods are wired",
            ),
            ChainRole::FromWorkloadDispatch { bin } => match bin {
                None => f.write_str("dispatch: traffic from pods to their egress chains"),
                Some(b) => write!(f, "dispatch: from pod interfaces {b}*"),
            },
            ChainRole::ToWorkloadDispatch { bin } => match bin {
                None => f.write_str("dispatch: traffic to pods to their ingress chains"),
                Some(b) => write!(f, "dispatch: to pod interfaces {b}*"),
            },
            ChainRole::ToWorkloadAddressDispatch => {
                f.write_str("dispatch: traffic routed into the bridge, by pod address")
            }
            ChainRole::Workload {
                pod,
                iface,
                direction,
            } => {
                let who = pod
                    .as_ref()
                    .map_or_else(|| "a local pod".to_string(), |p| format!("pod {p}"));
                write!(
                    f,
                    "workload: {} of {who} (interface {iface})",
                    direction.as_str()
                )
            }
            ChainRole::Policy { policy, direction } => {
                write!(f, "policy: NetworkPolicy {policy} {}", direction.as_str())
            }
            ChainRole::ClusterPolicy {
                name,
                tier,
                direction,
            } => write!(
                f,
                "policy: ClusterNetworkPolicy {name} (tier {}) {}",
                tier.as_str(),
                direction.as_str()
            ),
            ChainRole::Profile {
                namespace,
                direction,
            } => write!(
                f,
                "profile: namespace {namespace} {} (allow for pods no policy isolates)",
                direction.as_str()
            ),
            ChainRole::KubeIpvs(what) => write!(f, "static: kube-proxy {what}"),
        }
    }
}

/// A sentence for one rule. `policy` finds a policy to describe peers and ports with; `pod`
/// finds the pod owning an interface.
pub fn describe_rule<'a>(
    chain: &ChainRole,
    rule: &RuleRole,
    policy: &dyn Fn(&ObjectKey) -> Option<&'a PolicyInfo>,
    pod: &dyn Fn(&str) -> Option<&'a ObjectKey>,
) -> String {
    let iface_pod = |iface: &str| match pod(iface) {
        Some(p) => format!("{iface} (pod {p})"),
        None => iface.to_string(),
    };
    match rule {
        RuleRole::JumpToOurs => "jump into our chain".into(),
        RuleRole::AcceptAllowed => "accept what policy accepted (accept mark)".into(),
        RuleRole::ClearMarks => "clear the per-hop mark bits".into(),
        RuleRole::AcceptBridgedNeighbourDiscovery => {
            "accept bridged IPv6 neighbour discovery before policy".into()
        }
        RuleRole::FromWorkloads { prefix } => {
            format!("traffic from pod interfaces {prefix}* to the egress dispatch")
        }
        RuleRole::ToWorkloads { prefix } => {
            format!("traffic to pod interfaces {prefix}* to the ingress dispatch")
        }
        RuleRole::RoutedIntoBridge => {
            "traffic routed into the bridge to the address dispatch".into()
        }
        RuleRole::WorkloadToHost { prefix } => {
            format!("pod-to-host traffic from {prefix}* through cali-wl-to-host")
        }
        RuleRole::AcceptIcmpv6ToHost => "accept ICMPv6 a pod needs to reach its host".into(),
        RuleRole::HostEgressPolicy => "the pod's egress policy for traffic to its host".into(),
        RuleRole::EndpointToHostAction => {
            "FELIX_DEFAULTENDPOINTTOHOSTACTION after egress policy allowed".into()
        }
        RuleRole::HostToWorkloadNotPoliced => "host-to-pod traffic is not policed".into(),
        RuleRole::JumpToGuard => {
            "to the guard of isolated pods whose interface is not known yet".into()
        }
        RuleRole::GuardNeighbourDiscovery => "IPv6 neighbour discovery passes the guard".into(),
        RuleRole::JumpToPending { direction } => format!(
            "{} of the node's pod range to the pending guard (auto has not seen the wiring)",
            direction.as_str()
        ),
        RuleRole::PendingKnownPod => "a local pod the datastore knows passes".into(),
        RuleRole::PendingUnknownAddress { direction } => format!(
            "drop: {} of an address of the node's pod ranges that is no known pod, auto has not seen the wiring yet (fail-closed)",
            direction.as_str()
        ),
        RuleRole::GuardUnnamedPod { pod, direction } => format!(
            "drop: {} of pod {pod}, isolated by policy, interface not known yet (fail-closed)",
            direction.as_str()
        ),
        RuleRole::ToEndpoint { iface } => match chain {
            ChainRole::FromWorkloadDispatch { .. } => {
                format!("egress of interface {}", iface_pod(iface))
            }
            _ => format!("ingress of interface {}", iface_pod(iface)),
        },
        RuleRole::ToBin { prefix } => format!("interfaces {prefix}* to their dispatch chain"),
        RuleRole::UnknownInterface => "drop: interface of no local pod (fail-closed)".into(),
        RuleRole::ToEndpointByAddress { addr, iface } => {
            format!("traffic routed to {addr}: ingress of {}", iface_pod(iface))
        }
        RuleRole::UnknownAddress => "drop: routed to no local pod's address".into(),
        RuleRole::DenyLog => "deny log: NFLOG the packet the next rule drops (rate-limited)".into(),
        RuleRole::FlowLog => {
            "flow log: NFLOG the new connection the next rule decides (rate-limited per pod)".into()
        }
        RuleRole::DropSpoofedSource { own } => {
            if own.is_empty() {
                "anti-spoofing: drop, the pod has no address of this family".into()
            } else {
                let own: Vec<String> = own.iter().map(ToString::to_string).collect();
                format!(
                    "anti-spoofing: drop unless the source is the pod's ({})",
                    own.join(", ")
                )
            }
        }
        RuleRole::JumpToWorkloadStart => {
            "jump to the start shared by workload chains (conntrack, marks cleared)".into()
        }
        RuleRole::ReturnIfEstablished => {
            "return if the start marked the packet accepted (established or related)".into()
        }
        RuleRole::AcceptEstablished => "accept established and related connections".into(),
        RuleRole::MarkEstablished => "mark established and related connections accepted".into(),
        RuleRole::ReturnEstablished => "return established and related connections".into(),
        RuleRole::DropInvalid => "drop packets conntrack finds invalid".into(),
        RuleRole::ClearAcceptAndPass => "clear the accept and pass bits".into(),
        RuleRole::StartOfPolicies => "start of policies (the pod is isolated)".into(),
        RuleRole::JumpToPolicy { policy } => format!("jump to NetworkPolicy {policy}"),
        RuleRole::ReturnIfPolicyAccepted { policy } => {
            format!("return if NetworkPolicy {policy} accepted")
        }
        RuleRole::UnionAccept { set } => format!(
            "accept if the peer address and port are in {set}, the union of the NetworkPolicies' selector and numeric-port allows"
        ),
        RuleRole::ReturnIfUnionAccepted => "return if the union set accepted".into(),
        RuleRole::DropIfNoPolicyPassed => {
            "drop: isolated and no policy allowed (Drop if no policies passed packet)".into()
        }
        RuleRole::StartOfTier { tier } => format!("start of tier {tier}"),
        RuleRole::JumpToClusterPolicy { tier, name } => {
            format!("jump to ClusterNetworkPolicy {name} (tier {tier})")
        }
        RuleRole::ReturnIfClusterPolicyAccepted { tier, name } => {
            format!("return if ClusterNetworkPolicy {name} (tier {tier}) accepted")
        }
        RuleRole::JumpToProfile => "not isolated: to the namespace profile (allow)".into(),
        RuleRole::ReturnIfProfileAccepted => "return if the profile accepted".into(),
        RuleRole::DropIfNoProfileMatched => "drop if no profile matched".into(),
        RuleRole::ProfileAllow => "allow: no policy isolates the pod".into(),
        RuleRole::ProfileReturn => "return after the profile's allow".into(),
        RuleRole::PolicyDescription => {
            "no rule for this family: the chain only names the policy".into()
        }
        RuleRole::KubeIpvs(what) => format!("IPVS: {what}"),
        RuleRole::ClusterPolicy(c) => {
            let (name, direction) = match chain {
                ChainRole::ClusterPolicy {
                    name, direction, ..
                } => (name.as_str(), direction.as_str()),
                _ => ("?", "?"),
            };
            let label = c
                .name
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"));
            let action = c.action.as_str();
            match &c.step {
                ClusterStep::ReturnAfter => format!(
                    "ClusterNetworkPolicy {name} {direction} rule {}{label}: return after {action}",
                    c.rule
                ),
                ClusterStep::Match {
                    peer,
                    protocol,
                    ports,
                } => {
                    let proto = protocol.map_or_else(
                        || "every protocol".to_string(),
                        |p| p.as_str().to_ascii_uppercase(),
                    );
                    let ports = match ports {
                        ClusterPortsRole::Any => String::new(),
                        ClusterPortsRole::Numeric(r) => format!(
                            " ports {}",
                            r.iter()
                                .map(|(a, b)| if a == b {
                                    a.to_string()
                                } else {
                                    format!("{a}-{b}")
                                })
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                        ClusterPortsRole::Named(n) => format!(" named port {n}"),
                    };
                    format!(
                        "ClusterNetworkPolicy {name} {direction} rule {}{label}, peer {peer}, {proto}{ports}: {action}",
                        c.rule
                    )
                }
            }
        }
        RuleRole::Policy(p) => {
            let (key, direction) = match chain {
                ChainRole::Policy { policy, direction } => (Some(policy), *direction),
                _ => (None, Direction::Ingress),
            };
            let info = key.and_then(policy);
            describe_policy_rule(key, info, direction, p)
        }
    }
}

fn describe_policy_rule(
    key: Option<&ObjectKey>,
    info: Option<&PolicyInfo>,
    direction: Direction,
    p: &PolicyRuleRole,
) -> String {
    let name = key.map_or_else(String::new, |k| format!("{k} "));
    let rule = info.and_then(|i| policy_rule(i, direction, p.rule));
    let peer = match (p.peer, rule) {
        (None, _) => "any peer".to_string(),
        (Some(i), Some(r)) => match r.peers.as_ref().and_then(|ps| ps.get(i)) {
            Some(peer) => format!("peer {i} ({})", describe_peer(peer)),
            None => format!("peer {i}"),
        },
        (Some(i), None) => format!("peer {i}"),
    };
    let what = match &p.step {
        PolicyStep::ExceptStart => "ipBlock.except bookkeeping (set scratch)".to_string(),
        PolicyStep::ExceptClear { cidr } => format!("ipBlock.except {cidr} (clear scratch)"),
        PolicyStep::Allow { ports } => {
            let ports = match (ports, rule) {
                (PortsRole::AllProtocols, _) => "every port and protocol".to_string(),
                (other, Some(r)) => describe_port_entries(&r.ports, other.entries()),
                (other, None) => format!("ports {:?}", other.entries()),
            };
            format!("allow, {ports}")
        }
        PolicyStep::ReturnIfAllowed => "return if allowed".to_string(),
    };
    format!(
        "NetworkPolicy {name}{} rule {}, {peer}: {what}",
        direction.as_str(),
        p.rule
    )
}

/// The Kubernetes rule `index` of a policy direction.
pub fn policy_rule(info: &PolicyInfo, direction: Direction, index: usize) -> Option<&PolicyRule> {
    match direction {
        Direction::Ingress => info.ingress.as_ref()?.get(index),
        Direction::Egress => info.egress.as_ref()?.get(index),
    }
}

/// `port 1 (TCP 80), port 2 (TCP 8000-8080)`.
pub fn describe_port_entries(ports: &[PortSpec], entries: &[usize]) -> String {
    entries
        .iter()
        .map(|&i| match ports.get(i) {
            Some(spec) => format!("port {i} ({})", describe_port(spec)),
            None => format!("port {i}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `TCP 80`, `UDP 53-54`, `TCP named http`, `every SCTP port`.
pub fn describe_port(spec: &PortSpec) -> String {
    let proto = spec.protocol.as_str().to_ascii_uppercase();
    match &spec.port {
        PortMatch::Any => format!("every {proto} port"),
        PortMatch::Range { first, last } if first == last => format!("{proto} {first}"),
        PortMatch::Range { first, last } => format!("{proto} {first}-{last}"),
        PortMatch::Named(n) => format!("{proto} named port {n}"),
    }
}

/// What one of our sets holds: `IPs of pods app=web in namespace x`, `ip,port of the TCP
/// port named http of ...`.
pub fn describe_set(def: &SetDef) -> String {
    let pods = describe_peer(&Peer::Pods {
        namespaces: def.namespaces().clone(),
        pods: def.pods().clone(),
    });
    match def {
        SetDef::Selector { .. } => format!("addresses of {pods}"),
        SetDef::NamedPort {
            protocol,
            port_name,
            ..
        } => format!(
            "address,port of the {} port named {port_name} of {pods}",
            protocol.as_str().to_ascii_uppercase()
        ),
    }
}

/// `pods app=web in namespace x`, `ipBlock 10.0.0.0/8 except 10.1.0.0/16`.
pub fn describe_peer(peer: &Peer) -> String {
    match peer {
        Peer::IpBlock { cidr, except } if except.is_empty() => format!("ipBlock {cidr}"),
        Peer::IpBlock { cidr, except } => format!(
            "ipBlock {cidr} except {}",
            except
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Peer::Pods { namespaces, pods } => {
            let who = if pods.is_everything() {
                "every pod".to_string()
            } else {
                format!("pods {}", describe_selector(pods))
            };
            let where_ = match namespaces {
                NamespaceScope::Named(ns) => format!("in namespace {ns}"),
                NamespaceScope::Selector(s) if s.is_everything() => {
                    "in every namespace".to_string()
                }
                NamespaceScope::Selector(s) => {
                    format!("in namespaces {}", describe_selector(s))
                }
            };
            format!("{who} {where_}")
        }
    }
}

/// A selector as `kubectl` prints one: `app=web,tier in (a,b),!legacy`.
pub fn describe_selector(sel: &LabelSel) -> String {
    if sel.is_everything() {
        return "(everything)".to_string();
    }
    let join = |vals: &std::collections::BTreeSet<String>| {
        vals.iter().cloned().collect::<Vec<_>>().join(",")
    };
    sel.exprs()
        .iter()
        .map(|e| match e {
            Expression::Equal(k, v) => format!("{k}={v}"),
            Expression::NotEqual(k, v) => format!("{k}!={v}"),
            Expression::In(k, v) => format!("{k} in ({})", join(v)),
            Expression::NotIn(k, v) => format!("{k} notin ({})", join(v)),
            Expression::Exists(k) => k.clone(),
            Expression::DoesNotExist(k) => format!("!{k}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_and_ports_read_like_kubectl() {
        let peer = Peer::Pods {
            namespaces: NamespaceScope::Selector(LabelSel::from_exprs(vec![Expression::Equal(
                "team".into(),
                "a".into(),
            )])),
            pods: LabelSel::from_exprs(vec![
                Expression::Equal("app".into(), "web".into()),
                Expression::DoesNotExist("legacy".into()),
            ]),
        };
        assert_eq!(
            describe_peer(&peer),
            "pods app=web,!legacy in namespaces team=a"
        );
        let block = Peer::IpBlock {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec!["10.1.0.0/16".parse().unwrap()],
        };
        assert_eq!(
            describe_peer(&block),
            "ipBlock 10.0.0.0/8 except 10.1.0.0/16"
        );
        let ports = [
            PortSpec {
                protocol: Protocol::Tcp,
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
            PortSpec {
                protocol: Protocol::Sctp,
                port: PortMatch::Named("s".into()),
            },
        ];
        assert_eq!(
            describe_port_entries(&ports, &[0, 1, 2]),
            "port 0 (TCP 80), port 1 (UDP 53-54), port 2 (SCTP named port s)"
        );
    }
}
