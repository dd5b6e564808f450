//! `iptables-restore` text for a complete desired state of the filter table (what
//! `netpol-agent compile` prints). It is meant for `iptables-restore --noflush` into tables
//! that do not hold our chains yet: `:chain` lines create (or flush) our chains, and our
//! kernel-chain rules are inserted or appended. Chain names are written through
//! `token::chain_token`, and rule bodies come from `render_rules`, which escapes every name
//! it embeds; `compile` still checks every line (`token::restore_line_problem`) before
//! printing.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::chains::KernelChainRules;
use super::token::chain_token;
use super::{Chain, ChainInsertMode};

/// `chains` by value or shared (`Arc<Chain>`, as the dataplane holds them).
pub fn restore_script<C: Borrow<Chain>>(
    chains: &BTreeMap<String, C>,
    kernel: &[KernelChainRules],
    mode: ChainInsertMode,
) -> String {
    let mut out = String::from("*filter\n");
    for chain in chains.values().map(Borrow::borrow) {
        let _ = writeln!(out, ":{} - [0:0]", chain_token(&chain.name));
    }
    for chain in chains.values().map(Borrow::borrow) {
        let name = chain_token(&chain.name);
        for rule in &chain.rules {
            let _ = writeln!(out, "-A {name} {}", rule.body);
        }
    }
    for k in kernel {
        let chain = chain_token(&k.chain);
        match mode {
            // Reverse order at position 1 leaves them at the top in order.
            ChainInsertMode::Insert => {
                for rule in k.inserts.iter().rev() {
                    let _ = writeln!(out, "-I {chain} 1 {}", rule.body);
                }
            }
            ChainInsertMode::Append => {
                for rule in &k.inserts {
                    let _ = writeln!(out, "-A {chain} {}", rule.body);
                }
            }
        }
        for rule in &k.appends {
            let _ = writeln!(out, "-A {chain} {}", rule.body);
        }
    }
    out.push_str("COMMIT\n");
    out
}
