//! Verdicts: why a flow is allowed or denied, computed from the objects alone (pure: model,
//! rules and ipsets only), and a small interpreter of our rule dialect over what a kernel
//! holds (`kernel`), so the two answers can be held against each other.
//!
//! # The evaluator
//!
//! [`State`] is built once from the validated objects: pods indexed by key and by IP, the
//! namespaces' labels, the policies in the order endpoint chains list them (by
//! namespace/name), and for every pod the policies that select it per direction. Evaluating
//! one flow ([`State::allowed`], [`State::explain`]) then costs two hash lookups to find the
//! pods behind the addresses and, per direction, a walk over the rules of the policies that
//! isolate that pod: a few microseconds, with no allocation on the `allowed` path beyond
//! nothing at all. That is what issue 13's conntrack re-evaluation needs: build the state
//! once per change, evaluate many flows.
//!
//! The semantics are Kubernetes', evaluated independently of the renderer, and match what
//! `rules::policy` renders (the property test in `tests.rs` checks the verdict of random
//! clusters against `kernel`'s interpretation of `compile` output): policyTypes are inferred
//! by validation; a pod is isolated in a direction exactly when a policy of that direction
//! selects it; a rule without peers matches every peer, a peer is a namespace scope and a pod
//! selector (AND) or an ipBlock minus its excepted CIDRs (matched on addresses, pod IPs
//! included, never across families); a rule without ports matches every protocol, an entry
//! matches its protocol only (TCP by default) and its port, range (`endPort`) or named port,
//! which is resolved on the destination pod's container ports; pods that use the host
//! network, have finished or have no IP are not endpoints, so their addresses are outside
//! peers.
//!
//! # The pipeline
//!
//! Each direction runs a list of tiers ([`TierReport`]), one file each: a tier decides
//! (allow or deny) or passes to the next; when none decides the flow is allowed. In order:
//! ClusterNetworkPolicy's Admin tier (`cluster`), NetworkPolicy (`netpol`), which decides
//! exactly when the pod is isolated in that direction, and ClusterNetworkPolicy's Baseline
//! tier (`cluster` again). Staged policies (`staged`) are evaluated as the tiers they would
//! join, on a state of their own, never on the enforced one. With kube-proxy in IPVS mode a
//! flow to a Service is judged where the agent's IPVS rules judge it (`ipvs`).
//!
//! The answer's types are in `report` (with their JSON), a flow's passes through one node's
//! filter table in `passes`, the text rendering in `text`.
//!
//! # Where the kernel implements it
//!
//! For the deciding steps the report names the chain and the `cali:` hash of the rule that
//! implements them (rendered with `rules`' provenance, so they are exactly the agent's): the
//! allow rule of the policy chain, the workload chain's "Drop if no policies passed packet",
//! the namespace profile. Workload chains are named after the pod's host interface, which the
//! caller supplies ([`State::set_interface`]); without it the report says the chain is not
//! known.

mod cluster;
mod ipvs;
pub mod kernel;
mod netpol;
mod passes;
mod report;
mod staged;
mod text;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use serde_json::{json, Value};

use crate::model::validate::{self, ValidationError};
use crate::model::{
    ClusterPolicyInfo, IpFamily, K8sObject, NamespaceInfo, ObjectKey, PodInfo, PolicyInfo,
    Protocol, StagedInfo, Tier,
};
use crate::rules::chains::{tiered_endpoint_chains_traced, TierChains};
use crate::rules::policy::{plan_policy, PolicyPlan};
use crate::rules::provenance::{ChainRole, TracedChain};
use crate::rules::union::{union_plan, UnionPlan};
use crate::rules::{Direction, EndpointToHostAction, RuleConfig};

pub use cluster::{tier_name, ClusterMatch, ClusterTierReport};
pub use netpol::{AllowMatch, Miss, MissKind, NetworkPolicyReport, NpOutcome};
pub use passes::NodePass;
pub use report::*;
pub use staged::{deciding_policies, DecidingPolicy, Staging};

/// A pod the objects hold that is not an endpoint, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NonWorkload {
    reason: &'static str,
    ip: Option<IpAddr>,
    node: Option<String>,
    host_network: bool,
}

