//! Pending verdicts of flow records (issue 23): the decision each record's reporter would make
//! if the staged policies were enforced, with the policies that would decide it (Goldmane's
//! `pending_action` and `policies.pending_policies`), and per staged object the flows it would
//! newly deny or newly allow (`netpol_staged_flows_total`).
//!
//! The calculation loop keeps [`Objects`], the validated objects as of the events applied
//! (staged ones included; the calc graph never sees those), and publishes a [`Pending`] (the
//! evaluator's enforced state and its staging, `verdict::State::staging`) into a
//! [`PendingSlot`] the flow-log thread reads. It is rebuilt after a change at most every
//! [`REBUILD_SPACING`], and only while staged objects exist: without any, nothing is built and
//! a record's pending verdict is its enforced one.
//!
//! Bounded cardinality: the metric has one series pair per staged object; staged objects are
//! an operator's changes under review, a handful at a time, not one per workload.
//!
//! A staged object that does not validate is logged with the field at fault and counted in
//! `netpol_rejections_total{kind="StagedNetworkPolicy",reason="invalid"}`; it is left out of
//! the pending verdicts (its previous valid version, if any, stays) and never reaches the
//! rules.
//!
//! Staged policies at each layer: the objects in `model::staged`, validated in
//! `model::validate::staged`, applied only in the evaluator's what-if state in
//! `verdict::staged`, the pending verdicts of flow records in `traffic::staged`, the `staged`
//! commands in `inspect::staged`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::model::validate::{self, namespaced_key};
use crate::model::{
    ClusterPolicyInfo, DatastoreEvent, K8sObject, NamespaceInfo, ObjectKey, ObjectKind, ObjectRef,
    PodInfo, PolicyInfo, Protocol, StagedInfo,
};
use crate::rules::{Direction, RuleConfig};
use crate::verdict::{deciding_policies, Action, Endpoint, Flow, Staging, State};

use super::flow_log::{Annotator, FlowRecord, NoAnnotations};
use super::reevaluate::Change;

/// At most one rebuild of the pending state per this interval.
pub const REBUILD_SPACING: Duration = Duration::from_secs(5);

/// What the flow-log thread reads.
pub type PendingSlot = RwLock<Option<Arc<Pending>>>;

/// The enforced state and the staged ones, built once per change.
pub struct Pending {
    state: State,
    staging: Staging,
}

/// A record's pending verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingVerdict {
    pub action: Action,
    pub policies: Vec<Value>,
    /// Indices of the staged objects that alone change the reporter's decision.
    pub changed_by: Vec<usize>,
    /// The enforced decision as the evaluator sees it (what the staged ones are held to).
    pub enforced: Action,
}

fn protocol(name: &str) -> Option<Protocol> {
    Protocol::parse(&name.to_ascii_uppercase())
}

impl Pending {
    /// The staged objects, in the order `changed_by` indexes.
    pub fn staged(&self) -> &[StagedInfo] {
        self.state.staged()
    }

    /// `None` for a flow the evaluator cannot judge (no port: ICMP; unknown ends).
    pub fn verdict(
        &self,
        src: IpAddr,
        dst: IpAddr,
        proto: &str,
        port: Option<u16>,
        reporter: Direction,
    ) -> Option<PendingVerdict> {
        let flow = Flow {
            src: Endpoint::Ip(src),
            dst: Endpoint::Ip(dst),
            protocol: protocol(proto)?,
            port: port.filter(|p| *p > 0)?,
        };
        let resolved = self.state.resolve(&flow).ok()?;
        let enforced = self.state.decision(&resolved, Some(reporter));
        let v = self.staging.all.explain(&resolved);
        let side = match reporter {
            Direction::Egress => &v.egress,
            Direction::Ingress => &v.ingress,
        };
        let action = self.staging.all.decision(&resolved, Some(reporter));
        let changed_by = self
            .staging
            .each
            .iter()
            .enumerate()
            .filter(|(_, s)| s.decision(&resolved, Some(reporter)) != enforced)
            .map(|(i, _)| i)
            .collect();
        Some(PendingVerdict {
            action,
            policies: deciding_policies(side, self.state.staged())
                .iter()
                .map(|p| p.to_json())
                .collect(),
            changed_by,
            enforced,
        })
    }
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    }
}

