//! Preflight: before `run` programs anything, look at the node for a dataplane whose pod
//! traffic never passes the host's netfilter hooks, where iptables rules could enforce
//! nothing however right they are:
//!
//! - Open vSwitch: an `openvswitch` datapath device (`ovs-system`, OVS bridges' internal
//!   ports) and the links whose master it is. Pod traffic is switched by OVS flows in the
//!   kernel datapath (openshift-sdn, OVN-Kubernetes, Antrea, Kube-OVN, Contiv) and never
//!   reaches the host's FORWARD chain.
//! - ipvlan / macvlan (and their tap variants): pod-to-pod traffic on one parent is switched
//!   inside the driver; the host stack never sees it.
//! - A Linux bridge with pod ports. In bridge mode (policy matched with `-m physdev`),
//!   bridged frames reach iptables only through `br_netfilter` with
//!   `net.bridge.bridge-nf-call-iptables=1` (per network namespace). Without bridge mode, a
//!   bridge whose ports match the interface prefixes is fatal anyway: bridged traffic never
//!   enters FORWARD as `-i <prefix>+`, so the dispatch rules could never match it.
//!
//! The detectors are pure functions over a [`NodeSnapshot`]; [`snapshot`] reads one from the
//! node (links over netlink, the bridge sysctls from `/proc/sys`).

use std::fmt;
use std::path::Path;

use anyhow::Context;

use crate::host::netlink::{self, Link, RtnlSocket};

/// Link kinds that switch pod traffic past the host stack.
const OVS_KIND: &str = "openvswitch";
const IPVLAN_KINDS: [&str; 4] = ["ipvlan", "ipvtap", "macvlan", "macvtap"];
const BRIDGE_KIND: &str = "bridge";

/// `br_netfilter`'s state in this network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrNetfilter {
    /// The module is not loaded (no `/proc/sys/net/bridge`): bridged frames never reach
    /// iptables.
    Absent,
    Present {
        /// `net.bridge.bridge-nf-call-iptables`
        call_iptables: bool,
        /// `net.bridge.bridge-nf-call-ip6tables`
        call_ip6tables: bool,
    },
}

impl fmt::Display for BrNetfilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrNetfilter::Absent => f.write_str("br_netfilter is not loaded"),
            BrNetfilter::Present {
                call_iptables,
                call_ip6tables,
            } => write!(
                f,
                "net.bridge.bridge-nf-call-iptables={} and bridge-nf-call-ip6tables={}",
                u8::from(*call_iptables),
                u8::from(*call_ip6tables)
            ),
        }
    }
}

/// What the detectors look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub links: Vec<Link>,
    pub br_netfilter: BrNetfilter,
}

/// What the detectors need to know of the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreflightConfig {
    /// `FELIX_INTERFACEPREFIX`.
    pub prefixes: Vec<String>,
    /// Bridge mode (`FELIX_BRIDGEINTERFACE`): the bridge whose ports are the pods' veths,
    /// policy matched with `-m physdev`. `None`: routed mode.
    pub bridge: Option<String>,
    /// IPv6 is programmed too, so `bridge-nf-call-ip6tables` matters as well.
    pub ipv6: bool,
}

/// One reason iptables enforcement cannot work on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Open vSwitch datapath devices, and the links attached to them (`port (kind)`).
    OpenVswitch {
        datapaths: Vec<String>,
        ports: Vec<String>,
    },
    /// ipvlan/macvlan links (`name (kind)`).
    Ipvlan { links: Vec<String> },
    /// Bridge mode, a bridge with pod ports, and bridged frames that never reach iptables.
    BridgeNetfilterOff {
        bridge: String,
        ports: Vec<String>,
        netfilter: BrNetfilter,
    },
    /// Not bridge mode, but interfaces that match the prefixes are bridge ports.
    PrefixPortsBridged {
        bridge: String,
        ports: Vec<String>,
        netfilter: BrNetfilter,
    },
}

