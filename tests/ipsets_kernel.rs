//! `IpsetManager` against a real kernel: every test works in its own network namespace
//! (ipsets are per namespace), drives the manager through `ip netns exec`, and checks what
//! `ipset save` prints there.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{run_ok, NetNs};
use netpol_agent::dataplane::ipsets::IpsetManager;
use netpol_agent::host::exec::Exec;
use netpol_agent::model::{IpFamily, Protocol};
use netpol_agent::rules::sets::{restore_script, Member, SetSpec, SetType};

const MAX: u32 = 65536;

fn manager(ns: &NetNs, max: u32) -> IpsetManager {
    IpsetManager::new(Exec::in_netns(&ns.name), max)
}

fn net_set(name: &str, members: &[&str]) -> SetSpec {
    let family = if name.starts_with("cali6") {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    SetSpec {
        name: name.into(),
        family,
        set_type: SetType::HashNet,
        members: members
            .iter()
            .map(|m| Member::Addr(m.parse().unwrap()))
            .collect(),
    }
}

fn port_set(name: &str, members: &[(&str, u16)]) -> SetSpec {
    let family = if name.starts_with("cali6") {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    SetSpec {
        name: name.into(),
        family,
        set_type: SetType::HashIpPort,
        members: members
            .iter()
            .map(|(ip, port)| Member::AddrPort(ip.parse().unwrap(), Protocol::Tcp, *port))
            .collect(),
    }
}

fn desired(sets: Vec<SetSpec>) -> BTreeMap<String, SetSpec> {
    sets.into_iter().map(|s| (s.name.clone(), s)).collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn all_names(d: &BTreeMap<String, SetSpec>) -> BTreeSet<String> {
    d.keys().cloned().collect()
}

/// `name -> (create line without the kernel's sizing words, entries)` of `ipset save` or
/// `ipset restore` text.
type Sets = BTreeMap<String, (String, BTreeSet<String>)>;

fn normalize(text: &str) -> Sets {
    let mut out = Sets::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["create", name, rest @ ..] => {
                let mut kept = vec!["create", name];
                let mut it = rest.iter();
                while let Some(w) = it.next() {
                    if matches!(*w, "hashsize" | "bucketsize" | "initval") {
                        it.next();
                    } else {
                        kept.push(w);
                    }
                }
                out.insert(name.to_string(), (kept.join(" "), BTreeSet::new()));
            }
            ["add", name, entry @ ..] => {
                out.get_mut(*name).unwrap().1.insert(entry.join(" "));
            }
            _ => {}
        }
    }
    out
}

fn kernel_sets(ns: &NetNs) -> Sets {
    normalize(&ns.exec_ok(&["ipset", "save"]))
}

/// Only the sets whose names start with `cali`.
fn kernel_cali_sets(ns: &NetNs) -> Sets {
    kernel_sets(ns)
        .into_iter()
        .filter(|(n, _)| n.starts_with("cali"))
        .collect()
}

fn expected(d: &BTreeMap<String, SetSpec>, max: u32) -> Sets {
    normalize(&restore_script(d, max))
}

fn set_names(ns: &NetNs) -> BTreeSet<String> {
    ns.exec_ok(&["ipset", "list", "-n"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn creates_and_fills_sets_from_nothing() {
    let ns = NetNs::new("ipset-create");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    assert!(mgr.cached_names().is_empty());
    let want = desired(vec![
        net_set("cali40s:web", &["10.0.0.1", "10.0.0.2", "10.0.1.7"]),
        net_set("cali40s:empty", &[]),
        port_set("cali40n:http", &[("10.0.0.1", 8080), ("10.0.0.2", 8080)]),
    ]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&want, MAX));
    assert_eq!(mgr.stats().restore_calls, 1, "one restore for the family");
    assert_eq!(mgr.stats().lines, 3 + 5);
    assert_eq!(mgr.stats().errors, 0);
    assert_eq!(
        mgr.cached_names(),
        ["cali40n:http", "cali40s:empty", "cali40s:web"]
    );
    // Phase 3 has nothing to do.
    mgr.apply_removals(&want, &all_names(&want)).unwrap();
    assert_eq!(mgr.stats().restore_calls, 1);
    // What the cache holds is what the kernel holds.
    let mut fresh = manager(&ns, MAX);
    fresh.resync().unwrap();
    fresh.apply_additions(&want, &all_names(&want)).unwrap();
    fresh.apply_removals(&want, &all_names(&want)).unwrap();
    assert_eq!(fresh.stats().restore_calls, 0);
}

#[test]
fn steady_state_starts_no_restore() {
    let ns = NetNs::new("ipset-steady");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1"]),
        net_set("cali60s:a", &["fd00::1"]),
    ]);
    let dirty = all_names(&want);
    mgr.apply_additions(&want, &dirty).unwrap();
    mgr.apply_removals(&want, &dirty).unwrap();
    let after_first = mgr.stats().clone();
    assert_eq!(after_first.restore_calls, 2, "one restore per family");
    for _ in 0..3 {
        mgr.apply_additions(&want, &dirty).unwrap();
        mgr.apply_removals(&want, &dirty).unwrap();
    }
    assert_eq!(mgr.stats(), &after_first);
    // A resync of an unchanged kernel changes nothing either.
    mgr.resync().unwrap();
    mgr.apply_additions(&want, &dirty).unwrap();
    mgr.apply_removals(&want, &dirty).unwrap();
    assert_eq!(mgr.stats(), &after_first);
}

#[test]
fn member_additions_and_removals_are_deltas() {
    let ns = NetNs::new("ipset-delta");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let v1 = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        net_set("cali40s:b", &["10.0.1.1"]),
        port_set("cali40n:c", &[("10.0.0.1", 80), ("10.0.0.2", 80)]),
    ]);
    mgr.apply_additions(&v1, &all_names(&v1)).unwrap();
    let base = mgr.stats().clone();

    let v2 = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.4"]),
        net_set("cali40s:b", &["10.0.1.1"]),
        port_set("cali40n:c", &[("10.0.0.1", 80), ("10.0.0.3", 443)]),
    ]);
    let dirty = names(&["cali40s:a", "cali40n:c"]);
    mgr.apply_additions(&v2, &dirty).unwrap();
    // Phase 1 adds and deletes members in one restore, as felix does: the sets are right
    // before iptables is written.
    assert_eq!(mgr.stats().restore_calls, base.restore_calls + 1);
    assert_eq!(
        mgr.stats().lines,
        base.lines + 2 + 3,
        "two adds and three dels only"
    );
    assert_eq!(kernel_sets(&ns), expected(&v2, MAX));

    mgr.apply_removals(&v2, &dirty).unwrap();
    assert_eq!(
        mgr.stats().restore_calls,
        base.restore_calls + 1,
        "no set goes, so phase 3 starts no process"
    );
    assert_eq!(kernel_sets(&ns), expected(&v2, MAX));

    // A set that is no longer desired goes in phase 3, not before.
    let v3 = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.4"]),
        port_set("cali40n:c", &[("10.0.0.1", 80), ("10.0.0.3", 443)]),
    ]);
    let dirty = names(&["cali40s:b"]);
    let calls = mgr.stats().restore_calls;
    mgr.apply_additions(&v3, &dirty).unwrap();
    assert_eq!(mgr.stats().restore_calls, calls);
    assert!(set_names(&ns).contains("cali40s:b"));
    mgr.apply_removals(&v3, &dirty).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&v3, MAX));
    assert_eq!(mgr.cached_names(), ["cali40n:c", "cali40s:a"]);
    assert_eq!(mgr.stats().errors, 0);
}

