//! Felix-compatible iptables rendering: the rule and chain model, chain naming, the mark-bit
//! layout, and the builders for every chain netpol-agent programs (static, dispatch,
//! per-workload, per-policy, per-namespace profile). Pure: no I/O.
//!
//! Rules are rendered in the canonical form `iptables-save` prints them in (`-s/-d/-i/-o/-p`
//! first, then the `cali:` hash comment and the other matches in order, then the target), so
//! the writer can compare what the kernel holds with what we want as plain text.
//!
//! Rule hashes differ from felix on purpose: felix chains each rule's hash to the previous
//! one, so one rule inserted near the top of a chain changes every hash after it and felix
//! rewrites the tail. Ours hash the rule's own text, its chain and its occurrence among
//! identical rules of that chain; the writer can then line up old and new chains by hash and
//! touch only what changed. The format (`cali:` + 16 base64url characters, first comment) is
//! felix's, so tooling that greps for it keeps working.

pub mod bridge;
pub mod chains;
pub mod cluster;
pub mod counted;
pub mod deny_log;
pub mod dispatch;
pub mod flow_log;
pub mod guard;
pub mod iface;
pub mod ipvs;
pub mod policy;
pub mod provenance;
pub mod render;
pub mod sets;
pub mod token;
pub mod union;

use std::collections::HashMap;
use std::fmt::Write as _;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ipnet::IpNet;
use sha2::{Digest, Sha224, Sha256};

use crate::model::IpFamily;

/// Longest chain name we create (iptables allows 28 usable characters).
pub const MAX_CHAIN_NAME_LEN: usize = 28;
/// Prefix of every chain we own.
pub const CHAIN_PREFIX: &str = "cali-";
/// First characters of the hash comment that marks a rule as ours.
pub const RULE_HASH_PREFIX: &str = "cali:";
const RULE_HASH_LEN: usize = 16;
const MAX_COMMENT_LEN: usize = 256;

pub const FORWARD_CHAIN: &str = "cali-FORWARD";
pub const INPUT_CHAIN: &str = "cali-INPUT";
pub const OUTPUT_CHAIN: &str = "cali-OUTPUT";
pub const WL_TO_HOST_CHAIN: &str = "cali-wl-to-host";
/// The start every workload chain jumps to first: conntrack, then the mark bits cleared.
pub const WL_START_CHAIN: &str = "cali-wl-start";
pub const FROM_WL_DISPATCH: &str = "cali-from-wl-dispatch";
pub const TO_WL_DISPATCH: &str = "cali-to-wl-dispatch";
/// Bridge mode only: traffic routed (not bridged) into the bridge, dispatched by destination
/// address, because no iptables hook knows the bridge port of a routed packet.
pub const TO_WL_ADDR_DISPATCH: &str = "cali-to-wl-addr-dispatch";
pub const TO_WORKLOAD_PREFIX: &str = "cali-tw-";
pub const FROM_WORKLOAD_PREFIX: &str = "cali-fw-";
pub const POLICY_INGRESS_PREFIX: &str = "cali-pi-";
pub const POLICY_EGRESS_PREFIX: &str = "cali-po-";
pub const PROFILE_INGRESS_PREFIX: &str = "cali-pri-";
pub const PROFILE_EGRESS_PREFIX: &str = "cali-pro-";

/// The mark bits we use, carved from the configured mask (felix's `IptablesMarkMask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkBits {
    /// Set by an allow; checked by "Return if policy accepted" and the final FORWARD ACCEPT.
    pub accept: u32,
    /// Set by a pass (never by Kubernetes policies; cleared at the start of the policies).
    pub pass: u32,
    /// ipBlock `except` bookkeeping inside one policy rule.
    pub scratch0: u32,
    pub scratch1: u32,
}

impl MarkBits {
    /// Hands out the lowest free bits of the mask in felix's order (accept, pass, scratch0,
    /// scratch1): with the default 0xffff0000 that is the layout of the seed article,
    /// 0x10000 / 0x20000 / 0x40000 / 0x80000.
    pub fn from_mask(mask: u32) -> Result<MarkBits, String> {
        let mut bits = (0..32).map(|i| 1u32 << i).filter(|b| mask & b != 0);
        let mut next = || {
            bits.next().ok_or_else(|| {
                format!("mark mask {mask:#x} has {} bits set; netpol-agent needs at least 4 (accept, pass, scratch0, scratch1)", mask.count_ones())
            })
        };
        Ok(MarkBits {
            accept: next()?,
            pass: next()?,
            scratch0: next()?,
            scratch1: next()?,
        })
    }

