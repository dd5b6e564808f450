//! The netpol-agent command line: `run` (the agent), `cleanup` (remove everything we
//! programmed), `compile` (render what a node must hold, offline), `explain` (why a flow is
//! allowed or denied), `audit` (whether a node's kernel holds what the policies say) and
//! `flows` (the flow records of one or more agents).
//!
//! Exit status: 0 success; 1 a failure while running (or `compile --strict` with rejected
//! objects); 2 invalid configuration (a bad flag or `FELIX_*` value, found before anything
//! is done); 3 `run` refused the node: at once when Calico's felix runs there (`host::felix`),
//! or because its dataplane bypasses host netfilter (the preflight checks): at once when the
//! health server is off, else on SIGTERM/SIGINT after having served `/readiness` 503 with the
//! reason meanwhile. `explain`: 0 allowed, 1 denied,
//! 2 bad input, 3 the kernel's answer differs from the policies'; `audit`: 0 clean, 1
//! findings, 2 error; `flows`: 0 every agent answered, 1 one could not be read, 2 bad
//! arguments.

/// mimalloc instead of glibc's malloc: the calc graph holds millions of small, long-lived
/// allocations at cluster scale (a pod record, its labels, its set memberships), and glibc's
/// 16-byte chunk header per allocation and its per-thread arenas cost more than the data.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::IsTerminal;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing::{error, info, warn};

use netpol_agent::agent::{self, Calculation, Input};
use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::config::{
    explain_invalid_value, AgentOptions, ConfigError, DataplaneOptions, Datastore, LogFormat,
    LogOptions, NamingScheme, RuleOptions,
};
use netpol_agent::dataplane::driver::Timers;
use netpol_agent::dataplane::iptables::{detect_backend, older_reader_caveat, Backend};
use netpol_agent::dataplane::{self, DataplaneConfig};
use netpol_agent::datastore::dir::DirSource;
use netpol_agent::datastore::manifests;
use netpol_agent::host::exec::Exec;
use netpol_agent::host::felix;
use netpol_agent::host::ipvs;
use netpol_agent::host::preflight::{self, PreflightConfig};
use netpol_agent::host::rule_counters::Xtables;
use netpol_agent::host::wiring as host_wiring;
use netpol_agent::inspect;
use netpol_agent::inspect::args::{AuditArgs, ExplainArgs};
use netpol_agent::inspect::staged::StagedArgs;
use netpol_agent::model::IpFamily;
use netpol_agent::rules::token;
use netpol_agent::rules::RuleConfig;
use netpol_agent::telemetry::health::Health;
use netpol_agent::telemetry::http;
use netpol_agent::telemetry::metrics_tls::{serve_metrics_tls, MetricsTls};
use netpol_agent::traffic::counters::CounterSettings;
use netpol_agent::traffic::cutter::CutterSettings;
use netpol_agent::traffic::deny_log::{DenyLogSettings, TARGET as DENY_LOG_TARGET};
use netpol_agent::traffic::{flow_log, flow_page, Traffic, TrafficConfig};

/// The JSON-lines target of flow logs, when on; on without flow logs is a configuration error
/// (records to write would never come).
fn flow_log_file(
    opts: &AgentOptions,
    rules: &RuleOptions,
) -> Result<Option<flow_log::FileSettings>, ConfigError> {
    if !opts.flow_logs_file_enabled {
        return Ok(None);
    }
    if !rules.flow_logs_enabled {
        return Err(ConfigError(
            "FELIX_FLOWLOGSFILEENABLED (--flow-logs-file-enabled) needs FELIX_FLOWLOGSENABLED (--flow-logs-enabled)".into(),
        ));
    }
    Ok(Some(flow_log::FileSettings {
        directory: opts.flow_logs_file_directory.clone(),
        max_files: opts.flow_logs_file_max_files,
        max_file_bytes: u64::from(opts.flow_logs_file_max_file_size_mb) << 20,
    }))
}

/// Exit status of `run` when the preflight checks refuse the node.
const EXIT_REFUSED: u8 = 3;
/// How often a refused agent (health server on) looks at the node again.
const PREFLIGHT_RECHECK: Duration = Duration::from_secs(10);
/// How often a refused agent repeats the full report in its log.
const PREFLIGHT_RELOG: Duration = Duration::from_secs(300);

