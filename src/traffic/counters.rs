//! The kernel's rule counters as Prometheus counters: packets and bytes each policy's allow
//! rules matched, per direction (`netpol_policy_packets_total`, `..._bytes_total`), and the
//! packets each local pod's policy drop dropped (`netpol_denied_packets_total`) and the
//! dispatch's unknown-interface drops (`netpol_denied_unknown_interface_packets_total`). No
//! extra rules: the counters every rule already has.
//!
//! The calculation loop builds a [`CounterPlan`] from the graph (which rule hash, in which
//! chain and family, counts what) and publishes it at most once per interval when chains
//! changed; a thread reads the kernel on the interval (`host::rule_counters`: one getsockopt
//! pair per family on legacy, one netlink dump per counted chain on nft; no child process)
//! and adds what each counted rule gained since the last read.
//!
//! Counting rules: the first read after start is the baseline (counts from before the agent
//! started are not exported); a rule seen for the first time later (a new policy, a new pod)
//! contributes everything it counted since it was created; a rule whose counters went down was
//! replaced, and contributes its new value. Series of policies no longer active and pods no
//! longer local are removed, so the label sets stay bounded by what this node holds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::calc_graph::CalcGraph;
use crate::host::rule_counters::{self, Family, Xtables};
use crate::model::{IpFamily, ObjectKey};
use crate::rules::counted::Classifier;
use crate::rules::{
    from_workload_chain, policy_chain, to_workload_chain, Direction, FROM_WL_DISPATCH,
    RULE_HASH_PREFIX, TO_WL_ADDR_DISPATCH, TO_WL_DISPATCH,
};
use crate::telemetry::metrics;

/// What one counted rule counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counted {
    PolicyAllow {
        policy: ObjectKey,
        direction: Direction,
    },
    PodDrop {
        pod: ObjectKey,
        direction: Direction,
    },
    UnknownDrop {
        direction: Direction,
    },
}

/// Family → chain → (rule hash, what it counts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterPlan {
    chains: HashMap<(IpFamily, String), Vec<(String, Counted)>>,
}

impl CounterPlan {
    /// From the graph's emitted chains: policy allows when `policies`, policy and
    /// unknown-interface drops when `denies`.
    pub fn build(graph: &CalcGraph, policies: bool, denies: bool) -> CounterPlan {
        let cfg = &graph.config().rules;
        let mut owners: HashMap<String, Owner> = HashMap::new();
        if policies {
            for p in graph.active_policies() {
                for direction in [Direction::Ingress, Direction::Egress] {
                    owners.insert(
                        policy_chain(direction, &p.namespace, &p.name),
                        Owner::Policy(p.clone(), direction),
                    );
                }
            }
        }
        if denies {
            for ep in graph.programmed_endpoints() {
                owners.insert(
                    to_workload_chain(ep.iface),
                    Owner::Pod(ep.key.clone(), Direction::Ingress),
                );
                owners.insert(
                    from_workload_chain(ep.iface),
                    Owner::Pod(ep.key.clone(), Direction::Egress),
                );
            }
        }
        let classifiers: HashMap<IpFamily, Classifier> = graph
            .config()
            .families
            .iter()
            .map(|f| (*f, Classifier::new(cfg, *f)))
            .collect();
        let mut chains = HashMap::new();
        for (family, chain) in graph.emitted_chains() {
            let Some(c) = classifiers.get(&family) else {
                continue;
            };
            let owner = match owners.get(&chain.name) {
                Some(o) => o.clone(),
                None if denies && chain.name.starts_with(FROM_WL_DISPATCH) => {
                    Owner::Dispatch(Direction::Egress)
                }
                None if denies
                    && (chain.name.starts_with(TO_WL_DISPATCH)
                        || chain.name == TO_WL_ADDR_DISPATCH) =>
                {
                    Owner::Dispatch(Direction::Ingress)
                }
                None => continue,
            };
            let counted: Vec<(String, Counted)> = chain
                .rules
                .iter()
                .filter_map(|r| {
                    let what = match &owner {
                        Owner::Policy(policy, direction) if c.is_policy_allow(&r.body) => {
                            Counted::PolicyAllow {
                                policy: policy.clone(),
                                direction: *direction,
                            }
                        }
                        Owner::Pod(pod, direction) if c.is_policy_drop(&r.body) => {
                            Counted::PodDrop {
                                pod: pod.clone(),
                                direction: *direction,
                            }
                        }
                        Owner::Dispatch(direction) if c.is_unknown_drop(&r.body) => {
                            Counted::UnknownDrop {
                                direction: *direction,
                            }
                        }
                        _ => return None,
                    };
                    Some((r.hash.clone(), what))
                })
                .collect();
            if !counted.is_empty() {
                chains.insert((family, chain.name.clone()), counted);
            }
        }
        CounterPlan { chains }
    }

