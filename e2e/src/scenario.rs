//! The scenario format (one YAML file per scenario; the contract every suite is fed through)
//! and its resolution into a plan: the cluster as it must be after each step, with every
//! expectation turned into a truth table. Everything that can be wrong with a file is found
//! here, before any namespace is made; `netpol-e2e check` stops at this point.
//!
//! Pod addresses are assigned here, deterministically (node `i` owns `10.244.<i>.0/24`, pods
//! get the next free host in listing order, ClusterIPs come from `10.96.0.0/16`), so that
//! `${ip:ns/pod}` and `${cidr:ns/pod/N}` expand the same way in `check` and in `run`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context};
use indexmap::IndexMap;
use ipnet::Ipv4Net;
use serde::Deserialize;

use crate::cluster_policy;
use crate::expect::{parse_expectations, parse_key, TruthTable};
// The probe key types live with the expectations they key; scenarios name them from here.
pub use crate::expect::{ExpectDecl, PortKey, Protocol};

pub type Labels = BTreeMap<String, String>;

pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    #[default]
    Service,
    Pod,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortDecl {
    #[serde(default)]
    pub name: Option<String>,
    pub port: u16,
    #[serde(default = "tcp")]
    pub protocol: Protocol,
}

fn tcp() -> Protocol {
    Protocol::Tcp
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodDecl {
    #[serde(default)]
    labels: Option<Labels>,
    #[serde(default)]
    node: Option<usize>,
    #[serde(default)]
    ports: Option<Vec<PortDecl>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeDecl {
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    protocols: Option<Vec<Protocol>>,
    /// Explicit `PROTO/PORT` list instead of the ports × protocols product (suites whose
    /// pods serve different ports on different protocols).
    #[serde(default)]
    combinations: Option<Vec<String>>,
    #[serde(default)]
    target: Target,
}

fn default_ports() -> Vec<u16> {
    vec![80]
}

fn default_protocols() -> Vec<Protocol> {
    vec![Protocol::Tcp]
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetLabelsDecl {
    #[serde(default)]
    pods: IndexMap<String, Option<Labels>>,
    #[serde(default)]
    namespaces: IndexMap<String, Option<Labels>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDecl {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    apply: Option<String>,
    #[serde(default)]
    delete: Vec<String>,
    #[serde(default)]
    set_labels: Option<SetLabelsDecl>,
    #[serde(default)]
    add_pods: IndexMap<String, Option<PodDecl>>,
    #[serde(default)]
    delete_pods: Vec<String>,
    #[serde(default)]
    add_namespaces: IndexMap<String, Option<Labels>>,
    #[serde(default)]
    delete_namespaces: Vec<String>,
    expect: Option<BTreeMap<String, Option<ExpectDecl>>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioDecl {
    name: String,
    #[serde(default = "default_nodes")]
    nodes: usize,
    #[serde(default)]
    namespaces: IndexMap<String, Option<Labels>>,
    #[serde(default)]
    pods: IndexMap<String, Option<PodDecl>>,
    #[serde(default)]
    probe: Option<ProbeDecl>,
    steps: Vec<StepDecl>,
}

fn default_nodes() -> usize {
    2
}

pub const MAX_NODES: usize = 16;

/// A pod as the harness builds it. `uid` is unique within the scenario and never reused, so
/// a pod deleted and created again gets new namespaces and a new address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: usize,
    pub labels: Labels,
    pub node: usize,
    pub ports: Vec<PortDecl>,
    pub ip: Ipv4Addr,
    pub cluster_ip: Ipv4Addr,
}

impl Pod {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod's address in `family`: its IPv4 address, or that embedded (`family`).
    pub fn addr(&self, family: netpol_agent::model::IpFamily) -> std::net::IpAddr {
        crate::family::addr_of(self.ip, family)
    }
}

/// The cluster's objects at one point of a scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct World {
    /// Namespace → labels, including `kubernetes.io/metadata.name`.
    pub namespaces: IndexMap<String, Labels>,
    pub pods: IndexMap<String, Pod>,
    /// `ns/name` → the NetworkPolicy as a YAML document, placeholders expanded.
    pub policies: BTreeMap<String, String>,
    /// `name` → the ClusterNetworkPolicy as a YAML document, placeholders expanded.
    /// Cluster-scoped: deleting a namespace leaves these alone.
    pub cluster_policies: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub name: String,
    /// The cluster after the step's changes.
    pub world: World,
    pub expect: BTreeMap<PortKey, TruthTable>,
    /// The step's `apply` text as written, placeholders unexpanded: a real cluster's runner
    /// expands it again with the addresses its pods really got (`kube_run`).
    pub apply: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub path: PathBuf,
    pub nodes: usize,
    pub target: Target,
    pub initial: World,
    pub steps: Vec<Step>,
}

/// Files named on the command line, directories searched recursively for `*.yaml`/`*.yml`,
/// sorted so runs are reproducible.
pub fn scenario_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in paths {
        collect(path, &mut out).with_context(|| format!("reading {}", path.display()))?;
    }
    Ok(out)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for entry in entries {
            let hidden = entry
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden {
                continue;
            }
            if entry.is_dir() {
                collect(&entry, out)?;
            } else if matches!(
                entry.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(entry);
            }
        }
    } else {
        std::fs::metadata(path)?;
        out.push(path.to_path_buf());
    }
    Ok(())
}

pub fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> anyhow::Result<Scenario> {
    let decl: ScenarioDecl = serde_yaml_ng::from_str(text).map_err(|e| anyhow!("{e}"))?;
    resolve(decl, path)
}

/// Hands out addresses: per-node pod hosts and ClusterIPs, never reused.
struct Allocator {
    next_host: Vec<u32>,
    next_service: u32,
    next_uid: usize,
}

impl Allocator {
    fn pod(&mut self, node: usize) -> anyhow::Result<(Ipv4Addr, Ipv4Addr, usize)> {
        let host = self.next_host[node];
        ensure!(host < 255, "node {node} has no pod addresses left");
        self.next_host[node] += 1;
        let service = self.next_service;
        ensure!(service < 65_000, "no ClusterIPs left");
        self.next_service += 1;
        let uid = self.next_uid;
        self.next_uid += 1;
        Ok((
            Ipv4Addr::new(10, 244, node as u8, host as u8),
            Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + service),
            uid,
        ))
    }
}