/// The version and the git commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NETPOL_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "netpol-agent",
    version = VERSION,
    about = "Kubernetes NetworkPolicy enforcement with iptables and ipset, felix style"
)]
struct Cli {
    #[command(flatten)]
    log: LogOptions,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Enforce NetworkPolicy on this node until stopped (SIGTERM leaves the rules in place).
    Run(Box<RunArgs>),
    /// Remove every chain, kernel-chain rule and IP set netpol-agent owns, and nothing else.
    Cleanup(CleanupArgs),
    /// Print the ipset and iptables-restore input a node needs for a set of manifests.
    Compile(Box<CompileArgs>),
    /// Why a flow is allowed or denied: per side, the policy, rule, peer and port that decided
    /// (or the closest misses), and the rules implementing it; --kernel follows the packet
    /// through what a node's kernel holds.
    #[command(
        override_usage = "netpol-agent explain [OPTIONS] <--from <FROM> --to <TO>|--flows <FILE>>"
    )]
    Explain(Box<ExplainArgs>),
    /// Whether a node's kernel holds what the policies say: every chain and rule of ours with
    /// what it implements, drift, and other programs' rules that bypass or break enforcement.
    Audit(Box<AuditArgs>),
    /// Flow records of one or more agents (their `GET /flows`), merged: a table or JSON;
    /// --follow prints records as the agents flush them.
    Flows(Box<inspect::flows::FlowsArgs>),
    /// Staged policies (never enforced): the observed flows they would change (impact), and
    /// the enforced objects they would become (promote).
    Staged(Box<StagedArgs>),
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    agent: AgentOptions,
    #[command(flatten)]
    dataplane: DataplaneOptions,
    #[command(flatten)]
    rules: RuleOptions,
}

#[derive(Args)]
struct CleanupArgs {
    #[command(flatten)]
    dataplane: DataplaneOptions,
    /// Only say whether cleanup may run on this node, changing nothing: exit 3 when Calico's
    /// felix (or its state) is here, whose `cali-` names cleanup would remove, else 0.
    #[arg(long)]
    check: bool,
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
    /// With kube-proxy IPVS support on (--kube-ipvs): an address of this node (repeatable;
    /// both families), for the this-host set the agent fills from the node's interfaces
    /// (every address except kube-ipvs0's). Without it the set is rendered empty.
    #[arg(long = "host-address", value_name = "IP")]
    host_addresses: Vec<IpAddr>,
    #[command(flatten)]
    rules: RuleOptions,
}

/// Parses the command line and the environment; an invalid value ends the program with
/// status 2 and a message naming the environment variable, the flag and the accepted values.
fn parse_cli() -> (Cli, clap::ArgMatches) {
    let argv: Vec<String> = std::env::args().collect();
    let cmd = Cli::command();
    let parsed = cmd
        .clone()
        .try_get_matches_from(&argv)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    match parsed {
        Ok(parsed) => parsed,
        Err(e) => match explain_invalid_value(&cmd, &e, &argv) {
            Some(message) => {
                eprintln!("netpol-agent: {message}");
                std::process::exit(2);
            }
            None => e.exit(),
        },
    }
}

fn main() -> ExitCode {
    let (cli, matches) = parse_cli();
    init_logging(&cli.log);
    let result = match cli.command {
        Command::Run(args) => {
            log_start(&matches);
            run(*args)
        }
        Command::Cleanup(args) => cleanup(args),
        Command::Compile(args) => compile(*args),
        Command::Explain(args) => return inspect::explain::run(&args),
        Command::Audit(args) => return inspect::audit::run(&args),
        Command::Flows(args) => return inspect::flows::run(&args),
        Command::Staged(args) => return inspect::staged::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let config = e.downcast_ref::<ConfigError>().is_some();
            if config {
                eprintln!("netpol-agent: invalid configuration: {e:#}");
                ExitCode::from(2)
            } else {
                tracing::error!("{e:#}");
                eprintln!("netpol-agent: {e:#}");
                ExitCode::from(1)
            }
        }
    }
}

