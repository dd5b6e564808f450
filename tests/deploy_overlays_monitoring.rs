//! The per-CNI overlays (`deploy/overlays/*/`) and the monitoring pack (`deploy/monitoring/`):
//! valid YAML of the kinds and fields their APIs take, patches that name the agent's
//! DaemonSet and container, `FELIX_*` variables the binary knows with values it accepts
//! (the real binary parses them), a Service and ServiceMonitor that reach the DaemonSet's
//! metrics port, alerts with what Alertmanager needs, and every metric the alerts and the
//! dashboard use present in the registry.
//!
//! Which metrics exist is checked against the registry's name lists
//! (`telemetry::metrics::{NAMES, TRAFFIC_NAMES, CONNTRACK_NAMES, WHEN_SET_NAMES}`), not a
//! second running agent: `tests/metrics_health_netns.rs` already holds every one of `NAMES`
//! to a running agent's `/metrics`, and the deny-log and conntrack names exist only with
//! those features on.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;

use common::NetNs;

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn base_daemonset() -> DaemonSet {
    serde_json::from_value(yaml(&deploy().join("base/daemonset.yaml"))).unwrap()
}

/// `run --help`'s variables with their possible values (empty: free-form).
fn run_variables() -> BTreeMap<String, Vec<String>> {
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let mut vars = BTreeMap::new();
    for block in help.split("\n\n  ").chain(help.split("\n  -")) {
        let Some(var) = block
            .split("[env: ")
            .nth(1)
            .and_then(|r| r.split('=').next())
        else {
            continue;
        };
        let mut possible = Vec::new();
        if let Some(p) = block.split("[possible values: ").nth(1) {
            possible = p
                .split(']')
                .next()
                .unwrap()
                .split(", ")
                .map(str::to_string)
                .collect();
        }
        for l in block.lines() {
            if let Some(item) = l.trim().strip_prefix("- ") {
                if let Some((v, _)) = item.split_once(':') {
                    possible.push(v.trim().to_string());
                }
            }
        }
        vars.entry(var.to_string()).or_insert(possible);
    }
    assert!(vars.len() >= 30, "{vars:?}");
    vars
}

fn overlays() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(deploy().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// An overlay's env patch: (name, value) of the agent container, and the patch document.
fn overlay_patch(dir: &Path) -> (Vec<(String, String)>, Value) {
    let k = yaml(&dir.join("kustomization.yaml"));
    assert_eq!(
        k["apiVersion"], "kustomize.config.k8s.io/v1beta1",
        "{dir:?}"
    );
    assert_eq!(k["kind"], "Kustomization", "{dir:?}");
    assert_eq!(
        k["resources"],
        serde_json::json!(["../../base"]),
        "{dir:?}: an overlay builds on deploy/base/"
    );
    let patches = k["patches"].as_array().expect("patches");
    assert_eq!(patches.len(), 1, "{dir:?}");
    let patch = yaml(&dir.join(patches[0]["path"].as_str().unwrap()));
    assert_eq!(patch["apiVersion"], "apps/v1", "{dir:?}");
    assert_eq!(patch["kind"], "DaemonSet", "{dir:?}");
    assert_eq!(patch["metadata"]["name"], "netpol-agent", "{dir:?}");
    assert_eq!(patch["metadata"]["namespace"], "kube-system", "{dir:?}");
    let containers = patch["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0]["name"], "netpol-agent", "{dir:?}");
    let env = containers[0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().expect("a string value").to_string(),
            )
        })
        .collect();
    (env, patch)
}

#[test]
fn overlays_pin_known_variables_to_accepted_values() {
    let vars = run_variables();
    let dirs = overlays();
    assert!(dirs.len() >= 6, "{dirs:?}");
    let base = base_daemonset();
    let base_volumes: BTreeSet<String> = base
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    for dir in dirs {
        let (env, patch) = overlay_patch(&dir);
        let names: BTreeSet<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.contains("FELIX_INTERFACENAMESCHEME"),
            "{dir:?}: an overlay pins the scheme"
        );
        for (name, value) in &env {
            let possible = vars
                .get(name)
                .unwrap_or_else(|| panic!("{dir:?}: {name} is not in `run --help`"));
            if !possible.is_empty() {
                assert!(
                    possible.iter().any(|p| p.eq_ignore_ascii_case(value)),
                    "{dir:?}: {name}={value}, not one of {possible:?}"
                );
            }
        }
        // Mounts name volumes the patch or the base declares.
        let spec = &patch["spec"]["template"]["spec"];
        let mut volumes = base_volumes.clone();
        for v in spec["volumes"].as_array().into_iter().flatten() {
            volumes.insert(v["name"].as_str().unwrap().to_string());
        }
        for m in spec["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(
                volumes.contains(m["name"].as_str().unwrap()),
                "{dir:?}: mount {m} has no volume"
            );
        }
        // The patch is a valid DaemonSet once merged into the base's shape.
        let mut merged = serde_json::to_value(&base).unwrap();
        let container = &mut merged["spec"]["template"]["spec"]["containers"][0];
        let base_env = container["env"].as_array_mut().unwrap();
        for (name, value) in &env {
            base_env.retain(|e| e["name"] != name.as_str());
            base_env.push(serde_json::json!({ "name": name, "value": value }));
        }
        let _: DaemonSet = serde_json::from_value(merged).unwrap();
    }
}

