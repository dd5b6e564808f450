//! The demo: the example cluster from `examples/` as pods in network namespaces, the real
//! agent on every node, a reachability table before and after the example policies, then
//! everything torn down. Pod addresses are the harness's own (it plays the CNI); labels,
//! nodes and ports come from the manifests.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use netpol_agent::datastore::manifests::{load_paths, K8sObject};

use crate::cluster::{node_name, Cluster, ClusterConfig};
use crate::probe::{self, Job};
use crate::scenario::{Labels, PortDecl, PortKey, Protocol, WorldBuilder, NAMESPACE_NAME_LABEL};

pub struct DemoConfig {
    pub cluster: ClusterConfig,
    pub manifests: PathBuf,
    pub policies: PathBuf,
}

/// (from, to) → the destination ports that answered.
type Reach = BTreeMap<(String, String), BTreeSet<String>>;

pub fn run(cfg: DemoConfig) -> anyhow::Result<()> {
    let (objects, errors) = load_paths(std::slice::from_ref(&cfg.manifests))?;
    if let Some(e) = errors.first() {
        bail!("{e}");
    }
    let node_names: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| match o {
            K8sObject::Pod(p) => p.spec.as_ref().and_then(|s| s.node_name.clone()),
            _ => None,
        })
        .collect();
    let node_index = |name: &Option<String>| {
        name.as_ref()
            .and_then(|n| node_names.iter().position(|m| m == n))
            .unwrap_or(0)
    };
    let mut builder = WorldBuilder::new(node_names.len().max(1));
    for o in &objects {
        if let K8sObject::Namespace(ns) = o {
            let mut labels: Labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.remove(NAMESPACE_NAME_LABEL);
            builder.namespace(ns.metadata.name.as_deref().unwrap_or_default(), labels)?;
        }
    }
    for o in &objects {
        if let K8sObject::Pod(p) = o {
            let key = format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.metadata.name.as_deref().unwrap_or_default()
            );
            let spec = p.spec.clone().unwrap_or_default();
            let mut ports = Vec::new();
            for c in &spec.containers {
                for port in c.ports.iter().flatten() {
                    ports.push(PortDecl {
                        name: port.name.clone(),
                        port: u16::try_from(port.container_port)
                            .with_context(|| format!("{key}: port {}", port.container_port))?,
                        protocol: Protocol::parse(port.protocol.as_deref().unwrap_or("TCP"))
                            .unwrap_or(Protocol::Tcp),
                    });
                }
            }
            builder.pod(
                &key,
                p.metadata.labels.clone().unwrap_or_default(),
                node_index(&spec.node_name),
                ports,
            )?;
        }
    }
    let before = builder.world.clone();
    let policy_text = std::fs::read_to_string(&cfg.policies)
        .with_context(|| format!("reading {}", cfg.policies.display()))?;
    builder.apply(&policy_text)?;
    let after = builder.world.clone();

    let nodes = node_names.len().max(1);
    println!(
        "== {} pods on {nodes} simulated nodes (network namespaces; the harness plays the CNI and kube-proxy)",
        before.pods.len()
    );
    for pod in before.pods.values() {
        let ports: Vec<String> = pod.ports.iter().map(|p| p.port.to_string()).collect();
        println!(
            "   {:<22} {}  pod IP {:<12} ClusterIP {:<12} serves {}",
            pod.key(),
            node_name(pod.node),
            pod.ip,
            pod.cluster_ip,
            if ports.is_empty() {
                "nothing".to_string()
            } else {
                ports.join(", ")
            }
        );
    }
    let tag = format!("demo-{}", std::process::id());
    let mut cluster = Cluster::new(cfg.cluster, nodes, &tag)?;
    cluster.sync(&before)?;
    cluster.start_agents()?;
    converge(&mut cluster)?;
    let open = reach(&cluster);
    println!(
        "\n== reachability with no policy (cell: ports that answered, via each pod's ClusterIP)"
    );
    print!("{}", table(&cluster, &open, None));

    println!(
        "\n== applying {} ({} policies: {})",
        cfg.policies.display(),
        after.policies.len(),
        after
            .policies
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    cluster.sync(&after)?;
    let took = converge(&mut cluster)?;
    println!(
        "   every node's kernel matches the compiled rules after {} ms",
        took.as_millis()
    );
    let enforced = reach(&cluster);
    println!("\n== reachability with the policies (* = changed)");
    print!("{}", table(&cluster, &enforced, Some(&open)));
    let closed: usize = open
        .iter()
        .map(|(pair, ports)| {
            ports
                .difference(enforced.get(pair).unwrap_or(&BTreeSet::new()))
                .count()
        })
        .sum();
    let opened: usize = enforced
        .iter()
        .map(|(pair, ports)| {
            ports
                .difference(open.get(pair).unwrap_or(&BTreeSet::new()))
                .count()
        })
        .sum();
    println!("\n{closed} pod-to-port paths closed, {opened} opened; tearing down");
    drop(cluster);
    println!("demo done: every namespace it made is gone");
    Ok(())
}

fn converge(cluster: &mut Cluster) -> anyhow::Result<Duration> {
    cluster
        .wait_converged()
        .map_err(|e| anyhow::anyhow!("the agents did not converge: {e}"))
}

fn reach(cluster: &Cluster) -> Reach {
    let mut jobs = Vec::new();
    for from in cluster.pods.values() {
        for to in cluster.pods.values() {
            if from.pod.uid == to.pod.uid {
                continue;
            }
            for p in &to.pod.ports {
                jobs.push(Job {
                    key: PortKey {
                        protocol: p.protocol,
                        port: p.port,
                    },
                    from: from.pod.key(),
                    from_netns: from.handle.clone(),
                    to: to.pod.key(),
                    to_uid: to.pod.uid,
                    addr: std::net::IpAddr::V4(to.pod.cluster_ip),
                });
            }
        }
    }
    let (observed, _) = probe::run(jobs, 32, Duration::from_millis(800), &cluster.sctp);
    let mut out = Reach::new();
    for ((_, key), results) in observed {
        for ((from, to), outcome) in results {
            let entry = out.entry((from, to)).or_default();
            if outcome.connected() {
                entry.insert(key.port.to_string());
            }
        }
    }
    out
}

fn table(cluster: &Cluster, reach: &Reach, before: Option<&Reach>) -> String {
    let pods: Vec<String> = cluster.pods.keys().cloned().collect();
    let cell = |from: &str, to: &str| -> String {
        if from == to {
            return "#".into();
        }
        let pair = (from.to_string(), to.to_string());
        let serves = !cluster.pods[to].pod.ports.is_empty();
        let now = reach.get(&pair).cloned().unwrap_or_default();
        let mut text = if !serves {
            "".to_string()
        } else if now.is_empty() {
            "X".to_string()
        } else {
            now.iter().cloned().collect::<Vec<_>>().join(",")
        };
        if let Some(before) = before {
            if before.get(&pair).cloned().unwrap_or_default() != now {
                text.push('*');
            }
        }
        text
    };
    let width = pods
        .iter()
        .map(String::len)
        .chain(
            pods.iter()
                .flat_map(|f| pods.iter().map(move |t| (f, t)))
                .map(|(f, t)| cell(f, t).len()),
        )
        .max()
        .unwrap_or(1);
    let mut s = format!("   {:width$}", "from \\ to");
    for to in &pods {
        let _ = write!(s, " {to:width$}");
    }
    s.push('\n');
    for from in &pods {
        let _ = write!(s, "   {from:width$}");
        for to in &pods {
            let _ = write!(s, " {:width$}", cell(from, to));
        }
        s.push('\n');
    }
    s
}
