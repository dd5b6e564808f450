//! Pod → host-side veth interface name, behind a pluggable [`InterfaceResolver`].
//!
//! Owns the naming schemes (Calico/felix hash, sandbox container ID — from the pod's
//! annotation offline, from the container runtime's CRI API at run time — static map, host
//! routes learned over netlink, bridge ports), the validation every produced name goes
//! through, and building a resolver from configuration (`configure.rs`).
//! Names that do not fit the kernel's limits are refused, never truncated: a truncated name
//! would silently point policy at the wrong interface, or at none.

mod bridge;
mod calico;
mod configure;
mod cri;
mod routes;
mod sandbox;
mod static_map;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;

use crate::model::{ObjectKey, PodInfo};

pub use bridge::BridgeResolver;
pub use calico::{CalicoResolver, DEFAULT_CALICO_PREFIX};
pub use configure::{cri_config, resolver, runtime_resolver, with_wiring};
pub use cri::{
    select_sandbox, CriConfig, CriSandboxResolver, SandboxRecord, CRIO_CRI_ENDPOINT,
    DEFAULT_CRI_ENDPOINT, DEFAULT_CRI_INITIAL_SYNC_TIMEOUT, DEFAULT_CRI_REFRESH_INTERVAL,
    POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL,
};
pub use routes::{
    read_state, resolve_from_map, table_name, Followup, PodRoute, RouteMap, RouteState,
    RouteTarget, RoutesResolver,
};
pub use sandbox::{SandboxResolver, MAX_SANDBOX_PREFIX_LEN, MIN_SANDBOX_ID_CHARS};
pub use static_map::StaticResolver;

pub use crate::rules::iface::{
    BadName, NameProblem, PrefixListError, MAX_IFACE_NAME_LEN, MAX_PREFIX_LEN,
};

