//! What enforcing and logging cost a new connection (issue 22): the rate of TCP
//! connect/accept/close between real pods, on the same node and across two nodes, under
//! configurations measured in the same run and interleaved round by round, so a noisy machine
//! slows them alike and the ratios hold:
//!
//! - `none`: no agent (the nodes' kernels have no rules at all, so no conntrack either);
//! - `agent`: the agent on both nodes, no NetworkPolicy;
//! - `policies`: the agent with 1000 NetworkPolicies selecting the server pods, the one that
//!   allows the client last in order (999 allow other peers), so each new connection walks
//!   the longest policy list; past `FELIX_POLICYUNIONMIN` (default 16) the agent matches
//!   their allows with one union set first (`rules::union`);
//! - `policies-walk`: the same with the union set off (`FELIX_POLICYUNIONMIN=0`): every new
//!   connection walks the 1000 policy chains, felix's layout;
//! - `flowlogs`: the agent, no NetworkPolicy, flow logs on with the per-pod limit at its
//!   highest (10000/s, burst 10000) so every connection is logged: the worst case;
//! - `stopped`: as `flowlogs`, with both agents stopped (SIGSTOP) for the measurement: nobody
//!   reads the NFLOG socket, so the kernel's copies overrun it; the rate must hold (the copy
//!   never holds the packet) and the loss must be counted (`netpol_flow_log_overruns_total`,
//!   `netpol_flow_log_lost_total`, read after SIGCONT);
//! - `prev-agent`, `prev-flowlogs`: `agent` and `flowlogs` with another build of the agent
//!   (`--previous PATH`), so a change's before and after are measured in the same run.
//!
//! Topology (IPv4, legacy iptables): two node namespaces joined by a veth and routed
//! (10.78.0.0/24 on node-a, 10.78.1.0/24 on node-b), pods wired the Calico way (/32 host
//! routes, proxy ARP, 169.254.1.1 gateway) as `tests/pod_node` does; a client pod and a server
//! pod on node-a, a server pod on node-b. The server accepts and closes; the client connects,
//! reads to the end and closes with a reset (no TIME_WAIT: a sequential client would run out
//! of ports, and the conntrack table fill, long before the rules showed). Fresh namespaces for
//! every configuration of every round, removed on drop (panics included); agents are killed
//! on drop.
//!
//! Prints, per configuration and path, connections per second (median over rounds), the
//! per-round ratios to the reference of the same round (agent vs none, policies and flowlogs
//! vs agent, stopped vs flowlogs), the agents' CPU per 1000 logged connections, and the
//! flow-log counters; asserts nothing about time.
//!
//! `--peer-members N` gives each of the 999 other policies' peer selectors N pods (on a third
//! node, so remote): their sets, and the union set, then hold 999 × N addresses besides the
//! client's, as in a cluster where policies name pods that exist.
//!
//! `cargo bench --bench conn_rate -- [--rounds 3] [--secs 5] [--clients 1] [--policies 1000]
//! [--peer-members 0] [--configs none,agent,policies,policies-walk,flowlogs,stopped,prev-agent,prev-flowlogs]
//! [--previous PATH]` (root).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::cluster::{self, Manifest};

const NETNS_PREFIX: &str = "npa-bench-";
const HEALTH_PORT: u16 = 9099;
const METRICS_PORT: u16 = 9091;
const PORT: u16 = 80;

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("{NETNS_PREFIX}{}-{tag}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = Netns(name);
        ns.sh("ip link set lo up");
        ns
    }

    fn sh(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec");
        assert!(
            out.status.success(),
            "in {}: {script}: {}",
            self.0,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn run(cmd: &str, args: &[&str]) {
    let ok = Command::new(cmd)
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{cmd} {args:?} failed");
}

/// Runs `f` on a thread that entered namespace `ns`; sockets it opens stay there.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(ns);
                f()
            })
            .join()
            .expect("thread in the namespace")
    })
}

fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
}

