//! Conntrack re-evaluation, the I/O half: a thread that keeps the [`Mirror`] of the objects,
//! and at most once per interval lists the tracked connections of the local pods a change
//! marked, deletes the ones the new policy state denies ([`reevaluate::decide`]), and logs and
//! counts each cut. Off (the default) means no thread and no socket.
//!
//! Ordering: the calculation loop hands each batch's changes over only once the dataplane has
//! applied that batch (the callback rides on the batch), so an entry is deleted after the
//! kernel holds the rules that deny it; deleted earlier, the connection's next packet would
//! be judged by the old rules and tracked again. Changes from before the first apply (the
//! initial listing) only fill the mirror: what the previous run allowed is not second-guessed
//! at start.
//!
//! Bounded work (coalescing): changes are applied to the mirror as they come, and each marks
//! the local pods it may have shrunk (see [`reevaluate`]); the marked set is drained at most
//! once per interval (`FELIX_CONNTRACKREEVALUATEINTERVAL`, 250 ms by default), so a storm of
//! label changes costs at most one re-evaluation per interval whatever its size. One
//! re-evaluation is: the evaluator's state built once from the mirror, one conntrack dump per
//! IP family of the marked pods' addresses (the whole table crosses to us once and is filtered
//! here by address, which also sidesteps the kernel's inverted IPv6 filter), one
//! `State::allowed` per entry of a marked pod, and one delete per denied entry. Nothing runs
//! while no pod is marked.
//!
//! A cut is logged at info level (target `conntrack_cut`) with the flow as judged, both sides'
//! names, the direction whose policy denies it and the changes that marked the pod, and
//! counted in `netpol_conntrack_cuts_total`.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::{debug, info, warn};

use crate::host::conntrack::{ConntrackSocket, Deleted, Family};
use crate::rules::RuleConfig;
use crate::telemetry::metrics;

use super::reevaluate::{self, Change, Marked, Mirror};

/// What the re-evaluation thread needs.
#[derive(Clone, Debug)]
pub struct CutterSettings {
    /// This node: its pods are the local ones.
    pub node: String,
    /// The rule configuration the graph renders with (the evaluator follows it).
    pub rules: RuleConfig,
    /// At most one re-evaluation per interval.
    pub interval: Duration,
}

/// One batch's changes, handed over once the dataplane applied it. `cut` is false for the
/// batches before the first apply (they only fill the mirror).
#[derive(Debug)]
pub struct Job {
    pub changes: Vec<Change>,
    pub cut: bool,
}

/// The running thread; dropping the sender (with this) ends it.
pub struct Cutter {
    tx: Sender<Job>,
    _thread: JoinHandle<()>,
}

impl Cutter {
    /// Opens the conntrack socket (in the calling thread's network namespace, so a failure
    /// stops the agent before anything is programmed) and starts the thread.
    pub fn spawn(settings: CutterSettings, stop: Arc<AtomicBool>) -> anyhow::Result<Cutter> {
        let socket = ConntrackSocket::open()
            .context("conntrack re-evaluation (FELIX_CONNTRACKREEVALUATE): opening ctnetlink")?;
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(move || run(settings, socket, rx, stop))
            .context("starting the conntrack re-evaluation thread")?;
        Ok(Cutter {
            tx,
            _thread: thread,
        })
    }

    /// Where to send jobs.
    pub fn sender(&self) -> Sender<Job> {
        self.tx.clone()
    }
}

