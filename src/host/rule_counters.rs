//! The kernel's packet and byte counters of the filter table's rules, read in-process, with no
//! `iptables-save -c` child: for each rule of a chain whose name starts with a given prefix,
//! its chain, its first comment (our rules' `cali:<hash>`) and its counters.
//!
//! - legacy (`ip_tables`/`ip6_tables`): one `IPT_SO_GET_INFO` and one `IPT_SO_GET_ENTRIES`
//!   getsockopt on a raw socket (`IP6T_` for IPv6), which copy the whole table with every
//!   rule's counters, summed over CPUs, as the legacy tools read it. Parsed by hand: these are
//!   fixed C structs (`ipt_entry`, `xt_entry_match`, `xt_entry_target`) that no maintained
//!   crate binds, and the walk needs three offsets per entry.
//! - nf_tables (`iptables-nft`): one `NFT_MSG_GETRULE` dump of table `filter` in the family
//!   over nfnetlink (our [`crate::host::nfnetlink`] socket; the request built with
//!   `netlink-packet-netfilter`'s types). Every rule iptables-nft makes carries a `counter`
//!   expression; its comments are `xt` `comment` matches (iptables 1.8.9; later versions may
//!   keep the first one in the rule's user data, which is read too). The replies are walked with
//!   `netlink-packet-core`'s zero-copy attribute iterator rather than decoded into the crate's
//!   owned types: at 40k rules that would allocate for every expression of every rule.
//!   The kernel offers nothing cheaper for counters (no per-chain sums, and the filtered
//!   dump by chain still costs one request per chain).
//!
//! Neither read creates anything in nf_tables: the legacy read of a table that does not exist
//! fails (and is only made on nodes whose agent uses the legacy backend, since asking may load
//! `iptable_filter`); the nft dump of a missing table returns no rules.
//!
//! Guarantees: bad or truncated kernel data is an error naming what was wrong, never a panic
//! or a read past the buffer; a table that changes between the two legacy calls is retried.

use std::ffi::CStr;
use std::io;

use netlink_packet_core::{NlaBuffer, NlasIterator};
use netlink_packet_netfilter::nftables::{NfTablesMessage, RuleAttribute, RuleMessage};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use nix::libc;

use crate::host::nfnetlink::NfnlSocket;

/// Which kernel holds the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xtables {
    Legacy,
    Nft,
}

/// Which family's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// One rule's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted<'a> {
    pub chain: &'a str,
    /// The rule's first comment (empty when it has none).
    pub comment: &'a str,
    pub packets: u64,
    pub bytes: u64,
}

/// What one read went through, for the cost figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Rules in the table (all chains).
    pub rules: usize,
    /// Bytes the kernel handed over.
    pub bytes: usize,
}

