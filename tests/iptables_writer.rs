//! The iptables writer against real kernels: every test runs in its own network namespace,
//! legacy and nft backends, IPv4 and IPv6. The desired state is the demo shop compiled by the
//! calc graph (as `netpol-agent compile` does), plus what each test changes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::NetNs;
use netpol_agent::agent::{Calculation, OWNERSHIP};
use netpol_agent::backoff::Policy;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::dataplane::iptables::{
    detect_backend, tool_name, Backend, BackendMode, DesiredTable, TableWriter,
};
use netpol_agent::datastore::manifests;
use netpol_agent::host::exec::Exec;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::{IpFamily, ObjectKey};
use netpol_agent::rules::chains::kernel_chain_rules;
use netpol_agent::rules::{render_rules, Action, Chain, ChainInsertMode, Rule, RuleConfig};

const ALL: [(Backend, IpFamily); 4] = [
    (Backend::Legacy, IpFamily::V4),
    (Backend::Nft, IpFamily::V4),
    (Backend::Legacy, IpFamily::V6),
    (Backend::Nft, IpFamily::V6),
];

fn exec(ns: &NetNs) -> Exec {
    Exec::in_netns(&ns.name)
}

/// The writer's programs run in the test's namespace, not the host's: `Exec` enters it by
/// `setns` (no `ip netns exec` wrapper), and what they read is the namespace's own.
#[test]
fn exec_runs_programs_inside_the_namespace() {
    let ns = NetNs::new("exec");
    ns.exec_ok(&[
        "ip",
        "link",
        "add",
        "npa-exec0",
        "type",
        "veth",
        "peer",
        "name",
        "npa-exec1",
    ]);
    let read = |exec: &Exec| {
        let out = exec
            .command("cat")
            .arg("/proc/net/dev")
            .output()
            .expect("cat runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let inside = read(&exec(&ns));
    assert!(inside.contains("npa-exec0:"), "{inside}");
    assert!(
        !read(&Exec::default()).contains("npa-exec0:"),
        "the namespace's link is seen from the host"
    );
    let tables = exec(&ns)
        .command(&cli(Backend::Legacy, IpFamily::V4))
        .args(["-w", "-N", "NPA-EXEC-PROBE"])
        .status()
        .expect("iptables runs");
    assert!(tables.success());
    assert!(save(&ns, Backend::Legacy, IpFamily::V4).contains(":NPA-EXEC-PROBE"));
}

/// The iptables command line tool (`iptables-legacy`, `ip6tables-nft`, ...).
fn cli(backend: Backend, family: IpFamily) -> String {
    let save = tool_name(family, backend, "save");
    save.trim_end_matches("-save").to_string()
}

/// The demo shop compiled for node-1, its sets loaded into `ns`.
struct Demo {
    graph: Calculation,
    family: IpFamily,
    mode: ChainInsertMode,
}

impl Demo {
    fn new(ns: &NetNs, family: IpFamily, mode: ChainInsertMode) -> Demo {
        let rules = RuleConfig {
            insert_mode: mode,
            ..RuleConfig::default()
        };
        let mut graph = Calculation::new(
            GraphConfig {
                node_name: "node-1".into(),
                families: vec![family],
                rules,
            },
            Box::new(CalicoResolver::default()),
        );
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/demo");
        let (objects, errors) = manifests::load_paths(&[dir]).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        graph.feed(&objects);
        graph.flush();
        let demo = Demo {
            graph,
            family,
            mode,
        };
        let fam = demo.graph.snapshot().families[&family].clone();
        let sets = netpol_agent::rules::sets::restore_script(&fam.sets, 1 << 20);
        let file = std::env::temp_dir().join(format!("{}-sets", ns.name));
        std::fs::write(&file, sets).unwrap();
        ns.sh_ok(&format!("ipset restore < '{}'", file.display()));
        let _ = std::fs::remove_file(&file);
        demo
    }

    fn desired(&self) -> DesiredTable {
        let state = self.graph.snapshot();
        DesiredTable {
            chains: state.families[&self.family].chains.clone(),
            kernel: kernel_chain_rules(&self.graph.config().rules, self.family),
            insert_mode: self.mode,
        }
    }
}

fn all_dirty() -> BTreeSet<String> {
    BTreeSet::new()
}

/// Other programs' state: a chain of their own, jumped to from FORWARD.
fn add_foreign(ns: &NetNs, backend: Backend, family: IpFamily) {
    let ipt = cli(backend, family);
    ns.exec_ok(&[&ipt, "-w", "-N", "KUBE-TEST"]);
    ns.exec_ok(&[
        &ipt,
        "-w",
        "-A",
        "KUBE-TEST",
        "-p",
        "tcp",
        "--dport",
        "9",
        "-j",
        "REJECT",
    ]);
    ns.exec_ok(&[&ipt, "-w", "-A", "FORWARD", "-j", "KUBE-TEST"]);
    ns.exec_ok(&[
        &ipt, "-w", "-A", "INPUT", "-p", "udp", "--dport", "53", "-j", "ACCEPT",
    ]);
}

fn save(ns: &NetNs, backend: Backend, family: IpFamily) -> String {
    ns.exec_ok(&[&tool_name(family, backend, "save"), "-t", "filter"])
}

/// Full save of every table, without comments and counters.
fn full_save(ns: &NetNs, backend: Backend, family: IpFamily) -> String {
    ns.exec_ok(&[&tool_name(family, backend, "save")])
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.rsplit_once(" [") {
            Some((head, tail)) if l.starts_with(':') && tail.ends_with(']') => head.to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn by_chain(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // iptables-nft-save 1.8.7 ends a rule without a target with a space.
    for line in text.lines().map(str::trim_end) {
        if let Some(decl) = line.strip_prefix(':') {
            out.entry(decl.split(' ').next().unwrap().to_string())
                .or_default();
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, body) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(chain.to_string())
                .or_default()
                .push(body.to_string());
        }
    }
    out
}

fn is_ours(body: &str) -> bool {
    body.split_once("--comment ")
        .is_some_and(|(_, c)| c.trim_start_matches('"').starts_with("cali:"))
}

/// The kernel holds exactly our desired chains, our kernel-chain rules in felix's layout, and
/// the foreign rules `add_foreign` made.
fn check_kernel(ns: &NetNs, backend: Backend, family: IpFamily, desired: &DesiredTable) {
    let saved = by_chain(&save(ns, backend, family));
    let ours: BTreeSet<&String> = saved.keys().filter(|c| c.starts_with("cali-")).collect();
    assert_eq!(ours, desired.chains.keys().collect(), "our chains");
    for (name, chain) in &desired.chains {
        let want: Vec<&str> = chain.rules.iter().map(|r| r.body.as_str()).collect();
        assert_eq!(saved[name], want, "chain {name} ({backend:?} {family:?})");
    }
    for k in &desired.kernel {
        let have = &saved[&k.chain];
        let ins: Vec<&str> = k.inserts.iter().map(|r| r.body.as_str()).collect();
        let app: Vec<&str> = k.appends.iter().map(|r| r.body.as_str()).collect();
        let ours: Vec<&str> = have
            .iter()
            .map(String::as_str)
            .filter(|b| is_ours(b))
            .collect();
        let all: Vec<&str> = ins.iter().chain(&app).copied().collect();
        assert_eq!(ours, all, "our rules in {}: {have:#?}", k.chain);
        let n = have.len();
        assert_eq!(have[n - app.len()..], app, "appends last in {}", k.chain);
        match desired.insert_mode {
            ChainInsertMode::Insert => {
                assert_eq!(have[..ins.len()], ins, "inserts first in {}", k.chain)
            }
            ChainInsertMode::Append => assert_eq!(
                have[n - app.len() - ins.len()..n - app.len()],
                ins,
                "inserts after the others in {}",
                k.chain
            ),
        }
    }
    check_foreign(&saved);
}

fn check_foreign(saved: &BTreeMap<String, Vec<String>>) {
    assert_eq!(
        saved.get("KUBE-TEST").map(Vec::len),
        Some(1),
        "foreign chain: {saved:#?}"
    );
    assert!(saved["KUBE-TEST"][0].contains("--dport 9"));
    assert_eq!(
        saved["FORWARD"]
            .iter()
            .filter(|b| *b == "-j KUBE-TEST")
            .count(),
        1
    );
    assert_eq!(
        saved["INPUT"]
            .iter()
            .filter(|b| b.contains("--dport 53") && b.ends_with("-j ACCEPT"))
            .count(),
        1
    );
}

#[test]
fn first_apply_matches_rendering_then_nothing_to_do_then_remove_all_restores() {
    for (backend, family) in ALL {
        for mode in [ChainInsertMode::Insert, ChainInsertMode::Append] {
            let ns = NetNs::new("writer-first");
            add_foreign(&ns, backend, family);
            let before = full_save(&ns, backend, family);
            let demo = Demo::new(&ns, family, mode);
            let desired = demo.desired();
            let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP);

            let lines = w.apply(&desired, &all_dirty()).unwrap();
            let rules: usize = desired.chains.values().map(|c| c.rules.len()).sum();
            // One `:` line per chain, one line per rule, our three jumps and the accept.
            assert_eq!(lines, desired.chains.len() + rules + 4);
            check_kernel(&ns, backend, family, &desired);
            assert_eq!((w.stats().save_calls, w.stats().restore_calls), (1, 1));

            // Nothing dirty: no save, no restore, no line.
            assert_eq!(w.apply(&desired, &all_dirty()).unwrap(), 0);
            assert_eq!((w.stats().save_calls, w.stats().restore_calls), (1, 1));

            // What we wrote is what the kernel prints: a re-read finds nothing to fix.
            w.invalidate();
            assert_eq!(w.apply(&desired, &all_dirty()).unwrap(), 0);
            assert_eq!((w.stats().save_calls, w.stats().restore_calls), (2, 1));

            w.remove_all().unwrap();
            assert_eq!(
                full_save(&ns, backend, family),
                before,
                "{backend:?} {family:?} {mode:?}"
            );
            assert_eq!(w.stats().restore_errors, 0);
        }
    }
}

fn big_chain(name: &str, n: usize, family: IpFamily, extra_at: Option<usize>) -> Chain {
    let mut rules: Vec<Rule> = (0..n)
        .map(|i| {
            Rule::new(Action::Return).matching(format!(
                "-m mark --mark {:#x}/{:#x}",
                i << 16,
                0xffff0000u32
            ))
        })
        .collect();
    if let Some(at) = extra_at {
        rules.insert(at, Rule::new(Action::Drop).comment("the one new rule"));
    }
    Chain::new(name, family, rules)
}

#[test]
fn one_rule_at_position_two_of_200_writes_one_line() {
    for (backend, family) in ALL {
        let ns = NetNs::new("writer-big");
        add_foreign(&ns, backend, family);
        let demo = Demo::new(&ns, family, ChainInsertMode::Insert);
        let mut desired = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP);
        desired.chains.insert(
            "cali-big".into(),
            big_chain("cali-big", 200, family, None).into(),
        );
        w.apply(&desired, &all_dirty()).unwrap();

        desired.chains.insert(
            "cali-big".into(),
            big_chain("cali-big", 200, family, Some(1)).into(),
        );
        let dirty: BTreeSet<String> = ["cali-big".to_string()].into();
        assert_eq!(w.apply(&desired, &dirty).unwrap(), 1);
        assert_eq!(w.stats().restore_calls, 2);
        check_kernel(&ns, backend, family, &desired);
        let saved = by_chain(&save(&ns, backend, family));
        assert_eq!(saved["cali-big"].len(), 201);
        assert!(saved["cali-big"][1].contains("the one new rule"));

        // Removing it again is one `-D`.
        desired.chains.insert(
            "cali-big".into(),
            big_chain("cali-big", 200, family, None).into(),
        );
        assert_eq!(w.apply(&desired, &dirty).unwrap(), 1);
        check_kernel(&ns, backend, family, &desired);
        w.invalidate();
        assert_eq!(w.apply(&desired, &all_dirty()).unwrap(), 0);
    }
}

#[test]
fn removing_a_policy_deletes_its_chains_and_jumps() {
    for (backend, family) in ALL {
        let ns = NetNs::new("writer-rmpol");
        add_foreign(&ns, backend, family);
        let mut demo = Demo::new(&ns, family, ChainInsertMode::Insert);
        let before = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP);
        w.apply(&before, &all_dirty()).unwrap();

        demo.graph
            .remove_policy(&ObjectKey::new("shop", "api-egress"));
        let update = demo.graph.flush();
        let mut dirty = BTreeSet::new();
        for (_, c) in &update.chains_upserted {
            dirty.insert(c.name.clone());
        }
        for (_, name) in &update.chains_removed {
            dirty.insert(name.clone());
        }
        assert!(!update.chains_removed.is_empty(), "the policy had a chain");
        let after = demo.desired();
        let lines = w.apply(&after, &dirty).unwrap();
        assert!(lines > 0);
        check_kernel(&ns, backend, family, &after);
        let saved = save(&ns, backend, family);
        for (_, name) in &update.chains_removed {
            assert!(!saved.contains(&format!(":{name} ")), "{name} still there");
        }
        // Both backends delete the chains in the transaction that drops their references.
        assert_eq!(w.stats().restore_calls, 2, "{backend:?}");
        w.invalidate();
        assert_eq!(w.apply(&after, &all_dirty()).unwrap(), 0);
    }
}

