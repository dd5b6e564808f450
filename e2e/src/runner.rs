//! Runs scenarios: builds the cluster, starts the agents, and for each step applies the
//! changes, waits until every node's kernel holds what `compile` says it must, probes every
//! pair, and compares with the expectation. Like upstream, a step that fails is probed once
//! more after a short wait before it counts as failed; the first failed step ends the
//! scenario. Scenarios run `--jobs` at a time; each one's report is printed in one piece.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netpol_agent::model::IpFamily;

use crate::cluster::{Cluster, ClusterConfig};
use crate::expect::{mismatches, render, Observed};
use crate::explain_check;
use crate::family::{addr_of, family_name};
use crate::probe::{self, Job, Results};
use crate::scenario::{PortKey, Scenario, Step, Target};

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub cluster: ClusterConfig,
    pub jobs: usize,
    pub probe_workers: usize,
    pub probe_timeout: Duration,
    pub retry_wait: Duration,
    /// Print every step's tables, not only failing ones.
    pub verbose: bool,
    /// Check the agents' deny logs after each step (`cluster.deny_logs` turns them on).
    pub check_deny_logs: bool,
    /// Check the agents' flow records after each step (`cluster.flow_logs` turns them on).
    pub check_flow_logs: bool,
    /// Hold explain's verdict for every probe against the expectation and the packets.
    pub check_explain: bool,
    /// Send forged-source packets after each step; none may arrive (`spoof`).
    pub check_spoofing: bool,
    /// Make every policy change as staged objects first (`staged_check`; `cluster.flow_logs`
    /// on).
    pub check_staged: bool,
}

pub struct Outcome {
    pub name: String,
    pub passed: bool,
    pub elapsed: Duration,
    pub report: String,
    /// Steps whose policy change was staged and checked first (`--check-staged`).
    pub staged_steps: usize,
    /// Steps that change policies and pods or namespaces (or are the first): not staged.
    pub not_staged: usize,
}

static RUN_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Runs all scenarios and prints each report as it completes.
pub fn run_all(scenarios: Vec<Scenario>, cfg: &RunConfig, stop: &AtomicBool) -> Vec<Outcome> {
    let queue = Mutex::new(scenarios.into_iter().rev().collect::<Vec<_>>());
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..cfg.jobs.max(1) {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Some(scenario) = queue.lock().expect("not poisoned").pop() else {
                    break;
                };
                let outcome = run_one(&scenario, cfg, stop);
                {
                    let verdict = if outcome.passed { "PASS" } else { "FAIL" };
                    let mut text = format!(
                        "{verdict} {} ({:.1} s)\n",
                        outcome.name,
                        outcome.elapsed.as_secs_f64()
                    );
                    text.push_str(&outcome.report);
                    print!("{text}");
                }
                outcomes.lock().expect("not poisoned").push(outcome);
            });
        }
    });
    outcomes.into_inner().expect("not poisoned")
}

pub fn run_one(scenario: &Scenario, cfg: &RunConfig, stop: &AtomicBool) -> Outcome {
    let start = Instant::now();
    let mut report = String::new();
    let mut counts = StagedCounts::default();
    let passed = match run_steps(scenario, cfg, stop, &mut report, &mut counts) {
        Ok(passed) => passed,
        Err(e) => {
            let _ = writeln!(report, "  error: {e:#}");
            false
        }
    };
    if !passed {
        let _ = writeln!(report, "  scenario file: {}", scenario.path.display());
    }
    Outcome {
        name: scenario.name.clone(),
        passed,
        elapsed: start.elapsed(),
        report,
        staged_steps: counts.checked,
        not_staged: counts.skipped,
    }
}

/// How many steps the staged phase checked and skipped.
#[derive(Default)]
struct StagedCounts {
    checked: usize,
    skipped: usize,
}

