//! The iptables text of flow-log rules (issue 22): an NFLOG copy of the first packet of each
//! new connection at the rule that decides it, rate-limited per pod, and the prefix grammar
//! that tells the reader which policy, rule and action decided. Pure; with flow logs off
//! (`RuleConfig::flow_log` is `None`) nothing here is called and every chain is byte for byte
//! what it was.
//!
//! Where the copies are taken, and why there:
//! - **Allowed by a policy rule**: right before each allow step of a policy chain
//!   (`cali-pi-…`/`cali-po-…`), matching exactly what the allow matches. Policy chains are
//!   only reached by packets that are not part of an established connection (the workload
//!   chain accepts those first), and an allowed packet returns from the chain at its first
//!   allow, so the copy is taken once, at the rule that decided. The prefix carries the
//!   Kubernetes rule index, which only the policy chain knows.
//! - **Isolated, no rule allowed**: right before a workload chain's "Drop if no policies
//!   passed packet" (the same place as the deny log's copy, on its own group).
//! - **No policy isolates the pod**: right before a workload chain's jump to its namespace
//!   profile when no NetworkPolicy selects the pod in that direction.
//! - **ClusterNetworkPolicy Accept and Deny rules** (Admin and Baseline tiers): right before
//!   each of their rules in the cluster policy chain, as for NetworkPolicy allows (Pass rules
//!   decide nothing: the next tier's copy is taken).
//! - **Unknown interface**: right before a dispatch chain's "Unknown interface" drop.
//!
//! Ingress is decided in the destination's `cali-tw-` chain on the destination's node and
//! egress in the source's `cali-fw-` chain on the source's node, so each node reports the
//! direction it enforces.
//!
//! Rate limit, per pod and direction: policy chains are shared by every pod a policy selects,
//! so `-m limit` (one bucket per rule) would be per rule, not per pod. Every flow-log rule
//! uses `-m hashlimit` with one table per direction keyed by the local pod's address
//! (`dstip` on ingress, `srcip` on egress): one bucket per pod and direction across all of
//! its rules, whichever chain they are in. The table's name carries a digest of the rate and
//! burst: the kernel keeps a hashlimit table's settings from the first rule that created it,
//! so a changed rate must use a new name to take effect. Only whole packets per second are
//! accepted, because `iptables-save` prints other units of hashlimit with extra options
//! (`--hashlimit-htable-expire`) that we would have to predict.
//!
//! Prefix grammar (ours, shaped by our provenance; felix's `A|D|N + P/R + I/E + index|policy`
//! is not used because our chains already identify the policy and pod):
//! - `npa-fa-<in|eg>-<rule index>-<policy chain>`: allowed by that rule of the policy whose
//!   chain this is (`npa-fa-in-0-cali-pi-x/allow-web`);
//! - `npa-fd-<in|eg>-<workload chain>`: the pod is isolated and no rule allowed;
//! - `npa-fn-<in|eg>-<workload chain>`: no NetworkPolicy isolates the pod (allowed);
//! - `npa-fr-<in|eg>-<rule index>-<cluster policy chain>`: denied by that Deny rule of a
//!   ClusterNetworkPolicy (its Accept rules use `npa-fa-` with their chain);
//! - `npa-fu-<in|eg>-<dispatch chain>`: dropped as an interface of no local pod.
//!
//! At most 10 + 6 + 28 = 44 characters, within the 63 both iptables backends keep.
//!
//! Flow logs at two layers: the NFLOG rule text in `rules::flow_log`, the reader, store and API
//! in `traffic::flow_log`.

use std::fmt;

use crate::rules::deny_log::{NflogTarget, RuleTextError, DEFAULT_SNAP_LEN};
use crate::rules::provenance::{RuleList, RuleRole};
use crate::rules::{Action, Direction, Rule};

