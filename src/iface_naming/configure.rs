//! The resolver the configuration asks for: the interface-naming options (scheme, prefixes,
//! map file, bridge; `config::RuleOptions`) and the runtime's socket (`config::AgentOptions`)
//! turned into a running [`InterfaceResolver`], and `auto`'s reading of the node's wiring
//! turned into the scheme it stands for. Lives here, not in `config`, so that the
//! configuration knows nothing of the resolvers it names; every user (`run`, `compile`,
//! `explain`, `audit`) builds its resolver through these functions, with one message for a
//! configuration that cannot name anything.

use crate::config::{AgentOptions, ConfigError, NamingScheme, RuleOptions};
use crate::host::wiring::Wiring;

use super::{
    build_resolver, parse_prefix_list, CriConfig, InterfaceResolver, ResolverConfig,
    DEFAULT_CRI_INITIAL_SYNC_TIMEOUT,
};

/// Where the sandbox scheme finds the container runtime (run only).
pub fn cri_config(agent: &AgentOptions) -> CriConfig {
    CriConfig {
        endpoint: agent.cri_endpoint.clone(),
        refresh_interval: AgentOptions::timer(agent.cri_refresh_interval),
        initial_sync_timeout: DEFAULT_CRI_INITIAL_SYNC_TIMEOUT,
    }
}

/// Concrete options for a node wired as `wiring` (what `auto` resolves to).
pub fn with_wiring(opts: &RuleOptions, wiring: &Wiring) -> RuleOptions {
    let mut out = opts.clone();
    match wiring {
        Wiring::Routed { prefixes } => {
            out.interface_name_scheme = NamingScheme::Routes;
            out.interface_prefix = prefixes.join(",");
            out.bridge_interface = String::new();
        }
        Wiring::Bridged { bridge, prefixes } => {
            out.interface_name_scheme = NamingScheme::Bridge;
            out.interface_prefix = prefixes.join(",");
            out.bridge_interface = bridge.clone();
        }
    }
    out
}

/// The resolver `compile` uses: the sandbox scheme reads each pod's
/// `netpol-agent.io/sandbox-id` annotation (offline, no runtime to ask).
pub fn resolver(opts: &RuleOptions) -> anyhow::Result<Box<dyn InterfaceResolver>> {
    build(resolver_config(opts, None)?)
}

/// The resolver `run` uses: the sandbox scheme learns sandbox IDs from the container
/// runtime at `cri` (started by [`InterfaceResolver::start`]); the other schemes are the
/// same as `compile`'s.
pub fn runtime_resolver(
    opts: &RuleOptions,
    cri: &CriConfig,
) -> anyhow::Result<Box<dyn InterfaceResolver>> {
    build(resolver_config(opts, Some(cri))?)
}

fn resolver_config(opts: &RuleOptions, cri: Option<&CriConfig>) -> anyhow::Result<ResolverConfig> {
    let first_prefix = || -> anyhow::Result<String> {
        Ok(parse_prefix_list(&opts.interface_prefix)?
            .into_iter()
            .next()
            .unwrap_or_default())
    };
    Ok(match opts.interface_name_scheme {
        NamingScheme::Calico => ResolverConfig::Calico {
            prefixes: opts.interface_prefix.clone(),
        },
        NamingScheme::Sandbox => match cri {
            Some(cri) => ResolverConfig::CriSandbox {
                prefix: first_prefix()?,
                cri: cri.clone(),
            },
            None => ResolverConfig::Sandbox {
                prefix: first_prefix()?,
            },
        },
        NamingScheme::Routes => ResolverConfig::Routes {
            prefixes: opts.interface_prefix.clone(),
        },
        NamingScheme::Static => match &opts.interface_map_file {
            Some(path) => ResolverConfig::Static {
                map_file: path.clone(),
            },
            None => {
                return Err(ConfigError(
                    "FELIX_INTERFACENAMESCHEME=static (--interface-name-scheme static) needs FELIX_INTERFACEMAPFILE (--interface-map-file)".into(),
                )
                .into())
            }
        },
        NamingScheme::Auto => {
            return Err(ConfigError(
                "FELIX_INTERFACENAMESCHEME=auto is resolved from the node when `run` starts; nothing else can use it".into(),
            )
            .into())
        }
        NamingScheme::Bridge => match opts.bridge() {
            Some(bridge) => ResolverConfig::Bridge {
                bridge,
                prefixes: opts.interface_prefix.clone(),
            },
            None => {
                return Err(ConfigError(
                    "FELIX_INTERFACENAMESCHEME=bridge (--interface-name-scheme bridge) needs FELIX_BRIDGEINTERFACE (--bridge-interface), e.g. cni0".into(),
                )
                .into())
            }
        },
    })
}

fn build(cfg: ResolverConfig) -> anyhow::Result<Box<dyn InterfaceResolver>> {
    build_resolver(&cfg).map_err(|e| {
        ConfigError(format!(
            "interface naming (FELIX_INTERFACENAMESCHEME --interface-name-scheme, FELIX_INTERFACEPREFIX --interface-prefix, FELIX_INTERFACEMAPFILE --interface-map-file, FELIX_BRIDGEINTERFACE --bridge-interface): {e:#}"
        ))
        .into()
    })
}