/// The start-up line: version, commit and the effective value of every option (with where it
/// came from); then each `FELIX_*` variable no option reads, once (felix logs "Ignoring
/// unknown config param" the same way), also as `netpol_config_ignored_variables`.
fn log_start(matches: &clap::ArgMatches) {
    let cmd = Cli::command();
    let mut config = Vec::new();
    if let (Some(run_cmd), Some(("run", run))) = (cmd.find_subcommand("run"), matches.subcommand())
    {
        for arg in run_cmd.get_arguments() {
            let id = arg.get_id().as_str();
            let name = arg
                .get_env()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_else(|| format!("--{id}"));
            let Some(values) = run.get_raw(id) else {
                continue;
            };
            let value: Vec<String> = values.map(|v| v.to_string_lossy().into_owned()).collect();
            let source = match run.value_source(id) {
                Some(clap::parser::ValueSource::DefaultValue) => "",
                Some(clap::parser::ValueSource::EnvVariable) => " (env)",
                _ => " (flag)",
            };
            config.push(format!("{name}={}{source}", value.join(",")));
        }
    }
    info!(
        version = VERSION,
        config = config.join(" "),
        "netpol-agent starting"
    );
    let known = netpol_agent::config::known_env(&cmd);
    let vars = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    for (name, why) in netpol_agent::config::ignored_env(&known, vars) {
        match why {
            netpol_agent::config::Ignored::Unknown => warn!(
                variable = name,
                "ignoring unknown config param {name}: no option of netpol-agent or felix reads it (a typo?)"
            ),
            netpol_agent::config::Ignored::Unimplemented => warn!(
                variable = name,
                "ignoring config param {name}: a felix parameter netpol-agent does not implement ({})",
                netpol_agent::config::felix_params::unimplemented_reason(&name).unwrap_or("")
            ),
        }
        netpol_agent::telemetry::metrics::global()
            .config_ignored_variables
            .with_label_values(&[name.as_str(), why.as_str()])
            .set(1);
    }
}

