//! Reading `ipset save` output (lines read by [`crate::kernel_text::ipset`]): our sets (`crate::rules::sets::is_owned_set`) with their type,
//! family, size and members; everything else is read past. Any bytes are accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead};
use std::net::IpAddr;

use super::plan::KernelSet;
use crate::kernel_text::ipset::{self, Options, SetLine};
use crate::model::{IpFamily, Protocol};
use crate::rules::sets::{is_owned_set, Member, SetType};

/// Reads `ipset save` output, keeping our sets. Lines it does not understand are skipped; a
/// set holding anything we would not write is marked irregular.
pub(super) fn parse_save<R: BufRead>(mut reader: R) -> io::Result<BTreeMap<String, KernelSet>> {
    let mut sets: BTreeMap<String, KernelSet> = BTreeMap::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf);
        match ipset::classify(&line) {
            SetLine::Create {
                name,
                set_type,
                options,
            } if is_owned_set(name) => {
                sets.insert(name.to_string(), parse_create(set_type, options));
            }
            SetLine::Add {
                name,
                entry,
                trailing,
            } => {
                if let Some(set) = sets.get_mut(name) {
                    match entry.and_then(|e| parse_member(set.set_type, set.family, e)) {
                        Some(m) if !trailing => {
                            set.members.insert(m);
                        }
                        _ => set.irregular = true,
                    }
                }
            }
            _ => {}
        }
    }
    Ok(sets)
}

/// The rest of a `create NAME` line: `TYPE family inet hashsize 1024 maxelem 1048576 ...`.
fn parse_create(set_type: Option<&str>, mut words: Options<'_>) -> KernelSet {
    let set_type = match set_type {
        Some("hash:net") => Some(SetType::HashNet),
        Some("hash:ip,port") => Some(SetType::HashIpPort),
        _ => None,
    };
    let mut set = KernelSet {
        family: None,
        set_type,
        maxelem: None,
        irregular: false,
        members: BTreeSet::new(),
    };
    while let Some(word) = words.next() {
        match word {
            "family" => {
                set.family = match words.next() {
                    Some("inet") => Some(IpFamily::V4),
                    Some("inet6") => Some(IpFamily::V6),
                    _ => None,
                }
            }
            "maxelem" => set.maxelem = words.next().and_then(|v| v.parse().ok()),
            // Sizing the kernel picks or tunes; they change nothing we rely on.
            "hashsize" | "bucketsize" | "initval" => {
                words.next();
            }
            // timeout, counters, comment, skbinfo, forceadd, netmask, ...: not what we create.
            _ => set.irregular = true,
        }
    }
    set
}

/// One `add` entry as a `Member`, if it is one a set of ours would hold: `ipset save` prints a
/// host address without `/32` (`/128`), and `ip,proto:port` for `hash:ip,port`. Addresses
/// compare as values, so any IPv6 spelling matches.
fn parse_member(
    set_type: Option<SetType>,
    family: Option<IpFamily>,
    entry: &str,
) -> Option<Member> {
    let member = match set_type? {
        SetType::HashNet => {
            let (addr, prefix) = match entry.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (entry, None),
            };
            let ip: IpAddr = addr.parse().ok()?;
            if let Some(p) = prefix {
                let full = if ip.is_ipv4() { 32 } else { 128 };
                if p.parse::<u8>().ok()? != full {
                    return None;
                }
            }
            Member::Addr(ip)
        }
        SetType::HashIpPort => {
            let (addr, proto_port) = entry.split_once(',')?;
            let (proto, port) = proto_port.split_once(':')?;
            let protocol = match proto {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                _ => return None,
            };
            Member::AddrPort(addr.parse().ok()?, protocol, port.parse().ok()?)
        }
    };
    (Some(member.family()) == family).then_some(member)
}
