//! Event → enforced on a real API server (issue 40, item 1), measured from outside the agent:
//! a write to the API server, then the agent's IP sets read until they say the change is in.
//! The writer is `scale-load probe` (client-go, in the API server's namespace); this module
//! picks what to write from the agent's own sets and reads the kernel.
//!
//! One probe is two changes of a remote pod, the bulk of a real cluster's churn:
//! - add: a pod copied from a template (a Running pod on another node whose address is a
//!   member of some of the agent's sets: same namespace, labels and ports, so the same
//!   selectors pick it) gets address IP (its status write is the event). Enforced when IP is
//!   a member of every set the template's address is in;
//! - delete: that pod deleted at once (grace period 0). Enforced when IP is in none of them.
//!
//! Each latency runs from just before the write (so the API server's own write time is in
//! it) to the first read that sees the change. Reads are netlink requests (`IPSET_CMD_TEST`,
//! `IpsetWatch::contains`) from a socket opened in the agent's namespace, one every
//! [`POLL`]: no process per read.
//! The first read starts when the writer has answered, so a change the agent made before the
//! answer reached the bench is seen then: the write's own time (reported apart) bounds that.
//! Churn can change what a probe is measured against: a policy edited or deleted takes the
//! template's sets with it. So a pod added that is not in every set within [`LIMIT`] (or
//! whose set went away) is judged again from a fresh read: if the template's own sets are
//! no longer those the probe waited on, the probe is counted as changed under it (reported,
//! never averaged in); if they are the same, the agent did not follow and it is timed out.
//! A set already gone when the probe begins makes it count as changed under it, unwritten.
//! A pod deleted has no such excuse: it must leave every set that still exists.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netpol_agent::dataplane::watch::ipset::IpsetWatch;
use netpol_agent::kernel_text::ipset_save::{self, SetLine};

/// Time between two reads of the sets while waiting for a change.
const POLL: Duration = Duration::from_millis(1);
/// A probe not enforced within this is counted as timed out.
const LIMIT: Duration = Duration::from_secs(10);

/// Membership tests in one network namespace's IP sets.
pub struct SetTester {
    watch: IpsetWatch,
}

impl SetTester {
    /// A netfilter socket opened in network namespace `ns` (by name).
    pub fn open(ns: &str) -> SetTester {
        let watch = super::common::in_netns(ns, || IpsetWatch::open(netpol_agent::agent::ours()))
            .expect("ipset netlink socket");
        SetTester { watch }
    }

    /// Whether `ip` is in `set` (a CIDR member covering it counts, as for a packet).
    pub fn contains(&mut self, set: &str, ip: Ipv4Addr) -> io::Result<bool> {
        self.watch.contains(set, ip.into())
    }

