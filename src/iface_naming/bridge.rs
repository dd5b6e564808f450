//! The `bridge` scheme: a local pod's interface is the bridge port its address lives behind.
//!
//! CNIs that put pods on a Linux bridge (flannel's `cni0`, the CNI `bridge` plugin) name the
//! host veths `veth` + 8 random hex characters: nothing about the pod predicts the name, so
//! it is learned from the kernel, over rtnetlink, on the resolver's own thread:
//!
//! - the bridge's **neighbour table** (`RTM_GETNEIGH`, `AF_INET`/`AF_INET6`, on the bridge
//!   device) gives pod address → MAC;
//! - the bridge's **forwarding database** (`RTM_GETNEIGH`, `AF_BRIDGE`, entries whose master is
//!   the bridge) gives MAC → port;
//! - **links** (`RTM_GETLINK`) give port index → name and master, and which index the bridge
//!   has (it may appear later: flannel creates `cni0` with the first pod).
//!
//! All three are dumped at start and then followed through their events (`RTNLGRP_LINK`,
//! `RTNLGRP_NEIGH`, which carries FDB events too); an event-queue overflow (`ENOBUFS`) makes
//! the thread dump everything again.
//!
//! **Resolution when the pod is sighted.** A pod must meet its policy from its first packet,
//! but until its port is known its traffic meets the dispatch chains' DROP. So a pod address
//! is never left to be learned when the pod first talks: [`InterfaceResolver::resolve`] (which
//! only reads a map and never does I/O) records an address it cannot answer for and wakes the
//! thread, which asks the kernel to resolve the neighbour: `RTM_NEWNEIGH` with `NTF_USE` on
//! the bridge, which creates the entry and starts the kernel's own ARP (IPv6: neighbour
//! solicitation) from the bridge address. The pod's reply enters the bridge through its port,
//! so the bridge learns the pod's MAC on that port (an FDB event), and the kernel records the
//! address's MAC (a neighbour event); together they name the port, the map changes and the
//! `changed` notifier makes the agent resolve local pods again. ARP and neighbour discovery
//! are never blocked by our rules (ARP is not IP; bridged neighbour discovery is accepted
//! before policy, see `rules::bridge`), so an unresolved pod still answers. An address that
//! does not answer is asked again after 1, 2, 4, … seconds, then every 30 s, and given up
//! after 10 minutes (the agent asks again whenever it resolves the pod anew, and the pod's
//! own traffic still teaches us its port: the neighbour table learns from every ARP).
//!
//! **What stays.** The kernel forgets quietly: FDB entries age out after 300 s of silence,
//! neighbour entries are garbage-collected. A learned address → port pairing therefore stays
//! until its port is deleted or leaves the bridge (pod gone), not when the evidence ages out.
//! It is also sticky against contradicting evidence while its port exists: if the address's
//! MAC later shows up behind another existing port (another pod answering ARP for it, or an
//! address reused before the old veth is gone), the first pairing is kept and a warning
//! logged; once the old port is deleted the new evidence is taken at once.
//!
//! **Limits.** Layer-2 spoofing by a pod at the moment another pod is first resolved can
//! mislead the pairing (nothing on a plain Linux bridge authenticates ARP). The bridge must
//! have an address in the pods' subnet for the kernel's ARP to be answered (flannel's `cni0`
//! and the bridge plugin with `isGateway` have one). Only ports whose names start with one of
//! the interface prefixes count. A pod with several addresses resolves when any of them does;
//! addresses behind different ports are an error.
//!
//! Bridge mode at two layers: naming a pod's bridge port in `iface_naming::bridge`, the chains
//! bridged traffic goes through in `rules::bridge`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use netlink_packet_core::NLM_F_CREATE;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use tracing::{debug, info, warn};