/// Builds a world outside a scenario file (the demo), with the same address plan.
pub struct WorldBuilder {
    pub world: World,
    nodes: usize,
    alloc: Allocator,
    round_robin: usize,
}

impl WorldBuilder {
    pub fn new(nodes: usize) -> WorldBuilder {
        WorldBuilder {
            world: World::default(),
            nodes,
            alloc: Allocator {
                next_host: vec![10; nodes],
                next_service: 10,
                next_uid: 0,
            },
            round_robin: 0,
        }
    }

    pub fn namespace(&mut self, name: &str, labels: Labels) -> anyhow::Result<()> {
        add_namespace(&mut self.world, name, labels)
    }

    pub fn pod(
        &mut self,
        key: &str,
        labels: Labels,
        node: usize,
        ports: Vec<PortDecl>,
    ) -> anyhow::Result<()> {
        let decl = PodDecl {
            labels: Some(labels),
            node: Some(node),
            ports: Some(ports),
        };
        add_pod(
            &mut self.world,
            &mut self.alloc,
            self.nodes,
            &mut self.round_robin,
            key,
            decl,
        )
    }

    /// Applies a multi-document YAML of NetworkPolicies and ClusterNetworkPolicies
    /// (placeholders expanded).
    pub fn apply(&mut self, text: &str) -> anyhow::Result<()> {
        let expanded = expand(text, &self.world)?;
        for policy in split_policies(&expanded)? {
            policy.insert_into(&mut self.world);
        }
        Ok(())
    }
}

/// The ClusterIP range.
pub fn service_cidr() -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(10, 96, 0, 0), 16).expect("valid prefix")
}

/// The CIDR every pod of node `i` is in (routes between nodes point at it).
pub fn node_pod_cidr(node: usize) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(10, 244, node as u8, 0), 24).expect("valid prefix")
}

