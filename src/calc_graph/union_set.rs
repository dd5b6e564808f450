//! The union sets of workload chains (`rules::union`): which exist, how many workload
//! directions use each, and their members, derived from the peer sets they copy.
//!
//! A union set's members are the members of its parts' peer sets, each paired with the
//! part's protocol and port. The peer sets are the policies' own (the policies are active, so
//! `SetIndex` keeps them). A union created since the last flush is filled from the peer sets
//! as they are; after that it follows their net changes since the last flush (the changes
//! `SetIndex` is about to flush), with a count per entry, since two parts (or two peers
//! holding the same pod) can give the same entry. So a pod event costs its own entries, not
//! a recomputation of a union that may hold a whole cluster's pods times a few ports.
//!
//! Owns: the union sets and, per local endpoint with chains, the ids its ingress and egress
//! chains match. Invariants: a union's user count is the number of endpoint directions
//! naming it; a union is created at the first flush after its first user and retired at the
//! first flush after its last one left; an endpoint's new unions are taken before its old
//! ones are released, so a union both versions use is not churned.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::model::{IpFamily, ObjectKey, Protocol};
use crate::rules::sets::{set_name, Member, SetSpec, SetType};
use crate::rules::union::{UnionPart, UnionPlan};

use super::set_index::{PendingSet, SetIndex};
use super::update::{FamilyState, SetHeader, Update};

struct UnionEntry {
    parts: Vec<UnionPart>,
    /// Peer set id → the (protocol, port) pairs its addresses are entered with.
    ports_by_peer: HashMap<String, Vec<(Protocol, u16)>>,
    /// Workload directions rendering a match on it; 0: retired at the next flush.
    users: usize,
    /// Entries and how many (part, peer member) pairs give each.
    counts: HashMap<Member, u32>,
    /// Entries whose count changed since the last flush.
    touched: HashSet<Member>,
    /// What the last flush emitted; `None` before the set was created.
    emitted: Option<BTreeSet<Member>>,
    dirty: bool,
}

#[derive(Default)]
pub(super) struct UnionSets {
    unions: BTreeMap<String, UnionEntry>,
    /// Peer set id → the unions that copy it.
    by_peer: HashMap<String, BTreeSet<String>>,
    /// Per local endpoint with a union: the ids its ingress and egress chains match, as of
    /// the last flush.
    by_endpoint: HashMap<ObjectKey, [Option<String>; 2]>,
}

impl UnionSets {
    /// The unions an endpoint's chains should match now (ingress, egress; `None` for an
    /// endpoint gone or without chains).
    pub(super) fn set_endpoint(&mut self, key: ObjectKey, now: [Option<UnionPlan>; 2]) {
        let ids = [0, 1].map(|i| now[i].as_ref().map(|u| u.id.clone()));
        let before = self.by_endpoint.remove(&key).unwrap_or_default();
        if ids == before {
            if ids.iter().any(Option::is_some) {
                self.by_endpoint.insert(key, before);
            }
            return;
        }
        for plan in now.iter().flatten() {
            self.acquire(plan);
        }
        for id in before.iter().flatten() {
            self.release(id);
        }
        if ids.iter().any(Option::is_some) {
            self.by_endpoint.insert(key, ids);
        }
    }

    /// The union set ids an endpoint's chains match (ingress, egress).
    pub(super) fn endpoint_ids(&self, key: &ObjectKey) -> [Option<&str>; 2] {
        match self.by_endpoint.get(key) {
            Some([i, e]) => [i.as_deref(), e.as_deref()],
            None => [None, None],
        }
    }

    /// One more workload direction uses `plan`'s set.
    fn acquire(&mut self, plan: &UnionPlan) {
        let entry = self.unions.entry(plan.id.clone()).or_insert_with(|| {
            let mut ports_by_peer: HashMap<String, Vec<(Protocol, u16)>> = HashMap::new();
            for p in &plan.parts {
                ports_by_peer
                    .entry(p.peer_id.clone())
                    .or_default()
                    .push((p.protocol, p.port));
            }
            UnionEntry {
                parts: plan.parts.clone(),
                ports_by_peer,
                users: 0,
                counts: HashMap::new(),
                touched: HashSet::new(),
                emitted: None,
                dirty: true,
            }
        });
        if entry.users == 0 {
            for part in &plan.parts {
                self.by_peer
                    .entry(part.peer_id.clone())
                    .or_default()
                    .insert(plan.id.clone());
            }
        }
        entry.users += 1;
    }

    /// One workload direction no longer uses set `id`; the last one retires it at the flush.
    fn release(&mut self, id: &str) {
        let Some(entry) = self.unions.get_mut(id) else {
            return;
        };
        entry.users = entry.users.saturating_sub(1);
        if entry.users == 0 {
            entry.dirty = true;
            for part in &entry.parts {
                if let Some(unions) = self.by_peer.get_mut(&part.peer_id) {
                    unions.remove(id);
                    if unions.is_empty() {
                        self.by_peer.remove(&part.peer_id);
                    }
                }
            }
        }
    }

