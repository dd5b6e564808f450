//! Planning the IP set writer's work, without I/O: what the kernel holds of ours (the cache
//! `KernelSets`, trusted between re-reads), the ops that bring it to the desired sets (one
//! set's share of an `ipset restore` script each), and what a successful op does to the cache.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tracing::warn;

use crate::model::IpFamily;
use crate::rules::sets::{
    create_line, is_owned_set, is_temp_set, set_family, Member, SetSpec, SetType, MAX_SET_NAME_LEN,
};

/// One of our sets as the kernel holds it (parsed from `ipset save`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct KernelSet {
    /// `None`: no family printed (not a hash set).
    pub(super) family: Option<IpFamily>,
    /// `None`: a type we never create (treated as the wrong type).
    pub(super) set_type: Option<SetType>,
    pub(super) maxelem: Option<u32>,
    /// Something we never write is in the set: a create option (timeout, counters, comment,
    /// ...) or an entry that is not a `Member` (a CIDR, `nomatch`, another protocol). Only a
    /// rebuild makes such a set exactly ours, so it is replaced through a temporary set.
    pub(super) irregular: bool,
    pub(super) members: BTreeSet<Member>,
}

impl KernelSet {
    pub(super) fn fresh(
        family: IpFamily,
        set_type: SetType,
        maxelem: u32,
        members: BTreeSet<Member>,
    ) -> Self {
        KernelSet {
            family: Some(family),
            set_type: Some(set_type),
            maxelem: Some(maxelem),
            irregular: false,
            members,
        }
    }
}

/// One set's share of a restore script, with what it does to the cache once applied.
#[derive(Debug)]
pub(super) struct Op {
    pub(super) name: String,
    pub(super) family: IpFamily,
    pub(super) kind: OpKind,
}

#[derive(Debug)]
pub(super) enum OpKind {
    /// `create` + `add`s; after a `destroy` when `replace` (wrong type or family: the kernel
    /// refuses to swap sets whose type or family differ).
    Create {
        replace: bool,
        set_type: SetType,
        members: BTreeSet<Member>,
    },
    /// Builds the set in `temp` and swaps the two: iptables references follow the name, so
    /// rules see the new contents at once, and `temp` is left with the old ones.
    Swap {
        temp: String,
        set_type: SetType,
        members: BTreeSet<Member>,
    },
    Add(Vec<Member>),
    Del(Vec<Member>),
    Destroy,
}

impl Op {
    /// Appends this op's lines to `out`; returns how many.
    pub(super) fn render(&self, out: &mut String, max_size: u32) -> u64 {
        use fmt::Write as _;
        let name = &self.name;
        let mut n = 0u64;
        // Writing to a String cannot fail.
        let mut line = |out: &mut String, args: fmt::Arguments<'_>| {
            let _ = out.write_fmt(args);
            out.push('\n');
            n += 1;
        };
        match &self.kind {
            OpKind::Create {
                replace,
                set_type,
                members,
            } => {
                if *replace {
                    line(out, format_args!("destroy {name}"));
                }
                line(
                    out,
                    format_args!(
                        "{}",
                        create_line(name, self.family, *set_type, max_size, members.len())
                    ),
                );
                for m in members {
                    line(out, format_args!("add {name} {m}"));
                }
            }
            OpKind::Swap {
                temp,
                set_type,
                members,
            } => {
                line(
                    out,
                    format_args!(
                        "{}",
                        create_line(temp, self.family, *set_type, max_size, members.len())
                    ),
                );
                for m in members {
                    line(out, format_args!("add {temp} {m}"));
                }
                line(out, format_args!("swap {temp} {name}"));
            }
            OpKind::Add(members) => {
                for m in members {
                    line(out, format_args!("add {name} {m}"));
                }
            }
            OpKind::Del(members) => {
                for m in members {
                    line(out, format_args!("del {name} {m}"));
                }
            }
            OpKind::Destroy => line(out, format_args!("destroy {name}")),
        }
        n
    }

    /// Whether line `index` (0-based, within this op) is a `destroy`.
    pub(super) fn is_destroy_line(&self, index: u64) -> bool {
        index == 0
            && matches!(
                self.kind,
                OpKind::Destroy | OpKind::Create { replace: true, .. }
            )
    }
}

