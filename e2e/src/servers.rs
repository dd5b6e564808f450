//! What each pod serves: a TCP listener that answers with the pod's identity, a UDP socket
//! that echoes the probe's nonce with the identity, and for SCTP (no SCTP sockets in this
//! kernel) a raw socket that records every INIT chunk reaching a port the pod declares; one
//! set per IP family the cluster has.
//! Answering with the identity catches a probe that reached the wrong pod (a DNAT fault)
//! instead of counting it as connected.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use netpol_agent::model::IpFamily;
use socket2::{Domain, Protocol as SockProtocol, Socket, Type};

use crate::scenario::{Pod, Protocol};

/// How often blocked server threads look at their stop flag.
const POLL: Duration = Duration::from_millis(100);
pub const SCTP_PROTOCOL: i32 = 132;

/// INIT chunks seen by the pods' SCTP observers: (pod uid, destination port, initiate tag).
#[derive(Default)]
pub struct SctpLog {
    seen: Mutex<HashSet<(usize, u16, u32)>>,
    changed: Condvar,
}

impl SctpLog {
    fn record(&self, entry: (usize, u16, u32)) {
        self.seen.lock().expect("not poisoned").insert(entry);
        self.changed.notify_all();
    }

    /// Whether an INIT with initiate tag `tag` reached any pod (tags are unique).
    pub fn seen_tag(&self, tag: u32) -> bool {
        self.seen
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|&(_, _, t)| t == tag)
    }

    /// Waits until `entry` was seen or `timeout` passes.
    pub fn wait_for(&self, entry: (usize, u16, u32), timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut seen = self.seen.lock().expect("not poisoned");
        loop {
            if seen.remove(&entry) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            seen = self
                .changed
                .wait_timeout(seen, left)
                .expect("not poisoned")
                .0;
        }
    }
}

/// The serving threads of one pod; stopping them closes every socket, so the pod's
/// namespace can go away.
pub struct PodServers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PodServers {
    /// Serves the pod's ports on every family of `families` (one socket each, IPv6 sockets
    /// IPv6-only, so each family is served by its own).
    /// With `spoof_tags`, also raw TCP and UDP observers for the spoofing check.
    pub fn start(
        netns: &File,
        pod: &Pod,
        families: &[IpFamily],
        sctp: Arc<SctpLog>,
        spoof_tags: Option<Arc<crate::tags::TagLog>>,
    ) -> anyhow::Result<PodServers> {
        let identity = pod.key();
        let sockets = crate::netns::in_netns(netns, || {
            let mut all = Vec::new();
            for &family in families {
                all.extend(open_sockets(pod, family)?);
                if spoof_tags.is_some() {
                    for (s, protocol) in
                        crate::tags::observer_sockets(family).context("raw observer socket")?
                    {
                        all.push(Served::Observer(s, family, protocol));
                    }
                }
            }
            anyhow::Ok(all)
        })??;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for socket in sockets {
            let stop = stop.clone();
            let identity = identity.clone();
            let thread = match socket {
                Served::Tcp(s) => std::thread::spawn(move || serve_tcp(s, &identity, &stop)),
                Served::Udp(s) => std::thread::spawn(move || serve_udp(s, &identity, &stop)),
                Served::Sctp(s, ports, family) => {
                    let log = sctp.clone();
                    let uid = pod.uid;
                    std::thread::spawn(move || observe_sctp(s, family, uid, &ports, &log, &stop))
                }
                Served::Observer(s, family, protocol) => {
                    let log = spoof_tags.clone().expect("observers only with a tag log");
                    std::thread::spawn(move || {
                        crate::tags::observe(s, family, protocol, &log, &stop)
                    })
                }
            };
            threads.push(thread);
        }
        Ok(PodServers { stop, threads })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for PodServers {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Served {
    Tcp(Socket),
    Udp(Socket),
    Sctp(Socket, Vec<u16>, IpFamily),
    /// A raw TCP or UDP observer of the spoofing check.
    Observer(Socket, IpFamily, u8),
}

/// A socket of `domain`; IPv6 TCP and UDP ones IPv6-only (the IPv4 family has sockets of
/// its own; a raw IPv6 socket only ever sees IPv6 and refuses the option).
fn socket(domain: Domain, kind: Type, protocol: SockProtocol) -> std::io::Result<Socket> {
    let s = Socket::new(domain, kind, Some(protocol))?;
    if domain == Domain::IPV6 && kind != Type::RAW {
        s.set_only_v6(true)?;
    }
    Ok(s)
}

fn open_sockets(pod: &Pod, family: IpFamily) -> anyhow::Result<Vec<Served>> {
    let mut out = Vec::new();
    let mut sctp_ports = Vec::new();
    let (domain, any) = match family {
        IpFamily::V4 => (Domain::IPV4, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        IpFamily::V6 => (Domain::IPV6, IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    for p in &pod.ports {
        let addr = SocketAddr::new(any, p.port);
        match p.protocol {
            Protocol::Tcp => {
                let s = socket(domain, Type::STREAM, SockProtocol::TCP)?;
                s.set_reuse_address(true)?;
                s.bind(&addr.into())
                    .with_context(|| format!("{}: bind TCP {}", pod.key(), p.port))?;
                s.listen(128)?;
                s.set_read_timeout(Some(POLL))?;
                out.push(Served::Tcp(s));
            }
            Protocol::Udp => {
                let s = socket(domain, Type::DGRAM, SockProtocol::UDP)?;
                s.bind(&addr.into())
                    .with_context(|| format!("{}: bind UDP {}", pod.key(), p.port))?;
                s.set_read_timeout(Some(POLL))?;
                out.push(Served::Udp(s));
            }
            Protocol::Sctp => sctp_ports.push(p.port),
        }
    }
    if !sctp_ports.is_empty() {
        let s = socket(domain, Type::RAW, SockProtocol::from(SCTP_PROTOCOL))
            .context("raw SCTP socket")?;
        s.set_read_timeout(Some(POLL))?;
        out.push(Served::Sctp(s, sctp_ports, family));
    }
    Ok(out)
}

fn serve_tcp(listener: Socket, identity: &str, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok((conn, _)) = listener.accept() {
            let mut stream: std::net::TcpStream = conn.into();
            let _ = stream.set_write_timeout(Some(POLL));
            let _ = stream.write_all(format!("{identity}\n").as_bytes());
        }
    }
}

fn serve_udp(socket: Socket, identity: &str, stop: &AtomicBool) {
    let socket: std::net::UdpSocket = socket.into();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let nonce = String::from_utf8_lossy(&buf[..n]);
        let reply = format!("{identity} {}", nonce.trim());
        let _ = socket.send_to(reply.as_bytes(), from);
    }
}

fn observe_sctp(
    socket: Socket,
    family: IpFamily,
    uid: usize,
    ports: &[u16],
    log: &SctpLog,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = (&socket).read(&mut buf) else {
            continue;
        };
        let init = match family {
            IpFamily::V4 => crate::sctp::parse_init(&buf[..n]),
            IpFamily::V6 => crate::sctp::parse_init_v6(&buf[..n]),
        };
        if let Some((port, tag)) = init {
            if ports.contains(&port) {
                log.record((uid, port, tag));
            }
        }
    }
}