/// Why no interface name could be produced. `pod` is `None` only when a bare name was
/// validated with no pod behind it.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum NamingError {
    #[error("{}{bad}", for_pod(.pod))]
    BadName {
        pod: Option<ObjectKey>,
        bad: BadName,
    },
    #[error(transparent)]
    PrefixList(#[from] PrefixListError),
    #[error(
        "sandbox interface prefix {prefix:?} is {len} bytes long; at most \
         {MAX_SANDBOX_PREFIX_LEN} are allowed so that at least {MIN_SANDBOX_ID_CHARS} characters \
         of the sandbox ID remain, which keeps names unique on a node (two sandboxes on one node \
         have been seen sharing their first 9 characters)"
    )]
    SandboxPrefixTooLong { prefix: String, len: usize },
    #[error(
        "sandbox interface prefix is empty; without a prefix pod interfaces cannot be told \
         apart from the host's own"
    )]
    EmptySandboxPrefix,
    #[error("pod {pod}: its sandbox ID is not known yet, so its interface name cannot be derived")]
    SandboxIdUnknown { pod: ObjectKey },
    #[error(
        "pod {pod}: the container runtime has {not_ready} sandbox(es) for it and none is READY \
         (still being set up, or its network setup failed), so it has no interface yet"
    )]
    NoReadySandbox { pod: ObjectKey, not_ready: usize },
    #[error(
        "pod {pod}: sandbox ID {sandbox_id:?} has {len} characters; at least {needed} are needed"
    )]
    SandboxIdTooShort {
        pod: ObjectKey,
        sandbox_id: String,
        len: usize,
        needed: usize,
    },
    #[error("pod {pod}: sandbox ID {sandbox_id:?} is not lowercase hex (found {found:?})")]
    SandboxIdNotHex {
        pod: ObjectKey,
        sandbox_id: String,
        found: char,
    },
    #[error("pod {pod} is not in the static interface map")]
    NotMapped { pod: ObjectKey },
    #[error(
        "pod {pod}: FELIX_INTERFACENAMESCHEME=auto has not seen how this node wires pods yet \
         (no pod interface on the node), so no pod is named; a pod a policy isolates is \
         dropped by address until it is"
    )]
    WiringUnknown { pod: ObjectKey },
    #[error("static interface map key {key:?} is not of the form \"namespace/pod\": {problem}")]
    InvalidMapKey { key: String, problem: &'static str },
    #[error(
        "static interface map entry {key:?}: the value must be an interface name string, got \
         {found}"
    )]
    InvalidMapValue { key: String, found: String },
    #[error("static interface map gives interface {name:?} to both {first} and {second}")]
    DuplicateInterface {
        name: String,
        first: ObjectKey,
        second: ObjectKey,
    },
    #[error("static interface map is not usable YAML: {message}")]
    MapYaml { message: String },
    #[error(
        "pod {pod}: no port of bridge {bridge} is known for its addresses {addresses:?} yet \
         (asked the kernel to resolve them)"
    )]
    BridgePortUnknown {
        pod: ObjectKey,
        bridge: String,
        addresses: Vec<String>,
    },
    #[error("pod {pod}: its addresses are behind different bridge ports {ports:?}")]
    BridgePortsDiffer { pod: ObjectKey, ports: Vec<String> },
    #[error("pod {pod} has no IP address, so no host route can name its interface")]
    NoPodIp { pod: ObjectKey },
    #[error("pod {pod}: no host route to {} in any routing table", join_ips(.ips))]
    NoHostRoute { pod: ObjectKey, ips: Vec<IpAddr> },
    #[error(
        "pod {pod}: its host routes lead to different interfaces, so none can be chosen: {}",
        join_routes(.routes)
    )]
    ConflictingRoutes {
        pod: ObjectKey,
        routes: Vec<PodRoute>,
    },
    #[error(
        "pod {pod}: the host route to {ip} (table {}) leads to interface index {ifindex}, whose \
         name is not known yet",
        table_name(*.table)
    )]
    UnknownRouteInterface {
        pod: ObjectKey,
        ip: IpAddr,
        table: u32,
        ifindex: u32,
    },
    #[error(
        "pod {pod}: its host route leads to interface {name:?}, which matches none of the \
         interface prefixes {} (FELIX_INTERFACEPREFIX): the dispatch rules (-i {}+) could never \
         match it",
        .prefixes.join(", "),
        .prefixes.first().map(String::as_str).unwrap_or("")
    )]
    InterfacePrefixMismatch {
        pod: ObjectKey,
        name: String,
        prefixes: Vec<String>,
    },
}

