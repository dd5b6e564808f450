//! The Kubernetes API datastore: Pods (all namespaces, remote ones feed the IP sets),
//! Namespaces and NetworkPolicies (all namespaces), and ClusterNetworkPolicies (their own
//! follower, `kube_cnp`: the CRD may be missing), listed and watched with
//! `kube::runtime::watcher`, turned into the same [`DatastoreEvent`]s as the directory source.
//!
//! # API
//!
//! ```no_run
//! # use std::sync::{atomic::AtomicBool, mpsc::channel, Arc};
//! use netpol_agent::datastore::kube::{spawn, KubeConnect};
//! use netpol_agent::model::DatastoreEvent;
//! let (tx, rx) = channel::<DatastoreEvent>();
//! let stop = Arc::new(AtomicBool::new(false));
//! let handle = spawn(KubeConnect::Infer, tx, stop.clone())?; // Err: no usable configuration
//! // ... rx.recv() → Upsert/Delete of the initial listing, one InSync, then changes ...
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! [`spawn`] (or [`spawn_with`] and [`KubeOptions`]) builds the client configuration and the
//! client synchronously, so that a missing or broken configuration comes back as an `Err`
//! with a message the daemon can print before it exits; [`KubeConnect::Infer`] is
//! `kube::Config::infer` (a kubeconfig from `KUBECONFIG` or `~/.kube/config`, else the pod's
//! in-cluster service account), [`KubeConnect::Url`] an explicit API server URL without
//! credentials (tests, `kubectl proxy`). Then a dedicated thread (`kube-datastore`) runs its
//! own single-threaded tokio runtime with the three watchers until `stop` is set (looked at
//! every 50 ms) or the receiver is dropped (noticed at the next event); the thread then
//! returns `Ok(())`. API errors (refused connections,
//! 5xx, 403 while RBAC is being fixed, expired resource versions) never end it: they are
//! logged with `tracing` and retried with kube-runtime's jittered exponential back-off (`backoff::Policy::KUBE_WATCH`: 0.8 s doubling to
//! 30 s, back to 0.8 s after two quiet minutes), and nothing already delivered is withdrawn
//! because of an error.
//!
//! # What it owns, and the guarantees
//!
//! One reflector store per kind (`kube::runtime::reflector::store`) holds exactly the trimmed
//! objects that were last delivered to the receiver, so it is both the cache and the record
//! of "what the graph has". The receiver gets:
//! - `Upsert` only when the trimmed form of an object differs from the one last delivered
//!   (a kubelet status heartbeat or a new resourceVersion alone is no event), `Delete` only
//!   for an object that was delivered;
//! - `InSync` exactly once, after the first complete listing of all four kinds has been
//!   delivered (a ClusterNetworkPolicy resource the API server does not serve counts as an
//!   empty listing). Every event before it belongs to that initial listing.
//!
//! Relists: the watcher relists on `410 Gone`: an `ERROR` event in the watch, an expired
//! `continue` token half way through a paginated list, and an HTTP 410 answering a watch
//! resumed from a compacted resource version (kube-runtime's watcher would retry that dead
//! version forever, so this module starts a fresh watcher instead). A relist never
//! removes anything on the way: while it runs (`Init`, `InitApply`…) the listed keys are
//! collected and only the objects whose trimmed form changed are buffered; at `InitDone`
//! the changed objects are upserted first, and then the objects that were delivered but are
//! no longer listed are deleted. A relist that finds the same objects emits nothing, and a
//! relist that is interrupted (a list page failing half way) is simply started over.
//! A watch that merely ends or drops its connection resumes from the last resource version
//! (bookmarks keep it fresh) without relisting.
//!
//! # Memory
//!
//! Every object is trimmed as it comes off the watch (the stream's `modify` step, before
//! comparison and before the store) to what the calc graph reads: see [`trim_pod`],
//! [`trim_namespace`], [`trim_network_policy`]. The trimmed object validates exactly as the
//! full one does (same result, same error field). A typical pod of a Deployment (two
//! containers with env, probes, resources and mounts, managed fields, an owner reference,
//! conditions and container statuses; 11 KB of JSON) holds about 53 KiB of heap as a
//! `k8s_openapi` `Pod` and 8 KiB trimmed (`tests/kube_trim_memory.rs` measures it with a
//! counting allocator). Most of what is left is the inline size of the `k8s_openapi` structs
//! themselves (a `Pod` is 2.1 KiB, each `Container` 2.1 KiB), so the same pod without named
//! ports is 3.6 KiB. 150k pods like the typical one take about 1.2 GB trimmed instead of 8 GB;
//! going further would need a store of our own compact type instead of `Pod`. The `Upsert`
//! sent to the receiver is one more clone of the trimmed object, dropped once the graph has
//! read it.
//!
//! Pods are not filtered by node: the graph decides which pods are local from
//! `spec.nodeName`, and every pod feeds the IP sets.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::kube::runtime::reflector::store::Writer;
use ::kube::runtime::reflector::{ObjectRef as StoreRef, Store};
use ::kube::runtime::utils::ResetTimerBackoff;
use ::kube::runtime::{watcher, WatchStreamExt};
use ::kube::{Api, Client, Resource};
use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use super::EventSink;
use crate::backoff::Policy;
use crate::model::validate::{namespaced_key, SANDBOX_ID_ANNOTATION};
use crate::model::{DatastoreEvent, K8sObject, ObjectKind, ObjectRef};

