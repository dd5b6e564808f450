//! The writer's model of one table (every chain with its rules, each rule's hash when it is
//! ours) and reading it from `iptables-save` output. Pure. What "ours" means is handed in as an
//! [`Ownership`]: the writer knows no chain or comment prefix of its own.

use std::collections::BTreeMap;

use anyhow::anyhow;

use crate::kernel_text;
use crate::kernel_text::iptables_save::SaveLine;

/// What the writer owns in a table: every chain whose name starts with `chain_prefix` (at
/// most `max_chain_len` characters), and in other chains the rules whose first comment is
/// `<rule_hash_prefix><hash>`. Given by whoever renders the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    pub chain_prefix: &'static str,
    pub rule_hash_prefix: &'static str,
    pub max_chain_len: usize,
}

impl Ownership {
    pub fn owns_chain(&self, name: &str) -> bool {
        name.starts_with(self.chain_prefix)
    }

    /// The hash of a rule's first comment when it is `<rule_hash_prefix><hash>` (quoted or
    /// not) and the hash is of our alphabet (base64url): `cali:` followed by anything else,
    /// bytes that are not UTF-8 included, is someone else's comment.
    pub fn rule_hash<'a>(&self, body: &'a str) -> Option<&'a str> {
        const OPT: &str = "--comment ";
        let start = body.find(OPT)? + OPT.len();
        let value = &body[start..];
        let value = value.strip_prefix('"').unwrap_or(value);
        let hash = value.strip_prefix(self.rule_hash_prefix)?;
        let end = hash
            .find(|c: char| c == '"' || c.is_whitespace())
            .unwrap_or(hash.len());
        let hash = &hash[..end];
        let ours = !hash.is_empty()
            && hash
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        ours.then_some(hash)
    }

    /// A rule as the kernel holds it, with its hash when it is ours.
    pub fn rule(&self, body: impl Into<String>) -> KernelRule {
        let body = body.into();
        KernelRule {
            hash: self.rule_hash(&body).map(str::to_string),
            body,
        }
    }
}

/// One rule as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRule {
    /// The hash of the `cali:<hash>` comment when that is the rule's first comment: the rule
    /// is ours. `None` for everyone else's rules.
    pub hash: Option<String>,
    /// Everything after `-A <chain> `, exactly as `iptables-save` prints it.
    pub body: String,
}

/// A table as far as the writer knows it: every chain in kernel order, and what of it is ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableState {
    pub ownership: Ownership,
    pub chains: BTreeMap<String, Vec<KernelRule>>,
}

impl TableState {
    pub fn empty(ownership: Ownership) -> TableState {
        TableState {
            ownership,
            chains: BTreeMap::new(),
        }
    }
}

