//! The objects a scenario's cluster is made of on a real cluster: its namespaces, one pod per
//! scenario pod (agnhost, one container per served port, as upstream's suite builds them) and,
//! for `target: service`, one ClusterIP Service per pod. Pure: no I/O.
//!
//! Services have no selector; their EndpointSlices, one per family, name the pod's address
//! directly. A selector would need a label of ours on the pod, and the pod's labels must be
//! exactly the scenario's (a policy's `matchExpressions` may look at any of them).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Namespace, Pod as KubePod, PodSpec, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::{Names, RUN_LABEL, SCENARIO_LABEL};
use crate::scenario::{Labels, Pod, PortDecl, Protocol, NAMESPACE_NAME_LABEL};

/// A namespace of the scenario with its labels as written, plus the run's and scenario's.
pub fn namespace(names: &Names, run: &str, ns: &str, labels: &Labels) -> Namespace {
    let mut all: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, _)| k.as_str() != NAMESPACE_NAME_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    all.insert(RUN_LABEL.into(), run.into());
    all.insert(SCENARIO_LABEL.into(), names.suffix.clone());
    Namespace {
        metadata: ObjectMeta {
            name: Some(names.ns(ns)),
            labels: Some(all),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The label patch that makes a namespace's labels the scenario's `labels` (keys the
/// scenario dropped removed, ours and the API server's name label kept).
pub fn namespace_labels_patch(
    names: &Names,
    run: &str,
    before: &Labels,
    after: &Labels,
) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    for k in before.keys() {
        if k != NAMESPACE_NAME_LABEL && !after.contains_key(k) {
            labels.insert(k.clone(), serde_json::Value::Null);
        }
    }
    for (k, v) in after {
        if k != NAMESPACE_NAME_LABEL {
            labels.insert(k.clone(), v.clone().into());
        }
    }
    labels.insert(RUN_LABEL.into(), run.into());
    labels.insert(SCENARIO_LABEL.into(), names.suffix.clone().into());
    serde_json::json!({ "metadata": { "labels": labels } })
}

/// The label patch for a pod: exactly the scenario's labels afterwards.
pub fn pod_labels_patch(before: &Labels, after: &Labels) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    for k in before.keys() {
        if !after.contains_key(k) {
            labels.insert(k.clone(), serde_json::Value::Null);
        }
    }
    for (k, v) in after {
        labels.insert(k.clone(), v.clone().into());
    }
    serde_json::json!({ "metadata": { "labels": labels } })
}

/// The container serving one port, named as upstream names them.
fn server(port: u16, protocol: Protocol, name: Option<&str>) -> Container {
    let proto = protocol.as_str().to_ascii_lowercase();
    let (args, env) = match protocol {
        Protocol::Tcp | Protocol::Udp => (
            vec![
                "serve-hostname".to_string(),
                format!("--{proto}"),
                "--http=false".into(),
                "--port".into(),
                port.to_string(),
            ],
            None,
        ),
        // agnhost's porter serves SCTP on every SERVE_SCTP_PORT_<n>.
        Protocol::Sctp => (
            vec!["porter".to_string()],
            Some(vec![EnvVar {
                name: format!("SERVE_SCTP_PORT_{port}"),
                value: Some("foo".into()),
                ..Default::default()
            }]),
        ),
    };
    Container {
        name: format!("cont-{port}-{proto}"),
        command: Some(vec!["/agnhost".into()]),
        args: Some(args),
        env,
        ports: Some(vec![ContainerPort {
            container_port: port.into(),
            protocol: Some(protocol.as_str().into()),
            name: name.map(str::to_string),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The ports of `pod` the cluster carries (SCTP ones only with `sctp`).
pub fn served(pod: &Pod, sctp: bool) -> impl Iterator<Item = &PortDecl> {
    pod.ports
        .iter()
        .filter(move |p| sctp || p.protocol != Protocol::Sctp)
}

/// The container probes are run from: every pod has it, whatever it serves.
pub const PROBER: &str = "prober";

/// A scenario pod: one server container per port the cluster offers (SCTP ones only with
/// `sctp`), and the prober (`agnhost pause`), pinned to `node` when given.
pub fn pod(names: &Names, pod: &Pod, image: &str, node: Option<&str>, sctp: bool) -> KubePod {
    let mut containers = vec![Container {
        name: PROBER.into(),
        image: Some(image.into()),
        command: Some(vec!["/agnhost".into()]),
        args: Some(vec!["pause".into()]),
        ..Default::default()
    }];
    for p in served(pod, sctp) {
        let mut c = server(p.port, p.protocol, p.name.as_deref());
        c.image = Some(image.into());
        containers.push(c);
    }
    KubePod {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(names.ns(&pod.namespace)),
            labels: Some(pod.labels.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            node_selector: node
                .map(|n| BTreeMap::from([("kubernetes.io/hostname".to_string(), n.to_string())])),
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service of a pod (a DNS label: `s-` and the pod's name, dots made dashes, cut with a
/// hash when long).
pub fn service_name(pod: &str) -> String {
    let name = format!("s-{}", pod.replace('.', "-"));
    if name.len() <= 63 {
        return name;
    }
    let hash = pod
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .to_string();
    let keep = 63 - 1 - 8;
    format!("{}-{}", name[..keep].trim_end_matches('-'), &hash[..8])
}

fn port_name(port: u16, protocol: Protocol) -> String {
    format!("p-{}-{port}", protocol.as_str().to_ascii_lowercase())
}

/// The pod's Service: its ports (SCTP only with `sctp`), no selector, both families when the
/// cluster has two.
pub fn service(names: &Names, pod: &Pod, dual: bool, sctp: bool) -> Service {
    let ports = served(pod, sctp)
        .map(|p| ServicePort {
            name: Some(port_name(p.port, p.protocol)),
            port: p.port.into(),
            protocol: Some(p.protocol.as_str().into()),
            target_port: Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p.port.into()),
            ),
            ..Default::default()
        })
        .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&pod.name)),
            namespace: Some(names.ns(&pod.namespace)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(ports),
            ip_family_policy: Some(
                if dual {
                    "PreferDualStack"
                } else {
                    "SingleStack"
                }
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The EndpointSlice of the pod's Service for the family of `addr`.
pub fn endpoint_slice(
    names: &Names,
    pod: &Pod,
    addr: IpAddr,
    node: Option<&str>,
    sctp: bool,
) -> EndpointSlice {
    let svc = service_name(&pod.name);
    let family = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
    let ports = served(pod, sctp)
        .map(|p| EndpointPort {
            name: Some(port_name(p.port, p.protocol)),
            port: Some(p.port.into()),
            protocol: Some(p.protocol.as_str().into()),
            ..Default::default()
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{svc}-{}", family.to_ascii_lowercase())),
            namespace: Some(names.ns(&pod.namespace)),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_string(), svc),
                (
                    "endpointslice.kubernetes.io/managed-by".to_string(),
                    "netpol-e2e.io".to_string(),
                ),
            ])),
            ..Default::default()
        },
        address_type: family.into(),
        endpoints: vec![Endpoint {
            addresses: vec![addr.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: node.map(str::to_string),
            ..Default::default()
        }],
        ports: Some(ports),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scenario() -> crate::scenario::Scenario {
        crate::scenario::parse(
            "name: t\nnamespaces: {x: {ns: x}}\npods:\n  x/a: {labels: {pod: a}, ports: [{name: web, port: 80}, {port: 53, protocol: UDP}, {port: 9003, protocol: SCTP}]}\nprobe: {combinations: [TCP/80]}\nsteps: [{expect: {'*': {}}}]\n",
            Path::new("t.yaml"),
        )
        .unwrap()
    }

    #[test]
    fn a_pod_serves_what_the_scenario_says_and_carries_only_its_labels() {
        let s = scenario();
        let names = Names::new(&s, "abcde").unwrap();
        let p = &s.initial.pods["x/a"];
        let k = pod(&names, p, "img", Some("node-1"), true);
        assert_eq!(k.metadata.namespace.as_deref(), Some("x-abcde"));
        assert_eq!(
            k.metadata.labels.as_ref().unwrap(),
            &Labels::from([("pod".to_string(), "a".to_string())])
        );
        let spec = k.spec.unwrap();
        let names_of: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names_of,
            ["prober", "cont-80-tcp", "cont-53-udp", "cont-9003-sctp"]
        );
        let web = &spec.containers[1];
        assert_eq!(
            web.ports.as_ref().unwrap()[0].name.as_deref(),
            Some("web"),
            "named ports keep their names: policies may name them"
        );
        assert_eq!(
            web.args.as_ref().unwrap(),
            &["serve-hostname", "--tcp", "--http=false", "--port", "80"]
        );
        assert_eq!(
            spec.node_selector.unwrap()["kubernetes.io/hostname"],
            "node-1"
        );
        let without_sctp = pod(&names, p, "img", None, false);
        assert_eq!(without_sctp.spec.unwrap().containers.len(), 3);
    }

    #[test]
    fn services_and_slices_match_by_name_and_port() {
        let s = scenario();
        let names = Names::new(&s, "abcde").unwrap();
        let p = &s.initial.pods["x/a"];
        let svc = service(&names, p, true, false);
        let slice = endpoint_slice(&names, p, "10.0.0.5".parse().unwrap(), None, false);
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"],
            svc.metadata.name.clone().unwrap()
        );
        let svc_ports: Vec<_> = svc
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.name.clone())
            .collect();
        let slice_ports: Vec<_> = slice
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.name.clone())
            .collect();
        assert_eq!(svc_ports, slice_ports);
        assert_eq!(svc_ports.len(), 2, "SCTP left out");
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(
            svc.spec.unwrap().ip_family_policy.as_deref(),
            Some("PreferDualStack")
        );
    }

    #[test]
    fn service_names_are_dns_labels() {
        assert_eq!(service_name("harry-potter-0"), "s-harry-potter-0");
        assert_eq!(service_name("a.b"), "s-a-b");
        let long = service_name(&"p".repeat(80));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, service_name(&"p".repeat(81)));
    }

    #[test]
    fn label_patches_remove_what_the_scenario_dropped() {
        let s = scenario();
        let names = Names::new(&s, "abcde").unwrap();
        let before = Labels::from([
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]);
        let after = Labels::from([("b".to_string(), "3".to_string())]);
        let p = pod_labels_patch(&before, &after);
        assert_eq!(p["metadata"]["labels"]["a"], serde_json::Value::Null);
        assert_eq!(p["metadata"]["labels"]["b"], "3");
        let n = namespace_labels_patch(&names, "run1", &before, &after);
        assert_eq!(n["metadata"]["labels"][SCENARIO_LABEL], "abcde");
        assert_eq!(n["metadata"]["labels"][RUN_LABEL], "run1");
    }
}
