//! Unit and property tests of the diff: no kernel, only the model.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::agent::OWNERSHIP;
use crate::model::IpFamily;
use crate::rules::chains::KernelChainRules;
use crate::rules::{render_rules, Action, Chain, Rule};

fn chain(name: &str, n: usize) -> Chain {
    let rules = (0..n)
        .map(|i| Rule::new(Action::Return).matching(format!("-m mark --mark {i:#x}/{i:#x}")))
        .collect();
    Chain::new(name, IpFamily::V4, rules)
}

fn kernel(rules: &[RenderedRule]) -> Vec<KernelRule> {
    rules.iter().map(rendered).collect()
}

fn foreign(body: &str) -> KernelRule {
    OWNERSHIP.rule(body)
}

fn run(old: &[KernelRule], ops: &[Op], name: &str) -> Vec<KernelRule> {
    let mut state = TableState::empty(OWNERSHIP);
    state.chains.insert(name.to_string(), old.to_vec());
    apply_ops(&mut state, ops).unwrap();
    state.chains.remove(name).unwrap_or_default()
}

fn lines(ops: &[Op]) -> Vec<String> {
    ops.iter().map(Op::line).collect()
}

#[test]
fn unchanged_chain_needs_nothing() {
    let c = chain("cali-x", 5);
    assert!(diff_chain("cali-x", &kernel(&c.rules), &c.rules).is_empty());
}

#[test]
fn one_rule_near_the_top_is_one_insert() {
    let c = chain("cali-x", 201);
    let mut old = c.rules.clone();
    let added = old.remove(1);
    let ops = diff_chain("cali-x", &kernel(&old), &c.rules);
    assert_eq!(lines(&ops), [format!("-I cali-x 2 {}", added.body)]);
    assert_eq!(run(&kernel(&old), &ops, "cali-x"), kernel(&c.rules));
}

#[test]
fn removed_rules_are_deleted_from_the_bottom_up() {
    let c = chain("cali-x", 10);
    let mut new = c.rules.clone();
    new.remove(7);
    new.remove(2);
    let ops = diff_chain("cali-x", &kernel(&c.rules), &new);
    assert_eq!(lines(&ops), ["-D cali-x 8", "-D cali-x 3"]);
    assert_eq!(run(&kernel(&c.rules), &ops, "cali-x"), kernel(&new));
}

#[test]
fn tampered_and_changed_rules_are_replaced() {
    let c = chain("cali-x", 6);
    let mut old = kernel(&c.rules);
    // Same hash, other text.
    old[1].body = old[1].body.replace("-j RETURN", "-j ACCEPT");
    // A rule that is not ours where ours should be.
    old[4] = foreign("-j ACCEPT");
    let ops = diff_chain("cali-x", &old, &c.rules);
    assert_eq!(
        lines(&ops),
        [
            format!("-R cali-x 2 {}", c.rules[1].body),
            format!("-R cali-x 5 {}", c.rules[4].body),
        ]
    );
    assert_eq!(run(&old, &ops, "cali-x"), kernel(&c.rules));
}

#[test]
fn foreign_rules_in_our_chains_are_deleted() {
    let c = chain("cali-x", 3);
    let mut old = kernel(&c.rules);
    old.insert(1, foreign("-j DROP"));
    let ops = diff_chain("cali-x", &old, &c.rules);
    assert_eq!(lines(&ops), ["-D cali-x 2"]);
}

#[test]
fn appended_rules_use_append() {
    let c = chain("cali-x", 4);
    let ops = diff_chain("cali-x", &kernel(&c.rules[..2]), &c.rules);
    assert_eq!(
        lines(&ops),
        [
            format!("-A cali-x {}", c.rules[2].body),
            format!("-A cali-x {}", c.rules[3].body)
        ]
    );
}

#[test]
fn a_reversed_chain_is_rewritten() {
    let c = chain("cali-x", 6);
    let mut old = kernel(&c.rules);
    old.reverse();
    let ops = diff_chain("cali-x", &old, &c.rules);
    assert_eq!(ops.len(), 7);
    assert_eq!(ops[0], Op::Flush("cali-x".into()));
    assert_eq!(run(&old, &ops, "cali-x"), kernel(&c.rules));
}

