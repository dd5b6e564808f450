//! A small interpreter of the iptables rule dialect we render, run over what a kernel really
//! holds (`iptables-save` and `ipset save` text, or `compile` output): it follows one packet
//! from a hook chain (`FORWARD`, `INPUT`, `OUTPUT` of the filter table) rule by rule through
//! jumps, gotos and returns, keeping the packet mark, and says what the kernel does with it.
//!
//! Hand-written on purpose: no crate interprets `iptables-save` text, and only the matches
//! and targets our chains use are needed. What it understands: `-s/-d` (with `!`), `-i/-o`
//! (with `+` wildcards), `-p`, `-m comment`, `-m mark --mark`, `-m set --match-set NAME
//! src|dst|dst,dst` (`hash:net`, `hash:ip`, `hash:ip,port`), `-m conntrack --ctstate` and
//! `-m state --state` (the first packet of a connection is NEW), `-m multiport --dports`
//! (ranges too), `-m tcp|udp|sctp --dport`, `--syn`, `-m physdev` (`--physdev-in/-out`,
//! `--physdev-is-bridged/-in/-out`), `-m icmp6`/`-m icmp` (never a TCP/UDP/SCTP packet);
//! targets `ACCEPT`, `DROP`, `REJECT`, `RETURN`, `MARK --set-xmark/--set-mark`, `LOG` and
//! `NFLOG` (they only log), jumps and gotos to chains, and chain policies. Anything else (a
//! match or target of another program, a set type we do not create, an interface the packet's
//! description does not name) is reported as *cannot evaluate* with the rule, never guessed;
//! a rule with such a match that another of its matches rules out is simply not matched.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::kernel_text::ipset_save::{self, SetLine};
use crate::kernel_text::iptables_save::{self, SaveLine};
use crate::model::{IpFamily, Protocol};
use crate::rules::RULE_HASH_PREFIX;

mod read;

pub use read::rule_hash;

/// At most this many rules are looked at for one packet (a loop of jumps ends there).
const MAX_STEPS: usize = 200_000;

/// The filter table as a kernel holds it: chains in order, and the built-in chains'
/// policies.
#[derive(Clone, Debug, Default)]
pub struct Ruleset {
    pub chains: HashMap<String, Vec<KernelRule>>,
    /// `FORWARD` → `ACCEPT`, ...
    pub policies: HashMap<String, String>,
}

/// One rule: its text after `-A CHAIN `, its `cali:` hash when its first comment is one, and
/// what the interpreter makes of it.
#[derive(Clone, Debug)]
pub struct KernelRule {
    pub body: String,
    pub hash: Option<String>,
    parsed: ParsedRule,
}

#[derive(Clone, Debug)]
struct ParsedRule {
    matches: Vec<Match>,
    target: Target,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    None,
    Accept,
    Drop,
    Reject,
    Return,
    Jump(String),
    Goto(String),
    /// `--set-xmark value/mask`: bits of mask are cleared, then value is xored.
    SetXMark(u32, u32),
    /// `--set-mark value/mask`: bits of mask are cleared, then value is ored.
    SetMark(u32, u32),
    /// Logs and continues.
    Log,
    Unknown(String),
}

#[derive(Clone, Debug)]
enum Match {
    Src(bool, IpNet),
    Dst(bool, IpNet),
    In(bool, String),
    Out(bool, String),
    Proto(bool, String),
    Mark(bool, u32, u32),
    Set {
        neg: bool,
        name: String,
        flags: Vec<String>,
    },
    CtState(bool, Vec<String>),
    DPorts(bool, Vec<(u16, u16)>),
    /// multiport `--ports`: source or destination port.
    AnyPorts(bool, Vec<(u16, u16)>),
    Syn(bool),
    PhysIn(bool, String),
    PhysOut(bool, String),
    PhysIsBridged(bool),
    PhysIsIn(bool),
    PhysIsOut(bool),
    /// An ICMP type match: never a TCP, UDP or SCTP packet.
    IcmpType,
    Unknown(String),
}

