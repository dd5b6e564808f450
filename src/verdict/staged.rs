//! Staged policies in the evaluator (issue 23): the state "as if the staged objects were
//! enforced", built from the enforced one, and the decision of one flow under it. This is the
//! only place staged objects take effect; the rule renderers never see them.
//!
//! A staged `Set` replaces (or adds) the enforced object of the same namespace and name, a
//! `Delete` removes it (Calico's pairing). [`State::staging`] builds one state with every
//! staged object applied (the pending verdict) and one per staged object applied alone (which
//! staged object changes what). Both reuse the enforced state's pods and node addresses in the
//! same order, so a [`ResolvedFlow`] of the enforced state is valid in every staged one and a
//! flow is resolved once.
//!
//! Cost: a staged state is a rebuild of the evaluator's indices (policies per pod), so building
//! a [`Staging`] costs (1 + staged objects) rebuilds. Staged objects are few (each is an
//! operator's change under review), which is what bounds this and the per-object metric.
//!
//! Staged policies at each layer: the objects in `model::staged`, validated in
//! `model::validate::staged`, applied only in the evaluator's what-if state in
//! `verdict::staged`, the pending verdicts of flow records in `traffic::staged`, the `staged`
//! commands in `inspect::staged`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::model::{ObjectKey, RuleAction, StagedInfo, StagedTarget};
use crate::rules::Direction;

use super::{Action, DirectionVerdict, NpOutcome, ResolvedFlow, Side, State, TierDetail};

/// A policy that decided one direction, in Goldmane's shape (`kind`, `namespace`, `name`,
/// `tier`, `action`, `rule_index`; -1 when no rule matched and isolation denied).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DecidingPolicy {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub tier: String,
    pub action: &'static str,
    pub rule_index: i64,
}

impl DecidingPolicy {
    pub fn to_json(&self) -> Value {
        json!({
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "tier": self.tier,
            "action": self.action,
            "rule_index": self.rule_index,
        })
    }
}

/// The enforced state with every staged object applied, and with each applied alone.
pub struct Staging {
    /// The pending state: every staged object applied.
    pub all: State,
    /// Per staged object (in [`State::staged`] order), the state with only it applied.
    pub each: Vec<State>,
}

