//! Idle cost and tamper repair of the real agent (issue 10). Prints figures; asserts nothing
//! about time.
//!
//! `cargo bench --bench idle` (root) writes the synthetic cluster (10k pods, 1k policies, 300
//! namespaces; `support/synthetic.rs`) into a directory, starts `netpol-agent run
//! --datastore dir:…` in a network namespace of its own, waits for the first full apply, then:
//! - samples the agent's CPU from `/proc/<pid>/stat` over an idle window (`utime + stime` of
//!   the agent and of the children it waited for: `iptables-save`, `ipset`, ...) and reports
//!   it as % of one core, with its resident memory and its threads' wake-ups per second
//!   (context switches, `/proc/<pid>/task/*/status`);
//! - tampers with what it programmed, one kind at a time, and measures the time until the
//!   kernel holds our rules again (p50 / p99 over the rounds): `iptables -F cali-FORWARD`,
//!   `-D` of our jump in `FORWARD`, a foreign ACCEPT inserted above our jump, `ipset del` of a
//!   member, `ipset flush` of one of our sets (a set of ours cannot be destroyed while our
//!   rules reference it).
//!
//! With 110 and with 1500 local pods, on the legacy and the nft backend.
//!
//! `-- --previous PATH` runs another agent binary (say, the previous release) through the
//! same scenarios in the same run, for ratios on this noisy machine; `--ours PATH` measures
//! a copy of the binary instead of the one cargo built (so a build running meanwhile cannot
//! swap it between runs). Options: `--idle SECS`
//! (default 60), `--rounds N` (tampers per kind, default 10), `--local 110,1500`,
//! `--backends legacy,nft`, `--wide N` (N more policies with large peer sets,
//! `synthetic::wide_policy`: 300 give about 550 sets with 60k members at 1500 local pods, the
//! size of issue 20's cluster; default 0, the cluster above), `--wide-apps K` (apps per wide
//! peer, default 3: about 200 members each), `--env NAME=VALUE` (repeatable: set in the
//! agent's environment, for experiments such as `FELIX_KERNELCHECKINTERVAL=0`), `--jitter SECS`
//! (before each tamper, wait a further 0 to SECS seconds, drawn from a fixed seed: the tampers
//! then fall at any phase of the agent's check intervals, so p99 includes the longest wait
//! for a check; without it every round starts 1.5 s after the last repair, which lines up
//! with the checks the same way each time). Each run
//! prints the rules, and the sets and members of ours the kernel holds (`ipset list -t`).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/synthetic.rs"]
mod synthetic;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Agent;
use synthetic::{Rng, Scale};

const NETNS_PREFIX: &str = "npa-bench-";
const SEED: u64 = 42;

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("{NETNS_PREFIX}{}-{tag}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = Netns(name);
        ns.sh("ip link set lo up");
        ns
    }

    fn sh(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn run(cmd: &str, args: &[&str]) {
    let ok = Command::new(cmd)
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{cmd} {args:?} failed");
}

/// `(agent + waited-for children) CPU ticks, resident KiB` of a running process.
fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // state=0 ... utime=11 stime=12 cutime=13 cstime=14 (0-based after the name).
    let ticks = f.get(11..15).map_or(0, |v| v.iter().sum());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}

fn ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The synthetic cluster with `local` pods on the node, as manifests in `dir`.
fn write_cluster(dir: &Path, local: usize, wide: usize, wide_apps: usize) {
    let scale = Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local,
        dual: false,
        cluster_policies: 0,
    };
    synthetic::write_cluster(dir, scale, SEED, wide, wide_apps);
}

fn tool(backend: &str, action: &str) -> String {
    match action {
        "" => format!("iptables-{backend}"),
        a => format!("iptables-{backend}-{a}"),
    }
}

/// One tamper kind: what to do, and whether the kernel holds ours again.
struct Tamper {
    name: &'static str,
    act: Box<dyn Fn(&Netns)>,
    repaired: Box<dyn Fn(&Netns) -> bool>,
}

/// A shell pipeline printing the `-A` lines of `chain` in the filter table, read the cheapest
/// way that does not slow the repair being timed. Legacy: `iptables-save`, which takes no
/// lock; `iptables -S` waits for the xtables lock (a file shared by every network namespace)
/// and holds it while it lists, so polling with it every 20 ms kept the lock busy most of
/// the time at 27k rules and delayed the very restore being timed. nft: `iptables -S CHAIN`,
/// which takes no lock there and fetches that one chain, where a save would dump all 27k
/// rules every 20 ms.
fn chain_lines(backend: &str, chain: &str) -> String {
    match backend {
        "legacy" => format!(
            "{} -t filter | grep -- '^-A {chain} '",
            tool(backend, "save")
        ),
        _ => format!("{} -S {chain} | grep -- '^-A {chain} '", tool(backend, "")),
    }
}

