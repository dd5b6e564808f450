//! The NFLOG reader against a real kernel: a node namespace drops probes from a peer namespace
//! with NFLOG + DROP rules in INPUT, and the reader (bound in the node namespace) must get each
//! probe with its prefix and decoded flow within one second; IPv4 and IPv6; TCP SYN, UDP, a
//! crafted SCTP INIT and ICMP echo. Also: the group is exclusive and unbound on stop, and
//! losses (a receive buffer overrun) are counted exactly from the kernel's sequence numbers.

mod common;
mod nf_pair;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::in_netns;
use netpol_agent::host::nflog::decode::{
    IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
};
use netpol_agent::host::nflog::{Config, Error, LogPacket, NflogSocket, Reader, L4};
use nf_pair::{addr, echo, sctp_init, tcp_syn, udp, Pair, NODE4, NODE6, NODE_IF, PEER4, PEER6};

const GROUP: u16 = 5;

/// NFLOG + DROP for each probe's port in INPUT, one prefix per protocol.
fn deny_rules() -> String {
    let mut r = String::from("*filter\n");
    for (proto, port) in [("tcp", 7001), ("udp", 7002), ("sctp", 7003)] {
        r.push_str(&format!(
            "-A INPUT -i {NODE_IF} -p {proto} -m {proto} --dport {port} -j NFLOG --nflog-prefix npa-pol-in-{proto} --nflog-group {GROUP} --nflog-size 128\n\
             -A INPUT -i {NODE_IF} -p {proto} -m {proto} --dport {port} -j DROP\n"
        ));
    }
    r
}

/// Drops echo requests only: IPv6 neighbour discovery is ICMPv6 too.
fn icmp_rules(icmp: &str) -> String {
    let (module, kind) = match icmp {
        "icmp" => ("-m icmp --icmp-type", "8"),
        _ => ("-m icmp6 --icmpv6-type", "128"),
    };
    format!(
        "-A INPUT -i {NODE_IF} -p {icmp} {module} {kind} -j NFLOG --nflog-prefix npa-pol-in-{icmp} --nflog-group {GROUP} --nflog-size 128\n\
         -A INPUT -i {NODE_IF} -p {icmp} {module} {kind} -j DROP\nCOMMIT\n"
    )
}

fn start_reader(pair: &Pair, config: Config) -> (Reader, mpsc::Receiver<(Instant, LogPacket)>) {
    let (tx, rx) = mpsc::channel();
    let reader = in_netns(&pair.node.name, || {
        Reader::spawn(config, move |p| {
            let _ = tx.send((Instant::now(), p));
        })
    })
    .expect("binding the NFLOG group");
    (reader, rx)
}

/// Waits up to one second from `sent` for the packet with `prefix`; returns it with the delay.
fn expect_packet(
    rx: &mpsc::Receiver<(Instant, LogPacket)>,
    prefix: &str,
    sent: Instant,
) -> (LogPacket, Duration) {
    let deadline = sent + Duration::from_secs(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, p)) if p.prefix == prefix => return (p, at - sent),
            Ok(_) => continue,
            Err(_) => panic!("no NFLOG message with prefix {prefix} within one second"),
        }
    }
}

#[test]
fn denied_probes_are_read_with_prefix_and_flow_within_a_second_legacy() {
    denied_probes("legacy");
}

#[test]
fn denied_probes_are_read_with_prefix_and_flow_within_a_second_nft() {
    denied_probes("nft");
}

