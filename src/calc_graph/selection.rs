//! The selection calculator: the local endpoints, the policies, and which active policies
//! select which endpoints (NetworkPolicies here; ClusterNetworkPolicies in `cluster`).
//!
//! Owns: the NetworkPolicies (by key and by namespace), the ClusterNetworkPolicies, and the
//! local endpoints (a local pod named to an interface; by key and by namespace), each with the
//! policies selecting it.
//! Invariants: a policy is *active* iff it selects at least one local endpoint; only an active
//! policy holds references on its sets, so each change of activity comes out as acquires or
//! releases in `Effects::set_refs`, in the order they must be applied. The selection is kept
//! both ways (policy → endpoints and endpoint → policies) and the two always agree. Every
//! endpoint whose selection changed, every policy whose chains may differ, and every namespace
//! gaining its first or losing its last endpoint (its profile chains) comes out in the effects.
//! It reads pods' and namespaces' labels from the set index but never changes it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::model::{ClusterPolicyInfo, ObjectKey, PolicyInfo};
use crate::rules::cluster::ClusterPolicyPlan;
use crate::rules::policy::{plan_policy, PolicyPlan};
use crate::rules::sets::SetDef;

use super::set_index::SetIndex;
use super::{Effects, Owner};

pub(super) struct Endpoint {
    pub(super) iface: String,
    /// Active policies selecting this pod (any direction).
    pub(super) policies: BTreeSet<ObjectKey>,
    /// ClusterNetworkPolicies whose subject selects this pod (any tier and direction).
    pub(super) cluster_policies: BTreeSet<String>,
}

pub(super) struct PolicyEntry {
    pub(super) info: PolicyInfo,
    pub(super) plan: PolicyPlan,
    /// Local endpoints the policy selects; non-empty means active.
    pub(super) selects: BTreeSet<ObjectKey>,
}

/// A ClusterNetworkPolicy's entry; its selection is kept by `cluster.rs`, this calculator's
/// ClusterNetworkPolicy half.
pub(super) struct ClusterEntry {
    pub(super) info: ClusterPolicyInfo,
    pub(super) plan: ClusterPolicyPlan,
    /// Local endpoints the subject selects; non-empty means active.
    pub(super) selects: BTreeSet<ObjectKey>,
}

#[derive(Default)]
pub(super) struct Selection {
    policies: HashMap<ObjectKey, PolicyEntry>,
    policies_by_ns: HashMap<String, BTreeSet<ObjectKey>>,
    /// Read and written by the ClusterNetworkPolicy half (`cluster`).
    pub(super) cluster_policies: HashMap<String, ClusterEntry>,
    pub(super) endpoints: BTreeMap<ObjectKey, Endpoint>,
    endpoints_by_ns: HashMap<String, BTreeSet<ObjectKey>>,
}

/// A policy version's sets, which it holds only while it selects an endpoint.
pub(super) fn active_set_defs(selects: &BTreeSet<ObjectKey>, defs: Vec<SetDef>) -> Vec<SetDef> {
    if selects.is_empty() {
        Vec::new()
    } else {
        defs
    }
}

impl Selection {
    /// A local pod was named to `iface` and becomes an endpoint: the policies that select it
    /// are found. The caller has checked it is not one already.
    pub(super) fn add_endpoint(
        &mut self,
        key: &ObjectKey,
        iface: String,
        sets: &SetIndex,
    ) -> Effects {
        let mut fx = Effects::default();
        self.endpoints.insert(
            key.clone(),
            Endpoint {
                iface,
                policies: BTreeSet::new(),
                cluster_policies: BTreeSet::new(),
            },
        );
        let in_ns = self
            .endpoints_by_ns
            .entry(key.namespace.clone())
            .or_default();
        in_ns.insert(key.clone());
        if in_ns.len() == 1 {
            fx.owners.push(Owner::Profile(key.namespace.clone()));
        }
        fx.owners.push(Owner::Endpoint(key.clone()));
        fx.owners.push(Owner::Dispatch);
        self.reselect_policies(key, sets, &mut fx);
        self.reselect_cluster_policies(key, sets, &mut fx);
        fx
    }

