//! One node with pods, for tests and benchmarks that need real pod traffic through the
//! agent's rules: a node namespace running `netpol-agent run --datastore dir:…`, and a
//! namespace per pod joined to it by a veth the Calico way (`/32` and `/128` host routes,
//! proxy ARP, `169.254.1.1` and `fe80::1` as the pods' gateways), dual-stack. Interfaces are
//! named by a static map (`FELIX_INTERFACENAMESCHEME=static`); a pod left out of the map has
//! no interface name, so no chains (its traffic meets "Unknown interface").
//!
//! Everything comes from `common` (`NetNs`, `TempDir`): namespaces are `npa-test-<pid>-…`,
//! deleted on drop, panics included; the agent is killed on drop.
//!
//! A *fresh* node ([`PodNode::fresh`]) has its pods in the datastore, Pending and without
//! addresses, and not yet wired, as a node the agent starts on before kubelet and the CNI have
//! set up any pod; its `Node` (with `spec.podCIDRs` 10.77.0.0/24 and fd77::/64) is in the
//! datastore too. As on a real node, a pod is wired first ([`PodNode::wire`]) and its
//! addresses reach the datastore only afterwards, when kubelet reports them
//! ([`PodNode::report`]). [`PodNode::wire`] wires routed as above or as a port of a Linux bridge `cni0` (made at the first
//! pod, as the bridge plugin does: 10.77.0.1/24 and fd77::1/64 on it, `br_netfilter` passing
//! bridged frames to iptables), and [`PodNode::client`] is a host outside the node that
//! routes to the pods through it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netpol_agent::dataplane::owned::OwnedState;
use netpol_agent::model::IpFamily;

use crate::common::cluster::{self, Manifest};
use crate::common::{NetNs, TempDir};

pub const NODE: &str = "node-1";
const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

pub struct PodSpec {
    pub namespace: &'static str,
    pub name: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
    /// The last octet / hextet of its addresses: 10.77.0.<n> and fd77::<n>.
    pub n: u8,
    /// Its host veth; `None` leaves it out of the interface map (not programmed).
    pub iface: Option<&'static str>,
}

pub struct Pod {
    pub spec: PodSpec,
    pub ns: NetNs,
    pub v4: std::net::Ipv4Addr,
    pub v6: std::net::Ipv6Addr,
}

/// How a fresh node wires its pods (see [`PodNode::fresh`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Calico-style routed veths: a host route per pod address, proxy ARP.
    Routed,
    /// Ports of the bridge `cni0`, flannel- and bridge-plugin-style.
    Bridge,
}

pub struct PodNode {
    pub node: NetNs,
    pub pods: BTreeMap<String, Pod>,
    pub dir: TempDir,
    pub logs: TempDir,
    pub agent: Option<Child>,
    env: Vec<(String, String)>,
    backend: &'static str,
    /// A fresh node's wiring; `None` for a node whose pods were wired at once.
    topology: Option<Topology>,
    client: Option<NetNs>,
    /// The pods whose addresses the datastore holds (every pod unless fresh).
    reported: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Wires a pod the Calico way: its veth, `/32` and `/128` host routes, proxy ARP, the
/// link-local gateways.
fn wire_routed(node: &NetNs, pod: &NetNs, spec: &PodSpec) {
    let (a4, a6) = (v4(spec.n), v6(spec.n));
    let host = spec
        .iface
        .map(str::to_string)
        .unwrap_or_else(|| format!("calix{}", spec.n));
    node.sh_ok(&format!(
        "ip link add {host} type veth peer name eth0 netns {pod} && \
         ip link set {host} up && \
         ip addr add fe80::1/64 dev {host} nodad && \
         ip route add {a4}/32 dev {host} && ip -6 route add {a6}/128 dev {host} && \
         sysctl -qw net.ipv4.conf.{host}.proxy_arp=1 net.ipv4.neigh.{host}.proxy_delay=0",
        pod = pod.name
    ));
    pod.sh_ok(&format!(
        "ip addr add {a4}/32 dev eth0 && ip -6 addr add {a6}/128 dev eth0 nodad && \
         ip link set eth0 up && \
         ip route add 169.254.1.1 dev eth0 scope link && \
         ip route add default via 169.254.1.1 dev eth0 && \
         ip -6 route add default via fe80::1 dev eth0"
    ));
}

pub fn v4(n: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 77, 0, n)
}

pub fn v6(n: u8) -> std::net::Ipv6Addr {
    format!("fd77::{n:x}").parse().unwrap()
}

