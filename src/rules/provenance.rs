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
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kube::core::Expression;

use crate::model::{
    IpFamily, LabelSel, NamespaceScope, ObjectKey, Peer, PolicyInfo, PolicyRule, PortMatch,
    PortSpec, Protocol, RuleAction, Tier,
};
use crate::rules::sets::SetDef;

use super::{Chain, Direction, Rule};

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

impl fmt::Display for ChainRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainRole::Kernel => f.write_str("kernel chain (our rules in it)"),
            ChainRole::Forward => f.write_str("static: pod traffic in FORWARD to the dispatch"),
            ChainRole::Input => f.write_str("static: pod-to-host traffic in INPUT"),
            ChainRole::WorkloadToHost => {
                f.write_str("static: egress policy of pods for traffic to their host")
            }
            ChainRole::Output => f.write_str("static: host-to-pod traffic in OUTPUT"),
            ChainRole::Guard => f.write_str(
                "guard: isolated local pods whose interface is not known yet, by address",
            ),
            ChainRole::Pending => f.write_str(
                "guard: the node's pod ranges while auto has not seen how pods are wired",
            ),
            ChainRole::FromWorkloadDispatch { bin } => match bin {
                None => f.write_str("dispatch: traffic from pods to their egress chains"),
                Some(b) => write!(f, "dispatch: from pod interfaces {b}*"),
            },
            ChainRole::ToWorkloadDispatch { bin } => match bin {
                None => f.write_str("dispatch: traffic to pods to their ingress chains"),
                Some(b) => write!(f, "dispatch: to pod interfaces {b}*"),
            },
            ChainRole::ToWorkloadAddressDispatch => {
                f.write_str("dispatch: traffic routed into the bridge, by pod address")
            }
            ChainRole::Workload {
                pod,
                iface,
                direction,
            } => {
                let who = pod
                    .as_ref()
                    .map_or_else(|| "a local pod".to_string(), |p| format!("pod {p}"));
                write!(
                    f,
                    "workload: {} of {who} (interface {iface})",
                    direction.as_str()
                )
            }
            ChainRole::Policy { policy, direction } => {
                write!(f, "policy: NetworkPolicy {policy} {}", direction.as_str())
            }
            ChainRole::ClusterPolicy {
                name,
                tier,
                direction,
            } => write!(
                f,
                "policy: ClusterNetworkPolicy {name} (tier {}) {}",
                tier.as_str(),
                direction.as_str()
            ),
            ChainRole::Profile {
                namespace,
                direction,
            } => write!(
                f,
                "profile: namespace {namespace} {} (allow for pods no policy isolates)",
                direction.as_str()
            ),
            ChainRole::KubeIpvs(what) => write!(f, "static: kube-proxy {what}"),
        }
    }
}

