//! Conntrack re-evaluation on a real kernel: the agent runs in a node namespace with
//! dual-stack pods wired the Calico way (`tests/pod_node`); long-lived TCP connections from two
//! client pods to a server pod, over IPv4 and IPv6, carry data while no policy isolates the
//! server. Then a policy arrives that allows only one of the clients:
//! - with `FELIX_CONNTRACKREEVALUATE=true`, the other client's connections stop passing
//!   packets within one second of the policy's arrival (the agent deletes their conntrack
//!   entries, so the next packet meets the new rules), and one cut line per connection names
//!   the flow, the denying direction and the policy;
//! - without it, they keep passing (the `RELATED,ESTABLISHED` shortcut never asks policy);
//! - the allowed client's connections pass in both cases;
//! - the same without re-evaluation with `FELIX_IPTABLESFILTERALLOWACTION=RETURN` (legacy),
//!   an Admin ClusterNetworkPolicy denying the other client besides.

mod common;
mod pod_node;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::in_netns;
use pod_node::{PodNode, PodSpec};

const PORT: u16 = 8080;

const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-client, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: TCP, port: 8080}]
"#;

/// Beside `POLICY`, in the RETURN variant: an Admin tier Deny of the denied client, ahead of
/// every NetworkPolicy. The established shortcut comes before all tiers (felix's order), so
/// its connections still pass; a shortcut that only marked the packet and went on into the
/// tiers would have them dropped here.
const ADMIN_DENY: &str = r#"
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-other}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - {name: no-other, action: Deny, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: other}}}}]}
"#;

fn pods() -> Vec<PodSpec> {
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
    ]
}

/// One long-lived connection: the client's end and the server's.
struct Conn {
    name: String,
    client: TcpStream,
    server: TcpStream,
    sent: u32,
}

impl Conn {
    fn open(node: &PodNode, listener: &TcpListener, from: &str, to: IpAddr) -> Conn {
        let client = in_netns(&node.pod(from).ns.name, || {
            TcpStream::connect_timeout(&SocketAddr::new(to, PORT), Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("{from} -> {to}: {e}\n{}", node.diagnose()))
        });
        let (server, _) = listener.accept().unwrap();
        server
            .set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        Conn {
            name: format!("{from} -> {to}"),
            client,
            server,
            sent: 0,
        }
    }

    /// Whether a fresh message from the client reaches the server (150 ms to arrive).
    fn passes(&mut self) -> bool {
        self.sent += 1;
        let msg = self.sent.to_be_bytes();
        if self.client.write_all(&msg).is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        match self.server.read_exact(&mut buf) {
            Ok(()) => buf == msg,
            Err(_) => false,
        }
    }
}

fn listener(node: &PodNode, ip: IpAddr) -> TcpListener {
    in_netns(&node.pod("x/server").ns.name, || {
        TcpListener::bind(SocketAddr::new(ip, PORT)).unwrap()
    })
}

fn cut_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "conntrack_cut")
        .collect()
}

