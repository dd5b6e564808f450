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
//! - IP sets: every check is one header dump (names, types, sizes, references, entry counts);
//!   the verify adds a digest of each of our sets' members (a member swapped for another
//!   leaves the header as it was).
//!
//! Our own writes are not changes: after each apply the driver tells the sentinel what it
//! wrote, and the fingerprints follow (cheaply after an incremental write, in full after a
//! re-read). A watch that cannot be opened (an old kernel, no permission) is reported once;
//! the driver then falls back to re-reading on a short timer.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use tracing::debug;

use super::iptables::Backend;
use super::watch::ipset::IpsetWatch;
use super::watch::nft::{NftGeneration, NftMonitor};
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
    own_pids: VecDeque<u32>,
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
                own_pids: VecDeque::new(),
            },
            problems,
        )
    }

    /// Watches nothing (change checks turned off).
    pub fn none() -> Sentinel {
        Sentinel {
            tables: None,
            sets: None,
            own_pids: VecDeque::new(),
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

    /// The cheap check.
    pub fn check(&mut self) -> Verdict {
        let mut v = Verdict::default();
        let own = &self.own_pids;
        match &mut self.tables {
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
                Ok(changes) => {
                    v.note_iptables("iptables (nft)", changes.finding(|pid| own.contains(&pid)))
                }
                Err(e) => Verdict::failed(&mut v.iptables, "iptables (nft)", e),
            },
            None => {}
        }
        if let Some(w) = &mut self.sets {
            match w.check() {
                Ok(f) => v.note_ipsets("IP sets", f),
                Err(e) => Verdict::failed(&mut v.ipsets, "IP sets", e),
            }
        }
        record(&v);
        v
    }

    /// The exact check: chain digests (legacy), the generation id (nft), member digests.
    pub fn verify(&mut self) -> Verdict {
        let mut v = Verdict::default();
        let own = &self.own_pids;
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
            }) => match monitor.confirm(generation, |pid| own.contains(&pid)) {
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

    /// After a successful apply: our own writes are not changes. A part we wrote to gets the
    /// cheap new reference (legacy iptables is then read again by the driver's post-write
    /// check, which takes the full fingerprint before it reads); a part we only read keeps
    /// the fingerprint taken before the read.
    pub fn after_apply(
        &mut self,
        tables_written: bool,
        sets_written: bool,
        restore_pids: Vec<u32>,
    ) {
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
            if sets_written {
                if let Err(e) = w.rebase_headers() {
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
    fn a_read_that_found_ours_leaves_the_next_check_free_to_read() {
        let expensive = Duration::from_secs(3);
        assert!(read(Duration::ZERO, expensive, false).next_due());
    }
}
