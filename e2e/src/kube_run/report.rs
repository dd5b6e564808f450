//! What `run --kubeconfig` tells its user: per step the reachability matrix (one per port
//! key and family, identical ones merged; mismatches marked in the cell), then a summary
//! with the enforcement times' p50/p99; or all of it as one JSON document (`--output json`).
//! Pure: the runner hands in what it saw.
//!
//! Cells: `.` connected and expected to, `X` blocked and expected to be, `!` connected but
//! the policies deny it (fail-open), `?` blocked but expected to connect, `E` the probe
//! itself failed (exec, image; never counted as a policy's verdict).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use netpol_agent::model::IpFamily;
use serde_json::json;

use super::{Config, Offer, RunResult};
use crate::expect::{Outcome as ProbeOutcome, PortKey};
use crate::family::family_name;
use crate::scenario::Scenario;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    Skipped(String),
    Error(String),
}

/// One probe: a family, a port key, an ordered pair of scenario pods.
pub type Probe = (IpFamily, PortKey, String, String);

/// One matrix: its pods in order, and each (from, to) cell's symbol.
pub type Matrix = (Vec<String>, BTreeMap<(String, String), char>);

#[derive(Clone, Debug)]
pub struct StepReport {
    pub name: String,
    pub index: usize,
    pub of: usize,
    pub passed: bool,
    pub probes: usize,
    pub rounds: usize,
    pub enforcement: Option<Duration>,
    /// (family, key) → pod list and cells (from, to) → symbol.
    pub tables: BTreeMap<(IpFamily, PortKey), Matrix>,
    /// Every disagreement: (family, key, from, to, expected connected, what was seen).
    pub mismatches: Vec<(IpFamily, PortKey, String, String, bool, String)>,
    /// `--check-explain`: probes the agents' explain answered, on how many nodes, and each
    /// disagreement (or explain that could not answer) in words.
    pub explained: usize,
    pub explained_nodes: usize,
    pub explain: Vec<String>,
    /// `--check-flow-logs`: records read in the step's window, how many directions' records
    /// agreed (of those denied, decided by a ClusterNetworkPolicy), how many of the window's
    /// records were carried (earlier rounds and steps, conntrack's counts), and each problem.
    pub flows: Option<FlowsSeen>,
    denied: usize,
    denied_connected: usize,
    denied_blocked: usize,
}

fn cell(expected: bool, seen: &ProbeOutcome) -> char {
    match (expected, seen) {
        (_, ProbeOutcome::WrongPeer(_)) => 'E',
        (true, ProbeOutcome::Connected) => '.',
        (false, ProbeOutcome::Blocked) => 'X',
        (false, ProbeOutcome::Connected) => '!',
        (true, ProbeOutcome::Blocked) => '?',
    }
}

fn seen_text(o: &ProbeOutcome) -> String {
    match o {
        ProbeOutcome::Connected => "connected".into(),
        ProbeOutcome::Blocked => "blocked".into(),
        ProbeOutcome::WrongPeer(why) => format!("probe error: {why}"),
    }
}

impl StepReport {
    pub fn new(name: &str, index: usize, of: usize) -> StepReport {
        StepReport {
            name: name.into(),
            index,
            of,
            passed: false,
            probes: 0,
            rounds: 0,
            enforcement: None,
            tables: BTreeMap::new(),
            mismatches: Vec::new(),
            explained: 0,
            explained_nodes: 0,
            explain: Vec::new(),
            flows: None,
            denied: 0,
            denied_connected: 0,
            denied_blocked: 0,
        }
    }

