//! The gates `run` passes before it programs anything: Calico's felix on the node, the
//! preflight checks, and `FELIX_INTERFACENAMESCHEME=auto`'s wait for the node's first pod
//! interface. A gate that holds the agent keeps it up (readiness 503 with the reason) and
//! looks at the node again on a period, all three through [`sleep_unless_stopped`], so
//! SIGTERM ends any of them within 100 ms.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::{error, info, warn};

use super::{request_restart, restart_in_place, serve_metrics, Restart};
use crate::config::{AgentOptions, Datastore};
use crate::host::exec::Exec;
use crate::host::felix;
use crate::host::preflight::{self, PreflightConfig};
use crate::host::wiring as host_wiring;
use crate::rules::RuleConfig;
use crate::telemetry::health::Health;
use crate::telemetry::http;

/// Sleeps `period` in steps of 100 ms; `false` as soon as `stop` is set.
pub fn sleep_unless_stopped(stop: &AtomicBool, period: Duration) -> bool {
    const STEP: Duration = Duration::from_millis(100);
    let wake = Instant::now() + period;
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = wake.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(STEP));
    }
}

/// How often a refused agent (health server on) looks at the node again.
pub const PREFLIGHT_RECHECK: Duration = Duration::from_secs(10);

/// How often a refused agent repeats the full report in its log.
pub const PREFLIGHT_RELOG: Duration = Duration::from_secs(300);

/// The felix gate: `None` when `run` may go on (no felix on the node, or the operator
/// overrides); else the exit status `run` ends with: refused at once without a health
/// server, or after idling beside felix ([`idle_beside_felix`]).
pub fn felix(opts: &AgentOptions) -> anyhow::Result<Option<ExitCode>> {
    let felix = felix::detect(&felix::snapshot(&Exec::default()));
    if felix.is_empty() {
        return Ok(None);
    }
    let report = felix::report(&felix);
    if opts.preflight_override {
        warn!(
            "FELIX_PREFLIGHTOVERRIDE (--preflight-override) is set, so running although: {report}"
        );
        return Ok(None);
    }
    error!("{report}");
    if !opts.health_enabled {
        eprintln!("netpol-agent: {report}");
        return Ok(Some(ExitCode::from(super::EXIT_REFUSED)));
    }
    idle_beside_felix(opts, report).map(Some)
}

/// Calico's felix on this node, or its state, with the health server on (a DaemonSet): the
/// agent stays up idle instead of crash-looping (issue 37), programs nothing, looks again
/// every 10 s and restarts itself in place once felix and its state are gone. Its readiness
/// says why (503 with the report) when it can serve its health port; while felix runs, felix
/// holds that port (127.0.0.1:9099 is its default too) and kubelet's probes of this pod reach
/// felix's health, so the pod is as ready as the node's enforcement (felix's) is, and the
/// rollout completes. `netpol_felix_present` is 1 throughout, when the metrics port is free.
pub fn idle_beside_felix(opts: &AgentOptions, report: String) -> anyhow::Result<ExitCode> {
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
    crate::telemetry::metrics::global().felix_present.set(1);
    let mut logged = Instant::now();
    loop {
        if !sleep_unless_stopped(&stop, RECHECK) {
            info!("stopping; idle beside felix, nothing was programmed");
            return Ok(ExitCode::SUCCESS);
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

/// The preflight checks (see `preflight`): `Ok(true)` when the node's dataplane lets
/// iptables see pod traffic, or the operator overrides the findings. Otherwise the refusal is
/// logged and, without a health server, `run` ends at once with status 3. With one, the agent
/// stays up: `/readiness` answers 503 with the findings, `/liveness` 200 (a restart would find
/// the same node), and the node is looked at again every 10 s, so fixing it (say
/// `net.bridge.bridge-nf-call-iptables=1`) starts the agent without a restart; SIGTERM then
/// ends it with status 3. Nothing is programmed while refusing.
pub fn preflight_passes(
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
        if !sleep_unless_stopped(stop, PREFLIGHT_RECHECK) {
            info!("stopping; refused to run, nothing was programmed");
            return Ok(false);
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

/// The readiness note while `FELIX_INTERFACENAMESCHEME=auto` waits for the node's wiring.
pub const WIRING_PENDING: &str = "FELIX_INTERFACENAMESCHEME=auto has not seen a pod interface on this node yet (no pod is wired here); pods a policy isolates are dropped by address, and addresses of the node's pod ranges that are no known pod are dropped, until the agent sees how pods are wired and restarts itself with that scheme";

/// While auto's wiring is pending: this node's pod ranges (the Node's `spec.podCIDRs`, from
/// the API or a `Node` manifest in the directory datastore), which the pending guard closes
/// to every address that is no known pod (`rules::guard`). Empty, logged with the reason and
/// counted by `netpol_wiring_pending_unguarded`, when the node has none or they cannot be read:
/// then a pod wired here on an interface without one of `prefixes` (which the pending chains
/// cover by name) answers until its address reaches the agent.
pub fn pending_pod_ranges(
    datastore: &Datastore,
    node: &str,
    prefixes: &[String],
) -> Vec<ipnet::IpNet> {
    let got = match datastore {
        Datastore::Kubernetes => crate::datastore::kube::node_ranges::read(
            crate::datastore::kube::KubeConnect::Infer,
            node,
        ),
        Datastore::Dir(dir) => crate::datastore::dir::node_pod_ranges(dir, node),
    };
    let unguarded = match got {
        Ok(ranges) => {
            let shown: Vec<String> = ranges.iter().map(ToString::to_string).collect();
            info!(
                ranges = shown.join(","),
                prefixes = prefixes.join(","),
                "FELIX_INTERFACENAMESCHEME=auto: until this node shows how it wires pods, traffic to and from addresses that are no known pod, in its pod ranges or on interfaces with a configured prefix, is dropped"
            );
            Some(ranges)
        }
        Err(why) => {
            warn!(
                "FELIX_INTERFACENAMESCHEME=auto: this node's pod ranges are not known ({why}); until the node shows how it wires pods, a pod wired here on an interface without a configured prefix (FELIX_INTERFACEPREFIX={}) is reachable until its address reaches the agent; set FELIX_INTERFACENAMESCHEME for this node's CNI to close that window (docs/install.md: Choosing the configuration for your CNI)", prefixes.join(",")
            );
            None
        }
    };
    crate::telemetry::metrics::global()
        .wiring_pending_unguarded
        .set(i64::from(unguarded.is_none()));
    unguarded.unwrap_or_default()
}

/// How often auto looks for the node's first pod interface.
pub const WIRING_RECHECK: Duration = Duration::from_secs(1);

/// `FELIX_INTERFACENAMESCHEME=auto`: how this node wires its pods, logged with the settings
/// chosen; `None` while no pod interface shows it (or the node could not be read).
pub fn read_wiring() -> Option<host_wiring::Wiring> {
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

/// Watches, on its own thread, for the node's first pod interface while auto's wiring is
/// pending; when it shows, asks for a restart in place (which detects it again at start).
pub fn watch_wiring(restart: Restart, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("wiring-watch".into())
        .spawn(move || {
            while sleep_unless_stopped(&stop, WIRING_RECHECK) {
                if let Ok(Some(_)) = host_wiring::read().map(|w| w.detect()) {
                    request_restart(
                        &restart,
                        &stop,
                        "FELIX_INTERFACENAMESCHEME=auto: the node shows how it wires pods now"
                            .into(),
                    );
                    return;
                }
            }
        })
        .context("starting the wiring watch")?;
    Ok(())
}
