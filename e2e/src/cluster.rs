//! One simulated cluster: node namespaces joined by an underlay bridge, pod namespaces wired
//! to their node the way the chosen CNI does it, kube-proxy's ClusterIP DNAT (iptables or
//! nftables mode) and kubelet's chains on every node, the manifests kubelet and the CNI
//! would have produced in a directory, and a real `netpol-agent run` per node reading it.
//! Every address exists in each family of `--ip-family` (IPv6 ones through the embedding of
//! `family`), and the convergence check compares every family the agents program. Dropping the cluster removes all of it: servers
//! first (their sockets pin namespaces), then agents, pods, nodes, the underlay and the
//! directory — also when a step failed or the run was interrupted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use netpol_agent::dataplane::owned::OwnedState;
use netpol_agent::model::IpFamily;
use serde_json::json;

use crate::cni::{Cni, Wiring, BRIDGE};
use crate::family::{addr_of, family_name, net_of, FamilyMode};
use crate::netns::{Netns, PREFIX};
use crate::runtime::NodeRuntime;
use crate::scenario::{node_pod_cidr, service_cidr, Pod, World};
use crate::servers::{PodServers, SctpLog};
use crate::services::{self, Service, ServiceProxy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Nft,
    Legacy,
}

impl Backend {
    /// `iptables-nft-save`, `ip6tables-legacy-restore`, ... for `family`.
    pub fn tool_for(self, family: IpFamily, action: &str) -> String {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        match self {
            Backend::Nft => format!("{base}-nft-{action}"),
            Backend::Legacy => format!("{base}-legacy-{action}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub agent: PathBuf,
    pub cni: Cni,
    pub backend: Backend,
    pub converge_timeout: Duration,
    /// Deny logging on in every node (`--check-deny-logs`): `run` and `compile` render the
    /// NFLOG rules, the agents log JSON.
    pub deny_logs: bool,
    /// Flow logs on in every node (`--check-flow-logs`): `run` and `compile` render the
    /// flow-log rules, the agents serve `GET /flows` on their health server
    /// ([`FLOWS_PORT`], loopback of the node's namespace).
    pub flow_logs: bool,
    /// The families of pods, ClusterIPs and the underlay.
    pub family: FamilyMode,
    /// Who DNATs ClusterIPs: kube-proxy's iptables or nftables mode.
    pub proxy: ServiceProxy,
    /// Raw TCP/UDP observers in every pod, for the spoofing check (`--check-spoofing`).
    pub spoof_observers: bool,
    /// The agents' anti-spoofing (`FELIX_WORKLOADSOURCESPOOFING=Disabled`, their default);
    /// off only to show what the spoofing check catches without it.
    pub source_check: bool,
    /// The agents run with no CNI setting at all (`FELIX_INTERFACENAMESCHEME=auto`, no
    /// prefix, bridge or runtime), as the shipped DaemonSet does; `compile` still gets the
    /// truth, so convergence proves the detection right.
    pub auto_wiring: bool,
    /// FELIX_POLICYUNIONMIN for the agents and `compile` (`None`: their default).
    pub policy_union_min: Option<usize>,
}

struct Node {
    name: String,
    /// The container runtime's CRI endpoint on this node (`--cni sandbox`).
    runtime: Option<NodeRuntime>,
    netns: Netns,
    agent: Option<Child>,
    log: PathBuf,
}

pub struct PodNet {
    pub pod: Pod,
    pub handle: Arc<File>,
    servers: PodServers,
    /// Held so the namespace is deleted when the pod goes (after its servers stopped).
    _netns: Netns,
}

pub struct Cluster {
    tag: String,
    cfg: ClusterConfig,
    work: PathBuf,
    manifests: PathBuf,
    fabric: Option<Netns>,
    nodes: Vec<Node>,
    pub pods: BTreeMap<String, PodNet>,
    written: World,
    pub sctp: Arc<SctpLog>,
    /// Tags of the spoofing check's packets the pods' observers saw.
    pub spoof_tags: Arc<crate::tags::TagLog>,
    /// Pods whose kube-proxy chains exist (iptables mode deletes the chains of pods gone);
    /// `None` before kube-proxy's first write.
    proxied: Option<std::collections::BTreeSet<usize>>,
}

/// The bridge address of node `i` in `--cni bridge`, the pods' gateway.
fn bridge_gateway(node: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 244, node as u8, 1)
}

/// The node's address on the underlay (`/24`, embedded for IPv6 like every address).
fn underlay_ip(node: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(192, 168, 200, node as u8 + 1)
}

/// The prefix length of a `/24` of the IPv4 plan in `family`.
fn len24(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 24,
        IpFamily::V6 => 120,
    }
}

/// `ip` keeps IPv6 addresses tentative for a second of duplicate address detection unless
/// told not to; on links of our own making there is nothing to detect.
fn nodad(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "",
        IpFamily::V6 => " nodad",
    }
}

/// "Everything" in `family`, spelled so that `ip -batch` (which takes no `-4`/`-6` per line)
/// picks the family from it.
fn any_dst(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "0.0.0.0/0",
        IpFamily::V6 => "::/0",
    }
}

/// A host route's prefix length in `family`.
fn host_len(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    }
}

