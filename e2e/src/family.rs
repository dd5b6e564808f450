//! The IP families a simulated cluster runs (`--ip-family ipv4|ipv6|dual`) and the one fixed
//! map from the scenarios' IPv4 addresses into the IPv6 pod space.
//!
//! Scenarios are written in IPv4. An IPv6 or dual-stack cluster gets every address (pods,
//! ClusterIPs, node underlay, bridge gateways, and the literals and `${ip:…}`/`${cidr:…}`
//! expansions in policies) through [`embed_net`]: `a.b.c.d/N` becomes
//! `<CLUSTER_PREFIX>::a.b.c.d/(96+N)`, and `0.0.0.0/0` becomes `::/0`. The map is injective
//! and keeps every containment relation (`A ⊆ B` exactly when `embed(A) ⊆ embed(B)`), so an
//! expectation written for the IPv4 cluster holds unchanged for the IPv6 one. The one place
//! that is not a plain prefix shift, `0.0.0.0/0 → ::/0`, keeps "everything" meaning
//! everything (link-local and other addresses outside the cluster /96 too), as a user writing
//! both families would.
//!
//! Policies are rewritten structurally (every `ipBlock` of every ingress and egress rule),
//! not textually, so nothing else in a policy can be touched by accident. Pure: no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{anyhow, Context};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netpol_agent::model::IpFamily;
use serde_yaml_ng::Value;

/// The /96 every IPv4 address of a scenario is embedded in (a ULA prefix: never routed off
/// the machine).
pub const CLUSTER_PREFIX: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0e2e, 0, 0, 0, 0, 0, 0);

/// Which families the cluster's pods, services and nodes have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FamilyMode {
    /// IPv4 only (the scenarios as written).
    #[default]
    Ipv4,
    /// IPv6 only: every address embedded.
    Ipv6,
    /// Dual-stack: both, IPv4 first (`status.podIPs`, ClusterIPs); every probe runs over both.
    Dual,
}

impl FamilyMode {
    pub fn name(self) -> &'static str {
        match self {
            FamilyMode::Ipv4 => "ipv4",
            FamilyMode::Ipv6 => "ipv6",
            FamilyMode::Dual => "dual",
        }
    }

    /// The families pods get addresses of, in the order `status.podIPs` lists them.
    pub fn families(self) -> &'static [IpFamily] {
        match self {
            FamilyMode::Ipv4 => &[IpFamily::V4],
            FamilyMode::Ipv6 => &[IpFamily::V6],
            FamilyMode::Dual => &[IpFamily::V4, IpFamily::V6],
        }
    }

    pub fn has(self, family: IpFamily) -> bool {
        self.families().contains(&family)
    }

    /// The families the agent programs (and the convergence check compares): with any IPv6
    /// in the cluster the agent runs with IPv6 support, which always programs IPv4 as well.
    pub fn agent_families(self) -> &'static [IpFamily] {
        match self {
            FamilyMode::Ipv4 => &[IpFamily::V4],
            FamilyMode::Ipv6 | FamilyMode::Dual => &[IpFamily::V4, IpFamily::V6],
        }
    }
}

pub fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// `a.b.c.d` → `<CLUSTER_PREFIX>::a.b.c.d`.
pub fn embed_addr(addr: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(CLUSTER_PREFIX) | u128::from(u32::from(addr)))
}

/// `a.b.c.d/N` → `<CLUSTER_PREFIX>::a.b.c.d/(96+N)`; `0.0.0.0/0` → `::/0`.
pub fn embed_net(net: Ipv4Net) -> Ipv6Net {
    if net.prefix_len() == 0 {
        return Ipv6Net::new(Ipv6Addr::UNSPECIFIED, 0).expect("valid prefix");
    }
    Ipv6Net::new(embed_addr(net.network()), 96 + net.prefix_len()).expect("at most 128")
}

/// An address of `family` for a cluster address written in IPv4.
pub fn addr_of(addr: Ipv4Addr, family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(addr),
        IpFamily::V6 => IpAddr::V6(embed_addr(addr)),
    }
}

/// A network of `family` for a cluster network written in IPv4.
pub fn net_of(net: Ipv4Net, family: IpFamily) -> IpNet {
    match family {
        IpFamily::V4 => IpNet::V4(net),
        IpFamily::V6 => IpNet::V6(embed_net(net)),
    }
}

