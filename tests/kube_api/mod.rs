//! A fake Kubernetes API server for the datastore tests: plain HTTP on 127.0.0.1, speaking
//! the list/watch protocol of the real one for Pods (`/api/v1/pods`), Namespaces
//! (`/api/v1/namespaces`), NetworkPolicies (`/apis/networking.k8s.io/v1/networkpolicies`) and
//! ClusterNetworkPolicies (`/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies`,
//! a CRD: the test can uninstall it, and the resource then answers 404 like a real API server
//! without the CRD, with a `Status` body or the plain text `404 page not found`), and the
//! staged kinds (`/apis/netpol-agent.io/v1alpha1/stagednetworkpolicies`,
//! `stagedclusternetworkpolicies`: CRDs not installed until the test says so, see
//! [`STAGED`]):
//! - lists (`PodList`…) with `metadata.resourceVersion`, paginated by `limit`/`continue` over
//!   a snapshot, items without `kind`/`apiVersion` as the real server sends them;
//! - `?watch=true&resourceVersion=N` streams newline-delimited `ADDED`/`MODIFIED`/`DELETED`
//!   events after N (replayed from history, then live), `BOOKMARK`s when
//!   `allowWatchBookmarks=true`, and ends at `timeoutSeconds`;
//! - an expired resource version (older than the compaction point) is answered with HTTP 410
//!   or with a watch `ERROR` event carrying a `Status` 410 `Expired` (the test chooses), and an
//!   expired `continue` token with HTTP 410;
//! - streaming lists (KEP-3157): `?watch=true&sendInitialEvents=true&resourceVersionMatch=
//!   NotOlderThan` streams an `ADDED` event for every current object, then a `BOOKMARK`
//!   annotated `k8s.io/initial-events-end` at the resourceVersion they were read at, then live
//!   events; `resourceVersionMatch` or `sendInitialEvents` used the way the API server refuses
//!   them are refused with its 422 `Invalid`. The test can make the server behave as one with
//!   the `WatchList` feature gate off (every `sendInitialEvents` refused with that 422) or as
//!   one from before 1.27 (the parameters ignored: a plain watch from "any" resourceVersion,
//!   without the end bookmark), see [`Streaming`];
//! - `/version` answers the `gitVersion` the test set (`v1.33.0` by default).
//!
//! Objects are kept as their JSON text (a list item, without `kind`/`apiVersion`), so the
//! benchmarks can serve 150k realistic pods from it; response bodies are counted per resource
//! ([`FakeApi::bytes_sent`]).
//!
//! The test drives it synchronously: create/update/delete objects (decorated as the API server
//! does: uid, resourceVersion, creationTimestamp, managedFields, last-applied annotation),
//! close watches (cleanly or by aborting the connection), expire them, compact history, hold
//! or fail lists, hold watches, and read the log of requests with their query parameters.
//!
//! Faults of a real API server, for the chaos tests: answer every request with an error
//! status for a while ([`FakeApi::fail_requests`]: 500, 503 or 429 with `Retry-After`), go
//! away altogether (the listener closed and every connection dropped, new connections
//! refused) and come back at the same address ([`FakeApi::go_away`], [`FakeApi::come_back`]),
//! cut watch streams in the middle of an event ([`FakeApi::cut_watches_mid_event`]) and send
//! bytes that are not a watch event ([`FakeApi::garble_watches`]).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The resources the datastore watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    Pods,
    Namespaces,
    Policies,
    ClusterPolicies,
    StagedPolicies,
    StagedClusterPolicies,
}

/// How many resources the server knows.
const KINDS: usize = 6;

/// The staged kinds (issue 23). Not in [`ALL`], the kinds every agent needs: like a cluster
/// without deploy/crds/, the server answers them 404 (`NotFoundStatus`, not logged in
/// [`FakeApi::requests`]) until a test installs them with [`FakeApi::set_served`].
pub const STAGED: [Res; 2] = [Res::StagedPolicies, Res::StagedClusterPolicies];

pub const ALL: [Res; 4] = [
    Res::Pods,
    Res::Namespaces,
    Res::Policies,
    Res::ClusterPolicies,
];

