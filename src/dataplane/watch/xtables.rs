//! Legacy iptables (x_tables, the `iptables-legacy` backend): what changed in one table of one
//! family, read with `getsockopt` on a raw socket, no process.
//!
//! - `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (one call, 84 bytes): the table's valid hooks,
//!   the offsets of each built-in chain's first rule and policy, the number of entries and
//!   the blob's size. Any rule added or removed, any chain created or deleted moves the size
//!   or the entry count. A rule replaced in place by one of the same size (`iptables -R`
//!   swapping `-j DROP` for `-j ACCEPT`) does not.
//! - `IPT_SO_GET_ENTRIES` / `IP6T_SO_GET_ENTRIES`: the whole rule blob. [`digest_entries`]
//!   hashes it chain by chain, leaving out what changes without anybody writing (each rule's
//!   packet and byte counters, and `comefrom`, the kernel's note of which hooks reach the
//!   rule), and writing each jump as the name of the chain it jumps to rather than as its
//!   byte offset (a rule inserted in one chain shifts the offsets of every chain after it).
//!   Two digests tell which chains changed, so a change in another program's chain of the
//!   same table is told apart from one in ours.
//!
//! The structures are hand-decoded from the blob (`ipt_getinfo`, `ipt_entry`,
//! `xt_entry_target`, and the IPv6 `ip6t_*` versions, whose layouts differ only in the size of
//! the address part): no maintained crate exposes the x_tables sockopt interface, and the
//! work is a bounds-checked walk over fixed offsets. Kernels before 4.11 copy the kernel-side
//! private data of some matches (`limit`'s token bucket, ...) to user space with the rule, so
//! there a rule with such a match changes its digest as packets flow; the tables we and
//! kube-proxy write have none.
//!
//! The socket works in the network namespace of the thread that opened it.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::os::fd::AsRawFd;

use nix::libc;

use super::{Finding, Interest, Malformed};
use crate::model::IpFamily;

/// Built-in chains by hook number (`NF_INET_PRE_ROUTING` ... `NF_INET_POST_ROUTING`).
pub const HOOK_NAMES: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
/// `XT_TABLE_MAXNAMELEN`, the terminating NUL included.
const TABLE_NAME_LEN: usize = 32;
/// `sizeof(struct ipt_getinfo)` (the same for IPv6).
pub const GETINFO_LEN: usize = 84;
/// `sizeof(struct ipt_get_entries)`: name, size, padding to the entries' 8-byte alignment.
const GET_ENTRIES_HEADER: usize = 40;
/// `sizeof(struct xt_entry_target)`: size, name, revision; the target's data follows.
const TARGET_HEADER: usize = 32;
/// `XT_FUNCTION_MAXNAMELEN`: the target name field.
const TARGET_NAME_LEN: usize = 29;
const ERROR_TARGET: &[u8] = b"ERROR";
/// How often a read of the entries is repeated when the table changes under it.
const ENTRIES_ATTEMPTS: usize = 5;

/// Where the fields of `ipt_entry` / `ip6t_entry` are.
#[derive(Debug)]
struct Layout {
    level: libc::c_int,
    /// `sizeof(struct ipt_entry)`: the matches start here.
    entry_size: usize,
    target_offset_at: usize,
    next_offset_at: usize,
    /// `comefrom`, then padding and the counters up to `entry_size`: left out of digests.
    comefrom_at: usize,
}

const LAYOUT_V4: Layout = Layout {
    level: libc::IPPROTO_IP,
    entry_size: 112,
    target_offset_at: 88,
    next_offset_at: 90,
    comefrom_at: 92,
};

const LAYOUT_V6: Layout = Layout {
    level: libc::IPPROTO_IPV6,
    entry_size: 168,
    target_offset_at: 140,
    next_offset_at: 142,
    comefrom_at: 144,
};

fn layout(family: IpFamily) -> &'static Layout {
    match family {
        IpFamily::V4 => &LAYOUT_V4,
        IpFamily::V6 => &LAYOUT_V6,
    }
}

