//! The dispatch chains that send a packet to its workload's chain by interface name:
//! felix's two-level prefix tree. Names are sorted and binned by the character after their
//! common prefix; a bin of one name gets a direct goto in the root chain, a larger bin a
//! `-i <prefix><c>+` goto into `cali-from-wl-dispatch-<c>`. Every chain ends in
//! "Unknown interface" DROP, so a pod interface we do not know is fail-closed.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::IpFamily;

use super::deny;
use super::deny_log::{push_logged_drop, DropKind};
use super::flow_log::{FlowAction, FlowPrefix};
use super::provenance::{traced, ChainRole, Rendered, RuleList, RuleRole, TracedChain};
use super::{
    bridge, from_workload_chain, to_workload_chain, Action, Chain, Direction, Rule, RuleConfig,
    FROM_WL_DISPATCH, TO_WL_DISPATCH,
};

/// Both dispatch trees for the given interface names (any order; duplicates ignored).
pub fn dispatch_chains(cfg: &RuleConfig, family: IpFamily, ifaces: &[String]) -> Vec<Chain> {
    dispatch_chains_with_addrs(cfg, family, ifaces, &[])
}

/// [`dispatch_chains`], and in bridge mode also `cali-to-wl-addr-dispatch` from the local pods'
/// addresses (`(address, interface)`; other families are ignored). Routed mode ignores
/// `addrs`.
pub fn dispatch_chains_with_addrs(
    cfg: &RuleConfig,
    family: IpFamily,
    ifaces: &[String],
    addrs: &[(IpAddr, String)],
) -> Vec<Chain> {
    render_dispatch(cfg, family, ifaces, addrs, false)
        .into_iter()
        .map(|(chain, _)| chain)
        .collect()
}

/// [`dispatch_chains_with_addrs`] with provenance: which interface (or address) each rule
/// sends to.
pub fn dispatch_chains_traced(
    cfg: &RuleConfig,
    family: IpFamily,
    ifaces: &[String],
    addrs: &[(IpAddr, String)],
) -> Vec<TracedChain> {
    traced(render_dispatch(cfg, family, ifaces, addrs, true))
}

fn render_dispatch(
    cfg: &RuleConfig,
    family: IpFamily,
    ifaces: &[String],
    addrs: &[(IpAddr, String)],
    traced: bool,
) -> Vec<Rendered> {
    let mut names: Vec<&str> = ifaces.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let mut chains = tree(cfg, family, &names, Side::From, traced);
    chains.extend(tree(cfg, family, &names, Side::To, traced));
    if cfg.bridge.is_some() {
        chains.push(bridge::render_addr_dispatch(cfg, family, addrs, traced));
    }
    // IPVS: the endpoint marks depend on the set of interfaces, as the trees do.
    if let Some(ipvs) = &cfg.kube_ipvs {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        chains.extend(super::ipvs::chains(cfg, ipvs, family, &names, traced));
    }
    chains
}

#[derive(Clone, Copy)]
enum Side {
    From,
    To,
}

impl Side {
    fn root(self) -> &'static str {
        match self {
            Side::From => FROM_WL_DISPATCH,
            Side::To => TO_WL_DISPATCH,
        }
    }
    /// A rule matching the interface (or interface prefix) in this direction: the routed
    /// veth, or in bridge mode the bridge port.
    fn matching(self, cfg: &RuleConfig, iface: String, action: Action) -> Rule {
        let rule = Rule::new(action);
        match (self, cfg.bridge.is_some()) {
            (Side::From, false) => rule.in_iface(iface),
            (Side::To, false) => rule.out_iface(iface),
            (Side::From, true) => rule.matching(bridge::physdev_in(&iface)),
            (Side::To, true) => rule.matching(bridge::physdev_out_bridged(&iface)),
        }
    }
    fn endpoint_chain(self, iface: &str) -> String {
        match self {
            Side::From => from_workload_chain(iface),
            Side::To => to_workload_chain(iface),
        }
    }
    fn role(self, bin: Option<String>) -> ChainRole {
        match self {
            Side::From => ChainRole::FromWorkloadDispatch { bin },
            Side::To => ChainRole::ToWorkloadDispatch { bin },
        }
    }
}

