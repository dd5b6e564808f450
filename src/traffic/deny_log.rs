//! The deny-log reader: one thread at the edge that reads the NFLOG group the deny-log rules
//! (`rules::deny_log`) send to, decodes each packet into its flow, keeps one line per flow per
//! window, names both ends and the isolating policies with the calculation graph's knowledge
//! ([`super::attribution`]), and writes one structured log line per denied flow.
//!
//! A line (target `deny_log`, message `denied`) carries: `node`; `direction` (`ingress`: the
//! destination pod's policy dropped it, `egress`: the source pod's); `src` and `dst` (a pod as
//! `namespace/name`, else the address), `src_ip`, `src_port`, `dst_ip`, `dst_port` (or
//! `icmp_type`/`icmp_code`), `protocol`; `policies`: the policies isolating the pod in that
//! direction (`namespace/name`, comma-separated), or for a ClusterNetworkPolicy Deny rule's
//! drop that policy as `<tier>/<name>` (`Admin/deny-b`; tiers are capitalised, namespaces never
//! are), or `not programmed yet` for a pod whose
//! chains do not exist yet (the dispatch's unknown-interface drop); `chain` (the chain that
//! dropped it); `packet_time` (when the kernel saw the packet); and `suppressed` when packets of
//! the same flow were counted but not logged in its previous window. With `FELIX_LOGFORMAT=json`
//! every field is a top-level JSON field. Deny lines are written whatever the log severity.
//!
//! Cost model: the kernel's `-m limit` bounds what reaches us per pod and direction, so a flood
//! costs the kernel a token-bucket check per packet and the agent at most the configured rate;
//! deduplication bounds the lines further and its table is bounded (`DEDUP_CAPACITY`).
//!
//! Guarantees: nothing is opened unless [`DenyLog::start`] is called (deny logging on); binding
//! the group fails loudly (another process holds it) before the agent programs anything.
//! Messages read, lost (sequence gaps), overruns, undecodable ones, lines and suppressed packets
//! are all counted in the metrics.
//!
//! Deny logs at two layers: the NFLOG rule text in `rules::deny_log`, the reader of what those
//! rules send in `traffic::deny_log`.

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::host::nflog::dedup::{Dedup, Verdict};
use crate::host::nflog::{self, Config, Flow, LogPacket, Reader, L4};
use crate::model::{ObjectKey, Tier};
use crate::rules::deny_log::{DropKind, LogPrefix};
use crate::rules::Direction;
use crate::telemetry::metrics;

use super::attribution::{Attribution, LocalChains};

/// The most flows remembered for deduplication at once. The kernel's rate limit bounds what
/// arrives (rate x window per pod and direction), so this is only reached by thousands of
/// pods denied at once; past it, lines are written without being deduplicated.
pub const DEDUP_CAPACITY: usize = 65_536;

/// How long a line whose peer address names no pod waits for the agent to learn one. The
/// kernel's decision does not wait for the agent: a policy that denies everything drops
/// packets to a pod created a moment ago on another node before this agent has read the new
/// pod from the datastore (issue 22: the source's node named a new destination by its
/// address in 2 of 6 runs, because nothing on that node's kernel changes for the new pod, so
/// it counted as converged before its agent had seen the pod). Lines for known pods are not
/// delayed; lines for addresses that are no pod are written this much later.
pub const NAME_GRACE: Duration = Duration::from_millis(500);
/// The most lines held back at once; past it, lines are written as they are.
pub const HOLD_CAPACITY: usize = 4096;

/// Lines held back until their unknown peer address is named or [`NAME_GRACE`] passed. The
/// lines are attributed again (with the agent's current knowledge) only when the address map
/// changed or a deadline passed. Generic over what is held so the reader and tests share it.
#[derive(Debug)]
pub struct HoldBack<T> {
    held: std::collections::VecDeque<(Instant, T)>,
    generation: u64,
    grace: Duration,
}

impl<T> HoldBack<T> {
    pub fn new(grace: Duration) -> HoldBack<T> {
        HoldBack {
            held: std::collections::VecDeque::new(),
            generation: 0,
            grace,
        }
    }

