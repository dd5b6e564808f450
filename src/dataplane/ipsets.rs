//! The kernel side of IP sets: which of our sets (`cali40`/`cali60` main sets, `cali4t`/`cali6t`
//! temporary sets) exist and what they hold, and bringing them to the desired state. Sets of
//! anyone else (`KUBE-…`, other `cali-…` names) are read past and never modified.
//!
//! The writer works in felix's phases: `apply_additions` before iptables is written (create
//! sets, add members, replace sets whose type or size changed), `apply_removals` after
//! iptables no longer references what goes away (delete members, destroy sets). Between
//! `resync`s the cache of what the kernel holds is trusted, so a steady state writes nothing
//! and starts no process.
//!
//! We drive the kernel with streamed `ipset restore` (commands on stdin, `-exist`, one process
//! per family per phase) rather than the libipset-based `ipset` crate:
//! - no C library, bindgen or libclang is needed at build time, only the `ipset` binary at run
//!   time (which every node running kube-proxy or Calico already has);
//! - one batched `ipset restore` per family is what felix does: one process for any number of
//!   changes, while libipset's API is one call per command and would not batch better;
//! - the text is what `ipsets::restore_script` and `netpol-agent compile` already render;
//! - `-exist` makes `create`, `add`, `del` and `destroy` idempotent, so a retry after a partial
//!   failure (restore stops at the first failing line) is safe.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, Context};
use tracing::{debug, warn};

pub use crate::host::exec::Exec;
use crate::ipsets::{is_owned_set, is_temp_set, Member, SetSpec, SetType, MAX_SET_NAME_LEN};
use crate::model::{IpFamily, Protocol};

/// Waits before the retries of a failed restore (after the first try, 10 ms, then 40, then 160).
const RETRY_DELAYS_MS: [u64; 3] = [10, 40, 160];

/// What `ipset` says when a set it should destroy is referenced by an iptables rule (or by a
/// `list:set`). Such a destroy is retried later instead of failing the phase.
const IN_USE: &str = "in use by a kernel component";

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

/// One of our sets as the kernel holds it (parsed from `ipset save`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct KernelSet {
    /// `None`: no family printed (not a hash set).
    family: Option<IpFamily>,
    /// `None`: a type we never create (treated as the wrong type).
    set_type: Option<SetType>,
    maxelem: Option<u32>,
    /// Something we never write is in the set: a create option (timeout, counters, comment,
    /// ...) or an entry that is not a `Member` (a CIDR, `nomatch`, another protocol). Only a
    /// rebuild makes such a set exactly ours, so it is replaced through a temporary set.
    irregular: bool,
    members: BTreeSet<Member>,
}

impl KernelSet {
    fn fresh(family: IpFamily, set_type: SetType, maxelem: u32, members: BTreeSet<Member>) -> Self {
        KernelSet {
            family: Some(family),
            set_type: Some(set_type),
            maxelem: Some(maxelem),
            irregular: false,
            members,
        }
    }
}

/// One set's share of a restore script, with what it does to the cache once applied.
#[derive(Debug)]
struct Op {
    name: String,
    family: IpFamily,
    kind: OpKind,
}

#[derive(Debug)]
enum OpKind {
    /// `create` + `add`s; after a `destroy` when `replace` (wrong type or family: the kernel
    /// refuses to swap sets whose type or family differ).
    Create {
        replace: bool,
        set_type: SetType,
        members: BTreeSet<Member>,
    },
    /// Builds the set in `temp` and swaps the two: iptables references follow the name, so
    /// rules see the new contents at once, and `temp` is left with the old ones.
    Swap {
        temp: String,
        set_type: SetType,
        members: BTreeSet<Member>,
    },
    Add(Vec<Member>),
    Del(Vec<Member>),
    Destroy,
}

