//! A small synchronous rtnetlink client over `netlink-sys` and `netlink-packet-route`: dumps
//! (links, routes, neighbours and FDB), acknowledged requests, and a monitor socket
//! subscribed to link, route or neighbour events. It works in
//! the network namespace of the thread that opens the socket (the agent runs in the node's).
//!
//! Only what the routes and bridge interface-naming schemes and the preflight checks need is decoded
//! into our own small types ([`Link`], [`RouteEntry`]); everything else is left to the
//! crates' message types.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::libc;

/// Multicast groups (the `RTNLGRP_*` numbers, not the legacy `RTMGRP_*` bit masks).
pub const RTNLGRP_LINK: u32 = libc::RTNLGRP_LINK;
pub const RTNLGRP_IPV4_ROUTE: u32 = libc::RTNLGRP_IPV4_ROUTE;
pub const RTNLGRP_IPV6_ROUTE: u32 = libc::RTNLGRP_IPV6_ROUTE;
/// Neighbour events, FDB entries of bridges included.
pub const RTNLGRP_NEIGH: u32 = libc::RTNLGRP_NEIGH;

/// The main routing table (`RT_TABLE_MAIN`).
pub const RT_TABLE_MAIN: u32 = 254;

/// How long a dump may take before it is given up on.
const DUMP_TIMEOUT: Duration = Duration::from_secs(10);
/// A dump the kernel marks inconsistent (`NLM_F_DUMP_INTR`: the tables changed while it
/// ran) is repeated up to this many times.
const DUMP_ATTEMPTS: usize = 5;
/// Receive buffer of the monitor socket: a burst of route events (a node draining, a
/// routing daemon reloading) must not overrun it. An overrun is survived by a full re-read.
const MONITOR_RCVBUF: usize = 8 << 20;

/// One network interface, as far as we care.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, `openvswitch`, `ipvlan`, ...); `None` for
    /// physical devices and others that have no rtnl link ops.
    pub kind: Option<String>,
    /// `IFLA_MASTER`: the bridge, bond or Open vSwitch datapath this link is a port of.
    pub master: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

/// Decodes a link message. `None` when it carries no name (never the case for the kernel's
/// `RTM_NEWLINK`; a bare `RTM_DELLINK` still gets its index through [`link_index`]).
pub fn parse_link(msg: &LinkMessage) -> Option<Link> {
    let mut name = None;
    let mut kind = None;
    let mut master = None;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Controller(m) if *m != 0 => master = Some(*m),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    if let LinkInfo::Kind(k) = info {
                        kind = Some(kind_name(k));
                    }
                }
            }
            _ => {}
        }
    }
    Some(Link {
        index: msg.header.index,
        name: name?,
        kind,
        master,
        up: msg.header.flags.contains(LinkFlags::Up),
    })
}

pub fn link_index(msg: &LinkMessage) -> u32 {
    msg.header.index
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Other(s) => s.clone(),
        k => k.to_string(),
    }
}

/// A route whose destination is one address (`/32`, `/128`), identified as the kernel
/// identifies it (destination, table, metric, TOS), with the interface it sends to when it
/// is a plain device route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub key: RouteKey,
    /// The output interface when the route delivers straight to a device: type unicast, no
    /// gateway, no multipath, not a cached clone. `None` for anything else with the same key
    /// (a blackhole, a route via a gateway towards another node, ...), which must replace an
    /// earlier usable entry rather than be ignored.
    pub oif: Option<u32>,
}

/// What identifies a route in the kernel's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub dst: IpAddr,
    /// From `RTA_TABLE`: table ids above 255 (hybridnet's 39999) do not fit the header byte.
    pub table: u32,
    pub metric: u32,
    pub tos: u8,
}

/// Decodes a route message when its destination is a single address; `None` for every other
/// route (prefixes, defaults, source-specific routes, cached clones, other families).
pub fn parse_host_route(msg: &RouteMessage) -> Option<RouteEntry> {
    let header = &msg.header;
    let host_len = match header.address_family {
        AddressFamily::Inet => 32,
        AddressFamily::Inet6 => 128,
        _ => return None,
    };
    if header.destination_prefix_length != host_len
        || header.source_prefix_length != 0
        || header.flags.contains(RouteFlags::Cloned)
    {
        return None;
    }
    let mut dst = None;
    let mut table = u32::from(header.table);
    let mut metric = 0;
    let mut oif = None;
    let mut via_gateway = false;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some(IpAddr::V4(*a)),
            RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = Some(IpAddr::V6(*a)),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(_) | RouteAttribute::Via(_) | RouteAttribute::MultiPath(_) => {
                via_gateway = true
            }
            _ => {}
        }
    }
    let usable = header.kind == RouteType::Unicast && !via_gateway;
    Some(RouteEntry {
        key: RouteKey {
            dst: dst?,
            table,
            metric,
            tos: header.tos,
        },
        oif: if usable { oif } else { None },
    })
}

