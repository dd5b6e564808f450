//! `run --check-flow-logs`: after a step's probes, every probe must be in the flow records
//! (`GET /flows`, docs/operations/flow-logs.md) of the node(s) whose policy decided it, saying
//! what `netpol-agent explain` says of that flow, and no record of the step may claim a flow
//! that was not sent.
//!
//! Which node records what follows from where the flow-log copies sit
//! (`src/rules/flow_log.rs`): in the workload chains and the policy chains they jump to, so a
//! node reports exactly the directions it enforces.
//! - **Egress** (`reporter` `Src`) at the source pod's node, for every probe that left: the
//!   source's `cali-fw-` chain sees every new connection of the pod.
//! - **Ingress** (`reporter` `Dst`) at the destination pod's node, exactly when egress let the
//!   packet through (a packet its own node dropped never reaches the destination's chains).
//!   Two pods on one node: that node records both directions.
//!
//! What a direction's record must say comes from explain's verdict for the post-DNAT flow
//! (`explain_check::probe_flow`, the agent's own evaluator), per the tier that decided:
//! - no tier decided (no NetworkPolicy isolates the pod, no ClusterNetworkPolicy matched):
//!   `Allow`, verdict "no policy isolates the pod", no policy;
//! - NetworkPolicy allowed: `Allow`, verdict "rule", exactly that policy with the Kubernetes
//!   rule index explain names (the first allow the kernel meets);
//! - NetworkPolicy denied: `Deny`, verdict "isolated, no rule allowed", the isolating
//!   policies (rule index -1);
//! - a ClusterNetworkPolicy tier decided (the agent logs those decisions: `npa-fa`/`npa-fr`
//!   copies in its chains, `src/rules/flow_log.rs`): `Allow` or `Deny`, verdict "rule", exactly
//!   that ClusterNetworkPolicy with the tier (`Admin`/`Baseline`) and rule index explain names.
//!
//! Every record also names both pods (namespace and name), the addresses, the destination
//! port, the protocol and the node that served it.
//!
//! A Service probe of a port the Service does not declare is not DNATed: its flow is to the
//! ClusterIP, no pod, so only egress is decided, and only where kube-proxy lets it reach our
//! chains (iptables mode: required; nftables mode rejects it first: no record may exist).
//!
//! Telling steps apart: records aggregate connections per interval and carry no source port,
//! so a step's records are told by time: those whose `end_time` is at or after the start of
//! the step's last probe round. That window also holds records that are not the round's:
//! - records that start no connection (`num_connections_started` 0): conntrack's packet and
//!   byte counts, connection ends and live connections of connections logged before, added in
//!   a later poll or interval. They claim no new flow and carry the verdict the connection had
//!   when it began, so they are counted and not judged;
//! - records that began before the round (`start_time` earlier) and reach into it, because
//!   conntrack's counts of an earlier step's probes were added to them after the round began,
//!   or because a key's earlier connections and the round's share one interval: such a record
//!   must agree with this step's expectation for its key or with an earlier step's
//!   ([`Earlier`]); a retried step's first round (its probes ran on a ruleset the runner
//!   found not settled) may also have left one, which must still be a flow the step probed.
//!
//! Every other record in the window starts connections in the round, so it must match a probe
//! of the round with the verdict explain gives now; a record of a flow no probe sent, a probe
//! without its record, or a record with another action, policy or rule index fails the step.
//!
//! Naming: the kernel may log a packet before the agent has read a pod that was just created
//! on another node (that node's kernel needs nothing new to drop or pass it, so it counts as
//! converged); the agent names such an end again when the record is read. The check reads
//! until the step's records agree, up to [`SETTLE`], so a record still unnamed after that is a
//! real attribution defect.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime};

use netpol_agent::model::IpFamily;
use netpol_agent::verdict::{Action, Endpoint};
use serde_json::Value;

use crate::cluster::{node_name, Cluster, FLOWS_PORT};
use crate::explain_check::{load_state, probe_flow};
use crate::family::addr_of;
use crate::netns::in_netns;
use crate::probe::SourcePorts;
use crate::scenario::{PortKey, Step, Target};
use crate::services::ServiceProxy;