/// `struct ipt_getinfo` without the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XtInfo {
    pub valid_hooks: u32,
    /// Offset of each built-in chain's first entry, by hook number.
    pub hook_entry: [u32; 5],
    /// Offset of each built-in chain's policy entry, by hook number.
    pub underflow: [u32; 5],
    pub num_entries: u32,
    /// Bytes of the entries blob.
    pub size: u32,
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn c_str(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// Decodes the `GETINFO_LEN` bytes `IPT_SO_GET_INFO` returns (the name first).
pub fn decode_info(buf: &[u8]) -> Result<XtInfo, Malformed> {
    if buf.len() != GETINFO_LEN {
        return Err(Malformed::new(
            "ipt_getinfo",
            format!("{} bytes, want {GETINFO_LEN}", buf.len()),
        ));
    }
    let word = |i: usize| u32_at(buf, TABLE_NAME_LEN + 4 * i).unwrap_or(0);
    let hook_entry = std::array::from_fn(|h| word(1 + h));
    let underflow = std::array::from_fn(|h| word(6 + h));
    Ok(XtInfo {
        valid_hooks: word(0),
        hook_entry,
        underflow,
        num_entries: word(11),
        size: word(12),
    })
}

/// One chain's share of a table digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainDigest {
    /// Rules, the policy entry of a built-in chain included.
    pub entries: u32,
    pub hash: u64,
}

/// A table's fingerprint: its info and a digest of each chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDigest {
    pub info: XtInfo,
    pub chains: BTreeMap<String, ChainDigest>,
}

impl TableDigest {
    /// The chains that differ between `self` and `other`: changed, added or removed.
    pub fn changed_chains(&self, other: &TableDigest) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (name, d) in &self.chains {
            if other.chains.get(name) != Some(d) {
                out.insert(name.clone());
            }
        }
        for name in other.chains.keys() {
            if !self.chains.contains_key(name) {
                out.insert(name.clone());
            }
        }
        out
    }
}

/// One entry's place in the blob.
struct Entry {
    off: usize,
    next: usize,
    target: usize,
}

