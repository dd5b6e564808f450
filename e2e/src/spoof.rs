//! The spoofing check (`--check-spoofing`): after a step's probes, every pod sends packets
//! whose source is another pod's address, one whose real packets the destination allows, to
//! every other pod, over each probed protocol and family, and no such packet may arrive.
//!
//! Packets are written whole (IP header included: `IPPROTO_RAW` sockets, which take the
//! header from the caller in both families) in the sender's namespace, so the kernel sends
//! them with the forged source as they are. At the destination, raw TCP and UDP observers
//! (and the SCTP observer every pod has) see a copy of every packet that reaches the pod,
//! before any socket would. Each forged packet carries a tag unique in the process: a TCP
//! SYN's sequence number (with a window no real probe uses), a UDP payload, an SCTP INIT's
//! initiate tag. An observer that sees a tag records it.
//!
//! So that "nothing arrived" cannot come from a broken sender, every forged packet of an
//! allowed pair has a control: the same packet with the sender's own address, which must
//! arrive. Both go out in one burst; the check then waits until every control was seen (or
//! the timeout) and a little longer for stragglers.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netpol_agent::model::IpFamily;
use socket2::{Domain, Protocol as SockProtocol, Socket, Type};

use crate::cluster::Cluster;
use crate::family::family_name;
use crate::netns::in_netns;
use crate::scenario::{PortKey, Protocol, Step};
use crate::tags::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, TAG_WINDOW, UDP_MAGIC};

/// After the last control arrived, how long a forged packet still may.
const STRAGGLERS: Duration = Duration::from_millis(200);

/// One packet to send from a pod.
struct Send {
    from: String,
    netns: Arc<File>,
    src: IpAddr,
    dst: IpAddr,
    key: PortKey,
    tag: u32,
    /// What it stands for, for the report.
    what: String,
}

/// What a step's spoofing check found.
pub struct Checked {
    pub forged: usize,
    pub controls: usize,
    pub problems: Vec<String>,
}