/// An interface as the packet's description knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Iface {
    /// This interface.
    Named(String),
    /// Some interface that is not a pod's (the uplink): its name is not known here.
    NonPod,
    /// No interface at this hook (`INPUT` has no output interface).
    Absent,
}

impl Iface {
    fn describe(&self) -> String {
        match self {
            Iface::Named(n) => n.clone(),
            Iface::NonPod => "(not a pod interface)".into(),
            Iface::Absent => "-".into(),
        }
    }
}

/// The first packet of a connection as one node's filter table sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub dport: u16,
    pub in_iface: Iface,
    pub out_iface: Iface,
    /// Bridge mode: the bridge port the frame entered by / leaves by.
    pub physdev_in: Option<String>,
    pub physdev_out: Option<String>,
    /// Bridged (both ports known) rather than routed.
    pub bridged: bool,
}

/// What the interpreter needs to know about the node besides its tables.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// Pod interface prefixes (`FELIX_INTERFACEPREFIX`): an interface that is no pod's never
    /// matches a name starting with one of them.
    pub pod_prefixes: Vec<String>,
    /// Bridge mode: the bridge (the uplink is not it).
    pub bridge: Option<String>,
}

/// IP sets as `ipset save` shows them.
#[derive(Clone, Debug, Default)]
pub struct KernelSets {
    pub sets: HashMap<String, KernelSet>,
}

#[derive(Clone, Debug, Default)]
pub struct KernelSet {
    /// `hash:net`, `hash:ip,port`, ...
    pub set_type: String,
    pub family: Option<IpFamily>,
    /// The `add` entries as printed.
    pub entries: Vec<String>,
    hosts: HashSet<IpAddr>,
    nets: Vec<IpNet>,
    ip_ports: HashSet<(IpAddr, Protocol, u16)>,
    /// Entries this interpreter cannot read (then a miss is "cannot evaluate").
    unreadable: Vec<String>,
}

// ---------------------------------------------------------------- evaluation

/// A match's answer: yes, no, or cannot tell (and why).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tri {
    Yes,
    No,
    Unknown(String),
}

fn tri(b: bool) -> Tri {
    if b {
        Tri::Yes
    } else {
        Tri::No
    }
}

fn negate(neg: bool, t: Tri) -> Tri {
    match (neg, t) {
        (false, t) => t,
        (true, Tri::Yes) => Tri::No,
        (true, Tri::No) => Tri::Yes,
        (true, u) => u,
    }
}

fn iface_pattern(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('+') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// `-i`/`-o`/`--physdev-*` against the packet's interface.
fn iface_match(pattern: &str, iface: &Iface, view: &NodeView, which: &str) -> Tri {
    match iface {
        Iface::Named(n) => tri(iface_pattern(pattern, n)),
        Iface::Absent => Tri::No,
        Iface::NonPod => {
            let p = pattern.trim_end_matches('+');
            let only_pods = view
                .pod_prefixes
                .iter()
                .any(|pp| p.starts_with(pp.as_str()));
            if only_pods || view.bridge.as_deref() == Some(pattern) {
                Tri::No
            } else {
                Tri::Unknown(format!(
                    "the packet's {which} interface is not a pod's and its name is not known here, so {pattern} cannot be checked"
                ))
            }
        }
    }
}

fn in_ranges(ranges: &[(u16, u16)], port: u16) -> bool {
    ranges.iter().any(|(a, b)| (*a..=*b).contains(&port))
}

struct Interp<'a> {
    sets: &'a KernelSets,
    view: &'a NodeView,
    packet: &'a Packet,
}

