//! The ClusterNetworkPolicy half of the selection calculator (`selection`): which local
//! endpoints each one's subject selects, the sets an active one references, and the order of
//! the tiers in the workload chains.
//!
//! A ClusterNetworkPolicy is active, like a NetworkPolicy, while its subject selects a local
//! endpoint; only then does it have chains and set references. A subject selects by pod
//! labels and by the labels of the pod's namespace, so besides the policy's own events a
//! local pod's relabel and its namespace's relabel re-evaluate it (per local endpoint: there
//! are at most a few hundred). Its chains are shared by every endpoint it selects; each
//! endpoint's chains list, per direction, the Admin policies that have rules there in
//! (priority, name) order, its NetworkPolicies, then the Baseline policies likewise.
//!
//! ClusterNetworkPolicy at each layer: validated in `model::validate::cluster`, selected and
//! tiered in the graph by `calc_graph::cluster`, rendered by `rules::cluster`, evaluated by
//! `verdict::cluster`.

use std::collections::BTreeSet;

use crate::model::{ClusterPolicyInfo, ObjectKey, Tier};
use crate::rules::cluster::plan_cluster_policy;
use crate::rules::Direction;

use super::selection::{active_set_defs, ClusterEntry, Selection};
use super::set_index::SetIndex;
use super::{Effects, Owner};

impl Selection {
    pub(super) fn upsert_cluster_policy(
        &mut self,
        info: ClusterPolicyInfo,
        sets: &SetIndex,
    ) -> Effects {
        let mut fx = Effects::default();
        let name = info.name.clone();
        if self
            .cluster_policies
            .get(&name)
            .is_some_and(|p| p.info == info)
        {
            return fx;
        }
        let plan = plan_cluster_policy(&info);
        let selects: BTreeSet<ObjectKey> = self
            .endpoints
            .keys()
            .filter(|ep| subject_selects(&info, ep, sets))
            .cloned()
            .collect();
        let old = self.cluster_policies.remove(&name);
        let (old_defs, old_selects) = old
            .as_ref()
            .map(|o| {
                (
                    active_set_defs(&o.selects, o.plan.set_defs()),
                    o.selects.clone(),
                )
            })
            .unwrap_or_default();
        fx.move_set_references(active_set_defs(&selects, plan.set_defs()), old_defs);
        // Re-rendered even when still selected: its tier, priority or directions may differ.
        self.reselect_endpoints(&old_selects, &selects, &mut fx, |e, selected| {
            if selected {
                e.cluster_policies.insert(name.clone());
            } else {
                e.cluster_policies.remove(&name);
            }
        });
        fx.owners.push(Owner::ClusterPolicy(name.clone()));
        self.cluster_policies.insert(
            name,
            ClusterEntry {
                info,
                plan,
                selects,
            },
        );
        fx
    }

    pub(super) fn remove_cluster_policy(&mut self, name: &str) -> Effects {
        let mut fx = Effects::default();
        let Some(entry) = self.cluster_policies.remove(name) else {
            return fx;
        };
        for ep in &entry.selects {
            if let Some(e) = self.endpoints.get_mut(ep) {
                e.cluster_policies.remove(name);
            }
            fx.owners.push(Owner::Endpoint(ep.clone()));
        }
        if !entry.selects.is_empty() {
            fx.set_refs
                .extend(entry.plan.set_defs().into_iter().map(|d| (false, d)));
        }
        fx.owners.push(Owner::ClusterPolicy(name.to_string()));
        fx
    }

    /// Re-evaluates which ClusterNetworkPolicies select a local endpoint (it is new, or its
    /// labels or its namespace's labels changed).
    pub(super) fn reselect_cluster_policies(
        &mut self,
        key: &ObjectKey,
        sets: &SetIndex,
        fx: &mut Effects,
    ) {
        if self.cluster_policies.is_empty() || !self.endpoints.contains_key(key) {
            return;
        }
        let verdicts: Vec<(String, bool)> = self
            .cluster_policies
            .values()
            .map(|p| (p.info.name.clone(), subject_selects(&p.info, key, sets)))
            .collect();
        for (name, selects) in verdicts {
            self.set_cluster_selection(&name, key, selects, fx);
        }
    }