impl Annotator for PendingSlot {
    fn annotate(&self, record: &FlowRecord, json: &mut Value) {
        annotate(self, record, json)
    }

    fn finished(&self, records: &[FlowRecord]) {
        count(self, records)
    }
}

/// Fills `pending_action` and `policies.pending_policies` of a record's JSON: the staged
/// decision when staged objects exist and the flow can be judged, else the enforced one (no
/// staged object changes it).
pub fn annotate(slot: &PendingSlot, r: &FlowRecord, v: &mut Value) {
    let pending = slot.read().ok().and_then(|p| p.clone());
    let k = &r.key;
    let verdict = pending
        .as_ref()
        .and_then(|p| p.verdict(k.src.ip, k.dst.ip, &k.protocol, k.dst_port, k.reporter));
    match verdict {
        Some(pv) => {
            v["pending_action"] = json!(action_name(pv.action));
            v["policies"]["pending_policies"] = Value::Array(pv.policies);
        }
        None => NoAnnotations.annotate(r, v),
    }
}

/// Counts the finished records' flows each staged object would newly deny or allow.
pub fn count(slot: &PendingSlot, records: &[FlowRecord]) {
    let Some(pending) = slot.read().ok().and_then(|p| p.clone()) else {
        return;
    };
    let m = crate::telemetry::metrics::global();
    for r in records {
        let k = &r.key;
        let Some(pv) = pending.verdict(k.src.ip, k.dst.ip, &k.protocol, k.dst_port, k.reporter)
        else {
            continue;
        };
        for i in pv.changed_by {
            let s = &pending.staged()[i];
            let change = match pv.enforced {
                Action::Allow => "newly_denied",
                Action::Deny => "newly_allowed",
            };
            m.staged_flows
                .with_label_values(&[s.kind, &s.name(), change])
                .inc_by(r.connections.max(1));
        }
    }
}

/// Validates a staged object from a datastore; an invalid one is logged and counted.
fn validated(o: &K8sObject) -> Option<Result<StagedInfo, validate::ValidationError>> {
    match o {
        K8sObject::StagedNetworkPolicy(s) => Some(validate::staged_network_policy(s)),
        K8sObject::StagedClusterNetworkPolicy(s) => {
            Some(validate::staged_cluster_network_policy(s))
        }
        _ => None,
    }
}

fn reject(e: &validate::ValidationError) {
    tracing::warn!(
        "rejected {e}; it is left out of the pending verdicts (staged objects are never enforced)"
    );
    crate::telemetry::metrics::global()
        .rejections
        .with_label_values(&[e.kind, "invalid"])
        .inc();
}

/// Checks a staged object's event when flow logs are off (nothing evaluates it then, but a
/// broken object is still reported).
pub fn check(event: &DatastoreEvent) {
    if let DatastoreEvent::Upsert(o) = event {
        if let Some(Err(e)) = validated(o) {
            reject(&e);
        }
    }
}

/// The validated objects as of the events seen.
#[derive(Default)]
pub struct Objects {
    pods: HashMap<ObjectKey, PodInfo>,
    namespaces: HashMap<String, NamespaceInfo>,
    policies: BTreeMap<ObjectKey, PolicyInfo>,
    cluster: BTreeMap<String, ClusterPolicyInfo>,
    staged: BTreeMap<ObjectRef, StagedInfo>,
    dirty: bool,
    built: Option<Instant>,
    /// The staged objects of the last published state, to log when they change.
    announced: Vec<StagedInfo>,
}

/// The line [`Objects::maybe_publish`] logs when the staged objects in the pending verdicts
/// change: operators see when their staged change takes effect, and `netpol-e2e run
/// --check-staged` waits for it (the exact list) before probing.
pub fn announcement(staged: &[StagedInfo]) -> String {
    let mut names: Vec<String> = staged
        .iter()
        .map(|s| format!("{s} ({})", s.action().as_str()))
        .collect();
    names.sort();
    format!(
        "staged objects in the pending verdicts: [{}]",
        names.join(", ")
    )
}

