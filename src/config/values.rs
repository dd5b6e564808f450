//! The value parsers of every option, each with the error message that names the accepted
//! forms (felix's forms: see the room's doc), and the small value types they produce.

use super::*;

/// The accepted boolean spellings, for messages and the README.
pub const BOOL_FORMS: &str = "true or false (also 1/0, yes/no, y/n, t/f; any case)";

/// felix's boolean: `true|1|yes|y|t` and `false|0|no|n|f`, case-insensitive.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "n" | "f" => Ok(false),
        _ => Err(format!("not a boolean; accepted values: {BOOL_FORMS}")),
    }
}

pub(super) fn parse_secs(text: &str, min: f64, what: &str) -> Result<Duration, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("not a number of seconds; accepted values: {what}"))?;
    if !value.is_finite() || value < min || value > 1e9 {
        return Err(format!("out of range; accepted values: {what}"));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Seconds ≥ 0, where 0 disables the timer (felix's refresh intervals).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_secs(
        text,
        0.0,
        "a number of seconds ≥ 0, e.g. 10 or 2.5; 0 disables the timer",
    )
}

/// felix's post-write check: at least 50 ms.
pub fn parse_post_write_check(text: &str) -> Result<Duration, String> {
    parse_secs(text, 0.05, "a number of seconds ≥ 0.05, e.g. 1 or 0.2")
}

/// A positive number of seconds.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    parse_secs(text, 0.001, "a number of seconds > 0, e.g. 90")
}

pub fn parse_port(text: &str) -> Result<u16, String> {
    text.trim()
        .parse::<u16>()
        .map_err(|_| "not a port; accepted values: a whole number from 0 to 65535".to_string())
}

pub(super) fn parse_u32_from(text: &str, base: u32) -> Result<u32, std::num::ParseIntError> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => u32::from_str_radix(t, base),
    }
}

/// maxelem of a set: 1 ..= 2^32-1.
pub fn parse_max_ipset_size(text: &str) -> Result<u32, String> {
    match parse_u32_from(text, 10) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("accepted values: a whole number from 1 to 4294967295".into()),
    }
}

/// kube-proxy's masquerade mark (`--iptables-masquerade-bit`, 14 by default) and the drop
/// mark kubelet and kube-proxy used (bit 15): a mask of ours may not include them, or our
/// accept bit could masquerade or drop other traffic and theirs could pass as our verdict.
pub const KUBE_MARK_BITS: u32 = 0x4000 | 0x8000;

/// A 32-bit mask with at least the 4 mark bits we need, clear of kube-proxy's bits.
pub fn parse_mark_mask(text: &str) -> Result<u32, String> {
    let value = parse_u32_from(text, 10).map_err(|_| {
        "not a 32-bit number; accepted values: a 32-bit mask with at least 4 bits set, decimal or 0x-hex, e.g. 0xffff0000".to_string()
    })?;
    if value & KUBE_MARK_BITS != 0 {
        return Err(format!(
            "{value:#x} overlaps kube-proxy's marks (masquerade 0x4000, drop 0x8000: {:#x}); accepted values: a 32-bit mask with at least 4 bits set and neither of those, e.g. 0xffff0000",
            value & KUBE_MARK_BITS
        ));
    }
    MarkBits::from_mask(value).map_err(|e| {
        format!("{e}; accepted values: a 32-bit mask with at least 4 bits set, e.g. 0xffff0000")
    })?;
    Ok(value)
}

/// kube-proxy IPVS support (`FELIX_KUBEIPVSSUPPORTENABLED`): `auto` follows the interface
/// `kube-ipvs0` (felix's detection; felix has no switch), or forced on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpvsSupport {
    Auto,
    On,
    Off,
}

impl IpvsSupport {
    pub fn as_str(self) -> &'static str {
        match self {
            IpvsSupport::Auto => "auto",
            IpvsSupport::On => "true",
            IpvsSupport::Off => "false",
        }
    }
}

pub fn parse_ipvs_support(text: &str) -> Result<IpvsSupport, String> {
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(IpvsSupport::Auto);
    }
    match parse_bool(text) {
        Ok(true) => Ok(IpvsSupport::On),
        Ok(false) => Ok(IpvsSupport::Off),
        Err(_) => Err(format!(
            "accepted values: auto, or a boolean ({BOOL_FORMS})"
        )),
    }
}

