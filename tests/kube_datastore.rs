//! The Kubernetes datastore against a fake API server (`kube_api`) that speaks the real
//! list/watch protocol, through the public API (`datastore::kube::spawn_with`) and the real
//! `kube::Client`: the graph it feeds equals `compile` of the same manifests, relists never
//! remove anything on the way, `InSync` comes once after all four listings, non-workload pods
//! get no endpoints, what is delivered is trimmed yet validates as the original, and a
//! ClusterNetworkPolicy CRD that is not installed is an empty listing, looked for again
//! slowly and followed once it is there. Most tests list in pages; the streaming-list tests
//! use streaming lists where the server serves them and check the fallback to pages where it
//! refuses or ignores them.

mod kube_api;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube_api::{key_of, yaml_objects, FakeApi, Gone, Res, Served, Streaming, ALL, STAGED};
use netpol_agent::agent::Calculation;
use netpol_agent::backoff::Policy;
use netpol_agent::calc_graph::update::DesiredState;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::datastore::kube::{
    spawn_with, InitialList, KubeConnect, KubeOptions, KubeThread,
};
use netpol_agent::datastore::manifests::parse_manifests;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::validate;
use netpol_agent::model::IpFamily;
use netpol_agent::model::ObjectKind;
use netpol_agent::model::{ClusterNetworkPolicy, K8sObject};
use netpol_agent::model::{DatastoreEvent, ObjectRef};
use netpol_agent::rules::sets::Member;
use netpol_agent::rules::RuleConfig;
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(10);
const NODE: &str = "node-1";
/// Small pages, so that every listing is paginated (`limit`/`continue`).
const PAGE: u32 = 2;

// ---- the cluster ----

const NAMESPACES: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Namespace
metadata: {name: monitoring, labels: {team: ops}}
---
apiVersion: v1
kind: Namespace
metadata: {name: data, labels: {team: data, tier: storage}}
";

const PODS: &str = "
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-1
  containers: [{name: web, image: nginx, ports: [{name: http, containerPort: 80}]}]
status: {phase: Running, podIP: 10.244.1.10, podIPs: [{ip: 10.244.1.10}, {ip: 'fd00:244:1::10'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: shop, labels: {app: api}}
spec:
  nodeName: node-1
  initContainers: [{name: proxy, image: envoy, restartPolicy: Always, ports: [{name: admin, containerPort: 15000}]}]
  containers:
  - {name: api, image: api, ports: [{containerPort: 7000}, {name: api, containerPort: 8080}, {name: metrics, containerPort: 9090}]}
status: {phase: Running, podIPs: [{ip: 10.244.1.11}, {ip: 'fd00:244:1::11'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-2, namespace: shop, labels: {app: api}}
spec:
  nodeName: node-2
  containers: [{name: api, image: api, ports: [{name: api, containerPort: 8080}, {name: metrics, containerPort: 9090}]}]
status: {phase: Running, podIPs: [{ip: 10.244.2.11}, {ip: 'fd00:244:2::11'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: data, labels: {app: db}}
spec:
  nodeName: node-2
  containers: [{name: db, image: postgres, ports: [{name: postgres, containerPort: 5432}]}]
status: {phase: Running, podIP: 10.244.2.20}
---
apiVersion: v1
kind: Pod
metadata: {name: cache, namespace: data, labels: {app: cache}}
spec:
  nodeName: node-1
  containers: [{name: redis, image: redis, ports: [{name: redis, containerPort: 6379}]}]
status: {phase: Running, podIPs: [{ip: 10.244.1.30}, {ip: 'fd00:244:1::30'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: prometheus, namespace: monitoring, labels: {app: prometheus}}
spec:
  nodeName: node-3
  containers: [{name: prometheus, image: prometheus}]
status: {phase: Running, podIPs: [{ip: 10.244.3.30}, {ip: 'fd00:244:3::30'}]}
";

const POLICIES: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: shop}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{ports: [{port: http}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-ingress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: web}}
    - namespaceSelector: {matchLabels: {team: ops}}
      podSelector: {matchLabels: {app: prometheus}}
    ports: [{port: api}, {port: metrics}]
  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
    ports: [{port: 8080, endPort: 8090, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-egress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchExpressions: [{key: tier, operator: In, values: [storage]}]}
      podSelector: {matchLabels: {app: db}}
    ports: [{port: postgres}]
  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: [169.254.169.254/32]}}, {ipBlock: {cidr: '::/0'}}]
    ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cache-ingress, namespace: data}
spec:
  podSelector: {matchLabels: {app: cache}}
  ingress:
  - from: [{namespaceSelector: {}}]
    ports: [{port: redis}]
  - from: [{ipBlock: {cidr: 'fd00::/8'}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-data}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: data}}}
  ingress:
  - name: from-shop
    action: Accept
    from: [{namespaces: {matchLabels: {team: shop}}}]
    protocols: [{tcp: {destinationPort: {number: 6379}}}, {destinationNamedPort: redis}]
  - {action: Deny, from: [{namespaces: {}}]}
  egress:
  - {action: Deny, to: [{networks: [169.254.169.254/32, 'fd00:ec2::254/128']}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-shop}
spec:
  tier: Baseline
  priority: 0
  subject: {pods: {namespaceSelector: {matchLabels: {team: shop}}, podSelector: {matchLabels: {app: web}}}}
  ingress: [{action: Deny, from: [{pods: {podSelector: {matchLabels: {app: prometheus}}}}]}]
";

fn cluster() -> String {
    format!("{NAMESPACES}---{PODS}---{POLICIES}")
}

// ---- helpers ----

fn options() -> KubeOptions {
    KubeOptions {
        initial_list: InitialList::Paginated,
        page_size: Some(PAGE),
        watch_timeout: None,
        backoff: Policy {
            first: Duration::from_millis(5),
            ceiling: Some(Duration::from_millis(50)),
            ..Policy::KUBE_WATCH
        },
        backoff_reset: Duration::from_secs(120),
        missing_crd_recheck: RECHECK,
    }
}

/// How often the datastore looks again for an uninstalled ClusterNetworkPolicy CRD here.
const RECHECK: Duration = Duration::from_millis(50);

/// The datastore under test, started through its public API against the fake server.
struct Source {
    rx: Receiver<DatastoreEvent>,
    thread: Option<KubeThread>,
}

impl Source {
    fn start(api: &FakeApi) -> Source {
        Source::start_with(api, options())
    }

    fn start_with(api: &FakeApi, options: KubeOptions) -> Source {
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = spawn_with(KubeConnect::Url(api.url.clone()), options, tx, stop)
            .expect("the datastore starts");
        Source {
            rx,
            thread: Some(thread),
        }
    }

    fn recv(&self) -> DatastoreEvent {
        self.rx
            .recv_timeout(TIMEOUT)
            .expect("an event from the datastore")
    }

    /// Every event up to and including `InSync`.
    fn until_in_sync(&self) -> Vec<DatastoreEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.recv();
            let done = matches!(event, DatastoreEvent::InSync);
            events.push(event);
            if done {
                return events;
            }
        }
    }

    /// What has been delivered and not read yet.
    fn pending(&self) -> Vec<DatastoreEvent> {
        self.rx.try_iter().collect()
    }

    fn shutdown(mut self) -> anyhow::Result<()> {
        self.thread
            .take()
            .expect("running")
            .stop()
            .expect("no panic")
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.stop();
        }
    }
}

