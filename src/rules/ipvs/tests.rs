//! Golden tests of the IPVS chains (both families, routed and bridge) and of the mark carving.

use super::*;
use crate::rules::chains::static_chains;
use crate::rules::dispatch::dispatch_chains_with_addrs;
use crate::rules::Chain;

fn ipvs() -> IpvsConfig {
    IpvsConfig::new(
        0xffff0000,
        &MarkBits::default(),
        DEFAULT_NODE_PORT_RANGES.to_vec(),
    )
    .unwrap()
}

fn routed() -> RuleConfig {
    RuleConfig {
        kube_ipvs: Some(ipvs()),
        ..RuleConfig::default()
    }
}

fn bridged() -> RuleConfig {
    RuleConfig {
        interface_prefixes: vec!["veth".into()],
        bridge: Some("cni0".into()),
        kube_ipvs: Some(ipvs()),
        ..RuleConfig::default()
    }
}

/// Rule bodies without the hash comment.
fn bodies(c: &Chain) -> Vec<String> {
    c.rules
        .iter()
        .map(|r| {
            r.body
                .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "")
                .replace(&format!(" -m comment --comment \"cali:{}\"", r.hash), "")
        })
        .collect()
}

fn chain<'a>(chains: &'a [Chain], name: &str) -> &'a Chain {
    chains
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no chain {name}"))
}

#[test]
fn carving_takes_the_rest_of_the_mask() {
    let e = EndpointMarks::carve(0xffff0000, &MarkBits::default()).unwrap();
    assert_eq!((e.mask, e.non_cali), (0xfff00000, 0x100000));
    let used = MarkBits::from_mask(0x3f).unwrap();
    let e = EndpointMarks::carve(0x3f, &used).unwrap();
    assert_eq!((e.mask, e.non_cali), (0x30, 0x10));
    // Four bits (all taken) or five (one spare: the non-pod mark only) are refused.
    for mask in [0xf0000u32, 0x1f0000] {
        let used = MarkBits::from_mask(mask).unwrap();
        let err = EndpointMarks::carve(mask, &used).unwrap_err();
        assert!(err.contains("at least 2"), "{err}");
    }
}

#[test]
fn fnv1_matches_the_reference_values() {
    // FNV-1 32-bit test vectors (offset basis for "", and "a").
    assert_eq!(fnv1_32(""), 0x811c9dc5);
    assert_eq!(fnv1_32("a"), 0x050c5d7e);
}

#[test]
fn marks_are_distinct_nonzero_and_inside_the_mask() {
    let e = ipvs().endpoint;
    let ifaces: Vec<String> = (0..500).map(|i| format!("cali{i:011x}")).collect();
    let marks = endpoint_marks(&e, &ifaces);
    assert_eq!(marks.len(), 500);
    let mut seen = std::collections::HashSet::new();
    for m in marks.values() {
        assert_eq!(m & !e.mask, 0);
        assert!(*m != 0 && *m != e.non_cali);
        assert!(seen.insert(*m));
    }
    // Pure: the same names in another order give the same marks.
    let mut rev = ifaces.clone();
    rev.reverse();
    assert_eq!(endpoint_marks(&e, &rev), marks);
    // Two bits number 4 values: 0 and 1 are reserved, so two pods get marks, a third none.
    let small = EndpointMarks {
        mask: 0x30,
        non_cali: 0x10,
    };
    let three: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(endpoint_marks(&small, &three).len(), 2);
}

#[test]
fn routed_static_chains_v4() {
    let chains = static_chains(&routed(), IpFamily::V4, false);
    assert_eq!(
        bodies(&chains[1]),
        [
            "-j MARK --set-xmark 0x0/0xfff00000",
            "-j cali-forward-check",
            "-m mark ! --mark 0x0/0xfff00000 -j RETURN",
            "-i cali+ -g cali-wl-to-host",
        ]
    );
    assert_eq!(
        bodies(&chains[3]),
        [
            "-m mark ! --mark 0x0/0xfff00000 -g cali-forward-endpoint-mark",
            "-o cali+ -j RETURN",
        ]
    );
}

