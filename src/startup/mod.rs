//! Start-up and shutdown of the agent on a node (`run`), and `cleanup`: main.rs parses the
//! command line and hands the arguments here. In order, `run`:
//! 1. passes the gates ([`gates`]): Calico's felix on the node (idle beside it, or refuse),
//!    auto's wiring (seen, or pending with its watcher), the preflight checks (refuse, or stay
//!    up not ready until the node is fixed);
//! 2. resolves the settings once ([`Settings`]: node name, rule configuration with wiring and
//!    kube-proxy IPVS mode ([`ipvs`]) applied, interface resolver, families, timers, traffic
//!    settings) and hands them down: nothing below reads the options again;
//! 3. starts the servers, the sources and the traffic readers, then runs the calculation loop
//!    until SIGTERM/SIGINT, or until the node changes what the agent was configured from (a
//!    restart in place, rules kept meanwhile).
//!
//! Nothing here ends the process: a refusal is an exit status returned to main.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Args;
use tracing::{error, info, warn};

use crate::agent::{self, Calculation, Input};
use crate::calc_graph::GraphConfig;
use crate::config::{
    AgentOptions, ConfigError, DataplaneOptions, Datastore, IpvsSupport, NamingScheme, RuleOptions,
};
use crate::dataplane::driver::Timers;
use crate::dataplane::iptables::{detect_backend, older_reader_caveat, Backend};
use crate::dataplane::{self, DataplaneConfig};
use crate::datastore::dir::DirSource;
use crate::host::exec::Exec;
use crate::host::felix;
use crate::host::rule_counters::Xtables;
use crate::iface_naming::{self, InterfaceResolver};
use crate::model::IpFamily;
use crate::rules::RuleConfig;
use crate::telemetry::health::Health;
use crate::telemetry::http;
use crate::telemetry::metrics_tls::{serve_metrics_tls, MetricsTls};
use crate::traffic::counters::CounterSettings;
use crate::traffic::cutter::CutterSettings;
use crate::traffic::deny_log::DenyLogSettings;
use crate::traffic::{flow_log, flow_page, Traffic, TrafficConfig};

pub mod gates;
pub mod ipvs;

/// Exit status of `run` when the preflight checks refuse the node.
pub const EXIT_REFUSED: u8 = 3;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub agent: AgentOptions,
    #[command(flatten)]
    pub dataplane: DataplaneOptions,
    #[command(flatten)]
    pub rules: RuleOptions,
}

#[derive(Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub dataplane: DataplaneOptions,
    /// Only say whether cleanup may run on this node, changing nothing: exit 3 when Calico's
    /// felix (or its state) is here, whose `cali-` names cleanup would remove, else 0.
    #[arg(long)]
    pub check: bool,
}

/// What `run` works with, resolved once from the options and the node, then handed down:
/// nothing after [`Settings::resolve`] reads the options for these again.
pub struct Settings {
    /// This node's name (`FELIX_FELIXHOSTNAME`, else the host name).
    pub node: String,
    pub timers: Timers,
    /// The rules' configuration with auto's wiring (when seen) and the IPVS mode applied.
    pub rules: RuleConfig,
    /// Who names local pods' interfaces; `WiringPending` while auto has seen no pod interface.
    pub resolver: Box<dyn InterfaceResolver>,
    /// The families to program ([`node_families`]).
    pub families: Vec<IpFamily>,
    /// `kube-ipvs0` and this host's addresses as read at start, for the IPVS watcher.
    pub ipvs_view: crate::host::ipvs::IpvsView,
}

impl Settings {
    /// Auto's wiring (read once here; while pending, the readiness note and the watcher that
    /// restarts the agent once a pod interface shows), the rule configuration, the IPVS mode,
    /// the resolver and the families.
    fn resolve(
        args: &mut RunArgs,
        node: String,
        timers: Timers,
        health: &Health,
        restart: &Restart,
        stop: &Arc<AtomicBool>,
    ) -> anyhow::Result<Settings> {
        let wiring_pending = args.rules.interface_name_scheme == NamingScheme::Auto && {
            match gates::read_wiring() {
                Some(wiring) => {
                    args.rules = iface_naming::with_wiring(&args.rules, &wiring);
                    false
                }
                None => true,
            }
        };
        let mut rules = args.rules.rule_config()?;
        if wiring_pending {
            // No pod interface to hook yet: every pod is unnamed, the guard holds the isolated
            // ones by address, the pending chains close the node's pod ranges and the
            // prefixes' interfaces to every other address than the known pods', and the node
            // is watched until it shows how it wires pods.
            let prefixes = std::mem::take(&mut rules.interface_prefixes);
            rules.pending = Some(crate::rules::guard::PendingWiring {
                pod_cidrs: gates::pending_pod_ranges(&args.agent.datastore, &node, &prefixes),
                prefixes,
            });
            rules.bridge = None;
            health.set_note(Some(gates::WIRING_PENDING.into()));
            gates::watch_wiring(restart.clone(), stop.clone())?;
        }
        crate::telemetry::metrics::global()
            .wiring_pending
            .set(i64::from(wiring_pending));
        let (rules, ipvs_view) = ipvs::kube_ipvs_mode(&args.rules, rules)?;
        // The sandbox scheme asks the container runtime (FELIX_CRIENDPOINT) at run time.
        let resolver: Box<dyn InterfaceResolver> = if wiring_pending {
            Box::new(crate::iface_naming::WiringPending)
        } else {
            iface_naming::runtime_resolver(&args.rules, &iface_naming::cri_config(&args.agent))?
        };
        Ok(Settings {
            node,
            timers,
            rules,
            resolver,
            families: node_families(&args.dataplane),
            ipvs_view,
        })
    }