/// Pod annotations the graph reads; every other annotation is dropped on arrival.
pub const KEPT_POD_ANNOTATIONS: &[&str] = &[SANDBOX_ID_ANNOTATION];

/// How many kinds must be listed before `InSync`.
const KINDS: usize = 4;

/// How often the runtime looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Where the API server is.
#[derive(Clone, Debug)]
pub enum KubeConnect {
    /// `kube::Config::infer`: a kubeconfig (`KUBECONFIG`, else `~/.kube/config`), else the
    /// in-cluster service account (`KUBERNETES_SERVICE_HOST`, the mounted token and CA).
    Infer,
    /// An explicit URL (`http://127.0.0.1:8001`, `https://…`), no credentials.
    Url(String),
}

/// Tuning; [`Default`] is what the daemon uses.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// `limit` of each list page (`None`: one unpaginated list).
    pub page_size: Option<u32>,
    /// `timeoutSeconds` of each watch request (`None`: kube's 290 s).
    pub watch_timeout: Option<u32>,
    /// Retries after an API error (`backoff::Policy::KUBE_WATCH`: kube-runtime's
    /// `DefaultBackoff` numbers).
    pub backoff: Policy,
    /// An error this long after the previous one starts again from the first wait.
    pub backoff_reset: Duration,
    /// How often to look again for a ClusterNetworkPolicy resource the API server does not
    /// serve (its CRD not installed), see `kube_cnp`.
    pub missing_crd_recheck: Duration,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            page_size: Some(500),
            watch_timeout: None,
            backoff: Policy::KUBE_WATCH,
            backoff_reset: Policy::KUBE_WATCH_RESET,
            missing_crd_recheck: super::kube_cnp::MISSING_CRD_RECHECK,
        }
    }
}

/// Starts the Kubernetes datastore with the default options; see the module documentation.
pub fn spawn(
    connect: KubeConnect,
    tx: impl EventSink,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    spawn_with(connect, KubeOptions::default(), tx, stop)
}

/// Starts the Kubernetes datastore: builds the client now (an `Err` means no usable
/// configuration), then lists and watches on a dedicated thread until `stop` is set or `tx`'s
/// receiver is dropped.
pub fn spawn_with(
    connect: KubeConnect,
    options: KubeOptions,
    tx: impl EventSink,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the Kubernetes datastore's runtime")?;
    let client = runtime.block_on(client(connect))?;
    let handle = std::thread::Builder::new()
        .name("kube-datastore".into())
        .spawn(move || {
            runtime.block_on(run(client, options, tx, stop));
            Ok(())
        })
        .context("cannot start the Kubernetes datastore thread")?;
    Ok(handle)
}

