//! `run --check-staged` (issue 23): every step that changes policies is first made as staged
//! objects, which must change the flow records' pending verdicts and nothing the kernel does.
//!
//! For a step whose only changes are NetworkPolicies and ClusterNetworkPolicies (a step that
//! also changes pods or namespaces, or the first step, has no probed "before" with the same
//! pods: it is counted as not staged and run as usual), before the real change:
//! 1. the same change is written as staged objects next to the enforced ones: a
//!    `StagedNetworkPolicy`/`StagedClusterNetworkPolicy` with `stagedAction: Set` and the new
//!    spec for every object the step applies, `Delete` for every object it deletes;
//! 2. the runner waits until every node's agent logged that its pending verdicts now hold
//!    exactly those staged objects (`traffic::staged::announcement`, logged when the staged
//!    set of a published pending state changes), so probing starts only once the flow
//!    records would show them;
//! 3. every pair is probed (the probe keys both steps share) and
//!    - (a) every probe must do what it did in the previous step's last round: staged
//!      objects never reach the kernel;
//!    - (b) every probe's pending verdict must equal the step's expectation after the
//!      change: egress from the `Src` record at the source pod's node, ingress from the `Dst`
//!      record at the destination's (only a packet egress let through has one; otherwise,
//!      and for a direction a record is not required for, explain's evaluator with the
//!      staged objects applied answers, counted apart). Each record's `pending_action` and
//!      `pending_policies` must also be what that evaluator says for its direction
//!      (`verdict::State::staging`, `verdict::deciding_policies`: the agent's evaluator, so
//!      the names are checked against explain, the verdict against the upstream tables).
//!      A probe to a port its destination does not serve connects under no policy and says
//!      nothing about the verdict: it is left out of (b);
//! 4. the staged objects are removed and the runner goes on with the real change.
//!
//! Records are matched to probes by flow (node, reporter, protocol, addresses, port: records
//! carry no source port). A step's window (records ending after the round began) can hold
//! records of the previous step's last round with the same flow (flow_check's window
//! defect); they do not blur this check: the kernel is the same in both rounds (that is (a)),
//! and the agent computes `pending_action` and `pending_policies` when the records are read,
//! from the flow and the current staged objects, so every record of a flow says the same.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::Direction;
use netpol_agent::verdict::{deciding_policies, Action, State};
use serde_json::Value;

use crate::cluster::Cluster;
use crate::explain_check::{load_state, probe_flow};
use crate::family::{family_name, FamilyMode};
use crate::flow_check::{expect_probe, record_key, records_since, Expected, RecordKey, SETTLE};
use crate::probe::{Results, SourcePorts};
use crate::scenario::{PortKey, Step, Target, World};

/// The subdirectory of the manifests the staged objects are written to.
const STAGED_DIR: &str = "staged";
/// How long the agents may take to read the staged objects and publish pending verdicts with
/// them: the directory watch plus at most one rebuild spacing (5 s) plus margin.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
const API_VERSION: &str = "netpol-agent.io/v1alpha1";

/// Why a step is not staged-checked.
#[derive(Debug, PartialEq, Eq)]
pub enum NotStaged {
    /// It changes no policy: nothing to stage.
    NoPolicyChange,
    /// Pods or namespaces change too: no probed "before" with the same pods.
    OtherChanges,
    /// The first step changes policies: nothing was probed before it.
    FirstStep,
}

/// What the staged phase of one step found.
#[derive(Default)]
pub struct Checked {
    /// Empty: all good.
    pub problems: Vec<String>,
    /// Staged objects written.
    pub staged: usize,
    /// Probes that did what they did before the step (a).
    pub unchanged: usize,
    /// Probes whose pending verdict was checked (b).
    pub pending: usize,
    /// Of those, the ones where a direction's pending verdict came from the evaluator.
    pub by_evaluator: usize,
    /// Records whose pending action and policies were checked against the evaluator.
    pub records: usize,
}

/// The staged phase between steps: where the last staged objects were removed (the next
/// phase first waits for the agents to have dropped them).
#[derive(Default)]
pub struct Phase {
    removed_at: Option<Vec<u64>>,
}

