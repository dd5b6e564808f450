//! `netpol-agent staged impact` and `staged promote` (issue 23), and what `explain` says about
//! staged objects. Offline: the objects are read once (manifests, a directory or the API),
//! the staged ones applied with the evaluator's `State::staging` (the one evaluator, never a
//! copy), and nothing touches the kernel.
//!
//! - `impact` reads flow records (the JSON array `GET /flows` serves, from a saved file or an
//!   agent's URL) and lists the flows whose verdict the staged objects would change, grouped
//!   by the staged object that changes it alone (or "together" when only their combination
//!   does). A record's verdict is the reporter's direction (egress at the source's node,
//!   ingress at the destination's), compared between today's objects and the staged ones, so
//!   that records read long after the traffic are judged by today's policies on both sides.
//!   Exit status: 0 no flow would change, 1 some would, 2 bad input.
//! - `promote` prints the enforced objects the staged ones would become (YAML), and the
//!   deletions as a list of comments with the command to run.
//!
//! Staged policies at each layer: the objects in `model::staged`, validated in
//! `model::validate::staged`, applied only in the evaluator's what-if state in
//! `verdict::staged`, the pending verdicts of flow records in `traffic::staged`, the `staged`
//! commands in `inspect::staged`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::net::IpAddr;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use super::args::{OutputFormat, SourceOptions};
use super::{load_objects, EXIT_BAD_INPUT};
use crate::config::RuleOptions;
use crate::model::validate::{self, ValidationError};
use crate::model::{
    ClusterNetworkPolicy, K8sObject, ObjectKey, Protocol, StagedAction, StagedInfo,
};
use crate::rules::Direction;
use crate::verdict::{Action, Endpoint, Flow, ResolvedFlow, Staging, State};

/// Flow records read at most (a saved file or an agent's answer).
const MAX_FLOWS_BYTES: u64 = 256 << 20;

#[derive(Args, Clone, Debug)]
pub struct StagedArgs {
    #[command(subcommand)]
    pub command: StagedCommand,
}

#[derive(Subcommand, Clone, Debug)]
pub enum StagedCommand {
    /// The observed flows whose verdict the staged objects would change, grouped by staged
    /// object (exit 0: none would change, 1: some would, 2: bad input).
    Impact(Box<ImpactArgs>),
    /// The enforced objects the staged ones would become (YAML), and the deletions.
    Promote(PromoteArgs),
}

#[derive(Args, Clone, Debug)]
pub struct ImpactArgs {
    #[command(flatten)]
    pub source: SourceOptions,
    /// Flow records as `GET /flows` serves them: a saved JSON file, `-` for standard input,
    /// or an agent's URL (`http://HOST:PORT[/flows][?filters]`, e.g. through kubectl
    /// port-forward).
    #[arg(long)]
    pub flows: String,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value = "text")]
    pub output: OutputFormat,
    #[command(flatten)]
    pub rules: RuleOptions,
}

#[derive(Args, Clone, Debug)]
pub struct PromoteArgs {
    #[command(flatten)]
    pub source: SourceOptions,
}