    /// Takes the last round's outcomes against the expectation.
    pub fn record(
        &mut self,
        expected: &BTreeMap<Probe, bool>,
        seen: &BTreeMap<Probe, ProbeOutcome>,
    ) {
        for (p, want) in expected {
            let (family, key, from, to) = p;
            let o = seen
                .get(p)
                .cloned()
                .unwrap_or(ProbeOutcome::WrongPeer("not probed".into()));
            let c = cell(*want, &o);
            let (pods, cells) = self.tables.entry((*family, *key)).or_default();
            for pod in [from, to] {
                if !pods.contains(pod) {
                    pods.push(pod.clone());
                }
            }
            cells.insert((from.clone(), to.clone()), c);
            if !want {
                self.denied += 1;
                match o {
                    ProbeOutcome::Connected => self.denied_connected += 1,
                    ProbeOutcome::Blocked => self.denied_blocked += 1,
                    ProbeOutcome::WrongPeer(_) => {}
                }
            }
            if !matches!(c, '.' | 'X') {
                self.mismatches.push((
                    *family,
                    *key,
                    from.clone(),
                    to.clone(),
                    *want,
                    seen_text(&o),
                ));
            }
        }
        self.passed = self.mismatches.is_empty();
    }

    /// `--check-explain`'s disagreements: any fails the step.
    pub fn explain_failed(&mut self, wrong: Vec<String>) {
        if !wrong.is_empty() {
            self.passed = false;
        }
        self.explain.extend(wrong);
    }

    /// `--check-flow-logs`' answer for the step: any problem fails it.
    pub fn flows_checked(&mut self, c: &crate::flow_check::Checked) {
        if !c.problems.is_empty() {
            self.passed = false;
        }
        self.flows = Some(FlowsSeen {
            records: c.records,
            matched: c.matched,
            denied: c.denied,
            cluster_decided: c.cluster_decided,
            carried: c.carried + c.count_only,
            rode: c.rode,
            problems: c.problems.clone(),
        });
    }

    /// Every probe the policies deny connected (and there was at least one).
    pub fn nothing_enforced(&self) -> bool {
        self.denied > 0 && self.denied_connected == self.denied
    }

    /// At least one probe the policies deny was blocked: something enforces.
    pub fn saw_a_drop(&self) -> bool {
        self.denied_blocked > 0
    }

    pub fn denied_probes(&self) -> usize {
        self.denied
    }
}

