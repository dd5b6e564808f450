//! Bridge mode on a real kernel, with real packets: a node namespace with the bridge `cni0`
//! (10.244.0.1/24, `br_netfilter` with `bridge-nf-call-iptables=1` in the namespace), pods
//! in their own namespaces attached through `veth<8 hex>` ports, a second node routed to it,
//! kube-proxy-style ClusterIP DNATs, and the real agent (`netpol-agent run` with
//! `FELIX_BRIDGEINTERFACE=cni0 FELIX_INTERFACENAMESCHEME=bridge FELIX_INTERFACEPREFIX=veth`)
//! enforcing a default-deny-ingress + allow policy and an egress-deny policy. TCP connects
//! check every path (same-node bridged, pod → other node, other node → pod, pod → ClusterIP
//! → pod on the same node, pod → host) before, with and after the policies. The bridge
//! resolver is also run in-process in a namespace: it learns a new silent pod's port when
//! the pod is sighted and follows the port's removal.

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{self, write_atomic, Manifest};
use common::{Agent, NetNs, TempDir};
use netpol_agent::iface_naming::{BridgeResolver, InterfaceResolver};
use netpol_agent::model::{ObjectKey, PodInfo};

static VETHS: AtomicUsize = AtomicUsize::new(0);

/// `veth` + 8 hex characters, as flannel and the bridge plugin name host veths.
fn random_veth() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = VETHS.fetch_add(1, Ordering::SeqCst) as u32;
    let mixed = (nanos ^ (std::process::id() << 12) ^ n.wrapping_mul(0x9e37_79b9)) as u64;
    format!(
        "veth{:08x}",
        (mixed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    )
}

struct Pod {
    ns: NetNs,
    veth: String,
    ip: String,
}

/// The node namespace with `cni0`, and the other node.
struct Cluster {
    node: NetNs,
    remote: NetNs,
}

const REMOTE_POD: &str = "10.244.1.1";
const REMOTE_NODE: &str = "192.168.50.2";
const GATEWAY: &str = "10.244.0.1";
const GATEWAY6: &str = "fd00:244::1";

impl Cluster {
    fn new(tag: &str) -> Cluster {
        let node = NetNs::new(&format!("{tag}-node"));
        assert!(
            node.exec(&["test", "-e", "/proc/sys/net/bridge/bridge-nf-call-iptables"])
                .status
                .success(),
            "br_netfilter is not loaded on this host (modprobe br_netfilter): bridge mode cannot be tested"
        );
        node.sh_ok(
            "ip link add cni0 type bridge && ip addr add 10.244.0.1/24 dev cni0 && \
             ip -6 addr add fd00:244::1/64 dev cni0 nodad && \
             ip link set cni0 up && sysctl -qw net.ipv4.ip_forward=1 && \
             sysctl -qw net.ipv6.conf.all.forwarding=1 && \
             echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables && \
             echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables",
        );
        let remote = NetNs::new(&format!("{tag}-remote"));
        common::run_ok(
            "ip",
            &[
                "-n",
                &node.name,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &remote.name,
            ],
        );
        node.sh_ok(
            "ip addr add 192.168.50.1/24 dev eth0 && ip link set eth0 up && \
             ip route add 10.244.1.0/24 via 192.168.50.2",
        );
        remote.sh_ok(
            "ip addr add 192.168.50.2/24 dev eth0 && ip link set eth0 up && \
             ip addr add 10.244.1.1/32 dev lo && ip route add 10.244.0.0/24 via 192.168.50.1",
        );
        Cluster { node, remote }
    }

