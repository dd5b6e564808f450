//! The netpol-agent command line: `compile` renders what a node must hold, offline.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tracing::{info, warn};

use netpol_agent::calc_graph::model::IpFamily;
use netpol_agent::calc_graph::{CalcGraph, GraphConfig};
use netpol_agent::config::RuleOptions;
use netpol_agent::datastore::{feed, manifests};
use netpol_agent::ipsets;
use netpol_agent::rules::{chains::kernel_chain_rules, render};

#[derive(Parser)]
#[command(
    name = "netpol-agent",
    version,
    about = "Kubernetes NetworkPolicy enforcement with iptables and ipset, felix style"
)]
struct Cli {
    /// Log level (TRACE, DEBUG, INFO, WARNING, ERROR), as felix's LogSeverityScreen.
    #[arg(
        long,
        global = true,
        env = "FELIX_LOGSEVERITYSCREEN",
        default_value = "INFO"
    )]
    log_severity_screen: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the ipset and iptables-restore input a node needs for a set of manifests.
    Compile(CompileArgs),
}

#[derive(Args)]
struct CompileArgs {
    /// Manifest files or directories (YAML or JSON; multi-document and `kind: List` work).
    #[arg(long, required = true, num_args = 1..)]
    manifests: Vec<PathBuf>,
    /// This node's name: pods with this `spec.nodeName` are local endpoints.
    #[arg(long, env = "FELIX_FELIXHOSTNAME")]
    node: String,
    /// Render the IPv6 family (ip6tables, inet6 sets) instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// Write the `ipset restore` script here instead of standard output.
    #[arg(long)]
    ipsets_out: Option<PathBuf>,
    /// Write the `iptables-restore` script here instead of standard output.
    #[arg(long)]
    iptables_out: Option<PathBuf>,
    /// Exit with status 1 when any object was rejected.
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    rules: RuleOptions,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_severity_screen);
    let result = match cli.command {
        Command::Compile(args) => compile(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netpol-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(severity: &str) {
    let level = match severity.to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "WARNING" | "WARN" => "warn",
        "ERROR" | "FATAL" | "PANIC" => "error",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::new(level))
        .init();
}

fn compile(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let family = if args.ipv6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    let rule_cfg = args.rules.rule_config()?;
    let mut graph = CalcGraph::new(GraphConfig {
        node_name: args.node.clone(),
        families: vec![family],
        rules: rule_cfg.clone(),
        resolver: args.rules.resolver()?,
    });
    let (objects, errors) = manifests::load_paths(&args.manifests)?;
    for e in &errors {
        warn!("{e}");
    }
    feed(&mut graph, &objects);
    graph.flush();
    let state = graph.snapshot();
    let fam = state.families.get(&family).cloned().unwrap_or_default();

    let ipset_script = ipsets::restore_script(&fam.sets, args.rules.max_ipset_size);
    let iptables_script = render::restore_script(
        &fam.chains,
        &kernel_chain_rules(&rule_cfg, family),
        rule_cfg.insert_mode,
    );
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
