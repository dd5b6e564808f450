//! Random worlds and random changes for the chaos harness, from a seeded generator so a
//! failing run can be repeated (`--seed`).
//!
//! The vocabulary is small on purpose, so that selectors overlap and one change moves many
//! verdicts: three namespaces (`team` x or y), pods labelled `app` (web, db, api) and sometimes
//! `tier` (front, back), each serving TCP 80 and UDP 81 under the names `serve-80-tcp` and
//! `serve-81-udp` (TCP 81 is probed and never served). Policies mix pod, namespace and
//! combined selectors, `matchExpressions` of every operator, `ipBlock`s with `except` on real
//! pod addresses, numeric, named, ranged and protocol-only ports, and both directions.
//!
//! One change per round: add, edit or delete a policy, relabel a pod or a namespace, add or
//! delete a pod (a pod deleted and added again gets a new address, as the CNI would give it).

use std::collections::BTreeMap;

use anyhow::Context;
use rand::RngExt;
use rand_xorshift::XorShiftRng;
use serde_json::{json, Value};

use crate::scenario::{Labels, PortDecl, Protocol, WorldBuilder};

pub const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const APPS: [&str; 3] = ["web", "db", "api"];
const TIERS: [&str; 2] = ["front", "back"];
const TEAMS: [&str; 2] = ["x", "y"];
/// Bounds that keep a round's probe sweep short.
const MIN_PODS: usize = 4;
const MAX_PODS: usize = 8;
const MAX_POLICIES: usize = 7;

/// The ports every generated pod serves.
pub fn pod_ports() -> Vec<PortDecl> {
    vec![
        PortDecl {
            name: Some("serve-80-tcp".into()),
            port: 80,
            protocol: Protocol::Tcp,
        },
        PortDecl {
            name: Some("serve-81-udp".into()),
            port: 81,
            protocol: Protocol::Udp,
        },
    ]
}

pub struct Gen {
    rng: XorShiftRng,
    nodes: usize,
    next_pod: usize,
    next_policy: usize,
}

impl Gen {
    pub fn new(rng: XorShiftRng, nodes: usize) -> Gen {
        Gen {
            rng,
            nodes,
            next_pod: 0,
            next_policy: 0,
        }
    }

