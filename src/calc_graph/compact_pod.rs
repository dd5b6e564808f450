//! The calc graph's own record of a pod: what `PodInfo` says, in the least memory that keeps
//! lookups as fast. At 150k pods the graph holds every pod of the cluster, and the model's
//! `PodInfo` (a `BTreeMap` node per pod for its labels, a `String` per field) cost about
//! 1.4 KiB a pod; this record is a fraction of that.
//!
//! - Label keys and values, namespaces and node names repeat across pods: they are interned
//!   (`Interner`, owned by the set index) and shared as `Arc<str>`. A string is dropped from
//!   the interner when the last record using it lets go of it (`CompactPod::release`).
//! - Labels are a boxed slice of pairs sorted by key (the `BTreeMap`'s order), looked up by
//!   binary search; addresses and named ports are boxed slices (an empty one allocates
//!   nothing).
//!
//! Hand-written rather than an interning crate: what is needed is a `HashSet<Arc<str>>` and
//! the reference count Rust's `Arc` already keeps, and the release must follow the graph's
//! own removals.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::model::{LabelLookup, NamedPort, ObjectKey, PodInfo};

/// Strings shared by the pod records.
#[derive(Default)]
pub(crate) struct Interner {
    strings: HashSet<Arc<str>>,
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

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.strings.len()
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

/// A pod's labels, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Labels(Box<[(Arc<str>, Arc<str>)]>);

impl Labels {
    fn from_map(map: &BTreeMap<String, String>, interner: &mut Interner) -> Labels {
        Labels(
            map.iter()
                .map(|(k, v)| (interner.intern(k), interner.intern(v)))
                .collect(),
        )
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| &**k)
    }

    pub(crate) fn same_as(&self, map: &BTreeMap<String, String>) -> bool {
        self.0.len() == map.len()
            && self
                .iter()
                .zip(map)
                .all(|((k, v), (mk, mv))| k == mk && v == mv)
    }

    fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl LabelLookup for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }
}

/// A pod as the set index keeps it; `to_info` gives back the `PodInfo` it was made from.
#[derive(Debug)]
pub(crate) struct CompactPod {
    pub(crate) namespace: Arc<str>,
    name: Box<str>,
    uid: Option<Box<str>>,
    pub(crate) node: Option<Arc<str>>,
    pub(crate) labels: Labels,
    pub(crate) ips: Box<[IpAddr]>,
    pub(crate) named_ports: Box<[NamedPort]>,
    sandbox_id: Option<Box<str>>,
}

impl CompactPod {
    pub(crate) fn new(info: PodInfo, interner: &mut Interner) -> CompactPod {
        CompactPod {
            namespace: interner.intern(&info.key.namespace),
            name: info.key.name.into_boxed_str(),
            uid: info.uid.map(String::into_boxed_str),
            node: info.node.as_deref().map(|n| interner.intern(n)),
            labels: Labels::from_map(&info.labels, interner),
            ips: info.ips.into_boxed_slice(),
            named_ports: info.named_ports.into_boxed_slice(),
            sandbox_id: info.sandbox_id.map(String::into_boxed_str),
        }
    }

    /// Whether this record says exactly what `info` says.
    pub(crate) fn same_as(&self, info: &PodInfo) -> bool {
        *self.namespace == *info.key.namespace
            && *self.name == *info.key.name
            && self.uid.as_deref() == info.uid.as_deref()
            && self.node.as_deref() == info.node.as_deref()
            && self.labels.same_as(&info.labels)
            && *self.ips == *info.ips
            && *self.named_ports == *info.named_ports
            && self.sandbox_id.as_deref() == info.sandbox_id.as_deref()
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
            uid: self.uid.as_deref().map(str::to_string),
            node: self.node.as_deref().map(str::to_string),
            labels: self.labels.to_map(),
            ips: self.ips.to_vec(),
            named_ports: self.named_ports.to_vec(),
            sandbox_id: self.sandbox_id.as_deref().map(str::to_string),
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
            ..
        } = self;
        interner.release(&namespace);
        drop(namespace);
        if let Some(node) = node {
            interner.release(&node);
        }
        release_labels(labels, interner);
    }
}

/// Drops a label set (the pod's, or a copy a caller took), releasing its strings.
pub(crate) fn release_labels(labels: Labels, interner: &mut Interner) {
    for (k, v) in Vec::from(labels.0) {
        interner.release(&k);
        drop(k);
        interner.release(&v);
    }
}

#[cfg(test)]
#[test]
fn a_string_used_twice_by_one_pod_is_released_with_it() {
    let mut interner = Interner::default();
    let mut info = tests::pod("x", "a", &[("x", "x"), ("node-a", "y")]);
    info.labels.insert("z".into(), "x".into());
    CompactPod::new(info, &mut interner).release(&mut interner);
    assert_eq!(interner.len(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

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
