//! What each fuzz target feeds netpol-agent and what it checks besides "no panic". One
//! function per target (the binaries in `fuzz_targets/` only call them); every check is an
//! `assert!`, so a violated invariant is a crash libFuzzer saves like any other.
//!
//! The fuzzer is libFuzzer through `libfuzzer-sys`, built on the stable toolchain with
//! rustc's SanitizerCoverage pass (`scripts/fuzz.sh` has the flags). Why not the usual tools:
//! `cargo fuzz` needs nightly for its sanitizer flags, and nightly cannot be fetched here;
//! afl.rs (`cargo afl`) works on stable too, but needs AFL++ built from source or Debian's
//! 4.04c, older than afl.rs expects. libFuzzer comes as source inside the `libfuzzer-sys`
//! crate and builds with the C++ compiler already on the machine, so `cargo` alone fetches
//! everything; rustc's `-C passes=sancov-module` gives libFuzzer the same coverage counters
//! cargo-fuzz does (without AddressSanitizer, which Rust's safe code needs least).

pub mod seeds;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use netpol_agent::agent::{Calculation, OWNERSHIP};
use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::dataplane::iptables::parse::parse_save;
use netpol_agent::dataplane::iptables::plan::{apply_ops, plan_table, ChainDeletions};
use netpol_agent::dataplane::iptables::{DesiredTable, TableState};
use netpol_agent::dataplane::owned::OwnedState;
use netpol_agent::datastore::limits::MAX_MESSAGE_CHARS;
use netpol_agent::datastore::manifests::parse_manifest_bytes;
use netpol_agent::iface_naming::{CalicoResolver, InterfaceResolver, SandboxResolver};
use netpol_agent::model::{validate, IpFamily, K8sObject, LabelSel, Peer, PortMatch};
use netpol_agent::rules::chains::kernel_chain_rules;
use netpol_agent::rules::token::{ipset_line_problem, restore_line_problem, script_problem};
use netpol_agent::rules::{ChainInsertMode, RuleConfig};

/// A message meant for a log line: bounded, and one line.
fn assert_loggable(message: &str, max_chars: usize) {
    assert!(
        message.chars().count() <= max_chars,
        "a message of {} characters: {:?}",
        message.chars().count(),
        message.chars().take(200).collect::<String>()
    );
    assert!(
        !message.contains(['\n', '\r', '\0']),
        "a message spans lines: {message:?}"
    );
}

