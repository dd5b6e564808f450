//! Flow logs (issue 22), the reading side: one thread at the edge reads the NFLOG group the
//! flow-log rules (`rules::flow_log`) send to, attributes each logged first packet to the
//! policy rule that decided it with the calculation graph's knowledge ([`super::attribution`]),
//! and aggregates connections per flush interval per (source, destination, destination port,
//! protocol, reporter, action, policy hit) in the [`store`]. At each flush the finished records
//! wake the streams and, when on, go to the JSON-lines [`file`]; [`api`] answers `GET /flows`
//! and `GET /flows/stream` on the health server.
//!
//! Attribution: an allow's prefix names the policy chain and the Kubernetes rule index; the
//! chain is read back to its policy through the published chain map (policy chain names may be
//! hashed). A deny or no-policy prefix names the pod's workload chain, whose owner and
//! isolating policies the map holds. The local end of an allow (shared policy chain) is named
//! by its address. An end the agent does not know yet is named again when the record is read
//! (the kernel decides before this agent may have read a new remote pod; see
//! `deny_log::NAME_GRACE` for the same race on deny lines), so a record read after the agent
//! learned the pod names it.
//!
//! Packet and byte counts and connection ends come from conntrack ([`conntrack`]), for the
//! connections logged (within the per-pod rate limit). Each flush's records also feed the
//! per-rule hit metric ([`rule_metric`]).
//!
//! The ends' labels come from the attribution when a record is read (kept only with flow logs
//! on). Pending (staged) verdicts are added by an [`Annotator`].
//!
//! Cost: the kernel's hashlimit bounds what reaches us per pod and direction; the store is
//! bounded (see [`store`]), so are the streams (see [`api`]) and the file (see [`file`]).
//!
//! Flow logs at two layers: the NFLOG rule text in `rules::flow_log`, the reader, store and API
//! in `traffic::flow_log`.

pub mod api;
pub mod conntrack;
pub mod file;
pub mod rule_metric;
pub mod store;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::host::nflog::{self, Config, Flow, LogPacket, Reader};
use crate::model::{ObjectKey, Tier};
use crate::rules::flow_log::{FlowAction, FlowPrefix};
use crate::rules::Direction;

use super::attribution::{Attribution, LocalChains};

pub use api::{record_json, route, stream_route, Filter, StreamQuery};
pub use file::{FileSettings, FlowFile};
pub use store::{Counts, FlowRecord, FlowStore, KEEP_RECORDS, MAX_KEYS};

/// Flow-log messages the kernel queues before it sends them in one datagram. Every new
/// connection is a message: sent one by one, each wakes the reader for one `poll` and one
/// `recv`, which was most of the agent's CPU per logged connection (issue 22's benchmark); in
/// batches the wake-ups and system calls are shared. Deny logs keep 1 (rate-limited, and a
/// line is wanted at once).
pub const KERNEL_BATCH: u32 = 256;
/// The longest a queued message waits for its batch: records are aggregated per flush
/// interval (seconds), so a tenth of a second changes nothing a reader sees but the interval
/// a connection opened at the very end of one falls in.
pub const KERNEL_BATCH_WAIT: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
pub struct FlowLogSettings {
    pub node: String,
    pub group: u16,
    pub snap_len: u32,
    pub flush_interval: Duration,
    /// The JSON-lines file target (`FELIX_FLOWLOGSFILEENABLED`), when on.
    pub file: Option<FileSettings>,
}

/// One end of a flow: the pod when the agent knows it, and always the address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct End {
    pub ip: IpAddr,
    pub pod: Option<ObjectKey>,
}

/// Which policy decided, as far as the agent can tell.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PolicyHit {
    /// Rule `rule` of this NetworkPolicy allowed the connection.
    Rule { policy: ObjectKey, rule: usize },
    /// These policies isolate the pod in this direction and no rule allowed.
    Isolated(Vec<ObjectKey>),
    /// No NetworkPolicy isolates the pod in this direction.
    NoPolicy,
    /// Rule `rule` (an Accept or a Deny) of this ClusterNetworkPolicy decided.
    ClusterRule {
        tier: Tier,
        name: String,
        rule: usize,
        allow: bool,
    },
    /// Dropped as the interface of no local pod (fail-closed).
    UnknownInterface,
    /// A chain the agent no longer knows (changed since the packet was logged).
    Unknown { chain: String },
}

