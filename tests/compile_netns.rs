//! `netpol-agent compile` output loads into a real kernel: `ipset restore` and
//! `iptables-restore --noflush` accept it in a fresh network namespace, and `iptables-save`
//! then prints every chain and every rule exactly as compile rendered it (legacy and nft
//! backends, IPv4 and IPv6).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use common::{have, NetNs, TempDir};

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .display()
        .to_string()
}

/// Runs compile and returns (ipset script, iptables script).
fn compile(manifests: &[String], extra: &[&str], dir: &TempDir) -> (String, String) {
    let ipsets = dir.path.join("ipsets");
    let iptables = dir.path.join("iptables");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_netpol-agent"));
    cmd.arg("compile")
        .arg("--node")
        .arg("node-1")
        .arg("--strict");
    cmd.arg("--manifests").args(manifests);
    cmd.args(extra);
    cmd.arg("--ipsets-out")
        .arg(&ipsets)
        .arg("--iptables-out")
        .arg(&iptables);
    let out = cmd.output().expect("run netpol-agent");
    assert!(
        out.status.success(),
        "compile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        std::fs::read_to_string(ipsets).unwrap(),
        std::fs::read_to_string(iptables).unwrap(),
    )
}

/// `chain -> rule bodies` from iptables-save or restore text (`-I X 1 body` counts as `-A X body`).
fn rules_by_chain(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap().to_string();
            out.entry(name).or_default();
        } else if let Some(rest) = line
            .strip_prefix("-A ")
            .or_else(|| line.strip_prefix("-I "))
        {
            let (chain, body) = rest.split_once(' ').unwrap();
            let body = if line.starts_with("-I ") {
                body.split_once(' ').unwrap().1
            } else {
                body
            };
            out.entry(chain.to_string())
                .or_default()
                .push(body.to_string());
        }
    }
    out
}

fn check_load(manifests: &[String], ipv6: bool, backend: &str) {
    check_load_with(manifests, ipv6, backend, &[]);
}

fn check_load_with(manifests: &[String], ipv6: bool, backend: &str, options: &[&str]) {
    let tool = |t: &str| {
        let base = if ipv6 { "ip6tables" } else { "iptables" };
        format!("{base}-{backend}-{t}")
    };
    assert!(
        have(&tool("restore")),
        "{} is not installed",
        tool("restore")
    );
    let dir = TempDir::new("compile");
    let mut extra: Vec<&str> = options.to_vec();
    if ipv6 {
        extra.push("--ipv6");
    }
    let (ipset_script, iptables_script) = compile(manifests, &extra, &dir);
    let ns = NetNs::new("compile");

    ns.sh_ok(&format!(
        "ipset restore < '{}'",
        dir.path.join("ipsets").display()
    ));
    // -w: the tests run in parallel and the xtables lock is one file for every namespace;
    // iptables-legacy-restore 1.8.7 (Debian 11) fails at once when it is held.
    ns.restore_file(
        &format!("{} -w --noflush", tool("restore")),
        &dir.path.join("iptables"),
    );

    // Every set exists with exactly the members compile listed.
    let saved_sets = ns.exec_ok(&["ipset", "save"]);
    let adds = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("add "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(adds(&saved_sets), adds(&ipset_script));
    let created: BTreeSet<&str> = ipset_script
        .lines()
        .filter_map(|l| l.strip_prefix("create ").and_then(|r| r.split(' ').next()))
        .collect();
    for set in &created {
        assert!(
            saved_sets.contains(&format!("create {set} ")),
            "set {set} missing"
        );
    }

    // Every chain and every rule, byte for byte.
    // Read as the agent reads saves (`iptables::parse`): iptables-nft-save 1.8.7 ends a rule
    // without a target with a space.
    let saved = ns.exec_ok(&[&tool("save"), "-t", "filter"]);
    let saved: String = saved
        .lines()
        .map(|l| format!("{}\n", l.trim_end()))
        .collect();
    let saved = rules_by_chain(&saved);
    let wanted = rules_by_chain(&iptables_script);
    assert!(wanted.len() > 8, "compile produced too little: {wanted:?}");
    for (chain, rules) in &wanted {
        let have = saved
            .get(chain)
            .unwrap_or_else(|| panic!("chain {chain} missing after restore"));
        assert_eq!(
            have,
            rules,
            "chain {chain} differs between compile and {}",
            tool("save")
        );
    }
}

fn all_manifests() -> Vec<String> {
    vec![example("demo")]
}

#[test]
fn seed_example_loads_into_legacy_iptables() {
    check_load(&[example("seed-article.yaml")], false, "legacy");
}

#[test]
fn demo_loads_ipv4_legacy_and_nft() {
    check_load(&all_manifests(), false, "legacy");
    check_load(&all_manifests(), false, "nft");
}

#[test]
fn demo_loads_ipv6_legacy_and_nft() {
    check_load(&all_manifests(), true, "legacy");
    check_load(&all_manifests(), true, "nft");
}

#[test]
fn output_is_deterministic() {
    let dir = TempDir::new("det");
    let a = compile(&all_manifests(), &[], &dir);
    let b = compile(&all_manifests(), &[], &dir);
    assert_eq!(a, b);
    assert!(a.1.contains(":cali-FORWARD - [0:0]"));
}

/// Bridge mode (`-m physdev` matches, the address dispatch, the bridged ICMPv6 accepts):
/// both backends print every rule exactly as rendered, so the writer's diff stays stable.
#[test]
fn bridge_mode_loads_ipv4_and_ipv6_legacy_and_nft() {
    let dir = TempDir::new("bridge-map");
    let map = dir.path.join("map.yaml");
    std::fs::write(
        &map,
        "\"shop/web\": veth0a1b2c3d\n\"shop/api\": veth0a9f8e7d\n",
    )
    .unwrap();
    let map = map.display().to_string();
    let options = [
        "--bridge-interface",
        "cni0",
        "--interface-prefix",
        "veth",
        "--interface-name-scheme",
        "static",
        "--interface-map-file",
        &map,
    ];
    for backend in ["legacy", "nft"] {
        for ipv6 in [false, true] {
            check_load_with(&all_manifests(), ipv6, backend, &options);
        }
    }
}
