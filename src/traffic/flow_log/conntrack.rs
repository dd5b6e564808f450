//! Packet and byte counts and connection ends of the connections flow logs recorded, read from
//! conntrack (`host::conntrack`, the same ctnetlink client the conntrack cutter uses) on a
//! thread of its own every [`POLL`].
//!
//! What is followed: only the connections the agent logged (an allowed first packet read from
//! the flow-log group), at most [`MAX_TRACKED`] at once (more are counted in `untracked`, not
//! followed); denied ones never get a conntrack entry the kernel keeps. With nothing followed,
//! nothing is read. One dump per family with followed connections per poll: the kernel sends
//! the family's table, and only entries we follow are decoded further than their tuples.
//!
//! Matching: a logged packet is seen in `FORWARD`, after DNAT and before SNAT, so its source is
//! the entry's original source and its destination the entry's reply source (the two differ
//! from the original tuple when kube-proxy translated a Service address). ICMP has no ports
//! and the logged packet's echo id is not decoded, so ICMP is followed per address pair.
//!
//! What a poll adds to the current interval, per record key: the packets and bytes since the
//! previous poll, each way (`*_out` from the reporting end: the source for `Src`, the
//! destination for `Dst`; `*_in` towards it), and the connections that ended (gone from the
//! table, or TCP in `TIME_WAIT`/`CLOSE`, which are then no longer followed). Connections still
//! followed at a flush are the record's live ones. Counts are as of the last poll before a
//! connection ended; they need `nf_conntrack_acct`, which the agent turns on at start when
//! flow logs are on (counted from then on: the kernel decides per connection when it begins;
//! `netpol_flow_log_conntrack_accounting` says whether it is on).
//!
//! Conntrack at two layers: the ctnetlink client in `host::conntrack`, the flow logs' use of it
//! in `traffic::flow_log::conntrack`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::host::conntrack::{
    ConntrackSocket, CtCounters, CtEntry, Family, TCP_CLOSE, TCP_TIME_WAIT,
};
use crate::host::nflog::{Flow, L4};
use crate::rules::Direction;

use super::store::Counts;
use super::{FlowKey, FlowLogShared};

/// Connections followed at once at most.
pub const MAX_TRACKED: usize = 100_000;
/// How often conntrack is read while connections are followed.
pub const POLL: Duration = Duration::from_secs(2);
/// Where accounting is switched on (per network namespace: the writer's), in the order
/// tried. A container's `/proc/sys` is read-only (container runtimes mount it so unless the
/// container is privileged, which the DaemonSet is not), so the DaemonSet mounts the node's
/// `/proc/sys/net/netfilter` read-write at the second path (deploy/base/daemonset.yaml). That
/// grants nothing the agent lacks: writing these sysctls needs `CAP_NET_ADMIN` in the node's
/// network namespace, which it has for iptables anyway.
pub const ACCT_SYSCTLS: [&str; 2] = [
    "/proc/sys/net/netfilter/nf_conntrack_acct",
    "/host/proc/sys/net/netfilter/nf_conntrack_acct",
];

/// A connection as both the logged packet and conntrack name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub protocol: u8,
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
}

impl ConnId {
    /// The logged packet's connection; `None` when it has neither ports nor ICMP.
    pub fn of_flow(flow: &Flow) -> Option<ConnId> {
        let (src_port, dst_port) = match flow.l4 {
            L4::Ports { src, dst } => (src, dst),
            L4::Icmp { .. } => (0, 0),
            _ => return None,
        };
        Some(ConnId {
            protocol: flow.protocol,
            src: flow.src,
            src_port,
            dst: flow.dst,
            dst_port,
        })
    }

    /// The entry's connection: original source, reply source (the real destination).
    pub fn of_entry(e: &CtEntry) -> ConnId {
        let icmp = e.original.icmp.is_some() || e.original.src_port.is_none();
        let port = |p: Option<u16>| if icmp { 0 } else { p.unwrap_or(0) };
        ConnId {
            protocol: e.original.protocol,
            src: e.original.src,
            src_port: port(e.original.src_port),
            dst: e.reply.src,
            dst_port: port(e.reply.src_port),
        }
    }
}

