//! The command lines of `explain` and `audit` (clap derive, as the other subcommands). The
//! interface naming, rendering and backend options are the agent's own (`RuleOptions`,
//! `DataplaneOptions`, with their `FELIX_*` variables), so on a node both commands see what
//! the agent there sees.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::Source;
use crate::config::{
    parse_cri_endpoint, parse_datastore, DataplaneOptions, Datastore, RuleOptions,
    DEFAULT_CRI_ENDPOINT,
};
use crate::model::Protocol;

/// Where the objects come from (read once).
#[derive(Args, Clone, Debug)]
pub struct SourceOptions {
    /// Manifest files or directories (YAML or JSON; multi-document and `kind: List` work).
    #[arg(long, num_args = 1.., required_unless_present = "datastore", conflicts_with = "datastore")]
    pub manifests: Vec<PathBuf>,
    /// Read the objects once from `kubernetes` (kubeconfig or in-cluster) or `dir:PATH`.
    #[arg(long, value_parser = parse_datastore)]
    pub datastore: Option<Datastore>,
}

impl SourceOptions {
    pub fn source(&self) -> Source {
        match &self.datastore {
            Some(d) => Source::Datastore(d.clone()),
            None => Source::Manifests(self.manifests.clone()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// One JSON document.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    #[value(name = "TCP")]
    Tcp,
    #[value(name = "UDP")]
    Udp,
    #[value(name = "SCTP")]
    Sctp,
}

impl ProtocolArg {
    pub fn protocol(self) -> Protocol {
        match self {
            ProtocolArg::Tcp => Protocol::Tcp,
            ProtocolArg::Udp => Protocol::Udp,
            ProtocolArg::Sctp => Protocol::Sctp,
        }
    }
}

/// Saved dumps of a node's kernel instead of reading it.
#[derive(Args, Clone, Debug)]
pub struct SavedKernel {
    /// `iptables-save` (or `ip6tables-save`) output of the node, filter table.
    #[arg(long, requires = "ipset_save")]
    pub iptables_save: Option<PathBuf>,
    /// `ipset save` output of the node.
    #[arg(long, requires = "iptables_save")]
    pub ipset_save: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub source: SourceOptions,
    /// The source: `namespace/pod` or an IP address (an address no pod has is an outside
    /// peer).
    #[arg(long, required_unless_present = "flows", requires = "to")]
    pub from: Option<String>,
    /// The destination: `namespace/pod` or an IP address.
    #[arg(long, required_unless_present = "flows", requires = "from")]
    pub to: Option<String>,
    /// Destination port. Without it, every port the destination pod declares for the
    /// protocol is explained.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Many flows at once, read from this file (`-`: standard input), one a line:
    /// `FROM TO [PORT[/PROTOCOL]]` (`#` starts a comment; the protocol defaults to
    /// --protocol). The objects and the kernel are read once for all of them; `--output
    /// json` then prints `{"verdict", "results": [...]}`, one result per flow and port.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["from", "to", "port", "service_ip"])]
    pub flows: Option<PathBuf>,
    /// Protocol of the connection.
    #[arg(long, value_enum, ignore_case = true, default_value = "TCP")]
    pub protocol: ProtocolArg,
    /// With --kernel: the client addressed this Service IP (ClusterIP) and the proxy chose
    /// --to as the backend. Under kube-proxy's IPVS mode the trace then follows the packet
    /// on the client's node through INPUT (to the ClusterIP) and OUTPUT (to the backend);
    /// under its other modes the ClusterIP is rewritten before filtering and changes nothing.
    #[arg(long, value_name = "IP", requires = "kernel")]
    pub service_ip: Option<std::net::IpAddr>,
    /// The node whose rules `--kernel` follows (default: NODENAME, FELIX_FELIXHOSTNAME, the
    /// hostname); without `--kernel`, workload chains are named for the pods wherever they run.
    #[arg(long, env = "NODENAME")]
    pub node: Option<String>,
    /// Also follow the packet through the rules and sets this node's kernel holds (root), or
    /// the saved ones given with `--iptables-save`/`--ipset-save`.
    #[arg(long)]
    pub kernel: bool,
    #[command(flatten)]
    pub saved: SavedKernel,
    /// Answer as if the staged policies (StagedNetworkPolicy, StagedClusterNetworkPolicy,
    /// StagedKubernetesNetworkPolicy) were enforced. The kernel never holds them, so not
    /// with --kernel.
    #[arg(long, conflicts_with_all = ["kernel", "iptables_save"])]
    pub staged: bool,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value = "text")]
    pub output: OutputFormat,
    /// The container runtime's CRI socket (the sandbox naming scheme on a live node).
    #[arg(long, env = "FELIX_CRIENDPOINT", default_value = DEFAULT_CRI_ENDPOINT, value_parser = parse_cri_endpoint)]
    pub cri_endpoint: PathBuf,
    #[command(flatten)]
    pub rules: RuleOptions,
    #[command(flatten)]
    pub dataplane: DataplaneOptions,
}

#[derive(Args, Clone, Debug)]
pub struct AuditArgs {
    /// The node audited: pods with this `spec.nodeName` are its endpoints.
    #[arg(long, env = "NODENAME")]
    pub node: String,
    #[command(flatten)]
    pub source: SourceOptions,
    #[command(flatten)]
    pub saved: SavedKernel,
    /// The saved dumps are IPv6 (`ip6tables-save`). A live audit reads IPv4, and IPv6 unless
    /// FELIX_IPV6SUPPORT is false.
    #[arg(long)]
    pub ipv6: bool,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value = "text")]
    pub output: OutputFormat,
    /// The container runtime's CRI socket (the sandbox naming scheme on a live node).
    #[arg(long, env = "FELIX_CRIENDPOINT", default_value = DEFAULT_CRI_ENDPOINT, value_parser = parse_cri_endpoint)]
    pub cri_endpoint: PathBuf,
    #[command(flatten)]
    pub rules: RuleOptions,
    #[command(flatten)]
    pub dataplane: DataplaneOptions,
}