impl Op {
    /// Appends this op's lines to `out`; returns how many.
    fn render(&self, out: &mut String, max_size: u32) -> u64 {
        use fmt::Write as _;
        let name = &self.name;
        let mut n = 0u64;
        // Writing to a String cannot fail.
        let mut line = |out: &mut String, args: fmt::Arguments<'_>| {
            let _ = out.write_fmt(args);
            out.push('\n');
            n += 1;
        };
        match &self.kind {
            OpKind::Create {
                replace,
                set_type,
                members,
            } => {
                if *replace {
                    line(out, format_args!("destroy {name}"));
                }
                line(
                    out,
                    format_args!("{}", create_line(name, self.family, *set_type, max_size)),
                );
                for m in members {
                    line(out, format_args!("add {name} {m}"));
                }
            }
            OpKind::Swap {
                temp,
                set_type,
                members,
            } => {
                line(
                    out,
                    format_args!("{}", create_line(temp, self.family, *set_type, max_size)),
                );
                for m in members {
                    line(out, format_args!("add {temp} {m}"));
                }
                line(out, format_args!("swap {temp} {name}"));
            }
            OpKind::Add(members) => {
                for m in members {
                    line(out, format_args!("add {name} {m}"));
                }
            }
            OpKind::Del(members) => {
                for m in members {
                    line(out, format_args!("del {name} {m}"));
                }
            }
            OpKind::Destroy => line(out, format_args!("destroy {name}")),
        }
        n
    }

    /// Whether line `index` (0-based, within this op) is a `destroy`.
    fn is_destroy_line(&self, index: u64) -> bool {
        index == 0
            && matches!(
                self.kind,
                OpKind::Destroy | OpKind::Create { replace: true, .. }
            )
    }
}

fn create_line(name: &str, family: IpFamily, set_type: SetType, max_size: u32) -> String {
    format!(
        "create {name} {} family {} maxelem {max_size}",
        set_type.as_str(),
        family_word(family)
    )
}

fn family_word(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    }
}

/// The family a set belongs to when the kernel does not say: from its name (`cali6…`).
fn family_of_name(name: &str) -> IpFamily {
    if name.starts_with("cali6") {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

/// A failed `ipset restore`: the set whose line failed (when ipset names a line) and why.
#[derive(Debug)]
struct RestoreFailure {
    set: Option<String>,
    message: String,
}

impl fmt::Display for RestoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.set {
            Some(set) => write!(f, "ipset restore failed on set {set}: {}", self.message),
            None => write!(f, "ipset restore failed: {}", self.message),
        }
    }
}

/// What one `ipset restore` process reported.
struct ProcessFailure {
    /// 1-based line of the script ipset stopped at, when it says.
    line: Option<u64>,
    message: String,
}

/// Keeps our kernel IP sets in line with the desired ones (see the module documentation).
pub struct IpsetManager {
    exec: Exec,
    max_size: u32,
    /// Our sets as the kernel holds them, trusted between resyncs.
    cache: BTreeMap<String, KernelSet>,
    /// Sets whose destroy failed because they were still referenced: destroyed on the next
    /// `apply_removals` unless desired again by then.
    retry_destroy: BTreeSet<String>,
    next_temp: u64,
    stats: IpsetStats,
}

impl IpsetManager {
    /// `max_size` is the `maxelem` of every set we create (felix's `MaxIpsetSize`).
    pub fn new(exec: Exec, max_size: u32) -> Self {
        IpsetManager {
            exec,
            max_size,
            cache: BTreeMap::new(),
            retry_destroy: BTreeSet::new(),
            next_temp: 0,
            stats: IpsetStats::default(),
        }
    }

    pub fn stats(&self) -> &IpsetStats {
        &self.stats
    }

    /// Names of our sets the cache says exist (temporary ones included), in name order.
    pub fn cached_names(&self) -> Vec<String> {
        self.cache.keys().cloned().collect()
    }

    /// Sets whose destroy is waiting for iptables to stop referencing them.
    pub fn pending_destroys(&self) -> Vec<String> {
        self.retry_destroy.iter().cloned().collect()
    }

