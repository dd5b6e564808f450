//! The change-detection primitives (`change_detect`) against a real kernel: each test programs
//! the agent's own `compile` output for `examples/demo` into a fresh network namespace (plus
//! another program's chain and set), opens the watcher on a thread inside that namespace,
//! takes a fingerprint, and then tampers the ways issue 10 lists, asserting what each check
//! reports after each tamper. Changes that must not concern us (another chain, another table,
//! kube-proxy's own nf_tables table, another program's set) are asserted as such.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{in_netns, NetNs, TempDir};
use netpol_agent::dataplane::watch::ipset::IpsetWatch;
use netpol_agent::dataplane::watch::nft::{NftGeneration, NftMonitor};
use netpol_agent::dataplane::watch::xtables::LegacyWatch;
use netpol_agent::dataplane::watch::Finding;
use netpol_agent::model::IpFamily;

/// `compile` of `examples/demo` for node-1: (ipset script, iptables script).
fn compile(ipv6: bool) -> (String, String) {
    let dir = TempDir::new("cd-compile");
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/demo");
    let (ipsets, iptables) = (dir.path.join("ipsets"), dir.path.join("iptables"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_netpol-agent"));
    cmd.args(["compile", "--node", "node-1", "--strict", "--manifests"])
        .arg(&demo)
        .arg("--ipsets-out")
        .arg(&ipsets)
        .arg("--iptables-out")
        .arg(&iptables);
    if ipv6 {
        cmd.arg("--ipv6");
    }
    let out = cmd.output().expect("run netpol-agent compile");
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

/// The iptables binary of a family and backend. Every call of it below passes `-w`: tests of
/// this binary run in parallel and share `/run/xtables.lock`, and without it the legacy tools
/// fail at once on a held lock: under emulation, where restores are slow, that happened on
/// Debian 11's 5.10 + iptables 1.8.7 (docs/verified-on.md, defect 6).
fn tool(ipv6: bool, backend: &str) -> String {
    format!("{}-{backend}", if ipv6 { "ip6tables" } else { "iptables" })
}

/// Programs our sets and rules, then a chain of another program (`KUBE-FOO`, jumped to from
/// `FORWARD` after our jump) and another program's set (`KUBE-X`).
fn program(ns: &NetNs, ipv6: bool, backend: &str) {
    let (ipsets, iptables) = compile(ipv6);
    let dir = TempDir::new("cd-program");
    std::fs::write(dir.path.join("ipsets"), ipsets).unwrap();
    std::fs::write(dir.path.join("iptables"), iptables).unwrap();
    ns.restore_file("ipset restore -exist", &dir.path.join("ipsets"));
    ns.restore_file(
        &format!("{}-restore -w --noflush", tool(ipv6, backend)),
        &dir.path.join("iptables"),
    );
    let t = tool(ipv6, backend);
    ns.exec_ok(&[&t, "-w", "-N", "KUBE-FOO"]);
    ns.exec_ok(&[
        &t, "-w", "-A", "KUBE-FOO", "-p", "tcp", "--dport", "30000", "-j", "ACCEPT",
    ]);
    ns.exec_ok(&[&t, "-w", "-A", "FORWARD", "-j", "KUBE-FOO"]);
    ns.exec_ok(&["ipset", "-exist", "create", "KUBE-X", "hash:ip"]);
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `(chain, 1-based position, body)` of the first rule of ours in `save` output that ends in
/// `-j DROP`.
fn our_drop_rule(save: &str) -> (String, usize, String) {
    let mut positions: std::collections::BTreeMap<String, usize> = Default::default();
    for line in save.lines() {
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let (chain, body) = rest.split_once(' ').unwrap();
        let pos = positions.entry(chain.to_string()).or_default();
        *pos += 1;
        if chain.starts_with("cali-") && body.ends_with("-j DROP") {
            return (chain.to_string(), *pos, body.to_string());
        }
    }
    panic!("no DROP rule of ours in {save}");
}

/// Our chain with the most rules (one that a flush visibly empties).
fn our_busiest_chain(save: &str) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for line in save.lines() {
        if let Some(chain) = line.strip_prefix("-A ").and_then(|r| r.split(' ').next()) {
            if chain.starts_with("cali-") {
                *counts.entry(chain).or_default() += 1;
            }
        }
    }
    let (chain, _) = counts.into_iter().max_by_key(|(_, n)| *n).unwrap();
    chain.to_string()
}

/// Words of a rule body as arguments (the quoted comments of `iptables-save` kept whole).
fn words(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in body.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn run_in(ns: &NetNs, args: &[String]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ns.exec_ok(&args);
}

/// Our jump from FORWARD, as `-D` arguments.
fn our_forward_jump(save: &str) -> Vec<String> {
    let line = save
        .lines()
        .find(|l| l.starts_with("-A FORWARD") && l.ends_with("-j cali-FORWARD"))
        .expect("our FORWARD jump");
    words(&line[3..])
}

fn check_legacy(ipv6: bool) {
    let family = if ipv6 { IpFamily::V6 } else { IpFamily::V4 };
    let t = tool(ipv6, "legacy");
    let ns = NetNs::new("cd-legacy");
    program(&ns, ipv6, "legacy");
    let mut w = in_netns(&ns.name, || {
        LegacyWatch::open(family, netpol_agent::agent::ours()).expect("open the x_tables socket")
    });
    w.baseline().unwrap();
    let fp = w.fingerprint().unwrap();
    assert!(fp.chains.contains_key("cali-FORWARD") && fp.chains.contains_key("KUBE-FOO"));
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);

    // Packets move the counters of INPUT and OUTPUT (loopback): not a change.
    let lo: std::net::IpAddr = if ipv6 { "::1" } else { "127.0.0.1" }.parse().unwrap();
    in_netns(&ns.name, || {
        let sock = std::net::UdpSocket::bind((lo, 0)).unwrap();
        for _ in 0..20 {
            sock.send_to(b"counted", (lo, 9)).unwrap();
        }
    });
    let counted = ns.exec_ok(&[&format!("{t}-save"), "-c", "-t", "filter"]);
    assert!(
        !counted.contains(":OUTPUT ACCEPT [0:0]"),
        "the packets were counted: {counted}"
    );
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
    assert_eq!(
        w.verify().unwrap(),
        Finding::Unchanged,
        "counters are masked"
    );

    // Another program's chain, then another table: no concern.
    ns.exec_ok(&[&t, "-w", "-A", "KUBE-FOO", "-p", "udp", "-j", "ACCEPT"]);
    assert!(w.info_moved().unwrap());
    assert_eq!(w.check().unwrap(), Finding::Foreign);
    assert!(!w.info_moved().unwrap());
    ns.exec_ok(&[&t, "-w", "-t", "mangle", "-A", "PREROUTING", "-j", "ACCEPT"]);
    assert_eq!(
        w.check().unwrap(),
        Finding::Unchanged,
        "mangle is not filter"
    );
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);

    // A DROP of ours replaced in place by an ACCEPT of the same size: the info is blind to
    // it, the entries digest is not.
    let save = ns.exec_ok(&[&format!("{t}-save"), "-t", "filter"]);
    let (chain, pos, body) = our_drop_rule(&save);
    let mut args = vec![
        t.clone(),
        "-w".into(),
        "-R".into(),
        chain.clone(),
        pos.to_string(),
    ];
    args.extend(words(&body.replace("-j DROP", "-j ACCEPT")));
    run_in(&ns, &args);
    assert_eq!(
        w.check().unwrap(),
        Finding::Unchanged,
        "same size: info unchanged"
    );
    assert_eq!(w.verify().unwrap(), Finding::Ours(names(&[&chain])));
    assert_eq!(w.verify().unwrap(), Finding::Unchanged, "reported once");

    // One of our chains flushed.
    let busiest = our_busiest_chain(&save);
    ns.exec_ok(&[&t, "-w", "-F", &busiest]);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&[&busiest])));

    // Our jump deleted from FORWARD.
    let mut del = vec![t.clone(), "-w".into(), "-D".into()];
    del.extend(our_forward_jump(&save));
    run_in(&ns, &del);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&["FORWARD"])));

    // Another program's rule inserted above (where our jump was) in FORWARD.
    ns.exec_ok(&[&t, "-w", "-I", "FORWARD", "1", "-j", "ACCEPT"]);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&["FORWARD"])));
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
}

