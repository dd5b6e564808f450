//! Flow logs on a real kernel: the agent (`FELIX_FLOWLOGSENABLED=true`) runs in a node
//! namespace with dual-stack pods wired the Calico way (`tests/pod_node`), real TCP, UDP and
//! ICMP traffic flows between the pods' namespaces, and then:
//! - every flow sent appears in `GET /flows` at the node with the right action, both ends,
//!   port, protocol and reporter (egress and ingress: both are decided on this one node);
//! - its policy and rule index are the ones `netpol-agent explain` names for that flow,
//!   NetworkPolicy rules and ClusterNetworkPolicy (Admin tier) Accept and Deny rules alike;
//! - no record names a flow between pods that was not sent;
//! - conntrack's counts: a closed TCP connection has packets and bytes both ways and counts
//!   as completed;
//! - `GET /flows/stream` sends records as newline-delimited JSON, `netpol-agent flows` prints
//!   them, and a filter narrows them;
//! - `netpol_flow_rule_connections_total` has a series per deciding rule with the connections
//!   sent through it, and a deleted policy's series go;
//! - flow logs off: no flow-log rule, no NFLOG group bound, no `/flows`.

mod common;
mod pod_node;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pod_node::{PodNode, PodSpec};
use serde_json::Value;

const HEALTH: u16 = 9099;

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 53}]
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-open}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: open}}}}
  ingress:
  - {name: no-intruders, action: Deny, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: intruder}}}}]}
  - {action: Accept, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}}]}
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
            namespace: "z",
            name: "open",
            labels: &[("app", "open")],
            n: 13,
            iface: Some("caliopn"),
        },
    ]
}

/// TCP servers that answer each connection's first read with "pong" and close.
fn tcp_server(node: &PodNode, pod: &str, addr: IpAddr, port: u16) {
    let ns = node.pod(pod).ns.name.clone();
    let listener = common::in_netns(&ns, || {
        TcpListener::bind(SocketAddr::new(addr, port)).unwrap()
    });
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 64];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"pong");
        }
    });
}

fn udp_server(node: &PodNode, pod: &str, addr: IpAddr, port: u16) {
    let ns = node.pod(pod).ns.name.clone();
    let socket = common::in_netns(&ns, || {
        UdpSocket::bind(SocketAddr::new(addr, port)).unwrap()
    });
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], from);
        }
    });
}

/// A TCP exchange from `pod`: Ok when the server answered.
fn tcp(node: &PodNode, pod: &str, to: IpAddr, port: u16) -> bool {
    let ns = node.pod(pod).ns.name.clone();
    common::in_netns(&ns, || {
        let Ok(mut s) =
            TcpStream::connect_timeout(&SocketAddr::new(to, port), Duration::from_secs(1))
        else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(b"ping").unwrap();
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        got == "pong"
    })
}

fn udp(node: &PodNode, pod: &str, to: IpAddr, port: u16) -> bool {
    let ns = node.pod(pod).ns.name.clone();
    common::in_netns(&ns, || {
        let s = UdpSocket::bind(SocketAddr::new(
            if to.is_ipv4() {
                [0, 0, 0, 0].into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            },
            0,
        ))
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send_to(b"query", SocketAddr::new(to, port)).unwrap();
        let mut buf = [0u8; 64];
        matches!(s.recv_from(&mut buf), Ok((5, _)))
    })
}

/// One ICMP echo from `pod` over a raw socket; true when the reply came.
fn ping(node: &PodNode, pod: &str, to: std::net::Ipv4Addr) -> bool {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let ns = node.pod(pod).ns.name.clone();
    common::in_netns(&ns, || {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut echo = [8u8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let mut sum: u32 = echo
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        echo[2..4].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        s.send_to(&echo, &SockAddr::from(SocketAddr::new(to.into(), 0)))
            .unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 256];
        let deadline = Instant::now() + common::scaled(Duration::from_secs(2));
        while Instant::now() < deadline {
            if let Ok(n) = s.recv(&mut buf) {
                // IPv4 header (20 bytes), then type 0: an echo reply.
                let bytes: Vec<u8> = buf[..n]
                    .iter()
                    .map(|b| unsafe { b.assume_init() })
                    .collect();
                if n >= 28 && bytes[20] == 0 {
                    return true;
                }
            }
        }
        false
    })
}

