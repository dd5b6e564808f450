//! Staged policies (issue 23) through the binary, offline: with staged objects present,
//! `compile` output is byte-identical to the same cluster without them (a Set of a
//! default-deny, a Delete of an existing policy, Calico's kind, a staged cluster policy, an
//! invalid staged object); `explain --staged` answers with them applied (exit 0/1/2) and plain
//! `explain` says when they would change the answer; `staged impact` groups saved flow records
//! by the staged object that changes them; `staged promote` prints what they would become.

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
    ports: [{name: http, containerPort: 8080}]
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

/// A: default-deny ingress for x (Set); B: Calico's Delete of server-in; C: an Admin-tier
/// deny from team=b to team=a on TCP 9050; D: Delete of client-out.
const STAGED: &str = r#"
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: default-deny, namespace: x, uid: "1234", resourceVersion: "7", labels: {owner: ops}}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: projectcalico.org/v3
kind: StagedKubernetesNetworkPolicy
metadata: {name: server-in, namespace: x}
spec: {stagedAction: Delete}
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedClusterNetworkPolicy
metadata: {name: b-not-to-a}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - action: Deny
    from: [{namespaces: {matchLabels: {team: b}}}]
    protocols: [{tcp: {destinationPort: {number: 9050}}}]
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: client-out, namespace: x}
spec: {stagedAction: Delete}
"#;

const INVALID_STAGED: &str = r#"
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: broken, namespace: x}
spec: {stagedAction: Enforce, podSelector: {}}
"#;

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path.join(name);
    std::fs::write(&path, text).unwrap();
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