/// Runs `staged impact` or `staged promote`; prints the answer and returns the exit status.
pub fn run(args: &StagedArgs) -> ExitCode {
    let result = match &args.command {
        StagedCommand::Impact(a) => impact(a),
        StagedCommand::Promote(a) => promote(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netpol-agent staged: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn invalid(errors: &[ValidationError]) -> anyhow::Error {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    anyhow!("invalid objects:\n  {}", list.join("\n  "))
}

// ---------------------------------------------------------------- explain's part

/// What `explain` says about staged objects for one flow: the verdict with all of them
/// applied, when it differs from the enforced one, and which of them change it alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedNote {
    pub pending: Action,
    pub changed_by: Vec<String>,
}

/// `None` when there are no staged objects or they leave this flow's verdict alone.
pub fn note(
    state: &State,
    staging: &Staging,
    flow: &ResolvedFlow,
    enforced: Action,
) -> Option<StagedNote> {
    let pending = staging.all.decision(flow, None);
    if pending == enforced {
        return None;
    }
    let changed_by = state
        .staged()
        .iter()
        .zip(&staging.each)
        .filter(|(_, s)| s.decision(flow, None) != enforced)
        .map(|(info, _)| info.to_string())
        .collect();
    Some(StagedNote {
        pending,
        changed_by,
    })
}

impl StagedNote {
    pub fn to_text(&self) -> String {
        let by = if self.changed_by.is_empty() {
            "the staged objects together".to_string()
        } else {
            self.changed_by.join(", ")
        };
        format!(
            "staged: with the staged objects applied this flow would be {} (changed by {by}); see explain --staged\n",
            self.pending.as_str().to_ascii_uppercase()
        )
    }

    pub fn to_json(&self) -> Value {
        json!({"verdict": self.pending.as_str(), "changed_by": self.changed_by})
    }
}

/// The staged objects `explain --staged` applied, for its report.
pub fn applied_text(staged: &[StagedInfo]) -> String {
    if staged.is_empty() {
        return "staged: no staged objects; the answer is the enforced one\n".into();
    }
    let list: Vec<String> = staged
        .iter()
        .map(|s| format!("{s} ({})", s.action().as_str()))
        .collect();
    format!("staged objects applied: {}\n", list.join(", "))
}

// ---------------------------------------------------------------- impact

/// One flow record as read.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    src: IpAddr,
    dst: IpAddr,
    protocol: Protocol,
    port: u16,
    reporter: Option<Direction>,
    connections: u64,
    node: String,
}

/// Reads the records; the ones that cannot be judged (another protocol, no port, a field
/// missing) are counted by reason.
fn records(doc: &Value) -> anyhow::Result<(Vec<Record>, BTreeMap<String, u64>)> {
    let items = match doc {
        Value::Array(a) => a,
        // A streamed or wrapped answer: `{"flows": [...]}`.
        Value::Object(o) => match o.get("flows").or_else(|| o.get("records")) {
            Some(Value::Array(a)) => a,
            _ => bail!("the flow records are neither a JSON array nor an object with \"flows\""),
        },
        _ => bail!("the flow records are not a JSON array"),
    };
    let mut out = Vec::new();
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    for item in items {
        let ip = |k: &str| {
            item.get(k)
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<IpAddr>().ok())
        };
        let (Some(src), Some(dst)) = (ip("source_ip"), ip("dest_ip")) else {
            *skipped.entry("no source_ip/dest_ip".into()).or_default() += 1;
            continue;
        };
        let proto = item.get("proto").and_then(Value::as_str).unwrap_or("");
        let Some(protocol) = Protocol::parse(&proto.to_ascii_uppercase()) else {
            *skipped
                .entry(format!(
                    "protocol {proto:?} (policies name TCP, UDP and SCTP ports)"
                ))
                .or_default() += 1;
            continue;
        };
        let Some(port) = item
            .get("dest_port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
        else {
            *skipped.entry("no dest_port".into()).or_default() += 1;
            continue;
        };
        let reporter = match item.get("reporter").and_then(Value::as_str) {
            Some("Src") => Some(Direction::Egress),
            Some("Dst") => Some(Direction::Ingress),
            _ => None,
        };
        out.push(Record {
            src,
            dst,
            protocol,
            port,
            reporter,
            connections: item
                .get("num_connections_started")
                .and_then(Value::as_u64)
                .unwrap_or(1),
            node: item
                .get("node")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        });
    }
    Ok((out, skipped))
}

/// The records: a file, `-`, or an agent's `http://` URL (read with `flows`' client).
fn read_flows(from: &str) -> anyhow::Result<Value> {
    if from.starts_with("http://") || from.starts_with("https://") {
        // `http://host:port[/flows][?filters]`: the agent's base URL and the query.
        let (base, query) = from.split_once('?').unwrap_or((from, ""));
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/flows").unwrap_or(base);
        let records = super::flows::fetch(base, query).map_err(|e| anyhow!("--flows: {e}"))?;
        return Ok(Value::Array(records));
    }
    let mut text = String::new();
    if from == "-" {
        std::io::stdin()
            .take(MAX_FLOWS_BYTES)
            .read_to_string(&mut text)
            .context("reading flow records from standard input")?;
    } else {
        let file = std::fs::File::open(from).with_context(|| format!("--flows {from}"))?;
        file.take(MAX_FLOWS_BYTES)
            .read_to_string(&mut text)
            .with_context(|| format!("--flows {from}: reading"))?;
    }
    serde_json::from_str(&text).with_context(|| format!("--flows {from}: not JSON"))
}

/// A flow whose verdict would change.
#[derive(Clone, Debug)]
struct Changed {
    record: usize,
    from: String,
    to: String,
    enforced: Action,
    pending: Action,
}

impl Changed {
    fn to_json(&self, r: &Record) -> Value {
        json!({
            "from": self.from,
            "to": self.to,
            "source_ip": r.src.to_string(),
            "dest_ip": r.dst.to_string(),
            "proto": r.protocol.as_str(),
            "dest_port": r.port,
            "reporter": match r.reporter { Some(Direction::Egress) => "Src", Some(Direction::Ingress) => "Dst", None => "" },
            "node": r.node,
            "num_connections_started": r.connections,
            "verdict": self.enforced.as_str(),
            "pending_verdict": self.pending.as_str(),
        })
    }
}

fn impact(args: &ImpactArgs) -> anyhow::Result<ExitCode> {
    let cfg = args.rules.rule_config()?;
    let objects = load_objects(&args.source.source())?;
    let (state, errors) = State::from_objects(cfg, &objects);
    if !errors.is_empty() {
        return Err(invalid(&errors));
    }
    let doc = read_flows(&args.flows)?;
    let (records, mut skipped) = records(&doc)?;
    let staging = state.staging();

    // Per staged object (index), or together (None): the changed flows.
    let mut groups: BTreeMap<Option<usize>, Vec<Changed>> = BTreeMap::new();
    let mut changed_total = 0usize;
    for (n, r) in records.iter().enumerate() {
        let flow = Flow {
            src: Endpoint::Ip(r.src),
            dst: Endpoint::Ip(r.dst),
            protocol: r.protocol,
            port: r.port,
        };
        let resolved = match state.resolve(&flow) {
            Ok(f) => f,
            Err(e) => {
                *skipped.entry(format!("not resolvable ({e})")).or_default() += 1;
                continue;
            }
        };
        let enforced = state.decision(&resolved, r.reporter);
        let pending = staging.all.decision(&resolved, r.reporter);
        if pending == enforced {
            continue;
        }
        changed_total += 1;
        let verdict = state.explain(&resolved);
        let changed = Changed {
            record: n,
            from: verdict.src_name,
            to: verdict.dst_name,
            enforced,
            pending,
        };
        let mut alone = false;
        for (i, s) in staging.each.iter().enumerate() {
            if s.decision(&resolved, r.reporter) != enforced {
                groups.entry(Some(i)).or_default().push(changed.clone());
                alone = true;
            }
        }
        if !alone {
            groups.entry(None).or_default().push(changed);
        }
    }

    let name = |g: &Option<usize>| match g {
        Some(i) => {
            let s = &state.staged()[*i];
            format!("{s} ({})", s.action().as_str())
        }
        None => "the staged objects together (no one of them alone)".to_string(),
    };
    let count = |v: &[Changed], a: Action| v.iter().filter(|c| c.pending == a).count();
    match args.output {
        OutputFormat::Text => {
            let mut out = String::new();
            if state.staged().is_empty() {
                out.push_str("no staged objects in these objects: nothing would change\n");
            } else {
                let _ = writeln!(out, "{}", applied_text(state.staged()).trim_end());
            }
            let _ = writeln!(
                out,
                "flow records: {} read, {} would change verdict",
                records.len() + skipped.values().sum::<u64>() as usize,
                changed_total
            );
            for (why, n) in &skipped {
                let _ = writeln!(out, "  {n} not evaluated: {why}");
            }
            for (g, flows) in &groups {
                let _ = writeln!(
                    out,
                    "\n{}: {} newly denied, {} newly allowed",
                    name(g),
                    count(flows, Action::Deny),
                    count(flows, Action::Allow)
                );
                for c in flows {
                    let r = &records[c.record];
                    let _ = writeln!(
                        out,
                        "  {} -> {}  {} -> {}  {} {}{}  ({} connection{}{})",
                        c.enforced.as_str().to_ascii_uppercase(),
                        c.pending.as_str().to_ascii_uppercase(),
                        c.from,
                        c.to,
                        r.protocol.as_str().to_ascii_uppercase(),
                        r.port,
                        match r.reporter {
                            Some(d) => format!(
                                ", {} of {}",
                                d.as_str(),
                                if d == Direction::Egress {
                                    &c.from
                                } else {
                                    &c.to
                                }
                            ),
                            None => String::new(),
                        },
                        r.connections,
                        if r.connections == 1 { "" } else { "s" },
                        if r.node.is_empty() {
                            String::new()
                        } else {
                            format!(", node {}", r.node)
                        },
                    );
                }
            }
            print!("{out}");
        }
        OutputFormat::Json => {
            let doc = json!({
                "staged": state.staged().iter().map(|s| json!({
                    "kind": s.kind, "name": s.name(), "action": s.action().as_str(),
                })).collect::<Vec<_>>(),
                "records": records.len() as u64 + skipped.values().sum::<u64>(),
                "changed": changed_total,
                "not_evaluated": skipped,
                "groups": groups.iter().map(|(g, flows)| json!({
                    "staged": match g {
                        Some(i) => json!({"kind": state.staged()[*i].kind, "name": state.staged()[*i].name()}),
                        None => json!("together"),
                    },
                    "newly_denied": count(flows, Action::Deny),
                    "newly_allowed": count(flows, Action::Allow),
                    "flows": flows.iter().map(|c| c.to_json(&records[c.record])).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    Ok(if changed_total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

// ---------------------------------------------------------------- promote

/// The metadata an enforced object keeps: name, namespace, labels and annotations (never the
/// staged object's uid, resourceVersion or kubectl's last-applied copy).
fn promoted_meta(meta: &ObjectMeta) -> ObjectMeta {
    let mut annotations = meta.annotations.clone();
    if let Some(a) = annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations: annotations.filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    }
}

/// The YAML documents and deletion comments `promote` prints for `objects`.
pub fn promotion(objects: &[K8sObject]) -> anyhow::Result<String> {
    let mut errors = Vec::new();
    let mut docs: BTreeMap<(&'static str, String), String> = BTreeMap::new();
    let mut deletions: BTreeMap<(&'static str, String), String> = BTreeMap::new();
    let enforced_np: Vec<ObjectKey> = objects
        .iter()
        .filter_map(|o| match o {
            K8sObject::NetworkPolicy(np) => Some(validate::namespaced_key(&np.metadata)),
            _ => None,
        })
        .collect();
    let enforced_cnp: Vec<String> = objects
        .iter()
        .filter_map(|o| match o {
            K8sObject::ClusterNetworkPolicy(c) => c.metadata.name.clone(),
            _ => None,
        })
        .collect();
    for o in objects {
        let (info, yaml) = match o {
            K8sObject::StagedNetworkPolicy(s) => match validate::staged_network_policy(s) {
                Ok(info) => {
                    let np = NetworkPolicy {
                        metadata: promoted_meta(&s.metadata),
                        spec: s.spec.as_ref().map(|spec| spec.policy.clone()),
                    };
                    (info, serde_yaml_ng::to_string(&np)?)
                }
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            },
            K8sObject::StagedClusterNetworkPolicy(s) => {
                match validate::staged_cluster_network_policy(s) {
                    Ok(info) => {
                        let c = ClusterNetworkPolicy {
                            metadata: promoted_meta(&s.metadata),
                            spec: s.spec.as_ref().map(|spec| spec.policy.clone()),
                        };
                        (info, serde_yaml_ng::to_string(&c)?)
                    }
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                }
            }
            _ => continue,
        };
        let partner = info.partner();
        match info.action() {
            StagedAction::Set => {
                deletions.remove(&partner);
                docs.insert(partner, format!("# from {info}\n{yaml}"));
            }
            StagedAction::Delete => {
                docs.remove(&partner);
                let exists = match &info.target {
                    crate::model::StagedTarget::NetworkPolicy { key, .. } => {
                        enforced_np.contains(key)
                    }
                    crate::model::StagedTarget::ClusterNetworkPolicy { name, .. } => {
                        enforced_cnp.contains(name)
                    }
                };
                let command = match &info.target {
                    crate::model::StagedTarget::NetworkPolicy { key, .. } => format!(
                        "kubectl -n {} delete networkpolicy {}",
                        key.namespace, key.name
                    ),
                    crate::model::StagedTarget::ClusterNetworkPolicy { name, .. } => {
                        format!("kubectl delete clusternetworkpolicy {name}")
                    }
                };
                deletions.insert(
                    partner,
                    format!(
                        "# delete {} {} (from {info}){}: {command}\n",
                        info.enforced_kind(),
                        info.name(),
                        if exists {
                            ""
                        } else {
                            "; not among these objects"
                        }
                    ),
                );
            }
        }
    }
    if !errors.is_empty() {
        return Err(invalid(&errors));
    }
    let mut out = String::new();
    if docs.is_empty() && deletions.is_empty() {
        out.push_str("# no staged objects: nothing to promote\n");
    }
    for d in deletions.values() {
        out.push_str(d);
    }
    for (n, d) in docs.values().enumerate() {
        if n > 0 || !deletions.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(d);
    }
    Ok(out)
}

fn promote(args: &PromoteArgs) -> anyhow::Result<ExitCode> {
    let objects = load_objects(&args.source.source())?;
    print!("{}", promotion(&objects)?);
    Ok(ExitCode::SUCCESS)
}
