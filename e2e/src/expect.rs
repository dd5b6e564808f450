//! Truth tables in the upstream style (rows are sources, columns destinations, `.` connected,
//! `X` blocked), built from a scenario's `deny`/`allow` patterns or a written matrix, and
//! printed next to what was observed; with the probe keys (`Protocol`, `PortKey`) and the
//! scenario's expectation declaration they are built from.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::{anyhow, bail, ensure};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    pub fn parse(text: &str) -> Option<Protocol> {
        match text {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// One probed combination: the key of an expectation (`TCP/80`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub protocol: Protocol,
    pub port: u16,
}

impl std::fmt::Display for PortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.protocol.as_str(), self.port)
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectDecl {
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub matrix: Option<String>,
}

/// Booleans for every ordered pair of distinct pods. Self pairs are not stored: upstream
/// ignores loopback because CNIs differ on hairpin traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TruthTable {
    pub pods: Vec<String>,
    cells: BTreeMap<(String, String), bool>,
}

impl TruthTable {
    pub fn all(pods: &[String], value: bool) -> TruthTable {
        let mut cells = BTreeMap::new();
        for from in pods {
            for to in pods {
                if from != to {
                    cells.insert((from.clone(), to.clone()), value);
                }
            }
        }
        TruthTable {
            pods: pods.to_vec(),
            cells,
        }
    }

    pub fn get(&self, from: &str, to: &str) -> Option<bool> {
        self.cells.get(&(from.to_string(), to.to_string())).copied()
    }

    pub fn set(&mut self, from: &str, to: &str, value: bool) {
        if let Some(cell) = self.cells.get_mut(&(from.to_string(), to.to_string())) {
            *cell = value;
        }
    }

    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str, bool)> {
        self.cells
            .iter()
            .map(|((f, t), v)| (f.as_str(), t.as_str(), *v))
    }
}

/// `*` matches any run of characters (including none); everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

fn parse_pattern(pattern: &str) -> anyhow::Result<(&str, &str)> {
    let (from, to) = pattern
        .split_once("->")
        .ok_or_else(|| anyhow!("pattern {pattern:?} is not of the form \"from->to\""))?;
    let (from, to) = (from.trim(), to.trim());
    for side in [from, to] {
        ensure!(
            side.contains('/') || side == "*",
            "pattern {pattern:?}: side {side:?} must be \"ns/pod\" (with * wildcards) or \"*\""
        );
    }
    Ok((from, to))
}

fn side_matches(side: &str, pod: &str) -> bool {
    side == "*" || glob_match(side, pod)
}

fn apply_patterns(
    table: &mut TruthTable,
    patterns: &[String],
    value: bool,
    what: &str,
) -> anyhow::Result<()> {
    for pattern in patterns {
        let (from, to) = parse_pattern(pattern)?;
        let mut hit = false;
        for f in table.pods.clone() {
            for t in table.pods.clone() {
                if f != t && side_matches(from, &f) && side_matches(to, &t) {
                    table.set(&f, &t, value);
                    hit = true;
                }
            }
        }
        ensure!(
            hit,
            "{what} pattern {pattern:?} matches no pair of the pods that exist at this step"
        );
    }
    Ok(())
}

fn parse_matrix(text: &str, pods: &[String]) -> anyhow::Result<TruthTable> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| anyhow!("matrix is empty"))?
        .split_whitespace()
        .collect();
    let columns = &header[1.min(header.len())..];
    let want: BTreeSet<&str> = pods.iter().map(String::as_str).collect();
    let have: BTreeSet<&str> = columns.iter().copied().collect();
    ensure!(
        have.len() == columns.len(),
        "matrix header lists a pod twice"
    );
    ensure!(
        have == want,
        "matrix columns {:?} are not the pods that exist at this step {:?}",
        columns,
        pods
    );
    let mut table = TruthTable::all(pods, true);
    let mut rows = BTreeSet::new();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        let from = words[0];
        ensure!(want.contains(from), "matrix row {from:?} is not a pod");
        ensure!(rows.insert(from), "matrix row {from:?} appears twice");
        ensure!(
            words.len() == columns.len() + 1,
            "matrix row {from:?} has {} cells, the header has {} columns",
            words.len() - 1,
            columns.len()
        );
        for (to, cell) in columns.iter().zip(&words[1..]) {
            let value = match *cell {
                "." => true,
                "X" | "x" => false,
                "#" | "-" if from == *to => true,
                other => bail!("matrix cell {from}->{to} is {other:?}; use '.' or 'X'"),
            };
            if from != *to {
                table.set(from, to, value);
            }
        }
    }
    ensure!(
        rows.len() == want.len(),
        "matrix has rows for {:?}, every pod needs one",
        rows
    );
    Ok(table)
}