/// Sends every forged packet and its controls for `step`, waits, and reports forged packets
/// that arrived and controls that did not.
pub fn check(cluster: &Cluster, step: &Step, families: &[IpFamily], timeout: Duration) -> Checked {
    let mut forged = Vec::new();
    let mut controls = Vec::new();
    let names: Vec<&String> = cluster.pods.keys().collect();
    for &family in families {
        for (key, table) in &step.expect {
            for &to in &names {
                // The pod whose address the forgers take: the first the destination allows.
                let Some(&posing) = names
                    .iter()
                    .find(|&&n| n != to && table.get(n, to) == Some(true))
                else {
                    continue;
                };
                let dst = cluster.pods[to].pod.addr(family);
                for &from in &names {
                    if from == to || from == posing {
                        continue;
                    }
                    let net = &cluster.pods[from];
                    forged.push(Send {
                        from: from.clone(),
                        netns: net.handle.clone(),
                        src: cluster.pods[posing].pod.addr(family),
                        dst,
                        key: *key,
                        tag: crate::probe::nonce(),
                        what: format!(
                            "{} {}/{} {from} -> {to} posing as {posing}",
                            family_name(family),
                            key.protocol.as_str(),
                            key.port
                        ),
                    });
                    if table.get(from, to) == Some(true) {
                        controls.push(Send {
                            from: from.clone(),
                            netns: net.handle.clone(),
                            src: net.pod.addr(family),
                            dst,
                            key: *key,
                            tag: crate::probe::nonce(),
                            what: format!(
                                "{} {}/{} {from} -> {to} (control, its own address)",
                                family_name(family),
                                key.protocol.as_str(),
                                key.port
                            ),
                        });
                    }
                }
            }
        }
    }
    let mut problems = Vec::new();
    let mut all: Vec<&Send> = forged.iter().chain(&controls).collect();
    all.sort_by(|a, b| a.from.cmp(&b.from));
    for chunk in all.chunk_by(|a, b| a.from == b.from) {
        let sent = in_netns(&chunk[0].netns, || {
            chunk
                .iter()
                .filter_map(|s| send(s).err().map(|e| format!("{}: not sent: {e}", s.what)))
                .collect::<Vec<_>>()
        });
        match sent {
            Ok(errors) => problems.extend(errors),
            Err(e) => problems.push(format!(
                "{}: cannot enter its namespace: {e:#}",
                chunk[0].from
            )),
        }
    }
    let seen = |s: &Send| match s.key.protocol {
        Protocol::Sctp => cluster.sctp.seen_tag(s.tag),
        Protocol::Tcp | Protocol::Udp => cluster.spoof_tags.seen(s.tag),
    };
    // SCTP tags land in the SCTP log, which has no wait for a set: poll both.
    let control_tags: BTreeSet<u32> = controls
        .iter()
        .filter(|s| s.key.protocol != Protocol::Sctp)
        .map(|s| s.tag)
        .collect();
    let deadline = Instant::now() + timeout;
    cluster.spoof_tags.wait_all(&control_tags, deadline);
    while controls.iter().any(|s| !seen(s)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(STRAGGLERS);
    for s in &controls {
        if !seen(s) {
            problems.push(format!(
                "{}: did not arrive, so the check cannot see",
                s.what
            ));
        }
    }
    for s in &forged {
        if seen(s) {
            problems.push(format!("{}: ARRIVED (source {} forged)", s.what, s.src));
        }
    }
    Checked {
        forged: forged.len(),
        controls: controls.len(),
        problems,
    }
}

/// Source ports of the forged packets and their controls: `SPOOF_PORTS_START` + tag modulo
/// `SPOOF_PORTS`, above the probes' range (`probe::SOURCE_PORTS`, the kernel's default
/// ephemeral range). A control is allowed, so it leaves a conntrack entry at both nodes
/// (unreplied: 30 s for UDP, 120 s for a TCP SYN); a probe that later took the same source
/// port for the same flow would ride on it, be no new connection, and so be in no flow
/// record (seen once in a clean-clone run: a UDP probe missing from both nodes' records).
pub(crate) const SPOOF_PORTS_START: u16 = 61_000;
pub(crate) const SPOOF_PORTS: u32 = 4_000;

fn send(s: &Send) -> std::io::Result<()> {
    let family = IpFamily::of(&s.dst);
    let domain = match family {
        IpFamily::V4 => Domain::IPV4,
        IpFamily::V6 => Domain::IPV6,
    };
    // IPPROTO_RAW: the packet carries its own IP header (IPv4's IP_HDRINCL is implied; an
    // IPv6 raw socket of this protocol takes the header too).
    let socket = Socket::new(domain, Type::RAW, Some(SockProtocol::from(255)))?;
    let sport = SPOOF_PORTS_START + (s.tag % SPOOF_PORTS) as u16;
    let packet = packet(s.src, s.dst, s.key, sport, s.tag);
    socket.send_to(&packet, &SocketAddr::new(s.dst, 0).into())?;
    Ok(())
}

/// The whole packet: IP header and a tagged TCP SYN, UDP datagram or SCTP INIT.
pub fn packet(src: IpAddr, dst: IpAddr, key: PortKey, sport: u16, tag: u32) -> Vec<u8> {
    let (proto, mut l4) = match key.protocol {
        Protocol::Tcp => {
            let mut t = Vec::with_capacity(20);
            t.extend_from_slice(&sport.to_be_bytes());
            t.extend_from_slice(&key.port.to_be_bytes());
            t.extend_from_slice(&tag.to_be_bytes()); // sequence number
            t.extend_from_slice(&0u32.to_be_bytes()); // acknowledgement
            t.push(5 << 4); // data offset: 5 words
            t.push(0x02); // SYN
            t.extend_from_slice(&TAG_WINDOW.to_be_bytes());
            t.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
            (IPPROTO_TCP, t)
        }
        Protocol::Udp => {
            let payload = [UDP_MAGIC, tag.to_string().as_bytes()].concat();
            let len = u16::try_from(8 + payload.len()).expect("short");
            let mut u = Vec::with_capacity(usize::from(len));
            u.extend_from_slice(&sport.to_be_bytes());
            u.extend_from_slice(&key.port.to_be_bytes());
            u.extend_from_slice(&len.to_be_bytes());
            u.extend_from_slice(&[0, 0]);
            u.extend_from_slice(&payload);
            (IPPROTO_UDP, u)
        }
        Protocol::Sctp => (IPPROTO_SCTP, crate::sctp::init_packet(sport, key.port, tag)),
    };
    let checksum_at = match proto {
        IPPROTO_TCP => Some(16),
        IPPROTO_UDP => Some(6),
        _ => None, // SCTP carries its CRC32c already
    };
    if let Some(at) = checksum_at {
        let sum = transport_checksum(src, dst, proto, &l4);
        l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    }
    let len = l4.len();
    let mut out = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = u16::try_from(20 + len).expect("short");
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&total.to_be_bytes());
            h.extend_from_slice(&[0, 0, 0x40, 0]); // id, don't fragment
            h.extend_from_slice(&[64, proto, 0, 0]); // ttl, protocol, checksum
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let sum = ones_complement(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            h
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut h = vec![0x60, 0, 0, 0];
            h.extend_from_slice(&u16::try_from(len).expect("short").to_be_bytes());
            h.extend_from_slice(&[proto, 64]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            h
        }
        _ => unreachable!("source and destination of one family"),
    };
    out.extend_from_slice(&l4);
    out
}

