//! netpol-e2e: the end-to-end suite in network namespaces. Nodes and pods are namespaces
//! wired like an L3 CNI, the real netpol-agent enforces inside each node, and real packets
//! decide every cell of the upstream truth tables.

mod chaos;
mod cluster;
mod cluster_policy;
mod cni;
mod cri_server;
mod demo;
mod deny_check;
mod expect;
mod explain_check;
mod family;
mod flow_check;
mod kube_run;
mod netns;
mod probe;
mod runner;
mod runtime;
mod scenario;
mod sctp;
mod servers;
mod services;
mod spoof;
mod staged_check;
mod tags;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use cluster::{Backend, ClusterConfig};
use cni::Cni;
use family::FamilyMode;
use runner::RunConfig;
use services::ServiceProxy;

#[derive(Parser)]
#[command(
    name = "netpol-e2e",
    about = "NetworkPolicy end-to-end scenarios in network namespaces, with real packets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a simulated cluster per scenario, run the agent in every node, probe every
    /// pair after each step; ends with `N passed, M failed`.
    Run(RunArgs),
    /// The example cluster in namespaces: reachability before and after the example
    /// policies, then everything removed.
    Demo(DemoArgs),
    /// Kill the agent at random moments (inside its restores too), make its tools fail and
    /// hang, hold the xtables lock, remove its directory; count violations, convergence
    /// times and leaks.
    Chaos(chaos::ChaosArgs),
    /// Parse and validate scenarios without running them.
    Check {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Run on the real cluster of this kubeconfig instead of simulated nodes: its own
    /// namespaces (always deleted), agnhost pods, probes by exec inside the pods
    /// (docs/operations/connectivity-test.md). The options about simulated nodes do not apply.
    #[arg(long, conflicts_with_all = [
        "cni", "agent", "iptables_backend", "ip_family", "service_proxy", "probe_workers",
        "check_deny_logs", "check_staged",
        "check_spoofing", "auto_wiring", "workload_source_spoofing", "policy_union_min",
    ])]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the image of the scenario pods (agnhost, or one with its
    /// `/agnhost` serve-hostname, porter, pause and connect).
    #[arg(long, default_value = kube_run::DEFAULT_IMAGE, requires = "kubeconfig")]
    image: String,
    /// With --kubeconfig: `text` (the matrices as the run goes, then a summary) or `json`
    /// (one document on stdout at the end; progress on stderr).
    #[arg(long, default_value = "text", value_parser = ["text", "json"], requires = "kubeconfig")]
    output: String,
    /// With --kubeconfig: how long a pod may take to start, image pull included, in seconds.
    #[arg(long, default_value_t = 180, requires = "kubeconfig")]
    pod_timeout_secs: u64,
    /// Which CNI the nodes simulate (how pod interfaces are named and wired).
    #[arg(long, value_enum, default_value = "calico")]
    cni: Cni,
    /// Simulated: scenarios run at the same time (default 2). With --kubeconfig: probes in
    /// flight at once (default 16).
    #[arg(long)]
    jobs: Option<usize>,
    /// The netpol-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// iptables backend of the simulated nodes (kube-proxy's DNAT, and what the agent's
    /// auto-detection should find).
    #[arg(long, value_enum, default_value = "nft")]
    iptables_backend: Backend,
    /// IP families of pods, ClusterIPs and the node underlay; scenario addresses are mapped
    /// into the IPv6 pod space for ipv6 and dual, and dual probes every pair over both.
    #[arg(long, value_enum, default_value = "ipv4")]
    ip_family: FamilyMode,
    /// How the simulated kube-proxy DNATs ClusterIPs: iptables rules, an nft table of its
    /// own (kube-proxy's nftables mode), or IPVS (kube-proxy's IPVS mode: needs a kernel with
    /// IPVS, e.g. in scripts/vm.sh; see scripts/ipvs-e2e.sh).
    #[arg(long, value_enum, default_value = "iptables")]
    service_proxy: ServiceProxy,
    /// Timeout of one probe, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    probe_timeout_ms: u64,
    /// Probes in flight per scenario.
    #[arg(long, default_value_t = 32)]
    probe_workers: usize,
    /// How long a node may take to hold what `compile` renders after a step (with
    /// --kubeconfig: how long a step may take to be enforced), in seconds.
    #[arg(long, default_value_t = 20)]
    converge_timeout_secs: u64,
    /// Print every step's truth tables, not only failing ones.
    #[arg(long, short)]
    verbose: bool,
    /// Turn deny logging on in every node and check it: each probe the expectation denies
    /// must be logged exactly once, by the node that dropped it, naming both pods, the
    /// direction and the policies isolating the pod there; no allowed probe may be.
    #[arg(long)]
    check_deny_logs: bool,
    /// Also hold `netpol-agent explain`'s verdict for every probe (computed from the step's
    /// objects) against the expectation and the packets; a disagreement fails the step. With
    /// --kubeconfig: the agent's own `explain --kernel`, run in its pod on each node a probe
    /// has an end on, must give the expected verdict and find that node's kernel agreeing.
    #[arg(long)]
    check_explain: bool,
    /// With --kubeconfig and --check-explain: the label selector of the agent's pods.
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=netpol-agent",
        requires = "kubeconfig"
    )]
    agent_selector: String,
    /// Turn flow logs on in every node and check them after each step: every probe must be
    /// in the flow records (`GET /flows`) of the node(s) whose policy decided it (egress at
    /// the source's node, ingress at the destination's when egress let it through), with
    /// the action, both pods, port, protocol and the policies `explain` names; no record of
    /// the step may claim a flow that was not sent. With --kubeconfig: the installed agents'
    /// records (they must run with FELIX_FLOWLOGSENABLED=true), read in their pods, against
    /// their own explain's answers (implies --check-explain).
    #[arg(long)]
    check_flow_logs: bool,
    /// Stage every policy change first (implies flow logs on, as --check-flow-logs): for a
    /// step that changes only NetworkPolicies or ClusterNetworkPolicies, the same change as
    /// StagedNetworkPolicy/StagedClusterNetworkPolicy objects (Set/Delete) must leave every
    /// probe as it was and make the flow records' pending verdicts the step's expectation;
    /// then the staged objects are removed and the real change is checked as usual.
    #[arg(long)]
    check_staged: bool,
    /// After each step every pod also sends packets with the source address of a pod the
    /// destination allows, to every other pod, per probed protocol and family; none may
    /// arrive (and the same packets with the sender's own address, where allowed, must).
    #[arg(long)]
    check_spoofing: bool,
    /// Run the agents with no CNI setting (FELIX_INTERFACENAMESCHEME=auto, no prefix, bridge
    /// or runtime endpoint), as the shipped DaemonSet does: they must find how the nodes wire
    /// pods themselves.
    #[arg(long)]
    auto_wiring: bool,
    /// The agents' FELIX_WORKLOADSOURCESPOOFING: `Disabled` (their default, the source
    /// check on) or `Any` (off: shows what --check-spoofing catches without it).
    #[arg(long, default_value = "Disabled", value_parser = ["Disabled", "Any"])]
    workload_source_spoofing: String,
    /// The agents' (and compile's) FELIX_POLICYUNIONMIN: 1 gives every isolated pod its
    /// union set, so every scenario runs through it; unset keeps the agents' default.
    #[arg(long)]
    policy_union_min: Option<usize>,
    /// Scenario files or directories.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

