//! The routes interface-naming scheme on a real kernel, inside a network namespace the test
//! makes: hybridnet-style veths (`hybr` + 11 hex) whose pod routes live in policy-routing
//! table 39999 (reached through `ip rule ... lookup 39999`), others in main. The resolver is
//! built through the configuration (`--interface-name-scheme routes`) and started from a
//! thread that entered the namespace, as the agent runs in the node's; the test then changes
//! routes and links and checks that the resolver and its notifier follow.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{in_netns, NetNs};
use netpol_agent::config::RuleOptions;
use netpol_agent::host::netlink::{parse_host_route, RtnlSocket, RT_TABLE_MAIN};
use netpol_agent::iface_naming::{read_state, InterfaceResolver, NamingError};
use netpol_agent::model::{ObjectKey, PodInfo};

const HYBRID_TABLE: u32 = 39999;
const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

#[derive(Parser)]
struct Opts {
    #[command(flatten)]
    rules: RuleOptions,
}

/// The resolver exactly as `run` builds it from its flags.
fn routes_resolver(prefixes: &str) -> Box<dyn InterfaceResolver> {
    let opts = Opts::try_parse_from([
        "test",
        "--interface-name-scheme",
        "routes",
        "--interface-prefix",
        prefixes,
    ])
    .expect("flags");
    let resolver = netpol_agent::iface_naming::resolver(&opts.rules).expect("routes resolver");
    assert_eq!(resolver.scheme(), "routes");
    resolver
}

fn pod(name: &str, ips: &[&str]) -> PodInfo {
    PodInfo {
        key: ObjectKey::new("default", name),
        uid: None,
        node: Some("node-1".to_string()),
        labels: Default::default(),
        ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        named_ports: Vec::new(),
        sandbox_id: None,
    }
}

/// A veth whose host side is `name` (the peer stays in the namespace: only the routes
/// matter here), both ends up.
fn add_veth(ns: &NetNs, name: &str, peer: &str) {
    ns.sh_ok(&format!(
        "ip link add {name} type veth peer name {peer} && ip link set {name} up && \
         ip link set {peer} up"
    ));
}

