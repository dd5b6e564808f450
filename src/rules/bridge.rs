//! Bridge mode: pods whose host veths are ports of one Linux bridge (flannel's `cni0`, the CNI
//! `bridge` plugin), with `br_netfilter` loaded and `net.bridge.bridge-nf-call-iptables=1`
//! (`…-ip6tables=1` for IPv6) in the node's network namespace.
//!
//! # What the kernel shows iptables
//!
//! Every pod's traffic reaches iptables with the *bridge* as its interface (`-i cni0`,
//! `-o cni0`): `-i/-o <veth>` never matches. The port a frame entered or leaves by is visible
//! only to `-m physdev`, and only when the kernel knows it. What each path looks like in
//! `FORWARD` (checked on a real kernel with counters, see `tests/bridge_netns.rs`):
//!
//! | path | in / out | physdev |
//! |---|---|---|
//! | (a) pod → pod, same node (bridged) | `cni0` / `cni0` | in and out known, `--physdev-is-bridged` |
//! | (b) pod → other node (routed out of the bridge) | `cni0` / uplink | in known, not bridged |
//! | (c) other node → pod (routed into the bridge) | uplink / `cni0` | **neither**: the port is chosen by the bridge after `FORWARD`, and `br_netfilter` runs no iptables hook for a routed packet's bridge pass |
//! | (d) pod → ClusterIP → pod on the same node | `cni0` / `cni0` | in and out known, bridged |
//! | pod → pod through the gateway MAC (routed back into the bridge) | `cni0` / `cni0` | in known, not bridged |
//!
//! Path (d): kube-proxy's DNAT runs in `PREROUTING`, which `br_netfilter` calls from the
//! bridge's own pre-routing hook. When the new destination routes back out of the same bridge,
//! `br_netfilter` does not hand the frame to the IP stack: it rewrites the destination MAC
//! to the backend's and re-injects the frame into the bridge ("bridged DNAT"), so it is
//! *bridged*, with both ports known, even though the pod addressed it to the gateway MAC. (If
//! a kernel routed it instead, it would look like the last row, which is covered too.) A
//! ClusterIP whose backend is on another node is path (b) after DNAT; a NodePort or
//! ClusterIP reached from another node with a local backend is path (c).
//!
//! # How each path is enforced
//!
//! `cali-FORWARD` sends
//! - every packet that entered from a pod port, `-m physdev --physdev-in veth+`, to
//!   `cali-from-wl-dispatch`, whose entries match `--physdev-in <veth>`: the pod's egress
//!   policy, for (a), (b), (d) and the gateway row. The port is where the frame really came
//!   from, so a pod cannot pick another pod's egress policy by its source address;
//! - every bridged packet to a pod port, `-m physdev --physdev-out veth+
//!   --physdev-is-bridged`, to `cali-to-wl-dispatch`, whose entries match `--physdev-out
//!   <veth> --physdev-is-bridged`: the ingress policy of the port the bridge really chose, for
//!   (a) and (d);
//! - every packet routed into the bridge, `-o cni0 -m physdev ! --physdev-is-bridged`, to
//!   `cali-to-wl-addr-dispatch`, one `-d <pod IP>/32` (`/128`) goto per local pod address: the
//!   ingress policy of the pod the packet is routed to, for (c) and the gateway row. For a
//!   routed packet the destination address *is* what picks the port (the kernel resolves the
//!   next hop's MAC from it), so matching the address matches the pod that will receive it.
//!
//! Each dispatch chain ends in a DROP for what it does not know (a pod port or address whose
//! pod we have not resolved yet), as in routed mode: fail-closed. The mark bits keep felix's
//! protocol: `cali-FORWARD` clears pass and scratch, the `cali-fw-`/`cali-tw-` chains clear
//! accept and pass, set accept when policy allows, and our last rule in `FORWARD` accepts on
//! the accept bit; for a bridged frame that lets the bridge forward it.
//!
//! Pod → host traffic (`INPUT`, `-i cni0`) goes through `cali-wl-to-host` by `--physdev-in
//! veth+`, as in routed mode by `-i cali+`; host → pod traffic (`OUTPUT -o cni0`) is not
//! policed (kubelet probes).
//!
//! IPv6: a bridged pod resolves its neighbours on the same node itself (neighbour
//! solicitation and advertisement are ICMPv6 packets that, bridged, traverse `ip6tables
//! FORWARD`, unlike ARP). `cali-FORWARD` accepts bridged ICMPv6 types 135 and 136 before any
//! policy, the way ARP is never filtered, or an egress policy would cut the pod off its
//! neighbours.
//!
//! # Limits
//!
//! - The bridge must hold only pod ports whose names start with an interface prefix (plus
//!   nothing else that needs routed traffic into it): a packet routed into the bridge to an
//!   address that is no local pod is dropped.
//! - Without `br_netfilter` or with `bridge-nf-call-iptables=0` bridged traffic never reaches
//!   iptables and paths (a) and (d) are not policed; the preflight check (`host::preflight`)
//!   refuses the node then.
//! - Layer-2 spoofing (a pod sending with another pod's MAC or answering ARP for another
//!   pod's address) is not prevented here, as in flannel itself.
//!
//! Bridge mode at two layers: naming a pod's bridge port in `iface_naming::bridge`, the chains
//! bridged traffic goes through in `rules::bridge`.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::IpFamily;

