//! `run --kubeconfig --check-explain`: after each step's probes, the agent's own `explain`,
//! run in the agent pod of every node the step's pods are on (`netpol-agent explain
//! --datastore kubernetes --kernel --flows - --output json`): the agent's ServiceAccount, its
//! settings (the pod's `FELIX_*` environment) and that node's kernel, as an operator asks it
//! (docs/operations/troubleshooting.md). One exec per node and step, with every probe that
//! has an end on that node. For each probe:
//! - the policies' verdict (explain's `verdict`, for the post-DNAT pod-to-pod flow: a Service
//!   probe is asked about its backend pod) must be the expectation where the destination
//!   serves the port (nothing listens on the others, so they are expected blocked whatever
//!   the policies say);
//! - each node's kernel, followed rule by rule through what it holds, must agree with the
//!   policies for the directions that node enforces (`kernel.agrees`). A rule the tracer
//!   cannot evaluate counts as a disagreement: an unchecked probe is not a checked one.
//!
//! The packets are held to the expectation by the step itself ([`super::probe`]); this check
//! adds that the agent's account of each probe, and its node's kernel, say the same.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::report::Probe;
use super::ScenarioRun;
use crate::family::family_name;
use crate::scenario::Target;

/// Disagreements shown in full per step; the rest are counted.
const SHOWN: usize = 4;

/// The agent pods by node.
pub type Agents = BTreeMap<String, super::api::AgentPod>;

/// What one node's explain said of one probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub node: String,
    /// The policies' verdict: `allow` or `deny`.
    pub policies: String,
    /// The kernel's: `allow`, `deny`, `not on this node` or `cannot evaluate`.
    pub kernel: String,
    pub agrees: Option<bool>,
    /// The deciding lines of the text explain would print, for the report.
    pub detail: String,
    /// The whole result (`--check-flow-logs` reads each side's deciding tier from it).
    pub raw: Value,
}

/// Reads one node's `--output json` answer: one result per flow line, in order.
pub fn parse_answers(node: &str, stdout: &str, lines: usize) -> Result<Vec<Answer>, String> {
    let doc: Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("explain's output is not JSON ({e})"))?;
    let results = doc["results"]
        .as_array()
        .ok_or("explain's output has no `results` list")?;
    if results.len() != lines {
        return Err(format!(
            "explain answered {} flows, {lines} were asked",
            results.len()
        ));
    }
    Ok(results
        .iter()
        .map(|r| {
            let side = |d: &str| {
                let s = &r[d];
                format!(
                    "{d} of {}: {}",
                    s["pod"].as_str().unwrap_or("(not a pod)"),
                    s["verdict"].as_str().unwrap_or("?")
                )
            };
            Answer {
                node: node.to_string(),
                policies: r["verdict"].as_str().unwrap_or("?").to_string(),
                kernel: r["kernel"]["verdict"].as_str().unwrap_or("?").to_string(),
                agrees: r["kernel"]["agrees"].as_bool(),
                detail: format!("{}; {}", side("egress"), side("ingress")),
                raw: r.clone(),
            }
        })
        .collect())
}

/// Every probe where an answer differs from the expectation, or a kernel from the
/// policies, in words (at most [`SHOWN`], then a count).
pub fn judge(
    answers: &BTreeMap<Probe, Vec<Answer>>,
    expected: &BTreeMap<Probe, bool>,
    served: &dyn Fn(&Probe) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut more = 0;
    for (p, want) in expected {
        let (family, key, from, to) = p;
        let Some(list) = answers.get(p) else {
            continue;
        };
        let mut wrong = Vec::new();
        for a in list {
            let allowed = a.policies == "allow";
            if (allowed && served(p)) != *want {
                wrong.push(format!(
                    "explain on {} says the policies {} it{}",
                    a.node,
                    if allowed { "allow" } else { "deny" },
                    if allowed && !served(p) {
                        " (but nothing serves the port)"
                    } else {
                        ""
                    }
                ));
            }
            if a.agrees != Some(true) {
                wrong.push(format!(
                    "node {}'s kernel: {} (policies: {})",
                    a.node, a.kernel, a.policies
                ));
            }
        }
        if wrong.is_empty() {
            continue;
        }
        if out.len() >= SHOWN {
            more += 1;
            continue;
        }
        let mut text = format!(
            "{from} -> {to} {key} {}: expected {}; {}",
            family_name(*family),
            if *want { "connected" } else { "blocked" },
            wrong.join("; ")
        );
        if let Some(a) = list.first() {
            let _ = write!(text, " [{}]", a.detail);
        }
        out.push(text);
    }
    if more > 0 {
        out.push(format!(
            "... and {more} more probe(s) where explain disagrees"
        ));
    }
    out
}