/// `GET path` on 127.0.0.1:port in `ns`: (status, body).
fn http_get(ns: &str, port: u16, path: &str) -> Option<(u16, String)> {
    in_netns(ns, || {
        use std::io::Write;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    })
}

/// A counter's value in a Prometheus text page (0 when absent).
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU ticks (user + system, with waited-for children) of a process.
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11..15).map_or(0, |v| v.iter().sum())
}

fn ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A server pod's acceptor: accepts and closes until stopped (a shutdown of the listening
/// socket wakes the blocked accept).
struct Server {
    listener: Arc<TcpListener>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(ns: &str, ip: Ipv4Addr) -> Server {
        let listener = Arc::new(in_netns(ns, || {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_reuse_address(true).unwrap();
            s.bind(&SocketAddr::new(ip.into(), PORT).into()).unwrap();
            s.listen(4096).unwrap();
            TcpListener::from(s)
        }));
        let l = listener.clone();
        let thread = std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                drop(s);
            }
        });
        Server {
            listener,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Read);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Pod {
    ns: Netns,
    ip: Ipv4Addr,
}

/// The two nodes and three pods of one measurement.
struct Topo {
    a: Netns,
    b: Netns,
    client: Pod,
    server_a: Pod,
    server_b: Pod,
}

fn wire(node: &Netns, pod: &Netns, iface: &str, ip: Ipv4Addr) {
    node.sh(&format!(
        "ip link add {iface} type veth peer name eth0 netns {pod} && ip link set {iface} up && \
         ip route add {ip}/32 dev {iface} && \
         sysctl -qw net.ipv4.conf.{iface}.proxy_arp=1 net.ipv4.neigh.{iface}.proxy_delay=0",
        pod = pod.0
    ));
    pod.sh(&format!(
        "ip addr add {ip}/32 dev eth0 && ip link set eth0 up && \
         ip route add 169.254.1.1 dev eth0 scope link && \
         ip route add default via 169.254.1.1 dev eth0 && \
         sysctl -qw net.ipv4.ip_local_port_range='1024 65000'"
    ));
}

impl Topo {
    fn new(tag: &str) -> Topo {
        let a = Netns::new(&format!("{tag}-a"));
        let b = Netns::new(&format!("{tag}-b"));
        for n in [&a, &b] {
            // A port-less bridge as the default route: proxy ARP answers for the pods'
            // gateway only when the node routes it elsewhere.
            n.sh(
                "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
                  net.ipv4.conf.default.rp_filter=0 && \
                  ip link add dummy0 type bridge && ip link set dummy0 up && \
                  ip route add default dev dummy0",
            );
        }
        a.sh(&format!(
            "ip link add tonode type veth peer name tonode netns {}",
            b.0
        ));
        for (n, peer_net, me, other) in [
            (&a, "10.78.1.0/24", "192.168.77.1", "192.168.77.2"),
            (&b, "10.78.0.0/24", "192.168.77.2", "192.168.77.1"),
        ] {
            n.sh(&format!(
                "ip addr add {me}/30 dev tonode && ip link set tonode up && \
                 ip route add {peer_net} via {other} dev tonode"
            ));
        }
        let pod = |node: &Netns, name: &str, iface: &str, ip: Ipv4Addr| {
            let ns = Netns::new(&format!("{tag}-{name}"));
            wire(node, &ns, iface, ip);
            Pod { ns, ip }
        };
        let client = pod(&a, "client", "calicli", Ipv4Addr::new(10, 78, 0, 11));
        let server_a = pod(&a, "srva", "calisrva", Ipv4Addr::new(10, 78, 0, 10));
        let server_b = pod(&b, "srvb", "calisrvb", Ipv4Addr::new(10, 78, 1, 10));
        Topo {
            a,
            b,
            client,
            server_a,
            server_b,
        }
    }
}