/// Digests the entries blob of `IPT_SO_GET_ENTRIES` chain by chain (see the module comment),
/// checking every offset; `info` is the table info read with it.
pub fn digest_entries(
    family: IpFamily,
    info: &XtInfo,
    blob: &[u8],
) -> Result<TableDigest, Malformed> {
    const WHAT: &str = "x_tables entries";
    let l = layout(family);
    if blob.len() != info.size as usize {
        return Err(Malformed::new(
            WHAT,
            format!("{} bytes, the table info says {}", blob.len(), info.size),
        ));
    }
    let mut entries = Vec::with_capacity(info.num_entries.min(1 << 20) as usize);
    let mut off = 0;
    while off < blob.len() {
        let bad = |detail: String| Malformed::new(WHAT, format!("entry at {off}: {detail}"));
        if off + l.entry_size > blob.len() {
            return Err(bad("cut short".into()));
        }
        let target = u16_at(blob, off + l.target_offset_at).unwrap_or(0) as usize;
        let next = u16_at(blob, off + l.next_offset_at).unwrap_or(0) as usize;
        if next < l.entry_size + TARGET_HEADER || off + next > blob.len() {
            return Err(bad(format!("next_offset {next} out of bounds")));
        }
        if target < l.entry_size || target + TARGET_HEADER > next {
            return Err(bad(format!("target_offset {target} out of bounds")));
        }
        entries.push(Entry { off, next, target });
        off += next;
    }
    if entries.len() != info.num_entries as usize {
        return Err(Malformed::new(
            WHAT,
            format!(
                "{} entries, the table info says {}",
                entries.len(),
                info.num_entries
            ),
        ));
    }

    // Where each chain starts: built-in chains at their hook entry, user chains right after
    // their head (an ERROR target holding the chain's name; the last ERROR entry, named
    // "ERROR", ends the table).
    let mut starts: BTreeMap<usize, String> = BTreeMap::new();
    for (h, name) in HOOK_NAMES.iter().enumerate() {
        if info.valid_hooks & (1 << h) != 0 {
            starts.insert(info.hook_entry[h] as usize, name.to_string());
        }
    }
    let target_name = |e: &Entry| c_str(&blob[e.off + e.target + 2..][..TARGET_NAME_LEN]);
    let target_data = |e: &Entry| &blob[e.off + e.target + TARGET_HEADER..e.off + e.next];
    let mut heads = BTreeSet::new();
    for e in &entries {
        if target_name(e) == ERROR_TARGET {
            heads.insert(e.off);
            let name = c_str(target_data(e));
            if name != ERROR_TARGET {
                let name = String::from_utf8_lossy(name).into_owned();
                starts.insert(e.off + e.next, name);
            }
        }
    }

    let mut chains: BTreeMap<String, (u32, DefaultHasher)> = BTreeMap::new();
    for e in &entries {
        if heads.contains(&e.off) {
            continue;
        }
        let Some((_, chain)) = starts.range(..=e.off).next_back() else {
            return Err(Malformed::new(
                WHAT,
                format!("entry at {} comes before any chain", e.off),
            ));
        };
        let (count, h) = chains
            .entry(chain.clone())
            .or_insert_with(|| (0, DefaultHasher::new()));
        *count += 1;
        // The address part, nfcache, target_offset and next_offset; not comefrom or the
        // counters.
        h.write(&blob[e.off..e.off + l.comefrom_at]);
        // The matches and the target's header.
        h.write(&blob[e.off + l.entry_size..e.off + e.target + TARGET_HEADER]);
        let data = target_data(e);
        let verdict = data
            .get(..4)
            .map(|v| i32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
        match verdict {
            // The standard target (empty name) with a jump: where to, by name.
            Some(v) if target_name(e).is_empty() && v >= 0 => {
                let to = v as usize;
                if to == e.off + e.next {
                    h.write(b"\x01fallthrough");
                } else if let Some(name) = starts.get(&to) {
                    h.write(b"\x02");
                    h.write(name.as_bytes());
                } else {
                    // Into the middle of a chain: only hand-made blobs do that.
                    h.write(b"\x03");
                    h.write(&(to as u64).to_ne_bytes());
                }
            }
            _ => h.write(data),
        }
    }
    // A chain without entries (impossible for a consistent table, but a digest must not
    // hide that a chain exists).
    for name in starts.values() {
        chains
            .entry(name.clone())
            .or_insert_with(|| (0, DefaultHasher::new()));
    }
    Ok(TableDigest {
        info: *info,
        chains: chains
            .into_iter()
            .map(|(name, (entries, h))| {
                (
                    name,
                    ChainDigest {
                        entries,
                        hash: h.finish(),
                    },
                )
            })
            .collect(),
    })
}

/// A raw socket for the x_tables sockopts of one family, in the network namespace of the
/// thread that opened it. Needs `CAP_NET_RAW` and `CAP_NET_ADMIN`.
pub struct XtSocket {
    socket: socket2::Socket,
    family: IpFamily,
}

impl XtSocket {
    pub fn open(family: IpFamily) -> io::Result<XtSocket> {
        let domain = match family {
            IpFamily::V4 => socket2::Domain::IPV4,
            IpFamily::V6 => socket2::Domain::IPV6,
        };
        let socket = socket2::Socket::new(
            domain,
            socket2::Type::RAW,
            Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
        )?;
        Ok(XtSocket { socket, family })
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The table's info; `None` when the table does not exist.
    pub fn info(&self, table: &str) -> io::Result<Option<XtInfo>> {
        let mut buf = [0u8; GETINFO_LEN];
        put_name(&mut buf, table)?;
        match self.getsockopt(SO_GET_INFO, &mut buf) {
            Ok(n) if n == GETINFO_LEN => Ok(Some(decode_info(&buf)?)),
            Ok(n) => {
                Err(Malformed::new("ipt_getinfo", format!("the kernel returned {n} bytes")).into())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The table's info and its entries blob, read consistently (the info is read again after
    /// the entries and the read repeated when the table changed in between); `None` when the
    /// table does not exist.
    pub fn entries(&self, table: &str) -> io::Result<Option<(XtInfo, Vec<u8>)>> {
        for _ in 0..ENTRIES_ATTEMPTS {
            let Some(info) = self.info(table)? else {
                return Ok(None);
            };
            let mut buf = vec![0u8; GET_ENTRIES_HEADER + info.size as usize];
            put_name(&mut buf, table)?;
            buf[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&info.size.to_ne_bytes());
            match self.getsockopt(SO_GET_ENTRIES, &mut buf) {
                // The size changed between the two calls.
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            if self.info(table)? != Some(info) {
                continue;
            }
            buf.drain(..GET_ENTRIES_HEADER);
            return Ok(Some((info, buf)));
        }
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            format!("table {table} changed during each of {ENTRIES_ATTEMPTS} reads"),
        ))
    }

    /// The digest of the table; `None` when it does not exist.
    pub fn digest(&self, table: &str) -> io::Result<Option<TableDigest>> {
        match self.entries(table)? {
            None => Ok(None),
            Some((info, blob)) => Ok(Some(digest_entries(self.family, &info, &blob)?)),
        }
    }

    fn getsockopt(&self, opt: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
        let mut len = libc::socklen_t::try_from(buf.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "sockopt buffer too large"))?;
        // SAFETY: `buf` is valid for writes of `len` bytes; the kernel writes at most `len`
        // bytes into it and stores the length it wrote in `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                layout(self.family).level,
                opt,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(len as usize)
    }
}

fn put_name(buf: &mut [u8], table: &str) -> io::Result<()> {
    if table.is_empty() || table.len() >= TABLE_NAME_LEN || table.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "table name {table:?} must have 1 to {} bytes",
                TABLE_NAME_LEN - 1
            ),
        ));
    }
    buf[..TABLE_NAME_LEN].fill(0);
    buf[..table.len()].copy_from_slice(table.as_bytes());
    Ok(())
}

