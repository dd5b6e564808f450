//! The iptables text of a deny-log rule, "NFLOG to group G with prefix P, rate-limited", in
//! the exact form `iptables-save` prints it (legacy and nft backends, IPv4 and IPv6 alike), and
//! the prefix grammar that tells the reader which chain dropped the packet. Pure.
//!
//! The rule goes right before a drop the agent renders and matches what that drop matches:
//! `-m limit --limit <rate> --limit-burst <burst> -j NFLOG --nflog-prefix <P> --nflog-group <G>
//! --nflog-size <snap>`.
//!
//! Why `-m limit` and not `-m hashlimit`: we render one NFLOG rule per pod chain and direction
//! (`cali-tw-*` ingress, `cali-fw-*` egress), and a `limit` match is one token bucket per rule,
//! so it already is "per pod and direction", with no hash table, no `/proc/net/ipt_hashlimit`
//! entry, and no table name to keep unique (hashlimit rules sharing a `--hashlimit-name` share
//! one table whatever their other options). `hashlimit` would only be needed for one rule that
//! serves many pods; the dispatch chains' "Unknown interface" drop is such a rule, and one
//! shared bucket per direction is the intended behaviour there (pods not programmed yet are
//! transient, and their flood must not buy more log lines than a programmed pod's).
//!
//! Canonical forms, from the iptables extensions' save functions:
//! - `limit` stores the rate as a period in 1/10000 s units (`10000 * unit / count`, integer
//!   division) and prints it back in the largest unit that shows it exactly, so `120/minute`
//!   prints as `2/sec`; [`Rate::canonical`] computes what will be printed. `--limit-burst` is
//!   printed only when it is not the default 5.
//! - `NFLOG` prints `--nflog-prefix`, then `--nflog-group` (left out for group 0), then
//!   `--nflog-size`. A prefix made only of `[A-Za-z0-9_-]` is printed bare, anything else in
//!   double quotes.
//! - The prefix field of the legacy target is 64 bytes with its terminating NUL, so 63
//!   characters is the most both backends keep: legacy cuts a 64-character prefix to 63 while
//!   nft keeps 64, and the two would print different rules.
//!
//! Deny logs at two layers: the NFLOG rule text in `rules::deny_log`, the reader of what those
//! rules send in `traffic::deny_log`.

use std::fmt;

use crate::rules::provenance::{RuleList, RuleRole};
use crate::rules::{Action, Direction, Rule};

/// Longest prefix both backends store and print identically.
pub const MAX_PREFIX_LEN: usize = 63;
/// Bytes of each logged packet copied to the reader: an IPv6 header with a few extension
/// headers and the transport ports fit.
pub const DEFAULT_SNAP_LEN: u32 = 128;
/// `-m limit`'s burst when none is given (then not printed by iptables-save).
pub const DEFAULT_BURST: u32 = 5;
/// `-m limit` stores periods in units of 1/10000 s.
const LIMIT_SCALE: u64 = 10_000;
const MAX_BURST: u32 = 10_000;
/// `xt_limit` turns period x burst into "credits" in 32 bits: (period x burst / 10000) x HZ x
/// CREDITS_PER_JIFFY, where HZ x CREDITS_PER_JIFFY is at most 38400 over the HZ values Linux
/// builds with (300 x 128); a larger product wraps and the kernel refuses the rule (or, when
/// the wrap happens to look larger, keeps a wrong bucket). Below this bound it fits for every
/// HZ.
const MAX_PERIOD_TIMES_BURST: u64 = (u32::MAX as u64 / 38_400) * LIMIT_SCALE;
/// Marks our prefixes among whatever else logs to NFLOG.
const PREFIX_TAG: &str = "npa";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleTextError {
    PrefixTooLong { prefix: String, len: usize },
    PrefixEmpty,
    PrefixCharacter { prefix: String, character: char },
    NotOurPrefix(String),
    ZeroRate,
    RateTooFast { count: u32, unit: RateUnit },
    Burst { burst: u32 },
    BurstOverflow { rate: String, burst: u32 },
    ZeroSnapLength,
}

