//! Bad objects are rejected one by one with a message naming the object and the field;
//! everything else is still compiled, and a bad update never removes what was enforced.

use netpol_agent::agent::Calculation;
use netpol_agent::calc_graph::update::DesiredState;
use netpol_agent::calc_graph::{GraphConfig, RejectKind};
use netpol_agent::datastore::manifests::parse_manifests;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::IpFamily;
use netpol_agent::model::K8sObject;
use netpol_agent::model::ObjectKind;
use netpol_agent::rules::RuleConfig;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: app, labels: {role: server}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: app, labels: {role: client}}
spec: {nodeName: node-2, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: long-label
  namespace: app
  labels: {role: LONGVALUE}
spec: {nodeName: node-2, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.3}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-cidr, namespace: app}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-range, namespace: app}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 90, endPort: 80}]}]
"#;

fn graph() -> Calculation {
    Calculation::new(
        GraphConfig {
            node_name: "node-1".into(),
            families: vec![IpFamily::V4],
            rules: RuleConfig::default(),
        },
        Box::new(CalicoResolver::default()),
    )
}

fn objects() -> Vec<K8sObject> {
    let text = CLUSTER.replace("LONGVALUE", &"x".repeat(300));
    let (objects, errors) = parse_manifests(&text, "cluster.yaml");
    assert!(errors.is_empty(), "{errors:?}");
    objects
}

#[test]
fn each_bad_object_is_named_and_the_rest_is_enforced() {
    let mut g = graph();
    g.feed(&objects());
    let mut state = DesiredState::default();
    state.apply(&g.flush());

    let rejected = g.rejections();
    let message = |kind, key: &str| {
        rejected
            .get(&(kind, key.to_string()))
            .map(|(why, m)| (why.clone(), m.clone()))
    };
    let (why, m) = message(ObjectKind::NetworkPolicy, "app/bad-cidr").expect("bad CIDR rejected");
    assert_eq!(why, RejectKind::Invalid);
    assert!(m.contains("spec.ingress[0].from[0].ipBlock.cidr"), "{m}");
    let (_, m) =
        message(ObjectKind::NetworkPolicy, "app/bad-range").expect("endPort < port rejected");
    assert!(m.contains("endPort"), "{m}");
    let (_, m) = message(ObjectKind::Pod, "app/long-label").expect("300-character label rejected");
    assert!(m.contains("metadata.labels"), "{m}");
    assert_eq!(rejected.len(), 3);

    // The good policy is in force: its chain and its set (with the client's IP).
    let v4 = &state.families[&IpFamily::V4];
    assert!(v4.chains.contains_key("cali-pi-knp/app/good"));
    assert!(!v4.chains.keys().any(|c| c.contains("bad-")));
    let members: Vec<String> = v4
        .sets
        .values()
        .flat_map(|s| s.members.iter().map(|m| m.to_string()))
        .collect();
    assert_eq!(members, ["10.0.0.2"]);
}

#[test]
fn an_invalid_update_keeps_the_last_valid_version() {
    let mut g = graph();
    g.feed(&objects());
    let mut state = DesiredState::default();
    state.apply(&g.flush());
    let before = state.clone();

    let broken = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress: [{from: [{podSelector: {matchExpressions: [{key: role, operator: Contains, values: [c]}]}}]}]
"#;
    let (objs, _) = parse_manifests(broken, "update.yaml");
    g.feed(&objs);
    let update = g.flush();
    assert!(
        update.is_empty(),
        "a rejected update must not change the dataplane: {update:?}"
    );
    state.apply(&update);
    assert_eq!(state, before);
    let (_, m) = &g.rejections()[&(ObjectKind::NetworkPolicy, "app/good".to_string())];
    assert!(m.contains("operator"), "{m}");

    // Fixing the object clears the rejection.
    let (objs, _) = parse_manifests(&broken.replace("Contains", "In"), "update.yaml");
    g.feed(&objs);
    g.flush();
    assert!(!g
        .rejections()
        .contains_key(&(ObjectKind::NetworkPolicy, "app/good".to_string())));
}
