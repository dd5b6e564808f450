//! IP sets: what changed, asked over netlink (`NFNL_SUBSYS_IPSET`), no process.
//!
//! - Headers ([`IpsetWatch::check`]): one dump of `IPSET_CMD_LIST` with the header-only flag
//!   (`IPSET_FLAG_LIST_HEADER`, what `ipset list -terse` asks) returns, per set, its name,
//!   type, revision and family and the type's header data: hash size, `maxelem` (or `size` for
//!   bitmap and list types), the memory it uses and the number of entries. `ipset del` moves
//!   the entry count and usually the memory size, `ipset flush` both, `ipset destroy` removes
//!   the set. A member swapped for another (one `del` and one `add`) can leave every header
//!   field as it was: headers miss it.
//!
//!   The dump is the kernel's work, not ours: for every hash set, `mtype_head` counts the entries
//!   (`mtype_ext_size`) by walking every bucket and every member, to leave expired ones out.
//!   Measured on 6.18 (`benches/idle.rs --wide`): about 2 µs per set, 2 ns per bucket (our sets
//!   then had 1024; `rules::sets::fitted_hashsize` now fits them) and 45 ns per member, ~5 ms of
//!   CPU for 554 sets with 61k members. The kernel closes the reply's datagram after each set, so
//!   the dump is one read per set (`host::nfnetlink` reads the next without a poll first): two
//!   thirds of a dump's kernel time on the 2-core machine (2.5–3.4 of 4–5 ms) is that per-set
//!   round trip, not the walk. `IPSET_CMD_HEADER` walks nothing but returns only the name, type
//!   and family, and a names-only listing (`IPSET_FLAG_LIST_SETNAME`) skips the header: neither
//!   sees a member removed. How often the dump runs is the sentinel's choice.
//!
//!   The number of references (iptables rules and `list:set` members naming the set) is left
//!   out: it says nothing about the set's contents, and on the legacy backend it moves for a
//!   moment whenever anyone replaces the `filter` table (the new table takes a reference on
//!   every set its rules name before the old one lets go), so kube-proxy's every write could
//!   read as a change of all our sets. Rules that name our sets are the iptables watch's.
//! - Membership ([`IpsetWatch::contains`]): one `IPSET_CMD_TEST`, what `ipset test` asks, for
//!   readers outside the agent (the scale bench's event → enforced probe) that poll a set
//!   every millisecond, where a process per read would cost more than the latency measured.
//! - Member digests ([`IpsetWatch::verify`]): one `IPSET_CMD_LIST` dump per set of ours with
//!   the members, each member hashed from its attributes (timeouts and packet/byte counters
//!   left out) and the hashes added up, so the digest does not depend on the order the
//!   kernel lists them in. This is the exact check, a full read without `ipset save`.
//!
//! The number of entries (`IPSET_ATTR_ELEMENTS`, the "Number of entries" line of `ipset
//! list`) came with Linux 4.10 (public reports show it missing on 4.9 kernels and present on
//! 4.13); where it is missing the field is `None` and the memory size carries the check
//! alone. Protocol 6 requests work on kernels that speak only protocol 6 (4.9) and
//! on those that speak 6 and 7.
//!
//! Messages are encoded and walked by hand with netlink-packet-core's attribute buffers (see
//! `nfnl`): no maintained crate has ipset's netlink messages (the `ipset` crate binds the C
//! libipset, which the writer already chose not to depend on, see `dataplane::ipsets`), and we
//! need a few attributes of one request and one reply type. Requests say protocol 6
//! (`IPSET_PROTOCOL_MIN`), which every kernel since 3.0 accepts for listing.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLM_F_ACK, NLM_F_DUMP};

use super::nfnl::{self, attr_be32, attr_str, attrs, NfGen as _, NfnlSocket, NFNL_SUBSYS_IPSET};
use super::{Finding, Interest, Malformed};

const IPSET_CMD_LIST: u8 = 7;
const IPSET_CMD_TEST: u8 = 11;
const PROTOCOL: u8 = 6;
/// nfgenmsg family of ipset requests (libipset sends `AF_INET` whatever the set's family).
const REQUEST_FAMILY: u8 = 2;

