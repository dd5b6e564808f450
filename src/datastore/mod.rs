//! Where Kubernetes objects come from: manifests on disk (`manifests`), a watched directory
//! of them (`dir`), the Kubernetes API (`kube`); both sources speak the same events.

pub mod dir;
pub mod kube;
pub mod manifests;

use crate::calc_graph::model::ObjectKey;
use crate::calc_graph::{validate, CalcGraph, ObjectKind};
use manifests::K8sObject;

/// Which object an event is about (`key` is `namespace/name`, or the name of a namespace).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub key: String,
}

/// What a datastore tells the agent.
#[derive(Clone, Debug)]
pub enum DatastoreEvent {
    Upsert(Box<K8sObject>),
    Delete(ObjectRef),
    /// The first complete listing has been delivered: until then nothing may be removed
    /// from the kernel.
    InSync,
    /// An interface resolver learned something (a sandbox, a route): local pods are
    /// resolved again.
    InterfacesChanged,
}

pub fn object_ref(o: &K8sObject) -> ObjectRef {
    match o {
        K8sObject::Pod(p) => ObjectRef {
            kind: ObjectKind::Pod,
            key: validate::namespaced_key(&p.metadata).to_string(),
        },
        K8sObject::Namespace(n) => ObjectRef {
            kind: ObjectKind::Namespace,
            key: n.metadata.name.clone().unwrap_or_default(),
        },
        K8sObject::NetworkPolicy(np) => ObjectRef {
            kind: ObjectKind::NetworkPolicy,
            key: validate::namespaced_key(&np.metadata).to_string(),
        },
    }
}

/// Applies one datastore event to the graph.
pub fn apply_event(graph: &mut CalcGraph, event: &DatastoreEvent) {
    match event {
        DatastoreEvent::Upsert(o) => match o.as_ref() {
            K8sObject::Pod(p) => graph.upsert_pod(p),
            K8sObject::Namespace(n) => graph.upsert_namespace(n),
            K8sObject::NetworkPolicy(np) => graph.upsert_policy(np),
        },
        DatastoreEvent::Delete(r) => {
            let key = || {
                let (ns, name) = r.key.split_once('/').unwrap_or(("default", &r.key));
                ObjectKey::new(ns, name)
            };
            match r.kind {
                ObjectKind::Pod => graph.remove_pod(&key()),
                ObjectKind::Namespace => graph.remove_namespace(&r.key),
                ObjectKind::NetworkPolicy => graph.remove_policy(&key()),
            }
        }
        DatastoreEvent::InterfacesChanged => graph.refresh_interfaces(),
        DatastoreEvent::InSync => {}
    }
}

/// Feeds objects to the graph in an order that needs no second pass: namespaces, then pods,
/// then policies (any order is correct; this one does the least re-evaluation).
pub fn feed(graph: &mut CalcGraph, objects: &[K8sObject]) {
    for o in objects {
        if let K8sObject::Namespace(ns) = o {
            graph.upsert_namespace(ns);
        }
    }
    for o in objects {
        if let K8sObject::Pod(p) = o {
            graph.upsert_pod(p);
        }
    }
    for o in objects {
        if let K8sObject::NetworkPolicy(np) = o {
            graph.upsert_policy(np);
        }
    }
}
