//! Read-only views of the graph, for what the agent tells about traffic (deny logs, counters,
//! `explain`) and its metrics: pods, programmed endpoints, emitted chains, active policies,
//! the snapshot of the whole desired state. Each reads the calculators, never changes them.

use std::net::IpAddr;

use crate::model::{IpFamily, ObjectKey, PodInfo, Tier};
use crate::rules::sets::{set_name, SetSpec};
use crate::rules::Chain;

use super::update::{DesiredState, FamilyState};
use super::{CalcGraph, EndpointView};

impl CalcGraph {
    /// A pod as the graph knows it (local or not), by key (a copy: the graph keeps pods in a
    /// compact form of its own; a remote pod comes without its uid and sandbox id).
    pub fn pod(&self, key: &ObjectKey) -> Option<PodInfo> {
        self.sets.pod(key).map(|p| p.to_info())
    }

    /// A pod's addresses (empty for a pod the graph does not know), without a copy.
    pub fn pod_ips(&self, key: &ObjectKey) -> &[IpAddr] {
        self.sets.pod(key).map(|p| &*p.ips).unwrap_or(&[])
    }

    pub fn local_endpoint_count(&self) -> usize {
        self.selection.endpoints().len()
    }

    /// Every local pod with an address: its addresses and the interface it was named to
    /// (`None`: the resolver found none). O(local pods), for the agent's check that the
    /// named interfaces exist.
    pub fn local_pod_interfaces(&self) -> Vec<(ObjectKey, Vec<IpAddr>, Option<String>)> {
        let named = self
            .selection
            .endpoints()
            .iter()
            .map(|(key, ep)| (key.clone(), Some(ep.iface.clone())));
        let unnamed = self.rejections.unnamed_pods().map(|key| (key, None));
        named
            .chain(unnamed)
            .filter_map(|(key, iface)| {
                let ips = self.sets.pod(&key)?.ips.to_vec();
                (!ips.is_empty()).then_some((key, ips, iface))
            })
            .collect()
    }

    /// The local endpoints that have chains (a named interface they own), each with the
    /// policies isolating it per direction, as the graph renders them now (flush first for
    /// the latest events).
    pub fn programmed_endpoints(&self) -> impl Iterator<Item = EndpointView<'_>> {
        self.selection
            .endpoints()
            .iter()
            .filter(|(key, ep)| self.interfaces.owns(&ep.iface, key))
            .map(|(key, ep)| {
                let (ingress, egress) = self.selection.isolating(ep);
                EndpointView {
                    key,
                    iface: &ep.iface,
                    ingress,
                    egress,
                }
            })
    }

    /// Every chain as of the last flush, with its family.
    pub fn emitted_chains(&self) -> impl Iterator<Item = (IpFamily, &Chain)> {
        self.emitted.chains().iter().map(|((f, _), c)| (*f, &**c))
    }

    /// The policies selecting at least one local endpoint (the ones with chains).
    pub fn active_policies(&self) -> impl Iterator<Item = &ObjectKey> {
        self.selection.active_policies().map(|(k, _)| k)
    }

    pub fn active_policy_count(&self) -> usize {
        self.selection.active_policies().count()
    }

    /// The active ClusterNetworkPolicies (selecting a local endpoint: they have chains), as
    /// (tier, name).
    pub fn active_cluster_policies(&self) -> impl Iterator<Item = (Tier, &str)> {
        self.selection
            .active_cluster_policies()
            .map(|p| (p.info.tier, p.info.name.as_str()))
    }

    pub fn active_cluster_policy_count(&self) -> usize {
        self.selection.active_cluster_policies().count()
    }

    /// The complete state as of the last flush (call `flush` first to include recent events).
    pub fn snapshot(&self) -> DesiredState {
        let mut state = DesiredState::default();
        for &family in &self.cfg.families {
            state.families.insert(family, FamilyState::default());
        }
        for ((family, name), chain) in self.emitted.chains() {
            if let Some(f) = state.families.get_mut(family) {
                f.chains.insert(name.clone(), chain.clone());
            }
        }
        for (&family, f) in state.families.iter_mut() {
            self.host_set.snapshot(family, f);
            self.unions.snapshot(family, f);
        }
        for set in self.sets.sets() {
            if !self.emitted.sets().contains_key(&set.id) {
                continue;
            }
            for (&family, f) in state.families.iter_mut() {
                let name = set_name(family, &set.id);
                f.sets.insert(
                    name.clone(),
                    SetSpec {
                        name,
                        family,
                        set_type: set.def.set_type(),
                        members: set
                            .members
                            .keys()
                            .filter(|m| m.family() == family)
                            .copied()
                            .collect(),
                    },
                );
            }
        }
        state
    }
}
