//! The real binary on the Kubernetes datastore: `netpol-agent run` (default datastore) with a
//! kubeconfig pointing at a local API server speaking list/watch, inside a network
//! namespace, converges to what `compile` renders for the same objects as manifests,
//! follows changes made through the API, and a watch that is cut and expired (410) relists
//! without the kernel changing at all; with streaming lists (the fake server's default, as a
//! current API server) and with paginated lists after the server refused streaming ones.

mod common;
mod kube_api;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::converge::{observed, wait_converged};
use common::{Agent, NetNs, TempDir};
use kube_api::{FakeApi, Gone, Res, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

/// The API server's listening socket must live in the agent's namespace.
fn api_in(ns: &NetNs) -> FakeApi {
    common::in_netns(&ns.name, FakeApi::start)
}

/// Every document of the demo, one object each (the API has no `kind: List`).
fn demo_objects() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo");
    let cluster: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("cluster.yaml")).unwrap())
            .unwrap();
    let mut docs: Vec<String> = cluster["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| serde_yaml_ng::to_string(item).unwrap())
        .collect();
    docs.push(std::fs::read_to_string(root.join("policies.yaml")).unwrap());
    docs.join("\n---\n")
}

#[test]
fn the_agent_on_the_api_converges_follows_changes_and_survives_a_410_relist() {
    converges_follows_and_relists(Streaming::Served);
}

#[test]
fn the_agent_falls_back_to_paginated_lists_when_streaming_lists_are_refused() {
    converges_follows_and_relists(Streaming::Refused);
}

/// Complete listings of policies so far: fresh paginated lists and streaming lists.
fn policy_listings(api: &FakeApi) -> (usize, usize) {
    let requests = api.requests();
    let policies = requests.iter().filter(|r| r.res == Res::Policies);
    let pages = policies
        .clone()
        .filter(|r| !r.watch && !r.query.contains_key("continue"))
        .count();
    let streams = policies
        .filter(|r| {
            r.watch
                && r.query
                    .get("sendInitialEvents")
                    .is_some_and(|v| v == "true")
        })
        .count();
    (pages, streams)
}

fn converges_follows_and_relists(streaming: Streaming) {
    let ns = NetNs::new("kube");
    let api = api_in(&ns);
    api.set_streaming(streaming);
    let work = TempDir::new("kube");
    let manifests = TempDir::new("kube-manifests");
    let objects = demo_objects();
    api.apply_yaml(&objects);
    std::fs::write(manifests.path.join("all.yaml"), &objects).unwrap();

    let log = work.path.join("agent.log");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, BIN, "run", "--node", "node-1"])
        .env("KUBECONFIG", kube_api::kubeconfig(&work.path, &api.url))
        .env_remove("FELIX_DATASTORETYPE")
        .env("FELIX_IPTABLESBACKEND", "legacy")
        .env("FELIX_HEALTHENABLED", "false");
    let agent = Agent::spawn(cmd, &log);
    wait_converged(&ns, &manifests.path, "legacy", &log);

    // A change through the API: the web policy goes away.
    api.delete(Res::Policies, "shop/web-from-anywhere");
    let policies = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo/policies.yaml"),
    )
    .unwrap();
    let without_web: Vec<&str> = policies
        .split("\n---\n")
        .filter(|doc| !doc.contains("name: web-from-anywhere"))
        .collect();
    let changed = demo_objects().replace(&policies, &without_web.join("\n---\n"));
    assert_ne!(
        changed, objects,
        "the policy was removed from the expectation"
    );
    std::fs::write(manifests.path.join("all.yaml"), &changed).unwrap();
    wait_converged(&ns, &manifests.path, "legacy", &log);

    // Cut every watch and make resuming impossible: the agent relists. Nothing changed on
    // the server, so the kernel must not change at any moment.
    let before = observed(&ns, "legacy", false);
    for res in kube_api::ALL {
        api.set_gone(res, Gone::Http);
        api.compact(res);
        api.close_watches(res, true);
    }
    // Watched for at least 3 s, and until the relist was seen (its back-off, jittered, and
    // the spacing of a quick watch restart may take it past 3 s), 15 s at most.
    let relisted = |pages: usize, streams: usize| match streaming {
        // Every listing streamed; none paginated.
        Streaming::Served => pages == 0 && streams >= 2,
        // One refused stream, then pages only.
        _ => streams == 1 && pages >= 2,
    };
    let start = std::time::Instant::now();
    loop {
        assert_eq!(
            observed(&ns, "legacy", false),
            before,
            "the relist changed the kernel"
        );
        let (pages, streams) = policy_listings(&api);
        let waited = start.elapsed();
        if waited >= Duration::from_secs(3) && relisted(pages, streams) {
            break;
        }
        assert!(
            waited < Duration::from_secs(15),
            "no relist after the 410 in 15 s ({pages} lists, {streams} streams; streaming {streaming:?})"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        log.contains("does not offer streaming lists"),
        streaming == Streaming::Refused,
        "the fallback is logged (only when it happens)"
    );
    drop(agent);
}
