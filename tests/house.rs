//! Keeps the house honest: reads `src/` and fails when a top-level module imports one it must
//! not. The data walks one way (datastore → agent → calc graph → rules → dataplane), and
//! the imports must show it:
//! - no import circle between top-level modules;
//! - `model` imports none of ours;
//! - the pure rooms (`rules`, `calc_graph`, `model`, `backoff`, `verdict`, `kernel_text`)
//!   import
//!   only pure rooms, never an I/O one (`agent`, `datastore`, `iface_naming`, `dataplane`, `host`,
//!   `telemetry`, `config`);
//! - `datastore` does not import `calc_graph` (sources know nothing of their consumer);
//! - `iface_naming` does not import `calc_graph` (resolvers answer the agent, not the graph).
//!
//! Test code (`#[cfg(test)]` modules, `tests.rs` files) is left out: a unit test may use any
//! room to build its fixtures. Imports are read as text (`crate::room` paths, including
//! `use crate::{a, b}` groups), which is what the rules are about.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const PURE: [&str; 6] = [
    "model",
    "kernel_text",
    "rules",
    "calc_graph",
    "backoff",
    "verdict",
];

/// Rooms each pure room may import (besides itself).
fn allowed_for_pure(room: &str) -> &'static [&'static str] {
    match room {
        "model" | "backoff" | "kernel_text" => &[],
        "rules" => &["model"],
        "calc_graph" => &["model", "rules"],
        // The evaluator renders policy chains (for their hashes) but never the graph.
        "verdict" => &["model", "rules", "kernel_text"],
        _ => &[],
    }
}

/// One import: file, line, and the top-level room imported.
#[derive(Debug, Clone)]
struct Import {
    file: PathBuf,
    line: usize,
    target: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level room a file belongs to (`src/dataplane/iptables/plan.rs` → `dataplane`);
/// `None` for the crate roots.
fn room_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let room = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (room != "lib" && room != "main").then_some(room)
}

/// The text of a file without its test code: each item under a `#[cfg(test)]` line is cut
/// (a `mod tests;` declaration, a `use`, a helper `fn`, a `mod tests { ... }` block, found by
/// its braces) and the rest kept, wherever in the file it sits; `tests.rs` files are
/// skipped. Cut lines are left empty, so line numbers stay the file's.
fn production_text(file: &Path) -> Option<String> {
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(file).unwrap();
    Some(without_test_items(&text))
}

fn without_test_items(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut keep = vec![true; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        // The attribute, further attributes, then the item: to its `;` or its closing brace.
        let mut depth = 0i32;
        let mut opened = false;
        let mut j = i;
        while j < lines.len() {
            keep[j] = false;
            let code = lines[j].split("//").next().unwrap_or("");
            let attribute = code.trim_start().starts_with("#[");
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            j += 1;
            if !attribute && ((opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')))
            {
                break;
            }
        }
        i = j;
    }
    lines
        .iter()
        .zip(keep)
        .map(|(l, k)| if k { *l } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn test_items_are_cut_wherever_they_sit() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests;\nuse crate::b;\n#[cfg(test)]\n#[allow(dead_code)]\nfn helper() {\n    crate::c::x();\n}\nuse crate::d;\n#[cfg(test)]\nmod more {\n    use crate::e;\n    fn f() { if true { crate::g(); } }\n}\n";
    let cut = without_test_items(text);
    for kept in ["crate::a", "crate::b", "crate::d"] {
        assert!(cut.contains(kept), "{kept}: {cut}");
    }
    for gone in ["mod tests", "crate::c", "crate::e", "crate::g"] {
        assert!(!cut.contains(gone), "{gone}: {cut}");
    }
    assert_eq!(
        cut.lines().nth(3),
        Some("use crate::b;"),
        "line numbers kept"
    );
}

/// `crate::room` references in `text`, with `use crate::{a, b::c}` groups expanded.
fn imports_in(file: &Path, text: &str) -> Vec<Import> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(pos) = rest.find("crate::") {
            let after = &rest[pos + "crate::".len()..];
            // A path like `netpol_crate::x` is not ours.
            let before_ok = rest[..pos]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            if before_ok {
                if let Some(group) = after.strip_prefix('{') {
                    let inner = group.split('}').next().unwrap_or("");
                    for item in inner.split(',') {
                        let name: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !name.is_empty() && name != "self" {
                            out.push(Import {
                                file: file.to_path_buf(),
                                line: n + 1,
                                target: name,
                            });
                        }
                    }
                } else {
                    let name: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push(Import {
                            file: file.to_path_buf(),
                            line: n + 1,
                            target: name,
                        });
                    }
                }
            }
            rest = after;
        }
    }
    out
}