impl Res {
    fn index(self) -> usize {
        self as usize
    }
    pub fn path(self) -> &'static str {
        match self {
            Res::Pods => "/api/v1/pods",
            Res::Namespaces => "/api/v1/namespaces",
            Res::Policies => "/apis/networking.k8s.io/v1/networkpolicies",
            Res::ClusterPolicies => {
                "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"
            }
            Res::StagedPolicies => "/apis/netpol-agent.io/v1alpha1/stagednetworkpolicies",
            Res::StagedClusterPolicies => {
                "/apis/netpol-agent.io/v1alpha1/stagedclusternetworkpolicies"
            }
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Namespaces => "Namespace",
            Res::Policies => "NetworkPolicy",
            Res::ClusterPolicies => "ClusterNetworkPolicy",
            Res::StagedPolicies => "StagedNetworkPolicy",
            Res::StagedClusterPolicies => "StagedClusterNetworkPolicy",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Res::Policies => "networking.k8s.io/v1",
            Res::ClusterPolicies => "policy.networking.k8s.io/v1alpha2",
            Res::StagedPolicies | Res::StagedClusterPolicies => "netpol-agent.io/v1alpha1",
            _ => "v1",
        }
    }
    fn of_kind(kind: &str) -> Res {
        match kind {
            "Pod" => Res::Pods,
            "Namespace" => Res::Namespaces,
            "NetworkPolicy" => Res::Policies,
            "ClusterNetworkPolicy" => Res::ClusterPolicies,
            "StagedNetworkPolicy" => Res::StagedPolicies,
            "StagedClusterNetworkPolicy" => Res::StagedClusterPolicies,
            other => panic!("the fake API server does not serve {other}"),
        }
    }
    fn from_path(path: &str) -> Option<Res> {
        ALL.into_iter().chain(STAGED).find(|r| r.path() == path)
    }
}

/// `namespace/name`, or the name of a namespace.
pub fn key_of(obj: &Value) -> String {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().expect("metadata.name");
    match meta["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// How a resource whose CRD is not installed answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Served {
    #[default]
    Yes,
    /// 404 with a `Status` body (`NotFound`).
    NotFoundStatus,
    /// 404 with the plain text `404 page not found`, as the API server's mux answers a
    /// group it does not know.
    NotFoundText,
}

/// How a watch that starts from an expired resource version is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Gone {
    /// HTTP 410 with a `Status` body.
    #[default]
    Http,
    /// HTTP 200 and one `ERROR` watch event with a `Status` 410 `Expired`, as the watch cache
    /// answers.
    Event,
}

/// How the server answers a streaming list (`sendInitialEvents=true`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Streaming {
    /// Served (Kubernetes 1.27+ with the `WatchList` feature gate on).
    #[default]
    Served,
    /// Refused with 422 `Invalid`, as the API server with the `WatchList` gate off.
    Refused,
    /// Ignored, as a server from before 1.27: a plain watch from "any" resourceVersion, which
    /// sends the current objects as `ADDED` events but never the end-of-list bookmark.
    Ignored,
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Req {
    pub res: Res,
    pub watch: bool,
    pub query: BTreeMap<String, String>,
    /// When it arrived.
    pub at: Instant,
}

enum Msg {
    Line(String),
    /// Bytes as they are (not necessarily a line, not necessarily UTF-8).
    Raw(Bytes),
    /// Reset the connection mid-stream (no final chunk).
    Abort,
}

struct OpenWatch {
    tx: mpsc::UnboundedSender<Msg>,
    bookmarks: bool,
}

/// An object as stored: its JSON text as a list item (no `kind`, no `apiVersion`).
type Text = Arc<str>;

struct Snapshot {
    rv: u64,
    items: Vec<Text>,
}

