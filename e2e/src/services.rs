//! What kubelet and kube-proxy leave in a node's netfilter, as text for the tools that load
//! it: a ClusterIP per pod (one per family), DNATed to the pod for every port it declares,
//! from pods (`prerouting`) and from the node itself (`output`), so the agent's filter rules
//! only ever see the post-DNAT packet, as on a real node.
//!
//! - `--service-proxy iptables`: kube-proxy's iptables mode, `KUBE-SERVICES` → per-pod
//!   `KUBE-SEP-…` chains in `nat`, jumped to from `PREROUTING` and `OUTPUT`, loaded with
//!   `iptables-restore --noflush` (as kube-proxy does: other programs' chains in `nat` stay).
//! - `--service-proxy nftables`: kube-proxy's nftables mode (GA since 1.33): a table of its
//!   own per family, `ip kube-proxy` / `ip6 kube-proxy`, with base chains `nat-prerouting`
//!   and `nat-output` (type nat, priority dstnat) jumping to `services`, which looks the
//!   destination address, protocol and port up in the verdict map `service-ips` and goes to
//!   a per-endpoint chain that DNATs; `filter-forward` and `filter-output-post-dnat` reject
//!   what reaches a ClusterIP undnatted (an undeclared port) and drop unallocated ClusterIPs,
//!   the way kube-proxy's `cluster-ips-check` does. Not a single iptables rule is kube-proxy's
//!   then. The table is replaced in one `nft -f` transaction (create, delete, define).
//! - kubelet, in both modes: its `KUBE-IPTABLES-HINT` chain in `mangle` and its
//!   `KUBE-KUBELET-CANARY` chains in `mangle`, `nat` and `filter`, in both families, and the
//!   IPv4 `KUBE-FIREWALL` localnet guard jumped to from `INPUT` and `OUTPUT` — what a real
//!   node has whatever kube-proxy's mode (kubelet makes them through the `iptables` binary;
//!   kube-proxy's nftables mode makes no hint of its own). The agent's backend detection keys
//!   on exactly that hint.
//!
//! - `--service-proxy ipvs`: kube-proxy's IPVS mode (`pkg/proxy/ipvs`): every ClusterIP is
//!   an address of the `kube-ipvs0` dummy interface (so a pod's packet to it is delivered
//!   locally: `INPUT`, IPVS rewrites it at `LOCAL_IN`, it leaves through `OUTPUT`, never
//!   `FORWARD`), an IPVS virtual service per ClusterIP, protocol and port with the pod as its
//!   masquerading real server (`rr`), loaded with `ipvsadm -R`; kube-proxy's ipsets
//!   (`KUBE-CLUSTER-IP`, `KUBE-LOOP-BACK`, `KUBE-IPVS-IPS`, ... with `KUBE-6-` names for IPv6)
//!   and its IPVS-mode iptables rules beside ours: `KUBE-SERVICES` (mark non-pod sources for
//!   masquerade, `ACCEPT` ClusterIP:port in `KUBE-CLUSTER-IP`), `KUBE-POSTROUTING`
//!   (masquerade of 0x4000 and hairpin), `KUBE-MARK-MASQ`, `KUBE-FORWARD`, `KUBE-NODE-PORT`,
//!   `KUBE-PROXY-FIREWALL` and `KUBE-IPVS-FILTER` (rejects new connections to a `kube-ipvs0`
//!   address on a port that is no service); and its sysctls (`net.ipv4.vs.conntrack=1`, so
//!   netfilter's conntrack follows IPVS connections, `expire_nodest_conn`,
//!   `expire_quiescent_template`, `route_localnet`). No NodePorts: no scenario uses them.
//!
//! The layout of kube-proxy's nftables mode follows its documented integration contract
//! (table, base chains, hooks and priorities); the rules are our own and much smaller (no
//! masquerading, one endpoint per service, no NodePorts). Pure: no I/O.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use netpol_agent::model::IpFamily;

use crate::scenario::Protocol;

