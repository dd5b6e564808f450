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
    INPUT_CHAIN, OUTPUT_CHAIN, TO_WL_DISPATCH, WL_START_CHAIN, WL_TO_HOST_CHAIN,
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

    let mut wl_start = RuleList::new(traced);
    workload_start_rules(cfg, &mut wl_start);

    vec![
        forward.finish(FORWARD_CHAIN, family, || ChainRole::Forward),
        input.finish(INPUT_CHAIN, family, || ChainRole::Input),
        wl_to_host.finish(WL_TO_HOST_CHAIN, family, || ChainRole::WorkloadToHost),
        output.finish(OUTPUT_CHAIN, family, || ChainRole::Output),
        wl_start.finish(WL_START_CHAIN, family, || ChainRole::WorkloadStart),
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

/// What felix puts at the top of every workload chain, kept once in `cali-wl-start` for all
/// of them: established and related connections accepted (with
/// `FELIX_IPTABLESFILTERALLOWACTION=RETURN`: marked accepted and returned to the workload
/// chain, which returns on the mark), invalid ones dropped, the accept and pass bits cleared.
///
/// Why shared: legacy iptables rewrites the whole table on every change, so its cost follows
/// the table's rules and matches (docs/development/benchmarks.md, "Where a legacy restore's
/// time goes"); these three rules were a sixth of the table's rules and a fifth of its matches
/// at 110 pods, and the same in every pod's two chains. The jump keeps felix's reason for
/// having them per workload (commit 1e4956f516): only traffic that the dispatch sent to a
/// workload chain is ever accepted as established, never that of an interface not ours.
fn workload_start_rules(cfg: &RuleConfig, rules: &mut RuleList) {
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
}

/// A workload chain: the jump to the shared start (conntrack, marks), then per tier that has
/// policies in this direction felix's section (clear the pass bit, each policy's jump guarded
/// by "not passed" and followed by "Return if policy accepted"), the NetworkPolicy section
/// ending with its drop (the pod is isolated), then the namespace profile (allow). A ClusterNetworkPolicy tier has no end
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
    rules.push(Rule::new(Action::Jump(WL_START_CHAIN.into())), || {
        RuleRole::JumpToWorkloadStart
    });
    if cfg.allow_action == AllowAction::Return {
        // The start chain's RETURN only left the start chain; an established packet comes
        // back marked accepted, anything else with the bits cleared.
        rules.push(
            Rule::new(Action::Return).mark_match(m.accept, m.accept),
            || RuleRole::ReturnIfEstablished,
        );
    }
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
mod tests;
