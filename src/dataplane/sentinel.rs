//! The dataplane's watch at rest: asks the kernel, cheaply and without starting a process,
//! whether anything of ours changed behind our back, so the driver re-reads (and repairs) only
//! then, with a slow full re-read behind it as the safety net.
//!
//! Per backend (the costs are measured by `cargo bench --bench change_detect`):
//! - legacy iptables: every check is one `IPT_SO_GET_INFO` per family (table size, entry count,
//!   hook offsets). When it moved, the rule blob is read and digested per chain to tell whether
//!   a chain of ours or a kernel chain we hook into changed, or only someone else's. After a
//!   read that found only someone else's change, the next one waits (at least 1 s, and 20
//!   times the read's own cost), so another program rewriting the table often cannot make us
//!   busy; after a read that found a change of ours (a repair follows, costing far more) the
//!   next check reads at once, so a tamper is never left waiting on the guard against churn. A rule replaced in place by one of the
//!   same size leaves the info alone: the exact verify (the digest) catches it.
//! - nft: the nf_tables change events, grouped per commit and classified by table and chain,
//!   are polled at every check; commits of our own restores (by process id) are ignored. The
//!   verify checks that the subscription saw the latest generation. Lost events (a receive
//!   buffer overrun) mean "re-read".
//! - IP sets: one header dump (names, types, sizes, entry counts) per check of the sets; the
//!   verify adds a digest of each of our sets' members (a member swapped for another leaves
//!   the header as it was). The dump is not cheap on a large node: for each hash set the
//!   kernel counts the entries by walking every bucket (`mtype_head` → `mtype_ext_size`), so
//!   it costs about 2 µs per set plus 2 ns per bucket (1024 per set of ours) plus 45 ns per
//!   member: ~5 ms of CPU at 554 sets / 61k members, half a percent of a core if done every
//!   second. The kernel has no cheaper signal for a set's contents (`IPSET_CMD_HEADER` walks
//!   nothing but says nothing about the members). So the sets have their own interval
//!   ([`sets_check_interval`]): the cheap check's (`FELIX_KERNELCHECKINTERVAL`), stretched
//!   so the dumps take at most 1/400 of a core (0.25 %), but never beyond
//!   [`SETS_CHECK_MAX_INTERVAL`] (1.5 s), so a set changed behind our back is still seen
//!   within 1.5 s and repaired (a re-read of every set and a restore: 0.1–0.2 s at that size)
//!   within the 2 s goal. Small nodes (dumps under 2.5 ms) keep the configured interval.
//!
//! Our own writes are not changes: after each apply the driver tells the sentinel what it
//! wrote, and the fingerprints follow (cheaply after an incremental write, in full after a
//! re-read). A watch that cannot be opened (an old kernel, no permission) is reported once;
//! the driver then falls back to re-reading on a short timer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use tracing::debug;

use super::iptables::Backend;
use super::watch::ipset::IpsetWatch;
use super::watch::nft::{Commit, NftGeneration, NftMonitor};
use super::watch::xtables::LegacyWatch;
use super::watch::{Finding, Interest};
use crate::model::IpFamily;

/// Least time between two reads of a legacy table's rules that another program's writes
/// cause.
const LEGACY_READ_SPACING: Duration = Duration::from_secs(1);
/// And at least this many times the last read's own duration.
const LEGACY_READ_COST_FACTOR: u32 = 20;
/// Our restores' process ids remembered to recognise our own nf_tables commits.
const OWN_PIDS: usize = 256;
/// The IP set header dumps take at most this inverse share of a core (400: 0.25 %)...
const SETS_CHECK_COST_FACTOR: u32 = 400;
/// ...but are never further apart than this: a set changed behind our back is seen within
/// it, and repaired within the 2 s goal.
pub const SETS_CHECK_MAX_INTERVAL: Duration = Duration::from_millis(1500);
/// The exact verify takes at most this inverse share of a core (2000: 0.05 %)...
const VERIFY_COST_FACTOR: u32 = 2000;
/// ...but runs at least this often (the IP set and iptables refreshes, 300 s by default,
/// are the slower net behind it).
pub const VERIFY_MAX_INTERVAL: Duration = Duration::from_secs(600);
/// A full refresh of a watched part takes at most this inverse share of a core (0.05 %)...
const REFRESH_COST_FACTOR: u32 = 2000;
/// ...but runs at least this often.
pub const REFRESH_MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// When the next IP set header dump is due after one that took `cost` of CPU: `base` (the
/// cheap check's interval), stretched to `cost` × [`SETS_CHECK_COST_FACTOR`], at most
/// [`SETS_CHECK_MAX_INTERVAL`]. A `base` beyond that maximum (configured so) is kept as is; an
/// unknown cost keeps `base`.
pub fn sets_check_interval(base: Duration, cost: Option<Duration>) -> Duration {
    stretched(base, cost, SETS_CHECK_COST_FACTOR, SETS_CHECK_MAX_INTERVAL)
}

