//! IP set membership, kept incrementally: which pods (cluster-wide) belong to each active
//! set, with reference-counted members and the deltas since the last flush.
//!
//! Owns: every pod (cluster-wide, in compact form) and namespace with its labels, the active
//! sets with their references and members, and the net member changes since the last flush
//! (`pending`, which the flush hands to the union sets and then to the output). Invariants: a
//! set exists while some active policy references it (the selection's acquires and releases,
//! routed by the graph), and its members are exactly those of the pods its definition selects.
//! The other calculators read pods' and namespaces' labels here.
//!
//! A pod event only re-evaluates the sets that could change:
//! - a new pod (or new IPs/ports) is checked against the sets *anchored* on one of its labels,
//!   its namespace or its namespace's labels (each set is anchored on one positive
//!   requirement, felix's label-restriction idea), plus the rare unanchored ones;
//! - a label change of an existing pod re-evaluates only the sets whose selectors mention a
//!   changed key, and for a value change only those naming the old or the new value;
//! - a namespace relabel re-evaluates the namespace-selector sets that mention a changed key,
//!   for that namespace's pods only.

use std::collections::{BTreeMap, HashMap, HashSet};

use kube::core::Expression;

use super::compact_pod::{release_labels, CompactPod, Interner, Labels, PodIds};
use crate::model::{LabelLookup, LabelSel, NamespaceInfo, NamespaceScope, ObjectKey, PodInfo};
use crate::rules::sets::{Member, SetDef};

type PodId = usize;
type SetId = usize;
/// A pod id in the indexes that hold one entry per pod (namespace members, label values):
/// 32 bits halve their tables at 150k pods.
type PodSlot = u32;

fn pod_slot(id: PodId) -> PodSlot {
    PodSlot::try_from(id).unwrap_or(PodSlot::MAX)
}
type Contribution = smallvec::SmallVec<[Member; 1]>;

struct PodEntry {
    info: CompactPod,
    /// Sets the pod currently contributes members to.
    sets: SetIds,
}

/// A pod's sets as a sorted vector of 32-bit ids: a pod is in a handful of sets, and at 150k
/// pods a `HashSet<usize>` per pod (48 bytes inline and a table of its own) cost some 15 MiB
/// more than this.
#[derive(Default)]
struct SetIds(Vec<u32>);

impl SetIds {
    fn insert(&mut self, id: SetId) {
        let id = set_id_u32(id);
        if let Err(at) = self.0.binary_search(&id) {
            self.0.insert(at, id);
        }
    }

