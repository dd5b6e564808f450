//! `explain`, `audit`, `flows` and `staged`: the read-only commands that answer "why is this
//! flow allowed or denied", "does this node's kernel hold what the policies say", "which flows
//! did the agents record" ([`flows`], a client of the agents' flows API) and "what would the
//! staged policies change" ([`staged`], issue 23). The I/O edge around the
//! pure `verdict` evaluator and `dataplane::audit`: reading the objects once (manifests, a
//! directory, or the Kubernetes API until its first complete listing), naming pod interfaces
//! with the configured resolver, reading the kernel (`iptables-save`, `ipset save`) or saved
//! dumps of it, and printing for people or as JSON. None ever writes to the kernel.
//!
//! Exit status: 0 allowed / clean, 1 denied / findings, 2 bad input or error (the message
//! names it), 3 (`explain --kernel`) the kernel's answer differs from the policies'.

pub mod args;
pub mod audit;
pub mod compile;
pub mod explain;
pub mod flows;
pub mod staged;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::config::{Datastore, NamingScheme, RuleOptions};
use crate::dataplane::iptables::backend::run_save;
use crate::dataplane::iptables::{detect_backend, tool_name, Backend, BackendMode};
use crate::datastore::kube::{self, KubeConnect};
use crate::datastore::manifests;
use crate::host::exec::Exec;
use crate::iface_naming::{CriConfig, InterfaceResolver};
use crate::kernel_text::ipset_save::{self, SetLine};
use crate::kernel_text::iptables_save::{self, SaveLine};
use crate::model::{DatastoreEvent, IpFamily, K8sObject, ObjectRef};

/// How long reading the Kubernetes API may take before its first complete listing.
const KUBE_LIST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a resolver that learns names (routes, bridge, CRI) gets to learn them.
const RESOLVER_SETTLE: Duration = Duration::from_secs(5);

/// Exit status for bad input and errors.
pub const EXIT_BAD_INPUT: u8 = 2;
/// `explain --kernel`: the kernel disagrees with the policies.
pub const EXIT_KERNEL_DIFFERS: u8 = 3;

/// Where the objects come from.
#[derive(Clone, Debug)]
pub enum Source {
    Manifests(Vec<PathBuf>),
    Datastore(Datastore),
}

/// Reads every object once. Any manifest that does not parse is an error naming it: an
/// answer computed without it could be wrong.
pub fn load_objects(source: &Source) -> anyhow::Result<Vec<K8sObject>> {
    let paths = match source {
        Source::Manifests(paths) => paths.clone(),
        Source::Datastore(Datastore::Dir(dir)) => vec![dir.clone()],
        Source::Datastore(Datastore::Kubernetes) => return load_kubernetes(),
    };
    let (objects, errors) = manifests::load_paths(&paths)?;
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
        bail!("invalid manifests:\n  {}", list.join("\n  "));
    }
    Ok(objects)
}

/// Lists pods, namespaces and NetworkPolicies from the API server (kubeconfig or in-cluster)
/// until the first complete listing, then stops the watchers.
fn load_kubernetes() -> anyhow::Result<Vec<K8sObject>> {
    let (tx, rx) = channel::<DatastoreEvent>();
    let stop = Arc::new(AtomicBool::new(false));
    let source =
        kube::spawn(KubeConnect::Infer, tx, stop).context("connecting to the Kubernetes API")?;
    let mut objects: BTreeMap<ObjectRef, K8sObject> = BTreeMap::new();
    let deadline = Instant::now() + KUBE_LIST_TIMEOUT;
    let result = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(DatastoreEvent::Upsert(o)) => {
                objects.insert(o.object_ref(), *o);
            }
            Ok(DatastoreEvent::Delete(r)) => {
                objects.remove(&r);
            }
            Ok(DatastoreEvent::InSync) => break Ok(()),
            Ok(DatastoreEvent::Access {
                kind,
                refused: Some(why),
            }) => {
                break Err(anyhow!(
                    "the Kubernetes API refuses to let this user list {}: {why}",
                    kind.as_str()
                ))
            }
            Ok(DatastoreEvent::Access { refused: None, .. }) => {}
            Err(RecvTimeoutError::Timeout) => {
                break Err(anyhow!(
                    "the Kubernetes API did not deliver a complete listing within {} s",
                    KUBE_LIST_TIMEOUT.as_secs()
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                break Err(anyhow!(
                    "the Kubernetes datastore stopped before its first listing"
                ))
            }
        }
    };
    drop(rx);
    let _ = source.stop();
    result.map(|()| objects.into_values().collect())
}

