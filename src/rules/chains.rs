//! The static chains (`cali-FORWARD`, `cali-INPUT`, `cali-wl-to-host`, `cali-OUTPUT`), our
//! jumps in the kernel chains, the per-workload chains (`cali-tw-`/`cali-fw-`) and the
//! per-namespace profile chains, in the order of felix's `iptables-save` output.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, ObjectKey};
use crate::rules::sets::set_name;

use super::cluster::{cluster_policy_chain, ADMIN_TIER_NAME, BASELINE_TIER_NAME};
use super::deny_log::{self, DropKind};
use super::flow_log::{FlowAction, FlowPrefix};
use super::provenance::{traced, ChainRole, Rendered, RuleList, RuleRole, TracedChain};
use super::union;
use super::{
    bridge, deny, from_workload_chain, policy_chain, profile_chain, render_rules,
    to_workload_chain, Action, AllowAction, Chain, ChainInsertMode, Direction,
    EndpointToHostAction, RenderedRule, Rule, RuleConfig, FORWARD_CHAIN, FROM_WL_DISPATCH,
    INPUT_CHAIN, OUTPUT_CHAIN, TO_WL_DISPATCH, WL_TO_HOST_CHAIN,
};

/// ICMPv6 types a pod must be able to send to its host before any policy: MLD (130-132),
/// router solicitation (133), neighbour solicitation/advertisement (135, 136).
const ICMPV6_TO_HOST_TYPES: [u8; 6] = [130, 131, 132, 133, 135, 136];

/// The static chains. `guard`: the guard holds a pod (`rules::guard`), so `cali-FORWARD`,
/// `cali-INPUT` and, in IPVS mode, `cali-OUTPUT` jump to it first.
pub fn static_chains(cfg: &RuleConfig, family: IpFamily, guard: bool) -> Vec<Chain> {
    render_static(cfg, family, guard, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`static_chains`] with what each rule is for.
pub fn static_chains_traced(cfg: &RuleConfig, family: IpFamily, guard: bool) -> Vec<TracedChain> {
    traced(render_static(cfg, family, guard, true))
}

fn render_static(cfg: &RuleConfig, family: IpFamily, guard: bool, traced: bool) -> Vec<Rendered> {
    let marks = cfg.marks;
    let mut forward = RuleList::new(traced);
    // The accept bit survives: only pass and scratch bits are per-hop state.
    forward.push(
        Rule::new(Action::SetMark {
            value: 0,
            mask: marks.all() & !marks.accept,
        }),
        || RuleRole::ClearMarks,
    );
    if guard {
        forward.push(super::guard::jump(), || RuleRole::JumpToGuard);
    }
    super::guard::pending_forward_jumps(cfg, family, &mut forward);
    match &cfg.bridge {
        None => {
            for prefix in &cfg.interface_prefixes {
                forward.push(
                    Rule::new(Action::Jump(FROM_WL_DISPATCH.into())).in_iface(format!("{prefix}+")),
                    || RuleRole::FromWorkloads {
                        prefix: prefix.clone(),
                    },
                );
                forward.push(
                    Rule::new(Action::Jump(TO_WL_DISPATCH.into())).out_iface(format!("{prefix}+")),
                    || RuleRole::ToWorkloads {
                        prefix: prefix.clone(),
                    },
                );
            }
        }
        Some(bridge) => bridge::forward_rules(cfg, bridge, family, &mut forward),
    }

    // From a pod to its host: by the veth in routed mode, by the bridge port in bridge mode.
    let mut input = RuleList::new(traced);
    if guard {
        input.push(super::guard::jump(), || RuleRole::JumpToGuard);
    }
    super::guard::pending_host_jumps(cfg, family, Direction::Egress, &mut input);
    if let Some(ipvs) = &cfg.kube_ipvs {
        super::ipvs::input_rules(ipvs, &mut input);
    }
    for prefix in &cfg.interface_prefixes {
        let rule = Rule::new(Action::Goto(WL_TO_HOST_CHAIN.into()));
        let rule = match cfg.bridge {
            None => rule.in_iface(format!("{prefix}+")),
            Some(_) => rule.matching(bridge::physdev_in(&format!("{prefix}+"))),
        };
        input.push(rule, || RuleRole::WorkloadToHost {
            prefix: prefix.clone(),
        });
    }

    let mut wl_to_host = RuleList::new(traced);
    if family == IpFamily::V6 {
        for t in ICMPV6_TO_HOST_TYPES {
            wl_to_host.push(
                Rule {
                    protocol: Some("ipv6-icmp"),
                    ..Rule::new(Action::Accept).matching(format!("-m icmp6 --icmpv6-type {t}"))
                },
                || RuleRole::AcceptIcmpv6ToHost,
            );
        }
    }
    wl_to_host.push(Rule::new(Action::Jump(FROM_WL_DISPATCH.into())), || {
        RuleRole::HostEgressPolicy
    });
    let to_host = match cfg.endpoint_to_host_action {
        EndpointToHostAction::Accept => Action::Accept,
        EndpointToHostAction::Drop => deny(cfg),
        EndpointToHostAction::Return => Action::Return,
    };
    wl_to_host.push(
        Rule::new(to_host).comment("Configured DefaultEndpointToHostAction"),
        || RuleRole::EndpointToHostAction,
    );

    // Host-to-pod traffic (kubelet probes) is never policed. In bridge mode it leaves by the
    // bridge (the port is chosen after OUTPUT).
    let mut output = RuleList::new(traced);
    if let Some(ipvs) = &cfg.kube_ipvs {
        if guard {
            output.push(super::guard::output_jump(), || RuleRole::JumpToGuard);
        }
        super::guard::pending_host_jumps(cfg, family, Direction::Ingress, &mut output);
        super::ipvs::output_rules(ipvs, &mut output);
    }
    match &cfg.bridge {
        None => {
            for prefix in &cfg.interface_prefixes {
                output.push(
                    Rule::new(Action::Return).out_iface(format!("{prefix}+")),
                    || RuleRole::HostToWorkloadNotPoliced,
                );
            }
        }
        Some(bridge) => output.push(Rule::new(Action::Return).out_iface(bridge.clone()), || {
            RuleRole::HostToWorkloadNotPoliced
        }),
    }

    vec![
        forward.finish(FORWARD_CHAIN, family, || ChainRole::Forward),
        input.finish(INPUT_CHAIN, family, || ChainRole::Input),
        wl_to_host.finish(WL_TO_HOST_CHAIN, family, || ChainRole::WorkloadToHost),
        output.finish(OUTPUT_CHAIN, family, || ChainRole::Output),
    ]
}

/// Our rules in one kernel chain (`FORWARD`, `INPUT`, `OUTPUT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelChainRules {
    pub chain: String,
    /// At the top (insert mode) or after the other programs' rules (append mode).
    pub inserts: Vec<RenderedRule>,
    /// Always after everything else in the chain.
    pub appends: Vec<RenderedRule>,
}

