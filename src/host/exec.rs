//! How the dataplane starts external programs (`ipset`, `iptables-restore`, ...): the agent
//! runs them directly, in its own network namespace; tests and benchmarks run them inside a
//! throwaway namespace of theirs, so that the same code programs it.
//!
//! A namespaced child enters the namespace itself, with `setns(2)` between fork and exec,
//! rather than behind `ip netns exec`. The wrapper is one more program per command and sets
//! up a mount namespace each time (about 1.5 ms here, more than the `ipset restore` of one
//! member), which the agent in a pod never pays: a benchmark timed through it measured the
//! wrapper, not the agent. `setns` with the namespace's `/run/netns/<name>` file is what
//! `ip netns exec` itself does for the network part; the mount part (`/sys` remounted, files
//! from `/etc/netns/<name>` bound) is not needed by any program started here, which read
//! only netlink, the `ip_tables` sockets and `/proc/net` (all per network namespace).
//! Hand-written on `libc` because the step runs in the forked child, where only
//! async-signal-safe calls are allowed: `open`, `setns` and `close`, nothing that allocates.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// How to run commands: in the caller's own network namespace (the agent), or inside a named
/// one (tests, benchmarks).
#[derive(Clone, Debug, Default)]
pub struct Exec {
    /// `/run/netns/<name>`, entered by the child before it runs the program.
    netns: Option<CString>,
}

impl Exec {
    /// Runs commands inside network namespace `name` (one made by `ip netns add <name>`).
    /// A namespace that does not exist fails the spawn with the error of its `open`.
    pub fn in_netns(name: &str) -> Exec {
        // A name with a NUL byte cannot be a file name: the empty path then fails the open
        // as a missing namespace does, instead of panicking here.
        let path = CString::new(format!("/run/netns/{name}")).unwrap_or_default();
        Exec { netns: Some(path) }
    }

    /// Whether commands run in the caller's own namespace (the host's, for the agent).
    pub fn is_own_namespace(&self) -> bool {
        self.netns.is_none()
    }

    /// A `Command` for `program`, set to enter the namespace when there is one. Arguments,
    /// stdin and the rest are left to the caller.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        if let Some(path) = self.netns.clone() {
            // SAFETY: the closure runs in the forked child before exec and calls only the
            // async-signal-safe `open`, `setns` and `close`; `path` was allocated before the
            // fork and is only read.
            unsafe {
                cmd.pre_exec(move || enter_netns(&path));
            }
        }
        cmd
    }
}

/// Moves the calling (child) process into the network namespace whose file is `path`.
fn enter_netns(path: &CStr) -> io::Result<()> {
    // SAFETY: plain system calls on a NUL-terminated path and the descriptor they return.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let rc = libc::setns(fd, libc::CLONE_NEWNET);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_program_runs_itself_with_or_without_a_namespace() {
        let mut cmd = Exec::default().command("ipset");
        cmd.arg("save");
        assert_eq!(argv(&cmd), ["ipset", "save"]);
        let mut cmd = Exec::in_netns("ns1").command("ipset");
        cmd.arg("save");
        assert_eq!(argv(&cmd), ["ipset", "save"]);
        assert!(Exec::default().is_own_namespace());
        assert!(!Exec::in_netns("ns1").is_own_namespace());
    }

    #[test]
    fn a_missing_namespace_fails_the_spawn() {
        let err = Exec::in_netns("npa-exec-test-no-such-namespace")
            .command("true")
            .status()
            .expect_err("a missing namespace must not run the program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }
}
