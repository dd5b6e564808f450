//! The calculation loop, where the rooms meet: datastore events and interface-name events in,
//! the calc graph in the middle, the graph's updates out to the dataplane thread
//! (`dataplane::driver`), so an apply in flight never holds up computing the next update.
//! Updates that arrive while an apply runs are coalesced into the next one. Nothing is
//! applied (so nothing removed) before the datastore's first complete listing.
//!
//! Interface names are resolved here, at the edge: after each batch of events the local pods
//! the graph asks about are named with the configured resolver and the answers handed back
//! before the flush; when a resolver that learns over time (the container runtime, the routing
//! table, the bridge) says it learned something, every local pod is named again. The graph
//! itself never calls a resolver. [`Calculation`] pairs the two, for this loop and for offline
//! users (`compile`, the convergence check, tests and benchmarks).
//!
//! Both loops report their turns and progress to `Health` and to the metrics. Each event is
//! stamped when it enters the calc graph; the flush reports the stamps behind every local
//! endpoint whose rules changed, and the dataplane observes them in
//! `netpol_programming_latency_seconds` once the apply carrying them has completed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use self::unnamed::Unnamed;

pub mod unnamed;

use crate::calc_graph::update::Update;
use crate::calc_graph::{CalcGraph, GraphConfig, RejectKind};
use crate::dataplane::driver::{self, Batch, Timers, IDLE_TURN, QUIET_TURN};
use crate::dataplane::iptables::Ownership;
use crate::dataplane::watch::Interest;
use crate::dataplane::DataplaneConfig;
use crate::iface_naming::InterfaceResolver;
use crate::model::{DatastoreEvent, IpFamily, K8sObject, ObjectKind};
use crate::rules;
use crate::telemetry::health::{Health, Loop};
use crate::telemetry::metrics;
use crate::traffic::Traffic;

/// What the dataplane's iptables writer owns: the chain and rule-hash names `rules` renders.
pub const OWNERSHIP: Ownership = Ownership {
    chain_prefix: rules::CHAIN_PREFIX,
    rule_hash_prefix: rules::RULE_HASH_PREFIX,
    max_chain_len: rules::MAX_CHAIN_NAME_LEN,
};

/// What the dataplane's change detection watches: our table, the kernel chains we hook into,
/// our chains and sets, both families.
pub fn ours() -> Interest {
    Interest::new(
        &OWNERSHIP,
        &rules::chains::HOOKED_KERNEL_CHAINS,
        &[IpFamily::V4, IpFamily::V6],
    )
}

/// What the calculation loop reacts to, on one channel: the datastore's events, and a
/// resolver's word that it learned interface names.
#[derive(Debug)]
pub enum Input {
    Datastore(DatastoreEvent),
    InterfacesChanged,
    /// IPVS mode: this host's addresses changed (the this-host set).
    HostAddresses(Vec<std::net::IpAddr>),
    /// The stop flag was set (a signal): only wakes the loop, which then looks at the flag.
    Stop,
}

impl From<DatastoreEvent> for Input {
    fn from(event: DatastoreEvent) -> Input {
        Input::Datastore(event)
    }
}

/// The calc graph with interface names resolved at the edge: what the calculation loop
/// drives, and what offline users (`compile`, the convergence check, tests, benchmarks) drive
/// the same way. Derefs to the graph for everything else.
pub struct Calculation {
    graph: CalcGraph,
    resolver: Box<dyn InterfaceResolver>,
}

impl Calculation {
    pub fn new(cfg: GraphConfig, resolver: Box<dyn InterfaceResolver>) -> Calculation {
        Calculation {
            graph: CalcGraph::new(cfg),
            resolver,
        }
    }

    /// The whole graph for a set of objects, flushed: what `compile` renders.
    pub fn of_objects(
        cfg: GraphConfig,
        resolver: Box<dyn InterfaceResolver>,
        objects: &[K8sObject],
    ) -> Calculation {
        Calculation::of_objects_on_host(cfg, resolver, objects, [])
    }

    /// As `of_objects`, on a host with these addresses (IPVS mode: the this-host set holds
    /// them, as the agent's own graph does once it has read the node; ignored otherwise).
    /// They are handed in before the first flush so the set is rendered full, never empty
    /// first: what `compile --host-address` and `audit` compare a node's kernel against.
    pub fn of_objects_on_host(
        cfg: GraphConfig,
        resolver: Box<dyn InterfaceResolver>,
        objects: &[K8sObject],
        host_addrs: impl IntoIterator<Item = std::net::IpAddr>,
    ) -> Calculation {
        let mut calc = Calculation::new(cfg, resolver);
        calc.graph.set_host_addresses(host_addrs);
        calc.graph.feed(objects);
        calc.flush();
        calc
    }