/// The `hashsize` ipset's header reports for `set` in `ns`.
fn header_hashsize(ns: &NetNs, set: &str) -> u32 {
    let out = run_ok(
        "ip",
        &["netns", "exec", &ns.name, "ipset", "list", "-t", set],
    );
    out.split_whitespace()
        .skip_while(|w| *w != "hashsize")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no hashsize in {out:?}"))
}

#[test]
fn small_sets_start_small_and_the_kernel_grows_them() {
    // Issue 20: the set check's cost follows the sets' bucket counts, so a set is created
    // with a table fitted to its members; one that grows past it must still take them all.
    let ns = NetNs::new("ipset-hashsize");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let v1 = desired(vec![net_set("cali40s:grow", &["10.0.0.1", "10.0.0.2"])]);
    mgr.apply_additions(&v1, &all_names(&v1)).unwrap();
    assert_eq!(header_hashsize(&ns, "cali40s:grow"), 64);

    let many: Vec<String> = (0..20_000u32)
        .map(|i| format!("10.{}.{}.1", i / 250, i % 250))
        .collect();
    let many_refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let v2 = desired(vec![net_set("cali40s:grow", &many_refs)]);
    mgr.apply_additions(&v2, &all_names(&v2)).unwrap();
    mgr.apply_removals(&v2, &all_names(&v2)).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&v2, MAX));
    assert!(
        header_hashsize(&ns, "cali40s:grow") > 64,
        "the kernel resized the table"
    );
    assert_eq!(mgr.stats().errors, 0);
}