impl Finding {
    /// A short name for logs and the readiness body.
    pub fn name(&self) -> &'static str {
        match self {
            Finding::OpenVswitch { .. } => "openvswitch",
            Finding::Ipvlan { .. } => "ipvlan/macvlan",
            Finding::BridgeNetfilterOff { .. } => "bridge without br_netfilter",
            Finding::PrefixPortsBridged { .. } => "bridged pod interfaces",
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::OpenVswitch { datapaths, ports } => {
                write!(f, "Open vSwitch datapath found ({})", datapaths.join(", "))?;
                if !ports.is_empty() {
                    write!(f, " with ports {}", ports.join(", "))?;
                }
                f.write_str(
                    ": pod traffic is switched by OVS flows in the kernel datapath and never \
                     passes the host's iptables FORWARD chain, so iptables rules cannot police \
                     it (such CNIs enforce NetworkPolicy in OVS themselves)",
                )
            }
            Finding::Ipvlan { links } => write!(
                f,
                "ipvlan/macvlan links found ({}): traffic between pods on one parent \
                 interface is switched inside the driver and never passes the host's netfilter \
                 hooks, so iptables rules cannot see it",
                links.join(", ")
            ),
            Finding::BridgeNetfilterOff {
                bridge,
                ports,
                netfilter,
            } => {
                if ports.is_empty() {
                    write!(f, "bridge mode (bridge {bridge}) but {netfilter}")?;
                } else {
                    write!(
                        f,
                        "Linux bridge {bridge} has pod ports ({}) but {netfilter}",
                        ports.join(", ")
                    )?;
                }
                f.write_str(
                    ": bridged frames never reach iptables, so the bridge-mode (-m physdev) rules \
                     cannot match them; load br_netfilter and set \
                     net.bridge.bridge-nf-call-iptables=1 (and bridge-nf-call-ip6tables=1 with \
                     IPv6) in the node's network namespace",
                )
            }
            Finding::PrefixPortsBridged {
                bridge,
                ports,
                netfilter,
            } => write!(
                f,
                "interfaces matching the interface prefixes are ports of Linux bridge {bridge} \
                 ({}): traffic between them is bridged, not routed, so it never enters the \
                 FORWARD chain as -i <prefix>+ and the dispatch rules cannot match it ({netfilter}); \
                 this needs bridge mode",
                ports.join(", ")
            ),
        }
    }
}

/// Every finding, in a stable order (links by index).
pub fn check(snapshot: &NodeSnapshot, cfg: &PreflightConfig) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.extend(detect_ovs(&snapshot.links));
    findings.extend(detect_ipvlan(&snapshot.links));
    findings.extend(detect_bridges(snapshot, cfg));
    findings
}

fn sorted(links: &[Link]) -> Vec<&Link> {
    let mut v: Vec<&Link> = links.iter().collect();
    v.sort_by_key(|l| l.index);
    v
}

fn kind_is(link: &Link, kind: &str) -> bool {
    link.kind.as_deref() == Some(kind)
}

fn described(link: &Link) -> String {
    match &link.kind {
        Some(kind) => format!("{} ({kind})", link.name),
        None => link.name.clone(),
    }
}

/// Open vSwitch's kernel datapath: every `openvswitch` device, and what is attached to one.
pub fn detect_ovs(links: &[Link]) -> Option<Finding> {
    let links = sorted(links);
    let ovs: Vec<&Link> = links
        .iter()
        .copied()
        .filter(|l| kind_is(l, OVS_KIND))
        .collect();
    if ovs.is_empty() {
        return None;
    }
    let ports = links
        .iter()
        .filter(|l| !kind_is(l, OVS_KIND))
        .filter(|l| l.master.is_some_and(|m| ovs.iter().any(|o| o.index == m)))
        .map(|l| described(l))
        .collect();
    Some(Finding::OpenVswitch {
        datapaths: ovs.iter().map(|l| l.name.clone()).collect(),
        ports,
    })
}

/// ipvlan, ipvtap, macvlan and macvtap links in this namespace.
pub fn detect_ipvlan(links: &[Link]) -> Option<Finding> {
    let found: Vec<String> = sorted(links)
        .into_iter()
        .filter(|l| IPVLAN_KINDS.iter().any(|k| kind_is(l, k)))
        .map(described)
        .collect();
    (!found.is_empty()).then_some(Finding::Ipvlan { links: found })
}