#[derive(Default)]
struct Kind {
    objects: BTreeMap<String, Text>,
    /// (resourceVersion, type, object) of every change since the compaction point.
    history: VecDeque<(u64, &'static str, Text)>,
    /// When set, history beyond this many changes is compacted away (oldest first).
    history_limit: Option<usize>,
    /// Watches and continue tokens from before this resourceVersion are expired.
    compacted: u64,
    gone: Gone,
    watches: Vec<OpenWatch>,
    snapshots: HashMap<u64, Snapshot>,
    fail_lists: u32,
    fail_continues: u32,
    /// Watches are answered 200 and ended at once, without an event.
    end_watches_at_once: bool,
    served: Served,
}

struct State {
    rv: u64,
    kinds: [Kind; KINDS],
    requests: Vec<Req>,
    next_id: u64,
    streaming: Streaming,
    git_version: String,
    /// Every request is answered with this status until then (`fail_requests`).
    failing: Option<(Instant, StatusCode)>,
}

struct Shared {
    state: Mutex<State>,
    hold_lists: [watch::Sender<bool>; KINDS],
    hold_watches: [watch::Sender<bool>; KINDS],
    /// Response body bytes sent, per resource.
    sent: Arc<[AtomicU64; KINDS]>,
    /// Bumped by `go_away`: every connection served so far is dropped.
    generation: watch::Sender<u64>,
}

type Body = BoxBody<Bytes, std::io::Error>;

pub struct FakeApi {
    pub url: String,
    addr: SocketAddr,
    /// The network namespace the server was started in, to listen there again (`come_back`).
    netns: std::fs::File,
    shared: Arc<Shared>,
    /// The task accepting connections; `None` while the server is away.
    acceptor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeApi {
    pub fn start() -> FakeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("test server runtime");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 100,
                kinds: std::array::from_fn(|i| Kind {
                    served: if STAGED.iter().any(|r| r.index() == i) {
                        Served::NotFoundStatus
                    } else {
                        Served::Yes
                    },
                    ..Kind::default()
                }),
                requests: Vec::new(),
                next_id: 1,
                streaming: Streaming::default(),
                git_version: "v1.33.0".into(),
                failing: None,
            }),
            hold_lists: std::array::from_fn(|_| watch::channel(false).0),
            hold_watches: std::array::from_fn(|_| watch::channel(false).0),
            sent: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
            generation: watch::channel(0).0,
        });
        let netns = std::fs::File::open("/proc/thread-self/ns/net").expect("own network namespace");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr: SocketAddr = listener.local_addr().expect("local addr");
        let acceptor = runtime.spawn(serve(listener, shared.clone()));
        FakeApi {
            url: format!("http://{addr}"),
            addr,
            netns,
            shared,
            acceptor: Mutex::new(Some(acceptor)),
            runtime: Some(runtime),
        }
    }

    /// The API server goes away: its listening socket is closed (new connections are
    /// refused) and every connection is dropped (open watches end without their final chunk).
    pub fn go_away(&self) {
        if let Some(acceptor) = self.acceptor.lock().unwrap().take() {
            acceptor.abort();
        }
        self.shared.generation.send_modify(|g| *g += 1);
        self.state()
            .kinds
            .iter_mut()
            .for_each(|k| k.watches.clear());
    }

    /// The API server listens again at the same address (in the network namespace it was
    /// started in). Objects and history are as they were.
    pub fn come_back(&self) {
        let mut acceptor = self.acceptor.lock().unwrap();
        if acceptor.is_some() {
            return;
        }
        let listener = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&self.netns, nix::sched::CloneFlags::CLONE_NEWNET)
                        .expect("enter the server's network namespace");
                    // std sets SO_REUSEADDR: the port is free again at once.
                    std::net::TcpListener::bind(self.addr)
                })
                .join()
                .expect("binding thread")
        })
        .unwrap_or_else(|e| panic!("cannot listen at {} again: {e}", self.addr));
        let runtime = self.runtime.as_ref().expect("runtime");
        *acceptor = Some(runtime.spawn(serve(listener, self.shared.clone())));
    }

    /// Every request (lists and watches of every resource) is answered with `code` for
    /// `duration`, as an API server whose storage is down (500, 503) or that throttles (429,
    /// with `Retry-After: 1` as with 503). Open watches are not touched.
    pub fn fail_requests(&self, code: u16, duration: Duration) {
        let code = StatusCode::from_u16(code).expect("an HTTP status");
        self.state().failing = Some((Instant::now() + duration, code));
    }

    /// Watches of `res` are answered 200 and ended at once, cleanly, without an event (a proxy
    /// in front of the API server with a broken backend), until turned off.
    pub fn end_watches_at_once(&self, res: Res, on: bool) {
        self.state().kinds[res.index()].end_watches_at_once = on;
    }

    /// Ends `fail_requests` now.
    pub fn stop_failing(&self) {
        self.state().failing = None;
    }

    /// Sends every open watch of `res` the first half of an event line (a `MODIFIED` of one of
    /// its objects, or of a made-up one) and resets its connection: the client holds a
    /// truncated JSON document when the stream breaks.
    pub fn cut_watches_mid_event(&self, res: Res) {
        let mut state = self.state();
        let kind = &mut state.kinds[res.index()];
        let line = match kind.objects.values().next() {
            Some(text) => watch_line(res, "MODIFIED", text),
            None => format!(
                "{{\"type\":\"ADDED\",\"object\":{{\"kind\":\"{}\"}}}}\n",
                res.kind()
            ),
        };
        let half = Bytes::copy_from_slice(&line.as_bytes()[..line.len() / 2]);
        for w in std::mem::take(&mut kind.watches) {
            let _ = w.tx.send(Msg::Raw(half.clone()));
            let _ = w.tx.send(Msg::Abort);
        }
    }

    /// Sends every open watch of `res` a line of bytes that is no watch event (not even UTF-8);
    /// the streams stay open.
    pub fn garble_watches(&self, res: Res) {
        let junk =
            Bytes::from_static(b"\xff\xfe\x00{\"type\":\xc3\x28 <html>502 Bad Gateway</html>\n");
        let mut state = self.state();
        state.kinds[res.index()]
            .watches
            .retain(|w| w.tx.send(Msg::Raw(junk.clone())).is_ok());
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap()
    }

    /// Creates or updates an object (`kind` decides the resource) as the API server would,
    /// and tells the open watches. Returns the new resourceVersion.
    pub fn apply(&self, obj: Value) -> u64 {
        let res = Res::of_kind(obj["kind"].as_str().expect("kind"));
        let mut state = self.state();
        assert_eq!(
            state.kinds[res.index()].served,
            Served::Yes,
            "{res:?} is not installed: the API server would refuse the object"
        );
        state.rv += 1;
        state.next_id += 1;
        let rv = state.rv;
        let id = state.next_id;
        let key = key_of(&obj);
        let kind = &mut state.kinds[res.index()];
        let previous: Option<Value> = kind.objects.get(&key).map(|t| parse(t));
        let stored = decorate(res, obj, previous.as_ref(), rv, id);
        store(kind, res, key, &stored, rv);
        rv
    }

    /// Creates or updates an object exactly as given (no decoration but its new
    /// resourceVersion, and a uid when it has none), and tells the open watches. For
    /// benchmarks that make realistic objects themselves. Returns the new resourceVersion.
    pub fn put(&self, mut obj: Value) -> u64 {
        let res = Res::of_kind(obj["kind"].as_str().expect("kind"));
        let mut state = self.state();
        state.rv += 1;
        state.next_id += 1;
        let (rv, id) = (state.rv, state.next_id);
        let key = key_of(&obj);
        stamp(&mut obj, rv, id);
        store(&mut state.kinds[res.index()], res, key, &obj, rv);
        rv
    }

    /// Stores many objects as given (see [`FakeApi::put`]) with one resourceVersion, no
    /// history and no watch events: a cluster as it is before anyone watches it.
    pub fn load(&self, res: Res, objects: impl IntoIterator<Item = Value>) {
        let mut state = self.state();
        state.rv += 1;
        let rv = state.rv;
        let mut id = state.next_id;
        let kind = &mut state.kinds[res.index()];
        for mut obj in objects {
            id += 1;
            stamp(&mut obj, rv, id);
            kind.objects.insert(key_of(&obj), item_text(&obj));
        }
        state.next_id = id;
    }

    /// Applies every document of a YAML text (`kind: List` expanded).
    pub fn apply_yaml(&self, text: &str) {
        for obj in yaml_objects(text) {
            self.apply(obj);
        }
    }

    /// Deletes an object (`key` as `namespace/name`, or a namespace's name).
    pub fn delete(&self, res: Res, key: &str) -> u64 {
        let mut state = self.state();
        state.rv += 1;
        let rv = state.rv;
        let kind = &mut state.kinds[res.index()];
        let text = kind
            .objects
            .remove(key)
            .unwrap_or_else(|| panic!("no {res:?} {key} to delete"));
        let mut obj = parse(&text);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let text = item_text(&obj);
        broadcast(kind, &watch_line(res, "DELETED", &text));
        record(kind, rv, "DELETED", text);
        rv
    }

    /// The stored (decorated) object, with its `kind` and `apiVersion`.
    pub fn object(&self, res: Res, key: &str) -> Value {
        let text = self.state().kinds[res.index()].objects[key].clone();
        full_object(res, &text)
    }

    pub fn objects(&self, res: Res) -> Vec<Value> {
        let texts: Vec<Text> = self.state().kinds[res.index()]
            .objects
            .values()
            .cloned()
            .collect();
        texts.iter().map(|t| full_object(res, t)).collect()
    }

    /// How many objects of `res` the server holds.
    pub fn count(&self, res: Res) -> usize {
        self.state().kinds[res.index()].objects.len()
    }

    /// Response body bytes sent so far for `res` (lists and watches).
    pub fn bytes_sent(&self, res: Res) -> u64 {
        self.shared.sent[res.index()].load(Ordering::Relaxed)
    }

    /// How the server answers `sendInitialEvents` (all resources).
    pub fn set_streaming(&self, streaming: Streaming) {
        self.state().streaming = streaming;
    }

    /// What `/version` answers as `gitVersion` (`v1.33.0` by default).
    pub fn set_version(&self, git_version: &str) {
        self.state().git_version = git_version.to_string();
    }

    /// Keeps at most `limit` changes of `res` for resuming watches (older ones are compacted
    /// away as new ones come), as etcd's compaction does for a long-running server.
    pub fn limit_history(&self, res: Res, limit: usize) {
        self.state().kinds[res.index()].history_limit = Some(limit);
    }

    pub fn resource_version(&self) -> u64 {
        self.state().rv
    }

    /// Sends a BOOKMARK with the current resourceVersion to the watches that asked for them.
    /// Returns that resourceVersion.
    pub fn bookmark(&self, res: Res) -> u64 {
        let mut state = self.state();
        state.rv += 1; // other kinds moved on meanwhile
        let rv = state.rv;
        let line = bookmark_line(res, rv, false);
        let kind = &mut state.kinds[res.index()];
        kind.watches
            .retain(|w| !w.bookmarks || w.tx.send(Msg::Line(line.clone())).is_ok());
        rv
    }

    /// Ends the open watches: cleanly (final chunk), or by resetting the connection.
    pub fn close_watches(&self, res: Res, abort: bool) {
        let watches = std::mem::take(&mut self.state().kinds[res.index()].watches);
        for w in watches {
            if abort {
                let _ = w.tx.send(Msg::Abort);
            }
        }
    }

    /// Forgets history up to now: a watch or a continue token from an older resourceVersion
    /// is refused with 410.
    pub fn compact(&self, res: Res) {
        let mut state = self.state();
        // Other resources were written meanwhile: every resourceVersion a client holds is old.
        state.rv += 1;
        let rv = state.rv;
        let kind = &mut state.kinds[res.index()];
        kind.compacted = rv + 1;
        kind.history.clear();
    }

    /// Sends every open watch an `ERROR` 410 `Expired` event and ends it (the watch cache
    /// dropped the client), after compacting history.
    pub fn expire_watches(&self, res: Res) {
        self.compact(res);
        let watches = std::mem::take(&mut self.state().kinds[res.index()].watches);
        let line = format!("{}\n", json!({"type": "ERROR", "object": expired_status()}));
        for w in watches {
            let _ = w.tx.send(Msg::Line(line.clone()));
        }
    }

    /// Installs or uninstalls the CRD behind `res`. Uninstalling deletes its objects (as the
    /// API server does with a CRD's objects, without watch events: their watches end) and
    /// answers 404 from then on; installing serves the resource again, empty.
    pub fn set_served(&self, res: Res, served: Served) {
        let mut state = self.state();
        state.rv += 1;
        let rv = state.rv;
        let kind = &mut state.kinds[res.index()];
        kind.served = served;
        if served != Served::Yes {
            kind.objects.clear();
            kind.history.clear();
            kind.compacted = rv + 1;
            for w in std::mem::take(&mut kind.watches) {
                let _ = w.tx.send(Msg::Abort);
            }
        }
    }

    pub fn set_gone(&self, res: Res, gone: Gone) {
        self.state().kinds[res.index()].gone = gone;
    }

    /// The next `n` list requests of `res` get HTTP 500.
    pub fn fail_lists(&self, res: Res, n: u32) {
        self.state().kinds[res.index()].fail_lists = n;
    }

    /// The next `n` list requests of `res` with a `continue` token get HTTP 410.
    pub fn fail_continues(&self, res: Res, n: u32) {
        self.state().kinds[res.index()].fail_continues = n;
    }

    /// List requests of `res` wait until released.
    pub fn hold_lists(&self, res: Res, hold: bool) {
        self.shared.hold_lists[res.index()].send_replace(hold);
    }

    /// Watch requests of `res` wait until released (they are logged when they arrive).
    pub fn hold_watches(&self, res: Res, hold: bool) {
        self.shared.hold_watches[res.index()].send_replace(hold);
    }

    pub fn requests(&self) -> Vec<Req> {
        self.state().requests.clone()
    }

    pub fn open_watches(&self, res: Res) -> usize {
        let mut state = self.state();
        let kind = &mut state.kinds[res.index()];
        kind.watches.retain(|w| !w.tx.is_closed());
        kind.watches.len()
    }

    /// Waits (up to 10 s) until `cond` holds.
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut(&FakeApi) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until requests after the first `since` include a watch of `res` that is open.
    pub fn wait_watching(&self, res: Res, since: usize) {
        self.wait_for(&format!("a new watch of {res:?}"), |api| {
            api.requests()[since..]
                .iter()
                .any(|r| r.res == res && r.watch)
                && api.open_watches(res) > 0
        });
    }
}

