//! The Kubernetes API datastore: Pods (all namespaces, remote ones feed the IP sets),
//! Namespaces and NetworkPolicies (all namespaces), and ClusterNetworkPolicies and the staged
//! kinds (their own follower, `cluster_policy`: the CRD may be missing), listed and watched with
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
//! let source = spawn(KubeConnect::Infer, tx, stop.clone())?; // Err: no usable configuration
//! // ... rx.recv() → Upsert/Delete of the initial listing, one InSync, then changes ...
//! let _ = source.stop(); // sets `stop`, wakes the thread and waits for it
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! [`spawn`] (or [`spawn_with`] and [`KubeOptions`]) builds the client configuration and the
//! client synchronously, so that a missing or broken configuration comes back as an `Err`
//! with a message the daemon can print before it exits; [`KubeConnect::Infer`] is
//! `kube::Config::infer` (a kubeconfig from `KUBECONFIG` or `~/.kube/config`, else the pod's
//! in-cluster service account), [`KubeConnect::Url`] an explicit API server URL without
//! credentials (tests, `kubectl proxy`). Then a dedicated thread (`kube-datastore`) runs its
//! own single-threaded tokio runtime with the three watchers until [`KubeThread::stop`] (at
//! once), `stop` set by anyone else (seen within [`STOP_POLL`]), or the receiver dropped
//! (noticed at the next event); the thread then returns `Ok(())`. API errors (refused
//! connections, 5xx, 403 while RBAC is being fixed, expired resource versions) never end it:
//! they are logged with `tracing` and retried with kube-runtime's jittered exponential
//! back-off (`backoff::Policy::KUBE_WATCH`: 0.8 s doubling to 30 s, back to 0.8 s after two
//! quiet minutes, or at the first error after the watcher ran
//! without one for as long as the wait before it: see [`Retry`]), and nothing already
//! delivered is withdrawn because of an error. Watch requests that follow each other within
//! the first wait (a watch the server or a proxy ends at once, which kube-runtime restarts
//! without telling us) are spaced by the same policy in the client (`watch_spacing`).
//!
//! # How it lists
//!
//! Each kind is listed with a streaming list (KEP-3157: a watch with `sendInitialEvents=true`
//! and `resourceVersionMatch=NotOlderThan`, ended by a bookmark annotated
//! `k8s.io/initial-events-end`) when the server offers it, else with paginated lists
//! ([`KubeOptions::page_size`] objects a page, a consistent read). A streaming list decodes one
//! object at a time where a page decodes 500 full objects at once, and the API server serves
//! it from its watch cache instead of encoding pages. [`InitialList::Auto`] (the default)
//! decides per kind, and says in the log which it uses and why:
//! - a server older than 1.27 (`/version`) never understood the parameter: paginated;
//! - a server that refuses the streaming watch (400 or 422, as one with the `WatchList`
//!   feature gate off does): paginated from then on;
//! - a server that ignores the parameter (a plain watch that ends without the end bookmark,
//!   so kube-runtime's watcher would start the same streaming list again forever): paginated
//!   from then on.
//!
//! kube-runtime 5 itself never falls back: it retries a refused streaming watch with back-off
//! forever, and restarts an ignored one at every watch timeout; hence the checks here.
//!
//! # What it owns, and the guarantees
//!
//! Per kind, a [`Mirror`] records what was last delivered to the receiver: for each object
//! its key and a fingerprint of its trimmed form (a 64-bit keyed SipHash of its JSON
//! encoding; keyed with a random seed per process, so nobody can craft a change that keeps
//! the fingerprint), plus the listing it was last seen in. It holds no objects: about 100
//! bytes per pod, where kube-runtime's reflector store of trimmed `Pod`s held kilobytes. The
//! receiver gets:
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
//! removes anything on the way: while it runs (`Init`, `InitApply`…) each listed object is
//! stamped as seen, and only the objects whose trimmed form changed are delivered (as they
//! come: the graph applies nothing before `InSync`, and after it a changed object is news
//! however it was learnt); at `InitDone` the objects that were delivered but were not seen in
//! this listing are deleted, after every upsert. A relist that finds the same objects emits
//! nothing, and a relist that is interrupted (a list page failing half way) is simply started
//! over: objects it already delivered are then either listed again or deleted at the end.
//! A watch that merely ends or drops its connection resumes from the last resource version
//! (bookmarks keep it fresh) without relisting.
//!
//! # Memory
//!
//! Every object is trimmed as it comes off the watch (the stream's `modify` step, before
//! comparison) to what the calc graph reads: see [`trim_pod`], [`trim_namespace`],
//! [`trim_network_policy`]. The trimmed object validates exactly as the full one does (same
//! result, same error field). A typical pod of a Deployment (two containers with env,
//! probes, resources and mounts, managed fields, an owner reference, conditions and
//! container statuses; 11 KB of JSON) holds about 53 KiB of heap as a `k8s_openapi` `Pod`
//! and 8 KiB trimmed (`tests/kube_trim_memory.rs` measures it with a counting allocator).
//! The trimmed object lives only until the graph has validated it into its own compact
//! `PodInfo` (it travels in the `Upsert`, moved, not cloned); what stays here is the
//! mirror's key and fingerprint. Transient memory is what one list page (or, streaming, one
//! event) decodes to.
//!
//! Pods are not filtered by node: the graph decides which pods are local from
//! `spec.nodeName`, and every pod feeds the IP sets.
//!
//! # More kinds
//!
//! A kind is a [`Kind`] impl (its trimming, its key, its `K8sObject` variant); [`follow`]
//! lists and watches any of them with the same mirror, list strategy, back-off and 410
//! handling, so adding one is an impl and a line in [`run`] (and `KINDS`).