fn graph() -> Calculation {
    Calculation::new(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4, IpFamily::V6],
            rules: RuleConfig::default(),
        },
        Box::new(CalicoResolver::default()),
    )
}

/// What `netpol-agent compile` computes from manifests.
fn compiled(yaml: &str) -> Calculation {
    let (objects, errors) = parse_manifests(yaml, "test");
    assert!(errors.is_empty(), "{errors:?}");
    compiled_objects(&objects)
}

fn compiled_objects(objects: &[K8sObject]) -> Calculation {
    let mut g = graph();
    g.feed(objects);
    g.flush();
    g
}

/// The server's current objects, as the manifests they are.
fn server_objects(api: &FakeApi) -> Vec<K8sObject> {
    let mut out = Vec::new();
    for res in ALL {
        for obj in api.objects(res) {
            out.push(match res {
                Res::Pods => K8sObject::Pod(serde_json::from_value(obj).unwrap()),
                Res::Namespaces => K8sObject::Namespace(serde_json::from_value(obj).unwrap()),
                Res::Policies => K8sObject::NetworkPolicy(serde_json::from_value(obj).unwrap()),
                Res::ClusterPolicies => {
                    K8sObject::ClusterNetworkPolicy(serde_json::from_value(obj).unwrap())
                }
                Res::StagedPolicies | Res::StagedClusterPolicies => {
                    unreachable!("ALL holds no staged kind")
                }
            });
        }
    }
    out
}

/// The ipset and iptables restore scripts of both families, as `compile` renders them.
fn scripts(state: &DesiredState) -> String {
    let cfg = RuleConfig::default();
    let mut out = String::new();
    for (family, fam) in &state.families {
        let scripts = fam.restore_scripts(&cfg, *family, 1_048_576);
        out.push_str(&scripts.ipsets);
        out.push_str(&scripts.iptables);
    }
    out
}

fn assert_same_graph(got: &Calculation, want: &Calculation) {
    assert_eq!(
        scripts(&got.snapshot()),
        scripts(&want.snapshot()),
        "rendered scripts differ"
    );
    assert_eq!(got.snapshot(), want.snapshot());
    assert_eq!(got.local_endpoint_count(), want.local_endpoint_count());
    assert_eq!(got.active_policy_count(), want.active_policy_count());
    assert_eq!(got.rejections(), want.rejections());
}

/// Every address that is a member of some set.
fn member_ips(state: &DesiredState) -> BTreeSet<IpAddr> {
    state
        .families
        .values()
        .flat_map(|f| f.sets.values())
        .flat_map(|s| s.members.iter())
        .map(|m| match m {
            Member::Addr(ip) | Member::AddrPort(ip, _, _) => *ip,
        })
        .collect()
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// What `after` lacks of `before`: sets, members, chains, rules.
fn losses(before: &DesiredState, after: &DesiredState) -> Vec<String> {
    let mut lost = Vec::new();
    for (family, fam) in &before.families {
        let next = after.families.get(family).cloned().unwrap_or_default();
        for (name, set) in &fam.sets {
            match next.sets.get(name) {
                None => lost.push(format!("set {name}")),
                Some(now) => lost.extend(
                    set.members
                        .difference(&now.members)
                        .map(|m| format!("member {m:?} of {name}")),
                ),
            }
        }
        for (name, chain) in &fam.chains {
            match next.chains.get(name) {
                None => lost.push(format!("chain {name}")),
                Some(now) => lost.extend(
                    chain
                        .rules
                        .iter()
                        .filter(|r| !now.rules.contains(r))
                        .map(|r| format!("rule {r:?} of {name}")),
                ),
            }
        }
    }
    lost
}

/// A graph fed one event at a time and flushed after each (the finest the agent could
/// apply), with the state its updates build.
struct Tracker {
    graph: Calculation,
    state: DesiredState,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            graph: graph(),
            state: DesiredState::default(),
        }
    }

    /// Applies one event and returns what the state lost through it.
    fn apply(&mut self, event: &DatastoreEvent) -> Vec<String> {
        self.graph.apply(event);
        let update = self.graph.flush();
        let before = self.state.clone();
        self.state.apply(&update);
        losses(&before, &self.state)
    }

    fn apply_without_loss(&mut self, event: &DatastoreEvent) {
        let lost = self.apply(event);
        assert!(lost.is_empty(), "{event:?} removed {lost:#?}");
    }
}

fn key_set(events: &[DatastoreEvent]) -> BTreeSet<(ObjectKind, String, &'static str)> {
    events
        .iter()
        .filter_map(|e| match e {
            DatastoreEvent::Upsert(o) => {
                let r = o.object_ref();
                Some((r.kind, r.key, "upsert"))
            }
            DatastoreEvent::Delete(r) => Some((r.kind, r.key.clone(), "delete")),
            DatastoreEvent::InSync | DatastoreEvent::Access { .. } => None,
        })
        .collect()
}

fn upserts_of(api: &FakeApi, kinds: &[Res]) -> BTreeSet<(ObjectKind, String, &'static str)> {
    kinds
        .iter()
        .flat_map(|res| {
            let kind = match res {
                Res::Pods => ObjectKind::Pod,
                Res::Namespaces => ObjectKind::Namespace,
                Res::Policies => ObjectKind::NetworkPolicy,
                Res::ClusterPolicies => ObjectKind::ClusterNetworkPolicy,
                Res::StagedPolicies => ObjectKind::StagedNetworkPolicy,
                Res::StagedClusterPolicies => ObjectKind::StagedClusterNetworkPolicy,
            };
            api.objects(*res)
                .into_iter()
                .map(move |o| (kind, key_of(&o), "upsert"))
        })
        .collect()
}

/// Waits until, after request `since`, `res` was listed again and is being watched.
fn wait_relisted(api: &FakeApi, res: Res, since: usize) {
    api.wait_for(&format!("a relist and a new watch of {res:?}"), |api| {
        let requests = api.requests();
        let after = &requests[since..];
        let Some(list) = after.iter().position(|r| r.res == res && !r.watch) else {
            return false;
        };
        after[list..].iter().any(|r| r.res == res && r.watch) && api.open_watches(res) > 0
    });
}

/// Applies the difference between two versions of the manifests to the server.
fn sync_server(api: &FakeApi, old: &str, new: &str) {
    let index = |text: &str| -> BTreeMap<(String, String), Value> {
        yaml_objects(text)
            .into_iter()
            .map(|o| ((o["kind"].as_str().unwrap().to_string(), key_of(&o)), o))
            .collect()
    };
    let (old, new) = (index(old), index(new));
    for ((kind, key), obj) in &new {
        if old.get(&(kind.clone(), key.clone())) != Some(obj) {
            api.apply(obj.clone());
        }
    }
    for (kind, key) in old.keys() {
        if !new.contains_key(&(kind.clone(), key.clone())) {
            let res = match kind.as_str() {
                "Pod" => Res::Pods,
                "Namespace" => Res::Namespaces,
                "ClusterNetworkPolicy" => Res::ClusterPolicies,
                _ => Res::Policies,
            };
            api.delete(res, key);
        }
    }
}

