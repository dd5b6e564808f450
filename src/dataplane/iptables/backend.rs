//! The iptables tools the writer drives: which backend (legacy or nft) and binary to use,
//! felix's backend auto-detection, the `--wait` flags the installed restore accepts, and
//! running `<tool>-save` / `<tool>-restore` (restore input streamed on stdin).

use std::io::{BufWriter, Write as _};
use std::process::{Output, Stdio};

use anyhow::{anyhow, Context as _};

use crate::host::exec::Exec;
use crate::model::IpFamily;

/// Which kernel interface the iptables tools use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `ip_tables` (x_tables) through `iptables-legacy-*`.
    Legacy,
    /// nf_tables through `iptables-nft-*`.
    Nft,
}

/// The configured mode (felix's `IptablesBackend`), read by `detect_backend`.
pub use crate::config::BackendMode;

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }
}

/// What an operator of an nft node must know about older iptables on the same host
/// (docs/verified-on.md, defect 19). The image's iptables-nft (1.8.9) writes some matches
/// and targets as native nf_tables expressions, which iptables-nft 1.8.7 and older (Debian
/// 11, Ubuntu 20.04 and 22.04, RHEL 8) decode wrongly or not at all:
/// - `-m mark --mark V/M`: printed without the match, so such a release's `iptables-save`
///   shows our mark-guarded accepts and drops as unconditional, and restoring that save
///   would make them so (until the agent repairs its chains);
/// - `-j NFLOG` (deny and flow logs): no decoder, so the whole `filter` table is
///   "incompatible": `iptables -L` fails and `iptables-save` prints no filter table while
///   exiting 0.
///
/// Per-chain commands of such a release (`-N`, `-A`, `-S CHAIN`, `-restore --noflush`) work.
/// The agent cannot see which iptables the host or other pods run (the DaemonSet does not
/// mount the host's root), so it says this once rather than guess: as information on every
/// nft node, and as a warning when the NFLOG rules make the host's listing fail outright.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaderCaveat {
    /// A warning (the host's listing fails outright) rather than information.
    pub warn: bool,
    pub text: &'static str,
}

/// The caveat for this backend, when it writes anything an older iptables misreads.
pub fn older_reader_caveat(backend: Backend, nflog_rules: bool) -> Option<ReaderCaveat> {
    match (backend, nflog_rules) {
        (Backend::Legacy, _) => None,
        (Backend::Nft, false) => Some(ReaderCaveat {
            warn: false,
            text: "nft backend: iptables-nft 1.8.7 and older on this host (Debian 11, Ubuntu \
                   20.04 and 22.04, RHEL 8) print the agent's mark matches away; read its \
                   rules with `nft list table ip filter` or iptables 1.8.8 or newer, and never \
                   restore a save taken with such a release",
        }),
        (Backend::Nft, true) => Some(ReaderCaveat {
            warn: true,
            text: "deny logs or flow logs on the nft backend: iptables-nft 1.8.7 and older on \
                   this host (Debian 11, Ubuntu 20.04 and 22.04, RHEL 8) cannot decode the \
                   NFLOG rules (nf_tables `log` statements) and report the whole filter table \
                   as incompatible: `iptables -L` fails and `iptables-save` leaves the filter \
                   table out (they also print the agent's mark matches away). Where the host \
                   runs such an iptables, upgrade it or leave deny and flow logs off",
        }),
    }
}

/// `iptables-legacy-save`, `ip6tables-nft-restore`, ...
pub fn tool_name(family: IpFamily, backend: Backend, tool: &str) -> String {
    let base = match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    };
    format!("{base}-{}-{tool}", backend.as_str())
}

const HINT_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// felix's detection (`environment.DetectBackend`). An explicit mode wins. With `Auto`:
/// 1. `iptables-nft-save -t mangle` (IPv6, then IPv4) holding kubelet's `KUBE-IPTABLES-HINT`
///    or `KUBE-KUBELET-CANARY` chain → nft;
/// 2. the same with the legacy tools → legacy (probed only when the legacy mangle table
///    exists, so probing loads no table);
/// 3. no legacy table at all (`/proc/net/ip{,6}_tables_names` missing or empty) → nft;
/// 4. otherwise the backend whose full save has more rules (`-` lines); a tie goes to legacy.
///
/// Tools that cannot run count as holding nothing.
pub fn detect_backend(exec: &Exec, mode: BackendMode) -> Backend {
    match mode {
        BackendMode::Legacy => return Backend::Legacy,
        BackendMode::Nft => return Backend::Nft,
        BackendMode::Auto => {}
    }
    let families = [IpFamily::V6, IpFamily::V4];
    let has_hint = |backend: Backend| {
        families.iter().any(|&f| {
            if backend == Backend::Legacy
                && !legacy_table_names(exec, f).iter().any(|t| t == "mangle")
            {
                return false;
            }
            run_save(exec, &tool_name(f, backend, "save"), Some("mangle")).is_ok_and(|out| {
                HINT_CHAINS
                    .iter()
                    .any(|h| out.windows(h.len()).any(|w| w == h.as_bytes()))
            })
        })
    };
    if has_hint(Backend::Nft) {
        tracing::info!("kubelet's hint chain is in nf_tables: using the nft backend");
        return Backend::Nft;
    }
    if has_hint(Backend::Legacy) {
        tracing::info!("kubelet's hint chain is in legacy iptables: using the legacy backend");
        return Backend::Legacy;
    }
    let legacy_tables: Vec<IpFamily> = families
        .iter()
        .copied()
        .filter(|&f| !legacy_table_names(exec, f).is_empty())
        .collect();
    if legacy_tables.is_empty() {
        tracing::info!("no legacy iptables tables: using the nft backend");
        return Backend::Nft;
    }
    let count = |backend: Backend, fams: &[IpFamily]| -> usize {
        fams.iter()
            .map(|&f| {
                run_save(exec, &tool_name(f, backend, "save"), None)
                    .map(|out| {
                        out.split(|&b| b == b'\n')
                            .filter(|l| l.starts_with(b"-"))
                            .count()
                    })
                    .unwrap_or(0)
            })
            .sum()
    };
    let legacy = count(Backend::Legacy, &legacy_tables);
    let nft = count(Backend::Nft, &families);
    let backend = if legacy >= nft {
        Backend::Legacy
    } else {
        Backend::Nft
    };
    tracing::info!(
        legacy_rules = legacy,
        nft_rules = nft,
        "backend chosen by rule count: {}",
        backend.as_str()
    );
    backend
}

