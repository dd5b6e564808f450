//! The connection tracking table of the current network namespace over ctnetlink
//! (`NETLINK_NETFILTER`, `NFNL_SUBSYS_CTNETLINK`): list the entries that involve an address
//! (in either direction's tuple, both families), and delete one entry exactly.
//!
//! Crate choice: `netlink-packet-netfilter` 0.4 (rust-netlink; on our `netlink-packet-core`
//! 0.9) has the conntrack messages (`IPCTNL_MSG_CT_GET`/`_DELETE`), tuples, status and TCP
//! state; attributes it does not model (`CTA_ZONE`, `CTA_ID`, `CTA_FILTER`, the ICMP id, type
//! and code) travel as its generic attributes, built and read here. The alternatives bind C
//! (`libnetfilter_conntrack`) or shell out to `conntrack`, which the agent's image need not
//! have.
//!
//! Listing: with [`Filtering::Kernel`] the kernel filters the dump (`CTA_FILTER`, Linux 5.8+):
//! its filter is a conjunction, so "the address appears anywhere" takes four dumps (original
//! source, original destination, reply source, reply destination; the reply tuple differs when
//! NAT rewrote the connection), each a walk of the table in the kernel that sends only the
//! matches. With [`Filtering::Userspace`] one dump of the family crosses to us and is filtered
//! here, which is what a kernel without `CTA_FILTER` needs, and the only correct choice for
//! IPv6: ctnetlink's IPv6 address test in the filter is inverted (`!ipv6_addr_cmp(..)`, and
//! `ipv6_addr_cmp` is 0 for equal addresses), so an IPv6 filter sends every entry whose address
//! differs. That is in the 6.18 source and on the 6.18 kernel the tests run on:
//! `tests/conntrack_netns.rs` prints 0 entries crossing for an unrelated IPv4 address and all
//! of them (3 entries x 4 dumps) for an unrelated IPv6 one. [`Filtering::Auto`] therefore
//! filters IPv4 in the kernel and IPv6 here, and falls back to here when the kernel refuses the
//! filter. Every entry is checked here as well, so a kernel filter can cost time but never
//! return a wrong entry.
//!
//! For the agent's re-evaluation of many pods at once, one [`ConntrackSocket::list`] per
//! family with a set of addresses costs one walk; [`ConntrackSocket::list_by_addr`] is the
//! per-pod form.
//!
//! Deleting: the request carries the entry's original tuple exactly as the kernel sent it
//! (protocol-specific fields included, such as the ICMP id, and a directional zone), its zone
//! (`CTA_ZONE`) and its id (`CTA_ID`), so it removes that entry and no other: a connection that
//! closed and was replaced by a new one with the same tuple since the listing has another id,
//! and the kernel answers `ENOENT`, reported as [`Deleted::Gone`].
//!
//! The socket works in the network namespace of the thread that opens it; tests open it in
//! namespaces they create and never touch the host's table.
//!
//! Conntrack at two layers: the ctnetlink client in `host::conntrack`, the flow logs' use of it
//! in `traffic::flow_log::conntrack`.

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, Emitable, Nla, NLA_F_NESTED};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, ConntrackMessageType, IPTuple, ProtoInfo, ProtoInfoTCP,
    ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    NetfilterSubsystem,
};
use nix::libc;

use crate::host::nfnetlink::NfnlSocket;

const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
const CTA_FILTER_F_IP_SRC: u32 = 1 << 0;
const CTA_FILTER_F_IP_DST: u32 = 1 << 1;
const CTA_PROTO_ICMP_ID: u16 = 4;
const CTA_PROTO_ICMP_TYPE: u16 = 5;
const CTA_PROTO_ICMP_CODE: u16 = 6;
const CTA_PROTO_ICMPV6_ID: u16 = 7;
const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
const CTA_PROTO_ICMPV6_CODE: u16 = 9;

/// An address family of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    fn proto_family(self) -> NetfilterProtoFamily {
        match self {
            Family::V4 => NetfilterProtoFamily::IPv4,
            Family::V6 => NetfilterProtoFamily::IPv6,
        }
    }
}