/// `--node`, else `NODENAME` (the same option), else `FELIX_FELIXHOSTNAME`, else the hostname.
pub fn node_name(node: Option<&str>) -> anyhow::Result<String> {
    let felix_hostname = std::env::var("FELIX_FELIXHOSTNAME").ok();
    crate::config::node_name([node, felix_hostname.as_deref()])
}

/// The resolver for offline use (`None` for schemes that only work on a live node: then
/// workload chains are named as unknown), or, on a live node, the agent's own resolver,
/// started and given a moment to learn.
pub fn resolver(
    rules: &RuleOptions,
    live: Option<&CriConfig>,
) -> anyhow::Result<Option<Box<dyn InterfaceResolver>>> {
    let Some(cri) = live else {
        return match rules.check_offline() {
            Ok(()) => crate::iface_naming::resolver(rules).map(Some),
            Err(_) => Ok(None),
        };
    };
    let resolver = crate::iface_naming::runtime_resolver(rules, cri)?;
    let stop = Arc::new(AtomicBool::new(false));
    resolver.start(Box::new(|| {}), stop.clone())?;
    let deadline = Instant::now() + RESOLVER_SETTLE;
    while !resolver.in_sync() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Watchers keep running until the process ends; the answers stay readable.
    Ok(Some(resolver))
}

/// The rule options on a live node. `FELIX_INTERFACENAMESCHEME=auto` (the shipped
/// DaemonSet's) is resolved from how this node wires its pods, with the reader `run` uses
/// (`host::wiring`), so `explain --kernel` and `audit` in the agent's pod name interfaces and
/// render chains as the agent beside them does. A node with no pod interface yet has nothing
/// to name: refused, saying so.
pub fn live_rules(rules: &RuleOptions) -> anyhow::Result<RuleOptions> {
    if rules.interface_name_scheme != NamingScheme::Auto {
        return Ok(rules.clone());
    }
    let wiring = crate::host::wiring::read()
        .context("FELIX_INTERFACENAMESCHEME=auto: reading how this node wires its pods")?
        .detect();
    match wiring {
        Some(w) => Ok(crate::iface_naming::with_wiring(rules, &w)),
        None => bail!(
            "FELIX_INTERFACENAMESCHEME=auto: this node has no pod interface yet (neither a veth \
             with a host route nor a bridge port), so how it wires pods is unknown; give the \
             scheme (--interface-name-scheme routes|bridge with --interface-prefix, \
             --bridge-interface)"
        ),
    }
}

/// What a node's kernel holds, as text.
pub struct KernelText {
    /// Which backend it was read from (`None`: saved files).
    pub backend: Option<Backend>,
    /// `iptables-save -t filter` per family.
    pub iptables: BTreeMap<IpFamily, String>,
    /// `ipset save`.
    pub ipsets: String,
    /// Our chains and rules found in the other backend's tables (live only), per family.
    pub other_backend: Option<(Backend, BTreeMap<IpFamily, String>)>,
}

/// Reads saved `iptables-save` and `ipset save` output for one family.
pub fn read_saved(
    iptables: &PathBuf,
    ipsets: &PathBuf,
    family: IpFamily,
) -> anyhow::Result<KernelText> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    Ok(KernelText {
        backend: None,
        iptables: BTreeMap::from([(family, read(iptables)?)]),
        ipsets: read(ipsets)?,
        other_backend: None,
    })
}