fn flows(node: &PodNode, query: &str) -> Vec<Value> {
    let (status, body) =
        common::http_get(&node.node.name, HEALTH, &format!("/flows?{query}")).unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// (source, destination, port, proto, reporter) of a record.
type Key = (String, String, Option<u64>, String, String);

fn key_of(r: &Value) -> Key {
    let end = |side: &str| {
        let name = r[format!("{side}_name")].as_str().unwrap_or("");
        if name.is_empty() {
            r[format!("{side}_ip")].as_str().unwrap().to_string()
        } else {
            format!(
                "{}/{name}",
                r[format!("{side}_namespace")].as_str().unwrap()
            )
        }
    };
    (
        end("source"),
        end("dest"),
        r["dest_port"].as_u64(),
        r["proto"].as_str().unwrap().to_string(),
        r["reporter"].as_str().unwrap().to_string(),
    )
}

fn key(src: &str, dst: &str, port: Option<u64>, proto: &str, reporter: &str) -> Key {
    (src.into(), dst.into(), port, proto.into(), reporter.into())
}

/// The records of each key, merged over intervals: (action, verdict, policies as
/// `ns/name#rule`, connections started, completed, packets in, packets out, bytes in, out).
#[derive(Debug, Default, Clone, PartialEq)]
struct Merged {
    action: String,
    verdict: String,
    policies: Vec<String>,
    started: u64,
    completed: u64,
    packets: (u64, u64),
    bytes: (u64, u64),
}

fn merged(records: &[Value]) -> BTreeMap<Key, Merged> {
    let mut out: BTreeMap<Key, Merged> = BTreeMap::new();
    for r in records {
        let m = out.entry(key_of(r)).or_default();
        m.action = r["action"].as_str().unwrap().into();
        m.verdict = r["verdict"].as_str().unwrap().into();
        m.policies = r["policies"]["enforced_policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| match p["kind"].as_str().unwrap() {
                "ClusterNetworkPolicy" => format!(
                    "ClusterNetworkPolicy {}:{}#{}",
                    p["tier"].as_str().unwrap(),
                    p["name"].as_str().unwrap(),
                    p["rule_index"]
                ),
                _ => format!(
                    "{}/{}#{}",
                    p["namespace"].as_str().unwrap(),
                    p["name"].as_str().unwrap(),
                    p["rule_index"]
                ),
            })
            .collect();
        let n = |k: &str| r[k].as_u64().unwrap();
        m.started += n("num_connections_started");
        m.completed += n("num_connections_completed");
        m.packets.0 += n("packets_in");
        m.packets.1 += n("packets_out");
        m.bytes.0 += n("bytes_in");
        m.bytes.1 += n("bytes_out");
    }
    out
}