    /// Holds `item` if there is room (`Err(item)` back when not: write it now).
    pub fn hold(&mut self, item: T, now: Instant) -> Result<(), T> {
        if self.held.len() >= HOLD_CAPACITY {
            return Err(item);
        }
        self.held.push_back((now + self.grace, item));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Hands out, in arrival order, the items `named` now accepts (the address map moved since
    /// the last look, `generation`) and the ones whose grace ran out (`named` is then told
    /// `expired`). `named` returns true when the item is ready to be written.
    pub fn release(
        &mut self,
        now: Instant,
        generation: u64,
        mut ready: impl FnMut(&T, bool) -> bool,
        mut write: impl FnMut(T),
    ) {
        let moved = generation != self.generation;
        self.generation = generation;
        if self.held.is_empty() || (!moved && self.held.front().is_some_and(|(d, _)| *d > now)) {
            return;
        }
        let mut keep = std::collections::VecDeque::with_capacity(self.held.len());
        for (deadline, item) in self.held.drain(..) {
            let expired = deadline <= now;
            if (moved || expired) && ready(&item, expired) {
                write(item);
            } else {
                keep.push_back((deadline, item));
            }
        }
        self.held = keep;
    }
}

/// Whether both ends of a line are named (a pod), so holding it back would gain nothing.
pub fn fully_named(d: &DeniedFlow) -> bool {
    matches!((&d.src, &d.dst), (Peer::Pod(_), Peer::Pod(_)))
}

/// The `tracing` target of deny lines.
pub const TARGET: &str = "deny_log";

#[derive(Clone, Debug)]
pub struct DenyLogSettings {
    pub node: String,
    pub group: u16,
    pub snap_len: u32,
    pub dedup_window: Duration,
}

/// One end of a denied flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    Pod(ObjectKey),
    Address(IpAddr),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Pod(k) => write!(f, "{}/{}", k.namespace, k.name),
            Peer::Address(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why the packet was dropped, as far as the graph knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// These policies isolate the pod in this direction and none allowed the packet.
    Isolated(Vec<ObjectKey>),
    /// The dispatch's unknown-interface drop: the pod has no chains yet.
    NotProgrammed,
    /// A pod chain the graph no longer has (removed since the packet was dropped).
    ChainGone,
    /// A Deny rule of this ClusterNetworkPolicy (tier, name) dropped it.
    ClusterDenied { tier: Tier, name: String },
    /// A ClusterNetworkPolicy chain the graph no longer has.
    ClusterGone,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Isolated(policies) => {
                let names: Vec<String> = policies
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .collect();
                write!(f, "{}", names.join(","))
            }
            Reason::NotProgrammed => write!(f, "not programmed yet"),
            Reason::ChainGone => write!(f, "unknown (the pod's chain is gone)"),
            Reason::ClusterDenied { tier, name } => write!(f, "{}/{name}", tier.as_str()),
            Reason::ClusterGone => write!(f, "unknown (the ClusterNetworkPolicy's chain is gone)"),
        }
    }
}

/// A denied flow, attributed: what one line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeniedFlow {
    pub at: SystemTime,
    pub direction: Direction,
    pub src: Peer,
    pub dst: Peer,
    pub flow: Flow,
    pub reason: Reason,
    pub chain: String,
}