/// Marks flow-log prefixes among whatever else logs to NFLOG (`npa-f…`; deny logs use
/// `npa-pol`/`npa-unk`/`npa-cnp`, which never start with `f`).
const PREFIX_TAG: &str = "npa";
/// The fastest per-pod rate `--hashlimit-upto N/sec` takes.
pub const MAX_RATE: u32 = 10_000;
/// The largest burst hashlimit takes.
pub const MAX_BURST: u32 = 10_000;
/// Highest rule index a prefix carries (a policy with more rules is refused far earlier by
/// validation; should one reach here its rules are rendered without their copies).
const MAX_RULE_INDEX: usize = 99_999;

/// What decided a logged packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FlowAction {
    /// An allow rule of a NetworkPolicy.
    Allow,
    /// The pod is isolated in this direction and no rule allowed the packet.
    Deny,
    /// No NetworkPolicy isolates the pod in this direction: allowed by the namespace profile.
    NoPolicy,
    /// A Deny rule of a ClusterNetworkPolicy (the prefix carries the rule index).
    RuleDeny,
    /// The "Unknown interface" drop of a dispatch chain: an interface of no local pod.
    UnknownInterface,
}

impl FlowAction {
    fn tag(self) -> &'static str {
        match self {
            FlowAction::Allow => "fa",
            FlowAction::Deny => "fd",
            FlowAction::NoPolicy => "fn",
            FlowAction::RuleDeny => "fr",
            FlowAction::UnknownInterface => "fu",
        }
    }

    /// Whether its prefixes carry the rule index (a rule of a policy decided).
    pub fn has_rule(self) -> bool {
        matches!(self, FlowAction::Allow | FlowAction::RuleDeny)
    }

    /// `allow` or `deny`, as records and the API say it.
    pub fn verdict(self) -> &'static str {
        match self {
            FlowAction::Allow | FlowAction::NoPolicy => "allow",
            FlowAction::Deny | FlowAction::RuleDeny | FlowAction::UnknownInterface => "deny",
        }
    }
}

fn direction_tag(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "in",
        Direction::Egress => "eg",
    }
}

/// A flow-log prefix, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowPrefix {
    pub action: FlowAction,
    pub direction: Direction,
    /// The Kubernetes rule index (in the policy's `ingress`/`egress` list) for
    /// [`FlowAction::Allow`]; `None` otherwise.
    pub rule: Option<usize>,
    /// The policy chain (allow) or the pod's workload chain (deny, no policy).
    pub chain: String,
}

impl FlowPrefix {
    pub fn render(&self) -> Result<String, RuleTextError> {
        let head = format!(
            "{PREFIX_TAG}-{}-{}",
            self.action.tag(),
            direction_tag(self.direction)
        );
        let text = match (self.action.has_rule(), self.rule) {
            (true, Some(rule)) if rule <= MAX_RULE_INDEX => {
                format!("{head}-{rule}-{}", self.chain)
            }
            (true, _) => return Err(RuleTextError::NotOurPrefix(head)),
            (_, None) => format!("{head}-{}", self.chain),
            (_, Some(_)) => return Err(RuleTextError::NotOurPrefix(head)),
        };
        // The same character and length rules as the deny log's prefixes.
        NflogTarget::new(0, &text, DEFAULT_SNAP_LEN)?;
        Ok(text)
    }

    /// Reads a prefix the kernel reported back; `Err` for anything that is not a flow-log
    /// prefix of ours.
    pub fn parse(prefix: &str) -> Result<FlowPrefix, RuleTextError> {
        let not_ours = || RuleTextError::NotOurPrefix(prefix.to_string());
        let mut parts = prefix.splitn(4, '-');
        if parts.next() != Some(PREFIX_TAG) {
            return Err(not_ours());
        }
        let action = match parts.next() {
            Some("fa") => FlowAction::Allow,
            Some("fd") => FlowAction::Deny,
            Some("fn") => FlowAction::NoPolicy,
            Some("fr") => FlowAction::RuleDeny,
            Some("fu") => FlowAction::UnknownInterface,
            _ => return Err(not_ours()),
        };
        let direction = match parts.next() {
            Some("in") => Direction::Ingress,
            Some("eg") => Direction::Egress,
            _ => return Err(not_ours()),
        };
        let rest = parts
            .next()
            .filter(|r| !r.is_empty())
            .ok_or_else(not_ours)?;
        let (rule, chain) = match action {
            _ if action.has_rule() => {
                let (index, chain) = rest.split_once('-').ok_or_else(not_ours)?;
                if index.is_empty()
                    || index.len() > 5
                    || !index.bytes().all(|b| b.is_ascii_digit())
                    || (index.len() > 1 && index.starts_with('0'))
                {
                    return Err(not_ours());
                }
                let index: usize = index.parse().map_err(|_| not_ours())?;
                (Some(index), chain)
            }
            _ => (None, rest),
        };
        if chain.is_empty() {
            return Err(not_ours());
        }
        Ok(FlowPrefix {
            action,
            direction,
            rule,
            chain: chain.to_string(),
        })
    }
}

