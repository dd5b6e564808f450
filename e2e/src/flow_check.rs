//! `run --check-flow-logs`: after a step's probes, every probe must be in the flow records
//! (`GET /flows`, docs/operations/flow-logs.md) of the node(s) whose policy decided it, saying
//! what `netpol-agent explain` says of that flow, and no record of the step may claim a flow
//! that was not sent.
//!
//! Which node records what follows from where the flow-log copies sit
//! (`src/rules/flow_log.rs`): in the workload chains and the policy chains they jump to, so a
//! node reports exactly the directions it enforces.
//! - **Egress** (`reporter` `Src`) at the source pod's node, for every probe that left: the
//!   source's `cali-fw-` chain sees every new connection of the pod.
//! - **Ingress** (`reporter` `Dst`) at the destination pod's node, exactly when egress let the
//!   packet through (a packet its own node dropped never reaches the destination's chains).
//!   Two pods on one node: that node records both directions.
//!
//! What a direction's record must say comes from explain's verdict for the post-DNAT flow
//! (`explain_check::probe_flow`, the agent's own evaluator), per the tier that decided:
//! - no tier decided (no NetworkPolicy isolates the pod, no ClusterNetworkPolicy matched):
//!   `Allow`, verdict "no policy isolates the pod", no policy;
//! - NetworkPolicy allowed: `Allow`, verdict "rule", exactly that policy with the Kubernetes
//!   rule index explain names (the first allow the kernel meets);
//! - NetworkPolicy denied: `Deny`, verdict "isolated, no rule allowed", the isolating
//!   policies (rule index -1);
//! - a ClusterNetworkPolicy tier decided: the agent renders no flow-log copy in those chains
//!   yet (docs/operations/flow-logs.md, "Not done yet"), so a record is not required and such
//!   directions are counted apart; a record there must name that ClusterNetworkPolicy.
//!
//! Every record also names both pods (namespace and name), the addresses, the destination
//! port, the protocol and the node that served it.
//!
//! A Service probe of a port the Service does not declare is not DNATed: its flow is to the
//! ClusterIP, no pod, so only egress is decided, and only where kube-proxy lets it reach our
//! chains (iptables mode: required; nftables mode rejects it first: no record may exist).
//!
//! Telling steps apart: records aggregate connections per interval and carry no source port,
//! so a step's records are told by time: those whose `end_time` (the kernel's time of the
//! newest connection in it) is at or after the start of the step's last probe round. Nothing
//! but probes opens connections between pods, so each such record must match a probe of the
//! step, even one that began in an earlier step and was continued in this one (its key then
//! is that probe's key too).
//!
//! Naming: the kernel may log a packet before the agent has read a pod that was just created
//! on another node (that node's kernel needs nothing new to drop or pass it, so it counts as
//! converged); the agent names such an end again when the record is read. The check reads
//! until every required record is there with both ends named, up to [`SETTLE`], so a record
//! still unnamed after that is a real attribution defect.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime};

use netpol_agent::model::IpFamily;
use netpol_agent::verdict::{Action, DirectionVerdict, Endpoint, NpOutcome, TierDetail};
use serde_json::Value;

use crate::cluster::{node_name, Cluster, FLOWS_PORT};
use crate::explain_check::{load_state, probe_flow};
use crate::family::addr_of;
use crate::netns::in_netns;
use crate::probe::SourcePorts;
use crate::scenario::{PortKey, Step, Target};
use crate::services::ServiceProxy;

/// How long records may take to appear, and to name both ends, after the probes ended.
pub(crate) const SETTLE: Duration = Duration::from_secs(3);

/// One direction's record as a probe makes it: which node served it and the flow it names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RecordKey {
    pub(crate) node: String,
    /// `Src` (egress) or `Dst` (ingress).
    pub(crate) reporter: &'static str,
    proto: String,
    src_ip: String,
    dst_ip: String,
    dst_port: u64,
}

/// A policy as `policies.enforced_policies[]` names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Enforced {
    kind: String,
    namespace: String,
    name: String,
    action: String,
    rule_index: i64,
}

/// What one direction's record must say.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    /// Required: a NetworkPolicy decided, or none isolates the pod.
    Record {
        action: &'static str,
        verdict: &'static str,
        policies: Vec<Enforced>,
    },
    /// A ClusterNetworkPolicy decided (`Admin`/`Baseline`, its name, allow or deny): not
    /// required (no flow-log copy in those chains yet), but a record must name it.
    Cluster {
        tier: &'static str,
        name: String,
        action: &'static str,
    },
}

