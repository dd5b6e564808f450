//! Provenance: for every chain and rule we render, what it implements. The renderers fill it
//! in only when asked (the `*_traced` builders); it is never part of a rule's text or hash,
//! so a traced chain is byte-for-byte the chain the agent programs.
//!
//! - A chain's [`ChainRole`]: our rules in a kernel chain, a static chain, a dispatch chain
//!   (and its bin), a pod's workload chain (pod, interface, direction), a policy chain
//!   (policy, direction), a namespace profile.
//! - A rule's [`RuleRole`]: in a policy chain the Kubernetes rule index, the peer index (in
//!   `from`/`to`), the protocol and the port entries (in `ports`) it implements, and which step
//!   of the allow it is (ipBlock.except bookkeeping, the allow, the return); in a workload chain
//!   the section (conntrack, start of policies, a policy's jump, the drop when no policy
//!   passed, the profile); in a dispatch chain the interface (or address) it sends to; in a
//!   static chain its role.
//!
//! The calc graph asks for provenance only off its hot path (`CalcGraph::provenance`, used by
//! `audit` and `explain`); its own renders pass `traced = false`, which costs one branch per
//! rule and builds nothing.
//!
//! Provenance at two layers: what a rule implements, recorded by the renderers in
//! `rules::provenance`, gathered for the whole rendered state in `calc_graph::provenance`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, ObjectKey, PolicyInfo, Protocol, RuleAction, Tier};

use super::{Chain, Direction, Rule};

mod describe;
pub use describe::*;

/// What one chain we render is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainRole {
    /// `FORWARD`, `INPUT` or `OUTPUT`: a kernel chain in which only some rules are ours.
    Kernel,
    /// `cali-FORWARD`: sends pod traffic to the dispatch chains.
    Forward,
    /// `cali-INPUT`: sends pod-to-host traffic through `cali-wl-to-host`.
    Input,
    /// `cali-wl-to-host`: the pod's egress policy for traffic to its host, then
    /// `FELIX_DEFAULTENDPOINTTOHOSTACTION`.
    WorkloadToHost,
    /// `cali-OUTPUT`: host-to-pod traffic is not policed.
    Output,
    /// `cali-wl-start`: the conntrack and mark rules every workload chain starts with.
    WorkloadStart,
    /// `cali-wl-guard`: local pods a policy isolates whose interface is not known yet,
    /// dropped by address (`rules::guard`).
    Guard,
    /// `cali-wl-pending-to`/`-from`: the node's pod ranges while auto's wiring is pending.
    Pending,
    /// `cali-from-wl-dispatch[-X]`: picks the egress chain of the pod a packet comes from.
    /// `bin` is the interface-name prefix of a second-level chain.
    FromWorkloadDispatch { bin: Option<String> },
    /// `cali-to-wl-dispatch[-X]`: picks the ingress chain of the pod a packet goes to.
    ToWorkloadDispatch { bin: Option<String> },
    /// Bridge mode: `cali-to-wl-addr-dispatch`, by destination address.
    ToWorkloadAddressDispatch,
    /// `cali-tw-<iface>` (ingress) or `cali-fw-<iface>` (egress) of a local pod.
    Workload {
        pod: Option<ObjectKey>,
        iface: String,
        direction: Direction,
    },
    /// `cali-pi-…` / `cali-po-…` of a policy.
    Policy {
        policy: ObjectKey,
        direction: Direction,
    },
    /// `cali-pi-kcnp/<name>` / `cali-po-kcnp/<name>` of a ClusterNetworkPolicy.
    ClusterPolicy {
        name: String,
        tier: Tier,
        direction: Direction,
    },
    /// `cali-pri-kns.<ns>` / `cali-pro-kns.<ns>`: allow for pods no policy isolates.
    Profile {
        namespace: String,
        direction: Direction,
    },
    /// kube-proxy IPVS mode: one of the chains of `rules::ipvs`, with what it does.
    KubeIpvs(String),
}