    /// Names the local pods the graph asks about, then renders what changed.
    pub fn flush(&mut self) -> Update {
        self.name_pods();
        self.graph.flush()
    }

    /// A resolver learned something: every local pod is named again (only changed answers
    /// change the graph; the next `flush` renders them).
    pub fn interfaces_changed(&mut self) {
        for pod in self.graph.local_pods() {
            let answer = self.resolver.resolve(&pod).map_err(|e| e.to_string());
            self.graph.set_interface(&pod.key, answer);
        }
    }

    fn name_pods(&mut self) {
        for pod in self.graph.take_pods_to_name() {
            let answer = self.resolver.resolve(&pod).map_err(|e| e.to_string());
            self.graph.set_interface(&pod.key, answer);
        }
    }

    pub fn resolver(&self) -> &dyn InterfaceResolver {
        self.resolver.as_ref()
    }
}

impl std::ops::Deref for Calculation {
    type Target = CalcGraph;
    fn deref(&self) -> &CalcGraph {
        &self.graph
    }
}

impl std::ops::DerefMut for Calculation {
    fn deref_mut(&mut self) -> &mut CalcGraph {
        &mut self.graph
    }
}

/// How often the calculation loop checks that local pods' interfaces exist (`unnamed`).
const INTERFACE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs until `stop` is set or the datastore goes away. Leaves the rules in place on exit:
/// pods stay protected while the agent restarts. `traffic` hears of every event, flush and
/// turn, and publishes what deny logging and the rule counters need (nothing when off).
/// Local pods without an existing interface for `interface_grace` are reported (`unnamed`).
#[allow(clippy::too_many_arguments)]
pub fn run(
    mut graph: Calculation,
    dataplane_cfg: DataplaneConfig,
    timers: Timers,
    inputs: Receiver<Input>,
    stop: Arc<AtomicBool>,
    health: Arc<Health>,
    mut traffic: Traffic,
    interface_grace: std::time::Duration,
) -> anyhow::Result<()> {
    let m = metrics::global();
    let (update_tx, update_rx) = channel::<Batch>();
    let dataplane_stop = stop.clone();
    let dataplane_health = health.clone();
    let dataplane = std::thread::Builder::new()
        .name("dataplane".into())
        .spawn(move || {
            driver::run(
                dataplane_cfg,
                timers,
                update_rx,
                dataplane_stop,
                dataplane_health,
            )
        })?;

    let mut in_sync = false;
    let started = Instant::now();
    let mut rejections_seen: BTreeMap<(ObjectKind, RejectKind), u64> = BTreeMap::new();
    let mut unnamed = Unnamed::new(interface_grace);
    // Opened once: the interface check asks for every pod without an interface.
    let iface_probe = crate::host::iface_probe::IfaceProbe::open()
        .inspect_err(
            |e| warn!(error = %e, "no socket for the interface check; asking libc per name"),
        )
        .ok();
    let mut outside_reported: std::collections::BTreeSet<crate::model::ObjectKey> =
        Default::default();
    // Kinds the API server refuses the datastore, with why (`DatastoreEvent::Access`).
    let mut refused: BTreeMap<ObjectKind, String> = BTreeMap::new();
    let mut next_interface_check = Instant::now();
    // Whether the graph took a batch since the last interface check.
    let mut graph_changed = true;
    'events: while !stop.load(Ordering::Relaxed) {
        health.turn(Loop::Calc);
        traffic.tick(&graph);
        if in_sync && Instant::now() >= next_interface_check {
            next_interface_check = Instant::now() + INTERFACE_CHECK;
            // At rest, with every interface found, nothing is listed or tested.
            if graph_changed || unnamed.due(Instant::now()) {
                graph_changed = false;
                check_interfaces(&graph, &mut unnamed, iface_probe.as_ref(), &health);
            }
        }
        // At rest nothing is due before the next interface check, unless deny or flow logs
        // want their turns: sleep until an input or that.
        let turn = if traffic.wants_turns() {
            IDLE_TURN
        } else {
            QUIET_TURN.min(INTERFACE_CHECK)
        };
        let first = match inputs.recv_timeout(turn.min(health.turn_bound())) {
            Ok(Input::Stop) => continue,
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        graph_changed = true;
        let batch_start = Instant::now();
        // Take everything already queued: one flush for the whole burst.
        let mut batch = vec![first];
        while let Ok(e) = inputs.try_recv() {
            batch.push(e);
        }
        let mut datastore_events = 0;
        let mut rename_all = false;
        let mut just_synced = false;
        for input in &batch {
            match input {
                Input::Datastore(DatastoreEvent::Access { kind, refused: why }) => {
                    let gauge = m
                        .datastore_access_refused
                        .with_label_values(&[kind.as_str()]);
                    match why {
                        Some(why) => {
                            gauge.set(1);
                            refused.insert(*kind, why.clone());
                        }
                        None => {
                            gauge.set(0);
                            refused.remove(kind);
                        }
                    }
                    health.set_datastore_refused((!refused.is_empty()).then(|| {
                        let kinds: Vec<String> = refused
                            .iter()
                            .map(|(k, why)| format!("{} ({why})", k.as_str()))
                            .collect();
                        format!(
                            "the API server refuses this agent's service account the right to list and watch {}; the rules stay as last programmed and may be stale (RBAC: deploy/base/clusterrole.yaml)",
                            kinds.join(", ")
                        )
                    }));
                }
                Input::Datastore(e) => {
                    datastore_events += 1;
                    if matches!(e, DatastoreEvent::InSync) && !in_sync {
                        in_sync = true;
                        just_synced = true;
                        health.set_in_sync();
                        m.datastore_in_sync.set(1);
                    }
                    graph.set_event_time(Some(Instant::now()));
                    traffic.before(&graph, e);
                    graph.apply(e);
                }
                Input::InterfacesChanged => rename_all = true,
                Input::HostAddresses(addrs) => graph.set_host_addresses(addrs.iter().copied()),
                Input::Stop => {}
            }
        }
        graph.set_event_time(Some(Instant::now()));
        if rename_all {
            graph.interfaces_changed();
        }
        m.calc_graph_events.inc_by(datastore_events);
        let mut flushed = in_sync.then(|| Batch {
            update: graph.flush(),
            programming_starts: graph.take_programming_starts(),
            on_applied: Vec::new(),
        });
        if just_synced {
            info!(
                ms = started.elapsed().as_millis() as u64,
                local_endpoints = graph.local_endpoint_count(),
                active_policies = graph.active_policy_count(),
                "datastore in sync"
            );
        }
        m.calc_graph_update_seconds
            .observe(batch_start.elapsed().as_secs_f64());
        traffic.after_batch(&graph, flushed.as_ref().map(|b| &b.update));
        if let Some(f) = traffic.take_on_applied() {
            match flushed.as_mut() {
                // Even with an empty update: behind the batches still being applied.
                Some(b) => b.on_applied.push(f),
                // Nothing was ever sent: nothing to wait for.
                None => f(),
            }
        }
        export_graph_gauges(&graph, &mut rejections_seen);
        check_families(&graph, &mut outside_reported, &health);
        if let Some(b) = flushed {
            if (!b.update.is_empty() || !b.on_applied.is_empty()) && update_tx.send(b).is_err() {
                break 'events;
            }
        }
    }
    drop(update_tx);
    match dataplane.join() {
        Ok(result) => result,
        Err(_) => anyhow::bail!("the dataplane thread panicked"),
    }
}

