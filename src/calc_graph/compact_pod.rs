//! The calc graph's own record of a pod: what `PodInfo` says, in the least memory that keeps
//! lookups as fast. At 150k pods the graph holds every pod of the cluster, and the model's
//! `PodInfo` (a `BTreeMap` node per pod for its labels, a `String` per field) cost about
//! 1.4 KiB a pod; this record is a fraction of that.
//!
//! - Namespaces and node names repeat across pods: they are interned (`Interner`, owned by
//!   the set index) and shared as `Arc<str>`.
//! - A pod's whole label set and its whole list of named ports are interned too: the replicas
//!   of a Deployment or StatefulSet carry the same labels (bar a per-pod one, rarely) and
//!   the same container ports, so a record holds one pointer to each, shared by its peers.
//!   Labels are pairs sorted by key (the `BTreeMap`'s order), looked up by binary search.
//! - Anything interned is dropped from the interner when the last record using it lets go of
//!   it (`CompactPod::release`).
//! - Addresses are a boxed slice; uid and sandbox id (kept for local pods only, see
//!   `CalcGraph::upsert_pod_info`) sit behind one optional box.
//!
//! Hand-written rather than an interning crate: what is needed is a hash table of `Arc`s and
//! the reference count `Arc` already keeps, looked up by borrowed content (a `BTreeMap`, a
//! slice) without building the value first, and the release must follow the graph's own
//! removals.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::model::{LabelLookup, NamedPort, ObjectKey, PodInfo};

/// A label set as the pods carrying it share it: pairs sorted by key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LabelSet(Box<[(Box<str>, Box<str>)]>);

/// Strings, label sets and named-port lists shared by the pod records.
#[derive(Default)]
pub(crate) struct Interner {
    strings: HashSet<Arc<str>>,
    label_sets: HashTable<Arc<LabelSet>>,
    port_lists: HashTable<Arc<[NamedPort]>>,
    hasher: RandomState,
}

impl Interner {
    pub(crate) fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(s);
        self.strings.insert(shared.clone());
        shared
    }

    /// Called by the holder of `s` just before it drops it: the interner forgets the string
    /// when nobody else uses it.
    fn release(&mut self, s: &Arc<str>) {
        // The interner's reference and the caller's.
        if Arc::strong_count(s) <= 2 {
            self.strings.remove(&**s);
        }
    }

    fn hash_labels<'a>(
        hasher: &RandomState,
        pairs: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> u64 {
        let mut h = hasher.build_hasher();
        for (k, v) in pairs {
            k.hash(&mut h);
            v.hash(&mut h);
        }
        h.finish()
    }

    fn intern_labels(&mut self, map: &BTreeMap<String, String>) -> Labels {
        let hash = Self::hash_labels(
            &self.hasher,
            map.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        if let Some(shared) = self.label_sets.find(hash, |set| set.same_as(map)) {
            return Labels(shared.clone());
        }
        let set = Arc::new(LabelSet(
            map.iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
        ));
        let hasher = &self.hasher;
        self.label_sets.insert_unique(hash, set.clone(), |set| {
            Self::hash_labels(hasher, set.iter())
        });
        Labels(set)
    }

    fn release_labels(&mut self, labels: &Labels) {
        if Arc::strong_count(&labels.0) <= 2 {
            let hash = Self::hash_labels(&self.hasher, labels.iter());
            if let Ok(entry) = self
                .label_sets
                .find_entry(hash, |set| Arc::ptr_eq(set, &labels.0))
            {
                entry.remove();
            }
        }
    }

    fn intern_ports(&mut self, ports: &[NamedPort]) -> Arc<[NamedPort]> {
        let hash = self.hasher.hash_one(ports);
        if let Some(shared) = self.port_lists.find(hash, |list| **list == *ports) {
            return shared.clone();
        }
        let list: Arc<[NamedPort]> = Arc::from(ports);
        let hasher = &self.hasher;
        self.port_lists
            .insert_unique(hash, list.clone(), |list| hasher.hash_one(&**list));
        list
    }

    fn release_ports(&mut self, ports: &Arc<[NamedPort]>) {
        if Arc::strong_count(ports) <= 2 {
            let hash = self.hasher.hash_one(&**ports);
            if let Ok(entry) = self
                .port_lists
                .find_entry(hash, |list| Arc::ptr_eq(list, ports))
            {
                entry.remove();
            }
        }
    }
}

impl LabelSet {
    fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    fn same_as(&self, map: &BTreeMap<String, String>) -> bool {
        self.0.len() == map.len()
            && self
                .iter()
                .zip(map)
                .all(|((k, v), (mk, mv))| k == mk && v == mv)
    }
}

