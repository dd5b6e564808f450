//! What netpol-agent owns in a kernel, read back from `iptables-save` and `ipset save` text:
//! our chains with their rules, our rules in the kernel's own chains, our sets with their
//! type and members. Comparing it with the same reading of `compile` output tells whether a
//! node has converged (the agent tests and the e2e suite wait on it), and [`OwnedState::drift`]
//! names every difference (what `audit` reports: chains, rules and set members missing, extra
//! or different, and other programs' rules inside our chains). Other programs' chains, rules
//! and sets are left out, so they never make two readings differ.

use std::collections::{BTreeMap, BTreeSet};

use super::iptables::Ownership;
use crate::kernel_text::ipset::{self, SetLine};
use crate::kernel_text::iptables::{self, SaveLine};
use crate::model::IpFamily;
use crate::rules::sets::set_family;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedState {
    /// Our sets with their members (as `ipset save` prints them).
    pub sets: BTreeMap<String, BTreeSet<String>>,
    /// Our sets' types (`hash:net`, `hash:ip,port`) and families, as created.
    pub set_types: BTreeMap<String, String>,
    /// Our chains with their rules, in order.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Our rules in kernel chains (FORWARD, INPUT, OUTPUT), in order.
    pub kernel: BTreeMap<String, Vec<String>>,
}