    /// What the traffic readers are started with: the rules' own deny-log and flow-log
    /// settings (what the renderer emits NFLOG rules from), the counters for `backend`.
    fn traffic(
        &self,
        opts: &AgentOptions,
        backend: Backend,
        flow_file: Option<flow_log::FileSettings>,
    ) -> TrafficConfig {
        TrafficConfig {
            deny_log: self.rules.deny_log.as_ref().map(|d| DenyLogSettings {
                node: self.node.clone(),
                group: d.group(),
                snap_len: d.snap_len(),
                dedup_window: opts.deny_log_dedup_window,
            }),
            flow_log: self
                .rules
                .flow_log
                .as_ref()
                .map(|f| flow_log::FlowLogSettings {
                    node: self.node.clone(),
                    group: f.group(),
                    snap_len: f.snap_len(),
                    flush_interval: opts.flow_logs_flush_interval,
                    file: flow_file,
                }),
            counters: Some(CounterSettings {
                xtables: match backend {
                    Backend::Legacy => Xtables::Legacy,
                    Backend::Nft => Xtables::Nft,
                },
                families: self.families.clone(),
                interval: opts.policy_counters_interval,
            }),
            policy_counters: opts.policy_counters_enabled,
            conntrack: opts.conntrack_reevaluate.then(|| CutterSettings {
                node: self.node.clone(),
                rules: self.rules.clone(),
                interval: opts.conntrack_reevaluate_interval,
            }),
        }
    }
}

/// The dataplane's timers, from their options.
fn timers(opts: &AgentOptions) -> Timers {
    Timers {
        refresh: AgentOptions::timer(opts.iptables_refresh_interval),
        ipsets_refresh: AgentOptions::timer(opts.ipsets_refresh_interval),
        post_write_check: opts.iptables_post_write_check_interval_secs,
        kernel_check: AgentOptions::timer(opts.kernel_check_interval),
        kernel_verify: AgentOptions::timer(opts.kernel_verify_interval),
    }
}

/// Set (with the reason) by whatever finds that the node changed what the agent was
/// configured from (auto's wiring seen at last, kube-ipvs0 under auto); the loops then stop
/// and `run` starts the agent again in place, rules kept meanwhile.
pub type Restart = Arc<Mutex<Option<String>>>;

/// Wakes the calculation loop when SIGTERM or SIGINT sets the stop flag: it sleeps until an
/// input at rest (`driver::QUIET_TURN`), so a signal must come as one to end it at once. The
/// flag's own handlers, installed before, still set it for a signal that comes first.
fn wake_on_signals(
    stop: &Arc<AtomicBool>,
    tx: Sender<Input>,
) -> anyhow::Result<signal_hook::iterator::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .context("installing signal handlers")?;
    let handle = signals.handle();
    let stop = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let _ = tx.send(Input::Stop);
            }
        })
        .context("starting the signal thread")?;
    Ok(handle)
}