    /// A pod namespace on the bridge through a new `veth<8 hex>` port. An IPv4 pod has IPv6
    /// off, so it stays silent until it is spoken to; an IPv6 pod (`ip` with `:`) is IPv6
    /// only.
    fn add_pod(&self, tag: &str, ip: &str) -> Pod {
        let ns = NetNs::new(tag);
        let veth = random_veth();
        common::run_ok(
            "ip",
            &[
                "-n",
                &self.node.name,
                "link",
                "add",
                &veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &ns.name,
            ],
        );
        if ip.contains(':') {
            ns.sh_ok(&format!(
                "ip -6 addr add {ip}/64 dev eth0 nodad && ip link set eth0 up && \
                 ip -6 route add default via {GATEWAY6}"
            ));
        } else {
            ns.sh_ok(&format!(
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 && \
                 sysctl -qw net.ipv6.conf.default.disable_ipv6=1 && \
                 ip addr add {ip}/24 dev eth0 && ip link set eth0 up && \
                 ip route add default via {GATEWAY}"
            ));
        }
        self.node.sh_ok(&format!(
            "ip link set {veth} master cni0 && ip link set {veth} up"
        ));
        Pod {
            ns,
            veth,
            ip: ip.to_string(),
        }
    }
}

/// Processes started inside namespaces, killed when dropped (before the namespaces go).
#[derive(Default)]
struct Procs(Vec<Child>);

