//! What `explain` answers, as values: the flow as asked and as resolved, each direction's
//! verdict with its tier reports, and where the kernel implements a decision; their JSON.

use super::*;

/// One side of a flow as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `namespace/pod`.
    Pod(ObjectKey),
    /// An address: a pod's, a node's, or an outside peer's.
    Ip(IpAddr),
}

impl Endpoint {
    /// `namespace/pod` or an IP address.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let t = text.trim();
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(Endpoint::Ip(ip));
        }
        match t.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Endpoint::Pod(ObjectKey::new(ns, name)))
            }
            _ => Err(format!(
                "{text:?} is neither namespace/pod nor an IP address (e.g. shop/web or 10.0.0.5)"
            )),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Pod(k) => write!(f, "{k}"),
            Endpoint::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A connection's first packet, after kube-proxy's DNAT (pod to pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub src: Endpoint,
    pub dst: Endpoint,
    pub protocol: Protocol,
    pub port: u16,
}

/// What stands behind one address of a resolved flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// A pod the agent enforces on (index into the state's pods).
    Pod(usize),
    /// A node's own address (its host network).
    Host { node: String },
    /// Anything else: outside the cluster, or unknown to these objects.
    Outside,
}

/// A flow with its addresses and the pods behind them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedFlow {
    pub family: IpFamily,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub src: Side,
    pub dst: Side,
    pub protocol: Protocol,
    pub port: u16,
    /// Things the resolution had to assume, for the report (a host-network pod given by
    /// name, a dual-stack choice).
    pub notes: Vec<String>,
}

/// Allow or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

/// A rule of ours that implements a step, so it can be found in `iptables-save`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRef {
    /// `None` when the chain's name is not known (a workload chain of a pod whose interface
    /// was not given).
    pub chain: Option<String>,
    /// The `cali:` hash.
    pub hash: Option<String>,
    /// 1-based position in the chain (`iptables -L --line-numbers`).
    pub number: Option<usize>,
    /// What the rule does.
    pub what: String,
}

/// One tier's report for one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierReport {
    /// `None`: the tier passed the flow to the next one.
    pub decision: Option<Action>,
    pub detail: TierDetail,
}

/// Per tier: ClusterNetworkPolicy Admin, NetworkPolicy, ClusterNetworkPolicy Baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierDetail {
    NetworkPolicy(NetworkPolicyReport),
    Cluster(ClusterTierReport),
}

impl TierDetail {
    pub fn name(&self) -> &'static str {
        match self {
            TierDetail::NetworkPolicy(_) => "NetworkPolicy",
            TierDetail::Cluster(c) => match c.tier {
                Tier::Admin => "ClusterNetworkPolicy Admin",
                Tier::Baseline => "ClusterNetworkPolicy Baseline",
            },
        }
    }
}

/// Why a direction was not evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unpoliced {
    /// That side is no pod: nothing enforces this direction.
    NotAPod,
    /// Traffic from a pod's own node to it: `cali-OUTPUT` returns before policy (kubelet
    /// probes); routed through `OUTPUT`, never `FORWARD`.
    FromOwnNode,
    /// The pod's traffic to itself never leaves it.
    ToItself,
}

/// The verdict of one direction (egress of the source, ingress of the destination).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectionVerdict {
    pub direction: Direction,
    /// The pod this direction belongs to; `None` when that side is no pod.
    pub pod: Option<ObjectKey>,
    pub action: Action,
    /// Set when the direction is not policed at all.
    pub unpoliced: Option<Unpoliced>,
    /// The tiers that ran, in order; the last one decided (or none did: allowed).
    pub tiers: Vec<TierReport>,
    /// Steps after the tiers: the namespace profile when a Baseline tier passed the flow on
    /// (without one the NetworkPolicy tier's report ends there), then what changed the
    /// answer (`FELIX_DEFAULTENDPOINTTOHOSTACTION`).
    pub after: Vec<KernelRef>,
}

/// The answer for one flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub flow: ResolvedFlow,
    /// `namespace/pod`, `node <name> (host)` or the address, per side.
    pub src_name: String,
    pub dst_name: String,
    pub action: Action,
    pub egress: DirectionVerdict,
    pub ingress: DirectionVerdict,
}

/// Why a flow cannot be evaluated (bad input: the message names it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlowError(pub String);

impl KernelRef {
    pub fn to_json(&self) -> Value {
        json!({"chain": self.chain, "hash": self.hash, "rule_number": self.number, "what": self.what})
    }
}

impl DirectionVerdict {
    pub fn to_json(&self) -> Value {
        let unpoliced = self.unpoliced.as_ref().map(|u| match u {
            Unpoliced::NotAPod => "not a pod: nothing enforces this direction",
            Unpoliced::FromOwnNode => "from the pod's own node: host-to-pod traffic is not policed",
            Unpoliced::ToItself => "a pod's traffic to itself never leaves it",
        });
        json!({
            "direction": self.direction.as_str(),
            "pod": self.pod.as_ref().map(ToString::to_string),
            "verdict": self.action.as_str(),
            "policed": self.unpoliced.is_none(),
            "unpoliced_because": unpoliced,
            "tiers": self.tiers.iter().map(|t| {
                let mut v = match &t.detail {
                    TierDetail::NetworkPolicy(np) => np.to_json(),
                    TierDetail::Cluster(c) => c.to_json(),
                };
                v["tier"] = json!(t.detail.name());
                v["decision"] = json!(t.decision.map(Action::as_str).unwrap_or("pass"));
                v
            }).collect::<Vec<_>>(),
            "after": self.after.iter().map(KernelRef::to_json).collect::<Vec<_>>(),
        })
    }
}

impl Verdict {
    pub fn to_json(&self) -> Value {
        json!({
            "verdict": self.action.as_str(),
            "from": self.src_name,
            "to": self.dst_name,
            "family": match self.flow.family { IpFamily::V4 => "ipv4", IpFamily::V6 => "ipv6" },
            "source_ip": self.flow.src_ip.to_string(),
            "destination_ip": self.flow.dst_ip.to_string(),
            "protocol": self.flow.protocol.as_str().to_ascii_uppercase(),
            "port": self.flow.port,
            "notes": self.flow.notes,
            "egress": self.egress.to_json(),
            "ingress": self.ingress.to_json(),
        })
    }
}