/// ICMP (or ICMPv6) fields of a tuple: conntrack keys echo flows by their id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IcmpKey {
    pub kind: u8,
    pub code: u8,
    pub id: u16,
}

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    /// TCP, UDP, SCTP, DCCP, UDP-Lite.
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    pub icmp: Option<IcmpKey>,
}

impl CtTuple {
    pub fn involves(&self, addr: IpAddr) -> bool {
        self.src == addr || self.dst == addr
    }
}

impl fmt::Display for CtTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = crate::host::nflog::decode::protocol_name(self.protocol);
        write!(f, "{proto} src={} dst={}", self.src, self.dst)?;
        if let (Some(s), Some(d)) = (self.src_port, self.dst_port) {
            write!(f, " sport={s} dport={d}")?;
        }
        if let Some(i) = self.icmp {
            write!(f, " type={} code={} id={}", i.kind, i.code, i.id)?;
        }
        Ok(())
    }
}

/// One conntrack entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEntry {
    pub family: Family,
    pub original: CtTuple,
    pub reply: CtTuple,
    /// `CTA_ZONE`; `None` is the default zone 0.
    pub zone: Option<u16>,
    /// `CTA_ID`: tells this entry from a later one with the same tuple.
    pub id: Option<u32>,
    /// `IPS_*` bits.
    pub status: u32,
    pub mark: Option<u32>,
    /// Seconds left.
    pub timeout: Option<u32>,
    /// `TCP_CONNTRACK_*` (3 is ESTABLISHED).
    pub tcp_state: Option<u8>,
    /// Packets and bytes each way; `None` unless accounting is on (`nf_conntrack_acct`) when
    /// the connection began.
    pub counters: Option<CtCounters>,
    /// The original tuple's attributes as the kernel sent them, sent back to delete.
    raw_original: Vec<Tuple>,
}

/// `TCP_CONNTRACK_ESTABLISHED`.
pub const TCP_ESTABLISHED: u8 = 3;
/// `TCP_CONNTRACK_TIME_WAIT`: both ends closed; the entry only waits out late packets.
pub const TCP_TIME_WAIT: u8 = 7;
/// `TCP_CONNTRACK_CLOSE`: reset or closed.
pub const TCP_CLOSE: u8 = 8;

/// One direction's accounting (`CTA_COUNTERS_ORIG`/`_REPLY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtCount {
    pub packets: u64,
    pub bytes: u64,
}

/// Both directions' accounting: original (from the connection's initiator) and reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtCounters {
    pub original: CtCount,
    pub reply: CtCount,
}

impl CtEntry {
    /// An entry with these tuples and nothing else, for other rooms' unit tests.
    #[doc(hidden)]
    pub fn for_tests(original: CtTuple, reply: CtTuple) -> CtEntry {
        CtEntry {
            family: Family::of(original.src),
            original,
            reply,
            zone: None,
            id: None,
            status: 0,
            mark: None,
            timeout: None,
            tcp_state: None,
            counters: None,
            raw_original: Vec::new(),
        }
    }

    /// Whether `addr` is in either tuple.
    pub fn involves(&self, addr: IpAddr) -> bool {
        self.original.involves(addr) || self.reply.involves(addr)
    }
}

impl fmt::Display for CtEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} reply {}", self.original, self.reply)?;
        if let Some(z) = self.zone {
            write!(f, " zone={z}")?;
        }
        Ok(())
    }
}

/// Where a listing is filtered; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filtering {
    Auto,
    Kernel,
    Userspace,
}

/// What a listing cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListStats {
    /// Dump requests made (each one walk of the table in the kernel).
    pub dumps: u32,
    /// Entries the kernel sent us, before our own check.
    pub walked: u64,
    /// Entries kept.
    pub matched: u64,
    /// Messages that did not decode (skipped).
    pub undecodable: u64,
    /// Whether the kernel filtered the dumps.
    pub kernel_filtered: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub entries: Vec<CtEntry>,
    pub stats: ListStats,
}

