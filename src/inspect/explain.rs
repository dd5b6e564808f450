//! `netpol-agent explain`: the verdict for one flow from the objects (`verdict::State`), and
//! with `--kernel` the packet followed through the rules and sets a node's kernel holds
//! (`verdict::kernel`), said loudly when the two answers differ. With `--staged` the answer
//! is the one with the staged policies applied; without it, a line says when they would change
//! the answer (`super::staged`). `--flows` asks about many flows at once: the objects, the
//! resolver and the kernel are read once, and each flow is answered as it would be alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::args::{ExplainArgs, OutputFormat};
use super::{
    family_name, kube_ipvs_mode, live_rules, load_objects, node_name, read_live, read_saved,
    resolver, staged, KernelText, EXIT_BAD_INPUT, EXIT_KERNEL_DIFFERS,
};
use crate::agent::Calculation;
use crate::calc_graph::GraphConfig;
use crate::config::ConfigError;
use crate::iface_naming::{CriConfig, InterfaceResolver};
use crate::model::{IpFamily, Protocol};
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

/// One flow asked about: `--from`/`--to`/`--port`, or one line of `--flows`.
#[derive(Clone, Debug, PartialEq)]
struct Request {
    from: Endpoint,
    to: Endpoint,
    protocol: Protocol,
    /// `None`: every port the destination declares for the protocol.
    port: Option<u16>,
    /// The line of `--flows` (0: the command line), for messages.
    line: usize,
}

/// Parses `--flows` text: `FROM TO [PORT[/PROTOCOL]]` a line, `#` comments, blank lines
/// skipped. The protocol is `TCP`, `UDP` or `SCTP` (any case), else `default`.
fn parse_flows(text: &str, default: Protocol) -> Result<Vec<Request>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e} (in {line:?})", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        let (from, to, port) = match words.as_slice() {
            [from, to] => (*from, *to, None),
            [from, to, port] => (*from, *to, Some(*port)),
            _ => return Err(at("want FROM TO [PORT[/PROTOCOL]]".into())),
        };
        let (port, protocol) = match port.map(|p| p.split_once('/').unwrap_or((p, ""))) {
            None => (None, default),
            Some((port, proto)) => {
                let protocol = if proto.is_empty() {
                    default
                } else {
                    Protocol::parse(&proto.to_ascii_uppercase()).ok_or_else(|| {
                        at(format!("unknown protocol {proto:?}: TCP, UDP or SCTP"))
                    })?
                };
                let port = match port.parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => return Err(at(format!("the port {port:?} is not 1-65535"))),
                };
                (Some(port), protocol)
            }
        };
        out.push(Request {
            from: Endpoint::parse(from).map_err(|e| at(format!("FROM: {e}")))?,
            to: Endpoint::parse(to).map_err(|e| at(format!("TO: {e}")))?,
            protocol,
            port,
            line: i + 1,
        });
    }
    Ok(out)
}

/// The flows asked about, from the command line or `--flows`.
fn requests(args: &ExplainArgs) -> anyhow::Result<Vec<Request>> {
    let protocol = args.protocol.protocol();
    let Some(path) = &args.flows else {
        let from = args.from.as_deref().unwrap_or_default();
        let to = args.to.as_deref().unwrap_or_default();
        return Ok(vec![Request {
            from: Endpoint::parse(from).map_err(|e| anyhow!("--from: {e}"))?,
            to: Endpoint::parse(to).map_err(|e| anyhow!("--to: {e}"))?,
            protocol,
            port: args.port,
            line: 0,
        }]);
    };
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading --flows from standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    let flows =
        parse_flows(&text, protocol).map_err(|e| anyhow!("--flows {}: {e}", path.display()))?;
    if flows.is_empty() {
        bail!("--flows {}: no flow in it", path.display());
    }
    Ok(flows)
}