impl fmt::Display for RuleTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleTextError::PrefixTooLong { prefix, len } => write!(
                f,
                "NFLOG prefix {prefix:?} is {len} characters; at most {MAX_PREFIX_LEN} survive both iptables backends"
            ),
            RuleTextError::PrefixEmpty => write!(f, "NFLOG prefix is empty"),
            RuleTextError::PrefixCharacter { prefix, character } => write!(
                f,
                "NFLOG prefix {prefix:?} contains {character:?}; only printable ASCII other than quotes, backslash and space is allowed"
            ),
            RuleTextError::NotOurPrefix(p) => {
                write!(f, "NFLOG prefix {p:?} is not one netpol-agent renders")
            }
            RuleTextError::ZeroRate => write!(f, "a log rate of 0 packets logs nothing"),
            RuleTextError::RateTooFast { count, unit } => write!(
                f,
                "log rate {count}/{} is faster than -m limit can express (10000/second)",
                unit.name()
            ),
            RuleTextError::Burst { burst } => {
                write!(f, "log burst {burst} is outside 1..={MAX_BURST}")
            }
            RuleTextError::BurstOverflow { rate, burst } => write!(
                f,
                "log rate {rate} with burst {burst} overflows the kernel's token bucket; lower the burst or raise the rate"
            ),
            RuleTextError::ZeroSnapLength => {
                write!(f, "an NFLOG snap length of 0 copies no packet to decode")
            }
        }
    }
}

impl std::error::Error for RuleTextError {}

/// Which drop a log rule precedes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropKind {
    /// A pod chain's "Drop if no policies passed packet": policy isolates the pod in this
    /// direction and nothing allowed the packet.
    Policy,
    /// A dispatch chain's "Unknown interface": the pod is not programmed yet.
    UnknownInterface,
    /// A Deny rule of a ClusterNetworkPolicy chain (`cali-pi-kcnp...` / `cali-po-kcnp...`).
    Cluster,
}

impl DropKind {
    fn tag(self) -> &'static str {
        match self {
            DropKind::Policy => "pol",
            DropKind::UnknownInterface => "unk",
            DropKind::Cluster => "cnp",
        }
    }
}

fn direction_tag(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "in",
        Direction::Egress => "eg",
    }
}

/// What an NFLOG prefix of ours says: `npa-<pol|unk|cnp>-<in|eg>-<chain>`, for example
/// `npa-pol-in-cali-tw-cali1234567890a` (34 characters; a 28-character chain name, the
/// longest iptables allows, gives 39).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LogPrefix {
    pub kind: DropKind,
    pub direction: Direction,
    /// The chain whose drop this logs.
    pub chain: String,
}

impl LogPrefix {
    pub fn render(&self) -> Result<String, RuleTextError> {
        let prefix = format!(
            "{PREFIX_TAG}-{}-{}-{}",
            self.kind.tag(),
            direction_tag(self.direction),
            self.chain
        );
        check_prefix(&prefix)?;
        Ok(prefix)
    }

    /// Reads a prefix the kernel reported back.
    pub fn parse(prefix: &str) -> Result<LogPrefix, RuleTextError> {
        let not_ours = || RuleTextError::NotOurPrefix(prefix.to_string());
        let mut parts = prefix.splitn(4, '-');
        if parts.next() != Some(PREFIX_TAG) {
            return Err(not_ours());
        }
        let kind = match parts.next() {
            Some("pol") => DropKind::Policy,
            Some("unk") => DropKind::UnknownInterface,
            Some("cnp") => DropKind::Cluster,
            _ => return Err(not_ours()),
        };
        let direction = match parts.next() {
            Some("in") => Direction::Ingress,
            Some("eg") => Direction::Egress,
            _ => return Err(not_ours()),
        };
        match parts.next() {
            Some(chain) if !chain.is_empty() => Ok(LogPrefix {
                kind,
                direction,
                chain: chain.to_string(),
            }),
            _ => Err(not_ours()),
        }
    }
}

