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

    /// How many objects are recorded as delivered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.delivered.len()
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