/// Reads the counters of every rule in chains starting with `chain_prefix` of `table`.
pub fn read(
    xtables: Xtables,
    family: Family,
    table: &str,
    chain_prefix: &str,
    each: impl FnMut(Counted<'_>),
) -> io::Result<ReadStats> {
    match xtables {
        Xtables::Legacy => legacy::read(family, table, chain_prefix, each),
        Xtables::Nft => nft::read(family, table, chain_prefix, each),
    }
}

/// Reads the counters of the rules of the named chains only. On nf_tables this is one dump
/// per chain, filtered by the kernel (which then serializes only that chain's rules): far
/// less work than the whole table when the chains are a small part of it. Legacy iptables has
/// no such query; the whole table is copied and filtered here.
pub fn read_chains(
    xtables: Xtables,
    family: Family,
    table: &str,
    chains: &[&str],
    mut each: impl FnMut(Counted<'_>),
) -> io::Result<ReadStats> {
    match xtables {
        Xtables::Legacy => {
            let wanted: std::collections::HashSet<&str> = chains.iter().copied().collect();
            legacy::read(family, table, "", |c| {
                if wanted.contains(c.chain) {
                    each(c)
                }
            })
        }
        Xtables::Nft => nft::read_chains(family, table, chains, each),
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The C string at the start of `bytes` (up to its NUL or the end), lossily UTF-8 only when
/// it is not UTF-8 already.
fn c_str(bytes: &[u8]) -> &str {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(&bytes[..end]).unwrap_or("")
}

mod legacy {
    use super::*;

    /// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO`, and `..._GET_ENTRIES`.
    const SO_GET_INFO: libc::c_int = 64;
    const SO_GET_ENTRIES: libc::c_int = 65;
    const TABLE_NAME_LEN: usize = 32;
    /// `struct ipt_getinfo`: name[32], valid_hooks, hook_entry[5], underflow[5],
    /// num_entries, size.
    const GETINFO_LEN: usize = 84;
    const GETINFO_SIZE_AT: usize = 80;
    const GETINFO_ENTRIES_AT: usize = 76;
    const GETINFO_VALID_HOOKS_AT: usize = 32;
    const GETINFO_HOOK_ENTRY_AT: usize = 36;
    /// `struct ipt_get_entries`: name[32], size, then the entries at 8-byte alignment.
    const GET_ENTRIES_HEADER: usize = 40;
    /// `struct xt_entry_match` / `xt_entry_target` header: u16 size, name[29], revision.
    const XT_HEADER: usize = 32;
    const XT_NAME_AT: usize = 2;
    const XT_NAME_LEN: usize = 29;

    /// Where the fields of `ipt_entry` (IPv4) and `ip6t_entry` (IPv6) are.
    pub(super) struct Layout {
        target_offset_at: usize,
        next_offset_at: usize,
        packets_at: usize,
        bytes_at: usize,
        /// Size of the entry header: the matches start here.
        elems_at: usize,
    }

    pub(super) const V4: Layout = Layout {
        // struct ipt_ip is 84 bytes, then nfcache (4).
        target_offset_at: 88,
        next_offset_at: 90,
        packets_at: 96,
        bytes_at: 104,
        elems_at: 112,
    };
    const V6: Layout = Layout {
        // struct ip6t_ip6 is 136 bytes, then nfcache (4), offsets, comefrom, padding.
        target_offset_at: 140,
        next_offset_at: 142,
        packets_at: 152,
        bytes_at: 160,
        elems_at: 168,
    };

    fn u16_at(b: &[u8], at: usize) -> io::Result<u16> {
        b.get(at..at + 2)
            .map(|s| u16::from_ne_bytes([s[0], s[1]]))
            .ok_or_else(|| invalid(format!("iptables entry cut short at byte {at}")))
    }

    fn u32_at(b: &[u8], at: usize) -> io::Result<u32> {
        b.get(at..at + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
            .ok_or_else(|| invalid(format!("iptables entry cut short at byte {at}")))
    }

    fn u64_at(b: &[u8], at: usize) -> io::Result<u64> {
        b.get(at..at + 8)
            .map(|s| u64::from_ne_bytes(s.try_into().unwrap_or([0; 8])))
            .ok_or_else(|| invalid(format!("iptables entry cut short at byte {at}")))
    }

    struct RawSocket(libc::c_int);

    impl Drop for RawSocket {
        fn drop(&mut self) {
            // SAFETY: the descriptor was opened by `socket` below and is closed once.
            unsafe { libc::close(self.0) };
        }
    }

    fn getsockopt(
        fd: &RawSocket,
        level: libc::c_int,
        name: libc::c_int,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let mut len = libc::socklen_t::try_from(buf.len())
            .map_err(|_| invalid("iptables table too large".into()))?;
        // SAFETY: `buf` is a live, writable buffer of `len` bytes, and the kernel writes at
        // most `len` bytes into it.
        let rc = unsafe { libc::getsockopt(fd.0, level, name, buf.as_mut_ptr().cast(), &mut len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn read(
        family: Family,
        table: &str,
        chain_prefix: &str,
        mut each: impl FnMut(Counted<'_>),
    ) -> io::Result<ReadStats> {
        let (domain, level, layout) = match family {
            Family::V4 => (libc::AF_INET, libc::IPPROTO_IP, &V4),
            Family::V6 => (libc::AF_INET6, libc::IPPROTO_IPV6, &V6),
        };
        if table.len() >= TABLE_NAME_LEN {
            return Err(invalid(format!("table name {table:?} is too long")));
        }
        // SAFETY: plain socket(2); the result is checked and owned by RawSocket.
        let fd = unsafe { libc::socket(domain, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawSocket(fd);
        // The table can change between the two calls (the kernel then refuses the size with
        // EAGAIN); a few tries always get a consistent copy unless a writer never stops.
        let mut last = None;
        for _ in 0..5 {
            let mut info = [0u8; GETINFO_LEN];
            info[..table.len()].copy_from_slice(table.as_bytes());
            getsockopt(&fd, level, SO_GET_INFO, &mut info)?;
            let size = u32_at(&info, GETINFO_SIZE_AT)? as usize;
            let entries = u32_at(&info, GETINFO_ENTRIES_AT)? as usize;
            let valid_hooks = u32_at(&info, GETINFO_VALID_HOOKS_AT)?;
            let mut hooks = Vec::new();
            for h in 0..5 {
                if valid_hooks & (1 << h) != 0 {
                    hooks.push(u32_at(&info, GETINFO_HOOK_ENTRY_AT + 4 * h)? as usize);
                }
            }
            let mut buf = vec![0u8; GET_ENTRIES_HEADER + size];
            buf[..table.len()].copy_from_slice(table.as_bytes());
            buf[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(size as u32).to_ne_bytes());
            match getsockopt(&fd, level, SO_GET_ENTRIES, &mut buf) {
                Ok(()) => {
                    walk(
                        &buf[GET_ENTRIES_HEADER..],
                        layout,
                        &hooks,
                        chain_prefix,
                        &mut each,
                    )?;
                    return Ok(ReadStats {
                        rules: entries,
                        bytes: buf.len(),
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("the table kept changing")))
    }

    /// Walks the entries: a user chain starts with an `ERROR` target naming it; built-in
    /// chains start at their hook offsets.
    pub(super) fn walk(
        entries: &[u8],
        layout: &Layout,
        hooks: &[usize],
        chain_prefix: &str,
        each: &mut impl FnMut(Counted<'_>),
    ) -> io::Result<()> {
        let mut offset = 0;
        let mut chain: &str = "";
        // Each user chain ends in an entry the tools never show (its implicit RETURN): an
        // entry is handed on only once the next one is known not to start a chain.
        let mut pending: Option<Counted<'_>> = None;
        while offset < entries.len() {
            let entry = &entries[offset..];
            let target_offset = usize::from(u16_at(entry, layout.target_offset_at)?);
            let next_offset = usize::from(u16_at(entry, layout.next_offset_at)?);
            if next_offset < layout.elems_at
                || next_offset > entry.len()
                || target_offset < layout.elems_at
                || target_offset + XT_HEADER > next_offset
            {
                return Err(invalid(format!(
                    "iptables entry at {offset} has offsets {target_offset}/{next_offset}"
                )));
            }
            let entry = &entry[..next_offset];
            if hooks.contains(&offset) {
                chain = "";
            }
            let target = &entry[target_offset..];
            let target_name = c_str(&target[XT_NAME_AT..XT_NAME_AT + XT_NAME_LEN]);
            if target_name == "ERROR" {
                pending = None;
                chain = c_str(&target[XT_HEADER..]);
                offset += next_offset;
                continue;
            }
            if let Some(p) = pending.take() {
                each(p);
            }
            if !chain.is_empty() && chain.starts_with(chain_prefix) {
                let mut comment = "";
                let mut at = layout.elems_at;
                while at + XT_HEADER <= target_offset {
                    let m = &entry[at..target_offset];
                    let size = usize::from(u16_at(m, 0)?);
                    if size < XT_HEADER || size > m.len() {
                        return Err(invalid(format!(
                            "iptables match of {size} bytes in the entry at {offset}"
                        )));
                    }
                    if c_str(&m[XT_NAME_AT..XT_NAME_AT + XT_NAME_LEN]) == "comment" {
                        comment = c_str(&m[XT_HEADER..size]);
                        break;
                    }
                    at += size;
                }
                pending = Some(Counted {
                    chain,
                    comment,
                    packets: u64_at(entry, layout.packets_at)?,
                    bytes: u64_at(entry, layout.bytes_at)?,
                });
            }
            offset += next_offset;
        }
        Ok(())
    }
}

mod nft {
    use super::*;

    const NFT_MSG_NEWRULE: u16 = 6;
    const NFTA_RULE_CHAIN: u16 = 2;
    const NFTA_RULE_EXPRESSIONS: u16 = 4;
    const NFTA_RULE_USERDATA: u16 = 7;
    const NFTA_LIST_ELEM: u16 = 1;
    const NFTA_EXPR_NAME: u16 = 1;
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_COUNTER_BYTES: u16 = 1;
    const NFTA_COUNTER_PACKETS: u16 = 2;
    const NFTA_MATCH_NAME: u16 = 1;
    const NFTA_MATCH_INFO: u16 = 3;
    /// libnftnl's user-data type of a rule comment.
    const UDATA_TYPE_COMMENT: u8 = 0;
    /// `struct nfgenmsg` before the attributes.
    const NFGENMSG_LEN: usize = 4;

    /// An attribute's value with the lifetime of the message (`NlaBuffer::value` borrows the
    /// buffer struct instead).
    fn value(nla: NlaBuffer<&[u8]>) -> &[u8] {
        let len = usize::from(nla.length());
        let whole = nla.into_inner();
        whole.get(4..len.min(whole.len())).unwrap_or(&[])
    }

    fn u64_be(v: &[u8]) -> Option<u64> {
        v.get(..8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
    }

    pub fn read(
        family: Family,
        table: &str,
        chain_prefix: &str,
        mut each: impl FnMut(Counted<'_>),
    ) -> io::Result<ReadStats> {
        let proto = match family {
            Family::V4 => NetfilterProtoFamily::IPv4,
            Family::V6 => NetfilterProtoFamily::IPv6,
        };
        let mut socket = NfnlSocket::open()?;
        // Dumps of large tables come in many datagrams; a larger buffer means fewer waits.
        let _ = socket.set_receive_buffer(1 << 20);
        let mut stats = ReadStats::default();
        dump(
            &mut socket,
            proto,
            table,
            None,
            chain_prefix,
            &mut stats,
            &mut each,
        )?;
        Ok(stats)
    }

    pub fn read_chains(
        family: Family,
        table: &str,
        chains: &[&str],
        mut each: impl FnMut(Counted<'_>),
    ) -> io::Result<ReadStats> {
        let proto = match family {
            Family::V4 => NetfilterProtoFamily::IPv4,
            Family::V6 => NetfilterProtoFamily::IPv6,
        };
        let mut socket = NfnlSocket::open()?;
        let mut stats = ReadStats::default();
        for chain in chains {
            match dump(
                &mut socket,
                proto,
                table,
                Some(chain),
                "",
                &mut stats,
                &mut each,
            ) {
                Ok(()) => {}
                // A chain deleted since the plan was made.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(stats)
    }

    fn dump(
        socket: &mut NfnlSocket,
        proto: NetfilterProtoFamily,
        table: &str,
        chain: Option<&str>,
        chain_prefix: &str,
        stats: &mut ReadStats,
        each: &mut impl FnMut(Counted<'_>),
    ) -> io::Result<()> {
        let mut attributes = vec![RuleAttribute::Table(table.to_string())];
        if let Some(chain) = chain {
            attributes.push(RuleAttribute::Chain(chain.to_string()));
        }
        let request = NetfilterMessage::new(
            NetfilterHeader::new(proto, libc::NFNETLINK_V0 as u8, 0),
            NfTablesMessage::GetRule(RuleMessage { attributes }),
        );
        let mut error = None;
        socket.dump_raw(request, |kind, payload| {
            // The subsystem is in the high byte; the message type in the low one.
            if kind & 0xff != NFT_MSG_NEWRULE || error.is_some() {
                return;
            }
            stats.rules += 1;
            stats.bytes += payload.len();
            if let Err(e) = rule(payload, chain_prefix, each) {
                error = Some(e);
            }
        })?;
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One `NFT_MSG_NEWRULE` message (after its netlink header).
    pub(super) fn rule(
        payload: &[u8],
        chain_prefix: &str,
        each: &mut impl FnMut(Counted<'_>),
    ) -> io::Result<()> {
        let bad = |e: netlink_packet_core::DecodeError| invalid(format!("nft rule message: {e}"));
        let attrs = payload
            .get(NFGENMSG_LEN..)
            .ok_or_else(|| invalid("nft rule message without its header".into()))?;
        let mut chain = None;
        let mut expressions = None;
        let mut userdata = None;
        for nla in NlasIterator::new(attrs) {
            let nla = nla.map_err(bad)?;
            match nla.kind() {
                NFTA_RULE_CHAIN => chain = Some(c_str(value(nla))),
                NFTA_RULE_EXPRESSIONS => expressions = Some(value(nla)),
                NFTA_RULE_USERDATA => userdata = Some(value(nla)),
                _ => {}
            }
        }
        let Some(chain) = chain.filter(|c| c.starts_with(chain_prefix)) else {
            return Ok(());
        };
        let mut comment = None;
        let mut counter = None;
        for elem in NlasIterator::new(expressions.unwrap_or(&[])) {
            let elem = elem.map_err(bad)?;
            if elem.kind() != NFTA_LIST_ELEM {
                continue;
            }
            let (mut name, mut data) = ("", &[][..]);
            for a in NlasIterator::new(value(elem)) {
                let a = a.map_err(bad)?;
                match a.kind() {
                    NFTA_EXPR_NAME => name = c_str(value(a)),
                    NFTA_EXPR_DATA => data = value(a),
                    _ => {}
                }
            }
            match name {
                "counter" if counter.is_none() => {
                    let (mut packets, mut bytes) = (0, 0);
                    for a in NlasIterator::new(data) {
                        let a = a.map_err(bad)?;
                        match a.kind() {
                            NFTA_COUNTER_PACKETS => packets = u64_be(a.value()).unwrap_or(0),
                            NFTA_COUNTER_BYTES => bytes = u64_be(a.value()).unwrap_or(0),
                            _ => {}
                        }
                    }
                    counter = Some((packets, bytes));
                }
                "match" if comment.is_none() => {
                    let (mut match_name, mut info) = ("", &[][..]);
                    for a in NlasIterator::new(data) {
                        let a = a.map_err(bad)?;
                        match a.kind() {
                            NFTA_MATCH_NAME => match_name = c_str(value(a)),
                            NFTA_MATCH_INFO => info = value(a),
                            _ => {}
                        }
                    }
                    if match_name == "comment" {
                        comment = Some(c_str(info));
                    }
                }
                _ => {}
            }
        }
        if comment.is_none() {
            comment = userdata.and_then(udata_comment);
        }
        let (packets, bytes) = counter.unwrap_or((0, 0));
        each(Counted {
            chain,
            comment: comment.unwrap_or(""),
            packets,
            bytes,
        });
        Ok(())
    }

    /// The comment in libnftnl's user-data TLVs (type u8, length u8, value).
    fn udata_comment(mut data: &[u8]) -> Option<&str> {
        while data.len() >= 2 {
            let (kind, len) = (data[0], usize::from(data[1]));
            let value = data.get(2..2 + len)?;
            if kind == UDATA_TYPE_COMMENT {
                return CStr::from_bytes_until_nul(value)
                    .ok()
                    .and_then(|c| c.to_str().ok())
                    .or_else(|| std::str::from_utf8(value).ok());
            }
            data = &data[2 + len..];
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A legacy IPv4 blob: a built-in chain's policy entry, then user chain `cali-x` with one
    /// rule (comment + counters) and its RETURN, then the final ERROR.
    fn legacy_blob() -> Vec<u8> {
        fn entry(matches: &[Vec<u8>], target: Vec<u8>, packets: u64, bytes: u64) -> Vec<u8> {
            let mut e = vec![0u8; 112];
            let mlen: usize = matches.iter().map(Vec::len).sum();
            e[88..90].copy_from_slice(&((112 + mlen) as u16).to_ne_bytes());
            e[90..92].copy_from_slice(&((112 + mlen + target.len()) as u16).to_ne_bytes());
            e[96..104].copy_from_slice(&packets.to_ne_bytes());
            e[104..112].copy_from_slice(&bytes.to_ne_bytes());
            for m in matches {
                e.extend_from_slice(m);
            }
            e.extend_from_slice(&target);
            e
        }
        fn xt(name: &str, data: &[u8]) -> Vec<u8> {
            let mut x = vec![0u8; 32];
            let size = (32 + data.len() + 7) & !7;
            x[0..2].copy_from_slice(&(size as u16).to_ne_bytes());
            x[2..2 + name.len()].copy_from_slice(name.as_bytes());
            x.extend_from_slice(data);
            x.resize(size, 0);
            x
        }
        let mut comment = vec![0u8; 256];
        comment[..21].copy_from_slice(b"cali:AbCdEfGhIjKlMnOp");
        let mut chain = vec![0u8; 32];
        chain[..6].copy_from_slice(b"cali-x");
        let mut end = vec![0u8; 32];
        end[..5].copy_from_slice(b"ERROR");
        let verdict = xt("", &[0u8; 8]);
        let mut blob = entry(&[], verdict.clone(), 1, 2); // built-in policy
        blob.extend(entry(&[], xt("ERROR", &chain), 0, 0));
        blob.extend(entry(
            &[xt("comment", &comment)],
            xt("MARK", &[0u8; 8]),
            7,
            700,
        ));
        blob.extend(entry(&[], verdict, 3, 300));
        blob.extend(entry(&[], xt("ERROR", &end), 0, 0));
        blob
    }

    #[test]
    fn legacy_entries_walk_into_chains_comments_and_counters() {
        let blob = legacy_blob();
        let mut seen = Vec::new();
        legacy::walk(&blob, &legacy::V4, &[0], "cali-", &mut |c| {
            seen.push((
                c.chain.to_string(),
                c.comment.to_string(),
                c.packets,
                c.bytes,
            ))
        })
        .unwrap();
        // The chain's closing RETURN (3, 300) is the implicit one the tools never show.
        assert_eq!(
            seen,
            vec![("cali-x".into(), "cali:AbCdEfGhIjKlMnOp".into(), 7, 700)]
        );
        // Every cut of the blob is an error or a shorter walk, never a panic.
        for cut in 0..blob.len() {
            let _ = legacy::walk(&blob[..cut], &legacy::V4, &[0], "cali-", &mut |_| {});
        }
        // A corrupt next offset is an error.
        let mut bad = blob.clone();
        bad[90..92].copy_from_slice(&3u16.to_ne_bytes());
        assert!(legacy::walk(&bad, &legacy::V4, &[0], "cali-", &mut |_| {}).is_err());
    }

    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(kind | 0x8000, &parts.concat())
    }

    fn nft_rule(chain: &str, comment: Option<&str>, packets: u64, bytes: u64) -> Vec<u8> {
        let mut exprs = Vec::new();
        if let Some(c) = comment {
            let mut info = c.as_bytes().to_vec();
            info.resize(256, 0);
            exprs.push(nested(
                1,
                &[
                    nla(1, b"match\0"),
                    nested(
                        2,
                        &[
                            nla(1, b"comment\0"),
                            nla(2, &0u32.to_be_bytes()),
                            nla(3, &info),
                        ],
                    ),
                ],
            ));
        }
        exprs.push(nested(
            1,
            &[
                nla(1, b"counter\0"),
                nested(
                    2,
                    &[nla(1, &bytes.to_be_bytes()), nla(2, &packets.to_be_bytes())],
                ),
            ],
        ));
        let mut msg = vec![2, 0, 0, 0];
        msg.extend(nla(1, b"filter\0"));
        msg.extend(nla(2, format!("{chain}\0").as_bytes()));
        msg.extend(nested(4, &exprs));
        msg
    }

    #[test]
    fn nft_rules_give_chain_comment_and_counter() {
        let mut seen = Vec::new();
        let mut each = |c: Counted<'_>| {
            seen.push((
                c.chain.to_string(),
                c.comment.to_string(),
                c.packets,
                c.bytes,
            ))
        };
        nft::rule(
            &nft_rule("cali-pi-x", Some("cali:h1"), 5, 500),
            "cali-",
            &mut each,
        )
        .unwrap();
        nft::rule(
            &nft_rule("KUBE-X", Some("cali:h2"), 1, 1),
            "cali-",
            &mut each,
        )
        .unwrap();
        nft::rule(&nft_rule("cali-tw-y", None, 9, 900), "cali-", &mut each).unwrap();
        assert_eq!(
            seen,
            vec![
                ("cali-pi-x".into(), "cali:h1".into(), 5, 500),
                ("cali-tw-y".into(), String::new(), 9, 900),
            ]
        );
        let blob = nft_rule("cali-pi-x", Some("cali:h1"), 5, 500);
        for cut in 0..blob.len() {
            let _ = nft::rule(&blob[..cut], "cali-", &mut |_| {});
        }
    }
}