/// Accepts connections on `listener` and serves each until it ends or the server goes away.
async fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) {
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        let mut gone = shared.generation.subscribe();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(req, &shared).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = gone.changed() => {}
            }
        });
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Parses multi-document YAML into JSON objects, expanding `kind: List`.
pub fn yaml_objects(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).expect("test YAML");
        if value.is_null() {
            continue;
        }
        match value["kind"].as_str() {
            Some("List") => out.extend(value["items"].as_array().cloned().unwrap_or_default()),
            _ => out.push(value),
        }
    }
    out
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("stored JSON")
}

/// The stored form: the object as a list item.
fn item_text(obj: &Value) -> Text {
    list_item(obj).to_string().into()
}

/// A stored object with its `kind` and `apiVersion` again.
fn full_object(res: Res, text: &str) -> Value {
    let mut obj = parse(text);
    obj["kind"] = json!(res.kind());
    obj["apiVersion"] = json!(res.api_version());
    obj
}

/// The new resourceVersion, and a uid for an object that has none.
fn stamp(obj: &mut Value, rv: u64, id: u64) {
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.entry("uid")
        .or_insert_with(|| json!(format!("0000{id:04x}-7b4d-4c5e-8f6a-9b0c1d2e3f4a")));
}

/// Stores a created or updated object, records it and tells the open watches.
fn store(kind: &mut Kind, res: Res, key: String, obj: &Value, rv: u64) {
    let text = item_text(obj);
    let event = match kind.objects.insert(key, text.clone()) {
        Some(_) => "MODIFIED",
        None => "ADDED",
    };
    broadcast(kind, &watch_line(res, event, &text));
    record(kind, rv, event, text);
}