fn run(args: &[&str]) -> (i32, String, String) {
    let out = netpol(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `compile --strict` of these manifests: (ipsets, iptables).
fn compile(manifests: &[&Path], node: &str, dir: &TempDir, tag: &str) -> (String, String) {
    let ipsets = dir.path.join(format!("{tag}.ipsets"));
    let iptables = dir.path.join(format!("{tag}.iptables"));
    let mut args: Vec<String> = ["compile", "--strict", "--node", node, "--manifests"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(manifests.iter().map(|p| p.display().to_string()));
    args.extend([
        "--ipsets-out".to_string(),
        ipsets.display().to_string(),
        "--iptables-out".to_string(),
        iptables.display().to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = netpol(&refs);
    assert!(
        out.status.success(),
        "compile {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        std::fs::read_to_string(ipsets).unwrap(),
        std::fs::read_to_string(iptables).unwrap(),
    )
}

#[test]
fn staged_objects_never_change_compile_output() {
    let dir = TempDir::new("staged-compile");
    let cluster = write(&dir, "cluster.yaml", CLUSTER);
    let staged = write(&dir, "staged.yaml", STAGED);
    let invalid = write(&dir, "invalid.yaml", INVALID_STAGED);
    let seed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/seed-article.yaml");
    // The seed article: a Set of a default-deny in its namespace and a Delete of its policy.
    let seed_staged = write(
        &dir,
        "seed-staged.yaml",
        r#"
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: default-deny, namespace: default}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: hyapp-server, namespace: default}
spec: {stagedAction: Delete}
"#,
    );
    let cases: [(&str, Vec<&Path>, Vec<&Path>); 3] = [
        ("cluster", vec![&cluster], vec![&cluster, &staged]),
        ("invalid", vec![&cluster], vec![&invalid, &cluster]),
        ("seed", vec![&seed], vec![&seed_staged, &seed]),
    ];
    for (tag, without, with) in cases {
        for node in ["node-1", "node-2"] {
            let a = compile(&without, node, &dir, &format!("{tag}-{node}-without"));
            let b = compile(&with, node, &dir, &format!("{tag}-{node}-with"));
            // The fixture renders endpoints (and on node-1 policy): a comparison of empty
            // outputs would prove nothing.
            assert!(a.1.contains("cali-tw-"), "{tag} {node}: {}", a.1);
            assert!(
                node == "node-2" || a.1.contains("cali-pi-"),
                "{tag} {node}: {}",
                a.1
            );
            assert_eq!(a.0, b.0, "{tag} {node}: ipsets differ");
            assert_eq!(a.1, b.1, "{tag} {node}: iptables differ");
        }
    }
}

fn explain(m: &[&Path], extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["explain".to_string(), "--manifests".to_string()];
    args.extend(m.iter().map(|p| p.display().to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&refs)
}

#[test]
fn explain_answers_with_staged_applied_and_says_when_they_would_change_it() {
    let dir = TempDir::new("staged-explain");
    let cluster = write(&dir, "cluster.yaml", CLUSTER);
    let staged = write(&dir, "staged.yaml", STAGED);
    let m = [cluster.as_path(), staged.as_path()];
    let flow = ["--from", "y/other", "--to", "x/client", "--port", "80"];

    // Enforced: x/client is not isolated for ingress; default-deny would isolate it.
    let (code, out, err) = explain(&m, &flow);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("verdict: ALLOW"), "{out}");
    assert!(
        out.contains("staged: with the staged objects applied this flow would be DENY (changed by StagedNetworkPolicy x/default-deny)"),
        "{out}"
    );
    let (code, out, _) = explain(&m, &[&flow[..], &["--staged"]].concat());
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("staged objects applied: "), "{out}");
    assert!(out.contains("verdict: DENY"), "{out}");
    assert!(out.contains("x/default-deny"), "{out}");

    // Only the combination changes client -> server 8080: server-in deleted AND default-deny.
    let flow = ["--from", "x/client", "--to", "x/server", "--port", "8080"];
    let (code, out, _) = explain(&m, &[&flow[..], &["--output", "json"]].concat());
    assert_eq!(code, 0, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["verdict"], "allow");
    assert_eq!(doc["staged"]["verdict"], "deny");
    assert_eq!(doc["staged"]["changed_by"], serde_json::json!([]));
    let (code, _, _) = explain(&m, &[&flow[..], &["--staged"]].concat());
    assert_eq!(code, 1);

    // A newly allowed flow: client-out's Delete lets x/client reach y/other.
    let flow = ["--from", "x/client", "--to", "y/other", "--port", "80"];
    let (code, out, _) = explain(&m, &flow);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("would be ALLOW (changed by StagedNetworkPolicy x/client-out)"),
        "{out}"
    );
    let (code, _, _) = explain(&m, &[&flow[..], &["--staged"]].concat());
    assert_eq!(code, 0);

    // Without staged objects: no staged line. Staged and --kernel do not go together.
    let (code, out, _) = explain(
        &[cluster.as_path()],
        &["--from", "y/other", "--to", "x/client", "--port", "80"],
    );
    assert_eq!(code, 0);
    assert!(!out.contains("staged"), "{out}");
    let (code, _, err) = explain(
        &m,
        &[
            "--from", "y/other", "--to", "x/client", "--port", "80", "--staged", "--kernel",
        ],
    );
    assert_eq!(code, 2, "{err}");

    // An invalid staged object is bad input naming its kind and field.
    let invalid = write(&dir, "invalid.yaml", INVALID_STAGED);
    let (code, _, err) = explain(
        &[cluster.as_path(), invalid.as_path()],
        &["--from", "y/other", "--to", "x/client", "--port", "80"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "StagedNetworkPolicy x/broken: spec.stagedAction: unknown staged action \"Enforce\""
        ),
        "{err}"
    );
}

/// Flow records as `GET /flows` serves them (the fields `impact` reads, and some it does not).
fn records() -> serde_json::Value {
    let rec = |src: &str,
               dst: &str,
               proto: &str,
               port: Option<u16>,
               reporter: &str,
               action: &str,
               n: u64| {
        serde_json::json!({
            "node": "node-1", "source_ip": src, "dest_ip": dst, "dest_port": port,
            "proto": proto, "reporter": reporter, "action": action,
            "num_connections_started": n,
            "policies": {"enforced_policies": [], "pending_policies": []},
        })
    };
    serde_json::json!([
        rec("10.0.2.1", "10.0.1.1", "tcp", Some(80), "Dst", "Allow", 3),
        rec("10.0.1.1", "10.0.1.2", "tcp", Some(8080), "Dst", "Allow", 5),
        rec("10.0.2.1", "10.0.1.1", "tcp", Some(9050), "Dst", "Allow", 1),
        rec("10.0.1.1", "10.0.1.2", "tcp", Some(8080), "Src", "Allow", 5),
        rec("10.0.1.1", "10.0.2.1", "tcp", Some(80), "Src", "Deny", 2),
        rec("10.0.1.1", "10.0.2.1", "icmp", None, "Src", "Allow", 1),
    ])
}

#[test]
fn impact_groups_changed_flows_by_staged_object() {
    let dir = TempDir::new("staged-impact");
    let cluster = write(&dir, "cluster.yaml", CLUSTER);
    let staged = write(&dir, "staged.yaml", STAGED);
    let flows = write(&dir, "flows.json", &records().to_string());
    let (c, s, f) = (
        cluster.display().to_string(),
        staged.display().to_string(),
        flows.display().to_string(),
    );
    let (code, out, err) = run(&[
        "staged",
        "impact",
        "--manifests",
        &c,
        &s,
        "--flows",
        &f,
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["records"], 6);
    assert_eq!(doc["changed"], 4, "{doc:#}");
    let group = |name: serde_json::Value| -> Vec<(String, String, u64)> {
        doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["staged"] == name || g["staged"]["name"] == name)
            .map(|g| {
                g["flows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| {
                        (
                            f["from"].as_str().unwrap().to_string(),
                            f["to"].as_str().unwrap().to_string(),
                            f["dest_port"].as_u64().unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let s = |a: &str, b: &str, p: u64| (a.to_string(), b.to_string(), p);
    assert_eq!(
        group("x/default-deny".into()),
        [s("y/other", "x/client", 80), s("y/other", "x/client", 9050)]
    );
    assert_eq!(group("b-not-to-a".into()), [s("y/other", "x/client", 9050)]);
    assert_eq!(group("x/client-out".into()), [s("x/client", "y/other", 80)]);
    assert_eq!(group("together".into()), [s("x/client", "x/server", 8080)]);
    assert_eq!(group("x/server-in".into()), []);
    let kinds: Vec<&str> = doc["staged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"StagedKubernetesNetworkPolicy"),
        "{kinds:?}"
    );
    assert_eq!(
        doc["not_evaluated"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        1
    );

    // Text: newly denied / allowed per staged object.
    let (code, out, _) = run(&[
        "staged",
        "impact",
        "--manifests",
        &c,
        &s_path(&staged),
        "--flows",
        &f,
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains(
            "StagedClusterNetworkPolicy b-not-to-a (Set): 1 newly denied, 0 newly allowed"
        ),
        "{out}"
    );
    assert!(
        out.contains("StagedNetworkPolicy x/client-out (Delete): 0 newly denied, 1 newly allowed"),
        "{out}"
    );
    assert!(out.contains("ALLOW -> DENY  y/other -> x/client  TCP 80, ingress of x/client  (3 connections, node node-1)"), "{out}");

    // The same records from an agent's URL (one HTTP answer on a real socket).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = records().to_string();
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let (mut conn, _) = listener.accept().unwrap();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        // The rest of the request's head, as a server reads it before answering.
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
        }
        write!(
            conn,
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}"
        )
        .unwrap();
        request
    });
    let url = format!("http://127.0.0.1:{port}/flows?namespace=x");
    let (code, out, err) = run(&[
        "staged",
        "impact",
        "--manifests",
        &c,
        &s_path(&staged),
        "--flows",
        &url,
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let from_url: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(from_url["changed"], 4);
    assert!(server
        .join()
        .unwrap()
        .starts_with("GET /flows?namespace=x "));

    // Without staged objects nothing changes (exit 0); broken records are bad input (exit 2).
    let (code, out, _) = run(&["staged", "impact", "--manifests", &c, "--flows", &f]);
    assert_eq!(code, 0, "{out}");
    let bad = write(&dir, "bad.json", "{\"not\": \"records\"}");
    let (code, _, err) = run(&[
        "staged",
        "impact",
        "--manifests",
        &c,
        "--flows",
        &bad.display().to_string(),
    ]);
    assert_eq!(code, 2, "{err}");
}

fn s_path(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn promote_prints_the_enforced_objects_and_the_deletions() {
    let dir = TempDir::new("staged-promote");
    let cluster = write(&dir, "cluster.yaml", CLUSTER);
    let staged = write(&dir, "staged.yaml", STAGED);
    let (code, out, err) = run(&[
        "staged",
        "promote",
        "--manifests",
        &s_path(&cluster),
        &s_path(&staged),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("# delete NetworkPolicy x/server-in (from StagedKubernetesNetworkPolicy x/server-in): kubectl -n x delete networkpolicy server-in\n"), "{out}");
    assert!(out.contains("# delete NetworkPolicy x/client-out"), "{out}");
    // The promoted documents load as enforced objects, the staged metadata's uid and
    // resourceVersion dropped, its labels kept.
    let promoted = write(&dir, "promoted.yaml", &out);
    let text = std::fs::read_to_string(&promoted).unwrap();
    assert!(
        !text.contains("uid") && !text.contains("resourceVersion"),
        "{text}"
    );
    assert!(!text.contains("stagedAction"), "{text}");
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect();
    let kinds: Vec<(&str, &str)> = docs
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("ClusterNetworkPolicy", "b-not-to-a"),
            ("NetworkPolicy", "default-deny")
        ]
    );
    assert_eq!(docs[1]["metadata"]["labels"]["owner"], "ops");
    // What promote prints is what explain --staged judged: explain over the cluster with the
    // promoted objects (and the deletions made) gives the staged answer.
    let without_deleted: String = CLUSTER
        .split("\n---\n")
        .filter(|d| !d.contains("name: server-in") && !d.contains("name: client-out"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    let after = write(&dir, "after.yaml", &without_deleted);
    for (from, to, port) in [
        ("y/other", "x/client", "80"),
        ("x/client", "x/server", "8080"),
        ("x/client", "y/other", "80"),
        ("y/other", "x/client", "9050"),
    ] {
        let flow = ["--from", from, "--to", to, "--port", port];
        let (staged_code, _, _) = explain(
            &[cluster.as_path(), staged.as_path()],
            &[&flow[..], &["--staged"]].concat(),
        );
        let (promoted_code, out, err) = explain(&[after.as_path(), promoted.as_path()], &flow);
        assert_eq!(
            staged_code, promoted_code,
            "{from} -> {to} {port}: {out}{err}"
        );
    }
}