fn transport_checksum(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + l4.len());
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, proto]);
            pseudo.extend_from_slice(&u16::try_from(l4.len()).expect("short").to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&u32::try_from(l4.len()).expect("short").to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => unreachable!("source and destination of one family"),
    }
    pseudo.extend_from_slice(l4);
    match ones_complement(&pseudo) {
        // UDP sends an all-zero sum as all ones (zero means "none", forbidden over IPv6).
        0 if proto == IPPROTO_UDP => 0xffff,
        sum => sum,
    }
}

/// The Internet checksum (RFC 1071).
fn ones_complement(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tags::tag_of;

    #[test]
    fn tags_read_back_from_what_observers_receive() {
        for (src, dst) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let (src, dst): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let family = IpFamily::of(&dst);
            for (protocol, number) in [(Protocol::Tcp, IPPROTO_TCP), (Protocol::Udp, IPPROTO_UDP)] {
                let key = PortKey { protocol, port: 80 };
                let p = packet(src, dst, key, 40_001, 123_456);
                // IPv6 raw sockets receive the payload only.
                let received = match family {
                    IpFamily::V4 => &p[..],
                    IpFamily::V6 => &p[40..],
                };
                assert_eq!(tag_of(received, family, number), Some(123_456));
                // The whole packet checks out: the transport sum over the pseudo-header is 0.
                let l4 = &p[if family == IpFamily::V4 { 20 } else { 40 }..];
                let mut pseudo_check = l4.to_vec();
                let at = if number == IPPROTO_TCP { 16 } else { 6 };
                let sum = u16::from_be_bytes([l4[at], l4[at + 1]]);
                pseudo_check[at..at + 2].copy_from_slice(&[0, 0]);
                assert_eq!(transport_checksum(src, dst, number, &pseudo_check), sum);
            }
        }
        // A real probe's SYN (another window) or a probe's UDP nonce is no tag.
        let mut syn = packet(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            PortKey {
                protocol: Protocol::Tcp,
                port: 80,
            },
            1,
            7,
        );
        syn[20 + 14] = 0xfa;
        assert_eq!(tag_of(&syn, IpFamily::V4, IPPROTO_TCP), None);
        let mut udp = vec![0x45; 20];
        udp.extend_from_slice(&[0, 1, 0, 80, 0, 14, 0, 0]);
        udp.extend_from_slice(b"123456");
        assert_eq!(tag_of(&udp, IpFamily::V4, IPPROTO_UDP), None);
    }

    #[test]
    fn spoofed_source_ports_never_meet_a_probe_port() {
        let spoof = u32::from(SPOOF_PORTS_START)..u32::from(SPOOF_PORTS_START) + SPOOF_PORTS;
        let probes = crate::probe::SOURCE_PORTS;
        assert!(
            spoof.start > u32::from(*probes.end()),
            "{spoof:?} vs {probes:?}"
        );
        assert!(spoof.end <= 65_536);
    }

    #[test]
    fn ipv4_header_checksum_is_valid() {
        let p = packet(
            "10.244.1.10".parse().unwrap(),
            "10.244.2.20".parse().unwrap(),
            PortKey {
                protocol: Protocol::Udp,
                port: 81,
            },
            40_000,
            9,
        );
        assert_eq!(ones_complement(&p[..20]), 0);
    }
}