impl Objects {
    pub fn observe(&mut self, event: &DatastoreEvent) {
        match event {
            DatastoreEvent::Upsert(o) => {
                if let Some(result) = validated(o) {
                    match result {
                        Ok(info) => {
                            self.staged.insert(o.object_ref(), info);
                            self.dirty = true;
                        }
                        Err(e) => reject(&e),
                    }
                    return;
                }
            }
            DatastoreEvent::Delete(r)
                if matches!(
                    r.kind,
                    ObjectKind::StagedNetworkPolicy | ObjectKind::StagedClusterNetworkPolicy
                ) =>
            {
                self.dirty |= self.staged.remove(r).is_some();
                return;
            }
            _ => {}
        }
        // The enforced objects, validated as the conntrack re-evaluation's mirror does.
        let Some(change) = Change::of_event(event) else {
            if let DatastoreEvent::Upsert(o) = event {
                // A pod that is no endpoint (any more) leaves the evaluator's view.
                if let K8sObject::Pod(p) = o.as_ref() {
                    self.dirty |= self.pods.remove(&namespaced_key(&p.metadata)).is_some();
                }
            }
            return;
        };
        match change {
            Change::Pod(k, Some(p)) => {
                self.pods.insert(k, p);
            }
            Change::Pod(k, None) => {
                self.pods.remove(&k);
            }
            Change::Namespace(n, Some(ns)) => {
                self.namespaces.insert(n, ns);
            }
            Change::Namespace(n, None) => {
                self.namespaces.remove(&n);
            }
            Change::Policy(k, Some(p)) => {
                self.policies.insert(k, p);
            }
            Change::Policy(k, None) => {
                self.policies.remove(&k);
            }
            Change::ClusterPolicy(n, Some(p)) => {
                self.cluster.insert(n, p);
            }
            Change::ClusterPolicy(n, None) => {
                self.cluster.remove(&n);
            }
        }
        self.dirty = true;
    }

    /// Publishes a new pending state when something changed and the last build is at least
    /// [`REBUILD_SPACING`] old (`None` while there are no staged objects).
    pub fn maybe_publish(&mut self, cfg: &RuleConfig, slot: &PendingSlot) {
        if !self.dirty || self.built.is_some_and(|t| t.elapsed() < REBUILD_SPACING) {
            return;
        }
        let pending = (!self.staged.is_empty()).then(|| Arc::new(self.build(cfg)));
        if let Ok(mut s) = slot.write() {
            *s = pending;
        }
        self.dirty = false;
        self.built = Some(Instant::now());
        // Logged on a change of the staged objects only (not on every rebuild a pod's
        // change causes), so the line marks when a staged change reached the records.
        let now: Vec<StagedInfo> = self.staged.values().cloned().collect();
        if now != self.announced {
            tracing::info!("{}", announcement(&now));
            self.announced = now;
        }
    }

