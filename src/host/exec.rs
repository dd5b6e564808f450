//! How the dataplane starts external programs (`ipset`, `iptables-restore`, ...): the agent
//! runs them directly; tests and benchmarks put a prefix in front, such as
//! `ip netns exec <ns>`, so that the same code programs a throwaway network namespace.

use std::process::Command;

/// How to run commands: an optional prefix such as `["ip", "netns", "exec", "ns1"]` (tests,
/// benchmarks), empty in the agent.
#[derive(Clone, Debug, Default)]
pub struct Exec {
    pub prefix: Vec<String>,
}

impl Exec {
    /// Runs commands inside network namespace `name` (`ip netns exec <name> ...`).
    pub fn in_netns(name: &str) -> Exec {
        Exec {
            prefix: vec!["ip".into(), "netns".into(), "exec".into(), name.into()],
        }
    }

    /// A `Command` for `program`, behind the prefix when there is one. Arguments, stdin and
    /// the rest are left to the caller.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn empty_prefix_runs_the_program_itself() {
        let mut cmd = Exec::default().command("ipset");
        cmd.arg("save");
        assert_eq!(argv(&cmd), ["ipset", "save"]);
    }

    #[test]
    fn prefix_goes_in_front() {
        let mut cmd = Exec::in_netns("ns1").command("ipset");
        cmd.arg("save");
        assert_eq!(argv(&cmd), ["ip", "netns", "exec", "ns1", "ipset", "save"]);
    }
}