/// Feeds events to `graph` until it equals `want` (or times out).
fn converge(source: &Source, graph: &mut Calculation, want: &Calculation) {
    let deadline = Instant::now() + TIMEOUT;
    while graph.snapshot() != want.snapshot() {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = source
            .rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the graph did not converge; last state differs"));
        graph.apply(&event);
        graph.flush();
    }
    assert_same_graph(graph, want);
}

// ---- tests ----

#[test]
fn graph_fed_from_the_api_equals_compile_of_the_same_manifests() {
    let api = FakeApi::start();
    let manifests = cluster();
    api.apply_yaml(&manifests);
    let source = Source::start(&api);

    let mut from_api = graph();
    for event in source.until_in_sync() {
        from_api.apply(&event);
    }
    from_api.flush();
    let want = compiled(&manifests);
    assert_same_graph(&from_api, &want);
    // Not vacuous: local endpoints, active policies, named-port and selector sets.
    assert_eq!(from_api.local_endpoint_count(), 3);
    assert_eq!(from_api.active_policy_count(), 5);
    assert_eq!(from_api.active_cluster_policy_count(), 2);
    assert!(from_api.rejections().is_empty());
    let members = member_ips(&from_api.snapshot());
    assert!(members.is_superset(&ips(&[
        "10.244.1.10",
        "fd00:244:1::10",
        "10.244.2.20",
        "10.244.3.30"
    ])));

    // Later changes follow the compile of the changed manifests: a remote pod relabelled, a
    // policy deleted, a pod added, a namespace relabelled, a named port renamed.
    let changed = format!(
        "{NAMESPACES}---{PODS}---{POLICIES}---{}",
        "
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-2
  containers: [{name: web, image: nginx, ports: [{name: http, containerPort: 8000}]}]
status: {phase: Running, podIPs: [{ip: 10.244.2.12}, {ip: 'fd00:244:2::12'}]}
"
    )
    .replace(
        "{name: api-2, namespace: shop, labels: {app: api}}",
        "{name: api-2, namespace: shop, labels: {app: api, canary: 'true'}}",
    )
    .replace("labels: {team: ops}", "labels: {team: sre}")
    .replace(
        "{name: postgres, containerPort: 5432}",
        "{name: postgres, containerPort: 5433}",
    )
    .replace(
        "metadata: {name: web-ingress, namespace: shop}",
        "metadata: {name: web-ingress-v2, namespace: shop}",
    )
    .replace("priority: 10", "priority: 7")
    .replace(
        "metadata: {name: baseline-shop}",
        "metadata: {name: baseline-shop-v2}",
    );
    sync_server(&api, &manifests, &changed);
    converge(&source, &mut from_api, &compiled(&changed));
    assert!(source.shutdown().is_ok());
}

#[test]
fn relists_never_remove_anything_and_real_deletions_propagate() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let source = Source::start(&api);
    let mut t = Tracker::new();
    // (The initial listing may rearrange the dispatch chains as endpoints arrive.)
    for event in source.until_in_sync() {
        t.apply(&event);
    }
    for res in ALL {
        api.wait_watching(res, 0);
    }
    assert!(source.pending().is_empty());
    let initial = t.state.clone();
    assert_eq!(initial, t.graph.snapshot());

    // Watches that end, cleanly or by a reset connection, resume where they were: no list.
    let mark = api.requests().len();
    for res in ALL {
        api.close_watches(res, res != Res::Namespaces);
    }
    for res in ALL {
        api.wait_watching(res, mark);
    }
    assert!(
        api.requests()[mark..].iter().all(|r| r.watch),
        "resumed without a list"
    );
    assert!(source.pending().is_empty());

    // A bookmark moves the resume point.
    let bookmark = api.bookmark(Res::Pods);
    let mark = api.requests().len();
    api.close_watches(Res::Pods, false);
    api.wait_watching(Res::Pods, mark);
    let resumed = api.requests()[mark..]
        .iter()
        .find(|r| r.watch)
        .cloned()
        .unwrap();
    assert_eq!(resumed.query["resourceVersion"], bookmark.to_string());

    // 410 in every form: an ERROR event in the open watch (pods), HTTP 410 for the resumed
    // watch (namespaces), an ERROR event answering the resumed watch (policies). Each relists;
    // relists that find the same objects deliver nothing at all.
    let mark = api.requests().len();
    api.expire_watches(Res::Pods);
    api.set_gone(Res::Namespaces, Gone::Http);
    api.compact(Res::Namespaces);
    api.close_watches(Res::Namespaces, false);
    api.set_gone(Res::Policies, Gone::Event);
    api.compact(Res::Policies);
    api.close_watches(Res::Policies, true);
    api.expire_watches(Res::ClusterPolicies);
    for res in ALL {
        wait_relisted(&api, res, mark);
    }
    let events = source.pending();
    assert!(events.is_empty(), "unchanged relists delivered {events:?}");

    // Changes missed while disconnected, found by a relist that is itself interrupted half
    // way (its continue token expires): only the changes are delivered, and at no moment is
    // anything removed.
    api.hold_watches(Res::Pods, true);
    let mark = api.requests().len();
    api.close_watches(Res::Pods, false);
    api.wait_for("the held resume", |api| {
        api.requests()[mark..]
            .iter()
            .any(|r| r.res == Res::Pods && r.watch)
    });
    api.apply_yaml(
        "
apiVersion: v1
kind: Pod
metadata: {name: web-3, namespace: shop, labels: {app: web}}
spec: {nodeName: node-3, containers: [{name: web, ports: [{name: http, containerPort: 80}]}]}
status: {phase: Running, podIPs: [{ip: 10.244.3.12}, {ip: 'fd00:244:3::12'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-3, namespace: shop, labels: {app: api}}
spec: {nodeName: node-3, containers: [{name: api, ports: [{name: api, containerPort: 8080}]}]}
status: {phase: Running, podIPs: [{ip: 10.244.3.11}]}
",
    );
    let mut db = api.object(Res::Pods, "data/db");
    db["metadata"]["labels"]["backup"] = json!("daily");
    api.apply(db);
    api.compact(Res::Pods);
    api.set_gone(Res::Pods, Gone::Http);
    api.fail_continues(Res::Pods, 1);
    api.hold_watches(Res::Pods, false);
    wait_relisted(&api, Res::Pods, mark);
    let fresh_lists = api.requests()[mark..]
        .iter()
        .filter(|r| r.res == Res::Pods && !r.watch && !r.query.contains_key("continue"))
        .count();
    assert!(fresh_lists >= 2, "the interrupted relist started over");
    let events = source.pending();
    let want: BTreeSet<_> = ["shop/web-3", "shop/api-3", "data/db"]
        .into_iter()
        .map(|k| (ObjectKind::Pod, k.to_string(), "upsert"))
        .collect();
    assert_eq!(key_set(&events), want);
    assert_eq!(events.len(), 3);
    for event in &events {
        t.apply_without_loss(event);
    }
    assert!(member_ips(&t.state).is_superset(&ips(&[
        "10.244.3.12",
        "fd00:244:3::12",
        "10.244.3.11"
    ])));

    // A real deletion propagates: live (a DELETED event) ...
    api.delete(Res::Pods, "shop/web-3");
    let event = source.recv();
    assert!(
        matches!(&event, DatastoreEvent::Delete(ObjectRef { kind: ObjectKind::Pod, key }) if key == "shop/web-3"),
        "{event:?}"
    );
    let lost = t.apply(&event);
    assert!(
        !lost.is_empty()
            && lost
                .iter()
                .all(|l| l.contains("10.244.3.12") || l.contains("fd00:244:3::12")),
        "{lost:#?}"
    );

    // ... and missed during an outage, at the end of the relist (after any upsert).
    api.hold_watches(Res::Pods, true);
    let mark = api.requests().len();
    api.close_watches(Res::Pods, true);
    api.wait_for("the held resume", |api| {
        api.requests()[mark..]
            .iter()
            .any(|r| r.res == Res::Pods && r.watch)
    });
    api.delete(Res::Pods, "shop/api-3");
    let mut web = api.object(Res::Pods, "shop/web");
    web["metadata"]["labels"]["version"] = json!("2");
    api.apply(web);
    api.compact(Res::Pods);
    api.hold_watches(Res::Pods, false);
    wait_relisted(&api, Res::Pods, mark);
    let events = source.pending();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        matches!(&events[0], DatastoreEvent::Upsert(o) if matches!(o.as_ref(), K8sObject::Pod(p) if p.metadata.name.as_deref() == Some("web")))
    );
    assert!(matches!(&events[1], DatastoreEvent::Delete(r) if r.key == "shop/api-3"));
    t.apply_without_loss(&events[0]);
    let lost = t.apply(&events[1]);
    assert!(lost.iter().any(|l| l.contains("10.244.3.11")), "{lost:#?}");
    assert!(lost.iter().all(|l| l.contains("10.244.3.11")), "{lost:#?}");

    // The end state is the compile of what the server holds.
    assert_eq!(t.state, t.graph.snapshot());
    assert_same_graph(&t.graph, &compiled_objects(&server_objects(&api)));
}