#[test]
fn legacy_ipv4_tampering_is_seen_and_foreign_changes_are_told_apart() {
    check_legacy(false);
}

#[test]
fn legacy_ipv6_tampering_is_seen_and_foreign_changes_are_told_apart() {
    check_legacy(true);
}

/// Waits for the events of the commits just made, then polls: the finding, with the commits
/// of `own` counted as ours.
fn settle(m: &mut NftMonitor, own: Option<u32>) -> (Finding, u64) {
    let mut finding = Finding::Unchanged;
    let mut foreign = 0;
    // Events arrive before the committing command returns; one quiet wait is enough.
    while m.wait(Duration::from_millis(200)).unwrap() {
        let changes = m.poll().unwrap();
        foreign += changes.foreign_commits;
        finding = finding.merge(changes.finding(|c| c.pid.is_some() && c.pid == own));
    }
    (finding, foreign)
}

fn check_nft(ipv6: bool) {
    let t = tool(ipv6, "nft");
    let ns = NetNs::new("cd-nft");
    // Subscribed first: everything from the first restore on is seen.
    let (mut m, mut gen) = in_netns(&ns.name, || {
        (
            NftMonitor::open(netpol_agent::agent::ours()).expect("subscribe to nf_tables events"),
            NftGeneration::open().expect("nf_tables generation socket"),
        )
    });
    let before = gen.read().unwrap();
    program(&ns, ipv6, "nft");
    let (finding, _) = settle(&mut m, None);
    assert!(
        matches!(finding, Finding::Unknown(_)),
        "creating our table is a table-level change: {finding:?}"
    );
    let after = gen.read().unwrap();
    assert!(after > before, "generation {before} -> {after}");
    assert_eq!(m.last_generation(), Some(after));
    assert_eq!(
        m.confirm(
            &mut gen,
            |_: &netpol_agent::dataplane::watch::nft::Commit| false
        )
        .unwrap(),
        Finding::Unchanged,
        "the subscription saw the latest commit"
    );

    // kube-proxy's own table, changed with nft: commits that do not concern us.
    let family = if ipv6 { "ip6" } else { "ip" };
    ns.sh_ok(&format!(
        "nft add table {family} kube-proxy && \
         nft add chain {family} kube-proxy services && \
         nft add rule {family} kube-proxy services meta l4proto tcp accept && \
         nft add set {family} kube-proxy cluster-ips '{{ type {}; }}'",
        if ipv6 { "ipv6_addr" } else { "ipv4_addr" }
    ));
    for i in 0..5 {
        let addr = if ipv6 {
            format!("fd00::{i}")
        } else {
            format!("10.96.0.{i}")
        };
        ns.exec_ok(&[
            "nft",
            "add",
            "element",
            family,
            "kube-proxy",
            "cluster-ips",
            &format!("{{ {addr} }}"),
        ]);
    }
    let (finding, foreign) = settle(&mut m, None);
    assert_eq!(finding, Finding::Foreign);
    assert_eq!(foreign, 9, "one commit per nft command");

    // Another program's chain of filter.
    ns.exec_ok(&[&t, "-w", "-A", "KUBE-FOO", "-p", "udp", "-j", "ACCEPT"]);
    assert_eq!(settle(&mut m, None).0, Finding::Foreign);

    let save = ns.exec_ok(&[&format!("{t}-save"), "-t", "filter"]);
    // A DROP of ours replaced in place by an ACCEPT of the same size.
    let (chain, pos, body) = our_drop_rule(&save);
    let mut args = vec![
        t.clone(),
        "-w".into(),
        "-R".into(),
        chain.clone(),
        pos.to_string(),
    ];
    args.extend(words(&body.replace("-j DROP", "-j ACCEPT")));
    run_in(&ns, &args);
    assert_eq!(settle(&mut m, None).0, Finding::Ours(names(&[&chain])));

    // One of our chains flushed.
    let busiest = our_busiest_chain(&save);
    ns.exec_ok(&[&t, "-w", "-F", &busiest]);
    assert_eq!(settle(&mut m, None).0, Finding::Ours(names(&[&busiest])));

    // Our jump deleted from FORWARD; another program's rule inserted above it.
    let mut del = vec![t.clone(), "-w".into(), "-D".into()];
    del.extend(our_forward_jump(&save));
    run_in(&ns, &del);
    assert_eq!(settle(&mut m, None).0, Finding::Ours(names(&["FORWARD"])));
    ns.exec_ok(&[&t, "-w", "-I", "FORWARD", "1", "-j", "ACCEPT"]);
    assert_eq!(settle(&mut m, None).0, Finding::Ours(names(&["FORWARD"])));

    // A write of our own (its pid is known) is not somebody else's change.
    let child = Command::new("ip")
        .args([
            "netns", "exec", &ns.name, &t, "-A", &busiest, "-j", "RETURN",
        ])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    assert_eq!(settle(&mut m, Some(pid)).0, Finding::Foreign);

    // Our table made dormant (every rule of ours off): read everything.
    ns.exec_ok(&[
        "nft",
        "add",
        "table",
        family,
        "filter",
        "{ flags dormant; }",
    ]);
    assert!(matches!(settle(&mut m, None).0, Finding::Unknown(_)));
    assert_eq!(
        m.confirm(
            &mut gen,
            |_: &netpol_agent::dataplane::watch::nft::Commit| false
        )
        .unwrap(),
        Finding::Unchanged
    );
}