    pub fn rng(&mut self) -> &mut XorShiftRng {
        &mut self.rng
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.random_range(0..items.len())]
    }

    /// The starting world: the namespaces, six pods, three policies.
    pub fn initial(&mut self) -> anyhow::Result<WorldBuilder> {
        let mut b = WorldBuilder::new(self.nodes);
        for ns in NAMESPACES {
            let labels = self.namespace_labels();
            b.namespace(ns, labels)?;
        }
        for _ in 0..6 {
            self.add_pod(&mut b)?;
        }
        for _ in 0..3 {
            self.add_policy(&mut b)?;
        }
        Ok(b)
    }

    /// Makes one random change to `b`'s world and says what it was.
    pub fn change(&mut self, b: &mut WorldBuilder) -> anyhow::Result<String> {
        loop {
            let pods = b.world.pods.len();
            let policies = b.world.policies.len();
            let what = match self.rng.random_range(0..9) {
                0 | 1 if policies < MAX_POLICIES => self.add_policy(b)?,
                2 | 3 if policies > 0 => self.edit_policy(b)?,
                4 if policies > 1 => self.delete_policy(b),
                5 => self.relabel_pod(b),
                6 => self.relabel_namespace(b),
                7 if pods < MAX_PODS => self.add_pod(b)?,
                8 if pods > MIN_PODS => self.delete_pod(b),
                _ => continue,
            };
            return Ok(what);
        }
    }

    fn namespace_labels(&mut self) -> Labels {
        let mut labels = Labels::new();
        labels.insert("team".into(), self.pick(&TEAMS).to_string());
        labels
    }

    fn pod_labels(&mut self) -> Labels {
        let mut labels = Labels::new();
        labels.insert("app".into(), self.pick(&APPS).to_string());
        if self.rng.random_bool(0.5) {
            labels.insert("tier".into(), self.pick(&TIERS).to_string());
        }
        labels
    }

    fn add_pod(&mut self, b: &mut WorldBuilder) -> anyhow::Result<String> {
        let ns = *self.pick(&NAMESPACES);
        let key = format!("{ns}/p{}", self.next_pod);
        self.next_pod += 1;
        let labels = self.pod_labels();
        let node = self.rng.random_range(0..self.nodes);
        b.pod(&key, labels.clone(), node, pod_ports())?;
        Ok(format!("add pod {key} on node {node} {labels:?}"))
    }

    fn delete_pod(&mut self, b: &mut WorldBuilder) -> String {
        let keys: Vec<String> = b.world.pods.keys().cloned().collect();
        let key = self.pick(&keys).clone();
        b.world.pods.shift_remove(&key);
        format!("delete pod {key}")
    }

    fn relabel_pod(&mut self, b: &mut WorldBuilder) -> String {
        let keys: Vec<String> = b.world.pods.keys().cloned().collect();
        let key = self.pick(&keys).clone();
        let labels = self.pod_labels();
        let pod = b.world.pods.get_mut(&key).expect("picked from the keys");
        pod.labels = labels.clone();
        format!("relabel pod {key} {labels:?}")
    }

    fn relabel_namespace(&mut self, b: &mut WorldBuilder) -> String {
        let ns = *self.pick(&NAMESPACES);
        let mut labels = self.namespace_labels();
        labels.insert(crate::scenario::NAMESPACE_NAME_LABEL.into(), ns.to_string());
        b.world.namespaces.insert(ns.to_string(), labels.clone());
        format!("relabel namespace {ns} {labels:?}")
    }

    fn add_policy(&mut self, b: &mut WorldBuilder) -> anyhow::Result<String> {
        let ns = *self.pick(&NAMESPACES);
        let name = format!("np{}", self.next_policy);
        self.next_policy += 1;
        let doc = self.policy(b, ns, &name);
        b.apply(&doc).context("generated policy")?;
        Ok(format!("add policy {ns}/{name}"))
    }

    fn edit_policy(&mut self, b: &mut WorldBuilder) -> anyhow::Result<String> {
        let keys: Vec<String> = b.world.policies.keys().cloned().collect();
        let key = self.pick(&keys).clone();
        let (ns, name) = key.split_once('/').expect("policy keys are ns/name");
        let doc = self.policy(b, ns, name);
        b.apply(&doc).context("generated policy")?;
        Ok(format!("edit policy {key}"))
    }

    fn delete_policy(&mut self, b: &mut WorldBuilder) -> String {
        let keys: Vec<String> = b.world.policies.keys().cloned().collect();
        let key = self.pick(&keys).clone();
        b.world.policies.remove(&key);
        format!("delete policy {key}")
    }

    fn selector(&mut self) -> Value {
        match self.rng.random_range(0..10) {
            0 | 1 => json!({}),
            2..=6 => json!({"matchLabels": {"app": self.pick(&APPS)}}),
            _ => {
                let op = *self.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
                let mut e = json!({"key": "tier", "operator": op});
                if matches!(op, "In" | "NotIn") {
                    e["values"] = json!([self.pick(&TIERS)]);
                }
                json!({"matchExpressions": [e]})
            }
        }
    }

    fn peer(&mut self, b: &WorldBuilder) -> Value {
        match self.rng.random_range(0..8) {
            0..=2 => json!({"podSelector": self.selector()}),
            3 => {
                let sel = if self.rng.random_bool(0.3) {
                    json!({})
                } else {
                    json!({"matchLabels": {"team": self.pick(&TEAMS)}})
                };
                json!({"namespaceSelector": sel})
            }
            4 | 5 => json!({
                "namespaceSelector": {"matchLabels": {"team": self.pick(&TEAMS)}},
                "podSelector": self.selector(),
            }),
            _ => {
                let ips: Vec<std::net::Ipv4Addr> = b.world.pods.values().map(|p| p.ip).collect();
                let ip = *self.pick(&ips);
                if self.rng.random_bool(0.5) {
                    json!({"ipBlock": {"cidr": format!("{ip}/32")}})
                } else {
                    let node = ip.octets()[2];
                    json!({"ipBlock": {"cidr": format!("10.244.{node}.0/24"),
                                       "except": [format!("{ip}/32")]}})
                }
            }
        }
    }

    fn ports(&mut self) -> Option<Value> {
        if self.rng.random_bool(0.4) {
            return None;
        }
        let n = self.rng.random_range(1..=2);
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(match self.rng.random_range(0..6) {
                0 => json!({"port": 80, "protocol": "TCP"}),
                1 => json!({"port": 81, "protocol": "UDP"}),
                2 => json!({"port": "serve-80-tcp"}),
                3 => json!({"port": "serve-81-udp", "protocol": "UDP"}),
                4 => json!({"protocol": "UDP"}),
                _ => json!({"port": 80, "endPort": 81, "protocol": "TCP"}),
            });
        }
        Some(Value::Array(out))
    }

    fn rules(&mut self, b: &WorldBuilder, peers_key: &str) -> Value {
        let n = self.rng.random_range(0..=2);
        let mut rules = Vec::new();
        for _ in 0..n {
            let mut rule = serde_json::Map::new();
            if self.rng.random_bool(0.8) {
                let peers: Vec<Value> = (0..self.rng.random_range(1..=2))
                    .map(|_| self.peer(b))
                    .collect();
                rule.insert(peers_key.into(), Value::Array(peers));
            }
            if let Some(ports) = self.ports() {
                rule.insert("ports".into(), ports);
            }
            rules.push(Value::Object(rule));
        }
        Value::Array(rules)
    }

    /// A NetworkPolicy document (YAML) named `ns/name`.
    fn policy(&mut self, b: &WorldBuilder, ns: &str, name: &str) -> String {
        const TYPES: [&[&str]; 3] = [&["Ingress"], &["Egress"], &["Ingress", "Egress"]];
        let types = *self.pick(&TYPES);
        let mut spec = BTreeMap::new();
        spec.insert("podSelector", self.selector());
        spec.insert("policyTypes", json!(types));
        if types.contains(&"Ingress") {
            spec.insert("ingress", self.rules(b, "from"));
        }
        if types.contains(&"Egress") {
            spec.insert("egress", self.rules(b, "to"));
        }
        let doc = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        serde_yaml_ng::to_string(&doc).expect("JSON values serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_long_random_walk_stays_valid_and_bounded() {
        let mut g = Gen::new(XorShiftRng::seed_from_u64(7), 2);
        let mut b = g.initial().unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let what = g.change(&mut b).unwrap();
            kinds.insert(what.split(' ').take(2).collect::<Vec<_>>().join(" "));
            assert!((MIN_PODS..=MAX_PODS).contains(&b.world.pods.len()));
            assert!(b.world.policies.len() <= MAX_POLICIES);
            // Every generated policy is judged without error.
            crate::chaos::oracle::Oracle::new(&b.world).unwrap();
        }
        assert_eq!(kinds.len(), 7, "every kind of change happened: {kinds:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_walk() {
        let walk = |seed| {
            let mut g = Gen::new(XorShiftRng::seed_from_u64(seed), 2);
            let mut b = g.initial().unwrap();
            (0..50)
                .map(|_| g.change(&mut b).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(walk(3), walk(3));
        assert_ne!(walk(3), walk(4));
    }
}
