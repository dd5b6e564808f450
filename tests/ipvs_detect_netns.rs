//! kube-proxy IPVS detection on a real kernel (`host::ipvs::read`): `kube-ipvs0` found by
//! name, and this host's addresses without the ClusterIPs kube-proxy puts on it (veths stand
//! in for kube-proxy's dummy: not every kernel here has the dummy driver).

mod common;

use std::net::IpAddr;

use common::{in_netns, NetNs};
use netpol_agent::host::ipvs;

#[test]
fn kube_ipvs0_is_found_and_its_cluster_ips_are_not_host_addresses() {
    let ns = NetNs::new("ipvs-detect");
    ns.exec_ok(&[
        "ip",
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0-peer",
    ]);
    ns.exec_ok(&["ip", "link", "set", "eth0", "up"]);
    ns.exec_ok(&["ip", "addr", "add", "192.168.7.7/24", "dev", "eth0"]);
    let before = in_netns(&ns.name, ipvs::read).expect("read");
    assert!(!before.present, "no kube-ipvs0 yet");
    let host: IpAddr = "192.168.7.7".parse().unwrap();
    assert!(before.host_addrs.contains(&host), "{:?}", before.host_addrs);

    ns.exec_ok(&[
        "ip",
        "link",
        "add",
        "kube-ipvs0",
        "type",
        "veth",
        "peer",
        "name",
        "kipvs-peer",
    ]);
    ns.exec_ok(&["ip", "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"]);
    let after = in_netns(&ns.name, ipvs::read).expect("read");
    assert!(after.present);
    let cluster_ip: IpAddr = "10.96.0.10".parse().unwrap();
    assert!(
        !after.host_addrs.contains(&cluster_ip),
        "{:?}",
        after.host_addrs
    );
    assert!(after.host_addrs.contains(&host));
}

/// A point-to-point address (`ip addr add LOCAL peer PEER`): the kernel reports the peer as
/// the address and this host's own as the local one; only the local one is this host's (the
/// peer's traffic is not the node's own, and a this-host set holding it would treat the
/// peer's Service traffic as the node's). Both families.
#[test]
fn point_to_point_peers_are_not_host_addresses() {
    let ns = NetNs::new("ipvs-p2p");
    ns.exec_ok(&[
        "ip",
        "link",
        "add",
        "ptp0",
        "type",
        "veth",
        "peer",
        "name",
        "ptp0-peer",
    ]);
    ns.exec_ok(&["ip", "link", "set", "ptp0", "up"]);
    ns.exec_ok(&[
        "ip", "addr", "add", "10.9.0.1", "peer", "10.9.0.2", "dev", "ptp0",
    ]);
    ns.exec_ok(&[
        "ip", "-6", "addr", "add", "fd09::1", "peer", "fd09::2", "dev", "ptp0", "nodad",
    ]);
    ns.exec_ok(&["ip", "addr", "add", "192.168.9.9/24", "dev", "ptp0"]);
    let view = in_netns(&ns.name, ipvs::read).expect("read");
    for own in ["10.9.0.1", "fd09::1", "192.168.9.9"] {
        let ip: IpAddr = own.parse().unwrap();
        assert!(
            view.host_addrs.contains(&ip),
            "{own}: {:?}",
            view.host_addrs
        );
    }
    for peer in ["10.9.0.2", "fd09::2"] {
        let ip: IpAddr = peer.parse().unwrap();
        assert!(
            !view.host_addrs.contains(&ip),
            "{peer}: {:?}",
            view.host_addrs
        );
    }
}
