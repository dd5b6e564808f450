//! The fault scenarios of `netpol-e2e chaos --faults`: something the agent depends on fails
//! for a while under a running agent that has a change to apply.
//!
//! Each one starts from a converged cluster, turns the fault on, writes a change that needs
//! both an `ipset restore` and an `iptables-restore` on node 0 (a new policy in the namespace
//! of a node-0 pod, admitting that namespace's pods through a selector no other policy uses),
//! and for the length of the fault checks, every 100 ms, that the rules in place stay: node
//! 0's chains and its rules in the kernel chains exactly as before, every set that existed
//! with the members it had (new sets may appear: the additions phase runs before iptables),
//! the agent alive; all the while the prober sweeps the pairs denied before and after the
//! change. Then the fault ends, and the agent must converge to what `compile` renders (the
//! recovery time is reported), with nothing leaked and every pair as the objects say.
//!
//! - a restore tool (`iptables-restore`, `ipset restore`) that exits 1: the agent keeps
//!   retrying with back-off and stays live;
//! - a restore tool that hangs, then goes on: the agent's dataplane loop is stuck in it, so
//!   `/liveness` turns 503 after the watchdog (5 s here), which is how kubelet would restart
//!   it; once the tool goes on the agent finishes and is live again;
//! - the xtables lock held by someone else for 30 s (`flock` on the node's own lock file,
//!   which its agent's tools use through `XTABLES_LOCKFILE`): with legacy iptables the restore
//!   waits (`--wait 10`, retried) and goes through once the lock is free (the loop waits
//!   inside the restore, past this run's 5 s watchdog: `/liveness` 503 inside a try as for a
//!   hang, 200 again as the next try begins, since each try counts as a turn); iptables-nft
//!   takes no xtables lock, so there the change must go through while the lock is held;
//! - the manifest directory removed for a while, then created again holding the changed
//!   objects: nothing changes while it is gone, and the agent follows the new directory.

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use netpol_agent::dataplane::owned::OwnedState;

use super::shim::Kind;
use super::{ChaosArgs, Harness, ProbeWatch, VICTIM};
use crate::cluster::Backend;

pub(crate) struct FaultResult {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Fail(Kind),
    Hang(Kind),
    Lock,
    DirRemoved,
}

impl Fault {
    fn name(self) -> String {
        match self {
            Fault::Fail(k) => format!("{} restore fails", k.name()),
            Fault::Hang(k) => format!("{} restore hangs", k.name()),
            Fault::Lock => "xtables lock held by someone else".into(),
            Fault::DirRemoved => "manifest directory removed".into(),
        }
    }
}

/// How long one legacy restore of the agent waits for the xtables lock (`--wait 10`).
const LOCK_TRY: Duration = Duration::from_secs(10);

pub(crate) fn run_all(
    h: &mut Harness,
    args: &ChaosArgs,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<FaultResult>> {
    let hold = Duration::from_secs(args.fault_secs);
    let faults = [
        (Fault::Fail(Kind::Iptables), hold),
        (Fault::Fail(Kind::Ipset), hold),
        (Fault::Hang(Kind::Iptables), hold),
        (Fault::Hang(Kind::Ipset), hold),
        (Fault::Lock, Duration::from_secs(args.lock_secs)),
        (Fault::DirRemoved, hold),
    ];
    let mut out = Vec::new();
    for (i, (fault, hold)) in faults.into_iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let r = one(h, fault, hold, i)?;
        println!(
            "fault {}: {} — {}",
            r.name,
            if r.passed { "ok" } else { "FAILED" },
            r.detail
        );
        out.push(r);
    }
    Ok(out)
}

/// The kernel as it was keeps holding: chains and kernel-chain rules equal, every set that
/// was there with the same members. What differs, if anything.
fn frozen(before: &[OwnedState], now: &[OwnedState]) -> Option<String> {
    for (b, n) in before.iter().zip(now) {
        if b.chains != n.chains || b.kernel != n.kernel {
            return Some(format!("iptables changed: {}", crate::cluster::diff(b, n)));
        }
        for (name, members) in &b.sets {
            if n.sets.get(name) != Some(members) {
                return Some(format!("set {name} changed"));
            }
        }
    }
    None
}

