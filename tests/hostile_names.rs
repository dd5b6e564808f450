//! Names the API server would refuse (a newline, a space, a NUL byte, capitals, too long) are
//! rejected by validation in every name-bearing field, naming the field, whichever source the
//! object came from (manifests through `compile`, the directory datastore); and no line of a
//! restore script is ever built from unchecked text, even when the renderer is handed such a
//! name directly.

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;
use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::{GraphConfig, RejectKind};
use netpol_agent::datastore::dir::DirSource;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::{validate, DatastoreEvent, IpFamily, K8sObject, ObjectKind};
use netpol_agent::rules::chains::KernelChainRules;
use netpol_agent::rules::{
    policy_chain, profile_chain, render, to_workload_chain, Action, Chain, ChainInsertMode,
    Direction, Rule, RuleConfig,
};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

/// Each is refused by the API server as an object name and as a namespace.
fn hostile() -> Vec<String> {
    vec![
        "x\n-F\n#".to_string(),
        "a b".to_string(),
        "a\0b".to_string(),
        "x\"y".to_string(),
        "Upper".to_string(),
        "-lead".to_string(),
        "trail-".to_string(),
        "a".repeat(254),
        String::new() + "caf\u{e9}",
    ]
}

fn pod(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.9"}]},
    })
}

fn policy(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]},
    })
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn no_control(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

#[test]
fn every_name_bearing_field_is_validated_as_the_api_server_does() {
    for bad in hostile() {
        let cases: [(&str, Result<(), validate::ValidationError>, &str); 5] = [
            (
                "Pod name",
                validate::pod(&serde_json::from_value(pod(&bad, "app")).unwrap()).map(|_| ()),
                "metadata.name",
            ),
            (
                "Pod namespace",
                validate::pod(&serde_json::from_value(pod("web", &bad)).unwrap()).map(|_| ()),
                "metadata.namespace",
            ),
            (
                "NetworkPolicy name",
                validate::network_policy(&serde_json::from_value(policy(&bad, "app")).unwrap())
                    .map(|_| ()),
                "metadata.name",
            ),
            (
                "NetworkPolicy namespace",
                validate::network_policy(&serde_json::from_value(policy("np", &bad)).unwrap())
                    .map(|_| ()),
                "metadata.namespace",
            ),
            (
                "Namespace name",
                validate::namespace(&serde_json::from_value(namespace(&bad)).unwrap()).map(|_| ()),
                "metadata.name",
            ),
        ];
        for (what, result, field) in cases {
            let err = result.expect_err(&format!("{what} {bad:?} must be rejected"));
            assert_eq!(err.field, field, "{what} {bad:?}: {err}");
            let shown = err.to_string();
            assert!(
                no_control(&shown),
                "{what}: the message echoes raw text: {shown:?}"
            );
            // A key up to the longest valid `namespace/name` (317 characters) is shown whole,
            // so it can be searched for; longer text is cut.
            assert!(
                shown.len() < 600,
                "{what}: the message is not shortened: {shown}"
            );
        }
    }
}

#[test]
fn names_the_api_server_accepts_still_pass() {
    // A pod or policy name is a DNS-1123 subdomain (dots allowed, 253 characters); a
    // namespace a DNS-1123 label (63 characters).
    let long_subdomain = format!("{}.{}", "a".repeat(63), "b".repeat(189));
    assert_eq!(long_subdomain.len(), 253);
    for name in ["web-1", "a.b.c", "0abc", long_subdomain.as_str()] {
        validate::pod(&serde_json::from_value(pod(name, "app")).unwrap()).expect(name);
        validate::network_policy(&serde_json::from_value(policy(name, "app")).unwrap())
            .expect(name);
    }
    let long_label = "n".repeat(63);
    for ns in ["app", "kube-system", "0", long_label.as_str()] {
        validate::pod(&serde_json::from_value(pod("web", ns)).unwrap()).expect(ns);
        validate::namespace(&serde_json::from_value(namespace(ns)).unwrap()).expect(ns);
    }
    // A namespace is a label: no dots.
    let err = validate::network_policy(&serde_json::from_value(policy("np", "a.b")).unwrap())
        .expect_err("dotted namespace");
    assert_eq!(err.field, "metadata.namespace");
}

/// A restore line as iptables-restore splits it: words separated by spaces, a double-quoted
/// word taken whole. Every word must be made of the characters our renderer uses.
fn line_problem(line: &str) -> Option<String> {
    if line.is_empty() || !line.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        return Some("empty, or holds a control or non-ASCII character".into());
    }
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_.:/+,!=@%[]".contains(c);
    let mut rest = line;
    let mut first = true;
    while !rest.is_empty() {
        rest = rest.trim_start_matches(' ');
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"')?;
            let word = &quoted[..end];
            if word.contains('\\') {
                return Some(format!("backslash in {word:?}"));
            }
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            let word = &rest[..end];
            let header = first && (word == "COMMIT" || word.starts_with('*'));
            if !header && !word.chars().all(safe) {
                return Some(format!("unsafe word {word:?}"));
            }
            if first && !header && !word.starts_with('-') && !word.starts_with(':') {
                return Some(format!("line starts with {word:?}"));
            }
            rest = &rest[end..];
        }
        first = false;
    }
    None
}

