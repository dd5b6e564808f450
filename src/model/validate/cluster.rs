//! Validation of a ClusterNetworkPolicy into [`ClusterPolicyInfo`]: the limits the API's CRD
//! enforces (network-policy-api v0.2.0), so that the directory datastore and `compile`, which
//! read files nothing checked, refuse what the API server would, naming the field. The
//! experimental `nodes` and `domainNames` peers are refused with a message saying so; a peer
//! with only fields this version does not know is kept as [`ClusterPeer::Unknown`] (it fails
//! closed, see the model).
//!
//! ClusterNetworkPolicy at each layer: validated in `model::validate::cluster`, selected and
//! tiered in the graph by `calc_graph::cluster`, rendered by `rules::cluster`, evaluated by
//! `verdict::cluster`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{require_name, validated_selector, ErrorContext, ValidationError};
use crate::model::cluster_policy::{
    ClusterNetworkPolicy, EgressPeer, IngressPeer, NamespacedPod, Port, ProtocolEntry,
    UnknownFields,
};
use crate::model::{
    ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule, LabelSel, PodSelection, Protocol,
    RuleAction, Tier,
};

const KIND: &str = "ClusterNetworkPolicy";

/// The API's limits (`apis/v1alpha2/clusternetworkpolicy_types.go`).
pub const MAX_PRIORITY: i64 = 1000;
pub const MAX_RULES: usize = 25;
pub const MAX_PEERS: usize = 25;
pub const MAX_NETWORKS: usize = 25;
pub const MAX_PROTOCOLS: usize = 25;
pub const MAX_RULE_NAME_LEN: usize = 100;
pub const MAX_CIDR_LEN: usize = 43;

/// Validates a ClusterNetworkPolicy (see the module documentation).
pub fn cluster_network_policy(
    cnp: &ClusterNetworkPolicy,
) -> Result<ClusterPolicyInfo, ValidationError> {
    let name = cnp.metadata.name.clone().unwrap_or_default();
    let ctx = ErrorContext {
        kind: KIND,
        object: &name,
    };
    require_name(&cnp.metadata, &ctx)?;
    if let Some(namespace) = cnp.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
        return Err(ctx.error(
            "metadata.namespace",
            format!("a ClusterNetworkPolicy is cluster-scoped and has no namespace, but {namespace:?} is set"),
        ));
    }
    let spec = cnp.spec.as_ref().ok_or_else(|| {
        ctx.error(
            "spec",
            "spec is required: it holds the tier, priority, subject and rules",
        )
    })?;

    let tier = match spec.tier.as_deref() {
        Some("Admin") => Tier::Admin,
        Some("Baseline") => Tier::Baseline,
        Some(other) => {
            return Err(ctx.error(
                "spec.tier",
                format!("unknown tier {other:?}; accepted values are Admin and Baseline"),
            ))
        }
        None => return Err(ctx.error("spec.tier", "tier is required: Admin or Baseline")),
    };
    let priority = match spec.priority {
        Some(p) if (0..=MAX_PRIORITY).contains(&p) => u16::try_from(p).unwrap_or(u16::MAX),
        Some(p) => {
            return Err(ctx.error(
                "spec.priority",
                format!("priority {p} is out of range; it must be between 0 and {MAX_PRIORITY}"),
            ))
        }
        None => {
            return Err(ctx.error(
                "spec.priority",
                format!(
                    "priority is required: an integer between 0 and {MAX_PRIORITY}, lower first"
                ),
            ))
        }
    };

    let subject = spec
        .subject
        .as_ref()
        .ok_or_else(|| ctx.error("spec.subject", "subject is required: namespaces or pods"))?;
    let subject = {
        let field = "spec.subject";
        one_of(
            field,
            &[
                ("namespaces", subject.namespaces.is_some()),
                ("pods", subject.pods.is_some()),
            ],
            &subject.unknown,
            &ctx,
        )?;
        match (&subject.namespaces, &subject.pods) {
            (Some(namespaces), _) => {
                namespaces_selection(namespaces, &format!("{field}.namespaces"), &ctx)?
            }
            (_, Some(pods)) => pods_selection(pods, &format!("{field}.pods"), &ctx)?,
            // one_of refused the rest.
            (None, None) => return Err(ctx.error(field, "subject must set namespaces or pods")),
        }
    };

    let ingress_rules = spec.ingress.as_deref().unwrap_or_default();
    check_count(
        "spec.ingress",
        ingress_rules.len(),
        MAX_RULES,
        "rules",
        &ctx,
    )?;
    let ingress = ingress_rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            let field = format!("spec.ingress[{index}]");
            let peers = required_list(rule.from.as_deref(), &field, "from", &ctx)?
                .iter()
                .enumerate()
                .map(|(i, peer)| ingress_peer(peer, &format!("{field}.from[{i}]"), &ctx))
                .collect::<Result<Vec<_>, _>>()?;
            cluster_rule(
                &field,
                rule.name.as_deref(),
                rule.action.as_deref(),
                peers,
                rule.protocols.as_deref(),
                &ctx,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    let egress_rules = spec.egress.as_deref().unwrap_or_default();
    check_count("spec.egress", egress_rules.len(), MAX_RULES, "rules", &ctx)?;
    let egress = egress_rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            let field = format!("spec.egress[{index}]");
            let peers = required_list(rule.to.as_deref(), &field, "to", &ctx)?
                .iter()
                .enumerate()
                .map(|(i, peer)| egress_peer(peer, &format!("{field}.to[{i}]"), &ctx))
                .collect::<Result<Vec<_>, _>>()?;
            let rule = cluster_rule(
                &field,
                rule.name.as_deref(),
                rule.action.as_deref(),
                peers,
                rule.protocols.as_deref(),
                &ctx,
            )?;
            // The experimental CRD's CEL rule: a named port needs a pod to resolve on.
            let named = rule
                .ports
                .iter()
                .flatten()
                .any(|p| matches!(p, ClusterPort::Named(_)));
            if let Some(index) = rule
                .peers
                .iter()
                .position(|p| matches!(p, ClusterPeer::Networks(_)))
                .filter(|_| named)
            {
                return Err(ctx.error(
                    format!("{field}.to[{index}].networks"),
                    "a networks peer cannot be combined with destinationNamedPort in one rule: \
                     a named port is resolved on a destination pod, and a network has none",
                ));
            }
            Ok(rule)
        })
        .collect::<Result<Vec<_>, _>>()?;

    Ok(ClusterPolicyInfo {
        name,
        tier,
        priority,
        subject,
        ingress,
        egress,
    })
}