/// Names a logged packet. The local end of a policy drop is the chain's pod; every other end
/// is looked up by address (`pod_of`), else shown as the address.
pub fn attribute(
    prefix: &LogPrefix,
    flow: Flow,
    at: SystemTime,
    chains: &LocalChains,
    pod_of: impl Fn(&IpAddr) -> Option<ObjectKey>,
) -> DeniedFlow {
    let peer = |ip: &IpAddr| match pod_of(ip) {
        Some(k) => Peer::Pod(k),
        None => Peer::Address(*ip),
    };
    let mut src = peer(&flow.src);
    let mut dst = peer(&flow.dst);
    let reason = match prefix.kind {
        DropKind::UnknownInterface => Reason::NotProgrammed,
        DropKind::Policy => match chains.owner(&prefix.chain) {
            Some(owner) => {
                match prefix.direction {
                    Direction::Ingress => dst = Peer::Pod(owner.pod.clone()),
                    Direction::Egress => src = Peer::Pod(owner.pod.clone()),
                }
                Reason::Isolated(owner.policies.clone())
            }
            None => Reason::ChainGone,
        },
        // The chain is the policy's, shared by every pod it selects: both ends are named by
        // address (ingress: the destination is the pod, egress: the source).
        DropKind::Cluster => match chains.cluster_owner(&prefix.chain) {
            Some(owner) => Reason::ClusterDenied {
                tier: owner.tier,
                name: owner.name.clone(),
            },
            None => Reason::ClusterGone,
        },
    };
    DeniedFlow {
        at,
        direction: prefix.direction,
        src,
        dst,
        flow,
        reason,
        chain: prefix.chain.clone(),
    }
}

/// Writes the line for `d` (see the module comment for its fields).
pub fn emit(node: &str, d: &DeniedFlow, suppressed_before: u64) {
    let (icmp_type, icmp_code) = match d.flow.l4 {
        L4::Icmp { kind, code } => (Some(kind), Some(code)),
        _ => (None, None),
    };
    let at = jiff::Timestamp::try_from(d.at)
        .map(|t| t.to_string())
        .unwrap_or_default();
    tracing::info!(
        target: TARGET,
        node = %node,
        direction = %d.direction.as_str(),
        src = %d.src,
        src_ip = %d.flow.src,
        src_port = d.flow.src_port(),
        dst = %d.dst,
        dst_ip = %d.flow.dst,
        dst_port = d.flow.dst_port(),
        protocol = %d.flow.protocol_name(),
        icmp_type,
        icmp_code,
        policies = %d.reason,
        chain = %d.chain,
        packet_time = %at,
        suppressed = (suppressed_before > 0).then_some(suppressed_before),
        "denied"
    );
}

/// A line waiting for its peer to be named.
#[derive(Debug)]
struct Held {
    prefix: LogPrefix,
    flow: Flow,
    at: SystemTime,
    suppressed_before: u64,
}

/// What the sink keeps between packets (on the reader thread).
struct Sink {
    node: String,
    attribution: Arc<Attribution>,
    dedup: Dedup<(DropKind, Direction, String, Flow)>,
    foreign: Arc<AtomicU64>,
    undecodable: Arc<AtomicU64>,
    held: HoldBack<Held>,
}

impl nflog::PacketSink for Sink {
    fn packet(&mut self, packet: LogPacket) {
        Sink::packet(self, packet)
    }

    fn tick(&mut self) {
        let generation = self.attribution.address_generation();
        let attribution = &self.attribution;
        let node = &self.node;
        self.held.release(
            Instant::now(),
            generation,
            |h, expired| {
                expired || {
                    let chains = attribution.chains();
                    fully_named(&attribute(&h.prefix, h.flow, h.at, &chains, |ip| {
                        attribution.pod_of(ip)
                    }))
                }
            },
            |h| {
                let chains = attribution.chains();
                let denied = attribute(&h.prefix, h.flow, h.at, &chains, |ip| {
                    attribution.pod_of(ip)
                });
                emit(node, &denied, h.suppressed_before);
                metrics::global().deny_log_lines.inc();
            },
        );
    }
}