/// Runs explain on every node with an end of a probe; returns each probe's answers, or a
/// sentence per node whose explain could not answer.
pub async fn ask(
    run: &ScenarioRun<'_>,
    agents: &Agents,
    probes: &[Probe],
) -> (BTreeMap<Probe, Vec<Answer>>, Vec<String>) {
    let mut by_node: BTreeMap<&str, Vec<(&Probe, String)>> = BTreeMap::new();
    let mut errors = Vec::new();
    for p in probes {
        let (family, key, from, to) = p;
        let (Some(src), Some(dst)) = (run.live.get(from), run.live.get(to)) else {
            continue;
        };
        // The post-DNAT flow: pod to pod, also for a Service probe.
        let (Some(s), Some(d)) = (
            src.addr(*family, Target::Pod),
            dst.addr(*family, Target::Pod),
        ) else {
            continue;
        };
        let line = format!(
            "{s} {d} {}/{}",
            key.port,
            key.protocol.as_str().to_ascii_uppercase()
        );
        by_node
            .entry(&src.node)
            .or_default()
            .push((p, line.clone()));
        if dst.node != src.node {
            by_node.entry(&dst.node).or_default().push((p, line));
        }
    }
    let mut answers: BTreeMap<Probe, Vec<Answer>> = BTreeMap::new();
    let asked: Vec<_> = stream::iter(by_node)
        .map(|(node, flows)| async move {
            let Some(agent) = agents.get(node) else {
                return (flows, Err(format!("no ready agent pod on node {node}")));
            };
            let (ns, pod) = (&agent.namespace, &agent.pod);
            let stdin: String = flows.iter().map(|(_, l)| format!("{l}\n")).collect();
            let argv = [
                "netpol-agent",
                "explain",
                "--datastore",
                "kubernetes",
                "--kernel",
                "--flows",
                "-",
                "--output",
                "json",
                "--log-severity-screen",
                "Warning",
            ]
            .map(String::from)
            .to_vec();
            let r = run
                .cluster
                .exec_capture(ns, pod, &agent.container, argv, Some(stdin))
                .await;
            let parsed = match r {
                Err(e) => Err(format!("exec in {ns}/{pod} on {node}: {e:#}")),
                Ok((out, err)) => parse_answers(node, &out, flows.len())
                    .map_err(|e| format!("explain in {ns}/{pod} on {node}: {e}: {}", said(&err))),
            };
            (flows, parsed)
        })
        .buffer_unordered(run.cfg.jobs.max(1))
        .collect()
        .await;
    for (flows, parsed) in asked {
        match parsed {
            Ok(list) => {
                for ((p, _), a) in flows.into_iter().zip(list) {
                    answers.entry(p.clone()).or_default().push(a);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (answers, errors)
}

/// What explain wrote to stderr, in one line: its messages, not its log records (JSON
/// lines under the DaemonSet's `FELIX_LOGFORMAT=json`), at most [`SAID`] characters.
pub fn said(stderr: &str) -> String {
    let text = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('{'))
        .collect::<Vec<_>>()
        .join(" / ");
    match text.char_indices().nth(SAID) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}

/// How much of explain's stderr a report line carries.
const SAID: usize = 400;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expect::{PortKey, Protocol};
    use netpol_agent::model::IpFamily;

    fn result(verdict: &str, kernel: &str, agrees: Option<bool>) -> Value {
        serde_json::json!({
            "verdict": verdict,
            "egress": {"pod": "x/a", "verdict": "allow"},
            "ingress": {"pod": "x/b", "verdict": verdict},
            "kernel": {"verdict": kernel, "agrees": agrees},
        })
    }

    #[test]
    fn answers_are_read_in_order_and_counted() {
        let doc = serde_json::json!({"verdict": "deny", "results": [
            result("allow", "allow", Some(true)),
            result("deny", "allow", Some(false)),
        ]});
        let got = parse_answers("n1", &doc.to_string(), 2).unwrap();
        assert_eq!(got[1].policies, "deny");
        assert_eq!(got[1].kernel, "allow");
        assert_eq!(got[1].agrees, Some(false));
        assert_eq!(got[0].detail, "egress of x/a: allow; ingress of x/b: allow");
        let err = parse_answers("n1", &doc.to_string(), 3).unwrap_err();
        assert!(err.contains("answered 2 flows, 3 were asked"), "{err}");
        assert!(parse_answers("n1", "netpol-agent explain: bad", 1).is_err());
        let err = "{\"level\":\"INFO\"}\nerror: unexpected argument '--flows' found\n\nFor more information, try '--help'.\n";
        assert_eq!(
            said(err),
            "error: unexpected argument '--flows' found / For more information, try '--help'."
        );
    }

    #[test]
    fn judged_against_expectation_kernel_and_served_ports() {
        let key = PortKey {
            protocol: Protocol::Tcp,
            port: 80,
        };
        let p = |to: &str| (IpFamily::V4, key, "x/a".to_string(), to.to_string());
        let a = |node: &str, policies: &str, agrees: Option<bool>| Answer {
            node: node.into(),
            policies: policies.into(),
            kernel: "deny".into(),
            agrees,
            detail: String::new(),
            raw: Value::Null,
        };
        let expected = BTreeMap::from([
            (p("x/b"), true),
            (p("x/c"), false),
            (p("x/d"), false),
            (p("x/e"), false),
        ]);
        let answers = BTreeMap::from([
            // Agrees on both nodes.
            (
                p("x/b"),
                vec![a("n1", "allow", Some(true)), a("n2", "allow", Some(true))],
            ),
            // Allowed by the policies, but nothing serves x/c's port: expected blocked.
            (p("x/c"), vec![a("n1", "allow", Some(true))]),
            // The policies deny, the kernel of n2 could not be followed.
            (
                p("x/d"),
                vec![a("n1", "deny", Some(true)), a("n2", "deny", None)],
            ),
            // The policies allow a probe expected blocked on a served port.
            (p("x/e"), vec![a("n1", "allow", Some(true))]),
        ]);
        let served = |q: &Probe| q.3 != "x/c";
        let out = judge(&answers, &expected, &served);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            out[0].starts_with("x/a -> x/d TCP/80 IPv4: expected blocked; node n2's kernel: deny"),
            "{out:?}"
        );
        assert!(
            out[1].contains("explain on n1 says the policies allow it"),
            "{out:?}"
        );
    }
}
