//! The provenance of everything the graph renders for one family: every chain with what each
//! of its rules implements (`rules::provenance`), rendered again with tracing on. Off the hot
//! path: `audit` and `explain` ask for it once; the graph's own renders never trace.
//!
//! Provenance at two layers: what a rule implements, recorded by the renderers in
//! `rules::provenance`, gathered for the whole rendered state in `calc_graph::provenance`.

use std::collections::BTreeMap;

use crate::model::IpFamily;
use crate::rules::chains::{
    kernel_chain_rules, profile_chains_traced, static_chains_traced, tiered_endpoint_chains_traced,
    TierChains,
};
use crate::rules::cluster::cluster_policy_chains_traced;
use crate::rules::dispatch::dispatch_chains_traced;
use crate::rules::guard::{guard_chain_traced, pending_chains_traced};
use crate::rules::policy::policy_chains_traced;
use crate::rules::provenance::{describe_set, Provenance, RuleRole, TracedChain};
use crate::rules::sets::set_name;

use super::CalcGraph;

impl CalcGraph {
    /// What every chain and rule the graph renders for `family` implements, as of the last
    /// flush (the chains are those of `snapshot`, byte for byte), plus our rules in the
    /// kernel chains.
    pub fn provenance(&self, family: IpFamily) -> Provenance {
        let cfg = &self.cfg.rules;
        let mut chains: Vec<TracedChain> = static_chains_traced(cfg, family, self.guard.active());
        if self.guard.active() {
            chains.push(guard_chain_traced(cfg, family, self.guard.pods()));
        }
        chains.extend(pending_chains_traced(cfg, family, self.guard.known()));
        chains.extend(dispatch_chains_traced(
            cfg,
            family,
            &self.interfaces.names(),
            &self.endpoint_addrs(),
        ));
        for ns in self.selection.namespaces_with_endpoints() {
            chains.extend(profile_chains_traced(cfg, family, ns));
        }
        for (_, p) in self.selection.active_policies() {
            chains.extend(policy_chains_traced(
                cfg,
                family,
                &p.info,
                &p.plan,
                &|def| set_name(family, &def.id()),
            ));
        }
        for p in self.selection.active_cluster_policies() {
            chains.extend(cluster_policy_chains_traced(
                cfg,
                family,
                &p.info,
                &p.plan,
                &|def| set_name(family, &def.id()),
            ));
        }
        let mut pods_by_iface = BTreeMap::new();
        for (key, ep) in self.selection.endpoints() {
            if !self.interfaces.owns(&ep.iface, key) {
                continue;
            }
            pods_by_iface.insert(ep.iface.clone(), key.clone());
            let (ingress, egress) = self.selection.isolating(ep);
            let [admin_in, admin_out, baseline_in, baseline_out] =
                self.selection.endpoint_cluster_policies(key);
            let addrs = self.sets.pod(key).map(|p| &*p.ips).unwrap_or_default();
            let [union_in, union_out] = self.unions.endpoint_ids(key);
            chains.extend(tiered_endpoint_chains_traced(
                cfg,
                family,
                &ep.iface,
                addrs,
                key,
                &key.namespace,
                &TierChains {
                    admin: &admin_in,
                    network: &ingress,
                    baseline: &baseline_in,
                    union: union_in,
                },
                &TierChains {
                    admin: &admin_out,
                    network: &egress,
                    baseline: &baseline_out,
                    union: union_out,
                },
            ));
        }
        let kernel = kernel_chain_rules(cfg, family)
            .into_iter()
            .map(|k| {
                let rules = k
                    .inserts
                    .iter()
                    .map(|r| (r.hash.clone(), RuleRole::JumpToOurs))
                    .chain(
                        k.appends
                            .iter()
                            .map(|r| (r.hash.clone(), RuleRole::AcceptAllowed)),
                    )
                    .collect();
                (k.chain, rules)
            })
            .collect();
        Provenance {
            chains: chains
                .into_iter()
                .map(|c| (c.chain.name.clone(), c))
                .collect(),
            kernel,
            pods_by_iface,
            policies: self
                .selection
                .active_policies()
                .map(|(k, p)| (k.clone(), p.info.clone()))
                .collect(),
            sets: self
                .emitted
                .sets()
                .iter()
                .map(|(id, def)| (set_name(family, id), describe_set(def)))
                .chain(self.unions.emitted().map(|(id, parts)| {
                    (set_name(family, id), crate::rules::union::describe(parts))
                }))
                .collect(),
        }
    }
}