pub mod cluster_policy;
mod mirror;
pub mod node_ranges;
pub mod startup_taint;
mod trim;
mod watch_spacing;

use mirror::*;
pub use trim::*;

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::kube::runtime::utils::{Backoff as _, ResetTimerBackoff};
use ::kube::runtime::{watcher, WatchStreamExt};
use ::kube::{Api, Client, Resource};
use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::EventSink;
use crate::backoff::Policy;
use crate::model::validate::{namespaced_key, SANDBOX_ID_ANNOTATION};
use crate::model::{
    ClusterNetworkPolicy, DatastoreEvent, K8sObject, ObjectKind, ObjectRef,
    StagedClusterNetworkPolicy, StagedNetworkPolicy,
};

/// Pod annotations the graph reads; every other annotation is dropped on arrival.
pub const KEPT_POD_ANNOTATIONS: &[&str] = &[SANDBOX_ID_ANNOTATION];

/// How many kinds must be listed before `InSync`.
const KINDS: usize = 6;

/// How often the runtime looks at the stop flag when nobody wakes it ([`KubeThread::stop`]
/// does). Only a fallback: the agent exits or re-executes itself after setting the flag, so
/// a short poll would only wake an idle node's thread for nothing (it was 50 ms: 20 wake-ups
/// a second at rest).
const STOP_POLL: Duration = Duration::from_secs(2);

/// The datastore's thread, and how to end it.
pub struct KubeThread {
    handle: std::thread::JoinHandle<anyhow::Result<()>>,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
}

impl KubeThread {
    /// Sets the stop flag, wakes the thread and waits for it to end.
    pub fn stop(self) -> std::thread::Result<anyhow::Result<()>> {
        self.stop.store(true, Ordering::SeqCst);
        // A permit is kept when the thread is not waiting yet: the wake is never lost.
        self.wake.notify_one();
        self.handle.join()
    }

    /// Waits for the thread to end by itself (its receiver dropped, its flag set).
    pub fn join(self) -> std::thread::Result<anyhow::Result<()>> {
        self.handle.join()
    }
}

/// Where the API server is.
#[derive(Clone, Debug)]
pub enum KubeConnect {
    /// `kube::Config::infer`: a kubeconfig (`KUBECONFIG`, else `~/.kube/config`), else the
    /// in-cluster service account (`KUBERNETES_SERVICE_HOST`, the mounted token and CA).
    Infer,
    /// An explicit URL (`http://127.0.0.1:8001`, `https://…`), no credentials.
    Url(String),
}

/// How complete listings are read; see the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialList {
    /// Streaming lists where the server offers them, paginated lists otherwise (decided per
    /// kind, the fallback logged).
    #[default]
    Auto,
    /// Streaming lists only (no fallback).
    Streaming,
    /// Paginated lists only.
    Paginated,
}

/// Tuning; [`Default`] is what the daemon uses.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// How complete listings are read.
    pub initial_list: InitialList,
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
    /// serve (its CRD not installed), see `cluster_policy`.
    pub missing_crd_recheck: Duration,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            initial_list: InitialList::Auto,
            page_size: Some(500),
            watch_timeout: None,
            backoff: Policy::KUBE_WATCH,
            backoff_reset: Policy::KUBE_WATCH_RESET,
            missing_crd_recheck: cluster_policy::MISSING_CRD_RECHECK,
        }
    }
}

