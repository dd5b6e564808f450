//! The kernel's rule counters, read in-process (`host::rule_counters`), agree with
//! `iptables-save -c` on both backends and families; and through the agent
//! (`FELIX_POLICYCOUNTERSENABLED`, deny logging on) they become per-policy and per-pod
//! Prometheus counters that count real packets, and a pod that goes away takes its series
//! with it.

mod common;
mod nf_pair;
mod pod_node;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{http_get, in_netns, NetNs};
use netpol_agent::host::rule_counters::{self, Family, Xtables};
use pod_node::{PodNode, PodSpec};

type Counts = BTreeMap<(String, String), (u64, u64)>;

/// `[packets:bytes] -A chain -m comment --comment "first" ...` lines of our chains.
fn from_save(text: &str) -> Counts {
    let mut out = Counts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((counts, rule)) = rest.split_once("] -A ") else {
            continue;
        };
        let (p, b) = counts.split_once(':').unwrap();
        let chain = rule.split_whitespace().next().unwrap();
        if !chain.starts_with("cali-") {
            continue;
        }
        let comment = rule
            .split_once("--comment \"")
            .map(|(_, c)| c.split('"').next().unwrap().to_string())
            .unwrap_or_default();
        out.insert(
            (chain.to_string(), comment),
            (p.parse().unwrap(), b.parse().unwrap()),
        );
    }
    out
}

fn read_in_process(ns: &NetNs, xt: Xtables, family: Family) -> Counts {
    in_netns(&ns.name, || {
        let mut out = Counts::new();
        rule_counters::read(xt, family, "filter", "cali-", |c| {
            out.insert(
                (c.chain.to_string(), c.comment.to_string()),
                (c.packets, c.bytes),
            );
        })
        .expect("reading the counters");
        out
    })
}

#[test]
fn in_process_reads_agree_with_iptables_save_on_both_backends_and_families() {
    for (xt, backend) in [(Xtables::Legacy, "legacy"), (Xtables::Nft, "nft")] {
        let ns = NetNs::new(&format!("counters-{backend}"));
        for (family, tool, lo) in [
            (Family::V4, "iptables", "127.0.0.1"),
            (Family::V6, "ip6tables", "::1"),
        ] {
            let rules = "*filter\n:cali-x - [0:0]\n:cali-y - [0:0]\n\
                 -A OUTPUT -o lo -j cali-x\n\
                 -A cali-x -p udp -m comment --comment \"cali:port5000\" -m comment --comment \"second\" -m udp --dport 5000 -j MARK --set-xmark 0x10000/0x10000\n\
                 -A cali-x -p udp -m comment --comment \"cali:port5001\" -m udp --dport 5001 -j cali-y\n\
                 -A cali-x -m comment --comment \"cali:all\"\n\
                 -A cali-y -j RETURN\n\
                 COMMIT\n";
            ns.sh_ok(&format!(
                "printf '%s' '{rules}' | {tool}-{backend}-restore -w"
            ));
            let dst: IpAddr = lo.parse().unwrap();
            in_netns(&ns.name, || {
                let s = UdpSocket::bind(SocketAddr::new(dst, 0)).unwrap();
                for i in 0..7 {
                    s.send_to(&[0u8; 20], SocketAddr::new(dst, 5000)).unwrap();
                    if i < 3 {
                        s.send_to(&[0u8; 100], SocketAddr::new(dst, 5001)).unwrap();
                    }
                }
            });
            let ours = read_in_process(&ns, xt, family);
            let saved =
                from_save(&ns.exec_ok(&[&format!("{tool}-{backend}-save"), "-c", "-t", "filter"]));
            assert_eq!(ours, saved, "{tool}-{backend}");
            let port5000 = ours[&("cali-x".to_string(), "cali:port5000".to_string())];
            assert_eq!(port5000.0, 7, "{tool}-{backend}: {ours:?}");
            assert_eq!(
                ours[&("cali-x".to_string(), "cali:port5001".to_string())].0,
                3
            );
            // Every datagram, and the ICMP port-unreachable each one draws, pass the last rule.
            assert_eq!(ours[&("cali-x".to_string(), "cali:all".to_string())].0, 20);
            // The chain's rule without a comment is read with an empty one.
            assert!(ours.contains_key(&("cali-y".to_string(), String::new())));
        }
    }
}