fn tampers(backend: &'static str, ns: &Netns) -> Vec<Tamper> {
    let ipt = tool(backend, "");
    let fwd_rules = ns
        .sh(&format!("{} | wc -l", chain_lines(backend, "cali-FORWARD")))
        .trim()
        .to_string();
    let set_line = ns
        .sh("ipset save | awk '$1 == \"add\" && $2 ~ /^cali40s:/ { print $2, $3; exit }'")
        .trim()
        .to_string();
    let (set, member) = set_line
        .split_once(' ')
        .map(|(s, m)| (s.to_string(), m.to_string()))
        .expect("a member of a set of ours");
    let set_size = ns
        .sh(&format!(
            "ipset list {set} | awk '/^Number of entries/ {{ print $4 }}'"
        ))
        .trim()
        .to_string();
    let i1 = ipt.clone();
    let i3 = ipt.clone();
    let i5 = ipt.clone();
    let (s1, m1) = (set.clone(), member.clone());
    let (s2, m2) = (set.clone(), member);
    let (s3, s4) = (set.clone(), set);
    vec![
        Tamper {
            name: "iptables -F cali-FORWARD",
            act: Box::new(move |ns| {
                ns.sh(&format!("{i1} -F cali-FORWARD"));
            }),
            repaired: Box::new(move |ns| {
                ns.sh(&format!("{} | wc -l", chain_lines(backend, "cali-FORWARD")))
                    .trim()
                    == fwd_rules
            }),
        },
        Tamper {
            name: "iptables -D FORWARD <our jump>",
            act: Box::new(move |ns| {
                let rule = ns.sh(&format!("{i3} -S FORWARD | grep -m1 -- '-j cali-FORWARD'"));
                let rule = rule.trim().replacen("-A FORWARD", "-D FORWARD", 1);
                ns.sh(&format!("{i3} {rule}"));
            }),
            repaired: Box::new(move |ns| {
                ns.sh(&chain_lines(backend, "FORWARD"))
                    .contains("-j cali-FORWARD")
            }),
        },
        Tamper {
            name: "foreign ACCEPT above our jump",
            act: Box::new(move |ns| {
                ns.sh(&format!(
                    "{i5} -I FORWARD 1 -m comment --comment npa-bench -j ACCEPT"
                ));
            }),
            repaired: Box::new(move |ns| {
                // Our jump is back on top (insert mode); the foreign rule stays below it.
                ns.sh(&chain_lines(backend, "FORWARD"))
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("-j cali-FORWARD"))
            }),
        },
        Tamper {
            name: "ipset del <member>",
            act: Box::new(move |ns| {
                ns.sh(&format!("ipset del {s1} {m1}"));
            }),
            repaired: Box::new(move |ns| {
                ns.sh(&format!("ipset test {s2} {m2} 2>&1"))
                    .contains("is in set")
            }),
        },
        Tamper {
            name: "ipset flush <set>",
            act: Box::new(move |ns| {
                ns.sh(&format!("ipset flush {s3}"));
            }),
            repaired: Box::new(move |ns| {
                ns.sh(&format!(
                    "ipset list {s4} | awk '/^Number of entries/ {{ print $4 }}'"
                ))
                .trim()
                    == set_size
            }),
        },
    ]
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

