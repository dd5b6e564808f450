//! Validation at the edge of the calc graph: turns `k8s-openapi` Pods, Namespaces and
//! NetworkPolicies (and ClusterNetworkPolicies, in `cluster`) into the trusted model types,
//! applying the API server's validation and defaulting rules that matter for enforcement. An
//! object that fails is rejected as a whole with a [`ValidationError`] naming the offending
//! field. Staged objects (`staged`) are validated as the objects they would become.

mod cluster;
mod staged;

pub use cluster::cluster_network_policy;
pub use staged::{staged_cluster_network_policy, staged_network_policy};

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::Selector;

use super::{
    IpFamily, LabelSel, NamedPort, NamespaceInfo, NamespaceScope, ObjectKey, Peer, PodInfo,
    PolicyInfo, PolicyRule, PortMatch, PortSpec, Protocol, NAMESPACE_NAME_LABEL,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {object}: {field}: {message}")]
pub struct ValidationError {
    /// `Pod`, `Namespace`, `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub kind: &'static str,
    /// `namespace/name`, or `name` for a Namespace.
    pub object: String,
    /// JSON path of the offending field, e.g. `spec.ingress[0].ports[1].endPort`.
    pub field: String,
    pub message: String,
}

/// Pod annotation carrying the sandbox (pause) container ID, for the sandbox naming scheme.
pub const SANDBOX_ID_ANNOTATION: &str = "netpol-agent.io/sandbox-id";

const POD_KIND: &str = "Pod";
const NAMESPACE_KIND: &str = "Namespace";
const NETWORK_POLICY_KIND: &str = "NetworkPolicy";

/// kubectl and the API server put namespaced objects without a namespace here.
const DEFAULT_NAMESPACE: &str = "default";

const MAX_PORT: i32 = 65535;
const MAX_LABEL_NAME_LEN: usize = 63;
const MAX_LABEL_VALUE_LEN: usize = 63;
const MAX_DNS_SUBDOMAIN_LEN: usize = 253;
const MAX_DNS_LABEL_LEN: usize = 63;
const MAX_PORT_NAME_LEN: usize = 15;

/// The object being validated, so that every error carries its kind and name.
struct ErrorContext<'a> {
    kind: &'static str,
    object: &'a str,
}

impl ErrorContext<'_> {
    fn error(&self, field: impl Into<String>, message: impl Into<String>) -> ValidationError {
        ValidationError {
            kind: self.kind,
            object: shown_name(self.object).into_owned(),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Validates a Pod. `Ok(None)` means the pod is not a workload the agent enforces on: it uses
/// the host network, has finished (Succeeded/Failed), or has no IP yet.
pub fn pod(pod: &Pod) -> Result<Option<PodInfo>, ValidationError> {
    let key = namespaced_key(&pod.metadata);
    let object = key.to_string();
    let ctx = ErrorContext {
        kind: POD_KIND,
        object: &object,
    };
    check_names(&pod.metadata, &ctx)?;

    let spec = pod.spec.as_ref();
    if spec.and_then(|spec| spec.host_network) == Some(true) {
        return Ok(None);
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|status| status.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Ok(None);
    }
    let ips = pod_ips(status, &ctx)?;
    if ips.is_empty() {
        return Ok(None);
    }

    let labels = validated_labels(pod.metadata.labels.as_ref(), &ctx)?;
    let named_ports = match spec {
        Some(spec) => named_ports(spec, &ctx)?,
        None => Vec::new(),
    };
    let sandbox_id = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(SANDBOX_ID_ANNOTATION))
        .map(String::as_str)
        .and_then(non_empty);

    Ok(Some(PodInfo {
        uid: pod.metadata.uid.as_deref().and_then(non_empty),
        node: spec
            .and_then(|spec| spec.node_name.as_deref())
            .and_then(non_empty),
        labels,
        ips,
        named_ports,
        sandbox_id,
        key,
    }))
}

/// Validates a Namespace. Its labels always include `kubernetes.io/metadata.name=<name>`.
pub fn namespace(ns: &Namespace) -> Result<NamespaceInfo, ValidationError> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let ctx = ErrorContext {
        kind: NAMESPACE_KIND,
        object: &name,
    };
    require_name(&ns.metadata, &ctx)?;
    // The name becomes a label value below, so it has to be a valid one; the API server
    // demands a DNS-1123 label, which is stricter.
    if let Some(problem) = dns1123_label_problem(&name) {
        return Err(ctx.error(
            "metadata.name",
            format!("namespace name {} is invalid: {problem}", shown(&name)),
        ));
    }
    let mut labels = validated_labels(ns.metadata.labels.as_ref(), &ctx)?;
    // The API server sets this label on every namespace and overwrites any other value.
    labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.clone());
    Ok(NamespaceInfo { name, labels })
}

