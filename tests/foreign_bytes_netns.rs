//! Another program's rule whose comment is not UTF-8 (one `\xff` byte is enough) used to make
//! every `iptables-save` read fail, so the agent could neither program nor update anything.
//! Here such a rule sits in `FORWARD` (and in a chain of its own) of a network namespace, on
//! both backends: the agent converges, follows a policy change, and leaves the foreign rules
//! byte for byte as they were.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::converge::wait_converged;
use common::{Agent, NetNs, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

fn start_agent(ns: &NetNs, dir: &Path, backend: &str, log: &Path) -> Agent {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, BIN, "run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", dir.display()))
        .args(["--iptables-backend", backend])
        .args(["--iptables-post-write-check-interval-secs", "0.2"])
        .args(["--log-severity-screen", "DEBUG"])
        .env_remove("NODENAME");
    Agent::spawn(cmd, log)
}

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/demo")
}

/// Every line of `iptables-save -t filter` holding a byte that is not UTF-8, as bytes.
fn foreign_lines(ns: &NetNs, backend: &str) -> Vec<Vec<u8>> {
    let out = ns.exec(&[&format!("iptables-{backend}-save"), "-t", "filter"]);
    assert!(out.status.success());
    out.stdout
        .split(|&b| b == b'\n')
        .filter(|l| std::str::from_utf8(l).is_err())
        .map(<[u8]>::to_vec)
        .collect()
}

fn foreign_bytes_do_not_stop_the_agent(backend: &str) {
    let ns = NetNs::new("foreign-bytes");
    let ipt = format!("iptables-{backend}");
    // Octal escapes: \377 is 0xff, \376 0xfe; dash's printf knows them.
    ns.sh_ok(&format!(
        "{ipt} -w -N OTHER && \
         {ipt} -w -A OTHER -m comment --comment \"$(printf 'caf\\377 \\376')\" -j RETURN && \
         {ipt} -w -A FORWARD -m comment --comment \"$(printf '\\377')\" -j OTHER && \
         {ipt} -w -A INPUT -m comment --comment \"$(printf 'cali:\\377')\" -j ACCEPT"
    ));
    let before = foreign_lines(&ns, backend);
    assert_eq!(before.len(), 3, "the foreign rules are in place");

    let dir = TempDir::new("foreign-bytes");
    for f in ["cluster.yaml", "policies.yaml"] {
        std::fs::copy(demo().join(f), dir.path.join(f)).unwrap();
    }
    let logs = TempDir::new("foreign-bytes-log");
    let log = logs.path.join("agent.log");
    let _agent = start_agent(&ns, &dir.path, backend, &log);
    wait_converged(&ns, &dir.path, backend, &log);

    // An update after the first apply is read and written too.
    std::fs::write(
        dir.path.join("extra.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: extra, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress: [{ports: [{port: 8443}]}]\n",
    )
    .unwrap();
    wait_converged(&ns, &dir.path, backend, &log);

    assert_eq!(
        foreign_lines(&ns, backend),
        before,
        "foreign rules untouched"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("invalid UTF-8"), "{text}");
}

#[test]
fn foreign_bytes_do_not_stop_the_agent_legacy() {
    foreign_bytes_do_not_stop_the_agent("legacy");
}

#[test]
fn foreign_bytes_do_not_stop_the_agent_nft() {
    foreign_bytes_do_not_stop_the_agent("nft");
}