impl Interp<'_> {
    fn eval(&self, m: &Match, mark: u32) -> Tri {
        let p = self.packet;
        match m {
            Match::Src(neg, n) => negate(*neg, tri(n.contains(&p.src))),
            Match::Dst(neg, n) => negate(*neg, tri(n.contains(&p.dst))),
            Match::In(neg, pat) => negate(*neg, iface_match(pat, &p.in_iface, self.view, "input")),
            Match::Out(neg, pat) => {
                negate(*neg, iface_match(pat, &p.out_iface, self.view, "output"))
            }
            Match::Proto(neg, proto) => {
                let number = match p.protocol {
                    Protocol::Tcp => "6",
                    Protocol::Udp => "17",
                    Protocol::Sctp => "132",
                };
                let yes = proto == p.protocol.as_str() || proto == number || proto == "all";
                negate(*neg, tri(yes))
            }
            Match::Mark(neg, value, mask) => negate(*neg, tri(mark & mask == *value)),
            Match::Set { neg, name, flags } => negate(*neg, self.set_match(name, flags)),
            Match::CtState(neg, states) => negate(*neg, tri(states.iter().any(|s| s == "NEW"))),
            Match::DPorts(neg, ranges) => negate(*neg, tri(in_ranges(ranges, p.dport))),
            Match::AnyPorts(neg, ranges) => {
                if in_ranges(ranges, p.dport) {
                    negate(*neg, Tri::Yes)
                } else {
                    Tri::Unknown(
                        "multiport --ports also matches the source port, which is not known".into(),
                    )
                }
            }
            Match::Syn(neg) => negate(*neg, tri(p.protocol == Protocol::Tcp)),
            Match::PhysIn(neg, pat) => negate(
                *neg,
                match &p.physdev_in {
                    Some(port) => tri(iface_pattern(pat, port)),
                    None => Tri::No,
                },
            ),
            Match::PhysOut(neg, pat) => negate(
                *neg,
                match &p.physdev_out {
                    Some(port) => tri(iface_pattern(pat, port)),
                    None => Tri::No,
                },
            ),
            Match::PhysIsBridged(neg) => negate(*neg, tri(p.bridged)),
            Match::PhysIsIn(neg) => negate(*neg, tri(p.physdev_in.is_some())),
            Match::PhysIsOut(neg) => negate(*neg, tri(p.physdev_out.is_some())),
            Match::IcmpType => Tri::No,
            Match::Unknown(what) => Tri::Unknown(format!("match not understood: {what}")),
        }
    }

    fn set_match(&self, name: &str, flags: &[String]) -> Tri {
        let p = self.packet;
        let Some(set) = self.sets.sets.get(name) else {
            return Tri::Unknown(format!("set {name} is not in the kernel's ipset save"));
        };
        if set.family.is_some_and(|f| f != IpFamily::of(&p.src)) {
            return Tri::No;
        }
        let addr = |flag: &str| match flag {
            "src" => Some(p.src),
            "dst" => Some(p.dst),
            _ => None,
        };
        let found = match set.set_type.as_str() {
            "hash:net" | "hash:ip" => {
                let Some(ip) = flags.first().and_then(|f| addr(f)) else {
                    return Tri::Unknown(format!("set {name}: flags {}", flags.join(",")));
                };
                set.hosts.contains(&ip) || set.nets.iter().any(|n| n.contains(&ip))
            }
            "hash:ip,port" => {
                let ip = flags.first().and_then(|f| addr(f));
                match (ip, flags.get(1).map(String::as_str)) {
                    (Some(ip), Some("dst")) => set.ip_ports.contains(&(ip, p.protocol, p.dport)),
                    _ => {
                        return Tri::Unknown(format!(
                            "set {name}: flags {} need the source port, which is not known",
                            flags.join(",")
                        ))
                    }
                }
            }
            other => {
                return Tri::Unknown(format!("set {name} is of type {other}, not one we create"))
            }
        };
        if !found && !set.unreadable.is_empty() {
            return Tri::Unknown(format!(
                "set {name} holds entries this reader does not understand ({})",
                set.unreadable.join(", ")
            ));
        }
        tri(found)
    }
}

