//! Lines of `iptables-save` output and `iptables-restore` input.
//!
//! Guarantees: any bytes are read (a line that is not UTF-8 is given lossily and flagged, so
//! a consumer can keep positions and counts without ever trusting its text); a rule line's
//! `[packets:bytes] ` counter prefix (`-c`) is dropped; and every line is given as current
//! iptables (1.8.8 and later) prints it ([`normalize_save_line`]), so one rule reads the same
//! whatever release printed it.

use std::borrow::Cow;

/// One line, classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveLine<'a> {
    /// `*filter`: the table the following lines belong to.
    Table(&'a str),
    /// `:NAME POLICY [p:b]`; the policy is `None` for a user chain (`-`).
    Chain {
        name: &'a str,
        policy: Option<&'a str>,
    },
    /// `-A CHAIN BODY`: a rule appended to the chain.
    Append { chain: &'a str, body: &'a str },
    /// `-I CHAIN [N] BODY`: a rule inserted at 1-based position `N` (1 when not given).
    Insert {
        chain: &'a str,
        position: usize,
        body: &'a str,
    },
    /// `COMMIT`: the end of a table.
    Commit,
    /// `# ...`: the save's header and footer, and the nft tools' warnings.
    Comment(&'a str),
    /// A blank line, or one of no kind above (`-F`, `-X`, ... in restore input).
    Other,
}

/// One line of the text as read: counters dropped, normalized, and whether it was UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    pub text: Cow<'a, str>,
    /// The raw line was not UTF-8: `text` is a lossy copy. Such a line is never ours (we
    /// write only safe ASCII).
    pub lossy: bool,
}

impl Line<'_> {
    pub fn kind(&self) -> SaveLine<'_> {
        classify(&self.text)
    }
}

/// Every line of `bytes`, in order.
pub fn lines(bytes: &[u8]) -> impl Iterator<Item = Line<'_>> {
    bytes.split(|&b| b == b'\n').map(|raw| {
        let raw = strip_counters(raw);
        match std::str::from_utf8(raw) {
            Ok(text) => Line {
                text: normalize_save_line(text),
                lossy: false,
            },
            Err(_) => Line {
                text: Cow::Owned(normalize_save_line(&String::from_utf8_lossy(raw)).into_owned()),
                lossy: true,
            },
        }
    })
}

/// What kind of line `line` is (already normalized and without counters: see [`lines`]).
pub fn classify(line: &str) -> SaveLine<'_> {
    if let Some(text) = line.strip_prefix('#') {
        return SaveLine::Comment(text);
    }
    if let Some(name) = line.strip_prefix('*') {
        return SaveLine::Table(name.trim());
    }
    if line == "COMMIT" {
        return SaveLine::Commit;
    }
    if let Some(decl) = line.strip_prefix(':') {
        let mut words = decl.split_whitespace();
        return match words.next() {
            Some(name) => SaveLine::Chain {
                name,
                policy: words.next().filter(|p| *p != "-"),
            },
            None => SaveLine::Other,
        };
    }
    if let Some(rest) = line.strip_prefix("-A ") {
        let (chain, body) = rest.split_once(' ').unwrap_or((rest, ""));
        return SaveLine::Append { chain, body };
    }
    if let Some(rest) = line.strip_prefix("-I ") {
        let (chain, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let (first, after) = rest.split_once(' ').unwrap_or((rest, ""));
        return match first.parse::<usize>() {
            Ok(position) => SaveLine::Insert {
                chain,
                position,
                body: after,
            },
            Err(_) => SaveLine::Insert {
                chain,
                position: 1,
                body: rest,
            },
        };
    }
    SaveLine::Other
}

/// One line of `iptables-save` output in the form current iptables (1.8.8 and later) prints
/// it, so that one rule reads the same whatever release printed it:
/// - iptables 1.8.7 (Debian 11, and the `-nft` tools' save) ends a rule without a target
///   with a space;
/// - its `NFLOG` extension prints two spaces after `--nflog-prefix` (both backends); a
///   prefix that starts with a space is printed quoted, so two spaces there are never part
///   of a prefix.
///
/// Without this, every deny-log rule would differ from what we render on such a node: the
/// writer would replace it on every resync and `audit` would report it as drift.
pub fn normalize_save_line(line: &str) -> Cow<'_, str> {
    const NFLOG_PREFIX_1_8_7: &str = " --nflog-prefix  ";
    let line = line.trim_end();
    if line.contains(NFLOG_PREFIX_1_8_7) {
        Cow::Owned(line.replace(NFLOG_PREFIX_1_8_7, " --nflog-prefix "))
    } else {
        Cow::Borrowed(line)
    }
}

/// A rule line without its `[packets:bytes] ` prefix, when it has one.
fn strip_counters(raw: &[u8]) -> &[u8] {
    if raw.first() != Some(&b'[') {
        return raw;
    }
    match raw.windows(2).position(|w| w == b"] ") {
        Some(end) => &raw[end + 2..],
        None => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<String> {
        lines(text.as_bytes())
            .map(|l| format!("{:?}", l.kind()))
            .collect()
    }

    #[test]
    fn every_line_kind_of_a_save_and_a_restore_script() {
        let text = "# Generated by iptables-save v1.8.9\n*filter\n:INPUT ACCEPT [12:345]\n\
                    :cali-x - [0:0]\n[3:180] -A cali-x -j ACCEPT\n-I FORWARD 2 -j cali-x\n\
                    -I FORWARD -j cali-x\n-A cali-x\n-F cali-x\nCOMMIT\n";
        assert_eq!(
            kinds(text),
            [
                "Comment(\" Generated by iptables-save v1.8.9\")",
                "Table(\"filter\")",
                "Chain { name: \"INPUT\", policy: Some(\"ACCEPT\") }",
                "Chain { name: \"cali-x\", policy: None }",
                "Append { chain: \"cali-x\", body: \"-j ACCEPT\" }",
                "Insert { chain: \"FORWARD\", position: 2, body: \"-j cali-x\" }",
                "Insert { chain: \"FORWARD\", position: 1, body: \"-j cali-x\" }",
                "Append { chain: \"cali-x\", body: \"\" }",
                "Other",
                "Commit",
                "Other",
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_read_lossily_and_flagged() {
        let mut text = b"-A FORWARD -m comment --comment \"".to_vec();
        text.extend_from_slice(&[0xff, 0xfe]);
        text.extend_from_slice(b"\" -j DROP\n-A FORWARD -j ACCEPT");
        let read: Vec<Line> = lines(&text).collect();
        assert!(read[0].lossy);
        assert!(matches!(
            read[0].kind(),
            SaveLine::Append {
                chain: "FORWARD",
                ..
            }
        ));
        assert!(!read[1].lossy);
    }

    #[test]
    fn iptables_1_8_7_quirks_read_as_current_releases_print_them() {
        let old = "-A x -j NFLOG --nflog-prefix  p --nflog-group 1 \n";
        let read: Vec<Line> = lines(old.as_bytes()).collect();
        assert_eq!(
            read[0].text,
            "-A x -j NFLOG --nflog-prefix p --nflog-group 1"
        );
    }
}