fn resolve(decl: ScenarioDecl, path: &Path) -> anyhow::Result<Scenario> {
    ensure!(!decl.name.trim().is_empty(), "`name` is empty");
    ensure!(
        (1..=MAX_NODES).contains(&decl.nodes),
        "`nodes` must be between 1 and {MAX_NODES}, got {}",
        decl.nodes
    );
    let probe = decl.probe.unwrap_or_default();
    let ports = probed_keys(&probe)?;

    let mut alloc = Allocator {
        next_host: vec![10; decl.nodes],
        next_service: 10,
        next_uid: 0,
    };
    let mut world = World::default();
    for (name, labels) in decl.namespaces {
        add_namespace(&mut world, &name, labels.unwrap_or_default())?;
    }
    let mut round_robin = 0usize;
    for (key, pod) in decl.pods {
        add_pod(
            &mut world,
            &mut alloc,
            decl.nodes,
            &mut round_robin,
            &key,
            pod.unwrap_or_default(),
        )
        .with_context(|| format!("pods: {key}"))?;
    }
    let initial = world.clone();

    ensure!(!decl.steps.is_empty(), "a scenario needs at least one step");
    let mut steps = Vec::new();
    let mut names = BTreeSet::new();
    for (i, step) in decl.steps.into_iter().enumerate() {
        let label = step
            .name
            .clone()
            .unwrap_or_else(|| format!("step {}", i + 1));
        ensure!(names.insert(label.clone()), "two steps are named {label:?}");
        let step = apply_step(
            &mut world,
            &mut alloc,
            decl.nodes,
            &mut round_robin,
            step,
            &ports,
            &label,
        )
        .with_context(|| format!("step {} ({label})", i + 1))?;
        steps.push(step);
    }
    Ok(Scenario {
        name: decl.name,
        path: path.to_path_buf(),
        nodes: decl.nodes,
        target: probe.target,
        initial,
        steps,
    })
}

/// What every step probes: `combinations`, or the product of `ports` and `protocols`.
fn probed_keys(probe: &ProbeDecl) -> anyhow::Result<Vec<PortKey>> {
    let mut keys = Vec::new();
    if let Some(combinations) = &probe.combinations {
        ensure!(
            probe.ports.is_none() && probe.protocols.is_none(),
            "probe: give either `combinations` or `ports`/`protocols`, not both"
        );
        ensure!(!combinations.is_empty(), "probe.combinations is empty");
        for text in combinations {
            let key = parse_key(text).with_context(|| format!("probe.combinations: {text}"))?;
            ensure!(key.port != 0, "probe port 0");
            ensure!(!keys.contains(&key), "probe.combinations lists {key} twice");
            keys.push(key);
        }
    } else {
        let ports = probe.ports.clone().unwrap_or_else(default_ports);
        let protocols = probe.protocols.clone().unwrap_or_else(default_protocols);
        ensure!(!ports.is_empty(), "probe.ports is empty");
        ensure!(!protocols.is_empty(), "probe.protocols is empty");
        for &protocol in &protocols {
            for &port in &ports {
                ensure!(port != 0, "probe port 0");
                let key = PortKey { protocol, port };
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    keys.sort();
    Ok(keys)
}

fn check_name(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    ensure!(
        ok,
        "{what} {name:?} is not a DNS label (lowercase letters, digits, '-', at most 63)"
    );
    Ok(())
}

/// Object names (pods, policies) are DNS subdomains: labels joined by dots, 253 at most.
fn check_object_name(name: &str) -> anyhow::Result<()> {
    ensure!(
        name.len() <= 253,
        "name {name:?} is longer than 253 characters"
    );
    // Kubernetes' subdomain rule has no per-label length limit, only the total.
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        ensure!(
            ok,
            "name {name:?} is not a DNS subdomain (lowercase letters, digits, '-', '.')"
        );
    }
    Ok(())
}

pub fn split_key(key: &str) -> anyhow::Result<(&str, &str)> {
    let (ns, name) = key
        .split_once('/')
        .ok_or_else(|| anyhow!("{key:?} is not of the form \"namespace/name\""))?;
    check_name("namespace", ns)?;
    check_object_name(name)?;
    Ok((ns, name))
}

fn add_namespace(world: &mut World, name: &str, mut labels: Labels) -> anyhow::Result<()> {
    check_name("namespace", name)?;
    ensure!(
        !world.namespaces.contains_key(name),
        "namespace {name} exists already"
    );
    labels.insert(NAMESPACE_NAME_LABEL.into(), name.into());
    world.namespaces.insert(name.into(), labels);
    Ok(())
}

fn default_pod_ports() -> Vec<PortDecl> {
    let mut ports = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for port in [80, 81] {
            ports.push(PortDecl {
                name: Some(format!(
                    "serve-{port}-{}",
                    protocol.as_str().to_ascii_lowercase()
                )),
                port,
                protocol,
            });
        }
    }
    ports
}

fn add_pod(
    world: &mut World,
    alloc: &mut Allocator,
    nodes: usize,
    round_robin: &mut usize,
    key: &str,
    decl: PodDecl,
) -> anyhow::Result<()> {
    let (ns, name) = split_key(key)?;
    ensure!(
        world.namespaces.contains_key(ns),
        "namespace {ns} does not exist"
    );
    ensure!(!world.pods.contains_key(key), "pod {key} exists already");
    let node = match decl.node {
        Some(n) => {
            ensure!(
                n < nodes,
                "node {n} does not exist (nodes are 0..{})",
                nodes - 1
            );
            n
        }
        None => {
            let n = *round_robin % nodes;
            *round_robin += 1;
            n
        }
    };
    let ports = decl.ports.unwrap_or_else(default_pod_ports);
    let mut seen = BTreeSet::new();
    for p in &ports {
        ensure!(p.port != 0, "port 0");
        ensure!(
            seen.insert((p.protocol, p.port)),
            "port {}/{} listed twice",
            p.protocol.as_str(),
            p.port
        );
        if let Some(n) = &p.name {
            ensure!(
                !n.is_empty() && n.len() <= 15,
                "port name {n:?} must have 1 to 15 characters"
            );
        }
    }
    let (ip, cluster_ip, uid) = alloc.pod(node)?;
    world.pods.insert(
        key.into(),
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid,
            labels: decl.labels.unwrap_or_default(),
            node,
            ports,
            ip,
            cluster_ip,
        },
    );
    Ok(())
}