/// Starts the Kubernetes datastore with the default options; see the module documentation.
pub fn spawn(
    connect: KubeConnect,
    tx: impl EventSink,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<KubeThread> {
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
) -> anyhow::Result<KubeThread> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the Kubernetes datastore's runtime")?;
    let client = runtime.block_on(client(connect, options.backoff))?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let (thread_stop, thread_wake) = (stop.clone(), wake.clone());
    let handle = std::thread::Builder::new()
        .name("kube-datastore".into())
        .spawn(move || {
            runtime.block_on(run(client, options, tx, thread_stop, thread_wake));
            Ok(())
        })
        .context("cannot start the Kubernetes datastore thread")?;
    Ok(KubeThread { handle, stop, wake })
}

/// The client, with watch requests spaced by `backoff` (see `watch_spacing`).
async fn client(connect: KubeConnect, backoff: Policy) -> anyhow::Result<Client> {
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
    let client = ::kube::client::ClientBuilder::try_from(config)
        .with_context(|| format!("cannot build a Kubernetes client for {cluster}"))?
        .with_layer(&watch_spacing::WatchSpacing::new(backoff))
        .build();
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

    /// Sends what a [`Mirror::apply`] gave, then counts the kind as listed if that was its
    /// first complete listing.
    pub(super) fn deliver(
        &self,
        (events, first_listing): (Vec<DatastoreEvent>, bool),
    ) -> Result<(), Closed> {
        for event in events {
            self.send(event)?;
        }
        if first_listing {
            self.kind_listed()?;
        }
        Ok(())
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

async fn run(
    client: Client,
    options: KubeOptions,
    tx: impl EventSink,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
) {
    let out = Out {
        tx: Box::new(tx),
        listed: AtomicUsize::new(0),
    };
    let lists = tokio::select! {
        lists = Lists::decide(&client, options.initial_list) => lists,
        () = stopped(&stop, &wake) => return,
    };
    // Each follower ends only when the receiver is gone; then all stop.
    tokio::select! {
        _ = follow::<Pod>(Api::all(client.clone()), &options, lists, &out) => {}
        _ = follow::<Namespace>(Api::all(client.clone()), &options, lists, &out) => {}
        _ = follow::<NetworkPolicy>(Api::all(client.clone()), &options, lists, &out) => {}
        _ = cluster_policy::follow::<ClusterNetworkPolicy>(Api::all(client.clone()), &options, lists, &out, &cluster_policy::CLUSTER_POLICIES) => {}
        // Staged policies (issue 23): never enforced; their CRDs are ours and may be absent.
        _ = cluster_policy::follow::<StagedNetworkPolicy>(Api::all(client.clone()), &options, lists, &out, &cluster_policy::STAGED_POLICIES) => {}
        _ = cluster_policy::follow::<StagedClusterNetworkPolicy>(Api::all(client), &options, lists, &out, &cluster_policy::STAGED_CLUSTER_POLICIES) => {}
        () = stopped(&stop, &wake) => {}
    }
    info!("Kubernetes datastore stopped");
}

/// How one kind is listed now, and whether it may still fall back to paginated lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Lists {
    streaming: bool,
    may_fall_back: bool,
}

impl Lists {
    /// The strategy every kind starts with. `Auto` asks the server's version: streaming
    /// lists came with 1.27, and an older server silently ignores the parameter.
    pub(super) async fn decide(client: &Client, choice: InitialList) -> Lists {
        match choice {
            InitialList::Paginated => Lists {
                streaming: false,
                may_fall_back: false,
            },
            InitialList::Streaming => Lists {
                streaming: true,
                may_fall_back: false,
            },
            InitialList::Auto => {
                let streaming = match client.apiserver_version().await {
                    Ok(info) => {
                        let known = version_offers_streaming(&info.major, &info.minor);
                        if known == Some(false) {
                            info!(
                                version = %info.git_version,
                                "the API server predates streaming lists (1.27): paginated lists"
                            );
                        }
                        known.unwrap_or(true)
                    }
                    Err(err) => {
                        debug!(
                            "cannot read the API server's version ({err}); trying streaming lists"
                        );
                        true
                    }
                };
                Lists {
                    streaming,
                    may_fall_back: streaming,
                }
            }
        }
    }

    /// The watcher configuration for this strategy.
    pub(super) fn config(&self, options: &KubeOptions) -> watcher::Config {
        let config = watcher::Config {
            page_size: options.page_size,
            timeout: options.watch_timeout,
            ..watcher::Config::default() // bookmarks on, consistent (most recent) lists
        };
        if self.streaming {
            config.streaming_lists()
        } else {
            config
        }
    }

    /// Whether listings are streamed (else paginated).
    pub(super) fn streaming(&self) -> bool {
        self.streaming
    }

    /// The watcher reported `err` while listing: if it is the server refusing the streaming
    /// watch, switch to paginated lists (logged) and say so.
    pub(super) fn refused(&mut self, kind: &str, err: &watcher::Error) -> bool {
        let refusal = match err {
            watcher::Error::WatchStartFailed(::kube::Error::Api(status))
                if matches!(status.code, 400 | 422) =>
            {
                Some(status)
            }
            _ => None,
        };
        if let Some(status) = refusal.filter(|_| self.streaming && self.may_fall_back) {
            // Information, not a warning: a supported server without streaming lists (1.33
            // with its WatchList feature gate off answers 422 "sendInitialEvents is
            // forbidden") is served as well by pages.
            info!(
                kind,
                code = status.code,
                reason = %status.message,
                "the API server does not offer streaming lists (sendInitialEvents); using paginated lists"
            );
            self.fall_back();
            return true;
        }
        false
    }

    /// A streaming list restarted without ever ending: the server ignored
    /// `sendInitialEvents` (it sent a plain watch, never the end bookmark).
    pub(super) fn ignored(&mut self, kind: &str) -> bool {
        if self.streaming && self.may_fall_back {
            warn!(
                kind,
                "the API server ignored a streaming list request (no initial-events-end \
                 bookmark); using paginated lists"
            );
            self.fall_back();
            return true;
        }
        false
    }

    fn fall_back(&mut self) {
        self.streaming = false;
        self.may_fall_back = false;
    }
}

/// Whether an API server of this `/version` serves streaming lists: `None` when the version
/// does not parse (providers decorate it, e.g. minor `"33+"`, which parses).
fn version_offers_streaming(major: &str, minor: &str) -> Option<bool> {
    let number = |s: &str| -> Option<u32> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let (major, minor) = (number(major)?, number(minor)?);
    Some((major, minor) >= (1, 27))
}

async fn stopped(stop: &AtomicBool, wake: &tokio::sync::Notify) {
    while !stop.load(Ordering::SeqCst) {
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(STOP_POLL) => {}
        }
    }
}