/// One check of the local pods' interfaces: warnings for pods newly past the grace period,
/// the gauge, and readiness when the configuration fits no local pod.
fn check_interfaces(
    graph: &CalcGraph,
    unnamed: &mut Unnamed,
    probe: Option<&crate::host::iface_probe::IfaceProbe>,
    health: &Health,
) {
    let exists = |iface: &str| match probe {
        Some(p) => p.exists(iface),
        None => nix::net::if_::if_nametoindex(iface).is_ok(),
    };
    let checked = unnamed.check(Instant::now(), graph.local_pod_interfaces(), exists);
    if !checked.newly.is_empty() {
        let wiring = crate::host::wiring::read();
        let cfg = &graph.config().rules;
        for report in &checked.newly {
            let carriers: Vec<String> = match &wiring {
                Ok(w) => report.ips.iter().flat_map(|ip| w.carriers(*ip)).collect(),
                Err(e) => vec![format!("(the node could not be read: {e:#})")],
            };
            let names: Vec<String> = match &wiring {
                Ok(w) => report
                    .ips
                    .iter()
                    .flat_map(|ip| w.carrier_names(*ip))
                    .collect(),
                Err(_) => Vec::new(),
            };
            let conclusion = unnamed::conclusion(&names, &cfg.interface_prefixes);
            // Bounded: a pod from a datastore that does not hold it to one address per
            // family could bring thousands.
            let carriers = first_few(&carriers);
            let ips = first_few(
                &report
                    .ips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            );
            warn!(
                pod = %crate::model::validate::shown_name(&report.pod.to_string()),
                ips = ips.join(","),
                interface = report.iface.as_deref().unwrap_or(""),
                carriers = carriers.join("; "),
                "local pod without a host interface for the grace period: {}; its address is reached through {}; {conclusion}, so its traffic meets none of its policy",
                match &report.iface {
                    Some(i) => format!("it was named {i}, and no such interface exists"),
                    None => "no interface was found for it".into(),
                },
                if carriers.is_empty() { "no interface of this node".into() } else { carriers.join(", ") },
            );
        }
    }
    metrics::global()
        .local_pods_without_interface
        .set(checked.without as i64);
    health.set_misfit(checked.fits_nothing().then(|| {
        format!(
            "none of the {} local pods has a host interface the configuration finds (FELIX_INTERFACEPREFIX={}, see the log's warnings for where their addresses are)",
            checked.local,
            graph.config().rules.interface_prefixes.join(",")
        )
    }));
}

