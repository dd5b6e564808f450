//! The CRI sandbox resolver against a fake container runtime speaking the real CRI gRPC
//! protocol over a unix socket (`e2e/src/cri_server.rs`), built through the public
//! configuration path (`--interface-name-scheme sandbox --cri-endpoint …`): the initial
//! listing, the failed-sandbox race of seed 004, restarts and removals followed through the
//! event stream, the periodic list and targeted lookups when the runtime has no event
//! stream, an unreachable runtime at start, a runtime restart, and the calculation graph
//! re-rendering a pod's chains after the notifier.

mod common;
#[path = "../e2e/src/cri_server.rs"]
mod cri_server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use common::TempDir;
use cri_server::CriServer;
use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::config::{AgentOptions, RuleOptions};
use netpol_agent::iface_naming::{self, InterfaceResolver, NamingError};
use netpol_agent::model::{IpFamily, ObjectKey, PodInfo};
use netpol_agent::rules::RuleConfig;

const WAIT: Duration = Duration::from_secs(10);

/// Sandbox IDs: 64 lowercase hex characters whose first ten tell them apart.
const WEB_A: &str = "13dd25c5cb7e0f4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a";
const WEB_B: &str = "877c5ccffd0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809102";
const WEB_C: &str = "0ddbc026560e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809103";
const DB_A: &str = "086099497f0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809104";

/// The run command's options, parsed as the binary parses them.
#[derive(Parser)]
struct Opts {
    #[command(flatten)]
    agent: AgentOptions,
    #[command(flatten)]
    rules: RuleOptions,
}

/// A started resolver; stops its watcher when dropped.
struct Running {
    resolver: Option<Box<dyn InterfaceResolver>>,
    stop: Arc<AtomicBool>,
    changes: Receiver<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Running {
    fn resolver(&self) -> &dyn InterfaceResolver {
        self.resolver.as_deref().unwrap()
    }

    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        self.resolver().resolve(pod)
    }

    /// Forgets the notifications so far.
    fn drain(&self) {
        while self.changes.try_recv().is_ok() {}
    }

    /// Waits for the notifier, then for `pod` to resolve to `expected`.
    fn notified_then(&self, pod: &PodInfo, expected: Result<String, NamingError>) {
        self.changes.recv_timeout(WAIT).unwrap_or_else(|_| {
            panic!(
                "no change notification; {pod:?} gives {:?}",
                self.resolve(pod)
            )
        });
        // The notifier runs after the table changed, but several changes may be notified
        // one by one: look until the expected answer.
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.resolve(pod);
            if got == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "expected {expected:?}, got {got:?}"
            );
            let _ = self.changes.recv_timeout(Duration::from_millis(50));
        }
    }
}

/// `--interface-name-scheme sandbox --interface-prefix veth- --cri-endpoint SOCKET
/// --cri-refresh-interval REFRESH`, started.
fn start_resolver(socket: &Path, refresh: &str) -> Running {
    let opts = Opts::try_parse_from([
        "netpol-agent",
        "--interface-name-scheme",
        "sandbox",
        "--interface-prefix",
        "veth-",
        "--cri-endpoint",
        socket.to_str().unwrap(),
        "--cri-refresh-interval",
        refresh,
    ])
    .expect("options parse");
    let resolver =
        iface_naming::runtime_resolver(&opts.rules, &iface_naming::cri_config(&opts.agent))
            .expect("resolver builds");
    assert_eq!(resolver.scheme(), "sandbox");
    let (tx, changes) = channel();
    let stop = Arc::new(AtomicBool::new(false));
    resolver
        .start(
            Box::new(move || {
                let _ = tx.send(());
            }),
            stop.clone(),
        )
        .expect("start");
    Running {
        resolver: Some(resolver),
        stop,
        changes,
    }
}

fn socket_in(dir: &TempDir) -> PathBuf {
    dir.path.join("cri.sock")
}

fn pod(namespace: &str, name: &str, uid: &str) -> PodInfo {
    PodInfo {
        key: ObjectKey::new(namespace, name),
        uid: Some(uid.to_string()),
        node: Some("node-1".to_string()),
        labels: Default::default(),
        ips: vec!["10.16.1.11".parse().unwrap()],
        named_ports: Vec::new(),
        sandbox_id: None,
    }
}

fn veth(id: &str) -> Result<String, NamingError> {
    Ok(format!("veth-{}", &id[..10]))
}

