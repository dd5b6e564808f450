//! The configuration through the real binary: each `FELIX_*` variable changes what it
//! should (`compile` for the variables that shape rules and sets; `run` inside a network
//! namespace for the agent's own), and an invalid value of any of them stops the program
//! with status 2 and a message naming the variable, the flag and the accepted values.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, NetNs, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/demo")
}

/// The binary with no `FELIX_*` or `NODENAME` from the test's own environment.
fn bin() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// `compile` of the demo for node-1 with these variables; (stdout, stderr).
fn compile_with(vars: &[(&str, &str)], extra: &[&str]) -> (String, String) {
    let mut cmd = bin();
    cmd.args(["compile", "--manifests"]).arg(demo());
    if !vars.iter().any(|(k, _)| *k == "FELIX_FELIXHOSTNAME") {
        cmd.args(["--node", "node-1"]);
    }
    cmd.args(extra);
    cmd.envs(vars.iter().copied());
    let out = cmd.output().expect("run compile");
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success(),
        "compile with {vars:?} failed: {stderr}"
    );
    (stdout, stderr)
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn lines_matching<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

// ---------------------------------------------------------------- compile: rules and sets

#[test]
fn mark_mask_moves_every_mark_bit() {
    let (default, _) = compile_with(&[], &[]);
    assert!(default.contains("--mark 0x10000/0x10000"));
    // Lowest bits of 0xf00: accept 0x100, pass 0x200, scratch0 0x400, scratch1 0x800.
    let (moved, _) = compile_with(&[("FELIX_IPTABLESMARKMASK", "0xf00")], &[]);
    assert!(moved.contains("--mark 0x100/0x100"), "{moved}");
    assert!(
        moved.contains("--set-xmark 0x0/0x300"),
        "accept+pass cleared: {moved}"
    );
    assert!(!moved.contains("0x10000"), "{moved}");
    // Decimal works as well as hex (felix parses with base 0).
    let (decimal, _) = compile_with(&[("FELIX_IPTABLESMARKMASK", "3840")], &[]);
    assert_eq!(decimal, moved);
}

#[test]
fn chain_insert_mode_inserts_or_appends_our_jumps() {
    let (insert, _) = compile_with(&[], &[]);
    assert!(insert.contains("\n-I FORWARD 1 "), "{insert}");
    let (append, _) = compile_with(&[("FELIX_CHAININSERTMODE", "Append")], &[]);
    assert!(!append.contains("-I FORWARD"), "{append}");
    assert!(
        append
            .lines()
            .any(|l| l.starts_with("-A FORWARD") && l.ends_with("-j cali-FORWARD")),
        "{append}"
    );
}

#[test]
fn filter_deny_action_reject_replaces_drop() {
    let (drop, _) = compile_with(&[], &[]);
    let unknown = lines_matching(&drop, "Unknown interface");
    assert!(!unknown.is_empty() && unknown.iter().all(|l| l.ends_with("-j DROP")));
    let (reject, _) = compile_with(&[("FELIX_IPTABLESFILTERDENYACTION", "REJECT")], &[]);
    // iptables-save prints REJECT's default option.
    let rejected = |l: &&str| l.ends_with("-j REJECT --reject-with icmp-port-unreachable");
    let unknown = lines_matching(&reject, "Unknown interface");
    assert!(
        !unknown.is_empty() && unknown.iter().all(rejected),
        "{unknown:?}"
    );
    let no_policy = lines_matching(&reject, "Drop if no");
    assert!(!no_policy.is_empty() && no_policy.iter().all(rejected));
    // Only the anti-spoofing rule still drops: an ICMP error to a forged source would go to
    // the pod whose address was forged.
    assert!(
        reject
            .lines()
            .filter(|l| l.contains("-j DROP"))
            .all(|l| l.contains("not the workload address")),
        "{reject}"
    );
}

