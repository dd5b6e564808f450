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

/// The agent's manifests: deploy/ and every overlay build on this directory.
fn base_dir() -> PathBuf {
    deploy_dir().join("base")
}

fn uninstall_dir() -> PathBuf {
    deploy_dir().join("uninstall")
}

/// The documents of every YAML file in deploy/base/ except the kustomization, by file.
fn documents() -> BTreeMap<String, Vec<serde_json::Value>> {
    documents_in(&base_dir())
}

/// The documents of every YAML file in `dir` (not below) except the kustomization, by file.
fn documents_in(dir: &Path) -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
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
    objects_in(&base_dir())
}

fn objects_in(dir: &Path) -> Objects {
    let mut objs = Objects::default();
    for (file, docs) in documents_in(dir) {
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
    components: Vec<String>,
}

/// `deploy/image/`: the image, in one place, for the agent and the uninstall DaemonSet.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImageComponent {
    api_version: String,
    kind: String,
    images: Vec<KustomizeImage>,
}

fn image_component() -> ImageComponent {
    let path = deploy_dir().join("image/kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let c: ImageComponent =
        serde_yaml_ng::from_str(&text).expect("deploy/image/kustomization.yaml");
    assert_eq!(c.api_version, "kustomize.config.k8s.io/v1alpha1");
    assert_eq!(c.kind, "Component");
    c
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

/// `dir`'s kustomization lists exactly the manifests there, in kube-system, and rewrites
/// the image its DaemonSet uses.
fn check_kustomization(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let k: Kustomization = serde_yaml_ng::from_str(&text).expect("kustomization.yaml");
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    assert_eq!(k.namespace.as_deref(), Some("kube-system"));
    let listed: BTreeSet<String> = k.resources.iter().cloned().collect();
    assert_eq!(listed.len(), k.resources.len(), "a resource listed twice");
    for r in &listed {
        assert!(dir.join(r).is_file(), "{r} is listed but missing");
    }
    let present: BTreeSet<String> = documents_in(dir).into_keys().collect();
    assert_eq!(listed, present, "every manifest is listed, and only those");
    // The image kustomize rewrites is the one the DaemonSet uses, from the one component.
    assert_eq!(k.components.len(), 1, "{:?}", k.components);
    assert_eq!(
        std::fs::canonicalize(dir.join(&k.components[0])).unwrap(),
        std::fs::canonicalize(deploy_dir().join("image")).unwrap()
    );
    let ds = &objects_in(dir).daemonsets[0];
    let image = container(ds).image.clone().unwrap();
    assert!(
        image_component().images.iter().any(|i| image == i.name),
        "{image}"
    );
}

#[test]
fn kustomization_lists_exactly_the_manifests() {
    check_kustomization(&base_dir());
}

/// `kubectl apply -k deploy/` applies deploy/base/ and nothing else; the manifests live one
/// level down because kustomize refuses an overlay whose base contains it (every overlay of
/// deploy/overlays/ failed with "cycle detected" while they built on deploy/ itself).
#[test]
fn deploy_is_the_base_and_no_base_contains_its_overlay() {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let k: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(k["resources"], serde_json::json!(["base"]));
    for dir in [
        deploy_dir(),
        uninstall_dir(),
        deploy_dir().join("monitoring"),
    ]
    .into_iter()
    .chain(
        std::fs::read_dir(deploy_dir().join("overlays"))
            .unwrap()
            .map(|e| e.unwrap().path()),
    ) {
        let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let k: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        let here = std::fs::canonicalize(&dir).unwrap();
        for r in ["resources", "components"]
            .iter()
            .filter_map(|f| k[f].as_array())
            .flatten()
        {
            let target = dir.join(r.as_str().unwrap());
            if target.is_dir() {
                let target = std::fs::canonicalize(&target).unwrap();
                assert!(
                    !here.starts_with(&target),
                    "{dir:?}: {target:?} contains the kustomization using it (kustomize: cycle detected)"
                );
            }
        }
    }
}

#[test]
fn uninstall_kustomization_lists_exactly_its_manifests() {
    check_kustomization(&uninstall_dir());
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
    let mut node_reads = 0;
    for rule in role.rules.as_deref().unwrap_or_default() {
        let verbs: BTreeSet<&str> = rule.verbs.iter().map(String::as_str).collect();
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        // Its own Node, once at start while auto waits for the wiring (the pod ranges): a
        // get, never a list or a watch of every node.
        if rule.resources.as_deref() == Some(&["nodes".to_string()][..]) {
            assert_eq!(verbs, BTreeSet::from(["get"]), "{rule:?}");
            assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
            node_reads += 1;
            continue;
        }
        assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]), "{rule:?}");
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
        ("netpol-agent.io", "stagednetworkpolicies"),
        ("netpol-agent.io", "stagedclusternetworkpolicies"),
    ]
    .into_iter()
    .map(|(g, r)| (g.to_string(), r.to_string()))
    .collect();
    assert_eq!(granted, want);
    assert_eq!(node_reads, 1, "one rule: get nodes");

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

    // The xtables lock (FileOrCreate); no /lib/modules (a hostPath of type Directory stopped
    // the pod on nodes without it, and the container cannot load modules anyway).
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
    assert!(!mounts.contains_key("/lib/modules"), "{mounts:?}");
    // The node's netfilter sysctls, read-write, where the agent looks for them when its own
    // /proc/sys is read-only (flow logs turn conntrack accounting on there).
    let sysctl = netpol_agent::traffic::flow_log::conntrack::ACCT_SYSCTLS[1];
    let dir = sysctl.rsplit_once('/').map(|(d, _)| d).unwrap();
    let (name, read_only) = mounts
        .get(dir)
        .unwrap_or_else(|| panic!("no mount at {dir}: {mounts:?}"));
    assert!(!read_only, "{dir} must be writable");
    assert_eq!(
        volumes[name],
        ("/proc/sys/net/netfilter", Some("Directory"))
    );
}

