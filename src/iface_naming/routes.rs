//! The routes scheme: a local pod's interface is the output interface of the host route to
//! its IP (`/32`, `/128`), found in any routing table. Works with every routed-veth CNI
//! whatever its naming: Calico (main table), hybridnet (table 39999, reached through an
//! `ip rule`), terway and cloud VPC CNIs.
//!
//! [`RoutesResolver::start`] reads the links and the routes of every table over netlink
//! (on the calling thread, so a failure stops startup), then follows route and link events
//! on its own thread until `stop`. Every time the IP → interface mapping changes it is
//! published whole (an `Arc` swap) and the notifier is called; `resolve` only reads the
//! published map and never waits on I/O.
//!
//! The kernel does not announce every removal: when a link is deleted or set down, IPv4
//! removes the routes through it without `RTM_DELROUTE`. Such link events remove those routes
//! here too and trigger a full re-read; so does an overrun of the event socket.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{
    parse_prefix_list, validate_pod_interface_name, ChangeNotifier, InterfaceResolver, NamingError,
};
use crate::host::netlink::{
    self, is_overrun, Link, RouteEntry, RouteKey, RtnlSocket, RTNLGRP_IPV4_ROUTE,
    RTNLGRP_IPV6_ROUTE, RTNLGRP_LINK,
};
use crate::model::PodInfo;

/// How often the watcher thread looks at the stop flag when no event arrives.
const STOP_POLL: Duration = Duration::from_millis(200);
/// At most this many event datagrams are applied before the map is published, so a
/// never-ending stream of events cannot hold back what was already learned.
const MAX_BATCH: usize = 1024;

/// Where a pod IP's host route sends packets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteTarget {
    /// Routing table id (254 is main).
    pub table: u32,
    pub ifindex: u32,
    /// The interface's name; `None` while the link is not known (a route event that arrived
    /// before its link's).
    pub iface: Option<String>,
}

/// Every address with a usable host route, and where each of its routes goes (one per table
/// and metric that holds one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMap {
    by_ip: BTreeMap<IpAddr, BTreeSet<RouteTarget>>,
}

impl RouteMap {
    pub fn targets(&self, ip: &IpAddr) -> Option<&BTreeSet<RouteTarget>> {
        self.by_ip.get(ip)
    }

    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }

    /// The interface names of every address's routes (for logs and tests).
    pub fn interfaces(&self) -> BTreeMap<IpAddr, BTreeSet<String>> {
        self.by_ip
            .iter()
            .map(|(ip, targets)| {
                let names = targets
                    .iter()
                    .map(|t| match &t.iface {
                        Some(name) => name.clone(),
                        None => format!("ifindex {}", t.ifindex),
                    })
                    .collect();
                (*ip, names)
            })
            .collect()
    }
}

/// One host route of a pod, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRoute {
    pub ip: IpAddr,
    pub iface: String,
    pub table: u32,
}

impl fmt::Display for PodRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} → {} (table {})",
            self.ip,
            self.iface,
            table_name(self.table)
        )
    }
}

/// A table id as `ip route` prints it.
pub fn table_name(table: u32) -> String {
    match table {
        253 => "default".to_string(),
        254 => "main".to_string(),
        255 => "local".to_string(),
        t => t.to_string(),
    }
}

/// The resolution rule, on a published map: every IP of the pod that has a host route must
/// lead to one and the same interface, which must match one of the interface prefixes.
/// IPs without a route are tolerated as long as another IP of the pod has one (a dual-stack
/// pod on a node without IPv6 routes); a pod none of whose IPs has one is refused.
pub fn resolve_from_map(
    map: &RouteMap,
    prefixes: &[String],
    pod: &PodInfo,
) -> Result<String, NamingError> {
    if pod.ips.is_empty() {
        return Err(NamingError::NoPodIp {
            pod: pod.key.clone(),
        });
    }
    let mut routes: Vec<PodRoute> = Vec::new();
    let mut missing = Vec::new();
    for ip in &pod.ips {
        let Some(targets) = map.targets(ip) else {
            missing.push(*ip);
            continue;
        };
        for target in targets {
            let Some(iface) = &target.iface else {
                return Err(NamingError::UnknownRouteInterface {
                    pod: pod.key.clone(),
                    ip: *ip,
                    table: target.table,
                    ifindex: target.ifindex,
                });
            };
            routes.push(PodRoute {
                ip: *ip,
                iface: iface.clone(),
                table: target.table,
            });
        }
    }
    let names: BTreeSet<&str> = routes.iter().map(|r| r.iface.as_str()).collect();
    let name = match names.len() {
        0 => {
            return Err(NamingError::NoHostRoute {
                pod: pod.key.clone(),
                ips: missing,
            })
        }
        1 => names.into_iter().next().unwrap_or_default().to_string(),
        _ => {
            return Err(NamingError::ConflictingRoutes {
                pod: pod.key.clone(),
                routes,
            });
        }
    };
    validate_pod_interface_name(&pod.key, &name)?;
    if !prefixes.iter().any(|p| name.starts_with(p.as_str())) {
        return Err(NamingError::InterfacePrefixMismatch {
            pod: pod.key.clone(),
            name,
            prefixes: prefixes.to_vec(),
        });
    }
    Ok(name)
}