#[test]
fn a_missing_table_reads_nothing_or_fails_never_panics() {
    let ns = NetNs::new("counters-missing");
    in_netns(&ns.name, || {
        let r = rule_counters::read(Xtables::Nft, Family::V4, "no-such-table", "cali-", |_| {
            panic!("no rules in a missing table")
        });
        assert_eq!(r.unwrap().rules, 0);
        let r = rule_counters::read(
            Xtables::Legacy,
            Family::V4,
            "no-such-table",
            "cali-",
            |_| {},
        );
        assert!(r.is_err());
    });
}

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: UDP, port: 80}]
"#;

fn metric(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

fn udp_from(node: &PodNode, from: &str, to: IpAddr, port: u16, count: u16) {
    let pod = node.pod(from);
    in_netns(&pod.ns.name, || {
        for i in 0..count {
            // A new source port each time: a new connection, so policy sees each.
            let s = UdpSocket::bind(SocketAddr::new(IpAddr::V4(pod.v4), 30000 + i)).unwrap();
            s.send_to(&[0u8; 72], SocketAddr::new(to, port)).unwrap();
        }
    });
}

#[test]
fn policy_and_pod_counters_follow_real_packets_and_pods_leaving() {
    let mut node = PodNode::new(
        "counters-agent",
        "nft",
        vec![
            PodSpec {
                namespace: "x",
                name: "server",
                labels: &[("app", "server")],
                n: 20,
                iface: Some("calisrv"),
            },
            PodSpec {
                namespace: "y",
                name: "client",
                labels: &[("role", "client")],
                n: 21,
                iface: Some("calicli"),
            },
            PodSpec {
                namespace: "y",
                name: "other",
                labels: &[("role", "other")],
                n: 22,
                iface: Some("calioth"),
            },
        ],
    );
    node.write_policies(POLICIES);
    node.start_agent(&[
        ("FELIX_POLICYCOUNTERSENABLED", "true"),
        ("FELIX_POLICYCOUNTERSINTERVAL", "0.5"),
        ("FELIX_DENYLOGENABLED", "true"),
        ("FELIX_DENYLOGNFLOGGROUP", "33"),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
        ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
    ]);
    node.wait_converged(Duration::from_secs(20));
    let scrape = |node: &PodNode| http_get(&node.node.name, 9091, "/metrics").unwrap().1;
    // The first read is the baseline: wait for two.
    let start = Instant::now();
    while metric(
        &scrape(&node),
        "netpol_rule_counters_read_seconds_count",
        "",
    )
    .unwrap_or(0)
        < 2
    {
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(10)),
            "{}",
            scrape(&node)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let server: IpAddr = node.pod("x/server").v4.into();
    udp_from(&node, "y/client", server, 80, 5);
    udp_from(&node, "y/other", server, 80, 3);
    let policy = "direction=\"ingress\",namespace=\"x\",policy=\"allow-client\"";
    let pod = "direction=\"ingress\",namespace=\"x\",pod=\"server\"";
    let start = Instant::now();
    loop {
        let text = scrape(&node);
        let allowed = metric(&text, "netpol_policy_packets_total", policy);
        let bytes = metric(&text, "netpol_policy_bytes_total", policy);
        let denied = metric(&text, "netpol_denied_packets_total", pod);
        if allowed == Some(5) && denied == Some(3) {
            for name in netpol_agent::telemetry::metrics::TRAFFIC_NAMES {
                assert!(
                    text.contains(&format!("# TYPE {name} ")),
                    "{name} missing:\n{text}"
                );
            }
            // 72 bytes of payload, 8 of UDP header, 20 of IPv4 header.
            assert_eq!(bytes, Some(5 * 100), "{text}");
            break;
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(5)),
            "allowed {allowed:?}, denied {denied:?}\n{text}\n{}",
            node.diagnose()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The server leaves the node: its series and its policy's go.
    let pods = std::fs::read_to_string(node.dir.path.join("pods.yaml")).unwrap();
    let without: Vec<&str> = pods
        .split("---\n")
        .filter(|d| !d.contains("name: server"))
        .collect();
    common::cluster::write_atomic(&node.dir.path, "pods.yaml", &without.join("---\n"));
    let start = Instant::now();
    loop {
        let text = scrape(&node);
        let gone = metric(&text, "netpol_denied_packets_total", pod).is_none()
            && metric(&text, "netpol_policy_packets_total", policy).is_none();
        if gone {
            break;
        }
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(5)),
            "{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