    /// Reads every set that exists (`ipset save`), keeps ours (`is_owned_set`) in the cache.
    /// Called at start and on the refresh timer. On error the cache is left as it was.
    pub fn resync(&mut self) -> anyhow::Result<()> {
        let metrics = crate::telemetry::metrics::global();
        metrics.ipset_calls.inc();
        let result = self.read_kernel();
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
            let sets = self.cache.values().filter(|k| k.family == Some(family));
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

    fn read_kernel(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .exec
            .command("ipset")
            .arg("save")
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start ipset save")?;
        // Parse while ipset writes: a node with large sets (kube-proxy's, ours) prints
        // millions of lines, and only ours are kept.
        let parsed = match child.stdout.take() {
            Some(stdout) => parse_save(BufReader::new(stdout)),
            None => Err(io::Error::other("no stdout")),
        };
        let out = child
            .wait_with_output()
            .context("cannot wait for ipset save")?;
        if !out.status.success() {
            return Err(anyhow!(
                "ipset save failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let cache = parsed.context("cannot read ipset save output")?;
        self.retry_destroy.retain(|n| cache.contains_key(n));
        debug!(sets = cache.len(), "ipset resync");
        self.cache = cache;
        Ok(())
    }

    /// Phase 1 (before iptables): for each name in `dirty` that is in `desired`, create the set
    /// if missing and add the members it lacks. A set of another type or family is destroyed
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
            mgr.plan_additions(desired, dirty, failed, &mut problems)
        });
        let in_use = match outcome {
            Ok(in_use) => in_use,
            Err(e) => return Err(with_problems(e, &problems)),
        };
        for name in in_use {
            // Still the wrong set: the destroy before its re-creation was refused.
            let stuck = match (desired.get(&name), self.cache.get(&name)) {
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

    /// Phase 3 (after iptables no longer references them): for each name in `dirty`, delete
    /// the members that are not desired, and destroy our sets that are not desired at all;
    /// also destroy temporary sets and sets whose destroy was refused earlier. A destroy
    /// refused because iptables still references the set does not fail the rest: the set is
    /// retried on the next call (logged at warn).
    pub fn apply_removals(
        &mut self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        // A set desired again needs no destroy any more.
        self.retry_destroy.retain(|n| !desired.contains_key(n));
        let in_use = self.run_with_retries("removals", |mgr, failed| {
            mgr.plan_removals(desired, dirty, failed)
        })?;
        self.note_in_use(in_use);
        Ok(())
    }

    /// Destroys every set we own (for `netpol-agent cleanup`), reading the kernel first;
    /// nothing else. Sets still referenced by iptables are left and reported in the error.
    pub fn destroy_all_owned(&mut self) -> anyhow::Result<()> {
        self.resync()?;
        let in_use = self.run_with_retries("cleanup", |mgr, failed| {
            let names: Vec<String> = mgr.cache.keys().cloned().collect();
            mgr.plan_destroys(names, failed)
        })?;
        self.note_in_use(in_use.clone());
        let left: Vec<String> = in_use
            .into_iter()
            .filter(|n| self.cache.contains_key(n))
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

    fn note_in_use(&mut self, in_use: BTreeSet<String>) {
        for name in in_use {
            if self.cache.contains_key(&name) {
                warn!(set = %name, "set is still in use by a kernel component; destroying it again later");
                self.retry_destroy.insert(name);
            }
        }
    }

    fn plan_additions(
        &mut self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
        failed: &BTreeSet<String>,
        problems: &mut BTreeSet<String>,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        for name in dirty {
            let Some(spec) = desired.get(name) else {
                continue;
            };
            if let Err(why) = check_spec(name, spec) {
                problems.insert(why);
                continue;
            }
            let want = effective_members(spec);
            let op = match self.cache.get(name) {
                None => Some(OpKind::Create {
                    replace: false,
                    set_type: spec.set_type,
                    members: want.into_owned(),
                }),
                Some(k) if k.set_type != Some(spec.set_type) || k.family != Some(spec.family) => {
                    Some(OpKind::Create {
                        replace: true,
                        set_type: spec.set_type,
                        members: want.into_owned(),
                    })
                }
                Some(k) if k.maxelem != Some(self.max_size) || k.irregular => {
                    let temp = self.temp_name(spec.family);
                    Some(OpKind::Swap {
                        temp,
                        set_type: spec.set_type,
                        members: want.into_owned(),
                    })
                }
                Some(k) => {
                    let missing: Vec<Member> = want.difference(&k.members).copied().collect();
                    (!missing.is_empty()).then_some(OpKind::Add(missing))
                }
            };
            if let Some(kind) = op {
                ops.push(Op {
                    name: name.clone(),
                    family: spec.family,
                    kind,
                });
            }
        }
        order_ops(ops, failed)
    }

    fn plan_removals(
        &self,
        desired: &BTreeMap<String, SetSpec>,
        dirty: &BTreeSet<String>,
        failed: &BTreeSet<String>,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        let mut destroys: Vec<String> = Vec::new();
        for name in dirty {
            let Some(k) = self.cache.get(name) else {
                continue;
            };
            match desired.get(name) {
                Some(spec) => {
                    // A set of the wrong kind is phase 1's to replace; deleting from it
                    // would not make it right.
                    if check_spec(name, spec).is_err()
                        || k.set_type != Some(spec.set_type)
                        || k.family != Some(spec.family)
                    {
                        continue;
                    }
                    let want = effective_members(spec);
                    let extra: Vec<Member> = k.members.difference(&want).copied().collect();
                    if !extra.is_empty() {
                        ops.push(Op {
                            name: name.clone(),
                            family: spec.family,
                            kind: OpKind::Del(extra),
                        });
                    }
                }
                None => destroys.push(name.clone()),
            }
        }
        destroys.extend(self.retry_destroy.iter().cloned());
        destroys.extend(self.cache.keys().filter(|n| is_temp_set(n)).cloned());
        let mut ops = order_ops(ops, failed);
        // Destroys go last: a refused one (set in use) then costs only a restart of the lines
        // after it, and every `del` is already done.
        ops.extend(self.plan_destroys(destroys, failed));
        ops
    }

    /// `destroy` ops for those of `names` that the cache holds, each name once.
    fn plan_destroys(&self, names: Vec<String>, failed: &BTreeSet<String>) -> Vec<Op> {
        let names: BTreeSet<String> = names.into_iter().collect();
        let mut ops: Vec<Op> = names
            .into_iter()
            .filter_map(|name| {
                let k = self.cache.get(&name)?;
                // Only ever our own names, whatever the caller passed.
                if !is_owned_set(&name) {
                    return None;
                }
                Some(Op {
                    family: k.family.unwrap_or_else(|| family_of_name(&name)),
                    name,
                    kind: OpKind::Destroy,
                })
            })
            .collect();
        // Sets of types we never create go first: a list:set of ours would hold references
        // to the other sets.
        ops.sort_by_key(|op| {
            self.cache
                .get(&op.name)
                .is_some_and(|k| k.set_type.is_some())
        });
        order_ops(ops, failed)
    }

    /// A temporary set name that no set of ours has.
    fn temp_name(&mut self, family: IpFamily) -> String {
        let digit = match family {
            IpFamily::V4 => '4',
            IpFamily::V6 => '6',
        };
        loop {
            let name = format!("cali{digit}t{}", self.next_temp);
            self.next_temp = self.next_temp.wrapping_add(1);
            if !self.cache.contains_key(&name) {
                return name;
            }
        }
    }

    /// Plans with `plan`, runs one restore per family, and on failure re-reads the kernel and
    /// tries again (planning from the fresh cache, sets that failed last), up to
    /// `RETRY_DELAYS_MS.len()` more times. Returns the sets whose destroy was refused because
    /// they are in use.
    fn run_with_retries<F>(&mut self, phase: &str, mut plan: F) -> anyhow::Result<BTreeSet<String>>
    where
        F: FnMut(&mut Self, &BTreeSet<String>) -> Vec<Op>,
    {
        let mut failed: BTreeSet<String> = BTreeSet::new();
        let mut in_use = BTreeSet::new();
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
            let delay = RETRY_DELAYS_MS.get(attempt).copied();
            attempt += 1;
            match delay {
                Some(ms) => {
                    warn!(
                        phase,
                        attempt, "{failure}; re-reading the kernel and retrying"
                    );
                    std::thread::sleep(Duration::from_millis(ms));
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
                lines += op.render(&mut script, self.max_size);
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
            let Err(fail) = self.restore(&script) else {
                for op in rest {
                    self.apply_to_cache(op);
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
                self.apply_to_cache(op);
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

    fn apply_to_cache(&mut self, op: &Op) {
        match &op.kind {
            OpKind::Create {
                set_type, members, ..
            } => {
                let set = KernelSet::fresh(op.family, *set_type, self.max_size, members.clone());
                self.cache.insert(op.name.clone(), set);
            }
            OpKind::Swap {
                temp,
                set_type,
                members,
            } => {
                let set = KernelSet::fresh(op.family, *set_type, self.max_size, members.clone());
                if let Some(old) = self.cache.insert(op.name.clone(), set) {
                    self.cache.insert(temp.clone(), old);
                }
            }
            OpKind::Add(members) => {
                if let Some(k) = self.cache.get_mut(&op.name) {
                    k.members.extend(members.iter().copied());
                }
            }
            OpKind::Del(members) => {
                if let Some(k) = self.cache.get_mut(&op.name) {
                    for m in members {
                        k.members.remove(m);
                    }
                }
            }
            OpKind::Destroy => {
                self.cache.remove(&op.name);
                self.retry_destroy.remove(&op.name);
            }
        }
    }

    /// Runs one `ipset -exist restore` with `script` on stdin.
    fn restore(&self, script: &str) -> Result<(), ProcessFailure> {
        let spawn_failure = |what: &str, e: io::Error| ProcessFailure {
            line: None,
            message: format!("{what}: {e}"),
        };
        let mut child = self
            .exec
            .command("ipset")
            .args(["-exist", "restore"])
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_failure("cannot start ipset restore", e))?;
        if let Some(mut stdin) = child.stdin.take() {
            // ipset stops reading at the first failing line and exits: a broken pipe here
            // only means its exit status and message tell the story.
            match stdin.write_all(script.as_bytes()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_failure("cannot write to ipset restore", e));
                }
            }
            // Dropping stdin closes it: end of input.
        }
        let out = child
            .wait_with_output()
            .map_err(|e| spawn_failure("cannot wait for ipset restore", e))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (line, message) = parse_restore_error(&stderr);
        Err(ProcessFailure {
            line,
            message: if message.is_empty() {
                format!("exit status {}", out.status)
            } else {
                message
            },
        })
    }
}

/// Failing sets move to the end, so that a set that keeps failing (say, more members than
/// `maxelem`) does not hold back the others on the retries. Otherwise the order is kept.
fn order_ops(mut ops: Vec<Op>, failed: &BTreeSet<String>) -> Vec<Op> {
    if !failed.is_empty() {
        ops.sort_by_key(|op| failed.contains(&op.name));
    }
    ops
}

/// `(op index, line index within the op)` of 1-based script line `line`.
fn locate(ends: &[u64], line: u64) -> Option<(usize, u64)> {
    if line == 0 {
        return None;
    }
    let idx = ends.partition_point(|&end| end < line);
    let before = if idx == 0 { 0 } else { *ends.get(idx - 1)? };
    ends.get(idx)?;
    Some((idx, line - 1 - before))
}

/// `ipset v7.17: Error in line 5: Set cannot be destroyed: ...` → `(Some(5), "Set cannot ...")`.
fn parse_restore_error(stderr: &str) -> (Option<u64>, String) {
    for l in stderr.lines() {
        if let Some(pos) = l.find("Error in line ") {
            let rest = l.get(pos + "Error in line ".len()..).unwrap_or_default();
            if let Some((num, msg)) = rest.split_once(':') {
                if let Ok(n) = num.trim().parse::<u64>() {
                    return (Some(n), msg.trim().to_string());
                }
            }
        }
    }
    (None, stderr.trim().to_string())
}

/// Why a desired set cannot be written, if it cannot: the name goes into restore scripts, so
/// it must be one of ours and a single token the kernel accepts.
fn check_spec(key: &str, spec: &SetSpec) -> Result<(), String> {
    if spec.name != key {
        return Err(format!(
            "desired set {key:?} carries another name ({:?}); skipped",
            spec.name
        ));
    }
    if !is_owned_set(key) || is_temp_set(key) {
        return Err(format!(
            "desired set {key:?} does not have one of our prefixes; skipped"
        ));
    }
    if key.len() > MAX_SET_NAME_LEN || !key.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "desired set {key:?} is not a valid ipset name (at most {MAX_SET_NAME_LEN} printable characters); skipped"
        ));
    }
    Ok(())
}

/// The members of `spec` the kernel can hold: of the set's family and kind. Anything else is
/// a bug upstream; it is logged and left out (so it never counts as missing either).
fn effective_members(spec: &SetSpec) -> Cow<'_, BTreeSet<Member>> {
    let fits = |m: &Member| {
        m.family() == spec.family
            && matches!(
                (spec.set_type, m),
                (SetType::HashNet, Member::Addr(_)) | (SetType::HashIpPort, Member::AddrPort(..))
            )
    };
    if spec.members.iter().all(fits) {
        return Cow::Borrowed(&spec.members);
    }
    let (ok, bad): (BTreeSet<Member>, BTreeSet<Member>) =
        spec.members.iter().copied().partition(|m| fits(m));
    warn!(
        set = %spec.name,
        dropped = bad.len(),
        "members of another family or kind than the set; left out"
    );
    Cow::Owned(ok)
}

/// Reads `ipset save` output, keeping our sets. Lines it does not understand are skipped; a
/// set holding anything we would not write is marked irregular.
fn parse_save<R: BufRead>(mut reader: R) -> io::Result<BTreeMap<String, KernelSet>> {
    let mut sets: BTreeMap<String, KernelSet> = BTreeMap::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf);
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("create"), Some(name)) if is_owned_set(name) => {
                let set = parse_create(words);
                sets.insert(name.to_string(), set);
            }
            (Some("add"), Some(name)) => {
                if let Some(set) = sets.get_mut(name) {
                    let entry = words.next();
                    let trailing = words.next().is_some();
                    match entry.and_then(|e| parse_member(set.set_type, set.family, e)) {
                        Some(m) if !trailing => {
                            set.members.insert(m);
                        }
                        _ => set.irregular = true,
                    }
                }
            }
            _ => {}
        }
    }
    Ok(sets)
}