fn run_steps(
    scenario: &Scenario,
    cfg: &RunConfig,
    stop: &AtomicBool,
    report: &mut String,
    counts: &mut StagedCounts,
) -> anyhow::Result<bool> {
    let tag = format!(
        "{}-{}",
        std::process::id(),
        RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut cluster = Cluster::new(cfg.cluster.clone(), scenario.nodes, &tag)?;
    cluster.sync(&scenario.initial)?;
    cluster.start_agents()?;
    let mut phase = crate::staged_check::Phase::default();
    // The previous step and what its last round saw: the "before" of a staged phase.
    let mut before: Option<(&Step, Results)> = None;
    let mut flows_earlier = crate::flow_check::Earlier::default();
    for (i, step) in scenario.steps.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            anyhow::bail!("interrupted");
        }
        let label = format!("step {}/{} ({})", i + 1, scenario.steps.len(), step.name);
        let mut staged_text = String::new();
        if cfg.check_staged {
            use crate::staged_check::{check_step, classify, NotStaged};
            match classify(before.as_ref().map(|(s, _)| &s.world), &step.world) {
                Err(NotStaged::NoPolicyChange) => {}
                Err(NotStaged::OtherChanges) => {
                    counts.skipped += 1;
                    staged_text = "; not staged (pods or namespaces change too)".into();
                }
                Err(NotStaged::FirstStep) => {
                    counts.skipped += 1;
                    staged_text = "; not staged (the first step: nothing probed before)".into();
                }
                Ok(()) => {
                    let (prev, seen) = before.as_ref().expect("classify had a before");
                    let probe = |s: &Step| probe_step(&cluster, scenario.target, s, cfg);
                    let prober = crate::staged_check::Prober {
                        family: cfg.cluster.family,
                        retry_wait: cfg.retry_wait,
                        probe: &probe,
                    };
                    let checked = check_step(
                        &cluster,
                        scenario.target,
                        prev,
                        seen,
                        step,
                        &prober,
                        &mut phase,
                    )?;
                    if !checked.problems.is_empty() {
                        let _ = writeln!(
                            report,
                            "  FAIL {label}: staged first ({} objects): {} problems",
                            checked.staged,
                            checked.problems.len()
                        );
                        for p in checked.problems.iter().take(20) {
                            let _ = writeln!(report, "    {p}");
                        }
                        report.push_str(&indent(&format!("agent logs:\n{}", cluster.agent_logs())));
                        return Ok(false);
                    }
                    counts.checked += 1;
                    staged_text = format!(
                        "; staged first ({} objects): {} probes unchanged, {} pending verdicts \
                         as expected after the step ({} with a direction no record can show, \
                         from the evaluator), {} records' pending policies as explain's",
                        checked.staged,
                        checked.unchanged,
                        checked.pending,
                        checked.by_evaluator,
                        checked.records
                    );
                }
            }
        }
        cluster.sync(&step.world)?;
        let converged = cluster.wait_converged();
        let mut marks = cluster.log_marks();
        let first_round_start = std::time::SystemTime::now();
        let mut round_start = first_round_start;
        let (first, mut ports) = probe_step(&cluster, scenario.target, step, cfg);
        let families = cfg.cluster.family.families();
        let mut failing = failing_keys(step, families, &first);
        let mut last = first;
        let mut retried = false;
        if !failing.is_empty() {
            std::thread::sleep(cfg.retry_wait);
            marks = cluster.log_marks();
            round_start = std::time::SystemTime::now();
            (last, ports) = probe_step(&cluster, scenario.target, step, cfg);
            failing = failing_keys(step, families, &last);
            retried = true;
        }
        let conv_text = match &converged {
            Ok(d) => format!("converged in {} ms", d.as_millis()),
            Err(e) => format!("NOT CONVERGED: {e}"),
        };
        let explain = if cfg.check_explain {
            match explain_check::check(&cluster, step, &last) {
                Ok(d) => d,
                Err(e) => vec![format!("explain could not be checked: {e:#}\n")],
            }
        } else {
            Vec::new()
        };
        let mut deny_text = String::new();
        if cfg.check_deny_logs && failing.is_empty() && converged.is_ok() && explain.is_empty() {
            let checked = crate::deny_check::check(
                &cluster,
                &step.world,
                &step.expect,
                families,
                &ports,
                &marks,
            );
            if !checked.problems.is_empty() {
                let _ = writeln!(
                    report,
                    "  FAIL {label}: {conv_text}; deny logs: {} problems",
                    checked.problems.len()
                );
                for p in checked.problems.iter().take(20) {
                    let _ = writeln!(report, "    {p}");
                }
                report.push_str(&indent(&format!("agent logs:\n{}", cluster.agent_logs())));
                return Ok(false);
            }
            deny_text = format!(
                "; deny logs: {} denied probes logged, {} allowed not{}",
                checked.denied,
                checked.allowed,
                if checked.unchecked > 0 {
                    format!(", {} to unserved ports not checked", checked.unchecked)
                } else {
                    String::new()
                }
            );
        }
        let mut flow_text = String::new();
        if cfg.check_flow_logs && failing.is_empty() && converged.is_ok() && explain.is_empty() {
            let checked = crate::flow_check::check(
                &cluster,
                scenario.target,
                step,
                families,
                &ports,
                crate::flow_check::Rounds {
                    first: first_round_start,
                    last: round_start,
                },
                &mut flows_earlier,
            );
            if !checked.problems.is_empty() {
                let _ = writeln!(
                    report,
                    "  FAIL {label}: {conv_text}; flow logs: {} problems ({} records read)",
                    checked.problems.len(),
                    checked.records
                );
                for p in checked.problems.iter().take(20) {
                    let _ = writeln!(report, "    {p}");
                }
                report.push_str(&indent(&format!("agent logs:\n{}", cluster.agent_logs())));
                return Ok(false);
            }
            flow_text = format!(
                "; flow logs: {} directions recorded ({} denied; {} records read, {} counts only, {} from before the round){}",
                checked.matched,
                checked.denied,
                checked.records,
                checked.count_only,
                checked.carried,
                if checked.cluster_decided > 0 {
                    format!(
                        ", {} by a ClusterNetworkPolicy",
                        checked.cluster_decided
                    )
                } else {
                    String::new()
                }
            );
        }
        let mut spoof_text = String::new();
        if cfg.check_spoofing && failing.is_empty() && converged.is_ok() && explain.is_empty() {
            let checked = crate::spoof::check(&cluster, step, families, cfg.probe_timeout * 2);
            if !checked.problems.is_empty() {
                let _ = writeln!(
                    report,
                    "  FAIL {label}: {conv_text}; spoofing: {} problems",
                    checked.problems.len()
                );
                for p in checked.problems.iter().take(20) {
                    let _ = writeln!(report, "    {p}");
                }
                return Ok(false);
            }
            spoof_text = format!(
                "; spoofing: {} forged packets dropped, {} controls arrived",
                checked.forged, checked.controls
            );
        }
        if failing.is_empty() && converged.is_ok() && explain.is_empty() {
            let _ = writeln!(
                report,
                "  ok   {label}: {conv_text}{}{deny_text}{flow_text}{spoof_text}{staged_text}",
                if retried { ", passed on retry" } else { "" }
            );
            if cfg.verbose {
                for &family in cfg.cluster.family.families() {
                    for (key, table) in &step.expect {
                        report.push_str(&indent(&render_family(
                            cfg,
                            family,
                            *key,
                            table,
                            &last[&(family, *key)],
                        )));
                    }
                }
            }
            before = Some((step, last));
            continue;
        }
        let _ = writeln!(report, "  FAIL {label}: {conv_text}");
        for text in &explain {
            report.push_str(&indent(text));
        }
        let empty = Observed::new();
        for (family, key) in &failing {
            let seen = last.get(&(*family, *key)).unwrap_or(&empty);
            report.push_str(&indent(&render_family(
                cfg,
                *family,
                *key,
                &step.expect[key],
                seen,
            )));
        }
        if !failing.is_empty() {
            report.push_str(&indent(&format!("agent logs:\n{}", cluster.agent_logs())));
        }
        return Ok(false);
    }
    Ok(true)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// A table, headed by its family when the cluster has more than IPv4.
