//! The real cluster's API, as `run --kubeconfig` uses it: what the user may do, which nodes
//! take pods, which families and protocols the pod network offers, the objects a scenario
//! makes (and only those deleted again), and the probes, run in the client pod with
//! `agnhost connect` over exec as upstream's suite runs them. All I/O of the real-cluster
//! runner is here; what it writes comes from `objects` and `names`.
//!
//! Ownership: a namespace is ours only once *our* create of it succeeded; one that exists
//! already is never written to or deleted. Cluster policies likewise. [`Created`] is that
//! record, and cleanup deletes exactly what it holds.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod as KubePod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{
    Api, AttachParams, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use tokio::io::AsyncReadExt;

use super::names::RUN_LABEL;
use crate::expect::{Outcome, Protocol};

const MANAGER: &str = "netpol-e2e";

pub fn cnp_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "policy.networking.k8s.io",
            "v1alpha2",
            "ClusterNetworkPolicy",
        ),
        "clusternetworkpolicies",
    )
}

/// What this run made and must delete.
#[derive(Default)]
pub struct Created {
    pub namespaces: BTreeSet<String>,
    pub cluster_policies: BTreeSet<String>,
}

/// One node's agent pod, as `--check-explain` and `--check-flow-logs` reach it.
#[derive(Clone, Debug)]
pub struct AgentPod {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Its health server (and flows API) port on the node's loopback.
    pub health_port: u16,
}

pub struct RealCluster {
    pub client: Client,
    /// The run's id ([`RUN_LABEL`]'s value): cleanup deletes only what carries it.
    pub run: String,
    pub created: Mutex<Created>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub async fn connect(kubeconfig: &std::path::Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("{}", kubeconfig.display()))?;
    let client = Client::try_from(config)?;
    client
        .apiserver_version()
        .await
        .context("the API server does not answer")?;
    Ok(client)
}

/// The permissions a run needs, as `(verb, group, resource, subresource)`.
pub fn needed(
    cluster_policies: bool,
    agents: bool,
) -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    let mut out = vec![
        ("create", "", "namespaces", ""),
        ("get", "", "namespaces", ""),
        ("delete", "", "namespaces", ""),
        ("patch", "", "namespaces", ""),
        ("create", "", "pods", ""),
        ("get", "", "pods", ""),
        ("patch", "", "pods", ""),
        ("delete", "", "pods", ""),
        // Exec over websockets is a GET that the API server also authorizes as a create.
        ("create", "", "pods", "exec"),
        ("get", "", "pods", "exec"),
        ("create", "", "services", ""),
        ("get", "", "services", ""),
        ("delete", "", "services", ""),
        ("create", "discovery.k8s.io", "endpointslices", ""),
        ("delete", "discovery.k8s.io", "endpointslices", ""),
        ("patch", "networking.k8s.io", "networkpolicies", ""),
        ("delete", "networking.k8s.io", "networkpolicies", ""),
        ("list", "", "nodes", ""),
    ];
    if agents {
        // Finding the agent's pods in whatever namespace it was installed to.
        out.push(("list", "", "pods", ""));
    }
    if cluster_policies {
        for verb in ["get", "patch", "delete"] {
            out.push((
                verb,
                "policy.networking.k8s.io",
                "clusternetworkpolicies",
                "",
            ));
        }
    }
    out
}

/// Each needed permission the user lacks, in words (`create namespaces`).
pub async fn missing_permissions(
    client: &Client,
    cluster_policies: bool,
    agents: bool,
) -> anyhow::Result<Vec<String>> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for (verb, group, resource, sub) in needed(cluster_policies, agents) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: (!sub.is_empty()).then(|| sub.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .context("asking the API server what this user may do (SelfSubjectAccessReview)")?;
        if !answer.status.is_some_and(|s| s.allowed) {
            let what = if sub.is_empty() {
                resource.to_string()
            } else {
                format!("{resource}/{sub}")
            };
            let group = if group.is_empty() {
                String::new()
            } else {
                format!(" ({group})")
            };
            missing.push(format!("{verb} {what}{group}"));
        }
    }
    Ok(missing)
}

/// Whether the API server serves ClusterNetworkPolicy.
pub async fn serves_cluster_policies(client: &Client) -> bool {
    client
        .list_api_group_resources("policy.networking.k8s.io/v1alpha2")
        .await
        .is_ok_and(|l| {
            l.resources
                .iter()
                .any(|r| r.name == "clusternetworkpolicies")
        })
}

/// Nodes that take ordinary pods: Ready, schedulable, no NoSchedule/NoExecute taint.
pub async fn schedulable_nodes(client: &Client) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = Vec::new();
    for n in nodes.list(&ListParams::default()).await?.items {
        let spec = n.spec.clone().unwrap_or_default();
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let tainted = spec
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
        if ready && !spec.unschedulable.unwrap_or(false) && !tainted {
            out.push(n.metadata.name.unwrap_or_default());
        }
    }
    out.sort();
    Ok(out)
}

