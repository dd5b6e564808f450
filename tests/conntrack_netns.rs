//! Conntrack listing and deletion against a real kernel, in a node namespace whose INPUT
//! chain is shaped like the agent's pod chains: RELATED,ESTABLISHED accepted first, INVALID
//! dropped, then "policy" (here one accept rule for the port) and a final drop. A TCP
//! connection from the peer namespace is established, the policy is tightened (the accept
//! rule removed), and the connection keeps working through the ESTABLISHED shortcut until its
//! conntrack entry is deleted; then its next packet meets policy and is dropped. IPv4 and
//! IPv6. Also: zones, exact deletion by id, and both filtering modes. Never the host's table.

mod common;
mod nf_pair;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::in_netns;
use netpol_agent::host::conntrack::{
    ConntrackSocket, CtEntry, Deleted, Filtering, Listing, TCP_ESTABLISHED,
};
use nf_pair::{addr, udp, wait_for, Pair, NODE4, NODE6, NODE_IF, PEER4, PEER6};

const PORT: u16 = 7100;

fn tools(node: IpAddr) -> (&'static str, &'static str) {
    if node.is_ipv4() {
        ("iptables-legacy", "iptables-legacy-save")
    } else {
        ("ip6tables-legacy", "ip6tables-legacy-save")
    }
}

fn policy_rules() -> String {
    format!(
        "*filter\n\
         -A INPUT -i {NODE_IF} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A INPUT -i {NODE_IF} -m conntrack --ctstate INVALID -j DROP\n\
         -A INPUT -i {NODE_IF} -p tcp -m tcp --dport {PORT} -j ACCEPT\n\
         -A INPUT -i {NODE_IF} -p tcp -m tcp --dport {PORT} -j DROP\n\
         COMMIT\n"
    )
}

/// Packets dropped by the INVALID rule and the final drop, from the rule counters.
fn dropped(pair: &Pair, save: &str) -> u64 {
    pair.node
        .exec_ok(&[save, "-c", "-t", "filter"])
        .lines()
        .filter(|l| l.ends_with("-j DROP"))
        .filter_map(|l| {
            let counters = l.strip_prefix('[')?.split(']').next()?;
            counters.split(':').next()?.parse::<u64>().ok()
        })
        .sum()
}

fn list(pair: &Pair, addr: IpAddr, filtering: Filtering) -> Listing {
    in_netns(&pair.node.name, || {
        ConntrackSocket::open()
            .unwrap()
            .list_by_addr(addr, filtering)
            .unwrap()
    })
}

fn delete(pair: &Pair, entry: &CtEntry) -> Deleted {
    in_netns(&pair.node.name, || {
        ConntrackSocket::open().unwrap().delete(entry).unwrap()
    })
}

/// Whether `payload` sent on `client` reaches `server` within one second.
fn passes(client: &mut TcpStream, server: &mut TcpStream, payload: &[u8]) -> bool {
    client.write_all(payload).unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buf = vec![0u8; payload.len()];
    match server.read_exact(&mut buf) {
        Ok(()) => {
            assert_eq!(buf, payload);
            true
        }
        Err(_) => false,
    }
}

fn the_tcp_entry(listing: &Listing, peer: IpAddr, node: IpAddr) -> CtEntry {
    let found: Vec<&CtEntry> = listing
        .entries
        .iter()
        .filter(|e| e.original.protocol == 6 && e.original.dst_port == Some(PORT))
        .collect();
    assert_eq!(found.len(), 1, "{listing:#?}");
    let e = found[0].clone();
    assert_eq!((e.original.src, e.original.dst), (peer, node));
    assert_eq!((e.reply.src, e.reply.dst), (node, peer));
    assert_eq!(e.tcp_state, Some(TCP_ESTABLISHED));
    assert_eq!(e.zone, None);
    assert!(e.id.is_some());
    e
}