async fn client(connect: KubeConnect) -> anyhow::Result<Client> {
    let config = match connect {
        KubeConnect::Infer => ::kube::Config::infer().await.context(
            "no Kubernetes API configuration: no kubeconfig (KUBECONFIG or ~/.kube/config) \
             and not running in a pod with a service account",
        )?,
        KubeConnect::Url(url) => {
            let uri: http::Uri = url
                .parse()
                .with_context(|| format!("invalid Kubernetes API URL {url:?}"))?;
            match uri.scheme_str() {
                Some("http" | "https") if uri.host().is_some() => {}
                _ => anyhow::bail!(
                    "invalid Kubernetes API URL {url:?}: it must be http:// or https:// and name a host"
                ),
            }
            ::kube::Config::new(uri)
        }
    };
    let cluster = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .with_context(|| format!("cannot build a Kubernetes client for {cluster}"))?;
    info!(api = %cluster, "Kubernetes datastore configured");
    Ok(client)
}

/// Where the watchers deliver; counts the kinds that finished their first listing.
pub(super) struct Out {
    tx: Box<dyn EventSink>,
    listed: AtomicUsize,
}

/// The receiver is gone: the datastore stops.
pub(super) struct Closed;

impl Out {
    pub(super) fn send(&self, event: DatastoreEvent) -> Result<(), Closed> {
        if self.tx.deliver(event) {
            Ok(())
        } else {
            Err(Closed)
        }
    }

    /// One kind delivered its first complete listing; the last of them sends `InSync`.
    pub(super) fn kind_listed(&self) -> Result<(), Closed> {
        if self.listed.fetch_add(1, Ordering::SeqCst) + 1 == KINDS {
            info!("Kubernetes datastore in sync");
            self.send(DatastoreEvent::InSync)?;
        }
        Ok(())
    }
}

async fn run(client: Client, options: KubeOptions, tx: impl EventSink, stop: Arc<AtomicBool>) {
    let out = Out {
        tx: Box::new(tx),
        listed: AtomicUsize::new(0),
    };
    // Each follower ends only when the receiver is gone; then all stop.
    tokio::select! {
        _ = follow::<Pod>(Api::all(client.clone()), &options, &out) => {}
        _ = follow::<Namespace>(Api::all(client.clone()), &options, &out) => {}
        _ = follow::<NetworkPolicy>(Api::all(client.clone()), &options, &out) => {}
        _ = super::kube_cnp::follow(Api::all(client), &options, &out) => {}
        () = stopped(&stop) => {}
    }
    info!("Kubernetes datastore stopped");
}

async fn stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(STOP_POLL).await;
    }
}

/// The kinds the datastore watches.
pub(super) trait Kind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + PartialEq + Send + Sync + 'static
{
    const KIND: ObjectKind;
    fn trim(&mut self);
    fn into_object(self) -> K8sObject;
    fn datastore_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: Self::KIND,
            key: namespaced_key(self.meta()).to_string(),
        }
    }
}

impl Kind for Pod {
    const KIND: ObjectKind = ObjectKind::Pod;
    fn trim(&mut self) {
        trim_pod(self)
    }
    fn into_object(self) -> K8sObject {
        K8sObject::Pod(self)
    }
}