fn tree(
    cfg: &RuleConfig,
    family: IpFamily,
    names: &[&str],
    side: Side,
    traced: bool,
) -> Vec<Rendered> {
    let direction = match side {
        Side::From => Direction::Egress,
        Side::To => Direction::Ingress,
    };
    let unknown = |rules: &mut RuleList, chain: &str| {
        let drop = Rule::new(deny(cfg)).comment("Unknown interface");
        // Flow logs: the copy before the drop (and before its deny-log rule).
        if let Some(copy) = cfg.flow_log.as_ref().and_then(|f| {
            f.copy_of(
                &drop,
                &FlowPrefix {
                    action: FlowAction::UnknownInterface,
                    direction,
                    rule: None,
                    chain: chain.to_string(),
                },
            )
        }) {
            rules.push(copy, || RuleRole::FlowLog);
        }
        push_logged_drop(
            rules,
            cfg.deny_log.as_ref(),
            drop,
            DropKind::UnknownInterface,
            direction,
            chain,
            || RuleRole::UnknownInterface,
        )
    };
    let common = common_prefix(names);
    // Bin key: the common prefix plus the next character, or the name itself when it is the
    // common prefix. BTreeMap keeps bins in name order.
    let mut bins: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in names {
        let key_len = name[common.len()..]
            .chars()
            .next()
            .map_or(name.len(), |c| common.len() + c.len_utf8());
        bins.entry(&name[..key_len]).or_default().push(name);
    }

    let mut root_rules = RuleList::new(traced);
    let mut children = Vec::new();
    for (key, members) in bins {
        if let [only] = members[..] {
            root_rules.push(
                side.matching(
                    cfg,
                    only.to_string(),
                    Action::Goto(side.endpoint_chain(only)),
                ),
                || RuleRole::ToEndpoint {
                    iface: only.to_string(),
                },
            );
            continue;
        }
        let next_char = &key[common.len()..];
        let child = format!("{}-{next_char}", side.root());
        root_rules.push(
            side.matching(cfg, format!("{key}+"), Action::Goto(child.clone())),
            || RuleRole::ToBin {
                prefix: key.to_string(),
            },
        );
        let mut rules = RuleList::new(traced);
        for m in &members {
            rules.push(
                side.matching(cfg, m.to_string(), Action::Goto(side.endpoint_chain(m))),
                || RuleRole::ToEndpoint {
                    iface: m.to_string(),
                },
            );
        }
        unknown(&mut rules, &child);
        children.push(rules.finish(child, family, || side.role(Some(key.to_string()))));
    }
    unknown(&mut root_rules, side.root());
    let mut chains = vec![root_rules.finish(side.root(), family, || side.role(None))];
    chains.extend(children);
    chains
}

fn common_prefix<'a>(names: &[&'a str]) -> &'a str {
    let Some((first, rest)) = names.split_first() else {
        return "";
    };
    let mut len = first.len();
    for n in rest {
        len = first
            .char_indices()
            .zip(n.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map_or(0, |((i, a), _)| i + a.len_utf8())
            .min(len);
    }
    &first[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(chains: &[Chain]) -> Vec<(String, Vec<String>)> {
        chains
            .iter()
            .map(|c| {
                let rules = c
                    .rules
                    .iter()
                    .map(|r| {
                        let hash = format!("-m comment --comment \"cali:{}\"", r.hash);
                        r.body
                            .replace(&hash, "")
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .collect();
                (c.name.clone(), rules)
            })
            .collect()
    }

    #[test]
    fn no_endpoints_drop_everything() {
        let chains = dispatch_chains(&RuleConfig::default(), IpFamily::V4, &[]);
        let s = summary(&chains);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0].1,
            ["-m comment --comment \"Unknown interface\" -j DROP"]
        );
    }

    #[test]
    fn bins_like_the_seed_article() {
        // The seed shows cali-to-wl-dispatch-0 holding two veth-0... names and a direct goto
        // for veth-13dd25c5cb.
        let ifaces: Vec<String> = ["veth-13dd25c5cb", "veth-0ddbc02656", "veth-086099497f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let s = summary(&dispatch_chains(
            &RuleConfig::default(),
            IpFamily::V4,
            &ifaces,
        ));
        let to_root = s.iter().find(|(n, _)| n == "cali-to-wl-dispatch").unwrap();
        assert_eq!(
            to_root.1,
            [
                "-o veth-0+ -g cali-to-wl-dispatch-0",
                "-o veth-13dd25c5cb -g cali-tw-veth-13dd25c5cb",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ]
        );
        let child = s
            .iter()
            .find(|(n, _)| n == "cali-to-wl-dispatch-0")
            .unwrap();
        assert_eq!(
            child.1,
            [
                "-o veth-086099497f -g cali-tw-veth-086099497f",
                "-o veth-0ddbc02656 -g cali-tw-veth-0ddbc02656",
                "-m comment --comment \"Unknown interface\" -j DROP",
            ]
        );
        let from_root = s
            .iter()
            .find(|(n, _)| n == "cali-from-wl-dispatch")
            .unwrap();
        assert_eq!(
            from_root.1[1],
            "-i veth-13dd25c5cb -g cali-fw-veth-13dd25c5cb"
        );
    }

    #[test]
    fn single_endpoint_and_prefix_names() {
        let one = summary(&dispatch_chains(
            &RuleConfig::default(),
            IpFamily::V4,
            &["cali1".into()],
        ));
        assert_eq!(one[0].1[0], "-i cali1 -g cali-fw-cali1");
        // "cali1" is a prefix of the others: it gets its own bin.
        let ifaces: Vec<String> = ["cali1", "cali12", "cali13"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let s = summary(&dispatch_chains(
            &RuleConfig::default(),
            IpFamily::V4,
            &ifaces,
        ));
        assert_eq!(
            s[0].1,
            [
                "-i cali1 -g cali-fw-cali1",
                "-i cali12 -g cali-fw-cali12",
                "-i cali13 -g cali-fw-cali13",
                "-m comment --comment \"Unknown interface\" -j DROP"
            ]
        );
    }
}