fn cut_connection(family: &str, node: &str, peer: &str) {
    let pair = Pair::new(&format!("ct-cut{family}"));
    let (node, peer) = (addr(node), addr(peer));
    let (tool, save) = tools(node);
    pair.restore(tool, &policy_rules());
    // The UDP entry below must outlive the whole test: an unreplied UDP entry expires after
    // 30 s, and under emulation (a TCG guest) the test takes longer than that. Per namespace.
    pair.node
        .sh_ok("sysctl -qw net.netfilter.nf_conntrack_udp_timeout=600");

    let listener = in_netns(&pair.node.name, || {
        TcpListener::bind(SocketAddr::new(node, PORT)).unwrap()
    });
    let mut client = in_netns(&pair.peer.name, || {
        TcpStream::connect_timeout(&SocketAddr::new(node, PORT), Duration::from_secs(2)).unwrap()
    });
    let (mut server, _) = listener.accept().unwrap();
    assert!(passes(&mut client, &mut server, b"hello"));
    // Unrelated traffic from the same peer, which the listing must also report (it involves
    // the address) but the test does not delete.
    udp(&pair.peer, SocketAddr::new(node, 7200), b"noise");

    // Policy tightens: the port is no longer allowed. The established connection still
    // passes: the RELATED,ESTABLISHED shortcut never consults policy.
    pair.node.exec_ok(&[
        tool,
        "-D",
        "INPUT",
        "-i",
        NODE_IF,
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        &PORT.to_string(),
        "-j",
        "ACCEPT",
    ]);
    assert!(
        passes(&mut client, &mut server, b"still open"),
        "without re-evaluation the denied connection keeps working"
    );

    let listing = list(&pair, peer, Filtering::Auto);
    println!("{family} listing stats: {:?}", listing.stats);
    assert!(listing.entries.iter().all(|e| e.involves(peer)));
    assert!(
        listing.entries.iter().any(|e| e.original.protocol == 17),
        "the UDP entry is listed too: {listing:#?}"
    );
    assert_eq!(listing.stats.matched as usize, listing.entries.len());
    assert!(listing.stats.walked >= listing.stats.matched);
    let entry = the_tcp_entry(&listing, peer, node);
    // The server's address finds the same connection (it is in both tuples).
    the_tcp_entry(&list(&pair, node, Filtering::Userspace), peer, node);

    let before = dropped(&pair, save);
    assert_eq!(delete(&pair, &entry), Deleted::Deleted);
    assert_eq!(
        delete(&pair, &entry),
        Deleted::Gone,
        "deleting twice finds nothing"
    );
    assert!(
        !passes(&mut client, &mut server, b"cut"),
        "after the entry is deleted, the next packet meets policy and is dropped"
    );
    let after = dropped(&pair, save);
    assert!(
        after > before,
        "the drop rules counted it: {before} -> {after}"
    );
    let remaining = list(&pair, peer, Filtering::Userspace);
    assert!(
        remaining
            .entries
            .iter()
            .all(|e| e.original.dst_port != Some(PORT)),
        "no entry for the cut connection: {remaining:#?}"
    );
    assert!(
        remaining.entries.iter().any(|e| e.original.protocol == 17),
        "the UDP entry is untouched"
    );
}

#[test]
fn deleting_an_ipv4_entry_makes_its_next_packet_meet_policy() {
    cut_connection("4", NODE4, PEER4);
}

#[test]
fn deleting_an_ipv6_entry_makes_its_next_packet_meet_policy() {
    cut_connection("6", NODE6, PEER6);
}

#[test]
fn an_allowed_connection_survives_when_untouched() {
    // The control for the tests above: the same setup without tightening or deletion.
    let pair = Pair::new("ct-keep");
    let (node, peer) = (addr(NODE4), addr(PEER4));
    pair.restore("iptables-legacy", &policy_rules());
    let listener = in_netns(&pair.node.name, || {
        TcpListener::bind(SocketAddr::new(node, PORT)).unwrap()
    });
    let mut client = in_netns(&pair.peer.name, || {
        TcpStream::connect_timeout(&SocketAddr::new(node, PORT), Duration::from_secs(2)).unwrap()
    });
    let (mut server, _) = listener.accept().unwrap();
    for i in 0..3 {
        assert!(passes(
            &mut client,
            &mut server,
            format!("round {i}").as_bytes()
        ));
    }
    the_tcp_entry(&list(&pair, peer, Filtering::Kernel), peer, node);
}

