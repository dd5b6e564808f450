//! The judging of one step's records (`judge`, `disagreements`), without a cluster: what must
//! fail does, and what may legitimately sit in a step's window passes.

use super::*;
use serde_json::json;

fn expected(want: Want) -> Expected {
    Expected {
        what: "x/a -> y/b TCP/80 (IPv4) ingress".into(),
        key: RecordKey {
            node: "node-1".into(),
            reporter: "Dst",
            proto: "tcp".into(),
            src_ip: "10.244.1.10".into(),
            dst_ip: "10.244.2.10".into(),
            dst_port: 80,
        },
        src: "x/a".into(),
        dst: "y/b".into(),
        src_labels: vec!["pod=a".into()],
        dst_labels: vec!["app=web".into(), "pod=b".into()],
        required: matches!(want, Want::Record { .. }),
        may_ride: false,
        want,
    }
}

fn record(action: &str, verdict: &str, policies: Value) -> Value {
    json!({
        "node": "node-1", "reporter": "Dst", "proto": "tcp",
        "source_ip": "10.244.1.10", "dest_ip": "10.244.2.10", "dest_port": 80,
        "source_namespace": "x", "source_name": "a",
        "dest_namespace": "y", "dest_name": "b",
        "source_labels": ["pod=a"], "dest_labels": ["app=web", "pod=b"],
        "action": action, "verdict": verdict,
        "policies": {"enforced_policies": policies, "pending_policies": []},
        "end_time": "2026-11-27T04:00:00.5Z",
    })
}

#[test]
fn a_record_agrees_only_with_its_own_verdict() {
    let allow = Want::Record {
        action: "Allow",
        verdict: "rule",
        policies: vec![Enforced {
            kind: "NetworkPolicy".into(),
            namespace: "y".into(),
            name: "allow-x".into(),
            action: "Allow".into(),
            rule_index: 1,
        }],
    };
    let e = expected(allow);
    let good = record(
        "Allow",
        "rule",
        json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "allow-x",
                "tier": "default", "action": "Allow", "rule_index": 1}]),
    );
    assert_eq!(record_key("node-1", &good), Some(e.key.clone()));
    assert!(disagreements(&e, &good).is_empty());
    let other_rule = record(
        "Allow",
        "rule",
        json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "allow-x",
                "tier": "default", "action": "Allow", "rule_index": 0}]),
    );
    assert_eq!(disagreements(&e, &other_rule).len(), 1);
    let mut unnamed = good.clone();
    unnamed["source_name"] = json!("");
    assert_eq!(disagreements(&e, &unnamed).len(), 1, "names a -> b");
    // Labels are the pods' own, in order; stale or missing ones disagree.
    let mut stale = good.clone();
    stale["dest_labels"] = json!(["app=db", "pod=b"]);
    assert_eq!(disagreements(&e, &stale).len(), 1, "dest labels");
    let mut missing = good.clone();
    missing["source_labels"] = json!([]);
    assert_eq!(disagreements(&e, &missing).len(), 1, "source labels");
    let no_policy = Want::Record {
        action: "Allow",
        verdict: "no policy isolates the pod",
        policies: vec![],
    };
    let e = expected(no_policy);
    assert!(!disagreements(&e, &good).is_empty());
    assert!(disagreements(
        &e,
        &record("Allow", "no policy isolates the pod", json!([]))
    )
    .is_empty());
    let cnp = expected(Want::Cluster {
        tier: "Admin",
        name: "deny-all".into(),
        rule: 0,
        action: "Deny",
    });
    let cnp_record = record(
        "Deny",
        "rule",
        json!([{"kind": "ClusterNetworkPolicy", "namespace": "", "name": "deny-all",
                "tier": "Admin", "action": "Deny", "rule_index": 0}]),
    );
    assert!(disagreements(&cnp, &cnp_record).is_empty());
    assert!(!disagreements(&cnp, &good).is_empty());
    let mut other_cnp_rule = cnp_record.clone();
    other_cnp_rule["policies"]["enforced_policies"][0]["rule_index"] = json!(1);
    assert_eq!(disagreements(&cnp, &other_cnp_rule).len(), 1);
    let mut other_tier = cnp_record.clone();
    other_tier["policies"]["enforced_policies"][0]["tier"] = json!("Baseline");
    assert_eq!(disagreements(&cnp, &other_tier).len(), 1);
}

/// Round starts at 04:00:10 (not retried).
fn rounds() -> Rounds {
    let t = SystemTime::from("2026-11-27T04:00:10Z".parse::<jiff::Timestamp>().unwrap());
    Rounds { first: t, last: t }
}

