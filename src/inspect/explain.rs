//! `netpol-agent explain`: the verdict for one flow from the objects (`verdict::State`), and
//! with `--kernel` the packet followed through the rules and sets a node's kernel holds
//! (`verdict::kernel`), said loudly when the two answers differ. With `--staged` the answer
//! is the one with the staged policies applied; without it, a line says when they would change
//! the answer (`super::staged`).

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{anyhow, bail};
use serde_json::{json, Value};

use super::args::{ExplainArgs, OutputFormat};
use super::{
    family_name, kube_ipvs_mode, load_objects, node_name, read_live, read_saved, resolver, staged,
    KernelText, EXIT_BAD_INPUT, EXIT_KERNEL_DIFFERS,
};
use crate::agent::Calculation;
use crate::calc_graph::GraphConfig;
use crate::config::ConfigError;
use crate::iface_naming::{CriConfig, InterfaceResolver};
use crate::model::IpFamily;
use crate::rules::provenance::Provenance;
use crate::rules::Direction;
use crate::verdict::kernel::{trace_marked, KernelSets, NodeView, Ruleset, Trace};
use crate::verdict::{Action, Endpoint, Flow, State, Verdict};

/// One flow's kernel check on one node.
struct KernelCheck {
    node: String,
    backend: Option<String>,
    family: IpFamily,
    traces: Vec<Trace>,
    /// What the policies say for the directions this node enforces.
    expected: Action,
    /// The directions this node enforces.
    enforces: Vec<(Direction, String)>,
    /// `Some(allowed)`, or `None` when a rule could not be evaluated.
    kernel: Option<bool>,
    provenance: Provenance,
}

impl KernelCheck {
    fn agrees(&self) -> Option<bool> {
        if self.traces.is_empty() {
            return None;
        }
        self.kernel.map(|k| k == (self.expected == Action::Allow))
    }
}

