//! The kernel side of IP sets (`crate::rules::sets` renders what they should hold): which of our sets (`cali40`/`cali60` main sets, `cali4t`/`cali6t`
//! temporary sets) exist and what they hold, and bringing them to the desired state. Sets of
//! anyone else (`KUBE-…`, other `cali-…` names) are read past and never modified.
//!
//! The writer works in felix's phases: `apply_additions` before iptables is written (create
//! sets, add members, then delete the members that left, replace sets whose type or size
//! changed), `apply_removals` after iptables no longer references what goes away (destroy
//! sets). Member deletions ride in the first phase's restore, as felix's `ApplyUpdates` does:
//! a pod that changes labels then costs one `ipset restore`, not two (a process start, about
//! 0.7 ms, on the path from event to enforcement). Until iptables is written the old rules
//! see the new memberships, which is the state the cluster is in now under the rules last
//! written. The old order showed the old rules the union of old and new members, which is no
//! safer: an allow sees more addresses than either state, and so does a deny. Between
//! `resync`s the cache of what the kernel holds is trusted, so a steady state writes nothing
//! and starts no process.
//!
//! We drive the kernel with streamed `ipset restore` (commands on stdin, `-exist`, one process
//! per family per phase) rather than the libipset-based `ipset` crate:
//! - no C library, bindgen or libclang is needed at build time, only the `ipset` binary at run
//!   time (which every node running kube-proxy or Calico already has);
//! - one batched `ipset restore` per family is what felix does: one process for any number of
//!   changes, while libipset's API is one call per command and would not batch better;
//! - the text is what `rules::sets::restore_script` and `netpol-agent compile` already render;
//! - `-exist` makes `create`, `add`, `del` and `destroy` idempotent, so a retry after a partial
//!   failure (restore stops at the first failing line) is safe.
//!
//! - `plan`: what the kernel holds of ours (`KernelSets`) and the ops that fix it (pure);
//! - `parse`: `ipset save` text;
//! - `restore`: running `ipset save` and `ipset -exist restore`, reading their failures;
//! - this file: `IpsetManager`, the phases, and the retries (`backoff::Policy::IPSET_RESTORE`)
//!   that re-read the kernel after a failed restore.

mod parse;
mod plan;
mod restore;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::anyhow;
use tracing::{debug, warn};

use crate::backoff::{Backoff, Policy};
use crate::host::exec::Exec;
use crate::model::IpFamily;
use crate::rules::sets::SetSpec;
use plan::{KernelSets, Op};
use restore::{locate, RestoreFailure, IN_USE};

/// Reads `ipset save` output as the writer does and prints back the sets it would keep as
/// they are (regular sets of ours with a family, type and size), in the writer's own `create`
/// and `add` form, sorted; `None` when reading fails. Printing what this printed gives the
/// same text: the parse → render round trip the fuzz target `ipset_save` holds.
pub fn reread_save(bytes: &[u8]) -> Option<String> {
    let sets = parse::parse_save(bytes).ok()?;
    let mut out = String::new();
    for (name, set) in &sets {
        let (Some(family), Some(set_type), Some(maxelem)) = (set.family, set.set_type, set.maxelem)
        else {
            continue;
        };
        if set.irregular {
            continue;
        }
        let family = match family {
            IpFamily::V4 => "inet",
            IpFamily::V6 => "inet6",
        };
        out.push_str(&format!(
            "create {name} {} family {family} hashsize 1024 maxelem {maxelem}\n",
            set_type.as_str()
        ));
        for m in &set.members {
            out.push_str(&format!("add {name} {m}\n"));
        }
    }
    Some(out)
}

/// Counters of the work done, for metrics and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IpsetStats {
    /// `ipset restore` processes started.
    pub restore_calls: u64,
    /// Command lines written to them.
    pub lines: u64,
    /// Restores that failed (a retry, a destroy of a set in use, or a returned error).
    pub errors: u64,
}

