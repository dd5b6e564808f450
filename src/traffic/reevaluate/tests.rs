//! Which pods a change marks, and which tracked flows the new state denies.

use super::*;
use crate::datastore::manifests::parse_manifests;
use crate::host::conntrack::CtTuple;
use crate::model::DatastoreEvent;

const NODE: &str = "n1";

/// Namespaces x (team a) and y (team b); local pods x/web (app web, 10.0.0.1), x/db (app
/// db, 10.0.0.2), x/other (app other, 10.0.0.4); remote pods x/client (app client, 10.0.1.1)
/// and y/tool (app tool, 10.0.1.2).
const WORLD: &str = r#"
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
metadata: {name: web, namespace: x, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: x, labels: {app: db}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: x, labels: {app: other}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.0.4}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: x, labels: {app: client}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: tool, namespace: y, labels: {app: tool}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.2}
"#;

/// db accepts port 5432 from web, and from every pod of team-a namespaces labelled app=tool.
const DB_POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: x}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: web}}
    - namespaceSelector: {matchLabels: {team: a}}
      podSelector: {matchLabels: {app: tool}}
    ports: [{port: 5432}]
"#;

fn changes(yaml: &str) -> Vec<Change> {
    let (objects, errors) = parse_manifests(yaml, "test");
    assert!(errors.is_empty(), "{errors:?}");
    objects
        .into_iter()
        .filter_map(|o| Change::of_event(&DatastoreEvent::Upsert(Box::new(o))))
        .collect()
}

fn apply(m: &mut Mirror, yaml: &str) -> Marked {
    let mut marked = Marked::new();
    for c in changes(yaml) {
        m.apply(c, &mut marked);
    }
    marked
}

fn key(s: &str) -> ObjectKey {
    let (ns, name) = s.split_once('/').unwrap();
    ObjectKey::new(ns, name)
}

fn marked_names(marked: &Marked) -> Vec<String> {
    marked.keys().map(|k| k.to_string()).collect()
}

fn world() -> Mirror {
    let mut m = Mirror::new(NODE);
    apply(&mut m, WORLD);
    m
}

fn delete(kind: ObjectKind, k: &str) -> Change {
    Change::of_event(&DatastoreEvent::Delete(crate::model::ObjectRef {
        kind,
        key: k.into(),
    }))
    .unwrap()
}

#[test]
fn a_world_without_policies_marks_nothing_and_new_pods_never_do() {
    let mut m = Mirror::new(NODE);
    assert!(
        apply(&mut m, WORLD).is_empty(),
        "pods and namespaces arriving"
    );
    apply(&mut m, DB_POLICY);
    let new_pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: web2, namespace: x, labels: {app: web}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.9}
"#;
    assert!(apply(&mut m, new_pod).is_empty(), "a new peer only widens");
}

#[test]
fn a_policy_marks_the_local_pods_it_selects_before_and_after() {
    let mut m = world();
    let marked = apply(&mut m, DB_POLICY);
    assert_eq!(
        marked_names(&marked),
        ["x/db"],
        "remote and unselected pods are not marked"
    );
    assert_eq!(marked[&key("x/db")], [Cause::PolicyAdded(key("x/db"))]);
    // The same policy again: nothing changed.
    assert!(apply(&mut m, DB_POLICY).is_empty());
    // The selector moves from db to web: both lose or gain isolation.
    let moved = DB_POLICY.replace(
        "matchLabels: {app: db}}\n  ingress",
        "matchLabels: {app: web}}\n  ingress",
    );
    let marked = apply(&mut m, &moved);
    assert_eq!(marked_names(&marked), ["x/db", "x/web"]);
    assert_eq!(marked[&key("x/web")], [Cause::PolicyChanged(key("x/db"))]);
    let mut marked = Marked::new();
    m.apply(delete(ObjectKind::NetworkPolicy, "x/db"), &mut marked);
    assert_eq!(marked_names(&marked), ["x/web"]);
    assert_eq!(marked[&key("x/web")], [Cause::PolicyDeleted(key("x/db"))]);
}