/// The NetworkPolicy document `doc` (one YAML document) for a cluster of `mode`: every IPv4
/// `ipBlock` replaced by its embedding (ipv6), or kept and followed by its embedding (dual,
/// with the except entries split by family). IPv6 blocks written as such are kept as they
/// are in every mode. In ipv4 mode the document comes back unchanged.
pub fn rewrite_policy(doc: &str, mode: FamilyMode) -> anyhow::Result<String> {
    if mode == FamilyMode::Ipv4 {
        return Ok(doc.to_string());
    }
    let mut value: Value = serde_yaml_ng::from_str(doc).map_err(|e| anyhow!("{e}"))?;
    if let Some(spec) = value.get_mut("spec") {
        for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
            let Some(Value::Sequence(rules)) = spec.get_mut(direction) else {
                continue;
            };
            for (i, rule) in rules.iter_mut().enumerate() {
                let Some(Value::Sequence(list)) = rule.get_mut(peers) else {
                    continue;
                };
                let mut out = Vec::with_capacity(list.len());
                for peer in list.drain(..) {
                    out.extend(
                        rewrite_peer(peer, mode)
                            .with_context(|| format!("spec.{direction}[{i}].{peers}"))?,
                    );
                }
                *list = out;
            }
        }
    }
    Ok(serde_yaml_ng::to_string(&value)?)
}

/// The ClusterNetworkPolicy document `doc` for a cluster of `mode`: in every egress peer's
/// `networks`, each IPv4 CIDR replaced by its embedding (ipv6) or kept and followed by it
/// (dual); IPv6 CIDRs written as such are kept; an entry that would repeat one already in
/// the list is left out (the API requires unique entries, and upstream's suite writes
/// `0.0.0.0/0` beside `::/0`, the embedding of the former). A CIDR that does not parse is
/// left for the agent to reject. In ipv4 mode the document comes back unchanged.
pub fn rewrite_cluster_policy(doc: &str, mode: FamilyMode) -> anyhow::Result<String> {
    if mode == FamilyMode::Ipv4 {
        return Ok(doc.to_string());
    }
    let mut value: Value = serde_yaml_ng::from_str(doc).map_err(|e| anyhow!("{e}"))?;
    let Some(Value::Sequence(rules)) = value.get_mut("spec").and_then(|s| s.get_mut("egress"))
    else {
        return Ok(doc.to_string());
    };
    for rule in rules.iter_mut() {
        let Some(Value::Sequence(peers)) = rule.get_mut("to") else {
            continue;
        };
        for peer in peers.iter_mut() {
            let Some(Value::Sequence(nets)) = peer.get_mut("networks") else {
                continue;
            };
            let mut out: Vec<Value> = Vec::with_capacity(nets.len() * 2);
            let mut push = |v: Value| {
                if !out.contains(&v) {
                    out.push(v);
                }
            };
            for entry in nets.drain(..) {
                match entry.as_str().and_then(|t| t.parse::<IpNet>().ok()) {
                    Some(IpNet::V4(net)) => {
                        let v6 = Value::from(embed_net(net).to_string());
                        if mode == FamilyMode::Dual {
                            push(entry);
                        }
                        push(v6);
                    }
                    _ => push(entry),
                }
            }
            *nets = out;
        }
    }
    Ok(serde_yaml_ng::to_string(&value)?)
}

