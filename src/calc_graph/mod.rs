//! The calculation graph: Pods, Namespaces, NetworkPolicies and ClusterNetworkPolicies in,
//! the node's desired iptables chains and IP sets out, as deltas. Pure: no I/O.
//!
//! Events update the model and mark what they affect dirty; `flush` renders only the dirty
//! parts and returns the difference to what it emitted before. What depends on what:
//! - set members (`set_index`) follow every pod, cluster-wide, but only for the sets that the
//!   active policies reference;
//! - a policy is *active* when it selects at least one local endpoint (a pod on this node
//!   with a resolvable interface); only active policies get chains and take set references;
//! - each local endpoint has `cali-tw-`/`cali-fw-` chains listing the active policies that
//!   select it, tier by tier (ClusterNetworkPolicy Admin, NetworkPolicy, Baseline; see
//!   `cluster`); the dispatch chains list the endpoints; each namespace with endpoints has
//!   its profile chains.
//!
//! Interface names come from outside: the graph never calls a resolver. A local pod's upsert
//! puts it on the list `take_pods_to_name` hands out; the caller (the agent loop, or
//! `compile`) names it at the edge and answers with `set_interface`, before `flush`. Until it
//! is named a local pod has no chains, and its traffic meets "Unknown interface"; when a
//! policy isolates it, the guard (`guard`) also drops its traffic by address until then.

mod cluster;
mod compact_pod;
mod families;
mod guard;
mod host_set;
mod provenance;
mod set_index;
mod union_set;
/// A policy version's sets, which it holds only while it selects an endpoint.
fn active_set_defs(selects: &BTreeSet<ObjectKey>, defs: Vec<SetDef>) -> Vec<SetDef> {
    if selects.is_empty() {
        Vec::new()
    } else {
        defs
    }
}

#[cfg(test)]
pub(crate) mod tests;
pub mod update;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use tracing::{debug, error};

use crate::ipsets::{set_name, Member, SetDef, SetSpec};
use crate::rules::chains::{profile_chains, static_chains, tiered_endpoint_chains, TierChains};
use crate::rules::cluster::cluster_policy_chains;
use crate::rules::dispatch::dispatch_chains_with_addrs;
use crate::rules::policy::{plan_policy, policy_chains, PolicyPlan};
use crate::rules::union::{union_plan, UnionPlan};
use crate::rules::{Chain, Direction, RuleConfig};

use crate::model::validate;
use crate::model::{
    DatastoreEvent, IpFamily, K8sObject, NamespaceInfo, ObjectKey, ObjectKind, PodInfo, PolicyInfo,
};
use cluster::ClusterEntry;
use set_index::SetIndex;
use update::{DesiredState, FamilyState, SetHeader, Update};

pub struct GraphConfig {
    /// Pods whose `spec.nodeName` is this are local endpoints.
    pub node_name: String,
    pub families: Vec<IpFamily>,
    pub rules: RuleConfig,
}

/// Why an object (or a part of it) is not enforced as written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectKind {
    /// The object failed validation; its last valid version (if any) stays in force.
    Invalid,
    /// A local pod whose host interface could not be named; it gets no chains, and the
    /// dispatch chains drop its traffic as an unknown interface.
    Interface,
}

/// Something that owns chains; re-rendered as a unit when dirty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Owner {
    Static,
    Dispatch,
    Profile(String),
    Policy(ObjectKey),
    ClusterPolicy(String),
    Endpoint(ObjectKey),
    /// `cali-wl-guard` (`guard`).
    Guard,
}

/// A local endpoint with chains: see [`CalcGraph::programmed_endpoints`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointView<'a> {
    pub key: &'a ObjectKey,
    pub iface: &'a str,
    /// Policies isolating it for ingress (its `cali-tw-` chain jumps to them), in key order.
    pub ingress: Vec<ObjectKey>,
    /// Policies isolating it for egress (`cali-fw-`).
    pub egress: Vec<ObjectKey>,
}

struct Endpoint {
    iface: String,
    /// Active policies selecting this pod (any direction).
    policies: BTreeSet<ObjectKey>,
    /// ClusterNetworkPolicies whose subject selects this pod (any tier and direction).
    cluster_policies: BTreeSet<String>,
}

