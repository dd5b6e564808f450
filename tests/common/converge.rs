//! Waiting for an agent in a network namespace to hold exactly what `compile` renders for
//! the same manifests (both families), through `netpol_agent::dataplane::owned`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netpol_agent::dataplane::owned::OwnedState;
use netpol_agent::model::IpFamily;

use super::{NetNs, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
pub const CONVERGE: Duration = Duration::from_secs(15);

pub type Tables = OwnedState;

pub fn family(ipv6: bool) -> IpFamily {
    if ipv6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

pub fn expected(dir: &Path, ipv6: bool) -> Tables {
    let out = TempDir::new("expect");
    let mut cmd = Command::new(BIN);
    cmd.args(["compile", "--node", "node-1", "--manifests"])
        .arg(dir);
    if ipv6 {
        cmd.arg("--ipv6");
    }
    cmd.arg("--ipsets-out")
        .arg(out.path.join("s"))
        .arg("--iptables-out")
        .arg(out.path.join("t"));
    let status = cmd.stderr(Stdio::null()).status().unwrap();
    assert!(status.success());
    let mut t = Tables::default();
    t.add_iptables(
        &std::fs::read_to_string(out.path.join("t")).unwrap(),
        &netpol_agent::agent::OWNERSHIP,
    );
    t.add_ipsets(
        &std::fs::read_to_string(out.path.join("s")).unwrap(),
        family(ipv6),
    );
    t
}

pub fn observed(ns: &NetNs, backend: &str, ipv6: bool) -> Tables {
    let tool = format!(
        "{}-{backend}-save",
        if ipv6 { "ip6tables" } else { "iptables" }
    );
    let mut t = Tables::default();
    t.add_iptables(
        &ns.exec_ok(&[&tool, "-t", "filter"]),
        &netpol_agent::agent::OWNERSHIP,
    );
    t.add_ipsets(&ns.exec_ok(&["ipset", "save"]), family(ipv6));
    t
}

/// Waits until the kernel holds exactly what compile renders for `dir` (both families).
pub fn wait_converged(ns: &NetNs, dir: &Path, backend: &str, log: &Path) -> Duration {
    let start = Instant::now();
    let want = [expected(dir, false), expected(dir, true)];
    // Stretched under emulation (`super::scaled`).
    let limit = super::scaled(CONVERGE);
    loop {
        let have = [observed(ns, backend, false), observed(ns, backend, true)];
        if have == want {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "not converged after {limit:?}\nwant v4: {:#?}\nhave v4: {:#?}\nagent log (last lines, newest first):\n{}",
                want[0],
                have[0],
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