/// The outcome of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    /// No such entry any more (it expired, was deleted, or its tuple now belongs to a newer
    /// connection with another id).
    Gone,
}

/// A ctnetlink socket in the calling thread's network namespace.
#[derive(Debug)]
pub struct ConntrackSocket {
    socket: NfnlSocket,
}

impl ConntrackSocket {
    pub fn open() -> io::Result<ConntrackSocket> {
        Ok(ConntrackSocket {
            socket: NfnlSocket::open()?,
        })
    }

    /// The entries with `addr` in their original or reply tuple.
    pub fn list_by_addr(&mut self, addr: IpAddr, filtering: Filtering) -> io::Result<Listing> {
        let family = Family::of(addr);
        let kernel = match filtering {
            Filtering::Kernel => true,
            Filtering::Userspace => false,
            Filtering::Auto => family == Family::V4,
        };
        if kernel {
            match self.list_kernel_filtered(addr) {
                Ok(listing) => return Ok(listing),
                // A kernel before 5.8 ignores CTA_FILTER (and returns everything, which our
                // own check handles); one that knows it but not these flags refuses them.
                Err(e)
                    if filtering == Filtering::Auto
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
                        ) =>
                {
                    tracing::debug!(error = %e, "the kernel refused a filtered conntrack dump; filtering here");
                }
                Err(e) => return Err(e),
            }
        }
        self.list(Some(family), |e| e.involves(addr))
    }

    /// Every entry of `family` (or both) that `keep` accepts, from one dump.
    pub fn list(
        &mut self,
        family: Option<Family>,
        mut keep: impl FnMut(&CtEntry) -> bool,
    ) -> io::Result<Listing> {
        let mut stats = ListStats {
            dumps: 1,
            ..ListStats::default()
        };
        let mut entries = Vec::new();
        let request = dump_request(family, None);
        stats.undecodable = self.socket.dump(request, |message| {
            if let Some(entry) = entry_of(message) {
                stats.walked += 1;
                if keep(&entry) {
                    entries.push(entry);
                }
            }
        })?;
        stats.matched = entries.len() as u64;
        Ok(Listing { entries, stats })
    }

    fn list_kernel_filtered(&mut self, addr: IpAddr) -> io::Result<Listing> {
        let family = Family::of(addr);
        let mut stats = ListStats {
            kernel_filtered: true,
            ..ListStats::default()
        };
        let mut seen = HashSet::new();
        let mut entries = Vec::new();
        for filter in [
            AddrFilter::OriginalSrc,
            AddrFilter::OriginalDst,
            AddrFilter::ReplySrc,
            AddrFilter::ReplyDst,
        ] {
            stats.dumps += 1;
            let request = dump_request(Some(family), Some((filter, addr)));
            stats.undecodable += self.socket.dump(request, |message| {
                let Some(entry) = entry_of(message) else {
                    return;
                };
                stats.walked += 1;
                // The kernel's filter is checked, not trusted; one entry matches up to four
                // of the dumps and is kept once.
                if entry.involves(addr) && seen.insert((entry.id, entry.original, entry.zone)) {
                    entries.push(entry);
                }
            })?;
        }
        stats.matched = entries.len() as u64;
        Ok(Listing { entries, stats })
    }

    /// Deletes exactly `entry`: its original tuple, zone and id.
    pub fn delete(&mut self, entry: &CtEntry) -> io::Result<Deleted> {
        match self.socket.request(delete_request(entry), 0) {
            Ok(()) => Ok(Deleted::Deleted),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Deleted::Gone),
            Err(e) => Err(e),
        }
    }
}

/// One of the four tuple addresses a kernel-filtered dump can select on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AddrFilter {
    OriginalSrc,
    OriginalDst,
    ReplySrc,
    ReplyDst,
}

