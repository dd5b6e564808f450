//! Validation of staged objects into [`StagedInfo`]: the same rules as their enforced kinds
//! (a `Set` is validated as the object it would become, so a staged object the API server
//! would refuse as an enforced one is refused here, naming the field), plus
//! `spec.stagedAction`. An error carries the staged kind, so that a log line never blames
//! an enforced object for a staged one's mistake.
//!
//! Staged policies at each layer: the objects in `model::staged`, validated in
//! `model::validate::staged`, applied only in the evaluator's what-if state in
//! `verdict::staged`, the pending verdicts of flow records in `traffic::staged`, the `staged`
//! commands in `inspect::staged`.

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::cluster::cluster_network_policy;
use super::{namespaced_key, network_policy, ValidationError};
use crate::model::cluster_policy::ClusterNetworkPolicy;
use crate::model::staged::{
    StagedAction, StagedClusterNetworkPolicy, StagedInfo, StagedNetworkPolicy, StagedTarget,
    CALICO_KIND, CLUSTER_KIND, KIND,
};

/// `spec.stagedAction`: `Set` (also when absent, Calico's default) or `Delete`.
fn staged_action(
    value: Option<&str>,
    kind: &'static str,
    object: &str,
) -> Result<StagedAction, ValidationError> {
    match value {
        None | Some("Set") => Ok(StagedAction::Set),
        Some("Delete") => Ok(StagedAction::Delete),
        Some(other) => Err(ValidationError {
            kind,
            object: super::shown_name(object).into_owned(),
            field: "spec.stagedAction".into(),
            message: format!(
                "unknown staged action {}; accepted values are Set (the default) and Delete",
                super::shown(other)
            ),
        }),
    }
}

/// A staged `Delete` carries no rules: every spec field but `stagedAction` (and a cluster
/// policy's `tier`) must be empty, as Calico's validator requires ("Spec fields, except Tier,
/// should all be zero-value if stagedAction is Delete"). A Delete that carries rules is
/// refused rather than read: it would be unclear whether its rules or the deletion is meant,
/// and a staged object is never enforced, so refusing it costs no protection. `spec` is the
/// flattened enforced spec, serialized; null, an empty list and an empty object count as
/// empty (as Go's zero values decode: `podSelector: {}`), an object with any key does not
/// (`subject: {namespaces: {}}` selects every namespace).
fn delete_carries_nothing(
    spec: serde_json::Value,
    allowed: &[&str],
    kind: &'static str,
    object: &str,
) -> Result<(), ValidationError> {
    let serde_json::Value::Object(fields) = spec else {
        return Ok(());
    };
    let carried: Vec<&str> = fields
        .iter()
        .filter(|(name, value)| !allowed.contains(&name.as_str()) && !is_empty(value))
        .map(|(name, _)| name.as_str())
        .collect();
    match carried.first() {
        None => Ok(()),
        Some(first) => Err(ValidationError {
            kind,
            object: super::shown_name(object).into_owned(),
            field: format!("spec.{first}"),
            message: format!(
                "a staged Delete carries no rules, but this one sets {}; a Delete needs only \
                 the name{} of the object it would delete (remove the other fields, as \
                 Calico requires, or use stagedAction: Set to stage a change)",
                carried.join(", "),
                if kind == CLUSTER_KIND {
                    ""
                } else {
                    " and namespace"
                }
            ),
        }),
    }
}