/// The kinds the datastore watches. `Serialize` gives the fingerprint of the trimmed form.
pub(super) trait Kind:
    Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + PartialEq
    + Send
    + Sync
    + 'static
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
pub(super) async fn follow<K: Kind>(
    api: Api<K>,
    options: &KubeOptions,
    mut lists: Lists,
    out: &Out,
) -> Closed {
    let kind = K::KIND.as_str();
    let mut mirror = Mirror::<K>::default();
    let mut retry = Retry::new(options);
    let mut access = Access::default();
    info!(kind, streaming = lists.streaming, "listing and watching");
    loop {
        let mut stream = watcher(api.clone(), lists.config(options))
            .modify(K::trim)
            .boxed();
        let mut restart = false;
        // A streaming list started (`Init`) and not ended, with no error since.
        let mut streaming_list_open = false;
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    match &event {
                        watcher::Event::Init if lists.streaming => {
                            if streaming_list_open && lists.ignored(kind) {
                                restart = true;
                                break;
                            }
                            streaming_list_open = true;
                        }
                        watcher::Event::InitDone => streaming_list_open = false,
                        _ => {}
                    }
                    if let Err(closed) = access.after_event(K::KIND, out) {
                        return closed;
                    }
                    if let Err(closed) = out.deliver(mirror.apply(event)) {
                        return closed;
                    }
                }
                Err(err) => {
                    streaming_list_open = false;
                    if let Err(closed) = access.after_error(K::KIND, &err, out) {
                        return closed;
                    }
                    if lists.refused(kind, &err) {
                        restart = true;
                        break;
                    }
                    let wait = retry.next_delay(is_expired(&err));
                    restart = wait_after_error(kind, &err, wait).await;
                    if restart {
                        break;
                    }
                }
            }
        }
        if !restart {
            // The watcher stream never ends by itself; if it ever does, start a new one.
            debug!(kind, "watch stream ended, restarting it");
            tokio::time::sleep(retry.next_delay(false)).await;
        }
    }
}

