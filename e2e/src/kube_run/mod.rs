//! `netpol-e2e run --kubeconfig PATH`: the scenario files, with the same expectations, on a
//! real cluster, for an operator who wants to know whether the cluster enforces
//! NetworkPolicy and ClusterNetworkPolicy as written (docs/operations/connectivity-test.md).
//!
//! Per scenario: its namespaces under fresh names (`names`), agnhost pods with the scenario's
//! labels and ports on as many nodes as it asks for (`objects`), a Service per pod for
//! `target: service`; then per step the changes through the API, and every ordered pair
//! probed from inside the client pod (`api::RealCluster::probe`) over every family the
//! cluster gives pods and every protocol it carries (`probe`). What the scenario made is
//! deleted when it ends, fails, or the run is interrupted; nothing else is touched.
//!
//! Before anything is made the run checks that it may clean up after itself (create and
//! delete namespaces, and the rest of [`api::needed`]) and refuses, naming what is missing,
//! when it may not.

mod api;
mod explain;
mod flows;
mod names;
mod objects;
mod probe;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use k8s_openapi::api::core::v1::{Pod as KubePod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use netpol_agent::model::IpFamily;

use crate::expect::{PortKey, Protocol};
use crate::scenario::{self, Applied, Scenario, Target, World};
use api::RealCluster;
use names::{Names, RUN_LABEL};
use report::{Outcome as ScenarioOutcome, ScenarioReport, StepReport};

/// The image every scenario pod runs: agnhost, as upstream's suite uses it.
pub const DEFAULT_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.66.1";

#[derive(Clone, Debug)]
pub struct Config {
    pub kubeconfig: PathBuf,
    pub image: String,
    /// Probes in flight at once.
    pub jobs: usize,
    pub probe_timeout: Duration,
    /// How long a step may take to be enforced before its mismatches count.
    pub converge_timeout: Duration,
    /// How long a pod may take to start (image pulls included).
    pub pod_timeout: Duration,
    pub json: bool,
    pub verbose: bool,
    /// Hold the agent's `explain --kernel`, on each node, to every probe ([`explain`]).
    pub check_explain: bool,
    /// Hold the agents' flow records to every probe ([`flows`]; implies `check_explain`).
    pub check_flow_logs: bool,
    /// The label selector of the agent's pods (for `check_explain`).
    pub agent_selector: String,
}

/// What the cluster offers, found once before the first scenario.
#[derive(Clone, Debug)]
pub struct Offer {
    pub nodes: Vec<String>,
    pub families: Vec<IpFamily>,
    pub sctp: bool,
    pub sctp_reason: String,
    pub cluster_policies: bool,
}

pub fn main(cfg: Config, scenarios: Vec<Scenario>, stop: Arc<AtomicBool>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("netpol-e2e: {e}");
            return ExitCode::from(2);
        }
    };
    rt.block_on(run(cfg, scenarios, stop))
}

fn random_id(len: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    let mut n = h.finish();
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::new();
    // The first character is a letter: a suffix may end a name that must start with one.
    out.push(alphabet[(n % 26) as usize] as char);
    n /= 26;
    while out.len() < len {
        out.push(alphabet[(n % 36) as usize] as char);
        n /= 36;
        if n == 0 {
            h.write_u8(1);
            n = h.finish();
        }
    }
    out
}