#[test]
fn in_sync_comes_once_after_all_four_listings() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let rv_at_start = api.resource_version();
    api.hold_lists(Res::Policies, true);
    // API errors are retried (with backoff), never fatal.
    api.fail_lists(Res::Namespaces, 2);
    let source = Source::start(&api);

    let expected_first = upserts_of(&api, &[Res::Pods, Res::Namespaces, Res::ClusterPolicies]);
    let mut first = Vec::new();
    while first.len() < expected_first.len() {
        first.push(source.recv());
    }
    assert_eq!(key_set(&first), expected_first);
    api.wait_for("the policy list", |api| {
        api.requests()
            .iter()
            .any(|r| r.res == Res::Policies && !r.watch)
    });
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        source.pending().is_empty(),
        "no InSync before the policies are listed"
    );
    let namespace_lists = api
        .requests()
        .iter()
        .filter(|r| r.res == Res::Namespaces && !r.watch && !r.query.contains_key("continue"))
        .count();
    assert_eq!(namespace_lists, 3, "two failed lists, then one that worked");

    api.hold_lists(Res::Policies, false);
    let rest = source.until_in_sync();
    assert!(matches!(rest.last(), Some(DatastoreEvent::InSync)));
    assert_eq!(key_set(&rest), upserts_of(&api, &[Res::Policies]));
    assert_eq!(rest.len(), api.objects(Res::Policies).len() + 1);

    // Relists of everything: no second InSync.
    for res in ALL {
        api.wait_watching(res, 0);
    }
    let mark = api.requests().len();
    for res in ALL {
        api.expire_watches(res);
    }
    for res in ALL {
        wait_relisted(&api, res, mark);
    }
    assert!(source.pending().is_empty());

    // The parameters kube sends, as the fake understood them.
    let requests = api.requests();
    for r in &requests {
        let q = &r.query;
        assert!(
            !q.contains_key("labelSelector") && !q.contains_key("fieldSelector"),
            "{r:?}"
        );
        if r.watch {
            assert_eq!(q["watch"], "true", "{r:?}");
            assert_eq!(q["allowWatchBookmarks"], "true", "{r:?}");
            assert_eq!(q["timeoutSeconds"], "290", "{r:?}");
            assert!(!q["resourceVersion"].is_empty(), "{r:?}");
        } else {
            assert_eq!(q["limit"], PAGE.to_string(), "{r:?}");
            // A consistent (most recent) read, not resourceVersion=0 from a cache.
            assert!(
                q.get("resourceVersion").is_none_or(|v| v.is_empty()),
                "{r:?}"
            );
        }
    }
    for res in ALL {
        let first_watch = requests.iter().find(|r| r.res == res && r.watch).unwrap();
        assert_eq!(
            first_watch.query["resourceVersion"],
            rv_at_start.to_string()
        );
    }

    // Stopping ends the thread with Ok.
    let started = Instant::now();
    assert!(source.shutdown().is_ok());
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn finished_ipless_and_host_network_pods_get_no_endpoints_and_dual_stack_ips_are_used() {
    let manifests = "
apiVersion: v1
kind: Namespace
metadata: {name: jobs}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: peers, namespace: jobs}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {}}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: running, namespace: jobs}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Running, podIP: 10.1.0.1, podIPs: [{ip: 10.1.0.1}, {ip: 'fd00:1::1'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: remote, namespace: jobs}
spec: {nodeName: node-2, containers: [{name: c}]}
status: {phase: Running, podIPs: [{ip: 'fd00:2::7'}, {ip: 10.2.0.7}]}
---
apiVersion: v1
kind: Pod
metadata: {name: succeeded, namespace: jobs}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Succeeded, podIPs: [{ip: 10.1.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: failed, namespace: jobs}
spec: {nodeName: node-2, containers: [{name: c}]}
status: {phase: Failed, podIPs: [{ip: 10.2.0.3}]}
---
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: jobs}
spec: {nodeName: node-1, containers: [{name: c}]}
status: {phase: Pending}
---
apiVersion: v1
kind: Pod
metadata: {name: hostnet, namespace: jobs}
spec: {nodeName: node-1, hostNetwork: true, containers: [{name: c}]}
status: {phase: Running, podIP: 192.168.10.11, podIPs: [{ip: 192.168.10.11}]}
";
    let api = FakeApi::start();
    api.apply_yaml(manifests);
    let source = Source::start(&api);
    let mut g = graph();
    for event in source.until_in_sync() {
        g.apply(&event);
    }
    g.flush();
    assert_same_graph(&g, &compiled(manifests));
    assert_eq!(g.local_endpoint_count(), 1, "only the running local pod");
    assert_eq!(
        member_ips(&g.snapshot()),
        ips(&["10.1.0.1", "fd00:1::1", "10.2.0.7", "fd00:2::7"])
    );

    // The running pod finishes; the pending one gets its (dual-stack) addresses.
    let mut running = api.object(Res::Pods, "jobs/running");
    running["status"]["phase"] = json!("Succeeded");
    api.apply(running);
    let mut pending = api.object(Res::Pods, "jobs/pending");
    pending["status"] = json!({"phase": "Running", "podIP": "10.1.0.9",
                               "podIPs": [{"ip": "10.1.0.9"}, {"ip": "fd00:1::9"}]});
    api.apply(pending);
    let want = compiled_objects(&server_objects(&api));
    converge(&source, &mut g, &want);
    assert_eq!(g.local_endpoint_count(), 1);
    assert_eq!(
        member_ips(&g.snapshot()),
        ips(&["10.1.0.9", "fd00:1::9", "10.2.0.7", "fd00:2::7"])
    );
}