fn init_logging(opts: &LogOptions) {
    // Deny lines are the deny-log feature's output, written whatever the severity.
    let filter = tracing_subscriber::EnvFilter::new(format!(
        "{},{DENY_LOG_TARGET}=info",
        opts.log_severity_screen.filter()
    ));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match opts.log_format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn detect(dataplane: &DataplaneOptions, exec: &Exec) -> Backend {
    let backend = detect_backend(exec, dataplane.backend_mode());
    info!(?backend, "iptables backend");
    backend
}

/// The Kubernetes datastore: kube-rs watchers on their own thread (in-cluster config, else
/// KUBECONFIG). A configuration that cannot be built ends the agent before anything is
/// programmed; API errors later are retried inside the source.
fn start_kubernetes_source(tx: Sender<Input>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    netpol_agent::datastore::kube::spawn(
        netpol_agent::datastore::kube::KubeConnect::Infer,
        tx,
        stop,
    )?;
    Ok(())
}

/// The startup taint's remover (`datastore::kube::startup_taint`), when FELIX_STARTUPTAINT
/// names one: it waits for this agent's readiness, so the taint goes only once the rules are
/// applied.
fn start_startup_taint(
    opts: &AgentOptions,
    node: &str,
    health: &Arc<Health>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    if opts.startup_taint.is_empty() {
        return Ok(());
    }
    let health = health.clone();
    netpol_agent::datastore::kube::startup_taint::spawn(
        netpol_agent::datastore::kube::KubeConnect::Infer,
        node.to_string(),
        opts.startup_taint.clone(),
        move || health.readiness().0,
        |pending| {
            netpol_agent::telemetry::metrics::global()
                .startup_taint_pending
                .set(i64::from(pending))
        },
        stop.clone(),
    )?;
    Ok(())
}

fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    let node = args.agent.node_name()?;
    if args.rules.interface_name_scheme != NamingScheme::Auto {
        args.rules.rule_config()?;
    }
    let opts = &args.agent;
    let timers = Timers {
        refresh: AgentOptions::timer(opts.iptables_refresh_interval),
        ipsets_refresh: AgentOptions::timer(opts.ipsets_refresh_interval),
        post_write_check: opts.iptables_post_write_check_interval_secs,
        kernel_check: AgentOptions::timer(opts.kernel_check_interval),
        kernel_verify: AgentOptions::timer(opts.kernel_verify_interval),
    };
    // Felix first: it holds our health port, and beside it neither agent could keep its rules.
    let felix = felix::detect(&felix::snapshot(&Exec::default()));
    if !felix.is_empty() {
        let report = felix::report(&felix);
        if !opts.preflight_override {
            error!("{report}");
            if !opts.health_enabled {
                eprintln!("netpol-agent: {report}");
                return Ok(ExitCode::from(EXIT_REFUSED));
            }
            return idle_beside_felix(opts, report);
        }
        warn!(
            "FELIX_PREFLIGHTOVERRIDE (--preflight-override) is set, so running although: {report}"
        );
    }
    let health = Arc::new(Health::new(opts.dataplane_watchdog_timeout));
    // Bind the servers first: a port in use stops the agent before it touches the kernel.
    if opts.prometheus_metrics_enabled {
        serve_metrics(opts)?;
    }
    let flow_file = flow_log_file(opts, &args.rules)?;
    // Flow logs: GET /flows on the health server, answered once the reader runs, and the
    // page that reads it (GET /flows/ui).
    let flows_slot: Arc<flow_log::FlowsSlot> = Arc::default();
    if opts.health_enabled {
        if args.rules.flow_logs_enabled {
            let (slot, streams) = (flows_slot.clone(), flows_slot.clone());
            http::serve_health_streaming(
                &opts.health_host,
                opts.health_port,
                health.clone(),
                move |path, query| {
                    flow_page::route(path).or_else(|| flow_log::route(&slot, path, query))
                },
                Box::new(move |path, query| flow_log::stream_route(&streams, path, query)),
            )?;
        } else {
            http::serve_health(&opts.health_host, opts.health_port, health.clone())?;
        }
    }

    // The datastore starts before anything reads the kernel: a source that cannot start
    // stops the agent having touched nothing.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    // Set (with the reason) by whatever finds that the node changed what the agent was
    // configured from (auto's wiring seen at last, kube-ipvs0 under auto); the loops then
    // stop and `main` starts the agent again in place, rules kept meanwhile.
    let restart: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let wiring_pending = args.rules.interface_name_scheme == NamingScheme::Auto && {
        match read_wiring() {
            Some(wiring) => {
                args.rules = args.rules.with_wiring(&wiring);
                false
            }
            None => true,
        }
    };
    let mut rules = args.rules.rule_config()?;
    if wiring_pending {
        // No pod interface to hook yet: every pod is unnamed, the guard holds the isolated
        // ones by address, and the node is watched until it shows how it wires pods.
        rules.interface_prefixes.clear();
        rules.bridge = None;
        health.set_note(Some(WIRING_PENDING.into()));
        watch_wiring(restart.clone(), stop.clone())?;
    }
    netpol_agent::telemetry::metrics::global()
        .wiring_pending
        .set(i64::from(wiring_pending));
    let (rules, ipvs_view) = kube_ipvs_mode(&args.rules, rules)?;
    // The sandbox scheme asks the container runtime (FELIX_CRIENDPOINT) at run time.
    let resolver: Box<dyn netpol_agent::iface_naming::InterfaceResolver> = if wiring_pending {
        Box::new(netpol_agent::iface_naming::WiringPending)
    } else {
        args.rules.runtime_resolver(&opts.cri_config())?
    };
    let families = node_families(&args.dataplane);
    let ipv6 = families.contains(&IpFamily::V6);
    if !preflight_passes(opts, &rules, ipv6, &health, &stop)? {
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Input>();
    let ipvs_auto = args.rules.kube_ipvs_support_enabled == netpol_agent::config::IpvsSupport::Auto;
    watch_kube_ipvs(&rules, ipvs_auto, ipvs_view, &tx, &stop, &restart)?;
    // Resolvers that learn interface names over time (the container runtime, the routing
    // table, the bridge) tell the calculation loop to name local pods again.
    let resolver_tx = std::sync::Mutex::new(tx.clone());
    resolver.start(
        Box::new(move || {
            let _ = resolver_tx
                .lock()
                .map(|tx| tx.send(Input::InterfacesChanged));
        }),
        stop.clone(),
    )?;
    let datastore = match &opts.datastore {
        Datastore::Dir(dir) => {
            DirSource::new(dir).spawn(tx)?;
            format!("dir:{}", dir.display())
        }
        Datastore::Kubernetes => {
            start_kubernetes_source(tx, stop.clone())?;
            start_startup_taint(opts, &node, &health, &stop)?;
            "kubernetes".to_string()
        }
    };
    if !opts.startup_taint.is_empty() && !matches!(opts.datastore, Datastore::Kubernetes) {
        warn!(
            taint = %opts.startup_taint,
            "FELIX_STARTUPTAINT is ignored: only the kubernetes datastore can remove a taint"
        );
    }
    let exec = Exec::default();
    let graph = Calculation::new(
        GraphConfig {
            node_name: node.clone(),
            families: families.clone(),
            rules: rules.clone(),
        },
        resolver,
    );
    let backend = detect(&args.dataplane, &exec);
    // What the renderer emits NFLOG rules from, not the flags again.
    let nflog_rules = rules.deny_log.is_some() || rules.flow_log.is_some();
    match older_reader_caveat(backend, nflog_rules) {
        Some(c) if c.warn => warn!("{}", c.text),
        Some(c) => info!("{}", c.text),
        None => {}
    }
    let dataplane_cfg = DataplaneConfig {
        families,
        rules,
        backend,
        ownership: agent::OWNERSHIP,
        interest: agent::ours(),
        max_set_size: args.rules.max_ipset_size,
        exec,
    };

    let traffic = Traffic::start(
        TrafficConfig {
            deny_log: args.rules.deny_log()?.map(|d| DenyLogSettings {
                node: node.clone(),
                group: d.group(),
                snap_len: d.snap_len(),
                dedup_window: opts.deny_log_dedup_window,
            }),
            flow_log: args.rules.flow_log()?.map(|f| flow_log::FlowLogSettings {
                node: node.clone(),
                group: f.group(),
                snap_len: f.snap_len(),
                flush_interval: opts.flow_logs_flush_interval,
                file: flow_file.clone(),
            }),
            counters: Some(CounterSettings {
                xtables: match dataplane_cfg.backend {
                    Backend::Legacy => Xtables::Legacy,
                    Backend::Nft => Xtables::Nft,
                },
                families: dataplane_cfg.families.clone(),
                interval: opts.policy_counters_interval,
            }),
            policy_counters: opts.policy_counters_enabled,
            conntrack: opts.conntrack_reevaluate.then(|| CutterSettings {
                node: node.clone(),
                rules: dataplane_cfg.rules.clone(),
                interval: opts.conntrack_reevaluate_interval,
            }),
        },
        stop.clone(),
    )?;
    if let Some(flows) = traffic.flows() {
        let _ = flows_slot.set(flows);
    }
    info!(node, datastore, "netpol-agent running");
    agent::run(
        graph,
        dataplane_cfg,
        timers,
        rx,
        stop,
        health,
        traffic,
        opts.interface_grace_period,
    )?;
    if let Some(why) = restart.lock().unwrap_or_else(|p| p.into_inner()).take() {
        info!("restarting in place: {why}; the rules stay in place meanwhile");
        return Ok(restart_in_place());
    }
    info!("stopping; the rules stay in place");
    Ok(ExitCode::SUCCESS)
}

/// The families to program: FELIX_IPV6SUPPORT's, without IPv6 on a node whose kernel has
/// none (booted with `ipv6.disable=1`: no `/proc/sys/net/ipv6`), where no pod can have an
/// IPv6 address and ip6tables has nothing to work on. IPv6 support on (the default) thus
/// follows the node.
fn node_families(dataplane: &DataplaneOptions) -> Vec<IpFamily> {
    let mut families = dataplane.families();
    if families.contains(&IpFamily::V6) && !std::path::Path::new("/proc/sys/net/ipv6").exists() {
        info!("this node's kernel has no IPv6 (no /proc/sys/net/ipv6), so no pod here can have an IPv6 address; programming IPv4 only");
        families.retain(|f| *f == IpFamily::V4);
    }
    families
}

/// The metrics server, on TLS when its files are set (never plain text then).
fn serve_metrics(opts: &AgentOptions) -> anyhow::Result<std::net::SocketAddr> {
    let tls = MetricsTls::from_settings(
        &opts.prometheus_metrics_cert_file,
        &opts.prometheus_metrics_key_file,
        &opts.prometheus_metrics_ca_file,
    )?;
    match tls {
        Some(tls) => serve_metrics_tls(opts.metrics_host(), opts.prometheus_metrics_port, tls),
        None => http::serve_metrics(opts.metrics_host(), opts.prometheus_metrics_port),
    }
}

/// Calico's felix on this node, or its state, with the health server on (a DaemonSet): the
/// agent stays up idle instead of crash-looping (issue 37), programs nothing, looks again
/// every 10 s and restarts itself in place once felix and its state are gone. Its readiness
/// says why (503 with the report) when it can serve its health port; while felix runs, felix
/// holds that port (127.0.0.1:9099 is its default too) and kubelet's probes of this pod reach
/// felix's health, so the pod is as ready as the node's enforcement (felix's) is, and the
/// rollout completes. `netpol_felix_present` is 1 throughout, when the metrics port is free.
fn idle_beside_felix(opts: &AgentOptions, report: String) -> anyhow::Result<ExitCode> {
    const RECHECK: Duration = Duration::from_secs(10);
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let health = Arc::new(Health::new(opts.dataplane_watchdog_timeout));
    health.set_refused(format!("idle: {report}"));
    // Bound as soon as the port is free (felix stopped, its state left behind).
    let mut serving = match http::serve_health(&opts.health_host, opts.health_port, health.clone())
    {
        Ok(_) => true,
        Err(e) => {
            info!("idle beside felix; the health port is taken ({e:#}), by felix itself when it runs, so this pod's probes reach felix's health");
            false
        }
    };
    if opts.prometheus_metrics_enabled {
        if let Err(e) = serve_metrics(opts) {
            info!("idle beside felix; the metrics port is taken ({e:#})");
        }
    }
    netpol_agent::telemetry::metrics::global()
        .felix_present
        .set(1);
    let mut logged = Instant::now();
    loop {
        let wake = Instant::now() + RECHECK;
        while Instant::now() < wake {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                info!("stopping; idle beside felix, nothing was programmed");
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = felix::detect(&felix::snapshot(&Exec::default()));
        if now.is_empty() {
            info!("felix and its state are gone from this node; starting");
            return Ok(restart_in_place());
        }
        if !serving {
            serving =
                http::serve_health(&opts.health_host, opts.health_port, health.clone()).is_ok();
        }
        if logged.elapsed() >= PREFLIGHT_RELOG {
            error!("{}", felix::report(&now));
            logged = Instant::now();
        }
    }
}

/// The readiness note while `FELIX_INTERFACENAMESCHEME=auto` waits for the node's wiring.
const WIRING_PENDING: &str = "FELIX_INTERFACENAMESCHEME=auto has not seen a pod interface on this node yet (no pod is wired here); pods a policy isolates are dropped by address until the agent sees how pods are wired and restarts itself with that scheme";

/// Starts this program again in this process (`exec`), with the same arguments and
/// environment: what the agent was configured from changed on the node. Returns only when the
/// exec failed, with status 1 so that the DaemonSet restarts the container instead.
fn restart_in_place() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            error!("restarting: cannot find this program: {e}; exiting with status 1 so the container is restarted");
            return ExitCode::from(1);
        }
    };
    let e = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .exec();
    error!(
        "restarting: exec of {} failed: {e}; exiting with status 1 so the container is restarted",
        exe.display()
    );
    ExitCode::from(1)
}