/// A sentence for one rule. `policy` finds a policy to describe peers and ports with; `pod`
/// finds the pod owning an interface.
pub fn describe_rule<'a>(
    chain: &ChainRole,
    rule: &RuleRole,
    policy: &dyn Fn(&ObjectKey) -> Option<&'a PolicyInfo>,
    pod: &dyn Fn(&str) -> Option<&'a ObjectKey>,
) -> String {
    let iface_pod = |iface: &str| match pod(iface) {
        Some(p) => format!("{iface} (pod {p})"),
        None => iface.to_string(),
    };
    match rule {
        RuleRole::JumpToOurs => "jump into our chain".into(),
        RuleRole::AcceptAllowed => "accept what policy accepted (accept mark)".into(),
        RuleRole::ClearMarks => "clear the per-hop mark bits".into(),
        RuleRole::AcceptBridgedNeighbourDiscovery => {
            "accept bridged IPv6 neighbour discovery before policy".into()
        }
        RuleRole::FromWorkloads { prefix } => {
            format!("traffic from pod interfaces {prefix}* to the egress dispatch")
        }
        RuleRole::ToWorkloads { prefix } => {
            format!("traffic to pod interfaces {prefix}* to the ingress dispatch")
        }
        RuleRole::RoutedIntoBridge => {
            "traffic routed into the bridge to the address dispatch".into()
        }
        RuleRole::WorkloadToHost { prefix } => {
            format!("pod-to-host traffic from {prefix}* through cali-wl-to-host")
        }
        RuleRole::AcceptIcmpv6ToHost => "accept ICMPv6 a pod needs to reach its host".into(),
        RuleRole::HostEgressPolicy => "the pod's egress policy for traffic to its host".into(),
        RuleRole::EndpointToHostAction => {
            "FELIX_DEFAULTENDPOINTTOHOSTACTION after egress policy allowed".into()
        }
        RuleRole::HostToWorkloadNotPoliced => "host-to-pod traffic is not policed".into(),
        RuleRole::JumpToGuard => {
            "to the guard of isolated pods whose interface is not known yet".into()
        }
        RuleRole::GuardNeighbourDiscovery => "IPv6 neighbour discovery passes the guard".into(),
        RuleRole::JumpToPending { direction } => format!(
            "{} of the node's pod range to the pending guard (auto has not seen the wiring)",
            direction.as_str()
        ),
        RuleRole::PendingKnownPod => "a local pod the datastore knows passes".into(),
        RuleRole::PendingUnknownAddress { direction } => format!(
            "drop: {} of an address of the node's pod ranges that is no known pod, auto has not seen the wiring yet (fail-closed)",
            direction.as_str()
        ),
        RuleRole::GuardUnnamedPod { pod, direction } => format!(
            "drop: {} of pod {pod}, isolated by policy, interface not known yet (fail-closed)",
            direction.as_str()
        ),
        RuleRole::ToEndpoint { iface } => match chain {
            ChainRole::FromWorkloadDispatch { .. } => {
                format!("egress of interface {}", iface_pod(iface))
            }
            _ => format!("ingress of interface {}", iface_pod(iface)),
        },
        RuleRole::ToBin { prefix } => format!("interfaces {prefix}* to their dispatch chain"),
        RuleRole::UnknownInterface => "drop: interface of no local pod (fail-closed)".into(),
        RuleRole::ToEndpointByAddress { addr, iface } => {
            format!("traffic routed to {addr}: ingress of {}", iface_pod(iface))
        }
        RuleRole::UnknownAddress => "drop: routed to no local pod's address".into(),
        RuleRole::DenyLog => "deny log: NFLOG the packet the next rule drops (rate-limited)".into(),
        RuleRole::FlowLog => {
            "flow log: NFLOG the new connection the next rule decides (rate-limited per pod)".into()
        }
        RuleRole::DropSpoofedSource { own } => {
            if own.is_empty() {
                "anti-spoofing: drop, the pod has no address of this family".into()
            } else {
                let own: Vec<String> = own.iter().map(ToString::to_string).collect();
                format!(
                    "anti-spoofing: drop unless the source is the pod's ({})",
                    own.join(", ")
                )
            }
        }
        RuleRole::AcceptEstablished => "accept established and related connections".into(),
        RuleRole::MarkEstablished => "mark established and related connections accepted".into(),
        RuleRole::ReturnEstablished => "return established and related connections".into(),
        RuleRole::DropInvalid => "drop packets conntrack finds invalid".into(),
        RuleRole::ClearAcceptAndPass => "clear the accept and pass bits".into(),
        RuleRole::StartOfPolicies => "start of policies (the pod is isolated)".into(),
        RuleRole::JumpToPolicy { policy } => format!("jump to NetworkPolicy {policy}"),
        RuleRole::ReturnIfPolicyAccepted { policy } => {
            format!("return if NetworkPolicy {policy} accepted")
        }
        RuleRole::UnionAccept { set } => format!(
            "accept if the peer address and port are in {set}, the union of the NetworkPolicies' selector and numeric-port allows"
        ),
        RuleRole::ReturnIfUnionAccepted => "return if the union set accepted".into(),
        RuleRole::DropIfNoPolicyPassed => {
            "drop: isolated and no policy allowed (Drop if no policies passed packet)".into()
        }
        RuleRole::StartOfTier { tier } => format!("start of tier {tier}"),
        RuleRole::JumpToClusterPolicy { tier, name } => {
            format!("jump to ClusterNetworkPolicy {name} (tier {tier})")
        }
        RuleRole::ReturnIfClusterPolicyAccepted { tier, name } => {
            format!("return if ClusterNetworkPolicy {name} (tier {tier}) accepted")
        }
        RuleRole::JumpToProfile => "not isolated: to the namespace profile (allow)".into(),
        RuleRole::ReturnIfProfileAccepted => "return if the profile accepted".into(),
        RuleRole::DropIfNoProfileMatched => "drop if no profile matched".into(),
        RuleRole::ProfileAllow => "allow: no policy isolates the pod".into(),
        RuleRole::ProfileReturn => "return after the profile's allow".into(),
        RuleRole::PolicyDescription => {
            "no rule for this family: the chain only names the policy".into()
        }
        RuleRole::KubeIpvs(what) => format!("IPVS: {what}"),
        RuleRole::ClusterPolicy(c) => {
            let (name, direction) = match chain {
                ChainRole::ClusterPolicy {
                    name, direction, ..
                } => (name.as_str(), direction.as_str()),
                _ => ("?", "?"),
            };
            let label = c
                .name
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"));
            let action = c.action.as_str();
            match &c.step {
                ClusterStep::ReturnAfter => format!(
                    "ClusterNetworkPolicy {name} {direction} rule {}{label}: return after {action}",
                    c.rule
                ),
                ClusterStep::Match {
                    peer,
                    protocol,
                    ports,
                } => {
                    let proto = protocol.map_or_else(
                        || "every protocol".to_string(),
                        |p| p.as_str().to_ascii_uppercase(),
                    );
                    let ports = match ports {
                        ClusterPortsRole::Any => String::new(),
                        ClusterPortsRole::Numeric(r) => format!(
                            " ports {}",
                            r.iter()
                                .map(|(a, b)| if a == b {
                                    a.to_string()
                                } else {
                                    format!("{a}-{b}")
                                })
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                        ClusterPortsRole::Named(n) => format!(" named port {n}"),
                    };
                    format!(
                        "ClusterNetworkPolicy {name} {direction} rule {}{label}, peer {peer}, {proto}{ports}: {action}",
                        c.rule
                    )
                }
            }
        }
        RuleRole::Policy(p) => {
            let (key, direction) = match chain {
                ChainRole::Policy { policy, direction } => (Some(policy), *direction),
                _ => (None, Direction::Ingress),
            };
            let info = key.and_then(policy);
            describe_policy_rule(key, info, direction, p)
        }
    }
}

fn describe_policy_rule(
    key: Option<&ObjectKey>,
    info: Option<&PolicyInfo>,
    direction: Direction,
    p: &PolicyRuleRole,
) -> String {
    let name = key.map_or_else(String::new, |k| format!("{k} "));
    let rule = info.and_then(|i| policy_rule(i, direction, p.rule));
    let peer = match (p.peer, rule) {
        (None, _) => "any peer".to_string(),
        (Some(i), Some(r)) => match r.peers.as_ref().and_then(|ps| ps.get(i)) {
            Some(peer) => format!("peer {i} ({})", describe_peer(peer)),
            None => format!("peer {i}"),
        },
        (Some(i), None) => format!("peer {i}"),
    };
    let what = match &p.step {
        PolicyStep::ExceptStart => "ipBlock.except bookkeeping (set scratch)".to_string(),
        PolicyStep::ExceptClear { cidr } => format!("ipBlock.except {cidr} (clear scratch)"),
        PolicyStep::Allow { ports } => {
            let ports = match (ports, rule) {
                (PortsRole::AllProtocols, _) => "every port and protocol".to_string(),
                (other, Some(r)) => describe_port_entries(&r.ports, other.entries()),
                (other, None) => format!("ports {:?}", other.entries()),
            };
            format!("allow, {ports}")
        }
        PolicyStep::ReturnIfAllowed => "return if allowed".to_string(),
    };
    format!(
        "NetworkPolicy {name}{} rule {}, {peer}: {what}",
        direction.as_str(),
        p.rule
    )
}

/// The Kubernetes rule `index` of a policy direction.
pub fn policy_rule(info: &PolicyInfo, direction: Direction, index: usize) -> Option<&PolicyRule> {
    match direction {
        Direction::Ingress => info.ingress.as_ref()?.get(index),
        Direction::Egress => info.egress.as_ref()?.get(index),
    }
}

/// `port 1 (TCP 80), port 2 (TCP 8000-8080)`.
pub fn describe_port_entries(ports: &[PortSpec], entries: &[usize]) -> String {
    entries
        .iter()
        .map(|&i| match ports.get(i) {
            Some(spec) => format!("port {i} ({})", describe_port(spec)),
            None => format!("port {i}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `TCP 80`, `UDP 53-54`, `TCP named http`, `every SCTP port`.
pub fn describe_port(spec: &PortSpec) -> String {
    let proto = spec.protocol.as_str().to_ascii_uppercase();
    match &spec.port {
        PortMatch::Any => format!("every {proto} port"),
        PortMatch::Range { first, last } if first == last => format!("{proto} {first}"),
        PortMatch::Range { first, last } => format!("{proto} {first}-{last}"),
        PortMatch::Named(n) => format!("{proto} named port {n}"),
    }
}

/// What one of our sets holds: `IPs of pods app=web in namespace x`, `ip,port of the TCP
/// port named http of ...`.
pub fn describe_set(def: &SetDef) -> String {
    let pods = describe_peer(&Peer::Pods {
        namespaces: def.namespaces().clone(),
        pods: def.pods().clone(),
    });
    match def {
        SetDef::Selector { .. } => format!("addresses of {pods}"),
        SetDef::NamedPort {
            protocol,
            port_name,
            ..
        } => format!(
            "address,port of the {} port named {port_name} of {pods}",
            protocol.as_str().to_ascii_uppercase()
        ),
    }
}

/// `pods app=web in namespace x`, `ipBlock 10.0.0.0/8 except 10.1.0.0/16`.
pub fn describe_peer(peer: &Peer) -> String {
    match peer {
        Peer::IpBlock { cidr, except } if except.is_empty() => format!("ipBlock {cidr}"),
        Peer::IpBlock { cidr, except } => format!(
            "ipBlock {cidr} except {}",
            except
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Peer::Pods { namespaces, pods } => {
            let who = if pods.is_everything() {
                "every pod".to_string()
            } else {
                format!("pods {}", describe_selector(pods))
            };
            let where_ = match namespaces {
                NamespaceScope::Named(ns) => format!("in namespace {ns}"),
                NamespaceScope::Selector(s) if s.is_everything() => {
                    "in every namespace".to_string()
                }
                NamespaceScope::Selector(s) => {
                    format!("in namespaces {}", describe_selector(s))
                }
            };
            format!("{who} {where_}")
        }
    }
}

/// A selector as `kubectl` prints one: `app=web,tier in (a,b),!legacy`.
pub fn describe_selector(sel: &LabelSel) -> String {
    if sel.is_everything() {
        return "(everything)".to_string();
    }
    let join = |vals: &std::collections::BTreeSet<String>| {
        vals.iter().cloned().collect::<Vec<_>>().join(",")
    };
    sel.exprs()
        .iter()
        .map(|e| match e {
            Expression::Equal(k, v) => format!("{k}={v}"),
            Expression::NotEqual(k, v) => format!("{k}!={v}"),
            Expression::In(k, v) => format!("{k} in ({})", join(v)),
            Expression::NotIn(k, v) => format!("{k} notin ({})", join(v)),
            Expression::Exists(k) => k.clone(),
            Expression::DoesNotExist(k) => format!("!{k}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_and_ports_read_like_kubectl() {
        let peer = Peer::Pods {
            namespaces: NamespaceScope::Selector(LabelSel::from_exprs(vec![Expression::Equal(
                "team".into(),
                "a".into(),
            )])),
            pods: LabelSel::from_exprs(vec![
                Expression::Equal("app".into(), "web".into()),
                Expression::DoesNotExist("legacy".into()),
            ]),
        };
        assert_eq!(
            describe_peer(&peer),
            "pods app=web,!legacy in namespaces team=a"
        );
        let block = Peer::IpBlock {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec!["10.1.0.0/16".parse().unwrap()],
        };
        assert_eq!(
            describe_peer(&block),
            "ipBlock 10.0.0.0/8 except 10.1.0.0/16"
        );
        let ports = [
            PortSpec {
                protocol: Protocol::Tcp,
                port: PortMatch::Range {
                    first: 80,
                    last: 80,
                },
            },
            PortSpec {
                protocol: Protocol::Udp,
                port: PortMatch::Range {
                    first: 53,
                    last: 54,
                },
            },
            PortSpec {
                protocol: Protocol::Sctp,
                port: PortMatch::Named("s".into()),
            },
        ];
        assert_eq!(
            describe_port_entries(&ports, &[0, 1, 2]),
            "port 0 (TCP 80), port 1 (UDP 53-54), port 2 (SCTP named port s)"
        );
    }
}
