//! Deny-log flood benchmark: what a flood of denied SYNs costs the NFLOG reader, with and
//! without the kernel's rate limit. Prints figures, asserts nothing about time.
//!
//! `cargo bench --bench nflog_flood` must run as root. It builds a node and a peer network
//! namespace joined by a veth (`npa-test-<pid>-*`, deleted on exit and on panic), puts in the
//! node's INPUT chain a deny-log rule rendered by `nflog::rule` in front of a DROP for TCP port
//! 7500, and binds an `nflog::Reader` there whose sink does what the agent's will (decode the
//! flow, deduplicate per 5-tuple over 5 s). A thread in the peer sends TCP SYNs from a raw
//! socket at `NPA_FLOOD_PPS` (default 20000) packets per second for `NPA_FLOOD_SECS` (default
//! 10) seconds, each from a new source port (every SYN a new flow: the worst case for
//! deduplication). Three scenarios, in one run:
//! - idle: the reader bound, no traffic, for the same duration (the baseline);
//! - limited: `-m limit --limit 10/sec --limit-burst 20` (the recommended rule);
//! - unlimited: the same rule without `-m limit` (what the limit saves).
//!
//! Per scenario: SYNs sent, NFLOG messages received, lost (sequence gaps) and overruns,
//! lines the deduplicator let through, and the reader thread's CPU time (the scheduler's run
//! time of the thread named `nflog-1`, from /proc) as a share of one core and as a ratio to
//! idle.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/nf_pair/mod.rs"]
mod nf_pair;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::in_netns;
use netpol_agent::host::nflog::dedup::{Dedup, Verdict};
use netpol_agent::host::nflog::{Config, Reader};
use netpol_agent::rules::deny_log::{limit_match, nflog_target, Rate, DEFAULT_SNAP_LEN};
use nf_pair::{Pair, NODE4, NODE_IF, PEER4};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const GROUP: u16 = 1;
const PORT: u16 = 7500;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds used so far by this process's thread named `name`: the scheduler's
/// `se.sum_exec_runtime` (milliseconds with nanosecond precision, `/proc/<tid>/sched`), or
/// utime + stime in clock ticks where that file is missing. A new thread names itself, so it
/// is looked for during a second.
fn thread_cpu(name: &str) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some(cpu) = thread_cpu_once(name) {
            return Some(cpu);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn thread_cpu_once(name: &str) -> Option<f64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir = task.path();
        // Threads come and go while we look (the namespace helpers' threads).
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim() != name {
            continue;
        }
        if let Some(ms) = std::fs::read_to_string(dir.join("sched"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("se.sum_exec_runtime"))?
                    .split(':')
                    .nth(1)?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
        {
            return Some(ms / 1e3);
        }
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()? as f64;
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // After the parenthesised command: utime and stime are the 12th and 13th fields.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        return Some((utime + stime) / ticks);
    }
    None
}

fn tcp_syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = 0x02; // SYN
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    // Checksum over the pseudo-header (addresses, protocol, length) and the header.
    let mut sum: u32 = 0;
    for chunk in src.octets().chunks(2).chain(dst.octets().chunks(2)) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    sum += 6 + 20;
    for chunk in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}

