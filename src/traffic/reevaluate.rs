//! Conntrack re-evaluation, the pure half: which local pods an update may have taken
//! something from, and which of their tracked connections the new policy state denies.
//! No I/O; [`super::cutter`] lists and deletes the entries.
//!
//! Why it is needed: the workload chains accept `RELATED,ESTABLISHED` before any policy, so a
//! connection set up while policy allowed it keeps flowing after policy stops allowing it,
//! until its conntrack entry goes. Deleting the entry makes the next packet `NEW` again (TCP's
//! default `nf_conntrack_tcp_loose` picks up a connection mid-stream), so it meets the policy
//! chains, which now drop it.
//!
//! [`Mirror`] keeps the validated objects (the last valid version of each, as the calc graph
//! does) and, as each change is applied, names the local pods whose allowed set the change may
//! have shrunk, with the change as the cause:
//! - a NetworkPolicy added, edited or deleted: the local pods of its namespace that its old or
//!   its new pod selector selects (newly isolated, rules changed, or a policy lost);
//! - a local pod relabelled: that pod (it may be newly selected);
//! - a pod that existed relabelled, readdressed or deleted, as a peer: the local pods selected
//!   by every policy with a pod peer (namespace scope and pod selector) that selected its old
//!   version; a new pod takes nothing away from anyone;
//! - a namespace relabelled or deleted: the local pods selected by every policy with a
//!   `namespaceSelector` peer its old labels matched.
//!
//! - a ClusterNetworkPolicy added, edited or deleted: every local pod; and while any
//!   ClusterNetworkPolicy exists, a peer pod or namespace change (as above) marks every
//!   local pod too, since subjects and peers reach across namespaces (a coarse bound, paid
//!   only in clusters that use them).
//!
//! This is a superset of the pods that really lost something (a lost peer may still be
//! allowed by another rule): it only bounds the work, [`decide`] makes the decision with the
//! same evaluator `explain` uses ([`crate::verdict::State::allowed`]), one flow per entry. A
//! relabelled pod nobody's policy selects as a peer marks nothing, so label churn on pods that
//! policies do not talk about costs a few selector matches per event and no conntrack walk.
//! Changes that only widen (new pods, new namespaces, a label that makes a peer match) mark
//! nothing.
//!
//! Entries: the flow a policy judged is the original direction after DNAT and before SNAT:
//! source = the original tuple's source, destination = the reply tuple's source (the pod a
//! ClusterIP was translated to), port = the reply tuple's source port. TCP, UDP and SCTP are
//! evaluated; other protocols (ICMP, which policies cannot name apart from "every port") are
//! left alone. An entry concerns a marked pod when the pod is its source (egress) or its
//! destination (ingress). Traffic from the node itself to its pods is not policed (cali-OUTPUT),
//! and the evaluator knows that once it is given the node's addresses.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;

use crate::host::conntrack::CtTuple;
use crate::model::validate::{self, namespaced_key};
use crate::model::{
    ClusterPolicyInfo, DatastoreEvent, K8sObject, LabelSel, NamespaceInfo, NamespaceScope,
    ObjectKey, ObjectKind, Peer, PodInfo, PolicyInfo, Protocol,
};
use crate::rules::{Direction, RuleConfig};
use crate::verdict::{Action, Endpoint, Flow, State};

/// One object's new version (`None`: deleted), validated.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Pod(ObjectKey, Option<PodInfo>),
    Namespace(String, Option<NamespaceInfo>),
    Policy(ObjectKey, Option<PolicyInfo>),
    ClusterPolicy(String, Option<ClusterPolicyInfo>),
}