/// Who DNATs ClusterIPs on the simulated nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceProxy {
    /// kube-proxy's iptables mode.
    #[default]
    Iptables,
    /// kube-proxy's nftables mode: `nft` tables of its own, no iptables rules.
    Nftables,
    /// kube-proxy's IPVS mode: ClusterIPs on a `kube-ipvs0` dummy, IPVS virtual services
    /// (needs a kernel with IPVS: run it in `scripts/vm.sh`).
    Ipvs,
}

impl ServiceProxy {
    pub fn name(self) -> &'static str {
        match self {
            ServiceProxy::Iptables => "iptables",
            ServiceProxy::Nftables => "nftables",
            ServiceProxy::Ipvs => "ipvs",
        }
    }
}

/// One pod's service in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// `ns/pod`, for comments.
    pub name: String,
    pub uid: usize,
    pub cluster_ip: IpAddr,
    pub backend: IpAddr,
    pub ports: Vec<(Protocol, u16)>,
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// `addr:port`, bracketed for IPv6 (what DNAT targets take in both tools).
fn addr_port(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn host_len(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    }
}

/// kubelet's chains for `iptables-restore --noflush` of `family`.
pub fn kubelet_restore(family: IpFamily) -> String {
    let mut s = String::from(
        "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n\
         *nat\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n*filter\n:KUBE-KUBELET-CANARY - [0:0]\n",
    );
    if family == IpFamily::V4 {
        s.push_str(
            ":KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\n\
             -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n",
        );
    }
    s.push_str("COMMIT\n");
    s
}

fn sep_chain(uid: usize) -> String {
    format!("KUBE-SEP-E2E{uid}")
}

/// kube-proxy's iptables mode for `iptables-restore --noflush`: `KUBE-SERVICES` and the
/// per-pod chains rewritten, the chains of pods gone (`removed` uids) deleted, and on the
/// first write (`first`) the jumps from `PREROUTING`/`OUTPUT` and kube-proxy's canaries.
pub fn kube_proxy_iptables(
    family: IpFamily,
    services: &[Service],
    removed: &[usize],
    first: bool,
) -> String {
    let mut s = String::new();
    if first {
        for table in ["mangle", "filter"] {
            let _ = write!(s, "*{table}\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n");
        }
    }
    s.push_str("*nat\n:KUBE-SERVICES - [0:0]\n");
    if first {
        s.push_str(":KUBE-PROXY-CANARY - [0:0]\n");
    }
    for svc in services {
        let _ = writeln!(s, ":{} - [0:0]", sep_chain(svc.uid));
    }
    // A chain must be empty to be deleted: the declaration flushes it (`--noflush` keeps
    // every chain the script does not declare).
    for uid in removed {
        let _ = writeln!(s, ":{} - [0:0]", sep_chain(*uid));
    }
    if first {
        for chain in ["PREROUTING", "OUTPUT"] {
            let _ = writeln!(
                s,
                "-A {chain} -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            );
        }
    }
    let len = host_len(family);
    for svc in services {
        let chain = sep_chain(svc.uid);
        for &(p, port) in &svc.ports {
            let p = proto(p);
            let _ = writeln!(
                s,
                "-A KUBE-SERVICES -d {}/{len} -p {p} -m {p} --dport {port} -m comment --comment \"{}:{port}\" -j {chain}",
                svc.cluster_ip, svc.name
            );
            let _ = writeln!(
                s,
                "-A {chain} -p {p} -m {p} --dport {port} -j DNAT --to-destination {}",
                addr_port(svc.backend, port)
            );
        }
    }
    for uid in removed {
        let _ = writeln!(s, "-X {}", sep_chain(*uid));
    }
    s.push_str("COMMIT\n");
    s
}

/// The interface kube-proxy's IPVS mode binds ClusterIPs to (what felix detects).
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// The sysctls kube-proxy's IPVS mode sets on its node (`net/ipv4/vs/*` exist once `ip_vs`
/// is loaded; they govern both families).
pub const IPVS_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv4/vs/conntrack", "1"),
    ("net/ipv4/vs/expire_nodest_conn", "1"),
    ("net/ipv4/vs/expire_quiescent_template", "1"),
    ("net/ipv4/conf/all/route_localnet", "1"),
];