/// Linux bridges with pod ports: in bridge mode, every bridge with veth or prefix-matching
/// ports needs br_netfilter passing frames to iptables (and ip6tables when IPv6 is on);
/// without bridge mode, a bridge with prefix-matching ports is fatal whatever br_netfilter
/// does.
pub fn detect_bridges(snapshot: &NodeSnapshot, cfg: &PreflightConfig) -> Vec<Finding> {
    let links = sorted(&snapshot.links);
    let matches_prefix = |l: &Link| cfg.prefixes.iter().any(|p| l.name.starts_with(p.as_str()));
    let netfilter_ok = match snapshot.br_netfilter {
        BrNetfilter::Absent => false,
        BrNetfilter::Present {
            call_iptables,
            call_ip6tables,
        } => call_iptables && (call_ip6tables || !cfg.ipv6),
    };
    let mut findings = Vec::new();
    for bridge in links.iter().filter(|l| kind_is(l, BRIDGE_KIND)) {
        let ports: Vec<&Link> = links
            .iter()
            .copied()
            .filter(|l| l.master == Some(bridge.index))
            .collect();
        if cfg.bridge.is_some() {
            let pod_ports: Vec<String> = ports
                .iter()
                .filter(|l| kind_is(l, "veth") || matches_prefix(l))
                .map(|l| l.name.clone())
                .collect();
            if !pod_ports.is_empty() && !netfilter_ok {
                findings.push(Finding::BridgeNetfilterOff {
                    bridge: bridge.name.clone(),
                    ports: pod_ports,
                    netfilter: snapshot.br_netfilter,
                });
            }
        } else {
            let prefixed: Vec<String> = ports
                .iter()
                .filter(|l| matches_prefix(l))
                .map(|l| l.name.clone())
                .collect();
            if !prefixed.is_empty() {
                findings.push(Finding::PrefixPortsBridged {
                    bridge: bridge.name.clone(),
                    ports: prefixed,
                    netfilter: snapshot.br_netfilter,
                });
            }
        }
    }
    // The configured bridge needs br_netfilter even before its first pod (flannel creates
    // `cni0` with the first one): pods attached later would otherwise go unpoliced.
    if let Some(configured) = &cfg.bridge {
        let flagged = findings.iter().any(
            |f| matches!(f, Finding::BridgeNetfilterOff { bridge, .. } if bridge == configured),
        );
        if !netfilter_ok && !flagged {
            findings.push(Finding::BridgeNetfilterOff {
                bridge: configured.clone(),
                ports: Vec::new(),
                netfilter: snapshot.br_netfilter,
            });
        }
    }
    findings
}

/// Reads `br_netfilter`'s switches under `proc_sys` (`/proc/sys`; per network namespace).
/// A file that exists but cannot be read counts as off.
pub fn read_br_netfilter(proc_sys: &Path) -> BrNetfilter {
    let dir = proc_sys.join("net/bridge");
    if !dir.is_dir() {
        return BrNetfilter::Absent;
    }
    let on = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|v| v.trim() == "1")
            .unwrap_or(false)
    };
    BrNetfilter::Present {
        call_iptables: on("bridge-nf-call-iptables"),
        call_ip6tables: on("bridge-nf-call-ip6tables"),
    }
}

/// Reads the node as the agent's process sees it (its own network namespace).
pub fn snapshot() -> anyhow::Result<NodeSnapshot> {
    let mut socket = RtnlSocket::open().context("preflight: opening a netlink route socket")?;
    let links = socket
        .dump_links()
        .context("preflight: listing this node's links")?
        .iter()
        .filter_map(netlink::parse_link)
        .collect();
    Ok(NodeSnapshot {
        links,
        br_netfilter: read_br_netfilter(Path::new("/proc/sys")),
    })
}

/// Everything found, as operators read it.
pub fn report(findings: &[Finding]) -> String {
    let mut text = String::from(
        "refusing to enforce NetworkPolicy: this node's dataplane bypasses host netfilter, so \
         iptables rules cannot see pod traffic:",
    );
    for finding in findings {
        text.push_str("\n  - ");
        text.push_str(&finding.to_string());
    }
    text.push_str(
        "\nUse the CNI's own NetworkPolicy enforcement on such nodes, or keep netpol-agent off \
         them. If these findings do not concern pod traffic, set FELIX_PREFLIGHTOVERRIDE=true \
         (--preflight-override) to run anyway.",
    );
    text
}