impl PodNode {
    /// The node, its pods and their manifests (no policies yet, no agent yet).
    pub fn new(tag: &str, backend: &'static str, specs: Vec<PodSpec>) -> PodNode {
        PodNode::build(tag, backend, specs, false)
    }

    /// A node whose pods are in the datastore, Pending without addresses, and not wired yet:
    /// no veth, no route, no bridge. [`PodNode::wire`] wires them, [`PodNode::report`] puts
    /// their addresses in the datastore.
    pub fn fresh(
        tag: &str,
        backend: &'static str,
        topology: Topology,
        specs: Vec<PodSpec>,
    ) -> PodNode {
        let mut node = PodNode::build(tag, backend, specs, true);
        node.topology = Some(topology);
        node
    }

    fn build(tag: &str, backend: &'static str, specs: Vec<PodSpec>, fresh: bool) -> PodNode {
        let node = NetNs::new(&format!("{tag}-node"));
        node.sh_ok(
            "sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
             net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 && \
             ip link add dummy0 type bridge && ip link set dummy0 up && \
             ip route add default dev dummy0",
        );
        // Proxy ARP answers for the pods' gateway (169.254.1.1) only when the node routes
        // it elsewhere, as a real node's default route does: a port-less bridge stands in.
        let dir = TempDir::new("podnode");
        let logs = TempDir::new("podnode-logs");
        let mut map = String::new();
        let mut pods = BTreeMap::new();
        for spec in specs {
            let ns = NetNs::new(&format!("{tag}-{}", spec.name));
            let (a4, a6) = (v4(spec.n), v6(spec.n));
            if !fresh {
                wire_routed(&node, &ns, &spec);
            }
            if let Some(iface) = spec.iface {
                let _ = writeln!(map, "\"{}/{}\": {iface}", spec.namespace, spec.name);
            }
            pods.insert(
                format!("{}/{}", spec.namespace, spec.name),
                Pod {
                    spec,
                    ns,
                    v4: a4,
                    v6: a6,
                },
            );
        }
        std::fs::write(logs.path.join("interfaces.yaml"), map).unwrap();
        let reported = if fresh {
            // The Node as the API server holds it: its pod ranges, allocated by the
            // controller-manager before any pod.
            let mut n = Manifest::new();
            n.yaml(&format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\n\
                 spec: {{podCIDR: 10.77.0.0/24, podCIDRs: [10.77.0.0/24, \"fd77::/64\"]}}\n"
            ));
            n.write(&dir.path, "node.yaml");
            Default::default()
        } else {
            pods.keys().cloned().collect()
        };
        let node = PodNode {
            node,
            pods,
            dir,
            logs,
            agent: None,
            env: Vec::new(),
            backend,
            topology: None,
            client: None,
            reported: std::sync::Mutex::new(reported),
        };
        node.write_pods();
        node
    }

    /// Writes the namespaces and pods: those kubelet has reported with their addresses,
    /// Running; the others Pending without any.
    fn write_pods(&self) {
        let mut manifests = Manifest::new();
        let mut namespaces: Vec<&str> = self.pods.values().map(|p| p.spec.namespace).collect();
        namespaces.sort();
        namespaces.dedup();
        for ns in namespaces {
            manifests.object(&cluster::namespace(ns));
        }
        let reported = self.reported.lock().unwrap();
        for (key, p) in &self.pods {
            let ips = [p.v4.to_string(), p.v6.to_string()];
            let ips: Vec<&str> = if reported.contains(key) {
                ips.iter().map(String::as_str).collect()
            } else {
                Vec::new()
            };
            let mut pod = cluster::pod(p.spec.namespace, p.spec.name, p.spec.labels, NODE, &ips);
            if ips.is_empty() {
                pod.status.as_mut().expect("a status").phase = Some("Pending".into());
            }
            manifests.object(&pod);
        }
        manifests.write(&self.dir.path, "pods.yaml");
    }

    /// Kubelet reports pod `key`'s addresses (after its sandbox is wired): they reach the
    /// datastore now.
    pub fn report(&self, key: &str) {
        assert!(self.pods.contains_key(key), "no pod {key}");
        self.reported.lock().unwrap().insert(key.to_string());
        self.write_pods();
    }

    /// Wires pod `key` of a fresh node the way its topology says (the bridge is made at the
    /// first pod).
    pub fn wire(&self, key: &str) {
        let pod = &self.pods[key];
        match self.topology.expect("a fresh node") {
            Topology::Routed => wire_routed(&self.node, &pod.ns, &pod.spec),
            Topology::Bridge => {
                self.node.sh_ok(
                    "ip link show cni0 >/dev/null 2>&1 || { \
                     ip link add cni0 type bridge && \
                     ip addr add 10.77.0.1/24 dev cni0 && ip -6 addr add fd77::1/64 dev cni0 nodad && \
                     ip link set cni0 up && \
                     echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables && \
                     echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables; }",
                );
                let host = pod
                    .spec
                    .iface
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("veth{:08x}", pod.spec.n));
                self.node.sh_ok(&format!(
                    "ip link add {host} type veth peer name eth0 netns {ns} && \
                     ip link set {host} master cni0 && ip link set {host} up",
                    ns = pod.ns.name
                ));
                pod.ns.sh_ok(&format!(
                    "ip addr add {a4}/24 dev eth0 && ip -6 addr add {a6}/64 dev eth0 nodad && \
                     ip link set eth0 up && ip route add default via 10.77.0.1 dev eth0 && \
                     ip -6 route add default via fd77::1 dev eth0",
                    a4 = pod.v4,
                    a6 = pod.v6
                ));
            }
        }
    }

    /// A host outside the node (`192.168.77.2`, `fd78::2`) whose traffic to the pods goes
    /// through the node (made at the first call).
    pub fn client(&mut self) -> &NetNs {
        if self.client.is_none() {
            let client = NetNs::new("client");
            self.node.sh_ok(&format!(
                "ip link add ext0 type veth peer name eth0 netns {c} && ip link set ext0 up && \
                 ip addr add 192.168.77.1/30 dev ext0 && ip -6 addr add fd78::1/64 dev ext0 nodad",
                c = client.name
            ));
            client.sh_ok(
                "ip link set lo up && ip link set eth0 up && ip addr add 192.168.77.2/30 dev eth0 && \
                 ip -6 addr add fd78::2/64 dev eth0 nodad && \
                 ip route add default via 192.168.77.1 && ip -6 route add default via fd78::1",
            );
            self.client = Some(client);
        }
        self.client.as_ref().expect("made above")
    }

    pub fn pod(&self, key: &str) -> &Pod {
        &self.pods[key]
    }

    pub fn write_policies(&self, yaml: &str) {
        cluster::write_atomic(&self.dir.path, "policies.yaml", yaml);
    }

    pub fn log_path(&self) -> PathBuf {
        self.logs.path.join("agent.log")
    }

    /// Polls `f` every 100 ms until it gives a value, or panics with `what` and the agent's
    /// log once `limit` (scaled for emulation) has passed.
    pub fn wait_for<T>(&self, limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                start.elapsed() < crate::common::scaled(limit),
                "{what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The variables both `run` and `compile` get (plus the caller's).
    fn vars(&self) -> Vec<(String, String)> {
        let mut v = vec![
            (
                "FELIX_INTERFACENAMESCHEME".to_string(),
                "static".to_string(),
            ),
            (
                "FELIX_INTERFACEMAPFILE".to_string(),
                self.logs.path.join("interfaces.yaml").display().to_string(),
            ),
            (
                "FELIX_IPTABLESBACKEND".to_string(),
                self.backend.to_string(),
            ),
        ];
        v.extend(self.env.iter().cloned());
        v
    }

    /// Starts the agent with these extra variables.
    pub fn start_agent(&mut self, env: &[(&str, &str)]) {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let log = std::fs::File::create(self.log_path()).unwrap();
        let mut cmd = crate::common::agent_in(&self.node.name);
        cmd.args(["run", "--node", NODE])
            .arg("--datastore")
            .arg(format!("dir:{}", self.dir.path.display()))
            .envs(self.vars())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.agent = Some(cmd.spawn().expect("start agent"));
    }

    pub fn agent_pid(&self) -> u32 {
        self.agent.as_ref().expect("agent started").id()
    }

    fn expected(&self, ipv6: bool) -> OwnedState {
        let out = TempDir::new("podnode-want");
        let mut cmd = Command::new(BIN);
        for (k, _) in std::env::vars() {
            if k.starts_with("FELIX_") || k == "NODENAME" {
                cmd.env_remove(k);
            }
        }
        cmd.args(["compile", "--node", NODE, "--manifests"])
            .arg(&self.dir.path)
            .arg("--ipsets-out")
            .arg(out.path.join("s"))
            .arg("--iptables-out")
            .arg(out.path.join("t"))
            .envs(self.vars());
        if ipv6 {
            cmd.arg("--ipv6");
        }
        let status = cmd.stderr(Stdio::null()).status().unwrap();
        assert!(status.success(), "compile failed");
        let family = if ipv6 { IpFamily::V6 } else { IpFamily::V4 };
        let mut t = OwnedState::default();
        t.add_iptables(
            &std::fs::read_to_string(out.path.join("t")).unwrap(),
            &netpol_agent::agent::OWNERSHIP,
        );
        t.add_ipsets(
            &std::fs::read_to_string(out.path.join("s")).unwrap(),
            family,
        );
        t
    }

    fn observed(&self, ipv6: bool) -> OwnedState {
        let tool = format!(
            "{}-{}-save",
            if ipv6 { "ip6tables" } else { "iptables" },
            self.backend
        );
        let family = if ipv6 { IpFamily::V6 } else { IpFamily::V4 };
        let mut t = OwnedState::default();
        t.add_iptables(
            &self.node.exec_ok(&[&tool, "-t", "filter"]),
            &netpol_agent::agent::OWNERSHIP,
        );
        t.add_ipsets(&self.node.exec_ok(&["ipset", "save"]), family);
        t
    }

    /// Waits until the node holds exactly what `compile` renders (both families). `limit` is
    /// for a real machine; under emulation it is stretched by `NETPOL_TEST_TIME_SCALE`
    /// (`scripts/kernel-matrix.sh` sets it in its VMs, where an agent alone takes 15-20 s to
    /// start): how long the agent may take, never what it must reach.
    pub fn wait_converged(&mut self, limit: Duration) -> Duration {
        let limit = crate::common::scaled(limit);
        let start = Instant::now();
        let want = [self.expected(false), self.expected(true)];
        loop {
            if let Some(status) = self
                .agent
                .as_mut()
                .and_then(|a| a.try_wait().ok().flatten())
            {
                panic!("the agent exited ({status}):\n{}", self.log());
            }
            if [self.observed(false), self.observed(true)] == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "not converged within {limit:?}; agent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl PodNode {
    /// The node's rules with counters, its NFLOG groups and routes: for failure messages.
    pub fn diagnose(&self) -> String {
        let save = format!("iptables-{}-save", self.backend);
        let save6 = format!("ip6tables-{}-save", self.backend);
        self.node.sh_ok(&format!(
            "{save} -c -t filter; {save6} -c -t filter | grep -v '^#'; \
             echo '-- nfnetlink_log:'; cat /proc/net/netfilter/nfnetlink_log; \
             echo '-- routes:'; ip route; ip -6 route; ip neigh"
        ))
    }
}

impl Drop for PodNode {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.kill();
            let _ = agent.wait();
        }
    }
}

/// The JSON deny lines in an agent log.
pub fn deny_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "deny_log")
        .collect()
}