/// kube-proxy's IPVS-mode set name in `family` (`KUBE-6-…` for IPv6, as kube-proxy names
/// them so both families coexist).
pub fn ipvs_set(family: IpFamily, name: &str) -> String {
    match family {
        IpFamily::V4 => format!("KUBE-{name}"),
        IpFamily::V6 => format!("KUBE-6-{name}"),
    }
}

/// kube-proxy's IPVS-mode sets for `ipset restore`: created if missing, flushed and filled
/// from `services` (ClusterIP,proto:port; the hairpin triples; the `kube-ipvs0` addresses).
pub fn kube_proxy_ipvs_sets(family: IpFamily, services: &[Service]) -> String {
    let fam = match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    };
    let mut s = String::new();
    let sets = [
        ("CLUSTER-IP", "hash:ip,port"),
        ("LOOP-BACK", "hash:ip,port,ip"),
        ("EXTERNAL-IP", "hash:ip,port"),
        ("EXTERNAL-IP-LOCAL", "hash:ip,port"),
        ("LOAD-BALANCER", "hash:ip,port"),
        ("HEALTH-CHECK-NODE-PORT", "bitmap:port"),
        ("IPVS-IPS", "hash:ip"),
    ];
    for (name, kind) in sets {
        let set = ipvs_set(family, name);
        let opts = if kind == "bitmap:port" {
            "range 0-65535".to_string()
        } else {
            format!("family {fam} hashsize 1024 maxelem 65536")
        };
        let _ = writeln!(s, "create {set} {kind} {opts} comment -exist");
        let _ = writeln!(s, "flush {set}");
    }
    let cluster = ipvs_set(family, "CLUSTER-IP");
    let loopback = ipvs_set(family, "LOOP-BACK");
    let ips = ipvs_set(family, "IPVS-IPS");
    for svc in services {
        let _ = writeln!(s, "add {ips} {} comment \"{}\"", svc.cluster_ip, svc.name);
        for &(p, port) in &svc.ports {
            let p = proto(p);
            let _ = writeln!(
                s,
                "add {cluster} {},{p}:{port} comment \"{}:{port}\"",
                svc.cluster_ip, svc.name
            );
            let _ = writeln!(s, "add {loopback} {b},{p}:{port},{b}", b = svc.backend);
        }
    }
    s
}

/// kube-proxy's IPVS-mode iptables rules for `iptables-restore --noflush` of `family`,
/// written once per node before the agent starts (the rules are static: what changes with
/// services is in the sets). `pod_cidr` is kube-proxy's `--cluster-cidr`: traffic from
/// outside it to a ClusterIP is masqueraded, pod traffic keeps its source.
pub fn kube_proxy_ipvs_iptables(family: IpFamily, pod_cidr: IpNet) -> String {
    let set = |n: &str| ipvs_set(family, n);
    let mut s = String::from("*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        "KUBE-MARK-MASQ",
        "KUBE-PROXY-CANARY",
    ] {
        let _ = writeln!(s, ":{chain} - [0:0]");
    }
    let _ = write!(
        s,
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set {loopback} dst,dst,src -j MASQUERADE\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-SERVICES ! -s {pod_cidr} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set {cluster} dst,dst -j KUBE-MARK-MASQ\n\
         -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n\
         -A KUBE-SERVICES -m set --match-set {cluster} dst,dst -j ACCEPT\n\
         COMMIT\n",
        loopback = set("LOOP-BACK"),
        cluster = set("CLUSTER-IP"),
    );
    s.push_str("*filter\n");
    for chain in [
        "KUBE-FORWARD",
        "KUBE-NODE-PORT",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
        "KUBE-PROXY-CANARY",
    ] {
        let _ = writeln!(s, ":{chain} - [0:0]");
    }
    let _ = write!(
        s,
        "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n\
         -A INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n\
         -A INPUT -m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT\n\
         -A FORWARD -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER\n\
         -A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n\
         -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {hc} dst -j ACCEPT\n\
         -A KUBE-IPVS-FILTER -m set --match-set {lb} dst,dst -j RETURN\n\
         -A KUBE-IPVS-FILTER -m set --match-set {cluster} dst,dst -j RETURN\n\
         -A KUBE-IPVS-FILTER -m set --match-set {ext} dst,dst -j RETURN\n\
         -A KUBE-IPVS-FILTER -m set --match-set {extl} dst,dst -j RETURN\n\
         -A KUBE-IPVS-FILTER -m set --match-set {hc} dst -j RETURN\n\
         -A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {ips} dst -j REJECT\n\
         COMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n",
        hc = set("HEALTH-CHECK-NODE-PORT"),
        lb = set("LOAD-BALANCER"),
        cluster = set("CLUSTER-IP"),
        ext = set("EXTERNAL-IP"),
        extl = set("EXTERNAL-IP-LOCAL"),
        ips = set("IPVS-IPS"),
    );
    s
}

