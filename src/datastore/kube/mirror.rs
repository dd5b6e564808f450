//! What the watchers have delivered, per kind: a fingerprint of each trimmed object, so a
//! relist delivers only what changed and removes only what is gone once the listing is
//! complete (never a transient removal), and an unchanged re-delivery is dropped.

use super::*;

/// What was delivered of one kind: per object (by key) the fingerprint of its trimmed form
/// and the listing it was last seen in; and the listing in progress.
pub(super) struct Mirror<K: Kind> {
    delivered: HashMap<Box<str>, Delivered>,
    /// Bumped when a listing starts; the objects it lists are stamped with it.
    epoch: u32,
    /// A listing has started and not ended.
    relisting: bool,
    /// The first complete listing has been delivered.
    listed: bool,
    /// This listing's objects so far, and how many of them were delivered (for the log).
    seen: usize,
    changed: usize,
    seed: RandomState,
    kind: PhantomData<fn() -> K>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Delivered {
    fingerprint: u64,
    epoch: u32,
}

impl<K: Kind> Default for Mirror<K> {
    fn default() -> Self {
        Mirror {
            delivered: HashMap::new(),
            epoch: 0,
            relisting: false,
            listed: false,
            seen: 0,
            changed: 0,
            seed: RandomState::new(),
            kind: PhantomData,
        }
    }
}

/// Feeds a JSON encoding straight into a hasher (no buffer).
pub(super) struct HashWriter<'a, H: Hasher>(&'a mut H);

impl<H: Hasher> std::io::Write for HashWriter<'_, H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<K: Kind> Mirror<K> {
    /// The fingerprint of a trimmed object: its JSON encoding (deterministic: maps are
    /// sorted), hashed with this mirror's seed.
    pub(super) fn fingerprint(&self, obj: &K) -> u64 {
        let mut hasher = self.seed.build_hasher();
        if let Err(err) = serde_json::to_writer(HashWriter(&mut hasher), obj) {
            // Not seen with Kubernetes objects; an object that cannot be encoded counts
            // as changed every time rather than never.
            warn!(
                kind = K::KIND.as_str(),
                "cannot fingerprint an object: {err}"
            );
            hasher.write_u64(self.seed.hash_one(std::time::Instant::now()));
        }
        hasher.finish()
    }

    /// Applies one (trimmed) watcher event; returns the datastore events to deliver, and
    /// whether this completed the first listing of the kind.
    pub(super) fn apply(&mut self, event: watcher::Event<K>) -> (Vec<DatastoreEvent>, bool) {
        match event {
            watcher::Event::Apply(obj) => (self.upsert(obj).into_iter().collect(), false),
            watcher::Event::InitApply(obj) => {
                if !self.relisting {
                    self.start_listing();
                }
                self.seen += 1;
                let event = self.upsert(obj);
                self.changed += usize::from(event.is_some());
                (event.into_iter().collect(), false)
            }
            watcher::Event::Delete(obj) => {
                let object = obj.datastore_ref();
                match self.delivered.remove(object.key.as_str()) {
                    Some(_) => (vec![DatastoreEvent::Delete(object)], false),
                    None => (Vec::new(), false),
                }
            }
            watcher::Event::Init => {
                // A listing interrupted half way is started over: what it stamped is stale.
                self.start_listing();
                (Vec::new(), false)
            }
            watcher::Event::InitDone => {
                if !self.relisting {
                    // An empty listing without its `Init`.
                    self.start_listing();
                }
                self.relisting = false;
                let first_listing = !self.listed;
                self.listed = true;
                let epoch = self.epoch;
                let mut gone: Vec<Box<str>> = self
                    .delivered
                    .iter()
                    .filter(|(_, d)| d.epoch != epoch)
                    .map(|(key, _)| key.clone())
                    .collect();
                gone.sort();
                info!(
                    kind = K::KIND.as_str(),
                    listed = self.seen,
                    changed = self.changed,
                    gone = gone.len(),
                    "listed"
                );
                // Every upsert of this listing is out already: deletions come last, so
                // nothing is missing in between, even when an object was replaced by another
                // one with a new name.
                let events = gone
                    .into_iter()
                    .map(|key| {
                        self.delivered.remove(&key);
                        DatastoreEvent::Delete(ObjectRef {
                            kind: K::KIND,
                            key: key.into(),
                        })
                    })
                    .collect();
                if self.delivered.capacity() > 2 * self.delivered.len() + 64 {
                    self.delivered.shrink_to_fit();
                }
                (events, first_listing)
            }
        }
    }

    pub(super) fn start_listing(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.relisting = true;
        self.seen = 0;
        self.changed = 0;
    }

    /// Records `obj` as seen in the current epoch; the upsert to deliver if its trimmed form
    /// differs from what was delivered.
    pub(super) fn upsert(&mut self, obj: K) -> Option<DatastoreEvent> {
        let fingerprint = self.fingerprint(&obj);
        let key = obj.datastore_ref().key;
        let epoch = self.epoch;
        match self.delivered.get_mut(key.as_str()) {
            Some(d) if d.fingerprint == fingerprint => {
                d.epoch = epoch;
                None
            }
            Some(d) => {
                *d = Delivered { fingerprint, epoch };
                Some(upsert(obj))
            }
            None => {
                self.delivered
                    .insert(key.into(), Delivered { fingerprint, epoch });
                Some(upsert(obj))
            }
        }
    }
}