    fn remove(&mut self, id: &SetId) {
        let id = set_id_u32(*id);
        if let Ok(at) = self.0.binary_search(&id) {
            self.0.remove(at);
            if self.0.is_empty() {
                self.0 = Vec::new();
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = SetId> + '_ {
        self.0.iter().map(|&id| id as SetId)
    }
}

/// Set ids are slots of `SetIndex::sets`, one per active set: far below 2^32.
fn set_id_u32(id: SetId) -> u32 {
    u32::try_from(id).unwrap_or(u32::MAX)
}

struct NamespaceEntry {
    labels: BTreeMap<String, String>,
    /// Seen as a Namespace object (not only implied by its pods).
    explicit: bool,
    pods: HashSet<PodSlot>,
}

pub(crate) struct SetEntry {
    pub(crate) def: SetDef,
    pub(crate) id: String,
    refcount: usize,
    /// What each member pod adds: one address, or one per family for a dual-stack pod, so
    /// kept inline rather than in a vector of its own per pod and set.
    contributions: HashMap<PodId, Contribution>,
    pub(crate) members: HashMap<Member, u32>,
    anchor: Anchor,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Anchor {
    PodLabel(String, String),
    PodKey(String),
    Namespace(String),
    NsLabel(String, String),
    NsKey(String),
    Unanchored,
}

/// Sets whose selectors mention one label key.
#[derive(Default)]
struct KeyRefs {
    all: HashSet<SetId>,
    by_value: HashMap<String, HashSet<SetId>>,
}

/// Net change of one set since the last flush.
#[derive(Default)]
pub(crate) struct PendingSet {
    pub(crate) members: HashMap<Member, i8>,
}

#[derive(Default)]
pub(crate) struct SetIndex {
    /// Boxed: the table grows by doubling, and an empty slot then costs a pointer, not a
    /// record.
    pods: Vec<Option<Box<PodEntry>>>,
    interner: Interner,
    free_pods: Vec<PodId>,
    pod_ids: PodIds,
    pods_by_label: HashMap<String, HashMap<String, HashSet<PodSlot>>>,
    namespaces: HashMap<String, NamespaceEntry>,

    sets: Vec<Option<SetEntry>>,
    free_sets: Vec<SetId>,
    set_ids: HashMap<SetDef, SetId>,
    ids_by_name: HashMap<String, SetId>,
    pod_key_refs: HashMap<String, KeyRefs>,
    ns_key_refs: HashMap<String, KeyRefs>,
    anchors: HashMap<Anchor, HashSet<SetId>>,

    /// Keyed by set ID string, so a set retired and recreated within one flush nets out.
    pub(crate) pending: HashMap<String, PendingSet>,
    /// Number of set evaluations done (a pod or namespace checked against a set).
    pub(crate) evaluations: u64,
}

impl SetIndex {
    pub fn pod(&self, key: &ObjectKey) -> Option<&CompactPod> {
        self.pod_id(key)
            .and_then(|id| self.pods[id].as_ref())
            .map(|e| &e.info)
    }

    fn pod_id(&self, key: &ObjectKey) -> Option<PodId> {
        let pods = &self.pods;
        self.pod_ids
            .get(key, |id| pods.get(id)?.as_ref().map(|e| &e.info))
    }

    pub fn pods(&self) -> impl Iterator<Item = &CompactPod> {
        self.pods.iter().flatten().map(|e| &e.info)
    }

    pub fn sets(&self) -> impl Iterator<Item = &SetEntry> {
        self.sets.iter().flatten()
    }

    pub fn set_by_id(&self, id: &str) -> Option<&SetEntry> {
        self.ids_by_name
            .get(id)
            .and_then(|i| self.sets[*i].as_ref())
    }

    pub fn upsert_pod(&mut self, info: PodInfo) {
        let key = info.key.clone();
        let Some(id) = self.pod_id(&key) else {
            let id = self.free_pods.pop().unwrap_or(self.pods.len());
            if id == self.pods.len() {
                self.pods.push(None);
            }
            let info = CompactPod::new(info, &mut self.interner);
            self.index_pod_labels(id, &info.labels, true);
            self.namespace_entry(&key.namespace)
                .pods
                .insert(pod_slot(id));
            self.pods[id] = Some(Box::new(PodEntry {
                info,
                sets: SetIds::default(),
            }));
            let pods = &self.pods;
            if let Some(entry) = pods[id].as_ref() {
                self.pod_ids.insert(id, &entry.info, |id| {
                    pods.get(id)?.as_ref().map(|e| &e.info)
                });
            }
            let candidates = self.anchored_candidates(id);
            for set in candidates {
                self.evaluate(set, id);
            }
            return;
        };
        let Some(entry) = self.pods[id].as_mut() else {
            return;
        };
        if entry.info.same_as(&info) {
            return;
        }
        let info = CompactPod::new(info, &mut self.interner);
        let old = std::mem::replace(&mut entry.info, info);
        let mut candidates = label_change_candidates(
            old.labels.keys().chain(entry.info.labels.keys()),
            &old.labels,
            &entry.info.labels,
            &self.pod_key_refs,
        );
        let addresses_changed =
            old.ips != entry.info.ips || old.named_ports != entry.info.named_ports;
        if addresses_changed {
            candidates.extend(entry.sets.iter());
        }
        if old.labels != entry.info.labels {
            let new_labels = entry.info.labels.clone();
            self.index_pod_labels(id, &old.labels, false);
            self.index_pod_labels(id, &new_labels, true);
            release_labels(new_labels, &mut self.interner);
        }
        old.release(&mut self.interner);
        if addresses_changed {
            candidates.extend(self.anchored_candidates(id));
        }
        for set in candidates {
            self.evaluate(set, id);
        }
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) {
        let pods = &self.pods;
        let Some(id) = self
            .pod_ids
            .remove(key, |id| pods.get(id)?.as_ref().map(|e| &e.info))
        else {
            return;
        };
        let Some(entry) = self.pods[id].take() else {
            return;
        };
        for set in entry.sets.iter() {
            if let Some(s) = self.sets[set].as_mut() {
                if let Some(old) = s.contributions.remove(&id) {
                    remove_members(s, &old, &mut self.pending);
                }
            }
        }
        self.index_pod_labels(id, &entry.info.labels, false);
        if let Some(ns) = self.namespaces.get_mut(&key.namespace) {
            ns.pods.remove(&pod_slot(id));
            if ns.pods.is_empty() && !ns.explicit {
                self.namespaces.remove(&key.namespace);
            }
        }
        entry.info.release(&mut self.interner);
        self.free_pods.push(id);
    }

    /// A namespace's labels as the sets see them (`kubernetes.io/metadata.name` alone when
    /// no Namespace object was seen). ClusterNetworkPolicy subjects select by them too.
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        self.namespaces
            .get(name)
            .map(|n| n.labels.clone())
            .unwrap_or_else(|| NamespaceInfo::implicit(name).labels)
    }

    pub fn upsert_namespace(&mut self, info: NamespaceInfo) {
        let entry = self.namespace_entry(&info.name);
        entry.explicit = true;
        self.relabel_namespace(&info.name, info.labels);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        let Some(entry) = self.namespaces.get_mut(name) else {
            return;
        };
        entry.explicit = false;
        if entry.pods.is_empty() {
            self.namespaces.remove(name);
        } else {
            self.relabel_namespace(name, NamespaceInfo::implicit(name).labels);
        }
    }

    fn relabel_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        let Some(entry) = self.namespaces.get_mut(name) else {
            return;
        };
        if entry.labels == labels {
            return;
        }
        let old = std::mem::replace(&mut entry.labels, labels);
        let candidates = label_change_candidates(
            old.keys().chain(entry.labels.keys()).map(String::as_str),
            &old,
            &entry.labels,
            &self.ns_key_refs,
        );
        let pods: Vec<PodId> = entry.pods.iter().map(|&p| p as PodId).collect();
        for set in candidates {
            for pod in &pods {
                self.evaluate(set, *pod);
            }
        }
    }

    fn namespace_entry(&mut self, name: &str) -> &mut NamespaceEntry {
        self.namespaces
            .entry(name.to_string())
            .or_insert_with(|| NamespaceEntry {
                labels: NamespaceInfo::implicit(name).labels,
                explicit: false,
                pods: HashSet::new(),
            })
    }

    fn index_pod_labels(&mut self, id: PodId, labels: &Labels, add: bool) {
        for (k, v) in labels.iter() {
            if add {
                self.pods_by_label
                    .entry(k.to_string())
                    .or_default()
                    .entry(v.to_string())
                    .or_default()
                    .insert(pod_slot(id));
            } else if let Some(values) = self.pods_by_label.get_mut(k) {
                if let Some(pods) = values.get_mut(v) {
                    pods.remove(&pod_slot(id));
                    if pods.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.pods_by_label.remove(k);
                }
            }
        }
    }

    /// Sets a pod could belong to, found through the anchors of its labels and namespace.
    fn anchored_candidates(&self, id: PodId) -> HashSet<SetId> {
        let mut out = HashSet::new();
        let Some(entry) = self.pods[id].as_ref() else {
            return out;
        };
        let mut take = |anchor: &Anchor| {
            if let Some(sets) = self.anchors.get(anchor) {
                out.extend(sets.iter().copied());
            }
        };
        // Building owned anchors per lookup costs a few allocations per pod event; the
        // number of labels per pod is small.
        for (k, v) in entry.info.labels.iter() {
            take(&Anchor::PodLabel(k.to_string(), v.to_string()));
            take(&Anchor::PodKey(k.to_string()));
        }
        let ns = &*entry.info.namespace;
        take(&Anchor::Namespace(ns.to_string()));
        if let Some(ns_entry) = self.namespaces.get(ns) {
            for (k, v) in &ns_entry.labels {
                take(&Anchor::NsLabel(k.clone(), v.clone()));
                take(&Anchor::NsKey(k.clone()));
            }
        }
        take(&Anchor::Unanchored);
        out
    }

    /// Takes a reference on the set for `def`, creating and filling it on first use.
    pub fn acquire(&mut self, def: &SetDef) {
        if let Some(&id) = self.set_ids.get(def) {
            if let Some(s) = self.sets[id].as_mut() {
                s.refcount += 1;
            }
            return;
        }
        let id = self.free_sets.pop().unwrap_or(self.sets.len());
        if id == self.sets.len() {
            self.sets.push(None);
        }
        let anchor = choose_anchor(def);
        self.anchors.entry(anchor.clone()).or_default().insert(id);
        register_keys(&mut self.pod_key_refs, def.pods(), id, true);
        if let NamespaceScope::Selector(sel) = def.namespaces() {
            register_keys(&mut self.ns_key_refs, sel, id, true);
        }
        let set_id = def.id();
        self.pending.entry(set_id.clone()).or_default();
        self.ids_by_name.insert(set_id.clone(), id);
        self.sets[id] = Some(SetEntry {
            def: def.clone(),
            id: set_id,
            refcount: 1,
            contributions: HashMap::new(),
            members: HashMap::new(),
            anchor,
        });
        self.set_ids.insert(def.clone(), id);
        for pod in self.creation_candidates(def) {
            self.evaluate(id, pod);
        }
    }

    /// Drops a reference; the last one retires the set.
    pub fn release(&mut self, def: &SetDef) {
        let Some(&id) = self.set_ids.get(def) else {
            return;
        };
        let Some(set) = self.sets[id].as_mut() else {
            return;
        };
        set.refcount -= 1;
        if set.refcount > 0 {
            return;
        }
        let Some(mut set) = self.sets[id].take() else {
            return;
        };
        self.set_ids.remove(def);
        self.ids_by_name.remove(&set.id);
        // Even an empty set must reach the next flush, which retires it.
        self.pending.entry(set.id.clone()).or_default();
        if let Some(a) = self.anchors.get_mut(&set.anchor) {
            a.remove(&id);
            if a.is_empty() {
                self.anchors.remove(&set.anchor);
            }
        }
        register_keys(&mut self.pod_key_refs, def.pods(), id, false);
        if let NamespaceScope::Selector(sel) = def.namespaces() {
            register_keys(&mut self.ns_key_refs, sel, id, false);
        }
        for (pod, members) in std::mem::take(&mut set.contributions) {
            if let Some(p) = self.pods[pod].as_mut() {
                p.sets.remove(&id);
            }
            remove_members(&mut set, &members, &mut self.pending);
        }
        self.free_sets.push(id);
    }

    /// Pods worth checking when a set is created: the smallest of the pods carrying its
    /// anchor label, the pods of its namespace, or the pods of the namespaces it selects.
    fn creation_candidates(&self, def: &SetDef) -> Vec<PodId> {
        let mut options: Vec<Vec<PodId>> = Vec::new();
        if let Some((k, v)) = def.pods().exprs().iter().find_map(|e| match e {
            Expression::Equal(k, v) => Some((k, v)),
            _ => None,
        }) {
            options.push(
                self.pods_by_label
                    .get(k)
                    .and_then(|vals| vals.get(v))
                    .map(|p| p.iter().map(|&p| p as PodId).collect())
                    .unwrap_or_default(),
            );
        }
        match def.namespaces() {
            NamespaceScope::Named(ns) => options.push(
                self.namespaces
                    .get(ns)
                    .map(|n| n.pods.iter().map(|&p| p as PodId).collect())
                    .unwrap_or_default(),
            ),
            NamespaceScope::Selector(sel) => options.push(
                self.namespaces
                    .values()
                    .filter(|n| sel.matches(&n.labels))
                    .flat_map(|n| n.pods.iter().map(|&p| p as PodId))
                    .collect(),
            ),
        }
        options.into_iter().min_by_key(Vec::len).unwrap_or_default()
    }

    /// Brings one pod's contribution to one set up to date.
    fn evaluate(&mut self, set_id: SetId, pod_id: PodId) {
        self.evaluations += 1;
        let (Some(set), Some(pod)) = (self.sets[set_id].as_mut(), self.pods[pod_id].as_mut())
        else {
            return;
        };
        let ns_matches = match set.def.namespaces() {
            NamespaceScope::Named(ns) => **ns == *pod.info.namespace,
            NamespaceScope::Selector(sel) => self
                .namespaces
                .get(&*pod.info.namespace)
                .is_some_and(|n| sel.matches(&n.labels)),
        };
        let new: Contribution = if ns_matches && set.def.pods().matches(&pod.info.labels) {
            set.def
                .members_from(&pod.info.ips, &pod.info.named_ports)
                .into_iter()
                .collect()
        } else {
            Contribution::new()
        };
        let old = set.contributions.get(&pod_id);
        if old.map_or(new.is_empty(), |o| *o == new) {
            return;
        }
        if let Some(old) = set.contributions.remove(&pod_id) {
            remove_members(set, &old, &mut self.pending);
        }
        if new.is_empty() {
            pod.sets.remove(&set_id);
        } else {
            let pending = self.pending.entry(set.id.clone()).or_default();
            for m in &new {
                let count = set.members.entry(*m).or_insert(0);
                *count += 1;
                if *count == 1 {
                    net_change(pending, *m, 1);
                }
            }
            set.contributions.insert(pod_id, new);
            pod.sets.insert(set_id);
        }
    }
}

fn remove_members(
    set: &mut SetEntry,
    members: &[Member],
    pending: &mut HashMap<String, PendingSet>,
) {
    let pending = pending.entry(set.id.clone()).or_default();
    for m in members {
        if let Some(count) = set.members.get_mut(m) {
            *count -= 1;
            if *count == 0 {
                set.members.remove(m);
                net_change(pending, *m, -1);
            }
        }
    }
}

/// Records a member appearing (+1) or disappearing (-1); opposite changes cancel out.
fn net_change(pending: &mut PendingSet, member: Member, change: i8) {
    match pending.members.get(&member) {
        Some(prev) if *prev == -change => {
            pending.members.remove(&member);
        }
        _ => {
            pending.members.insert(member, change);
        }
    }
}

/// Sets whose result may differ between two label maps.
fn label_change_candidates<'a, L: LabelLookup>(
    keys: impl Iterator<Item = &'a str>,
    old: &L,
    new: &L,
    refs: &HashMap<String, KeyRefs>,
) -> HashSet<SetId> {
    let mut out = HashSet::new();
    let keys: HashSet<&str> = keys.collect();
    for key in keys {
        let Some(key_refs) = refs.get(key) else {
            continue;
        };
        match (old.label(key), new.label(key)) {
            (Some(a), Some(b)) if a == b => {}
            // A value change can only flip requirements that name one of the two values.
            (Some(a), Some(b)) => {
                for v in [a, b] {
                    if let Some(sets) = key_refs.by_value.get(v) {
                        out.extend(sets.iter().copied());
                    }
                }
            }
            _ => out.extend(key_refs.all.iter().copied()),
        }
    }
    out
}

