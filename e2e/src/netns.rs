//! Named network namespaces (`ip netns`), entering them from a thread, and running commands
//! in them. A socket belongs to the namespace of the thread that created it, so servers and
//! probes are opened by threads that entered the pod's namespace; the process itself never
//! leaves the host's.

use std::fs::File;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use anyhow::{anyhow, bail, Context};
use nix::sched::{setns, CloneFlags};

/// Prefix of every namespace the suite makes; `scripts/setup.sh` sweeps `npa-*` leftovers of
/// a killed run.
pub const PREFIX: &str = "npa-e2e-";

/// A namespace made by the suite, deleted when dropped. The open handle keeps the namespace
/// alive only while the handle lives; sockets opened inside do too, so owners close them
/// first.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    pub handle: File,
}

impl Netns {
    pub fn create(name: &str) -> anyhow::Result<Netns> {
        run_ok("ip", &["netns", "add", name])?;
        let handle = File::open(format!("/run/netns/{name}"))
            .with_context(|| format!("opening /run/netns/{name}"))?;
        let ns = Netns {
            name: name.to_string(),
            handle,
        };
        ns.ip_batch("link set lo up\n")?;
        Ok(ns)
    }

    /// Runs `ip -n <ns> -batch -` with the given lines.
    pub fn ip_batch(&self, lines: &str) -> anyhow::Result<()> {
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running ip")?;
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(lines.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "ip -n {} -batch failed: {}\ninput:\n{lines}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// A command run inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    pub fn exec_ok(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> anyhow::Result<String> {
        let mut cmd = self.command(program);
        cmd.args(args);
        output_ok(cmd, stdin, &format!("{program} {args:?} in {}", self.name))
    }

    /// Writes a sysctl of this namespace (`key` like `net/ipv4/ip_forward`).
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        in_netns(&self.handle, || {
            std::fs::write(format!("/proc/sys/{key}"), value)
                .with_context(|| format!("sysctl {key}={value} in {}", self.name))
        })?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Moves the calling thread into the namespace behind `handle`.
pub fn enter(handle: &File) -> anyhow::Result<()> {
    setns(handle, CloneFlags::CLONE_NEWNET).map_err(|e| anyhow!("setns: {e}"))
}

/// Runs `f` on a short-lived thread that entered the namespace first.
pub fn in_netns<T: Send>(handle: &File, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(handle)?;
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow!("thread in namespace panicked"))?
    })
}

pub fn run_ok(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    output_ok(cmd, None, &format!("{program} {args:?}"))
}

fn output_ok(mut cmd: Command, stdin: Option<&str>, what: &str) -> anyhow::Result<String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(text.as_bytes())?;
    }
    let out: Output = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
