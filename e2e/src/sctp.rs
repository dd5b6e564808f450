//! Crafted SCTP: this kernel has no SCTP sockets, but netfilter tracks and filters SCTP, so
//! a probe sends a real INIT chunk from a raw socket and the target's raw socket reports
//! whether it arrived. The checksum is CRC32c (RFC 9260 appendix A); conntrack drops INITs
//! whose checksum is wrong, so it must be right. CRC32c covers the SCTP packet alone (no
//! pseudo-header, unlike TCP and UDP), so one packet serves IPv4 and IPv6 raw sockets alike.

/// Builds an SCTP packet (common header + one INIT chunk) for `dst_port`, carrying `tag` as
/// the initiate tag so the observer can tell this probe from any other.
pub fn init_packet(src_port: u16, dst_port: u16, tag: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes()); // verification tag: 0 in an INIT
    p.extend_from_slice(&0u32.to_be_bytes()); // checksum, filled below
    p.push(1); // chunk type INIT
    p.push(0); // flags
    p.extend_from_slice(&20u16.to_be_bytes()); // chunk length
    p.extend_from_slice(&tag.to_be_bytes()); // initiate tag (never 0)
    p.extend_from_slice(&65_535u32.to_be_bytes()); // advertised receiver window
    p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    p.extend_from_slice(&tag.to_be_bytes()); // initial TSN
                                             // The CRC is stored in the byte order the reference implementation leaves it in memory
                                             // on a little-endian machine, which is what Linux checks.
    let crc = crc32c::crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
}

/// Destination port and initiate tag of an IPv4 packet carrying an SCTP INIT, as a raw
/// socket receives it (IP header included).
pub fn parse_init(packet: &[u8]) -> Option<(u16, u32)> {
    let first = *packet.first()?;
    if first >> 4 != 4 || *packet.get(9)? != 132 {
        return None;
    }
    parse_init_chunk(packet.get(usize::from(first & 0x0f) * 4..)?)
}

/// The same for what a raw IPv6 socket receives: the SCTP packet alone (RFC 3542: raw IPv6
/// sockets never pass the IPv6 header up, and the socket's protocol already is SCTP).
pub fn parse_init_v6(packet: &[u8]) -> Option<(u16, u32)> {
    parse_init_chunk(packet)
}

fn parse_init_chunk(sctp: &[u8]) -> Option<(u16, u32)> {
    if sctp.len() < 20 || sctp[12] != 1 {
        return None;
    }
    let port = u16::from_be_bytes([sctp[2], sctp[3]]);
    let tag = u32::from_be_bytes([sctp[16], sctp[17], sctp[18], sctp[19]]);
    Some((port, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_verifies_and_the_tag_round_trips() {
        let p = init_packet(40_000, 81, 0xdead_beef);
        assert_eq!(p.len(), 32);
        // Recompute over the packet with the checksum field zeroed, as a receiver does.
        let mut zeroed = p.clone();
        zeroed[8..12].fill(0);
        assert_eq!(crc32c::crc32c(&zeroed).to_le_bytes(), p[8..12]);
        let mut ip = vec![
            0x45, 0, 0, 52, 0, 0, 0, 0, 64, 132, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip.extend_from_slice(&p);
        assert_eq!(parse_init(&ip), Some((81, 0xdead_beef)));
        ip[9] = 6;
        assert_eq!(parse_init(&ip), None);
        // IPv6: the same packet without any IP header; too short or not an INIT is nothing.
        assert_eq!(parse_init_v6(&p), Some((81, 0xdead_beef)));
        assert_eq!(parse_init_v6(&p[..19]), None);
        let mut not_init = p.clone();
        not_init[12] = 2;
        assert_eq!(parse_init_v6(&not_init), None);
    }
}
