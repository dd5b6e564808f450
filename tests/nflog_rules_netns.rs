//! The deny-log rule text round-trips through the kernel: every rule `nflog::rule` renders,
//! loaded with `iptables-restore` and read back with `iptables-save`, comes back byte for
//! byte, on the legacy and nft backends, IPv4 and IPv6. The rules are rendered the way the
//! agent renders its chains (`rules::render_rules`: hash comment, comments, matches), with
//! the deny-log text as the matches and target of a rule that precedes a drop.

mod common;

use common::NetNs;
use netpol_agent::kernel_text::iptables_save::normalize_save_line;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::deny_log::{
    nflog_target, DenyLogRule, DropKind, LogPrefix, Rate, RateUnit, DEFAULT_BURST,
    DEFAULT_SNAP_LEN, MAX_PREFIX_LEN,
};
use netpol_agent::rules::{render_rules, Action, Direction, Rule};

const CHAIN: &str = "cali-tw-cali1234567890a";

fn deny_log(kind: DropKind, direction: Direction, chain: &str, rate: Rate, burst: u32) -> String {
    DenyLogRule {
        group: 1,
        prefix: LogPrefix {
            kind,
            direction,
            chain: chain.into(),
        },
        rate,
        burst,
        snap_len: DEFAULT_SNAP_LEN,
    }
    .render()
    .unwrap()
}

/// Rule bodies as the agent would render them into one chain.
fn bodies(family: IpFamily) -> Vec<String> {
    let per_sec = Rate::per_second;
    let rate = |count, unit| Rate { count, unit };
    let texts = vec![
        // A pod's policy drop, both directions, with the drop's own mark match in front.
        deny_log(DropKind::Policy, Direction::Ingress, CHAIN, per_sec(10), 20),
        deny_log(
            DropKind::Policy,
            Direction::Egress,
            "cali-fw-cali1234567890a",
            per_sec(10),
            20,
        ),
        // The dispatch chains' unknown-interface drop.
        deny_log(
            DropKind::UnknownInterface,
            Direction::Ingress,
            "cali-to-wl-dispatch",
            per_sec(5),
            DEFAULT_BURST,
        ),
        deny_log(
            DropKind::UnknownInterface,
            Direction::Egress,
            "cali-from-wl-dispatch",
            per_sec(1),
            1,
        ),
        // The longest chain name iptables allows (28 characters).
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            "cali-tw-_AbCdEfGhIjKlMnOpQrS",
            per_sec(10),
            20,
        ),
        // Rates iptables prints in another unit than they were given in.
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            rate(120, RateUnit::Minute),
            20,
        ),
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            rate(3, RateUnit::Minute),
            20,
        ),
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            rate(7, RateUnit::Hour),
            2,
        ),
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            rate(48, RateUnit::Day),
            20,
        ),
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            rate(1, RateUnit::Day),
            1,
        ),
        deny_log(
            DropKind::Policy,
            Direction::Ingress,
            CHAIN,
            per_sec(10_000),
            10_000,
        ),
        // Group 0 (not printed), the longest prefix, and one that needs quotes.
        nflog_target(0, &"p".repeat(MAX_PREFIX_LEN), 64).unwrap(),
        nflog_target(65535, "npa-pol-in-cali-tw-eth0.100", 128).unwrap(),
    ];
    let rules: Vec<Rule> = texts
        .into_iter()
        .map(|text| {
            Rule::new(Action::None)
                .comment("Drop if no policies passed packet")
                .mark_match(0, 0x20000)
                .matching(text)
        })
        .collect();
    render_rules(CHAIN, family, &rules)
        .into_iter()
        .map(|r| r.body)
        .collect()
}

/// The chain's rules as the agent reads them back (`kernel_text::iptables_save::normalize_save_line`: iptables
/// 1.8.7 prints two spaces after `--nflog-prefix`).
fn saved_rules(ns: &NetNs, save: &str) -> Vec<String> {
    ns.exec_ok(&[save, "-t", "filter"])
        .lines()
        .map(normalize_save_line)
        .filter_map(|l| l.strip_prefix(&format!("-A {CHAIN} ")).map(str::to_string))
        .collect()
}

/// `iptables --version`'s `vX.Y.Z` as numbers.
fn iptables_version() -> (u32, u32, u32) {
    let out = std::process::Command::new("iptables")
        .arg("--version")
        .output()
        .expect("iptables --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u32> = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .expect("a version")
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    (v[0], v[1], v.get(2).copied().unwrap_or(0))
}

fn load(ns: &NetNs, restore: &str, lines: &[String]) {
    let mut input = format!("*filter\n:{CHAIN} - [0:0]\n");
    for body in lines {
        input.push_str(&format!("-A {CHAIN} {body}\n"));
    }
    input.push_str("COMMIT\n");
    let file = std::env::temp_dir().join(format!("{}-{restore}.rules", ns.name));
    std::fs::write(&file, input).unwrap();
    let loaded = ns.exec(&["sh", "-c", &format!("{restore} -w < '{}'", file.display())]);
    let _ = std::fs::remove_file(&file);
    assert!(
        loaded.status.success(),
        "{restore} refused the rules: {}",
        String::from_utf8_lossy(&loaded.stderr)
    );
}

#[test]
fn deny_log_rules_round_trip_byte_for_byte_on_both_backends_and_families() {
    for backend in ["legacy", "nft"] {
        let ns = NetNs::new(&format!("nflog-rules-{backend}"));
        for (family, tool) in [(IpFamily::V4, "iptables"), (IpFamily::V6, "ip6tables")] {
            let expected = bodies(family);
            load(&ns, &format!("{tool}-{backend}-restore"), &expected);
            let saved = saved_rules(&ns, &format!("{tool}-{backend}-save"));
            assert_eq!(
                saved, expected,
                "{tool}-{backend}: iptables-save must print the rules exactly as rendered (read as the agent reads it)"
            );
            if backend == "legacy" && family == IpFamily::V4 {
                for line in &expected[..3] {
                    println!("-A {CHAIN} {line}");
                }
            }
        }
    }
}

#[test]
fn a_64_character_prefix_would_print_differently_on_the_two_backends() {
    // Why the limit is 63: the legacy target's 64-byte field keeps 63 characters and its NUL,
    // nft keeps all 64 (iptables 1.8.9 and later; 1.8.7's nft tools cut to 63 as well, 1.8.8
    // is untried), so the same rule would read back differently depending on the backend.
    let prefix = "q".repeat(MAX_PREFIX_LEN + 1);
    let body = format!("-j NFLOG --nflog-prefix {prefix} --nflog-group 1 --nflog-size 128");
    let mut kept = Vec::new();
    for backend in ["legacy", "nft"] {
        let ns = NetNs::new(&format!("nflog-64-{backend}"));
        load(
            &ns,
            &format!("iptables-{backend}-restore"),
            std::slice::from_ref(&body),
        );
        let saved = saved_rules(&ns, &format!("iptables-{backend}-save"));
        let printed = saved[0].split_whitespace().nth(3).unwrap().to_string();
        kept.push(printed.len());
    }
    let nft_keeps = if iptables_version() <= (1, 8, 7) {
        MAX_PREFIX_LEN
    } else {
        MAX_PREFIX_LEN + 1
    };
    assert_eq!(kept, vec![MAX_PREFIX_LEN, nft_keeps]);
}