/// Someone else holding the xtables lock: `flock` and its command, in a process group of
/// their own, killed together when dropped (also when the scenario fails half-way).
struct LockHolder(std::process::Child);

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.0.wait();
    }
}

fn one(h: &mut Harness, fault: Fault, hold: Duration, index: usize) -> anyhow::Result<FaultResult> {
    h.flush_conntrack();
    let old = h.builder.world.clone();
    let ns = old
        .pods
        .values()
        .find(|p| p.node == VICTIM)
        .map(|p| p.namespace.clone())
        .unwrap_or_else(|| "a".into());
    h.builder.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{name: fault-{index}, namespace: {ns}}}\n\
         spec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n\
         \x20 - from: [{{podSelector: {{matchExpressions: [{{key: fault-{index}, operator: DoesNotExist}}]}}}}]\n"
    ))?;
    let new = h.builder.world.clone();
    let before = h.cluster.have(VICTIM)?;
    let watch = ProbeWatch::start(h, &h.must_block(&old, &new)?);
    watch.set_phase("the fault lasted");
    let mut problems: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    // Whether the change may (must) go through while the fault lasts.
    let applies_anyway = fault == Fault::Lock && h.backend == Backend::Nft;

    let mut holder = None;
    match fault {
        Fault::Fail(k) => h.shims.fail(k, true)?,
        Fault::Hang(k) => h.shims.hang(k, true)?,
        Fault::Lock => {
            let lock = h.cluster.work_dir().join("xtables-node-0.lock");
            // Held until the fault ends (the holder and its sleep are killed as a group), not
            // on a clock of its own that could run out before the harness's window does.
            let child = std::process::Command::new("flock")
                .arg(&lock)
                .args(["sleep", &(hold.as_secs() + 600).to_string()])
                .process_group(0)
                .spawn()?;
            // Taken once a non-blocking attempt fails.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let free = std::process::Command::new("flock")
                    .args(["-n"])
                    .arg(&lock)
                    .arg("true")
                    .status()?
                    .success();
                if !free {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "flock never took {}",
                    lock.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            holder = Some(LockHolder(child));
        }
        Fault::DirRemoved => std::fs::remove_dir_all(h.cluster.manifests_dir())?,
    }
    let began = Instant::now();
    if fault != Fault::DirRemoved {
        h.cluster.sync(&new)?;
    }
    let want = h.cluster.want(VICTIM).ok();
    let mut applied_during = None;
    // On legacy, liveness is sampled all through the hold: each try waits 10 s for the lock
    // (longer than this run's 5 s watchdog, so the loop goes stale inside a try), and each new
    // try counts as a turn (so it is live again once the first try has given up).
    let legacy_lock = fault == Fault::Lock && h.backend == Backend::Legacy;
    let (mut stale_in_a_try, mut live_after_a_try) = (false, false);
    while began.elapsed() < hold {
        std::thread::sleep(Duration::from_millis(100));
        if legacy_lock {
            match h.health("/liveness") {
                Some(503) => stale_in_a_try = true,
                Some(200) if began.elapsed() > LOCK_TRY + Duration::from_secs(1) => {
                    live_after_a_try = true;
                }
                _ => {}
            }
        }
        if h.cluster.agent_pid(VICTIM).is_none() {
            problems.push("the agent exited during the fault".into());
            break;
        }
        let now = h.cluster.have(VICTIM)?;
        if applies_anyway {
            if applied_during.is_none() && want.as_ref() == Some(&now) {
                applied_during = Some(began.elapsed());
            }
        } else if let Some(why) = frozen(&before, &now) {
            problems.push(format!(
                "after {} ms of the fault: {why}",
                began.elapsed().as_millis()
            ));
            break;
        }
    }
    if applies_anyway {
        match applied_during {
            Some(d) => notes.push(format!(
                "iptables-nft takes no xtables lock: applied {} ms into the hold",
                d.as_millis()
            )),
            None => problems.push("not applied while the lock was held (nft takes no lock)".into()),
        }
    }
    let live = h.health("/liveness");
    match fault {
        Fault::Hang(_) => {
            notes.push(format!("/liveness during the hang: {live:?}"));
            if live != Some(503) {
                problems.push(format!(
                    "/liveness answered {live:?} while the dataplane loop hung, not 503"
                ));
            }
        }
        // Legacy restores wait for the lock inside the dataplane loop (`--wait 10` a try),
        // longer than this run's 5 s watchdog, so the loop stands still inside a try as in a
        // hang; each new try is a turn, so with the default watchdog (90 s) the agent stays
        // live however long someone holds the lock.
        Fault::Lock if legacy_lock => {
            notes.push(format!(
                "/liveness through the hold: 503 inside a try {stale_in_a_try}, 200 again after a try gave up {live_after_a_try} (the loop waits 10 s a try for the lock, the watchdog here is 5 s)"
            ));
            // A hold shorter than one try shows only the first half.
            if !stale_in_a_try && hold > Duration::from_secs(7) {
                problems.push(
                    "/liveness never answered 503 while the loop waited for the lock past the watchdog".into(),
                );
            }
            if !live_after_a_try && hold > LOCK_TRY + Duration::from_secs(3) {
                problems.push(
                    "/liveness never answered 200 again after a try for the lock gave up (each try should count as a turn)".into(),
                );
            }
        }
        _ => {
            notes.push(format!("/liveness during the fault: {live:?}"));
            if live != Some(200) {
                problems.push(format!(
                    "/liveness answered {live:?} during the fault, not 200"
                ));
            }
        }
    }

    // The fault ends.
    match fault {
        Fault::Fail(k) => h.shims.fail(k, false)?,
        Fault::Hang(k) => h.shims.hang(k, false)?,
        Fault::Lock => {
            drop(holder.take());
        }
        Fault::DirRemoved => h.cluster.rewrite_all(&new)?,
    }
    let ended = Instant::now();
    let want = h.cluster.want(VICTIM)?;
    let recovery = h.converge(&want, ended);
    let log = watch.finish();
    match &recovery {
        Ok(d) => notes.push(format!(
            "recovered {} ms after the fault ended",
            d.as_millis()
        )),
        Err(e) => problems.push(format!("no recovery: {e}")),
    }
    if let Err(e) = h.cluster.wait_converged() {
        problems.push(format!("the cluster did not converge: {e}"));
    }
    let leaks = h.leaks(&want)?;
    for l in &leaks {
        problems.push(format!("LEAK: {l}"));
    }
    if let Some(text) = h.check_all_pairs(&new)? {
        problems.push(format!("probes disagree with the objects:\n{text}"));
    }
    let live = h.health("/liveness");
    if live != Some(200) {
        problems.push(format!(
            "/liveness answered {live:?} after the fault, not 200"
        ));
    }
    for v in &log.violations {
        problems.push(format!("VIOLATION: {v}"));
    }
    notes.push(format!(
        "{} sweeps, {} probes, {} violations",
        log.sweeps,
        log.probes,
        log.violations.len()
    ));
    let passed = problems.is_empty();
    let mut detail = format!("{} s: {}", hold.as_secs(), notes.join("; "));
    for p in &problems {
        detail.push_str("\n    ");
        detail.push_str(p);
    }
    if !passed {
        detail.push_str(&format!(
            "\n    node-0 agent log:\n{}",
            super::indent(&h.cluster.agent_log_tail(VICTIM, 40))
        ));
    }
    Ok(FaultResult {
        name: fault.name(),
        passed,
        detail,
    })
}
