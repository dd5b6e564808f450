//! How a scenario's objects are named and written on a real cluster: the one place that turns
//! the scenario's names (`x`, `x/a`, `ClusterNetworkPolicy/p`) into the cluster's, and the
//! scenario's policies into the documents the API server gets. Pure: no I/O.
//!
//! Every namespace a scenario names becomes `<name>-<suffix>`, the suffix random per scenario
//! run, so a scenario never meets a namespace it did not make, and two runs never meet each
//! other. Everything the user wrote that refers to a namespace by name follows:
//! `metadata.namespace`, and the `kubernetes.io/metadata.name` label in every namespace
//! selector (`matchLabels` values and `matchExpressions` values). Labels the scenario gives
//! its namespaces are kept as written, plus [`RUN_LABEL`] and [`SCENARIO_LABEL`].
//!
//! ClusterNetworkPolicies are cluster-scoped: applied as written they would reach every
//! namespace of the cluster (a `Deny` with `namespaces: {}` would cut the user's own
//! workloads). So each gets the suffix in its name, and every namespace selector in it (its
//! subject's and its peers') is narrowed to the scenario's namespaces by requiring
//! [`SCENARIO_LABEL`]. Among the scenario's own pods, the only ones probed, this selects
//! exactly what the selector as written selects; outside them it selects nothing.
//! NetworkPolicies are namespaced and left as written apart from names: their subjects are
//! the scenario's pods already, and a peer selector reaching further only admits more.

use std::collections::BTreeSet;

use anyhow::{anyhow, ensure, Context};
use serde_yaml_ng::{Mapping, Value};

use crate::scenario::{Scenario, NAMESPACE_NAME_LABEL};

/// On every namespace a run makes: the run's id (`kubectl delete ns -l netpol-e2e.io/run=ID`
/// removes what an interrupted run left behind).
pub const RUN_LABEL: &str = "netpol-e2e.io/run";
/// On every namespace a scenario makes: its suffix; cluster policies are narrowed to it.
pub const SCENARIO_LABEL: &str = "netpol-e2e.io/scenario";

/// A scenario's names on the cluster.
#[derive(Clone, Debug)]
pub struct Names {
    pub suffix: String,
    namespaces: BTreeSet<String>,
}

impl Names {
    /// Names for `scenario` with `suffix`; fails when a namespace name with the suffix would
    /// not be a DNS label (63 characters).
    pub fn new(scenario: &Scenario, suffix: &str) -> anyhow::Result<Names> {
        let mut namespaces: BTreeSet<String> =
            scenario.initial.namespaces.keys().cloned().collect();
        for step in &scenario.steps {
            namespaces.extend(step.world.namespaces.keys().cloned());
        }
        for ns in &namespaces {
            ensure!(
                ns.len() + 1 + suffix.len() <= 63,
                "namespace {ns:?} is too long for a real cluster: with the run's suffix \
                 ({suffix}) it would pass 63 characters"
            );
        }
        Ok(Names {
            suffix: suffix.to_string(),
            namespaces,
        })
    }

    /// The cluster's name of scenario namespace `ns`.
    pub fn ns(&self, ns: &str) -> String {
        format!("{ns}-{}", self.suffix)
    }

    /// The cluster's name of cluster policy `name`.
    /// A scenario pod `ns/name` as the cluster names it (its namespace suffixed).
    pub fn pod(&self, key: &str) -> String {
        match key.split_once('/') {
            Some((ns, pod)) => format!("{}/{pod}", self.ns(ns)),
            None => key.to_string(),
        }
    }

    pub fn cluster_policy(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }

    /// A NetworkPolicy document (placeholders expanded) as the cluster gets it.
    pub fn network_policy(&self, doc: &str) -> anyhow::Result<Value> {
        let mut value: Value = serde_yaml_ng::from_str(doc).map_err(|e| anyhow!("{e}"))?;
        let ns = value
            .get("metadata")
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("a NetworkPolicy without metadata.namespace"))?
            .to_string();
        value["metadata"]["namespace"] = Value::from(self.ns(&ns));
        if let Some(spec) = value.get_mut("spec") {
            for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
                for peer in peers_of(spec, direction, peers) {
                    if let Some(sel) = peer.get_mut("namespaceSelector") {
                        self.selector(sel, false)
                            .with_context(|| format!("spec.{direction}.{peers}"))?;
                    }
                }
            }
        }
        Ok(value)
    }

    /// A ClusterNetworkPolicy document as the cluster gets it (renamed, its namespace
    /// selectors narrowed to the scenario).
    pub fn cluster_network_policy(&self, doc: &str) -> anyhow::Result<Value> {
        let mut value: Value = serde_yaml_ng::from_str(doc).map_err(|e| anyhow!("{e}"))?;
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("a ClusterNetworkPolicy without metadata.name"))?
            .to_string();
        value["metadata"]["name"] = Value::from(self.cluster_policy(&name));
        let Some(spec) = value.get_mut("spec") else {
            return Ok(value);
        };
        if let Some(subject) = spec.get_mut("subject") {
            self.cnp_peer(subject).context("spec.subject")?;
        }
        for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
            for peer in peers_of(spec, direction, peers) {
                self.cnp_peer(peer)
                    .with_context(|| format!("spec.{direction}.{peers}"))?;
            }
        }
        Ok(value)
    }

    /// A cluster policy subject or peer: `namespaces: <selector>` or
    /// `pods: {namespaceSelector, podSelector}`; `networks` and `nodes` are left alone.
    fn cnp_peer(&self, peer: &mut Value) -> anyhow::Result<()> {
        if let Some(sel) = peer.get_mut("namespaces") {
            self.selector(sel, true).context("namespaces")?;
        }
        if let Some(sel) = peer
            .get_mut("pods")
            .and_then(|p| p.get_mut("namespaceSelector"))
        {
            self.selector(sel, true).context("pods.namespaceSelector")?;
        }
        Ok(())
    }

    /// Renames the scenario's namespaces in a label selector; with `narrow`, also requires
    /// [`SCENARIO_LABEL`].
    fn selector(&self, sel: &mut Value, narrow: bool) -> anyhow::Result<()> {
        if sel.is_null() {
            *sel = Value::Mapping(Mapping::new());
        }
        let map = sel
            .as_mapping_mut()
            .ok_or_else(|| anyhow!("a label selector that is not a mapping"))?;
        if let Some(Value::Mapping(labels)) = map.get_mut("matchLabels") {
            if let Some(v) = labels.get_mut(NAMESPACE_NAME_LABEL) {
                self.rename_value(v);
            }
        }
        if let Some(Value::Sequence(exprs)) = map.get_mut("matchExpressions") {
            for expr in exprs {
                if expr.get("key").and_then(Value::as_str) != Some(NAMESPACE_NAME_LABEL) {
                    continue;
                }
                if let Some(Value::Sequence(values)) = expr.get_mut("values") {
                    values.iter_mut().for_each(|v| self.rename_value(v));
                }
            }
        }
        if narrow {
            let labels = map
                .entry(Value::from("matchLabels"))
                .or_insert_with(|| Value::Mapping(Mapping::new()));
            if labels.is_null() {
                *labels = Value::Mapping(Mapping::new());
            }
            labels
                .as_mapping_mut()
                .ok_or_else(|| anyhow!("matchLabels is not a mapping"))?
                .insert(
                    Value::from(SCENARIO_LABEL),
                    Value::from(self.suffix.clone()),
                );
        }
        Ok(())
    }

    /// A namespace name the scenario made becomes the cluster's; any other name (a namespace
    /// of the cluster's own) is left as written.
    fn rename_value(&self, v: &mut Value) {
        if let Some(name) = v.as_str() {
            if self.namespaces.contains(name) {
                *v = Value::from(self.ns(name));
            }
        }
    }
}

/// Every peer of every rule of `direction` (`ingress`/`egress`) in a policy spec.
fn peers_of<'a>(
    spec: &'a mut Value,
    direction: &str,
    peers: &str,
) -> impl Iterator<Item = &'a mut Value> {
    let rules = match spec.get_mut(direction) {
        Some(Value::Sequence(rules)) => rules.as_mut_slice(),
        _ => &mut [],
    };
    let peers = peers.to_string();
    rules.iter_mut().flat_map(move |rule| {
        match rule.get_mut(peers.as_str()) {
            Some(Value::Sequence(list)) => list.as_mut_slice(),
            _ => &mut [],
        }
        .iter_mut()
    })
}

