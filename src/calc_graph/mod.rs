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
//! `CalcGraph`'s methods are split by what they do: the object-level entry points that
//! validate (`ingest`), the model-level updates and the selection indexes (`selection`), the
//! output (`flush`) and the read-only views (`views`); the state itself is declared here.
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

pub mod update;

mod flush;
mod ingest;
mod selection;
mod views;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use tracing::{debug, error};

use crate::rules::chains::{profile_chains, static_chains, tiered_endpoint_chains, TierChains};
use crate::rules::cluster::cluster_policy_chains;
use crate::rules::dispatch::dispatch_chains_with_addrs;
use crate::rules::policy::{plan_policy, policy_chains, PolicyPlan};
use crate::rules::sets::{set_name, Member, SetDef, SetSpec};
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

#[cfg(test)]
pub(crate) mod tests;