fn run(
    settings: CutterSettings,
    mut socket: ConntrackSocket,
    rx: Receiver<Job>,
    stop: Arc<AtomicBool>,
) {
    let mut mirror = Mirror::new(settings.node.clone());
    let mut marked = Marked::new();
    let mut last: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let due = last.map(|t| t + settings.interval);
        let wait = match (&marked.is_empty(), due) {
            (false, Some(d)) => d.saturating_duration_since(Instant::now()),
            (false, None) => Duration::ZERO,
            (true, _) => Duration::from_secs(1),
        };
        match rx.recv_timeout(wait) {
            Ok(job) => {
                absorb(&mut mirror, &mut marked, job);
                while let Ok(job) = rx.try_recv() {
                    absorb(&mut mirror, &mut marked, job);
                }
                if due.is_some_and(|d| Instant::now() < d) {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if marked.is_empty() {
            continue;
        }
        last = Some(Instant::now());
        let pods = std::mem::take(&mut marked);
        reevaluate_once(&settings, &mirror, &pods, &mut socket);
    }
}

fn absorb(mirror: &mut Mirror, marked: &mut Marked, job: Job) {
    let mut scratch = Marked::new();
    let into = if job.cut { marked } else { &mut scratch };
    for change in job.changes {
        mirror.apply(change, into);
    }
}

/// One re-evaluation of the marked pods: list, decide, delete, log.
fn reevaluate_once(
    settings: &CutterSettings,
    mirror: &Mirror,
    marked: &Marked,
    socket: &mut ConntrackSocket,
) {
    let m = metrics::global();
    let pods = mirror.addresses_of(marked);
    if pods.is_empty() {
        return;
    }
    m.conntrack_reevaluations.inc();
    let start = Instant::now();
    let hosts = host_addresses().unwrap_or_else(|e| {
        warn!(error = %e, "cannot list the node's addresses; traffic from the node to its pods is judged as from outside");
        Vec::new()
    });
    let state = mirror.state(settings.rules.clone(), &hosts);
    let mut families: Vec<Family> = Vec::new();
    for ip in pods.keys() {
        if !families.contains(&Family::of(*ip)) {
            families.push(Family::of(*ip));
        }
    }
    let mut entries = Vec::new();
    for family in families {
        match socket.list(Some(family), |e| {
            pods.contains_key(&e.original.src) || pods.contains_key(&e.reply.src)
        }) {
            Ok(listing) => entries.extend(listing.entries),
            Err(e) => {
                m.conntrack_errors.inc();
                warn!(error = %e, ?family, "listing conntrack entries failed; the marked pods are not re-evaluated this time");
            }
        }
    }
    m.conntrack_entries_evaluated.inc_by(entries.len() as u64);
    let cuts = reevaluate::decide(
        &state,
        &pods,
        entries.iter().map(|e| (&e.original, &e.reply)),
    );
    let mut cut = 0;
    for c in &cuts {
        let entry = &entries[c.entry];
        match socket.delete(entry) {
            Ok(Deleted::Deleted) => {
                cut += 1;
                m.conntrack_cuts
                    .with_label_values(&[c.denied_by.as_str()])
                    .inc();
                let causes: Vec<String> = marked
                    .get(&c.listed_for)
                    .into_iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect();
                info!(
                    target: "conntrack_cut",
                    node = settings.node.as_str(),
                    protocol = c.protocol.as_str(),
                    src = c.src_name.as_str(),
                    src_ip = %c.src,
                    src_port = entry.original.src_port.unwrap_or(0),
                    dst = c.dst_name.as_str(),
                    dst_ip = %c.dst,
                    dst_port = c.port,
                    denied_by = c.denied_by.as_str(),
                    pod = c.denying_pod.as_ref().map(ToString::to_string).unwrap_or_default(),
                    causes = causes.join("; "),
                    "connection cut: policy now denies it"
                );
            }
            Ok(Deleted::Gone) => debug!(entry = %entry, "conntrack entry already gone"),
            Err(e) => {
                m.conntrack_errors.inc();
                warn!(error = %e, entry = %entry, "deleting a conntrack entry failed");
            }
        }
    }
    debug!(
        pods = marked.len(),
        entries = entries.len(),
        cut,
        us = start.elapsed().as_micros() as u64,
        "conntrack re-evaluation"
    );
}

/// Every address of the node's network namespace (the node's own traffic to its pods is not
/// policed; the evaluator needs to know it).
fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    Ok(crate::host::netlink::read_local_addresses(None)?
        .into_iter()
        .collect())
}