pub(super) fn upsert<K: Kind>(obj: K) -> DatastoreEvent {
    DatastoreEvent::Upsert(Box::new(obj.into_object()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    impl<K: Kind> Mirror<K> {
        /// How many objects are recorded as delivered.
        fn len(&self) -> usize {
            self.delivered.len()
        }
    }

    fn ns(name: &str, team: &str, rv: &str) -> Namespace {
        let mut ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"team": team}, "resourceVersion": rv,
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]}
        }))
        .unwrap();
        ns.trim();
        ns
    }

    fn summary(events: &[DatastoreEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                DatastoreEvent::Upsert(o) => format!("upsert {}", o.object_ref().key),
                DatastoreEvent::Delete(r) => format!("delete {}", r.key),
                DatastoreEvent::InSync => "in sync".into(),
                DatastoreEvent::Access { kind, refused } => {
                    format!("access {} {}", kind.as_str(), refused.is_some())
                }
            })
            .collect()
    }

    /// Feeds a sequence of watcher events; returns the delivered events and how many of the
    /// steps completed a first listing.
    fn run(
        mirror: &mut Mirror<Namespace>,
        events: Vec<watcher::Event<Namespace>>,
    ) -> (Vec<String>, usize) {
        let mut out = Vec::new();
        let mut firsts = 0;
        for e in events {
            let (events, first) = mirror.apply(e);
            out.extend(summary(&events));
            firsts += usize::from(first);
        }
        (out, firsts)
    }

    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    #[test]
    fn relists_deliver_only_differences_upserts_first() {
        let mut m = Mirror::<Namespace>::default();
        let (out, firsts) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "1")),
                InitApply(ns("b", "x", "2")),
                InitDone,
            ],
        );
        assert_eq!(out, ["upsert a", "upsert b"]);
        assert_eq!(firsts, 1);

        // The same objects (new resourceVersions): nothing, and no second first listing.
        let (out, firsts) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("b", "x", "7")),
                InitApply(ns("a", "x", "8")),
                InitDone,
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(firsts, 0);

        // b changed, a vanished, c is new: the changes as they are listed, the deletion only
        // at InitDone.
        let mut m2 = m;
        let (out, _) = run(
            &mut m2,
            vec![
                Init,
                InitApply(ns("b", "y", "9")),
                InitApply(ns("c", "x", "9")),
            ],
        );
        assert_eq!(out, ["upsert b", "upsert c"]);
        let (out, firsts) = run(&mut m2, vec![InitDone]);
        assert_eq!(out, ["delete a"]);
        assert_eq!(firsts, 0);
        assert_eq!(m2.len(), 2);
    }

    #[test]
    fn an_interrupted_relist_starts_over() {
        let mut m = Mirror::<Namespace>::default();
        run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "1")),
                InitApply(ns("b", "x", "1")),
                InitDone,
            ],
        );
        // A first attempt lists both unchanged and then fails; the second no longer lists b
        // (deleted meanwhile): b goes at the second attempt's end, not before.
        let (out, _) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "2")),
                InitApply(ns("b", "x", "2")),
                Init,
                InitApply(ns("a", "x", "3")),
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        let (out, _) = run(&mut m, vec![InitDone]);
        assert_eq!(out, ["delete b"]);

        // An object first seen by an attempt that failed, and gone by the next attempt: it was
        // delivered, so it is deleted at the end (nothing stays that the server lacks).
        let (out, _) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "4")),
                InitApply(ns("new", "x", "4")),
                Init,
                InitApply(ns("a", "x", "5")),
                InitDone,
            ],
        );
        assert_eq!(out, ["upsert new", "delete new"]);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn watch_events_deliver_changes_only() {
        let mut m = Mirror::<Namespace>::default();
        run(&mut m, vec![Init, InitDone]);
        let (out, _) = run(
            &mut m,
            vec![
                Apply(ns("a", "x", "1")),
                Apply(ns("a", "x", "2")), // only the resourceVersion: no event
                Apply(ns("a", "y", "3")),
                Delete(ns("zz", "x", "4")), // never delivered: no event
                Delete(ns("a", "y", "5")),
            ],
        );
        assert_eq!(out, ["upsert a", "upsert a", "delete a"]);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn objects_changed_by_watch_events_survive_the_next_relist_unchanged() {
        let mut m = Mirror::<Namespace>::default();
        run(&mut m, vec![Init, InitApply(ns("a", "x", "1")), InitDone]);
        let (out, _) = run(
            &mut m,
            vec![Apply(ns("b", "x", "2")), Apply(ns("a", "y", "3"))],
        );
        assert_eq!(out, ["upsert b", "upsert a"]);
        // The relist finds what the watch delivered: nothing to say.
        let (out, _) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "y", "4")),
                InitApply(ns("b", "x", "4")),
                InitDone,
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        // An empty listing (a resource gone) deletes everything, in key order.
        let (out, _) = run(&mut m, vec![Init, InitDone]);
        assert_eq!(out, ["delete a", "delete b"]);
    }

    #[test]
    fn fingerprints_see_every_trimmed_field_and_no_trimmed_away_one() {
        let m = Mirror::<Pod>::default();
        let pod = |labels: serde_json::Value, ip: &str, restarts: u32| -> Pod {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "n", "labels": labels, "uid": "u1",
                             "resourceVersion": restarts.to_string()},
                "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i",
                         "ports": [{"name": "http", "containerPort": 80}]}]},
                "status": {"phase": "Running", "podIP": ip,
                           "containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                               "ready": true, "restartCount": restarts}]}
            }))
            .unwrap();
            pod.trim();
            pod
        };
        let base = m.fingerprint(&pod(json!({"app": "a"}), "10.0.0.1", 0));
        assert_eq!(
            base,
            m.fingerprint(&pod(json!({"app": "a"}), "10.0.0.1", 7))
        );
        assert_ne!(
            base,
            m.fingerprint(&pod(json!({"app": "b"}), "10.0.0.1", 0))
        );
        assert_ne!(
            base,
            m.fingerprint(&pod(json!({"app": "a"}), "10.0.0.2", 0))
        );
        // Another mirror (another process) has another seed.
        let other = Mirror::<Pod>::default();
        assert_ne!(
            base,
            other.fingerprint(&pod(json!({"app": "a"}), "10.0.0.1", 0))
        );
    }
}