/// Receive timestamps on while it lives. The kernel stamps a received packet (and so NFLOG
/// sends `NFULA_TIMESTAMP` for it) only while some socket anywhere asked for timestamps
/// (`SO_TIMESTAMP`: the global `netstamp_needed` key). A busy host always has one (chrony,
/// dhclient, ...); a fresh VM has none, and then no message carries a timestamp (the agent
/// then uses the time it read the message). This socket makes the test's premise hold.
fn receive_timestamps_on() -> std::os::fd::OwnedFd {
    use nix::sys::socket::{setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a UDP socket");
    setsockopt(&fd, sockopt::ReceiveTimestamp, &true).expect("SO_TIMESTAMP");
    fd
}

fn denied_probes(backend: &str) {
    // First: the kernel switches stamping on from a work queue, shortly after.
    let _stamps = receive_timestamps_on();
    let pair = Pair::new(&format!("nflog-probes-{backend}"));
    pair.restore(
        &format!("iptables-{backend}"),
        &(deny_rules() + &icmp_rules("icmp")),
    );
    pair.restore(
        &format!("ip6tables-{backend}"),
        &(deny_rules() + &icmp_rules("ipv6-icmp")),
    );
    let (reader, rx) = start_reader(
        &pair,
        Config {
            group: GROUP,
            ..Config::default()
        },
    );

    for (node, peer, icmp_prefix, icmp_proto) in [
        (NODE4, PEER4, "npa-pol-in-icmp", IPPROTO_ICMP),
        (NODE6, PEER6, "npa-pol-in-ipv6-icmp", IPPROTO_ICMPV6),
    ] {
        let (node, peer) = (addr(node), addr(peer));
        let family = if node.is_ipv4() { 2 } else { 10 };
        let check = |p: &LogPacket, proto: u8, l4: L4| {
            assert_eq!(p.group, GROUP);
            assert_eq!(p.family, family);
            assert_eq!(p.hook, Some(1), "INPUT");
            assert!(p.in_ifindex.is_some() && p.out_ifindex.is_none());
            assert!(p.timestamp.is_some(), "the input hook carries a timestamp");
            assert!(p.payload.len() <= 128, "snap length");
            let flow = p.flow().unwrap();
            assert_eq!(
                (flow.src, flow.dst, flow.protocol, flow.l4),
                (peer, node, proto, l4)
            );
        };

        let sent = Instant::now();
        let syn = tcp_syn(&pair.peer, SocketAddr::new(node, 7001));
        let (p, delay) = expect_packet(&rx, "npa-pol-in-tcp", sent);
        let sport = p.flow().unwrap().src_port().unwrap();
        check(
            &p,
            IPPROTO_TCP,
            L4::Ports {
                src: sport,
                dst: 7001,
            },
        );
        assert_eq!(
            syn.local_addr().unwrap().as_socket().unwrap().port(),
            sport,
            "the logged SYN is ours"
        );
        println!("{backend} {node} tcp logged after {delay:?}");
        drop(syn);

        let sent = Instant::now();
        udp(&pair.peer, SocketAddr::new(node, 7002), b"probe");
        let (p, delay) = expect_packet(&rx, "npa-pol-in-udp", sent);
        let sport = p.flow().unwrap().src_port().unwrap();
        check(
            &p,
            IPPROTO_UDP,
            L4::Ports {
                src: sport,
                dst: 7002,
            },
        );
        println!("{backend} {node} udp logged after {delay:?}");

        let sent = Instant::now();
        sctp_init(&pair.peer, SocketAddr::new(node, 7003), 40123, 0xfeed_f00d);
        let (p, delay) = expect_packet(&rx, "npa-pol-in-sctp", sent);
        check(
            &p,
            IPPROTO_SCTP,
            L4::Ports {
                src: 40123,
                dst: 7003,
            },
        );
        println!("{backend} {node} sctp logged after {delay:?}");

        let sent = Instant::now();
        echo(&pair.peer, node, 0x4242);
        let (p, delay) = expect_packet(&rx, icmp_prefix, sent);
        let kind = if node.is_ipv4() { 8 } else { 128 };
        check(&p, icmp_proto, L4::Icmp { kind, code: 0 });
        println!("{backend} {node} icmp logged after {delay:?}");
    }

    let counters = reader.counters().snapshot();
    assert!(counters.received >= 8, "{counters:?}");
    assert_eq!(
        (counters.lost, counters.overruns, counters.undecodable),
        (0, 0, 0)
    );
    assert_eq!(reader.failure(), None);
    reader.stop().unwrap();
}

fn bound_groups(pair: &Pair) -> Vec<u16> {
    pair.node
        .exec_ok(&["cat", "/proc/net/netfilter/nfnetlink_log"])
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn the_group_is_exclusive_and_unbound_when_the_reader_stops() {
    let pair = Pair::new("nflog-bind");
    assert!(
        bound_groups(&pair).is_empty(),
        "nothing bound before the reader starts"
    );
    let (reader, _rx) = start_reader(
        &pair,
        Config {
            group: GROUP,
            ..Config::default()
        },
    );
    assert_eq!(bound_groups(&pair), vec![GROUP]);

    let second = in_netns(&pair.node.name, || {
        NflogSocket::open(&Config {
            group: GROUP,
            ..Config::default()
        })
    });
    match second {
        Err(Error::GroupBusy { group }) => assert_eq!(group, GROUP),
        other => panic!("a second bind of the group must fail as busy, got {other:?}"),
    }
    // The failed attempt must not have unbound the reader's group.
    assert_eq!(bound_groups(&pair), vec![GROUP]);

    let started = Instant::now();
    reader.stop().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stop waits one poll interval at most"
    );
    assert!(bound_groups(&pair).is_empty(), "stopping unbinds the group");
}

#[test]
fn an_overrun_is_counted_and_the_sequence_gap_says_exactly_how_many_were_lost() {
    let pair = Pair::new("nflog-overrun");
    pair.restore(
        "iptables-legacy",
        &format!(
            "*filter\n-A INPUT -i {NODE_IF} -p udp -m udp --dport 7009 -j NFLOG --nflog-prefix flood --nflog-group {GROUP} --nflog-size 128\n\
             -A INPUT -i {NODE_IF} -p udp -m udp --dport 7009 -j DROP\nCOMMIT\n"
        ),
    );
    // A socket with a tiny buffer that nobody reads while the flood arrives.
    let mut socket = in_netns(&pair.node.name, || {
        NflogSocket::open(&Config {
            group: GROUP,
            receive_buffer: 4096,
            ..Config::default()
        })
    })
    .unwrap();
    let dst = SocketAddr::new(addr(NODE4), 7009);
    let sent: u64 = 500;
    in_netns(&pair.peer.name, || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..sent {
            s.send_to(&i.to_be_bytes(), dst).unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut received = 0;
    // An overrun read returns nothing at once; the buffered messages follow.
    let mut idle = 0;
    while idle < 3 {
        match socket
            .read(Duration::from_millis(100), |_| received += 1)
            .unwrap()
        {
            0 => idle += 1,
            _ => idle = 0,
        }
    }
    // One more packet after the buffer drained: its sequence number shows the gap.
    nf_pair::udp(&pair.peer, dst, b"last");
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        socket
            .read(Duration::from_millis(100), |_| received += 1)
            .unwrap();
    }
    let c = socket.counters().snapshot();
    println!("sent {} received {received} counters {c:?}", sent + 1);
    assert!(c.overruns >= 1, "the tiny buffer overflowed: {c:?}");
    assert!(c.lost > 0, "{c:?}");
    assert_eq!(c.received, received);
    assert_eq!(
        c.received + c.lost,
        sent + 1,
        "every message the kernel sequenced is either received or counted as lost"
    );
}

/// Flow logs ask the kernel to batch (`flush_threshold`, `batch_bytes`): many messages arrive
/// in one datagram, none is lost or counted twice, and a batch short of the threshold still
/// comes within the flush timeout.
#[test]
fn batched_messages_arrive_together_all_of_them_and_within_the_timeout() {
    let pair = Pair::new("nflog-batch");
    pair.restore(
        "iptables-legacy",
        &format!(
            "*filter\n-A INPUT -i {NODE_IF} -p udp -m udp --dport 7010 -j NFLOG --nflog-prefix batch --nflog-group {GROUP} --nflog-size 128\n\
             -A INPUT -i {NODE_IF} -p udp -m udp --dport 7010 -j DROP\nCOMMIT\n"
        ),
    );
    let mut socket = in_netns(&pair.node.name, || {
        NflogSocket::open(&Config {
            group: GROUP,
            flush_threshold: 64,
            flush_timeout: Duration::from_millis(100),
            batch_bytes: Some(netpol_agent::host::nflog::MAX_BATCH_BYTES),
            ..Config::default()
        })
    })
    .unwrap();
    let dst = SocketAddr::new(addr(NODE4), 7010);
    // 200 = three full batches of 64 and 8 left for the timeout to send.
    let sent: u64 = 200;
    in_netns(&pair.peer.name, || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..sent {
            s.send_to(&i.to_be_bytes(), dst).unwrap();
        }
    });
    let start = Instant::now();
    let (mut received, mut largest, mut datagrams) = (0u64, 0usize, 0u64);
    while received < sent && start.elapsed() < Duration::from_secs(2) {
        let n = socket
            .read(Duration::from_millis(50), |p| {
                assert_eq!(p.prefix, "batch");
                received += 1;
            })
            .unwrap();
        if n > 0 {
            datagrams += 1;
            largest = largest.max(n);
        }
    }
    let waited = start.elapsed();
    let c = socket.counters().snapshot();
    println!(
        "received {received} in {datagrams} datagrams (largest {largest}) in {waited:?}: {c:?}"
    );
    assert_eq!(received, sent, "every message arrives: {c:?}");
    assert_eq!((c.lost, c.overruns), (0, 0));
    assert!(
        largest >= 32,
        "the kernel batched: at most {largest} messages per datagram"
    );
    assert!(
        datagrams < sent / 8,
        "{datagrams} datagrams for {sent} messages"
    );
    assert!(
        waited < Duration::from_secs(1),
        "the tail short of a batch came with the timeout, not never: {waited:?}"
    );
}
