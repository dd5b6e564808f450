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
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing::{info, warn};

use netpol_agent::config::{explain_invalid_value, ConfigError, LogFormat, LogOptions};
use netpol_agent::inspect;
use netpol_agent::inspect::args::{AuditArgs, ExplainArgs};
use netpol_agent::inspect::compile::CompileArgs;
use netpol_agent::inspect::staged::StagedArgs;
use netpol_agent::startup::{self, CleanupArgs, RunArgs};
use netpol_agent::traffic::deny_log::TARGET as DENY_LOG_TARGET;

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
            startup::run(*args)
        }
        Command::Cleanup(args) => startup::cleanup(args),
        Command::Compile(args) => inspect::compile::run(*args),
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
