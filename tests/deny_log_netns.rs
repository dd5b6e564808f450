//! Deny logging on a real kernel: the agent (`FELIX_DENYLOGENABLED=true`, JSON logs) runs in a
//! node namespace with dual-stack pods wired the Calico way (`tests/pod_node`), and real
//! probes from the pods' namespaces must each produce exactly one deny line naming the right
//! pods, direction and isolating policies within one second — TCP, UDP and SCTP, IPv4 and
//! IPv6, ingress and egress — while allowed probes produce none; a pod that is not programmed
//! (no interface name) produces the "not programmed yet" line. Both iptables backends.

mod common;
mod nf_pair;
mod pod_node;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use pod_node::{deny_lines, PodNode, PodSpec};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 80}, {protocol: SCTP, port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: locked-egress, namespace: y}
spec:
  podSelector: {matchLabels: {role: locked}}
  policyTypes: [Egress]
"#;

fn pods() -> Vec<PodSpec> {
    vec![
        PodSpec {
            namespace: "x",
            name: "server",
            labels: &[("app", "server")],
            n: 10,
            iface: Some("calisrv"),
        },
        PodSpec {
            namespace: "y",
            name: "client",
            labels: &[("role", "client")],
            n: 11,
            iface: Some("calicli"),
        },
        PodSpec {
            namespace: "y",
            name: "intruder",
            labels: &[("role", "intruder")],
            n: 12,
            iface: Some("caliint"),
        },
        PodSpec {
            namespace: "y",
            name: "locked",
            labels: &[("role", "locked")],
            n: 13,
            iface: Some("calilck"),
        },
        // Left out of the interface map: no chains, "Unknown interface".
        PodSpec {
            namespace: "y",
            name: "pending",
            labels: &[("role", "client")],
            n: 14,
            iface: None,
        },
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

/// One probe: from a pod to an address and port, from a source port of its own.
struct Probe {
    from: &'static str,
    to: IpAddr,
    proto: Proto,
    port: u16,
    src_port: u16,
}

/// Sends the probe's first packet (a SYN, a datagram, an INIT) from the pod's namespace. The
/// TCP socket is returned open, so the kernel retransmits the SYN (a second packet of the same
/// flow, which must not make a second line).
fn send(node: &PodNode, p: &Probe) -> Option<Socket> {
    let pod = node.pod(p.from);
    let src_ip: IpAddr = match p.to {
        IpAddr::V4(_) => pod.v4.into(),
        IpAddr::V6(_) => pod.v6.into(),
    };
    let dst = SocketAddr::new(p.to, p.port);
    match p.proto {
        Proto::Sctp => {
            nf_pair::sctp_init(
                &pod.ns,
                dst,
                p.src_port,
                0x5eed_0000 | u32::from(p.src_port),
            );
            None
        }
        Proto::Tcp | Proto::Udp => common::in_netns(&pod.ns.name, || {
            let (ty, proto) = match p.proto {
                Proto::Tcp => (Type::STREAM, Protocol::TCP),
                _ => (Type::DGRAM, Protocol::UDP),
            };
            let s = Socket::new(Domain::for_address(dst), ty, Some(proto)).unwrap();
            s.set_reuse_address(true).unwrap();
            s.bind(&SockAddr::from(SocketAddr::new(src_ip, p.src_port)))
                .unwrap();
            if p.proto == Proto::Tcp {
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&dst.into());
                Some(s)
            } else {
                s.send_to(b"probe", &dst.into()).unwrap();
                None
            }
        }),
    }
}

/// The deny lines of one probe (matched by protocol, addresses and ports).
fn lines_of<'a>(
    lines: &'a [serde_json::Value],
    node: &PodNode,
    p: &Probe,
) -> Vec<&'a serde_json::Value> {
    let pod = node.pod(p.from);
    let src_ip = match p.to {
        IpAddr::V4(_) => pod.v4.to_string(),
        IpAddr::V6(_) => pod.v6.to_string(),
    };
    lines
        .iter()
        .filter(|l| {
            l["protocol"] == p.proto.name()
                && l["src_ip"] == src_ip.as_str()
                && l["dst_ip"] == p.to.to_string().as_str()
                && l["src_port"] == p.src_port
                && l["dst_port"] == p.port
        })
        .collect()
}

struct Expect {
    direction: &'static str,
    src: &'static str,
    dst: &'static str,
    policies: &'static str,
}