use super::deny;
use super::deny_log;
use super::provenance::{ChainRole, Rendered, RuleList, RuleRole};
use super::{to_workload_chain, Action, Chain, Rule, RuleConfig, TO_WL_ADDR_DISPATCH};

/// Neighbour solicitation and advertisement: pods on one bridge resolve each other with them.
pub const BRIDGED_ICMPV6_TYPES: [u8; 2] = [135, 136];

/// `-m physdev --physdev-in <port>`: the frame entered the bridge from `port` (a prefix with
/// `+` matches every port starting with it).
pub fn physdev_in(port: &str) -> String {
    format!("-m physdev --physdev-in {}", super::token::token(port))
}

/// `-m physdev --physdev-out <port> --physdev-is-bridged`: the bridge forwards the frame to
/// `port`. Only bridged frames have an output port in `FORWARD`.
pub fn physdev_out_bridged(port: &str) -> String {
    format!(
        "-m physdev --physdev-out {} --physdev-is-bridged",
        super::token::token(port)
    )
}

/// `-m physdev ! --physdev-is-bridged`: routed (or never on a bridge).
pub const NOT_BRIDGED: &str = "-m physdev ! --physdev-is-bridged";

/// The `cali-FORWARD` rules of bridge mode after the mark reset.
pub(crate) fn forward_rules(cfg: &RuleConfig, bridge: &str, family: IpFamily, out: &mut RuleList) {
    use super::{FROM_WL_DISPATCH, TO_WL_DISPATCH};
    if family == IpFamily::V6 {
        for t in BRIDGED_ICMPV6_TYPES {
            out.push(
                Rule {
                    protocol: Some("ipv6-icmp"),
                    ..Rule::new(Action::Accept)
                        .matching("-m physdev --physdev-is-bridged")
                        .matching(format!("-m icmp6 --icmpv6-type {t}"))
                },
                || RuleRole::AcceptBridgedNeighbourDiscovery,
            );
        }
    }
    for prefix in &cfg.interface_prefixes {
        out.push(
            Rule::new(Action::Jump(FROM_WL_DISPATCH.into()))
                .matching(physdev_in(&format!("{prefix}+"))),
            || RuleRole::FromWorkloads {
                prefix: prefix.clone(),
            },
        );
        out.push(
            Rule::new(Action::Jump(TO_WL_DISPATCH.into()))
                .matching(physdev_out_bridged(&format!("{prefix}+"))),
            || RuleRole::ToWorkloads {
                prefix: prefix.clone(),
            },
        );
    }
    out.push(
        Rule::new(Action::Jump(TO_WL_ADDR_DISPATCH.into()))
            .out_iface(bridge)
            .matching(NOT_BRIDGED),
        || RuleRole::RoutedIntoBridge,
    );
}

/// `cali-to-wl-addr-dispatch`: a goto into the pod's `cali-tw-` chain per local pod address
/// of `family` (sorted), then DROP.
pub fn addr_dispatch_chain(
    cfg: &RuleConfig,
    family: IpFamily,
    addrs: &[(IpAddr, String)],
) -> Chain {
    render_addr_dispatch(cfg, family, addrs, false).0
}