#[test]
fn nft_ipv4_events_tell_our_chains_from_kube_proxy_and_foreign_chains() {
    check_nft(false);
}

#[test]
fn nft_ipv6_events_tell_our_chains_from_kube_proxy_and_foreign_chains() {
    check_nft(true);
}

#[test]
fn nft_overrun_is_reported_as_unknown() {
    let ns = NetNs::new("cd-nft-overrun");
    let mut m = in_netns(&ns.name, || {
        NftMonitor::with_receive_buffer(netpol_agent::agent::ours(), 4096).expect("subscribe")
    });
    // One commit of 2000 rules in kube-proxy's table: far more events than 8 KiB hold.
    let dir = TempDir::new("cd-overrun");
    let mut script = String::from("add table ip kube-proxy\nadd chain ip kube-proxy svc\n");
    for i in 0..2000 {
        script.push_str(&format!(
            "add rule ip kube-proxy svc ip daddr 10.96.{}.{} tcp dport 80 accept\n",
            i / 250,
            i % 250
        ));
    }
    std::fs::write(dir.path.join("rules.nft"), script).unwrap();
    ns.exec_ok(&[
        "nft",
        "-f",
        &dir.path.join("rules.nft").display().to_string(),
    ]);
    let (finding, _) = settle(&mut m, None);
    assert!(
        matches!(&finding, Finding::Unknown(why) if why.contains("overrun")),
        "{finding:?}"
    );
    // The monitor goes on: the next commit is read normally.
    ns.exec_ok(&["nft", "add", "table", "ip", "other"]);
    assert_eq!(settle(&mut m, None).0, Finding::Foreign);
}