/// The growth from `before` to `now`, seen from `reporter`'s end.
fn delta(reporter: Direction, before: &CtCounters, now: &CtCounters) -> Counts {
    let orig_p = now.original.packets.saturating_sub(before.original.packets);
    let orig_b = now.original.bytes.saturating_sub(before.original.bytes);
    let reply_p = now.reply.packets.saturating_sub(before.reply.packets);
    let reply_b = now.reply.bytes.saturating_sub(before.reply.bytes);
    match reporter {
        // The source sends the original direction.
        Direction::Egress => Counts {
            packets_out: orig_p,
            bytes_out: orig_b,
            packets_in: reply_p,
            bytes_in: reply_b,
            completed: 0,
        },
        Direction::Ingress => Counts {
            packets_in: orig_p,
            bytes_in: orig_b,
            packets_out: reply_p,
            bytes_out: reply_b,
            completed: 0,
        },
    }
}

struct Followed {
    /// The records it counts for: one per reporter (a connection between two pods of this
    /// node is logged at egress and at ingress).
    keys: Vec<FlowKey>,
    last: CtCounters,
}

/// The connections followed. Written by the flow-log reader (new connections) and the poll
/// thread, behind one mutex; reads of conntrack happen outside it.
#[derive(Default)]
pub struct Tracker {
    followed: HashMap<ConnId, Followed>,
    pub untracked: u64,
}

impl Tracker {
    /// Follows the connection of an allowed logged packet for `key`.
    pub fn follow(&mut self, id: ConnId, key: &FlowKey) {
        if let Some(f) = self.followed.get_mut(&id) {
            if !f.keys.iter().any(|k| k.reporter == key.reporter) {
                f.keys.push(key.clone());
            }
            return;
        }
        if self.followed.len() >= MAX_TRACKED {
            self.untracked += 1;
            return;
        }
        self.followed.insert(
            id,
            Followed {
                keys: vec![key.clone()],
                last: CtCounters::default(),
            },
        );
    }

    pub fn is_empty(&self) -> bool {
        self.followed.is_empty()
    }

    /// The followed connections of each family (what a poll asks conntrack about).
    pub fn ids(&self) -> HashMap<Family, HashSet<ConnId>> {
        let mut out: HashMap<Family, HashSet<ConnId>> = HashMap::new();
        for id in self.followed.keys() {
            out.entry(Family::of(id.src)).or_default().insert(*id);
        }
        out
    }

    /// Applies one poll: `asked` the connections looked for, `found` their entries' counters
    /// summed per connection (`None`: no accounting) and whether the connection ended.
    /// Returns what each record gains.
    pub fn apply(
        &mut self,
        asked: &HashSet<ConnId>,
        found: &HashMap<ConnId, (Option<CtCounters>, bool)>,
    ) -> HashMap<FlowKey, Counts> {
        let mut gains: HashMap<FlowKey, Counts> = HashMap::new();
        for id in asked {
            let Some(f) = self.followed.get_mut(id) else {
                continue;
            };
            let (counters, ended) = match found.get(id) {
                Some((c, ended)) => (*c, *ended),
                // Gone: it ended between two polls; its counts stop at the previous one.
                None => (None, true),
            };
            for key in &f.keys {
                let mut t = match &counters {
                    Some(now) => delta(key.reporter, &f.last, now),
                    None => Counts::default(),
                };
                t.completed = u64::from(ended);
                gains.entry(key.clone()).or_default().add(&t);
            }
            if let Some(now) = counters {
                f.last = now;
            }
            if ended {
                self.followed.remove(id);
            }
        }
        gains
    }

    /// Connections followed now, per record key.
    pub fn live(&self) -> HashMap<FlowKey, u64> {
        let mut out: HashMap<FlowKey, u64> = HashMap::new();
        for f in self.followed.values() {
            for k in &f.keys {
                *out.entry(k.clone()).or_default() += 1;
            }
        }
        out
    }
}

/// Whether an entry's connection is over though the entry stays (TCP waiting out late
/// packets).
fn ended(e: &CtEntry) -> bool {
    matches!(e.tcp_state, Some(TCP_TIME_WAIT) | Some(TCP_CLOSE))
}