fn assert_script_safe(script: &str) {
    for line in script.lines() {
        if let Some(problem) = line_problem(line) {
            panic!("unsafe restore line {line:?}: {problem}\n{script}");
        }
    }
}

#[test]
fn the_renderer_never_emits_unchecked_text() {
    for bad in hostile() {
        for name in [
            policy_chain(Direction::Ingress, "app", &bad),
            policy_chain(Direction::Egress, &bad, "np"),
            profile_chain(Direction::Ingress, &bad),
            to_workload_chain(&bad),
        ] {
            assert!(
                name.len() <= 28 && line_problem(&format!("-X {name}")).is_none(),
                "chain name {name:?} from {bad:?}"
            );
        }
        // Handed hostile text directly, the renderer still writes only safe lines: the chain
        // name, an interface and a jump target are escaped, a comment is sanitised.
        let chain = Chain::new(
            format!("cali-{bad}"),
            IpFamily::V4,
            vec![Rule::new(Action::Jump(bad.clone()))
                .in_iface(bad.clone())
                .out_iface(bad.clone())
                .comment(bad.clone())],
        );
        let kernel = vec![KernelChainRules {
            chain: "FORWARD".into(),
            inserts: netpol_agent::rules::render_rules(
                "FORWARD",
                IpFamily::V4,
                &[Rule::new(Action::Goto(bad.clone()))],
            ),
            appends: Vec::new(),
        }];
        let chains = [(chain.name.clone(), chain)].into_iter().collect();
        for mode in [ChainInsertMode::Insert, ChainInsertMode::Append] {
            let script = render::restore_script(&chains, &kernel, mode);
            assert_eq!(script.lines().count(), 5, "{script}");
            assert_script_safe(&script);
        }
    }
}

const GOOD: &str = "\
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: app, labels: {role: server}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress: [{ports: [{port: 80}]}]
";

/// One file per hostile object, beside the good file.
fn write_hostile(dir: &Path) {
    for (index, bad) in hostile().iter().enumerate() {
        let objects = [
            policy(bad, "app"),
            policy("np", bad),
            pod(bad, "app"),
            pod("web", bad),
            namespace(bad),
        ];
        for (n, object) in objects.iter().enumerate() {
            std::fs::write(
                dir.join(format!("bad-{index}-{n}.json")),
                serde_json::to_string(object).unwrap(),
            )
            .unwrap();
        }
    }
    std::fs::write(dir.join("good.yaml"), GOOD).unwrap();
}

#[test]
fn compile_rejects_hostile_names_and_renders_the_good_policy() {
    let dir = TempDir::new("hostile-names");
    write_hostile(&dir.path);
    for family in [None, Some("--ipv6")] {
        let out = Command::new(BIN)
            .args(["compile", "--node", "node-1", "--manifests"])
            .arg(&dir.path)
            .args(family)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).expect("compile prints UTF-8");
        assert_script_safe(
            &script
                .lines()
                .filter(|l| !l.starts_with("create ") && !l.starts_with("add "))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        assert!(!script.lines().any(|l| l == "-F"), "{script}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.lines().all(|l| !l.trim_start().starts_with("-F")),
            "a name forged a log line: {stderr}"
        );
        if family.is_none() {
            assert!(script.contains(":cali-pi-knp/app/good - [0:0]"), "{script}");
        }
    }
    let strict = Command::new(BIN)
        .args(["compile", "--strict", "--node", "node-1", "--manifests"])
        .arg(&dir.path)
        .output()
        .unwrap();
    assert_eq!(strict.status.code(), Some(1), "--strict must fail");
}

#[test]
fn the_directory_datastore_rejects_hostile_names_too() {
    let dir = TempDir::new("hostile-dir");
    write_hostile(&dir.path);
    let mut source = DirSource::new(&dir.path);
    let objects: Vec<K8sObject> = source
        .rescan()
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            DatastoreEvent::Upsert(o) => Some(*o),
            _ => None,
        })
        .collect();
    let graph = Calculation::of_objects(
        GraphConfig {
            node_name: "node-1".into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(CalicoResolver::default()),
        &objects,
    );
    let rejected = graph.rejections();
    // Every hostile object but those whose only fault is a namespace the file names (and
    // which share a key with another) is rejected as invalid; the good ones are not.
    assert!(rejected.len() >= hostile().len() * 3, "{rejected:#?}");
    for ((kind, key), (why, message)) in rejected {
        assert_eq!(*why, RejectKind::Invalid, "{kind:?} {key:?}: {message}");
        assert!(
            message.contains("metadata.name") || message.contains("metadata.namespace"),
            "{kind:?} {key:?}: {message}"
        );
    }
    assert!(!rejected.contains_key(&(ObjectKind::NetworkPolicy, "app/good".into())));
    let chains = &graph.snapshot().families[&IpFamily::V4].chains;
    assert!(chains.contains_key("cali-pi-knp/app/good"));
    for name in chains.keys() {
        assert!(line_problem(&format!("-X {name}")).is_none(), "{name:?}");
    }
}
