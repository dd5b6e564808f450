//! Command-line and environment configuration. Every option is a flag and an environment
//! variable `FELIX_<KEY>` with felix's meaning (our defaults may differ; the README's table
//! says where); options felix does not have (the interface-naming scheme, the log format, the
//! directory datastore) use the same form.
//!
//! Value forms follow felix's config parser:
//! - booleans: `true`/`false`, and like felix also `1`/`0`, `yes`/`no`, `y`/`n`, `t`/`f`, in
//!   any case; a boolean flag given without a value means `true`;
//! - durations: seconds as a decimal number (`10`, `0.5`);
//! - numbers: decimal, or hex with `0x` (the mark mask);
//! - enumerations: case-insensitive.
//!
//! An invalid value, from a flag or from the environment, stops the program before it does
//! anything, with exit status 2 and a message naming the environment variable, the flag and
//! the accepted values (`explain_invalid_value`: clap's own message for a bad environment
//! value names only the flag).

mod env;
pub mod felix_params;
mod values;

pub use env::*;
pub use values::*;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::builder::PossibleValue;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, ValueEnum};

use crate::model::IpFamily;
use crate::rules::deny_log::{DenyLogConfig, Rate, RateUnit, DEFAULT_SNAP_LEN};
use crate::rules::flow_log::FlowLogConfig;
use crate::rules::iface::parse_prefix_list;
use crate::rules::ipvs::IpvsConfig;
use crate::rules::{
    AllowAction, ChainInsertMode, DenyAction, EndpointToHostAction, MarkBits, RuleConfig,
};

/// A configuration problem found after parsing (the program exits with status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

// ---------------------------------------------------------------- enumerations

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NamingScheme {
    /// `<first prefix> + sha1("<namespace>.<pod>")[:11]`, as Calico's CNI names veths.
    Calico,
    /// `<first prefix> + the start of the pod's sandbox container ID` (run: from the container
    /// runtime at FELIX_CRIENDPOINT; compile: from the `netpol-agent.io/sandbox-id` annotation).
    Sandbox,
    /// A YAML map `"namespace/pod": interface` (FELIX_INTERFACEMAPFILE).
    Static,
    /// The output interface of the host route (/32, /128) to the pod's IP, in any routing
    /// table, read from this node over netlink while the agent runs (not with compile).
    Routes,
    /// The port of FELIX_BRIDGEINTERFACE that holds the pod's address, learned from the
    /// bridge's neighbour table and forwarding database (veths with random names).
    Bridge,
    /// `run` only: at start, read how this node wires its pods (`host::wiring`): veths that
    /// are ports of a Linux bridge mean bridge mode with that bridge (the `bridge` scheme),
    /// routed veths with host routes the `routes` scheme; the prefixes are what their names
    /// share. Overrides FELIX_INTERFACEPREFIX and FELIX_BRIDGEINTERFACE.
    Auto,
}

/// The rule settings' own enumerations take their felix spellings here, so a flag holds the
/// type the renderer reads (no mirror type to keep in step); `rules` stays free of clap.
macro_rules! felix_value_enum {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$(<$ty>::$variant),+]
            }
            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(match self {
                    $(<$ty>::$variant => $name),+
                }))
            }
        }
    };
}

felix_value_enum!(EndpointToHostAction { Accept => "ACCEPT", Drop => "DROP", Return => "RETURN" });
felix_value_enum!(AllowAction { Accept => "ACCEPT", Return => "RETURN" });
felix_value_enum!(DenyAction { Drop => "DROP", Reject => "REJECT" });
felix_value_enum!(ChainInsertMode { Insert => "insert", Append => "append" });

/// felix's `IptablesBackend`: a fixed backend, or detection at start-up
/// (`dataplane::iptables::detect_backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendMode {
    Legacy,
    Nft,
    Auto,
}

/// felix's log severities (LogSeverityScreen). Fatal and Panic log errors only, like Error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogSeverity {
    Trace,
    Debug,
    Info,
    Warning,
    Error,
    Fatal,
    Panic,
}

