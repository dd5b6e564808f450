//! nf_tables (the iptables-nft backend): the ruleset generation id and a subscription to the
//! nf_tables change events.
//!
//! Every nf_tables commit that changes anything bumps the generation id and tells the
//! `NFNLGRP_NFTABLES` multicast group what it did: one message per table, chain, rule, set,
//! element or object added or removed, each naming its table (and for chains and rules the
//! chain), then one `NEWGEN` with the new generation id and the pid and name of the committing
//! process. [`NftMonitor`] groups the events into commits at each `NEWGEN` and classifies them
//! against an [`Interest`]: a commit that touched a chain of ours in our table (the kernel
//! chains we hook into, `cali-` chains) or our table itself concerns us; one that touched only
//! other tables (kube-proxy's `ip kube-proxy`), other chains of `filter` (`KUBE-FORWARD`), or
//! sets and objects does not. A receive-buffer overrun (`ENOBUFS`: the kernel dropped events)
//! or an event that does not decode makes the finding unknown (read everything).
//!
//! [`NftGeneration`] reads the generation id with one request (`NFT_MSG_GETGEN`); it changes
//! with every commit of anyone, so on its own it cannot tell kube-proxy's 50 commits a second
//! from a change of ours. [`NftMonitor::confirm`] uses it to check that the subscription saw
//! the latest commit (a missed `NEWGEN` is reported as unknown).
//!
//! The generation request and its reply, and the `NEWGEN` events, are encoded and decoded with
//! netlink-packet-netfilter. The other events are classified by walking their top-level
//! attributes (see `nfnl`): the crate would decode every expression of every rule and every
//! element of every set of each of kube-proxy's commits, only for us to read two names.
//!
//! Pids in `NEWGEN` are the kernel's global pids: an agent in its own pid namespace (every
//! agent pod: found on the first real cluster, issue 36, where each policy change cost up to
//! three needless reads of the ruleset) cannot match them with its children's. So the caller
//! also tells its commits by generation: `Sentinel` reads the generation id before and after
//! each apply, and a commit in between is its own when there were no more commits than
//! restores and the committing process has the restore's name.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use netlink_packet_core::{Emitable, NetlinkSerializable, ParseableParametrized};
use netlink_packet_netfilter::nftables::{GenAttribute, GenMessage, NfTablesMessage};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use nix::libc;

use super::nfnl::{
    self, attr_str, attrs, Msg, NfGen as _, NfnlSocket, NFNLGRP_NFTABLES, NFNL_SUBSYS_NFTABLES,
};
use super::{Finding, Interest, Malformed};
use crate::model::IpFamily;

/// nfgenmsg families of the tables iptables-nft programs.
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// NFT_MSG_* (linux/netfilter/nf_tables.h).
const MSG_NEWTABLE: u8 = 0;
const MSG_DELTABLE: u8 = 2;
const MSG_NEWCHAIN: u8 = 3;
const MSG_DELCHAIN: u8 = 5;
const MSG_NEWRULE: u8 = 6;
const MSG_DELRULE: u8 = 8;
const MSG_NEWGEN: u8 = 15;
const MSG_GETGEN: u8 = 16;
const MSG_DESTROYTABLE: u8 = 26;
const MSG_DESTROYCHAIN: u8 = 27;
const MSG_DESTROYRULE: u8 = 28;
/// Every object message of nf_tables names its table in attribute 1 (`NFTA_TABLE_NAME`,
/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, ...).
const ATTR_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_CHAIN: u16 = 2;

/// Receive buffer of the event socket: kube-proxy's bursts (thousands of element events when
/// it resyncs) must fit between two reads; an overrun only costs a full read.
const MONITOR_RCVBUF: usize = 8 << 20;
/// Datagrams read by one `poll` at most, so a flood cannot hold the caller forever.
const MAX_DATAGRAMS_PER_POLL: usize = 100_000;

