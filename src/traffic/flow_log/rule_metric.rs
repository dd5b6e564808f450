//! The per-policy-rule hit metric of flow logs, `netpol_flow_rule_connections_total`: the
//! connections each deciding policy rule started, taken from the finished records at each
//! flush (one counter update per record, none per packet, no kernel counter per rule).
//!
//! Labels: `kind` (`NetworkPolicy`, `ClusterNetworkPolicy`, or empty when no policy's rule
//! decided), `namespace` and `policy` (empty for a ClusterNetworkPolicy's namespace and for
//! the no-rule series), `rule` (the index in the policy's `ingress`/`egress` list; empty for
//! the no-rule series), `action` (`allow`/`deny`) and `direction`. The no-rule series are
//! "no policy isolates the pod" (action `allow`) and "isolated, no rule allowed" (`deny`), per
//! direction: four at most. Drops of the interface of no local pod and records whose chain
//! changed before it was read are not policy rules and are left out (the former are
//! `netpol_denied_unknown_interface_packets_total`).
//!
//! Bounded cardinality: a series exists only for a rule that decided a logged connection on
//! this node, and at each flush the series of policies the agent no longer renders (deleted,
//! or selecting no local pod) are removed; so at most one series per rule and direction of the
//! policies in force on the node (a policy that shrank keeps its former rules' series until it
//! goes), plus the four no-rule series.

use std::collections::HashSet;

use crate::model::ObjectKey;
use crate::rules::cluster::cluster_policy_chain;
use crate::rules::{policy_chain, Direction};
use crate::traffic::attribution::LocalChains;

use super::{FlowRecord, PolicyHit};

/// The policy a series belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Owner {
    Policy(ObjectKey),
    Cluster(String),
}

/// One series' labels and its owner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Series {
    /// `None`: a no-rule series, never removed.
    owner: Option<Owner>,
    labels: [String; 6],
}

impl Series {
    fn of(r: &FlowRecord) -> Option<Series> {
        let k = &r.key;
        let action = k.action.verdict().to_string();
        let direction = k.reporter.as_str().to_string();
        let (owner, kind, namespace, policy, rule) = match &k.hit {
            PolicyHit::Rule { policy, rule } => (
                Some(Owner::Policy(policy.clone())),
                "NetworkPolicy",
                policy.namespace.to_string(),
                policy.name.to_string(),
                rule.to_string(),
            ),
            PolicyHit::ClusterRule { name, rule, .. } => (
                Some(Owner::Cluster(name.clone())),
                "ClusterNetworkPolicy",
                String::new(),
                name.clone(),
                rule.to_string(),
            ),
            PolicyHit::NoPolicy | PolicyHit::Isolated(_) => {
                (None, "", String::new(), String::new(), String::new())
            }
            PolicyHit::UnknownInterface | PolicyHit::Unknown { .. } => return None,
        };
        Some(Series {
            owner,
            labels: [kind.to_string(), namespace, policy, rule, action, direction],
        })
    }

    fn labels(&self) -> [&str; 6] {
        [
            &self.labels[0],
            &self.labels[1],
            &self.labels[2],
            &self.labels[3],
            &self.labels[4],
            &self.labels[5],
        ]
    }

    /// Whether the policy this series counts is still rendered on the node.
    fn live(&self, chains: &LocalChains) -> bool {
        // Both directions' chains are in the map for every rendered policy; one suffices.
        match &self.owner {
            None => true,
            Some(Owner::Policy(p)) => chains
                .policy_of_chain(&policy_chain(Direction::Ingress, &p.namespace, &p.name))
                .is_some(),
            Some(Owner::Cluster(name)) => chains
                .cluster_owner(&cluster_policy_chain(Direction::Ingress, name))
                .is_some(),
        }
    }
}

/// The series this agent has exported, to remove those of policies gone.
#[derive(Default)]
pub struct RuleHits {
    exported: HashSet<Series>,
}

impl RuleHits {
    /// Adds a flush's finished records to the metric, then removes the series of policies
    /// `chains` (the agent's current rendering) no longer holds.
    pub fn count(&mut self, records: &[FlowRecord], chains: &LocalChains) {
        let m = &crate::telemetry::metrics::global().flow_rule_connections;
        for r in records.iter().filter(|r| r.connections > 0) {
            let Some(series) = Series::of(r) else {
                continue;
            };
            m.with_label_values(&series.labels()).inc_by(r.connections);
            self.exported.insert(series);
        }
        self.exported.retain(|s| {
            let live = s.live(chains);
            if !live {
                let _ = m.remove_label_values(&s.labels());
            }
            live
        });
    }
}