    pub fn lookup(&self, family: IpFamily, chain: &str, hash: &str) -> Option<&Counted> {
        // One allocation-free probe per rule would need a borrowed tuple key; chains are few
        // per family, so look the chain up by an owned key only for our chains.
        self.chains
            .get(&(family, chain.to_string()))?
            .iter()
            .find(|(h, _)| h == hash)
            .map(|(_, c)| c)
    }

    /// The chains of `family` holding counted rules (what a read asks the kernel for).
    pub fn chains(&self, family: IpFamily) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .chains
            .keys()
            .filter(|(f, _)| *f == family)
            .map(|(_, c)| c.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// Every counted rule.
    pub fn rules(&self) -> impl Iterator<Item = (IpFamily, &str, &str, &Counted)> {
        self.chains.iter().flat_map(|((f, chain), rules)| {
            rules
                .iter()
                .map(move |(h, c)| (*f, chain.as_str(), h.as_str(), c))
        })
    }

    pub fn len(&self) -> usize {
        self.chains.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }
}

#[derive(Clone, Debug)]
enum Owner {
    Policy(ObjectKey, Direction),
    Pod(ObjectKey, Direction),
    Dispatch(Direction),
}

/// The plan the calculation loop publishes and the reader thread reads.
pub type PlanSlot = RwLock<Option<Arc<CounterPlan>>>;

#[derive(Clone, Debug)]
pub struct CounterSettings {
    pub xtables: Xtables,
    pub families: Vec<IpFamily>,
    pub interval: Duration,
}

/// One counted rule, as the delta bookkeeping keys it.
type RuleKey = (IpFamily, String, String);

/// The reader's memory between reads: what each counted rule showed last time.
#[derive(Debug, Default)]
pub struct Deltas {
    last: HashMap<RuleKey, (u64, u64)>,
    baseline_done: HashSet<IpFamily>,
    exported: HashSet<Counted>,
}

/// What one read added, per counted thing: (packets, bytes).
pub type Gains = HashMap<Counted, (u64, u64)>;

impl Deltas {
    /// Folds one family's reading (`(chain, hash) → (packets, bytes)` for the counted rules)
    /// into gains per counted thing.
    pub fn fold(
        &mut self,
        family: IpFamily,
        plan: &CounterPlan,
        reading: Reading,
        gains: &mut Gains,
    ) {
        let baseline = self.baseline_done.insert(family);
        let mut next = HashMap::with_capacity(reading.len());
        for ((chain, hash), (packets, bytes)) in reading {
            let Some(counted) = plan.lookup(family, &chain, &hash) else {
                continue;
            };
            let key = (family, chain, hash);
            let (dp, db) = match self.last.get(&key) {
                _ if baseline => (0, 0),
                Some(&(p0, b0)) if packets >= p0 && bytes >= b0 => (packets - p0, bytes - b0),
                // New since the last read, or replaced (counters went down).
                _ => (packets, bytes),
            };
            let g = gains.entry(counted.clone()).or_default();
            g.0 += dp;
            g.1 += db;
            next.insert(key, (packets, bytes));
        }
        // Rules gone from the kernel are forgotten; should one come back, it is new.
        self.last.retain(|(f, _, _), _| *f != family);
        self.last.extend(next);
    }
}

/// One family's counted rules: (chain, hash) → (packets, bytes).
pub type Reading = HashMap<(String, String), (u64, u64)>;

/// Reads every family once; the counted rules' readings per family.
fn read_all(
    settings: &CounterSettings,
    plan: &CounterPlan,
) -> Vec<(IpFamily, std::io::Result<Reading>)> {
    settings
        .families
        .iter()
        .map(|&family| {
            let fam = match family {
                IpFamily::V4 => Family::V4,
                IpFamily::V6 => Family::V6,
            };
            let mut reading = HashMap::new();
            let chains = plan.chains(family);
            let result =
                rule_counters::read_chains(settings.xtables, fam, "filter", &chains, |c| {
                    let Some(hash) = c.comment.strip_prefix(RULE_HASH_PREFIX) else {
                        return;
                    };
                    if plan.lookup(family, c.chain, hash).is_some() {
                        reading.insert(
                            (c.chain.to_string(), hash.to_string()),
                            (c.packets, c.bytes),
                        );
                    }
                });
            (family, result.map(|_| reading))
        })
        .collect()
}

/// Adds the gains to the metrics and removes the series of things no longer in the plan.
fn export(plan: &CounterPlan, gains: &Gains, exported: &mut HashSet<Counted>) {
    let m = metrics::global();
    for (counted, (packets, bytes)) in gains {
        match counted {
            Counted::PolicyAllow { policy, direction } => {
                let l = [policy.namespace.as_str(), &policy.name, direction.as_str()];
                m.policy_packets.with_label_values(&l).inc_by(*packets);
                m.policy_bytes.with_label_values(&l).inc_by(*bytes);
            }
            Counted::PodDrop { pod, direction } => {
                m.denied_packets
                    .with_label_values(&[pod.namespace.as_str(), &pod.name, direction.as_str()])
                    .inc_by(*packets);
            }
            Counted::UnknownDrop { direction } => {
                m.denied_unknown_interface_packets
                    .with_label_values(&[direction.as_str()])
                    .inc_by(*packets);
            }
        }
        exported.insert(counted.clone());
    }
    let live: HashSet<&Counted> = plan.rules().map(|(_, _, _, c)| c).collect();
    exported.retain(|c| {
        if live.contains(c) {
            return true;
        }
        match c {
            Counted::PolicyAllow { policy, direction } => {
                let l = [policy.namespace.as_str(), &policy.name, direction.as_str()];
                let _ = m.policy_packets.remove_label_values(&l);
                let _ = m.policy_bytes.remove_label_values(&l);
            }
            Counted::PodDrop { pod, direction } => {
                let _ = m.denied_packets.remove_label_values(&[
                    pod.namespace.as_str(),
                    &pod.name,
                    direction.as_str(),
                ]);
            }
            Counted::UnknownDrop { .. } => return true,
        }
        false
    });
}

/// The reader thread: reads on the interval until `stop`. Errors are counted and logged
/// (once per kind of failure in a row), never fatal: enforcement does not depend on them.
pub fn spawn(
    settings: CounterSettings,
    slot: Arc<PlanSlot>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rule-counters".into())
        .spawn(move || {
            let m = metrics::global();
            let mut deltas = Deltas::default();
            let mut last_error: Option<String> = None;
            let mut next = Instant::now() + settings.interval;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(200)));
                    continue;
                }
                next = now + settings.interval;
                let plan = slot.read().ok().and_then(|p| p.clone());
                let Some(plan) = plan else { continue };
                let started = Instant::now();
                let mut gains = Gains::new();
                for (family, result) in read_all(&settings, &plan) {
                    match result {
                        Ok(reading) => deltas.fold(family, &plan, reading, &mut gains),
                        Err(e) => {
                            m.rule_counter_read_errors.inc();
                            let text = format!("{e}");
                            if last_error.as_deref() != Some(text.as_str()) {
                                tracing::warn!(
                                    ip_version = metrics::ip_version(family),
                                    "reading the kernel's rule counters: {text}"
                                );
                                last_error = Some(text);
                            }
                        }
                    }
                }
                m.rule_counter_read_seconds
                    .observe(started.elapsed().as_secs_f64());
                export(&plan, &gains, &mut deltas.exported);
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Calculation;
    use crate::calc_graph::GraphConfig;
    use crate::iface_naming::CalicoResolver;
    use crate::model::{LabelSel, PodInfo, PolicyInfo};
    use crate::rules::RuleConfig;