/// The legacy tables that exist (`/proc/net/ip{,6}_tables_names`, read in the target
/// network namespace); empty when the file is missing.
fn legacy_table_names(exec: &Exec, family: IpFamily) -> Vec<String> {
    let file = match family {
        IpFamily::V4 => "/proc/net/ip_tables_names",
        IpFamily::V6 => "/proc/net/ip6_tables_names",
    };
    match exec.command("cat").arg(file).stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// `<tool> [-t table]`, returning standard output as bytes: other programs' rules may hold
/// any bytes (see `parse::parse_save`).
pub(crate) fn run_save(exec: &Exec, tool: &str, table: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let mut cmd = exec.command(tool);
    if let Some(t) = table {
        cmd.args(["-t", t]);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {tool}"))?;
    if !out.status.success() {
        return Err(anyhow!(
            "{tool} failed ({}): {}",
            out.status,
            stderr_of(&out)
        ));
    }
    Ok(out.stdout)
}

/// `<tool> --noflush <flags>`, the lines streamed on stdin between `*<table>` and `COMMIT`.
/// `spawned` learns the process id (the nf_tables change events name the committing process,
/// so the caller can tell its own commits from others').
pub(crate) fn run_restore(
    exec: &Exec,
    tool: &str,
    flags: &[String],
    table: &str,
    lines: impl Iterator<Item = String> + Send,
    spawned: &mut dyn FnMut(u32),
) -> anyhow::Result<()> {
    let mut child = exec
        .command(tool)
        .arg("--noflush")
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {tool}"))?;
    spawned(child.id());
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow!("{tool}: no stdin pipe"))?;
    // Written from a second thread so a restore that fills its output pipes cannot deadlock
    // against us.
    let (written, out) = std::thread::scope(|s| {
        let writer = s.spawn(move || -> std::io::Result<()> {
            let mut w = BufWriter::new(stdin);
            writeln!(w, "*{table}")?;
            for line in lines {
                w.write_all(line.as_bytes())?;
                w.write_all(b"\n")?;
            }
            w.write_all(b"COMMIT\n")?;
            w.flush()
        });
        let out = child.wait_with_output();
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("restore writer thread panicked")));
        (written, out)
    });
    let out = out.with_context(|| format!("waiting for {tool}"))?;
    if !out.status.success() {
        return Err(anyhow!(
            "{tool} failed ({}): {}",
            out.status,
            stderr_of(&out)
        ));
    }
    written.with_context(|| format!("writing to {tool}"))?;
    Ok(())
}

/// The lock flags the installed restore accepts without complaint, best first:
/// `--wait 10 --wait-interval 50000` (felix's, for restores that still poll), `--wait 10`,
/// `--wait`, nothing. iptables 1.8.9 (legacy and nft) accepts `--wait-interval` but warns
/// that it is ignored (it blocks on the lock instead of polling), so there it is
/// `--wait 10`. Probed with `--test`, which parses and commits nothing.
pub(crate) fn probe_restore_flags(exec: &Exec, tool: &str) -> Vec<String> {
    let candidates: [&[&str]; 3] = [
        &["--wait", "10", "--wait-interval", "50000"],
        &["--wait", "10"],
        &["--wait"],
    ];
    for flags in candidates {
        let out = exec
            .command(tool)
            .args(["--noflush", "--test"])
            .args(flags)
            .stdin(Stdio::null())
            .output();
        if let Ok(out) = out {
            if out.status.success() && out.stderr.iter().all(u8::is_ascii_whitespace) {
                return flags.iter().map(|s| s.to_string()).collect();
            }
        }
    }
    tracing::warn!("{tool} accepts no --wait flag: restores will not wait for the xtables lock");
    Vec::new()
}

fn stderr_of(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr);
    let text = text.trim();
    // Keep error messages readable when a restore complains at length.
    match text.char_indices().nth(2000) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_readers_are_warned_of_only_on_nft_and_loudly_only_for_nflog() {
        let logs = older_reader_caveat(Backend::Nft, true).expect("nft with NFLOG rules");
        assert!(logs.warn);
        assert!(logs.text.contains("1.8.7") && logs.text.contains("iptables-save"));
        let plain = older_reader_caveat(Backend::Nft, false).expect("nft, no NFLOG rules");
        assert!(
            !plain.warn,
            "mark matches alone: information, not a warning"
        );
        assert!(plain.text.contains("1.8.7") && plain.text.contains("mark"));
        // Legacy writes x_tables entries every release reads the same.
        assert_eq!(older_reader_caveat(Backend::Legacy, true), None);
        assert_eq!(older_reader_caveat(Backend::Legacy, false), None);
    }
}
