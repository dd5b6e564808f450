//! Dataplane benchmark: the calc graph and the kernel writers together, against the real
//! kernel. Prints figures, asserts nothing about time.
//!
//! `cargo bench --bench dataplane [-- SCENARIO...]` must run as root (scenario names, from
//! `SCENARIOS`, run only those). Every scenario runs in its own child
//! process (so memory and timings do not bleed from one into the next) and works in network
//! namespaces it creates (`ip netns add npa-bench-<pid>-<n>`) and deletes when it ends, also
//! on panic (a Drop guard; the parent also sweeps `npa-bench-<child pid>-*` after each
//! child). `Dataplane` programs them with the iptables legacy (or, with
//! `NETPOL_BENCH_BACKEND=nft`, nft) backend from a thread that entered the namespace
//! (`common::in_netns`) for every call, with `Exec::default()`: its programs are spawned
//! as the agent spawns its own in its namespace, and so are the floor's timed restores; no
//! `ip netns exec` wrapper (about 1.5 ms a program here) is timed on either side. The
//! synthetic cluster comes from `support/synthetic.rs` (10k pods, 1k policies, 300
//! namespaces; shared with the calc graph benchmark). Every scenario runs
//! twice: IPv4 only, and dual-stack (`-dual`: every pod has an IPv4 and an IPv6 address,
//! every ipBlock comes in both families, the graph renders both and every change is applied
//! as the agent applies it with IPv6 on: one `ipset restore` per family and phase, one
//! `iptables-restore` and one `ip6tables-restore`; the floor likewise restores both
//! families). Figures are printed per scenario with `[ipv4]` or `[dual]` in front, the dual
//! line right after its IPv4 one.
//!
//! Scenarios:
//! - cold start with 110 and with 1500 local pods: wall time from feeding the first object
//!   to the first `Dataplane::apply` returning (graph, then kernel: ipset restore,
//!   iptables-save + iptables-restore, as the agent does them; `Dataplane::new`, which reads
//!   the existing sets, happens before and is not counted), and the lines written. The floor
//!   is a bare `ipset restore` + `iptables-legacy-restore --noflush` of exactly the full
//!   desired state (the `rules::sets::restore_script` and `rules::render::restore_script` of
//!   `graph.snapshot()`) into a second fresh namespace, timed, with its line count.
//! - one pod label change (200 repetitions: 3/4 remote pods moved to another app, 1/4 local
//!   pods moved to an app that changes which policies of their namespace select them) and one
//!   policy added (50 repetitions, each selecting a local pod): per repetition the wall time
//!   from the event (`upsert_pod` / `upsert_policy`) to `apply` returning (flush + absorb +
//!   apply), and the lines written. The floor is what really had to change, computed from
//!   each `Update`: ipset member additions and deletions and set creations and destructions
//!   (the members of a created set are among the additions); for iptables, per upserted chain
//!   the rules whose hash is not in the chain's previous version plus the previous version's
//!   rules whose hash is not in the new one (a new chain: its declaration and all its rules),
//!   plus one line per removed chain. The floor is also timed: a mirror namespace got the
//!   same cold-start state by a bare restore, and each change's floor lines are applied there
//!   by bare restores (ipset `create`/`add`/`del`, then iptables `:chain` + `-A` for new
//!   chains, `-D chain <body>` for removed rules, `-I chain <final position> <body>` in
//!   ascending position for added ones, `-F` + `-X` for removed chains, then ipset
//!   `destroy`): the agent's order, where member deletions ride with the additions before
//!   iptables, as felix's do.
//!   Per scenario one line `ours p50/p99/max ms | floor p50/p99 ms | lines ours/floor
//!   (ratio)`, then (label change) the same figures for local and remote pods apart.
//!
//! The ClusterNetworkPolicy variant (`-cnp`, IPv4): the same cluster with 50 Admin and 50
//! Baseline ClusterNetworkPolicies beside its 1k NetworkPolicies (`support/synthetic.rs`),
//! cold start, label change and policy added as above, and one more event: a
//! ClusterNetworkPolicy added (50 repetitions, alternating Admin and Baseline, each a shape
//! of the generator whose subject is narrowed to one local pod's namespace and app), with its
//! floor computed the same way. The figures of the plain scenarios come from the same run.
//!
//! Cold-start objects are generated as they are fed (as in the calc graph benchmark), so
//! the graph time includes building them; the incremental events are built before the
//! clock starts. At the end of every scenario our namespace is compared with a fresh one
//! that got the complete desired state by a bare restore, and the floor's namespace with
//! ours; this is printed, not asserted. The floor keeps the rules that survive in a chain
//! in their old order, so where those change places (identical rules are told apart by
//! occurrence, so inserting one shifts the hashes of the later copies) the mirror can
//! differ from ours in rule order only.
//!
//! Lines are restore-input lines without the `*filter` / `COMMIT` framing. The agent's
//! iptables lines come from `ApplyReport`; its ipset lines from the `lines` field of the
//! ipset writer's "ipset restore" debug event (the same figure as `IpsetStats::lines`),
//! captured with a tracing layer that enables nothing else below warn.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::Layer;

