//! Objects trimmed on arrival to what the calc graph reads, so the agent's memory follows the
//! fields it uses, not the size of the cluster's objects; a trimmed object validates exactly
//! as the untrimmed one.

use super::*;

/// Trims a Pod to what the calc graph reads: name, namespace, uid, labels, the
/// [`KEPT_POD_ANNOTATIONS`]; `spec.nodeName`, `spec.hostNetwork`, and the name and ports
/// (number, name, protocol) of the containers and init containers that have named ports
/// (see `trim_containers`); `status.phase`,
/// `status.podIP` and `status.podIPs`. It validates exactly as the untrimmed pod.
pub fn trim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    let annotations = meta.annotations.and_then(|mut annotations| {
        annotations.retain(|key, _| KEPT_POD_ANNOTATIONS.contains(&key.as_str()));
        (!annotations.is_empty()).then_some(annotations)
    });
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        labels: meta.labels,
        annotations,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        host_network: spec.host_network,
        containers: trim_containers(spec.containers),
        init_containers: spec
            .init_containers
            .map(trim_containers)
            .filter(|containers| !containers.is_empty()),
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        pod_ip: status.pod_ip,
        pod_ips: status.pod_ips.map(|mut ips| {
            ips.shrink_to_fit();
            ips
        }),
        ..PodStatus::default()
    });
}

/// Keeps each container's name and ports (number, name, protocol). Positions are kept, since
/// validation errors name a container and a port by index; only what no index can reach is
/// dropped: unnamed ports after a container's last named one, and containers after the last
/// one with a named port.
pub(super) fn trim_containers(containers: Vec<Container>) -> Vec<Container> {
    let mut containers: Vec<Container> = containers
        .into_iter()
        .map(|container| {
            let mut ports: Vec<ContainerPort> = container
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|port| ContainerPort {
                    container_port: port.container_port,
                    name: port.name,
                    protocol: port.protocol,
                    ..ContainerPort::default()
                })
                .collect();
            while ports.last().is_some_and(|port| !is_named(port)) {
                ports.pop();
            }
            ports.shrink_to_fit();
            Container {
                name: container.name,
                ports: (!ports.is_empty()).then_some(ports),
                ..Container::default()
            }
        })
        .collect();
    while containers.last().is_some_and(|c| c.ports.is_none()) {
        containers.pop();
    }
    containers.shrink_to_fit();
    containers
}

pub(super) fn is_named(port: &ContainerPort) -> bool {
    port.name.as_deref().is_some_and(|name| !name.is_empty())
}

/// Trims a Namespace to its name and labels.
pub fn trim_namespace(ns: &mut Namespace) {
    let meta = std::mem::take(&mut ns.metadata);
    ns.metadata = ObjectMeta {
        name: meta.name,
        labels: meta.labels,
        ..ObjectMeta::default()
    };
    ns.spec = None;
    ns.status = None;
}

/// Trims a NetworkPolicy to its name, namespace and spec (annotations such as
/// `kubectl.kubernetes.io/last-applied-configuration` often double its size).
pub fn trim_network_policy(np: &mut NetworkPolicy) {
    let meta = std::mem::take(&mut np.metadata);
    np.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        ..ObjectMeta::default()
    };
}
