//! What the kernel tells about the traffic policy decided, at the edge: deny logs (the NFLOG
//! group the deny-log rules feed, read on a thread of its own) and the kernel's rule counters
//! (per-policy allows, per-pod denies) read on a timer; and conntrack re-evaluation
//! ([`reevaluate`], [`cutter`]), which cuts tracked connections a policy change now denies. The
//! calculation loop publishes what the graph knows ([`attribution`], [`counters::CounterPlan`])
//! and hands over each batch's changes once the dataplane applied it; these threads never touch
//! the graph. Pending verdicts of flow records under staged policies ([`staged`]) are
//! computed from the objects the loop sees, never from the graph (which ignores staged ones).

pub mod attribution;
pub mod counters;
pub mod cutter;
pub mod deny_log;
pub mod flow_log;
pub mod flow_page;
pub mod reevaluate;
pub mod staged;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::calc_graph::update::Update;
use crate::calc_graph::CalcGraph;
use crate::model::validate::namespaced_key;
use crate::model::{DatastoreEvent, K8sObject, ObjectKey, ObjectKind};

use crate::dataplane::driver::OnApplied;

use attribution::{Attribution, LocalChains};
use counters::{CounterPlan, CounterSettings, PlanSlot};
use cutter::{Cutter, CutterSettings, Job};
use deny_log::{DenyLog, DenyLogSettings};
use flow_log::{FlowLog, FlowLogSettings};
use reevaluate::Change;

/// What to start: deny logging, rule counters, both or neither.
#[derive(Clone, Debug, Default)]
pub struct TrafficConfig {
    pub deny_log: Option<DenyLogSettings>,
    /// Flow logs (`FELIX_FLOWLOGSENABLED`).
    pub flow_log: Option<FlowLogSettings>,
    /// The counter reader; it runs when deny logging is on (denied packets per pod) or
    /// `policy_counters` is.
    pub counters: Option<CounterSettings>,
    pub policy_counters: bool,
    /// Conntrack re-evaluation (`FELIX_CONNTRACKREEVALUATE`).
    pub conntrack: Option<CutterSettings>,
}

/// The calculation loop's side of deny logging and the rule counters: it tells this what
/// happened (events, flushes, idle turns) and this publishes what the threads need. With
/// everything off it holds nothing and does nothing.
#[derive(Default)]
pub struct Traffic {
    /// What deny logs and flow logs name packets with (one address map for both).
    names: Option<Names>,
    deny: Option<DenyLog>,
    flow: Option<FlowLog>,
    /// The objects pending verdicts are computed from (flow logs on; `staged`).
    staged: Option<staged::Objects>,
    /// Where the pending verdicts are published for the flow records.
    pending: Arc<staged::PendingSlot>,
    counters: Option<CounterState>,
    cut: Option<CutState>,
}

struct CutState {
    cutter: Cutter,
    /// This batch's changes.
    pending: Vec<Change>,
    /// Whether a batch was flushed before this one (the first flush only sets the baseline).
    flushed_before: bool,
    /// The finished batch's hand-over, for the agent to run once the dataplane applied it.
    ready: Option<OnApplied>,
}

struct Names {
    attribution: Arc<Attribution>,
    /// Flow logs need the policy chains too.
    policy_chains: bool,
    /// Pods events of this batch were about, with their addresses before the batch (their
    /// addresses after it are looked up in the graph then).
    touched: HashMap<ObjectKey, Vec<std::net::IpAddr>>,
    chains_published: bool,
}

struct CounterState {
    slot: Arc<PlanSlot>,
    policies: bool,
    denies: bool,
    interval: Duration,
    dirty: bool,
    built: Option<Instant>,
    _thread: JoinHandle<()>,
}

impl Traffic {
    /// Nothing on: no socket, no thread.
    pub fn off() -> Traffic {
        Traffic::default()
    }

