//! Two network namespaces joined by a veth, "node" and "peer", for tests and benchmarks that
//! send real packets through netfilter; and the probes they send (TCP SYN, UDP, a crafted
//! SCTP INIT, ICMP/ICMPv6 echo) from raw or ordinary sockets opened in a namespace.
//!
//! The namespaces come from `common::NetNs` (named `npa-test-<pid>-...`, deleted on drop,
//! panics included).

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::common::{in_netns, NetNs};

// The e2e runner's crafted SCTP INIT; its unit test module is unused in benchmarks.
#[allow(unused_imports)]
#[path = "../../e2e/src/sctp.rs"]
pub mod sctp;

pub const NODE4: &str = "10.213.0.1";
pub const PEER4: &str = "10.213.0.2";
pub const NODE6: &str = "fd00:213::1";
pub const PEER6: &str = "fd00:213::2";
/// The node's end of the veth.
pub const NODE_IF: &str = "peer0";

pub struct Pair {
    pub node: NetNs,
    pub peer: NetNs,
}

impl Pair {
    pub fn new(tag: &str) -> Pair {
        let node = NetNs::new(&format!("{tag}-node"));
        let peer = NetNs::new(&format!("{tag}-peer"));
        node.sh_ok(&format!(
            "ip link add {NODE_IF} type veth peer name eth0 netns {peer} && \
             ip addr add {NODE4}/24 dev {NODE_IF} && ip -6 addr add {NODE6}/64 dev {NODE_IF} nodad && \
             ip link set {NODE_IF} up",
            peer = peer.name
        ));
        peer.sh_ok(&format!(
            "ip addr add {PEER4}/24 dev eth0 && ip -6 addr add {PEER6}/64 dev eth0 nodad && \
             ip link set eth0 up"
        ));
        Pair { node, peer }
    }

    /// Loads `rules` (restore input for the filter table) with `tool` (`iptables-legacy`,
    /// `ip6tables-nft`, ...) in the node namespace.
    pub fn restore(&self, tool: &str, rules: &str) {
        let escaped = rules.replace('\'', "'\\''");
        self.node
            .sh_ok(&format!("printf '%s' '{escaped}' | {tool}-restore -w"));
    }
}

pub fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A non-blocking TCP connect from the peer: the SYN leaves at once. The socket is returned
/// so the caller decides how long the attempt lives.
pub fn tcp_syn(peer: &NetNs, dst: SocketAddr) -> Socket {
    in_netns(&peer.name, || {
        let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP)).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&dst.into());
        s
    })
}

pub fn udp(peer: &NetNs, dst: SocketAddr, payload: &[u8]) {
    in_netns(&peer.name, || {
        let s = Socket::new(Domain::for_address(dst), Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.send_to(payload, &dst.into()).unwrap();
    })
}

/// An SCTP INIT from `src_port` to `dst`, sent from a raw socket (this kernel has no SCTP
/// sockets); the kernel adds the IP header.
pub fn sctp_init(peer: &NetNs, dst: SocketAddr, src_port: u16, tag: u32) {
    let packet = sctp::init_packet(src_port, dst.port(), tag);
    raw_send(peer, dst.ip(), 132, &packet);
}

/// An ICMP (IPv4) or ICMPv6 echo request.
pub fn echo(peer: &NetNs, dst: IpAddr, id: u16) {
    let mut packet = vec![0u8; 16];
    match dst {
        IpAddr::V4(_) => {
            packet[0] = 8;
            packet[4..6].copy_from_slice(&id.to_be_bytes());
            let sum = inet_checksum(&packet);
            packet[2..4].copy_from_slice(&sum.to_be_bytes());
            raw_send(peer, dst, 1, &packet);
        }
        IpAddr::V6(_) => {
            // The kernel fills in the ICMPv6 checksum of raw ICMPv6 sockets.
            packet[0] = 128;
            packet[4..6].copy_from_slice(&id.to_be_bytes());
            raw_send(peer, dst, 58, &packet);
        }
    }
}

fn inet_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn raw_send(ns: &NetNs, dst: IpAddr, protocol: i32, payload: &[u8]) {
    in_netns(&ns.name, || {
        let domain = Domain::for_address(SocketAddr::new(dst, 0));
        let s = Socket::new(domain, Type::RAW, Some(Protocol::from(protocol))).unwrap();
        s.send_to(payload, &SockAddr::from(SocketAddr::new(dst, 0)))
            .unwrap();
    })
}

/// Polls `f` until it returns `Some` or the timeout passes.
#[allow(unused_imports)]
pub use crate::common::poll as wait_for;