/// When the next exact verify is due after one that took `cost` of CPU: `base`
/// (`FELIX_KERNELVERIFYINTERVAL`), stretched to `cost` × [`VERIFY_COST_FACTOR`], at most
/// [`VERIFY_MAX_INTERVAL`]. The verify digests every rule of ours and every member of our
/// sets: 0.2–0.35 s of CPU at 30k rules and 61k members, which every 120 s would be a
/// quarter of a percent of a core, half the node's idle budget, for what catches only a
/// rule replaced in place by one of the same size or a set member swapped for another.
pub fn verify_interval(base: Duration, cost: Option<Duration>) -> Duration {
    stretched(base, cost, VERIFY_COST_FACTOR, VERIFY_MAX_INTERVAL)
}

/// When the next full refresh (`FELIX_IPTABLESREFRESHINTERVAL`,
/// `FELIX_IPSETSREFRESHINTERVAL`) of a part the change checks watch is due after one that
/// took `cost` of CPU (the agent's and its `iptables-save`'s / `ipset save`'s): `base`,
/// stretched to `cost` × [`REFRESH_COST_FACTOR`], at most [`REFRESH_MAX_INTERVAL`]. It is
/// the third net, behind the cheap check and the exact verify, and the dearest: 1–3 s of CPU
/// at 30k rules on nft, which every 300 s would cost more than everything else at rest.
pub fn refresh_interval(base: Duration, cost: Option<Duration>) -> Duration {
    stretched(base, cost, REFRESH_COST_FACTOR, REFRESH_MAX_INTERVAL)
}

/// CPU time this thread used so far plus that of every child process the agent waited for
/// (the dataplane thread is the one that runs `iptables-save`, `ipset`, ...).
pub fn cpu_with_children() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole rusage into the pointer on success, which is the
    // only case in which it is read.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some(thread_cpu_time()? + tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// `base`, or `cost` × `factor` when that is longer, but not beyond `cap` (a `base` beyond
/// `cap`, configured so, is kept). An unknown cost keeps `base`.
fn stretched(base: Duration, cost: Option<Duration>, factor: u32, cap: Duration) -> Duration {
    let Some(cost) = cost else {
        return base;
    };
    cost.saturating_mul(factor).max(base).min(cap.max(base))
}

/// CPU time (user and system) the calling thread used so far; `None` where the clock is not
/// available.
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// A read of a legacy table's rules that the info check caused.
#[derive(Clone, Copy, Debug)]
struct LegacyRead {
    at: Instant,
    cost: Duration,
    foreign_only: bool,
}

impl LegacyRead {
    /// Whether another read may follow now: at once after a read that found a change of ours
    /// (or could not tell), spaced out after one that found only someone else's.
    fn next_due(&self) -> bool {
        !self.foreign_only
            || self.at.elapsed() >= LEGACY_READ_SPACING.max(self.cost * LEGACY_READ_COST_FACTOR)
    }
}

/// Why the kernel must be read again, per part; `None`: nothing to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub iptables: Option<String>,
    pub ipsets: Option<String>,
    /// Someone else was seen changing something of ours. Without it a read is only because
    /// the check could not tell (our own writes since the last exact check, lost events, a
    /// failed check): routine, not worth an operator's alert.
    pub changed_by_others: bool,
}

impl Verdict {
    fn note_iptables(&mut self, what: &str, finding: Finding) {
        self.changed_by_others |= Self::note(&mut self.iptables, what, finding);
    }

    fn note_ipsets(&mut self, what: &str, finding: Finding) {
        self.changed_by_others |= Self::note(&mut self.ipsets, what, finding);
    }

    /// Whether the finding was a change of ours by someone else.
    fn note(slot: &mut Option<String>, what: &str, finding: Finding) -> bool {
        let (why, by_others) = match finding {
            Finding::Unchanged | Finding::Foreign => return false,
            Finding::Ours(names) => (
                format!(
                    "{what} changed behind our back: {}",
                    names.into_iter().collect::<Vec<_>>().join(", ")
                ),
                true,
            ),
            Finding::Unknown(why) => (format!("{what}: {why}"), false),
        };
        slot.get_or_insert(why);
        by_others
    }

