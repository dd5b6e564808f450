//! The seed article's example, rule for rule: compile `examples/seed-article.yaml` and
//! compare the server pod's `cali-tw-` chain and the policy's `cali-pi-` chain with the
//! `iptables-save` listing in ../shared/seeds/004 (hash comments and hashed names aside).

use std::collections::BTreeSet;
use std::path::PathBuf;

use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::update::FamilyState;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::datastore::manifests;
use netpol_agent::iface_naming::SandboxResolver;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::RuleConfig;

fn compile_seed() -> FamilyState {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/seed-article.yaml");
    let (objects, errors) = manifests::load_paths(&[path]).expect("example loads");
    assert!(errors.is_empty(), "{errors:?}");
    let mut graph = Calculation::new(
        GraphConfig {
            node_name: "node-1".into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig {
                interface_prefixes: vec!["veth-".into()],
                ..RuleConfig::default()
            },
        },
        Box::new(SandboxResolver::new("veth-").unwrap()),
    );
    graph.feed(&objects);
    graph.flush();
    assert!(graph.rejections().is_empty(), "{:?}", graph.rejections());
    graph.snapshot().families.remove(&IpFamily::V4).unwrap()
}

/// A chain's rules without their `cali:` hash comment, with `names` replaced by placeholders.
fn normalized(state: &FamilyState, chain: &str, names: &[(&str, &str)]) -> Vec<String> {
    let chain = state.chains.get(chain).unwrap_or_else(|| {
        panic!(
            "no chain {chain}; have {:?}",
            state.chains.keys().collect::<Vec<_>>()
        )
    });
    chain
        .rules
        .iter()
        .map(|r| {
            assert_eq!(r.hash.len(), 16);
            let mut body = r
                .body
                .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "");
            for (name, placeholder) in names {
                body = body.replace(name, placeholder);
            }
            body
        })
        .collect()
}

#[test]
fn server_chains_match_the_article_listing() {
    let state = compile_seed();
    let policy_chain = state
        .chains
        .keys()
        .find(|c| c.starts_with("cali-pi-"))
        .expect("policy chain")
        .clone();
    // Like the article's cali-pi-_QW8Cu1Tr3dYs2pTUY0-: the name is hashed to 28 characters.
    assert!(
        policy_chain.starts_with("cali-pi-_") && policy_chain.len() == 28,
        "{policy_chain}"
    );
    let set = state.sets.keys().next().expect("selector set").clone();
    // Like the article's cali40s:9WLohU2k-3hMTr5j-HlIcA0.
    assert!(set.starts_with("cali40s:") && set.len() == 31, "{set}");
    let names = [(policy_chain.as_str(), "<POLICY>"), (set.as_str(), "<SET>")];

    // Article rows 1-12 of `Chain cali-tw-veth-13dd25c5cb`. Deviations, all required by the
    // design: rows 1-3 (conntrack, marks cleared) are the shared chain `cali-wl-start`, which
    // every workload chain jumps to first (one jump instead of three rules per chain: the
    // legacy restore's cost follows the table's size); row 3 clears accept *and* pass
    // (0x30000; the article's older felix cleared only 0x10000); and rows 10-11 (the empty
    // ServiceAccount profile) are not rendered.
    assert_eq!(
        normalized(&state, "cali-wl-start", &names),
        [
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-m conntrack --ctstate INVALID -j DROP",
            "-j MARK --set-xmark 0x0/0x30000",
        ]
    );
    assert_eq!(
        normalized(&state, "cali-tw-veth-13dd25c5cb", &names),
        [
            "-j cali-wl-start",
            "-m comment --comment \"Start of policies\" -j MARK --set-xmark 0x0/0x20000",
            "-m mark --mark 0x0/0x20000 -j <POLICY>",
            "-m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            "-m comment --comment \"Drop if no policies passed packet\" -m mark --mark 0x0/0x20000 -j DROP",
            "-j cali-pri-kns.default",
            "-m comment --comment \"Return if profile accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            "-m comment --comment \"Drop if no profiles matched\" -j DROP",
        ]
    );

    // Article: the six rules of `Chain cali-pi-_QW8Cu1Tr3dYs2pTUY0-`
    //   MARK  match-set cali40s:... src  MARK or 0x10000
    //   RETURN  mark match 0x10000/0x10000
    //   MARK  MARK xset 0x40000/0xc0000
    //   MARK  10.16.2.122  MARK and 0xfffbffff
    //   MARK  tcp 10.16.2.0/24  multiport dports 3456 mark match 0x40000/0x40000 MARK or 0x10000
    //   RETURN  mark match 0x10000/0x10000
    assert_eq!(
        normalized(&state, &policy_chain, &names),
        [
            "-m comment --comment \"KubernetesNetworkPolicy default/hyapp-server ingress\" -m set --match-set <SET> src -j MARK --set-xmark 0x10000/0x10000",
            "-m mark --mark 0x10000/0x10000 -j RETURN",
            "-j MARK --set-xmark 0x40000/0xc0000",
            "-s 10.16.2.122/32 -j MARK --set-xmark 0x0/0x40000",
            "-s 10.16.2.0/24 -p tcp -m multiport --dports 3456 -m mark --mark 0x40000/0x40000 -j MARK --set-xmark 0x10000/0x10000",
            "-m mark --mark 0x10000/0x10000 -j RETURN",
        ]
    );

    // The dispatch chain sends the server's veth to its chain, as in the article.
    let dispatch = normalized(&state, "cali-to-wl-dispatch", &[]);
    assert!(
        dispatch.contains(&"-o veth-13dd25c5cb -g cali-tw-veth-13dd25c5cb".to_string()),
        "{dispatch:?}"
    );
    assert_eq!(
        dispatch.last().unwrap(),
        "-m comment --comment \"Unknown interface\" -j DROP"
    );
}

#[test]
fn selector_set_holds_exactly_the_two_clients() {
    let state = compile_seed();
    assert_eq!(state.sets.len(), 1);
    let members: BTreeSet<String> = state
        .sets
        .values()
        .next()
        .unwrap()
        .members
        .iter()
        .map(|m| m.to_string())
        .collect();
    // One client is local, one is on another node: membership is cluster-wide.
    assert_eq!(
        members,
        BTreeSet::from(["10.16.1.11".to_string(), "10.16.3.7".to_string()])
    );
}

#[test]
fn egress_allow_all_is_one_unconditional_allow() {
    let state = compile_seed();
    let po = state
        .chains
        .keys()
        .find(|c| c.starts_with("cali-po-"))
        .unwrap()
        .clone();
    assert_eq!(
        normalized(&state, &po, &[]),
        [
            "-m comment --comment \"KubernetesNetworkPolicy default/hyapp-server egress\" -j MARK --set-xmark 0x10000/0x10000",
            "-m mark --mark 0x10000/0x10000 -j RETURN",
        ]
    );
}