/// What one record aggregates by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: End,
    pub dst: End,
    pub dst_port: Option<u16>,
    pub protocol: String,
    /// The direction whose policy decided: egress at the source's node, ingress at the
    /// destination's.
    pub reporter: Direction,
    pub action: FlowAction,
    pub hit: PolicyHit,
}

/// Attributes a logged first packet; `None` for a prefix that is not a flow-log one.
pub fn attribute(
    prefix: &FlowPrefix,
    flow: &Flow,
    chains: &LocalChains,
    pod_of: impl Fn(&IpAddr) -> Option<ObjectKey>,
) -> FlowKey {
    let mut src = End {
        ip: flow.src,
        pod: pod_of(&flow.src),
    };
    let mut dst = End {
        ip: flow.dst,
        pod: pod_of(&flow.dst),
    };
    let unknown = || PolicyHit::Unknown {
        chain: prefix.chain.clone(),
    };
    // A rule of a ClusterNetworkPolicy, read back through the chain map (names are hashed).
    let cluster = |allow: bool| match (chains.cluster_owner(&prefix.chain), prefix.rule) {
        (Some(owner), Some(rule)) => PolicyHit::ClusterRule {
            tier: owner.tier,
            name: owner.name.clone(),
            rule,
            allow,
        },
        _ => unknown(),
    };
    let hit = match prefix.action {
        FlowAction::Allow => match (chains.policy_of_chain(&prefix.chain), prefix.rule) {
            (Some(policy), Some(rule)) => PolicyHit::Rule {
                policy: policy.clone(),
                rule,
            },
            _ => cluster(true),
        },
        FlowAction::RuleDeny => cluster(false),
        FlowAction::UnknownInterface => PolicyHit::UnknownInterface,
        FlowAction::Deny | FlowAction::NoPolicy => match chains.owner(&prefix.chain) {
            Some(owner) => {
                // The chain is the pod's own: it names the local end, whatever the address
                // map says.
                match prefix.direction {
                    Direction::Ingress => dst.pod = Some(owner.pod.clone()),
                    Direction::Egress => src.pod = Some(owner.pod.clone()),
                }
                if prefix.action == FlowAction::Deny {
                    PolicyHit::Isolated(owner.policies.clone())
                } else {
                    PolicyHit::NoPolicy
                }
            }
            None => unknown(),
        },
    };
    FlowKey {
        src,
        dst,
        dst_port: flow.dst_port(),
        protocol: flow.protocol_name(),
        reporter: prefix.direction,
        action: prefix.action,
        hit,
    }
}

/// What the reader, the HTTP server and the streams share.
pub struct FlowLogShared {
    pub node: String,
    pub store: Mutex<FlowStore>,
    /// Notified (with `store`) when an interval was flushed: streams wait on it.
    pub flushed: Condvar,
    /// Streams open now.
    pub streams: AtomicUsize,
    /// The logged connections conntrack is read for.
    pub tracker: Mutex<conntrack::Tracker>,
    /// Conntrack reads that failed.
    pub conntrack_errors: Arc<AtomicU64>,
    pub attribution: Arc<Attribution>,
    pub foreign: AtomicU64,
    pub undecodable: AtomicU64,
    /// What adds to each record beyond the enforced verdict (the pending verdicts of staged
    /// policies, `traffic::staged`).
    pub annotator: Arc<dyn Annotator>,
}

/// Adds to flow records what flow logs do not compute themselves (the pending verdicts of
/// staged policies). A trait so that flow logs know nothing of who annotates: the staged
/// evaluator builds on the records' types, and the data walks one way.
pub trait Annotator: Send + Sync {
    /// Adds fields to one record's JSON.
    fn annotate(&self, record: &FlowRecord, json: &mut serde_json::Value);
    /// Sees the records of each finished interval, once.
    fn finished(&self, records: &[FlowRecord]);
}

/// No annotations: a record's pending verdict is its enforced one.
pub struct NoAnnotations;

