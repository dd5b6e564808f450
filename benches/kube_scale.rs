//! The agent at cluster scale: resident memory at rest, the Kubernetes datastore's initial
//! sync with streaming and with paginated lists, and pod churn. Prints figures, asserts
//! nothing about time.
//!
//! ```text
//! cargo bench --bench kube_scale -- rest  [SCALE] [--kube-only|--dir-only]   # RSS at rest, dir and Kubernetes datastores
//! cargo bench --bench kube_scale -- lists [SCALE]   # initial sync: streaming vs paginated lists
//! cargo bench --bench kube_scale -- churn [SCALE] [--seconds S] [--rate R] [--paginated]
//! cargo bench --bench kube_scale -- all             # rest at 10k and 150k, lists and churn (both list modes) at 150k
//! ```
//! `SCALE` is `10k` (10k pods, 1k policies, 300 namespaces) or `150k` (150k pods, 10k
//! policies, 5k namespaces, the default), both with 1500 pods on the agent's node; or
//! `--pods N --policies P --namespaces NS --local L`.
//!
//! Each run starts the real binary (`netpol-agent run --node node-0`, legacy iptables) in a
//! network namespace of its own (`tests/common`'s `NetNs`, removed at the end, also on a
//! panic), against the fake API server the tests use (`tests/kube_api`), serving from this
//! process inside that namespace; or, for the directory datastore, manifest files written
//! by the synthetic generator (`support/synthetic.rs`, `write_cluster`). The cluster is the generator's: its
//! namespaces, policies and pod labels; pods served by the API server are the typical pod
//! of `tests/kube_api/typical_pod.json` (a Deployment's pod with two containers, managed
//! fields, status; 8.8 KB of JSON) given each synthetic pod's name, namespace, labels, node
//! and IP, so bytes and decoding cost are those of a real cluster's pods.
//!
//! `NETPOL_AGENT_WRAP="heaptrack -o FILE"` runs the agent under a wrapper (a heap profiler;
//! `rest` then kills the agent with SIGKILL at rest, so the profile's "leaked" memory is what
//! was live at rest).
//! `NETPOL_AGENT_BIN=/path/to/netpol-agent` measures another build of the agent (say, the one
//! before a change) with the same cluster and server.
//!
//! - rest: RSS (`VmRSS`) of the agent 5 s after its first full apply, and its peak
//!   (`VmHWM`), with the time to `InSync` and to the first apply.
//! - lists: the same start with the server offering streaming lists (`sendInitialEvents`)
//!   and with the server refusing them (the agent falls back to pages of 500): time to
//!   `InSync`, bytes the server sent, the agent's peak RSS.
//! - churn: after the first apply, pod events at `--rate` per second (default 100) for
//!   `--seconds` (default 60): each churn pod is created pending, gets its IP 1 s later, is
//!   relabelled 1 s after that and deleted 1 s after that (a quarter of the events each).
//!   Every 4th churn pod is a clone (namespace and labels) of a pod whose IP is in some IP
//!   set, and its last three events are probed: the time from the API server sending the
//!   event to `ipset test` in the namespace answering as it should (the member added, moved
//!   to a set of the new labels, removed), polled every millisecond through a long-running
//!   `ipset -`. Also the agent's CPU (its own and its children's, from `/proc`) per 1k
//!   events, and the bytes the server sent per second. `--paginated`: the server refuses
//!   streaming lists, so the agent lists in pages (its relists too).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/kube_api/mod.rs"]
mod kube_api;
#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{NetNs, TempDir};
use kube_api::{FakeApi, Res, Streaming};
use procfs::line_time;
use serde_json::{json, Value};
use synthetic::{namespace, pod_ip, Rng, Scale, APPS};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
const NODE: &str = synthetic::NODE;
const TYPICAL_POD: &str = include_str!("../tests/kube_api/typical_pod.json");
/// How long the agent must be quiet after its first apply before RSS counts as "at rest".
const SETTLE: Duration = Duration::from_secs(5);

// ---- the cluster ----