impl Change {
    /// The change a datastore event makes. `None` for an object that does not validate (its
    /// last valid version stays in force, as in the calc graph), for `InSync`, and for a pod
    /// that is no endpoint (host network, finished, no address yet: deleted from our view).
    pub fn of_event(event: &DatastoreEvent) -> Option<Change> {
        match event {
            DatastoreEvent::Upsert(o) => match o.as_ref() {
                K8sObject::Pod(p) => match validate::pod(p) {
                    Ok(info) => Some(Change::Pod(namespaced_key(&p.metadata), info)),
                    Err(_) => None,
                },
                K8sObject::Namespace(n) => validate::namespace(n)
                    .ok()
                    .map(|info| Change::Namespace(info.name.clone(), Some(info))),
                K8sObject::NetworkPolicy(np) => validate::network_policy(np)
                    .ok()
                    .map(|info| Change::Policy(info.key.clone(), Some(info))),
                K8sObject::ClusterNetworkPolicy(c) => validate::cluster_network_policy(c)
                    .ok()
                    .map(|info| Change::ClusterPolicy(info.name.clone(), Some(info))),
                // Never enforced: nothing the kernel allows changes.
                K8sObject::StagedNetworkPolicy(_) | K8sObject::StagedClusterNetworkPolicy(_) => {
                    None
                }
            },
            DatastoreEvent::Delete(r) => match r.kind {
                ObjectKind::Namespace => Some(Change::Namespace(r.key.clone(), None)),
                ObjectKind::ClusterNetworkPolicy => {
                    Some(Change::ClusterPolicy(r.key.clone(), None))
                }
                ObjectKind::StagedNetworkPolicy | ObjectKind::StagedClusterNetworkPolicy => None,
                ObjectKind::Pod | ObjectKind::NetworkPolicy => {
                    let (ns, name) = r.key.split_once('/')?;
                    let key = ObjectKey::new(ns, name);
                    Some(if r.kind == ObjectKind::Pod {
                        Change::Pod(key, None)
                    } else {
                        Change::Policy(key, None)
                    })
                }
            },
            DatastoreEvent::InSync | DatastoreEvent::Access { .. } => None,
        }
    }
}

/// What may have taken something from a pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    PolicyAdded(ObjectKey),
    PolicyChanged(ObjectKey),
    PolicyDeleted(ObjectKey),
    /// The pod itself has new labels (it may be selected by more policies now).
    Relabelled(ObjectKey),
    /// A peer pod of one of its policies was relabelled, readdressed or deleted.
    PeerChanged(ObjectKey),
    PeerDeleted(ObjectKey),
    /// A namespace one of its policies selected was relabelled or deleted.
    NamespaceChanged(String),
    ClusterPolicyChanged(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::PolicyAdded(k) => write!(f, "NetworkPolicy {k} added"),
            Cause::PolicyChanged(k) => write!(f, "NetworkPolicy {k} changed"),
            Cause::PolicyDeleted(k) => write!(f, "NetworkPolicy {k} deleted"),
            Cause::Relabelled(k) => write!(f, "pod {k} relabelled"),
            Cause::PeerChanged(k) => write!(f, "peer pod {k} relabelled or readdressed"),
            Cause::PeerDeleted(k) => write!(f, "peer pod {k} deleted"),
            Cause::NamespaceChanged(n) => write!(f, "namespace {n} relabelled or deleted"),
            Cause::ClusterPolicyChanged(n) => {
                write!(f, "ClusterNetworkPolicy {n} added, changed or deleted")
            }
        }
    }
}

/// Local pods to re-evaluate, each with what may have shrunk its allowed set (each cause
/// once, in order of arrival; at most [`MAX_CAUSES`] kept).
pub type Marked = BTreeMap<ObjectKey, Vec<Cause>>;

/// Causes kept per pod between two re-evaluations (a storm names its first few).
pub const MAX_CAUSES: usize = 4;

fn mark(marked: &mut Marked, pod: &ObjectKey, cause: &Cause) {
    let causes = marked.entry(pod.clone()).or_default();
    if causes.len() < MAX_CAUSES && !causes.contains(cause) {
        causes.push(cause.clone());
    }
}

/// The validated objects, as of the changes applied so far.
#[derive(Clone, Debug, Default)]
pub struct Mirror {
    node: String,
    pods: HashMap<ObjectKey, PodInfo>,
    local: BTreeSet<ObjectKey>,
    namespaces: HashMap<String, NamespaceInfo>,
    policies: BTreeMap<ObjectKey, PolicyInfo>,
    cluster_policies: BTreeMap<String, ClusterPolicyInfo>,
}

impl Mirror {
    /// Pods whose `spec.nodeName` is `node` are the local ones.
    pub fn new(node: impl Into<String>) -> Mirror {
        Mirror {
            node: node.into(),
            ..Mirror::default()
        }
    }

    fn ns_labels(&self, ns: &str) -> NamespaceInfo {
        self.namespaces
            .get(ns)
            .cloned()
            .unwrap_or_else(|| NamespaceInfo::implicit(ns))
    }

