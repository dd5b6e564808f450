//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), read from `/proc/self` at each scrape.
//!
//! Why not the prometheus crate's own collector: its `process` feature pulls in `procfs` (and
//! its dependency tree) for six numbers; reading two small files ourselves is less code to
//! trust. The names, types and units are the ones every Prometheus client exports, so the
//! usual dashboards and alerts work unchanged.

use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, IntGauge, Opts};

/// The names this collector exports.
pub const NAMES: &[&str] = &[
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// What `/proc/self/stat` says, in the kernel's units.
#[derive(Debug, PartialEq, Eq)]
pub struct Stat {
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    /// Start time after boot, in clock ticks.
    pub start_ticks: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: num(14)? + num(15)?,
        start_ticks: num(22)?,
        vsize_bytes: num(23)?,
        rss_pages: num(24)?,
    })
}

/// The boot time (`btime`, seconds since the epoch) from `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit on open files from `/proc/self/limits` (`unlimited` as `u64::MAX`).
pub fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

pub struct ProcessCollector {
    cpu: Counter,
    /// The CPU seconds already added to `cpu` (a counter only goes up by increments).
    cpu_seen: Mutex<f64>,
    rss: IntGauge,
    vsize: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    start_time: Gauge,
    descs: Vec<Desc>,
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        let cpu = Counter::with_opts(Opts::new(
            NAMES[0],
            "user and system CPU time of the agent process, seconds (the restore tools it runs are processes of their own)",
        ))
        .expect("valid metric");
        let rss = IntGauge::new(NAMES[1], "resident memory of the agent process, bytes")
            .expect("valid metric");
        let vsize = IntGauge::new(NAMES[2], "virtual memory size, bytes").expect("valid metric");
        let open_fds = IntGauge::new(NAMES[3], "open file descriptors").expect("valid metric");
        let max_fds = IntGauge::new(NAMES[4], "the soft limit on open file descriptors")
            .expect("valid metric");
        let start_time =
            Gauge::new(NAMES[5], "start time, seconds since the epoch").expect("valid metric");
        let descs = [
            cpu.desc(),
            rss.desc(),
            vsize.desc(),
            open_fds.desc(),
            max_fds.desc(),
            start_time.desc(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        ProcessCollector {
            cpu,
            cpu_seen: Mutex::new(0.0),
            rss,
            vsize,
            open_fds,
            max_fds,
            start_time,
            descs,
        }
    }

    /// Reads `/proc/self` into the metrics; a file that cannot be read leaves its metrics as
    /// they were (a scrape must not fail for them).
    fn refresh(&self) {
        // SAFETY: sysconf only reads configuration values.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t))
        {
            let cpu = stat.cpu_ticks as f64 / ticks;
            let mut seen = self.cpu_seen.lock().unwrap_or_else(|e| e.into_inner());
            if cpu > *seen {
                self.cpu.inc_by(cpu - *seen);
                *seen = cpu;
            }
            self.rss
                .set(i64::try_from(stat.rss_pages * page).unwrap_or(i64::MAX));
            self.vsize
                .set(i64::try_from(stat.vsize_bytes).unwrap_or(i64::MAX));
            if let Some(boot) = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|t| parse_boot_time(&t))
            {
                self.start_time
                    .set(boot as f64 + stat.start_ticks as f64 / ticks);
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle being read is one of them.
            let n = dir.count().saturating_sub(1);
            self.open_fds.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|t| parse_max_fds(&t))
        {
            self.max_fds.set(i64::try_from(max).unwrap_or(i64::MAX));
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.refresh();
        let mut out = Vec::with_capacity(NAMES.len());
        out.extend(self.cpu.collect());
        out.extend(self.rss.collect());
        out.extend(self.vsize.collect());
        out.extend(self.open_fds.collect());
        out.extend(self.max_fds.collect());
        out.extend(self.start_time.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "4242 (netpol (x) agent) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 300,
                start_ticks: 123456,
                vsize_bytes: 987654321,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn boot_time_and_fd_limit() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764200000\nprocesses 9\n"),
            Some(1764200000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_fds(limits), Some(1048576));
    }

    #[test]
    fn this_process_reads() {
        let c = ProcessCollector::new();
        let families = c.collect();
        assert_eq!(families.len(), NAMES.len());
        assert!(c.rss.get() > 0 && c.open_fds.get() > 0 && c.start_time.get() > 1.0e9);
    }
}
