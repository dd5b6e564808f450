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
}

impl Cni {
    pub fn name(self) -> &'static str {
        match self {
            Cni::Calico => "calico",
        }
    }

    /// The host-side interface of a pod, named as the CNI names it.
    pub fn host_iface(self, pod: &Pod) -> String {
        match self {
            Cni::Calico => {
                let digest = Sha1::digest(format!("{}.{}", pod.namespace, pod.name).as_bytes());
                format!("cali{}", &hex::encode(digest)[..11])
            }
        }
    }

    /// Environment for `netpol-agent run` (and `compile`, which must agree with it).
    pub fn agent_env(self) -> Vec<(&'static str, String)> {
        match self {
            Cni::Calico => vec![
                ("FELIX_INTERFACEPREFIX", "cali".into()),
                ("FELIX_INTERFACENAMESCHEME", "calico".into()),
            ],
        }
    }
}