fn scale(pods: usize, policies: usize, namespaces: usize, local: usize) -> Scale {
    Scale {
        pods,
        policies,
        namespaces,
        local,
        dual: false,
        cluster_policies: 0,
    }
}

/// The synthetic cluster's pod `j` as the API server would hold it.
fn typical_pod(template: &Value, j: usize, s: Scale, app: usize) -> Value {
    let p = synthetic::pod(j, s, app);
    let labels = p.metadata.labels.unwrap_or_default();
    let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
    let ns = p.metadata.namespace.unwrap_or_default();
    churn_pod(
        template,
        &format!("pod-{j}"),
        &ns,
        &labels,
        &node,
        Some(&pod_ip(j)),
    )
}

fn churn_pod(
    template: &Value,
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    node: &str,
    ip: Option<&str>,
) -> Value {
    let mut pod = template.clone();
    let meta = &mut pod["metadata"];
    meta["name"] = json!(name);
    meta["namespace"] = json!(namespace);
    let mut all = labels.clone();
    all.insert("pod-template-hash".into(), "7d9f6c5b8d".into());
    meta["labels"] = json!(all);
    if let Some(a) = meta["annotations"].as_object_mut() {
        a.remove("netpol-agent.io/sandbox-id");
    }
    meta.as_object_mut().unwrap().remove("uid");
    pod["spec"]["nodeName"] = json!(node);
    let status = &mut pod["status"];
    match ip {
        Some(ip) => {
            status["phase"] = json!("Running");
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{ "ip": ip }]);
        }
        None => {
            status["phase"] = json!("Pending");
            let s = status.as_object_mut().unwrap();
            s.remove("podIP");
            s.remove("podIPs");
            s.remove("containerStatuses");
        }
    }
    pod
}

/// The synthetic cluster's objects, with each pod's app label (the same draws as
/// `synthetic::build`).
struct Cluster {
    scale: Scale,
    apps: Vec<usize>,
}

impl Cluster {
    fn new(scale: Scale) -> Cluster {
        let mut rng = Rng(42);
        let apps = (0..scale.pods).map(|_| rng.below(APPS)).collect();
        Cluster { scale, apps }
    }

    fn labels(&self, j: usize) -> BTreeMap<String, String> {
        synthetic::pod(j, self.scale, self.apps[j])
            .metadata
            .labels
            .unwrap_or_default()
    }

    fn namespace_of(&self, j: usize) -> String {
        format!("ns-{}", synthetic::pod_namespace(j, self.scale))
    }

    fn to_value<T: serde::Serialize>(kind: &str, api_version: &str, obj: &T) -> Value {
        let mut v = serde_json::to_value(obj).unwrap();
        v["kind"] = json!(kind);
        v["apiVersion"] = json!(api_version);
        v
    }

    /// Loads the cluster into the fake API server.
    fn serve(&self, api: &FakeApi) {
        let s = self.scale;
        api.load(
            Res::Namespaces,
            (0..s.namespaces).map(|i| {
                let mut v = Self::to_value("Namespace", "v1", &namespace(i));
                v["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(format!("ns-{i}"));
                v
            }),
        );
        let template: Value = serde_json::from_str(TYPICAL_POD).unwrap();
        api.load(
            Res::Pods,
            (0..s.pods).map(|j| typical_pod(&template, j, s, self.apps[j])),
        );
        api.load(
            Res::Policies,
            synthetic::policies(s, 42)
                .map(|np| Self::to_value("NetworkPolicy", "networking.k8s.io/v1", &np)),
        );
    }
}

// ---- the agent ----

/// The agent process (killed and reaped on drop), when it started, and whether it runs
/// below a wrapper.
struct Agent {
    process: common::Agent,
    started: Instant,
    wrapped: bool,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.wrapped {
            // Killing the wrapper alone would leave the agent below it running.
            let agent = self.pid();
            if agent != self.process.pid() {
                let _ = Command::new("kill")
                    .args(["-9", &agent.to_string()])
                    .status();
            }
        }
        // Then `process` kills and reaps the wrapper (or the agent itself).
    }
}