    /// Local pods `policy` selects.
    fn selected_by<'a>(&'a self, policy: &'a PolicyInfo) -> impl Iterator<Item = &'a ObjectKey> {
        self.local.iter().filter(move |k| {
            k.namespace == policy.key.namespace
                && self
                    .pods
                    .get(*k)
                    .is_some_and(|p| policy.pod_selector.matches(&p.labels))
        })
    }

    /// Policies with a pod peer `select` accepts (namespace scope, pod selector).
    fn policies_with_peer<'a>(
        &'a self,
        select: impl Fn(&NamespaceScope, &LabelSel) -> bool + 'a,
    ) -> impl Iterator<Item = &'a PolicyInfo> {
        self.policies.values().filter(move |p| {
            p.ingress
                .iter()
                .chain(p.egress.iter())
                .flatten()
                .flat_map(|r| r.peers.iter().flatten())
                .any(|peer| match peer {
                    Peer::Pods { namespaces, pods } => select(namespaces, pods),
                    Peer::IpBlock { .. } => false,
                })
        })
    }

    /// Marks every local pod (a ClusterNetworkPolicy change may concern any of them).
    fn mark_all_local(&self, marked: &mut Marked, cause: &Cause) {
        for pod in &self.local {
            mark(marked, pod, cause);
        }
    }

    /// Applies one change; marks (into `marked`) the local pods it may have taken something
    /// from.
    pub fn apply(&mut self, change: Change, marked: &mut Marked) {
        match change {
            Change::ClusterPolicy(name, new) => {
                let old = match &new {
                    Some(p) => self.cluster_policies.insert(name.clone(), p.clone()),
                    None => self.cluster_policies.remove(&name),
                };
                if old != new {
                    self.mark_all_local(marked, &Cause::ClusterPolicyChanged(name));
                }
            }
            Change::Policy(key, new) => {
                let old = match &new {
                    Some(p) => self.policies.insert(key.clone(), p.clone()),
                    None => self.policies.remove(&key),
                };
                if old == new {
                    return;
                }
                let cause = match (&old, &new) {
                    (None, _) => Cause::PolicyAdded(key),
                    (_, None) => Cause::PolicyDeleted(key),
                    _ => Cause::PolicyChanged(key),
                };
                let mut pods: BTreeSet<ObjectKey> = BTreeSet::new();
                for p in old.iter().chain(new.iter()) {
                    pods.extend(self.selected_by(p).cloned());
                }
                for pod in &pods {
                    mark(marked, pod, &cause);
                }
            }
            Change::Pod(key, new) => {
                let old = self.pods.remove(&key);
                self.local.remove(&key);
                if let Some(p) = &new {
                    if p.node.as_deref() == Some(self.node.as_str()) {
                        self.local.insert(key.clone());
                    }
                    self.pods.insert(key.clone(), p.clone());
                }
                let Some(old) = old else {
                    return;
                };
                let relabelled = new.as_ref().is_none_or(|n| n.labels != old.labels);
                let readdressed = new.as_ref().is_some_and(|n| n.ips != old.ips);
                if !relabelled && !readdressed {
                    return;
                }
                if relabelled && new.is_some() && self.local.contains(&key) {
                    mark(marked, &key, &Cause::Relabelled(key.clone()));
                }
                let cause = match new {
                    None => Cause::PeerDeleted(key.clone()),
                    Some(_) => Cause::PeerChanged(key.clone()),
                };
                if !self.cluster_policies.is_empty() {
                    self.mark_all_local(marked, &cause);
                }
                let old_ns = self.ns_labels(&key.namespace);
                let policies: Vec<&PolicyInfo> = self
                    .policies_with_peer(|scope, pods| {
                        let in_scope = match scope {
                            NamespaceScope::Named(n) => *n == key.namespace,
                            NamespaceScope::Selector(s) => s.matches(&old_ns.labels),
                        };
                        in_scope && pods.matches(&old.labels)
                    })
                    .collect();
                let pods: BTreeSet<ObjectKey> = policies
                    .iter()
                    .flat_map(|p| self.selected_by(p).cloned())
                    .filter(|k| *k != key)
                    .collect();
                for pod in &pods {
                    mark(marked, pod, &cause);
                }
            }
            Change::Namespace(name, new) => {
                let old = self.ns_labels(&name);
                match &new {
                    Some(n) => {
                        self.namespaces.insert(name.clone(), n.clone());
                    }
                    None => {
                        self.namespaces.remove(&name);
                    }
                }
                let now = self.ns_labels(&name);
                if now.labels == old.labels && new.is_some() {
                    return;
                }
                let cause = Cause::NamespaceChanged(name);
                if !self.cluster_policies.is_empty() {
                    self.mark_all_local(marked, &cause);
                }
                let pods: BTreeSet<ObjectKey> = self
                    .policies_with_peer(|scope, _| match scope {
                        NamespaceScope::Selector(s) => s.matches(&old.labels),
                        NamespaceScope::Named(_) => false,
                    })
                    .flat_map(|p| self.selected_by(p).cloned())
                    .collect();
                for pod in &pods {
                    mark(marked, pod, &cause);
                }
            }
        }
    }

    /// The evaluator's state for these objects (the node's own addresses known, so traffic
    /// between the node and its pods is judged as the rules judge it).
    pub fn state(&self, cfg: RuleConfig, host_addrs: &[IpAddr]) -> State {
        let mut state = State::new(
            cfg,
            self.namespaces.values().cloned(),
            self.pods.values().cloned(),
            self.policies.values().cloned(),
        );
        state.set_cluster_policies(self.cluster_policies.values().cloned());
        for ip in host_addrs {
            if state.pod_by_ip(ip).is_none() {
                state.add_host(*ip, self.node.clone());
            }
        }
        state
    }

    /// The addresses of the marked pods that are still local, each with its pod.
    pub fn addresses_of(&self, marked: &Marked) -> HashMap<IpAddr, ObjectKey> {
        marked
            .keys()
            .filter(|k| self.local.contains(*k))
            .filter_map(|k| self.pods.get(k))
            .flat_map(|p| p.ips.iter().map(move |ip| (*ip, p.key.clone())))
            .collect()
    }
}