    pub fn all(&self) -> u32 {
        self.accept | self.pass | self.scratch0 | self.scratch1
    }
}

impl Default for MarkBits {
    fn default() -> Self {
        MarkBits {
            accept: 0x10000,
            pass: 0x20000,
            scratch0: 0x40000,
            scratch1: 0x80000,
        }
    }
}

/// What happens to traffic from a pod to its own host after the pod's egress policy allowed it
/// (felix's DefaultEndpointToHostAction). Policy-only deployments use ACCEPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointToHostAction {
    Accept,
    Drop,
    Return,
}

/// felix's IptablesFilterAllowAction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllowAction {
    Accept,
    Return,
}

/// felix's IptablesFilterDenyAction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyAction {
    Drop,
    Reject,
}

/// felix's ChainInsertMode: where our jumps go in the kernel chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainInsertMode {
    Insert,
    Append,
}

/// Everything rendering depends on besides the objects themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleConfig {
    /// Host-side interface prefixes of pod veths (felix's InterfacePrefix list).
    pub interface_prefixes: Vec<String>,
    pub marks: MarkBits,
    pub endpoint_to_host_action: EndpointToHostAction,
    pub allow_action: AllowAction,
    pub deny_action: DenyAction,
    pub insert_mode: ChainInsertMode,
    /// Bridge mode: the Linux bridge the pods' host veths are ports of (flannel's `cni0`, the
    /// CNI `bridge` plugin). `None` is routed mode: each pod has its own routed host veth.
    /// See [`bridge`] for what changes.
    pub bridge: Option<String>,
    /// Deny logging: an NFLOG rule before every drop policy makes (see
    /// [`deny_log::logged_drop`]). `None` renders no log rule anywhere.
    pub deny_log: Option<deny_log::DenyLogConfig>,
    /// Flow logging: an NFLOG copy of each new connection at the rule that decides it (see
    /// [`flow_log`]). `None` renders no flow-log rule anywhere.
    pub flow_log: Option<flow_log::FlowLogConfig>,
    /// Anti-spoofing: each pod's `cali-fw-` chain first drops packets whose source is not one
    /// of the pod's own addresses (felix's `WorkloadSourceSpoofing=Disabled`, see
    /// `chains::source_check`). Off only for CNIs whose pods legitimately send from other
    /// addresses.
    pub workload_source_check: bool,
    /// kube-proxy's IPVS mode (see [`ipvs`]): tag in `INPUT`, judge in `OUTPUT`. `None`
    /// renders nothing of it.
    pub kube_ipvs: Option<ipvs::IpvsConfig>,
    /// Workloads selected by at least this many NetworkPolicies in a direction match that
    /// direction's allows with one union set before the per-policy jumps (see [`union`]);
    /// 0 never does.
    pub policy_union_min: usize,
    /// Set only while `FELIX_INTERFACENAMESCHEME=auto` has not seen how this node wires pods:
    /// the node's pod ranges and the configured interface prefixes, closed to every address
    /// that is no known pod then (see [`guard`]). `None` renders nothing.
    pub pending: Option<guard::PendingWiring>,
}

impl Default for RuleConfig {
    fn default() -> Self {
        RuleConfig {
            interface_prefixes: vec!["cali".to_string()],
            marks: MarkBits::default(),
            endpoint_to_host_action: EndpointToHostAction::Accept,
            allow_action: AllowAction::Accept,
            deny_action: DenyAction::Drop,
            insert_mode: ChainInsertMode::Insert,
            bridge: None,
            deny_log: None,
            flow_log: None,
            workload_source_check: true,
            kube_ipvs: None,
            policy_union_min: union::DEFAULT_MIN_POLICIES,
            pending: None,
        }
    }
}

/// What a drop of ours does: felix's deny action (every policy, dispatch and static drop).
pub(crate) fn deny(cfg: &RuleConfig) -> Action {
    match cfg.deny_action {
        DenyAction::Drop => Action::Drop,
        DenyAction::Reject => Action::Reject,
    }
}