#[test]
fn ipset_headers_and_member_digests_see_tampering_of_our_sets_only() {
    let ns = NetNs::new("cd-ipset");
    program(&ns, false, "legacy");
    // A set of ours no rule references (one the writer is about to destroy, say).
    let spare = "cali40s:spareSetNotReferenced0";
    ns.exec_ok(&["ipset", "create", spare, "hash:net", "family", "inet"]);
    ns.exec_ok(&["ipset", "add", spare, "10.250.0.1"]);
    let mut w = in_netns(&ns.name, || {
        IpsetWatch::open(netpol_agent::agent::ours()).expect("ipset netlink socket")
    });
    w.baseline().unwrap();
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);
    let headers = w.fingerprint().unwrap().clone();
    assert!(headers.contains_key("KUBE-X"));
    let ours: Vec<String> = headers
        .keys()
        .filter(|n| n.starts_with("cali40"))
        .cloned()
        .collect();
    assert!(ours.len() >= 5, "{ours:?}");
    let net_set = ours
        .iter()
        .find(|n| n.starts_with("cali40s:") && *n != spare)
        .unwrap()
        .clone();

    // Another program's rule naming a set of ours moves the set's reference count, not its
    // contents (legacy table replaces move it for a moment with every write of anyone's).
    let references = || -> u32 {
        let terse = ns.exec_ok(&["ipset", "list", "-terse", &net_set]);
        terse
            .lines()
            .find_map(|l| l.strip_prefix("References: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("ipset list -terse names the references")
    };
    let before = references();
    ns.exec_ok(&["iptables-legacy", "-w", "-N", "KUBE-NAMES-OURS"]);
    ns.exec_ok(&[
        "iptables-legacy",
        "-w",
        "-A",
        "KUBE-NAMES-OURS",
        "-m",
        "set",
        "--match-set",
        &net_set,
        "src",
        "-j",
        "RETURN",
    ]);
    assert_eq!(references(), before + 1);
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);
    let member = ns
        .exec_ok(&["ipset", "list", &net_set])
        .lines()
        .skip_while(|l| !l.starts_with("Members:"))
        .nth(1)
        .expect("a member")
        .trim()
        .to_string();

    // Another program's set: no concern.
    ns.exec_ok(&["ipset", "add", "KUBE-X", "1.2.3.4"]);
    assert_eq!(w.check().unwrap(), Finding::Foreign);

    // A member swapped for another: the entry count stays, the member digest moves.
    ns.exec_ok(&["ipset", "del", &net_set, &member]);
    ns.exec_ok(&["ipset", "add", &net_set, "10.250.9.9"]);
    let _ = w.check().unwrap();
    assert_eq!(
        w.fingerprint().unwrap()[&net_set].elements,
        headers[&net_set].elements,
        "headers cannot see a swap by the count"
    );
    assert_eq!(w.verify().unwrap(), Finding::Ours(names(&[&net_set])));
    assert_eq!(w.verify().unwrap(), Finding::Unchanged, "reported once");

    // A member deleted, a set flushed, an unreferenced set of ours destroyed.
    ns.exec_ok(&["ipset", "del", &net_set, "10.250.9.9"]);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&[&net_set])));
    let other = ours.iter().find(|n| **n != net_set && *n != spare).unwrap();
    ns.exec_ok(&["ipset", "flush", other]);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&[other])));
    ns.exec_ok(&["ipset", "destroy", spare]);
    assert_eq!(w.check().unwrap(), Finding::Ours(names(&[spare])));
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
}