    fn graph() -> Calculation {
        let mut g = Calculation::new(
            GraphConfig {
                node_name: "n".into(),
                families: vec![IpFamily::V4, IpFamily::V6],
                rules: RuleConfig::default(),
            },
            Box::new(CalicoResolver::default()),
        );
        g.upsert_pod_info(PodInfo {
            key: ObjectKey::new("x", "a"),
            uid: None,
            node: Some("n".into()),
            labels: Default::default(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            named_ports: vec![],
            sandbox_id: None,
        });
        g.upsert_policy_info(PolicyInfo {
            key: ObjectKey::new("x", "allow-all-in"),
            pod_selector: LabelSel::everything(),
            ingress: Some(vec![crate::model::PolicyRule {
                ports: vec![],
                peers: None,
            }]),
            egress: None,
        });
        g.flush();
        g
    }

    #[test]
    fn the_plan_counts_allows_pod_drops_and_unknown_drops_per_family() {
        let g = graph();
        let plan = CounterPlan::build(&g, true, true);
        let mut kinds: Vec<(IpFamily, Counted)> =
            plan.rules().map(|(f, _, _, c)| (f, c.clone())).collect();
        kinds.sort();
        let policy = ObjectKey::new("x", "allow-all-in");
        let pod = ObjectKey::new("x", "a");
        for family in [IpFamily::V4, IpFamily::V6] {
            let of: Vec<&Counted> = kinds
                .iter()
                .filter(|(f, _)| *f == family)
                .map(|(_, c)| c)
                .collect();
            assert!(of.contains(&&Counted::PolicyAllow {
                policy: policy.clone(),
                direction: Direction::Ingress
            }));
            // Only ingress is isolated: one policy drop, in cali-tw-.
            assert_eq!(
                of.iter()
                    .filter(|c| matches!(c, Counted::PodDrop { .. }))
                    .collect::<Vec<_>>(),
                vec![&&Counted::PodDrop {
                    pod: pod.clone(),
                    direction: Direction::Ingress
                }]
            );
            // Both dispatch roots (one pod: no child chains).
            assert_eq!(
                of.iter()
                    .filter(|c| matches!(c, Counted::UnknownDrop { .. }))
                    .count(),
                2
            );
        }
        let only_policies = CounterPlan::build(&g, true, false);
        assert!(only_policies
            .rules()
            .all(|(_, _, _, c)| matches!(c, Counted::PolicyAllow { .. })));
        assert!(CounterPlan::build(&g, false, false).is_empty());
    }

    #[test]
    fn deltas_start_from_a_baseline_count_new_rules_whole_and_survive_resets() {
        let g = graph();
        let plan = CounterPlan::build(&g, true, true);
        let (_, chain, hash, counted) = plan
            .rules()
            .find(|(f, _, _, c)| *f == IpFamily::V4 && matches!(c, Counted::PolicyAllow { .. }))
            .map(|(f, ch, h, c)| (f, ch.to_string(), h.to_string(), c.clone()))
            .unwrap();
        let reading = |p: u64, b: u64| HashMap::from([((chain.clone(), hash.clone()), (p, b))]);
        let mut d = Deltas::default();
        let mut gains = Gains::new();
        d.fold(IpFamily::V4, &plan, reading(100, 9000), &mut gains);
        assert_eq!(gains[&counted], (0, 0), "the first read is the baseline");
        let mut gains = Gains::new();
        d.fold(IpFamily::V4, &plan, reading(130, 9900), &mut gains);
        assert_eq!(gains[&counted], (30, 900));
        let mut gains = Gains::new();
        d.fold(IpFamily::V4, &plan, reading(4, 400), &mut gains);
        assert_eq!(gains[&counted], (4, 400), "replaced rule: its new count");
        // A rule unseen before (after the baseline) counts whole; a foreign hash nothing.
        let mut gains = Gains::new();
        let mut r = reading(10, 100);
        r.insert((chain.clone(), "not-ours".into()), (5, 5));
        d.last.clear();
        d.fold(IpFamily::V4, &plan, r, &mut gains);
        assert_eq!(gains.len(), 1);
        assert_eq!(gains[&counted], (10, 100));
    }
}
