//! Liveness and readiness, as felix reports them on `/liveness` and `/readiness`.
//!
//! - live: both agent loops (the calculation loop and the dataplane loop) have turned within
//!   the watchdog timeout (felix's `DataplaneWatchdogTimeout`). Both loops wake at least every
//!   [`Health::turn_bound`] when idle, so only a loop stuck in one step (a hung
//!   `iptables-restore`, a deadlock) goes stale. Each try of an iptables update counts as a
//!   turn too: tries that fail (a lock someone else holds) are progress, one that never
//!   returns is not.
//! - ready: the datastore delivered its first complete listing AND the first full apply
//!   after it has completed; before that the node's pods are not yet protected as the
//!   policies say.
//!
//! The loops write atomics only; the HTTP server reads them. Each probe answer that differs
//! from the one before it is logged ([`Health::answer`]), so a pod kubelet saw flip to not
//! ready or not live has the reason in its log, at the time kubelet saw it (felix logs its
//! overall health changes the same way).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest idle turn [`Health::turn_bound`] asks for (what every idle turn was before
/// the loops learnt to sleep until something is due).
const MIN_TURN: Duration = Duration::from_millis(200);

/// Which agent loop reports a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loop {
    /// Datastore events into the calculation graph.
    Calc,
    /// Applying updates to the kernel.
    Dataplane,
}

pub struct Health {
    start: Instant,
    watchdog: Duration,
    /// Milliseconds since `start` of each loop's last turn.
    calc_turn_ms: AtomicU64,
    dataplane_turn_ms: AtomicU64,
    in_sync: AtomicBool,
    applied: AtomicBool,
    /// Why the agent refuses to run (the preflight checks), while it does.
    refused: Mutex<Option<String>>,
    /// Why the configuration fits no local pod (`agent::unnamed`), while it does not.
    misfit: Mutex<Option<String>>,
    /// Why local pods have traffic in a family no rule of ours sees (IPv6 support off on a
    /// dual-stack node), while they do.
    unprogrammed_family: Mutex<Option<String>>,
    /// Why the datastore may not read some kinds (401, 403), while it may not.
    datastore_refused: Mutex<Option<String>>,
    /// Something an operator should know that does not make the agent unready (auto's wiring
    /// not seen yet on a node without pods), added to the readiness answer.
    note: Mutex<Option<String>>,
    /// The last answer each probe path gave, to log only the changes.
    answered: [Mutex<Option<(bool, String)>>; 2],
}

/// The two probe paths, as kubelet asks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Liveness,
    Readiness,
}

/// How an answer differs from the previous one, to decide whether and how loudly to log it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// The same answer as before (the note may differ while passing): nothing to log.
    None,
    /// Passing now, or failing from the start or for another reason than before.
    Routine,
    /// It passed before and fails now: kubelet takes the pod out of service (or restarts it).
    Lost,
}

fn change(before: Option<&(bool, String)>, now: &(bool, String)) -> Change {
    match before {
        Some((true, _)) if !now.0 => Change::Lost,
        Some((ok, why)) if *ok == now.0 && (now.0 || *why == now.1) => Change::None,
        _ => Change::Routine,
    }
}

impl Health {
    /// `watchdog`: how long a loop may go without turning before the agent is not live.
    pub fn new(watchdog: Duration) -> Health {
        Health {
            start: Instant::now(),
            watchdog,
            calc_turn_ms: AtomicU64::new(0),
            dataplane_turn_ms: AtomicU64::new(0),
            in_sync: AtomicBool::new(false),
            applied: AtomicBool::new(false),
            refused: Mutex::new(None),
            misfit: Mutex::new(None),
            note: Mutex::new(None),
            unprogrammed_family: Mutex::new(None),
            datastore_refused: Mutex::new(None),
            answered: [Mutex::new(None), Mutex::new(None)],
        }
    }