/// A chain deletion the kernel refuses (another program jumps to the policy chain) fails the
/// restore it is in. On nft the writer then deletes chains in a second transaction, so the
/// policy's removal from the pods' chains still commits and only the deletion keeps failing;
/// legacy's whole-table restore commits nothing. Once the other jump is gone, the chain goes.
#[test]
fn a_refused_chain_deletion_is_split_from_the_updates_on_nft() {
    for (backend, family) in [
        (Backend::Nft, IpFamily::V4),
        (Backend::Legacy, IpFamily::V4),
    ] {
        let ns = NetNs::new("writer-busy");
        add_foreign(&ns, backend, family);
        let mut demo = Demo::new(&ns, family, ChainInsertMode::Insert);
        let before = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP).with_retry(Policy {
            tries: Some(3),
            first: Duration::from_millis(10),
            ..Policy::IPTABLES_RESTORE
        });
        w.apply(&before, &all_dirty()).unwrap();

        demo.graph
            .remove_policy(&ObjectKey::new("shop", "api-egress"));
        let update = demo.graph.flush();
        let removed: Vec<String> = update
            .chains_removed
            .iter()
            .map(|(_, n)| n.clone())
            .collect();
        let held = removed
            .iter()
            .find(|n| {
                before
                    .chains
                    .get(n.as_str())
                    .is_some_and(|c| !c.rules.is_empty())
            })
            .expect("the policy had a chain with rules")
            .clone();
        let ipt = cli(backend, family);
        ns.exec_ok(&[&ipt, "-w", "-A", "KUBE-TEST", "-j", &held]);
        let mut dirty: BTreeSet<String> = removed.iter().cloned().collect();
        dirty.extend(update.chains_upserted.iter().map(|(_, c)| c.name.clone()));
        let after = demo.desired();
        let err = w.apply(&after, &dirty).unwrap_err();
        let saved = save(&ns, backend, family);
        assert!(
            saved.contains(&format!(":{held} ")),
            "{held} was deleted: {err:#}"
        );
        let jumps_to_held = |saved: &str| {
            saved
                .lines()
                .filter(|l| l.starts_with("-A cali-") && l.ends_with(&format!("-j {held}")))
                .count()
        };
        match backend {
            Backend::Nft => assert_eq!(
                jumps_to_held(&saved),
                0,
                "the pods' chains still jump to {held}: the update did not commit\n{saved}"
            ),
            Backend::Legacy => assert!(
                jumps_to_held(&saved) > 0,
                "legacy commits nothing of a refused restore\n{saved}"
            ),
        }

        ns.exec_ok(&[&ipt, "-w", "-D", "KUBE-TEST", "-j", &held]);
        w.invalidate();
        w.apply(&after, &all_dirty()).unwrap();
        check_kernel(&ns, backend, family, &after);
        let saved = save(&ns, backend, family);
        for name in &removed {
            assert!(!saved.contains(&format!(":{name} ")), "{name} still there");
        }
    }
}