/// Inclusive port ranges (felix's `portrange-list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRanges(pub Vec<(u16, u16)>);

impl std::fmt::Display for PortRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}:{hi}")
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// felix's `portrange-list`: `N` or `N:M`, comma-separated (`30000:32767`).
pub fn parse_port_ranges(text: &str) -> Result<PortRanges, String> {
    let accepted = "accepted values: port ranges N or N:M (1-65535, N <= M), comma-separated, e.g. 30000:32767";
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = part.split_once(':').unwrap_or((part, part));
        let port = |t: &str| t.trim().parse::<u16>().ok().filter(|p| *p > 0);
        match (port(lo), port(hi)) {
            (Some(lo), Some(hi)) if lo <= hi => out.push((lo, hi)),
            _ => return Err(format!("{part:?} is not a port range; {accepted}")),
        }
    }
    Ok(PortRanges(out))
}

/// An interface name, or empty (bridge mode off).
pub fn parse_bridge_interface(text: &str) -> Result<String, String> {
    let name = text.trim();
    if !name.is_empty() {
        crate::rules::iface::check_interface_name(name).map_err(|e| {
            format!("{e}; accepted values: the name of a Linux bridge, e.g. cni0, or empty for routed mode")
        })?;
    }
    Ok(name.to_string())
}

/// A comma-separated list of interface prefixes, each a valid start of an interface name.
pub fn parse_interface_prefix(text: &str) -> Result<String, String> {
    parse_prefix_list(text).map_err(|e| {
        format!("{e}; accepted values: a comma-separated list of interface-name prefixes, e.g. cali or cali,veth")
    })?;
    Ok(text.to_string())
}

/// A taint key: a qualified name as the API server checks it (`[prefix/]name`), or empty.
pub fn parse_taint_key(text: &str) -> Result<String, String> {
    let t = text.trim();
    match crate::model::validate::qualified_name_problem(t) {
        Some(problem) if !t.is_empty() => Err(format!(
            "{problem}; accepted values: a taint key such as netpol-agent.io/agent-not-ready, or empty (off)"
        )),
        _ => Ok(t.to_string()),
    }
}

/// A bind address: an IP address or a host name (checked for form only; it is resolved
/// when the server binds). Empty is allowed (the metrics host: every address).
pub fn parse_host(text: &str) -> Result<String, String> {
    let t = text.trim();
    let is_ip = t.parse::<std::net::IpAddr>().is_ok();
    let is_name = t.len() <= 253
        && t.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if t.is_empty() || is_ip || is_name {
        Ok(t.to_string())
    } else {
        Err("accepted values: an IP address or host name, e.g. localhost or 0.0.0.0".into())
    }
}

/// A deny-log rate: `N` packets per second, or `N/unit` with the units iptables' `limit`
/// match takes (`sec`, `second`, `s`, `min`, `minute`, `m`, `hour`, `h`, `day`, `d`; any
/// case), at most 10000 per second.
pub fn parse_deny_log_rate(text: &str) -> Result<Rate, String> {
    const FORMS: &str = "accepted values: packets per second (10), or N/sec, N/min, N/hour, N/day (3/min), at most 10000/sec";
    let t = text.trim();
    let (count, unit) = match t.split_once('/') {
        Some((n, u)) => (n.trim(), u.trim().to_ascii_lowercase()),
        None => (t, "sec".to_string()),
    };
    let unit = match unit.as_str() {
        "s" | "sec" | "second" => RateUnit::Second,
        "m" | "min" | "minute" => RateUnit::Minute,
        "h" | "hour" => RateUnit::Hour,
        "d" | "day" => RateUnit::Day,
        _ => return Err(format!("unknown unit {unit:?}; {FORMS}")),
    };
    let count: u32 = count
        .parse()
        .map_err(|_| format!("not a whole number of packets; {FORMS}"))?;
    let rate = Rate { count, unit };
    rate.canonical().map_err(|e| format!("{e}; {FORMS}"))?;
    Ok(rate)
}

/// A `-m limit` burst: 1 ..= 10000 packets.
pub fn parse_deny_log_burst(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err("accepted values: a whole number of packets from 1 to 10000".into()),
    }
}