impl LogSeverity {
    /// The `tracing` level filter.
    pub fn filter(self) -> &'static str {
        match self {
            LogSeverity::Trace => "trace",
            LogSeverity::Debug => "debug",
            LogSeverity::Info => "info",
            LogSeverity::Warning => "warn",
            LogSeverity::Error | LogSeverity::Fatal | LogSeverity::Panic => "error",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

// ---------------------------------------------------------------- option groups

/// Logging, for every subcommand.
#[derive(Args, Clone, Debug)]
pub struct LogOptions {
    /// Log level: Trace, Debug, Info, Warning, Error, Fatal, Panic (felix's names; Fatal and
    /// Panic log errors only).
    #[arg(
        long,
        global = true,
        env = "FELIX_LOGSEVERITYSCREEN",
        value_enum,
        ignore_case = true,
        default_value = "Info",
        hide_possible_values = true
    )]
    pub log_severity_screen: LogSeverity,
    /// Log format: text (human-readable) or json (one object per line).
    #[arg(
        long,
        global = true,
        env = "FELIX_LOGFORMAT",
        value_enum,
        ignore_case = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// Which iptables and which IP families (run and cleanup).
#[derive(Args, Clone, Debug)]
pub struct DataplaneOptions {
    /// iptables backend: legacy, nft, or auto (kubelet's hint chains decide, else the
    /// backend holding more rules).
    #[arg(
        long,
        env = "FELIX_IPTABLESBACKEND",
        value_enum,
        ignore_case = true,
        default_value = "auto"
    )]
    pub iptables_backend: BackendMode,
    /// Program IPv6 (ip6tables, inet6 sets) as well as IPv4.
    #[arg(long, env = "FELIX_IPV6SUPPORT", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub ipv6_support: bool,
}

impl DataplaneOptions {
    pub fn families(&self) -> Vec<IpFamily> {
        if self.ipv6_support {
            vec![IpFamily::V4, IpFamily::V6]
        } else {
            vec![IpFamily::V4]
        }
    }

    pub fn backend_mode(&self) -> BackendMode {
        self.iptables_backend
    }
}