pub fn parse_key(key: &str) -> anyhow::Result<PortKey> {
    let (proto, port) = key
        .split_once('/')
        .ok_or_else(|| anyhow!("expectation key {key:?} is neither \"*\" nor \"PROTO/PORT\""))?;
    let protocol = Protocol::parse(proto)
        .ok_or_else(|| anyhow!("expectation key {key:?}: unknown protocol"))?;
    let port = port
        .parse()
        .map_err(|_| anyhow!("expectation key {key:?}: bad port"))?;
    Ok(PortKey { protocol, port })
}

fn one(decl: &ExpectDecl, pods: &[String]) -> anyhow::Result<TruthTable> {
    if let Some(matrix) = &decl.matrix {
        ensure!(
            decl.deny.is_empty() && decl.allow.is_empty(),
            "an expectation holds either `matrix` or `deny`/`allow`, not both"
        );
        return parse_matrix(matrix, pods);
    }
    let mut table = TruthTable::all(pods, true);
    apply_patterns(&mut table, &decl.deny, false, "deny")?;
    apply_patterns(&mut table, &decl.allow, true, "allow")?;
    Ok(table)
}

/// One truth table per probed combination: the `PROTO/PORT` key if present, else `*`.
pub fn parse_expectations(
    decls: &BTreeMap<String, Option<ExpectDecl>>,
    probed: &[PortKey],
    pods: &[String],
) -> anyhow::Result<BTreeMap<PortKey, TruthTable>> {
    let mut specific = BTreeMap::new();
    let mut star = None;
    for (key, decl) in decls {
        let decl = decl.clone().unwrap_or_default();
        let table = one(&decl, pods).map_err(|e| anyhow!("expect {key:?}: {e:#}"))?;
        if key == "*" {
            star = Some(table);
        } else {
            let k = parse_key(key)?;
            ensure!(
                probed.contains(&k),
                "expect {key:?}: {k} is not probed (see `probe`)"
            );
            specific.insert(k, table);
        }
    }
    let mut out = BTreeMap::new();
    for k in probed {
        let table = specific
            .get(k)
            .or(star.as_ref())
            .ok_or_else(|| anyhow!("no expectation for {k} (add \"{k}\" or \"*\")"))?;
        out.insert(*k, table.clone());
    }
    Ok(out)
}

/// What one probe saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Connected,
    Blocked,
    /// Something answered, but not the pod that was targeted (a harness or DNAT fault).
    WrongPeer(String),
}

impl Outcome {
    pub fn connected(&self) -> bool {
        matches!(self, Outcome::Connected)
    }

    fn symbol(&self) -> char {
        match self {
            Outcome::Connected => '.',
            Outcome::Blocked => 'X',
            Outcome::WrongPeer(_) => '!',
        }
    }
}

pub type Observed = BTreeMap<(String, String), Outcome>;

/// Pairs whose observation differs from the expectation.
pub fn mismatches(expected: &TruthTable, observed: &Observed) -> Vec<(String, String)> {
    expected
        .pairs()
        .filter(|(f, t, want)| {
            observed
                .get(&(f.to_string(), t.to_string()))
                .is_none_or(|o| o.connected() != *want || matches!(o, Outcome::WrongPeer(_)))
        })
        .map(|(f, t, _)| (f.to_string(), t.to_string()))
        .collect()
}

/// Pod names longer than this get numbered columns (network-policy-api's namespaces are
/// 37 characters long; a table of them would be hundreds of columns wide).
const LONG_NAME: usize = 16;

