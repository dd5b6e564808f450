//! The node itself, at the edge: running external tools (optionally in a network namespace),
//! talking rtnetlink and nfnetlink (NFLOG groups, conntrack), and the preflight checks that
//! refuse a node whose dataplane bypasses host netfilter or that runs Calico's felix, giving
//! freed heap back to the kernel. Knows nothing of policies.

pub mod conntrack;
pub mod exec;
pub mod felix;
pub mod iface_probe;
pub mod ipvs;
pub mod memory;
pub mod netlink;
pub mod nflog;
pub mod nfnetlink;
pub mod poll;
pub mod preflight;
pub mod rule_counters;
pub mod wiring;
