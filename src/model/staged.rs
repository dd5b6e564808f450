//! Staged policies (issue 23): `StagedNetworkPolicy` and `StagedClusterNetworkPolicy`
//! (`netpol-agent.io/v1alpha1`), and Calico's `StagedKubernetesNetworkPolicy`
//! (`projectcalico.org/v3`, read from files so that users coming from Calico can bring theirs),
//! as datastores deliver them, and their validated form ([`StagedInfo`]).
//!
//! The shape is Calico's: the enforced kind's `metadata` and `spec`, with `spec.stagedAction`
//! (`Set`, the default, or `Delete`). A staged object pairs with the enforced object of the same
//! namespace and name (cluster policies: the same name): `Set` means "as if that object were
//! created or replaced by this spec", `Delete` "as if it were deleted".
//!
//! What this module guarantees: staged objects are a model of their own, never a
//! `NetworkPolicy` or `ClusterNetworkPolicy`, so nothing that renders rules can take one for
//! an enforced object by mistake; only the evaluator (`verdict`) reads [`StagedInfo`].
//!
//! Plain serde types with a hand-written `kube::Resource` impl, for the reasons given in
//! `cluster_policy`: every field is optional so that a missing one becomes a validation error
//! naming it, never a parse failure of the whole document.
//!
//! Staged policies at each layer: the objects in `model::staged`, validated in
//! `model::validate::staged`, applied only in the evaluator's what-if state in
//! `verdict::staged`, the pending verdicts of flow records in `traffic::staged`, the `staged`
//! commands in `inspect::staged`.

use std::fmt;

use k8s_openapi::api::networking::v1::NetworkPolicySpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::cluster_policy::ClusterNetworkPolicySpec;
use super::{ClusterPolicyInfo, ObjectKey, PolicyInfo};

pub const GROUP: &str = "netpol-agent.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "netpol-agent.io/v1alpha1";
pub const KIND: &str = "StagedNetworkPolicy";
pub const PLURAL: &str = "stagednetworkpolicies";
pub const CLUSTER_KIND: &str = "StagedClusterNetworkPolicy";
pub const CLUSTER_PLURAL: &str = "stagedclusternetworkpolicies";
/// Calico's API group and version, and its staged form of a Kubernetes NetworkPolicy (same
/// spec as ours; read from manifests and directories only: Calico serves it through its own
/// API server, which does not run where this agent runs).
pub const CALICO_API_VERSION: &str = "projectcalico.org/v3";
pub const CALICO_KIND: &str = "StagedKubernetesNetworkPolicy";

/// A staged NetworkPolicy: ours, or Calico's `StagedKubernetesNetworkPolicy` (`calico`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StagedNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<StagedNetworkPolicySpec>,
    /// Read as Calico's kind (written back as such); the same object for pairing.
    #[serde(skip)]
    pub calico: bool,
}

/// A NetworkPolicy's spec plus `stagedAction`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StagedNetworkPolicySpec {
    #[serde(
        rename = "stagedAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub staged_action: Option<String>,
    #[serde(flatten)]
    pub policy: NetworkPolicySpec,
}

/// A staged ClusterNetworkPolicy (cluster-scoped).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StagedClusterNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<StagedClusterNetworkPolicySpec>,
}

/// A ClusterNetworkPolicy's spec plus `stagedAction`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StagedClusterNetworkPolicySpec {
    #[serde(
        rename = "stagedAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub staged_action: Option<String>,
    #[serde(flatten)]
    pub policy: ClusterNetworkPolicySpec,
}

/// `apiVersion` and `kind` are written, not stored (as for ClusterNetworkPolicy), so that a
/// list item and a watch event of the same object compare equal.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a, S: Serialize> {
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: &'a Option<S>,
}

impl Serialize for StagedNetworkPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (api_version, kind) = if self.calico {
            (CALICO_API_VERSION, CALICO_KIND)
        } else {
            (API_VERSION, KIND)
        };
        Manifest {
            api_version,
            kind,
            metadata: &self.metadata,
            spec: &self.spec,
        }
        .serialize(serializer)
    }
}

impl Serialize for StagedClusterNetworkPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Manifest {
            api_version: API_VERSION,
            kind: CLUSTER_KIND,
            metadata: &self.metadata,
            spec: &self.spec,
        }
        .serialize(serializer)
    }
}

custom_resource!(
    StagedNetworkPolicy,
    k8s_openapi::NamespaceResourceScope,
    KIND,
    GROUP,
    VERSION,
    PLURAL
);

custom_resource!(
    StagedClusterNetworkPolicy,
    k8s_openapi::ClusterResourceScope,
    CLUSTER_KIND,
    GROUP,
    VERSION,
    CLUSTER_PLURAL
);

// ---- the validated form ----

/// What a staged object would do to its enforced partner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StagedAction {
    /// Create or replace the enforced object with this spec.
    Set,
    /// Delete the enforced object.
    Delete,
}

impl StagedAction {
    pub fn as_str(self) -> &'static str {
        match self {
            StagedAction::Set => "Set",
            StagedAction::Delete => "Delete",
        }
    }
}

/// The enforced object a staged one pairs with, and what it would become (`None`: deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StagedTarget {
    NetworkPolicy {
        key: ObjectKey,
        set: Option<PolicyInfo>,
    },
    ClusterNetworkPolicy {
        name: String,
        set: Option<ClusterPolicyInfo>,
    },
}

/// A validated staged object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedInfo {
    /// The kind it was written as: `StagedNetworkPolicy`, `StagedKubernetesNetworkPolicy` or
    /// `StagedClusterNetworkPolicy`.
    pub kind: &'static str,
    pub target: StagedTarget,
}

impl StagedInfo {
    pub fn action(&self) -> StagedAction {
        match &self.target {
            StagedTarget::NetworkPolicy { set: Some(_), .. }
            | StagedTarget::ClusterNetworkPolicy { set: Some(_), .. } => StagedAction::Set,
            _ => StagedAction::Delete,
        }
    }

    /// `namespace/name`, or the name of a cluster-scoped one.
    pub fn name(&self) -> String {
        match &self.target {
            StagedTarget::NetworkPolicy { key, .. } => key.to_string(),
            StagedTarget::ClusterNetworkPolicy { name, .. } => name.clone(),
        }
    }

    /// The kind of the enforced partner.
    pub fn enforced_kind(&self) -> &'static str {
        match &self.target {
            StagedTarget::NetworkPolicy { .. } => "NetworkPolicy",
            StagedTarget::ClusterNetworkPolicy { .. } => "ClusterNetworkPolicy",
        }
    }

    /// Which enforced object it pairs with: two staged objects with the same partner are
    /// the same staged change (the later one wins, as for duplicates of enforced objects).
    pub fn partner(&self) -> (&'static str, String) {
        (self.enforced_kind(), self.name())
    }
}

impl fmt::Display for StagedInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.name())
    }
}
