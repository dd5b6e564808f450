//! netpol-agent: Kubernetes NetworkPolicy enforcement with iptables and ipset, felix style,
//! beside an existing routed-veth CNI.
//!
//! Rooms: `datastore` (manifests in, Kubernetes objects out), `calc_graph` (objects in,
//! incremental desired state out; pure), `rules` (felix-compatible chain rendering; pure),
//! `ipsets` (set naming, members and restore scripts; `ipsets::kernel` applies them),
//! `iptables_writer` (our chains and kernel-chain rules into the kernel, by diff),
//! `dataplane` (apply order), `agent` (the event loop), `iface_naming` (pod → host veth),
//! `exec` (running external tools, optionally in a network namespace), `netlink` (links and
//! routes over rtnetlink), `preflight` (refusing dataplanes that bypass host netfilter).

pub mod agent;
pub mod calc_graph;
pub mod change_detect;
pub mod config;
pub mod dataplane;
pub mod datastore;
pub mod exec;
pub mod health;
pub mod http;
pub mod iface_naming;
pub mod ipsets;
pub mod iptables_writer;
pub mod metrics;
pub mod netlink;
pub mod preflight;
pub mod rules;
pub mod verify;