/// The rest of a `create NAME` line: `TYPE family inet hashsize 1024 maxelem 1048576 ...`.
fn parse_create<'a>(mut words: impl Iterator<Item = &'a str>) -> KernelSet {
    let set_type = match words.next() {
        Some("hash:net") => Some(SetType::HashNet),
        Some("hash:ip,port") => Some(SetType::HashIpPort),
        _ => None,
    };
    let mut set = KernelSet {
        family: None,
        set_type,
        maxelem: None,
        irregular: false,
        members: BTreeSet::new(),
    };
    while let Some(word) = words.next() {
        match word {
            "family" => {
                set.family = match words.next() {
                    Some("inet") => Some(IpFamily::V4),
                    Some("inet6") => Some(IpFamily::V6),
                    _ => None,
                }
            }
            "maxelem" => set.maxelem = words.next().and_then(|v| v.parse().ok()),
            // Sizing the kernel picks or tunes; they change nothing we rely on.
            "hashsize" | "bucketsize" | "initval" => {
                words.next();
            }
            // timeout, counters, comment, skbinfo, forceadd, netmask, ...: not what we create.
            _ => set.irregular = true,
        }
    }
    set
}

/// One `add` entry as a `Member`, if it is one a set of ours would hold: `ipset save` prints a
/// host address without `/32` (`/128`), and `ip,proto:port` for `hash:ip,port`. Addresses
/// compare as values, so any IPv6 spelling matches.
fn parse_member(
    set_type: Option<SetType>,
    family: Option<IpFamily>,
    entry: &str,
) -> Option<Member> {
    let member = match set_type? {
        SetType::HashNet => {
            let (addr, prefix) = match entry.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (entry, None),
            };
            let ip: IpAddr = addr.parse().ok()?;
            if let Some(p) = prefix {
                let full = if ip.is_ipv4() { 32 } else { 128 };
                if p.parse::<u8>().ok()? != full {
                    return None;
                }
            }
            Member::Addr(ip)
        }
        SetType::HashIpPort => {
            let (addr, proto_port) = entry.split_once(',')?;
            let (proto, port) = proto_port.split_once(':')?;
            let protocol = match proto {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                _ => return None,
            };
            Member::AddrPort(addr.parse().ok()?, protocol, port.parse().ok()?)
        }
    };
    (Some(member.family()) == family).then_some(member)
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
mod tests {
    use super::*;

