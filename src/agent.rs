//! The agent loop: datastore events feed the calc graph on one thread, and the dataplane is
//! applied on another, so an apply in flight never holds up computing the next update.
//! Updates that arrive while an apply runs are coalesced into the next one. Nothing is
//! applied (so nothing removed) before the datastore's first complete listing.
//!
//! Timers on the dataplane thread: a post-write check (re-read iptables a short while after
//! each write, felix's IptablesPostWriteCheckIntervalSecs), a full iptables refresh
//! (IptablesRefreshInterval) and an IP set refresh (IpsetsRefreshInterval) that repair
//! whatever another program changed. A failed apply is retried with backoff; the rules
//! already in the kernel stay meanwhile.
//!
//! Both loops report their turns and progress to `Health` (liveness, readiness) and to the
//! metrics. Each event is stamped when it enters the calc graph; the flush reports the
//! stamps behind every local endpoint whose rules changed, and the dataplane observes them
//! in `netpol_programming_latency_seconds` once the apply carrying them has completed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::calc_graph::state::Update;
use crate::calc_graph::{CalcGraph, ObjectKind, RejectKind};
use crate::dataplane::{Dataplane, DataplaneConfig};
use crate::datastore::{apply_event, DatastoreEvent};
use crate::health::{Health, Loop};
use crate::metrics;

pub struct Timers {
    /// Full iptables re-read (`None`: never).
    pub refresh: Option<Duration>,
    /// IP set re-read (`None`: never).
    pub ipsets_refresh: Option<Duration>,
    pub post_write_check: Duration,
}

/// How often blocking waits look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);

/// One flush for the dataplane thread.
struct Batch {
    update: Update,
    /// When the events behind each changed local endpoint entered the calc graph.
    programming_starts: Vec<Instant>,
}

/// Runs until `stop` is set or the datastore goes away. Leaves the rules in place on exit:
/// pods stay protected while the agent restarts.
pub fn run(
    mut graph: CalcGraph,
    dataplane_cfg: DataplaneConfig,
    timers: Timers,
    events: Receiver<DatastoreEvent>,
    stop: Arc<AtomicBool>,
    health: Arc<Health>,
) -> anyhow::Result<()> {
    let m = metrics::global();
    let (update_tx, update_rx) = channel::<Batch>();
    let dataplane_stop = stop.clone();
    let dataplane_health = health.clone();
    let dataplane = std::thread::Builder::new()
        .name("dataplane".into())
        .spawn(move || {
            dataplane_loop(
                dataplane_cfg,
                timers,
                update_rx,
                dataplane_stop,
                dataplane_health,
            )
        })?;

    let mut in_sync = false;
    let mut started = Instant::now();
    let mut rejections_seen: BTreeMap<(ObjectKind, RejectKind), u64> = BTreeMap::new();
    'events: while !stop.load(Ordering::Relaxed) {
        health.turn(Loop::Calc);
        let first = match events.recv_timeout(STOP_POLL) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let batch_start = Instant::now();
        // Take everything already queued: one flush for the whole burst.
        let mut batch = vec![first];
        while let Ok(e) = events.try_recv() {
            batch.push(e);
        }
        for e in &batch {
            if matches!(e, DatastoreEvent::InSync) && !in_sync {
                in_sync = true;
                health.set_in_sync();
                m.datastore_in_sync.set(1);
                info!(
                    ms = started.elapsed().as_millis() as u64,
                    local_endpoints = graph.local_endpoint_count(),
                    active_policies = graph.active_policy_count(),
                    "datastore in sync"
                );
                started = Instant::now();
            }
            graph.set_event_time(Some(Instant::now()));
            apply_event(&mut graph, e);
        }
        m.calc_graph_events.inc_by(batch.len() as u64);
        let flushed = in_sync.then(|| Batch {
            update: graph.flush(),
            programming_starts: graph.take_programming_starts(),
        });
        m.calc_graph_update_seconds
            .observe(batch_start.elapsed().as_secs_f64());
        export_graph_gauges(&graph, &mut rejections_seen);
        if let Some(b) = flushed {
            if !b.update.is_empty() && update_tx.send(b).is_err() {
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
    m.active_local_policies
        .set(graph.active_policy_count() as i64);
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

fn dataplane_loop(
    cfg: DataplaneConfig,
    timers: Timers,
    updates: Receiver<Batch>,
    stop: Arc<AtomicBool>,
    health: Arc<Health>,
) -> anyhow::Result<()> {
    let m = metrics::global();
    let mut dp = Dataplane::new(&cfg)?;
    let far = Duration::from_secs(365 * 24 * 3600);
    let mut next_refresh = Instant::now() + timers.refresh.unwrap_or(far);
    let mut next_ipsets_refresh = Instant::now() + timers.ipsets_refresh.unwrap_or(far);
    let mut next_check: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Duration::from_millis(50);
    let mut received_any = false;
    let mut applied_once = false;
    // Programming-latency starts of the updates absorbed since the last successful apply.
    let mut pending_starts: Vec<Instant> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        health.turn(Loop::Dataplane);
        let mut deadline = next_refresh
            .min(next_ipsets_refresh)
            .min(Instant::now() + STOP_POLL);
        for t in [next_check, retry_at].into_iter().flatten() {
            deadline = deadline.min(t);
        }
        match updates.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(b) => {
                received_any = true;
                dp.absorb(&b.update);
                pending_starts.extend(b.programming_starts);
                while let Ok(b) = updates.try_recv() {
                    dp.absorb(&b.update);
                    pending_starts.extend(b.programming_starts);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        }
        // Nothing reaches the kernel before the first update, which comes after InSync.
        if !received_any {
            continue;
        }
        let now = Instant::now();
        if now >= next_ipsets_refresh {
            next_ipsets_refresh = now + timers.ipsets_refresh.unwrap_or(far);
            m.dataplane_resyncs.inc();
            if let Err(e) = dp.resync_ipsets() {
                warn!("IP set refresh failed: {e:#}");
            }
        }
        if now >= next_refresh {
            next_refresh = now + timers.refresh.unwrap_or(far);
            m.dataplane_resyncs.inc();
            dp.invalidate_iptables();
        }
        if next_check.is_some_and(|t| now >= t) {
            next_check = None;
            m.dataplane_resyncs.inc();
            dp.invalidate_iptables();
        }
        if retry_at.is_some_and(|t| now < t) || !dp.is_dirty() {
            continue;
        }
        match dp.apply() {
            Ok(report) => {
                retry_at = None;
                backoff = Duration::from_millis(50);
                m.apply_seconds.observe(report.duration.as_secs_f64());
                for start in pending_starts.drain(..) {
                    m.programming_latency_seconds
                        .observe(start.elapsed().as_secs_f64());
                }
                m.dataplane_in_sync.set(1);
                if !applied_once {
                    applied_once = true;
                    health.set_applied();
                    info!(
                        ms = report.duration.as_millis() as u64,
                        lines = report.iptables_lines,
                        "first full apply done"
                    );
                }
                if report.iptables_lines > 0 {
                    next_check = Some(Instant::now() + timers.post_write_check);
                }
            }
            Err(e) => {
                m.apply_failures.inc();
                m.dataplane_in_sync.set(0);
                error!(
                    "apply failed, keeping the rules in place and retrying in {backoff:?}: {e:#}"
                );
                retry_at = Some(Instant::now() + backoff);
                backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                dp.invalidate_iptables();
            }
        }
    }
    Ok(())
}
