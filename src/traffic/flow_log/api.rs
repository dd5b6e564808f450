//! What flow logs answer with: the record as JSON (one schema for `GET /flows`, the stream and
//! the JSON-lines file), the filters, and the routes on the health server: `GET /flows` (a
//! JSON array) and `GET /flows/stream` (newline-delimited JSON: each record as its interval is
//! flushed, and with `live=<s>` the current interval's records every `s` seconds).
//!
//! Guarantees: a filter parameter this does not know is an error (400), never ignored, so a
//! typo cannot widen what is shown; at most [`MAX_STREAMS`] streams are open at once (the
//! next is answered 503); a stream writes at least an empty line every [`KEEPALIVE`], so a
//! client that went away is noticed and its thread ends.

use std::io::{self, Write};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::model::ObjectKey;
use crate::rules::Direction;
use crate::telemetry::http::{Reply, Stream};

use super::store::FlowRecord;
use super::{End, FlowLogShared, FlowsSlot, PolicyHit};

/// Streams open at once at most.
pub const MAX_STREAMS: usize = 16;
/// The longest a stream stays silent: an empty line is written then.
pub const KEEPALIVE: Duration = Duration::from_secs(10);
/// The shortest `live` interval a stream accepts.
pub const MIN_LIVE: Duration = Duration::from_secs(1);

/// Filters of `GET /flows` and `GET /flows/stream`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Either end's namespace.
    pub namespace: Option<String>,
    /// Either end, `namespace/name`.
    pub pod: Option<String>,
    /// `allow` or `deny`.
    pub action: Option<String>,
    /// `namespace/name` of a NetworkPolicy, or the name of a ClusterNetworkPolicy, the
    /// record names.
    pub policy: Option<String>,
    /// Records that ended, or last saw traffic, at or after this time.
    pub since: Option<SystemTime>,
    /// Records that started at or before this time.
    pub until: Option<SystemTime>,
}

/// A query of the stream: its filter, and how often the current interval is sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamQuery {
    pub filter: Filter,
    pub live: Option<Duration>,
}

const PARAMETERS: &str = "namespace, pod, action, policy, since, until";

/// Unix seconds or an RFC 3339 time (`2026-11-27T04:00:00Z`).
fn parse_time(k: &str, v: &str) -> Result<SystemTime, String> {
    if let Ok(secs) = v.parse::<u64>() {
        return Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
    }
    v.parse::<jiff::Timestamp>()
        .map(SystemTime::from)
        .map_err(|_| format!("{k}={v}: Unix seconds or an RFC 3339 time expected"))
}

impl Filter {
    /// Reads a query string; unknown parameters are an error (a typo must not widen a filter).
    pub fn parse(query: &str) -> Result<Filter, String> {
        let mut f = Filter::default();
        for (k, v) in pairs(query) {
            if !f.take(&k, v)? {
                return Err(format!("unknown parameter {k:?}: {PARAMETERS}"));
            }
        }
        Ok(f)
    }

