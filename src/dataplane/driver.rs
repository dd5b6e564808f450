//! The dataplane thread: takes the calc graph's updates, folds everything that arrived while
//! an apply ran into the next one, and applies. Nothing reaches the kernel before the first
//! update (which comes after the datastore's first complete listing).
//!
//! Timers: a post-write check (re-read iptables a short while after each write, felix's
//! IptablesPostWriteCheckIntervalSecs), a full iptables refresh (IptablesRefreshInterval) and
//! an IP set refresh (IpsetsRefreshInterval) that repair whatever another program changed. A
//! failed apply is retried with back-off (`crate::backoff`); the rules already in the kernel
//! stay meanwhile. Each turn is reported to `Health`; each completed apply observes the
//! programming latency of the updates it carried.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::{Dataplane, DataplaneConfig};
use crate::backoff::Backoff;
use crate::calc_graph::update::Update;
use crate::telemetry::health::{Health, Loop};
use crate::telemetry::metrics;

pub struct Timers {
    /// Full iptables re-read (`None`: never).
    pub refresh: Option<Duration>,
    /// IP set re-read (`None`: never).
    pub ipsets_refresh: Option<Duration>,
    pub post_write_check: Duration,
}

/// How often an idle loop turns (health) and looks at the stop flag.
pub const IDLE_TURN: Duration = Duration::from_millis(200);

/// One flush of the calc graph, for the dataplane thread.
pub struct Batch {
    pub update: Update,
    /// When the events behind each changed local endpoint entered the calc graph.
    pub programming_starts: Vec<Instant>,
}

/// Runs the dataplane thread until `stop` is set or the sender goes away.
pub fn run(
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
    let mut backoff = Backoff::apply_retry();
    let mut received_any = false;
    let mut applied_once = false;
    // Programming-latency starts of the updates absorbed since the last successful apply.
    let mut pending_starts: Vec<Instant> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        health.turn(Loop::Dataplane);
        let mut deadline = next_refresh
            .min(next_ipsets_refresh)
            .min(Instant::now() + IDLE_TURN);
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
                backoff.reset();
                m.apply_seconds.observe(report.duration.as_secs_f64());
                for start in pending_starts.drain(..) {
                    m.programming_latency_seconds
                        .observe(start.elapsed().as_secs_f64());
                }
                m.dataplane_in_sync.set(1);
                if !applied_once {
                    applied_once = true;
                    health.set_applied();
                    // The start's transient peak (listing, first flush, restore scripts) is
                    // over: give its freed pages back.
                    crate::host::memory::release_free_memory();
                    info!(
                        ms = report.duration.as_millis() as u64,
                        lines = report.iptables_lines,
                        rss_kib = crate::host::memory::resident_kib(),
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
                let wait = backoff.next_delay();
                error!("apply failed, keeping the rules in place and retrying in {wait:?}: {e:#}");
                retry_at = Some(Instant::now() + wait);
                dp.invalidate_iptables();
            }
        }
    }
    Ok(())
}