fn record(kind: &mut Kind, rv: u64, event: &'static str, text: Text) {
    kind.history.push_back((rv, event, text));
    if let Some(limit) = kind.history_limit {
        while kind.history.len() > limit {
            if let Some((oldest, _, _)) = kind.history.pop_front() {
                kind.compacted = kind.compacted.max(oldest + 1);
            }
        }
    }
}

/// What the API server adds to an object it stores.
fn decorate(res: Res, mut obj: Value, previous: Option<&Value>, rv: u64, id: u64) -> Value {
    let applied = obj.to_string();
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    let uid = previous
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("0000{id:04x}-7b4d-4c5e-8f6a-9b0c1d2e3f4a"));
    meta.insert("uid".into(), json!(uid));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("creationTimestamp".into(), json!("2025-05-14T09:12:47Z"));
    let label_fields: serde_json::Map<String, Value> = meta
        .get("labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .keys()
                .map(|k| (format!("f:{k}"), json!({})))
                .collect()
        })
        .unwrap_or_default();
    meta.insert(
        "managedFields".into(),
        json!([{
            "apiVersion": res.api_version(), "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": label_fields}, "f:spec": {}},
            "manager": "kubectl-client-side-apply", "operation": "Update",
            "time": "2025-05-14T09:12:47Z"
        }]),
    );
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("annotations");
    annotations.insert(
        "kubectl.kubernetes.io/last-applied-configuration".into(),
        json!(applied),
    );
    match res {
        Res::Namespaces => {
            let name = meta["name"].clone();
            meta.entry("labels")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("labels")
                .insert("kubernetes.io/metadata.name".into(), name);
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Res::Pods => {
            meta.entry("ownerReferences").or_insert_with(|| {
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                        "uid": "5b1f6a7e-3c2d-4e8f-9a0b-1c2d3e4f5a6b", "controller": true}])
            });
            if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
                status.entry("conditions").or_insert_with(|| {
                    json!([{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2025-05-14T09:12:52Z"}])
                });
                status
                    .entry("qosClass")
                    .or_insert_with(|| json!("BestEffort"));
            }
        }
        Res::Policies | Res::ClusterPolicies | Res::StagedPolicies | Res::StagedClusterPolicies => {
            meta.insert("generation".into(), json!(1));
        }
    }
    obj
}