    /// Applies the peer sets' net member changes since the last flush (`SetIndex`'s pending
    /// changes, before they are flushed) to the unions created before it; a union created
    /// since is filled whole at the flush.
    pub(super) fn peers_changed(&mut self, pending: &HashMap<String, PendingSet>) {
        for (peer, change) in pending {
            let Some(ids) = self.by_peer.get(peer) else {
                continue;
            };
            for id in ids {
                let Some(u) = self.unions.get_mut(id) else {
                    continue;
                };
                if u.emitted.is_none() {
                    continue;
                }
                let Some(ports) = u.ports_by_peer.get(peer) else {
                    continue;
                };
                for (m, &delta) in &change.members {
                    let (Member::Addr(ip), false) = (m, delta == 0) else {
                        continue;
                    };
                    for &(protocol, port) in ports {
                        let entry = Member::AddrPort(*ip, protocol, port);
                        let count = u.counts.entry(entry).or_insert(0);
                        if delta > 0 {
                            *count += 1;
                        } else {
                            *count = count.saturating_sub(1);
                        }
                        if *count == 0 {
                            u.counts.remove(&entry);
                        }
                        u.touched.insert(entry);
                    }
                }
                u.dirty = true;
            }
        }
    }

    /// Creates, updates and retires the dirty unions' sets in `update`.
    pub(super) fn flush(&mut self, sets: &SetIndex, families: &[IpFamily], update: &mut Update) {
        let mut retired = Vec::new();
        for (id, entry) in self.unions.iter_mut().filter(|(_, u)| u.dirty) {
            entry.dirty = false;
            if entry.users == 0 {
                if entry.emitted.is_some() {
                    for &family in families {
                        update.sets_removed.push((family, set_name(family, id)));
                    }
                }
                retired.push(id.clone());
                continue;
            }
            let (created, mut emitted) = match entry.emitted.take() {
                Some(e) => (false, e),
                None => {
                    for &family in families {
                        update.sets_created.push(SetHeader {
                            name: set_name(family, id),
                            family,
                            set_type: SetType::HashIpPort,
                        });
                    }
                    entry.counts = counts(&entry.parts, sets);
                    entry.touched = entry.counts.keys().copied().collect();
                    (true, BTreeSet::new())
                }
            };
            let mut added: BTreeSet<Member> = BTreeSet::new();
            let mut removed: BTreeSet<Member> = BTreeSet::new();
            for m in std::mem::take(&mut entry.touched) {
                match (entry.counts.contains_key(&m), emitted.contains(&m)) {
                    (true, false) => {
                        emitted.insert(m);
                        added.insert(m);
                    }
                    (false, true) => {
                        emitted.remove(&m);
                        removed.insert(m);
                    }
                    _ => {}
                }
            }
            debug_assert!(!created || removed.is_empty());
            for &family in families {
                let of = |s: &BTreeSet<Member>| -> BTreeSet<Member> {
                    s.iter().filter(|m| m.family() == family).copied().collect()
                };
                let (a, r) = (of(&added), of(&removed));
                if !a.is_empty() {
                    update.members_added.insert(set_name(family, id), a);
                }
                if !r.is_empty() {
                    update.members_removed.insert(set_name(family, id), r);
                }
            }
            entry.emitted = Some(emitted);
        }
        for id in retired {
            self.unions.remove(&id);
        }
    }

    /// Adds the union sets as of the last flush to a family's snapshot.
    pub(super) fn snapshot(&self, family: IpFamily, state: &mut FamilyState) {
        for (id, entry) in &self.unions {
            let Some(emitted) = &entry.emitted else {
                continue;
            };
            let name = set_name(family, id);
            state.sets.insert(
                name.clone(),
                SetSpec {
                    name,
                    family,
                    set_type: SetType::HashIpPort,
                    members: emitted
                        .iter()
                        .filter(|m| m.family() == family)
                        .copied()
                        .collect(),
                },
            );
        }
    }

    /// `(id, parts)` of every union set in the kernel as of the last flush.
    pub(super) fn emitted(&self) -> impl Iterator<Item = (&String, &[UnionPart])> {
        self.unions
            .iter()
            .filter(|(_, u)| u.emitted.is_some())
            .map(|(id, u)| (id, u.parts.as_slice()))
    }
}

/// The union's entries as the peer sets hold them now, with how many (part, member) pairs
/// give each.
fn counts(parts: &[UnionPart], sets: &SetIndex) -> HashMap<Member, u32> {
    let mut out = HashMap::new();
    for part in parts {
        let Some(peer) = sets.set_by_id(&part.peer_id) else {
            continue;
        };
        for m in peer.members.keys() {
            if let Member::Addr(ip) = m {
                *out.entry(Member::AddrPort(*ip, part.protocol, part.port))
                    .or_insert(0) += 1;
            }
        }
    }
    out
}