mod want;
pub(crate) use want::{want_of, want_of_json, Enforced, Want};

/// How long records may take to appear, and to name both ends, after the probes ended.
pub(crate) const SETTLE: Duration = Duration::from_secs(3);

/// One direction's record as a probe makes it: which node served it and the flow it names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RecordKey {
    pub(crate) node: String,
    /// `Src` (egress) or `Dst` (ingress).
    pub(crate) reporter: &'static str,
    proto: String,
    src_ip: String,
    dst_ip: String,
    dst_port: u64,
}

impl RecordKey {
    pub(crate) fn new(
        node: &str,
        reporter: &'static str,
        proto: &str,
        src_ip: std::net::IpAddr,
        dst_ip: std::net::IpAddr,
        dst_port: u16,
    ) -> RecordKey {
        RecordKey {
            node: node.to_string(),
            reporter,
            proto: proto.to_ascii_lowercase(),
            src_ip: src_ip.to_string(),
            dst_ip: dst_ip.to_string(),
            dst_port: u64::from(dst_port),
        }
    }
}

/// One expected direction of one probe.
pub(crate) struct Expected {
    /// `ns/pod -> ns/pod proto/port (family)`, for messages.
    pub(crate) what: String,
    pub(crate) key: RecordKey,
    src: String,
    dst: String,
    /// The ends' labels as `key=value`, sorted (`[]` for an end that is no pod).
    src_labels: Vec<String>,
    dst_labels: Vec<String>,
    want: Want,
    /// A record must exist (otherwise one is checked only if present).
    pub(crate) required: bool,
    /// The probe may have ridden a connection conntrack still held (see [`Ends::client_ports`]).
    may_ride: bool,
}

/// The records one node served, each with the key it names (`None`: a field is missing).
pub(crate) fn record_key(node: &str, r: &Value) -> Option<RecordKey> {
    Some(RecordKey {
        node: node.to_string(),
        reporter: match r["reporter"].as_str()? {
            "Src" => "Src",
            "Dst" => "Dst",
            _ => return None,
        },
        proto: r["proto"].as_str()?.to_string(),
        src_ip: r["source_ip"].as_str()?.to_string(),
        dst_ip: r["dest_ip"].as_str()?.to_string(),
        dst_port: r["dest_port"].as_u64()?,
    })
}

fn enforced_of(r: &Value) -> Vec<Enforced> {
    let mut out: Vec<Enforced> = r["policies"]["enforced_policies"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|p| Enforced {
            kind: p["kind"].as_str().unwrap_or("").to_string(),
            namespace: p["namespace"].as_str().unwrap_or("").to_string(),
            name: p["name"].as_str().unwrap_or("").to_string(),
            action: p["action"].as_str().unwrap_or("").to_string(),
            rule_index: p["rule_index"].as_i64().unwrap_or(i64::MIN),
        })
        .collect();
    out.sort();
    out
}

/// `ns/name` of one end, or empty when the record names no pod there (no name).
fn names(r: &Value, side: &str) -> String {
    let ns = r[format!("{side}_namespace")].as_str().unwrap_or("");
    let name = r[format!("{side}_name")].as_str().unwrap_or("");
    if name.is_empty() {
        String::new()
    } else {
        format!("{ns}/{name}")
    }
}

