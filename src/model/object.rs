//! The objects as they arrive from a datastore, before validation, and the events that carry
//! them: every source (the Kubernetes API, a watched directory, manifest files) speaks these.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::cluster_policy::ClusterNetworkPolicy;
use super::staged::{StagedClusterNetworkPolicy, StagedNetworkPolicy};
use super::validate::namespaced_key;

// Pods are much larger than the other variants; these values are short-lived (parsed, then
// validated into the model), so boxing would only add noise to every match.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum K8sObject {
    Pod(Pod),
    Namespace(Namespace),
    NetworkPolicy(NetworkPolicy),
    ClusterNetworkPolicy(ClusterNetworkPolicy),
    /// Never enforced: the calc graph ignores staged objects, the evaluator reads them.
    StagedNetworkPolicy(StagedNetworkPolicy),
    StagedClusterNetworkPolicy(StagedClusterNetworkPolicy),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Pod,
    Namespace,
    NetworkPolicy,
    ClusterNetworkPolicy,
    StagedNetworkPolicy,
    StagedClusterNetworkPolicy,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Pod => "Pod",
            ObjectKind::Namespace => "Namespace",
            ObjectKind::NetworkPolicy => "NetworkPolicy",
            ObjectKind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
            ObjectKind::StagedNetworkPolicy => "StagedNetworkPolicy",
            ObjectKind::StagedClusterNetworkPolicy => "StagedClusterNetworkPolicy",
        }
    }
}

/// Which object an event is about (`key` is `namespace/name`, or the name of a namespace or
/// of a cluster-scoped policy).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub key: String,
}

impl K8sObject {
    /// The kind and key of this object.
    pub fn object_ref(&self) -> ObjectRef {
        match self {
            K8sObject::Pod(p) => ObjectRef {
                kind: ObjectKind::Pod,
                key: namespaced_key(&p.metadata).to_string(),
            },
            K8sObject::Namespace(n) => ObjectRef {
                kind: ObjectKind::Namespace,
                key: n.metadata.name.clone().unwrap_or_default(),
            },
            K8sObject::NetworkPolicy(np) => ObjectRef {
                kind: ObjectKind::NetworkPolicy,
                key: namespaced_key(&np.metadata).to_string(),
            },
            K8sObject::ClusterNetworkPolicy(cnp) => ObjectRef {
                kind: ObjectKind::ClusterNetworkPolicy,
                key: cnp.metadata.name.clone().unwrap_or_default(),
            },
            // Calico's StagedKubernetesNetworkPolicy is the same object for pairing.
            K8sObject::StagedNetworkPolicy(s) => ObjectRef {
                kind: ObjectKind::StagedNetworkPolicy,
                key: namespaced_key(&s.metadata).to_string(),
            },
            K8sObject::StagedClusterNetworkPolicy(s) => ObjectRef {
                kind: ObjectKind::StagedClusterNetworkPolicy,
                key: s.metadata.name.clone().unwrap_or_default(),
            },
        }
    }
}

/// What a datastore tells the agent.
#[derive(Clone, Debug)]
pub enum DatastoreEvent {
    Upsert(Box<K8sObject>),
    Delete(ObjectRef),
    /// The first complete listing has been delivered: until then nothing may be removed
    /// from the kernel.
    InSync,
    /// The datastore may not read a kind (`refused`: why, the API server's 401 or 403) or may
    /// again (`None`). Nothing delivered is withdrawn meanwhile: the rules stay as they are,
    /// and the agent is not ready while any kind is refused (its view may be stale).
    Access {
        kind: ObjectKind,
        refused: Option<String>,
    },
}