    fn build(&self, cfg: &RuleConfig) -> Pending {
        let mut state = State::new(
            cfg.clone(),
            self.namespaces.values().cloned(),
            self.pods.values().cloned(),
            self.policies.values().cloned(),
        );
        state.set_cluster_policies(self.cluster.values().cloned());
        state.set_staged(self.staged.values().cloned());
        let staging = state.staging();
        Pending { state, staging }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::manifests::parse_manifests;
    use crate::rules::flow_log::FlowAction;
    use crate::traffic::flow_log::{End, FlowKey, PolicyHit};
    use std::time::SystemTime;

    const CLUSTER: &str = "
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: x, labels: {app: client}}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: x, labels: {app: server}}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]
";
    const STAGED: &str = "
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: server-in, namespace: x}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: broken, namespace: x}
spec: {stagedAction: Maybe}
";

    fn record(port: u16) -> FlowRecord {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        FlowRecord {
            key: FlowKey {
                src: End {
                    ip: ip("10.0.1.1"),
                    pod: None,
                },
                dst: End {
                    ip: ip("10.0.1.2"),
                    pod: None,
                },
                dst_port: Some(port),
                protocol: "tcp".into(),
                reporter: Direction::Ingress,
                action: FlowAction::Allow,
                hit: PolicyHit::Rule {
                    policy: ObjectKey::new("x", "server-in"),
                    rule: 0,
                },
            },
            start: SystemTime::now(),
            end: SystemTime::now(),
            connections: 4,
            counts: Default::default(),
            live: 0,
            seq: 1,
            active: None,
        }
    }

    fn feed(objects: &mut Objects, text: &str) {
        let (list, errors) = parse_manifests(text, "t.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        for o in list {
            objects.observe(&DatastoreEvent::Upsert(Box::new(o)));
        }
    }

    #[test]
    fn pending_verdicts_follow_staged_objects_and_count_per_staged_object() {
        let slot = PendingSlot::default();
        let cfg = RuleConfig::default();
        let mut objects = Objects::default();
        feed(&mut objects, CLUSTER);
        objects.maybe_publish(&cfg, &slot);
        // No staged objects: nothing built, pending = enforced.
        assert!(slot.read().unwrap().is_none());
        let mut v = json!({"action": "Allow", "policies": {"enforced_policies": [{"name": "server-in"}], "pending_policies": []}});
        annotate(&slot, &record(80), &mut v);
        assert_eq!(v["pending_action"], "Allow");
        assert_eq!(v["policies"]["pending_policies"][0]["name"], "server-in");

        // A staged Set that replaces server-in by a deny-all: the record would be denied,
        // by the staged object's isolation (the broken one is rejected and left out).
        let before = crate::telemetry::metrics::global()
            .rejections
            .with_label_values(&["StagedNetworkPolicy", "invalid"])
            .get();
        feed(&mut objects, STAGED);
        assert_eq!(
            crate::telemetry::metrics::global()
                .rejections
                .with_label_values(&["StagedNetworkPolicy", "invalid"])
                .get(),
            before + 1
        );
        objects.built = None;
        objects.maybe_publish(&cfg, &slot);
        annotate(&slot, &record(80), &mut v);
        assert_eq!(v["pending_action"], "Deny", "{v:#}");
        assert_eq!(
            v["policies"]["pending_policies"],
            json!([{"kind": "StagedNetworkPolicy", "namespace": "x", "name": "server-in", "tier": "default", "action": "Deny", "rule_index": -1}])
        );
        let series = || {
            crate::telemetry::metrics::global()
                .staged_flows
                .with_label_values(&["StagedNetworkPolicy", "x/server-in", "newly_denied"])
                .get()
        };
        let start = series();
        count(&slot, &[record(80), record(443)]);
        assert_eq!(series() - start, 8);

        // The staged object deleted: rebuilt (after the spacing) with none, pending = enforced.
        objects.observe(&DatastoreEvent::Delete(ObjectRef {
            kind: ObjectKind::StagedNetworkPolicy,
            key: "x/server-in".into(),
        }));
        objects.maybe_publish(&cfg, &slot);
        assert!(slot.read().unwrap().is_some(), "spaced: not rebuilt yet");
        objects.built = None;
        objects.maybe_publish(&cfg, &slot);
        assert!(slot.read().unwrap().is_none());
        assert!(objects.announced.is_empty());
    }

    #[test]
    fn the_announcement_lists_the_staged_objects_sorted_with_their_action() {
        let mut objects = Objects::default();
        feed(&mut objects, CLUSTER);
        assert_eq!(
            announcement(&[]),
            "staged objects in the pending verdicts: []"
        );
        // The valid object only: the broken one would bump the rejections counter the test
        // above holds to an exact count, and tests run in parallel.
        feed(&mut objects, STAGED.split("---").next().unwrap());
        let staged: Vec<StagedInfo> = objects.staged.values().cloned().collect();
        assert_eq!(
            announcement(&staged),
            "staged objects in the pending verdicts: [StagedNetworkPolicy x/server-in (Set)]"
        );
        objects.maybe_publish(&RuleConfig::default(), &PendingSlot::default());
        assert_eq!(objects.announced, staged, "announced once published");
    }
}
