//! The diff: from what the kernel holds (a `TableState`) and what we want (a `DesiredTable`)
//! to the restore operations that turn one into the other, and the same operations applied
//! to the model so the writer can trust its cache after a successful restore. Pure.
//!
//! - Our chains are aligned by rule hash (longest common subsequence, computed as a longest
//!   increasing subsequence since desired hashes are unique in a chain), so inserting one rule
//!   near the top of a long chain is one `-I`, not a rewrite of the tail. Inside each gap
//!   between aligned rules, removed and added rules are paired into `-R` replacements; a rule
//!   whose hash matches but whose text differs (tampered) is replaced too. Then deletions
//!   run from the highest index down and insertions in ascending final position. When that
//!   takes more lines than rewriting the chain, the chain is flushed and rewritten.
//! - Rules in other chains are ours when their first comment is `cali:<hash>`; they are only
//!   ever deleted by value (`-D FORWARD <body>`), inserted at the top or appended, so a
//!   rule someone else added in the meantime can never be hit by a stale index.
//! - Chains we no longer want are flushed and deleted after the rule updates that drop the
//!   references to them, in the same restore ([`ChainDeletions`] says when they go into a
//!   second one).

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::rules::{ChainInsertMode, RenderedRule};

use super::backend::Backend;
use super::parse::{KernelRule, TableState};
use super::DesiredTable;

/// One line of restore input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `:NAME - [0:0]`: creates the chain (flushes it if it exists).
    Declare(String),
    /// `-A chain body`
    Append { chain: String, rule: KernelRule },
    /// `-I chain pos body` (1-based)
    Insert {
        chain: String,
        pos: usize,
        rule: KernelRule,
    },
    /// `-R chain pos body` (1-based)
    Replace {
        chain: String,
        pos: usize,
        rule: KernelRule,
    },
    /// `-D chain pos` (1-based)
    DeleteAt { chain: String, pos: usize },
    /// `-D chain body`: deletes the first rule with exactly this text.
    DeleteRule { chain: String, body: String },
    /// `-F chain`
    Flush(String),
    /// `-X chain`
    DeleteChain(String),
}

fn with_body(head: String, body: &str) -> String {
    if body.is_empty() {
        head
    } else {
        format!("{head} {body}")
    }
}

impl Op {
    /// The restore line.
    pub fn line(&self) -> String {
        match self {
            Op::Declare(c) => format!(":{c} - [0:0]"),
            Op::Append { chain, rule } => with_body(format!("-A {chain}"), &rule.body),
            Op::Insert { chain, pos, rule } => with_body(format!("-I {chain} {pos}"), &rule.body),
            Op::Replace { chain, pos, rule } => with_body(format!("-R {chain} {pos}"), &rule.body),
            Op::DeleteAt { chain, pos } => format!("-D {chain} {pos}"),
            Op::DeleteRule { chain, body } => with_body(format!("-D {chain}"), body),
            Op::Flush(c) => format!("-F {c}"),
            Op::DeleteChain(c) => format!("-X {c}"),
        }
    }
}

/// Where the deletions of chains we no longer want (`-X`) go.
///
/// felix puts them into a second transaction with the nft backend, because iptables-nft-restore
/// before 1.8.3 did not count the references a transaction drops (netfilter bug 1348) and the
/// kernel then refused the deletion as busy. The releases the agent ships (Debian 12's
/// iptables 1.8.9) and the kernels it supports (5.10 to 6.12) delete a chain in the same
/// transaction that removes its last jump: the kernel drops the jump's reference when the rule
/// is deactivated, in the transaction's prepare phase. A second `iptables-nft-restore` costs a
/// second netlink dump and commit, which doubled event → enforced for events that remove a
/// policy chain (label change at 10k pods / 110 local: p99 44 ms split, 18.5 ms together,
/// docs/development/benchmarks.md). The writer still falls back to the second transaction
/// when a restore with deletions in it fails ([`split_after_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainDeletions {
    /// In the same restore, after the updates that drop the references.
    WithUpdates,
    /// In a second restore after the first committed (felix's nft way).
    Separate,
}

/// Whether a failed restore of `ops` should make this writer delete chains in a second
/// transaction from now on: it held chain deletions beside other operations, with the nft
/// backend (legacy's libiptc resolves references in the table it replaces whole).
pub fn split_after_failure(backend: Backend, deletions: ChainDeletions, ops: &[Op]) -> bool {
    backend == Backend::Nft
        && deletions == ChainDeletions::WithUpdates
        && ops.iter().any(|op| matches!(op, Op::DeleteChain(_)))
        && ops.iter().any(|op| !matches!(op, Op::DeleteChain(_)))
}