/// The kernel's own chains of the filter table that we put rules into.
pub const HOOKED_KERNEL_CHAINS: [&str; 3] = ["FORWARD", "INPUT", "OUTPUT"];

pub fn kernel_chain_rules(cfg: &RuleConfig, family: IpFamily) -> Vec<KernelChainRules> {
    let jump = |kernel: &str, ours: &str| KernelChainRules {
        chain: kernel.to_string(),
        inserts: render_rules(kernel, family, &[Rule::new(Action::Jump(ours.into()))]),
        appends: Vec::new(),
    };
    let mut forward = jump("FORWARD", FORWARD_CHAIN);
    // The verdict for allowed pod traffic comes last in FORWARD, so rules that others put
    // between our jump and the end (kube-proxy's KUBE-FORWARD, ...) still run.
    let accept = match cfg.allow_action {
        AllowAction::Accept => Action::Accept,
        AllowAction::Return => Action::Return,
    };
    forward.appends = render_rules(
        "FORWARD*appends*",
        family,
        &[Rule::new(accept)
            .comment("Policy explicitly accepted packet.")
            .mark_match(cfg.marks.accept, cfg.marks.accept)],
    );
    vec![
        forward,
        jump("INPUT", INPUT_CHAIN),
        jump("OUTPUT", OUTPUT_CHAIN),
    ]
}

impl ChainInsertMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ChainInsertMode::Insert => "insert",
            ChainInsertMode::Append => "append",
        }
    }
}