fn check_count(
    field: &str,
    count: usize,
    max: usize,
    what: &str,
    ctx: &ErrorContext<'_>,
) -> Result<(), ValidationError> {
    if count > max {
        return Err(ctx.error(
            field,
            format!("{count} {what} given; at most {max} are allowed"),
        ));
    }
    Ok(())
}

/// `from`/`to`: required, 1 to 25 peers.
fn required_list<'a, T>(
    list: Option<&'a [T]>,
    rule_field: &str,
    name: &str,
    ctx: &ErrorContext<'_>,
) -> Result<&'a [T], ValidationError> {
    let field = format!("{rule_field}.{name}");
    match list {
        None => Err(ctx.error(
            field,
            format!("{name} is required: a list of 1 to {MAX_PEERS} peers"),
        )),
        Some([]) => Err(ctx.error(
            field,
            format!("{name} is empty; it needs 1 to {MAX_PEERS} peers"),
        )),
        Some(list) => {
            check_count(&field, list.len(), MAX_PEERS, "peers", ctx)?;
            Ok(list)
        }
    }
}

/// A one-of union: exactly one member set. Unknown members are named in the error (the
/// peers, which fail closed instead, do not come here with only unknown members).
fn one_of(
    field: &str,
    members: &[(&str, bool)],
    unknown: &UnknownFields,
    ctx: &ErrorContext<'_>,
) -> Result<(), ValidationError> {
    let set: Vec<&str> = members
        .iter()
        .filter(|(_, present)| *present)
        .map(|(name, _)| *name)
        .collect();
    let known: Vec<&str> = members.iter().map(|(name, _)| *name).collect();
    let known = known.join(", ");
    if let Some(name) = unknown.keys().next() {
        return Err(ctx.error(
            format!("{field}.{name}"),
            format!("unknown field {name:?}; exactly one of {known} must be set"),
        ));
    }
    match set.as_slice() {
        [_] => Ok(()),
        [] => Err(ctx.error(
            field,
            format!("exactly one of {known} must be set; none is"),
        )),
        several => Err(ctx.error(
            field,
            format!(
                "exactly one of {known} must be set, but {} are",
                several.join(" and ")
            ),
        )),
    }
}