    /// An endpoint's new interface name; returns the old one (the selection does not change).
    pub(super) fn rename_endpoint(&mut self, key: &ObjectKey, iface: String) -> Option<String> {
        let ep = self.endpoints.get_mut(key)?;
        (ep.iface != iface).then(|| std::mem::replace(&mut ep.iface, iface))
    }

    /// A local endpoint is gone (the pod, its locality or its name): it leaves every policy
    /// selecting it. Returns the interface it had claimed.
    pub(super) fn remove_endpoint(&mut self, key: &ObjectKey) -> Option<(String, Effects)> {
        let ep = self.endpoints.remove(key)?;
        let mut fx = Effects::default();
        if let Some(in_ns) = self.endpoints_by_ns.get_mut(&key.namespace) {
            in_ns.remove(key);
            if in_ns.is_empty() {
                self.endpoints_by_ns.remove(&key.namespace);
                fx.owners.push(Owner::Profile(key.namespace.clone()));
            }
        }
        for policy in ep.policies {
            self.set_selection(&policy, key, false, &mut fx);
        }
        for policy in ep.cluster_policies {
            self.set_cluster_selection(&policy, key, false, &mut fx);
        }
        fx.owners.push(Owner::Endpoint(key.clone()));
        fx.owners.push(Owner::Dispatch);
        Some((ep.iface, fx))
    }

    /// A local pod's labels changed: re-evaluates which policies select it (nothing unless it
    /// is an endpoint).
    pub(super) fn relabel_endpoint(&mut self, key: &ObjectKey, sets: &SetIndex) -> Effects {
        let mut fx = Effects::default();
        if self.endpoints.contains_key(key) {
            self.reselect_policies(key, sets, &mut fx);
            self.reselect_cluster_policies(key, sets, &mut fx);
        }
        fx
    }

    pub(super) fn endpoint(&self, key: &ObjectKey) -> Option<&Endpoint> {
        self.endpoints.get(key)
    }

    /// The local endpoints, in key order.
    pub(super) fn endpoints(&self) -> &BTreeMap<ObjectKey, Endpoint> {
        &self.endpoints
    }

    pub(super) fn policy(&self, key: &ObjectKey) -> Option<&PolicyEntry> {
        self.policies.get(key)
    }

    pub(super) fn cluster_policy(&self, name: &str) -> Option<&ClusterEntry> {
        self.cluster_policies.get(name)
    }

    pub(super) fn is_endpoint(&self, key: &ObjectKey) -> bool {
        self.endpoints.contains_key(key)
    }

    pub(super) fn has_endpoints_in(&self, namespace: &str) -> bool {
        self.endpoints_by_ns.contains_key(namespace)
    }

    pub(super) fn namespaces_with_endpoints(&self) -> impl Iterator<Item = &String> {
        self.endpoints_by_ns.keys()
    }

    pub(super) fn endpoints_in(&self, namespace: &str) -> impl Iterator<Item = &ObjectKey> {
        self.endpoints_by_ns.get(namespace).into_iter().flatten()
    }

    /// Re-evaluates which policies of its namespace select a local endpoint.
    fn reselect_policies(&mut self, key: &ObjectKey, sets: &SetIndex, fx: &mut Effects) {
        let Some(labels) = sets.pod(key).map(|p| p.labels.clone()) else {
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
            self.set_selection(&policy, key, selects, fx);
        }
    }

    /// Records whether `policy` selects endpoint `ep`, activating or retiring the policy when
    /// that changes whether it selects anything.
    fn set_selection(
        &mut self,
        policy: &ObjectKey,
        ep: &ObjectKey,
        selects: bool,
        fx: &mut Effects,
    ) {
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
        fx.owners.push(Owner::Endpoint(ep.clone()));
        if was_active != is_active {
            fx.set_refs
                .extend(entry.plan.set_defs().into_iter().map(|d| (is_active, d)));
            fx.owners.push(Owner::Policy(policy.clone()));
        }
    }