impl Want {
    fn describe(&self) -> String {
        match self {
            Want::Record {
                action,
                verdict,
                policies,
            } => {
                let names: Vec<String> = policies
                    .iter()
                    .map(|p| format!("{}/{} rule {}", p.namespace, p.name, p.rule_index))
                    .collect();
                format!("{action} ({verdict}) [{}]", names.join(", "))
            }
            Want::Cluster { tier, name, action } => {
                format!("{action} by ClusterNetworkPolicy {tier}/{name}")
            }
        }
    }
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    }
}

/// What explain says one direction's record must hold; `None` when the direction is not
/// policed at all (no record).
fn want_of(d: &DirectionVerdict) -> Option<Want> {
    if d.unpoliced.is_some() {
        return None;
    }
    let np = |namespace: &str, name: &str, action: &str, rule_index: i64| Enforced {
        kind: "NetworkPolicy".into(),
        namespace: namespace.into(),
        name: name.into(),
        action: action.into(),
        rule_index,
    };
    // The tiers ran in order and the last one decided, or none did (allowed by the profile).
    let decider = d.tiers.last().filter(|t| t.decision.is_some());
    Some(match decider.map(|t| &t.detail) {
        None => Want::Record {
            action: "Allow",
            verdict: "no policy isolates the pod",
            policies: Vec::new(),
        },
        Some(TierDetail::NetworkPolicy(report)) => match &report.outcome {
            NpOutcome::Allowed(m) => Want::Record {
                action: "Allow",
                verdict: "rule",
                policies: vec![np(
                    &m.policy.namespace,
                    &m.policy.name,
                    "Allow",
                    i64::try_from(m.rule).unwrap_or(i64::MAX),
                )],
            },
            NpOutcome::Denied { .. } => {
                let mut policies: Vec<Enforced> = report
                    .policies
                    .iter()
                    .map(|(k, _)| np(&k.namespace, &k.name, "Deny", -1))
                    .collect();
                policies.sort();
                Want::Record {
                    action: "Deny",
                    verdict: "isolated, no rule allowed",
                    policies,
                }
            }
            NpOutcome::NotIsolated { .. } => Want::Record {
                action: "Allow",
                verdict: "no policy isolates the pod",
                policies: Vec::new(),
            },
        },
        Some(TierDetail::Cluster(c)) => Want::Cluster {
            tier: match c.tier {
                netpol_agent::model::Tier::Admin => "Admin",
                netpol_agent::model::Tier::Baseline => "Baseline",
            },
            name: c
                .matched
                .as_ref()
                .map(|m| m.policy.clone())
                .unwrap_or_default(),
            action: action_name(d.action),
        },
    })
}

/// One expected direction of one probe.
pub(crate) struct Expected {
    /// `ns/pod -> ns/pod proto/port (family)`, for messages.
    pub(crate) what: String,
    pub(crate) key: RecordKey,
    src: String,
    dst: String,
    want: Want,
    /// A record must exist (otherwise one is checked only if present).
    pub(crate) required: bool,
}

/// The records one node served, each with the key it names (`None`: a field is missing).
pub(crate) fn record_key(node: &str, r: &Value) -> Option<RecordKey> {
    Some(RecordKey {
        node: node.to_string(),
        reporter: match r["reporter"].as_str()? {
            "Src" => "Src",
            "Dst" => "Dst",
            _ => return None,
        },
        proto: r["proto"].as_str()?.to_string(),
        src_ip: r["source_ip"].as_str()?.to_string(),
        dst_ip: r["dest_ip"].as_str()?.to_string(),
        dst_port: r["dest_port"].as_u64()?,
    })
}

fn enforced_of(r: &Value) -> Vec<Enforced> {
    let mut out: Vec<Enforced> = r["policies"]["enforced_policies"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|p| Enforced {
            kind: p["kind"].as_str().unwrap_or("").to_string(),
            namespace: p["namespace"].as_str().unwrap_or("").to_string(),
            name: p["name"].as_str().unwrap_or("").to_string(),
            action: p["action"].as_str().unwrap_or("").to_string(),
            rule_index: p["rule_index"].as_i64().unwrap_or(i64::MIN),
        })
        .collect();
    out.sort();
    out
}

/// `ns/name` of one end, or empty when the record names no pod there (no name).
fn names(r: &Value, side: &str) -> String {
    let ns = r[format!("{side}_namespace")].as_str().unwrap_or("");
    let name = r[format!("{side}_name")].as_str().unwrap_or("");
    if name.is_empty() {
        String::new()
    } else {
        format!("{ns}/{name}")
    }
}

