//! The sandbox naming scheme at run time: each local pod's sandbox (pause container) ID,
//! learned from the node's container runtime over the CRI API.
//!
//! **What it owns**: the connection to the runtime's CRI socket (`FELIX_CRIENDPOINT`), a
//! table of the node's pod sandboxes (ID, pod namespace/name/UID, attempt, READY or not,
//! creation time), the rule that picks a pod's sandbox, and following the runtime's changes.
//! The name itself comes from [`SandboxResolver::name_for`], so the scheme's rules (15
//! characters, a prefix of at most 5 so that at least 10 ID characters remain, lowercase hex
//! IDs) live in one place for this resolver and the offline one.
//!
//! **Why CRI**: CNIs that name the host veth after the sandbox were handed that ID by the
//! runtime (`CNI_CONTAINERID`). The Pod object does not carry it: `status.containerStatuses`
//! lists the application containers, never the pause container. Only the kubelet and the
//! runtime know it, and the runtime answers `RuntimeService.ListPodSandbox` on the socket the
//! kubelet uses, so no help from the CNI or an admission webhook is needed. (`compile`, which
//! is offline, reads the `netpol-agent.io/sandbox-id` annotation instead; at run time the
//! runtime is the only source and the annotation is ignored.)
//!
//! **Selection rule**: a pod's candidates are the sandboxes whose metadata namespace and name
//! are the pod's, and, when the pod's UID is known (always, from the API server), whose
//! metadata UID (else label `io.kubernetes.pod.uid`) is the pod's: a pod deleted and
//! recreated under the same name (a StatefulSet) never gets its predecessor's sandbox. Among
//! them only READY sandboxes count, and the one created last wins (ties: higher attempt, then
//! ID, so the choice is deterministic). The kubelet may leave a failed sandbox behind while it
//! creates the next one (seed 004: sandbox 1's CNI ADD failed but left its veth, sandbox 2
//! succeeded, then sandbox 1's CNI DEL ran): an older NOTREADY sandbox must never name the
//! interface, and does not; a newer NOTREADY one (an attempt still being set up) does not
//! displace the READY one either. With no READY candidate the pod has no interface yet:
//! [`NamingError::NoReadySandbox`] (or [`NamingError::SandboxIdUnknown`] when the runtime has
//! no sandbox for it at all), so it gets no chains and its traffic meets the dispatch chains'
//! "Unknown interface" DROP: fail closed.
//!
//! **Following changes**: one thread with its own single-threaded tokio runtime. Each
//! session connects, asks `Version`, sends the `GetContainerEvents` subscription *before* the
//! full `ListPodSandbox` (so nothing happening between the two is missed) without waiting for
//! its answer (containerd's grpc-go server sends a stream's headers only with its first
//! event), then applies events one by one: an event carrying `pod_sandbox_status` updates
//! that sandbox (a `CONTAINER_DELETED_EVENT` for the sandbox's own ID removes it); an event
//! without a status (containerd sends none once a sandbox is gone) removes a known sandbox on
//! delete and otherwise asks the runtime for that one ID (`PodSandboxFilter.id`). Application
//! container events carry their sandbox's status, which usually changes nothing. A full list
//! every `FELIX_CRIREFRESHINTERVAL` is the safety net. Until the stream is answered, and for
//! the whole session when the runtime refuses it (`Unimplemented`, or any other refusal
//! except the connection going away), the periodic list is the main mechanism, and a pod that
//! `resolve` cannot name is looked up at once with a targeted list (label selector
//! `io.kubernetes.pod.uid`, else namespace and name; at most once a second per pod), so a new
//! pod does not wait for the next period. A stream that ends or fails ends the session: the
//! next one lists everything again. Each time the table changes the `changed` notifier runs,
//! and the agent resolves its local pods again.
//!
//! `resolve` only reads the shared table (a read lock held for a lookup, never across I/O).
//!
//! **When the runtime is unreachable** the agent still starts, felix-like: on a booting node
//! the runtime may come up after the agent, and a runtime restart must not crash-loop it.
//! `start` waits a bounded time (`initial_sync_timeout`, 5 s) for the first listing, so the
//! first apply already knows the local pods, and returns at once if the first connection
//! fails. Failures are logged as errors naming the socket (the first of a streak, then each
//! time the back-off is at its ceiling, and every lost session); connecting is retried with
//! exponential back-off (0.2 s doubling to 30 s, reset by a session that lasted 10 s); unary
//! calls time out after 10 s. While the runtime is away the table learned so far stays in use
//! (sandbox IDs do not change because the runtime restarted; the veths are still there), and
//! the next session's full list replaces it. Until the first listing every local pod fails
//! closed; [`InterfaceResolver::in_sync`] says so, for readiness.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status, Streaming};
use tracing::{debug, error, info, warn};

