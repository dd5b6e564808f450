//! The preflight checks on a real kernel, in network namespaces the test makes: a Linux
//! bridge with pod ports and `bridge-nf-call-iptables=0` (set inside the namespace only),
//! ipvlan (when the kernel has it) and macvlan links. First the detectors on a snapshot read
//! from the namespace, then the real binary (`netpol-agent run` under `ip netns exec`):
//! without a health server it exits 3 naming what it found; with one it stays up, 503 on
//! `/readiness` with the reason and 200 on `/liveness`, exits 3 on SIGTERM, and starts by
//! itself once the node is fixed; `FELIX_PREFLIGHTOVERRIDE=true` runs anyway.
//! Open vSwitch cannot be built here (no openvswitch module); its detector is unit-tested on
//! a synthetic snapshot.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{in_netns, Agent, NetNs, TempDir};
use netpol_agent::host::preflight::{self, BrNetfilter, Finding, PreflightConfig};

const HEALTH_PORT: u16 = 9099;

fn cfg(bridge_mode: bool) -> PreflightConfig {
    PreflightConfig {
        prefixes: vec!["cali".to_string()],
        bridge: bridge_mode.then(|| "br0".to_string()),
        ipv6: false,
    }
}

/// A pod veth `cali…` enslaved to bridge br0, br_netfilter switched off in this namespace
/// only.
fn bridged_node() -> NetNs {
    let ns = NetNs::new("pf-bridge");
    ns.sh_ok(
        "set -e
         ip link add br0 type bridge
         ip link add cali82111e10a96 type veth peer name pod0
         ip link set cali82111e10a96 master br0
         ip link set br0 up
         ip link set cali82111e10a96 up",
    );
    if Path::new("/proc/sys/net/bridge").exists() {
        ns.sh_ok("echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables");
    }
    ns
}

/// A node with a macvlan link, and an ipvlan one when the kernel supports ipvlan. Returns
/// whether ipvlan was built.
fn vlan_node() -> (NetNs, bool) {
    let ns = NetNs::new("pf-vlan");
    ns.sh_ok("ip link add veth0 type veth peer name veth1 && ip link add link veth0 name mac0 type macvlan");
    let ipvlan = ns
        .exec(&[
            "ip", "link", "add", "link", "veth0", "name", "ipv0", "type", "ipvlan",
        ])
        .status
        .success();
    if !ipvlan {
        eprintln!("this kernel has no ipvlan (CONFIG_IPVLAN); checking macvlan only");
    }
    (ns, ipvlan)
}

#[test]
fn detectors_read_a_real_bridge_and_br_netfilter_per_namespace() {
    let ns = bridged_node();
    let snapshot = in_netns(&ns.name, || preflight::snapshot().unwrap());
    if Path::new("/proc/sys/net/bridge").exists() {
        assert_eq!(
            snapshot.br_netfilter,
            BrNetfilter::Present {
                call_iptables: false,
                call_ip6tables: true
            },
            "the namespace's own sysctl"
        );
    }
    let found = preflight::check(&snapshot, &cfg(true));
    assert!(
        matches!(&found[..], [Finding::BridgeNetfilterOff { bridge, ports, .. }]
            if bridge == "br0" && ports == &["cali82111e10a96".to_string()]),
        "{found:?}"
    );
    let found = preflight::check(&snapshot, &cfg(false));
    assert!(
        matches!(&found[..], [Finding::PrefixPortsBridged { bridge, .. }] if bridge == "br0"),
        "{found:?}"
    );
    // Out of the bridge: routed mode has nothing to find; bridge mode still needs
    // br_netfilter for the pods its bridge will get.
    ns.sh_ok("ip link set cali82111e10a96 nomaster");
    let snapshot = in_netns(&ns.name, || preflight::snapshot().unwrap());
    assert_eq!(preflight::check(&snapshot, &cfg(false)), vec![]);
    let found = preflight::check(&snapshot, &cfg(true));
    assert!(
        matches!(&found[..], [Finding::BridgeNetfilterOff { bridge, ports, .. }]
            if bridge == "br0" && ports.is_empty()),
        "{found:?}"
    );
}

#[test]
fn detectors_find_ipvlan_and_macvlan_links() {
    let (ns, ipvlan) = vlan_node();
    let snapshot = in_netns(&ns.name, || preflight::snapshot().unwrap());
    let found = preflight::check(&snapshot, &cfg(false));
    let [Finding::Ipvlan { links }] = &found[..] else {
        panic!("{found:?}");
    };
    assert!(links.contains(&"mac0 (macvlan)".to_string()), "{links:?}");
    assert_eq!(
        links.contains(&"ipv0 (ipvlan)".to_string()),
        ipvlan,
        "{links:?}"
    );
}