/// After a write of our own, only the sets written are fingerprinted again: the verify stays
/// exact (no "cannot tell", which made every verify after a busy minute re-read every set),
/// sees a later swap in a set we wrote, and still sees one in a set we did not.
#[test]
fn own_writes_refingerprint_only_the_sets_written_and_the_verify_stays_exact() {
    let ns = NetNs::new("cd-ipset-own");
    program(&ns, false, "legacy");
    let written = "cali40s:writtenByUsJustNow00";
    let untouched = "cali40s:notWrittenThisTime00";
    for set in [written, untouched] {
        ns.exec_ok(&["ipset", "create", set, "hash:net", "family", "inet"]);
        ns.exec_ok(&["ipset", "add", set, "10.251.0.1"]);
    }
    let mut w = in_netns(&ns.name, || {
        IpsetWatch::open(netpol_agent::agent::ours()).expect("ipset netlink socket")
    });
    // Before any fingerprint, a write takes the full one.
    w.rebase_after_write(&names(&[written])).unwrap();
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);

    // Our write: a member swapped (same count) in `written`, and a set created.
    let created = "cali40s:createdByUsJustNow00";
    ns.exec_ok(&["ipset", "del", written, "10.251.0.1"]);
    ns.exec_ok(&["ipset", "add", written, "10.251.0.2"]);
    ns.exec_ok(&["ipset", "create", created, "hash:net", "family", "inet"]);
    w.rebase_after_write(&names(&[written, created])).unwrap();
    assert_eq!(w.check().unwrap(), Finding::Unchanged);
    assert_eq!(
        w.verify().unwrap(),
        Finding::Unchanged,
        "our own write is no change"
    );

    // Someone else's swaps, in the set we wrote and in the one we did not.
    ns.exec_ok(&["ipset", "del", written, "10.251.0.2"]);
    ns.exec_ok(&["ipset", "add", written, "10.251.0.3"]);
    ns.exec_ok(&["ipset", "del", untouched, "10.251.0.1"]);
    ns.exec_ok(&["ipset", "add", untouched, "10.251.0.4"]);
    assert_eq!(
        w.check().unwrap(),
        Finding::Unchanged,
        "counts are unchanged"
    );
    assert_eq!(
        w.verify().unwrap(),
        Finding::Ours(names(&[written, untouched]))
    );

    // Our write destroying a set drops its digest: no change reported for it.
    ns.exec_ok(&["ipset", "destroy", created]);
    w.rebase_after_write(&names(&[created])).unwrap();
    assert_eq!(w.verify().unwrap(), Finding::Unchanged);
}

