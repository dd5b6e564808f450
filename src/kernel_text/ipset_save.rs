//! Lines of `ipset save` output and `ipset restore` input: `create NAME TYPE OPTIONS...` and
//! `add NAME ENTRY [OPTIONS...]`; every other line (`flush`, `swap`, `destroy`, blank) is
//! [`SetLine::Other`]. Entries are given as printed: what an entry means depends on the
//! set's type, which only the consumer knows.

use std::str::SplitWhitespace;

/// One line, classified.
#[derive(Clone, Debug)]
pub enum SetLine<'a> {
    /// `create NAME TYPE OPTIONS...`: `options` are the words after the type.
    Create {
        name: &'a str,
        set_type: Option<&'a str>,
        options: Options<'a>,
    },
    /// `add NAME ENTRY [MORE...]`: `trailing` says words follow the entry (`timeout 5`,
    /// `comment ...`: nothing a set of ours holds).
    Add {
        name: &'a str,
        entry: Option<&'a str>,
        trailing: bool,
    },
    Other,
}

/// The words of a `create` line after the set type (`family inet hashsize 1024 ...`).
#[derive(Clone, Debug)]
pub struct Options<'a>(SplitWhitespace<'a>);

impl<'a> Options<'a> {
    /// The value of `family` (`inet`, `inet6`), if the line gives one.
    pub fn family(&self) -> Option<&'a str> {
        self.0.clone().skip_while(|w| *w != "family").nth(1)
    }
}

impl<'a> Iterator for Options<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        self.0.next()
    }
}

pub fn classify(line: &str) -> SetLine<'_> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("create"), Some(name)) => SetLine::Create {
            name,
            set_type: words.next(),
            options: Options(words),
        },
        (Some("add"), Some(name)) => {
            let entry = words.next();
            SetLine::Add {
                name,
                entry,
                trailing: words.next().is_some(),
            }
        }
        _ => SetLine::Other,
    }
}

/// Every line of a text, classified.
pub fn lines(text: &str) -> impl Iterator<Item = SetLine<'_>> {
    text.lines().map(classify)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_add_lines_with_their_options() {
        let text = "create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576\n\
                    add cali40s:a 10.0.0.1\nadd cali40s:a 10.0.0.2 timeout 5\nflush x\n\
                    create y hash:ip,port\n";
        let read: Vec<SetLine> = lines(text).collect();
        match &read[0] {
            SetLine::Create {
                name,
                set_type,
                options,
            } => {
                assert_eq!(*name, "cali40s:a");
                assert_eq!(*set_type, Some("hash:net"));
                assert_eq!(options.family(), Some("inet"));
                assert_eq!(options.clone().count(), 6);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read[1],
            SetLine::Add {
                entry: Some("10.0.0.1"),
                trailing: false,
                ..
            }
        ));
        assert!(matches!(read[2], SetLine::Add { trailing: true, .. }));
        assert!(matches!(read[3], SetLine::Other));
        assert!(matches!(&read[4], SetLine::Create { options, .. } if options.family().is_none()));
    }
}
