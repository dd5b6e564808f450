//! The thread that keeps the sandbox table current: a connection to the runtime's socket,
//! the container events stream where the runtime offers it, periodic full listings
//! otherwise and as a safety net, reconnecting with the shared back-off.

use super::*;

pub(super) type Client = RuntimeServiceClient<Channel>;

pub(super) struct Watcher {
    pub(super) endpoint: PathBuf,
    pub(super) refresh: Option<Duration>,
    pub(super) shared: Arc<Shared>,
    pub(super) changed: ChangeNotifier,
    pub(super) stop: Arc<AtomicBool>,
    /// Told once whether the first session listed the sandboxes.
    pub(super) first_outcome: Option<std::sync::mpsc::Sender<bool>>,
}

impl Watcher {
    pub(super) async fn run(mut self) {
        let stop = self.stop.clone();
        let mut backoff = Backoff::new(Policy::CRI_CONNECT);
        let mut failures = 0u32;
        loop {
            let mut listed = false;
            let began = Instant::now();
            let error = tokio::select! {
                error = self.session(&mut listed) => error,
                () = stopped(&stop) => return,
            };
            self.shared.events_live.store(false, Ordering::Release);
            let endpoint = self.endpoint.display();
            let error = describe(&error);
            // A runtime that answers and then drops us at once must not be hammered.
            if listed && began.elapsed() >= STABLE_SESSION {
                backoff.reset();
                failures = 0;
            }
            let delay = backoff.next_delay();
            if listed {
                error!(
                    endpoint = %endpoint,
                    "lost the container runtime: {error}; reconnecting in {delay:?} (the \
                     sandboxes learned so far stay in use)"
                );
            } else {
                failures += 1;
                if failures == 1 || backoff.at_ceiling(delay) {
                    error!(
                        endpoint = %endpoint,
                        "cannot list pod sandboxes from the container runtime at {endpoint}: \
                         {error}; retrying in {delay:?} (pods on this node whose sandbox is \
                         not known get no interface)"
                    );
                } else {
                    debug!(endpoint = %endpoint, "container runtime still unreachable: {error}");
                }
            }
            // After the log line, so `start` returns with the reason already told.
            if let Some(tx) = self.first_outcome.take() {
                let _ = tx.send(false);
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stopped(&stop) => return,
            }
        }
    }

    /// One connection, until it fails; `listed` tells whether it got as far as a full list.
    pub(super) async fn session(&mut self, listed: &mut bool) -> anyhow::Error {
        match self.follow(listed).await {
            Ok(never) => match never {},
            Err(error) => error,
        }
    }

    pub(super) async fn follow(&mut self, listed: &mut bool) -> anyhow::Result<Infallible> {
        let mut client = RuntimeServiceClient::new(connect(&self.endpoint).await?);
        let version = call(client.version(cri::VersionRequest {
            version: "v1".into(),
        }))
        .await
        .map_err(status_error)
        .context("CRI v1 RuntimeService.Version")?;
        // Subscribe before listing, so that what happens between the list and the first
        // event is in the stream. The call is only started here (its request is queued on
        // the connection ahead of the list's), not awaited: grpc-go runtimes send a stream's
        // headers with its first event, which on a quiet node may be a long while.
        let mut events_client = client.clone();
        let mut events = Events::Pending(Box::pin(async move {
            events_client
                .get_container_events(cri::GetEventsRequest {})
                .await
                .map(tonic::Response::into_inner)
        }));
        if let Events::Pending(subscribing) = &mut events {
            if let std::task::Poll::Ready(answer) = futures::poll!(subscribing.as_mut()) {
                events = self.subscribed(answer)?;
            }
        }
        self.list_all(&mut client).await?;
        *listed = true;
        info!(
            endpoint = %self.endpoint.display(),
            runtime = %version.runtime_name,
            runtime_version = %version.runtime_version,
            sandboxes = self.shared.read().len(),
            "following pod sandboxes in the container runtime"
        );
        if let Some(tx) = self.first_outcome.take() {
            let _ = tx.send(true);
        }
        let mut resync = self.refresh.map(|every| {
            let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            timer
        });
        loop {
            tokio::select! {
                () = tick(&mut resync) => self.list_all(&mut client).await?,
                step = events.next() => match step {
                    EventStep::Subscribed(answer) => {
                        let refused = answer
                            .as_ref()
                            .is_err_and(|status| status.code() != Code::Unimplemented);
                        events = self.subscribed(answer)?;
                        // Any other refusal may still hide the runtime going away: a list
                        // tells (and covers whatever the stream would have said).
                        if refused {
                            self.list_all(&mut client).await?;
                        }
                    }
                    EventStep::Event(Ok(Some(event))) => {
                        self.apply_event(&mut client, &event).await?
                    }
                    EventStep::Event(Ok(None)) => {
                        anyhow::bail!("the runtime ended the CRI event stream")
                    }
                    EventStep::Event(Err(status)) => {
                        return Err(status_error(status)).context("CRI event stream")
                    }
                },
                () = self.shared.wake.notified() => self.lookups(&mut client).await?,
            }
        }
    }