/// The cluster as the agents read it: pods, namespaces, and `policies` NetworkPolicies
/// selecting the servers (the last in name order allows the client).
fn write_cluster(dir: &Path, policies: usize, peer_members: usize) {
    let mut m = Manifest::new();
    m.object(&cluster::namespace("cli"))
        .object(&cluster::namespace("srv"))
        .object(&cluster::pod(
            "cli",
            "client",
            &[("role", "client")],
            "node-a",
            &["10.78.0.11"],
        ))
        .object(&cluster::pod(
            "srv",
            "server-a",
            &[("app", "server")],
            "node-a",
            &["10.78.0.10"],
        ))
        .object(&cluster::pod(
            "srv",
            "server-b",
            &[("app", "server")],
            "node-b",
            &["10.78.1.10"],
        ));
    // The other policies' peers, on a node with no agent (never sent to).
    let mut n = 0u32;
    for i in 0..policies.saturating_sub(1) {
        for j in 0..peer_members {
            n += 1;
            let ip = format!("10.79.{}.{}", n / 250, n % 250 + 1);
            m.object(&cluster::pod(
                "cli",
                &format!("peer-{i:04}-{j}"),
                &[("peer", &format!("p{i:04}"))],
                "node-c",
                &[&ip],
            ));
        }
    }
    m.write(dir, "pods.yaml");
    let mut p = Manifest::new();
    for i in 0..policies.saturating_sub(1) {
        p.yaml(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {{name: p{i:04}, namespace: srv}}\n\
             spec: {{podSelector: {{matchLabels: {{app: server}}}}, policyTypes: [Ingress], \
             ingress: [{{from: [{{namespaceSelector: {{}}, podSelector: {{matchLabels: {{peer: p{i:04}}}}}}}], \
             ports: [{{protocol: TCP, port: {PORT}}}]}}]}}\n"
        ));
    }
    if policies > 0 {
        p.yaml(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {{name: zz-allow-client, namespace: srv}}\n\
             spec: {{podSelector: {{matchLabels: {{app: server}}}}, policyTypes: [Ingress], \
             ingress: [{{from: [{{namespaceSelector: {{}}, podSelector: {{matchLabels: {{role: client}}}}}}], \
             ports: [{{protocol: TCP, port: {PORT}}}]}}]}}\n"
        ));
    }
    p.write(dir, "policies.yaml");
    // The interface maps (FELIX_INTERFACEMAPFILE), not Kubernetes objects.
    std::fs::write(
        dir.join("map-a.yaml"),
        "\"cli/client\": calicli\n\"srv/server-a\": calisrva\n",
    )
    .unwrap();
    std::fs::write(dir.join("map-b.yaml"), "\"srv/server-b\": calisrvb\n").unwrap();
}

/// The agent process (killed and reaped on drop) and the namespace it runs in.
struct Agent {
    process: common::Agent,
    ns: String,
}