fn is_empty(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => true,
        serde_json::Value::Object(m) => m.is_empty(),
        serde_json::Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The enforced kind's error, told as the staged kind's.
fn as_staged(kind: &'static str) -> impl Fn(ValidationError) -> ValidationError {
    move |e| ValidationError { kind, ..e }
}

/// Validates a `StagedNetworkPolicy` (or Calico's `StagedKubernetesNetworkPolicy`).
pub fn staged_network_policy(s: &StagedNetworkPolicy) -> Result<StagedInfo, ValidationError> {
    let kind = if s.calico { CALICO_KIND } else { KIND };
    let key = namespaced_key(&s.metadata);
    let action = staged_action(
        s.spec
            .as_ref()
            .and_then(|spec| spec.staged_action.as_deref()),
        kind,
        &key.to_string(),
    )?;
    // A Delete names its partner only: it carries no rules, and its names are checked as the
    // enforced kind's, with an empty spec standing in.
    if action == StagedAction::Delete {
        if let Some(spec) = &s.spec {
            delete_carries_nothing(
                serde_json::to_value(&spec.policy).unwrap_or_default(),
                &[],
                kind,
                &key.to_string(),
            )?;
        }
    }
    let enforced = NetworkPolicy {
        metadata: s.metadata.clone(),
        spec: match action {
            StagedAction::Set => s.spec.as_ref().map(|spec| spec.policy.clone()),
            StagedAction::Delete => Some(Default::default()),
        },
    };
    let info = network_policy(&enforced).map_err(as_staged(kind))?;
    Ok(StagedInfo {
        kind,
        target: StagedTarget::NetworkPolicy {
            key: info.key.clone(),
            set: (action == StagedAction::Set).then_some(info),
        },
    })
}

/// Validates a `StagedClusterNetworkPolicy`.
pub fn staged_cluster_network_policy(
    s: &StagedClusterNetworkPolicy,
) -> Result<StagedInfo, ValidationError> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let action = staged_action(
        s.spec
            .as_ref()
            .and_then(|spec| spec.staged_action.as_deref()),
        CLUSTER_KIND,
        &name,
    )?;
    let info = match action {
        StagedAction::Set => Some(
            cluster_network_policy(&ClusterNetworkPolicy {
                metadata: s.metadata.clone(),
                spec: s.spec.as_ref().map(|spec| spec.policy.clone()),
            })
            .map_err(as_staged(CLUSTER_KIND))?,
        ),
        StagedAction::Delete => {
            // Names only: it carries no rules (a tier is allowed, as in Calico).
            if let Some(spec) = &s.spec {
                delete_carries_nothing(
                    serde_json::to_value(&spec.policy).unwrap_or_default(),
                    &["tier"],
                    CLUSTER_KIND,
                    &name,
                )?;
            }
            super::require_name(
                &s.metadata,
                &super::ErrorContext {
                    kind: CLUSTER_KIND,
                    object: &name,
                },
            )?;
            None
        }
    };
    Ok(StagedInfo {
        kind: CLUSTER_KIND,
        target: StagedTarget::ClusterNetworkPolicy { name, set: info },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::staged::StagedNetworkPolicySpec;

    fn staged(yaml: &str) -> StagedNetworkPolicy {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn set_is_the_default_and_delete_needs_no_spec() {
        let s = staged("metadata: {name: deny, namespace: x}\nspec: {podSelector: {}}\n");
        let info = staged_network_policy(&s).unwrap();
        assert_eq!(info.action(), StagedAction::Set);
        assert_eq!(info.name(), "x/deny");
        let StagedTarget::NetworkPolicy { set: Some(p), .. } = &info.target else {
            panic!("{info:?}");
        };
        assert!(p.ingress.as_ref().is_some_and(|r| r.is_empty()));

        let d = staged("metadata: {name: allow, namespace: x}\nspec: {stagedAction: Delete}\n");
        let info = staged_network_policy(&d).unwrap();
        assert_eq!(info.action(), StagedAction::Delete);
        assert_eq!(info.to_string(), "StagedNetworkPolicy x/allow");
    }

    /// A Delete as Calico and a user write it: only `stagedAction` in the spec (Calico's own
    /// shape for `StagedKubernetesNetworkPolicy`, and for a cluster policy a tier), YAML or
    /// JSON; one that carries rules is refused naming the field (issue 35).
    #[test]
    fn a_delete_needs_only_names_and_refuses_rules() {
        for text in [
            "metadata: {name: allow, namespace: x}\nspec: {stagedAction: Delete}\n",
            "{\"metadata\": {\"name\": \"allow\", \"namespace\": \"x\"}, \"spec\": {\"stagedAction\": \"Delete\"}}",
            "metadata: {name: allow, namespace: x}\nspec: {stagedAction: Delete, podSelector: {}, ingress: [], policyTypes: null}\n",
        ] {
            let mut s = staged(text);
            s.calico = true;
            let info = staged_network_policy(&s).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(info.action(), StagedAction::Delete);
            assert_eq!(info.to_string(), "StagedKubernetesNetworkPolicy x/allow");
        }
        let rules = staged(
            "metadata: {name: allow, namespace: x}\nspec: {stagedAction: Delete, podSelector: {matchLabels: {app: a}}, policyTypes: [Ingress]}\n",
        );
        let e = staged_network_policy(&rules).unwrap_err();
        assert_eq!((e.kind, e.field.as_str()), (KIND, "spec.podSelector"));
        assert!(e.message.contains("policyTypes"), "{e}");
        let unnamed = staged("metadata: {namespace: x}\nspec: {stagedAction: Delete}\n");
        assert_eq!(
            staged_network_policy(&unnamed).unwrap_err().field,
            "metadata.name"
        );

        let cluster =
            |text: &str| -> StagedClusterNetworkPolicy { serde_yaml_ng::from_str(text).unwrap() };
        for text in [
            "metadata: {name: old}\nspec: {stagedAction: Delete}\n",
            "metadata: {name: old}\nspec: {stagedAction: Delete, tier: Admin}\n",
        ] {
            let info = staged_cluster_network_policy(&cluster(text)).unwrap();
            assert_eq!(info.action(), StagedAction::Delete, "{text}");
        }
        let e = staged_cluster_network_policy(&cluster(
            "metadata: {name: old}\nspec: {stagedAction: Delete, tier: Admin, priority: 3, subject: {namespaces: {}}}\n",
        ))
        .unwrap_err();
        assert_eq!((e.kind, e.field.as_str()), (CLUSTER_KIND, "spec.priority"));
        assert!(e.message.contains("subject"), "{e}");
    }

    #[test]
    fn errors_name_the_field_and_the_staged_kind() {
        let bad = staged(
            "metadata: {name: p, namespace: x}\nspec: {stagedAction: Enforce, podSelector: {}}\n",
        );
        let e = staged_network_policy(&bad).unwrap_err();
        assert_eq!((e.kind, e.field.as_str()), (KIND, "spec.stagedAction"));
        let mut bad = staged(
            "metadata: {name: p, namespace: x}\nspec:\n  podSelector: {}\n  ingress: [{ports: [{port: 70000}]}]\n",
        );
        bad.calico = true;
        let e = staged_network_policy(&bad).unwrap_err();
        assert_eq!(e.kind, CALICO_KIND);
        assert!(e.field.starts_with("spec.ingress[0].ports[0]"), "{e}");
        let none = StagedNetworkPolicy {
            metadata: Default::default(),
            spec: Some(StagedNetworkPolicySpec::default()),
            calico: false,
        };
        assert_eq!(
            staged_network_policy(&none).unwrap_err().field,
            "metadata.name"
        );
    }

    #[test]
    fn cluster_staged_objects_validate_as_cluster_policies() {
        let s: StagedClusterNetworkPolicy = serde_yaml_ng::from_str(
            "metadata: {name: admin-deny}\nspec:\n  tier: Admin\n  priority: 5\n  subject: {namespaces: {}}\n  ingress: [{action: Deny, from: [{namespaces: {}}]}]\n",
        )
        .unwrap();
        let info = staged_cluster_network_policy(&s).unwrap();
        assert_eq!(info.action(), StagedAction::Set);
        let mut bad = s.clone();
        bad.spec.as_mut().unwrap().policy.priority = Some(5000);
        let e = staged_cluster_network_policy(&bad).unwrap_err();
        assert_eq!((e.kind, e.field.as_str()), (CLUSTER_KIND, "spec.priority"));
        let del: StagedClusterNetworkPolicy =
            serde_yaml_ng::from_str("metadata: {name: old}\nspec: {stagedAction: Delete}\n")
                .unwrap();
        assert_eq!(
            staged_cluster_network_policy(&del).unwrap().action(),
            StagedAction::Delete
        );
    }
}