#[test]
fn filtering_modes_agree_and_unrelated_addresses_find_nothing() {
    let pair = Pair::new("ct-modes");
    // Conntrack only tracks a namespace's traffic once a rule there needs it.
    let track = "*filter\n-A INPUT -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n";
    pair.restore("iptables-legacy", track);
    pair.restore("ip6tables-legacy", track);
    for (node, peer) in [(NODE4, PEER4), (NODE6, PEER6)] {
        for port in [7201, 7202, 7203] {
            udp(&pair.peer, SocketAddr::new(addr(node), port), b"x");
        }
        let peer = addr(peer);
        // The first datagram waits for neighbour resolution.
        let user = wait_for(Duration::from_secs(2), || {
            let l = list(&pair, peer, Filtering::Userspace);
            (l.entries.len() == 3).then_some(l)
        })
        .expect("three UDP entries");
        let auto = list(&pair, peer, Filtering::Auto);
        let key = |l: &Listing| {
            let mut k: Vec<_> = l.entries.iter().map(|e| (e.id, e.original)).collect();
            k.sort_by_key(|(id, _)| *id);
            k
        };
        assert_eq!(user.entries.len(), 3, "{user:#?}");
        assert_eq!(key(&user), key(&auto));
        assert!(!user.stats.kernel_filtered);
        assert_eq!(auto.stats.kernel_filtered, peer.is_ipv4());
        println!("{peer}: userspace {:?} / auto {:?}", user.stats, auto.stats);
        let other: IpAddr = if peer.is_ipv4() {
            "10.213.0.99".parse().unwrap()
        } else {
            "fd00:213::99".parse().unwrap()
        };
        for f in [Filtering::Userspace, Filtering::Auto] {
            assert!(list(&pair, other, f).entries.is_empty());
        }
    }
    // The kernel's filter is checked here, so even a wrong kernel filter returns only
    // matching entries. On the kernels we ran, an unrelated IPv4 address makes the four
    // kernel-filtered dumps send nothing, while an unrelated IPv6 address makes them send
    // every entry (12 = 3 entries x 4 dumps): ctnetlink's IPv6 address test is inverted,
    // which is why `Auto` filters IPv6 here.
    for other in ["10.213.0.99", "fd00:213::99"] {
        let l = list(&pair, addr(other), Filtering::Kernel);
        println!("kernel-filtered dumps for unrelated {other}: {:?}", l.stats);
        assert!(l.entries.is_empty());
        assert_eq!(l.stats.matched, 0);
    }
    // IPv4 in the kernel: only matching entries cross, four dumps.
    let v4 = list(&pair, addr(PEER4), Filtering::Kernel);
    assert_eq!(v4.stats.dumps, 4);
    assert_eq!(v4.entries.len(), 3);
}