fn unknown(pod: &PodInfo) -> Result<String, NamingError> {
    Err(NamingError::SandboxIdUnknown {
        pod: pod.key.clone(),
    })
}

#[test]
fn initial_listing_names_veth_plus_ten_id_characters() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start(socket_in(&dir)).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    runtime.add_sandbox("default", "db-0", "uid-db", DB_A, true, 100);
    let running = start_resolver(runtime.socket_path(), "0");
    // `start` waited for the first listing: no polling needed.
    assert!(running.resolver().in_sync());
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), Ok("veth-13dd25c5cb".to_string()));
    assert_eq!(
        running.resolve(&pod("default", "db-0", "uid-db")),
        Ok("veth-086099497f".to_string())
    );
    // Namespace, name and UID must all match.
    let stranger = pod("default", "web-2", "uid-web2");
    assert_eq!(running.resolve(&stranger), unknown(&stranger));
    let successor = pod("default", "web-1", "uid-web-recreated");
    assert_eq!(running.resolve(&successor), unknown(&successor));
    // The resolver subscribed to the event stream (the fake, like containerd, answers the
    // subscription only with the first event: nothing waited for it).
    common::wait_for(WAIT, "the resolver subscribes to events", || {
        runtime.subscribers() == 1
    });
    running.drain();
    runtime.add_sandbox("default", "web-2", "uid-web2", WEB_B, true, 200);
    running.notified_then(&stranger, veth(WEB_B));
}

#[test]
fn a_failed_older_sandbox_never_names_the_interface() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start(socket_in(&dir)).unwrap();
    // Seed 004: sandbox A's CNI ADD failed (NOTREADY, its veth left behind), B succeeded.
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, false, 100);
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_B, true, 200);
    // Two READY sandboxes: the newest.
    runtime.add_sandbox("default", "db-0", "uid-db", DB_A, true, 100);
    runtime.add_sandbox("default", "db-0", "uid-db", WEB_C, true, 300);
    let running = start_resolver(runtime.socket_path(), "0");
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), veth(WEB_B));
    assert_eq!(
        running.resolve(&pod("default", "db-0", "uid-db")),
        veth(WEB_C)
    );

    // The kubelet now removes the failed sandbox (its CNI DEL): the name stays.
    running.drain();
    assert!(runtime.remove_sandbox(WEB_A));
    running.notified_then(&web, veth(WEB_B));
    // A newer attempt that is not READY does not displace the READY one either.
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_C, false, 300);
    running.notified_then(&web, veth(WEB_B));
}

#[test]
fn a_pod_restart_changes_the_name_and_fires_the_notifier() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start(socket_in(&dir)).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    // No periodic list: only the event stream can tell.
    let running = start_resolver(runtime.socket_path(), "0");
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), veth(WEB_A));
    running.drain();

    // The sandbox dies: no READY sandbox, no interface (fail closed).
    assert!(runtime.set_ready(WEB_A, false));
    running.notified_then(
        &web,
        Err(NamingError::NoReadySandbox {
            pod: web.key.clone(),
            not_ready: 1,
        }),
    );
    // The kubelet creates a new sandbox for the pod.
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_B, true, 200);
    running.notified_then(&web, veth(WEB_B));
    // Events about application containers change nothing, and notify nothing.
    running.drain();
    runtime.container_event(
        WEB_B,
        "app-container",
        k8s_cri::v1::ContainerEventType::ContainerStartedEvent,
    );
    assert!(running
        .changes
        .recv_timeout(Duration::from_millis(300))
        .is_err());
    assert_eq!(running.resolve(&web), veth(WEB_B));
}

#[test]
fn a_removed_sandbox_makes_the_pod_unresolvable() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start(socket_in(&dir)).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    runtime.add_sandbox("default", "db-0", "uid-db", DB_A, true, 100);
    let running = start_resolver(runtime.socket_path(), "0");
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), veth(WEB_A));
    running.drain();
    // The deletion event carries no status (as containerd's): the ID alone must do.
    assert!(runtime.remove_sandbox(WEB_A));
    running.notified_then(&web, unknown(&web));
    assert_eq!(
        running.resolve(&pod("default", "db-0", "uid-db")),
        veth(DB_A)
    );
}