/// `cali-tw-<iface>` (ingress, to the workload) and `cali-fw-<iface>` (egress), for a pod
/// no ClusterNetworkPolicy applies to: its NetworkPolicies' chains per direction.
pub fn endpoint_chains(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    addrs: &[IpAddr],
    namespace: &str,
    ingress: &[ObjectKey],
    egress: &[ObjectKey],
) -> [Chain; 2] {
    tiered_endpoint_chains(
        cfg,
        family,
        iface,
        addrs,
        namespace,
        &TierChains::network_only(ingress),
        &TierChains::network_only(egress),
    )
}

/// The policies one direction of a workload chain jumps to, tier by tier, each list in
/// evaluation order: ClusterNetworkPolicy Admin policies (by name), the NetworkPolicies,
/// ClusterNetworkPolicy Baseline policies (by name).
#[derive(Clone, Copy, Debug, Default)]
pub struct TierChains<'a> {
    pub admin: &'a [String],
    pub network: &'a [ObjectKey],
    pub baseline: &'a [String],
    /// The id of the union set of the NetworkPolicy section ([`super::union`]), when the
    /// workload has one in this direction.
    pub union: Option<&'a str>,
}

impl<'a> TierChains<'a> {
    pub fn network_only(network: &'a [ObjectKey]) -> TierChains<'a> {
        TierChains {
            network,
            ..TierChains::default()
        }
    }
}

/// `cali-tw-<iface>` and `cali-fw-<iface>` with felix's tier layout: per direction, a
/// section per tier that has policies there (see `endpoint_rules`). `addrs` are the pod's
/// addresses (any family: those of `family` are used) for the source check.
#[allow(clippy::too_many_arguments)]
pub fn tiered_endpoint_chains(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    addrs: &[IpAddr],
    namespace: &str,
    ingress: &TierChains<'_>,
    egress: &TierChains<'_>,
) -> [Chain; 2] {
    let endpoint = Endpoint {
        iface,
        addrs,
        pod: None,
        namespace,
    };
    let [tw, fw] = render_endpoint(cfg, family, &endpoint, ingress, egress, false);
    [tw.0, fw.0]
}

/// [`endpoint_chains`] with provenance; `pod` is the pod owning `iface`.
#[allow(clippy::too_many_arguments)]
pub fn endpoint_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    addrs: &[IpAddr],
    pod: &ObjectKey,
    namespace: &str,
    ingress: &[ObjectKey],
    egress: &[ObjectKey],
) -> Vec<TracedChain> {
    tiered_endpoint_chains_traced(
        cfg,
        family,
        iface,
        addrs,
        pod,
        namespace,
        &TierChains::network_only(ingress),
        &TierChains::network_only(egress),
    )
}

/// [`tiered_endpoint_chains`] with provenance; `pod` is the pod owning `iface`.
#[allow(clippy::too_many_arguments)]
pub fn tiered_endpoint_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    addrs: &[IpAddr],
    pod: &ObjectKey,
    namespace: &str,
    ingress: &TierChains<'_>,
    egress: &TierChains<'_>,
) -> Vec<TracedChain> {
    let endpoint = Endpoint {
        iface,
        addrs,
        pod: Some(pod),
        namespace,
    };
    traced(render_endpoint(cfg, family, &endpoint, ingress, egress, true).into())
}

/// The workload a pair of endpoint chains is rendered for.
struct Endpoint<'a> {
    iface: &'a str,
    /// The pod's addresses, every family.
    addrs: &'a [IpAddr],
    pod: Option<&'a ObjectKey>,
    namespace: &'a str,
}

fn render_endpoint(
    cfg: &RuleConfig,
    family: IpFamily,
    ep: &Endpoint<'_>,
    ingress: &TierChains<'_>,
    egress: &TierChains<'_>,
    traced: bool,
) -> [Rendered; 2] {
    let chain = |direction: Direction, name: String, tiers: &TierChains<'_>| {
        let mut rules = RuleList::new(traced);
        if direction == Direction::Egress && cfg.workload_source_check {
            source_check(cfg, family, ep.addrs, &mut rules);
        }
        endpoint_rules(
            cfg,
            family,
            &name,
            direction,
            ep.namespace,
            tiers,
            &mut rules,
        );
        rules.finish(name.clone(), family, || ChainRole::Workload {
            pod: ep.pod.cloned(),
            iface: ep.iface.to_string(),
            direction,
        })
    };
    [
        chain(Direction::Ingress, to_workload_chain(ep.iface), ingress),
        chain(Direction::Egress, from_workload_chain(ep.iface), egress),
    ]
}