/// Reads conntrack once for the connections `tracker` follows and adds what it found to the
/// current interval.
pub fn poll(socket: &mut ConntrackSocket, shared: &FlowLogShared) -> std::io::Result<()> {
    let by_family = match shared.tracker.lock() {
        Ok(t) if !t.is_empty() => t.ids(),
        _ => return Ok(()),
    };
    let at = SystemTime::now();
    for (family, asked) in by_family {
        let mut found: HashMap<ConnId, (Option<CtCounters>, bool)> = HashMap::new();
        let listing = socket.list(Some(family), |e| asked.contains(&ConnId::of_entry(e)))?;
        for e in &listing.entries {
            let slot = found.entry(ConnId::of_entry(e)).or_insert((None, true));
            if let Some(c) = e.counters {
                let sum = slot.0.get_or_insert_with(CtCounters::default);
                sum.original.packets += c.original.packets;
                sum.original.bytes += c.original.bytes;
                sum.reply.packets += c.reply.packets;
                sum.reply.bytes += c.reply.bytes;
            }
            // ICMP pairs may hold several entries: ended only when all are.
            slot.1 &= ended(e);
        }
        let gains = match shared.tracker.lock() {
            Ok(mut t) => t.apply(&asked, &found),
            Err(_) => return Ok(()),
        };
        if let Ok(mut store) = shared.store.lock() {
            for (key, t) in gains {
                store.count(key, &t, at);
            }
        }
    }
    Ok(())
}

/// Turns conntrack accounting on in this network namespace (counts begin with connections
/// that start afterwards) through the first of `paths` that takes it; returns whether it is
/// on. A failure is logged with every path's error, and counts stay 0.
pub fn enable_accounting(paths: &[&str]) -> bool {
    let mut errors = Vec::new();
    for path in paths {
        match std::fs::read_to_string(path) {
            Ok(v) if v.trim() == "1" => return true,
            Ok(_) => match std::fs::write(path, "1") {
                Ok(()) => {
                    tracing::info!("flow logs: conntrack accounting turned on ({path}), for packet and byte counts");
                    return true;
                }
                Err(e) => errors.push(format!("{path}: {e}")),
            },
            Err(e) => errors.push(format!("{path}: {e}")),
        }
    }
    tracing::warn!(
        errors = %errors.join("; "),
        "flow logs: cannot turn on conntrack accounting; records will count 0 packets and bytes, \
         and a UDP exchange on a 5-tuple conntrack still holds leaves no trace. Mount the node's \
         /proc/sys/net/netfilter read-write at /host/proc/sys/net/netfilter (the shipped \
         DaemonSet does) or set net.netfilter.nf_conntrack_acct=1 on the node"
    );
    false
}