fn allow_rule(rule: i64) -> Want {
    Want::Record {
        action: "Allow",
        verdict: "rule",
        policies: vec![Enforced {
            kind: "NetworkPolicy".into(),
            namespace: "y".into(),
            name: "allow-x".into(),
            action: "Allow".into(),
            rule_index: rule,
        }],
    }
}

fn allow_rule_record(rule: i64) -> Value {
    record(
        "Allow",
        "rule",
        json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "allow-x",
                "tier": "default", "action": "Allow", "rule_index": rule}]),
    )
}

/// A record with its connections started and its times.
fn timed(mut r: Value, started: u64, start: &str, end: &str) -> (String, Value) {
    r["num_connections_started"] = json!(started);
    r["start_time"] = json!(start);
    r["end_time"] = json!(end);
    ("node-1".into(), r)
}

const IN: &str = "2026-11-27T04:00:10.2Z";
const BEFORE: &str = "2026-11-27T04:00:07Z";
const AFTER: &str = "2026-11-27T04:00:11Z";

#[test]
fn the_rounds_records_must_match_its_probes() {
    let e = vec![expected(allow_rule(1))];
    let none = Earlier::default();
    let good = timed(allow_rule_record(1), 1, IN, IN);
    let ok = judge(&e, std::slice::from_ref(&good), rounds(), &none);
    assert!(ok.problems.is_empty(), "{:?}", ok.problems);
    assert_eq!((ok.matched, ok.denied, ok.records), (1, 0, 1));

    // A probe without its record.
    let missing = judge(&e, &[], rounds(), &none);
    assert_eq!(missing.problems.len(), 1, "{:?}", missing.problems);
    assert!(missing.problems[0].contains("no record"));

    // The wrong rule index, the wrong action, the wrong policy: each fails, and the
    // probe then lacks an agreeing record too.
    for wrong in [
        allow_rule_record(0),
        record("Deny", "isolated, no rule allowed", json!([])),
        record(
            "Allow",
            "rule",
            json!([{"kind": "NetworkPolicy", "namespace": "y", "name": "other",
                    "tier": "default", "action": "Allow", "rule_index": 1}]),
        ),
    ] {
        let r = timed(wrong, 1, IN, IN);
        let c = judge(&e, &[r], rounds(), &none);
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        assert_eq!(c.matched, 0);
        // Alongside a right record, the wrong one still fails.
        let c = judge(
            &e,
            &[good.clone(), timed(allow_rule_record(0), 1, IN, IN)],
            rounds(),
            &none,
        );
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    }

    // A record of a flow no probe sent (another destination port).
    let mut unsent = allow_rule_record(1);
    unsent["dest_port"] = json!(81);
    let c = judge(
        &e,
        &[good.clone(), timed(unsent.clone(), 1, IN, IN)],
        rounds(),
        &none,
    );
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    assert!(c.problems[0].contains("no probe of the step sent"));
    // ... also when it began before the round, unless an earlier step probed it.
    let c = judge(
        &e,
        &[good.clone(), timed(unsent.clone(), 1, BEFORE, AFTER)],
        rounds(),
        &none,
    );
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    // A record without a readable start is held strictly.
    let mut no_start = timed(unsent, 1, BEFORE, AFTER);
    no_start.1["start_time"] = json!(null);
    let c = judge(&e, &[good, no_start], rounds(), &none);
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
}