/// Tampers with the kernel, checks that a trusted cache does not notice (no save), and that
/// after `invalidate` one apply repairs it.
fn tamper_and_repair(
    ns: &NetNs,
    w: &mut TableWriter,
    desired: &DesiredTable,
    script: &str,
    expect_lines: Option<usize>,
) {
    ns.sh_ok(script);
    assert_eq!(w.apply(desired, &all_dirty()).unwrap(), 0);
    w.invalidate();
    let lines = w.apply(desired, &all_dirty()).unwrap();
    assert!(lines > 0, "{script}: nothing repaired");
    if let Some(n) = expect_lines {
        assert_eq!(lines, n, "{script}");
    }
    check_kernel(ns, w.backend(), w.family(), desired);
}

#[test]
fn tampering_is_repaired_after_invalidate() {
    for (backend, family) in ALL {
        let ns = NetNs::new("writer-tamper");
        add_foreign(&ns, backend, family);
        let demo = Demo::new(&ns, family, ChainInsertMode::Insert);
        let desired = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP);
        w.apply(&desired, &all_dirty()).unwrap();
        let ipt = cli(backend, family);
        let forward_rules = desired.chains["cali-FORWARD"].rules.len();

        // Our chain flushed: its rules come back (appended, no rewrite).
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!("{ipt} -w -F cali-FORWARD"),
            Some(forward_rules),
        );
        // Our FORWARD jump deleted: one insert.
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!("{ipt} -w -D FORWARD 1"),
            Some(1),
        );
        // A foreign rule above our jump: ours back on top (delete + insert), theirs kept.
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!("{ipt} -w -I FORWARD 1 -j ACCEPT"),
            Some(2),
        );
        let saved = by_chain(&save(&ns, backend, family));
        assert_eq!(saved["FORWARD"][1], "-j ACCEPT");
        // A foreign rule after our final accept: ours moved back to last.
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!("{ipt} -w -A FORWARD -j DROP"),
            Some(2),
        );
        let saved = by_chain(&save(&ns, backend, family));
        let fwd = &saved["FORWARD"];
        assert_eq!(fwd[fwd.len() - 2], "-j DROP");
        // A rule of ours changed in place, a foreign rule in our chain, a duplicate jump.
        let first = &desired.chains["cali-FORWARD"].rules[0].body;
        let tampered = first.replace("-j MARK", "-j CONNMARK");
        let jump = &desired.kernel[0].inserts[0].body;
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!(
                "{ipt} -w -R cali-FORWARD 1 {tampered} && {ipt} -w -I cali-FORWARD 2 -j ACCEPT && {ipt} -w -A FORWARD {jump}"
            ),
            None,
        );
        // Foreign state survives our cleanup.
        w.remove_all().unwrap();
        let saved = by_chain(&save(&ns, backend, family));
        check_foreign(&saved);
        assert!(!saved.keys().any(|c| c.starts_with("cali-")));
        assert!(!saved.values().flatten().any(|b| is_ours(b)));
        assert_eq!(w.stats().restore_errors, 0);
    }
}