impl Kind for Namespace {
    const KIND: ObjectKind = ObjectKind::Namespace;
    fn trim(&mut self) {
        trim_namespace(self)
    }
    fn into_object(self) -> K8sObject {
        K8sObject::Namespace(self)
    }
    fn datastore_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: ObjectKind::Namespace,
            key: self.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl Kind for NetworkPolicy {
    const KIND: ObjectKind = ObjectKind::NetworkPolicy;
    fn trim(&mut self) {
        trim_network_policy(self)
    }
    fn into_object(self) -> K8sObject {
        K8sObject::NetworkPolicy(self)
    }
}

/// Lists and watches one kind forever (errors are retried), delivering changes to `out`.
/// Returns only when the receiver is gone.
async fn follow<K: Kind>(api: Api<K>, options: &KubeOptions, out: &Out) -> Closed {
    let kind = K::KIND.as_str();
    let config = watcher::Config {
        page_size: options.page_size,
        timeout: options.watch_timeout,
        ..watcher::Config::default() // bookmarks on, consistent (most recent) lists
    };
    let mut mirror = Mirror::<K>::default();
    // kube-runtime's own back-off types, with our policy's numbers.
    let mut backoff = ResetTimerBackoff::new(
        watcher::ExponentialBackoff::from(options.backoff.builder()),
        options.backoff_reset,
    );
    let mut next_delay = move || backoff.next().unwrap_or(options.backoff.first);
    loop {
        let mut stream = watcher(api.clone(), config.clone()).modify(K::trim).boxed();
        let mut restart = false;
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    let (events, first_listing) = mirror.apply(event);
                    for event in events {
                        if let Err(closed) = out.send(event) {
                            return closed;
                        }
                    }
                    if first_listing {
                        if let Err(closed) = out.kind_listed() {
                            return closed;
                        }
                    }
                }
                Err(err) => {
                    // kube-runtime retries a watch that the server refused with HTTP 410 from
                    // the same dead resourceVersion forever: start over with a relist.
                    restart = matches!(
                        &err,
                        watcher::Error::WatchStartFailed(::kube::Error::Api(status))
                            if status.code == 410
                    );
                    let delay = next_delay();
                    if is_expired(&err) {
                        info!(
                            kind,
                            "resource version expired, relisting in {delay:?}: {err}"
                        );
                    } else {
                        warn!(kind, "Kubernetes API error, retrying in {delay:?}: {err}");
                    }
                    tokio::time::sleep(delay).await;
                    if restart {
                        break;
                    }
                }
            }
        }
        if !restart {
            // The watcher stream never ends by itself; if it ever does, start a new one.
            debug!(kind, "watch stream ended, restarting it");
            tokio::time::sleep(next_delay()).await;
        }
    }
}