/// Why a flow-log setting cannot be rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlowLogConfigError {
    Rate(u32),
    Burst(u32),
    Nflog(RuleTextError),
}

impl fmt::Display for FlowLogConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowLogConfigError::Rate(r) => write!(
                f,
                "flow-log rate {r} is outside 1..={MAX_RATE} new connections per second per pod"
            ),
            FlowLogConfigError::Burst(b) => {
                write!(f, "flow-log burst {b} is outside 1..={MAX_BURST}")
            }
            FlowLogConfigError::Nflog(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FlowLogConfigError {}

/// Flow logging as the renderer needs it (`RuleConfig::flow_log`). Built through
/// [`FlowLogConfig::new`], which checks everything, so rendering never fails on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowLogConfig {
    group: u16,
    rate: u32,
    burst: u32,
    snap_len: u32,
    /// `-m hashlimit …` per direction, rendered once.
    limit_in: String,
    limit_eg: String,
}

impl FlowLogConfig {
    /// `rate`: logged new connections per second per pod and direction; `burst`: how many
    /// above the rate a pod may log at once.
    pub fn new(
        group: u16,
        rate: u32,
        burst: u32,
        snap_len: u32,
    ) -> Result<FlowLogConfig, FlowLogConfigError> {
        if rate == 0 || rate > MAX_RATE {
            return Err(FlowLogConfigError::Rate(rate));
        }
        if burst == 0 || burst > MAX_BURST {
            return Err(FlowLogConfigError::Burst(burst));
        }
        NflogTarget::new(group, "npa-fa-in-0-x", snap_len).map_err(FlowLogConfigError::Nflog)?;
        Ok(FlowLogConfig {
            group,
            rate,
            burst,
            snap_len,
            limit_in: hashlimit_match(Direction::Ingress, rate, burst),
            limit_eg: hashlimit_match(Direction::Egress, rate, burst),
        })
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    pub fn snap_len(&self) -> u32 {
        self.snap_len
    }

    fn limit(&self, direction: Direction) -> &str {
        match direction {
            Direction::Ingress => &self.limit_in,
            Direction::Egress => &self.limit_eg,
        }
    }

    /// The flow-log copy of `rule` (same matches), or `None` when the prefix cannot be
    /// rendered (then the rule goes without its copy rather than the chain without the rule).
    pub fn copy_of(&self, rule: &Rule, prefix: &FlowPrefix) -> Option<Rule> {
        let text = prefix.render().ok()?;
        let target = NflogTarget::new(self.group, &text, self.snap_len).ok()?;
        Some(
            Rule {
                action: Some(Action::Nflog(target)),
                ..rule.clone()
            }
            .matching(self.limit(prefix.direction).to_string()),
        )
    }
}

/// The hashlimit table of one direction: `npaf<i|e>` and 8 hex digits of the rate and burst
/// (hashlimit names hold 15 characters).
pub fn hashlimit_name(direction: Direction, rate: u32, burst: u32) -> String {
    // FNV-1a over the settings: stable across builds and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in format!("{rate}/{burst}").bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let d = match direction {
        Direction::Ingress => 'i',
        Direction::Egress => 'e',
    };
    format!("npaf{d}{h:08x}")
}

