//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`, network-policy-api v0.2.0): the
//! object as datastores deliver it ([`ClusterNetworkPolicy`] and its parts, written from the
//! API's Go types, `apis/v1alpha2/clusternetworkpolicy_types.go`) and the compact validated
//! form the calc graph works on ([`ClusterPolicyInfo`]); `validate::cluster_network_policy`
//! turns one into the other.
//!
//! Why plain serde types with a hand-written `kube::Resource` impl, not the `CustomResource`
//! derive: the derive earns its keep by generating the CRD and its schema, and we do not ship
//! the CRD (operators install upstream's). What the agent needs is a typed object the watcher,
//! the reflector store and the manifest loader can all deserialize, and that is one trait of
//! six one-line methods; the derive would add kube's `derive` feature with its proc-macro
//! crates and `schemars` for nothing else. Typed rather than a `DynamicObject`, so that a
//! field of the wrong shape is an error the API server already refused, and validation reads
//! fields instead of walking JSON.
//!
//! Every field is optional here, even where the API requires it: the API server enforces the
//! CRD's schema, but the directory datastore and `compile` read files that nothing checked,
//! and a missing field must become a validation error naming it, never a parse failure of
//! the whole document. Fields this version does not know are kept where the API's one-of
//! unions live (subject, peers, protocols, ports), because what to do with them is part of
//! the semantics: a peer with only unknown fields fails closed (upstream's rule for a peer
//! whose field an older CRD pruned), other unions with an unknown member are rejected.
//!
//! ClusterNetworkPolicy as an object: its types in `model::cluster_policy`, its watch while the
//! CRD may be missing in `datastore::kube::cluster_policy`.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use super::{LabelSel, Protocol};

pub const GROUP: &str = "policy.networking.k8s.io";
pub const VERSION: &str = "v1alpha2";
pub const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub const KIND: &str = "ClusterNetworkPolicy";
pub const PLURAL: &str = "clusternetworkpolicies";

/// Fields of a one-of union that this version does not know, by name (kept so that the
/// semantics can tell "an unknown member" from "no member at all").
pub type UnknownFields = BTreeMap<String, serde_json::Value>;

/// The cluster-scoped object. `apiVersion` and `kind` are not stored (list items come
/// without them, watch events with them: the same object must compare equal); they are
/// written when it is serialized, so that the output is a manifest.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ClusterNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<ClusterNetworkPolicySpec>,
}

impl Serialize for ClusterNetworkPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Manifest<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            #[serde(skip_serializing_if = "Option::is_none")]
            spec: &'a Option<ClusterNetworkPolicySpec>,
        }
        Manifest {
            api_version: API_VERSION,
            kind: KIND,
            metadata: &self.metadata,
            spec: &self.spec,
        }
        .serialize(serializer)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` or `Baseline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// 0–1000, lower first within the tier. Wider than the API's int32 so that any number
    /// in a file reaches validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<IngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressRule>>,
}

/// Exactly one of `namespaces` or `pods`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// Pods by namespace and pod labels: `namespaceSelector` optional (absent: every
/// namespace), `podSelector` required.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<IngressPeer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<ProtocolEntry>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<EgressPeer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<ProtocolEntry>>,
}

/// Exactly one of `namespaces` or `pods`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// Exactly one of `namespaces`, `pods`, `networks`, or the experimental `nodes` and
/// `domainNames` (kept as raw values: they are refused, whatever their shape).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<serde_json::Value>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// Exactly one of `tcp`, `udp`, `sctp` or `destinationNamedPort`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `destinationPort` is required (the API gives `tcp`/`udp`/`sctp` minProperties 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<Port>,
}

/// Exactly one of `number` or `range`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Port {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PortRange>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// Inclusive, `start < end`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PortRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i64>,
}

custom_resource!(
    ClusterNetworkPolicy,
    k8s_openapi::ClusterResourceScope,
    KIND,
    GROUP,
    VERSION,
    PLURAL
);

// ---- the validated form ----

/// The two tiers, in evaluation order (the NetworkPolicy tier sits between them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Admin,
    Baseline,
}

impl Tier {
    /// The name the API uses (`spec.tier`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleAction {
    /// Allowed, final for this direction.
    Accept,
    /// Dropped, final.
    Deny,
    /// The rest of the tier is skipped.
    Pass,
}

impl RuleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleAction::Accept => "Accept",
            RuleAction::Deny => "Deny",
            RuleAction::Pass => "Pass",
        }
    }
}

/// Pods selected by their namespace's labels and their own (a subject, or a `namespaces` /
/// `pods` peer: `namespaces: S` is `{namespaces: S, pods: everything}`). Host-network pods
/// are never workloads, so they are never selected.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodSelection {
    pub namespaces: LabelSel,
    pub pods: LabelSel,
}

impl PodSelection {
    pub fn matches(
        &self,
        namespace_labels: &BTreeMap<String, String>,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.namespaces.matches(namespace_labels) && self.pods.matches(pod_labels)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClusterPeer {
    Pods(PodSelection),
    /// Egress only: the addresses, pod-to-pod traffic included; each family matches its
    /// own entries only. Canonical network form, in written order.
    Networks(Vec<IpNet>),
    /// A peer none of whose fields this version knows (a newer API's member): it fails
    /// closed — an Accept rule treats it as matching nothing, a Deny or Pass rule becomes a
    /// deny of everything. Holds the field names, for the logs.
    Unknown(Vec<String>),
}

/// One `protocols` entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClusterPort {
    /// `tcp`/`udp`/`sctp` with a destination port (`first == last`) or an inclusive range.
    Numeric {
        protocol: Protocol,
        first: u16,
        last: u16,
    },
    /// A container port name, resolved on the destination pod with its own protocol and
    /// number.
    Named(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterRule {
    /// `spec.ingress[i].name`, for logs and explanations.
    pub name: Option<String>,
    pub action: RuleAction,
    /// Never empty.
    pub peers: Vec<ClusterPeer>,
    /// `None`: every protocol and port. `Some` is never empty.
    pub ports: Option<Vec<ClusterPort>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterPolicyInfo {
    pub name: String,
    pub tier: Tier,
    /// 0–1000.
    pub priority: u16,
    pub subject: PodSelection,
    /// Written order; empty: the policy does nothing in that direction.
    pub ingress: Vec<ClusterRule>,
    pub egress: Vec<ClusterRule>,
}

impl ClusterPolicyInfo {
    /// Evaluation order within a tier: priority, then name (upstream leaves equal priorities
    /// to the implementation; kube-network-policies and felix break ties by name too).
    pub fn order_key(&self) -> (Tier, u16, &str) {
        (self.tier, self.priority, &self.name)
    }
}
