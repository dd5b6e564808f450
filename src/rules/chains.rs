//! The static chains (`cali-FORWARD`, `cali-INPUT`, `cali-wl-to-host`, `cali-OUTPUT`), our
//! jumps in the kernel chains, the per-workload chains (`cali-tw-`/`cali-fw-`) and the
//! per-namespace profile chains, in the order of felix's `iptables-save` output.

use crate::model::{IpFamily, ObjectKey};

use super::deny_log::{self, DropKind};
use super::provenance::{traced, ChainRole, Rendered, RuleList, RuleRole, TracedChain};
use super::{
    bridge, deny, from_workload_chain, policy_chain, profile_chain, render_rules,
    to_workload_chain, Action, AllowAction, Chain, ChainInsertMode, Direction,
    EndpointToHostAction, RenderedRule, Rule, RuleConfig, FORWARD_CHAIN, FROM_WL_DISPATCH,
    INPUT_CHAIN, OUTPUT_CHAIN, TO_WL_DISPATCH, WL_TO_HOST_CHAIN,
};

/// ICMPv6 types a pod must be able to send to its host before any policy: MLD (130-132),
/// router solicitation (133), neighbour solicitation/advertisement (135, 136).
const ICMPV6_TO_HOST_TYPES: [u8; 6] = [130, 131, 132, 133, 135, 136];

pub fn static_chains(cfg: &RuleConfig, family: IpFamily) -> Vec<Chain> {
    render_static(cfg, family, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`static_chains`] with what each rule is for.
pub fn static_chains_traced(cfg: &RuleConfig, family: IpFamily) -> Vec<TracedChain> {
    traced(render_static(cfg, family, true))
}

fn render_static(cfg: &RuleConfig, family: IpFamily, traced: bool) -> Vec<Rendered> {
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

/// `cali-tw-<iface>` (ingress, to the workload) and `cali-fw-<iface>` (egress).
pub fn endpoint_chains(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    namespace: &str,
    ingress: &[ObjectKey],
    egress: &[ObjectKey],
) -> [Chain; 2] {
    let [tw, fw] = render_endpoint(cfg, family, iface, None, namespace, ingress, egress, false);
    [tw.0, fw.0]
}

/// [`endpoint_chains`] with provenance; `pod` is the pod owning `iface`.
pub fn endpoint_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    pod: &ObjectKey,
    namespace: &str,
    ingress: &[ObjectKey],
    egress: &[ObjectKey],
) -> Vec<TracedChain> {
    traced(
        render_endpoint(
            cfg,
            family,
            iface,
            Some(pod),
            namespace,
            ingress,
            egress,
            true,
        )
        .into(),
    )
}

#[allow(clippy::too_many_arguments)]
fn render_endpoint(
    cfg: &RuleConfig,
    family: IpFamily,
    iface: &str,
    pod: Option<&ObjectKey>,
    namespace: &str,
    ingress: &[ObjectKey],
    egress: &[ObjectKey],
    traced: bool,
) -> [Rendered; 2] {
    let chain = |direction: Direction, name: String, policies: &[ObjectKey]| {
        endpoint_rules(cfg, &name, direction, namespace, policies, traced).finish(
            name.clone(),
            family,
            || ChainRole::Workload {
                pod: pod.cloned(),
                iface: iface.to_string(),
                direction,
            },
        )
    };
    [
        chain(Direction::Ingress, to_workload_chain(iface), ingress),
        chain(Direction::Egress, from_workload_chain(iface), egress),
    ]
}

fn endpoint_rules(
    cfg: &RuleConfig,
    chain: &str,
    direction: Direction,
    namespace: &str,
    policies: &[ObjectKey],
    traced: bool,
) -> RuleList {
    let m = cfg.marks;
    let established = "-m conntrack --ctstate RELATED,ESTABLISHED";
    let mut rules = RuleList::new(traced);
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
    if !policies.is_empty() {
        rules.push(
            Rule::new(Action::SetMark {
                value: 0,
                mask: m.pass,
            })
            .comment("Start of policies"),
            || RuleRole::StartOfPolicies,
        );
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
        deny_log::push_logged_drop(
            &mut rules,
            cfg.deny_log.as_ref(),
            Rule::new(deny(cfg))
                .comment("Drop if no policies passed packet")
                .mark_match(0, m.pass),
            DropKind::Policy,
            direction,
            chain,
            || RuleRole::DropIfNoPolicyPassed,
        );
    }
    rules.push(
        Rule::new(Action::Jump(profile_chain(direction, namespace))),
        || RuleRole::JumpToProfile,
    );
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
    rules
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
        let chains = static_chains(&cfg, IpFamily::V4);
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
        let chains = static_chains(&RuleConfig::default(), IpFamily::V6);
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
        let [tw, fw] = endpoint_chains(
            &RuleConfig::default(),
            IpFamily::V4,
            "cali1",
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
        assert!(bodies(&fw)[3].ends_with("cali-pro-kns.ns"));
    }

    #[test]
    fn reject_and_return_actions_follow_config() {
        let cfg = RuleConfig {
            deny_action: crate::rules::DenyAction::Reject,
            allow_action: AllowAction::Return,
            ..RuleConfig::default()
        };
        let [tw, _] = endpoint_chains(&cfg, IpFamily::V6, "c", "ns", &[], &[]);
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
