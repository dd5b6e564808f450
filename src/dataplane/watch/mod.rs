//! Cheap answers to "did anything that could concern us change since I last looked?", per
//! kernel backend, without starting a process. The dataplane loop reads everything (a save of
//! the table, an `ipset save`) only when one of these says so, plus a slow safety-net refresh.
//!
//! - [`xtables`] (legacy iptables): one `getsockopt(IPT_SO_GET_INFO)` per table and family
//!   (sizes, entry count and hook offsets); when that moved, or on a slower timer, the rule
//!   blob from `IPT_SO_GET_ENTRIES`, digested per chain with the packet counters masked, says
//!   which chains changed. The info alone misses a rule replaced in place by one of the same
//!   size (`iptables -R ... -j ACCEPT` for a `-j DROP`); the entries digest does not.
//! - [`nft`] (iptables-nft): a subscription to the nf_tables change events, grouped by commit
//!   (each closed by its `NEWGEN` message carrying the generation id and the committing
//!   process), classified by table and chain name, so a commit of kube-proxy's own table is
//!   told apart from one touching `filter`'s `INPUT`/`FORWARD`/`OUTPUT` or a `cali-` chain.
//!   Lost events (`ENOBUFS`) are reported as unknown. The ruleset generation id (one request)
//!   checks that the subscription saw every commit.
//! - [`ipset`]: the headers of every set without members (name, type, family, size limits,
//!   references, entry count, memory) in one netlink dump; a change in one of our sets' headers
//!   is something to re-read. A member swapped for another leaves the header as it was, so a
//!   member digest of our sets (also over netlink) is the safety net. Not free on a large
//!   node: the kernel counts each hash set's entries by walking all its buckets, so the dump
//!   costs CPU in proportion to the sets' hash sizes and members (the sentinel spaces it).
//!
//! Every primitive works in the network namespace of the thread that opens its socket (the
//! agent runs in the node's; tests open them on a thread that entered a test namespace), and
//! keeps its socket open between checks. All decoding of kernel bytes is bounds-checked and
//! returns an error naming what is wrong; nothing here panics on bad input.
//!
//! Every watcher reports a [`Finding`] relative to the fingerprint it took last (at
//! `baseline()` or at the previous check that saw a change): a change is reported once. The
//! caller's own writes are changes too: after writing, call the watcher's `baseline()` (legacy
//! iptables, ipset) or ignore the commits of the processes it started ([`nft`] reports each
//! commit's process id).

pub mod ipset;
mod nfnl;
pub mod nft;
pub mod xtables;

use std::collections::BTreeSet;

use super::iptables::{Ownership, TABLE};
use crate::model::IpFamily;
use crate::rules::sets::{OWNED_SET_PREFIXES, TEMP_SET_PREFIXES};

/// What a check learned since the last look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Nothing changed.
    Unchanged,
    /// Something changed, but only in what is not ours: other tables, other chains, other
    /// sets. Nothing to read.
    Foreign,
    /// Something of ours changed: these chains (kernel chains we hook into, `cali-` chains) or
    /// sets. Read them (or everything) and repair.
    Ours(BTreeSet<String>),
    /// The check cannot tell (events lost, a reply that does not decode, no fingerprint yet):
    /// read everything.
    Unknown(String),
}

impl Finding {
    /// Whether the caller must read (at least part of) the kernel state.
    pub fn needs_read(&self) -> bool {
        matches!(self, Finding::Ours(_) | Finding::Unknown(_))
    }

    /// Combines two findings about the same period: the stronger wins (`Unknown` over
    /// `Ours` over `Foreign` over `Unchanged`), and the names of two `Ours` add up.
    pub fn merge(self, other: Finding) -> Finding {
        use Finding::*;
        match (self, other) {
            (Unknown(a), _) => Unknown(a),
            (_, Unknown(b)) => Unknown(b),
            (Ours(mut a), Ours(b)) => {
                a.extend(b);
                Ours(a)
            }
            (Ours(a), _) | (_, Ours(a)) => Ours(a),
            (Foreign, _) | (_, Foreign) => Foreign,
            (Unchanged, Unchanged) => Unchanged,
        }
    }
}

/// What concerns us: the table we program, the kernel chains we put rules in, the prefix of
/// the chains we own, and the prefixes of the IP sets we own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interest {
    /// `filter`.
    pub table: String,
    /// Chains of others that hold rules of ours (`INPUT`, `FORWARD`, `OUTPUT`).
    pub kernel_chains: BTreeSet<String>,
    /// Our chains' prefix (`cali-`).
    pub chain_prefix: String,
    /// Our sets' prefixes (`cali40`, `cali60`, `cali4t`, `cali6t`).
    pub set_prefixes: Vec<String>,
    /// The IP families we program (nf_tables events of the other family are foreign).
    pub families: Vec<IpFamily>,
}