#[test]
fn peers_mark_the_pods_whose_policies_selected_their_old_version() {
    let mut m = world();
    apply(&mut m, DB_POLICY);
    // web is relabelled: db's policy selected it as a peer; web itself is local and relabelled.
    let web_v2 = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: x, labels: {app: web2}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.0.1}
"#;
    let marked = apply(&mut m, web_v2);
    assert_eq!(marked_names(&marked), ["x/db", "x/web"]);
    assert_eq!(marked[&key("x/db")], [Cause::PeerChanged(key("x/web"))]);
    assert_eq!(marked[&key("x/web")], [Cause::Relabelled(key("x/web"))]);
    // A pod no policy talks about changes labels: nothing (the label churn case).
    let client_v2 = r#"
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: x, labels: {app: client, rev: "2"}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {phase: Running, podIP: 10.0.1.1}
"#;
    assert!(apply(&mut m, client_v2).is_empty());
    // tool is in namespace y (team b): db's policy never selected it.
    let mut marked = Marked::new();
    m.apply(delete(ObjectKind::Pod, "y/tool"), &mut marked);
    assert!(marked.is_empty());
    // Namespace y becomes team a: that only widens. Back to team b: db may lose tool.
    let y_a = "apiVersion: v1\nkind: Namespace\nmetadata: {name: y, labels: {team: a}}\n";
    let y_b = "apiVersion: v1\nkind: Namespace\nmetadata: {name: y, labels: {team: b}}\n";
    assert!(apply(&mut m, y_a).is_empty());
    let marked = apply(&mut m, y_b);
    assert_eq!(marked_names(&marked), ["x/db"]);
    assert_eq!(marked[&key("x/db")], [Cause::NamespaceChanged("y".into())]);
}

#[test]
fn causes_are_kept_once_and_at_most_a_few() {
    let mut marked = Marked::new();
    let pod = key("x/db");
    for i in 0..10 {
        mark(
            &mut marked,
            &pod,
            &Cause::PeerChanged(key(&format!("x/p{}", i % 6))),
        );
        mark(&mut marked, &pod, &Cause::PeerChanged(key("x/p0")));
    }
    assert_eq!(marked[&pod].len(), MAX_CAUSES);
    assert_eq!(marked[&pod][0], Cause::PeerChanged(key("x/p0")));
    assert_eq!(marked[&pod][1], Cause::PeerChanged(key("x/p1")));
}

fn tuple(proto: u8, src: &str, sport: u16, dst: &str, dport: u16) -> CtTuple {
    CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol: proto,
        src_port: Some(sport),
        dst_port: Some(dport),
        icmp: None,
    }
}

/// An entry as conntrack keeps it: the reply tuple is the original reversed, after `dnat`
/// (the real destination) when the original went to a ClusterIP.
fn entry(
    proto: u8,
    src: &str,
    sport: u16,
    dst: &str,
    dport: u16,
    dnat: Option<(&str, u16)>,
) -> (CtTuple, CtTuple) {
    let (rsrc, rsport) = dnat.unwrap_or((dst, dport));
    (
        tuple(proto, src, sport, dst, dport),
        tuple(proto, rsrc, rsport, src, sport),
    )
}