/// The link-local address the kernel gave `iface` (once both veth ends are up; read the
/// way Calico's plugin reads it, retrying briefly while it appears).
fn host_link_local(netns: &Netns, iface: &str) -> anyhow::Result<std::net::Ipv6Addr> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let out = netns.exec_ok(
            "ip",
            &["-6", "-o", "addr", "show", "dev", iface, "scope", "link"],
            None,
        )?;
        let found = out.split_whitespace().skip_while(|w| *w != "inet6").nth(1);
        if let Some(addr) = found.and_then(|a| a.split('/').next()?.parse().ok()) {
            return Ok(addr);
        }
        if Instant::now() > deadline {
            bail!("{iface} in {} has no IPv6 link-local address", netns.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Calico's host-side veth MAC (every host veth has it; the pods' neighbour entries for
/// their gateway point at it).
const CALICO_HOST_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// IPv6 in a namespace we just made: no duplicate address detection on its links (Calico's
/// CNI plugin turns it off on both veth ends; our underlay and bridges are ours alone).
fn ipv6_namespace_defaults(netns: &Netns) -> anyhow::Result<()> {
    for key in [
        "net/ipv6/conf/all/disable_ipv6",
        "net/ipv6/conf/default/disable_ipv6",
    ] {
        netns.sysctl(key, "0")?;
    }
    for key in [
        "net/ipv6/conf/all/accept_dad",
        "net/ipv6/conf/default/accept_dad",
    ] {
        netns.sysctl(key, "0")?;
    }
    Ok(())
}

/// The agents' health server port inside each node's namespace, where `GET /flows` answers
/// (`--check-flow-logs`); every node has a namespace of its own, so one port serves all.
pub const FLOWS_PORT: u16 = 9099;

pub fn node_name(node: usize) -> String {
    format!("node-{node}")
}

impl Cluster {
    /// Who DNATs the ClusterIPs.
    pub fn service_proxy(&self) -> ServiceProxy {
        self.cfg.proxy
    }

    /// The IP families of the cluster's pods.
    pub fn families(&self) -> &'static [IpFamily] {
        self.cfg.family.families()
    }

    /// Makes the nodes and the underlay; no pods, no agents yet.
    pub fn new(cfg: ClusterConfig, nodes: usize, tag: &str) -> anyhow::Result<Cluster> {
        let tag = format!("{PREFIX}{tag}");
        let work = std::env::temp_dir().join(&tag);
        let manifests = work.join("manifests");
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("creating {}", manifests.display()))?;
        let mut cluster = Cluster {
            tag,
            cfg,
            work,
            manifests,
            fabric: None,
            nodes: Vec::new(),
            pods: BTreeMap::new(),
            written: World::default(),
            sctp: Arc::new(SctpLog::default()),
            spoof_tags: Arc::new(crate::tags::TagLog::default()),
            proxied: None,
        };
        let families = cluster.cfg.family.families();
        let v6 = cluster.cfg.family.has(IpFamily::V6);
        for i in 0..nodes {
            let netns = Netns::create(&format!("{}-n{i}", cluster.tag))?;
            for (key, value) in [
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", "0"),
                ("net/ipv4/conf/default/rp_filter", "0"),
            ] {
                netns.sysctl(key, value)?;
            }
            if v6 {
                ipv6_namespace_defaults(&netns)?;
                netns.sysctl("net/ipv6/conf/all/forwarding", "1")?;
            }
            // A default route out of a port-less bridge (no dummy module here): proxy ARP
            // answers for 169.254.1.1 only
            // when the node routes it elsewhere, as a real node's default route does.
            let mut lines = String::from("link add dummy0 type bridge\nlink set dummy0 up\n");
            for &f in families {
                let _ = writeln!(lines, "route add {} dev dummy0", any_dst(f));
            }
            netns.ip_batch(&lines)?;
            match cluster.cfg.cni.wiring() {
                Wiring::Routed { table: Some(table) } => {
                    // `from all` is IPv4 unless `ip` is told the family (`-batch` lines
                    // take no `-6`, and `from ::/0` is read as IPv4 "all" too).
                    for &f in families {
                        let flag = match f {
                            IpFamily::V4 => "-4",
                            IpFamily::V6 => "-6",
                        };
                        let table = table.to_string();
                        netns.exec_ok(
                            "ip",
                            &[
                                flag, "rule", "add", "from", "all", "lookup", &table, "pref", "1",
                            ],
                            None,
                        )?;
                    }
                }
                Wiring::Routed { table: None } => {}
                Wiring::Bridged => {
                    // The bridge plugin pins the bridge's MAC: left alone, a Linux bridge
                    // takes the lowest MAC of its ports and changes it as pods come and go,
                    // and the pods' neighbour entries for their gateway go stale (replies
                    // leaving the node blackholed until the entries are re-probed).
                    let gateway = bridge_gateway(i).octets();
                    let mut lines = format!(
                        "link add {BRIDGE} address 0a:58:{:02x}:{:02x}:{:02x}:{:02x} type bridge\n",
                        gateway[0], gateway[1], gateway[2], gateway[3]
                    );
                    for &f in families {
                        let _ = writeln!(
                            lines,
                            "addr add {}/{} dev {BRIDGE}{}",
                            addr_of(bridge_gateway(i), f),
                            len24(f),
                            nodad(f)
                        );
                    }
                    lines.push_str(&format!("link set {BRIDGE} up\n"));
                    netns.ip_batch(&lines)?;
                    // Bridged frames must traverse iptables (br_netfilter, per namespace).
                    netns.sysctl("net/bridge/bridge-nf-call-iptables", "1")?;
                    if v6 {
                        netns.sysctl("net/bridge/bridge-nf-call-ip6tables", "1")?;
                    }
                }
            }
            // kubelet's chains, in both families whatever the cluster's: kubelet makes them
            // for IPv4 and IPv6 at start.
            for f in [IpFamily::V4, IpFamily::V6] {
                netns.exec_ok(
                    &cluster.cfg.backend.tool_for(f, "restore"),
                    &["--noflush"],
                    Some(&services::kubelet_restore(f)),
                )?;
            }
            if cluster.cfg.proxy == ServiceProxy::Ipvs {
                ipvs_node(&netns, &cluster.cfg, families)?;
            }
            cluster.nodes.push(Node {
                name: node_name(i),
                log: cluster.work.join(format!("agent-{}.log", node_name(i))),
                runtime: match cluster.cfg.cni {
                    Cni::Sandbox => Some(NodeRuntime::start(
                        &cluster.work.join(format!("cri-{}.sock", node_name(i))),
                    )?),
                    _ => None,
                },
                netns,
                agent: None,
            });
        }
        if nodes > 1 {
            let fabric = Netns::create(&format!("{}-fab", cluster.tag))?;
            fabric.ip_batch("link add br0 type bridge\nlink set br0 up\n")?;
            for (i, node) in cluster.nodes.iter().enumerate() {
                fabric.ip_batch(&format!(
                    "link add ul{i} type veth peer name eth0 netns {}\nlink set ul{i} master br0\nlink set ul{i} up\n",
                    node.netns.name
                ))?;
                let mut lines = String::new();
                for &f in families {
                    let _ = writeln!(
                        lines,
                        "addr add {}/{} dev eth0{}",
                        addr_of(underlay_ip(i), f),
                        len24(f),
                        nodad(f)
                    );
                }
                lines.push_str("link set eth0 up\n");
                for j in (0..nodes).filter(|j| *j != i) {
                    for &f in families {
                        let _ = writeln!(
                            lines,
                            "route add {} via {} dev eth0",
                            net_of(node_pod_cidr(j), f),
                            addr_of(underlay_ip(j), f)
                        );
                    }
                }
                node.netns.ip_batch(&lines)?;
            }
            cluster.fabric = Some(fabric);
        }
        Ok(cluster)
    }

    /// Starts `netpol-agent run` in every node namespace.
    pub fn start_agents(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            let log = File::create(&node.log)?;
            let mut cmd = node.netns.command(&self.cfg.agent.to_string_lossy());
            cmd.args(["run", "--datastore"])
                .arg(format!("dir:{}", self.manifests.display()))
                .args(["--node", &node.name])
                .envs(agent_env(&self.cfg, node))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            node.agent = Some(cmd.spawn().context("starting netpol-agent")?);
        }
        Ok(())
    }

    /// Starts `netpol-agent run` on node `i` alone, with `extra` environment, in a process
    /// group of its own (so `kill_agent` takes the tools it runs with it, as a container's
    /// end does), its log appended to what earlier runs on that node wrote (chaos harness).
    pub fn start_agent(&mut self, i: usize, extra: &[(String, String)]) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let mut cmd = node.netns.command(&self.cfg.agent.to_string_lossy());
        cmd.args(["run", "--datastore"])
            .arg(format!("dir:{}", self.manifests.display()))
            .args(["--node", &node.name])
            .envs(agent_env(&self.cfg, node))
            .envs(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        node.agent = Some(cmd.spawn().context("starting netpol-agent")?);
        Ok(())
    }

    /// SIGKILL to node `i`'s agent and every process of its group (started by
    /// `start_agent`), reaped.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut agent) = self.nodes[i].agent.take() {
            let group = nix::unistd::Pid::from_raw(agent.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = agent.wait();
        }
    }

    /// The process id of node `i`'s agent, while it runs.
    pub fn agent_pid(&mut self, i: usize) -> Option<u32> {
        let agent = self.nodes[i].agent.as_mut()?;
        match agent.try_wait() {
            Ok(None) => Some(agent.id()),
            _ => None,
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_netns(&self, i: usize) -> &Netns {
        &self.nodes[i].netns
    }

    /// The cluster's scratch directory (removed with the cluster).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    pub fn manifests_dir(&self) -> &Path {
        &self.manifests
    }

    /// Writes every manifest of `target` again, as if none had been written (after the
    /// directory was removed).
    pub fn rewrite_all(&mut self, target: &World) -> anyhow::Result<()> {
        self.written = World::default();
        self.sync(target)
    }

    /// What `compile` says node `i` must hold, per family the agents program.
    pub fn want(&self, i: usize) -> anyhow::Result<Vec<OwnedState>> {
        let node = &self.nodes[i];
        self.cfg
            .family
            .agent_families()
            .iter()
            .map(|&f| self.compiled(node, f))
            .collect()
    }

    /// What node `i`'s kernel holds of ours, per family the agents program.
    pub fn have(&self, i: usize) -> anyhow::Result<Vec<OwnedState>> {
        let node = &self.nodes[i];
        self.cfg
            .family
            .agent_families()
            .iter()
            .map(|&f| observed(&self.cfg, &node.netns, f))
            .collect()
    }

    pub fn agent_log_tail(&self, i: usize, lines: usize) -> String {
        log_tail(&self.nodes[i].log, lines)
    }

    /// Brings pods, manifests and DNAT to `target`.
    pub fn sync(&mut self, target: &World) -> anyhow::Result<()> {
        let ns_dir = self.manifests.join("namespaces");
        let pod_dir = self.manifests.join("pods");
        let policy_dir = self.manifests.join("policies");
        let cluster_policy_dir = self.manifests.join("clusternetworkpolicies");
        for d in [&ns_dir, &pod_dir, &policy_dir, &cluster_policy_dir] {
            std::fs::create_dir_all(d)?;
        }
        for (name, labels) in &target.namespaces {
            if self.written.namespaces.get(name) != Some(labels) {
                let doc = json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels}});
                write_atomic(&ns_dir.join(format!("{name}.yaml")), &to_yaml(&doc)?)?;
            }
        }
        let mut pods_changed = false;
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(k, p)| target.pods.get(*k).is_none_or(|t| t.uid != p.pod.uid))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            remove_if_present(&pod_dir.join(file_name(&key)))?;
            if let Some(mut net) = self.pods.remove(&key) {
                net.servers.stop();
                if let Some(runtime) = self.nodes[net.pod.node].runtime.as_ref() {
                    runtime.remove_pod(&self.tag, &net.pod)?;
                }
            }
            pods_changed = true;
        }
        for (key, pod) in &target.pods {
            if !self.pods.contains_key(key) {
                self.add_pod(pod)?;
                pods_changed = true;
            }
            if self.written.pods.get(key) != Some(pod) {
                let doc = self.pod_manifest(pod);
                write_atomic(&pod_dir.join(file_name(key)), &to_yaml(&doc)?)?;
            }
        }
        for (key, doc) in &target.policies {
            if self.written.policies.get(key) != Some(doc) {
                // Scenario addresses are IPv4; the cluster's families decide what the
                // ipBlocks become (see `family`).
                let doc = crate::family::rewrite_policy(doc, self.cfg.family)
                    .with_context(|| format!("policy {key}"))?;
                write_atomic(&policy_dir.join(file_name(key)), &doc)?;
            }
        }
        for key in self.written.policies.keys() {
            if !target.policies.contains_key(key) {
                remove_if_present(&policy_dir.join(file_name(key)))?;
            }
        }
        for (name, doc) in &target.cluster_policies {
            if self.written.cluster_policies.get(name) != Some(doc) {
                // As for ipBlocks: the networks peers follow the cluster's families.
                let doc = crate::family::rewrite_cluster_policy(doc, self.cfg.family)
                    .with_context(|| format!("ClusterNetworkPolicy {name}"))?;
                write_atomic(&cluster_policy_dir.join(format!("{name}.yaml")), &doc)?;
            }
        }
        for name in self.written.cluster_policies.keys() {
            if !target.cluster_policies.contains_key(name) {
                remove_if_present(&cluster_policy_dir.join(format!("{name}.yaml")))?;
            }
        }
        for name in self.written.namespaces.keys() {
            if !target.namespaces.contains_key(name) {
                remove_if_present(&ns_dir.join(format!("{name}.yaml")))?;
            }
        }
        if pods_changed || self.written.pods.is_empty() {
            self.write_services()?;
            self.write_interface_map()?;
        }
        self.written = target.clone();
        Ok(())
    }

    fn add_pod(&mut self, pod: &Pod) -> anyhow::Result<()> {
        let node = &self.nodes[pod.node];
        let families = self.cfg.family.families();
        let has_v4 = self.cfg.family.has(IpFamily::V4);
        let has_v6 = self.cfg.family.has(IpFamily::V6);
        let netns = Netns::create(&format!("{}-p{}", self.tag, pod.uid))?;
        if has_v6 {
            ipv6_namespace_defaults(&netns)?;
        }
        let iface = self.cfg.cni.host_iface(&self.tag, pod);
        match self.cfg.cni.wiring() {
            Wiring::Routed { table } => {
                // What Calico's CNI plugin does (hybridnet and the sandbox scheme route
                // alike): host veth with Calico's MAC, a host route per pod address (/32,
                // /128) to it; IPv4: proxy ARP answers for the 169.254.1.1 gateway; IPv6:
                // the pod's default route goes via the host veth's own link-local address,
                // which the host answers neighbour solicitations for.
                let table = table.map(|t| format!(" table {t}")).unwrap_or_default();
                node.netns.ip_batch(&format!(
                    "link add {iface} type veth peer name eth0 netns {pod_ns}\n\
                     link set {iface} address {CALICO_HOST_MAC}\n",
                    pod_ns = netns.name,
                ))?;
                if has_v4 {
                    node.netns
                        .sysctl(&format!("net/ipv4/conf/{iface}/proxy_arp"), "1")?;
                    node.netns
                        .sysctl(&format!("net/ipv4/neigh/{iface}/proxy_delay"), "0")?;
                }
                if has_v6 {
                    for (key, value) in [
                        ("disable_ipv6", "0"),
                        ("accept_dad", "0"),
                        ("proxy_ndp", "1"),
                        ("forwarding", "1"),
                        ("accept_ra", "0"),
                    ] {
                        node.netns
                            .sysctl(&format!("net/ipv6/conf/{iface}/{key}"), value)?;
                    }
                }
                let mut host = format!("link set {iface} up\n");
                for &f in families {
                    let _ = writeln!(
                        host,
                        "route add {}/{} dev {iface}{table}",
                        pod.addr(f),
                        host_len(f)
                    );
                }
                node.netns.ip_batch(&host)?;
                let mut inside = String::new();
                for &f in families {
                    let _ = writeln!(
                        inside,
                        "addr add {}/{} dev eth0{}",
                        pod.addr(f),
                        host_len(f),
                        nodad(f)
                    );
                }
                inside.push_str("link set eth0 up\n");
                if has_v4 {
                    inside.push_str(
                        "route add 169.254.1.1 dev eth0 scope link\n\
                         route add default via 169.254.1.1 dev eth0\n",
                    );
                }
                netns.ip_batch(&inside)?;
                if has_v6 {
                    // As the plugin does: the gateway is whatever link-local address the
                    // host veth has once both ends are up.
                    let gateway = host_link_local(&node.netns, &iface)?;
                    netns.ip_batch(&format!("route add ::/0 via {gateway} dev eth0\n"))?;
                }
            }
            Wiring::Bridged => {
                node.netns.ip_batch(&format!(
                    "link add {iface} type veth peer name eth0 netns {pod_ns}\n\
                     link set {iface} master {BRIDGE}\n\
                     link set {iface} up\n",
                    pod_ns = netns.name
                ))?;
                // flannel's bridge plugin: the pod in the node's subnet (/24, or its /120
                // embedding) with the bridge's address of the family as the gateway.
                let mut inside = String::new();
                for &f in families {
                    let _ = writeln!(
                        inside,
                        "addr add {}/{} dev eth0{}",
                        pod.addr(f),
                        len24(f),
                        nodad(f)
                    );
                }
                inside.push_str("link set eth0 up\n");
                for &f in families {
                    let _ = writeln!(
                        inside,
                        "route add {} via {} dev eth0",
                        any_dst(f),
                        addr_of(bridge_gateway(pod.node), f)
                    );
                }
                netns.ip_batch(&inside)?;
            }
        }
        if let Some(runtime) = self.nodes[pod.node].runtime.as_ref() {
            runtime.add_pod(&self.tag, pod)?;
        }
        let handle = Arc::new(netns.handle.try_clone()?);
        let observers = self.cfg.spoof_observers.then(|| self.spoof_tags.clone());
        let servers =
            PodServers::start(&netns.handle, pod, families, self.sctp.clone(), observers)?;
        self.pods.insert(
            pod.key(),
            PodNet {
                pod: pod.clone(),
                handle,
                servers,
                _netns: netns,
            },
        );
        Ok(())
    }

    fn pod_manifest(&self, pod: &Pod) -> serde_json::Value {
        let ips: Vec<String> = self
            .cfg
            .family
            .families()
            .iter()
            .map(|&f| pod.addr(f).to_string())
            .collect();
        // One container per port, as upstream's model does, with named container ports.
        let containers: Vec<serde_json::Value> = pod
            .ports
            .iter()
            .map(|p| {
                let proto = p.protocol.as_str();
                let mut port = json!({"containerPort": p.port, "protocol": proto});
                if let Some(name) = &p.name {
                    port["name"] = json!(name);
                }
                json!({"name": format!("cont-{}-{}", p.port, proto.to_ascii_lowercase()),
                       "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                       "ports": [port]})
            })
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": format!("00000000-0000-4000-8000-{:012}", pod.uid),
                "labels": pod.labels,
            },
            "spec": {"nodeName": node_name(pod.node), "containers": containers},
            "status": {"phase": "Running", "podIP": ips[0],
                       "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
        })
    }

    /// The pod → interface map `compile` uses to know what every node must hold.
    fn write_interface_map(&self) -> anyhow::Result<()> {
        let mut map = String::new();
        for net in self.pods.values() {
            let _ = writeln!(
                map,
                "\"{}\": {}",
                net.pod.key(),
                self.cfg.cni.host_iface(&self.tag, &net.pod)
            );
        }
        write_atomic(&self.work.join("interfaces.yaml"), &map)
    }

    /// kube-proxy's part: a ClusterIP per pod and family, DNATed to the pod for each port it
    /// serves, from pods and from the node, on every node (see `services`).
    fn write_services(&mut self) -> anyhow::Result<()> {
        let uids: std::collections::BTreeSet<usize> =
            self.pods.values().map(|n| n.pod.uid).collect();
        let first = self.proxied.is_none();
        let removed: Vec<usize> = self
            .proxied
            .as_ref()
            .map(|before| before.difference(&uids).copied().collect())
            .unwrap_or_default();
        let mut all = Vec::new();
        for &family in self.cfg.family.families() {
            let list: Vec<Service> = self
                .pods
                .values()
                .map(|net| Service {
                    name: net.pod.key(),
                    uid: net.pod.uid,
                    cluster_ip: addr_of(net.pod.cluster_ip, family),
                    backend: net.pod.addr(family),
                    ports: net.pod.ports.iter().map(|p| (p.protocol, p.port)).collect(),
                })
                .collect();
            for node in &self.nodes {
                match self.cfg.proxy {
                    ServiceProxy::Iptables => {
                        let script = services::kube_proxy_iptables(family, &list, &removed, first);
                        node.netns.exec_ok(
                            &self.cfg.backend.tool_for(family, "restore"),
                            &["--noflush"],
                            Some(&script),
                        )?;
                    }
                    ServiceProxy::Nftables => {
                        let script =
                            services::kube_proxy_nft(family, &list, net_of(service_cidr(), family));
                        node.netns.exec_ok("nft", &["-f", "-"], Some(&script))?;
                    }
                    ServiceProxy::Ipvs => {
                        let script = services::kube_proxy_ipvs_sets(family, &list);
                        node.netns.exec_ok("ipset", &["restore"], Some(&script))?;
                    }
                }
            }
            all.extend(list);
        }
        if self.cfg.proxy == ServiceProxy::Ipvs {
            // Both families at once: one `kube-ipvs0`, one IPVS table.
            for node in &self.nodes {
                node.netns.ip_batch(&services::ipvs_dummy_addrs(&all))?;
                node.netns.exec_ok("ipvsadm", &["-C"], None)?;
                node.netns
                    .exec_ok("ipvsadm", &["-R"], Some(&services::ipvsadm_rules(&all)))?;
            }
        }
        self.proxied = Some(uids);
        Ok(())
    }

    /// The directory of manifests the agents read (the current step's objects).
    pub fn manifests(&self) -> &Path {
        &self.manifests
    }

    /// Waits until every node's kernel holds exactly what `netpol-agent compile` renders for
    /// the manifests; on timeout says which node differs and how.
    pub fn wait_converged(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        let families = self.cfg.family.agent_families();
        let mut want = Vec::new();
        for node in &self.nodes {
            let mut per_family = Vec::new();
            for &family in families {
                per_family.push(
                    self.compiled(node, family)
                        .map_err(|e| format!("compile ({}): {e:#}", family_name(family)))?,
                );
            }
            want.push(per_family);
        }
        loop {
            let mut differs = None;
            for (node, want) in self.nodes.iter_mut().zip(&want) {
                if let Some(agent) = node.agent.as_mut() {
                    if let Ok(Some(status)) = agent.try_wait() {
                        return Err(format!(
                            "netpol-agent on {} exited ({status})\n{}",
                            node.name,
                            log_tail(&node.log, 30)
                        ));
                    }
                }
                for (&family, want) in families.iter().zip(want) {
                    let label = family_name(family);
                    match observed(&self.cfg, &node.netns, family) {
                        Ok(have) if &have == want => {}
                        Ok(have) => {
                            let why = format!("{label}: {}", diff(want, &have));
                            differs = Some((node.name.clone(), node.log.clone(), why));
                            break;
                        }
                        Err(e) => {
                            let why = format!("{label}: {e:#}");
                            differs = Some((node.name.clone(), node.log.clone(), why));
                            break;
                        }
                    }
                }
                if differs.is_some() {
                    break;
                }
            }
            let Some((name, log, why)) = differs else {
                return Ok(start.elapsed());
            };
            if start.elapsed() > self.cfg.converge_timeout {
                return Err(format!(
                    "{name} did not converge within {:?}: {why}\nagent log:\n{}",
                    self.cfg.converge_timeout,
                    log_tail(&log, 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    }

    /// What `node` must hold in `family`: `netpol-agent compile` (`--ipv6` for IPv6).
    fn compiled(&self, node: &Node, family: IpFamily) -> anyhow::Result<OwnedState> {
        let tag = match family {
            IpFamily::V4 => "4",
            IpFamily::V6 => "6",
        };
        let sets = self.work.join(format!("want-{}.ipset{tag}", node.name));
        let rules = self.work.join(format!("want-{}.iptables{tag}", node.name));
        let mut cmd = std::process::Command::new(&self.cfg.agent);
        cmd.args(["compile", "--node", &node.name]);
        if family == IpFamily::V6 {
            cmd.arg("--ipv6");
        }
        if self.cfg.proxy == ServiceProxy::Ipvs && compile_kube_ipvs(&self.cfg.agent) {
            cmd.arg("--kube-ipvs");
            // The this-host set the agent fills from the node's interfaces.
            let addrs = node.netns.exec_ok("ip", &["-o", "addr", "show"], None)?;
            for ip in services::node_addresses(&addrs) {
                cmd.arg("--host-address").arg(ip.to_string());
            }
        }
        let out = cmd
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--ipsets-out")
            .arg(&sets)
            .arg("--iptables-out")
            .arg(&rules)
            .envs(compile_env(&self.cfg, &self.work.join("interfaces.yaml")))
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr));
        }
        let mut state = OwnedState::default();
        state.add_iptables(
            &std::fs::read_to_string(&rules)?,
            &netpol_agent::agent::OWNERSHIP,
        );
        state.add_ipsets(&std::fs::read_to_string(&sets)?, family);
        Ok(state)
    }

    /// How far each node's agent log is written now (see `deny_lines_since`).
    pub fn log_marks(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| std::fs::metadata(&n.log).map(|m| m.len()).unwrap_or(0))
            .collect()
    }

    /// The deny lines (JSON, target `deny_log`) each node's agent wrote since `marks`, with
    /// the name of the node whose log held them.
    pub fn deny_lines_since(&self, marks: &[u64]) -> Vec<(String, serde_json::Value)> {
        self.deny_lines(marks, |text, mark| &text[mark.min(text.len())..])
    }

    /// The deny lines each node wrote before its mark.
    pub fn deny_lines_before(&self, marks: &[u64]) -> Vec<(String, serde_json::Value)> {
        self.deny_lines(marks, |text, mark| &text[..mark.min(text.len())])
    }

    fn deny_lines(
        &self,
        marks: &[u64],
        part: impl Fn(&[u8], usize) -> &[u8],
    ) -> Vec<(String, serde_json::Value)> {
        let mut out = Vec::new();
        for (node, mark) in self.nodes.iter().zip(marks) {
            let Ok(text) = std::fs::read(&node.log) else {
                continue;
            };
            let mark = usize::try_from(*mark).unwrap_or(usize::MAX);
            for line in String::from_utf8_lossy(part(&text, mark)).lines() {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                    if v["target"] == "deny_log" {
                        out.push((node.name.clone(), v));
                    }
                }
            }
        }
        out
    }

    /// What each node's agent logged since `marks` (node name, text).
    pub fn logs_since(&self, marks: &[u64]) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .zip(marks)
            .map(|(node, mark)| {
                let text = std::fs::read(&node.log).unwrap_or_default();
                let mark = usize::try_from(*mark).unwrap_or(usize::MAX).min(text.len());
                (
                    node.name.clone(),
                    String::from_utf8_lossy(&text[mark..]).into_owned(),
                )
            })
            .collect()
    }

    pub fn agent_logs(&self) -> String {
        let mut s = String::new();
        for node in &self.nodes {
            let _ = writeln!(s, "--- {} ---\n{}", node.name, log_tail(&node.log, 20));
        }
        s
    }
}