struct PolicyEntry {
    info: PolicyInfo,
    plan: PolicyPlan,
    /// Local endpoints the policy selects; non-empty means active.
    selects: BTreeSet<ObjectKey>,
}

/// What the next flush re-renders.
#[derive(Default)]
struct Dirty {
    owners: BTreeSet<Owner>,
    /// When the event that first made each dirty owner dirty entered the graph (only while
    /// the caller stamps events, see `CalcGraph::set_event_time`).
    since: HashMap<Owner, Instant>,
    event_time: Option<Instant>,
}

impl Dirty {
    fn mark(&mut self, owner: Owner) {
        match self.event_time {
            Some(at) => {
                if !self.owners.contains(&owner) {
                    self.since.insert(owner.clone(), at);
                    self.owners.insert(owner);
                }
            }
            None => {
                self.owners.insert(owner);
            }
        }
    }
}

pub struct CalcGraph {
    cfg: GraphConfig,
    sets: SetIndex,
    policies: HashMap<ObjectKey, PolicyEntry>,
    policies_by_ns: HashMap<String, BTreeSet<ObjectKey>>,
    cluster_policies: HashMap<String, ClusterEntry>,
    endpoints: BTreeMap<ObjectKey, Endpoint>,
    endpoints_by_ns: HashMap<String, BTreeSet<ObjectKey>>,
    /// Pods claiming each interface name; the first (by key) gets the chains.
    iface_claims: HashMap<String, BTreeSet<ObjectKey>>,
    rejected: BTreeMap<(ObjectKind, String), (RejectKind, String)>,
    /// Rejections so far (each rejected upsert counts), for the metrics.
    rejection_counts: BTreeMap<(ObjectKind, RejectKind), u64>,

    dirty: Dirty,
    /// Per local endpoint whose rules the last flushes changed: when the earliest event
    /// behind the change entered the graph. Taken by `take_programming_starts`.
    programming_starts: Vec<Instant>,
    owned: HashMap<Owner, Vec<(IpFamily, String)>>,
    emitted_chains: BTreeMap<(IpFamily, String), Arc<Chain>>,
    emitted_sets: BTreeMap<String, SetDef>,
    /// Local pods upserted since the last `take_pods_to_name`: their interface must be
    /// (re)named by the caller.
    to_name: BTreeSet<ObjectKey>,
    /// IPVS mode: this host's addresses (the this-host set).
    host_set: host_set::HostSet,
    /// The union sets of workload chains past `policy_union_min` (`rules::union`).
    unions: union_set::UnionSets,
    /// Per local endpoint with chains: the union set ids its ingress and egress chains
    /// match, as of the last flush.
    endpoint_unions: HashMap<ObjectKey, [Option<String>; 2]>,
    /// Local pods the caller could not name (`set_interface` with an error).
    unnamed: BTreeSet<ObjectKey>,
    /// What the guard holds, as of the last flush (`guard`).
    guarded: Vec<crate::rules::guard::Guarded>,
    /// Local pods with addresses of a family not programmed (`families`).
    outside_families: BTreeMap<ObjectKey, Vec<IpAddr>>,
}

impl CalcGraph {
    pub fn new(cfg: GraphConfig) -> CalcGraph {
        let mut graph = CalcGraph {
            cfg,
            sets: SetIndex::default(),
            policies: HashMap::new(),
            policies_by_ns: HashMap::new(),
            cluster_policies: HashMap::new(),
            endpoints: BTreeMap::new(),
            endpoints_by_ns: HashMap::new(),
            iface_claims: HashMap::new(),
            rejected: BTreeMap::new(),
            rejection_counts: BTreeMap::new(),
            dirty: Dirty::default(),
            programming_starts: Vec::new(),
            owned: HashMap::new(),
            emitted_chains: BTreeMap::new(),
            emitted_sets: BTreeMap::new(),
            to_name: BTreeSet::new(),
            host_set: host_set::HostSet::default(),
            unions: union_set::UnionSets::default(),
            endpoint_unions: HashMap::new(),
            unnamed: BTreeSet::new(),
            guarded: Vec::new(),
            outside_families: BTreeMap::new(),
        };
        graph.dirty.mark(Owner::Static);
        graph.dirty.mark(Owner::Dispatch);
        graph
    }

