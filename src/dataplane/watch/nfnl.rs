//! The ipset and nf_tables side of netfilter netlink for the change watchers: message
//! types, request payloads built as bytes, and walking the attributes of a message with
//! netlink-packet-core's bounds-checked buffers. The socket and the message walk are
//! [`crate::host::nfnetlink`]'s, the one netfilter netlink client.
//!
//! Attributes are walked here rather than decoded into a crate's message types because what
//! the watchers need is two or three attributes per message (a table and chain name, a set
//! name and a few counters): netlink-packet-netfilter decodes every expression of a rule and
//! every element of a set, some 50 times the CPU of the walk per event on the captured events
//! (`benches/change_detect.rs`: ~6 µs against ~0.1 µs), for each of kube-proxy's commits;
//! an attribute it cannot parse anywhere in a rule fails the whole event; and it has no ipset
//! messages.

use netlink_packet_core::NlasIterator;

pub(crate) use crate::host::nfnetlink::{NfnlSocket, RawMessage as Msg};

use super::Malformed;

pub(crate) const NFNL_SUBSYS_IPSET: u8 = 6;
pub(crate) const NFNL_SUBSYS_NFTABLES: u8 = 10;
/// The nf_tables multicast group (`NFNLGRP_NFTABLES`).
pub(crate) const NFNLGRP_NFTABLES: u32 = 7;
/// `struct nfgenmsg`: family, version, resource id (big endian).
pub(crate) const NFGENMSG_LEN: usize = 4;

/// The `nfgenmsg` header of a message.
pub(crate) trait NfGen<'a> {
    /// The `nfgenmsg` family and the attributes after it.
    fn nfgen(&self, what: &'static str) -> Result<(u8, &'a [u8]), Malformed>;
}

impl<'a> NfGen<'a> for Msg<'a> {
    fn nfgen(&self, what: &'static str) -> Result<(u8, &'a [u8]), Malformed> {
        if self.payload.len() < NFGENMSG_LEN {
            return Err(Malformed::new(
                what,
                format!("{} bytes, shorter than nfgenmsg", self.payload.len()),
            ));
        }
        Ok((self.payload[0], &self.payload[NFGENMSG_LEN..]))
    }
}

/// The messages of one datagram, in order; stops at the first malformed one.
pub(crate) fn messages(data: &[u8]) -> impl Iterator<Item = Result<Msg<'_>, Malformed>> {
    crate::host::nfnetlink::raw_messages(data)
        .map(|m| m.map_err(|e| Malformed::new("netlink message", e.to_string())))
}

/// The attributes of `data` as `(type without flags, value)`; stops at the first malformed one.
pub(crate) fn attrs(data: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Malformed>> {
    NlasIterator::new(data).map(|nla| {
        let nla = nla.map_err(|e| Malformed::new("netlink attribute", e.to_string()))?;
        let (kind, len) = (nla.kind(), nla.length() as usize);
        // new_checked made sure 4 <= len <= the buffer's length.
        let value = nla.into_inner().get(4..len).unwrap_or_default();
        Ok((kind, value))
    })
}

/// A NUL-terminated (or not) string attribute.
pub(crate) fn attr_str<'a>(what: &'static str, value: &'a [u8]) -> Result<&'a str, Malformed> {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    std::str::from_utf8(&value[..end])
        .map_err(|e| Malformed::new(what, format!("name is not UTF-8: {e}")))
}

/// A big-endian u32 attribute (ipset and nf_tables send numbers in network order).
pub(crate) fn attr_be32(what: &'static str, value: &[u8]) -> Result<u32, Malformed> {
    let bytes: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Malformed::new(what, format!("{} bytes for a u32", value.len())))?;
    Ok(u32::from_be_bytes(bytes))
}

/// An nfgenmsg header for a request: family, version 0, resource id 0.
pub(crate) fn nfgenmsg(family: u8) -> [u8; NFGENMSG_LEN] {
    [family, 0, 0, 0]
}

/// Appends one attribute (4-byte aligned) to `out`.
pub(crate) fn push_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + ((4 - len % 4) % 4), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_and_reject_truncation() {
        let mut out = Vec::new();
        push_attr(&mut out, 2, b"filter\0");
        push_attr(&mut out, 0x4000 | 5, &42u32.to_be_bytes());
        let got: Vec<_> = attrs(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 2);
        assert_eq!(attr_str("t", got[0].1).unwrap(), "filter");
        assert_eq!(got[1].0, 5, "flags are masked off the type");
        assert_eq!(attr_be32("t", got[1].1).unwrap(), 42);
        assert!(attr_be32("t", &[1, 2]).is_err());
        assert!(attr_str("t", &[0xff, 0xfe]).is_err());
        // An attribute claiming more bytes than there are.
        let mut bad = out.clone();
        bad[0] = 60;
        assert!(attrs(&bad).next().unwrap().is_err());
        assert!(attrs(&out[..3]).next().unwrap().is_err());
    }
}