/// Everything a flow is evaluated against, built once.
pub struct State {
    cfg: RuleConfig,
    pods: Vec<PodInfo>,
    by_key: HashMap<ObjectKey, usize>,
    by_ip: HashMap<IpAddr, Vec<usize>>,
    namespaces: HashMap<String, NamespaceInfo>,
    /// In endpoint-chain order (namespace/name).
    policies: Vec<PolicyInfo>,
    /// Per pod: the policies (indices) isolating it for ingress and for egress, in order.
    selected: Vec<[Vec<usize>; 2]>,
    /// ClusterNetworkPolicies in evaluation order (tier, priority, name).
    cluster: Vec<ClusterPolicyInfo>,
    /// Per pod, per tier (Admin, Baseline), per direction: the ClusterNetworkPolicies
    /// (indices) selecting it with rules in that direction, in order.
    cluster_selected: Vec<[[Vec<usize>; 2]; 2]>,
    interfaces: HashMap<ObjectKey, String>,
    /// Node addresses → node name.
    hosts: HashMap<IpAddr, String>,
    non_workloads: HashMap<ObjectKey, NonWorkload>,
    /// Every container port each pod declares (named or not), for explaining a flow
    /// without a port.
    declared: HashMap<ObjectKey, Vec<(Protocol, u16)>>,
    /// Staged objects: never part of the answers above, applied only by `staged`'s
    /// `with_staged` (issue 23).
    staged: Vec<StagedInfo>,
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Ingress => 0,
        Direction::Egress => 1,
    }
}

