//! The graph's output: `flush` renders what the updates marked dirty (sets with their member
//! changes, policy and endpoint chains, the per-endpoint unions) into one `Update` delta.

use super::*;

impl CalcGraph {
    /// Renders everything dirty and returns the changes since the last flush.
    pub fn flush(&mut self) -> Update {
        let mut update = Update::default();
        self.refresh_guard();
        self.update_endpoint_unions();
        self.unions.peers_changed(&self.sets.pending);
        self.flush_sets(&mut update);
        self.unions
            .flush(&self.sets, &self.cfg.families, &mut update);
        let ipvs = self.cfg.rules.kube_ipvs.is_some();
        self.host_set.flush(ipvs, &self.cfg.families, &mut update);
        let dirty = std::mem::take(&mut self.dirty.owners);
        let mut since = std::mem::take(&mut self.dirty.since);
        // Local endpoint → earliest start behind a change of its rules in this flush.
        let mut starts: BTreeMap<ObjectKey, Instant> = BTreeMap::new();
        for owner in dirty {
            let chains = self.render_owner(&owner);
            let upserts_before = update.chains_upserted.len();
            let names: Vec<(IpFamily, String)> =
                chains.iter().map(|(f, c)| (*f, c.name.clone())).collect();
            let wanted: BTreeSet<&(IpFamily, String)> = names.iter().collect();
            for old in self.owned.remove(&owner).unwrap_or_default() {
                if !wanted.contains(&old) && self.emitted_chains.remove(&old).is_some() {
                    update.chains_removed.push(old);
                }
            }
            for (family, chain) in chains {
                let slot = (family, chain.name.clone());
                if self.emitted_chains.get(&slot).map(|c| &**c) != Some(&chain) {
                    let chain = Arc::new(chain);
                    self.emitted_chains.insert(slot, chain.clone());
                    update.chains_upserted.push((family, chain));
                }
            }
            let changed = update.chains_upserted.len() > upserts_before;
            if let (true, Some(at)) = (changed, since.remove(&owner)) {
                let touched: Vec<&ObjectKey> = match &owner {
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
                };
                for ep in touched {
                    let t = starts.entry(ep.clone()).or_insert(at);
                    *t = (*t).min(at);
                }
            }
            if !names.is_empty() {
                self.owned.insert(owner, names);
            }
        }
        self.programming_starts.extend(starts.into_values());
        // A chain handed from one owner to another in the same flush is upserted, not removed.
        let upserted: BTreeSet<(IpFamily, String)> = update
            .chains_upserted
            .iter()
            .map(|(f, c)| (*f, c.name.clone()))
            .collect();
        update.chains_removed.retain(|c| !upserted.contains(c));
        update
    }

    /// Brings the union sets of the dirty endpoints up to date (before their chains are
    /// rendered, which name them): the new ones are taken first, so a set both versions
    /// use is not churned.
    pub(super) fn update_endpoint_unions(&mut self) {
        let dirty: Vec<ObjectKey> = self
            .dirty
            .owners
            .iter()
            .filter_map(|o| match o {
                Owner::Endpoint(key) => Some(key.clone()),
                _ => None,
            })
            .collect();
        for key in dirty {
            let now = self.wanted_unions(&key);
            let ids = [0, 1].map(|i| now[i].as_ref().map(|u| u.id.clone()));
            let before = self.endpoint_unions.remove(&key).unwrap_or_default();
            if ids == before {
                if ids.iter().any(Option::is_some) {
                    self.endpoint_unions.insert(key, before);
                }
                continue;
            }
            for plan in now.iter().flatten() {
                self.unions.acquire(plan);
            }
            for id in before.iter().flatten() {
                self.unions.release(id);
            }
            if ids.iter().any(Option::is_some) {
                self.endpoint_unions.insert(key, ids);
            }
        }
    }