/// What the kernel holds of ours, as last read or written, and what the planner remembers
/// between applies.
#[derive(Debug, Default)]
pub(super) struct KernelSets {
    pub(super) sets: BTreeMap<String, KernelSet>,
    /// Sets whose destroy failed because they were still referenced: destroyed on the next
    /// removal phase unless desired again by then.
    pub(super) retry_destroy: BTreeSet<String>,
    next_temp: u64,
    /// `maxelem` of every set we create (felix's `MaxIpsetSize`).
    pub(super) max_size: u32,
}

impl KernelSets {
    pub(super) fn new(max_size: u32) -> KernelSets {
        KernelSets {
            max_size,
            ..KernelSets::default()
        }
    }

    /// Replaces what the kernel holds with a fresh reading.
    pub(super) fn replace(&mut self, sets: BTreeMap<String, KernelSet>) {
        self.retry_destroy.retain(|n| sets.contains_key(n));
        self.sets = sets;
    }

    pub(super) fn plan_additions(
        &mut self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
        failed: &BTreeSet<String>,
        problems: &mut BTreeSet<String>,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        let mut dels = Vec::new();
        for name in dirty {
            let Some(spec) = desired.get(name) else {
                continue;
            };
            if let Err(why) = check_spec(name, spec) {
                problems.insert(why);
                continue;
            }
            let want = effective_members(spec);
            let op = match self.sets.get(name) {
                None => Some(OpKind::Create {
                    replace: false,
                    set_type: spec.set_type,
                    members: want.into_owned(),
                }),
                Some(k) if k.set_type != Some(spec.set_type) || k.family != Some(spec.family) => {
                    Some(OpKind::Create {
                        replace: true,
                        set_type: spec.set_type,
                        members: want.into_owned(),
                    })
                }
                Some(k) if k.maxelem != Some(self.max_size) || k.irregular => {
                    let temp = self.temp_name(spec.family);
                    Some(OpKind::Swap {
                        temp,
                        set_type: spec.set_type,
                        members: want.into_owned(),
                    })
                }
                Some(k) => {
                    dels.extend(deletions(name, spec.family, &k.members, &want));
                    let missing: Vec<Member> = want.difference(&k.members).copied().collect();
                    (!missing.is_empty()).then_some(OpKind::Add(missing))
                }
            };
            if let Some(kind) = op {
                ops.push(Op {
                    name: name.clone(),
                    family: spec.family,
                    kind,
                });
            }
        }
        // Every addition first: an address that moves from one set to another is in the new
        // one before it leaves the old, so no set a rule matches on is ever short of both.
        ops.extend(dels);
        order_ops(ops, failed)
    }

    pub(super) fn plan_removals(
        &self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
        failed: &BTreeSet<String>,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        let mut destroys: Vec<String> = Vec::new();
        for name in dirty {
            let Some(k) = self.sets.get(name) else {
                continue;
            };
            match desired.get(name) {
                Some(spec) => {
                    // A set of the wrong kind is phase 1's to replace; deleting from it
                    // would not make it right.
                    if check_spec(name, spec).is_err()
                        || k.set_type != Some(spec.set_type)
                        || k.family != Some(spec.family)
                    {
                        continue;
                    }
                    let want = effective_members(spec);
                    ops.extend(deletions(name, spec.family, &k.members, &want));
                }
                None => destroys.push(name.clone()),
            }
        }
        destroys.extend(self.retry_destroy.iter().cloned());
        destroys.extend(self.sets.keys().filter(|n| is_temp_set(n)).cloned());
        let mut ops = order_ops(ops, failed);
        // Destroys go last: a refused one (set in use) then costs only a restart of the lines
        // after it, and every `del` is already done.
        ops.extend(self.plan_destroys(destroys, failed));
        ops
    }

    /// `destroy` ops for those of `names` that the cache holds, each name once.
    pub(super) fn plan_destroys(&self, names: Vec<String>, failed: &BTreeSet<String>) -> Vec<Op> {
        let names: BTreeSet<String> = names.into_iter().collect();
        let mut ops: Vec<Op> = names
            .into_iter()
            .filter_map(|name| {
                let k = self.sets.get(&name)?;
                // Only ever our own names, whatever the caller passed.
                if !is_owned_set(&name) {
                    return None;
                }
                Some(Op {
                    family: k.family.unwrap_or_else(|| family_of_name(&name)),
                    name,
                    kind: OpKind::Destroy,
                })
            })
            .collect();
        // Sets of types we never create go first: a list:set of ours would hold references
        // to the other sets.
        ops.sort_by_key(|op| {
            self.sets
                .get(&op.name)
                .is_some_and(|k| k.set_type.is_some())
        });
        order_ops(ops, failed)
    }

