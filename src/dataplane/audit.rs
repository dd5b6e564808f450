//! `audit`: what a node's kernel holds of ours against what it should hold, for one family.
//!
//! Input is text: the kernel's `iptables-save` filter table and `ipset save`, and what the
//! node should hold rendered as `compile` renders it (restore scripts), plus the provenance of
//! every rendered rule. Output ([`AuditReport`]):
//! - the inventory: every chain and rule of ours with what it implements (policy, direction,
//!   rule, peer, ports; the pod of a workload chain; a static chain's role) and whether the
//!   kernel has it as rendered; every set of ours with what it holds;
//! - the findings: drift ([`OwnedState::drift`]: chains, rules and set members missing, extra
//!   or different, other programs' rules inside our chains, a set whose type changed), our
//!   jump missing from a kernel chain, another program's rule above our jump in `FORWARD` or
//!   `INPUT` that accepts pod traffic (or returns it to an accepting policy, or jumps to a
//!   chain that accepts it) before our policy sees it, and rules after our final `ACCEPT` in
//!   `FORWARD`.
//!
//! Pure: reading the kernel is the caller's (`inspect`); nothing here writes anywhere.
//!
//! `audit` at two layers: the kernel-side inventory and drift of one family in
//! `dataplane::audit`, the command (objects in, report out) in `inspect::audit`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::iptables::Ownership;
use super::owned::{Drift, OwnedState};
use crate::model::IpFamily;
use crate::rules::chains::KernelChainRules;
use crate::rules::provenance::{Provenance, RuleRole};
use crate::verdict::kernel::{KernelRule, NodeView, Ruleset};

/// What is audited, as text.
pub struct AuditInput<'a> {
    pub family: IpFamily,
    /// `iptables-save` (filter table) of the node.
    pub iptables_save: &'a str,
    /// `ipset save` of the node (both families; this family's sets are taken).
    pub ipset_save: &'a str,
    /// What the node should hold: `compile`'s iptables-restore and ipset scripts.
    pub want_iptables: &'a str,
    pub want_ipsets: &'a str,
    /// Our rules in the kernel chains as rendered (the jumps and the final accept).
    pub kernel_rules: &'a [KernelChainRules],
    pub provenance: &'a Provenance,
    pub ownership: &'a Ownership,
    pub view: NodeView,
    /// Append mode: our jumps are meant to come after other programs' rules.
    pub append_mode: bool,
}

/// Whether the kernel holds a rule of ours as rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleStatus {
    Ok,
    Missing,
    Different,
}

