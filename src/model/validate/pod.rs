//! Pods: names, labels, node, phase, addresses (`status.podIPs`, one per family) and named
//! container ports, as the API server accepts them.

use super::*;

/// Validates a Pod. `Ok(None)` means the pod is not a workload the agent enforces on: it uses
/// the host network, has finished (Succeeded/Failed), or has no IP yet.
pub fn pod(pod: &Pod) -> Result<Option<PodInfo>, ValidationError> {
    let key = namespaced_key(&pod.metadata);
    let object = key.to_string();
    let ctx = ErrorContext {
        kind: POD_KIND,
        object: &object,
    };
    check_names(&pod.metadata, &ctx)?;

    let spec = pod.spec.as_ref();
    if spec.and_then(|spec| spec.host_network) == Some(true) {
        return Ok(None);
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|status| status.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Ok(None);
    }
    let ips = pod_ips(status, &ctx)?;
    if ips.is_empty() {
        return Ok(None);
    }

    let labels = validated_labels(pod.metadata.labels.as_ref(), &ctx)?;
    let named_ports = match spec {
        Some(spec) => named_ports(spec, &ctx)?,
        None => Vec::new(),
    };
    let sandbox_id = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(SANDBOX_ID_ANNOTATION))
        .map(String::as_str)
        .and_then(non_empty);

    Ok(Some(PodInfo {
        uid: pod.metadata.uid.as_deref().and_then(non_empty),
        node: spec
            .and_then(|spec| spec.node_name.as_deref())
            .and_then(non_empty),
        labels,
        ips,
        named_ports,
        sandbox_id,
        key,
    }))
}

/// Pod IPs from status.podIPs, falling back to the older single status.podIP; duplicates
/// are dropped, keeping the first occurrence (podIPs[0] is the primary IP).
pub(super) fn pod_ips(
    status: Option<&PodStatus>,
    ctx: &ErrorContext<'_>,
) -> Result<Vec<IpAddr>, ValidationError> {
    let Some(status) = status else {
        return Ok(Vec::new());
    };
    let mut ips = Vec::new();
    match status.pod_ips.as_deref() {
        Some(pod_ips) if !pod_ips.is_empty() => {
            for (index, pod_ip) in pod_ips.iter().enumerate() {
                let ip = parse_ip(&pod_ip.ip, &format!("status.podIPs[{index}].ip"), ctx)?;
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        _ => {
            if let Some(pod_ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) {
                ips.push(parse_ip(pod_ip, "status.podIP", ctx)?);
            }
        }
    }
    Ok(ips)
}

pub(super) fn parse_ip(
    text: &str,
    field: &str,
    ctx: &ErrorContext<'_>,
) -> Result<IpAddr, ValidationError> {
    text.parse::<IpAddr>().map_err(|_| {
        ctx.error(
            field,
            format!("{} is not a valid IPv4 or IPv6 address", shown(text)),
        )
    })
}

/// Named container ports of containers and then init containers (sidecars among them can
/// serve traffic), in declaration order, exact duplicates dropped. Unnamed ports cannot be
/// the target of a policy and are not looked at.
pub(super) fn named_ports(
    spec: &PodSpec,
    ctx: &ErrorContext<'_>,
) -> Result<Vec<NamedPort>, ValidationError> {
    let containers = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, container)| (format!("spec.containers[{index}]"), container))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .enumerate()
                .map(|(index, container)| (format!("spec.initContainers[{index}]"), container)),
        );
    let mut named_ports = Vec::new();
    for (container_field, container) in containers {
        for (index, port) in container.ports.iter().flatten().enumerate() {
            let Some(name) = port.name.as_deref().filter(|name| !name.is_empty()) else {
                continue;
            };
            let field = format!("{container_field}.ports[{index}]");
            if let Some(problem) = port_name_problem(name) {
                return Err(ctx.error(
                    format!("{field}.name"),
                    format!("port name {} is invalid: {problem}", shown(name)),
                ));
            }
            let protocol = protocol(port.protocol.as_deref(), &format!("{field}.protocol"), ctx)?;
            let number = port_number(port.container_port, &format!("{field}.containerPort"), ctx)?;
            let named_port = NamedPort {
                name: name.to_string(),
                protocol,
                port: number,
            };
            if !named_ports.contains(&named_port) {
                named_ports.push(named_port);
            }
        }
    }
    Ok(named_ports)
}