/// Validates a NetworkPolicy and applies the API server's defaulting (policyTypes,
/// protocols).
pub fn network_policy(np: &NetworkPolicy) -> Result<PolicyInfo, ValidationError> {
    let key = namespaced_key(&np.metadata);
    let object = key.to_string();
    let ctx = ErrorContext {
        kind: NETWORK_POLICY_KIND,
        object: &object,
    };
    check_names(&np.metadata, &ctx)?;
    let spec = np.spec.as_ref().ok_or_else(|| {
        ctx.error(
            "spec",
            "spec is required: it holds the podSelector and the rules",
        )
    })?;

    // podSelector is a non-pointer struct in the Go API with omitempty, so the API server
    // stores an absent one as `{}`: every pod of the namespace.
    let pod_selector = match &spec.pod_selector {
        Some(selector) => validated_selector(selector, &ctx, "spec.podSelector")?,
        None => LabelSel::everything(),
    };

    let declared = declared_policy_types(spec.policy_types.as_deref(), &ctx)?;

    // Rules are validated even for a direction the policy does not govern: the API server
    // rejects such a policy too, and accepting it here would hide the mistake.
    let ingress_rules = spec
        .ingress
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, rule)| {
            policy_rule(
                rule.ports.as_deref(),
                rule.from.as_deref(),
                &format!("spec.ingress[{index}]"),
                "from",
                &key.namespace,
                &ctx,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let egress_rules = spec
        .egress
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, rule)| {
            policy_rule(
                rule.ports.as_deref(),
                rule.to.as_deref(),
                &format!("spec.egress[{index}]"),
                "to",
                &key.namespace,
                &ctx,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    let (governs_ingress, governs_egress) = match declared {
        Some(types) => (types.ingress, types.egress),
        // The API server's defaulting: always Ingress, Egress only when egress rules exist.
        None => (true, !egress_rules.is_empty()),
    };

    Ok(PolicyInfo {
        key,
        pod_selector,
        ingress: governs_ingress.then_some(ingress_rules),
        egress: governs_egress.then_some(egress_rules),
    })
}

/// Validates a label selector the way the API server does (keys, values, operators and their
/// value lists) and converts it to its canonical form. `field` is the selector's JSON path.
pub fn label_selector(
    sel: &LabelSelector,
    kind: &'static str,
    object: &str,
    field: &str,
) -> Result<LabelSel, ValidationError> {
    validated_selector(sel, &ErrorContext { kind, object }, field)
}

fn validated_selector(
    sel: &LabelSelector,
    ctx: &ErrorContext<'_>,
    field: &str,
) -> Result<LabelSel, ValidationError> {
    for (key, value) in sel.match_labels.iter().flatten() {
        let labels_field = format!("{field}.matchLabels");
        if let Some(problem) = qualified_name_problem(key) {
            return Err(ctx.error(
                labels_field,
                format!("key {} is invalid: {problem}", shown(key)),
            ));
        }
        if let Some(problem) = label_value_problem(value) {
            return Err(ctx.error(
                labels_field,
                format!(
                    "value {} for key {} is invalid: {problem}",
                    shown(value),
                    shown(key)
                ),
            ));
        }
    }
    for (index, requirement) in sel.match_expressions.iter().flatten().enumerate() {
        check_requirement(
            requirement,
            &format!("{field}.matchExpressions[{index}]"),
            ctx,
        )?;
    }
    let selector = Selector::try_from(sel.clone()).map_err(|err| {
        // Unreachable after the checks above; kept as an error rather than a panic.
        ctx.error(field, format!("invalid label selector: {}", err.0))
    })?;
    Ok(LabelSel::from_selector(selector))
}

fn check_requirement(
    requirement: &LabelSelectorRequirement,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<(), ValidationError> {
    let key = &requirement.key;
    if let Some(problem) = qualified_name_problem(key) {
        return Err(ctx.error(
            format!("{field}.key"),
            format!("key {} is invalid: {problem}", shown(key)),
        ));
    }
    let values = requirement.values.as_deref().unwrap_or_default();
    let operator = requirement.operator.as_str();
    match operator {
        "In" | "NotIn" => {
            if values.is_empty() {
                return Err(ctx.error(
                    format!("{field}.values"),
                    format!("operator {operator} needs a non-empty list of values"),
                ));
            }
            for (index, value) in values.iter().enumerate() {
                if let Some(problem) = label_value_problem(value) {
                    return Err(ctx.error(
                        format!("{field}.values[{index}]"),
                        format!("value {} is invalid: {problem}", shown(value)),
                    ));
                }
            }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                return Err(ctx.error(
                    format!("{field}.values"),
                    format!(
                        "operator {operator} takes no values, but {} were given",
                        values.len()
                    ),
                ));
            }
        }
        other => {
            return Err(ctx.error(
                format!("{field}.operator"),
                format!(
                    "unknown operator {}; accepted operators are In, NotIn, Exists and DoesNotExist",
                    shown(other)
                ),
            ));
        }
    }
    Ok(())
}

struct DeclaredPolicyTypes {
    ingress: bool,
    egress: bool,
}

/// `None` when policyTypes is absent or empty (the API server defaults both the same way).
fn declared_policy_types(
    policy_types: Option<&[String]>,
    ctx: &ErrorContext<'_>,
) -> Result<Option<DeclaredPolicyTypes>, ValidationError> {
    let Some(policy_types) = policy_types.filter(|types| !types.is_empty()) else {
        return Ok(None);
    };
    let mut declared = DeclaredPolicyTypes {
        ingress: false,
        egress: false,
    };
    for (index, policy_type) in policy_types.iter().enumerate() {
        match policy_type.as_str() {
            "Ingress" => declared.ingress = true,
            "Egress" => declared.egress = true,
            other => {
                return Err(ctx.error(
                    format!("spec.policyTypes[{index}]"),
                    format!(
                        "unknown policy type {}; accepted values are Ingress and Egress",
                        shown(other)
                    ),
                ))
            }
        }
    }
    Ok(Some(declared))
}

/// One ingress or egress rule; `peers_name` is `from` or `to`.
fn policy_rule(
    ports: Option<&[NetworkPolicyPort]>,
    peers: Option<&[NetworkPolicyPeer]>,
    rule_field: &str,
    peers_name: &str,
    policy_namespace: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PolicyRule, ValidationError> {
    let ports = ports
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, port)| port_spec(port, &format!("{rule_field}.ports[{index}]"), ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let peers = match peers {
        Some(peers) if !peers.is_empty() => Some(
            peers
                .iter()
                .enumerate()
                .map(|(index, peer)| {
                    validated_peer(
                        peer,
                        &format!("{rule_field}.{peers_name}[{index}]"),
                        policy_namespace,
                        ctx,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        // An absent or empty peer list places no restriction on the peer.
        _ => None,
    };
    Ok(PolicyRule { ports, peers })
}

fn port_spec(
    port: &NetworkPolicyPort,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PortSpec, ValidationError> {
    let protocol = protocol(port.protocol.as_deref(), &format!("{field}.protocol"), ctx)?;
    let port_field = format!("{field}.port");
    let end_port_field = format!("{field}.endPort");
    let port_match = match (&port.port, port.end_port) {
        (None, None) => PortMatch::Any,
        (None, Some(end_port)) => {
            return Err(ctx.error(
                end_port_field,
                format!(
                "endPort {end_port} needs a numeric port to start the range, but port is not set"
            ),
            ))
        }
        (Some(IntOrString::String(name)), end_port) => {
            if let Some(problem) = port_name_problem(name) {
                return Err(ctx.error(
                    port_field,
                    format!("named port {} is invalid: {problem}", shown(name)),
                ));
            }
            if let Some(end_port) = end_port {
                return Err(ctx.error(
                    end_port_field,
                    format!("endPort {end_port} cannot be used with the named port {}; a range needs a numeric port", shown(name)),
                ));
            }
            PortMatch::Named(name.clone())
        }
        (Some(IntOrString::Int(first)), end_port) => {
            let first = port_number(*first, &port_field, ctx)?;
            let last = match end_port {
                None => first,
                Some(end_port) => {
                    if end_port < i32::from(first) || end_port > MAX_PORT {
                        return Err(ctx.error(
                            end_port_field,
                            format!("endPort {end_port} is invalid: it must be between port ({first}) and {MAX_PORT}"),
                        ));
                    }
                    // In range 1..=65535 after the check above.
                    u16::try_from(end_port).unwrap_or(u16::MAX)
                }
            };
            PortMatch::Range { first, last }
        }
    };
    Ok(PortSpec {
        protocol,
        port: port_match,
    })
}

fn validated_peer(
    peer: &NetworkPolicyPeer,
    field: &str,
    policy_namespace: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Peer, ValidationError> {
    match (&peer.ip_block, &peer.pod_selector, &peer.namespace_selector) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(ctx.error(
            field,
            "ipBlock cannot be combined with podSelector or namespaceSelector in the same peer; \
             put them in separate peers",
        )),
        (Some(ip_block), None, None) => {
            validated_ip_block(ip_block, &format!("{field}.ipBlock"), ctx)
        }
        (None, None, None) => Err(ctx.error(
            field,
            "a peer must set at least one of podSelector, namespaceSelector or ipBlock",
        )),
        (None, pod_selector, namespace_selector) => {
            let pods = match pod_selector {
                Some(selector) => {
                    validated_selector(selector, ctx, &format!("{field}.podSelector"))?
                }
                None => LabelSel::everything(),
            };
            let namespaces = match namespace_selector {
                Some(selector) => NamespaceScope::Selector(validated_selector(
                    selector,
                    ctx,
                    &format!("{field}.namespaceSelector"),
                )?),
                None => NamespaceScope::Named(policy_namespace.to_string()),
            };
            Ok(Peer::Pods { namespaces, pods })
        }
    }
}

fn validated_ip_block(
    ip_block: &IPBlock,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Peer, ValidationError> {
    let cidr = parse_cidr(&ip_block.cidr, &format!("{field}.cidr"), ctx)?;
    let mut except = Vec::new();
    for (index, text) in ip_block.except.iter().flatten().enumerate() {
        let except_field = format!("{field}.except[{index}]");
        let excepted = parse_cidr(text, &except_field, ctx)?;
        if IpFamily::of_net(&excepted) != IpFamily::of_net(&cidr) {
            return Err(ctx.error(
                except_field,
                format!(
                    "{} is {} but cidr {cidr} is {}; except entries must be of the cidr's address family",
                    shown(text),
                    family_name(&excepted),
                    family_name(&cidr)
                ),
            ));
        }
        // Like the API server, demand a strict subset: excepting the whole block (or more)
        // is almost certainly a mistake.
        if !cidr.contains(&excepted) || excepted.prefix_len() <= cidr.prefix_len() {
            return Err(ctx.error(
                except_field,
                format!("{} is not inside cidr {cidr}; except entries must be strict subsets of the cidr", shown(text)),
            ));
        }
        except.push(excepted);
    }
    except.sort();
    except.dedup();
    Ok(Peer::IpBlock { cidr, except })
}

/// Parses `address/prefix-length`, accepting host bits (as the API server does) and
/// returning the network.
fn parse_cidr(text: &str, field: &str, ctx: &ErrorContext<'_>) -> Result<IpNet, ValidationError> {
    match text.parse::<IpNet>() {
        Ok(net) => Ok(net.trunc()),
        Err(_) if !text.contains('/') && text.parse::<IpAddr>().is_ok() => Err(ctx.error(
            field,
            format!("{} has no prefix length; write a CIDR such as {text}/{}", shown(text), host_prefix_len(text)),
        )),
        Err(_) => Err(ctx.error(
            field,
            format!("{} is not a valid CIDR; expected address/prefix-length such as 10.0.0.0/16 or fd00::/64", shown(text)),
        )),
    }
}

fn host_prefix_len(address: &str) -> u8 {
    if address.contains(':') {
        128
    } else {
        32
    }
}

fn family_name(net: &IpNet) -> &'static str {
    match IpFamily::of_net(net) {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// Absent means TCP, as the API server defaults it.
fn protocol(
    protocol: Option<&str>,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Protocol, ValidationError> {
    match protocol {
        None => Ok(Protocol::Tcp),
        Some(name) => Protocol::parse(name).ok_or_else(|| {
            ctx.error(
                field,
                format!(
                    "unsupported protocol {}; accepted values are TCP, UDP and SCTP",
                    shown(name)
                ),
            )
        }),
    }
}

fn port_number(number: i32, field: &str, ctx: &ErrorContext<'_>) -> Result<u16, ValidationError> {
    match u16::try_from(number) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(ctx.error(
            field,
            format!("port {number} is out of range; it must be between 1 and {MAX_PORT}"),
        )),
    }
}

/// The `namespace/name` key of a namespaced object (namespace `default` when absent or empty).
pub fn namespaced_key(meta: &ObjectMeta) -> ObjectKey {
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE);
    ObjectKey::new(namespace, meta.name.clone().unwrap_or_default())
}

fn require_name(meta: &ObjectMeta, ctx: &ErrorContext<'_>) -> Result<(), ValidationError> {
    match meta.name.as_deref() {
        Some(name) if !name.is_empty() => Ok(()),
        _ => Err(ctx.error("metadata.name", "name is required")),
    }
}

/// The name and namespace of a Pod or NetworkPolicy, as the API server checks them: the name
/// a DNS-1123 subdomain (`ValidatePodName`, `ValidateNetworkPolicyName`), the namespace a
/// DNS-1123 label (`ValidateNamespaceName`). Manifests skip the API server, and names become
/// chain names, comments and log lines: nothing else may pass.
fn check_names(meta: &ObjectMeta, ctx: &ErrorContext<'_>) -> Result<(), ValidationError> {
    require_name(meta, ctx)?;
    let name = meta.name.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_subdomain_problem(name) {
        return Err(ctx.error(
            "metadata.name",
            format!("name {} is invalid: {problem}", shown(name)),
        ));
    }
    if let Some(namespace) = meta.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        if let Some(problem) = dns1123_label_problem(namespace) {
            return Err(ctx.error(
                "metadata.namespace",
                format!("namespace {} is invalid: {problem}", shown(namespace)),
            ));
        }
    }
    Ok(())
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

fn validated_labels(
    labels: Option<&BTreeMap<String, String>>,
    ctx: &ErrorContext<'_>,
) -> Result<BTreeMap<String, String>, ValidationError> {
    let Some(labels) = labels else {
        return Ok(BTreeMap::new());
    };
    for (key, value) in labels {
        if let Some(problem) = qualified_name_problem(key) {
            return Err(ctx.error(
                "metadata.labels",
                format!("label key {} is invalid: {problem}", shown(key)),
            ));
        }
        if let Some(problem) = label_value_problem(value) {
            return Err(ctx.error(
                "metadata.labels",
                format!(
                    "value {} of label {} is invalid: {problem}",
                    shown(value),
                    shown(key)
                ),
            ));
        }
    }
    Ok(labels.clone())
}

/// Pod IPs from status.podIPs, falling back to the older single status.podIP; duplicates
/// are dropped, keeping the first occurrence (podIPs[0] is the primary IP).
fn pod_ips(
    status: Option<&PodStatus>,
    ctx: &ErrorContext<'_>,
) -> Result<Vec<IpAddr>, ValidationError> {
    let Some(status) = status else {
        return Ok(Vec::new());
    };
    let mut ips = Vec::new();
    match status.pod_ips.as_deref() {
        Some(pod_ips) if !pod_ips.is_empty() => {
            for (index, pod_ip) in pod_ips.iter().enumerate() {
                let ip = parse_ip(&pod_ip.ip, &format!("status.podIPs[{index}].ip"), ctx)?;
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        _ => {
            if let Some(pod_ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) {
                ips.push(parse_ip(pod_ip, "status.podIP", ctx)?);
            }
        }
    }
    Ok(ips)
}

fn parse_ip(text: &str, field: &str, ctx: &ErrorContext<'_>) -> Result<IpAddr, ValidationError> {
    text.parse::<IpAddr>().map_err(|_| {
        ctx.error(
            field,
            format!("{} is not a valid IPv4 or IPv6 address", shown(text)),
        )
    })
}

/// Named container ports of containers and then init containers (sidecars among them can
/// serve traffic), in declaration order, exact duplicates dropped. Unnamed ports cannot be
/// the target of a policy and are not looked at.
fn named_ports(spec: &PodSpec, ctx: &ErrorContext<'_>) -> Result<Vec<NamedPort>, ValidationError> {
    let containers = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, container)| (format!("spec.containers[{index}]"), container))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .enumerate()
                .map(|(index, container)| (format!("spec.initContainers[{index}]"), container)),
        );
    let mut named_ports = Vec::new();
    for (container_field, container) in containers {
        for (index, port) in container.ports.iter().flatten().enumerate() {
            let Some(name) = port.name.as_deref().filter(|name| !name.is_empty()) else {
                continue;
            };
            let field = format!("{container_field}.ports[{index}]");
            if let Some(problem) = port_name_problem(name) {
                return Err(ctx.error(
                    format!("{field}.name"),
                    format!("port name {} is invalid: {problem}", shown(name)),
                ));
            }
            let protocol = protocol(port.protocol.as_deref(), &format!("{field}.protocol"), ctx)?;
            let number = port_number(port.container_port, &format!("{field}.containerPort"), ctx)?;
            let named_port = NamedPort {
                name: name.to_string(),
                protocol,
                port: number,
            };
            if !named_ports.contains(&named_port) {
                named_ports.push(named_port);
            }
        }
    }
    Ok(named_ports)
}

// The checks below are hand-written equivalents of apimachinery's IsQualifiedName,
// IsValidLabelValue, IsDNS1123Subdomain, IsDNS1123Label and IsValidPortName. The grammars
// are small enough that a regex crate would cost more than it saves. Each returns a
// description of the problem, or None when the text is valid.

/// `[prefix/]name`: an optional DNS-subdomain prefix and a name of at most 63 characters.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("the prefix before '/' must not be empty".to_string());
        }
        if let Some(problem) = dns1123_subdomain_problem(prefix) {
            return Some(format!("prefix {}: {problem}", shown(prefix)));
        }
    }
    if name.is_empty() {
        return Some("the name must not be empty".to_string());
    }
    if name.contains('/') {
        return Some("a key may contain at most one '/'".to_string());
    }
    if name.len() > MAX_LABEL_NAME_LEN {
        return Some(format!(
            "the name part must be at most {MAX_LABEL_NAME_LEN} characters (it has {})",
            name.len()
        ));
    }
    if !is_label_token(name) {
        return Some(LABEL_TOKEN_RULE.to_string());
    }
    None
}

/// Empty, or at most 63 characters of the label-token grammar.
fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > MAX_LABEL_VALUE_LEN {
        return Some(format!(
            "it must be at most {MAX_LABEL_VALUE_LEN} characters (it has {})",
            value.len()
        ));
    }
    if !is_label_token(value) {
        return Some(LABEL_TOKEN_RULE.to_string());
    }
    None
}

const LABEL_TOKEN_RULE: &str =
    "it must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_label_token(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Lowercase RFC 1123 labels joined by dots, at most 253 characters.
fn dns1123_subdomain_problem(text: &str) -> Option<String> {
    if text.len() > MAX_DNS_SUBDOMAIN_LEN {
        return Some(format!(
            "it must be at most {MAX_DNS_SUBDOMAIN_LEN} characters (it has {})",
            text.len()
        ));
    }
    if !text.split('.').all(is_dns1123_label) {
        return Some(
            "it must be a lowercase DNS subdomain: labels of a-z, 0-9 and '-' separated by '.', \
             each starting and ending with a letter or digit (e.g. example.com)"
                .to_string(),
        );
    }
    None
}

fn dns1123_label_problem(text: &str) -> Option<String> {
    if text.len() > MAX_DNS_LABEL_LEN {
        return Some(format!(
            "it must be at most {MAX_DNS_LABEL_LEN} characters (it has {})",
            text.len()
        ));
    }
    if !is_dns1123_label(text) {
        return Some(
            "it must consist of a-z, 0-9 and '-', and start and end with a letter or digit"
                .to_string(),
        );
    }
    None
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (length checked by the callers).
fn is_dns1123_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    let is_alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            is_alnum(first) && is_alnum(last) && bytes.iter().all(|b| is_alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// IANA_SVC_NAME (RFC 6335): 1-15 of a-z, 0-9 and '-', at least one letter, no leading,
/// trailing or doubled '-'.
fn port_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_PORT_NAME_LEN {
        return Some(format!(
            "it must be 1 to {MAX_PORT_NAME_LEN} characters long (it has {})",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("it may contain only lowercase letters a-z, digits and '-'".to_string());
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        return Some(
            "it must contain at least one letter (a numeric port must be written as a number, \
             not a string)"
                .to_string(),
        );
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("it must not start or end with '-'".to_string());
    }
    if name.contains("--") {
        return Some("it must not contain \"--\"".to_string());
    }
    None
}

/// A name as it appears in messages and logs: as it is when it is plain (printable ASCII
/// without spaces or quotes, and not long), else quoted, escaped and shortened by [`shown`].
/// Object keys are built before validation, so a rejected object's key may hold anything.
pub fn shown_name(name: &str) -> std::borrow::Cow<'_, str> {
    const PLAIN_MAX: usize = MAX_DNS_SUBDOMAIN_LEN + 1 + MAX_DNS_LABEL_LEN;
    let plain = !name.is_empty()
        && name.len() <= PLAIN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''));
    if plain {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(shown(name))
    }
}

/// A value quoted for a message (control characters escaped), shortened when long so that
/// the message stays readable and one hostile value cannot fill the log.
pub fn shown(value: &str) -> String {
    const SHOWN_CHARS: usize = 40;
    let char_count = value.chars().count();
    if char_count <= SHOWN_CHARS {
        format!("{value:?}")
    } else {
        let start: String = value.chars().take(SHOWN_CHARS).collect();
        format!("{start:?}... ({char_count} characters)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Expression;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;

    fn policy(spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "np", "namespace": "prod"},
            "spec": spec,
        }))
        .expect("test policy deserializes")
    }

    fn valid_policy(spec: Value) -> PolicyInfo {
        network_policy(&policy(spec)).expect("policy is valid")
    }

    fn policy_error(spec: Value) -> ValidationError {
        match network_policy(&policy(spec)) {
            Err(err) => err,
            Ok(info) => panic!("expected a validation error, got {info:?}"),
        }
    }

    /// The port under test is the second of the first ingress rule.
    fn port_error(port: Value) -> ValidationError {
        policy_error(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}, port]}]}))
    }

    /// The peer under test is the second of the first egress rule.
    fn peer_error(peer: Value) -> ValidationError {
        policy_error(json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}, peer]}]}))
    }

    fn ingress_peers(peers: Value) -> Option<Vec<Peer>> {
        let info = valid_policy(json!({"podSelector": {}, "ingress": [{"from": peers}]}));
        info.ingress.expect("ingress governed")[0].peers.clone()
    }

    fn ingress_ports(ports: Value) -> Vec<PortSpec> {
        let info = valid_policy(json!({"podSelector": {}, "ingress": [{"ports": ports}]}));
        info.ingress.expect("ingress governed")[0].ports.clone()
    }

    fn ip_block(cidr: &str, except: &[&str]) -> Peer {
        Peer::IpBlock {
            cidr: cidr.parse().expect("test cidr"),
            except: except
                .iter()
                .map(|e| e.parse().expect("test except"))
                .collect(),
        }
    }

    fn selector(value: Value) -> LabelSel {
        let sel: LabelSelector = serde_json::from_value(value).expect("test selector");
        label_selector(&sel, "NetworkPolicy", "prod/np", "spec.podSelector")
            .expect("valid selector")
    }

    fn selector_error(value: Value) -> ValidationError {
        policy_error(json!({"podSelector": value}))
    }

    fn set(values: &[&str]) -> BTreeSet<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    fn base_pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "uid-1", "labels": {"app": "web"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "nginx"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]},
        })
    }

    fn pod_result(value: Value) -> Result<Option<PodInfo>, ValidationError> {
        pod(&serde_json::from_value(value).expect("test pod deserializes"))
    }

    fn workload(value: Value) -> PodInfo {
        pod_result(value)
            .expect("pod is valid")
            .expect("pod is a workload")
    }

    fn pod_error(value: Value) -> ValidationError {
        match pod_result(value) {
            Err(err) => err,
            Ok(info) => panic!("expected a validation error, got {info:?}"),
        }
    }

    fn namespace_result(value: Value) -> Result<NamespaceInfo, ValidationError> {
        namespace(&serde_json::from_value(value).expect("test namespace deserializes"))
    }

    // ---- ipBlock ----

    #[test]
    fn invalid_cidr_is_rejected_naming_field_and_value() {
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.300/24"}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.cidr");
        assert!(err.message.contains("10.0.0.300/24"), "{}", err.message);
        assert_eq!(err.kind, "NetworkPolicy");
        assert_eq!(err.object, "prod/np");
    }

    #[test]
    fn bare_address_without_prefix_length_is_rejected() {
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.1"}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.cidr");
        assert!(err.message.contains("10.0.0.1/32"), "{}", err.message);
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::1"]}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[0]");
        assert!(err.message.contains("fd00::1/128"), "{}", err.message);
    }

    #[test]
    fn ip_block_host_bits_are_truncated_and_except_canonicalised() {
        let peers = ingress_peers(json!([{"ipBlock": {
            "cidr": "10.1.2.3/16",
            "except": ["10.1.9.9/24", "10.1.2.0/24", "10.1.9.0/24"],
        }}]));
        assert_eq!(
            peers,
            Some(vec![ip_block(
                "10.1.0.0/16",
                &["10.1.2.0/24", "10.1.9.0/24"]
            )])
        );
        let peers = ingress_peers(json!([{"ipBlock": {"cidr": "fd00::1/64"}}]));
        assert_eq!(peers, Some(vec![ip_block("fd00::/64", &[])]));
    }

    #[test]
    fn except_outside_cidr_is_rejected() {
        let err = peer_error(
            json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.1.0.0/24"]}}),
        );
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[1]");
        assert!(err.message.contains("10.1.0.0/24"), "{}", err.message);
        assert!(err.message.contains("10.0.0.0/16"), "{}", err.message);
    }

    #[test]
    fn except_equal_to_or_wider_than_cidr_is_rejected() {
        let err =
            peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16"]}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[0]");
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/8"]}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[0]");
    }

    #[test]
    fn except_of_the_other_family_is_rejected() {
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64"]}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[0]");
        assert!(err.message.contains("IPv6"), "{}", err.message);
        assert!(err.message.contains("IPv4"), "{}", err.message);
    }

    #[test]
    fn invalid_except_is_rejected() {
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["bogus"]}}));
        assert_eq!(err.field, "spec.egress[0].to[1].ipBlock.except[0]");
        assert!(err.message.contains("bogus"), "{}", err.message);
    }

    // ---- ports ----

    #[test]
    fn port_zero_is_rejected() {
        let err = port_error(json!({"port": 0}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].port");
        assert!(err.message.contains("65535"), "{}", err.message);
    }

    #[test]
    fn port_65536_is_rejected() {
        let err = port_error(json!({"port": 65536}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].port");
        assert!(err.message.contains("65536"), "{}", err.message);
    }

    #[test]
    fn end_port_below_port_is_rejected() {
        let err = port_error(json!({"port": 8080, "endPort": 8000}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].endPort");
        assert!(err.message.contains("8000"), "{}", err.message);
    }

    #[test]
    fn end_port_above_65535_is_rejected() {
        let err = port_error(json!({"port": 8080, "endPort": 70000}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].endPort");
    }

    #[test]
    fn end_port_with_named_port_is_rejected() {
        let err = port_error(json!({"port": "http", "endPort": 90}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].endPort");
        assert!(err.message.contains("http"), "{}", err.message);
    }

    #[test]
    fn end_port_without_port_is_rejected() {
        let err = port_error(json!({"protocol": "UDP", "endPort": 90}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].endPort");
    }

    #[test]
    fn unknown_protocol_is_rejected() {
        let err = port_error(json!({"protocol": "ICMP", "port": 1}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].protocol");
        assert!(err.message.contains("ICMP"), "{}", err.message);
        assert!(err.message.contains("SCTP"), "{}", err.message);
    }

    #[test]
    fn numeric_string_port_is_an_invalid_name() {
        let err = port_error(json!({"port": "80"}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].port");
        assert!(err.message.contains("\"80\""), "{}", err.message);
        assert!(err.message.contains("letter"), "{}", err.message);
    }

    #[test]
    fn malformed_port_name_is_rejected() {
        let err = port_error(json!({"port": "Foo_Bar"}));
        assert_eq!(err.field, "spec.ingress[0].ports[1].port");
        assert!(err.message.contains("Foo_Bar"), "{}", err.message);
        for bad in ["-http", "http-", "ht--tp", "averyveryverylongname", ""] {
            let err = port_error(json!({"port": bad}));
            assert_eq!(err.field, "spec.ingress[0].ports[1].port", "{bad:?}");
        }
    }

    #[test]
    fn ports_are_defaulted_and_kept_in_order() {
        let ports = ingress_ports(json!([
            {"port": 443},
            {"protocol": "UDP"},
            {"protocol": "SCTP", "port": "diameter"},
            {"port": 8000, "endPort": 8080},
            {"port": 53, "protocol": "UDP"},
        ]));
        assert_eq!(
            ports,
            vec![
                PortSpec {
                    protocol: Protocol::Tcp,
                    port: PortMatch::Range {
                        first: 443,
                        last: 443
                    }
                },
                PortSpec {
                    protocol: Protocol::Udp,
                    port: PortMatch::Any
                },
                PortSpec {
                    protocol: Protocol::Sctp,
                    port: PortMatch::Named("diameter".into())
                },
                PortSpec {
                    protocol: Protocol::Tcp,
                    port: PortMatch::Range {
                        first: 8000,
                        last: 8080
                    }
                },
                PortSpec {
                    protocol: Protocol::Udp,
                    port: PortMatch::Range {
                        first: 53,
                        last: 53
                    }
                },
            ]
        );
    }

    // ---- selectors ----

    #[test]
    fn unknown_operator_is_rejected() {
        let err = selector_error(json!({"matchExpressions": [
            {"key": "app", "operator": "Exists"},
            {"key": "app", "operator": "Contains", "values": ["web"]},
        ]}));
        assert_eq!(err.field, "spec.podSelector.matchExpressions[1].operator");
        assert!(err.message.contains("Contains"), "{}", err.message);
    }

    #[test]
    fn in_without_values_is_rejected() {
        let err = selector_error(json!({"matchExpressions": [{"key": "app", "operator": "In"}]}));
        assert_eq!(err.field, "spec.podSelector.matchExpressions[0].values");
        let err = selector_error(
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": []}]}),
        );
        assert_eq!(err.field, "spec.podSelector.matchExpressions[0].values");
        assert!(err.message.contains("NotIn"), "{}", err.message);
    }

    #[test]
    fn exists_with_values_is_rejected() {
        let err = selector_error(
            json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["web"]}]}),
        );
        assert_eq!(err.field, "spec.podSelector.matchExpressions[0].values");
        assert!(err.message.contains("Exists"), "{}", err.message);
    }

    #[test]
    fn selector_keys_and_values_are_validated() {
        let err = selector_error(json!({"matchLabels": {"bad key": "x"}}));
        assert_eq!(err.field, "spec.podSelector.matchLabels");
        assert!(err.message.contains("bad key"), "{}", err.message);
        let err = selector_error(json!({"matchLabels": {"app": "no spaces"}}));
        assert_eq!(err.field, "spec.podSelector.matchLabels");
        let err =
            selector_error(json!({"matchExpressions": [{"key": "-app", "operator": "Exists"}]}));
        assert_eq!(err.field, "spec.podSelector.matchExpressions[0].key");
        let err = selector_error(
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["ok", "not ok"]}]}),
        );
        assert_eq!(err.field, "spec.podSelector.matchExpressions[0].values[1]");
    }

    #[test]
    fn selector_errors_in_peers_name_the_peer_field() {
        let err = policy_error(json!({"podSelector": {}, "ingress": [{"from": [
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Like"}]}},
        ]}]}));
        assert_eq!(
            err.field,
            "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].operator"
        );
    }

    #[test]
    fn match_labels_and_single_value_in_are_canonicalised_alike() {
        let a = selector(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}],
        }));
        let b = selector(json!({
            "matchLabels": {"tier": "front"},
            "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}],
        }));
        assert_eq!(a, b);
        assert_eq!(
            a.exprs(),
            &[
                Expression::Equal("app".into(), "web".into()),
                Expression::Equal("tier".into(), "front".into()),
            ]
        );
        let multi = selector(json!({"matchExpressions": [
            {"key": "env", "operator": "NotIn", "values": ["dev", "test"]},
            {"key": "app", "operator": "In", "values": ["b", "a", "b"]},
            {"key": "gone", "operator": "DoesNotExist"},
        ]}));
        assert_eq!(
            multi.exprs(),
            &[
                Expression::In("app".into(), set(&["a", "b"])),
                Expression::NotIn("env".into(), set(&["dev", "test"])),
                Expression::DoesNotExist("gone".into()),
            ]
        );
    }

    #[test]
    fn empty_selector_selects_everything() {
        let info = valid_policy(json!({"podSelector": {}}));
        assert!(info.pod_selector.is_everything());
        let info = valid_policy(json!({"policyTypes": ["Ingress"]}));
        assert!(info.pod_selector.is_everything());
        let info = valid_policy(json!({"podSelector": {"matchLabels": {"app": "web"}}}));
        assert!(!info.pod_selector.is_everything());
    }

    #[test]
    fn label_selector_helper_reports_the_given_context() {
        let sel: LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}))
                .expect("test selector");
        let err = label_selector(&sel, "Pod", "ns/p", "spec.selector").expect_err("invalid");
        assert_eq!(
            err,
            ValidationError {
                kind: "Pod",
                object: "ns/p".into(),
                field: "spec.selector.matchExpressions[0].operator".into(),
                message: err.message.clone(),
            }
        );
    }

    #[test]
    fn qualified_names_follow_the_api_rules() {
        for good in ["app", "example.com/app", "a.b-c_d", "k8s.io/x", "A9"] {
            assert_eq!(qualified_name_problem(good), None, "{good:?}");
        }
        let long_name = "a".repeat(64);
        let long_prefix = format!("{}/app", "a".repeat(254));
        for bad in [
            "",
            "/app",
            "Example.com/app",
            "example.com/",
            "a/b/c",
            "-app",
            "app_",
            "ap p",
            long_name.as_str(),
            long_prefix.as_str(),
        ] {
            assert!(qualified_name_problem(bad).is_some(), "{bad:?}");
        }
        assert_eq!(label_value_problem(""), None);
        assert!(label_value_problem(&"v".repeat(64)).is_some());
        assert_eq!(label_value_problem(&"v".repeat(63)), None);
    }

    // ---- peers ----

    #[test]
    fn ip_block_with_pod_selector_in_one_peer_is_rejected() {
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}));
        assert_eq!(err.field, "spec.egress[0].to[1]");
        assert!(err.message.contains("ipBlock"), "{}", err.message);
        let err = peer_error(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}));
        assert_eq!(err.field, "spec.egress[0].to[1]");
    }

    #[test]
    fn empty_peer_is_rejected() {
        let err = peer_error(json!({}));
        assert_eq!(err.field, "spec.egress[0].to[1]");
        assert!(err.message.contains("podSelector"), "{}", err.message);
    }

    #[test]
    fn peers_in_one_entry_are_and_separate_entries_are_or() {
        let pods = selector(json!({"matchLabels": {"app": "db"}}));
        let namespaces = selector(json!({"matchLabels": {"team": "a"}}));
        let and = ingress_peers(json!([
            {"podSelector": {"matchLabels": {"app": "db"}}, "namespaceSelector": {"matchLabels": {"team": "a"}}},
        ]));
        assert_eq!(
            and,
            Some(vec![Peer::Pods {
                namespaces: NamespaceScope::Selector(namespaces.clone()),
                pods: pods.clone(),
            }])
        );
        let or = ingress_peers(json!([
            {"podSelector": {"matchLabels": {"app": "db"}}},
            {"namespaceSelector": {"matchLabels": {"team": "a"}}},
        ]));
        assert_eq!(
            or,
            Some(vec![
                Peer::Pods {
                    namespaces: NamespaceScope::Named("prod".into()),
                    pods
                },
                Peer::Pods {
                    namespaces: NamespaceScope::Selector(namespaces),
                    pods: LabelSel::everything(),
                },
            ])
        );
    }

    #[test]
    fn peer_order_is_kept() {
        let peers = ingress_peers(json!([
            {"ipBlock": {"cidr": "192.168.0.0/16"}},
            {"namespaceSelector": {}},
            {"ipBlock": {"cidr": "10.0.0.0/8"}},
        ]));
        assert_eq!(
            peers,
            Some(vec![
                ip_block("192.168.0.0/16", &[]),
                Peer::Pods {
                    namespaces: NamespaceScope::Selector(LabelSel::everything()),
                    pods: LabelSel::everything(),
                },
                ip_block("10.0.0.0/8", &[]),
            ])
        );
    }

    #[test]
    fn absent_or_empty_peer_list_means_any_peer() {
        assert_eq!(ingress_peers(json!([])), None);
        let info = valid_policy(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}));
        assert_eq!(info.ingress.expect("ingress governed")[0].peers, None);
    }

    // ---- policyTypes ----

    #[test]
    fn absent_policy_types_with_egress_rules_govern_both() {
        let info =
            valid_policy(json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}]}));
        assert_eq!(info.ingress, Some(vec![]));
        assert_eq!(info.egress.map(|rules| rules.len()), Some(1));
    }

    #[test]
    fn absent_policy_types_with_empty_egress_govern_ingress_only() {
        let info = valid_policy(json!({"podSelector": {}, "egress": []}));
        assert_eq!(info.ingress, Some(vec![]));
        assert_eq!(info.egress, None);
        let info = valid_policy(json!({"podSelector": {}, "policyTypes": []}));
        assert_eq!((info.ingress, info.egress), (Some(vec![]), None));
    }

    #[test]
    fn explicit_egress_type_drops_given_ingress_rules() {
        let info = valid_policy(json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
        }));
        assert_eq!(info.ingress, None);
        assert_eq!(info.egress, Some(vec![]));
    }

    #[test]
    fn explicit_types_govern_both_even_without_rules() {
        let info = valid_policy(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
        assert_eq!((info.ingress, info.egress), (Some(vec![]), Some(vec![])));
    }

    #[test]
    fn unknown_policy_type_is_rejected() {
        let err = policy_error(json!({"podSelector": {}, "policyTypes": ["Ingress", "egress"]}));
        assert_eq!(err.field, "spec.policyTypes[1]");
        assert!(err.message.contains("egress"), "{}", err.message);
    }

    #[test]
    fn rules_of_an_ungoverned_direction_are_still_validated() {
        let err = policy_error(json!({
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "egress": [{"ports": [{"port": 0}]}],
        }));
        assert_eq!(err.field, "spec.egress[0].ports[0].port");
    }

    #[test]
    fn rule_order_is_kept() {
        let info = valid_policy(json!({"podSelector": {}, "ingress": [
            {"ports": [{"port": 2}]},
            {"ports": [{"port": 1}]},
        ]}));
        let firsts: Vec<_> = info
            .ingress
            .expect("ingress governed")
            .iter()
            .map(|rule| rule.ports[0].port.clone())
            .collect();
        assert_eq!(
            firsts,
            vec![
                PortMatch::Range { first: 2, last: 2 },
                PortMatch::Range { first: 1, last: 1 }
            ]
        );
    }

    // ---- policy metadata ----

    #[test]
    fn policy_without_spec_or_name_is_rejected() {
        let mut np = policy(json!({}));
        np.spec = None;
        let err = network_policy(&np).expect_err("no spec");
        assert_eq!(err.field, "spec");
        np.metadata.name = None;
        let err = network_policy(&np).expect_err("no name");
        assert_eq!(err.field, "metadata.name");
    }

    #[test]
    fn policy_namespace_defaults_to_default() {
        let mut np =
            policy(json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}));
        np.metadata.namespace = None;
        let info = network_policy(&np).expect("valid");
        assert_eq!(info.key, ObjectKey::new("default", "np"));
        let peers = info.ingress.expect("ingress governed")[0].peers.clone();
        assert_eq!(
            peers,
            Some(vec![Peer::Pods {
                namespaces: NamespaceScope::Named("default".into()),
                pods: LabelSel::everything(),
            }])
        );
    }

    #[test]
    fn error_display_names_kind_object_and_field() {
        let err = port_error(json!({"port": 0}));
        assert!(
            err.to_string()
                .starts_with("NetworkPolicy prod/np: spec.ingress[0].ports[1].port: "),
            "{err}"
        );
    }

    // ---- pods ----

    #[test]
    fn running_pod_is_a_workload() {
        let mut value = base_pod();
        value["metadata"]["annotations"] = json!({SANDBOX_ID_ANNOTATION: "abc123"});
        let info = workload(value);
        assert_eq!(info.key, ObjectKey::new("prod", "web-1"));
        assert_eq!(info.uid.as_deref(), Some("uid-1"));
        assert_eq!(info.node.as_deref(), Some("node-a"));
        assert_eq!(info.sandbox_id.as_deref(), Some("abc123"));
        assert_eq!(
            info.labels,
            BTreeMap::from([("app".to_string(), "web".to_string())])
        );
        assert_eq!(info.ips, vec!["10.0.0.5".parse::<IpAddr>().expect("ip")]);
        assert!(info.named_ports.is_empty());
    }

    #[test]
    fn host_network_pod_is_not_a_workload() {
        let mut value = base_pod();
        value["spec"]["hostNetwork"] = json!(true);
        assert_eq!(pod_result(value), Ok(None));
    }

    #[test]
    fn finished_pods_are_not_workloads() {
        for phase in ["Succeeded", "Failed"] {
            let mut value = base_pod();
            value["status"]["phase"] = json!(phase);
            assert_eq!(pod_result(value), Ok(None), "{phase}");
        }
        let mut pending = base_pod();
        pending["status"]["phase"] = json!("Pending");
        assert!(pod_result(pending).expect("valid").is_some());
    }

    #[test]
    fn pod_without_ip_is_not_a_workload() {
        let mut value = base_pod();
        value["status"] = json!({"phase": "Pending"});
        assert_eq!(pod_result(value), Ok(None));
        let mut value = base_pod();
        value["status"] = json!({"phase": "Running", "podIP": "", "podIPs": []});
        assert_eq!(pod_result(value), Ok(None));
        let mut value = base_pod();
        value.as_object_mut().expect("object").remove("status");
        assert_eq!(pod_result(value), Ok(None));
    }

    #[test]
    fn pod_ips_keep_order_drop_duplicates_and_accept_ipv6() {
        let mut value = base_pod();
        value["status"]["podIPs"] =
            json!([{"ip": "fd00::5"}, {"ip": "10.0.0.5"}, {"ip": "fd00:0::5"}]);
        let ips = workload(value).ips;
        let expected: Vec<IpAddr> = vec![
            "fd00::5".parse().expect("ip"),
            "10.0.0.5".parse().expect("ip"),
        ];
        assert_eq!(ips, expected);
    }

    #[test]
    fn pod_ip_is_the_fallback_for_missing_pod_ips() {
        let mut value = base_pod();
        value["status"] = json!({"phase": "Running", "podIP": "fd00::7"});
        assert_eq!(
            workload(value).ips,
            vec!["fd00::7".parse::<IpAddr>().expect("ip")]
        );
    }

    #[test]
    fn invalid_pod_ip_is_rejected() {
        let mut value = base_pod();
        value["status"]["podIPs"] = json!([{"ip": "10.0.0.5"}, {"ip": "10.0.0.999"}]);
        let err = pod_error(value);
        assert_eq!(err.field, "status.podIPs[1].ip");
        assert!(err.message.contains("10.0.0.999"), "{}", err.message);
        let mut value = base_pod();
        value["status"] = json!({"podIP": "nope"});
        assert_eq!(pod_error(value).field, "status.podIP");
    }

    #[test]
    fn named_ports_come_from_containers_and_init_containers() {
        let mut value = base_pod();
        value["spec"]["containers"] = json!([{"name": "main", "ports": [
            {"containerPort": 8080, "name": "http"},
            {"containerPort": 9000},
            {"containerPort": 53, "name": "dns", "protocol": "UDP"},
        ]}]);
        value["spec"]["initContainers"] = json!([{"name": "sidecar", "restartPolicy": "Always", "ports": [
            {"containerPort": 15090, "name": "metrics"},
            {"containerPort": 8080, "name": "http"},
        ]}]);
        let named = workload(value).named_ports;
        let port = |name: &str, protocol, port| NamedPort {
            name: name.into(),
            protocol,
            port,
        };
        assert_eq!(
            named,
            vec![
                port("http", Protocol::Tcp, 8080),
                port("dns", Protocol::Udp, 53),
                port("metrics", Protocol::Tcp, 15090),
            ]
        );
    }

    #[test]
    fn invalid_container_ports_are_rejected() {
        let mut value = base_pod();
        value["spec"]["initContainers"] =
            json!([{"name": "init", "ports": [{"containerPort": 80, "name": "Web_Port"}]}]);
        assert_eq!(
            pod_error(value).field,
            "spec.initContainers[0].ports[0].name"
        );

        let mut value = base_pod();
        value["spec"]["containers"] = json!([{"name": "main", "ports": [
            {"containerPort": 80, "name": "http"},
            {"containerPort": 0, "name": "zero"},
        ]}]);
        assert_eq!(
            pod_error(value).field,
            "spec.containers[0].ports[1].containerPort"
        );

        let mut value = base_pod();
        value["spec"]["containers"] = json!([{"name": "main", "ports": [{"containerPort": 80, "name": "http", "protocol": "ICMP"}]}]);
        assert_eq!(
            pod_error(value).field,
            "spec.containers[0].ports[0].protocol"
        );
    }

    #[test]
    fn overlong_label_value_on_pod_is_rejected() {
        let mut value = base_pod();
        value["metadata"]["labels"]["owner"] = json!("x".repeat(300));
        let err = pod_error(value);
        assert_eq!(err.field, "metadata.labels");
        assert!(err.message.contains("\"owner\""), "{}", err.message);
        assert!(err.message.contains("300"), "{}", err.message);
        assert!(err.message.contains("63"), "{}", err.message);
        assert!(
            err.message.len() < 200,
            "value is abbreviated: {}",
            err.message
        );
    }

    #[test]
    fn bad_label_key_on_pod_is_rejected() {
        let mut value = base_pod();
        value["metadata"]["labels"]["Bad.Prefix/app"] = json!("x");
        let err = pod_error(value);
        assert_eq!(err.field, "metadata.labels");
        assert!(err.message.contains("Bad.Prefix/app"), "{}", err.message);
    }

    #[test]
    fn pod_without_name_is_rejected_and_namespace_defaults() {
        let mut value = base_pod();
        value["metadata"]["name"] = json!("");
        assert_eq!(pod_error(value).field, "metadata.name");
        let mut value = base_pod();
        value["metadata"]
            .as_object_mut()
            .expect("object")
            .remove("namespace");
        assert_eq!(workload(value).key, ObjectKey::new("default", "web-1"));
    }

    // ---- namespaces ----

    #[test]
    fn namespace_gets_its_name_label() {
        let info = namespace_result(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "prod", "labels": {"team": "a", NAMESPACE_NAME_LABEL: "spoofed"}},
        }))
        .expect("valid");
        assert_eq!(info.name, "prod");
        assert_eq!(
            info.labels,
            BTreeMap::from([
                (NAMESPACE_NAME_LABEL.to_string(), "prod".to_string()),
                ("team".to_string(), "a".to_string()),
            ])
        );
        let bare = namespace_result(json!({"metadata": {"name": "dev"}})).expect("valid");
        assert_eq!(bare, NamespaceInfo::implicit("dev"));
    }

    #[test]
    fn invalid_namespaces_are_rejected() {
        let err = namespace_result(json!({"metadata": {"name": "prod", "labels": {"a b": "c"}}}))
            .expect_err("bad key");
        assert_eq!(
            (err.kind, err.object.as_str(), err.field.as_str()),
            ("Namespace", "prod", "metadata.labels")
        );
        let err = namespace_result(json!({"metadata": {}})).expect_err("no name");
        assert_eq!(err.field, "metadata.name");
        let err = namespace_result(json!({"metadata": {"name": "Prod"}})).expect_err("bad name");
        assert_eq!(err.field, "metadata.name");
    }

    proptest::proptest! {
        #[test]
        fn name_checks_never_panic_and_bound_lengths(text in "\\PC{0,300}") {
            if qualified_name_problem(&text).is_none() {
                proptest::prop_assert!(text.len() <= MAX_DNS_SUBDOMAIN_LEN + 1 + MAX_LABEL_NAME_LEN);
            }
            if label_value_problem(&text).is_none() {
                proptest::prop_assert!(text.len() <= MAX_LABEL_VALUE_LEN);
            }
            if port_name_problem(&text).is_none() {
                proptest::prop_assert!(!text.is_empty() && text.len() <= MAX_PORT_NAME_LEN);
            }
            let _ = shown(&text);
        }
    }
}
