//! The container runtime of a simulated node for `--cni sandbox`: a CRI server on a unix
//! socket (`cri_server`, the real gRPC protocol) that knows each local pod's sandboxes, as
//! containerd or CRI-O would. Every third pod also has an older sandbox that failed
//! (NOTREADY, created earlier), the race seed 004 describes: the agent must pick the READY
//! sandbox created last, whose ID names the pod's veth.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cni::Cni;
use crate::cri_server::CriServer;
use crate::scenario::Pod;

pub struct NodeRuntime {
    socket: PathBuf,
    server: CriServer,
}

fn pod_uid(pod: &Pod) -> String {
    format!("00000000-0000-4000-8000-{:012}", pod.uid)
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl NodeRuntime {
    pub fn start(socket: &Path) -> anyhow::Result<NodeRuntime> {
        let server = CriServer::start(socket)?;
        Ok(NodeRuntime {
            socket: socket.to_path_buf(),
            server,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Registers the pod's sandboxes before the agent can see the pod: a failed earlier
    /// attempt for every third pod, then the READY one its veth is named after.
    pub fn add_pod(&self, run_tag: &str, pod: &Pod) -> anyhow::Result<()> {
        let uid = pod_uid(pod);
        let created = now_ns();
        if pod.uid.is_multiple_of(3) {
            let failed = Cni::sandbox_id(run_tag, pod, 0);
            self.server.add_sandbox(
                &pod.namespace,
                &pod.name,
                &uid,
                &failed,
                false,
                created - 5_000_000_000,
            );
        }
        let id = Cni::sandbox_id(run_tag, pod, 1);
        self.server
            .add_sandbox(&pod.namespace, &pod.name, &uid, &id, true, created);
        Ok(())
    }

    pub fn remove_pod(&self, run_tag: &str, pod: &Pod) -> anyhow::Result<()> {
        for attempt in [0, 1] {
            self.server
                .remove_sandbox(&Cni::sandbox_id(run_tag, pod, attempt));
        }
        Ok(())
    }
}
