//! What the kernel accepts as a network interface name, and as a prefix of pod interfaces
//! (felix's `InterfacePrefix` list). Pure. Rules embed both (`-i cali+`, `cali-tw-<name>`),
//! so both are checked before they reach a rule: by the configuration's value parsers when a
//! flag is read, and by every resolver for every name it produces (`iface_naming`).
//! A name that does not fit is refused, never shortened: a shortened name would point policy
//! at another interface, or at none.

use std::fmt;

/// Longest interface name the kernel accepts: `IFNAMSIZ` (16) minus the terminating NUL.
pub const MAX_IFACE_NAME_LEN: usize = 15;

/// Longest prefix in an interface prefix list: at least one character must follow it, or the
/// prefix could not tell a workload interface from anything else.
pub const MAX_PREFIX_LEN: usize = MAX_IFACE_NAME_LEN - 1;

/// Why a string cannot be (part of) an interface name, beyond its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    /// `.` and `..` would clash with directory entries under `/sys/class/net`.
    DotName,
    Slash,
    /// The kernel reserves `:` for interface aliases (`eth0:1`).
    Colon,
    Whitespace,
    /// C code would read the name as ending at the NUL.
    Nul,
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameProblem::Empty => "it is empty",
            NameProblem::DotName => "\".\" and \"..\" are reserved",
            NameProblem::Slash => "it contains '/'",
            NameProblem::Colon => "it contains ':', which the kernel reserves for aliases",
            NameProblem::Whitespace => "it contains whitespace",
            NameProblem::Nul => "it contains a NUL byte",
        })
    }
}

/// An interface name the kernel would refuse (`dev_valid_name`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadName {
    #[error(
        "interface name {name:?} is {len} bytes long; the kernel allows at most \
         {MAX_IFACE_NAME_LEN}"
    )]
    TooLong { name: String, len: usize },
    #[error("interface name {name:?} is invalid: {problem}")]
    Invalid { name: String, problem: NameProblem },
}

/// An interface prefix list that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixListError {
    #[error("interface prefix list {list:?} contains no prefix")]
    Empty { list: String },
    #[error(
        "interface prefix {prefix:?} is {len} bytes long; at most {MAX_PREFIX_LEN} leave room \
         for a name after it"
    )]
    TooLong { prefix: String, len: usize },
    #[error("interface prefix {prefix:?} is invalid: {problem}")]
    Invalid {
        prefix: String,
        problem: NameProblem,
    },
}

/// Checks `name` against the kernel's rules (`dev_valid_name`). Never shortens it.
pub fn check_interface_name(name: &str) -> Result<(), BadName> {
    let invalid = |problem| BadName::Invalid {
        name: name.to_string(),
        problem,
    };
    if name.is_empty() {
        return Err(invalid(NameProblem::Empty));
    }
    if name.len() > MAX_IFACE_NAME_LEN {
        return Err(BadName::TooLong {
            name: name.to_string(),
            len: name.len(),
        });
    }
    if name == "." || name == ".." {
        return Err(invalid(NameProblem::DotName));
    }
    match forbidden_char_problem(name) {
        Some(problem) => Err(invalid(problem)),
        None => Ok(()),
    }
}

/// The first character that may not appear anywhere in an interface name.
pub fn forbidden_char_problem(s: &str) -> Option<NameProblem> {
    s.chars().find_map(|c| match c {
        '/' => Some(NameProblem::Slash),
        ':' => Some(NameProblem::Colon),
        '\0' => Some(NameProblem::Nul),
        c if c.is_whitespace() => Some(NameProblem::Whitespace),
        _ => None,
    })
}