    /// A namespace's labels changed: its local endpoints may have entered or left subjects.
    pub(super) fn namespace_relabeled(&mut self, namespace: &str, sets: &SetIndex) -> Effects {
        let mut fx = Effects::default();
        if self.cluster_policies.is_empty() {
            return fx;
        }
        let eps: Vec<ObjectKey> = self.endpoints_in(namespace).cloned().collect();
        for ep in eps {
            self.reselect_cluster_policies(&ep, sets, &mut fx);
        }
        fx
    }

    /// Records whether policy `name` selects endpoint `ep`, activating or retiring the
    /// policy when that changes whether it selects anything.
    pub(super) fn set_cluster_selection(
        &mut self,
        name: &str,
        ep: &ObjectKey,
        selects: bool,
        fx: &mut Effects,
    ) {
        let Some(entry) = self.cluster_policies.get_mut(name) else {
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
                e.cluster_policies.insert(name.to_string());
            } else {
                e.cluster_policies.remove(name);
            }
        }
        fx.owners.push(Owner::Endpoint(ep.clone()));
        if was_active != is_active {
            fx.set_refs
                .extend(entry.plan.set_defs().into_iter().map(|d| (is_active, d)));
            fx.owners.push(Owner::ClusterPolicy(name.to_string()));
        }
    }

    /// Adds the directions the ClusterNetworkPolicies would isolate a local pod in (see
    /// `would_isolate`).
    pub(super) fn would_cluster_isolate(
        &self,
        key: &ObjectKey,
        sets: &SetIndex,
        ingress: &mut bool,
        egress: &mut bool,
    ) {
        for p in self.cluster_policies.values() {
            if (*ingress && *egress) || !subject_selects(&p.info, key, sets) {
                continue;
            }
            *ingress |= p.plan.direction(Direction::Ingress).is_some();
            *egress |= p.plan.direction(Direction::Egress).is_some();
        }
    }

    /// The chains of `tier`'s policies selecting the endpoint that have rules in
    /// `direction`, in evaluation order.
    fn cluster_chains(
        &self,
        names: &BTreeSet<String>,
        tier: Tier,
        direction: Direction,
    ) -> Vec<String> {
        let mut policies: Vec<&ClusterEntry> = names
            .iter()
            .filter_map(|n| self.cluster_policies.get(n))
            .filter(|p| p.info.tier == tier && p.plan.direction(direction).is_some())
            .collect();
        policies.sort_by(|a, b| a.info.order_key().cmp(&b.info.order_key()));
        policies.into_iter().map(|p| p.info.name.clone()).collect()
    }

    /// The ClusterNetworkPolicies selecting a local endpoint, in chain order: Admin ingress,
    /// Admin egress, Baseline ingress, Baseline egress.
    pub(super) fn endpoint_cluster_policies(&self, key: &ObjectKey) -> [Vec<String>; 4] {
        let Some(ep) = self.endpoints.get(key) else {
            return Default::default();
        };
        let chains = |tier, direction| self.cluster_chains(&ep.cluster_policies, tier, direction);
        [
            chains(Tier::Admin, Direction::Ingress),
            chains(Tier::Admin, Direction::Egress),
            chains(Tier::Baseline, Direction::Ingress),
            chains(Tier::Baseline, Direction::Egress),
        ]
    }

    /// The active ClusterNetworkPolicies (selecting a local endpoint: they have chains).
    pub(super) fn active_cluster_policies(&self) -> impl Iterator<Item = &ClusterEntry> {
        self.cluster_policies
            .values()
            .filter(|p| !p.selects.is_empty())
    }
}

fn subject_selects(info: &ClusterPolicyInfo, ep: &ObjectKey, sets: &SetIndex) -> bool {
    let Some(pod) = sets.pod(ep) else {
        return false;
    };
    info.subject.pods.matches(&pod.labels)
        && info
            .subject
            .namespaces
            .matches(&sets.namespace_labels(&ep.namespace))
}