/// The namespace's own addresses in an address dump, without those of the interface
/// `exclude`: per address message its `IFA_LOCAL` when it has one, else its `IFA_ADDRESS`.
/// On a point-to-point interface `IFA_ADDRESS` is the *peer's* address (`ip addr add
/// 10.0.0.1 peer 10.0.0.2`); only `IFA_LOCAL` is this host's. Elsewhere the two are equal
/// (IPv4) or only `IFA_ADDRESS` is sent (IPv6 without a peer).
pub fn local_addresses(replies: &[RouteNetlinkMessage], exclude: Option<u32>) -> BTreeSet<IpAddr> {
    let mut out = BTreeSet::new();
    for r in replies {
        let RouteNetlinkMessage::NewAddress(a) = r else {
            continue;
        };
        if Some(a.header.index) == exclude {
            continue;
        }
        let local = a.attributes.iter().find_map(|attr| match attr {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = a.attributes.iter().find_map(|attr| match attr {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        out.extend(local.or(address));
    }
    out
}

/// Dumps the namespace's addresses and keeps its own ([`local_addresses`]).
pub fn read_local_addresses(exclude: Option<u32>) -> io::Result<BTreeSet<IpAddr>> {
    let mut socket = RtnlSocket::open()?;
    let replies = socket.dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
    Ok(local_addresses(&replies, exclude))
}

/// A route-netlink socket.
pub struct RtnlSocket {
    socket: Socket,
    seq: u32,
}

impl std::fmt::Debug for RtnlSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtnlSocket").finish_non_exhaustive()
    }
}

impl RtnlSocket {
    /// A socket for requests (dumps), in the calling thread's network namespace.
    pub fn open() -> io::Result<RtnlSocket> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(RtnlSocket { socket, seq: 0 })
    }

    /// A non-blocking socket that receives the events of `groups` (`RTNLGRP_*`).
    pub fn monitor(groups: &[u32]) -> io::Result<RtnlSocket> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        // Too small a buffer only costs a re-read after an overrun; a refusal is no error.
        let _ = socket.set_rx_buf_sz(MONITOR_RCVBUF);
        socket.bind_auto()?;
        for group in groups {
            socket.add_membership(*group)?;
        }
        socket.set_non_blocking(true)?;
        Ok(RtnlSocket { socket, seq: 0 })
    }

    /// Every link of this namespace.
    pub fn dump_links(&mut self) -> io::Result<Vec<LinkMessage>> {
        let messages = self.dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
        Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link),
                _ => None,
            })
            .collect())
    }

    /// Every route of one family in every routing table: the request leaves the table
    /// unspecified (header byte 0, no `RTA_TABLE`), which makes the kernel walk all tables,
    /// not only main.
    pub fn dump_routes(&mut self, family: AddressFamily) -> io::Result<Vec<RouteMessage>> {
        let mut request = RouteMessage::default();
        request.header.address_family = family;
        let messages = self.dump(RouteNetlinkMessage::GetRoute(request))?;
        Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(route) => Some(route),
                _ => None,
            })
            .collect())
    }

    /// Any dump (links, routes, neighbours, FDB), repeated while the kernel reports it as
    /// interrupted by concurrent changes.
    pub fn dump(&mut self, request: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
        for _ in 0..DUMP_ATTEMPTS {
            match self.dump_once(request.clone())? {
                Some(messages) => return Ok(messages),
                None => continue,
            }
        }
        Err(io::Error::other(format!(
            "the kernel reported every one of {DUMP_ATTEMPTS} dumps as interrupted by concurrent \
             changes"
        )))
    }

    /// Sends one request with `NLM_F_REQUEST | NLM_F_ACK | flags` and waits for the kernel's
    /// acknowledgement (or its error).
    pub fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        let seq = self.send(message, NLM_F_REQUEST | NLM_F_ACK | flags)?;
        loop {
            if !self.wait_readable(DUMP_TIMEOUT)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not acknowledge a netlink request in time",
                ));
            }
            let (data, _) = self.socket.recv_from_full()?;
            for message in split_messages(&data)? {
                if message.header.sequence_number != seq {
                    continue;
                }
                if let NetlinkPayload::Error(e) = message.payload {
                    return match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    };
                }
            }
        }
    }

    fn send(&mut self, message: RouteNetlinkMessage, flags: u16) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// `None` when the kernel flagged the dump as interrupted.
    fn dump_once(
        &mut self,
        request: RouteNetlinkMessage,
    ) -> io::Result<Option<Vec<RouteNetlinkMessage>>> {
        let seq = self.send(request, NLM_F_REQUEST | NLM_F_DUMP)?;

        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            if !self.wait_readable(DUMP_TIMEOUT)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not finish a netlink dump in time",
                ));
            }
            let (data, _) = self.socket.recv_from_full()?;
            for message in split_messages(&data)? {
                if message.header.sequence_number != seq {
                    // A reply to an earlier request that was given up on.
                    continue;
                }
                if message.header.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                match message.payload {
                    NetlinkPayload::Done(_) => {
                        return Ok(if interrupted { None } else { Some(out) })
                    }
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    _ => {}
                }
            }
        }
    }

    /// For polling the socket together with other descriptors.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// Waits until the socket has something to read; `false` on timeout.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        super::poll::readable(self.socket.as_fd(), timeout)
    }

    /// Reads whatever the monitor socket holds now, without blocking: `Ok(Some(messages))`
    /// for one datagram, `Ok(None)` when nothing is pending. An overrun (events were lost) is
    /// `Err` with `ENOBUFS`, see [`is_overrun`].
    pub fn recv_events(&mut self) -> io::Result<Option<Vec<RouteNetlinkMessage>>> {
        let data = match self.socket.recv_from_full() {
            Ok((data, _)) => data,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(Some(Vec::new())),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for message in split_messages(&data)? {
            if let NetlinkPayload::InnerMessage(inner) = message.payload {
                out.push(inner);
            }
        }
        Ok(Some(out))
    }
}

