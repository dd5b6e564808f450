//! The model-level events, each routed through the calculators in a fixed order: the set
//! index first (it holds the pods and namespaces the others read labels from), then the
//! interfaces and families, then the selection; every step's effects go to `CalcGraph::route`
//! before the next step reads anything.

use crate::model::{ClusterPolicyInfo, NamespaceInfo, ObjectKey, ObjectKind, PodInfo, PolicyInfo};

use super::{CalcGraph, Owner, RejectKind};

impl CalcGraph {
    pub fn upsert_namespace_info(&mut self, info: NamespaceInfo) {
        let name = info.name.clone();
        let before = self.sets.namespace_labels(&name);
        self.sets.upsert_namespace(info);
        if self.sets.namespace_labels(&name) != before {
            let fx = self.selection.namespace_relabeled(&name, &self.sets);
            self.route(fx);
        }
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.rejections.accept(ObjectKind::Namespace, name);
        let before = self.sets.namespace_labels(name);
        self.sets.remove_namespace(name);
        if self.sets.namespace_labels(name) != before {
            let fx = self.selection.namespace_relabeled(name, &self.sets);
            self.route(fx);
        }
    }

    pub fn upsert_pod_info(&mut self, mut info: PodInfo) {
        let key = info.key.clone();
        let local = self.is_local(info.node.as_deref());
        if !local {
            // Only a local pod is named (its uid and sandbox lead to its interface); at 150k
            // pods these strings of remote ones were some 5 MiB nobody reads.
            info.uid = None;
            info.sandbox_id = None;
        }
        let labels_changed = self
            .sets
            .pod(&key)
            .is_none_or(|old| !old.labels.same_as(&info.labels));
        // A local pod's addresses are in its source check, and bridge mode dispatches routed
        // traffic by them.
        if local && self.sets.pod(&key).is_some_and(|old| *old.ips != *info.ips) {
            if self.selection.is_endpoint(&key) {
                self.emitted.mark(Owner::Endpoint(key.clone()));
            }
            if self.cfg.rules.bridge.is_some() {
                self.emitted.mark(Owner::Dispatch);
            }
        }
        self.families
            .note_pod(&key, if local { &info.ips } else { &[] });
        self.sets.upsert_pod(info);
        if !local {
            self.interfaces.set_to_name(&key, false);
            self.interfaces.set_unnamed(&key, false);
            self.remove_endpoint(&key);
            return;
        }
        // Named (again) by the caller before the next flush; the endpoint keeps its interface
        // until then.
        self.interfaces.set_to_name(&key, true);
        if labels_changed {
            let fx = self.selection.relabel_endpoint(&key, &self.sets);
            self.route(fx);
        }
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.rejections.accept(ObjectKind::Pod, &key.to_string());
        self.interfaces.set_unnamed(key, false);
        self.families.note_pod(key, &[]);
        self.interfaces.set_to_name(key, false);
        self.sets.remove_pod(key);
        self.remove_endpoint(key);
    }

    pub fn upsert_policy_info(&mut self, info: PolicyInfo) {
        let fx = self.selection.upsert_policy(info, &self.sets);
        self.route(fx);
    }

    pub fn remove_policy(&mut self, key: &ObjectKey) {
        self.rejections
            .accept(ObjectKind::NetworkPolicy, &key.to_string());
        let fx = self.selection.remove_policy(key);
        self.route(fx);
    }

    pub fn upsert_cluster_policy_info(&mut self, info: ClusterPolicyInfo) {
        let fx = self.selection.upsert_cluster_policy(info, &self.sets);
        self.route(fx);
    }

    pub fn remove_cluster_policy(&mut self, name: &str) {
        self.rejections
            .accept(ObjectKind::ClusterNetworkPolicy, name);
        let fx = self.selection.remove_cluster_policy(name);
        self.route(fx);
    }

    /// Local pods upserted since the last call, to be named by the caller (who answers each
    /// with `set_interface` before the next `flush`).
    pub fn take_pods_to_name(&mut self) -> Vec<PodInfo> {
        self.interfaces
            .take_to_name()
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

    fn is_local(&self, node: Option<&str>) -> bool {
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
                self.rejections.accept(ObjectKind::Pod, &key.to_string());
                self.interfaces.set_unnamed(key, false);
                name
            }
            Err(message) => {
                self.interfaces.set_unnamed(key, true);
                self.rejections.reject(
                    ObjectKind::Pod,
                    key.to_string(),
                    RejectKind::Interface,
                    message,
                );
                self.remove_endpoint(key);
                return;
            }
        };
        if self.selection.is_endpoint(key) {
            // Renamed: the claims move; who selects it does not change.
            if let Some(old) = self.selection.rename_endpoint(key, iface.clone()) {
                let released = self.interfaces.release(&old, key);
                self.route(released);
                let claimed = self.interfaces.claim(&iface, key);
                self.route(claimed);
                self.emitted.mark(Owner::Endpoint(key.clone()));
                self.emitted.mark(Owner::Dispatch);
            }
        } else {
            let claimed = self.interfaces.claim(&iface, key);
            self.route(claimed);
            let selected = self.selection.add_endpoint(key, iface, &self.sets);
            self.route(selected);
        }
    }

    /// A local endpoint is gone: it leaves the selection, then gives up its interface.
    fn remove_endpoint(&mut self, key: &ObjectKey) {
        if let Some((iface, selected)) = self.selection.remove_endpoint(key) {
            let released = self.interfaces.release(&iface, key);
            self.route(released);
            self.route(selected);
        }
    }
}
