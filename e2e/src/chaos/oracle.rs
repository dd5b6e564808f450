//! What NetworkPolicy says about one connection, decided from the objects alone: the chaos
//! harness's expectation for worlds it generates at random (the scenarios' truth tables are
//! written by hand; random worlds need a judge that does not share code with the agent).
//!
//! Written from the API's documented semantics, not from the agent's rules: a pod is isolated
//! for a direction exactly when a policy of its namespace selects it with that policy type
//! (`policyTypes` as written, else Ingress plus Egress when `egress` has rules); an isolated
//! pod admits what at least one such policy's rules admit; a connection needs the source's
//! egress and the destination's ingress. Peers: `podSelector` in the policy's namespace,
//! `namespaceSelector` (with `podSelector`: both), `ipBlock` on the pod address (`except`
//! carved out); an absent or empty peer list is everyone. Ports: absent or empty is every
//! port; a numeric port with `endPort` is a range; a named port resolves on the destination
//! pod's container ports of the rule's protocol (TCP unless said). A port the destination
//! does not serve never connects (no server, no DNAT).
//!
//! Pure: no I/O. Addresses are the world's IPv4 ones; the IPv6 embedding keeps containment,
//! so the verdict holds for every family the cluster probes.

use std::net::Ipv4Addr;

use anyhow::{anyhow, Context};
use ipnet::Ipv4Net;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::scenario::{Labels, Pod, PortKey, Protocol, World};

