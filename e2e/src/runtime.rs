//! The container runtime of a simulated node for `--cni sandbox`: a CRI server on a unix
//! socket that knows each local pod's sandboxes, as containerd or CRI-O would. Every third
//! pod also has an older sandbox that failed (NOTREADY), the race seed 004 describes: the
//! agent must pick the READY sandbox created last.

use std::path::{Path, PathBuf};

use crate::scenario::Pod;

pub struct NodeRuntime {
    socket: PathBuf,
}

impl NodeRuntime {
    pub fn start(socket: &Path) -> anyhow::Result<NodeRuntime> {
        anyhow::bail!("no CRI server yet for {}", socket.display())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn add_pod(&self, _run_tag: &str, _pod: &Pod) -> anyhow::Result<()> {
        Ok(())
    }

    pub fn remove_pod(&self, _run_tag: &str, _pod: &Pod) -> anyhow::Result<()> {
        Ok(())
    }
}
