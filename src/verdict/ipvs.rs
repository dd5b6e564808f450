//! A flow addressed to a Service under kube-proxy's IPVS mode, as one node's filter table
//! sees its first packet: on the source pod's node it is delivered locally to the ClusterIP
//! (`INPUT`, where our rules only tag it with the source's endpoint mark), IPVS rewrites the
//! destination to the backend, and it leaves through `OUTPUT` still carrying the mark (where
//! the source's egress and a local backend's ingress policy are applied). Pure: it only
//! shapes the packets `kernel::trace_marked` follows; `docs/design/ipvs.md` has the path.
//!
//! kube-proxy's IPVS mode at each layer: read off the node in `host::ipvs`, detected and
//! watched for `run` in `startup::ipvs`, rendered in `rules::ipvs`, evaluated in
//! `verdict::ipvs`.

use std::net::IpAddr;

use super::kernel::{Iface, Packet};
use super::{FlowError, NodePass, ResolvedFlow, Side, State};

impl State {
    /// The passes of `flow` (whose destination is the backend IPVS chose) on `node` when the
    /// client addressed `service_ip` and the node runs kube-proxy's IPVS mode (the caller
    /// asks only then: under its other modes the ClusterIP is rewritten before filtering and
    /// `node_passes` holds). Unless the source is a pod of `node` (another node's pod reaches
    /// this one already rewritten) the passes are `node_passes`'. Otherwise two: `INPUT` to the ClusterIP
    /// (tags, enforces nothing by itself), then `OUTPUT` to the backend with that mark,
    /// which enforces what `FORWARD` would have (egress, and ingress for a local backend).
    pub fn node_passes_via_service(
        &self,
        flow: &ResolvedFlow,
        node: &str,
        service_ip: IpAddr,
    ) -> Result<Vec<NodePass>, FlowError> {
        if service_ip.is_ipv4() != flow.dst_ip.is_ipv4() {
            return Err(FlowError(format!(
                "the Service address {service_ip} and the destination {} are of different families",
                flow.dst_ip
            )));
        }
        let passes = self.node_passes(flow, node)?;
        let src_local =
            matches!(&flow.src, Side::Pod(i) if self.pods[*i].node.as_deref() == Some(node));
        let direct = match passes.as_slice() {
            [p] if src_local && p.hook == "FORWARD" => p.clone(),
            _ => return Ok(passes),
        };
        let to_service = Packet {
            dst: service_ip,
            out_iface: Iface::Absent,
            physdev_out: None,
            bridged: false,
            ..direct.packet.clone()
        };
        // After IPVS: the node itself sends it; routing picks the output interface (a local
        // pod's veth, the bridge, or the uplink); the bridge port is not known in OUTPUT.
        let to_backend = Packet {
            in_iface: Iface::Absent,
            physdev_in: None,
            physdev_out: None,
            bridged: false,
            ..direct.packet.clone()
        };
        Ok(vec![
            NodePass {
                hook: "INPUT",
                packet: to_service,
                enforces: Vec::new(),
                carries_mark: false,
            },
            NodePass {
                hook: "OUTPUT",
                packet: to_backend,
                enforces: direct.enforces,
                carries_mark: true,
            },
        ])
    }
}