/// How a record's verdict differs from `want` (`None`: it agrees).
fn verdict_wrong(want: &Want, r: &Value) -> Option<String> {
    let ok = match want {
        Want::Record {
            action,
            verdict,
            policies,
        } => r["action"] == *action && r["verdict"] == *verdict && enforced_of(r) == *policies,
        Want::Cluster {
            tier,
            name,
            rule,
            action,
        } => {
            let enforced = r["policies"]["enforced_policies"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            r["action"] == *action
                && r["verdict"] == "rule"
                && enforced.len() == 1
                && enforced[0]["kind"] == "ClusterNetworkPolicy"
                && enforced[0]["name"] == name.as_str()
                && enforced[0]["rule_index"].as_i64() == Some(*rule)
                && enforced[0]["action"] == *action
                && enforced[0]["tier"]
                    .as_str()
                    .is_some_and(|t| t.eq_ignore_ascii_case(tier))
        }
    };
    (!ok).then(|| {
        format!(
            "says {} ({}) {}, explain says {}",
            r["action"],
            r["verdict"],
            r["policies"]["enforced_policies"],
            want.describe()
        )
    })
}

/// Differences between a record and what explain says it must hold (empty: it agrees).
fn disagreements(e: &Expected, r: &Value) -> Vec<String> {
    let mut wrong = Vec::new();
    if r["node"] != e.key.node.as_str() {
        wrong.push(format!(
            "node field {} on {}'s server",
            r["node"], e.key.node
        ));
    }
    let (src, dst) = (names(r, "source"), names(r, "dest"));
    if src != e.src || dst != e.dst {
        wrong.push(format!("names {src} -> {dst}"));
    }
    for (field, want) in [
        ("source_labels", &e.src_labels),
        ("dest_labels", &e.dst_labels),
    ] {
        if r[field] != serde_json::json!(want) {
            wrong.push(format!("{field} {} (the pod's: {want:?})", r[field]));
        }
    }
    wrong.extend(verdict_wrong(&e.want, r));
    wrong
}

/// Whether a record ends at or after `since` (the API's `since` is whole seconds: the
/// window's start is held to exactly here). A record without a readable end is kept: it is
/// reported as not matching.
pub(crate) fn ends_in_window(r: &Value, since: SystemTime) -> bool {
    time_of(r, "end_time").is_none_or(|end| end >= since)
}

/// Whether a record saw traffic at or after `since` (`last_active_time`): read besides the
/// window's records, as the only trace of a probe that rode an earlier connection.
pub(crate) fn active_in_window(r: &Value, since: SystemTime) -> bool {
    time_of(r, "last_active_time").is_some_and(|t| t >= since)
}

/// Records to read for a window: those that end in it or saw traffic in it.
pub(crate) fn in_window(r: &Value, since: SystemTime) -> bool {
    ends_in_window(r, since) || active_in_window(r, since)
}

/// A record's time field (`None`: missing or unreadable).
fn time_of(r: &Value, field: &str) -> Option<SystemTime> {
    r[field]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(SystemTime::from)
}

/// What earlier steps of the scenario expected per record key: a record that began before a
/// step's last round and reaches into it may be theirs (see the module doc).
#[derive(Default)]
pub struct Earlier {
    wants: BTreeMap<RecordKey, Vec<Want>>,
}

impl Earlier {
    pub(crate) fn remember(&mut self, expected: &[Expected]) {
        for e in expected {
            let wants = self.wants.entry(e.key.clone()).or_default();
            if !wants.contains(&e.want) {
                wants.push(e.want.clone());
            }
        }
    }

    /// Whether an earlier step expected exactly this record's verdict for its key. Names are
    /// not held against it: a pod of an earlier step may be gone, its address unnamed now.
    fn accepts(&self, key: &RecordKey, r: &Value) -> bool {
        self.wants
            .get(key)
            .is_some_and(|ws| ws.iter().any(|w| verdict_wrong(w, r).is_none()))
    }
}

/// When the step's probe rounds began: `first` before the first, `last` before the last
/// (equal unless the step was retried).
#[derive(Clone, Copy, Debug)]
pub struct Rounds {
    pub first: SystemTime,
    pub last: SystemTime,
}

/// `GET /flows?since=…` from node `i`'s agent, inside that node's namespace.
pub(crate) fn fetch(cluster: &Cluster, i: usize, since: u64) -> anyhow::Result<Vec<Value>> {
    let netns = cluster.node_netns(i);
    in_netns(&netns.handle, || -> anyhow::Result<Vec<Value>> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, FLOWS_PORT));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET /flows?since={since} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)?;
        let text = String::from_utf8_lossy(&reply);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no HTTP header end in {} bytes", reply.len()))?;
        let status = head.split_whitespace().nth(1).unwrap_or("");
        anyhow::ensure!(status == "200", "GET /flows: {status}: {}", body.trim());
        Ok(serde_json::from_str(body)?)
    })?
}