/// The agent's own options (run).
#[derive(Args, Clone, Debug)]
pub struct AgentOptions {
    /// Where objects come from: kubernetes (the API server, in-cluster or kubeconfig), or
    /// dir:PATH (a watched directory of manifests).
    #[arg(long, env = "FELIX_DATASTORETYPE", default_value = "kubernetes", value_parser = parse_datastore)]
    pub datastore: Datastore,
    /// This node's name (pods with this spec.nodeName are local). Falls back to
    /// FELIX_FELIXHOSTNAME, then the hostname. In the DaemonSet, NODENAME comes from
    /// spec.nodeName.
    #[arg(long, env = "NODENAME")]
    pub node: Option<String>,
    /// felix's node name, used when neither --node nor NODENAME is set.
    #[arg(long, env = "FELIX_FELIXHOSTNAME")]
    pub felix_hostname: Option<String>,
    /// Seconds between full re-reads of iptables, the safety net behind the change checks;
    /// while the checks watch it, stretched while a re-read is dear so it costs at most
    /// 0.05 % of a core, at most 3600 s apart (0: never).
    #[arg(long, env = "FELIX_IPTABLESREFRESHINTERVAL", default_value = "300", value_parser = parse_interval)]
    pub iptables_refresh_interval: Duration,
    /// Seconds after a write before iptables is read back once to verify it (≥ 0.05).
    #[arg(long, env = "FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS", default_value = "1", value_parser = parse_post_write_check)]
    pub iptables_post_write_check_interval_secs: Duration,
    /// Seconds between full re-reads of our IP sets, the safety net behind the change checks;
    /// while the checks watch it, stretched while a re-read is dear so it costs at most
    /// 0.05 % of a core, at most 3600 s apart (0: never).
    #[arg(long, env = "FELIX_IPSETSREFRESHINTERVAL", default_value = "300", value_parser = parse_interval)]
    pub ipsets_refresh_interval: Duration,
    /// Seconds between cheap checks whether the kernel's rules or sets of ours changed (no
    /// process: one getsockopt per family for legacy iptables, the nf_tables change events,
    /// one ipset header dump); a change is read and repaired at once (0: off).
    #[arg(long, env = "FELIX_KERNELCHECKINTERVAL", default_value = "1", value_parser = parse_interval)]
    pub kernel_check_interval: Duration,
    /// Seconds between exact checks (digests of our chains and sets' members; the nf_tables
    /// generation) that catch what the cheap check cannot, such as a rule replaced by one of
    /// the same size; stretched while a check is dear so they cost at most 0.05 % of a core,
    /// at most 600 s apart (0: off).
    #[arg(long, env = "FELIX_KERNELVERIFYINTERVAL", default_value = "120", value_parser = parse_interval)]
    pub kernel_verify_interval: Duration,
    /// Seconds a local pod with an address may be without an existing host interface before
    /// it is reported (one warning per pod naming the interfaces that carry its address,
    /// netpol_local_pods_without_interface; not ready when no local pod has one).
    #[arg(long, env = "FELIX_INTERFACEGRACEPERIOD", default_value = "30", value_parser = parse_timeout)]
    pub interface_grace_period: Duration,
    /// Seconds an agent loop may go without turning before /liveness fails.
    #[arg(long, env = "FELIX_DATAPLANEWATCHDOGTIMEOUT", default_value = "90", value_parser = parse_timeout)]
    pub dataplane_watchdog_timeout: Duration,
    /// Serve Prometheus metrics on /metrics.
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub prometheus_metrics_enabled: bool,
    /// Address the metrics server binds (empty: every address, IPv6 and IPv4; IPv4 alone on a
    /// node without IPv6).
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSHOST", default_value = "", value_parser = parse_host)]
    pub prometheus_metrics_host: String,
    /// Port of the metrics server.
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSPORT", default_value = "9091", value_parser = parse_port)]
    pub prometheus_metrics_port: u16,
    /// Serve metrics over TLS with this certificate chain (PEM), with
    /// `FELIX_PROMETHEUSMETRICSKEYFILE`; both re-read when they change. Empty: plain HTTP.
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSCERTFILE", default_value = "")]
    pub prometheus_metrics_cert_file: String,
    /// The private key (PEM) of `FELIX_PROMETHEUSMETRICSCERTFILE`.
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSKEYFILE", default_value = "")]
    pub prometheus_metrics_key_file: String,
    /// Require scrapers to present a client certificate signed by one of these CAs (PEM);
    /// TLS only.
    #[arg(long, env = "FELIX_PROMETHEUSMETRICSCAFILE", default_value = "")]
    pub prometheus_metrics_ca_file: String,
    /// Serve /liveness and /readiness.
    #[arg(long, env = "FELIX_HEALTHENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub health_enabled: bool,
    /// Address the health server binds.
    #[arg(long, env = "FELIX_HEALTHHOST", default_value = "localhost", value_parser = parse_host)]
    pub health_host: String,
    /// Port of the health server.
    #[arg(long, env = "FELIX_HEALTHPORT", default_value = "9099", value_parser = parse_port)]
    pub health_port: u16,
    /// Run even when the preflight checks find a dataplane that bypasses host netfilter
    /// (Open vSwitch, ipvlan/macvlan, bridged pod ports); the findings are logged as warnings.
    #[arg(long, env = "FELIX_PREFLIGHTOVERRIDE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub preflight_override: bool,
    /// The container runtime's CRI socket, where the sandbox naming scheme learns each local
    /// pod's sandbox ID (containerd: /run/containerd/containerd.sock; CRI-O:
    /// /var/run/crio/crio.sock; unix://PATH also works).
    #[arg(long, env = "FELIX_CRIENDPOINT", default_value = DEFAULT_CRI_ENDPOINT, value_parser = parse_cri_endpoint)]
    pub cri_endpoint: PathBuf,
    /// Seconds between full listings of the runtime's pod sandboxes: the safety net behind
    /// its event stream, and how changes are learned when it has none (0: never).
    #[arg(long, env = "FELIX_CRIREFRESHINTERVAL", default_value = "10", value_parser = parse_interval)]
    pub cri_refresh_interval: Duration,
    /// Deny logging: seconds one log line stands for its flow (5-tuple); later packets of
    /// the flow within the window are counted, not logged.
    #[arg(long, env = "FELIX_DENYLOGDEDUPWINDOW", default_value = "5", value_parser = parse_timeout)]
    pub deny_log_dedup_window: Duration,
    /// Flow logs: seconds of traffic one flow record aggregates (felix's
    /// FlowLogsFlushInterval, same default).
    #[arg(long, env = "FELIX_FLOWLOGSFLUSHINTERVAL", default_value = "300", value_parser = parse_timeout)]
    pub flow_logs_flush_interval: Duration,
    /// Flow logs: also append every finished record as a JSON line to
    /// FELIX_FLOWLOGSFILEDIRECTORY/flows.log (needs FELIX_FLOWLOGSENABLED).
    #[arg(long, env = "FELIX_FLOWLOGSFILEENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub flow_logs_file_enabled: bool,
    /// Flow logs: the directory of flows.log and its rotated files.
    #[arg(
        long,
        env = "FELIX_FLOWLOGSFILEDIRECTORY",
        default_value = "/var/log/netpol-agent/flowlogs"
    )]
    pub flow_logs_file_directory: PathBuf,
    /// Flow logs: files kept, flows.log included (1 to 1000).
    #[arg(long, env = "FELIX_FLOWLOGSFILEMAXFILES", default_value = "5", value_parser = parse_flow_log_files)]
    pub flow_logs_file_max_files: u32,
    /// Flow logs: MB one file grows to before it is rotated (1 to 10000).
    #[arg(long, env = "FELIX_FLOWLOGSFILEMAXFILESIZEMB", default_value = "100", value_parser = parse_flow_log_file_mb)]
    pub flow_logs_file_max_file_size_mb: u32,
    /// Export per-policy packet and byte counters of the allow rules, read from the kernel's
    /// rule counters on a timer.
    #[arg(long, env = "FELIX_POLICYCOUNTERSENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub policy_counters_enabled: bool,
    /// Seconds between reads of the kernel's rule counters (per-policy counters, and the
    /// denied-packet counters of deny logging).
    #[arg(long, env = "FELIX_POLICYCOUNTERSINTERVAL", default_value = "60", value_parser = parse_timeout)]
    pub policy_counters_interval: Duration,
    /// Cut tracked connections that policy no longer allows: after an update takes something
    /// from a local pod, its conntrack entries are held against the new policy state and the
    /// denied ones deleted.
    #[arg(long, env = "FELIX_CONNTRACKREEVALUATE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub conntrack_reevaluate: bool,
    /// Conntrack re-evaluation: seconds between two re-evaluations at most (changes in
    /// between are coalesced into one).
    #[arg(long, env = "FELIX_CONNTRACKREEVALUATEINTERVAL", default_value = "0.25", value_parser = parse_timeout)]
    pub conntrack_reevaluate_interval: Duration,
    /// The key of a taint this node registers with (e.g. `netpol-agent.io/agent-not-ready`,
    /// kubelet's --register-with-taints), removed from this node once the agent is ready, so
    /// that no pod is scheduled here before its policies are enforced; needs `get` and
    /// `patch` on nodes (deploy/components/startup-taint). Empty: off.
    #[arg(long, env = "FELIX_STARTUPTAINT", default_value = "", value_parser = parse_taint_key)]
    pub startup_taint: String,
}

