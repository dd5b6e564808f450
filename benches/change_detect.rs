//! Change-detection benchmark: the CPU one check of each `change_detect` primitive costs,
//! next to the full re-reads the dataplane loop runs today (`iptables-save -t filter` parsed
//! with `parse_save`, and `ipset save` parsed by `IpsetManager::resync`), measured in the same
//! run, at 110 and at 1500 local pods of the synthetic 10k-pod cluster (`support/synthetic.rs`).
//! Prints figures, asserts nothing about time.
//!
//! `cargo bench --bench change_detect` must run as root. Each scale programs the complete
//! desired state (IPv4) by bare restores into two network namespaces it creates
//! (`npa-bench-<pid>-cd-<n>`, deleted when they go out of scope, also on panic): one through
//! `iptables-legacy-restore` (and `ipset restore`), one through `iptables-nft-restore`. The
//! checks run on a thread that entered the namespace, so their sockets and the processes the
//! baselines start live there; no `ip netns exec` is in the way.
//!
//! CPU is `CLOCK_THREAD_CPUTIME_ID` for the measuring thread (user + system, so the kernel's
//! work behind a getsockopt or a netlink dump counts) and `getrusage(RUSAGE_CHILDREN)` for the
//! processes a baseline starts, each averaged over many repetitions. nf_tables events are measured by
//! making `KUBE_COMMITS` kube-proxy-like commits first (their events wait in the socket) and
//! then timing the reads and classification of all of them.
//!
//! Scales: 110 and 1500 local pods of the synthetic cluster as it is, and 1500 padded to the
//! size issue 10 measured (40k rules, 67k set members; see `pad`).
//!
//! At the end, idle CPU of one core for today's timers and for the recommended ones, from the
//! per-check figures: a check costing `c` µs every `t` s uses `c / (t * 10^4)` % of a core.

#[path = "support/synthetic.rs"]
mod synthetic;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};

use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::dataplane::ipsets::IpsetManager;
use netpol_agent::dataplane::iptables::parse::parse_save;
use netpol_agent::dataplane::watch::ipset::IpsetWatch;
use netpol_agent::dataplane::watch::nft::{classify_event, NftGeneration, NftMonitor};
use netpol_agent::dataplane::watch::xtables::{digest_entries, LegacyWatch, XtSocket};
use netpol_agent::dataplane::watch::Finding;
use netpol_agent::host::exec::Exec;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::sets::DEFAULT_MAX_SET_SIZE;
use netpol_agent::rules::RuleConfig;

use synthetic::{build, Rng, Scale};

/// The nf_tables events the unit tests decode (iptables-nft, ip6tables-nft and nft changes).
mod captured {
    include!("../src/dataplane/watch/testdata/nft_events.rs");
}

const SEED: u64 = 42;
const NETNS_PREFIX: &str = "npa-bench-";
/// kube-proxy-like commits whose events the nf_tables monitor reads.
const KUBE_COMMITS: usize = 200;

/// Today's `IptablesRefreshInterval` and `IpsetsRefreshInterval` defaults.
const TODAY_REFRESH_S: f64 = 10.0;
/// Recommended intervals (seconds) the idle-CPU lines use.
const CHECK_S: f64 = 1.0;
const DIGEST_S: f64 = 120.0;
const FULL_S: f64 = 300.0;
/// nf_tables events miss nothing but overruns (reported): its full read can wait longer.
const FULL_NFT_S: f64 = 600.0;
const CONFIRM_S: f64 = 10.0;
const KUBE_COMMITS_PER_S: f64 = 50.0;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

struct NetNs {
    name: String,
}

impl NetNs {
    fn new() -> NetNs {
        let name = format!(
            "{NETNS_PREFIX}{}-cd-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot create network namespace {name} (run as root)");
        NetNs { name }
    }

    /// Runs `program args` in the namespace with `input` on stdin.
    fn run(&self, program: &str, args: &[&str], input: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let mut stdin = child.stdin.take().expect("piped");
        let input = input.to_string();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().expect("wait");
        let written = writer.join().expect("writer");
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        written.expect("write stdin");
    }

