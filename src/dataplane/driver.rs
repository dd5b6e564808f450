//! The dataplane thread: takes the calc graph's updates, folds everything that arrived while
//! an apply ran into the next one, and applies. Nothing reaches the kernel before the first
//! update (which comes after the datastore's first complete listing).
//!
//! At rest it asks the kernel cheaply whether anything of ours changed (`sentinel`: every
//! `FELIX_KERNELCHECKINTERVAL`, the IP sets on their own interval, stretched up to 1.5 s
//! while their check is dear, see `sentinel::sets_check_interval`; and exactly every
//! `FELIX_KERNELVERIFYINTERVAL`, stretched up to 10 min while the verify is dear,
//! `sentinel::verify_interval`) and reads and repairs only then. Behind that, slow timers:
//! a full iptables refresh (IptablesRefreshInterval) and an IP set refresh
//! (IpsetsRefreshInterval), the safety net, each stretched up to an hour while it is dear
//! and its part is watched (`sentinel::refresh_interval`; the first ones by the first
//! apply's cost, a full read and write); and a post-write check (re-read iptables a short
//! while after writes, felix's IptablesPostWriteCheckIntervalSecs) where the kernel does not
//! announce every commit (legacy iptables; nft's change events do). A part whose watch
//! cannot be opened is re-read every 10 s at most. A failed apply is retried with back-off
//! (`crate::backoff`); the rules already in the kernel stay meanwhile. Each turn is reported
//! to `Health`; each completed apply observes the programming latency of the updates it
//! carried.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::sentinel::{cpu_with_children, refresh_interval, Sentinel, Verdict};
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
    /// Cheap change checks (`None`: off).
    pub kernel_check: Option<Duration>,
    /// Exact change checks (`None`: off).
    pub kernel_verify: Option<Duration>,
}

/// How often a part whose change watch could not be opened is re-read at most.
const UNWATCHED_REFRESH: Duration = Duration::from_secs(10);

/// How often the calculation loop turns at rest while deny logs, flow logs or the rule
/// counters have work at every turn (`Traffic::wants_turns`).
pub const IDLE_TURN: Duration = Duration::from_millis(200);
/// The longest either loop sleeps at rest when nothing of its own is due (shorter when the
/// watchdog is, `Health::turn_bound`). Each turn is a wake-up of the thread, and a node at
/// rest should cost nothing between its checks. Neither loop needs a turn to see a stop:
/// a signal wakes the calculation loop (`Input::Stop`), whose end closes the channel the
/// dataplane loop waits on. A restart in place asked by another thread (auto's wiring seen,
/// kube-ipvs0 come or gone) is seen at the next turn, within this.
pub const QUIET_TURN: Duration = Duration::from_secs(2);

/// One flush of the calc graph, for the dataplane thread.
pub struct Batch {
    pub update: Update,
    /// When the events behind each changed local endpoint entered the calc graph.
    pub programming_starts: Vec<Instant>,
    /// Called once the kernel holds this batch (after the apply that carries it, or at once
    /// when it changed nothing there): what must not run before the rules are in.
    pub on_applied: Vec<OnApplied>,
}