use super::{ChangeNotifier, InterfaceResolver, NamingError, SandboxResolver};
use crate::backoff::{Backoff, Policy};
use crate::model::{ObjectKey, PodInfo};

mod sandboxes;
mod watcher;

use sandboxes::*;
pub use sandboxes::{select_sandbox, SandboxRecord};
use watcher::*;

pub use crate::config::DEFAULT_CRI_ENDPOINT;
/// CRI-O's CRI socket.
pub const CRIO_CRI_ENDPOINT: &str = "/var/run/crio/crio.sock";
/// Default seconds between full sandbox listings (`FELIX_CRIREFRESHINTERVAL`).
pub const DEFAULT_CRI_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// How long `start` waits for the runtime's first listing before the agent goes on.
pub const DEFAULT_CRI_INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// Labels the kubelet puts on every sandbox it creates.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";

/// Bound on one unary CRI call, so a hung runtime cannot hang the watcher.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A session that lasted this long resets the back-off when it ends.
const STABLE_SESSION: Duration = Duration::from_secs(10);
/// A pod `resolve` cannot name is looked up at most this often (no event stream only).
const LOOKUP_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How often the watcher looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Where the runtime is and how often it is listed in full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriConfig {
    /// Path of the runtime's CRI unix socket.
    pub endpoint: PathBuf,
    /// Full `ListPodSandbox` period; `None`: never (events and lookups only).
    pub refresh_interval: Option<Duration>,
    /// How long `start` waits for the first listing.
    pub initial_sync_timeout: Duration,
}

impl CriConfig {
    /// `endpoint` with the default refresh interval and initial wait.
    pub fn new(endpoint: impl Into<PathBuf>) -> CriConfig {
        CriConfig {
            endpoint: endpoint.into(),
            refresh_interval: Some(DEFAULT_CRI_REFRESH_INTERVAL),
            initial_sync_timeout: DEFAULT_CRI_INITIAL_SYNC_TIMEOUT,
        }
    }
}

impl Default for CriConfig {
    fn default() -> Self {
        CriConfig::new(DEFAULT_CRI_ENDPOINT)
    }
}

// ---------------------------------------------------------------- the resolver

/// State shared by `resolve` and the watcher thread.
#[derive(Debug, Default)]
struct Shared {
    table: RwLock<SandboxTable>,
    /// The runtime answered a full listing at least once.
    synced: AtomicBool,
    /// The event stream is being followed (then a pod `resolve` misses needs no lookup).
    events_live: AtomicBool,
    started: AtomicBool,
    lookups: Mutex<Lookups>,
    wake: tokio::sync::Notify,
}

/// Pods `resolve` could not name, for the watcher's targeted lists.
#[derive(Debug, Default)]
struct Lookups {
    /// Pod → its UID, if known.
    pending: BTreeMap<ObjectKey, Option<String>>,
    last: HashMap<ObjectKey, Instant>,
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, SandboxTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, SandboxTable> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }

    fn lookups(&self) -> std::sync::MutexGuard<'_, Lookups> {
        self.lookups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sandbox scheme fed by the container runtime: see the module documentation.
#[derive(Debug)]
pub struct CriSandboxResolver {
    naming: SandboxResolver,
    cfg: CriConfig,
    shared: Arc<Shared>,
}

impl CriSandboxResolver {
    /// Checks the prefix (the sandbox scheme's rules); connects nothing until `start`.
    pub fn new(prefix: &str, cfg: CriConfig) -> Result<CriSandboxResolver, NamingError> {
        Ok(CriSandboxResolver {
            naming: SandboxResolver::new(prefix)?,
            cfg,
            shared: Arc::default(),
        })
    }

    pub fn config(&self) -> &CriConfig {
        &self.cfg
    }

    pub fn prefix(&self) -> &str {
        self.naming.prefix()
    }

    /// The sandbox that names `pod`'s interface now, if any.
    pub fn sandbox_of(&self, pod: &ObjectKey, uid: Option<&str>) -> Option<SandboxRecord> {
        select_sandbox(self.shared.read().of_pod(pod), uid).cloned()
    }

