//! kube-proxy IPVS mode through the binary, offline (issue 21): `compile --kube-ipvs
//! --host-address` renders the this-host set the agent fills from the node; `audit` over those
//! dumps knows our IPVS chains (detected from the dump under `auto`) and names a missing set;
//! `explain --kernel --service-ip` follows a Service connection through `INPUT` (tagged) and
//! `OUTPUT` (judged, with the mark `INPUT` set) and agrees with the policies, and says loudly
//! that rules without IPVS support get it wrong (the "before" of issue 21).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

/// A client and a server on node-1, a policy letting the client reach the server's http port
/// only, and an egress policy naming the server pods by selector (which, judged before IPVS
/// rewrote the ClusterIP, blocks the Service).
const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: x, labels: {app: client}}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: x, labels: {app: server}}
spec:
  nodeName: node-1
  containers:
  - name: c
    ports: [{name: http, containerPort: 8080}]
status: {phase: Running, podIP: 10.0.1.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
"#;

fn netpol(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `compile` for node-1 into two files; `extra` adds flags.
fn compile(dir: &TempDir, m: &Path, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let (t, s) = (
        dir.path.join(format!("{name}.iptables")),
        dir.path.join(format!("{name}.ipset")),
    );
    let (ms, ts, ss) = (
        m.display().to_string(),
        t.display().to_string(),
        s.display().to_string(),
    );
    let mut args = vec![
        "compile",
        "--manifests",
        &ms,
        "--node",
        "node-1",
        "--iptables-out",
        &ts,
        "--ipsets-out",
        &ss,
    ];
    args.extend_from_slice(extra);
    let out = netpol(&args);
    assert!(out.status.success(), "{}", text(&out));
    (t, s)
}

fn saved(t: &Path, s: &Path) -> Vec<String> {
    vec![
        "--manifests".into(),
        String::new(),
        "--iptables-save".into(),
        t.display().to_string(),
        "--ipset-save".into(),
        s.display().to_string(),
    ]
}

fn run(m: &Path, cmd: &str, t: &Path, s: &Path, extra: &[&str]) -> (i32, String) {
    let mut args: Vec<String> = vec![cmd.into(), "--node".into(), "node-1".into()];
    let mut dumps = saved(t, s);
    dumps[1] = m.display().to_string();
    args.extend(dumps);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = netpol(&refs);
    (out.status.code().unwrap_or(-1), text(&out))
}

#[test]
fn compile_renders_the_this_host_set_from_host_addresses() {
    let dir = TempDir::new("ipvs-compile");
    let m = dir.path.join("cluster.yaml");
    std::fs::write(&m, CLUSTER).unwrap();
    let hosts = [
        "--kube-ipvs",
        "--host-address",
        "192.168.7.1",
        "--host-address",
        "fd00::7",
        "--host-address",
        "127.0.0.1",
    ];
    let (_, s) = compile(&dir, &m, "v4", &hosts);
    let sets = std::fs::read_to_string(&s).unwrap();
    assert!(sets.contains("create cali40this-host hash:net"), "{sets}");
    assert!(sets.contains("add cali40this-host 192.168.7.1\n"), "{sets}");
    assert!(sets.contains("add cali40this-host 127.0.0.1\n"), "{sets}");
    assert!(
        !sets.contains("fd00::7"),
        "IPv6 address in the IPv4 set: {sets}"
    );

    let mut v6 = hosts.to_vec();
    v6.push("--ipv6");
    let (_, s6) = compile(&dir, &m, "v6", &v6);
    let sets6 = std::fs::read_to_string(&s6).unwrap();
    assert!(sets6.contains("add cali60this-host fd00::7\n"), "{sets6}");
    assert!(!sets6.contains("192.168.7.1"), "{sets6}");

    // Without addresses the set is there, empty (what compile rendered before the flag).
    let (_, s0) = compile(&dir, &m, "none", &["--kube-ipvs"]);
    let sets0 = std::fs::read_to_string(&s0).unwrap();
    assert!(sets0.contains("create cali40this-host hash:net"), "{sets0}");
    assert!(!sets0.contains("add cali40this-host"), "{sets0}");
}

#[test]
fn audit_and_explain_understand_the_ipvs_rules() {
    let dir = TempDir::new("ipvs-inspect");
    let m = dir.path.join("cluster.yaml");
    std::fs::write(&m, CLUSTER).unwrap();
    let (t, s) = compile(
        &dir,
        &m,
        "ipvs",
        &["--kube-ipvs", "--host-address", "192.168.7.1"],
    );

    // audit under `auto` (no setting): IPVS mode read from the dump, every chain ours.
    let (code, out) = run(&m, "audit", &t, &s, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node node-1: clean (IPv4)"), "{out}");
    assert!(out.contains("cali-forward-check"), "{out}");
    assert!(out.contains("kube-proxy IPVS"), "{out}");
    // Told IPVS is off, the same dump is drift: the chains are ours but not wanted.
    let (code, out) = run(&m, "audit", &t, &s, &["--kube-ipvs", "false"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cali-forward-check"), "{out}");
    // The this-host set gone: a finding.
    let sets = std::fs::read_to_string(&s).unwrap();
    let s2 = dir.path.join("no-this-host.ipset");
    let without: String = sets
        .lines()
        .filter(|l| !l.contains("cali40this-host"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without, sets);
    std::fs::write(&s2, without).unwrap();
    let (code, out) = run(&m, "audit", &t, &s2, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cali40this-host"), "{out}");

    // explain: client -> ClusterIP 10.96.0.10 -> server, through INPUT and OUTPUT.
    let flow = |port: &str, t: &Path, extra: &[&str]| {
        let mut a = vec![
            "--from",
            "x/client",
            "--to",
            "x/server",
            "--port",
            port,
            "--kernel",
            "--service-ip",
            "10.96.0.10",
        ];
        a.extend_from_slice(extra);
        run(&m, "explain", t, &s, &a)
    };
    let (code, out) = flow("8080", &t, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("INPUT: 10.0.1.1 -> 10.96.0.10 tcp 8080"),
        "{out}"
    );
    assert!(out.contains("cali-forward-check"), "{out}");
    assert!(
        out.contains("OUTPUT: 10.0.1.1 -> 10.0.1.2 tcp 8080"),
        "{out}"
    );
    assert!(out.contains("(enters with mark 0x"), "{out}");
    assert!(out.contains("cali-forward-endpoint-mark"), "{out}");
    assert!(
        out.contains("kernel: ALLOW, as the policies say for egress of x/client and ingress of x/server: they agree"),
        "{out}"
    );
    // A port the server's ingress policy does not allow: dropped in OUTPUT, as the policies say.
    let (code, out) = flow("80", &t, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("kernel: DENY, as the policies say"), "{out}");

    // The "before": rules without IPVS support on a node in IPVS mode. INPUT judges the
    // client's egress policy against the ClusterIP (no pod), so the Service is blocked.
    let (tb, _) = compile(&dir, &m, "before", &[]);
    let (code, out) = flow("8080", &tb, &["--kube-ipvs", "true"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("!!! THE KERNEL DISAGREES WITH THE POLICIES !!!"),
        "{out}"
    );
    assert!(
        out.contains("DROPS this flow, but the policies say allow"),
        "{out}"
    );
}
