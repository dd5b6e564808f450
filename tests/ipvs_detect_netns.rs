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