    /// Sandboxes known, on every pod.
    pub fn sandbox_count(&self) -> usize {
        self.shared.read().len()
    }

    /// Asks the watcher for a targeted list of `pod`, when only the periodic list would
    /// otherwise learn about it. Never waits for I/O.
    fn lookup_later(&self, pod: &PodInfo) {
        let shared = &self.shared;
        if !shared.synced.load(Ordering::Acquire) || shared.events_live.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let mut lookups = shared.lookups();
        if lookups
            .last
            .get(&pod.key)
            .is_some_and(|at| now.duration_since(*at) < LOOKUP_MIN_INTERVAL)
        {
            return;
        }
        lookups
            .last
            .retain(|_, at| now.duration_since(*at) < LOOKUP_MIN_INTERVAL);
        lookups.last.insert(pod.key.clone(), now);
        lookups.pending.insert(pod.key.clone(), pod.uid.clone());
        drop(lookups);
        shared.wake.notify_one();
    }
}

impl InterfaceResolver for CriSandboxResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        let uid = pod.uid.as_deref();
        let not_ready = {
            let table = self.shared.read();
            let sandboxes = table.of_pod(&pod.key);
            if let Some(sandbox) = select_sandbox(sandboxes, uid) {
                return self.naming.name_for(&pod.key, Some(&sandbox.id));
            }
            sandboxes.iter().filter(|s| s.belongs_to(uid)).count()
        };
        self.lookup_later(pod);
        Err(if not_ready > 0 {
            NamingError::NoReadySandbox {
                pod: pod.key.clone(),
                not_ready,
            }
        } else {
            NamingError::SandboxIdUnknown {
                pod: pod.key.clone(),
            }
        })
    }

    fn scheme(&self) -> &'static str {
        "sandbox"
    }

    fn in_sync(&self) -> bool {
        self.shared.synced.load(Ordering::Acquire)
    }

    /// Starts the watcher thread, then waits up to `initial_sync_timeout` for the first
    /// listing (not at all once the first connection failed). An unreachable runtime is
    /// logged and retried, never an error here.
    fn start(&self, changed: ChangeNotifier, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        if self.shared.started.swap(true, Ordering::AcqRel) {
            anyhow::bail!("the CRI sandbox resolver was already started");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the CRI watcher's runtime")?;
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let watcher = Watcher {
            endpoint: self.cfg.endpoint.clone(),
            refresh: self.cfg.refresh_interval.filter(|d| !d.is_zero()),
            shared: self.shared.clone(),
            changed,
            stop,
            first_outcome: Some(first_tx),
        };
        std::thread::Builder::new()
            .name("cri-sandboxes".into())
            .spawn(move || runtime.block_on(watcher.run()))
            .context("starting the CRI watcher thread")?;
        let endpoint = self.cfg.endpoint.display();
        match first_rx.recv_timeout(self.cfg.initial_sync_timeout) {
            Ok(true) => info!(
                endpoint = %endpoint,
                sandboxes = self.sandbox_count(),
                "learned the pod sandboxes from the container runtime"
            ),
            // The watcher logged why; it keeps retrying.
            Ok(false) => {}
            Err(_) => warn!(
                endpoint = %endpoint,
                "the container runtime has not listed its pod sandboxes within {:?}; the agent \
                 goes on, and local pods get their interfaces once it does",
                self.cfg.initial_sync_timeout
            ),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl CriSandboxResolver {
        fn with_records(prefix: &str, records: Vec<SandboxRecord>) -> CriSandboxResolver {
            let resolver = CriSandboxResolver::new(prefix, CriConfig::default()).unwrap();
            resolver.shared.write().replace_all(records);
            resolver.shared.synced.store(true, Ordering::Release);
            resolver
        }
    }

    const A: &str = "aaaaaaaaaa11111111111111111111111111111111111111111111111111111111";
    const B: &str = "bbbbbbbbbb22222222222222222222222222222222222222222222222222222222";
    const C: &str = "cccccccccc33333333333333333333333333333333333333333333333333333333";

    fn sandbox(id: &str, uid: &str, ready: bool, created_at_ns: i64) -> SandboxRecord {
        SandboxRecord {
            id: id.to_string(),
            pod: ObjectKey::new("default", "web-1"),
            uid: uid.to_string(),
            attempt: 0,
            ready,
            created_at_ns,
        }
    }

    fn pod(uid: Option<&str>) -> PodInfo {
        let mut pod = super::super::test_support::pod("default", "web-1", None);
        pod.uid = uid.map(str::to_string);
        pod
    }

    fn selected(records: &[SandboxRecord], uid: Option<&str>) -> Option<String> {
        select_sandbox(records, uid).map(|s| s.id.clone())
    }

    #[test]
    fn older_notready_sandbox_never_wins() {
        // Seed 004: sandbox 1's CNI ADD failed (NOTREADY), sandbox 2 succeeded.
        let records = [sandbox(A, "u1", false, 100), sandbox(B, "u1", true, 200)];
        assert_eq!(selected(&records, Some("u1")), Some(B.into()));
        // Listed in the other order, the same answer.
        let reversed = [records[1].clone(), records[0].clone()];
        assert_eq!(selected(&reversed, Some("u1")), Some(B.into()));
    }

    #[test]
    fn newer_notready_attempt_does_not_displace_the_ready_one() {
        let records = [sandbox(A, "u1", true, 100), sandbox(B, "u1", false, 200)];
        assert_eq!(selected(&records, Some("u1")), Some(A.into()));
    }

    #[test]
    fn of_two_ready_sandboxes_the_newest_wins() {
        let records = [
            sandbox(B, "u1", true, 100),
            sandbox(A, "u1", true, 300),
            sandbox(C, "u1", false, 400),
        ];
        assert_eq!(selected(&records, Some("u1")), Some(A.into()));
        // Same creation time: the higher attempt, then the greater ID.
        let mut tie = [sandbox(A, "u1", true, 100), sandbox(B, "u1", true, 100)];
        assert_eq!(selected(&tie, Some("u1")), Some(B.into()));
        tie[0].attempt = 1;
        assert_eq!(selected(&tie, Some("u1")), Some(A.into()));
    }

    #[test]
    fn none_ready_is_no_sandbox_and_the_pod_is_reported() {
        let records = vec![sandbox(A, "u1", false, 100), sandbox(B, "u1", false, 200)];
        assert_eq!(selected(&records, Some("u1")), None);
        assert_eq!(selected(&[], None), None);
        let resolver = CriSandboxResolver::with_records("veth-", records);
        let err = resolver.resolve(&pod(Some("u1"))).unwrap_err();
        assert_eq!(
            err,
            NamingError::NoReadySandbox {
                pod: ObjectKey::new("default", "web-1"),
                not_ready: 2,
            }
        );
        let message = err.to_string();
        assert!(message.contains("default/web-1"), "{message}");
        assert!(message.contains("none is READY"), "{message}");
        let empty = CriSandboxResolver::with_records("veth-", vec![]);
        assert_eq!(
            empty.resolve(&pod(Some("u1"))),
            Err(NamingError::SandboxIdUnknown {
                pod: ObjectKey::new("default", "web-1"),
            })
        );
    }

    #[test]
    fn another_pod_uid_under_the_same_name_is_not_a_candidate() {
        // A StatefulSet pod deleted and recreated: the old pod's sandbox is still READY.
        let records = vec![sandbox(A, "old", true, 300), sandbox(B, "new", true, 200)];
        assert_eq!(selected(&records, Some("new")), Some(B.into()));
        assert_eq!(selected(&records, Some("gone")), None);
        // Without a UID (manifests that carry none), namespace and name decide.
        assert_eq!(selected(&records, None), Some(A.into()));
        assert_eq!(selected(&records, Some("")), Some(A.into()));
        let resolver = CriSandboxResolver::with_records("veth-", records);
        assert_eq!(
            resolver.resolve(&pod(Some("gone"))),
            Err(NamingError::SandboxIdUnknown {
                pod: ObjectKey::new("default", "web-1"),
            })
        );
    }

    #[test]
    fn restart_replaces_the_id() {
        let resolver = CriSandboxResolver::with_records("veth-", vec![sandbox(A, "u1", true, 100)]);
        assert_eq!(
            resolver.resolve(&pod(Some("u1"))),
            Ok("veth-aaaaaaaaaa".into())
        );
        let mut table = resolver.shared.write();
        assert!(table.upsert(sandbox(A, "u1", false, 100)));
        let mut restarted = sandbox(B, "u1", true, 200);
        restarted.attempt = 1;
        assert!(table.upsert(restarted));
        drop(table);
        assert_eq!(
            resolver.resolve(&pod(Some("u1"))),
            Ok("veth-bbbbbbbbbb".into())
        );
        assert!(resolver.shared.write().remove(B));
        assert!(matches!(
            resolver.resolve(&pod(Some("u1"))),
            Err(NamingError::NoReadySandbox { not_ready: 1, .. })
        ));
    }

    #[test]
    fn names_follow_the_sandbox_scheme_rules() {
        let records = vec![sandbox(A, "u1", true, 100)];
        // Prefix of 4: 11 ID characters, 15 in all.
        let resolver = CriSandboxResolver::with_records("hybr", records.clone());
        assert_eq!(resolver.resolve(&pod(None)), Ok("hybraaaaaaaaaa1".into()));
        assert_eq!(resolver.prefix(), "hybr");
        // The prefix rules are the sandbox scheme's.
        assert_eq!(
            CriSandboxResolver::new("veth--", CriConfig::default()).unwrap_err(),
            NamingError::SandboxPrefixTooLong {
                prefix: "veth--".into(),
                len: 6,
            }
        );
        assert_eq!(
            CriSandboxResolver::new("", CriConfig::default()).unwrap_err(),
            NamingError::EmptySandboxPrefix
        );
        // An ID from the runtime that cannot name a veth is refused, not truncated.
        let short =
            CriSandboxResolver::with_records("veth-", vec![sandbox("abc123", "u1", true, 100)]);
        assert!(matches!(
            short.resolve(&pod(None)),
            Err(NamingError::SandboxIdTooShort {
                len: 6,
                needed: 10,
                ..
            })
        ));
        let upper = CriSandboxResolver::with_records(
            "veth-",
            vec![sandbox("ABCDEF0123456789", "u1", true, 100)],
        );
        assert!(matches!(
            upper.resolve(&pod(None)),
            Err(NamingError::SandboxIdNotHex { found: 'A', .. })
        ));
    }

    #[test]
    fn table_reports_only_real_changes() {
        let mut table = SandboxTable::default();
        assert!(table.upsert(sandbox(A, "u1", true, 100)));
        assert!(!table.upsert(sandbox(A, "u1", true, 100)));
        assert!(table.upsert(sandbox(A, "u1", false, 100)));
        assert!(!table.remove(B));
        assert!(!table.replace_all(vec![sandbox(A, "u1", false, 100)]));
        assert!(table.replace_all(vec![sandbox(B, "u1", true, 200)]));
        assert!(!table.contains(A) && table.contains(B));
        assert!(table.remove(B));
        assert!(table.by_pod.is_empty() && table.pod_of.is_empty());
    }

    #[test]
    fn targeted_list_replaces_only_that_pods_sandboxes() {
        let mut other = sandbox(C, "u2", true, 100);
        other.pod = ObjectKey::new("default", "db-0");
        let mut table = SandboxTable::from_records([
            sandbox(A, "u1", true, 100),
            sandbox(B, "old", true, 50),
            other,
        ]);
        let web = ObjectKey::new("default", "web-1");
        // The runtime now has only a newer sandbox of u1: A went, B (another UID) stays.
        assert!(table.replace_pod(
            &web,
            Some("u1"),
            vec![sandbox(B.replace('b', "d").as_str(), "u1", true, 200)]
        ));
        assert!(!table.contains(A) && table.contains(B) && table.contains(C));
        assert!(!table.replace_pod(
            &web,
            Some("u1"),
            vec![sandbox(B.replace('b', "d").as_str(), "u1", true, 200)]
        ));
        // By namespace and name: every sandbox of the pod is in scope.
        assert!(table.replace_pod(&web, None, vec![]));
        assert!(table.of_pod(&web).is_empty() && table.contains(C));
    }

    fn event(
        kind: cri::ContainerEventType,
        container_id: &str,
        status: Option<(&str, cri::PodSandboxState)>,
    ) -> cri::ContainerEventResponse {
        cri::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: 1,
            pod_sandbox_status: status.map(|(id, state)| cri::PodSandboxStatus {
                id: id.to_string(),
                metadata: Some(cri::PodSandboxMetadata {
                    name: "web-1".into(),
                    uid: "u1".into(),
                    namespace: "default".into(),
                    attempt: 2,
                }),
                state: state as i32,
                created_at: 100,
                ..Default::default()
            }),
            containers_statuses: vec![],
        }
    }

    #[test]
    fn events_update_remove_or_ask() {
        use cri::ContainerEventType::*;
        use cri::PodSandboxState::*;
        let table = SandboxTable::from_records([sandbox(A, "u1", true, 100)]);
        let mut expected = sandbox(B, "u1", true, 100);
        expected.attempt = 2;
        // A sandbox started, or an application container in it: the status is the news.
        for (kind, container) in [(ContainerStartedEvent, B), (ContainerStoppedEvent, "app-1")] {
            assert_eq!(
                event_action(&table, &event(kind, container, Some((B, SandboxReady)))),
                EventAction::Upsert(expected.clone())
            );
        }
        let mut stopped = expected.clone();
        stopped.ready = false;
        assert_eq!(
            event_action(
                &table,
                &event(ContainerStoppedEvent, B, Some((B, SandboxNotready)))
            ),
            EventAction::Upsert(stopped)
        );
        // The sandbox itself deleted, with or without a status.
        assert_eq!(
            event_action(
                &table,
                &event(ContainerDeletedEvent, B, Some((B, SandboxNotready)))
            ),
            EventAction::Remove(B.into())
        );
        assert_eq!(
            event_action(&table, &event(ContainerDeletedEvent, A, None)),
            EventAction::Remove(A.into())
        );
        // No status and nothing known: ask the runtime.
        assert_eq!(
            event_action(&table, &event(ContainerCreatedEvent, C, None)),
            EventAction::Lookup(C.into())
        );
        assert_eq!(
            event_action(&table, &event(ContainerStartedEvent, A, None)),
            EventAction::Lookup(A.into())
        );
    }

    #[test]
    fn records_fall_back_to_the_kubelets_labels() {
        let labels = HashMap::from([
            (POD_NAMESPACE_LABEL.to_string(), "prod".to_string()),
            (POD_NAME_LABEL.to_string(), "api-0".to_string()),
            (POD_UID_LABEL.to_string(), "u9".to_string()),
        ]);
        let listed = cri::PodSandbox {
            id: A.into(),
            metadata: None,
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 7,
            labels: labels.clone(),
            ..Default::default()
        };
        let record = SandboxRecord::from_sandbox(&listed).unwrap();
        assert_eq!(record.pod, ObjectKey::new("prod", "api-0"));
        assert_eq!(
            (record.uid.as_str(), record.ready, record.created_at_ns),
            ("u9", true, 7)
        );
        // Naming no pod, or no ID: not a kubelet sandbox.
        let anonymous = cri::PodSandbox {
            id: A.into(),
            ..Default::default()
        };
        assert_eq!(SandboxRecord::from_sandbox(&anonymous), None);
        let no_id = cri::PodSandbox {
            labels,
            ..Default::default()
        };
        assert_eq!(SandboxRecord::from_sandbox(&no_id), None);
    }

    #[test]
    fn errors_read_as_one_line_without_repeats() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let error = anyhow::Error::new(io)
            .context("No such file or directory")
            .context("connecting");
        assert_eq!(describe(&error), "connecting: No such file or directory");
        let status = status_error(Status::unimplemented(
            "unknown service runtime.v1.RuntimeService",
        ));
        assert_eq!(
            describe(&status.context("CRI v1 RuntimeService.Version")),
            "CRI v1 RuntimeService.Version: Unimplemented: unknown service runtime.v1.RuntimeService"
        );
    }

    #[test]
    fn lookups_are_asked_only_without_events_and_at_most_once_a_second() {
        let resolver = CriSandboxResolver::with_records("veth-", vec![]);
        let web = pod(Some("u1"));
        assert!(resolver.resolve(&web).is_err());
        assert!(resolver.resolve(&web).is_err());
        assert_eq!(
            resolver.shared.lookups().pending,
            BTreeMap::from([(web.key.clone(), Some("u1".to_string()))])
        );
        resolver.shared.lookups().pending.clear();
        assert!(resolver.resolve(&web).is_err());
        assert!(
            resolver.shared.lookups().pending.is_empty(),
            "within a second"
        );
        let mut other = web.clone();
        other.key = ObjectKey::new("default", "web-2");
        resolver.shared.events_live.store(true, Ordering::Release);
        assert!(resolver.resolve(&other).is_err());
        assert!(
            resolver.shared.lookups().pending.is_empty(),
            "events are live"
        );
    }
}
