//! The one gate between text and restore scripts. Every name the renderer embeds in a rule or
//! a chain declaration passes through [`chain_token`] (chain names, jump targets) or [`token`]
//! (interface names, bridge ports), which let a safe token through unchanged and replace
//! anything else by a hash of it; comments are reduced to a safe character set by `sanitize_comment` and
//! quoted as `iptables-save` prints them. [`restore_line_problem`] checks a finished line the
//! way `iptables-restore` splits it; the writer and `compile` refuse a line it finds fault with,
//! so no line of a restore script can be built from unchecked text.
//!
//! Why escape rather than refuse in the renderer: validation already rejects every name the
//! API server would (`model::validate`), and interface names are checked by the resolvers,
//! so a name that gets here unsafe is a bug or a hostile resolver answer. Hashing it keeps the
//! script well-formed and the rule harmless: an escaped interface name matches no interface
//! (traffic meets the dispatch chains' "Unknown interface" drop: fail closed), an escaped
//! chain name is used consistently by its declaration and its jumps.

use std::borrow::Cow;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Characters of a token the renderer may write unquoted: what chain names (`cali-pi-knp/ns/
/// name`, `cali-pri-kns.ns`), set names (`cali40s:` + base64url), interface names and
/// wildcards (`cali+`), addresses (`fd00::/64`), port lists (`80,443`, `1000:2000`), marks
/// (`0x10000/0x10000`), negation (`!`) and counters (`[0:0]`) need; nothing iptables-restore
/// treats specially (quotes, backslash, `#`, whitespace) and nothing outside ASCII.
pub fn is_safe_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.:/+,!=@%[]".contains(c)
}

/// A chain name: `name` when it is a safe token, else `cali-_` + 22 hash characters (through
/// `length_limited_name`), so an escaped chain is still one of ours (the writer owns every
/// `cali-` chain and deletes it when no longer wanted) and fits iptables' 28 characters.
pub fn chain_token(name: &str) -> Cow<'_, str> {
    if is_safe_token(name) {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(super::length_limited_name(
            super::CHAIN_PREFIX,
            name,
            super::MAX_CHAIN_NAME_LEN,
        ))
    }
}

/// A non-empty word of safe characters.
pub fn is_safe_token(text: &str) -> bool {
    !text.is_empty() && text.chars().all(is_safe_char)
}

/// `text` when it is a safe token, else `_` + 16 base64url characters of its SHA-256: a
/// token that cannot be mistaken for a real name of ours (those never start with `_`) and is
/// the same for the same text, so a declaration and the jumps to it still agree.
pub fn token(text: &str) -> Cow<'_, str> {
    if is_safe_token(text) {
        Cow::Borrowed(text)
    } else {
        let mut hash = URL_SAFE_NO_PAD.encode(Sha256::digest(text.as_bytes()));
        hash.truncate(16);
        Cow::Owned(format!("_{hash}"))
    }
}

/// What is wrong with one line of restore input, or `None` when every word is safe: the line
/// is printable ASCII, its words (split at spaces, a double-quoted word taken whole) are safe
/// tokens, a quoted word holds no quote or backslash, and the line starts with an option
/// (`-A`, `-I`, ...) or a chain declaration (`:name`), or is a table header or `COMMIT`.
pub fn restore_line_problem(line: &str) -> Option<String> {
    if line.is_empty() {
        return Some("the line is empty".to_string());
    }
    if let Some(c) = line.chars().find(|&c| c != ' ' && !c.is_ascii_graphic()) {
        return Some(format!("it holds the character {c:?}"));
    }
    if line == "COMMIT" || (line.starts_with('*') && is_safe_token(&line[1..])) {
        return None;
    }
    let mut rest = line;
    let mut first = true;
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('"') {
            let Some(end) = quoted.find('"') else {
                return Some("a quote is not closed".to_string());
            };
            if quoted[..end].contains('\\') {
                return Some("a quoted word holds a backslash".to_string());
            }
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            let word = &rest[..end];
            if !is_safe_token(word) {
                return Some(format!("the word {:?} is not a safe token", shorten(word)));
            }
            if first && !word.starts_with('-') && !word.starts_with(':') {
                return Some(format!("the line starts with {:?}", shorten(word)));
            }
            rest = &rest[end..];
        }
        first = false;
        match rest.strip_prefix(' ') {
            Some(next) if !next.is_empty() && !next.starts_with(' ') => rest = next,
            Some(_) => return Some("two spaces in a row, or a trailing space".to_string()),
            None if rest.is_empty() => {}
            None => return Some("words must be separated by one space".to_string()),
        }
    }
    None
}