fn house() -> (BTreeSet<String>, Vec<(String, Import)>) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut rooms = BTreeSet::new();
    let mut edges = Vec::new();
    for file in &files {
        let Some(room) = room_of(&src, file) else {
            continue;
        };
        rooms.insert(room.clone());
        let Some(text) = production_text(file) else {
            continue;
        };
        for import in imports_in(file, &text) {
            if import.target != room {
                edges.push((room.clone(), import));
            }
        }
    }
    // Only imports of rooms (not of items re-exported at the crate root, if any).
    edges.retain(|(_, i)| rooms.contains(&i.target));
    (rooms, edges)
}

fn describe(room: &str, i: &Import) -> String {
    format!(
        "{}:{} ({room}) imports crate::{}",
        i.file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&i.file)
            .display(),
        i.line,
        i.target
    )
}

#[test]
fn pure_rooms_import_only_pure_rooms_below_them() {
    let (_, edges) = house();
    let bad: Vec<String> = edges
        .iter()
        .filter(|(room, i)| {
            PURE.contains(&room.as_str()) && !allowed_for_pure(room).contains(&i.target.as_str())
        })
        .map(|(room, i)| describe(room, i))
        .collect();
    assert!(
        bad.is_empty(),
        "pure rooms must not import these (model imports nothing of ours; rules only model; \
         calc_graph only model and rules; verdict only model, rules and kernel_text):\n{}",
        bad.join("\n")
    );
}

#[test]
fn sources_and_resolvers_know_nothing_of_the_graph() {
    let (_, edges) = house();
    let bad: Vec<String> = edges
        .iter()
        .filter(|(room, i)| {
            (room == "datastore" || room == "iface_naming") && i.target == "calc_graph"
        })
        .map(|(room, i)| describe(room, i))
        .collect();
    assert!(
        bad.is_empty(),
        "datastore and iface_naming emit events; they must not import calc_graph:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_import_circles_between_rooms() {
    let (rooms, edges) = house();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in &rooms {
        graph.entry(r).or_default();
    }
    for (room, i) in &edges {
        graph.entry(room).or_default().insert(&i.target);
    }
    // A room is in a circle when it reaches itself.
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = graph[from].iter().copied().collect();
        while let Some(r) = todo.pop() {
            if seen.insert(r.to_string()) {
                todo.extend(graph[r].iter().copied());
            }
        }
        seen
    };
    let mut circles = Vec::new();
    for room in graph.keys() {
        let mine = reaches(room);
        if !mine.contains(*room) {
            continue;
        }
        // The imports of this room that lead back to it.
        for (r, i) in edges.iter().filter(|(r, _)| r == room) {
            if i.target == *room || reaches(&i.target).contains(*room) {
                circles.push(describe(r, i));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between top-level modules (each line is an import that leads back to \
         its own room):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_finds_imports_and_groups() {
    let text = "use crate::model::IpFamily;\nuse crate::{rules, ipsets::SetDef};\n// crate::host\nlet x = netpol_crate::y;\nlet m = crate::telemetry::metrics::global();";
    let found: Vec<String> = imports_in(Path::new("f.rs"), text)
        .into_iter()
        .map(|i| format!("{}:{}", i.line, i.target))
        .collect();
    assert_eq!(found, ["1:model", "2:rules", "2:ipsets", "5:telemetry"]);
}

/// docs/development/layout.md names every folder of src/, so a newcomer finds each room
/// there: a top-level folder by its own row (`src/NAME/`, or the row of `src/NAME.rs` naming
/// `NAME/`), a folder inside one in its room's row (`watch/`, `iptables/plan/`).
#[test]
fn layout_names_every_folder_of_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layout = std::fs::read_to_string(root.join("docs/development/layout.md")).unwrap();
    let row = |top: &str| {
        layout.lines().find(|l| {
            l.starts_with(&format!("| `src/{top}/`")) || l.starts_with(&format!("| `src/{top}.rs`"))
        })
    };
    fn folders(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.push(path.clone());
                folders(&path, out);
            }
        }
    }
    let src = root.join("src");
    let mut all = Vec::new();
    folders(&src, &mut all);
    let mut missing = Vec::new();
    for folder in &all {
        let rel = folder
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (top, rest) = rel.split_once('/').unwrap_or((&rel, ""));
        let named = match row(top) {
            None => false,
            Some(line) if rest.is_empty() => {
                line.starts_with(&format!("| `src/{top}/`")) || line.contains(&format!("`{top}/"))
            }
            Some(line) => line.contains(&format!("`{rest}/")),
        };
        if !named {
            missing.push(format!("src/{rel}/"));
        }
    }
    assert!(
        all.len() > 10,
        "found only {} folders under src/",
        all.len()
    );
    assert!(
        missing.is_empty(),
        "docs/development/layout.md does not name these folders in their room's row: {missing:?}"
    );
}