#[test]
fn deny_log_variables_put_a_log_rule_before_every_policy_drop() {
    let (off, _) = compile_with(&[], &[]);
    assert!(!off.contains("NFLOG"), "off means no log rule: {off}");
    let vars = [
        ("FELIX_DENYLOGENABLED", "yes"),
        ("FELIX_DENYLOGNFLOGGROUP", "33"),
        ("FELIX_DENYLOGRATE", "120/minute"),
        ("FELIX_DENYLOGBURST", "7"),
        // Run-only settings are accepted and change nothing compile renders.
        ("FELIX_DENYLOGDEDUPWINDOW", "2"),
    ];
    let (on, _) = compile_with(&vars, &[]);
    let lines: Vec<&str> = on.lines().collect();
    let mut logged = 0;
    for (i, line) in lines.iter().enumerate() {
        let drop = line.contains("Drop if no policies passed packet")
            || line.contains("Unknown interface");
        if !drop || line.contains("NFLOG") {
            continue;
        }
        let log = lines[i - 1];
        assert!(
            log.contains("-m limit --limit 2/sec --limit-burst 7 -j NFLOG --nflog-prefix npa-")
                && log.ends_with("--nflog-group 33 --nflog-size 128"),
            "{log}\n{line}"
        );
        logged += 1;
    }
    assert!(logged >= 4, "{on}");
    // Everything else is what it was with logging off, hashes included.
    let without: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.contains("NFLOG"))
        .collect();
    assert_eq!(without, off.lines().collect::<Vec<_>>());
}

#[test]
fn filter_allow_action_return() {
    let (accept, _) = compile_with(&[], &[]);
    let explicit = lines_matching(&accept, "Policy explicitly accepted packet.");
    assert!(
        explicit.iter().all(|l| l.ends_with("-j ACCEPT")),
        "{explicit:?}"
    );
    let (ret, _) = compile_with(&[("FELIX_IPTABLESFILTERALLOWACTION", "return")], &[]);
    let explicit = lines_matching(&ret, "Policy explicitly accepted packet.");
    assert!(
        !explicit.is_empty() && explicit.iter().all(|l| l.ends_with("-j RETURN")),
        "{explicit:?}"
    );
}

#[test]
fn default_endpoint_to_host_action() {
    for (value, target) in [("ACCEPT", "ACCEPT"), ("DROP", "DROP"), ("return", "RETURN")] {
        let (out, _) = compile_with(&[("FELIX_DEFAULTENDPOINTTOHOSTACTION", value)], &[]);
        let rule = lines_matching(&out, "Configured DefaultEndpointToHostAction");
        assert_eq!(rule.len(), 1, "{out}");
        assert!(
            rule[0].ends_with(&format!("-j {target}")),
            "{value}: {rule:?}"
        );
    }
}

#[test]
fn interface_prefix_list_feeds_dispatch_and_names() {
    let (out, _) = compile_with(&[("FELIX_INTERFACEPREFIX", "veth,cali")], &[]);
    for dir in ["-i", "-o"] {
        for p in ["veth+", "cali+"] {
            assert!(
                out.lines()
                    .any(|l| l.starts_with("-A cali-FORWARD") && l.contains(&format!("{dir} {p}"))),
                "{dir} {p} missing"
            );
        }
    }
    // The first prefix names the pods' interfaces (calico scheme).
    assert!(out.contains(":cali-tw-veth"), "{out}");
    assert!(!out.contains(":cali-tw-cali"), "{out}");
}

#[test]
fn interface_name_scheme_static_reads_the_map_file() {
    let dir = TempDir::new("ifmap");
    let map = dir.path.join("map.yaml");
    std::fs::write(&map, "\"shop/web\": cali-web0\n\"shop/api\": cali-api0\n").unwrap();
    let (out, _) = compile_with(
        &[
            ("FELIX_INTERFACENAMESCHEME", "static"),
            ("FELIX_INTERFACEMAPFILE", map.to_str().unwrap()),
        ],
        &[],
    );
    assert!(out.contains(":cali-tw-cali-web0"), "{out}");
    assert!(out.contains(":cali-fw-cali-api0"), "{out}");
}