/// The real binary parses each overlay's settings over the base's: `run` in a throwaway
/// namespace with a missing manifest directory gets past the configuration (never status 2,
/// the configuration error).
#[test]
fn the_binary_accepts_every_overlays_settings() {
    let base = base_daemonset();
    let base_env: Vec<(String, String)> = base.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    for dir in overlays() {
        let (env, _) = overlay_patch(&dir);
        let ns = NetNs::new("overlay-env");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name, BIN, "run"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("FELIX_") || k == "NODENAME" {
                cmd.env_remove(k);
            }
        }
        for (k, v) in base_env.iter().chain(&env) {
            cmd.env(k, v);
        }
        cmd.env("NODENAME", "node-1")
            .env("FELIX_DATASTORETYPE", "dir:/nonexistent/npa-overlay-check")
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_PROMETHEUSMETRICSENABLED", "false");
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(2), "{dir:?}: {stderr}");
        assert!(!stderr.contains("invalid value"), "{dir:?}: {stderr}");
    }
}

// ---- The monitoring pack.

fn monitoring(file: &str) -> Value {
    yaml(&deploy().join("monitoring").join(file))
}

#[test]
fn monitoring_kustomization_lists_its_files() {
    let k = monitoring("kustomization.yaml");
    assert_eq!(k["namespace"], "kube-system");
    let mut listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    for g in k["configMapGenerator"].as_array().unwrap() {
        for f in g["files"].as_array().unwrap() {
            let f = f.as_str().unwrap();
            listed.insert(f.split_once('=').map_or(f, |(_, p)| p).to_string());
        }
        assert_eq!(g["options"]["labels"]["grafana_dashboard"], "1");
    }
    let present: BTreeSet<String> = std::fs::read_dir(deploy().join("monitoring"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
}

#[test]
fn the_service_and_servicemonitor_reach_the_metrics_port() {
    let ds = base_daemonset();
    let pod = ds.spec.unwrap().template;
    let pod_labels = pod.metadata.unwrap().labels.unwrap();
    let container = &pod.spec.unwrap().containers[0];
    let metrics_port = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("the DaemonSet names its metrics port");
    let svc: Service = serde_json::from_value(monitoring("service.yaml")).unwrap();
    let spec = svc.spec.unwrap();
    for (k, v) in spec.selector.as_ref().unwrap() {
        assert_eq!(
            pod_labels.get(k),
            Some(v),
            "the Service selects the agent pods"
        );
    }
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(port.port, metrics_port.container_port);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into()))
    );
    let svc_labels = svc.metadata.labels.unwrap();

    let sm = monitoring("servicemonitor.yaml");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["kind"], "ServiceMonitor");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            svc_labels.get(k).map(String::as_str),
            v.as_str(),
            "the ServiceMonitor selects the Service"
        );
    }
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"].as_str(), port.name.as_deref());
    assert_eq!(ep["path"], "/metrics");
    assert_eq!(sm["spec"]["jobLabel"], "app.kubernetes.io/name");
}

/// Every `netpol_*`/`process_*` name in a PromQL expression, histogram suffixes removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("netpol_") || word.starts_with("process_") {
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            out.insert(name.to_string());
        }
    }
    out
}

fn registry_names() -> BTreeSet<String> {
    use netpol_agent::telemetry::metrics::{CONNTRACK_NAMES, NAMES, TRAFFIC_NAMES, WHEN_SET_NAMES};
    NAMES
        .iter()
        .chain(TRAFFIC_NAMES)
        .chain(CONNTRACK_NAMES)
        .chain(WHEN_SET_NAMES)
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn alerts_use_metrics_the_agent_exports() {
    let rule = monitoring("prometheusrule.yaml");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let known = registry_names();
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let name = r["alert"].as_str().expect("an alert name");
            assert!(alerts.insert(name.to_string()), "{name} twice");
            let expr = r["expr"].as_str().expect("expr");
            let sev = r["labels"]["severity"].as_str().expect("severity");
            assert!(["critical", "warning", "info"].contains(&sev), "{name}");
            assert!(r["annotations"]["summary"].is_string(), "{name}");
            if let Some(f) = r.get("for") {
                assert!(f.as_str().unwrap().ends_with('m'), "{name}: for {f}");
            }
            for m in metric_names(expr) {
                assert!(known.contains(&m), "{name}: {m} is not a metric of ours");
                used.insert(m);
            }
        }
    }
    for needed in [
        "netpol_dataplane_in_sync",
        "netpol_dataplane_apply_failures_total",
        "netpol_dataplane_kernel_checks_total",
        "netpol_local_pods_without_interface",
        "netpol_deny_log_lost_total",
    ] {
        assert!(used.contains(needed), "no alert on {needed}");
    }
}

#[test]
fn the_dashboard_uses_metrics_the_agent_exports() {
    let text = std::fs::read_to_string(deploy().join("monitoring/grafana-dashboard.json")).unwrap();
    let d: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(d["uid"], "netpol-agent");
    let known = registry_names();
    let mut exprs = 0;
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            exprs += 1;
            for m in metric_names(expr) {
                assert!(
                    known.contains(&m),
                    "{}: {m} is not a metric of ours",
                    panel["title"]
                );
            }
        }
    }
    let q = d["templating"]["list"][1]["query"].as_str().unwrap();
    for m in metric_names(q) {
        assert!(known.contains(&m), "variable query: {m}");
    }
    assert!(exprs >= 10);
}