impl Annotator for NoAnnotations {
    fn annotate(&self, _: &FlowRecord, v: &mut serde_json::Value) {
        v["pending_action"] = v["action"].clone();
        v["policies"]["pending_policies"] = v["policies"]["enforced_policies"].clone();
    }

    fn finished(&self, _: &[FlowRecord]) {}
}

impl FlowLogShared {
    pub fn new(node: &str, attribution: Arc<Attribution>) -> FlowLogShared {
        FlowLogShared::with_annotator(node, attribution, Arc::new(NoAnnotations))
    }

    pub fn with_annotator(
        node: &str,
        attribution: Arc<Attribution>,
        annotator: Arc<dyn Annotator>,
    ) -> FlowLogShared {
        FlowLogShared {
            node: node.to_string(),
            store: Mutex::new(FlowStore::default()),
            flushed: Condvar::new(),
            streams: AtomicUsize::new(0),
            tracker: Mutex::new(conntrack::Tracker::default()),
            conntrack_errors: Arc::new(AtomicU64::new(0)),
            attribution,
            foreign: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
            annotator,
        }
    }

    /// Ends the interval: its records become finished ones, the streams wake, and the records
    /// are returned (oldest first) for the file.
    pub fn flush(&self) -> Vec<FlowRecord> {
        // One lock at a time (the conntrack poll takes them in turn too).
        let live = self.tracker.lock().map(|t| t.live()).unwrap_or_default();
        let records = match self.store.lock() {
            Ok(mut store) => store.flush_with(&live, SystemTime::now()),
            Err(_) => return vec![],
        };
        self.flushed.notify_all();
        records
    }

    /// The records as JSON lines (named now), for the file.
    pub fn lines(&self, records: Vec<FlowRecord>) -> String {
        let mut out = String::new();
        for v in self.render(records, &Filter::default()) {
            out.push_str(&v.to_string());
            out.push('\n');
        }
        out
    }
}

struct Sink {
    shared: Arc<FlowLogShared>,
    flush_interval: Duration,
    next_flush: Instant,
    file: Option<FlowFile>,
    rule_hits: rule_metric::RuleHits,
}