#[test]
fn bridge_interface_switches_to_bridge_port_matches() {
    let dir = TempDir::new("ifmap-br");
    let map = dir.path.join("map.yaml");
    std::fs::write(
        &map,
        "\"shop/web\": veth0a1b2c3d\n\"shop/api\": veth9f8e7d6c\n",
    )
    .unwrap();
    let vars = [
        ("FELIX_INTERFACENAMESCHEME", "static"),
        ("FELIX_INTERFACEMAPFILE", map.to_str().unwrap()),
        ("FELIX_INTERFACEPREFIX", "veth"),
    ];
    let (routed, _) = compile_with(&vars, &[]);
    assert!(!routed.contains("physdev"), "{routed}");
    let mut bridged_vars = vars.to_vec();
    bridged_vars.push(("FELIX_BRIDGEINTERFACE", "cni0"));
    let (bridged, _) = compile_with(&bridged_vars, &[]);
    let forward = lines_matching(&bridged, "-A cali-FORWARD ");
    assert!(
        forward
            .iter()
            .any(|l| l.contains("-m physdev --physdev-in veth+ -j cali-from-wl-dispatch"))
            && forward
                .iter()
                .any(|l| l.starts_with("-A cali-FORWARD -o cni0 ")),
        "{forward:?}"
    );
    assert!(
        bridged.contains(
            "-m physdev --physdev-out veth0a1b2c3d --physdev-is-bridged -g cali-tw-veth0a1b2c3d"
        ),
        "{bridged}"
    );
    assert!(
        bridged.contains("-A cali-to-wl-addr-dispatch -d 10.244.1.10/32 "),
        "{bridged}"
    );
    // The flag does the same; empty is routed mode.
    let (flag, _) = compile_with(&vars, &["--bridge-interface", "cni0"]);
    assert_eq!(flag, bridged);
    bridged_vars.pop();
    bridged_vars.push(("FELIX_BRIDGEINTERFACE", ""));
    let (empty, _) = compile_with(&bridged_vars, &[]);
    assert_eq!(empty, routed);
}

#[test]
fn max_ipset_size_is_every_sets_maxelem() {
    let (default, _) = compile_with(&[], &[]);
    assert!(lines_matching(&default, "create ")
        .iter()
        .all(|l| l.ends_with("maxelem 1048576")));
    let (small, _) = compile_with(&[("FELIX_MAXIPSETSIZE", "5000")], &[]);
    let creates = lines_matching(&small, "create ");
    assert!(!creates.is_empty() && creates.iter().all(|l| l.ends_with("maxelem 5000")));
}

#[test]
fn felix_hostname_chooses_the_local_pods() {
    let (node2, _) = compile_with(&[("FELIX_FELIXHOSTNAME", "node-2")], &[]);
    let (node1, _) = compile_with(&[], &[]);
    let tw = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with(":cali-tw-"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(tw(&node2).len(), 2);
    assert_ne!(tw(&node1), tw(&node2));
}

#[test]
fn log_severity_and_format() {
    let (_, info) = compile_with(&[], &[]);
    assert!(info.contains("compiled"), "{info}");
    let (_, error) = compile_with(&[("FELIX_LOGSEVERITYSCREEN", "Error")], &[]);
    assert!(!error.contains("compiled"), "{error}");
    let (_, debug) = compile_with(&[("FELIX_LOGSEVERITYSCREEN", "debug")], &[]);
    assert!(debug.contains("compiled"));
    for fatal in ["Fatal", "PANIC"] {
        let (_, quiet) = compile_with(&[("FELIX_LOGSEVERITYSCREEN", fatal)], &[]);
        assert!(!quiet.contains("compiled"));
    }

    let (_, json) = compile_with(&[("FELIX_LOGFORMAT", "json")], &[]);
    let mut seen = false;
    for line in json.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("timestamp").is_some(),
            "{line}"
        );
        if v.get("message").and_then(|m| m.as_str()) == Some("compiled") {
            seen = true;
            assert_eq!(v["local_endpoints"], 2, "{line}");
        }
    }
    assert!(seen, "{json}");
}

// ---------------------------------------------------------------- invalid values

/// Runs `run` with one bad variable (nothing reaches the kernel: the configuration is
/// checked first) and checks status 2 and the message.
fn rejects(var: &str, value: &str, flag: &str, accepted: &str, extra: &[(&str, &str)]) {
    // Should the configuration pass by mistake, the missing directory stops the agent
    // before it reads or writes the kernel.
    let out = bin()
        .arg("run")
        .env("FELIX_DATASTORETYPE", "dir:/nonexistent-npa-dir")
        .env(var, value)
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{var}={value:?}: status {:?}, stderr {stderr}",
        out.status
    );
    assert!(stdout.is_empty(), "{stdout}");
    for needle in [var, flag, accepted] {
        assert!(
            stderr.contains(needle),
            "{var}={value:?}: {needle:?} missing from {stderr:?}"
        );
    }
}