/// What `explain` says decided one direction: (action, policies as `ns/name#rule`, or the
/// isolating ones with -1; empty when not isolated).
fn explain(
    node: &PodNode,
    from: &str,
    to: &str,
    port: u16,
    proto: &str,
    direction: &str,
) -> (String, Vec<String>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_netpol-agent"))
        .args(["explain", "--manifests"])
        .arg(&node.dir.path)
        .args([
            "--node",
            pod_node::NODE,
            "--from",
            from,
            "--to",
            to,
            "--port",
            &port.to_string(),
        ])
        .args(["--protocol", proto, "--output", "json"])
        .env_remove("FELIX_INTERFACENAMESCHEME")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "explain {from} {to} {port}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let side = &doc[direction];
    // A ClusterNetworkPolicy tier that decided (Accept or Deny) comes first.
    if let Some(t) = side["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t.get("matched").is_some() && t["decision"] != "pass")
    {
        let m = &t["matched"];
        return (
            side["verdict"].as_str().unwrap().to_string(),
            vec![format!(
                "{}:{}#{}",
                t["tier"].as_str().unwrap(),
                m["policy"].as_str().unwrap(),
                m["rule"]
            )],
        );
    }
    let np = side["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t.get("isolated").is_some())
        .unwrap_or_else(|| panic!("no NetworkPolicy tier in {side}"));
    let action = side["verdict"].as_str().unwrap().to_string();
    if let Some(a) = np.get("allowed_by") {
        return (
            action,
            vec![format!("{}#{}", a["policy"].as_str().unwrap(), a["rule"])],
        );
    }
    let isolating = np["isolated_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{}#-1", p["policy"].as_str().unwrap()))
        .collect();
    (action, isolating)
}

#[test]
fn flow_records_match_the_traffic_and_explain() {
    let backend = if common::have("iptables-nft") {
        "nft"
    } else {
        "legacy"
    };
    let mut node = PodNode::new("flowlog", backend, pods());
    node.write_policies(POLICIES);
    node.start_agent(&[
        ("FELIX_FLOWLOGSENABLED", "true"),
        ("FELIX_FLOWLOGSFLUSHINTERVAL", "1"),
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
        ("FELIX_HEALTHPORT", "9099"),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
        ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
        ("FELIX_PROMETHEUSMETRICSPORT", "9091"),
    ]);
    node.wait_converged(Duration::from_secs(30));
    let ip4 = |p: &str| IpAddr::from(node.pod(p).v4);
    let ip6 = |p: &str| IpAddr::from(node.pod(p).v6);
    tcp_server(&node, "x/server", ip4("x/server"), 80);
    tcp_server(&node, "x/server", ip6("x/server"), 80);
    tcp_server(&node, "x/server", ip4("x/server"), 8443);
    udp_server(&node, "x/server", ip4("x/server"), 53);
    tcp_server(&node, "z/open", ip4("z/open"), 8080);

    // The traffic, and what must come of it.
    assert!(
        tcp(&node, "y/client", ip4("x/server"), 80),
        "{}",
        node.diagnose()
    );
    assert!(tcp(&node, "y/client", ip6("x/server"), 80));
    assert!(
        tcp(&node, "y/client", ip4("x/server"), 8443),
        "rule 1 allows every port"
    );
    assert!(udp(&node, "y/client", ip4("x/server"), 53));
    assert!(ping(&node, "y/client", node.pod("x/server").v4));
    assert!(!tcp(&node, "y/intruder", ip4("x/server"), 80), "denied");
    assert!(
        tcp(&node, "y/client", ip4("z/open"), 8080),
        "the Admin tier accepts"
    );
    assert!(
        !tcp(&node, "y/intruder", ip4("z/open"), 8080),
        "the Admin tier denies"
    );

    let ok = |p: &str| vec![format!("{p}")];
    let mut want: BTreeMap<Key, (&str, &str, Vec<String>)> = BTreeMap::new();
    for (dst, port, proto, rule) in [
        ("x/server", Some(80), "tcp", "x/allow-client#0"),
        ("x/server", Some(8443), "tcp", "x/allow-client#1"),
        ("x/server", Some(53), "udp", "x/allow-client#0"),
        ("x/server", None, "icmp", "x/allow-client#1"),
    ] {
        want.insert(
            key("y/client", dst, port, proto, "Dst"),
            ("Allow", "rule", ok(rule)),
        );
        want.insert(
            key("y/client", dst, port, proto, "Src"),
            ("Allow", "no policy isolates the pod", vec![]),
        );
    }
    want.insert(
        key("y/intruder", "x/server", Some(80), "tcp", "Dst"),
        ("Deny", "isolated, no rule allowed", ok("x/allow-client#-1")),
    );
    want.insert(
        key("y/intruder", "x/server", Some(80), "tcp", "Src"),
        ("Allow", "no policy isolates the pod", vec![]),
    );
    want.insert(
        key("y/client", "z/open", Some(8080), "tcp", "Dst"),
        (
            "Allow",
            "rule",
            ok("ClusterNetworkPolicy Admin:guard-open#1"),
        ),
    );
    want.insert(
        key("y/intruder", "z/open", Some(8080), "tcp", "Dst"),
        (
            "Deny",
            "rule",
            ok("ClusterNetworkPolicy Admin:guard-open#0"),
        ),
    );
    want.insert(
        key("y/intruder", "z/open", Some(8080), "tcp", "Src"),
        ("Allow", "no policy isolates the pod", vec![]),
    );
    want.insert(
        key("y/client", "z/open", Some(8080), "tcp", "Src"),
        ("Allow", "no policy isolates the pod", vec![]),
    );

    // Wait for every record, and for the counts of the closed TCP connection.
    let pod_ips: BTreeSet<String> = node
        .pods
        .values()
        .flat_map(|p| [p.v4.to_string(), p.v6.to_string()])
        .collect();
    let start = Instant::now();
    let got = loop {
        let records = flows(&node, "");
        let got = merged(&records);
        let http = got.get(&key("y/client", "x/server", Some(80), "tcp", "Dst"));
        let done = want.keys().all(|k| got.contains_key(k))
            && http.is_some_and(|m| m.completed >= 2 && m.bytes.0 > 0 && m.bytes.1 > 0);
        if done {
            // Records between pods only (a pod's traffic to its node is not the test's).
            let between_pods: Vec<&Value> = records
                .iter()
                .filter(|r| {
                    pod_ips.contains(r["source_ip"].as_str().unwrap())
                        && pod_ips.contains(r["dest_ip"].as_str().unwrap())
                })
                .collect();
            let sample = serde_json::to_string_pretty(&between_pods[0]).unwrap();
            println!("a record:\n{sample}");
            break merged(&between_pods.into_iter().cloned().collect::<Vec<_>>());
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(20)),
            "records missing; have {:#?}\nagent log:\n{}",
            got.keys().collect::<Vec<_>>(),
            node.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    // The IPv6 request is its own key (by address family of the ends: same names, so the
    // record keys coincide with the IPv4 one); counted there.
    for (k, (action, verdict, policies)) in &want {
        let m = &got[k];
        assert_eq!(
            (m.action.as_str(), m.verdict.as_str()),
            (*action, *verdict),
            "{k:?}"
        );
        assert_eq!(&m.policies, policies, "{k:?}");
        assert!(m.started >= 1, "{k:?}");
    }
    let sent: BTreeSet<&Key> = want.keys().collect();
    let extra: Vec<&Key> = got.keys().filter(|k| !sent.contains(k)).collect();
    assert!(extra.is_empty(), "records of flows not sent: {extra:?}");
    let http = &got[&key("y/client", "x/server", Some(80), "tcp", "Dst")];
    assert_eq!(http.started, 2, "IPv4 and IPv6: one connection each");
    // SYN, ACK, "ping", FIN, ACK at least towards the server; "pong" back.
    assert!(http.packets.0 >= 4 && http.packets.1 >= 3, "{http:?}");
    assert!(
        http.bytes.0 > http.packets.0 * 40 && http.bytes.1 > 0,
        "{http:?}"
    );
    let denied = &got[&key("y/intruder", "x/server", Some(80), "tcp", "Dst")];
    assert_eq!(
        (denied.packets, denied.bytes),
        ((0, 0), (0, 0)),
        "a denied connection has no conntrack entry"
    );

    for (k, m) in &got {
        if m.action == "Deny" {
            assert_eq!(
                (m.packets, m.bytes, m.completed),
                ((0, 0), (0, 0), 0),
                "{k:?}: denied, never followed"
            );
        }
    }
    let live_denied: Vec<Value> = flows(&node, "action=deny")
        .into_iter()
        .filter(|r| r["num_connections_live"] != 0)
        .collect();
    assert!(
        live_denied.is_empty(),
        "denied connections are never live: {live_denied:?}"
    );
    // The same policy and rule as explain, both directions.
    for (from, to, port, proto) in [
        ("y/client", "x/server", 80, "TCP"),
        ("y/client", "x/server", 8443, "TCP"),
        ("y/client", "x/server", 53, "UDP"),
        ("y/intruder", "x/server", 80, "TCP"),
        ("y/client", "z/open", 8080, "TCP"),
        ("y/intruder", "z/open", 8080, "TCP"),
    ] {
        for (direction, reporter) in [("ingress", "Dst"), ("egress", "Src")] {
            let (action, policies) = explain(&node, from, to, port, proto, direction);
            let m = &got[&key(
                from,
                to,
                Some(u64::from(port)),
                &proto.to_ascii_lowercase(),
                reporter,
            )];
            assert_eq!(
                m.action.to_ascii_lowercase(),
                action,
                "{from} -> {to}:{port} {direction}"
            );
            assert_eq!(m.policies, policies, "{from} -> {to}:{port} {direction}");
        }
    }

    // Filters narrow: by action, pod and policy.
    let denied = flows(&node, "action=deny");
    assert!(!denied.is_empty() && denied.iter().all(|r| r["action"] == "Deny"));
    let open = flows(&node, "pod=z%2Fopen");
    assert!(!open.is_empty() && open.iter().all(|r| r["dest_name"] == "open"));
    let cnp = flows(&node, "policy=guard-open");
    assert!(
        !cnp.is_empty()
            && cnp
                .iter()
                .all(|r| r["reporter"] == "Dst" && r["dest_name"] == "open")
    );
    assert!(flows(&node, "policy=x/allow-client")
        .iter()
        .all(|r| r["dest_name"] == "server"));
    let (status, _) = common::http_get(&node.node.name, HEALTH, "/flows?actoin=deny").unwrap();
    assert_eq!(status, 400, "an unknown filter is refused");

    // The stream: records as newline-delimited JSON (since=0 replays what is kept).
    let line = common::in_netns(&node.node.name, || {
        let mut s = TcpStream::connect(("127.0.0.1", HEALTH)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET /flows/stream?since=0&action=deny HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            if l == "\r\n" {
                break;
            }
            head.push_str(&l);
        }
        assert!(
            head.starts_with("HTTP/1.1 200") && head.contains("application/x-ndjson"),
            "{head}"
        );
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    });
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["action"], "Deny");

    // The CLI: the same records as a table.
    let out = common::agent_in(&node.node.name)
        .args([
            "flows",
            "--agent",
            "http://127.0.0.1:9099",
            "--action",
            "deny",
        ])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{table}");
    assert!(table.starts_with("START"));
    assert!(
        table.lines().skip(1).all(|l| l.contains("y/intruder")
            && (l.contains("x/allow-client") || l.contains("Admin:guard-open#0"))),
        "{table}"
    );
    let out = common::agent_in(&node.node.name)
        .args([
            "flows",
            "--agent",
            "http://127.0.0.1:9099",
            "--agent",
            "http://127.0.0.1:1",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "an agent that cannot be read is an error"
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        all.as_array().unwrap().len() >= want.len(),
        "the readable agent's records are printed"
    );

    // The per-rule hit metric, from the flushed records: every deciding rule above has its
    // series with at least the connections sent through it.
    let series = |kind: &str, ns: &str, policy: &str, rule: &str, action: &str, dir: &str| {
        BTreeMap::from([
            ("kind".to_string(), kind.to_string()),
            ("namespace".to_string(), ns.to_string()),
            ("policy".to_string(), policy.to_string()),
            ("rule".to_string(), rule.to_string()),
            ("action".to_string(), action.to_string()),
            ("direction".to_string(), dir.to_string()),
        ])
    };
    let np = |rule: &str, action: &str| {
        series(
            "NetworkPolicy",
            "x",
            "allow-client",
            rule,
            action,
            "ingress",
        )
    };
    let cnp = |rule: &str, action: &str| {
        series(
            "ClusterNetworkPolicy",
            "",
            "guard-open",
            rule,
            action,
            "ingress",
        )
    };
    let hits_want = [
        // TCP over IPv4 and IPv6 to port 80, UDP to 53.
        (np("0", "allow"), 3),
        // TCP to 8443, the ping.
        (np("1", "allow"), 2),
        (cnp("1", "allow"), 1),
        (cnp("0", "deny"), 1),
        // Isolated, no rule allowed: the intruder to the server.
        (series("", "", "", "", "deny", "ingress"), 1),
        // No policy isolates the clients' egress: every connection they opened.
        (series("", "", "", "", "allow", "egress"), 8),
    ];
    let start = Instant::now();
    let hits = loop {
        let hits = rule_hits(&node);
        if hits_want
            .iter()
            .all(|(labels, n)| hits.get(labels).is_some_and(|v| v >= n))
        {
            break hits;
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(10)),
            "per-rule hits missing: have {hits:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    println!("per-rule hits: {hits:#?}");
    assert!(
        hits.keys().all(|l| l["kind"].is_empty()
            || ["allow-client", "guard-open"].contains(&l["policy"].as_str())),
        "a series only for rules that decided: {hits:#?}"
    );
    // The NetworkPolicy deleted: its series go at the next flush, the ClusterNetworkPolicy's
    // stay.
    let cnp_only = POLICIES.split_once("---\n").unwrap().1;
    node.write_policies(cnp_only);
    let start = Instant::now();
    loop {
        let hits = rule_hits(&node);
        if !hits.keys().any(|l| l["policy"] == "allow-client") {
            assert!(hits.contains_key(&cnp("0", "deny")), "{hits:#?}");
            break;
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(15)),
            "the deleted policy's series stay: {hits:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `netpol_flow_rule_connections_total`'s series (labels by name) and values.
fn rule_hits(node: &PodNode) -> BTreeMap<BTreeMap<String, String>, u64> {
    let (status, text) = common::http_get(&node.node.name, 9091, "/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("netpol_flow_rule_connections_total{") else {
            continue;
        };
        let (labels, value) = rest.rsplit_once("} ").unwrap();
        let labels: BTreeMap<String, String> = labels
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect();
        out.insert(labels, value.trim().parse().unwrap());
    }
    out
}

#[test]
fn flow_logs_off_means_no_rule_no_socket_no_api() {
    let backend = if common::have("iptables-nft") {
        "nft"
    } else {
        "legacy"
    };
    let mut node = PodNode::new("flowoff", backend, pods());
    node.write_policies(POLICIES);
    node.start_agent(&[
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
        ("FELIX_HEALTHPORT", "9099"),
    ]);
    node.wait_converged(Duration::from_secs(30));
    for save in [
        format!("iptables-{backend}-save"),
        format!("ip6tables-{backend}-save"),
    ] {
        let rules = node.node.exec_ok(&[&save]);
        assert!(
            !rules.contains("npa-f") && !rules.contains("hashlimit"),
            "{rules}"
        );
    }
    let groups = node
        .node
        .exec_ok(&["cat", "/proc/net/netfilter/nfnetlink_log"]);
    assert!(
        groups.trim().is_empty(),
        "an NFLOG group is bound: {groups}"
    );
    let (status, _) = common::http_get(&node.node.name, HEALTH, "/flows").unwrap();
    assert_eq!(status, 404);
}