/// Runs `explain`; prints the answer and returns the exit status.
pub fn run(args: &ExplainArgs) -> ExitCode {
    match explain(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netpol-agent explain: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn explain(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let from = Endpoint::parse(&args.from).map_err(|e| anyhow!("--from: {e}"))?;
    let to = Endpoint::parse(&args.to).map_err(|e| anyhow!("--to: {e}"))?;
    let mut cfg = args.rules.rule_config()?;
    let kernel_mode = args.kernel || args.saved.iptables_save.is_some();
    let live = kernel_mode && args.saved.iptables_save.is_none();
    let objects = load_objects(&args.source.source())?;
    let (mut state, errors) = State::from_objects(cfg.clone(), &objects);
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
        bail!("invalid objects:\n  {}", list.join("\n  "));
    }
    let cri = CriConfig::new(args.cri_endpoint.clone());
    let resolver = resolver(&args.rules, live.then_some(&cri))?;

    // The flows: the port asked, or every port the destination pod declares (both ends are
    // checked first, so an unknown pod is named as such).
    let protocol = args.protocol.protocol();
    state.resolve(&Flow {
        src: from.clone(),
        dst: to.clone(),
        protocol,
        port: args.port.unwrap_or(1),
    })?;
    let ports = match args.port {
        Some(p) => vec![p],
        None => {
            let dst = match &to {
                Endpoint::Pod(k) => state.pod(k).map(|p| p.key.clone()),
                Endpoint::Ip(ip) => state.pod_by_ip(ip).map(|p| p.key.clone()),
            };
            let ports = dst
                .as_ref()
                .map(|k| state.declared_ports(k, protocol))
                .unwrap_or_default();
            if ports.is_empty() {
                bail!(
                    "--port is needed: {to} declares no {} container port to explain",
                    protocol.as_str().to_ascii_uppercase()
                );
            }
            ports
        }
    };

    // With --kernel, the node's desired state (for the provenance of the rules met) comes
    // from the same calculation the agent runs, with the same resolver.
    let mut calc = None;
    let mut node = None;
    if kernel_mode {
        let Some(resolver) = resolver else {
            return Err(ConfigError(
                "--kernel with saved dumps needs the pods' interface names offline, and this \
                 interface-naming scheme learns them on the node; use --interface-name-scheme \
                 static with FELIX_INTERFACEMAPFILE (--interface-map-file), or run on the node"
                    .into(),
            )
            .into());
        };
        let n = match (&args.node, live) {
            (Some(n), _) => n.clone(),
            (None, true) => node_name(None)?,
            (None, false) => bail!(
                "--node is needed with --iptables-save/--ipset-save: the node the dumps come from"
            ),
        };
        // The kernel is read with the agent's view of IPVS mode (its chains and this-host
        // set are then ours, and a Service flow's passes differ); the verdicts do not depend
        // on it: a Service connection is judged as the one to the backend.
        let saved = match (&args.saved.iptables_save, &args.saved.ipset_save) {
            (Some(i), Some(s)) => {
                let read = |p: &std::path::PathBuf| {
                    std::fs::read_to_string(p)
                        .map_err(|e| anyhow!("cannot read {}: {e}", p.display()))
                };
                Some((read(i)?, read(s)?))
            }
            _ => None,
        };
        let host_addrs = kube_ipvs_mode(
            &args.rules,
            &mut cfg,
            saved.as_ref().map(|(i, s)| (i.as_str(), s.as_str())),
        )?;
        let c = Calculation::of_objects_on_host(
            GraphConfig {
                node_name: n.clone(),
                families: vec![IpFamily::V4, IpFamily::V6],
                rules: cfg.clone(),
            },
            resolver,
            &objects,
            host_addrs,
        );
        name_pods(&mut state, c.resolver());
        calc = Some(c);
        node = Some(n);
    } else if let Some(r) = &resolver {
        name_pods(&mut state, r.as_ref());
    }

    // Staged objects (issue 23): with --staged the answer is the staged state's; without,
    // a note says when they would change it.
    let staged_list = state.staged().to_vec();
    let staging = (!args.staged && !staged_list.is_empty()).then(|| state.staging());
    if args.staged {
        state = state.with_staged(|_| true);
    }
    let mut verdicts = Vec::new();
    let mut notes = Vec::new();
    for port in ports {
        let flow = Flow {
            src: from.clone(),
            dst: to.clone(),
            protocol,
            port,
        };
        let resolved = state.resolve(&flow)?;
        let verdict = state.explain(&resolved);
        notes.push(
            staging
                .as_ref()
                .and_then(|s| staged::note(&state, s, &resolved, verdict.action)),
        );
        verdicts.push(verdict);
    }

    let mut checks: Vec<Option<KernelCheck>> = Vec::new();
    if let (Some(calc), Some(node)) = (&calc, &node) {
        let family = verdicts[0].flow.family;
        let text = match (&args.saved.iptables_save, &args.saved.ipset_save) {
            (Some(i), Some(s)) => read_saved(i, s, family)?,
            _ => read_live(args.dataplane.backend_mode(), &[family])?,
        };
        let provenance = calc.provenance(family);
        for v in &verdicts {
            checks.push(Some(kernel_check(
                &state,
                v,
                node,
                &text,
                family,
                provenance.clone(),
                args.service_ip.filter(|_| cfg.kube_ipvs.is_some()),
            )?));
        }
    }
    while checks.len() < verdicts.len() {
        checks.push(None);
    }

    let disagree = checks.iter().flatten().any(|c| c.agrees() == Some(false));
    let all_allowed = verdicts.iter().all(|v| v.action == Action::Allow);
    match args.output {
        OutputFormat::Text => {
            let mut out = String::new();
            if args.staged {
                out.push_str(&staged::applied_text(&staged_list));
            }
            for ((v, c), note) in verdicts.iter().zip(&checks).zip(&notes) {
                if !out.is_empty() {
                    out.push_str("\n----\n\n");
                }
                out.push_str(&v.to_text());
                if let Some(n) = note {
                    out.push_str(&n.to_text());
                }
                if let Some(c) = c {
                    out.push('\n');
                    out.push_str(&kernel_text(c, v));
                }
            }
            print!("{out}");
        }
        OutputFormat::Json => {
            let mut docs: Vec<Value> = verdicts
                .iter()
                .zip(&checks)
                .zip(&notes)
                .map(|((v, c), note)| {
                    let mut doc = v.to_json();
                    if let Some(c) = c {
                        doc["kernel"] = kernel_json(c);
                    }
                    if let Some(n) = note {
                        doc["staged"] = n.to_json();
                    }
                    if args.staged {
                        doc["staged_applied"] = staged_list
                            .iter()
                            .map(|s| json!({"kind": s.kind, "name": s.name(), "action": s.action().as_str()}))
                            .collect();
                    }
                    doc
                })
                .collect();
            let doc = if docs.len() == 1 {
                docs.remove(0)
            } else {
                json!({
                    "verdict": if all_allowed { "allow" } else { "deny" },
                    "results": docs,
                })
            };
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    Ok(if disagree {
        ExitCode::from(EXIT_KERNEL_DIFFERS)
    } else if all_allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn name_pods(state: &mut State, resolver: &dyn InterfaceResolver) {
    let pods = state.pods().to_vec();
    for p in pods {
        // A pod that cannot be named keeps its workload chains unnamed in the report.
        if let Ok(iface) = resolver.resolve(&p) {
            state.set_interface(&p.key, iface);
        }
    }
}

fn kernel_check(
    state: &State,
    v: &Verdict,
    node: &str,
    text: &KernelText,
    family: IpFamily,
    provenance: Provenance,
    // The ClusterIP of a Service flow under IPVS mode (`None`: the direct flow's passes).
    service_ip: Option<std::net::IpAddr>,
) -> anyhow::Result<KernelCheck> {
    let rules = Ruleset::parse(text.iptables.get(&family).map_or("", String::as_str));
    let sets = KernelSets::parse(&text.ipsets);
    let view = NodeView {
        pod_prefixes: state.config().interface_prefixes.clone(),
        bridge: state.config().bridge.clone(),
    };
    let passes = match service_ip {
        Some(ip) => state.node_passes_via_service(&v.flow, node, ip)?,
        None => state.node_passes(&v.flow, node)?,
    };
    let mut mark = 0;
    let mut enforces = Vec::new();
    let mut expected = Action::Allow;
    let mut traces = Vec::new();
    let mut kernel = Some(true);
    for pass in &passes {
        for d in &pass.enforces {
            let (dv, side) = match d {
                Direction::Egress => (&v.egress, &v.src_name),
                Direction::Ingress => (&v.ingress, &v.dst_name),
            };
            enforces.push((*d, side.clone()));
            if dv.action == Action::Deny {
                expected = Action::Deny;
            }
        }
        let start = if pass.carries_mark { mark } else { 0 };
        let t = trace_marked(&rules, &sets, &view, pass.hook, &pass.packet, start);
        mark = t.end_mark;
        kernel = match (kernel, t.verdict.allowed()) {
            (Some(a), Some(b)) => Some(a && b),
            _ => None,
        };
        traces.push(t);
    }
    Ok(KernelCheck {
        node: node.to_string(),
        backend: text.backend.map(|b| b.as_str().to_string()),
        family,
        traces,
        expected,
        enforces,
        kernel,
        provenance,
    })
}

fn sides(c: &KernelCheck) -> String {
    c.enforces
        .iter()
        .map(|(d, s)| format!("{} of {s}", d.as_str()))
        .collect::<Vec<_>>()
        .join(" and ")
}

fn kernel_text(c: &KernelCheck, v: &Verdict) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kernel of node {} ({}, {}):",
        c.node,
        c.backend
            .as_deref()
            .map_or_else(|| "saved dumps".to_string(), |b| format!("{b} backend")),
        family_name(c.family)
    );
    if c.traces.is_empty() {
        let _ = writeln!(
            out,
            "  nothing of this flow meets node {}'s pod rules (neither side is a pod there)",
            c.node
        );
        return out;
    }
    let describe = |chain: &str, hash: &str| c.provenance.describe(chain, hash);
    for t in &c.traces {
        out.push_str(&t.to_text(&describe));
    }
    let expected = c.expected.as_str();
    let enforced = if c.enforces.is_empty() {
        "nothing (not policed here)".to_string()
    } else {
        sides(c)
    };
    match (c.kernel, c.agrees()) {
        (None, _) => {
            let why = c
                .traces
                .iter()
                .find_map(|t| match &t.verdict {
                    crate::verdict::kernel::KernelVerdict::CannotEvaluate(w) => Some(w.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "kernel: CANNOT EVALUATE ({why}); the policies say {expected} for {enforced}"
            );
        }
        (Some(k), Some(true)) => {
            let _ = writeln!(
                out,
                "kernel: {}, as the policies say for {enforced}: they agree",
                if k { "ALLOW" } else { "DENY" }
            );
        }
        (Some(k), _) => {
            let _ = writeln!(out, "!!! THE KERNEL DISAGREES WITH THE POLICIES !!!");
            let _ = writeln!(
                out,
                "!!! node {}'s kernel {} this flow, but the policies say {expected} for {enforced}",
                c.node,
                if k { "ACCEPTS" } else { "DROPS" }
            );
            let _ = writeln!(
                out,
                "!!! find what differs: netpol-agent audit --node {} (same objects){}",
                c.node,
                if v.flow.family == IpFamily::V6 {
                    " --ipv6"
                } else {
                    ""
                }
            );
        }
    }
    out
}

fn kernel_json(c: &KernelCheck) -> Value {
    let describe = |chain: &str, hash: &str| c.provenance.describe(chain, hash);
    json!({
        "node": c.node,
        "backend": c.backend,
        "family": match c.family { IpFamily::V4 => "ipv4", IpFamily::V6 => "ipv6" },
        "traces": c.traces.iter().map(|t| t.to_json(&describe)).collect::<Vec<_>>(),
        "enforces": c.enforces.iter().map(|(d, s)| format!("{} of {s}", d.as_str())).collect::<Vec<_>>(),
        "policies_verdict": c.expected.as_str(),
        "verdict": match (c.traces.is_empty(), c.kernel) {
            (true, _) => "not on this node",
            (_, Some(true)) => "allow",
            (_, Some(false)) => "deny",
            (_, None) => "cannot evaluate",
        },
        "agrees": c.agrees(),
    })
}