#[test]
fn every_invalid_value_exits_2_naming_the_variable_and_accepted_values() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "FELIX_INTERFACEPREFIX",
            ",",
            "--interface-prefix",
            "comma-separated list",
        ),
        (
            "FELIX_INTERFACEPREFIX",
            "muchtoolongprefix",
            "--interface-prefix",
            "comma-separated list",
        ),
        (
            "FELIX_INTERFACENAMESCHEME",
            "kernel",
            "--interface-name-scheme",
            "calico, sandbox, static",
        ),
        (
            "FELIX_IPTABLESREFRESHINTERVAL",
            "10s",
            "--iptables-refresh-interval",
            "seconds ≥ 0",
        ),
        (
            "FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS",
            "0.001",
            "--iptables-post-write-check-interval-secs",
            "seconds ≥ 0.05",
        ),
        (
            "FELIX_IPSETSREFRESHINTERVAL",
            "-5",
            "--ipsets-refresh-interval",
            "seconds ≥ 0",
        ),
        (
            "FELIX_DATAPLANEWATCHDOGTIMEOUT",
            "0",
            "--dataplane-watchdog-timeout",
            "seconds > 0",
        ),
        (
            "FELIX_IPTABLESMARKMASK",
            "0x1",
            "--iptables-mark-mask",
            "at least 4 bits",
        ),
        (
            "FELIX_IPTABLESMARKMASK",
            "ffff0000",
            "--iptables-mark-mask",
            "0xffff0000",
        ),
        (
            "FELIX_CHAININSERTMODE",
            "middle",
            "--chain-insert-mode",
            "insert, append",
        ),
        (
            "FELIX_DEFAULTENDPOINTTOHOSTACTION",
            "ALLOW",
            "--default-endpoint-to-host-action",
            "ACCEPT, DROP, RETURN",
        ),
        (
            "FELIX_IPTABLESFILTERALLOWACTION",
            "DROP",
            "--iptables-filter-allow-action",
            "ACCEPT, RETURN",
        ),
        (
            "FELIX_IPTABLESFILTERDENYACTION",
            "ACCEPT",
            "--iptables-filter-deny-action",
            "DROP, REJECT",
        ),
        (
            "FELIX_IPTABLESBACKEND",
            "iptables",
            "--iptables-backend",
            "legacy, nft, auto",
        ),
        (
            "FELIX_IPV6SUPPORT",
            "maybe",
            "--ipv6-support",
            "true or false",
        ),
        (
            "FELIX_MAXIPSETSIZE",
            "0",
            "--max-ipset-size",
            "from 1 to 4294967295",
        ),
        (
            "FELIX_MAXIPSETSIZE",
            "lots",
            "--max-ipset-size",
            "from 1 to 4294967295",
        ),
        (
            "FELIX_LOGSEVERITYSCREEN",
            "Verbose",
            "--log-severity-screen",
            "debug, info, warning, error, fatal, panic",
        ),
        ("FELIX_LOGFORMAT", "xml", "--log-format", "text, json"),
        (
            "FELIX_PROMETHEUSMETRICSENABLED",
            "on",
            "--prometheus-metrics-enabled",
            "true or false",
        ),
        (
            "FELIX_PROMETHEUSMETRICSPORT",
            "70000",
            "--prometheus-metrics-port",
            "0 to 65535",
        ),
        (
            "FELIX_PROMETHEUSMETRICSHOST",
            "not a host",
            "--prometheus-metrics-host",
            "IP address or host name",
        ),
        (
            "FELIX_HEALTHENABLED",
            "enabled",
            "--health-enabled",
            "true or false",
        ),
        ("FELIX_HEALTHPORT", "http", "--health-port", "0 to 65535"),
        (
            "FELIX_HEALTHHOST",
            "bad host!",
            "--health-host",
            "IP address or host name",
        ),
        (
            "FELIX_DATASTORETYPE",
            "etcdv3",
            "--datastore",
            "kubernetes, or dir:PATH",
        ),
        (
            "FELIX_DATASTORETYPE",
            "dir:",
            "--datastore",
            "kubernetes, or dir:PATH",
        ),
        (
            "FELIX_CRIENDPOINT",
            "tcp://127.0.0.1:10010",
            "--cri-endpoint",
            "CRI unix socket",
        ),
        (
            "FELIX_CRIENDPOINT",
            "run/containerd/containerd.sock",
            "--cri-endpoint",
            "absolute path",
        ),
        (
            "FELIX_CRIREFRESHINTERVAL",
            "10s",
            "--cri-refresh-interval",
            "seconds ≥ 0",
        ),
        (
            "FELIX_DENYLOGENABLED",
            "on",
            "--deny-log-enabled",
            "true or false",
        ),
        (
            "FELIX_DENYLOGNFLOGGROUP",
            "70000",
            "--deny-log-nflog-group",
            "0 to 65535",
        ),
        (
            "FELIX_DENYLOGRATE",
            "5/fortnight",
            "--deny-log-rate",
            "N/sec, N/min",
        ),
        (
            "FELIX_DENYLOGRATE",
            "20000",
            "--deny-log-rate",
            "at most 10000/sec",
        ),
        (
            "FELIX_DENYLOGBURST",
            "0",
            "--deny-log-burst",
            "from 1 to 10000",
        ),
        (
            "FELIX_DENYLOGDEDUPWINDOW",
            "0",
            "--deny-log-dedup-window",
            "seconds > 0",
        ),
        (
            "FELIX_POLICYCOUNTERSENABLED",
            "maybe",
            "--policy-counters-enabled",
            "true or false",
        ),
        (
            "FELIX_POLICYCOUNTERSINTERVAL",
            "-1",
            "--policy-counters-interval",
            "seconds > 0",
        ),
        (
            "FELIX_CONNTRACKREEVALUATE",
            "sometimes",
            "--conntrack-reevaluate",
            "true or false",
        ),
        (
            "FELIX_CONNTRACKREEVALUATEINTERVAL",
            "0",
            "--conntrack-reevaluate-interval",
            "seconds > 0",
        ),
        (
            "FELIX_FLOWLOGSFILEMAXFILES",
            "0",
            "--flow-logs-file-max-files",
            "from 1 to 1000",
        ),
        (
            "FELIX_FLOWLOGSFILEMAXFILESIZEMB",
            "1GB",
            "--flow-logs-file-max-file-size-mb",
            "from 1 to 10000",
        ),
        (
            "FELIX_FLOWLOGSFILEENABLED",
            "maybe",
            "--flow-logs-file-enabled",
            "true or false",
        ),
    ];
    for (var, value, flag, accepted) in cases {
        rejects(var, value, flag, accepted, &[]);
    }
    // A scheme that needs a map file names the map-file variable.
    rejects(
        "FELIX_INTERFACENAMESCHEME",
        "static",
        "--interface-map-file",
        "FELIX_INTERFACEMAPFILE",
        &[],
    );
    // A rate and burst whose token bucket overflows the kernel's 32 bits.
    rejects(
        "FELIX_DENYLOGBURST",
        "3",
        "--deny-log-rate",
        "overflows the kernel's token bucket",
        &[
            ("FELIX_DENYLOGENABLED", "true"),
            ("FELIX_DENYLOGRATE", "1/day"),
        ],
    );
    // The file target without flow logs would never write.
    rejects(
        "FELIX_FLOWLOGSFILEENABLED",
        "true",
        "--flow-logs-file-enabled",
        "needs FELIX_FLOWLOGSENABLED",
        &[],
    );
    rejects(
        "FELIX_BRIDGEINTERFACE",
        "cni0/x",
        "--bridge-interface",
        "the name of a Linux bridge",
        &[],
    );
    // The bridge scheme needs the bridge.
    rejects(
        "FELIX_INTERFACENAMESCHEME",
        "bridge",
        "--bridge-interface",
        "FELIX_BRIDGEINTERFACE",
        &[],
    );
    rejects(
        "FELIX_INTERFACEMAPFILE",
        "/nonexistent/npa-map.yaml",
        "FELIX_INTERFACENAMESCHEME",
        "npa-map.yaml",
        &[("FELIX_INTERFACENAMESCHEME", "static")],
    );
}

