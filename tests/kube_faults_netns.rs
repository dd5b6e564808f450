//! The real `netpol-agent run` on the Kubernetes datastore, in a network namespace, against a
//! local API server (`kube_api`) that misbehaves the way real ones do, for a seeded random
//! sequence of rounds. Each round starts a fault storm drawn at random:
//! - `aborts`: every open watch reset in the middle of its stream, again and again; in half
//!   of them every new watch is also answered and ended at once, without an event (a proxy
//!   with a broken backend);
//! - `gone`: a 410 storm: history compacted and every watch expired (an `ERROR` 410 event, or
//!   an HTTP 410 when resumed) again and again, and every `continue` token refused, so each
//!   resume and each relist meets 410;
//! - `errors`: every request answered 500, 503 or 429 (`Retry-After`) for a while, watches cut;
//! - `refused`: the server gone (listener closed, connections dropped, new ones refused), then
//!   back at the same address;
//! - `garbled`: watch streams cut in the middle of an event, or fed bytes that are no event;
//!
//! makes (or not) one random change through the API during the storm (a policy added, edited
//! or deleted, a pod or a namespace relabelled), ends the storm, then changes a marker policy
//! at once so that following changes again is measured too. It checks:
//! 1. rules in place stay: the kernel, sampled all through the storm and the recovery, holds
//!    for every chain and set of ours either what `compile` renders for the objects before the
//!    round or what it renders for the objects after one of the round's changes (a set may be
//!    between the two, never below what all of them share): nothing is flushed or withdrawn
//!    because the API is unreachable;
//! 2. recovery follows: after the storm the kernel equals what `compile` renders for the
//!    server's objects, timed from the storm's end;
//! 3. the agent never exits, never panics, names the fault in its log and writes a bounded
//!    number of lines per storm;
//! 4. listings and watch requests per storm (fresh paginated lists and streaming lists; every
//!    watch request) stay under a ceiling derived from the back-off policy
//!    (`backoff::Policy::KUBE_WATCH`) and the length of the storm, its recovery and the quiet
//!    after it.
//!
//! Between rounds the test waits until the agent has been up for as long as its last
//! announced wait, so each storm meets an agent whose back-off starts afresh, as faults
//! minutes apart do.
//!
//! The first half of the rounds runs with streaming lists; then the server refuses them and
//! the agent falls back to paginated lists (600 pods: two pages a listing, so `continue`
//! tokens meet the 410 storm).
//!
//! `NETPOL_KUBE_FAULT_ROUNDS` (default 5: each kind of storm once, about 45 s) and
//! `NETPOL_KUBE_FAULT_SEED` (default 1) choose the run (`NETPOL_KUBE_FAULT_VERBOSE=1` prints
//! each storm's log lines); the long one is
//! `NETPOL_KUBE_FAULT_ROUNDS=100 cargo test --release --test kube_faults_netns -- --nocapture`.
//! Figures are printed at the end.

mod common;
mod kube_api;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::converge::{expected, Tables};
use common::{Agent, NetNs, TempDir};
use kube_api::{FakeApi, Gone, Res, Streaming, ALL};
use netpol_agent::backoff::Policy;
use netpol_agent::model::IpFamily;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;
use serde_json::{json, Value};

/// Longest wait for the kernel after a storm: the back-off ceiling doubled by its jitter,
/// plus a listing and an apply.
const RECOVERY_LIMIT: Duration = Duration::from_secs(75);
/// Remote pods in one namespace: more than a list page (500), so listings are paginated.
const CROWD: usize = 600;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Aborts,
    Gone,
    Errors,
    Refused,
    Garbled,
}

const FAULTS: [Fault; 5] = [
    Fault::Aborts,
    Fault::Gone,
    Fault::Errors,
    Fault::Refused,
    Fault::Garbled,
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

// ---- the cluster ----

fn demo() -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo");
    let mut text = std::fs::read_to_string(root.join("cluster.yaml")).unwrap();
    text.push_str("\n---\n");
    text.push_str(&std::fs::read_to_string(root.join("policies.yaml")).unwrap());
    kube_api::yaml_objects(&text)
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The marker policy changed right after every storm: its port is the round's.
fn marker(round: usize) -> Value {
    policy(
        "shop",
        "marker",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"ports": [{"port": 20000 + round, "protocol": "TCP"}]}]}),
    )
}

