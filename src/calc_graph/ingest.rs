//! The graph's object-level entry points: Kubernetes objects (and datastore events) are
//! validated here, then handed to the model-level events (`model_events`); a rejected object is
//! recorded with why (`rejections`), and its last valid version stays in force.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::model::validate;
use crate::model::{ClusterNetworkPolicy, DatastoreEvent, K8sObject, ObjectKey, ObjectKind};

use super::{CalcGraph, RejectKind};

impl CalcGraph {
    /// Applies one datastore event.
    pub fn apply(&mut self, event: &DatastoreEvent) {
        match event {
            DatastoreEvent::Upsert(o) => match o.as_ref() {
                K8sObject::Pod(p) => self.upsert_pod(p),
                K8sObject::Namespace(n) => self.upsert_namespace(n),
                K8sObject::NetworkPolicy(np) => self.upsert_policy(np),
                K8sObject::ClusterNetworkPolicy(cnp) => self.upsert_cluster_policy(cnp),
                // Staged policies are never enforced: they never reach the rules (issue 23;
                // the evaluator reads them, see `verdict::staged`).
                K8sObject::StagedNetworkPolicy(_) | K8sObject::StagedClusterNetworkPolicy(_) => {}
            },
            DatastoreEvent::Delete(r) => {
                let key = || {
                    let (ns, name) = r.key.split_once('/').unwrap_or(("default", &r.key));
                    ObjectKey::new(ns, name)
                };
                match r.kind {
                    ObjectKind::Pod => self.remove_pod(&key()),
                    ObjectKind::Namespace => self.remove_namespace(&r.key),
                    ObjectKind::NetworkPolicy => self.remove_policy(&key()),
                    ObjectKind::ClusterNetworkPolicy => self.remove_cluster_policy(&r.key),
                    ObjectKind::StagedNetworkPolicy | ObjectKind::StagedClusterNetworkPolicy => {}
                }
            }
            DatastoreEvent::InSync | DatastoreEvent::Access { .. } => {}
        }
    }

    /// Feeds objects in an order that needs no second pass: namespaces, then pods, then
    /// policies, then cluster policies (any order is correct; this one does the least
    /// re-evaluation).
    pub fn feed(&mut self, objects: &[K8sObject]) {
        for o in objects {
            if let K8sObject::Namespace(ns) = o {
                self.upsert_namespace(ns);
            }
        }
        for o in objects {
            if let K8sObject::Pod(p) = o {
                self.upsert_pod(p);
            }
        }
        for o in objects {
            if let K8sObject::NetworkPolicy(np) = o {
                self.upsert_policy(np);
            }
        }
        for o in objects {
            if let K8sObject::ClusterNetworkPolicy(cnp) = o {
                self.upsert_cluster_policy(cnp);
            }
        }
    }

    /// Validates and applies a Pod. An invalid pod is logged and recorded; its previous valid
    /// version (if any) stays in force. A pod that is not a workload is removed.
    pub fn upsert_pod(&mut self, pod: &Pod) {
        let key = validate::namespaced_key(&pod.metadata);
        match validate::pod(pod) {
            Ok(Some(info)) => {
                self.rejections.accept(ObjectKind::Pod, &key.to_string());
                self.upsert_pod_info(info);
            }
            Ok(None) => {
                self.rejections.accept(ObjectKind::Pod, &key.to_string());
                self.remove_pod(&key);
            }
            Err(e) => self.rejections.reject(
                ObjectKind::Pod,
                key.to_string(),
                RejectKind::Invalid,
                e.to_string(),
            ),
        }
    }

    pub fn upsert_namespace(&mut self, ns: &Namespace) {
        let name = ns.metadata.name.clone().unwrap_or_default();
        match validate::namespace(ns) {
            Ok(info) => {
                self.rejections.accept(ObjectKind::Namespace, &name);
                self.upsert_namespace_info(info);
            }
            Err(e) => self.rejections.reject(
                ObjectKind::Namespace,
                name,
                RejectKind::Invalid,
                e.to_string(),
            ),
        }
    }

    pub fn upsert_policy(&mut self, np: &NetworkPolicy) {
        let key = validate::namespaced_key(&np.metadata);
        match validate::network_policy(np) {
            Ok(info) => {
                self.rejections
                    .accept(ObjectKind::NetworkPolicy, &key.to_string());
                self.upsert_policy_info(info);
            }
            Err(e) => self.rejections.reject(
                ObjectKind::NetworkPolicy,
                key.to_string(),
                RejectKind::Invalid,
                e.to_string(),
            ),
        }
    }

    /// Validates and applies a ClusterNetworkPolicy. An invalid one is logged and recorded;
    /// its previous valid version (if any) stays in force.
    pub fn upsert_cluster_policy(&mut self, cnp: &ClusterNetworkPolicy) {
        let name = cnp.metadata.name.clone().unwrap_or_default();
        match validate::cluster_network_policy(cnp) {
            Ok(info) => {
                self.rejections
                    .accept(ObjectKind::ClusterNetworkPolicy, &name);
                self.upsert_cluster_policy_info(info);
            }
            Err(e) => self.rejections.reject(
                ObjectKind::ClusterNetworkPolicy,
                name,
                RejectKind::Invalid,
                e.to_string(),
            ),
        }
    }
}