/// The operations of one apply: `main` in one restore; `deferred` (chain deletions, with
/// [`ChainDeletions::Separate`]) in a second one after `main` committed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub main: Vec<Op>,
    pub deferred: Vec<Op>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.main.is_empty() && self.deferred.is_empty()
    }
    pub fn lines(&self) -> usize {
        self.main.len() + self.deferred.len()
    }
    /// Restore input for `ops`, framed by `*table` and `COMMIT`.
    pub fn script(ops: &[Op], table: &str) -> String {
        let mut out = format!("*{table}\n");
        for op in ops {
            out.push_str(&op.line());
            out.push('\n');
        }
        out.push_str("COMMIT\n");
        out
    }
}

/// Computes the operations that bring `current` to `desired`. `dirty`: the chains whose
/// content may have changed since `current` was last brought in line (`None`: all of them).
/// Chains that appear or disappear, and our rules in other chains, are always checked.
pub fn plan_table(
    current: &TableState,
    desired: &DesiredTable,
    dirty: Option<&BTreeSet<String>>,
    deletions: ChainDeletions,
) -> Plan {
    let mut declares = Vec::new();
    let mut chain_ops = Vec::new();
    for (name, chain) in &desired.chains {
        match current.chains.get(name) {
            None => {
                declares.push(Op::Declare(name.clone()));
                chain_ops.extend(chain.rules.iter().map(|r| Op::Append {
                    chain: name.clone(),
                    rule: rendered(r),
                }));
            }
            Some(old) => {
                if dirty.is_none_or(|d| d.contains(name)) {
                    chain_ops.extend(diff_chain(name, old, &chain.rules));
                }
            }
        }
    }

    let mut kernel_ops = Vec::new();
    let mut others: BTreeSet<&str> = current
        .chains
        .keys()
        .map(String::as_str)
        .filter(|n| !current.ownership.owns_chain(n))
        .collect();
    others.extend(desired.kernel.iter().map(|k| k.chain.as_str()));
    for name in others {
        let old = current.chains.get(name).map_or(&[][..], Vec::as_slice);
        let want = desired.kernel.iter().find(|k| k.chain == name);
        let (inserts, appends) = want.map_or((&[][..], &[][..]), |k| {
            (k.inserts.as_slice(), k.appends.as_slice())
        });
        kernel_ops.extend(fix_kernel_chain(
            name,
            old,
            inserts,
            appends,
            desired.insert_mode,
        ));
    }

    let mut flushes = Vec::new();
    let mut deletes = Vec::new();
    for (name, rules) in &current.chains {
        if current.ownership.owns_chain(name) && !desired.chains.contains_key(name) {
            if !rules.is_empty() {
                flushes.push(Op::Flush(name.clone()));
            }
            deletes.push(Op::DeleteChain(name.clone()));
        }
    }

    let mut main = declares;
    main.extend(chain_ops);
    main.extend(kernel_ops);
    main.extend(flushes);
    match deletions {
        ChainDeletions::WithUpdates => {
            main.extend(deletes);
            Plan {
                main,
                deferred: Vec::new(),
            }
        }
        ChainDeletions::Separate => Plan {
            main,
            deferred: deletes,
        },
    }
}

fn rendered(r: &RenderedRule) -> KernelRule {
    KernelRule {
        hash: Some(r.hash.clone()),
        body: r.body.clone(),
    }
}

fn same(k: &KernelRule, r: &RenderedRule) -> bool {
    k.hash.as_deref() == Some(r.hash.as_str()) && k.body == r.body
}

