//! kube-proxy's IPVS mode on this node, at the edge: whether `kube-ipvs0` exists in our
//! network namespace (felix's detection), and this host's addresses without those of
//! `kube-ipvs0` (felix's `InterfaceExclude` default), which feed the this-host set. Plus a
//! watcher that polls both: a change of the mode makes the agent exit (see
//! `docs/design/ipvs.md`), a change of the addresses is handed to the calculation loop.
//!
//! kube-proxy's IPVS mode at each layer: read off the node in `host::ipvs`, detected and
//! watched for `run` in `startup::ipvs`, rendered in `rules::ipvs`, evaluated in
//! `verdict::ipvs`.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::host::netlink::read_local_addresses;
use crate::rules::ipvs::KUBE_IPVS_IFACE;

/// What the node shows of IPVS mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsView {
    /// `kube-ipvs0` exists.
    pub present: bool,
    /// Every address of the namespace except those on `kube-ipvs0`.
    pub host_addrs: BTreeSet<IpAddr>,
}

/// Reads whether `kube-ipvs0` exists and the addresses of the agent's network namespace: one
/// lookup by name and one address dump. Not a link dump: a node with 1500 pods has 1500 veths
/// (about 2 MB of link messages), which every poll would parse for one name.
pub fn read() -> io::Result<IpvsView> {
    let ipvs_index = match nix::net::if_::if_nametoindex(KUBE_IPVS_IFACE) {
        Ok(index) => Some(index),
        Err(nix::errno::Errno::ENODEV) => None,
        Err(e) => return Err(e.into()),
    };
    Ok(IpvsView {
        present: ipvs_index.is_some(),
        host_addrs: read_local_addresses(ipvs_index)?,
    })
}

/// How often the watcher polls (a lookup by name and an address dump).
pub const POLL: Duration = Duration::from_secs(2);

/// Polls the node until `stop`: calls `mode_changed(now_present)` when `kube-ipvs0`
/// appears or disappears, and stops watching when it returns true; `addrs_changed` whenever
/// the host addresses differ from the last ones seen.
pub fn watch(
    mut present: bool,
    mut last: BTreeSet<IpAddr>,
    stop: Arc<AtomicBool>,
    mode_changed: impl Fn(bool) -> bool + Send + 'static,
    addrs_changed: impl Fn(BTreeSet<IpAddr>) + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ipvs-watch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(POLL);
                let Ok(view) = read() else {
                    continue;
                };
                if view.present != present {
                    present = view.present;
                    if mode_changed(view.present) {
                        return;
                    }
                }
                if view.host_addrs != last {
                    last = view.host_addrs.clone();
                    addrs_changed(view.host_addrs);
                }
            }
        })
}
