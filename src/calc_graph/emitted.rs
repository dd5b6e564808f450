//! The output calculator: what the next flush must re-render (the dirty owners), and what
//! the flushes so far emitted, so that each flush is the difference between the two.
//!
//! Owns: the dirty owners (with when the event behind each first came in, while the caller
//! stamps events), every chain emitted with its owner, every set emitted, and the programming
//! start times gathered for the metric.
//! Invariants: a chain is upserted only when it differs from what was emitted, and removed
//! only when its owner no longer renders it and no other owner took it over in the same flush;
//! a set is created once, before its first members, and removed once; after a flush nothing
//! is dirty and the record equals what the updates so far add up to.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use crate::model::{IpFamily, ObjectKey};
use crate::rules::sets::{set_name, Member, SetDef};
use crate::rules::Chain;

use super::set_index::{PendingSet, SetIndex};
use super::update::{SetHeader, Update};
use super::Owner;

#[derive(Default)]
pub(super) struct Emitted {
    dirty: BTreeSet<Owner>,
    /// When the event that first made each dirty owner dirty entered the graph (only while
    /// the caller stamps events, see `CalcGraph::set_event_time`).
    since: HashMap<Owner, Instant>,
    event_time: Option<Instant>,
    /// Per local endpoint whose rules the last flushes changed: when the earliest event
    /// behind the change entered the graph.
    programming_starts: Vec<Instant>,
    owned: HashMap<Owner, Vec<(IpFamily, String)>>,
    chains: BTreeMap<(IpFamily, String), Arc<Chain>>,
    sets: BTreeMap<String, SetDef>,
}

impl Emitted {
    pub(super) fn mark(&mut self, owner: Owner) {
        match self.event_time {
            Some(at) => {
                if !self.dirty.contains(&owner) {
                    self.since.insert(owner.clone(), at);
                    self.dirty.insert(owner);
                }
            }
            None => {
                self.dirty.insert(owner);
            }
        }
    }

    pub(super) fn set_event_time(&mut self, at: Option<Instant>) {
        self.event_time = at;
    }

    /// The local endpoints the next flush re-renders.
    pub(super) fn dirty_endpoints(&self) -> Vec<ObjectKey> {
        self.dirty
            .iter()
            .filter_map(|o| match o {
                Owner::Endpoint(key) => Some(key.clone()),
                _ => None,
            })
            .collect()
    }

    /// Hands the dirty owners to a flush, with the start time behind each stamped one.
    pub(super) fn take_dirty(&mut self) -> (BTreeSet<Owner>, HashMap<Owner, Instant>) {
        (
            std::mem::take(&mut self.dirty),
            std::mem::take(&mut self.since),
        )
    }

    /// Emits what `owner` renders now into `update`: upserts for chains that differ from the
    /// record, removals for chains it no longer renders. Returns whether it upserted any.
    pub(super) fn emit_owner(
        &mut self,
        owner: Owner,
        chains: Vec<(IpFamily, Chain)>,
        update: &mut Update,
    ) -> bool {
        let upserts_before = update.chains_upserted.len();
        let names: Vec<(IpFamily, String)> =
            chains.iter().map(|(f, c)| (*f, c.name.clone())).collect();
        let wanted: BTreeSet<&(IpFamily, String)> = names.iter().collect();
        for old in self.owned.remove(&owner).unwrap_or_default() {
            if !wanted.contains(&old) && self.chains.remove(&old).is_some() {
                update.chains_removed.push(old);
            }
        }
        for (family, chain) in chains {
            let slot = (family, chain.name.clone());
            if self.chains.get(&slot).map(|c| &**c) != Some(&chain) {
                let chain = Arc::new(chain);
                self.chains.insert(slot, chain.clone());
                update.chains_upserted.push((family, chain));
            }
        }
        if !names.is_empty() {
            self.owned.insert(owner, names);
        }
        update.chains_upserted.len() > upserts_before
    }

    /// Ends a flush: records its programming starts, and keeps a chain handed from one owner
    /// to another in the same flush as an upsert, not a removal.
    pub(super) fn finish(
        &mut self,
        starts: impl IntoIterator<Item = Instant>,
        update: &mut Update,
    ) {
        self.programming_starts.extend(starts);
        let upserted: BTreeSet<(IpFamily, String)> = update
            .chains_upserted
            .iter()
            .map(|(f, c)| (*f, c.name.clone()))
            .collect();
        update.chains_removed.retain(|c| !upserted.contains(c));
    }

    pub(super) fn take_programming_starts(&mut self) -> Vec<Instant> {
        std::mem::take(&mut self.programming_starts)
    }

    /// Emits the set index's net changes since the last flush (`pending`, in id order):
    /// creations with their members, member changes, removals.
    pub(super) fn emit_sets(
        &mut self,
        pending: Vec<(String, PendingSet)>,
        index: &SetIndex,
        families: &[IpFamily],
        update: &mut Update,
    ) {
        for (id, change) in pending {
            let now = index.set_by_id(&id).map(|s| s.def.clone());
            let was = self.sets.contains_key(&id);
            match (was, now) {
                (false, Some(def)) => {
                    for family in families {
                        update.sets_created.push(SetHeader {
                            name: set_name(*family, &id),
                            family: *family,
                            set_type: def.set_type(),
                        });
                    }
                    self.sets.insert(id.clone(), def);
                    add_member_changes(update, families, &id, &change.members, true);
                }
                (true, Some(_)) => {
                    add_member_changes(update, families, &id, &change.members, true);
                    add_member_changes(update, families, &id, &change.members, false);
                }
                (true, None) => {
                    self.sets.remove(&id);
                    for family in families {
                        update.sets_removed.push((*family, set_name(*family, &id)));
                    }
                }
                (false, None) => {}
            }
        }
    }

    /// Every chain as of the last flush.
    pub(super) fn chains(&self) -> &BTreeMap<(IpFamily, String), Arc<Chain>> {
        &self.chains
    }

    /// Every set (by id) as of the last flush.
    pub(super) fn sets(&self) -> &BTreeMap<String, SetDef> {
        &self.sets
    }
}

fn add_member_changes(
    update: &mut Update,
    families: &[IpFamily],
    id: &str,
    changes: &HashMap<Member, i8>,
    added: bool,
) {
    for &family in families {
        let members: BTreeSet<Member> = changes
            .iter()
            .filter(|(m, c)| (**c > 0) == added && m.family() == family)
            .map(|(m, _)| *m)
            .collect();
        if members.is_empty() {
            continue;
        }
        let target = if added {
            &mut update.members_added
        } else {
            &mut update.members_removed
        };
        target.insert(set_name(family, id), members);
    }
}