fn expired_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "too old resource version", "reason": "Expired", "code": 410})
}

/// One watch event line for a stored object: `kind` and `apiVersion` go back in front.
fn watch_line(res: Res, event: &str, item: &str) -> String {
    let inner = item
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .expect("a stored object is a JSON object");
    let sep = if inner.is_empty() { "" } else { "," };
    format!(
        "{{\"type\":\"{event}\",\"object\":{{\"kind\":\"{}\",\"apiVersion\":\"{}\"{sep}{inner}}}}}\n",
        res.kind(),
        res.api_version()
    )
}

/// A BOOKMARK at `rv`; `initial_end`: the one that ends a streaming list.
fn bookmark_line(res: Res, rv: u64, initial_end: bool) -> String {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    format!(
        "{}\n",
        json!({"type": "BOOKMARK", "object": {
            "kind": res.kind(), "apiVersion": res.api_version(), "metadata": metadata}})
    )
}

fn broadcast(kind: &mut Kind, line: &str) {
    kind.watches
        .retain(|w| w.tx.send(Msg::Line(line.to_string())).is_ok());
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    full_text(status, body.to_string())
}

fn full_text(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("response")
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// A list item as the real server sends it: without `kind` and `apiVersion`.
fn list_item(obj: &Value) -> Value {
    let mut item = obj.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    item
}

async fn handle(req: Request<Incoming>, shared: &Shared) -> Response<Body> {
    if req.uri().path() == "/version" {
        let git_version = shared.state.lock().unwrap().git_version.clone();
        let (major, minor) = git_version
            .trim_start_matches('v')
            .split_once('.')
            .map(|(major, rest)| {
                let minor = rest.split('.').next().unwrap_or_default();
                (major.to_string(), minor.to_string())
            })
            .unwrap_or_default();
        return full(
            StatusCode::OK,
            json!({"major": major, "minor": minor, "gitVersion": git_version,
                   "gitCommit": "0000000000000000000000000000000000000000",
                   "gitTreeState": "clean", "buildDate": "2025-05-14T09:12:47Z",
                   "goVersion": "go1.24.2", "compiler": "gc", "platform": "linux/amd64"}),
        );
    }
    let Some(res) = Res::from_path(req.uri().path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    if req.method() != hyper::Method::GET {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "read-only fake",
        );
    }
    let query: BTreeMap<String, String> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let (served, failing) = {
        let mut state = shared.state.lock().unwrap();
        // A staged kind not installed answers as a path the server does not know: before any
        // failure the test injects, and outside the request log, so the tests of the four
        // kinds every agent needs see the requests they always saw (the agent re-checks
        // missing CRDs in the background).
        if STAGED.contains(&res) && state.kinds[res.index()].served != Served::Yes {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        state.requests.push(Req {
            res,
            watch: watching,
            query: query.clone(),
            at: Instant::now(),
        });
        let failing = state
            .failing
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, code)| code);
        (state.kinds[res.index()].served, failing)
    };
    if let Some(code) = failing {
        let mut response = status(
            code,
            match code.as_u16() {
                429 => "TooManyRequests",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            },
            "injected by the test",
        );
        if matches!(code.as_u16(), 429 | 503) {
            response
                .headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from_static("1"));
        }
        return response;
    }
    match served {
        Served::Yes => {}
        Served::NotFoundStatus => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
        Served::NotFoundText => {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .header("content-type", "text/plain; charset=utf-8")
                .body(
                    Full::new(Bytes::from("404 page not found\n"))
                        .map_err(|never| match never {})
                        .boxed(),
                )
                .expect("response")
        }
    }
    // The datastore selects everything.
    for unexpected in ["labelSelector", "fieldSelector"] {
        if query.get(unexpected).is_some_and(|v| !v.is_empty()) {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("the fake does not serve {unexpected}"),
            );
        }
    }
    let response = if watching {
        let mut held = shared.hold_watches[res.index()].subscribe();
        let _ = held.wait_for(|hold| !*hold).await;
        watch_response(res, &query, shared)
    } else {
        let mut held = shared.hold_lists[res.index()].subscribe();
        let _ = held.wait_for(|hold| !*hold).await;
        list_response(res, &query, shared)
    };
    let counter = shared.sent.clone();
    response.map(move |body| {
        body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                counter[res.index()].fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            frame
        })
        .boxed()
    })
}