/// Order within a step: namespaces are created, pods created, labels set, policies applied
/// and deleted, pods deleted, namespaces deleted (with their pods and policies).
fn apply_step(
    world: &mut World,
    alloc: &mut Allocator,
    nodes: usize,
    round_robin: &mut usize,
    step: StepDecl,
    ports: &[PortKey],
    label: &str,
) -> anyhow::Result<Step> {
    for (name, labels) in step.add_namespaces {
        add_namespace(world, &name, labels.unwrap_or_default())
            .with_context(|| format!("add_namespaces: {name}"))?;
    }
    for (key, pod) in step.add_pods {
        add_pod(
            world,
            alloc,
            nodes,
            round_robin,
            &key,
            pod.unwrap_or_default(),
        )
        .with_context(|| format!("add_pods: {key}"))?;
    }
    if let Some(set) = step.set_labels {
        for (key, labels) in set.pods {
            let pod = world
                .pods
                .get_mut(&key)
                .ok_or_else(|| anyhow!("set_labels: pod {key} does not exist"))?;
            pod.labels = labels.unwrap_or_default();
        }
        for (name, labels) in set.namespaces {
            let slot = world
                .namespaces
                .get_mut(&name)
                .ok_or_else(|| anyhow!("set_labels: namespace {name} does not exist"))?;
            let mut labels = labels.unwrap_or_default();
            labels.insert(NAMESPACE_NAME_LABEL.into(), name.clone());
            *slot = labels;
        }
    }
    if let Some(text) = &step.apply {
        let expanded = expand(text, world).context("apply")?;
        for policy in split_policies(&expanded).context("apply")? {
            if let Applied::NetworkPolicy { key, .. } = &policy {
                let (ns, _) = split_key(key)?;
                ensure!(
                    world.namespaces.contains_key(ns),
                    "apply: policy {key}: namespace {ns} does not exist"
                );
            }
            policy.insert_into(world);
        }
    }
    for key in &step.delete {
        if let Some(name) = key.strip_prefix(CLUSTER_POLICY_PREFIX) {
            check_object_name(name).context("delete")?;
            ensure!(
                world.cluster_policies.remove(name).is_some(),
                "delete: {key} does not exist"
            );
            continue;
        }
        split_key(key).context("delete")?;
        ensure!(
            world.policies.remove(key).is_some(),
            "delete: policy {key} does not exist"
        );
    }
    for key in &step.delete_pods {
        ensure!(
            world.pods.shift_remove(key).is_some(),
            "delete_pods: pod {key} does not exist"
        );
    }
    for name in &step.delete_namespaces {
        ensure!(
            world.namespaces.shift_remove(name).is_some(),
            "delete_namespaces: namespace {name} does not exist"
        );
        world.pods.retain(|_, p| &p.namespace != name);
        // NetworkPolicies go with their namespace; ClusterNetworkPolicies are cluster-scoped
        // and stay.
        let prefix = format!("{name}/");
        world.policies.retain(|k, _| !k.starts_with(&prefix));
    }
    let decls = step
        .expect
        .ok_or_else(|| anyhow!("`expect` is missing (write `\"*\": {{}}` for all-connected)"))?;
    let pods: Vec<String> = world.pods.keys().cloned().collect();
    let expect = parse_expectations(&decls, ports, &pods)?;
    Ok(Step {
        name: label.to_string(),
        world: world.clone(),
        expect,
        apply: step.apply,
    })
}

