//! `explain` and `audit` through the binary, offline: hand-checked verdicts with their exit
//! status, text and JSON; bad input (unknown pod, broken manifest, invalid policy) exits 2
//! naming it; `--kernel` over saved dumps agrees with the policies and says loudly when a
//! tampered dump does not; `audit` over saved dumps is clean, and names each tampering.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: b}}
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
    ports: [{name: http, containerPort: 8080}, {name: dns, containerPort: 53, protocol: UDP}]
status: {phase: Running, podIP: 10.0.1.2}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: y, labels: {app: client}}
spec: {nodeName: node-2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.2.1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
  - from: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.2.0/24]}}]
    ports: [{protocol: UDP, port: 53}, {port: 9000, endPort: 9100}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}]
"#;

fn cluster(dir: &TempDir) -> PathBuf {
    let path = dir.path.join("cluster.yaml");
    std::fs::write(&path, CLUSTER).unwrap();
    path
}

fn netpol(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).output().unwrap()
}

fn explain(manifests: &Path, extra: &[&str]) -> (i32, String, String) {
    let m = manifests.display().to_string();
    let mut args = vec!["explain", "--manifests", &m];
    args.extend_from_slice(extra);
    let out = netpol(&args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verdicts_exit_status_and_text() {
    let dir = TempDir::new("explain-cli");
    let m = cluster(&dir);
    let (code, out, _) = explain(
        &m,
        &["--from", "x/client", "--to", "x/server", "--port", "8080"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("verdict: ALLOW  x/client -> x/server  TCP 8080"),
        "{out}"
    );
    assert!(out.contains("allowed by x/client-out egress rule 0, peer 0: pods app=server in every namespace, every port and protocol"), "{out}");
    assert!(out.contains("allowed by x/server-in ingress rule 0, peer 0: pods app=client in namespace x, port 0: TCP named port http"), "{out}");
    // The implementing rule is named by chain and hash.
    assert!(out.contains("cali-pi-knp/x/server-in #1 cali:"), "{out}");

    // Named port "http" is 8080 on this pod, not 80: the peer matched, the port did not.
    let (code, out, _) = explain(
        &m,
        &["--from", "x/client", "--to", "x/server", "--port", "80"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("verdict: DENY"), "{out}");
    assert!(out.contains("x/server-in ingress rule 0: peer matched (peer 0: pods app=client in namespace x), port not (rule ports: port 0 (TCP named port http))"), "{out}");
    assert!(out.contains("Drop if no policies passed packet"), "{out}");

    // y/other (10.0.2.1) is excepted from the ipBlock; its namespace has no app=client pods
    // for rule 0... it does have app=client, but rule 0's podSelector is namespace x only.
    let (code, out, _) = explain(
        &m,
        &[
            "--from",
            "y/other",
            "--to",
            "x/server",
            "--protocol",
            "udp",
            "--port",
            "53",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("excluded by ipBlock.except 10.0.2.0/24"),
        "{out}"
    );
    // An outside address inside the block: the UDP port is allowed, TCP is not (UDP-only).
    let (code, _, _) = explain(
        &m,
        &[
            "--from",
            "10.0.9.9",
            "--to",
            "x/server",
            "--protocol",
            "UDP",
            "--port",
            "53",
        ],
    );
    assert_eq!(code, 0);
    let (code, out, _) = explain(
        &m,
        &["--from", "10.0.9.9", "--to", "x/server", "--port", "53"],
    );
    assert_eq!(code, 1);
    assert!(out.contains("peer matched"), "{out}");
    // endPort: 9000-9100 inclusive.
    for (port, want) in [("9000", 0), ("9100", 0), ("9101", 1)] {
        let (code, out, _) = explain(
            &m,
            &["--from", "10.0.9.9", "--to", "x/server", "--port", port],
        );
        assert_eq!(code, want, "{port}: {out}");
    }
    // No port: every declared TCP port of the destination.
    let (code, out, _) = explain(&m, &["--from", "x/client", "--to", "x/server"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("TCP 8080"), "{out}");
    assert!(!out.contains("TCP 53"), "{out}");
}

#[test]
fn json_has_verdict_egress_and_ingress() {
    let dir = TempDir::new("explain-json");
    let m = cluster(&dir);
    let (code, out, _) = explain(
        &m,
        &[
            "--from", "x/client", "--to", "x/server", "--port", "80", "--output", "json",
        ],
    );
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"], "deny");
    assert_eq!(v["egress"]["verdict"], "allow");
    assert_eq!(v["ingress"]["verdict"], "deny");
    let tier = &v["ingress"]["tiers"][0];
    assert_eq!(tier["tier"], "NetworkPolicy");
    assert_eq!(tier["isolated_by"][0]["policy"], "x/server-in");
    assert_eq!(tier["closest_misses"][0]["kind"], "peer matched, port not");
    assert_eq!(tier["kernel"][0]["hash"].as_str().unwrap().len(), 16);
    let (_, out, _) = explain(
        &m,
        &[
            "--from", "x/client", "--to", "x/server", "--port", "8080", "--output", "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"], "allow");
    assert_eq!(v["ingress"]["tiers"][0]["allowed_by"]["rule"], 0);
    assert_eq!(v["ingress"]["tiers"][0]["allowed_by"]["port"], 0);
}

#[test]
fn bad_input_exits_2_naming_it() {
    let dir = TempDir::new("explain-bad");
    let m = cluster(&dir);
    let (code, _, err) = explain(
        &m,
        &["--from", "x/nobody", "--to", "x/server", "--port", "80"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--from x/nobody: no such pod"), "{err}");
    let (code, _, err) = explain(
        &m,
        &["--from", "x/client", "--to", "not a pod", "--port", "80"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--to"), "{err}");
    let (code, _, err) = explain(&m, &["--from", "x/client", "--to", "8.8.8.8"]);
    assert_eq!(code, 2);
    assert!(err.contains("--port is needed"), "{err}");

    let broken = dir.path.join("broken.yaml");
    std::fs::write(&broken, "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n").unwrap();
    let (code, _, err) = explain(&broken, &["--from", "x/a", "--to", "x/b", "--port", "80"]);
    assert_eq!(code, 2);
    assert!(err.contains("broken.yaml"), "{err}");

    let invalid = dir.path.join("invalid.yaml");
    std::fs::write(
        &invalid,
        format!("{CLUSTER}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: bad, namespace: x}}\nspec:\n  podSelector: {{}}\n  ingress: [{{from: [{{ipBlock: {{cidr: 10.0.0.0/33}}}}]}}]\n"),
    )
    .unwrap();
    let (code, _, err) = explain(
        &invalid,
        &["--from", "x/client", "--to", "x/server", "--port", "80"],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("NetworkPolicy x/bad: spec.ingress[0].from[0].ipBlock.cidr"),
        "{err}"
    );

    let (code, _, err) = explain(
        &m,
        &[
            "--from",
            "x/client",
            "--to",
            "x/server",
            "--port",
            "80",
            "--kernel",
            "--iptables-save",
            "/nonexistent",
            "--ipset-save",
            "/nonexistent",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--node is needed"), "{err}");
}

/// `compile` output is a node's kernel as `iptables-restore` input: explain reads it like a
/// save.
fn compiled(dir: &TempDir, m: &Path, node: &str) -> (PathBuf, PathBuf) {
    let (t, s) = (
        dir.path.join(format!("{node}.iptables")),
        dir.path.join(format!("{node}.ipset")),
    );
    let out = netpol(&[
        "compile",
        "--manifests",
        &m.display().to_string(),
        "--node",
        node,
        "--iptables-out",
        &t.display().to_string(),
        "--ipsets-out",
        &s.display().to_string(),
    ]);
    assert!(out.status.success());
    (t, s)
}

#[test]
fn kernel_over_saved_dumps_agrees_and_says_when_not() {
    let dir = TempDir::new("explain-kernel");
    let m = cluster(&dir);
    let (t, s) = compiled(&dir, &m, "node-1");
    let (ts, ss) = (t.display().to_string(), s.display().to_string());
    let kernel = [
        "--kernel",
        "--node",
        "node-1",
        "--iptables-save",
        &ts,
        "--ipset-save",
        &ss,
    ];
    let run = |port: &str| {
        let mut a = vec!["--from", "x/client", "--to", "x/server", "--port", port];
        a.extend_from_slice(&kernel);
        explain(&m, &a)
    };
    let (code, out, err) = run("8080");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("kernel: ALLOW, as the policies say for egress of x/client and ingress of x/server: they agree"), "{out}");
    assert!(out.contains("=> ACCEPT"), "{out}");
    let (code, out, _) = run("80");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("kernel: DENY, as the policies say"), "{out}");

    // Tamper: the policy's allow rule is gone from the dump.
    let text = std::fs::read_to_string(&t).unwrap();
    let tampered: String = text
        .lines()
        .filter(|l| {
            !(l.starts_with("-A cali-pi-knp/x/server-in") && l.contains("MARK --set-xmark 0x10000"))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(tampered, text);
    std::fs::write(&t, tampered).unwrap();
    let (code, out, _) = run("8080");
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("!!! THE KERNEL DISAGREES WITH THE POLICIES !!!"),
        "{out}"
    );
    assert!(
        out.contains("DROPS this flow, but the policies say allow"),
        "{out}"
    );

    // Another program's rule the interpreter does not know: reported, never guessed.
    std::fs::write(
        &t,
        text.replace(
            "COMMIT",
            "-I FORWARD 1 -m addrtype --dst-type LOCAL -j ACCEPT\nCOMMIT",
        ),
    )
    .unwrap();
    let (code, out, _) = run("8080");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("CANNOT EVALUATE"), "{out}");
    assert!(out.contains("addrtype"), "{out}");
}

/// `--flows`: many flows in one run, each answered as its own `explain` would answer it, in
/// the order given; over saved dumps, one kernel read serves every line.
#[test]
fn flows_file_answers_each_line_as_alone() {
    let dir = TempDir::new("explain-flows");
    let m = cluster(&dir);
    let (t, s) = compiled(&dir, &m, "node-1");
    let flows = dir.path.join("flows.txt");
    // As a person writes it: a comment, a blank line, tabs, a lower-case protocol.
    std::fs::write(
        &flows,
        "# from to port/protocol\n\nx/client\tx/server 8080\nx/client x/server 80/TCP\n10.0.9.9 x/server 53/udp # dns\ny/other  x/server 53/UDP\nx/client x/server\n",
    )
    .unwrap();
    let f = flows.display().to_string();
    let (code, out, err) = explain(&m, &["--flows", &f, "--output", "json"]);
    assert_eq!(code, 1, "some are denied: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(v["verdict"], "deny");
    // The last line has no port: the destination's declared TCP port, 8080.
    assert_eq!(results.len(), 5, "{out}");
    let singles: [&[&str]; 5] = [
        &["--from", "x/client", "--to", "x/server", "--port", "8080"],
        &["--from", "x/client", "--to", "x/server", "--port", "80"],
        &[
            "--from",
            "10.0.9.9",
            "--to",
            "x/server",
            "--port",
            "53",
            "--protocol",
            "UDP",
        ],
        &[
            "--from",
            "y/other",
            "--to",
            "x/server",
            "--port",
            "53",
            "--protocol",
            "UDP",
        ],
        &["--from", "x/client", "--to", "x/server"],
    ];
    for (i, single) in singles.iter().enumerate() {
        let mut a = single.to_vec();
        a.extend_from_slice(&["--output", "json"]);
        let (_, one, _) = explain(&m, &a);
        let one: serde_json::Value = serde_json::from_str(&one).unwrap();
        assert_eq!(results[i], one, "line {i}");
    }
    let verdicts: Vec<&str> = results
        .iter()
        .map(|r| r["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["allow", "deny", "allow", "deny", "allow"]);

    // Over saved dumps: every line traced through node-1's kernel, and it agrees.
    let (ts, ss) = (t.display().to_string(), s.display().to_string());
    let (code, out, err) = explain(
        &m,
        &[
            "--flows",
            &f,
            "--output",
            "json",
            "--kernel",
            "--node",
            "node-1",
            "--iptables-save",
            &ts,
            "--ipset-save",
            &ss,
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["kernel"]["agrees"], true, "{r}");
        assert_eq!(r["kernel"]["verdict"], r["verdict"], "{r}");
    }

    // A bad line stops the run, naming the line; so does an unknown pod.
    std::fs::write(&flows, "x/client x/server 8080\nx/client x/server http\n").unwrap();
    let (code, _, err) = explain(&m, &["--flows", &f]);
    assert_eq!(code, 2);
    assert!(
        err.contains("line 2: the port \"http\" is not 1-65535"),
        "{err}"
    );
    std::fs::write(&flows, "x/client x/server 8080\nx/nobody x/server 8080\n").unwrap();
    let (code, _, err) = explain(&m, &["--flows", &f]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--flows line 2") && err.contains("x/nobody: no such pod"),
        "{err}"
    );
    std::fs::write(&flows, "# nothing\n").unwrap();
    let (code, _, err) = explain(&m, &["--flows", &f]);
    assert_eq!(code, 2);
    assert!(err.contains("no flow in it"), "{err}");
}

fn audit(m: &Path, t: &Path, s: &Path, extra: &[&str]) -> (i32, String) {
    let (ms, ts, ss) = (
        m.display().to_string(),
        t.display().to_string(),
        s.display().to_string(),
    );
    let mut args = vec![
        "audit",
        "--node",
        "node-1",
        "--manifests",
        &ms,
        "--iptables-save",
        &ts,
        "--ipset-save",
        &ss,
    ];
    args.extend_from_slice(extra);
    let out = netpol(&args);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn audit_of_saved_dumps_names_each_tampering() {
    let dir = TempDir::new("audit-cli");
    let m = cluster(&dir);
    let (t, s) = compiled(&dir, &m, "node-1");
    let (code, out) = audit(&m, &t, &s, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node node-1: clean (IPv4)"), "{out}");
    // The inventory says what each rule implements.
    assert!(
        out.contains("cali-pi-knp/x/server-in  [policy: NetworkPolicy x/server-in ingress]"),
        "{out}"
    );
    assert!(out.contains("NetworkPolicy x/server-in ingress rule 1, peer 0 (ipBlock 10.0.0.0/16 except 10.0.2.0/24): ipBlock.except 10.0.2.0/24 (clear scratch)"), "{out}");
    assert!(
        out.contains("[workload: ingress of pod x/server (interface cali"),
        "{out}"
    );

    let rules = std::fs::read_to_string(&t).unwrap();
    let sets = std::fs::read_to_string(&s).unwrap();
    let set = sets
        .lines()
        .find(|l| l.starts_with("create cali40s:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let tw = rules
        .lines()
        .find_map(|l| l.strip_prefix(":cali-tw-"))
        .map(|l| format!("cali-tw-{}", l.split_whitespace().next().unwrap()))
        .unwrap();
    let cases: Vec<(&str, String, String)> = vec![
        (
            "bypass-above-jump",
            rules.replace("COMMIT", "-I FORWARD 1 -i cali+ -j ACCEPT\nCOMMIT"),
            sets.clone(),
        ),
        (
            "missing-jump",
            rules
                .lines()
                .filter(|l| !l.ends_with("-j cali-FORWARD"))
                .map(|l| format!("{l}\n"))
                .collect(),
            sets.clone(),
        ),
        (
            "final-accept-not-last",
            rules.replace("COMMIT", "-A FORWARD -j DROP\nCOMMIT"),
            sets.clone(),
        ),
        (
            "foreign-rule-in-our-chain",
            rules.replace("COMMIT", &format!("-I {tw} 1 -j ACCEPT\nCOMMIT")),
            sets.clone(),
        ),
        (
            "set-type-changed",
            rules.clone(),
            sets.replace(
                &format!("create {set} hash:net"),
                &format!("create {set} hash:ip"),
            ),
        ),
        (
            "set-members-extra",
            rules.clone(),
            format!("{sets}add {set} 10.99.0.1\n"),
        ),
        (
            "missing-rule",
            rules
                .lines()
                .filter(|l| !l.contains("Return if policy accepted"))
                .map(|l| format!("{l}\n"))
                .collect(),
            sets.clone(),
        ),
    ];
    for (kind, r, s2) in cases {
        let (t2, s2p) = (dir.path.join("t2"), dir.path.join("s2"));
        std::fs::write(&t2, &r).unwrap();
        std::fs::write(&s2p, &s2).unwrap();
        let (code, out) = audit(&m, &t2, &s2p, &[]);
        assert_eq!(code, 1, "{kind}: {out}");
        assert!(
            out.contains(&format!("  {kind}: ")),
            "{kind} not named:\n{out}"
        );
        let (_, json) = audit(&m, &t2, &s2p, &["--output", "json"]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["clean"], false);
        assert!(v["families"][0]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == kind));
    }
    // A bypass through another program's chain that accepts.
    let via = rules.replace(
        "COMMIT",
        ":KUBE-X - [0:0]\n-A KUBE-X -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n-A KUBE-X -s 10.0.0.0/8 -j ACCEPT\n-I FORWARD 1 -j KUBE-X\nCOMMIT",
    );
    let t2 = dir.path.join("t3");
    std::fs::write(&t2, via).unwrap();
    let (code, out) = audit(&m, &t2, &s, &[]);
    assert_eq!(code, 1);
    assert!(
        out.contains("jumps to a chain that accepts (KUBE-X #2: -s 10.0.0.0/8 -j ACCEPT)"),
        "{out}"
    );
    // A rule for another interface above the jump is no bypass.
    let harmless = rules.replace("COMMIT", "-I FORWARD 1 -i docker0 -j ACCEPT\nCOMMIT");
    std::fs::write(&t2, harmless).unwrap();
    let (code, out) = audit(&m, &t2, &s, &[]);
    assert_eq!(code, 0, "{out}");
}