    fn failed(slot: &mut Option<String>, what: &str, e: std::io::Error) {
        slot.get_or_insert(format!("{what}: the change check failed: {e}"));
    }

    /// The `result` label of `netpol_dataplane_kernel_checks_total`.
    fn result(&self) -> &'static str {
        if self.changed_by_others {
            "changed"
        } else if self.iptables.is_some() || self.ipsets.is_some() {
            "unknown"
        } else {
            "unchanged"
        }
    }
}

enum Tables {
    Legacy {
        watches: BTreeMap<IpFamily, LegacyWatch>,
        /// When the rules were last read because the info moved, what that cost, and whether
        /// it found only someone else's change (only then are reads spaced out).
        last_read: Option<LegacyRead>,
    },
    Nft {
        monitor: Box<NftMonitor>,
        generation: NftGeneration,
    },
}

pub struct Sentinel {
    tables: Option<Tables>,
    sets: Option<IpsetWatch>,
    /// CPU time the last IP set header dump of a check took.
    sets_cost: Option<Duration>,
    /// CPU time the last exact verify took.
    verify_cost: Option<Duration>,
    own_pids: VecDeque<u32>,
    /// nf_tables: the generation the kernel was at when the apply in progress started.
    fence: Option<u32>,
    /// nf_tables: the generation ids of our own restores' commits (told by `after_apply`).
    own_generations: VecDeque<u32>,
}

/// Whether an nf_tables commit is one of our restores': by its pid when our children's pids
/// are the kernel's (no pid namespace), else by its generation, fenced by `after_apply`, and
/// the name of the program that made it (the restore tools', `iptables-nft-restore` and
/// `ip6tables-nft-restore`, as the kernel keeps it: at most 15 bytes).
fn own_commit(pids: &VecDeque<u32>, generations: &VecDeque<u32>, c: &Commit) -> bool {
    if c.pid.is_some_and(|p| pids.contains(&p)) {
        return true;
    }
    let by_restore = c.process.as_deref().is_some_and(|name| {
        name.len() >= 8
            && ["iptables-nft-restore", "ip6tables-nft-restore"]
                .iter()
                .any(|tool| tool.starts_with(name))
    });
    by_restore && generations.contains(&c.generation)
}

