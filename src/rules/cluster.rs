//! ClusterNetworkPolicy chains (`cali-pi-kcnp/<name>` ingress, `cali-po-kcnp/<name>`
//! egress) and where they sit in a workload chain.
//!
//! Naming follows felix v3.32, which converts a ClusterNetworkPolicy into a policy of kind
//! `KubernetesClusterNetworkPolicy` (short kind `kcnp`) in the tier `kube-admin` or
//! `kube-baseline`: the chain suffix is the policy ID `kcnp/<name>` (cluster-scoped, so no
//! namespace), length-limited like every policy chain (`cali-pi-_<19 hash characters>` past
//! 28 characters), and the chain's first rule carries
//! `KubernetesClusterNetworkPolicy <name> ingress|egress`.
//!
//! Like the NetworkPolicy plans in `policy`, a policy is first planned (each API rule becomes
//! the alternatives protocol × peer × port list that match it, naming the IP sets they need),
//! then rendered per family. Unlike those, the rules have three actions and their order is
//! the semantics: the first API rule that matches decides. Each alternative carries the
//! rule's action; an API rule ends with one return for Accept and Pass, so nothing after it
//! runs once it matched:
//! - Accept: set the accept bit; `-m mark --mark accept -j RETURN` after the rule. The
//!   workload chain then returns ("Return if policy accepted"), final for the direction.
//! - Deny: the configured deny action (`FELIX_IPTABLESFILTERDENYACTION`, DROP by default;
//!   upstream's suite requires a drop), final.
//! - Pass: set the pass bit and return; the workload chain's later jumps in the tier are
//!   guarded by `-m mark --mark 0/pass`, and the next tier starts by clearing it.
//!
//! Named ports (`destinationNamedPort`) carry no protocol: the container port's own protocol
//! is part of the match. They render as one `hash:ip,port` set per protocol (felix's named
//! port sets, `cali40n:`) over the destination pods (egress: the peer's pods, which then
//! need no peer match of their own; ingress: the subject's pods), one alternative each.
//! `networks` render one `-d <cidr>` alternative per CIDR of the chain's family.

use ipnet::IpNet;

use crate::model::{
    ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule, IpFamily, NamespaceScope,
    PodSelection, Protocol, RuleAction,
};
use crate::rules::sets::SetDef;

use super::deny_log::{logged_drop, DropKind};
use super::flow_log::{FlowAction, FlowPrefix};
use super::policy::{merge_ranges, split_multiport};
use super::provenance::{
    traced, ChainRole, ClusterPortsRole, ClusterRuleRole, ClusterStep, Rendered, RuleRole,
    TracedChain,
};
use super::{
    deny, length_limited_name, Action, Chain, Direction, Rule, RuleConfig, MAX_CHAIN_NAME_LEN,
    POLICY_EGRESS_PREFIX, POLICY_INGRESS_PREFIX,
};

/// felix's tier names for the two ClusterNetworkPolicy tiers.
pub const ADMIN_TIER_NAME: &str = "kube-admin";
pub const BASELINE_TIER_NAME: &str = "kube-baseline";

/// felix's short kind in policy IDs.
const KIND_SHORT: &str = "kcnp";
/// felix's kind name, in the chain description.
const KIND_LONG: &str = "KubernetesClusterNetworkPolicy";

/// Protocols a named port may resolve to.
const NAMED_PORT_PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// `cali-pi-kcnp/<name>` / `cali-po-kcnp/<name>`, length-limited.
pub fn cluster_policy_chain(direction: Direction, name: &str) -> String {
    let prefix = match direction {
        Direction::Ingress => POLICY_INGRESS_PREFIX,
        Direction::Egress => POLICY_EGRESS_PREFIX,
    };
    length_limited_name(prefix, &format!("{KIND_SHORT}/{name}"), MAX_CHAIN_NAME_LEN)
}

/// Who the other end is, in one alternative.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerMatch {
    Any,
    Set(SetDef),
    Net(IpNet),
}

/// Which ports, in one alternative.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PortsMatch {
    Any,
    /// Inclusive ranges that fit one multiport match.
    Numeric(Vec<(u16, u16)>),
    /// `ip,proto:port` of the destination pods' container port of that name.
    Named(SetDef),
}