/// Keys of a JSON object (empty for anything else).
fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn subset(v: &Value, allowed: &[&str], what: &str) {
    let extra: Vec<_> = keys(v)
        .into_iter()
        .filter(|k| !allowed.contains(k))
        .collect();
    assert!(extra.is_empty(), "{what} kept {extra:?}");
}

#[test]
fn delivered_objects_are_trimmed_and_validate_as_the_originals() {
    let api = FakeApi::start();
    api.apply_yaml(
        "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}, annotations: {owner: someone}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: checkout, namespace: shop, labels: {a: b}, annotations: {note: hello}}
spec:
  podSelector: {matchLabels: {app.kubernetes.io/name: checkout}}
  ingress: [{ports: [{port: http}, {port: 9090}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard, labels: {a: b}, annotations: {note: hello}}
spec:
  tier: Baseline
  priority: 1000
  subject: {namespaces: {matchLabels: {team: shop}}}
  egress: [{name: no-metadata, action: Deny, to: [{networks: [169.254.169.254/32]}]}]
status:
  conditions: [{type: Ready, status: 'True', reason: Programmed, message: ok, lastTransitionTime: '2025-05-14T09:12:47Z'}]
",
    );
    let typical: Value = serde_json::from_str(include_str!("kube_api/typical_pod.json")).unwrap();
    api.apply(typical);
    let mut broken = api.object(Res::Pods, "shop/checkout-7d9f6c5b8d-x2k4q");
    broken["metadata"]["name"] = json!("broken");
    broken["spec"]["containers"][1]["ports"][0]["name"] = json!("Not_A_Port_Name");
    api.apply(broken);

    let source = Source::start(&api);
    let events = source.until_in_sync();
    assert_eq!(events.len(), 6);
    for event in &events {
        let DatastoreEvent::Upsert(object) = event else {
            continue;
        };
        match object.as_ref() {
            K8sObject::Pod(pod) => {
                let key = format!("shop/{}", pod.metadata.name.as_deref().unwrap());
                let original: Pod = serde_json::from_value(api.object(Res::Pods, &key)).unwrap();
                assert!(original.metadata.managed_fields.is_some());
                assert_eq!(validate::pod(pod), validate::pod(&original), "{key}");
                let v = serde_json::to_value(pod).unwrap();
                subset(
                    &v,
                    &["apiVersion", "kind", "metadata", "spec", "status"],
                    "pod",
                );
                subset(
                    &v["metadata"],
                    &["name", "namespace", "uid", "labels", "annotations"],
                    "metadata",
                );
                assert_eq!(
                    keys(&v["metadata"]["annotations"]),
                    BTreeSet::from(["netpol-agent.io/sandbox-id"])
                );
                subset(
                    &v["spec"],
                    &["nodeName", "hostNetwork", "containers", "initContainers"],
                    "spec",
                );
                for c in v["spec"]["containers"].as_array().unwrap() {
                    subset(c, &["name", "ports"], "container");
                    for p in c["ports"].as_array().unwrap() {
                        subset(p, &["containerPort", "name", "protocol"], "port");
                    }
                }
                subset(&v["status"], &["phase", "podIP", "podIPs"], "status");
                assert_eq!(v["status"]["podIPs"].as_array().unwrap().len(), 2);
            }
            K8sObject::Namespace(ns) => {
                let original: Namespace =
                    serde_json::from_value(api.object(Res::Namespaces, "shop")).unwrap();
                assert_eq!(validate::namespace(ns), validate::namespace(&original));
                let v = serde_json::to_value(ns).unwrap();
                subset(&v, &["apiVersion", "kind", "metadata"], "namespace");
                subset(&v["metadata"], &["name", "labels"], "namespace metadata");
            }
            K8sObject::NetworkPolicy(np) => {
                let original: NetworkPolicy =
                    serde_json::from_value(api.object(Res::Policies, "shop/checkout")).unwrap();
                assert_eq!(
                    validate::network_policy(np),
                    validate::network_policy(&original)
                );
                assert_eq!(np.spec, original.spec);
                let v = serde_json::to_value(np).unwrap();
                subset(&v["metadata"], &["name", "namespace"], "policy metadata");
            }
            K8sObject::ClusterNetworkPolicy(cnp) => {
                let stored = api.object(Res::ClusterPolicies, "guard");
                assert!(stored["metadata"]["managedFields"].is_array());
                let original: ClusterNetworkPolicy = serde_json::from_value(stored).unwrap();
                let valid = validate::cluster_network_policy(cnp);
                assert!(valid.is_ok(), "{valid:?}");
                assert_eq!(valid, validate::cluster_network_policy(&original));
                assert_eq!(cnp.spec, original.spec);
                let v = serde_json::to_value(cnp).unwrap();
                subset(
                    &v,
                    &["apiVersion", "kind", "metadata", "spec"],
                    "cluster policy",
                );
                subset(&v["metadata"], &["name"], "cluster policy metadata");
            }
            // The fake API server does not serve the staged kinds (404: an empty listing).
            K8sObject::StagedNetworkPolicy(_) | K8sObject::StagedClusterNetworkPolicy(_) => {
                panic!("a staged object from a server that has none: {object:?}")
            }
        }
    }
    let mut g = graph();
    for event in &events {
        g.apply(event);
    }
    assert!(g.rejections().keys().any(|(_, key)| key == "shop/broken"));

    // Changes to what was trimmed away deliver nothing; the next real change is the next event.
    let key = "shop/checkout-7d9f6c5b8d-x2k4q";
    let mut pod = api.object(Res::Pods, key);
    pod["status"]["containerStatuses"][0]["restartCount"] = json!(1);
    pod["status"]["conditions"][2]["status"] = json!("False");
    pod["metadata"]["annotations"]["prometheus.io/port"] = json!("9191");
    api.apply(pod);
    let mut ns = api.object(Res::Namespaces, "shop");
    ns["metadata"]["annotations"]["owner"] = json!("someone else");
    api.apply(ns);
    let mut pod = api.object(Res::Pods, key);
    pod["metadata"]["labels"]["tier"] = json!("frontend");
    api.apply(pod);
    let mut ns = api.object(Res::Namespaces, "shop");
    ns["metadata"]["labels"]["team"] = json!("checkout");
    api.apply(ns);
    let mut next = [source.recv(), source.recv()];
    next.sort_by_key(
        |e| matches!(e, DatastoreEvent::Upsert(o) if matches!(o.as_ref(), K8sObject::Namespace(_))),
    );
    assert!(
        matches!(&next[0], DatastoreEvent::Upsert(o) if matches!(o.as_ref(), K8sObject::Pod(p)
            if p.metadata.labels.as_ref().unwrap()["tier"] == "frontend")),
        "{:?}",
        next[0]
    );
    assert!(
        matches!(&next[1], DatastoreEvent::Upsert(o) if matches!(o.as_ref(), K8sObject::Namespace(n)
            if n.metadata.labels.as_ref().unwrap()["team"] == "checkout")),
        "{:?}",
        next[1]
    );
}

// ---- streaming lists ----

fn auto() -> KubeOptions {
    KubeOptions {
        initial_list: InitialList::Auto,
        ..options()
    }
}

fn is_streaming_list(r: &kube_api::Req) -> bool {
    r.watch
        && r.query
            .get("sendInitialEvents")
            .is_some_and(|v| v == "true")
}

/// Complete listings of `res` since request `since`: fresh paginated lists and streaming
/// lists.
fn listings(api: &FakeApi, res: Res, since: usize) -> (usize, usize) {
    let requests = api.requests();
    let after = &requests[since..];
    let pages = after
        .iter()
        .filter(|r| r.res == res && !r.watch && !r.query.contains_key("continue"))
        .count();
    let streams = after
        .iter()
        .filter(|r| r.res == res && is_streaming_list(r))
        .count();
    (pages, streams)
}

#[test]
fn streaming_lists_feed_the_same_graph_and_relist_without_losses() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let source = Source::start_with(&api, auto());
    let mut t = Tracker::new();
    let first = source.until_in_sync();
    assert_eq!(
        first
            .iter()
            .filter(|e| matches!(e, DatastoreEvent::InSync))
            .count(),
        1
    );
    for event in &first {
        t.apply(event);
    }
    assert_same_graph(&t.graph, &compiled(&cluster()));
    for res in ALL {
        assert_eq!(
            listings(&api, res, 0),
            (0, 1),
            "{res:?}: one streaming list, no pages"
        );
        api.wait_watching(res, 0);
    }
    // The request as KEP-3157 wants it: bookmarks, NotOlderThan.
    for r in api.requests().iter().filter(|r| is_streaming_list(r)) {
        assert_eq!(r.query["resourceVersionMatch"], "NotOlderThan", "{r:?}");
        assert_eq!(r.query["allowWatchBookmarks"], "true", "{r:?}");
    }

    // The stream goes on with live events after the end bookmark.
    let mut db = api.object(Res::Pods, "data/db");
    db["metadata"]["labels"]["backup"] = json!("daily");
    api.apply(db);
    let event = source.recv();
    assert!(
        matches!(&event, DatastoreEvent::Upsert(o) if o.object_ref().key == "data/db"),
        "{event:?}"
    );
    t.apply_without_loss(&event);

    // 410 for every kind: each lists again by streaming, and an unchanged cluster delivers
    // nothing.
    let mark = api.requests().len();
    for res in ALL {
        api.expire_watches(res);
    }
    for res in ALL {
        api.wait_for(&format!("a new streaming list of {res:?}"), |api| {
            listings(api, res, mark).1 >= 1 && api.open_watches(res) > 0
        });
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        source.pending().is_empty(),
        "an unchanged relist delivers nothing"
    );

    // Changes missed while the watch was down: only they are delivered, deletions last, and
    // nothing is lost on the way.
    api.hold_watches(Res::Pods, true);
    let mark = api.requests().len();
    api.close_watches(Res::Pods, true);
    api.wait_for("the held resume", |api| {
        api.requests()[mark..]
            .iter()
            .any(|r| r.res == Res::Pods && r.watch)
    });
    api.delete(Res::Pods, "shop/api-2");
    let mut web = api.object(Res::Pods, "shop/web");
    web["metadata"]["labels"]["version"] = json!("2");
    api.apply(web);
    api.compact(Res::Pods);
    api.set_gone(Res::Pods, Gone::Event);
    api.hold_watches(Res::Pods, false);
    api.wait_for("a streaming relist of pods", |api| {
        listings(api, Res::Pods, mark).1 >= 1 && api.open_watches(Res::Pods) > 0
    });
    let mut events = Vec::new();
    while events.len() < 2 {
        events.push(source.recv());
    }
    assert!(
        matches!(&events[0], DatastoreEvent::Upsert(o) if o.object_ref().key == "shop/web"),
        "{events:?}"
    );
    assert!(
        matches!(&events[1], DatastoreEvent::Delete(r) if r.key == "shop/api-2"),
        "{events:?}"
    );
    t.apply_without_loss(&events[0]);
    let lost = t.apply(&events[1]);
    assert!(
        lost.iter()
            .all(|l| l.contains("10.244.2.11") || l.contains("fd00:244:2::11")),
        "{lost:#?}"
    );
    assert_eq!(listings(&api, Res::Pods, 0).0, 0, "never a paginated list");
    assert_same_graph(&t.graph, &compiled_objects(&server_objects(&api)));
}

#[test]
fn refused_streaming_lists_fall_back_to_pages_for_good() {
    let api = FakeApi::start();
    api.set_streaming(Streaming::Refused);
    api.apply_yaml(&cluster());
    let source = Source::start_with(&api, auto());
    let mut g = graph();
    let events = source.until_in_sync();
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, DatastoreEvent::InSync))
            .count(),
        1
    );
    for event in &events {
        g.apply(event);
    }
    g.flush();
    assert_same_graph(&g, &compiled(&cluster()));
    for res in ALL {
        let (pages, streams) = listings(&api, res, 0);
        assert_eq!(
            (pages, streams),
            (1, 1),
            "{res:?}: one refused stream, then pages"
        );
        api.wait_watching(res, 0);
    }
    // A relist after the fallback lists in pages straight away.
    let mark = api.requests().len();
    for res in ALL {
        api.expire_watches(res);
    }
    for res in ALL {
        wait_relisted(&api, res, mark);
        assert_eq!(
            listings(&api, res, mark).1,
            0,
            "{res:?} did not try streaming again"
        );
    }
    assert!(source.pending().is_empty());
}