/// Parses the `*<table>` section of `iptables-save` output (lines read by
/// [`kernel_text::iptables_save`]): `:NAME` lines declare chains, `-A NAME ...` lines are rules.
/// Output without the table (nft before the table exists) is an empty table. felix treats
/// the nft tools' "table is incompatible" warning as an error, and so do we.
///
/// One byte that is not UTF-8 in another program's rule must not stop us from reading our
/// own. Such a line is never ours (we write only safe ASCII), so it is carried opaquely: its
/// chain and body are kept in lossy form, only to keep positions and counts right. The
/// writer never writes a body back unless the rule carries our hash, and a rule that is not
/// UTF-8 is given none, even if a comment looks like ours.
pub fn parse_save(bytes: &[u8], table: &str, ownership: Ownership) -> anyhow::Result<TableState> {
    let mut state = TableState::empty(ownership);
    let mut inside = false;
    for line in kernel_text::iptables_save::lines(bytes) {
        match line.kind() {
            SaveLine::Comment(text) => {
                if text.contains("incompatible") {
                    return Err(anyhow!("save output says: {}", line.text));
                }
            }
            SaveLine::Table(name) => inside = name == table,
            _ if !inside => {}
            SaveLine::Commit => inside = false,
            SaveLine::Chain { name, .. } => {
                state.chains.entry(name.to_string()).or_default();
            }
            SaveLine::Append { chain, body } => {
                let rule = if line.lossy {
                    KernelRule {
                        hash: None,
                        body: body.to_string(),
                    }
                } else {
                    ownership.rule(body)
                };
                state
                    .chains
                    .entry(chain.to_string())
                    .or_default()
                    .push(rule);
            }
            SaveLine::Insert { .. } | SaveLine::Other => {}
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::agent::OWNERSHIP as OURS;

    #[test]
    fn iptables_1_8_7_save_quirks_read_as_current_releases_print_them() {
        // iptables 1.8.7 (Debian 11): two spaces after --nflog-prefix, a space after a rule
        // without a target.
        let body = "-m comment --comment \"cali:pg3uRULqBTW_Hg5S\" -m limit --limit 10/sec \
                    --limit-burst 20 -j NFLOG --nflog-prefix npa-pol-in-cali-tw-x --nflog-group 1 \
                    --nflog-size 128";
        let old = body.replace("--nflog-prefix ", "--nflog-prefix  ");
        let quoted = "-j NFLOG --nflog-prefix \" x\" --nflog-group 2";
        let save = format!(
            "*filter\n:cali-tw-x - [0:0]\n-A cali-tw-x {old}\n-A cali-tw-x -m comment --comment \"cali:abc\" \n-A cali-tw-x {quoted}\nCOMMIT\n"
        );
        let state = parse_save(save.as_bytes(), "filter", OURS).unwrap();
        let bodies: Vec<&str> = state.chains["cali-tw-x"]
            .iter()
            .map(|r| r.body.as_str())
            .collect();
        assert_eq!(bodies, [body, "-m comment --comment \"cali:abc\"", quoted]);
        assert_eq!(kernel_text::iptables_save::normalize_save_line(body), body);
    }

    #[test]
    fn garbage_in_the_counters_does_not_make_our_rule_foreign() {
        let save = b"*filter\n:FORWARD DROP [0:0]\n[5:300\xff\xff] -A FORWARD -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD\nCOMMIT\n";
        let state = parse_save(save, "filter", OURS).unwrap();
        let rule = &state.chains["FORWARD"][0];
        assert_eq!(rule.hash.as_deref(), Some("wUHhoiAYhphO9Mso"));
        assert_eq!(
            rule.body,
            "-m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD"
        );
    }

    #[test]
    fn a_hash_outside_our_alphabet_is_someone_elses_comment() {
        assert_eq!(
            OURS.rule_hash(r#"-m comment --comment "cali:wUHhoiAYhphO9M-_" -j ACCEPT"#),
            Some("wUHhoiAYhphO9M-_")
        );
        // What `String::from_utf8_lossy` makes of `cali:\xff`.
        assert_eq!(
            OURS.rule_hash("-m comment --comment \"cali:\u{fffd}\" -j ACCEPT"),
            None
        );
        assert_eq!(
            OURS.rule_hash(r#"-m comment --comment "cali:a.b" -j ACCEPT"#),
            None
        );
    }

    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 on Sat Nov 21 06:22:47 2026
*mangle
:PREROUTING ACCEPT [0:0]
-A PREROUTING -m comment --comment "cali:mangle" -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [10:600]
:OUTPUT ACCEPT [0:0]
:KUBE-TEST - [0:0]
:cali-FORWARD - [0:0]
:cali-empty - [0:0]
-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
-A FORWARD -j KUBE-TEST
-A FORWARD -m comment --comment "kube: cali:not-first" -m comment --comment "cali:second" -j ACCEPT
[3:180] -A FORWARD -m comment --comment cali:unquoted -j ACCEPT
-A KUBE-TEST -j RETURN
-A cali-FORWARD -i cali+ -m comment --comment "cali:abc" -j cali-from-wl-dispatch
-A cali-FORWARD
COMMIT
# Completed on Sat Nov 21 06:22:47 2026
"#;

    #[test]
    fn parses_chains_rules_and_hashes() {
        let t = parse_save(SAVE.as_bytes(), "filter", OURS).unwrap();
        assert_eq!(
            t.chains.keys().collect::<Vec<_>>(),
            [
                "FORWARD",
                "INPUT",
                "KUBE-TEST",
                "OUTPUT",
                "cali-FORWARD",
                "cali-empty"
            ]
        );
        let fwd = &t.chains["FORWARD"];
        assert_eq!(fwd.len(), 4);
        assert_eq!(fwd[0].hash.as_deref(), Some("wUHhoiAYhphO9Mso"));
        assert_eq!(
            fwd[0].body,
            "-m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD"
        );
        assert_eq!(fwd[1].hash, None);
        // Only the first comment counts.
        assert_eq!(fwd[2].hash, None);
        assert_eq!(fwd[3].hash.as_deref(), Some("unquoted"));
        assert_eq!(fwd[3].body, "-m comment --comment cali:unquoted -j ACCEPT");
        let ours = &t.chains["cali-FORWARD"];
        assert_eq!(ours[0].hash.as_deref(), Some("abc"));
        assert_eq!(ours[1], OURS.rule(""));
        assert!(t.chains["cali-empty"].is_empty());
        // The mangle section is not the filter table.
        assert!(!t.chains.contains_key("PREROUTING"));
    }

    #[test]
    fn missing_table_is_empty_and_incompatible_is_an_error() {
        assert_eq!(
            parse_save(b"", "filter", OURS).unwrap(),
            TableState::empty(OURS)
        );
        assert!(parse_save(
            b"# Table `filter' is incompatible, use 'nft' tool.\n",
            "filter",
            OURS
        )
        .is_err());
    }

    #[test]
    fn foreign_bytes_are_carried_and_ours_stay_exact() {
        let mut save = SAVE.as_bytes().to_vec();
        let at = save.windows(9).position(|w| w == b"-A KUBE-T").unwrap();
        let foreign: &[u8] = b"-A FORWARD -m comment --comment \"\xff\xfe caf\xc3\" -j ACCEPT\n\
-A FORWARD -m comment --comment \"cali:fake\" -m comment --comment \"\xff\" -j DROP\n\
-A \xffCHAIN -j ACCEPT\n";
        save.splice(at..at, foreign.iter().copied());
        let t = parse_save(&save, "filter", OURS).unwrap();
        let clean = parse_save(SAVE.as_bytes(), "filter", OURS).unwrap();
        let fwd = &t.chains["FORWARD"];
        assert_eq!(fwd.len(), 6);
        assert_eq!(fwd[..4], clean.chains["FORWARD"][..]);
        // Neither line is ours, not even the one whose first comment looks like our hash.
        assert!(fwd[4].hash.is_none() && fwd[5].hash.is_none());
        assert!(fwd[4].body.contains('\u{fffd}'));
        assert_eq!(t.chains["cali-FORWARD"], clean.chains["cali-FORWARD"]);
        assert_eq!(t.chains.len(), clean.chains.len() + 1);
    }

    #[test]
    fn hash_needs_the_prefix_and_content() {
        assert_eq!(OURS.rule_hash("-j ACCEPT"), None);
        assert_eq!(
            OURS.rule_hash("-m comment --comment \"cali:\" -j ACCEPT"),
            None
        );
        assert_eq!(
            OURS.rule_hash("-m comment --comment \"calico\" -j ACCEPT"),
            None
        );
        assert_eq!(
            OURS.rule_hash("-m comment --comment \"cali:x y\""),
            Some("x")
        );
        assert!(
            OURS.owns_chain("cali-pi-x")
                && !OURS.owns_chain("calico")
                && !OURS.owns_chain("FORWARD")
        );
    }
}