fn deny_logs_name_pods_direction_and_policies(backend: &'static str) {
    let mut node = PodNode::new(&format!("denylog-{backend}"), backend, pods());
    node.write_policies(POLICIES);
    node.start_agent(&[
        ("FELIX_DENYLOGENABLED", "true"),
        ("FELIX_DENYLOGNFLOGGROUP", "31"),
        ("FELIX_LOGFORMAT", "json"),
        // The test's probes come in a burst: no line may be rate-limited away.
        ("FELIX_DENYLOGRATE", "1000"),
        ("FELIX_DENYLOGBURST", "100"),
        // Deny lines are written whatever the severity.
        ("FELIX_LOGSEVERITYSCREEN", "Warning"),
    ]);
    node.wait_converged(Duration::from_secs(20));

    let server = node.pod("x/server");
    let (s4, s6): (IpAddr, IpAddr) = (server.v4.into(), server.v6.into());
    let pending_v4: IpAddr = node.pod("y/pending").v4.into();
    let client_v4: IpAddr = node.pod("y/client").v4.into();
    let ingress = |src| Expect {
        direction: "ingress",
        src,
        dst: "x/server",
        policies: "x/allow-client,x/default-deny",
    };
    let mut port = 41000;
    let mut next = || {
        port += 1;
        port
    };
    let mut cases: Vec<(Probe, Option<Expect>)> = Vec::new();
    for proto in [Proto::Tcp, Proto::Udp, Proto::Sctp] {
        for to in [s4, s6] {
            // Allowed: the client on port 80.
            cases.push((
                Probe {
                    from: "y/client",
                    to,
                    proto,
                    port: 80,
                    src_port: next(),
                },
                None,
            ));
            // Denied at the server's ingress: another pod, or the client on another port.
            cases.push((
                Probe {
                    from: "y/intruder",
                    to,
                    proto,
                    port: 80,
                    src_port: next(),
                },
                Some(ingress("y/intruder")),
            ));
            cases.push((
                Probe {
                    from: "y/client",
                    to,
                    proto,
                    port: 81,
                    src_port: next(),
                },
                Some(ingress("y/client")),
            ));
            // Denied at the locked pod's egress (before the server's ingress could).
            cases.push((
                Probe {
                    from: "y/locked",
                    to,
                    proto,
                    port: 80,
                    src_port: next(),
                },
                Some(Expect {
                    direction: "egress",
                    src: "y/locked",
                    dst: "x/server",
                    policies: "y/locked-egress",
                }),
            ));
        }
    }
    // A pod with no chains yet: dropped by the dispatch, whichever way.
    cases.push((
        Probe {
            from: "y/pending",
            to: s4,
            proto: Proto::Tcp,
            port: 80,
            src_port: next(),
        },
        Some(Expect {
            direction: "egress",
            src: "y/pending",
            dst: "x/server",
            policies: "not programmed yet",
        }),
    ));
    cases.push((
        Probe {
            from: "y/client",
            to: pending_v4,
            proto: Proto::Udp,
            port: 80,
            src_port: next(),
        },
        Some(Expect {
            direction: "ingress",
            src: "y/client",
            dst: "y/pending",
            policies: "not programmed yet",
        }),
    ));
    assert!(client_v4 != pending_v4);

    let mut open = Vec::new();
    let mut delays = Vec::new();
    for (probe, expect) in &cases {
        let sent = Instant::now();
        open.extend(send(&node, probe));
        let Some(expect) = expect else { continue };
        // Within one second of the probe, its line.
        let line = loop {
            let lines = deny_lines(&node.log());
            if let Some(l) = lines_of(&lines, &node, probe).first() {
                break (*l).clone();
            }
            assert!(
                sent.elapsed() < common::scaled(Duration::from_secs(1)),
                "no deny line within 1 s for {} {} -> {}:{} (src port {}); log:\n{}\n{}",
                probe.proto.name(),
                probe.from,
                probe.to,
                probe.port,
                probe.src_port,
                node.log(),
                node.diagnose()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        delays.push(sent.elapsed());
        let what = format!(
            "{} {} -> {}:{}: {line}",
            probe.proto.name(),
            probe.from,
            probe.to,
            probe.port
        );
        assert_eq!(line["message"], "denied", "{what}");
        assert_eq!(line["node"], pod_node::NODE, "{what}");
        assert_eq!(line["direction"], expect.direction, "{what}");
        assert_eq!(line["src"], expect.src, "{what}");
        assert_eq!(line["dst"], expect.dst, "{what}");
        assert_eq!(line["policies"], expect.policies, "{what}");
        assert!(
            line["chain"].as_str().unwrap().starts_with("cali-"),
            "{what}"
        );
        assert!(
            line["packet_time"].as_str().unwrap().ends_with('Z'),
            "{what}"
        );
    }
    // Long enough for the SYNs to be retransmitted once (1 s): same flow, no new line.
    std::thread::sleep(Duration::from_millis(1500));
    drop(open);
    let lines = deny_lines(&node.log());
    for (probe, expect) in &cases {
        let n = lines_of(&lines, &node, probe).len();
        let want = usize::from(expect.is_some());
        assert_eq!(
            n,
            want,
            "{} {} -> {}:{}: {n} lines, want {want}",
            probe.proto.name(),
            probe.from,
            probe.to,
            probe.port
        );
    }
    let denied = cases.iter().filter(|(_, e)| e.is_some()).count();
    assert_eq!(lines.len(), denied, "no other deny lines: {lines:#?}");
    // NFLOG through the nft backend is nf_tables' native `log`, which iptables-nft 1.8.7
    // cannot list (defect 19): the agent says so once, and only then.
    let caveats = node.log().matches("iptables-nft 1.8.7 and older").count();
    assert_eq!(
        caveats,
        usize::from(backend == "nft"),
        "{backend}: the NFLOG reader caveat, once with nft and never with legacy"
    );
    if let Some(sample) = lines
        .iter()
        .find(|l| l["protocol"] == "tcp" && l["direction"] == "ingress")
    {
        println!("{backend} sample line: {sample}");
    }
    let slowest = delays.iter().max().unwrap();
    println!(
        "{backend}: {denied} denied probes, one line each, slowest {slowest:?}; {} allowed, none logged",
        cases.len() - denied
    );
}

#[test]
fn deny_logs_name_pods_direction_and_policies_nft() {
    deny_logs_name_pods_direction_and_policies("nft");
}

#[test]
fn deny_logs_name_pods_direction_and_policies_legacy() {
    deny_logs_name_pods_direction_and_policies("legacy");
}

#[test]
fn text_lines_and_off_means_no_socket_and_no_rule() {
    let mut node = PodNode::new("denylog-text", "nft", pods());
    node.write_policies(POLICIES);
    // Off (the default): no NFLOG rule, no bound group.
    node.start_agent(&[]);
    node.wait_converged(Duration::from_secs(20));
    let saved = node.node.exec_ok(&["iptables-nft-save", "-t", "filter"]);
    assert!(!saved.contains("NFLOG"), "{saved}");
    // No netlink socket of the agent is bound to NFLOG: /proc/net/netfilter/nfnetlink_log
    // lists the bound groups of the namespace.
    let groups = node
        .node
        .exec_ok(&["cat", "/proc/net/netfilter/nfnetlink_log"]);
    assert!(
        groups.trim().is_empty(),
        "groups bound with deny logging off: {groups}"
    );
    if let Some(mut agent) = node.agent.take() {
        let _ = agent.kill();
        let _ = agent.wait();
    }

    // On, text format: one readable line.
    node.start_agent(&[
        ("FELIX_DENYLOGENABLED", "true"),
        ("FELIX_DENYLOGNFLOGGROUP", "32"),
    ]);
    node.wait_converged(Duration::from_secs(20));
    let groups = node
        .node
        .exec_ok(&["cat", "/proc/net/netfilter/nfnetlink_log"]);
    assert!(!groups.trim().is_empty(), "the group is bound");
    let server = node.pod("x/server");
    let probe = Probe {
        from: "y/intruder",
        to: server.v4.into(),
        proto: Proto::Udp,
        port: 80,
        src_port: 42424,
    };
    send(&node, &probe);
    let start = Instant::now();
    let line = loop {
        if let Some(l) = node
            .log()
            .lines()
            .find(|l| l.contains("deny_log") && l.contains("42424"))
        {
            break l.to_string();
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(1)),
            "{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("{line}");
    for part in [
        "deny_log: denied",
        "node=node-1",
        "direction=ingress",
        "src=y/intruder",
        "src_ip=10.77.0.12",
        "src_port=42424",
        "dst=x/server",
        "dst_ip=10.77.0.10",
        "dst_port=80",
        "protocol=udp",
        "policies=x/allow-client,x/default-deny",
        "chain=cali-tw-calisrv",
    ] {
        assert!(line.contains(part), "{part} missing from {line}");
    }
}
