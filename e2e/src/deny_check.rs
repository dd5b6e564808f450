//! `--check-deny-logs`: after a step's probes, every probe the expectation denies must have
//! exactly one deny line, and no allowed probe any. A probe's line is found by its flow
//! (protocol, source address and port, destination pod address and port: a ClusterIP is
//! already translated to the pod when policy drops the packet). The line must come from the
//! node that dropped it (the source pod's node for `egress`, the destination's for `ingress`;
//! the log it is in and its `node` field agree), name the source and destination pods, and
//! list as `policies` exactly the policies that isolate the pod on that side in that
//! direction — computed here from the scenario's own policies and pod labels, not from the
//! agent — which also means that pod must be isolated in the direction the line says.
//!
//! A probe to a port its target does not serve fails whatever policy says (nothing answers),
//! so the expectation's "denied" says nothing about policy there: such a probe must not be
//! logged when no policy isolates either end, and is not checked otherwise (telling whether
//! policy would have allowed it takes the policy evaluation the check avoids).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::networking::v1::NetworkPolicy;
use netpol_agent::model::{validate, IpFamily};

use crate::cluster::{node_name, Cluster};
use crate::expect::TruthTable;
use crate::probe::SourcePorts;
use crate::scenario::{PortKey, World};

/// How long lines may take to appear after the probes ended.
const SETTLE: Duration = Duration::from_secs(2);

/// Per pod, the policies isolating it: `(ingress, egress)`, each `ns/name`, sorted (the
/// agent lists them in key order too).
type Isolation = BTreeMap<String, (Vec<String>, Vec<String>)>;

fn isolation(world: &World) -> anyhow::Result<Isolation> {
    let mut policies = Vec::new();
    for (key, doc) in &world.policies {
        let np: NetworkPolicy =
            serde_yaml_ng::from_str(doc).map_err(|e| anyhow::anyhow!("policy {key}: {e}"))?;
        let info =
            validate::network_policy(&np).map_err(|e| anyhow::anyhow!("policy {key}: {e}"))?;
        policies.push(info);
    }
    let mut out = BTreeMap::new();
    for (key, pod) in &world.pods {
        let (mut ingress, mut egress) = (Vec::new(), Vec::new());
        for p in &policies {
            if p.key.namespace != pod.namespace || !p.pod_selector.matches(&pod.labels) {
                continue;
            }
            let name = format!("{}/{}", p.key.namespace, p.key.name);
            if p.ingress.is_some() {
                ingress.push(name.clone());
            }
            if p.egress.is_some() {
                egress.push(name);
            }
        }
        ingress.sort();
        egress.sort();
        out.insert(key.clone(), (ingress, egress));
    }
    Ok(out)
}

/// When a line's `policies` is a ClusterNetworkPolicy (`Admin/<name>` or `Baseline/<name>`;
/// namespaces are never capitalised): whether the scenario has that policy in that tier.
fn cluster_denier(world: &World, policies: &serde_json::Value) -> Option<Result<(), String>> {
    let (tier, name) = policies.as_str()?.split_once('/')?;
    if tier != "Admin" && tier != "Baseline" {
        return None;
    }
    let Some(doc) = world.cluster_policies.get(name) else {
        return Some(Err(format!(
            "names ClusterNetworkPolicy {name}, which the scenario does not have"
        )));
    };
    let spec_tier = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(doc)
        .ok()
        .and_then(|v| v["spec"]["tier"].as_str().map(str::to_string));
    Some(match spec_tier {
        Some(t) if t == tier => Ok(()),
        other => Err(format!(
            "names ClusterNetworkPolicy {tier}/{name}, whose tier is {other:?}"
        )),
    })
}

/// One probe as a deny line names its flow.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FlowKey {
    protocol: String,
    src_ip: String,
    src_port: u64,
    dst_ip: String,
    dst_port: u64,
}

fn flow_of(v: &serde_json::Value) -> Option<FlowKey> {
    Some(FlowKey {
        protocol: v["protocol"].as_str()?.to_string(),
        src_ip: v["src_ip"].as_str()?.to_string(),
        src_port: v["src_port"].as_u64()?,
        dst_ip: v["dst_ip"].as_str()?.to_string(),
        dst_port: v["dst_port"].as_u64()?,
    })
}

/// A line for `flow` written before `marks` (a previous step's), to tell a reused flow
/// from a missing line.
fn logged_before(
    cluster: &Cluster,
    marks: &[u64],
    flow: &FlowKey,
) -> Option<(String, serde_json::Value)> {
    cluster
        .deny_lines_before(marks)
        .into_iter()
        .find(|(_, line)| flow_of(line).as_ref() == Some(flow))
}

/// What the check found for one step.
pub struct Checked {
    /// Empty: all good.
    pub problems: Vec<String>,
    /// Denied probes, each of which had to be logged.
    pub denied: usize,
    /// Allowed probes (and probes of unserved ports no policy isolates), none of which could
    /// be.
    pub allowed: usize,
    /// Probes of unserved ports where policy isolates an end: not checked.
    pub unchecked: usize,
}