/// One connection to cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Index into the entries given to [`decide`].
    pub entry: usize,
    /// The marked pod the entry was listed for (its causes say why it was looked at).
    pub listed_for: ObjectKey,
    /// The direction that denies the flow now, and the pod it belongs to.
    pub denied_by: Direction,
    pub denying_pod: Option<ObjectKey>,
    /// The flow as judged: post-DNAT source, destination, protocol and port, and the names
    /// of both sides (`namespace/pod`, a node or the address).
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    pub src_name: String,
    pub dst_name: String,
}

fn protocol_of(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The entries (original and reply tuple, in order) that concern a pod of `pods` (address →
/// pod) and whose flow `state` denies. Entries of other pods, of other protocols, or that
/// `state` cannot resolve are kept.
pub fn decide<'a>(
    state: &State,
    pods: &HashMap<IpAddr, ObjectKey>,
    entries: impl IntoIterator<Item = (&'a CtTuple, &'a CtTuple)>,
) -> Vec<Cut> {
    let mut cuts = Vec::new();
    for (i, (original, reply)) in entries.into_iter().enumerate() {
        let Some(protocol) = protocol_of(original.protocol) else {
            continue;
        };
        let (src, dst) = (original.src, reply.src);
        let Some(port) = reply.src_port else {
            continue;
        };
        let Some(pod) = pods.get(&src).or_else(|| pods.get(&dst)) else {
            continue;
        };
        let flow = Flow {
            src: Endpoint::Ip(src),
            dst: Endpoint::Ip(dst),
            protocol,
            port,
        };
        let Ok(resolved) = state.resolve(&flow) else {
            continue;
        };
        if state.allowed(&resolved) {
            continue;
        }
        // Denied: the full report (rare, so its cost does not matter) says which side.
        let verdict = state.explain(&resolved);
        let denying = if verdict.egress.action == Action::Deny {
            verdict.egress
        } else {
            verdict.ingress
        };
        cuts.push(Cut {
            entry: i,
            listed_for: pod.clone(),
            denied_by: denying.direction,
            denying_pod: denying.pod,
            src,
            dst,
            protocol,
            port,
            src_name: verdict.src_name,
            dst_name: verdict.dst_name,
        });
    }
    cuts
}

#[cfg(test)]
mod tests;
