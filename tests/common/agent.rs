//! The agent binary (or any server a test starts) as a child process: stdin and stdout
//! closed, stderr to a log file the failure messages quote, killed and reaped when the test
//! ends, also when it fails (Drop runs on panic). And the one polling helper the tests wait
//! with: a condition read until it holds or a limit passes, the failure naming what was
//! awaited (and the agent's log, when waiting on an agent).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often a condition is read again.
pub const POLL: Duration = Duration::from_millis(50);

/// A started child; killed and reaped on drop.
pub struct Agent {
    pub child: Child,
    /// Where its stderr goes (`None`: the caller wired it elsewhere).
    pub log: Option<PathBuf>,
}

impl Agent {
    /// Starts `cmd` with stdin and stdout closed and stderr to `log` (created afresh).
    pub fn spawn(mut cmd: Command, log: &Path) -> Agent {
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Agent {
            child,
            log: Some(log.to_path_buf()),
        }
    }

    /// A child the caller started with its own wiring; `log` if its stderr went to one.
    pub fn adopt(child: Child, log: Option<&Path>) -> Agent {
        Agent {
            child,
            log: log.map(Path::to_path_buf),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far (empty without one).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (the process may be gone already: ignored).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap_or(i32::MAX));
        let _ = nix::sys::signal::kill(pid, signal);
    }

    /// Waits for the process to exit, failing with its log after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < within,
                "the process did not exit within {within:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM, then its exit (within 10 s).
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(Duration::from_secs(10))
    }

    /// [`wait_until`], failing with this process's log.
    pub fn wait_until<T>(&self, limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
        poll(limit, f)
            .unwrap_or_else(|| panic!("{what}: not after {limit:?}; log:\n{}", self.log()))
    }

    /// [`wait_for`], failing with this process's log; how long it took.
    pub fn wait_for(&self, limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        self.wait_until(limit, what, || f().then_some(()));
        start.elapsed()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `f` until it answers or `limit` passes (`None`: it never did).
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Reads `f` until it answers; fails naming `what` after `limit`.
pub fn wait_until<T>(limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll(limit, f).unwrap_or_else(|| panic!("{what}: not after {limit:?}"))
}

/// [`wait_until`] for a condition without an answer; how long it took.
pub fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    wait_until(limit, what, || f().then_some(()));
    start.elapsed()
}
