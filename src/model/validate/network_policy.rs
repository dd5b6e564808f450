//! NetworkPolicies: policy types as declared or defaulted, rules, ports (named, numbered,
//! ranges), peers and ipBlocks, with the API server's checks that matter for enforcement.

use super::*;

pub(super) struct DeclaredPolicyTypes {
    ingress: bool,
    egress: bool,
}

/// Validates a NetworkPolicy and applies the API server's defaulting (policyTypes,
/// protocols).
pub fn network_policy(np: &NetworkPolicy) -> Result<PolicyInfo, ValidationError> {
    let key = namespaced_key(&np.metadata);
    let object = key.to_string();
    let ctx = ErrorContext {
        kind: NETWORK_POLICY_KIND,
        object: &object,
    };
    check_names(&np.metadata, &ctx)?;
    let spec = np.spec.as_ref().ok_or_else(|| {
        ctx.error(
            "spec",
            "spec is required: it holds the podSelector and the rules",
        )
    })?;

    // podSelector is a non-pointer struct in the Go API with omitempty, so the API server
    // stores an absent one as `{}`: every pod of the namespace.
    let pod_selector = match &spec.pod_selector {
        Some(selector) => validated_selector(selector, &ctx, "spec.podSelector")?,
        None => LabelSel::everything(),
    };

    let declared = declared_policy_types(spec.policy_types.as_deref(), &ctx)?;

    // Rules are validated even for a direction the policy does not govern: the API server
    // rejects such a policy too, and accepting it here would hide the mistake.
    let ingress_rules = spec
        .ingress
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, rule)| {
            policy_rule(
                rule.ports.as_deref(),
                rule.from.as_deref(),
                &format!("spec.ingress[{index}]"),
                "from",
                &key.namespace,
                &ctx,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let egress_rules = spec
        .egress
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, rule)| {
            policy_rule(
                rule.ports.as_deref(),
                rule.to.as_deref(),
                &format!("spec.egress[{index}]"),
                "to",
                &key.namespace,
                &ctx,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    let (governs_ingress, governs_egress) = match declared {
        Some(types) => (types.ingress, types.egress),
        // The API server's defaulting: always Ingress, Egress only when egress rules exist.
        None => (true, !egress_rules.is_empty()),
    };

    Ok(PolicyInfo {
        key,
        pod_selector,
        ingress: governs_ingress.then_some(ingress_rules),
        egress: governs_egress.then_some(egress_rules),
    })
}

/// `None` when policyTypes is absent or empty (the API server defaults both the same way).
pub(super) fn declared_policy_types(
    policy_types: Option<&[String]>,
    ctx: &ErrorContext<'_>,
) -> Result<Option<DeclaredPolicyTypes>, ValidationError> {
    let Some(policy_types) = policy_types.filter(|types| !types.is_empty()) else {
        return Ok(None);
    };
    let mut declared = DeclaredPolicyTypes {
        ingress: false,
        egress: false,
    };
    for (index, policy_type) in policy_types.iter().enumerate() {
        match policy_type.as_str() {
            "Ingress" => declared.ingress = true,
            "Egress" => declared.egress = true,
            other => {
                return Err(ctx.error(
                    format!("spec.policyTypes[{index}]"),
                    format!(
                        "unknown policy type {}; accepted values are Ingress and Egress",
                        shown(other)
                    ),
                ))
            }
        }
    }
    Ok(Some(declared))
}

/// One ingress or egress rule; `peers_name` is `from` or `to`.
pub(super) fn policy_rule(
    ports: Option<&[NetworkPolicyPort]>,
    peers: Option<&[NetworkPolicyPeer]>,
    rule_field: &str,
    peers_name: &str,
    policy_namespace: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PolicyRule, ValidationError> {
    let ports = ports
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, port)| port_spec(port, &format!("{rule_field}.ports[{index}]"), ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let peers = match peers {
        Some(peers) if !peers.is_empty() => Some(
            peers
                .iter()
                .enumerate()
                .map(|(index, peer)| {
                    validated_peer(
                        peer,
                        &format!("{rule_field}.{peers_name}[{index}]"),
                        policy_namespace,
                        ctx,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        // An absent or empty peer list places no restriction on the peer.
        _ => None,
    };
    Ok(PolicyRule { ports, peers })
}

pub(super) fn port_spec(
    port: &NetworkPolicyPort,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<PortSpec, ValidationError> {
    let protocol = protocol(port.protocol.as_deref(), &format!("{field}.protocol"), ctx)?;
    let port_field = format!("{field}.port");
    let end_port_field = format!("{field}.endPort");
    let port_match = match (&port.port, port.end_port) {
        (None, None) => PortMatch::Any,
        (None, Some(end_port)) => {
            return Err(ctx.error(
                end_port_field,
                format!(
                "endPort {end_port} needs a numeric port to start the range, but port is not set"
            ),
            ))
        }
        (Some(IntOrString::String(name)), end_port) => {
            if let Some(problem) = port_name_problem(name) {
                return Err(ctx.error(
                    port_field,
                    format!("named port {} is invalid: {problem}", shown(name)),
                ));
            }
            if let Some(end_port) = end_port {
                return Err(ctx.error(
                    end_port_field,
                    format!("endPort {end_port} cannot be used with the named port {}; a range needs a numeric port", shown(name)),
                ));
            }
            PortMatch::Named(name.clone())
        }
        (Some(IntOrString::Int(first)), end_port) => {
            let first = port_number(*first, &port_field, ctx)?;
            let last = match end_port {
                None => first,
                Some(end_port) => {
                    if end_port < i32::from(first) || end_port > MAX_PORT {
                        return Err(ctx.error(
                            end_port_field,
                            format!("endPort {end_port} is invalid: it must be between port ({first}) and {MAX_PORT}"),
                        ));
                    }
                    // In range 1..=65535 after the check above.
                    u16::try_from(end_port).unwrap_or(u16::MAX)
                }
            };
            PortMatch::Range { first, last }
        }
    };
    Ok(PortSpec {
        protocol,
        port: port_match,
    })
}

pub(super) fn validated_peer(
    peer: &NetworkPolicyPeer,
    field: &str,
    policy_namespace: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Peer, ValidationError> {
    match (&peer.ip_block, &peer.pod_selector, &peer.namespace_selector) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(ctx.error(
            field,
            "ipBlock cannot be combined with podSelector or namespaceSelector in the same peer; \
             put them in separate peers",
        )),
        (Some(ip_block), None, None) => {
            validated_ip_block(ip_block, &format!("{field}.ipBlock"), ctx)
        }
        (None, None, None) => Err(ctx.error(
            field,
            "a peer must set at least one of podSelector, namespaceSelector or ipBlock",
        )),
        (None, pod_selector, namespace_selector) => {
            let pods = match pod_selector {
                Some(selector) => {
                    validated_selector(selector, ctx, &format!("{field}.podSelector"))?
                }
                None => LabelSel::everything(),
            };
            let namespaces = match namespace_selector {
                Some(selector) => NamespaceScope::Selector(validated_selector(
                    selector,
                    ctx,
                    &format!("{field}.namespaceSelector"),
                )?),
                None => NamespaceScope::Named(policy_namespace.to_string()),
            };
            Ok(Peer::Pods { namespaces, pods })
        }
    }
}

pub(super) fn validated_ip_block(
    ip_block: &IPBlock,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Peer, ValidationError> {
    let cidr = parse_cidr(&ip_block.cidr, &format!("{field}.cidr"), ctx)?;
    let mut except = Vec::new();
    for (index, text) in ip_block.except.iter().flatten().enumerate() {
        let except_field = format!("{field}.except[{index}]");
        let excepted = parse_cidr(text, &except_field, ctx)?;
        if IpFamily::of_net(&excepted) != IpFamily::of_net(&cidr) {
            return Err(ctx.error(
                except_field,
                format!(
                    "{} is {} but cidr {cidr} is {}; except entries must be of the cidr's address family",
                    shown(text),
                    family_name(&excepted),
                    family_name(&cidr)
                ),
            ));
        }
        // Like the API server, demand a strict subset: excepting the whole block (or more)
        // is almost certainly a mistake.
        if !cidr.contains(&excepted) || excepted.prefix_len() <= cidr.prefix_len() {
            return Err(ctx.error(
                except_field,
                format!("{} is not inside cidr {cidr}; except entries must be strict subsets of the cidr", shown(text)),
            ));
        }
        except.push(excepted);
    }
    except.sort();
    except.dedup();
    Ok(Peer::IpBlock { cidr, except })
}

/// Parses `address/prefix-length`, accepting host bits (as the API server does) and
/// returning the network.
pub(super) fn parse_cidr(
    text: &str,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<IpNet, ValidationError> {
    match text.parse::<IpNet>() {
        Ok(net) => Ok(net.trunc()),
        Err(_) if !text.contains('/') && text.parse::<IpAddr>().is_ok() => Err(ctx.error(
            field,
            format!("{} has no prefix length; write a CIDR such as {text}/{}", shown(text), host_prefix_len(text)),
        )),
        Err(_) => Err(ctx.error(
            field,
            format!("{} is not a valid CIDR; expected address/prefix-length such as 10.0.0.0/16 or fd00::/64", shown(text)),
        )),
    }
}

pub(super) fn host_prefix_len(address: &str) -> u8 {
    if address.contains(':') {
        128
    } else {
        32
    }
}

pub(super) fn family_name(net: &IpNet) -> &'static str {
    match IpFamily::of_net(net) {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// Absent means TCP, as the API server defaults it.
pub(super) fn protocol(
    protocol: Option<&str>,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<Protocol, ValidationError> {
    match protocol {
        None => Ok(Protocol::Tcp),
        Some(name) => Protocol::parse(name).ok_or_else(|| {
            ctx.error(
                field,
                format!(
                    "unsupported protocol {}; accepted values are TCP, UDP and SCTP",
                    shown(name)
                ),
            )
        }),
    }
}

pub(super) fn port_number(
    number: i32,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<u16, ValidationError> {
    match u16::try_from(number) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(ctx.error(
            field,
            format!("port {number} is out of range; it must be between 1 and {MAX_PORT}"),
        )),
    }
}
