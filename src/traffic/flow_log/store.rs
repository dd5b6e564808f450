//! The records of flow logs: the current interval's aggregates and the finished records, with
//! the sequence numbers streams and the file target follow. Pure data; the reader thread
//! writes, the HTTP server and the streams read, each behind [`super::FlowLogShared`]'s one
//! mutex held briefly.
//!
//! Guarantees: at most [`MAX_KEYS`] keys per interval (packets of further keys are counted in
//! [`FlowStore::overflow`], never kept) and [`KEEP_RECORDS`] finished records (oldest dropped
//! first); every finished record has a sequence number one above the previous one, so a reader
//! that remembers the last number it saw misses nothing that is still kept.

use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

use super::FlowKey;

/// Keys one interval aggregates at most; packets of further keys are counted, not kept.
pub const MAX_KEYS: usize = 100_000;
/// Finished records kept for the API.
pub const KEEP_RECORDS: usize = 50_000;

/// What conntrack adds to a record (see [`super::conntrack`]): packets and bytes seen from the
/// reporting end (`out`: sent by it, `in`: towards it) and the connections that ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub packets_in: u64,
    pub packets_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub completed: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.packets_in += o.packets_in;
        self.packets_out += o.packets_out;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.completed += o.completed;
    }
}

/// One record: a key's connections within one interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowRecord {
    pub key: FlowKey,
    pub start: SystemTime,
    pub end: SystemTime,
    /// Connections whose first packet was logged (within the per-pod rate limit).
    pub connections: u64,
    /// From conntrack, for the connections logged: this interval's traffic and ends.
    pub counts: Counts,
    /// Connections still open at the flush (0 for the current interval's).
    pub live: u64,
    /// Finished records: their place in the sequence (1, 2, …); 0 for the current interval's.
    pub seq: u64,
    /// When the interval last saw this key's traffic: a logged connection's first packet, or a
    /// conntrack poll that found new packets of its connections (`None`: neither, a record of
    /// open connections alone). Unlike `end` it moves with traffic of connections that began
    /// earlier, so a reader can tell that a connection it did not see start (a UDP 5-tuple
    /// used again while conntrack still holds it is no new connection) carried packets.
    pub active: Option<SystemTime>,
}

impl FlowRecord {
    /// Whether the record's interval is over (it will not change any more).
    pub fn closed(&self) -> bool {
        self.seq != 0
    }

    /// The latest time the record speaks for: its last connection or its last traffic.
    pub fn latest(&self) -> SystemTime {
        self.active.map_or(self.end, |a| a.max(self.end))
    }
}

struct Open {
    first: SystemTime,
    last: SystemTime,
    connections: u64,
    counts: Counts,
    live: u64,
    active: Option<SystemTime>,
}

impl Open {
    fn record(&self, key: &FlowKey, seq: u64) -> FlowRecord {
        FlowRecord {
            key: key.clone(),
            start: self.first,
            end: self.last,
            connections: self.connections,
            counts: self.counts,
            live: self.live,
            seq,
            active: self.active,
        }
    }
}

#[derive(Default)]
pub struct FlowStore {
    current: HashMap<FlowKey, Open>,
    finished: VecDeque<FlowRecord>,
    last_seq: u64,
    overflow: u64,
}

impl FlowStore {
    /// The key's aggregate, made when there is room (`None`: counted in `overflow`). A new
    /// one's times are `at`; an existing one's are left alone: only connections move them.
    fn open(&mut self, key: FlowKey, at: SystemTime) -> Option<&mut Open> {
        if !self.current.contains_key(&key) && self.current.len() >= MAX_KEYS {
            self.overflow += 1;
            return None;
        }
        Some(self.current.entry(key).or_insert(Open {
            first: at,
            last: at,
            connections: 0,
            counts: Counts::default(),
            live: 0,
            active: None,
        }))
    }

    /// A logged connection started. A record's times span its logged connections (the API's
    /// `start_time`/`end_time`), so counts added later for earlier connections do not make
    /// it look newer; a record of counts alone keeps the time of the poll that made it.
    pub fn observe(&mut self, key: FlowKey, at: SystemTime) {
        if let Some(open) = self.open(key, at) {
            if open.connections == 0 {
                open.first = at;
                open.last = at;
            }
            open.first = open.first.min(at);
            open.last = open.last.max(at);
            open.connections += 1;
            open.active = Some(open.active.map_or(at, |a| a.max(at)));
        }
    }

    /// Conntrack's counts for connections of `key`; a record with nothing to add is not made.
    pub fn count(&mut self, key: FlowKey, counts: &Counts, at: SystemTime) {
        if *counts == Counts::default() {
            return;
        }
        if let Some(open) = self.open(key, at) {
            open.counts.add(counts);
            if counts.packets_in + counts.packets_out > 0 {
                open.active = Some(open.active.map_or(at, |a| a.max(at)));
            }
        }
    }