    pub fn config(&self) -> &GraphConfig {
        &self.cfg
    }

    /// IPVS mode: this host's addresses, without those of `kube-ipvs0` (read at the edge);
    /// the next flush brings the this-host set up to date. Ignored with IPVS support off.
    pub fn set_host_addresses(&mut self, addrs: impl IntoIterator<Item = IpAddr>) {
        self.host_set.set(addrs);
    }

    /// The addresses last given to `set_host_addresses`.
    pub fn host_addresses(&self) -> &BTreeSet<IpAddr> {
        self.host_set.addresses()
    }

    /// Objects (or local pods' interfaces) currently not enforced as written, with the reason.
    pub fn rejections(&self) -> &BTreeMap<(ObjectKind, String), (RejectKind, String)> {
        &self.rejected
    }

    /// How many times objects were rejected, by kind and reason, since the graph started.
    pub fn rejection_counts(&self) -> &BTreeMap<(ObjectKind, RejectKind), u64> {
        &self.rejection_counts
    }

    /// Stamps the events that follow with the time they entered the graph (`None`: stop
    /// stamping). A flush then reports, for each local endpoint whose rules it changed
    /// because of a stamped event (its first sighting, a policy selecting it that was added,
    /// changed or removed), when the earliest such event came in; see
    /// `take_programming_starts`. The graph never reads a clock itself.
    pub fn set_event_time(&mut self, at: Option<Instant>) {
        self.dirty.event_time = at;
    }

    /// The start times gathered by the flushes since the last call, one per local endpoint
    /// and flush whose rules changed (for the programming-latency metric: the caller observes
    /// them once the apply carrying those flushes has completed).
    pub fn take_programming_starts(&mut self) -> Vec<Instant> {
        std::mem::take(&mut self.programming_starts)
    }

    pub fn local_endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// Every local pod with an address: its addresses and the interface it was named to
    /// (`None`: the resolver found none). O(local pods), for the agent's check that the
    /// named interfaces exist.
    pub fn local_pod_interfaces(&self) -> Vec<(ObjectKey, Vec<IpAddr>, Option<String>)> {
        let named = self
            .endpoints
            .iter()
            .map(|(key, ep)| (key.clone(), Some(ep.iface.clone())));
        let unnamed = self
            .rejected
            .iter()
            .filter(|((kind, _), (why, _))| {
                *kind == ObjectKind::Pod && *why == RejectKind::Interface
            })
            .filter_map(|((_, key), _)| {
                let (namespace, name) = key.split_once('/')?;
                Some((ObjectKey::new(namespace, name), None))
            });
        named
            .chain(unnamed)
            .filter_map(|(key, iface)| {
                let ips = self.sets.pod(&key)?.ips.to_vec();
                (!ips.is_empty()).then_some((key, ips, iface))
            })
            .collect()
    }

    pub fn active_policy_count(&self) -> usize {
        self.policies
            .values()
            .filter(|p| !p.selects.is_empty())
            .count()
    }

    pub fn set_evaluations(&self) -> u64 {
        self.sets.evaluations
    }

    fn reject(&mut self, kind: ObjectKind, key: String, why: RejectKind, message: String) {
        // The key of a rejected object may hold anything (a newline, megabytes).
        let object = validate::shown_name(&key);
        match why {
            RejectKind::Invalid => {
                error!(kind = kind.as_str(), object = %object, "rejected: {message}")
            }
            // A new pod lacks its interface for a moment (the CNI is still wiring it, the
            // bridge has not learned its port): the agent warns once the grace period has
            // passed (`agent::unnamed`), so this is not a warning.
            RejectKind::Interface => {
                debug!(kind = kind.as_str(), object = %object, "no interface yet: {message}")
            }
        }
        *self
            .rejection_counts
            .entry((kind, why.clone()))
            .or_default() += 1;
        self.rejected.insert((kind, key), (why, message));
    }

    fn accept(&mut self, kind: ObjectKind, key: &str) {
        self.rejected.remove(&(kind, key.to_string()));
    }

    // ---- object-level entry points (validate, then update) ----

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