/// Stops the resolver's watcher when the test ends, also on failure.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
        // Let the watcher notice before the namespace goes.
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Waits until `pod` resolves as `expected`, failing with what it resolves to.
fn wait_resolves(
    resolver: &dyn InterfaceResolver,
    pod: &PodInfo,
    what: &str,
    expected: impl Fn(&Result<String, NamingError>) -> bool,
) {
    let start = Instant::now();
    loop {
        let got = resolver.resolve(pod);
        if expected(&got) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: pod {} still resolves to {got:?}",
            pod.key
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the notifier to have been called more than `before` times.
fn wait_notified(count: &AtomicUsize, before: usize, what: &str) {
    let start = Instant::now();
    while count.load(Ordering::SeqCst) <= before {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: the notifier was not called"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_name(expected: &'static str) -> impl Fn(&Result<String, NamingError>) -> bool {
    move |got| got.as_deref() == Ok(expected)
}

fn no_host_route(got: &Result<String, NamingError>) -> bool {
    matches!(got, Err(NamingError::NoHostRoute { .. }))
}

/// The node of seed 003 (hybridnet), shrunk: pod routes in table 39999 behind an ip rule,
/// one pod dual-stack, one Calico-style route in main, a host interface outside the
/// prefixes, a route via a gateway towards another node, and two routes that disagree.
fn hybridnet_node() -> NetNs {
    let ns = NetNs::new("routes");
    add_veth(&ns, "hybr6b3adcd7e1e", "pa");
    add_veth(&ns, "hybr1b7a9ed1883", "pb");
    add_veth(&ns, "hybr3c237dc2041", "pc");
    add_veth(&ns, "hybr56df5339e20", "pf");
    add_veth(&ns, "ens5", "uplink");
    ns.sh_ok(
        "set -e
         ip rule add from all lookup 39999 pref 1
         ip addr add 192.168.7.1/24 dev ens5
         ip route add 172.24.0.1/32 dev hybr6b3adcd7e1e table 39999
         ip route add 172.24.0.4/32 dev hybr1b7a9ed1883 table 39999
         ip -6 route add fd00:24::4/128 dev hybr1b7a9ed1883 table 39999
         ip route add 172.24.0.11/32 dev hybr3c237dc2041 scope link
         ip route add 172.24.0.50/32 dev ens5
         ip route add 172.24.1.7/32 via 192.168.7.2 dev ens5
         ip route add 172.24.0.30/32 dev hybr56df5339e20 table 39999
         ip route add 172.24.0.30/32 dev hybr3c237dc2041",
    );
    ns
}

#[test]
fn resolver_follows_routes_and_links_in_every_table() {
    let ns = hybridnet_node();
    let resolver = routes_resolver("hybr");
    let notified = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    {
        let notified = notified.clone();
        let stop = stop.clone();
        in_netns(&ns.name, || {
            resolver.start(
                Box::new(move || {
                    notified.fetch_add(1, Ordering::SeqCst);
                }),
                stop,
            )
        })
        .expect("start the routes resolver in the test namespace");
    }
    let r = resolver.as_ref();

    // Known at once after start: table 39999, a dual-stack pod, the main table.
    let a = pod("a", &["172.24.0.1"]);
    let b = pod("b", &["172.24.0.4", "fd00:24::4"]);
    let c = pod("c", &["172.24.0.11"]);
    assert_eq!(r.resolve(&a), Ok("hybr6b3adcd7e1e".to_string()));
    assert_eq!(r.resolve(&b), Ok("hybr1b7a9ed1883".to_string()));
    assert_eq!(r.resolve(&c), Ok("hybr3c237dc2041".to_string()));

    // No host route: reported, not guessed.
    let d = pod("d", &["172.24.0.20"]);
    let err = r.resolve(&d).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod default/d: no host route to 172.24.0.20 in any routing table"
    );
    // A route via a gateway (another node's pod) names no local interface.
    assert!(no_host_route(&r.resolve(&pod("remote", &["172.24.1.7"]))));

    // An interface outside the prefixes: the dispatch rules could never match it.
    let e = r.resolve(&pod("e", &["172.24.0.50"])).unwrap_err();
    assert!(
        matches!(&e, NamingError::InterfacePrefixMismatch { name, .. } if name == "ens5"),
        "{e:?}"
    );
    assert!(e.to_string().contains("-i hybr+"), "{e}");

    // Two tables disagree on one IP.
    let f = r.resolve(&pod("f", &["172.24.0.30"])).unwrap_err();
    assert!(matches!(f, NamingError::ConflictingRoutes { .. }), "{f:?}");
    assert!(
        f.to_string().contains("hybr56df5339e20 (table 39999)"),
        "{f}"
    );
    assert!(
        f.to_string().contains("hybr3c237dc2041 (table main)"),
        "{f}"
    );

    // A new pod: its veth and route appear; the notifier fires and it resolves.
    let before = notified.load(Ordering::SeqCst);
    add_veth(&ns, "hybr0a1b2c3d4e5", "pd");
    ns.sh_ok("ip route add 172.24.0.20/32 dev hybr0a1b2c3d4e5 table 39999");
    wait_notified(&notified, before, "route added");
    wait_resolves(r, &d, "route added", is_name("hybr0a1b2c3d4e5"));

    // Its route deleted: unresolvable again, and said so.
    let before = notified.load(Ordering::SeqCst);
    ns.sh_ok("ip route del 172.24.0.20/32 table 39999");
    wait_notified(&notified, before, "route deleted");
    wait_resolves(r, &d, "route deleted", no_host_route);

    // Renaming needs the link down, which makes the kernel drop its routes without a
    // RTM_DELROUTE: followed through the link event.
    ns.sh_ok("ip link set hybr6b3adcd7e1e down");
    wait_resolves(r, &a, "link down", no_host_route);
    let before = notified.load(Ordering::SeqCst);
    ns.sh_ok(
        "ip link set hybr6b3adcd7e1e name hybrfedcba98765 && ip link set hybrfedcba98765 up && \
         ip route add 172.24.0.1/32 dev hybrfedcba98765 table 39999",
    );
    wait_notified(&notified, before, "link renamed");
    wait_resolves(r, &a, "link renamed", is_name("hybrfedcba98765"));

    // The link deleted (a pod gone): both of its routes with it, IPv4 silently.
    let before = notified.load(Ordering::SeqCst);
    ns.sh_ok("ip link del hybr1b7a9ed1883");
    wait_notified(&notified, before, "link deleted");
    wait_resolves(
        r,
        &b,
        "link deleted",
        |got| matches!(got, Err(NamingError::NoHostRoute { ips, .. }) if ips.len() == 2),
    );

    // Everything else stayed.
    assert_eq!(r.resolve(&c), Ok("hybr3c237dc2041".to_string()));
}

#[test]
fn a_dump_with_the_table_unspecified_returns_every_table() {
    let ns = hybridnet_node();
    let (routes, state) = in_netns(&ns.name, || {
        let mut socket = RtnlSocket::open().unwrap();
        let routes = socket
            .dump_routes(netlink_packet_route::AddressFamily::Inet)
            .unwrap();
        (routes, read_state(&mut socket).unwrap())
    });
    let hybrid: Vec<_> = routes
        .iter()
        .filter_map(|m| Some((m, parse_host_route(m)?)))
        .filter(|(_, e)| e.key.table == HYBRID_TABLE)
        .collect();
    assert_eq!(hybrid.len(), 3, "table 39999 routes: {hybrid:#?}");
    // 39999 does not fit the header byte: the kernel says RT_TABLE_COMPAT (252) there and
    // the real id in RTA_TABLE.
    assert!(hybrid.iter().all(|(m, _)| m.header.table == 252));
    assert!(routes
        .iter()
        .filter_map(parse_host_route)
        .any(|e| e.key.table == RT_TABLE_MAIN
            && e.key.dst == "172.24.0.11".parse::<IpAddr>().unwrap()));
    let names = state.map().interfaces();
    assert_eq!(
        names[&"fd00:24::4".parse::<IpAddr>().unwrap()]
            .iter()
            .collect::<Vec<_>>(),
        vec!["hybr1b7a9ed1883"]
    );
}

#[test]
fn compile_refuses_the_routes_scheme() {
    let out = Command::new(BIN)
        .args(["compile", "--manifests"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo"))
        .args(["--node", "node-1", "--interface-name-scheme", "routes"])
        .env_remove("FELIX_INTERFACENAMESCHEME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("FELIX_INTERFACENAMESCHEME=routes"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--interface-name-scheme static"),
        "{stderr}"
    );
    assert!(stderr.contains("FELIX_INTERFACEMAPFILE"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// The agent itself with `FELIX_INTERFACENAMESCHEME=routes` in a hybridnet-like namespace:
/// a pod whose route is in table 39999 gets its chains; a pod without a route is reported
/// and gets them once its route appears (the resolver's notifier makes the agent resolve
/// local pods again).
#[test]
fn agent_names_pod_interfaces_from_routes() {
    let ns = NetNs::new("routes-agent");
    add_veth(&ns, "hybr1b7a9ed1883", "pb");
    ns.sh_ok(
        "ip rule add from all lookup 39999 pref 1 && \
         ip route add 172.24.0.4/32 dev hybr1b7a9ed1883 table 39999",
    );
    let dir = common::TempDir::new("routes-agent");
    let manifests = dir.path.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("pods.yaml"),
        "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: default, labels: {app: web}}
  spec: {nodeName: node-1, containers: [{name: web, image: nginx}]}
  status: {phase: Running, podIPs: [{ip: 172.24.0.4}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: late, namespace: default, labels: {app: late}}
  spec: {nodeName: node-1, containers: [{name: late, image: nginx}]}
  status: {phase: Running, podIPs: [{ip: 172.24.0.20}]}
",
    )
    .unwrap();
    let log = dir.path.join("agent.log");
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", manifests.display()));
    let child = cmd
        .envs([
            ("FELIX_INTERFACENAMESCHEME", "routes"),
            ("FELIX_INTERFACEPREFIX", "hybr"),
            ("FELIX_IPTABLESBACKEND", "legacy"),
            ("FELIX_IPV6SUPPORT", "false"),
            // The resolver's reason for a pod it cannot name yet is a debug line (the agent
            // warns once the grace period has passed).
            ("FELIX_LOGSEVERITYSCREEN", "Debug"),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _agent = Kill(child);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_chain = |chain: &str| {
        let start = Instant::now();
        loop {
            let save = ns.exec_ok(&["iptables-legacy-save", "-t", "filter"]);
            if save.contains(&format!(":{chain} ")) {
                return save;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{chain} never appeared; log:\n{}\n{save}",
                read_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let save = wait_chain("cali-tw-hybr1b7a9ed1883");
    assert!(save.contains("-i hybr+"), "{save}");
    assert!(
        read_log().contains("no host route to 172.24.0.20 in any routing table"),
        "{}",
        read_log()
    );
    add_veth(&ns, "hybr0a1b2c3d4e5", "pd");
    ns.sh_ok("ip route add 172.24.0.20/32 dev hybr0a1b2c3d4e5 table 39999");
    wait_chain("cali-tw-hybr0a1b2c3d4e5");
}