fn crowd_pod(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("crowd-{i}"), "namespace": "crowd",
                        "labels": {"app": "crowd", "role": if i.is_multiple_of(2) { "a" } else { "b" }}},
           "spec": {"nodeName": "node-9", "containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Running",
                      "podIPs": [{"ip": format!("10.250.{}.{}", i / 250, i % 250 + 1)}]}})
}

fn cluster(api: &FakeApi) {
    for obj in demo() {
        api.apply(obj);
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "crowd", "labels": {"team": "crowd"}}}));
    api.load(Res::Pods, (0..CROWD).map(crowd_pod));
    api.apply(policy(
        "shop",
        "from-crowd",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "crowd"}},
                                      "podSelector": {"matchLabels": {"role": "a"}}}],
                            "ports": [{"port": 8443}]}]}),
    ));
    api.apply(marker(0));
}

/// The server's objects as manifests, for `compile`.
fn write_manifests(api: &FakeApi, dir: &Path) {
    let docs: Vec<String> = ALL
        .iter()
        .flat_map(|res| api.objects(*res))
        .map(|obj| obj.to_string())
        .collect();
    std::fs::write(dir.join("all.yaml"), docs.join("\n---\n")).unwrap();
}

type Both = [Tables; 2];

fn want(api: &FakeApi, dir: &Path) -> Both {
    write_manifests(api, dir);
    [expected(dir, false), expected(dir, true)]
}

/// Both families' tables and sets of ours, read in one `ip netns exec`.
fn observed(ns: &NetNs) -> Both {
    let out = ns.sh_ok(
        "iptables-legacy-save -t filter; echo '#@@'; ip6tables-legacy-save -t filter; \
         echo '#@@'; ipset save",
    );
    let parts: Vec<&str> = out.split("#@@\n").collect();
    assert_eq!(parts.len(), 3, "{out}");
    let mut both: Both = Default::default();
    for (i, family) in [IpFamily::V4, IpFamily::V6].into_iter().enumerate() {
        both[i].add_iptables(parts[i], &netpol_agent::agent::OWNERSHIP);
        both[i].add_ipsets(parts[2], family);
    }
    both
}

// ---- the fail-closed check ----

