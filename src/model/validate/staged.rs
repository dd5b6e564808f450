//! Validation of staged objects into [`StagedInfo`]: the same rules as their enforced kinds
//! (a `Set` is validated as the object it would become, so a staged object the API server
//! would refuse as an enforced one is refused here, naming the field), plus
//! `spec.stagedAction`. An error carries the staged kind, so that a log line never blames
//! an enforced object for a staged one's mistake.

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
    // A Delete names its partner only; its spec (if any) is not read, but the names are
    // checked as the enforced kind's, with an empty spec standing in.
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
            // Names only: the spec of a deletion is not read.
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