impl Agent {
    fn start(
        bin: &Path,
        ns: &Netns,
        node: &str,
        dir: &Path,
        map: &str,
        flowlogs: bool,
        union_off: bool,
    ) -> Agent {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.0]).arg(bin);
        for (k, _) in std::env::vars() {
            if k.starts_with("FELIX_") || k == "NODENAME" {
                cmd.env_remove(k);
            }
        }
        cmd.args(["run", "--node", node, "--datastore"])
            .arg(format!("dir:{}", dir.display()))
            .env("FELIX_INTERFACENAMESCHEME", "static")
            .env("FELIX_INTERFACEMAPFILE", dir.join(map))
            .env("FELIX_IPTABLESBACKEND", "legacy")
            .env("FELIX_HEALTHENABLED", "true")
            .env("FELIX_HEALTHHOST", "127.0.0.1")
            .env("FELIX_HEALTHPORT", HEALTH_PORT.to_string())
            .env("FELIX_PROMETHEUSMETRICSENABLED", "true")
            .env("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1")
            .env("FELIX_PROMETHEUSMETRICSPORT", METRICS_PORT.to_string())
            .env("FELIX_LOGSEVERITYSCREEN", "Warning");
        if union_off {
            cmd.env("FELIX_POLICYUNIONMIN", "0");
        }
        if flowlogs {
            cmd.env("FELIX_FLOWLOGSENABLED", "true")
                .env("FELIX_FLOWLOGSPERPODRATE", "10000")
                .env("FELIX_FLOWLOGSPERPODBURST", "10000");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the agent");
        Agent {
            process: common::Agent::adopt(child, None),
            ns: ns.0.clone(),
        }
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.process.child.try_wait() {
                panic!("the agent in {} exited: {status}", self.ns);
            }
            if http_get(&self.ns, HEALTH_PORT, "/readiness").is_some_and(|(s, _)| s == 200) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the agent in {} was not ready within 120 s",
                self.ns
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn metrics(&self) -> String {
        http_get(&self.ns, METRICS_PORT, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

/// Sequential connect / read to EOF / reset-close from the client pod for `secs`, on
/// `clients` threads: (connections completed, failures).
fn hammer(ns: &str, to: Ipv4Addr, secs: f64, clients: usize) -> (u64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let dst = SocketAddr::new(IpAddr::V4(to), PORT);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (done, failed, stop, ns) =
                (done.clone(), failed.clone(), stop.clone(), ns.to_string());
            std::thread::spawn(move || {
                enter(&ns);
                let mut buf = [0u8; 16];
                while !stop.load(Ordering::Relaxed) {
                    match TcpStream::connect_timeout(&dst, Duration::from_secs(1)) {
                        Ok(mut s) => {
                            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                            let ok = matches!(s.read(&mut buf), Ok(0));
                            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                            drop(s);
                            if ok { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    None,
    Agent,
    Policies,
    PoliciesWalk,
    FlowLogs,
    Stopped,
    PrevAgent,
    PrevFlowLogs,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::None => "none",
            Config::Agent => "agent",
            Config::Policies => "policies",
            Config::PoliciesWalk => "policies-walk",
            Config::FlowLogs => "flowlogs",
            Config::Stopped => "stopped",
            Config::PrevAgent => "prev-agent",
            Config::PrevFlowLogs => "prev-flowlogs",
        }
    }

    fn parse(s: &str) -> Config {
        match s {
            "none" => Config::None,
            "agent" => Config::Agent,
            "policies" => Config::Policies,
            "policies-walk" => Config::PoliciesWalk,
            "flowlogs" => Config::FlowLogs,
            "stopped" => Config::Stopped,
            "prev-agent" => Config::PrevAgent,
            "prev-flowlogs" => Config::PrevFlowLogs,
            _ => panic!("unknown configuration {s}"),
        }
    }

    /// The configuration this one is a ratio to, within the same round.
    fn reference(self) -> Option<Config> {
        match self {
            Config::None => None,
            Config::Agent | Config::PrevAgent => Some(Config::None),
            Config::PrevFlowLogs => Some(Config::PrevAgent),
            Config::Policies | Config::PoliciesWalk | Config::FlowLogs => Some(Config::Agent),
            Config::Stopped => Some(Config::FlowLogs),
        }
    }
}

/// One configuration's figures in one round.
#[derive(Clone, Default, Debug)]
struct Cell {
    /// Connections per second: same node, across nodes.
    rate: [f64; 2],
    failed: u64,
    /// Agents' CPU seconds over both measurements, and flow-log messages they received.
    cpu: f64,
    logged: f64,
    lost: f64,
    overruns: f64,
}

struct Opts {
    rounds: usize,
    secs: f64,
    clients: usize,
    policies: usize,
    peer_members: usize,
    configs: Vec<Config>,
    /// The other build `prev-*` configurations run.
    previous: Option<PathBuf>,
}

fn options() -> Opts {
    let mut o = Opts {
        rounds: 3,
        secs: 5.0,
        clients: 1,
        policies: 1000,
        peer_members: 0,
        configs: [
            "none",
            "agent",
            "policies",
            "policies-walk",
            "flowlogs",
            "stopped",
        ]
        .into_iter()
        .map(Config::parse)
        .collect(),
        previous: None,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--rounds" => o.rounds = v.parse().expect("--rounds N"),
            "--secs" => o.secs = v.parse().expect("--secs S"),
            "--clients" => o.clients = v.parse().expect("--clients N"),
            "--policies" => o.policies = v.parse().expect("--policies N"),
            "--peer-members" => o.peer_members = v.parse().expect("--peer-members N"),
            "--configs" => o.configs = v.split(',').map(Config::parse).collect(),
            "--previous" => o.previous = Some(PathBuf::from(v)),
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    let wants_previous = o
        .configs
        .iter()
        .any(|c| matches!(c, Config::PrevAgent | Config::PrevFlowLogs));
    match (&o.previous, wants_previous) {
        (None, true) => panic!("prev-agent and prev-flowlogs need --previous PATH"),
        (Some(_), false) => o.configs.extend([Config::PrevAgent, Config::PrevFlowLogs]),
        _ => {}
    }
    o
}

fn measure(bin: &Path, work: &Path, config: Config, round: usize, opts: &Opts) -> Cell {
    let topo = Topo::new(&format!("r{round}-{}", config.name()));
    let dir = work.join(format!("r{round}-{}", config.name()));
    let with_policies = matches!(config, Config::Policies | Config::PoliciesWalk);
    let policies = if with_policies { opts.policies } else { 0 };
    write_cluster(&dir, policies, opts.peer_members);
    let union_off = config == Config::PoliciesWalk;
    let flowlogs = matches!(
        config,
        Config::FlowLogs | Config::Stopped | Config::PrevFlowLogs
    );
    let bin = match config {
        Config::PrevAgent | Config::PrevFlowLogs => opts.previous.as_deref().unwrap_or(bin),
        _ => bin,
    };
    let mut agents = Vec::new();
    if config != Config::None {
        agents.push(Agent::start(
            bin,
            &topo.a,
            "node-a",
            &dir,
            "map-a.yaml",
            flowlogs,
            union_off,
        ));
        agents.push(Agent::start(
            bin,
            &topo.b,
            "node-b",
            &dir,
            "map-b.yaml",
            flowlogs,
            union_off,
        ));
        for a in &mut agents {
            a.wait_ready();
        }
    }
    if with_policies {
        let chains = topo
            .b
            .sh("iptables-legacy-save -t filter | grep -c '^:cali-pi-' || true");
        assert!(
            chains.trim().parse::<usize>().unwrap_or(0) >= opts.policies,
            "node-b holds {} policy chains, not {}",
            chains.trim(),
            opts.policies
        );
        let unions = topo.b.sh("ipset list -n | grep -c '^cali40u:' || true");
        assert_eq!(
            unions.trim() != "0",
            config == Config::Policies,
            "node-b holds {} union sets ({})",
            unions.trim(),
            config.name()
        );
    }
    let _servers = [
        Server::start(&topo.server_a.ns.0, topo.server_a.ip),
        Server::start(&topo.server_b.ns.0, topo.server_b.ip),
    ];
    // Both paths work before they are timed (and warm the neighbour caches).
    for to in [topo.server_a.ip, topo.server_b.ip] {
        let (ok, _) = hammer(&topo.client.ns.0, to, 0.3, 1);
        assert!(ok > 0, "{}: no connection to {to} succeeds", config.name());
    }
    let before: Vec<(u64, String)> = agents
        .iter()
        .map(|a| (ticks(a.process.pid()), a.metrics()))
        .collect();
    if config == Config::Stopped {
        for a in &agents {
            a.process.signal(nix::sys::signal::Signal::SIGSTOP);
        }
    }
    let mut cell = Cell::default();
    for (i, to) in [topo.server_a.ip, topo.server_b.ip].into_iter().enumerate() {
        let (ok, failed) = hammer(&topo.client.ns.0, to, opts.secs, opts.clients);
        cell.rate[i] = ok as f64 / opts.secs;
        cell.failed += failed;
    }
    if config == Config::Stopped {
        for a in &agents {
            a.process.signal(nix::sys::signal::Signal::SIGCONT);
        }
        // Let the readers drain what the socket kept and see the overrun.
        std::thread::sleep(Duration::from_secs(3));
    }
    let hz = ticks_per_second();
    for (a, (t0, m0)) in agents.iter().zip(&before) {
        let m1 = a.metrics();
        cell.cpu += ticks(a.process.pid()).saturating_sub(*t0) as f64 / hz;
        let d = |name| metric(&m1, name) - metric(m0, name);
        cell.logged += d("netpol_flow_log_messages_total");
        cell.lost += d("netpol_flow_log_lost_total");
        cell.overruns += d("netpol_flow_log_overruns_total");
    }
    drop(agents);
    let _ = std::fs::remove_dir_all(&dir);
    cell
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") && std::env::args().any(|a| a == "--list") {
        return;
    }
    let opts = options();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_netpol-agent"));
    let work = std::env::temp_dir().join(format!("npa-bench-connrate-{}", std::process::id()));
    println!(
        "conn_rate: {} rounds x {:?}, {} s per path, {} client thread(s), {} policies, {} peer pods each, previous build {:?}; load {}",
        opts.rounds,
        opts.configs.iter().map(|c| c.name()).collect::<Vec<_>>(),
        opts.secs,
        opts.clients,
        opts.policies,
        opts.peer_members,
        opts.previous,
        load()
    );
    let mut cells: Vec<Vec<(Config, Cell)>> = Vec::new();
    for round in 0..opts.rounds {
        let mut row = Vec::new();
        for &config in &opts.configs {
            let cell = measure(&bin, &work, config, round, &opts);
            println!(
                "round {round} {:9} same node {:8.0}/s  across {:8.0}/s  failed {:4}  agents' CPU {:6.2} s  logged {:7.0}  lost {:5.0}  overruns {:3.0}  (load {})",
                config.name(),
                cell.rate[0],
                cell.rate[1],
                cell.failed,
                cell.cpu,
                cell.logged,
                cell.lost,
                cell.overruns,
                load()
            );
            row.push((config, cell));
        }
        cells.push(row);
    }
    let _ = std::fs::remove_dir_all(&work);
    println!(
        "\nmedian over {} rounds (ratio: median of the per-round ratios to the reference)",
        opts.rounds
    );
    println!("| configuration | same node conn/s | ratio | across nodes conn/s | ratio | agents' CPU s per 1000 logged |");
    println!("|---|---|---|---|---|---|");
    for &config in &opts.configs {
        let of = |row: &Vec<(Config, Cell)>, c: Config| {
            row.iter()
                .find(|(k, _)| *k == c)
                .map(|(_, cell)| cell.clone())
        };
        let mut line = format!("| {} |", config.name());
        for path in 0..2 {
            let rate = median(
                cells
                    .iter()
                    .filter_map(|r| of(r, config))
                    .map(|c| c.rate[path])
                    .collect(),
            );
            let ratio = config.reference().map(|reference| {
                median(
                    cells
                        .iter()
                        .filter_map(|r| {
                            Some(of(r, config)?.rate[path] / of(r, reference)?.rate[path])
                        })
                        .collect(),
                )
            });
            line += &format!(
                " {rate:.0} | {} |",
                match (ratio, config.reference()) {
                    (Some(x), Some(r)) if x.is_finite() => format!("{x:.3} of {}", r.name()),
                    _ => "–".to_string(),
                }
            );
        }
        let per_k = median(
            cells
                .iter()
                .filter_map(|r| of(r, config))
                .filter(|c| c.logged > 0.0)
                .map(|c| c.cpu / c.logged * 1000.0)
                .collect(),
        );
        line += &if per_k.is_finite() {
            format!(" {per_k:.4} |")
        } else {
            " – |".to_string()
        };
        println!("{line}");
    }
    println!("load at the end: {}", load());
}
