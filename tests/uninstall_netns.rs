//! Uninstall on a real kernel (issue 20): the sequence agent → stopped → cleaned, as
//! `docs/operations/uninstall.md` tells an operator to run it, on a node namespace with pods
//! wired the Calico way (`tests/pod_node`).
//!
//! 1. The agent (with its health server on 127.0.0.1:9099, as deployed) converges with no
//!    policies: pod a reaches pod b.
//! 2. SIGTERM: every rule and set stays (`cali-FORWARD` too).
//! 3. A pod created now (a new `cali…` veth with its /32 route) is blackholed: its traffic
//!    meets the dispatch chains' "Unknown interface" DROP, to and from another pod and from
//!    the node (as the kubelet's probes would).
//! 4. The uninstall DaemonSet's own script (`deploy/uninstall/daemonset.yaml`, run with
//!    `netpol-agent` on its PATH) first waits while something listens on the health port (a
//!    stand-in for an agent still running, or felix), then cleans both backends.
//! 5. Nothing of ours is left in either backend or family (no chain, no rule in
//!    INPUT/FORWARD/OUTPUT, no IP set), the foreign chains, rules, nft table and set that
//!    were there before are exactly as they were, and the new pod is reachable over TCP.

mod common;
mod pod_node;

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use common::{in_netns, NetNs, TempDir};
use pod_node::{v4, PodNode, PodSpec};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
const HEALTH: u16 = 9099;
const PORT: u16 = 8080;

/// The uninstall DaemonSet's container script (`sh -c SCRIPT`).
fn uninstall_script() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/uninstall/daemonset.yaml");
    let ds: DaemonSet = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let command = pod.containers[0].command.clone().unwrap();
    assert_eq!(command[..2], ["sh", "-c"], "{command:?}");
    command[2].clone()
}

/// The script running inside the node namespace; killed on drop.
struct Uninstall {
    child: Child,
    done: PathBuf,
    log: PathBuf,
    _dir: TempDir,
}

impl Uninstall {
    fn start(node: &NetNs) -> Uninstall {
        let dir = TempDir::new("uninstall");
        let bin = dir.path.join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("netpol-agent")).unwrap();
        let done = dir.path.join("done");
        let log = dir.path.join("uninstall.log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &node.name, "sh", "-c", &uninstall_script()]);
        for (k, _) in std::env::vars() {
            if k.starts_with("FELIX_") || k == "NODENAME" {
                cmd.env_remove(k);
            }
        }
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = cmd
            .env("PATH", path)
            .env("NETPOL_UNINSTALL_DONE", &done)
            .env("FELIX_LOGFORMAT", "json")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path.join("stderr")).unwrap())
            .spawn()
            .expect("start the uninstall script");
        Uninstall {
            child,
            done,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        let mut s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.push_str(&std::fs::read_to_string(self.log.with_file_name("stderr")).unwrap_or_default());
        s
    }

    fn is_done(&mut self) -> bool {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the uninstall script exited ({status}):\n{}", self.log());
        }
        self.done.exists()
    }
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        // SIGTERM: its trap also ends the sleep it waits on.
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod created after the agent stopped: its own namespace, a routed veth `iface` on the
/// node (/32 route, proxy ARP), 10.77.0.<n>.
fn add_pod(node: &PodNode, n: u8, iface: &str) -> NetNs {
    let ns = NetNs::new(&format!("late-{n}"));
    let a4 = v4(n);
    node.node.sh_ok(&format!(
        "ip link add {iface} type veth peer name eth0 netns {pod} && ip link set {iface} up && \
         ip route add {a4}/32 dev {iface} && \
         sysctl -qw net.ipv4.conf.{iface}.proxy_arp=1 net.ipv4.neigh.{iface}.proxy_delay=0",
        pod = ns.name
    ));
    ns.sh_ok(&format!(
        "ip addr add {a4}/32 dev eth0 && ip link set eth0 up && \
         ip route add 169.254.1.1 dev eth0 scope link && \
         ip route add default via 169.254.1.1 dev eth0"
    ));
    ns
}

/// A TCP listener on `ip:PORT` in `ns` (the kernel completes handshakes from its backlog).
fn listen(ns: &str, ip: IpAddr) -> TcpListener {
    in_netns(ns, || TcpListener::bind(SocketAddr::new(ip, PORT)).unwrap())
}

fn connects(from: &str, to: IpAddr, timeout: Duration) -> bool {
    in_netns(from, || {
        TcpStream::connect_timeout(&SocketAddr::new(to, PORT), timeout).is_ok()
    })
}

