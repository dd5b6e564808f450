//! What one direction's flow record must say, from explain's verdict: [`want_of`] reads the
//! verdict itself (the simulated clusters, where the runner evaluates the step's objects
//! with the agent's library), [`want_of_json`] the same fields of `explain --output json`
//! (a real cluster, where the agents' own explain answers); a unit test holds the two equal.

use netpol_agent::verdict::{Action, DirectionVerdict, NpOutcome, TierDetail};
use serde_json::Value;

/// A policy as `policies.enforced_policies[]` names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Enforced {
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) action: String,
    pub(crate) rule_index: i64,
}

impl Enforced {
    fn network_policy(namespace: &str, name: &str, action: &str, rule_index: i64) -> Enforced {
        Enforced {
            kind: "NetworkPolicy".into(),
            namespace: namespace.into(),
            name: name.into(),
            action: action.into(),
            rule_index,
        }
    }
}

/// What one direction's record must say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Required: a NetworkPolicy decided, or none isolates the pod.
    Record {
        action: &'static str,
        verdict: &'static str,
        policies: Vec<Enforced>,
    },
    /// A ClusterNetworkPolicy decided (`Admin`/`Baseline`, its name, the rule's index in
    /// `ingress`/`egress`, allow or deny).
    Cluster {
        tier: &'static str,
        name: String,
        rule: i64,
        action: &'static str,
    },
}

impl Want {
    /// No policy of the direction isolates the pod: allowed by its namespace profile.
    fn unisolated() -> Want {
        Want::Record {
            action: "Allow",
            verdict: "no policy isolates the pod",
            policies: Vec::new(),
        }
    }

    /// Allowed by rule `rule` of the NetworkPolicy `namespace/name`.
    fn allowed_by(namespace: &str, name: &str, rule: i64) -> Want {
        Want::Record {
            action: "Allow",
            verdict: "rule",
            policies: vec![Enforced::network_policy(namespace, name, "Allow", rule)],
        }
    }

    /// Denied: isolated by these NetworkPolicies (`namespace`, `name`), no rule allowed.
    fn isolated_by<'a>(policies: impl Iterator<Item = (&'a str, &'a str)>) -> Want {
        let mut policies: Vec<Enforced> = policies
            .map(|(ns, name)| Enforced::network_policy(ns, name, "Deny", -1))
            .collect();
        policies.sort();
        Want::Record {
            action: "Deny",
            verdict: "isolated, no rule allowed",
            policies,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Want::Record {
                action,
                verdict,
                policies,
            } => {
                let names: Vec<String> = policies
                    .iter()
                    .map(|p| format!("{}/{} rule {}", p.namespace, p.name, p.rule_index))
                    .collect();
                format!("{action} ({verdict}) [{}]", names.join(", "))
            }
            Want::Cluster {
                tier,
                name,
                rule,
                action,
            } => format!("{action} by ClusterNetworkPolicy {tier}/{name} rule {rule}"),
        }
    }
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    }
}

/// What explain says one direction's record must hold; `None` when the direction is not
/// policed at all (no record).
pub(crate) fn want_of(d: &DirectionVerdict) -> Option<Want> {
    if d.unpoliced.is_some() {
        return None;
    }
    // The tiers ran in order and the last one decided, or none did (allowed by the profile).
    let decider = d.tiers.last().filter(|t| t.decision.is_some());
    Some(match decider.map(|t| &t.detail) {
        None => Want::unisolated(),
        Some(TierDetail::NetworkPolicy(report)) => match &report.outcome {
            NpOutcome::Allowed(m) => Want::allowed_by(
                &m.policy.namespace,
                &m.policy.name,
                i64::try_from(m.rule).unwrap_or(i64::MAX),
            ),
            NpOutcome::Denied { .. } => Want::isolated_by(
                report
                    .policies
                    .iter()
                    .map(|(k, _)| (k.namespace.as_str(), k.name.as_str())),
            ),
            NpOutcome::NotIsolated { .. } => Want::unisolated(),
        },
        Some(TierDetail::Cluster(c)) => Want::Cluster {
            tier: match c.tier {
                netpol_agent::model::Tier::Admin => "Admin",
                netpol_agent::model::Tier::Baseline => "Baseline",
            },
            name: c
                .matched
                .as_ref()
                .map(|m| m.policy.clone())
                .unwrap_or_default(),
            rule: c
                .matched
                .as_ref()
                .map_or(-1, |m| i64::try_from(m.rule).unwrap_or(i64::MAX)),
            action: action_name(d.action),
        },
    })
}

/// `namespace/name` as explain prints a NetworkPolicy (a name alone: no namespace).
fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// [`want_of`] for one side of `explain --output json` (`egress`/`ingress`, as the agent's
/// explain prints it on a real cluster): the same reading of the same fields.
pub(crate) fn want_of_json(d: &Value) -> Option<Want> {
    if d["policed"] == false {
        return None;
    }
    let decider = d["tiers"]
        .as_array()
        .and_then(|t| t.last())
        .filter(|t| t["decision"] != "pass");
    let Some(t) = decider else {
        return Some(Want::unisolated());
    };
    let tier = t["tier"].as_str().unwrap_or("");
    Some(if tier == "NetworkPolicy" {
        if t["result"] == "allowed" {
            let (namespace, name) = split(t["allowed_by"]["policy"].as_str().unwrap_or(""));
            Want::allowed_by(
                namespace,
                name,
                t["allowed_by"]["rule"].as_i64().unwrap_or(i64::MAX),
            )
        } else {
            let isolating = t["isolated_by"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            Want::isolated_by(
                isolating
                    .iter()
                    .map(|p| split(p["policy"].as_str().unwrap_or(""))),
            )
        }
    } else {
        Want::Cluster {
            tier: if tier.ends_with("Baseline") {
                "Baseline"
            } else {
                "Admin"
            },
            name: t["matched"]["policy"].as_str().unwrap_or("").to_string(),
            rule: t["matched"]["rule"].as_i64().unwrap_or(-1),
            action: if d["verdict"] == "allow" {
                "Allow"
            } else {
                "Deny"
            },
        }
    })
}