/// `-m hashlimit --hashlimit-upto <rate>/sec --hashlimit-burst <burst> --hashlimit-mode
/// <dstip|srcip> --hashlimit-name <name>`, as iptables-save prints it (the burst is printed
/// even at its default, unlike `-m limit`'s).
pub fn hashlimit_match(direction: Direction, rate: u32, burst: u32) -> String {
    let mode = match direction {
        Direction::Ingress => "dstip",
        Direction::Egress => "srcip",
    };
    format!(
        "-m hashlimit --hashlimit-upto {rate}/sec --hashlimit-burst {burst} --hashlimit-mode {mode} --hashlimit-name {}",
        hashlimit_name(direction, rate, burst)
    )
}

/// Pushes `rule`'s flow-log copy (when flow logs are on) and then `rule` itself with `role`.
pub(crate) fn push_with_copy(
    rules: &mut RuleList,
    cfg: Option<&FlowLogConfig>,
    rule: Rule,
    prefix: impl FnOnce() -> FlowPrefix,
    role: impl FnOnce() -> RuleRole,
) {
    if let Some(cfg) = cfg {
        if let Some(copy) = cfg.copy_of(&rule, &prefix()) {
            rules.push(copy, || RuleRole::FlowLog);
        }
    }
    rules.push(rule, role);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IpFamily;
    use crate::rules::Chain;

    fn allow(rule: usize, chain: &str) -> FlowPrefix {
        FlowPrefix {
            action: FlowAction::Allow,
            direction: Direction::Ingress,
            rule: Some(rule),
            chain: chain.into(),
        }
    }

    #[test]
    fn prefixes_render_and_parse_back() {
        let cases = [
            (
                allow(0, "cali-pi-x/allow-web"),
                "npa-fa-in-0-cali-pi-x/allow-web",
            ),
            (
                FlowPrefix {
                    direction: Direction::Egress,
                    ..allow(12, "cali-po-_AbCdEfGhIjKlMnOpQrSt")
                },
                "npa-fa-eg-12-cali-po-_AbCdEfGhIjKlMnOpQrSt",
            ),
            (
                FlowPrefix {
                    action: FlowAction::Deny,
                    direction: Direction::Ingress,
                    rule: None,
                    chain: "cali-tw-cali1234567890a".into(),
                },
                "npa-fd-in-cali-tw-cali1234567890a",
            ),
            (
                FlowPrefix {
                    action: FlowAction::NoPolicy,
                    direction: Direction::Egress,
                    rule: None,
                    chain: "cali-fw-cali1234567890a".into(),
                },
                "npa-fn-eg-cali-fw-cali1234567890a",
            ),
        ];
        let cases = cases.into_iter().chain([
            (
                FlowPrefix {
                    action: FlowAction::RuleDeny,
                    direction: Direction::Egress,
                    rule: Some(3),
                    chain: "cali-po-kcnp-deny-all".into(),
                },
                "npa-fr-eg-3-cali-po-kcnp-deny-all",
            ),
            (
                FlowPrefix {
                    action: FlowAction::UnknownInterface,
                    direction: Direction::Ingress,
                    rule: None,
                    chain: "cali-to-wl-dispatch".into(),
                },
                "npa-fu-in-cali-to-wl-dispatch",
            ),
        ]);
        for (prefix, text) in cases {
            assert_eq!(prefix.render().unwrap(), text);
            assert_eq!(FlowPrefix::parse(text).unwrap(), prefix);
        }
        // The longest: five-digit index and a 28-character chain.
        let longest = allow(MAX_RULE_INDEX, &"c".repeat(28)).render().unwrap();
        assert_eq!(longest.len(), 44);
        assert!(allow(MAX_RULE_INDEX + 1, "c").render().is_err());
    }

    #[test]
    fn deny_log_and_foreign_prefixes_are_not_flow_prefixes() {
        for p in [
            "",
            "npa",
            "npa-pol-in-cali-tw-x",
            "npa-unk-eg-cali-from-wl-dispatch",
            "npa-cnp-in-cali-pi-kcnp/x",
            "npa-fa-in-cali-pi-x",
            "npa-fa-in--cali-pi-x",
            "npa-fa-in-01-cali-pi-x",
            "npa-fa-in-123456-cali-pi-x",
            "npa-fa-in-3-",
            "npa-fd-up-cali-tw-x",
            "npa-fd-in-",
            "calico: A|P|I|0|x",
        ] {
            assert!(FlowPrefix::parse(p).is_err(), "{p:?}");
        }
        // A deny or no-policy prefix with a rule index is not renderable.
        let odd = FlowPrefix {
            action: FlowAction::Deny,
            ..allow(1, "cali-tw-x")
        };
        assert!(odd.render().is_err());
    }

    #[test]
    fn config_is_checked_once() {
        assert_eq!(
            FlowLogConfig::new(21, 0, 5, 128),
            Err(FlowLogConfigError::Rate(0))
        );
        assert!(FlowLogConfig::new(21, MAX_RATE + 1, 5, 128).is_err());
        assert!(FlowLogConfig::new(21, 10, 0, 128).is_err());
        assert!(FlowLogConfig::new(21, 10, MAX_BURST + 1, 128).is_err());
        assert!(FlowLogConfig::new(21, 10, 5, 0).is_err());
        let c = FlowLogConfig::new(21, 100, 200, 128).unwrap();
        assert_eq!(
            (c.group(), c.rate(), c.burst(), c.snap_len()),
            (21, 100, 200, 128)
        );
    }

    #[test]
    fn hashlimit_text_is_what_iptables_save_prints() {
        // Checked against iptables-legacy-save and iptables-nft-save 1.8 (both families).
        let name = hashlimit_name(Direction::Ingress, 100, 200);
        assert_eq!(name.len(), 13);
        assert!(name.starts_with("npafi"));
        assert_eq!(
            hashlimit_match(Direction::Ingress, 100, 200),
            format!("-m hashlimit --hashlimit-upto 100/sec --hashlimit-burst 200 --hashlimit-mode dstip --hashlimit-name {name}")
        );
        assert!(hashlimit_match(Direction::Egress, 100, 5)
            .contains("--hashlimit-burst 5 --hashlimit-mode srcip --hashlimit-name npafe"));
        // Other settings, another table (the kernel keeps a table's first settings).
        assert_ne!(name, hashlimit_name(Direction::Ingress, 100, 201));
        assert_ne!(name, hashlimit_name(Direction::Ingress, 10, 200));
        // Stable: a golden value, so a change of the digest shows in review.
        assert_eq!(
            hashlimit_name(Direction::Egress, 100, 200),
            format!("npafe{}", &name[5..])
        );
    }

    #[test]
    fn copy_matches_what_the_rule_matches() {
        let cfg = FlowLogConfig::new(21, 100, 200, 128).unwrap();
        let allow_rule = Rule {
            protocol: Some("tcp"),
            ..Rule::new(Action::SetMark {
                value: 0x10000,
                mask: 0x10000,
            })
        }
        .matching("-m set --match-set cali40s:abc src")
        .matching("-m multiport --dports 80");
        let copy = cfg
            .copy_of(&allow_rule, &allow(2, "cali-pi-x/allow-web"))
            .unwrap();
        let chain = Chain::new("cali-pi-x/allow-web", IpFamily::V4, vec![copy, allow_rule]);
        let body = &chain.rules[0].body;
        let hash = &chain.rules[0].hash;
        assert_eq!(
            body.replace(&format!("-m comment --comment \"cali:{hash}\" "), ""),
            format!(
                "-p tcp -m set --match-set cali40s:abc src -m multiport --dports 80 {} \
                 -j NFLOG --nflog-prefix \"npa-fa-in-2-cali-pi-x/allow-web\" --nflog-group 21 --nflog-size 128",
                hashlimit_match(Direction::Ingress, 100, 200)
            )
        );
        assert!(chain.rules[1]
            .body
            .ends_with("-j MARK --set-xmark 0x10000/0x10000"));
    }

    #[test]
    fn push_with_copy_is_the_rule_alone_when_off() {
        let mut off = RuleList::new(true);
        push_with_copy(
            &mut off,
            None,
            Rule::new(Action::Drop),
            || unreachable!("no prefix is built when off"),
            || RuleRole::DropIfNoPolicyPassed,
        );
        assert_eq!(off.rules.len(), 1);
    }
}