/// Every node's records that end at or after `since`, with the node that served them.
pub(crate) fn records_since(
    cluster: &Cluster,
    since: SystemTime,
) -> anyhow::Result<Vec<(String, Value)>> {
    let secs = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..cluster.node_count() {
        let node = node_name(i);
        for r in fetch(cluster, i, secs).map_err(|e| anyhow::anyhow!("{node}: {e:#}"))? {
            if ends_in_window(&r, since) {
                out.push((node.clone(), r));
            }
        }
    }
    Ok(out)
}

/// What the check found for one step.
pub struct Checked {
    /// Empty: all good.
    pub problems: Vec<String>,
    /// Records required and found (one per probe and deciding direction).
    pub matched: usize,
    /// Of those, directions recorded as denied.
    pub denied: usize,
    /// Of those, directions a ClusterNetworkPolicy decided.
    pub cluster_decided: usize,
    /// Records read in the step's window.
    pub records: usize,
    /// Of those, records that start no connection (conntrack's counts of earlier ones).
    pub count_only: usize,
    /// Of those, records that began before the round and agree with an earlier step (or
    /// the retried step's first round).
    pub carried: usize,
    /// Directions of UDP probes that started no connection but whose key's earlier,
    /// agreeing connection carried packets in the round: the client used a 5-tuple conntrack
    /// still held ([`Ends::client_ports`]). Not in `matched`.
    pub rode: usize,
}

/// The expected records of every probe that left in the step's last round.
fn expectations(
    cluster: &Cluster,
    target: Target,
    step: &Step,
    families: &[IpFamily],
    ports: &SourcePorts,
) -> anyhow::Result<Vec<Expected>> {
    let state = load_state(cluster)?;
    let mut out = Vec::new();
    for &family in families {
        for key in step.expect.keys() {
            let Some(sent) = ports.get(&(family, *key)) else {
                continue;
            };
            for (from, to) in sent.keys() {
                out.extend(expect_probe(
                    cluster, target, &state, family, key, from, to,
                )?);
            }
        }
    }
    Ok(out)
}

pub(crate) fn expect_probe(
    cluster: &Cluster,
    target: Target,
    state: &netpol_agent::verdict::State,
    family: IpFamily,
    pk: &PortKey,
    from: &str,
    to: &str,
) -> anyhow::Result<Vec<Expected>> {
    let (src, dst) = (&cluster.pods[from].pod, &cluster.pods[to].pod);
    let mut flow = probe_flow(cluster, family, from, to, pk)?;
    let mut dst_ip = dst.addr(family);
    let mut dst_name = to.to_string();
    let declared = dst
        .ports
        .iter()
        .any(|p| p.port == pk.port && p.protocol == pk.protocol);
    let mut required = true;
    if target == Target::Service && !declared {
        // kube-proxy DNATs only the ports the Service declares: a probe of another port
        // leaves for the ClusterIP itself, which is no pod (no ingress side, no name). In
        // iptables mode nothing stops it before our chains; nftables mode rejects it in its
        // own filter-forward hook, ahead of them, so no record may exist; IPVS mode delivers
        // it locally (INPUT), where a record is not required but must agree.
        match cluster.service_proxy() {
            ServiceProxy::Iptables => {}
            ServiceProxy::Nftables => return Ok(Vec::new()),
            ServiceProxy::Ipvs => required = false,
        }
        dst_ip = addr_of(dst.cluster_ip, family);
        dst_name = String::new();
        flow.dst = Endpoint::Ip(dst_ip);
    }
    let resolved = state
        .resolve(&flow)
        .map_err(|e| anyhow::anyhow!("explain {from} -> {to} {pk}: {e}"))?;
    let verdict = state.explain(&resolved);
    let labels_of = |pod: &str| -> Vec<String> {
        state
            .pods()
            .iter()
            .find(|p| !pod.is_empty() && p.key.to_string() == pod)
            .map(|p| p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect())
            .unwrap_or_default()
    };
    let (src_labels, dst_labels) = (labels_of(from), labels_of(&dst_name));
    let key = |node: usize, reporter| {
        RecordKey::new(
            &node_name(node),
            reporter,
            pk.protocol.as_str(),
            src.addr(family),
            dst_ip,
            pk.port,
        )
    };
    let ends = Ends {
        what: format!(
            "{from} -> {to} {pk} ({})",
            crate::family::family_name(family)
        ),
        src: from.to_string(),
        dst: dst_name,
        src_labels,
        dst_labels,
        src_key: key(src.node, "Src"),
        dst_key: key(dst.node, "Dst"),
        required,
        // The runner picks every probe's source port.
        client_ports: false,
    };
    Ok(ends.expected(
        want_of(&verdict.egress),
        verdict.egress.action == Action::Allow,
        want_of(&verdict.ingress),
    ))
}