impl nflog::PacketSink for Sink {
    fn packet(&mut self, packet: LogPacket) {
        let Ok(prefix) = FlowPrefix::parse(&packet.prefix) else {
            self.shared.foreign.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Ok(flow) = packet.flow() else {
            self.shared.undecodable.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let chains = self.shared.attribution.chains();
        let key = attribute(&prefix, &flow, &chains, |ip| {
            self.shared.attribution.pod_of(ip)
        });
        let at = packet.timestamp.unwrap_or_else(SystemTime::now);
        // Allowed connections get a conntrack entry: follow it for counts and its end.
        if key.action.verdict() == "allow" {
            if let (Some(id), Ok(mut tracker)) = (
                conntrack::ConnId::of_flow(&flow),
                self.shared.tracker.lock(),
            ) {
                tracker.follow(id, &key);
            }
        }
        if let Ok(mut store) = self.shared.store.lock() {
            store.observe(key, at);
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now >= self.next_flush {
            self.next_flush = now + self.flush_interval;
            let records = self.shared.flush();
            self.shared.annotator.finished(&records);
            self.rule_hits
                .count(&records, &self.shared.attribution.chains());
            if let Some(file) = self.file.as_mut() {
                // Errors are counted and logged by the target; the records stay in the API.
                let _ = file.write(&self.shared.lines(records));
            }
        }
    }
}

/// The running reader. Dropping it stops the thread and unbinds the group.
pub struct FlowLog {
    reader: Reader,
    shared: Arc<FlowLogShared>,
    exported: nflog::CountersSnapshot,
    exported_ct_errors: u64,
    failure_logged: bool,
}

impl FlowLog {
    /// Binds the group (in the calling thread's network namespace) and starts reading.
    /// Conntrack is read on a thread of its own until `stop` (a failure to open its socket is
    /// logged and leaves the records without counts).
    pub fn start(
        settings: &FlowLogSettings,
        attribution: Arc<Attribution>,
        annotator: Arc<dyn Annotator>,
        stop: Arc<AtomicBool>,
    ) -> Result<FlowLog, nflog::Error> {
        let shared = Arc::new(FlowLogShared::with_annotator(
            &settings.node,
            attribution,
            annotator,
        ));
        let sink = Sink {
            shared: shared.clone(),
            flush_interval: settings.flush_interval,
            next_flush: Instant::now() + settings.flush_interval,
            file: settings.file.clone().map(FlowFile::new),
            rule_hits: rule_metric::RuleHits::default(),
        };
        let reader = Reader::spawn_sink(
            Config {
                group: settings.group,
                snap_len: settings.snap_len,
                flush_threshold: KERNEL_BATCH,
                flush_timeout: KERNEL_BATCH_WAIT,
                batch_bytes: Some(nflog::MAX_BATCH_BYTES),
                ..Config::default()
            },
            sink,
        )?;
        let accounting = conntrack::enable_accounting(&conntrack::ACCT_SYSCTLS);
        crate::telemetry::metrics::global()
            .flow_log_conntrack_accounting
            .set(i64::from(accounting));
        if let Err(e) = conntrack::spawn(shared.clone(), stop) {
            tracing::error!(error = %e, "flow logs: cannot open conntrack; records will have no packet or byte counts and no connection ends");
        }
        Ok(FlowLog {
            reader,
            shared,
            exported: nflog::CountersSnapshot::default(),
            exported_ct_errors: 0,
            failure_logged: false,
        })
    }

    pub fn shared(&self) -> Arc<FlowLogShared> {
        self.shared.clone()
    }

    /// Copies the reader's counters into the metrics and reports a stopped reader once.
    pub fn sync(&mut self) {
        let m = crate::telemetry::metrics::global();
        let now = self.reader.counters().snapshot();
        let before = self.exported;
        m.flow_log_messages
            .inc_by(now.received.saturating_sub(before.received));
        m.flow_log_lost.inc_by(now.lost.saturating_sub(before.lost));
        m.flow_log_overruns
            .inc_by(now.overruns.saturating_sub(before.overruns));
        self.exported = now;
        let ct = self.shared.conntrack_errors.load(Ordering::Relaxed);
        m.flow_log_conntrack_errors
            .inc_by(ct.saturating_sub(self.exported_ct_errors));
        self.exported_ct_errors = ct;
        if !self.failure_logged {
            if let Some(why) = self.reader.failure() {
                tracing::error!("the flow-log reader stopped: {why}; flows are no longer recorded (restart the agent)");
                self.failure_logged = true;
            }
        }
    }
}

/// Where the HTTP server finds the flow store once the reader started (the server binds
/// before anything touches the kernel, the reader after).
pub type FlowsSlot = std::sync::OnceLock<Arc<FlowLogShared>>;

#[cfg(test)]
mod tests {
    use super::api::KEEPALIVE;
    use super::*;
    use crate::calc_graph::EndpointView;
    use crate::host::nflog::L4;
    use serde_json::{json, Value};

    fn key(s: &str) -> ObjectKey {
        let (ns, name) = s.split_once('/').unwrap();
        ObjectKey::new(ns, name)
    }

    fn tcp(src: &str, dst: &str, port: u16) -> Flow {
        Flow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 6,
            l4: L4::Ports {
                src: 40000,
                dst: port,
            },
        }
    }

    fn chains() -> LocalChains {
        let server = key("x/server");
        LocalChains::from_views(vec![EndpointView {
            key: &server,
            iface: "cali1",
            ingress: vec![key("x/allow-web")],
            egress: vec![],
        }])
        .with_policies([key("x/allow-web")])
    }

    fn lookup(ip: &IpAddr) -> Option<ObjectKey> {
        match ip.to_string().as_str() {
            "10.0.0.2" => Some(key("y/client")),
            "10.0.0.1" => Some(key("x/server")),
            _ => None,
        }
    }

    #[test]
    fn allow_deny_and_no_policy_are_attributed() {
        let chain = crate::rules::policy_chain(Direction::Ingress, "x", "allow-web");
        let allow = FlowPrefix::parse(&format!("npa-fa-in-1-{chain}")).unwrap();
        let k = attribute(&allow, &tcp("10.0.0.2", "10.0.0.1", 80), &chains(), lookup);
        assert_eq!(
            k.hit,
            PolicyHit::Rule {
                policy: key("x/allow-web"),
                rule: 1
            }
        );
        assert_eq!(k.src.pod, Some(key("y/client")));
        assert_eq!((k.dst_port, k.protocol.as_str()), (Some(80), "tcp"));
        let deny = FlowPrefix::parse("npa-fd-in-cali-tw-cali1").unwrap();
        let k = attribute(&deny, &tcp("192.0.2.1", "10.9.9.9", 81), &chains(), lookup);
        assert_eq!(k.hit, PolicyHit::Isolated(vec![key("x/allow-web")]));
        assert_eq!(
            k.dst.pod,
            Some(key("x/server")),
            "the chain names the local end"
        );
        assert_eq!(k.src.pod, None);
        let none = FlowPrefix::parse("npa-fn-eg-cali-fw-cali1").unwrap();
        let k = attribute(&none, &tcp("10.0.0.1", "10.0.0.2", 53), &chains(), lookup);
        assert_eq!(k.hit, PolicyHit::NoPolicy);
        assert_eq!(k.action.verdict(), "allow");
        // ClusterNetworkPolicy rules, read back with their tier; the unknown-interface drop.
        let admin = chains().with_cluster_policies([(Tier::Admin, "guard")]);
        let cnp = crate::rules::cluster::cluster_policy_chain(Direction::Ingress, "guard");
        let deny = FlowPrefix::parse(&format!("npa-fr-in-2-{cnp}")).unwrap();
        let k = attribute(&deny, &tcp("10.0.0.2", "10.0.0.1", 22), &admin, lookup);
        assert_eq!(
            k.hit,
            PolicyHit::ClusterRule {
                tier: Tier::Admin,
                name: "guard".into(),
                rule: 2,
                allow: false
            }
        );
        assert_eq!(k.action.verdict(), "deny");
        let v = record_json(
            "n",
            &FlowRecord {
                key: k,
                start: SystemTime::UNIX_EPOCH,
                end: SystemTime::UNIX_EPOCH,
                connections: 1,
                counts: Counts::default(),
                live: 0,
                seq: 1,
                active: Some(SystemTime::UNIX_EPOCH),
            },
            &lookup,
        );
        let p = &v["policies"]["enforced_policies"][0];
        assert_eq!(
            (
                &p["kind"],
                &p["tier"],
                &p["name"],
                &p["action"],
                &p["rule_index"]
            ),
            (
                &json!("ClusterNetworkPolicy"),
                &json!("Admin"),
                &json!("guard"),
                &json!("Deny"),
                &json!(2)
            )
        );
        let accept = FlowPrefix::parse(&format!("npa-fa-in-0-{cnp}")).unwrap();
        let k = attribute(&accept, &tcp("10.0.0.2", "10.0.0.1", 80), &admin, lookup);
        assert!(matches!(k.hit, PolicyHit::ClusterRule { allow: true, .. }));
        let unk = FlowPrefix::parse("npa-fu-in-cali-to-wl-dispatch").unwrap();
        let k = attribute(&unk, &tcp("10.0.0.2", "10.9.9.9", 80), &admin, lookup);
        assert_eq!(k.hit, PolicyHit::UnknownInterface);
        assert_eq!(k.action.verdict(), "deny");
        let gone = FlowPrefix::parse("npa-fa-in-0-cali-pi-gone").unwrap();
        let k = attribute(&gone, &tcp("10.0.0.2", "10.0.0.1", 80), &chains(), lookup);
        assert!(matches!(k.hit, PolicyHit::Unknown { .. }));
    }

    #[test]
    fn records_aggregate_per_key_and_interval_and_filter() {
        let chain = crate::rules::policy_chain(Direction::Ingress, "x", "allow-web");
        let allow = FlowPrefix::parse(&format!("npa-fa-in-0-{chain}")).unwrap();
        let deny = FlowPrefix::parse("npa-fd-in-cali-tw-cali1").unwrap();
        let mut store = FlowStore::default();
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        for s in [10, 11, 12] {
            store.observe(
                attribute(&allow, &tcp("10.0.0.2", "10.0.0.1", 80), &chains(), lookup),
                t(s),
            );
        }
        store.observe(
            attribute(&deny, &tcp("10.0.0.2", "10.0.0.1", 22), &chains(), lookup),
            t(13),
        );
        store.flush();
        store.observe(
            attribute(&allow, &tcp("10.0.0.2", "10.0.0.1", 80), &chains(), lookup),
            t(20),
        );
        let records = store.records();
        assert_eq!(records.len(), 3);
        assert_eq!(
            (records[0].connections, records[0].start, records[0].end),
            (3, t(10), t(12))
        );
        assert_eq!(records[2].connections, 1, "the next interval starts afresh");
        let f = Filter::parse("action=deny").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 1);
        let f = Filter::parse("policy=x%2Fallow-web&namespace=y").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 3);
        let f = Filter::parse("namespace=z").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 0);
        let f = Filter::parse("since=15").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 1);
        let f = Filter::parse("pod=x%2Fserver&until=12").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 1);
        let f = Filter::parse("pod=y/nobody").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 0);
        let f = Filter::parse("since=1970-01-01T00:00:13Z").unwrap();
        assert_eq!(records.iter().filter(|r| f.matches(r)).count(), 2);
        // A record whose connections began earlier but whose traffic was seen after `since`
        // is in: `since` asks what was active.
        let mut ridden = records[0].clone();
        ridden.active = Some(t(16));
        let f = Filter::parse("since=15").unwrap();
        assert!(f.matches(&ridden) && !f.matches(&records[0]));
        assert!(Filter::parse("pod=server").is_err());
        assert!(Filter::parse("until=yesterday").is_err());
        assert!(Filter::parse("live=5").is_err(), "live is the stream's");
        assert_eq!(
            StreamQuery::parse("live=2&action=allow").unwrap(),
            StreamQuery {
                filter: Filter::parse("action=allow").unwrap(),
                live: Some(Duration::from_secs(2)),
            }
        );
        assert!(StreamQuery::parse("live=0.1").is_err());
        assert!(StreamQuery::parse("lve=2").is_err());
        assert!(Filter::parse("acton=deny").is_err());
        assert!(Filter::parse("action=maybe").is_err());
        let v = record_json("node-1", &records[0], &lookup);
        assert_eq!(v["source_namespace"], "y");
        assert_eq!(v["dest_name"], "server");
        assert_eq!(v["reporter"], "Dst");
        assert_eq!(v["action"], "Allow");
        assert_eq!(v["policies"]["enforced_policies"][0]["name"], "allow-web");
        assert_eq!(v["policies"]["enforced_policies"][0]["rule_index"], 0);
        assert_eq!(v["num_connections_started"], 3);
        assert_eq!(v["interval"], "closed");
        assert_eq!(
            record_json("node-1", &records[2], &lookup)["interval"],
            "current"
        );
        // Sequence numbers: the two finished records, then nothing new.
        assert_eq!((records[0].seq, records[1].seq, records[2].seq), (1, 2, 0));
        assert_eq!(store.after(0).len(), 2);
        assert_eq!(store.after(1)[0].seq, 2);
        assert!(store.after(2).is_empty());
        assert_eq!(store.flush().len(), 1);
        assert_eq!(store.after(2)[0].seq, 3);
    }

    /// A client that takes `lines` lines and then goes away.
    struct Client {
        got: Vec<u8>,
        writes_left: usize,
        first_write: Option<Instant>,
    }

    impl std::io::Write for Client {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.writes_left == 0 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            self.writes_left -= 1;
            self.first_write.get_or_insert_with(Instant::now);
            self.got.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stream_sends_flushed_records_as_they_come_and_live_snapshots() {
        let attribution = Arc::new(Attribution::default());
        attribution.publish_chains(chains());
        let shared = Arc::new(FlowLogShared::new("n", attribution.clone()));
        let deny = FlowPrefix::parse("npa-fd-in-cali-tw-cali1").unwrap();
        let observe = |port| {
            let k = attribute(
                &deny,
                &tcp("10.0.0.2", "10.0.0.1", port),
                &attribution.chains(),
                lookup,
            );
            shared.store.lock().unwrap().observe(k, SystemTime::now());
        };
        // Flushed before the stream starts: not sent (no `since`).
        observe(1);
        shared.flush();
        observe(2);
        let flusher = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                shared.flush();
            })
        };
        let mut client = Client {
            got: vec![],
            writes_left: 1,
            first_write: None,
        };
        let started = Instant::now();
        let q = StreamQuery::parse("action=deny").unwrap();
        assert!(
            shared.stream(&q, &mut client).is_err(),
            "ends when the client leaves"
        );
        flusher.join().unwrap();
        let first = client.first_write.unwrap().duration_since(started);
        assert!(
            first < KEEPALIVE / 2,
            "woken by the flush, not the keepalive: {first:?}"
        );
        let lines: Vec<Value> = String::from_utf8(client.got)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["dest_port"], 2);
        assert_eq!(lines[0]["interval"], "closed");
        // `since` replays what is kept; `live` adds the current interval at once.
        observe(3);
        let mut client = Client {
            got: vec![],
            writes_left: 1,
            first_write: None,
        };
        let q = StreamQuery::parse("since=0&live=1").unwrap();
        let _ = shared.stream(&q, &mut client);
        let got = String::from_utf8(client.got).unwrap();
        let ports: Vec<(u64, String)> = got
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| {
                (
                    v["dest_port"].as_u64().unwrap(),
                    v["interval"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (1, "closed".into()),
                (2, "closed".into()),
                (3, "current".into())
            ]
        );
        assert_eq!(shared.streams.load(Ordering::Relaxed), 0);
    }

    /// A store holding one denied 10.0.0.7 -> 10.0.0.1:80 record of `attribution`.
    fn one_denied_record(attribution: &Arc<Attribution>) -> FlowLogShared {
        let deny = FlowPrefix::parse("npa-fd-in-cali-tw-cali1").unwrap();
        let shared = FlowLogShared::new("n", attribution.clone());
        let k = attribute(
            &deny,
            &tcp("10.0.0.7", "10.0.0.1", 80),
            &attribution.chains(),
            |ip| attribution.pod_of(ip),
        );
        shared
            .store
            .lock()
            .unwrap()
            .observe(k, SystemTime::UNIX_EPOCH);
        shared
    }

    #[test]
    fn an_end_learned_later_is_named_when_read() {
        let attribution = Arc::new(Attribution::default());
        attribution.publish_chains(chains());
        let shared = one_denied_record(&attribution);
        let before: Value = serde_json::from_str(&shared.query("").unwrap()).unwrap();
        assert_eq!(before[0]["source_name"], "");
        let pod = key("y/new");
        attribution.update_addresses([(&pod, &[][..], &["10.0.0.7".parse().unwrap()][..])]);
        let after: Value = serde_json::from_str(&shared.query("namespace=y").unwrap()).unwrap();
        assert_eq!(after[0]["source_name"], "new");
        assert_eq!(after[0]["dest_name"], "server");
    }

    #[test]
    fn records_carry_the_ends_labels_as_known_when_read() {
        let attribution = Arc::new(Attribution::with_labels());
        attribution.publish_chains(chains());
        let pod = key("y/new");
        attribution.update_addresses([(&pod, &[][..], &["10.0.0.7".parse().unwrap()][..])]);
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        attribution.update_labels([(pod.clone(), Some(labels(&[("tier", "1"), ("app", "web")])))]);
        let shared = one_denied_record(&attribution);
        let v: Value = serde_json::from_str(&shared.query("").unwrap()).unwrap();
        assert_eq!(v[0]["source_labels"], json!(["app=web", "tier=1"]));
        // The local end's labels were never published here: an empty list, not a guess.
        assert_eq!(v[0]["dest_labels"], json!([]));
        attribution.update_labels([(pod, None)]);
        let v: Value = serde_json::from_str(&shared.query("").unwrap()).unwrap();
        assert_eq!(v[0]["source_labels"], json!([]));
        // Without flow logs the attribution keeps no labels at all.
        let plain = Attribution::default();
        plain.update_labels([(key("y/new"), Some(labels(&[("app", "web")])))]);
        assert_eq!(plain.labels_of(&key("y/new")), None);
    }
}