#[test]
fn membership_tests_answer_as_the_kernel_matches_packets() {
    let ns = NetNs::new("cd-test");
    let v4 = "cali40s:membershipTestNets000";
    let v6 = "cali60s:membershipTestNets000";
    ns.exec_ok(&["ipset", "create", v4, "hash:net", "family", "inet"]);
    ns.exec_ok(&["ipset", "add", v4, "10.252.0.1"]);
    ns.exec_ok(&["ipset", "add", v4, "10.253.0.0/16"]);
    ns.exec_ok(&["ipset", "create", v6, "hash:net", "family", "inet6"]);
    ns.exec_ok(&["ipset", "add", v6, "fd00:252::1"]);
    let mut w = in_netns(&ns.name, || {
        IpsetWatch::open(netpol_agent::agent::ours()).expect("ipset netlink socket")
    });
    let ip = |s: &str| s.parse().unwrap();
    assert!(w.contains(v4, ip("10.252.0.1")).unwrap());
    assert!(!w.contains(v4, ip("10.252.0.2")).unwrap());
    assert!(
        w.contains(v4, ip("10.253.9.9")).unwrap(),
        "a network member covers its addresses"
    );
    assert!(w.contains(v6, ip("fd00:252::1")).unwrap());
    assert!(!w.contains(v6, ip("fd00:252::2")).unwrap());
    // What `ipset del` and `ipset flush` do is seen by the next test.
    ns.exec_ok(&["ipset", "del", v4, "10.252.0.1"]);
    assert!(!w.contains(v4, ip("10.252.0.1")).unwrap());
    ns.exec_ok(&["ipset", "flush", v4]);
    assert!(!w.contains(v4, ip("10.253.9.9")).unwrap());
    // A missing set is an error, never an answer.
    let missing = w.contains("cali40s:noSuchSetHere000000000", ip("10.252.0.1"));
    assert_eq!(
        missing.unwrap_err().kind(),
        std::io::ErrorKind::NotFound,
        "a missing set"
    );
    // The kernel answers any request it cannot match with "not in the set".
    assert!(
        !w.contains(v4, ip("fd00:252::1")).unwrap(),
        "an address of the other family"
    );
}