/// kube-proxy's IPVS mode on a new node: `ip_vs` loaded, the `kube-ipvs0` dummy, its
/// sysctls, its (empty) sets and its iptables rules in every family of the cluster.
fn ipvs_node(netns: &Netns, cfg: &ClusterConfig, families: &[IpFamily]) -> anyhow::Result<()> {
    static LOADED: std::sync::Once = std::sync::Once::new();
    LOADED.call_once(|| {
        // kube-proxy loads these itself; the `vs` sysctls exist only once it is loaded.
        let _ = std::process::Command::new("modprobe")
            .args(["-a", "ip_vs", "ip_vs_rr", "dummy"])
            .status();
    });
    netns
        .ip_batch(&format!(
            "link add {d} type dummy
link set {d} up
",
            d = services::IPVS_DUMMY
        ))
        .context("kube-ipvs0: no dummy interfaces (run --service-proxy ipvs in scripts/vm.sh)")?;
    for (key, value) in services::IPVS_SYSCTLS {
        netns
            .sysctl(key, value)
            .context("no IPVS in this kernel (run --service-proxy ipvs in scripts/vm.sh)")?;
    }
    let cluster_cidr = ipnet::Ipv4Net::new(node_pod_cidr(0).network(), 16)?;
    for &f in families {
        netns.exec_ok(
            "ipset",
            &["restore"],
            Some(&services::kube_proxy_ipvs_sets(f, &[])),
        )?;
        netns.exec_ok(
            &cfg.backend.tool_for(f, "restore"),
            &["--noflush"],
            Some(&services::kube_proxy_ipvs_iptables(
                f,
                net_of(cluster_cidr, f),
            )),
        )?;
    }
    Ok(())
}

