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
//! - `iface_naming` does not import `calc_graph` (resolvers answer the agent, not the graph);
//! - `config` imports none of `dataplane`, `iface_naming`, `host` (they read it);
//! - a file's unit tests sit in one place (`unit_tests_follow_one_layout`), and files of one
//!   name in two rooms name each other (`files_named_alike_in_two_rooms_name_each_other`), and
//!   no file holds more than about 800 lines of production code.
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
    let code = code_lines(&lines);
    let mut keep = vec![true; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        // The attribute, further attributes, then the item: to its `;` or its closing brace.
        let mut item = i + 1;
        while item < lines.len() && lines[item].trim_start().starts_with("#[") {
            item += 1;
        }
        let end = item_end(&code, item);
        keep[i..=end.max(i)].iter_mut().for_each(|k| *k = false);
        let j = end + 1;
        i = j;
    }
    lines
        .iter()
        .zip(keep)
        .map(|(l, k)| if k { *l } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines of a file as code: `//` comments cut, string literals (also raw and across
/// lines) and character literals blanked, so that a brace or a `//` inside `"..."`,
/// `r#"..."#` or `'{'` is not read as code.
fn code_lines(lines: &[&str]) -> Vec<String> {
    // Inside a string: the number of `#` that closes it (`None`: a plain string).
    let mut open: Option<Option<usize>> = None;
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        let chars: Vec<char> = line.chars().collect();
        let mut code = String::new();
        let mut i = 0;
        while i < chars.len() {
            if let Some(hashes) = open {
                match hashes {
                    None if chars[i] == '\\' => i += 1,
                    None if chars[i] == '"' => open = None,
                    Some(n)
                        if chars[i] == '"' && (1..=n).all(|k| chars.get(i + k) == Some(&'#')) =>
                    {
                        i += n;
                        open = None;
                    }
                    _ => {}
                }
                i += 1;
                continue;
            }
            match chars[i] {
                '/' if chars.get(i + 1) == Some(&'/') => break,
                '"' => open = Some(None),
                'r' if matches!(chars.get(i + 1), Some('"') | Some('#'))
                    && (i == 0 || !chars[i - 1].is_alphanumeric() && chars[i - 1] != '_') =>
                {
                    let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                    if chars.get(i + 1 + hashes) == Some(&'"') {
                        open = Some(Some(hashes));
                        i += 1 + hashes;
                    } else {
                        code.push('r');
                    }
                }
                // A character literal ('x' or '\x'); a lifetime ('a) has no closing quote.
                '\'' if chars.get(i + 2) == Some(&'\'') => i += 2,
                '\'' if chars.get(i + 1) == Some(&'\\') && chars.get(i + 3) == Some(&'\'') => {
                    i += 3
                }
                c => code.push(c),
            }
            i += 1;
        }
        out.push(code);
    }
    out
}

/// Opening and closing braces in a line of code (as read by [`code_lines`]).
fn braces(code: &str) -> (i32, i32) {
    let count = |b| code.chars().filter(|&c| c == b).count() as i32;
    (count('{'), count('}'))
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

/// The configuration describes settings; the rooms that act on them read it, never the
/// other way round (felix's config package likewise knows none of its consumers).
#[test]
fn config_knows_nothing_of_the_rooms_it_configures() {
    let (_, edges) = house();
    let bad: Vec<String> = edges
        .iter()
        .filter(|(room, i)| {
            room == "config" && ["dataplane", "iface_naming", "host"].contains(&i.target.as_str())
        })
        .map(|(room, i)| describe(room, i))
        .collect();
    assert!(
        bad.is_empty(),
        "config must not import dataplane, iface_naming or host:\n{}",
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

/// The one place a file's unit tests sit (docs/development/testing.md, "Unit tests"): one
/// `#[cfg(test)] mod tests` as the file's last item, inline or in its own file (`tests.rs`
/// beside a `mod.rs`, `<name>/tests.rs` beside `<name>.rs`); fixtures shared by the tests of
/// several files in a `#[cfg(test)] pub(crate) mod test_support` of their `mod.rs`. Nothing
/// else is compiled for tests only, so a reader never meets test code between production
/// items and the production text is the whole file up to its tests.
fn unit_test_layout_problems(rel: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let code = code_lines(&lines);
    let is_mod_rs = rel.file_name().is_some_and(|n| n == "mod.rs");
    let mut problems = Vec::new();
    let mut tests_end = None;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        let at = i + 1;
        if lines[i].starts_with(char::is_whitespace) {
            problems.push(format!(
                "{}:{at}: #[cfg(test)] inside an item",
                rel.display()
            ));
        }
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim_start().starts_with("#[") {
            j += 1;
        }
        let item = lines.get(j).map_or("", |l| l.trim());
        let name = item
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ");
        let end = item_end(&code, j);
        if name.starts_with("mod tests") {
            if tests_end.is_some() {
                problems.push(format!("{}:{at}: a second tests module", rel.display()));
            }
            tests_end = Some(end);
            if name == "mod tests;" {
                let beside = if is_mod_rs {
                    rel.with_file_name("tests.rs")
                } else {
                    rel.with_extension("").join("tests.rs")
                };
                let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
                if !src.join(&beside).exists() {
                    problems.push(format!(
                        "{}:{at}: `mod tests;` but no src/{}",
                        rel.display(),
                        beside.display()
                    ));
                }
            }
        } else if !(is_mod_rs && name.starts_with("mod test_support")) || tests_end.is_some() {
            problems.push(format!(
                "{}:{at}: test-only item `{item}` (only `mod tests`, last, and a mod.rs's \
                 `test_support` before it)",
                rel.display()
            ));
        }
        i = end + 1;
    }
    if let Some(end) = tests_end {
        if let Some(k) = (end + 1..lines.len()).find(|&k| !lines[k].trim().is_empty()) {
            problems.push(format!(
                "{}:{}: production code after the tests module",
                rel.display(),
                k + 1
            ));
        }
    }
    problems
}

/// The last line of the item starting at `start`: its `;`, or its closing brace.
fn item_end(code: &[String], start: usize) -> usize {
    let mut depth = 0i32;
    let mut opened = false;
    for (k, code) in code.iter().enumerate().skip(start) {
        let (open, close) = braces(code);
        depth += open - close;
        opened |= open > 0;
        if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
            return k;
        }
    }
    code.len().saturating_sub(1)
}

#[test]
fn unit_tests_follow_one_layout() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        problems.extend(unit_test_layout_problems(
            file.strip_prefix(&src).unwrap(),
            &text,
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_layout_check_finds_each_kind_of_misplaced_test_code() {
    let rel = Path::new("model/x.rs");
    let good = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {\n        for s in [\"//x\", \"{\"] {\n            let _ = (s, '{');\n        }\n    }\n}\n";
    assert!(unit_test_layout_problems(rel, good).is_empty());
    let cases = [
        (
            "impl A {\n    #[cfg(test)]\n    fn only_for_tests() {}\n}\n",
            "inside an item",
        ),
        (
            "#[cfg(test)]\nfn helper() {}\nfn a() {}\n",
            "test-only item",
        ),
        (
            "#[cfg(test)]\nmod tests {\n}\nfn a() {}\n",
            "after the tests module",
        ),
        (
            "#[cfg(test)]\nmod tests {\n}\n#[cfg(test)]\nmod tests {\n}\n",
            "second tests module",
        ),
        ("#[cfg(test)]\nmod tests;\n", "no src/model/x/tests.rs"),
        (
            "#[cfg(test)]\npub(crate) mod test_support {\n}\n",
            "test-only item",
        ),
    ];
    for (text, want) in cases {
        let found = unit_test_layout_problems(rel, text);
        assert!(
            found.iter().any(|p| p.contains(want)),
            "{want:?} not found for {text:?}: {found:?}"
        );
    }
    let support =
        "#[cfg(test)]\npub(crate) mod test_support {\n}\n\n#[cfg(test)]\nmod tests {\n}\n";
    assert!(unit_test_layout_problems(Path::new("model/mod.rs"), support).is_empty());
}

/// The module path of a file (`src/model/validate/staged.rs` → `model::validate::staged`,
/// `src/host/conntrack/mod.rs` → `host::conntrack`).
fn module_path(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// Files of one name in two rooms are one concept at two layers (a staged policy as the
/// model holds it, as the verdict evaluates it, as the command shows it); each says so by
/// naming the others in its module doc, so whoever opens one finds the rest. Two files of
/// one name that are not one concept get names that tell them apart.
#[test]
fn files_named_alike_in_two_rooms_name_each_other() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap().to_path_buf();
        let path = module_path(&rel);
        let name = path.rsplit("::").next().unwrap().to_string();
        if path.contains("::") && name != "tests" {
            by_name.entry(name).or_default().push(rel);
        }
    }
    let mut problems = Vec::new();
    for files in by_name.values() {
        let rooms: BTreeSet<String> = files
            .iter()
            .map(|f| module_path(f))
            .map(|p| p.split("::").next().unwrap().to_string())
            .collect();
        if rooms.len() < 2 {
            continue;
        }
        for file in files {
            let text = std::fs::read_to_string(src.join(file)).unwrap();
            let doc: String = text
                .lines()
                .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ")
                .replace("//!", "");
            let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            for other in files.iter().filter(|o| *o != file) {
                let theirs = module_path(other);
                if !doc.contains(&theirs) {
                    problems.push(format!(
                        "src/{}: its module doc does not name `{theirs}`",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "files of one name in two rooms must say they are one concept at two layers, each \
         naming the others:\n{}",
        problems.join("\n")
    );
}

/// A file past about 800 lines of production code holds more than one concern and is split
/// by concern (its unit tests do not count: they sit after it, see `unit_tests_follow_one_layout`).
#[test]
fn no_production_file_passes_800_lines() {
    const LIMIT: usize = 800;
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long = Vec::new();
    for file in &files {
        let Some(text) = production_text(file) else {
            continue;
        };
        let lines = text.trim_end().lines().count();
        if lines > LIMIT {
            long.push(format!(
                "{} ({lines} lines)",
                file.strip_prefix(&src).unwrap().display()
            ));
        }
    }
    assert!(
        long.is_empty(),
        "production files over {LIMIT} lines, to split by concern: {}",
        long.join(", ")
    );
}