fn jump(chain: &str, target: &str) -> Vec<RenderedRule> {
    render_rules(
        chain,
        IpFamily::V4,
        &[Rule::new(Action::Jump(target.into()))],
    )
}

fn accept() -> Vec<RenderedRule> {
    render_rules(
        "FORWARD*appends*",
        IpFamily::V4,
        &[Rule::new(Action::Accept).mark_match(0x10000, 0x10000)],
    )
}

fn kernel_fix(old: &[KernelRule], mode: ChainInsertMode) -> (Vec<Op>, Vec<KernelRule>) {
    let ops = fix_kernel_chain(
        "FORWARD",
        old,
        &jump("FORWARD", "cali-FORWARD"),
        &accept(),
        mode,
    );
    let after = run(old, &ops, "FORWARD");
    (ops, after)
}

#[test]
fn kernel_chain_in_place_needs_nothing() {
    let j = kernel(&jump("FORWARD", "cali-FORWARD"));
    let a = kernel(&accept());
    let f = foreign("-j KUBE-TEST");
    let old = vec![j[0].clone(), f.clone(), a[0].clone()];
    assert!(kernel_fix(&old, ChainInsertMode::Insert).0.is_empty());
    let old = vec![f.clone(), j[0].clone(), a[0].clone()];
    assert!(kernel_fix(&old, ChainInsertMode::Append).0.is_empty());
}

#[test]
fn kernel_chain_repairs() {
    let j = kernel(&jump("FORWARD", "cali-FORWARD"))[0].clone();
    let a = kernel(&accept())[0].clone();
    let f = foreign("-j ACCEPT");
    let g = foreign("-j KUBE-TEST");

    // Someone inserted above our jump: ours goes back on top, theirs stays.
    let (ops, after) = kernel_fix(
        &[f.clone(), j.clone(), g.clone(), a.clone()],
        ChainInsertMode::Insert,
    );
    assert_eq!(
        lines(&ops),
        [
            format!("-D FORWARD {}", j.body),
            format!("-I FORWARD 1 {}", j.body)
        ]
    );
    assert_eq!(after, [j.clone(), f.clone(), g.clone(), a.clone()]);

    // Someone appended after our accept: the accept moves back to the end.
    let (ops, after) = kernel_fix(&[j.clone(), a.clone(), g.clone()], ChainInsertMode::Insert);
    assert_eq!(ops.len(), 2);
    assert_eq!(after, [j.clone(), g.clone(), a.clone()]);

    // Missing jump, duplicate accept, stale rule of ours.
    let stale = foreign("-m comment --comment \"cali:stalestalestale\" -j cali-old");
    let (ops, after) = kernel_fix(
        &[a.clone(), g.clone(), stale.clone(), a.clone()],
        ChainInsertMode::Insert,
    );
    assert_eq!(after, [j.clone(), g.clone(), a.clone()]);
    assert_eq!(
        ops[0],
        Op::DeleteRule {
            chain: "FORWARD".into(),
            body: stale.body.clone()
        }
    );

    // Tampered jump (our hash, other text) is deleted by its kernel text.
    let mut bad = j.clone();
    bad.body = bad.body.replace("cali-FORWARD", "KUBE-TEST");
    let (ops, after) = kernel_fix(&[bad.clone(), a.clone()], ChainInsertMode::Insert);
    assert_eq!(
        ops[0],
        Op::DeleteRule {
            chain: "FORWARD".into(),
            body: bad.body.clone()
        }
    );
    assert_eq!(after, [j.clone(), a.clone()]);

    // Append mode: ours after everyone else's, the accept last.
    let (_, after) = kernel_fix(
        &[j.clone(), f.clone(), a.clone(), g.clone()],
        ChainInsertMode::Append,
    );
    assert_eq!(after, [f.clone(), g.clone(), j.clone(), a.clone()]);

    // Nothing wanted: only ours go.
    let ops = fix_kernel_chain(
        "FORWARD",
        &[j.clone(), f.clone(), a.clone()],
        &[],
        &[],
        ChainInsertMode::Insert,
    );
    assert_eq!(run(&[j, f.clone(), a], &ops, "FORWARD"), [f]);
}