/// Parses felix's `InterfacePrefix` style list (`"cali,tap"`): entries are trimmed, empty
/// entries dropped, and at least one prefix must remain.
pub fn parse_prefix_list(list: &str) -> Result<Vec<String>, PrefixListError> {
    let prefixes: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|prefix| !prefix.is_empty())
        .map(str::to_string)
        .collect();
    if prefixes.is_empty() {
        return Err(PrefixListError::Empty {
            list: list.to_string(),
        });
    }
    for prefix in &prefixes {
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(PrefixListError::TooLong {
                prefix: prefix.clone(),
                len: prefix.len(),
            });
        }
        if let Some(problem) = forbidden_char_problem(prefix) {
            return Err(PrefixListError::Invalid {
                prefix: prefix.clone(),
                problem,
            });
        }
    }
    Ok(prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifteen_byte_name_is_valid() {
        assert_eq!(check_interface_name("cali82111e10a96"), Ok(()));
    }

    #[test]
    fn sixteen_byte_name_is_too_long_and_not_truncated() {
        let err = check_interface_name("veth-82111e10a96").unwrap_err();
        assert_eq!(
            err,
            BadName::TooLong {
                name: "veth-82111e10a96".to_string(),
                len: 16,
            }
        );
        assert!(err.to_string().contains("\"veth-82111e10a96\" is 16 bytes"));
    }

    #[test]
    fn length_is_counted_in_bytes() {
        // 8 two-byte characters: 8 characters but 16 bytes.
        let err = check_interface_name("éééééééé").unwrap_err();
        assert!(matches!(err, BadName::TooLong { len: 16, .. }));
    }

    #[test]
    fn empty_slash_dot_names_whitespace_colon_and_nul_are_invalid() {
        for (name, expected) in [
            ("", NameProblem::Empty),
            ("eth/0", NameProblem::Slash),
            (".", NameProblem::DotName),
            ("..", NameProblem::DotName),
            ("eth 0", NameProblem::Whitespace),
            ("eth\t0", NameProblem::Whitespace),
            ("eth0:1", NameProblem::Colon),
            ("eth\0x", NameProblem::Nul),
        ] {
            match check_interface_name(name) {
                Err(BadName::Invalid { problem, .. }) => {
                    assert_eq!(problem, expected, "for {name:?}")
                }
                other => panic!("{name:?} gave {other:?}"),
            }
        }
        assert_eq!(check_interface_name("..."), Ok(()));
    }

    #[test]
    fn prefix_list_trims_spaces_and_drops_empty_entries() {
        assert_eq!(
            parse_prefix_list("  eni , veth,,foo , ").unwrap(),
            vec!["eni", "veth", "foo"]
        );
    }

    #[test]
    fn prefix_list_without_prefixes_is_rejected() {
        for list in ["", "   ", ",", " , ,"] {
            assert_eq!(
                parse_prefix_list(list),
                Err(PrefixListError::Empty {
                    list: list.to_string()
                })
            );
        }
    }

    #[test]
    fn prefix_of_fourteen_bytes_is_the_longest_accepted() {
        assert!(parse_prefix_list("abcdefghijklmn").is_ok());
        assert_eq!(
            parse_prefix_list("cali,abcdefghijklmno"),
            Err(PrefixListError::TooLong {
                prefix: "abcdefghijklmno".to_string(),
                len: 15,
            })
        );
    }

    #[test]
    fn prefix_with_slash_or_inner_whitespace_is_rejected() {
        assert!(matches!(
            parse_prefix_list("cali,ta/p"),
            Err(PrefixListError::Invalid {
                problem: NameProblem::Slash,
                ..
            })
        ));
        assert!(matches!(
            parse_prefix_list("ca li"),
            Err(PrefixListError::Invalid {
                problem: NameProblem::Whitespace,
                ..
            })
        ));
    }

    mod no_panic {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn accepted_names_fit_the_kernel_limit(name in "\\PC{0,20}") {
                if check_interface_name(&name).is_ok() {
                    prop_assert!(!name.is_empty() && name.len() <= MAX_IFACE_NAME_LEN);
                }
            }

            #[test]
            fn prefix_lists_never_panic(list in "[a-z ,/:\\-é]{0,40}") {
                if let Ok(prefixes) = parse_prefix_list(&list) {
                    prop_assert!(!prefixes.is_empty());
                    prop_assert!(prefixes.iter().all(|p| !p.is_empty() && p.len() <= MAX_PREFIX_LEN));
                }
            }
        }
    }
}