    const SAVE: &str = "\
create KUBE-X hash:ip family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
add KUBE-X 10.0.0.9
create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x9532f0d4
add cali40s:a 10.0.0.1
add cali40s:a 10.0.0.2/32
create cali60s:b hash:net family inet6 hashsize 1024 maxelem 1048576 bucketsize 12 initval 0xae04658e
add cali60s:b fd00:0:0::1
add cali60s:b fd00::2/128
create cali40n:c hash:ip,port family inet hashsize 1024 maxelem 1048576
add cali40n:c 10.0.0.1,tcp:8080
add cali40n:c 10.0.0.1,sctp:80
create cali60n:d hash:ip,port family inet6 hashsize 1024 maxelem 1048576
add cali60n:d fd00::1,udp:53
create cali40s:cidr hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:cidr 10.0.0.0/24
create cali40s:nomatch hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:nomatch 10.0.0.1 nomatch
create cali40s:timeout hash:net family inet hashsize 1024 maxelem 1048576 timeout 100
add cali40s:timeout 10.0.0.1 timeout 50
create cali40s:fam hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:fam fd00::1
create cali40n:icmp hash:ip,port family inet hashsize 1024 maxelem 1048576
add cali40n:icmp 10.0.0.1,icmp:echo-request
create cali40l:list list:set size 8
create cali4t3 hash:net family inet hashsize 1024 maxelem 5
garbage line
add
create
add cali40s:unknown-set 10.0.0.1
";