/// IPVS virtual services for `ipvsadm -R` (after `ipvsadm -C`): one per ClusterIP,
/// protocol and port, round robin, the pod as its one masquerading (NAT) real server, of
/// every family at once (IPVS holds both in one table).
pub fn ipvsadm_rules(services: &[Service]) -> String {
    let mut s = String::new();
    for svc in services {
        for &(p, port) in &svc.ports {
            let kind = match p {
                Protocol::Tcp => "-t",
                Protocol::Udp => "-u",
                Protocol::Sctp => "--sctp-service",
            };
            let vip = addr_port(svc.cluster_ip, port);
            let _ = writeln!(s, "-A {kind} {vip} -s rr");
            let _ = writeln!(
                s,
                "-a {kind} {vip} -r {} -m -w 1",
                addr_port(svc.backend, port)
            );
        }
    }
    s
}

/// The `ip -batch` lines that make `kube-ipvs0` hold exactly `services`' ClusterIPs.
pub fn ipvs_dummy_addrs(services: &[Service]) -> String {
    let mut s = format!("addr flush dev {IPVS_DUMMY}\n");
    for svc in services {
        let (len, extra) = match svc.cluster_ip {
            IpAddr::V4(_) => (32, ""),
            IpAddr::V6(_) => (128, " nodad"),
        };
        let _ = writeln!(
            s,
            "addr add {}/{len} dev {IPVS_DUMMY}{extra}",
            svc.cluster_ip
        );
    }
    s
}