/// Keeps our kernel IP sets in line with the desired ones (see the module documentation).
pub struct IpsetManager {
    exec: Exec,
    /// Our sets as the kernel holds them, trusted between resyncs.
    cache: KernelSets,
    stats: IpsetStats,
    /// When the sets whose destroy was refused are tried again, and the back-off between
    /// tries; `None` while no destroy waits.
    destroy_retry: Option<(Instant, Backoff)>,
}

impl IpsetManager {
    /// `max_size` is the `maxelem` of every set we create (felix's `MaxIpsetSize`).
    pub fn new(exec: Exec, max_size: u32) -> Self {
        IpsetManager {
            exec,
            cache: KernelSets::new(max_size),
            stats: IpsetStats::default(),
            destroy_retry: None,
        }
    }

    pub fn stats(&self) -> &IpsetStats {
        &self.stats
    }

    /// Names of our sets the cache says exist (temporary ones included), in name order.
    pub fn cached_names(&self) -> Vec<String> {
        self.cache.sets.keys().cloned().collect()
    }

    /// Sets whose destroy is waiting for iptables to stop referencing them.
    pub fn pending_destroys(&self) -> Vec<String> {
        self.cache.retry_destroy.iter().cloned().collect()
    }

    /// Whether a set whose destroy was refused is due to be tried again at `now`
    /// (`Policy::IPSET_DESTROY_RETRY` between tries, counted from the last refusal).
    pub fn destroy_retry_due(&self, now: Instant) -> bool {
        !self.cache.retry_destroy.is_empty()
            && self
                .destroy_retry
                .as_ref()
                .is_none_or(|(due, _)| now >= *due)
    }

    /// Schedules the next destroy retry after a removal phase: the back-off grows while sets
    /// keep being refused and starts again once none waits.
    fn schedule_destroy_retry(&mut self, now: Instant) {
        if self.cache.retry_destroy.is_empty() {
            self.destroy_retry = None;
            return;
        }
        let mut backoff = match self.destroy_retry.take() {
            Some((_, backoff)) => backoff,
            None => Backoff::new(Policy::IPSET_DESTROY_RETRY),
        };
        let wait = backoff.next_delay();
        self.destroy_retry = Some((now + wait, backoff));
    }

    /// Reads every set that exists (`ipset save`), keeps ours (`is_owned_set`) in the cache.
    /// Called at start and on the refresh timer. On error the cache is left as it was.
    pub fn resync(&mut self) -> anyhow::Result<()> {
        let metrics = crate::telemetry::metrics::global();
        metrics.ipset_calls.inc();
        let result = restore::save(&self.exec).map(|sets| {
            debug!(sets = sets.len(), "ipset resync");
            self.cache.replace(sets);
        });
        if result.is_err() {
            metrics.ipset_errors.inc();
        }
        self.export_gauges();
        result
    }

    /// Our sets and their members per IP family, as the cache says, to the metrics.
    fn export_gauges(&self) {
        let metrics = crate::telemetry::metrics::global();
        for family in [IpFamily::V4, IpFamily::V6] {
            let sets = self
                .cache
                .sets
                .values()
                .filter(|k| k.family == Some(family));
            let (count, members) =
                sets.fold((0usize, 0usize), |(c, m), k| (c + 1, m + k.members.len()));
            let v = [crate::telemetry::metrics::ip_version(family)];
            metrics.ipsets.with_label_values(&v).set(count as i64);
            metrics
                .ipset_members
                .with_label_values(&v)
                .set(members as i64);
        }
    }