/// The waits of one follower after errors: kube-runtime's `ResetTimerBackoff` with our
/// policy's numbers (from the first wait again after `KubeOptions::backoff_reset` without an
/// error), and from the first wait again as well
/// - when an error ends a healthy stretch: the watcher went on without an error for at least
///   as long as the wait before it. A new fault after the follower was back in sync is
///   retried as soon as the first one was, instead of after the previous fault's longest
///   wait (up to the 30 s ceiling, doubled by jitter);
/// - at a 410 (expired) that follows another error: typically the first resumption after an
///   outage, the API server back but its watch cache without our resourceVersion. The server
///   answered and says to relist; waiting out the outage's escalated wait first would only
///   keep the agent blind.
///
/// A fault that lasts (each resumption or listing failing at once, 410s in a row included)
/// escalates to the ceiling. kube-runtime's own stream back-off resets at every event; a
/// listing or a watch that fails at once keeps its wait growing here.
pub(super) struct Retry {
    backoff: ResetTimerBackoff<watcher::ExponentialBackoff>,
    first: Duration,
    /// When the last wait ended (the watcher went on), and how long it was.
    resumed: Option<(tokio::time::Instant, Duration)>,
    /// The last error was a 410.
    expired: bool,
}

impl Retry {
    pub(super) fn new(options: &KubeOptions) -> Retry {
        Retry {
            backoff: ResetTimerBackoff::new(
                watcher::ExponentialBackoff::from(options.backoff.builder()),
                options.backoff_reset,
            ),
            first: options.backoff.first,
            resumed: None,
            expired: false,
        }
    }

    /// The wait after an error now (`expired`: a 410, see [`is_expired`]).
    pub(super) fn next_delay(&mut self, expired: bool) -> Duration {
        self.next_delay_at(tokio::time::Instant::now(), expired)
    }

    fn next_delay_at(&mut self, now: tokio::time::Instant, expired: bool) -> Duration {
        let healthy = self
            .resumed
            .is_some_and(|(resumed, last)| now.saturating_duration_since(resumed) >= last);
        let server_back = expired && !self.expired && self.resumed.is_some();
        if healthy || server_back {
            self.backoff.reset();
        }
        self.expired = expired;
        let wait = self.backoff.next().unwrap_or(self.first);
        self.resumed = Some((now + wait, wait));
        wait
    }
}

/// After a watcher error: logs it, waits `delay`, and says whether to start over with a
/// fresh watcher and a relist. kube-runtime retries a watch the server refused with HTTP 410
/// from the same dead resourceVersion forever, so that one restarts.
pub(super) async fn wait_after_error(kind: &str, err: &watcher::Error, delay: Duration) -> bool {
    let restart = matches!(
        err,
        watcher::Error::WatchStartFailed(::kube::Error::Api(status)) if status.code == 410
    );
    if is_expired(err) {
        info!(
            kind,
            "resource version expired, relisting in {delay:?}: {err}"
        );
    } else {
        warn!(kind, "Kubernetes API error, retrying in {delay:?}: {err}");
    }
    tokio::time::sleep(delay).await;
    restart
}

/// The API server's refusal of our credentials (401) or of our right (403, RBAC) behind a
/// watcher error, as an operator reads it; `None` for any other error.
pub(super) fn refusal(err: &watcher::Error) -> Option<String> {
    let status = match err {
        watcher::Error::WatchError(status) => status,
        watcher::Error::WatchStartFailed(::kube::Error::Api(status))
        | watcher::Error::InitialListFailed(::kube::Error::Api(status)) => status,
        _ => return None,
    };
    matches!(status.code, 401 | 403).then(|| {
        format!(
            "{} {}: {}",
            status.code,
            if status.code == 401 {
                "Unauthorized"
            } else {
                "Forbidden"
            },
            status.message
        )
    })
}

/// Whether the API server lets this datastore read one kind, as last told to the receiver:
/// the agent is not ready while a kind is refused (what it enforces may be stale), and ready
/// again at the kind's next event.
#[derive(Default)]
pub(super) struct Access {
    refused: bool,
}

impl Access {
    /// After an error: a 401 or 403 is told once (and logged), other errors change nothing.
    pub(super) fn after_error(
        &mut self,
        kind: ObjectKind,
        err: &watcher::Error,
        out: &Out,
    ) -> Result<(), Closed> {
        let Some(why) = refusal(err) else {
            return Ok(());
        };
        if !self.refused {
            self.refused = true;
            warn!(
                kind = kind.as_str(),
                "the API server refuses this service account {} {}: {why}; the rules stay as they are, not ready until it may again (RBAC: deploy/base/clusterrole.yaml)",
                if why.starts_with("401") { "access to" } else { "the right to list and watch" },
                kind.as_str()
            );
            out.send(DatastoreEvent::Access {
                kind,
                refused: Some(why),
            })?;
        }
        Ok(())
    }