    /// Binds the deny-log group and starts the threads that are on, in the calling thread's
    /// network namespace. Fails (before anything is programmed) when the group is taken.
    pub fn start(cfg: TrafficConfig, stop: Arc<AtomicBool>) -> anyhow::Result<Traffic> {
        let mut traffic = Traffic::off();
        if cfg.deny_log.is_some() || cfg.flow_log.is_some() {
            traffic.names = Some(Names {
                attribution: Arc::new(if cfg.flow_log.is_some() {
                    Attribution::with_labels()
                } else {
                    Attribution::default()
                }),
                policy_chains: cfg.flow_log.is_some(),
                touched: HashMap::new(),
                chains_published: false,
            });
        }
        if let (Some(settings), Some(names)) = (&cfg.deny_log, &traffic.names) {
            let reader = DenyLog::start(settings, names.attribution.clone()).with_context(|| {
                format!(
                    "deny logging (FELIX_DENYLOGENABLED): binding NFLOG group {} (FELIX_DENYLOGNFLOGGROUP)",
                    settings.group
                )
            })?;
            traffic.deny = Some(reader);
        }
        if let (Some(settings), Some(names)) = (&cfg.flow_log, &traffic.names) {
            let annotator: Arc<dyn flow_log::Annotator> = traffic.pending.clone();
            let reader = FlowLog::start(settings, names.attribution.clone(), annotator, stop.clone()).with_context(|| {
                format!(
                    "flow logs (FELIX_FLOWLOGSENABLED): binding NFLOG group {} (FELIX_FLOWLOGSNFLOGGROUP)",
                    settings.group
                )
            })?;
            traffic.flow = Some(reader);
            traffic.staged = Some(staged::Objects::default());
        }
        let denies = cfg.deny_log.is_some();
        if let Some(settings) = cfg.counters.filter(|_| cfg.policy_counters || denies) {
            let slot: Arc<PlanSlot> = Arc::default();
            let interval = settings.interval;
            let thread = counters::spawn(settings, slot.clone(), stop.clone())
                .context("starting the rule-counter thread")?;
            traffic.counters = Some(CounterState {
                slot,
                policies: cfg.policy_counters,
                denies,
                interval,
                dirty: true,
                built: None,
                _thread: thread,
            });
        }
        if let Some(settings) = cfg.conntrack {
            traffic.cut = Some(CutState {
                cutter: Cutter::spawn(settings, stop)?,
                pending: Vec::new(),
                flushed_before: false,
                ready: None,
            });
        }
        Ok(traffic)
    }

    /// The shared attribution, when deny logging or flow logs are on (for tests and tools).
    pub fn attribution(&self) -> Option<Arc<Attribution>> {
        self.names.as_ref().map(|d| d.attribution.clone())
    }

    /// What `GET /flows` reads, when flow logs are on.
    pub fn flows(&self) -> Option<Arc<flow_log::FlowLogShared>> {
        self.flow.as_ref().map(FlowLog::shared)
    }

    /// A datastore event is about to enter the graph: remembers a pod's addresses before it.
    pub fn before(&mut self, graph: &CalcGraph, event: &DatastoreEvent) {
        match self.staged.as_mut() {
            Some(objects) => objects.observe(event),
            None => staged::check(event),
        }
        if let Some(cut) = self.cut.as_mut() {
            cut.pending.extend(Change::of_event(event));
        }
        let Some(deny) = self.names.as_mut() else {
            return;
        };
        let key = match event {
            DatastoreEvent::Upsert(o) => match o.as_ref() {
                K8sObject::Pod(p) => namespaced_key(&p.metadata),
                _ => return,
            },
            DatastoreEvent::Delete(r) if r.kind == ObjectKind::Pod => match r.key.split_once('/') {
                Some((ns, name)) => ObjectKey::new(ns, name),
                None => return,
            },
            _ => return,
        };
        let old = graph.pod_ips(&key);
        let seen = deny.touched.entry(key).or_default();
        for ip in old {
            if !seen.contains(ip) {
                seen.push(*ip);
            }
        }
    }