/// This node's name, the one rule `run`, `explain` and `audit` share: the first of `given`
/// (`--node`/`NODENAME`, then `FELIX_FELIXHOSTNAME`) that is not blank, else the hostname.
pub fn node_name<'a>(given: impl IntoIterator<Item = Option<&'a str>>) -> anyhow::Result<String> {
    if let Some(name) = given
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|n| !n.is_empty())
    {
        return Ok(name.to_string());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("no --node, NODENAME or FELIX_FELIXHOSTNAME, and the hostname is unreadable")?;
    Ok(host.trim().to_string())
}

impl AgentOptions {
    /// `--node`, else NODENAME (both the same option), else FELIX_FELIXHOSTNAME, else the
    /// hostname.
    pub fn node_name(&self) -> anyhow::Result<String> {
        node_name([self.node.as_deref(), self.felix_hostname.as_deref()])
    }

    /// Where the metrics server binds: the configured host, else every address of the
    /// node's families (`::` takes IPv4 too unless `net.ipv6.bindv6only` is set; a node without IPv6 gets `0.0.0.0`). An
    /// IPv6-only node could not be scraped on `0.0.0.0` (issue 37).
    pub fn metrics_host(&self) -> &str {
        match self.prometheus_metrics_host.trim() {
            "" if std::path::Path::new("/proc/net/if_inet6").exists() => "::",
            "" => "0.0.0.0",
            h => h,
        }
    }

    /// A timer value where zero means "never".
    pub fn timer(d: Duration) -> Option<Duration> {
        (!d.is_zero()).then_some(d)
    }
}

