//! ClusterNetworkPolicy documents in scenarios (`policy.networking.k8s.io/v1alpha2`): the
//! shape check `netpol-e2e check` runs on every one before anything is built.
//!
//! The runner only writes these documents where the agents read manifests; it never evaluates
//! them, so this module knows the API's *shape* and nothing of its meaning. It refuses what
//! the CRD's structural schema refuses and a scenario author most likely got wrong: a
//! missing required field, an unknown field (a typo such as `namespace:` for `namespaces:`),
//! a value outside an enum, a one-of with zero or two members, an empty `from`/`to`, a
//! namespace on a cluster-scoped object. Numeric limits (priority range, rule and peer counts,
//! CIDR syntax, port ranges) are the agent's validation to enforce and test, not the
//! harness's, so a scenario can feed the agent a policy it must reject.
//!
//! The types are hand-written rather than taken from a crate: no maintained Rust crate ships
//! the v1alpha2 types, and the agent's own model must not be needed to check a scenario.

use anyhow::{anyhow, bail, ensure};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::Deserialize;

pub const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub const KIND: &str = "ClusterNetworkPolicy";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: ObjectMeta,
    spec: Spec,
    // Written by implementations, never read by them; allowed so a `kubectl get -o yaml`
    // copy can be pasted into a scenario.
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<serde_yaml_ng::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    #[allow(dead_code)]
    tier: Tier,
    #[allow(dead_code)]
    priority: i64,
    subject: Subject,
    #[serde(default)]
    ingress: Vec<IngressRule>,
    #[serde(default)]
    egress: Vec<EgressRule>,
}

#[derive(Deserialize)]
enum Tier {
    Admin,
    Baseline,
}