    /// Ends the interval: its aggregates become records (oldest dropped past
    /// [`KEEP_RECORDS`]); returns the new records, oldest first.
    /// `live`: the connections still open per key; a key with open connections gets a record
    /// even when nothing else happened in the interval (as Goldmane reports long connections
    /// in every interval).
    pub fn flush_with(&mut self, live: &HashMap<FlowKey, u64>, at: SystemTime) -> Vec<FlowRecord> {
        for (key, n) in live {
            if let Some(open) = self.open(key.clone(), at) {
                open.live = *n;
            }
        }
        let mut records: Vec<FlowRecord> = self
            .current
            .drain()
            .map(|(key, o)| o.record(&key, 0))
            .collect();
        records.sort_by_key(|r| r.start);
        for r in &mut records {
            self.last_seq += 1;
            r.seq = self.last_seq;
            if self.finished.len() >= KEEP_RECORDS {
                self.finished.pop_front();
            }
            self.finished.push_back(r.clone());
        }
        records
    }

    /// [`FlowStore::flush_with`] without open connections.
    pub fn flush(&mut self) -> Vec<FlowRecord> {
        self.flush_with(&HashMap::new(), SystemTime::UNIX_EPOCH)
    }

    /// The current interval's aggregates as records so far (sequence 0), oldest first.
    pub fn current(&self) -> Vec<FlowRecord> {
        let mut open: Vec<FlowRecord> = self.current.iter().map(|(k, o)| o.record(k, 0)).collect();
        open.sort_by_key(|r| r.start);
        open
    }

    /// The finished records, then the current interval's, oldest first.
    pub fn records(&self) -> Vec<FlowRecord> {
        let mut out: Vec<FlowRecord> = self.finished.iter().cloned().collect();
        out.extend(self.current());
        out
    }

    /// The finished records after sequence number `seq`, oldest first.
    pub fn after(&self, seq: u64) -> Vec<FlowRecord> {
        // Sequence numbers are consecutive, so the first wanted one's place is arithmetic.
        let first = self.finished.front().map_or(0, |r| r.seq);
        let skip = seq.saturating_add(1).saturating_sub(first);
        self.finished
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }

    /// The sequence number of the newest finished record (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn overflow(&self) -> u64 {
        self.overflow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::flow_log::FlowAction;
    use crate::rules::Direction;
    use crate::traffic::flow_log::{End, PolicyHit};
    use std::time::Duration;

    fn key() -> FlowKey {
        let end = |ip: &str| End {
            ip: ip.parse().unwrap(),
            pod: None,
        };
        FlowKey {
            src: end("10.0.0.1"),
            dst: end("10.0.0.2"),
            dst_port: Some(80),
            protocol: "tcp".into(),
            reporter: Direction::Egress,
            action: FlowAction::Allow,
            hit: PolicyHit::NoPolicy,
        }
    }

    #[test]
    fn a_records_times_span_its_connections_not_its_counts() {
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let counts = Counts {
            packets_out: 3,
            ..Counts::default()
        };
        let mut store = FlowStore::default();
        store.observe(key(), t(10));
        store.observe(key(), t(11));
        // Conntrack's counts of those connections, read later: the record is no newer.
        store.count(key(), &counts, t(13));
        let r = &store.current()[0];
        assert_eq!((r.start, r.end, r.connections), (t(10), t(11), 2));
        assert_eq!(r.counts.packets_out, 3);
        let live = HashMap::from([(key(), 1)]);
        let r = &store.flush_with(&live, t(14))[0];
        assert_eq!((r.start, r.end, r.live), (t(10), t(11), 1));
        // The next interval: counts alone keep the poll's time, until a connection starts.
        store.count(key(), &counts, t(15));
        let r = &store.current()[0];
        assert_eq!((r.start, r.end, r.connections), (t(15), t(15), 0));
        store.observe(key(), t(17));
        let r = &store.current()[0];
        assert_eq!((r.start, r.end, r.connections), (t(17), t(17), 1));
    }

    #[test]
    fn traffic_of_an_earlier_connection_moves_last_active_not_end() {
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let mut store = FlowStore::default();
        store.observe(key(), t(10));
        assert_eq!(store.current()[0].active, Some(t(10)));
        // A UDP exchange on the 5-tuple conntrack still holds: no logged packet, a poll's
        // packets. The record's connection times stay; its activity and `latest` move.
        let packets = Counts {
            packets_in: 1,
            packets_out: 1,
            ..Counts::default()
        };
        store.count(key(), &packets, t(20));
        let r = &store.current()[0];
        assert_eq!((r.end, r.active, r.latest()), (t(10), Some(t(20)), t(20)));
        // A connection that ended without packets is no traffic.
        let ended = Counts {
            completed: 1,
            ..Counts::default()
        };
        store.count(key(), &ended, t(40));
        assert_eq!(store.current()[0].active, Some(t(20)));
        // Open connections alone make a record with no activity.
        store.flush();
        let live = HashMap::from([(key(), 1)]);
        let r = &store.flush_with(&live, t(50))[0];
        assert_eq!((r.active, r.latest(), r.live), (None, t(50), 1));
    }
}
