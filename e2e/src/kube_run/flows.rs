//! `run --kubeconfig --check-flow-logs`: after each step's confirming round, the flow records
//! of the agents on the nodes the step's pods run on (`netpol-agent flows --agent
//! http://127.0.0.1:PORT --since T --output json`, run in each agent's pod: the health server
//! listens on the node's loopback) must hold every probe of the round, with what the agent's
//! own explain said of it, and no record of the scenario's pods may claim a flow no probe
//! sent. The rules are the simulated clusters' (`crate::flow_check`, shared: which node
//! records which direction, what a record must say, which records of the window are carried
//! over from earlier rounds and steps); what differs here is where the inputs come from:
//! - what each direction's record must say comes from the explain answers of
//!   `--check-explain` ([`super::explain`]: `want_of_json`, the same reading as the simulated
//!   check's `want_of`), so this check implies that one;
//! - a real cluster carries other traffic: only records with an address of the scenario's
//!   pods or Services are read;
//! - a Service probe of a port its Service does not declare is not DNATed (it goes to the
//!   ClusterIP, no pod) and explain was asked about the pod: its records are left unjudged
//!   (counted as carried), where the simulated check knows the proxy mode and judges them.
//! - the client (`agnhost connect`) picks its source port, so a UDP probe may ride a 5-tuple
//!   conntrack still holds and start no connection (`Ends::client_ports`): records that saw
//!   traffic in the window (`last_active_time`) are read as well, as its only trace.
//!
//! The agents must run with flow logs on (`FELIX_FLOWLOGSENABLED=true`); an agent without
//! them answers 404, and the step fails saying so.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::explain::{Agents, Answer};
use super::report::Probe;
use super::ScenarioRun;
use crate::family::family_name;
use crate::flow_check::{
    in_window, judge, record_key, want_of_json, Checked, Earlier, Ends, RecordKey, Rounds, SETTLE,
};
use crate::scenario::Target;