/// Anti-spoofing, first in a pod's `cali-fw-` chain (before conntrack, so a forged packet
/// cannot ride on another flow's entry): a packet that entered from the pod's interface (its
/// veth, or its bridge port in bridge mode) must carry one of the pod's own addresses of
/// this family, or it is dropped. Ingress rules match peers by source address (selector
/// sets, ipBlocks), so without this a pod with `NET_RAW` could pass for any allowed pod.
///
/// Felix gets the same with strict `rp_filter` on workload interfaces (IPv4) and a raw-table
/// `rpfilter` rule (IPv6). We check the address itself in the filter table instead: the rule
/// is rendered by the pure renderer with the pod it protects, so `compile`, `audit`, `explain
/// --kernel` and the drift repair see it like every other rule; it writes no sysctl; and it
/// does not depend on the node's routing (policy routing, asymmetric cloud routes, or a
/// bridge where every pod shares one route), which `rp_filter` does.
///
/// IPv6 link-local sources never reach this chain for neighbour discovery and MLD queries
/// (accepted before policy, in `cali-wl-to-host` and, bridged, in `cali-FORWARD`); other
/// link-local traffic from a pod to its host is dropped here. A pod without an address of
/// the family sends nothing of that family past this rule.
fn source_check(cfg: &RuleConfig, family: IpFamily, addrs: &[IpAddr], rules: &mut RuleList) {
    const COMMENT: &str = "Drop if the source is not the workload address";
    let own: Vec<IpNet> = addrs
        .iter()
        .filter(|a| IpFamily::of(a) == family)
        .map(|a| IpNet::from(*a))
        .collect();
    let role = || RuleRole::DropSpoofedSource { own: own.clone() };
    match own.as_slice() {
        [] => rules.push(Rule::new(Action::Drop).comment(COMMENT), role),
        [one] => rules.push(
            Rule {
                src: Some(*one),
                src_negated: true,
                ..Rule::new(Action::Drop).comment(COMMENT)
            },
            role,
        ),
        // The API server allows one address per family; other datastores are not held to
        // that. Several addresses: scratch0 set, cleared by each own address, drop if still
        // set (the scratch bits are free here: policy chains set them before they use them).
        several => {
            let scratch = cfg.marks.scratch0;
            rules.push(
                Rule::new(Action::SetMark {
                    value: scratch,
                    mask: scratch,
                }),
                role,
            );
            for net in several {
                rules.push(
                    Rule {
                        src: Some(*net),
                        ..Rule::new(Action::SetMark {
                            value: 0,
                            mask: scratch,
                        })
                    },
                    role,
                );
            }
            rules.push(
                Rule::new(Action::Drop)
                    .comment(COMMENT)
                    .mark_match(scratch, scratch),
                role,
            );
        }
    }
}

/// One tier's section of a workload chain: what it jumps to.
enum Section<'a> {
    Cluster {
        tier: &'static str,
        names: &'a [String],
    },
    Network(&'a [ObjectKey]),
}

/// The flow-log copy of a workload chain's decision (`None` with flow logs off).
fn flow_log_copy(
    cfg: &RuleConfig,
    rule: &Rule,
    action: FlowAction,
    direction: Direction,
    chain: &str,
) -> Option<Rule> {
    cfg.flow_log.as_ref()?.copy_of(
        rule,
        &FlowPrefix {
            action,
            direction,
            rule: None,
            chain: chain.to_string(),
        },
    )
}