/// What in `have` is neither in the state before nor after one of the round's changes: a
/// chain (or our rules in a kernel chain) must hold exactly what one of `allowed` holds; a
/// set must exist in one of them, hold nothing none of them holds, and keep what all of them
/// hold. Temporary sets of an `ipset swap` come and go.
fn outside(have: &Both, allowed: &[&Both]) -> Vec<String> {
    let mut bad = Vec::new();
    for f in 0..2 {
        let chains = |t: &Tables| t.chains.clone();
        let kernel = |t: &Tables| t.kernel.clone();
        for (what, get) in [
            (
                "chain",
                &chains as &dyn Fn(&Tables) -> BTreeMap<String, Vec<String>>,
            ),
            ("kernel chain", &kernel),
        ] {
            let have_map = get(&have[f]);
            let maps: Vec<_> = allowed.iter().map(|a| get(&a[f])).collect();
            let keys: BTreeSet<&String> = have_map
                .keys()
                .chain(maps.iter().flat_map(|m| m.keys()))
                .collect();
            for key in keys {
                let value = have_map.get(key);
                if !maps.iter().any(|m| m.get(key) == value) {
                    bad.push(format!(
                        "v{} {what} {key}: {:?} (allowed: {:?})",
                        if f == 0 { 4 } else { 6 },
                        value,
                        maps.iter().map(|m| m.get(key)).collect::<Vec<_>>()
                    ));
                }
            }
        }
        let keys: BTreeSet<&String> = have[f]
            .sets
            .keys()
            .chain(allowed.iter().flat_map(|a| a[f].sets.keys()))
            .collect();
        for key in keys {
            if netpol_agent::rules::sets::is_temp_set(key) {
                continue;
            }
            let states: Vec<Option<&BTreeSet<String>>> =
                allowed.iter().map(|a| a[f].sets.get(key)).collect();
            match have[f].sets.get(key) {
                None if states.iter().any(Option::is_none) => {}
                None => bad.push(format!("set {key} missing")),
                Some(_) if states.iter().all(Option::is_none) => {
                    bad.push(format!("set {key} unexpected"))
                }
                Some(members) => {
                    let union: BTreeSet<&String> =
                        states.iter().flatten().flat_map(|s| s.iter()).collect();
                    let extra: Vec<_> = members.iter().filter(|m| !union.contains(m)).collect();
                    let lost: Vec<&String> = if states.iter().all(Option::is_some) {
                        states[0]
                            .unwrap()
                            .iter()
                            .filter(|m| states.iter().all(|s| s.unwrap().contains(*m)))
                            .filter(|m| !members.contains(*m))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    if !extra.is_empty() || !lost.is_empty() {
                        bad.push(format!("set {key}: extra {extra:?}, lost {lost:?}"));
                    }
                }
            }
        }
    }
    bad
}

// ---- random changes ----

/// One random change through the API; says what it was.
fn change(api: &FakeApi, rng: &mut XorShiftRng, round: usize) -> String {
    let deletable: Vec<String> = api
        .objects(Res::Policies)
        .iter()
        .map(kube_api::key_of)
        .filter(|k| k != "shop/marker" && k != "shop/from-crowd")
        .collect();
    match rng.random_range(0..5) {
        // A deletion when none is left is an addition.
        n @ (0 | 2) if n == 0 || deletable.is_empty() => {
            let name = format!("chaos-{round}");
            let port = rng.random_range(1000..2000);
            let from = ["web", "api", "db", "prometheus"][rng.random_range(0..4)];
            api.apply(policy(
                "shop",
                &name,
                json!({"podSelector": {"matchLabels": {"app": "api"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": from}}}],
                                    "ports": [{"port": port}]}]}),
            ));
            format!("policy {name} added")
        }
        1 => {
            let port = rng.random_range(5000..6000);
            api.apply(policy(
                "shop",
                "from-crowd",
                json!({"podSelector": {"matchLabels": {"app": "web"}},
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "crowd"}},
                                              "podSelector": {"matchLabels": {"role": "a"}}}],
                                    "ports": [{"port": port}]}]}),
            ));
            format!("policy from-crowd edited (port {port})")
        }
        2 => {
            let key = deletable[rng.random_range(0..deletable.len())].clone();
            api.delete(Res::Policies, &key);
            format!("policy {key} deleted")
        }
        3 => {
            let i = rng.random_range(0..CROWD);
            let mut pod = api.object(Res::Pods, &format!("crowd/crowd-{i}"));
            let role = if pod["metadata"]["labels"]["role"] == "a" {
                "b"
            } else {
                "a"
            };
            pod["metadata"]["labels"]["role"] = json!(role);
            api.apply(pod);
            format!("pod crowd/crowd-{i} relabelled role={role}")
        }
        _ => {
            let mut ns = api.object(Res::Namespaces, "monitoring");
            let team = if ns["metadata"]["labels"]["team"] == "ops" {
                "none"
            } else {
                "ops"
            };
            ns["metadata"]["labels"]["team"] = json!(team);
            api.apply(ns);
            format!("namespace monitoring relabelled team={team}")
        }
    }
}

// ---- storms ----

/// One step of a storm, every tick.
fn storm_tick(api: &FakeApi, fault: Fault, rng: &mut XorShiftRng, code: u16) {
    match fault {
        Fault::Aborts => {
            for res in ALL {
                if rng.random_bool(0.7) {
                    api.close_watches(res, true);
                }
            }
        }
        Fault::Gone => {
            for res in ALL {
                api.fail_continues(res, 1000);
                if rng.random_bool(0.5) {
                    api.expire_watches(res);
                } else {
                    api.compact(res);
                    api.close_watches(res, true);
                }
            }
        }
        Fault::Errors => {
            api.fail_requests(code, Duration::from_secs(3600));
            for res in ALL {
                if rng.random_bool(0.3) {
                    api.compact(res);
                }
                api.close_watches(res, true);
            }
        }
        Fault::Refused => api.go_away(),
        Fault::Garbled => {
            for res in ALL {
                if rng.random_bool(0.5) {
                    api.cut_watches_mid_event(res);
                } else {
                    api.garble_watches(res);
                }
            }
        }
    }
}

fn end_storm(api: &FakeApi) {
    api.come_back();
    api.stop_failing();
    for res in ALL {
        api.fail_continues(res, 0);
        api.end_watches_at_once(res, false);
    }
}

/// Listing starts in `requests`: fresh paginated lists and streaming lists.
fn listings(requests: &[kube_api::Req]) -> usize {
    requests
        .iter()
        .filter(|r| {
            (!r.watch && !r.query.contains_key("continue"))
                || (r.watch
                    && r.query
                        .get("sendInitialEvents")
                        .is_some_and(|v| v == "true"))
        })
        .count()
}