fn ct_message(family: Option<Family>, message: ConntrackMessage) -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(
            family.map_or(NetfilterProtoFamily::Unspec, Family::proto_family),
            libc::NFNETLINK_V0 as u8,
            0,
        ),
        message,
    )
}

/// A dump request for `family` (both when `None`), kernel-filtered on one address when asked.
fn dump_request(family: Option<Family>, filter: Option<(AddrFilter, IpAddr)>) -> NetfilterMessage {
    let mut attrs = Vec::new();
    if let Some((which, addr)) = filter {
        let ip = match which {
            AddrFilter::OriginalSrc | AddrFilter::ReplySrc => IPTuple::SourceAddress(addr),
            AddrFilter::OriginalDst | AddrFilter::ReplyDst => IPTuple::DestinationAddress(addr),
        };
        let flag = match which {
            AddrFilter::OriginalSrc | AddrFilter::ReplySrc => CTA_FILTER_F_IP_SRC,
            AddrFilter::OriginalDst | AddrFilter::ReplyDst => CTA_FILTER_F_IP_DST,
        };
        let (orig_flags, reply_flags) = match which {
            AddrFilter::OriginalSrc | AddrFilter::OriginalDst => (flag, 0),
            AddrFilter::ReplySrc | AddrFilter::ReplyDst => (0, flag),
        };
        let tuple = vec![Tuple::Ip(vec![ip])];
        attrs.push(generic(&match which {
            AddrFilter::OriginalSrc | AddrFilter::OriginalDst => {
                ConntrackAttribute::CtaTupleOrig(tuple)
            }
            AddrFilter::ReplySrc | AddrFilter::ReplyDst => ConntrackAttribute::CtaTupleReply(tuple),
        }));
        // The flags are host-endian u32 attributes inside CTA_FILTER, which the kernel parses
        // strictly: it must carry NLA_F_NESTED.
        let inner = [
            DefaultNla::new(CTA_FILTER_ORIG_FLAGS, orig_flags.to_ne_bytes().to_vec()),
            DefaultNla::new(CTA_FILTER_REPLY_FLAGS, reply_flags.to_ne_bytes().to_vec()),
        ];
        let mut bytes = vec![0; inner.as_slice().buffer_len()];
        inner.as_slice().emit(&mut bytes);
        attrs.push(DefaultNla::new(CTA_FILTER | NLA_F_NESTED, bytes));
    }
    // Sent as generic attributes: the crate's conntrack attribute type drops the nested flag
    // of attributes it does not model.
    NetfilterMessage::new(
        NetfilterHeader::new(
            family.map_or(NetfilterProtoFamily::Unspec, Family::proto_family),
            libc::NFNETLINK_V0 as u8,
            0,
        ),
        NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Conntrack,
            message_type: u8::from(ConntrackMessageType::Get),
            attributes: attrs,
        },
    )
}

/// An attribute as generic bytes, with the nested flag when it nests.
fn generic(attr: &ConntrackAttribute) -> DefaultNla {
    let kind = if attr.is_nested() {
        attr.kind() | NLA_F_NESTED
    } else {
        attr.kind()
    };
    DefaultNla::new(kind, value_of(attr))
}