/// One way an API rule can match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Alternative {
    /// The peer it implements (index in the API rule's `from` / `to`).
    pub peer_index: usize,
    pub protocol: Option<Protocol>,
    pub peer: PeerMatch,
    pub ports: PortsMatch,
}

/// One API rule, planned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlannedClusterRule {
    /// Position in `spec.ingress` / `spec.egress`.
    pub index: usize,
    pub name: Option<String>,
    /// What a match does; a fail-closed Pass is planned as Deny.
    pub action: RuleAction,
    /// Matches when any alternative does; empty matches nothing.
    pub alternatives: Vec<Alternative>,
    /// Set when a peer with no known field turned the rule into a deny of everything.
    pub fail_closed: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterPolicyPlan {
    /// `None` when the policy has no rules in that direction: it then has no chain there and
    /// no place in that direction's tier.
    pub ingress: Option<Vec<PlannedClusterRule>>,
    pub egress: Option<Vec<PlannedClusterRule>>,
}

impl ClusterPolicyPlan {
    pub fn direction(&self, direction: Direction) -> Option<&[PlannedClusterRule]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// Every set the policy's chains reference, deduplicated, in a stable order.
    pub fn set_defs(&self) -> Vec<SetDef> {
        let mut defs: Vec<SetDef> = [&self.ingress, &self.egress]
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|r| r.alternatives.iter())
            .flat_map(|a| {
                let peer = match &a.peer {
                    PeerMatch::Set(d) => Some(d.clone()),
                    _ => None,
                };
                let ports = match &a.ports {
                    PortsMatch::Named(d) => Some(d.clone()),
                    _ => None,
                };
                peer.into_iter().chain(ports)
            })
            .collect();
        defs.sort();
        defs.dedup();
        defs
    }
}

fn selection_set(selection: &PodSelection) -> SetDef {
    SetDef::Selector {
        namespaces: NamespaceScope::Selector(selection.namespaces.clone()),
        pods: selection.pods.clone(),
    }
}

fn named_port_set(selection: &PodSelection, protocol: Protocol, name: &str) -> SetDef {
    SetDef::NamedPort {
        namespaces: NamespaceScope::Selector(selection.namespaces.clone()),
        pods: selection.pods.clone(),
        protocol,
        port_name: name.to_string(),
    }
}

pub fn plan_cluster_policy(policy: &ClusterPolicyInfo) -> ClusterPolicyPlan {
    let direction = |rules: &[ClusterRule], dir: Direction| {
        (!rules.is_empty()).then(|| {
            rules
                .iter()
                .enumerate()
                .map(|(index, rule)| plan_rule(policy, index, rule, dir))
                .collect()
        })
    };
    ClusterPolicyPlan {
        ingress: direction(&policy.ingress, Direction::Ingress),
        egress: direction(&policy.egress, Direction::Egress),
    }
}