/// How many errors one watcher can meet in `window` at most: after each error it waits at
/// least the back-off's nominal wait (jitter only lengthens it), and the waits grow from the
/// policy's first one (the most that fit: a back-off that starts afresh).
fn errors_within(policy: Policy, window: Duration) -> usize {
    let mut wait = policy.first;
    let mut spent = Duration::ZERO;
    let mut errors = 1;
    while spent + wait <= window {
        spent += wait;
        errors += 1;
        wait = wait.mul_f32(policy.factor);
        if let Some(c) = policy.ceiling {
            wait = wait.min(c);
        }
    }
    errors
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn tail(log: &Path) -> String {
    let lines = log_lines(log);
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn rules_stay_and_recovery_follows_under_api_server_faults() {
    let rounds: usize = env_or("NETPOL_KUBE_FAULT_ROUNDS", 5);
    let seed: u64 = env_or("NETPOL_KUBE_FAULT_SEED", 1);
    let mut rng = XorShiftRng::seed_from_u64(seed);

    let ns = NetNs::new("kfault");
    let api = common::in_netns(&ns.name, FakeApi::start);
    let work = TempDir::new("kfault");
    let manifests = TempDir::new("kfault-manifests");
    cluster(&api);

    let log = work.path.join("agent.log");
    let mut cmd = common::agent_in(&ns.name);
    cmd.args(["run", "--node", "node-1"])
        .env("KUBECONFIG", kube_api::kubeconfig(&work.path, &api.url))
        .env("FELIX_IPTABLESBACKEND", "legacy")
        .env("FELIX_HEALTHENABLED", "false");
    let mut agent = Agent::spawn(cmd, &log);
    let mut state = want(&api, &manifests.path);
    let start = Instant::now();
    while observed(&ns) != state {
        assert!(
            start.elapsed() < common::scaled(Duration::from_secs(20)),
            "the agent did not converge at start\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut violations: Vec<String> = Vec::new();
    // Bounds and log checks that failed (all reported at the end, after the figures).
    let mut failures: Vec<String> = Vec::new();
    let mut recoveries: Vec<Duration> = Vec::new();
    let mut lists_per_storm: Vec<usize> = Vec::new();
    let mut lines_per_storm: Vec<usize> = Vec::new();
    let mut watches_per_storm: Vec<usize> = Vec::new();
    let mut hollow_storms = 0;
    let mut changes_during = 0;
    let mut samples = 0usize;

    let mut order: Vec<Fault> = Vec::new();
    let mut quiet: Vec<Duration> = Vec::new();
    for round in 1..=rounds {
        if round == rounds / 2 + 1 {
            // From now on the agent lists in pages (it falls back at its next listing).
            api.set_streaming(Streaming::Refused);
        }
        // Every kind once in each five rounds, in a random order.
        if order.is_empty() {
            order = FAULTS.to_vec();
            order.shuffle(&mut rng);
        }
        let fault = order.pop().unwrap();
        *faults.entry(fault).or_default() += 1;
        let length = Duration::from_millis(rng.random_range(1500..4000));
        let tick = Duration::from_millis(rng.random_range(100..400));
        let code = [500, 503, 429][rng.random_range(0..3)];
        for res in ALL {
            api.set_gone(
                res,
                if rng.random_bool(0.5) {
                    Gone::Http
                } else {
                    Gone::Event
                },
            );
        }
        let change_at = rng
            .random_bool(0.7)
            .then(|| length.mul_f64(rng.random_range(0.1..0.9)));
        // Half the abort storms also end every new watch at once (a proxy with a broken
        // backend).
        let hollow = fault == Fault::Aborts && rng.random_bool(0.5);
        if hollow {
            hollow_storms += 1;
            for res in ALL {
                api.end_watches_at_once(res, true);
            }
        }
        let before = state.clone();
        let mut allowed: Vec<Both> = vec![before.clone()];
        let lines_before = log_lines(&log).len();
        let requests_before = api.requests().len();
        let mut what = String::from("no change");

        let storm_start = Instant::now();
        let mut next_tick = storm_start;
        let mut changed = false;
        let check = |have: &Both, allowed: &[Both], violations: &mut Vec<String>, when: &str| {
            let refs: Vec<&Both> = allowed.iter().collect();
            for v in outside(have, &refs) {
                violations.push(format!("round {round} ({fault:?}, {when}): {v}"));
            }
        };
        while storm_start.elapsed() < length {
            if Instant::now() >= next_tick {
                storm_tick(&api, fault, &mut rng, code);
                next_tick += tick;
            }
            if let Some(at) = change_at {
                if !changed && storm_start.elapsed() >= at {
                    what = change(&api, &mut rng, round);
                    allowed.push(want(&api, &manifests.path));
                    changed = true;
                    changes_during += 1;
                }
            }
            check(&observed(&ns), &allowed, &mut violations, "storm");
            samples += 1;
            assert!(
                agent.running(),
                "the agent exited during a {fault:?} storm\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        end_storm(&api);
        let storm_end = Instant::now();
        api.apply(marker(round));
        state = want(&api, &manifests.path);
        allowed.push(state.clone());
        loop {
            let have = observed(&ns);
            samples += 1;
            if have == state {
                break;
            }
            check(&have, &allowed, &mut violations, "recovery");
            assert!(
                agent.running(),
                "the agent exited after a {fault:?} storm\n{}",
                tail(&log)
            );
            assert!(
                storm_end.elapsed() < common::scaled(RECOVERY_LIMIT),
                "round {round}: not converged {RECOVERY_LIMIT:?} after a {fault:?} storm ({what})\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let recovery = storm_end.elapsed();
        recoveries.push(recovery);

        let lines = log_lines(&log);
        let storm_lines = &lines[lines_before..];
        // Quiet until the agent has been up again for as long as its last wait: the next
        // storm meets an agent whose back-off starts afresh, as faults minutes apart do.
        // Back-to-back storms would measure a flapping server instead.
        let now = seconds_of_day(std::time::SystemTime::now());
        let gap = storm_lines
            .iter()
            .filter_map(|l| {
                let (at, wait) = (logged_at(l)?, announced_wait(l)?);
                // Ends `wait` after the wait's end; the log and the clock agree to the ms.
                let ahead = (at + 2.0 * wait.as_secs_f64() - now).rem_euclid(86400.0);
                (ahead < 43200.0).then(|| Duration::from_secs_f64(ahead))
            })
            .max()
            .unwrap_or_default()
            .min(RECOVERY_LIMIT)
            // Watch spacing starts afresh for a watch asked for a first wait after the last.
            .max(Policy::KUBE_WATCH.first)
            + Duration::from_millis(100);
        quiet.push(gap);
        std::thread::sleep(gap);

        // The window the agent had for retries: the storm, its recovery and the quiet after.
        let window = storm_start.elapsed();
        let requests = api.requests();
        let lists = listings(&requests[requests_before..]);
        let watches = requests[requests_before..]
            .iter()
            .filter(|r| r.watch)
            .count();
        let lines = log_lines(&log);
        let storm_lines = &lines[lines_before..];
        if std::env::var_os("NETPOL_KUBE_FAULT_VERBOSE").is_some() {
            println!("{}", storm_lines.join("\n"));
        }
        lists_per_storm.push(lists);
        watches_per_storm.push(watches);
        lines_per_storm.push(storm_lines.len());
        println!(
            "round {round}: {fault:?} {:.1} s every {} ms{}, {what}: recovered in {} ms, {lists} listings, {watches} watches, {} log lines, {} violations so far",
            length.as_secs_f64(),
            tick.as_millis(),
            match fault {
                Fault::Errors => format!(" ({code})"),
                Fault::Aborts if hollow => " (watches ended at once)".to_string(),
                _ => String::new(),
            },
            recovery.as_millis(),
            storm_lines.len(),
            violations.len()
        );

        // Every error is at most one listing per kind (after its back-off wait), plus the
        // listing that recovers and the one restart without a wait when streaming lists are
        // refused.
        let errors = errors_within(Policy::KUBE_WATCH, window);
        let list_ceiling = ALL.len() * (errors + 2);
        if lists > list_ceiling {
            failures.push(format!(
                "round {round}: {lists} listings in {window:?} of a {fault:?} storm (ceiling {list_ceiling})"
            ));
        }
        // Watch requests of a kind that follow each other quickly are spaced by the same
        // policy (the client's `watch_spacing`); one that follows a longer stretch (twice the
        // spacing, at least the first wait) is the first of a new run.
        let watch_ceiling = ALL.len() * 2 * (errors + 2);
        if watches > watch_ceiling {
            failures.push(format!(
                "round {round}: {watches} watch requests in {window:?} of a {fault:?} storm (ceiling {watch_ceiling})"
            ));
        }
        // Per error and kind: the error line, its listing's line and one from the client.
        let line_ceiling = ALL.len() * 3 * (errors + 2) + 10;
        if storm_lines.len() > line_ceiling {
            failures.push(format!(
                "round {round}: {} log lines for one {fault:?} storm (ceiling {line_ceiling}):\n{}",
                storm_lines.len(),
                storm_lines.join("\n")
            ));
        }
        // The log names the fault: a warning (an expired resourceVersion is routine, and said
        // at info level). Only what the agent met: a storm of error answers it made no
        // request during (its watches cut at the start, their restarts spaced or waiting)
        // leaves only the cut.
        let asked = requests[requests_before..]
            .iter()
            .any(|r| r.at > storm_start && r.at < storm_end);
        let named = |l: &&String| match fault {
            Fault::Gone => l.contains("INFO") && l.contains("resource version expired"),
            // kube-client retries a 429 itself (after `Retry-After`) and says nothing: a
            // throttling storm of a few seconds never reaches the agent, which has nothing
            // to name (its requests only wait).
            Fault::Errors if code == 429 => true,
            // It retries a 503 too, and logs each at error level.
            Fault::Errors if asked => {
                (l.contains("WARN") && l.contains(&format!("code: {code}")))
                    || (l.contains("ERROR") && l.contains(&format!("failed with status {code}")))
            }
            Fault::Errors => l.contains("WARN") && l.contains("eof in poll"),
            Fault::Refused => {
                l.contains("WARN") && (l.contains("(Connect)") || l.contains("eof in poll"))
            }
            Fault::Aborts => {
                l.contains("WARN")
                    && (l.contains("eof in poll") || l.contains("watches end soon after"))
            }
            Fault::Garbled => {
                l.contains("WARN") && (l.contains("Unable to decode") || l.contains("eof in poll"))
            }
        };
        if !storm_lines.iter().any(|l| named(&l)) {
            failures.push(format!(
                "round {round}: the {fault:?} storm is not named in the log:\n{}",
                storm_lines.join("\n")
            ));
        }
        let all = lines.join("\n");
        assert!(!all.contains("panicked"), "the agent panicked:\n{all}");
    }

    let mut sorted = recoveries.clone();
    sorted.sort();
    let mut lists = lists_per_storm.clone();
    lists.sort();
    let mut lines = lines_per_storm.clone();
    lines.sort();
    let mut watches = watches_per_storm.clone();
    watches.sort();
    println!("kube API faults, seed {seed}: {rounds} rounds");
    println!(
        "  faults: {faults:?} ({hollow_storms} abort storms also ending watches at once); changes during a storm: {changes_during}"
    );
    quiet.sort();
    println!(
        "  quiet between storms (the agent's longest announced wait): median {} ms, max {} ms",
        percentile(&quiet, 0.5).as_millis(),
        quiet.last().copied().unwrap_or_default().as_millis()
    );
    println!(
        "  kernel samples: {samples}; violations: {}",
        violations.len()
    );
    println!(
        "  recovery after the storm (marker change visible, kernel = compile): p50 {} ms, p99 {} ms, max {} ms",
        percentile(&sorted, 0.5).as_millis(),
        percentile(&sorted, 0.99).as_millis(),
        sorted.last().copied().unwrap_or_default().as_millis()
    );
    println!(
        "  listings per storm (4 kinds): median {}, max {}; log lines per storm: median {}, max {}",
        percentile_usize(&lists, 0.5),
        lists.last().copied().unwrap_or(0),
        percentile_usize(&lines, 0.5),
        lines.last().copied().unwrap_or(0)
    );
    println!(
        "  watch requests per storm (4 kinds): median {}, max {}",
        percentile_usize(&watches, 0.5),
        watches.last().copied().unwrap_or(0)
    );
    println!("  bound or log checks failed: {}", failures.len());
    assert!(
        violations.is_empty(),
        "rules in place changed during faults:\n{}",
        violations.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(agent.running(), "the agent exited");
}

/// The wait a log line announces (`retrying in 1.29574241s:`, `relisting in 927.15ms:`).
fn announced_wait(line: &str) -> Option<Duration> {
    let (_, rest) = line
        .split_once("retrying in ")
        .or_else(|| line.split_once("relisting in "))?;
    let word = rest.split(':').next()?;
    let (number, unit) = word.split_at(word.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "µs" | "us" => number / 1e6,
        "ns" => number / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// When a log line was written, in seconds since midnight UTC (`2026-11-23T19:36:33.600455Z`).
fn logged_at(line: &str) -> Option<f64> {
    let time = line.split_whitespace().next()?.split_once('T')?.1;
    let mut parts = time.strip_suffix('Z')?.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

fn seconds_of_day(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        .rem_euclid(86400.0)
}

fn percentile_usize(sorted: &[usize], p: f64) -> usize {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
