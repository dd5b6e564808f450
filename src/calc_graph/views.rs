//! Read-only views of the graph, for what the agent tells about traffic (deny logs, counters,
//! `explain`): pods, programmed endpoints, emitted chains, active policies, the snapshot of
//! the whole desired state.

use super::*;

impl CalcGraph {
    /// A pod as the graph knows it (local or not), by key (a copy: the graph keeps pods in a
    /// compact form of its own; a remote pod comes without its uid and sandbox id).
    pub fn pod(&self, key: &ObjectKey) -> Option<PodInfo> {
        self.sets.pod(key).map(|p| p.to_info())
    }

    /// A pod's addresses (empty for a pod the graph does not know), without a copy.
    pub fn pod_ips(&self, key: &ObjectKey) -> &[std::net::IpAddr] {
        self.sets.pod(key).map(|p| &*p.ips).unwrap_or(&[])
    }

    /// The local endpoints that have chains (a named interface they own), each with the
    /// policies isolating it per direction, as the graph renders them now (flush first for
    /// the latest events).
    pub fn programmed_endpoints(&self) -> impl Iterator<Item = EndpointView<'_>> {
        self.endpoints.iter().filter_map(|(key, ep)| {
            let owns = self
                .iface_claims
                .get(&ep.iface)
                .and_then(|claims| claims.first())
                == Some(key);
            owns.then(|| {
                let (ingress, egress) = self.isolating(ep);
                EndpointView {
                    key,
                    iface: &ep.iface,
                    ingress,
                    egress,
                }
            })
        })
    }

    /// Every chain as of the last flush, with its family.
    pub fn emitted_chains(&self) -> impl Iterator<Item = (IpFamily, &Chain)> {
        self.emitted_chains.iter().map(|((f, _), c)| (*f, &**c))
    }

    /// The policies selecting at least one local endpoint (the ones with chains).
    pub fn active_policies(&self) -> impl Iterator<Item = &ObjectKey> {
        self.policies
            .iter()
            .filter(|(_, p)| !p.selects.is_empty())
            .map(|(k, _)| k)
    }

    /// The complete state as of the last flush (call `flush` first to include recent events).
    pub fn snapshot(&self) -> DesiredState {
        let mut state = DesiredState::default();
        for &family in &self.cfg.families {
            state.families.insert(family, FamilyState::default());
        }
        for ((family, name), chain) in &self.emitted_chains {
            if let Some(f) = state.families.get_mut(family) {
                f.chains.insert(name.clone(), chain.clone());
            }
        }
        for (&family, f) in state.families.iter_mut() {
            self.host_set.snapshot(family, f);
            self.unions.snapshot(family, f);
        }
        for set in self.sets.sets() {
            if !self.emitted_sets.contains_key(&set.id) {
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