    fn addr(s: &str) -> Member {
        Member::Addr(s.parse().unwrap())
    }

    #[test]
    fn parses_save_output_keeping_only_ours() {
        let sets = parse_save(SAVE.as_bytes()).unwrap();
        assert!(!sets.contains_key("KUBE-X"));
        assert!(sets.contains_key("cali4t3"));
        let a = &sets["cali40s:a"];
        assert_eq!(a.family, Some(IpFamily::V4));
        assert_eq!(a.set_type, Some(SetType::HashNet));
        assert_eq!(a.maxelem, Some(1_048_576));
        assert!(!a.irregular);
        assert_eq!(
            a.members,
            BTreeSet::from([addr("10.0.0.1"), addr("10.0.0.2")])
        );
        let b = &sets["cali60s:b"];
        assert!(!b.irregular);
        assert_eq!(
            b.members,
            BTreeSet::from([addr("fd00::1"), addr("fd00::2")])
        );
        let c = &sets["cali40n:c"];
        let printed: Vec<String> = c.members.iter().map(|m| m.to_string()).collect();
        assert_eq!(printed, ["10.0.0.1,tcp:8080", "10.0.0.1,sctp:80"]);
        assert_eq!(
            sets["cali60n:d"].members.iter().next().unwrap().to_string(),
            "fd00::1,udp:53"
        );
        for odd in [
            "cali40s:cidr",
            "cali40s:nomatch",
            "cali40s:timeout",
            "cali40s:fam",
            "cali40n:icmp",
        ] {
            assert!(sets[odd].irregular, "{odd}");
        }
        assert_eq!(sets["cali40l:list"].set_type, None);
        assert_eq!(sets["cali40l:list"].family, None);
    }