    /// The answer to a probe of `which`, logged when it differs from the last one given:
    /// warning when it passed before and fails now, info otherwise.
    pub fn answer(&self, which: Probe) -> (bool, String) {
        let (now, slot, name) = match which {
            Probe::Liveness => (self.liveness(), &self.answered[0], "liveness"),
            Probe::Readiness => (self.readiness(), &self.answered[1], "readiness"),
        };
        let mut last = slot.lock().unwrap_or_else(|p| p.into_inner());
        match change(last.as_ref(), &now) {
            Change::None => {}
            Change::Routine => tracing::info!(probe = name, "{}", now.1),
            Change::Lost => tracing::warn!(probe = name, "{} (passed before)", now.1),
        }
        *last = Some(now.clone());
        now
    }

    /// The longest an idle loop may sleep and still be live: a quarter of the watchdog
    /// timeout, so a configured short watchdog (seconds) is never missed by a sleeping loop,
    /// but never under [`MIN_TURN`]: a watchdog of a few milliseconds (the option takes
    /// 0.001 s) must not make the loops spin.
    pub fn turn_bound(&self) -> Duration {
        (self.watchdog / 4).max(MIN_TURN)
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A loop has turned (call at the top of each iteration).
    pub fn turn(&self, which: Loop) {
        let slot = match which {
            Loop::Calc => &self.calc_turn_ms,
            Loop::Dataplane => &self.dataplane_turn_ms,
        };
        slot.store(self.now_ms(), Ordering::Relaxed);
    }

    pub fn set_in_sync(&self) {
        self.in_sync.store(true, Ordering::Relaxed);
    }

    pub fn set_applied(&self) {
        self.applied.store(true, Ordering::Relaxed);
    }

    /// The agent refuses to run: not ready, with this reason, and live (restarting would
    /// find the same node) until [`Health::clear_refused`].
    pub fn set_refused(&self, why: String) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// The refusal is over and the loops start now: their watchdog starts afresh.
    pub fn clear_refused(&self) {
        self.turn(Loop::Calc);
        self.turn(Loop::Dataplane);
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Not ready while `why` is set: the interface naming finds no local pod's interface.
    pub fn set_misfit(&self, why: Option<String>) {
        *self.misfit.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Not ready while `why` is set: local pods have addresses of a family not programmed.
    pub fn set_unprogrammed_family(&self, why: Option<String>) {
        *self
            .unprogrammed_family
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Not ready while `why` is set: the API server refuses to let the datastore read some
    /// kinds (the rules stay as they are).
    pub fn set_datastore_refused(&self, why: Option<String>) {
        *self
            .datastore_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Adds `note` to the readiness answer (ready or not) while set.
    pub fn set_note(&self, note: Option<String>) {
        *self.note.lock().unwrap_or_else(|p| p.into_inner()) = note;
    }

    fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `(live, why)`.
    pub fn liveness(&self) -> (bool, String) {
        if self.refused().is_some() {
            return (
                true,
                "live: refusing to run, the agent loops are not started (see /readiness)".into(),
            );
        }
        let now = self.now_ms();
        let limit = self.watchdog.as_millis() as u64;
        let mut stale = Vec::new();
        for (name, slot) in [
            ("calculation", &self.calc_turn_ms),
            ("dataplane", &self.dataplane_turn_ms),
        ] {
            let age = now.saturating_sub(slot.load(Ordering::Relaxed));
            if age > limit {
                stale.push(format!(
                    "the {name} loop has not turned for {:.1} s (limit {:.1} s)",
                    age as f64 / 1e3,
                    limit as f64 / 1e3
                ));
            }
        }
        if stale.is_empty() {
            (true, "live: both agent loops are turning".into())
        } else {
            (false, format!("not live: {}", stale.join("; ")))
        }
    }

    /// `(ready, why)`, with the note if one is set.
    pub fn readiness(&self) -> (bool, String) {
        let (ready, why) = self.readiness_alone();
        match &*self.note.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(note) => (ready, format!("{why}; {note}")),
            None => (ready, why),
        }
    }

    fn readiness_alone(&self) -> (bool, String) {
        if let Some(why) = self.refused() {
            return (false, format!("not ready: {why}"));
        }
        for slot in [
            &self.datastore_refused,
            &self.misfit,
            &self.unprogrammed_family,
        ] {
            if let Some(why) = slot.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return (false, format!("not ready: {why}"));
            }
        }
        let in_sync = self.in_sync.load(Ordering::Relaxed);
        let applied = self.applied.load(Ordering::Relaxed);
        match (in_sync, applied) {
            (true, true) => (
                true,
                "ready: datastore in sync and the first full apply done".into(),
            ),
            (false, _) => (
                false,
                "not ready: waiting for the datastore's first complete listing".into(),
            ),
            (true, false) => (
                false,
                "not ready: datastore in sync, first full apply not done yet".into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_rides_along_ready_or_not() {
        let h = Health::new(Duration::from_secs(90));
        h.set_note(Some("wiring not seen".into()));
        let (ready, why) = h.readiness();
        assert!(!ready && why.ends_with("; wiring not seen"), "{why}");
        h.set_in_sync();
        h.set_applied();
        let (ready, why) = h.readiness();
        assert!(
            ready && why.starts_with("ready:") && why.ends_with("wiring not seen"),
            "{why}"
        );
        h.set_note(None);
        assert!(!h.readiness().1.contains("wiring"));
    }

    #[test]
    fn probe_answers_are_logged_when_they_change() {
        let ok = |why: &str| (true, why.to_string());
        let bad = |why: &str| (false, why.to_string());
        assert_eq!(change(None, &bad("not ready: waiting")), Change::Routine);
        assert_eq!(change(None, &ok("ready")), Change::Routine);
        let waiting = bad("not ready: waiting");
        assert_eq!(change(Some(&waiting), &waiting), Change::None);
        assert_eq!(
            change(Some(&waiting), &bad("not ready: applying")),
            Change::Routine
        );
        assert_eq!(change(Some(&waiting), &ok("ready")), Change::Routine);
        // A note changing under a passing answer is no news; losing the pass is.
        assert_eq!(change(Some(&ok("ready")), &ok("ready; note")), Change::None);
        assert_eq!(
            change(Some(&ok("ready")), &bad("not ready: refused")),
            Change::Lost
        );
        let h = Health::new(Duration::from_secs(90));
        assert!(!h.answer(Probe::Readiness).0);
        h.set_in_sync();
        h.set_applied();
        assert!(h.answer(Probe::Readiness).0);
        assert!(h.answer(Probe::Liveness).0);
    }

    #[test]
    fn ready_only_after_sync_and_apply() {
        let h = Health::new(Duration::from_secs(90));
        assert!(!h.readiness().0);
        h.set_in_sync();
        let (ready, why) = h.readiness();
        assert!(!ready && why.contains("first full apply"), "{why}");
        h.set_applied();
        assert!(h.readiness().0);
    }

    #[test]
    fn a_refusal_is_live_and_not_ready_with_the_reason() {
        let h = Health::new(Duration::from_millis(10));
        h.set_refused("refused to run: ipv0 (ipvlan)".into());
        std::thread::sleep(Duration::from_millis(30));
        let (ready, why) = h.readiness();
        assert!(!ready && why.contains("ipv0 (ipvlan)"), "{why}");
        assert!(h.liveness().0);
        h.clear_refused();
        assert!(h.liveness().0, "the watchdog restarts when the loops start");
        assert!(h.readiness().1.contains("datastore"));
    }

    #[test]
    fn idle_loops_turn_well_within_the_watchdog_but_never_spin() {
        let bound = |watchdog| Health::new(watchdog).turn_bound();
        assert_eq!(
            bound(Duration::from_secs(90)),
            Duration::from_millis(22_500)
        );
        assert_eq!(bound(Duration::from_secs(5)), Duration::from_millis(1250));
        // The option takes 0.001 s: the loops then turn as often as they always did.
        assert_eq!(bound(Duration::from_millis(1)), MIN_TURN);
    }

    #[test]
    fn a_stuck_loop_is_not_live() {
        let h = Health::new(Duration::from_millis(50));
        h.turn(Loop::Calc);
        h.turn(Loop::Dataplane);
        assert!(h.liveness().0);
        std::thread::sleep(Duration::from_millis(120));
        h.turn(Loop::Calc);
        let (live, why) = h.liveness();
        assert!(!live && why.contains("dataplane"), "{why}");
    }
}