#[test]
fn a_bad_flag_value_names_the_flag_and_the_variable() {
    let out = bin()
        .args(["compile", "--manifests", "x", "--node", "n"])
        .args(["--chain-insert-mode", "sideways"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("flag --chain-insert-mode (environment variable FELIX_CHAININSERTMODE)")
            && stderr.contains("accepted values: insert, append"),
        "{stderr}"
    );
}

#[test]
fn help_documents_every_variable_and_default() {
    let out = bin().args(["run", "--help"]).output().unwrap();
    let (help, _) = texts(&out);
    for var in [
        "FELIX_DATASTORETYPE",
        "NODENAME",
        "FELIX_FELIXHOSTNAME",
        "FELIX_INTERFACEPREFIX",
        "FELIX_INTERFACENAMESCHEME",
        "FELIX_INTERFACEMAPFILE",
        "FELIX_BRIDGEINTERFACE",
        "FELIX_CRIENDPOINT",
        "FELIX_CRIREFRESHINTERVAL",
        "FELIX_IPTABLESREFRESHINTERVAL",
        "FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS",
        "FELIX_IPSETSREFRESHINTERVAL",
        "FELIX_DATAPLANEWATCHDOGTIMEOUT",
        "FELIX_IPTABLESMARKMASK",
        "FELIX_CHAININSERTMODE",
        "FELIX_DEFAULTENDPOINTTOHOSTACTION",
        "FELIX_IPTABLESFILTERALLOWACTION",
        "FELIX_IPTABLESFILTERDENYACTION",
        "FELIX_IPTABLESBACKEND",
        "FELIX_IPV6SUPPORT",
        "FELIX_MAXIPSETSIZE",
        "FELIX_LOGSEVERITYSCREEN",
        "FELIX_LOGFORMAT",
        "FELIX_PROMETHEUSMETRICSENABLED",
        "FELIX_PROMETHEUSMETRICSHOST",
        "FELIX_PROMETHEUSMETRICSPORT",
        "FELIX_HEALTHENABLED",
        "FELIX_HEALTHHOST",
        "FELIX_HEALTHPORT",
        "FELIX_DENYLOGENABLED",
        "FELIX_DENYLOGNFLOGGROUP",
        "FELIX_DENYLOGRATE",
        "FELIX_DENYLOGBURST",
        "FELIX_DENYLOGDEDUPWINDOW",
        "FELIX_POLICYCOUNTERSENABLED",
        "FELIX_POLICYCOUNTERSINTERVAL",
        "FELIX_CONNTRACKREEVALUATE",
        "FELIX_CONNTRACKREEVALUATEINTERVAL",
        "FELIX_FLOWLOGSFILEENABLED",
        "FELIX_FLOWLOGSFILEDIRECTORY",
        "FELIX_FLOWLOGSFILEMAXFILES",
        "FELIX_FLOWLOGSFILEMAXFILESIZEMB",
    ] {
        assert!(
            help.contains(&format!("[env: {var}=]")),
            "{var} missing from help"
        );
    }
    for default in [
        "[default: kubernetes]",
        "[default: 9091]",
        "[default: 9099]",
        "[default: 0xffff0000]",
        "[default: /run/containerd/containerd.sock]",
    ] {
        assert!(help.contains(default), "{default} missing from help");
    }
}

// ---------------------------------------------------------------- run, in a network namespace

/// `run` inside `ns` configured only through the environment.
fn start_agent(ns: &NetNs, log: &Path, vars: &[(&str, &str)]) -> Agent {
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run"]).envs(vars.iter().copied());
    Agent::spawn(cmd, log)
}

fn our_chains(save: &str) -> Vec<String> {
    let mut v: Vec<String> = save
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter(|l| l.starts_with("cali-"))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect();
    v.sort();
    v
}

/// The chains `compile` renders for `node` (IPv4).
fn compiled_chains(dir: &Path, node: &str) -> Vec<String> {
    let out = bin()
        .args(["compile", "--node", node, "--manifests"])
        .arg(dir)
        .output()
        .unwrap();
    our_chains(&String::from_utf8_lossy(&out.stdout))
}

fn manifests() -> TempDir {
    let dir = TempDir::new("cfg-manifests");
    for f in ["cluster.yaml", "policies.yaml"] {
        std::fs::copy(demo().join(f), dir.path.join(f)).unwrap();
    }
    dir
}

#[test]
fn run_honours_datastore_node_name_backend_and_ipv6_variables() {
    let dir = manifests();
    let logs = TempDir::new("cfg-logs");
    let datastore = format!("dir:{}", dir.path.display());
    let want_node2 = compiled_chains(&dir.path, "node-2");
    assert!(want_node2.iter().any(|c| c.starts_with("cali-tw-")));

    // NODENAME wins over FELIX_FELIXHOSTNAME; nft only; no IPv6.
    let ns = NetNs::new("cfg-run");
    let agent = start_agent(
        &ns,
        &logs.path.join("a.log"),
        &[
            ("FELIX_DATASTORETYPE", &datastore),
            ("NODENAME", "node-2"),
            ("FELIX_FELIXHOSTNAME", "node-1"),
            ("FELIX_IPTABLESBACKEND", "NFT"),
            ("FELIX_IPV6SUPPORT", "false"),
            ("FELIX_LOGFORMAT", "json"),
        ],
    );
    agent.wait_for(Duration::from_secs(15), "node-2's chains in nft", || {
        our_chains(&ns.exec_ok(&["iptables-nft-save", "-t", "filter"])) == want_node2
    });
    assert!(our_chains(&ns.exec_ok(&["ip6tables-nft-save", "-t", "filter"])).is_empty());
    assert!(our_chains(&ns.exec_ok(&["iptables-legacy-save", "-t", "filter"])).is_empty());
    assert!(
        !ns.exec_ok(&["ipset", "list", "-n"]).contains("cali60"),
        "no IPv6 sets"
    );
    let log = agent.log();
    let running = log
        .lines()
        .find(|l| l.contains("netpol-agent running"))
        .unwrap_or_else(|| panic!("{log}"));
    let v: serde_json::Value = serde_json::from_str(running).expect("JSON log line");
    assert_eq!(v["node"], "node-2");
    assert_eq!(v["datastore"], datastore.as_str());
    drop(agent);

    // Without NODENAME, FELIX_FELIXHOSTNAME names the node.
    let ns = NetNs::new("cfg-run2");
    let agent = start_agent(
        &ns,
        &logs.path.join("b.log"),
        &[
            ("FELIX_DATASTORETYPE", &datastore),
            ("FELIX_FELIXHOSTNAME", "node-2"),
            ("FELIX_IPTABLESBACKEND", "legacy"),
            ("FELIX_IPV6SUPPORT", "0"),
        ],
    );
    agent.wait_for(Duration::from_secs(15), "node-2's chains in legacy", || {
        our_chains(&ns.exec_ok(&["iptables-legacy-save", "-t", "filter"])) == want_node2
    });
}

/// Tampers with a chain and a set member once the agent has settled, and reports whether
/// each was repaired within `within`.
/// Whether the agent repairs a flushed chain of ours and a deleted set member within
/// `within`, with `vars` on top of a legacy-backend agent.
fn repaired(vars: &[(&str, &str)], within: Duration) -> (bool, bool) {
    repaired_on("legacy", vars, within)
}

fn repaired_on(backend: &str, vars: &[(&str, &str)], within: Duration) -> (bool, bool) {
    let dir = manifests();
    let logs = TempDir::new("cfg-logs");
    let datastore = format!("dir:{}", dir.path.display());
    let ns = NetNs::new("cfg-refresh");
    let iptables = format!("iptables-{backend}");
    let save = format!("iptables-{backend}-save");
    let mut all = vec![
        ("FELIX_DATASTORETYPE", datastore.as_str()),
        ("NODENAME", "node-1"),
        ("FELIX_IPTABLESBACKEND", backend),
        ("FELIX_IPV6SUPPORT", "false"),
        ("FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS", "0.2"),
    ];
    all.extend_from_slice(vars);
    let agent = start_agent(&ns, &logs.path.join("agent.log"), &all);
    let want = compiled_chains(&dir.path, "node-1");
    let forward_rules = || {
        ns.exec_ok(&[&iptables, "-S", "cali-FORWARD"])
            .lines()
            .count()
    };
    agent.wait_for(Duration::from_secs(15), "converged", || {
        our_chains(&ns.exec_ok(&[&save, "-t", "filter"])) == want
    });
    // Past the post-write check, so only the refresh timers can repair.
    std::thread::sleep(Duration::from_millis(1500));
    let full = forward_rules();
    let (set, member) = ns
        .exec_ok(&["ipset", "save"])
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3 && w[0] == "add" && w[1].starts_with("cali40s:"))
                .then(|| (w[1].to_string(), w[2].to_string()))
        })
        .expect("a set member");
    ns.exec_ok(&[&iptables, "-F", "cali-FORWARD"]);
    ns.exec_ok(&["ipset", "del", &set, &member]);
    let has_member = || {
        ns.exec_ok(&["ipset", "list", &set])
            .lines()
            .any(|l| l.trim() == member)
    };
    let start = Instant::now();
    let (mut chain_ok, mut set_ok) = (false, false);
    while start.elapsed() < within && !(chain_ok && set_ok) {
        chain_ok = chain_ok || forward_rules() == full;
        set_ok = set_ok || has_member();
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(agent);
    (chain_ok, set_ok)
}