// Command-level attributes.
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_TYPENAME: u16 = 3;
const ATTR_REVISION: u16 = 4;
const ATTR_FAMILY: u16 = 5;
const ATTR_FLAGS: u16 = 6;
const ATTR_DATA: u16 = 7;
const ATTR_ADT: u16 = 8;
// Inside ATTR_DATA of a test: the address, nested, as IPv4 or IPv6 in network order.
const ATTR_IP: u16 = 1;
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;
// Header data (inside ATTR_DATA of a listing).
const ATTR_HASHSIZE: u16 = 18;
const ATTR_MAXELEM: u16 = 19;
const ATTR_SIZE: u16 = 23;
const ATTR_ELEMENTS: u16 = 24;
const ATTR_MEMSIZE: u16 = 26;
// Member attributes that change without anybody writing.
const ATTR_TIMEOUT: u16 = 6;
const ATTR_BYTES: u16 = 24;
const ATTR_PACKETS: u16 = 25;

const FLAG_LIST_HEADER: u32 = 1 << 2;
/// `IPSET_ERR_PRIVATE`: ipset's own error codes start here.
const ERR_PRIVATE: i32 = 4096;
const ERR_PROTOCOL: i32 = 4097;
/// `IPSET_ERR_EXIST`: a test's answer for an address that is not in the set.
const ERR_EXIST: i32 = 4103;

/// One set's header as the kernel lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetHeader {
    pub type_name: String,
    pub revision: u8,
    /// `NFPROTO_IPV4` (2), `NFPROTO_IPV6` (10), or 0 for types without one.
    pub family: u8,
    pub hashsize: Option<u32>,
    pub maxelem: Option<u32>,
    /// Bitmap and list types' size.
    pub size: Option<u32>,
    /// Number of entries (kernel 4.10 and later).
    pub elements: Option<u32>,
    pub memsize: Option<u32>,
}

/// Every set's header by name.
pub type HeaderMap = BTreeMap<String, SetHeader>;

/// A digest of one set's members that does not depend on their order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberDigest {
    pub members: u64,
    pub sum: u64,
}

/// One message of a listing: the set it is about, its header (in the first message of a
/// set), and its members' `IPSET_ATTR_ADT` (when members were asked for).
#[derive(Debug, PartialEq, Eq)]
pub struct ListPart<'a> {
    pub name: String,
    pub header: Option<SetHeader>,
    pub adt: Option<&'a [u8]>,
}

/// Decodes one message of an `IPSET_CMD_LIST` reply (`msg_type` as in the netlink header).
pub fn decode_list_message(msg_type: u16, payload: &[u8]) -> Result<ListPart<'_>, Malformed> {
    const WHAT: &str = "ipset list reply";
    let msg = nfnl::Msg {
        msg_type,
        flags: 0,
        seq: 0,
        payload,
    };
    if msg.nfnl_type() != (NFNL_SUBSYS_IPSET, IPSET_CMD_LIST) {
        return Err(Malformed::new(
            WHAT,
            format!("message type {msg_type:#06x} is not an ipset listing"),
        ));
    }
    let (_, body) = msg.nfgen(WHAT)?;
    let mut name = None;
    let mut header = SetHeader::default();
    let mut has_header = false;
    let mut data = None;
    let mut adt = None;
    for attr in attrs(body) {
        let (ty, value) = attr?;
        match ty {
            ATTR_SETNAME => name = Some(attr_str(WHAT, value)?.to_string()),
            ATTR_TYPENAME => {
                header.type_name = attr_str(WHAT, value)?.to_string();
                has_header = true;
            }
            ATTR_REVISION => header.revision = first_byte(value)?,
            ATTR_FAMILY => header.family = first_byte(value)?,
            ATTR_DATA => data = Some(value),
            ATTR_ADT => adt = Some(value),
            _ => {}
        }
    }
    let name = name.ok_or_else(|| Malformed::new(WHAT, "a message without a set name"))?;
    if let Some(data) = data {
        for attr in attrs(data) {
            let (ty, value) = attr?;
            let slot = match ty {
                ATTR_HASHSIZE => &mut header.hashsize,
                ATTR_MAXELEM => &mut header.maxelem,
                ATTR_SIZE => &mut header.size,
                ATTR_ELEMENTS => &mut header.elements,
                ATTR_MEMSIZE => &mut header.memsize,
                _ => continue,
            };
            *slot = Some(attr_be32(WHAT, value)?);
        }
    }
    Ok(ListPart {
        name,
        header: has_header.then_some(header),
        adt,
    })
}

