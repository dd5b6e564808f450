//! netpol-agent: Kubernetes NetworkPolicy enforcement with iptables and ipset, felix style,
//! beside an existing routed-veth or bridge CNI.
//!
//! The data path, one way (each room's module comment says what it owns):
//!
//! `datastore` (Kubernetes API or manifests → `model` events) → `agent` (the calculation
//! loop: events, and the interface names `iface_naming` resolves at the edge, into the graph)
//! → `calc_graph` (pure: model in, `Update` out; renders chains and sets with `rules`, pure)
//! → `dataplane` (I/O: the iptables and ipset kernel writers and the loop that applies,
//! refreshes and retries).
//!
//! Underneath: `model` (the objects as the agent sees them and their validation; imports
//! nothing of ours), `host` (processes, netlink, preflight checks of the node), `telemetry`
//! (metrics, health, the HTTP servers), `backoff` (the one retry policy), `config` (flags and
//! `FELIX_*` variables).
//!
//! Beside the data path: `verdict` (pure: why a flow is allowed or denied from the objects,
//! and an interpreter of our rules over what a kernel holds), `inspect` (the `explain` and
//! `audit` commands around it) and `traffic` (what the kernel saw of the path: deny logs, rule
//! counters, attributed with what the agent publishes of the graph). `tests/house.rs` keeps
//! these import directions honest.

pub mod agent;
pub mod backoff;
pub mod calc_graph;
pub mod config;
pub mod dataplane;
pub mod datastore;
pub mod host;
pub mod iface_naming;
pub mod inspect;
pub mod kernel_text;
pub mod model;
pub mod rules;
pub mod startup;
pub mod telemetry;
pub mod traffic;
pub mod verdict;
