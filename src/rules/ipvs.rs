//! kube-proxy's IPVS mode, felix's way: the endpoint-mark bits, the `cali-forward-check`
//! chain in `INPUT`, the `cali-set-endpoint-mark` dispatch with its `cali-sm-<iface>` chains,
//! and the `cali-forward-endpoint-mark` / `cali-from-endpoint-mark` chains `OUTPUT` sends
//! marked packets to. Pure: no I/O. The design, with the packet path, is
//! `docs/design/ipvs.md`.
//!
//! Why: with IPVS a pod's packet to a ClusterIP (an address on the node's `kube-ipvs0`) is
//! delivered locally (`INPUT`), rewritten by IPVS after the filter hook, and leaves through
//! `OUTPUT`, never `FORWARD`. Judging it in `INPUT` would apply the source pod's egress
//! policy to the ClusterIP, before the rewrite; and `OUTPUT` skips traffic to pods. So
//! `INPUT` only *tags* the packet with its source endpoint's mark, and `OUTPUT` applies the
//! source pod's egress policy (found by the mark) and the destination pod's ingress policy,
//! once IPVS has chosen the backend.
//!
//! Only renders anything when `RuleConfig::kube_ipvs` is set: with IPVS off every chain is
//! byte-identical to what it was before this module existed.
//!
//! kube-proxy's IPVS mode at each layer: read off the node in `host::ipvs`, detected and
//! watched for `run` in `startup::ipvs`, rendered in `rules::ipvs`, evaluated in
//! `verdict::ipvs`.

use std::collections::BTreeMap;

use super::deny;
use super::provenance::{ChainRole, Rendered, RuleList, RuleRole};
use super::{
    bridge, from_workload_chain, length_limited_name, Action, AllowAction, MarkBits, Rule,
    RuleConfig, MAX_CHAIN_NAME_LEN, TO_WL_ADDR_DISPATCH, TO_WL_DISPATCH,
};
use crate::model::IpFamily;

pub const FORWARD_CHECK_CHAIN: &str = "cali-forward-check";
pub const SET_ENDPOINT_MARK_CHAIN: &str = "cali-set-endpoint-mark";
pub const SET_MARK_PREFIX: &str = "cali-sm-";
pub const FORWARD_ENDPOINT_MARK_CHAIN: &str = "cali-forward-endpoint-mark";
pub const FROM_ENDPOINT_MARK_CHAIN: &str = "cali-from-endpoint-mark";
/// ID of the set of this host's addresses (`cali40this-host` / `cali60this-host`, felix's
/// names): every address of the node except those on `kube-ipvs0` (the ClusterIPs).
pub const THIS_HOST_SET_ID: &str = "this-host";
/// The dummy interface kube-proxy's IPVS mode puts every ClusterIP on.
pub const KUBE_IPVS_IFACE: &str = "kube-ipvs0";
/// kube-apiserver's default `--service-node-port-range` (felix's default too).
pub const DEFAULT_NODE_PORT_RANGES: [(u16, u16); 1] = [(30000, 32767)];

/// The endpoint-mark bits: every bit of the mark mask left after accept, pass, scratch0 and
/// scratch1 (felix gives the endpoint mark "the rest" of the mask the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointMarks {
    /// All endpoint-mark bits.
    pub mask: u32,
    /// The lowest of them: the mark of packets from an interface that is no pod's.
    pub non_cali: u32,
}

impl EndpointMarks {
    /// Carves the endpoint bits from `mask` after the bits `used` already took. Refuses a
    /// mask with fewer than 2 spare bits: felix refuses none at all; with one, only the
    /// non-pod mark exists and no pod could be marked, so every pod's Service traffic would
    /// be dropped as "Unknown endpoint".
    pub fn carve(mask: u32, used: &MarkBits) -> Result<EndpointMarks, String> {
        let rest = mask & !used.all();
        if rest.count_ones() < 2 {
            return Err(format!(
                "mark mask {mask:#x} leaves {} bit(s) for the IPVS endpoint mark after accept, pass, scratch0 and scratch1; IPVS support needs at least 2 (one for traffic from non-pod interfaces, the rest numbers the pods: n bits mark 2^n - 2 pods), e.g. 0xffff0000 (12 bits, 4094 pods)",
                rest.count_ones()
            ));
        }
        Ok(EndpointMarks {
            mask: rest,
            non_cali: rest & rest.wrapping_neg(),
        })
    }