/// Prints progress: on stdout for text output, on stderr when stdout carries the JSON.
fn say(cfg: &Config, text: &str) {
    if cfg.json {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}

async fn run(cfg: Config, scenarios: Vec<Scenario>, stop: Arc<AtomicBool>) -> ExitCode {
    let client = match api::connect(&cfg.kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("netpol-e2e: {e:#}");
            return ExitCode::from(2);
        }
    };
    let wants_cnp = scenarios.iter().any(uses_cluster_policies);
    let cnp_served = api::serves_cluster_policies(&client).await;
    match api::missing_permissions(&client, wants_cnp && cnp_served, cfg.check_explain).await {
        Ok(missing) if missing.is_empty() => {}
        Ok(missing) => {
            eprintln!(
                "netpol-e2e: refusing to run: this kubeconfig's user may not {}. A run makes its \
                 own namespaces and must be able to delete every one of them again; grant \
                 these (docs/operations/connectivity-test.md, \"Permissions\") or use another \
                 kubeconfig. Nothing was created.",
                missing.join(", ")
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("netpol-e2e: refusing to run: {e:#}. Nothing was created.");
            return ExitCode::from(2);
        }
    }
    let run_id = random_id(8);
    let cluster = Arc::new(RealCluster::new(client, &run_id));
    let outcome = tokio::select! {
        r = run_scenarios(&cfg, &cluster, scenarios, cnp_served, &stop) => r,
        _ = watch_stop(&stop) => Err(anyhow!("interrupted")),
    };
    // Always: whatever the scenarios made, also after a failure or Ctrl-C.
    let left = cluster.clean_up(Duration::from_secs(120)).await;
    if !left.is_empty() {
        eprintln!(
            "netpol-e2e: not cleaned up (remove with `kubectl delete ns -l {RUN_LABEL}={run_id}` \
             and `kubectl delete clusternetworkpolicies -l {RUN_LABEL}={run_id}`): {}",
            left.join(", ")
        );
    }
    match outcome {
        Ok(run) => {
            let text = report::summary(&run, cfg.json);
            print!("{text}");
            if run.clean(left.is_empty()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("netpol-e2e: {e:#}; everything this run made was deleted");
            ExitCode::FAILURE
        }
    }
}

async fn watch_stop(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn uses_cluster_policies(s: &Scenario) -> bool {
    s.steps
        .iter()
        .any(|st| !st.world.cluster_policies.is_empty())
}

/// Finds what the cluster offers: schedulable nodes, pod families, SCTP (one preflight pod
/// in a namespace of its own, deleted with the rest).
async fn offer(cfg: &Config, cluster: &RealCluster, cnp: bool) -> anyhow::Result<Offer> {
    let nodes = api::schedulable_nodes(&cluster.client).await?;
    if nodes.is_empty() {
        bail!("no node takes pods (none is Ready, schedulable and without a NoSchedule taint)");
    }
    let s = scenario::parse(
        "name: preflight\nnamespaces: {netpol-e2e-preflight: {}}\npods: {netpol-e2e-preflight/p: {ports: [{port: 8080}]}}\nsteps: [{expect: {'*': {}}}]\n",
        std::path::Path::new("preflight"),
    )?;
    let names = Names::new(&s, &random_id(5))?;
    let ns = "netpol-e2e-preflight";
    cluster
        .create_namespace(&objects::namespace(
            &names,
            &cluster.run,
            ns,
            &s.initial.namespaces[ns],
        ))
        .await?;
    let pod = &s.initial.pods[&format!("{ns}/p")];
    cluster
        .create(&objects::pod(&names, pod, &cfg.image, None, false))
        .await?;
    let (ips, _) = cluster
        .wait_pod_ready(&names.ns(ns), "p", cfg.pod_timeout)
        .await
        .with_context(|| format!("the preflight pod (image {}) did not start", cfg.image))?;
    let mut families = Vec::new();
    if ips.iter().any(IpAddr::is_ipv4) {
        families.push(IpFamily::V4);
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        families.push(IpFamily::V6);
    }
    // The pod reaches itself over TCP: exec and agnhost work. Then SCTP on loopback: a kernel
    // without SCTP refuses the socket itself.
    let me = ips[0];
    let tcp = cluster
        .probe_batch(
            &names.ns(ns),
            "p",
            &[(me, 8080, Protocol::Tcp)],
            Duration::from_secs(3),
        )
        .await
        .remove(0);
    if !tcp.connected() {
        bail!(
            "the preflight pod cannot reach its own TCP port through `agnhost connect` ({tcp:?}): \
             is {} an agnhost image?",
            cfg.image
        );
    }
    let (sctp, sctp_reason) = probe::sctp_offered(cluster, &names.ns(ns), "p").await;
    cluster.delete_namespace(&names.ns(ns)).await?;
    Ok(Offer {
        nodes,
        families,
        sctp,
        sctp_reason,
        cluster_policies: cnp,
    })
}

pub struct RunResult {
    pub offer: Offer,
    pub scenarios: Vec<ScenarioReport>,
    /// Set when the first isolating step showed no enforcement at all: the run stopped there.
    pub no_enforcement: Option<String>,
    pub elapsed: Duration,
}

impl RunResult {
    fn clean(&self, cleaned: bool) -> bool {
        cleaned
            && self.no_enforcement.is_none()
            && self.scenarios.iter().all(|s| {
                matches!(
                    s.outcome,
                    ScenarioOutcome::Passed | ScenarioOutcome::Skipped(_)
                )
            })
    }
}

async fn run_scenarios(
    cfg: &Config,
    cluster: &RealCluster,
    scenarios: Vec<Scenario>,
    cnp: bool,
    stop: &AtomicBool,
) -> anyhow::Result<RunResult> {
    let start = Instant::now();
    let offer = offer(cfg, cluster, cnp).await?;
    say(
        cfg,
        &report::header(&offer, scenarios.len(), &cluster.run, cfg),
    );
    let mut out = RunResult {
        offer: offer.clone(),
        scenarios: Vec::new(),
        no_enforcement: None,
        elapsed: Duration::ZERO,
    };
    let mut enforcement_seen = false;
    for s in &scenarios {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let mut rep = ScenarioReport::new(s);
        if uses_cluster_policies(s) && !offer.cluster_policies {
            rep.outcome = ScenarioOutcome::Skipped(
                "the cluster does not serve ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2)"
                    .into(),
            );
        } else {
            let names = Names::new(s, &random_id(5));
            match names {
                Err(e) => rep.outcome = ScenarioOutcome::Error(format!("{e:#}")),
                Ok(names) => {
                    let mut runner = ScenarioRun::new(cfg, cluster, &offer, s, names);
                    let r = runner.run(&mut rep, &mut enforcement_seen).await;
                    let cleanup = runner.tear_down().await;
                    if let Err(e) = r {
                        rep.outcome = ScenarioOutcome::Error(format!("{e:#}"));
                    }
                    if let Err(e) = cleanup {
                        rep.notes.push(format!("cleanup: {e:#}"));
                    }
                }
            }
        }
        rep.elapsed = started.elapsed();
        say(cfg, &report::scenario_text(&rep, cfg.verbose));
        let no_enforcement = rep.no_enforcement.clone();
        out.scenarios.push(rep);
        if let Some(why) = no_enforcement {
            out.no_enforcement = Some(why);
            break;
        }
    }
    out.elapsed = start.elapsed();
    Ok(out)
}

/// One pod as it runs on the cluster.
#[derive(Clone, Debug)]
struct LivePod {
    ips: Vec<IpAddr>,
    cluster_ips: Vec<IpAddr>,
    /// The node it runs on.
    node: String,
}

impl LivePod {
    fn addr(&self, family: IpFamily, target: Target) -> Option<IpAddr> {
        let list = match target {
            Target::Pod => &self.ips,
            Target::Service => &self.cluster_ips,
        };
        list.iter()
            .copied()
            .find(|a| a.is_ipv4() == (family == IpFamily::V4))
    }
}

struct ScenarioRun<'a> {
    cfg: &'a Config,
    cluster: &'a RealCluster,
    offer: &'a Offer,
    scenario: &'a Scenario,
    names: Names,
    world: World,
    live: BTreeMap<String, LivePod>,
    namespaces: BTreeSet<String>,
    cluster_policies: BTreeSet<String>,
    families: Vec<IpFamily>,
    /// `--check-flow-logs`: what the scenario's earlier steps expected per record key.
    flow_earlier: std::cell::RefCell<crate::flow_check::Earlier>,
}

impl<'a> ScenarioRun<'a> {
    fn new(
        cfg: &'a Config,
        cluster: &'a RealCluster,
        offer: &'a Offer,
        scenario: &'a Scenario,
        names: Names,
    ) -> Self {
        ScenarioRun {
            cfg,
            cluster,
            offer,
            scenario,
            names,
            world: World::default(),
            live: BTreeMap::new(),
            namespaces: BTreeSet::new(),
            cluster_policies: BTreeSet::new(),
            families: Vec::new(),
            flow_earlier: Default::default(),
        }
    }

    /// The cluster node a scenario node runs on (scenario nodes beyond the cluster's share).
    fn node_of(&self, node: usize) -> &str {
        &self.offer.nodes[node % self.offer.nodes.len()]
    }

    async fn run(
        &mut self,
        rep: &mut ScenarioReport,
        enforcement_seen: &mut bool,
    ) -> anyhow::Result<()> {
        let s = self.scenario;
        rep.suffix = self.names.suffix.clone();
        if s.nodes > self.offer.nodes.len() {
            rep.notes.push(format!(
                "the scenario spreads pods over {} nodes, the cluster has {} that take pods: some share",
                s.nodes,
                self.offer.nodes.len()
            ));
        }
        self.families = self.offer.families.clone();
        let v4_blocks = s
            .steps
            .iter()
            .flat_map(|st| {
                st.world
                    .policies
                    .values()
                    .chain(st.world.cluster_policies.values())
            })
            .any(|d| names::has_ipv4_block(d));
        if v4_blocks && self.families.contains(&IpFamily::V6) {
            self.families.retain(|f| *f == IpFamily::V4);
            rep.notes.push(
                "IPv6 not probed: the scenario's address blocks are IPv4, its expectations do not \
                 carry over"
                    .into(),
            );
        }
        if self.families.is_empty() {
            rep.outcome = ScenarioOutcome::Skipped(
                "the scenario's address blocks are IPv4 and the cluster's pods have IPv6 only"
                    .into(),
            );
            return Ok(());
        }
        let sctp_keys = s
            .steps
            .iter()
            .flat_map(|st| st.expect.keys())
            .any(|k| k.protocol == Protocol::Sctp);
        if sctp_keys && !self.offer.sctp {
            rep.notes
                .push(format!("SCTP not probed: {}", self.offer.sctp_reason));
        }
        self.converge_to(&s.initial.clone(), None).await?;
        let mut previous: Option<&scenario::Step> = None;
        let mut probed_steps = 0;
        for (i, step) in s.steps.iter().enumerate() {
            let t0 = self.converge_to(&step.world, step.apply.as_deref()).await?;
            let changed = probe::changed_pairs(previous, step);
            let sr = probe::check_step(self, step, i, t0, &changed).await;
            let failed = !sr.passed;
            if failed && !*enforcement_seen && sr.nothing_enforced() {
                rep.no_enforcement = Some(format!(
                    "no NetworkPolicy enforcement: after step {} of {:?} every one of the {} probes \
                     its policies deny connected. Is a NetworkPolicy implementation running on the \
                     nodes (is the agent installed, are its pods ready)? The run stops here.",
                    i + 1,
                    s.name,
                    sr.denied_probes()
                ));
            }
            if sr.saw_a_drop() {
                *enforcement_seen = true;
            }
            let unprobed = sr.probes == 0;
            rep.steps.push(sr);
            if unprobed {
                continue;
            }
            probed_steps += 1;
            if failed {
                rep.outcome = ScenarioOutcome::Failed;
                return Ok(());
            }
            previous = Some(step);
        }
        rep.outcome = if probed_steps == 0 {
            ScenarioOutcome::Skipped(
                "nothing left to probe: every probe of the scenario is of a protocol or family \
                 the cluster does not carry"
                    .into(),
            )
        } else {
            ScenarioOutcome::Passed
        };
        Ok(())
    }

    /// Makes the cluster hold `next` (and the step's policies, expanded with the addresses
    /// the pods really have). Returns when the last write was made: the step's time zero.
    async fn converge_to(&mut self, next: &World, apply: Option<&str>) -> anyhow::Result<Instant> {
        let c = self.cluster;
        let run = c.run.clone();
        // Namespaces: new ones, relabelled ones.
        for (ns, labels) in &next.namespaces {
            match self.world.namespaces.get(ns) {
                None => {
                    c.create_namespace(&objects::namespace(&self.names, &run, ns, labels))
                        .await?;
                    self.namespaces.insert(ns.clone());
                }
                Some(before) if before != labels => {
                    let patch = objects::namespace_labels_patch(&self.names, &run, before, labels);
                    c.patch_namespace(&self.names.ns(ns), &patch).await?;
                }
                Some(_) => {}
            }
        }
        // Pods that are gone, or made again (a new uid: a new pod, a new address).
        let mut wait_gone = Vec::new();
        for (key, pod) in &self.world.pods {
            if !next.namespaces.contains_key(&pod.namespace) {
                self.live.remove(key);
                continue;
            }
            let again = next.pods.get(key).is_some_and(|p| p.uid != pod.uid);
            if !next.pods.contains_key(key) || again {
                let ns = self.names.ns(&pod.namespace);
                c.delete::<KubePod>(&ns, &pod.name).await?;
                self.live.remove(key);
                if again {
                    wait_gone.push((ns, pod.name.clone()));
                } else if self.scenario.target == Target::Service {
                    c.delete::<Service>(&ns, &objects::service_name(&pod.name))
                        .await?;
                }
            }
        }
        for ns in self.world.namespaces.keys() {
            if !next.namespaces.contains_key(ns) {
                c.delete_namespace(&self.names.ns(ns)).await?;
                // A later step may make it again: the name must be free by then.
                c.wait_namespace_gone(&self.names.ns(ns), self.cfg.pod_timeout)
                    .await?;
                self.namespaces.remove(ns);
            }
        }
        for (ns, name) in wait_gone {
            c.wait_pod_gone(&ns, &name, self.cfg.pod_timeout).await?;
        }
        // New pods: all created, then each waited for.
        let sctp = self.offer.sctp;
        let mut new = Vec::new();
        for (key, pod) in &next.pods {
            if self.live.contains_key(key) {
                continue;
            }
            let node = self.node_of(pod.node).to_string();
            c.create(&objects::pod(
                &self.names,
                pod,
                &self.cfg.image,
                Some(&node),
                sctp,
            ))
            .await?;
            new.push(key.clone());
        }
        let dual = self.offer.families.len() == 2;
        for key in new {
            let pod = &next.pods[&key];
            let ns = self.names.ns(&pod.namespace);
            let (ips, node) = c
                .wait_pod_ready(&ns, &pod.name, self.cfg.pod_timeout)
                .await?;
            // The node the pod landed on is the one asked for (a nodeSelector), or the pod
            // would not be running.
            let mut cluster_ips = Vec::new();
            // A Service needs a port: a pod that serves only SCTP on a cluster without it gets
            // none, and probes to it are left out (the note on SCTP says why).
            let serves = objects::served(pod, sctp).next().is_some();
            if self.scenario.target == Target::Service && serves {
                let svc = objects::service_name(&pod.name);
                let existed = self
                    .world
                    .pods
                    .get(&key)
                    .is_some_and(|p| self.world.namespaces.contains_key(&p.namespace));
                if !existed {
                    c.create(&objects::service(&self.names, pod, dual, sctp))
                        .await?;
                }
                for ip in &ips {
                    let slice = objects::endpoint_slice(&self.names, pod, *ip, Some(&node), sctp);
                    c.put_slice(&slice).await?;
                }
                cluster_ips = c.cluster_ips(&ns, &svc).await?;
            }
            self.live.insert(
                key,
                LivePod {
                    ips,
                    cluster_ips,
                    node,
                },
            );
        }
        // Labels of pods that stay.
        for (key, pod) in &next.pods {
            if let Some(before) = self.world.pods.get(key) {
                if before.uid == pod.uid && before.labels != pod.labels {
                    let patch = objects::pod_labels_patch(&before.labels, &pod.labels);
                    c.patch_pod(&self.names.ns(&pod.namespace), &pod.name, &patch)
                        .await?;
                }
            }
        }
        // Policies: the ones dropped (a deleted namespace takes its own), then the step's.
        for key in self.world.policies.keys() {
            if next.policies.contains_key(key) {
                continue;
            }
            let (ns, name) = scenario::split_key(key)?;
            if next.namespaces.contains_key(ns) {
                c.delete::<NetworkPolicy>(&self.names.ns(ns), name).await?;
            }
        }
        for name in self.world.cluster_policies.keys() {
            if !next.cluster_policies.contains_key(name) {
                c.delete_cluster_policy(&self.names.cluster_policy(name))
                    .await?;
                self.cluster_policies.remove(name);
            }
        }
        if let Some(text) = apply {
            let real = self.real_world(next, text)?;
            let expanded = scenario::expand(text, &real).context("apply")?;
            for policy in scenario::split_policies(&expanded).context("apply")? {
                // A policy the same step deletes again (or whose namespace it deletes) is not
                // in `next`: the step's end state is what counts.
                match policy {
                    Applied::NetworkPolicy { key, .. } if !next.policies.contains_key(&key) => {}
                    Applied::ClusterNetworkPolicy { name, .. }
                        if !next.cluster_policies.contains_key(&name) => {}
                    Applied::NetworkPolicy { doc, .. } => {
                        let v = self.names.network_policy(&doc)?;
                        c.apply_network_policy(&serde_json::to_value(&v)?).await?;
                    }
                    Applied::ClusterNetworkPolicy { name, doc } => {
                        let mut v = serde_json::to_value(self.names.cluster_network_policy(&doc)?)?;
                        v["metadata"]["labels"][RUN_LABEL] = run.clone().into();
                        c.apply_cluster_policy(&v).await?;
                        self.cluster_policies.insert(name);
                    }
                }
            }
        }
        self.world = next.clone();
        Ok(Instant::now())
    }

    /// `next` with every pod's address the one it really has, for `${ip:…}`/`${cidr:…}`.
    fn real_world(&self, next: &World, text: &str) -> anyhow::Result<World> {
        let mut real = next.clone();
        for (key, pod) in real.pods.iter_mut() {
            let live = self
                .live
                .get(key)
                .ok_or_else(|| anyhow!("pod {key} is not running"))?;
            let v4 = live.ips.iter().find_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            });
            match v4 {
                Some(a) => pod.ip = a,
                // The placeholders stand for IPv4 addresses (the scenario format's); a pod
                // without one cannot stand in.
                None if text.contains(&format!(":{key}")) => {
                    bail!("the step's policies name pod {key}'s address, and it has no IPv4 one")
                }
                None => {}
            }
        }
        Ok(real)
    }

    /// Deletes what the scenario made: its cluster policies, its namespaces (their pods,
    /// Services and policies with them). Waiting for them to go is the run's last step.
    async fn tear_down(&mut self) -> anyhow::Result<()> {
        let mut first_err = None;
        for name in std::mem::take(&mut self.cluster_policies) {
            if let Err(e) = self
                .cluster
                .delete_cluster_policy(&self.names.cluster_policy(&name))
                .await
            {
                first_err.get_or_insert(e);
            }
        }
        for ns in std::mem::take(&mut self.namespaces) {
            if let Err(e) = self.cluster.delete_namespace(&self.names.ns(&ns)).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

// The step check lives in `probe`; these are what it needs of a running scenario.
impl ScenarioRun<'_> {
    /// Whether scenario pod `pod` serves `key` on this cluster (what its Service declares:
    /// SCTP ports only where the cluster carries SCTP).
    fn serves(&self, pod: &str, key: &PortKey) -> bool {
        self.world.pods.get(pod).is_some_and(|p| {
            objects::served(p, self.offer.sctp)
                .any(|d| d.protocol == key.protocol && d.port == key.port)
        })
    }

    fn step_report(&self, name: &str, index: usize) -> StepReport {
        StepReport::new(name, index, self.scenario.steps.len())
    }
}