use super::{
    parse_prefix_list, validate_interface_name, validate_pod_interface_name, ChangeNotifier,
    InterfaceResolver, NamingError,
};
use crate::backoff::{Backoff, Policy};
use crate::host::netlink::{is_overrun, parse_link, RtnlSocket, RTNLGRP_LINK, RTNLGRP_NEIGH};
use crate::model::PodInfo;

type Mac = [u8; 6];

/// An address nobody answers for is no longer probed after this long.
const PROBE_GIVE_UP: Duration = Duration::from_secs(600);
/// Longest sleep of the resolver thread (it checks the stop flag this often).
const TICK: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------- the map (pure)

#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    name: String,
    master: Option<u32>,
}

/// Everything the resolver knows, fed by netlink messages; pure, so its rules can be tested
/// without a kernel.
#[derive(Debug)]
pub(crate) struct PortMap {
    bridge: String,
    prefixes: Vec<String>,
    links: HashMap<u32, Link>,
    /// (bridge index, MAC) → port index, as the kernel's FDB says now.
    fdb: HashMap<(u32, Mac), u32>,
    /// (device index, address) → MAC, as the kernel's neighbour tables say now.
    neigh: HashMap<(u32, IpAddr), Mac>,
    /// Address → port index: learned pairings, kept while the port is on the bridge.
    pairs: BTreeMap<IpAddr, u32>,
    /// Conflicts already reported, so each is logged once.
    reported: HashSet<(IpAddr, u32, u32)>,
}

impl PortMap {
    pub(crate) fn new(bridge: &str, prefixes: &[String]) -> PortMap {
        PortMap {
            bridge: bridge.to_string(),
            prefixes: prefixes.to_vec(),
            links: HashMap::new(),
            fdb: HashMap::new(),
            neigh: HashMap::new(),
            pairs: BTreeMap::new(),
            reported: HashSet::new(),
        }
    }

    fn bridge_index(&self) -> Option<u32> {
        self.links
            .iter()
            .find(|(_, l)| l.name == self.bridge)
            .map(|(i, _)| *i)
    }

    /// A port of our bridge whose name has one of the prefixes.
    fn port_name(&self, index: u32) -> Option<&str> {
        let bridge = self.bridge_index()?;
        let link = self.links.get(&index)?;
        (link.master == Some(bridge) && self.prefixes.iter().any(|p| link.name.starts_with(p)))
            .then_some(link.name.as_str())
    }

    pub(crate) fn link(&mut self, index: u32, name: &str, master: Option<u32>) {
        self.links.insert(
            index,
            Link {
                name: name.to_string(),
                master,
            },
        );
        self.derive();
    }

    pub(crate) fn link_gone(&mut self, index: u32) {
        self.links.remove(&index);
        self.fdb
            .retain(|(bridge, _), port| *port != index && *bridge != index);
        self.neigh.retain(|(dev, _), _| *dev != index);
        self.derive();
    }

    pub(crate) fn fdb_entry(&mut self, bridge: u32, mac: Mac, port: u32) {
        self.fdb.insert((bridge, mac), port);
        self.derive();
    }

    pub(crate) fn fdb_gone(&mut self, bridge: u32, mac: Mac) {
        self.fdb.remove(&(bridge, mac));
        self.derive();
    }

    pub(crate) fn neighbour(&mut self, dev: u32, ip: IpAddr, mac: Mac) {
        self.neigh.insert((dev, ip), mac);
        self.derive();
    }

    pub(crate) fn neighbour_gone(&mut self, dev: u32, ip: IpAddr) {
        self.neigh.remove(&(dev, ip));
        self.derive();
    }

    /// Forgets what the kernel said (before a full re-dump); learned pairings stay until the
    /// dump shows their ports gone.
    pub(crate) fn forget_evidence(&mut self) {
        self.links.clear();
        self.fdb.clear();
        self.neigh.clear();
    }