    /// Takes one parameter; `Ok(false)` when it is not a filter's.
    fn take(&mut self, k: &str, v: String) -> Result<bool, String> {
        match k {
            "namespace" => self.namespace = Some(v),
            "pod" => {
                if !v.contains('/') {
                    return Err(format!("pod={v}: namespace/name expected"));
                }
                self.pod = Some(v)
            }
            "action" => {
                let v = v.to_ascii_lowercase();
                if v != "allow" && v != "deny" {
                    return Err(format!("action={v}: allow or deny"));
                }
                self.action = Some(v);
            }
            "policy" => self.policy = Some(v),
            "since" => self.since = Some(parse_time(k, &v)?),
            "until" => self.until = Some(parse_time(k, &v)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub fn matches(&self, r: &FlowRecord) -> bool {
        let k = &r.key;
        if let Some(ns) = &self.namespace {
            let in_ns = |e: &End| e.pod.as_ref().is_some_and(|p| &p.namespace == ns);
            if !in_ns(&k.src) && !in_ns(&k.dst) {
                return false;
            }
        }
        if let Some(pod) = &self.pod {
            let is = |e: &End| e.pod.as_ref().is_some_and(|p| p.to_string() == *pod);
            if !is(&k.src) && !is(&k.dst) {
                return false;
            }
        }
        if let Some(a) = &self.action {
            if k.action.verdict() != a {
                return false;
            }
        }
        if let Some(p) = &self.policy {
            if !policy_names(&k.hit).iter().any(|n| n == p) {
                return false;
            }
        }
        if self.since.is_some_and(|since| r.latest() < since) {
            return false;
        }
        if self.until.is_some_and(|until| r.start > until) {
            return false;
        }
        true
    }
}

impl StreamQuery {
    /// The filters plus `live=<seconds>` (≥ 1).
    pub fn parse(query: &str) -> Result<StreamQuery, String> {
        let mut q = StreamQuery::default();
        for (k, v) in pairs(query) {
            if k == "live" {
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= MIN_LIVE.as_secs_f64())
                    .ok_or_else(|| format!("live={v}: seconds, at least 1"))?;
                q.live = Some(Duration::from_secs_f64(secs.min(86_400.0)));
            } else if !q.filter.take(&k, v)? {
                return Err(format!("unknown parameter {k:?}: {PARAMETERS}, live"));
            }
        }
        Ok(q)
    }
}

/// The names `policy=` matches for a hit.
pub fn policy_names(hit: &PolicyHit) -> Vec<String> {
    match hit {
        PolicyHit::Rule { policy, .. } => vec![policy.to_string()],
        PolicyHit::Isolated(ps) => ps.iter().map(ToString::to_string).collect(),
        PolicyHit::ClusterRule { name, .. } => vec![name.clone()],
        PolicyHit::NoPolicy | PolicyHit::Unknown { .. } | PolicyHit::UnknownInterface => vec![],
    }
}

fn pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (
                    bytes.get(i + 1).and_then(|b| hex(*b)),
                    bytes.get(i + 2).and_then(|b| hex(*b)),
                ) {
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

/// One record as JSON; the schema is documented in docs/operations/flow-logs.md. Goldmane's
/// field names where they fit; ours besides: `source_ip`/`dest_ip` (an end the agent does
/// not know as a pod has an empty name), `node`, `verdict`, `interval` (`closed` or
/// `current`).
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
        PolicyHit::ClusterRule {
            tier,
            name,
            rule,
            allow,
        } => vec![json!({
            "kind": "ClusterNetworkPolicy",
            "namespace": "",
            "name": name,
            "tier": tier.as_str(),
            "action": if *allow { "Allow" } else { "Deny" },
            "rule_index": rule,
        })],
        PolicyHit::NoPolicy | PolicyHit::Unknown { .. } | PolicyHit::UnknownInterface => vec![],
    };
    let verdict = match &k.hit {
        PolicyHit::Rule { .. } | PolicyHit::ClusterRule { .. } => "rule",
        PolicyHit::UnknownInterface => "interface of no local pod (fail-closed)",
        PolicyHit::Isolated(_) => "isolated, no rule allowed",
        PolicyHit::NoPolicy => "no policy isolates the pod",
        PolicyHit::Unknown { .. } => "unknown (the chain changed since)",
    };
    json!({
        "start_time": rfc3339(r.start),
        "end_time": rfc3339(r.end),
        "last_active_time": r.active.map(rfc3339),
        "interval": if r.closed() { "closed" } else { "current" },
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
        "num_connections_completed": r.counts.completed,
        "num_connections_live": r.live,
        "packets_in": r.counts.packets_in,
        "packets_out": r.counts.packets_out,
        "bytes_in": r.counts.bytes_in,
        "bytes_out": r.counts.bytes_out,
    })
}

impl FlowLogShared {
    /// Names the ends the agent did not know when the packet was logged and knows now.
    pub fn named(&self, mut r: FlowRecord) -> FlowRecord {
        for e in [&mut r.key.src, &mut r.key.dst] {
            if e.pod.is_none() {
                e.pod = self.attribution.pod_of(&e.ip);
            }
        }
        r
    }