#[test]
fn counts_and_earlier_steps_records_are_told_apart() {
    let e = vec![expected(allow_rule(1))];
    let good = timed(allow_rule_record(1), 1, IN, IN);
    let none = Earlier::default();
    // Conntrack's counts of an earlier connection, with another verdict and even another
    // port: no connection started, not judged, and no stand-in for the probe's record.
    let mut counts = allow_rule_record(0);
    counts["dest_port"] = json!(81);
    let counts = timed(counts, 0, AFTER, AFTER);
    let c = judge(&e, &[good.clone(), counts.clone()], rounds(), &none);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.count_only, 1);
    assert_eq!(judge(&e, &[counts], rounds(), &none).problems.len(), 1);

    // The previous step expected rule 0 for this key: its record, begun before the round
    // and reaching into it, is accepted; without that step it is not.
    let mut earlier = Earlier::default();
    earlier.remember(&[expected(allow_rule(0))]);
    let straddling = timed(allow_rule_record(0), 1, BEFORE, AFTER);
    let c = judge(&e, &[good.clone(), straddling.clone()], rounds(), &earlier);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.carried, 1);
    assert_eq!(
        judge(&e, &[good.clone(), straddling], rounds(), &none)
            .problems
            .len(),
        1
    );
    // The earlier verdict on a record begun in the round is wrong.
    let c = judge(
        &e,
        &[good.clone(), timed(allow_rule_record(0), 1, IN, IN)],
        rounds(),
        &earlier,
    );
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    // A verdict no step expected, begun before the round, fails.
    let c = judge(
        &e,
        &[good.clone(), timed(allow_rule_record(2), 1, BEFORE, AFTER)],
        rounds(),
        &earlier,
    );
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    // The earlier record does not stand in for the round's.
    assert_eq!(
        judge(
            &e,
            &[timed(allow_rule_record(0), 1, BEFORE, AFTER)],
            rounds(),
            &earlier
        )
        .problems
        .len(),
        1
    );

    // A retried step: a record of a probed key begun in the first round is accepted
    // whatever it says; one begun before the first round is not.
    let retried = Rounds {
        first: SystemTime::from("2026-11-27T04:00:05Z".parse::<jiff::Timestamp>().unwrap()),
        last: rounds().last,
    };
    let first_round = timed(allow_rule_record(2), 1, BEFORE, AFTER);
    assert!(judge(&e, &[good.clone(), first_round], retried, &none)
        .problems
        .is_empty());
    let older = timed(allow_rule_record(2), 1, "2026-11-27T04:00:01Z", AFTER);
    assert_eq!(judge(&e, &[good, older], retried, &none).problems.len(), 1);
}

#[test]
fn a_udp_probe_may_ride_an_earlier_connection_only_with_its_traffic() {
    // A real cluster's UDP probe (the client picks its port); its key is this UDP flow.
    let udp = |mut e: Expected| {
        e.key.proto = "udp".into();
        e.may_ride = true;
        e
    };
    let udp_record = |r: (String, Value)| {
        let (node, mut r) = r;
        r["proto"] = json!("udp");
        (node, r)
    };
    let none = Earlier::default();
    // The earlier connection of the key: logged before the round, whose packets a poll in
    // the round counted.
    let ridden = |rule: i64, active: Option<&str>, packets: u64| {
        let (node, mut r) = udp_record(timed(allow_rule_record(rule), 1, BEFORE, BEFORE));
        r["last_active_time"] = json!(active);
        r["packets_in"] = json!(packets);
        r["packets_out"] = json!(packets);
        (node, r)
    };
    let e = vec![udp(expected(allow_rule(1)))];
    let c = judge(&e, &[ridden(1, Some(AFTER), 1)], rounds(), &none);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!((c.rode, c.matched), (1, 0));
    // A record of counts alone made in the round is such a trace too.
    let mut counts = udp_record(timed(allow_rule_record(1), 0, IN, IN));
    counts.1["last_active_time"] = json!(IN);
    counts.1["packets_out"] = json!(1);
    let c = judge(&e, &[counts], rounds(), &none);
    assert_eq!((c.problems.len(), c.rode, c.count_only), (0, 1, 1));
    // No traffic in the round, no packets, or another verdict (this step's or an earlier
    // step's): still no record of the probe.
    for (r, why) in [
        (ridden(1, Some(BEFORE), 1), "last traffic before the round"),
        (ridden(1, None, 1), "no traffic in the interval"),
        (ridden(1, Some(AFTER), 0), "no packets"),
        (ridden(0, Some(AFTER), 1), "another rule"),
    ] {
        let c = judge(&e, &[r], rounds(), &none);
        assert_eq!(
            (c.problems.len(), c.rode),
            (1, 0),
            "{why}: {:?}",
            c.problems
        );
    }
    // ... unless an earlier step expected that verdict of the key (the kernel did not
    // judge the ridden connection again).
    let mut earlier = Earlier::default();
    earlier.remember(&[udp(expected(allow_rule(0)))]);
    let c = judge(&e, &[ridden(0, Some(AFTER), 1)], rounds(), &earlier);
    assert_eq!((c.problems.len(), c.rode), (0, 1), "{:?}", c.problems);
    // TCP cannot ride (a SYN on a closed entry starts over), nor can the simulated runs'
    // probes (the runner picks their ports): the same trace does not stand in.
    let tcp = vec![expected(allow_rule(1))];
    let mut tcp_ridden = timed(allow_rule_record(1), 1, BEFORE, BEFORE);
    tcp_ridden.1["last_active_time"] = json!(AFTER);
    tcp_ridden.1["packets_out"] = json!(1);
    assert_eq!(
        judge(&tcp, &[tcp_ridden], rounds(), &none).problems.len(),
        1
    );
    let mut sim = udp(expected(allow_rule(1)));
    sim.may_ride = false;
    let c = judge(&[sim], &[ridden(1, Some(AFTER), 1)], rounds(), &none);
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
}

