//! The option table of docs/reference/configuration.md, from the code: every option with an
//! environment variable as clap's long help gives it (flags, aliases, default, help text, the
//! commands that take it) and felix's standing from `config::felix_params::PARAMS`, then the
//! felix parameters we do not implement (grouped where the reason is the same).

use std::collections::BTreeMap;

use netpol_agent::config::felix_params::{Felix, PARAMS};

/// One option of one command, as `--help` prints it.
#[derive(Debug, Default)]
struct HelpOption {
    flag: String,
    aliases: Vec<String>,
    env: Option<String>,
    default: Option<String>,
    text: String,
}

/// The options of one `--help` text, in their order.
fn parse_help(help: &str) -> Vec<HelpOption> {
    let mut out: Vec<HelpOption> = Vec::new();
    let mut in_options = false;
    let mut values: Vec<String> = Vec::new();
    let mut paragraph_done = false;
    for line in help.lines() {
        if line == "Options:" {
            in_options = true;
            continue;
        }
        if !in_options {
            continue;
        }
        let trimmed = line.trim();
        let indent = line.len() - line.trim_start().len();
        if (2..=6).contains(&indent) && trimmed.starts_with('-') {
            flush_values(&mut out, &mut values);
            let flag = trimmed
                .split([',', ' '])
                .map(str::trim)
                .find(|w| w.starts_with("--"))
                .unwrap_or(trimmed)
                .to_string();
            out.push(HelpOption {
                flag,
                ..Default::default()
            });
            paragraph_done = false;
            continue;
        }
        let Some(opt) = out.last_mut() else { continue };
        if trimmed.is_empty() {
            if !opt.text.is_empty() {
                paragraph_done = true;
            }
        } else if let Some(env) = trimmed.strip_prefix("[env: ") {
            opt.env = Some(env.split('=').next().unwrap_or("").to_string());
        } else if let Some(d) = trimmed.strip_prefix("[default: ") {
            opt.default = Some(d.trim_end_matches(']').to_string());
        } else if let Some(a) = trimmed
            .strip_prefix("[aliases: ")
            .or_else(|| trimmed.strip_prefix("[alias: "))
        {
            opt.aliases = a
                .trim_end_matches(']')
                .split(", ")
                .map(str::to_string)
                .collect();
        } else if let Some(v) = trimmed.strip_prefix("- ") {
            let (name, what) = v.split_once(": ").unwrap_or((v, ""));
            values.push(if what.is_empty() {
                format!("`{name}`")
            } else {
                format!("`{name}` ({})", lower_first(what.trim_end_matches('.')))
            });
        } else if trimmed == "Possible values:" {
        } else if let Some((before, vals)) = format!(" {trimmed}")
            .split_once(" [possible values: ")
            .map(|(b, v)| (b.trim().to_string(), v.to_string()))
        {
            // clap's short form, for values without their own help.
            if !opt.text.is_empty() && !before.is_empty() {
                opt.text.push(' ');
            }
            opt.text.push_str(&before);
            values.extend(
                vals.trim_end_matches(']')
                    .split(", ")
                    .map(|v| format!("`{v}`")),
            );
        } else if !paragraph_done {
            if !opt.text.is_empty() {
                opt.text.push(' ');
            }
            opt.text.push_str(trimmed);
        } else {
            // A further paragraph of the help.
            opt.text.push(' ');
            opt.text.push_str(trimmed);
        }
    }
    flush_values(&mut out, &mut values);
    out
}

fn flush_values(out: &mut [HelpOption], values: &mut Vec<String>) {
    if let Some(opt) = out.last_mut() {
        if !values.is_empty() {
            opt.text = format!("{}; values: {}", opt.text, values.join(", "));
        }
    }
    values.clear();
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// What one variable is across the commands.
struct Row {
    /// flag (with aliases) -> the commands taking it that way.
    flags: BTreeMap<String, Vec<String>>,
    default: Option<String>,
    text: String,
}

/// The generated table; `help(None)` is the top level, `help(Some(sub))` one command's.
pub fn generate(subcommands: &[String], help: impl Fn(Option<&str>) -> String) -> String {
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for sub in subcommands {
        for opt in parse_help(&help(Some(sub))) {
            let Some(env) = opt.env.clone() else { continue };
            let mut flag = format!("`{}`", opt.flag);
            for a in &opt.aliases {
                flag.push_str(&format!(", `{a}`"));
            }
            let row = rows.entry(env).or_insert_with(|| Row {
                flags: BTreeMap::new(),
                default: opt.default.clone(),
                text: opt.text.clone(),
            });
            row.flags.entry(flag).or_default().push(sub.clone());
        }
    }
    let mut out =
        String::from("| environment | flag | default | meaning | felix |\n|---|---|---|---|---|\n");
    let mut missing = Vec::new();
    for env in rows.keys() {
        if !PARAMS.iter().any(|p| p.name == env.as_str()) {
            missing.push(env.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "options without an entry in config::felix_params::PARAMS (Honoured or Ours): {missing:?}"
    );
    for p in PARAMS {
        let note = match p.felix {
            Felix::Honoured(n) => join("honoured", n),
            Felix::Ours(n) => join("ours", n),
            Felix::Unimplemented { .. } => continue,
        };
        let Some(row) = rows.get(p.name) else {
            panic!(
                "config::felix_params::PARAMS lists {} as an option, but no command reads it",
                p.name
            );
        };
        let flags: Vec<String> = row
            .flags
            .iter()
            .map(|(flag, subs)| {
                if subs.len() == subcommands.len() {
                    flag.clone()
                } else {
                    format!("{flag} ({})", subs.join(", "))
                }
            })
            .collect();
        let default = match row.default.as_deref() {
            None => "–".to_string(),
            Some("") | Some("\"\"") => "empty".to_string(),
            Some(d) => format!("`{}`", d.trim_matches('"')),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            p.name,
            flags.join(", "),
            default,
            cell(&row.text),
            cell(&note)
        ));
    }
    // Felix's parameters we do not implement, consecutive ones with the same reason together.
    let mut group: Vec<&str> = Vec::new();
    let mut last: Option<(&str, &str)> = None;
    let flush = |group: &mut Vec<&str>, last: Option<(&str, &str)>, out: &mut String| {
        if let Some((what, why)) = last {
            let names: Vec<String> = group.iter().map(|n| format!("`{n}`")).collect();
            out.push_str(&format!(
                "| {} | – | – | {} | {} |\n",
                names.join(", "),
                cell(what),
                cell(why)
            ));
        }
        group.clear();
    };
    for p in PARAMS {
        let Felix::Unimplemented { what, why } = p.felix else {
            continue;
        };
        if last != Some((what, why)) {
            flush(&mut group, last, &mut out);
            last = Some((what, why));
        }
        group.push(p.name);
    }
    flush(&mut group, last, &mut out);
    out
}

fn join(head: &str, note: &str) -> String {
    if note.is_empty() {
        head.to_string()
    } else {
        format!("{head}; {note}")
    }
}