/// The agent binary: this checkout's, or `NETPOL_AGENT_BIN` (to measure another build in
/// the same run, e.g. the one before a change).
fn agent_bin() -> PathBuf {
    std::env::var_os("NETPOL_AGENT_BIN").map_or_else(|| PathBuf::from(BIN), PathBuf::from)
}

enum Source<'a> {
    Kube(&'a FakeApi),
    Dir(&'a Path),
}

impl Agent {
    fn start(ns: &NetNs, work: &Path, source: Source) -> Agent {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name]);
        // A wrapper such as a heap profiler (`heaptrack -o FILE`): the agent is then its child.
        let wrapped = std::env::var("NETPOL_AGENT_WRAP").ok();
        if let Some(wrap) = &wrapped {
            cmd.args(wrap.split_whitespace());
        }
        cmd.arg(agent_bin());
        for (k, _) in std::env::vars() {
            if k.starts_with("FELIX_") || k == "NODENAME" {
                cmd.env_remove(k);
            }
        }
        cmd.args(["run", "--node", NODE])
            .env("FELIX_IPTABLESBACKEND", "legacy")
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_LOGSEVERITYSCREEN", "info");
        match source {
            Source::Kube(api) => {
                cmd.env("KUBECONFIG", kube_api::kubeconfig(work, &api.url));
            }
            Source::Dir(dir) => {
                cmd.env("FELIX_DATASTORETYPE", format!("dir:{}", dir.display()));
            }
        }
        let started = Instant::now();
        Agent {
            process: common::Agent::spawn(cmd, &work.join("agent.log")),
            started,
            wrapped: wrapped.is_some(),
        }
    }

    /// The agent's pid: the child's, or with a wrapper the process running the agent binary
    /// below the wrapper (not any process of that binary: other runs may use it too).
    fn pid(&self) -> u32 {
        if !self.wrapped {
            return self.process.pid();
        }
        let bin = agent_bin();
        let parent_of = |pid: u32| -> Option<u32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: the command may hold spaces and parentheses.
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        let below_wrapper = |mut pid: u32| {
            for _ in 0..8 {
                match parent_of(pid) {
                    Some(parent) if parent == self.process.pid() => return true,
                    Some(parent) if parent > 1 => pid = parent,
                    _ => return false,
                }
            }
            false
        };
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            if first == bin.as_os_str().as_encoded_bytes() && below_wrapper(pid) {
                return pid;
            }
        }
        self.process.pid()
    }

    /// With a wrapper: ends the agent abruptly (so a heap profiler records what was live),
    /// then waits for the wrapper to finish writing.
    fn kill_for_profile(&mut self) {
        if self.wrapped {
            let _ = Command::new("kill")
                .args(["-9", &self.pid().to_string()])
                .status();
            let _ = self.process.child.wait();
        }
    }

    /// Waits for a log line containing `what`; the time from the agent's "running" line
    /// (after its preflight checks) to that line, by their timestamps.
    fn wait_log(&mut self, what: &str, limit: Duration) -> Duration {
        loop {
            let text = self.process.log();
            if let Some(at) = line_time(&text, what) {
                let start = line_time(&text, "netpol-agent running").unwrap_or(at);
                return Duration::from_secs_f64((at - start).max(0.0));
            }
            if let Ok(Some(status)) = self.process.child.try_wait() {
                panic!("the agent exited ({status}): {}", tail(&self.process.log()));
            }
            assert!(
                self.started.elapsed() < limit,
                "no {what:?} within {limit:?}: {}",
                tail(&self.process.log())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn status_kib(&self, field: &str) -> u64 {
        procfs::status_kib(self.pid(), field)
    }

    fn cpu_seconds(&self) -> f64 {
        procfs::cpu_seconds(self.pid())
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Starts an agent and waits for its first full apply and then `SETTLE`.
struct Started {
    in_sync: Duration,
    applied: Duration,
    rss_kib: u64,
    peak_kib: u64,
}

fn start_and_settle(agent: &mut Agent, datastore_in_sync: &str) -> Started {
    let limit = Duration::from_secs(600);
    let in_sync = agent.wait_log(datastore_in_sync, limit);
    let applied = agent.wait_log("first full apply done", limit);
    std::thread::sleep(SETTLE);
    Started {
        in_sync,
        applied,
        rss_kib: agent.status_kib("VmRSS:"),
        peak_kib: agent.status_kib("VmHWM:"),
    }
}

/// The API server in the agent's namespace (its socket must live there).
fn api_in(ns: &NetNs) -> FakeApi {
    common::in_netns(&ns.name, FakeApi::start)
}

// ---- scenarios ----

/// `dir`, `kube`: which datastores to measure.
fn rest(s: Scale, dir: bool, kube: bool) {
    let cluster = Cluster::new(s);
    println!(
        "## at rest: {} pods ({} on {NODE}), {} policies, {} namespaces",
        s.pods, s.local, s.policies, s.namespaces
    );
    if dir {
        let ns = NetNs::new("scale-dir");
        let work = TempDir::new("scale-dir");
        let dir = work.path.join("manifests");
        synthetic::write_cluster(&dir, s, 42, 0, 0);
        let mut agent = Agent::start(&ns, &work.path, Source::Dir(&dir));
        let r = start_and_settle(&mut agent, "datastore in sync");
        println!(
            "dir datastore:        RSS at rest {:>7.1} MiB, peak {:>7.1} MiB; in sync {:>6.2} s, first apply {:>6.2} s",
            mib(r.rss_kib),
            mib(r.peak_kib),
            r.in_sync.as_secs_f64(),
            r.applied.as_secs_f64()
        );
        agent.kill_for_profile();
    }
    if !kube {
        return;
    }
    let ns = NetNs::new("scale-kube");
    let work = TempDir::new("scale-kube");
    let api = api_in(&ns);
    cluster.serve(&api);
    let mut agent = Agent::start(&ns, &work.path, Source::Kube(&api));
    let r = start_and_settle(&mut agent, "Kubernetes datastore in sync");
    println!(
        "kubernetes datastore: RSS at rest {:>7.1} MiB, peak {:>7.1} MiB; in sync {:>6.2} s, first apply {:>6.2} s, {:.1} MiB received",
        mib(r.rss_kib),
        mib(r.peak_kib),
        r.in_sync.as_secs_f64(),
        r.applied.as_secs_f64(),
        received(&api) as f64 / (1 << 20) as f64
    );
    agent.kill_for_profile();
}

fn received(api: &FakeApi) -> u64 {
    kube_api::ALL.iter().map(|r| api.bytes_sent(*r)).sum()
}

fn lists(s: Scale) {
    let cluster = Cluster::new(s);
    println!(
        "## initial list: {} pods, {} policies, {} namespaces",
        s.pods, s.policies, s.namespaces
    );
    for (name, streaming) in [
        ("streaming (sendInitialEvents)", Streaming::Served),
        ("paginated (500, after a refusal)", Streaming::Refused),
    ] {
        let ns = NetNs::new("scale-lists");
        let work = TempDir::new("scale-lists");
        let api = api_in(&ns);
        api.set_streaming(streaming);
        cluster.serve(&api);
        let mut agent = Agent::start(&ns, &work.path, Source::Kube(&api));
        let in_sync = agent.wait_log("Kubernetes datastore in sync", Duration::from_secs(600));
        let peak_in_sync = agent.status_kib("VmHWM:");
        let bytes = received(&api);
        let r = start_and_settle(&mut agent, "Kubernetes datastore in sync");
        let requests = api.requests();
        let lists = requests.iter().filter(|r| !r.watch).count();
        let watch_lists = requests
            .iter()
            .filter(|r| r.watch && r.query.contains_key("sendInitialEvents"))
            .count();
        println!(
            "{name:<34} in sync {:>6.2} s, {:>7.1} MiB received ({} list requests, {} streaming watches), peak RSS at in-sync {:>6.1} MiB, at rest {:>6.1} MiB (peak {:>6.1})",
            in_sync.as_secs_f64(),
            bytes as f64 / (1 << 20) as f64,
            lists,
            watch_lists,
            mib(peak_in_sync),
            mib(r.rss_kib),
            mib(r.peak_kib),
        );
    }
}

// ---- churn ----

/// A long-running `ipset -` in the namespace: one `test` at a time.
struct Prober {
    child: Child,
    stdin: ChildStdin,
    stderr: BufReader<ChildStderr>,
}

impl Prober {
    fn start(ns: &NetNs) -> Prober {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "ipset", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ipset -");
        let stdin = child.stdin.take().unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        Prober {
            child,
            stdin,
            stderr,
        }
    }

    fn test(&mut self, set: &str, member: &str) -> bool {
        writeln!(self.stdin, "test {set} {member}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stderr.read_line(&mut line).unwrap();
        line.contains(" is in set ")
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the kernel must show after a probed event.
struct Expect {
    what: &'static str,
    sent: Instant,
    set: String,
    member: String,
    present: bool,
}

/// Set memberships at rest: member IP → [(set, member as written)].
fn memberships(ns: &NetNs) -> BTreeMap<String, Vec<(String, String)>> {
    let out = ns.exec_ok(&["ipset", "save"]);
    let mut by_ip: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in out.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("add") {
            continue;
        }
        let (Some(set), Some(member)) = (words.next(), words.next()) else {
            continue;
        };
        let ip = member.split(',').next().unwrap_or(member).to_string();
        by_ip
            .entry(ip)
            .or_default()
            .push((set.to_string(), member.to_string()));
    }
    by_ip
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn churn(s: Scale, seconds: u64, rate: u64, streaming: Streaming) {
    let cluster = Cluster::new(s);
    let mode = match streaming {
        Streaming::Served => "streaming lists",
        _ => "paginated lists, after a refusal",
    };
    println!(
        "## churn ({mode}): {} pods, {} policies, {} namespaces; {rate} pod events/s for {seconds} s",
        s.pods, s.policies, s.namespaces
    );
    let ns = NetNs::new("scale-churn");
    let work = TempDir::new("scale-churn");
    let api = api_in(&ns);
    api.set_streaming(streaming);
    for res in kube_api::ALL {
        api.limit_history(res, 100_000);
    }
    cluster.serve(&api);
    let mut agent = Agent::start(&ns, &work.path, Source::Kube(&api));
    let r = start_and_settle(&mut agent, "Kubernetes datastore in sync");
    println!(
        "initial sync ({mode}): in sync {:.2} s, first apply {:.2} s, {:.1} MiB received, RSS at rest {:.1} MiB (peak {:.1})",
        r.in_sync.as_secs_f64(),
        r.applied.as_secs_f64(),
        received(&api) as f64 / (1 << 20) as f64,
        mib(r.rss_kib),
        mib(r.peak_kib)
    );

    // Templates: remote pods whose IP is in some set, with a same-namespace pod whose labels
    // put it in a set the first is not in.
    let by_ip = memberships(&ns);
    let sets_of = |j: usize| -> BTreeSet<String> {
        by_ip
            .get(&pod_ip(j))
            .map(|v| v.iter().map(|(set, m)| format!("{set} {m}")).collect())
            .unwrap_or_default()
    };
    let mut templates: Vec<(usize, usize)> = Vec::new();
    for j in (s.local..s.pods).step_by(7) {
        let a = sets_of(j);
        if a.is_empty() {
            continue;
        }
        let mut k = j + s.namespaces;
        while k < s.pods && templates.len() < 400 {
            let b = sets_of(k);
            let a_sets: BTreeSet<&str> = a.iter().map(|x| x.split(' ').next().unwrap()).collect();
            if b.iter()
                .any(|x| !a_sets.contains(x.split(' ').next().unwrap()))
            {
                templates.push((j, k));
                break;
            }
            k += s.namespaces;
        }
        if templates.len() >= 400 {
            break;
        }
    }
    assert!(!templates.is_empty(), "no pod is in any IP set");
    let member_for = |j: usize, new_ip: &str, not_in: Option<usize>| -> (String, String) {
        let excluded: BTreeSet<String> = not_in
            .map(|n| {
                sets_of(n)
                    .into_iter()
                    .map(|x| x.split(' ').next().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let entry = sets_of(j)
            .into_iter()
            .find(|x| !excluded.contains(x.split(' ').next().unwrap()))
            .unwrap();
        let (set, member) = entry.split_once(' ').unwrap();
        (set.to_string(), member.replacen(&pod_ip(j), new_ip, 1))
    };

    let template: Value = serde_json::from_str(TYPICAL_POD).unwrap();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let lifecycles = (seconds * rate / 4) as usize;
    let (probe_tx, probe_rx) = mpsc::channel::<Expect>();
    let probe_rx = std::sync::Mutex::new(probe_rx);
    let results = std::sync::Mutex::new(Vec::<(&'static str, f64)>::new());
    let timeouts = std::sync::atomic::AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let bytes_before = received(&api);
    let cpu_before = agent.cpu_seconds();
    let started = Instant::now();
    let mut events = 0u64;
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let mut prober = Prober::start(&ns);
                loop {
                    let next = probe_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_millis(100));
                    let expect = match next {
                        Ok(e) => e,
                        Err(_) if done.load(Ordering::SeqCst) => return,
                        Err(_) => continue,
                    };
                    let deadline = expect.sent + Duration::from_secs(30);
                    loop {
                        if prober.test(&expect.set, &expect.member) == expect.present {
                            let ms = expect.sent.elapsed().as_secs_f64() * 1000.0;
                            results.lock().unwrap().push((expect.what, ms));
                            break;
                        }
                        if Instant::now() > deadline {
                            timeouts.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            });
        }
        // Each lifecycle: create pending (t), IP (t+1 s), relabel (t+2 s), delete (t+3 s).
        let mut rng = Rng(7);
        let stage = Duration::from_secs(1);
        let mut schedule: std::collections::BinaryHeap<std::cmp::Reverse<(Duration, usize, u8)>> =
            Default::default();
        for i in 0..lifecycles {
            schedule.push(std::cmp::Reverse((interval * 4 * i as u32, i, 0)));
        }
        let mut info: BTreeMap<usize, (usize, usize, String)> = BTreeMap::new();
        while let Some(std::cmp::Reverse((at, i, step))) = schedule.pop() {
            let now = started.elapsed();
            if at > now {
                std::thread::sleep(at - now);
            }
            let probed = i % 4 == 0;
            let name = format!("churn-{i}");
            match step {
                0 => {
                    let (a, b) = if probed {
                        templates[(i / 4) % templates.len()]
                    } else {
                        let a = s.local + rng.below(s.pods - s.local);
                        (a, (a + s.namespaces) % s.pods)
                    };
                    let ip = format!("10.{}.{}.{}", 200 + (i >> 16) % 50, (i >> 8) & 255, i & 255);
                    let pod = churn_pod(
                        &template,
                        &name,
                        &cluster.namespace_of(a),
                        &cluster.labels(a),
                        "node-7",
                        None,
                    );
                    api.put(pod);
                    info.insert(i, (a, b, ip));
                }
                1 => {
                    let (a, _, ip) = &info[&i];
                    let pod = churn_pod(
                        &template,
                        &name,
                        &cluster.namespace_of(*a),
                        &cluster.labels(*a),
                        "node-7",
                        Some(ip),
                    );
                    api.put(pod);
                    if probed {
                        let (set, member) = member_for(*a, ip, None);
                        let _ = probe_tx.send(Expect {
                            what: "IP assigned",
                            sent: Instant::now(),
                            set,
                            member,
                            present: true,
                        });
                    }
                }
                2 => {
                    let (a, b, ip) = &info[&i];
                    let pod = churn_pod(
                        &template,
                        &name,
                        &cluster.namespace_of(*a),
                        &cluster.labels(*b),
                        "node-7",
                        Some(ip),
                    );
                    api.put(pod);
                    if probed {
                        let (set, member) = member_for(*b, ip, Some(*a));
                        let _ = probe_tx.send(Expect {
                            what: "relabelled",
                            sent: Instant::now(),
                            set,
                            member,
                            present: true,
                        });
                    }
                }
                _ => {
                    let (a, b, ip) = info.remove(&i).unwrap();
                    api.delete(Res::Pods, &format!("{}/{name}", cluster.namespace_of(a)));
                    if probed {
                        let (set, member) = member_for(b, &ip, Some(a));
                        let _ = probe_tx.send(Expect {
                            what: "deleted",
                            sent: Instant::now(),
                            set,
                            member,
                            present: false,
                        });
                    }
                }
            }
            events += 1;
            if step < 3 {
                schedule.push(std::cmp::Reverse((at + stage, i, step + 1)));
            }
        }
        let wall = started.elapsed();
        // Let the last probes finish before stopping the probers.
        while results.lock().unwrap().len() + timeouts.load(Ordering::SeqCst)
            < lifecycles.div_ceil(4) * 3
            && started.elapsed() < wall + Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        done.store(true, Ordering::SeqCst);
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = agent.cpu_seconds() - cpu_before;
    let bytes = received(&api) - bytes_before;
    let results = results.into_inner().unwrap();
    println!(
        "{events} events in {wall:.1} s ({:.1}/s); agent CPU {cpu:.2} s = {:.3} CPU-s per 1k events ({:.1} % of a core); {:.2} MiB received = {:.1} KiB/s, {:.1} KiB/event",
        events as f64 / wall,
        cpu / events as f64 * 1000.0,
        cpu / wall * 100.0,
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / 1024.0 / wall,
        bytes as f64 / 1024.0 / events as f64,
    );
    let mut all: Vec<f64> = results.iter().map(|(_, ms)| *ms).collect();
    all.sort_by(f64::total_cmp);
    println!(
        "event → kernel (ipset test), all probes: n={} p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; timeouts (30 s) {}",
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
        timeouts.load(Ordering::SeqCst)
    );
    for what in ["IP assigned", "relabelled", "deleted"] {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|(w, _)| *w == what)
            .map(|(_, ms)| *ms)
            .collect();
        v.sort_by(f64::total_cmp);
        println!(
            "  {what:<12} n={:<4} p50 {:>7.1} ms, p99 {:>7.1} ms",
            v.len(),
            percentile(&v, 0.5),
            percentile(&v, 0.99)
        );
    }
    std::thread::sleep(SETTLE);
    println!(
        "RSS after churn {:.1} MiB (peak {:.1})",
        mib(agent.status_kib("VmRSS:")),
        mib(agent.status_kib("VmHWM:"))
    );
}

fn main() {
    common::require_root();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let flag = |name: &str| -> Option<usize> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name} {v:?} is not a number"))
            })
    };
    let small = scale(10_000, 1_000, 300, 1500);
    let large = scale(150_000, 10_000, 5_000, 1500);
    let mut chosen = if args.iter().any(|a| a == "10k") {
        small
    } else {
        large
    };
    if let Some(p) = flag("--pods") {
        chosen.pods = p;
    }
    if let Some(p) = flag("--policies") {
        chosen.policies = p;
    }
    if let Some(n) = flag("--namespaces") {
        chosen.namespaces = n;
    }
    if let Some(l) = flag("--local") {
        chosen.local = l;
    }
    let seconds = flag("--seconds").unwrap_or(60) as u64;
    // The server refuses streaming lists: the agent lists in pages.
    let list_mode = if args.iter().any(|a| a == "--paginated") {
        Streaming::Refused
    } else {
        Streaming::Served
    };
    let rate = flag("--rate").unwrap_or(100) as u64;
    match args.first().map(String::as_str) {
        Some("rest") => {
            let only = |name: &str| args.iter().any(|a| a == name);
            rest(chosen, !only("--kube-only"), !only("--dir-only"))
        }
        Some("lists") => lists(chosen),
        Some("churn") => churn(chosen, seconds, rate, list_mode),
        Some("all") | None => {
            rest(small, true, true);
            rest(large, true, true);
            lists(large);
            churn(large, seconds, rate, Streaming::Served);
            churn(large, seconds, rate, Streaming::Refused);
        }
        Some(other) => panic!("unknown scenario {other:?}: rest, lists, churn or all"),
    }
}