impl RealCluster {
    pub fn new(client: Client, run: &str) -> RealCluster {
        RealCluster {
            client,
            run: run.to_string(),
            created: Mutex::new(Created::default()),
        }
    }

    /// Creates a namespace; one that exists already is not ours and stops the scenario.
    pub async fn create_namespace(&self, ns: &Namespace) -> anyhow::Result<()> {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let api: Api<Namespace> = Api::all(self.client.clone());
        // Recorded before the request: a run interrupted while it is in flight still removes
        // the namespace (cleanup checks the run label before it deletes anything).
        self.created
            .lock()
            .expect("not poisoned")
            .namespaces
            .insert(name.clone());
        match api.create(&PostParams::default(), ns).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.created
                    .lock()
                    .expect("not poisoned")
                    .namespaces
                    .remove(&name);
                if is_conflict(&e) {
                    bail!("namespace {name} exists already and is not this run's: left alone")
                }
                Err(e).with_context(|| format!("creating namespace {name}"))
            }
        }
    }

    fn ours(&self, ns: &str) -> anyhow::Result<()> {
        if self
            .created
            .lock()
            .expect("not poisoned")
            .namespaces
            .contains(ns)
        {
            Ok(())
        } else {
            bail!("namespace {ns} is not one this run made")
        }
    }

    pub async fn patch_namespace(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> anyhow::Result<()> {
        self.ours(name)?;
        let api: Api<Namespace> = Api::all(self.client.clone());
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("labelling namespace {name}"))?;
        Ok(())
    }

    /// Deletes a namespace this run made (at once: its pods have no grace period).
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<()> {
        self.ours(name)?;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let Some(found) = api.get_opt(name).await? else {
            return Ok(());
        };
        let label = found
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(RUN_LABEL));
        if label != Some(&self.run) {
            bail!(
                "namespace {name} does not carry {RUN_LABEL}={}: left alone",
                self.run
            );
        }
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting namespace {name}")),
        }
    }

    /// Waits until a namespace this run deleted is gone.
    pub async fn wait_namespace_gone(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let deadline = Instant::now() + timeout;
        while api.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                bail!(
                    "namespace {name} still terminating {} s after its deletion",
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }

    pub async fn create<K>(&self, obj: &K) -> anyhow::Result<()>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let ns = obj.meta().namespace.clone().unwrap_or_default();
        self.ours(&ns)?;
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        api.create(&PostParams::default(), obj)
            .await
            .with_context(|| {
                format!(
                    "creating {} {ns}/{}",
                    K::kind(&()),
                    obj.meta().name.clone().unwrap_or_default()
                )
            })?;
        Ok(())
    }

    pub async fn delete<K>(&self, ns: &str, name: &str) -> anyhow::Result<()>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        self.ours(ns)?;
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {} {ns}/{name}", K::kind(&()))),
        }
    }

    /// Waits until a pod is gone (a pod made again under the same name must be a new pod).
    pub async fn wait_pod_gone(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), ns);
        let deadline = Instant::now() + timeout;
        while api.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                bail!(
                    "pod {ns}/{name} is still there {} s after its deletion",
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    pub async fn patch_pod(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> anyhow::Result<()> {
        self.ours(ns)?;
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), ns);
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("labelling pod {ns}/{name}"))?;
        Ok(())
    }

    /// Waits until the pod runs with every container ready; returns its addresses and node.
    /// A pod that cannot start (its image, a crashing container) fails at once, saying why.
    pub async fn wait_pod_ready(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<(Vec<IpAddr>, String)> {
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), ns);
        let deadline = Instant::now() + timeout;
        loop {
            let pod = api.get(name).await?;
            let status = pod.status.clone().unwrap_or_default();
            let statuses = status.container_statuses.clone().unwrap_or_default();
            for c in &statuses {
                let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
                if let Some(w) = waiting {
                    let reason = w.reason.clone().unwrap_or_default();
                    if matches!(
                        reason.as_str(),
                        "ErrImagePull"
                            | "ImagePullBackOff"
                            | "InvalidImageName"
                            | "CrashLoopBackOff"
                            | "CreateContainerError"
                    ) {
                        bail!(
                            "pod {ns}/{name}, container {}: {reason}: {}",
                            c.name,
                            w.message.clone().unwrap_or_default()
                        );
                    }
                }
            }
            let ready = status.phase.as_deref() == Some("Running")
                && !statuses.is_empty()
                && statuses.iter().all(|c| c.ready);
            let ips: Vec<IpAddr> = status
                .pod_ips
                .unwrap_or_default()
                .iter()
                .filter_map(|p| p.ip.parse().ok())
                .collect();
            if ready && !ips.is_empty() {
                let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                return Ok((ips, node));
            }
            if Instant::now() > deadline {
                let why = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .filter(|c| c.status != "True")
                    .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join("; ");
                bail!(
                    "pod {ns}/{name} not ready after {} s (phase {}; {why})",
                    timeout.as_secs(),
                    status.phase.unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The ClusterIPs of a Service.
    pub async fn cluster_ips(&self, ns: &str, name: &str) -> anyhow::Result<Vec<IpAddr>> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let svc = api.get(name).await?;
        Ok(svc
            .spec
            .and_then(|s| s.cluster_ips)
            .unwrap_or_default()
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect())
    }

    /// Replaces an EndpointSlice (a pod made again has a new address).
    pub async fn put_slice(&self, slice: &EndpointSlice) -> anyhow::Result<()> {
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.delete::<EndpointSlice>(&ns, &name).await?;
        self.create(slice).await
    }

    /// Server-side applies a NetworkPolicy into one of this run's namespaces.
    pub async fn apply_network_policy(&self, doc: &serde_json::Value) -> anyhow::Result<()> {
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = doc["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.ours(&ns)?;
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), &ns);
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("applying NetworkPolicy {ns}/{name}"))?;
        Ok(())
    }

    pub async fn apply_cluster_policy(&self, doc: &serde_json::Value) -> anyhow::Result<()> {
        let name = doc["metadata"]["name"].as_str().unwrap_or("").to_string();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &cnp_resource());
        let known = self
            .created
            .lock()
            .expect("not poisoned")
            .cluster_policies
            .contains(&name);
        if !known && api.get_opt(&name).await?.is_some() {
            bail!("ClusterNetworkPolicy {name} exists already and is not this run's: left alone");
        }
        self.created
            .lock()
            .expect("not poisoned")
            .cluster_policies
            .insert(name.clone());
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("applying ClusterNetworkPolicy {name}"))?;
        Ok(())
    }

    pub async fn delete_cluster_policy(&self, name: &str) -> anyhow::Result<()> {
        if !self
            .created
            .lock()
            .expect("not poisoned")
            .cluster_policies
            .remove(name)
        {
            return Ok(());
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &cnp_resource());
        let Some(found) = api.get_opt(name).await? else {
            return Ok(());
        };
        if found
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(RUN_LABEL))
            != Some(&self.run)
        {
            bail!(
                "ClusterNetworkPolicy {name} does not carry {RUN_LABEL}={}: left alone",
                self.run
            );
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting ClusterNetworkPolicy {name}")),
        }
    }

    /// Deletes everything this run made (cluster policies first: they may isolate nothing
    /// else then) and waits, up to `timeout`, until the namespaces are gone. Returns what is
    /// still there.
    pub async fn clean_up(&self, timeout: Duration) -> Vec<String> {
        let (namespaces, policies) = {
            let c = self.created.lock().expect("not poisoned");
            (c.namespaces.clone(), c.cluster_policies.clone())
        };
        let mut left = Vec::new();
        for p in &policies {
            if let Err(e) = self.delete_cluster_policy(p).await {
                left.push(format!("ClusterNetworkPolicy {p} ({e:#})"));
            }
        }
        for ns in &namespaces {
            if let Err(e) = self.delete_namespace(ns).await {
                left.push(format!("namespace {ns} ({e:#})"));
            }
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let deadline = Instant::now() + timeout;
        let mut pending: Vec<String> = namespaces.into_iter().collect();
        while !pending.is_empty() && Instant::now() < deadline {
            let mut still = Vec::new();
            for ns in pending {
                if matches!(api.get_opt(&ns).await, Ok(Some(_)) | Err(_)) {
                    still.push(ns);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        {
            let mut c = self.created.lock().expect("not poisoned");
            c.namespaces.retain(|n| pending.contains(n));
        }
        left.extend(
            pending
                .into_iter()
                .map(|n| format!("namespace {n} (still terminating)")),
        );
        left
    }

    /// Runs `argv` in `container` of a pod over exec, `stdin` written and closed first when
    /// given; returns what it wrote to stdout and stderr (its exit status is not reported
    /// apart: callers read what it printed).
    pub async fn exec_capture(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        argv: Vec<String>,
        stdin: Option<String>,
    ) -> anyhow::Result<(String, String)> {
        use tokio::io::AsyncWriteExt;
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), ns);
        let ap = AttachParams::default()
            .container(container)
            .stdout(true)
            .stderr(true)
            .stdin(stdin.is_some());
        let mut proc = api.exec(pod, argv, &ap).await?;
        let mut out = String::new();
        let mut err = String::new();
        let input = proc.stdin();
        let stdout = proc.stdout();
        let stderr = proc.stderr();
        let write_in = async {
            if let (Some(mut w), Some(text)) = (input, stdin) {
                w.write_all(text.as_bytes()).await?;
                w.shutdown().await?;
            }
            anyhow::Ok(())
        };
        let read_out = async {
            if let Some(mut o) = stdout {
                o.read_to_string(&mut out).await?;
            }
            anyhow::Ok(())
        };
        let read_err = async {
            if let Some(mut e) = stderr {
                e.read_to_string(&mut err).await?;
            }
            anyhow::Ok(())
        };
        let (w, a, b) = tokio::join!(write_in, read_out, read_err);
        w?;
        a?;
        b?;
        proc.join().await?;
        Ok((out, err))
    }

    /// The ready agent pods by node, found by label.
    pub async fn agent_pods(
        &self,
        selector: &str,
    ) -> anyhow::Result<std::collections::BTreeMap<String, AgentPod>> {
        let api: Api<KubePod> = Api::all(self.client.clone());
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await
            .with_context(|| format!("listing the agent's pods ({selector})"))?;
        let mut out = std::collections::BTreeMap::new();
        for p in pods {
            let ready = p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            let (Some(node), Some(ns), Some(name), true) = (
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.metadata.namespace.clone(),
                p.metadata.name.clone(),
                ready,
            ) else {
                continue;
            };
            let containers = p.spec.map(|s| s.containers).unwrap_or_default();
            // The agent's container by the shipped name, else the pod's first.
            let Some(c) = containers
                .iter()
                .find(|c| c.name == "netpol-agent")
                .or(containers.first())
            else {
                continue;
            };
            // Its health server's port, as its environment sets it (felix's default else).
            let health_port = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "FELIX_HEALTHPORT")
                .and_then(|e| e.value.as_deref()?.trim().parse().ok())
                .unwrap_or(9099);
            out.insert(
                node,
                AgentPod {
                    namespace: ns,
                    pod: name,
                    container: c.name.clone(),
                    health_port,
                },
            );
        }
        Ok(out)
    }

    /// Probes from one client pod: one exec of a shell in its prober container that runs
    /// `agnhost connect` for every target at once and prints each one's exit status and the
    /// first word agnhost wrote (one exec per source pod and round: an exec per probe costs
    /// a runc exec each, which a small node cannot do hundreds of times a second). A refused
    /// or timed out connection is `Blocked`; a probe that could not run at all is
    /// `WrongPeer` (a harness fault, never counted as a policy's drop).
    pub async fn probe_batch(
        &self,
        ns: &str,
        pod: &str,
        targets: &[(IpAddr, u16, Protocol)],
        timeout: Duration,
    ) -> Vec<Outcome> {
        let script = format!(
            "for a in \"$@\"; do i=${{a%%,*}}; r=${{a#*,}}; p=${{r%%,*}}; d=${{r#*,}}; \
             ( e=$(/agnhost connect \"$d\" --timeout={}ms --protocol=\"$p\" 2>&1 >/dev/null); \
             echo \"$i $? ${{e%%[: ]*}}\" ) & done; wait",
            timeout.as_millis()
        );
        let mut argv = vec!["/bin/sh".to_string(), "-c".into(), script, "sh".into()];
        for (i, (addr, port, protocol)) in targets.iter().enumerate() {
            let dest = match addr {
                IpAddr::V4(a) => format!("{a}:{port}"),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            argv.push(format!(
                "{i},{},{dest}",
                protocol.as_str().to_ascii_lowercase()
            ));
        }
        let run = self.exec_capture(ns, pod, super::objects::PROBER, argv, None);
        let fail = |why: String| vec![Outcome::WrongPeer(why); targets.len()];
        match tokio::time::timeout(timeout + Duration::from_secs(30), run).await {
            Err(_) => fail("the probe's exec did not return".into()),
            Ok(Err(e)) => fail(format!("exec: {e:#}")),
            Ok(Ok((out, err))) => {
                let mut outcomes = vec![None; targets.len()];
                for line in out.lines() {
                    let mut words = line.split_whitespace();
                    let (Some(i), Some(code)) = (words.next(), words.next()) else {
                        continue;
                    };
                    let Some(slot) = i.parse::<usize>().ok().and_then(|i| outcomes.get_mut(i))
                    else {
                        continue;
                    };
                    let word = words.next().unwrap_or("");
                    *slot = Some(match (code, word) {
                        ("0", _) => Outcome::Connected,
                        (_, "TIMEOUT" | "REFUSED" | "OTHER") => Outcome::Blocked,
                        _ => Outcome::WrongPeer(format!("agnhost connect exited {code} {word}")),
                    });
                }
                outcomes
                    .into_iter()
                    .map(|o| {
                        o.unwrap_or_else(|| {
                            Outcome::WrongPeer(format!("no result from the prober: {}", err.trim()))
                        })
                    })
                    .collect()
            }
        }
    }
}