#[test]
fn ignored_streaming_lists_fall_back_to_pages() {
    // A server from before 1.27 that does not say so in /version: the "streaming list" is a
    // plain watch that never ends its listing. With a 1 s watch timeout the watcher starts
    // it again after a second; that second start is the sign.
    let api = FakeApi::start();
    api.set_streaming(Streaming::Ignored);
    api.apply_yaml(&cluster());
    let source = Source::start_with(
        &api,
        KubeOptions {
            watch_timeout: Some(1),
            ..auto()
        },
    );
    let started = Instant::now();
    let mut g = graph();
    let events = loop {
        match source.rx.recv_timeout(Duration::from_secs(20)) {
            Ok(DatastoreEvent::InSync) => break g,
            Ok(event) => g.apply(&event),
            Err(e) => panic!("no InSync: {e}"),
        }
    };
    let mut g = events;
    g.flush();
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_same_graph(&g, &compiled(&cluster()));
    for res in ALL {
        let (pages, streams) = listings(&api, res, 0);
        assert!(
            pages >= 1 && streams >= 1,
            "{res:?}: {pages} pages, {streams} streams"
        );
    }
}

#[test]
fn servers_older_than_1_27_get_pages_from_the_start() {
    let api = FakeApi::start();
    api.set_version("v1.26.15-eks-1234");
    api.apply_yaml(&cluster());
    let source = Source::start_with(&api, auto());
    let events = source.until_in_sync();
    let mut g = graph();
    for event in &events {
        g.apply(event);
    }
    g.flush();
    assert_same_graph(&g, &compiled(&cluster()));
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.query.contains_key("sendInitialEvents")),
        "no streaming list was tried"
    );
}

const GUARD: &str = "
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {team: shop}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {team: ops}}}]}]
";

fn cluster_policy_events(events: &[DatastoreEvent]) -> Vec<String> {
    key_set(events)
        .into_iter()
        .filter(|(kind, _, _)| *kind == ObjectKind::ClusterNetworkPolicy)
        .map(|(_, key, what)| format!("{what} {key}"))
        .collect()
}