fn check_prefix(prefix: &str) -> Result<(), RuleTextError> {
    if prefix.is_empty() {
        return Err(RuleTextError::PrefixEmpty);
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(RuleTextError::PrefixCharacter {
            prefix: prefix.to_string(),
            character: c,
        });
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(RuleTextError::PrefixTooLong {
            prefix: prefix.to_string(),
            len: prefix.len(),
        });
    }
    Ok(())
}

/// How iptables-save writes a string argument: bare when made of `[A-Za-z0-9_-]` only,
/// else in double quotes (the characters that would need escaping are refused earlier).
fn save_string(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        s.to_string()
    } else {
        format!("\"{s}\"")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateUnit {
    Second,
    Minute,
    Hour,
    Day,
}

impl RateUnit {
    fn seconds(self) -> u64 {
        match self {
            RateUnit::Second => 1,
            RateUnit::Minute => 60,
            RateUnit::Hour => 3600,
            RateUnit::Day => 86_400,
        }
    }

    /// The name iptables-save prints.
    fn name(self) -> &'static str {
        match self {
            RateUnit::Second => "sec",
            RateUnit::Minute => "min",
            RateUnit::Hour => "hour",
            RateUnit::Day => "day",
        }
    }
}

/// An average rate: `count` packets per `unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub count: u32,
    pub unit: RateUnit,
}

impl Rate {
    pub fn per_second(count: u32) -> Rate {
        Rate {
            count,
            unit: RateUnit::Second,
        }
    }

    /// The period the kernel stores, in 1/10000 s.
    fn period(self) -> Result<u32, RuleTextError> {
        if self.count == 0 {
            return Err(RuleTextError::ZeroRate);
        }
        let period = LIMIT_SCALE * self.unit.seconds() / u64::from(self.count);
        if period == 0 {
            return Err(RuleTextError::RateTooFast {
                count: self.count,
                unit: self.unit,
            });
        }
        Ok(period as u32)
    }

    /// The rate as iptables-save prints it back (`10/sec`, `2/sec` for 120/minute, `3/min`).
    pub fn canonical(self) -> Result<String, RuleTextError> {
        let period = u64::from(self.period()?);
        // Walk from the largest unit down and stop before the first one that cannot show the
        // period exactly enough (the same test the limit extension's printer makes).
        let units = [
            RateUnit::Day,
            RateUnit::Hour,
            RateUnit::Minute,
            RateUnit::Second,
        ];
        let mut chosen = units[0];
        for unit in units {
            let mult = LIMIT_SCALE * unit.seconds();
            if unit != RateUnit::Day && (period > mult || mult / period < mult % period) {
                break;
            }
            chosen = unit;
        }
        let mult = LIMIT_SCALE * chosen.seconds();
        Ok(format!("{}/{}", mult / period, chosen.name()))
    }
}

/// `-m limit --limit <rate> [--limit-burst <burst>]` as iptables-save prints it.
pub fn limit_match(rate: Rate, burst: u32) -> Result<String, RuleTextError> {
    let canonical = rate.canonical()?;
    if burst == 0 || burst > MAX_BURST {
        return Err(RuleTextError::Burst { burst });
    }
    if u64::from(rate.period()?) * u64::from(burst) > MAX_PERIOD_TIMES_BURST {
        return Err(RuleTextError::BurstOverflow {
            rate: canonical,
            burst,
        });
    }
    Ok(if burst == DEFAULT_BURST {
        format!("-m limit --limit {canonical}")
    } else {
        format!("-m limit --limit {canonical} --limit-burst {burst}")
    })
}

/// `-j NFLOG --nflog-prefix <prefix> [--nflog-group <group>] --nflog-size <snap>` as
/// iptables-save prints it.
pub fn nflog_target(group: u16, prefix: &str, snap_len: u32) -> Result<String, RuleTextError> {
    check_prefix(prefix)?;
    if snap_len == 0 {
        return Err(RuleTextError::ZeroSnapLength);
    }
    let mut out = format!("-j NFLOG --nflog-prefix {}", save_string(prefix));
    if group != 0 {
        out.push_str(&format!(" --nflog-group {group}"));
    }
    out.push_str(&format!(" --nflog-size {snap_len}"));
    Ok(out)
}

