//! Flow logs (issue 22), the reading side: one thread at the edge reads the NFLOG group the
//! flow-log rules (`rules::flow_log`) send to, attributes each logged first packet to the
//! policy rule that decided it with the calculation graph's knowledge ([`super::attribution`]),
//! and aggregates connections per flush interval per (source, destination, destination port,
//! protocol, reporter, action, policy hit). [`FlowStore`] keeps the current interval and the
//! last [`KEEP_RECORDS`] finished records for `GET /flows`.
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
//! Not in this slice: packet and byte counts and connection ends from conntrack (records count
//! connections started, as the kernel logged them within the per-pod rate limit), labels,
//! ClusterNetworkPolicy hits and unknown-interface drops, pending (staged) policies.
//!
//! Cost: the kernel's hashlimit bounds what reaches us per pod and direction; the store holds
//! at most [`MAX_KEYS`] keys per interval (more are counted in `overflow`) and
//! [`KEEP_RECORDS`] finished records.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::host::nflog::{self, Config, Flow, LogPacket, Reader};
use crate::model::ObjectKey;
use crate::rules::flow_log::{FlowAction, FlowPrefix};
use crate::rules::Direction;

use super::attribution::{Attribution, LocalChains};

/// Keys one interval aggregates at most; packets of further keys are counted, not kept.
pub const MAX_KEYS: usize = 100_000;
/// Finished records kept for the API.
pub const KEEP_RECORDS: usize = 50_000;

#[derive(Clone, Debug)]
pub struct FlowLogSettings {
    pub node: String,
    pub group: u16,
    pub snap_len: u32,
    pub flush_interval: Duration,
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

/// One record: a key's connections within one interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowRecord {
    pub key: FlowKey,
    pub start: SystemTime,
    pub end: SystemTime,
    /// Connections whose first packet was logged (within the per-pod rate limit).
    pub connections: u64,
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
    let hit = match prefix.action {
        FlowAction::Allow => match (chains.policy_of_chain(&prefix.chain), prefix.rule) {
            (Some(policy), Some(rule)) => PolicyHit::Rule {
                policy: policy.clone(),
                rule,
            },
            _ => PolicyHit::Unknown {
                chain: prefix.chain.clone(),
            },
        },
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
            None => PolicyHit::Unknown {
                chain: prefix.chain.clone(),
            },
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

struct Open {
    first: SystemTime,
    last: SystemTime,
    connections: u64,
}

/// The current interval's aggregates and the finished records. Shared by the reader thread
/// (writes) and the HTTP server (reads), behind one mutex held briefly.
#[derive(Default)]
pub struct FlowStore {
    current: HashMap<FlowKey, Open>,
    finished: VecDeque<FlowRecord>,
    overflow: u64,
}

impl FlowStore {
    pub fn observe(&mut self, key: FlowKey, at: SystemTime) {
        if let Some(open) = self.current.get_mut(&key) {
            open.connections += 1;
            open.first = open.first.min(at);
            open.last = open.last.max(at);
            return;
        }
        if self.current.len() >= MAX_KEYS {
            self.overflow += 1;
            return;
        }
        self.current.insert(
            key,
            Open {
                first: at,
                last: at,
                connections: 1,
            },
        );
    }

    /// Ends the interval: its aggregates become records (oldest dropped past
    /// [`KEEP_RECORDS`]).
    pub fn flush(&mut self) {
        let mut records: Vec<FlowRecord> = self
            .current
            .drain()
            .map(|(key, o)| FlowRecord {
                key,
                start: o.first,
                end: o.last,
                connections: o.connections,
            })
            .collect();
        records.sort_by_key(|r| r.start);
        for r in records {
            if self.finished.len() >= KEEP_RECORDS {
                self.finished.pop_front();
            }
            self.finished.push_back(r);
        }
    }

    /// The finished records, then the current interval's (as records so far), oldest first.
    pub fn records(&self) -> Vec<FlowRecord> {
        let mut out: Vec<FlowRecord> = self.finished.iter().cloned().collect();
        let mut open: Vec<FlowRecord> = self
            .current
            .iter()
            .map(|(key, o)| FlowRecord {
                key: key.clone(),
                start: o.first,
                end: o.last,
                connections: o.connections,
            })
            .collect();
        open.sort_by_key(|r| r.start);
        out.extend(open);
        out
    }

    pub fn overflow(&self) -> u64 {
        self.overflow
    }
}

/// `GET /flows` filters (`?namespace=x&action=deny&policy=x/allow-web&since=<unix s>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Either end's namespace.
    pub namespace: Option<String>,
    /// `allow` or `deny`.
    pub action: Option<String>,
    /// `namespace/name` of a policy the record names.
    pub policy: Option<String>,
    /// Records that ended at or after this time (Unix seconds).
    pub since: Option<u64>,
}

impl Filter {
    /// Reads a query string; unknown parameters are an error (a typo must not widen a filter).
    pub fn parse(query: &str) -> Result<Filter, String> {
        let mut f = Filter::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            match k {
                "namespace" => f.namespace = Some(v),
                "action" => {
                    let v = v.to_ascii_lowercase();
                    if v != "allow" && v != "deny" {
                        return Err(format!("action={v}: allow or deny"));
                    }
                    f.action = Some(v);
                }
                "policy" => f.policy = Some(v),
                "since" => {
                    f.since = Some(
                        v.parse()
                            .map_err(|_| format!("since={v}: Unix seconds expected"))?,
                    )
                }
                _ => {
                    return Err(format!(
                        "unknown parameter {k:?}: namespace, action, policy, since"
                    ))
                }
            }
        }
        Ok(f)
    }

