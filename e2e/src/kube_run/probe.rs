//! One step's check on a real cluster: every ordered pair of the step's pods, per probed
//! protocol/port and family, probed with `agnhost connect` inside the client pod (one exec
//! per client pod and round, `--jobs` execs at a time); then the pairs that disagree with the
//! expectation probed again until they agree or the convergence window
//! (`--converge-timeout-secs`) closes (and at least once, even when the first full round
//! outlasted the window); then one last round of every pair, which must agree in full: a
//! denied pair that connects then fails the step at once, an allowed one that does not is
//! tried twice more (a datagram lost on a busy node is not a verdict).
//!
//! Enforcement time: for the pairs whose expected verdict differs from the previous step's
//! (the pairs the change is about, probed alone first, in rounds of their own), from the
//! step's last API write to the moment the first probe that saw the new verdict is known to
//! have tried: its exec's end for a connection, that end less the timeout for a blocked one
//! (its packet was sent by then). The step's figure is the slowest such pair. An exec goes
//! through the API server and the node's runtime (0.1 s on an idle node, seconds on a
//! saturated one), so the figure is an upper bound with that resolution, never an
//! underestimate.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use futures::stream::{self, StreamExt};

use super::api::RealCluster;
use super::report::{Probe, StepReport};
use super::ScenarioRun;
use super::{explain, flows};
use crate::expect::{Outcome, PortKey, Protocol};
use crate::flow_check::Rounds;
use crate::scenario::{Step, Target};

/// Pairs (per key) whose expected verdict changed from `previous` to `step`.
pub fn changed_pairs(previous: Option<&Step>, step: &Step) -> BTreeSet<(PortKey, String, String)> {
    let mut out = BTreeSet::new();
    let Some(previous) = previous else {
        return out;
    };
    for (key, table) in &step.expect {
        let Some(before) = previous.expect.get(key) else {
            continue;
        };
        for (from, to, want) in table.pairs() {
            if before.get(from, to).is_some_and(|was| was != want) {
                out.insert((*key, from.to_string(), to.to_string()));
            }
        }
    }
    out
}

/// Whether the pod network carries SCTP, and why not: a loopback SCTP connect in a running
/// pod. A kernel without SCTP refuses the socket ("protocol not supported"); with SCTP the
/// closed port answers with an ABORT (refused), which is the answer wanted here.
pub async fn sctp_offered(cluster: &RealCluster, ns: &str, pod: &str) -> (bool, String) {
    let argv = [
        "/agnhost",
        "connect",
        "127.0.0.1:9",
        "--timeout=2s",
        "--protocol=sctp",
    ]
    .map(String::from)
    .to_vec();
    let text = async {
        let (_, err) = cluster
            .exec_capture(ns, pod, super::objects::PROBER, argv, None)
            .await?;
        anyhow::Ok(err)
    };
    match tokio::time::timeout(Duration::from_secs(20), text).await {
        Ok(Ok(err)) => {
            let lower = err.to_ascii_lowercase();
            if lower.contains("protocol not supported") || lower.contains("not supported") {
                (
                    false,
                    format!("the nodes' kernel has no SCTP ({})", err.trim()),
                )
            } else {
                (true, String::new())
            }
        }
        Ok(Err(e)) => (false, format!("the SCTP check could not run: {e:#}")),
        Err(_) => (false, "the SCTP check did not return".into()),
    }
}

/// Targets per exec at most (a shell's argument list, and its processes at once).
const BATCH: usize = 16;