/// Expands `${ip:ns/pod}` and `${cidr:ns/pod/N}` against the pods that exist now.
pub fn expand(text: &str, world: &World) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| anyhow!("unterminated placeholder at {:?}", &rest[start..]))?;
        let inner = &after[..end];
        out.push_str(&expand_one(inner, world)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn expand_one(inner: &str, world: &World) -> anyhow::Result<String> {
    let pod_of = |key: &str| {
        world
            .pods
            .get(key)
            .ok_or_else(|| anyhow!("${{{inner}}}: pod {key} does not exist at this step"))
    };
    if let Some(key) = inner.strip_prefix("ip:") {
        return Ok(pod_of(key)?.ip.to_string());
    }
    if let Some(spec) = inner.strip_prefix("cidr:") {
        let (key, bits) = spec
            .rsplit_once('/')
            .ok_or_else(|| anyhow!("${{{inner}}}: expected cidr:ns/pod/N"))?;
        let bits: u8 = bits
            .parse()
            .ok()
            .filter(|b| *b <= 32)
            .ok_or_else(|| anyhow!("${{{inner}}}: prefix length must be 0..32"))?;
        let net = Ipv4Net::new(pod_of(key)?.ip, bits)?.trunc();
        return Ok(net.to_string());
    }
    bail!("unknown placeholder ${{{inner}}} (known: ${{ip:ns/pod}}, ${{cidr:ns/pod/N}})")
}

/// How `delete:` names a ClusterNetworkPolicy (a namespace is never spelled with capitals,
/// so this cannot be mistaken for `ns/name`).
pub const CLUSTER_POLICY_PREFIX: &str = "ClusterNetworkPolicy/";

/// One document of an `apply:`.
#[derive(Debug)]
pub enum Applied {
    NetworkPolicy { key: String, doc: String },
    ClusterNetworkPolicy { name: String, doc: String },
}

impl Applied {
    /// Created, or replaced by its key.
    fn insert_into(self, world: &mut World) {
        match self {
            Applied::NetworkPolicy { key, doc } => {
                world.policies.insert(key, doc);
            }
            Applied::ClusterNetworkPolicy { name, doc } => {
                world.cluster_policies.insert(name, doc);
            }
        }
    }
}

/// Splits a multi-document YAML of NetworkPolicies and ClusterNetworkPolicies into one
/// document each, checking a NetworkPolicy deserializes as one and a ClusterNetworkPolicy
/// has the API's shape (`cluster_policy::check`).
pub fn split_policies(text: &str) -> anyhow::Result<Vec<Applied>> {
    use serde::Deserialize as _;
    let mut out: Vec<Applied> = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(doc)
            .map_err(|e| anyhow!("document {}: {e}", i + 1))?;
        if value.is_null() {
            continue;
        }
        if cluster_policy::is_cluster_policy(&value) {
            let name =
                cluster_policy::check(&value).map_err(|e| anyhow!("document {}: {e}", i + 1))?;
            check_object_name(&name)?;
            ensure!(
                !out.iter().any(
                    |p| matches!(p, Applied::ClusterNetworkPolicy { name: n, .. } if n == &name)
                ),
                "{CLUSTER_POLICY_PREFIX}{name} appears twice in one apply"
            );
            out.push(Applied::ClusterNetworkPolicy {
                name,
                doc: serde_yaml_ng::to_string(&value)?,
            });
            continue;
        }
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        ensure!(
            kind == "NetworkPolicy",
            "document {}: kind is {kind:?}, only NetworkPolicy and ClusterNetworkPolicy may be applied",
            i + 1
        );
        let policy: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_yaml_ng::from_value(value.clone())
                .map_err(|e| anyhow!("document {}: not a NetworkPolicy: {e}", i + 1))?;
        let name = policy.metadata.name.clone().unwrap_or_default();
        let ns = policy
            .metadata
            .namespace
            .clone()
            .ok_or_else(|| anyhow!("policy {name:?} has no metadata.namespace"))?;
        let key = format!("{ns}/{name}");
        split_key(&key)?;
        ensure!(
            !out.iter()
                .any(|p| matches!(p, Applied::NetworkPolicy { key: k, .. } if k == &key)),
            "policy {key} appears twice in one apply"
        );
        out.push(Applied::NetworkPolicy {
            key,
            doc: serde_yaml_ng::to_string(&value)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
name: allow-from-b
namespaces:
  x: {ns: x}
  y: {ns: y}
pods:
  x/a: {labels: {pod: a}}
  x/b: {labels: {pod: b}, node: 1}
  y/a: {labels: {pod: a}, ports: [{name: serve-80-tcp, port: 80, protocol: TCP}]}
probe:
  ports: [80, 81]
  protocols: [TCP, UDP]
steps:
  - name: isolate x/a
    apply: |
      apiVersion: networking.k8s.io/v1
      kind: NetworkPolicy
      metadata: {name: p, namespace: x}
      spec:
        podSelector: {matchLabels: {pod: a}}
        egress: [{to: [{ipBlock: {cidr: "${cidr:x/b/4}", except: ["${ip:x/b}/32"]}}]}]
    expect:
      "*":
        deny: ["*->x/a"]
        allow: ["x/b->x/a"]
      "TCP/81":
        matrix: |
          -   x/a x/b y/a
          x/a #   .   X
          x/b .   .   X
          y/a X   X   .
  - name: drop y
    delete_namespaces: [y]
    expect: {"*": {}}
"#;

    #[test]
    fn the_issue_example_resolves() {
        let s = parse(EXAMPLE, Path::new("x.yaml")).unwrap();
        assert_eq!(s.nodes, 2);
        assert_eq!(s.steps[0].expect.len(), 4);
        let pods: Vec<_> = s.initial.pods.values().collect();
        assert_eq!(pods[0].node, 0);
        assert_eq!(pods[1].node, 1);
        assert_eq!(
            pods[2].node, 1,
            "round robin skips pods with an explicit node"
        );
        assert_eq!(pods[0].ip, Ipv4Addr::new(10, 244, 0, 10));
        assert_eq!(pods[1].ip, Ipv4Addr::new(10, 244, 1, 10));
        assert_ne!(pods[0].cluster_ip, pods[1].cluster_ip);
        assert_eq!(pods[2].ports.len(), 1);
        let policy = &s.steps[0].world.policies["x/p"];
        assert!(policy.contains("0.0.0.0/4"), "{policy}");
        assert!(policy.contains("10.244.1.10/32"), "{policy}");
        let udp80 = &s.steps[0].expect[&PortKey {
            protocol: Protocol::Udp,
            port: 80,
        }];
        assert!(!udp80.get("y/a", "x/a").unwrap());
        assert!(udp80.get("x/b", "x/a").unwrap());
        assert!(udp80.get("x/a", "y/a").unwrap());
        let tcp81 = &s.steps[0].expect[&PortKey {
            protocol: Protocol::Tcp,
            port: 81,
        }];
        assert!(!tcp81.get("x/a", "y/a").unwrap());
        assert_eq!(s.steps[1].world.pods.len(), 2);
        assert_eq!(
            s.steps[1].world.namespaces["x"][NAMESPACE_NAME_LABEL], "x",
            "the default namespace label is always added"
        );
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, Path::new("t.yaml")).unwrap_err())
    }

    #[test]
    fn mistakes_are_reported_before_anything_runs() {
        let base = "name: t\nnamespaces: {x: {}}\npods: {x/a: {}, x/b: {}}\n";
        assert!(err(&format!("{base}steps: [{{name: s}}]")).contains("`expect` is missing"));
        assert!(
            err(&format!("{base}steps: [{{expect: {{\"TCP/81\": {{}}}}}}]"))
                .contains("TCP/81 is not probed")
        );
        assert!(err(&format!(
            "{base}probe: {{ports: [80, 81]}}\nsteps: [{{expect: {{\"TCP/81\": {{}}}}}}]"
        ))
        .contains("no expectation for TCP/80"));
        assert!(err(&format!(
            "{base}steps: [{{expect: {{\"*\": {{deny: [x/c->x/a]}}}}}}]"
        ))
        .contains("matches no pair"));
        assert!(err(&format!(
            "{base}steps: [{{delete_pods: [x/c], expect: {{\"*\": {{}}}}}}]"
        ))
        .contains("pod x/c does not exist"));
        assert!(err(&format!("{base}stepz: []")).contains("unknown field"));
        assert!(err(
            "name: t\nnamespaces: {x: {}}\npods: {x/a: {node: 2}}\nsteps: [{expect: {'*': {}}}]"
        )
        .contains("node 2 does not exist"));
        assert!(err(&format!(
            "{base}steps: [{{apply: 'kind: NetworkPolicy\nmetadata: {{name: p, namespace: x}}\nspec: {{podSelector: {{}}, ingress: [{{from: [{{ipBlock: {{cidr: \"${{ip:x/z}}/32\"}}}}]}}]}}', expect: {{'*': {{}}}}}}]"
        ))
        .contains("pod x/z does not exist"));
    }

    #[test]
    fn a_pod_created_again_gets_a_new_address() {
        let s = parse(
            "name: t\nnamespaces: {x: {}}\npods: {x/a: {}}\nsteps:\n- {delete_pods: [x/a], expect: {'*': {}}}\n- {add_pods: {x/a: {}}, expect: {'*': {}}}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let before = &s.initial.pods["x/a"];
        let after = &s.steps[1].world.pods["x/a"];
        assert_ne!(before.uid, after.uid);
        assert_ne!(before.ip, after.ip);
    }

    const CNP_BASE: &str = r#"
name: t
namespaces: {x: {}, y: {}}
pods:
  x/a: {ports: [{name: web, port: 80}, {port: 53, protocol: UDP}]}
  y/b: {ports: [{name: web, port: 80}, {port: 53, protocol: UDP}]}
probe: {combinations: [TCP/80, UDP/53], target: pod}
steps:
"#;

    fn cnp(name: &str, extra_meta: &str, priority: u32) -> String {
        format!(
            "      apiVersion: policy.networking.k8s.io/v1alpha2\n      kind: ClusterNetworkPolicy\n      metadata: {{name: {name}{extra_meta}}}\n      spec:\n        tier: Admin\n        priority: {priority}\n        subject: {{namespaces: {{}}}}\n        egress: [{{action: Deny, to: [{{networks: [\"${{cidr:y/b/32}}\"]}}]}}]\n"
        )
    }

    fn step(body: &str) -> String {
        format!("  - {body}\n    expect: {{'*': {{}}}}\n")
    }

    #[test]
    fn cluster_policies_are_applied_replaced_and_deleted_by_name() {
        let text = format!(
            "{CNP_BASE}{}{}{}{}",
            step(&format!(
                "name: both kinds\n    apply: |\n{}      ---\n      apiVersion: networking.k8s.io/v1\n      kind: NetworkPolicy\n      metadata: {{name: p, namespace: x}}\n      spec: {{podSelector: {{}}}}\n",
                cnp("deny-b", "", 5)
            )),
            step(&format!("name: replace\n    apply: |\n{}", cnp("deny-b", "", 7))),
            step("name: drop x\n    delete_namespaces: [x]"),
            step("name: delete\n    delete: [ClusterNetworkPolicy/deny-b]"),
        );
        let s = parse(&text, Path::new("t.yaml")).unwrap();
        let keys: Vec<String> = s.steps[0].expect.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["TCP/80", "UDP/53"]);
        let first = &s.steps[0].world;
        assert_eq!(first.policies.keys().collect::<Vec<_>>(), ["x/p"]);
        let doc = &first.cluster_policies["deny-b"];
        assert!(doc.contains("10.244.1.10/32"), "placeholders expand: {doc}");
        assert!(doc.contains("priority: 5"), "{doc}");
        assert!(s.steps[1].world.cluster_policies["deny-b"].contains("priority: 7"));
        let dropped = &s.steps[2].world;
        assert!(dropped.policies.is_empty(), "x's NetworkPolicy goes with x");
        assert!(
            dropped.cluster_policies.contains_key("deny-b"),
            "a cluster-scoped policy outlives any namespace"
        );
        assert!(s.steps[3].world.cluster_policies.is_empty());
    }

    #[test]
    fn cluster_policy_mistakes_are_reported() {
        let bad = |body: &str| {
            format!(
                "{:#}",
                parse(&format!("{CNP_BASE}{}", step(body)), Path::new("t.yaml")).unwrap_err()
            )
        };
        let with_ns = bad(&format!("apply: |\n{}", cnp("deny-b", ", namespace: x", 5)));
        assert!(with_ns.contains("cluster-scoped"), "{with_ns}");
        let twice = bad(&format!(
            "apply: |\n{}      ---\n{}",
            cnp("deny-b", "", 5),
            cnp("deny-b", "", 6)
        ));
        assert!(twice.contains("appears twice"), "{twice}");
        let bad_name = bad(&format!("apply: |\n{}", cnp("Deny_B", "", 5)));
        assert!(bad_name.contains("not a DNS subdomain"), "{bad_name}");
        let missing = bad("delete: [ClusterNetworkPolicy/nope]");
        assert!(
            missing.contains("ClusterNetworkPolicy/nope does not exist"),
            "{missing}"
        );
        let as_np = bad("delete: [x/nope]");
        assert!(as_np.contains("policy x/nope does not exist"), "{as_np}");
        let other_kind =
            bad("apply: |\n      kind: AdminNetworkPolicy\n      metadata: {name: a}\n");
        assert!(
            other_kind.contains("only NetworkPolicy and ClusterNetworkPolicy"),
            "{other_kind}"
        );
        let shape = bad(&format!(
            "apply: |\n{}",
            cnp("deny-b", "", 5).replace("tier: Admin", "tier: admin")
        ));
        assert!(shape.contains("unknown variant `admin`"), "{shape}");
    }

    #[test]
    fn probe_combinations_replace_the_product() {
        let base = "name: t\nnamespaces: {x: {}}\npods: {x/a: {}, x/b: {}}\n";
        let both = format!(
            "{base}probe: {{combinations: [TCP/80], ports: [80]}}\nsteps: [{{expect: {{'*': {{}}}}}}]"
        );
        assert!(err(&both).contains("not both"));
        let twice = format!(
            "{base}probe: {{combinations: [TCP/80, TCP/80]}}\nsteps: [{{expect: {{'*': {{}}}}}}]"
        );
        assert!(err(&twice).contains("lists TCP/80 twice"));
        let unknown =
            format!("{base}probe: {{combinations: [ICMP/0]}}\nsteps: [{{expect: {{'*': {{}}}}}}]");
        assert!(err(&unknown).contains("unknown protocol"));
        let not_probed = format!(
            "{base}probe: {{combinations: [UDP/81]}}\nsteps: [{{expect: {{'TCP/80': {{}}}}}}]"
        );
        assert!(err(&not_probed).contains("TCP/80 is not probed"));
    }
}
