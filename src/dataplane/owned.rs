//! What netpol-agent owns in a kernel, read back from `iptables-save` and `ipset save` text:
//! our chains with their rules, our rules in the kernel's own chains, our sets with their
//! members. Comparing it with the same reading of `compile` output tells whether a node has
//! converged (the agent tests and the e2e suite wait on it). Other programs' chains, rules
//! and sets are left out, so they never make two readings differ.

use std::collections::{BTreeMap, BTreeSet};

use super::iptables::Ownership;
use crate::ipsets::set_family;
use crate::model::IpFamily;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedState {
    /// Our sets with their members (as `ipset save` prints them).
    pub sets: BTreeMap<String, BTreeSet<String>>,
    /// Our chains with their rules, in order.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Our rules in kernel chains (FORWARD, INPUT, OUTPUT), in order.
    pub kernel: BTreeMap<String, Vec<String>>,
}

impl OwnedState {
    /// Adds what an `iptables-save` or `iptables-restore` text holds of ours: the chains
    /// `ownership` names ours, and our rules (those carrying our hash) in other chains.
    pub fn add_iptables(&mut self, text: &str, ownership: &Ownership) {
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split_whitespace().next().unwrap_or_default();
                if ownership.owns_chain(name) {
                    self.chains.entry(name.to_string()).or_default();
                }
                continue;
            }
            let inserted = line.starts_with("-I ");
            let Some(rest) = line
                .strip_prefix("-A ")
                .or_else(|| line.strip_prefix("-I "))
            else {
                continue;
            };
            let (chain, mut body) = rest.split_once(' ').unwrap_or((rest, ""));
            if inserted {
                // `-I CHAIN N body`: drop the position.
                body = body.split_once(' ').map_or("", |(_, b)| b);
            }
            if ownership.owns_chain(chain) {
                self.chains
                    .entry(chain.to_string())
                    .or_default()
                    .push(body.to_string());
            } else if ownership.rule_hash(body).is_some() {
                self.kernel
                    .entry(chain.to_string())
                    .or_default()
                    .push(body.to_string());
            }
        }
    }

    /// Adds our sets of one family (temporary ones too) from an `ipset save` or `ipset
    /// restore` text.
    pub fn add_ipsets(&mut self, text: &str, family: IpFamily) {
        let ours = |name: &str| set_family(name) == Some(family);
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("create"), Some(name), _) if ours(name) => {
                    self.sets.entry(name.to_string()).or_default();
                }
                (Some("add"), Some(name), Some(member)) if ours(name) => {
                    self.sets
                        .entry(name.to_string())
                        .or_default()
                        .insert(member.to_string());
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::OWNERSHIP;

    #[test]
    fn keeps_ours_and_ignores_the_rest() {
        let mut a = OwnedState::default();
        a.add_iptables(
            "*filter\n:FORWARD ACCEPT [0:0]\n:cali-FORWARD - [0:0]\n:KUBE-X - [0:0]\n\
             -A FORWARD -m comment --comment \"cali:abc\" -j cali-FORWARD\n\
             -A FORWARD -j KUBE-X\n-A cali-FORWARD -j ACCEPT\nCOMMIT\n",
            &OWNERSHIP,
        );
        a.add_ipsets(
            "create cali40s:x hash:net family inet\nadd cali40s:x 10.0.0.1\ncreate other hash:ip\nadd other 1.1.1.1\n",
            IpFamily::V4,
        );
        let mut b = OwnedState::default();
        b.add_iptables(
            ":cali-FORWARD - [0:0]\n-I FORWARD 1 -m comment --comment \"cali:abc\" -j cali-FORWARD\n\
             -A cali-FORWARD -j ACCEPT\n",
            &OWNERSHIP,
        );
        b.add_ipsets(
            "create cali40s:x hash:net\nadd cali40s:x 10.0.0.1\n",
            IpFamily::V4,
        );
        assert_eq!(a, b);
        b.add_ipsets("add cali40s:x 10.0.0.2\n", IpFamily::V4);
        assert_ne!(a, b);
    }
}