/// `allow_return`: `FELIX_IPTABLESFILTERALLOWACTION=RETURN` on the legacy backend, where the
/// shared `cali-wl-start` marks an established packet accepted and returns, and the workload
/// chain returns on the mark (`rules::chains`): the shortcut must hold through both.
fn tightened_policy(reevaluate: bool, allow_return: bool) {
    let tag = match (reevaluate, allow_return) {
        (true, _) => "ctcut-on",
        (false, false) => "ctcut-off",
        (false, true) => "ctcut-ret",
    };
    let backend = if allow_return { "legacy" } else { "nft" };
    let mut node = PodNode::new(tag, backend, pods());
    node.write_policies("");
    let mut env = vec![("FELIX_LOGFORMAT", "json")];
    if reevaluate {
        env.push(("FELIX_CONNTRACKREEVALUATE", "true"));
    }
    if allow_return {
        env.push(("FELIX_IPTABLESFILTERALLOWACTION", "RETURN"));
    }
    node.start_agent(&env);
    node.wait_converged(Duration::from_secs(20));

    let server = node.pod("x/server");
    let (s4, s6): (IpAddr, IpAddr) = (server.v4.into(), server.v6.into());
    let (l4, l6) = (listener(&node, s4), listener(&node, s6));
    let mut allowed = [
        Conn::open(&node, &l4, "y/client", s4),
        Conn::open(&node, &l6, "y/client", s6),
    ];
    let mut denied = [
        Conn::open(&node, &l4, "y/other", s4),
        Conn::open(&node, &l6, "y/other", s6),
    ];
    for c in allowed.iter_mut().chain(denied.iter_mut()) {
        assert!(c.passes(), "{} before the policy", c.name);
    }

    let arrival = Instant::now();
    if allow_return {
        node.write_policies(&format!("{POLICY}{ADMIN_DENY}"));
    } else {
        node.write_policies(POLICY);
    }
    // Probe the denied connections every 100 ms, for 2.5 s or until each has stopped (on
    // until 5 s when stretched by the time scale): when did each stop?
    let window = if common::real_time() {
        Duration::from_millis(2500)
    } else {
        common::scaled(Duration::from_secs(5))
    };
    let mut stopped: Vec<Option<Duration>> = vec![None; denied.len()];
    while arrival.elapsed() < window && (stopped.iter().any(Option::is_none) || !reevaluate) {
        for (c, at) in denied.iter_mut().zip(stopped.iter_mut()) {
            if at.is_none() && !c.passes() {
                *at = Some(arrival.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The policy is in the kernel by now either way.
    node.wait_converged(Duration::from_secs(10));
    for c in allowed.iter_mut() {
        assert!(c.passes(), "{}: allowed, but cut:\n{}", c.name, node.log());
    }
    let lines = cut_lines(&node.log());
    if reevaluate {
        for (c, at) in denied.iter_mut().zip(&stopped) {
            let at = at.unwrap_or_else(|| panic!("{} still passes:\n{}", c.name, node.log()));
            println!(
                "{}: stopped passing {} ms after the policy arrived",
                c.name,
                at.as_millis()
            );
            // A claim about speed, so checked where time is real: under emulation (the
            // kernel matrix's VMs) the policy alone takes seconds to reach the kernel.
            assert!(
                at < Duration::from_secs(1) || !common::real_time(),
                "{}: cut only after {at:?}",
                c.name
            );
            assert!(!c.passes(), "{}: passes again", c.name);
        }
        assert_eq!(
            lines.len(),
            2,
            "one cut line per denied connection: {lines:#?}"
        );
        for line in &lines {
            assert_eq!(line["src"], "y/other", "{line}");
            assert_eq!(line["dst"], "x/server", "{line}");
            assert_eq!(line["denied_by"], "ingress", "{line}");
            assert_eq!(line["pod"], "x/server", "{line}");
            assert_eq!(line["protocol"], "tcp", "{line}");
            assert_eq!(line["dst_port"], PORT, "{line}");
            assert!(
                line["causes"]
                    .as_str()
                    .is_some_and(|c| c.contains("NetworkPolicy x/only-client added")),
                "{line}"
            );
        }
        let dsts: Vec<&str> = lines.iter().filter_map(|l| l["dst_ip"].as_str()).collect();
        assert!(
            dsts.contains(&s4.to_string().as_str()) && dsts.contains(&s6.to_string().as_str()),
            "{dsts:?}"
        );
    } else {
        for (c, at) in denied.iter_mut().zip(&stopped) {
            assert_eq!(*at, None, "{}: cut with re-evaluation off", c.name);
            assert!(c.passes(), "{}", c.name);
        }
        assert!(lines.is_empty(), "{lines:#?}");
    }
    // A new connection from the denied client is refused in both cases: the policy is in.
    let refused = in_netns(&node.pod("y/other").ns.name, || {
        TcpStream::connect_timeout(&SocketAddr::new(s4, PORT), Duration::from_millis(500)).is_err()
    });
    assert!(refused, "a new denied connection got through");
}

#[test]
fn a_tightened_policy_cuts_exactly_the_connections_it_denies() {
    common::require_root();
    tightened_policy(true, false);
}

#[test]
fn without_reevaluation_established_connections_survive_a_tightened_policy() {
    common::require_root();
    tightened_policy(false, false);
}

#[test]
fn with_the_return_allow_action_established_connections_survive_and_new_ones_meet_policy() {
    common::require_root();
    tightened_policy(false, true);
}