/// Sends `pps` SYNs per second for `secs` from the peer; returns how many were sent.
fn flood(pair: &Pair, pps: u64, secs: u64) -> u64 {
    let src: Ipv4Addr = PEER4.parse().unwrap();
    let dst: Ipv4Addr = NODE4.parse().unwrap();
    let socket = in_netns(&pair.peer.name, || {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)).unwrap();
        s.bind(&SockAddr::from(SocketAddr::new(IpAddr::V4(src), 0)))
            .unwrap();
        s
    });
    let target = SockAddr::from(SocketAddr::new(IpAddr::V4(dst), 0));
    let start = Instant::now();
    let total = pps * secs;
    let mut sent = 0u64;
    while sent < total {
        // Send what the schedule says is due, then sleep a millisecond.
        let due = ((start.elapsed().as_secs_f64() * pps as f64) as u64).min(total);
        while sent < due {
            let sport = 1024 + (sent % 64000) as u16;
            let syn = tcp_syn(src, dst, sport, PORT, sent as u32);
            if socket.send_to(&syn, &target).is_ok() {
                sent += 1;
            } else {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}

struct Figures {
    sent: u64,
    received: u64,
    lost: u64,
    overruns: u64,
    lines: u64,
    suppressed: u64,
    cpu: f64,
    wall: f64,
}

fn scenario(limit: Option<&str>, pps: u64, secs: u64) -> Figures {
    let pair = Pair::new("bench-flood");
    let target = nflog_target(GROUP, "npa-pol-in-cali-tw-flood", DEFAULT_SNAP_LEN).unwrap();
    let log_rule = match limit {
        Some(l) => format!("{l} {target}"),
        None => target,
    };
    pair.restore(
        "iptables-legacy",
        &format!(
            "*filter\n-A INPUT -i {NODE_IF} -p tcp -m tcp --dport {PORT} {log_rule}\n\
             -A INPUT -i {NODE_IF} -p tcp -m tcp --dport {PORT} -j DROP\nCOMMIT\n"
        ),
    );
    let lines = Arc::new(AtomicU64::new(0));
    let suppressed = Arc::new(AtomicU64::new(0));
    let reader = {
        let lines = lines.clone();
        let suppressed = suppressed.clone();
        let mut dedup = Dedup::new(Duration::from_secs(5), 65_536);
        in_netns(&pair.node.name, || {
            Reader::spawn(
                Config {
                    group: GROUP,
                    ..Config::default()
                },
                move |packet| {
                    let Ok(flow) = packet.flow() else { return };
                    match dedup.observe(&(packet.prefix.clone(), flow), Instant::now()) {
                        Verdict::Report { .. } => lines.fetch_add(1, Ordering::Relaxed),
                        Verdict::Suppress => suppressed.fetch_add(1, Ordering::Relaxed),
                    };
                },
            )
        })
        .expect("binding the NFLOG group")
    };
    let thread = format!("nflog-{GROUP}");
    let cpu0 = thread_cpu(&thread).expect("the reader thread");
    let started = Instant::now();
    let sent = if pps == 0 {
        std::thread::sleep(Duration::from_secs(secs));
        0
    } else {
        flood(&pair, pps, secs)
    };
    // Let the reader drain what is queued.
    std::thread::sleep(Duration::from_millis(500));
    let wall = started.elapsed().as_secs_f64();
    let cpu = thread_cpu(&thread).expect("the reader thread") - cpu0;
    let c = reader.counters().snapshot();
    reader.stop().expect("stopping the reader");
    Figures {
        sent,
        received: c.received,
        lost: c.lost,
        overruns: c.overruns,
        lines: lines.load(Ordering::Relaxed),
        suppressed: suppressed.load(Ordering::Relaxed),
        cpu,
        wall,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pps = env_u64("NPA_FLOOD_PPS", 20_000);
    let secs = env_u64("NPA_FLOOD_SECS", 10);
    let limited = limit_match(Rate::per_second(10), 20).unwrap();
    println!("nflog flood: {pps} denied SYNs/s for {secs} s, each from a new source port");
    let idle = scenario(None, 0, secs);
    let rows = [
        ("idle (baseline)", idle),
        ("limited", scenario(Some(&limited), pps, secs)),
        ("unlimited", scenario(None, pps, secs)),
    ];
    let base = rows[0].1.cpu.max(1e-6);
    println!(
        "{:<16} {:>8} {:>9} {:>8} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9}",
        "scenario",
        "sent",
        "received",
        "lost",
        "overruns",
        "lines",
        "suppressed",
        "cpu s",
        "cpu %",
        "vs idle"
    );
    for (name, f) in &rows {
        println!(
            "{:<16} {:>8} {:>9} {:>8} {:>9} {:>7} {:>10} {:>9.4} {:>8.3}% {:>8.1}x",
            name,
            f.sent,
            f.received,
            f.lost,
            f.overruns,
            f.lines,
            f.suppressed,
            f.cpu,
            100.0 * f.cpu / f.wall,
            f.cpu / base
        );
    }
    println!("limited rule: {limited}");
}