fn family_code(f: IpFamily) -> u8 {
    match f {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

/// What one event said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The end of a commit.
    Generation {
        id: u32,
        pid: Option<u32>,
        process: Option<String>,
    },
    /// A table of ours was added, changed (flags such as `dormant`) or removed.
    OurTable(String),
    /// A chain of ours, or a rule in one, was added, changed or removed.
    OurChain(String),
    /// Anything else: another table, another chain, a set, an object, a trace.
    Foreign,
}

/// Classifies one nf_tables event message (a `NETLINK_NETFILTER` message of any subsystem;
/// other subsystems are foreign).
pub fn classify_event(
    msg_type: u16,
    payload: &[u8],
    interest: &Interest,
) -> Result<Event, Malformed> {
    let msg = Msg {
        msg_type,
        flags: 0,
        seq: 0,
        payload,
    };
    let (subsys, kind) = msg.nfnl_type();
    if subsys != NFNL_SUBSYS_NFTABLES {
        return Ok(Event::Foreign);
    }
    if kind == MSG_NEWGEN {
        return decode_generation(msg_type, payload);
    }
    let (family, body) = msg.nfgen("nf_tables event")?;
    let is_table = matches!(kind, MSG_NEWTABLE | MSG_DELTABLE | MSG_DESTROYTABLE);
    let chain_attr = match kind {
        MSG_NEWCHAIN | MSG_DELCHAIN | MSG_DESTROYCHAIN => Some(NFTA_CHAIN_NAME),
        MSG_NEWRULE | MSG_DELRULE | MSG_DESTROYRULE => Some(NFTA_RULE_CHAIN),
        _ => None,
    };
    if !is_table && chain_attr.is_none() {
        // Sets, elements, objects, flowtables, traces: iptables-nft puts none of these in
        // our chains' way.
        return Ok(Event::Foreign);
    }
    if !interest.families.iter().any(|&f| family_code(f) == family) {
        return Ok(Event::Foreign);
    }
    let mut table = None;
    let mut chain = None;
    for attr in attrs(body) {
        let (ty, value) = attr?;
        if ty == ATTR_TABLE {
            table = Some(attr_str("nf_tables table name", value)?);
        } else if Some(ty) == chain_attr {
            chain = Some(attr_str("nf_tables chain name", value)?);
        }
    }
    let table = table.ok_or_else(|| {
        Malformed::new(
            "nf_tables event",
            format!("message type {kind} names no table"),
        )
    })?;
    if table != interest.table {
        return Ok(Event::Foreign);
    }
    if is_table {
        return Ok(Event::OurTable(table.to_string()));
    }
    let chain = chain.ok_or_else(|| {
        Malformed::new(
            "nf_tables event",
            format!("message type {kind} names no chain"),
        )
    })?;
    Ok(if interest.chain_is_ours(chain) {
        Event::OurChain(chain.to_string())
    } else {
        Event::Foreign
    })
}

fn decode_generation(msg_type: u16, payload: &[u8]) -> Result<Event, Malformed> {
    let msg = NetfilterMessage::parse_with_param(payload, msg_type)
        .map_err(|e| Malformed::new("nf_tables generation message", e.to_string()))?;
    let NetfilterMessageInner::NfTables(NfTablesMessage::NewGen(gen)) = msg.inner else {
        return Err(Malformed::new(
            "nf_tables generation message",
            "not a NEWGEN message",
        ));
    };
    let (mut id, mut pid, mut process) = (None, None, None);
    for attr in gen.attributes {
        match attr {
            GenAttribute::Id(v) => id = Some(v),
            GenAttribute::ProcPid(v) => pid = Some(v),
            GenAttribute::ProcName(v) => process = Some(v),
            _ => {}
        }
    }
    let id = id.ok_or_else(|| Malformed::new("nf_tables generation message", "no NFTA_GEN_ID"))?;
    Ok(Event::Generation { id, pid, process })
}

/// Reads the ruleset generation id of the calling thread's network namespace.
pub struct NftGeneration {
    socket: NfnlSocket,
    request: Vec<u8>,
    request_type: u16,
}

impl NftGeneration {
    pub fn open() -> io::Result<NftGeneration> {
        let msg = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            NfTablesMessage::GetGen(GenMessage { attributes: vec![] }),
        );
        let mut request = vec![0u8; Emitable::buffer_len(&msg)];
        Emitable::emit(&msg, &mut request);
        let request_type = NetlinkSerializable::message_type(&msg);
        debug_assert_eq!(
            request_type,
            (u16::from(NFNL_SUBSYS_NFTABLES) << 8) | u16::from(MSG_GETGEN)
        );
        Ok(NftGeneration {
            socket: NfnlSocket::open()?,
            request,
            request_type,
        })
    }

    /// The current generation id: one request, one reply.
    pub fn read(&mut self) -> io::Result<u32> {
        let mut found = None;
        self.socket
            .exchange(self.request_type, 0, &self.request, |msg| {
                if let Event::Generation { id, .. } = decode_generation(msg.msg_type, msg.payload)?
                {
                    found = Some(id);
                }
                Ok(())
            })?;
        found.ok_or_else(|| io::Error::other("the kernel answered GETGEN without a generation id"))
    }
}