fn register_keys(refs: &mut HashMap<String, KeyRefs>, sel: &LabelSel, id: SetId, add: bool) {
    for e in sel.exprs() {
        let (key, values): (&String, Vec<&String>) = match e {
            Expression::Equal(k, v) | Expression::NotEqual(k, v) => (k, vec![v]),
            Expression::In(k, vs) | Expression::NotIn(k, vs) => (k, vs.iter().collect()),
            Expression::Exists(k) | Expression::DoesNotExist(k) => (k, vec![]),
        };
        if add {
            let r = refs.entry(key.clone()).or_default();
            r.all.insert(id);
            for v in values {
                r.by_value.entry(v.clone()).or_default().insert(id);
            }
        } else if let Some(r) = refs.get_mut(key) {
            r.all.remove(&id);
            for v in values {
                if let Some(s) = r.by_value.get_mut(v) {
                    s.remove(&id);
                    if s.is_empty() {
                        r.by_value.remove(v);
                    }
                }
            }
            if r.all.is_empty() {
                refs.remove(key);
            }
        }
    }
}

/// One positive requirement every member must satisfy, used to find candidate sets for a
/// new pod without checking every set.
fn choose_anchor(def: &SetDef) -> Anchor {
    fn positive(sel: &LabelSel) -> Option<(String, Option<String>)> {
        let exprs = sel.exprs();
        exprs
            .iter()
            .find_map(|e| match e {
                Expression::Equal(k, v) => Some((k.clone(), Some(v.clone()))),
                _ => None,
            })
            .or_else(|| {
                exprs.iter().find_map(|e| match e {
                    Expression::In(k, _) | Expression::Exists(k) => Some((k.clone(), None)),
                    _ => None,
                })
            })
    }
    if let Some((k, v)) = positive(def.pods()) {
        return match v {
            Some(v) => Anchor::PodLabel(k, v),
            None => Anchor::PodKey(k),
        };
    }
    match def.namespaces() {
        NamespaceScope::Named(ns) => Anchor::Namespace(ns.clone()),
        NamespaceScope::Selector(sel) => match positive(sel) {
            Some((k, Some(v))) => Anchor::NsLabel(k, v),
            Some((k, None)) => Anchor::NsKey(k),
            None => Anchor::Unanchored,
        },
    }
}
