//! `netpol-agent compile` of the examples against checked-in output (`tests/golden/`), with
//! every optional feature off: flow logs (issue 22: "with flow logs off, `compile` output stays
//! byte-identical"), staged objects (none in the examples; `staged_cli` holds that their
//! presence changes nothing), IPVS support (`--kube-ipvs` not given).
//!
//! The golden files were first written at the commit that added this test and compared then
//! with the output of the agent before flow logs and staged policies existed (3f054b5): the
//! same bytes apart from the `hashsize` word each `create` line gained that day (fitted hash
//! tables, issue 20). A change to what the agent programs therefore shows here as a diff to
//! review; regenerate with `NETPOL_REGENERATE_GOLDEN=1 cargo test --test compile_golden`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn compile(manifests: &str, node: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_netpol-agent"));
    // The features under test must be off whatever the caller's environment says.
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k.starts_with("NETPOL_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["compile", "--manifests"])
        .arg(root.join(manifests))
        .args(["--node", node])
        .output()
        .expect("run netpol-agent compile");
    assert!(
        out.status.success(),
        "compile {manifests} --node {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("compile prints UTF-8")
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn check(manifests: &str, node: &str, name: &str) {
    let got = compile(manifests, node);
    // Nothing of the opt-in features may appear when they are off.
    for marker in ["npa-f", "--nflog-group 21", "cali-forward-check", "staged"] {
        assert!(!got.contains(marker), "{name}: {marker:?} in the output");
    }
    let path = golden(name);
    if std::env::var_os("NETPOL_REGENERATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (NETPOL_REGENERATE_GOLDEN=1 writes it)",
            path.display()
        )
    });
    if got != want {
        let first = got
            .lines()
            .zip(want.lines())
            .position(|(g, w)| g != w)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        panic!(
            "{name}: compile output differs from {} from line {}:\n got: {:?}\nwant: {:?}\n\
             (review the change; NETPOL_REGENERATE_GOLDEN=1 rewrites the file)",
            path.display(),
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
}

#[test]
fn demo_node_1() {
    check("examples/demo", "node-1", "compile-demo-node-1.txt");
}

#[test]
fn demo_node_2() {
    check("examples/demo", "node-2", "compile-demo-node-2.txt");
}

#[test]
fn seed_article_node_1() {
    check(
        "examples/seed-article.yaml",
        "node-1",
        "compile-seed-article-node-1.txt",
    );
}

/// The same compile with flow logs on does differ: the golden test above would notice if
/// flow logs stopped being opt-in.
#[test]
fn flow_logs_on_changes_the_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_netpol-agent"))
        .env("FELIX_FLOWLOGSENABLED", "true")
        .args(["compile", "--manifests"])
        .arg(root.join("examples/demo"))
        .args(["--node", "node-1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let on = String::from_utf8(out.stdout).unwrap();
    assert!(on.contains("--nflog-prefix npa-f"), "{on}");
    assert_ne!(on, compile("examples/demo", "node-1"));
}