/// Watches one table of one family: [`check`](LegacyWatch::check) costs one getsockopt while
/// nothing changed, [`verify`](LegacyWatch::verify) reads and digests the entries.
pub struct LegacyWatch {
    socket: XtSocket,
    interest: Interest,
    /// What the last look saw: `None` before the first, `Some(None)` when the table did not
    /// exist.
    info: Option<Option<XtInfo>>,
    digest: Option<Option<TableDigest>>,
    /// Writes of our own happened since `digest` was taken (`rebase_info`).
    digest_stale: bool,
}

impl LegacyWatch {
    /// Opens the socket in the calling thread's network namespace; takes no fingerprint yet.
    pub fn open(family: IpFamily, interest: Interest) -> io::Result<LegacyWatch> {
        Ok(LegacyWatch {
            socket: XtSocket::open(family)?,
            interest,
            info: None,
            digest: None,
            digest_stale: false,
        })
    }

    /// Takes the fingerprint later checks compare with: after a full read, and after each
    /// write of our own (so that it is not reported as a change).
    pub fn baseline(&mut self) -> io::Result<()> {
        let now = self.socket.digest(&self.interest.table)?;
        self.info = Some(now.as_ref().map(|d| d.info));
        self.digest = Some(now);
        self.digest_stale = false;
        Ok(())
    }

    /// After a write of our own, the cheap way: takes the table's info as the reference for
    /// `check` (one getsockopt) and leaves the chain digest behind. Until the next
    /// `baseline`, `verify` cannot tell our writes from others' and answers `Unknown`.
    pub fn rebase_info(&mut self) -> io::Result<()> {
        self.info = Some(self.socket.info(&self.interest.table)?);
        self.digest_stale = true;
        Ok(())
    }

    /// The cheap check: one `IPT_SO_GET_INFO`. When the info moved, the entries are read to
    /// tell which chains changed. Blind to a rule replaced by one of the same size; see
    /// [`verify`](LegacyWatch::verify).
    pub fn check(&mut self) -> io::Result<Finding> {
        let Some(seen) = self.info else {
            return Ok(Finding::Unknown("no fingerprint taken yet".into()));
        };
        if self.socket.info(&self.interest.table)? == seen {
            return Ok(Finding::Unchanged);
        }
        self.verify()
    }

    /// Whether the table's info differs from the last look's, without reading the entries or
    /// taking a new fingerprint (`true` before the first look). For a caller that wants to
    /// space out the entries reads another program's frequent writes would cause: `verify`
    /// then tells whose chains moved.
    pub fn info_moved(&self) -> io::Result<bool> {
        match self.info {
            None => Ok(true),
            Some(seen) => Ok(self.socket.info(&self.interest.table)? != seen),
        }
    }

    /// The exact check: reads and digests the entries, compares them chain by chain with the
    /// fingerprint, and takes the new one.
    pub fn verify(&mut self) -> io::Result<Finding> {
        let now = self.socket.digest(&self.interest.table)?;
        let table = &self.interest.table;
        let finding = match (&self.digest, &now) {
            _ if self.digest_stale => {
                Finding::Unknown("our own writes since the last full fingerprint".into())
            }
            (None, _) => Finding::Unknown("no fingerprint taken yet".into()),
            (Some(None), None) => Finding::Unchanged,
            (Some(None), Some(_)) => Finding::Unknown(format!("table {table} appeared")),
            (Some(Some(_)), None) => Finding::Unknown(format!("table {table} disappeared")),
            (Some(Some(old)), Some(new)) => self.interest.classify_chains(&old.changed_chains(new)),
        };
        self.info = Some(now.as_ref().map(|d| d.info));
        self.digest = Some(now);
        self.digest_stale = false;
        Ok(finding)
    }