// ---------------------------------------------------------------- the binary

fn start_agent(ns: &NetNs, dir: &TempDir, vars: &[(&str, &str)]) -> Agent {
    let datastore = dir.path.join("manifests");
    std::fs::create_dir_all(&datastore).unwrap();
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", datastore.display()))
        .envs([
            ("FELIX_IPTABLESBACKEND", "legacy"),
            ("FELIX_IPV6SUPPORT", "false"),
            ("FELIX_HEALTHHOST", "127.0.0.1"),
            ("FELIX_HEALTHPORT", &HEALTH_PORT.to_string()),
        ])
        .envs(vars.iter().copied());
    Agent::spawn(cmd, &dir.path.join("agent.log"))
}

/// `GET path` on the health port inside `ns`: (status, body).
fn http_get(ns: &NetNs, path: &str) -> std::io::Result<(u16, String)> {
    common::http_get(&ns.name, HEALTH_PORT, path)
}

/// Polls `path` until its status is `status`; returns the body.
/// Waits for `status` on `path`; for a 503 also for the refusal itself, since readiness is
/// 503 ("not in sync yet") for a moment before the preflight check has run.
fn wait_status(ns: &NetNs, agent: &Agent, path: &str, status: u16, within: Duration) -> String {
    let start = Instant::now();
    loop {
        let got = http_get(ns, path);
        if let Ok((s, body)) = &got {
            if *s == status && (status != 503 || body.contains("refused to run")) {
                return body.clone();
            }
        }
        assert!(
            start.elapsed() < within,
            "{path} never answered {status} (last {got:?}); log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn run_without_health_exits_3_naming_what_it_found() {
    let (ns, ipvlan) = vlan_node();
    let dir = TempDir::new("pf-exit");
    let mut agent = start_agent(&ns, &dir, &[("FELIX_HEALTHENABLED", "false")]);
    let status = agent.wait_exit(Duration::from_secs(20));
    let log = agent.log();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("bypasses host netfilter"), "{log}");
    assert!(log.contains("mac0 (macvlan)"), "{log}");
    if ipvlan {
        assert!(log.contains("ipv0 (ipvlan)"), "{log}");
    }
    assert!(log.contains("FELIX_PREFLIGHTOVERRIDE=true"), "{log}");
    // Nothing was programmed.
    let save = ns.exec_ok(&["iptables-legacy-save", "-t", "filter"]);
    assert!(!save.contains("cali-"), "{save}");
}

#[test]
fn run_with_health_stays_up_not_ready_and_starts_once_the_node_is_fixed() {
    let ns = bridged_node();
    let dir = TempDir::new("pf-health");
    let vars = [("FELIX_HEALTHENABLED", "true")];

    // Refused: 503 with the reason, live, exit 3 on SIGTERM.
    let mut agent = start_agent(&ns, &dir, &vars);
    let body = wait_status(&ns, &agent, "/readiness", 503, Duration::from_secs(20));
    assert!(body.contains("refused to run"), "{body}");
    assert!(body.contains("br0"), "{body}");
    assert!(body.contains("cali82111e10a96"), "{body}");
    let (live, why) = http_get(&ns, "/liveness").unwrap();
    assert_eq!(live, 200, "{why}");
    assert_eq!(agent.terminate().code(), Some(3), "{}", agent.log());
    drop(agent);

    // Refused again; the pod interface leaves the bridge and the agent starts by itself.
    let mut agent = start_agent(&ns, &dir, &vars);
    wait_status(&ns, &agent, "/readiness", 503, Duration::from_secs(20));
    ns.sh_ok("ip link set cali82111e10a96 nomaster");
    wait_status(&ns, &agent, "/readiness", 200, Duration::from_secs(40));
    assert!(
        agent.log().contains("the preflight checks pass now"),
        "{}",
        agent.log()
    );
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}

#[test]
fn override_runs_anyway_with_a_warning() {
    let (ns, _) = vlan_node();
    let dir = TempDir::new("pf-override");
    let mut agent = start_agent(
        &ns,
        &dir,
        &[
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_PREFLIGHTOVERRIDE", "true"),
        ],
    );
    wait_status(&ns, &agent, "/readiness", 200, Duration::from_secs(30));
    let log = agent.log();
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("running although"), "{log}");
    assert!(log.contains("mac0 (macvlan)"), "{log}");
    let save = ns.exec_ok(&["iptables-legacy-save", "-t", "filter"]);
    assert!(save.contains("cali-FORWARD"), "{save}");
    assert_eq!(agent.terminate().code(), Some(0), "{log}");
}