fn plan_rule(
    policy: &ClusterPolicyInfo,
    index: usize,
    rule: &ClusterRule,
    dir: Direction,
) -> PlannedClusterRule {
    let unknown: Vec<String> = rule
        .peers
        .iter()
        .filter_map(|p| match p {
            ClusterPeer::Unknown(fields) => Some(fields.join(",")),
            _ => None,
        })
        .collect();
    let first_unknown = rule
        .peers
        .iter()
        .position(|p| matches!(p, ClusterPeer::Unknown(_)))
        .unwrap_or(0);
    if !unknown.is_empty() && rule.action != RuleAction::Accept {
        // Upstream: a Deny or Pass rule with a peer it cannot read is a deny of everything.
        return PlannedClusterRule {
            index,
            name: rule.name.clone(),
            action: RuleAction::Deny,
            alternatives: vec![Alternative {
                peer_index: first_unknown,
                protocol: None,
                peer: PeerMatch::Any,
                ports: PortsMatch::Any,
            }],
            fail_closed: Some(unknown),
        };
    }

    // Numeric ports grouped by protocol; named ports per name.
    let mut numeric: Vec<(Protocol, Vec<(u16, u16)>)> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for port in rule.ports.iter().flatten() {
        match port {
            ClusterPort::Numeric {
                protocol,
                first,
                last,
            } => match numeric.iter_mut().find(|(p, _)| p == protocol) {
                Some((_, ranges)) => ranges.push((*first, *last)),
                None => numeric.push((*protocol, vec![(*first, *last)])),
            },
            ClusterPort::Named(name) => names.push(name),
        }
    }
    numeric.sort_by_key(|(p, _)| *p);
    names.sort_unstable();
    names.dedup();

    let mut alternatives = Vec::new();
    for (peer_index, peer) in rule.peers.iter().enumerate() {
        let peer_match = match peer {
            ClusterPeer::Pods(selection) => PeerMatch::Set(selection_set(selection)),
            ClusterPeer::Networks(_) => PeerMatch::Any, // one alternative per CIDR below
            // An Accept rule's unreadable peer matches nothing.
            ClusterPeer::Unknown(_) => continue,
        };
        let nets: Vec<PeerMatch> = match peer {
            ClusterPeer::Networks(nets) => nets.iter().map(|n| PeerMatch::Net(*n)).collect(),
            _ => vec![peer_match],
        };
        for peer_match in nets {
            if rule.ports.is_none() {
                alternatives.push(Alternative {
                    peer_index,
                    protocol: None,
                    peer: peer_match.clone(),
                    ports: PortsMatch::Any,
                });
                continue;
            }
            for (protocol, ranges) in &numeric {
                for chunk in split_multiport(merge_ranges(ranges)) {
                    alternatives.push(Alternative {
                        peer_index,
                        protocol: Some(*protocol),
                        peer: peer_match.clone(),
                        ports: PortsMatch::Numeric(chunk),
                    });
                }
            }
            for name in &names {
                for protocol in NAMED_PORT_PROTOCOLS {
                    let (peer, set) = match (dir, peer) {
                        // The set holds only the peer's pods: it is the peer match.
                        (Direction::Egress, ClusterPeer::Pods(selection)) => {
                            (PeerMatch::Any, named_port_set(selection, protocol, name))
                        }
                        // The destination is the subject pod itself.
                        _ => (
                            peer_match.clone(),
                            named_port_set(&policy.subject, protocol, name),
                        ),
                    };
                    alternatives.push(Alternative {
                        peer_index,
                        protocol: Some(protocol),
                        peer,
                        ports: PortsMatch::Named(set),
                    });
                }
            }
        }
    }
    PlannedClusterRule {
        index,
        name: rule.name.clone(),
        action: rule.action,
        alternatives,
        fail_closed: None,
    }
}

/// Renders the chains of an active policy for one family (only the directions it has rules
/// in); `set_name` maps a set to its kernel name in that family.
pub fn cluster_policy_chains(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &ClusterPolicyInfo,
    plan: &ClusterPolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
) -> Vec<Chain> {
    render_cluster(cfg, family, policy, plan, set_name, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`cluster_policy_chains`] with what each rule implements.
pub fn cluster_policy_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &ClusterPolicyInfo,
    plan: &ClusterPolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
) -> Vec<TracedChain> {
    traced(render_cluster(cfg, family, policy, plan, set_name, true))
}

fn render_cluster(
    cfg: &RuleConfig,
    family: IpFamily,
    policy: &ClusterPolicyInfo,
    plan: &ClusterPolicyPlan,
    set_name: &dyn Fn(&SetDef) -> String,
    traced: bool,
) -> Vec<Rendered> {
    let mut chains = Vec::new();
    for dir in [Direction::Ingress, Direction::Egress] {
        let Some(rules) = plan.direction(dir) else {
            continue;
        };
        let mut out = Vec::new();
        let mut roles = Vec::new();
        let chain_name = cluster_policy_chain(dir, &policy.name);
        for rule in rules {
            let mut steps = Vec::new();
            render_rule(
                cfg,
                family,
                dir,
                rule,
                set_name,
                &chain_name,
                &mut out,
                &mut steps,
            );
            if traced {
                roles.extend(steps.into_iter().map(|step| match step {
                    Ok(step) => RuleRole::ClusterPolicy(ClusterRuleRole {
                        rule: rule.index,
                        name: rule.name.clone(),
                        action: rule.action,
                        step,
                    }),
                    Err(role) => role,
                }));
            }
        }
        let description = format!("{KIND_LONG} {} {}", policy.name, dir.as_str());
        match out.first_mut() {
            Some(first) => {
                // A Deny rule's log rule (and a flow-log copy) go first: the rule after them
                // keeps the description too, so it reads as it does with logging off.
                let _ = first;
                if let Some(decides) = out
                    .iter()
                    .position(|r| !matches!(r.action, Some(Action::Nflog(_))))
                    .filter(|&i| i > 0)
                {
                    out[decides].comments.insert(0, description.clone());
                }
                out[0].comments.insert(0, description);
            }
            // Nothing to match in this family: the chain only carries its description and
            // the packet goes on to the next policy.
            None => {
                out.push(Rule {
                    action: Some(Action::None),
                    ..Rule::default().comment(description)
                });
                roles.push(RuleRole::PolicyDescription);
            }
        }
        let chain = Chain::new(chain_name, family, out);
        let role = || ChainRole::ClusterPolicy {
            name: policy.name.clone(),
            tier: policy.tier,
            direction: dir,
        };
        chains.push((chain, traced.then(|| (role(), roles))));
    }
    chains
}