fn first_byte(value: &[u8]) -> Result<u8, Malformed> {
    value
        .first()
        .copied()
        .ok_or_else(|| Malformed::new("ipset list reply", "an empty one-byte attribute"))
}

/// Adds the members of one `IPSET_ATTR_ADT` to `digest`.
pub fn digest_members(adt: &[u8], digest: &mut MemberDigest) -> Result<(), Malformed> {
    for member in attrs(adt) {
        let (ty, value) = member?;
        if ty != ATTR_DATA {
            continue;
        }
        let mut h = DefaultHasher::new();
        for attr in attrs(value) {
            let (ty, value) = attr?;
            if matches!(ty, ATTR_TIMEOUT | ATTR_BYTES | ATTR_PACKETS) {
                continue;
            }
            h.write_u16(ty);
            h.write(value);
        }
        digest.members += 1;
        digest.sum = digest.sum.wrapping_add(h.finish());
    }
    Ok(())
}

fn list_request(name: Option<&str>, header_only: bool) -> Result<Vec<u8>, io::Error> {
    let mut out = nfnl::nfgenmsg(REQUEST_FAMILY).to_vec();
    nfnl::push_attr(&mut out, ATTR_PROTOCOL, &[PROTOCOL]);
    if let Some(name) = name {
        if name.is_empty() || name.len() >= 32 || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("set name {name:?} must have 1 to 31 bytes"),
            ));
        }
        let mut value = name.as_bytes().to_vec();
        value.push(0);
        nfnl::push_attr(&mut out, ATTR_SETNAME, &value);
    }
    if header_only {
        nfnl::push_attr(
            &mut out,
            ATTR_FLAGS | NLA_F_NET_BYTEORDER,
            &FLAG_LIST_HEADER.to_be_bytes(),
        );
    }
    Ok(out)
}

/// An `IPSET_CMD_TEST` of `addr` in set `name`.
fn test_request(name: &str, addr: IpAddr) -> Result<Vec<u8>, io::Error> {
    let mut out = list_request(Some(name), false)?;
    let mut ip = Vec::new();
    match addr {
        IpAddr::V4(a) => {
            nfnl::push_attr(&mut ip, ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &a.octets())
        }
        IpAddr::V6(a) => {
            nfnl::push_attr(&mut ip, ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &a.octets())
        }
    }
    let mut data = Vec::new();
    nfnl::push_attr(&mut data, ATTR_IP | NLA_F_NESTED, &ip);
    nfnl::push_attr(&mut out, ATTR_DATA | NLA_F_NESTED, &data);
    Ok(out)
}

/// ipset's own error codes, named.
fn ipset_error(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(ERR_PROTOCOL) => {
            io::Error::other("the kernel's ipset does not speak protocol 6 (IPSET_ERR_PROTOCOL)")
        }
        Some(code) if code >= ERR_PRIVATE => io::Error::other(format!(
            "the kernel's ipset refused the listing (error {code})"
        )),
        _ => e,
    }
}

/// Reads IP set headers and member digests in the calling thread's network namespace, and
/// compares them with a fingerprint.
pub struct IpsetWatch {
    socket: NfnlSocket,
    interest: Interest,
    headers_request: Vec<u8>,
    /// Every set's header at the last look; `None` before the first.
    headers: Option<HeaderMap>,
    /// Our sets' member digests at the last `baseline` or `verify`.
    members: Option<BTreeMap<String, MemberDigest>>,
    /// `members` may be missing a write of our own (a read after it failed): `verify` then
    /// cannot tell our writes from others' and answers `Unknown`.
    members_stale: bool,
}

impl IpsetWatch {
    pub fn open(interest: Interest) -> io::Result<IpsetWatch> {
        Ok(IpsetWatch {
            socket: NfnlSocket::open()?,
            interest,
            headers_request: list_request(None, true)?,
            headers: None,
            members: None,
            members_stale: false,
        })
    }

    /// Every set's header (ours and others'): one dump.
    pub fn headers(&mut self) -> io::Result<HeaderMap> {
        let mut out = HeaderMap::new();
        let ty = (u16::from(NFNL_SUBSYS_IPSET) << 8) | u16::from(IPSET_CMD_LIST);
        self.socket
            .exchange(ty, NLM_F_DUMP, &self.headers_request, |msg| {
                let part = decode_list_message(msg.msg_type, msg.payload)?;
                if let Some(h) = part.header {
                    out.insert(part.name, h);
                }
                Ok(())
            })
            .map_err(ipset_error)?;
        Ok(out)
    }