#[test]
fn a_cluster_policy_decision_is_required() {
    let cnp = Want::Cluster {
        tier: "Baseline",
        name: "default-deny".into(),
        rule: 2,
        action: "Deny",
    };
    let mut e = expected(cnp);
    e.required = true;
    let e = vec![e];
    let none = Earlier::default();
    let missing = judge(&e, &[], rounds(), &none);
    assert_eq!(missing.problems.len(), 1, "{:?}", missing.problems);
    let r = timed(
        record(
            "Deny",
            "rule",
            json!([{"kind": "ClusterNetworkPolicy", "namespace": "", "name": "default-deny",
                    "tier": "Baseline", "action": "Deny", "rule_index": 2}]),
        ),
        1,
        IN,
        IN,
    );
    let c = judge(&e, &[r], rounds(), &none);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!((c.matched, c.denied, c.cluster_decided), (1, 1, 1));
    let c = judge(
        &e,
        &[timed(
            record("Deny", "isolated, no rule allowed", json!([])),
            1,
            IN,
            IN,
        )],
        rounds(),
        &none,
    );
    assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
}

/// The real cluster's check reads explain's JSON (`want_of_json`); the simulated one the
/// verdict itself (`want_of`). Over every pair and tier outcome of a small cluster, the two
/// readings must be the same.
#[test]
fn explain_json_reads_as_the_verdict_does() {
    use netpol_agent::datastore::manifests::parse_manifests;
    use netpol_agent::model::{ObjectKey, Protocol};
    use netpol_agent::rules::RuleConfig;
    use netpol_agent::verdict::{Flow, State};
    let text = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: b}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {phase: Running, podIP: 10.0.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x, labels: {app: b}}
spec: {nodeName: n2, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {phase: Running, podIP: 10.0.2.1}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: y, labels: {app: c}}
spec: {nodeName: n2, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {phase: Running, podIP: 10.0.2.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-a, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{from: [{podSelector: {}}], ports: [{port: 80}]}, {from: [{podSelector: {matchLabels: {app: a}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-deny-out, namespace: x}
spec: {podSelector: {matchLabels: {app: a}}, policyTypes: [Egress]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: b}}}
  ingress:
  - {name: deny-x, action: Deny, from: [{namespaces: {matchLabels: {team: a}}}], ports: [{portNumber: {port: 81, protocol: TCP}}]}
  - {name: allow-x, action: Accept, from: [{namespaces: {matchLabels: {team: a}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  egress:
  - {name: deny-y, action: Deny, to: [{namespaces: {matchLabels: {team: b}}}]}
"#;
    let (objects, errors) = parse_manifests(text, "t.yaml");
    assert!(errors.is_empty(), "{errors:?}");
    let (state, invalid) = State::from_objects(RuleConfig::default(), &objects);
    assert!(invalid.is_empty(), "{invalid:?}");
    let pods = [("x", "a"), ("x", "b"), ("y", "c")];
    let mut kinds = std::collections::BTreeSet::new();
    for from in pods {
        for to in pods {
            for port in [80, 81] {
                let flow = Flow {
                    src: Endpoint::Pod(ObjectKey::new(from.0, from.1)),
                    dst: Endpoint::Pod(ObjectKey::new(to.0, to.1)),
                    protocol: Protocol::Tcp,
                    port,
                };
                let v = state.explain(&state.resolve(&flow).unwrap());
                for side in [&v.egress, &v.ingress] {
                    let want = want_of(side);
                    assert_eq!(
                        want_of_json(&side.to_json()),
                        want,
                        "{from:?} -> {to:?} {port}"
                    );
                    kinds.insert(match want {
                        None => "unpoliced",
                        Some(Want::Record { verdict, .. }) => verdict,
                        Some(Want::Cluster { tier: "Admin", .. }) => "admin",
                        Some(Want::Cluster { .. }) => "baseline",
                    });
                }
            }
        }
    }
    // Every kind of answer was met: unpoliced, no policy, a rule, isolation, both tiers.
    assert_eq!(
        kinds,
        std::collections::BTreeSet::from([
            "unpoliced",
            "no policy isolates the pod",
            "rule",
            "isolated, no rule allowed",
            "admin",
            "baseline"
        ]),
    );
}