/// A workload chain: conntrack, then per tier that has policies in this direction felix's
/// section (clear the pass bit, each policy's jump guarded by "not passed" and followed by
/// "Return if policy accepted"), the NetworkPolicy section ending with its drop (the pod is
/// isolated), then the namespace profile (allow). A ClusterNetworkPolicy tier has no end
/// drop: a Deny drops in the policy chain, and nothing matched falls through to the next tier.
fn endpoint_rules(
    cfg: &RuleConfig,
    family: IpFamily,
    chain: &str,
    direction: Direction,
    namespace: &str,
    tiers: &TierChains<'_>,
    rules: &mut RuleList,
) {
    let m = cfg.marks;
    let established = "-m conntrack --ctstate RELATED,ESTABLISHED";
    match cfg.allow_action {
        AllowAction::Accept => rules.push(Rule::new(Action::Accept).matching(established), || {
            RuleRole::AcceptEstablished
        }),
        AllowAction::Return => {
            rules.push(
                Rule::new(Action::SetMark {
                    value: m.accept,
                    mask: m.accept,
                })
                .matching(established),
                || RuleRole::MarkEstablished,
            );
            rules.push(Rule::new(Action::Return).matching(established), || {
                RuleRole::ReturnEstablished
            });
        }
    }
    rules.push(
        Rule::new(deny(cfg)).matching("-m conntrack --ctstate INVALID"),
        || RuleRole::DropInvalid,
    );
    rules.push(
        Rule::new(Action::SetMark {
            value: 0,
            mask: m.accept | m.pass,
        }),
        || RuleRole::ClearAcceptAndPass,
    );
    let sections = [
        Section::Cluster {
            tier: ADMIN_TIER_NAME,
            names: tiers.admin,
        },
        Section::Network(tiers.network),
        Section::Cluster {
            tier: BASELINE_TIER_NAME,
            names: tiers.baseline,
        },
    ];
    for section in sections {
        match section {
            Section::Cluster { tier, names } => {
                if names.is_empty() {
                    continue;
                }
                rules.push(
                    Rule::new(Action::SetMark {
                        value: 0,
                        mask: m.pass,
                    })
                    .comment(format!("Start of tier {tier}")),
                    || RuleRole::StartOfTier { tier },
                );
                for name in names {
                    rules.push(
                        Rule::new(Action::Jump(cluster_policy_chain(direction, name)))
                            .mark_match(0, m.pass),
                        || RuleRole::JumpToClusterPolicy {
                            tier,
                            name: name.clone(),
                        },
                    );
                    rules.push(
                        Rule::new(Action::Return)
                            .comment("Return if policy accepted")
                            .mark_match(m.accept, m.accept),
                        || RuleRole::ReturnIfClusterPolicyAccepted {
                            tier,
                            name: name.clone(),
                        },
                    );
                }
            }
            Section::Network(policies) => {
                if policies.is_empty() {
                    continue;
                }
                rules.push(
                    Rule::new(Action::SetMark {
                        value: 0,
                        mask: m.pass,
                    })
                    .comment("Start of policies"),
                    || RuleRole::StartOfPolicies,
                );
                if let Some(id) = tiers.union {
                    let set = set_name(family, id);
                    rules.push(
                        Rule::new(Action::SetMark {
                            value: m.accept,
                            mask: m.accept,
                        })
                        .comment("Accept if in the union set of the policies")
                        .matching(format!(
                            "-m set --match-set {set} {}",
                            union::set_flags(direction)
                        )),
                        || RuleRole::UnionAccept { set: set.clone() },
                    );
                    rules.push(
                        Rule::new(Action::Return)
                            .comment("Return if policy accepted")
                            .mark_match(m.accept, m.accept),
                        || RuleRole::ReturnIfUnionAccepted,
                    );
                }
                for p in policies {
                    rules.push(
                        Rule::new(Action::Jump(policy_chain(direction, &p.namespace, &p.name)))
                            .mark_match(0, m.pass),
                        || RuleRole::JumpToPolicy { policy: p.clone() },
                    );
                    rules.push(
                        Rule::new(Action::Return)
                            .comment("Return if policy accepted")
                            .mark_match(m.accept, m.accept),
                        || RuleRole::ReturnIfPolicyAccepted { policy: p.clone() },
                    );
                }
                let drop = Rule::new(deny(cfg))
                    .comment("Drop if no policies passed packet")
                    .mark_match(0, m.pass);
                // Flow logs: "isolated, no rule allowed" (ahead of the deny log's copy).
                if let Some(copy) = flow_log_copy(cfg, &drop, FlowAction::Deny, direction, chain) {
                    rules.push(copy, || RuleRole::FlowLog);
                }
                deny_log::push_logged_drop(
                    rules,
                    cfg.deny_log.as_ref(),
                    drop,
                    DropKind::Policy,
                    direction,
                    chain,
                    || RuleRole::DropIfNoPolicyPassed,
                );
            }
        }
    }
    let to_profile = Rule::new(Action::Jump(profile_chain(direction, namespace)));
    // Flow logs: no NetworkPolicy isolates the pod in this direction, so the profile decides.
    if tiers.network.is_empty() {
        if let Some(copy) = flow_log_copy(cfg, &to_profile, FlowAction::NoPolicy, direction, chain)
        {
            rules.push(copy, || RuleRole::FlowLog);
        }
    }
    rules.push(to_profile, || RuleRole::JumpToProfile);
    rules.push(
        Rule::new(Action::Return)
            .comment("Return if profile accepted")
            .mark_match(m.accept, m.accept),
        || RuleRole::ReturnIfProfileAccepted,
    );
    rules.push(
        Rule::new(deny(cfg)).comment("Drop if no profiles matched"),
        || RuleRole::DropIfNoProfileMatched,
    );
}