    /// Phase 1 (before iptables): for each name in `dirty` that is in `desired`, create the set
    /// if missing, add the members it lacks, and, after every addition of the phase, delete
    /// the members it holds but should not. A set of another type or family is destroyed
    /// and re-created (the kernel cannot swap those); one with another `maxelem`, or holding
    /// things we never write, is rebuilt in a temporary set that is swapped in and destroyed in
    /// phase 3. One `ipset restore` per family, none when the cache says nothing differs.
    ///
    /// Errors come after all the work that could be done: a desired set that is not valid
    /// (not our name, bad characters), a set that must be replaced but is referenced by
    /// iptables, or a restore that still fails after the retries.
    pub fn apply_additions(
        &mut self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let mut problems = BTreeSet::new();
        let outcome = self.run_with_retries("additions", |mgr, failed| {
            mgr.cache
                .plan_additions(desired, dirty, failed, &mut problems)
        });
        let in_use = match outcome {
            Ok(in_use) => in_use,
            Err(e) => return Err(with_problems(e, &problems)),
        };
        for name in in_use {
            // Still the wrong set: the destroy before its re-creation was refused.
            let stuck = match (desired.get(&name), self.cache.sets.get(&name)) {
                (Some(spec), Some(k)) => {
                    k.set_type != Some(spec.set_type) || k.family != Some(spec.family)
                }
                _ => false,
            };
            if stuck {
                warn!(set = %name, "set has the wrong type or family but is referenced by iptables; cannot replace it yet");
                problems.insert(format!(
                    "set {name} has the wrong type or family and is in use, so it cannot be replaced"
                ));
            }
        }
        match problems_error(&problems) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Phase 3 (after iptables no longer references them): destroy our sets in `dirty` that
    /// are not desired at all (and delete members still not desired from those that are,
    /// which phase 1 leaves none of unless the kernel changed in between);
    /// also destroy temporary sets and sets whose destroy was refused earlier. A destroy
    /// refused because iptables still references the set does not fail the rest: the set is
    /// retried on the next call (logged at warn).
    pub fn apply_removals(
        &mut self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        // A set desired again needs no destroy any more.
        self.cache
            .retry_destroy
            .retain(|n| !desired.contains_key(n));
        let outcome = self.run_with_retries("removals", |mgr, failed| {
            mgr.cache.plan_removals(desired, dirty, failed)
        });
        if let Ok(in_use) = &outcome {
            self.cache.note_in_use(in_use.clone());
        }
        self.schedule_destroy_retry(Instant::now());
        outcome.map(|_| ())
    }

    /// Destroys every set we own (for `netpol-agent cleanup`), reading the kernel first;
    /// nothing else. Sets still referenced by iptables are left and reported in the error.
    pub fn destroy_all_owned(&mut self) -> anyhow::Result<()> {
        self.resync()?;
        let in_use = self.run_with_retries("cleanup", |mgr, failed| {
            let names: Vec<String> = mgr.cache.sets.keys().cloned().collect();
            mgr.cache.plan_destroys(names, failed)
        })?;
        self.cache.note_in_use(in_use.clone());
        let left: Vec<String> = in_use
            .into_iter()
            .filter(|n| self.cache.sets.contains_key(n))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(
                "sets still in use by a kernel component (iptables rules?), not destroyed: {}",
                left.join(", ")
            ))
        }
    }

    /// Plans with `plan`, runs one restore per family, and on failure re-reads the kernel and
    /// tries again (planning from the fresh cache, sets that failed last), up to
    /// `Policy::IPSET_RESTORE`'s tries more times. Returns the sets whose destroy was refused because
    /// they are in use.
    fn run_with_retries<F>(&mut self, phase: &str, mut plan: F) -> anyhow::Result<BTreeSet<String>>
    where
        F: FnMut(&mut Self, &BTreeSet<String>) -> Vec<Op>,
    {
        let mut failed: BTreeSet<String> = BTreeSet::new();
        let mut in_use = BTreeSet::new();
        let mut backoff = Backoff::new(Policy::IPSET_RESTORE);
        let mut attempt = 0usize;
        loop {
            let ops = plan(self, &failed);
            let mut failure = None;
            for family in [IpFamily::V4, IpFamily::V6] {
                let fam_ops: Vec<&Op> = ops.iter().filter(|op| op.family == family).collect();
                if fam_ops.is_empty() {
                    continue;
                }
                match self.run_ops(&fam_ops) {
                    Ok(refused) => in_use.extend(refused),
                    Err(f) => {
                        if let Some(set) = &f.set {
                            failed.insert(set.clone());
                        }
                        failure = Some(f);
                    }
                }
            }
            let Some(failure) = failure else {
                self.export_gauges();
                return Ok(in_use);
            };
            let delay = backoff.next_wait();
            attempt += 1;
            match delay {
                Some(wait) => {
                    warn!(
                        phase,
                        attempt, "{failure}; re-reading the kernel and retrying"
                    );
                    std::thread::sleep(wait);
                }
                None => warn!(phase, attempt, "{failure}; giving up"),
            }
            // Whatever happened, the cache must say what the kernel holds (a restore stops
            // half-way), for the next plan or the next call.
            if let Err(e) = self.resync() {
                warn!(phase, "resync after a failed restore: {e:#}");
            }
            if delay.is_none() {
                return Err(anyhow!("{phase}: {failure}"));
            }
        }
    }

    /// Streams `ops` (all of one family) into `ipset restore`, and updates the cache with
    /// what was applied. A `destroy` refused because the set is in use skips that op and the
    /// rest goes into a new restore; any other failure stops.
    fn run_ops(&mut self, ops: &[&Op]) -> Result<BTreeSet<String>, RestoreFailure> {
        let mut in_use = BTreeSet::new();
        let mut start = 0usize;
        while start < ops.len() {
            let rest = ops.get(start..).unwrap_or_default();
            let mut script = String::new();
            // Cumulative line count at the end of each op, to find the op of a failing line.
            let mut ends = Vec::with_capacity(rest.len());
            let mut lines = 0u64;
            for op in rest {
                lines += op.render(&mut script, self.cache.max_size);
                ends.push(lines);
            }
            if lines == 0 {
                break;
            }
            self.stats.restore_calls += 1;
            self.stats.lines += lines;
            let metrics = crate::telemetry::metrics::global();
            metrics.ipset_calls.inc();
            metrics.ipset_lines_executed.inc_by(lines);
            debug!(lines, ops = rest.len(), "ipset restore");
            let Err(fail) = restore::restore(&self.exec, &script) else {
                for op in rest {
                    self.cache.apply(op);
                }
                break;
            };
            self.stats.errors += 1;
            metrics.ipset_errors.inc();
            let located = fail.line.and_then(|n| locate(&ends, n));
            let Some((idx, line_in_op)) = located else {
                return Err(RestoreFailure {
                    set: None,
                    message: fail.message,
                });
            };
            // Everything before the failing op went through.
            for op in rest.iter().take(idx) {
                self.cache.apply(op);
            }
            let Some(op) = rest.get(idx) else {
                return Err(RestoreFailure {
                    set: None,
                    message: fail.message,
                });
            };
            if fail.message.contains(IN_USE) && op.is_destroy_line(line_in_op) {
                in_use.insert(op.name.clone());
                start += idx + 1;
                continue;
            }
            return Err(RestoreFailure {
                set: Some(op.name.clone()),
                message: fail.message,
            });
        }
        Ok(in_use)
    }
}

/// The error to return for `problems`, if any.
fn problems_error(problems: &BTreeSet<String>) -> Option<anyhow::Error> {
    if problems.is_empty() {
        return None;
    }
    let list: Vec<&str> = problems.iter().map(String::as_str).collect();
    Some(anyhow!("{}", list.join("; ")))
}

fn with_problems(e: anyhow::Error, problems: &BTreeSet<String>) -> anyhow::Error {
    match problems_error(problems) {
        Some(p) => e.context(format!("also: {p}")),
        None => e,
    }
}

#[cfg(test)]
mod tests;