impl State {
    /// Builds the state from validated objects. Namespaces that are not given carry only
    /// `kubernetes.io/metadata.name`, as in the calc graph. Later duplicates win.
    pub fn new(
        cfg: RuleConfig,
        namespaces: impl IntoIterator<Item = NamespaceInfo>,
        pods: impl IntoIterator<Item = PodInfo>,
        policies: impl IntoIterator<Item = PolicyInfo>,
    ) -> State {
        let namespaces: HashMap<String, NamespaceInfo> = namespaces
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        let mut by_key: HashMap<ObjectKey, usize> = HashMap::new();
        let mut pod_list: Vec<PodInfo> = Vec::new();
        for p in pods {
            match by_key.get(&p.key) {
                Some(&i) => pod_list[i] = p,
                None => {
                    by_key.insert(p.key.clone(), pod_list.len());
                    pod_list.push(p);
                }
            }
        }
        // Namespaces only their pods name carry their name label, as in the calc graph.
        let mut namespaces = namespaces;
        for p in &pod_list {
            namespaces
                .entry(p.key.namespace.clone())
                .or_insert_with(|| NamespaceInfo::implicit(&p.key.namespace));
        }
        let mut by_ip: HashMap<IpAddr, Vec<usize>> = HashMap::new();
        for (i, p) in pod_list.iter().enumerate() {
            for ip in &p.ips {
                by_ip.entry(*ip).or_default().push(i);
            }
        }
        let mut policy_map: BTreeMap<ObjectKey, PolicyInfo> = BTreeMap::new();
        for p in policies {
            policy_map.insert(p.key.clone(), p);
        }
        let policies: Vec<PolicyInfo> = policy_map.into_values().collect();
        let mut by_ns: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, p) in policies.iter().enumerate() {
            by_ns.entry(p.key.namespace.as_str()).or_default().push(i);
        }
        let selected: Vec<[Vec<usize>; 2]> = pod_list
            .iter()
            .map(|pod| {
                let mut sel: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
                for &i in by_ns.get(pod.key.namespace.as_str()).into_iter().flatten() {
                    let p = &policies[i];
                    if !p.pod_selector.matches(&pod.labels) {
                        continue;
                    }
                    if p.ingress.is_some() {
                        sel[0].push(i);
                    }
                    if p.egress.is_some() {
                        sel[1].push(i);
                    }
                }
                sel
            })
            .collect();
        State {
            cfg,
            pods: pod_list,
            by_key,
            by_ip,
            namespaces,
            policies,
            cluster_selected: vec![Default::default(); selected.len()],
            selected,
            cluster: Vec::new(),
            interfaces: HashMap::new(),
            hosts: HashMap::new(),
            non_workloads: HashMap::new(),
            declared: HashMap::new(),
            staged: Vec::new(),
        }
    }

    /// Sets the ClusterNetworkPolicies (replacing any before; later duplicates of a name
    /// win) and which pods each one's subject selects.
    pub fn set_cluster_policies(&mut self, policies: impl IntoIterator<Item = ClusterPolicyInfo>) {
        let mut by_name: BTreeMap<String, ClusterPolicyInfo> = BTreeMap::new();
        for p in policies {
            by_name.insert(p.name.clone(), p);
        }
        let mut list: Vec<ClusterPolicyInfo> = by_name.into_values().collect();
        list.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        self.cluster_selected = cluster::selections(self, &list);
        self.cluster = list;
    }

    /// Validates and indexes raw objects. Every object that fails validation is returned
    /// (the caller decides whether that is fatal); the others are used. Node addresses are
    /// learned from pods' `status.hostIP(s)` and host-network pods' addresses.
    pub fn from_objects(cfg: RuleConfig, objects: &[K8sObject]) -> (State, Vec<ValidationError>) {
        let mut errors = Vec::new();
        let mut namespaces = Vec::new();
        let mut pods = Vec::new();
        let mut policies = Vec::new();
        let mut cluster_policies = Vec::new();
        let mut staged = Vec::new();
        let mut non_workloads = HashMap::new();
        let mut hosts = HashMap::new();
        let mut declared: HashMap<ObjectKey, Vec<(Protocol, u16)>> = HashMap::new();
        for o in objects {
            match o {
                K8sObject::Namespace(n) => match validate::namespace(n) {
                    Ok(info) => namespaces.push(info),
                    Err(e) => errors.push(e),
                },
                K8sObject::NetworkPolicy(np) => match validate::network_policy(np) {
                    Ok(info) => policies.push(info),
                    Err(e) => errors.push(e),
                },
                K8sObject::ClusterNetworkPolicy(c) => match validate::cluster_network_policy(c) {
                    Ok(info) => cluster_policies.push(info),
                    Err(e) => errors.push(e),
                },
                K8sObject::StagedNetworkPolicy(s) => match validate::staged_network_policy(s) {
                    Ok(info) => staged.push(info),
                    Err(e) => errors.push(e),
                },
                K8sObject::StagedClusterNetworkPolicy(s) => {
                    match validate::staged_cluster_network_policy(s) {
                        Ok(info) => staged.push(info),
                        Err(e) => errors.push(e),
                    }
                }
                K8sObject::Pod(p) => {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    let ports: Vec<(Protocol, u16)> = p
                        .spec
                        .iter()
                        .flat_map(|s| {
                            s.containers
                                .iter()
                                .chain(s.init_containers.iter().flatten())
                        })
                        .flat_map(|c| c.ports.iter().flatten())
                        .filter_map(|cp| {
                            let proto = Protocol::parse(cp.protocol.as_deref().unwrap_or("TCP"))?;
                            Some((proto, u16::try_from(cp.container_port).ok()?))
                        })
                        .collect();
                    declared.insert(validate::namespaced_key(&p.metadata), ports);
                    let status = p.status.as_ref();
                    if let Some(node) = &node {
                        let host_ips = status
                            .and_then(|s| s.host_ips.as_ref())
                            .into_iter()
                            .flatten()
                            .map(|h| h.ip.clone())
                            .chain(status.and_then(|s| s.host_ip.clone()));
                        for ip in host_ips.filter_map(|t| t.parse::<IpAddr>().ok()) {
                            hosts.insert(ip, node.clone());
                        }
                    }
                    match validate::pod(p) {
                        Ok(Some(info)) => pods.push(info),
                        Ok(None) => {
                            let key = validate::namespaced_key(&p.metadata);
                            let host_network =
                                p.spec.as_ref().and_then(|s| s.host_network) == Some(true);
                            let phase = status.and_then(|s| s.phase.as_deref());
                            let ip = status
                                .and_then(|s| s.pod_ip.as_deref())
                                .and_then(|t| t.parse::<IpAddr>().ok());
                            let reason = if host_network {
                                "uses the host network"
                            } else if matches!(phase, Some("Succeeded" | "Failed")) {
                                "has finished"
                            } else {
                                "has no IP address yet"
                            };
                            if host_network {
                                if let (Some(ip), Some(node)) = (ip, &node) {
                                    hosts.insert(ip, node.clone());
                                }
                            }
                            non_workloads.insert(
                                key,
                                NonWorkload {
                                    reason,
                                    ip,
                                    node: node.clone(),
                                    host_network,
                                },
                            );
                        }
                        Err(e) => errors.push(e),
                    }
                }
            }
        }
        let mut state = State::new(cfg, namespaces, pods, policies);
        state.set_cluster_policies(cluster_policies);
        state.set_staged(staged);
        // A workload's address is never a node's, whatever a status says.
        hosts.retain(|ip, _| !state.by_ip.contains_key(ip));
        state.hosts = hosts;
        state.non_workloads = non_workloads;
        state.declared = declared;
        (state, errors)
    }

    /// The container ports a pod declares for `protocol` (sorted, once each).
    pub fn declared_ports(&self, pod: &ObjectKey, protocol: Protocol) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .declared
            .get(pod)
            .into_iter()
            .flatten()
            .filter(|(p, _)| *p == protocol)
            .map(|(_, n)| *n)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The pod at an address, if a workload has it.
    pub fn pod_by_ip(&self, ip: &IpAddr) -> Option<&PodInfo> {
        self.pods_at(ip).first().map(|&i| &self.pods[i])
    }

    /// The host-side interface of a pod, which names its workload chains.
    pub fn set_interface(&mut self, pod: &ObjectKey, iface: String) {
        self.interfaces.insert(pod.clone(), iface);
    }

    /// A node's own address.
    pub fn add_host(&mut self, ip: IpAddr, node: String) {
        if !self.by_ip.contains_key(&ip) {
            self.hosts.insert(ip, node);
        }
    }

    pub fn config(&self) -> &RuleConfig {
        &self.cfg
    }

    pub fn pods(&self) -> &[PodInfo] {
        &self.pods
    }

    pub fn pod(&self, key: &ObjectKey) -> Option<&PodInfo> {
        self.by_key.get(key).map(|&i| &self.pods[i])
    }

    pub fn pod_at(&self, index: usize) -> &PodInfo {
        &self.pods[index]
    }

    /// The interface set for a pod.
    pub fn interface(&self, pod: &ObjectKey) -> Option<&str> {
        self.interfaces.get(pod).map(String::as_str)
    }

    /// The node owning an address, when it is a node's.
    pub fn host(&self, ip: &IpAddr) -> Option<&str> {
        self.hosts.get(ip).map(String::as_str)
    }

    fn namespace_labels(&self, ns: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(ns).map(|n| &n.labels)
    }

    /// The workload pods at an address.
    fn pods_at(&self, ip: &IpAddr) -> &[usize] {
        self.by_ip.get(ip).map_or(&[], Vec::as_slice)
    }

    /// Finds the addresses and pods of a flow. Errors name what is wrong: an unknown pod, a
    /// pod that is no endpoint and has no address, no common IP family.
    pub fn resolve(&self, flow: &Flow) -> Result<ResolvedFlow, FlowError> {
        let mut notes = Vec::new();
        let src = self.endpoint_ips(&flow.src, "--from", &mut notes)?;
        let dst = self.endpoint_ips(&flow.dst, "--to", &mut notes)?;
        // The source's primary family first, as the pod would pick for a dual-stack peer.
        let family = src
            .iter()
            .map(|(ip, _)| IpFamily::of(ip))
            .find(|f| dst.iter().any(|(ip, _)| IpFamily::of(ip) == *f))
            .ok_or_else(|| {
                FlowError(format!(
                    "{} and {} have no IP family in common ({} / {})",
                    flow.src,
                    flow.dst,
                    list_ips(&src),
                    list_ips(&dst)
                ))
            })?;
        let pick = |ips: &[(IpAddr, Side)]| {
            ips.iter()
                .find(|(ip, _)| IpFamily::of(ip) == family)
                .cloned()
                .expect("a family both sides have")
        };
        let ((src_ip, src_side), (dst_ip, dst_side)) = (pick(&src), pick(&dst));
        if src.len() > 1 || dst.len() > 1 {
            notes.push(format!(
                "dual-stack: evaluated for {}",
                match family {
                    IpFamily::V4 => "IPv4",
                    IpFamily::V6 => "IPv6",
                }
            ));
        }
        Ok(ResolvedFlow {
            family,
            src_ip,
            dst_ip,
            src: src_side,
            dst: dst_side,
            protocol: flow.protocol,
            port: flow.port,
            notes,
        })
    }

    fn endpoint_ips(
        &self,
        e: &Endpoint,
        flag: &str,
        notes: &mut Vec<String>,
    ) -> Result<Vec<(IpAddr, Side)>, FlowError> {
        match e {
            Endpoint::Ip(ip) => Ok(vec![(*ip, self.side_of(ip))]),
            Endpoint::Pod(key) => {
                if let Some(&i) = self.by_key.get(key) {
                    return Ok(self.pods[i]
                        .ips
                        .iter()
                        .map(|ip| (*ip, Side::Pod(i)))
                        .collect());
                }
                match self.non_workloads.get(key) {
                    Some(nw) if nw.host_network => {
                        let (Some(ip), Some(node)) = (nw.ip, nw.node.clone()) else {
                            return Err(FlowError(format!(
                                "{flag} {key}: the pod uses the host network and has no address or node yet"
                            )));
                        };
                        notes.push(format!(
                            "{key} uses the host network: it is node {node}'s address {ip}, not an endpoint policies select"
                        ));
                        Ok(vec![(ip, Side::Host { node })])
                    }
                    Some(nw) => Err(FlowError(format!(
                        "{flag} {key}: the pod {}, so it is no endpoint: it has no traffic to explain",
                        nw.reason
                    ))),
                    None => Err(FlowError(format!(
                        "{flag} {key}: no such pod in the objects read (pods are namespace/name)"
                    ))),
                }
            }
        }
    }

    fn side_of(&self, ip: &IpAddr) -> Side {
        if let Some(&i) = self.pods_at(ip).first() {
            return Side::Pod(i);
        }
        match self.hosts.get(ip) {
            Some(node) => Side::Host { node: node.clone() },
            None => Side::Outside,
        }
    }

    fn side_name(&self, side: &Side, ip: &IpAddr) -> String {
        match side {
            Side::Pod(i) => self.pods[*i].key.to_string(),
            Side::Host { node } => format!("{ip} (node {node})"),
            Side::Outside => ip.to_string(),
        }
    }

    /// Whether the flow is allowed, without the report: the cheap path for evaluating many
    /// flows (no allocation).
    pub fn allowed(&self, flow: &ResolvedFlow) -> bool {
        if let (Side::Pod(a), Side::Pod(b)) = (&flow.src, &flow.dst) {
            if a == b {
                return true;
            }
        }
        let egress = match &flow.src {
            Side::Pod(i) => self.direction_allows(Direction::Egress, *i, flow),
            _ => true,
        };
        if !egress || !self.to_host_allowed(flow) {
            return false;
        }
        match &flow.dst {
            Side::Pod(i) if !self.is_from_own_node(flow, *i) => {
                self.direction_allows(Direction::Ingress, *i, flow)
            }
            _ => true,
        }
    }

    /// One direction of a pod through the tiers: Admin, NetworkPolicy (decides when the pod
    /// is isolated), Baseline, then allow.
    fn direction_allows(&self, dir: Direction, pod: usize, flow: &ResolvedFlow) -> bool {
        if let Some(a) = cluster::decides(self, Tier::Admin, dir, pod, flow) {
            return a;
        }
        if !self.selected[pod][dir_index(dir)].is_empty() {
            return netpol::allows(self, dir, pod, flow);
        }
        cluster::decides(self, Tier::Baseline, dir, pod, flow).unwrap_or(true)
    }

    /// The pod's workload chain of `dir` with provenance, as the agent renders it (its tier
    /// sections included); `None` when its interface is not known.
    pub(crate) fn workload_chain(
        &self,
        pod: usize,
        dir: Direction,
        family: IpFamily,
    ) -> Option<TracedChain> {
        let p = &self.pods[pod];
        let iface = self.interfaces.get(&p.key)?;
        let keys = |d: Direction| -> Vec<ObjectKey> {
            self.selected[pod][dir_index(d)]
                .iter()
                .map(|&i| self.policies[i].key.clone())
                .collect()
        };
        let (ingress, egress) = (keys(Direction::Ingress), keys(Direction::Egress));
        let union = self.union_plan(pod, dir).map(|u| u.id);
        let union_of = |d: Direction| union.as_deref().filter(|_| d == dir);
        let [admin_in, baseline_in] = cluster::chain_names(self, Direction::Ingress, pod);
        let [admin_out, baseline_out] = cluster::chain_names(self, Direction::Egress, pod);
        tiered_endpoint_chains_traced(
            &self.cfg,
            family,
            iface,
            &p.ips,
            &p.key,
            &p.key.namespace,
            &TierChains {
                admin: &admin_in,
                network: &ingress,
                baseline: &baseline_in,
                union: union_of(Direction::Ingress),
            },
            &TierChains {
                admin: &admin_out,
                network: &egress,
                baseline: &baseline_out,
                union: union_of(Direction::Egress),
            },
        )
        .into_iter()
        .find(|c| matches!(&c.role, ChainRole::Workload { direction, .. } if *direction == dir))
    }

    /// The union set the pod's workload chain of `dir` matches before its NetworkPolicies'
    /// chains, as the calc graph derives it (`rules::union`), or `None`.
    pub(crate) fn union_plan(&self, pod: usize, dir: Direction) -> Option<UnionPlan> {
        let isolating = &self.selected[pod][dir_index(dir)];
        if self.cfg.policy_union_min == 0 || isolating.len() < self.cfg.policy_union_min {
            return None;
        }
        let plans: Vec<PolicyPlan> = isolating
            .iter()
            .map(|&i| plan_policy(&self.policies[i]))
            .collect();
        union_plan(&self.cfg, dir, &plans.iter().collect::<Vec<_>>())
    }

    /// The full answer: per direction, which tiers ran, which policy, rule, peer and port
    /// entry decided, or for a deny the closest misses, with the rules implementing them.
    pub fn explain(&self, flow: &ResolvedFlow) -> Verdict {
        let src_name = self.side_name(&flow.src, &flow.src_ip);
        let dst_name = self.side_name(&flow.dst, &flow.dst_ip);
        let same_pod = matches!((&flow.src, &flow.dst), (Side::Pod(a), Side::Pod(b)) if a == b);
        let mut egress = self.direction_verdict(Direction::Egress, &flow.src, flow, same_pod);
        let ingress = self.direction_verdict(Direction::Ingress, &flow.dst, flow, same_pod);
        if egress.action == Action::Allow && !same_pod {
            if let Some(step) = self.to_host_step(flow) {
                if !self.to_host_allowed(flow) {
                    egress.action = Action::Deny;
                }
                egress.after.push(step);
            }
        }
        let action = if egress.action == Action::Allow && ingress.action == Action::Allow {
            Action::Allow
        } else {
            Action::Deny
        };
        Verdict {
            flow: flow.clone(),
            src_name,
            dst_name,
            action,
            egress,
            ingress,
        }
    }

    fn direction_verdict(
        &self,
        direction: Direction,
        side: &Side,
        flow: &ResolvedFlow,
        same_pod: bool,
    ) -> DirectionVerdict {
        let unpoliced = |pod: Option<ObjectKey>, why: Unpoliced| DirectionVerdict {
            direction,
            pod,
            action: Action::Allow,
            unpoliced: Some(why),
            tiers: Vec::new(),
            after: Vec::new(),
        };
        let Side::Pod(i) = side else {
            return unpoliced(None, Unpoliced::NotAPod);
        };
        let key = self.pods[*i].key.clone();
        if same_pod {
            return unpoliced(Some(key), Unpoliced::ToItself);
        }
        if direction == Direction::Ingress && self.is_from_own_node(flow, *i) {
            return unpoliced(Some(key), Unpoliced::FromOwnNode);
        }
        // The tiers in order; the first that decides ends the direction.
        let mut tiers = Vec::new();
        let workload = self.workload_chain(*i, direction, flow.family);
        let cluster_tier = |tier: Tier| {
            let c = cluster::report(self, tier, direction, *i, flow, workload.as_ref());
            TierReport {
                decision: c.decision(),
                detail: TierDetail::Cluster(c),
            }
        };
        if cluster::has_tier(self, Tier::Admin, direction, *i) {
            tiers.push(cluster_tier(Tier::Admin));
        }
        let baseline = cluster::has_tier(self, Tier::Baseline, direction, *i);
        if tiers.iter().all(|t| t.decision.is_none()) {
            let np = netpol::report(self, direction, *i, flow, baseline);
            tiers.push(TierReport {
                decision: np.decision(),
                detail: TierDetail::NetworkPolicy(np),
            });
        }
        let mut after = Vec::new();
        if baseline && tiers.iter().all(|t| t.decision.is_none()) {
            tiers.push(cluster_tier(Tier::Baseline));
            if tiers.iter().all(|t| t.decision.is_none()) {
                // The NetworkPolicy tier handed the flow to the Baseline tier, which passed
                // it on: the namespace profile decides.
                after = netpol::profile_steps(self, direction, *i, flow.family);
            }
        }
        let action = tiers
            .iter()
            .find_map(|t| t.decision)
            .unwrap_or(Action::Allow);
        DirectionVerdict {
            direction,
            pod: Some(key),
            action,
            unpoliced: None,
            tiers,
            after,
        }
    }

    /// Traffic from the destination pod's own node never meets its policy.
    fn is_from_own_node(&self, flow: &ResolvedFlow, dst: usize) -> bool {
        matches!(&flow.src, Side::Host { node } if self.pods[dst].node.as_deref() == Some(node.as_str()))
    }

    /// A pod's traffic to its own node passes `FELIX_DEFAULTENDPOINTTOHOSTACTION` after its
    /// egress policy.
    fn is_to_own_node(&self, flow: &ResolvedFlow) -> bool {
        match (&flow.src, &flow.dst) {
            (Side::Pod(i), Side::Host { node }) => {
                self.pods[*i].node.as_deref() == Some(node.as_str())
            }
            _ => false,
        }
    }

    fn to_host_allowed(&self, flow: &ResolvedFlow) -> bool {
        !self.is_to_own_node(flow) || self.cfg.endpoint_to_host_action != EndpointToHostAction::Drop
    }

    fn to_host_step(&self, flow: &ResolvedFlow) -> Option<KernelRef> {
        if !self.is_to_own_node(flow) {
            return None;
        }
        let what = match self.cfg.endpoint_to_host_action {
            EndpointToHostAction::Accept => "to its own node: accepted after egress policy (FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT)",
            EndpointToHostAction::Drop => "to its own node: dropped after egress policy (FELIX_DEFAULTENDPOINTTOHOSTACTION=DROP)",
            EndpointToHostAction::Return => "to its own node: left to the rest of INPUT after egress policy (FELIX_DEFAULTENDPOINTTOHOSTACTION=RETURN)",
        };
        let chain = crate::rules::chains::static_chains_traced(&self.cfg, flow.family, false)
            .into_iter()
            .find(|c| c.chain.name == crate::rules::WL_TO_HOST_CHAIN)?;
        let n = chain
            .rules
            .iter()
            .position(|r| *r == crate::rules::provenance::RuleRole::EndpointToHostAction)?;
        Some(KernelRef {
            chain: Some(chain.chain.name.clone()),
            hash: Some(chain.chain.rules[n].hash.clone()),
            number: Some(n + 1),
            what: what.to_string(),
        })
    }
}

fn list_ips(ips: &[(IpAddr, Side)]) -> String {
    ips.iter()
        .map(|(ip, _)| ip.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