    /// How many mark values the bits can number, zero included.
    fn positions(&self) -> u64 {
        1u64 << self.mask.count_ones()
    }

    /// Spreads the bits of `pos` over the mask's bits, lowest first (bit k of `pos` becomes
    /// the k-th lowest bit of the mask), the way felix maps an endpoint number to a mark.
    fn mark_of(&self, pos: u64) -> u32 {
        let mut out = 0u32;
        let mut k = 0;
        for bit in 0..32 {
            let b = 1u32 << bit;
            if self.mask & b != 0 {
                if pos & (1 << k) != 0 {
                    out |= b;
                }
                k += 1;
            }
        }
        out
    }
}

/// 32-bit FNV-1 (multiply, then xor), the hash felix places interfaces by.
fn fnv1_32(text: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h = h.wrapping_mul(0x0100_0193);
        h ^= u32::from(b);
    }
    h
}

/// Each interface's endpoint mark. Like felix: the position is the interface name's FNV-1
/// hash modulo the number of positions, probing upwards past 0, past 1 (the non-pod mark)
/// and past positions already taken. Felix assigns in the order endpoints appear; we assign
/// in name order, so the result depends only on the set of names (the renderer is pure).
/// An interface that finds no free position (more pods than the bits can number) gets no
/// mark: its packets meet "Unknown endpoint" (fail-closed).
pub fn endpoint_marks(marks: &EndpointMarks, ifaces: &[String]) -> BTreeMap<String, u32> {
    let mut names: Vec<&str> = ifaces.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let max = marks.positions();
    let mut taken = std::collections::HashSet::from([0u64, 1u64]);
    let mut out = BTreeMap::new();
    for name in names {
        let start = u64::from(fnv1_32(name));
        let free = (0..max)
            .map(|i| (start + i) % max)
            .find(|pos| !taken.contains(pos));
        if let Some(pos) = free {
            taken.insert(pos);
            out.insert(name.to_string(), marks.mark_of(pos));
        }
    }
    out
}

/// What IPVS support renders with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsConfig {
    pub endpoint: EndpointMarks,
    /// kube-proxy's NodePort ranges (felix's `KubeNodePortRanges`), inclusive.
    pub node_port_ranges: Vec<(u16, u16)>,
}

impl IpvsConfig {
    /// With the endpoint bits carved from `mask` (see [`EndpointMarks::carve`]).
    pub fn new(
        mask: u32,
        used: &MarkBits,
        node_port_ranges: Vec<(u16, u16)>,
    ) -> Result<IpvsConfig, String> {
        Ok(IpvsConfig {
            endpoint: EndpointMarks::carve(mask, used)?,
            node_port_ranges,
        })
    }
}

/// The name of the this-host set of `family`.
pub fn this_host_set(family: IpFamily) -> String {
    crate::rules::sets::set_name(family, THIS_HOST_SET_ID)
}

/// `cali-sm-<iface>`: sets the interface's endpoint mark.
pub fn set_mark_chain(iface: &str) -> String {
    length_limited_name(SET_MARK_PREFIX, iface, MAX_CHAIN_NAME_LEN)
}

fn mark_set(value: u32, mask: u32) -> Action {
    Action::SetMark { value, mask }
}