#[derive(Args)]
struct DemoArgs {
    /// Namespaces and pods of the example cluster.
    #[arg(long, default_value = "examples/demo/cluster.yaml")]
    cluster: PathBuf,
    /// The NetworkPolicies to apply.
    #[arg(long, default_value = "examples/demo/policies.yaml")]
    policies: PathBuf,
    /// The netpol-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "nft")]
    iptables_backend: Backend,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { paths } => match load_all(&paths) {
            Ok(scenarios) => {
                println!("{} scenarios valid", scenarios.len());
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Run(args) => run(args),
        Command::Demo(args) => demo(args),
        Command::Chaos(args) => {
            let stop = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                let _ = signal_hook::flag::register(signal, stop.clone());
            }
            chaos::main(args, default_agent(), stop)
        }
    }
}

/// Loads every scenario; on any invalid file prints all problems and fails.
fn load_all(paths: &[PathBuf]) -> Result<Vec<scenario::Scenario>, ExitCode> {
    let files = scenario::scenario_files(paths).map_err(|e| {
        eprintln!("netpol-e2e: {e:#}");
        ExitCode::from(2)
    })?;
    let mut names = std::collections::BTreeMap::new();
    let mut scenarios = Vec::new();
    let mut bad = 0;
    for file in &files {
        match scenario::load(file) {
            Ok(s) => {
                if let Some(other) = names.insert(s.name.clone(), file.clone()) {
                    println!(
                        "{}: name {:?} is also used by {}",
                        file.display(),
                        s.name,
                        other.display()
                    );
                    bad += 1;
                }
                scenarios.push(s);
            }
            Err(e) => {
                println!("{}: {e:#}", file.display());
                bad += 1;
            }
        }
    }
    if files.is_empty() {
        eprintln!("netpol-e2e: no scenario files found");
        return Err(ExitCode::from(2));
    }
    if bad > 0 {
        println!("{} scenarios, {bad} invalid", files.len());
        return Err(ExitCode::from(2));
    }
    Ok(scenarios)
}

fn default_agent() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("netpol-agent")))
        .unwrap_or_else(|| PathBuf::from("netpol-agent"))
}