/// Which step of one Kubernetes allow a policy-chain rule is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyStep {
    /// Sets the scratch bit that the excepted CIDRs clear (ipBlock.except bookkeeping).
    ExceptStart,
    /// Clears the scratch bit for one excepted CIDR.
    ExceptClear { cidr: IpNet },
    /// Sets the accept bit when peer, protocol and ports match.
    Allow { ports: PortsRole },
    /// Returns once the accept bit is set.
    ReturnIfAllowed,
}

/// Which port entries (indices in the Kubernetes rule's `ports`) an allow implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortsRole {
    /// The rule has no `ports`: every protocol and port.
    AllProtocols,
    /// Every port of the protocol (an entry without a port; the other entries of that
    /// protocol are contained in it).
    AllPorts { entries: Vec<usize> },
    /// Numeric ports and ranges in one multiport match.
    Numeric { entries: Vec<usize> },
    /// A named port, matched with the destination's `ip,proto:port` set.
    Named { name: String, entries: Vec<usize> },
}

impl PortsRole {
    pub fn entries(&self) -> &[usize] {
        match self {
            PortsRole::AllProtocols => &[],
            PortsRole::AllPorts { entries }
            | PortsRole::Numeric { entries }
            | PortsRole::Named { entries, .. } => entries,
        }
    }
}

/// A rule of a policy chain: the Kubernetes rule it implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRuleRole {
    /// Index in `spec.ingress` / `spec.egress`.
    pub rule: usize,
    /// Index in the rule's `from` / `to`; `None` when the rule has no peers (everyone).
    pub peer: Option<usize>,
    /// `None`: the rule has no ports, so every protocol.
    pub protocol: Option<Protocol>,
    pub step: PolicyStep,
}