fn render_family(
    cfg: &RunConfig,
    family: IpFamily,
    key: PortKey,
    table: &crate::expect::TruthTable,
    seen: &Observed,
) -> String {
    let text = render(key, table, seen);
    if cfg.cluster.family.families() == [IpFamily::V4] {
        text
    } else {
        format!("over {}:\n{text}", family_name(family))
    }
}

/// The (family, key) pairs whose observation differs from the expectation: every family of
/// the cluster is held to the same table.
fn failing_keys(
    step: &Step,
    families: &[IpFamily],
    observed: &Results,
) -> Vec<(IpFamily, PortKey)> {
    let empty = Observed::new();
    let mut out = Vec::new();
    for &family in families {
        for (key, table) in &step.expect {
            let seen = observed.get(&(family, *key)).unwrap_or(&empty);
            if !mismatches(table, seen).is_empty() {
                out.push((family, *key));
            }
        }
    }
    out
}

/// Every ordered pair × probed key × family of the cluster, in one pool.
fn probe_step(
    cluster: &Cluster,
    target: Target,
    step: &Step,
    cfg: &RunConfig,
) -> (Results, probe::SourcePorts) {
    let mut jobs = Vec::new();
    for &family in cfg.cluster.family.families() {
        for key in step.expect.keys() {
            for from in cluster.pods.values() {
                for to in cluster.pods.values() {
                    if from.pod.uid == to.pod.uid {
                        continue;
                    }
                    jobs.push(Job {
                        key: *key,
                        from: from.pod.key(),
                        from_netns: from.handle.clone(),
                        to: to.pod.key(),
                        to_uid: to.pod.uid,
                        addr: match target {
                            Target::Service => addr_of(to.pod.cluster_ip, family),
                            Target::Pod => to.pod.addr(family),
                        },
                    });
                }
            }
        }
    }
    probe::run(jobs, cfg.probe_workers, cfg.probe_timeout, &cluster.sctp)
}