    #[test]
    fn save_parsing_survives_any_bytes() {
        let mut junk: Vec<u8> = (0u8..=255).collect();
        junk.extend_from_slice(b"\ncreate cali40s:x hash:net family\nadd cali40s:x \xff\xfe\n");
        junk.extend_from_slice(b"create cali40s:y hash:net maxelem 99999999999999\n");
        let sets = parse_save(junk.as_slice()).unwrap();
        assert_eq!(sets["cali40s:x"].family, None);
        assert!(sets["cali40s:x"].irregular);
        assert_eq!(sets["cali40s:y"].maxelem, None);
    }

    #[test]
    fn restore_errors_name_their_line() {
        let (line, msg) = parse_restore_error(
            "ipset v7.17: Error in line 5: Set cannot be destroyed: it is in use by a kernel component\n",
        );
        assert_eq!(line, Some(5));
        assert!(msg.contains(IN_USE));
        assert_eq!(parse_restore_error("boom\n"), (None, "boom".to_string()));
        assert_eq!(parse_restore_error("Error in line x: y").0, None);
    }

    #[test]
    fn failing_lines_map_to_their_op() {
        let ends = [2, 3, 7];
        assert_eq!(locate(&ends, 1), Some((0, 0)));
        assert_eq!(locate(&ends, 2), Some((0, 1)));
        assert_eq!(locate(&ends, 3), Some((1, 0)));
        assert_eq!(locate(&ends, 7), Some((2, 3)));
        assert_eq!(locate(&ends, 8), None);
        assert_eq!(locate(&ends, 0), None);
        assert_eq!(locate(&[], 1), None);
    }

    fn spec(name: &str, family: IpFamily, members: &[&str]) -> SetSpec {
        SetSpec {
            name: name.into(),
            family,
            set_type: SetType::HashNet,
            members: members.iter().map(|m| addr(m)).collect(),
        }
    }

    fn manager_with(save: &str, max: u32) -> IpsetManager {
        let mut mgr = IpsetManager::new(Exec::default(), max);
        mgr.cache = parse_save(save.as_bytes()).unwrap();
        mgr
    }

    fn script(mgr: &IpsetManager, ops: &[Op]) -> String {
        let mut out = String::new();
        for op in ops {
            op.render(&mut out, mgr.max_size);
        }
        out
    }