/// A rule's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Accept,
    Drop,
    Reject,
    Return,
    Jump(String),
    Goto(String),
    /// `-j MARK --set-xmark value/mask`: the bits of `mask` take the values in `value`.
    SetMark {
        value: u32,
        mask: u32,
    },
    /// `-j NFLOG ...`: copy the packet to an NFLOG group (deny logging, see
    /// [`deny_log::logged_drop`]).
    Nflog(deny_log::NflogTarget),
    /// A rule with no target (only counts packets); used for comment-only policy chains.
    None,
}

/// One rule before rendering. Matches are already-formatted iptables arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub src: Option<IpNet>,
    /// `! -s <src>`: the rule matches packets whose source is *not* in `src`.
    pub src_negated: bool,
    pub dst: Option<IpNet>,
    pub in_iface: Option<String>,
    pub out_iface: Option<String>,
    pub protocol: Option<&'static str>,
    pub comments: Vec<String>,
    pub matches: Vec<String>,
    pub action: Option<Action>,
}

impl Rule {
    pub fn new(action: Action) -> Rule {
        Rule {
            action: Some(action),
            ..Rule::default()
        }
    }
    pub fn comment(mut self, text: impl Into<String>) -> Rule {
        self.comments.push(text.into());
        self
    }
    pub fn matching(mut self, m: impl Into<String>) -> Rule {
        self.matches.push(m.into());
        self
    }
    pub fn mark_match(self, value: u32, mask: u32) -> Rule {
        self.matching(format!("-m mark --mark {value:#x}/{mask:#x}"))
    }
    pub fn in_iface(mut self, iface: impl Into<String>) -> Rule {
        self.in_iface = Some(iface.into());
        self
    }
    pub fn out_iface(mut self, iface: impl Into<String>) -> Rule {
        self.out_iface = Some(iface.into());
        self
    }
}

/// A rule rendered for one chain, with its `cali:` hash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RenderedRule {
    pub hash: String,
    /// Everything after `-A <chain> `, in `iptables-save` form, hash comment included.
    pub body: String,
}

/// A chain we own, fully rendered.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Chain {
    pub name: String,
    pub rules: Vec<RenderedRule>,
}

impl Chain {
    /// Renders `rules` for chain `name`, giving each a hash of its chain, its text and its
    /// occurrence among identical rules (so duplicates such as repeated "Return if policy
    /// accepted" rules still get distinct hashes).
    pub fn new(name: impl Into<String>, family: IpFamily, rules: Vec<Rule>) -> Chain {
        // Escaped like every jump to it (see `token`): a declaration and its jumps agree.
        let name = token::chain_token(&name.into()).into_owned();
        let rules = render_rules(&name, family, &rules);
        Chain { name, rules }
    }
}

/// Renders rules, hashing them under `hash_scope` (the chain's name; felix hashes appended
/// kernel rules under `<chain>*appends*` so they never collide with inserted ones).
pub fn render_rules(hash_scope: &str, family: IpFamily, rules: &[Rule]) -> Vec<RenderedRule> {
    let mut seen: HashMap<String, u32> = HashMap::new();
    rules
        .iter()
        .map(|rule| {
            let unhashed = render_body(rule, family, None);
            let occurrence = seen.entry(unhashed.clone()).or_insert(0);
            let hash = rule_hash(hash_scope, &unhashed, *occurrence);
            *occurrence += 1;
            RenderedRule {
                body: render_body(rule, family, Some(&hash)),
                hash,
            }
        })
        .collect()
}

fn rule_hash(scope: &str, body: &str, occurrence: u32) -> String {
    let mut h = Sha224::new();
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(body.as_bytes());
    h.update([0]);
    h.update(occurrence.to_be_bytes());
    let mut encoded = URL_SAFE_NO_PAD.encode(h.finalize());
    encoded.truncate(RULE_HASH_LEN);
    encoded
}