/// What one rendered rule implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleRole {
    // Kernel chains.
    /// Our jump from a kernel chain into ours.
    JumpToOurs,
    /// FORWARD's last rule: accept what policy accepted (the accept mark).
    AcceptAllowed,
    // cali-FORWARD.
    /// Clears the per-hop mark bits (pass, scratch) before dispatch.
    ClearMarks,
    /// Bridge mode, IPv6: bridged neighbour solicitation/advertisement pass before policy.
    AcceptBridgedNeighbourDiscovery,
    /// Traffic from pod interfaces (`prefix`) to the egress dispatch.
    FromWorkloads { prefix: String },
    /// Traffic to pod interfaces (`prefix`) to the ingress dispatch.
    ToWorkloads { prefix: String },
    /// Bridge mode: traffic routed into the bridge to the address dispatch.
    RoutedIntoBridge,
    // cali-INPUT and cali-wl-to-host.
    /// Traffic from pod interfaces (`prefix`) to the host goes through `cali-wl-to-host`.
    WorkloadToHost { prefix: String },
    /// IPv6: ICMPv6 a pod needs to reach its host before any policy.
    AcceptIcmpv6ToHost,
    /// The pod's egress policy for traffic to its host.
    HostEgressPolicy,
    /// `FELIX_DEFAULTENDPOINTTOHOSTACTION` once egress policy allowed.
    EndpointToHostAction,
    // cali-OUTPUT.
    /// Host-to-pod traffic (kubelet probes) is not policed.
    HostToWorkloadNotPoliced,
    // The guard (`rules::guard`).
    /// The jump into `cali-wl-guard`, while it holds a pod.
    JumpToGuard,
    /// IPv6 neighbour discovery passes the guard.
    GuardNeighbourDiscovery,
    /// Drops a pod's traffic in one direction by its address: a policy isolates it there and
    /// its interface is not known yet.
    GuardUnnamedPod {
        pod: ObjectKey,
        direction: Direction,
    },
    /// The jump into a pending chain for one pod range (`rules::guard`).
    JumpToPending { direction: Direction },
    /// A local pod the datastore knows passes the pending chain.
    PendingKnownPod,
    /// Drops traffic to (ingress) or from (egress) an address of the node's pod ranges that
    /// is no known pod, while auto's wiring is pending (fail-closed).
    PendingUnknownAddress { direction: Direction },
    // Dispatch chains.
    /// Sends a pod's traffic to its workload chain.
    ToEndpoint { iface: String },
    /// Sends to the second-level dispatch chain of interfaces starting with `prefix`.
    ToBin { prefix: String },
    /// Drops traffic of an interface no local pod owns (fail-closed).
    UnknownInterface,
    /// Bridge mode: traffic routed to a local pod's address goes to its ingress chain.
    ToEndpointByAddress { addr: IpAddr, iface: String },
    /// Bridge mode: drops traffic routed into the bridge to no local pod's address.
    UnknownAddress,
    /// Deny logging: the rate-limited NFLOG copy of the drop right after it.
    DenyLog,
    /// Flow logging: the rate-limited NFLOG copy of the decision right after it
    /// (`rules::flow_log`).
    FlowLog,
    // Workload chains.
    /// Anti-spoofing: drops what a pod sends from an address not its own (`own`, this
    /// family; the rule, or each rule of the several-address form).
    DropSpoofedSource { own: Vec<IpNet> },
    /// The jump into `cali-wl-start` (conntrack, then the marks cleared).
    JumpToWorkloadStart,
    /// `FELIX_IPTABLESFILTERALLOWACTION=RETURN`: returns what `cali-wl-start` marked accepted
    /// (established and related connections).
    ReturnIfEstablished,
    // cali-wl-start.
    /// Accepts packets of established connections (conntrack).
    AcceptEstablished,
    /// `FELIX_IPTABLESFILTERALLOWACTION=RETURN`: marks established packets accepted.
    MarkEstablished,
    /// `FELIX_IPTABLESFILTERALLOWACTION=RETURN`: returns established packets.
    ReturnEstablished,
    /// Drops packets conntrack finds invalid.
    DropInvalid,
    /// Clears the accept and pass bits.
    ClearAcceptAndPass,
    /// "Start of policies": clears the pass bit.
    StartOfPolicies,
    /// Jumps to one policy's chain.
    JumpToPolicy { policy: ObjectKey },
    /// Returns when that policy accepted.
    ReturnIfPolicyAccepted { policy: ObjectKey },
    /// Marks accepted what the union set of the NetworkPolicies' allows holds
    /// (`rules::union`).
    UnionAccept { set: String },
    /// Returns when the union set accepted.
    ReturnIfUnionAccepted,
    /// "Drop if no policies passed packet": the pod is isolated and no policy allowed.
    DropIfNoPolicyPassed,
    /// "Start of tier kube-admin|kube-baseline": clears the pass bit.
    StartOfTier { tier: &'static str },
    /// Jumps to one ClusterNetworkPolicy's chain.
    JumpToClusterPolicy { tier: &'static str, name: String },
    /// Returns when that ClusterNetworkPolicy accepted.
    ReturnIfClusterPolicyAccepted { tier: &'static str, name: String },
    /// Jumps to the namespace profile (allow).
    JumpToProfile,
    /// Returns when the profile accepted.
    ReturnIfProfileAccepted,
    /// "Drop if no profiles matched".
    DropIfNoProfileMatched,
    // Profile chains.
    /// The profile's allow.
    ProfileAllow,
    /// Returns after the profile's allow.
    ProfileReturn,
    // Policy chains.
    /// The description of a policy direction with no rule for this family (comment only).
    PolicyDescription,
    /// One step of an allow of a Kubernetes rule.
    Policy(PolicyRuleRole),
    /// A rule of a ClusterNetworkPolicy chain.
    ClusterPolicy(ClusterRuleRole),
    /// kube-proxy IPVS mode: a rule of `rules::ipvs` (also at the top of `cali-INPUT` and
    /// `cali-OUTPUT`), with what it does.
    KubeIpvs(String),
}

/// A rule of a ClusterNetworkPolicy chain: the API rule it implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRuleRole {
    /// Index in `spec.ingress` / `spec.egress`.
    pub rule: usize,
    /// The rule's name, when it has one.
    pub name: Option<String>,
    /// What a match does (a Deny or Pass rule failing closed on an unknown peer is Deny).
    pub action: RuleAction,
    pub step: ClusterStep,
}

/// Which part of an API rule a ClusterNetworkPolicy chain rule is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterStep {
    /// One way the rule matches (its action): the peer (index in `from`/`to`), the protocol
    /// (`None`: every protocol) and the ports.
    Match {
        peer: usize,
        protocol: Option<Protocol>,
        ports: ClusterPortsRole,
    },
    /// The return after the rule once it accepted or passed.
    ReturnAfter,
}

