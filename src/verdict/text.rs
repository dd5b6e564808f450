//! The answer for people: the verdict, then each direction with the tier that decided, the
//! policy, rule, peer and port entry (or the closest misses), and the rules of ours that
//! implement each step as `iptables-save` shows them (chain, position, `cali:` hash).

use std::fmt::Write as _;

use super::{
    tier_name, Action, ClusterTierReport, DirectionVerdict, KernelRef, MissKind, NpOutcome,
    TierDetail, Unpoliced, Verdict,
};
use crate::model::{IpFamily, RuleAction, Tier};
use crate::rules::Direction;

/// `cali-pi-knp/x/p #3 cali:AbCdEf0123456789  what`.
pub fn kernel_ref(r: &KernelRef) -> String {
    match (&r.chain, &r.hash, r.number) {
        (Some(c), Some(h), Some(n)) => format!("{c} #{n} cali:{h}  {}", r.what),
        (Some(c), _, _) => format!("{c}  {}", r.what),
        _ => r.what.clone(),
    }
}

impl Verdict {
    /// The report as text, one section per direction.
    pub fn to_text(&self) -> String {
        let f = &self.flow;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "verdict: {}  {} -> {}  {} {} ({} {} -> {})",
            match self.action {
                Action::Allow => "ALLOW",
                Action::Deny => "DENY",
            },
            self.src_name,
            self.dst_name,
            f.protocol.as_str().to_ascii_uppercase(),
            f.port,
            match f.family {
                IpFamily::V4 => "IPv4",
                IpFamily::V6 => "IPv6",
            },
            f.src_ip,
            f.dst_ip
        );
        for note in &f.notes {
            let _ = writeln!(out, "note: {note}");
        }
        for d in [&self.egress, &self.ingress] {
            out.push('\n');
            direction_text(&mut out, d, self);
        }
        out
    }
}

fn direction_text(out: &mut String, d: &DirectionVerdict, v: &Verdict) {
    let side = match d.direction {
        Direction::Egress => &v.src_name,
        Direction::Ingress => &v.dst_name,
    };
    let verdict = match d.action {
        Action::Allow => "allowed",
        Action::Deny => "DENIED",
    };
    let _ = writeln!(out, "{} of {side}: {verdict}", d.direction.as_str());
    if let Some(u) = &d.unpoliced {
        let why = match u {
            Unpoliced::NotAPod => "not a pod: nothing enforces this direction",
            Unpoliced::FromOwnNode => {
                "from the pod's own node: host-to-pod traffic (kubelet probes) is not policed (cali-OUTPUT returns before policy)"
            }
            Unpoliced::ToItself => "a pod's traffic to itself never leaves it",
        };
        let _ = writeln!(out, "  {why}");
        return;
    }
    for t in &d.tiers {
        match &t.detail {
            TierDetail::Cluster(c) => cluster_text(out, c, d.direction),
            TierDetail::NetworkPolicy(np) => {
                let names: Vec<String> = np
                    .policies
                    .iter()
                    .map(|(k, c)| format!("{k} ({c})"))
                    .collect();
                match &np.outcome {
                    NpOutcome::NotIsolated { steps } => {
                        let _ = writeln!(
                            out,
                            "  NetworkPolicy: not isolated: no NetworkPolicy with {} rules selects the pod",
                            d.direction.as_str()
                        );
                        refs(out, steps, "    ");
                    }
                    NpOutcome::Allowed(m) => {
                        let _ = writeln!(out, "  NetworkPolicy: isolated by {}", names.join(", "));
                        let _ = writeln!(
                            out,
                            "  allowed by {} {} rule {}, {}, {}",
                            m.policy,
                            d.direction.as_str(),
                            m.rule,
                            m.peer_text,
                            m.port_text
                        );
                        refs(out, &m.steps, "    ");
                    }
                    NpOutcome::Denied {
                        misses,
                        unrelated_rules,
                        steps,
                    } => {
                        let _ = writeln!(out, "  NetworkPolicy: isolated by {}", names.join(", "));
                        if misses.is_empty() {
                            let _ = writeln!(
                                out,
                                "  no rule of these policies matches (none comes close: each rule misses both peer and port, or there are no rules)"
                            );
                        } else {
                            let _ = writeln!(
                                out,
                                "  no rule of these policies matches; closest misses:"
                            );
                        }
                        for m in misses {
                            let what = match &m.kind {
                                MissKind::PortNotMatched { peers, ports } => format!(
                                    "peer matched ({}), port not (rule ports: {ports})",
                                    peers.join("; ")
                                ),
                                MissKind::PeerNotMatched { ports, peers } => format!(
                                    "port matched ({}), peer not (rule peers: {peers})",
                                    ports.join("; ")
                                ),
                                MissKind::Excepted {
                                    peer_text,
                                    except,
                                    port_matched,
                                    ..
                                } => format!(
                                    "excluded by ipBlock.except {except} ({peer_text}){}",
                                    if *port_matched {
                                        ""
                                    } else {
                                        "; the port does not match either"
                                    }
                                ),
                            };
                            let _ = writeln!(
                                out,
                                "  - {} {} rule {}: {what}",
                                m.policy,
                                d.direction.as_str(),
                                m.rule
                            );
                            refs(out, &m.rules, "      ");
                        }
                        if *unrelated_rules > 0 && !misses.is_empty() {
                            let _ = writeln!(
                                out,
                                "  ({unrelated_rules} other rule(s) match neither the peer nor the port)"
                            );
                        }
                        refs(out, steps, "    ");
                    }
                }
            }
        }
    }
    refs(out, &d.after, "  ");
}

fn cluster_text(out: &mut String, c: &ClusterTierReport, direction: Direction) {
    let tier = c.tier.as_str();
    let names: Vec<String> = c
        .policies
        .iter()
        .map(|(n, p, chain)| format!("{n} (priority {p}, {chain})"))
        .collect();
    let _ = writeln!(
        out,
        "  ClusterNetworkPolicy tier {tier} ({}): {}",
        tier_name(c.tier),
        names.join(", ")
    );
    match &c.matched {
        None => {
            let next = match c.tier {
                Tier::Admin => "on to the next tier",
                Tier::Baseline => "on to the namespace profile",
            };
            let _ = writeln!(
                out,
                "  no {} rule of these policies matches: {next}",
                direction.as_str()
            );
        }
        Some(m) => {
            let name = m
                .rule_name
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"));
            let result = match m.effect() {
                RuleAction::Accept => "ACCEPT (final)".to_string(),
                RuleAction::Deny if m.fail_closed => format!(
                    "DENY (final): a {} rule with a peer this version cannot read fails closed",
                    m.action.as_str()
                ),
                RuleAction::Deny => "DENY (final)".to_string(),
                RuleAction::Pass => "PASS (the rest of the tier is skipped)".to_string(),
            };
            let _ = writeln!(
                out,
                "  {result} by ClusterNetworkPolicy {} {} rule {}{name} {}, peer {} ({}), {}",
                m.policy,
                direction.as_str(),
                m.rule,
                m.action.as_str(),
                m.peer,
                m.peer_text,
                m.port_text
            );
            refs(out, &m.steps, "    ");
        }
    }
}

fn refs(out: &mut String, refs: &[KernelRef], indent: &str) {
    for r in refs {
        let _ = writeln!(out, "{indent}{}", kernel_ref(r));
    }
}
