//! Bounds on manifest text, checked before the YAML parser sees it, and the text handling
//! around them (byte-order mark, UTF-8, message length). Pure.
//!
//! - Size: a manifest file is read up to [`MAX_MANIFEST_BYTES`] (64 MiB). The API server
//!   takes at most 3 MiB per request, so one object is far smaller; a file is allowed more
//!   because `kubectl get -o yaml` lists of a whole cluster's pods are legitimately large
//!   (64 MiB is about 10k pods). Parsing costs several times the text in memory, so the
//!   bound is what keeps one file from taking the node's memory.
//! - Nesting: a document may nest collections at most [`MAX_NESTING`] (128) deep. That is the
//!   YAML deserializer's own recursion limit, so no document that could load is refused; but
//!   the parser reads a whole document before the deserializer counts, and libyaml's scanner
//!   spends time proportional to the flow depth on every token, so a 200 KB file of 100k
//!   nested brackets took more than 20 s. The check here is a linear scan that follows
//!   quotes, comments and block scalars well enough never to see less nesting than the
//!   parser would (it may see more only inside odd scalars, such as a quoted string holding
//!   128 unbalanced brackets after an anchor).
//!
//! Hand-written rather than a second YAML parser: a parser is exactly what must not run on
//! this input, and the scan needs only the few YAML rules that decide where brackets count.

use std::borrow::Cow;

/// The largest manifest file read (see the module comment).
pub const MAX_MANIFEST_BYTES: usize = 64 << 20;

/// The deepest nesting of collections in one document (see the module comment).
pub const MAX_NESTING: usize = 128;

/// Longest message kept for one broken document; the rest is cut with a note of the length.
pub const MAX_MESSAGE_CHARS: usize = 400;

/// Most problems reported one by one for a file; the rest are counted in one line (a file of
/// 400k broken documents would otherwise log 400k lines each time it is read).
pub const MAX_REPORTED_PER_FILE: usize = 100;

const BOM: char = '\u{feff}';

/// `bytes` as text: a UTF-8 byte-order mark is dropped (editors on Windows write one, and
/// the YAML spec allows it); anything that is not UTF-8 is refused, naming where.
pub fn decode(bytes: &[u8]) -> Result<&str, String> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.strip_prefix(BOM).unwrap_or(text)),
        Err(err) => {
            let at = err.valid_up_to();
            let before = &bytes[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let line_start = before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            let column = String::from_utf8_lossy(&before[line_start..])
                .chars()
                .count()
                + 1;
            Err(format!(
                "not UTF-8 text: byte 0x{:02x} at line {line} column {column} (byte {at}) is not \
                 valid UTF-8; manifests must be UTF-8, the file is skipped",
                bytes[at]
            ))
        }
    }
}

/// Drops a leading byte-order mark.
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix(BOM).unwrap_or(text)
}

/// `message` as one log line: control characters escaped (a parser error may quote a value
/// holding a newline, which would forge a second line), cut to [`MAX_MESSAGE_CHARS`]
/// characters (it may quote a value whole).
pub fn brief(message: String) -> String {
    let message = if message.contains(char::is_control) {
        message
            .chars()
            .flat_map(|c| {
                let escaped: Vec<char> = if c.is_control() {
                    c.escape_default().collect()
                } else {
                    vec![c]
                };
                escaped
            })
            .collect()
    } else {
        message
    };
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!(
            "{}... ({} characters)",
            &message[..cut],
            message.chars().count()
        ),
        None => message,
    }
}

