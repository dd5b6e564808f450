//! The graph's object-level entry points: Kubernetes objects (and datastore events) are
//! validated here, then handed to the model-level updates; a rejected object is recorded with
//! why, and what it replaced is kept or removed as the rejection says. Also the local pods
//! the agent must name, and the interface names it hands back (`set_interface`).

use super::*;

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
                self.accept(ObjectKind::Pod, &key.to_string());
                self.upsert_pod_info(info);
            }
            Ok(None) => {
                self.accept(ObjectKind::Pod, &key.to_string());
                self.remove_pod(&key);
            }
            Err(e) => self.reject(
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
                self.accept(ObjectKind::Namespace, &name);
                self.upsert_namespace_info(info);
            }
            Err(e) => self.reject(
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
                self.accept(ObjectKind::NetworkPolicy, &key.to_string());
                self.upsert_policy_info(info);
            }
            Err(e) => self.reject(
                ObjectKind::NetworkPolicy,
                key.to_string(),
                RejectKind::Invalid,
                e.to_string(),
            ),
        }
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.rejected.remove(&(ObjectKind::Pod, key.to_string()));
        self.mark_unnamed(key, false);
        self.note_pod_families(key, &[]);
        self.to_name.remove(key);
        self.sets.remove_pod(key);
        self.remove_endpoint(key);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.rejected
            .remove(&(ObjectKind::Namespace, name.to_string()));
        let before = self.sets.namespace_labels(name);
        self.sets.remove_namespace(name);
        if self.sets.namespace_labels(name) != before {
            self.reselect_cluster_namespace(name);
        }
    }

    pub fn remove_policy(&mut self, key: &ObjectKey) {
        self.rejected
            .remove(&(ObjectKind::NetworkPolicy, key.to_string()));
        let Some(entry) = self.policies.remove(key) else {
            return;
        };
        if let Some(keys) = self.policies_by_ns.get_mut(&key.namespace) {
            keys.remove(key);
            if keys.is_empty() {
                self.policies_by_ns.remove(&key.namespace);
            }
        }
        for ep in &entry.selects {
            if let Some(e) = self.endpoints.get_mut(ep) {
                e.policies.remove(key);
            }
            self.dirty.mark(Owner::Endpoint(ep.clone()));
        }
        if !entry.selects.is_empty() {
            for def in entry.plan.set_defs() {
                self.sets.release(&def);
            }
        }
        self.dirty.mark(Owner::Policy(key.clone()));
    }

    /// Local pods upserted since the last call, to be named by the caller (who answers each
    /// with `set_interface` before the next `flush`).
    pub fn take_pods_to_name(&mut self) -> Vec<PodInfo> {
        std::mem::take(&mut self.to_name)
            .into_iter()
            .filter_map(|key| self.sets.pod(&key).map(|p| p.to_info()))
            .collect()
    }

    /// Every local pod, for naming them all again (a resolver learned something: a sandbox,
    /// a route). Answers that do not change a pod's interface change nothing.
    pub fn local_pods(&self) -> Vec<PodInfo> {
        self.sets
            .pods()
            .filter(|p| self.is_local(p.node.as_deref()))
            .map(|p| p.to_info())
            .collect()
    }

    pub(super) fn is_local(&self, node: Option<&str>) -> bool {
        node == Some(self.cfg.node_name.as_str())
    }

    /// The caller's answer for a local pod's host interface: the name, or why it has none (the
    /// pod is then rejected with `RejectKind::Interface` and gets no chains). Ignored for a
    /// pod that is not (or no longer) local.
    pub fn set_interface(&mut self, key: &ObjectKey, iface: Result<String, String>) {
        let Some(info) = self.sets.pod(key) else {
            return;
        };
        if !self.is_local(info.node.as_deref()) {
            return;
        }
        let iface = match iface {
            Ok(name) => {
                self.rejected.remove(&(ObjectKind::Pod, key.to_string()));
                self.mark_unnamed(key, false);
                name
            }
            Err(message) => {
                self.mark_unnamed(key, true);
                self.reject(
                    ObjectKind::Pod,
                    key.to_string(),
                    RejectKind::Interface,
                    message,
                );
                self.remove_endpoint(key);
                return;
            }
        };
        match self.endpoints.get_mut(key) {
            Some(ep) if ep.iface == iface => {}
            Some(ep) => {
                let old = std::mem::replace(&mut ep.iface, iface.clone());
                self.release_iface(&old, key);
                self.claim_iface(&iface, key);
                self.dirty.mark(Owner::Endpoint(key.clone()));
                self.dirty.mark(Owner::Dispatch);
            }
            None => {
                self.endpoints.insert(
                    key.clone(),
                    Endpoint {
                        iface: iface.clone(),
                        policies: BTreeSet::new(),
                        cluster_policies: BTreeSet::new(),
                    },
                );
                let in_ns = self
                    .endpoints_by_ns
                    .entry(key.namespace.clone())
                    .or_default();
                in_ns.insert(key.clone());
                if in_ns.len() == 1 {
                    self.dirty.mark(Owner::Profile(key.namespace.clone()));
                }
                self.claim_iface(&iface, key);
                self.dirty.mark(Owner::Endpoint(key.clone()));
                self.dirty.mark(Owner::Dispatch);
                self.reselect_policies(key);
                self.reselect_cluster_policies(key);
            }
        }
    }
}
