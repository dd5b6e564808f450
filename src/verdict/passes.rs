//! A flow's passes through one node's filter table (`FORWARD`, `INPUT`, `OUTPUT`), for
//! following its first packet through what that node's kernel holds (`kernel`).

use super::*;

/// One pass of a flow's first packet through a hook of one node's filter table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePass {
    /// `FORWARD`, `INPUT` (to the node itself) or `OUTPUT` (from the node itself).
    pub hook: &'static str,
    pub packet: kernel::Packet,
    /// The directions this pass enforces (what the policies' answer for the node is).
    pub enforces: Vec<Direction>,
    /// The packet enters this hook with the mark the previous pass left on it (kube-proxy
    /// IPVS mode: `OUTPUT` reads the endpoint mark `INPUT` set), not a clear one.
    pub carries_mark: bool,
}

impl State {
    /// How the flow's first packet crosses `node`'s filter table: one pass for the side(s)
    /// that are local pods (or the node itself), with the interfaces (routed veths, or the
    /// bridge and its ports) the kernel shows. Empty when nothing of the flow is on the node.
    /// A local pod whose interface is not known is an error naming it.
    pub fn node_passes(&self, flow: &ResolvedFlow, node: &str) -> Result<Vec<NodePass>, FlowError> {
        use kernel::{Iface, Packet};
        let local = |side: &Side| match side {
            Side::Pod(i) => self.pods[*i].node.as_deref() == Some(node),
            _ => false,
        };
        let iface = |side: &Side| -> Result<String, FlowError> {
            let Side::Pod(i) = side else {
                return Err(FlowError("not a pod".into()));
            };
            let key = &self.pods[*i].key;
            self.interfaces.get(key).cloned().ok_or_else(|| {
                FlowError(format!(
                    "pod {key} is on node {node} but its interface is not known (check the interface-naming scheme and that the pod is running)"
                ))
            })
        };
        let is_host = |side: &Side| matches!(side, Side::Host { node: n } if n == node);
        if matches!((&flow.src, &flow.dst), (Side::Pod(a), Side::Pod(b)) if a == b) {
            return Ok(Vec::new());
        }
        let bridge = self.cfg.bridge.clone();
        let (src_local, dst_local) = (local(&flow.src), local(&flow.dst));
        let mut p = Packet {
            src: flow.src_ip,
            dst: flow.dst_ip,
            protocol: flow.protocol,
            dport: flow.port,
            in_iface: Iface::NonPod,
            out_iface: Iface::NonPod,
            physdev_in: None,
            physdev_out: None,
            bridged: false,
        };
        let mut enforces = Vec::new();
        let mut hook = "FORWARD";
        if src_local {
            let i = iface(&flow.src)?;
            enforces.push(Direction::Egress);
            match &bridge {
                None => p.in_iface = Iface::Named(i),
                Some(b) => {
                    p.in_iface = Iface::Named(b.clone());
                    p.physdev_in = Some(i);
                }
            }
        } else if is_host(&flow.src) {
            hook = "OUTPUT";
            p.in_iface = Iface::Absent;
        }
        if dst_local {
            let i = iface(&flow.dst)?;
            if hook == "FORWARD" {
                enforces.push(Direction::Ingress);
            }
            match &bridge {
                None => p.out_iface = Iface::Named(i),
                Some(b) => {
                    p.out_iface = Iface::Named(b.clone());
                    // Bridged between two ports of this node; routed in from elsewhere, the
                    // kernel knows no port (rules::bridge).
                    if src_local {
                        p.physdev_out = Some(i);
                        p.bridged = true;
                    }
                }
            }
        } else if is_host(&flow.dst) && src_local {
            hook = "INPUT";
            p.out_iface = Iface::Absent;
        }
        if !src_local && !dst_local {
            return Ok(Vec::new());
        }
        Ok(vec![NodePass {
            hook,
            packet: p,
            enforces,
            carries_mark: false,
        }])
    }
}