/// Pod key → pod id, holding no copy of the keys: each id's record has its key, and the
/// caller hands the table a way to reach the records (`record`).
#[derive(Default)]
pub(crate) struct PodIds {
    table: HashTable<usize>,
    hasher: RandomState,
}

impl PodIds {
    fn hash(&self, namespace: &str, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    pub(crate) fn get<'a>(
        &self,
        key: &ObjectKey,
        record: impl Fn(usize) -> Option<&'a CompactPod>,
    ) -> Option<usize> {
        let hash = self.hash(&key.namespace, &key.name);
        self.table
            .find(hash, |&id| record(id).is_some_and(|p| p.has_key(key)))
            .copied()
    }

    /// Adds `id` for `pod`, whose key is not in the table yet.
    pub(crate) fn insert<'a>(
        &mut self,
        id: usize,
        pod: &CompactPod,
        record: impl Fn(usize) -> Option<&'a CompactPod>,
    ) {
        let hash = self.hash(&pod.namespace, &pod.name);
        let hasher = &self.hasher;
        self.table.insert_unique(hash, id, |&other| {
            // Every id in the table has a record (ids leave the table before their records).
            record(other).map_or(0, |p| hasher.hash_one((&*p.namespace, &*p.name)))
        });
    }

    pub(crate) fn remove<'a>(
        &mut self,
        key: &ObjectKey,
        record: impl Fn(usize) -> Option<&'a CompactPod>,
    ) -> Option<usize> {
        let hash = self.hash(&key.namespace, &key.name);
        match self
            .table
            .find_entry(hash, |&id| record(id).is_some_and(|p| p.has_key(key)))
        {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }
}

/// A pod's labels, sorted by key: a handle on a label set shared through the interner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Labels(Arc<LabelSet>);

impl Labels {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.0 .0.iter().map(|(k, _)| &**k)
    }

    pub(crate) fn same_as(&self, map: &BTreeMap<String, String>) -> bool {
        self.0.same_as(map)
    }

    fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl LabelLookup for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        let pairs = &self.0 .0;
        pairs
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*pairs[i].1)
    }
}

/// A pod as the set index keeps it; `to_info` gives back the `PodInfo` it was made from.
#[derive(Debug)]
pub(crate) struct CompactPod {
    pub(crate) namespace: Arc<str>,
    name: Box<str>,
    pub(crate) node: Option<Arc<str>>,
    pub(crate) labels: Labels,
    pub(crate) ips: Box<[IpAddr]>,
    pub(crate) named_ports: Arc<[NamedPort]>,
    ids: Option<Box<LocalIds>>,
}

/// What names a local pod's interface: its uid and sandbox id.
#[derive(Debug, PartialEq, Eq)]
struct LocalIds {
    uid: Option<Box<str>>,
    sandbox_id: Option<Box<str>>,
}

impl CompactPod {
    pub(crate) fn new(info: PodInfo, interner: &mut Interner) -> CompactPod {
        let ids = (info.uid.is_some() || info.sandbox_id.is_some()).then(|| {
            Box::new(LocalIds {
                uid: info.uid.map(String::into_boxed_str),
                sandbox_id: info.sandbox_id.map(String::into_boxed_str),
            })
        });
        CompactPod {
            namespace: interner.intern(&info.key.namespace),
            name: info.key.name.into_boxed_str(),
            node: info.node.as_deref().map(|n| interner.intern(n)),
            labels: interner.intern_labels(&info.labels),
            ips: info.ips.into_boxed_slice(),
            named_ports: interner.intern_ports(&info.named_ports),
            ids,
        }
    }