/// Whether the record names the pods `e` expects (a ClusterIP end names none).
fn named(e: &Expected, r: &Value) -> bool {
    (e.src.is_empty() || !names(r, "source").is_empty())
        && (e.dst.is_empty() || !names(r, "dest").is_empty())
}

/// Differences between a record and what explain says it must hold (empty: it agrees).
fn disagreements(e: &Expected, r: &Value) -> Vec<String> {
    let mut wrong = Vec::new();
    if r["node"] != e.key.node.as_str() {
        wrong.push(format!(
            "node field {} on {}'s server",
            r["node"], e.key.node
        ));
    }
    let (src, dst) = (names(r, "source"), names(r, "dest"));
    if src != e.src || dst != e.dst {
        wrong.push(format!("names {src} -> {dst}"));
    }
    match &e.want {
        Want::Record {
            action,
            verdict,
            policies,
        } => {
            let have = enforced_of(r);
            if r["action"] != *action || r["verdict"] != *verdict || &have != policies {
                wrong.push(format!(
                    "says {} ({}) {:?}, explain says {}",
                    r["action"],
                    r["verdict"],
                    have,
                    e.want.describe()
                ));
            }
        }
        Want::Cluster { tier, name, action } => {
            let ok = r["action"] == *action
                && r["policies"]["enforced_policies"]
                    .as_array()
                    .is_some_and(|ps| {
                        ps.iter().any(|p| {
                            p["kind"] == "ClusterNetworkPolicy"
                                && p["name"] == name.as_str()
                                && p["tier"].as_str().is_some_and(|t| {
                                    t.to_ascii_lowercase().contains(&tier.to_ascii_lowercase())
                                })
                        })
                    });
            if !ok {
                wrong.push(format!(
                    "says {} {}, explain says {}",
                    r["action"],
                    r["policies"],
                    e.want.describe()
                ));
            }
        }
    }
    wrong
}

/// `GET /flows?since=…` from node `i`'s agent, inside that node's namespace.
fn fetch(cluster: &Cluster, i: usize, since: u64) -> anyhow::Result<Vec<Value>> {
    let netns = cluster.node_netns(i);
    in_netns(&netns.handle, || -> anyhow::Result<Vec<Value>> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, FLOWS_PORT));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET /flows?since={since} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)?;
        let text = String::from_utf8_lossy(&reply);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no HTTP header end in {} bytes", reply.len()))?;
        let status = head.split_whitespace().nth(1).unwrap_or("");
        anyhow::ensure!(status == "200", "GET /flows: {status}: {}", body.trim());
        Ok(serde_json::from_str(body)?)
    })?
}

