//! `netpol-agent audit`: what a node's kernel holds of ours against what it should hold
//! (rendered by `agent::Calculation`, as `compile` renders it), per family, through
//! `dataplane::audit`. Live, both backends are read: anything of ours in the backend the
//! agent does not use is a finding too. Never writes to the kernel.
//!
//! `audit` at two layers: the kernel-side inventory and drift of one family in
//! `dataplane::audit`, the command (objects in, report out) in `inspect::audit`.

use std::process::ExitCode;

use serde_json::json;

use super::args::{AuditArgs, OutputFormat};
use super::{
    family_name, kube_ipvs_mode, live_rules, load_objects, read_live, read_saved, resolver,
    EXIT_BAD_INPUT,
};
use crate::agent::{Calculation, OWNERSHIP};
use crate::calc_graph::GraphConfig;
use crate::dataplane::audit::{audit, AuditInput, AuditReport, Finding};
use crate::dataplane::owned::OwnedState;
use crate::iface_naming::CriConfig;
use crate::model::IpFamily;
use crate::rules::chains::kernel_chain_rules;
use crate::rules::ChainInsertMode;
use crate::verdict::kernel::NodeView;

/// Runs `audit`; prints the report and returns the exit status (0 clean, 1 findings, 2
/// error).
pub fn run(args: &AuditArgs) -> ExitCode {
    match run_audit(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netpol-agent audit: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn run_audit(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let saved = match (&args.saved.iptables_save, &args.saved.ipset_save) {
        (Some(i), Some(s)) => Some((i.clone(), s.clone())),
        _ => None,
    };
    // On the node, `auto` means what the agent there resolved it to.
    let rules = match saved {
        None => live_rules(&args.rules)?,
        Some(_) => args.rules.clone(),
    };
    let mut cfg = rules.rule_config()?;
    let families = match (&saved, args.ipv6) {
        (Some(_), true) => vec![IpFamily::V6],
        (Some(_), false) => vec![IpFamily::V4],
        (None, _) => args.dataplane.families(),
    };
    let objects = load_objects(&args.source.source())?;
    let cri = CriConfig::new(args.cri_endpoint.clone());
    let Some(resolver) = resolver(&rules, saved.is_none().then_some(&cri))? else {
        // Offline with a scheme that needs the node: its message says what to use instead.
        rules.check_offline()?;
        anyhow::bail!("this interface-naming scheme needs the live node");
    };
    let text = match &saved {
        Some((i, s)) => read_saved(i, s, families[0])?,
        None => read_live(args.dataplane.backend_mode(), &families)?,
    };
    let host_addrs = kube_ipvs_mode(
        &rules,
        &mut cfg,
        saved.is_some().then(|| {
            (
                text.iptables.get(&families[0]).map_or("", String::as_str),
                text.ipsets.as_str(),
            )
        }),
    )?;
    let calc = Calculation::of_objects_on_host(
        GraphConfig {
            node_name: args.node.clone(),
            families: families.clone(),
            rules: cfg.clone(),
        },
        resolver,
        &objects,
        host_addrs,
    );
    let desired = calc.snapshot();
    let mut reports: Vec<AuditReport> = Vec::new();
    for &family in &families {
        let fam = desired.families.get(&family).cloned().unwrap_or_default();
        let kernel_rules = kernel_chain_rules(&cfg, family);
        let want = fam.restore_scripts(&cfg, family, args.rules.max_ipset_size);
        let provenance = calc.provenance(family);
        let mut report = audit(&AuditInput {
            family,
            iptables_save: text.iptables.get(&family).map_or("", String::as_str),
            ipset_save: &text.ipsets,
            want_iptables: &want.iptables,
            want_ipsets: &want.ipsets,
            kernel_rules: &kernel_rules,
            provenance: &provenance,
            ownership: &OWNERSHIP,
            view: NodeView {
                pod_prefixes: cfg.interface_prefixes.clone(),
                bridge: cfg.bridge.clone(),
            },
            append_mode: cfg.insert_mode == ChainInsertMode::Append,
        });
        if let Some((other, texts)) = &text.other_backend {
            if let Some(t) = texts.get(&family) {
                let mut ours = OwnedState::default();
                ours.add_iptables(t, &OWNERSHIP);
                let rules: usize = ours.chains.values().map(Vec::len).sum::<usize>()
                    + ours.kernel.values().map(Vec::len).sum::<usize>();
                if !ours.chains.is_empty() || !ours.kernel.is_empty() {
                    report.findings.push(Finding {
                        kind: "ours-in-other-backend",
                        subject: other.as_str().to_string(),
                        message: format!(
                            "the {} backend also holds {} chains and {} rules of ours: two agents (or a stale one) on one node; `netpol-agent cleanup --iptables-backend {}` removes them",
                            other.as_str(),
                            ours.chains.len(),
                            rules,
                            other.as_str()
                        ),
                    });
                }
            }
        }
        reports.push(report);
    }
    let rejected = calc.rejections();
    let findings: usize = reports.iter().map(|r| r.findings.len()).sum();
    let backend = text.backend.map_or_else(
        || "saved dumps".to_string(),
        |b| format!("{} backend", b.as_str()),
    );
    match args.output {
        OutputFormat::Text => {
            let mut out = String::new();
            for r in &reports {
                out.push_str(&r.to_text(&format!("node {} ({backend})", args.node)));
            }
            for ((kind, key), (_, message)) in rejected {
                out.push_str(&format!(
                    "note: {} {key} is not enforced as written (the agent rejects it too): {message}\n",
                    kind.as_str()
                ));
            }
            out.push_str(&format!(
                "node {}: {}\n",
                args.node,
                if findings == 0 {
                    format!(
                        "clean ({})",
                        reports
                            .iter()
                            .map(|r| family_name(r.family))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    format!("{findings} finding(s)")
                }
            ));
            print!("{out}");
        }
        OutputFormat::Json => {
            let doc = json!({
                "node": args.node,
                "source": backend,
                "clean": findings == 0,
                "findings": findings,
                "families": reports.iter().map(AuditReport::to_json).collect::<Vec<_>>(),
                "rejected_objects": rejected.iter().map(|((kind, key), (_, message))| json!({
                    "kind": kind.as_str(), "object": key, "message": message,
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    Ok(if findings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