    #[test]
    fn plans_only_what_differs_from_the_cache() {
        let mut mgr = manager_with(SAVE, 1_048_576);
        let desired = BTreeMap::from([
            (
                "cali40s:a".to_string(),
                spec("cali40s:a", IpFamily::V4, &["10.0.0.1", "10.0.0.3"]),
            ),
            (
                "cali60s:b".to_string(),
                spec("cali60s:b", IpFamily::V6, &["fd00::1", "fd00::2"]),
            ),
            (
                "cali40s:new".to_string(),
                spec("cali40s:new", IpFamily::V4, &["10.1.0.1"]),
            ),
        ]);
        let dirty: BTreeSet<String> = desired.keys().cloned().collect();
        let mut problems = BTreeSet::new();
        let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut problems);
        assert!(problems.is_empty());
        assert_eq!(
            script(&mgr, &ops),
            "add cali40s:a 10.0.0.3\n\
             create cali40s:new hash:net family inet maxelem 1048576\n\
             add cali40s:new 10.1.0.1\n"
        );
        let ops = mgr.plan_removals(&desired, &dirty, &BTreeSet::new());
        assert_eq!(
            script(&mgr, &ops),
            "del cali40s:a 10.0.0.2\ndestroy cali4t3\n"
        );
    }

    #[test]
    fn replaces_sets_of_another_kind() {
        let mut mgr = manager_with(SAVE, 1_048_576);
        let mut named = spec("cali40s:a", IpFamily::V4, &[]);
        named.set_type = SetType::HashIpPort;
        let desired = BTreeMap::from([
            ("cali40s:a".to_string(), named),
            (
                "cali40s:cidr".to_string(),
                spec("cali40s:cidr", IpFamily::V4, &["10.0.0.1"]),
            ),
        ]);
        let dirty: BTreeSet<String> = desired.keys().cloned().collect();
        let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut BTreeSet::new());
        assert_eq!(
            script(&mgr, &ops),
            "destroy cali40s:a\n\
             create cali40s:a hash:ip,port family inet maxelem 1048576\n\
             create cali4t0 hash:net family inet maxelem 1048576\n\
             add cali4t0 10.0.0.1\n\
             swap cali4t0 cali40s:cidr\n"
        );
        assert!(ops[0].is_destroy_line(0) && !ops[0].is_destroy_line(1));
        assert!(!ops[1].is_destroy_line(0));
    }

    #[test]
    fn temp_names_skip_existing_ones() {
        let mut mgr = manager_with("create cali4t0 hash:net family inet\n", 10);
        assert_eq!(mgr.temp_name(IpFamily::V4), "cali4t1");
        assert_eq!(mgr.temp_name(IpFamily::V6), "cali6t2");
    }

    #[test]
    fn bad_desired_input_is_reported_not_written() {
        let mut mgr = manager_with("", 10);
        let mut wrong_family = spec("cali40s:f", IpFamily::V4, &["10.0.0.1", "fd00::1"]);
        wrong_family.members.insert(Member::AddrPort(
            "10.0.0.2".parse().unwrap(),
            Protocol::Tcp,
            80,
        ));
        let desired = BTreeMap::from([
            ("KUBE-X".to_string(), spec("KUBE-X", IpFamily::V4, &[])),
            ("cali4t9".to_string(), spec("cali4t9", IpFamily::V4, &[])),
            (
                "cali40s:a b".to_string(),
                spec("cali40s:a b", IpFamily::V4, &[]),
            ),
            (
                "cali40s:k".to_string(),
                spec("cali40s:other", IpFamily::V4, &[]),
            ),
            ("cali40s:f".to_string(), wrong_family),
        ]);
        let dirty: BTreeSet<String> = desired.keys().cloned().collect();
        let mut problems = BTreeSet::new();
        let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut problems);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert_eq!(
            script(&mgr, &ops),
            "create cali40s:f hash:net family inet maxelem 10\nadd cali40s:f 10.0.0.1\n"
        );
    }

    #[test]
    fn failed_sets_go_last() {
        let op = |name: &str| Op {
            name: name.into(),
            family: IpFamily::V4,
            kind: OpKind::Destroy,
        };
        let ops = order_ops(
            vec![op("a"), op("b"), op("c")],
            &BTreeSet::from(["a".to_string()]),
        );
        let names: Vec<&str> = ops.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "a"]);
    }
}