    /// The member digest of one set; `None` when it does not exist.
    pub fn member_digest(&mut self, name: &str) -> io::Result<Option<MemberDigest>> {
        let request = list_request(Some(name), false)?;
        let ty = (u16::from(NFNL_SUBSYS_IPSET) << 8) | u16::from(IPSET_CMD_LIST);
        let mut digest = MemberDigest::default();
        let result = self.socket.exchange(ty, NLM_F_DUMP, &request, |msg| {
            let part = decode_list_message(msg.msg_type, msg.payload)?;
            if part.name != name {
                return Err(Malformed::new(
                    "ipset list reply",
                    format!("asked for set {name}, got {}", part.name),
                )
                .into());
            }
            if let Some(adt) = part.adt {
                digest_members(adt, &mut digest)?;
            }
            Ok(())
        });
        match result {
            Ok(()) => Ok(Some(digest)),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(None),
            Err(e) => Err(ipset_error(e)),
        }
    }

    /// Whether `addr` is in set `name`, as a packet from it would match (a network member
    /// that covers it counts). A set that does not exist is an error (`NotFound`); an
    /// address of the other family than the set's is not in it (the kernel answers every
    /// test it cannot match so).
    pub fn contains(&mut self, name: &str, addr: IpAddr) -> io::Result<bool> {
        let request = test_request(name, addr)?;
        let ty = (u16::from(NFNL_SUBSYS_IPSET) << 8) | u16::from(IPSET_CMD_TEST);
        // A test that finds the address answers with an acknowledgement only.
        match self.socket.exchange(ty, NLM_F_ACK, &request, |_| Ok(())) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(ERR_EXIST) => Ok(false),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no set {name}"),
            )),
            Err(e) => Err(ipset_error(e)),
        }
    }

    fn our_names(&self, headers: &HeaderMap) -> BTreeSet<String> {
        headers
            .keys()
            .filter(|name| self.interest.set_is_ours(name))
            .cloned()
            .collect()
    }

    fn read_members(
        &mut self,
        names: &BTreeSet<String>,
    ) -> io::Result<BTreeMap<String, MemberDigest>> {
        let mut out = BTreeMap::new();
        for name in names {
            if let Some(d) = self.member_digest(name)? {
                out.insert(name.clone(), d);
            }
        }
        Ok(out)
    }

    /// Takes the fingerprint later checks compare with (every set's header, our sets' member
    /// digests): after a full read, and after each write of our own.
    pub fn baseline(&mut self) -> io::Result<()> {
        let headers = self.headers()?;
        let names = self.our_names(&headers);
        self.members = Some(self.read_members(&names)?);
        self.headers = Some(headers);
        self.members_stale = false;
        Ok(())
    }

    /// After a write of our own: one header dump becomes the reference for `check`, and the
    /// member digests of the sets written (`written`: names; a set no longer there is
    /// dropped) are read again, so `verify` keeps comparing exactly. The cost follows the
    /// write's size, not the node's: a busy cluster writes a few sets every few seconds,
    /// and re-fingerprinting all 60k members after each write (or re-reading every set at
    /// the next verify, as when the digests were simply marked stale) would cost more than
    /// the writes. Before the first fingerprint this takes the full one.
    pub fn rebase_after_write(&mut self, written: &BTreeSet<String>) -> io::Result<()> {
        if self.members.is_none() || self.members_stale {
            return self.baseline();
        }
        let headers = self.headers()?;
        // A failed read leaves the digests unknown (`verify` then answers `Unknown`) rather
        // than half updated.
        self.members_stale = true;
        for name in written {
            if !self.interest.set_is_ours(name) {
                continue;
            }
            let digest = self.member_digest(name)?;
            let members = self.members.get_or_insert_with(BTreeMap::new);
            match digest {
                Some(d) => members.insert(name.clone(), d),
                None => members.remove(name),
            };
        }
        self.members_stale = false;
        self.headers = Some(headers);
        Ok(())
    }

    /// The cheap check: one header dump. `Ours` names our sets whose header changed, that
    /// appeared or that disappeared; a change in other programs' sets only is `Foreign`.
    /// Blind to a member swapped for another; see [`verify`](IpsetWatch::verify).
    pub fn check(&mut self) -> io::Result<Finding> {
        let now = self.headers()?;
        let Some(seen) = self.headers.as_ref() else {
            self.headers = Some(now);
            return Ok(Finding::Unknown("no fingerprint taken yet".into()));
        };
        let changed = changed_keys(seen, &now);
        self.headers = Some(now);
        Ok(self.interest.classify_sets(&changed))
    }

    /// The exact check: every header and the member digest of each of our sets (one dump per
    /// set). Takes the new fingerprint.
    pub fn verify(&mut self) -> io::Result<Finding> {
        let headers = self.headers()?;
        let names = self.our_names(&headers);
        let members = self.read_members(&names)?;
        let stale = std::mem::replace(&mut self.members_stale, false);
        let (Some(seen_headers), Some(seen_members)) = (
            self.headers.replace(headers.clone()),
            self.members.replace(members.clone()),
        ) else {
            return Ok(Finding::Unknown("no fingerprint taken yet".into()));
        };
        if stale {
            return Ok(Finding::Unknown(
                "our own writes since the last full fingerprint".into(),
            ));
        }
        let mut changed = changed_keys(&seen_headers, &headers);
        changed.extend(changed_keys(&seen_members, &members));
        Ok(self.interest.classify_sets(&changed))
    }

    /// Every set's header at the last look.
    pub fn fingerprint(&self) -> Option<&HeaderMap> {
        self.headers.as_ref()
    }
}