impl Interest {
    /// What the agent's dataplane owns: the writer's table, the kernel chains it hooks into,
    /// the chains `ownership` names ours, and our IP sets (`crate::rules::sets`), in `families`.
    pub fn new(ownership: &Ownership, kernel_chains: &[&str], families: &[IpFamily]) -> Interest {
        Interest {
            table: TABLE.to_string(),
            kernel_chains: kernel_chains.iter().map(|c| c.to_string()).collect(),
            chain_prefix: ownership.chain_prefix.to_string(),
            set_prefixes: OWNED_SET_PREFIXES
                .iter()
                .chain(TEMP_SET_PREFIXES.iter())
                .map(|p| p.to_string())
                .collect(),
            families: families.to_vec(),
        }
    }
}

impl Interest {
    /// Whether a chain of our table concerns us: one we hook into or one we own.
    pub fn chain_is_ours(&self, chain: &str) -> bool {
        self.kernel_chains.contains(chain) || chain.starts_with(&self.chain_prefix)
    }

    /// Whether an IP set is one of ours.
    pub fn set_is_ours(&self, set: &str) -> bool {
        self.set_prefixes
            .iter()
            .any(|p| set.starts_with(p.as_str()))
    }

    /// The finding for a set of changed chain names of our table.
    pub fn classify_chains<'a>(&self, changed: impl IntoIterator<Item = &'a String>) -> Finding {
        classify(changed, |c| self.chain_is_ours(c))
    }

    /// The finding for a set of changed set names.
    pub fn classify_sets<'a>(&self, changed: impl IntoIterator<Item = &'a String>) -> Finding {
        classify(changed, |s| self.set_is_ours(s))
    }
}

fn classify<'a>(
    changed: impl IntoIterator<Item = &'a String>,
    ours: impl Fn(&str) -> bool,
) -> Finding {
    let mut any = false;
    let mut mine = BTreeSet::new();
    for name in changed {
        any = true;
        if ours(name) {
            mine.insert(name.clone());
        }
    }
    match (any, mine.is_empty()) {
        (false, _) => Finding::Unchanged,
        (true, true) => Finding::Foreign,
        (true, false) => Finding::Ours(mine),
    }
}

/// Bytes from the kernel that do not have the shape they should.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what}: {detail}")]
pub struct Malformed {
    /// Which structure (`ipt_getinfo`, `ipset list reply`, ...).
    pub what: &'static str,
    pub detail: String,
}

impl Malformed {
    pub(crate) fn new(what: &'static str, detail: impl Into<String>) -> Malformed {
        Malformed {
            what,
            detail: detail.into(),
        }
    }
}

impl From<Malformed> for std::io::Error {
    fn from(e: Malformed) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn chains_of_ours_and_of_others() {
        let i = crate::agent::ours();
        assert_eq!(i.classify_chains(&names(&[])), Finding::Unchanged);
        assert_eq!(
            i.classify_chains(&names(&["KUBE-FORWARD", "DOCKER"])),
            Finding::Foreign
        );
        assert_eq!(
            i.classify_chains(&names(&["KUBE-FORWARD", "FORWARD", "cali-tw-x"])),
            Finding::Ours(names(&["FORWARD", "cali-tw-x"]))
        );
        // `cali` without the dash is not our prefix (another program's chain).
        assert_eq!(i.classify_chains(&names(&["calico"])), Finding::Foreign);
        assert_eq!(i.classify_chains(&names(&["PREROUTING"])), Finding::Foreign);
    }

    #[test]
    fn sets_of_ours_and_of_others() {
        let i = crate::agent::ours();
        assert_eq!(
            i.classify_sets(&names(&["KUBE-SVC", "cali40s:abc", "cali6ttmp"])),
            Finding::Ours(names(&["cali40s:abc", "cali6ttmp"]))
        );
        assert_eq!(i.classify_sets(&names(&["KUBE-SVC"])), Finding::Foreign);
    }

    #[test]
    fn merge_keeps_the_stronger_finding() {
        use Finding::*;
        assert_eq!(Unchanged.merge(Foreign), Foreign);
        assert_eq!(Foreign.merge(Ours(names(&["a"]))), Ours(names(&["a"])));
        assert_eq!(
            Ours(names(&["a"])).merge(Ours(names(&["b"]))),
            Ours(names(&["a", "b"]))
        );
        assert_eq!(
            Ours(names(&["a"])).merge(Unknown("lost".into())),
            Unknown("lost".into())
        );
        assert!(!Foreign.needs_read());
        assert!(Unknown(String::new()).needs_read());
    }
}
