//! Helpers for tests that program a real kernel: every test works inside network namespaces
//! it creates, and removes them when it ends, also when it fails (Drop runs on panic).

#![allow(dead_code)]

pub mod agent;
pub mod cluster;
pub mod converge;

// Not every test uses every helper.
#[allow(unused_imports)]
pub use agent::{poll, wait_for, wait_until, Agent};

use socket2::{Domain, Protocol, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Prefix of every namespace a test makes, so CI can sweep leftovers of a killed run.
pub const NETNS_PREFIX: &str = "npa-test-";

pub fn require_root() {
    let uid = run("id", &["-u"]);
    assert_eq!(
        String::from_utf8_lossy(&uid.stdout).trim(),
        "0",
        "this test programs iptables and ipsets in network namespaces and must run as root"
    );
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"))
}

pub fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `args` with `-w` after an iptables/ip6tables command (any backend, and `-restore`) that
/// lacks it. The xtables lock (`/run/xtables.lock`) is one per machine, not per namespace, so
/// a test's own rule edit races every parallel test's and the agents' restores; without `-w`
/// iptables-legacy fails at once when it is held ("Another app is currently holding the
/// xtables lock"), which under emulation happened in `conntrack_netns` on 6.12 + trixie.
/// `-save` takes no lock and no `-w`, and is left as it is.
pub fn with_xtables_wait<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = args.to_vec();
    let Some(cmd) = args.first() else { return out };
    let base = cmd.rsplit('/').next().unwrap_or(cmd);
    let xtables =
        (base.starts_with("iptables") || base.starts_with("ip6tables")) && !base.ends_with("-save");
    if xtables && !args.iter().any(|a| *a == "-w" || *a == "--wait") {
        out.insert(1, "-w");
    }
    out
}

pub fn have(binary: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace that is deleted (with everything in it) when dropped.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new(tag: &str) -> NetNs {
        require_root();
        let name = format!(
            "{NETNS_PREFIX}{}-{}-{tag}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run_ok("ip", &["netns", "add", &name]);
        let ns = NetNs { name };
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn exec(&self, args: &[&str]) -> Output {
        run("ip", &self.netns_argv(args))
    }

    pub fn exec_ok(&self, args: &[&str]) -> String {
        run_ok("ip", &self.netns_argv(args))
    }

    fn netns_argv<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend(with_xtables_wait(args));
        full
    }

    /// Runs a shell command line inside the namespace.
    pub fn sh_ok(&self, script: &str) -> String {
        self.exec_ok(&["sh", "-c", script])
    }

    pub fn restore_file(&self, tool: &str, file: &Path) -> String {
        self.sh_ok(&format!("{tool} < '{}'", file.display()))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// A temporary directory removed when dropped.
pub struct TempDir {
    pub path: std::path::PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "npa-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `netpol-agent` inside network namespace `ns` (`ip netns exec`), with no `FELIX_*` or
/// `NODENAME` from the test's own environment; the caller adds the subcommand and options.
pub fn agent_in(ns: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_netpol-agent")]);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `f` on a thread that entered network namespace `ns` first; sockets it opens stay
/// in that namespace after it returns. The test's own threads never leave the host's.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    in_netns_at(&format!("/run/netns/{ns}"), f)
}

/// [`in_netns`] for the namespace at `path`: a named one's `/run/netns/NAME`, or a process's
/// `/proc/PID/ns/net` (a pod's sandbox).
pub fn in_netns_at<T: Send>(path: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .expect("thread in the test namespace")
    })
}

/// One TCP connect from inside the network namespace at `ns_path` (see [`in_netns_at`]) to
/// `dst`, from source address `src` when given, within `timeout`: Ok, or what failed. A
/// thread of the test opens the socket, so a probe starts no process: a python3 per probe
/// took seconds under emulation, which made the bridge and containerd tests outlast their
/// VM timeouts.
pub fn connect_in(
    ns_path: &str,
    dst: SocketAddr,
    src: Option<IpAddr>,
    timeout: Duration,
) -> Result<(), String> {
    in_netns_at(ns_path, || {
        let socket = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| format!("socket: {e}"))?;
        if let Some(src) = src {
            socket
                .bind(&SocketAddr::new(src, 0).into())
                .map_err(|e| format!("bind {src}: {e}"))?;
        }
        socket
            .connect_timeout(&dst.into(), timeout)
            .map_err(|e| format!("connect {dst}: {e}"))
    })
}

/// Waits until something listens on `127.0.0.1:port` in the namespace at `ns_path` (panics,
/// naming `what`, after a scaled 10 s): a probe connects at once, while a listener started
/// as a process (python3) takes seconds to start under emulation.
pub fn await_listener(ns_path: &str, port: u16, what: &str) {
    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = std::time::Instant::now() + scaled(Duration::from_secs(10));
    while connect_in(ns_path, local, None, Duration::from_secs(1)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: nothing listens on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` on 127.0.0.1:port inside network namespace `ns`: (status, body).
pub fn http_get(ns: &str, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    in_netns(ns, || {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw)?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad response: {head}")))?;
        // HTTP/1.0, as the agent's own clients ask: tiny_http answers an HTTP/1.1 request for
        // a body over 32 KiB in chunks (a 5.10 VM's flow records were), which this reader
        // would take as garbage; to 1.0 it never does.
        assert!(
            !head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{head}"
        );
        Ok((status, body.to_string()))
    })
}

/// How much longer than on a real machine the tests' waits may take: `NETPOL_TEST_TIME_SCALE`
/// (a whole number, at least 1; 1 when unset or unreadable). `scripts/kernel-matrix.sh` sets it
/// in its VMs, where emulation runs 10-30x slower and an agent alone takes 15-20 s to start.
/// It stretches how long a wait may last, never what it waits for.
#[allow(dead_code)]
pub fn time_scale() -> u32 {
    std::env::var("NETPOL_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// `limit` stretched by [`time_scale`]: for every bounded wait of a real-kernel test. A bound
/// that is also a claim of the product (a deny line within a second, a cut within one) is
/// therefore checked as such on the host, where the scale is 1; in an emulated VM the test
/// checks that the kernel interface works at all.
#[allow(dead_code)]
pub fn scaled(limit: Duration) -> Duration {
    limit * time_scale()
}

/// Whether time here is a real machine's (no [`time_scale`] stretch): a claim about the
/// product's speed that cannot be stretched (a latency bucket, a cut within a second) is
/// asserted only then; `cargo test` on the host does on every CI run.
#[allow(dead_code)]
pub fn real_time() -> bool {
    time_scale() == 1
}