/// A node as calico-node's felix leaves it, in iptables-nft mode: its static chains in `raw`
/// and `nat`, its host-endpoint chain and a `cali-FORWARD` of its own (rules hashed `cali:`,
/// not ours), its IP-pool set, and its health server on 127.0.0.1:9099.
fn felix_node() -> NetNs {
    let ns = NetNs::new("pf-felix");
    ns.sh_ok(
        "set -e
         printf '%s\\n' '*raw' ':cali-PREROUTING - [0:0]' \
           '-A PREROUTING -m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING' 'COMMIT' \
           '*nat' ':cali-nat-outgoing - [0:0]' ':cali-POSTROUTING - [0:0]' \
           '-A POSTROUTING -m comment --comment \"cali:O3lYWMrLQYEMJtB5\" -j cali-POSTROUTING' 'COMMIT' \
           '*filter' ':cali-FORWARD - [0:0]' ':cali-from-host-endpoint - [0:0]' \
           '-A FORWARD -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD' \
           '-A cali-FORWARD -m comment --comment \"cali:vjrMJCRpqwy5oRoX\" -j MARK --set-xmark 0x0/0xe0000' \
           'COMMIT' | iptables-nft-restore --noflush
         ipset create cali40all-ipam-pools hash:net
         ipset add cali40all-ipam-pools 10.244.0.0/16",
    );
    ns
}

#[test]
fn felix_on_the_node_is_refused_naming_what_says_so() {
    let ns = felix_node();
    // Felix's health server holds the port ours would bind.
    let mut felix_health = std::process::Command::new("ip");
    felix_health.args([
        "netns",
        "exec",
        &ns.name,
        "python3",
        "-c",
        "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',9099))\ns.listen()\ntime.sleep(60)",
    ]);
    let mut holder = felix_health.spawn().expect("start the port holder");
    let dir = TempDir::new("pf-felix");
    let started = Instant::now();
    while common::http_get(&ns.name, HEALTH_PORT, "/").is_err()
        && started.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // iptables-save's rules without its dated comment lines.
    let save = |ns: &NetNs| -> String {
        ns.exec_ok(&["iptables-nft-save"])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let before = save(&ns);

    // Without a health server (a command line): refused at once, status 3.
    let mut agent = start_agent(
        &ns,
        &dir,
        &[
            ("FELIX_HEALTHENABLED", "false"),
            ("FELIX_IPTABLESBACKEND", "nft"),
        ],
    );
    let status = agent.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "{}", agent.log());
    drop(agent);

    // As deployed (health server on): idle, not a crash loop (issue 37). Felix holds the
    // health port, so kubelet's probes would reach felix's.
    let mut agent = start_agent(
        &ns,
        &dir,
        &[
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_IPTABLESBACKEND", "nft"),
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.log();
    assert!(agent.running(), "exited beside felix: {log}");
    assert!(
        log.contains("felix (calico-node) runs on this node"),
        "{log}"
    );
    assert!(log.contains("the health port is taken"), "{log}");
    for found in [
        "iptables-nft-save: chain cali-PREROUTING in table raw",
        "iptables-nft-save: chain cali-nat-outgoing in table nat",
        "iptables-nft-save: chain cali-from-host-endpoint in table filter",
        "IP set cali40all-ipam-pools",
    ] {
        assert!(log.contains(found), "{found} not named: {log}");
    }
    // Nothing programmed: felix's state is as it was (nothing of ours added, nothing of
    // felix's removed).
    assert_eq!(save(&ns), before);
    // Felix stops, its state stays: the idle agent takes the health port and says why it is
    // not ready.
    let _ = holder.kill();
    let _ = holder.wait();
    let started = Instant::now();
    let body = loop {
        if let Ok((503, body)) = http_get(&ns, "/readiness") {
            if body.contains("idle: ") {
                break body;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the idle agent never served its readiness; log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("felix"), "{body}");
    assert!(agent.running(), "{}", agent.log());
    assert_eq!(save(&ns), before);
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());

    // The uninstall DaemonSet's question: cleanup may not run here.
    let out = ns.exec(&[env!("CARGO_BIN_EXE_netpol-agent"), "cleanup", "--check"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(save(&ns), before);

    // cleanup removes nothing where felix's names are everywhere.
    let out = ns.exec(&[
        env!("CARGO_BIN_EXE_netpol-agent"),
        "cleanup",
        "--iptables-backend",
        "nft",
        "--ipv6-support",
        "false",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cleanup refused"));
    assert_eq!(save(&ns), before);

    // The operator who knows it is leftover state overrides; the agent then runs.
    let mut agent = start_agent(
        &ns,
        &dir,
        &[
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_IPTABLESBACKEND", "nft"),
            ("FELIX_PREFLIGHTOVERRIDE", "true"),
        ],
    );
    wait_status(&ns, &agent, "/readiness", 200, Duration::from_secs(30));
    assert!(agent.log().contains("running although"), "{}", agent.log());
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}
