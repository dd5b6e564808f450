//! The manifests in `deploy/`: every YAML document deserializes into its `k8s-openapi` type
//! with no field left over (a misspelt field name fails, as it would be silently dropped by
//! the API server's non-strict decoding), the kustomization lists exactly the files there,
//! and the invariants the agent relies on hold: read-only RBAC, host network, the two
//! capabilities instead of privileged, probes on the health port, the node name from the
//! downward API, the xtables lock and /lib/modules mounts. Finally the DaemonSet's FELIX_*
//! settings are given to the real binary, which must accept them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, EnvVar, Probe, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::Resource;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use common::NetNs;

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Deserializes `value` as `T`, failing on any field `T` does not have (serde ignores them
/// by default, and so do k8s-openapi's types).
fn strict<T: DeserializeOwned>(value: &serde_json::Value, what: &str) -> Result<T, String> {
    let mut unknown = Vec::new();
    let parsed: T = serde_ignored::deserialize(value.clone(), |path| {
        unknown.push(path.to_string());
    })
    .map_err(|e| format!("{what}: {e}"))?;
    if unknown.is_empty() {
        Ok(parsed)
    } else {
        Err(format!("{what}: unknown fields {unknown:?}"))
    }
}

/// The documents of every YAML file in deploy/ except the kustomization, by file.
fn documents() -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if !is_yaml || name == "kustomization.yaml" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde_json::Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}")))
            .filter(|v| !v.is_null())
            .collect();
        out.insert(name, docs);
    }
    out
}

/// Every object of deploy/, typed.
#[derive(Default)]
struct Objects {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    daemonsets: Vec<DaemonSet>,
}

fn typed<T: DeserializeOwned + Resource>(doc: &serde_json::Value, what: &str) -> T {
    assert_eq!(
        doc["apiVersion"].as_str(),
        Some(T::API_VERSION),
        "{what}: apiVersion"
    );
    strict(doc, what).unwrap_or_else(|e| panic!("{e}"))
}

fn objects() -> Objects {
    let mut objs = Objects::default();
    for (file, docs) in documents() {
        for (i, doc) in docs.iter().enumerate() {
            let what = format!("{file} document {}", i + 1);
            match doc["kind"].as_str() {
                Some("ServiceAccount") => objs.service_accounts.push(typed(doc, &what)),
                Some("ClusterRole") => objs.cluster_roles.push(typed(doc, &what)),
                Some("ClusterRoleBinding") => objs.bindings.push(typed(doc, &what)),
                Some("DaemonSet") => objs.daemonsets.push(typed(doc, &what)),
                other => panic!("{what}: unexpected kind {other:?}"),
            }
        }
    }
    objs
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

#[test]
fn kustomization_lists_exactly_the_manifests() {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let k: Kustomization = serde_yaml_ng::from_str(&text).expect("kustomization.yaml");
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    assert_eq!(k.namespace.as_deref(), Some("kube-system"));
    let listed: BTreeSet<String> = k.resources.iter().cloned().collect();
    assert_eq!(listed.len(), k.resources.len(), "a resource listed twice");
    for r in &listed {
        assert!(deploy_dir().join(r).is_file(), "{r} is listed but missing");
    }
    let present: BTreeSet<String> = documents().into_keys().collect();
    assert_eq!(listed, present, "every manifest is listed, and only those");
    // The image kustomize rewrites is the one the DaemonSet uses.
    let ds = &objects().daemonsets[0];
    let image = container(ds).image.clone().unwrap();
    assert!(
        k.images
            .iter()
            .any(|i| image == i.name || image.starts_with(&format!("{}:", i.name))),
        "{image}"
    );
}

#[test]
fn a_misspelt_field_is_caught() {
    let docs = documents();
    let ds = docs["daemonset.yaml"][0].clone();
    let mut typo = ds.clone();
    typo["spec"]["template"]["spec"]["hostNetwrk"] = serde_json::Value::Bool(true);
    let err = strict::<DaemonSet>(&typo, "typo").unwrap_err();
    assert!(err.contains("hostNetwrk"), "{err}");
    let mut typo = ds.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilites"] =
        serde_json::json!({"add": ["NET_ADMIN"]});
    assert!(strict::<DaemonSet>(&typo, "typo")
        .unwrap_err()
        .contains("capabilites"));
    // A wrong type fails too.
    let mut typo = ds;
    typo["spec"]["template"]["spec"]["hostNetwork"] = serde_json::json!("yes");
    assert!(strict::<DaemonSet>(&typo, "typo").is_err());
}

#[test]
fn rbac_is_read_only_on_the_kinds_the_agent_watches() {
    let objs = objects();
    assert_eq!(objs.cluster_roles.len(), 1);
    let role = &objs.cluster_roles[0];
    let mut granted: BTreeSet<(String, String)> = BTreeSet::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        let verbs: BTreeSet<&str> = rule.verbs.iter().map(String::as_str).collect();
        assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]), "{rule:?}");
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for res in rule.resources.as_deref().unwrap_or_default() {
                granted.insert((group.clone(), res.clone()));
            }
        }
    }
    let want: BTreeSet<(String, String)> = [
        ("", "pods"),
        ("", "namespaces"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
    ]
    .into_iter()
    .map(|(g, r)| (g.to_string(), r.to_string()))
    .collect();
    assert_eq!(granted, want);

    assert_eq!(objs.service_accounts.len(), 1);
    let sa = &objs.service_accounts[0];
    assert_eq!(objs.bindings.len(), 1);
    let binding = &objs.bindings[0];
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);
    let ds = &objs.daemonsets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!(ds.metadata.namespace, sa.metadata.namespace);
}