impl Sink {
    fn packet(&mut self, packet: LogPacket) {
        let m = metrics::global();
        let Ok(prefix) = LogPrefix::parse(&packet.prefix) else {
            // Another rule logging to our group; not ours to describe.
            self.foreign.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let flow = match packet.flow() {
            Ok(flow) => flow,
            Err(e) => {
                self.undecodable.fetch_add(1, Ordering::Relaxed);
                m.deny_log_undecodable.inc();
                tracing::debug!(error = %e, prefix = %packet.prefix, "a denied packet that does not decode");
                return;
            }
        };
        let key = (prefix.kind, prefix.direction, prefix.chain.clone(), flow);
        let suppressed_before = match self.dedup.observe(&key, Instant::now()) {
            Verdict::Suppress => {
                m.deny_log_suppressed.inc();
                return;
            }
            Verdict::Report { suppressed_before } => suppressed_before,
        };
        let chains = self.attribution.chains();
        let at = packet.timestamp.unwrap_or_else(SystemTime::now);
        let denied = attribute(&prefix, flow, at, &chains, |ip| self.attribution.pod_of(ip));
        if !fully_named(&denied) {
            let held = Held {
                prefix,
                flow,
                at,
                suppressed_before,
            };
            if self.held.hold(held, Instant::now()).is_ok() {
                return;
            }
        }
        emit(&self.node, &denied, suppressed_before);
        m.deny_log_lines.inc();
    }
}

/// The running reader. Dropping it stops the thread and unbinds the group.
pub struct DenyLog {
    reader: Reader,
    exported: nflog::CountersSnapshot,
    failure_logged: bool,
}

impl DenyLog {
    /// Binds the group (in the calling thread's network namespace) and starts reading.
    pub fn start(
        settings: &DenyLogSettings,
        attribution: Arc<Attribution>,
    ) -> Result<DenyLog, nflog::Error> {
        let sink = Sink {
            node: settings.node.clone(),
            attribution,
            dedup: Dedup::new(settings.dedup_window, DEDUP_CAPACITY),
            foreign: Arc::new(AtomicU64::new(0)),
            undecodable: Arc::new(AtomicU64::new(0)),
            held: HoldBack::new(NAME_GRACE),
        };
        let reader = Reader::spawn_sink(
            Config {
                group: settings.group,
                snap_len: settings.snap_len,
                ..Config::default()
            },
            sink,
        )?;
        Ok(DenyLog {
            reader,
            exported: nflog::CountersSnapshot::default(),
            failure_logged: false,
        })
    }

