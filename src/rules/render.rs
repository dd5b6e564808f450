//! `iptables-restore` text for a complete desired state of the filter table (what
//! `netpol-agent compile` prints). It is meant for `iptables-restore --noflush` into tables
//! that do not hold our chains yet: `:chain` lines create (or flush) our chains, and our
//! kernel-chain rules are inserted or appended.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::chains::KernelChainRules;
use super::{Chain, ChainInsertMode};

pub fn restore_script(
    chains: &BTreeMap<String, Chain>,
    kernel: &[KernelChainRules],
    mode: ChainInsertMode,
) -> String {
    let mut out = String::from("*filter\n");
    for name in chains.keys() {
        let _ = writeln!(out, ":{name} - [0:0]");
    }
    for chain in chains.values() {
        for rule in &chain.rules {
            let _ = writeln!(out, "-A {} {}", chain.name, rule.body);
        }
    }
    for k in kernel {
        match mode {
            // Reverse order at position 1 leaves them at the top in order.
            ChainInsertMode::Insert => {
                for rule in k.inserts.iter().rev() {
                    let _ = writeln!(out, "-I {} 1 {}", k.chain, rule.body);
                }
            }
            ChainInsertMode::Append => {
                for rule in &k.inserts {
                    let _ = writeln!(out, "-A {} {}", k.chain, rule.body);
                }
            }
        }
        for rule in &k.appends {
            let _ = writeln!(out, "-A {} {}", k.chain, rule.body);
        }
    }
    out.push_str("COMMIT\n");
    out
}