/// Which steps can be staged: policies (of either kind) change and nothing else does.
pub fn classify(before: Option<&World>, after: &World) -> Result<(), NotStaged> {
    let Some(before) = before else {
        return if after.policies.is_empty() && after.cluster_policies.is_empty() {
            Err(NotStaged::NoPolicyChange)
        } else {
            Err(NotStaged::FirstStep)
        };
    };
    if before.policies == after.policies && before.cluster_policies == after.cluster_policies {
        return Err(NotStaged::NoPolicyChange);
    }
    if before.pods != after.pods || before.namespaces != after.namespaces {
        return Err(NotStaged::OtherChanges);
    }
    Ok(())
}

/// One enforced document as its staged counterpart with `stagedAction: Set`.
fn staged_set(doc: &str, kind: &str) -> anyhow::Result<Value> {
    let mut v: Value = serde_yaml_ng::from_str(doc)?;
    v["apiVersion"] = Value::from(API_VERSION);
    v["kind"] = Value::from(kind);
    anyhow::ensure!(v["spec"].is_object(), "no spec");
    v["spec"]["stagedAction"] = Value::from("Set");
    Ok(v)
}

/// A staged `Delete` of the enforced object `ns/name` (or cluster-scoped `name`).
fn staged_delete(kind: &str, key: &str) -> Value {
    let metadata = match key.split_once('/') {
        Some((ns, name)) => serde_json::json!({"name": name, "namespace": ns}),
        None => serde_json::json!({"name": key}),
    };
    serde_json::json!({"apiVersion": API_VERSION, "kind": kind, "metadata": metadata,
        "spec": {"stagedAction": "Delete"}})
}

/// The staged objects that make `before` into `after` (file name, document).
pub fn staged_docs(
    before: &World,
    after: &World,
    family: FamilyMode,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let file = |prefix: &str, key: &str| format!("{prefix}-{}.yaml", key.replace('/', "__"));
    for (key, doc) in &after.policies {
        if before.policies.get(key) != Some(doc) {
            // The same addresses the enforced object gets (see `family`).
            let doc = crate::family::rewrite_policy(doc, family)?;
            let v = staged_set(&doc, "StagedNetworkPolicy")
                .with_context(|| format!("NetworkPolicy {key}"))?;
            out.push((file("np", key), serde_yaml_ng::to_string(&v)?));
        }
    }
    for key in before.policies.keys() {
        if !after.policies.contains_key(key) {
            let v = staged_delete("StagedNetworkPolicy", key);
            out.push((file("np", key), serde_yaml_ng::to_string(&v)?));
        }
    }
    for (name, doc) in &after.cluster_policies {
        if before.cluster_policies.get(name) != Some(doc) {
            let doc = crate::family::rewrite_cluster_policy(doc, family)?;
            let v = staged_set(&doc, "StagedClusterNetworkPolicy")
                .with_context(|| format!("ClusterNetworkPolicy {name}"))?;
            out.push((file("cnp", name), serde_yaml_ng::to_string(&v)?));
        }
    }
    for name in before.cluster_policies.keys() {
        if !after.cluster_policies.contains_key(name) {
            let v = staged_delete("StagedClusterNetworkPolicy", name);
            out.push((file("cnp", name), serde_yaml_ng::to_string(&v)?));
        }
    }
    Ok(out)
}