/// Probes `probes`: grouped by client pod into batches, `jobs` batches at a time; each result
/// with the latest moment its packets were certainly sent (see the module comment).
async fn probe_all(run: &ScenarioRun<'_>, probes: &[Probe]) -> Vec<(Probe, Instant, Outcome)> {
    let target = run.scenario.target;
    let timeout = run.cfg.probe_timeout;
    let mut by_source: BTreeMap<&str, Vec<&Probe>> = BTreeMap::new();
    for p in probes {
        by_source.entry(p.2.as_str()).or_default().push(p);
    }
    let batches: Vec<Vec<&Probe>> = by_source
        .into_values()
        .flat_map(|v| v.chunks(BATCH).map(<[&Probe]>::to_vec).collect::<Vec<_>>())
        .collect();
    let results: Vec<Vec<(Probe, Instant, Outcome)>> = stream::iter(batches)
        .map(|batch| async move {
            let src = &run.world.pods[&batch[0].2];
            let mut targets = Vec::new();
            let mut missing = Vec::new();
            for p in &batch {
                let (family, key, _, to) = p;
                match run.live.get(to).and_then(|l| l.addr(*family, target)) {
                    Some(addr) => targets.push((addr, key.port, key.protocol)),
                    None => missing.push(format!("{to} has no {family:?} address")),
                }
            }
            let outcomes = if missing.is_empty() {
                run.cluster
                    .probe_batch(&run.names.ns(&src.namespace), &src.name, &targets, timeout)
                    .await
            } else {
                vec![Outcome::WrongPeer(missing.join("; ")); batch.len()]
            };
            let ended = Instant::now();
            batch
                .into_iter()
                .zip(outcomes)
                .map(|(p, outcome)| {
                    let tried = match outcome {
                        Outcome::Blocked => ended.checked_sub(timeout).unwrap_or(ended),
                        _ => ended,
                    };
                    (p.clone(), tried, outcome)
                })
                .collect()
        })
        .buffer_unordered(run.cfg.jobs.max(1))
        .collect()
        .await;
    results.into_iter().flatten().collect()
}

/// Takes one round's results: each probe's latest outcome, and when it first agreed.
fn record(
    results: Vec<(Probe, Instant, Outcome)>,
    agrees: &dyn Fn(&Probe, &Outcome) -> bool,
    first_ok: &mut BTreeMap<Probe, Instant>,
    latest: &mut BTreeMap<Probe, Outcome>,
) {
    for (p, tried, outcome) in results {
        if agrees(&p, &outcome) {
            first_ok.entry(p.clone()).or_insert(tried);
        }
        latest.insert(p, outcome);
    }
}