    /// The records that pass `filter`, named now, as JSON.
    pub fn render(&self, records: Vec<FlowRecord>, filter: &Filter) -> Vec<Value> {
        let attribution = &self.attribution;
        let pod_of = |ip: &IpAddr| attribution.pod_of(ip);
        records
            .into_iter()
            // Name unknown ends now, before filtering by namespace or pod.
            .map(|r| self.named(r))
            .filter(|r| filter.matches(r))
            .map(|r| {
                let mut v = record_json(&self.node, &r, &pod_of);
                // The ends' labels as the agent knows them now (Goldmane's fields).
                let labels = |pod: &Option<ObjectKey>| -> Value {
                    let list = pod.as_ref().and_then(|k| attribution.labels_of(k));
                    json!(list.as_deref().unwrap_or_default())
                };
                v["source_labels"] = labels(&r.key.src.pod);
                v["dest_labels"] = labels(&r.key.dst.pod);
                self.annotator.annotate(&r, &mut v);
                v
            })
            .collect()
    }

    /// `GET /flows?…`: a JSON array of the matching records, oldest first.
    pub fn query(&self, query: &str) -> Result<String, String> {
        let filter = Filter::parse(query)?;
        let records = self.store.lock().map(|s| s.records()).unwrap_or_default();
        serde_json::to_string(&self.render(records, &filter)).map_err(|e| e.to_string())
    }

    /// Writes the stream of `GET /flows/stream` until the client goes away: the finished
    /// records (from the start of what is kept when the query has `since`, else from now),
    /// each as it is flushed, one JSON object a line; with `live`, the current interval's
    /// records every `live` seconds.
    pub fn stream(&self, q: &StreamQuery, out: &mut dyn Write) -> io::Result<()> {
        let mut last = if q.filter.since.is_some() {
            0
        } else {
            self.store.lock().map(|s| s.last_seq()).unwrap_or(0)
        };
        let mut next_live = q.live.map(|_| Instant::now());
        loop {
            let now = Instant::now();
            let wait = next_live
                .map_or(KEEPALIVE, |t| t.saturating_duration_since(now))
                .min(KEEPALIVE);
            let (finished, current) = {
                let store = self
                    .store
                    .lock()
                    .map_err(|_| io::Error::other("poisoned"))?;
                let store = if store.last_seq() <= last && !wait.is_zero() {
                    self.flushed
                        .wait_timeout(store, wait)
                        .map_err(|_| io::Error::other("poisoned"))?
                        .0
                } else {
                    store
                };
                let finished = store.after(last);
                last = store.last_seq();
                let live_due = next_live.is_some_and(|t| Instant::now() >= t);
                let current = if live_due { store.current() } else { vec![] };
                (finished, current)
            };
            if let (Some(t), Some(every)) = (next_live.as_mut(), q.live) {
                if Instant::now() >= *t {
                    *t = Instant::now() + every;
                }
            }
            let mut lines = String::new();
            for v in self
                .render(finished, &q.filter)
                .into_iter()
                .chain(self.render(current, &q.filter))
            {
                lines.push_str(&v.to_string());
                lines.push('\n');
            }
            if lines.is_empty() {
                // Keeps the connection honest: a client that left makes this write fail.
                lines.push('\n');
            }
            out.write_all(lines.as_bytes())?;
            out.flush()?;
        }
    }
}

/// `GET /flows[?namespace=&pod=&action=&policy=&since=&until=]` on the health server: a JSON
/// array of records (400 with a line for a bad filter, 503 before the reader started).
pub fn route(slot: &FlowsSlot, path: &str, query: &str) -> Option<Reply> {
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

/// `GET /flows/stream[?filters&live=<s>]`: newline-delimited JSON until the client leaves.
/// `Err` is the reply instead (400 bad query, 503 before the reader started or with
/// [`MAX_STREAMS`] open).
pub fn stream_route(slot: &FlowsSlot, path: &str, query: &str) -> Option<Result<Stream, Reply>> {
    if path != "/flows/stream" {
        return None;
    }
    let Some(shared) = slot.get().cloned() else {
        return Some(Err(Reply::text(503, "flow logs are starting")));
    };
    let q = match StreamQuery::parse(query) {
        Ok(q) => q,
        Err(why) => return Some(Err(Reply::text(400, why))),
    };
    if shared.streams.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
        shared.streams.fetch_sub(1, Ordering::AcqRel);
        return Some(Err(Reply::text(
            503,
            format!("{MAX_STREAMS} flow streams are open already"),
        )));
    }
    Some(Ok(Stream {
        content_type: "application/x-ndjson",
        write: Box::new(move |out: &mut dyn Write| {
            let result = shared.stream(&q, out);
            shared.streams.fetch_sub(1, Ordering::AcqRel);
            result
        }),
    }))
}
