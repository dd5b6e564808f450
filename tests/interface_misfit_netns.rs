//! A configuration that does not fit the node's CNI is reported, never silent (issue 20):
//! pods wired by routed veths named `vethbar…` (a CNI that is not Calico), the agent run
//! with the shipped DaemonSet's old settings (`calico` naming, prefix `cali`) and a
//! default-deny policy. Within the grace period (2 s here) plus a check (2 s), the agent
//! warns once per pod naming the interface that carries its address, counts both pods in
//! `netpol_local_pods_without_interface`, and fails readiness (no local pod has an
//! interface). With settings that fit, the same node is ready, counts none, warns of none,
//! and the policy holds with real packets.

mod common;
mod pod_node;

use std::time::{Duration, Instant};

use pod_node::{PodNode, PodSpec};

const HEALTH: u16 = 9099;
const METRICS: u16 = 9091;

fn node() -> PodNode {
    let spec = |name, n, iface| PodSpec {
        namespace: "x",
        name,
        labels: &[("app", "web")],
        n,
        iface: Some(iface),
    };
    let node = PodNode::new(
        "misfit",
        "nft",
        vec![spec("a", 10, "vethbar01"), spec("b", 11, "vethbar02")],
    );
    node.write_policies(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n",
    );
    node
}

fn env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![
        ("FELIX_INTERFACEGRACEPERIOD", "2"),
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
        ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
    ];
    v.extend_from_slice(extra);
    v
}

fn gauge(node: &PodNode) -> Option<i64> {
    let (_, body) = common::http_get(&node.node.name, METRICS, "/metrics").ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("netpol_local_pods_without_interface "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_prefix_that_fits_no_pod_is_reported_within_the_grace_period() {
    common::require_root();
    let mut node = node();
    node.start_agent(&env(&[
        ("FELIX_INTERFACENAMESCHEME", "calico"),
        ("FELIX_INTERFACEPREFIX", "cali"),
    ]));
    let started = Instant::now();
    let body = node.wait_for(Duration::from_secs(15), "readiness never failed", || {
        let (status, body) = common::http_get(&node.node.name, HEALTH, "/readiness").ok()?;
        (status == 503 && body.contains("none of the 2 local pods")).then_some(body)
    });
    let reported_after = started.elapsed();
    assert!(body.contains("FELIX_INTERFACEPREFIX=cali"), "{body}");
    let log = node.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("local pod without a host interface"))
        .collect();
    assert_eq!(warnings.len(), 2, "one warning per pod: {log}");
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("x/a") && l.contains("vethbar01 (host route, table 254)")),
        "{log}"
    );
    assert!(
        warnings
            .iter()
            .all(|l| l.contains("no such interface exists")),
        "{log}"
    );
    assert_eq!(
        node.wait_for(Duration::from_secs(5), "no gauge", || gauge(&node)),
        2
    );
    eprintln!(
        "reported {:.1} s after the agent started",
        reported_after.as_secs_f64()
    );
    // Once each, however long it goes on.
    std::thread::sleep(Duration::from_secs(3));
    let again = node
        .log()
        .matches("local pod without a host interface")
        .count();
    assert_eq!(again, 2, "{}", node.log());
}

#[test]
fn settings_that_fit_report_nothing_and_enforce() {
    common::require_root();
    let mut node = node();
    node.start_agent(&env(&[
        ("FELIX_INTERFACENAMESCHEME", "routes"),
        ("FELIX_INTERFACEPREFIX", "vethbar"),
    ]));
    node.wait_for(Duration::from_secs(15), "never ready", || {
        let (status, _) = common::http_get(&node.node.name, HEALTH, "/readiness").ok()?;
        (status == 200).then_some(())
    });
    // Past the grace period and a check: still nothing to report.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(gauge(&node), Some(0));
    assert!(
        !node.log().contains("local pod without a host interface"),
        "{}",
        node.log()
    );
    let (status, _) = common::http_get(&node.node.name, HEALTH, "/readiness").unwrap();
    assert_eq!(status, 200);
    // The default-deny holds: b cannot reach a.
    let a = node.pod("x/a").v4;
    let out = node.pod("x/b").ns.exec(&[
        "python3",
        "-c",
        &format!("import socket;s=socket.socket();s.settimeout(1);s.connect(('{a}',80))"),
    ]);
    assert!(
        !out.status.success(),
        "x/b reached x/a through a default-deny"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("timed out"),
        "dropped, not refused: {stderr}"
    );
}

/// IPv6 support off on a dual-stack node (issue 35): the pods' IPv6 traffic meets no rule of
/// ours, so the agent must not be ready, naming the pods, while IPv4 stays enforced. The
/// shipped DaemonSet no longer sets `FELIX_IPV6SUPPORT=false`; with the default the same node
/// is ready and both families are policed.
#[test]
fn ipv6_support_off_with_ipv6_pods_is_not_ready_and_names_them() {
    common::require_root();
    let mut node = node();
    node.start_agent(&[
        ("FELIX_INTERFACENAMESCHEME", "routes"),
        ("FELIX_INTERFACEPREFIX", "vethbar"),
        ("FELIX_IPV6SUPPORT", "false"),
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
        ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
    ]);
    let body = node.wait_for(
        Duration::from_secs(15),
        "readiness never named the IPv6 pods",
        || {
            let (status, body) = common::http_get(&node.node.name, HEALTH, "/readiness").ok()?;
            (status == 503 && body.contains("FELIX_IPV6SUPPORT=false")).then_some(body)
        },
    );
    assert!(
        body.contains("x/a (fd77::a)") && body.contains("2 local pod"),
        "{body}"
    );
    let (_, metrics) = common::http_get(&node.node.name, METRICS, "/metrics").unwrap();
    assert!(
        metrics.contains("netpol_local_pods_unprogrammed_family 2"),
        "{metrics}"
    );
    let log = node.log();
    assert_eq!(
        log.matches("an address of a family this agent does not program")
            .count(),
        2,
        "one error per pod: {log}"
    );
    // IPv4 is still enforced: the default-deny holds.
    let a = node.pod("x/a").v4;
    let path = format!("/run/netns/{}", node.pod("x/b").ns.name);
    assert!(common::connect_in(&path, (a, 80).into(), None, Duration::from_millis(500)).is_err());
}

#[test]
fn ipv6_support_by_default_polices_both_families_and_is_ready() {
    common::require_root();
    let mut node = node();
    node.start_agent(&[
        ("FELIX_INTERFACENAMESCHEME", "routes"),
        ("FELIX_INTERFACEPREFIX", "vethbar"),
        ("FELIX_HEALTHENABLED", "true"),
        ("FELIX_HEALTHHOST", "127.0.0.1"),
    ]);
    node.wait_for(Duration::from_secs(15), "never ready", || {
        let (status, _) = common::http_get(&node.node.name, HEALTH, "/readiness").ok()?;
        (status == 200).then_some(())
    });
    // The default-deny holds over IPv6 too (a listener, so an open path would connect).
    let a = node.pod("x/a");
    let listener = common::in_netns(&a.ns.name, || {
        std::net::TcpListener::bind(("::", 80)).expect("bind")
    });
    let path = format!("/run/netns/{}", node.pod("x/b").ns.name);
    let v6 = std::net::SocketAddr::new(a.v6.into(), 80);
    let out = common::connect_in(&path, v6, None, Duration::from_millis(700));
    assert!(
        out.as_ref().is_err_and(|e| e.contains("timed out")),
        "x/b reached x/a over IPv6 through a default-deny: {out:?}"
    );
    drop(listener);
}