/// How pods map to interfaces and how rules are rendered (run and compile).
#[derive(Args, Clone, Debug)]
pub struct RuleOptions {
    /// Host-side interface prefixes of pod veths, comma-separated; the first one names new
    /// interfaces in the calico and sandbox schemes.
    #[arg(long, env = "FELIX_INTERFACEPREFIX", default_value = "cali", value_parser = parse_interface_prefix)]
    pub interface_prefix: String,
    /// How a pod's host interface is named.
    #[arg(
        long,
        env = "FELIX_INTERFACENAMESCHEME",
        value_enum,
        ignore_case = true,
        default_value = "calico"
    )]
    pub interface_name_scheme: NamingScheme,
    /// Pod → interface map for the static scheme (YAML: `"namespace/pod": iface`).
    #[arg(long, env = "FELIX_INTERFACEMAPFILE")]
    pub interface_map_file: Option<PathBuf>,
    /// Bridge mode: the Linux bridge whose ports are the pods' host veths (flannel's cni0,
    /// the CNI bridge plugin); rules match the bridge port with -m physdev. Empty: routed
    /// mode (one routed host veth per pod). Needs br_netfilter and
    /// net.bridge.bridge-nf-call-iptables=1.
    #[arg(long, env = "FELIX_BRIDGEINTERFACE", default_value = "", value_parser = parse_bridge_interface)]
    pub bridge_interface: String,
    /// Mark bits netpol-agent may use (accept, pass and two scratch bits are taken from the
    /// lowest set bits).
    #[arg(long, env = "FELIX_IPTABLESMARKMASK", default_value = "0xffff0000", value_parser = parse_mark_mask)]
    pub iptables_mark_mask: u32,
    /// What happens to pod-to-host traffic after the pod's egress policy allowed it
    /// (felix's default is DROP; ours is ACCEPT, as in policy-only deployments).
    #[arg(
        long,
        env = "FELIX_DEFAULTENDPOINTTOHOSTACTION",
        value_enum,
        ignore_case = true,
        default_value = "ACCEPT"
    )]
    pub default_endpoint_to_host_action: EndpointToHostAction,
    /// Target for traffic policy allowed.
    #[arg(
        long,
        env = "FELIX_IPTABLESFILTERALLOWACTION",
        value_enum,
        ignore_case = true,
        default_value = "ACCEPT"
    )]
    pub iptables_filter_allow_action: AllowAction,
    /// Target for traffic policy denied.
    #[arg(
        long,
        env = "FELIX_IPTABLESFILTERDENYACTION",
        value_enum,
        ignore_case = true,
        default_value = "DROP"
    )]
    pub iptables_filter_deny_action: DenyAction,
    /// Whether our jumps go at the top of the kernel chains or after other programs' rules.
    #[arg(
        long,
        env = "FELIX_CHAININSERTMODE",
        value_enum,
        ignore_case = true,
        default_value = "insert"
    )]
    pub chain_insert_mode: ChainInsertMode,
    /// maxelem of every IP set.
    #[arg(long, env = "FELIX_MAXIPSETSIZE", default_value = "1048576", value_parser = parse_max_ipset_size)]
    pub max_ipset_size: u32,
    /// Deny logging: an NFLOG rule, rate-limited per pod and direction, before every drop
    /// that policy makes, and one log line per denied flow.
    #[arg(long, env = "FELIX_DENYLOGENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub deny_log_enabled: bool,
    /// The NFLOG group deny-log rules send to and the agent reads (no other program may hold
    /// it).
    #[arg(long, env = "FELIX_DENYLOGNFLOGGROUP", default_value = "20", value_parser = parse_nflog_group)]
    pub deny_log_nflog_group: u16,
    /// Deny logging: packets logged per pod and direction, on average (N per second, or
    /// N/sec, N/min, N/hour, N/day).
    #[arg(long, env = "FELIX_DENYLOGRATE", default_value = "10", value_parser = parse_deny_log_rate)]
    pub deny_log_rate: Rate,
    /// Deny logging: packets logged per pod and direction in a burst before the rate applies.
    #[arg(long, env = "FELIX_DENYLOGBURST", default_value = "20", value_parser = parse_deny_log_burst)]
    pub deny_log_burst: u32,
    /// Flow logs: an NFLOG copy of the first packet of each new connection at the rule that
    /// decides it (allowed and denied), aggregated into flow records (docs/operations/flow-logs.md).
    #[arg(long, env = "FELIX_FLOWLOGSENABLED", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub flow_logs_enabled: bool,
    /// Flow logs: the NFLOG group their rules send to and the agent reads (netpol-agent's own
    /// setting; not the deny log's group, and no other program may hold it).
    #[arg(long, env = "FELIX_FLOWLOGSNFLOGGROUP", default_value = "21", value_parser = parse_nflog_group)]
    pub flow_logs_nflog_group: u16,
    /// Flow logs: new connections logged per pod and direction per second, on average
    /// (netpol-agent's own setting; -m hashlimit keyed by the pod's address).
    #[arg(long, env = "FELIX_FLOWLOGSPERPODRATE", default_value = "100", value_parser = parse_flow_log_rate)]
    pub flow_logs_per_pod_rate: u32,
    /// Flow logs: new connections logged per pod and direction in a burst before the rate
    /// applies (netpol-agent's own setting).
    #[arg(long, env = "FELIX_FLOWLOGSPERPODBURST", default_value = "200", value_parser = parse_deny_log_burst)]
    pub flow_logs_per_pod_burst: u32,
    /// Anti-spoofing: Disabled (pods may send only from their own addresses; packets from a
    /// pod's interface with another source are dropped) or Any (no source check, for CNIs
    /// whose pods legitimately send from other addresses).
    #[arg(
        long,
        env = "FELIX_WORKLOADSOURCESPOOFING",
        value_enum,
        ignore_case = true,
        default_value = "Disabled"
    )]
    pub workload_source_spoofing: SourceSpoofing,
    /// kube-proxy IPVS mode: auto (on when the interface kube-ipvs0 exists in the agent's
    /// network namespace at start; compile sees no node, so off there), true or false. On:
    /// Service traffic is tagged in INPUT and judged in OUTPUT, after IPVS, as felix does.
    #[arg(long, visible_alias = "kube-ipvs", env = "FELIX_KUBEIPVSSUPPORTENABLED", default_value = "auto", value_parser = parse_ipvs_support, num_args = 0..=1, default_missing_value = "true")]
    pub kube_ipvs_support_enabled: IpvsSupport,
    /// IPVS mode: kube-proxy's NodePort ranges (N or N:M, comma-separated); packets to these
    /// ports of this host's addresses are judged after IPVS.
    #[arg(long, env = "FELIX_KUBENODEPORTRANGES", default_value = "30000:32767", value_parser = parse_port_ranges)]
    pub kube_node_port_ranges: PortRanges,
    /// Pods selected by at least this many NetworkPolicies in a direction match that
    /// direction's pod-selector, numeric-port allows with one union IP set before the
    /// per-policy chains, so a new connection's cost does not grow with the number of
    /// policies (netpol-agent's own setting; 0: never; unused while flow logs are on;
    /// docs/design/rules.md, "Union sets").
    #[arg(long, env = "FELIX_POLICYUNIONMIN", default_value_t = crate::rules::union::DEFAULT_MIN_POLICIES)]
    pub policy_union_min: usize,
}

