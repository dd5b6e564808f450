//! Metrics and health of the running agent: `netpol-agent run --datastore dir:…` inside a
//! network namespace made by the test, with the metrics and health servers on 127.0.0.1 in
//! that namespace (configured through the FELIX_* variables). The test talks to them from a
//! thread that joined the namespace (`setns`).
//!
//! The first apply is held up on purpose: a set the agent needs already exists with the
//! wrong type and another program's rule references it, so the agent cannot replace it.
//! Meanwhile `/readiness` must say 503 (in sync, first apply not done) and `/liveness` 200;
//! once the foreign rule goes, the apply completes and `/readiness` turns 200. Then every
//! documented metric must be there with values that match the kernel and the manifests.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http_get, Agent, NetNs, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
const METRICS_PORT: u16 = 9091;
const HEALTH_PORT: u16 = 9099;

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/demo")
}

/// A namespace for one agent, a manifest directory holding the demo shop, and a log
/// directory, each named after `tag` and removed when dropped.
fn demo_node(tag: &str) -> (NetNs, TempDir, TempDir) {
    let ns = NetNs::new(tag);
    let dir = TempDir::new(&format!("{tag}-manifests"));
    let logs = TempDir::new(&format!("{tag}-logs"));
    for f in ["cluster.yaml", "policies.yaml"] {
        std::fs::copy(demo().join(f), dir.path.join(f)).unwrap();
    }
    (ns, dir, logs)
}

/// The agent with metrics and health on; `extra` overrides or adds environment.
fn start_agent(ns: &NetNs, dir: &Path, log: &Path, extra: &[(&str, &str)]) -> Agent {
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", dir.display()))
        .envs([
            ("FELIX_IPTABLESBACKEND", "legacy"),
            ("FELIX_LOGSEVERITYSCREEN", "Debug"),
            ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
            ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
            ("FELIX_PROMETHEUSMETRICSPORT", &METRICS_PORT.to_string()),
            ("FELIX_HEALTHENABLED", "yes"),
            ("FELIX_HEALTHHOST", "127.0.0.1"),
            ("FELIX_HEALTHPORT", &HEALTH_PORT.to_string()),
        ])
        .envs(extra.iter().copied());
    Agent::spawn(cmd, log)
}

/// Series → value from the text exposition format.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn metric(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("{series} missing from {m:#?}"))
}

const BAD_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad, namespace: shop}\nspec:\n  podSelector: {}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.0.0.0/33}}]\n";
const BROKEN_YAML: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: x\n";
const NEW_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: late, namespace: shop, labels: {app: web}}\nspec:\n  nodeName: node-1\n  containers: [{name: web, image: nginx}]\nstatus: {phase: Running, podIPs: [{ip: 10.244.1.99}]}\n";