/// One peer becomes one (ipv6) or two (dual) peers when it is an IPv4 ipBlock.
fn rewrite_peer(peer: Value, mode: FamilyMode) -> anyhow::Result<Vec<Value>> {
    let Some(block) = peer.get("ipBlock") else {
        return Ok(vec![peer]);
    };
    let cidr_text = block
        .get("cidr")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("ipBlock without a cidr string"))?;
    let cidr: IpNet = cidr_text
        .parse()
        .map_err(|_| anyhow!("ipBlock.cidr {cidr_text:?} is not a CIDR"))?;
    let IpNet::V4(cidr4) = cidr else {
        return Ok(vec![peer]);
    };
    let mut except4 = Vec::new();
    let mut except6 = Vec::new();
    if let Some(list) = block.get("except") {
        let Value::Sequence(list) = list else {
            anyhow::bail!("ipBlock.except is not a list");
        };
        for entry in list {
            let text = entry
                .as_str()
                .ok_or_else(|| anyhow!("ipBlock.except entry {entry:?} is not a string"))?;
            match text.parse::<IpNet>() {
                Ok(IpNet::V4(net)) => {
                    except4.push(net.to_string());
                    except6.push(embed_net(net).to_string());
                }
                Ok(IpNet::V6(net)) => except6.push(net.to_string()),
                Err(_) => anyhow::bail!("ipBlock.except entry {text:?} is not a CIDR"),
            }
        }
    }
    let v6 = with_block(&peer, embed_net(cidr4).to_string(), except6);
    Ok(match mode {
        FamilyMode::Ipv4 => vec![peer],
        FamilyMode::Ipv6 => vec![v6],
        FamilyMode::Dual => vec![with_block(&peer, cidr4.to_string(), except4), v6],
    })
}

/// `peer` with its ipBlock's cidr and except replaced (except left out when empty).
fn with_block(peer: &Value, cidr: String, except: Vec<String>) -> Value {
    let mut peer = peer.clone();
    if let Some(Value::Mapping(block)) = peer.get_mut("ipBlock") {
        block.insert(Value::from("cidr"), Value::from(cidr));
        if except.is_empty() {
            block.remove("except");
        } else {
            block.insert(
                Value::from("except"),
                Value::Sequence(except.into_iter().map(Value::from).collect()),
            );
        }
    }
    peer
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_prefixes_embed_into_the_cluster_96() {
        assert_eq!(
            embed_addr(Ipv4Addr::new(10, 244, 1, 10)).to_string(),
            "fd00:e2e::af4:10a"
        );
        assert_eq!(
            embed_net(v4("10.244.1.0/24")).to_string(),
            "fd00:e2e::af4:100/120"
        );
        assert_eq!(
            embed_net(v4("10.244.1.10/32")).to_string(),
            "fd00:e2e::af4:10a/128"
        );
        assert_eq!(embed_net(v4("0.0.0.0/0")).to_string(), "::/0");
        assert_eq!(embed_net(v4("0.0.0.0/1")).to_string(), "fd00:e2e::/97");
        assert_eq!(
            embed_net(v4("128.0.0.0/1")).to_string(),
            "fd00:e2e::8000:0/97"
        );
    }

    proptest! {
        /// Containment (and so every ipBlock/except decision) is the same on both sides.
        #[test]
        fn containment_is_preserved(a in any::<u32>(), la in 0u8..=32, b in any::<u32>(), lb in 0u8..=32) {
            let na = Ipv4Net::new(Ipv4Addr::from(a), la).unwrap().trunc();
            let nb = Ipv4Net::new(Ipv4Addr::from(b), lb).unwrap().trunc();
            prop_assert_eq!(na.contains(&nb), embed_net(na).contains(&embed_net(nb)));
            prop_assert_eq!(na == nb, embed_net(na) == embed_net(nb));
            let host = Ipv4Addr::from(b);
            prop_assert_eq!(na.contains(&host), embed_net(na).contains(&embed_addr(host)));
        }
    }

    const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: b}}
    - ipBlock: {cidr: 10.244.0.0/16, except: [10.244.1.0/24]}
  egress:
  - to:
    - ipBlock: {cidr: 0.0.0.0/0}
    - ipBlock: {cidr: "fd00:1::/64"}
    ports: [{port: 80}]