pub(super) fn is_expired(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(::kube::Error::Api(status))
        | watcher::Error::InitialListFailed(::kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// The delivered state of one kind (a reflector store) and the relist in progress.
pub(super) struct Mirror<K: Kind> {
    writer: Writer<K>,
    store: Store<K>,
    relist: Option<Relist<K>>,
    listed: bool,
}

/// A relist in progress: every key listed so far, and the listed objects that differ from
/// what was delivered.
struct Relist<K: Kind> {
    seen: HashSet<StoreRef<K>>,
    changed: HashMap<StoreRef<K>, K>,
}

impl<K: Kind> Default for Relist<K> {
    fn default() -> Self {
        Relist {
            seen: HashSet::new(),
            changed: HashMap::new(),
        }
    }
}

impl<K: Kind> Default for Mirror<K> {
    fn default() -> Self {
        let writer = Writer::default();
        let store = writer.as_reader();
        Mirror {
            writer,
            store,
            relist: None,
            listed: false,
        }
    }
}

impl<K: Kind> Mirror<K> {
    /// Applies one (trimmed) watcher event; returns the datastore events to deliver, and
    /// whether this completed the first listing of the kind.
    pub(super) fn apply(&mut self, event: watcher::Event<K>) -> (Vec<DatastoreEvent>, bool) {
        match event {
            watcher::Event::Apply(obj) => {
                let key = StoreRef::from_obj(&obj);
                if self.store.get(&key).as_deref() == Some(&obj) {
                    return (Vec::new(), false);
                }
                let event = watcher::Event::Apply(obj);
                self.writer.apply_watcher_event(&event);
                let watcher::Event::Apply(obj) = event else {
                    unreachable!()
                };
                (vec![upsert(obj)], false)
            }
            watcher::Event::Delete(obj) => {
                let key = StoreRef::from_obj(&obj);
                if self.store.get(&key).is_none() {
                    return (Vec::new(), false);
                }
                let event = DatastoreEvent::Delete(obj.datastore_ref());
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(obj));
                (vec![event], false)
            }
            watcher::Event::Init => {
                // A relist interrupted half way is started over: what it buffered is stale.
                self.relist = Some(Relist::default());
                (Vec::new(), false)
            }
            watcher::Event::InitApply(obj) => {
                let relist = self.relist.get_or_insert_with(Relist::default);
                let key = StoreRef::from_obj(&obj);
                if self.store.get(&key).as_deref() == Some(&obj) {
                    relist.changed.remove(&key);
                } else {
                    relist.changed.insert(key.clone(), obj);
                }
                relist.seen.insert(key);
                (Vec::new(), false)
            }
            watcher::Event::InitDone => {
                let relist = self.relist.take().unwrap_or_default();
                let first_listing = !self.listed;
                if first_listing {
                    // Marks the store ready; it is empty, and the writer's own relist buffer
                    // is never used (the relist is diffed here instead).
                    self.writer.apply_watcher_event(&watcher::Event::Init);
                    self.writer.apply_watcher_event(&watcher::Event::InitDone);
                    self.listed = true;
                }
                let mut changed: Vec<K> = relist.changed.into_values().collect();
                changed.sort_by(|a, b| {
                    a.meta()
                        .namespace
                        .cmp(&b.meta().namespace)
                        .then(a.meta().name.cmp(&b.meta().name))
                });
                let mut gone: Vec<Arc<K>> = self
                    .store
                    .state()
                    .into_iter()
                    .filter(|obj| !relist.seen.contains(&StoreRef::from_obj(obj.as_ref())))
                    .collect();
                gone.sort_by(|a, b| {
                    a.meta()
                        .namespace
                        .cmp(&b.meta().namespace)
                        .then(a.meta().name.cmp(&b.meta().name))
                });
                info!(
                    kind = K::KIND.as_str(),
                    listed = relist.seen.len(),
                    changed = changed.len(),
                    gone = gone.len(),
                    "listed"
                );
                // Upserts first, deletions last: nothing is missing in between, even when an
                // object was replaced by another one with a new name.
                let mut events = Vec::with_capacity(changed.len() + gone.len());
                for obj in changed {
                    let event = watcher::Event::Apply(obj);
                    self.writer.apply_watcher_event(&event);
                    let watcher::Event::Apply(obj) = event else {
                        unreachable!()
                    };
                    events.push(upsert(obj));
                }
                for obj in gone {
                    events.push(DatastoreEvent::Delete(obj.datastore_ref()));
                    self.writer
                        .apply_watcher_event(&watcher::Event::Delete(K::clone(&obj)));
                }
                (events, first_listing)
            }
        }
    }
}

fn upsert<K: Kind>(obj: K) -> DatastoreEvent {
    DatastoreEvent::Upsert(Box::new(obj.into_object()))
}

// ---- trimming ----

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
fn trim_containers(containers: Vec<Container>) -> Vec<Container> {
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

fn is_named(port: &ContainerPort) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::validate;
    use serde_json::json;

    fn ns(name: &str, team: &str, rv: &str) -> Namespace {
        let mut ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"team": team}, "resourceVersion": rv,
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]}
        }))
        .unwrap();
        ns.trim();
        ns
    }

    fn summary(events: &[DatastoreEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                DatastoreEvent::Upsert(o) => format!("upsert {}", o.object_ref().key),
                DatastoreEvent::Delete(r) => format!("delete {}", r.key),
                DatastoreEvent::InSync => "in sync".into(),
            })
            .collect()
    }

    /// Feeds a sequence of watcher events; returns the delivered events and how many of the
    /// steps completed a first listing.
    fn run(
        mirror: &mut Mirror<Namespace>,
        events: Vec<watcher::Event<Namespace>>,
    ) -> (Vec<String>, usize) {
        let mut out = Vec::new();
        let mut firsts = 0;
        for e in events {
            let (events, first) = mirror.apply(e);
            out.extend(summary(&events));
            firsts += usize::from(first);
        }
        (out, firsts)
    }

    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    #[test]
    fn relists_deliver_only_differences_upserts_first() {
        let mut m = Mirror::<Namespace>::default();
        let (out, firsts) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "1")),
                InitApply(ns("b", "x", "2")),
                InitDone,
            ],
        );
        assert_eq!(out, ["upsert a", "upsert b"]);
        assert_eq!(firsts, 1);

        // The same objects (new resourceVersions): nothing, and no second first listing.
        let (out, firsts) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("b", "x", "7")),
                InitApply(ns("a", "x", "8")),
                InitDone,
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(firsts, 0);

        // b changed, a vanished, c is new: nothing until InitDone, then upserts, then deletes.
        let mut m2 = m;
        let (out, _) = run(
            &mut m2,
            vec![
                Init,
                InitApply(ns("b", "y", "9")),
                InitApply(ns("c", "x", "9")),
            ],
        );
        assert!(out.is_empty());
        let (out, _) = run(&mut m2, vec![InitDone]);
        assert_eq!(out, ["upsert b", "upsert c", "delete a"]);
        assert_eq!(m2.store.state().len(), 2);
    }

    #[test]
    fn an_interrupted_relist_starts_over() {
        let mut m = Mirror::<Namespace>::default();
        run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "x", "1")),
                InitApply(ns("b", "x", "1")),
                InitDone,
            ],
        );
        // A first attempt lists a changed `a` and then fails; the second lists the original.
        let (out, _) = run(
            &mut m,
            vec![
                Init,
                InitApply(ns("a", "changed", "2")),
                Init,
                InitApply(ns("a", "x", "3")),
                InitApply(ns("b", "x", "3")),
                InitDone,
            ],
        );
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn watch_events_deliver_changes_only() {
        let mut m = Mirror::<Namespace>::default();
        run(&mut m, vec![Init, InitDone]);
        let (out, _) = run(
            &mut m,
            vec![
                Apply(ns("a", "x", "1")),
                Apply(ns("a", "x", "2")), // only the resourceVersion: no event
                Apply(ns("a", "y", "3")),
                Delete(ns("zz", "x", "4")), // never delivered: no event
                Delete(ns("a", "y", "5")),
            ],
        );
        assert_eq!(out, ["upsert a", "upsert a", "delete a"]);
        assert!(m.store.state().is_empty());
    }

    #[test]
    fn trimmed_pods_keep_the_indexes_validation_errors_name() {
        let full: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n", "annotations": {"a": "b"}},
            "spec": {
                "nodeName": "node-1",
                "containers": [
                    {"name": "c0", "image": "i"},
                    {"name": "c1", "ports": [{"containerPort": 1}, {"containerPort": 2, "name": "Bad_Name"}, {"containerPort": 3}]},
                    {"name": "c2", "ports": [{"containerPort": 4}]}
                ],
                "initContainers": [{"name": "i0", "ports": [{"containerPort": 5}]}]
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}
        }))
        .unwrap();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        let err = validate::pod(&full).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].ports[1].name");
        assert_eq!(validate::pod(&trimmed), Err(err));
        let spec = trimmed.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers.len(),
            2,
            "c2 has no named port and comes last"
        );
        assert_eq!(spec.containers[1].ports.as_ref().unwrap().len(), 2);
        assert!(spec.init_containers.is_none());
        assert!(trimmed.metadata.annotations.is_none());

        // Trimming twice changes nothing.
        let mut again = trimmed.clone();
        trim_pod(&mut again);
        assert_eq!(again, trimmed);
    }
}
