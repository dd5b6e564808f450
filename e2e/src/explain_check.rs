//! `run --check-explain`: for every probe of a step, the verdict `netpol-agent explain`
//! computes from that step's objects (the manifests the agents read, evaluated with the
//! agent's own `verdict` library for the post-DNAT pod-to-pod flow) must equal both the
//! expectation and what the packets did. A probe to a port the destination does not serve
//! cannot connect whatever the policies say: there the explain side is "no server".

use std::fmt::Write as _;

use anyhow::Context;
use netpol_agent::datastore::manifests;
use netpol_agent::model::{IpFamily, ObjectKey, Protocol as ModelProtocol};
use netpol_agent::rules::RuleConfig;
use netpol_agent::verdict::{Endpoint, Flow, State};

use crate::cluster::Cluster;
use crate::expect::Observed;
use crate::family::family_name;
use crate::probe::Results;
use crate::scenario::{PortKey, Protocol, Step};

/// Disagreements shown in full; the rest are counted.
const SHOWN: usize = 4;

fn protocol(p: Protocol) -> ModelProtocol {
    match p {
        Protocol::Tcp => ModelProtocol::Tcp,
        Protocol::Udp => ModelProtocol::Udp,
        Protocol::Sctp => ModelProtocol::Sctp,
    }
}

fn key(text: &str) -> ObjectKey {
    let (ns, name) = text.split_once('/').unwrap_or(("default", text));
    ObjectKey::new(ns, name)
}

/// The step's objects as `netpol-agent explain` reads them: the manifests the agents read,
/// validated into the agent's own evaluator (shared with `--check-flow-logs`).
pub fn load_state(cluster: &Cluster) -> anyhow::Result<State> {
    let (objects, errors) = manifests::load_paths(&[cluster.manifests().to_path_buf()])
        .context("reading the step's manifests")?;
    anyhow::ensure!(
        errors.is_empty(),
        "the step's manifests do not parse: {errors:?}"
    );
    let (state, invalid) = State::from_objects(RuleConfig::default(), &objects);
    anyhow::ensure!(
        invalid.is_empty(),
        "the step's objects do not validate: {invalid:?}"
    );
    Ok(state)
}

/// The flow explain is asked about for one probe: the post-DNAT pod-to-pod flow between the
/// two pods' addresses of `family` (by pod name on an IPv4-only cluster, where a name is
/// unambiguous).
pub fn probe_flow(
    cluster: &Cluster,
    family: IpFamily,
    from: &str,
    to: &str,
    pk: &PortKey,
) -> anyhow::Result<Flow> {
    let families = cluster.families();
    let addr = |pod: &str| -> anyhow::Result<Endpoint> {
        let p = cluster
            .pods
            .get(pod)
            .with_context(|| format!("pod {pod} is not in the cluster"))?;
        Ok(if families.len() == 1 && family == IpFamily::V4 {
            Endpoint::Pod(key(pod))
        } else {
            Endpoint::Ip(p.pod.addr(family))
        })
    };
    Ok(Flow {
        src: addr(from)?,
        dst: addr(to)?,
        protocol: protocol(pk.protocol),
        port: pk.port,
    })
}

/// Every probe whose explain verdict differs from the expectation or from the packets,
/// described with both answers (empty when all agree).
pub fn check(cluster: &Cluster, step: &Step, observed: &Results) -> anyhow::Result<Vec<String>> {
    let state = load_state(cluster)?;
    let mut out = Vec::new();
    let mut more = 0;
    let families = cluster.families();
    for &family in families {
        for (pk, table) in &step.expect {
            let empty = Observed::new();
            let seen = observed.get(&(family, *pk)).unwrap_or(&empty);
            for (from, to, expected) in table.pairs() {
                let served = cluster.pods.get(to).is_some_and(|p| {
                    p.pod
                        .ports
                        .iter()
                        .any(|d| d.protocol == pk.protocol && d.port == pk.port)
                });
                let flow = probe_flow(cluster, family, from, to, pk)?;
                let resolved = state
                    .resolve(&flow)
                    .with_context(|| format!("explain {from} -> {to} {pk}"))?;
                let allowed = state.allowed(&resolved);
                let explain = allowed && served;
                let packets = seen
                    .get(&(from.to_string(), to.to_string()))
                    .map(|o| o.connected());
                if explain == expected && packets.is_none_or(|p| p == explain) {
                    continue;
                }
                if out.len() >= SHOWN {
                    more += 1;
                    continue;
                }
                let mut text = format!(
                "explain disagrees ({}): {from} -> {to} {pk}: explain {}{}, expected {}, packets {}\n",
                family_name(family),
                if explain { "allow" } else { "deny" },
                if allowed && !served {
                    " (policies allow, but the destination serves no such port)"
                } else {
                    ""
                },
                if expected { "allow" } else { "deny" },
                match packets {
                    Some(true) => "connected",
                    Some(false) => "blocked",
                    None => "not probed",
                }
            );
                for line in state.explain(&resolved).to_text().lines() {
                    let _ = writeln!(text, "  {line}");
                }
                out.push(text);
            }
        }
    }
    if more > 0 {
        out.push(format!(
            "... and {more} more probe(s) where explain disagrees\n"
        ));
    }
    Ok(out)
}
