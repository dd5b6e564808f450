//! The rejections calculator: which objects (and local pods' interfaces) are not enforced as
//! written, and why, plus how many rejections there have been.
//!
//! Owns: the current rejection per object, and the running counts by kind and reason.
//! Invariants: an object has at most one current rejection (the latest); accepting an object
//! clears it, while the counts only ever grow (each rejected upsert counts once, for the
//! metrics). It feeds nothing else in the graph: a rejection changes no chain by itself.

use std::collections::BTreeMap;

use tracing::{debug, error};

use crate::model::validate;
use crate::model::{ObjectKey, ObjectKind};

use super::RejectKind;

#[derive(Default)]
pub(super) struct Rejections {
    rejected: BTreeMap<(ObjectKind, String), (RejectKind, String)>,
    counts: BTreeMap<(ObjectKind, RejectKind), u64>,
}

impl Rejections {
    /// Records (and logs) why an object is not enforced as written.
    pub(super) fn reject(
        &mut self,
        kind: ObjectKind,
        key: String,
        why: RejectKind,
        message: String,
    ) {
        // The key of a rejected object may hold anything (a newline, megabytes).
        let object = validate::shown_name(&key);
        match why {
            RejectKind::Invalid => {
                error!(kind = kind.as_str(), object = %object, "rejected: {message}")
            }
            // A new pod lacks its interface for a moment (the CNI is still wiring it, the
            // bridge has not learned its port): the agent warns once the grace period has
            // passed (`agent::unnamed`), so this is not a warning.
            RejectKind::Interface => {
                debug!(kind = kind.as_str(), object = %object, "no interface yet: {message}")
            }
        }
        *self.counts.entry((kind, why.clone())).or_default() += 1;
        self.rejected.insert((kind, key), (why, message));
    }

    /// The object is enforced as written again (or is gone).
    pub(super) fn accept(&mut self, kind: ObjectKind, key: &str) {
        self.rejected.remove(&(kind, key.to_string()));
    }

    pub(super) fn current(&self) -> &BTreeMap<(ObjectKind, String), (RejectKind, String)> {
        &self.rejected
    }

    pub(super) fn counts(&self) -> &BTreeMap<(ObjectKind, RejectKind), u64> {
        &self.counts
    }

    /// The local pods rejected because their interface could not be named.
    pub(super) fn unnamed_pods(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.rejected
            .iter()
            .filter(|((kind, _), (why, _))| {
                *kind == ObjectKind::Pod && *why == RejectKind::Interface
            })
            .filter_map(|((_, key), _)| {
                let (namespace, name) = key.split_once('/')?;
                Some(ObjectKey::new(namespace, name))
            })
    }
}