/// Whether `compile` must render the IPVS rules the agents detect on a node with
/// `kube-ipvs0`: when it has `--kube-ipvs` (agents without IPVS support have neither) and
/// the override `FELIX_KUBEIPVSSUPPORTENABLED=false` (the agents inherit our environment)
/// does not turn the detection off.
fn compile_kube_ipvs(agent: &Path) -> bool {
    static HAS_FLAG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let disabled = std::env::var("FELIX_KUBEIPVSSUPPORTENABLED")
        .is_ok_and(|v| v.eq_ignore_ascii_case("false"));
    !disabled
        && *HAS_FLAG.get_or_init(|| {
            std::process::Command::new(agent)
                .args(["compile", "--help"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--kube-ipvs"))
        })
}

/// What `netpol-agent run` on `node` is configured with.
fn agent_env(cfg: &ClusterConfig, node: &Node) -> Vec<(&'static str, String)> {
    let mut env = common_env(cfg);
    if cfg.auto_wiring {
        env.retain(|(k, _)| !matches!(*k, "FELIX_INTERFACEPREFIX" | "FELIX_BRIDGEINTERFACE"));
        env.push(("FELIX_INTERFACENAMESCHEME", "auto".into()));
        if cfg.deny_logs {
            env.push(("FELIX_LOGFORMAT", "json".into()));
        }
        env.extend(flows_server_env(cfg));
        return env;
    }
    let scheme = match cfg.cni {
        Cni::Calico => "calico",
        Cni::Sandbox => "sandbox",
        Cni::Hybridnet => "routes",
        Cni::Bridge => "bridge",
    };
    env.push(("FELIX_INTERFACENAMESCHEME", scheme.into()));
    if cfg.deny_logs {
        env.push(("FELIX_LOGFORMAT", "json".into()));
    }
    if let Some(runtime) = &node.runtime {
        env.push(("FELIX_CRIENDPOINT", runtime.socket().display().to_string()));
    }
    env.extend(flows_server_env(cfg));
    env
}

/// The health server that answers `GET /flows`, on the node namespace's loopback only.
fn flows_server_env(cfg: &ClusterConfig) -> Vec<(&'static str, String)> {
    if !cfg.flow_logs {
        return Vec::new();
    }
    vec![
        ("FELIX_HEALTHENABLED", "true".into()),
        ("FELIX_HEALTHHOST", "127.0.0.1".into()),
        ("FELIX_HEALTHPORT", FLOWS_PORT.to_string()),
    ]
}

/// What `compile` is configured with: the names the harness gave the interfaces, so a
/// resolver that learns them at run time is checked against the truth.
fn compile_env(cfg: &ClusterConfig, map_file: &Path) -> Vec<(&'static str, String)> {
    let mut env = common_env(cfg);
    if cfg.cni == Cni::Calico {
        env.push(("FELIX_INTERFACENAMESCHEME", "calico".into()));
    } else {
        env.push(("FELIX_INTERFACENAMESCHEME", "static".into()));
        env.push(("FELIX_INTERFACEMAPFILE", map_file.display().to_string()));
    }
    env
}

fn common_env(cfg: &ClusterConfig) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("FELIX_INTERFACEPREFIX", cfg.cni.prefix().to_string()),
        (
            "FELIX_IPV6SUPPORT",
            cfg.family.has(IpFamily::V6).to_string(),
        ),
        ("FELIX_IPTABLESBACKEND", "auto".into()),
        ("FELIX_LOGSEVERITYSCREEN", "INFO".into()),
    ];
    if cfg.cni.wiring() == Wiring::Bridged {
        env.push(("FELIX_BRIDGEINTERFACE", BRIDGE.into()));
    }
    if !cfg.source_check {
        env.push(("FELIX_WORKLOADSOURCESPOOFING", "Any".into()));
    }
    if let Some(min) = cfg.policy_union_min {
        env.push(("FELIX_POLICYUNIONMIN", min.to_string()));
    }
    if cfg.deny_logs {
        // Every denied probe must be logged: a step's probes come in a burst, so the
        // kernel's limit must not bite (the most -m limit allows).
        env.push(("FELIX_DENYLOGENABLED", "true".into()));
        env.push(("FELIX_DENYLOGRATE", "10000".into()));
        env.push(("FELIX_DENYLOGBURST", "10000".into()));
    }
    if cfg.flow_logs {
        // Every probe must be recorded: a step's probes come in a burst from every pod, so
        // the per-pod limit must not bite (the most hashlimit takes; the limit itself is
        // tested in the agent's own tests). A short flush interval makes steps cross
        // interval boundaries, so records are read from finished intervals and the open one.
        env.push(("FELIX_FLOWLOGSENABLED", "true".into()));
        env.push(("FELIX_FLOWLOGSPERPODRATE", "10000".into()));
        env.push(("FELIX_FLOWLOGSPERPODBURST", "10000".into()));
        env.push(("FELIX_FLOWLOGSFLUSHINTERVAL", "2".into()));
    }
    env
}