fn join_ips(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

fn join_routes(routes: &[PodRoute]) -> String {
    routes
        .iter()
        .map(PodRoute::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn for_pod(pod: &Option<ObjectKey>) -> String {
    match pod {
        Some(key) => format!("pod {key}: "),
        None => String::new(),
    }
}

/// Maps a local pod to the name of its host-side veth.
pub trait InterfaceResolver: Send + Sync + fmt::Debug {
    /// Host-side interface name of a local pod's veth.
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError>;
    /// Short scheme name for logs ("calico", "sandbox", "static").
    fn scheme(&self) -> &'static str;
    /// Starts watching whatever the resolver learns names from (the container runtime,
    /// the routing table), on its own thread, until `stop` is set. `changed` is called
    /// whenever something was learned that may change a resolution; the agent then
    /// resolves every local pod again. Schemes that derive names from the pod alone have
    /// nothing to watch.
    fn start(&self, changed: ChangeNotifier, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        let _ = (changed, stop);
        Ok(())
    }
    /// Whether the resolver has learned what it learns at least once since `start` (the
    /// container runtime answered its first listing). Until then every pod it cannot name
    /// fails closed; the agent may hold readiness on this. Schemes that derive names from the
    /// pod alone always are.
    fn in_sync(&self) -> bool {
        true
    }
}

/// `FELIX_INTERFACENAMESCHEME=auto` while the node shows no pod interface: names no pod, so
/// every local pod is unnamed and the guard (`rules::guard`) holds the ones a policy isolates.
/// The agent restarts itself with the detected scheme once the node shows its wiring.
#[derive(Debug, Default)]
pub struct WiringPending;

impl InterfaceResolver for WiringPending {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        Err(NamingError::WiringUnknown {
            pod: pod.key.clone(),
        })
    }
    fn scheme(&self) -> &'static str {
        "auto (wiring not seen yet)"
    }
}

/// Called by a resolver when it learned something; cheap and callable from any thread.
pub type ChangeNotifier = Box<dyn Fn() + Send + Sync>;

/// Checks `name` against the kernel's rules (`dev_valid_name`). Never shortens it.
pub fn validate_interface_name(name: &str) -> Result<(), NamingError> {
    check_name(None, name)
}

/// [`validate_interface_name`] with the pod the name belongs to, for the error message.
fn validate_pod_interface_name(pod: &ObjectKey, name: &str) -> Result<(), NamingError> {
    check_name(Some(pod), name)
}

fn check_name(pod: Option<&ObjectKey>, name: &str) -> Result<(), NamingError> {
    crate::rules::iface::check_interface_name(name).map_err(|bad| NamingError::BadName {
        pod: pod.cloned(),
        bad,
    })
}

/// Parses felix's `InterfacePrefix` style list (`"cali,tap"`), see
/// [`crate::rules::iface::parse_prefix_list`].
pub fn parse_prefix_list(list: &str) -> Result<Vec<String>, NamingError> {
    Ok(crate::rules::iface::parse_prefix_list(list)?)
}

/// Which naming scheme the agent uses, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolverConfig {
    /// felix's hash scheme; `prefixes` is a comma-separated list, the first one names veths.
    Calico { prefixes: String },
    /// Prefix + the start of the pod's sandbox container ID, read from the pod's
    /// `netpol-agent.io/sandbox-id` annotation (`compile`, offline).
    Sandbox { prefix: String },
    /// Prefix + the start of the pod's sandbox container ID, learned from the container
    /// runtime over CRI (`run`).
    CriSandbox { prefix: String, cri: CriConfig },
    /// A YAML file mapping `"namespace/pod"` to interface names.
    Static { map_file: PathBuf },
    /// The output interface of the host route to the pod's IP, in any routing table, learned
    /// over netlink while the agent runs; `prefixes` is the list the interface must match.
    Routes { prefixes: String },
    /// The port of `bridge` behind which the pod's address answers (learned over rtnetlink);
    /// `prefixes` is the comma-separated list of pod port prefixes.
    Bridge { bridge: String, prefixes: String },
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig::Calico {
            prefixes: DEFAULT_CALICO_PREFIX.to_string(),
        }
    }
}

