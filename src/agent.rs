//! The agent loop: datastore events feed the calc graph on one thread, and the dataplane is
//! applied on another, so an apply in flight never holds up computing the next update.
//! Updates that arrive while an apply runs are coalesced into the next one. Nothing is
//! applied (so nothing removed) before the datastore's first complete listing.
//!
//! Timers on the dataplane thread: a post-write check (re-read iptables a short while after
//! each write, felix's IptablesPostWriteCheckIntervalSecs) and a full refresh (iptables and
//! ipsets, IptablesRefreshInterval) that repairs whatever another program changed. A failed
//! apply is retried with backoff; the rules already in the kernel stay meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::calc_graph::state::Update;
use crate::calc_graph::CalcGraph;
use crate::dataplane::{Dataplane, DataplaneConfig};
use crate::datastore::{apply_event, DatastoreEvent};

pub struct Timers {
    pub refresh: Duration,
    pub post_write_check: Duration,
}

/// How often blocking waits look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);

/// Runs until `stop` is set or the datastore goes away. Leaves the rules in place on exit:
/// pods stay protected while the agent restarts.
pub fn run(
    mut graph: CalcGraph,
    dataplane_cfg: DataplaneConfig,
    timers: Timers,
    events: Receiver<DatastoreEvent>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let (update_tx, update_rx) = channel::<Update>();
    let dataplane_stop = stop.clone();
    let dataplane = std::thread::Builder::new()
        .name("dataplane".into())
        .spawn(move || dataplane_loop(dataplane_cfg, timers, update_rx, dataplane_stop))?;

    let mut in_sync = false;
    let mut started = Instant::now();
    'events: while !stop.load(Ordering::Relaxed) {
        let first = match events.recv_timeout(STOP_POLL) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        // Take everything already queued: one flush for the whole burst.
        let mut batch = vec![first];
        while let Ok(e) = events.try_recv() {
            batch.push(e);
        }
        for e in &batch {
            if matches!(e, DatastoreEvent::InSync) && !in_sync {
                in_sync = true;
                info!(
                    ms = started.elapsed().as_millis() as u64,
                    local_endpoints = graph.local_endpoint_count(),
                    active_policies = graph.active_policy_count(),
                    "datastore in sync"
                );
                started = Instant::now();
            }
            apply_event(&mut graph, e);
        }
        if !in_sync {
            continue;
        }
        let update = graph.flush();
        if !update.is_empty() && update_tx.send(update).is_err() {
            break 'events;
        }
    }
    drop(update_tx);
    match dataplane.join() {
        Ok(result) => result,
        Err(_) => anyhow::bail!("the dataplane thread panicked"),
    }
}

fn dataplane_loop(
    cfg: DataplaneConfig,
    timers: Timers,
    updates: Receiver<Update>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut dp = Dataplane::new(&cfg)?;
    let mut next_refresh = Instant::now() + timers.refresh;
    let mut next_check: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Duration::from_millis(50);
    let mut received_any = false;
    while !stop.load(Ordering::Relaxed) {
        let mut deadline = next_refresh.min(Instant::now() + STOP_POLL);
        for t in [next_check, retry_at].into_iter().flatten() {
            deadline = deadline.min(t);
        }
        match updates.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(u) => {
                received_any = true;
                dp.absorb(&u);
                while let Ok(u) = updates.try_recv() {
                    dp.absorb(&u);
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
        if now >= next_refresh {
            next_refresh = now + timers.refresh;
            if let Err(e) = dp.resync() {
                warn!("refresh failed: {e:#}");
            }
        }
        if next_check.is_some_and(|t| now >= t) {
            next_check = None;
            dp.invalidate_iptables();
        }
        if retry_at.is_some_and(|t| now < t) || !dp.is_dirty() {
            continue;
        }
        match dp.apply() {
            Ok(report) => {
                retry_at = None;
                backoff = Duration::from_millis(50);
                if report.iptables_lines > 0 {
                    next_check = Some(Instant::now() + timers.post_write_check);
                }
            }
            Err(e) => {
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