/// A flow-log rate: `N` new connections per second per pod and direction (or `N/sec`),
/// 1 ..= 10000. Only per second: `iptables-save` prints hashlimit's other units with extra
/// options (see `rules::flow_log`).
pub fn parse_flow_log_rate(text: &str) -> Result<u32, String> {
    const FORMS: &str =
        "accepted values: new connections per second per pod, 1 to 10000 (100, or 100/sec)";
    let t = text.trim();
    let count = match t.split_once('/') {
        Some((n, u))
            if matches!(
                u.trim().to_ascii_lowercase().as_str(),
                "s" | "sec" | "second"
            ) =>
        {
            n.trim()
        }
        Some(_) => return Err(format!("only a rate per second is accepted; {FORMS}")),
        None => t,
    };
    match count.parse::<u32>() {
        Ok(n) if (1..=crate::rules::flow_log::MAX_RATE).contains(&n) => Ok(n),
        _ => Err(FORMS.into()),
    }
}

/// How many flow-log files are kept: 1 ..= 1000.
pub fn parse_flow_log_files(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err("accepted values: a whole number of files from 1 to 1000".into()),
    }
}

/// The size of one flow-log file in MB: 1 ..= 10000.
pub fn parse_flow_log_file_mb(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err("accepted values: a whole number of MB from 1 to 10000".into()),
    }
}

/// An NFLOG group: 0 ..= 65535.
pub fn parse_nflog_group(text: &str) -> Result<u16, String> {
    text.trim()
        .parse::<u16>()
        .map_err(|_| "accepted values: an NFLOG group number from 0 to 65535".into())
}

/// felix's WorkloadSourceSpoofing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SourceSpoofing {
    /// No pod may send from an address not its own (the source check is rendered).
    #[value(name = "Disabled")]
    Disabled,
    /// No source check (felix's Any lets each pod opt in by an annotation; we have no
    /// per-pod opt-in, so Any turns the check off for every pod).
    #[value(name = "Any")]
    Any,
}

/// Where objects come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Datastore {
    /// The Kubernetes API (watchers of pods, namespaces and NetworkPolicies).
    Kubernetes,
    /// A watched directory of manifests.
    Dir(PathBuf),
}

pub const DATASTORE_FORMS: &str = "kubernetes, or dir:PATH (a directory of manifests)";

pub fn parse_datastore(text: &str) -> Result<Datastore, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("kubernetes") {
        return Ok(Datastore::Kubernetes);
    }
    if let Some(path) = t.strip_prefix("dir:") {
        if path.is_empty() {
            return Err(format!(
                "dir: needs a path; accepted values: {DATASTORE_FORMS}"
            ));
        }
        return Ok(Datastore::Dir(PathBuf::from(path)));
    }
    if t.eq_ignore_ascii_case("etcdv3") {
        return Err(format!(
            "etcdv3 is felix's Calico datastore, not applicable to Kubernetes NetworkPolicy; accepted values: {DATASTORE_FORMS}"
        ));
    }
    Err(format!("accepted values: {DATASTORE_FORMS}"))
}

/// containerd's CRI socket, the default `FELIX_CRIENDPOINT`.
pub const DEFAULT_CRI_ENDPOINT: &str = "/run/containerd/containerd.sock";

/// `FELIX_CRIENDPOINT`: an absolute socket path, or the same as `unix://PATH` (crictl's and
/// the kubelet's `--container-runtime-endpoint` form).
pub fn parse_cri_endpoint(text: &str) -> Result<PathBuf, String> {
    const FORMS: &str = "accepted values: the absolute path of the runtime's CRI unix socket, \
                         optionally as unix://PATH, e.g. /run/containerd/containerd.sock \
                         (containerd) or /var/run/crio/crio.sock (CRI-O)";
    let t = text.trim();
    let path = t.strip_prefix("unix://").unwrap_or(t);
    if path.contains("://") || t.starts_with("tcp:") || t.starts_with("npipe:") {
        return Err(format!("only unix sockets are supported; {FORMS}"));
    }
    if !path.starts_with('/') {
        return Err(format!("not an absolute path; {FORMS}"));
    }
    Ok(PathBuf::from(path))
}