#[test]
fn refresh_intervals_repair_tampering_and_zero_disables_them() {
    // The change checks off, so only the refresh timers can repair.
    let checks_off = [
        ("FELIX_KERNELCHECKINTERVAL", "0"),
        ("FELIX_KERNELVERIFYINTERVAL", "0"),
    ];
    let within = Duration::from_secs(4);
    let with = |vars: &[(&'static str, &'static str)]| {
        let mut all = checks_off.to_vec();
        all.extend_from_slice(vars);
        all
    };
    assert_eq!(
        repaired(
            &with(&[
                ("FELIX_IPTABLESREFRESHINTERVAL", "1"),
                ("FELIX_IPSETSREFRESHINTERVAL", "0"),
            ]),
            within
        ),
        (true, false),
        "iptables refresh on, ipset refresh off"
    );
    assert_eq!(
        repaired(
            &with(&[
                ("FELIX_IPTABLESREFRESHINTERVAL", "0"),
                ("FELIX_IPSETSREFRESHINTERVAL", "0.5"),
            ]),
            within
        ),
        (false, true),
        "iptables refresh off, ipset refresh on"
    );
}

#[test]
fn change_checks_repair_tampering_without_refresh_timers_on_both_backends() {
    let timers_off = [
        ("FELIX_IPTABLESREFRESHINTERVAL", "0"),
        ("FELIX_IPSETSREFRESHINTERVAL", "0"),
    ];
    for backend in ["legacy", "nft"] {
        assert_eq!(
            repaired_on(backend, &timers_off, Duration::from_secs(3)),
            (true, true),
            "{backend}: the 1 s change checks (defaults) repair a flushed chain and a deleted member"
        );
        let mut off = timers_off.to_vec();
        off.push(("FELIX_KERNELCHECKINTERVAL", "0"));
        off.push(("FELIX_KERNELVERIFYINTERVAL", "0"));
        assert_eq!(
            repaired_on(backend, &off, Duration::from_secs(3)),
            (false, false),
            "{backend}: nothing repairs with every check and timer off"
        );
    }
}