/// Adds `offset` to every `line N` in a parser message: the parser numbers lines from the
/// start of the piece it read, messages should point into the file.
pub fn shift_lines(message: &str, offset: usize) -> Cow<'_, str> {
    const WORD: &str = "line ";
    if offset == 0 || !message.contains(WORD) {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 8);
    let mut rest = message;
    while let Some(at) = rest.find(WORD) {
        let (head, tail) = rest.split_at(at + WORD.len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        match tail[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&(n + offset).to_string()),
            Err(_) => out.push_str(&tail[..digits]),
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// What the scanner is inside of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Single,
    Double,
}

/// A block scalar (`|`, `>`) being skipped: its content is text, not structure.
#[derive(Clone, Copy)]
enum Block {
    None,
    /// Header seen; content lines must be indented more than `parent`.
    Header {
        parent: usize,
    },
    /// Content indented at least `indent`.
    Content {
        indent: usize,
    },
}

/// The nesting depth of collections in `text` is more than [`MAX_NESTING`]: what the scan
/// found and where. Linear in the text.
pub fn nesting_problem(text: &str) -> Option<String> {
    let mut flow: usize = 0;
    let mut quote = Quote::None;
    let mut block = Block::None;
    for (index, line) in text.split('\n').enumerate() {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|&&b| b == b' ').count();
        let blank = bytes[indent..]
            .iter()
            .all(|&b| b == b' ' || b == b'\t' || b == b'\r');
        match block {
            Block::Header { parent } if quote == Quote::None => {
                if blank {
                    continue;
                }
                if indent > parent {
                    block = Block::Content { indent };
                    continue;
                }
                block = Block::None;
            }
            Block::Content { indent: content } if quote == Quote::None => {
                if blank || indent >= content {
                    continue;
                }
                block = Block::None;
            }
            _ => {}
        }
        let mut at = indent;
        // At a line start (block context), leading `- `, `? `, `: ` indicators each open a
        // collection; the column after them is where the node's content starts.
        let mut depth_here = 0;
        let mut node_column = indent;
        let mut indicator_column = indent;
        let mut scalar_start = quote == Quote::None;
        if quote == Quote::None && flow == 0 {
            while at < bytes.len()
                && matches!(bytes[at], b'-' | b'?' | b':')
                && bytes.get(at + 1).is_none_or(|&b| b == b' ' || b == b'\t')
            {
                depth_here += 1;
                indicator_column = at;
                at += 1;
                while at < bytes.len() && (bytes[at] == b' ' || bytes[at] == b'\t') {
                    at += 1;
                }
                node_column = at;
            }
        }
        if flow + depth_here > MAX_NESTING {
            return Some(too_deep(index));
        }
        while at < bytes.len() {
            let b = bytes[at];
            match quote {
                Quote::Double => {
                    match b {
                        b'\\' => at += 1,
                        b'"' => quote = Quote::None,
                        _ => {}
                    }
                    at += 1;
                    continue;
                }
                Quote::Single => {
                    if b == b'\'' {
                        if bytes.get(at + 1) == Some(&b'\'') {
                            at += 1;
                        } else {
                            quote = Quote::None;
                        }
                    }
                    at += 1;
                    continue;
                }
                Quote::None => {}
            }
            let after_space = at == 0 || matches!(bytes[at - 1], b' ' | b'\t');
            match b {
                b' ' | b'\t' | b'\r' => {}
                b'#' if after_space => break,
                b'"' | b'\'' if scalar_start => {
                    quote = if b == b'"' {
                        Quote::Double
                    } else {
                        Quote::Single
                    };
                    scalar_start = false;
                }
                b'[' | b'{' if scalar_start || flow > 0 => {
                    flow += 1;
                    if flow + depth_here > MAX_NESTING {
                        return Some(too_deep(index));
                    }
                    scalar_start = true;
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    scalar_start = false;
                }
                b',' if flow > 0 => scalar_start = true,
                b':' if flow > 0
                    || bytes
                        .get(at + 1)
                        .is_none_or(|&n| matches!(n, b' ' | b'\t' | b'\r')) =>
                {
                    scalar_start = true;
                }
                b'-' | b'?'
                    if scalar_start
                        && bytes
                            .get(at + 1)
                            .is_none_or(|&n| matches!(n, b' ' | b'\t' | b'\r')) => {}
                b'&' | b'!' if scalar_start => {
                    // An anchor or a tag: the node itself comes after it.
                    while at + 1 < bytes.len() && !matches!(bytes[at + 1], b' ' | b'\t') {
                        at += 1;
                    }
                }
                b'|' | b'>' if scalar_start && flow == 0 => {
                    // Content must be indented more than the node holding the scalar: the
                    // key (`key: |`, `- key: |`) or the sequence entry (`- |`).
                    let parent = if at == node_column && depth_here > 0 {
                        indicator_column
                    } else {
                        node_column
                    };
                    block = Block::Header { parent };
                    break;
                }
                _ => scalar_start = false,
            }
            at += 1;
        }
    }
    None
}

