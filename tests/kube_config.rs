//! How the Kubernetes datastore finds its API server. One test in its own binary: it sets
//! `KUBECONFIG`, `HOME` and the in-cluster variables, which no other test may see.

mod kube_api;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use kube_api::FakeApi;
use netpol_agent::datastore::kube::{spawn, KubeConnect};
use netpol_agent::model::DatastoreEvent;

fn start_error(connect: KubeConnect) -> String {
    let (tx, _rx) = channel::<DatastoreEvent>();
    let stop = Arc::new(AtomicBool::new(false));
    match spawn(connect, tx, stop) {
        Ok(_) => panic!("the datastore started without a usable configuration"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn configuration_problems_fail_at_start_and_a_kubeconfig_is_used() {
    let err = start_error(KubeConnect::Url("not a url at all".into()));
    assert!(err.contains("invalid Kubernetes API URL"), "{err}");
    let err = start_error(KubeConnect::Url("ftp://127.0.0.1/".into()));
    assert!(err.contains("http:// or https://"), "{err}");

    let dir = std::env::temp_dir().join(format!("npa-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // This binary runs this one test only, so nothing else reads the environment meanwhile.
    std::env::remove_var("KUBERNETES_SERVICE_HOST");
    std::env::remove_var("KUBERNETES_SERVICE_PORT");
    std::env::set_var("HOME", &dir);
    std::env::set_var("KUBECONFIG", dir.join("missing"));
    let err = start_error(KubeConnect::Infer);
    assert!(err.contains("no Kubernetes API configuration"), "{err}");

    // A kubeconfig naming the (fake) API server: the datastore lists it and gets in sync.
    let api = FakeApi::start();
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: only}\n");
    let path = dir.join("config");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: '{}'}}}}]
users: [{{name: nobody, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: nobody}}}}]
current-context: fake
",
            api.url
        ),
    )
    .unwrap();
    std::env::set_var("KUBECONFIG", &path);
    let (tx, rx) = channel();
    let stop = Arc::new(AtomicBool::new(false));
    let handle = spawn(KubeConnect::Infer, tx, stop.clone()).expect("kubeconfig accepted");
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(first, DatastoreEvent::Upsert(_)), "{first:?}");
    let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(second, DatastoreEvent::InSync), "{second:?}");

    // Dropping the receiver also stops the datastore (at its next event).
    drop(rx);
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: second}\n");
    let stopped = handle.join().expect("no panic");
    assert!(stopped.is_ok());
    stop.store(true, Ordering::SeqCst);
    std::fs::remove_dir_all(&dir).unwrap();
}