    /// The runtime answered the subscription: follow the stream, or do without it for this
    /// session (`Unimplemented`: runtimes before the evented PLEG; any other refusal, e.g.
    /// pod events disabled in the runtime's configuration, is not worth losing the list over).
    ///
    /// `Unavailable` and `Cancelled` are the connection going away: the session ends (a
    /// request on a connection in that state can hang until its timeout).
    pub(super) fn subscribed(&self, answer: Result<EventStream, Status>) -> anyhow::Result<Events> {
        Ok(match answer {
            Ok(stream) => {
                debug!("following the container runtime's events");
                self.shared.events_live.store(true, Ordering::Release);
                Events::Live(Box::new(stream))
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::Cancelled) => {
                return Err(status_error(status)).context("CRI GetContainerEvents");
            }
            Err(status) => {
                let reason = match status.code() {
                    Code::Unimplemented => "does not stream container events".to_string(),
                    _ => format!(
                        "refused to stream container events ({})",
                        describe(&status_error(status))
                    ),
                };
                match self.refresh {
                    Some(every) => info!(
                        "the container runtime {reason}; sandbox changes are learned by listing \
                         every {every:?}, and at once for a pod the agent cannot name"
                    ),
                    None => warn!(
                        "the container runtime {reason} and FELIX_CRIREFRESHINTERVAL is 0: \
                         sandbox changes are learned only for pods the agent cannot name"
                    ),
                }
                Events::Unavailable
            }
        })
    }

    pub(super) fn notify_if(&self, changed: bool, why: &str) {
        if changed {
            debug!(why, "pod sandboxes changed");
            (self.changed)();
        }
    }

    pub(super) async fn list(
        client: &mut Client,
        filter: Option<cri::PodSandboxFilter>,
    ) -> anyhow::Result<Vec<SandboxRecord>> {
        let response = call(client.list_pod_sandbox(cri::ListPodSandboxRequest { filter }))
            .await
            .map_err(status_error)
            .context("CRI ListPodSandbox")?;
        Ok(response
            .items
            .iter()
            .filter_map(SandboxRecord::from_sandbox)
            .collect())
    }

    pub(super) async fn list_all(&mut self, client: &mut Client) -> anyhow::Result<()> {
        let records = Self::list(client, None).await?;
        let changed = self.shared.write().replace_all(records);
        // Pending lookups stay: one asked while this list was under way may be about a
        // sandbox created after the runtime answered it.
        self.shared.synced.store(true, Ordering::Release);
        self.notify_if(changed, "full list");
        Ok(())
    }