/// What happened at one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepResult {
    NoMatch,
    /// Matched; what it did (`ACCEPT`, `jump cali-fw-x`, `MARK → 0x10000`).
    Matched(String),
    CannotEvaluate(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceStep {
    pub chain: String,
    /// 1-based position in the chain.
    pub number: usize,
    pub body: String,
    pub hash: Option<String>,
    pub result: StepResult,
}

/// The kernel's answer for the packet at this hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelVerdict {
    Accept,
    Drop,
    Reject,
    /// A rule could not be evaluated (the last step of the trace says which and why).
    CannotEvaluate(String),
}

impl KernelVerdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            KernelVerdict::Accept => "accept",
            KernelVerdict::Drop => "drop",
            KernelVerdict::Reject => "reject",
            KernelVerdict::CannotEvaluate(_) => "cannot evaluate",
        }
    }
    /// `Some(true)` accepted, `Some(false)` dropped or rejected, `None` unknown.
    pub fn allowed(&self) -> Option<bool> {
        match self {
            KernelVerdict::Accept => Some(true),
            KernelVerdict::Drop | KernelVerdict::Reject => Some(false),
            KernelVerdict::CannotEvaluate(_) => None,
        }
    }
}

/// One packet's way through one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub hook: String,
    pub packet: Packet,
    pub steps: Vec<TraceStep>,
    pub verdict: KernelVerdict,
    /// `Some(chain)` when the built-in chain's policy decided.
    pub by_policy: Option<String>,
    /// The packet mark the walk started with (0 unless an earlier hook set it).
    pub start_mark: u32,
    /// The packet mark when the walk ended: what a later hook sees (IPVS: the endpoint mark
    /// `INPUT` sets is read in `OUTPUT`).
    pub end_mark: u32,
}

/// Follows `packet` from the built-in chain `hook` of `rules`, with a clear mark.
pub fn trace(
    rules: &Ruleset,
    sets: &KernelSets,
    view: &NodeView,
    hook: &str,
    packet: &Packet,
) -> Trace {
    trace_marked(rules, sets, view, hook, packet, 0)
}