    // ---- model-level updates ----

    pub fn upsert_namespace_info(&mut self, info: NamespaceInfo) {
        let name = info.name.clone();
        let before = self.sets.namespace_labels(&name);
        self.sets.upsert_namespace(info);
        if self.sets.namespace_labels(&name) != before {
            self.reselect_cluster_namespace(&name);
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
            if self.endpoints.contains_key(&key) {
                self.dirty.mark(Owner::Endpoint(key.clone()));
            }
            if self.cfg.rules.bridge.is_some() {
                self.dirty.mark(Owner::Dispatch);
            }
        }
        self.note_pod_families(&key, if local { &info.ips } else { &[] });
        self.sets.upsert_pod(info);
        if !local {
            self.to_name.remove(&key);
            self.mark_unnamed(&key, false);
            self.remove_endpoint(&key);
            return;
        }
        // Named (again) by the caller before the next flush; the endpoint keeps its interface
        // until then.
        self.to_name.insert(key.clone());
        if labels_changed && self.endpoints.contains_key(&key) {
            self.reselect_policies(&key);
            self.reselect_cluster_policies(&key);
        }
    }

    fn claim_iface(&mut self, iface: &str, key: &ObjectKey) {
        let claims = self.iface_claims.entry(iface.to_string()).or_default();
        claims.insert(key.clone());
        if claims.len() > 1 {
            error!(
                interface = iface,
                pods = ?claims.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "several local pods resolve to one interface; only the first gets its policy, check the interface-naming scheme"
            );
            // The winner may have changed (and with it, in bridge mode, the addresses the
            // interface is dispatched by).
            for k in claims.iter() {
                self.dirty.mark(Owner::Endpoint(k.clone()));
            }
            self.dirty.mark(Owner::Dispatch);
        }
    }

    fn release_iface(&mut self, iface: &str, key: &ObjectKey) {
        if let Some(claims) = self.iface_claims.get_mut(iface) {
            claims.remove(key);
            for k in claims.iter() {
                self.dirty.mark(Owner::Endpoint(k.clone()));
            }
            self.dirty.mark(Owner::Dispatch);
            if claims.is_empty() {
                self.iface_claims.remove(iface);
            }
        }
    }

    fn remove_endpoint(&mut self, key: &ObjectKey) {
        let Some(ep) = self.endpoints.remove(key) else {
            return;
        };
        self.release_iface(&ep.iface, key);
        if let Some(in_ns) = self.endpoints_by_ns.get_mut(&key.namespace) {
            in_ns.remove(key);
            if in_ns.is_empty() {
                self.endpoints_by_ns.remove(&key.namespace);
                self.dirty.mark(Owner::Profile(key.namespace.clone()));
            }
        }
        for policy in ep.policies {
            self.set_selection(&policy, key, false);
        }
        for policy in ep.cluster_policies {
            self.set_cluster_selection(&policy, key, false);
        }
        self.dirty.mark(Owner::Endpoint(key.clone()));
        self.dirty.mark(Owner::Dispatch);
    }

    /// Re-evaluates which policies of its namespace select a local endpoint.
    fn reselect_policies(&mut self, key: &ObjectKey) {
        let Some(labels) = self.sets.pod(key).map(|p| p.labels.clone()) else {
            return;
        };
        let candidates: Vec<ObjectKey> = self
            .policies_by_ns
            .get(&key.namespace)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for policy in candidates {
            let selects = self
                .policies
                .get(&policy)
                .is_some_and(|p| p.info.pod_selector.matches(&labels));
            self.set_selection(&policy, key, selects);
        }
    }

    /// Records whether `policy` selects endpoint `ep`, activating or retiring the policy when
    /// that changes whether it selects anything.
    fn set_selection(&mut self, policy: &ObjectKey, ep: &ObjectKey, selects: bool) {
        let Some(entry) = self.policies.get_mut(policy) else {
            return;
        };
        let was_active = !entry.selects.is_empty();
        let changed = if selects {
            entry.selects.insert(ep.clone())
        } else {
            entry.selects.remove(ep)
        };
        if !changed {
            return;
        }
        let is_active = !entry.selects.is_empty();
        if let Some(e) = self.endpoints.get_mut(ep) {
            if selects {
                e.policies.insert(policy.clone());
            } else {
                e.policies.remove(policy);
            }
        }
        self.dirty.mark(Owner::Endpoint(ep.clone()));
        if was_active != is_active {
            let defs = entry.plan.set_defs();
            for def in &defs {
                if is_active {
                    self.sets.acquire(def);
                } else {
                    self.sets.release(def);
                }
            }
            self.dirty.mark(Owner::Policy(policy.clone()));
        }
    }