/// Whether a policy document has an IPv4 address block (`ipBlock.cidr`/`except`, a cluster
/// policy's `networks`): expectations written for IPv4 do not carry over to IPv6 then, so
/// the scenario is probed over IPv4 only.
pub fn has_ipv4_block(doc: &str) -> bool {
    fn walk(v: &Value, inside: bool) -> bool {
        match v {
            Value::Mapping(m) => m.iter().any(|(k, v)| {
                let key = k.as_str().unwrap_or("");
                walk(
                    v,
                    inside || matches!(key, "ipBlock" | "networks" | "cidr" | "except"),
                )
            }),
            Value::Sequence(s) => s.iter().any(|v| walk(v, inside)),
            Value::String(s) if inside => s
                .split('/')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv4Addr>().is_ok()),
            _ => false,
        }
    }
    serde_yaml_ng::from_str::<Value>(doc).is_ok_and(|v| walk(&v, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn names() -> Names {
        let s = crate::scenario::parse(
            "name: t\nnamespaces: {x: {}, y: {}}\npods: {x/a: {}}\nsteps:\n- {add_namespaces: {z: {}}, expect: {'*': {}}}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        Names::new(&s, "k3q9z").unwrap()
    }

    #[test]
    fn network_policies_follow_the_renamed_namespaces() {
        let n = names();
        let doc = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z, ns: y}}
        - namespaceSelector:
            matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [y, kube-system]}]
          podSelector: {matchLabels: {pod: b}}
        - podSelector: {}
        - namespaceSelector: {}
"#;
        let v = n.network_policy(doc).unwrap();
        assert_eq!(v["metadata"]["namespace"], Value::from("x-k3q9z"));
        let from = &v["spec"]["ingress"][0]["from"];
        assert_eq!(
            from[0]["namespaceSelector"]["matchLabels"][NAMESPACE_NAME_LABEL],
            Value::from("z-k3q9z")
        );
        assert_eq!(
            from[0]["namespaceSelector"]["matchLabels"]["ns"],
            Value::from("y"),
            "the scenario's own labels are kept as written"
        );
        let values = &from[1]["namespaceSelector"]["matchExpressions"][0]["values"];
        assert_eq!(values[0], Value::from("y-k3q9z"));
        assert_eq!(
            values[1],
            Value::from("kube-system"),
            "a namespace the scenario did not make keeps its name"
        );
        assert_eq!(
            from[3]["namespaceSelector"],
            Value::Mapping(Mapping::new()),
            "a NetworkPolicy's selectors are not narrowed"
        );
    }

    #[test]
    fn cluster_policies_are_renamed_and_narrowed_to_the_scenario() {
        let n = names();
        let doc = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-all}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  ingress:
    - action: Deny
      from:
        - pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}, podSelector: {}}
        - namespaces: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}]}
  egress:
    - {action: Deny, to: [{networks: [10.0.0.0/8]}]}
"#;
        let v = n.cluster_network_policy(doc).unwrap();
        assert_eq!(v["metadata"]["name"], Value::from("deny-all-k3q9z"));
        assert_eq!(
            v["spec"]["subject"]["namespaces"]["matchLabels"][SCENARIO_LABEL],
            Value::from("k3q9z"),
            "an empty subject selector must not reach the cluster's other namespaces"
        );
        let from = &v["spec"]["ingress"][0]["from"];
        let pods_ns = &from[0]["pods"]["namespaceSelector"]["matchLabels"];
        assert_eq!(pods_ns[NAMESPACE_NAME_LABEL], Value::from("y-k3q9z"));
        assert_eq!(pods_ns[SCENARIO_LABEL], Value::from("k3q9z"));
        assert_eq!(
            from[1]["namespaces"]["matchExpressions"][0]["values"][0],
            Value::from("x-k3q9z")
        );
        assert_eq!(
            from[1]["namespaces"]["matchLabels"][SCENARIO_LABEL],
            Value::from("k3q9z")
        );
        assert_eq!(
            v["spec"]["egress"][0]["to"][0]["networks"][0],
            Value::from("10.0.0.0/8")
        );
    }

    #[test]
    fn long_namespace_names_are_refused_before_anything_is_made() {
        let s = crate::scenario::parse(
            &format!(
                "name: t\nnamespaces: {{{}: {{}}}}\nsteps: [{{expect: {{'*': {{}}}}}}]\n",
                "n".repeat(60)
            ),
            Path::new("t.yaml"),
        )
        .unwrap();
        assert!(Names::new(&s, "k3q9z").is_err());
        assert_eq!(names().ns("x"), "x-k3q9z");
        assert_eq!(names().cluster_policy("p"), "p-k3q9z");
    }

    #[test]
    fn ipv4_blocks_are_found() {
        assert!(has_ipv4_block(
            "spec: {ingress: [{from: [{ipBlock: {cidr: 10.1.2.3/32}}]}]}"
        ));
        assert!(has_ipv4_block(
            "spec: {egress: [{to: [{networks: ['::/0', 0.0.0.0/0]}]}]}"
        ));
        assert!(!has_ipv4_block(
            "spec: {egress: [{to: [{networks: ['2001:db8::/32']}]}]}"
        ));
        assert!(
            !has_ipv4_block("metadata: {name: 10.1.2.3}\nspec: {podSelector: {}}"),
            "only address blocks count"
        );
    }
}