    pub(super) fn upsert_policy(&mut self, info: PolicyInfo, sets: &SetIndex) -> Effects {
        let mut fx = Effects::default();
        let key = info.key.clone();
        if self.policies.get(&key).is_some_and(|p| p.info == info) {
            return fx;
        }
        let new_plan = plan_policy(&info);
        let selects: BTreeSet<ObjectKey> = self
            .endpoints_by_ns
            .get(&key.namespace)
            .into_iter()
            .flatten()
            .filter(|ep| {
                sets.pod(ep)
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
        fx.move_set_references(active_set_defs(&selects, new_plan.set_defs()), old_defs);
        // Re-rendered even when still selected: the directions it governs may differ.
        self.reselect_endpoints(&old_selects, &selects, &mut fx, |e, selected| {
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
        fx.owners.push(Owner::Policy(key.clone()));
        self.policies.insert(
            key,
            PolicyEntry {
                info,
                plan: new_plan,
                selects,
            },
        );
        fx
    }

    pub(super) fn remove_policy(&mut self, key: &ObjectKey) -> Effects {
        let mut fx = Effects::default();
        let Some(entry) = self.policies.remove(key) else {
            return fx;
        };
        if let Some(keys) = self.policies_by_ns.get_mut(&key.namespace) {
            keys.remove(key);
            if keys.is_empty() {
                self.policies_by_ns.remove(&key.namespace);
            }
        }
        for ep in &entry.selects {
            if let Some(e) = self.endpoints.get_mut(ep) {
                e.policies.remove(key);
            }
            fx.owners.push(Owner::Endpoint(ep.clone()));
        }
        if !entry.selects.is_empty() {
            fx.set_refs
                .extend(entry.plan.set_defs().into_iter().map(|d| (false, d)));
        }
        fx.owners.push(Owner::Policy(key.clone()));
        fx
    }

    /// Tells each endpoint selected before or now whether it is selected now (`update`), and
    /// marks it for rendering either way.
    pub(super) fn reselect_endpoints(
        &mut self,
        before: &BTreeSet<ObjectKey>,
        now: &BTreeSet<ObjectKey>,
        fx: &mut Effects,
        mut update: impl FnMut(&mut Endpoint, bool),
    ) {
        for ep in before.union(now) {
            if let Some(e) = self.endpoints.get_mut(ep) {
                update(e, now.contains(ep));
            }
            fx.owners.push(Owner::Endpoint(ep.clone()));
        }
    }

    /// The active policies selecting `ep`, per direction they govern (in key order): the
    /// policies its `cali-tw-`/`cali-fw-` chains jump to, so the ones isolating it there.
    pub(super) fn isolating(&self, ep: &Endpoint) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
        let (mut ingress, mut egress) = (Vec::new(), Vec::new());
        for policy in &ep.policies {
            if let Some(p) = self.policies.get(policy) {
                if p.plan.ingress.is_some() {
                    ingress.push(policy.clone());
                }
                if p.plan.egress.is_some() {
                    egress.push(policy.clone());
                }
            }
        }
        (ingress, egress)
    }

    /// Whether the policies would isolate a local pod that is not an endpoint (ingress,
    /// egress), for the guard: one pass over its namespace's policies and the
    /// ClusterNetworkPolicies.
    pub(super) fn would_isolate(&self, key: &ObjectKey, sets: &SetIndex) -> (bool, bool) {
        let (mut ingress, mut egress) = (false, false);
        let Some(pod) = sets.pod(key) else {
            return (ingress, egress);
        };
        for policy in self
            .policies_by_ns
            .get(&key.namespace)
            .into_iter()
            .flatten()
        {
            let Some(p) = self.policies.get(policy) else {
                continue;
            };
            if p.info.pod_selector.matches(&pod.labels) {
                ingress |= p.plan.ingress.is_some();
                egress |= p.plan.egress.is_some();
            }
        }
        self.would_cluster_isolate(key, sets, &mut ingress, &mut egress);
        (ingress, egress)
    }

    /// The active policies (selecting at least one local endpoint).
    pub(super) fn active_policies(&self) -> impl Iterator<Item = (&ObjectKey, &PolicyEntry)> {
        self.policies.iter().filter(|(_, p)| !p.selects.is_empty())
    }

    /// The local endpoints a policy's chains serve (for the programming-latency metric).
    pub(super) fn selected_by<'a>(&'a self, owner: &'a Owner) -> Vec<&'a ObjectKey> {
        match owner {
            Owner::Endpoint(key) => vec![key],
            Owner::Policy(key) => self
                .policies
                .get(key)
                .map(|p| p.selects.iter().collect())
                .unwrap_or_default(),
            Owner::ClusterPolicy(name) => self
                .cluster_policies
                .get(name)
                .map(|p| p.selects.iter().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}