/// `FELIX_INTERFACENAMESCHEME=auto`: how this node wires its pods, logged with the settings
/// chosen; `None` while no pod interface shows it (or the node could not be read).
fn read_wiring() -> Option<host_wiring::Wiring> {
    match host_wiring::read().map(|w| w.detect()) {
        Ok(Some(wiring)) => {
            let (scheme, prefixes, bridge) = match &wiring {
                host_wiring::Wiring::Routed { prefixes } => ("routes", prefixes, ""),
                host_wiring::Wiring::Bridged { bridge, prefixes } => {
                    ("bridge", prefixes, bridge.as_str())
                }
            };
            info!(
                scheme,
                prefixes = prefixes.join(","),
                bridge,
                "FELIX_INTERFACENAMESCHEME=auto: this node wires pods {}; using FELIX_INTERFACENAMESCHEME={scheme} FELIX_INTERFACEPREFIX={} FELIX_BRIDGEINTERFACE={bridge}",
                if bridge.is_empty() { "on routed veths with host routes".to_string() } else { format!("on the ports of bridge {bridge}") },
                prefixes.join(",")
            );
            Some(wiring)
        }
        Ok(None) => {
            warn!("FELIX_INTERFACENAMESCHEME=auto: no pod interface on this node yet (neither a veth with a host route nor a bridge port); until one appears no pod is named and pods a policy isolates are dropped by address; looking again every {} s", WIRING_RECHECK.as_secs());
            None
        }
        Err(e) => {
            warn!("FELIX_INTERFACENAMESCHEME=auto: reading the node failed: {e:#}; treating its wiring as not seen yet");
            None
        }
    }
}