/// What is wrong with one line of `ipset restore` input, or `None`: printable ASCII words
/// separated by single spaces, every word a safe token, and the line a command we write.
pub fn ipset_line_problem(line: &str) -> Option<String> {
    let mut words = line.split(' ');
    if !matches!(
        words.next(),
        Some("create" | "add" | "del" | "destroy" | "swap" | "flush")
    ) {
        return Some("the line is not an ipset command we write".to_string());
    }
    line.split(' ')
        .find(|word| !is_safe_token(word))
        .map(|word| format!("the word {:?} is not a safe token", shorten(word)))
}

/// The first line of `script` that `problem` finds fault with: its number (1-based), the
/// line (escaped and shortened) and the fault.
pub fn script_problem(script: &str, problem: fn(&str) -> Option<String>) -> Option<String> {
    script.lines().enumerate().find_map(|(index, line)| {
        problem(line).map(|why| format!("line {} {:?}: {why}", index + 1, shorten(line)))
    })
}

fn shorten(text: &str) -> String {
    const SHOWN: usize = 120;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// `text` as `iptables-save` prints an option's string value (xtables' `save_string`):
/// bare when it is only letters, digits, `_` and `-`, else double-quoted. Callers pass
/// sanitised text, which holds no quote or backslash to escape.
pub fn save_string(text: &str) -> Cow<'_, str> {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("\"{text}\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_tokens_pass_and_others_are_hashed() {
        for ok in [
            "cali-pi-knp/app/web",
            "cali40s:Ljkr4T5u9Q3ffN5vOEZypKS",
            "cali+",
            "fd00::/64",
            "0x10000/0x10000",
        ] {
            assert_eq!(token(ok), ok);
        }
        for bad in ["", "x\n-F\n#", "a b", "a\0b", "a\"b", "caf\u{e9}", "#x"] {
            let t = token(bad);
            assert!(
                t.starts_with('_') && t.len() == 17 && is_safe_token(&t),
                "{t}"
            );
        }
        assert_ne!(token("a b"), token("a  b"));
        let chain = chain_token("cali-tw-a\nb");
        assert!(chain.starts_with("cali-_") && chain.len() == 28, "{chain}");
        assert_eq!(chain_token("cali-tw-ok"), "cali-tw-ok");
        assert_eq!(token("a b"), token("a b"));
    }

    #[test]
    fn lines_are_checked_as_restore_splits_them() {
        for ok in [
            "*filter",
            "COMMIT",
            ":cali-FORWARD - [0:0]",
            "-A cali-x -m comment --comment \"cali:abc\" -j ACCEPT",
            "-I FORWARD 1 -m comment --comment \"Unknown interface\" -j DROP",
            "-D cali-x 3",
        ] {
            assert_eq!(restore_line_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "-A x\n-F",
            "-A x -j \"y",
            "-A x -m comment --comment \"a\\\"b\" -j ACCEPT",
            "-A x#y",
            "-A x  -j ACCEPT",
            "-A x -j ACCEPT ",
            "# comment",
            "COMMIT now",
            "-A x -i caf\u{e9}",
            "-A x -i a\0b",
            "-A x -m comment --comment \"a\"b",
        ] {
            assert!(restore_line_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn ipset_lines_and_scripts_are_checked() {
        assert_eq!(
            ipset_line_problem("create cali40s:abc hash:net family inet maxelem 1048576"),
            None
        );
        assert_eq!(ipset_line_problem("add cali40n:abc 10.0.0.1,tcp:80"), None);
        assert!(ipset_line_problem("add cali40s:abc 10.0.0.1\n").is_some());
        assert!(ipset_line_problem("add  x").is_some());
        assert!(ipset_line_problem("-exist x").is_some());
        let problem = script_problem("*filter\n-A x\"y\nCOMMIT\n", restore_line_problem)
            .expect("line 2 is unsafe");
        assert!(problem.starts_with("line 2 "), "{problem}");
        assert_eq!(
            script_problem("*filter\nCOMMIT\n", restore_line_problem),
            None
        );
    }

    #[test]
    fn strings_are_quoted_as_iptables_save_does() {
        assert_eq!(save_string("abc-1_2"), "abc-1_2");
        assert_eq!(save_string("cali:x"), "\"cali:x\"");
        assert_eq!(save_string("a b"), "\"a b\"");
        assert_eq!(save_string(""), "\"\"");
    }
}