/// Checks one step (see the module comment).
pub async fn check_step(
    run: &ScenarioRun<'_>,
    step: &Step,
    index: usize,
    t0: Instant,
    changed: &BTreeSet<(PortKey, String, String)>,
) -> StepReport {
    let mut rep = run.step_report(&step.name, index);
    let step_began = SystemTime::now();
    let mut confirmed_at = None;
    let mut probes: Vec<Probe> = Vec::new();
    let mut expected: BTreeMap<Probe, bool> = BTreeMap::new();
    for family in &run.families {
        for (key, table) in &step.expect {
            if key.protocol == Protocol::Sctp && !run.offer.sctp {
                continue;
            }
            for (from, to, want) in table.pairs() {
                let unserved = run.scenario.target == Target::Service
                    && run.live.get(to).is_some_and(|l| l.cluster_ips.is_empty());
                if unserved {
                    continue;
                }
                let p = (*family, *key, from.to_string(), to.to_string());
                expected.insert(p.clone(), want);
                probes.push(p);
            }
        }
    }
    let agrees = |p: &Probe, o: &Outcome| {
        !matches!(o, Outcome::WrongPeer(_)) && o.connected() == expected[p]
    };
    let mut first_ok: BTreeMap<Probe, Instant> = BTreeMap::new();
    let mut latest: BTreeMap<Probe, Outcome> = BTreeMap::new();
    let deadline = t0 + run.cfg.converge_timeout;
    let mut rounds = 0;
    // The pairs the change is about first, alone: small rounds, so their times are the
    // enforcement's and not a full round's.
    let mut pending: Vec<Probe> = probes
        .iter()
        .filter(|(_, key, from, to)| changed.contains(&(*key, from.clone(), to.clone())))
        .cloned()
        .collect();
    while !pending.is_empty() && Instant::now() < deadline {
        rounds += 1;
        record(
            probe_all(run, &pending).await,
            &agrees,
            &mut first_ok,
            &mut latest,
        );
        pending.retain(|p| !agrees(p, &latest[p]));
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut pending = probes.clone();
    let full_rounds_before = rounds;
    loop {
        rounds += 1;
        record(
            probe_all(run, &pending).await,
            &agrees,
            &mut first_ok,
            &mut latest,
        );
        pending.retain(|p| !agrees(p, &latest[p]));
        // A full round can outlast the window on a busy cluster: its disagreements get one
        // more try even then (a first UDP datagram lost, a server a moment from listening).
        if pending.is_empty() || (Instant::now() >= deadline && rounds > full_rounds_before + 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The confirming round: everything once more, now that every pair agreed. A denied pair
    // that connects now fails at once (policy let a packet through); an allowed one that
    // does not is tried twice more, as a lost datagram or a slow reply on a busy node is not
    // a policy's verdict.
    if pending.is_empty() {
        rounds += 1;
        confirmed_at = Some(SystemTime::now());
        for (p, _, outcome) in probe_all(run, &probes).await {
            latest.insert(p, outcome);
        }
        for _ in 0..2 {
            let again: Vec<Probe> = probes
                .iter()
                .filter(|p| expected[*p] && !agrees(p, &latest[*p]))
                .cloned()
                .collect();
            if again.is_empty() {
                break;
            }
            rounds += 1;
            for (p, _, outcome) in probe_all(run, &again).await {
                latest.insert(p, outcome);
            }
        }
    }
    rep.rounds = rounds;
    rep.probes = probes.len();
    let slowest = changed
        .iter()
        .flat_map(|(key, from, to)| {
            run.families
                .iter()
                .map(move |f| (*f, *key, from.clone(), to.clone()))
        })
        .filter_map(|p| first_ok.get(&p).map(|t| t.saturating_duration_since(t0)))
        .max();
    rep.enforcement = slowest;
    rep.record(&expected, &latest);
    if run.cfg.check_explain {
        let rounds = confirmed_at.map(|last| Rounds {
            first: step_began,
            last,
        });
        check_agents(run, &probes, &expected, rounds, &mut rep).await;
    }
    rep
}

/// `--check-explain` (see [`super::explain`]) and `--check-flow-logs` ([`super::flows`],
/// after a confirming round that began at `rounds.last`) for one step.
async fn check_agents(
    run: &ScenarioRun<'_>,
    probes: &[Probe],
    expected: &BTreeMap<Probe, bool>,
    rounds: Option<Rounds>,
    rep: &mut StepReport,
) {
    let agents = match run.cluster.agent_pods(&run.cfg.agent_selector).await {
        Ok(a) => a,
        Err(e) => {
            rep.explain_failed(vec![format!("{e:#}")]);
            return;
        }
    };
    let (answers, errors) = explain::ask(run, &agents, probes).await;
    let served = |p: &Probe| run.serves(&p.3, &p.1);
    let mut wrong = errors;
    wrong.extend(explain::judge(&answers, expected, &served));
    rep.explained = answers.len();
    rep.explained_nodes = answers
        .values()
        .flatten()
        .map(|a| a.node.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    rep.explain_failed(wrong);
    if let (true, Some(rounds)) = (run.cfg.check_flow_logs, rounds) {
        // The step's expectations are remembered for the next steps' windows, also when
        // this step's explain disagreed (its records are still the step's).
        let mut earlier = std::mem::take(&mut *run.flow_earlier.borrow_mut());
        let checked = flows::check(run, &agents, probes, &answers, rounds, &mut earlier).await;
        *run.flow_earlier.borrow_mut() = earlier;
        rep.flows_checked(&checked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn changed_pairs_are_the_ones_whose_verdict_moved() {
        let s = crate::scenario::parse(
            "name: t\nnamespaces: {x: {}}\npods: {x/a: {}, x/b: {}, x/c: {}}\nsteps:\n- {expect: {'*': {}}}\n- {expect: {'*': {deny: ['*->x/a']}}}\n- {add_pods: {x/d: {}}, expect: {'*': {deny: ['*->x/a']}}}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        assert!(changed_pairs(None, &s.steps[0]).is_empty());
        let c = changed_pairs(Some(&s.steps[0]), &s.steps[1]);
        let pairs: BTreeSet<(String, String)> =
            c.iter().map(|(_, f, t)| (f.clone(), t.clone())).collect();
        assert_eq!(
            pairs,
            BTreeSet::from([
                ("x/b".to_string(), "x/a".to_string()),
                ("x/c".to_string(), "x/a".to_string())
            ])
        );
        assert!(
            changed_pairs(Some(&s.steps[1]), &s.steps[2]).is_empty(),
            "a new pod's pairs did not change: they did not exist"
        );
    }
}