/// Everything a deny-log rule needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenyLogRule {
    pub group: u16,
    pub prefix: LogPrefix,
    pub rate: Rate,
    pub burst: u32,
    pub snap_len: u32,
}

impl DenyLogRule {
    /// The rule's matches and target (everything after the drop's own matches), e.g.
    /// `-m limit --limit 10/sec --limit-burst 20 -j NFLOG --nflog-prefix
    /// npa-pol-in-cali-tw-cali1234567890a --nflog-group 1 --nflog-size 128`. The caller puts
    /// the same matches in front as the drop it precedes has (its mark match), after the
    /// rule's comments, as the agent renders every rule.
    pub fn render(&self) -> Result<String, RuleTextError> {
        Ok(format!(
            "{} {}",
            limit_match(self.rate, self.burst)?,
            nflog_target(self.group, &self.prefix.render()?, self.snap_len)?
        ))
    }
}

/// Deny logging as the renderer needs it (`RuleConfig::deny_log`; `None` there renders no log
/// rule at all). Built through [`DenyLogConfig::new`], which checks everything that could make
/// a log rule unrenderable, so rendering never fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenyLogConfig {
    group: u16,
    rate: Rate,
    burst: u32,
    snap_len: u32,
    /// `-m limit ...`, rendered once.
    limit: String,
}

impl DenyLogConfig {
    pub fn new(group: u16, rate: Rate, burst: u32, snap_len: u32) -> Result<Self, RuleTextError> {
        let limit = limit_match(rate, burst)?;
        if snap_len == 0 {
            return Err(RuleTextError::ZeroSnapLength);
        }
        Ok(DenyLogConfig {
            group,
            rate,
            burst,
            snap_len,
            limit,
        })
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    pub fn snap_len(&self) -> u32 {
        self.snap_len
    }
}

/// A validated `-j NFLOG --nflog-prefix <P> [--nflog-group <G>] --nflog-size <S>` target, as
/// iptables-save prints it ([`Action::Nflog`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NflogTarget {
    text: String,
}