    /// A temporary set name that no set of ours has.
    pub(super) fn temp_name(&mut self, family: IpFamily) -> String {
        let digit = match family {
            IpFamily::V4 => '4',
            IpFamily::V6 => '6',
        };
        loop {
            let name = format!("cali{digit}t{}", self.next_temp);
            self.next_temp = self.next_temp.wrapping_add(1);
            if !self.sets.contains_key(&name) {
                return name;
            }
        }
    }

    pub(super) fn apply(&mut self, op: &Op) {
        match &op.kind {
            OpKind::Create {
                set_type, members, ..
            } => {
                let set = KernelSet::fresh(op.family, *set_type, self.max_size, members.clone());
                self.sets.insert(op.name.clone(), set);
            }
            OpKind::Swap {
                temp,
                set_type,
                members,
            } => {
                let set = KernelSet::fresh(op.family, *set_type, self.max_size, members.clone());
                if let Some(old) = self.sets.insert(op.name.clone(), set) {
                    self.sets.insert(temp.clone(), old);
                }
            }
            OpKind::Add(members) => {
                if let Some(k) = self.sets.get_mut(&op.name) {
                    k.members.extend(members.iter().copied());
                }
            }
            OpKind::Del(members) => {
                if let Some(k) = self.sets.get_mut(&op.name) {
                    for m in members {
                        k.members.remove(m);
                    }
                }
            }
            OpKind::Destroy => {
                self.sets.remove(&op.name);
                self.retry_destroy.remove(&op.name);
            }
        }
    }

    pub(super) fn note_in_use(&mut self, in_use: BTreeSet<String>) {
        for name in in_use {
            if self.sets.contains_key(&name) {
                warn!(set = %name, "set is still in use by a kernel component; destroying it again later");
                self.retry_destroy.insert(name);
            }
        }
    }
}

/// Failing sets move to the end, so that a set that keeps failing (say, more members than
/// `maxelem`) does not hold back the others on the retries. Otherwise the order is kept.
pub(super) fn order_ops(mut ops: Vec<Op>, failed: &BTreeSet<String>) -> Vec<Op> {
    if !failed.is_empty() {
        ops.sort_by_key(|op| failed.contains(&op.name));
    }
    ops
}

/// Why a desired set cannot be written, if it cannot: the name goes into restore scripts, so
/// it must be one of ours and a single token the kernel accepts.
fn check_spec(key: &str, spec: &SetSpec) -> Result<(), String> {
    if spec.name != key {
        return Err(format!(
            "desired set {key:?} carries another name ({:?}); skipped",
            spec.name
        ));
    }
    if !is_owned_set(key) || is_temp_set(key) {
        return Err(format!(
            "desired set {key:?} does not have one of our prefixes; skipped"
        ));
    }
    if key.len() > MAX_SET_NAME_LEN || !key.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "desired set {key:?} is not a valid ipset name (at most {MAX_SET_NAME_LEN} printable characters); skipped"
        ));
    }
    Ok(())
}

/// The `del` op for what `have` holds beyond `want`, if it holds anything more.
fn deletions(
    name: &str,
    family: IpFamily,
    have: &BTreeSet<Member>,
    want: &BTreeSet<Member>,
) -> Option<Op> {
    let extra: Vec<Member> = have.difference(want).copied().collect();
    (!extra.is_empty()).then(|| Op {
        name: name.to_string(),
        family,
        kind: OpKind::Del(extra),
    })
}

/// The members of `spec` the kernel can hold: of the set's family and kind. Anything else is
/// a bug upstream; it is logged and left out (so it never counts as missing either).
fn effective_members(spec: &SetSpec) -> Cow<'_, BTreeSet<Member>> {
    let fits = |m: &Member| {
        m.family() == spec.family
            && matches!(
                (spec.set_type, m),
                (SetType::HashNet, Member::Addr(_)) | (SetType::HashIpPort, Member::AddrPort(..))
            )
    };
    if spec.members.iter().all(fits) {
        return Cow::Borrowed(&spec.members);
    }
    let (ok, bad): (BTreeSet<Member>, BTreeSet<Member>) =
        spec.members.iter().copied().partition(|m| fits(m));
    warn!(
        set = %spec.name,
        dropped = bad.len(),
        "members of another family or kind than the set; left out"
    );
    Cow::Owned(ok)
}

/// The family a set belongs to when the kernel does not say: from its name (`cali6…`).
fn family_of_name(name: &str) -> IpFamily {
    set_family(name).unwrap_or(IpFamily::V4)
}