/// The ports of one way a ClusterNetworkPolicy rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterPortsRole {
    Any,
    /// Inclusive ranges in one multiport match.
    Numeric(Vec<(u16, u16)>),
    /// The destination's container port of that name.
    Named(String),
}

/// A rendered chain with its provenance: `rules[i]` is what `chain.rules[i]` implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedChain {
    pub chain: Chain,
    pub role: ChainRole,
    pub rules: Vec<RuleRole>,
}

/// Rules of a chain being built, with their roles when tracing.
pub(crate) struct RuleList {
    pub(crate) rules: Vec<Rule>,
    roles: Option<Vec<RuleRole>>,
}

impl RuleList {
    pub(crate) fn new(traced: bool) -> RuleList {
        RuleList {
            rules: Vec::new(),
            roles: traced.then(Vec::new),
        }
    }

    /// Adds a rule; `role` is only called when tracing.
    pub(crate) fn push(&mut self, rule: Rule, role: impl FnOnce() -> RuleRole) {
        self.rules.push(rule);
        if let Some(roles) = &mut self.roles {
            roles.push(role());
        }
    }

    /// Renders the chain; with tracing, also its provenance (`role` is only called then).
    pub(crate) fn finish(
        self,
        name: impl Into<String>,
        family: IpFamily,
        role: impl FnOnce() -> ChainRole,
    ) -> Rendered {
        let chain = Chain::new(name, family, self.rules);
        (chain, self.roles.map(|roles| (role(), roles)))
    }
}

/// A rendered chain, with its provenance when traced.
pub(crate) type Rendered = (Chain, Option<(ChainRole, Vec<RuleRole>)>);

/// Pairs rendered chains with their provenance (only for traced renders).
pub(crate) fn traced(items: Vec<Rendered>) -> Vec<TracedChain> {
    items
        .into_iter()
        .filter_map(|(chain, trace)| trace.map(|(role, rules)| TracedChain { chain, role, rules }))
        .collect()
}

/// Provenance of everything a node holds, by chain name: what `audit` and `explain` look up
/// rule hashes in. Also keeps the policies, to describe their peers and ports.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    pub chains: BTreeMap<String, TracedChain>,
    /// Our rules in the kernel chains: chain → (hash, role).
    pub kernel: BTreeMap<String, Vec<(String, RuleRole)>>,
    /// Interface → the local pod that owns it.
    pub pods_by_iface: BTreeMap<String, ObjectKey>,
    pub policies: BTreeMap<ObjectKey, PolicyInfo>,
    /// Our sets (kernel name) → what they hold.
    pub sets: BTreeMap<String, String>,
}

impl Provenance {
    /// What the rule with `hash` in `chain` implements.
    pub fn rule(&self, chain: &str, hash: &str) -> Option<(&ChainRole, &RuleRole)> {
        if let Some(t) = self.chains.get(chain) {
            let i = t.chain.rules.iter().position(|r| r.hash == hash)?;
            return Some((&t.role, t.rules.get(i)?));
        }
        let (_, role) = self.kernel.get(chain)?.iter().find(|(h, _)| h == hash)?;
        Some((&ChainRole::Kernel, role))
    }

    /// A sentence saying what the rule with `hash` in `chain` implements.
    pub fn describe(&self, chain: &str, hash: &str) -> Option<String> {
        let (chain_role, rule_role) = self.rule(chain, hash)?;
        let policy = |key: &ObjectKey| self.policies.get(key);
        let pod = |iface: &str| self.pods_by_iface.get(iface);
        Some(describe_rule(chain_role, rule_role, &policy, &pod))
    }
}