/// The rules `cali-INPUT` starts with: clear the endpoint mark, let `cali-forward-check`
/// tag what IPVS will forward, and return what it tagged (policy applies in `OUTPUT`).
pub(crate) fn input_rules(ipvs: &IpvsConfig, out: &mut RuleList) {
    let m = ipvs.endpoint.mask;
    out.push(Rule::new(mark_set(0, m)), || {
        RuleRole::KubeIpvs("clear the endpoint mark".into())
    });
    out.push(Rule::new(Action::Jump(FORWARD_CHECK_CHAIN.into())), || {
        RuleRole::KubeIpvs("tag traffic IPVS will forward with its source endpoint's mark".into())
    });
    out.push(
        Rule::new(Action::Return).matching(format!("-m mark ! --mark 0x0/{m:#x}")),
        || RuleRole::KubeIpvs("tagged: its policy applies in OUTPUT, after IPVS".into()),
    );
}

/// The rule `cali-OUTPUT` starts with: packets tagged in `INPUT` go to
/// `cali-forward-endpoint-mark`.
pub(crate) fn output_rules(ipvs: &IpvsConfig, out: &mut RuleList) {
    let m = ipvs.endpoint.mask;
    out.push(
        Rule::new(Action::Goto(FORWARD_ENDPOINT_MARK_CHAIN.into()))
            .matching(format!("-m mark ! --mark 0x0/{m:#x}")),
        || {
            RuleRole::KubeIpvs(
                "traffic IPVS forwards: source egress and destination ingress policy".into(),
            )
        },
    );
}

/// Port ranges as multiport lists of at most 15 slots (a range takes two).
fn port_lists(ranges: &[(u16, u16)]) -> Vec<String> {
    let mut lists = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut slots = 0;
    for &(lo, hi) in ranges {
        let (text, cost) = if lo == hi {
            (lo.to_string(), 1)
        } else {
            (format!("{lo}:{hi}"), 2)
        };
        if slots + cost > 15 {
            lists.push(cur.join(","));
            cur.clear();
            slots = 0;
        }
        cur.push(text);
        slots += cost;
    }
    if !cur.is_empty() {
        lists.push(cur.join(","));
    }
    lists
}