fn container(ds: &DaemonSet) -> &Container {
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.containers.len(), 1);
    &pod.containers[0]
}

fn env_value<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn probe_target(probe: Option<&Probe>) -> (String, String, i32) {
    let get = probe
        .and_then(|p| p.http_get.as_ref())
        .expect("an httpGet probe");
    let port = match &get.port {
        IntOrString::Int(p) => *p,
        IntOrString::String(s) => panic!("named probe port {s}: use the number"),
    };
    (
        get.host.clone().unwrap_or_default(),
        get.path.clone().unwrap_or_default(),
        port,
    )
}

#[test]
fn daemonset_runs_on_every_node_in_the_host_network_with_two_capabilities() {
    let objs = objects();
    assert_eq!(objs.daemonsets.len(), 1);
    let ds = &objs.daemonsets[0];
    let spec = ds.spec.as_ref().unwrap();
    let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref();
    for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
        assert_eq!(labels.and_then(|l| l.get(k)), Some(v), "selector {k}");
    }
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "a toleration of every taint: {tolerations:?}"
    );

    let c = container(ds);
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_ne!(sc.privileged, Some(true));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    let added: BTreeSet<&str> = caps
        .add
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(added, BTreeSet::from(["NET_ADMIN", "NET_RAW"]));
    assert!(caps
        .drop
        .as_deref()
        .unwrap_or_default()
        .contains(&"ALL".to_string()));

    let env = c.env.as_deref().unwrap_or_default();
    let nodename = env.iter().find(|e| e.name == "NODENAME").expect("NODENAME");
    let field = nodename
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .expect("NODENAME from the downward API");
    assert_eq!(field.field_path, "spec.nodeName");

    // Probes on the health server as configured.
    assert_eq!(
        env_value(env, "FELIX_HEALTHENABLED").map(netpol_agent::config::parse_bool),
        Some(Ok(true))
    );
    let port: i32 = env_value(env, "FELIX_HEALTHPORT").unwrap().parse().unwrap();
    let host = env_value(env, "FELIX_HEALTHHOST").unwrap();
    assert_eq!(
        probe_target(c.liveness_probe.as_ref()),
        (host.to_string(), "/liveness".to_string(), port)
    );
    assert_eq!(
        probe_target(c.readiness_probe.as_ref()),
        (host.to_string(), "/readiness".to_string(), port)
    );
    // The metrics port is declared.
    let metrics: i32 = env_value(env, "FELIX_PROMETHEUSMETRICSPORT")
        .unwrap()
        .parse()
        .unwrap();
    assert!(c
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|p| p.container_port == metrics));

    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    // The xtables lock (FileOrCreate) and /lib/modules read-only.
    let mounts: BTreeMap<&str, (&str, bool)> = c
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.mount_path.as_str(),
                (m.name.as_str(), m.read_only.unwrap_or(false)),
            )
        })
        .collect();
    let volumes: BTreeMap<&str, (&str, Option<&str>)> = pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| {
            let hp = v.host_path.as_ref()?;
            Some((v.name.as_str(), (hp.path.as_str(), hp.type_.as_deref())))
        })
        .collect();
    let (lock, _) = mounts["/run/xtables.lock"];
    assert_eq!(volumes[lock], ("/run/xtables.lock", Some("FileOrCreate")));
    let (modules, read_only) = mounts["/lib/modules"];
    assert!(read_only);
    assert_eq!(volumes[modules].0, "/lib/modules");
}

/// The DaemonSet's FELIX_* values through the real binary's parser: `run` in a throwaway
/// network namespace with the datastore pointed at a missing directory must get past the
/// configuration (status 1, the directory) rather than reject it (status 2).
#[test]
fn the_binary_accepts_the_daemonsets_configuration() {
    let ds = &objects().daemonsets[0];
    let env = container(ds).env.clone().unwrap_or_default();
    let ns = NetNs::new("deploy-env");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, BIN]);
    cmd.args(container(ds).args.as_deref().unwrap_or_default());
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    let mut felix = 0;
    for e in &env {
        if let Some(v) = &e.value {
            cmd.env(&e.name, v);
            felix += usize::from(e.name.starts_with("FELIX_"));
        }
    }
    assert!(felix >= 10, "FELIX_* examples in the DaemonSet");
    cmd.env("NODENAME", "node-1")
        .env("FELIX_DATASTORETYPE", "dir:/nonexistent/npa-deploy-check");
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("npa-deploy-check"), "{stderr}");
    // Every variable it sets is one the binary documents.
    let help = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for e in &env {
        if e.name.starts_with("MIMALLOC_") {
            // The allocator's own settings, read before `main`: the README names them.
            assert!(readme.contains(&e.name), "{} is not in the README", e.name);
            continue;
        }
        assert!(
            help.contains(&format!("[env: {}", e.name)),
            "{} is not a netpol-agent variable",
            e.name
        );
    }
}

#[test]
fn dockerfile_builds_the_binary_with_both_iptables_backends() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].contains("rust:") && froms[1].contains("debian:") && froms[1].contains("slim")
    );
    for needle in [
        "cargo build --release --locked",
        "iptables ipset",
        "iptables-legacy-save",
        "iptables-nft-save",
        "ENTRYPOINT [\"/usr/local/bin/netpol-agent\"]",
    ] {
        assert!(text.contains(needle), "{needle}");
    }
    // What it copies exists.
    for line in text
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        for src in line
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .split_last()
            .unwrap()
            .1
        {
            let p: &Path = Path::new(src);
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(p).exists(),
                "COPY {src}: missing"
            );
        }
    }
}