    /// Polls until every set in `sets` holds `ip` (`want`) or none does (`!want`), for at
    /// most [`LIMIT`]. A set that no longer exists holds nothing: it ends a wait for `want`
    /// at once ([`Waited::SetGone`]) and satisfies a wait for `!want`.
    fn wait(&mut self, sets: &[String], ip: Ipv4Addr, want: bool) -> Waited {
        let deadline = std::time::Instant::now() + LIMIT;
        loop {
            let mut done = true;
            for set in sets {
                match self.contains(set, ip) {
                    Ok(held) if held == want => {}
                    Ok(_) => {
                        done = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        if want {
                            return Waited::SetGone;
                        }
                    }
                    Err(e) => return Waited::Error(format!("{set}: {e}")),
                }
            }
            if done {
                return Waited::Seen(now_nanos());
            }
            if std::time::Instant::now() > deadline {
                return Waited::Limit;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// How a wait for a change in the sets ended.
enum Waited {
    /// The Unix time in nanoseconds of the read that saw the change.
    Seen(u128),
    /// [`LIMIT`] passed first.
    Limit,
    /// A set the address should join no longer exists.
    SetGone,
    Error(String),
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Every IPv4 host address that is a member of a set in `ipset save` output, with the sets
/// that hold it. Members with a port (`ip,tcp:80`) and networks are left out: a probe pod
/// joins a set by its labels only.
pub fn members_by_address(save: &str) -> BTreeMap<Ipv4Addr, Vec<String>> {
    let mut out: BTreeMap<Ipv4Addr, Vec<String>> = BTreeMap::new();
    for line in ipset_save::lines(save) {
        if let SetLine::Add {
            name,
            entry: Some(entry),
            trailing: false,
        } = line
        {
            let host = entry.strip_suffix("/32").unwrap_or(entry);
            if let Ok(ip) = host.parse::<Ipv4Addr>() {
                out.entry(ip).or_default().push(name.to_string());
            }
        }
    }
    out
}

/// `scale-load probe`, running.
pub struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    /// Starts `cmd` (a shell command line that runs `scale-load probe`).
    pub fn start(cmd: &str) -> Writer {
        let mut child = Command::new("sh")
            .args(["-c", cmd])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("--probe command");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Writer {
            child,
            stdin,
            stdout,
        }
    }

    fn ask(&mut self, line: &str) -> Vec<String> {
        writeln!(self.stdin, "{line}").expect("probe writer's input");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("probe writer's output");
        assert!(!answer.is_empty(), "the probe writer exited");
        answer.split_whitespace().map(str::to_string).collect()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a series of probes measured, in milliseconds.
#[derive(Default)]
pub struct Results {
    pub add: Vec<f64>,
    pub delete: Vec<f64>,
    /// The API server's answer time for the writes that were measured: the status writes
    /// that add, the deletes.
    pub write_add: Vec<f64>,
    pub write_delete: Vec<f64>,
    pub timed_out: usize,
    /// Probes whose template's sets changed under them (churn edited or deleted a policy
    /// that selected them) before the pod added was seen: neither measured nor failed. One
    /// that changed before its first write wrote nothing, so has no delete either.
    pub changed_under: usize,
    pub failed: Vec<String>,
}

impl Results {
    pub fn report(&self, what: &str) -> String {
        let pct = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            if v.is_empty() {
                return "none".to_string();
            }
            let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
            format!(
                "p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1} ms (n {})",
                at(0.5),
                at(0.9),
                at(0.99),
                v[v.len() - 1],
                v.len()
            )
        };
        let mut line = format!(
            "event → enforced {what} (agent-0's IP sets): pod added {}; pod deleted {}; the API server's answer to those writes: status {}, delete {}; timed out {}; sets changed under the probe {}",
            pct(&self.add),
            pct(&self.delete),
            pct(&self.write_add),
            pct(&self.write_delete),
            self.timed_out,
            self.changed_under,
        );
        if !self.failed.is_empty() {
            line += &format!("; {} failed, first: {}", self.failed.len(), self.failed[0]);
        }
        line
    }
}

/// Probes of the agent in namespace `ns`. Probe `id` is pod `probe-<id>` with address
/// 100.64.0.1 + id (100.64.0.0/10: outside every pod network of the bench); ids start at
/// `first_id`, so rounds never reuse a name.
pub struct Prober {
    tester: SetTester,
    writer: Writer,
    ns: String,
    next_id: u32,
}

impl Prober {
    pub fn new(ns: &str, writer_cmd: &str, first_id: u32) -> Prober {
        Prober {
            tester: SetTester::open(ns),
            writer: Writer::start(writer_cmd),
            ns: ns.to_string(),
            next_id: first_id,
        }
    }

    /// Runs probes, one after the other and starting at most one per `every` (each is three
    /// writes that every agent receives), until `more()` is false.
    pub fn run(&mut self, results: &mut Results, every: Duration, mut more: impl FnMut() -> bool) {
        while more() {
            let started = std::time::Instant::now();
            if let Err(e) = self.once(results) {
                results.failed.push(e);
            }
            std::thread::sleep(every.saturating_sub(started.elapsed()));
        }
    }

    fn once(&mut self, results: &mut Results) -> Result<(), String> {
        let members = self.members();
        // Node-0's own pods (10.128.0.0/24, scale-load's podCIDR(0)) are local, not remote.
        let candidates: Vec<&Ipv4Addr> = members
            .keys()
            .filter(|ip| ip.octets()[..3] != [10, 128, 0])
            .collect();
        if candidates.is_empty() {
            return Err("agent-0's sets hold no remote pod address".into());
        }
        // A different slice of the candidates each time, so that probes spread over the sets.
        let start = (self.next_id as usize * 7919) % candidates.len();
        let asked: Vec<String> = candidates
            .iter()
            .cycle()
            .skip(start)
            .take(candidates.len().min(20))
            .map(|ip| ip.to_string())
            .collect();
        let answer = self.writer.ask(&format!("template {}", asked.join(" ")));
        let template: Ipv4Addr = match answer.first().map(String::as_str) {
            Some("template") if answer.len() == 4 => answer[3]
                .parse()
                .map_err(|_| format!("template answer {answer:?}"))?,
            _ => return Err(format!("template: {}", answer.join(" "))),
        };
        let sets = members.get(&template).cloned().unwrap_or_default();
        let id = self.next_id;
        self.next_id += 1;
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 1)) + id);
        for set in &sets {
            match self.tester.contains(set, ip) {
                Ok(false) => {}
                Ok(true) => return Err(format!("{ip} is already in {set} (a network member)")),
                // Gone since the read above: churn changed the sets before the probe began.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    results.changed_under += 1;
                    return Ok(());
                }
                Err(e) => return Err(format!("{set}: {e}")),
            }
        }
        // Each change: the writer's (T0, T1), then the reads until the sets follow.
        let ms = |from: u128, to: u128| to.saturating_sub(from) as f64 / 1e6;
        for (command, verb, want) in [
            (format!("add {id} {ip}"), "added", true),
            (format!("del {id}"), "deleted", false),
        ] {
            let answer = self.writer.ask(&command);
            let (t0, t1): (u128, u128) = match answer.as_slice() {
                [v, _, t0, t1] if v == verb => (
                    t0.parse().map_err(|_| format!("T0 in {answer:?}"))?,
                    t1.parse().map_err(|_| format!("T1 in {answer:?}"))?,
                ),
                _ => return Err(answer.join(" ")),
            };
            let (latency, write) = if want {
                (&mut results.add, &mut results.write_add)
            } else {
                (&mut results.delete, &mut results.write_delete)
            };
            match self.tester.wait(&sets, ip, want) {
                Waited::Seen(t) => {
                    latency.push(ms(t0, t));
                    write.push(ms(t0, t1));
                }
                Waited::Error(e) => return Err(e),
                Waited::Limit | Waited::SetGone if want => {
                    // The probe is a copy of the template: if the template's sets are still
                    // those waited on, the agent did not follow.
                    let now: BTreeSet<String> = self
                        .members()
                        .remove(&template)
                        .unwrap_or_default()
                        .into_iter()
                        .collect();
                    if now == sets.iter().cloned().collect() {
                        results.timed_out += 1;
                    } else {
                        results.changed_under += 1;
                    }
                }
                Waited::Limit | Waited::SetGone => results.timed_out += 1,
            }
        }
        Ok(())
    }

    /// The agent's sets now, by member address.
    fn members(&self) -> BTreeMap<Ipv4Addr, Vec<String>> {
        let save = super::common::run_ok("ip", &["netns", "exec", &self.ns, "ipset", "save"]);
        members_by_address(&save)
    }
}