/// Lists of the ClusterNetworkPolicy resource (not continuations) since request `since`.
fn cluster_policy_lists(api: &FakeApi, since: usize) -> usize {
    api.requests()[since..]
        .iter()
        .filter(|r| r.res == Res::ClusterPolicies && !r.watch && !r.query.contains_key("continue"))
        .count()
}

#[test]
fn a_missing_cluster_policy_crd_is_an_empty_listing_rechecked_slowly_and_followed_once_installed() {
    for not_found in [Served::NotFoundText, Served::NotFoundStatus] {
        let api = FakeApi::start();
        api.apply_yaml(&format!("{NAMESPACES}---{PODS}"));
        api.set_served(Res::ClusterPolicies, not_found);
        let source = Source::start(&api);

        // InSync is not held up: the 404 counts as an empty listing.
        let mut g = graph();
        for event in source.until_in_sync() {
            g.apply(&event);
        }
        g.flush();
        assert_eq!(g.local_endpoint_count(), 3);

        // It is looked for again, slowly: not a crash loop, not a hot retry loop.
        let mark = api.requests().len();
        let watched = Instant::now();
        std::thread::sleep(RECHECK * 6);
        let lists = cluster_policy_lists(&api, mark);
        let most = (watched.elapsed().as_millis() / RECHECK.as_millis()) as usize + 1;
        assert!(
            (2..=most).contains(&lists),
            "{lists} lists in {:?} with a {RECHECK:?} recheck",
            watched.elapsed()
        );
        assert!(source.pending().is_empty(), "nothing to deliver meanwhile");
        for res in [Res::Pods, Res::Namespaces, Res::Policies] {
            assert!(
                api.open_watches(res) > 0,
                "the other kinds are followed: {res:?}"
            );
        }

        // Installed: picked up by the next check, listed and watched.
        api.set_served(Res::ClusterPolicies, Served::Yes);
        api.apply_yaml(GUARD);
        let event = source.recv();
        assert_eq!(
            cluster_policy_events(std::slice::from_ref(&event)),
            ["upsert guard"]
        );
        g.apply(&event);
        g.flush();
        assert_eq!(g.active_cluster_policy_count(), 1);
        api.wait_watching(Res::ClusterPolicies, mark);
        let mut edited = api.object(Res::ClusterPolicies, "guard");
        edited["spec"]["priority"] = json!(2);
        api.apply(edited);
        let event = source.recv();
        assert_eq!(
            cluster_policy_events(std::slice::from_ref(&event)),
            ["upsert guard"]
        );
        g.apply(&event);

        // Uninstalled (the API server deletes the CRD's objects with it): an empty listing
        // again, so what was delivered is deleted; no second InSync.
        api.set_served(Res::ClusterPolicies, not_found);
        let event = source.recv();
        assert_eq!(
            cluster_policy_events(std::slice::from_ref(&event)),
            ["delete guard"]
        );
        g.apply(&event);
        g.flush();
        assert_eq!(g.active_cluster_policy_count(), 0);
        std::thread::sleep(RECHECK * 3);
        let rest = source.pending();
        assert!(rest.is_empty(), "{rest:?}");

        // What the graph holds is what compile of the server's objects gives.
        assert_same_graph(&g, &compiled_objects(&server_objects(&api)));
        assert!(source.shutdown().is_ok());
    }
}

const STAGED_OBJECTS: &str = "
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: default-deny, namespace: shop}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedClusterNetworkPolicy
metadata: {name: guard}
spec:
  stagedAction: Delete
";

fn staged_events(events: &[DatastoreEvent]) -> Vec<String> {
    key_set(events)
        .into_iter()
        .filter(|(kind, _, _)| {
            matches!(
                kind,
                ObjectKind::StagedNetworkPolicy | ObjectKind::StagedClusterNetworkPolicy
            )
        })
        .map(|(kind, key, what)| format!("{what} {kind:?} {key}"))
        .collect()
}

/// Issue 23: with the staged CRDs installed, staged objects come through the same list/watch
/// as the enforced kinds: listed before InSync, then followed (an edit, a deletion, the CRD
/// uninstalled). The missing-CRD path is the ClusterNetworkPolicy test's above (same
/// follower).
#[test]
fn served_staged_kinds_are_listed_before_in_sync_and_watched() {
    let api = FakeApi::start();
    api.apply_yaml(&format!("{NAMESPACES}---{PODS}"));
    for res in STAGED {
        api.set_served(res, Served::Yes);
    }
    api.apply_yaml(STAGED_OBJECTS);
    let source = Source::start(&api);
    let synced = source.until_in_sync();
    assert_eq!(
        staged_events(&synced),
        [
            "upsert StagedNetworkPolicy shop/default-deny",
            "upsert StagedClusterNetworkPolicy guard",
        ]
    );
    for res in STAGED {
        api.wait_watching(res, 0);
    }

    // An edit through the watch.
    let mut edited = api.object(Res::StagedPolicies, "shop/default-deny");
    edited["spec"]["policyTypes"] = json!(["Ingress", "Egress"]);
    api.apply(edited);
    let event = source.recv();
    assert_eq!(
        staged_events(std::slice::from_ref(&event)),
        ["upsert StagedNetworkPolicy shop/default-deny"]
    );
    match &event {
        DatastoreEvent::Upsert(o) => assert!(
            format!("{o:?}").contains("Egress"),
            "the edited spec is delivered: {o:?}"
        ),
        other => panic!("{other:?}"),
    }

    // A deletion through the watch.
    api.delete(Res::StagedPolicies, "shop/default-deny");
    let event = source.recv();
    assert_eq!(
        staged_events(std::slice::from_ref(&event)),
        ["delete StagedNetworkPolicy shop/default-deny"]
    );

    // The cluster CRD uninstalled: its objects go with it, as a deletion.
    api.set_served(Res::StagedClusterPolicies, Served::NotFoundStatus);
    let event = source.recv();
    assert_eq!(
        staged_events(std::slice::from_ref(&event)),
        ["delete StagedClusterNetworkPolicy guard"]
    );
    std::thread::sleep(RECHECK * 2);
    let rest = source.pending();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(source.shutdown().is_ok());
}