fn desired(chains: Vec<Chain>, mode: ChainInsertMode) -> DesiredTable {
    DesiredTable {
        chains: chains
            .into_iter()
            .map(|c| (c.name.clone(), std::sync::Arc::new(c)))
            .collect(),
        kernel: vec![KernelChainRules {
            chain: "FORWARD".into(),
            inserts: jump("FORWARD", "cali-a"),
            appends: accept(),
        }],
        insert_mode: mode,
    }
}

#[test]
fn plan_creates_updates_and_removes_chains() {
    let mut current = TableState::empty(OWNERSHIP);
    for c in ["INPUT", "FORWARD", "OUTPUT"] {
        current.chains.insert(c.into(), Vec::new());
    }
    let want = desired(
        vec![chain("cali-a", 2), chain("cali-b", 1)],
        ChainInsertMode::Insert,
    );
    let p = plan_table(&current, &want, None, ChainDeletions::WithUpdates);
    let script = Plan::script(&p.main, "filter");
    assert!(script.starts_with("*filter\n:cali-a - [0:0]\n:cali-b - [0:0]\n-A cali-a "));
    assert!(script.ends_with("COMMIT\n"));
    assert_eq!(p.lines(), 2 + 3 + 2);
    apply_ops(&mut current, &p.main).unwrap();

    // Nothing dirty, nothing to do.
    assert!(plan_table(
        &current,
        &want,
        Some(&BTreeSet::new()),
        ChainDeletions::WithUpdates
    )
    .is_empty());
    assert!(plan_table(&current, &want, None, ChainDeletions::WithUpdates).is_empty());

    // cali-b goes away: flushed and deleted after the other updates, in the same restore
    // unless the writer fell back to a second one.
    let want2 = desired(vec![chain("cali-a", 2)], ChainInsertMode::Insert);
    let together = plan_table(
        &current,
        &want2,
        Some(&BTreeSet::new()),
        ChainDeletions::WithUpdates,
    );
    assert_eq!(lines(&together.main), ["-F cali-b", "-X cali-b"]);
    assert!(together.deferred.is_empty());
    let split = plan_table(
        &current,
        &want2,
        Some(&BTreeSet::new()),
        ChainDeletions::Separate,
    );
    assert_eq!(lines(&split.main), ["-F cali-b"]);
    assert_eq!(lines(&split.deferred), ["-X cali-b"]);
    // A failed restore with deletions beside other operations splits them, on nft only and
    // once; a restore of deletions alone has nothing to split.
    for (backend, deletions, ops, splits) in [
        (
            Backend::Nft,
            ChainDeletions::WithUpdates,
            &together.main,
            true,
        ),
        (
            Backend::Legacy,
            ChainDeletions::WithUpdates,
            &together.main,
            false,
        ),
        (
            Backend::Nft,
            ChainDeletions::Separate,
            &together.main,
            false,
        ),
        (
            Backend::Nft,
            ChainDeletions::WithUpdates,
            &split.main,
            false,
        ),
        (
            Backend::Nft,
            ChainDeletions::WithUpdates,
            &split.deferred,
            false,
        ),
    ] {
        assert_eq!(
            split_after_failure(backend, deletions, ops),
            splits,
            "{backend:?} {deletions:?} {:?}",
            lines(ops)
        );
    }

    // Only dirty chains are diffed.
    let want3 = desired(
        vec![chain("cali-a", 3), chain("cali-b", 1)],
        ChainInsertMode::Insert,
    );
    assert!(plan_table(
        &current,
        &want3,
        Some(&BTreeSet::new()),
        ChainDeletions::WithUpdates
    )
    .is_empty());
    let dirty: BTreeSet<String> = ["cali-a".to_string()].into();
    assert_eq!(
        plan_table(&current, &want3, Some(&dirty), ChainDeletions::WithUpdates).lines(),
        1
    );

    // Removing everything leaves the kernel chains as they were.
    let gone = plan_table(
        &current,
        &DesiredTable::empty(),
        None,
        ChainDeletions::WithUpdates,
    );
    apply_ops(&mut current, &gone.main).unwrap();
    let empty: BTreeMap<String, Vec<KernelRule>> = ["INPUT", "FORWARD", "OUTPUT"]
        .iter()
        .map(|c| (c.to_string(), Vec::new()))
        .collect();
    assert_eq!(current.chains, empty);
}