fn too_deep(index: usize) -> String {
    format!(
        "collections nest more than {MAX_NESTING} deep by line {}; refused before parsing \
         (no manifest nests that deep, and parsing such nesting is slow)",
        index + 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_drops_a_bom_and_names_where_utf8_breaks() {
        assert_eq!(decode(b"\xef\xbb\xbfa: 1\n"), Ok("a: 1\n"));
        assert_eq!(decode(b"a: 1\n"), Ok("a: 1\n"));
        let err = decode(b"a: 1\nb: \xc3\xa9\xff\n").unwrap_err();
        assert!(err.contains("0xff at line 2 column 5"), "{err}");
    }

    #[test]
    fn brief_cuts_long_messages() {
        assert_eq!(brief("short".into()), "short");
        let long = brief("é".repeat(1000));
        assert!(long.ends_with("... (1000 characters)"), "{long}");
        assert!(long.len() < 1000);
        assert_eq!(brief("a\nb\0".into()), "a\\nb\\u{0}");
    }

    #[test]
    fn line_numbers_are_shifted() {
        assert_eq!(
            shift_lines("bad at line 3 column 1, while parsing at line 2", 10),
            "bad at line 13 column 1, while parsing at line 12"
        );
        assert_eq!(shift_lines("no position", 5), "no position");
        assert_eq!(shift_lines("line x", 5), "line x");
    }

    fn deep(text: &str) -> bool {
        nesting_problem(text).is_some()
    }

    #[test]
    fn flow_and_compact_block_nesting_are_counted() {
        let n = MAX_NESTING;
        assert!(!deep(&format!("{}{}", "[".repeat(n), "]".repeat(n))));
        assert!(deep(&format!("{}{}", "[".repeat(n + 1), "]".repeat(n + 1))));
        assert!(deep(&format!("a: {}", "{\"a\": ".repeat(n + 1))));
        assert!(deep(&format!("{}x", "- ".repeat(n + 1))));
        assert!(!deep(&format!("{}x", "- ".repeat(n))));
        // Across lines.
        assert!(deep(&"[\n".repeat(n + 1)));
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_count() {
        let many = "[".repeat(MAX_NESTING + 1);
        for text in [
            format!("a: \"{many}\"\n"),
            format!("a: '{many}'\n"),
            format!("a: 'it''s {many}'\n"),
            format!("a: x{many}\n"),
            format!("a: 1 # {many}\n"),
            format!("a: |\n  {many}\n  {many}\n\n  x\nb: 1\n"),
            format!("- key: >-\n    {many}\n- 2\n"),
            format!("args:\n  - |\n    {many}\n  - x\n"),
            format!("a: \"multi\n  line {many}\"\n"),
            format!("[\"{many}\", '{many}']\n"),
        ] {
            assert!(!deep(&text), "{text:?}");
        }
    }

    #[test]
    fn quotes_that_yaml_reads_as_plain_text_do_not_hide_nesting() {
        let many = "[".repeat(MAX_NESTING + 1);
        for text in [
            // The quote is in the middle of a plain scalar: YAML ends the scalar at the line.
            format!("a: x \"\nb: {many}\n"),
            format!("x: [a \"b]\ny: {many}\n"),
            format!("a: don't\nb: {many}\n"),
            // A block scalar ends where a line is indented less than its content.
            format!("a: |\n    text \"\n  \nb: {many}\n"),
            format!("- a: |\n  b: {many}\n"),
        ] {
            assert!(deep(&text), "{text:?}");
        }
    }
}