struct Options {
    previous: Option<PathBuf>,
    ours: Option<PathBuf>,
    idle: Duration,
    rounds: usize,
    locals: Vec<usize>,
    backends: Vec<&'static str>,
    wide: usize,
    wide_apps: usize,
    env: Vec<(String, String)>,
    jitter: Duration,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    Options {
        previous: value("--previous").map(PathBuf::from),
        ours: value("--ours").map(PathBuf::from),
        idle: Duration::from_secs(value("--idle").and_then(|v| v.parse().ok()).unwrap_or(60)),
        rounds: value("--rounds").and_then(|v| v.parse().ok()).unwrap_or(10),
        locals: value("--local")
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or(vec![110, 1500]),
        backends: value("--backends")
            .map(|v| {
                v.split(',')
                    .filter_map(|b| match b {
                        "legacy" => Some("legacy"),
                        "nft" => Some("nft"),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or(vec!["legacy", "nft"]),
        wide: value("--wide").and_then(|v| v.parse().ok()).unwrap_or(0),
        wide_apps: value("--wide-apps")
            .and_then(|v| v.parse().ok())
            .unwrap_or(3),
        env: args
            .windows(2)
            .filter(|w| w[0] == "--env")
            .filter_map(|w| w[1].split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        jitter: Duration::from_secs_f64(
            value("--jitter")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
        ),
    }
}

fn measure(
    label: &str,
    agent_bin: &Path,
    dir: &Path,
    backend: &'static str,
    local: usize,
    opts: &Options,
) {
    let ns = Netns::new(&format!("idle-{backend}-{local}"));
    let log = dir.join(format!("agent-{}.log", std::process::id()));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.0])
        .arg(agent_bin)
        .args(["run", "--node", synthetic::NODE])
        .arg("--datastore")
        .arg(format!("dir:{}", dir.join("cluster").display()))
        .env("FELIX_IPTABLESBACKEND", backend)
        .env("FELIX_LOGSEVERITYSCREEN", "Info")
        .envs(opts.env.iter().map(|(k, v)| (k, v)));
    let agent = Agent::spawn(cmd, &log);
    let pid = agent.pid();
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("first full apply done")
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{label}: no first apply in 120 s:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let cold = start.elapsed();
    // Past the post-write check and the first change checks.
    std::thread::sleep(Duration::from_secs(5));
    let rules = ns.sh(&format!(
        "{} -t filter | grep -c '^-A'",
        tool(backend, "save")
    ));
    // Our sets and their members, from the headers the kernel lists.
    let sets = ns.sh(
        "ipset list -t | awk '/^Name: cali/ { ours = 1; n++; next } /^Name:/ { ours = 0 } \
         ours && /^Number of entries/ { m += $4 } END { print n + 0, m + 0 }'",
    );
    let (sets, members) = sets.trim().split_once(' ').unwrap_or(("?", "?"));
    let (t0, _) = usage(pid);
    let s0 = procfs::context_switches(pid);
    let w0 = Instant::now();
    // The window in 60 s slices: the first holds no exact verify (FELIX_KERNELVERIFYINTERVAL,
    // 120 s after the first apply) nor refresh (300 s); the slices holding them show what
    // each costs over the steady ones, and how far apart the next ones are stretched.
    let slice = Duration::from_secs(60);
    let mut slices = Vec::new();
    let mut last = (t0, w0);
    while w0.elapsed() < opts.idle {
        std::thread::sleep(slice.min(opts.idle.saturating_sub(w0.elapsed())));
        let (t, _) = usage(pid);
        let now = Instant::now();
        slices
            .push((t - last.0) as f64 / ticks_per_second() / (now - last.1).as_secs_f64() * 100.0);
        last = (t, now);
    }
    let (t1, rss) = usage(pid);
    let wakeups =
        procfs::context_switches(pid).saturating_sub(s0) as f64 / w0.elapsed().as_secs_f64();
    let cpu = (t1 - t0) as f64 / ticks_per_second() / w0.elapsed().as_secs_f64() * 100.0;
    let first = if slices.len() > 1 {
        let list: Vec<String> = slices.iter().map(|p| format!("{p:.2}")).collect();
        format!(" (per 60 s: {} %)", list.join(" "))
    } else {
        String::new()
    };
    println!(
        "{label} {backend:6} local={local:4}: cold start {:5.2} s, {} rules, {sets} sets with {members} members; idle CPU {cpu:6.3} % of a core over {} s{first} (agent + children), {wakeups:.1} thread wake-ups/s, RSS {:.1} MiB",
        cold.as_secs_f64(),
        rules.trim(),
        opts.idle.as_secs(),
        rss as f64 / 1024.0
    );
    let mut phase = Rng(SEED);
    for t in tampers(backend, &ns) {
        let mut times = Vec::new();
        let mut missed = 0;
        for _ in 0..opts.rounds {
            if !opts.jitter.is_zero() {
                std::thread::sleep(opts.jitter.mul_f64(phase.below(1000) as f64 / 1000.0));
            }
            (t.act)(&ns);
            let at = Instant::now();
            while !(t.repaired)(&ns) {
                if at.elapsed() > Duration::from_secs(30) {
                    missed += 1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if at.elapsed() <= Duration::from_secs(30) {
                times.push(at.elapsed());
            }
            // Let the repair's own post-write work settle before the next round.
            std::thread::sleep(Duration::from_millis(1500));
        }
        times.sort();
        println!(
            "{label} {backend:6} local={local:4}:   repair of {:32} p50 {:6.2} s, p99 {:6.2} s over {} rounds{}",
            t.name,
            percentile(&times, 50).as_secs_f64(),
            percentile(&times, 99).as_secs_f64(),
            times.len(),
            if missed > 0 {
                format!(", {missed} not repaired within 30 s")
            } else {
                String::new()
            }
        );
    }
    // Leave the namespace clean of the tamper rule.
    ns.sh(&format!(
        "{} -D FORWARD -m comment --comment npa-bench -j ACCEPT 2>/dev/null",
        tool(backend, "")
    ));
    drop(agent);
    let _ = std::fs::remove_file(&log);
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") && std::env::args().any(|a| a == "--list") {
        return;
    }
    let opts = options();
    let ours = opts
        .ours
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_netpol-agent")));
    let mut agents = vec![("ours", ours)];
    if let Some(prev) = &opts.previous {
        agents.push(("previous", prev.clone()));
    }
    for &local in &opts.locals {
        let work =
            std::env::temp_dir().join(format!("npa-bench-idle-{}-{local}", std::process::id()));
        std::fs::create_dir_all(work.join("cluster")).unwrap();
        write_cluster(&work.join("cluster"), local, opts.wide, opts.wide_apps);
        for &backend in &opts.backends {
            for (label, bin) in &agents {
                measure(&format!("[{label:8}]"), bin, &work, backend, local, &opts);
            }
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}