/// Reads this node's filter tables (the backend the agent would use, and the other one to
/// find anything of ours left there) and its IP sets. Needs root (CAP_NET_ADMIN).
pub fn read_live(mode: BackendMode, families: &[IpFamily]) -> anyhow::Result<KernelText> {
    let exec = Exec::default();
    let backend = detect_backend(&exec, mode);
    let mut iptables = BTreeMap::new();
    for &f in families {
        let tool = tool_name(f, backend, "save");
        iptables.insert(
            f,
            // Read for display and interpretation only: bytes that are not UTF-8 (another
            // program's comment) are shown replaced, never written back.
            run_save(&exec, &tool, Some("filter"))
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .with_context(|| {
                    format!("reading the kernel's rules with {tool} (run as root on the node, or give --iptables-save and --ipset-save)")
                })?,
        );
    }
    let other = match backend {
        Backend::Legacy => Backend::Nft,
        Backend::Nft => Backend::Legacy,
    };
    let mut other_text = BTreeMap::new();
    for &f in families {
        // A backend that cannot be read holds nothing of ours that matters here.
        if let Ok(text) = run_save(&exec, &tool_name(f, other, "save"), Some("filter")) {
            other_text.insert(f, String::from_utf8_lossy(&text).into_owned());
        }
    }
    let out = exec
        .command("ipset")
        .arg("save")
        .stdin(Stdio::null())
        .output()
        .context("cannot run ipset save")?;
    if !out.status.success() {
        bail!(
            "ipset save failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(KernelText {
        backend: Some(backend),
        iptables,
        ipsets: String::from_utf8_lossy(&out.stdout).into_owned(),
        other_backend: Some((other, other_text)),
    })
}

/// kube-proxy IPVS mode as the agent on the node sees it, for `explain` and `audit`: sets
/// `cfg.kube_ipvs` and returns the node's addresses for the this-host set, so both render
/// what the agent there renders. `FELIX_KUBEIPVSSUPPORTENABLED=true|false` decides as it does
/// for the agent. `auto` on the live node (`saved` is `None`) detects `kube-ipvs0` as the
/// agent does; over saved dumps (`iptables-save`, `ipset save` text) it follows the dump (our
/// `cali-forward-check` chain is there exactly when the agent ran with IPVS support). The
/// addresses are read from the live node (every address but kube-ipvs0's, with the agent's
/// own reader); over saved dumps nothing else knows them, so the this-host set's members in
/// the dump are taken as they are (the set's existence and type are still checked, its
/// members are not).
pub fn kube_ipvs_mode(
    opts: &RuleOptions,
    cfg: &mut crate::rules::RuleConfig,
    saved: Option<(&str, &str)>,
) -> anyhow::Result<std::collections::BTreeSet<std::net::IpAddr>> {
    use crate::config::IpvsSupport;
    use crate::rules::ipvs::{this_host_set, FORWARD_CHECK_CHAIN};
    let view = match saved {
        None if opts.kube_ipvs_support_enabled != IpvsSupport::Off => {
            Some(crate::host::ipvs::read().context("reading this node's links and addresses")?)
        }
        _ => None,
    };
    let kube_ipvs0 = match (&view, saved) {
        (Some(v), _) => v.present,
        (None, Some((save, _))) => iptables_save::lines(save.as_bytes()).any(
            |l| matches!(l.kind(), SaveLine::Chain { name, .. } if name == FORWARD_CHECK_CHAIN),
        ),
        (None, None) => false,
    };
    let on = opts.apply_kube_ipvs(cfg, kube_ipvs0)?;
    if !on {
        return Ok(Default::default());
    }
    if let Some(v) = view {
        return Ok(v.host_addrs);
    }
    let names = [this_host_set(IpFamily::V4), this_host_set(IpFamily::V6)];
    let mut addrs = std::collections::BTreeSet::new();
    for line in ipset_save::lines(saved.map_or("", |(_, ipsets)| ipsets)) {
        if let SetLine::Add {
            name,
            entry: Some(member),
            ..
        } = line
        {
            if names.iter().any(|n| n == name) {
                // hash:net prints a host address bare; a wider net is no host address and is
                // left out, so audit reports it as a member that should not be there.
                if let Ok(ip) = member.parse() {
                    addrs.insert(ip);
                }
            }
        }
    }
    Ok(addrs)
}

pub fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}
