//! The startup taint (`FELIX_STARTUPTAINT`): a node registers with a `NoSchedule` taint of
//! this key (kubelet's `--register-with-taints`, a node pool's startup taints), so the
//! scheduler places no ordinary pod there; once this node's agent is ready (datastore in sync,
//! its rules applied), it removes every taint of that key from its own Node, and pods arrive
//! on a node whose policies are already enforced. Without it, a node that joins a running
//! cluster is Ready as soon as its CNI is, and the first pods scheduled there run unpoliced
//! until the agent's pod has started and applied (docs/install.md, "New nodes").
//!
//! What it guarantees:
//! - it never removes the taint before the readiness it is given says ready, and it touches
//!   nothing of the Node but that key's taints: the removal is a merge patch carrying the
//!   `resourceVersion` it read, so a concurrent change of the node (another taint added, a
//!   label) makes the API server refuse it (409) instead of being overwritten; the node is
//!   read again and the removal retried;
//! - each failure (403 without the RBAC of deploy/components/startup-taint, a missing node,
//!   an unreachable API server) is logged with its reason and retried with
//!   `backoff::Policy::STARTUP_TAINT`, while `report(true)` keeps
//!   `netpol_startup_taint_pending` at 1 for the alert; nothing else of the agent waits on it;
//! - one removal per start: a taint someone adds again later is theirs (felix's peers that
//!   use a startup taint, Cilium's `agent-not-ready`, behave the same).
//!
//! Cost: one GET of this node (and one PATCH when the taint is there) per agent start; no
//! watch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::KubeConnect;
use crate::backoff::{Backoff, Policy};

/// How often readiness is looked at while the agent is not ready yet (in-process, free).
const READY_POLL: Duration = Duration::from_millis(200);

/// The taints of `taints` without those of `key` (any value and effect); `None` when there
/// are none of that key (nothing to do).
pub fn without(taints: &[Taint], key: &str) -> Option<Vec<Taint>> {
    let rest: Vec<Taint> = taints.iter().filter(|t| t.key != key).cloned().collect();
    (rest.len() != taints.len()).then_some(rest)
}

/// The merge patch removing `key`'s taints from a node read at `resource_version`: the rest
/// of the taints (a merge patch replaces a list whole; `null` removes the field), and the
/// resource version, which makes the API server refuse the patch (409) if the node changed
/// since it was read. `None` when the node has no taint of `key`.
pub fn removal(node: &Node, key: &str) -> Option<serde_json::Value> {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let rest = without(taints, key)?;
    let rest = if rest.is_empty() {
        serde_json::Value::Null
    } else {
        json!(rest)
    };
    Some(json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": rest},
    }))
}

/// Starts the remover on its own thread: builds the client now (an `Err` means no usable
/// configuration), then waits for `ready()`, removes `key`'s taints from node `node_name` and
/// ends; `report(pending)` is called with `true` at once and `false` once the node carries no
/// such taint. Ends early, leaving the taint, when `stop` is set.
pub fn spawn(
    connect: KubeConnect,
    node_name: String,
    key: String,
    ready: impl Fn() -> bool + Send + 'static,
    report: impl Fn(bool) + Send + 'static,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the startup taint's runtime")?;
    let client = runtime.block_on(super::client(connect, Policy::KUBE_WATCH))?;
    report(true);
    std::thread::Builder::new()
        .name("startup-taint".into())
        .spawn(move || {
            runtime.block_on(remove(
                Api::<Node>::all(client),
                &node_name,
                &key,
                ready,
                report,
                &stop,
            ))
        })
        .context("cannot start the startup taint's thread")
}

async fn remove(
    nodes: Api<Node>,
    node_name: &str,
    key: &str,
    ready: impl Fn() -> bool,
    report: impl Fn(bool),
    stop: &AtomicBool,
) {
    let started = Instant::now();
    while !ready() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    let mut backoff = Backoff::new(Policy::STARTUP_TAINT);
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match try_remove(&nodes, node_name, key).await {
            Ok(true) => {
                info!(
                    node = node_name,
                    taint = key,
                    after_secs = started.elapsed().as_secs_f64(),
                    "ready: startup taint removed, pods may be scheduled here"
                );
                report(false);
                return;
            }
            Ok(false) => {
                info!(
                    node = node_name,
                    taint = key,
                    "ready; the node has no startup taint (it did not register with one, or it was removed)"
                );
                report(false);
                return;
            }
            Err(e) => {
                let wait = backoff.next_wait().unwrap_or(Duration::from_secs(30));
                warn!(
                    node = node_name,
                    taint = key,
                    retry_in_secs = wait.as_secs_f64(),
                    "cannot remove the startup taint, so no new pod is scheduled on this node: {e:#}"
                );
                let deadline = Instant::now() + wait;
                while Instant::now() < deadline {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    tokio::time::sleep(READY_POLL.min(wait)).await;
                }
            }
        }
    }
}

/// One read and, when the taint is there, one patch: `Ok(true)` removed, `Ok(false)` none
/// there.
async fn try_remove(nodes: &Api<Node>, node_name: &str, key: &str) -> anyhow::Result<bool> {
    let node = nodes
        .get(node_name)
        .await
        .with_context(|| format!("reading node {node_name}"))?;
    let Some(patch) = removal(&node, key) else {
        return Ok(false);
    };
    nodes
        .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching node {node_name} (a 409 means it changed meanwhile)"))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    fn node(taints: Option<Vec<Taint>>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints,
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    const KEY: &str = "netpol-agent.io/agent-not-ready";

    #[test]
    fn only_the_key_goes_and_the_rest_stays_in_order() {
        let n = node(Some(vec![
            taint("a/b", "NoSchedule"),
            taint(KEY, "NoSchedule"),
            taint("c", "NoExecute"),
            taint(KEY, "NoExecute"),
        ]));
        let patch = removal(&n, KEY).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let keys: Vec<&str> = patch["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["a/b", "c"]);
        assert_eq!(patch["spec"]["taints"][1]["effect"], "NoExecute");
    }

    #[test]
    fn the_last_taint_removes_the_field() {
        let patch = removal(&node(Some(vec![taint(KEY, "NoSchedule")])), KEY).unwrap();
        assert!(patch["spec"]["taints"].is_null());
        assert!(patch["spec"].as_object().unwrap().contains_key("taints"));
    }

    #[test]
    fn nothing_to_do_without_the_key() {
        assert!(removal(&node(None), KEY).is_none());
        assert!(removal(&node(Some(vec![])), KEY).is_none());
        // A key that only starts the same is another key.
        assert!(removal(
            &node(Some(vec![taint(
                "netpol-agent.io/agent-not-ready-x",
                "NoSchedule"
            )])),
            KEY
        )
        .is_none());
        assert!(removal(&Node::default(), KEY).is_none());
    }
}