/// The node's links and host routes as last read or told, and the mapping derived from them.
#[derive(Clone, Debug, Default)]
pub struct RouteState {
    links: HashMap<u32, Link>,
    routes: BTreeMap<RouteKey, u32>,
}

/// What an event asks of the watcher beyond applying it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Followup {
    None,
    /// The kernel may have removed routes without saying so: read everything again.
    Resync,
}

impl RouteState {
    /// A state from full dumps.
    pub fn from_dump(
        links: impl IntoIterator<Item = Link>,
        routes: impl IntoIterator<Item = RouteEntry>,
    ) -> RouteState {
        let mut state = RouteState::default();
        for link in links {
            state.links.insert(link.index, link);
        }
        for route in routes {
            state.route_added(route);
        }
        state
    }

    /// `RTM_NEWROUTE`: the route with this key is now this one (a replace is an add with
    /// the same key). One that names no usable interface removes what the key held.
    pub fn route_added(&mut self, route: RouteEntry) {
        match route.oif {
            Some(oif) => {
                self.routes.insert(route.key, oif);
            }
            None => {
                self.routes.remove(&route.key);
            }
        }
    }

    /// `RTM_DELROUTE`.
    pub fn route_deleted(&mut self, key: &RouteKey) {
        self.routes.remove(key);
    }

    /// `RTM_NEWLINK`: a new link, a rename, a state change. A link that went down has lost
    /// its routes (IPv4 does not announce that).
    pub fn link_changed(&mut self, link: Link) -> Followup {
        let was_up = self.links.get(&link.index).map(|l| l.up);
        let index = link.index;
        let up = link.up;
        self.links.insert(index, link);
        if was_up == Some(true) && !up {
            self.drop_routes_via(index);
            Followup::Resync
        } else {
            Followup::None
        }
    }

    /// `RTM_DELLINK` (also sent when a link moves to another namespace, as a pod's veth
    /// peer does).
    pub fn link_deleted(&mut self, index: u32) -> Followup {
        self.links.remove(&index);
        if self.drop_routes_via(index) {
            Followup::Resync
        } else {
            Followup::None
        }
    }

    fn drop_routes_via(&mut self, index: u32) -> bool {
        let before = self.routes.len();
        self.routes.retain(|_, oif| *oif != index);
        self.routes.len() != before
    }

    /// Applies one event from the monitor socket.
    pub fn apply(&mut self, message: &RouteNetlinkMessage) -> Followup {
        match message {
            RouteNetlinkMessage::NewRoute(route) => {
                if let Some(entry) = netlink::parse_host_route(route) {
                    self.route_added(entry);
                }
                Followup::None
            }
            RouteNetlinkMessage::DelRoute(route) => {
                if let Some(entry) = netlink::parse_host_route(route) {
                    self.route_deleted(&entry.key);
                }
                Followup::None
            }
            RouteNetlinkMessage::NewLink(link) => match netlink::parse_link(link) {
                Some(link) => self.link_changed(link),
                None => Followup::None,
            },
            RouteNetlinkMessage::DelLink(link) => self.link_deleted(netlink::link_index(link)),
            _ => Followup::None,
        }
    }

    pub fn map(&self) -> RouteMap {
        let mut by_ip: BTreeMap<IpAddr, BTreeSet<RouteTarget>> = BTreeMap::new();
        for (key, oif) in &self.routes {
            by_ip.entry(key.dst).or_default().insert(RouteTarget {
                table: key.table,
                ifindex: *oif,
                iface: self.links.get(oif).map(|l| l.name.clone()),
            });
        }
        RouteMap { by_ip }
    }
}