#[derive(Deserialize)]
enum Action {
    Accept,
    Deny,
    Pass,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Subject {
    namespaces: Option<LabelSelector>,
    pods: Option<NamespacedPod>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespacedPod {
    #[allow(dead_code)]
    #[serde(default)]
    namespace_selector: Option<LabelSelector>,
    #[allow(dead_code)]
    pod_selector: LabelSelector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IngressRule {
    #[allow(dead_code)]
    name: Option<String>,
    #[allow(dead_code)]
    action: Action,
    from: Vec<IngressPeer>,
    protocols: Option<Vec<ProtocolMatch>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgressRule {
    #[allow(dead_code)]
    name: Option<String>,
    #[allow(dead_code)]
    action: Action,
    to: Vec<EgressPeer>,
    protocols: Option<Vec<ProtocolMatch>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IngressPeer {
    namespaces: Option<LabelSelector>,
    pods: Option<NamespacedPod>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EgressPeer {
    namespaces: Option<LabelSelector>,
    pods: Option<NamespacedPod>,
    /// Experimental channel.
    nodes: Option<LabelSelector>,
    networks: Option<Vec<String>>,
    /// Experimental channel.
    domain_names: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProtocolMatch {
    tcp: Option<PortMatch>,
    udp: Option<PortMatch>,
    sctp: Option<PortMatch>,
    destination_named_port: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PortMatch {
    destination_port: Option<Port>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Port {
    number: Option<i64>,
    range: Option<PortRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortRange {
    #[allow(dead_code)]
    start: i64,
    #[allow(dead_code)]
    end: i64,
}

/// True when the document says it is a ClusterNetworkPolicy (whatever its apiVersion).
pub fn is_cluster_policy(value: &serde_yaml_ng::Value) -> bool {
    value.get("kind").and_then(|k| k.as_str()) == Some(KIND)
}

/// Checks one ClusterNetworkPolicy document and returns its name. Errors name the field.
pub fn check(value: &serde_yaml_ng::Value) -> anyhow::Result<String> {
    let api_version = value
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    ensure!(
        api_version == API_VERSION,
        "{KIND}: apiVersion is {api_version:?}, must be {API_VERSION:?}"
    );
    let doc: Document =
        serde_yaml_ng::from_value(value.clone()).map_err(|e| anyhow!("{KIND}: {e}"))?;
    let name = doc
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| anyhow!("{KIND}: metadata.name is missing"))?;
    let what = format!("{KIND} {name:?}");
    if let Some(ns) = &doc.metadata.namespace {
        bail!("{what}: is cluster-scoped, but metadata.namespace is {ns:?}");
    }
    check_shape(&doc.spec).map_err(|e| anyhow!("{what}: {e}"))?;
    Ok(name)
}

fn check_shape(spec: &Spec) -> anyhow::Result<()> {
    one_of(
        "spec.subject",
        &[
            ("namespaces", spec.subject.namespaces.is_some()),
            ("pods", spec.subject.pods.is_some()),
        ],
    )?;
    for (i, rule) in spec.ingress.iter().enumerate() {
        let at = format!("spec.ingress[{i}]");
        ensure!(
            !rule.from.is_empty(),
            "{at}.from must have at least one peer"
        );
        for (j, peer) in rule.from.iter().enumerate() {
            one_of(
                &format!("{at}.from[{j}]"),
                &[
                    ("namespaces", peer.namespaces.is_some()),
                    ("pods", peer.pods.is_some()),
                ],
            )?;
        }
        check_protocols(&at, rule.protocols.as_deref())?;
    }
    for (i, rule) in spec.egress.iter().enumerate() {
        let at = format!("spec.egress[{i}]");
        ensure!(!rule.to.is_empty(), "{at}.to must have at least one peer");
        for (j, peer) in rule.to.iter().enumerate() {
            let peer_at = format!("{at}.to[{j}]");
            one_of(
                &peer_at,
                &[
                    ("namespaces", peer.namespaces.is_some()),
                    ("pods", peer.pods.is_some()),
                    ("nodes", peer.nodes.is_some()),
                    ("networks", peer.networks.is_some()),
                    ("domainNames", peer.domain_names.is_some()),
                ],
            )?;
            for (field, list) in [
                ("networks", &peer.networks),
                ("domainNames", &peer.domain_names),
            ] {
                if let Some(list) = list {
                    ensure!(!list.is_empty(), "{peer_at}.{field} must not be empty");
                }
            }
        }
        check_protocols(&at, rule.protocols.as_deref())?;
    }
    Ok(())
}

fn check_protocols(at: &str, protocols: Option<&[ProtocolMatch]>) -> anyhow::Result<()> {
    let Some(protocols) = protocols else {
        return Ok(());
    };
    ensure!(
        !protocols.is_empty(),
        "{at}.protocols must not be empty (leave it out to match every protocol)"
    );
    for (k, p) in protocols.iter().enumerate() {
        let p_at = format!("{at}.protocols[{k}]");
        one_of(
            &p_at,
            &[
                ("tcp", p.tcp.is_some()),
                ("udp", p.udp.is_some()),
                ("sctp", p.sctp.is_some()),
                ("destinationNamedPort", p.destination_named_port.is_some()),
            ],
        )?;
        for (proto, m) in [("tcp", &p.tcp), ("udp", &p.udp), ("sctp", &p.sctp)] {
            let Some(m) = m else { continue };
            // The CRD gives the protocol objects minProperties 1.
            let port = m
                .destination_port
                .as_ref()
                .ok_or_else(|| anyhow!("{p_at}.{proto}.destinationPort is required"))?;
            one_of(
                &format!("{p_at}.{proto}.destinationPort"),
                &[
                    ("number", port.number.is_some()),
                    ("range", port.range.is_some()),
                ],
            )?;
        }
        if let Some(name) = &p.destination_named_port {
            ensure!(
                !name.is_empty(),
                "{p_at}.destinationNamedPort must not be empty"
            );
        }
    }
    Ok(())
}

/// The API's "exactly one field must be set" (minProperties = maxProperties = 1).
fn one_of(at: &str, fields: &[(&str, bool)]) -> anyhow::Result<()> {
    let set: Vec<&str> = fields.iter().filter(|f| f.1).map(|f| f.0).collect();
    let names: Vec<&str> = fields.iter().map(|f| f.0).collect();
    match set.len() {
        1 => Ok(()),
        0 => bail!("{at} needs exactly one of {}", names.join(", ")),
        _ => bail!("{at} sets {}; exactly one is allowed", set.join(" and ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> serde_yaml_ng::Value {
        serde_yaml_ng::from_str(text).unwrap()
    }

    const GOOD: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: egress-tcp}
spec:
  tier: Admin
  priority: 6
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: a}}}
  ingress:
  - action: Pass
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}]
    protocols: [{destinationNamedPort: web}]
  egress:
  - name: "deny-out"
    action: Deny
    to: [{networks: ["0.0.0.0/0", "::/0"]}, {namespaces: {}}]
    protocols:
    - tcp: {destinationPort: {number: 80}}
    - udp: {destinationPort: {range: {start: 50, end: 60}}}
    - sctp: {destinationPort: {number: 9003}}
"#;

    fn err(text: &str) -> String {
        format!("{:#}", check(&value(text)).unwrap_err())
    }

    fn with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from}");
        GOOD.replacen(from, to, 1)
    }

    #[test]
    fn a_policy_in_upstream_shape_is_accepted() {
        assert_eq!(check(&value(GOOD)).unwrap(), "egress-tcp");
        assert!(is_cluster_policy(&value(GOOD)));
        // The pods peer's namespaceSelector is optional (it defaults to all namespaces).
        let no_ns = with("namespaceSelector: {}, ", "");
        assert_eq!(check(&value(&no_ns)).unwrap(), "egress-tcp");
        // Experimental peers are part of the shape, whatever the agent does with them.
        let nodes = with(
            "{namespaces: {}}]",
            "{nodes: {matchLabels: {kubernetes.io/os: linux}}}, {domainNames: [\"*.example.com\"]}]",
        );
        assert_eq!(check(&value(&nodes)).unwrap(), "egress-tcp");
    }

    #[test]
    fn each_mistake_names_its_field() {
        let cases = [
            (
                with("v1alpha2", "v1alpha1"),
                "must be \"policy.networking.k8s.io/v1alpha2\"",
            ),
            (
                with("{name: egress-tcp}", "{name: x, namespace: a}"),
                "cluster-scoped",
            ),
            (
                with("{name: egress-tcp}", "{labels: {a: b}}"),
                "metadata.name is missing",
            ),
            (with("  tier: Admin\n", ""), "missing field `tier`"),
            (
                with("tier: Admin", "tier: Override"),
                "unknown variant `Override`",
            ),
            (with("  priority: 6\n", ""), "missing field `priority`"),
            (
                with("action: Deny", "action: Allow"),
                "unknown variant `Allow`",
            ),
            (
                with("subject: {namespaces:", "subject: {namespace:"),
                "unknown field `namespace`",
            ),
            (
                with(
                    "{namespaces: {matchLabels: {kubernetes.io/metadata.name: a}}}",
                    "{}",
                ),
                "spec.subject needs exactly one of namespaces, pods",
            ),
            (
                with(
                    "{namespaces: {}}]",
                    "{namespaces: {}, networks: [\"10.0.0.0/8\"]}]",
                ),
                "spec.egress[0].to[1] sets namespaces and networks",
            ),
            (
                with("    from: [{pods:", "    from: []\n    x: [{pods:"),
                "unknown field `x`",
            ),
            (
                with(
                    "to: [{networks: [\"0.0.0.0/0\", \"::/0\"]}, {namespaces: {}}]",
                    "to: []",
                ),
                "spec.egress[0].to must have at least one peer",
            ),
            (
                with("tcp: {destinationPort: {number: 80}}", "tcp: {}"),
                "spec.egress[0].protocols[0].tcp.destinationPort is required",
            ),
            (
                with("{number: 80}", "{number: 80, range: {start: 1, end: 2}}"),
                "destinationPort sets number and range",
            ),
            (
                with(
                    "[{destinationNamedPort: web}]",
                    "[{destinationNamedPort: web, tcp: {destinationPort: {number: 1}}}]",
                ),
                "spec.ingress[0].protocols[0] sets tcp and destinationNamedPort",
            ),
            (
                with("[{destinationNamedPort: web}]", "[]"),
                "protocols must not be empty",
            ),
            (
                with("podSelector: {matchLabels: {app: x}}", "podselector: {}"),
                "unknown field `podselector`",
            ),
        ];
        for (text, want) in cases {
            let got = err(&text);
            assert!(got.contains(want), "want {want:?} in {got:?}");
        }
    }

    #[test]
    fn limits_are_left_to_the_agent() {
        // Out-of-range priority and a backwards port range have the right shape: a scenario
        // may apply them to see the agent refuse them.
        let text = with("priority: 6", "priority: 5000").replace("end: 60", "end: 5");
        assert_eq!(check(&value(&text)).unwrap(), "egress-tcp");
    }
}
