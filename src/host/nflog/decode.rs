//! Decodes the start of a logged packet (the L3 payload NFLOG copies, usually cut to a snap
//! length) into the flow it belongs to: addresses, upper-layer protocol, and ports or ICMP
//! type and code. Pure: bytes in, a [`Flow`] or a [`DecodeError`] out.
//!
//! Hand-written rather than taken from a packet crate: the job is forty lines of bounds-checked
//! offsets, and the crates that parse IP (`etherparse`, `pnet_packet`) either want the whole
//! packet (ours is cut at the snap length, so their length checks reject it) or bring far more
//! than one flow key needs.
//!
//! Guarantees: never panics and never reads past the slice, whatever the bytes (a property test
//! feeds it random input). A packet whose addresses are present always decodes; what is
//! missing past them is said in [`L4`] rather than failing the packet, because a log line with
//! addresses and no port still tells the operator most of what happened:
//! - a non-first fragment has no transport header ([`L4::LaterFragment`]);
//! - a transport header cut off by the snap length or a short packet is [`L4::Truncated`];
//! - IPv6 extension headers (hop-by-hop, routing, fragment, destination options, AH,
//!   mobility, HIP, shim6) are walked, at most [`MAX_EXTENSION_HEADERS`] of them; ESP, "no next
//!   header" and unknown protocols end the walk ([`L4::Other`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol numbers this decoder knows.
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_DCCP: u8 = 33;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_SCTP: u8 = 132;
pub const IPPROTO_UDPLITE: u8 = 136;

/// More extension headers than this is not a packet any stack sends; the walk stops with an
/// error rather than trusting it.
pub const MAX_EXTENSION_HEADERS: usize = 16;

/// The flow a logged packet belongs to, as a log line and a deduplication key need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The upper-layer protocol (after IPv6 extension headers).
    pub protocol: u8,
    pub l4: L4,
}

/// What the packet says past the IP header(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4 {
    /// TCP, UDP, UDP-Lite, SCTP and DCCP: they all start with the two ports.
    Ports { src: u16, dst: u16 },
    /// ICMP for IPv4, ICMPv6 for IPv6.
    Icmp { kind: u8, code: u8 },
    /// A fragment other than the first: the transport header is in the first one.
    LaterFragment,
    /// The protocol has ports or a type, but the bytes stop before them.
    Truncated,
    /// A protocol without ports we know of (GRE, ESP, IPIP, ...).
    Other,
}

impl Flow {
    pub fn src_port(&self) -> Option<u16> {
        match self.l4 {
            L4::Ports { src, .. } => Some(src),
            _ => None,
        }
    }

    pub fn dst_port(&self) -> Option<u16> {
        match self.l4 {
            L4::Ports { dst, .. } => Some(dst),
            _ => None,
        }
    }

    /// The protocol's usual name (`tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, ...), or its number.
    pub fn protocol_name(&self) -> String {
        protocol_name(self.protocol)
    }
}

pub fn protocol_name(protocol: u8) -> String {
    match protocol {
        IPPROTO_ICMP => "icmp".into(),
        IPPROTO_TCP => "tcp".into(),
        IPPROTO_UDP => "udp".into(),
        IPPROTO_DCCP => "dccp".into(),
        IPPROTO_ICMPV6 => "icmpv6".into(),
        IPPROTO_SCTP => "sctp".into(),
        IPPROTO_UDPLITE => "udplite".into(),
        other => other.to_string(),
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = self.protocol_name();
        match self.l4 {
            L4::Ports { src, dst } => {
                write!(
                    f,
                    "{proto} {} -> {}",
                    sock(self.src, src),
                    sock(self.dst, dst)
                )
            }
            L4::Icmp { kind, code } => {
                write!(
                    f,
                    "{proto} {} -> {} type {kind} code {code}",
                    self.src, self.dst
                )
            }
            L4::LaterFragment => write!(f, "{proto} {} -> {} (fragment)", self.src, self.dst),
            L4::Truncated => write!(f, "{proto} {} -> {} (truncated)", self.src, self.dst),
            L4::Other => write!(f, "{proto} {} -> {}", self.src, self.dst),
        }
    }
}