impl RuleOptions {
    pub fn rule_config(&self) -> anyhow::Result<RuleConfig> {
        let prefixes = parse_prefix_list(&self.interface_prefix).map_err(|e| {
            ConfigError(format!(
                "FELIX_INTERFACEPREFIX (--interface-prefix) {:?}: {e}",
                self.interface_prefix
            ))
        })?;
        let marks = MarkBits::from_mask(self.iptables_mark_mask).map_err(|e| {
            ConfigError(format!(
                "FELIX_IPTABLESMARKMASK (--iptables-mark-mask): {e}"
            ))
        })?;
        Ok(RuleConfig {
            interface_prefixes: prefixes,
            marks,
            endpoint_to_host_action: self.default_endpoint_to_host_action,
            allow_action: self.iptables_filter_allow_action,
            deny_action: self.iptables_filter_deny_action,
            insert_mode: self.chain_insert_mode,
            bridge: self.bridge(),
            deny_log: self.deny_log()?,
            flow_log: self.flow_log()?,
            workload_source_check: self.workload_source_spoofing == SourceSpoofing::Disabled,
            kube_ipvs: match self.kube_ipvs_support_enabled {
                IpvsSupport::On => Some(self.kube_ipvs_config(&marks)?),
                IpvsSupport::Auto | IpvsSupport::Off => None,
            },
            policy_union_min: self.policy_union_min,
            pending: None,
        })
    }