#[test]
fn only_denied_flows_of_marked_pods_are_cut() {
    let mut m = world();
    let mut marked = apply(&mut m, DB_POLICY);
    // web is marked too, to show its flows are judged (and allowed) as well.
    mark(&mut marked, &key("x/web"), &Cause::Relabelled(key("x/web")));
    let state = m.state(RuleConfig::default(), &["192.168.0.1".parse().unwrap()]);
    let pods = m.addresses_of(&marked);
    assert_eq!(pods.len(), 2);
    let entries = [
        // 0: web -> db:5432, allowed.
        entry(6, "10.0.0.1", 40000, "10.0.0.2", 5432, None),
        // 1: client -> db:5432 through a ClusterIP: db's ingress denies it.
        entry(
            6,
            "10.0.1.1",
            40001,
            "10.96.0.10",
            5432,
            Some(("10.0.0.2", 5432)),
        ),
        // 2: web -> db:22: denied (wrong port).
        entry(6, "10.0.0.1", 40002, "10.0.0.2", 22, None),
        // 3: UDP client -> db:5432: denied (the port entry is TCP).
        entry(17, "10.0.1.1", 40003, "10.0.0.2", 5432, None),
        // 4: the node to db: not policed.
        entry(6, "192.168.0.1", 40004, "10.0.0.2", 22, None),
        // 5: other -> client: other is not marked, whatever policy says.
        entry(6, "10.0.0.4", 40005, "10.0.1.1", 80, None),
        // 6: db -> client: db's egress is not isolated.
        entry(6, "10.0.0.2", 40006, "10.0.1.1", 80, None),
    ];
    let mut icmp = entry(1, "10.0.1.1", 0, "10.0.0.2", 0, None);
    icmp.0.src_port = None;
    icmp.1.src_port = None;
    let mut all: Vec<(CtTuple, CtTuple)> = entries.to_vec();
    // 7: ICMP: left alone.
    all.push(icmp);
    let cuts = decide(&state, &pods, all.iter().map(|(o, r)| (o, r)));
    let cut: Vec<usize> = cuts.iter().map(|c| c.entry).collect();
    assert_eq!(cut, [1, 2, 3]);
    let c = &cuts[0];
    assert_eq!(c.listed_for, key("x/db"));
    assert_eq!(
        (c.denying_pod.clone(), c.denied_by),
        (Some(key("x/db")), Direction::Ingress)
    );
    assert_eq!(
        (c.src_name.as_str(), c.dst_name.as_str()),
        ("x/client", "x/db")
    );
    assert_eq!(c.dst.to_string(), "10.0.0.2", "judged after DNAT");
    assert_eq!((c.protocol, c.port), (Protocol::Tcp, 5432));
    // Listed for web (its source), denied by db's ingress.
    assert_eq!(cuts[1].listed_for, key("x/web"));
    assert_eq!(
        (cuts[1].denying_pod.clone(), cuts[1].denied_by),
        (Some(key("x/db")), Direction::Ingress)
    );
    // Without the policy, nothing is denied.
    let mut open = world();
    let state = open.state(RuleConfig::default(), &[]);
    assert!(decide(
        &state,
        &open.addresses_of(&marked),
        all.iter().map(|(o, r)| (o, r))
    )
    .is_empty());
    // Deleted pods have no addresses left to list.
    open.apply(delete(ObjectKind::Pod, "x/db"), &mut Marked::new());
    assert_eq!(open.addresses_of(&marked).len(), 1);
}

#[test]
fn ipv6_flows_are_judged_like_ipv4_ones() {
    let world6 = WORLD
        .replace("podIP: 10.0.0.1", "podIP: fd00::1")
        .replace("podIP: 10.0.0.2", "podIP: fd00::2")
        .replace("podIP: 10.0.1.1", "podIP: fd00:1::1");
    let mut m = Mirror::new(NODE);
    apply(&mut m, &world6);
    let marked = apply(&mut m, DB_POLICY);
    let state = m.state(RuleConfig::default(), &[]);
    let all = [
        entry(6, "fd00::1", 40000, "fd00::2", 5432, None),
        entry(6, "fd00:1::1", 40001, "fd00::2", 5432, None),
    ];
    let cuts = decide(
        &state,
        &m.addresses_of(&marked),
        all.iter().map(|(o, r)| (o, r)),
    );
    assert_eq!(cuts.iter().map(|c| c.entry).collect::<Vec<_>>(), [1]);
}