/// As `trace`, for a packet that enters `hook` carrying `start_mark` (a mark survives from
/// one hook to the next: kube-proxy IPVS mode's `INPUT` → `OUTPUT`).
pub fn trace_marked(
    rules: &Ruleset,
    sets: &KernelSets,
    view: &NodeView,
    hook: &str,
    packet: &Packet,
    start_mark: u32,
) -> Trace {
    let interp = Interp { sets, view, packet };
    let mut steps = Vec::new();
    let mut mark: u32 = start_mark;
    // Frames to return to: (chain, next rule index).
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut chain = hook.to_string();
    let mut index = 0usize;
    let policy = |steps: Vec<TraceStep>, mark: u32| {
        let p = rules.policies.get(hook).map_or("ACCEPT", String::as_str);
        let verdict = match p {
            "ACCEPT" => KernelVerdict::Accept,
            "DROP" => KernelVerdict::Drop,
            other => KernelVerdict::CannotEvaluate(format!("chain {hook} has policy {other}")),
        };
        Trace {
            hook: hook.to_string(),
            packet: packet.clone(),
            steps,
            verdict,
            by_policy: Some(hook.to_string()),
            start_mark,
            end_mark: mark,
        }
    };
    let done = |steps: Vec<TraceStep>, verdict: KernelVerdict, mark: u32| Trace {
        hook: hook.to_string(),
        packet: packet.clone(),
        steps,
        verdict,
        by_policy: None,
        start_mark,
        end_mark: mark,
    };
    if rules.chain(hook).is_none() {
        return policy(steps, mark);
    }
    loop {
        if steps.len() >= MAX_STEPS {
            return done(
                steps,
                KernelVerdict::CannotEvaluate(format!("more than {MAX_STEPS} rules: a loop?")),
                mark,
            );
        }
        let list = rules.chain(&chain).unwrap_or_default();
        let Some(rule) = list.get(index) else {
            // The end of the chain: back to the caller, or the hook's policy.
            match stack.pop() {
                Some((c, i)) => {
                    chain = c;
                    index = i;
                    continue;
                }
                None => return policy(steps, mark),
            }
        };
        let mut unknown = None;
        let mut matched = true;
        for m in &rule.parsed.matches {
            match interp.eval(m, mark) {
                Tri::Yes => {}
                Tri::No => {
                    matched = false;
                    break;
                }
                Tri::Unknown(why) => {
                    unknown.get_or_insert(why);
                }
            }
        }
        let mut step = TraceStep {
            chain: chain.clone(),
            number: index + 1,
            body: rule.body.clone(),
            hash: rule.hash.clone(),
            result: StepResult::NoMatch,
        };
        if !matched {
            steps.push(step);
            index += 1;
            continue;
        }
        // A log rule decides nothing, so a match this reader cannot evaluate there (the deny
        // log's `-m limit`) leaves the verdict alone: the walk goes on either way.
        if unknown.is_some() && matches!(rule.parsed.target, Target::Log) {
            step.result = StepResult::NoMatch;
            steps.push(step);
            index += 1;
            continue;
        }
        if let Some(why) = unknown {
            step.result = StepResult::CannotEvaluate(why.clone());
            steps.push(step);
            return done(
                steps,
                KernelVerdict::CannotEvaluate(format!("{chain} #{}: {why}", index + 1)),
                mark,
            );
        }
        let target = &rule.parsed.target;
        step.result = StepResult::Matched(match target {
            Target::SetXMark(v, m) => {
                mark = (mark & !m) ^ v;
                format!("MARK, mark now {mark:#x}")
            }
            Target::SetMark(v, m) => {
                mark = (mark & !m) | v;
                format!("MARK, mark now {mark:#x}")
            }
            _ => rule.target_text(),
        });
        steps.push(step);
        match target {
            Target::None | Target::Log | Target::SetXMark(..) | Target::SetMark(..) => {
                index += 1;
            }
            Target::Accept => return done(steps, KernelVerdict::Accept, mark),
            Target::Drop => return done(steps, KernelVerdict::Drop, mark),
            Target::Reject => return done(steps, KernelVerdict::Reject, mark),
            Target::Return => match stack.pop() {
                Some((c, i)) => {
                    chain = c;
                    index = i;
                }
                None => return policy(steps, mark),
            },
            Target::Jump(c) | Target::Goto(c) => {
                if rules.chain(c).is_none() {
                    let why = format!("target {c} is neither a chain of this table nor a target this reader knows");
                    if let Some(last) = steps.last_mut() {
                        last.result = StepResult::CannotEvaluate(why.clone());
                    }
                    return done(steps, KernelVerdict::CannotEvaluate(why), mark);
                }
                if matches!(target, Target::Jump(_)) {
                    stack.push((chain.clone(), index + 1));
                }
                chain = c.clone();
                index = 0;
            }
            Target::Unknown(t) => {
                let why = format!("target not understood: {t}");
                if let Some(last) = steps.last_mut() {
                    last.result = StepResult::CannotEvaluate(why.clone());
                }
                return done(steps, KernelVerdict::CannotEvaluate(why), mark);
            }
        }
    }
}

