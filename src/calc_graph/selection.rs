//! The model-level updates: namespaces, pods and policies into the graph's indexes, which
//! policies select which local endpoints (and the other way round), which sets each owner
//! references, and which interface each local endpoint claims; everything they change is
//! marked dirty for the next flush.

use super::*;

impl CalcGraph {
    pub fn upsert_namespace_info(&mut self, info: NamespaceInfo) {
        let name = info.name.clone();
        let before = self.sets.namespace_labels(&name);
        self.sets.upsert_namespace(info);
        if self.sets.namespace_labels(&name) != before {
            self.reselect_cluster_namespace(&name);
        }
    }

    pub fn upsert_pod_info(&mut self, mut info: PodInfo) {
        let key = info.key.clone();
        let local = self.is_local(info.node.as_deref());
        if !local {
            // Only a local pod is named (its uid and sandbox lead to its interface); at 150k
            // pods these strings of remote ones were some 5 MiB nobody reads.
            info.uid = None;
            info.sandbox_id = None;
        }
        let labels_changed = self
            .sets
            .pod(&key)
            .is_none_or(|old| !old.labels.same_as(&info.labels));
        // A local pod's addresses are in its source check, and bridge mode dispatches routed
        // traffic by them.
        if local && self.sets.pod(&key).is_some_and(|old| *old.ips != *info.ips) {
            if self.endpoints.contains_key(&key) {
                self.dirty.mark(Owner::Endpoint(key.clone()));
            }
            if self.cfg.rules.bridge.is_some() {
                self.dirty.mark(Owner::Dispatch);
            }
        }
        self.note_pod_families(&key, if local { &info.ips } else { &[] });
        self.sets.upsert_pod(info);
        if !local {
            self.to_name.remove(&key);
            self.mark_unnamed(&key, false);
            self.remove_endpoint(&key);
            return;
        }
        // Named (again) by the caller before the next flush; the endpoint keeps its interface
        // until then.
        self.to_name.insert(key.clone());
        if labels_changed && self.endpoints.contains_key(&key) {
            self.reselect_policies(&key);
            self.reselect_cluster_policies(&key);
        }
    }

    pub(super) fn claim_iface(&mut self, iface: &str, key: &ObjectKey) {
        let claims = self.iface_claims.entry(iface.to_string()).or_default();
        claims.insert(key.clone());
        if claims.len() > 1 {
            error!(
                interface = iface,
                pods = ?claims.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "several local pods resolve to one interface; only the first gets its policy, check the interface-naming scheme"
            );
            // The winner may have changed (and with it, in bridge mode, the addresses the
            // interface is dispatched by).
            for k in claims.iter() {
                self.dirty.mark(Owner::Endpoint(k.clone()));
            }
            self.dirty.mark(Owner::Dispatch);
        }
    }

    pub(super) fn release_iface(&mut self, iface: &str, key: &ObjectKey) {
        if let Some(claims) = self.iface_claims.get_mut(iface) {
            claims.remove(key);
            for k in claims.iter() {
                self.dirty.mark(Owner::Endpoint(k.clone()));
            }
            self.dirty.mark(Owner::Dispatch);
            if claims.is_empty() {
                self.iface_claims.remove(iface);
            }
        }
    }

    pub(super) fn remove_endpoint(&mut self, key: &ObjectKey) {
        let Some(ep) = self.endpoints.remove(key) else {
            return;
        };
        self.release_iface(&ep.iface, key);
        if let Some(in_ns) = self.endpoints_by_ns.get_mut(&key.namespace) {
            in_ns.remove(key);
            if in_ns.is_empty() {
                self.endpoints_by_ns.remove(&key.namespace);
                self.dirty.mark(Owner::Profile(key.namespace.clone()));
            }
        }
        for policy in ep.policies {
            self.set_selection(&policy, key, false);
        }
        for policy in ep.cluster_policies {
            self.set_cluster_selection(&policy, key, false);
        }
        self.dirty.mark(Owner::Endpoint(key.clone()));
        self.dirty.mark(Owner::Dispatch);
    }