/// What `--check-flow-logs` saw in one step (see [`StepReport::flows`]).
#[derive(Clone, Debug, Default)]
pub struct FlowsSeen {
    pub records: usize,
    pub matched: usize,
    pub denied: usize,
    pub cluster_decided: usize,
    pub carried: usize,
    /// UDP probe directions that rode an earlier connection (`Checked::rode`).
    pub rode: usize,
    pub problems: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct ScenarioReport {
    pub name: String,
    pub file: String,
    pub suffix: String,
    pub outcome: Outcome,
    pub steps: Vec<StepReport>,
    pub notes: Vec<String>,
    pub no_enforcement: Option<String>,
    pub elapsed: Duration,
}

impl ScenarioReport {
    pub fn new(s: &Scenario) -> ScenarioReport {
        ScenarioReport {
            name: s.name.clone(),
            file: s.path.display().to_string(),
            suffix: String::new(),
            outcome: Outcome::Error("not run".into()),
            steps: Vec::new(),
            notes: Vec::new(),
            no_enforcement: None,
            elapsed: Duration::ZERO,
        }
    }
}

pub fn header(offer: &Offer, scenarios: usize, run: &str, cfg: &Config) -> String {
    format!(
        "cluster: {} nodes take pods ({}); pod families {}; SCTP {}; ClusterNetworkPolicy {}\n\
         running {scenarios} scenarios (run {run}), {} probes at a time, image {}\n\
         cells: . connected as expected, X blocked as expected, ! connected but denied, \
         ? blocked but allowed, E probe failed\n",
        offer.nodes.len(),
        offer.nodes.join(", "),
        offer
            .families
            .iter()
            .map(|f| family_name(*f))
            .collect::<Vec<_>>()
            .join(" + "),
        if offer.sctp {
            "yes".to_string()
        } else {
            format!("no ({})", offer.sctp_reason)
        },
        if offer.cluster_policies {
            "served"
        } else {
            "not served"
        },
        cfg.jobs,
        cfg.image,
    )
}

/// The matrices of a step, identical ones merged under one heading.
fn matrices(step: &StepReport) -> String {
    let mut groups: Vec<(Vec<String>, String)> = Vec::new();
    for ((family, key), (pods, cells)) in &step.tables {
        let mut t = String::new();
        let width = pods.iter().map(String::len).max().unwrap_or(1);
        let numbered = width > 16;
        let col = |i: usize, name: &str| {
            if numbered {
                (i + 1).to_string()
            } else {
                name.to_string()
            }
        };
        let cw = if numbered {
            pods.len().to_string().len()
        } else {
            width
        };
        let rw = if numbered { cw + 1 + width } else { width };
        let _ = write!(t, "      {:rw$}", "-");
        for (i, p) in pods.iter().enumerate() {
            let _ = write!(t, " {:cw$}", col(i, p));
        }
        t.push('\n');
        for (i, from) in pods.iter().enumerate() {
            let label = if numbered {
                format!("{:>cw$} {from}", i + 1)
            } else {
                from.clone()
            };
            let _ = write!(t, "      {label:rw$}");
            for to in pods {
                let c = if from == to {
                    '#'
                } else {
                    cells
                        .get(&(from.clone(), to.clone()))
                        .copied()
                        .unwrap_or(' ')
                };
                let _ = write!(t, " {c:cw$}");
            }
            t.push('\n');
        }
        let head = format!("{key} {}", family_name(*family));
        match groups.iter_mut().find(|(_, body)| *body == t) {
            Some((heads, _)) => heads.push(head),
            None => groups.push((vec![head], t)),
        }
    }
    let mut out = String::new();
    for (heads, body) in groups {
        let _ = writeln!(out, "    {}:", heads.join(", "));
        out.push_str(&body);
    }
    out
}

pub fn scenario_text(rep: &ScenarioReport, verbose: bool) -> String {
    let verdict = match &rep.outcome {
        Outcome::Passed => "PASS",
        Outcome::Failed => "FAIL",
        Outcome::Skipped(_) => "SKIP",
        Outcome::Error(_) => "ERROR",
    };
    let mut out = format!(
        "{verdict} {} ({:.1} s)\n",
        rep.name,
        rep.elapsed.as_secs_f64()
    );
    for note in &rep.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    for step in &rep.steps {
        if step.probes == 0 {
            let _ = writeln!(
                out,
                "  --   step {}/{} ({}): not probed (nothing the cluster carries)",
                step.index + 1,
                step.of,
                step.name
            );
            continue;
        }
        let timing = match step.enforcement {
            Some(d) => format!("enforced in {} ms", d.as_millis()),
            None => "no verdict changed".into(),
        };
        let _ = writeln!(
            out,
            "  {} step {}/{} ({}): {} probes, {} rounds, {timing}",
            if step.passed { "ok  " } else { "FAIL" },
            step.index + 1,
            step.of,
            step.name,
            step.probes,
            step.rounds,
        );
        if verbose || !step.passed {
            out.push_str(&matrices(step));
        }
        for (family, key, from, to, want, seen) in &step.mismatches {
            let _ = writeln!(
                out,
                "    {from} -> {to} {key} {}: expected {}, {seen}",
                family_name(*family),
                if *want { "connected" } else { "blocked" }
            );
        }
        if step.explained > 0 && step.explain.is_empty() && verbose {
            let _ = writeln!(
                out,
                "    explain agrees on {} probes ({} nodes)",
                step.explained, step.explained_nodes
            );
        }
        for text in &step.explain {
            let _ = writeln!(out, "    explain: {text}");
        }
        if let Some(f) = &step.flows {
            if verbose && f.problems.is_empty() {
                let _ = writeln!(
                    out,
                    "    flow logs agree: {} records of {} directions ({} denied, {} by a ClusterNetworkPolicy), {} carried, {} rode an earlier UDP connection",
                    f.records, f.matched, f.denied, f.cluster_decided, f.carried, f.rode
                );
            }
            for (i, text) in f.problems.iter().enumerate() {
                if i == 4 {
                    let _ = writeln!(out, "    flow logs: ... and {} more", f.problems.len() - 4);
                    break;
                }
                let _ = writeln!(out, "    flow logs: {text}");
            }
        }
    }
    match &rep.outcome {
        Outcome::Skipped(why) => {
            let _ = writeln!(out, "  skipped: {why}");
        }
        Outcome::Error(why) => {
            let _ = writeln!(out, "  error: {why}");
        }
        _ => {}
    }
    if !matches!(rep.outcome, Outcome::Passed) {
        let _ = writeln!(
            out,
            "  scenario file: {} (namespaces *-{})",
            rep.file, rep.suffix
        );
    }
    out
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], pct: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

fn enforcement_samples(run: &RunResult) -> Vec<Duration> {
    let mut v: Vec<Duration> = run
        .scenarios
        .iter()
        .flat_map(|s| s.steps.iter().filter_map(|st| st.enforcement))
        .collect();
    v.sort();
    v
}

pub fn summary(run: &RunResult, as_json: bool) -> String {
    let count =
        |f: &dyn Fn(&Outcome) -> bool| run.scenarios.iter().filter(|s| f(&s.outcome)).count();
    let passed = count(&|o| *o == Outcome::Passed);
    let failed = count(&|o| matches!(o, Outcome::Failed | Outcome::Error(_)));
    let skipped = count(&|o| matches!(o, Outcome::Skipped(_)));
    let samples = enforcement_samples(run);
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
    if as_json {
        let scenarios: Vec<_> = run
            .scenarios
            .iter()
            .map(|s| {
                let (result, reason) = match &s.outcome {
                    Outcome::Passed => ("passed", None),
                    Outcome::Failed => ("failed", None),
                    Outcome::Skipped(r) => ("skipped", Some(r.clone())),
                    Outcome::Error(r) => ("error", Some(r.clone())),
                };
                json!({
                    "name": s.name, "file": s.file, "result": result, "reason": reason,
                    "namespace_suffix": s.suffix, "notes": s.notes,
                    "seconds": s.elapsed.as_secs_f64(),
                    "steps": s.steps.iter().map(|st| json!({
                        "name": st.name, "passed": st.passed, "probes": st.probes,
                        "rounds": st.rounds, "enforcement_ms": ms(st.enforcement),
                        "matrices": st.tables.iter().map(|((f, k), (pods, cells))| json!({
                            "family": family_name(*f), "key": k.to_string(), "pods": pods,
                            "cells": pods.iter().map(|from| pods.iter().map(|to| {
                                if from == to { "#".to_string() } else {
                                    cells.get(&(from.clone(), to.clone())).map(|c| c.to_string()).unwrap_or_default()
                                }
                            }).collect::<Vec<_>>()).collect::<Vec<_>>(),
                        })).collect::<Vec<_>>(),
                        "mismatches": st.mismatches.iter().map(|(f, k, from, to, want, seen)| json!({
                            "family": family_name(*f), "key": k.to_string(), "from": from, "to": to,
                            "expected": if *want { "connected" } else { "blocked" }, "observed": seen,
                        })).collect::<Vec<_>>(),
                        "explain": (st.explained > 0 || !st.explain.is_empty()).then(|| json!({
                            "probes": st.explained, "nodes": st.explained_nodes,
                            "disagreements": st.explain,
                        })),
                        "flow_logs": st.flows.as_ref().map(|f| json!({
                            "records": f.records, "matched": f.matched, "denied": f.denied,
                            "cluster_decided": f.cluster_decided, "carried": f.carried, "rode": f.rode,
                            "problems": f.problems,
                        })),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({
            "cluster": {
                "nodes": run.offer.nodes,
                "families": run.offer.families.iter().map(|f| family_name(*f)).collect::<Vec<_>>(),
                "sctp": run.offer.sctp,
                "cluster_network_policy": run.offer.cluster_policies,
            },
            "scenarios": scenarios,
            "no_enforcement": run.no_enforcement,
            "summary": {
                "passed": passed, "failed": failed, "skipped": skipped,
                "seconds": run.elapsed.as_secs_f64(),
                "enforcement_ms": {
                    "samples": samples.len(),
                    "p50": ms(percentile(&samples, 50.0)),
                    "p99": ms(percentile(&samples, 99.0)),
                    "max": ms(samples.last().copied()),
                },
            },
        });
        return format!(
            "{}\n",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
    }
    let mut out = String::new();
    if let Some(why) = &run.no_enforcement {
        let _ = writeln!(out, "{why}");
    }
    let not_passed: Vec<_> = run
        .scenarios
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Failed | Outcome::Error(_)))
        .collect();
    if !not_passed.is_empty() {
        let _ = writeln!(out, "failed:");
        for s in not_passed {
            let _ = writeln!(out, "  {}", s.name);
        }
    }
    match (percentile(&samples, 50.0), percentile(&samples, 99.0)) {
        (Some(p50), Some(p99)) => {
            let _ = writeln!(
                out,
                "enforcement after a change: p50 {} ms, p99 {} ms, max {} ms ({} steps)",
                p50.as_millis(),
                p99.as_millis(),
                samples.last().map_or(0, |d| d.as_millis()),
                samples.len()
            );
        }
        _ => {
            let _ = writeln!(out, "enforcement after a change: no step changed a verdict");
        }
    }
    let _ = writeln!(out, "wall time: {:.1} s", run.elapsed.as_secs_f64());
    let _ = writeln!(out, "{passed} passed, {failed} failed, {skipped} skipped");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expect::Protocol;

    fn key() -> PortKey {
        PortKey {
            protocol: Protocol::Tcp,
            port: 80,
        }
    }

    #[test]
    fn cells_mark_each_kind_of_disagreement() {
        let mut step = StepReport::new("s", 0, 1);
        let p = |f: &str, t: &str| (IpFamily::V4, key(), f.to_string(), t.to_string());
        let expected = BTreeMap::from([
            (p("a", "b"), true),
            (p("b", "a"), false),
            (p("a", "c"), false),
            (p("c", "a"), true),
        ]);
        let seen = BTreeMap::from([
            (p("a", "b"), ProbeOutcome::Connected),
            (p("b", "a"), ProbeOutcome::Connected),
            (p("a", "c"), ProbeOutcome::Blocked),
            (p("c", "a"), ProbeOutcome::WrongPeer("exec".into())),
        ]);
        step.record(&expected, &seen);
        let (_, cells) = &step.tables[&(IpFamily::V4, key())];
        assert_eq!(cells[&("a".into(), "b".into())], '.');
        assert_eq!(cells[&("b".into(), "a".into())], '!');
        assert_eq!(cells[&("a".into(), "c".into())], 'X');
        assert_eq!(cells[&("c".into(), "a".into())], 'E');
        assert!(!step.passed);
        assert_eq!(step.mismatches.len(), 2);
        assert!(!step.nothing_enforced(), "one denied probe was blocked");
        assert!(step.saw_a_drop());
    }

    #[test]
    fn a_cluster_without_enforcement_is_named_as_such() {
        let mut step = StepReport::new("s", 0, 1);
        let p = |f: &str, t: &str| (IpFamily::V4, key(), f.to_string(), t.to_string());
        let expected = BTreeMap::from([
            (p("a", "b"), false),
            (p("b", "a"), false),
            (p("a", "c"), true),
        ]);
        let seen = expected
            .keys()
            .map(|k| (k.clone(), ProbeOutcome::Connected))
            .collect();
        step.record(&expected, &seen);
        assert!(step.nothing_enforced());
        assert!(!step.saw_a_drop());
        assert_eq!(step.denied_probes(), 2);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&v, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&v[..1], 99.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn identical_matrices_are_merged() {
        let mut step = StepReport::new("s", 0, 1);
        let udp = PortKey {
            protocol: Protocol::Udp,
            port: 80,
        };
        let mut expected = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for k in [key(), udp] {
            expected.insert((IpFamily::V4, k, "a".to_string(), "b".to_string()), true);
            seen.insert(
                (IpFamily::V4, k, "a".to_string(), "b".to_string()),
                ProbeOutcome::Connected,
            );
        }
        step.record(&expected, &seen);
        let text = matrices(&step);
        assert!(text.contains("TCP/80 IPv4, UDP/80 IPv4:"), "{text}");
        assert_eq!(text.matches(':').count(), 1, "{text}");
    }
}