/// One line for the readiness body.
pub fn summary(findings: &[Finding]) -> String {
    let parts: Vec<String> = findings.iter().map(Finding::to_string).collect();
    format!(
        "refused to run: the dataplane bypasses host netfilter: {} (FELIX_PREFLIGHTOVERRIDE=true runs anyway)",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, kind: Option<&str>, master: Option<u32>) -> Link {
        Link {
            index,
            name: name.to_string(),
            kind: kind.map(str::to_string),
            master,
            up: true,
        }
    }

    fn cfg(prefixes: &[&str], bridge_mode: bool) -> PreflightConfig {
        PreflightConfig {
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            bridge: bridge_mode.then(|| "cni0".to_string()),
            ipv6: true,
        }
    }

    const NF_ON: BrNetfilter = BrNetfilter::Present {
        call_iptables: true,
        call_ip6tables: true,
    };
    const NF_OFF: BrNetfilter = BrNetfilter::Present {
        call_iptables: false,
        call_ip6tables: true,
    };

    fn node(links: Vec<Link>, br_netfilter: BrNetfilter) -> NodeSnapshot {
        NodeSnapshot {
            links,
            br_netfilter,
        }
    }

    /// A routed-veth node (Calico): nothing to find.
    fn routed() -> Vec<Link> {
        vec![
            link(1, "lo", None, None),
            link(2, "eth0", None, None),
            link(5, "cali82111e10a96", Some("veth"), None),
            link(6, "cali1b7a9ed1883", Some("veth"), None),
            // The e2e nodes' port-less bridge, docker0 without ports.
            link(7, "docker0", Some("bridge"), None),
        ]
    }

    #[test]
    fn routed_veth_node_passes() {
        assert_eq!(
            check(&node(routed(), NF_OFF), &cfg(&["cali"], false)),
            vec![]
        );
    }

    #[test]
    fn bridge_mode_needs_br_netfilter_before_the_first_pod() {
        // cni0 not created yet (flannel makes it with the first pod): still refused.
        let findings = check(&node(routed(), BrNetfilter::Absent), &cfg(&["veth"], true));
        assert_eq!(
            findings,
            vec![Finding::BridgeNetfilterOff {
                bridge: "cni0".into(),
                ports: vec![],
                netfilter: BrNetfilter::Absent,
            }]
        );
        let text = findings[0].to_string();
        assert!(
            text.starts_with("bridge mode (bridge cni0) but br_netfilter is not loaded"),
            "{text}"
        );
        assert_eq!(check(&node(routed(), NF_ON), &cfg(&["veth"], true)), vec![]);
    }

    #[test]
    fn ovs_datapath_with_pod_veths_is_found() {
        // openshift-sdn / OVN-Kubernetes: ovs-system, br-int (internal port), pod veths.
        let mut links = routed();
        links.extend([
            link(10, "ovs-system", Some("openvswitch"), None),
            link(11, "br-int", Some("openvswitch"), Some(10)),
            link(12, "veth1a2b3c4d", Some("veth"), Some(10)),
            link(13, "genev_sys_6081", Some("geneve"), Some(10)),
        ]);
        let findings = check(&node(links, NF_ON), &cfg(&["cali"], false));
        assert_eq!(
            findings,
            vec![Finding::OpenVswitch {
                datapaths: vec!["ovs-system".into(), "br-int".into()],
                ports: vec![
                    "veth1a2b3c4d (veth)".into(),
                    "genev_sys_6081 (geneve)".into()
                ],
            }]
        );
        let text = findings[0].to_string();
        assert!(text.contains("ovs-system, br-int"), "{text}");
        assert!(text.contains("veth1a2b3c4d"), "{text}");
        assert!(text.contains("never passes the host's iptables"), "{text}");
        // A datapath alone (no ports yet) is found too.
        let alone = vec![link(10, "ovs-system", Some("openvswitch"), None)];
        assert!(matches!(
            detect_ovs(&alone),
            Some(Finding::OpenVswitch { ports, .. }) if ports.is_empty()
        ));
    }

    #[test]
    fn ipvlan_and_macvlan_links_are_found() {
        let mut links = routed();
        links.push(link(20, "ipvl_3", Some("ipvlan"), None));
        links.push(link(21, "mac0", Some("macvlan"), None));
        let findings = check(&node(links, NF_ON), &cfg(&["cali"], false));
        assert_eq!(
            findings,
            vec![Finding::Ipvlan {
                links: vec!["ipvl_3 (ipvlan)".into(), "mac0 (macvlan)".into()],
            }]
        );
        assert!(findings[0].to_string().contains("inside the driver"));
    }

    #[test]
    fn bridge_mode_needs_br_netfilter() {
        let links = vec![
            link(2, "eth0", None, None),
            link(3, "cni0", Some("bridge"), None),
            link(4, "veth0a1b2c3d", Some("veth"), Some(3)),
            link(5, "eth1", None, Some(3)),
        ];
        for nf in [BrNetfilter::Absent, NF_OFF] {
            let findings = check(&node(links.clone(), nf), &cfg(&["cali"], true));
            assert_eq!(
                findings,
                vec![Finding::BridgeNetfilterOff {
                    bridge: "cni0".into(),
                    ports: vec!["veth0a1b2c3d".into()],
                    netfilter: nf,
                }],
                "{nf}"
            );
        }
        let text = check(&node(links.clone(), NF_OFF), &cfg(&["cali"], true))[0].to_string();
        assert!(text.contains("bridge-nf-call-iptables=0"), "{text}");
        assert!(text.contains("cni0"), "{text}");
        let absent = check(
            &node(links.clone(), BrNetfilter::Absent),
            &cfg(&["cali"], true),
        )[0]
        .to_string();
        assert!(absent.contains("br_netfilter is not loaded"), "{absent}");
        // On, for both families: fine.
        assert_eq!(
            check(&node(links.clone(), NF_ON), &cfg(&["cali"], true)),
            vec![]
        );
        // ip6tables off matters only with IPv6.
        let v6_off = BrNetfilter::Present {
            call_iptables: true,
            call_ip6tables: false,
        };
        assert_eq!(
            check(&node(links.clone(), v6_off), &cfg(&["cali"], true)).len(),
            1
        );
        let mut v4_only = cfg(&["cali"], true);
        v4_only.ipv6 = false;
        assert_eq!(check(&node(links, v6_off), &v4_only), vec![]);
    }

    #[test]
    fn without_bridge_mode_bridged_prefix_ports_are_fatal() {
        let links = vec![
            link(3, "br0", Some("bridge"), None),
            link(4, "cali82111e10a96", Some("veth"), Some(3)),
            link(5, "vethdocker1", Some("veth"), Some(3)),
        ];
        // Whatever br_netfilter does.
        for nf in [NF_ON, NF_OFF, BrNetfilter::Absent] {
            let findings = check(&node(links.clone(), nf), &cfg(&["cali"], false));
            assert_eq!(
                findings,
                vec![Finding::PrefixPortsBridged {
                    bridge: "br0".into(),
                    ports: vec!["cali82111e10a96".into()],
                    netfilter: nf,
                }]
            );
        }
        // A bridge whose ports do not match (docker0 with its veths) is not ours.
        assert_eq!(check(&node(links, NF_OFF), &cfg(&["hybr"], false)), vec![]);
    }

    #[test]
    fn report_names_every_finding_and_the_override() {
        let findings = vec![
            Finding::Ipvlan {
                links: vec!["ipv0 (ipvlan)".into()],
            },
            Finding::PrefixPortsBridged {
                bridge: "br0".into(),
                ports: vec!["cali1".into()],
                netfilter: NF_OFF,
            },
        ];
        let text = report(&findings);
        assert!(text.contains("ipv0 (ipvlan)"), "{text}");
        assert!(text.contains("br0"), "{text}");
        assert!(text.contains("FELIX_PREFLIGHTOVERRIDE=true"), "{text}");
        let line = summary(&findings);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("ipv0") && line.contains("br0"), "{line}");
    }

    #[test]
    fn br_netfilter_is_read_from_proc_sys() {
        let dir = std::env::temp_dir().join(format!("npa-preflight-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(read_br_netfilter(&dir), BrNetfilter::Absent);
        std::fs::create_dir_all(dir.join("net/bridge")).unwrap();
        std::fs::write(dir.join("net/bridge/bridge-nf-call-iptables"), "1\n").unwrap();
        std::fs::write(dir.join("net/bridge/bridge-nf-call-ip6tables"), "0\n").unwrap();
        let got = read_br_netfilter(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            got,
            BrNetfilter::Present {
                call_iptables: true,
                call_ip6tables: false
            }
        );
    }
}