fn explain(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let requests = requests(args)?;
    let batch = args.flows.is_some();
    let kernel_mode = args.kernel || args.saved.iptables_save.is_some();
    let live = kernel_mode && args.saved.iptables_save.is_none();
    // On the node, `auto` means what the agent there resolved it to.
    let rules = if live {
        live_rules(&args.rules)?
    } else {
        args.rules.clone()
    };
    let mut cfg = rules.rule_config()?;
    let objects = load_objects(&args.source.source())?;
    let (mut state, errors) = State::from_objects(cfg.clone(), &objects);
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
        bail!("invalid objects:\n  {}", list.join("\n  "));
    }
    let cri = CriConfig::new(args.cri_endpoint.clone());
    let resolver = resolver(&rules, live.then_some(&cri))?;

    // The flows: per request the port asked, or every port the destination pod declares
    // (both ends are checked first, so an unknown pod is named as such).
    let mut flows = Vec::new();
    for r in &requests {
        let at = |e: anyhow::Error| {
            if r.line > 0 {
                e.context(format!("--flows line {}", r.line))
            } else {
                e
            }
        };
        state
            .resolve(&Flow {
                src: r.from.clone(),
                dst: r.to.clone(),
                protocol: r.protocol,
                port: r.port.unwrap_or(1),
            })
            .map_err(|e| at(e.into()))?;
        let ports = match r.port {
            Some(p) => vec![p],
            None => {
                let dst = match &r.to {
                    Endpoint::Pod(k) => state.pod(k).map(|p| p.key.clone()),
                    Endpoint::Ip(ip) => state.pod_by_ip(ip).map(|p| p.key.clone()),
                };
                let ports = dst
                    .as_ref()
                    .map(|k| state.declared_ports(k, r.protocol))
                    .unwrap_or_default();
                if ports.is_empty() {
                    return Err(at(anyhow!(
                        "{} is needed: {} declares no {} container port to explain",
                        if r.line > 0 { "a port" } else { "--port" },
                        r.to,
                        r.protocol.as_str().to_ascii_uppercase()
                    )));
                }
                ports
            }
        };
        flows.extend(ports.into_iter().map(|port| Flow {
            src: r.from.clone(),
            dst: r.to.clone(),
            protocol: r.protocol,
            port,
        }));
    }

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
            &rules,
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
    for flow in flows {
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
        let families: BTreeSet<IpFamily> = verdicts.iter().map(|v| v.flow.family).collect();
        let families: Vec<IpFamily> = families.into_iter().collect();
        let text = match (&args.saved.iptables_save, &args.saved.ipset_save) {
            (Some(i), Some(s)) => match families.as_slice() {
                [family] => read_saved(i, s, *family)?,
                _ => bail!(
                    "--iptables-save holds one family's rules, and the flows asked about are of \
                     both: ask about the IPv4 and the IPv6 flows apart"
                ),
            },
            _ => read_live(args.dataplane.backend_mode(), &families)?,
        };
        let provenance: BTreeMap<IpFamily, Provenance> =
            families.iter().map(|&f| (f, calc.provenance(f))).collect();
        for v in &verdicts {
            let family = v.flow.family;
            checks.push(Some(kernel_check(
                &state,
                v,
                node,
                &text,
                family,
                provenance[&family].clone(),
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
            let doc = if docs.len() == 1 && !batch {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjectKey;

    #[test]
    fn flow_lines_take_ports_protocols_comments_and_defaults() {
        let text = "# header\n\nshop/web shop/db 5432\n10.0.0.1 shop/db 53/udp  # dns\nshop/web 2001:db8::5 8080/SCTP\nshop/a shop/b\n";
        let got = parse_flows(text, Protocol::Udp).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].from, Endpoint::Pod(ObjectKey::new("shop", "web")));
        assert_eq!(
            (got[0].port, got[0].protocol, got[0].line),
            (Some(5432), Protocol::Udp, 3)
        );
        assert_eq!(got[1].from, Endpoint::Ip("10.0.0.1".parse().unwrap()));
        assert_eq!((got[1].port, got[1].protocol), (Some(53), Protocol::Udp));
        assert_eq!(got[2].to, Endpoint::Ip("2001:db8::5".parse().unwrap()));
        assert_eq!((got[2].port, got[2].protocol), (Some(8080), Protocol::Sctp));
        assert_eq!(
            (got[3].port, got[3].protocol, got[3].line),
            (None, Protocol::Udp, 6)
        );
    }

    #[test]
    fn bad_flow_lines_are_named() {
        for (text, want) in [
            ("a/b\n", "line 1: want FROM TO"),
            ("a/b c/d 80 extra\n", "line 1: want FROM TO"),
            ("a/b c/d 0\n", "line 1: the port \"0\" is not 1-65535"),
            ("a/b c/d 70000/TCP\n", "is not 1-65535"),
            ("\na/b c/d 80/icmp\n", "line 2: unknown protocol \"icmp\""),
        ] {
            let err = parse_flows(text, Protocol::Tcp).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