/// Other programs' state that must come through untouched: a chain with a rule and a jump
/// from FORWARD in each iptables table named, a native nft table, an IP set.
fn add_foreign_state(node: &NetNs, legacy: bool) {
    let mut tools = vec!["iptables-nft", "ip6tables-nft"];
    if legacy {
        tools.push("iptables-legacy");
    }
    for tool in tools {
        node.sh_ok(&format!(
            "{tool} -N KUBE-TEST && {tool} -A KUBE-TEST -p tcp --dport 22 -j RETURN && \
             {tool} -A FORWARD -j KUBE-TEST && {tool} -A INPUT -p tcp --dport 10250 -j ACCEPT"
        ));
    }
    if legacy {
        // Legacy iptables registers a table on first use and never removes it; on a node
        // running legacy both families' filter tables exist long before the agent starts.
        node.exec_ok(&["ip6tables-legacy", "-S"]);
    }
    node.sh_ok(
        "nft add table inet foreign && \
         nft add chain inet foreign passthrough '{ type filter hook forward priority 10; }' && \
         nft add rule inet foreign passthrough tcp dport 23 accept && \
         ipset create KUBE-SET hash:ip && ipset add KUBE-SET 10.9.9.9",
    );
}

/// Every table of both backends and families, the nft ruleset and the IP sets, without
/// counters (traffic moves them), for an exact before/after comparison.
fn snapshot(node: &NetNs) -> String {
    let mut out = String::new();
    for tool in [
        "iptables-legacy-save",
        "ip6tables-legacy-save",
        "iptables-nft-save",
        "ip6tables-nft-save",
    ] {
        out.push_str(&format!("== {tool}\n"));
        for line in node.exec_ok(&[tool]).lines() {
            if line.starts_with('#') {
                continue;
            }
            let line = match line.split_once(" [") {
                Some((chain, _)) if line.starts_with(':') => chain,
                _ => line,
            };
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("== nft -s list ruleset\n");
    out.push_str(&without_empty_base_chains(
        &node.exec_ok(&["nft", "-s", "list", "ruleset"]),
    ));
    out.push_str("== ipset save\n");
    out.push_str(&node.exec_ok(&["ipset", "save"]));
    out
}

/// `nft list ruleset` without base chains that hold no rule and accept: iptables-nft creates
/// a kernel chain (`OUTPUT`, say) the first time a rule goes there and never deletes it, so
/// after cleanup the agent's `OUTPUT` jump leaves such a chain behind, with no effect on any
/// packet. Everything else must be as it was.
fn without_empty_base_chains(ruleset: &str) -> String {
    let mut out = Vec::new();
    let lines: Vec<&str> = ruleset.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let empty_base = lines[i].starts_with("\tchain ")
            && lines.get(i + 1).is_some_and(|l| {
                l.trim_start().starts_with("type filter hook ") && l.ends_with("policy accept;")
            })
            && lines.get(i + 2) == Some(&"\t}");
        if empty_base {
            i += 3;
            if lines.get(i) == Some(&"") {
                i += 1;
            }
            continue;
        }
        out.push(lines[i]);
        i += 1;
    }
    // A chain dropped last leaves the blank line that separated it from the one before.
    let mut text = out.join("\n").replace("\n\n}", "\n}");
    text.push('\n');
    text
}

/// What of ours is in the node: every line of the saves, the nft ruleset and the set
/// names that mention `cali` (our chains `cali-…`, rule hashes `cali:…`, sets
/// `cali40…`/`cali60…`, our jumps `-i cali+`; nothing foreign here does).
fn ours(node: &NetNs) -> Vec<String> {
    let mut found = Vec::new();
    for tool in [
        "iptables-legacy-save",
        "ip6tables-legacy-save",
        "iptables-nft-save",
        "ip6tables-nft-save",
    ] {
        for line in node.exec_ok(&[tool]).lines() {
            if line.contains("cali") {
                found.push(format!("{tool}: {line}"));
            }
        }
    }
    for line in node.exec_ok(&["nft", "-s", "list", "ruleset"]).lines() {
        if line.contains("cali") {
            found.push(format!("nft: {}", line.trim()));
        }
    }
    for name in node.exec_ok(&["ipset", "list", "-n"]).lines() {
        if name.starts_with("cali") {
            found.push(format!("ipset: {name}"));
        }
    }
    found
}

/// Packets counted by the "Unknown interface" DROP rules of `backend` (IPv4).
fn unknown_interface_drops(node: &NetNs, backend: &str) -> u64 {
    let save = node.exec_ok(&[&format!("iptables-{backend}-save"), "-c", "-t", "filter"]);
    save.lines()
        .filter(|l| l.contains("Unknown interface"))
        .map(|l| {
            let counters = l.trim_start_matches('[').split(']').next().unwrap();
            counters.split(':').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

fn legacy_tables(node: &NetNs) -> String {
    node.sh_ok("cat /proc/net/ip_tables_names /proc/net/ip6_tables_names 2>/dev/null; true")
}

fn uninstall_after_the_agent(backend: &'static str) {
    let spec = |name, n, iface| PodSpec {
        namespace: "shop",
        name,
        labels: &[("app", "web")],
        n,
        iface: Some(iface),
    };
    let mut node = PodNode::new(
        &format!("uninst-{backend}"),
        backend,
        vec![spec("a", 10, "calia"), spec("b", 11, "calib")],
    );
    // A policy that isolates both pods and allows them each other, so the node holds
    // selector sets that our rules name.
    node.write_policies(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-from-web, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: web}}}]\n",
    );
    // The node's own address, as a real node has (its connections to pods come from it).
    node.node
        .exec_ok(&["ip", "addr", "add", "192.0.2.10/32", "dev", "dummy0"]);
    let legacy = backend == "legacy";
    add_foreign_state(&node.node, legacy);
    let before = snapshot(&node.node);
    let (a, b) = (node.pod("shop/a"), node.pod("shop/b"));
    let (a_ns, a_ip, b_ip) = (a.ns.name.clone(), a.v4, b.v4);
    let _a_listener = listen(&a_ns, a_ip.into());
    let _b_listener = listen(&b.ns.name, b_ip.into());

    // 1. The agent as deployed (health server on), no policies: everything is allowed.
    node.start_agent(&[
        ("FELIX_INTERFACEPREFIX", "cali"),
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
    ]);
    let took = node.wait_converged(Duration::from_secs(20));
    eprintln!("{backend}: converged in {took:?}");
    assert!(
        connects(&a_ns, b_ip.into(), Duration::from_secs(2)),
        "a → b with the agent"
    );

    // 2. SIGTERM: the agent stops and its rules and sets stay.
    let mut agent = node.agent.take().unwrap();
    kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM).unwrap();
    let status = agent.wait().unwrap();
    assert!(
        status.success(),
        "the agent's exit on SIGTERM: {status}\n{}",
        node.log()
    );
    let forward = node
        .node
        .exec_ok(&[&format!("iptables-{backend}"), "-S", "cali-FORWARD"]);
    assert!(forward.contains("-A cali-FORWARD"), "{forward}");
    let left = ours(&node.node);
    assert!(left.len() > 10, "our rules stay after SIGTERM: {left:?}");
    assert!(
        left.iter().any(|l| l.starts_with("ipset: cali40s:")),
        "our sets stay after SIGTERM: {left:?}"
    );

    // 3. A pod created now is blackholed by "Unknown interface", both ways.
    let c = add_pod(&node, 12, "calic");
    let c_ip = v4(12);
    let _c_listener = listen(&c.name, c_ip.into());
    let drops = unknown_interface_drops(&node.node, backend);
    assert!(
        !connects(&a_ns, c_ip.into(), Duration::from_millis(700)),
        "a → the new pod c passed before cleanup"
    );
    assert!(
        !connects(&c.name, a_ip.into(), Duration::from_millis(700)),
        "the new pod c → a passed before cleanup"
    );
    // The node's own connections to it too (the kubelet's probes): its answers come in from
    // a `cali` interface and meet the same DROP.
    assert!(
        !connects(&node.node.name, c_ip.into(), Duration::from_millis(700)),
        "the node → the new pod c passed before cleanup"
    );
    let after = unknown_interface_drops(&node.node, backend);
    assert!(
        after >= drops + 3,
        "the \"Unknown interface\" DROPs counted {drops} → {after}:\n{}",
        node.diagnose()
    );
    assert!(
        connects(&a_ns, b_ip.into(), Duration::from_secs(2)),
        "a → b after SIGTERM"
    );

    // 4. The uninstall script does nothing while something listens on the health port.
    let guard = in_netns(&node.node.name, || {
        TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], HEALTH))).unwrap()
    });
    let mut uninstall = Uninstall::start(&node.node);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !uninstall.is_done(),
        "cleaned while port {HEALTH} was listening"
    );
    assert_eq!(
        ours(&node.node),
        left,
        "something removed while the port was listening"
    );
    assert!(
        uninstall.log().contains("not cleaning"),
        "{}",
        uninstall.log()
    );
    drop(guard);
    let took = common::wait_for(
        common::scaled(Duration::from_secs(20)),
        "the uninstall script is done",
        || uninstall.is_done(),
    );
    eprintln!("{backend}: cleaned {took:?} after the port closed");

    // 5. Nothing of ours, everything else as it was, and the new pod reachable.
    let left = ours(&node.node);
    assert!(
        left.is_empty(),
        "left after cleanup: {left:#?}\n{}",
        uninstall.log()
    );
    assert_eq!(snapshot(&node.node), before, "{}", uninstall.log());
    if !legacy {
        // An nft node gets no legacy table from the uninstall (asking for one creates it).
        assert_eq!(legacy_tables(&node.node).trim(), "", "{}", uninstall.log());
        assert!(uninstall.log().contains("no legacy iptables filter table"));
    }
    assert!(
        connects(&a_ns, c_ip.into(), Duration::from_secs(2)),
        "a → c after cleanup"
    );
    assert!(
        connects(&c.name, a_ip.into(), Duration::from_secs(2)),
        "c → a after cleanup"
    );
    assert!(
        connects(&a_ns, b_ip.into(), Duration::from_secs(2)),
        "a → b after cleanup"
    );
    assert!(
        connects(&node.node.name, c_ip.into(), Duration::from_secs(2)),
        "the node → c after cleanup"
    );
}

#[test]
fn uninstall_after_a_legacy_agent_unblocks_new_pods_and_leaves_nothing_of_ours() {
    uninstall_after_the_agent("legacy");
}

#[test]
fn uninstall_after_an_nft_agent_unblocks_new_pods_and_leaves_nothing_of_ours() {
    uninstall_after_the_agent("nft");
}
