//! The prober: every ordered pair of distinct pods × probed port and protocol, in parallel
//! on a pool of threads that enter the source pod's namespace, each probe with a short
//! timeout. TCP connects and reads the server's identity; UDP sends a nonce and waits for it
//! to come back with the identity; SCTP sends a crafted INIT and asks the target's observer.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netpol_agent::model::IpFamily;
use socket2::{Domain, Protocol as SockProtocol, Socket, Type};

use crate::expect::{Observed, Outcome};
use crate::netns::enter;
use crate::scenario::{PortKey, Protocol};
use crate::servers::{SctpLog, SCTP_PROTOCOL};

#[derive(Clone)]
pub struct Job {
    pub key: PortKey,
    pub from: String,
    pub from_netns: Arc<File>,
    pub to: String,
    pub to_uid: usize,
    /// The target (ClusterIP or pod address) in the family probed.
    pub addr: IpAddr,
}

/// What a set of probes saw, per family and port key.
pub type Results = BTreeMap<(IpFamily, PortKey), Observed>;

static NONCE: AtomicU32 = AtomicU32::new(0);

pub fn nonce() -> u32 {
    // Unique within the process and never 0 (an SCTP initiate tag must not be 0).
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    loop {
        let n = seed.wrapping_add(NONCE.fetch_add(1, Ordering::Relaxed));
        if n != 0 {
            return n;
        }
    }
}

/// The source port each probe left from, per family, port key and (from, to): with the
/// addresses, what names the probe's flow in a deny log.
pub type SourcePorts = BTreeMap<(IpFamily, PortKey), BTreeMap<(String, String), u16>>;

/// Runs every job on `workers` threads and returns what each pair saw per family and port
/// key, and the source port of each probe.
pub fn run(
    jobs: Vec<Job>,
    workers: usize,
    timeout: Duration,
    sctp: &SctpLog,
) -> (Results, SourcePorts) {
    let queue = Mutex::new(jobs);
    let results: Mutex<Results> = Mutex::new(BTreeMap::new());
    let ports: Mutex<SourcePorts> = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| {
                let mut inside: Option<Arc<File>> = None;
                loop {
                    let Some(job) = queue.lock().expect("not poisoned").pop() else {
                        break;
                    };
                    let entered = inside
                        .as_ref()
                        .is_some_and(|f| Arc::ptr_eq(f, &job.from_netns));
                    let (outcome, src_port) = if entered || enter(&job.from_netns).is_ok() {
                        inside = Some(job.from_netns.clone());
                        probe(&job, timeout, sctp)
                    } else {
                        (
                            Outcome::WrongPeer("cannot enter the source namespace".into()),
                            None,
                        )
                    };
                    if let Some(port) = src_port {
                        ports
                            .lock()
                            .expect("not poisoned")
                            .entry((IpFamily::of(&job.addr), job.key))
                            .or_default()
                            .insert((job.from.clone(), job.to.clone()), port);
                    }
                    results
                        .lock()
                        .expect("not poisoned")
                        .entry((IpFamily::of(&job.addr), job.key))
                        .or_default()
                        .insert((job.from.clone(), job.to.clone()), outcome);
                }
            });
        }
    });
    (
        results.into_inner().expect("not poisoned"),
        ports.into_inner().expect("not poisoned"),
    )
}

/// The outcome, and the source port the probe left from (when it left).
fn probe(job: &Job, timeout: Duration, sctp: &SctpLog) -> (Outcome, Option<u16>) {
    let addr = SocketAddr::new(job.addr, job.key.port);
    match job.key.protocol {
        Protocol::Tcp => tcp(addr, &job.to, timeout),
        Protocol::Udp => udp(addr, &job.to, timeout),
        Protocol::Sctp => sctp_init(job, timeout, sctp),
    }
}

/// Source ports the probes take in turn, across the whole process. Left to the kernel, a
/// bound port is chosen at random, so a flow (source pod, destination, port) probed in two
/// steps a few seconds apart sometimes leaves from the same port again, and the agent rightly
/// writes one deny line for both (its dedup window is per 5-tuple): the later step's probe
/// then has no line of its own. Taken in turn, a flow's source port comes back only after
/// the whole range has been used (tens of thousands of probes later).
pub(crate) const SOURCE_PORTS: std::ops::RangeInclusive<u16> = 32768..=60999;

/// A port taken by a socket of the pod (a server, a lingering connection) is skipped.
const BIND_TRIES: usize = 64;

fn next_source_port() -> u16 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let span = u32::from(SOURCE_PORTS.end() - SOURCE_PORTS.start()) + 1;
    let next = NEXT.get_or_init(|| {
        // A random start, so two runs back to back do not reuse each other's ports either.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        AtomicU32::new(nanos ^ std::process::id())
    });
    let offset = next.fetch_add(1, Ordering::Relaxed) % span;
    SOURCE_PORTS.start() + u16::try_from(offset).expect("offset is below the span")
}

/// The unspecified address of `addr`'s family with a source port taken in turn; the
/// kernel's choice (port 0) only when every try is taken.
fn bind_in_turn(addr: SocketAddr, mut bind: impl FnMut(SocketAddr) -> bool) -> bool {
    let any = match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    (0..BIND_TRIES).any(|_| bind(SocketAddr::new(any, next_source_port())))
        || bind(SocketAddr::new(any, 0))
}

