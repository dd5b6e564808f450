//! The objects as the agent sees them: what datastores deliver (`K8sObject` in a
//! `DatastoreEvent`) and the validated, compact form the calc graph works on (`PodInfo`,
//! `NamespaceInfo`, `PolicyInfo`, `ClusterPolicyInfo` and their parts), and staged policies
//! (`staged`: never enforced, read by the evaluator only). Imports nothing of
//! ours: every other room builds on it.
//!
//! `validate` turns `k8s-openapi` objects into these types; everything past that point can
//! trust them (CIDRs parse, ports are in range, selectors use known operators).

/// `kube::Resource` for a custom resource type whose kind, group, version and plural are
/// constants (kube's derive needs the CRD schema machinery we do not use).
macro_rules! custom_resource {
    ($ty:ty, $scope:ty, $kind:expr, $group:expr, $version:expr, $plural:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod cluster_policy;
mod object;
pub mod staged;
pub mod validate;

pub use cluster_policy::{
    ClusterNetworkPolicy, ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule, PodSelection,
    RuleAction, Tier,
};
pub use object::{DatastoreEvent, K8sObject, ObjectKind, ObjectRef};
pub use staged::{
    StagedAction, StagedClusterNetworkPolicy, StagedInfo, StagedNetworkPolicy, StagedTarget,
};

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;
use kube::core::{Expression, Selector};

/// Label key every namespace carries (immutable, set by the API server since 1.21).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(addr: &IpAddr) -> IpFamily {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }
    pub fn of_net(net: &IpNet) -> IpFamily {
        match net {
            IpNet::V4(_) => IpFamily::V4,
            IpNet::V6(_) => IpFamily::V6,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The name iptables (`-p`) and ipset (`tcp:80`) use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A label selector in canonical form: requirements sorted and deduplicated (and a one-value
/// `In` folded into equality), so that selectors written differently but alike share one IP
/// set. Logically redundant requirements are not simplified.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabelSel {
    exprs: Vec<Expression>,
}

// kube's `Expression` is not `Hash`; sets are keyed by their selectors, so hash by hand.
impl Hash for LabelSel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.exprs.len().hash(state);
        for e in &self.exprs {
            let (tag, values): (u8, Vec<&String>) = match e {
                Expression::In(_, v) => (0, v.iter().collect()),
                Expression::NotIn(_, v) => (1, v.iter().collect()),
                Expression::Equal(_, v) => (2, vec![v]),
                Expression::NotEqual(_, v) => (3, vec![v]),
                Expression::Exists(_) => (4, vec![]),
                Expression::DoesNotExist(_) => (5, vec![]),
            };
            tag.hash(state);
            expression_key(e).hash(state);
            values.hash(state);
        }
    }
}

impl LabelSel {
    pub fn everything() -> Self {
        LabelSel::default()
    }

    /// Canonicalises the requirements of a parsed selector. `matchLabels` entries arrive as
    /// `Equal`; an `In` with one value means the same and is folded into it.
    pub fn from_selector(sel: Selector) -> Self {
        let mut exprs: Vec<Expression> = sel
            .into_iter()
            .map(|e| match e {
                Expression::In(k, vals) if vals.len() == 1 => {
                    let v = vals.into_iter().next().unwrap_or_default();
                    Expression::Equal(k, v)
                }
                other => other,
            })
            .collect();
        exprs.sort();
        exprs.dedup();
        LabelSel { exprs }
    }

    pub fn from_exprs(exprs: Vec<Expression>) -> Self {
        LabelSel::from_selector(exprs.into_iter().collect())
    }

    pub fn exprs(&self) -> &[Expression] {
        &self.exprs
    }

    pub fn is_everything(&self) -> bool {
        self.exprs.is_empty()
    }

    pub fn matches<L: LabelLookup + ?Sized>(&self, labels: &L) -> bool {
        self.exprs.iter().all(|e| expression_matches(e, labels))
    }

    /// Label keys this selector looks at.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.exprs.iter().map(expression_key)
    }
}

pub fn expression_key(e: &Expression) -> &str {
    match e {
        Expression::In(k, _)
        | Expression::NotIn(k, _)
        | Expression::Equal(k, _)
        | Expression::NotEqual(k, _)
        | Expression::Exists(k)
        | Expression::DoesNotExist(k) => k,
    }
}

/// Read access to a set of labels, so that selectors match the compact forms the calc graph
/// stores as well as the `BTreeMap` of the model.
pub trait LabelLookup {
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelLookup for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

fn expression_matches<L: LabelLookup + ?Sized>(e: &Expression, labels: &L) -> bool {
    match e {
        Expression::In(k, vals) => labels.label(k).is_some_and(|v| vals.contains(v)),
        Expression::NotIn(k, vals) => labels.label(k).is_none_or(|v| !vals.contains(v)),
        Expression::Equal(k, v) => labels.label(k) == Some(v.as_str()),
        Expression::NotEqual(k, v) => labels.label(k) != Some(v.as_str()),
        Expression::Exists(k) => labels.label(k).is_some(),
        Expression::DoesNotExist(k) => labels.label(k).is_none(),
    }
}

/// A named container port a pod declares (the target of a named port in a policy).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A pod as the calc graph needs it. Only pods that are workloads (they have an IP, are not
/// finished, are not hostNetwork) ever get here: validation filters the others out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub key: ObjectKey,
    pub uid: Option<String>,
    pub node: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub named_ports: Vec<NamedPort>,
    /// Sandbox (pause) container ID when something told us (annotation, CRI); only the
    /// sandbox interface-naming scheme reads it.
    pub sandbox_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    /// Always contains `kubernetes.io/metadata.name=<name>`.
    pub labels: BTreeMap<String, String>,
}

impl NamespaceInfo {
    /// The labels a namespace has when no Namespace object was seen for it.
    pub fn implicit(name: &str) -> NamespaceInfo {
        NamespaceInfo {
            name: name.to_string(),
            labels: BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), name.to_string())]),
        }
    }
}

/// Which ports of a protocol a policy port entry allows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortMatch {
    /// No port given: every port of the protocol.
    Any,
    /// `port` alone (`first == last`) or `port`..=`endPort`.
    Range { first: u16, last: u16 },
    /// A container port name, resolved on the destination pod.
    Named(String),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortSpec {
    pub protocol: Protocol,
    pub port: PortMatch,
}

/// Which namespaces a pod peer draws from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NamespaceScope {
    /// No namespaceSelector: the policy's own namespace.
    Named(String),
    /// A namespaceSelector (`{}` selects every namespace).
    Selector(LabelSel),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// podSelector and/or namespaceSelector in one peer (AND).
    Pods {
        namespaces: NamespaceScope,
        pods: LabelSel,
    },
    /// ipBlock: the CIDR (canonical network form) minus the excepted CIDRs.
    IpBlock { cidr: IpNet, except: Vec<IpNet> },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    /// Empty: every port and protocol.
    pub ports: Vec<PortSpec>,
    /// `None`: every peer (no `from`/`to`, or an empty list). `Some` is never empty.
    pub peers: Option<Vec<Peer>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyInfo {
    pub key: ObjectKey,
    pub pod_selector: LabelSel,
    /// `Some` when the policy governs ingress (policyTypes given or inferred); the rules may
    /// be empty, which isolates the selected pods in that direction.
    pub ingress: Option<Vec<PolicyRule>>,
    pub egress: Option<Vec<PolicyRule>>,
}