    /// Drops pairings whose port is gone, then pairs every address whose MAC sits behind a
    /// port; an existing pairing to a port that still exists is kept.
    fn derive(&mut self) {
        let valid: HashSet<u32> = self
            .pairs
            .values()
            .copied()
            .filter(|p| self.port_name(*p).is_some())
            .collect();
        self.pairs.retain(|_, port| valid.contains(port));
        let Some(bridge) = self.bridge_index() else {
            return;
        };
        let mut learned = Vec::new();
        for ((dev, ip), mac) in &self.neigh {
            if *dev != bridge {
                continue;
            }
            let Some(&port) = self.fdb.get(&(bridge, *mac)) else {
                continue;
            };
            if self.port_name(port).is_none() {
                continue;
            }
            learned.push((*ip, port));
        }
        for (ip, port) in learned {
            match self.pairs.get(&ip) {
                None => {
                    self.pairs.insert(ip, port);
                }
                Some(&old) if old == port => {}
                Some(&old) => {
                    if self.reported.insert((ip, old, port)) {
                        warn!(
                            address = %ip,
                            port = self.port_name(old).unwrap_or("?"),
                            other_port = self.port_name(port).unwrap_or("?"),
                            bridge = %self.bridge,
                            "the address now answers behind another bridge port while its first port still exists; keeping the first (ARP spoofing, or an address reused before the old veth was deleted)"
                        );
                    }
                }
            }
        }
    }

    /// Address → port name, for every learned pairing.
    pub(crate) fn resolved(&self) -> BTreeMap<IpAddr, String> {
        self.pairs
            .iter()
            .filter_map(|(ip, port)| Some((*ip, self.port_name(*port)?.to_string())))
            .collect()
    }

    /// Applies one rtnetlink message (dump reply or event).
    pub(crate) fn apply(&mut self, msg: &RouteNetlinkMessage) {
        match msg {
            RouteNetlinkMessage::NewLink(link) => {
                if let Some(link) = parse_link(link) {
                    self.link(link.index, &link.name, link.master);
                }
            }
            RouteNetlinkMessage::DelLink(link) => self.link_gone(link.header.index),
            RouteNetlinkMessage::NewNeighbour(n) => self.neighbour_message(n, true),
            RouteNetlinkMessage::DelNeighbour(n) => self.neighbour_message(n, false),
            _ => {}
        }
    }

    fn neighbour_message(&mut self, n: &NeighbourMessage, added: bool) {
        let mac = n.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(b) => <Mac>::try_from(b.as_slice()).ok(),
            _ => None,
        });
        match n.header.family {
            AddressFamily::Bridge => {
                // Entries the bridge learned or was told for a port; skip the ports' own
                // addresses (permanent, "local") and device-level (self) entries.
                let master = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Controller(m) => Some(*m),
                    _ => None,
                });
                let (Some(master), Some(mac)) = (master, mac) else {
                    return;
                };
                if n.header.state == NeighbourState::Permanent
                    || n.header.flags.contains(NeighbourFlags::Own)
                {
                    return;
                }
                if added {
                    self.fdb_entry(master, mac, n.header.ifindex);
                } else if self.fdb.get(&(master, mac)) == Some(&n.header.ifindex) {
                    self.fdb_gone(master, mac);
                }
            }
            AddressFamily::Inet | AddressFamily::Inet6 => {
                let Some(ip) = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                        Some(IpAddr::V4(*v4))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                        Some(IpAddr::V6(*v6))
                    }
                    _ => None,
                }) else {
                    return;
                };
                let usable = !matches!(
                    n.header.state,
                    NeighbourState::Failed | NeighbourState::Incomplete | NeighbourState::None
                );
                match (added && usable, mac) {
                    (true, Some(mac)) => self.neighbour(n.header.ifindex, ip, mac),
                    _ => self.neighbour_gone(n.header.ifindex, ip),
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- the resolver

/// What `resolve` reads and the thread writes.
#[derive(Default)]
struct Shared {
    /// Address → port name, as last published by the thread.
    resolved: BTreeMap<IpAddr, String>,
    /// Addresses `resolve` could not answer for, not yet taken by the thread.
    wanted: BTreeSet<IpAddr>,
}

#[derive(Debug)]
pub struct BridgeResolver {
    bridge: String,
    prefixes: Vec<String>,
    shared: Arc<Mutex<Shared>>,
    /// Written (non-blocking) by `resolve` to wake the thread; read by the thread.
    wake: (UnixDatagram, Arc<UnixDatagram>),
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("resolved", &self.resolved.len())
            .field("wanted", &self.wanted.len())
            .finish()
    }
}

