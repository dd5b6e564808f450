//! The interfaces calculator: which local pods the caller must name, which it could not, and
//! which pod owns each interface name.
//!
//! Owns: the interface claims (name → claiming local endpoints), the pods waiting to be named
//! (`take_pods_to_name`), and the pods the caller could not name (the guard's input).
//! Invariants: an interface is claimed by every local endpoint named to it, and its owner (the
//! one that gets chains) is the first claimant by key, so the winner does not depend on event
//! order; a claim set is never empty (the name is dropped with its last claimant). When a
//! claim can change who owns a name, the effects name every claimant and the dispatch chains
//! for re-rendering.

use std::collections::{BTreeSet, HashMap};

use tracing::error;

use crate::model::ObjectKey;

use super::{Effects, Owner};

#[derive(Default)]
pub(super) struct Interfaces {
    claims: HashMap<String, BTreeSet<ObjectKey>>,
    /// Local pods upserted since the last `take_pods_to_name`.
    to_name: BTreeSet<ObjectKey>,
    /// Local pods the caller could not name (`set_interface` with an error).
    unnamed: BTreeSet<ObjectKey>,
}

impl Interfaces {
    pub(super) fn claim(&mut self, iface: &str, key: &ObjectKey) -> Effects {
        let mut fx = Effects::default();
        let claims = self.claims.entry(iface.to_string()).or_default();
        claims.insert(key.clone());
        if claims.len() > 1 {
            error!(
                interface = iface,
                pods = ?claims.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "several local pods resolve to one interface; only the first gets its policy, check the interface-naming scheme"
            );
            // The winner may have changed (and with it, in bridge mode, the addresses the
            // interface is dispatched by).
            fx.owners
                .extend(claims.iter().map(|k| Owner::Endpoint(k.clone())));
            fx.owners.push(Owner::Dispatch);
        }
        fx
    }

    pub(super) fn release(&mut self, iface: &str, key: &ObjectKey) -> Effects {
        let mut fx = Effects::default();
        if let Some(claims) = self.claims.get_mut(iface) {
            claims.remove(key);
            fx.owners
                .extend(claims.iter().map(|k| Owner::Endpoint(k.clone())));
            fx.owners.push(Owner::Dispatch);
            if claims.is_empty() {
                self.claims.remove(iface);
            }
        }
        fx
    }

    /// Whether `key` owns `iface` (and so gets chains for it).
    pub(super) fn owns(&self, iface: &str, key: &ObjectKey) -> bool {
        self.owner(iface) == Some(key)
    }

    pub(super) fn owner(&self, iface: &str) -> Option<&ObjectKey> {
        self.claims.get(iface).and_then(|claims| claims.first())
    }

    /// Every claimed interface name with its owner (no order).
    pub(super) fn owners(&self) -> impl Iterator<Item = (&String, &ObjectKey)> {
        self.claims
            .iter()
            .filter_map(|(iface, claims)| Some((iface, claims.first()?)))
    }

    /// Every claimed interface name (no order).
    pub(super) fn names(&self) -> Vec<String> {
        self.claims.keys().cloned().collect()
    }

    /// A local pod to be named (again) by the caller before the next flush, or no longer
    /// (`false`: it left the node or is gone).
    pub(super) fn set_to_name(&mut self, key: &ObjectKey, wanted: bool) {
        if wanted {
            self.to_name.insert(key.clone());
        } else {
            self.to_name.remove(key);
        }
    }

    pub(super) fn take_to_name(&mut self) -> BTreeSet<ObjectKey> {
        std::mem::take(&mut self.to_name)
    }

    /// A local pod the caller could not name (`true`), or one that was named or left.
    pub(super) fn set_unnamed(&mut self, key: &ObjectKey, unnamed: bool) {
        if unnamed {
            self.unnamed.insert(key.clone());
        } else {
            self.unnamed.remove(key);
        }
    }

    pub(super) fn unnamed(&self) -> &BTreeSet<ObjectKey> {
        &self.unnamed
    }
}