/// Whether a receive error means the kernel dropped events because our buffer was full.
pub fn is_overrun(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOBUFS)
}

/// Splits one datagram into its netlink messages. A message the crates cannot decode is
/// skipped with a warning rather than failing the rest.
pub fn split_messages(data: &[u8]) -> io::Result<Vec<NetlinkMessage<RouteNetlinkMessage>>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + 16 <= data.len() {
        let len = u32::from_ne_bytes([
            data[offset],
            data[offset + 1],
            data[offset + 2],
            data[offset + 3],
        ]) as usize;
        if len < 16 || offset + len > data.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("malformed netlink message: length {len} at offset {offset}"),
            ));
        }
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..offset + len]) {
            Ok(message) => out.push(message),
            Err(e) => tracing::warn!(error = %e, "skipping a netlink message that does not decode"),
        }
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        offset += (len + 3) & !3;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use netlink_packet_route::route::RouteHeader;

    use super::*;

    fn route(
        family: AddressFamily,
        dst: IpAddr,
        len: u8,
        kind: RouteType,
        attrs: Vec<RouteAttribute>,
    ) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header = RouteHeader {
            address_family: family,
            destination_prefix_length: len,
            table: 252,
            kind,
            ..Default::default()
        };
        msg.attributes.push(RouteAttribute::Destination(dst.into()));
        msg.attributes.extend(attrs);
        msg
    }

    #[test]
    fn host_route_reads_the_table_from_rta_table() {
        let msg = route(
            AddressFamily::Inet,
            IpAddr::V4(Ipv4Addr::new(172, 24, 0, 4)),
            32,
            RouteType::Unicast,
            vec![RouteAttribute::Table(39999), RouteAttribute::Oif(7)],
        );
        let entry = parse_host_route(&msg).unwrap();
        assert_eq!(entry.key.table, 39999);
        assert_eq!(entry.oif, Some(7));
    }

    #[test]
    fn prefixes_and_gateway_routes_are_not_pod_routes() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(
            parse_host_route(&route(
                AddressFamily::Inet,
                v4,
                24,
                RouteType::Unicast,
                vec![RouteAttribute::Oif(3)]
            )),
            None
        );
        let via = parse_host_route(&route(
            AddressFamily::Inet,
            v4,
            32,
            RouteType::Unicast,
            vec![
                RouteAttribute::Oif(3),
                RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(192, 168, 0, 2))),
            ],
        ))
        .unwrap();
        assert_eq!(
            via.oif, None,
            "a route via another node names no pod interface"
        );
        let local = parse_host_route(&route(
            AddressFamily::Inet6,
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            128,
            RouteType::Local,
            vec![RouteAttribute::Oif(1)],
        ))
        .unwrap();
        assert_eq!(local.oif, None);
        let v6 = parse_host_route(&route(
            AddressFamily::Inet6,
            IpAddr::V6("fd00::5".parse().unwrap()),
            128,
            RouteType::Unicast,
            vec![RouteAttribute::Oif(9), RouteAttribute::Priority(1024)],
        ))
        .unwrap();
        assert_eq!((v6.oif, v6.key.metric, v6.key.table), (Some(9), 1024, 252));
    }

    #[test]
    fn split_rejects_a_truncated_message() {
        let mut data = vec![0u8; 20];
        data[..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(split_messages(&data).is_err());
        assert!(split_messages(&[]).unwrap().is_empty());
    }
}