fn local_port(socket: &Socket) -> Option<u16> {
    socket.local_addr().ok()?.as_socket().map(|a| a.port())
}

fn tcp(addr: SocketAddr, to: &str, timeout: Duration) -> (Outcome, Option<u16>) {
    let start = Instant::now();
    let Ok(socket) = Socket::new(
        Domain::for_address(addr),
        Type::STREAM,
        Some(SockProtocol::TCP),
    ) else {
        return (Outcome::WrongPeer("cannot open a TCP socket".into()), None);
    };
    // Bound first, so the source port is known even when the connection never completes.
    if !bind_in_turn(addr, |local| socket.bind(&local.into()).is_ok()) {
        return (Outcome::WrongPeer("cannot bind a TCP socket".into()), None);
    }
    let port = local_port(&socket);
    if socket.connect_timeout(&addr.into(), timeout).is_err() {
        return (Outcome::Blocked, port);
    }
    let mut stream: std::net::TcpStream = socket.into();
    let left = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(200));
    let _ = stream.set_read_timeout(Some(left));
    let mut answer = String::new();
    let outcome = match stream.read_to_string(&mut answer) {
        Ok(_) if answer.trim() == to => Outcome::Connected,
        Ok(_) => Outcome::WrongPeer(answer.trim().to_string()),
        Err(e) => Outcome::WrongPeer(format!("connected, then no identity: {e}")),
    };
    (outcome, port)
}

fn udp(addr: SocketAddr, to: &str, timeout: Duration) -> (Outcome, Option<u16>) {
    let mut bound = None;
    bind_in_turn(addr, |local| {
        bound = std::net::UdpSocket::bind(local).ok();
        bound.is_some()
    });
    let Some(socket) = bound else {
        return (Outcome::WrongPeer("cannot open a UDP socket".into()), None);
    };
    let port = socket.local_addr().ok().map(|a| a.port());
    (udp_probe(&socket, addr, to, timeout), port)
}

fn udp_probe(
    socket: &std::net::UdpSocket,
    addr: SocketAddr,
    to: &str,
    timeout: Duration,
) -> Outcome {
    let n = nonce();
    if socket.connect(addr).is_err() || socket.send(n.to_string().as_bytes()).is_err() {
        return Outcome::Blocked;
    }
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Blocked;
        }
        let _ = socket.set_read_timeout(Some(left));
        // A refused port (ICMP unreachable) ends the wait at once: nothing serves it.
        let Ok(len) = socket.recv(&mut buf) else {
            return Outcome::Blocked;
        };
        let answer = String::from_utf8_lossy(&buf[..len]);
        let Some((who, echoed)) = answer.rsplit_once(' ') else {
            continue;
        };
        if echoed != n.to_string() {
            continue; // a late answer to an earlier probe
        }
        return if who == to {
            Outcome::Connected
        } else {
            Outcome::WrongPeer(who.to_string())
        };
    }
}

fn sctp_init(job: &Job, timeout: Duration, log: &SctpLog) -> (Outcome, Option<u16>) {
    // A raw socket of the target's family: the kernel writes the IP header (IPv4 and IPv6
    // alike) and our CRC32c needs no pseudo-header.
    let dest = SocketAddr::new(job.addr, 0);
    let Ok(socket) = Socket::new(
        Domain::for_address(dest),
        Type::RAW,
        Some(SockProtocol::from(SCTP_PROTOCOL)),
    ) else {
        return (
            Outcome::WrongPeer("cannot open a raw SCTP socket".into()),
            None,
        );
    };
    let tag = nonce();
    // Taken in turn like the TCP and UDP probes' (a raw socket binds nothing): a random port
    // could meet an earlier probe's of the same flow, whose conntrack entry it would ride on.
    let src_port = next_source_port();
    let packet = crate::sctp::init_packet(src_port, job.key.port, tag);
    if socket.send_to(&packet, &dest.into()).is_err() {
        return (Outcome::Blocked, None);
    }
    let outcome = if log.wait_for((job.to_uid, job.key.port, tag), timeout) {
        Outcome::Connected
    } else {
        Outcome::Blocked
    };
    (outcome, Some(src_port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_come_in_turn_and_skip_taken_ones() {
        let addr: SocketAddr = "[fd00::1]:80".parse().expect("an address");
        let mut tried = Vec::new();
        // The first three ports tried are taken: the fourth is bound.
        assert!(bind_in_turn(addr, |local| {
            assert!(local.is_ipv6() && local.ip().is_unspecified());
            tried.push(local.port());
            tried.len() > 3
        }));
        assert_eq!(tried.len(), 4);
        assert!(tried.iter().all(|p| SOURCE_PORTS.contains(p)));
        // In turn (other tests may take ports in between, never the same one twice in a row).
        assert!(tried.windows(2).all(|w| w[0] != w[1]));
        let distinct: std::collections::BTreeSet<u16> = tried.iter().copied().collect();
        assert_eq!(distinct.len(), 4);

        // Every try taken: the kernel's choice is the last resort.
        let mut last = None;
        assert!(!bind_in_turn(addr, |local| {
            last = Some(local.port());
            false
        }));
        assert_eq!(last, Some(0));
    }
}