/// The expected records of the round's probes, and the keys left unjudged (Service probes
/// of undeclared ports).
fn expectations(
    run: &ScenarioRun<'_>,
    probes: &[Probe],
    answers: &BTreeMap<Probe, Vec<Answer>>,
) -> (Vec<crate::flow_check::Expected>, BTreeSet<RecordKey>) {
    let mut out = Vec::new();
    let mut unjudged = BTreeSet::new();
    for p in probes {
        let (family, key, from, to) = p;
        let (Some(src), Some(dst), Some(answer)) = (
            run.live.get(from),
            run.live.get(to),
            answers.get(p).and_then(|a| a.first()),
        ) else {
            continue;
        };
        let (Some(src_ip), Some(dst_ip)) = (
            src.addr(*family, Target::Pod),
            dst.addr(*family, Target::Pod),
        ) else {
            continue;
        };
        let proto = key.protocol.as_str();
        if run.scenario.target == Target::Service && !run.serves(to, key) {
            if let Some(ip) = dst.addr(*family, Target::Service) {
                unjudged.insert(RecordKey::new(
                    &src.node, "Src", proto, src_ip, ip, key.port,
                ));
            }
            continue;
        }
        let labels = |name: &str| -> Vec<String> {
            run.world
                .pods
                .get(name)
                .map(|p| p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default()
        };
        let ends = Ends {
            what: format!("{from} -> {to} {key} ({})", family_name(*family)),
            src: run.names.pod(from),
            dst: run.names.pod(to),
            src_labels: labels(from),
            dst_labels: labels(to),
            src_key: RecordKey::new(&src.node, "Src", proto, src_ip, dst_ip, key.port),
            dst_key: RecordKey::new(&dst.node, "Dst", proto, src_ip, dst_ip, key.port),
            required: true,
            client_ports: true,
        };
        let raw = &answer.raw;
        out.extend(ends.expected(
            want_of_json(&raw["egress"]),
            raw["egress"]["verdict"] == "allow",
            want_of_json(&raw["ingress"]),
        ));
    }
    (out, unjudged)
}

/// The records of every node with a scenario pod that end, or saw traffic, at or after
/// `since` and have an address of the scenario's pods or Services, each with the node that
/// served it.
async fn records(
    run: &ScenarioRun<'_>,
    agents: &Agents,
    since: SystemTime,
) -> Result<Vec<(String, Value)>, String> {
    let nodes: BTreeSet<&str> = run.live.values().map(|l| l.node.as_str()).collect();
    let ours: BTreeSet<String> = run
        .live
        .values()
        .flat_map(|l| l.ips.iter().chain(&l.cluster_ips))
        .map(IpAddr::to_string)
        .collect();
    let secs = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let ours = &ours;
    let read: Vec<Result<Vec<(String, Value)>, String>> = stream::iter(nodes)
        .map(|node| async move {
            let agent = agents
                .get(node)
                .ok_or_else(|| format!("no ready agent pod on node {node}"))?;
            let (ns, pod) = (&agent.namespace, &agent.pod);
            let argv = vec![
                "netpol-agent".to_string(),
                "flows".into(),
                "--agent".into(),
                format!("http://127.0.0.1:{}", agent.health_port),
                "--since".into(),
                secs.to_string(),
                "--output".into(),
                "json".into(),
            ];
            let (out, err) = run
                .cluster
                .exec_capture(ns, pod, &agent.container, argv, None)
                .await
                .map_err(|e| format!("exec in {ns}/{pod} on {node}: {e:#}"))?;
            // `flows` prints what it could read (an empty list) and says on stderr which
            // agent it could not: that is this node's, the only one asked.
            if err.contains(": 404") {
                return Err(format!(
                    "the agent on {node} has flow logs off: the check needs \
                     FELIX_FLOWLOGSENABLED=true on the agents (docs/operations/flow-logs.md)"
                ));
            }
            let failed = err.contains("netpol-agent flows:");
            let list: Vec<Value> = match serde_json::from_str(out.trim()) {
                Ok(list) if !failed => list,
                _ => {
                    return Err(format!(
                        "`netpol-agent flows` in {ns}/{pod} on {node}: {}",
                        super::explain::said(&err)
                    ))
                }
            };
            Ok(list
                .into_iter()
                .filter(|r| {
                    [&r["source_ip"], &r["dest_ip"]]
                        .iter()
                        .any(|a| a.as_str().is_some_and(|a| ours.contains(a)))
                })
                .filter(|r| in_window(r, since))
                .map(|r| (node.to_string(), r))
                .collect())
        })
        .buffer_unordered(run.cfg.jobs.max(1))
        .collect()
        .await;
    let mut out = Vec::new();
    for r in read {
        out.extend(r?);
    }
    Ok(out)
}

/// Checks one step's confirming round; remembers its expectations in `earlier`.
pub async fn check(
    run: &ScenarioRun<'_>,
    agents: &Agents,
    probes: &[Probe],
    answers: &BTreeMap<Probe, Vec<Answer>>,
    rounds: Rounds,
    earlier: &mut Earlier,
) -> Checked {
    let (expected, unjudged) = expectations(run, probes, answers);
    // Read until the records agree (one may still be missing, or not name an end yet), up
    // to SETTLE; the last reading is the answer.
    let start = Instant::now();
    let checked = loop {
        let checked = match records(run, agents, rounds.last).await {
            Ok(mut list) => {
                let before = list.len();
                list.retain(|(node, r)| record_key(node, r).is_none_or(|k| !unjudged.contains(&k)));
                let mut c = judge(&expected, &list, rounds, earlier);
                c.carried += before - list.len();
                c.records = before;
                c
            }
            Err(e) => {
                let mut c = judge(&[], &[], rounds, earlier);
                c.problems
                    .push(format!("cannot read the flow records: {e}"));
                c
            }
        };
        if checked.problems.is_empty() || start.elapsed() > SETTLE {
            break checked;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    earlier.remember(&expected);
    checked
}