    /// Runs `f` on a thread inside the namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .expect("benchmark thread")
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// CPU of the processes this one started and waited for (`RUSAGE_CHILDREN`).
fn children_cpu() -> Duration {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

/// CPU of the calling thread, user and system, to the nanosecond (`CLOCK_THREAD_CPUTIME_ID`
/// brings the running thread's runtime up to date; `RUSAGE_THREAD` and
/// `/proc/thread-self/schedstat` only move at scheduler ticks and read 0 for
/// sub-microsecond calls).
fn thread_cpu() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("clock_gettime");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

/// Per repetition: CPU of this thread, CPU of the processes it started, wall time (µs).
#[derive(Clone, Copy, Default)]
struct Cost {
    own: f64,
    children: f64,
    wall: f64,
}

impl Cost {
    fn total(&self) -> f64 {
        self.own + self.children
    }
}

fn measure(reps: usize, mut f: impl FnMut()) -> Cost {
    f(); // warm up: first socket use, caches
    let (t0, c0, w0) = (thread_cpu(), children_cpu(), Instant::now());
    for _ in 0..reps {
        f();
    }
    let n = reps as f64;
    Cost {
        own: (thread_cpu() - t0).as_secs_f64() * 1e6 / n,
        children: (children_cpu() - c0).as_secs_f64() * 1e6 / n,
        wall: w0.elapsed().as_secs_f64() * 1e6 / n,
    }
}

struct Row {
    scale: &'static str,
    what: &'static str,
    cost: Cost,
    baseline: f64,
}

/// The desired state of one scale as bare restore scripts: (ipset, iptables, rules, members).
fn scripts(local: usize) -> (String, String, usize, usize) {
    let scale = Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local,
        dual: false,
        cluster_policies: 0,
    };
    let (mut graph, _) = build(scale, &mut Rng(SEED));
    graph.flush();
    let state = graph.snapshot();
    let fam = &state.families[&IpFamily::V4];
    let cfg = RuleConfig::default();
    let RestoreScripts {
        ipsets: ipset,
        iptables,
    } = fam.restore_scripts(&cfg, IpFamily::V4, DEFAULT_MAX_SET_SIZE);
    let rules = iptables
        .lines()
        .filter(|l| l.starts_with("-A ") || l.starts_with("-I "))
        .count();
    let members = ipset.lines().filter(|l| l.starts_with("add ")).count();
    (ipset, iptables, rules, members)
}

fn save_and_parse(tool: &str) {
    let out = Command::new(tool)
        .args(["-t", "filter"])
        .stdin(Stdio::null())
        .output()
        .expect("run save");
    assert!(out.status.success(), "{tool} failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let state =
        parse_save(text.as_bytes(), "filter", netpol_agent::agent::OWNERSHIP).expect("parse");
    assert!(!state.chains.is_empty());
}

/// kube-proxy-like commits in its own table: per commit a few service elements added and
/// removed and one rule, as `nft -f` batches (one process, one commit each).
fn kube_proxy_churn(ns: &NetNs, commits: usize) {
    ns.run(
        "nft",
        &["-f", "-"],
        "add table ip kube-proxy\n\
         add chain ip kube-proxy services\n\
         add set ip kube-proxy cluster-ips { type ipv4_addr; }\n",
    );
    for i in 0..commits {
        let mut batch = String::new();
        for k in 0..4 {
            let _ = writeln!(
                batch,
                "add element ip kube-proxy cluster-ips {{ 10.96.{}.{} }}",
                i % 250,
                k
            );
        }
        let _ = writeln!(
            batch,
            "add rule ip kube-proxy services ip daddr 10.96.{}.1 tcp dport 80 accept",
            i % 250
        );
        ns.run("nft", &["-f", "-"], &batch);
    }
}

fn legacy_rows(local: &'static str, ipset: &str, iptables: &str, rows: &mut Vec<Row>) {
    let ns = NetNs::new();
    ns.run("ipset", &["restore"], ipset);
    ns.run("iptables-legacy-restore", &["--noflush"], iptables);
    ns.enter(|| {
        let save = measure(5, || save_and_parse("iptables-legacy-save"));
        let mut manager = IpsetManager::new(Exec::default(), DEFAULT_MAX_SET_SIZE);
        let ipset_save = measure(5, || manager.resync().expect("ipset save"));

        let mut w = LegacyWatch::open(IpFamily::V4, netpol_agent::agent::ours()).unwrap();
        w.baseline().unwrap();
        let entries = w.fingerprint().unwrap().info.size;
        let info = measure(5000, || assert_eq!(w.check().unwrap(), Finding::Unchanged));
        let verify = measure(20, || assert_eq!(w.verify().unwrap(), Finding::Unchanged));
        let sock = XtSocket::open(IpFamily::V4).unwrap();
        let read = measure(20, || {
            sock.entries("filter").unwrap().unwrap();
        });
        let (i, blob) = sock.entries("filter").unwrap().unwrap();
        let hash = measure(20, || {
            digest_entries(IpFamily::V4, &i, &blob).unwrap();
        });

        let mut iw = IpsetWatch::open(netpol_agent::agent::ours()).unwrap();
        iw.baseline().unwrap();
        let sets = iw.fingerprint().unwrap().len();
        let headers = measure(500, || assert_eq!(iw.check().unwrap(), Finding::Unchanged));
        let members = measure(5, || assert_eq!(iw.verify().unwrap(), Finding::Unchanged));

        println!("  legacy namespace: {entries} bytes of x_tables entries, {sets} sets listed");
        let s = save.total();
        let p = ipset_save.total();
        rows.extend([
            row(
                local,
                "iptables-legacy-save -t filter + parse (today)",
                save,
                s,
            ),
            row(local, "legacy: IPT_SO_GET_INFO (check, unchanged)", info, s),
            row(
                local,
                "legacy: entries read + per-chain digest (verify)",
                verify,
                s,
            ),
            row(
                local,
                "  of which IPT_SO_GET_ENTRIES (2 info + entries)",
                read,
                s,
            ),
            row(local, "  of which the digest", hash, s),
            row(local, "ipset save + parse (today)", ipset_save, p),
            row(local, "ipset: header dump (check, unchanged)", headers, p),
            row(
                local,
                "ipset: headers + member digests (verify)",
                members,
                p,
            ),
        ]);
    });
}

fn nft_rows(local: &'static str, ipset: &str, iptables: &str, rows: &mut Vec<Row>) {
    let ns = NetNs::new();
    // Our rules match on our sets: they must exist first.
    ns.run("ipset", &["restore"], ipset);
    ns.run("iptables-nft-restore", &["--noflush"], iptables);
    let (mut monitor, mut generation) = ns.enter(|| {
        (
            NftMonitor::open(netpol_agent::agent::ours()).unwrap(),
            NftGeneration::open().unwrap(),
        )
    });
    ns.enter(|| {
        let save = measure(3, || save_and_parse("iptables-nft-save"));
        let s = save.total();
        let gen = measure(5000, || {
            generation.read().unwrap();
        });
        let idle_poll = measure(5000, || {
            assert!(monitor.poll().unwrap().ours.is_empty());
        });
        rows.extend([
            row(
                local,
                "iptables-nft-save -t filter + parse (today)",
                save,
                s,
            ),
            row(local, "nft: GETGEN (generation id)", gen, s),
            row(local, "nft: monitor poll, nothing pending", idle_poll, s),
        ]);
    });

    // The events of KUBE_COMMITS commits, waiting in the socket, read and classified.
    kube_proxy_churn(&ns, KUBE_COMMITS);
    let per_commit = ns.enter(|| {
        let (t0, w0) = (thread_cpu(), Instant::now());
        let c = monitor.poll().unwrap();
        let own = (thread_cpu() - t0).as_secs_f64() * 1e6;
        assert!(c.ours.is_empty() && c.lost.is_none(), "{c:?}");
        assert!(c.foreign_commits as usize >= KUBE_COMMITS, "{c:?}");
        Cost {
            own: own / c.foreign_commits as f64,
            children: 0.0,
            wall: w0.elapsed().as_secs_f64() * 1e6 / c.foreign_commits as f64,
        }
    });
    let s = rows
        .iter()
        .find(|r| r.scale == local && r.what.starts_with("iptables-nft-save"))
        .map_or(1.0, |r| r.baseline);
    rows.push(row(
        local,
        "nft: events of one kube-proxy commit",
        per_commit,
        s,
    ));
}

/// CPU per event to classify the captured nf_tables events: our walk of their top-level
/// attributes against netlink-packet-netfilter's full decode (what `classify_event` would
/// cost if it let the crate decode every message).
fn event_decode_rows(rows: &mut Vec<Row>) {
    use netlink_packet_core::ParseableParametrized;
    use netlink_packet_netfilter::NetfilterMessage;
    let interest = netpol_agent::agent::ours();
    let (gen_type, gen_payload) = captured::NEWGEN;
    let events = || {
        captured::EVENTS
            .iter()
            .map(|(_, ty, payload, _)| (*ty, *payload))
            .chain([(gen_type, gen_payload)])
    };
    let n = events().count();
    let walk = measure(2000, || {
        for (ty, payload) in events() {
            std::hint::black_box(classify_event(ty, payload, &interest).unwrap());
        }
    });
    let full = measure(200, || {
        for (ty, payload) in events() {
            std::hint::black_box(NetfilterMessage::parse_with_param(payload, ty).unwrap());
        }
    });
    let per = |c: Cost| Cost {
        own: c.own / n as f64,
        children: 0.0,
        wall: c.wall / n as f64,
    };
    let base = per(full).total();
    rows.push(row(
        "events",
        "nft event: netlink-packet-netfilter full decode",
        per(full),
        base,
    ));
    rows.push(row(
        "events",
        "nft event: classify_event (top-level walk)",
        per(walk),
        base,
    ));
}

fn row(scale: &'static str, what: &'static str, cost: Cost, baseline: f64) -> Row {
    Row {
        scale,
        what,
        cost,
        baseline,
    }
}

fn cost_of(rows: &[Row], scale: &str, prefix: &str) -> f64 {
    rows.iter()
        .find(|r| r.scale == scale && r.what.starts_with(prefix))
        .map_or(f64::NAN, |r| r.cost.total())
}

/// % of one core for a check of `us` µs every `secs` seconds.
fn pct(us: f64, secs: f64) -> f64 {
    us / (secs * 1e4)
}

/// Pads the 1500-local-pod state to the size issue 10 measured (40k rules, 67k set members):
/// copies of our policy chains' rules in extra chains of ours (`cali-pad-<n>`, nothing jumps
/// to them: they cost what any rule costs to save, read and digest) and extra addresses in
/// our `hash:net` sets.
fn pad(
    ipset: &str,
    iptables: &str,
    rules: usize,
    members: usize,
) -> (String, String, usize, usize) {
    const RULES: usize = 40_000;
    const MEMBERS: usize = 67_000;
    let net_sets: Vec<&str> = ipset
        .lines()
        .filter_map(|l| l.strip_prefix("create "))
        .filter(|l| l.contains(" hash:net "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut ipset = ipset.to_string();
    for k in 0..MEMBERS.saturating_sub(members) {
        let set = net_sets[k % net_sets.len()];
        let _ = writeln!(
            ipset,
            "add {set} 10.{}.{}.{}",
            200 + (k >> 16),
            (k >> 8) & 0xff,
            k & 0xff
        );
    }
    let bodies: Vec<&str> = iptables
        .lines()
        .filter_map(|l| l.strip_prefix("-A cali-pi-"))
        .filter_map(|l| l.split_once(' ').map(|(_, body)| body))
        .collect();
    let (mut declares, mut appends) = (String::new(), String::new());
    let extra = RULES.saturating_sub(rules);
    for k in 0..extra {
        let chain = format!("cali-pad-{}", k / 50);
        if k % 50 == 0 {
            let _ = writeln!(declares, ":{chain} - [0:0]");
        }
        let _ = writeln!(appends, "-A {chain} {}", bodies[k % bodies.len()]);
    }
    let commit = iptables.rfind("COMMIT").expect("a COMMIT line");
    let (head, tail) = iptables.split_at(commit);
    let first_rule = head.find("\n-").map_or(head.len(), |i| i + 1);
    let iptables = format!(
        "{}{declares}{}{appends}{tail}",
        &head[..first_rule],
        &head[first_rule..]
    );
    (ipset, iptables, rules + extra, members.max(MEMBERS))
}

fn main() {
    let uid = Command::new("id").arg("-u").output().expect("id");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("change_detect benchmark: must run as root (it creates network namespaces)");
        std::process::exit(1);
    }
    let scales: [(&'static str, usize, bool); 3] = [
        ("110", 110, false),
        ("1500", 1500, false),
        ("1500+pad", 1500, true),
    ];
    let mut rows = Vec::new();
    for (label, local, padded) in scales {
        let t = Instant::now();
        let (mut ipset, mut iptables, mut rules, mut members) = scripts(local);
        if padded {
            (ipset, iptables, rules, members) = pad(&ipset, &iptables, rules, members);
        }
        println!(
            "scale {label} ({local} local pods of a 10k-pod cluster{}): {rules} iptables rules, \
             {members} set members (built in {:.1} s)",
            if padded {
                ", padded to issue 10's size"
            } else {
                ""
            },
            t.elapsed().as_secs_f64()
        );
        legacy_rows(label, &ipset, &iptables, &mut rows);
        nft_rows(label, &ipset, &iptables, &mut rows);
    }

    event_decode_rows(&mut rows);

    println!();
    println!(
        "{:>8} | {:<52} | {:>10} | {:>10} | {:>10} | {:>10} | {:>9}",
        "scale", "check", "own µs", "child µs", "total µs", "wall µs", "÷ full"
    );
    for r in &rows {
        println!(
            "{:>8} | {:<52} | {:>10.1} | {:>10.1} | {:>10.1} | {:>10.1} | {:>9.5}",
            r.scale,
            r.what,
            r.cost.own,
            r.cost.children,
            r.cost.total(),
            r.cost.wall,
            r.cost.total() / r.baseline
        );
    }

    println!();
    println!(
        "idle CPU, % of one core, IPv4-only and dual-stack nodes (dual stack doubles the \
         iptables terms: the IPv6 table taken as large as the IPv4 one; sets cover both):"
    );
    println!(
        "  today: full save + parse of iptables and of ipsets every {TODAY_REFRESH_S} s; \
         recommended legacy: IPT_SO_GET_INFO and ipset headers every {CHECK_S} s, entries \
         digest and ipset member digests every {DIGEST_S} s, full re-reads every {FULL_S} s; \
         recommended nft: blocked on the event socket, kube-proxy committing \
         {KUBE_COMMITS_PER_S}/s, generation confirmed every {CONFIRM_S} s, ipset as for \
         legacy, full re-reads every {FULL_NFT_S} s"
    );
    for (label, _, _) in scales {
        let c = |p: &str| cost_of(&rows, label, p);
        let ipsets_today = pct(c("ipset save"), TODAY_REFRESH_S);
        let legacy_today = pct(c("iptables-legacy-save"), TODAY_REFRESH_S);
        let nft_today = pct(c("iptables-nft-save"), TODAY_REFRESH_S);
        let ipsets = pct(c("ipset: header dump"), CHECK_S)
            + pct(c("ipset: headers + member"), DIGEST_S)
            + pct(c("ipset save"), FULL_S);
        let legacy = pct(c("legacy: IPT_SO_GET_INFO"), CHECK_S)
            + pct(c("legacy: entries read"), DIGEST_S)
            + pct(c("iptables-legacy-save"), FULL_S);
        let nft = pct(c("nft: GETGEN"), CONFIRM_S)
            + pct(
                c("nft: events of one kube-proxy commit"),
                1.0 / KUBE_COMMITS_PER_S,
            )
            + pct(c("iptables-nft-save"), FULL_NFT_S);
        for (stack, fams) in [("IPv4", 1.0), ("dual", 2.0)] {
            let (lt, lr) = (legacy_today * fams + ipsets_today, legacy * fams + ipsets);
            let (nt, nr) = (nft_today * fams + ipsets_today, nft * fams + ipsets);
            println!(
                "  {label:>8} {stack}: legacy today {lt:.3} % -> recommended {lr:.3} % ({:.0}x less) | \
                 nft today {nt:.3} % -> recommended {nr:.3} % ({:.0}x less)",
                lt / lr,
                nt / nr
            );
        }
    }
}