/// Asks for a restart in place: records why, then stops the loops.
pub fn request_restart(restart: &Restart, stop: &AtomicBool, why: String) {
    *restart.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    let node = args.agent.node_name()?;
    if args.rules.interface_name_scheme != NamingScheme::Auto {
        args.rules.rule_config()?;
    }
    let timers = timers(&args.agent);
    // Felix first: it holds our health port, and beside it neither agent could keep its rules.
    if let Some(code) = gates::felix(&args.agent)? {
        return Ok(code);
    }
    let opts = &args.agent;
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
    let restart = Restart::default();
    let settings = Settings::resolve(&mut args, node, timers, &health, &restart, &stop)?;
    let opts = &args.agent;
    let ipv6 = settings.families.contains(&IpFamily::V6);
    if !gates::preflight_passes(opts, &settings.rules, ipv6, &health, &stop)? {
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Input>();
    let signals = wake_on_signals(&stop, tx.clone())?;
    let ipvs_auto = args.rules.kube_ipvs_support_enabled == IpvsSupport::Auto;
    ipvs::watch_kube_ipvs(
        &settings.rules,
        ipvs_auto,
        settings.ipvs_view.clone(),
        &tx,
        &stop,
        &restart,
    )?;
    // Resolvers that learn interface names over time (the container runtime, the routing
    // table, the bridge) tell the calculation loop to name local pods again.
    let resolver_tx = Mutex::new(tx.clone());
    settings.resolver.start(
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
            start_startup_taint(opts, &settings.node, &health, &stop)?;
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
    let backend = detect(&args.dataplane, &exec);
    // What the renderer emits NFLOG rules from, not the flags again.
    let nflog_rules = settings.rules.deny_log.is_some() || settings.rules.flow_log.is_some();
    match older_reader_caveat(backend, nflog_rules) {
        Some(c) if c.warn => warn!("{}", c.text),
        Some(c) => info!("{}", c.text),
        None => {}
    }
    let traffic = Traffic::start(settings.traffic(opts, backend, flow_file), stop.clone())?;
    if let Some(flows) = traffic.flows() {
        let _ = flows_slot.set(flows);
    }
    let Settings {
        node,
        timers,
        rules,
        resolver,
        families,
        ..
    } = settings;
    let graph = Calculation::new(
        GraphConfig {
            node_name: node.clone(),
            families: families.clone(),
            rules: rules.clone(),
        },
        resolver,
    );
    let dataplane_cfg = DataplaneConfig {
        families,
        rules,
        backend,
        ownership: agent::OWNERSHIP,
        interest: agent::ours(),
        max_set_size: args.rules.max_ipset_size,
        exec,
    };
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
    signals.close();
    if let Some(why) = restart.lock().unwrap_or_else(|p| p.into_inner()).take() {
        info!("restarting in place: {why}; the rules stay in place meanwhile");
        return Ok(restart_in_place());
    }
    info!("stopping; the rules stay in place");
    Ok(ExitCode::SUCCESS)
}

/// The JSON-lines target of flow logs, when on; on without flow logs is a configuration error
/// (records to write would never come).
pub fn flow_log_file(
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

pub fn detect(dataplane: &DataplaneOptions, exec: &Exec) -> Backend {
    let backend = detect_backend(exec, dataplane.backend_mode());
    info!(?backend, "iptables backend");
    backend
}

/// The families to program: FELIX_IPV6SUPPORT's, without IPv6 on a node whose kernel has
/// none (booted with `ipv6.disable=1`: no `/proc/sys/net/ipv6`), where no pod can have an
/// IPv6 address and ip6tables has nothing to work on. IPv6 support on (the default) thus
/// follows the node.
pub fn node_families(dataplane: &DataplaneOptions) -> Vec<IpFamily> {
    let mut families = dataplane.families();
    if families.contains(&IpFamily::V6) && !std::path::Path::new("/proc/sys/net/ipv6").exists() {
        info!("this node's kernel has no IPv6 (no /proc/sys/net/ipv6), so no pod here can have an IPv6 address; programming IPv4 only");
        families.retain(|f| *f == IpFamily::V4);
    }
    families
}

/// The metrics server, on TLS when its files are set (never plain text then).
pub fn serve_metrics(opts: &AgentOptions) -> anyhow::Result<std::net::SocketAddr> {
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

/// The Kubernetes datastore: kube-rs watchers on their own thread (in-cluster config, else
/// KUBECONFIG). A configuration that cannot be built ends the agent before anything is
/// programmed; API errors later are retried inside the source.
pub fn start_kubernetes_source(tx: Sender<Input>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    crate::datastore::kube::spawn(crate::datastore::kube::KubeConnect::Infer, tx, stop)?;
    Ok(())
}

/// The startup taint's remover (`datastore::kube::startup_taint`), when FELIX_STARTUPTAINT
/// names one: it waits for this agent's readiness, so the taint goes only once the rules are
/// applied.
pub fn start_startup_taint(
    opts: &AgentOptions,
    node: &str,
    health: &Arc<Health>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    if opts.startup_taint.is_empty() {
        return Ok(());
    }
    let health = health.clone();
    crate::datastore::kube::startup_taint::spawn(
        crate::datastore::kube::KubeConnect::Infer,
        node.to_string(),
        opts.startup_taint.clone(),
        move || health.readiness().0,
        |pending| {
            crate::telemetry::metrics::global()
                .startup_taint_pending
                .set(i64::from(pending))
        },
        stop.clone(),
    )?;
    Ok(())
}

/// Starts this program again in this process (`exec`), with the same arguments and
/// environment: what the agent was configured from changed on the node. Returns only when the
/// exec failed, with status 1 so that the DaemonSet restarts the container instead.
pub fn restart_in_place() -> ExitCode {
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

pub fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
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