/// The Helm chart is the release: its version and appVersion (the image tag it renders) are
/// Cargo.toml's, and its manifests are deploy/'s own files (links, not copies).
#[test]
fn the_chart_is_the_release() {
    let chart_dir = deploy_dir().join("helm/netpol-agent");
    let chart: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart_dir.join("Chart.yaml")).unwrap())
            .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"].as_str(), Some(version));
    assert_eq!(chart["appVersion"].as_str(), Some(version));
    for link in [
        "files/daemonset.yaml",
        "files/serviceaccount.yaml",
        "files/clusterrole.yaml",
        "files/clusterrolebinding.yaml",
        "files/overlays",
        "files/monitoring",
        "crds/staged-policies.yaml",
    ] {
        let path = chart_dir.join(link);
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{link} must link to deploy/'s file"
        );
        assert!(path.exists(), "{link} points nowhere");
    }
}

/// The image is versioned (never `latest`, which kubelet always pulls) and its tag is the
/// release's: Cargo.toml's version, as the CHANGELOG's release section says.
#[test]
fn the_image_is_the_release() {
    let version = env!("CARGO_PKG_VERSION");
    let images = image_component().images;
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].name, "netpol-agent");
    assert_eq!(
        images[0].new_tag.as_deref(),
        Some(format!("v{version}").as_str())
    );
    assert!(images[0]
        .new_name
        .as_deref()
        .is_some_and(|n| n.ends_with("/netpol-agent")));
}