/// Local pods with addresses of a family the agent does not program: an error per pod when
/// first seen, the gauge, and readiness refused while there are any (their traffic in that
/// family is open whatever the policies say, so staying ready would be failing silently).
fn check_families(
    graph: &CalcGraph,
    reported: &mut std::collections::BTreeSet<crate::model::ObjectKey>,
    health: &Health,
) {
    let outside = graph.pods_outside_families();
    if outside.is_empty() && reported.is_empty() {
        return;
    }
    reported.retain(|k| outside.contains_key(k));
    for (key, ips) in outside {
        if reported.insert(key.clone()) {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            tracing::error!(
                pod = %crate::model::validate::shown_name(&key.to_string()),
                ips = first_few(&ips).join(","),
                "local pod has an address of a family this agent does not program (FELIX_IPV6SUPPORT=false): its traffic there meets no rule and is open whatever the policies say; set FELIX_IPV6SUPPORT=true (the default)"
            );
        }
    }
    metrics::global()
        .local_pods_unprogrammed_family
        .set(outside.len() as i64);
    health.set_unprogrammed_family((!outside.is_empty()).then(|| {
        let pods: Vec<String> = outside
            .iter()
            .map(|(k, ips)| {
                format!(
                    "{} ({})",
                    crate::model::validate::shown_name(&k.to_string()),
                    ips.first().map(ToString::to_string).unwrap_or_default()
                )
            })
            .collect();
        format!(
            "IPv6 support is off (FELIX_IPV6SUPPORT=false) but {} local pod(s) have IPv6 addresses whose traffic no rule of this agent sees: {}; set FELIX_IPV6SUPPORT=true",
            outside.len(),
            first_few(&pods).join(", ")
        )
    }));
}

/// At most four items, then how many more.
fn first_few(items: &[String]) -> Vec<String> {
    const SHOWN: usize = 4;
    let mut out: Vec<String> = items.iter().take(SHOWN).cloned().collect();
    if items.len() > SHOWN {
        out.push(format!("and {} more", items.len() - SHOWN));
    }
    out
}

fn reason_label(r: &RejectKind) -> &'static str {
    match r {
        RejectKind::Invalid => "invalid",
        RejectKind::Interface => "interface",
    }
}

/// Endpoint, policy and rejection figures after a batch.
fn export_graph_gauges(graph: &CalcGraph, seen: &mut BTreeMap<(ObjectKind, RejectKind), u64>) {
    let m = metrics::global();
    m.active_local_endpoints
        .set(graph.local_endpoint_count() as i64);
    m.guarded_local_pods.set(graph.guarded_pods().len() as i64);
    m.active_local_policies
        .set((graph.active_policy_count() + graph.active_cluster_policy_count()) as i64);
    for (key, &count) in graph.rejection_counts() {
        let before = seen.insert(key.clone(), count).unwrap_or(0);
        if count > before {
            m.rejections
                .with_label_values(&[key.0.as_str(), reason_label(&key.1)])
                .inc_by(count - before);
        }
    }
    let mut current: BTreeMap<ObjectKind, i64> = [
        (ObjectKind::Pod, 0),
        (ObjectKind::Namespace, 0),
        (ObjectKind::NetworkPolicy, 0),
        (ObjectKind::ClusterNetworkPolicy, 0),
    ]
    .into();
    for (kind, _) in graph.rejections().keys() {
        *current.entry(*kind).or_default() += 1;
    }
    for (kind, n) in current {
        m.rejected_objects
            .with_label_values(&[kind.as_str()])
            .set(n);
    }
}