    /// The union sets an endpoint's ingress and egress chains should match: none unless it
    /// owns its interface (the chains are rendered) and passes the threshold.
    pub(super) fn wanted_unions(&self, key: &ObjectKey) -> [Option<UnionPlan>; 2] {
        let cfg = &self.cfg.rules;
        if cfg.policy_union_min == 0 {
            return [None, None];
        }
        let Some(ep) = self.endpoints.get(key) else {
            return [None, None];
        };
        let winner = self
            .iface_claims
            .get(&ep.iface)
            .and_then(|claims| claims.first());
        if winner != Some(key) {
            return [None, None];
        }
        let (ingress, egress) = self.isolating(ep);
        let plans = |keys: &[ObjectKey]| -> Vec<&PolicyPlan> {
            keys.iter()
                .filter_map(|k| self.policies.get(k).map(|p| &p.plan))
                .collect()
        };
        [
            union_plan(cfg, Direction::Ingress, &plans(&ingress)),
            union_plan(cfg, Direction::Egress, &plans(&egress)),
        ]
    }

    /// The union set ids an endpoint's chains match (ingress, egress).
    pub(super) fn endpoint_union_ids(&self, key: &ObjectKey) -> [Option<&str>; 2] {
        match self.endpoint_unions.get(key) {
            Some([i, e]) => [i.as_deref(), e.as_deref()],
            None => [None, None],
        }
    }

    pub(super) fn flush_sets(&mut self, update: &mut Update) {
        let families = self.cfg.families.clone();
        let mut pending: Vec<(String, set_index::PendingSet)> = self.sets.pending.drain().collect();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, change) in pending {
            let now = self.sets.set_by_id(&id).map(|s| s.def.clone());
            let was = self.emitted_sets.contains_key(&id);
            match (was, now) {
                (false, Some(def)) => {
                    for family in &families {
                        update.sets_created.push(SetHeader {
                            name: set_name(*family, &id),
                            family: *family,
                            set_type: def.set_type(),
                        });
                    }
                    self.emitted_sets.insert(id.clone(), def);
                    add_member_changes(update, &families, &id, &change.members, true);
                }
                (true, Some(_)) => {
                    add_member_changes(update, &families, &id, &change.members, true);
                    add_member_changes(update, &families, &id, &change.members, false);
                }
                (true, None) => {
                    self.emitted_sets.remove(&id);
                    for family in &families {
                        update.sets_removed.push((*family, set_name(*family, &id)));
                    }
                }
                (false, None) => {}
            }
        }
    }

    pub(super) fn render_owner(&self, owner: &Owner) -> Vec<(IpFamily, Chain)> {
        let cfg = &self.cfg.rules;
        let mut out = Vec::new();
        for &family in &self.cfg.families {
            let chains: Vec<Chain> = match owner {
                Owner::Static => static_chains(cfg, family, self.guard_active()),
                Owner::Guard => self.guard_chains(family),
                Owner::Dispatch => {
                    let ifaces: Vec<String> = self.iface_claims.keys().cloned().collect();
                    dispatch_chains_with_addrs(cfg, family, &ifaces, &self.endpoint_addrs())
                }
                Owner::Profile(ns) => {
                    if self.endpoints_by_ns.contains_key(ns) {
                        profile_chains(cfg, family, ns).into()
                    } else {
                        Vec::new()
                    }
                }
                Owner::Policy(key) => match self.policies.get(key) {
                    Some(p) if !p.selects.is_empty() => {
                        policy_chains(cfg, family, &p.info, &p.plan, &|def| {
                            set_name(family, &def.id())
                        })
                    }
                    _ => Vec::new(),
                },
                Owner::ClusterPolicy(name) => match self.cluster_policies.get(name) {
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
    pub(super) fn endpoint_addrs(&self) -> Vec<(std::net::IpAddr, String)> {
        if self.cfg.rules.bridge.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (iface, claims) in &self.iface_claims {
            let Some(pod) = claims.first().and_then(|k| self.sets.pod(k)) else {
                continue;
            };
            out.extend(pod.ips.iter().map(|ip| (*ip, iface.clone())));
        }
        out
    }

    pub(super) fn endpoint_chains(&self, key: &ObjectKey, family: IpFamily) -> Vec<Chain> {
        let Some(ep) = self.endpoints.get(key) else {
            return Vec::new();
        };
        let winner = self
            .iface_claims
            .get(&ep.iface)
            .and_then(|claims| claims.first());
        if winner != Some(key) {
            return Vec::new();
        }
        let (ingress, egress) = self.isolating(ep);
        let [admin_in, admin_out, baseline_in, baseline_out] = self.endpoint_cluster_policies(key);
        let addrs = self.sets.pod(key).map(|p| &*p.ips).unwrap_or_default();
        let [union_in, union_out] = self.endpoint_union_ids(key);
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
}
