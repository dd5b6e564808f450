//! The simulated CNIs: how a pod's host-side interface is named and wired, and how the
//! agent must be configured to find it. Each variant mirrors what the real CNI does on a
//! node, so the agent sees the same kernel objects it would see there.

use clap::ValueEnum;
use sha1::{Digest, Sha1};

use crate::scenario::Pod;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Cni {
    /// Calico's CNI plugin: host veth `cali` + sha1("<ns>.<pod>")[:11], pod IP /32, default
    /// route via 169.254.1.1 answered by proxy ARP, a /32 route to the pod on its node.
    Calico,
    /// Routed like Calico, but the host veth is `veth-` + the first 10 characters of the
    /// pod's sandbox ID (seed 004), which the agent learns from a CRI server on the node;
    /// some pods also have an older, failed sandbox.
    Sandbox,
    /// hybridnet: host veth `hybr` + 11 hex, pod routes in policy-routing table 39999
    /// reached through `ip rule 1: from all lookup 39999`; the agent discovers interfaces
    /// from the routing tables.
    Hybridnet,
    /// flannel's bridge: pods on `cni0` through random `veth` + 8 hex ports, pod IPs in the
    /// node's /24 with the bridge as gateway, br_netfilter on; the agent matches bridge
    /// ports with `-m physdev`.
    Bridge,
}

/// How pods reach their node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// A point-to-point veth: pod `/32` (`/128`), `169.254.1.1` gateway with proxy ARP (for
    /// IPv6 the host veth's link-local address), a host route per pod address in `table`
    /// (None = main).
    Routed { table: Option<u32> },
    /// A port of the node's `cni0` bridge: pod in the node's /24 (its `/120` embedding),
    /// gateway `.1` (embedded) on the bridge.
    Bridged,
}

/// The bridge of `--cni bridge`.
pub const BRIDGE: &str = "cni0";
/// hybridnet's table for local pod routes.
pub const HYBRIDNET_TABLE: u32 = 39999;

fn hex_digest(input: &str) -> String {
    hex::encode(Sha1::digest(input.as_bytes()))
}

impl Cni {
    pub fn name(self) -> &'static str {
        match self {
            Cni::Calico => "calico",
            Cni::Sandbox => "sandbox",
            Cni::Hybridnet => "hybridnet",
            Cni::Bridge => "bridge",
        }
    }

    pub fn wiring(self) -> Wiring {
        match self {
            Cni::Calico | Cni::Sandbox => Wiring::Routed { table: None },
            Cni::Hybridnet => Wiring::Routed {
                table: Some(HYBRIDNET_TABLE),
            },
            Cni::Bridge => Wiring::Bridged,
        }
    }

    /// The pod's sandbox ID (64 hex, as containerd's): unique per pod incarnation and run.
    pub fn sandbox_id(run_tag: &str, pod: &Pod, attempt: u32) -> String {
        let a = hex_digest(&format!("{run_tag}/{}/{attempt}/a", pod.uid));
        let b = hex_digest(&format!("{run_tag}/{}/{attempt}/b", pod.uid));
        format!("{a}{b}")[..64].to_string()
    }

    /// The host-side interface of a pod, named as the CNI names it.
    pub fn host_iface(self, run_tag: &str, pod: &Pod) -> String {
        match self {
            Cni::Calico => {
                let digest = hex_digest(&format!("{}.{}", pod.namespace, pod.name));
                format!("cali{}", &digest[..11])
            }
            Cni::Sandbox => format!("veth-{}", &Cni::sandbox_id(run_tag, pod, 1)[..10]),
            Cni::Hybridnet => {
                let digest = hex_digest(&format!("{}/{}", pod.namespace, pod.name));
                format!("hybr{}", &digest[..11])
            }
            // Random per pod incarnation, as the bridge plugin's names are.
            Cni::Bridge => format!(
                "veth{}",
                &hex_digest(&format!("{run_tag}/{}", pod.uid))[..8]
            ),
        }
    }

    /// The interface prefix the agent is configured with (its dispatch wildcards).
    pub fn prefix(self) -> &'static str {
        match self {
            Cni::Calico => "cali",
            Cni::Sandbox => "veth-",
            Cni::Hybridnet => "hybr",
            Cni::Bridge => "veth",
        }
    }
}
