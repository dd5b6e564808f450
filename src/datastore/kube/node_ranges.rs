//! This node's pod address ranges: its Node's `spec.podCIDRs` (`spec.podCIDR` before
//! dual-stack), which the controller-manager's node IPAM allocates and flannel, the CNI
//! `bridge`/`ptp` plugins with host-local IPAM and kubenet give pods their addresses from.
//! Read once at start while `FELIX_INTERFACENAMESCHEME=auto` has not seen how the node wires
//! pods: the pending guard (`rules::guard`) drops addresses in them that are no known pod, so
//! a pod wired before its address reaches the agent answers no one.
//!
//! What it guarantees: one GET of this node (RBAC `get nodes`, in deploy/base), bounded by
//! [`READ_TIMEOUT`]; every way it can come back empty (no RBAC, no such node, no range
//! allocated: CNIs with their own IPAM, Calico's blocks or a cloud VPC's subnets, an
//! unreachable API server) is an `Err` with the reason, for the caller to log; never one that
//! stops the agent. The Node's other fields are not kept.

use std::time::Duration;

use anyhow::Context;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::KubeConnect;
use crate::backoff::Policy;

/// How long start-up waits for the node at most.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The pod ranges `node` names, in its order; `Err` when it names none or one is not a CIDR.
pub fn ranges(node: &Node) -> Result<Vec<IpNet>, String> {
    let spec = node.spec.as_ref();
    let listed: Vec<&String> = match spec.and_then(|s| s.pod_cidrs.as_ref()) {
        Some(list) if !list.is_empty() => list.iter().collect(),
        _ => spec.and_then(|s| s.pod_cidr.as_ref()).into_iter().collect(),
    };
    if listed.is_empty() {
        return Err(
            "the Node has no spec.podCIDRs (its CNI allocates pod addresses itself)".into(),
        );
    }
    listed
        .into_iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|e| format!("the Node's pod range {s:?} is not a CIDR: {e}"))
        })
        .collect()
}

/// Reads node `name` from the API server and returns its pod ranges.
pub fn read(connect: KubeConnect, name: &str) -> Result<Vec<IpNet>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime to read the Node: {e}"))?;
    let got = runtime.block_on(async {
        tokio::time::timeout(READ_TIMEOUT, async {
            let client = super::client(connect, Policy::KUBE_WATCH).await?;
            Api::<Node>::all(client)
                .get(name)
                .await
                .with_context(|| format!("reading Node {name}"))
        })
        .await
    });
    match got {
        Err(_) => Err(format!(
            "reading Node {name} took more than {} s",
            READ_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Ok(Ok(node)) => ranges(&node),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(pod_cidr: Option<&str>, pod_cidrs: Option<&[&str]>) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidr: pod_cidr.map(str::to_string),
                pod_cidrs: pod_cidrs.map(|l| l.iter().map(|s| s.to_string()).collect()),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn dual_stack_list_first_then_the_single_field() {
        let both = node(
            Some("10.244.1.0/24"),
            Some(&["10.244.1.0/24", "fd00:10:244:1::/64"]),
        );
        assert_eq!(
            ranges(&both).unwrap(),
            vec![
                "10.244.1.0/24".parse::<IpNet>().unwrap(),
                "fd00:10:244:1::/64".parse().unwrap()
            ]
        );
        let old = node(Some("10.244.2.0/24"), None);
        assert_eq!(
            ranges(&old).unwrap(),
            vec!["10.244.2.0/24".parse::<IpNet>().unwrap()]
        );
        // An empty list is what a server that never set it returns too.
        let empty_list = node(Some("10.244.3.0/24"), Some(&[]));
        assert_eq!(ranges(&empty_list).unwrap().len(), 1);
    }

    #[test]
    fn none_or_garbage_is_a_reason_not_a_range() {
        assert!(ranges(&node(None, None))
            .unwrap_err()
            .contains("no spec.podCIDRs"));
        assert!(ranges(&Node::default()).is_err());
        let bad = ranges(&node(None, Some(&["10.244.1.0/24", "not-a-cidr"]))).unwrap_err();
        assert!(bad.contains("not-a-cidr"), "{bad}");
        // Host bits are cleared, as the API server would have refused them anyway.
        assert_eq!(
            ranges(&node(Some("10.244.1.7/24"), None)).unwrap(),
            vec!["10.244.1.0/24".parse::<IpNet>().unwrap()]
        );
    }
}