/// The DaemonSet's FELIX_* values through the real binary's parser: `run` in a throwaway
/// network namespace with the datastore pointed at a missing directory must get past the
/// configuration (status 1, the directory) rather than reject it (status 2).
#[test]
fn the_binary_accepts_the_daemonsets_configuration() {
    let ds = &objects().daemonsets[0];
    let env = container(ds).env.clone().unwrap_or_default();
    let ns = NetNs::new("deploy-env");
    // A routed pod interface, so FELIX_INTERFACENAMESCHEME=auto finds the node's wiring and
    // the agent goes on to its datastore.
    ns.sh_ok(
        "ip link add cali1a2b3c4d5e6 type veth peer name pod0 && ip link set cali1a2b3c4d5e6 up          && ip link set pod0 up && ip route add 10.0.0.5/32 dev cali1a2b3c4d5e6",
    );
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
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/configuration.md"),
    )
    .unwrap();
    for e in &env {
        if e.name.starts_with("MIMALLOC_") {
            // The allocator's own settings, read before `main`: the configuration page names them.
            assert!(
                readme.contains(&e.name),
                "{} is not in docs/reference/configuration.md",
                e.name
            );
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
    // The bases are build arguments (so a build can name them by digest), defaulting to
    // images pinned to a version: the toolchain at rust-version, the Debian release.
    let arg = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .unwrap_or_else(|| panic!("ARG {name}"))
            .to_string()
    };
    assert_eq!(
        froms,
        ["FROM ${RUST_IMAGE} AS build", "FROM ${DEBIAN_IMAGE}"]
    );
    let (rust, debian) = (arg("RUST_IMAGE"), arg("DEBIAN_IMAGE"));
    assert!(
        rust.starts_with("rust:1.89.0-")
            && debian.starts_with("debian:12")
            && debian.ends_with("-slim"),
        "{rust} {debian}"
    );
    // The runtime's tools are the versions the tests run with, checked in the image.
    for needle in [
        "cargo build --release --locked",
        "grep -q ' v1\\.8\\.9 '",
        "grep -q 'v7\\.17'",
        "ARG TARGETARCH",
        "ARG NETPOL_GIT_COMMIT",
        "COPY Cargo.toml Cargo.lock build.rs",
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

// ---- Hardening, config hygiene and the uninstall DaemonSet (issue 20).

/// What `--help` of a subcommand says about one option read from the environment.
#[derive(Debug, Default)]
struct HelpEntry {
    default: Option<String>,
    possible: Vec<String>,
}

/// `netpol-agent <sub> --help` (no FELIX_* in its environment, which clap would print as
/// `[env: NAME=value]`), as variable → default and possible values.
fn env_help(sub: &str) -> BTreeMap<String, HelpEntry> {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.args([sub, "--help"]).output().unwrap();
    assert!(out.status.success(), "{sub} --help");
    let help = String::from_utf8(out.stdout).unwrap();
    let mut entries: BTreeMap<String, HelpEntry> = BTreeMap::new();
    // One option's block: from its `--flag` line to the next.
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if (t.starts_with("--") || (t.starts_with('-') && t.get(2..4) == Some(", "))) && indent <= 6
        {
            blocks.push(Vec::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push(t);
        }
    }
    for block in blocks {
        let Some(env) = block.iter().find_map(|l| l.strip_prefix("[env: ")) else {
            continue;
        };
        let (name, shown) = env.trim_end_matches(']').split_once('=').unwrap();
        assert_eq!(shown, "", "{name} is set in the test's environment");
        let mut entry = HelpEntry::default();
        let mut listing = false;
        for l in &block {
            if let Some(d) = l.strip_prefix("[default: ") {
                let d = d.trim_end_matches(']');
                entry.default = Some(if d == "\"\"" {
                    String::new()
                } else {
                    d.to_string()
                });
            } else if let Some(p) = l.strip_prefix("[possible values: ") {
                entry.possible = p
                    .trim_end_matches(']')
                    .split(", ")
                    .map(str::to_string)
                    .collect();
            } else if *l == "Possible values:" {
                listing = true;
            } else if listing {
                match l.strip_prefix("- ") {
                    Some(item) => entry
                        .possible
                        .push(item.split(':').next().unwrap().trim().to_string()),
                    None => listing = false,
                }
            }
        }
        entries.insert(name.to_string(), entry);
    }
    assert!(!entries.is_empty(), "no [env: ...] in {sub} --help");
    entries
}

/// The subcommands `netpol-agent --help` lists.
fn subcommands() -> BTreeSet<String> {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let commands = help
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands: section")
        .split("\n\n")
        .next()
        .unwrap();
    commands
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Whether `value` is what the binary takes by default: the same text (case aside), the same
/// number, or the same boolean.
fn is_default(value: &str, default: &str) -> bool {
    if value.eq_ignore_ascii_case(default) {
        return true;
    }
    if let (Ok(a), Ok(b)) = (value.parse::<f64>(), default.parse::<f64>()) {
        return a == b;
    }
    matches!(
        (
            netpol_agent::config::parse_bool(value),
            netpol_agent::config::parse_bool(default)
        ),
        (Ok(a), Ok(b)) if a == b
    )
}

/// Every FELIX_* setting of the shipped DaemonSets that is not the binary's default, and why:
/// the binary's default is the one place for everything else (issue 20, config hygiene).
const NOT_DEFAULT: &[(&str, &str, &str)] = &[
    (
        "FELIX_INTERFACENAMESCHEME",
        "auto",
        "the DaemonSet finds each node's pod wiring itself (auto works only with run, so the binary's default stays the offline-capable calico)",
    ),
    (
        "FELIX_IPV6SUPPORT",
        "false",
        "the example is for IPv4 single-stack clusters, which need no ip6tables rules or inet6 sets; dual-stack clusters set true",
    ),
    (
        "FELIX_LOGFORMAT",
        "json",
        "one JSON object per line for the cluster's log collector",
    ),
    (
        "FELIX_HEALTHENABLED",
        "true",
        "the kubelet's liveness and readiness probes need the health server",
    ),
    (
        "FELIX_HEALTHHOST",
        "127.0.0.1",
        "the address the probes name; `localhost` would depend on the image's /etc/hosts",
    ),
    (
        "FELIX_PROMETHEUSMETRICSENABLED",
        "true",
        "metrics on the declared container port, for the cluster's Prometheus",
    ),
];

/// The DaemonSet's environment against `sub --help`: every variable documented there, values
/// among the possible ones, and any value that is not the default allow-listed with a reason.
fn check_env_against_help(ds: &DaemonSet, sub: &str) {
    let help = env_help(sub);
    let env = container(ds).env.clone().unwrap_or_default();
    let what = ds.metadata.name.clone().unwrap_or_default();
    for e in &env {
        if e.name.starts_with("MIMALLOC_") {
            continue;
        }
        assert!(
            e.name.starts_with("FELIX_") || e.name == "NODENAME",
            "{what}: {} is not a netpol-agent variable",
            e.name
        );
        let entry = help
            .get(&e.name)
            .unwrap_or_else(|| panic!("{what}: {} is not in `{sub} --help`", e.name));
        let Some(value) = e.value.as_deref() else {
            continue;
        };
        if !entry.possible.is_empty() {
            assert!(
                entry.possible.iter().any(|p| p.eq_ignore_ascii_case(value)),
                "{what}: {}={value}, not one of {:?}",
                e.name,
                entry.possible
            );
        }
        let default = entry.default.as_deref();
        if default.is_some_and(|d| is_default(value, d)) {
            continue;
        }
        let allowed = NOT_DEFAULT
            .iter()
            .find(|(n, _, _)| *n == e.name)
            .unwrap_or_else(|| {
                panic!(
                    "{what}: {}={value} overrides the binary's default ({default:?}): remove it, \
                     or add it to NOT_DEFAULT with the reason it is a deployment choice",
                    e.name
                )
            });
        assert!(
            is_default(value, allowed.1),
            "{what}: {}={value}, NOT_DEFAULT says {}",
            e.name,
            allowed.1
        );
        assert!(!allowed.2.is_empty());
    }
}

#[test]
fn every_daemonset_variable_is_documented_accepted_and_default_unless_allow_listed() {
    let ds = &objects().daemonsets[0];
    check_env_against_help(ds, "run");
    let env = container(ds).env.clone().unwrap_or_default();
    // The refresh intervals are the binary's (issue 20: 60/90 here drifted from 300/300).
    for name in [
        "FELIX_IPTABLESREFRESHINTERVAL",
        "FELIX_IPSETSREFRESHINTERVAL",
    ] {
        assert!(env.iter().all(|e| e.name != name), "{name} is set");
    }
    // The command is a subcommand the binary has.
    let args = container(ds).args.clone().unwrap_or_default();
    assert!(subcommands().contains(&args[0]), "{args:?}");

    // The rule-related values through `compile` (which builds the rules from them) with no
    // manifests. A scheme that reads the node while the agent runs (auto, routes) cannot be
    // compiled offline, so it is swapped for `static` with an empty interface map.
    let dir = common::TempDir::new("deploy-compile");
    std::fs::write(dir.path.join("map.yaml"), "").unwrap();
    std::fs::create_dir(dir.path.join("manifests")).unwrap();
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    let compile = env_help("compile");
    for e in &env {
        if let (Some(v), true) = (&e.value, compile.contains_key(&e.name)) {
            cmd.env(&e.name, v);
        }
    }
    let scheme = env_value(&env, "FELIX_INTERFACENAMESCHEME").unwrap_or("");
    if ["auto", "routes"].contains(&scheme.to_ascii_lowercase().as_str()) {
        cmd.env("FELIX_INTERFACENAMESCHEME", "static")
            .env("FELIX_INTERFACEMAPFILE", dir.path.join("map.yaml"));
    }
    let out = cmd
        .args(["compile", "--node", "x", "--manifests"])
        .arg(dir.path.join("manifests"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compile with the DaemonSet's settings: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bytes in a Kubernetes memory quantity (Ki/Mi/Gi, k/M/G, or plain).
fn bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, mul) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap() * mul;
        }
    }
    q.parse().unwrap()
}

/// The hardening both DaemonSets share: Linux nodes only, no privilege escalation, the
/// runtime's default seccomp profile, a read-only root filesystem.
fn check_hardening(ds: &DaemonSet) {
    let what = ds.metadata.name.clone().unwrap_or_default();
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        pod.node_selector,
        Some(BTreeMap::from([(
            "kubernetes.io/os".to_string(),
            "linux".to_string()
        )])),
        "{what}"
    );
    let sc = container(ds)
        .security_context
        .as_ref()
        .expect("securityContext");
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or_else(|| {
            pod.security_context
                .as_ref()
                .and_then(|p| p.seccomp_profile.as_ref())
        })
        .expect("a seccomp profile");
    assert_eq!(seccomp.type_, "RuntimeDefault", "{what}");
    let memory = |which: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { bytes(&which.and_then(|m| m.get("memory")).expect("memory").0) };
    let resources = container(ds).resources.as_ref().expect("resources");
    let (request, limit) = (
        memory(resources.requests.as_ref()),
        memory(resources.limits.as_ref()),
    );
    assert!(
        request <= limit,
        "{what}: request {request} > limit {limit}"
    );
}

#[test]
fn the_agent_daemonset_is_hardened_with_memory_from_the_measured_figures() {
    let ds = &objects().daemonsets[0];
    check_hardening(ds);
    let resources = container(ds).resources.as_ref().unwrap();
    let request = bytes(&resources.requests.as_ref().unwrap()["memory"].0);
    let limit = bytes(&resources.limits.as_ref().unwrap()["memory"].0);
    // README's scale table: 192 MiB resident at rest at 150k pods, peak 233 MiB in the
    // initial sync there; the limit leaves room for the restore children besides.
    assert!(
        request >= 192 << 20,
        "request {request} below the 192 MiB measured at rest"
    );
    assert!(
        limit >= 2 * (233 << 20),
        "limit {limit} below twice the 233 MiB peak"
    );
}

/// The uninstall DaemonSet's container script.
fn uninstall_script(ds: &DaemonSet) -> String {
    let command = container(ds).command.clone().expect("a command");
    assert_eq!(command[..2], ["sh", "-c"], "{command:?}");
    assert_eq!(command.len(), 3, "{command:?}");
    command[2].clone()
}

/// `${NAME:-default}` in a script.
fn script_default(script: &str, name: &str) -> String {
    let start = script
        .find(&format!("${{{name}:-"))
        .unwrap_or_else(|| panic!("${{{name}:-…}} in the script"))
        + name.len()
        + 4;
    script[start..].split('}').next().unwrap().to_string()
}

#[test]
fn the_uninstall_daemonset_reaches_every_node_as_the_agent_does_and_runs_cleanup() {
    let agent = &objects().daemonsets[0];
    let objs = objects_in(&uninstall_dir());
    assert_eq!(objs.daemonsets.len(), 1);
    assert!(objs.service_accounts.is_empty() && objs.cluster_roles.is_empty());
    assert!(objs.bindings.is_empty());
    let ds = &objs.daemonsets[0];
    check_hardening(ds);
    check_env_against_help(ds, "cleanup");
    assert_eq!(ds.metadata.namespace, agent.metadata.namespace);
    assert_ne!(ds.metadata.name, agent.metadata.name);
    let spec = ds.spec.as_ref().unwrap();
    let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref();
    for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
        assert_eq!(labels.and_then(|l| l.get(k)), Some(v), "selector {k}");
    }
    // Not the agent's pods: its selector must not match them.
    let agent_labels = agent
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap();
    let agent_labels = agent_labels.labels.clone().unwrap_or_default();
    assert!(spec
        .selector
        .match_labels
        .as_ref()
        .unwrap()
        .iter()
        .any(|(k, v)| agent_labels.get(k) != Some(v)));

    // Every node the agent is on, in the host network, with the agent's privileges.
    let (pod, agent_pod) = (
        spec.template.spec.as_ref().unwrap(),
        agent.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
    );
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.tolerations, agent_pod.tolerations);
    assert_eq!(pod.node_selector, agent_pod.node_selector);
    assert_eq!(pod.priority_class_name, agent_pod.priority_class_name);
    assert!(pod.affinity.is_none() && pod.node_name.is_none());
    // No API access: RBAC is deleted after it, and the default account needs no token.
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert!(pod.service_account_name.is_none());
    let (c, agent_c) = (container(ds), container(agent));
    assert_eq!(c.image, agent_c.image);
    assert_eq!(c.security_context, agent_c.security_context);
    let mounts = |c: &Container| -> BTreeMap<String, (String, bool)> {
        c.volume_mounts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m.mount_path.clone(),
                    (m.name.clone(), m.read_only.unwrap_or(false)),
                )
            })
            .collect()
    };
    let host_paths = |p: &k8s_openapi::api::core::v1::PodSpec| -> BTreeMap<String, String> {
        p.volumes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.path.clone())))
            .collect()
    };
    let (m, agent_m) = (mounts(c), mounts(agent_c));
    let path = "/run/xtables.lock";
    assert_eq!(m[path].1, agent_m[path].1, "{path} mounted read-only alike");
    assert_eq!(
        host_paths(pod)[&m[path].0],
        host_paths(agent_pod)[&agent_m[path].0],
        "{path}"
    );

    // The script: cleanup of both backends, with options `cleanup` has.
    let script = uninstall_script(ds);
    let cleanup_help = {
        let out = Command::new(BIN)
            .args(["cleanup", "--help"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let backends = env_help("cleanup")["FELIX_IPTABLESBACKEND"]
        .possible
        .clone();
    let mut seen = BTreeSet::new();
    for line in script.lines().filter(|l| l.contains("netpol-agent ")) {
        let words: Vec<&str> = line
            .split("netpol-agent ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .take_while(|w| !w.starts_with("||") && !w.starts_with(';'))
            .collect();
        if line.trim_start().starts_with("log ") || line.contains("echo") {
            continue;
        }
        assert!(subcommands().contains(words[0]), "{line}");
        assert_eq!(words[0], "cleanup", "{line}");
        for (i, w) in words.iter().enumerate().skip(1) {
            if w.starts_with("--") {
                assert!(
                    cleanup_help.contains(&format!("{w} "))
                        || cleanup_help.contains(&format!("{w}\n")),
                    "{w} in {line}"
                );
                if *w == "--iptables-backend" {
                    assert!(backends.iter().any(|b| b == words[i + 1]), "{line}");
                    seen.insert(words[i + 1].to_string());
                }
            }
        }
        // `--check` only asks whether felix owns the node; every cleaning run covers both families.
        assert!(
            words.contains(&"--check") || words.contains(&"--ipv6-support"),
            "both families where there: {line}"
        );
    }
    assert_eq!(
        seen,
        BTreeSet::from(["legacy".to_string(), "nft".to_string()]),
        "cleanup of both backends"
    );
    // It waits for the agent's health port to close.
    let port = env_value(
        container(agent).env.as_deref().unwrap_or_default(),
        "FELIX_HEALTHPORT",
    )
    .unwrap();
    assert_eq!(script_default(&script, "NETPOL_UNINSTALL_HEALTHPORT"), port);
    // Ready exactly when the script wrote its done file, on a writable mount.
    let done = script_default(&script, "NETPOL_UNINSTALL_DONE");
    let probe = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.clone())
        .expect("an exec readiness probe");
    assert_eq!(probe, ["test", "-e", done.as_str()]);
    let dir = Path::new(&done).parent().unwrap().to_str().unwrap();
    let (volume, read_only) = &m[dir];
    assert!(!read_only);
    assert!(pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|v| &v.name == volume && v.empty_dir.is_some()));
    // It stops at once when the pod is deleted.
    assert!(script.contains("trap "), "{script}");

    // Its environment and options through the real `cleanup`, on an empty namespace.
    let ns = NetNs::new("deploy-uninstall");
    let mut cmd = common::agent_in(&ns.name);
    for e in c.env.as_deref().unwrap_or_default() {
        if let Some(v) = &e.value {
            cmd.env(&e.name, v);
        }
    }
    let out = cmd
        .args([
            "cleanup",
            "--iptables-backend",
            "nft",
            "--ipv6-support",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// deploy/crds/: the staged kinds' CRDs (issue 23) are strict `CustomResourceDefinition`s
/// whose group, names, scope and plural are the ones the agent watches, and whose spec holds
/// the enforced kind's top-level fields plus `stagedAction` (Set, the default, or Delete).
#[test]
fn staged_policy_crds_match_the_kinds_the_agent_watches() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use netpol_agent::model::staged;
    let docs = documents_in(&deploy_dir().join("crds"));
    let crds: Vec<CustomResourceDefinition> = docs
        .iter()
        .flat_map(|(file, docs)| docs.iter().map(move |d| (file, d)))
        .map(|(file, d)| typed(d, file))
        .collect();
    let want = [
        (
            staged::KIND,
            staged::PLURAL,
            "Namespaced",
            vec![
                "egress",
                "ingress",
                "podSelector",
                "policyTypes",
                "stagedAction",
            ],
        ),
        (
            staged::CLUSTER_KIND,
            staged::CLUSTER_PLURAL,
            "Cluster",
            vec![
                "egress",
                "ingress",
                "priority",
                "stagedAction",
                "subject",
                "tier",
            ],
        ),
    ];
    assert_eq!(crds.len(), want.len());
    for (kind, plural, scope, fields) in want {
        let crd = crds
            .iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"));
        assert_eq!(crd.spec.group, staged::GROUP);
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.scope, scope);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.{}", staged::GROUP).as_str())
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, staged::VERSION);
        assert!(version.served && version.storage);
        let schema = version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap();
        let spec = &schema.properties.as_ref().unwrap()["spec"];
        let props = spec.properties.as_ref().unwrap();
        let names: Vec<&str> = props.keys().map(String::as_str).collect();
        assert_eq!(names, fields, "{kind}");
        let action = &props["stagedAction"];
        let values: Vec<String> = action
            .enum_
            .iter()
            .flatten()
            .map(|v| v.0.as_str().unwrap().to_string())
            .collect();
        assert_eq!(values, ["Set", "Delete"]);
        assert_eq!(
            action.default.as_ref().map(|d| d.0.clone()),
            Some(serde_json::json!("Set"))
        );
    }
}