fn namespaces_selection(
    selector: &LabelSelector,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PodSelection, ValidationError> {
    Ok(PodSelection {
        namespaces: validated_selector(selector, ctx, field)?,
        pods: LabelSel::everything(),
    })
}

fn pods_selection(
    pods: &NamespacedPod,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PodSelection, ValidationError> {
    let namespaces = match &pods.namespace_selector {
        Some(selector) => validated_selector(selector, ctx, &format!("{field}.namespaceSelector"))?,
        // Absent: every namespace, as `{}`.
        None => LabelSel::everything(),
    };
    let pod_selector = pods.pod_selector.as_ref().ok_or_else(|| {
        ctx.error(
            format!("{field}.podSelector"),
            "podSelector is required ({} selects every pod)",
        )
    })?;
    Ok(PodSelection {
        namespaces,
        pods: validated_selector(pod_selector, ctx, &format!("{field}.podSelector"))?,
    })
}

fn ingress_peer(
    peer: &IngressPeer,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<ClusterPeer, ValidationError> {
    let members = [
        ("namespaces", peer.namespaces.is_some()),
        ("pods", peer.pods.is_some()),
    ];
    if let Some(unknown) = only_unknown(&members, &peer.unknown) {
        return Ok(unknown);
    }
    one_of(field, &members, &peer.unknown, ctx)?;
    match (&peer.namespaces, &peer.pods) {
        (Some(namespaces), _) => Ok(ClusterPeer::Pods(namespaces_selection(
            namespaces,
            &format!("{field}.namespaces"),
            ctx,
        )?)),
        (_, Some(pods)) => Ok(ClusterPeer::Pods(pods_selection(
            pods,
            &format!("{field}.pods"),
            ctx,
        )?)),
        (None, None) => Err(ctx.error(field, "a peer must set namespaces or pods")),
    }
}

fn egress_peer(
    peer: &EgressPeer,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<ClusterPeer, ValidationError> {
    for (name, present) in [
        ("nodes", peer.nodes.is_some()),
        ("domainNames", peer.domain_names.is_some()),
    ] {
        if present {
            return Err(ctx.error(
                format!("{field}.{name}"),
                format!(
                    "{name} peers are part of network-policy-api's experimental channel and are \
                     not supported by netpol-agent; use namespaces, pods or networks"
                ),
            ));
        }
    }
    let members = [
        ("namespaces", peer.namespaces.is_some()),
        ("pods", peer.pods.is_some()),
        ("networks", peer.networks.is_some()),
    ];
    if let Some(unknown) = only_unknown(&members, &peer.unknown) {
        return Ok(unknown);
    }
    one_of(field, &members, &peer.unknown, ctx)?;
    if let Some(namespaces) = &peer.namespaces {
        return Ok(ClusterPeer::Pods(namespaces_selection(
            namespaces,
            &format!("{field}.namespaces"),
            ctx,
        )?));
    }
    if let Some(pods) = &peer.pods {
        return Ok(ClusterPeer::Pods(pods_selection(
            pods,
            &format!("{field}.pods"),
            ctx,
        )?));
    }
    let networks = peer.networks.as_deref().unwrap_or_default();
    let field = format!("{field}.networks");
    if networks.is_empty() {
        return Err(ctx.error(
            field,
            format!("networks is empty; it needs 1 to {MAX_NETWORKS} CIDRs"),
        ));
    }
    check_count(&field, networks.len(), MAX_NETWORKS, "CIDRs", ctx)?;
    let mut seen = BTreeSet::new();
    let mut nets = Vec::with_capacity(networks.len());
    for (index, text) in networks.iter().enumerate() {
        let item = format!("{field}[{index}]");
        if !seen.insert(text.as_str()) {
            return Err(ctx.error(item, format!("{text:?} is listed twice; networks is a set")));
        }
        nets.push(network_cidr(text, &item, ctx)?);
    }
    Ok(ClusterPeer::Networks(nets))
}

/// A peer whose fields are all unknown to this version: upstream's fail-closed case.
fn only_unknown(members: &[(&str, bool)], unknown: &UnknownFields) -> Option<ClusterPeer> {
    let known_set = members.iter().any(|(_, present)| *present);
    (!known_set && !unknown.is_empty())
        .then(|| ClusterPeer::Unknown(unknown.keys().cloned().collect()))
}

/// The API's `isCIDR`: what Go's `netip.ParsePrefix` accepts (no zone, no leading zeros in
/// an IPv4 address or in the prefix length), not an IPv4-mapped IPv6 address, at most 43
/// characters. Host bits are allowed and masked, as ParsePrefix does.
fn network_cidr(text: &str, field: &str, ctx: &ErrorContext<'_>) -> Result<IpNet, ValidationError> {
    if text.len() > MAX_CIDR_LEN {
        return Err(ctx.error(
            field,
            format!(
                "{} is {} characters long; a CIDR has at most {MAX_CIDR_LEN}",
                super::shown(text),
                text.len()
            ),
        ));
    }
    let bad = |why: &str| {
        ctx.error(
            field,
            format!("{text:?} is not a valid CIDR ({why}); expected address/prefix-length such as 10.0.0.0/16 or fd00::/64"),
        )
    };
    let Some((address, bits)) = text.split_once('/') else {
        if text.parse::<IpAddr>().is_ok() {
            let len = if text.contains(':') { 128 } else { 32 };
            return Err(ctx.error(
                field,
                format!("{text:?} has no prefix length; write a CIDR such as {text}/{len}"),
            ));
        }
        return Err(bad("no prefix length"));
    };
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err(bad(
            "the prefix length must be a decimal number without leading zeros",
        ));
    }
    let address: IpAddr = address
        .parse()
        .map_err(|_| bad("the address is not an IPv4 or IPv6 address"))?;
    if let IpAddr::V6(v6) = address {
        if v6.to_ipv4_mapped().is_some() {
            return Err(bad(
                "an IPv4-mapped IPv6 address; write the IPv4 CIDR instead",
            ));
        }
    }
    let bits: u8 = bits
        .parse()
        .map_err(|_| bad("prefix length out of range"))?;
    IpNet::new(address, bits)
        .map(|net| net.trunc())
        .map_err(|_| bad("prefix length out of range for the address family"))
}

fn cluster_rule(
    field: &str,
    name: Option<&str>,
    action: Option<&str>,
    peers: Vec<ClusterPeer>,
    protocols: Option<&[ProtocolEntry]>,
    ctx: &ErrorContext<'_>,
) -> Result<ClusterRule, ValidationError> {
    if let Some(name) = name {
        if name.chars().count() > MAX_RULE_NAME_LEN {
            return Err(ctx.error(
                format!("{field}.name"),
                format!(
                    "rule name {} is {} characters long; at most {MAX_RULE_NAME_LEN} are allowed",
                    super::shown(name),
                    name.chars().count()
                ),
            ));
        }
    }
    let action = match action {
        Some("Accept") => RuleAction::Accept,
        Some("Deny") => RuleAction::Deny,
        Some("Pass") => RuleAction::Pass,
        Some(other) => {
            return Err(ctx.error(
                format!("{field}.action"),
                format!("unknown action {other:?}; accepted values are Accept, Deny and Pass"),
            ))
        }
        None => {
            return Err(ctx.error(
                format!("{field}.action"),
                "action is required: Accept, Deny or Pass",
            ))
        }
    };
    let ports = match protocols {
        None => None,
        Some([]) => {
            return Err(ctx.error(
                format!("{field}.protocols"),
                format!("protocols is empty; leave it out to match every protocol, or give 1 to {MAX_PROTOCOLS} entries"),
            ))
        }
        Some(entries) => {
            check_count(
                &format!("{field}.protocols"),
                entries.len(),
                MAX_PROTOCOLS,
                "entries",
                ctx,
            )?;
            Some(
                entries
                    .iter()
                    .enumerate()
                    .map(|(i, entry)| protocol_entry(entry, &format!("{field}.protocols[{i}]"), ctx))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
    };
    Ok(ClusterRule {
        name: name.map(str::to_string),
        action,
        peers,
        ports,
    })
}

fn protocol_entry(
    entry: &ProtocolEntry,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<ClusterPort, ValidationError> {
    one_of(
        field,
        &[
            ("tcp", entry.tcp.is_some()),
            ("udp", entry.udp.is_some()),
            ("sctp", entry.sctp.is_some()),
            (
                "destinationNamedPort",
                entry.destination_named_port.is_some(),
            ),
        ],
        &entry.unknown,
        ctx,
    )?;
    if let Some(name) = &entry.destination_named_port {
        if name.is_empty() {
            return Err(ctx.error(
                format!("{field}.destinationNamedPort"),
                "destinationNamedPort is empty; give the name of a container port",
            ));
        }
        return Ok(ClusterPort::Named(name.clone()));
    }
    let (protocol, key, port) = match (&entry.tcp, &entry.udp, &entry.sctp) {
        (Some(p), _, _) => (Protocol::Tcp, "tcp", p),
        (_, Some(p), _) => (Protocol::Udp, "udp", p),
        (_, _, Some(p)) => (Protocol::Sctp, "sctp", p),
        _ => {
            return Err(ctx.error(
                field,
                "a protocol entry must set tcp, udp, sctp or destinationNamedPort",
            ))
        }
    };
    let field = format!("{field}.{key}.destinationPort");
    let port = port.destination_port.as_ref().ok_or_else(|| {
        ctx.error(
            &field,
            "destinationPort is required (the API refuses an empty protocol); \
             for every port write range: {start: 1, end: 65535}",
        )
    })?;
    let (first, last) = destination_port(port, &field, ctx)?;
    Ok(ClusterPort::Numeric {
        protocol,
        first,
        last,
    })
}

fn destination_port(
    port: &Port,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<(u16, u16), ValidationError> {
    one_of(
        field,
        &[
            ("number", port.number.is_some()),
            ("range", port.range.is_some()),
        ],
        &port.unknown,
        ctx,
    )?;
    let number = |value: Option<i64>, field: String| -> Result<u16, ValidationError> {
        match value {
            Some(n) if (1..=65535).contains(&n) => Ok(u16::try_from(n).unwrap_or(u16::MAX)),
            Some(n) => Err(ctx.error(
                field,
                format!("port {n} is out of range; it must be between 1 and 65535"),
            )),
            None => Err(ctx.error(field, "a port number is required")),
        }
    };
    if let Some(n) = port.number {
        let n = number(Some(n), format!("{field}.number"))?;
        return Ok((n, n));
    }
    let range = port
        .range
        .as_ref()
        .ok_or_else(|| ctx.error(field, "number or range is required"))?;
    let start = number(range.start, format!("{field}.range.start"))?;
    let end = number(range.end, format!("{field}.range.end"))?;
    if start >= end {
        return Err(ctx.error(
            format!("{field}.range"),
            format!("start {start} must be less than end {end}; a single port is written number: {start}"),
        ));
    }
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Expression;
    use serde_json::{json, Value};

    fn cnp(spec: Value) -> ClusterNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "guard"},
            "spec": spec,
        }))
        .expect("test policy deserializes")
    }

    fn base() -> Value {
        json!({"tier": "Admin", "priority": 10, "subject": {"namespaces": {}}})
    }

    fn with(path: &[&str], value: Value) -> Value {
        let mut spec = base();
        let mut at = &mut spec;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        spec
    }

    fn valid(spec: Value) -> ClusterPolicyInfo {
        cluster_network_policy(&cnp(spec)).expect("policy is valid")
    }

    fn error(spec: Value) -> ValidationError {
        match cluster_network_policy(&cnp(spec)) {
            Err(e) => e,
            Ok(info) => panic!("expected a validation error, got {info:?}"),
        }
    }

    /// The error of an egress rule `{action: Deny, to: [peer]}`.
    fn peer_error(peer: Value) -> ValidationError {
        error(with(&["egress"], json!([{"action": "Deny", "to": [peer]}])))
    }

    fn egress_peer(peer: Value) -> ClusterPeer {
        let info = valid(with(&["egress"], json!([{"action": "Deny", "to": [peer]}])));
        info.egress[0].peers[0].clone()
    }

    /// The error of an ingress rule's first protocol entry.
    fn protocol_error(entry: Value) -> ValidationError {
        error(with(
            &["ingress"],
            json!([{"action": "Accept", "from": [{"namespaces": {}}], "protocols": [entry]}]),
        ))
    }

    fn eq(k: &str, v: &str) -> LabelSel {
        LabelSel::from_exprs(vec![Expression::Equal(k.into(), v.into())])
    }

    #[test]
    fn a_full_policy_becomes_its_compact_form() {
        let info = valid(json!({
            "tier": "Baseline",
            "priority": 1000,
            "subject": {"pods": {"podSelector": {"matchLabels": {"app": "web"}}}},
            "ingress": [
                {"name": "from-ops", "action": "Pass",
                 "from": [{"namespaces": {"matchLabels": {"team": "ops"}}},
                          {"pods": {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 80}}},
                               {"udp": {"destinationPort": {"range": {"start": 53, "end": 54}}}},
                               {"destinationNamedPort": "web"}]}
            ],
            "egress": [{"action": "Accept", "to": [{"networks": ["10.1.2.3/8", "::/0"]}]}],
        }));
        assert_eq!(info.name, "guard");
        assert_eq!((info.tier, info.priority), (Tier::Baseline, 1000));
        assert_eq!(
            info.subject,
            PodSelection {
                namespaces: LabelSel::everything(),
                pods: eq("app", "web")
            }
        );
        let rule = &info.ingress[0];
        assert_eq!(rule.name.as_deref(), Some("from-ops"));
        assert_eq!(rule.action, RuleAction::Pass);
        assert_eq!(
            rule.peers,
            [
                ClusterPeer::Pods(PodSelection {
                    namespaces: eq("team", "ops"),
                    pods: LabelSel::everything()
                }),
                ClusterPeer::Pods(PodSelection {
                    namespaces: eq("team", "a"),
                    pods: LabelSel::everything()
                }),
            ]
        );
        assert_eq!(
            rule.ports.as_deref(),
            Some(
                &[
                    ClusterPort::Numeric {
                        protocol: Protocol::Tcp,
                        first: 80,
                        last: 80
                    },
                    ClusterPort::Numeric {
                        protocol: Protocol::Udp,
                        first: 53,
                        last: 54
                    },
                    ClusterPort::Named("web".into()),
                ][..]
            )
        );
        // Host bits are masked; IPv6 entries are kept for the IPv6 family.
        assert_eq!(
            info.egress[0].peers,
            [ClusterPeer::Networks(vec![
                "10.0.0.0/8".parse().unwrap(),
                "::/0".parse().unwrap()
            ])]
        );
        assert_eq!(info.egress[0].ports, None, "no protocols: everything");
    }

    #[test]
    fn tier_priority_and_subject_are_required_and_checked() {
        let cases = [
            (with(&["tier"], json!("admin")), "spec.tier", "unknown tier"),
            (with(&["tier"], Value::Null), "spec.tier", "required"),
            (
                with(&["priority"], json!(1001)),
                "spec.priority",
                "out of range",
            ),
            (
                with(&["priority"], json!(-1)),
                "spec.priority",
                "out of range",
            ),
            (
                with(&["priority"], Value::Null),
                "spec.priority",
                "required",
            ),
            (with(&["subject"], Value::Null), "spec.subject", "required"),
            (with(&["subject"], json!({})), "spec.subject", "none is"),
            (
                with(
                    &["subject"],
                    json!({"namespaces": {}, "pods": {"podSelector": {}}}),
                ),
                "spec.subject",
                "namespaces and pods",
            ),
            (
                with(&["subject"], json!({"nodes": {}})),
                "spec.subject.nodes",
                "unknown field",
            ),
            (
                with(&["subject"], json!({"pods": {"namespaceSelector": {}}})),
                "spec.subject.pods.podSelector",
                "required",
            ),
            (
                with(
                    &["subject", "namespaces"],
                    json!({"matchExpressions": [{"key": "a", "operator": "Near"}]}),
                ),
                "spec.subject.namespaces.matchExpressions[0].operator",
                "unknown operator",
            ),
        ];
        for (spec, field, message) in cases {
            let e = error(spec);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(message), "{e}");
            assert_eq!(
                (e.kind, e.object.as_str()),
                ("ClusterNetworkPolicy", "guard")
            );
        }
        assert_eq!(valid(with(&["priority"], json!(0))).priority, 0);
        let mut namespaced = cnp(base());
        namespaced.metadata.namespace = Some("prod".into());
        let e = cluster_network_policy(&namespaced).unwrap_err();
        assert_eq!(e.field, "metadata.namespace");
        assert!(e.message.contains("cluster-scoped"), "{e}");
        let e = cluster_network_policy(&ClusterNetworkPolicy {
            spec: None,
            ..cnp(base())
        })
        .unwrap_err();
        assert_eq!(e.field, "spec");
    }

    #[test]
    fn rules_actions_names_and_peer_counts_are_limited() {
        let rule = json!({"action": "Deny", "from": [{"namespaces": {}}]});
        let e = error(with(&["ingress"], Value::Array(vec![rule.clone(); 26])));
        assert_eq!(e.field, "spec.ingress");
        assert!(
            e.message.contains("26 rules") && e.message.contains("at most 25"),
            "{e}"
        );
        assert_eq!(
            valid(with(&["ingress"], Value::Array(vec![rule; 25])))
                .ingress
                .len(),
            25
        );

        let cases = [
            (
                json!({"action": "Allow", "from": [{"namespaces": {}}]}),
                "spec.ingress[0].action",
                "unknown action \"Allow\"",
            ),
            (
                json!({"from": [{"namespaces": {}}]}),
                "spec.ingress[0].action",
                "required",
            ),
            (
                json!({"action": "Pass"}),
                "spec.ingress[0].from",
                "required",
            ),
            (
                json!({"action": "Pass", "from": []}),
                "spec.ingress[0].from",
                "empty",
            ),
            (
                json!({"action": "Pass", "from": vec![json!({"namespaces": {}}); 26]}),
                "spec.ingress[0].from",
                "at most 25",
            ),
            (
                json!({"action": "Pass", "from": [{}]}),
                "spec.ingress[0].from[0]",
                "none is",
            ),
            (
                json!({"action": "Pass", "from": [{"namespaces": {}, "pods": {"podSelector": {}}}]}),
                "spec.ingress[0].from[0]",
                "namespaces and pods",
            ),
            (
                json!({"name": "x".repeat(101), "action": "Pass", "from": [{"namespaces": {}}]}),
                "spec.ingress[0].name",
                "at most 100",
            ),
            (
                json!({"action": "Pass", "from": [{"namespaces": {}}], "protocols": []}),
                "spec.ingress[0].protocols",
                "empty",
            ),
            (
                json!({"action": "Pass", "from": [{"namespaces": {}}], "protocols": vec![json!({"destinationNamedPort": "a"}); 26]}),
                "spec.ingress[0].protocols",
                "at most 25",
            ),
        ];
        for (rule, field, message) in cases {
            let e = error(with(&["ingress"], json!([rule])));
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(message), "{e}");
        }
        let name = "n".repeat(100);
        let info = valid(with(
            &["ingress"],
            json!([{"name": name, "action": "Pass", "from": [{"namespaces": {}}]}]),
        ));
        assert_eq!(info.ingress[0].name.as_deref(), Some(name.as_str()));
    }

    #[test]
    fn protocols_and_ports_follow_the_api() {
        let cases = [
            (
                json!({"tcp": {}}),
                "spec.ingress[0].protocols[0].tcp.destinationPort",
                "required",
            ),
            (
                json!({"tcp": {"destinationPort": {"number": 0}}}),
                "spec.ingress[0].protocols[0].tcp.destinationPort.number",
                "out of range",
            ),
            (
                json!({"udp": {"destinationPort": {"number": 65536}}}),
                "spec.ingress[0].protocols[0].udp.destinationPort.number",
                "out of range",
            ),
            (
                json!({"sctp": {"destinationPort": {"range": {"start": 9, "end": 9}}}}),
                "spec.ingress[0].protocols[0].sctp.destinationPort.range",
                "less than",
            ),
            (
                json!({"sctp": {"destinationPort": {"range": {"start": 9}}}}),
                "spec.ingress[0].protocols[0].sctp.destinationPort.range.end",
                "required",
            ),
            (
                json!({"tcp": {"destinationPort": {"number": 1, "range": {"start": 1, "end": 2}}}}),
                "spec.ingress[0].protocols[0].tcp.destinationPort",
                "number and range",
            ),
            (
                json!({"tcp": {"destinationPort": {}}}),
                "spec.ingress[0].protocols[0].tcp.destinationPort",
                "none is",
            ),
            (
                json!({"tcp": {"destinationPort": {"number": 1}}, "udp": {"destinationPort": {"number": 1}}}),
                "spec.ingress[0].protocols[0]",
                "tcp and udp",
            ),
            (json!({}), "spec.ingress[0].protocols[0]", "none is"),
            (
                json!({"icmp": {}}),
                "spec.ingress[0].protocols[0].icmp",
                "unknown field",
            ),
            (
                json!({"destinationNamedPort": ""}),
                "spec.ingress[0].protocols[0].destinationNamedPort",
                "empty",
            ),
        ];
        for (entry, field, message) in cases {
            let e = protocol_error(entry);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(message), "{e}");
        }
    }

    #[test]
    fn networks_are_cidrs_as_the_api_server_parses_them() {
        let cases = [
            (
                json!({"networks": []}),
                "spec.egress[0].to[0].networks",
                "empty",
            ),
            (
                json!({"networks": vec![json!("10.0.0.0/8"); 26]}),
                "spec.egress[0].to[0].networks",
                "at most 25",
            ),
            (
                json!({"networks": ["10.0.0.0/8", "10.0.0.0/8"]}),
                "spec.egress[0].to[0].networks[1]",
                "twice",
            ),
            (
                json!({"networks": ["10.0.0.0/8", "10.0.0.300/24"]}),
                "spec.egress[0].to[0].networks[1]",
                "not a valid CIDR",
            ),
            (
                json!({"networks": ["10.0.0.1"]}),
                "spec.egress[0].to[0].networks[0]",
                "10.0.0.1/32",
            ),
            (
                json!({"networks": ["010.0.0.0/8"]}),
                "spec.egress[0].to[0].networks[0]",
                "not a valid CIDR",
            ),
            (
                json!({"networks": ["10.0.0.0/08"]}),
                "spec.egress[0].to[0].networks[0]",
                "leading zeros",
            ),
            (
                json!({"networks": ["10.0.0.0/+8"]}),
                "spec.egress[0].to[0].networks[0]",
                "decimal",
            ),
            (
                json!({"networks": ["10.0.0.0/33"]}),
                "spec.egress[0].to[0].networks[0]",
                "out of range",
            ),
            (
                json!({"networks": ["::ffff:10.0.0.0/104"]}),
                "spec.egress[0].to[0].networks[0]",
                "IPv4-mapped",
            ),
            (
                json!({"networks": ["fe80::1%eth0/64"]}),
                "spec.egress[0].to[0].networks[0]",
                "not a valid CIDR",
            ),
            (
                json!({"networks": ["2001:0db8:0000:0000:0000:0000:0000:0000/0128"]}),
                "spec.egress[0].to[0].networks[0]",
                "at most 43",
            ),
            (
                json!({"networks": ["10.0.0.0/8"], "namespaces": {}}),
                "spec.egress[0].to[0]",
                "namespaces and networks",
            ),
        ];
        for (peer, field, message) in cases {
            let e = peer_error(peer);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(message), "{e}");
        }
        assert_eq!(
            egress_peer(json!({"networks": ["0.0.0.0/0", "fd00::1/64"]})),
            ClusterPeer::Networks(vec![
                "0.0.0.0/0".parse().unwrap(),
                "fd00::/64".parse().unwrap()
            ])
        );
    }

    #[test]
    fn experimental_peers_are_refused_and_unknown_ones_fail_closed() {
        for (peer, field) in [
            (
                json!({"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}),
                "spec.egress[0].to[0].nodes",
            ),
            (
                json!({"domainNames": ["*.example.com"]}),
                "spec.egress[0].to[0].domainNames",
            ),
            (
                json!({"domainNames": ["a.example"], "networks": ["10.0.0.0/8"]}),
                "spec.egress[0].to[0].domainNames",
            ),
        ] {
            let e = peer_error(peer);
            assert_eq!(e.field, field, "{e}");
            assert!(
                e.message.contains("experimental") && e.message.contains("not supported"),
                "{e}"
            );
        }
        assert_eq!(
            egress_peer(json!({"services": [{"name": "x"}]})),
            ClusterPeer::Unknown(vec!["services".into()])
        );
        let info = valid(with(
            &["ingress"],
            json!([{"action": "Deny", "from": [{"serviceAccounts": {}}]}]),
        ));
        assert_eq!(
            info.ingress[0].peers,
            [ClusterPeer::Unknown(vec!["serviceAccounts".into()])]
        );
        // An unknown field beside a known one is an ordinary one-of error.
        let e = peer_error(json!({"networks": ["10.0.0.0/8"], "services": []}));
        assert_eq!(e.field, "spec.egress[0].to[0].services");
    }

    #[test]
    fn named_ports_cannot_be_resolved_on_networks() {
        let e = error(with(
            &["egress"],
            json!([{"action": "Deny", "to": [{"namespaces": {}}, {"networks": ["10.0.0.0/8"]}],
                    "protocols": [{"destinationNamedPort": "dns"}]}]),
        ));
        assert_eq!(e.field, "spec.egress[0].to[1].networks");
        assert!(e.message.contains("named port"), "{e}");
        // Numeric ports with networks are fine.
        valid(with(
            &["egress"],
            json!([{"action": "Deny", "to": [{"networks": ["10.0.0.0/8"]}],
                    "protocols": [{"tcp": {"destinationPort": {"number": 53}}}]}]),
        ));
    }
}
