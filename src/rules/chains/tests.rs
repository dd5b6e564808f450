//! The static and workload chains, rule by rule: the layout felix users read, the shared start,
//! the allow and deny actions, anti-spoofing per family.

use super::*;

fn bodies(c: &Chain) -> Vec<String> {
    c.rules
        .iter()
        .map(|r| {
            let needle = format!("-m comment --comment \"cali:{}\" ", r.hash);
            r.body
                .replace(&needle, "")
                .replace(&needle[..needle.len() - 1], "")
        })
        .collect()
}

#[test]
fn forward_dispatches_every_prefix() {
    let cfg = RuleConfig {
        interface_prefixes: vec!["eni".into(), "veth".into()],
        ..RuleConfig::default()
    };
    let chains = static_chains(&cfg, IpFamily::V4, false);
    assert_eq!(
        bodies(&chains[0]),
        [
            "-j MARK --set-xmark 0x0/0xe0000",
            "-i eni+ -j cali-from-wl-dispatch",
            "-o eni+ -j cali-to-wl-dispatch",
            "-i veth+ -j cali-from-wl-dispatch",
            "-o veth+ -j cali-to-wl-dispatch",
        ]
    );
    assert_eq!(
        bodies(&chains[1]),
        ["-i eni+ -g cali-wl-to-host", "-i veth+ -g cali-wl-to-host"]
    );
    assert_eq!(
        bodies(&chains[2]),
        [
            "-j cali-from-wl-dispatch",
            "-m comment --comment \"Configured DefaultEndpointToHostAction\" -j ACCEPT"
        ]
    );
    assert_eq!(
        bodies(&chains[3]),
        ["-o eni+ -j RETURN", "-o veth+ -j RETURN"]
    );
}

#[test]
fn ipv6_lets_neighbour_discovery_reach_the_host() {
    let chains = static_chains(&RuleConfig::default(), IpFamily::V6, false);
    let wl = bodies(&chains[2]);
    assert_eq!(wl.len(), 8);
    assert_eq!(wl[4], "-p ipv6-icmp -m icmp6 --icmpv6-type 135 -j ACCEPT");
}

#[test]
fn kernel_rules_put_the_accept_last() {
    let rules = kernel_chain_rules(&RuleConfig::default(), IpFamily::V4);
    assert_eq!(rules[0].chain, "FORWARD");
    assert!(rules[0].inserts[0].body.ends_with("-j cali-FORWARD"));
    assert!(rules[0].appends[0].body.ends_with(
        "-m comment --comment \"Policy explicitly accepted packet.\" -m mark --mark 0x10000/0x10000 -j ACCEPT"
    ));
    assert!(rules[2].inserts[0].body.ends_with("-j cali-OUTPUT"));
}

#[test]
fn unisolated_endpoint_goes_straight_to_the_profile() {
    let ips = ["10.0.0.5".parse().unwrap()];
    let [tw, fw] = endpoint_chains(
        &RuleConfig::default(),
        IpFamily::V4,
        "cali1",
        &ips,
        "ns",
        &[],
        &[],
    );
    assert_eq!(tw.name, "cali-tw-cali1");
    assert_eq!(fw.name, "cali-fw-cali1");
    assert_eq!(
        bodies(&tw),
        [
            "-j cali-wl-start",
            "-j cali-pri-kns.ns",
            "-m comment --comment \"Return if profile accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            "-m comment --comment \"Drop if no profiles matched\" -j DROP",
        ]
    );
    // The egress chain starts with the source check, then the same layout.
    assert_eq!(
        bodies(&fw)[0],
        "! -s 10.0.0.5/32 -m comment --comment \"Drop if the source is not the workload address\" -j DROP"
    );
    assert!(bodies(&fw)[2].ends_with("cali-pro-kns.ns"));
    // Every workload chain starts with what felix puts at the top of each, shared.
    let start = static_chains(&RuleConfig::default(), IpFamily::V4, false)
        .into_iter()
        .find(|c| c.name == WL_START_CHAIN)
        .expect("the start chain");
    assert_eq!(
        bodies(&start),
        [
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-m conntrack --ctstate INVALID -j DROP",
            "-j MARK --set-xmark 0x0/0x30000",
        ]
    );
}

#[test]
fn source_check_per_family_and_switch() {
    let ips: [IpAddr; 2] = ["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
    let cfg = RuleConfig::default();
    let fw6 = endpoint_chains(&cfg, IpFamily::V6, "c", &ips, "ns", &[], &[])[1].clone();
    assert!(bodies(&fw6)[0].starts_with("! -s fd00::5/128 "));
    // No address of the family: nothing of it passes.
    let fw6 = endpoint_chains(&cfg, IpFamily::V6, "c", &ips[..1], "ns", &[], &[])[1].clone();
    assert_eq!(
        bodies(&fw6)[0],
        "-m comment --comment \"Drop if the source is not the workload address\" -j DROP"
    );
    // Several addresses of one family (not from the API server): scratch-mark form.
    let two: [IpAddr; 2] = ["10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap()];
    let fw = endpoint_chains(&cfg, IpFamily::V4, "c", &two, "ns", &[], &[])[1].clone();
    assert_eq!(
        bodies(&fw)[..4],
        [
            "-j MARK --set-xmark 0x40000/0x40000",
            "-s 10.0.0.5/32 -j MARK --set-xmark 0x0/0x40000",
            "-s 10.0.0.6/32 -j MARK --set-xmark 0x0/0x40000",
            "-m comment --comment \"Drop if the source is not the workload address\" -m mark --mark 0x40000/0x40000 -j DROP",
        ]
    );
    // The ingress chain never checks sources; off, neither does the egress chain.
    let off = RuleConfig {
        workload_source_check: false,
        ..RuleConfig::default()
    };
    let [tw, fw] = endpoint_chains(&off, IpFamily::V4, "c", &ips, "ns", &[], &[]);
    assert_eq!(bodies(&fw)[0], "-j cali-wl-start");
    assert_eq!(bodies(&tw)[0], "-j cali-wl-start");
}

#[test]
fn reject_and_return_actions_follow_config() {
    let cfg = RuleConfig {
        deny_action: crate::rules::DenyAction::Reject,
        allow_action: AllowAction::Return,
        ..RuleConfig::default()
    };
    let [tw, _] = endpoint_chains(&cfg, IpFamily::V6, "c", &[], "ns", &[], &[]);
    let b = bodies(&tw);
    // The start's RETURN leaves only the start chain: the workload chain returns on the
    // accept bit the start set, before anything else could.
    assert_eq!(b[0], "-j cali-wl-start");
    assert_eq!(b[1], "-m mark --mark 0x10000/0x10000 -j RETURN");
    assert!(b
        .last()
        .unwrap()
        .ends_with("-j REJECT --reject-with icmp6-port-unreachable"));
    let start = static_chains(&cfg, IpFamily::V6, false)
        .into_iter()
        .find(|c| c.name == WL_START_CHAIN)
        .expect("the start chain");
    assert_eq!(
        bodies(&start),
        [
            "-m conntrack --ctstate RELATED,ESTABLISHED -j MARK --set-xmark 0x10000/0x10000",
            "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
            "-m conntrack --ctstate INVALID -j REJECT --reject-with icmp6-port-unreachable",
            "-j MARK --set-xmark 0x0/0x30000",
        ]
    );
}
