//! Validation at the edge of the calc graph: turns `k8s-openapi` Pods (`pod`), Namespaces
//! (`namespace`), NetworkPolicies (`network_policy`) and ClusterNetworkPolicies (`cluster`)
//! into the trusted model types, one file per kind; the rules for names and labels every kind
//! shares are in `names`, label selectors and the error type here. It applies
//! the API server's validation and defaulting rules that matter for enforcement. An
//! object that fails is rejected as a whole with a [`ValidationError`] naming the offending
//! field. Staged objects (`staged`) are validated as the objects they would become.

mod cluster;
mod names;
mod namespace;
mod network_policy;
mod pod;
mod staged;

pub use cluster::cluster_network_policy;
pub use names::{namespaced_key, qualified_name_problem, shown, shown_name};
pub use namespace::namespace;
pub use network_policy::network_policy;
pub use pod::pod;
pub use staged::{staged_cluster_network_policy, staged_network_policy};

use names::*;
use network_policy::*;

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

// The checks below are hand-written equivalents of apimachinery's IsQualifiedName,
// IsValidLabelValue, IsDNS1123Subdomain, IsDNS1123Label and IsValidPortName. The grammars
// are small enough that a regex crate would cost more than it saves. Each returns a
// description of the problem, or None when the text is valid.

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