/// One nf_tables commit that touched something of ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The generation id the commit produced.
    pub generation: u32,
    /// The committing process (global pid) and its name, when the kernel said.
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// Our chains it touched (rules added or removed, chain created, changed or removed).
    pub chains: BTreeSet<String>,
    /// It added, changed or removed our table itself.
    pub table: bool,
}

/// What the events since the last `poll` said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftChanges {
    /// Complete commits that touched something of ours, in order.
    pub ours: Vec<Commit>,
    /// Complete commits that touched only what is not ours.
    pub foreign_commits: u64,
    /// Why the events cannot be trusted (lost to an overrun, one did not decode): read
    /// everything. `None` when every event was read and understood.
    pub lost: Option<String>,
    /// The generation id of the last complete commit seen.
    pub last_generation: Option<u32>,
}

impl NftChanges {
    /// The finding, counting the commits for which `own` says true (the caller's own
    /// restores) as nothing to read.
    pub fn finding(&self, own: impl Fn(&Commit) -> bool) -> Finding {
        if let Some(why) = &self.lost {
            return Finding::Unknown(why.clone());
        }
        let mut chains = BTreeSet::new();
        let mut any = self.foreign_commits > 0;
        for c in &self.ours {
            any = true;
            if own(c) {
                continue;
            }
            if c.table {
                return Finding::Unknown(format!(
                    "generation {}: our table was added, changed or removed by {}",
                    c.generation,
                    c.process.as_deref().unwrap_or("an unknown process")
                ));
            }
            chains.extend(c.chains.iter().cloned());
        }
        match (any, chains.is_empty()) {
            (false, _) => Finding::Unchanged,
            (true, true) => Finding::Foreign,
            (true, false) => Finding::Ours(chains),
        }
    }
}

/// Events of the commit being read (closed by its `NEWGEN`).
#[derive(Default)]
struct Open {
    chains: BTreeSet<String>,
    table: bool,
}

/// A subscription to the nf_tables events of the calling thread's network namespace.
///
/// Open it before reading the ruleset for the first time: a commit between the read and the
/// subscription would otherwise go unseen.
pub struct NftMonitor {
    socket: NfnlSocket,
    interest: Interest,
    open: Open,
    /// The events of the open commit were partly lost: it cannot be classified.
    open_lost: bool,
    last_generation: Option<u32>,
}

impl NftMonitor {
    /// Subscribes with an 8 MiB receive buffer.
    pub fn open(interest: Interest) -> io::Result<NftMonitor> {
        NftMonitor::with_receive_buffer(interest, MONITOR_RCVBUF)
    }