/// How often auto looks for the node's first pod interface.
const WIRING_RECHECK: Duration = Duration::from_secs(1);

/// Watches, on its own thread, for the node's first pod interface while auto's wiring is
/// pending; when it shows, asks for a restart in place (which detects it again at start).
fn watch_wiring(
    restart: Arc<std::sync::Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("wiring-watch".into())
        .spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(WIRING_RECHECK);
                if let Ok(Some(_)) = host_wiring::read().map(|w| w.detect()) {
                    *restart.lock().unwrap_or_else(|p| p.into_inner()) = Some(
                        "FELIX_INTERFACENAMESCHEME=auto: the node shows how it wires pods now"
                            .into(),
                    );
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        })
        .context("starting the wiring watch")?;
    Ok(())
}

/// The preflight checks (see `preflight`): `Ok(true)` when the node's dataplane lets
/// iptables see pod traffic, or the operator overrides the findings. Otherwise the refusal is
/// logged and, without a health server, `run` ends at once with status 3. With one, the agent
/// stays up: `/readiness` answers 503 with the findings, `/liveness` 200 (a restart would find
/// the same node), and the node is looked at again every 10 s, so fixing it (say
/// `net.bridge.bridge-nf-call-iptables=1`) starts the agent without a restart; SIGTERM then
/// ends it with status 3. Nothing is programmed while refusing.
fn preflight_passes(
    opts: &AgentOptions,
    rules: &RuleConfig,
    ipv6: bool,
    health: &Health,
    stop: &AtomicBool,
) -> anyhow::Result<bool> {
    let cfg = PreflightConfig {
        prefixes: rules.interface_prefixes.clone(),
        bridge: rules.bridge.clone(),
        ipv6,
    };
    let mut findings = preflight::check(&preflight::snapshot()?, &cfg);
    if findings.is_empty() {
        return Ok(true);
    }
    if opts.preflight_override {
        warn!(
            "FELIX_PREFLIGHTOVERRIDE (--preflight-override) is set, so running although: {}",
            preflight::report(&findings)
        );
        return Ok(true);
    }
    let report = preflight::report(&findings);
    error!("{report}");
    if !opts.health_enabled {
        eprintln!("netpol-agent: {report}");
        return Ok(false);
    }
    health.set_refused(preflight::summary(&findings));
    info!(
        "staying up not ready (/readiness says why); the node is checked again every {} s",
        PREFLIGHT_RECHECK.as_secs()
    );
    let mut logged = Instant::now();
    loop {
        let wake = Instant::now() + PREFLIGHT_RECHECK;
        while Instant::now() < wake {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                info!("stopping; refused to run, nothing was programmed");
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = match preflight::snapshot() {
            Ok(snapshot) => preflight::check(&snapshot, &cfg),
            Err(e) => {
                warn!("preflight: reading the node again failed: {e:#}");
                continue;
            }
        };
        if now.is_empty() {
            info!("the preflight checks pass now; starting");
            health.clear_refused();
            return Ok(true);
        }
        if now != findings || logged.elapsed() >= PREFLIGHT_RELOG {
            error!("{}", preflight::report(&now));
            logged = Instant::now();
        }
        health.set_refused(preflight::summary(&now));
        findings = now;
    }
}

fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    let exec = Exec::default();
    // Our names are felix's: on a node where felix runs, "ours" would be felix's state.
    let felix = felix::detect(&felix::snapshot(&exec));
    if !felix.is_empty() {
        let report = format!(
            "cleanup refused: Calico's felix runs on this node, or did, and the cali- chains and              IP sets cleanup removes would be felix's too; remove Calico with its own clean-up              first. Found: {}",
            felix.join("; ")
        );
        error!("{report}");
        eprintln!("netpol-agent: {report}");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    if args.check {
        info!("no felix on this node: cleanup may run");
        return Ok(ExitCode::SUCCESS);
    }
    dataplane::cleanup(
        &exec,
        detect(&args.dataplane, &exec),
        agent::OWNERSHIP,
        &node_families(&args.dataplane),
    )?;
    info!("removed every chain, rule and set netpol-agent owned");
    Ok(ExitCode::SUCCESS)
}

/// kube-proxy's IPVS mode: `auto` follows `kube-ipvs0` in our network namespace, read once
/// here (felix's detection); the effective mode is logged. Also returns what was read.
fn kube_ipvs_mode(
    opts: &netpol_agent::config::RuleOptions,
    mut rules: netpol_agent::rules::RuleConfig,
) -> anyhow::Result<(netpol_agent::rules::RuleConfig, ipvs::IpvsView)> {
    use netpol_agent::config::IpvsSupport;
    let view = ipvs::read().context("reading links and addresses for IPVS detection")?;
    let setting = opts.kube_ipvs_support_enabled;
    if setting == IpvsSupport::Auto && view.present {
        rules.kube_ipvs = Some(opts.kube_ipvs_config(&rules.marks)?);
    }
    let on = rules.kube_ipvs.is_some();
    info!(
        kube_ipvs0 = view.present,
        setting = setting.as_str(),
        enabled = on,
        endpoint_mark = rules.kube_ipvs.as_ref().map(|i| format!("{:#x}", i.endpoint.mask)),
        node_port_ranges = %opts.kube_node_port_ranges,
        "kube-proxy IPVS support {}",
        if on { "on" } else { "off" }
    );
    if view.present && setting == IpvsSupport::Off {
        warn!("kube-ipvs0 exists but FELIX_KUBEIPVSSUPPORTENABLED=false: pod traffic to Services is judged in INPUT before IPVS rewrites it, and a local backend's ingress policy is not applied");
    }
    Ok((rules, view))
}

/// Hands this host's addresses to the calculation loop (IPVS on) and watches the node: when
/// `kube-ipvs0` appears or disappears under `auto`, the agent restarts itself in place in the
/// right mode (felix restarts too); the rules stay in place meanwhile, as on any stop.
fn watch_kube_ipvs(
    rules: &netpol_agent::rules::RuleConfig,
    auto: bool,
    view: ipvs::IpvsView,
    tx: &std::sync::mpsc::Sender<Input>,
    stop: &Arc<AtomicBool>,
    restart: &Arc<std::sync::Mutex<Option<String>>>,
) -> anyhow::Result<()> {
    let on = rules.kube_ipvs.is_some();
    let (restart, stop_all) = (restart.clone(), stop.clone());
    if on {
        let _ = tx.send(Input::HostAddresses(
            view.host_addrs.iter().copied().collect(),
        ));
    }
    let addr_tx = std::sync::Mutex::new(tx.clone());
    let started = view.present;
    ipvs::watch(
        started,
        view.host_addrs,
        stop.clone(),
        move |now| {
            if !auto {
                warn!(kube_ipvs0 = now, "kube-ipvs0 {} since start; FELIX_KUBEIPVSSUPPORTENABLED is set, so the rules stay as they are", if now { "appeared" } else { "disappeared" });
                return false;
            }
            let why = format!(
                "kube-ipvs0 {} since start: kube-proxy's mode changed",
                if now { "appeared" } else { "disappeared" }
            );
            warn!(
                kube_ipvs0 = now,
                "{why}; restarting to render the rules for the new mode"
            );
            *restart.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            stop_all.store(true, std::sync::atomic::Ordering::Relaxed);
            true
        },
        move |addrs| {
            if on {
                let _ = addr_tx
                    .lock()
                    .map(|tx| tx.send(Input::HostAddresses(addrs.into_iter().collect())));
            }
        },
    )?;
    Ok(())
}

fn compile(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let family = if args.ipv6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    args.rules.check_offline()?;
    let rule_cfg = args.rules.rule_config()?;
    let resolver = args.rules.resolver()?;
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