impl Sentinel {
    /// Opens the watches for `backend` and `families` in this thread's network namespace.
    /// Returns the sentinel and what could not be opened (each part that failed is `None`:
    /// the driver re-reads that part on a timer instead).
    pub fn open(
        backend: Backend,
        families: &[IpFamily],
        interest: Interest,
    ) -> (Sentinel, Vec<String>) {
        let mut problems = Vec::new();
        let tables = match backend {
            Backend::Legacy => {
                let mut watches = BTreeMap::new();
                for &family in families {
                    match LegacyWatch::open(family, interest.clone()) {
                        Ok(w) => {
                            watches.insert(family, w);
                        }
                        Err(e) => problems.push(format!("legacy iptables ({family:?}): {e}")),
                    }
                }
                (watches.len() == families.len()).then_some(Tables::Legacy {
                    watches,
                    last_read: None,
                })
            }
            Backend::Nft => match (NftMonitor::open(interest.clone()), NftGeneration::open()) {
                (Ok(monitor), Ok(generation)) => Some(Tables::Nft {
                    monitor: Box::new(monitor),
                    generation,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(format!("nf_tables events: {e}"));
                    None
                }
            },
        };
        let sets = match IpsetWatch::open(interest) {
            Ok(w) => Some(w),
            Err(e) => {
                problems.push(format!("ipset headers: {e}"));
                None
            }
        };
        (
            Sentinel {
                tables,
                sets,
                sets_cost: None,
                verify_cost: None,
                own_pids: VecDeque::new(),
                fence: None,
                own_generations: VecDeque::new(),
            },
            problems,
        )
    }

    /// Watches nothing (change checks turned off).
    pub fn none() -> Sentinel {
        Sentinel {
            tables: None,
            sets: None,
            sets_cost: None,
            verify_cost: None,
            own_pids: VecDeque::new(),
            fence: None,
            own_generations: VecDeque::new(),
        }
    }

    /// Whether iptables and IP sets are watched (else they need the re-read timer).
    pub fn watching(&self) -> (bool, bool) {
        (self.tables.is_some(), self.sets.is_some())
    }

    /// Whether the nf_tables events cover what a post-write re-read would find.
    pub fn sees_every_commit(&self) -> bool {
        matches!(self.tables, Some(Tables::Nft { .. }))
    }

    /// How long after this check of the IP sets the next one is due, for a cheap check
    /// interval of `base` (see [`sets_check_interval`]).
    pub fn sets_check_interval(&self, base: Duration) -> Duration {
        sets_check_interval(base, self.sets_cost)
    }

    /// How long after this verify the next one is due, for a configured interval of `base`
    /// (see [`verify_interval`]).
    pub fn verify_interval(&self, base: Duration) -> Duration {
        verify_interval(base, self.verify_cost)
    }

    /// The cheap check, of the tables, of the IP sets, or both (each part has its own
    /// interval: [`Sentinel::sets_check_interval`]).
    pub fn check(&mut self, tables: bool, sets: bool) -> Verdict {
        let mut v = Verdict::default();
        let (pids, generations) = (&self.own_pids, &self.own_generations);
        let own = |c: &Commit| own_commit(pids, generations, c);
        match self.tables.as_mut().filter(|_| tables) {
            Some(Tables::Legacy { watches, last_read }) => {
                for (family, w) in watches.iter_mut() {
                    let what = format!("iptables ({family:?})");
                    match w.info_moved() {
                        Ok(false) => {}
                        Ok(true) => {
                            if !last_read.is_none_or(|read| read.next_due()) {
                                continue;
                            }
                            let started = Instant::now();
                            let finding = w.check();
                            *last_read = Some(LegacyRead {
                                at: started,
                                cost: started.elapsed(),
                                foreign_only: matches!(finding, Ok(Finding::Foreign)),
                            });
                            match finding {
                                Ok(f) => v.note_iptables(&what, f),
                                Err(e) => Verdict::failed(&mut v.iptables, &what, e),
                            }
                        }
                        Err(e) => Verdict::failed(&mut v.iptables, &what, e),
                    }
                }
            }
            Some(Tables::Nft { monitor, .. }) => match monitor.poll() {
                Ok(changes) => v.note_iptables("iptables (nft)", changes.finding(own)),
                Err(e) => Verdict::failed(&mut v.iptables, "iptables (nft)", e),
            },
            None => {}
        }
        if let Some(w) = self.sets.as_mut().filter(|_| sets) {
            let started = thread_cpu_time();
            match w.check() {
                Ok(f) => v.note_ipsets("IP sets", f),
                Err(e) => Verdict::failed(&mut v.ipsets, "IP sets", e),
            }
            self.sets_cost = started
                .zip(thread_cpu_time())
                .map(|(a, b)| b.saturating_sub(a));
        }
        record(&v);
        v
    }

    /// The exact check: chain digests (legacy), the generation id (nft), member digests.
    pub fn verify(&mut self) -> Verdict {
        let started = thread_cpu_time();
        let mut v = Verdict::default();
        let (pids, generations) = (&self.own_pids, &self.own_generations);
        let own = |c: &Commit| own_commit(pids, generations, c);
        match &mut self.tables {
            Some(Tables::Legacy { watches, .. }) => {
                for (family, w) in watches.iter_mut() {
                    let what = format!("iptables ({family:?})");
                    match w.verify() {
                        Ok(f) => v.note_iptables(&what, f),
                        Err(e) => Verdict::failed(&mut v.iptables, &what, e),
                    }
                }
            }
            Some(Tables::Nft {
                monitor,
                generation,
            }) => match monitor.confirm(generation, own) {
                Ok(f) => v.note_iptables("iptables (nft)", f),
                Err(e) => Verdict::failed(&mut v.iptables, "iptables (nft)", e),
            },
            None => {}
        }
        if let Some(w) = &mut self.sets {
            match w.verify() {
                Ok(f) => v.note_ipsets("IP sets", f),
                Err(e) => Verdict::failed(&mut v.ipsets, "IP sets", e),
            }
        }
        self.verify_cost = started
            .zip(thread_cpu_time())
            .map(|(a, b)| b.saturating_sub(a));
        debug!(cost_ms = ?self.verify_cost.map(|c| c.as_secs_f64() * 1e3), "kernel verify");
        record(&v);
        v
    }

    /// Just before the rules are read in full: the fingerprint is taken now, not after the
    /// read, so a change made while the read runs (a read of 27k rules takes a second) is
    /// seen by the next check instead of being taken for the reference; with nf_tables, the
    /// events and losses the read covers are dropped.
    pub fn before_tables_read(&mut self) {
        match &mut self.tables {
            Some(Tables::Legacy { watches, .. }) => {
                for w in watches.values_mut() {
                    if let Err(e) = w.baseline() {
                        debug!("legacy iptables fingerprint: {e}");
                    }
                }
            }
            Some(Tables::Nft {
                monitor,
                generation,
            }) => {
                if let Err(e) = monitor.resync(generation) {
                    debug!("nf_tables events: {e}");
                }
            }
            None => {}
        }
    }

    /// Just before the IP sets are read in full; see [`Sentinel::before_tables_read`].
    pub fn before_sets_read(&mut self) {
        if let Some(w) = &mut self.sets {
            if let Err(e) = w.baseline() {
                debug!("IP set fingerprint: {e}");
            }
        }
    }

    /// Just before an apply: with nf_tables, the generation the kernel is at (see
    /// [`own_commit`]).
    pub fn before_apply(&mut self) {
        self.fence = match &mut self.tables {
            Some(Tables::Nft { generation, .. }) => generation.read().ok(),
            _ => None,
        };
    }

    /// An apply failed: what it committed is not told apart (the next check reads it).
    pub fn apply_failed(&mut self) {
        self.fence = None;
    }

    /// After a successful apply: our own writes are not changes. Tables we wrote to get the
    /// cheap new reference (legacy iptables is then read again by the driver's post-write
    /// check, which takes the full fingerprint before it reads); the IP sets get a new header
    /// reference and the member digests of the sets written (`sets_written`, names), so the
    /// verify stays exact without re-reading the rest; a part we only read keeps the
    /// fingerprint taken before the read.
    pub fn after_apply(
        &mut self,
        tables_written: bool,
        sets_written: &BTreeSet<String>,
        restore_pids: Vec<u32>,
    ) {
        // nf_tables: the commits since the fence are ours when there are no more of them than
        // restores ran (a restore that changes nothing commits nothing).
        if let (Some(before), Some(Tables::Nft { generation, .. })) =
            (self.fence.take(), self.tables.as_mut())
        {
            if let Ok(after) = generation.read() {
                let commits = after.wrapping_sub(before);
                if commits as usize <= restore_pids.len() {
                    for g in 1..=commits {
                        if self.own_generations.len() == OWN_PIDS {
                            self.own_generations.pop_front();
                        }
                        self.own_generations.push_back(before.wrapping_add(g));
                    }
                }
            }
        }
        for pid in restore_pids {
            if self.own_pids.len() == OWN_PIDS {
                self.own_pids.pop_front();
            }
            self.own_pids.push_back(pid);
        }
        match &mut self.tables {
            Some(Tables::Legacy { watches, .. }) if tables_written => {
                for w in watches.values_mut() {
                    if let Err(e) = w.rebase_info() {
                        debug!("legacy iptables fingerprint: {e}");
                    }
                }
            }
            // Our own commits are told apart by their process ids at the next check.
            _ => {}
        }
        if let Some(w) = &mut self.sets {
            if !sets_written.is_empty() {
                if let Err(e) = w.rebase_after_write(sets_written) {
                    debug!("IP set fingerprint: {e}");
                }
            }
        }
    }
}

fn record(v: &Verdict) {
    let m = crate::telemetry::metrics::global();
    m.dataplane_kernel_checks
        .with_label_values(&[v.result()])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_by_someone_else_counts_as_changed() {
        let ours = || Finding::Ours(["cali-FORWARD".to_string()].into_iter().collect());
        let unknown = || Finding::Unknown("our own writes since the last full fingerprint".into());
        let mut v = Verdict::default();
        v.note_iptables("iptables", Finding::Foreign);
        v.note_ipsets("IP sets", Finding::Unchanged);
        assert_eq!((v.result(), &v.iptables), ("unchanged", &None));
        v.note_iptables("iptables", unknown());
        v.note_ipsets("IP sets", unknown());
        assert_eq!(v.result(), "unknown");
        v.note_ipsets("IP sets", ours());
        assert_eq!(v.result(), "changed");
        // The first reason per part is the one given.
        assert!(v.ipsets.as_deref().unwrap().contains("own writes"));
        let mut v = Verdict::default();
        Verdict::failed(&mut v.ipsets, "IP sets", std::io::Error::other("EPERM"));
        assert_eq!(v.result(), "unknown");
        v.note_iptables("iptables", ours());
        assert_eq!(v.result(), "changed");
    }

    fn read(ago: Duration, cost: Duration, foreign_only: bool) -> LegacyRead {
        LegacyRead {
            at: Instant::now()
                .checked_sub(ago)
                .expect("uptime beyond a minute"),
            cost,
            foreign_only,
        }
    }

    #[test]
    fn reads_after_someone_elses_change_are_spaced_by_their_cost() {
        let cost = Duration::from_millis(100);
        assert!(!read(Duration::ZERO, cost, true).next_due());
        assert!(!read(Duration::from_millis(1500), cost, true).next_due());
        assert!(read(Duration::from_millis(2100), cost, true).next_due());
        let cheap = Duration::from_millis(1);
        assert!(!read(Duration::from_millis(500), cheap, true).next_due());
        assert!(read(Duration::from_millis(1100), cheap, true).next_due());
    }

    #[test]
    fn set_checks_are_spaced_by_their_cost_up_to_the_repair_goal() {
        let ms = Duration::from_millis;
        let base = Duration::from_secs(1);
        // Unknown or cheap (a small node): the configured interval.
        assert_eq!(sets_check_interval(base, None), base);
        assert_eq!(sets_check_interval(base, Some(ms(1))), base);
        assert_eq!(sets_check_interval(base, Some(ms(2))), base);
        // Dearer: at most 0.25 % of a core...
        assert_eq!(sets_check_interval(base, Some(ms(3))), ms(1200));
        // ...but never past the maximum, however dear.
        assert_eq!(
            sets_check_interval(base, Some(ms(5))),
            SETS_CHECK_MAX_INTERVAL
        );
        assert_eq!(
            sets_check_interval(base, Some(Duration::from_secs(u64::MAX))),
            SETS_CHECK_MAX_INTERVAL
        );
        // A shorter configured interval is stretched the same way; a longer one is kept.
        assert_eq!(sets_check_interval(ms(200), Some(ms(1))), ms(400));
        assert_eq!(sets_check_interval(ms(200), None), ms(200));
        let slow = Duration::from_secs(5);
        assert_eq!(sets_check_interval(slow, Some(ms(50))), slow);
    }

    #[test]
    fn refreshes_are_spaced_by_their_cost_up_to_an_hour() {
        let ms = Duration::from_millis;
        let base = Duration::from_secs(300);
        assert_eq!(refresh_interval(base, None), base);
        assert_eq!(refresh_interval(base, Some(ms(100))), base);
        assert_eq!(
            refresh_interval(base, Some(ms(1500))),
            Duration::from_secs(3000)
        );
        assert_eq!(refresh_interval(base, Some(ms(5000))), REFRESH_MAX_INTERVAL);
    }

    #[test]
    fn cpu_with_children_counts_a_waited_child() {
        let before = cpu_with_children().unwrap();
        // A child that burns a little CPU, waited for.
        std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        let after = cpu_with_children().unwrap();
        assert!(after > before, "{before:?} -> {after:?}");
    }

    #[test]
    fn verifies_are_spaced_by_their_cost_up_to_ten_minutes() {
        let ms = Duration::from_millis;
        let base = Duration::from_secs(120);
        assert_eq!(verify_interval(base, None), base);
        // 60 ms (a few thousand rules and members) keeps the configured 120 s.
        assert_eq!(verify_interval(base, Some(ms(60))), base);
        // 0.2 s (30k rules, 61k members): 400 s, 0.05 % of a core.
        assert_eq!(
            verify_interval(base, Some(ms(200))),
            Duration::from_secs(400)
        );
        // Dearer still: never more than 10 minutes apart.
        assert_eq!(verify_interval(base, Some(ms(2000))), VERIFY_MAX_INTERVAL);
        // A configured interval beyond the cap is kept.
        let hour = Duration::from_secs(3600);
        assert_eq!(verify_interval(hour, Some(ms(2000))), hour);
    }

    #[test]
    fn thread_cpu_time_moves_forward() {
        let a = thread_cpu_time().expect("CLOCK_THREAD_CPUTIME_ID");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let b = thread_cpu_time().unwrap();
        assert!(b > a, "{a:?} then {b:?} ({x})");
    }

    #[test]
    fn a_read_that_found_ours_leaves_the_next_check_free_to_read() {
        let expensive = Duration::from_secs(3);
        assert!(read(Duration::ZERO, expensive, false).next_due());
    }
}
