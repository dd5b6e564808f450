//! The documentation against the code and itself: every relative link in README.md and
//! docs/ resolves (file and, for Markdown pages, heading anchor); three reference pages are
//! generated from the code and must equal it: docs/reference/cli.md (every command's
//! `--help`), the option table of docs/reference/configuration.md (clap's definitions and
//! `config::felix_params`) and the table of docs/reference/metrics.md (the registry's HELP).
//!
//! Regenerate them with `NETPOL_REGENERATE_DOCS=1 cargo test --test docs`: the generator is
//! this test (it reads the built binary's clap help and the library's tables), so the agent's
//! binary carries no documentation code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
const REGENERATE: &str = "NETPOL_REGENERATE_DOCS=1 cargo test --test docs";

/// Pages other work in progress is writing; a link to them may come first.
const PENDING: &[&str] = &["docs/verified-on.md", "docs/design/ipvs.md"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files.sort();
    files
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans hold no links.
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` targets of a page's prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn relative_links_resolve() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(root()).unwrap().display().to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            checked += 1;
            let Ok(dest) = dest.canonicalize() else {
                let rel = normalise(&file.parent().unwrap().join(path));
                if !PENDING.iter().any(|p| rel == root().join(p)) {
                    broken.push(format!("{shown}: {target}: no such file"));
                }
                continue;
            };
            if !anchor.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                let page = std::fs::read_to_string(&dest).unwrap();
                if !anchors(&page).contains(anchor) {
                    broken.push(format!("{shown}: {target}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 50, "only {checked} links seen");
}

/// `a/b/../c` → `a/c` without touching the file system (the file may not exist).
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: move sections to docs/"
    );
    for needle in [
        "scripts/demo.sh",
        "scripts/test.sh",
        "docs/install.md",
        "LICENSE",
    ] {
        assert!(
            readme.contains(needle),
            "README.md does not mention {needle}"
        );
    }
}

// ---- Generated: the commands' help in docs/reference/cli.md.

const BEGIN: &str =
    "<!-- generated by `NETPOL_REGENERATE_DOCS=1 cargo test --test docs`: do not edit below -->";
const END: &str = "<!-- end of generated text -->";

/// `netpol-agent [sub] --help` with no FELIX_* variable in the environment (clap would print
/// their values), trailing blanks trimmed.
fn help(sub: Option<&str>) -> String {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") || k == "NODENAME" {
            cmd.env_remove(k);
        }
    }
    if let Some(sub) = sub {
        cmd.arg(sub);
    }
    let out = cmd.arg("--help").env("COLUMNS", "100").output().unwrap();
    assert!(out.status.success(), "{sub:?} --help");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

fn subcommands() -> Vec<String> {
    let top = help(None);
    let list = top.split("Commands:\n").nth(1).unwrap();
    let list = list.split("\n\n").next().unwrap();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

fn generated_cli() -> String {
    let mut out = String::new();
    out.push_str("## Every command's options\n\n");
    out.push_str("What `netpol-agent <command> --help` prints (clap's long help).\n\n");
    out.push_str("### `netpol-agent`\n\n```text\n");
    out.push_str(&help(None));
    out.push_str("\n```\n");
    for sub in subcommands() {
        out.push_str(&format!("\n### `netpol-agent {sub}`\n\n```text\n"));
        out.push_str(&help(Some(&sub)));
        out.push_str("\n```\n");
    }
    out
}

/// Replaces what stands between the markers of `page` (appending them when missing) with
/// `generated`; with NETPOL_REGENERATE_DOCS set writes the page, else fails if it differs.
fn check_generated(page: &str, generated: &str) {
    let path = root().join(page);
    let text = std::fs::read_to_string(&path).unwrap();
    let head = match text.find(BEGIN) {
        Some(i) => text[..i].to_string(),
        None => format!("{}\n\n", text.trim_end()),
    };
    // Hand-written text may follow the generated part.
    let tail = text
        .find(END)
        .map(|i| text[i + END.len()..].to_string())
        .unwrap_or_else(|| "\n".to_string());
    let want = format!("{head}{BEGIN}\n\n{generated}\n{END}{tail}");
    if std::env::var_os("NETPOL_REGENERATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    if text != want {
        let first = text
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(text.lines().count().min(want.lines().count()));
        panic!(
            "{page} is not what the code says (first difference at line {}: {:?} vs {:?}); run `{REGENERATE}`",
            first + 1,
            text.lines().nth(first),
            want.lines().nth(first)
        );
    }
}

#[test]
fn cli_reference_is_the_binarys_help() {
    check_generated("docs/reference/cli.md", &generated_cli());
}

#[path = "docs_gen/configuration.rs"]
mod configuration;

#[test]
fn configuration_reference_is_the_options_and_felix_table() {
    let subs = subcommands();
    check_generated(
        "docs/reference/configuration.md",
        &configuration::generate(&subs, help),
    );
}

// ---- Generated: the metrics table in docs/reference/metrics.md.

/// The metrics table from the registry: each metric's name, labels, type and HELP text.
fn generated_metrics() -> String {
    use netpol_agent::telemetry::metrics::{
        self, CONNTRACK_NAMES, NAMES, TRAFFIC_NAMES, WHEN_SET_NAMES,
    };
    let docs = metrics::docs();
    let registered: BTreeSet<&str> = docs.iter().map(|d| d.name.as_str()).collect();
    let listed: BTreeSet<&str> = NAMES
        .iter()
        .chain(TRAFFIC_NAMES)
        .chain(CONNTRACK_NAMES)
        .chain(WHEN_SET_NAMES)
        .copied()
        .collect();
    assert_eq!(
        registered, listed,
        "the registry vs metrics::NAMES and friends"
    );
    let mut out = String::from("| metric | type | meaning |\n|---|---|---|\n");
    for d in docs {
        let labels = if d.labels.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", d.labels.join(","))
        };
        out.push_str(&format!(
            "| `{}{labels}` | {} | {} |\n",
            d.name,
            d.kind,
            d.help.replace('|', "\\|")
        ));
    }
    out
}

#[test]
fn metrics_reference_is_the_registry() {
    check_generated("docs/reference/metrics.md", &generated_metrics());
}