fn sock(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Why a payload is not a packet we can name a flow for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    /// The version nibble is neither 4 nor 6.
    UnknownVersion(u8),
    /// The netfilter family said one IP version and the packet another.
    FamilyMismatch {
        family: u8,
        version: u8,
    },
    /// Fewer bytes than the fixed header needs.
    ShortHeader {
        version: u8,
        need: usize,
        have: usize,
    },
    /// IPv4 header length field below 20 bytes.
    BadHeaderLength(usize),
    TooManyExtensionHeaders,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Empty => write!(f, "the logged packet has no bytes"),
            DecodeError::UnknownVersion(v) => {
                write!(f, "the logged packet has IP version {v}, not 4 or 6")
            }
            DecodeError::FamilyMismatch { family, version } => write!(
                f,
                "netfilter family {family} logged a packet with IP version {version}"
            ),
            DecodeError::ShortHeader {
                version,
                need,
                have,
            } => write!(
                f,
                "the logged IPv{version} packet has {have} bytes, its header needs {need}"
            ),
            DecodeError::BadHeaderLength(len) => {
                write!(f, "the logged IPv4 packet claims a {len}-byte header")
            }
            DecodeError::TooManyExtensionHeaders => write!(
                f,
                "the logged IPv6 packet has more than {MAX_EXTENSION_HEADERS} extension headers"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Netfilter family numbers (`NFPROTO_*`) as NFLOG reports them.
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

/// Decodes a packet logged by netfilter family `family` (`NFPROTO_IPV4`, `NFPROTO_IPV6`; any
/// other value, such as a bridge or netdev family, lets the version nibble decide).
pub fn decode_for_family(family: u8, packet: &[u8]) -> Result<Flow, DecodeError> {
    let version = packet.first().ok_or(DecodeError::Empty)? >> 4;
    let expected = match family {
        NFPROTO_IPV4 => Some(4),
        NFPROTO_IPV6 => Some(6),
        _ => None,
    };
    if expected.is_some_and(|v| v != version) {
        return Err(DecodeError::FamilyMismatch { family, version });
    }
    decode(packet)
}

/// Decodes a packet starting at its IP header; the version nibble says which.
pub fn decode(packet: &[u8]) -> Result<Flow, DecodeError> {
    match packet.first().ok_or(DecodeError::Empty)? >> 4 {
        4 => decode_v4(packet),
        6 => decode_v6(packet),
        v => Err(DecodeError::UnknownVersion(v)),
    }
}

fn decode_v4(p: &[u8]) -> Result<Flow, DecodeError> {
    if p.len() < 20 {
        return Err(DecodeError::ShortHeader {
            version: 4,
            need: 20,
            have: p.len(),
        });
    }
    let header_len = usize::from(p[0] & 0x0f) * 4;
    if header_len < 20 {
        return Err(DecodeError::BadHeaderLength(header_len));
    }
    let protocol = p[9];
    let src = IpAddr::V4(Ipv4Addr::new(p[12], p[13], p[14], p[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(p[16], p[17], p[18], p[19]));
    let fragment_offset = u16::from_be_bytes([p[6], p[7]]) & 0x1fff;
    let l4 = if fragment_offset != 0 {
        L4::LaterFragment
    } else {
        // Options longer than the bytes we have leave the transport header out of reach.
        transport(protocol, false, p.get(header_len..).unwrap_or(&[]))
    };
    Ok(Flow {
        src,
        dst,
        protocol,
        l4,
    })
}

fn decode_v6(p: &[u8]) -> Result<Flow, DecodeError> {
    if p.len() < 40 {
        return Err(DecodeError::ShortHeader {
            version: 6,
            need: 40,
            have: p.len(),
        });
    }
    let addr = |at: usize| {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&p[at..at + 16]);
        IpAddr::V6(Ipv6Addr::from(octets))
    };
    let (src, dst) = (addr(8), addr(24));
    let mut next = p[6];
    let mut rest = &p[40..];
    for _ in 0..=MAX_EXTENSION_HEADERS {
        let ext_len = match next {
            // Hop-by-hop, routing, destination options, mobility, HIP, shim6: 8-octet units
            // not counting the first.
            0 | 43 | 60 | 135 | 139 | 140 => rest.get(1).map(|l| (usize::from(*l) + 1) * 8),
            // AH: 4-octet units not counting the first two.
            51 => rest.get(1).map(|l| (usize::from(*l) + 2) * 4),
            44 => {
                // Fragment header: offset in the upper 13 bits of bytes 2..4.
                let Some(header) = rest.get(..8) else {
                    return Ok(Flow {
                        src,
                        dst,
                        protocol: next,
                        l4: L4::Truncated,
                    });
                };
                let offset = u16::from_be_bytes([header[2], header[3]]) >> 3;
                if offset != 0 {
                    return Ok(Flow {
                        src,
                        dst,
                        protocol: header[0],
                        l4: L4::LaterFragment,
                    });
                }
                Some(8)
            }
            upper => {
                return Ok(Flow {
                    src,
                    dst,
                    protocol: upper,
                    l4: transport(upper, true, rest),
                })
            }
        };
        // The next header's number is the first byte of every extension header.
        match (rest.first(), ext_len.and_then(|l| rest.get(l..))) {
            (Some(n), Some(after)) => {
                next = *n;
                rest = after;
            }
            _ => {
                // The extension header runs past the bytes we have: the upper-layer protocol
                // is unknown, so say which header we were in.
                return Ok(Flow {
                    src,
                    dst,
                    protocol: next,
                    l4: L4::Truncated,
                });
            }
        }
    }
    Err(DecodeError::TooManyExtensionHeaders)
}

fn transport(protocol: u8, v6: bool, t: &[u8]) -> L4 {
    match protocol {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_UDPLITE | IPPROTO_SCTP | IPPROTO_DCCP => {
            match t.get(..4) {
                Some(h) => L4::Ports {
                    src: u16::from_be_bytes([h[0], h[1]]),
                    dst: u16::from_be_bytes([h[2], h[3]]),
                },
                None => L4::Truncated,
            }
        }
        IPPROTO_ICMP if !v6 => icmp(t),
        IPPROTO_ICMPV6 if v6 => icmp(t),
        _ => L4::Other,
    }
}

fn icmp(t: &[u8]) -> L4 {
    match t.get(..2) {
        Some(h) => L4::Icmp {
            kind: h[0],
            code: h[1],
        },
        None => L4::Truncated,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An IPv4 header (no options unless `options` is non-zero 4-byte words) and `rest`.
    fn v4(protocol: u8, frag: u16, options: usize, rest: &[u8]) -> Vec<u8> {
        let ihl = 5 + options as u8;
        let mut p = vec![0x40 | ihl, 0, 0, 0, 0, 0];
        p.extend_from_slice(&frag.to_be_bytes());
        p.extend_from_slice(&[64, protocol, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend(std::iter::repeat_n(1u8, options * 4)); // NOP options
        p.extend_from_slice(rest);
        p
    }

    fn v6(next: u8, rest: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 0, next, 64];
        p.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(rest);
        p
    }

    fn ports(sport: u16, dport: u16) -> Vec<u8> {
        let mut t = sport.to_be_bytes().to_vec();
        t.extend_from_slice(&dport.to_be_bytes());
        t.extend_from_slice(&[0; 16]);
        t
    }

    #[test]
    fn ipv4_tcp_udp_sctp_ports_and_icmp() {
        for proto in [
            IPPROTO_TCP,
            IPPROTO_UDP,
            IPPROTO_SCTP,
            IPPROTO_UDPLITE,
            IPPROTO_DCCP,
        ] {
            let flow = decode(&v4(proto, 0, 0, &ports(40000, 8080))).unwrap();
            assert_eq!(flow.src, "10.0.0.1".parse::<IpAddr>().unwrap());
            assert_eq!(flow.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
            assert_eq!(flow.protocol, proto);
            assert_eq!(
                (flow.src_port(), flow.dst_port()),
                (Some(40000), Some(8080))
            );
        }
        let flow = decode(&v4(IPPROTO_ICMP, 0, 0, &[8, 0, 0, 0])).unwrap();
        assert_eq!(flow.l4, L4::Icmp { kind: 8, code: 0 });
        assert_eq!(flow.to_string(), "icmp 10.0.0.1 -> 10.0.0.2 type 8 code 0");
        // ICMPv6's number means nothing special inside IPv4.
        assert_eq!(
            decode(&v4(IPPROTO_ICMPV6, 0, 0, &[1, 2])).unwrap().l4,
            L4::Other
        );
    }

    #[test]
    fn ipv4_options_are_skipped() {
        let flow = decode(&v4(IPPROTO_TCP, 0, 3, &ports(1, 2))).unwrap();
        assert_eq!(flow.l4, L4::Ports { src: 1, dst: 2 });
        assert_eq!(flow.to_string(), "tcp 10.0.0.1:1 -> 10.0.0.2:2");
        // Options that run past the snap length leave the ports out of reach.
        let mut p = v4(IPPROTO_TCP, 0, 0, &[]);
        p[0] = 0x4f;
        assert_eq!(decode(&p).unwrap().l4, L4::Truncated);
    }

    #[test]
    fn ipv4_fragments_have_ports_only_in_the_first() {
        // More-fragments set, offset 0: the first fragment carries the ports.
        let first = decode(&v4(IPPROTO_UDP, 0x2000, 0, &ports(5, 6))).unwrap();
        assert_eq!(first.l4, L4::Ports { src: 5, dst: 6 });
        // Offset 185 (x8 bytes): the bytes after the header are payload, not ports.
        let later = decode(&v4(IPPROTO_UDP, 185, 0, &ports(5, 6))).unwrap();
        assert_eq!(later.l4, L4::LaterFragment);
        assert_eq!(later.src_port(), None);
    }

    #[test]
    fn ipv4_errors_name_the_problem() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(
            decode(&[0x45, 0, 0]),
            Err(DecodeError::ShortHeader {
                version: 4,
                need: 20,
                have: 3
            })
        );
        let mut p = v4(IPPROTO_TCP, 0, 0, &ports(1, 2));
        p[0] = 0x44;
        assert_eq!(decode(&p), Err(DecodeError::BadHeaderLength(16)));
        assert_eq!(decode(&[0x50; 40]), Err(DecodeError::UnknownVersion(5)));
        assert!(DecodeError::UnknownVersion(5)
            .to_string()
            .contains("version 5"));
    }

    #[test]
    fn family_must_match_the_version() {
        let p = v4(IPPROTO_TCP, 0, 0, &ports(1, 2));
        assert!(decode_for_family(NFPROTO_IPV4, &p).is_ok());
        assert_eq!(
            decode_for_family(NFPROTO_IPV6, &p),
            Err(DecodeError::FamilyMismatch {
                family: NFPROTO_IPV6,
                version: 4
            })
        );
        // A bridge-family log (7) lets the packet decide.
        assert!(decode_for_family(7, &p).is_ok());
    }

    #[test]
    fn ipv6_plain_and_icmpv6() {
        let flow = decode(&v6(IPPROTO_TCP, &ports(443, 50000))).unwrap();
        assert_eq!(flow.src, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(
            flow.l4,
            L4::Ports {
                src: 443,
                dst: 50000
            }
        );
        assert_eq!(flow.to_string(), "tcp [fd00::1]:443 -> [fd00::2]:50000");
        let echo = decode(&v6(IPPROTO_ICMPV6, &[128, 0, 0, 0])).unwrap();
        assert_eq!(echo.l4, L4::Icmp { kind: 128, code: 0 });
        // Protocol 1 (ICMP for IPv4) has no meaning in IPv6.
        assert_eq!(decode(&v6(IPPROTO_ICMP, &[8, 0])).unwrap().l4, L4::Other);
        assert_eq!(decode(&v6(IPPROTO_UDP, &[1, 2])).unwrap().l4, L4::Truncated);
    }

    #[test]
    fn ipv6_extension_headers_are_walked() {
        // Hop-by-hop (8 bytes) -> destination options (16 bytes) -> routing (8 bytes) -> UDP.
        let mut rest = vec![60, 0, 1, 4, 0, 0, 0, 0];
        rest.extend_from_slice(&[43, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        rest.extend_from_slice(&[IPPROTO_UDP, 0, 0, 0, 0, 0, 0, 0]);
        rest.extend_from_slice(&ports(53, 5353));
        let flow = decode(&v6(0, &rest)).unwrap();
        assert_eq!(flow.protocol, IPPROTO_UDP);
        assert_eq!(flow.l4, L4::Ports { src: 53, dst: 5353 });
        // AH counts in 4-octet units: length 4 means (4 + 2) * 4 = 24 bytes.
        let mut ah = vec![IPPROTO_TCP, 4];
        ah.extend_from_slice(&[0; 22]);
        ah.extend_from_slice(&ports(7, 8));
        assert_eq!(
            decode(&v6(51, &ah)).unwrap().l4,
            L4::Ports { src: 7, dst: 8 }
        );
    }

    #[test]
    fn ipv6_fragments() {
        // First fragment (offset 0, M set): ports follow.
        let mut first = vec![IPPROTO_SCTP, 0, 0x00, 0x01, 0, 0, 0, 1];
        first.extend_from_slice(&ports(9, 10));
        assert_eq!(
            decode(&v6(44, &first)).unwrap().l4,
            L4::Ports { src: 9, dst: 10 }
        );
        // Offset 100 (x8 bytes).
        let mut later = vec![IPPROTO_SCTP, 0];
        later.extend_from_slice(&(100u16 << 3).to_be_bytes());
        later.extend_from_slice(&[0, 0, 0, 1]);
        later.extend_from_slice(&ports(9, 10));
        let flow = decode(&v6(44, &later)).unwrap();
        assert_eq!((flow.protocol, flow.l4), (IPPROTO_SCTP, L4::LaterFragment));
        // A fragment header cut short.
        assert_eq!(decode(&v6(44, &[6, 0, 0])).unwrap().l4, L4::Truncated);
    }

    #[test]
    fn ipv6_truncated_or_endless_extension_chains() {
        // A destination-options header claiming 2048 bytes in a short packet.
        let flow = decode(&v6(60, &[IPPROTO_TCP, 255, 0, 0])).unwrap();
        assert_eq!((flow.protocol, flow.l4), (60, L4::Truncated));
        // Empty after the fixed header.
        assert_eq!(decode(&v6(0, &[])).unwrap().l4, L4::Truncated);
        // A chain of hop-by-hop headers longer than any real packet.
        let rest: Vec<u8> = std::iter::repeat_n([0u8, 0, 0, 0, 0, 0, 0, 0], 40)
            .flatten()
            .collect();
        assert_eq!(
            decode(&v6(0, &rest)),
            Err(DecodeError::TooManyExtensionHeaders)
        );
        // ESP and "no next header" end the walk.
        assert_eq!(decode(&v6(50, &[0; 8])).unwrap().l4, L4::Other);
        assert_eq!(decode(&v6(59, &[])).unwrap().l4, L4::Other);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
            let _ = decode_for_family(NFPROTO_IPV4, &bytes);
            let _ = decode_for_family(NFPROTO_IPV6, &bytes);
        }

        #[test]
        fn random_ip_looking_bytes_never_panic(
            version in prop_oneof![Just(0x40u8), Just(0x60u8)],
            low in 0u8..16,
            next in prop_oneof![Just(0u8), Just(43), Just(44), Just(51), Just(60), Just(6), Just(17), Just(58), Just(132), any::<u8>()],
            mut bytes in proptest::collection::vec(any::<u8>(), 0..160),
        ) {
            // Random input rarely has a valid version nibble or a chain of extension
            // headers; this one always starts like an IP header.
            if !bytes.is_empty() { bytes[0] = version | low; }
            if bytes.len() > 9 { bytes[if version == 0x60 { 6 } else { 9 }] = next; }
            if let Ok(flow) = decode(&bytes) {
                // Addresses come from the header we checked the length of.
                prop_assert_eq!(flow.src.is_ipv4(), version == 0x40);
            }
        }

        #[test]
        fn truncating_a_valid_packet_never_panics(cut in 0usize..80, proto in prop_oneof![Just(6u8), Just(17), Just(132), Just(1)]) {
            let p = v4(proto, 0, 0, &ports(1000, 2000));
            let cut = cut.min(p.len());
            let decoded = decode(&p[..cut]);
            if cut >= 24 && proto != 1 {
                prop_assert_eq!(decoded.unwrap().l4, L4::Ports { src: 1000, dst: 2000 });
            } else if cut < 20 {
                prop_assert!(decoded.is_err());
            }
        }
    }
}
