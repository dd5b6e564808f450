//! Running `ipset`: one streamed `ipset -exist restore` per call, `ipset save` read while it
//! prints, and making sense of what a failing restore says (which line, which set).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufReader, Write};
use std::process::Stdio;

use anyhow::{anyhow, Context};

use super::parse::parse_save;
use super::plan::KernelSet;
use crate::host::exec::Exec;
use crate::rules::token::{ipset_line_problem, script_problem};

/// What `ipset` says when a set it should destroy is referenced by an iptables rule (or by a
/// `list:set`). Such a destroy is retried later instead of failing the phase.
pub(super) const IN_USE: &str = "in use by a kernel component";

/// A failed `ipset restore`: the set whose line failed (when ipset names a line) and why.
#[derive(Debug)]
pub(super) struct RestoreFailure {
    pub(super) set: Option<String>,
    pub(super) message: String,
}

impl fmt::Display for RestoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.set {
            Some(set) => write!(f, "ipset restore failed on set {set}: {}", self.message),
            None => write!(f, "ipset restore failed: {}", self.message),
        }
    }
}

/// What one `ipset restore` process reported.
pub(super) struct ProcessFailure {
    /// 1-based line of the script ipset stopped at, when it says.
    pub(super) line: Option<u64>,
    pub(super) message: String,
}

/// Reads every set that exists (`ipset save`) and keeps ours, parsing while ipset writes: a
/// node with large sets (kube-proxy's, ours) prints millions of lines.
pub(super) fn save(exec: &Exec) -> anyhow::Result<BTreeMap<String, KernelSet>> {
    let mut child = exec
        .command("ipset")
        .arg("save")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start ipset save")?;
    let parsed = match child.stdout.take() {
        Some(stdout) => parse_save(BufReader::new(stdout)),
        None => Err(io::Error::other("no stdout")),
    };
    let out = child
        .wait_with_output()
        .context("cannot wait for ipset save")?;
    if !out.status.success() {
        return Err(anyhow!(
            "ipset save failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parsed.context("cannot read ipset save output")
}

/// Runs one `ipset -exist restore` with `script` on stdin.
pub(super) fn restore(exec: &Exec, script: &str) -> Result<(), ProcessFailure> {
    let spawn_failure = |what: &str, e: io::Error| ProcessFailure {
        line: None,
        message: format!("{what}: {e}"),
    };
    // The last gate before the kernel (see `rules::token`): an unsafe line is never written.
    if let Some(problem) = script_problem(script, ipset_line_problem) {
        return Err(ProcessFailure {
            line: None,
            message: format!("refusing to write an unsafe restore script: {problem}"),
        });
    }
    let mut child = exec
        .command("ipset")
        .args(["-exist", "restore"])
        .env("LC_ALL", "C")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_failure("cannot start ipset restore", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        // ipset stops reading at the first failing line and exits: a broken pipe here
        // only means its exit status and message tell the story.
        match stdin.write_all(script.as_bytes()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(spawn_failure("cannot write to ipset restore", e));
            }
        }
        // Dropping stdin closes it: end of input.
    }
    let out = child
        .wait_with_output()
        .map_err(|e| spawn_failure("cannot wait for ipset restore", e))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (line, message) = parse_restore_error(&stderr);
    Err(ProcessFailure {
        line,
        message: if message.is_empty() {
            format!("exit status {}", out.status)
        } else {
            message
        },
    })
}

/// `(op index, line index within the op)` of 1-based script line `line`.
pub(super) fn locate(ends: &[u64], line: u64) -> Option<(usize, u64)> {
    if line == 0 {
        return None;
    }
    let idx = ends.partition_point(|&end| end < line);
    let before = if idx == 0 { 0 } else { *ends.get(idx - 1)? };
    ends.get(idx)?;
    Some((idx, line - 1 - before))
}

/// `ipset v7.17: Error in line 5: Set cannot be destroyed: ...` → `(Some(5), "Set cannot ...")`.
pub(super) fn parse_restore_error(stderr: &str) -> (Option<u64>, String) {
    for l in stderr.lines() {
        if let Some(pos) = l.find("Error in line ") {
            let rest = l.get(pos + "Error in line ".len()..).unwrap_or_default();
            if let Some((num, msg)) = rest.split_once(':') {
                if let Ok(n) = num.trim().parse::<u64>() {
                    return (Some(n), msg.trim().to_string());
                }
            }
        }
    }
    (None, stderr.trim().to_string())
}
