//! Tagged packets and their observers, for the spoofing check (`spoof`): the tag each forged
//! or control packet carries (a TCP SYN's sequence number with a window no real probe uses, a
//! UDP payload, an SCTP INIT's initiate tag), the raw observers every pod runs (`servers`),
//! and the log of tags they saw. Apart from `spoof` so that the pods' servers, which the
//! cluster starts, need nothing of the check that drives the cluster.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use netpol_agent::model::IpFamily;
use socket2::{Domain, Protocol as SockProtocol, Socket, Type};

/// The TCP window of a tagged SYN (no kernel offers exactly this in a SYN of its own).
pub(crate) const TAG_WINDOW: u16 = 0x4e50;
/// The start of a tagged UDP payload.
pub(crate) const UDP_MAGIC: &[u8] = b"npa-spoof ";
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) const IPPROTO_SCTP: u8 = 132;

/// Tags the observers saw (any pod, any protocol: tags are unique).
#[derive(Default)]
pub struct TagLog {
    seen: Mutex<HashSet<u32>>,
    changed: Condvar,
}

impl TagLog {
    pub fn record(&self, tag: u32) {
        self.seen.lock().expect("not poisoned").insert(tag);
        self.changed.notify_all();
    }

    pub(crate) fn seen(&self, tag: u32) -> bool {
        self.seen.lock().expect("not poisoned").contains(&tag)
    }

    /// Waits until every tag of `tags` was seen or `deadline` passes; the ones not seen.
    pub(crate) fn wait_all(&self, tags: &BTreeSet<u32>, deadline: Instant) -> BTreeSet<u32> {
        let mut seen = self.seen.lock().expect("not poisoned");
        loop {
            let missing: BTreeSet<u32> =
                tags.iter().filter(|t| !seen.contains(t)).copied().collect();
            let left = deadline.saturating_duration_since(Instant::now());
            if missing.is_empty() || left.is_zero() {
                return missing;
            }
            seen = self
                .changed
                .wait_timeout(seen, left)
                .expect("not poisoned")
                .0;
        }
    }
}

/// The tag in a packet a raw observer of `protocol` received (IPv4 sockets get the IP header,
/// IPv6 ones only the payload), if it is one of ours.
pub fn tag_of(packet: &[u8], family: IpFamily, protocol: u8) -> Option<u32> {
    let payload = match family {
        IpFamily::V4 => packet.get(usize::from(packet.first()? & 0x0f) * 4..)?,
        IpFamily::V6 => packet,
    };
    match protocol {
        IPPROTO_TCP => {
            let syn_only = payload.get(13)? & 0x12 == 0x02;
            let window = u16::from_be_bytes([*payload.get(14)?, *payload.get(15)?]);
            let seq = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?);
            (syn_only && window == TAG_WINDOW).then_some(seq)
        }
        IPPROTO_UDP => {
            let text = std::str::from_utf8(payload.get(8..)?.strip_prefix(UDP_MAGIC)?).ok()?;
            text.trim().parse().ok()
        }
        _ => None,
    }
}

/// Watches one pod's incoming TCP or UDP packets (a raw socket of that protocol, which gets
/// a copy of each) until `stop`, recording tags.
pub fn observe(socket: Socket, family: IpFamily, protocol: u8, log: &TagLog, stop: &AtomicBool) {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        // SAFETY: recv initialised the first n bytes.
        let bytes: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        if let Some(tag) = tag_of(&bytes, family, protocol) {
            log.record(tag);
        }
    }
}

/// The raw observer sockets a pod needs in `family` (opened in its namespace).
pub fn observer_sockets(family: IpFamily) -> std::io::Result<Vec<(Socket, u8)>> {
    let domain = match family {
        IpFamily::V4 => Domain::IPV4,
        IpFamily::V6 => Domain::IPV6,
    };
    let mut out = Vec::new();
    for protocol in [IPPROTO_TCP, IPPROTO_UDP] {
        let s = Socket::new(
            domain,
            Type::RAW,
            Some(SockProtocol::from(i32::from(protocol))),
        )?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        out.push((s, protocol));
    }
    Ok(out)
}