fn delete_request(entry: &CtEntry) -> NetfilterMessage {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(entry.raw_original.clone())];
    if let Some(zone) = entry.zone {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    if let Some(id) = entry.id {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    ct_message(Some(entry.family), ConntrackMessage::Delete(attrs))
}

/// The value bytes of a generic attribute.
fn value_of(nla: &impl Nla) -> Vec<u8> {
    let mut b = vec![0; nla.value_len()];
    nla.emit_value(&mut b);
    b
}

fn be16(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

/// Decodes a tuple; `None` when it lacks addresses or a protocol.
fn tuple_of(parts: &[Tuple]) -> Option<CtTuple> {
    let (mut src, mut dst, mut protocol) = (None, None, None);
    let (mut src_port, mut dst_port) = (None, None);
    let (mut kind, mut code, mut id) = (None, None, None);
    for part in parts {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for p in protos {
                    match p {
                        ProtoTuple::Protocol(n) => protocol = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(s) => src_port = Some(*s),
                        ProtoTuple::DestinationPort(d) => dst_port = Some(*d),
                        ProtoTuple::Other(nla) => {
                            let v = value_of(nla);
                            match nla.kind() {
                                CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => id = be16(&v),
                                CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                                    kind = v.first().copied()
                                }
                                CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => {
                                    code = v.first().copied()
                                }
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let icmp = match (kind, code, id) {
        (Some(kind), Some(code), Some(id)) => Some(IcmpKey { kind, code, id }),
        _ => None,
    };
    Some(CtTuple {
        src: src?,
        dst: dst?,
        protocol: protocol?,
        src_port,
        dst_port,
        icmp,
    })
}

/// Decodes a dump reply; `None` for anything that is not a complete entry.
fn entry_of(message: NetfilterMessage) -> Option<CtEntry> {
    let family = match u8::from(message.header.family) {
        2 => Family::V4,
        10 => Family::V6,
        _ => return None,
    };
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = message.inner else {
        return None;
    };
    let (mut original, mut reply, mut raw_original) = (None, None, Vec::new());
    let (mut zone, mut id, mut status, mut mark, mut timeout, mut tcp_state) =
        (None, None, 0, None, None, None);
    let (mut count_orig, mut count_reply) = (None, None);
    for attr in attrs {
        match attr {
            ConntrackAttribute::CtaTupleOrig(parts) => {
                original = tuple_of(&parts);
                raw_original = parts;
            }
            ConntrackAttribute::CtaTupleReply(parts) => reply = tuple_of(&parts),
            ConntrackAttribute::CtaStatus(s) => status = s.bits(),
            ConntrackAttribute::CtaMark(m) => mark = Some(m),
            ConntrackAttribute::CtaTimeout(t) => timeout = Some(t),
            ConntrackAttribute::CtaProtoInfo(infos) => {
                for info in infos {
                    if let ProtoInfo::TCP(tcp) = info {
                        for t in tcp {
                            if let ProtoInfoTCP::State(s) = t {
                                tcp_state = Some(s);
                            }
                        }
                    }
                }
            }
            // The counters arrive nested (with NLA_F_NESTED on current kernels).
            ConntrackAttribute::Other(nla) => match nla.kind() & !NLA_F_NESTED {
                CTA_ZONE => zone = be16(&value_of(&nla)),
                CTA_ID => id = be32(&value_of(&nla)),
                CTA_COUNTERS_ORIG => count_orig = count_of(&value_of(&nla)),
                CTA_COUNTERS_REPLY => count_reply = count_of(&value_of(&nla)),
                _ => {}
            },
            _ => {}
        }
    }
    Some(CtEntry {
        family,
        original: original?,
        reply: reply?,
        zone,
        id,
        status,
        mark,
        timeout,
        tcp_state,
        counters: match (count_orig, count_reply) {
            (Some(original), Some(reply)) => Some(CtCounters { original, reply }),
            _ => None,
        },
        raw_original,
    })
}

/// Reads a `CTA_COUNTERS_*` nest: `CTA_COUNTERS_PACKETS` and `_BYTES`, big-endian u64 each
/// (the kernel sends 64-bit counters; the old 32-bit ones are not used since Linux 2.6.27).
fn count_of(nest: &[u8]) -> Option<CtCount> {
    let (mut packets, mut bytes) = (None, None);
    let mut rest = nest;
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & !NLA_F_NESTED;
        if len < 4 || len > rest.len() {
            return None;
        }
        let value = &rest[4..len];
        let v = Some(u64::from_be_bytes(value.get(..8)?.try_into().ok()?));
        match kind {
            CTA_COUNTERS_PACKETS => packets = v,
            CTA_COUNTERS_BYTES => bytes = v,
            _ => {}
        }
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    Some(CtCount {
        packets: packets?,
        bytes: bytes?,
    })
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_netfilter::conntrack::Protocol;

    use super::*;
    use crate::host::nfnetlink::split;

    fn tuple(src: &str, dst: &str, proto: u8, ports: Option<(u16, u16)>) -> Vec<Tuple> {
        let mut protos = vec![ProtoTuple::Protocol(Protocol::from(proto))];
        if let Some((s, d)) = ports {
            protos.push(ProtoTuple::SourcePort(s));
            protos.push(ProtoTuple::DestinationPort(d));
        }
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(protos),
        ]
    }

    /// `CTA_COUNTERS_PACKETS` and `_BYTES` as the kernel nests them.
    fn counters_nest(packets: u64, bytes: u64) -> Vec<u8> {
        let inner = [
            DefaultNla::new(CTA_COUNTERS_PACKETS, packets.to_be_bytes().to_vec()),
            DefaultNla::new(CTA_COUNTERS_BYTES, bytes.to_be_bytes().to_vec()),
        ];
        let mut b = vec![0; inner.as_slice().buffer_len()];
        inner.as_slice().emit(&mut b);
        b
    }

    /// Serializes a message and reads it back as the socket would.
    fn round_trip(message: NetfilterMessage) -> NetfilterMessage {
        let mut msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(message));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        match split(&buf).unwrap().remove(0).payload.unwrap() {
            NetlinkPayload::InnerMessage(m) => m,
            other => panic!("{other:?}"),
        }
    }

    fn kernel_entry(
        attrs: Vec<ConntrackAttribute>,
        family: NetfilterProtoFamily,
    ) -> NetfilterMessage {
        NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            ConntrackMessage::New(attrs),
        )
    }

    #[test]
    fn a_dumped_tcp_entry_decodes_and_deletes_by_tuple_zone_and_id() {
        let orig = tuple("10.0.0.1", "10.0.0.2", 6, Some((40000, 80)));
        let reply = tuple("10.0.0.2", "10.0.0.1", 6, Some((80, 40000)));
        let message = round_trip(kernel_entry(
            vec![
                ConntrackAttribute::CtaTupleOrig(orig.clone()),
                ConntrackAttribute::CtaTupleReply(reply),
                ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, 7u16.to_be_bytes().to_vec())),
                ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![ProtoInfoTCP::State(
                    3,
                )])]),
                ConntrackAttribute::Other(DefaultNla::new(
                    CTA_ID,
                    0xdead_beefu32.to_be_bytes().to_vec(),
                )),
                ConntrackAttribute::CtaTimeout(431_999),
                ConntrackAttribute::Other(DefaultNla::new(
                    CTA_COUNTERS_ORIG | NLA_F_NESTED,
                    counters_nest(5, 420),
                )),
                ConntrackAttribute::Other(DefaultNla::new(
                    CTA_COUNTERS_REPLY | NLA_F_NESTED,
                    counters_nest(3, 9000),
                )),
            ],
            NetfilterProtoFamily::IPv4,
        ));
        let entry = entry_of(message).unwrap();
        assert_eq!(entry.family, Family::V4);
        assert_eq!(entry.original.src_port, Some(40000));
        assert_eq!(entry.reply.src, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((entry.zone, entry.id), (Some(7), Some(0xdead_beef)));
        assert_eq!(entry.tcp_state, Some(TCP_ESTABLISHED));
        assert_eq!(entry.timeout, Some(431_999));
        assert_eq!(
            entry.counters,
            Some(CtCounters {
                original: CtCount {
                    packets: 5,
                    bytes: 420
                },
                reply: CtCount {
                    packets: 3,
                    bytes: 9000
                },
            })
        );
        assert!(entry.involves("10.0.0.1".parse().unwrap()));
        assert!(!entry.involves("10.0.0.3".parse().unwrap()));
        assert_eq!(
            entry.to_string(),
            "tcp src=10.0.0.1 dst=10.0.0.2 sport=40000 dport=80 reply tcp src=10.0.0.2 dst=10.0.0.1 sport=80 dport=40000 zone=7"
        );

        let delete = round_trip(delete_request(&entry));
        assert_eq!(u8::from(delete.header.family), 2);
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)) = delete.inner else {
            panic!("not a delete: {:?}", delete.inner)
        };
        assert_eq!(attrs[0], ConntrackAttribute::CtaTupleOrig(orig));
        let others: Vec<(u16, Vec<u8>)> = attrs[1..]
            .iter()
            .map(|a| match a {
                ConntrackAttribute::Other(n) => (n.kind(), value_of(n)),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            others,
            vec![
                (CTA_ZONE, vec![0, 7]),
                (CTA_ID, vec![0xde, 0xad, 0xbe, 0xef])
            ]
        );
    }

    #[test]
    fn icmp_keys_survive_and_are_sent_back() {
        let mut orig = tuple("fd00::1", "fd00::2", 58, None);
        if let Tuple::Proto(p) = &mut orig[1] {
            p.push(ProtoTuple::Other(DefaultNla::new(
                CTA_PROTO_ICMPV6_ID,
                0x1234u16.to_be_bytes().to_vec(),
            )));
            p.push(ProtoTuple::Other(DefaultNla::new(
                CTA_PROTO_ICMPV6_TYPE,
                vec![128],
            )));
            p.push(ProtoTuple::Other(DefaultNla::new(
                CTA_PROTO_ICMPV6_CODE,
                vec![0],
            )));
        }
        let entry = entry_of(round_trip(kernel_entry(
            vec![
                ConntrackAttribute::CtaTupleOrig(orig.clone()),
                ConntrackAttribute::CtaTupleReply(tuple("fd00::2", "fd00::1", 58, None)),
            ],
            NetfilterProtoFamily::IPv6,
        )))
        .unwrap();
        assert_eq!(entry.family, Family::V6);
        assert_eq!(
            entry.original.icmp,
            Some(IcmpKey {
                kind: 128,
                code: 0,
                id: 0x1234
            })
        );
        assert_eq!(entry.zone, None);
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)) =
            round_trip(delete_request(&entry)).inner
        else {
            panic!()
        };
        assert_eq!(attrs, vec![ConntrackAttribute::CtaTupleOrig(orig)]);
    }

    #[test]
    fn incomplete_entries_are_skipped() {
        // No reply tuple.
        assert!(entry_of(kernel_entry(
            vec![ConntrackAttribute::CtaTupleOrig(tuple(
                "10.0.0.1",
                "10.0.0.2",
                17,
                Some((1, 2))
            ))],
            NetfilterProtoFamily::IPv4
        ))
        .is_none());
        // An unknown family.
        assert!(entry_of(kernel_entry(vec![], NetfilterProtoFamily::Bridge)).is_none());
    }

    #[test]
    fn a_filtered_dump_request_carries_one_address_and_a_nested_filter() {
        let addr: IpAddr = "10.1.2.3".parse().unwrap();
        let mut msg = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(dump_request(
                Some(Family::V4),
                Some((AddrFilter::ReplySrc, addr)),
            )),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        // nlmsghdr (16) + nfgenmsg (4), then CTA_TUPLE_REPLY (2) nested, ..., CTA_FILTER.
        assert_eq!(buf[16], 2, "nfgen_family AF_INET");
        let attrs = &buf[20..];
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        assert_eq!(kind & !NLA_F_NESTED, 2, "CTA_TUPLE_REPLY first");
        let first_len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let filter = &attrs[(first_len + 3) & !3..];
        let kind = u16::from_ne_bytes([filter[2], filter[3]]);
        assert_eq!(
            kind,
            CTA_FILTER | NLA_F_NESTED,
            "the kernel parses CTA_FILTER strictly"
        );
        // ORIG flags 0, REPLY flags = IP_SRC.
        assert_eq!(&filter[8..12], &0u32.to_ne_bytes());
        assert_eq!(&filter[16..20], &CTA_FILTER_F_IP_SRC.to_ne_bytes());
        assert!(buf.windows(4).any(|w| w == [10, 1, 2, 3]));
    }
}