/// A node's own addresses from `ip -o addr show` (one line per address: index, interface,
/// family, address), without those of `kube-ipvs0`: what the agent puts in its this-host set
/// (felix leaves kube-ipvs0's ClusterIPs out so traffic to them counts as Service traffic),
/// read by the tool rather than the agent's netlink reader, so `compile --host-address` with
/// them checks the agent's reading. A point-to-point `peer` is the far end, not ours.
pub fn node_addresses(ip_o_addr: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in ip_o_addr.lines() {
        let mut words = line.split_whitespace();
        let (Some(_index), Some(iface), Some(kind), Some(addr)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        // `eth0@if7`: the part after `@` names the peer's index, not this interface.
        if iface.split('@').next() == Some(IPVS_DUMMY) || !kind.starts_with("inet") {
            continue;
        }
        if let Ok(ip) = addr.split('/').next().unwrap_or(addr).parse() {
            out.push(ip);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// kube-proxy's nftables mode for `nft -f`: table `ip kube-proxy` (`ip6` for IPv6) replaced
/// whole in one transaction. `service_cidr` is the ClusterIP range of the family.
pub fn kube_proxy_nft(family: IpFamily, services: &[Service], service_cidr: IpNet) -> String {
    let (fam, ip, addr_type) = match family {
        IpFamily::V4 => ("ip", "ip", "ipv4_addr"),
        IpFamily::V6 => ("ip6", "ip6", "ipv6_addr"),
    };
    let mut map = Vec::new();
    let mut cluster_ips = Vec::new();
    let mut endpoints = String::new();
    for svc in services {
        cluster_ips.push(svc.cluster_ip.to_string());
        for &(p, port) in &svc.ports {
            let p = proto(p);
            let chain = format!("endpoint-e2e{}-{p}-{port}", svc.uid);
            map.push(format!("{} . {p} . {port} : goto {chain}", svc.cluster_ip));
            let _ = write!(
                endpoints,
                "\tchain {chain} {{\n\t\tcomment \"{}:{port}\"\n\t\tmeta l4proto {p} dnat to {}\n\t}}\n",
                svc.name,
                addr_port(svc.backend, port)
            );
        }
    }
    let elements = |items: &[String]| {
        if items.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", items.join(", "))
        }
    };
    let mut s = format!(
        "table {fam} kube-proxy\ndelete table {fam} kube-proxy\ntable {fam} kube-proxy {{\n\
         \tcomment \"rules for kube-proxy\"\n\
         \tset cluster-ips {{ type {addr_type}; comment \"Active ClusterIPs\";{} }}\n\
         \tmap service-ips {{ type {addr_type} . inet_proto . inet_service : verdict; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\";{} }}\n",
        elements(&cluster_ips),
        elements(&map)
    );
    // Base chains: the nat chains at dstnat (-100); the check of what was not DNATed
    // around it where kube-proxy puts it (dstnat - 10 in forward, dstnat + 10 in output).
    // Numbers, not names: nft before 1.0.7 takes `dstnat` in prerouting only.
    let check = "ct state new jump cluster-ips-check";
    let base = [
        ("filter-forward", "filter", "forward", "-110", check),
        ("filter-output-post-dnat", "filter", "output", "-90", check),
        (
            "nat-prerouting",
            "nat",
            "prerouting",
            "-100",
            "jump services",
        ),
        ("nat-output", "nat", "output", "-100", "jump services"),
    ];
    for (name, kind, hook, priority, rule) in base {
        let _ = write!(
            s,
            "\tchain {name} {{\n\t\ttype {kind} hook {hook} priority {priority}; policy accept;\n\t\t{rule}\n\t}}\n"
        );
    }
    let _ = write!(
        s,
        "\tchain services {{\n\t\t{ip} daddr . meta l4proto . th dport vmap @service-ips\n\t}}\n\
         \tchain cluster-ips-check {{\n\
         \t\t{ip} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n\
         \t\t{ip} daddr {{ {service_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\"\n\t}}\n"
    );
    s.push_str(&endpoints);
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_addresses_leave_out_kube_ipvs0_and_peers() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host noprefixroute \\       valid_lft forever preferred_lft forever
2: eth0@if9    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever preferred_lft forever
2: eth0@if9    inet6 fe80::1c5b:2eff:fe0a:1/64 scope link \\       valid_lft forever preferred_lft forever
3: kube-ipvs0    inet 10.96.0.10/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever
3: kube-ipvs0    inet6 fd00:e2e::a60:a/128 scope global \\       valid_lft forever preferred_lft forever
4: tun0    inet 10.9.0.1 peer 10.9.0.2/32 scope global tun0\\       valid_lft forever preferred_lft forever
";
        let got: Vec<String> = super::node_addresses(text)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "10.0.0.2",
                "10.9.0.1",
                "127.0.0.1",
                "::1",
                "fe80::1c5b:2eff:fe0a:1"
            ]
        );
    }

    use super::*;

    fn svc(cluster_ip: &str, backend: &str) -> Service {
        Service {
            name: "x/a".into(),
            uid: 3,
            cluster_ip: cluster_ip.parse().unwrap(),
            backend: backend.parse().unwrap(),
            ports: vec![(Protocol::Tcp, 80), (Protocol::Sctp, 81)],
        }
    }

    #[test]
    fn iptables_mode_writes_kube_services_and_deletes_gone_chains() {
        let v6 = kube_proxy_iptables(
            IpFamily::V6,
            &[svc("fd00:e2e::a60:a", "fd00:e2e::af4:a")],
            &[7],
            false,
        );
        assert!(v6.contains(
            "-A KUBE-SERVICES -d fd00:e2e::a60:a/128 -p sctp -m sctp --dport 81 -m comment --comment \"x/a:81\" -j KUBE-SEP-E2E3"
        ), "{v6}");
        assert!(v6.contains("-j DNAT --to-destination [fd00:e2e::af4:a]:80"));
        assert!(v6.contains("-X KUBE-SEP-E2E7\nCOMMIT\n"));
        // Flushed (declared) before it is deleted: iptables refuses to delete a chain with rules.
        let declared = v6.find(":KUBE-SEP-E2E7 - [0:0]\n").expect("declared");
        assert!(declared < v6.find("-X KUBE-SEP-E2E7").unwrap());
        assert!(!v6.contains("PREROUTING"), "the jumps are written once");
        let first =
            kube_proxy_iptables(IpFamily::V4, &[svc("10.96.0.10", "10.244.0.10")], &[], true);
        assert!(first.contains(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        ));
        assert!(first.contains("--to-destination 10.244.0.10:81"));
    }

    #[test]
    fn nftables_mode_is_a_table_of_its_own_replaced_atomically() {
        let cidr: IpNet = "fd00:e2e::a60:0/112".parse().unwrap();
        let s = kube_proxy_nft(
            IpFamily::V6,
            &[svc("fd00:e2e::a60:a", "fd00:e2e::af4:a")],
            cidr,
        );
        assert!(s.starts_with(
            "table ip6 kube-proxy\ndelete table ip6 kube-proxy\ntable ip6 kube-proxy {"
        ));
        assert!(s.contains("type nat hook prerouting priority -100; policy accept;"));
        assert!(s.contains("type nat hook output priority -100; policy accept;"));
        assert!(s.contains("fd00:e2e::a60:a . sctp . 81 : goto endpoint-e2e3-sctp-81"));
        assert!(s.contains("meta l4proto tcp dnat to [fd00:e2e::af4:a]:80"));
        assert!(s.contains("ip6 daddr { fd00:e2e::a60:0/112 } drop"));
        assert!(!s.contains("iptables"));
        // No services: no element lists (nft refuses empty ones).
        let empty = kube_proxy_nft(IpFamily::V4, &[], "10.96.0.0/16".parse().unwrap());
        assert!(!empty.contains("elements"));
    }

    #[test]
    fn ipvs_mode_is_kube_ipvs0_ipvsadm_sets_and_kube_proxy_rules() {
        let v4 = svc("10.96.0.10", "10.244.0.10");
        let v6 = svc("fd00:e2e::a60:a", "fd00:e2e::af4:a");
        let rules = ipvsadm_rules(&[v4.clone(), v6.clone()]);
        assert!(rules.contains(
            "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.0.10:80 -m -w 1\n"
        ));
        assert!(rules.contains("-A --sctp-service [fd00:e2e::a60:a]:81 -s rr\n"));
        let addrs = ipvs_dummy_addrs(&[v4.clone(), v6.clone()]);
        assert!(addrs.starts_with("addr flush dev kube-ipvs0\n"));
        assert!(addrs.contains("addr add fd00:e2e::a60:a/128 dev kube-ipvs0 nodad\n"));
        let sets = kube_proxy_ipvs_sets(IpFamily::V6, &[v6]);
        assert!(sets.contains("create KUBE-6-CLUSTER-IP hash:ip,port family inet6"));
        assert!(sets.contains("add KUBE-6-CLUSTER-IP fd00:e2e::a60:a,sctp:81"));
        assert!(sets.contains("add KUBE-6-LOOP-BACK fd00:e2e::af4:a,tcp:80,fd00:e2e::af4:a\n"));
        let ipt = kube_proxy_ipvs_iptables(IpFamily::V4, "10.244.0.0/16".parse().unwrap());
        assert!(ipt.contains("-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"));
        assert!(ipt.contains("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN"));
        assert!(ipt
            .contains("-m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT"));
    }

    #[test]
    fn kubelet_leaves_its_hint_in_both_families() {
        for f in [IpFamily::V4, IpFamily::V6] {
            assert!(kubelet_restore(f).contains("*mangle\n:KUBE-IPTABLES-HINT - [0:0]"));
        }
        assert!(kubelet_restore(IpFamily::V4).contains("-A INPUT -j KUBE-FIREWALL"));
        assert!(!kubelet_restore(IpFamily::V6).contains("KUBE-FIREWALL"));
    }
}
