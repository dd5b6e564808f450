//! Environment diagnostics: which `FELIX_*` variables no option reads (and why: unknown, or
//! a felix parameter we do not implement), and the message for an invalid value that names
//! the environment variable, the flag and the accepted values.

use super::*;

/// Why a `FELIX_*` variable is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ignored {
    /// Neither ours nor felix's (a typo?).
    Unknown,
    /// A felix parameter netpol-agent does not implement.
    Unimplemented,
}

impl Ignored {
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::Unknown => "unknown",
            Ignored::Unimplemented => "unimplemented",
        }
    }
}

/// Every environment variable any subcommand of `cmd` reads.
pub fn known_env(cmd: &clap::Command) -> std::collections::BTreeSet<String> {
    let mut out: std::collections::BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for sub in cmd.get_subcommands() {
        out.extend(known_env(sub));
    }
    out
}

/// The `FELIX_*` names among `vars` that no option reads, each with why, in name order.
pub fn ignored_env(
    known: &std::collections::BTreeSet<String>,
    vars: impl IntoIterator<Item = String>,
) -> Vec<(String, Ignored)> {
    let mut out: Vec<(String, Ignored)> = vars
        .into_iter()
        .filter(|v| v.starts_with("FELIX_") && !known.contains(v))
        .map(|v| {
            let why = if felix_params::unimplemented_reason(&v).is_some() {
                Ignored::Unimplemented
            } else {
                Ignored::Unknown
            };
            (v, why)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// For a clap error about an invalid value, a message that names the environment variable
/// and the flag and says which values are accepted, and whether the value came from the
/// command line or the environment. `None` for other errors (help, missing arguments, ...),
/// which clap reports well itself.
pub fn explain_invalid_value(
    cmd: &clap::Command,
    err: &clap::Error,
    argv: &[String],
) -> Option<String> {
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let arg_text = match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => return None,
    };
    let long = arg_text
        .strip_prefix("--")?
        .split([' ', '='])
        .next()?
        .to_string();
    let env = find_env(cmd, &long);
    let value = match err.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let accepted = match err.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(v)) if !v.is_empty() => {
            format!("accepted values: {} (any case)", v.join(", "))
        }
        _ => match std::error::Error::source(err) {
            Some(src) => src.to_string(),
            None => err.to_string().trim().to_string(),
        },
    };
    let flag = format!("--{long}");
    let on_command_line = argv
        .iter()
        .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
    let source = match (&env, on_command_line) {
        (Some(env), false) => format!("environment variable {env} (flag {flag})"),
        (Some(env), true) => format!("flag {flag} (environment variable {env})"),
        (None, _) => format!("flag {flag}"),
    };
    Some(format!("invalid value {value:?} for {source}: {accepted}"))
}

/// The environment variable of the argument with this long name, in `cmd` or any
/// subcommand.
pub(super) fn find_env(cmd: &clap::Command, long: &str) -> Option<String> {
    for arg in cmd.get_arguments() {
        if arg.get_long() == Some(long) {
            return arg.get_env().map(|e| e.to_string_lossy().into_owned());
        }
    }
    cmd.get_subcommands().find_map(|sub| find_env(sub, long))
}