use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::calc_graph::update::Update;
use netpol_agent::dataplane::iptables::Backend;
use netpol_agent::dataplane::{Dataplane, DataplaneConfig};
use netpol_agent::host::exec::Exec;
use netpol_agent::model::cluster_policy::{NamespacedPod, Subject};
use netpol_agent::model::{ClusterNetworkPolicy, IpFamily};
use netpol_agent::rules::sets::{SetSpec, DEFAULT_MAX_SET_SIZE};
use netpol_agent::rules::{Chain, RuleConfig};

use synthetic::{
    build, cluster_policy, pod, pod_namespace, policies, policy, sel, selected_app, Rng, Scale,
    APPS,
};

const NETNS_PREFIX: &str = "npa-bench-";
/// `NETPOL_BENCH_BACKEND=nft` measures the nft backend; legacy by default.
fn bench_backend() -> Backend {
    match std::env::var("NETPOL_BENCH_BACKEND").as_deref() {
        Ok("nft") => Backend::Nft,
        _ => Backend::Legacy,
    }
}

fn iptables_tool(family: IpFamily, action: &str) -> String {
    let base = match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    };
    match bench_backend() {
        Backend::Nft => format!("{base}-nft-{action}"),
        Backend::Legacy => format!("{base}-legacy-{action}"),
    }
}
/// Seed of the synthetic cluster.
const SEED: u64 = 42;
const SCENARIOS: [&str; 12] = [
    "cold-110",
    "cold-110-dual",
    "label-change",
    "label-change-dual",
    "policy-add",
    "policy-add-dual",
    "cold-1500",
    "cold-1500-dual",
    "cold-110-cnp",
    "label-change-cnp",
    "policy-add-cnp",
    "cnp-add",
];

/// ClusterNetworkPolicies per tier in the `-cnp` scenarios.
const CLUSTER_POLICIES: usize = 50;

fn scale(local: usize, dual: bool, cluster_policies: usize) -> Scale {
    Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local,
        dual,
        cluster_policies,
    }
}

/// `[ipv4]` or `[dual]` (`[ipv4+cnp]` with ClusterNetworkPolicies), in front of every
/// figure line.
fn tag(scale: Scale) -> &'static str {
    if scale.cluster_policies > 0 {
        "[ipv4+cnp]"
    } else if scale.dual {
        "[dual]"
    } else {
        "[ipv4]"
    }
}

// ---- network namespaces and bare restores ----

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace deleted (with its rules and sets) when dropped, also on panic.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new() -> NetNs {
        let name = format!(
            "{NETNS_PREFIX}{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        run_ok(Command::new("ip").args(["netns", "add", &name]), "");
        NetNs { name }
    }

    fn exec(&self) -> Exec {
        Exec::in_netns(&self.name)
    }

    /// Runs `f` on a thread inside the namespace (`common::in_netns`). What is timed runs
    /// so: its programs are started with `Exec::default()`, by `posix_spawn` from a thread
    /// in the namespace, as the agent starts its own. (`Exec::in_netns` forks to enter in the
    /// child, which costs the bench 0.7 ms more per program at its 19 MB than the agent
    /// pays.)
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        common::in_netns(&self.name, f)
    }

    /// Runs `program args` in the namespace with `input` on stdin; returns its stdout.
    fn run(&self, program: &str, args: &[&str], input: &str) -> String {
        let mut cmd = self.exec().command(program);
        cmd.args(args);
        run_ok(&mut cmd, input)
    }

    /// The namespace's filter tables (of `families`, IPv6 lines tagged `v6 `) and our IP
    /// sets, in a form that two namespaces holding the same rules and sets print
    /// identically: save comments dropped; sets sorted, `create` lines cut to name and type
    /// (hash size and initval vary).
    fn state(&self, families: &[IpFamily]) -> (Vec<String>, Vec<String>) {
        let mut rules = Vec::new();
        for &family in families {
            let tag = if family == IpFamily::V6 { "v6 " } else { "" };
            rules.extend(
                self.run(&iptables_tool(family, "save"), &["-t", "filter"], "")
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| format!("{tag}{l}")),
            );
        }
        let mut sets: Vec<String> = self
            .run("ipset", &["save"], "")
            .lines()
            .map(|l| {
                if l.starts_with("create ") {
                    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
                } else {
                    l.to_string()
                }
            })
            .collect();
        sets.sort();
        (rules, sets)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .status();
    }
}