/// `cali-pri-kns.<ns>` and `cali-pro-kns.<ns>`: the allow-everything profile that decides for
/// pods no policy isolates.
pub fn profile_chains(cfg: &RuleConfig, family: IpFamily, namespace: &str) -> [Chain; 2] {
    let [a, b] = render_profile(cfg, family, namespace, false);
    [a.0, b.0]
}

/// [`profile_chains`] with provenance.
pub fn profile_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    namespace: &str,
) -> Vec<TracedChain> {
    traced(render_profile(cfg, family, namespace, true).into())
}

fn render_profile(
    cfg: &RuleConfig,
    family: IpFamily,
    namespace: &str,
    traced: bool,
) -> [Rendered; 2] {
    let accept = cfg.marks.accept;
    let chain = |direction: Direction| {
        let mut rules = RuleList::new(traced);
        rules.push(
            Rule::new(Action::SetMark {
                value: accept,
                mask: accept,
            })
            .comment(format!("Profile kns.{namespace} {}", direction.as_str())),
            || RuleRole::ProfileAllow,
        );
        rules.push(Rule::new(Action::Return).mark_match(accept, accept), || {
            RuleRole::ProfileReturn
        });
        rules.finish(profile_chain(direction, namespace), family, || {
            ChainRole::Profile {
                namespace: namespace.to_string(),
                direction,
            }
        })
    };
    [chain(Direction::Ingress), chain(Direction::Egress)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(c: &Chain) -> Vec<String> {
        c.rules
            .iter()
            .map(|r| {
                let needle = format!("-m comment --comment \"cali:{}\" ", r.hash);
                r.body
                    .replace(&needle, "")
                    .replace(&needle[..needle.len() - 1], "")
            })
            .collect()
    }

    #[test]
    fn forward_dispatches_every_prefix() {
        let cfg = RuleConfig {
            interface_prefixes: vec!["eni".into(), "veth".into()],
            ..RuleConfig::default()
        };
        let chains = static_chains(&cfg, IpFamily::V4, false);
        assert_eq!(
            bodies(&chains[0]),
            [
                "-j MARK --set-xmark 0x0/0xe0000",
                "-i eni+ -j cali-from-wl-dispatch",
                "-o eni+ -j cali-to-wl-dispatch",
                "-i veth+ -j cali-from-wl-dispatch",
                "-o veth+ -j cali-to-wl-dispatch",
            ]
        );
        assert_eq!(
            bodies(&chains[1]),
            ["-i eni+ -g cali-wl-to-host", "-i veth+ -g cali-wl-to-host"]
        );
        assert_eq!(
            bodies(&chains[2]),
            [
                "-j cali-from-wl-dispatch",
                "-m comment --comment \"Configured DefaultEndpointToHostAction\" -j ACCEPT"
            ]
        );
        assert_eq!(
            bodies(&chains[3]),
            ["-o eni+ -j RETURN", "-o veth+ -j RETURN"]
        );
    }

    #[test]
    fn ipv6_lets_neighbour_discovery_reach_the_host() {
        let chains = static_chains(&RuleConfig::default(), IpFamily::V6, false);
        let wl = bodies(&chains[2]);
        assert_eq!(wl.len(), 8);
        assert_eq!(wl[4], "-p ipv6-icmp -m icmp6 --icmpv6-type 135 -j ACCEPT");
    }

    #[test]
    fn kernel_rules_put_the_accept_last() {
        let rules = kernel_chain_rules(&RuleConfig::default(), IpFamily::V4);
        assert_eq!(rules[0].chain, "FORWARD");
        assert!(rules[0].inserts[0].body.ends_with("-j cali-FORWARD"));
        assert!(rules[0].appends[0].body.ends_with(
            "-m comment --comment \"Policy explicitly accepted packet.\" -m mark --mark 0x10000/0x10000 -j ACCEPT"
        ));
        assert!(rules[2].inserts[0].body.ends_with("-j cali-OUTPUT"));
    }

    #[test]
    fn unisolated_endpoint_goes_straight_to_the_profile() {
        let ips = ["10.0.0.5".parse().unwrap()];
        let [tw, fw] = endpoint_chains(
            &RuleConfig::default(),
            IpFamily::V4,
            "cali1",
            &ips,
            "ns",
            &[],
            &[],
        );
        assert_eq!(tw.name, "cali-tw-cali1");
        assert_eq!(fw.name, "cali-fw-cali1");
        assert_eq!(
            bodies(&tw),
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m conntrack --ctstate INVALID -j DROP",
                "-j MARK --set-xmark 0x0/0x30000",
                "-j cali-pri-kns.ns",
                "-m comment --comment \"Return if profile accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
                "-m comment --comment \"Drop if no profiles matched\" -j DROP",
            ]
        );
        // The egress chain starts with the source check, then the same layout.
        assert_eq!(
            bodies(&fw)[0],
            "! -s 10.0.0.5/32 -m comment --comment \"Drop if the source is not the workload address\" -j DROP"
        );
        assert!(bodies(&fw)[4].ends_with("cali-pro-kns.ns"));
    }

    #[test]
    fn source_check_per_family_and_switch() {
        let ips: [IpAddr; 2] = ["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let cfg = RuleConfig::default();
        let fw6 = endpoint_chains(&cfg, IpFamily::V6, "c", &ips, "ns", &[], &[])[1].clone();
        assert!(bodies(&fw6)[0].starts_with("! -s fd00::5/128 "));
        // No address of the family: nothing of it passes.
        let fw6 = endpoint_chains(&cfg, IpFamily::V6, "c", &ips[..1], "ns", &[], &[])[1].clone();
        assert_eq!(
            bodies(&fw6)[0],
            "-m comment --comment \"Drop if the source is not the workload address\" -j DROP"
        );
        // Several addresses of one family (not from the API server): scratch-mark form.
        let two: [IpAddr; 2] = ["10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap()];
        let fw = endpoint_chains(&cfg, IpFamily::V4, "c", &two, "ns", &[], &[])[1].clone();
        assert_eq!(
            bodies(&fw)[..4],
            [
                "-j MARK --set-xmark 0x40000/0x40000",
                "-s 10.0.0.5/32 -j MARK --set-xmark 0x0/0x40000",
                "-s 10.0.0.6/32 -j MARK --set-xmark 0x0/0x40000",
                "-m comment --comment \"Drop if the source is not the workload address\" -m mark --mark 0x40000/0x40000 -j DROP",
            ]
        );
        // The ingress chain never checks sources; off, neither does the egress chain.
        let off = RuleConfig {
            workload_source_check: false,
            ..RuleConfig::default()
        };
        let [tw, fw] = endpoint_chains(&off, IpFamily::V4, "c", &ips, "ns", &[], &[]);
        assert!(bodies(&fw)[0].starts_with("-m conntrack"));
        assert!(bodies(&tw)[0].starts_with("-m conntrack"));
    }

    #[test]
    fn reject_and_return_actions_follow_config() {
        let cfg = RuleConfig {
            deny_action: crate::rules::DenyAction::Reject,
            allow_action: AllowAction::Return,
            ..RuleConfig::default()
        };
        let [tw, _] = endpoint_chains(&cfg, IpFamily::V6, "c", &[], "ns", &[], &[]);
        let b = bodies(&tw);
        assert_eq!(
            b[0],
            "-m conntrack --ctstate RELATED,ESTABLISHED -j MARK --set-xmark 0x10000/0x10000"
        );
        assert_eq!(b[1], "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN");
        assert!(b
            .last()
            .unwrap()
            .ends_with("-j REJECT --reject-with icmp6-port-unreachable"));
    }
}