#[test]
fn maxelem_change_swaps_through_a_temp_set_and_keeps_members() {
    let ns = NetNs::new("ipset-maxelem");
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.2"]),
        net_set("cali40s:same", &["10.0.9.9"]),
    ]);
    let mut old = manager(&ns, 1024);
    old.resync().unwrap();
    old.apply_additions(&want, &all_names(&want)).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&want, 1024));

    // The agent restarts with another FELIX_MAXIPSETSIZE, and one member changes meanwhile.
    let mut mgr = manager(&ns, 2048);
    mgr.resync().unwrap();
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        net_set("cali40s:same", &["10.0.9.9"]),
    ]);
    mgr.apply_additions(&want, &names(&["cali40s:a"])).unwrap();
    assert_eq!(mgr.stats().restore_calls, 1);
    let sets = kernel_cali_sets(&ns);
    assert_eq!(sets["cali40s:a"], expected(&want, 2048)["cali40s:a"]);
    // Not dirty: left alone (the caller marks every set dirty when the size changes).
    assert_eq!(sets["cali40s:same"], expected(&want, 1024)["cali40s:same"]);
    // The temp set holds the old contents until phase 3.
    let temps: Vec<&String> = sets.keys().filter(|n| n.starts_with("cali4t")).collect();
    assert_eq!(temps.len(), 1, "{sets:?}");
    let temp = temps[0].clone();
    assert_eq!(
        sets[&temp].1,
        names(&["10.0.0.1", "10.0.0.2"]),
        "old contents in the temp set"
    );
    assert!(sets[&temp].0.contains("maxelem 1024"));

    mgr.apply_removals(&want, &BTreeSet::new()).unwrap();
    let sets = kernel_cali_sets(&ns);
    assert!(!sets.contains_key(&temp));
    assert_eq!(sets["cali40s:a"], expected(&want, 2048)["cali40s:a"]);
    assert_eq!(mgr.cached_names(), ["cali40s:a", "cali40s:same"]);
    assert_eq!(mgr.stats().errors, 0);
}

#[test]
fn set_of_the_wrong_type_is_replaced() {
    let ns = NetNs::new("ipset-type");
    // Someone (an older version, a person) left sets under our names that we would not write.
    ns.sh_ok(
        "ipset create cali40s:a hash:ip maxelem 65536 && ipset add cali40s:a 10.0.0.7 && \
         ipset create cali40s:b hash:net family inet6 && \
         ipset create cali40n:c hash:net maxelem 65536 && ipset add cali40n:c 10.0.0.1 && \
         ipset create cali40s:d hash:net maxelem 65536 && ipset add cali40s:d 10.0.0.0/24 && \
         ipset add cali40s:d 10.0.0.1 && ipset add cali40s:d 10.0.0.5 nomatch && \
         ipset create cali40s:e hash:net maxelem 65536 timeout 600 && ipset add cali40s:e 10.0.0.1",
    );
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.2"]),
        net_set("cali40s:b", &["10.0.0.3"]),
        port_set("cali40n:c", &[("10.0.0.1", 80)]),
        net_set("cali40s:d", &["10.0.0.1", "10.0.0.5"]),
        net_set("cali40s:e", &["10.0.0.1"]),
    ]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    mgr.apply_removals(&want, &all_names(&want)).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&want, MAX));
    assert_eq!(mgr.stats().errors, 0);
    assert_eq!(mgr.stats().restore_calls, 2);
}

