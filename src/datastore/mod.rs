//! Where Kubernetes objects come from: manifests on disk (`manifests`) today; the watched
//! directory and the Kubernetes API sources build on the same object type.

pub mod manifests;

use crate::calc_graph::CalcGraph;
use manifests::K8sObject;

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