/// Renders a table back into `iptables-save` form: chains with rules through their rules
/// (as `-A` lines), empty ones through a declaration.
fn save_text(state: &TableState) -> String {
    let mut out = String::from("*filter\n");
    for (name, rules) in &state.chains {
        if rules.is_empty() {
            out.push_str(&format!(":{name} - [0:0]\n"));
        }
        for rule in rules {
            if rule.body.is_empty() {
                out.push_str(&format!("-A {name}\n"));
            } else {
                out.push_str(&format!("-A {name} {}\n", rule.body));
            }
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// The demo shop compiled for node-1 (IPv4): what the planner is asked to reach from
/// whatever kernel state the fuzzer makes up.
fn demo_desired() -> &'static DesiredTable {
    static DESIRED: OnceLock<DesiredTable> = OnceLock::new();
    DESIRED.get_or_init(|| {
        let mut objects = Vec::new();
        for (name, text) in seeds::DEMO {
            let (parsed, errors) = parse_manifest_bytes(text.as_bytes(), name);
            assert!(errors.is_empty(), "{errors:?}");
            objects.extend(parsed);
        }
        let rules = RuleConfig::default();
        let graph = Calculation::of_objects(
            GraphConfig {
                node_name: "node-1".into(),
                families: vec![IpFamily::V4],
                rules: rules.clone(),
            },
            Box::new(CalicoResolver::default()),
            &objects,
        );
        DesiredTable {
            chains: graph.snapshot().families[&IpFamily::V4].chains.clone(),
            kernel: kernel_chain_rules(&rules, IpFamily::V4),
            insert_mode: ChainInsertMode::Insert,
        }
    })
}

/// `iptables-save` output of either backend (their dialects differ in header comments,
/// warnings and counters, which the seeds cover), as bytes. Checks: parsing never panics;
/// for UTF-8 input the table survives a render → parse round trip unchanged; and the writer's
/// planner, started from that table, reaches exactly the desired demo state in its model.
pub fn iptables_save(data: &[u8]) {
    let Ok(state) = parse_save(data, "filter", OWNERSHIP) else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    let mut owned = OwnedState::default();
    owned.add_iptables(&text, &OWNERSHIP);

    if std::str::from_utf8(data).is_ok() {
        let again = parse_save(save_text(&state).as_bytes(), "filter", OWNERSHIP)
            .expect("our own rendering parses");
        assert_eq!(again, state, "render → parse changed the table");
    }

    let desired = demo_desired();
    for deletions in [ChainDeletions::WithUpdates, ChainDeletions::Separate] {
        let plan = plan_table(&state, desired, None, deletions);
        let mut model = state.clone();
        let all: Vec<_> = plan.main.iter().chain(&plan.deferred).cloned().collect();
        for op in &all {
            if let Some(problem) = restore_line_problem(&op.line()) {
                // A line the writer would refuse: only from a kernel chain name no kernel
                // holds (iptables refuses such names), never from our side.
                assert!(
                    !op.line().starts_with(":cali-"),
                    "unsafe line of ours {:?}: {problem}",
                    op.line()
                );
                return;
            }
        }
        apply_ops(&mut model, &all).expect("the plan applies to the table it was made from");
        for (name, chain) in &desired.chains {
            let bodies: Vec<&str> = model.chains[name].iter().map(|r| r.body.as_str()).collect();
            let want: Vec<&str> = chain.rules.iter().map(|r| r.body.as_str()).collect();
            assert_eq!(bodies, want, "chain {name} after the plan");
        }
        for name in model.chains.keys() {
            assert!(
                !OWNERSHIP.owns_chain(name) || desired.chains.contains_key(name),
                "chain {name} should be gone"
            );
        }
        for k in &desired.kernel {
            let rules = &model.chains[&k.chain];
            let top: Vec<&str> = rules
                .iter()
                .take(k.inserts.len())
                .map(|r| r.body.as_str())
                .collect();
            let want: Vec<&str> = k.inserts.iter().map(|r| r.body.as_str()).collect();
            assert_eq!(top, want, "{} inserts on top", k.chain);
            let tail: Vec<&str> = rules
                .iter()
                .skip(rules.len().saturating_sub(k.appends.len()))
                .map(|r| r.body.as_str())
                .collect();
            let want: Vec<&str> = k.appends.iter().map(|r| r.body.as_str()).collect();
            assert_eq!(tail, want, "{} appends last", k.chain);
            let ours = rules.iter().filter(|r| r.hash.is_some()).count();
            assert_eq!(
                ours,
                k.inserts.len() + k.appends.len(),
                "{} extra copies",
                k.chain
            );
        }
    }
}

/// `ipset save` output. Checks: no panic; the sets the writer keeps survive a
/// parse → render → parse round trip (`reread_save` of its own output prints it again).
pub fn ipset_save(data: &[u8]) {
    let Some(text) = netpol_agent::dataplane::ipsets::reread_save(data) else {
        return;
    };
    let mut owned = OwnedState::default();
    owned.add_ipsets(&String::from_utf8_lossy(data), IpFamily::V4);
    owned.add_ipsets(&String::from_utf8_lossy(data), IpFamily::V6);
    let again = netpol_agent::dataplane::ipsets::reread_save(text.as_bytes()).expect("our text");
    assert_eq!(again, text, "render → parse changed our sets");
}

/// Manifest files as bytes (YAML or JSON, lists, many documents). Checks: no panic; every
/// error is one bounded line; every object can be validated without panicking.
pub fn manifests(data: &[u8]) {
    let (objects, errors) = parse_manifest_bytes(data, "fuzz.yaml");
    for e in &errors {
        assert_loggable(&e.to_string(), MAX_MESSAGE_CHARS + 200);
    }
    for object in &objects {
        let _ = object.object_ref();
        let result = match object {
            K8sObject::Pod(p) => validate::pod(p).map(|_| ()),
            K8sObject::Namespace(n) => validate::namespace(n).map(|_| ()),
            K8sObject::NetworkPolicy(np) => validate::network_policy(np).map(|_| ()),
            K8sObject::ClusterNetworkPolicy(cnp) => {
                validate::cluster_network_policy(cnp).map(|_| ())
            }
            K8sObject::StagedNetworkPolicy(s) => validate::staged_network_policy(s).map(|_| ()),
            K8sObject::StagedClusterNetworkPolicy(s) => {
                validate::staged_cluster_network_policy(s).map(|_| ())
            }
        };
        if let Err(e) = result {
            check_validation_error(&e);
        }
    }
}

fn check_validation_error(e: &validate::ValidationError) {
    assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
    assert_loggable(&e.to_string(), 2000);
}

fn check_selector(sel: &LabelSel) {
    assert_eq!(
        &LabelSel::from_exprs(sel.exprs().to_vec()),
        sel,
        "canonical form is stable"
    );
    let labels: BTreeMap<String, String> = sel
        .keys()
        .map(|k| (k.to_string(), "v".to_string()))
        .collect();
    let _ = sel.matches(&labels);
    let _ = sel.matches(&BTreeMap::new());
}

/// Arbitrary JSON as the API server could send it, the first byte choosing what it is: a
/// Pod, a Namespace, a NetworkPolicy or a label selector. Checks: validation never panics; it
/// either names a field and says what is wrong (in one bounded line), or accepts an object
/// whose parts keep the model's promises (names are safe tokens, CIDRs are networks,
/// excepts inside them, port ranges ordered, selectors canonical).
pub fn validate(data: &[u8]) {
    let Some((&which, json)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            let Ok(pod) = serde_json::from_slice(json) else {
                return;
            };
            match validate::pod(&pod) {
                Ok(Some(info)) => {
                    assert!(!info.ips.is_empty());
                    let mut unique = info.ips.clone();
                    unique.sort();
                    unique.dedup();
                    assert_eq!(unique.len(), info.ips.len(), "duplicate IPs kept");
                    assert_safe_key(&info.key.to_string());
                    for port in &info.named_ports {
                        assert!(port.port > 0 && port.name.len() <= 15, "{port:?}");
                    }
                }
                Ok(None) => {}
                Err(e) => check_validation_error(&e),
            }
        }
        1 => {
            let Ok(ns) = serde_json::from_slice(json) else {
                return;
            };
            match validate::namespace(&ns) {
                Ok(info) => {
                    assert_safe_key(&info.name);
                    assert_eq!(
                        info.labels.get("kubernetes.io/metadata.name"),
                        Some(&info.name)
                    );
                }
                Err(e) => check_validation_error(&e),
            }
        }
        2 => {
            let Ok(np) = serde_json::from_slice(json) else {
                return;
            };
            match validate::network_policy(&np) {
                Ok(info) => {
                    assert_safe_key(&info.key.to_string());
                    check_selector(&info.pod_selector);
                    for rule in info.ingress.iter().chain(&info.egress).flatten() {
                        for port in &rule.ports {
                            match &port.port {
                                PortMatch::Range { first, last } => {
                                    assert!(*first >= 1 && first <= last, "{port:?}")
                                }
                                PortMatch::Named(name) => {
                                    assert!(!name.is_empty() && name.len() <= 15)
                                }
                                PortMatch::Any => {}
                            }
                        }
                        for peer in rule.peers.iter().flatten() {
                            match peer {
                                Peer::IpBlock { cidr, except } => {
                                    assert_eq!(*cidr, cidr.trunc());
                                    for e in except {
                                        assert!(
                                            cidr.contains(e) && e.prefix_len() > cidr.prefix_len()
                                        );
                                    }
                                }
                                Peer::Pods { namespaces, pods } => {
                                    check_selector(pods);
                                    if let netpol_agent::model::NamespaceScope::Selector(s) =
                                        namespaces
                                    {
                                        check_selector(s);
                                    }
                                }
                            }
                        }
                    }
                }
                Err(e) => check_validation_error(&e),
            }
        }
        _ => {
            let Ok(sel) = serde_json::from_slice(json) else {
                return;
            };
            match validate::label_selector(&sel, "NetworkPolicy", "fuzz/np", "spec.podSelector") {
                Ok(sel) => check_selector(&sel),
                Err(e) => check_validation_error(&e),
            }
        }
    }
}

fn assert_safe_key(key: &str) {
    assert!(
        key.bytes().all(|b| b.is_ascii_lowercase()
            || b.is_ascii_digit()
            || matches!(b, b'-' | b'.' | b'/')),
        "an accepted name holds more than DNS characters: {key:?}"
    );
}

/// What `compile` does with manifests, the first byte choosing the options (IP family,
/// interface naming, chain insert mode, bridge mode). Checks: every line of both scripts is
/// made of safe words; and the iptables script, read back as `iptables-save` output, holds
/// exactly the chains and rules that were rendered (render → parse round trip of our rules).
pub fn compile(data: &[u8]) {
    let Some((&flags, manifest)) = data.split_first() else {
        return;
    };
    let family = if flags & 1 == 0 {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    let resolver: Box<dyn InterfaceResolver> = if flags & 2 == 0 {
        Box::new(CalicoResolver::default())
    } else {
        match SandboxResolver::new("veth-") {
            Ok(r) => Box::new(r),
            Err(_) => return,
        }
    };
    let mode = if flags & 4 == 0 {
        ChainInsertMode::Insert
    } else {
        ChainInsertMode::Append
    };
    let rules = RuleConfig {
        insert_mode: mode,
        bridge: (flags & 8 != 0).then(|| "cni0".to_string()),
        ..RuleConfig::default()
    };
    let (objects, _) = parse_manifest_bytes(manifest, "fuzz.yaml");
    let graph = Calculation::of_objects(
        GraphConfig {
            node_name: "node-1".into(),
            families: vec![family],
            rules: rules.clone(),
        },
        resolver,
        &objects,
    );
    let state = graph.snapshot();
    let Some(fam) = state.families.get(&family) else {
        return;
    };
    let RestoreScripts {
        ipsets: ipset_script,
        iptables: script,
    } = fam.restore_scripts(&rules, family, 1 << 20);
    if let Some(problem) = script_problem(&ipset_script, ipset_line_problem) {
        panic!("unsafe ipset script: {problem}");
    }
    if let Some(problem) = script_problem(&script, restore_line_problem) {
        panic!("unsafe iptables script: {problem}");
    }
    let saved = script
        .lines()
        .map(|l| match l.strip_prefix("-I ") {
            // `-I CHAIN 1 body` is `-A CHAIN body` once applied to an empty chain, in order.
            Some(rest) => {
                let (chain, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                format!("-A {chain} {}", tail.strip_prefix("1 ").unwrap_or(tail))
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let parsed = parse_save(saved.as_bytes(), "filter", OWNERSHIP).expect("our script parses");
    for (name, chain) in &fam.chains {
        let got: Vec<(Option<&str>, &str)> = parsed.chains[name]
            .iter()
            .map(|r| (r.hash.as_deref(), r.body.as_str()))
            .collect();
        let want: Vec<(Option<&str>, &str)> = chain
            .rules
            .iter()
            .map(|r| (Some(r.hash.as_str()), r.body.as_str()))
            .collect();
        assert_eq!(got, want, "chain {name} read back");
    }
}

/// One rtnetlink datagram as the routes resolver receives it (dump replies and events).
/// Checks: no panic; every address the resolver maps names at least one interface.
pub fn rtnetlink(data: &[u8]) {
    use netlink_packet_core::NetlinkPayload;
    use netlink_packet_route::RouteNetlinkMessage;
    let Ok(messages) = netpol_agent::host::netlink::split_messages(data) else {
        return;
    };
    let inner: Vec<RouteNetlinkMessage> = messages
        .into_iter()
        .filter_map(|m| match m.payload {
            NetlinkPayload::InnerMessage(inner) => Some(inner),
            _ => None,
        })
        .collect();
    let mut links = Vec::new();
    let mut routes = Vec::new();
    for m in &inner {
        match m {
            RouteNetlinkMessage::NewLink(l) => {
                links.extend(netpol_agent::host::netlink::parse_link(l))
            }
            RouteNetlinkMessage::NewRoute(r) => {
                routes.extend(netpol_agent::host::netlink::parse_host_route(r))
            }
            _ => {}
        }
    }
    let mut state = netpol_agent::iface_naming::RouteState::from_dump(links, routes);
    for m in &inner {
        let _ = state.apply(m);
    }
    let map = state.map();
    for (ip, names) in map.interfaces() {
        assert!(!names.is_empty(), "{ip} maps to no interface");
        assert!(map.targets(&ip).is_some_and(|t| !t.is_empty()), "{ip}");
    }
}

/// `IPT_SO_GET_INFO` + `IPT_SO_GET_ENTRIES` answers (legacy iptables' change detection):
/// the first byte picks the family, the next 84 bytes are the info, the rest the entries. The
/// info's size is also set to the blob's, so the fuzzer reaches the entry walk. No panic.
pub fn xtables(data: &[u8]) {
    use netpol_agent::dataplane::watch::xtables::{decode_info, digest_entries, GETINFO_LEN};
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let family = if which & 1 == 0 {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    if rest.len() < GETINFO_LEN {
        let _ = decode_info(rest);
        return;
    }
    let (info, blob) = rest.split_at(GETINFO_LEN);
    let Ok(mut info) = decode_info(info) else {
        return;
    };
    let _ = digest_entries(family, &info, blob);
    info.size = blob.len() as u32;
    if let Ok(digest) = digest_entries(family, &info, blob) {
        assert!(digest.changed_chains(&digest).is_empty());
    }
}

/// The netlink messages of one datagram as `(type, payload)`: the framing the watchers
/// read before they decode (a message whose length does not fit ends the datagram).
fn netlink_messages(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    const HEADER: usize = 16;
    let mut out = Vec::new();
    while data.len() >= HEADER {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let msg_type = u16::from_ne_bytes([data[4], data[5]]);
        if len < HEADER || len > data.len() {
            break;
        }
        out.push((msg_type, &data[HEADER..len]));
        data = data.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    out
}

/// One `NETLINK_NETFILTER` datagram of nf_tables events, each message classified for our
/// interest. No panic.
pub fn nft_events(data: &[u8]) {
    let interest = netpol_agent::agent::ours();
    for (msg_type, payload) in netlink_messages(data) {
        let _ = netpol_agent::dataplane::watch::nft::classify_event(msg_type, payload, &interest);
    }
}

/// One datagram of an `IPSET_CMD_LIST` dump: each message decoded as a list part, and its
/// payload digested as members. No panic.
pub fn ipset_list(data: &[u8]) {
    use netpol_agent::dataplane::watch::ipset::{decode_list_message, digest_members};
    for (msg_type, payload) in netlink_messages(data) {
        let _ = decode_list_message(msg_type, payload);
        let mut digest = Default::default();
        let _ = digest_members(payload, &mut digest);
    }
}

/// One packet as NFLOG hands it over: the decoder for an unknown family (from the IP
/// version) and for a family given by the first byte. No panic; a decoded flow prints.
pub fn nflog(data: &[u8]) {
    if let Ok(flow) = netpol_agent::host::nflog::decode::decode(data) {
        let _ = flow.to_string();
    }
    if let Some((&family, packet)) = data.split_first() {
        if let Ok(flow) = netpol_agent::host::nflog::decode::decode_for_family(family, packet) {
            let _ = flow.to_string();
        }
    }
}

/// A CRI `ListPodSandboxResponse` as protobuf. Checks: no panic; the sandbox each pod
/// resolves to is READY and is one of that pod's sandboxes.
pub fn cri(data: &[u8]) {
    use k8s_cri::v1 as cri;
    use netpol_agent::iface_naming::{select_sandbox, SandboxRecord};
    use prost::Message as _;
    let Ok(list) = cri::ListPodSandboxResponse::decode(data) else {
        return;
    };
    let records: Vec<SandboxRecord> = list
        .items
        .iter()
        .filter_map(SandboxRecord::from_sandbox)
        .collect();
    let mut pods: BTreeMap<String, Vec<&SandboxRecord>> = BTreeMap::new();
    for r in &records {
        pods.entry(r.pod.to_string()).or_default().push(r);
    }
    for (pod, sandboxes) in &pods {
        for uid in [None, Some(sandboxes[0].uid.as_str())] {
            if let Some(chosen) = select_sandbox(sandboxes.iter().copied(), uid) {
                assert!(
                    chosen.ready,
                    "{pod}: a sandbox that is not ready was chosen"
                );
                assert_eq!(&chosen.pod.to_string(), pod);
            }
        }
    }
}

/// A target: takes any bytes, panics when a check fails.
pub type Target = fn(&[u8]);

/// Every target by name, as `scripts/fuzz.sh` and `fuzz_targets/` name them.
pub const TARGETS: [(&str, Target); 11] = [
    ("iptables_save", iptables_save),
    ("ipset_save", ipset_save),
    ("manifests", manifests),
    ("validate", validate),
    ("compile", compile),
    ("rtnetlink", rtnetlink),
    ("xtables", xtables),
    ("nft_events", nft_events),
    ("ipset_list", ipset_list),
    ("nflog", nflog),
    ("cri", cri),
];

#[cfg(test)]
mod short_run;