/// The policies of a world, parsed once.
pub struct Oracle<'w> {
    world: &'w World,
    policies: Vec<(String, NetworkPolicySpec)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl<'w> Oracle<'w> {
    pub fn new(world: &'w World) -> anyhow::Result<Oracle<'w>> {
        let mut policies = Vec::new();
        for (key, doc) in &world.policies {
            let p: NetworkPolicy =
                serde_yaml_ng::from_str(doc).with_context(|| format!("policy {key}"))?;
            let ns = p
                .metadata
                .namespace
                .clone()
                .ok_or_else(|| anyhow!("policy {key} has no namespace"))?;
            policies.push((ns, p.spec.unwrap_or_default()));
        }
        Ok(Oracle { world, policies })
    }

    /// Whether a new connection from `from` to `to` on `key` is allowed.
    pub fn allowed(&self, from: &Pod, to: &Pod, key: PortKey) -> bool {
        let served = to
            .ports
            .iter()
            .any(|p| p.port == key.port && p.protocol == key.protocol);
        served
            && self.admits(Direction::Egress, from, to, from, key)
            && self.admits(Direction::Ingress, to, from, to, key)
    }

    /// Whether `subject`'s policies of `dir` let `peer` through (`dest` is the pod whose
    /// named ports count).
    fn admits(&self, dir: Direction, subject: &Pod, peer: &Pod, dest: &Pod, key: PortKey) -> bool {
        let mut isolated = false;
        for (ns, spec) in &self.policies {
            if *ns != subject.namespace
                || !has_type(spec, dir)
                || !selects(spec.pod_selector.as_ref(), &subject.labels)
            {
                continue;
            }
            isolated = true;
            let admitted = match dir {
                Direction::Ingress => spec.ingress.iter().flatten().any(|r| {
                    self.peers_match(r.from.as_deref(), ns, peer)
                        && ports_match(r.ports.as_deref(), dest, key)
                }),
                Direction::Egress => spec.egress.iter().flatten().any(|r| {
                    self.peers_match(r.to.as_deref(), ns, peer)
                        && ports_match(r.ports.as_deref(), dest, key)
                }),
            };
            if admitted {
                return true;
            }
        }
        !isolated
    }

    fn peers_match(&self, peers: Option<&[NetworkPolicyPeer]>, policy_ns: &str, pod: &Pod) -> bool {
        match peers {
            None | Some([]) => true,
            Some(peers) => peers.iter().any(|p| self.peer_matches(p, policy_ns, pod)),
        }
    }

    fn peer_matches(&self, peer: &NetworkPolicyPeer, policy_ns: &str, pod: &Pod) -> bool {
        if let Some(block) = &peer.ip_block {
            return in_block(
                &block.cidr,
                block.except.as_deref().unwrap_or_default(),
                pod.ip,
            );
        }
        let ns_ok = match &peer.namespace_selector {
            None => pod.namespace == policy_ns,
            Some(sel) => self
                .world
                .namespaces
                .get(&pod.namespace)
                .is_some_and(|labels| selects(Some(sel), labels)),
        };
        let pod_ok = match &peer.pod_selector {
            None => true,
            Some(sel) => selects(Some(sel), &pod.labels),
        };
        // A peer with neither selector nor ipBlock is invalid; it never matches here.
        let some_selector = peer.namespace_selector.is_some() || peer.pod_selector.is_some();
        some_selector && ns_ok && pod_ok
    }
}

fn has_type(spec: &NetworkPolicySpec, dir: Direction) -> bool {
    let want = match dir {
        Direction::Ingress => "Ingress",
        Direction::Egress => "Egress",
    };
    match &spec.policy_types {
        Some(types) => types.iter().any(|t| t == want),
        None => match dir {
            Direction::Ingress => true,
            Direction::Egress => spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
        },
    }
}

/// Label selector semantics: every `matchLabels` pair and every expression must hold; an
/// empty selector selects everything.
pub fn selects(sel: Option<&LabelSelector>, labels: &Labels) -> bool {
    let Some(sel) = sel else {
        return true;
    };
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

fn in_block(cidr: &str, except: &[String], ip: Ipv4Addr) -> bool {
    let contains = |text: &str| text.parse::<Ipv4Net>().is_ok_and(|net| net.contains(&ip));
    contains(cidr) && !except.iter().any(|e| contains(e))
}

fn ports_match(ports: Option<&[NetworkPolicyPort]>, dest: &Pod, key: PortKey) -> bool {
    match ports {
        None | Some([]) => true,
        Some(ports) => ports.iter().any(|p| port_matches(p, dest, key)),
    }
}

fn port_matches(p: &NetworkPolicyPort, dest: &Pod, key: PortKey) -> bool {
    let protocol = p
        .protocol
        .as_deref()
        .map_or(Some(Protocol::Tcp), Protocol::parse);
    if protocol != Some(key.protocol) {
        return false;
    }
    match &p.port {
        None => true,
        Some(IntOrString::Int(n)) => {
            let start = i64::from(*n);
            let end = p.end_port.map_or(start, i64::from);
            (start..=end).contains(&i64::from(key.port))
        }
        Some(IntOrString::String(name)) => dest.ports.iter().any(|d| {
            d.name.as_deref() == Some(name.as_str())
                && d.protocol == key.protocol
                && d.port == key.port
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{PortDecl, WorldBuilder};

    fn ports() -> Vec<PortDecl> {
        let mut out = Vec::new();
        for (port, protocol, name) in [
            (80, Protocol::Tcp, "serve-80-tcp"),
            (81, Protocol::Udp, "serve-81-udp"),
        ] {
            out.push(PortDecl {
                name: Some(name.into()),
                port,
                protocol,
            });
        }
        out
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// x/a (app=web), x/b (app=db), y/c (app=web); namespace y has team=ops.
    fn world(policies: &str) -> WorldBuilder {
        let mut b = WorldBuilder::new(2);
        b.namespace("x", labels(&[])).unwrap();
        b.namespace("y", labels(&[("team", "ops")])).unwrap();
        b.pod("x/a", labels(&[("app", "web")]), 0, ports()).unwrap();
        b.pod("x/b", labels(&[("app", "db")]), 1, ports()).unwrap();
        b.pod("y/c", labels(&[("app", "web")]), 0, ports()).unwrap();
        if !policies.is_empty() {
            b.apply(policies).unwrap();
        }
        b
    }

    const TCP80: PortKey = PortKey {
        protocol: Protocol::Tcp,
        port: 80,
    };
    const UDP81: PortKey = PortKey {
        protocol: Protocol::Udp,
        port: 81,
    };
    const TCP81: PortKey = PortKey {
        protocol: Protocol::Tcp,
        port: 81,
    };

    fn verdict(b: &WorldBuilder, from: &str, to: &str, key: PortKey) -> bool {
        let o = Oracle::new(&b.world).unwrap();
        o.allowed(&b.world.pods[from], &b.world.pods[to], key)
    }

    fn policy(ns: &str, spec: &str) -> String {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p, namespace: {ns}}}\nspec: {spec}\n"
        )
    }

    #[test]
    fn no_policy_allows_what_is_served_only() {
        let b = world("");
        assert!(verdict(&b, "x/a", "x/b", TCP80));
        assert!(verdict(&b, "x/a", "y/c", UDP81));
        assert!(!verdict(&b, "x/a", "x/b", TCP81), "nothing serves TCP/81");
    }

    #[test]
    fn ingress_isolation_and_peers() {
        // x/b admits only app=web pods of its own namespace.
        let b = world(&policy(
            "x",
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]}",
        ));
        assert!(verdict(&b, "x/a", "x/b", TCP80));
        assert!(!verdict(&b, "y/c", "x/b", TCP80), "other namespace");
        assert!(verdict(&b, "x/b", "x/a", TCP80), "x/a is not selected");

        // With a namespace selector: web pods of team=ops namespaces only.
        let b = world(&policy(
            "x",
            "{podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: ops}}, podSelector: {matchLabels: {app: web}}}]}]}",
        ));
        assert!(verdict(&b, "y/c", "x/b", TCP80));
        assert!(!verdict(&b, "x/a", "x/b", TCP80));
        assert!(!verdict(&b, "x/b", "x/a", UDP81));
    }

    #[test]
    fn egress_defaulting_and_ports() {
        // Egress rules without policyTypes isolate egress too; named port on the destination.
        let b = world(&policy(
            "x",
            "{podSelector: {matchLabels: {app: web}}, egress: [{ports: [{port: serve-81-udp, protocol: UDP}]}]}",
        ));
        assert!(verdict(&b, "x/a", "y/c", UDP81));
        assert!(!verdict(&b, "x/a", "y/c", TCP80));
        assert!(
            !verdict(&b, "y/c", "x/a", TCP80),
            "without policyTypes the policy isolates ingress too, and it has no ingress rule"
        );
        // policyTypes [Egress] with no rules denies all egress and leaves ingress alone.
        let b = world(&policy(
            "x",
            "{podSelector: {matchLabels: {app: web}}, policyTypes: [Egress]}",
        ));
        assert!(!verdict(&b, "x/a", "x/b", TCP80));
        assert!(verdict(&b, "x/b", "x/a", TCP80));
        // A range and a protocol-only port.
        let b = world(&policy(
            "x",
            "{podSelector: {}, ingress: [{ports: [{port: 79, endPort: 80}]}, {ports: [{protocol: UDP}]}]}",
        ));
        assert!(verdict(&b, "y/c", "x/a", TCP80));
        assert!(verdict(&b, "y/c", "x/a", UDP81));
    }

    #[test]
    fn ip_blocks_and_expressions() {
        let b = world("");
        let a_ip = b.world.pods["x/a"].ip;
        let net = Ipv4Net::new(a_ip, 24).unwrap().trunc();
        let text = policy(
            "y",
            &format!("{{podSelector: {{matchExpressions: [{{key: app, operator: In, values: [web]}}]}}, ingress: [{{from: [{{ipBlock: {{cidr: \"{net}\", except: [\"{a_ip}/32\"]}}}}]}}]}}"),
        );
        let mut b = b;
        b.apply(&text).unwrap();
        assert!(!verdict(&b, "x/a", "y/c", TCP80), "excepted");
        // x/b sits on node 1, outside node 0's /24.
        assert!(!verdict(&b, "x/b", "y/c", TCP80));
        let c = &b.world.pods["y/c"];
        assert!(selects(
            Some(
                &serde_json::from_str(
                    r#"{"matchExpressions":[{"key":"tier","operator":"DoesNotExist"}]}"#
                )
                .unwrap()
            ),
            &c.labels
        ));
        assert!(!selects(
            Some(
                &serde_json::from_str(
                    r#"{"matchExpressions":[{"key":"app","operator":"NotIn","values":["web"]}]}"#
                )
                .unwrap()
            ),
            &c.labels
        ));
    }
}