impl NflogTarget {
    pub fn new(group: u16, prefix: &str, snap_len: u32) -> Result<NflogTarget, RuleTextError> {
        Ok(NflogTarget {
            text: nflog_target(group, prefix, snap_len)?,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

/// The reusable step every deny goes through: `drop`, preceded by its rate-limited NFLOG rule
/// when deny logging is configured, else `drop` alone (so with logging off the chain is exactly
/// what it was). The log rule matches what the drop matches (addresses, interfaces, protocol,
/// comments, matches), then `-m limit`, and logs with the prefix naming `chain`, `kind` and
/// `direction`; the drop itself is unchanged.
///
/// A chain name too long for the prefix cannot occur (chains are at most 28 characters, the
/// prefix allows 52); should one reach here, the drop is rendered without its log rule rather
/// than not at all.
pub fn logged_drop(
    cfg: Option<&DenyLogConfig>,
    drop: Rule,
    kind: DropKind,
    direction: Direction,
    chain: &str,
) -> Vec<Rule> {
    let Some(cfg) = cfg else {
        return vec![drop];
    };
    let prefix = LogPrefix {
        kind,
        direction,
        chain: chain.to_string(),
    };
    let Ok(target) = prefix
        .render()
        .and_then(|p| NflogTarget::new(cfg.group, &p, cfg.snap_len))
    else {
        return vec![drop];
    };
    let log = Rule {
        action: Some(Action::Nflog(target)),
        ..drop.clone()
    }
    .matching(cfg.limit.clone());
    vec![log, drop]
}

/// [`logged_drop`] into a traced rule list: the log rule is a [`RuleRole::DenyLog`], the drop
/// keeps `role`.
pub(crate) fn push_logged_drop(
    rules: &mut RuleList,
    cfg: Option<&DenyLogConfig>,
    drop: Rule,
    kind: DropKind,
    direction: Direction,
    chain: &str,
    role: impl FnOnce() -> RuleRole,
) {
    let mut logged = logged_drop(cfg, drop, kind, direction, chain);
    let drop = logged.pop().expect("logged_drop returns the drop last");
    for log in logged {
        rules.push(log, || RuleRole::DenyLog);
    }
    rules.push(drop, role);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(kind: DropKind, direction: Direction, chain: &str) -> LogPrefix {
        LogPrefix {
            kind,
            direction,
            chain: chain.into(),
        }
    }

    #[test]
    fn prefixes_render_and_parse_back() {
        let p = prefix(
            DropKind::Policy,
            Direction::Ingress,
            "cali-tw-cali1234567890a",
        );
        let text = p.render().unwrap();
        assert_eq!(text, "npa-pol-in-cali-tw-cali1234567890a");
        assert_eq!(LogPrefix::parse(&text).unwrap(), p);
        let u = prefix(
            DropKind::UnknownInterface,
            Direction::Egress,
            "cali-from-wl-dispatch",
        );
        assert_eq!(u.render().unwrap(), "npa-unk-eg-cali-from-wl-dispatch");
        assert_eq!(LogPrefix::parse(&u.render().unwrap()).unwrap(), u);
        // The longest chain name iptables allows still fits.
        let longest = prefix(DropKind::Policy, Direction::Egress, &"x".repeat(28));
        assert_eq!(longest.render().unwrap().len(), 39);
    }

    #[test]
    fn foreign_or_broken_prefixes_are_refused() {
        for p in [
            "",
            "npa",
            "npa-pol",
            "npa-pol-in",
            "npa-pol-in-",
            "npa-xxx-in-c",
            "npa-pol-up-c",
            "ulogd: drop",
        ] {
            assert!(LogPrefix::parse(p).is_err(), "{p:?}");
        }
        let long = prefix(DropKind::Policy, Direction::Egress, &"y".repeat(60));
        assert!(matches!(
            long.render(),
            Err(RuleTextError::PrefixTooLong { len: 71, .. })
        ));
        let spaced = prefix(DropKind::Policy, Direction::Egress, "a b");
        assert!(matches!(
            spaced.render(),
            Err(RuleTextError::PrefixCharacter { character: ' ', .. })
        ));
        assert!(nflog_target(1, "a\"b", 128).is_err());
        assert!(nflog_target(1, &"z".repeat(64), 128).is_err());
        assert!(nflog_target(1, &"z".repeat(63), 128).is_ok());
        assert!(nflog_target(1, "p", 0).is_err());
    }

    #[test]
    fn rates_print_as_iptables_prints_them() {
        let cases = [
            (Rate::per_second(10), "10/sec"),
            (Rate::per_second(1), "1/sec"),
            (Rate::per_second(3), "3/sec"),
            (Rate::per_second(10_000), "10000/sec"),
            (
                Rate {
                    count: 120,
                    unit: RateUnit::Minute,
                },
                "2/sec",
            ),
            (
                Rate {
                    count: 3,
                    unit: RateUnit::Minute,
                },
                "3/min",
            ),
            (
                Rate {
                    count: 60,
                    unit: RateUnit::Hour,
                },
                "1/min",
            ),
            (
                Rate {
                    count: 7,
                    unit: RateUnit::Hour,
                },
                "7/hour",
            ),
            (
                Rate {
                    count: 1,
                    unit: RateUnit::Day,
                },
                "1/day",
            ),
            (
                Rate {
                    count: 48,
                    unit: RateUnit::Day,
                },
                "2/hour",
            ),
        ];
        for (rate, text) in cases {
            assert_eq!(rate.canonical().unwrap(), text, "{rate:?}");
        }
        assert_eq!(
            Rate::per_second(0).canonical(),
            Err(RuleTextError::ZeroRate)
        );
        assert!(matches!(
            Rate::per_second(10_001).canonical(),
            Err(RuleTextError::RateTooFast { .. })
        ));
    }

    #[test]
    fn canonical_rates_are_fixed_points() {
        // Printing the canonical form's own period gives the same text back, for every rate
        // per second and per minute an operator could configure.
        for unit in [RateUnit::Second, RateUnit::Minute] {
            for count in 1..=2000 {
                let rate = Rate { count, unit };
                let Ok(text) = rate.canonical() else { continue };
                let (n, u) = text.split_once('/').unwrap();
                let unit2 = match u {
                    "sec" => RateUnit::Second,
                    "min" => RateUnit::Minute,
                    "hour" => RateUnit::Hour,
                    _ => RateUnit::Day,
                };
                let again = Rate {
                    count: n.parse().unwrap(),
                    unit: unit2,
                };
                assert_eq!(again.canonical().unwrap(), text, "{rate:?}");
            }
        }
    }

    #[test]
    fn limit_and_target_text() {
        assert_eq!(
            limit_match(Rate::per_second(10), 20).unwrap(),
            "-m limit --limit 10/sec --limit-burst 20"
        );
        assert_eq!(
            limit_match(Rate::per_second(10), DEFAULT_BURST).unwrap(),
            "-m limit --limit 10/sec"
        );
        assert_eq!(
            limit_match(Rate::per_second(10), 0),
            Err(RuleTextError::Burst { burst: 0 })
        );
        assert!(limit_match(Rate::per_second(10), 10_001).is_err());
        // 1/day is a period of 864000000 (1/10000 s). The kernel refuses a burst of 2 of
        // them (its credits overflow 32 bits), accepts 3 (the wrap happens to look larger)
        // and refuses 4; we refuse from 2 on, for every HZ.
        let daily = Rate {
            count: 1,
            unit: RateUnit::Day,
        };
        for burst in [2, 3, 4] {
            assert!(matches!(
                limit_match(daily, burst),
                Err(RuleTextError::BurstOverflow { .. })
            ));
        }
        assert!(limit_match(daily, 1).is_ok());
        let per_minute = Rate {
            count: 1,
            unit: RateUnit::Minute,
        };
        // 600000 x 1864 fits; at 1865 the credits could wrap on a HZ=300 kernel. (The kernel
        // itself accepts up to 10000 here: a product that wraps into a larger number passes
        // its check, with a wrong bucket.)
        assert!(limit_match(per_minute, 1864).is_ok());
        assert!(limit_match(per_minute, 1865).is_err());
        assert_eq!(
            nflog_target(0, "p", 128).unwrap(),
            "-j NFLOG --nflog-prefix p --nflog-size 128"
        );
        assert_eq!(
            nflog_target(5, "cali-tw-x.y|i", 64).unwrap(),
            "-j NFLOG --nflog-prefix \"cali-tw-x.y|i\" --nflog-group 5 --nflog-size 64"
        );
        let rule = DenyLogRule {
            group: 1,
            prefix: prefix(
                DropKind::Policy,
                Direction::Ingress,
                "cali-tw-cali1234567890a",
            ),
            rate: Rate::per_second(10),
            burst: 20,
            snap_len: DEFAULT_SNAP_LEN,
        };
        assert_eq!(
            rule.render().unwrap(),
            "-m limit --limit 10/sec --limit-burst 20 -j NFLOG --nflog-prefix \
             npa-pol-in-cali-tw-cali1234567890a --nflog-group 1 --nflog-size 128"
        );
    }

    fn logging() -> DenyLogConfig {
        DenyLogConfig::new(7, Rate::per_second(10), 20, DEFAULT_SNAP_LEN).unwrap()
    }

    fn bodies(chain: &crate::rules::Chain) -> Vec<String> {
        chain
            .rules
            .iter()
            .map(|r| {
                r.body
                    .replace(&format!("-m comment --comment \"cali:{}\" ", r.hash), "")
                    .replace(&format!("-m comment --comment \"cali:{}\"", r.hash), "")
            })
            .collect()
    }

    #[test]
    fn config_is_checked_once() {
        assert!(DenyLogConfig::new(1, Rate::per_second(0), 5, 128).is_err());
        assert!(DenyLogConfig::new(1, Rate::per_second(10), 0, 128).is_err());
        assert!(DenyLogConfig::new(1, Rate::per_second(10), 5, 0).is_err());
        let c = logging();
        assert_eq!((c.group(), c.burst(), c.snap_len()), (7, 20, 128));
    }

    #[test]
    fn logged_drop_is_the_drop_alone_when_off() {
        let drop = Rule::new(Action::Drop).comment("x").mark_match(0, 0x20000);
        assert_eq!(
            logged_drop(
                None,
                drop.clone(),
                DropKind::Policy,
                Direction::Ingress,
                "c"
            ),
            vec![drop]
        );
    }

    #[test]
    fn logged_drop_copies_the_drops_matches_and_adds_limit_and_target() {
        let drop = Rule {
            in_iface: Some("cali+".into()),
            ..Rule::new(Action::Reject)
                .comment("Drop if no policies passed packet")
                .mark_match(0, 0x20000)
        };
        let rules = logged_drop(
            Some(&logging()),
            drop.clone(),
            DropKind::Policy,
            Direction::Egress,
            "cali-fw-cali1",
        );
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1], drop, "the drop itself is unchanged");
        let chain = crate::rules::Chain::new("cali-fw-cali1", crate::model::IpFamily::V4, rules);
        assert_eq!(
            bodies(&chain)[0],
            "-i cali+ -m comment --comment \"Drop if no policies passed packet\" \
             -m mark --mark 0x0/0x20000 -m limit --limit 10/sec --limit-burst 20 -j NFLOG \
             --nflog-prefix npa-pol-eg-cali-fw-cali1 --nflog-group 7 --nflog-size 128"
        );
    }

    #[test]
    fn every_policy_drop_and_unknown_interface_drop_is_logged_when_on() {
        use crate::model::{IpFamily, ObjectKey};
        use crate::rules::chains::endpoint_chains;
        use crate::rules::dispatch::dispatch_chains;
        use crate::rules::RuleConfig;
        let on = RuleConfig {
            deny_log: Some(logging()),
            ..RuleConfig::default()
        };
        let policies = [ObjectKey::new("ns", "p")];
        let [tw, fw] = endpoint_chains(&on, IpFamily::V4, "cali1", &[], "ns", &policies, &policies);
        for (chain, dir) in [(&tw, "in"), (&fw, "eg")] {
            let b = bodies(chain);
            let drop = b
                .iter()
                .position(|r| {
                    r.contains("Drop if no policies passed packet") && r.ends_with("-j DROP")
                })
                .unwrap();
            assert!(
                b[drop - 1].ends_with(&format!(
                    "-j NFLOG --nflog-prefix npa-pol-{dir}-{} --nflog-group 7 --nflog-size 128",
                    chain.name
                )),
                "{b:#?}"
            );
            // Only that drop is logged: INVALID and the profile's drop are not policy's.
            assert_eq!(b.iter().filter(|r| r.contains("NFLOG")).count(), 1);
        }
        // An unisolated pod has no policy drop, so nothing to log.
        let [tw, _] = endpoint_chains(&on, IpFamily::V4, "cali1", &[], "ns", &[], &[]);
        assert!(!bodies(&tw).iter().any(|r| r.contains("NFLOG")));

        let ifaces: Vec<String> = ["cali12", "cali13", "cali2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let chains = dispatch_chains(&on, IpFamily::V6, &ifaces);
        assert_eq!(chains.len(), 4, "two roots, one child each");
        for chain in &chains {
            let b = bodies(chain);
            let n = b.len();
            assert!(b[n - 1].ends_with("\"Unknown interface\" -j DROP"));
            let dir = if chain.name.starts_with("cali-from") {
                "eg"
            } else {
                "in"
            };
            assert_eq!(
                b[n - 2],
                format!(
                    "-m comment --comment \"Unknown interface\" -m limit --limit 10/sec --limit-burst 20 \
                     -j NFLOG --nflog-prefix npa-unk-{dir}-{} --nflog-group 7 --nflog-size 128",
                    chain.name
                )
            );
        }
        // Off: the same chains as always.
        let off = dispatch_chains(&RuleConfig::default(), IpFamily::V6, &ifaces);
        for (a, b) in off.iter().zip(&chains) {
            assert_eq!(a.rules.len() + 1, b.rules.len());
            assert!(!bodies(a).iter().any(|r| r.contains("NFLOG")));
        }
    }
}