/// Operations turning our chain `name` from `old` into `new`.
pub fn diff_chain(name: &str, old: &[KernelRule], new: &[RenderedRule]) -> Vec<Op> {
    if old.len() == new.len() && old.iter().zip(new).all(|(k, r)| same(k, r)) {
        return Vec::new();
    }
    // Align by hash: old rule i keeps its place as new rule j along the longest common
    // subsequence. Desired hashes are unique within a chain, so the LCS is the longest
    // strictly increasing run of new indices over the old rules.
    let index: HashMap<&str, usize> = new
        .iter()
        .enumerate()
        .map(|(j, r)| (r.hash.as_str(), j))
        .collect();
    let candidates: Vec<(usize, usize)> = old
        .iter()
        .enumerate()
        .filter_map(|(i, k)| Some((i, *index.get(k.hash.as_deref()?)?)))
        .collect();
    let aligned = longest_increasing(&candidates);

    // Pair removed and added rules inside each gap of the alignment: those become `-R`.
    let mut pairs: Vec<(usize, usize)> = Vec::with_capacity(new.len());
    let mut old_kept = vec![false; old.len()];
    let mut new_kept = vec![false; new.len()];
    let (mut oi, mut nj) = (0, 0);
    for &(i, j) in aligned
        .iter()
        .chain(std::iter::once(&(old.len(), new.len())))
    {
        for (o, n) in (oi..i).zip(nj..j) {
            pairs.push((o, n));
        }
        if i < old.len() {
            pairs.push((i, j));
        }
        (oi, nj) = (i + 1, j + 1);
    }
    for &(o, n) in &pairs {
        old_kept[o] = true;
        new_kept[n] = true;
    }

    let mut ops = Vec::new();
    for &(o, n) in &pairs {
        if !same(&old[o], &new[n]) {
            ops.push(Op::Replace {
                chain: name.to_string(),
                pos: o + 1,
                rule: rendered(&new[n]),
            });
        }
    }
    for o in (0..old.len()).rev().filter(|&o| !old_kept[o]) {
        ops.push(Op::DeleteAt {
            chain: name.to_string(),
            pos: o + 1,
        });
    }
    // `len`: the chain's length before each insertion (kept rules + those inserted so far).
    let added = (0..new.len()).filter(|&j| !new_kept[j]);
    for (len, j) in (pairs.len()..).zip(added) {
        let rule = rendered(&new[j]);
        ops.push(if j == len {
            Op::Append {
                chain: name.to_string(),
                rule,
            }
        } else {
            Op::Insert {
                chain: name.to_string(),
                pos: j + 1,
                rule,
            }
        });
    }

    // A flush and a full rewrite is never longer than that.
    let rewrite = new.len() + usize::from(!old.is_empty());
    if ops.len() > rewrite {
        ops.clear();
        if !old.is_empty() {
            ops.push(Op::Flush(name.to_string()));
        }
        ops.extend(new.iter().map(|r| Op::Append {
            chain: name.to_string(),
            rule: rendered(r),
        }));
    }
    ops
}