/// Checks the deny lines written since `marks` against the probes of one step.
pub fn check(
    cluster: &Cluster,
    world: &World,
    expect: &BTreeMap<PortKey, TruthTable>,
    families: &[IpFamily],
    ports: &SourcePorts,
    marks: &[u64],
) -> Checked {
    let isolated = match isolation(world) {
        Ok(i) => i,
        Err(e) => {
            return Checked {
                problems: vec![format!("cannot read the step's policies: {e:#}")],
                denied: 0,
                allowed: 0,
                unchecked: 0,
            }
        }
    };
    let mut problems = Vec::new();
    let mut unchecked = 0;
    // (probe, its flow, allowed?)
    let mut probes = Vec::new();
    for &family in families {
        for (key, table) in expect {
            for (from, to, allowed) in table.pairs() {
                let (Some(src), Some(dst)) = (cluster.pods.get(from), cluster.pods.get(to)) else {
                    continue;
                };
                let Some(port) = ports
                    .get(&(family, *key))
                    .and_then(|p| p.get(&(from.to_string(), to.to_string())))
                else {
                    problems.push(format!("{key} {from} -> {to}: the probe never left"));
                    continue;
                };
                let served = dst
                    .pod
                    .ports
                    .iter()
                    .any(|p| p.port == key.port && p.protocol == key.protocol);
                let (from_isolated, to_isolated) = (
                    isolated.get(from).is_some_and(|i| !i.1.is_empty()),
                    isolated.get(to).is_some_and(|i| !i.0.is_empty()),
                );
                let allowed = match (served, allowed) {
                    (true, allowed) => allowed,
                    // Unanswered whatever policy says: no policy in the way means no line.
                    // (A ClusterNetworkPolicy may deny it, and telling whether one does takes
                    // the evaluation the check avoids.)
                    (false, _)
                        if !from_isolated && !to_isolated && world.cluster_policies.is_empty() =>
                    {
                        true
                    }
                    (false, _) => {
                        unchecked += 1;
                        continue;
                    }
                };
                let flow = FlowKey {
                    protocol: key.protocol.as_str().to_ascii_lowercase(),
                    src_ip: src.pod.addr(family).to_string(),
                    src_port: u64::from(*port),
                    dst_ip: dst.pod.addr(family).to_string(),
                    dst_port: u64::from(key.port),
                };
                probes.push((*key, from.to_string(), to.to_string(), flow, allowed));
            }
        }
    }
    // Wait until every denied probe has a line (or give up after SETTLE).
    let start = Instant::now();
    let by_flow = loop {
        let mut by_flow: BTreeMap<FlowKey, Vec<(String, serde_json::Value)>> = BTreeMap::new();
        for (node, line) in cluster.deny_lines_since(marks) {
            if let Some(f) = flow_of(&line) {
                by_flow.entry(f).or_default().push((node, line));
            }
        }
        let complete = probes
            .iter()
            .all(|(_, _, _, f, allowed)| *allowed || by_flow.contains_key(f));
        if complete || start.elapsed() > SETTLE {
            break by_flow;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (key, from, to, flow, allowed) in &probes {
        let lines = by_flow.get(flow).map(Vec::as_slice).unwrap_or(&[]);
        let what = format!("{key} {from} -> {to} (source port {})", flow.src_port);
        if *allowed {
            if let Some((node, line)) = lines.first() {
                problems.push(format!(
                    "{what}: allowed, but {node} logged it denied: {line}"
                ));
            }
            continue;
        }
        let [(file_node, line)] = lines else {
            problems.push(if lines.is_empty() {
                match logged_before(cluster, marks, flow) {
                    Some((node, line)) => format!(
                        "{what}: denied, but not logged in this step: {node} logged the same \
                         flow before it (within the agent's dedup window the flow is not \
                         logged again; the probe reused a source port): {line}"
                    ),
                    None => format!("{what}: denied, but no node logged it"),
                }
            } else {
                format!("{what}: denied and logged {} times: {lines:?}", lines.len())
            });
            continue;
        };
        let direction = line["direction"].as_str().unwrap_or("");
        let (side, policies) = match direction {
            "egress" => (from, isolated.get(from).map(|i| &i.1)),
            "ingress" => (to, isolated.get(to).map(|i| &i.0)),
            other => {
                problems.push(format!("{what}: direction {other:?} in {line}"));
                continue;
            }
        };
        let want_node = node_name(cluster.pods[side.as_str()].pod.node);
        let want_policies = policies.map(|p| p.join(",")).unwrap_or_default();
        let mut wrong = Vec::new();
        if *file_node != want_node || line["node"] != want_node.as_str() {
            wrong.push(format!(
                "logged by {file_node} (node field {}), the {direction} side is on {want_node}",
                line["node"]
            ));
        }
        if line["src"] != from.as_str() || line["dst"] != to.as_str() {
            wrong.push(format!("names {} -> {}", line["src"], line["dst"]));
        }
        if let Some(cnp) = cluster_denier(world, &line["policies"]) {
            // A ClusterNetworkPolicy's Deny rule dropped it: the line names that policy (as
            // `<tier>/<name>`), which must exist in the scenario with that tier, and its chain.
            if let Err(e) = cnp {
                wrong.push(e);
            }
            let chain = line["chain"].as_str().unwrap_or("");
            let want_prefix = if direction == "ingress" {
                "cali-pi-"
            } else {
                "cali-po-"
            };
            if !chain.starts_with(want_prefix) {
                wrong.push(format!(
                    "a ClusterNetworkPolicy drop in chain {chain:?}, not a {want_prefix} chain"
                ));
            }
        } else if want_policies.is_empty() {
            wrong.push(format!("{side} is not isolated for {direction}"));
        } else if line["policies"] != want_policies.as_str() {
            wrong.push(format!(
                "policies {} where {want_policies} isolate {side} for {direction}",
                line["policies"]
            ));
        }
        if !wrong.is_empty() {
            problems.push(format!("{what}: {}", wrong.join("; ")));
        }
    }
    let denied = probes.iter().filter(|p| !p.4).count();
    Checked {
        problems,
        denied,
        allowed: probes.len() - denied,
        unchecked,
    }
}