/// The two ends of one probe as its records name them, for [`Ends::expected`].
pub(crate) struct Ends {
    /// `ns/pod -> ns/pod proto/port (family)`, for messages.
    pub(crate) what: String,
    /// `namespace/name` as the records name them (empty: no pod, e.g. a ClusterIP).
    pub(crate) src: String,
    pub(crate) dst: String,
    /// Labels as `key=value`, sorted.
    pub(crate) src_labels: Vec<String>,
    pub(crate) dst_labels: Vec<String>,
    /// The egress record's key (source's node) and the ingress one's (destination's node).
    pub(crate) src_key: RecordKey,
    pub(crate) dst_key: RecordKey,
    pub(crate) required: bool,
    /// The prober's client picked its source port (a real cluster's `agnhost connect`), not
    /// the runner. A UDP client that picks a port it used within `nf_conntrack_udp_timeout`
    /// (random ports from ~28k: it happens about once in a few thousand UDP probes of one
    /// pair) sends on the entry conntrack still holds: no new connection, no logged first
    /// packet, only packets counted on the earlier connection's record. TCP cannot: a SYN on a
    /// closed entry makes conntrack start over.
    pub(crate) client_ports: bool,
}

impl Ends {
    /// The records a probe makes: egress where it is policed, ingress where it is policed
    /// and egress let the packet through.
    pub(crate) fn expected(
        self,
        egress: Option<Want>,
        egress_allowed: bool,
        ingress: Option<Want>,
    ) -> Vec<Expected> {
        let mut out = Vec::new();
        let one = |dir: &str, key: RecordKey, want: Want| Expected {
            what: format!("{} {dir}", self.what),
            may_ride: self.client_ports && key.proto == "udp",
            key,
            src: self.src.clone(),
            dst: self.dst.clone(),
            src_labels: self.src_labels.clone(),
            dst_labels: self.dst_labels.clone(),
            required: self.required,
            want,
        };
        if let Some(want) = egress {
            out.push(one("egress", self.src_key.clone(), want));
        }
        if egress_allowed {
            if let Some(want) = ingress {
                out.push(one("ingress", self.dst_key.clone(), want));
            }
        }
        out
    }
}