impl Trace {
    /// The trace as text: every rule that matched, runs of rules that did not collapsed to
    /// a count; `describe` adds what a rule of ours implements (from its hash).
    pub fn to_text(&self, describe: &dyn Fn(&str, &str) -> Option<String>) -> String {
        let mut out = String::new();
        let p = &self.packet;
        let _ = writeln!(
            out,
            "{}: {} -> {} {} {}, in {} out {}{}",
            self.hook,
            p.src,
            p.dst,
            p.protocol.as_str(),
            p.dport,
            p.in_iface.describe(),
            p.out_iface.describe(),
            match (&p.physdev_in, &p.physdev_out) {
                (None, None) => String::new(),
                (i, o) => format!(
                    ", bridge ports in {} out {}{}",
                    i.as_deref().unwrap_or("-"),
                    o.as_deref().unwrap_or("-"),
                    if p.bridged { " (bridged)" } else { "" }
                ),
            }
        );
        if self.start_mark != 0 {
            let _ = writeln!(out, "  (enters with mark {:#x})", self.start_mark);
        }
        let mut skipped: Option<(String, usize)> = None;
        let flush = |out: &mut String, skipped: &mut Option<(String, usize)>| {
            if let Some((chain, n)) = skipped.take() {
                let _ = writeln!(out, "    {chain}: {n} rule(s) not matching");
            }
        };
        for s in &self.steps {
            if s.result == StepResult::NoMatch {
                match &mut skipped {
                    Some((c, n)) if *c == s.chain => *n += 1,
                    _ => {
                        flush(&mut out, &mut skipped);
                        skipped = Some((s.chain.clone(), 1));
                    }
                }
                continue;
            }
            flush(&mut out, &mut skipped);
            let what = match &s.result {
                StepResult::Matched(w) => w.clone(),
                StepResult::CannotEvaluate(w) => format!("CANNOT EVALUATE: {w}"),
                StepResult::NoMatch => String::new(),
            };
            let _ = writeln!(out, "  {} #{}: {}  -> {what}", s.chain, s.number, s.body);
            if let Some(d) = s.hash.as_deref().and_then(|h| describe(&s.chain, h)) {
                let _ = writeln!(out, "      ({d})");
            }
        }
        flush(&mut out, &mut skipped);
        match &self.by_policy {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "  => {} (policy of {c})",
                    self.verdict.as_str().to_ascii_uppercase()
                );
            }
            None => {
                let _ = writeln!(out, "  => {}", self.verdict.as_str().to_ascii_uppercase());
            }
        }
        out
    }

    pub fn to_json(&self, describe: &dyn Fn(&str, &str) -> Option<String>) -> Value {
        let p = &self.packet;
        let iface = |i: &Iface| match i {
            Iface::Named(n) => json!(n),
            Iface::NonPod => json!("(not a pod interface)"),
            Iface::Absent => Value::Null,
        };
        json!({
            "hook": self.hook,
            "packet": {
                "source": p.src.to_string(), "destination": p.dst.to_string(),
                "protocol": p.protocol.as_str(), "port": p.dport,
                "in": iface(&p.in_iface), "out": iface(&p.out_iface),
                "physdev_in": p.physdev_in, "physdev_out": p.physdev_out, "bridged": p.bridged,
            },
            "steps": self.steps.iter().filter(|s| s.result != StepResult::NoMatch).map(|s| {
                let (result, what) = match &s.result {
                    StepResult::Matched(w) => ("matched", w.clone()),
                    StepResult::CannotEvaluate(w) => ("cannot evaluate", w.clone()),
                    StepResult::NoMatch => ("no match", String::new()),
                };
                json!({"chain": s.chain, "rule_number": s.number, "rule": s.body, "hash": s.hash,
                       "result": result, "action": what,
                       "implements": s.hash.as_deref().and_then(|h| describe(&s.chain, h))})
            }).collect::<Vec<_>>(),
            "rules_not_matching": self.steps.iter().filter(|s| s.result == StepResult::NoMatch).count(),
            "verdict": self.verdict.as_str(),
            "cannot_evaluate_because": match &self.verdict { KernelVerdict::CannotEvaluate(w) => Some(w.clone()), _ => None },
            "by_chain_policy": self.by_policy,
            "start_mark": format!("{:#x}", self.start_mark),
            "end_mark": format!("{:#x}", self.end_mark),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::read::*;
    use super::*;

    fn packet(src: &str, dst: &str, port: u16, i: Iface, o: Iface) -> Packet {
        Packet {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: Protocol::Tcp,
            dport: port,
            in_iface: i,
            out_iface: o,
            physdev_in: None,
            physdev_out: None,
            bridged: false,
        }
    }

    fn view() -> NodeView {
        NodeView {
            pod_prefixes: vec!["cali".into()],
            bridge: None,
        }
    }

    #[test]
    fn words_keep_quoted_comments() {
        assert_eq!(
            words(r#"-m comment --comment "a \"b\" c" -j ACCEPT"#),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "ACCEPT"]
        );
        assert_eq!(
            rule_hash(r#"-i cali+ -m comment --comment "cali:abcDEF" -j X"#).as_deref(),
            Some("abcDEF")
        );
        assert_eq!(rule_hash(r#"-m comment --comment "kube" -j X"#), None);
    }

    #[test]
    fn follows_jumps_gotos_marks_and_policies() {
        let rs = Ruleset::parse(
            "*filter\n:FORWARD DROP [0:0]\n:c1 - [0:0]\n:c2 - [0:0]\n:c3 - [0:0]\n\
             -A FORWARD -i cali+ -j c1\n\
             -A FORWARD -m mark --mark 0x10000/0x10000 -j ACCEPT\n\
             -A c1 -g c2\n-A c1 -j DROP\n\
             -A c2 -s 10.0.0.0/8 -p tcp -m multiport --dports 80,8000:8080 -j MARK --set-xmark 0x10000/0x10000\n\
             -A c2 -j c3\n\
             -A c3 -m mark --mark 0x10000/0x10000 -j RETURN\n-A c3 -j REJECT --reject-with icmp-port-unreachable\n\
             COMMIT\n",
        );
        let sets = KernelSets::default();
        let ok = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.1.1.1",
                "10.2.2.2",
                8001,
                Iface::Named("cali1".into()),
                Iface::NonPod,
            ),
        );
        assert_eq!(ok.verdict, KernelVerdict::Accept);
        // The goto's chain returned straight to FORWARD: c1's DROP was never reached.
        assert!(ok.steps.iter().all(|s| !(s.chain == "c1" && s.number == 2)));
        let rejected = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.1.1.1",
                "10.2.2.2",
                443,
                Iface::Named("cali1".into()),
                Iface::NonPod,
            ),
        );
        assert_eq!(rejected.verdict, KernelVerdict::Reject);
        // Not from a pod: falls through to the policy.
        let policy = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.1.1.1",
                "10.2.2.2",
                80,
                Iface::NonPod,
                Iface::Named("cali2".into()),
            ),
        );
        assert_eq!(policy.verdict, KernelVerdict::Drop);
        assert_eq!(policy.by_policy.as_deref(), Some("FORWARD"));
    }

    #[test]
    fn sets_conntrack_physdev_and_negation() {
        let sets = KernelSets::parse(
            "create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576\nadd cali40s:a 10.0.0.1\nadd cali40s:a 10.9.0.0/16\n\
             create cali40n:b hash:ip,port family inet\nadd cali40n:b 10.0.0.2,tcp:8080\n",
        );
        let rs = Ruleset::parse(
            "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j DROP\n\
             -A FORWARD -m physdev ! --physdev-is-bridged -m set --match-set cali40s:a src -m set --match-set cali40n:b dst,dst -j ACCEPT\n\
             -A FORWARD ! -s 10.0.0.0/8 -j ACCEPT\n-A FORWARD -j DROP\n",
        );
        let run = |src: &str, port: u16| {
            trace(
                &rs,
                &sets,
                &view(),
                "FORWARD",
                &packet(src, "10.0.0.2", port, Iface::NonPod, Iface::NonPod),
            )
            .verdict
        };
        assert_eq!(run("10.0.0.1", 8080), KernelVerdict::Accept);
        assert_eq!(run("10.9.3.3", 8080), KernelVerdict::Accept);
        assert_eq!(run("10.0.0.1", 8081), KernelVerdict::Drop);
        assert_eq!(run("192.168.0.1", 1), KernelVerdict::Accept);
    }

    #[test]
    fn a_rate_limited_log_rule_decides_nothing() {
        // The deny log's NFLOG rule before a drop: its `-m limit` is not evaluated, and the
        // packet goes on to the drop (or past it) as if the log rule were not there.
        let rs = Ruleset::parse(
            "-A FORWARD -s 10.0.0.1 -m limit --limit 10/sec --limit-burst 20 -j NFLOG --nflog-prefix npa-pol-in-x --nflog-group 20 --nflog-size 128\n\
             -A FORWARD -s 10.0.0.1 -j DROP\n",
        );
        let run = |src: &str| {
            trace(
                &rs,
                &KernelSets::default(),
                &view(),
                "FORWARD",
                &packet(src, "10.0.0.2", 80, Iface::NonPod, Iface::NonPod),
            )
        };
        let t = run("10.0.0.1");
        assert_eq!(t.verdict, KernelVerdict::Drop, "{t:?}");
        assert_eq!(t.steps[0].result, StepResult::NoMatch);
        assert_eq!(run("10.0.0.9").verdict, KernelVerdict::Accept);
        // Any other target with a match the reader does not know still stops the walk.
        let rs = Ruleset::parse("-A FORWARD -m limit --limit 10/sec -j DROP\n");
        let t = trace(
            &rs,
            &KernelSets::default(),
            &view(),
            "FORWARD",
            &packet("10.0.0.1", "10.0.0.2", 80, Iface::NonPod, Iface::NonPod),
        );
        assert!(
            matches!(t.verdict, KernelVerdict::CannotEvaluate(_)),
            "{t:?}"
        );
    }

    #[test]
    fn never_guesses() {
        let rs = Ruleset::parse(
            "-A FORWARD -o eth0 -j ACCEPT\n-A FORWARD -m addrtype --dst-type LOCAL -j DROP\n",
        );
        let sets = KernelSets::default();
        // -o eth0 against an unnamed uplink: cannot tell.
        let t = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.0.0.1",
                "10.0.0.2",
                80,
                Iface::Named("cali1".into()),
                Iface::NonPod,
            ),
        );
        assert!(
            matches!(t.verdict, KernelVerdict::CannotEvaluate(_)),
            "{t:?}"
        );
        // -o eth0 cannot match a pod interface; the unknown addrtype match stops it.
        let t = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.0.0.1",
                "10.0.0.2",
                80,
                Iface::NonPod,
                Iface::Named("cali2".into()),
            ),
        );
        match &t.verdict {
            KernelVerdict::CannotEvaluate(why) => assert!(why.contains("addrtype"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A rule another match rules out is not a problem.
        let rs = Ruleset::parse("-A FORWARD -p udp -m addrtype --dst-type LOCAL -j DROP\n");
        let t = trace(
            &rs,
            &sets,
            &view(),
            "FORWARD",
            &packet(
                "10.0.0.1",
                "10.0.0.2",
                80,
                Iface::NonPod,
                Iface::Named("cali2".into()),
            ),
        );
        assert_eq!(t.verdict, KernelVerdict::Accept);
    }

    #[test]
    fn restore_inserts_go_where_they_say() {
        let rs = Ruleset::parse(
            "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j a\n-I FORWARD 1 -j b\n-I FORWARD 2 -j c\nCOMMIT\n",
        );
        let bodies: Vec<&str> = rs.chains["FORWARD"]
            .iter()
            .map(|r| r.body.as_str())
            .collect();
        assert_eq!(bodies, ["-j b", "-j c", "-j a"]);
    }
}
