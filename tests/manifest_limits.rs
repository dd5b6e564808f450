//! Manifests as a new user writes them, and as an attacker would: a byte-order mark, a file
//! that is not UTF-8 beside a good one, nesting 100k deep, megabytes of broken documents,
//! megabyte-long values. Each is read in bounded time, reported once with what is wrong (in a
//! message of bounded length), and never hides the good objects beside it.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TempDir;
use netpol_agent::datastore::dir::DirSource;
use netpol_agent::datastore::manifests::{load_paths, parse_manifests};
use netpol_agent::model::{validate, K8sObject};
use serde_json::json;

/// Generous: these inputs took more than 20 s (release) before parsing was bounded and broken
/// chunks parsed once. The bound only catches a hang, it measures nothing: the test build is
/// slower than a release one, on a machine shared with other builds.
const HANG: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(60)
} else {
    Duration::from_secs(10)
};

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: prod}\n";

fn names(objects: &[K8sObject]) -> Vec<String> {
    objects.iter().map(|o| o.object_ref().key).collect()
}

#[test]
fn a_byte_order_mark_is_read_past() {
    let text = format!("\u{feff}{NAMESPACE}");
    let (objects, errors) = parse_manifests(&text, "bom.yaml");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&objects), ["prod"]);

    let dir = TempDir::new("bom");
    let json = "\u{feff}{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"dev\"}}";
    std::fs::write(dir.path.join("a.yaml"), &text).unwrap();
    std::fs::write(dir.path.join("b.json"), json).unwrap();
    let (objects, errors) = load_paths(std::slice::from_ref(&dir.path)).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&objects), ["prod", "dev"]);
}

#[test]
fn a_file_that_is_not_utf8_is_reported_and_the_good_file_still_loads() {
    let dir = TempDir::new("not-utf8");
    let mut garbage = b"apiVersion: v1\nkind: Namespace\nmetadata: {name: \xff\xfe}\n".to_vec();
    garbage.extend((0u8..=255).cycle().take(4096));
    std::fs::write(dir.path.join("a-garbage.yaml"), &garbage).unwrap();
    std::fs::write(dir.path.join("b-good.yaml"), NAMESPACE).unwrap();
    let (objects, errors) =
        load_paths(std::slice::from_ref(&dir.path)).expect("a broken file is no fatal error");
    assert_eq!(names(&objects), ["prod"]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let message = errors[0].to_string();
    assert!(message.contains("a-garbage.yaml"), "{message}");
    assert!(message.contains("UTF-8"), "{message}");
    assert!(message.contains("line 3"), "names where: {message}");
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(took < HANG, "{what} took {took:?}");
    eprintln!("{what}: {took:?}");
    out
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let depth = 100_000;
    let flow = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let json = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let block = format!("{}x\n", "- ".repeat(depth));
    for (what, text) in [("flow", flow), ("json", json), ("block", block)] {
        let with_good = format!("{text}\n---\n{NAMESPACE}");
        let (objects, errors) = timed(what, || parse_manifests(&with_good, "deep.yaml"));
        assert_eq!(names(&objects), ["prod"], "{what}");
        assert_eq!(errors.len(), 1, "{what}: {errors:?}");
        assert!(errors[0].message.contains("nest"), "{what}: {}", errors[0]);
        assert!(errors[0].message.len() < 400, "{what}: {}", errors[0]);
    }
    // Real manifests nest a dozen levels; a hundred is still fine.
    let deep_ok = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: ok, annotations: {{a: \"{}\"}}}}\nx: {}1{}\n",
        "[".repeat(500),
        "[".repeat(100),
        "]".repeat(100)
    );
    let (objects, errors) = parse_manifests(&deep_ok, "ok.yaml");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&objects), ["ok"]);
}

#[test]
fn megabytes_of_broken_documents_are_parsed_in_linear_time() {
    let broken = "apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n---\n";
    let count = 5 * 1024 * 1024 / broken.len();
    let text = format!("{}{NAMESPACE}", broken.repeat(count));
    let (objects, errors) = timed("5 MB of broken documents", || {
        parse_manifests(&text, "broken.yaml")
    });
    assert_eq!(names(&objects), ["prod"]);
    // One line per broken document up to the bound, then one line counting the rest.
    let shown = netpol_agent::datastore::limits::MAX_REPORTED_PER_FILE;
    assert_eq!(errors.len(), shown + 1);
    let summary = errors.last().unwrap().to_string();
    assert!(
        summary.contains(&format!("{} more broken documents", count - shown)),
        "{summary}"
    );
    // Positions still point into the source: broken document n starts on line
    // 4 * (n - 1) + 1, its unclosed bracket is on the line after the next.
    let last = &errors[shown - 1];
    let line = 4 * (shown - 1) + 3;
    assert!(
        last.message.contains(&format!("line {line} ")),
        "{line}: {}",
        last.message
    );
}