#[test]
fn health_and_metrics_of_a_running_agent() {
    let (ns, dir, logs) = demo_node("metrics");
    std::fs::write(dir.path.join("bad-policy.yaml"), BAD_POLICY).unwrap();
    std::fs::write(dir.path.join("broken.yaml"), BROKEN_YAML).unwrap();
    let cluster = std::fs::read_to_string(dir.path.join("cluster.yaml")).unwrap();
    let local_pods = cluster.matches("nodeName: node-1").count();
    assert_eq!(local_pods, 2);

    // A set the agent will want, pre-created with the wrong type and pinned by a foreign
    // rule: the agent cannot replace it, so its first apply fails until the rule goes.
    let compiled = Command::new(BIN)
        .args(["compile", "--node", "node-1", "--manifests"])
        .arg(&dir.path)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let compiled = String::from_utf8_lossy(&compiled.stdout).into_owned();
    let pinned = compiled
        .lines()
        .find_map(|l| l.strip_prefix("create cali40s:"))
        .map(|rest| format!("cali40s:{}", rest.split_whitespace().next().unwrap()))
        .expect("a selector set");
    ns.exec_ok(&["ipset", "create", &pinned, "hash:ip"]);
    let foreign = ["-m", "set", "--match-set", &pinned, "src", "-j", "ACCEPT"];
    let mut add = vec!["iptables-legacy", "-A", "INPUT"];
    add.extend_from_slice(&foreign);
    ns.exec_ok(&add);

    let agent = start_agent(&ns, &dir.path, &logs.path.join("agent.log"), &[]);
    let wait = common::scaled(Duration::from_secs(20));
    let health = |path: &str| http_get(&ns.name, HEALTH_PORT, path).ok();

    // Live, in sync, but not ready while the first apply cannot complete.
    let (code, why) = agent.wait_until(wait, "readiness: first apply pending", || {
        health("/readiness").filter(|(_, body)| body.contains("first full apply"))
    });
    assert_eq!(code, 503, "{why}");
    assert_eq!(health("/liveness").map(|r| r.0), Some(200));
    let before = agent.wait_until(wait, "a failed apply", || {
        let m = parse_metrics(&http_get(&ns.name, METRICS_PORT, "/metrics").ok()?.1);
        (m.get("netpol_dataplane_apply_failures_total").copied()? >= 1.0).then_some(m)
    });
    assert_eq!(metric(&before, "netpol_datastore_in_sync"), 1.0);
    assert_eq!(metric(&before, "netpol_dataplane_in_sync"), 0.0);
    assert_eq!(
        metric(&before, "netpol_programming_latency_seconds_count"),
        0.0
    );
    // Keep the apply blocked for a while, so the latency must show it.
    std::thread::sleep(Duration::from_millis(700));
    let blocked_since = Instant::now();

    let mut del = vec!["iptables-legacy", "-D", "INPUT"];
    del.extend_from_slice(&foreign);
    ns.exec_ok(&del);
    let (code, why) = agent.wait_until(wait, "readiness after the first apply", || {
        health("/readiness").filter(|(code, _)| *code == 200)
    });
    assert!(why.contains("ready"), "{why}");
    assert!(blocked_since.elapsed() < common::scaled(Duration::from_secs(10)));
    let (code_live, live) = health("/liveness").unwrap();
    assert_eq!((code, code_live), (200, 200), "{live}");
    assert_eq!(health("/nothing-here").map(|r| r.0), Some(404));
    assert_eq!(
        http_get(&ns.name, METRICS_PORT, "/liveness")
            .map(|r| r.0)
            .ok(),
        Some(404),
        "health and metrics are separate servers"
    );

    // Every documented metric, with values that match.
    let (code, text) = http_get(&ns.name, METRICS_PORT, "/metrics").unwrap();
    assert_eq!(code, 200);
    for name in netpol_agent::telemetry::metrics::NAMES {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} missing from /metrics:\n{text}"
        );
    }
    let m = parse_metrics(&text);
    let v4 = "{ip_version=\"4\",table=\"filter\"}";
    assert!(metric(&m, &format!("netpol_iptables_restore_calls_total{v4}")) >= 1.0);
    assert!(metric(&m, &format!("netpol_iptables_save_calls_total{v4}")) >= 1.0);
    assert!(metric(&m, &format!("netpol_iptables_lines_executed_total{v4}")) >= 10.0);
    assert_eq!(
        metric(&m, &format!("netpol_iptables_restore_errors_total{v4}")),
        0.0
    );
    let save = ns.exec_ok(&["iptables-legacy-save", "-t", "filter"]);
    let kernel_chains = save.lines().filter(|l| l.starts_with(":cali-")).count();
    let kernel_rules = save
        .lines()
        .filter(|l| l.starts_with("-A cali-") || (l.starts_with("-A ") && l.contains("cali:")))
        .count();
    assert_eq!(
        metric(&m, &format!("netpol_iptables_chains{v4}")),
        kernel_chains as f64
    );
    assert_eq!(
        metric(&m, &format!("netpol_iptables_rules{v4}")),
        kernel_rules as f64
    );
    let sets = ns.exec_ok(&["ipset", "list", "-n"]);
    let our_sets = sets.lines().filter(|l| l.starts_with("cali40")).count();
    assert_eq!(
        metric(&m, "netpol_ipsets{ip_version=\"4\"}"),
        our_sets as f64
    );
    let members = ns
        .exec_ok(&["ipset", "save"])
        .lines()
        .filter(|l| l.starts_with("add cali40"))
        .count();
    assert_eq!(
        metric(&m, "netpol_ipset_members{ip_version=\"4\"}"),
        members as f64
    );
    assert!(metric(&m, "netpol_ipset_calls_total") >= 2.0);
    assert!(metric(&m, "netpol_ipset_errors_total") >= 1.0);
    assert!(metric(&m, "netpol_ipset_lines_executed_total") >= members as f64);
    assert_eq!(
        metric(&m, "netpol_active_local_endpoints"),
        local_pods as f64
    );
    assert!(metric(&m, "netpol_active_local_policies") >= 1.0);
    assert_eq!(metric(&m, "netpol_datastore_in_sync"), 1.0);
    assert_eq!(metric(&m, "netpol_dataplane_in_sync"), 1.0);
    assert!(metric(&m, "netpol_dataplane_apply_seconds_count") >= 1.0);
    assert!(metric(&m, "netpol_dataplane_apply_failures_total") >= 1.0);
    assert!(metric(&m, "netpol_calc_graph_update_seconds_count") >= 1.0);
    assert!(metric(&m, "netpol_calc_graph_events_total") >= 7.0);
    assert!(
        metric(
            &m,
            "netpol_rejections_total{kind=\"NetworkPolicy\",reason=\"invalid\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            &m,
            "netpol_rejections_total{kind=\"Manifest\",reason=\"parse\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(&m, "netpol_rejected_objects{kind=\"NetworkPolicy\"}"),
        1.0
    );
    assert_eq!(metric(&m, "netpol_rejected_objects{kind=\"Pod\"}"), 0.0);
    // One observation per local pod, each at least as long as the apply was held up.
    let count = metric(&m, "netpol_programming_latency_seconds_count");
    assert_eq!(count, local_pods as f64);
    assert_eq!(
        metric(
            &m,
            "netpol_programming_latency_seconds_bucket{le=\"0.512\"}"
        ),
        0.0,
        "the held-up apply must show in the latency"
    );
    assert!(metric(&m, "netpol_programming_latency_seconds_sum") >= 0.7 * count);

    // A pod that appears later: one more local endpoint, one more observation, and this
    // one without a held-up apply.
    std::fs::write(dir.path.join("late.yaml"), NEW_POD).unwrap();
    let after = agent.wait_until(wait, "the late pod's rules", || {
        let m = parse_metrics(&http_get(&ns.name, METRICS_PORT, "/metrics").ok()?.1);
        (m.get("netpol_programming_latency_seconds_count").copied()? > count).then_some(m)
    });
    assert_eq!(
        metric(&after, "netpol_active_local_endpoints"),
        (local_pods + 1) as f64
    );
    assert_eq!(
        metric(&after, "netpol_programming_latency_seconds_count"),
        count + 1.0
    );
    // A claim about speed, so checked where time is real: under emulation (the kernel
    // matrix's VMs) one restore of a few lines takes seconds.
    if common::real_time() {
        assert!(
            metric(
                &after,
                "netpol_programming_latency_seconds_bucket{le=\"0.512\"}"
            ) >= 1.0,
            "a normal change is programmed quickly"
        );
    }
    assert!(
        ns.exec_ok(&["iptables-legacy", "-S"])
            .lines()
            .filter(|l| l.starts_with("-N cali-tw-"))
            .count()
            == local_pods + 1
    );
    assert_eq!(health("/readiness").map(|r| r.0), Some(200));
}