#[test]
fn append_mode_keeps_ours_after_the_others() {
    for backend in [Backend::Legacy, Backend::Nft] {
        let family = IpFamily::V4;
        let ns = NetNs::new("writer-append");
        add_foreign(&ns, backend, family);
        let demo = Demo::new(&ns, family, ChainInsertMode::Append);
        let desired = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP);
        w.apply(&desired, &all_dirty()).unwrap();
        check_kernel(&ns, backend, family, &desired);
        let ipt = cli(backend, family);
        // Appended after ours: the jump and the accept move behind it.
        tamper_and_repair(
            &ns,
            &mut w,
            &desired,
            &format!("{ipt} -w -A FORWARD -j DROP"),
            Some(4),
        );
        // Inserted on top: nothing to do in append mode.
        ns.sh_ok(&format!("{ipt} -w -I FORWARD 1 -j ACCEPT"));
        w.invalidate();
        assert_eq!(w.apply(&desired, &all_dirty()).unwrap(), 0);
        check_kernel(&ns, backend, family, &desired);
    }
}

#[test]
fn failed_restore_returns_err_and_keeps_the_rules() {
    for (backend, family) in ALL {
        let ns = NetNs::new("writer-fail");
        add_foreign(&ns, backend, family);
        let demo = Demo::new(&ns, family, ChainInsertMode::Insert);
        let desired = demo.desired();
        let mut w = TableWriter::new(exec(&ns), family, backend, OWNERSHIP).with_retry(Policy {
            tries: Some(2),
            first: Duration::from_millis(10),
            ..Policy::IPTABLES_RESTORE
        });
        let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = tries.clone();
        w.on_each_try(std::sync::Arc::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }));
        w.apply(&desired, &all_dirty()).unwrap();
        assert_eq!(tries.load(std::sync::atomic::Ordering::Relaxed), 1);
        let good = save(&ns, backend, family);

        let mut broken = desired.clone();
        let fwd = std::sync::Arc::make_mut(broken.chains.get_mut("cali-FORWARD").unwrap());
        fwd.rules.extend(render_rules(
            "cali-FORWARD",
            family,
            &[Rule::new(Action::Jump("KUBE-DOES-NOT-EXIST".into()))],
        ));
        broken.chains.insert(
            "cali-new".into(),
            big_chain("cali-new", 3, family, None).into(),
        );
        let dirty: BTreeSet<String> = ["cali-FORWARD".to_string()].into();
        let err = w.apply(&broken, &dirty).unwrap_err();
        assert!(
            format!("{err:#}").contains("KUBE-DOES-NOT-EXIST"),
            "{err:#}"
        );
        assert_eq!(w.stats().restore_errors, 3);
        // The hook (the dataplane loop's liveness turn) ran as each of the three tries began.
        assert_eq!(tries.load(std::sync::atomic::Ordering::Relaxed), 1 + 3);
        // The first attempt used the cache; each retry re-read the kernel.
        assert_eq!(w.stats().save_calls, 1 + 2);
        assert_eq!(strip_dates(&save(&ns, backend, family)), strip_dates(&good));

        // The writer recovers: with the good state again there is nothing to write.
        assert_eq!(w.apply(&desired, &all_dirty()).unwrap(), 0);
        check_kernel(&ns, backend, family, &desired);
    }
}