    /// The flow-log rule settings, `None` when flow logs are off.
    pub fn flow_log(&self) -> Result<Option<FlowLogConfig>, ConfigError> {
        if !self.flow_logs_enabled {
            return Ok(None);
        }
        if self.deny_log_enabled && self.deny_log_nflog_group == self.flow_logs_nflog_group {
            return Err(ConfigError(format!(
                "FELIX_FLOWLOGSNFLOGGROUP (--flow-logs-nflog-group) {} is also FELIX_DENYLOGNFLOGGROUP; flow logs need a group of their own",
                self.flow_logs_nflog_group
            )));
        }
        FlowLogConfig::new(
            self.flow_logs_nflog_group,
            self.flow_logs_per_pod_rate,
            self.flow_logs_per_pod_burst,
            DEFAULT_SNAP_LEN,
        )
        .map(Some)
        .map_err(|e| {
            ConfigError(format!(
                "FELIX_FLOWLOGSPERPODRATE (--flow-logs-per-pod-rate) with FELIX_FLOWLOGSPERPODBURST (--flow-logs-per-pod-burst): {e}"
            ))
        })
    }

    /// kube-proxy IPVS support on this node, the one decision `run`, `explain` and `audit`
    /// share: `FELIX_KUBEIPVSSUPPORTENABLED=true|false` decides, `auto` follows whether the
    /// node has `kube-ipvs0` (read by the caller: live, or from a saved dump). Sets
    /// `rules.kube_ipvs` to match and says whether it is on.
    pub fn apply_kube_ipvs(
        &self,
        rules: &mut RuleConfig,
        kube_ipvs0: bool,
    ) -> Result<bool, ConfigError> {
        let on = match self.kube_ipvs_support_enabled {
            IpvsSupport::On => true,
            IpvsSupport::Off => false,
            IpvsSupport::Auto => kube_ipvs0,
        };
        rules.kube_ipvs = if on {
            Some(self.kube_ipvs_config(&rules.marks)?)
        } else {
            None
        };
        Ok(on)
    }

    /// The IPVS rule settings, with the endpoint-mark bits carved from the mark mask (refused
    /// when too few are left).
    pub fn kube_ipvs_config(&self, marks: &MarkBits) -> Result<IpvsConfig, ConfigError> {
        IpvsConfig::new(
            self.iptables_mark_mask,
            marks,
            self.kube_node_port_ranges.0.clone(),
        )
        .map_err(|e| {
            ConfigError(format!(
                "FELIX_IPTABLESMARKMASK (--iptables-mark-mask) with kube-proxy IPVS support: {e}"
            ))
        })
    }

    /// The deny-log rule settings, `None` when deny logging is off.
    pub fn deny_log(&self) -> Result<Option<DenyLogConfig>, ConfigError> {
        if !self.deny_log_enabled {
            return Ok(None);
        }
        DenyLogConfig::new(
            self.deny_log_nflog_group,
            self.deny_log_rate,
            self.deny_log_burst,
            DEFAULT_SNAP_LEN,
        )
        .map(Some)
        .map_err(|e| {
            ConfigError(format!(
                "FELIX_DENYLOGRATE (--deny-log-rate) with FELIX_DENYLOGBURST (--deny-log-burst): {e}"
            ))
        })
    }

    /// Refuses schemes that need a running node (compile works offline).
    pub fn check_offline(&self) -> Result<(), ConfigError> {
        if self.interface_name_scheme == NamingScheme::Auto {
            return Err(ConfigError(
                "FELIX_INTERFACENAMESCHEME=auto (--interface-name-scheme auto) reads how this                  node wires its pods while the agent runs; offline commands need the scheme it                  chose (the agent's start-up log says: routes or bridge, with its prefixes and                  bridge), or --interface-name-scheme static with a FELIX_INTERFACEMAPFILE"
                    .into(),
            ));
        }
        if self.interface_name_scheme == NamingScheme::Routes {
            return Err(ConfigError(
                "FELIX_INTERFACENAMESCHEME=routes (--interface-name-scheme routes) learns \
                 interface names from this node's routing tables while the agent runs; compile \
                 works offline and cannot use it. Give compile the names with \
                 --interface-name-scheme static and a FELIX_INTERFACEMAPFILE \
                 (--interface-map-file) of \"namespace/pod\": interface, e.g. written from \
                 `ip route show table all` on the node"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The bridge of bridge mode, `None` in routed mode.
    pub fn bridge(&self) -> Option<String> {
        let name = self.bridge_interface.trim();
        (!name.is_empty()).then(|| name.to_string())
    }
}

#[cfg(test)]
mod tests;
