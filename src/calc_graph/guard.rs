//! The guard calculator: which local pods without a known interface a policy isolates, so
//! `rules::guard` drops their traffic by address until they are named (fail-closed where the
//! dispatch chains cannot reach them; see that module for why).
//!
//! Owns: the pods the guard holds, as of the last flush. Its input is the interfaces
//! calculator's unnamed pods, judged by the selection calculator; its effects are the guard
//! chain (when the held pods change) and the static chains (when it starts or stops holding
//! any, since they jump to it only then).
//!
//! Kept apart from the endpoints on purpose: an endpoint is a pod with an interface, and
//! everything keyed by endpoints (active policies, set references, profiles, unions, the
//! metrics) stays as it was. The guard is recomputed at each flush while some local pod is
//! unnamed: per such pod one pass over its namespace's NetworkPolicies and the
//! ClusterNetworkPolicies, which costs nothing on a node whose pods are all named (the usual
//! state) and stays small when a few are being wired.
//!
//! While auto's wiring is pending (`RuleConfig::pending`), it also keeps the
//! addresses of the local pods the datastore knows, which the pending chains let through;
//! those chains exist from the first flush on, before any pod.
//!
//! The guard at two layers: which pods it holds in `calc_graph::guard`, its chain in
//! `rules::guard`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::{IpFamily, ObjectKey};
use crate::rules::guard::{guard_chain, pending_chains, Guarded};
use crate::rules::{Chain, RuleConfig};

use super::selection::Selection;
use super::set_index::SetIndex;
use super::{Effects, Owner};

#[derive(Default)]
pub(super) struct Guard {
    guarded: Vec<Guarded>,
    /// While auto's wiring is pending: the local pods' addresses, sorted.
    known: Vec<IpAddr>,
}

impl Guard {
    /// Brings the guard up to date before a flush renders; `pending`: auto's wiring is
    /// pending and the node's pod ranges are known (the pending chains are rendered).
    pub(super) fn refresh(
        &mut self,
        unnamed: &BTreeSet<ObjectKey>,
        selection: &Selection,
        sets: &SetIndex,
        pending: bool,
    ) -> Effects {
        let mut fx = Effects::default();
        if unnamed.is_empty() && self.guarded.is_empty() && self.known.is_empty() {
            return fx;
        }
        let now = wanted(unnamed, selection, sets);
        let known = if pending {
            known(unnamed, sets)
        } else {
            Vec::new()
        };
        if now == self.guarded && known == self.known {
            return fx;
        }
        if now.is_empty() != self.guarded.is_empty() {
            fx.owners.push(Owner::Static);
        }
        fx.owners.push(Owner::Guard);
        self.guarded = now;
        self.known = known;
        fx
    }

    /// Whether the guard holds a pod (the static chains jump to it then).
    pub(super) fn active(&self) -> bool {
        !self.guarded.is_empty()
    }

    /// The pods the guard holds, as of the last flush.
    pub(super) fn pods(&self) -> &[Guarded] {
        &self.guarded
    }

    /// The local pods' addresses the pending chains let through.
    pub(super) fn known(&self) -> &[IpAddr] {
        &self.known
    }

    pub(super) fn chains(&self, cfg: &RuleConfig, family: IpFamily) -> Vec<Chain> {
        let mut chains = pending_chains(cfg, family, &self.known);
        if !self.guarded.is_empty() {
            chains.insert(0, guard_chain(cfg, family, &self.guarded));
        }
        chains
    }
}

/// The unnamed local pods with an address that some policy isolates, in key order.
fn wanted(unnamed: &BTreeSet<ObjectKey>, selection: &Selection, sets: &SetIndex) -> Vec<Guarded> {
    let mut out = Vec::new();
    for key in unnamed {
        let Some(pod) = sets.pod(key) else {
            continue;
        };
        if pod.ips.is_empty() {
            continue;
        }
        let (ingress, egress) = selection.would_isolate(key, sets);
        if ingress || egress {
            out.push(Guarded {
                pod: key.clone(),
                ips: pod.ips.to_vec(),
                ingress,
                egress,
            });
        }
    }
    out
}