    pub fn matches(&self, r: &FlowRecord) -> bool {
        let k = &r.key;
        if let Some(ns) = &self.namespace {
            let in_ns = |e: &End| e.pod.as_ref().is_some_and(|p| &p.namespace == ns);
            if !in_ns(&k.src) && !in_ns(&k.dst) {
                return false;
            }
        }
        if let Some(a) = &self.action {
            if k.action.verdict() != a {
                return false;
            }
        }
        if let Some(p) = &self.policy {
            let names: Vec<String> = match &k.hit {
                PolicyHit::Rule { policy, .. } => vec![policy.to_string()],
                PolicyHit::Isolated(ps) => ps.iter().map(ToString::to_string).collect(),
                _ => vec![],
            };
            if !names.iter().any(|n| n == p) {
                return false;
            }
        }
        if let Some(since) = self.since {
            let end = r
                .end
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            if end < since {
                return false;
            }
        }
        true
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// One record as JSON. Goldmane's field names where they fit (`source_name`,
/// `source_namespace`, `dest_name`, `dest_namespace`, `dest_port`, `proto`, `reporter`
/// `Src`/`Dst`, `action` `Allow`/`Deny`, `policies.enforced_policies[]` with `kind`,
/// `namespace`, `name`, `tier`, `action`, `rule_index`, `start_time`/`end_time`,
/// `num_connections_started`); ours besides: `source_ip`/`dest_ip` (an end the agent does
/// not know as a pod has an empty name), `node`, and `trigger`-less policy hits (`isolated`
/// lists the policies isolating the pod when none allowed).
pub fn record_json(
    node: &str,
    r: &FlowRecord,
    pod_of: &dyn Fn(&IpAddr) -> Option<ObjectKey>,
) -> Value {
    let k = &r.key;
    let name = |e: &End| e.pod.clone().or_else(|| pod_of(&e.ip));
    let (sn, sns) = match name(&k.src) {
        Some(p) => (p.name, p.namespace),
        None => (String::new(), String::new()),
    };
    let (dn, dns) = match name(&k.dst) {
        Some(p) => (p.name, p.namespace),
        None => (String::new(), String::new()),
    };
    let action = match k.action.verdict() {
        "allow" => "Allow",
        _ => "Deny",
    };
    let enforced: Vec<Value> = match &k.hit {
        PolicyHit::Rule { policy, rule } => vec![json!({
            "kind": "NetworkPolicy",
            "namespace": policy.namespace,
            "name": policy.name,
            "tier": "default",
            "action": "Allow",
            "rule_index": rule,
        })],
        PolicyHit::Isolated(ps) => ps
            .iter()
            .map(|p| {
                json!({
                    "kind": "NetworkPolicy",
                    "namespace": p.namespace,
                    "name": p.name,
                    "tier": "default",
                    "action": "Deny",
                    "rule_index": -1,
                })
            })
            .collect(),
        PolicyHit::NoPolicy | PolicyHit::Unknown { .. } => vec![],
    };
    let verdict = match &k.hit {
        PolicyHit::Rule { .. } => "rule",
        PolicyHit::Isolated(_) => "isolated, no rule allowed",
        PolicyHit::NoPolicy => "no policy isolates the pod",
        PolicyHit::Unknown { .. } => "unknown (the chain changed since)",
    };
    json!({
        "start_time": rfc3339(r.start),
        "end_time": rfc3339(r.end),
        "node": node,
        "source_name": sn,
        "source_namespace": sns,
        "source_ip": k.src.ip.to_string(),
        "dest_name": dn,
        "dest_namespace": dns,
        "dest_ip": k.dst.ip.to_string(),
        "dest_port": k.dst_port,
        "proto": k.protocol,
        "reporter": match k.reporter { Direction::Egress => "Src", Direction::Ingress => "Dst" },
        "action": action,
        "verdict": verdict,
        "policies": { "enforced_policies": enforced, "pending_policies": [] },
        "num_connections_started": r.connections,
    })
}

/// What the reader and the HTTP server share.
pub struct FlowLogShared {
    pub node: String,
    pub store: Mutex<FlowStore>,
    pub attribution: Arc<Attribution>,
    pub foreign: AtomicU64,
    pub undecodable: AtomicU64,
}

impl FlowLogShared {
    /// `GET /flows?…`: a JSON array of the matching records, oldest first.
    pub fn query(&self, query: &str) -> Result<String, String> {
        let filter = Filter::parse(query)?;
        let records = self.store.lock().map(|s| s.records()).unwrap_or_default();
        let attribution = &self.attribution;
        let pod_of = |ip: &IpAddr| attribution.pod_of(ip);
        let out: Vec<Value> = records
            .iter()
            .map(|r| {
                // Name unknown ends now, before filtering by namespace.
                let mut r = r.clone();
                for e in [&mut r.key.src, &mut r.key.dst] {
                    if e.pod.is_none() {
                        e.pod = pod_of(&e.ip);
                    }
                }
                r
            })
            .filter(|r| filter.matches(r))
            .map(|r| record_json(&self.node, &r, &pod_of))
            .collect();
        serde_json::to_string(&out).map_err(|e| e.to_string())
    }
}

struct Sink {
    shared: Arc<FlowLogShared>,
    flush_interval: Duration,
    next_flush: Instant,
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
        if let Ok(mut store) = self.shared.store.lock() {
            store.observe(key, at);
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now >= self.next_flush {
            self.next_flush = now + self.flush_interval;
            if let Ok(mut store) = self.shared.store.lock() {
                store.flush();
            }
        }
    }
}

/// The running reader. Dropping it stops the thread and unbinds the group.
pub struct FlowLog {
    reader: Reader,
    shared: Arc<FlowLogShared>,
    exported: nflog::CountersSnapshot,
    failure_logged: bool,
}

impl FlowLog {
    /// Binds the group (in the calling thread's network namespace) and starts reading.
    pub fn start(
        settings: &FlowLogSettings,
        attribution: Arc<Attribution>,
    ) -> Result<FlowLog, nflog::Error> {
        let shared = Arc::new(FlowLogShared {
            node: settings.node.clone(),
            store: Mutex::new(FlowStore::default()),
            attribution,
            foreign: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
        });
        let sink = Sink {
            shared: shared.clone(),
            flush_interval: settings.flush_interval,
            next_flush: Instant::now() + settings.flush_interval,
        };
        let reader = Reader::spawn_sink(
            Config {
                group: settings.group,
                snap_len: settings.snap_len,
                ..Config::default()
            },
            sink,
        )?;
        Ok(FlowLog {
            reader,
            shared,
            exported: nflog::CountersSnapshot::default(),
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

/// `GET /flows[?namespace=&action=&policy=&since=]` on the health server: a JSON array of
/// records (400 with a line for a bad filter, 503 before the reader started).
pub fn route(slot: &FlowsSlot, path: &str, query: &str) -> Option<crate::telemetry::http::Reply> {
    use crate::telemetry::http::Reply;
    if path != "/flows" {
        return None;
    }
    let Some(shared) = slot.get() else {
        return Some(Reply::text(503, "flow logs are starting"));
    };
    Some(match shared.query(query) {
        Ok(body) => Reply {
            status: 200,
            content_type: "application/json",
            body,
        },
        Err(why) => Reply::text(400, why),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calc_graph::EndpointView;
    use crate::host::nflog::L4;

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
    }

    #[test]
    fn an_end_learned_later_is_named_when_read() {
        let attribution = Arc::new(Attribution::default());
        attribution.publish_chains(chains());
        let deny = FlowPrefix::parse("npa-fd-in-cali-tw-cali1").unwrap();
        let shared = FlowLogShared {
            node: "n".into(),
            store: Mutex::new(FlowStore::default()),
            attribution: attribution.clone(),
            foreign: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
        };
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
        let before: Value = serde_json::from_str(&shared.query("").unwrap()).unwrap();
        assert_eq!(before[0]["source_name"], "");
        let pod = key("y/new");
        attribution.update_addresses([(&pod, &[][..], &["10.0.0.7".parse().unwrap()][..])]);
        let after: Value = serde_json::from_str(&shared.query("namespace=y").unwrap()).unwrap();
        assert_eq!(after[0]["source_name"], "new");
        assert_eq!(after[0]["dest_name"], "server");
    }
}