    /// The fingerprint of the last look.
    pub fn fingerprint(&self) -> Option<&TableDigest> {
        self.digest.as_ref().and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a 6.18 kernel in a test namespace: the filter table after
    /// `iptables-legacy -N cali-x; -A cali-x -s 10.0.0.1 -j DROP; -A FORWARD -j cali-x`
    /// (IPv4) and the same with ip6tables-legacy and `-s fd00::1` (IPv6). `(getinfo, entries)`.
    mod captured {
        include!("testdata/xt_filter.rs");
    }

    fn digest(family: IpFamily, info: &[u8], blob: &[u8]) -> TableDigest {
        let info = decode_info(info).unwrap();
        digest_entries(family, &info, blob).unwrap()
    }

    #[test]
    fn captured_tables_digest_into_their_chains() {
        for (family, (info, blob)) in [(IpFamily::V4, captured::V4), (IpFamily::V6, captured::V6)] {
            let d = digest(family, info, blob);
            let names: Vec<&str> = d.chains.keys().map(String::as_str).collect();
            assert_eq!(
                names,
                ["FORWARD", "INPUT", "OUTPUT", "cali-x"],
                "{family:?}"
            );
            // FORWARD: the jump and the policy; cali-x: the DROP and its RETURN.
            assert_eq!(d.chains["FORWARD"].entries, 2, "{family:?}");
            assert_eq!(d.chains["cali-x"].entries, 2, "{family:?}");
            assert_eq!(d.chains["INPUT"].entries, 1, "{family:?}");
            assert_eq!(d.info.valid_hooks, 0b1110);
        }
    }

    #[test]
    fn counters_do_not_change_the_digest_but_rules_do() {
        let l = layout(IpFamily::V4);
        let (info, blob) = captured::V4;
        let before = digest(IpFamily::V4, info, blob);
        let mut counted = blob.to_vec();
        // Every entry's packet and byte counters, and comefrom.
        let mut off = 0;
        while off < counted.len() {
            let next = u16_at(&counted, off + l.next_offset_at).unwrap() as usize;
            for b in &mut counted[off + l.comefrom_at..off + l.entry_size] {
                *b = b.wrapping_add(0x11);
            }
            off += next;
        }
        assert_eq!(digest(IpFamily::V4, info, &counted), before);

        // The DROP (verdict -NF_DROP-1 = -1) of cali-x turned into an ACCEPT (-2): same size.
        let mut replaced = blob.to_vec();
        let drop = (-1i32).to_ne_bytes();
        let pos = find_verdict(&replaced, &drop).expect("a DROP verdict");
        replaced[pos..pos + 4].copy_from_slice(&(-2i32).to_ne_bytes());
        let after = digest(IpFamily::V4, info, &replaced);
        assert_eq!(
            before.changed_chains(&after),
            ["cali-x".to_string()].into_iter().collect()
        );
    }

    /// The offset of the data of the first standard target holding `verdict`.
    fn find_verdict(blob: &[u8], verdict: &[u8; 4]) -> Option<usize> {
        let l = layout(IpFamily::V4);
        let mut off = 0;
        while off < blob.len() {
            let target = u16_at(blob, off + l.target_offset_at)? as usize;
            let next = u16_at(blob, off + l.next_offset_at)? as usize;
            let name = c_str(&blob[off + target + 2..off + target + 2 + TARGET_NAME_LEN]);
            let data = off + target + TARGET_HEADER;
            if name.is_empty() && &blob[data..data + 4] == verdict {
                return Some(data);
            }
            off += next;
        }
        None
    }

    #[test]
    fn truncated_or_garbage_blobs_are_errors_not_panics() {
        for (family, (info, blob)) in [(IpFamily::V4, captured::V4), (IpFamily::V6, captured::V6)] {
            let info = decode_info(info).unwrap();
            for cut in 0..blob.len() {
                let mut short = info;
                short.size = cut as u32;
                assert!(digest_entries(family, &short, &blob[..cut]).is_err() || cut == 0);
            }
            // Size mismatch between info and blob.
            assert!(digest_entries(family, &info, &blob[..blob.len() - 1]).is_err());
            // Every 2-byte field overwritten with garbage, one at a time.
            for at in (0..blob.len()).step_by(2) {
                let mut bad = blob.to_vec();
                bad[at] ^= 0xa5;
                bad[at + 1] ^= 0x3c;
                let _ = digest_entries(family, &info, &bad);
            }
            // An info claiming more entries than there are.
            let mut more = info;
            more.num_entries += 1;
            assert!(digest_entries(family, &more, blob).is_err());
        }
        assert!(decode_info(&[0; 10]).is_err());
        assert!(decode_info(&[0; GETINFO_LEN + 1]).is_err());
    }

    #[test]
    fn table_names_are_checked() {
        let mut buf = [0u8; GETINFO_LEN];
        assert!(put_name(&mut buf, "filter").is_ok());
        assert_eq!(&buf[..7], b"filter\0");
        assert!(put_name(&mut buf, "").is_err());
        assert!(put_name(&mut buf, &"x".repeat(32)).is_err());
        assert!(put_name(&mut buf, "a\0b").is_err());
    }
}