/// The longest subsequence of `pairs` (already increasing in `.0`) that is strictly
/// increasing in `.1` (patience sorting, O(n log n)).
fn longest_increasing(pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    // tails[k]: index into pairs of the smallest tail of an increasing run of length k+1.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; pairs.len()];
    for (p, &(_, j)) in pairs.iter().enumerate() {
        let k = tails.partition_point(|&t| pairs[t].1 < j);
        prev[p] = k.checked_sub(1).map(|k| tails[k]);
        if k == tails.len() {
            tails.push(p);
        } else {
            tails[k] = p;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut cur = tails.last().copied();
    while let Some(p) = cur {
        out.push(pairs[p]);
        cur = prev[p];
    }
    out.reverse();
    out
}

/// Operations putting our rules in a chain we do not own (`FORWARD`, ...) in their place.
///
/// Layout (felix's): insert mode `inserts ++ others ++ appends`; append mode
/// `others ++ inserts ++ appends`. Rules of ours that are not wanted here (stale hashes) are
/// deleted. A group (inserts, appends) that is not exactly in place, or has extra copies
/// anywhere, is deleted by value (every copy, with the text the kernel holds) and added
/// again: inserts with `-I chain 1` in reverse order, appends with `-A`. In append mode the
/// two groups move together, since the inserts must stay in front of the appends.
pub fn fix_kernel_chain(
    name: &str,
    old: &[KernelRule],
    inserts: &[RenderedRule],
    appends: &[RenderedRule],
    mode: ChainInsertMode,
) -> Vec<Op> {
    let insert_hashes: HashSet<&str> = inserts.iter().map(|r| r.hash.as_str()).collect();
    let append_hashes: HashSet<&str> = appends.iter().map(|r| r.hash.as_str()).collect();
    let mut ops = Vec::new();
    let delete = |k: &KernelRule| Op::DeleteRule {
        chain: name.to_string(),
        body: k.body.clone(),
    };
    let mut live: Vec<&KernelRule> = Vec::with_capacity(old.len());
    for k in old {
        match k.hash.as_deref() {
            Some(h) if !insert_hashes.contains(h) && !append_hashes.contains(h) => {
                ops.push(delete(k))
            }
            _ => live.push(k),
        }
    }
    let in_group =
        |k: &KernelRule, set: &HashSet<&str>| k.hash.as_deref().is_some_and(|h| set.contains(h));
    // `want` sits exactly at `live[at..]`'s start and no other copy of its rules exists.
    let in_place = |want: &[RenderedRule], at: Option<usize>, set: &HashSet<&str>| {
        let Some(at) = at else { return false };
        live.len() >= at + want.len()
            && live[at..at + want.len()]
                .iter()
                .zip(want)
                .all(|(k, r)| same(k, r))
            && live.iter().filter(|k| in_group(k, set)).count() == want.len()
    };
    let remove_group = |ops: &mut Vec<Op>, set: &HashSet<&str>| {
        ops.extend(live.iter().filter(|k| in_group(k, set)).map(|k| delete(k)));
    };
    let add_inserts_on_top = |ops: &mut Vec<Op>| {
        ops.extend(inserts.iter().rev().map(|r| Op::Insert {
            chain: name.to_string(),
            pos: 1,
            rule: rendered(r),
        }))
    };
    let add_appends = |ops: &mut Vec<Op>, rules: &[RenderedRule]| {
        ops.extend(rules.iter().map(|r| Op::Append {
            chain: name.to_string(),
            rule: rendered(r),
        }))
    };
    let appends_at = live.len().checked_sub(appends.len());
    match mode {
        ChainInsertMode::Insert => {
            if !in_place(inserts, Some(0), &insert_hashes) {
                remove_group(&mut ops, &insert_hashes);
                add_inserts_on_top(&mut ops);
            }
            if !in_place(appends, appends_at, &append_hashes) {
                remove_group(&mut ops, &append_hashes);
                add_appends(&mut ops, appends);
            }
        }
        ChainInsertMode::Append => {
            let inserts_at = appends_at.and_then(|a| a.checked_sub(inserts.len()));
            if !in_place(inserts, inserts_at, &insert_hashes)
                || !in_place(appends, appends_at, &append_hashes)
            {
                remove_group(&mut ops, &insert_hashes);
                remove_group(&mut ops, &append_hashes);
                add_appends(&mut ops, inserts);
                add_appends(&mut ops, appends);
            }
        }
    }
    ops
}

/// Applies `ops` to the model, as the kernel applied them. An error means the model and the
/// operations disagree (the cache must then be dropped).
pub fn apply_ops(state: &mut TableState, ops: &[Op]) -> Result<(), String> {
    for op in ops {
        apply_op(state, op).map_err(|e| format!("{}: {e}", op.line()))?;
    }
    Ok(())
}

fn chain_mut<'a>(state: &'a mut TableState, name: &str) -> Result<&'a mut Vec<KernelRule>, String> {
    if !state.chains.contains_key(name) && !state.ownership.owns_chain(name) {
        // Built-in chains exist as soon as the table does.
        state.chains.insert(name.to_string(), Vec::new());
    }
    state
        .chains
        .get_mut(name)
        .ok_or_else(|| "no such chain".to_string())
}

fn check_pos(pos: usize, max: usize) -> Result<usize, String> {
    if pos == 0 || pos > max {
        Err(format!("index {pos} out of range 1..={max}"))
    } else {
        Ok(pos - 1)
    }
}

fn apply_op(state: &mut TableState, op: &Op) -> Result<(), String> {
    match op {
        Op::Declare(name) => state.chains.entry(name.clone()).or_default().clear(),
        Op::Append { chain, rule } => chain_mut(state, chain)?.push(rule.clone()),
        Op::Insert { chain, pos, rule } => {
            let rules = chain_mut(state, chain)?;
            let at = check_pos(*pos, rules.len() + 1)?;
            rules.insert(at, rule.clone());
        }
        Op::Replace { chain, pos, rule } => {
            let rules = chain_mut(state, chain)?;
            let at = check_pos(*pos, rules.len())?;
            rules[at] = rule.clone();
        }
        Op::DeleteAt { chain, pos } => {
            let rules = chain_mut(state, chain)?;
            let at = check_pos(*pos, rules.len())?;
            rules.remove(at);
        }
        Op::DeleteRule { chain, body } => {
            let rules = chain_mut(state, chain)?;
            let at = rules
                .iter()
                .position(|k| &k.body == body)
                .ok_or_else(|| "no such rule".to_string())?;
            rules.remove(at);
        }
        Op::Flush(name) => chain_mut(state, name)?.clear(),
        Op::DeleteChain(name) => match state.chains.get(name) {
            None => return Err("no such chain".into()),
            Some(rules) if !rules.is_empty() => return Err("chain not empty".into()),
            Some(_) => {
                state.chains.remove(name);
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests;