fn write_docs(dir: &Path, docs: &[(String, String)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in docs {
        // Write-then-rename: the watching agent never reads half a file.
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}

/// Removes the staged files, keeping the directory: the agents' directory watch then sees
/// file deletions only (removing a watched directory makes the watcher log a warning).
fn remove_docs(dir: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    for entry in entries {
        std::fs::remove_file(entry?.path())?;
    }
    Ok(())
}

/// Waits until every node's log since `marks` has a line holding `line`; the nodes that did
/// not log it by the timeout otherwise.
fn wait_logged(cluster: &Cluster, marks: &[u64], line: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let missing: Vec<String> = cluster
            .logs_since(marks)
            .into_iter()
            .filter(|(_, text)| !text.contains(line))
            .map(|(node, _)| node)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() > ANNOUNCE_TIMEOUT {
            return Err(format!(
                "{} did not log {line:?} within {} s",
                missing.join(", "),
                ANNOUNCE_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The step as probed in the staged phase: the port keys both steps probe.
fn shared_keys(before: &Step, after: &Step) -> Step {
    let mut probe = after.clone();
    probe.expect.retain(|k, _| before.expect.contains_key(k));
    probe
}

/// (a): the probes whose outcome differs from the previous step's last round.
fn changed_probes(before: &Results, now: &Results) -> (usize, Vec<String>) {
    let mut same = 0;
    let mut changed = Vec::new();
    for ((family, key), seen) in now {
        let Some(was) = before.get(&(*family, *key)) else {
            continue;
        };
        for ((from, to), outcome) in seen {
            match was.get(&(from.clone(), to.clone())) {
                Some(w) if w.connected() == outcome.connected() => same += 1,
                Some(w) => {
                    changed.push(format!(
                    "{from} -> {to} {key} ({}): {} before the step, {} with the staged objects \
                     (staged objects must never reach the kernel)",
                    family_name(*family),
                    if w.connected() { "connected" } else { "blocked" },
                    if outcome.connected() { "connected" } else { "blocked" },
                ))
                }
                None => {}
            }
        }
    }
    (same, changed)
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    }
}

fn sorted(policies: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = policies.iter().map(Value::to_string).collect();
    v.sort();
    v
}

/// What the evaluator with every staged object applied says of one direction: the action
/// and the deciding policies as the records name them.
struct PendingWant {
    action: Action,
    policies: Vec<Value>,
}

/// The differences between one record's pending fields and the evaluator's (empty: agree).
fn pending_disagreements(r: &Value, want: &PendingWant) -> Vec<String> {
    let mut wrong = Vec::new();
    if r["pending_action"] != action_name(want.action) {
        wrong.push(format!(
            "pending_action {}, the evaluator with the staged objects says {}",
            r["pending_action"],
            action_name(want.action)
        ));
    }
    let have = r["policies"]["pending_policies"]
        .as_array()
        .map(|a| sorted(a))
        .unwrap_or_default();
    if have != sorted(&want.policies) {
        wrong.push(format!(
            "pending_policies {}, the evaluator says {}",
            r["policies"]["pending_policies"],
            Value::Array(want.policies.clone())
        ));
    }
    wrong
}

/// The pending verdict of a whole probe (both directions allow) against the expectation
/// after the step; `None` when they agree.
fn pending_mismatch(egress: Action, ingress: Action, expected_after: bool) -> Option<String> {
    let pending = egress == Action::Allow && ingress == Action::Allow;
    (pending != expected_after).then(|| {
        format!(
            "pending verdict {} (egress {}, ingress {}), the expectation after the step says {}",
            if pending { "allow" } else { "deny" },
            action_name(egress),
            action_name(ingress),
            if expected_after { "allow" } else { "deny" },
        )
    })
}

/// Checks the pending verdicts of the records of the round begun at `round_start`.
#[allow(clippy::too_many_arguments)]
fn check_pending(
    cluster: &Cluster,
    target: Target,
    state: &State,
    after: &Step,
    families: &[IpFamily],
    ports: &SourcePorts,
    round_start: SystemTime,
    out: &mut Checked,
) -> anyhow::Result<()> {
    let staging = state.staging();
    // Per probe: its directions' expected records (flow_check's rules of who records what).
    let mut probes: Vec<(IpFamily, PortKey, String, String, Vec<Expected>)> = Vec::new();
    for &family in families {
        for (key, sent) in ports {
            if key.0 != family {
                continue;
            }
            for (from, to) in sent.keys() {
                let served = cluster.pods[to.as_str()]
                    .pod
                    .ports
                    .iter()
                    .any(|p| p.port == key.1.port && p.protocol == key.1.protocol);
                if !served {
                    continue;
                }
                let expected = expect_probe(cluster, target, state, family, &key.1, from, to)?;
                probes.push((family, key.1, from.clone(), to.clone(), expected));
            }
        }
    }
    // Read until every required record is there with its pending verdict (or SETTLE).
    let start = Instant::now();
    let records = loop {
        let read = records_since(cluster, round_start)?;
        let have: BTreeSet<RecordKey> = read
            .iter()
            .filter(|(_, r)| r["pending_action"].is_string())
            .filter_map(|(node, r)| record_key(node, r))
            .collect();
        let complete = probes
            .iter()
            .all(|(.., es)| es.iter().all(|e| !e.required || have.contains(&e.key)));
        if complete || start.elapsed() > SETTLE {
            break read;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut by_key: BTreeMap<RecordKey, Vec<Value>> = BTreeMap::new();
    for (node, r) in records {
        if let Some(k) = record_key(&node, &r) {
            by_key.entry(k).or_default().push(r);
        }
    }
    for (family, pk, from, to, expected) in &probes {
        let what = format!("{from} -> {to} {pk} ({})", family_name(*family));
        let Some(expected_after) = after.expect.get(pk).and_then(|t| t.get(from, to)) else {
            continue;
        };
        let flow = probe_flow(cluster, *family, from, to, pk)?;
        let resolved = state
            .resolve(&flow)
            .map_err(|e| anyhow::anyhow!("explain {what}: {e}"))?;
        let verdict = staging.all.explain(&resolved);
        let want = |direction| PendingWant {
            action: staging.all.decision(&resolved, Some(direction)),
            policies: deciding_policies(
                match direction {
                    Direction::Egress => &verdict.egress,
                    Direction::Ingress => &verdict.ingress,
                },
                state.staged(),
            )
            .iter()
            .map(|p| p.to_json())
            .collect(),
        };
        let mut from_evaluator = false;
        let mut pending_of = |direction: Direction, out: &mut Checked| -> Option<Action> {
            let reporter = match direction {
                Direction::Egress => "Src",
                Direction::Ingress => "Dst",
            };
            let want = want(direction);
            let Some(e) = expected.iter().find(|e| e.key.reporter == reporter) else {
                // No record can exist (egress stopped the packet; or the direction is not
                // policed): the evaluator answers.
                from_evaluator = true;
                return Some(want.action);
            };
            let found = by_key.get(&e.key).map(Vec::as_slice).unwrap_or(&[]);
            if found.is_empty() {
                if e.required {
                    out.problems.push(format!(
                        "{} {reporter}: no record at {} to read the pending verdict from",
                        e.what, e.key.node
                    ));
                    return None;
                }
                from_evaluator = true;
                return Some(want.action);
            }
            let mut action = None;
            for r in found {
                out.records += 1;
                let wrong = pending_disagreements(r, &want);
                if !wrong.is_empty() {
                    out.problems.push(format!(
                        "{}: record at {}: {}: {r}",
                        e.what,
                        e.key.node,
                        wrong.join("; ")
                    ));
                }
                action = match r["pending_action"].as_str() {
                    Some("Allow") => Some(Action::Allow),
                    Some("Deny") => Some(Action::Deny),
                    _ => None,
                };
            }
            action
        };
        let egress = pending_of(Direction::Egress, out);
        let ingress = pending_of(Direction::Ingress, out);
        let (Some(egress), Some(ingress)) = (egress, ingress) else {
            continue;
        };
        out.pending += 1;
        if from_evaluator {
            out.by_evaluator += 1;
        }
        if let Some(m) = pending_mismatch(egress, ingress, expected_after) {
            out.problems.push(format!("{what}: {m}"));
        }
    }
    Ok(())
}

/// How the runner probes a step, as the staged phase needs it: the cluster's families, the
/// wait before a retried round, and one round of probes of a step's keys. Passed in rather
/// than read from the runner's configuration, so that this check stays below the runner.
pub struct Prober<'a> {
    pub family: FamilyMode,
    pub retry_wait: Duration,
    pub probe: &'a dyn Fn(&Step) -> (Results, SourcePorts),
}

/// The staged phase of step `after`, whose previous step `before` saw `before_seen` in its
/// last round. Leaves no staged object behind, also when it fails.
pub fn check_step(
    cluster: &Cluster,
    target: Target,
    before: &Step,
    before_seen: &Results,
    after: &Step,
    cfg: &Prober<'_>,
    phase: &mut Phase,
) -> anyhow::Result<Checked> {
    let dir = cluster.manifests().join(STAGED_DIR);
    let result = staged_phase(
        cluster,
        target,
        before,
        before_seen,
        after,
        cfg,
        phase,
        &dir,
    );
    let marks = cluster.log_marks();
    remove_docs(&dir).context("removing the staged objects")?;
    phase.removed_at = Some(marks);
    result
}

#[allow(clippy::too_many_arguments)]
fn staged_phase(
    cluster: &Cluster,
    target: Target,
    before: &Step,
    before_seen: &Results,
    after: &Step,
    cfg: &Prober<'_>,
    phase: &mut Phase,
    dir: &Path,
) -> anyhow::Result<Checked> {
    let mut out = Checked::default();
    let none = netpol_agent::traffic::staged::announcement(&[]);
    if let Some(marks) = phase.removed_at.take() {
        // The last staged objects must be gone from the pending verdicts first: otherwise an
        // agent that had not dropped them yet could skip announcing an equal set.
        if let Err(e) = wait_logged(cluster, &marks, &none) {
            out.problems
                .push(format!("the previous staged objects were not dropped: {e}"));
            return Ok(out);
        }
    }
    let docs = staged_docs(&before.world, &after.world, cfg.family)?;
    out.staged = docs.len();
    let marks = cluster.log_marks();
    write_docs(dir, &docs).context("writing the staged objects")?;
    // The enforced objects (the step before) with the staged ones, as explain reads them.
    let state = load_state(cluster)?;
    anyhow::ensure!(
        state.staged().len() == docs.len(),
        "{} staged objects written, {} valid",
        docs.len(),
        state.staged().len()
    );
    let line = netpol_agent::traffic::staged::announcement(state.staged());
    if let Err(e) = wait_logged(cluster, &marks, &line) {
        out.problems
            .push(format!("the agents did not read them: {e}"));
        return Ok(out);
    }
    let probe = shared_keys(before, after);
    let families = cfg.family.families();
    let mut round_start = SystemTime::now();
    let (mut seen, mut ports) = (cfg.probe)(&probe);
    let (mut same, mut changed) = changed_probes(before_seen, &seen);
    if !changed.is_empty() {
        // As the runner does for a step: a probe may fail by chance once.
        std::thread::sleep(cfg.retry_wait);
        round_start = SystemTime::now();
        (seen, ports) = (cfg.probe)(&probe);
        (same, changed) = changed_probes(before_seen, &seen);
    }
    out.unchanged = same;
    if !changed.is_empty() {
        out.problems.extend(changed);
        return Ok(out);
    }
    check_pending(
        cluster,
        target,
        &state,
        after,
        families,
        &ports,
        round_start,
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steps_are_staged_only_when_policies_alone_change() {
        let mut a = World::default();
        assert_eq!(classify(None, &a), Err(NotStaged::NoPolicyChange));
        let mut b = a.clone();
        assert_eq!(classify(Some(&a), &b), Err(NotStaged::NoPolicyChange));
        b.policies.insert("x/p".into(), "spec: {}".into());
        assert_eq!(classify(Some(&a), &b), Ok(()));
        assert_eq!(classify(None, &b), Err(NotStaged::FirstStep));
        a.namespaces.insert("x".into(), Default::default());
        assert_eq!(classify(Some(&a), &b), Err(NotStaged::OtherChanges));
        let mut c = a.clone();
        c.cluster_policies.insert("deny".into(), "spec: {}".into());
        assert_eq!(classify(Some(&a), &c), Ok(()));
    }

    #[test]
    fn applied_objects_are_staged_as_set_and_deleted_ones_as_delete() {
        let np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\nspec: {podSelector: {}}\n";
        let cnp = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\nspec: {tier: Admin, priority: 1, subject: {namespaces: {}}}\n";
        let mut before = World::default();
        before
            .policies
            .insert("x/old".into(), np.replace("name: p", "name: old"));
        before.cluster_policies.insert("c".into(), cnp.into());
        let mut after = World::default();
        after.policies.insert("x/p".into(), np.into());
        let docs = staged_docs(&before, &after, FamilyMode::Ipv4).unwrap();
        let parsed: BTreeMap<String, Value> = docs
            .iter()
            .map(|(f, d)| (f.clone(), serde_yaml_ng::from_str(d).unwrap()))
            .collect();
        assert_eq!(parsed.len(), 3, "{docs:?}");
        let set = &parsed["np-x__p.yaml"];
        assert_eq!(set["kind"], "StagedNetworkPolicy");
        assert_eq!(set["apiVersion"], API_VERSION);
        assert_eq!(set["spec"]["stagedAction"], "Set");
        assert_eq!(set["spec"]["podSelector"], json!({}));
        assert_eq!(set["metadata"]["namespace"], "x");
        assert_eq!(
            parsed["np-x__old.yaml"],
            json!({"apiVersion": API_VERSION, "kind": "StagedNetworkPolicy",
                   "metadata": {"name": "old", "namespace": "x"}, "spec": {"stagedAction": "Delete"}})
        );
        assert_eq!(parsed["cnp-c.yaml"]["kind"], "StagedClusterNetworkPolicy");
        assert_eq!(parsed["cnp-c.yaml"]["spec"]["stagedAction"], "Delete");
        // The agent's own parser and validation accept them as staged objects.
        let text: Vec<&str> = docs.iter().map(|(_, d)| d.as_str()).collect();
        let (objects, errors) =
            netpol_agent::datastore::manifests::parse_manifests(&text.join("---\n"), "staged");
        assert!(errors.is_empty(), "{errors:?}");
        let (state, invalid) = State::from_objects(Default::default(), &objects);
        assert!(invalid.is_empty(), "{invalid:?}");
        assert_eq!(state.staged().len(), 3);
    }

    #[test]
    fn a_pending_verdict_is_held_to_the_expectation_after_the_step() {
        assert_eq!(pending_mismatch(Action::Allow, Action::Allow, true), None);
        assert_eq!(pending_mismatch(Action::Allow, Action::Deny, false), None);
        assert_eq!(pending_mismatch(Action::Deny, Action::Allow, false), None);
        // A staged deny the agent did not apply: the record still says allow.
        let m = pending_mismatch(Action::Allow, Action::Allow, false).unwrap();
        assert!(m.contains("pending verdict allow"), "{m}");
        assert!(pending_mismatch(Action::Deny, Action::Allow, true).is_some());
    }

    #[test]
    fn a_record_agrees_only_with_the_evaluators_pending_verdict() {
        let policy = json!({"kind": "StagedNetworkPolicy", "namespace": "x", "name": "p",
            "tier": "default", "action": "Deny", "rule_index": -1});
        let want = PendingWant {
            action: Action::Deny,
            policies: vec![policy.clone()],
        };
        let good = json!({"pending_action": "Deny", "policies": {"pending_policies": [policy]}});
        assert!(pending_disagreements(&good, &want).is_empty());
        // The record's pending verdict is its enforced one: the staged object was ignored.
        let stale = json!({"pending_action": "Allow", "policies": {"pending_policies": []}});
        assert_eq!(pending_disagreements(&stale, &want).len(), 2);
        let mut enforced_kind = good.clone();
        enforced_kind["policies"]["pending_policies"][0]["kind"] = json!("NetworkPolicy");
        assert_eq!(pending_disagreements(&enforced_kind, &want).len(), 1);
    }

    #[test]
    fn a_probe_that_changed_with_staged_objects_is_reported() {
        use crate::expect::{Observed, Outcome};
        let pk = crate::expect::parse_key("TCP/80").unwrap();
        let mut before: Results = BTreeMap::new();
        let mut now: Results = BTreeMap::new();
        let mut seen = Observed::new();
        seen.insert(("x/a".into(), "y/b".into()), Outcome::Connected);
        before.insert((IpFamily::V4, pk), seen.clone());
        now.insert((IpFamily::V4, pk), seen);
        assert_eq!(changed_probes(&before, &now), (1, vec![]));
        now.get_mut(&(IpFamily::V4, pk))
            .unwrap()
            .insert(("x/a".into(), "y/b".into()), Outcome::Blocked);
        let (same, changed) = changed_probes(&before, &now);
        assert_eq!(same, 0);
        assert_eq!(changed.len(), 1);
        assert!(
            changed[0].contains("connected before the step"),
            "{changed:?}"
        );
    }
}