impl Procs {
    /// A TCP server accepting (and closing) connections on every port.
    fn listen(&mut self, ns: &NetNs, ports: &[u16]) {
        let script = format!(
            "import socket, selectors\n\
             sel = selectors.DefaultSelector()\n\
             for p in {ports:?}:\n\
             \x20   try:\n\
             \x20       s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             \x20       s.bind(('::', p))\n\
             \x20   except OSError:\n\
             \x20       s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             \x20       s.bind(('0.0.0.0', p))\n\
             \x20   s.listen(64); sel.register(s, selectors.EVENT_READ)\n\
             while True:\n\
             \x20   for key, _ in sel.select():\n\
             \x20       c, _ = key.fileobj.accept(); c.close()\n"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        self.0.push(child);
        for &p in ports {
            common::await_listener(&format!("/run/netns/{}", ns.name), p, &ns.name);
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One TCP connect from `ns` (optionally from source address `src`), 1.5 s at most.
fn connects(ns: &str, dst: &str, port: u16, src: Option<&str>) -> bool {
    let dst = std::net::SocketAddr::new(dst.parse().unwrap(), port);
    let src = src.map(|s| s.parse().unwrap());
    common::connect_in(
        &format!("/run/netns/{ns}"),
        dst,
        src,
        Duration::from_millis(1500),
    )
    .is_ok()
}

/// A connection to try and whether policy allows it.
struct Probe {
    path: &'static str,
    what: &'static str,
    from: String,
    dst: String,
    port: u16,
    src: Option<&'static str>,
    allowed: bool,
}

/// Runs every probe (concurrently); an allowed one that fails is tried once more. Returns
/// the table of mismatches.
fn check(probes: &[Probe], all_allowed: bool) -> Vec<String> {
    let results: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| s.spawn(move || connects(&p.from, &p.dst, p.port, p.src)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut wrong = Vec::new();
    for (p, mut got) in probes.iter().zip(results) {
        let want = all_allowed || p.allowed;
        if want && !got {
            got = connects(&p.from, &p.dst, p.port, p.src);
        }
        if got != want {
            wrong.push(format!(
                "({}) {} -> {}:{}: expected {}, got {}",
                p.path,
                p.what,
                p.dst,
                p.port,
                if want { "allowed" } else { "blocked" },
                if got { "allowed" } else { "blocked" }
            ));
        }
    }
    wrong
}

/// The demo namespace, a pod on the other node and `pods` (name, app label, address) on
/// this one, as `cluster.yaml`: the test rewrites it to add a pod while the agent runs.
fn write_cluster(dir: &Path, pods: &[(&str, &str, &str)]) {
    let mut m = Manifest::new();
    m.object(&cluster::namespace("demo")).object(&cluster::pod(
        "demo",
        "remote",
        &[("app", "remote")],
        "node-2",
        &["10.244.1.1"],
    ));
    for (name, app, ip) in pods {
        m.object(&cluster::pod(
            "demo",
            name,
            &[("app", app)],
            "node-1",
            &[ip],
        ));
    }
    m.write(dir, "cluster.yaml");
}

const POLICIES: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-ingress, namespace: demo}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 8080}]
  - from: [{ipBlock: {cidr: 10.244.1.0/24}}]
    ports: [{port: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: locked-egress, namespace: demo}
spec:
  podSelector: {matchLabels: {app: locked}}
  policyTypes: [Egress]
";

fn start_agent(ns: &NetNs, dir: &Path, backend: &str, log: &Path) -> Agent {
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", dir.display()))
        .args(["--iptables-backend", backend])
        .env("FELIX_BRIDGEINTERFACE", "cni0")
        .env("FELIX_INTERFACENAMESCHEME", "bridge")
        .env("FELIX_INTERFACEPREFIX", "veth")
        .env("FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS", "0.2")
        .env("FELIX_LOGSEVERITYSCREEN", "Debug");
    Agent::spawn(cmd, log)
}

fn save(ns: &NetNs, backend: &str, counters: bool) -> String {
    let tool = format!("iptables-{backend}-save");
    let mut args = vec![tool.as_str(), "-t", "filter"];
    if counters {
        args.push("-c");
    }
    ns.exec_ok(&args)
}

/// Packets counted by the rule of `chain` containing `needle`, from `iptables-save -c`.
/// Sub-chains of a dispatch tree (`<chain>-<c>`, made when pod interfaces share leading
/// characters, which random names sometimes do) count as `chain`.
fn packets(saved: &str, chain: &str, needle: &str) -> u64 {
    let line = saved
        .lines()
        .find(|l| {
            (l.contains(&format!("-A {chain} ")) || l.contains(&format!("-A {chain}-")))
                && l.contains(needle)
        })
        .unwrap_or_else(|| panic!("no rule {needle:?} in {chain}:\n{saved}"));
    line.trim_start_matches('[')
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn every_path_is_enforced(backend: &str) {
    let tag = &backend[..3];
    let cluster = Cluster::new(&format!("br{tag}"));
    let client = cluster.add_pod(&format!("br{tag}-client"), "10.244.0.2");
    let server = cluster.add_pod(&format!("br{tag}-server"), "10.244.0.3");
    let locked = cluster.add_pod(&format!("br{tag}-locked"), "10.244.0.4");
    let node = &cluster.node;
    // kube-proxy's ClusterIP DNATs, in PREROUTING (br_netfilter runs it for bridged frames).
    let nat = format!("iptables-{backend}");
    for (vip, to) in [
        ("10.96.0.10", "10.244.0.3:8080"),
        ("10.96.0.11", "10.244.0.3:9090"),
        ("10.96.0.12", "10.244.0.2:8080"),
    ] {
        node.exec_ok(&[
            &nat,
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            &format!("{vip}/32"),
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            to,
        ]);
    }
    let mut procs = Procs::default();
    procs.listen(&client.ns, &[8080]);
    procs.listen(&server.ns, &[8080, 9090]);
    procs.listen(&cluster.remote, &[8080]);
    procs.listen(node, &[8080]);

    let p = |path, what, from: &NetNs, dst: &str, port, src, allowed| Probe {
        path,
        what,
        from: from.name.clone(),
        dst: dst.to_string(),
        port,
        src,
        allowed,
    };
    let probes = vec![
        p(
            "a",
            "client -> server (allowed from client)",
            &client.ns,
            "10.244.0.3",
            8080,
            None,
            true,
        ),
        p(
            "a",
            "client -> server, port not allowed",
            &client.ns,
            "10.244.0.3",
            9090,
            None,
            false,
        ),
        p(
            "a",
            "locked -> server (egress denied, not a client)",
            &locked.ns,
            "10.244.0.3",
            8080,
            None,
            false,
        ),
        p(
            "a",
            "server -> client (not isolated)",
            &server.ns,
            "10.244.0.2",
            8080,
            None,
            true,
        ),
        p(
            "a",
            "locked -> client (egress denied)",
            &locked.ns,
            "10.244.0.2",
            8080,
            None,
            false,
        ),
        p(
            "b",
            "client -> other node's pod",
            &client.ns,
            REMOTE_POD,
            8080,
            None,
            true,
        ),
        p(
            "b",
            "locked -> other node's pod (egress denied)",
            &locked.ns,
            REMOTE_POD,
            8080,
            None,
            false,
        ),
        p(
            "c",
            "other node's pod -> server (ipBlock 10.244.1.0/24)",
            &cluster.remote,
            "10.244.0.3",
            8080,
            Some(REMOTE_POD),
            true,
        ),
        p(
            "c",
            "other node's host -> server (not allowed)",
            &cluster.remote,
            "10.244.0.3",
            8080,
            Some(REMOTE_NODE),
            false,
        ),
        p(
            "c",
            "other node's pod -> server, port not allowed",
            &cluster.remote,
            "10.244.0.3",
            9090,
            Some(REMOTE_POD),
            false,
        ),
        p(
            "c",
            "other node's host -> client (not isolated)",
            &cluster.remote,
            "10.244.0.2",
            8080,
            Some(REMOTE_NODE),
            true,
        ),
        p(
            "c",
            "other node's host -> locked (ingress not isolated)",
            &cluster.remote,
            "10.244.0.4",
            22,
            Some(REMOTE_NODE),
            true,
        ),
        p(
            "d",
            "client -> ClusterIP -> server:8080",
            &client.ns,
            "10.96.0.10",
            80,
            None,
            true,
        ),
        p(
            "d",
            "client -> ClusterIP -> server:9090 (port not allowed)",
            &client.ns,
            "10.96.0.11",
            80,
            None,
            false,
        ),
        p(
            "d",
            "locked -> ClusterIP -> server (egress denied)",
            &locked.ns,
            "10.96.0.10",
            80,
            None,
            false,
        ),
        p(
            "d",
            "server -> ClusterIP -> client",
            &server.ns,
            "10.96.0.12",
            80,
            None,
            true,
        ),
        p(
            "host",
            "client -> its host",
            &client.ns,
            GATEWAY,
            8080,
            None,
            true,
        ),
        p(
            "host",
            "locked -> its host (egress denied)",
            &locked.ns,
            GATEWAY,
            8080,
            None,
            false,
        ),
    ];
    // "locked" has no listener: its probe from the other node only checks that nothing
    // drops it on the way (a refused connection is an answer), so give it one.
    procs.listen(&locked.ns, &[22]);

    // Before the agent: everything connects.
    let wrong = check(&probes, true);
    assert!(wrong.is_empty(), "before the agent:\n{}", wrong.join("\n"));

    let dir = TempDir::new("bridge-ds");
    let data = dir.path.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_cluster(
        &data,
        &[
            ("client", "client", "10.244.0.2"),
            ("server", "server", "10.244.0.3"),
            ("locked", "locked", "10.244.0.4"),
        ],
    );
    write_atomic(&data, "policies.yaml", POLICIES);
    let log = dir.path.join("agent.log");
    let agent = start_agent(node, &data, backend, &log);
    let limit = common::scaled(Duration::from_secs(20));
    let pods = [&client, &server, &locked];
    agent.wait_for(limit, "the policies on every pod's bridge port", || {
        let s = save(node, backend, false);
        pods.iter().all(|p| {
            s.contains(&format!("-d {}/32 ", p.ip))
                && s.contains(&format!(
                    "--physdev-out {} --physdev-is-bridged -g cali-tw-{}",
                    p.veth, p.veth
                ))
        }) && s.matches("Start of policies").count() == 2
    });

    let wrong = check(&probes, false);
    assert!(
        wrong.is_empty(),
        "with the policies:\n{}\nrules:\n{}",
        wrong.join("\n"),
        save(node, backend, true)
    );

    // Path (d) is bridged after the DNAT: the backend's ingress is dispatched by its bridge
    // port, not by address. Counted as differences of two saves, not after `-Z`: iptables-nft
    // 1.8.7 (Debian 11) leaves rule counters as they were on `-Z`.
    let counts = |saved: &str| {
        (
            packets(
                saved,
                "cali-to-wl-dispatch",
                &format!("--physdev-out {} ", server.veth),
            ),
            packets(saved, "cali-to-wl-addr-dispatch", "-d 10.244.0.3/32 "),
        )
    };
    let before = counts(&save(node, backend, true));
    assert!(connects(&client.ns.name, "10.96.0.10", 80, None));
    let after = counts(&save(node, backend, true));
    let delta = |a: u64, b: u64| {
        a.checked_sub(b)
            .expect("a counter went back: rule rewritten")
    };
    let (by_port, by_addr) = (delta(after.0, before.0), delta(after.1, before.1));
    assert!(
        by_port > 0 && by_addr == 0,
        "bridged {by_port}, routed {by_addr}"
    );

    // A pod that appears while the agent runs meets its policy from its first packet: its
    // port is unknown (dropped) until learned, then its egress-deny applies.
    let late = cluster.add_pod(&format!("br{tag}-late"), "10.244.0.5");
    write_cluster(
        &data,
        &[
            ("client", "client", "10.244.0.2"),
            ("server", "server", "10.244.0.3"),
            ("locked", "locked", "10.244.0.4"),
            ("late", "locked", "10.244.0.5"),
        ],
    );
    let started = Instant::now();
    let mut learned = None;
    while started.elapsed() < common::scaled(Duration::from_secs(4)) {
        assert!(
            !connects(&late.ns.name, "10.244.0.2", 8080, None),
            "the new pod got through {:?} after it was added",
            started.elapsed()
        );
        if learned.is_none()
            && save(node, backend, false).contains(&format!(":cali-fw-{} ", late.veth))
        {
            learned = Some(started.elapsed());
        }
    }
    let learned = learned.unwrap_or_else(|| {
        panic!(
            "the new pod's port was not learned; agent log:\n{}",
            agent.log()
        )
    });
    eprintln!("new pod's port programmed after {learned:?}");
    // Its veth goes: the port, its chains and its address entry go too.
    node.exec_ok(&["ip", "link", "del", &late.veth]);
    agent.wait_for(limit, "the deleted port's chains to go", || {
        let s = save(node, backend, false);
        !s.contains(&late.veth) && !s.contains("-d 10.244.0.5/32")
    });

    // Policies removed: everything connects again.
    std::fs::remove_file(data.join("policies.yaml")).unwrap();
    agent.wait_for(limit, "the policies to be removed", || {
        !save(node, backend, false).contains("Start of policies")
    });
    let wrong = check(&probes, true);
    assert!(
        wrong.is_empty(),
        "after the policies:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn bridge_mode_enforces_every_path_legacy() {
    every_path_is_enforced("legacy");
}

#[test]
fn bridge_mode_enforces_every_path_nft() {
    every_path_is_enforced("nft");
}

/// IPv6 on the bridge: pods resolve each other with neighbour discovery, which (bridged)
/// crosses ip6tables FORWARD; policy still applies to their traffic and ND is not cut off.
#[test]
fn bridge_mode_enforces_bridged_ipv6() {
    let cluster = Cluster::new("br6");
    let client = cluster.add_pod("br6-client", "fd00:244::2");
    let server = cluster.add_pod("br6-server", "fd00:244::3");
    let locked = cluster.add_pod("br6-locked", "fd00:244::4");
    let node = &cluster.node;
    let mut procs = Procs::default();
    procs.listen(&client.ns, &[8080]);
    procs.listen(&server.ns, &[8080, 9090]);
    let p = |what, from: &NetNs, dst: &str, port, allowed| Probe {
        path: "a",
        what,
        from: from.name.clone(),
        dst: dst.to_string(),
        port,
        src: None,
        allowed,
    };
    let probes = vec![
        p("client -> server", &client.ns, "fd00:244::3", 8080, true),
        p(
            "client -> server, port not allowed",
            &client.ns,
            "fd00:244::3",
            9090,
            false,
        ),
        p("locked -> server", &locked.ns, "fd00:244::3", 8080, false),
        p("server -> client", &server.ns, "fd00:244::2", 8080, true),
        p(
            "locked -> client (egress denied)",
            &locked.ns,
            "fd00:244::2",
            8080,
            false,
        ),
    ];
    let wrong = check(&probes, true);
    assert!(wrong.is_empty(), "before the agent:\n{}", wrong.join("\n"));

    let dir = TempDir::new("bridge6-ds");
    let data = dir.path.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_cluster(
        &data,
        &[
            ("client", "client", "fd00:244::2"),
            ("server", "server", "fd00:244::3"),
            ("locked", "locked", "fd00:244::4"),
        ],
    );
    write_atomic(&data, "policies.yaml", POLICIES);
    let log = dir.path.join("agent.log");
    let agent = start_agent(node, &data, "legacy", &log);
    let limit = common::scaled(Duration::from_secs(20));
    agent.wait_for(limit, "the IPv6 rules on every pod's port", || {
        let s = node.exec_ok(&["ip6tables-legacy-save", "-t", "filter"]);
        [&client, &server, &locked].iter().all(|p| {
            s.contains(&format!("-d {}/128 ", p.ip))
                && s.contains(&format!("--physdev-in {} -g cali-fw-{}", p.veth, p.veth))
        }) && s.matches("Start of policies").count() == 2
    });
    // Forget every neighbour, so each connection first resolves through the policed bridge.
    for pod in [&client, &server, &locked] {
        pod.ns
            .exec_ok(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
    }
    let wrong = check(&probes, false);
    assert!(
        wrong.is_empty(),
        "with the policies:\n{}\nrules:\n{}",
        wrong.join("\n"),
        node.exec_ok(&["ip6tables-legacy-save", "-c", "-t", "filter"])
    );
}

fn pod_info(name: &str, ip: &str) -> PodInfo {
    PodInfo {
        key: ObjectKey::new("demo", name),
        uid: None,
        node: Some("node-1".into()),
        labels: BTreeMap::new(),
        ips: vec![ip.parse::<IpAddr>().unwrap()],
        named_ports: Vec::new(),
        sandbox_id: None,
    }
}

/// The resolver thread runs in the node namespace: its netlink sockets are opened by a
/// thread that entered the namespace.
fn resolver_in(ns: &NetNs, changes: Arc<AtomicUsize>, stop: Arc<AtomicBool>) -> BridgeResolver {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let resolver = BridgeResolver::new("cni0", "veth").unwrap();
        resolver
            .start(
                Box::new(move || {
                    changes.fetch_add(1, Ordering::SeqCst);
                }),
                stop,
            )
            .unwrap();
        resolver
    })
    .join()
    .unwrap()
}

fn resolve_within(
    r: &BridgeResolver,
    pod: &PodInfo,
    limit: Duration,
) -> Option<(String, Duration)> {
    let start = Instant::now();
    while start.elapsed() < common::scaled(limit) {
        if let Ok(port) = r.resolve(pod) {
            return Some((port, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn resolver_learns_a_silent_pods_port_when_sighted_and_follows_its_removal() {
    let cluster = Cluster::new("brres");
    // A pod that is there before the resolver starts and has never sent anything.
    let first = cluster.add_pod("brres-first", "10.244.0.7");
    let changes = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let resolver = resolver_in(&cluster.node, changes.clone(), stop.clone());
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _stop = StopOnDrop(stop);

    let first_info = pod_info("first", &first.ip);
    assert!(
        resolver.resolve(&first_info).is_err(),
        "nothing is known before the pod is sighted"
    );
    let (port, took) = resolve_within(&resolver, &first_info, Duration::from_secs(5))
        .expect("the sighted pod's port was not learned");
    assert_eq!(port, first.veth);
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(changes.load(Ordering::SeqCst) >= 1);

    // A pod sighted before its veth exists (the datastore can be ahead of the CNI): the
    // resolver keeps asking until it answers.
    let early = pod_info("early", "10.244.0.8");
    assert!(resolver.resolve(&early).is_err());
    std::thread::sleep(Duration::from_millis(300));
    let second = cluster.add_pod("brres-second", "10.244.0.8");
    let (port, _) = resolve_within(&resolver, &early, Duration::from_secs(10))
        .expect("the pod that came after its sighting was not learned");
    assert_eq!(port, second.veth);

    // Deleting the veth (the pod is gone) forgets the port and tells the agent.
    let before = changes.load(Ordering::SeqCst);
    cluster.node.exec_ok(&["ip", "link", "del", &first.veth]);
    let start = Instant::now();
    while resolver.resolve(&first_info).is_ok() {
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(5)),
            "the deleted port is still resolved"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(changes.load(Ordering::SeqCst) > before);
    // The other pod is unaffected, and the neighbour entry ageing out changes nothing.
    cluster
        .node
        .exec_ok(&["ip", "neigh", "flush", "dev", "cni0"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(resolver.resolve(&early).unwrap(), second.veth);
}