    pub(super) async fn apply_event(
        &mut self,
        client: &mut Client,
        event: &cri::ContainerEventResponse,
    ) -> anyhow::Result<()> {
        let action = event_action(&self.shared.read(), event);
        let changed = match action {
            EventAction::Upsert(record) => self.shared.write().upsert(record),
            EventAction::Remove(id) => self.shared.write().remove(&id),
            EventAction::Lookup(id) => {
                let filter = cri::PodSandboxFilter {
                    id: id.clone(),
                    ..Default::default()
                };
                let found: Vec<SandboxRecord> = Self::list(client, Some(filter))
                    .await?
                    .into_iter()
                    .filter(|r| r.id == id)
                    .collect();
                let mut table = self.shared.write();
                if found.is_empty() {
                    // Not a sandbox (an application container), or one already gone.
                    table.remove(&id)
                } else {
                    let mut changed = false;
                    for record in found {
                        changed |= table.upsert(record);
                    }
                    changed
                }
            }
        };
        self.notify_if(changed, "container event");
        Ok(())
    }

    pub(super) async fn lookups(&mut self, client: &mut Client) -> anyhow::Result<()> {
        let pending = std::mem::take(&mut self.shared.lookups().pending);
        let mut changed = false;
        for (pod, uid) in pending {
            let label_selector = match &uid {
                Some(uid) => HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]),
                None => HashMap::from([
                    (POD_NAMESPACE_LABEL.to_string(), pod.namespace.clone()),
                    (POD_NAME_LABEL.to_string(), pod.name.clone()),
                ]),
            };
            let filter = cri::PodSandboxFilter {
                label_selector,
                ..Default::default()
            };
            let records = Self::list(client, Some(filter))
                .await
                .with_context(|| format!("looking up pod {pod}"))?;
            changed |= self
                .shared
                .write()
                .replace_pod(&pod, uid.as_deref(), records);
        }
        self.notify_if(changed, "pod lookup");
        Ok(())
    }
}

/// A gRPC channel over the unix socket (the URI is a placeholder the connector ignores).
pub(super) async fn connect(path: &Path) -> anyhow::Result<Channel> {
    let socket = path.to_path_buf();
    Endpoint::from_static("http://cri.invalid")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .context("connecting")
}

/// A gRPC status as `Code: message` (its Display also dumps metadata and details).
pub(super) fn status_error(status: Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

/// An error and its causes on one line, each cause once (tonic's transport errors repeat
/// their cause).
pub(super) fn describe(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if parts.last().is_none_or(|last| !last.ends_with(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// A CRI call bounded by [`CALL_TIMEOUT`].
pub(super) async fn call<T>(
    request: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(CALL_TIMEOUT, request).await {
        Ok(response) => response.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

pub(super) async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(timer) => {
            timer.tick().await;
        }
        None => std::future::pending().await,
    }
}

pub(super) type EventStream = Streaming<cri::ContainerEventResponse>;

/// The `GetContainerEvents` subscription of a session.
pub(super) enum Events {
    /// Asked for, not answered yet (until then pods the agent cannot name are looked up).
    Pending(Pin<Box<dyn Future<Output = Result<EventStream, Status>> + Send>>),
    Live(Box<EventStream>),
    /// Refused: the periodic list and lookups do the work.
    Unavailable,
}

// Returned once per step and matched at once: not worth boxing.
#[allow(clippy::large_enum_variant)]
pub(super) enum EventStep {
    Subscribed(Result<EventStream, Status>),
    Event(Result<Option<cri::ContainerEventResponse>, Status>),
}

impl Events {
    /// The next thing the subscription has to say; cancel-safe (the state stays in `self`).
    pub(super) async fn next(&mut self) -> EventStep {
        match self {
            Events::Pending(subscribing) => EventStep::Subscribed(subscribing.as_mut().await),
            Events::Live(stream) => EventStep::Event(stream.message().await),
            Events::Unavailable => std::future::pending().await,
        }
    }
}

pub(super) async fn stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(STOP_POLL).await;
    }
}
