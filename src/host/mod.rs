//! The node itself, at the edge: running external tools (optionally in a network namespace),
//! talking rtnetlink, and the preflight checks that refuse a node whose dataplane bypasses
//! host netfilter. Knows nothing of policies.

pub mod exec;
pub mod netlink;
pub mod preflight;