/// Every node's records that end at or after `since`, with the node that served them.
pub(crate) fn records_since(
    cluster: &Cluster,
    since: SystemTime,
) -> anyhow::Result<Vec<(String, Value)>> {
    let secs = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..cluster.node_count() {
        let node = node_name(i);
        for r in fetch(cluster, i, secs).map_err(|e| anyhow::anyhow!("{node}: {e:#}"))? {
            let end = r["end_time"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(SystemTime::from);
            match end {
                Some(end) if end < since => {}
                // A record without a readable end is kept: it is reported as not matching.
                _ => out.push((node.clone(), r)),
            }
        }
    }
    Ok(out)
}

/// What the check found for one step.
pub struct Checked {
    /// Empty: all good.
    pub problems: Vec<String>,
    /// Records required and found (one per probe and deciding direction).
    pub matched: usize,
    /// Of those, directions recorded as denied.
    pub denied: usize,
    /// Directions a ClusterNetworkPolicy decided: not required.
    pub cluster_decided: usize,
    /// Records read in the step's window.
    pub records: usize,
}

/// The expected records of every probe that left in the step's last round.
fn expectations(
    cluster: &Cluster,
    target: Target,
    step: &Step,
    families: &[IpFamily],
    ports: &SourcePorts,
) -> anyhow::Result<Vec<Expected>> {
    let state = load_state(cluster)?;
    let mut out = Vec::new();
    for &family in families {
        for key in step.expect.keys() {
            let Some(sent) = ports.get(&(family, *key)) else {
                continue;
            };
            for (from, to) in sent.keys() {
                out.extend(expect_probe(
                    cluster, target, &state, family, key, from, to,
                )?);
            }
        }
    }
    Ok(out)
}

pub(crate) fn expect_probe(
    cluster: &Cluster,
    target: Target,
    state: &netpol_agent::verdict::State,
    family: IpFamily,
    pk: &PortKey,
    from: &str,
    to: &str,
) -> anyhow::Result<Vec<Expected>> {
    let (src, dst) = (&cluster.pods[from].pod, &cluster.pods[to].pod);
    let mut flow = probe_flow(cluster, family, from, to, pk)?;
    let mut dst_ip = dst.addr(family);
    let mut dst_name = to.to_string();
    let declared = dst
        .ports
        .iter()
        .any(|p| p.port == pk.port && p.protocol == pk.protocol);
    let mut required = true;
    if target == Target::Service && !declared {
        // kube-proxy DNATs only the ports the Service declares: a probe of another port
        // leaves for the ClusterIP itself, which is no pod (no ingress side, no name). In
        // iptables mode nothing stops it before our chains; nftables mode rejects it in its
        // own filter-forward hook, ahead of them, so no record may exist; IPVS mode delivers
        // it locally (INPUT), where a record is not required but must agree.
        match cluster.service_proxy() {
            ServiceProxy::Iptables => {}
            ServiceProxy::Nftables => return Ok(Vec::new()),
            ServiceProxy::Ipvs => required = false,
        }
        dst_ip = addr_of(dst.cluster_ip, family);
        dst_name = String::new();
        flow.dst = Endpoint::Ip(dst_ip);
    }
    let resolved = state
        .resolve(&flow)
        .map_err(|e| anyhow::anyhow!("explain {from} -> {to} {pk}: {e}"))?;
    let verdict = state.explain(&resolved);
    let key = |node: usize, reporter| RecordKey {
        node: node_name(node),
        reporter,
        proto: pk.protocol.as_str().to_ascii_lowercase(),
        src_ip: src.addr(family).to_string(),
        dst_ip: dst_ip.to_string(),
        dst_port: u64::from(pk.port),
    };
    let what = format!(
        "{from} -> {to} {pk} ({})",
        crate::family::family_name(family)
    );
    let mut out = Vec::new();
    if let Some(want) = want_of(&verdict.egress) {
        out.push(Expected {
            what: format!("{what} egress"),
            key: key(src.node, "Src"),
            src: from.to_string(),
            dst: dst_name.clone(),
            required: required && matches!(want, Want::Record { .. }),
            want,
        });
    }
    // Ingress is decided only for packets egress let through.
    if verdict.egress.action == Action::Allow {
        if let Some(want) = want_of(&verdict.ingress) {
            out.push(Expected {
                what: format!("{what} ingress"),
                key: key(dst.node, "Dst"),
                src: from.to_string(),
                dst: dst_name.clone(),
                required: required && matches!(want, Want::Record { .. }),
                want,
            });
        }
    }
    Ok(out)
}

/// Checks the records of the step's last probe round (begun at `round_start`, its probes'
/// source ports in `ports`) against explain's verdict for every probe.
pub fn check(
    cluster: &Cluster,
    target: Target,
    step: &Step,
    families: &[IpFamily],
    ports: &SourcePorts,
    round_start: SystemTime,
) -> Checked {
    let mut checked = Checked {
        problems: Vec::new(),
        matched: 0,
        denied: 0,
        cluster_decided: 0,
        records: 0,
    };
    let expected = match expectations(cluster, target, step, families, ports) {
        Ok(e) => e,
        Err(e) => {
            checked
                .problems
                .push(format!("cannot compute explain's verdicts: {e:#}"));
            return checked;
        }
    };
    // Read until every required record is there with both ends named (or SETTLE passed).
    let start = Instant::now();
    let records = loop {
        let read = records_since(cluster, round_start);
        let complete = read.as_ref().is_ok_and(|records| {
            let mut have: BTreeMap<RecordKey, Vec<&Value>> = BTreeMap::new();
            for (node, r) in records {
                if let Some(k) = record_key(node, r) {
                    have.entry(k).or_default().push(r);
                }
            }
            expected.iter().all(|e| {
                !e.required
                    || have
                        .get(&e.key)
                        .is_some_and(|rs| rs.iter().all(|r| named(e, r)))
            })
        });
        if complete || start.elapsed() > SETTLE {
            break read;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let records = match records {
        Ok(r) => r,
        Err(e) => {
            checked
                .problems
                .push(format!("cannot read the flow records: {e:#}"));
            return checked;
        }
    };
    checked.records = records.len();
    let mut by_key: BTreeMap<RecordKey, Vec<Value>> = BTreeMap::new();
    for (node, r) in records {
        match record_key(&node, &r) {
            Some(k) => by_key.entry(k).or_default().push(r),
            None => checked
                .problems
                .push(format!("{node}: a record without its flow: {r}")),
        }
    }
    for e in &expected {
        let found = by_key.remove(&e.key).unwrap_or_default();
        if found.is_empty() {
            match &e.want {
                Want::Cluster { .. } => checked.cluster_decided += 1,
                Want::Record { .. } if !e.required => {}
                Want::Record { .. } => checked.problems.push(format!(
                    "{}: no record at {} ({}), explain says {}",
                    e.what,
                    e.key.node,
                    e.key.reporter,
                    e.want.describe()
                )),
            }
            continue;
        }
        let mut ok = true;
        for r in &found {
            let wrong = disagreements(e, r);
            if !wrong.is_empty() {
                ok = false;
                checked.problems.push(format!(
                    "{}: record at {}: {}: {r}",
                    e.what,
                    e.key.node,
                    wrong.join("; ")
                ));
            }
        }
        match (&e.want, ok) {
            (Want::Cluster { .. }, _) => checked.cluster_decided += 1,
            (Want::Record { action, .. }, true) => {
                checked.matched += 1;
                if *action == "Deny" {
                    checked.denied += 1;
                }
            }
            (Want::Record { .. }, false) => {}
        }
    }
    for (key, rs) in by_key {
        for r in rs {
            checked.problems.push(format!(
                "a record at {} ({}) for a flow no probe of the step sent there: {r}",
                key.node, key.reporter
            ));
        }
    }
    checked
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn expected(want: Want) -> Expected {
        Expected {
            what: "x/a -> y/b TCP/80 (IPv4) ingress".into(),
            key: RecordKey {
                node: "node-1".into(),
                reporter: "Dst",
                proto: "tcp".into(),
                src_ip: "10.244.1.10".into(),
                dst_ip: "10.244.2.10".into(),
                dst_port: 80,
            },
            src: "x/a".into(),
            dst: "y/b".into(),
            required: matches!(want, Want::Record { .. }),
            want,
        }
    }

    fn record(action: &str, verdict: &str, policies: Value) -> Value {
        json!({
            "node": "node-1", "reporter": "Dst", "proto": "tcp",
            "source_ip": "10.244.1.10", "dest_ip": "10.244.2.10", "dest_port": 80,
            "source_namespace": "x", "source_name": "a",
            "dest_namespace": "y", "dest_name": "b",
            "action": action, "verdict": verdict,
            "policies": {"enforced_policies": policies, "pending_policies": []},
            "end_time": "2026-11-27T04:00:00.5Z",
        })
    }

    #[test]
    fn a_record_agrees_only_with_its_own_verdict() {
        let allow = Want::Record {
            action: "Allow",
            verdict: "rule",
            policies: vec![Enforced {
                kind: "NetworkPolicy".into(),
                namespace: "y".into(),
                name: "allow-x".into(),
                action: "Allow".into(),
                rule_index: 1,
            }],
        };
        let e = expected(allow);
        let good = record(
            "Allow",
            "rule",
            json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "allow-x",
                    "tier": "default", "action": "Allow", "rule_index": 1}]),
        );
        assert_eq!(record_key("node-1", &good), Some(e.key.clone()));
        assert!(disagreements(&e, &good).is_empty());
        assert!(named(&e, &good));
        let other_rule = record(
            "Allow",
            "rule",
            json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "allow-x",
                    "tier": "default", "action": "Allow", "rule_index": 0}]),
        );
        assert_eq!(disagreements(&e, &other_rule).len(), 1);
        let mut unnamed = good.clone();
        unnamed["source_name"] = json!("");
        assert!(!named(&e, &unnamed));
        assert_eq!(disagreements(&e, &unnamed).len(), 1, "names a -> b");
        let no_policy = Want::Record {
            action: "Allow",
            verdict: "no policy isolates the pod",
            policies: vec![],
        };
        let e = expected(no_policy);
        assert!(!disagreements(&e, &good).is_empty());
        assert!(disagreements(
            &e,
            &record("Allow", "no policy isolates the pod", json!([]))
        )
        .is_empty());
        let cnp = expected(Want::Cluster {
            tier: "Admin",
            name: "deny-all".into(),
            action: "Deny",
        });
        let cnp_record = record(
            "Deny",
            "rule",
            json!([{"kind": "ClusterNetworkPolicy", "namespace": "", "name": "deny-all",
                    "tier": "Admin", "action": "Deny", "rule_index": 0}]),
        );
        assert!(disagreements(&cnp, &cnp_record).is_empty());
        assert!(!disagreements(&cnp, &good).is_empty());
    }
}
