//! What the scale benchmarks (`kube_scale`, `kube_real`) read about a process from `/proc`
//! and from the agent's log, written once: resident memory, CPU seconds, context switches,
//! and the time of a log line. Each reader returns zero (or `None`) for a process that is gone, so a figure
//! taken as an agent exits is a visible zero, not a panic half way through a report.

#![allow(dead_code)]

use std::process::Command;

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`); 0 if the process is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Context switches (voluntary and not) of every thread of a process so far: each is a
/// wake-up of a thread, the idle cost a CPU share measured in ticks cannot resolve. 0 if
/// the process is gone.
pub fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// CPU seconds of a process and of the children it waited for (utime, stime, cutime,
/// cstime): the agent's `iptables-restore` and `ipset` runs count as its own work.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // `pid (comm) state …`: the command may hold spaces and parentheses.
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // After the command: state is field 3, utime field 14 … cstime field 17.
    let ticks: u64 = fields
        .get(11..15)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / clock_ticks() as f64
}

/// Seconds since midnight of the first log line containing `what` (the tracing timestamp,
/// `2026-11-23T15:38:07.694635Z`).
pub fn line_time(log: &str, what: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains(what))?;
    let time = line
        .split_whitespace()
        .next()?
        .split('T')
        .nth(1)?
        .trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

pub fn clock_ticks() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100)
}