/// See [`Batch::on_applied`].
pub type OnApplied = Box<dyn FnOnce() + Send>;

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
    let turned = health.clone();
    dp.on_each_try(Arc::new(move || turned.turn(Loop::Dataplane)));
    let watching = timers.kernel_check.is_some() || timers.kernel_verify.is_some();
    let mut sentinel = if watching {
        let (sentinel, problems) =
            Sentinel::open(dp.backend(), &dp.families(), cfg.interest.clone());
        for p in problems {
            warn!("cannot watch the kernel for changes ({p}); re-reading it every {UNWATCHED_REFRESH:?} instead");
        }
        sentinel
    } else {
        Sentinel::none()
    };
    let (tables_watched, sets_watched) = sentinel.watching();
    let fallback = |configured: Option<Duration>, watched: bool| match (configured, watched) {
        (Some(d), false) if watching => Some(d.min(UNWATCHED_REFRESH)),
        (None, false) if watching => Some(UNWATCHED_REFRESH),
        (d, _) => d,
    };
    let refresh = fallback(timers.refresh, tables_watched);
    let ipsets_refresh = fallback(timers.ipsets_refresh, sets_watched);
    let post_write_check = !sentinel.sees_every_commit();
    let far = Duration::from_secs(365 * 24 * 3600);
    let mut next_refresh = Instant::now() + refresh.unwrap_or(far);
    let mut next_ipsets_refresh = Instant::now() + ipsets_refresh.unwrap_or(far);
    // The cheap check of the tables, and of the IP sets (its own interval).
    let mut next_kernel_check: Option<Instant> = None;
    let mut next_sets_check: Option<Instant> = None;
    let mut next_kernel_verify: Option<Instant> = None;
    // Whether the next apply starts from a full read of the rules (the fingerprint is then
    // taken just before it); the first one does.
    let mut tables_read = true;
    // CPU used when a timed re-read of the (watched) tables began; its cost spaces the next.
    // The first apply counts as one: it reads the tables and writes every rule and member,
    // at least what a refresh costs, so the first refreshes are spaced like the later ones
    // instead of all landing at the base interval (at 31k rules and 61k members that one
    // pair cost a ten-minute window over 0.5 % of a core).
    let start_cpu = cpu_with_children();
    let mut tables_refresh_started = start_cpu.filter(|_| tables_watched);
    let mut next_check: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Backoff::apply_retry();
    let mut received_any = false;
    let mut applied_once = false;
    // Programming-latency starts of the updates absorbed since the last successful apply.
    let mut pending_starts: Vec<Instant> = Vec::new();
    let mut pending_applied: Vec<OnApplied> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        health.turn(Loop::Dataplane);
        let mut deadline = next_refresh
            .min(next_ipsets_refresh)
            .min(Instant::now() + QUIET_TURN.min(health.turn_bound()));
        for t in [
            next_check,
            retry_at,
            next_kernel_check,
            next_sets_check,
            next_kernel_verify,
        ]
        .into_iter()
        .flatten()
        {
            deadline = deadline.min(t);
        }
        match updates.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(b) => {
                received_any = true;
                dp.absorb(&b.update);
                pending_starts.extend(b.programming_starts);
                pending_applied.extend(b.on_applied);
                while let Ok(b) = updates.try_recv() {
                    dp.absorb(&b.update);
                    pending_starts.extend(b.programming_starts);
                    pending_applied.extend(b.on_applied);
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
        let mut verdict = Verdict::default();
        let tables_due = next_kernel_check.is_some_and(|t| now >= t);
        let sets_due = next_sets_check.is_some_and(|t| now >= t);
        if next_kernel_verify.is_some_and(|t| now >= t) {
            verdict = sentinel.verify();
            // Spaced by what this verify cost (see `sentinel::verify_interval`).
            next_kernel_verify = timers
                .kernel_verify
                .map(|d| now + sentinel.verify_interval(d));
            // The verify read the sets too.
            if sets_due {
                next_sets_check = timers
                    .kernel_check
                    .map(|d| now + sentinel.sets_check_interval(d));
            }
        } else if tables_due || sets_due {
            if tables_due {
                next_kernel_check = timers.kernel_check.map(|d| now + d);
            }
            verdict = sentinel.check(tables_due, sets_due);
            if sets_due {
                // Spaced by what this check cost (see `sentinel::sets_check_interval`).
                next_sets_check = timers
                    .kernel_check
                    .map(|d| now + sentinel.sets_check_interval(d));
            }
        }
        if let Some(why) = &verdict.iptables {
            info!("re-reading iptables: {why}");
        }
        if let Some(why) = &verdict.ipsets {
            info!("re-reading the IP sets: {why}");
        }
        if now >= next_ipsets_refresh || verdict.ipsets.is_some() {
            m.dataplane_resyncs.inc();
            let started = cpu_with_children();
            sentinel.before_sets_read();
            if let Err(e) = dp.resync_ipsets() {
                warn!("IP set refresh failed: {e:#}");
            }
            // A watched part's refresh is spaced by its cost (`sentinel::refresh_interval`).
            let cost = started
                .zip(cpu_with_children())
                .map(|(a, b)| b.saturating_sub(a));
            next_ipsets_refresh = now
                + match ipsets_refresh {
                    Some(d) if sets_watched => refresh_interval(d, cost),
                    d => d.unwrap_or(far),
                };
        }
        if now >= next_refresh || verdict.iptables.is_some() {
            next_refresh = now + refresh.unwrap_or(far);
            m.dataplane_resyncs.inc();
            tables_read = true;
            dp.invalidate_iptables();
            if tables_watched {
                tables_refresh_started = cpu_with_children();
            }
        }
        if next_check.is_some_and(|t| now >= t) {
            next_check = None;
            m.dataplane_resyncs.inc();
            tables_read = true;
            dp.invalidate_iptables();
        }
        if !dp.is_dirty() {
            // The kernel already holds everything absorbed.
            pending_applied.drain(..).for_each(|f| f());
            continue;
        }
        if retry_at.is_some_and(|t| now < t) {
            continue;
        }
        if tables_read {
            sentinel.before_tables_read();
        }
        sentinel.before_apply();
        match dp.apply() {
            Ok(report) => {
                retry_at = None;
                backoff.reset();
                if let (Some(started), Some(d)) = (tables_refresh_started.take(), refresh) {
                    let cost = cpu_with_children().map(|now| now.saturating_sub(started));
                    next_refresh = Instant::now() + refresh_interval(d, cost);
                }
                sentinel.after_apply(
                    report.iptables_lines > 0,
                    &report.sets_written,
                    dp.take_restore_pids(),
                );
                tables_read = false;
                // The change checks start once the kernel holds what we want.
                let now = Instant::now();
                if next_kernel_check.is_none() {
                    next_kernel_check = timers.kernel_check.map(|d| now + d);
                }
                if next_sets_check.is_none() {
                    next_sets_check = timers.kernel_check.map(|d| now + d);
                }
                if next_kernel_verify.is_none() {
                    next_kernel_verify = timers.kernel_verify.map(|d| now + d);
                }
                m.apply_seconds.observe(report.duration.as_secs_f64());
                for start in pending_starts.drain(..) {
                    m.programming_latency_seconds
                        .observe(start.elapsed().as_secs_f64());
                }
                pending_applied.drain(..).for_each(|f| f());
                m.dataplane_in_sync.set(1);
                if !applied_once {
                    applied_once = true;
                    let cost = start_cpu
                        .zip(cpu_with_children())
                        .map(|(a, b)| b.saturating_sub(a));
                    if let (Some(d), true) = (ipsets_refresh, sets_watched) {
                        next_ipsets_refresh = Instant::now() + refresh_interval(d, cost);
                    }
                    health.set_applied();
                    // The start's transient peak (listing, first flush, restore scripts) is
                    // over: give its freed pages back.
                    crate::host::memory::release_free_memory();
                    info!(
                        ms = report.duration.as_millis() as u64,
                        cpu_ms = cost.map_or(0, |c| c.as_millis() as u64),
                        lines = report.iptables_lines,
                        rss_kib = crate::host::memory::resident_kib(),
                        "first full apply done"
                    );
                }
                if report.iptables_lines > 0 && post_write_check {
                    next_check = Some(Instant::now() + timers.post_write_check);
                }
            }
            Err(e) => {
                sentinel.apply_failed();
                m.apply_failures.inc();
                m.dataplane_in_sync.set(0);
                let wait = backoff.next_delay();
                error!("apply failed, keeping the rules in place and retrying in {wait:?}: {e:#}");
                retry_at = Some(Instant::now() + wait);
                tables_read = true;
                dp.invalidate_iptables();
            }
        }
    }
    Ok(())
}