    /// Re-evaluates which policies of its namespace select a local endpoint.
    pub(super) fn reselect_policies(&mut self, key: &ObjectKey) {
        let Some(labels) = self.sets.pod(key).map(|p| p.labels.clone()) else {
            return;
        };
        let candidates: Vec<ObjectKey> = self
            .policies_by_ns
            .get(&key.namespace)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for policy in candidates {
            let selects = self
                .policies
                .get(&policy)
                .is_some_and(|p| p.info.pod_selector.matches(&labels));
            self.set_selection(&policy, key, selects);
        }
    }

    /// Records whether `policy` selects endpoint `ep`, activating or retiring the policy when
    /// that changes whether it selects anything.
    pub(super) fn set_selection(&mut self, policy: &ObjectKey, ep: &ObjectKey, selects: bool) {
        let Some(entry) = self.policies.get_mut(policy) else {
            return;
        };
        let was_active = !entry.selects.is_empty();
        let changed = if selects {
            entry.selects.insert(ep.clone())
        } else {
            entry.selects.remove(ep)
        };
        if !changed {
            return;
        }
        let is_active = !entry.selects.is_empty();
        if let Some(e) = self.endpoints.get_mut(ep) {
            if selects {
                e.policies.insert(policy.clone());
            } else {
                e.policies.remove(policy);
            }
        }
        self.dirty.mark(Owner::Endpoint(ep.clone()));
        if was_active != is_active {
            let defs = entry.plan.set_defs();
            for def in &defs {
                if is_active {
                    self.sets.acquire(def);
                } else {
                    self.sets.release(def);
                }
            }
            self.dirty.mark(Owner::Policy(policy.clone()));
        }
    }

    pub fn upsert_policy_info(&mut self, info: PolicyInfo) {
        let key = info.key.clone();
        if self.policies.get(&key).is_some_and(|p| p.info == info) {
            return;
        }
        let new_plan = plan_policy(&info);
        let selects: BTreeSet<ObjectKey> = self
            .endpoints_by_ns
            .get(&key.namespace)
            .into_iter()
            .flatten()
            .filter(|ep| {
                self.sets
                    .pod(ep)
                    .is_some_and(|p| info.pod_selector.matches(&p.labels))
            })
            .cloned()
            .collect();
        let old = self.policies.remove(&key);
        let (old_defs, old_selects) = old
            .as_ref()
            .map(|o| {
                (
                    active_set_defs(&o.selects, o.plan.set_defs()),
                    o.selects.clone(),
                )
            })
            .unwrap_or_default();
        self.move_set_references(active_set_defs(&selects, new_plan.set_defs()), old_defs);
        // Re-rendered even when still selected: the directions it governs may differ.
        self.reselect_endpoints(&old_selects, &selects, |e, selected| {
            if selected {
                e.policies.insert(key.clone());
            } else {
                e.policies.remove(&key);
            }
        });
        self.policies_by_ns
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.clone());
        self.dirty.mark(Owner::Policy(key.clone()));
        self.policies.insert(
            key,
            PolicyEntry {
                info,
                plan: new_plan,
                selects,
            },
        );
    }

    /// Moves a policy's set references from its old version to its new one: the new ones are
    /// taken first, so sets both versions use are not churned.
    pub(super) fn move_set_references(&mut self, acquire: Vec<SetDef>, release: Vec<SetDef>) {
        for def in &acquire {
            self.sets.acquire(def);
        }
        for def in &release {
            self.sets.release(def);
        }
    }

    /// Tells each endpoint selected before or now whether it is selected now (`update`), and
    /// marks it for rendering either way.
    pub(super) fn reselect_endpoints(
        &mut self,
        before: &BTreeSet<ObjectKey>,
        now: &BTreeSet<ObjectKey>,
        mut update: impl FnMut(&mut Endpoint, bool),
    ) {
        for ep in before.union(now) {
            if let Some(e) = self.endpoints.get_mut(ep) {
                update(e, now.contains(ep));
            }
            self.dirty.mark(Owner::Endpoint(ep.clone()));
        }
    }
}