impl BridgeResolver {
    /// `bridge` is the bridge device; `prefix_list` the comma-separated interface prefixes
    /// (only ports whose names start with one of them are pods).
    pub fn new(bridge: &str, prefix_list: &str) -> anyhow::Result<BridgeResolver> {
        validate_interface_name(bridge).context("bridge interface")?;
        let prefixes = parse_prefix_list(prefix_list)?;
        let (tx, rx) = UnixDatagram::pair().context("creating the resolver's wake-up socket")?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(BridgeResolver {
            bridge: bridge.to_string(),
            prefixes,
            shared: Arc::default(),
            wake: (tx, Arc::new(rx)),
        })
    }
}

impl InterfaceResolver for BridgeResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut ports: Vec<&String> = pod
            .ips
            .iter()
            .filter_map(|ip| shared.resolved.get(ip))
            .collect();
        ports.sort();
        ports.dedup();
        match ports[..] {
            [port] => {
                let port = port.clone();
                drop(shared);
                validate_pod_interface_name(&pod.key, &port)?;
                Ok(port)
            }
            [] => {
                let mut new = false;
                for ip in &pod.ips {
                    new |= shared.wanted.insert(*ip);
                }
                drop(shared);
                if new {
                    // Never blocks: a full buffer means a wake-up is pending anyway.
                    let _ = self.wake.0.send(&[1]);
                }
                Err(NamingError::BridgePortUnknown {
                    pod: pod.key.clone(),
                    bridge: self.bridge.clone(),
                    addresses: pod.ips.iter().map(ToString::to_string).collect(),
                })
            }
            _ => Err(NamingError::BridgePortsDiffer {
                pod: pod.key.clone(),
                ports: ports.into_iter().cloned().collect(),
            }),
        }
    }

    fn scheme(&self) -> &'static str {
        "bridge"
    }

    fn start(&self, changed: ChangeNotifier, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        let mut worker = Worker::open(
            PortMap::new(&self.bridge, &self.prefixes),
            self.shared.clone(),
            self.wake.1.clone(),
            changed,
        )
        .with_context(|| format!("opening rtnetlink for bridge {}", self.bridge))?;
        // The first dump happens here, so a pod seen right after start resolves at once.
        worker.resync()?;
        worker.publish();
        std::thread::Builder::new()
            .name("bridge-resolver".into())
            .spawn(move || worker.run(&stop))
            .context("starting the bridge resolver thread")?;
        info!(bridge = %self.bridge, "bridge port resolver started");
        Ok(())
    }
}

/// Retry schedule of one unanswered address (`backoff::Policy::BRIDGE_PROBE`).
struct Probe {
    first: Instant,
    next: Instant,
    backoff: Backoff,
}

struct Worker {
    map: PortMap,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<UnixDatagram>,
    changed: ChangeNotifier,
    events: RtnlSocket,
    requests: RtnlSocket,
    probes: BTreeMap<IpAddr, Probe>,
    published: Option<BTreeMap<IpAddr, String>>,
    need_resync: bool,
}