/// Keys whose values differ, or that are in only one of the maps.
fn changed_keys<V: PartialEq>(
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(b.keys().filter(|k| !a.contains_key(*k)).cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a 6.18 kernel in a test namespace (see the file's comment).
    mod captured {
        include!("testdata/ipset_list.rs");
    }

    fn parts(data: &[u8]) -> Vec<ListPart<'_>> {
        nfnl::messages(data)
            .map(|m| m.unwrap())
            .filter(|m| m.msg_type != netlink_packet_core::NLMSG_DONE)
            .map(|m| decode_list_message(m.msg_type, m.payload).unwrap())
            .collect()
    }

    #[test]
    fn captured_header_listing_decodes() {
        let parts = parts(captured::HEADERS);
        let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["cali40s:net", "cali40n:port", "KUBE-X"]);
        let net = parts[0].header.as_ref().unwrap();
        assert_eq!(net.type_name, "hash:net");
        assert_eq!(net.family, 2);
        assert_eq!(net.maxelem, Some(1_048_576));
        assert_eq!(net.elements, Some(3));
        assert!(net.memsize.is_some_and(|m| m > 0));
        let port = parts[1].header.as_ref().unwrap();
        assert_eq!(port.type_name, "hash:ip,port");
        assert_eq!(port.elements, Some(2));
        assert!(
            parts.iter().all(|p| p.adt.is_none()),
            "header-only has no members"
        );
    }

    #[test]
    fn captured_member_listing_digests_independently_of_order() {
        let parts = parts(captured::MEMBERS_NET);
        assert_eq!(parts[0].name, "cali40s:net");
        let mut d = MemberDigest::default();
        for p in &parts {
            if let Some(adt) = p.adt {
                digest_members(adt, &mut d).unwrap();
            }
        }
        assert_eq!(d.members, 3);
        // The same members listed in another order (each DATA container moved) digest the same.
        let adt = parts[0].adt.unwrap();
        let members: Vec<&[u8]> = {
            let mut v = Vec::new();
            let mut pos = 0;
            while pos < adt.len() {
                let len = u16::from_ne_bytes([adt[pos], adt[pos + 1]]) as usize;
                let end = (pos + ((len + 3) & !3)).min(adt.len());
                v.push(&adt[pos..end]);
                pos = end;
            }
            v
        };
        let reversed: Vec<u8> = members
            .iter()
            .rev()
            .flat_map(|m| m.iter().copied())
            .collect();
        let mut r = MemberDigest::default();
        digest_members(&reversed, &mut r).unwrap();
        assert_eq!(r, d);
        // One member swapped for another (10.0.0.2 for 10.0.0.9): the sum moves, the count
        // does not.
        let mut changed = adt.to_vec();
        let at = changed
            .windows(4)
            .position(|w| w == [10, 0, 0, 2])
            .expect("10.0.0.2 is listed");
        changed[at + 3] = 9;
        let mut c = MemberDigest::default();
        digest_members(&changed, &mut c).unwrap();
        assert_eq!(c.members, 3);
        assert_ne!(c.sum, d.sum);
    }

    #[test]
    fn truncated_and_garbage_listings_are_errors_not_panics() {
        for data in [captured::HEADERS, captured::MEMBERS_NET] {
            for m in nfnl::messages(data).map(|m| m.unwrap()) {
                if m.msg_type == netlink_packet_core::NLMSG_DONE {
                    continue;
                }
                for cut in 0..m.payload.len() {
                    if let Ok(p) = decode_list_message(m.msg_type, &m.payload[..cut]) {
                        if let Some(adt) = p.adt {
                            let _ = digest_members(adt, &mut MemberDigest::default());
                        }
                    }
                }
                let mut garbage = m.payload.to_vec();
                for (k, b) in garbage.iter_mut().enumerate().skip(4) {
                    *b ^= (k as u8).wrapping_mul(29) | 1;
                }
                let _ = decode_list_message(m.msg_type, &garbage);
                assert!(decode_list_message(m.msg_type, &m.payload[..2]).is_err());
            }
        }
        assert!(decode_list_message(0x0a06, &[2, 0, 0, 0]).is_err());
    }

    #[test]
    fn requests_carry_protocol_name_and_flags() {
        let r = list_request(Some("cali40s:x"), true).unwrap();
        assert_eq!(&r[..4], &[2, 0, 0, 0]);
        let got: Vec<(u16, Vec<u8>)> = attrs(&r[4..])
            .map(|a| a.map(|(t, v)| (t, v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got[0], (ATTR_PROTOCOL, vec![6]));
        assert_eq!(got[1], (ATTR_SETNAME, b"cali40s:x\0".to_vec()));
        assert_eq!(got[2], (ATTR_FLAGS, vec![0, 0, 0, 4]));
        assert!(list_request(Some(&"x".repeat(32)), false).is_err());
        assert!(list_request(Some(""), false).is_err());
    }

    #[test]
    fn test_requests_nest_the_address_in_network_order() {
        let r = test_request("cali40s:x", "10.1.2.3".parse().unwrap()).unwrap();
        let got: Vec<(u16, Vec<u8>)> = attrs(&r[4..])
            .map(|a| a.map(|(t, v)| (t, v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got[1], (ATTR_SETNAME, b"cali40s:x\0".to_vec()));
        // attrs() strips the flags: the nesting is read back by walking the value.
        assert_eq!(got[2].0, ATTR_DATA);
        let (kind, ip) = attrs(&got[2].1).next().unwrap().unwrap();
        assert_eq!(kind, ATTR_IP);
        let (kind, addr) = attrs(ip).next().unwrap().unwrap();
        assert_eq!((kind, addr), (ATTR_IPADDR_IPV4, &[10, 1, 2, 3][..]));
        // The flags are on the wire: the kernel refuses a test without them.
        let flags = |at: usize| u16::from_ne_bytes([r[at + 2], r[at + 3]]);
        // DATA is last: 4 bytes of its header, 4 of IP's, 4 of the address's, 4 of address.
        let data_at = r.len() - 16;
        assert_eq!(flags(data_at), ATTR_DATA | NLA_F_NESTED);
        assert_eq!(flags(data_at + 4), ATTR_IP | NLA_F_NESTED);
        assert_eq!(flags(data_at + 8), ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER);
        let v6 = test_request("cali60s:x", "fd00::1".parse().unwrap()).unwrap();
        assert_eq!(v6.len(), r.len() + 12);
        assert!(test_request("", "10.0.0.1".parse().unwrap()).is_err());
    }

    #[test]
    fn changed_keys_sees_changes_additions_and_removals() {
        let a: BTreeMap<String, u32> = [("x".into(), 1), ("y".into(), 2)].into();
        let b: BTreeMap<String, u32> = [("x".into(), 1), ("y".into(), 3), ("z".into(), 0)].into();
        let want: BTreeSet<String> = ["y".into(), "z".into()].into();
        assert_eq!(changed_keys(&a, &b), want);
        assert_eq!(changed_keys(&b, &a), want);
        assert!(changed_keys(&a, &a).is_empty());
    }
}