/// An outage escalates the back-off; once the watches have been up again for longer than the
/// last wait, the next error starts from the first wait again. Before, only two minutes
/// without any error reset it: a second short outage within two minutes of the first kept
/// the agent blind for the escalated wait (up to the 30 s ceiling, 60 s with jitter) after
/// the server was back, though it had been in sync in between (`kube_faults_netns`: 23 s and
/// 43 s to follow a change after the second and third 2–4 s storms).
#[test]
fn the_back_off_starts_afresh_after_the_watches_were_healthy_again() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let source = Source::start_with(
        &api,
        KubeOptions {
            backoff: Policy {
                first: Duration::from_millis(100),
                factor: 2.0,
                ceiling: Some(Duration::from_secs(10)),
                tries: None,
                jitter: false,
            },
            ..options()
        },
    );
    source.until_in_sync();

    // Two seconds of 500s with every watch cut: waits 0.1, 0.2, 0.4, 0.8 and 1.6 s, so the
    // next one would be 3.2 s.
    let since = api.requests().len();
    api.fail_requests(500, Duration::from_secs(2));
    for res in ALL {
        api.close_watches(res, true);
    }
    std::thread::sleep(Duration::from_secs(2));
    for res in ALL {
        api.wait_watching(res, since);
    }
    let failed = api.requests()[since..]
        .iter()
        .filter(|r| r.res == Res::Namespaces)
        .count();
    assert!(
        failed >= 4,
        "the outage escalated the back-off ({failed} requests)"
    );

    // Healthy for longer than the last wait, then one blip: the namespace watch cut, and its
    // resumption refused once (a cut alone resumes at once, without an error). Back within
    // the first wait, not the escalated one.
    std::thread::sleep(Duration::from_secs(4));
    let since = api.requests().len();
    let cut = Instant::now();
    api.fail_requests(500, Duration::from_millis(50));
    api.close_watches(Res::Namespaces, true);
    api.wait_watching(Res::Namespaces, since);
    let back = cut.elapsed();
    let tries = api.requests()[since..]
        .iter()
        .filter(|r| r.res == Res::Namespaces)
        .count();
    assert!(tries >= 2, "the blip was an error ({tries} requests)");
    assert!(
        back < Duration::from_millis(1000),
        "the namespace watch came back {back:?} after one error (first wait 100 ms)"
    );
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring, labels: {team: none}}\n",
    );
    assert!(matches!(source.recv(), DatastoreEvent::Upsert(_)));
    assert!(source.shutdown().is_ok());
}

/// After an outage the first resumption meets 410 (the server's watch cache no longer has the
/// resourceVersion, as after an API server restart): the server is back and says to relist,
/// so the relist comes after the first wait, not after the outage's escalated one. Before, it
/// waited the next escalated wait (`kube_faults_netns`: relisting in 6 to 10 s after a 3 s
/// storm of 500s).
#[test]
fn the_first_410_after_an_outage_relists_after_the_first_wait() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let source = Source::start_with(
        &api,
        KubeOptions {
            backoff: Policy {
                first: Duration::from_millis(100),
                factor: 2.0,
                ceiling: Some(Duration::from_secs(10)),
                tries: None,
                jitter: false,
            },
            ..options()
        },
    );
    source.until_in_sync();

    // Two seconds of 500s (waits 0.1, 0.2, 0.4, 0.8, 1.6 s), history compacted meanwhile.
    let since = api.requests().len();
    api.fail_requests(500, Duration::from_secs(2));
    for res in ALL {
        api.compact(res);
        api.close_watches(res, true);
    }
    let outage_end = Instant::now() + Duration::from_secs(2);
    std::thread::sleep(Duration::from_secs(2));
    wait_relisted(&api, Res::Namespaces, since);
    let requests = api.requests();
    let namespaces: Vec<&kube_api::Req> = requests[since..]
        .iter()
        .filter(|r| r.res == Res::Namespaces && r.at >= outage_end)
        .collect();
    let resumed = namespaces
        .iter()
        .find(|r| r.watch)
        .expect("a resumed watch after the outage");
    assert!(
        resumed
            .query
            .get("resourceVersion")
            .is_some_and(|rv| rv != "0"),
        "it resumed from the old resourceVersion (answered 410): {:?}",
        resumed.query
    );
    let relist = namespaces
        .iter()
        .find(|r| !r.watch && r.at > resumed.at)
        .expect("a relist");
    let waited = relist.at - resumed.at;
    assert!(
        waited < Duration::from_millis(1000),
        "relisted {waited:?} after the 410 (first wait 100 ms)"
    );
    assert!(source.shutdown().is_ok());
}

/// A watch the server ends at once, cleanly and without an event (a proxy in front of the API
/// server with a broken backend), is not started again in a tight loop: kube-runtime's
/// watcher restarts it at once without telling its caller (before: 5301 watch requests in
/// 2 s); the watch requests are spaced by the back-off policy (here 100 ms doubling to
/// 400 ms: at most about a dozen in 2 s).
#[test]
fn watches_that_end_at_once_are_not_restarted_in_a_tight_loop() {
    let api = FakeApi::start();
    api.apply_yaml(&cluster());
    let source = Source::start_with(
        &api,
        KubeOptions {
            backoff: Policy {
                first: Duration::from_millis(100),
                factor: 2.0,
                ceiling: Some(Duration::from_millis(400)),
                tries: None,
                jitter: false,
            },
            ..options()
        },
    );
    source.until_in_sync();
    let since = api.requests().len();
    api.end_watches_at_once(Res::Namespaces, true);
    api.close_watches(Res::Namespaces, false);
    std::thread::sleep(Duration::from_secs(2));
    api.end_watches_at_once(Res::Namespaces, false);
    let watches = api.requests()[since..]
        .iter()
        .filter(|r| r.res == Res::Namespaces && r.watch)
        .count();
    // 0.1 + 0.2 + 0.4 s, then one every 0.4 s: 7 in 2 s, and the one that found it fixed.
    assert!(watches <= 12, "{watches} watch requests in 2 s");
    // Watches work again, without delay.
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring, labels: {team: none}}\n",
    );
    assert!(matches!(source.recv(), DatastoreEvent::Upsert(_)));
    assert!(source.shutdown().is_ok());
}

/// A 403 (RBAC taken away, issue 36) is told once per kind as `Access` refused, nothing
/// delivered is withdrawn, and the kind's next event (RBAC given back) tells it readable
/// again. The agent turns these into readiness and `netpol_datastore_access_refused`.
#[test]
fn a_forbidden_kind_is_told_once_and_again_when_readable() {
    let api = FakeApi::start();
    api.load(Res::Namespaces, [json!({"metadata": {"name": "x"}})]);
    let source = Source::start(&api);
    source.until_in_sync();
    let since = api.requests().len();
    api.fail_requests(403, Duration::from_secs(1));
    for res in ALL {
        api.close_watches(res, true);
    }
    std::thread::sleep(Duration::from_millis(1200));
    for res in ALL {
        api.wait_watching(res, since);
    }
    // A change, so that the namespaces watch delivers an event after the refusal.
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: y}\n");
    let mut refused: BTreeMap<ObjectKind, usize> = BTreeMap::new();
    let mut readable: BTreeSet<ObjectKind> = BTreeSet::new();
    let deadline = Instant::now() + TIMEOUT;
    while !readable.contains(&ObjectKind::Namespace) && Instant::now() < deadline {
        match source.recv() {
            DatastoreEvent::Access {
                kind,
                refused: Some(why),
            } => {
                assert!(why.starts_with("403 Forbidden"), "{why}");
                *refused.entry(kind).or_default() += 1;
            }
            DatastoreEvent::Access {
                kind,
                refused: None,
            } => {
                assert!(
                    refused.contains_key(&kind),
                    "readable before refused: {kind:?}"
                );
                readable.insert(kind);
            }
            DatastoreEvent::Delete(r) => panic!("a refusal withdrew {r:?}"),
            _ => {}
        }
    }
    assert!(
        readable.contains(&ObjectKind::Namespace),
        "{refused:?} {readable:?}"
    );
    assert!(
        refused.values().all(|n| *n == 1),
        "one refusal per kind, however many retries: {refused:?}"
    );
    assert!(
        refused.contains_key(&ObjectKind::Pod) && refused.contains_key(&ObjectKind::NetworkPolicy)
    );
    assert!(source.shutdown().is_ok());
}