pub(crate) fn render_addr_dispatch(
    cfg: &RuleConfig,
    family: IpFamily,
    addrs: &[(IpAddr, String)],
    traced: bool,
) -> Rendered {
    let mut sorted: Vec<&(IpAddr, String)> = addrs
        .iter()
        .filter(|(ip, _)| IpFamily::of(ip) == family)
        .collect();
    sorted.sort();
    sorted.dedup_by(|a, b| a.0 == b.0);
    let mut rules = RuleList::new(traced);
    for (ip, iface) in sorted {
        rules.push(
            Rule {
                dst: Some(IpNet::from(*ip)),
                ..Rule::new(Action::Goto(to_workload_chain(iface)))
            },
            || RuleRole::ToEndpointByAddress {
                addr: *ip,
                iface: iface.clone(),
            },
        );
    }
    // Traffic routed to an address no programmed pod has: a pod not programmed yet, as the
    // dispatch trees' "Unknown interface".
    deny_log::push_logged_drop(
        &mut rules,
        cfg.deny_log.as_ref(),
        Rule::new(deny(cfg)).comment("Unknown workload address"),
        deny_log::DropKind::UnknownInterface,
        super::Direction::Ingress,
        TO_WL_ADDR_DISPATCH,
        || RuleRole::UnknownAddress,
    );
    rules.finish(TO_WL_ADDR_DISPATCH, family, || {
        ChainRole::ToWorkloadAddressDispatch
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::chains::static_chains;
    use crate::rules::dispatch::{dispatch_chains, dispatch_chains_with_addrs};

    fn cfg() -> RuleConfig {
        RuleConfig {
            interface_prefixes: vec!["veth".into()],
            bridge: Some("cni0".into()),
            ..RuleConfig::default()
        }
    }

    fn bodies(c: &Chain) -> Vec<String> {
        c.rules
            .iter()
            .map(|r| {
                r.body
                    .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "")
                    .replace(&format!(" -m comment --comment \"cali:{}\"", r.hash), "")
            })
            .collect()
    }

    #[test]
    fn static_chains_match_bridge_ports() {
        let chains = static_chains(&cfg(), IpFamily::V4, false);
        assert_eq!(
            bodies(&chains[0]),
            [
                "-j MARK --set-xmark 0x0/0xe0000",
                "-m physdev --physdev-in veth+ -j cali-from-wl-dispatch",
                "-m physdev --physdev-out veth+ --physdev-is-bridged -j cali-to-wl-dispatch",
                "-o cni0 -m physdev ! --physdev-is-bridged -j cali-to-wl-addr-dispatch",
            ]
        );
        assert_eq!(
            bodies(&chains[1]),
            ["-m physdev --physdev-in veth+ -g cali-wl-to-host"]
        );
        assert_eq!(bodies(&chains[3]), ["-o cni0 -j RETURN"]);
        let v6 = static_chains(&cfg(), IpFamily::V6, false);
        assert_eq!(
            bodies(&v6[0])[1],
            "-p ipv6-icmp -m physdev --physdev-is-bridged -m icmp6 --icmpv6-type 135 -j ACCEPT"
        );
    }

    #[test]
    fn routed_mode_is_unchanged() {
        let routed = RuleConfig::default();
        let chains = static_chains(&routed, IpFamily::V4, false);
        assert_eq!(bodies(&chains[0])[1], "-i cali+ -j cali-from-wl-dispatch");
        let d = dispatch_chains_with_addrs(
            &routed,
            IpFamily::V4,
            &["cali1".into()],
            &[("10.0.0.1".parse().unwrap(), "cali1".into())],
        );
        assert_eq!(d, dispatch_chains(&routed, IpFamily::V4, &["cali1".into()]));
        assert!(d.iter().all(|c| c.name != TO_WL_ADDR_DISPATCH));
    }

    #[test]
    fn dispatch_trees_use_physdev_and_addresses_dispatch_routed_traffic() {
        let ifaces: Vec<String> = ["veth0a1b2c3d", "veth0a9f8e7d", "vethf00dbeef"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let addrs: Vec<(IpAddr, String)> = vec![
            ("10.244.0.3".parse().unwrap(), "veth0a9f8e7d".into()),
            ("10.244.0.2".parse().unwrap(), "veth0a1b2c3d".into()),
            ("fd00::2".parse().unwrap(), "veth0a1b2c3d".into()),
        ];
        let chains = dispatch_chains_with_addrs(&cfg(), IpFamily::V4, &ifaces, &addrs);
        let by_name = |n: &str| bodies(chains.iter().find(|c| c.name == n).unwrap());
        assert_eq!(
            by_name("cali-from-wl-dispatch"),
            [
                "-m physdev --physdev-in veth0+ -g cali-from-wl-dispatch-0",
                "-m physdev --physdev-in vethf00dbeef -g cali-fw-vethf00dbeef",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ]
        );
        assert_eq!(
            by_name("cali-to-wl-dispatch-0"),
            [
                "-m physdev --physdev-out veth0a1b2c3d --physdev-is-bridged -g cali-tw-veth0a1b2c3d",
                "-m physdev --physdev-out veth0a9f8e7d --physdev-is-bridged -g cali-tw-veth0a9f8e7d",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ]
        );
        assert_eq!(
            by_name(TO_WL_ADDR_DISPATCH),
            [
                "-d 10.244.0.2/32 -g cali-tw-veth0a1b2c3d",
                "-d 10.244.0.3/32 -g cali-tw-veth0a9f8e7d",
                "-m comment --comment \"Unknown workload address\" -j DROP",
            ]
        );
        let v6 = dispatch_chains_with_addrs(&cfg(), IpFamily::V6, &ifaces, &addrs);
        let addr6 = v6.iter().find(|c| c.name == TO_WL_ADDR_DISPATCH).unwrap();
        assert_eq!(bodies(addr6)[0], "-d fd00::2/128 -g cali-tw-veth0a1b2c3d");
    }
}
