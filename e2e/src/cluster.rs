//! One simulated cluster: node namespaces joined by an underlay bridge, pod namespaces wired
//! to their node the way the chosen CNI does it, kube-proxy-style ClusterIP DNAT on every
//! node, the manifests kubelet and the CNI would have produced in a directory, and a real
//! `netpol-agent run` per node reading it. Dropping the cluster removes all of it: servers
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
use crate::netns::{Netns, PREFIX};
use crate::runtime::NodeRuntime;
use crate::scenario::{node_pod_cidr, Pod, World};
use crate::servers::{PodServers, SctpLog};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Nft,
    Legacy,
}

impl Backend {
    /// `iptables-nft-save`, `iptables-legacy-restore`, ...
    pub fn tool(self, action: &str) -> String {
        match self {
            Backend::Nft => format!("iptables-nft-{action}"),
            Backend::Legacy => format!("iptables-legacy-{action}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub agent: PathBuf,
    pub cni: Cni,
    pub backend: Backend,
    pub converge_timeout: Duration,
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
}

/// The bridge address of node `i` in `--cni bridge`, the pods' gateway.
fn bridge_gateway(node: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 244, node as u8, 1)
}

fn underlay_ip(node: usize) -> String {
    format!("192.168.200.{}", node + 1)
}

pub fn node_name(node: usize) -> String {
    format!("node-{node}")
}

impl Cluster {
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
        };
        for i in 0..nodes {
            let netns = Netns::create(&format!("{}-n{i}", cluster.tag))?;
            for (key, value) in [
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", "0"),
                ("net/ipv4/conf/default/rp_filter", "0"),
            ] {
                netns.sysctl(key, value)?;
            }
            // A default route out of a port-less bridge (no dummy module here): proxy ARP
            // answers for 169.254.1.1 only
            // when the node routes it elsewhere, as a real node's default route does.
            netns.ip_batch(
                "link add dummy0 type bridge\nlink set dummy0 up\nroute add default dev dummy0\n",
            )?;
            match cluster.cfg.cni.wiring() {
                Wiring::Routed { table: Some(table) } => {
                    netns.ip_batch(&format!("rule add from all lookup {table} pref 1\n"))?;
                }
                Wiring::Routed { table: None } => {}
                Wiring::Bridged => {
                    let gateway = bridge_gateway(i);
                    netns.ip_batch(&format!(
                        "link add {BRIDGE} type bridge\naddr add {gateway}/24 dev {BRIDGE}\nlink set {BRIDGE} up\n"
                    ))?;
                    // Bridged frames must traverse iptables (br_netfilter, per namespace).
                    netns.sysctl("net/bridge/bridge-nf-call-iptables", "1")?;
                }
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
                let mut lines = format!(
                    "addr add {}/24 dev eth0\nlink set eth0 up\n",
                    underlay_ip(i)
                );
                for j in (0..nodes).filter(|j| *j != i) {
                    let _ = writeln!(
                        lines,
                        "route add {} via {} dev eth0",
                        node_pod_cidr(j),
                        underlay_ip(j)
                    );
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
                write_atomic(&policy_dir.join(file_name(key)), doc)?;
            }
        }
        for key in self.written.policies.keys() {
            if !target.policies.contains_key(key) {
                remove_if_present(&policy_dir.join(file_name(key)))?;
            }
        }
        for (name, doc) in &target.cluster_policies {
            if self.written.cluster_policies.get(name) != Some(doc) {
                write_atomic(&cluster_policy_dir.join(format!("{name}.yaml")), doc)?;
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
        let netns = Netns::create(&format!("{}-p{}", self.tag, pod.uid))?;
        let iface = self.cfg.cni.host_iface(&self.tag, pod);
        match self.cfg.cni.wiring() {
            Wiring::Routed { table } => {
                let table = table.map(|t| format!(" table {t}")).unwrap_or_default();
                node.netns.ip_batch(&format!(
                    "link add {iface} type veth peer name eth0 netns {pod_ns}\n\
                     link set {iface} up\n\
                     route add {ip}/32 dev {iface}{table}\n",
                    pod_ns = netns.name,
                    ip = pod.ip
                ))?;
                node.netns
                    .sysctl(&format!("net/ipv4/conf/{iface}/proxy_arp"), "1")?;
                node.netns
                    .sysctl(&format!("net/ipv4/neigh/{iface}/proxy_delay"), "0")?;
                netns.ip_batch(&format!(
                    "addr add {ip}/32 dev eth0\nlink set eth0 up\n\
                     route add 169.254.1.1 dev eth0 scope link\n\
                     route add default via 169.254.1.1 dev eth0\n",
                    ip = pod.ip
                ))?;
            }
            Wiring::Bridged => {
                node.netns.ip_batch(&format!(
                    "link add {iface} type veth peer name eth0 netns {pod_ns}\n\
                     link set {iface} master {BRIDGE}\n\
                     link set {iface} up\n",
                    pod_ns = netns.name
                ))?;
                netns.ip_batch(&format!(
                    "addr add {ip}/24 dev eth0\nlink set eth0 up\n\
                     route add default via {gw} dev eth0\n",
                    ip = pod.ip,
                    gw = bridge_gateway(pod.node)
                ))?;
            }
        }
        if let Some(runtime) = self.nodes[pod.node].runtime.as_ref() {
            runtime.add_pod(&self.tag, pod)?;
        }
        let handle = Arc::new(netns.handle.try_clone()?);
        let servers = PodServers::start(&netns.handle, pod, self.sctp.clone())?;
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
            "status": {"phase": "Running", "podIP": pod.ip.to_string(),
                       "podIPs": [{"ip": pod.ip.to_string()}]},
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

    /// kube-proxy's part: a ClusterIP per pod, DNATed to the pod for each port it serves,
    /// from pods (PREROUTING) and from the node (OUTPUT), on every node.
    fn write_services(&self) -> anyhow::Result<()> {
        let mut nat = String::from(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
             :POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n",
        );
        let mut rules = String::new();
        for net in self.pods.values() {
            let pod = &net.pod;
            let chain = format!("KUBE-SEP-E2E{}", pod.uid);
            let _ = writeln!(nat, ":{chain} - [0:0]");
            for p in &pod.ports {
                let proto = p.protocol.as_str().to_ascii_lowercase();
                let _ = writeln!(
                    rules,
                    "-A KUBE-SERVICES -d {}/32 -p {proto} -m {proto} --dport {} -m comment --comment \"{}:{}\" -j {chain}",
                    pod.cluster_ip,
                    p.port,
                    pod.key(),
                    p.port
                );
                let _ = writeln!(
                    rules,
                    "-A {chain} -p {proto} -m {proto} --dport {port} -j DNAT --to-destination {}:{port}",
                    pod.ip,
                    port = p.port
                );
            }
        }
        nat.push_str(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
        nat.push_str(
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
        nat.push_str(&rules);
        nat.push_str("COMMIT\n");
        // kube-proxy's hint: tells iptables wrappers (and our backend detection) which
        // backend this node uses.
        nat.push_str("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n");
        let restore = self.cfg.backend.tool("restore");
        for node in &self.nodes {
            // The node's nat and mangle tables are kube-proxy's alone: rewritten whole.
            node.netns.exec_ok(&restore, &[], Some(&nat))?;
        }
        Ok(())
    }

    /// Waits until every node's kernel holds exactly what `netpol-agent compile` renders for
    /// the manifests; on timeout says which node differs and how.
    pub fn wait_converged(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        let mut want = Vec::new();
        for node in &self.nodes {
            want.push(self.compiled(node).map_err(|e| format!("compile: {e:#}"))?);
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
                let have = observed(&self.cfg, &node.netns);
                match have {
                    Ok(have) if &have == want => {}
                    Ok(have) => {
                        differs = Some((node.name.clone(), node.log.clone(), diff(want, &have)));
                        break;
                    }
                    Err(e) => {
                        differs = Some((node.name.clone(), node.log.clone(), format!("{e:#}")))
                    }
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

    fn compiled(&self, node: &Node) -> anyhow::Result<OwnedState> {
        let sets = self.work.join(format!("want-{}.ipset", node.name));
        let rules = self.work.join(format!("want-{}.iptables", node.name));
        let out = std::process::Command::new(&self.cfg.agent)
            .args(["compile", "--node", &node.name, "--manifests"])
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
        state.add_ipsets(&std::fs::read_to_string(&sets)?, IpFamily::V4);
        Ok(state)
    }

    pub fn agent_logs(&self) -> String {
        let mut s = String::new();
        for node in &self.nodes {
            let _ = writeln!(s, "--- {} ---\n{}", node.name, log_tail(&node.log, 20));
        }
        s
    }
}

/// What `netpol-agent run` on `node` is configured with.
fn agent_env(cfg: &ClusterConfig, node: &Node) -> Vec<(&'static str, String)> {
    let mut env = common_env(cfg);
    let scheme = match cfg.cni {
        Cni::Calico => "calico",
        Cni::Sandbox => "sandbox",
        Cni::Hybridnet => "routes",
        Cni::Bridge => "bridge",
    };
    env.push(("FELIX_INTERFACENAMESCHEME", scheme.into()));
    if let Some(runtime) = &node.runtime {
        env.push(("FELIX_CRIENDPOINT", runtime.socket().display().to_string()));
    }
    env
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
        ("FELIX_IPV6SUPPORT", "false".into()),
        ("FELIX_IPTABLESBACKEND", "auto".into()),
        ("FELIX_LOGSEVERITYSCREEN", "INFO".into()),
    ];
    if cfg.cni.wiring() == Wiring::Bridged {
        env.push(("FELIX_BRIDGEINTERFACE", BRIDGE.into()));
    }
    env
}

fn observed(cfg: &ClusterConfig, netns: &Netns) -> anyhow::Result<OwnedState> {
    let mut state = OwnedState::default();
    state.add_iptables(
        &netns.exec_ok(&cfg.backend.tool("save"), &["-t", "filter"], None)?,
        &netpol_agent::agent::OWNERSHIP,
    );
    state.add_ipsets(&netns.exec_ok("ipset", &["save"], None)?, IpFamily::V4);
    Ok(state)
}

fn diff(want: &OwnedState, have: &OwnedState) -> String {
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
