//! Command-line and environment configuration shared by the subcommands. Every option has
//! a felix-style environment variable (`FELIX_<KEY>`) with felix's meaning; options felix
//! does not have (the interface-naming scheme) use the same form.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use crate::iface_naming::{build_resolver, parse_prefix_list, InterfaceResolver, ResolverConfig};
use crate::rules::{
    AllowAction, ChainInsertMode, DenyAction, EndpointToHostAction, MarkBits, RuleConfig,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NamingScheme {
    /// `<first prefix> + sha1("<namespace>.<pod>")[:11]`, as Calico's CNI names veths.
    Calico,
    /// `<first prefix> + the start of the pod's sandbox container ID`.
    Sandbox,
    /// A YAML map `"namespace/pod": interface` (FELIX_INTERFACEMAPFILE).
    Static,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ToHostAction {
    #[value(name = "ACCEPT")]
    Accept,
    #[value(name = "DROP")]
    Drop,
    #[value(name = "RETURN")]
    Return,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FilterAllowAction {
    #[value(name = "ACCEPT")]
    Accept,
    #[value(name = "RETURN")]
    Return,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FilterDenyAction {
    #[value(name = "DROP")]
    Drop,
    #[value(name = "REJECT")]
    Reject,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InsertMode {
    #[value(name = "insert")]
    Insert,
    #[value(name = "append")]
    Append,
}

/// How pods map to interfaces and how rules are rendered.
#[derive(Args, Clone, Debug)]
pub struct RuleOptions {
    /// Host-side interface prefixes of pod veths, comma-separated; the first one names new
    /// interfaces in the calico and sandbox schemes.
    #[arg(long, env = "FELIX_INTERFACEPREFIX", default_value = "cali")]
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
    /// Mark bits netpol-agent may use (accept, pass and two scratch bits are taken from the
    /// lowest set bits).
    #[arg(long, env = "FELIX_IPTABLESMARKMASK", default_value = "0xffff0000", value_parser = parse_mark_mask)]
    pub iptables_mark_mask: u32,
    /// What happens to pod-to-host traffic after the pod's egress policy allowed it.
    #[arg(
        long,
        env = "FELIX_DEFAULTENDPOINTTOHOSTACTION",
        value_enum,
        ignore_case = true,
        default_value = "ACCEPT"
    )]
    pub default_endpoint_to_host_action: ToHostAction,
    /// Target for traffic policy allowed.
    #[arg(
        long,
        env = "FELIX_IPTABLESFILTERALLOWACTION",
        value_enum,
        ignore_case = true,
        default_value = "ACCEPT"
    )]
    pub iptables_filter_allow_action: FilterAllowAction,
    /// Target for traffic policy denied.
    #[arg(
        long,
        env = "FELIX_IPTABLESFILTERDENYACTION",
        value_enum,
        ignore_case = true,
        default_value = "DROP"
    )]
    pub iptables_filter_deny_action: FilterDenyAction,
    /// Whether our jumps go at the top of the kernel chains or after other programs' rules.
    #[arg(
        long,
        env = "FELIX_CHAININSERTMODE",
        value_enum,
        ignore_case = true,
        default_value = "insert"
    )]
    pub chain_insert_mode: InsertMode,
    /// maxelem of every IP set.
    #[arg(long, env = "FELIX_MAXIPSETSIZE", default_value_t = crate::ipsets::DEFAULT_MAX_SET_SIZE, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_ipset_size: u32,
}

fn parse_mark_mask(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    }
    .map_err(|e| format!("not a 32-bit number ({e}); e.g. 0xffff0000"))?;
    MarkBits::from_mask(value)?;
    Ok(value)
}

impl RuleOptions {
    pub fn rule_config(&self) -> anyhow::Result<RuleConfig> {
        let prefixes = parse_prefix_list(&self.interface_prefix)
            .with_context(|| format!("FELIX_INTERFACEPREFIX={:?}", self.interface_prefix))?;
        let marks = MarkBits::from_mask(self.iptables_mark_mask).map_err(anyhow::Error::msg)?;
        Ok(RuleConfig {
            interface_prefixes: prefixes,
            marks,
            endpoint_to_host_action: match self.default_endpoint_to_host_action {
                ToHostAction::Accept => EndpointToHostAction::Accept,
                ToHostAction::Drop => EndpointToHostAction::Drop,
                ToHostAction::Return => EndpointToHostAction::Return,
            },
            allow_action: match self.iptables_filter_allow_action {
                FilterAllowAction::Accept => AllowAction::Accept,
                FilterAllowAction::Return => AllowAction::Return,
            },
            deny_action: match self.iptables_filter_deny_action {
                FilterDenyAction::Drop => DenyAction::Drop,
                FilterDenyAction::Reject => DenyAction::Reject,
            },
            insert_mode: match self.chain_insert_mode {
                InsertMode::Insert => ChainInsertMode::Insert,
                InsertMode::Append => ChainInsertMode::Append,
            },
        })
    }

    pub fn resolver(&self) -> anyhow::Result<Box<dyn InterfaceResolver>> {
        let first_prefix = || -> anyhow::Result<String> {
            Ok(parse_prefix_list(&self.interface_prefix)?
                .into_iter()
                .next()
                .unwrap_or_default())
        };
        let cfg = match self.interface_name_scheme {
            NamingScheme::Calico => ResolverConfig::Calico {
                prefixes: self.interface_prefix.clone(),
            },
            NamingScheme::Sandbox => ResolverConfig::Sandbox {
                prefix: first_prefix()?,
            },
            NamingScheme::Static => match &self.interface_map_file {
                Some(path) => ResolverConfig::Static {
                    map_file: path.clone(),
                },
                None => bail!("FELIX_INTERFACENAMESCHEME=static needs FELIX_INTERFACEMAPFILE"),
            },
        };
        build_resolver(&cfg)
    }
}