fn run(args: RunArgs) -> ExitCode {
    let scenarios = match load_all(&args.paths) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(kubeconfig) = args.kubeconfig {
        // Ctrl-C ends the run at the next await; everything made is deleted before exit.
        let stop = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            if let Err(e) = signal_hook::flag::register(signal, stop.clone()) {
                eprintln!("netpol-e2e: installing signal handlers: {e}");
                return ExitCode::from(2);
            }
        }
        let cfg = kube_run::Config {
            kubeconfig,
            image: args.image,
            jobs: args.jobs.unwrap_or(16).max(1),
            probe_timeout: Duration::from_millis(args.probe_timeout_ms),
            converge_timeout: Duration::from_secs(args.converge_timeout_secs),
            pod_timeout: Duration::from_secs(args.pod_timeout_secs),
            json: args.output == "json",
            verbose: args.verbose,
            check_explain: args.check_explain || args.check_flow_logs,
            check_flow_logs: args.check_flow_logs,
            agent_selector: args.agent_selector,
        };
        return kube_run::main(cfg, scenarios, stop);
    }
    let jobs = args.jobs.unwrap_or(2);
    if !nix::unistd::geteuid().is_root() {
        eprintln!("netpol-e2e: run needs root (it creates network namespaces)");
        return ExitCode::from(2);
    }
    let agent = args.agent.unwrap_or_else(default_agent);
    if !Path::new(&agent).exists() {
        eprintln!(
            "netpol-e2e: agent binary {} not found (build it, or pass --agent)",
            agent.display()
        );
        return ExitCode::from(2);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(signal, stop.clone()) {
            eprintln!("netpol-e2e: installing signal handlers: {e}");
            return ExitCode::from(2);
        }
    }
    let cfg = RunConfig {
        cluster: ClusterConfig {
            agent,
            cni: args.cni,
            backend: args.iptables_backend,
            converge_timeout: Duration::from_secs(args.converge_timeout_secs),
            deny_logs: args.check_deny_logs,
            flow_logs: args.check_flow_logs || args.check_staged,
            family: args.ip_family,
            proxy: args.service_proxy,
            spoof_observers: args.check_spoofing,
            source_check: args.workload_source_spoofing == "Disabled",
            auto_wiring: args.auto_wiring,
            policy_union_min: args.policy_union_min,
        },
        jobs,
        probe_workers: args.probe_workers,
        probe_timeout: Duration::from_millis(args.probe_timeout_ms),
        retry_wait: Duration::from_secs(1),
        verbose: args.verbose,
        check_deny_logs: args.check_deny_logs,
        check_flow_logs: args.check_flow_logs,
        check_explain: args.check_explain,
        check_spoofing: args.check_spoofing,
        check_staged: args.check_staged,
    };
    let total = scenarios.len();
    let checks: Vec<&str> = [
        (cfg.check_explain, "every probe checked against explain"),
        (args.check_deny_logs, "checking deny logs"),
        (args.check_flow_logs, "checking flow logs"),
        (args.check_spoofing, "checking spoofed sources"),
        (args.check_staged, "staging every policy change first"),
        (args.auto_wiring, "agents detect the CNI's wiring (auto)"),
        (
            args.policy_union_min == Some(1),
            "every isolated pod matches a union set",
        ),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    println!(
        "running {total} scenarios, cni {}, ip family {}, service proxy {}, {} at a time{}",
        args.cni.name(),
        args.ip_family.name(),
        args.service_proxy.name(),
        cfg.jobs,
        if checks.is_empty() {
            String::new()
        } else {
            format!(", {}", checks.join(", "))
        }
    );
    let start = Instant::now();
    let outcomes = runner::run_all(scenarios, &cfg, &stop);
    let passed = outcomes.iter().filter(|o| o.passed).count();
    let failed = outcomes.len() - passed;
    let interrupted = stop.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        println!("failed:");
        for o in outcomes.iter().filter(|o| !o.passed) {
            println!("  {}", o.name);
        }
    }
    if interrupted {
        println!(
            "interrupted: {} of {total} scenarios not run",
            total - outcomes.len()
        );
    }
    if args.check_staged {
        println!(
            "staged first: {} steps ({} steps changing policies with pods or namespaces, or first, not staged)",
            outcomes.iter().map(|o| o.staged_steps).sum::<usize>(),
            outcomes.iter().map(|o| o.not_staged).sum::<usize>()
        );
    }
    println!("wall time: {:.1} s", start.elapsed().as_secs_f64());
    println!("{passed} passed, {failed} failed");
    if failed > 0 || interrupted {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn demo(args: DemoArgs) -> ExitCode {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("netpol-e2e: demo needs root (it creates network namespaces)");
        return ExitCode::from(2);
    }
    // Ctrl-C must still tear down: the flag makes the signal a no-op and the demo ends on
    // its own within seconds, dropping the cluster.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, stop.clone());
    }
    let cfg = demo::DemoConfig {
        cluster: ClusterConfig {
            agent: args.agent.unwrap_or_else(default_agent),
            cni: Cni::Calico,
            backend: args.iptables_backend,
            converge_timeout: Duration::from_secs(20),
            deny_logs: false,
            flow_logs: false,
            spoof_observers: false,
            source_check: true,
            auto_wiring: false,
            policy_union_min: None,
            family: FamilyMode::Ipv4,
            proxy: ServiceProxy::Iptables,
        },
        manifests: args.cluster,
        policies: args.policies,
    };
    match demo::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netpol-e2e demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