/// `cali-forward-check`, `cali-set-endpoint-mark`, a `cali-sm-<iface>` per local pod
/// interface, `cali-forward-endpoint-mark` and `cali-from-endpoint-mark`. `ifaces`: the
/// local pods' interfaces (bridge ports in bridge mode).
pub(crate) fn chains(
    cfg: &RuleConfig,
    ipvs: &IpvsConfig,
    family: IpFamily,
    ifaces: &[String],
    traced: bool,
) -> Vec<Rendered> {
    let marks = endpoint_marks(&ipvs.endpoint, ifaces);
    let m = ipvs.endpoint.mask;
    let this_host = this_host_set(family);
    let role = |s: &str| {
        let s = s.to_string();
        move || RuleRole::KubeIpvs(s)
    };
    // The packet's input interface: the veth, or in bridge mode the bridge port (physdev:
    // br_netfilter records the port of a frame routed up to the host, so INPUT knows it).
    let from_iface = |iface: &str, action: Action| match cfg.bridge {
        None => Rule::new(action).in_iface(iface),
        Some(_) => Rule::new(action).matching(bridge::physdev_in(iface)),
    };

    let mut check = RuleList::new(traced);
    check.push(
        Rule::new(Action::Return).matching("-m conntrack --ctstate RELATED,ESTABLISHED"),
        role("established: judged as pod-to-host traffic, not tagged"),
    );
    for proto in ["tcp", "udp"] {
        for list in port_lists(&ipvs.node_port_ranges) {
            check.push(
                Rule {
                    protocol: Some(proto),
                    ..Rule::new(Action::Goto(SET_ENDPOINT_MARK_CHAIN.into()))
                        .matching(format!("-m multiport --dports {list}"))
                        .matching(format!("-m set --match-set {this_host} dst"))
                },
                role("a NodePort of this host: IPVS forwards it"),
            );
        }
    }
    check.push(
        Rule::new(Action::Jump(SET_ENDPOINT_MARK_CHAIN.into()))
            .comment("To kubernetes service")
            .matching(format!("-m set ! --match-set {this_host} dst")),
        role("not an address of this host (a ClusterIP on kube-ipvs0): IPVS forwards it"),
    );

    let mut set_mark = RuleList::new(traced);
    let mut sm_chains = Vec::new();
    for (iface, mark) in &marks {
        let chain = set_mark_chain(iface);
        set_mark.push(
            from_iface(iface, Action::Goto(chain.clone())),
            role(&format!("from pod interface {iface}: its endpoint mark")),
        );
        let mut sm = RuleList::new(traced);
        sm.push(
            Rule::new(mark_set(*mark, m)),
            role(&format!("endpoint mark of {iface}")),
        );
        sm_chains.push(sm.finish(chain, family, || {
            ChainRole::KubeIpvs(format!("sets the endpoint mark of {iface}"))
        }));
    }
    for prefix in &cfg.interface_prefixes {
        set_mark.push(
            from_iface(&format!("{prefix}+"), deny(cfg)).comment("Unknown endpoint"),
            role("a pod interface we have not programmed (fail-closed)"),
        );
    }
    set_mark.push(
        Rule::new(mark_set(ipvs.endpoint.non_cali, m)).comment("Non-Cali endpoint mark"),
        role("from an interface that is no pod's"),
    );

    let mut from_mark = RuleList::new(traced);
    for (iface, mark) in &marks {
        from_mark.push(
            Rule::new(Action::Goto(from_workload_chain(iface))).mark_match(*mark, m),
            role(&format!("tagged by {iface}: its egress policy")),
        );
    }
    from_mark.push(
        Rule::new(deny(cfg)).comment("Unknown interface"),
        role("a mark no pod has (fail-closed)"),
    );

    let mut fwd = RuleList::new(traced);
    fwd.push(
        Rule::new(Action::Jump(FROM_ENDPOINT_MARK_CHAIN.into())).matching(format!(
            "-m mark ! --mark {:#x}/{m:#x}",
            ipvs.endpoint.non_cali
        )),
        role("from a pod: its egress policy, by the mark"),
    );
    match &cfg.bridge {
        None => {
            for prefix in &cfg.interface_prefixes {
                fwd.push(
                    Rule::new(Action::Jump(TO_WL_DISPATCH.into())).out_iface(format!("{prefix}+")),
                    role("to a pod: its ingress policy"),
                );
            }
        }
        // Routed out into the bridge: OUTPUT never knows the port, so the pod is found by
        // its address, as for traffic routed into the bridge in FORWARD.
        Some(bridge) => fwd.push(
            Rule::new(Action::Jump(TO_WL_ADDR_DISPATCH.into())).out_iface(bridge.clone()),
            role("to a pod on the bridge: its ingress policy, by address"),
        ),
    }
    fwd.push(Rule::new(mark_set(0, m)), role("clear the endpoint mark"));
    let accept = match cfg.allow_action {
        AllowAction::Accept => Action::Accept,
        AllowAction::Return => Action::Return,
    };
    fwd.push(
        Rule::new(accept)
            .comment("Policy explicitly accepted packet.")
            .mark_match(cfg.marks.accept, cfg.marks.accept),
        role("accept what policy accepted (accept mark)"),
    );

    let mut out = vec![
        check.finish(FORWARD_CHECK_CHAIN, family, || {
            ChainRole::KubeIpvs("IPVS: tags in INPUT what IPVS will forward".into())
        }),
        set_mark.finish(SET_ENDPOINT_MARK_CHAIN, family, || {
            ChainRole::KubeIpvs("IPVS: the endpoint mark by input interface".into())
        }),
        fwd.finish(FORWARD_ENDPOINT_MARK_CHAIN, family, || {
            ChainRole::KubeIpvs("IPVS: policy in OUTPUT for what IPVS forwarded".into())
        }),
        from_mark.finish(FROM_ENDPOINT_MARK_CHAIN, family, || {
            ChainRole::KubeIpvs("IPVS: egress chain by endpoint mark".into())
        }),
    ];
    out.extend(sm_chains);
    out
}

#[cfg(test)]
mod tests;