// The configuration and metrics reference pages are generated from the code and checked by
// tests/docs.rs (configuration_reference_is_the_options_and_felix_table,
// metrics_reference_is_the_registry).

/// The start-up line names the version, the commit and every option's effective value; each
/// FELIX_* variable no option reads is named once, unknown ones apart from felix's.
#[test]
fn start_line_and_ignored_variables() {
    let out = bin()
        .args([
            "run",
            "--datastore",
            "dir:/nonexistent-npa-dir",
            "--node",
            "n1",
        ])
        .env("FELIX_IPTABLESREFRESHINTERAVL", "10")
        .env("FELIX_IPINIPENABLED", "true")
        .env("FELIX_CHAININSERTMODE", "append")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let start = log
        .lines()
        .find(|l| l.contains("netpol-agent starting"))
        .unwrap_or_else(|| panic!("no start line: {log}"));
    assert!(
        start.contains(concat!(
            "version=\"",
            env!("CARGO_PKG_VERSION"),
            " (commit "
        )),
        "{start}"
    );
    assert!(
        start.contains("FELIX_CHAININSERTMODE=append (env)"),
        "{start}"
    );
    assert!(
        start.contains("FELIX_IPTABLESREFRESHINTERVAL=300 "),
        "{start}"
    );
    assert!(
        start.contains("FELIX_WORKLOADSOURCESPOOFING=Disabled"),
        "{start}"
    );
    assert!(
        log.contains("ignoring unknown config param FELIX_IPTABLESREFRESHINTERAVL"),
        "{log}"
    );
    assert!(
        log.contains("ignoring config param FELIX_IPINIPENABLED: a felix parameter"),
        "{log}"
    );
    // With felix_params' reason, so the operator knows whether anything is lost.
    assert!(log.contains("the CNI does networking"), "{log}");
    assert_eq!(log.matches("FELIX_IPINIPENABLED:").count(), 1, "{log}");
    let version = bin().arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("(commit "), "{version}");
}

/// `auto` is resolved from the node by `run`; offline commands refuse it, naming why.
#[test]
fn auto_naming_is_refused_offline() {
    let dir = std::env::temp_dir().join(format!("npa-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = bin()
        .args(["compile", "--node", "n1", "--manifests"])
        .arg(&dir)
        .env("FELIX_INTERFACENAMESCHEME", "auto")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FELIX_INTERFACENAMESCHEME=auto"), "{err}");
}