"#;

    fn parsed(doc: &str) -> k8s_openapi::api::networking::v1::NetworkPolicy {
        serde_yaml_ng::from_str(doc).unwrap()
    }

    /// Per rule, its peers as (cidr, except), pod peers as ("pods", []).
    type Blocks = Vec<Vec<(String, Vec<String>)>>;

    fn blocks(rules: Vec<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>) -> Blocks {
        rules
            .into_iter()
            .map(|peers| {
                peers
                    .into_iter()
                    .map(|p| match p.ip_block {
                        Some(b) => (b.cidr, b.except.unwrap_or_default()),
                        None => ("pods".into(), vec![]),
                    })
                    .collect()
            })
            .collect()
    }

    fn ingress_and_egress(doc: &str) -> (Blocks, Blocks) {
        let spec = parsed(doc).spec.unwrap();
        let ingress = spec
            .ingress
            .unwrap()
            .into_iter()
            .map(|r| r.from.unwrap_or_default())
            .collect();
        let egress = spec
            .egress
            .unwrap()
            .into_iter()
            .map(|r| r.to.unwrap_or_default())
            .collect();
        (blocks(ingress), blocks(egress))
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn ipv4_mode_leaves_the_policy_alone() {
        assert_eq!(rewrite_policy(POLICY, FamilyMode::Ipv4).unwrap(), POLICY);
    }

    #[test]
    fn ipv6_mode_replaces_every_ipv4_block() {
        let (ingress, egress) =
            ingress_and_egress(&rewrite_policy(POLICY, FamilyMode::Ipv6).unwrap());
        assert_eq!(
            ingress,
            [vec![
                ("pods".to_string(), vec![]),
                (
                    "fd00:e2e::af4:0/112".to_string(),
                    s(&["fd00:e2e::af4:100/120"])
                ),
            ]]
        );
        assert_eq!(
            egress,
            [vec![
                ("::/0".to_string(), vec![]),
                ("fd00:1::/64".to_string(), vec![]),
            ]]
        );
    }

    #[test]
    fn dual_mode_emits_both_families_with_except_split() {
        let text = rewrite_policy(POLICY, FamilyMode::Dual).unwrap();
        let (ingress, egress) = ingress_and_egress(&text);
        assert_eq!(
            ingress,
            [vec![
                ("pods".to_string(), vec![]),
                ("10.244.0.0/16".to_string(), s(&["10.244.1.0/24"])),
                (
                    "fd00:e2e::af4:0/112".to_string(),
                    s(&["fd00:e2e::af4:100/120"])
                ),
            ]]
        );
        assert_eq!(egress[0].len(), 3, "{text}");
        // Ports and everything else stay as written.
        let spec = parsed(&text).spec.unwrap();
        assert_eq!(spec.egress.unwrap()[0].ports.as_ref().unwrap().len(), 1);
    }

    const CLUSTER_POLICY: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cidr}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - {action: Deny, from: [{namespaces: {}}]}
  egress:
  - action: Accept
    to: [{networks: [10.244.1.10/32]}, {pods: {podSelector: {}}}]
  - action: Deny
    to: [{networks: [0.0.0.0/0, "::/0", "fd00:1::/64"]}]
"#;

    fn networks(text: &str) -> Vec<Vec<String>> {
        let v: Value = serde_yaml_ng::from_str(text).unwrap();
        v["spec"]["egress"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| {
                r["to"][0]["networks"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn cluster_policy_networks_follow_the_family_mode() {
        assert_eq!(
            rewrite_cluster_policy(CLUSTER_POLICY, FamilyMode::Ipv4).unwrap(),
            CLUSTER_POLICY
        );
        assert_eq!(
            networks(&rewrite_cluster_policy(CLUSTER_POLICY, FamilyMode::Ipv6).unwrap()),
            [s(&["fd00:e2e::af4:10a/128"]), s(&["::/0", "fd00:1::/64"])]
        );
        let dual = rewrite_cluster_policy(CLUSTER_POLICY, FamilyMode::Dual).unwrap();
        assert_eq!(
            networks(&dual),
            [
                s(&["10.244.1.10/32", "fd00:e2e::af4:10a/128"]),
                s(&["0.0.0.0/0", "::/0", "fd00:1::/64"])
            ]
        );
        // Everything else stays: the ingress rule, the pods peer.
        let v: Value = serde_yaml_ng::from_str(&dual).unwrap();
        assert_eq!(v["spec"]["ingress"][0]["action"].as_str(), Some("Deny"));
        assert!(v["spec"]["egress"][0]["to"][1].get("pods").is_some());
    }

    #[test]
    fn bad_blocks_are_errors_not_panics() {
        let bad = POLICY.replace("10.244.0.0/16", "10.244.0.0/99");
        let err = format!("{:#}", rewrite_policy(&bad, FamilyMode::Ipv6).unwrap_err());
        assert!(
            err.contains("spec.ingress[0].from") && err.contains("not a CIDR"),
            "{err}"
        );
    }
}