#[test]
fn megabyte_long_values_are_shortened_in_messages() {
    let huge = "x".repeat(1 << 20);
    let policy = |spec: serde_json::Value, namespace: &str| {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "np", "namespace": namespace}, "spec": spec,
        }))
        .unwrap()
    };
    let cases = [
        (
            "cidr",
            policy(
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": huge}}]}]}),
                "app",
            ),
        ),
        (
            "except",
            policy(
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [huge]}}]}]}),
                "app",
            ),
        ),
        (
            "named port",
            policy(json!({"ingress": [{"ports": [{"port": huge}]}]}), "app"),
        ),
        (
            "selector key",
            policy(
                json!({"podSelector": {"matchLabels": {huge.clone(): "a"}}}),
                "app",
            ),
        ),
        (
            "expression key",
            policy(
                json!({"podSelector": {"matchExpressions": [{"key": huge, "operator": "Exists"}]}}),
                "app",
            ),
        ),
        (
            "operator",
            policy(
                json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": huge}]}}),
                "app",
            ),
        ),
        (
            "protocol",
            policy(json!({"ingress": [{"ports": [{"protocol": huge}]}]}), "app"),
        ),
        ("policy type", policy(json!({"policyTypes": [huge]}), "app")),
        ("namespace", policy(json!({}), &huge)),
    ];
    for (what, np) in cases {
        let err = validate::network_policy(&np).expect_err(what);
        let shown = err.to_string();
        assert!(
            shown.len() < 600,
            "{what}: {} bytes: {}",
            shown.len(),
            &shown[..600]
        );
        assert!(shown.contains("1048576"), "{what} says how long: {shown}");
    }
    let ns = serde_json::from_value(json!({"metadata": {"name": huge}})).unwrap();
    let shown = validate::namespace(&ns).expect_err("namespace").to_string();
    assert!(shown.len() < 600, "namespace name: {}", &shown[..600]);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "labels": {huge.clone(): "v"}},
        "status": {"podIP": "10.0.0.1"},
    }))
    .unwrap();
    let shown = validate::pod(&pod).expect_err("label key").to_string();
    assert!(shown.len() < 600, "pod label key: {}", &shown[..600]);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "p"}, "status": {"podIP": huge},
    }))
    .unwrap();
    let shown = validate::pod(&pod).expect_err("pod IP").to_string();
    assert!(shown.len() < 600, "pod IP: {}", &shown[..600]);

    // A wrongly typed megabyte string in a manifest is not echoed whole either.
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {{containers: \"{huge}\"}}\n"
    );
    let (_, errors) = parse_manifests(&text, "long.yaml");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].to_string().len() < 1000,
        "{} bytes",
        errors[0].to_string().len()
    );
}

/// Log lines the directory datastore writes, captured.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines_naming(&self, file: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(file))
            .count()
    }
}

#[test]
fn the_directory_datastore_reports_a_broken_file_once_per_change() {
    let dir = TempDir::new("dir-once");
    std::fs::write(dir.path.join("good.yaml"), NAMESPACE).unwrap();
    std::fs::write(dir.path.join("garbage.yaml"), b"kind: \xff\xfe\n").unwrap();
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut source = DirSource::new(&dir.path);
        let first = source.rescan().unwrap();
        assert_eq!(first.len(), 1, "the good namespace: {first:?}");
        for _ in 0..30 {
            assert!(source.rescan().unwrap().is_empty());
        }
        assert_eq!(log.lines_naming("garbage.yaml"), 1);

        // Another broken version is one more line; the same version again is none.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.path.join("garbage.yaml"), b"kind: \xff\xfe\xfd\n").unwrap();
        for _ in 0..5 {
            source.rescan().unwrap();
        }
        assert_eq!(log.lines_naming("garbage.yaml"), 2);

        // Fixed, it loads and nothing more is said.
        std::fs::write(
            dir.path.join("garbage.yaml"),
            NAMESPACE.replace("prod", "fixed"),
        )
        .unwrap();
        let events = source.rescan().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        source.rescan().unwrap();
        assert_eq!(log.lines_naming("garbage.yaml"), 2);
    });
}
