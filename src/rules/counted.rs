//! Which of the rules we render count something worth exporting, told from their rendered
//! text (the kernel hands back each rule's `cali:` hash and counters; the agent maps the hash
//! to the rule through the chains the graph emitted, and asks here what the rule is). Pure.
//!
//! - a policy chain's allow: the rule that sets the accept bit (`-j MARK --set-xmark
//!   <accept>/<accept>`); each packet a policy allows passes exactly one of them (the next
//!   rule returns);
//! - a pod chain's "Drop if no policies passed packet" (the deny action, not its log rule);
//! - a dispatch chain's "Unknown interface" / "Unknown workload address" drop.

use crate::model::IpFamily;

use super::deny;
use super::{action_text, Action, RuleConfig};

pub const POLICY_DROP_COMMENT: &str = "Drop if no policies passed packet";
pub const UNKNOWN_INTERFACE_COMMENT: &str = "Unknown interface";
pub const UNKNOWN_ADDRESS_COMMENT: &str = "Unknown workload address";

/// The rendered ends and comments to look for, computed once per configuration and family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classifier {
    allow_end: String,
    deny_end: String,
}

impl Classifier {
    pub fn new(cfg: &RuleConfig, family: IpFamily) -> Classifier {
        Classifier {
            allow_end: format!(
                " {}",
                action_text(
                    &Action::SetMark {
                        value: cfg.marks.accept,
                        mask: cfg.marks.accept,
                    },
                    family,
                )
            ),
            deny_end: format!(" {}", action_text(&deny(cfg), family)),
        }
    }

    /// In a `cali-pi-`/`cali-po-` chain: is this an allow?
    pub fn is_policy_allow(&self, body: &str) -> bool {
        body.ends_with(&self.allow_end)
    }

    /// In a `cali-tw-`/`cali-fw-` chain: is this the policy drop?
    pub fn is_policy_drop(&self, body: &str) -> bool {
        body.ends_with(&self.deny_end) && has_comment(body, POLICY_DROP_COMMENT)
    }

    /// In a dispatch chain: is this the unknown-interface (or, bridge mode, unknown-address)
    /// drop?
    pub fn is_unknown_drop(&self, body: &str) -> bool {
        body.ends_with(&self.deny_end)
            && (has_comment(body, UNKNOWN_INTERFACE_COMMENT)
                || has_comment(body, UNKNOWN_ADDRESS_COMMENT))
    }
}

fn has_comment(body: &str, comment: &str) -> bool {
    body.contains(&format!("-m comment --comment \"{comment}\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IpFamily, ObjectKey};
    use crate::rules::chains::endpoint_chains;
    use crate::rules::deny_log::{DenyLogConfig, Rate};
    use crate::rules::dispatch::dispatch_chains;
    use crate::rules::{DenyAction, MarkBits};

    #[test]
    fn finds_exactly_the_policy_drop_and_unknown_drops_with_logging_and_reject() {
        for family in [IpFamily::V4, IpFamily::V6] {
            for deny_action in [DenyAction::Drop, DenyAction::Reject] {
                for deny_log in [
                    None,
                    Some(DenyLogConfig::new(1, Rate::per_second(5), 5, 128).unwrap()),
                ] {
                    let cfg = RuleConfig {
                        deny_action,
                        deny_log,
                        marks: MarkBits::from_mask(0xf00).unwrap(),
                        ..RuleConfig::default()
                    };
                    let c = Classifier::new(&cfg, family);
                    let p = [ObjectKey::new("x", "p")];
                    for chain in endpoint_chains(&cfg, family, "cali1", &[], "x", &p, &p) {
                        let drops: Vec<_> = chain
                            .rules
                            .iter()
                            .filter(|r| c.is_policy_drop(&r.body))
                            .collect();
                        assert_eq!(drops.len(), 1, "{chain:#?}");
                        assert!(!drops[0].body.contains("NFLOG"));
                        // The profile's accept-bit rule is no policy allow of this chain kind,
                        // but would read as one: the caller only asks in policy chains.
                        assert!(!chain.rules.iter().any(|r| c.is_unknown_drop(&r.body)));
                    }
                    let chains = dispatch_chains(&cfg, family, &["cali1".into(), "cali2".into()]);
                    for chain in chains {
                        let drops = chain
                            .rules
                            .iter()
                            .filter(|r| c.is_unknown_drop(&r.body))
                            .count();
                        assert_eq!(drops, 1, "{chain:#?}");
                    }
                }
            }
        }
    }

    #[test]
    fn policy_allows_are_the_accept_bit_rules() {
        let cfg = RuleConfig::default();
        let c = Classifier::new(&cfg, IpFamily::V4);
        assert!(c.is_policy_allow(
            "-s 10.0.0.0/8 -m comment --comment \"cali:x\" -j MARK --set-xmark 0x10000/0x10000"
        ));
        assert!(!c.is_policy_allow(
            "-m comment --comment \"cali:x\" -j MARK --set-xmark 0x40000/0xc0000"
        ));
        assert!(!c.is_policy_allow(
            "-m comment --comment \"cali:x\" -m mark --mark 0x10000/0x10000 -j RETURN"
        ));
    }
}
