//! A fake container runtime: the CRI v1 `RuntimeService` over a unix socket, speaking the
//! real gRPC protocol, holding only pod sandboxes. It stands in for containerd or CRI-O
//! wherever netpol-agent's sandbox naming scheme must learn sandbox IDs: in the e2e runner
//! (one per simulated node) and in the resolver's integration test
//! (`#[path = "../e2e/src/cri_server.rs"] mod cri_server;`). Self-contained: it depends on
//! k8s-cri, tonic, tokio and tokio-stream only, nothing of either harness.
//!
//! Answered: `Version`; `ListPodSandbox` with its filter (ID or ID prefix, state, label
//! selector); `GetContainerEvents` (a sandbox event for every change made through the handle;
//! like containerd, whose grpc-go server sends a stream's headers with its first message, the
//! call is answered only when the first event is there; [`CriServer::start_without_events`]
//! answers `Unimplemented` instead, as runtimes without evented PLEG support do). Every other
//! RPC is `Unimplemented`.
//!
//! Sandboxes carry what the kubelet puts there: metadata (namespace, name, UID, attempt) and
//! the labels `io.kubernetes.pod.{namespace,name,uid}`. Events follow containerd: created,
//! then started (ready) or stopped (not ready), each with the sandbox's status; a deletion
//! comes without a status (the sandbox is gone by then).
//!
//! ```ignore
//! let runtime = CriServer::start(dir.join("cri.sock"))?;
//! runtime.add_sandbox("default", "web-1", "uid-1", "13dd25c5cb7e…", true, 1_000);
//! runtime.set_ready("13dd25c5cb7e…", false);
//! runtime.remove_sandbox("13dd25c5cb7e…");
//! drop(runtime); // stops the server and removes the socket
//! ```
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

/// The kubelet's sandbox labels.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// What `Version` answers as the runtime's name.
pub const RUNTIME_NAME: &str = "netpol-fake-cri";

type EventSender = mpsc::UnboundedSender<Result<cri::ContainerEventResponse, Status>>;
type EventStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>,
>;

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<String, cri::PodSandbox>,
    subscribers: Vec<EventSender>,
    events: bool,
    list_calls: u64,
}

impl State {
    fn publish(&mut self, container_id: &str, kind: cri::ContainerEventType, with_status: bool) {
        let status = self
            .sandboxes
            .get(container_id)
            .filter(|_| with_status)
            .map(sandbox_status);
        let event = cri::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: status,
            containers_statuses: Vec::new(),
        };
        self.subscribers
            .retain(|subscriber| subscriber.send(Ok(event.clone())).is_ok());
    }
}

fn sandbox_status(s: &cri::PodSandbox) -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: s.id.clone(),
        metadata: s.metadata.clone(),
        state: s.state,
        created_at: s.created_at,
        labels: s.labels.clone(),
        annotations: s.annotations.clone(),
        runtime_handler: s.runtime_handler.clone(),
        ..Default::default()
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn state_of(ready: bool) -> i32 {
    if ready {
        cri::PodSandboxState::SandboxReady as i32
    } else {
        cri::PodSandboxState::SandboxNotready as i32
    }
}

/// A running fake runtime. Dropping it (or [`CriServer::stop`]) ends every event stream,
/// stops the server and removes the socket.
pub struct CriServer {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl CriServer {
    /// Serves on `socket_path` (a stale socket file there is replaced), with the event
    /// stream; it accepts connections once this returns.
    pub fn start(socket_path: impl AsRef<Path>) -> std::io::Result<CriServer> {
        Self::start_with(socket_path.as_ref(), true)
    }

    /// Like [`CriServer::start`], but `GetContainerEvents` is `Unimplemented`: clients must
    /// list.
    pub fn start_without_events(socket_path: impl AsRef<Path>) -> std::io::Result<CriServer> {
        Self::start_with(socket_path.as_ref(), false)
    }