/// Checks the records of the step's last probe round (its rounds' starts in `rounds`, its
/// probes' source ports in `ports`) against explain's verdict for every probe, then remembers
/// the step's expectations in `earlier` for the next steps.
pub fn check(
    cluster: &Cluster,
    target: Target,
    step: &Step,
    families: &[IpFamily],
    ports: &SourcePorts,
    rounds: Rounds,
    earlier: &mut Earlier,
) -> Checked {
    let expected = match expectations(cluster, target, step, families, ports) {
        Ok(e) => e,
        Err(e) => {
            let mut checked = judge(&[], &[], rounds, earlier);
            checked
                .problems
                .push(format!("cannot compute explain's verdicts: {e:#}"));
            return checked;
        }
    };
    // Read until the records agree (a record may still miss, or not name an end yet), up to
    // SETTLE; the last reading is the answer.
    let start = Instant::now();
    let checked = loop {
        let checked = match records_since(cluster, rounds.last) {
            Ok(records) => judge(&expected, &records, rounds, earlier),
            Err(e) => {
                let mut checked = judge(&[], &[], rounds, earlier);
                checked
                    .problems
                    .push(format!("cannot read the flow records: {e:#}"));
                checked
            }
        };
        if checked.problems.is_empty() || start.elapsed() > SETTLE {
            break checked;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    earlier.remember(&expected);
    checked
}

/// Judges one reading of the step's window (`records`, with the node that served each)
/// against `expected`. Pure: the unit tests call it.
pub(crate) fn judge(
    expected: &[Expected],
    records: &[(String, Value)],
    rounds: Rounds,
    earlier: &Earlier,
) -> Checked {
    let mut checked = Checked {
        problems: Vec::new(),
        matched: 0,
        denied: 0,
        cluster_decided: 0,
        records: records.len(),
        count_only: 0,
        carried: 0,
        rode: 0,
    };
    let mut by_key: BTreeMap<&RecordKey, Vec<usize>> = BTreeMap::new();
    for (i, e) in expected.iter().enumerate() {
        by_key.entry(&e.key).or_default().push(i);
    }
    let retried = rounds.first < rounds.last;
    let mut agreed = vec![false; expected.len()];
    // Records of traffic alone in the round: what a probe that rode an earlier connection
    // leaves (see `Ends::client_ports`).
    let mut traffic: Vec<(RecordKey, &Value)> = Vec::new();
    for (node, r) in records {
        let Some(key) = record_key(node, r) else {
            checked
                .problems
                .push(format!("{node}: a record without its flow: {r}"));
            continue;
        };
        // Read for its traffic in the window alone: it claims no connection of the window.
        if !ends_in_window(r, rounds.last) {
            traffic.push((key, r));
            continue;
        }
        // A record without the count is held to the strictest reading: it starts some.
        if r["num_connections_started"].as_u64() == Some(0) {
            checked.count_only += 1;
            traffic.push((key, r));
            continue;
        }
        let began = time_of(r, "start_time");
        let before_round = began.is_some_and(|t| t < rounds.last);
        let mut wrong = Vec::new();
        let mut what = None;
        for &i in by_key.get(&key).map(Vec::as_slice).unwrap_or(&[]) {
            let w = disagreements(&expected[i], r);
            if w.is_empty() {
                agreed[i] = true;
                wrong.clear();
                what = None;
                break;
            }
            what.get_or_insert(expected[i].what.as_str());
            wrong.extend(w);
        }
        let probed = by_key.contains_key(&key);
        if probed && wrong.is_empty() {
            continue;
        }
        if before_round
            && (earlier.accepts(&key, r)
                || (retried && probed && began.is_some_and(|t| t >= rounds.first)))
        {
            checked.carried += 1;
            continue;
        }
        checked.problems.push(match what {
            Some(what) => format!("{what}: record at {}: {}: {r}", key.node, wrong.join("; ")),
            None => format!(
                "a record at {} ({}) for a flow no probe of the step sent there: {r}",
                key.node, key.reporter
            ),
        });
    }
    for (e, agreed) in expected.iter().zip(agreed) {
        if !agreed {
            if e.may_ride && rode(e, &traffic, rounds.last, earlier) {
                checked.rode += 1;
                continue;
            }
            if e.required {
                checked.problems.push(format!(
                    "{}: no record at {} ({}) that agrees, explain says {}",
                    e.what,
                    e.key.node,
                    e.key.reporter,
                    e.want.describe()
                ));
            }
            continue;
        }
        checked.matched += 1;
        let action = match &e.want {
            Want::Record { action, .. } => action,
            Want::Cluster { action, .. } => {
                checked.cluster_decided += 1;
                action
            }
        };
        if *action == "Deny" {
            checked.denied += 1;
        }
    }
    checked
}

/// Whether a probe that left no record of its own rode an earlier connection of its key: a
/// record of that key saw packets in the window and carries this step's verdict or an
/// earlier step's (the kernel did not judge the ridden connection again).
fn rode(
    e: &Expected,
    traffic: &[(RecordKey, &Value)],
    since: SystemTime,
    earlier: &Earlier,
) -> bool {
    traffic.iter().any(|(key, r)| {
        *key == e.key
            && active_in_window(r, since)
            && r["packets_in"].as_u64().unwrap_or(0) + r["packets_out"].as_u64().unwrap_or(0) > 0
            && (verdict_wrong(&e.want, r).is_none() || earlier.accepts(key, r))
    })
}

#[cfg(test)]
mod tests;