/// Comments keep to felix's safe character set and length, so they survive a save/restore
/// round trip unchanged.
pub fn sanitize_comment(text: &str) -> String {
    text.chars()
        .take(MAX_COMMENT_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _@%+=:,./-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn render_body(rule: &Rule, family: IpFamily, hash: Option<&str>) -> String {
    let mut out = String::new();
    let mut arg = |s: &str| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(s);
    };
    if let Some(src) = rule.src.filter(|n| n.prefix_len() > 0) {
        if rule.src_negated {
            arg(&format!("! -s {src}"));
        } else {
            arg(&format!("-s {src}"));
        }
    }
    if let Some(dst) = rule.dst.filter(|n| n.prefix_len() > 0) {
        arg(&format!("-d {dst}"));
    }
    if let Some(i) = &rule.in_iface {
        arg(&format!("-i {}", token::token(i)));
    }
    if let Some(o) = &rule.out_iface {
        arg(&format!("-o {}", token::token(o)));
    }
    if let Some(p) = rule.protocol {
        arg(&format!("-p {p}"));
    }
    if let Some(h) = hash {
        arg(&format!("-m comment --comment \"{RULE_HASH_PREFIX}{h}\""));
    }
    for c in &rule.comments {
        arg(&format!(
            "-m comment --comment {}",
            token::save_string(&sanitize_comment(c))
        ));
    }
    for m in &rule.matches {
        arg(m);
    }
    if let Some(action) = &rule.action {
        let target = action_text(action, family);
        if !target.is_empty() {
            arg(&target);
        }
    }
    out
}

/// A target as iptables-save prints it (`-j DROP`, `-g chain`, ...); empty for
/// [`Action::None`].
pub fn action_text(action: &Action, family: IpFamily) -> String {
    match action {
        Action::None => String::new(),
        Action::Accept => "-j ACCEPT".into(),
        Action::Drop => "-j DROP".into(),
        Action::Reject => match family {
            IpFamily::V4 => "-j REJECT --reject-with icmp-port-unreachable".into(),
            IpFamily::V6 => "-j REJECT --reject-with icmp6-port-unreachable".into(),
        },
        Action::Return => "-j RETURN".into(),
        Action::Jump(c) => format!("-j {}", token::chain_token(c)),
        Action::Goto(c) => format!("-g {}", token::chain_token(c)),
        Action::Nflog(target) => target.text().to_string(),
        Action::SetMark { value, mask } => {
            let mut s = String::new();
            let _ = write!(s, "-j MARK --set-xmark {value:#x}/{mask:#x}");
            s
        }
    }
}

/// felix's `GetLengthLimitedID`: `prefix + suffix` when it fits in `max` characters, else
/// `prefix + "_" + base64url(sha256(suffix))` cut to `max`. A suffix that would fill the
/// name exactly and starts with `_` is hashed too, so it cannot collide with a hashed name.
/// Ours, not felix's: a suffix that is not a safe token (`token::is_safe_token`) is hashed
/// whatever its length, so no name of ours carries unchecked text into a restore script.
pub fn length_limited_name(prefix: &str, suffix: &str, max: usize) -> String {
    let suffix = if suffix.is_empty() { "_" } else { suffix };
    let total = prefix.len() + suffix.len();
    let fits = total < max || (total == max && !suffix.starts_with('_'));
    if fits && token::is_safe_token(suffix) {
        return format!("{prefix}{suffix}");
    }
    let hash = URL_SAFE_NO_PAD.encode(Sha256::digest(suffix.as_bytes()));
    let keep = max.saturating_sub(prefix.len() + 1);
    format!("{prefix}_{}", &hash[..keep.min(hash.len())])
}

pub fn to_workload_chain(iface: &str) -> String {
    length_limited_name(TO_WORKLOAD_PREFIX, iface, MAX_CHAIN_NAME_LEN)
}

pub fn from_workload_chain(iface: &str) -> String {
    length_limited_name(FROM_WORKLOAD_PREFIX, iface, MAX_CHAIN_NAME_LEN)
}

/// Policy chains are named after felix v3.32's policy ID, `knp/<namespace>/<name>`.
pub fn policy_chain(direction: Direction, namespace: &str, name: &str) -> String {
    let prefix = match direction {
        Direction::Ingress => POLICY_INGRESS_PREFIX,
        Direction::Egress => POLICY_EGRESS_PREFIX,
    };
    length_limited_name(
        prefix,
        &format!("knp/{namespace}/{name}"),
        MAX_CHAIN_NAME_LEN,
    )
}

/// The namespace profile chain (`kns.<ns>`) that allows everything for pods no policy
/// isolates.
pub fn profile_chain(direction: Direction, namespace: &str) -> String {
    let prefix = match direction {
        Direction::Ingress => PROFILE_INGRESS_PREFIX,
        Direction::Egress => PROFILE_EGRESS_PREFIX,
    };
    length_limited_name(prefix, &format!("kns.{namespace}"), MAX_CHAIN_NAME_LEN)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_bits_follow_the_mask() {
        assert_eq!(
            MarkBits::from_mask(0xffff0000).unwrap(),
            MarkBits::default()
        );
        let m = MarkBits::from_mask(0x0f00_0000).unwrap();
        assert_eq!(
            (m.accept, m.pass, m.scratch0, m.scratch1),
            (0x0100_0000, 0x0200_0000, 0x0400_0000, 0x0800_0000)
        );
        assert!(MarkBits::from_mask(0x7).is_err());
    }

    #[test]
    fn length_limited_names_match_felix_rules() {
        assert_eq!(
            length_limited_name("cali-tw-", "cali82111e10a96", 28),
            "cali-tw-cali82111e10a96"
        );
        let long = policy_chain(Direction::Ingress, "default", "allow-web");
        assert_eq!(long.len(), 28);
        assert!(long.starts_with("cali-pi-_"), "{long}");
        assert_eq!(policy_chain(Direction::Egress, "x", "p"), "cali-po-knp/x/p");
        // Exactly 28 characters: kept unless the suffix starts with "_".
        assert_eq!(
            length_limited_name("cali-pi-", &"a".repeat(20), 28).len(),
            28
        );
        assert!(length_limited_name("cali-pi-", &"a".repeat(20), 28).ends_with("aaaa"));
        assert!(
            length_limited_name("cali-pi-", &format!("_{}", "a".repeat(19)), 28)
                .starts_with("cali-pi-_")
        );
        assert_ne!(
            length_limited_name("cali-pi-", &format!("_{}", "a".repeat(19)), 28),
            format!("cali-pi-_{}", "a".repeat(19))
        );
        assert_eq!(
            profile_chain(Direction::Ingress, "default"),
            "cali-pri-kns.default"
        );
    }

    #[test]
    fn rendering_is_iptables_save_form() {
        let rule = Rule {
            src: Some("10.16.2.0/24".parse().unwrap()),
            protocol: Some("tcp"),
            ..Rule::new(Action::SetMark {
                value: 0x10000,
                mask: 0x10000,
            })
        }
        .matching("-m multiport --dports 3456")
        .mark_match(0x40000, 0x40000);
        let chain = Chain::new("cali-pi-x", IpFamily::V4, vec![rule]);
        let body = &chain.rules[0].body;
        assert!(body.starts_with("-s 10.16.2.0/24 -p tcp -m comment --comment \"cali:"));
        assert!(body.ends_with(
            "-m multiport --dports 3456 -m mark --mark 0x40000/0x40000 -j MARK --set-xmark 0x10000/0x10000"
        ));
        assert_eq!(chain.rules[0].hash.len(), 16);
    }

    #[test]
    fn identical_rules_get_distinct_stable_hashes() {
        let r = || Rule::new(Action::Return).mark_match(0x10000, 0x10000);
        let a = Chain::new("c", IpFamily::V4, vec![r(), r()]);
        assert_ne!(a.rules[0].hash, a.rules[1].hash);
        // A rule inserted in front keeps the others' hashes: the writer relies on it.
        let b = Chain::new("c", IpFamily::V4, vec![Rule::new(Action::Drop), r(), r()]);
        assert_eq!(a.rules[0].hash, b.rules[1].hash);
        assert_eq!(a.rules[1].hash, b.rules[2].hash);
        // Same text in another chain hashes differently.
        let c = Chain::new("d", IpFamily::V4, vec![r()]);
        assert_ne!(a.rules[0].hash, c.rules[0].hash);
    }

    #[test]
    fn comments_are_sanitized() {
        assert_eq!(sanitize_comment("a\"b;c d"), "a_b_c d");
        assert_eq!(sanitize_comment(&"x".repeat(300)).len(), 256);
    }
}