/// Runs `cmd` with `input` on stdin and returns its stdout; panics with its stderr if it
/// cannot start or fails.
fn run_ok(cmd: &mut Command, input: &str) -> String {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    // The input is written from a thread while stdout and stderr are drained here, so a
    // large input and a chatty command cannot block each other.
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("cannot wait for {what}: {e}"));
    let written = writer.join().expect("stdin writer thread panicked");
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    written.unwrap_or_else(|e| panic!("writing the input of {what}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the namespaces a (crashed) child left behind.
fn sweep_netns(pid: u32) -> usize {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .stdin(Stdio::null())
        .output()
        .expect("cannot run ip netns list");
    let prefix = format!("{NETNS_PREFIX}{pid}-");
    let mut swept = 0;
    for name in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
    {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        swept += 1;
    }
    swept
}

/// Restore scripts, each without framing; empty when there is nothing to do.
#[derive(Default)]
struct Scripts {
    /// `ipset restore` input before iptables (creations, additions, then member deletions).
    ipset_before: String,
    /// `iptables-restore --noflush` lines of the filter table, per family.
    iptables: BTreeMap<IpFamily, String>,
    /// `ipset restore` input after iptables (destructions).
    ipset_after: String,
    /// Lines that count (see the module documentation).
    lines: usize,
}

impl Scripts {
    /// Runs the scripts in `ns` in dataplane order, timed (processes included).
    fn apply(&self, ns: &NetNs) -> Duration {
        let iptables: Vec<(IpFamily, String)> = self
            .iptables
            .iter()
            .filter(|(_, body)| !body.is_empty())
            .map(|(f, body)| (*f, format!("*filter\n{body}COMMIT\n")))
            .collect();
        let run = |program: &str, args: &[&str], input: &str| {
            let mut cmd = Exec::default().command(program);
            run_ok(cmd.args(args), input);
        };
        ns.inside(|| {
            let start = Instant::now();
            if !self.ipset_before.is_empty() {
                run("ipset", &["restore"], &self.ipset_before);
            }
            for (family, script) in &iptables {
                run(&iptables_tool(*family, "restore"), &["--noflush"], script);
            }
            if !self.ipset_after.is_empty() {
                run("ipset", &["restore"], &self.ipset_after);
            }
            start.elapsed()
        })
    }
}

/// The complete desired state of every family the graph renders as the bare restore
/// scripts of `compile`.
fn full_scripts(graph: &Calculation) -> (Scripts, usize, usize) {
    let state = graph.snapshot();
    let cfg = RuleConfig::default();
    let mut scripts = Scripts::default();
    let (mut ipset_lines, mut iptables_lines) = (0, 0);
    for (&family, fam) in &state.families {
        let RestoreScripts {
            ipsets: ipset,
            iptables,
        } = fam.restore_scripts(&cfg, family, DEFAULT_MAX_SET_SIZE);
        // Without the `*filter` and `COMMIT` framing, which `Scripts::apply` adds back.
        let body: Vec<&str> = iptables
            .lines()
            .filter(|l| *l != "*filter" && *l != "COMMIT")
            .collect();
        ipset_lines += ipset.lines().count();
        iptables_lines += body.len();
        scripts.ipset_before.push_str(&ipset);
        scripts
            .iptables
            .insert(family, body.iter().map(|l| format!("{l}\n")).collect());
    }
    scripts.lines = ipset_lines + iptables_lines;
    (scripts, ipset_lines, iptables_lines)
}

/// Our chains by family and name.
type Chains = BTreeMap<(IpFamily, String), std::sync::Arc<Chain>>;

/// The floor of one update (see the module documentation), as restore scripts. `chains`:
/// our chains before the update; brought to after it.
fn floor_scripts(update: &Update, chains: &mut Chains) -> Scripts {
    use fmt::Write as _;
    let mut s = Scripts::default();
    // Writing to a String cannot fail.
    for h in &update.sets_created {
        let spec = SetSpec {
            name: h.name.clone(),
            family: h.family,
            set_type: h.set_type,
            members: BTreeSet::new(),
        };
        let _ = writeln!(s.ipset_before, "{}", spec.create_line(DEFAULT_MAX_SET_SIZE));
        s.lines += 1;
    }
    for (name, members) in &update.members_added {
        for m in members {
            let _ = writeln!(s.ipset_before, "add {name} {m}");
            s.lines += 1;
        }
    }
    for (name, members) in &update.members_removed {
        for m in members {
            let _ = writeln!(s.ipset_before, "del {name} {m}");
            s.lines += 1;
        }
    }
    for (_, name) in &update.sets_removed {
        let _ = writeln!(s.ipset_after, "destroy {name}");
        s.lines += 1;
    }

    // Per family: declarations, appends to new chains, edits, removals.
    let mut parts: BTreeMap<IpFamily, [String; 4]> = BTreeMap::new();
    for (family, chain) in &update.chains_upserted {
        let [declares, appends, edits, _] = parts.entry(*family).or_default();
        let name = &chain.name;
        match chains.get(&(*family, name.clone())) {
            None => {
                let _ = writeln!(declares, ":{name} - [0:0]");
                for r in &chain.rules {
                    let _ = writeln!(appends, "-A {name} {}", r.body);
                }
                s.lines += 1 + chain.rules.len();
            }
            Some(old) => {
                let new_hashes: HashSet<&str> =
                    chain.rules.iter().map(|r| r.hash.as_str()).collect();
                let old_hashes: HashSet<&str> = old.rules.iter().map(|r| r.hash.as_str()).collect();
                for r in old
                    .rules
                    .iter()
                    .filter(|r| !new_hashes.contains(r.hash.as_str()))
                {
                    let _ = writeln!(edits, "-D {name} {}", r.body);
                    s.lines += 1;
                }
                for (i, r) in chain.rules.iter().enumerate() {
                    if !old_hashes.contains(r.hash.as_str()) {
                        let _ = writeln!(edits, "-I {name} {} {}", i + 1, r.body);
                        s.lines += 1;
                    }
                }
            }
        }
    }
    for (family, name) in &update.chains_removed {
        let [_, _, _, removals] = parts.entry(*family).or_default();
        if chains
            .get(&(*family, name.clone()))
            .is_some_and(|c| !c.rules.is_empty())
        {
            let _ = writeln!(removals, "-F {name}");
        }
        let _ = writeln!(removals, "-X {name}");
        s.lines += 1;
    }
    for (family, [declares, appends, edits, removals]) in parts {
        s.iptables
            .insert(family, declares + &appends + &edits + &removals);
    }

    for (family, chain) in &update.chains_upserted {
        chains.insert((*family, chain.name.clone()), chain.clone());
    }
    for (family, name) in &update.chains_removed {
        chains.remove(&(*family, name.clone()));
    }
    s
}

// ---- counting the ipset writer's lines ----

static IPSET_LINES: AtomicU64 = AtomicU64::new(0);

/// Adds up the `lines` field of the ipset writer's "ipset restore" debug events.
struct IpsetLineCounter;

impl<S: tracing::Subscriber> Layer<S> for IpsetLineCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Lines(Option<u64>);
        impl Visit for Lines {
            fn record_u64(&mut self, field: &Field, value: u64) {
                if field.name() == "lines" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &Field, _: &dyn fmt::Debug) {}
        }
        let mut lines = Lines(None);
        event.record(&mut lines);
        if let Some(n) = lines.0 {
            IPSET_LINES.fetch_add(n, Ordering::Relaxed);
        }
    }
}

