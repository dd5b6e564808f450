//! The flush, wired: the guard and the endpoints' unions are brought up to date, the set
//! index's pending changes feed the unions and then the output, and every dirty owner is
//! rendered from the calculators' state and diffed by the output (`emitted`) into one
//! `Update` delta.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use crate::model::{IpFamily, ObjectKey};
use crate::rules::chains::{profile_chains, static_chains, tiered_endpoint_chains, TierChains};
use crate::rules::cluster::cluster_policy_chains;
use crate::rules::dispatch::dispatch_chains_with_addrs;
use crate::rules::policy::{policy_chains, PolicyPlan};
use crate::rules::sets::set_name;
use crate::rules::union::{union_plan, UnionPlan};
use crate::rules::{Chain, Direction};

use super::set_index::PendingSet;
use super::update::Update;
use super::{CalcGraph, Owner};

impl CalcGraph {
    /// Renders everything dirty and returns the changes since the last flush.
    pub fn flush(&mut self) -> Update {
        let mut update = Update::default();
        let pending = crate::rules::guard::is_pending(&self.cfg.rules);
        let guarded = self.guard.refresh(
            self.interfaces.unnamed(),
            &self.selection,
            &self.sets,
            pending,
        );
        self.route(guarded);
        self.update_endpoint_unions();
        self.unions.peers_changed(&self.sets.pending);
        let mut pending: Vec<(String, PendingSet)> = self.sets.pending.drain().collect();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        self.emitted
            .emit_sets(pending, &self.sets, &self.cfg.families, &mut update);
        self.unions
            .flush(&self.sets, &self.cfg.families, &mut update);
        let ipvs = self.cfg.rules.kube_ipvs.is_some();
        self.host_set.flush(ipvs, &self.cfg.families, &mut update);
        let (dirty, mut since) = self.emitted.take_dirty();
        // Local endpoint → earliest start behind a change of its rules in this flush.
        let mut starts: BTreeMap<ObjectKey, Instant> = BTreeMap::new();
        for owner in dirty {
            let chains = self.render_owner(&owner);
            let at = since.remove(&owner);
            let changed = self.emitted.emit_owner(owner.clone(), chains, &mut update);
            if let (true, Some(at)) = (changed, at) {
                for ep in self.selection.selected_by(&owner) {
                    let t = starts.entry(ep.clone()).or_insert(at);
                    *t = (*t).min(at);
                }
            }
        }
        self.emitted.finish(starts.into_values(), &mut update);
        update
    }

    /// Brings the union sets of the dirty endpoints up to date (before their chains are
    /// rendered, which name them).
    fn update_endpoint_unions(&mut self) {
        for key in self.emitted.dirty_endpoints() {
            let now = self.wanted_unions(&key);
            self.unions.set_endpoint(key, now);
        }
    }

    /// The union sets an endpoint's ingress and egress chains should match: none unless it
    /// owns its interface (the chains are rendered) and passes the threshold.
    fn wanted_unions(&self, key: &ObjectKey) -> [Option<UnionPlan>; 2] {
        let cfg = &self.cfg.rules;
        if cfg.policy_union_min == 0 {
            return [None, None];
        }
        let Some(ep) = self.selection.endpoint(key) else {
            return [None, None];
        };
        if !self.interfaces.owns(&ep.iface, key) {
            return [None, None];
        }
        let (ingress, egress) = self.selection.isolating(ep);
        let plans = |keys: &[ObjectKey]| -> Vec<&PolicyPlan> {
            keys.iter()
                .filter_map(|k| self.selection.policy(k).map(|p| &p.plan))
                .collect()
        };
        [
            union_plan(cfg, Direction::Ingress, &plans(&ingress)),
            union_plan(cfg, Direction::Egress, &plans(&egress)),
        ]
    }

    fn render_owner(&self, owner: &Owner) -> Vec<(IpFamily, Chain)> {
        let cfg = &self.cfg.rules;
        let mut out = Vec::new();
        for &family in &self.cfg.families {
            let chains: Vec<Chain> = match owner {
                Owner::Static => static_chains(cfg, family, self.guard.active()),
                Owner::Guard => self.guard.chains(cfg, family),
                Owner::Dispatch => dispatch_chains_with_addrs(
                    cfg,
                    family,
                    &self.interfaces.names(),
                    &self.endpoint_addrs(),
                ),
                Owner::Profile(ns) => {
                    if self.selection.has_endpoints_in(ns) {
                        profile_chains(cfg, family, ns).into()
                    } else {
                        Vec::new()
                    }
                }
                Owner::Policy(key) => match self.selection.policy(key) {
                    Some(p) if !p.selects.is_empty() => {
                        policy_chains(cfg, family, &p.info, &p.plan, &|def| {
                            set_name(family, &def.id())
                        })
                    }
                    _ => Vec::new(),
                },
                Owner::ClusterPolicy(name) => match self.selection.cluster_policy(name) {
                    Some(p) if !p.selects.is_empty() => {
                        cluster_policy_chains(cfg, family, &p.info, &p.plan, &|def| {
                            set_name(family, &def.id())
                        })
                    }
                    _ => Vec::new(),
                },
                Owner::Endpoint(key) => self.endpoint_chains(key, family),
            };
            out.extend(chains.into_iter().map(|c| (family, c)));
        }
        out
    }

    /// Bridge mode: `(address, interface)` of every local endpoint that owns its interface,
    /// for the dispatch of traffic routed into the bridge. Empty in routed mode.
    pub(super) fn endpoint_addrs(&self) -> Vec<(IpAddr, String)> {
        if self.cfg.rules.bridge.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (iface, owner) in self.interfaces.owners() {
            let Some(pod) = self.sets.pod(owner) else {
                continue;
            };
            out.extend(pod.ips.iter().map(|ip| (*ip, iface.clone())));
        }
        out
    }

    fn endpoint_chains(&self, key: &ObjectKey, family: IpFamily) -> Vec<Chain> {
        let Some(ep) = self.selection.endpoint(key) else {
            return Vec::new();
        };
        if !self.interfaces.owns(&ep.iface, key) {
            return Vec::new();
        }
        let (ingress, egress) = self.selection.isolating(ep);
        let [admin_in, admin_out, baseline_in, baseline_out] =
            self.selection.endpoint_cluster_policies(key);
        let addrs = self.sets.pod(key).map(|p| &*p.ips).unwrap_or_default();
        let [union_in, union_out] = self.unions.endpoint_ids(key);
        tiered_endpoint_chains(
            &self.cfg.rules,
            family,
            &ep.iface,
            addrs,
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
        )
        .into()
    }
}
