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
//! The graph is a set of calculators, each owning its own state and keeping its own
//! invariants (see each module's doc), and `CalcGraph`, which owns them and is the only place
//! they meet. A calculator never calls another: it reads what it is handed and returns its
//! effects (`Effects`: owners to re-render, set references to take or drop, in order), and
//! the graph routes those to the next calculators:
//!
//! ```text
//!  object ─▶ ingest (validate) ──invalid──▶ rejections
//!              │ valid
//!              ▼ model_events
//!  pod, namespace ─▶ set_index (pods, labels, set members)
//!  local pod ─▶ families (addresses outside the programmed families)
//!            ─▶ interfaces (to name; claims; unnamed) ─▶ endpoint added, renamed, gone
//!  endpoint, policy, relabel ─▶ selection (reads labels from set_index)
//!
//!  selection ─────────────── Effects.set_refs ─▶ set_index (acquire / release)
//!  selection, interfaces ─── Effects.owners ───▶ emitted (dirty)
//!
//!  flush: interfaces.unnamed + selection ─▶ guard ─▶ emitted (dirty)
//!         emitted's dirty endpoints + selection + interfaces ─▶ union_set (which unions)
//!         set_index's pending changes ─▶ union_set (members) ─▶ emitted (sets) ─▶ Update
//!         union_set, host_set ─▶ Update
//!         each dirty owner rendered from selection, interfaces, set_index, union_set, guard
//!           ─▶ emitted (diffed against what it emitted) ─▶ Update
//! ```
//!
//! Files: the calculators (`rejections`, `interfaces`, `selection` with its
//! ClusterNetworkPolicy half in `cluster`, `set_index`, `union_set`, `guard`, `host_set`,
//! `families`, `emitted`); the wiring: object-level entry points that validate (`ingest`),
//! the model-level events (`model_events`), the flush and rendering (`flush`); read-only views
//! (`views`, `provenance`); the output types (`update`).
//!
//! Interface names come from outside: the graph never calls a resolver. A local pod's upsert
//! puts it on the list `take_pods_to_name` hands out; the caller (the agent loop, or
//! `compile`) names it at the edge and answers with `set_interface`, before `flush`. Until it
//! is named a local pod has no chains, and its traffic meets "Unknown interface"; when a
//! policy isolates it, the guard (`guard`) also drops its traffic by address until then.

mod cluster;
mod compact_pod;
mod emitted;
mod families;
mod guard;
mod host_set;
mod interfaces;
mod provenance;
mod rejections;
mod selection;
mod set_index;
mod union_set;
pub mod update;

mod flush;
mod ingest;
mod model_events;
mod views;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use crate::model::{IpFamily, ObjectKey, ObjectKind};
use crate::rules::sets::SetDef;
use crate::rules::RuleConfig;

use emitted::Emitted;
use families::Families;
use guard::Guard;
use interfaces::Interfaces;
use rejections::Rejections;
use selection::Selection;
use set_index::SetIndex;

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

/// What a calculator's step means for the others: the owners whose chains must be rendered
/// again, and the set references to take (`true`) or drop, in the order they must be applied
/// (a set dropped and taken again within one step must not be churned).
#[derive(Default)]
struct Effects {
    owners: Vec<Owner>,
    set_refs: Vec<(bool, SetDef)>,
}

impl Effects {
    /// Moves an owner's set references from its old version to its new one: the new ones
    /// are taken first, so sets both versions use are not churned.
    fn move_set_references(&mut self, acquire: Vec<SetDef>, release: Vec<SetDef>) {
        self.set_refs.extend(acquire.into_iter().map(|d| (true, d)));
        self.set_refs
            .extend(release.into_iter().map(|d| (false, d)));
    }
}

pub struct CalcGraph {
    cfg: GraphConfig,
    rejections: Rejections,
    interfaces: Interfaces,
    selection: Selection,
    sets: SetIndex,
    unions: union_set::UnionSets,
    guard: Guard,
    /// IPVS mode: this host's addresses (the this-host set).
    host_set: host_set::HostSet,
    families: Families,
    emitted: Emitted,
}

impl CalcGraph {
    pub fn new(cfg: GraphConfig) -> CalcGraph {
        let mut graph = CalcGraph {
            families: Families::new(cfg.families.clone()),
            cfg,
            rejections: Rejections::default(),
            interfaces: Interfaces::default(),
            selection: Selection::default(),
            sets: SetIndex::default(),
            unions: union_set::UnionSets::default(),
            guard: Guard::default(),
            host_set: host_set::HostSet::default(),
            emitted: Emitted::default(),
        };
        graph.emitted.mark(Owner::Static);
        graph.emitted.mark(Owner::Dispatch);
        if crate::rules::guard::is_pending(&graph.cfg.rules) {
            // The pending chains hold from the first apply, before any pod is known.
            graph.emitted.mark(Owner::Guard);
        }
        graph
    }

    /// Routes a calculator's effects: set references to the set index, owners to the output.
    fn route(&mut self, fx: Effects) {
        for (acquire, def) in &fx.set_refs {
            if *acquire {
                self.sets.acquire(def);
            } else {
                self.sets.release(def);
            }
        }
        for owner in fx.owners {
            self.emitted.mark(owner);
        }
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
        self.rejections.current()
    }

    /// How many times objects were rejected, by kind and reason, since the graph started.
    pub fn rejection_counts(&self) -> &BTreeMap<(ObjectKind, RejectKind), u64> {
        self.rejections.counts()
    }

    /// Stamps the events that follow with the time they entered the graph (`None`: stop
    /// stamping). A flush then reports, for each local endpoint whose rules it changed
    /// because of a stamped event (its first sighting, a policy selecting it that was added,
    /// changed or removed), when the earliest such event came in; see
    /// `take_programming_starts`. The graph never reads a clock itself.
    pub fn set_event_time(&mut self, at: Option<Instant>) {
        self.emitted.set_event_time(at);
    }

    /// The start times gathered by the flushes since the last call, one per local endpoint
    /// and flush whose rules changed (for the programming-latency metric: the caller observes
    /// them once the apply carrying those flushes has completed).
    pub fn take_programming_starts(&mut self) -> Vec<Instant> {
        self.emitted.take_programming_starts()
    }

    /// Local pods with addresses of a family not programmed, with those addresses.
    pub fn pods_outside_families(&self) -> &BTreeMap<ObjectKey, Vec<IpAddr>> {
        self.families.outside()
    }

    /// The pods the guard holds, as of the last flush.
    pub fn guarded_pods(&self) -> &[crate::rules::guard::Guarded] {
        self.guard.pods()
    }

    pub fn set_evaluations(&self) -> u64 {
        self.sets.evaluations
    }
}

#[cfg(test)]
pub(crate) mod tests;