/// Renders one API rule into `out`, and what each rule rendered is into `steps` (`None`: the
/// deny-log rule in front of a Deny alternative, when deny logging is on; it matches what the
/// drop matches and logs with a `cnp` prefix naming `chain`, see `deny_log`).
#[allow(clippy::too_many_arguments)]
fn render_rule(
    cfg: &RuleConfig,
    family: IpFamily,
    dir: Direction,
    rule: &PlannedClusterRule,
    set_name: &dyn Fn(&SetDef) -> String,
    chain: &str,
    out: &mut Vec<Rule>,
    steps: &mut Vec<Result<ClusterStep, RuleRole>>,
) {
    let marks = cfg.marks;
    let (action, verdict_bit) = match rule.action {
        RuleAction::Accept => (
            Action::SetMark {
                value: marks.accept,
                mask: marks.accept,
            },
            Some(marks.accept),
        ),
        RuleAction::Pass => (
            Action::SetMark {
                value: marks.pass,
                mask: marks.pass,
            },
            Some(marks.pass),
        ),
        RuleAction::Deny => (deny(cfg), None),
    };
    let peer_side = match dir {
        Direction::Ingress => "src",
        Direction::Egress => "dst",
    };
    let mut rendered: Vec<(Rule, ClusterStep)> = Vec::new();
    for alt in &rule.alternatives {
        let mut r = Rule {
            protocol: alt.protocol.map(Protocol::as_str),
            ..Rule::new(action.clone())
        };
        match &alt.peer {
            PeerMatch::Any => {}
            PeerMatch::Set(def) => r
                .matches
                .push(format!("-m set --match-set {} {peer_side}", set_name(def))),
            PeerMatch::Net(net) => {
                if IpFamily::of_net(net) != family {
                    continue;
                }
                match dir {
                    Direction::Ingress => r.src = Some(*net),
                    Direction::Egress => r.dst = Some(*net),
                }
            }
        }
        match &alt.ports {
            PortsMatch::Any => {}
            PortsMatch::Numeric(ranges) => {
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
                r.matches
                    .push(format!("-m multiport --dports {}", list.join(",")));
            }
            PortsMatch::Named(def) => r
                .matches
                .push(format!("-m set --match-set {} dst,dst", set_name(def))),
        }
        let step = ClusterStep::Match {
            peer: alt.peer_index,
            protocol: alt.protocol,
            ports: match &alt.ports {
                PortsMatch::Any => ClusterPortsRole::Any,
                PortsMatch::Numeric(ranges) => ClusterPortsRole::Numeric(ranges.clone()),
                PortsMatch::Named(def) => ClusterPortsRole::Named(match def {
                    SetDef::NamedPort { port_name, .. } => port_name.clone(),
                    SetDef::Selector { .. } => String::new(),
                }),
            },
        };
        rendered.push((r, step));
    }
    if rendered.is_empty() {
        return;
    }
    // Comments keep to felix's character set (no brackets), see `sanitize_comment`.
    let mut label = format!(
        "{} rule {} {}",
        dir.as_str(),
        rule.index,
        rule.action.as_str()
    );
    if let Some(name) = &rule.name {
        label.push(' ');
        label.push_str(name);
    }
    if let Some(fields) = &rule.fail_closed {
        label.push_str(&format!(
            ", fail closed on unknown peer field {}",
            fields.join(" ")
        ));
    }
    rendered[0].0.comments.push(label);
    for (r, step) in rendered {
        // Flow logs: Accept and Deny decide, so the new connection is logged right before
        // the rule with its index; a Pass leaves the decision to the next tier's copy.
        let flow_action = match rule.action {
            RuleAction::Accept => Some(FlowAction::Allow),
            RuleAction::Deny => Some(FlowAction::RuleDeny),
            RuleAction::Pass => None,
        };
        if let (Some(flow), Some(action)) = (cfg.flow_log.as_ref(), flow_action) {
            let prefix = FlowPrefix {
                action,
                direction: dir,
                rule: Some(rule.index),
                chain: chain.to_string(),
            };
            if let Some(copy) = flow.copy_of(&r, &prefix) {
                out.push(copy);
                steps.push(Err(RuleRole::FlowLog));
            }
        }
        if rule.action == RuleAction::Deny {
            let logged = logged_drop(cfg.deny_log.as_ref(), r, DropKind::Cluster, dir, chain);
            steps.extend((1..logged.len()).map(|_| Err(RuleRole::DenyLog)));
            out.extend(logged);
        } else {
            out.push(r);
        }
        steps.push(Ok(step));
    }
    if let Some(bit) = verdict_bit {
        out.push(Rule::new(Action::Return).mark_match(bit, bit));
        steps.push(Ok(ClusterStep::ReturnAfter));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSel, Tier};
    use kube::core::Expression;

    fn sel(k: &str, v: &str) -> LabelSel {
        LabelSel::from_exprs(vec![Expression::Equal(k.into(), v.into())])
    }

    fn pods(ns: LabelSel, pods: LabelSel) -> PodSelection {
        PodSelection {
            namespaces: ns,
            pods,
        }
    }

    fn policy(ingress: Vec<ClusterRule>, egress: Vec<ClusterRule>) -> ClusterPolicyInfo {
        ClusterPolicyInfo {
            name: "guard".into(),
            tier: Tier::Admin,
            priority: 5,
            subject: pods(sel("team", "a"), LabelSel::everything()),
            ingress,
            egress,
        }
    }

    fn rule(
        action: RuleAction,
        peers: Vec<ClusterPeer>,
        ports: Option<Vec<ClusterPort>>,
    ) -> ClusterRule {
        ClusterRule {
            name: None,
            action,
            peers,
            ports,
        }
    }

    fn render(p: &ClusterPolicyInfo, family: IpFamily) -> Vec<(String, Vec<String>)> {
        render_with(&RuleConfig::default(), p, family)
    }

    fn render_with(
        cfg: &RuleConfig,
        p: &ClusterPolicyInfo,
        family: IpFamily,
    ) -> Vec<(String, Vec<String>)> {
        let plan = plan_cluster_policy(p);
        cluster_policy_chains(cfg, family, p, &plan, &|d| format!("SET-{}", &d.id()[2..6]))
            .into_iter()
            .map(|c| {
                let bodies = c
                    .rules
                    .iter()
                    .map(|r| {
                        r.body
                            .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "")
                    })
                    .collect();
                (c.name, bodies)
            })
            .collect()
    }

    #[test]
    fn deny_rules_are_logged_when_deny_logging_is_on_and_only_then() {
        use crate::rules::deny_log::{DenyLogConfig, Rate, DEFAULT_SNAP_LEN};
        let peer = ClusterPeer::Pods(pods(sel("team", "b"), LabelSel::everything()));
        let tcp = |port| ClusterPort::Numeric {
            protocol: Protocol::Tcp,
            first: port,
            last: port,
        };
        let p = policy(
            vec![
                rule(RuleAction::Accept, vec![peer.clone()], Some(vec![tcp(80)])),
                rule(
                    RuleAction::Deny,
                    vec![peer.clone()],
                    Some(vec![
                        tcp(81),
                        ClusterPort::Numeric {
                            protocol: Protocol::Udp,
                            first: 53,
                            last: 53,
                        },
                    ]),
                ),
            ],
            vec![rule(RuleAction::Deny, vec![peer], None)],
        );
        let on = RuleConfig {
            deny_log: Some(
                DenyLogConfig::new(3, Rate::per_second(10), 20, DEFAULT_SNAP_LEN).unwrap(),
            ),
            ..RuleConfig::default()
        };
        let off = render(&p, IpFamily::V4);
        let logged = render_with(&on, &p, IpFamily::V4);
        assert_eq!(logged.len(), 2);
        for ((name, off_rules), (logged_name, rules)) in off.iter().zip(&logged) {
            assert_eq!(name, logged_name);
            let dir = if name.starts_with("cali-pi-") {
                "in"
            } else {
                "eg"
            };
            let log_target = format!(
                "-m limit --limit 10/sec --limit-burst 20 -j NFLOG --nflog-prefix \"npa-cnp-{dir}-{name}\" --nflog-group 3 --nflog-size 128"
            );
            // Every Deny alternative is preceded by its log rule, which matches what the drop
            // matches; nothing else is logged, and without the log rules the chain is the
            // chain rendered with logging off.
            let mut without_logs = Vec::new();
            let mut logs = 0;
            for (i, r) in rules.iter().enumerate() {
                if r.contains("NFLOG") {
                    logs += 1;
                    let drop = &rules[i + 1];
                    assert!(drop.ends_with(" -j DROP"), "{rules:#?}");
                    assert_eq!(
                        *r,
                        format!("{} {log_target}", drop.strip_suffix(" -j DROP").unwrap()),
                    );
                } else {
                    without_logs.push(r.clone());
                }
            }
            assert_eq!(&without_logs, off_rules);
            let drops = rules.iter().filter(|r| r.ends_with("-j DROP")).count();
            assert_eq!(logs, drops, "{rules:#?}");
            assert_eq!(drops, if dir == "in" { 2 } else { 1 });
            assert!(!rules
                .iter()
                .any(|r| r.contains("NFLOG") && r.contains("dports 80")));
        }
        // A hashed (longest) chain name fits the prefix, printed bare (no quoting needed).
        let mut long = p.clone();
        long.name = "a-rather-long-policy-name-that-is-hashed".into();
        let chains = render_with(&on, &long, IpFamily::V4);
        assert!(chains[0]
            .1
            .iter()
            .any(|r| r.contains(&format!("--nflog-prefix npa-cnp-in-{} ", chains[0].0))));
    }

    #[test]
    fn chains_are_named_after_felix_policy_ids() {
        assert_eq!(
            cluster_policy_chain(Direction::Ingress, "deny-all"),
            "cali-pi-kcnp/deny-all"
        );
        assert_eq!(
            cluster_policy_chain(Direction::Egress, "x"),
            "cali-po-kcnp/x"
        );
        let long = cluster_policy_chain(Direction::Ingress, "a-rather-long-policy-name");
        assert_eq!(long.len(), MAX_CHAIN_NAME_LEN);
        assert!(long.starts_with("cali-pi-_"), "{long}");
    }

    #[test]
    fn actions_render_in_rule_order_with_one_return_per_rule() {
        let peer = ClusterPeer::Pods(pods(sel("team", "b"), LabelSel::everything()));
        let p = policy(
            vec![
                rule(
                    RuleAction::Pass,
                    vec![peer.clone()],
                    Some(vec![
                        ClusterPort::Numeric {
                            protocol: Protocol::Tcp,
                            first: 80,
                            last: 80,
                        },
                        ClusterPort::Numeric {
                            protocol: Protocol::Udp,
                            first: 53,
                            last: 53,
                        },
                    ]),
                ),
                rule(RuleAction::Accept, vec![peer.clone()], None),
                rule(RuleAction::Deny, vec![peer], None),
            ],
            vec![],
        );
        let chains = render(&p, IpFamily::V4);
        assert_eq!(chains.len(), 1, "no egress rules, no egress chain");
        let (name, rules) = &chains[0];
        assert_eq!(name, "cali-pi-kcnp/guard");
        let set = rules[0]
            .split("--match-set ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        assert_eq!(
            rules,
            &vec![
                format!("-p tcp -m comment --comment \"KubernetesClusterNetworkPolicy guard ingress\" -m comment --comment \"ingress rule 0 Pass\" -m set --match-set {set} src -m multiport --dports 80 -j MARK --set-xmark 0x20000/0x20000"),
                format!("-p udp -m set --match-set {set} src -m multiport --dports 53 -j MARK --set-xmark 0x20000/0x20000"),
                "-m mark --mark 0x20000/0x20000 -j RETURN".to_string(),
                format!("-m comment --comment \"ingress rule 1 Accept\" -m set --match-set {set} src -j MARK --set-xmark 0x10000/0x10000"),
                "-m mark --mark 0x10000/0x10000 -j RETURN".to_string(),
                format!("-m comment --comment \"ingress rule 2 Deny\" -m set --match-set {set} src -j DROP"),
            ]
        );
    }

    #[test]
    fn networks_render_per_family_and_never_widen() {
        let p = policy(
            vec![],
            vec![rule(
                RuleAction::Deny,
                vec![ClusterPeer::Networks(vec![
                    "10.0.0.0/8".parse().unwrap(),
                    "::/0".parse().unwrap(),
                ])],
                None,
            )],
        );
        let v4 = render(&p, IpFamily::V4);
        assert_eq!(v4[0].1.len(), 1);
        assert!(v4[0].1[0].starts_with("-d 10.0.0.0/8 "), "{:?}", v4);
        let v6 = render(&p, IpFamily::V6);
        assert!(
            v6[0].1[0].ends_with("-j DROP") && !v6[0].1[0].contains("-d "),
            "{v6:?}"
        );

        let only_v6 = policy(
            vec![],
            vec![rule(
                RuleAction::Accept,
                vec![ClusterPeer::Networks(vec!["fd00::/64".parse().unwrap()])],
                None,
            )],
        );
        assert_eq!(
            render(&only_v6, IpFamily::V4)[0].1,
            ["-m comment --comment \"KubernetesClusterNetworkPolicy guard egress\""]
        );
    }

    #[test]
    fn named_ports_resolve_on_the_destination_for_every_protocol() {
        let peer_sel = pods(sel("team", "b"), sel("app", "db"));
        let named = Some(vec![ClusterPort::Named("web".into())]);
        let p = policy(
            vec![rule(
                RuleAction::Accept,
                vec![ClusterPeer::Pods(peer_sel.clone())],
                named.clone(),
            )],
            vec![rule(
                RuleAction::Deny,
                vec![ClusterPeer::Pods(peer_sel.clone())],
                named,
            )],
        );
        let plan = plan_cluster_policy(&p);
        let ingress = &plan.ingress.as_ref().unwrap()[0].alternatives;
        assert_eq!(ingress.len(), 3);
        for alt in ingress {
            assert_eq!(alt.peer, PeerMatch::Set(selection_set(&peer_sel)));
            match &alt.ports {
                PortsMatch::Named(SetDef::NamedPort { pods, protocol, .. }) => {
                    assert!(
                        pods.is_everything(),
                        "ingress resolves on the subject's pods"
                    );
                    assert_eq!(Some(*protocol), alt.protocol);
                }
                other => panic!("{other:?}"),
            }
        }
        let egress = &plan.egress.as_ref().unwrap()[0].alternatives;
        assert!(egress.iter().all(|a| a.peer == PeerMatch::Any));
        assert!(egress.iter().all(|a| matches!(&a.ports, PortsMatch::Named(SetDef::NamedPort { pods, .. }) if *pods == peer_sel.pods)));
        // Peer set + 3 subject sets + 3 peer sets.
        assert_eq!(plan.set_defs().len(), 7);
    }

    #[test]
    fn unknown_peers_fail_closed() {
        let unknown = ClusterPeer::Unknown(vec!["futurePeer".into()]);
        let other = ClusterPeer::Pods(pods(LabelSel::everything(), LabelSel::everything()));
        let accept = policy(
            vec![rule(
                RuleAction::Accept,
                vec![unknown.clone(), other.clone()],
                None,
            )],
            vec![],
        );
        let plan = plan_cluster_policy(&accept);
        assert_eq!(
            plan.ingress.as_ref().unwrap()[0].alternatives.len(),
            1,
            "the unknown peer matches nothing"
        );
        let pass = policy(
            vec![rule(
                RuleAction::Pass,
                vec![other, unknown],
                Some(vec![ClusterPort::Numeric {
                    protocol: Protocol::Tcp,
                    first: 1,
                    last: 2,
                }]),
            )],
            vec![],
        );
        let rules = &render(&pass, IpFamily::V4)[0].1;
        assert_eq!(rules.len(), 1);
        assert!(
            rules[0].contains("fail closed")
                && rules[0].ends_with("-j DROP")
                && !rules[0].contains("-p tcp"),
            "{rules:?}"
        );
    }
}