pub fn dir_of(p: &Path) -> String {
    p.display().to_string()
}

/// A TCP SYN header (checksummed for `src` → `dst`) for raw sockets.
pub fn tcp_syn(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = 0x02; // SYN
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut sum: u32 = 0;
    for chunk in src.octets().chunks(2).chain(dst.octets().chunks(2)) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    sum += 6 + 20;
    for chunk in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}

/// Sends `pps` SYNs per second for `duration` from pod `from` to `to:port`, each from a new
/// source port (each its own flow); returns how many were sent.
pub fn syn_flood(
    node: &PodNode,
    from: &str,
    to: std::net::Ipv4Addr,
    port: u16,
    pps: u64,
    duration: Duration,
) -> u64 {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let pod = node.pod(from);
    let src = pod.v4;
    let socket = crate::common::in_netns(&pod.ns.name, || {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)).unwrap();
        s.bind(&SockAddr::from(std::net::SocketAddr::new(src.into(), 0)))
            .unwrap();
        s
    });
    let target = SockAddr::from(std::net::SocketAddr::new(to.into(), 0));
    let start = Instant::now();
    let total = (pps as f64 * duration.as_secs_f64()) as u64;
    let mut sent = 0u64;
    while sent < total {
        let due = ((start.elapsed().as_secs_f64() * pps as f64) as u64).min(total);
        while sent < due {
            let sport = 1024 + (sent % 64000) as u16;
            let syn = tcp_syn(src, to, sport, port, sent as u32);
            if socket.send_to(&syn, &target).is_ok() {
                sent += 1;
            } else {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}
