//! `compile`: the ipset and iptables-restore input a node needs for a set of manifests,
//! offline, through the same calculation as the agent and [`FamilyState::restore_scripts`]
//! (`crate::calc_graph::update`); every line is checked before it is printed.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use tracing::{info, warn};

use crate::agent::Calculation;
use crate::calc_graph::update::RestoreScripts;
use crate::calc_graph::GraphConfig;
use crate::config::RuleOptions;
use crate::datastore::manifests;
use crate::model::IpFamily;
use crate::rules::token;

#[derive(Args)]
pub struct CompileArgs {
    /// Manifest files or directories (YAML or JSON; multi-document and `kind: List` work).
    #[arg(long, required = true, num_args = 1..)]
    pub manifests: Vec<PathBuf>,
    /// This node's name: pods with this `spec.nodeName` are local endpoints.
    #[arg(long, env = "FELIX_FELIXHOSTNAME")]
    pub node: String,
    /// Render the IPv6 family (ip6tables, inet6 sets) instead of IPv4.
    #[arg(long)]
    pub ipv6: bool,
    /// Write the `ipset restore` script here instead of standard output.
    #[arg(long)]
    pub ipsets_out: Option<PathBuf>,
    /// Write the `iptables-restore` script here instead of standard output.
    #[arg(long)]
    pub iptables_out: Option<PathBuf>,
    /// Exit with status 1 when any object was rejected.
    #[arg(long)]
    pub strict: bool,
    /// With kube-proxy IPVS support on (--kube-ipvs): an address of this node (repeatable;
    /// both families), for the this-host set the agent fills from the node's interfaces
    /// (every address except kube-ipvs0's). Without it the set is rendered empty.
    #[arg(long = "host-address", value_name = "IP")]
    pub host_addresses: Vec<IpAddr>,
    #[command(flatten)]
    pub rules: RuleOptions,
}

pub fn run(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let family = if args.ipv6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    args.rules.check_offline()?;
    let rule_cfg = args.rules.rule_config()?;
    let resolver = crate::iface_naming::resolver(&args.rules)?;
    let (objects, errors) = manifests::load_paths(&args.manifests)?;
    for e in &errors {
        warn!("{e}");
    }
    if !args.host_addresses.is_empty() && rule_cfg.kube_ipvs.is_none() {
        // Nothing renders them without IPVS support: say so rather than ignore them silently.
        warn!("--host-address only feeds the IPVS this-host set; without --kube-ipvs it is unused");
    }
    let graph = Calculation::of_objects_on_host(
        GraphConfig {
            node_name: args.node.clone(),
            families: vec![family],
            rules: rule_cfg.clone(),
        },
        resolver,
        &objects,
        args.host_addresses.iter().copied(),
    );
    let state = graph.snapshot();
    let fam = state.families.get(&family).cloned().unwrap_or_default();

    let RestoreScripts {
        ipsets: ipset_script,
        iptables: iptables_script,
    } = fam.restore_scripts(&rule_cfg, family, args.rules.max_ipset_size);
    // Every line was rendered from checked text; a line that still is not safe is a bug, and
    // printing it could hand iptables-restore a command nobody wrote.
    let unsafe_line = token::script_problem(&ipset_script, token::ipset_line_problem)
        .or_else(|| token::script_problem(&iptables_script, token::restore_line_problem));
    if let Some(problem) = unsafe_line {
        anyhow::bail!("refusing to print an unsafe restore script: {problem}");
    }
    let mut stdout = String::new();
    match &args.ipsets_out {
        Some(path) => std::fs::write(path, &ipset_script)
            .with_context(|| format!("writing {}", path.display()))?,
        None => stdout.push_str(&ipset_script),
    }
    match &args.iptables_out {
        Some(path) => std::fs::write(path, &iptables_script)
            .with_context(|| format!("writing {}", path.display()))?,
        None => stdout.push_str(&iptables_script),
    }
    print!("{stdout}");

    let rejected = graph.rejections().len() + errors.len();
    info!(
        objects = objects.len(),
        local_endpoints = graph.local_endpoint_count(),
        active_policies = graph.active_policy_count(),
        sets = fam.sets.len(),
        chains = fam.chains.len(),
        rejected,
        "compiled"
    );
    Ok(if args.strict && rejected > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