    fn start_with(socket: &Path, events: bool) -> std::io::Result<CriServer> {
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = std::os::unix::net::UnixListener::bind(socket)?;
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = Arc::new(Mutex::new(State {
            events,
            ..State::default()
        }));
        let service = FakeRuntime {
            state: state.clone(),
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fake-cri".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::UnixListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            eprintln!("fake CRI server: {e}");
                            return;
                        }
                    };
                    let server = tonic::transport::Server::builder()
                        .add_service(RuntimeServiceServer::new(service))
                        .serve_with_incoming(UnixListenerStream::new(listener));
                    tokio::select! {
                        result = server => {
                            if let Err(e) = result {
                                eprintln!("fake CRI server: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here ends every connection still open.
            })?;
        Ok(CriServer {
            socket: socket.to_path_buf(),
            state,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds (or replaces) sandbox `id` of pod `namespace/name` with `uid`, READY or NOTREADY,
    /// created at `created_at_ns` (nanoseconds since the epoch; only the order matters). Its
    /// attempt is the number of sandboxes the pod already has. Publishes a created event, then
    /// a started (ready) or stopped (not ready) one.
    pub fn add_sandbox(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        id: &str,
        ready: bool,
        created_at_ns: i64,
    ) {
        let mut state = self.state();
        let attempt = state
            .sandboxes
            .values()
            .filter(|s| s.id != id && s.metadata.as_ref().is_some_and(|m| m.uid == uid))
            .count() as u32;
        let labels = HashMap::from([
            (POD_NAMESPACE_LABEL.to_string(), namespace.to_string()),
            (POD_NAME_LABEL.to_string(), name.to_string()),
            (POD_UID_LABEL.to_string(), uid.to_string()),
        ]);
        let sandbox = cri::PodSandbox {
            id: id.to_string(),
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: namespace.to_string(),
                attempt,
            }),
            state: state_of(ready),
            created_at: created_at_ns,
            labels,
            ..Default::default()
        };
        state.sandboxes.insert(id.to_string(), sandbox);
        state.publish(id, cri::ContainerEventType::ContainerCreatedEvent, true);
        let next = if ready {
            cri::ContainerEventType::ContainerStartedEvent
        } else {
            cri::ContainerEventType::ContainerStoppedEvent
        };
        state.publish(id, next, true);
    }

    /// Marks sandbox `id` READY or NOTREADY and publishes a started or stopped event; false
    /// when there is no such sandbox.
    pub fn set_ready(&self, id: &str, ready: bool) -> bool {
        let mut state = self.state();
        let Some(sandbox) = state.sandboxes.get_mut(id) else {
            return false;
        };
        sandbox.state = state_of(ready);
        let kind = if ready {
            cri::ContainerEventType::ContainerStartedEvent
        } else {
            cri::ContainerEventType::ContainerStoppedEvent
        };
        state.publish(id, kind, true);
        true
    }

    /// Removes sandbox `id` and publishes a deleted event without a status; false when there
    /// is no such sandbox.
    pub fn remove_sandbox(&self, id: &str) -> bool {
        let mut state = self.state();
        if state.sandboxes.remove(id).is_none() {
            return false;
        }
        state.publish(id, cri::ContainerEventType::ContainerDeletedEvent, false);
        true
    }

    /// Publishes an event about application container `container_id` of sandbox
    /// `sandbox_id` (with the sandbox's status, as containerd does); false when there is no
    /// such sandbox. Changes nothing.
    pub fn container_event(
        &self,
        sandbox_id: &str,
        container_id: &str,
        kind: cri::ContainerEventType,
    ) -> bool {
        let mut state = self.state();
        let Some(status) = state.sandboxes.get(sandbox_id).map(sandbox_status) else {
            return false;
        };
        let event = cri::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: Some(status),
            containers_statuses: Vec::new(),
        };
        state
            .subscribers
            .retain(|subscriber| subscriber.send(Ok(event.clone())).is_ok());
        true
    }

    /// The sandboxes held now.
    pub fn sandboxes(&self) -> Vec<cri::PodSandbox> {
        self.state().sandboxes.values().cloned().collect()
    }

    /// `ListPodSandbox` calls answered so far (filtered or not).
    pub fn list_calls(&self) -> u64 {
        self.state().list_calls
    }

    /// Clients following `GetContainerEvents` now.
    pub fn subscribers(&self) -> usize {
        let mut state = self.state();
        state.subscribers.retain(|s| !s.is_closed());
        state.subscribers.len()
    }

    /// Stops the server (also on drop): event streams end, connections close, the socket
    /// file is removed.
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        self.state().subscribers.clear();
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for CriServer {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

impl std::fmt::Debug for CriServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriServer")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn matches(sandbox: &cri::PodSandbox, filter: &cri::PodSandboxFilter) -> bool {
    (filter.id.is_empty() || sandbox.id.starts_with(&filter.id))
        && filter
            .state
            .as_ref()
            .is_none_or(|s| s.state == sandbox.state)
        && filter
            .label_selector
            .iter()
            .all(|(k, v)| sandbox.labels.get(k) == Some(v))
}

/// The gRPC service over the shared state.
struct FakeRuntime {
    state: Arc<Mutex<State>>,
}

impl FakeRuntime {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `impl RuntimeService` with the given methods, every other one `Unimplemented`. (A macro
/// producing the whole impl, so `async_trait` sees the expanded methods.)
macro_rules! runtime_service {
    (
        impl for $ty:ty { $($own:tt)* }
        unimplemented { $($rpc:ident($req:ident) -> $resp:ident;)* }
    ) => {
        #[tonic::async_trait]
        impl RuntimeService for $ty {
            $($own)*
            $(
                async fn $rpc(
                    &self,
                    _request: Request<cri::$req>,
                ) -> Result<Response<cri::$resp>, Status> {
                    Err(Status::unimplemented(concat!(
                        "the fake runtime does not implement ",
                        stringify!($rpc)
                    )))
                }
            )*
        }
    };
}

runtime_service! {
    impl for FakeRuntime {
        async fn version(
            &self,
            _request: Request<cri::VersionRequest>,
        ) -> Result<Response<cri::VersionResponse>, Status> {
            Ok(Response::new(cri::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: RUNTIME_NAME.into(),
                runtime_version: "0.1.0".into(),
                runtime_api_version: "v1".into(),
            }))
        }

        async fn list_pod_sandbox(
            &self,
            request: Request<cri::ListPodSandboxRequest>,
        ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
            let filter = request.into_inner().filter.unwrap_or_default();
            let mut state = self.state();
            state.list_calls += 1;
            let items = state
                .sandboxes
                .values()
                .filter(|s| matches(s, &filter))
                .cloned()
                .collect();
            Ok(Response::new(cri::ListPodSandboxResponse { items }))
        }

        type GetContainerEventsStream = EventStream;

        /// As containerd (grpc-go) does, the response headers go out with the first event:
        /// a client that waits for them before listing waits for the next change.
        async fn get_container_events(
            &self,
            _request: Request<cri::GetEventsRequest>,
        ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
            let mut events = {
                let mut state = self.state();
                if !state.events {
                    return Err(Status::unimplemented(
                        "the fake runtime was started without container events",
                    ));
                }
                let (tx, rx) = mpsc::unbounded_channel();
                state.subscribers.push(tx);
                UnboundedReceiverStream::new(rx)
            };
            let Some(first) = events.next().await else {
                return Err(Status::unavailable("the fake runtime is stopping"));
            };
            let stream: EventStream = Box::pin(tokio_stream::once(first).chain(events));
            Ok(Response::new(stream))
        }
    }
    unimplemented {
        run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
        stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
        remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
        pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse;
        create_container(CreateContainerRequest) -> CreateContainerResponse;
        start_container(StartContainerRequest) -> StartContainerResponse;
        stop_container(StopContainerRequest) -> StopContainerResponse;
        remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
        list_containers(ListContainersRequest) -> ListContainersResponse;
        container_status(ContainerStatusRequest) -> ContainerStatusResponse;
        update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
        reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
        exec_sync(ExecSyncRequest) -> ExecSyncResponse;
        exec(ExecRequest) -> ExecResponse;
        attach(AttachRequest) -> AttachResponse;
        port_forward(PortForwardRequest) -> PortForwardResponse;
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
        list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
        list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
        update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
        status(StatusRequest) -> StatusResponse;
        checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
        list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
        runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
    }
}