    pub fn upsert_policy_info(&mut self, info: PolicyInfo) {
        let key = info.key.clone();
        if self.policies.get(&key).is_some_and(|p| p.info == info) {
            return;
        }
        let new_plan = plan_policy(&info);
        let selects: BTreeSet<ObjectKey> = self
            .endpoints_by_ns
            .get(&key.namespace)
            .into_iter()
            .flatten()
            .filter(|ep| {
                self.sets
                    .pod(ep)
                    .is_some_and(|p| info.pod_selector.matches(&p.labels))
            })
            .cloned()
            .collect();
        let old = self.policies.remove(&key);
        let (old_defs, old_selects) = old
            .as_ref()
            .map(|o| {
                (
                    active_set_defs(&o.selects, o.plan.set_defs()),
                    o.selects.clone(),
                )
            })
            .unwrap_or_default();
        self.move_set_references(active_set_defs(&selects, new_plan.set_defs()), old_defs);
        // Re-rendered even when still selected: the directions it governs may differ.
        self.reselect_endpoints(&old_selects, &selects, |e, selected| {
            if selected {
                e.policies.insert(key.clone());
            } else {
                e.policies.remove(&key);
            }
        });
        self.policies_by_ns
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.clone());
        self.dirty.mark(Owner::Policy(key.clone()));
        self.policies.insert(
            key,
            PolicyEntry {
                info,
                plan: new_plan,
                selects,
            },
        );
    }

    /// Moves a policy's set references from its old version to its new one: the new ones are
    /// taken first, so sets both versions use are not churned.
    fn move_set_references(&mut self, acquire: Vec<SetDef>, release: Vec<SetDef>) {
        for def in &acquire {
            self.sets.acquire(def);
        }
        for def in &release {
            self.sets.release(def);
        }
    }

    /// Tells each endpoint selected before or now whether it is selected now (`update`), and
    /// marks it for rendering either way.
    fn reselect_endpoints(
        &mut self,
        before: &BTreeSet<ObjectKey>,
        now: &BTreeSet<ObjectKey>,
        mut update: impl FnMut(&mut Endpoint, bool),
    ) {
        for ep in before.union(now) {
            if let Some(e) = self.endpoints.get_mut(ep) {
                update(e, now.contains(ep));
            }
            self.dirty.mark(Owner::Endpoint(ep.clone()));
        }
    }

    // ---- output ----

    /// Renders everything dirty and returns the changes since the last flush.
    pub fn flush(&mut self) -> Update {
        let mut update = Update::default();
        self.refresh_guard();
        self.update_endpoint_unions();
        self.unions.peers_changed(&self.sets.pending);
        self.flush_sets(&mut update);
        self.unions
            .flush(&self.sets, &self.cfg.families, &mut update);
        let ipvs = self.cfg.rules.kube_ipvs.is_some();
        self.host_set.flush(ipvs, &self.cfg.families, &mut update);
        let dirty = std::mem::take(&mut self.dirty.owners);
        let mut since = std::mem::take(&mut self.dirty.since);
        // Local endpoint → earliest start behind a change of its rules in this flush.
        let mut starts: BTreeMap<ObjectKey, Instant> = BTreeMap::new();
        for owner in dirty {
            let chains = self.render_owner(&owner);
            let upserts_before = update.chains_upserted.len();
            let names: Vec<(IpFamily, String)> =
                chains.iter().map(|(f, c)| (*f, c.name.clone())).collect();
            let wanted: BTreeSet<&(IpFamily, String)> = names.iter().collect();
            for old in self.owned.remove(&owner).unwrap_or_default() {
                if !wanted.contains(&old) && self.emitted_chains.remove(&old).is_some() {
                    update.chains_removed.push(old);
                }
            }
            for (family, chain) in chains {
                let slot = (family, chain.name.clone());
                if self.emitted_chains.get(&slot).map(|c| &**c) != Some(&chain) {
                    let chain = Arc::new(chain);
                    self.emitted_chains.insert(slot, chain.clone());
                    update.chains_upserted.push((family, chain));
                }
            }
            let changed = update.chains_upserted.len() > upserts_before;
            if let (true, Some(at)) = (changed, since.remove(&owner)) {
                let touched: Vec<&ObjectKey> = match &owner {
                    Owner::Endpoint(key) => vec![key],
                    Owner::Policy(key) => self
                        .policies
                        .get(key)
                        .map(|p| p.selects.iter().collect())
                        .unwrap_or_default(),
                    Owner::ClusterPolicy(name) => self
                        .cluster_policies
                        .get(name)
                        .map(|p| p.selects.iter().collect())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                for ep in touched {
                    let t = starts.entry(ep.clone()).or_insert(at);
                    *t = (*t).min(at);
                }
            }
            if !names.is_empty() {
                self.owned.insert(owner, names);
            }
        }
        self.programming_starts.extend(starts.into_values());
        // A chain handed from one owner to another in the same flush is upserted, not removed.
        let upserted: BTreeSet<(IpFamily, String)> = update
            .chains_upserted
            .iter()
            .map(|(f, c)| (*f, c.name.clone()))
            .collect();
        update.chains_removed.retain(|c| !upserted.contains(c));
        update
    }

    /// Brings the union sets of the dirty endpoints up to date (before their chains are
    /// rendered, which name them): the new ones are taken first, so a set both versions
    /// use is not churned.
    fn update_endpoint_unions(&mut self) {
        let dirty: Vec<ObjectKey> = self
            .dirty
            .owners
            .iter()
            .filter_map(|o| match o {
                Owner::Endpoint(key) => Some(key.clone()),
                _ => None,
            })
            .collect();
        for key in dirty {
            let now = self.wanted_unions(&key);
            let ids = [0, 1].map(|i| now[i].as_ref().map(|u| u.id.clone()));
            let before = self.endpoint_unions.remove(&key).unwrap_or_default();
            if ids == before {
                if ids.iter().any(Option::is_some) {
                    self.endpoint_unions.insert(key, before);
                }
                continue;
            }
            for plan in now.iter().flatten() {
                self.unions.acquire(plan);
            }
            for id in before.iter().flatten() {
                self.unions.release(id);
            }
            if ids.iter().any(Option::is_some) {
                self.endpoint_unions.insert(key, ids);
            }
        }
    }

    /// The union sets an endpoint's ingress and egress chains should match: none unless it
    /// owns its interface (the chains are rendered) and passes the threshold.
    fn wanted_unions(&self, key: &ObjectKey) -> [Option<UnionPlan>; 2] {
        let cfg = &self.cfg.rules;
        if cfg.policy_union_min == 0 {
            return [None, None];
        }
        let Some(ep) = self.endpoints.get(key) else {
            return [None, None];
        };
        let winner = self
            .iface_claims
            .get(&ep.iface)
            .and_then(|claims| claims.first());
        if winner != Some(key) {
            return [None, None];
        }
        let (ingress, egress) = self.isolating(ep);
        let plans = |keys: &[ObjectKey]| -> Vec<&PolicyPlan> {
            keys.iter()
                .filter_map(|k| self.policies.get(k).map(|p| &p.plan))
                .collect()
        };
        [
            union_plan(cfg, Direction::Ingress, &plans(&ingress)),
            union_plan(cfg, Direction::Egress, &plans(&egress)),
        ]
    }

    /// The union set ids an endpoint's chains match (ingress, egress).
    fn endpoint_union_ids(&self, key: &ObjectKey) -> [Option<&str>; 2] {
        match self.endpoint_unions.get(key) {
            Some([i, e]) => [i.as_deref(), e.as_deref()],
            None => [None, None],
        }
    }

    fn flush_sets(&mut self, update: &mut Update) {
        let families = self.cfg.families.clone();
        let mut pending: Vec<(String, set_index::PendingSet)> = self.sets.pending.drain().collect();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, change) in pending {
            let now = self.sets.set_by_id(&id).map(|s| s.def.clone());
            let was = self.emitted_sets.contains_key(&id);
            match (was, now) {
                (false, Some(def)) => {
                    for family in &families {
                        update.sets_created.push(SetHeader {
                            name: set_name(*family, &id),
                            family: *family,
                            set_type: def.set_type(),
                        });
                    }
                    self.emitted_sets.insert(id.clone(), def);
                    add_member_changes(update, &families, &id, &change.members, true);
                }
                (true, Some(_)) => {
                    add_member_changes(update, &families, &id, &change.members, true);
                    add_member_changes(update, &families, &id, &change.members, false);
                }
                (true, None) => {
                    self.emitted_sets.remove(&id);
                    for family in &families {
                        update.sets_removed.push((*family, set_name(*family, &id)));
                    }
                }
                (false, None) => {}
            }
        }
    }

    fn render_owner(&self, owner: &Owner) -> Vec<(IpFamily, Chain)> {
        let cfg = &self.cfg.rules;
        let mut out = Vec::new();
        for &family in &self.cfg.families {
            let chains: Vec<Chain> = match owner {
                Owner::Static => static_chains(cfg, family, self.guard_active()),
                Owner::Guard => self.guard_chains(family),
                Owner::Dispatch => {
                    let ifaces: Vec<String> = self.iface_claims.keys().cloned().collect();
                    dispatch_chains_with_addrs(cfg, family, &ifaces, &self.endpoint_addrs())
                }
                Owner::Profile(ns) => {
                    if self.endpoints_by_ns.contains_key(ns) {
                        profile_chains(cfg, family, ns).into()
                    } else {
                        Vec::new()
                    }
                }
                Owner::Policy(key) => match self.policies.get(key) {
                    Some(p) if !p.selects.is_empty() => {
                        policy_chains(cfg, family, &p.info, &p.plan, &|def| {
                            set_name(family, &def.id())
                        })
                    }
                    _ => Vec::new(),
                },
                Owner::ClusterPolicy(name) => match self.cluster_policies.get(name) {
                    Some(p) if !p.selects.is_empty() => {
                        cluster_policy_chains(cfg, family, &p.info, &p.plan, &|def| {
                            set_name(family, &def.id())
                        })
                    }
                    _ => Vec::new(),
                },
                Owner::Endpoint(key) => self.endpoint_chains(key, family),
            };
            out.extend(chains.into_iter().map(|c| (family, c)));
        }
        out
    }

    /// Bridge mode: `(address, interface)` of every local endpoint that owns its interface,
    /// for the dispatch of traffic routed into the bridge. Empty in routed mode.
    fn endpoint_addrs(&self) -> Vec<(std::net::IpAddr, String)> {
        if self.cfg.rules.bridge.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (iface, claims) in &self.iface_claims {
            let Some(pod) = claims.first().and_then(|k| self.sets.pod(k)) else {
                continue;
            };
            out.extend(pod.ips.iter().map(|ip| (*ip, iface.clone())));
        }
        out
    }

    fn endpoint_chains(&self, key: &ObjectKey, family: IpFamily) -> Vec<Chain> {
        let Some(ep) = self.endpoints.get(key) else {
            return Vec::new();
        };
        let winner = self
            .iface_claims
            .get(&ep.iface)
            .and_then(|claims| claims.first());
        if winner != Some(key) {
            return Vec::new();
        }
        let (ingress, egress) = self.isolating(ep);
        let [admin_in, admin_out, baseline_in, baseline_out] = self.endpoint_cluster_policies(key);
        let addrs = self.sets.pod(key).map(|p| &*p.ips).unwrap_or_default();
        let [union_in, union_out] = self.endpoint_union_ids(key);
        tiered_endpoint_chains(
            &self.cfg.rules,
            family,
            &ep.iface,
            addrs,
            &key.namespace,
            &TierChains {
                admin: &admin_in,
                network: &ingress,
                baseline: &baseline_in,
                union: union_in,
            },
            &TierChains {
                admin: &admin_out,
                network: &egress,
                baseline: &baseline_out,
                union: union_out,
            },
        )
        .into()
    }

    /// The active policies selecting `ep`, per direction they govern (in key order): the
    /// policies its `cali-tw-`/`cali-fw-` chains jump to, so the ones isolating it there.
    fn isolating(&self, ep: &Endpoint) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
        let (mut ingress, mut egress) = (Vec::new(), Vec::new());
        for policy in &ep.policies {
            if let Some(p) = self.policies.get(policy) {
                if p.plan.ingress.is_some() {
                    ingress.push(policy.clone());
                }
                if p.plan.egress.is_some() {
                    egress.push(policy.clone());
                }
            }
        }
        (ingress, egress)
    }

    // ---- read-only views, for what the agent tells about traffic (deny logs, counters) ----

    /// A pod as the graph knows it (local or not), by key (a copy: the graph keeps pods in a
    /// compact form of its own; a remote pod comes without its uid and sandbox id).
    pub fn pod(&self, key: &ObjectKey) -> Option<PodInfo> {
        self.sets.pod(key).map(|p| p.to_info())
    }

    /// A pod's addresses (empty for a pod the graph does not know), without a copy.
    pub fn pod_ips(&self, key: &ObjectKey) -> &[std::net::IpAddr] {
        self.sets.pod(key).map(|p| &*p.ips).unwrap_or(&[])
    }

    /// The local endpoints that have chains (a named interface they own), each with the
    /// policies isolating it per direction, as the graph renders them now (flush first for
    /// the latest events).
    pub fn programmed_endpoints(&self) -> impl Iterator<Item = EndpointView<'_>> {
        self.endpoints.iter().filter_map(|(key, ep)| {
            let owns = self
                .iface_claims
                .get(&ep.iface)
                .and_then(|claims| claims.first())
                == Some(key);
            owns.then(|| {
                let (ingress, egress) = self.isolating(ep);
                EndpointView {
                    key,
                    iface: &ep.iface,
                    ingress,
                    egress,
                }
            })
        })
    }

    /// Every chain as of the last flush, with its family.
    pub fn emitted_chains(&self) -> impl Iterator<Item = (IpFamily, &Chain)> {
        self.emitted_chains.iter().map(|((f, _), c)| (*f, &**c))
    }

    /// The policies selecting at least one local endpoint (the ones with chains).
    pub fn active_policies(&self) -> impl Iterator<Item = &ObjectKey> {
        self.policies
            .iter()
            .filter(|(_, p)| !p.selects.is_empty())
            .map(|(k, _)| k)
    }

    /// The complete state as of the last flush (call `flush` first to include recent events).
    pub fn snapshot(&self) -> DesiredState {
        let mut state = DesiredState::default();
        for &family in &self.cfg.families {
            state.families.insert(family, FamilyState::default());
        }
        for ((family, name), chain) in &self.emitted_chains {
            if let Some(f) = state.families.get_mut(family) {
                f.chains.insert(name.clone(), chain.clone());
            }
        }
        for (&family, f) in state.families.iter_mut() {
            self.host_set.snapshot(family, f);
            self.unions.snapshot(family, f);
        }
        for set in self.sets.sets() {
            if !self.emitted_sets.contains_key(&set.id) {
                continue;
            }
            for (&family, f) in state.families.iter_mut() {
                let name = set_name(family, &set.id);
                f.sets.insert(
                    name.clone(),
                    SetSpec {
                        name,
                        family,
                        set_type: set.def.set_type(),
                        members: set
                            .members
                            .keys()
                            .filter(|m| m.family() == family)
                            .copied()
                            .collect(),
                    },
                );
            }
        }
        state
    }
}

fn add_member_changes(
    update: &mut Update,
    families: &[IpFamily],
    id: &str,
    changes: &HashMap<Member, i8>,
    added: bool,
) {
    for &family in families {
        let members: BTreeSet<Member> = changes
            .iter()
            .filter(|(m, c)| (**c > 0) == added && m.family() == family)
            .map(|(m, _)| *m)
            .collect();
        if members.is_empty() {
            continue;
        }
        let target = if added {
            &mut update.members_added
        } else {
            &mut update.members_removed
        };
        target.insert(set_name(family, id), members);
    }
}