fn observed(cfg: &ClusterConfig, netns: &Netns, family: IpFamily) -> anyhow::Result<OwnedState> {
    let mut state = OwnedState::default();
    state.add_iptables(
        &netns.exec_ok(
            &cfg.backend.tool_for(family, "save"),
            &["-t", "filter"],
            None,
        )?,
        &netpol_agent::agent::OWNERSHIP,
    );
    state.add_ipsets(&netns.exec_ok("ipset", &["save"], None)?, family);
    Ok(state)
}

pub fn diff(want: &OwnedState, have: &OwnedState) -> String {
    let mut s = String::new();
    for (name, rules) in &want.chains {
        match have.chains.get(name) {
            None => {
                let _ = write!(s, "chain {name} missing; ");
            }
            Some(h) if h != rules => {
                let _ = write!(s, "chain {name} differs; ");
            }
            _ => {}
        }
    }
    for name in have.chains.keys() {
        if !want.chains.contains_key(name) {
            let _ = write!(s, "chain {name} extra; ");
        }
    }
    if want.sets != have.sets {
        let _ = write!(s, "sets differ; ");
    }
    if want.kernel != have.kernel {
        let _ = write!(s, "kernel-chain jumps differ; ");
    }
    s
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn file_name(key: &str) -> String {
    format!("{}.yaml", key.replace('/', "__"))
}

fn to_yaml(doc: &serde_json::Value) -> anyhow::Result<String> {
    Ok(serde_yaml_ng::to_string(doc)?)
}

/// Write-then-rename, so the watching agent never reads half a file.
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let name = path.file_name().expect("a file").to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for net in self.pods.values_mut() {
            net.servers.stop();
        }
        for node in &mut self.nodes {
            if let Some(mut agent) = node.agent.take() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(agent.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = agent.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = agent.kill();
                let _ = agent.wait();
            }
        }
        // Pods, then nodes, then the underlay: each Netns deletes itself when dropped.
        self.pods.clear();
        self.nodes.clear();
        self.fabric = None;
        let _ = std::fs::remove_dir_all(&self.work);
    }
}