/// The addresses of the unnamed local pods (every local pod while auto's wiring is
/// pending), sorted and without repeats.
fn known(unnamed: &BTreeSet<ObjectKey>, sets: &SetIndex) -> Vec<IpAddr> {
    let ips: BTreeSet<IpAddr> = unnamed
        .iter()
        .filter_map(|key| sets.pod(key))
        .flat_map(|pod| pod.ips.iter().copied())
        .collect();
    ips.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{allow_from, bodies, cluster, eq, local_pod, LearningResolver, NODE};
    use super::super::GraphConfig;
    use crate::agent::Calculation;
    use crate::model::{IpFamily, Tier};
    use crate::rules::guard::GUARD_CHAIN;
    use crate::rules::RuleConfig;

    fn graph(names: &LearningResolver) -> Calculation {
        Calculation::new(
            GraphConfig {
                node_name: NODE.into(),
                families: vec![IpFamily::V4],
                rules: RuleConfig::default(),
            },
            Box::new(names.clone()),
        )
    }

    fn has_chain(g: &Calculation, name: &str) -> bool {
        g.snapshot().families[&IpFamily::V4]
            .chains
            .contains_key(name)
    }

    #[test]
    fn an_isolated_pod_without_interface_is_dropped_by_address_until_named() {
        let names = LearningResolver::default();
        let mut g = graph(&names);
        g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("app", "a")]));
        g.upsert_pod_info(local_pod("x", "b", "10.0.0.2", &[("app", "b")]));
        g.flush();
        assert!(!has_chain(&g, GUARD_CHAIN), "no policy: nothing to guard");
        assert!(!bodies(&g, "cali-FORWARD")
            .iter()
            .any(|r| r.contains(GUARD_CHAIN)));

        // A policy isolating a (ingress): a is guarded, b is not.
        g.upsert_policy_info(allow_from("x", "p", &[("app", "a")], vec![eq("app", "c")]));
        g.flush();
        let guard = bodies(&g, GUARD_CHAIN);
        assert_eq!(guard.len(), 1, "{guard:?}");
        assert!(guard[0].contains("-d 10.0.0.1/32") && guard[0].ends_with("-j DROP"));
        for chain in ["cali-FORWARD", "cali-INPUT"] {
            assert!(
                bodies(&g, chain)[..2]
                    .iter()
                    .any(|r| r.ends_with(&format!("-j {GUARD_CHAIN}"))),
                "{chain}: {:?}",
                bodies(&g, chain)
            );
        }
        assert_eq!(g.guarded_pods().len(), 1);

        // Named: its own chains take over, the guard and the jumps go.
        names
            .0
            .lock()
            .unwrap()
            .insert("x/a".into(), "cali-a".into());
        g.interfaces_changed();
        g.flush();
        assert!(has_chain(&g, "cali-tw-cali-a"));
        assert!(!has_chain(&g, GUARD_CHAIN));
        assert!(!bodies(&g, "cali-FORWARD")
            .iter()
            .any(|r| r.contains(GUARD_CHAIN)));

        // The interface is lost again: guarded again.
        names.0.lock().unwrap().clear();
        g.interfaces_changed();
        g.flush();
        assert!(has_chain(&g, GUARD_CHAIN));
        assert!(!has_chain(&g, "cali-tw-cali-a"));

        // The policy goes: nothing isolates a, nothing to guard.
        g.remove_policy(&crate::model::ObjectKey::new("x", "p"));
        g.flush();
        assert!(!has_chain(&g, GUARD_CHAIN));
    }

    #[test]
    fn cluster_policies_guard_in_their_directions_and_removal_ends_it() {
        let names = LearningResolver::default();
        let mut g = graph(&names);
        g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[]));
        g.upsert_cluster_policy_info(cluster("c1", Tier::Admin, 10, false, true, &[]));
        g.flush();
        let guard = bodies(&g, GUARD_CHAIN);
        assert_eq!(guard.len(), 1, "{guard:?}");
        assert!(
            guard[0].contains("-s 10.0.0.1/32"),
            "egress only: {guard:?}"
        );

        g.remove_pod(&crate::model::ObjectKey::new("x", "a"));
        g.flush();
        assert!(!has_chain(&g, GUARD_CHAIN));
        assert!(g.guarded_pods().is_empty());
    }

    #[test]
    fn a_pod_moving_off_the_node_leaves_the_guard() {
        let names = LearningResolver::default();
        let mut g = graph(&names);
        g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("app", "a")]));
        g.upsert_policy_info(allow_from("x", "p", &[("app", "a")], vec![]));
        g.flush();
        assert!(has_chain(&g, GUARD_CHAIN));
        let mut moved = local_pod("x", "a", "10.0.0.1", &[("app", "a")]);
        moved.node = Some("elsewhere".into());
        g.upsert_pod_info(moved);
        g.flush();
        assert!(!has_chain(&g, GUARD_CHAIN));
    }

    #[test]
    fn pending_ranges_hold_from_the_first_flush_and_let_known_pods_through() {
        use crate::rules::guard::{PENDING_FROM_CHAIN, PENDING_TO_CHAIN};
        let names = LearningResolver::default();
        let mut g = Calculation::new(
            GraphConfig {
                node_name: NODE.into(),
                families: vec![IpFamily::V4],
                rules: RuleConfig {
                    interface_prefixes: Vec::new(),
                    pending: Some(crate::rules::guard::PendingWiring {
                        pod_cidrs: vec!["10.0.0.0/24".parse().unwrap()],
                        prefixes: Vec::new(),
                    }),
                    ..RuleConfig::default()
                },
            },
            Box::new(names.clone()),
        );
        g.flush();
        assert_eq!(bodies(&g, PENDING_TO_CHAIN).len(), 1, "only the drop");
        assert_eq!(bodies(&g, PENDING_FROM_CHAIN).len(), 1);
        let forward = bodies(&g, "cali-FORWARD");
        assert!(
            forward
                .iter()
                .any(|r| r.starts_with("-d 10.0.0.0/24") && r.ends_with(PENDING_TO_CHAIN)),
            "{forward:?}"
        );

        // A pod's address reaches the datastore: it passes; a policy isolating it puts it in
        // the guard as well.
        g.upsert_pod_info(local_pod("x", "a", "10.0.0.1", &[("app", "a")]));
        g.flush();
        let to = bodies(&g, PENDING_TO_CHAIN);
        assert_eq!(to.len(), 2, "{to:?}");
        assert!(to[0].starts_with("-d 10.0.0.1/32") && to[0].ends_with("-j RETURN"));
        g.upsert_policy_info(allow_from("x", "p", &[("app", "a")], vec![]));
        g.flush();
        assert!(has_chain(&g, GUARD_CHAIN));
        assert_eq!(bodies(&g, PENDING_TO_CHAIN).len(), 2);

        // Gone from the datastore: dropped again.
        g.remove_pod(&crate::model::ObjectKey::new("x", "a"));
        g.flush();
        assert_eq!(bodies(&g, PENDING_TO_CHAIN).len(), 1);
        assert!(!has_chain(&g, GUARD_CHAIN));
    }
}