/// The first periodic refreshes are spaced by what the first apply cost, as every later one
/// is by its own cost (`sentinel::refresh_interval`: at most 0.05 % of a core), instead of
/// all landing at the base interval after start, where at 31k rules they once cost a
/// ten-minute window over 0.5 % of a core. Checked with a 2 s base on nft, whose change
/// events make a post-write re-read unnecessary: nothing but a refresh counts a resync
/// while nobody touches the kernel.
#[test]
fn the_first_refreshes_are_spaced_by_the_first_applys_cost() {
    let (ns, dir, logs) = demo_node("refresh");
    let base = Duration::from_secs(2);
    let base_secs = base.as_secs().to_string();
    let agent = start_agent(
        &ns,
        &dir.path,
        &logs.path.join("agent.log"),
        &[
            ("FELIX_IPTABLESBACKEND", "nft"),
            ("FELIX_IPTABLESREFRESHINTERVAL", &base_secs),
            ("FELIX_IPSETSREFRESHINTERVAL", &base_secs),
        ],
    );
    let wait = common::scaled(Duration::from_secs(20));
    let resyncs = || {
        let m = parse_metrics(&http_get(&ns.name, METRICS_PORT, "/metrics").ok()?.1);
        m.get("netpol_dataplane_resyncs_total").copied()
    };
    agent.wait_until(wait, "the first full apply", || {
        http_get(&ns.name, HEALTH_PORT, "/readiness")
            .ok()
            .filter(|(code, _)| *code == 200)
    });
    let applied = Instant::now();
    // The premise: the first apply (a read, the restores and their processes) cost enough
    // CPU that its 2000-fold passes the window below. Said by the agent itself.
    let cpu_ms: u64 = agent
        .log()
        .lines()
        .find(|l| l.contains("first full apply done"))
        .and_then(|l| l.split("cpu_ms=").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no cpu_ms in the first apply's line:\n{}", agent.log()));
    let window = Duration::from_secs(6);
    assert!(
        Duration::from_millis(cpu_ms * 2000) > window,
        "the first apply cost only {cpu_ms} ms of CPU: this check needs more than {:?}",
        window / 2000
    );
    while applied.elapsed() < window {
        assert_eq!(
            resyncs(),
            Some(0.0),
            "a refresh {:?} after the first apply, though it cost {cpu_ms} ms of CPU:\n{}",
            applied.elapsed(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