    /// After a batch of events (and its flush, when there was one).
    pub fn after_batch(&mut self, graph: &CalcGraph, update: Option<&Update>) {
        self.publish_pending(graph);
        if let Some(cut) = self.cut.as_mut() {
            if !cut.pending.is_empty() {
                let job = Job {
                    changes: std::mem::take(&mut cut.pending),
                    cut: cut.flushed_before,
                };
                let tx = cut.cutter.sender();
                let previous = cut.ready.take();
                cut.ready = Some(Box::new(move || {
                    if let Some(f) = previous {
                        f();
                    }
                    let _ = tx.send(job);
                }));
            }
            cut.flushed_before |= update.is_some();
        }
        let chains_changed =
            update.is_some_and(|u| !u.chains_upserted.is_empty() || !u.chains_removed.is_empty());
        if let Some(deny) = self.names.as_mut() {
            if !deny.touched.is_empty() {
                let touched = std::mem::take(&mut deny.touched);
                deny.attribution
                    .update_addresses(touched.iter().map(|(key, old)| {
                        let new = graph.pod_ips(key);
                        (key, old.as_slice(), new)
                    }));
                if deny.attribution.keeps_labels() {
                    deny.attribution
                        .update_labels(touched.into_keys().map(|key| {
                            let labels = graph.pod(&key).map(|p| p.labels);
                            (key, labels)
                        }));
                }
            }
            if chains_changed || (update.is_some() && !deny.chains_published) {
                let mut chains = LocalChains::from_views(graph.programmed_endpoints())
                    .with_cluster_policies(graph.active_cluster_policies());
                if deny.policy_chains {
                    chains = chains.with_policies(graph.active_policies().cloned());
                }
                deny.attribution.publish_chains(chains);
                deny.chains_published = true;
            }
        }
        if let Some(c) = self.counters.as_mut() {
            c.dirty |= chains_changed;
            if update.is_some() {
                c.maybe_build(graph);
            }
        }
    }

    /// What must run once the dataplane holds the batch just flushed (conntrack
    /// re-evaluation of its changes); `None` when nothing waits.
    pub fn take_on_applied(&mut self) -> Option<OnApplied> {
        self.cut.as_mut().and_then(|c| c.ready.take())
    }

    /// Whether [`tick`](Traffic::tick) has work at idle turns (deny logs, flow logs, the rule
    /// counters, staged policies: metrics to export, plans and pending verdicts that waited
    /// for their spacing). With all of them off the calculation loop may sleep until an
    /// input comes.
    pub fn wants_turns(&self) -> bool {
        self.deny.is_some()
            || self.flow.is_some()
            || self.counters.is_some()
            || self.staged.is_some()
    }

    /// The calculation loop's turn (also when idle): metrics of the deny-log reader, and a
    /// counter plan that waited for its interval.
    pub fn tick(&mut self, graph: &CalcGraph) {
        self.publish_pending(graph);
        if let Some(deny) = self.deny.as_mut() {
            deny.sync();
        }
        if let Some(flow) = self.flow.as_mut() {
            flow.sync();
        }
        if let Some(c) = self.counters.as_mut() {
            if c.built.is_some() {
                c.maybe_build(graph);
            }
        }
    }
}

impl Traffic {
    /// A new pending state for the flow records, when the objects changed (spaced).
    fn publish_pending(&mut self, graph: &CalcGraph) {
        if let (Some(objects), Some(_)) = (self.staged.as_mut(), self.flow.as_ref()) {
            objects.maybe_publish(&graph.config().rules, &self.pending);
        }
    }
}

impl CounterState {
    /// Rebuilds and publishes the plan when chains changed, at most once per interval: the
    /// reader only looks at it once per interval, and packets a rule counts before the plan
    /// knows it are not lost (a rule's first reading counts whole).
    fn maybe_build(&mut self, graph: &CalcGraph) {
        if !self.dirty || self.built.is_some_and(|t| t.elapsed() < self.interval) {
            return;
        }
        let plan = CounterPlan::build(graph, self.policies, self.denies);
        if let Ok(mut slot) = self.slot.write() {
            *slot = Some(Arc::new(plan));
        }
        self.built = Some(Instant::now());
        self.dirty = false;
    }
}