/// Builds the configured resolver; the static scheme reads its map file now, so a bad file
/// fails startup rather than every pod later.
pub fn build_resolver(cfg: &ResolverConfig) -> anyhow::Result<Box<dyn InterfaceResolver>> {
    Ok(match cfg {
        ResolverConfig::Calico { prefixes } => Box::new(
            CalicoResolver::new(prefixes).context("configuring the calico interface naming")?,
        ),
        ResolverConfig::Sandbox { prefix } => Box::new(
            SandboxResolver::new(prefix).context("configuring the sandbox interface naming")?,
        ),
        ResolverConfig::Bridge { bridge, prefixes } => Box::new(
            BridgeResolver::new(bridge, prefixes)
                .context("configuring the bridge interface naming")?,
        ),
        ResolverConfig::CriSandbox { prefix, cri } => Box::new(
            CriSandboxResolver::new(prefix, cri.clone())
                .context("configuring the sandbox interface naming")?,
        ),
        ResolverConfig::Static { map_file } => {
            let text = std::fs::read_to_string(map_file)
                .with_context(|| format!("reading static interface map {}", map_file.display()))?;
            Box::new(
                StaticResolver::from_yaml(&text)
                    .with_context(|| format!("in static interface map {}", map_file.display()))?,
            )
        }
        ResolverConfig::Routes { prefixes } => Box::new(
            RoutesResolver::new(prefixes).context("configuring the routes interface naming")?,
        ),
    })
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::model::{ObjectKey, PodInfo};

    pub fn pod(namespace: &str, name: &str, sandbox_id: Option<&str>) -> PodInfo {
        PodInfo {
            key: ObjectKey::new(namespace, name),
            uid: None,
            node: Some("node-1".to_string()),
            labels: Default::default(),
            ips: Vec::new(),
            named_ports: Vec::new(),
            sandbox_id: sandbox_id.map(str::to_string),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::pod;
    use super::*;

    #[test]
    fn pod_errors_name_the_pod() {
        let err = NamingError::BadName {
            pod: Some(ObjectKey::new("default", "web-1")),
            bad: BadName::TooLong {
                name: "x".repeat(16),
                len: 16,
            },
        };
        assert!(err.to_string().starts_with("pod default/web-1: "));
    }

    #[test]
    fn default_config_is_calico_with_cali_prefix() {
        let resolver = build_resolver(&ResolverConfig::default()).unwrap();
        assert_eq!(resolver.scheme(), "calico");
        assert_eq!(
            resolver
                .resolve(&pod("namespace", "podname", None))
                .unwrap(),
            "cali82111e10a96"
        );
    }

    #[test]
    fn build_resolver_picks_each_scheme() {
        let sandbox = build_resolver(&ResolverConfig::Sandbox {
            prefix: "veth-".to_string(),
        })
        .unwrap();
        assert_eq!(sandbox.scheme(), "sandbox");

        let map_file = std::env::temp_dir().join(format!(
            "netpol-agent-iface-map-{}.yaml",
            std::process::id()
        ));
        std::fs::write(&map_file, "default/web-1: eth-web1\n").unwrap();
        let built = build_resolver(&ResolverConfig::Static {
            map_file: map_file.clone(),
        });
        std::fs::remove_file(&map_file).unwrap();
        let static_map = built.unwrap();
        assert_eq!(static_map.scheme(), "static");
        assert_eq!(
            static_map.resolve(&pod("default", "web-1", None)).unwrap(),
            "eth-web1"
        );
    }

    #[test]
    fn build_resolver_reports_bad_configuration() {
        let err = build_resolver(&ResolverConfig::Calico {
            prefixes: " , ".to_string(),
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("contains no prefix"));

        let missing = PathBuf::from("/nonexistent/netpol-agent/iface-map.yaml");
        let err = build_resolver(&ResolverConfig::Static { map_file: missing }).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/netpol-agent/iface-map.yaml"));
    }

    /// Arbitrary input must give an error, never a panic, and every produced name must fit.
    mod no_panic {
        use proptest::prelude::*;

        use super::super::test_support::pod;
        use super::super::*;

        proptest! {
            #[test]
            fn resolved_names_are_valid(
                prefix in prop_oneof!["[a-z\\-]{0,6}", "\\PC{0,8}"],
                namespace in "\\PC{0,12}",
                name in "\\PC{0,12}",
                sandbox_id in proptest::option::of(
                    prop_oneof!["[0-9a-f]{0,20}", "[0-9a-fA-Z:/]{0,20}"]
                ),
            ) {
                let pod = pod(&namespace, &name, sandbox_id.as_deref());
                let resolvers: Vec<Box<dyn InterfaceResolver>> = [
                    CalicoResolver::new(&prefix).map(|r| Box::new(r) as Box<dyn InterfaceResolver>),
                    SandboxResolver::new(&prefix).map(|r| Box::new(r) as Box<dyn InterfaceResolver>),
                ]
                .into_iter()
                .flatten()
                .collect();
                for resolver in resolvers {
                    if let Ok(iface) = resolver.resolve(&pod) {
                        prop_assert_eq!(validate_interface_name(&iface), Ok(()));
                    }
                }
            }

            #[test]
            fn static_map_yaml_never_panics(text in "[\\PC\n]{0,60}") {
                let _ = StaticResolver::from_yaml(&text);
            }
        }
    }
}