impl State {
    /// Sets the staged objects (replacing any before). Two staged objects pairing with the
    /// same enforced object are one change: the later wins.
    pub fn set_staged(&mut self, staged: impl IntoIterator<Item = StagedInfo>) {
        let mut by_partner: BTreeMap<(&'static str, String), StagedInfo> = BTreeMap::new();
        for s in staged {
            by_partner.insert(s.partner(), s);
        }
        self.staged = by_partner.into_values().collect();
    }

    /// The staged objects, ordered by their enforced partner (kind, then name).
    pub fn staged(&self) -> &[StagedInfo] {
        &self.staged
    }

    /// This state as if the staged objects `pick` accepts were enforced (the result has no
    /// staged objects of its own).
    pub fn with_staged(&self, pick: impl Fn(&StagedInfo) -> bool) -> State {
        let mut policies: BTreeMap<ObjectKey, _> = self
            .policies
            .iter()
            .map(|p| (p.key.clone(), p.clone()))
            .collect();
        let mut cluster: BTreeMap<String, _> = self
            .cluster
            .iter()
            .map(|p| (p.name.clone(), p.clone()))
            .collect();
        for s in self.staged.iter().filter(|s| pick(s)) {
            match &s.target {
                StagedTarget::NetworkPolicy { key, set } => match set {
                    Some(p) => {
                        policies.insert(key.clone(), p.clone());
                    }
                    None => {
                        policies.remove(key);
                    }
                },
                StagedTarget::ClusterNetworkPolicy { name, set } => match set {
                    Some(p) => {
                        cluster.insert(name.clone(), p.clone());
                    }
                    None => {
                        cluster.remove(name);
                    }
                },
            }
        }
        let mut state = State::new(
            self.cfg.clone(),
            self.namespaces.values().cloned(),
            self.pods.iter().cloned(),
            policies.into_values(),
        );
        state.set_cluster_policies(cluster.into_values());
        state.interfaces = self.interfaces.clone();
        state.hosts = self.hosts.clone();
        state.non_workloads = self.non_workloads.clone();
        state.declared = self.declared.clone();
        state
    }

    /// The pending state and one state per staged object.
    pub fn staging(&self) -> Staging {
        Staging {
            all: self.with_staged(|_| true),
            each: (0..self.staged.len())
                .map(|i| {
                    let only = &self.staged[i];
                    self.with_staged(|s| std::ptr::eq(s, only))
                })
                .collect(),
        }
    }

    /// The decision for a flow, of one direction (what the node reporting that direction
    /// decides: egress at the source's node, ingress at the destination's) or of the whole
    /// path (`None`). Cheap: no report is built.
    pub fn decision(&self, flow: &ResolvedFlow, direction: Option<Direction>) -> Action {
        let allowed = match direction {
            None => self.allowed(flow),
            Some(_) if matches!((&flow.src, &flow.dst), (Side::Pod(a), Side::Pod(b)) if a == b) => {
                true
            }
            Some(Direction::Egress) => match &flow.src {
                Side::Pod(i) => {
                    self.direction_allows(Direction::Egress, *i, flow) && self.to_host_allowed(flow)
                }
                _ => true,
            },
            Some(Direction::Ingress) => match &flow.dst {
                Side::Pod(i) if !self.is_from_own_node(flow, *i) => {
                    self.direction_allows(Direction::Ingress, *i, flow)
                }
                _ => true,
            },
        };
        if allowed {
            Action::Allow
        } else {
            Action::Deny
        }
    }
}

/// The policies that decided one direction of a verdict: the allowing rule, the policies
/// whose isolation denied, the ClusterNetworkPolicy rules that matched (a Pass included).
/// A policy that a staged `Set` stands in for is named by the staged kind, as Calico's
/// pending policies are.
pub fn deciding_policies(d: &DirectionVerdict, staged: &[StagedInfo]) -> Vec<DecidingPolicy> {
    let np_kind = |key: &ObjectKey| {
        staged
            .iter()
            .find(|s| matches!(&s.target, StagedTarget::NetworkPolicy { key: k, set: Some(_) } if k == key))
            .map_or("NetworkPolicy", |s| s.kind)
    };
    let cluster_kind = |name: &str| {
        staged
            .iter()
            .find(|s| matches!(&s.target, StagedTarget::ClusterNetworkPolicy { name: n, set: Some(_) } if n == name))
            .map_or("ClusterNetworkPolicy", |s| s.kind)
    };
    let mut out = Vec::new();
    for t in &d.tiers {
        match &t.detail {
            TierDetail::NetworkPolicy(np) => match &np.outcome {
                NpOutcome::Allowed(m) => out.push(DecidingPolicy {
                    kind: np_kind(&m.policy),
                    namespace: m.policy.namespace.clone(),
                    name: m.policy.name.clone(),
                    tier: "default".into(),
                    action: "Allow",
                    rule_index: m.rule as i64,
                }),
                NpOutcome::Denied { .. } => {
                    out.extend(np.policies.iter().map(|(key, _)| DecidingPolicy {
                        kind: np_kind(key),
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        tier: "default".into(),
                        action: "Deny",
                        rule_index: -1,
                    }))
                }
                NpOutcome::NotIsolated { .. } => {}
            },
            TierDetail::Cluster(c) => {
                if let Some(m) = &c.matched {
                    out.push(DecidingPolicy {
                        kind: cluster_kind(&m.policy),
                        namespace: String::new(),
                        name: m.policy.clone(),
                        tier: c.tier.as_str().into(),
                        action: match m.effect() {
                            RuleAction::Accept => "Allow",
                            RuleAction::Deny => "Deny",
                            RuleAction::Pass => "Pass",
                        },
                        rule_index: m.rule as i64,
                    });
                }
            }
        }
    }
    out
}