/// What an arbitrary kernel chain may hold: our desired rules (some tampered), foreign
/// rules, rules of ours that are no longer wanted, in any order, with duplicates.
fn arb_old(n_new: usize) -> impl Strategy<Value = Vec<(u8, usize)>> {
    prop::collection::vec((0u8..4, 0..n_new.max(1) + 3), 0..30)
}

fn build_old(spec: &[(u8, usize)], new: &[RenderedRule]) -> Vec<KernelRule> {
    spec.iter()
        .map(|&(kind, i)| match (kind, new.get(i)) {
            (0 | 1, Some(r)) => rendered(r),
            (2, Some(r)) => KernelRule {
                hash: Some(r.hash.clone()),
                body: format!("{} -j LOG", r.body),
            },
            (3, _) => foreign(&format!("-j MARK --set-xmark {i:#x}/{i:#x}")),
            _ => foreign(&format!(
                "-m comment --comment \"cali:stale{i:0>11}\" -j DROP"
            )),
        })
        .collect()
}

proptest! {
    #[test]
    fn diff_turns_any_chain_into_the_desired_one(
        n in 0usize..25,
        keep in prop::collection::vec(any::<bool>(), 25),
        spec in arb_old(25),
    ) {
        let full = chain("cali-p", n);
        let new: Vec<RenderedRule> = full.rules.iter().zip(&keep).filter(|(_, k)| **k).map(|(r, _)| r.clone()).collect();
        let old = build_old(&spec, &full.rules);
        let ops = diff_chain("cali-p", &old, &new);
        prop_assert!(ops.len() <= new.len() + 1);
        prop_assert_eq!(run(&old, &ops, "cali-p"), kernel(&new));
        // A second diff finds nothing to do.
        prop_assert!(diff_chain("cali-p", &kernel(&new), &new).is_empty());
    }

    #[test]
    fn kernel_chains_end_up_in_felix_layout(
        spec in prop::collection::vec((0u8..5, 0usize..4), 0..12),
        insert_mode in any::<bool>(),
    ) {
        let mode = if insert_mode { ChainInsertMode::Insert } else { ChainInsertMode::Append };
        let inserts = render_rules("FORWARD", IpFamily::V4, &[
            Rule::new(Action::Jump("cali-FORWARD".into())),
            Rule::new(Action::Jump("cali-x".into())),
        ]);
        let appends = accept();
        let ours: Vec<RenderedRule> = inserts.iter().chain(&appends).cloned().collect();
        let old = build_old(&spec, &ours);
        let foreign_rules: Vec<KernelRule> = old.iter().filter(|k| k.hash.is_none()).cloned().collect();
        let ops = fix_kernel_chain("FORWARD", &old, &inserts, &appends, mode);
        let after = run(&old, &ops, "FORWARD");
        let expected: Vec<KernelRule> = match mode {
            ChainInsertMode::Insert => kernel(&inserts).into_iter().chain(foreign_rules).chain(kernel(&appends)).collect(),
            ChainInsertMode::Append => foreign_rules.into_iter().chain(kernel(&inserts)).chain(kernel(&appends)).collect(),
        };
        prop_assert_eq!(&after, &expected);
        prop_assert!(fix_kernel_chain("FORWARD", &after, &inserts, &appends, mode).is_empty());
    }
}