/// The API server's 422 for list options it does not accept.
fn invalid(message: &str) -> Response<Body> {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
    )
}

fn list_response(res: Res, query: &BTreeMap<String, String>, shared: &Shared) -> Response<Body> {
    let mut state = shared.state.lock().unwrap();
    let rv_now = state.rv;
    let next_id = state.next_id;
    let kind = &mut state.kinds[res.index()];
    if kind.fail_lists > 0 {
        kind.fail_lists -= 1;
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "etcdserver: request timed out",
        );
    }
    let limit: Option<usize> = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0);
    let (id, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let parsed = token
                .split_once('-')
                .and_then(|(id, off)| Some((id.parse::<u64>().ok()?, off.parse::<usize>().ok()?)));
            let expired = || {
                status(StatusCode::GONE, "Expired",
                       "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.")
            };
            if kind.fail_continues > 0 {
                kind.fail_continues -= 1;
                return expired();
            }
            match parsed {
                Some((id, off))
                    if kind
                        .snapshots
                        .get(&id)
                        .is_some_and(|s| s.rv + 1 >= kind.compacted) =>
                {
                    (id, off)
                }
                _ => return expired(),
            }
        }
        None => {
            let items = kind.objects.values().cloned().collect();
            kind.snapshots
                .insert(next_id, Snapshot { rv: rv_now, items });
            (next_id, 0)
        }
    };
    state.next_id += 1;
    let kind = &mut state.kinds[res.index()];
    let snapshot = &kind.snapshots[&id];
    let end = limit.map_or(snapshot.items.len(), |l| {
        (offset + l).min(snapshot.items.len())
    });
    let items = &snapshot.items[offset..end];
    let mut metadata = json!({"resourceVersion": snapshot.rv.to_string()});
    if end < snapshot.items.len() {
        metadata["continue"] = json!(format!("{id}-{end}"));
        metadata["remainingItemCount"] = json!(snapshot.items.len() - end);
    }
    let mut body = String::with_capacity(items.iter().map(|i| i.len() + 1).sum::<usize>() + 200);
    body.push_str(&format!(
        "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{metadata},\"items\":[",
        res.kind(),
        res.api_version()
    ));
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str("]}");
    if end >= snapshot.items.len() {
        kind.snapshots.remove(&id);
    }
    full_text(StatusCode::OK, body)
}