    /// Subscribes with a receive buffer of `bytes` (the kernel doubles it for its overhead).
    pub fn with_receive_buffer(interest: Interest, bytes: usize) -> io::Result<NftMonitor> {
        Ok(NftMonitor {
            socket: NfnlSocket::monitor(&[NFNLGRP_NFTABLES], bytes)?,
            interest,
            open: Open::default(),
            open_lost: false,
            last_generation: None,
        })
    }

    /// For polling together with other descriptors: readable when events are pending.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// Waits until events are pending; `false` on timeout.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        self.socket.wait_readable(timeout)
    }

    /// The generation id of the last complete commit seen.
    pub fn last_generation(&self) -> Option<u32> {
        self.last_generation
    }

    /// Reads every pending event without blocking and reports the complete commits. Events of
    /// a commit whose `NEWGEN` has not arrived yet are kept for the next call.
    pub fn poll(&mut self) -> io::Result<NftChanges> {
        let mut out = NftChanges::default();
        for _ in 0..MAX_DATAGRAMS_PER_POLL {
            let data = match self.socket.recv_pending() {
                Ok(Some(data)) => data,
                Ok(None) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    out.lost =
                        Some("the kernel dropped nf_tables events (receive buffer overrun)".into());
                    self.open_lost = true;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    out.lost = Some(format!("an nf_tables event could not be read: {e}"));
                    self.open_lost = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for msg in nfnl::messages(data) {
                let event = msg.and_then(|m| classify_event(m.msg_type, m.payload, &self.interest));
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        out.lost = Some(format!("an nf_tables event does not decode: {e}"));
                        self.open_lost = true;
                        break;
                    }
                };
                match event {
                    Event::Generation { id, pid, process } => {
                        let open = std::mem::take(&mut self.open);
                        self.open_lost = false;
                        self.last_generation = Some(id);
                        out.last_generation = Some(id);
                        if open.table || !open.chains.is_empty() {
                            out.ours.push(Commit {
                                generation: id,
                                pid,
                                process,
                                chains: open.chains,
                                table: open.table,
                            });
                        } else {
                            out.foreign_commits += 1;
                        }
                    }
                    Event::OurTable(_) => self.open.table = true,
                    Event::OurChain(chain) => {
                        self.open.chains.insert(chain);
                    }
                    Event::Foreign => {}
                }
            }
        }
        if self.open_lost && out.lost.is_none() {
            out.lost = Some("events of an unfinished nf_tables commit were lost".into());
        }
        Ok(out)
    }

    /// Just before the ruleset is read in full: what is pending and what was lost is covered
    /// by that read, so both are dropped, and the kernel's generation becomes the last one
    /// seen. Without this a lost `NEWGEN` (an overrun during a large commit, such as a first
    /// apply of 27k rules) would ask for a re-read at every check until some later commit.
    /// A commit still being announced meanwhile reaches the next poll as its own commit.
    pub fn resync(&mut self, generation: &mut NftGeneration) -> io::Result<()> {
        let _ = self.poll()?;
        self.last_generation = Some(generation.read()?);
        self.open = Open::default();
        self.open_lost = false;
        Ok(())
    }

    /// Checks that the subscription has seen the latest commit: reads what is pending, then the
    /// generation id, then what is pending again. `Unknown` when the kernel's generation is not
    /// the last one an event reported (a commit whose `NEWGEN` never reached us; or, rarely,
    /// one still being announced while we asked; or no commit seen since the subscription),
    /// otherwise the finding of the events read.
    pub fn confirm(
        &mut self,
        generation: &mut NftGeneration,
        own: impl Fn(&Commit) -> bool,
    ) -> io::Result<Finding> {
        let before = self.poll()?;
        let current = generation.read()?;
        let after = self.poll()?;
        let finding = before.finding(&own).merge(after.finding(&own));
        match self.last_generation {
            Some(seen) if seen == current => Ok(finding),
            seen => Ok(Finding::Unknown(format!(
                "the ruleset is at generation {current} but the last event seen was {}",
                seen.map_or("none".to_string(), |s| s.to_string())
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events captured from a 6.18 kernel (iptables-nft 1.8.9, nft 1.0.6) in a test namespace:
    /// `(netlink message type, payload after the netlink header)`.
    mod captured {
        include!("testdata/nft_events.rs");
    }

    fn interest() -> Interest {
        crate::agent::ours()
    }

    #[test]
    fn captured_events_are_classified() {
        let i = interest();
        for (what, msg_type, payload, want) in captured::EVENTS {
            let got =
                classify_event(*msg_type, payload, &i).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = match got {
                Event::Generation { .. } => "gen".to_string(),
                Event::OurTable(t) => format!("table {t}"),
                Event::OurChain(c) => format!("chain {c}"),
                Event::Foreign => "foreign".to_string(),
            };
            assert_eq!(&got, want, "{what}");
        }
    }

    #[test]
    fn captured_generation_message_decodes() {
        let (msg_type, payload) = captured::NEWGEN;
        match classify_event(msg_type, payload, &interest()).unwrap() {
            Event::Generation { id, pid, process } => {
                assert!(id > 0);
                assert!(pid.is_some());
                assert!(process.is_some());
            }
            e => panic!("not a generation: {e:?}"),
        }
    }

    #[test]
    fn truncated_and_garbage_events_are_errors_not_panics() {
        let i = interest();
        for (what, msg_type, payload, _) in captured::EVENTS {
            for cut in 0..payload.len() {
                // Any prefix either classifies or is an error; never a panic.
                let _ = classify_event(*msg_type, &payload[..cut], &i);
            }
            let mut garbage = payload.to_vec();
            for (k, b) in garbage.iter_mut().enumerate().skip(4) {
                *b = (k as u8).wrapping_mul(37) ^ 0x5a;
            }
            let _ = classify_event(*msg_type, &garbage, &i);
            assert!(classify_event(*msg_type, &[], &i).is_err(), "{what}");
        }
        let (msg_type, payload) = captured::NEWGEN;
        assert!(classify_event(msg_type, &payload[..6], &i).is_err());
    }

    #[test]
    fn families_we_do_not_program_are_foreign() {
        let mut i = interest();
        i.families = vec![IpFamily::V4];
        let v6_rule = captured::EVENTS
            .iter()
            .find(|e| e.0 == "ip6 filter FORWARD rule")
            .expect("captured");
        assert_eq!(
            classify_event(v6_rule.1, v6_rule.2, &i).unwrap(),
            Event::Foreign
        );
    }

    fn commit(generation: u32, pid: u32, chains: &[&str], table: bool) -> Commit {
        Commit {
            generation,
            pid: Some(pid),
            process: Some("iptables".into()),
            chains: chains.iter().map(|s| s.to_string()).collect(),
            table,
        }
    }

    #[test]
    fn findings_of_commits() {
        let none = |_: &Commit| false;
        let mut c = NftChanges::default();
        assert_eq!(c.finding(none), Finding::Unchanged);
        c.foreign_commits = 3;
        assert_eq!(c.finding(none), Finding::Foreign);
        c.ours.push(commit(5, 100, &["FORWARD"], false));
        c.ours.push(commit(6, 200, &["cali-x"], false));
        assert_eq!(
            c.finding(none),
            Finding::Ours(
                ["FORWARD", "cali-x"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
        assert_eq!(
            c.finding(|c| c.pid == Some(100)),
            Finding::Ours(["cali-x"].into_iter().map(String::from).collect())
        );
        assert_eq!(c.finding(|_| true), Finding::Foreign);
        assert_eq!(
            c.finding(|c| c.generation == 5),
            Finding::Ours(["cali-x"].into_iter().map(String::from).collect())
        );
        c.ours.push(commit(7, 300, &[], true));
        assert!(matches!(c.finding(none), Finding::Unknown(_)));
        c.lost = Some("overrun".into());
        assert!(matches!(c.finding(|_| true), Finding::Unknown(_)));
    }
}