/// Expected, observed and a comparison table (`.` agrees, `X` differs) side by side in the
/// upstream layout. With long pod names the columns are numbered and each row starts with
/// its number.
pub fn render(key: PortKey, expected: &TruthTable, observed: &Observed) -> String {
    let pods = &expected.pods;
    let longest = pods.iter().map(String::len).max().unwrap_or(1).max(1);
    let numbered = longest > LONG_NAME;
    let number_width = pods.len().to_string().len();
    let column = |i: usize, name: &str| {
        if numbered {
            (i + 1).to_string()
        } else {
            name.to_string()
        }
    };
    let cell_width = if numbered { number_width } else { longest };
    let row_width = if numbered {
        number_width + 1 + longest
    } else {
        longest
    };
    let table = |title: &str, cell: &dyn Fn(&str, &str) -> char| {
        let mut s = format!("{title}:\n{:row_width$}", "-");
        for (i, to) in pods.iter().enumerate() {
            let _ = write!(s, " {:cell_width$}", column(i, to));
        }
        s.push('\n');
        for (i, from) in pods.iter().enumerate() {
            let label = if numbered {
                format!("{:>number_width$} {from}", i + 1)
            } else {
                from.clone()
            };
            let _ = write!(s, "{label:row_width$}");
            for to in pods {
                let c = if from == to { '#' } else { cell(from, to) };
                let _ = write!(s, " {c:cell_width$}");
            }
            s.push('\n');
        }
        s
    };
    let exp = |f: &str, t: &str| match expected.get(f, t) {
        Some(true) => '.',
        Some(false) => 'X',
        None => '?',
    };
    let obs = |f: &str, t: &str| {
        observed
            .get(&(f.to_string(), t.to_string()))
            .map_or('?', Outcome::symbol)
    };
    let cmp = |f: &str, t: &str| if exp(f, t) == obs(f, t) { '.' } else { 'X' };
    let mut out = format!("{key}\n");
    out.push_str(&table("expected", &exp));
    out.push_str(&table("observed", &obs));
    out.push_str(&table("comparison (X = mismatch)", &cmp));
    for ((f, t), o) in observed {
        if let Outcome::WrongPeer(who) = o {
            let _ = writeln!(out, "{f} -> {t}: answered by {who:?}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Vec<String> {
        ["x/a", "x/b", "y/a"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn globs() {
        assert!(glob_match("x/*", "x/a"));
        assert!(glob_match("*/a", "y/a"));
        assert!(glob_match("*", "y/a"));
        assert!(!glob_match("x/*", "y/a"));
        assert!(glob_match("x/a*b", "x/a-long-b"));
        assert!(!glob_match("x/a*b", "x/a-long-c"));
    }

    #[test]
    fn deny_then_allow() {
        let decl = ExpectDecl {
            deny: vec!["*->x/a".into()],
            allow: vec!["x/b->x/a".into()],
            matrix: None,
        };
        let t = one(&decl, &pods()).unwrap();
        assert_eq!(t.get("y/a", "x/a"), Some(false));
        assert_eq!(t.get("x/b", "x/a"), Some(true));
        assert_eq!(t.get("x/a", "y/a"), Some(true));
        assert_eq!(t.get("x/a", "x/a"), None);
    }

    #[test]
    fn matrix_equals_patterns() {
        let m = ExpectDecl {
            matrix: Some("- x/a x/b y/a\nx/a # . .\nx/b . . .\ny/a X . .\n".into()),
            ..Default::default()
        };
        let p = ExpectDecl {
            deny: vec!["y/a->x/a".into()],
            ..Default::default()
        };
        assert_eq!(one(&m, &pods()).unwrap(), one(&p, &pods()).unwrap());
        let missing_row = ExpectDecl {
            matrix: Some("- x/a x/b y/a\nx/a # . .\nx/b . . .\n".into()),
            ..Default::default()
        };
        assert!(one(&missing_row, &pods()).is_err());
    }

    #[test]
    fn mismatches_and_render() {
        let expected = TruthTable::all(&pods(), true);
        let mut observed = Observed::new();
        for (f, t, _) in expected.pairs() {
            observed.insert((f.into(), t.into()), Outcome::Connected);
        }
        assert!(mismatches(&expected, &observed).is_empty());
        observed.insert(("x/a".into(), "y/a".into()), Outcome::Blocked);
        assert_eq!(
            mismatches(&expected, &observed),
            vec![("x/a".to_string(), "y/a".to_string())]
        );
        let key = PortKey {
            protocol: Protocol::Tcp,
            port: 80,
        };
        let text = render(key, &expected, &observed);
        assert!(text.contains("comparison"), "{text}");
        assert!(text.contains("\n-   x/a x/b y/a\n"), "{text}");

        let long: Vec<String> = [
            "network-policy-conformance-gryffindor/harry-potter-0",
            "y/b",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let expected = TruthTable::all(&long, false);
        let mut observed = Observed::new();
        observed.insert((long[1].clone(), long[0].clone()), Outcome::Connected);
        let text = render(key, &expected, &observed);
        let lines: Vec<&str> = text.lines().collect();
        let pad = " ".repeat(long[0].len() + 1);
        assert_eq!(lines[2], format!("-{pad} 1 2"), "{text}");
        assert_eq!(lines[3], format!("1 {} # X", long[0]), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("2 y/b") && l.ends_with(". #")),
            "{text}"
        );
    }
}
