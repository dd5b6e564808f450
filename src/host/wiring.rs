//! How pods are wired to this node, read from the node itself: which interfaces carry an
//! address (a host route to it in any routing table, a neighbour entry on a device, and
//! through a bridge's ports), and from that, how the CNI wires pods at all
//! ([`NodeWiring::detect`]: routed veths with host routes, or the ports of one Linux bridge,
//! and the interface prefixes they share).
//!
//! The agent uses it to say *why* a local pod has no interface (the interfaces that do carry
//! its address, when the configured scheme or prefix does not fit), and, with
//! `FELIX_INTERFACENAMESCHEME=auto`, to choose the scheme, prefixes and bridge at start.
//! [`read`] is the only I/O (one link, route and neighbour dump); everything else is pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use anyhow::Context;
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::host::netlink::{self, Link, RtnlSocket};

/// What the node shows of its pods' wiring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeWiring {
    pub links: Vec<Link>,
    /// `(address, table, output interface)` of every plain device route to one address.
    pub host_routes: Vec<(IpAddr, u32, u32)>,
    /// `(address, interface)` of every IPv4/IPv6 neighbour entry.
    pub neighbours: Vec<(IpAddr, u32)>,
}

/// How this node wires its pods, as [`NodeWiring::detect`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// Each pod behind a routed veth with a host route: the `routes` scheme with these
    /// interface prefixes.
    Routed { prefixes: Vec<String> },
    /// Pods on the ports of this Linux bridge: bridge mode with these port prefixes.
    Bridged {
        bridge: String,
        prefixes: Vec<String>,
    },
}

impl NodeWiring {
    fn name(&self, index: u32) -> Option<&str> {
        self.links
            .iter()
            .find(|l| l.index == index)
            .map(|l| l.name.as_str())
    }

    fn link(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    fn is_bridge(&self, index: u32) -> bool {
        self.link(index)
            .is_some_and(|l| l.kind.as_deref() == Some("bridge"))
    }

    /// Where `ip` is reached on this node, as operators read it: `vethbar01 (host route,
    /// table 254)`, `cni0 (neighbour entry; a bridge)`. Empty when nothing carries it.
    pub fn carriers(&self, ip: IpAddr) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (dst, table, oif) in &self.host_routes {
            if *dst == ip {
                if let Some(name) = self.name(*oif) {
                    out.insert(format!("{name} (host route, table {table})"));
                }
            }
        }
        for (dst, dev) in &self.neighbours {
            if *dst == ip {
                if let Some(name) = self.name(*dev) {
                    let what = if self.is_bridge(*dev) {
                        "neighbour entry; a bridge: set FELIX_BRIDGEINTERFACE for bridge mode"
                    } else {
                        "neighbour entry"
                    };
                    out.insert(format!("{name} ({what})"));
                }
            }
        }
        out.into_iter().collect()
    }

    /// The names of the interfaces [`NodeWiring::carriers`] describes, without the detail.
    pub fn carrier_names(&self, ip: IpAddr) -> Vec<String> {
        let routes = self.host_routes.iter().filter(|(dst, ..)| *dst == ip);
        let neighbours = self.neighbours.iter().filter(|(dst, _)| *dst == ip);
        let indexes = routes
            .map(|(.., oif)| *oif)
            .chain(neighbours.map(|(_, dev)| *dev));
        let names: BTreeSet<String> = indexes
            .filter_map(|i| self.name(i))
            .map(str::to_string)
            .collect();
        names.into_iter().collect()
    }

    /// How pods are wired here: the veths that are ports of a bridge (bridge mode: the
    /// bridge with the most of them), else the veths that carry host routes (routed), with
    /// the prefixes their names share. `None` while the node shows neither (no pod yet).
    pub fn detect(&self) -> Option<Wiring> {
        let veths: Vec<&Link> = self
            .links
            .iter()
            .filter(|l| l.kind.as_deref() == Some("veth"))
            .collect();
        let mut ports: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for v in &veths {
            if let Some(master) = v.master.filter(|m| self.is_bridge(*m)) {
                ports.entry(master).or_default().push(&v.name);
            }
        }
        if let Some((bridge, names)) = ports.iter().max_by_key(|(_, names)| names.len()) {
            return Some(Wiring::Bridged {
                bridge: self.name(*bridge)?.to_string(),
                prefixes: stems(names),
            });
        }
        let routed: BTreeSet<&str> = self
            .host_routes
            .iter()
            .filter_map(|(_, _, oif)| self.link(*oif))
            .filter(|l| l.kind.as_deref() == Some("veth") && l.master.is_none())
            .map(|l| l.name.as_str())
            .collect();
        if routed.is_empty() {
            return None;
        }
        Some(Wiring::Routed {
            prefixes: stems(&routed.into_iter().collect::<Vec<_>>()),
        })
    }
}