    /// Copies the reader's counters into the metrics and reports, once, a reader that
    /// stopped on an error. Cheap (a few atomic loads); called on the calculation loop's turns.
    pub fn sync(&mut self) {
        let m = metrics::global();
        let now = self.reader.counters().snapshot();
        let before = self.exported;
        m.deny_log_messages
            .inc_by(now.received.saturating_sub(before.received));
        m.deny_log_lost.inc_by(now.lost.saturating_sub(before.lost));
        m.deny_log_overruns
            .inc_by(now.overruns.saturating_sub(before.overruns));
        m.deny_log_undecodable
            .inc_by(now.undecodable.saturating_sub(before.undecodable));
        self.exported = now;
        if !self.failure_logged {
            if let Some(why) = self.reader.failure() {
                tracing::error!("the deny-log reader stopped: {why}; denied packets are no longer logged (restart the agent)");
                self.failure_logged = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calc_graph::EndpointView;

    fn key(s: &str) -> ObjectKey {
        let (ns, name) = s.split_once('/').unwrap();
        ObjectKey::new(ns, name)
    }

    fn tcp(src: &str, dst: &str) -> Flow {
        Flow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 6,
            l4: L4::Ports {
                src: 40000,
                dst: 80,
            },
        }
    }

    fn chains() -> LocalChains {
        let server = key("x/server");
        LocalChains::from_views(vec![EndpointView {
            key: &server,
            iface: "cali1",
            ingress: vec![key("x/allow-web"), key("x/deny-all")],
            egress: vec![],
        }])
    }

    fn lookup(ip: &IpAddr) -> Option<ObjectKey> {
        match ip.to_string().as_str() {
            "10.0.0.2" => Some(key("y/client")),
            "10.0.0.1" => Some(key("x/server")),
            _ => None,
        }
    }

    #[test]
    fn a_policy_drop_names_the_chains_pod_the_peer_and_the_isolating_policies() {
        let prefix = LogPrefix::parse("npa-pol-in-cali-tw-cali1").unwrap();
        let d = attribute(
            &prefix,
            tcp("10.0.0.2", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(d.direction, Direction::Ingress);
        assert_eq!(d.src, Peer::Pod(key("y/client")));
        assert_eq!(d.dst, Peer::Pod(key("x/server")));
        assert_eq!(d.reason.to_string(), "x/allow-web,x/deny-all");
        assert_eq!(d.chain, "cali-tw-cali1");
        // An address no pod holds is shown as the address.
        let d = attribute(
            &prefix,
            tcp("192.0.2.9", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(d.src.to_string(), "192.0.2.9");
    }

    #[test]
    fn the_local_end_comes_from_the_chain_not_the_address() {
        // The address map lags behind (or another pod reuses the address): the chain decides.
        let prefix = LogPrefix::parse("npa-pol-in-cali-tw-cali1").unwrap();
        let d = attribute(
            &prefix,
            tcp("10.0.0.2", "10.9.9.9"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(d.dst, Peer::Pod(key("x/server")));
        // Egress: the source is the chain's pod.
        let prefix = LogPrefix::parse("npa-pol-eg-cali-fw-cali1").unwrap();
        let d = attribute(
            &prefix,
            tcp("10.9.9.9", "10.0.0.2"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(
            (d.src.clone(), d.dst.clone()),
            (Peer::Pod(key("x/server")), Peer::Pod(key("y/client")))
        );
        assert_eq!(d.reason, Reason::Isolated(vec![]));
    }

    #[test]
    fn a_cluster_policy_deny_names_the_policy_and_both_ends_by_address() {
        use crate::model::Tier;
        use crate::rules::cluster::cluster_policy_chain;
        let long_name = "a-rather-long-policy-name-that-is-hashed";
        let chains =
            chains().with_cluster_policies([(Tier::Admin, "deny-b"), (Tier::Baseline, long_name)]);
        let ingress = LogPrefix {
            kind: DropKind::Cluster,
            direction: Direction::Ingress,
            chain: cluster_policy_chain(Direction::Ingress, "deny-b"),
        };
        let ingress = LogPrefix::parse(&ingress.render().unwrap()).unwrap();
        let d = attribute(
            &ingress,
            tcp("10.0.0.2", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains,
            lookup,
        );
        assert_eq!(d.direction, Direction::Ingress);
        assert_eq!(d.src, Peer::Pod(key("y/client")));
        assert_eq!(d.dst, Peer::Pod(key("x/server")));
        assert_eq!(d.reason.to_string(), "Admin/deny-b");
        assert_eq!(d.chain, "cali-pi-kcnp/deny-b");
        // Egress, through a hashed chain name: the source is the pod.
        let chain = cluster_policy_chain(Direction::Egress, long_name);
        assert!(chain.starts_with("cali-po-_"));
        let egress = LogPrefix::parse(&format!("npa-cnp-eg-{chain}")).unwrap();
        let d = attribute(
            &egress,
            tcp("10.0.0.1", "192.0.2.9"),
            SystemTime::UNIX_EPOCH,
            &chains,
            lookup,
        );
        assert_eq!(d.direction, Direction::Egress);
        assert_eq!(d.src, Peer::Pod(key("x/server")));
        assert_eq!(d.dst, Peer::Address("192.0.2.9".parse().unwrap()));
        assert_eq!(
            d.reason,
            Reason::ClusterDenied {
                tier: Tier::Baseline,
                name: long_name.into()
            }
        );
        assert_eq!(d.reason.to_string(), format!("Baseline/{long_name}"));
        // A policy the graph no longer has.
        let gone = LogPrefix::parse("npa-cnp-in-cali-pi-kcnp/gone").unwrap();
        let d = attribute(
            &gone,
            tcp("10.0.0.2", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains,
            lookup,
        );
        assert_eq!(d.reason, Reason::ClusterGone);
    }

    #[test]
    fn unknown_interface_drops_say_not_programmed_and_gone_chains_say_so() {
        let prefix = LogPrefix::parse("npa-unk-in-cali-to-wl-dispatch").unwrap();
        let d = attribute(
            &prefix,
            tcp("10.0.0.2", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(d.reason.to_string(), "not programmed yet");
        assert_eq!(d.dst, Peer::Pod(key("x/server")), "named by address");
        let prefix = LogPrefix::parse("npa-pol-in-cali-tw-gone").unwrap();
        let d = attribute(
            &prefix,
            tcp("10.0.0.2", "10.0.0.1"),
            SystemTime::UNIX_EPOCH,
            &chains(),
            lookup,
        );
        assert_eq!(d.reason, Reason::ChainGone);
    }

    /// The hold: what is held back and when it is written.
    mod hold {
        use super::*;

        #[test]
        fn held_lines_wait_for_a_name_or_their_grace_and_keep_their_order() {
            let t0 = Instant::now();
            let mut h = HoldBack::new(Duration::from_millis(500));
            h.hold("a", t0).unwrap();
            h.hold("b", t0 + Duration::from_millis(100)).unwrap();
            let mut out = Vec::new();
            // Nothing moved and no deadline passed: nobody is looked at.
            h.release(
                t0 + Duration::from_millis(10),
                0,
                |_, _| panic!("looked"),
                |x| out.push(x),
            );
            assert!(out.is_empty());
            // The address map moved and named "b" only.
            h.release(
                t0 + Duration::from_millis(200),
                1,
                |x, _| *x == "b",
                |x| out.push(x),
            );
            assert_eq!(out, vec!["b"]);
            assert_eq!(h.len(), 1);
            // "a"'s grace ran out: written whatever it is.
            h.release(
                t0 + Duration::from_millis(500),
                1,
                |_, expired| expired,
                |x| out.push(x),
            );
            assert_eq!(out, vec!["b", "a"]);
            assert!(h.is_empty());
        }

        #[test]
        fn a_full_hold_writes_at_once() {
            let t0 = Instant::now();
            let mut h = HoldBack::new(NAME_GRACE);
            for i in 0..HOLD_CAPACITY {
                h.hold(i, t0).unwrap();
            }
            assert_eq!(h.hold(HOLD_CAPACITY, t0), Err(HOLD_CAPACITY));
        }

        #[test]
        fn a_new_remote_pod_learned_after_the_drop_is_named_in_the_line() {
            // The source's node: x/c's egress chain dropped a packet to 10.244.2.11 before the
            // agent had read y/c; the address arrives while the line is held.
            use crate::calc_graph::EndpointView;
            let client = ObjectKey::new("x", "c");
            let attribution = Attribution::default();
            attribution.publish_chains(LocalChains::from_views(vec![EndpointView {
                key: &client,
                iface: "cali1",
                ingress: vec![],
                egress: vec![ObjectKey::new("x", "deny-egress")],
            }]));
            let prefix = LogPrefix::parse("npa-pol-eg-cali-fw-cali1").unwrap();
            let flow = Flow {
                src: "10.244.1.5".parse().unwrap(),
                dst: "10.244.2.11".parse().unwrap(),
                protocol: 6,
                l4: L4::Ports {
                    src: 40000,
                    dst: 80,
                },
            };
            let at = SystemTime::UNIX_EPOCH;
            let now = || {
                let chains = attribution.chains();
                attribute(&prefix, flow, at, &chains, |ip| attribution.pod_of(ip))
            };
            let first = now();
            assert_eq!(first.dst.to_string(), "10.244.2.11");
            assert!(!fully_named(&first));
            let t0 = Instant::now();
            let mut h = HoldBack::new(NAME_GRACE);
            h.hold((), t0).unwrap();
            let mut written = Vec::new();
            h.release(
                t0,
                attribution.address_generation(),
                |_, e| e || fully_named(&now()),
                |_| written.push(now()),
            );
            assert!(written.is_empty(), "held while unknown");
            let y = ObjectKey::new("y", "c");
            attribution.update_addresses([(&y, &[][..], &["10.244.2.11".parse().unwrap()][..])]);
            h.release(
                t0 + Duration::from_millis(50),
                attribution.address_generation(),
                |_, e| e || fully_named(&now()),
                |_| written.push(now()),
            );
            assert_eq!(written.len(), 1);
            assert_eq!(written[0].dst.to_string(), "y/c");
            assert_eq!(written[0].src.to_string(), "x/c");
        }
    }
}