impl RuleStatus {
    fn as_str(self) -> &'static str {
        match self {
            RuleStatus::Ok => "ok",
            RuleStatus::Missing => "missing",
            RuleStatus::Different => "different",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleEntry {
    /// 1-based position in the kernel's chain, when it is there.
    pub number: Option<usize>,
    pub hash: String,
    pub what: String,
    pub status: RuleStatus,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainEntry {
    pub chain: String,
    pub role: String,
    pub present: bool,
    pub rules: Vec<RuleEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetEntry {
    pub set: String,
    pub what: String,
    pub members: usize,
    pub present: bool,
}

/// One finding: a stable kind (for scripts), what it is about, and a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub kind: &'static str,
    pub subject: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    pub family: IpFamily,
    pub chains: Vec<ChainEntry>,
    pub sets: Vec<SetEntry>,
    pub findings: Vec<Finding>,
}

/// The kernel chains whose foreign rules above our jump can let pod traffic past policy.
const GUARDED: [&str; 2] = ["FORWARD", "INPUT"];

pub fn audit(input: &AuditInput<'_>) -> AuditReport {
    let mut have = OwnedState::default();
    have.add_iptables(input.iptables_save, input.ownership);
    have.add_ipsets(input.ipset_save, input.family);
    let mut want = OwnedState::default();
    want.add_iptables(input.want_iptables, input.ownership);
    want.add_ipsets(input.want_ipsets, input.family);
    let table = Ruleset::parse(input.iptables_save);
    let prov = input.provenance;
    let describe = |chain: &str, hash: &str| prov.describe(chain, hash);

    // Inventory: every chain and rule of ours, as rendered, with its place in the kernel.
    let mut chains = Vec::new();
    let kernel_positions = |chain: &str| -> BTreeMap<String, (usize, String)> {
        table
            .chain(chain)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.hash.clone().map(|h| (h, (i + 1, r.body.clone()))))
            .collect()
    };
    let entry = |chain: &str, want_rules: &[String], role: String| {
        let have_rules = kernel_positions(chain);
        ChainEntry {
            chain: chain.to_string(),
            role,
            present: table.chain(chain).is_some(),
            rules: want_rules
                .iter()
                .filter_map(|body| {
                    let hash = input.ownership.rule_hash(body)?.to_string();
                    let (number, status) = match have_rules.get(&hash) {
                        None => (None, RuleStatus::Missing),
                        Some((n, b)) if b == body => (Some(*n), RuleStatus::Ok),
                        Some((n, _)) => (Some(*n), RuleStatus::Different),
                    };
                    Some(RuleEntry {
                        what: describe(chain, &hash).unwrap_or_else(|| "(no provenance)".into()),
                        number,
                        hash,
                        status,
                    })
                })
                .collect(),
        }
    };
    for (name, rules) in &want.chains {
        let role = prov
            .chains
            .get(name)
            .map_or_else(|| "(no provenance)".to_string(), |t| t.role.to_string());
        chains.push(entry(name, rules, role));
    }
    for (name, rules) in &want.kernel {
        chains.push(entry(name, rules, "kernel chain: our rules in it".into()));
    }
    let sets = want
        .sets
        .iter()
        .map(|(name, members)| SetEntry {
            set: name.clone(),
            what: prov
                .sets
                .get(name)
                .cloned()
                .unwrap_or_else(|| "(no provenance)".into()),
            members: members.len(),
            present: have.sets.contains_key(name),
        })
        .collect();

    let mut findings: Vec<Finding> = have
        .drift(&want, input.ownership)
        .into_iter()
        .map(|d| drift_finding(d, prov))
        .collect();
    findings.extend(foreign_findings(input, &table));
    AuditReport {
        family: input.family,
        chains,
        sets,
        findings,
    }
}

fn what(prov: &Provenance, chain: &str, hash: &str) -> String {
    prov.describe(chain, hash)
        .map_or_else(String::new, |d| format!(" ({d})"))
}

fn drift_finding(d: Drift, prov: &Provenance) -> Finding {
    let subject = d.subject().to_string();
    let (kind, message) = match d {
        Drift::MissingChain { chain } => (
            "missing-chain",
            format!(
                "chain {chain} is missing{}",
                prov.chains
                    .get(&chain)
                    .map_or_else(String::new, |t| format!(" ({})", t.role))
            ),
        ),
        Drift::ExtraChain { chain, rules } => (
            "extra-chain",
            format!("chain {chain} ({rules} rules) is ours by name but not wanted: left over, or made by someone else"),
        ),
        Drift::MissingRule { chain, hash, body } => {
            let jump = prov
                .rule(&chain, &hash)
                .is_some_and(|(_, r)| *r == RuleRole::JumpToOurs);
            if jump {
                (
                    "missing-jump",
                    format!("{chain} has no jump into our chain: nothing of ours sees this traffic (want: -A {chain} {body})"),
                )
            } else {
                (
                    "missing-rule",
                    format!("{chain}: rule cali:{hash} is missing{}: -A {chain} {body}", what(prov, &chain, &hash)),
                )
            }
        }
        Drift::ExtraRule { chain, hash, body } => (
            "extra-rule",
            format!("{chain}: rule cali:{hash} is not wanted: -A {chain} {body}"),
        ),
        Drift::DifferentRule {
            chain,
            hash,
            want,
            have,
        } => (
            "different-rule",
            format!(
                "{chain}: rule cali:{hash}{} was changed: want -A {chain} {want}, have -A {chain} {have}",
                what(prov, &chain, &hash)
            ),
        ),
        Drift::OutOfOrder { chain } => (
            "rules-out-of-order",
            format!("{chain}: our rules are there but in another order"),
        ),
        Drift::ForeignRule {
            chain,
            number,
            body,
        } => (
            "foreign-rule-in-our-chain",
            format!("{chain} #{number} is another program's rule inside a chain of ours: -A {chain} {body}"),
        ),
        Drift::MissingSet { set } => (
            "missing-set",
            format!(
                "set {set} is missing{}",
                prov.sets.get(&set).map_or_else(String::new, |w| format!(" ({w})"))
            ),
        ),
        Drift::ExtraSet { set, members } => (
            "extra-set",
            format!("set {set} ({members} members) is ours by name but not wanted"),
        ),
        Drift::SetTypeChanged { set, want, have } => (
            "set-type-changed",
            format!("set {set} is {have}, should be {want}"),
        ),
        Drift::MembersMissing { set, members } => (
            "set-members-missing",
            format!(
                "set {set}{} lacks {}: {}",
                prov.sets.get(&set).map_or_else(String::new, |w| format!(" ({w})")),
                members.len(),
                members.join(" ")
            ),
        ),
        Drift::MembersExtra { set, members } => (
            "set-members-extra",
            format!(
                "set {set}{} holds {} it should not: {}",
                prov.sets.get(&set).map_or_else(String::new, |w| format!(" ({w})")),
                members.len(),
                members.join(" ")
            ),
        ),
    };
    Finding {
        kind,
        subject,
        message,
    }
}

/// A chain (another program's) that can accept new pod traffic, directly or through the
/// chains it jumps to; returns the path.
fn accepting_path(
    table: &Ruleset,
    chain: &str,
    view: &NodeView,
    seen: &mut BTreeSet<String>,
) -> Option<String> {
    if !seen.insert(chain.to_string()) {
        return None;
    }
    for (i, r) in table.chain(chain)?.iter().enumerate() {
        if !r.can_match_new_pod_traffic(view) {
            continue;
        }
        if r.accepts() {
            return Some(format!("{chain} #{}: {}", i + 1, r.body));
        }
        if let Some(next) = r.jump_target() {
            if let Some(path) = accepting_path(table, next, view, seen) {
                return Some(format!("{chain} #{} -> {path}", i + 1));
            }
        }
    }
    None
}

fn foreign_findings(input: &AuditInput<'_>, table: &Ruleset) -> Vec<Finding> {
    let mut out = Vec::new();
    let ours = |r: &KernelRule| r.hash.is_some();
    for k in input.kernel_rules {
        let Some(rules) = table.chain(&k.chain) else {
            continue;
        };
        let jump = k.inserts.first().map(|r| r.hash.as_str());
        let jump_at = jump.and_then(|h| rules.iter().position(|r| r.hash.as_deref() == Some(h)));
        if let (true, Some(j)) = (GUARDED.contains(&k.chain.as_str()), jump_at) {
            let policy_accepts = table.policies.get(&k.chain).map(String::as_str) == Some("ACCEPT");
            for (i, r) in rules[..j].iter().enumerate() {
                if ours(r) || !r.can_match_new_pod_traffic(&input.view) {
                    continue;
                }
                let why = if r.accepts() {
                    Some("accepts".to_string())
                } else if r.returns() && policy_accepts {
                    Some(format!("returns to {}'s ACCEPT policy", k.chain))
                } else {
                    r.jump_target().and_then(|c| {
                        accepting_path(table, c, &input.view, &mut BTreeSet::new())
                            .map(|p| format!("jumps to a chain that accepts ({p})"))
                    })
                };
                if let Some(why) = why {
                    out.push(Finding {
                        kind: "bypass-above-jump",
                        subject: k.chain.clone(),
                        message: format!(
                            "{} #{}: another program's rule above our jump {why} pod traffic before policy sees it{}: -A {} {}",
                            k.chain,
                            i + 1,
                            if input.append_mode { " (FELIX_CHAININSERTMODE=append puts our jump after other programs' rules, but this one still lets pods past policy)" } else { "" },
                            k.chain,
                            r.body
                        ),
                    });
                }
            }
        }
        for accept in &k.appends {
            let Some(at) = rules
                .iter()
                .position(|r| r.hash.as_deref() == Some(accept.hash.as_str()))
            else {
                continue; // missing: reported as drift
            };
            let after: Vec<String> = rules[at + 1..]
                .iter()
                .enumerate()
                .map(|(i, r)| format!("#{} {}", at + i + 2, r.body))
                .collect();
            if !after.is_empty() {
                out.push(Finding {
                    kind: "final-accept-not-last",
                    subject: k.chain.clone(),
                    message: format!(
                        "{} #{}: our final ACCEPT of allowed traffic is not the last rule; after it: {}",
                        k.chain,
                        at + 1,
                        after.join("; ")
                    ),
                });
            }
        }
    }
    out
}

fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

impl AuditReport {
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }

    /// The report for people: inventory, then findings.
    pub fn to_text(&self, heading: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== {heading} {}: {} chains and {} rules of ours, {} sets",
            family_name(self.family),
            self.chains.len(),
            self.rule_count(),
            self.sets.len()
        );
        for c in &self.chains {
            let _ = writeln!(
                out,
                "{}{}  [{}]",
                c.chain,
                if c.present { "" } else { " (MISSING)" },
                c.role
            );
            for r in &c.rules {
                let n = r
                    .number
                    .map_or_else(|| "#-".to_string(), |n| format!("#{n}"));
                let status = match r.status {
                    RuleStatus::Ok => String::new(),
                    other => format!(" ({})", other.as_str().to_ascii_uppercase()),
                };
                let _ = writeln!(out, "  {n:>4} cali:{}{status}  {}", r.hash, r.what);
            }
        }
        for s in &self.sets {
            let _ = writeln!(
                out,
                "set {}{}  {} members  [{}]",
                s.set,
                if s.present { "" } else { " (MISSING)" },
                s.members,
                s.what
            );
        }
        if self.findings.is_empty() {
            let _ = writeln!(out, "no findings");
        } else {
            let _ = writeln!(out, "findings ({}):", self.findings.len());
            for f in &self.findings {
                let _ = writeln!(out, "  {}: {}", f.kind, f.message);
            }
        }
        out
    }

    pub fn to_json(&self) -> Value {
        json!({
            "family": match self.family { IpFamily::V4 => "ipv4", IpFamily::V6 => "ipv6" },
            "chains": self.chains.iter().map(|c| json!({
                "chain": c.chain, "role": c.role, "present": c.present,
                "rules": c.rules.iter().map(|r| json!({
                    "rule_number": r.number, "hash": r.hash, "implements": r.what,
                    "status": r.status.as_str(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "sets": self.sets.iter().map(|s| json!({
                "set": s.set, "holds": s.what, "members": s.members, "present": s.present,
            })).collect::<Vec<_>>(),
            "findings": self.findings.iter().map(|f| json!({
                "kind": f.kind, "subject": f.subject, "message": f.message,
            })).collect::<Vec<_>>(),
        })
    }
}