#[test]
fn referenced_set_is_destroyed_once_iptables_lets_go() {
    let ns = NetNs::new("ipset-inuse");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let v1 = desired(vec![
        net_set("cali40s:a-used", &["10.0.0.1"]),
        net_set("cali40s:b-free", &["10.0.0.2"]),
        net_set("cali40s:c-kept", &["10.0.0.3", "10.0.0.4"]),
    ]);
    mgr.apply_additions(&v1, &all_names(&v1)).unwrap();
    let rule = "FORWARD -m set --match-set cali40s:a-used src -j ACCEPT";
    ns.sh_ok(&format!("iptables-legacy -w -A {rule}"));

    // Both other sets sort after the referenced one: the refused destroy must not stop them.
    let v2 = desired(vec![net_set("cali40s:c-kept", &["10.0.0.3"])]);
    let dirty = all_names(&v1);
    // The refusal's instant lies between these two (the back-off is measured from it); the
    // checks below call ipset, which takes longer than a back-off under emulation (TCG).
    let before = std::time::Instant::now();
    mgr.apply_removals(&v2, &dirty).unwrap();
    let after = std::time::Instant::now();
    let present = set_names(&ns);
    assert!(present.contains("cali40s:a-used"), "still referenced");
    assert!(!present.contains("cali40s:b-free"));
    assert_eq!(kernel_sets(&ns)["cali40s:c-kept"].1, names(&["10.0.0.3"]));
    assert_eq!(mgr.pending_destroys(), ["cali40s:a-used"]);
    assert!(mgr.stats().errors >= 1);
    assert!(mgr.cached_names().contains(&"cali40s:a-used".to_string()));

    // Due again after the first back-off wait (200 ms), not at once.
    let ms = std::time::Duration::from_millis;
    assert!(!mgr.destroy_retry_due(before + ms(190)));
    assert!(mgr.destroy_retry_due(after + ms(250)));

    // Still referenced: retried, still refused, still fine; the next try waits longer (400 ms).
    let before = std::time::Instant::now();
    mgr.apply_removals(&v2, &BTreeSet::new()).unwrap();
    let after = std::time::Instant::now();
    assert!(set_names(&ns).contains("cali40s:a-used"));
    assert!(!mgr.destroy_retry_due(before + ms(390)));
    assert!(mgr.destroy_retry_due(after + ms(450)));

    ns.sh_ok(&format!("iptables-legacy -w -D {rule}"));
    let calls = mgr.stats().restore_calls;
    // Nothing dirty this time: the pending destroy is retried on its own.
    mgr.apply_removals(&v2, &BTreeSet::new()).unwrap();
    assert_eq!(mgr.stats().restore_calls, calls + 1);
    assert!(!set_names(&ns).contains("cali40s:a-used"));
    assert!(mgr.pending_destroys().is_empty());
    assert!(!mgr.destroy_retry_due(std::time::Instant::now() + std::time::Duration::from_secs(60)));
    assert_eq!(kernel_cali_sets(&ns), expected(&v2, MAX));
    // And then nothing more to do.
    mgr.apply_removals(&v2, &dirty).unwrap();
    assert_eq!(mgr.stats().restore_calls, calls + 1);
}

#[test]
fn referenced_set_of_the_wrong_type_is_reported_and_the_rest_applied() {
    let ns = NetNs::new("ipset-inuse-type");
    ns.sh_ok(
        "ipset create cali40s:a hash:ip && \
         iptables-legacy -A FORWARD -m set --match-set cali40s:a src -j ACCEPT",
    );
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1"]),
        net_set("cali40s:b", &["10.0.0.2"]),
    ]);
    let err = mgr
        .apply_additions(&want, &all_names(&want))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cali40s:a") && err.contains("in use"), "{err}");
    let sets = kernel_sets(&ns);
    assert_eq!(sets["cali40s:b"], expected(&want, MAX)["cali40s:b"]);
    assert!(sets["cali40s:a"].0.contains("hash:ip "), "left as it was");

    ns.sh_ok("iptables-legacy -w -F FORWARD");
    mgr.apply_additions(&want, &names(&["cali40s:a"])).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&want, MAX));
}