#[test]
fn zones_are_listed_and_deletion_is_exact() {
    let pair = Pair::new("ct-zone");
    pair.restore(
        "iptables-legacy",
        &format!(
            "*raw\n-A PREROUTING -i {NODE_IF} -p udp -m udp --dport 7300 -j CT --zone 5\nCOMMIT\n"
        ),
    );
    udp(&pair.peer, SocketAddr::new(addr(NODE4), 7300), b"zoned");
    udp(&pair.peer, SocketAddr::new(addr(NODE4), 7301), b"plain");
    // The first datagram waits for neighbour resolution.
    let listing = wait_for(Duration::from_secs(2), || {
        let l = list(&pair, addr(PEER4), Filtering::Auto);
        (l.entries.len() == 2).then_some(l)
    })
    .expect("two UDP entries");
    let zoned = listing
        .entries
        .iter()
        .find(|e| e.original.dst_port == Some(7300))
        .expect("the zoned entry")
        .clone();
    assert_eq!(zoned.zone, Some(5));
    let plain = listing
        .entries
        .iter()
        .find(|e| e.original.dst_port == Some(7301))
        .expect("the plain entry")
        .clone();
    assert_eq!(plain.zone, None);

    // The same tuple with another id is another connection: not deleted.
    let mut stale = plain.clone();
    stale.id = plain.id.map(|i| i.wrapping_add(1));
    assert_eq!(delete(&pair, &stale), Deleted::Gone);
    // The zone is part of the identity: the zoned entry is not found in the default zone.
    let mut unzoned = zoned.clone();
    unzoned.zone = None;
    assert_eq!(delete(&pair, &unzoned), Deleted::Gone);
    let still = list(&pair, addr(PEER4), Filtering::Userspace);
    assert_eq!(
        still.entries.len(),
        2,
        "nothing was deleted yet: {still:#?}"
    );

    assert_eq!(delete(&pair, &zoned), Deleted::Deleted);
    assert_eq!(delete(&pair, &plain), Deleted::Deleted);
    assert!(list(&pair, addr(PEER4), Filtering::Userspace)
        .entries
        .is_empty());
}

#[test]
fn a_dnat_entry_is_found_by_the_address_only_its_reply_tuple_has() {
    // A Service: the peer sends to a virtual address the node rewrites to its own. The
    // original tuple names the virtual address; only the reply tuple names the backend.
    let pair = Pair::new("ct-dnat");
    let service = "10.213.1.1";
    pair.peer
        .sh_ok(&format!("ip route add 10.213.1.0/24 via {NODE4}"));
    pair.restore(
        "iptables-legacy",
        &format!(
            "*nat\n-A PREROUTING -d {service}/32 -p udp -m udp --dport 80 -j DNAT --to-destination {NODE4}:7400\nCOMMIT\n"
        ),
    );
    udp(
        &pair.peer,
        SocketAddr::new(addr(service), 80),
        b"to the service",
    );
    let backend = addr(NODE4);
    for filtering in [Filtering::Auto, Filtering::Kernel, Filtering::Userspace] {
        let listing = wait_for(Duration::from_secs(2), || {
            let l = list(&pair, backend, filtering);
            (!l.entries.is_empty()).then_some(l)
        })
        .unwrap_or_else(|| panic!("{filtering:?}: the DNAT entry by its backend address"));
        assert_eq!(listing.entries.len(), 1, "{listing:#?}");
        let e = &listing.entries[0];
        assert_eq!(e.original.dst, addr(service));
        assert_eq!((e.reply.src, e.reply.src_port), (backend, Some(7400)));
        assert!(!e.original.involves(backend));
    }
    assert_eq!(list(&pair, addr(service), Filtering::Auto).entries.len(), 1);
}

/// The tests' own rule edits wait for the machine-wide xtables lock (the failure this guards:
/// "Can't lock /run/xtables.lock" on 6.12 + trixie while the IPv4 test held it).
#[test]
fn a_tests_own_iptables_call_waits_for_the_lock() {
    let w = common::with_xtables_wait;
    assert_eq!(
        w(&["ip6tables-legacy", "-D", "INPUT"]),
        ["ip6tables-legacy", "-w", "-D", "INPUT"]
    );
    assert_eq!(
        w(&["/usr/sbin/iptables-nft", "-S"]),
        ["/usr/sbin/iptables-nft", "-w", "-S"]
    );
    assert_eq!(
        w(&["iptables-legacy-restore"]),
        ["iptables-legacy-restore", "-w"]
    );
    assert_eq!(
        w(&["iptables", "-w", "-N", "X"]),
        ["iptables", "-w", "-N", "X"]
    );
    assert_eq!(w(&["iptables-legacy-save"]), ["iptables-legacy-save"]);
    assert_eq!(w(&["ip", "link"]), ["ip", "link"]);
    assert!(w(&[]).is_empty());
}