fn watch_response(res: Res, query: &BTreeMap<String, String>, shared: &Shared) -> Response<Body> {
    let mut state = shared.state.lock().unwrap();
    let streaming = state.streaming;
    let rv_now = state.rv;
    let kind = &mut state.kinds[res.index()];
    if kind.end_watches_at_once {
        return stream_response(None, mpsc::unbounded_channel().1, None);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let is_true = |name: &str| query.get(name).is_some_and(|v| v == "true");
    let send_initial = query.contains_key("sendInitialEvents") && streaming != Streaming::Ignored;
    let version_match = query
        .get("resourceVersionMatch")
        .filter(|v| !v.is_empty() && streaming != Streaming::Ignored);
    if send_initial {
        // The API server's validation of a watch-list request.
        if streaming == Streaming::Refused {
            return invalid(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless \
                 the WatchList feature gate is enabled",
            );
        }
        if version_match.map(String::as_str) != Some("NotOlderThan") {
            return invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                 resourceVersionMatch to NotOlderThan",
            );
        }
        if !is_true("allowWatchBookmarks") {
            return invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks",
            );
        }
    } else if version_match.is_some() {
        return invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch \
             unless sendInitialEvents is provided",
        );
    }
    if send_initial && is_true("sendInitialEvents") {
        // NotOlderThan any resourceVersion we were given: the current state is always newer,
        // and is what the watch cache would serve. Then live events.
        for text in kind.objects.values() {
            let _ = tx.send(Msg::Line(watch_line(res, "ADDED", text)));
        }
        let _ = tx.send(Msg::Line(bookmark_line(res, rv_now, true)));
        return open_watch(kind, query, tx, rx);
    }
    match query.get("resourceVersion").map(String::as_str) {
        // "Any"/"most recent": synthetic ADDED events for the current objects, then live.
        None | Some("" | "0") => {
            for text in kind.objects.values() {
                let _ = tx.send(Msg::Line(watch_line(res, "ADDED", text)));
            }
        }
        Some(rv) => {
            let Ok(rv) = rv.parse::<u64>() else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "invalid resourceVersion",
                );
            };
            if rv + 1 < kind.compacted {
                match kind.gone {
                    Gone::Http => {
                        return status(StatusCode::GONE, "Expired", "too old resource version");
                    }
                    Gone::Event => {
                        let line =
                            format!("{}\n", json!({"type": "ERROR", "object": expired_status()}));
                        return stream_response(Some(line), mpsc::unbounded_channel().1, None);
                    }
                }
            }
            for (event_rv, event, text) in &kind.history {
                if *event_rv > rv {
                    let _ = tx.send(Msg::Line(watch_line(res, event, text)));
                }
            }
        }
    }
    open_watch(kind, query, tx, rx)
}

fn open_watch(
    kind: &mut Kind,
    query: &BTreeMap<String, String>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
) -> Response<Body> {
    kind.watches.push(OpenWatch {
        tx,
        bookmarks: query
            .get("allowWatchBookmarks")
            .is_some_and(|v| v == "true"),
    });
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    stream_response(None, rx, timeout)
}

fn stream_response(
    first: Option<String>,
    rx: mpsc::UnboundedReceiver<Msg>,
    timeout: Option<Duration>,
) -> Response<Body> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let stream = futures::stream::unfold(
        (first, rx, deadline, false),
        |(mut first, mut rx, deadline, done)| async move {
            if done {
                return None;
            }
            if let Some(line) = first.take() {
                return Some((
                    Ok(Frame::data(Bytes::from(line))),
                    (None, rx, deadline, true),
                ));
            }
            let msg = match deadline {
                Some(d) => tokio::time::timeout_at(d, rx.recv()).await.ok().flatten(),
                None => rx.recv().await,
            };
            match msg {
                Some(Msg::Line(line)) => Some((
                    Ok(Frame::data(Bytes::from(line))),
                    (None, rx, deadline, false),
                )),
                Some(Msg::Raw(bytes)) => {
                    Some((Ok(Frame::data(bytes)), (None, rx, deadline, false)))
                }
                Some(Msg::Abort) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "reset by the test",
                    )),
                    (None, rx, deadline, true),
                )),
                None => None,
            }
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

/// Writes a kubeconfig for the server at `url` (no credentials) into `dir`, for the agent's
/// `KUBECONFIG`.
pub fn kubeconfig(dir: &std::path::Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    path
}