#[test]
fn resync_adopts_existing_sets_without_rewriting_them() {
    let ns = NetNs::new("ipset-adopt");
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1", "10.0.0.2"]),
        port_set("cali40n:b", &[("10.0.0.1", 8080)]),
        net_set("cali60s:a", &["fd00::1", "fd00:0:0:1::2"]),
        port_set("cali60n:b", &[("fd00::1", 8080)]),
    ]);
    // A previous run of the agent left exactly this (v6 entries written in long form).
    let script = restore_script(&want, MAX).replace(
        "add cali60s:a fd00::1\n",
        "add cali60s:a fd00:0:0:0:0:0:0:1/128\n",
    );
    ns.sh_ok(&format!("ipset restore <<'EOF'\n{script}EOF"));
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    assert_eq!(
        mgr.cached_names(),
        ["cali40n:b", "cali40s:a", "cali60n:b", "cali60s:a"]
    );
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    mgr.apply_removals(&want, &all_names(&want)).unwrap();
    assert_eq!(mgr.stats().restore_calls, 0);
    assert_eq!(mgr.stats().lines, 0);
}

#[test]
fn sets_of_others_are_never_touched() {
    let ns = NetNs::new("ipset-foreign");
    ns.sh_ok(
        "ipset create KUBE-X hash:ip && ipset add KUBE-X 10.9.9.9 && \
         ipset create cali-other hash:net && ipset add cali-other 10.8.8.8 && \
         ipset create cali41s:x hash:net",
    );
    let foreign_before = kernel_sets(&ns);
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    assert!(mgr.cached_names().is_empty());
    let want = desired(vec![net_set("cali40s:mine", &["10.0.0.1"])]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    // Foreign names, dirty and not desired: nothing happens to them.
    let dirty = names(&["KUBE-X", "cali-other", "cali41s:x", "cali40s:mine"]);
    mgr.apply_removals(&want, &dirty).unwrap();
    // Foreign names, desired: refused, and still untouched.
    let bad = desired(vec![net_set("KUBE-X", &["10.0.0.1"])]);
    assert!(mgr.apply_additions(&bad, &names(&["KUBE-X"])).is_err());
    mgr.apply_removals(&bad, &names(&["KUBE-X"])).unwrap();

    let mut sets = kernel_sets(&ns);
    assert!(sets.remove("cali40s:mine").is_some());
    assert_eq!(sets, foreign_before);

    mgr.destroy_all_owned().unwrap();
    assert_eq!(kernel_sets(&ns), foreign_before);
    assert!(mgr.cached_names().is_empty());
}

#[test]
fn destroy_all_owned_removes_our_sets_including_temp_ones() {
    let ns = NetNs::new("ipset-cleanup");
    ns.sh_ok("ipset create cali4t7 hash:net && ipset create cali60x:odd list:set");
    let mut mgr = manager(&ns, MAX);
    let want = desired(vec![
        net_set("cali40s:a", &["10.0.0.1"]),
        net_set("cali60s:a", &["fd00::1"]),
    ]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    // A fresh manager (the cleanup command) knows nothing yet.
    let mut cleanup = manager(&ns, MAX);
    cleanup.destroy_all_owned().unwrap();
    assert!(set_names(&ns).is_empty(), "{:?}", set_names(&ns));
    assert!(cleanup.cached_names().is_empty());
}

#[test]
fn leftover_temp_set_is_destroyed_in_phase_3() {
    let ns = NetNs::new("ipset-temp");
    ns.sh_ok("ipset create cali4t0 hash:net && ipset create cali6t3 hash:net family inet6");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    assert_eq!(mgr.cached_names(), ["cali4t0", "cali6t3"]);
    let want = desired(vec![net_set("cali40s:a", &["10.0.0.1"])]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    mgr.apply_removals(&want, &BTreeSet::new()).unwrap();
    assert_eq!(set_names(&ns), names(&["cali40s:a"]));
}

#[test]
fn ipv6_sets_work() {
    let ns = NetNs::new("ipset-v6");
    let mut mgr = manager(&ns, MAX);
    mgr.resync().unwrap();
    let v1 = desired(vec![
        net_set("cali60s:a", &["fd00::1", "fd00:0:0:1::2", "2001:db8::abcd"]),
        port_set("cali60n:b", &[("fd00::1", 80), ("fd00::2", 443)]),
        net_set("cali40s:a", &["10.0.0.1"]),
    ]);
    mgr.apply_additions(&v1, &all_names(&v1)).unwrap();
    assert_eq!(mgr.stats().restore_calls, 2, "one restore per family");
    assert_eq!(kernel_sets(&ns), expected(&v1, MAX));
    assert!(kernel_sets(&ns)["cali60s:a"].0.contains("family inet6"));

    let v2 = desired(vec![
        net_set("cali60s:a", &["fd00::1", "fd00::3"]),
        port_set("cali60n:b", &[("fd00::1", 80)]),
        net_set("cali40s:a", &["10.0.0.1"]),
    ]);
    let dirty = names(&["cali60s:a", "cali60n:b"]);
    mgr.apply_additions(&v2, &dirty).unwrap();
    assert_eq!(mgr.stats().restore_calls, 3, "v6 only");
    assert_eq!(kernel_sets(&ns), expected(&v2, MAX));
    mgr.apply_removals(&v2, &dirty).unwrap();
    assert_eq!(mgr.stats().restore_calls, 3, "nothing left for phase 3");
    mgr.resync().unwrap();
    mgr.apply_additions(&v2, &all_names(&v2)).unwrap();
    mgr.apply_removals(&v2, &all_names(&v2)).unwrap();
    assert_eq!(mgr.stats().restore_calls, 3);
    assert_eq!(mgr.stats().errors, 0);
}

#[test]
fn a_failing_set_is_retried_then_reported_without_blocking_the_others() {
    let ns = NetNs::new("ipset-fail");
    // maxelem 2: the set with three members cannot be filled.
    let mut mgr = manager(&ns, 2);
    mgr.resync().unwrap();
    let want = desired(vec![
        net_set("cali40s:a-big", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        net_set("cali40s:b", &["10.0.1.1"]),
        net_set("cali40s:c", &["10.0.2.1", "10.0.2.2"]),
    ]);
    let err = mgr
        .apply_additions(&want, &all_names(&want))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cali40s:a-big"), "{err}");
    assert_eq!(mgr.stats().errors, 4, "first try and three retries");
    assert_eq!(mgr.stats().restore_calls, 4);
    // The others went in on a retry; the cache was re-read and is true.
    let sets = kernel_sets(&ns);
    assert_eq!(sets["cali40s:b"], expected(&want, 2)["cali40s:b"]);
    assert_eq!(sets["cali40s:c"], expected(&want, 2)["cali40s:c"]);
    assert_eq!(sets["cali40s:a-big"].1.len(), 2);
    assert_eq!(
        mgr.cached_names(),
        ["cali40s:a-big", "cali40s:b", "cali40s:c"]
    );
}

#[test]
fn missing_namespace_is_an_error_not_a_panic() {
    let mut mgr = IpsetManager::new(Exec::in_netns("npa-test-does-not-exist"), MAX);
    assert!(mgr.resync().is_err());
    let want = desired(vec![net_set("cali40s:a", &["10.0.0.1"])]);
    assert!(mgr.apply_additions(&want, &all_names(&want)).is_err());
    assert_eq!(mgr.stats().errors, 4);
    assert!(mgr.destroy_all_owned().is_err());
    // Nothing of this reached the host.
    let host = run_ok("ipset", &["list", "-n"]);
    assert!(!host.lines().any(|l| l == "cali40s:a"));
}

#[test]
fn stale_cache_heals_through_resync_and_retry() {
    let ns = NetNs::new("ipset-stale");
    ns.sh_ok("ipset create cali40s:a hash:net maxelem 1024 && ipset add cali40s:a 10.0.0.9");
    // No resync: the cache believes nothing exists, so the first restore's `create` clashes
    // with the set that is there (another maxelem); the retry plans from the kernel's state.
    let mut mgr = manager(&ns, MAX);
    let want = desired(vec![net_set("cali40s:a", &["10.0.0.1"])]);
    mgr.apply_additions(&want, &all_names(&want)).unwrap();
    assert_eq!(mgr.stats().errors, 1);
    assert_eq!(mgr.stats().restore_calls, 2);
    mgr.apply_removals(&want, &all_names(&want)).unwrap();
    assert_eq!(kernel_sets(&ns), expected(&want, MAX));
}