/// Reads every link and every IPv4 and IPv6 route of every table.
pub fn read_state(socket: &mut RtnlSocket) -> std::io::Result<RouteState> {
    let links: Vec<Link> = socket
        .dump_links()?
        .iter()
        .filter_map(netlink::parse_link)
        .collect();
    let mut routes = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        routes.extend(
            socket
                .dump_routes(family)?
                .iter()
                .filter_map(netlink::parse_host_route),
        );
    }
    Ok(RouteState::from_dump(links, routes))
}

/// The routes scheme. See the module documentation.
#[derive(Debug)]
pub struct RoutesResolver {
    prefixes: Vec<String>,
    published: Arc<RwLock<Arc<RouteMap>>>,
    started: AtomicBool,
}

impl RoutesResolver {
    /// `prefix_list`: felix's `InterfacePrefix` list; a resolved interface must match one.
    pub fn new(prefix_list: &str) -> Result<RoutesResolver, NamingError> {
        Ok(RoutesResolver {
            prefixes: parse_prefix_list(prefix_list)?,
            published: Arc::new(RwLock::new(Arc::new(RouteMap::default()))),
            started: AtomicBool::new(false),
        })
    }

    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// The mapping as last published.
    pub fn route_map(&self) -> Arc<RouteMap> {
        match self.published.read() {
            Ok(map) => map.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Publishes a mapping (what the watcher does; public for tests of the map logic).
    pub fn publish(&self, map: RouteMap) {
        publish(&self.published, map);
    }
}

fn publish(slot: &RwLock<Arc<RouteMap>>, map: RouteMap) {
    let map = Arc::new(map);
    match slot.write() {
        Ok(mut guard) => *guard = map,
        Err(poisoned) => *poisoned.into_inner() = map,
    }
}

impl InterfaceResolver for RoutesResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        resolve_from_map(&self.route_map(), &self.prefixes, pod)
    }

    fn scheme(&self) -> &'static str {
        "routes"
    }

    /// Opens the sockets and reads the tables on the calling thread (so in its network
    /// namespace, and a failure stops startup), then follows events on a thread of its own.
    fn start(&self, changed: ChangeNotifier, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.started.swap(true, Ordering::SeqCst),
            "the routes interface resolver was started twice"
        );
        // Subscribe before reading, so no change between the dump and the first event is lost.
        let monitor = RtnlSocket::monitor(&[RTNLGRP_LINK, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE])
            .context(
                "routes interface naming: subscribing to link and route events over netlink",
            )?;
        let mut dumper = RtnlSocket::open()
            .context("routes interface naming: opening a netlink route socket")?;
        let state = read_state(&mut dumper)
            .context("routes interface naming: reading this node's links and routes")?;
        let map = state.map();
        tracing::info!(
            host_routes = map.len(),
            "routes interface naming: read every routing table"
        );
        publish(&self.published, map);
        let watcher = Watcher {
            monitor,
            dumper,
            state,
            published: self.published.clone(),
            changed,
            stop,
        };
        std::thread::Builder::new()
            .name("route-watcher".into())
            .spawn(move || watcher.run())
            .context("starting the route watcher thread")?;
        Ok(())
    }
}

struct Watcher {
    monitor: RtnlSocket,
    dumper: RtnlSocket,
    state: RouteState,
    published: Arc<RwLock<Arc<RouteMap>>>,
    changed: ChangeNotifier,
    stop: Arc<AtomicBool>,
}

