//! kube-proxy's IPVS mode for `run`: detected once at start (`kube-ipvs0` in our network
//! namespace, felix's detection; the decision itself is `RuleOptions::apply_kube_ipvs`, the
//! one `explain` and `audit` use too), and watched: this host's addresses go to the
//! calculation loop, and under `auto` a change of mode restarts the agent in place.
//!
//! kube-proxy's IPVS mode at each layer: read off the node in `host::ipvs`, detected and
//! watched for `run` in `startup::ipvs`, rendered in `rules::ipvs`, evaluated in
//! `verdict::ipvs`.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use anyhow::Context;
use tracing::{info, warn};

use super::{request_restart, Restart};
use crate::agent::Input;
use crate::config::{IpvsSupport, RuleOptions};
use crate::host::ipvs;
use crate::rules::RuleConfig;

/// kube-proxy's IPVS mode: `auto` follows `kube-ipvs0` in our network namespace, read once
/// here (felix's detection); the effective mode is logged. Also returns what was read.
pub fn kube_ipvs_mode(
    opts: &RuleOptions,
    mut rules: RuleConfig,
) -> anyhow::Result<(RuleConfig, ipvs::IpvsView)> {
    let view = ipvs::read().context("reading links and addresses for IPVS detection")?;
    let setting = opts.kube_ipvs_support_enabled;
    opts.apply_kube_ipvs(&mut rules, view.present)?;
    let on = rules.kube_ipvs.is_some();
    info!(
        kube_ipvs0 = view.present,
        setting = setting.as_str(),
        enabled = on,
        endpoint_mark = rules.kube_ipvs.as_ref().map(|i| format!("{:#x}", i.endpoint.mask)),
        node_port_ranges = %opts.kube_node_port_ranges,
        "kube-proxy IPVS support {}",
        if on { "on" } else { "off" }
    );
    if view.present && setting == IpvsSupport::Off {
        warn!("kube-ipvs0 exists but FELIX_KUBEIPVSSUPPORTENABLED=false: pod traffic to Services is judged in INPUT before IPVS rewrites it, and a local backend's ingress policy is not applied");
    }
    Ok((rules, view))
}

/// Hands this host's addresses to the calculation loop (IPVS on) and watches the node: when
/// `kube-ipvs0` appears or disappears under `auto`, the agent restarts itself in place in the
/// right mode (felix restarts too); the rules stay in place meanwhile, as on any stop.
pub fn watch_kube_ipvs(
    rules: &RuleConfig,
    auto: bool,
    view: ipvs::IpvsView,
    tx: &Sender<Input>,
    stop: &Arc<AtomicBool>,
    restart: &Restart,
) -> anyhow::Result<()> {
    let on = rules.kube_ipvs.is_some();
    let (restart, stop_all) = (restart.clone(), stop.clone());
    if on {
        let _ = tx.send(Input::HostAddresses(
            view.host_addrs.iter().copied().collect(),
        ));
    }
    let addr_tx = std::sync::Mutex::new(tx.clone());
    let started = view.present;
    ipvs::watch(
        started,
        view.host_addrs,
        stop.clone(),
        move |now| {
            if !auto {
                warn!(kube_ipvs0 = now, "kube-ipvs0 {} since start; FELIX_KUBEIPVSSUPPORTENABLED is set, so the rules stay as they are", if now { "appeared" } else { "disappeared" });
                return false;
            }
            let why = format!(
                "kube-ipvs0 {} since start: kube-proxy's mode changed",
                if now { "appeared" } else { "disappeared" }
            );
            warn!(
                kube_ipvs0 = now,
                "{why}; restarting to render the rules for the new mode"
            );
            request_restart(&restart, &stop_all, why);
            true
        },
        move |addrs| {
            if on {
                let _ = addr_tx
                    .lock()
                    .map(|tx| tx.send(Input::HostAddresses(addrs.into_iter().collect())));
            }
        },
    )?;
    Ok(())
}
