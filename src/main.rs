//! The netpol-agent command line: `run` (the agent), `cleanup` (remove everything we
//! programmed), `compile` (render what a node must hold, offline).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tracing::{info, warn};

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use netpol_agent::agent::{self, Timers};
use netpol_agent::calc_graph::model::IpFamily;
use netpol_agent::calc_graph::{CalcGraph, GraphConfig};
use netpol_agent::config::RuleOptions;
use netpol_agent::dataplane::{self, DataplaneConfig};
use netpol_agent::datastore::dir::DirSource;
use netpol_agent::datastore::{feed, manifests};
use netpol_agent::exec::Exec;
use netpol_agent::ipsets;
use netpol_agent::iptables_writer::{detect_backend, Backend, BackendMode};
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
    /// Enforce NetworkPolicy on this node until stopped (SIGTERM leaves the rules in place).
    Run(RunArgs),
    /// Remove every chain, kernel-chain rule and IP set netpol-agent owns, and nothing else.
    Cleanup(CleanupArgs),
    /// Print the ipset and iptables-restore input a node needs for a set of manifests.
    Compile(CompileArgs),
}

#[derive(Args)]
struct DataplaneOptions {
    /// iptables backend: legacy, nft, or auto (kube-proxy's hint chains decide, else the
    /// backend holding more rules).
    #[arg(
        long,
        env = "FELIX_IPTABLESBACKEND",
        value_enum,
        ignore_case = true,
        default_value = "auto"
    )]
    iptables_backend: BackendArg,
    /// Program IPv6 (ip6tables, inet6 sets) as well as IPv4.
    #[arg(long, env = "FELIX_IPV6SUPPORT", default_value_t = true, action = clap::ArgAction::Set)]
    ipv6_support: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum BackendArg {
    Legacy,
    Nft,
    Auto,
}

#[derive(Args)]
struct RunArgs {
    /// Where objects come from: `dir:PATH` (a watched directory of manifests).
    #[arg(long, env = "NETPOL_DATASTORE")]
    datastore: String,
    /// This node's name (pods with this `spec.nodeName` are local); defaults to the hostname.
    #[arg(long, env = "FELIX_FELIXHOSTNAME")]
    node: Option<String>,
    /// Seconds between full re-reads of iptables and ipsets that repair what others changed.
    #[arg(long, env = "FELIX_IPTABLESREFRESHINTERVAL", default_value_t = 10.0)]
    iptables_refresh_interval: f64,
    /// Seconds after a write before iptables is read back once to verify it.
    #[arg(
        long,
        env = "FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS",
        default_value_t = 1.0
    )]
    iptables_post_write_check_interval_secs: f64,
    #[command(flatten)]
    dataplane: DataplaneOptions,
    #[command(flatten)]
    rules: RuleOptions,
}

#[derive(Args)]
struct CleanupArgs {
    #[command(flatten)]
    dataplane: DataplaneOptions,
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
        Command::Run(args) => run(args),
        Command::Cleanup(args) => cleanup(args),
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

impl DataplaneOptions {
    fn families(&self) -> Vec<IpFamily> {
        if self.ipv6_support {
            vec![IpFamily::V4, IpFamily::V6]
        } else {
            vec![IpFamily::V4]
        }
    }

    fn backend(&self, exec: &Exec) -> Backend {
        let mode = match self.iptables_backend {
            BackendArg::Legacy => BackendMode::Legacy,
            BackendArg::Nft => BackendMode::Nft,
            BackendArg::Auto => BackendMode::Auto,
        };
        let backend = detect_backend(exec, mode);
        info!(?backend, "iptables backend");
        backend
    }
}

fn seconds(name: &str, value: f64) -> anyhow::Result<Duration> {
    if !(value.is_finite() && value > 0.0) {
        anyhow::bail!("{name} must be a positive number of seconds, got {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let Some(dir) = args.datastore.strip_prefix("dir:") else {
        anyhow::bail!(
            "--datastore {:?}: only dir:PATH is supported so far",
            args.datastore
        );
    };
    let node = match args.node {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --node given and the hostname is unreadable")?
            .trim()
            .to_string(),
    };
    let rules = args.rules.rule_config()?;
    let timers = Timers {
        refresh: seconds(
            "FELIX_IPTABLESREFRESHINTERVAL",
            args.iptables_refresh_interval,
        )?,
        post_write_check: seconds(
            "FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS",
            args.iptables_post_write_check_interval_secs,
        )?,
    };
    let exec = Exec::default();
    let families = args.dataplane.families();
    let graph = CalcGraph::new(GraphConfig {
        node_name: node.clone(),
        families: families.clone(),
        rules: rules.clone(),
        resolver: args.rules.resolver()?,
    });
    let dataplane_cfg = DataplaneConfig {
        families,
        rules,
        backend: args.dataplane.backend(&exec),
        max_set_size: args.rules.max_ipset_size,
        exec,
    };

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    DirSource::new(dir).spawn(tx)?;
    info!(node, datastore = %args.datastore, "netpol-agent running");
    agent::run(graph, dataplane_cfg, timers, rx, stop)?;
    info!("stopping; the rules stay in place");
    Ok(ExitCode::SUCCESS)
}

fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    let exec = Exec::default();
    dataplane::cleanup(
        &exec,
        args.dataplane.backend(&exec),
        &args.dataplane.families(),
    )?;
    info!("removed every chain, rule and set netpol-agent owned");
    Ok(ExitCode::SUCCESS)
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