impl Worker {
    fn open(
        map: PortMap,
        shared: Arc<Mutex<Shared>>,
        wake: Arc<UnixDatagram>,
        changed: ChangeNotifier,
    ) -> io::Result<Worker> {
        let events = RtnlSocket::monitor(&[RTNLGRP_LINK, RTNLGRP_NEIGH])?;
        let requests = RtnlSocket::open()?;
        Ok(Worker {
            map,
            shared,
            wake,
            changed,
            events,
            requests,
            probes: BTreeMap::new(),
            published: None,
            need_resync: false,
        })
    }

    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            if self.need_resync {
                if let Err(e) = self.resync() {
                    warn!(error = %e, "bridge resolver: re-reading links, neighbours and FDB failed; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            }
            self.take_wanted();
            self.publish();
            self.send_due_probes();
            self.wait();
            self.drain_events();
        }
    }

    /// Dumps links, then the FDB, then the neighbour tables.
    fn resync(&mut self) -> anyhow::Result<()> {
        self.need_resync = false;
        // Events queued before the dump are applied after it; they are older than the dump
        // or repeat it, and either way end in the kernel's current state.
        self.map.forget_evidence();
        let link_dump = RouteNetlinkMessage::GetLink(LinkMessage::default());
        for msg in self
            .requests
            .dump(link_dump)
            .context("rtnetlink link dump")?
        {
            self.map.apply(&msg);
        }
        for family in [
            AddressFamily::Bridge,
            AddressFamily::Inet,
            AddressFamily::Inet6,
        ] {
            let mut req = NeighbourMessage::default();
            req.header.family = family;
            let dump = self.requests.dump(RouteNetlinkMessage::GetNeighbour(req));
            for msg in dump.context("rtnetlink neighbour dump")? {
                self.map.apply(&msg);
            }
        }
        debug!(pairs = self.map.pairs.len(), "bridge resolver: dumped");
        Ok(())
    }

    /// Takes the addresses `resolve` asked about into the probe schedule.
    fn take_wanted(&mut self) {
        let wanted =
            std::mem::take(&mut self.shared.lock().unwrap_or_else(|e| e.into_inner()).wanted);
        let now = Instant::now();
        for ip in wanted {
            if self.published.as_ref().is_some_and(|p| p.contains_key(&ip)) {
                continue;
            }
            self.probes.entry(ip).or_insert_with(|| Probe {
                first: now,
                next: now,
                backoff: Backoff::new(Policy::BRIDGE_PROBE),
            });
        }
    }

    /// Makes the map visible to `resolve` and tells the agent when it changed.
    fn publish(&mut self) {
        let resolved = self.map.resolved();
        if self.published.as_ref() == Some(&resolved) {
            return;
        }
        for (ip, port) in &resolved {
            if self.published.as_ref().and_then(|p| p.get(ip)) != Some(port) {
                info!(address = %ip, port, "bridge port learned");
            }
        }
        if let Some(old) = &self.published {
            for (ip, port) in old {
                if !resolved.contains_key(ip) {
                    info!(address = %ip, port, "bridge port gone");
                }
            }
        }
        self.probes.retain(|ip, _| !resolved.contains_key(ip));
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resolved = resolved.clone();
        self.published = Some(resolved);
        (self.changed)();
    }

    fn send_due_probes(&mut self) {
        let Some(bridge) = self.map.bridge_index() else {
            return;
        };
        let now = Instant::now();
        let due: Vec<IpAddr> = self
            .probes
            .iter()
            .filter(|(_, p)| p.next <= now)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in due {
            let Some(p) = self.probes.get_mut(&ip) else {
                continue;
            };
            if now.duration_since(p.first) > PROBE_GIVE_UP {
                info!(address = %ip, "no answer on the bridge for 10 minutes; no longer probing (the pod's own traffic still teaches its port)");
                self.probes.remove(&ip);
                continue;
            }
            p.next = now + p.backoff.next_delay();
            if let Err(e) = self.probe(bridge, ip) {
                warn!(address = %ip, error = %e, "asking the kernel to resolve a pod address failed");
            }
        }
    }

    /// `ip neigh replace <ip> dev <bridge> use`: creates the neighbour entry if needed and
    /// starts the kernel's resolution (ARP / neighbour solicitation).
    fn probe(&mut self, bridge: u32, ip: IpAddr) -> io::Result<()> {
        let mut req = NeighbourMessage::default();
        req.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        req.header.ifindex = bridge;
        req.header.state = NeighbourState::None;
        req.header.flags = NeighbourFlags::Use;
        req.attributes
            .push(NeighbourAttribute::Destination(match ip {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
        debug!(address = %ip, "probing");
        self.requests
            .request(RouteNetlinkMessage::NewNeighbour(req), NLM_F_CREATE)
    }

    /// Sleeps until an event, a wake-up from `resolve`, the next probe or the tick.
    fn wait(&mut self) {
        let now = Instant::now();
        let timeout = self
            .probes
            .values()
            .map(|p| p.next.saturating_duration_since(now))
            .min()
            .unwrap_or(TICK)
            .min(TICK);
        let mut fds = [
            nix::poll::PollFd::new(self.events.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(self.wake.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let _ = nix::poll::poll(&mut fds, ms);
        let mut sink = [0u8; 64];
        while self.wake.recv(&mut sink).is_ok() {}
    }

    fn drain_events(&mut self) {
        loop {
            match self.events.recv_events() {
                Ok(Some(messages)) => {
                    for m in &messages {
                        self.map.apply(m);
                    }
                }
                Ok(None) => return,
                Err(e) if is_overrun(&e) => {
                    warn!(
                        "bridge resolver: rtnetlink event queue overflowed; re-reading everything"
                    );
                    self.need_resync = true;
                }
                Err(e) => {
                    warn!(error = %e, "bridge resolver: reading rtnetlink events failed; re-reading everything");
                    self.need_resync = true;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iface_naming::test_support::pod;

    impl BridgeResolver {
        /// Replaces the published map (tests without a kernel).
        fn publish(&self, resolved: BTreeMap<IpAddr, String>) {
            self.shared.lock().unwrap().resolved = resolved;
        }
    }

    const BR: u32 = 10;
    const MAC_A: Mac = [0x0a, 0, 0, 0, 0, 1];
    const MAC_B: Mac = [0x0a, 0, 0, 0, 0, 2];

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn map() -> PortMap {
        let mut m = PortMap::new("cni0", &["veth".to_string()]);
        m.link(BR, "cni0", None);
        m.link(1, "eth0", None);
        m.link(11, "vethaaaa0001", Some(BR));
        m.link(12, "vethbbbb0002", Some(BR));
        m
    }

    fn names(m: &PortMap) -> Vec<(String, String)> {
        m.resolved()
            .into_iter()
            .map(|(ip, port)| (ip.to_string(), port))
            .collect()
    }

    #[test]
    fn neighbour_and_fdb_together_name_the_port_in_any_order() {
        let mut m = map();
        m.neighbour(BR, ip("10.244.0.2"), MAC_A);
        assert!(
            names(&m).is_empty(),
            "a MAC without an FDB entry names nothing"
        );
        m.fdb_entry(BR, MAC_A, 11);
        assert_eq!(names(&m), [("10.244.0.2".into(), "vethaaaa0001".into())]);

        let mut m = map();
        m.fdb_entry(BR, MAC_B, 12);
        m.neighbour(BR, ip("fd00::3"), MAC_B);
        assert_eq!(names(&m), [("fd00::3".into(), "vethbbbb0002".into())]);
    }

    #[test]
    fn aged_out_evidence_keeps_the_pairing_until_the_port_goes() {
        let mut m = map();
        m.neighbour(BR, ip("10.244.0.2"), MAC_A);
        m.fdb_entry(BR, MAC_A, 11);
        m.fdb_gone(BR, MAC_A);
        m.neighbour_gone(BR, ip("10.244.0.2"));
        assert_eq!(
            names(&m).len(),
            1,
            "FDB ageing and neighbour GC forget nothing"
        );
        m.link_gone(11);
        assert!(
            names(&m).is_empty(),
            "a deleted veth takes its pairing along"
        );
    }

    #[test]
    fn a_port_leaving_the_bridge_or_renamed_is_followed() {
        let mut m = map();
        m.neighbour(BR, ip("10.244.0.2"), MAC_A);
        m.fdb_entry(BR, MAC_A, 11);
        m.link(11, "vethrenamed01", Some(BR));
        assert_eq!(names(&m)[0].1, "vethrenamed01");
        m.link(11, "vethrenamed01", None);
        assert!(names(&m).is_empty());
    }

    #[test]
    fn contradicting_evidence_does_not_move_a_live_pairing() {
        let mut m = map();
        m.neighbour(BR, ip("10.244.0.2"), MAC_A);
        m.fdb_entry(BR, MAC_A, 11);
        // Another pod answers ARP for the address.
        m.fdb_entry(BR, MAC_B, 12);
        m.neighbour(BR, ip("10.244.0.2"), MAC_B);
        assert_eq!(names(&m)[0].1, "vethaaaa0001");
        // Once the first port is deleted, the evidence at hand is taken at once.
        m.link_gone(11);
        assert_eq!(names(&m), [("10.244.0.2".into(), "vethbbbb0002".into())]);
    }

    #[test]
    fn only_prefixed_ports_of_our_bridge_count() {
        let mut m = map();
        m.link(13, "tap0", Some(BR));
        m.link(20, "br1", None);
        m.link(21, "vethcccc0003", Some(20));
        m.neighbour(BR, ip("10.244.0.5"), MAC_A);
        m.fdb_entry(BR, MAC_A, 13);
        m.neighbour(20, ip("10.244.0.6"), MAC_B);
        m.fdb_entry(20, MAC_B, 21);
        assert!(names(&m).is_empty());
    }

    #[test]
    fn a_bridge_that_appears_later_is_picked_up() {
        let mut m = PortMap::new("cni0", &["veth".to_string()]);
        m.link(11, "vethaaaa0001", Some(BR));
        m.fdb_entry(BR, MAC_A, 11);
        m.neighbour(BR, ip("10.244.0.2"), MAC_A);
        assert!(names(&m).is_empty());
        m.link(BR, "cni0", None);
        assert_eq!(names(&m).len(), 1);
        m.link_gone(BR);
        assert!(names(&m).is_empty());
    }

    #[test]
    fn resolve_reads_the_published_map_and_records_what_it_misses() {
        let r = BridgeResolver::new("cni0", "veth").unwrap();
        let mut p = pod("default", "web", None);
        p.ips = vec![ip("10.244.0.2"), ip("fd00::2")];
        let err = r.resolve(&p).unwrap_err();
        assert!(
            matches!(err, NamingError::BridgePortUnknown { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("cni0"), "{err}");
        assert_eq!(r.shared.lock().unwrap().wanted.len(), 2);

        r.publish([(ip("fd00::2"), "vethaaaa0001".to_string())].into());
        assert_eq!(r.resolve(&p).unwrap(), "vethaaaa0001");
        r.publish(
            [
                (ip("10.244.0.2"), "vethaaaa0001".to_string()),
                (ip("fd00::2"), "vethaaaa0001".to_string()),
            ]
            .into(),
        );
        assert_eq!(r.resolve(&p).unwrap(), "vethaaaa0001");
        r.publish(
            [
                (ip("10.244.0.2"), "vethaaaa0001".to_string()),
                (ip("fd00::2"), "vethbbbb0002".to_string()),
            ]
            .into(),
        );
        assert!(matches!(
            r.resolve(&p),
            Err(NamingError::BridgePortsDiffer { .. })
        ));
    }
}