/// Starts the poll thread (in the calling thread's network namespace); it ends with `stop`.
pub fn spawn(
    shared: Arc<FlowLogShared>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let errors = shared.conntrack_errors.clone();
    let mut socket = ConntrackSocket::open()?;
    std::thread::Builder::new()
        .name("flow-conntrack".into())
        .spawn(move || {
            let mut failing = false;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(POLL);
                match poll(&mut socket, &shared) {
                    Ok(()) => failing = false,
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if !failing {
                            tracing::warn!(error = %e, "flow logs: cannot read conntrack; counts pause until it works again");
                        }
                        failing = true;
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::conntrack::CtCount;
    use crate::model::ObjectKey;
    use crate::rules::flow_log::FlowAction;
    use crate::traffic::flow_log::{End, PolicyHit};

    #[test]
    fn accounting_is_turned_on_through_the_first_path_that_takes_it() {
        let dir = std::env::temp_dir().join(format!("npa-acct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let host = dir.join("nf_conntrack_acct");
        let host = host.to_str().unwrap();
        // A container's read-only /proc/sys stands as a path that cannot be written.
        let read_only = "/nonexistent/proc/sys/net/netfilter/nf_conntrack_acct";
        std::fs::write(host, "0\n").unwrap();
        assert!(enable_accounting(&[read_only, host]));
        assert_eq!(std::fs::read_to_string(host).unwrap(), "1");
        // Already on: nothing written.
        assert!(enable_accounting(&[host, read_only]));
        // No path takes it: off, said.
        assert!(!enable_accounting(&[read_only]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn key(reporter: Direction) -> FlowKey {
        FlowKey {
            src: End {
                ip: "10.0.0.2".parse().unwrap(),
                pod: Some(ObjectKey::new("y", "client")),
            },
            dst: End {
                ip: "10.0.0.1".parse().unwrap(),
                pod: Some(ObjectKey::new("x", "server")),
            },
            dst_port: Some(80),
            protocol: "tcp".into(),
            reporter,
            action: FlowAction::NoPolicy,
            hit: PolicyHit::NoPolicy,
        }
    }

    fn counters(op: u64, ob: u64, rp: u64, rb: u64) -> Option<CtCounters> {
        Some(CtCounters {
            original: CtCount {
                packets: op,
                bytes: ob,
            },
            reply: CtCount {
                packets: rp,
                bytes: rb,
            },
        })
    }

    #[test]
    fn polls_add_growth_per_reporter_and_ends_stop_following() {
        let id = ConnId {
            protocol: 6,
            src: "10.0.0.2".parse().unwrap(),
            src_port: 40000,
            dst: "10.0.0.1".parse().unwrap(),
            dst_port: 80,
        };
        let mut t = Tracker::default();
        // Same node: logged at egress and at ingress; one connection, two records.
        t.follow(id, &key(Direction::Egress));
        t.follow(id, &key(Direction::Ingress));
        t.follow(id, &key(Direction::Ingress));
        assert_eq!(t.live().len(), 2);
        let asked: HashSet<ConnId> = [id].into();
        let found = HashMap::from([(id, (counters(3, 180, 2, 120), false))]);
        let gains = t.apply(&asked, &found);
        let eg = gains[&key(Direction::Egress)];
        assert_eq!(
            (eg.packets_out, eg.bytes_out, eg.packets_in, eg.bytes_in),
            (3, 180, 2, 120)
        );
        let ing = gains[&key(Direction::Ingress)];
        assert_eq!(
            (ing.packets_in, ing.packets_out),
            (3, 2),
            "seen from the destination"
        );
        assert_eq!(eg.completed, 0);
        // The next poll adds only the growth; TIME_WAIT ends it.
        let found = HashMap::from([(id, (counters(5, 300, 4, 1000), true))]);
        let gains = t.apply(&asked, &found);
        let eg = gains[&key(Direction::Egress)];
        assert_eq!((eg.packets_out, eg.bytes_in, eg.completed), (2, 880, 1));
        assert!(t.is_empty(), "an ended connection is no longer followed");
        // Gone between polls: ended, nothing added.
        t.follow(id, &key(Direction::Egress));
        let gains = t.apply(&asked, &HashMap::new());
        assert_eq!(
            gains[&key(Direction::Egress)],
            Counts {
                completed: 1,
                ..Counts::default()
            }
        );
        // Not asked (followed after the poll began): untouched.
        t.follow(id, &key(Direction::Egress));
        assert!(t.apply(&HashSet::new(), &HashMap::new()).is_empty());
        assert_eq!(t.live()[&key(Direction::Egress)], 1);
    }

    #[test]
    fn the_logged_packet_and_the_entry_name_the_same_connection_through_dnat() {
        use crate::host::nflog::Flow;
        // A client to a Service address, DNATed to the pod before FORWARD logs it.
        let logged = Flow {
            src: "10.0.0.2".parse().unwrap(),
            dst: "10.0.0.1".parse().unwrap(),
            protocol: 6,
            l4: L4::Ports {
                src: 40000,
                dst: 8080,
            },
        };
        let id = ConnId::of_flow(&logged).unwrap();
        let tuple = |src: &str, dst: &str, sp, dp| crate::host::conntrack::CtTuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 6,
            src_port: Some(sp),
            dst_port: Some(dp),
            icmp: None,
        };
        let listing_entry = |orig, reply| {
            let mut e = crate::host::conntrack::CtEntry::for_tests(orig, reply);
            e.counters = None;
            e
        };
        let e = listing_entry(
            tuple("10.0.0.2", "10.96.0.10", 40000, 80),
            tuple("10.0.0.1", "10.0.0.2", 8080, 40000),
        );
        assert_eq!(ConnId::of_entry(&e), id);
    }
}