#[test]
fn routed_ipvs_chains_both_families() {
    let ifaces = vec!["cali12345678901".to_string(), "caliabcdef01234".to_string()];
    let cfg = routed();
    let marks = endpoint_marks(&cfg.kube_ipvs.as_ref().unwrap().endpoint, &ifaces);
    for (family, set) in [
        (IpFamily::V4, "cali40this-host"),
        (IpFamily::V6, "cali60this-host"),
    ] {
        let chains = dispatch_chains_with_addrs(&cfg, family, &ifaces, &[]);
        assert_eq!(
            bodies(chain(&chains, FORWARD_CHECK_CHAIN)),
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN".to_string(),
                format!("-p tcp -m multiport --dports 30000:32767 -m set --match-set {set} dst -g cali-set-endpoint-mark"),
                format!("-p udp -m multiport --dports 30000:32767 -m set --match-set {set} dst -g cali-set-endpoint-mark"),
                format!("-m comment --comment \"To kubernetes service\" -m set ! --match-set {set} dst -j cali-set-endpoint-mark"),
            ]
        );
        assert_eq!(
            bodies(chain(&chains, SET_ENDPOINT_MARK_CHAIN)),
            [
                "-i cali12345678901 -g cali-sm-cali12345678901",
                "-i caliabcdef01234 -g cali-sm-caliabcdef01234",
                "-i cali+ -m comment --comment \"Unknown endpoint\" -j DROP",
                "-m comment --comment \"Non-Cali endpoint mark\" -j MARK --set-xmark 0x100000/0xfff00000",
            ]
        );
        let m1 = marks["cali12345678901"];
        assert_eq!(
            bodies(chain(&chains, "cali-sm-cali12345678901")),
            [format!("-j MARK --set-xmark {m1:#x}/0xfff00000")]
        );
        let m2 = marks["caliabcdef01234"];
        assert_eq!(
            bodies(chain(&chains, FROM_ENDPOINT_MARK_CHAIN)),
            [
                format!("-m mark --mark {m1:#x}/0xfff00000 -g cali-fw-cali12345678901"),
                format!("-m mark --mark {m2:#x}/0xfff00000 -g cali-fw-caliabcdef01234"),
                "-m comment --comment \"Unknown interface\" -j DROP".to_string(),
            ]
        );
        assert_eq!(
            bodies(chain(&chains, FORWARD_ENDPOINT_MARK_CHAIN)),
            [
                "-m mark ! --mark 0x100000/0xfff00000 -j cali-from-endpoint-mark",
                "-o cali+ -j cali-to-wl-dispatch",
                "-j MARK --set-xmark 0x0/0xfff00000",
                "-m comment --comment \"Policy explicitly accepted packet.\" -m mark --mark 0x10000/0x10000 -j ACCEPT",
            ]
        );
    }
}

#[test]
fn bridge_mode_dispatches_by_port_and_address() {
    let ifaces = vec!["veth0a1b2c3d".to_string()];
    let addrs = vec![("10.244.0.2".parse().unwrap(), "veth0a1b2c3d".to_string())];
    for family in [IpFamily::V4, IpFamily::V6] {
        let statics = static_chains(&bridged(), family, false);
        assert_eq!(
            bodies(&statics[1])[3],
            "-m physdev --physdev-in veth+ -g cali-wl-to-host"
        );
        assert_eq!(
            bodies(&statics[3]),
            [
                "-m mark ! --mark 0x0/0xfff00000 -g cali-forward-endpoint-mark",
                "-o cni0 -j RETURN",
            ]
        );
        let chains = dispatch_chains_with_addrs(&bridged(), family, &ifaces, &addrs);
        let sm = bodies(chain(&chains, SET_ENDPOINT_MARK_CHAIN));
        assert_eq!(
            sm[..2],
            [
                "-m physdev --physdev-in veth0a1b2c3d -g cali-sm-veth0a1b2c3d",
                "-m comment --comment \"Unknown endpoint\" -m physdev --physdev-in veth+ -j DROP",
            ]
        );
        assert_eq!(
            bodies(chain(&chains, FORWARD_ENDPOINT_MARK_CHAIN))[1],
            "-o cni0 -j cali-to-wl-addr-dispatch"
        );
        assert!(chains.iter().any(|c| c.name == TO_WL_ADDR_DISPATCH));
    }
}

#[test]
fn ipvs_off_renders_nothing_of_it() {
    let off = RuleConfig::default();
    let ifaces = vec!["cali1".to_string()];
    let chains = dispatch_chains_with_addrs(&off, IpFamily::V4, &ifaces, &[]);
    assert!(chains
        .iter()
        .all(|c| !c.name.starts_with("cali-forward-") && !c.name.starts_with("cali-sm-")));
    let s = static_chains(&off, IpFamily::V4, false);
    assert_eq!(bodies(&s[1]), ["-i cali+ -g cali-wl-to-host"]);
    assert_eq!(bodies(&s[3]), ["-o cali+ -j RETURN"]);
}

#[test]
fn node_port_lists_split_at_fifteen_slots() {
    let ranges: Vec<(u16, u16)> = (0..9)
        .map(|i| (30000 + i * 10, 30000 + i * 10 + 1))
        .collect();
    let lists = port_lists(&ranges);
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[0].split(',').count(), 7);
    assert_eq!(port_lists(&[(80, 80), (30000, 32767)]), ["80,30000:32767"]);
}