fn init_tracing() {
    tracing_subscriber::registry()
        .with(IpsetLineCounter.with_filter(
            Targets::new().with_target("netpol_agent::dataplane::ipsets", LevelFilter::DEBUG),
        ))
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(LevelFilter::WARN),
        )
        .try_init()
        .expect("cannot install the tracing subscriber");
}

fn ipset_lines() -> u64 {
    IPSET_LINES.load(Ordering::Relaxed)
}

// ---- scenarios ----

/// The dataplane under test, for namespace `ns`: every call to it must be made from inside
/// (`ns.inside`), as the agent runs in its own.
fn new_dataplane(ns: &NetNs, families: Vec<IpFamily>) -> Dataplane {
    ns.inside(|| {
        Dataplane::new(&DataplaneConfig {
            families,
            rules: RuleConfig::default(),
            backend: bench_backend(),
            ownership: netpol_agent::agent::OWNERSHIP,
            interest: netpol_agent::agent::ours(),
            max_set_size: DEFAULT_MAX_SET_SIZE,
            exec: Exec::default(),
        })
        .expect("cannot set up the dataplane")
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(ours: usize, floor: usize) -> String {
    if floor == 0 {
        "-".into()
    } else {
        format!("{:.2}", ours as f64 / floor as f64)
    }
}

/// A cluster fed and applied to a namespace (`ours`), and the same state restored bare into
/// another (`mirror`).
struct Started {
    scale: Scale,
    graph: Calculation,
    /// The app label value of each pod.
    apps: Vec<usize>,
    /// Per namespace index, the apps that its app-selecting policies ask for.
    selected_apps: BTreeMap<usize, BTreeSet<usize>>,
    dataplane: Dataplane,
    ours: NetNs,
    mirror: NetNs,
    /// Our chains as of the last update, for the floor of the next.
    chains: Chains,
}

struct ColdStart {
    started: Started,
    graph_time: Duration,
    total: Duration,
    ipset_lines: usize,
    iptables_lines: usize,
    floor_time: Duration,
    floor_ipset_lines: usize,
    floor_iptables_lines: usize,
}

fn cold_start(scale: Scale) -> ColdStart {
    let ours = NetNs::new();
    let mirror = NetNs::new();
    let mut dataplane = new_dataplane(&ours, scale.families());
    let mut rng = Rng(SEED);
    let ipset_before = ipset_lines();

    let (graph, apps, graph_time, report, total) = ours.inside(|| {
        let start = Instant::now();
        let (mut graph, apps) = build(scale, &mut rng);
        let update = graph.flush();
        let graph_time = start.elapsed();
        dataplane.absorb(&update);
        let report = dataplane.apply().expect("cold-start apply failed");
        (graph, apps, graph_time, report, start.elapsed())
    });
    let ipset_written = (ipset_lines() - ipset_before) as usize;

    let mut selected_apps: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (k, np) in policies(scale, SEED).enumerate() {
        if let Some(app) = selected_app(&np) {
            selected_apps
                .entry(k % scale.namespaces)
                .or_default()
                .insert(app);
        }
    }
    let (floor, floor_ipset_lines, floor_iptables_lines) = full_scripts(&graph);
    let floor_time = floor.apply(&mirror);
    let chains: Chains = graph
        .snapshot()
        .families
        .into_iter()
        .flat_map(|(family, f)| {
            f.chains
                .into_iter()
                .map(move |(name, chain)| ((family, name), chain))
        })
        .collect();
    ColdStart {
        started: Started {
            scale,
            graph,
            apps,
            selected_apps,
            dataplane,
            ours,
            mirror,
            chains,
        },
        graph_time,
        total,
        ipset_lines: ipset_written,
        iptables_lines: report.iptables_lines,
        floor_time,
        floor_ipset_lines,
        floor_iptables_lines,
    }
}

/// iptables-save lines by chain (`:` declarations under their own key).
fn by_chain(lines: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in lines {
        let key = match l.strip_prefix("-A ") {
            Some(rest) => rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string(),
            None => ":".into(),
        };
        out.entry(key).or_default().push(l.clone());
    }
    out
}

/// How `b` (a namespace's `NetNs::state`) differs from `a`: "same", or which chains differ
/// only in rule order, which in content, and whether the sets differ.
fn diff_state(a: &(Vec<String>, Vec<String>), b: &(Vec<String>, Vec<String>)) -> String {
    if a == b {
        return "same".into();
    }
    let (ca, cb) = (by_chain(&a.0), by_chain(&b.0));
    let names: BTreeSet<&String> = ca.keys().chain(cb.keys()).collect();
    let (mut order, mut content) = (0, 0);
    for name in names {
        let (x, y) = (ca.get(name), cb.get(name));
        if x == y {
            continue;
        }
        let sorted = |v: Option<&Vec<String>>| {
            let mut v = v.cloned().unwrap_or_default();
            v.sort();
            v
        };
        if sorted(x) == sorted(y) {
            order += 1;
        } else {
            content += 1;
        }
    }
    format!(
        "{content} chains differ in content, {order} only in rule order, sets {}",
        if a.1 == b.1 { "same" } else { "DIFFER" }
    )
}

/// Checks, at the end of a scenario, our namespace against a fresh one restored with the
/// complete desired state, and the mirror against ours.
fn check(started: &Started) -> String {
    let desired_ns = NetNs::new();
    full_scripts(&started.graph).0.apply(&desired_ns);
    let families = started.scale.families();
    let desired = desired_ns.state(&families);
    let ours = started.ours.state(&families);
    format!(
        "ours vs desired state: {}; floor mirror vs ours: {}",
        diff_state(&desired, &ours),
        diff_state(&ours, &started.mirror.state(&families)),
    )
}

fn cold_scenario(local: usize, dual: bool, cluster_policies: usize) {
    let c = cold_start(scale(local, dual, cluster_policies));
    let s = &c.started;
    let ours_lines = c.ipset_lines + c.iptables_lines;
    let floor_lines = c.floor_ipset_lines + c.floor_iptables_lines;
    let families = s.scale.families();
    println!(
        "{} cold start    pods={} policies={} local={} (active policies {}, cluster {}, chains {}): ours {:.1} ms (graph {:.1} + kernel {:.1}) | floor {:.1} ms | lines ours/floor {}/{} ({}) [ipset {}/{}, iptables {}/{}] | ours vs floor namespace: {}",
        tag(s.scale),
        s.scale.pods,
        s.scale.policies,
        s.graph.local_endpoint_count(),
        s.graph.active_policy_count(),
        s.graph.active_cluster_policy_count(),
        s.chains.len(),
        ms(c.total),
        ms(c.graph_time),
        ms(c.total - c.graph_time),
        ms(c.floor_time),
        ours_lines,
        floor_lines,
        ratio(ours_lines, floor_lines),
        c.ipset_lines,
        c.floor_ipset_lines,
        c.iptables_lines,
        c.floor_iptables_lines,
        diff_state(&s.mirror.state(&families), &s.ours.state(&families)),
    );
}

enum Event<'a> {
    Pod(&'a Pod),
    Policy(&'a NetworkPolicy),
    ClusterPolicy(&'a ClusterNetworkPolicy),
}

/// One repetition of an incremental scenario.
struct Sample {
    /// Which kind of change (for the breakdown).
    class: &'static str,
    /// Event to `apply` returning.
    ours: Duration,
    /// Event to `flush` returning (the graph's share of `ours`).
    graph: Duration,
    /// The floor scripts in the mirror namespace.
    floor: Duration,
    ours_lines: usize,
    floor_lines: usize,
    /// Whether the update changed anything at all, and any of our chains.
    nonempty: bool,
    chains: bool,
}

impl Started {
    /// One event through graph and kernel, then its floor through the mirror.
    fn step(&mut self, class: &'static str, event: Event<'_>) -> Sample {
        let ipset_before = ipset_lines();
        let (graph_state, dataplane) = (&mut self.graph, &mut self.dataplane);
        let (update, graph, report, ours) = self.ours.inside(|| {
            let start = Instant::now();
            match event {
                Event::Pod(p) => graph_state.upsert_pod(p),
                Event::Policy(np) => graph_state.upsert_policy(np),
                Event::ClusterPolicy(cnp) => graph_state.upsert_cluster_policy(cnp),
            }
            let update = graph_state.flush();
            let graph = start.elapsed();
            dataplane.absorb(&update);
            let report = dataplane.apply().expect("apply failed");
            (update, graph, report, start.elapsed())
        });
        let ours_lines = report.iptables_lines + (ipset_lines() - ipset_before) as usize;

        let floor = floor_scripts(&update, &mut self.chains);
        Sample {
            class,
            ours,
            graph,
            floor: floor.apply(&self.mirror),
            ours_lines,
            floor_lines: floor.lines,
            nonempty: !update.is_empty(),
            chains: !update.chains_upserted.is_empty() || !update.chains_removed.is_empty(),
        }
    }
}

/// Nearest-rank percentile.
fn pct(samples: &[&Sample], p: usize, get: impl Fn(&Sample) -> Duration) -> Duration {
    let mut v: Vec<Duration> = samples.iter().map(|s| get(s)).collect();
    v.sort();
    let rank = (v.len() * p).div_ceil(100).max(1);
    v.get(rank - 1).copied().unwrap_or_default()
}

/// The figures of `samples`: `ours p50/p99/max ms | floor p50/p99 ms | lines ours/floor
/// (ratio)`, then the graph's share and how many updates changed anything.
fn figures(samples: &[&Sample]) -> String {
    let ours_lines: usize = samples.iter().map(|s| s.ours_lines).sum();
    let floor_lines: usize = samples.iter().map(|s| s.floor_lines).sum();
    format!(
        "ours p50/p99/max {:.2}/{:.2}/{:.2} ms | floor p50/p99 {:.2}/{:.2} ms | lines ours/floor {}/{} ({}) | graph p50/p99 {:.3}/{:.3} ms | {} of {} updates non-empty, {} touch chains",
        ms(pct(samples, 50, |s| s.ours)),
        ms(pct(samples, 99, |s| s.ours)),
        ms(pct(samples, 100, |s| s.ours)),
        ms(pct(samples, 50, |s| s.floor)),
        ms(pct(samples, 99, |s| s.floor)),
        ours_lines,
        floor_lines,
        ratio(ours_lines, floor_lines),
        ms(pct(samples, 50, |s| s.graph)),
        ms(pct(samples, 99, |s| s.graph)),
        samples.iter().filter(|s| s.nonempty).count(),
        samples.len(),
        samples.iter().filter(|s| s.chains).count(),
    )
}

/// Prints the scenario's figures, a breakdown by class when there are several, and the
/// end-of-scenario check of both namespaces.
fn report(what: &str, started: &Started, samples: &[Sample]) {
    let all: Vec<&Sample> = samples.iter().collect();
    println!("{} {what}: {}", tag(started.scale), figures(&all));
    let classes: BTreeSet<&str> = samples.iter().map(|s| s.class).collect();
    if classes.len() > 1 {
        for class in classes {
            let some: Vec<&Sample> = samples.iter().filter(|s| s.class == class).collect();
            println!("  {class:>6} {:>3} reps: {}", some.len(), figures(&some));
        }
    }
    println!("  end state: {}", check(started));
}

fn label_change_scenario(dual: bool, cluster_policies: usize) {
    let mut st = cold_start(scale(110, dual, cluster_policies)).started;
    let sc = st.scale;
    let selected = st.selected_apps.clone();
    let local_candidates: Vec<usize> = (0..sc.local)
        .filter(|&j| selected.contains_key(&pod_namespace(j, sc)))
        .collect();
    assert!(
        !local_candidates.is_empty(),
        "no local pod has an app-selecting policy in its namespace"
    );
    let reps = 200;
    let mut samples = Vec::with_capacity(reps);
    let mut rng = Rng(7);
    for r in 0..reps {
        let local = r % 4 == 0;
        let j = if local {
            // A local pod moved into (or out of) the apps its namespace's policies select.
            let j = local_candidates[rng.below(local_candidates.len())];
            let apps = selected
                .get(&pod_namespace(j, sc))
                .expect("local candidates have app-selecting policies");
            st.apps[j] = if apps.contains(&st.apps[j]) {
                let outside: Vec<usize> = (0..APPS).filter(|a| !apps.contains(a)).collect();
                outside[rng.below(outside.len())]
            } else {
                let inside: Vec<usize> = apps.iter().copied().collect();
                inside[rng.below(inside.len())]
            };
            j
        } else {
            let j = sc.local + rng.below(sc.pods - sc.local);
            st.apps[j] = (st.apps[j] + 1 + rng.below(APPS - 1)) % APPS;
            j
        };
        let p = pod(j, sc, st.apps[j]);
        samples.push(st.step(if local { "local" } else { "remote" }, Event::Pod(&p)));
    }
    report(
        &format!(
            "label change  pods={} local={} {reps} reps (3/4 remote, 1/4 local with a selection change)",
            sc.pods, sc.local
        ),
        &st,
        &samples,
    );
}

fn policy_add_scenario(dual: bool, cluster_policies: usize) {
    let mut st = cold_start(scale(110, dual, cluster_policies)).started;
    let sc = st.scale;
    let reps = 50;
    let mut samples = Vec::with_capacity(reps);
    let mut rng = Rng(11);
    for r in 0..reps {
        // A policy of shape r % 5 in a local pod's namespace, selecting that pod by app.
        let j = rng.below(sc.local);
        let mut np = policy(r, sc, &mut rng);
        np.metadata.name = Some(format!("pol-added-{r}"));
        np.metadata.namespace = Some(format!("ns-{}", pod_namespace(j, sc)));
        if let Some(spec) = np.spec.as_mut() {
            spec.pod_selector = Some(sel(&[("app", format!("app-{}", st.apps[j]))]));
        }
        samples.push(st.step("policy", Event::Policy(&np)));
    }
    report(
        &format!(
            "policy added  pods={} local={} {reps} reps (each selects a local pod)",
            sc.pods, sc.local
        ),
        &st,
        &samples,
    );
}

fn cluster_policy_add_scenario() {
    let mut st = cold_start(scale(110, false, CLUSTER_POLICIES)).started;
    let sc = st.scale;
    let reps = 50;
    let mut samples = Vec::with_capacity(reps);
    let mut rng = Rng(13);
    for r in 0..reps {
        // A shape of the generator, its subject narrowed to one local pod's namespace and app.
        let j = rng.below(sc.local);
        let admin = r % 2 == 0;
        let mut cnp = cluster_policy(r, admin, sc, &mut rng);
        cnp.metadata.name = Some(format!("cnp-added-{r}"));
        if let Some(spec) = cnp.spec.as_mut() {
            let ns = format!("ns-{}", pod_namespace(j, sc));
            spec.subject = Some(Subject {
                pods: Some(NamespacedPod {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(
                            [("kubernetes.io/metadata.name".to_string(), ns)].into(),
                        ),
                        match_expressions: None,
                    }),
                    pod_selector: Some(sel(&[("app", format!("app-{}", st.apps[j]))])),
                }),
                ..Default::default()
            });
        }
        samples.push(st.step(
            if admin { "admin" } else { "baseline" },
            Event::ClusterPolicy(&cnp),
        ));
    }
    report(
        &format!(
            "cluster policy added  pods={} local={} {reps} reps (alternating Admin and Baseline, each selects a local pod)",
            sc.pods, sc.local
        ),
        &st,
        &samples,
    );
}

fn is_root() -> bool {
    // Effective uid: the second field of the `Uid:` line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                .map(|uid| uid == "0")
        })
        .unwrap_or(false)
}

fn main() {
    assert!(
        is_root(),
        "the dataplane benchmark programs iptables and ipsets in network namespaces and must run as root"
    );
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--scenario") {
        init_tracing();
        match args.get(pos + 1).map(String::as_str) {
            Some("cold-110") => cold_scenario(110, false, 0),
            Some("cold-110-dual") => cold_scenario(110, true, 0),
            Some("label-change") => label_change_scenario(false, 0),
            Some("label-change-dual") => label_change_scenario(true, 0),
            Some("policy-add") => policy_add_scenario(false, 0),
            Some("policy-add-dual") => policy_add_scenario(true, 0),
            Some("cold-1500") => cold_scenario(1500, false, 0),
            Some("cold-1500-dual") => cold_scenario(1500, true, 0),
            Some("cold-110-cnp") => cold_scenario(110, false, CLUSTER_POLICIES),
            Some("label-change-cnp") => label_change_scenario(false, CLUSTER_POLICIES),
            Some("policy-add-cnp") => policy_add_scenario(false, CLUSTER_POLICIES),
            Some("cnp-add") => cluster_policy_add_scenario(),
            other => panic!("unknown scenario {other:?}"),
        }
        return;
    }
    let exe = std::env::current_exe().expect("cannot find the benchmark's own path");
    // Scenario names on the command line run only those (`-- label-change cnp-add`).
    let chosen: Vec<&str> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| args.iter().any(|a| a == s))
        .collect();
    let run = if chosen.is_empty() {
        SCENARIOS.to_vec()
    } else {
        chosen
    };
    for scenario in run {
        let mut child = Command::new(&exe)
            .args(["--scenario", scenario])
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start scenario {scenario}: {e}"));
        let status = child
            .wait()
            .unwrap_or_else(|e| panic!("cannot wait for scenario {scenario}: {e}"));
        let swept = sweep_netns(child.id());
        if swept > 0 {
            eprintln!("scenario {scenario} left {swept} network namespaces; deleted them");
        }
        assert!(status.success(), "scenario {scenario} failed ({status})");
    }
    println!("targets: event → kernel p99 ≤ 20 ms; lines written ≤ 2 × floor; 1500 local pods cold start < 5 s");
}