    fn uid(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|ids| ids.uid.as_deref())
    }

    fn sandbox_id(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|ids| ids.sandbox_id.as_deref())
    }

    /// Whether this record says exactly what `info` says.
    pub(crate) fn same_as(&self, info: &PodInfo) -> bool {
        *self.namespace == *info.key.namespace
            && *self.name == *info.key.name
            && self.uid() == info.uid.as_deref()
            && self.node.as_deref() == info.node.as_deref()
            && self.labels.same_as(&info.labels)
            && *self.ips == *info.ips
            && *self.named_ports == *info.named_ports
            && self.sandbox_id() == info.sandbox_id.as_deref()
    }

    fn has_key(&self, key: &ObjectKey) -> bool {
        *self.name == *key.name && *self.namespace == *key.namespace
    }

    pub(crate) fn key(&self) -> ObjectKey {
        ObjectKey::new(&*self.namespace, &*self.name)
    }

    pub(crate) fn to_info(&self) -> PodInfo {
        PodInfo {
            key: self.key(),
            uid: self.uid().map(str::to_string),
            node: self.node.as_deref().map(str::to_string),
            labels: self.labels.to_map(),
            ips: self.ips.to_vec(),
            named_ports: self.named_ports.to_vec(),
            sandbox_id: self.sandbox_id().map(str::to_string),
        }
    }

    /// Drops the record, letting the interner forget the strings only it used.
    pub(crate) fn release(self, interner: &mut Interner) {
        // Each reference is dropped right after its release, so that whichever holder of a
        // string (a namespace that is also a label value, say) goes last sees it unused.
        let CompactPod {
            namespace,
            node,
            labels,
            named_ports,
            ..
        } = self;
        interner.release(&namespace);
        drop(namespace);
        if let Some(node) = node {
            interner.release(&node);
        }
        release_labels(labels, interner);
        interner.release_ports(&named_ports);
    }
}

/// Drops a label set handle (the pod's, or a copy a caller took), letting the interner forget
/// the set when no record uses it any more.
pub(crate) fn release_labels(labels: Labels, interner: &mut Interner) {
    interner.release_labels(&labels);
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Interner {
        fn len(&self) -> usize {
            self.strings.len() + self.label_sets.len() + self.port_lists.len()
        }
    }

    #[test]
    fn a_string_used_twice_by_one_pod_is_released_with_it() {
        let mut interner = Interner::default();
        let mut info = pod("x", "a", &[("x", "x"), ("node-a", "y")]);
        info.labels.insert("z".into(), "x".into());
        CompactPod::new(info, &mut interner).release(&mut interner);
        assert_eq!(interner.len(), 0);
    }

    pub(super) fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            key: ObjectKey::new(ns, name),
            uid: Some("u-1".into()),
            node: Some("node-a".into()),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
            named_ports: vec![NamedPort {
                name: "http".into(),
                protocol: crate::model::Protocol::Tcp,
                port: 8080,
            }],
            sandbox_id: None,
        }
    }

    #[test]
    fn a_record_gives_back_the_pod_and_looks_labels_up() {
        let mut interner = Interner::default();
        let info = pod("x", "a", &[("app", "web"), ("tier", "front"), ("a", "")]);
        let record = CompactPod::new(info.clone(), &mut interner);
        assert!(record.same_as(&info));
        assert_eq!(record.to_info(), info);
        assert_eq!(record.labels.label("tier"), Some("front"));
        assert_eq!(record.labels.label("a"), Some(""));
        assert_eq!(record.labels.label("b"), None);
        let mut other = info.clone();
        other.labels.insert("tier".into(), "back".into());
        assert!(!record.same_as(&other));
        let mut other = info.clone();
        other.ips.pop();
        assert!(!record.same_as(&other));
    }

    #[test]
    fn replicas_share_one_label_set_and_one_port_list() {
        let mut interner = Interner::default();
        let a = CompactPod::new(pod("x", "a", &[("app", "web")]), &mut interner);
        let b = CompactPod::new(pod("x", "b", &[("app", "web")]), &mut interner);
        let c = CompactPod::new(pod("x", "c", &[("app", "db")]), &mut interner);
        assert!(Arc::ptr_eq(&a.labels.0, &b.labels.0));
        assert!(!Arc::ptr_eq(&a.labels.0, &c.labels.0));
        assert!(Arc::ptr_eq(&a.named_ports, &c.named_ports));
        // x, node-a; two label sets; one port list
        assert_eq!(interner.len(), 5);
        a.release(&mut interner);
        assert_eq!(interner.len(), 5, "b still uses app=web");
        b.release(&mut interner);
        assert_eq!(interner.len(), 4);
        assert_eq!(c.to_info(), pod("x", "c", &[("app", "db")]));
        c.release(&mut interner);
        assert_eq!(interner.len(), 0);
    }

    #[test]
    fn shared_strings_are_kept_until_their_last_user_is_released() {
        let mut interner = Interner::default();
        let a = CompactPod::new(pod("x", "a", &[("app", "web")]), &mut interner);
        let b = CompactPod::new(pod("x", "b", &[("app", "db")]), &mut interner);
        // x, node-a, app, web, db
        assert_eq!(interner.len(), 5);
        a.release(&mut interner);
        assert_eq!(interner.len(), 4, "only `web` was a's alone");
        b.release(&mut interner);
        assert_eq!(interner.len(), 0);
    }
}