impl Watcher {
    fn run(mut self) {
        let mut resync_pending = false;
        let mut resync_failing = false;
        while !self.stop.load(Ordering::Relaxed) {
            match self.monitor.wait_readable(STOP_POLL) {
                Ok(true) => {}
                Ok(false) if !resync_pending => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "route watcher: waiting for netlink events failed");
                    std::thread::sleep(STOP_POLL);
                    continue;
                }
            }
            resync_pending |= self.drain();
            if resync_pending {
                match read_state(&mut self.dumper) {
                    Ok(state) => {
                        self.state = state;
                        resync_pending = false;
                        if resync_failing {
                            tracing::info!(
                                "route watcher: re-reading the routing tables works again"
                            );
                        }
                        resync_failing = false;
                    }
                    Err(e) => {
                        // Retried on the next turn; said once.
                        if !resync_failing {
                            tracing::warn!(error = %e, "route watcher: re-reading the routing tables failed; retrying");
                        }
                        resync_failing = true;
                    }
                }
            }
            let map = self.state.map();
            let current = match self.published.read() {
                Ok(m) => m.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            if *current != map {
                tracing::debug!(host_routes = map.len(), "route watcher: pod routes changed");
                publish(&self.published, map);
                (self.changed)();
            }
        }
        tracing::debug!("route watcher stopped");
    }

    /// Applies what the monitor socket holds; `true` when a full re-read is needed.
    fn drain(&mut self) -> bool {
        let mut resync = false;
        for _ in 0..MAX_BATCH {
            match self.monitor.recv_events() {
                Ok(None) => break,
                Ok(Some(messages)) => {
                    for message in &messages {
                        if self.state.apply(message) == Followup::Resync {
                            resync = true;
                        }
                    }
                }
                Err(e) if is_overrun(&e) => {
                    tracing::warn!("route watcher: netlink events were lost (socket overrun); re-reading the routing tables");
                    resync = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "route watcher: reading netlink events failed; re-reading the routing tables");
                    return true;
                }
            }
        }
        resync
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::super::test_support::pod;
    use super::*;
    use crate::host::netlink::RT_TABLE_MAIN;
    use crate::model::ObjectKey;

    const HYBRID: u32 = 39999;

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.to_string(),
            kind: Some("veth".to_string()),
            master: None,
            up: true,
        }
    }

    fn host_route(dst: &str, table: u32, oif: u32) -> RouteEntry {
        RouteEntry {
            key: RouteKey {
                dst: dst.parse().unwrap(),
                table,
                metric: 0,
                tos: 0,
            },
            oif: Some(oif),
        }
    }

    fn pod_with(ips: &[&str]) -> PodInfo {
        let mut p = pod("default", "web-1", None);
        p.ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        p
    }

    fn prefixes(list: &str) -> Vec<String> {
        parse_prefix_list(list).unwrap()
    }

    fn state() -> RouteState {
        RouteState::from_dump(
            [
                link(2, "eth0"),
                link(7, "hybr6b3adcd7e1e"),
                link(8, "hybr1b7a9ed1883"),
            ],
            [
                host_route("172.24.0.1", HYBRID, 7),
                host_route("172.24.0.4", HYBRID, 8),
                host_route("fd00::1", RT_TABLE_MAIN, 7),
            ],
        )
    }

    #[test]
    fn pod_resolves_to_its_host_route_in_any_table() {
        let map = state().map();
        assert_eq!(
            resolve_from_map(&map, &prefixes("hybr"), &pod_with(&["172.24.0.4"])),
            Ok("hybr1b7a9ed1883".to_string())
        );
    }

    #[test]
    fn ipv4_and_ipv6_routes_to_one_interface_agree() {
        let map = state().map();
        assert_eq!(
            resolve_from_map(
                &map,
                &prefixes("hybr"),
                &pod_with(&["172.24.0.1", "fd00::1"])
            ),
            Ok("hybr6b3adcd7e1e".to_string())
        );
        // An IP without a route is tolerated when another has one.
        assert_eq!(
            resolve_from_map(
                &map,
                &prefixes("hybr"),
                &pod_with(&["172.24.0.4", "fd00::4"])
            ),
            Ok("hybr1b7a9ed1883".to_string())
        );
    }

    #[test]
    fn ips_on_different_interfaces_conflict() {
        let map = state().map();
        let err = resolve_from_map(
            &map,
            &prefixes("hybr"),
            &pod_with(&["172.24.0.4", "fd00::1"]),
        )
        .unwrap_err();
        let NamingError::ConflictingRoutes { routes, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(routes.len(), 2);
        let message = err.to_string();
        assert!(
            message.contains("172.24.0.4 → hybr1b7a9ed1883 (table 39999)"),
            "{message}"
        );
        assert!(
            message.contains("fd00::1 → hybr6b3adcd7e1e (table main)"),
            "{message}"
        );
    }

    #[test]
    fn one_ip_routed_to_two_interfaces_in_two_tables_conflicts() {
        let mut s = state();
        s.route_added(host_route("172.24.0.4", RT_TABLE_MAIN, 7));
        assert!(matches!(
            resolve_from_map(&s.map(), &prefixes("hybr"), &pod_with(&["172.24.0.4"])),
            Err(NamingError::ConflictingRoutes { .. })
        ));
        // The same interface in two tables is no conflict.
        let mut s = state();
        s.route_added(host_route("172.24.0.4", RT_TABLE_MAIN, 8));
        assert_eq!(
            resolve_from_map(&s.map(), &prefixes("hybr"), &pod_with(&["172.24.0.4"])),
            Ok("hybr1b7a9ed1883".to_string())
        );
    }

    #[test]
    fn no_host_route_is_reported_not_guessed() {
        let err = resolve_from_map(&state().map(), &prefixes("hybr"), &pod_with(&["10.1.2.3"]))
            .unwrap_err();
        assert_eq!(
            err,
            NamingError::NoHostRoute {
                pod: ObjectKey::new("default", "web-1"),
                ips: vec![IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))],
            }
        );
        assert_eq!(
            err.to_string(),
            "pod default/web-1: no host route to 10.1.2.3 in any routing table"
        );
        let both = resolve_from_map(
            &state().map(),
            &prefixes("hybr"),
            &pod_with(&["10.1.2.3", "fd00::9"]),
        )
        .unwrap_err();
        assert!(
            both.to_string()
                .contains("no host route to 10.1.2.3 or fd00::9 in any routing table"),
            "{both}"
        );
        assert!(matches!(
            resolve_from_map(&state().map(), &prefixes("hybr"), &pod_with(&[])),
            Err(NamingError::NoPodIp { .. })
        ));
    }

    #[test]
    fn interface_outside_the_prefixes_is_reported() {
        let err = resolve_from_map(
            &state().map(),
            &prefixes("cali,tap"),
            &pod_with(&["172.24.0.4"]),
        )
        .unwrap_err();
        assert!(matches!(err, NamingError::InterfacePrefixMismatch { .. }));
        let message = err.to_string();
        assert!(message.contains("hybr1b7a9ed1883"), "{message}");
        assert!(message.contains("cali, tap"), "{message}");
        assert!(message.contains("-i cali+"), "{message}");
        // The second prefix of a list counts as well.
        assert!(resolve_from_map(
            &state().map(),
            &prefixes("cali,hybr"),
            &pod_with(&["172.24.0.4"])
        )
        .is_ok());
    }

    #[test]
    fn route_to_an_unknown_link_is_not_guessed() {
        let mut s = state();
        s.route_added(host_route("172.24.0.9", HYBRID, 42));
        let err =
            resolve_from_map(&s.map(), &prefixes("hybr"), &pod_with(&["172.24.0.9"])).unwrap_err();
        assert!(matches!(
            err,
            NamingError::UnknownRouteInterface {
                ifindex: 42,
                table: HYBRID,
                ..
            }
        ));
        s.link_changed(link(42, "hybr0000000000a"));
        assert_eq!(
            resolve_from_map(&s.map(), &prefixes("hybr"), &pod_with(&["172.24.0.9"])),
            Ok("hybr0000000000a".to_string())
        );
    }

    #[test]
    fn events_follow_routes_and_links() {
        let mut s = state();
        let before = s.map();
        // Rename.
        assert_eq!(s.link_changed(link(8, "hybrrenamed0001")), Followup::None);
        assert_ne!(s.map(), before);
        assert_eq!(
            resolve_from_map(&s.map(), &prefixes("hybr"), &pod_with(&["172.24.0.4"])),
            Ok("hybrrenamed0001".to_string())
        );
        // Down: its routes are gone (IPv4 flushes them silently).
        let mut down = link(8, "hybrrenamed0001");
        down.up = false;
        assert_eq!(s.link_changed(down), Followup::Resync);
        assert!(s.map().targets(&"172.24.0.4".parse().unwrap()).is_none());
        // Delete.
        assert_eq!(s.link_deleted(7), Followup::Resync);
        assert!(s.map().targets(&"172.24.0.1".parse().unwrap()).is_none());
        assert!(s
            .map()
            .targets(&IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)))
            .is_none());
        assert_eq!(s.link_deleted(99), Followup::None);
        // Route delete and a replace by a route that names no interface.
        let mut s = state();
        s.route_deleted(&host_route("172.24.0.1", HYBRID, 7).key);
        assert!(s.map().targets(&"172.24.0.1".parse().unwrap()).is_none());
        let mut blackhole = host_route("172.24.0.4", HYBRID, 8);
        blackhole.oif = None;
        s.route_added(blackhole);
        assert!(s.map().targets(&"172.24.0.4".parse().unwrap()).is_none());
    }

    #[test]
    fn published_map_is_what_resolve_reads() {
        let resolver = RoutesResolver::new("hybr").unwrap();
        assert!(resolver.route_map().is_empty());
        assert!(matches!(
            resolver.resolve(&pod_with(&["172.24.0.4"])),
            Err(NamingError::NoHostRoute { .. })
        ));
        resolver.publish(state().map());
        assert_eq!(
            resolver.resolve(&pod_with(&["172.24.0.4"])),
            Ok("hybr1b7a9ed1883".to_string())
        );
        assert_eq!(resolver.scheme(), "routes");
    }
}
