//! Running external commands, optionally inside a network namespace (tests, benchmarks).

use std::process::Command;

/// How to start an external program: directly, or behind a prefix such as
/// `["ip", "netns", "exec", "<ns>"]`.
#[derive(Clone, Debug, Default)]
pub struct Exec {
    pub prefix: Vec<String>,
}

impl Exec {
    /// A `Command` that runs `program` (behind the prefix, if any).
    pub fn command(&self, program: &str) -> Command {
        match self.prefix.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(program);
                cmd
            }
        }
    }
}