    /// After an event: the kind is readable (again).
    pub(super) fn after_event(&mut self, kind: ObjectKind, out: &Out) -> Result<(), Closed> {
        if self.refused {
            self.refused = false;
            info!(
                kind = kind.as_str(),
                "the API server lets this service account read it again"
            );
            out.send(DatastoreEvent::Access {
                kind,
                refused: None,
            })?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::validate;
    use serde_json::json;

    #[test]
    fn retry_waits_grow_while_errors_come_at_once_and_start_afresh_after_a_healthy_stretch() {
        let options = KubeOptions {
            backoff: Policy {
                first: Duration::from_millis(100),
                factor: 2.0,
                ceiling: Some(Duration::from_secs(1)),
                tries: None,
                jitter: false,
            },
            ..KubeOptions::default()
        };
        let mut retry = Retry::new(&options);
        // backon multiplies in f32 seconds: round to milliseconds.
        let ms = |d: Duration| (d.as_micros() + 500) / 1000;
        let mut now = tokio::time::Instant::now();
        let mut waits = Vec::new();
        for _ in 0..5 {
            // Each error comes as soon as the wait before it ended.
            let wait = retry.next_delay_at(now, false);
            waits.push(ms(wait));
            now += wait;
        }
        assert_eq!(waits, [100, 200, 400, 800, 1000]);
        // Up for less than the last wait: still the ceiling.
        now += Duration::from_millis(900);
        assert_eq!(ms(retry.next_delay_at(now, false)), 1000);
        // Up for as long as the last wait: afresh.
        now += Duration::from_millis(1000) + Duration::from_millis(1000);
        assert_eq!(ms(retry.next_delay_at(now, false)), 100);
        now += Duration::from_millis(100);
        assert_eq!(ms(retry.next_delay_at(now, false)), 200);
        now += Duration::from_millis(200);
        assert_eq!(ms(retry.next_delay_at(now, false)), 400);
        // The server back, answering 410: afresh; 410s in a row escalate.
        now += Duration::from_millis(400);
        let mut waits = Vec::new();
        for _ in 0..3 {
            let wait = retry.next_delay_at(now, true);
            waits.push(ms(wait));
            now += wait;
        }
        assert_eq!(waits, [100, 200, 400]);
        // Another error, then a 410: afresh again.
        assert_eq!(ms(retry.next_delay_at(now, false)), 800);
        now += Duration::from_millis(800);
        assert_eq!(ms(retry.next_delay_at(now, true)), 100);
    }

    #[test]
    fn server_versions_that_offer_streaming_lists() {
        assert_eq!(version_offers_streaming("1", "27"), Some(true));
        assert_eq!(version_offers_streaming("1", "33+"), Some(true));
        assert_eq!(version_offers_streaming("1", "26"), Some(false));
        assert_eq!(version_offers_streaming("2", "0"), Some(true));
        assert_eq!(version_offers_streaming("", "x"), None);
    }

    #[test]
    fn list_strategies_fall_back_once_and_only_from_auto() {
        let status = |code: u16, reason: &str| {
            watcher::Error::WatchStartFailed(::kube::Error::Api(
                ::kube::core::Status::failure("refused by the test", reason)
                    .with_code(code)
                    .boxed(),
            ))
        };
        let refused = status(422, "Invalid");
        let unavailable = status(500, "InternalError");
        let mut auto = Lists {
            streaming: true,
            may_fall_back: true,
        };
        assert!(!auto.refused("Pod", &unavailable));
        assert!(auto.streaming);
        assert!(auto.refused("Pod", &refused));
        assert!(!auto.streaming);
        assert!(!auto
            .config(&KubeOptions::default())
            .initial_list_strategy
            .eq(&watcher::InitialListStrategy::StreamingList));
        assert!(!auto.refused("Pod", &refused), "once");
        let mut forced = Lists {
            streaming: true,
            may_fall_back: false,
        };
        assert!(!forced.refused("Pod", &refused));
        assert!(!forced.ignored("Pod"));
        assert_eq!(
            forced.config(&KubeOptions::default()).initial_list_strategy,
            watcher::InitialListStrategy::StreamingList
        );
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