/// The prefixes a CNI's interface names share: each name without its trailing run of
/// lowercase hex digits (the per-pod part: `cali1a2b3c4d5e6` → `cali`, `veth-13dd25c5cb` →
/// `veth-`, `vethbar01` → `vethbar`), shortest first, a prefix covered by a shorter one
/// dropped. A name that is all hex keeps its first character.
pub fn stems(names: &[&str]) -> Vec<String> {
    let mut out: BTreeSet<String> = BTreeSet::new();
    for name in names {
        let stem = name.trim_end_matches(|c: char| c.is_ascii_digit() || ('a'..='f').contains(&c));
        let stem = if stem.is_empty() { &name[..1] } else { stem };
        out.insert(stem.to_string());
    }
    let all: Vec<String> = out.into_iter().collect();
    all.iter()
        .filter(|s| !all.iter().any(|o| o != *s && s.starts_with(o.as_str())))
        .cloned()
        .collect()
}

/// Reads links, host routes (every table, both families) and neighbours of the network
/// namespace the calling thread is in.
pub fn read() -> anyhow::Result<NodeWiring> {
    let mut socket = RtnlSocket::open().context("opening a netlink route socket")?;
    let links = socket
        .dump_links()
        .context("listing links")?
        .iter()
        .filter_map(netlink::parse_link)
        .collect();
    let mut host_routes = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        for route in socket.dump_routes(family).context("listing routes")? {
            if let Some(entry) = netlink::parse_host_route(&route) {
                if let Some(oif) = entry.oif {
                    host_routes.push((entry.key.dst, entry.key.table, oif));
                }
            }
        }
    }
    let mut neighbours = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        for msg in socket
            .dump(RouteNetlinkMessage::GetNeighbour(req))
            .context("listing neighbours")?
        {
            let RouteNetlinkMessage::NewNeighbour(n) = msg else {
                continue;
            };
            for attr in &n.attributes {
                let ip = match attr {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => IpAddr::V4(*a),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => IpAddr::V6(*a),
                    _ => continue,
                };
                neighbours.push((ip, n.header.ifindex));
            }
        }
    }
    Ok(NodeWiring {
        links,
        host_routes,
        neighbours,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, kind: &str, master: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            kind: (!kind.is_empty()).then(|| kind.to_string()),
            master,
            up: true,
        }
    }

    #[test]
    fn stems_drop_the_per_pod_part() {
        assert_eq!(stems(&["cali1a2b3c4d5e6", "cali0f9e8d7c6b5"]), ["cali"]);
        assert_eq!(stems(&["veth-13dd25c5cb"]), ["veth-"]);
        assert_eq!(stems(&["vethbar01"]), ["vethbar"]);
        assert_eq!(stems(&["veth1234abcd", "vethfab0123"]), ["veth"]);
        // A stem covered by a shorter one goes; unrelated ones stay.
        assert_eq!(
            stems(&["vethbar01", "veth12ab34cd", "eni0a1b2c3d4e5"]),
            ["eni", "veth"]
        );
        assert_eq!(stems(&["abc123"]), ["a"]);
    }

    #[test]
    fn routed_and_bridged_nodes_are_told_apart() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let routed = NodeWiring {
            links: vec![
                link(1, "lo", "", None),
                link(2, "eth0", "veth", None),
                link(3, "vethbar01", "veth", None),
                link(4, "vethbar02", "veth", None),
            ],
            host_routes: vec![(ip("10.244.1.5"), 254, 3), (ip("10.244.1.6"), 39999, 4)],
            neighbours: vec![(ip("10.244.1.5"), 3)],
        };
        assert_eq!(
            routed.detect(),
            Some(Wiring::Routed {
                prefixes: vec!["vethbar".into()]
            })
        );
        assert_eq!(
            routed.carriers(ip("10.244.1.5")),
            [
                "vethbar01 (host route, table 254)",
                "vethbar01 (neighbour entry)"
            ]
        );
        assert!(routed.carriers(ip("10.244.9.9")).is_empty());
        // One name however many entries carry it; none for an address nothing carries.
        assert_eq!(routed.carrier_names(ip("10.244.1.5")), ["vethbar01"]);
        assert!(routed.carrier_names(ip("10.244.9.9")).is_empty());

        let bridged = NodeWiring {
            links: vec![
                link(2, "eth0", "", None),
                link(5, "cni0", "bridge", None),
                link(6, "veth1a2b3c4d", "veth", Some(5)),
                link(7, "veth9f8e7d6c", "veth", Some(5)),
            ],
            host_routes: vec![],
            neighbours: vec![(ip("10.244.2.7"), 5)],
        };
        assert_eq!(
            bridged.detect(),
            Some(Wiring::Bridged {
                bridge: "cni0".into(),
                prefixes: vec!["veth".into()]
            })
        );
        assert!(bridged.carriers(ip("10.244.2.7"))[0].contains("FELIX_BRIDGEINTERFACE"));
        assert_eq!(bridged.carrier_names(ip("10.244.2.7")), ["cni0"]);

        // No pod yet: nothing to tell.
        let empty = NodeWiring {
            links: vec![link(2, "eth0", "veth", None)],
            ..NodeWiring::default()
        };
        assert_eq!(empty.detect(), None);
    }
}