#[test]
fn without_an_event_stream_the_periodic_list_learns_changes() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start_without_events(socket_in(&dir)).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    let running = start_resolver(runtime.socket_path(), "0.2");
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), veth(WEB_A));
    assert_eq!(runtime.subscribers(), 0);
    running.drain();
    let lists = runtime.list_calls();

    // Nothing calls resolve until the notifier has fired: only the periodic list can learn.
    runtime.set_ready(WEB_A, false);
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_B, true, 200);
    running
        .changes
        .recv_timeout(WAIT)
        .expect("the periodic list noticed the restart");
    assert!(runtime.list_calls() > lists);
    assert_eq!(running.resolve(&web), veth(WEB_B));
    running.drain();
    runtime.remove_sandbox(WEB_B);
    running.notified_then(
        &web,
        Err(NamingError::NoReadySandbox {
            pod: web.key.clone(),
            not_ready: 1,
        }),
    );
}

#[test]
fn without_an_event_stream_a_pod_it_cannot_name_is_looked_up_at_once() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start_without_events(socket_in(&dir)).unwrap();
    // No periodic list at all: only the targeted lookup can learn the new pod.
    let running = start_resolver(runtime.socket_path(), "0");
    assert!(running.resolver().in_sync());
    let lists = runtime.list_calls();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), unknown(&web));
    running.notified_then(&web, veth(WEB_A));
    assert_eq!(runtime.list_calls(), lists + 1, "one targeted list");
}

#[test]
fn an_unreachable_runtime_at_start_is_retried() {
    let dir = TempDir::new("cri");
    let socket = socket_in(&dir);
    let started = Instant::now();
    let running = start_resolver(&socket, "0");
    // The first connection failed: start did not wait out its 5 s.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(!running.resolver().in_sync());
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), unknown(&web));

    std::thread::sleep(Duration::from_millis(500));
    let runtime = CriServer::start(&socket).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    running.notified_then(&web, veth(WEB_A));
    assert!(running.resolver().in_sync());
}

#[test]
fn a_restarted_runtime_is_listed_again() {
    let dir = TempDir::new("cri");
    let socket = socket_in(&dir);
    let runtime = CriServer::start(&socket).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    let running = start_resolver(&socket, "0");
    let web = pod("default", "web-1", "uid-web");
    assert_eq!(running.resolve(&web), veth(WEB_A));
    running.drain();

    // The runtime goes away: what was learned stays in use.
    runtime.stop();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(running.resolve(&web), veth(WEB_A));
    // It comes back having replaced the pod's sandbox while away; no event tells that.
    let runtime = CriServer::start(&socket).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_B, true, 200);
    running.notified_then(&web, veth(WEB_B));
}

#[test]
fn the_graph_renders_the_new_chain_after_the_notifier() {
    let dir = TempDir::new("cri");
    let runtime = CriServer::start(socket_in(&dir)).unwrap();
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_A, true, 100);
    let mut running = start_resolver(runtime.socket_path(), "0");
    let mut graph = Calculation::new(
        GraphConfig {
            node_name: "node-1".into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig {
                interface_prefixes: vec!["veth-".into()],
                ..RuleConfig::default()
            },
        },
        running.resolver.take().unwrap(),
    );
    let chains = |graph: &Calculation| -> Vec<String> {
        graph.snapshot().families[&IpFamily::V4]
            .chains
            .keys()
            .filter(|c| c.starts_with("cali-tw-") || c.starts_with("cali-fw-"))
            .cloned()
            .collect()
    };
    graph.upsert_pod_info(pod("default", "web-1", "uid-web"));
    graph.flush();
    assert_eq!(
        chains(&graph),
        ["cali-fw-veth-13dd25c5cb", "cali-tw-veth-13dd25c5cb"]
    );

    running.drain();
    runtime.set_ready(WEB_A, false);
    runtime.add_sandbox("default", "web-1", "uid-web", WEB_B, true, 200);
    // What the agent does on InterfacesChanged, until the new sandbox is seen.
    let deadline = Instant::now() + WAIT;
    loop {
        running
            .changes
            .recv_timeout(WAIT)
            .expect("change notification");
        graph.interfaces_changed();
        graph.flush();
        if chains(&graph) == ["cali-fw-veth-877c5ccffd", "cali-tw-veth-877c5ccffd"] {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", chains(&graph));
    }
    assert!(graph.rejections().is_empty(), "{:?}", graph.rejections());
}