fn strip_dates(save: &str) -> String {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn legacy_restore_waits_for_the_xtables_lock() {
    let ns = NetNs::new("writer-lock");
    let family = IpFamily::V4;
    let demo = Demo::new(&ns, family, ChainInsertMode::Insert);
    let desired = demo.desired();
    let mut w = TableWriter::new(exec(&ns), family, Backend::Legacy, OWNERSHIP);
    // Another writer holds the lock for a second (the lock file is shared by all network
    // namespaces); we wait for it instead of failing.
    let mut holder = std::process::Command::new("flock")
        .args(["-x", "/run/xtables.lock", "sleep", "1"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    w.apply(&desired, &all_dirty()).unwrap();
    let waited = start.elapsed();
    let _ = holder.wait();
    assert!(
        waited >= Duration::from_millis(500),
        "did not wait: {waited:?}"
    );
    assert_eq!(w.stats().restore_errors, 0);
    let saved = by_chain(&save(&ns, Backend::Legacy, family));
    assert!(saved.contains_key("cali-FORWARD"));
}

#[test]
fn backend_detection_follows_felix() {
    // Explicit modes win.
    let ns = NetNs::new("writer-detect");
    let e = exec(&ns);
    assert_eq!(detect_backend(&e, BackendMode::Legacy), Backend::Legacy);
    assert_eq!(detect_backend(&e, BackendMode::Nft), Backend::Nft);
    // Nothing anywhere, no legacy tables: nft.
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Nft);
    drop(ns);

    // kubelet's hint in legacy mangle, even with more nft rules: legacy.
    let ns = NetNs::new("writer-detect");
    let e = exec(&ns);
    ns.sh_ok("iptables-legacy -w -t mangle -N KUBE-IPTABLES-HINT");
    for _ in 0..3 {
        ns.sh_ok("iptables-nft -A FORWARD -j ACCEPT");
    }
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Legacy);
    // ... and in nft mangle as well: nft is checked first.
    ns.sh_ok("ip6tables-nft -t mangle -N KUBE-KUBELET-CANARY");
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Nft);
    drop(ns);

    // No hint: the backend with more rules; a tie goes to legacy.
    let ns = NetNs::new("writer-detect");
    let e = exec(&ns);
    ns.sh_ok("iptables-legacy -w -A FORWARD -j ACCEPT && iptables-legacy -w -A FORWARD -j DROP");
    ns.sh_ok("iptables-nft -A FORWARD -j ACCEPT");
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Legacy);
    ns.sh_ok("iptables-nft -A FORWARD -j DROP");
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Legacy);
    ns.sh_ok("ip6tables-nft -A FORWARD -j DROP");
    assert_eq!(detect_backend(&e, BackendMode::Auto), Backend::Nft);
}