impl OwnedState {
    /// Adds what an `iptables-save` or `iptables-restore` text holds of ours: the chains
    /// `ownership` names ours, and our rules (those carrying our hash) in other chains.
    pub fn add_iptables(&mut self, text: &str, ownership: &Ownership) {
        // Read as the writer reads saves: iptables 1.8.7's quirks (a trailing space, two
        // spaces after --nflog-prefix) are no difference. Every table is read: our rules
        // live in filter only, and a restore script's inserts count where they stand.
        for line in iptables::lines(text.as_bytes()) {
            let (chain, body) = match line.kind() {
                SaveLine::Chain { name, .. } => {
                    if ownership.owns_chain(name) {
                        self.chains.entry(name.to_string()).or_default();
                    }
                    continue;
                }
                SaveLine::Append { chain, body } | SaveLine::Insert { chain, body, .. } => {
                    (chain, body)
                }
                _ => continue,
            };
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
        for line in ipset::lines(text) {
            match line {
                SetLine::Create {
                    name,
                    set_type,
                    options,
                } if ours(name) => {
                    self.sets.entry(name.to_string()).or_default();
                    self.set_types.insert(
                        name.to_string(),
                        format!(
                            "{} family {}",
                            set_type.unwrap_or_default(),
                            options.family().unwrap_or("inet")
                        ),
                    );
                }
                SetLine::Add {
                    name,
                    entry: Some(member),
                    ..
                } if ours(name) => {
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

/// One difference between what the kernel holds of ours and what it should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// A chain that should exist does not.
    MissingChain {
        chain: String,
    },
    /// A chain of ours that should not exist (rules it holds).
    ExtraChain {
        chain: String,
        rules: usize,
    },
    /// A rule of ours (by hash) missing from a chain; `body` is what it should be.
    MissingRule {
        chain: String,
        hash: String,
        body: String,
    },
    /// A rule of ours (by hash) that should not be in the chain.
    ExtraRule {
        chain: String,
        hash: String,
        body: String,
    },
    /// The rule with this hash has other text than it should.
    DifferentRule {
        chain: String,
        hash: String,
        want: String,
        have: String,
    },
    /// The chain holds the right rules of ours in another order.
    OutOfOrder {
        chain: String,
    },
    /// Another program's rule (no hash of ours) inside a chain of ours; 1-based position.
    ForeignRule {
        chain: String,
        number: usize,
        body: String,
    },
    MissingSet {
        set: String,
    },
    ExtraSet {
        set: String,
        members: usize,
    },
    SetTypeChanged {
        set: String,
        want: String,
        have: String,
    },
    MembersMissing {
        set: String,
        members: Vec<String>,
    },
    MembersExtra {
        set: String,
        members: Vec<String>,
    },
}

impl Drift {
    /// The chain or set it is about.
    pub fn subject(&self) -> &str {
        match self {
            Drift::MissingChain { chain }
            | Drift::ExtraChain { chain, .. }
            | Drift::MissingRule { chain, .. }
            | Drift::ExtraRule { chain, .. }
            | Drift::DifferentRule { chain, .. }
            | Drift::OutOfOrder { chain }
            | Drift::ForeignRule { chain, .. } => chain,
            Drift::MissingSet { set }
            | Drift::ExtraSet { set, .. }
            | Drift::SetTypeChanged { set, .. }
            | Drift::MembersMissing { set, .. }
            | Drift::MembersExtra { set, .. } => set,
        }
    }
}

impl OwnedState {
    /// Every difference between this reading (the kernel) and `want` (the same reading of
    /// what should be there), by chain, rule hash and set.
    pub fn drift(&self, want: &OwnedState, ownership: &Ownership) -> Vec<Drift> {
        let mut out = Vec::new();
        for (chain, want_rules) in &want.chains {
            match self.chains.get(chain) {
                None => out.push(Drift::MissingChain {
                    chain: chain.clone(),
                }),
                Some(have_rules) => {
                    out.extend(rule_drift(chain, want_rules, have_rules, ownership, true))
                }
            }
        }
        for (chain, rules) in &self.chains {
            if !want.chains.contains_key(chain) {
                out.push(Drift::ExtraChain {
                    chain: chain.clone(),
                    rules: rules.len(),
                });
            }
        }
        // Kernel chains: only our rules were read, in the kernel's order.
        let empty = Vec::new();
        let kernel_chains: BTreeSet<&String> =
            want.kernel.keys().chain(self.kernel.keys()).collect();
        for chain in kernel_chains {
            let want_rules = want.kernel.get(chain).unwrap_or(&empty);
            let have_rules = self.kernel.get(chain).unwrap_or(&empty);
            out.extend(rule_drift(chain, want_rules, have_rules, ownership, false));
        }
        for (set, want_members) in &want.sets {
            let Some(have_members) = self.sets.get(set) else {
                out.push(Drift::MissingSet { set: set.clone() });
                continue;
            };
            if let (Some(w), Some(h)) = (want.set_types.get(set), self.set_types.get(set)) {
                if w != h {
                    out.push(Drift::SetTypeChanged {
                        set: set.clone(),
                        want: w.clone(),
                        have: h.clone(),
                    });
                }
            }
            let missing: Vec<String> = want_members.difference(have_members).cloned().collect();
            let extra: Vec<String> = have_members.difference(want_members).cloned().collect();
            if !missing.is_empty() {
                out.push(Drift::MembersMissing {
                    set: set.clone(),
                    members: missing,
                });
            }
            if !extra.is_empty() {
                out.push(Drift::MembersExtra {
                    set: set.clone(),
                    members: extra,
                });
            }
        }
        for (set, members) in &self.sets {
            if !want.sets.contains_key(set) {
                out.push(Drift::ExtraSet {
                    set: set.clone(),
                    members: members.len(),
                });
            }
        }
        out
    }
}

/// Differences in one chain, by hash; `whole_chain`: the chain is ours, so rules without our
/// hash are foreign (in a kernel chain only our rules were read).
fn rule_drift(
    chain: &str,
    want: &[String],
    have: &[String],
    ownership: &Ownership,
    whole_chain: bool,
) -> Vec<Drift> {
    let mut out = Vec::new();
    let hashed = |rules: &[String]| -> Vec<(String, String)> {
        rules
            .iter()
            .filter_map(|b| ownership.rule_hash(b).map(|h| (h.to_string(), b.clone())))
            .collect()
    };
    let want_h = hashed(want);
    let have_h = hashed(have);
    if whole_chain {
        for (i, body) in have.iter().enumerate() {
            if ownership.rule_hash(body).is_none() {
                out.push(Drift::ForeignRule {
                    chain: chain.to_string(),
                    number: i + 1,
                    body: body.clone(),
                });
            }
        }
    }
    let have_map: BTreeMap<&str, &str> = have_h
        .iter()
        .map(|(h, b)| (h.as_str(), b.as_str()))
        .collect();
    let want_map: BTreeMap<&str, &str> = want_h
        .iter()
        .map(|(h, b)| (h.as_str(), b.as_str()))
        .collect();
    for (hash, body) in &want_h {
        match have_map.get(hash.as_str()) {
            None => out.push(Drift::MissingRule {
                chain: chain.to_string(),
                hash: hash.clone(),
                body: body.clone(),
            }),
            Some(h) if h != body => out.push(Drift::DifferentRule {
                chain: chain.to_string(),
                hash: hash.clone(),
                want: body.clone(),
                have: h.to_string(),
            }),
            _ => {}
        }
    }
    for (hash, body) in &have_h {
        if !want_map.contains_key(hash.as_str()) {
            out.push(Drift::ExtraRule {
                chain: chain.to_string(),
                hash: hash.clone(),
                body: body.clone(),
            });
        }
    }
    let order = |list: &[(String, String)], other: &BTreeMap<&str, &str>| -> Vec<String> {
        list.iter()
            .filter(|(h, _)| other.contains_key(h.as_str()))
            .map(|(h, _)| h.clone())
            .collect()
    };
    if order(&want_h, &have_map) != order(&have_h, &want_map) {
        out.push(Drift::OutOfOrder {
            chain: chain.to_string(),
        });
    }
    out
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

    #[test]
    fn two_spaces_after_the_nflog_prefix_are_no_difference() {
        // iptables 1.8.7's NFLOG extension prints `--nflog-prefix  P`.
        let text = |sep: &str| {
            format!(
                ":cali-tw-x - [0:0]\n-A cali-tw-x -m comment --comment \"cali:abc\" -j NFLOG --nflog-prefix{sep}npa-pol-in-cali-tw-x --nflog-size 128\n"
            )
        };
        let (mut a, mut b) = (OwnedState::default(), OwnedState::default());
        a.add_iptables(&text("  "), &OWNERSHIP);
        b.add_iptables(&text(" "), &OWNERSHIP);
        assert_eq!(a, b);
    }

    #[test]
    fn a_trailing_space_after_a_rule_is_no_difference() {
        // iptables-nft-save 1.8.7 prints a rule without a target followed by a space.
        let text = |end: &str| {
            format!(":cali-pi-x - [0:0]\n-A cali-pi-x -m comment --comment \"cali:abc\"{end}\n")
        };
        let (mut a, mut b) = (OwnedState::default(), OwnedState::default());
        a.add_iptables(&text(" "), &OWNERSHIP);
        b.add_iptables(&text(""), &OWNERSHIP);
        assert_eq!(a, b);
    }

    #[test]
    fn drift_names_every_difference() {
        let mut want = OwnedState::default();
        want.add_iptables(
            ":cali-a - [0:0]\n:cali-b - [0:0]\n\
             -A cali-a -m comment --comment \"cali:h1\" -j ACCEPT\n\
             -A cali-a -m comment --comment \"cali:h2\" -j DROP\n\
             -A cali-a -m comment --comment \"cali:h3\" -j RETURN\n\
             -I FORWARD 1 -m comment --comment \"cali:j\" -j cali-FORWARD\n",
            &OWNERSHIP,
        );
        want.add_ipsets(
            "create cali40s:s hash:net family inet maxelem 1\nadd cali40s:s 10.0.0.1\n\
             create cali40n:n hash:ip,port family inet\n",
            IpFamily::V4,
        );
        let mut have = OwnedState::default();
        have.add_iptables(
            "*filter\n:cali-a - [0:0]\n:cali-x - [0:0]\n\
             -A FORWARD -j KUBE-FORWARD\n\
             -A cali-a -m comment --comment \"cali:h2\" -j DROP\n\
             -A cali-a -m comment --comment \"cali:h1\" -j ACCEPT\n\
             -A cali-a -j ACCEPT\n\
             -A cali-a -m comment --comment \"cali:h9\" -j ACCEPT\n\
             -A cali-x -j DROP\nCOMMIT\n",
            &OWNERSHIP,
        );
        have.add_ipsets(
            "create cali40s:s hash:net family inet hashsize 64 maxelem 1\nadd cali40s:s 10.9.9.9\n\
             create cali40n:n hash:net family inet\ncreate cali40s:old hash:net family inet\n",
            IpFamily::V4,
        );
        let d = have.drift(&want, &OWNERSHIP);
        let has = |x: &Drift| d.contains(x);
        assert!(
            has(&Drift::MissingChain {
                chain: "cali-b".into()
            }),
            "{d:#?}"
        );
        assert!(has(&Drift::ExtraChain {
            chain: "cali-x".into(),
            rules: 1
        }));
        assert!(has(&Drift::MissingRule {
            chain: "cali-a".into(),
            hash: "h3".into(),
            body: "-m comment --comment \"cali:h3\" -j RETURN".into()
        }));
        assert!(has(&Drift::ExtraRule {
            chain: "cali-a".into(),
            hash: "h9".into(),
            body: "-m comment --comment \"cali:h9\" -j ACCEPT".into()
        }));
        assert!(has(&Drift::OutOfOrder {
            chain: "cali-a".into()
        }));
        assert!(has(&Drift::ForeignRule {
            chain: "cali-a".into(),
            number: 3,
            body: "-j ACCEPT".into()
        }));
        assert!(d.iter().any(|x| matches!(x, Drift::MissingRule { chain, hash, .. } if chain == "FORWARD" && hash == "j")));
        assert!(has(&Drift::MembersMissing {
            set: "cali40s:s".into(),
            members: vec!["10.0.0.1".into()]
        }));
        assert!(has(&Drift::MembersExtra {
            set: "cali40s:s".into(),
            members: vec!["10.9.9.9".into()]
        }));
        assert!(has(&Drift::SetTypeChanged {
            set: "cali40n:n".into(),
            want: "hash:ip,port family inet".into(),
            have: "hash:net family inet".into()
        }));
        assert!(has(&Drift::ExtraSet {
            set: "cali40s:old".into(),
            members: 0
        }));
        assert!(want.drift(&want, &OWNERSHIP).is_empty());
        // A foreign rule in a chain of ours is a finding whatever is wanted.
        assert!(have
            .drift(&have, &OWNERSHIP)
            .iter()
            .all(|x| matches!(x, Drift::ForeignRule { .. })));
    }
}
