//! The bad-input corpus: hostile objects and files (issue 16's list: CIDRs, ports, protocols,
//! labels, selectors, names, duplicates, big, bombed, deep, broken and binary files, pods with
//! many or bad IPs, thousands of policies), each with its expected outcome: rejected with the
//! field or problem named, or accepted. Each one sits beside a good policy and goes through
//! `compile --strict` (exit 1 when rejected, 0 when accepted; the good policy rendered either
//! way; no panic; bounded time, memory and log lines), and all of them together through a
//! running agent with the directory datastore in a network namespace, which must converge to
//! what `compile` renders with the good policy enforced.
//!
//! The corpus is generated here rather than stored as files: several inputs are megabytes, and
//! each case keeps its expectation next to its bytes.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::converge::wait_converged;
use common::{NetNs, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");

/// A good pod and policy, in every case's directory.
const GOOD: &str = "\
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: app, labels: {role: server}}
spec: {nodeName: node-1, containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.1}, {ip: 'fd00::1'}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress: [{ports: [{port: 80}]}]
";
const GOOD_CHAIN: &str = ":cali-pi-knp/app/good - [0:0]";

/// Slowest a single `compile` of one case may be. The bad cases took more than 20 s
/// each in a release build; a debug build parses YAML many times slower.
const MAX_RUN: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(120)
} else {
    Duration::from_secs(10)
};
/// Most memory a `compile` child may use (largest resident set of any run).
const MAX_RSS_MIB: i64 = 512;
/// Longest line `compile` or the agent may log: megabyte-long values are shortened.
const MAX_LOG_LINE: usize = 4096;

#[derive(Debug, Clone, Copy)]
enum Expect {
    Accepted,
    /// Rejected (the object, or the whole file), the message holding this text.
    Rejected(&'static str),
}
use Expect::{Accepted, Rejected};

struct Case {
    name: &'static str,
    /// File extension: `yaml`, `json`, or anything for binary.
    ext: &'static str,
    bytes: Vec<u8>,
    expect: Expect,
}

fn case(name: &'static str, text: impl Into<String>, expect: Expect) -> Case {
    Case {
        name,
        ext: "yaml",
        bytes: text.into().into_bytes(),
        expect,
    }
}

fn policy(spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: bad, namespace: app}}\nspec:\n{spec}"
    )
}

fn ingress_from(peer: &str) -> String {
    policy(&format!(
        "  podSelector: {{}}\n  ingress:\n  - from:\n    - {peer}\n"
    ))
}

fn ip_block(cidr: &str, except: &[&str]) -> String {
    ingress_from(&format!(
        "ipBlock: {{cidr: {cidr:?}, except: {:?}}}",
        except
    ))
}

fn ports(port: &str) -> String {
    policy(&format!(
        "  podSelector: {{}}\n  ingress:\n  - ports: [{port}]\n"
    ))
}

fn selector(sel: &str) -> String {
    policy(&format!("  podSelector: {sel}\n"))
}

/// A pod on this node; `extra_spec` is more of its spec (`, key: value`), which may give
/// its own `containers`.
fn pod(name: &str, namespace: &str, labels: &str, ips: &str, extra_spec: &str) -> String {
    let containers = if extra_spec.contains("containers:") {
        ""
    } else {
        ", containers: [{name: c, image: i}]"
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name:?}, namespace: {namespace:?}, labels: {labels}}}\nspec: {{nodeName: node-1{containers}{extra_spec}}}\nstatus: {{phase: Running, podIPs: {ips}}}\n"
    )
}

fn json_policy_named(name: &str, namespace: &str) -> String {
    serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podSelector": {}}
    })
    .to_string()
}

fn json_case(name: &'static str, text: String, expect: Expect) -> Case {
    Case {
        name,
        ext: "json",
        bytes: text.into_bytes(),
        expect,
    }
}

fn cases() -> Vec<Case> {
    let mega = "1".repeat(1 << 20);
    let long_label = "a".repeat(64);
    let mut v = vec![
        // CIDRs.
        case("cidr-prefix-33", ip_block("10.0.0.0/33", &[]), Rejected("ipBlock.cidr")),
        case("cidr-no-prefix", ip_block("10.0.0.1", &[]), Rejected("ipBlock.cidr")),
        case("cidr-empty", ip_block("", &[]), Rejected("ipBlock.cidr")),
        case("cidr-octet-999", ip_block("999.0.0.0/8", &[]), Rejected("ipBlock.cidr")),
        case("cidr-zone-id", ip_block("fe80::1%eth0/64", &[]), Rejected("ipBlock.cidr")),
        case("cidr-not-an-ip", ip_block("example.com/8", &[]), Rejected("ipBlock.cidr")),
        case("cidr-megabyte", ip_block(&mega, &[]), Rejected("ipBlock.cidr")),
        case("cidr-host-bits", ip_block("10.0.0.5/8", &[]), Accepted),
        case("cidr-v6-all", ip_block("::/0", &[]), Accepted),
        case("cidr-v4-mapped", ip_block("::ffff:10.0.0.0/104", &[]), Accepted),
        case("except-outside", ip_block("10.0.0.0/8", &["192.168.0.0/16"]), Rejected("ipBlock.except")),
        case("except-equal", ip_block("10.0.0.0/8", &["10.0.0.0/8"]), Rejected("ipBlock.except")),
        case("except-mixed-family", ip_block("10.0.0.0/8", &["fd00::/64"]), Rejected("ipBlock.except")),
        case("except-invalid", ip_block("10.0.0.0/8", &["10.1.0.0/99"]), Rejected("ipBlock.except")),
        case("except-inside", ip_block("0.0.0.0/0", &["0.0.0.0/1", "10.0.0.0/8"]), Accepted),
        // Ports and protocols.
        case("port-0", ports("{port: 0}"), Rejected("ports[0].port")),
        case("port-65536", ports("{port: 65536}"), Rejected("ports[0].port")),
        case("port-negative", ports("{port: -1}"), Rejected("ports[0].port")),
        case("port-empty-name", ports("{port: ''}"), Rejected("ports[0].port")),
        case("end-port-below-port", ports("{port: 90, endPort: 80}"), Rejected("ports[0].endPort")),
        case("end-port-65536", ports("{port: 90, endPort: 65536}"), Rejected("ports[0].endPort")),
        case("end-port-named", ports("{port: http, endPort: 90}"), Rejected("ports[0].endPort")),
        case("named-port-16-chars", ports("{port: abcdefghijklmnop}"), Rejected("ports[0].port")),
        case("named-port-uppercase", ports("{port: HTTP}"), Rejected("ports[0].port")),
        case("named-port-megabyte", ports(&format!("{{port: a{mega}}}")), Rejected("ports[0].port")),
        case("named-port-digits-only", ports("{port: '123a'}"), Accepted),
        case("protocol-lowercase", ports("{protocol: tcp, port: 80}"), Rejected("ports[0].protocol")),
        case("protocol-icmp", ports("{protocol: ICMP}"), Rejected("ports[0].protocol")),
        case("protocol-sctp", ports("{protocol: SCTP, port: 80}"), Accepted),
        case("port-range-full", ports("{port: 1, endPort: 65535}"), Accepted),
        // Labels and selectors.
        case("label-key-64", selector(&format!("{{matchLabels: {{{long_label}: x}}}}")), Rejected("matchLabels")),
        case("label-value-64", selector(&format!("{{matchLabels: {{k: {long_label}}}}}")), Rejected("matchLabels")),
        case("label-key-space", selector("{matchLabels: {'a b': x}}"), Rejected("matchLabels")),
        case("label-value-slash", selector("{matchLabels: {k: 'x/y'}}"), Rejected("matchLabels")),
        case("label-key-prefix-long", selector(&format!("{{matchLabels: {{'{}.io/k': x}}}}", "a".repeat(254))), Rejected("matchLabels")),
        // A YAML mapping key is at most 1024 characters, so the megabyte key is a requirement's.
        case("label-key-megabyte", selector(&format!("{{matchExpressions: [{{key: 'k{mega}', operator: Exists}}]}}")), Rejected("matchExpressions[0].key")),
        case("label-key-empty-prefix", selector("{matchLabels: {'/k': x}}"), Rejected("matchLabels")),
        case("operator-unknown", selector("{matchExpressions: [{key: k, operator: Equals, values: [x]}]}"), Rejected("operator")),
        case("operator-lowercase", selector("{matchExpressions: [{key: k, operator: in, values: [x]}]}"), Rejected("operator")),
        case("operator-in-no-values", selector("{matchExpressions: [{key: k, operator: In, values: []}]}"), Rejected("values")),
        case("operator-exists-values", selector("{matchExpressions: [{key: k, operator: Exists, values: [x]}]}"), Rejected("values")),
        case("operator-bad-value", selector("{matchExpressions: [{key: k, operator: NotIn, values: ['a b']}]}"), Rejected("values")),
        case("namespace-selector-bad", ingress_from("namespaceSelector: {matchExpressions: [{key: k, operator: Gt, values: ['1']}]}"), Rejected("namespaceSelector")),
        case("policy-type-unknown", policy("  podSelector: {}\n  policyTypes: [Ingres]\n"), Rejected("policyTypes")),
        case("spec-missing", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad, namespace: app}\n", Rejected("spec")),
        // serde names the type it expected, not the field (`LabelSelector`).
        case("spec-wrong-type", policy("  podSelector: 5\n"), Rejected("expected LabelSelector")),
        case("pod-label-bad", pod("p", "app", "{role: 'a b'}", "[{ip: 10.0.0.9}]", ""), Rejected("metadata.labels")),
        case("namespace-label-bad", "apiVersion: v1\nkind: Namespace\nmetadata: {name: other, labels: {'-k': v}}\n", Rejected("metadata.labels")),
        // Names.
        json_case("name-newline", json_policy_named("x\n-F\n#", "app"), Rejected("metadata.name")),
        json_case("name-space", json_policy_named("a b", "app"), Rejected("metadata.name")),
        json_case("name-nul", json_policy_named("a\u{0}b", "app"), Rejected("metadata.name")),
        json_case("name-too-long", json_policy_named(&"a".repeat(254), "app"), Rejected("metadata.name")),
        json_case("name-missing", json_policy_named("", "app"), Rejected("metadata.name")),
        json_case("namespace-uppercase", json_policy_named("np", "App"), Rejected("metadata.namespace")),
        json_case("namespace-megabyte", json_policy_named("np", &"a".repeat(1 << 20)), Rejected("metadata.namespace")),
        case("namespace-name-64", format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {long_label}}}\n"), Rejected("metadata.name")),
        // Pods.
        case("pod-ip-not-ip", pod("p", "app", "{}", "[{ip: not-an-ip}]", ""), Rejected("podIPs")),
        case("pod-ip-zone", pod("p", "app", "{}", "[{ip: 'fe80::1%eth0'}]", ""), Rejected("podIPs")),
        case("pod-ip-megabyte", pod("p", "app", "{}", &format!("[{{ip: '{mega}'}}]"), ""), Rejected("podIPs")),
        case("pod-ips-duplicate", pod("p", "app", "{}", "[{ip: 10.0.0.9}, {ip: 10.0.0.9}]", ""), Accepted),
        case(
            "pod-thousand-ips",
            pod("p", "app", "{}", &format!("[{}]", (0..1000).map(|i| format!("{{ip: 10.1.{}.{}}}", i / 250, i % 250 + 1)).collect::<Vec<_>>().join(", ")), ""),
            Accepted,
        ),
        case("pod-port-name-long", pod("p", "app", "{}", "[{ip: 10.0.0.9}]", ", containers: [{name: c, ports: [{name: abcdefghijklmnop, containerPort: 80}]}]"), Rejected("ports[0].name")),
        case("pod-host-network", pod("p", "app", "{}", "[{ip: 10.0.0.9}]", ", hostNetwork: true"), Accepted),
        // Documents and files.
        case("duplicate-objects", format!("{}---\n{}", ports("{port: 81}"), ports("{port: 81}")), Accepted),
        case("unknown-kind", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: app}\n", Accepted),
        case("wrong-api-version", "apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: old, namespace: app}\nspec: {podSelector: {}}\n", Rejected("apiVersion")),
        case("no-kind", "apiVersion: v1\nmetadata: {name: x}\n", Rejected("kind")),
        case("list-with-bad-item", format!("apiVersion: v1\nkind: List\nitems:\n- {}\n", serde_json::to_string(&serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "l", "namespace": "app"}, "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]}})).unwrap()), Rejected("ports[0].port")),
        case("empty-file", "", Accepted),
        case("only-comments", "# nothing\n---\n# here\n", Accepted),
        case("byte-order-mark", format!("\u{feff}{}", ports("{port: 82}")), Accepted),
        case("broken-yaml", "kind: [\n", Rejected("invalid YAML")),
        case("tab-indent", "kind: Namespace\n\tmetadata: {}\n", Rejected("invalid YAML")),
        case("control-char", "kind: Namespace\nmetadata: {name: \"a\u{7}b\"}\n", Rejected("control characters")),
        json_case("json-trailing-garbage", format!("{} }}}}", json_policy_named("np", "app")), Rejected("invalid YAML")),
        case("alias-bomb", alias_bomb(), Rejected("document 1")),
        case("deep-flow-nesting", format!("a: {}", "[".repeat(100_000)), Rejected("nest more than")),
        case("deep-block-nesting", format!("a:\n{}", (1..2000).map(|i| format!("{}- \n", " ".repeat(i))).collect::<String>()), Rejected("recursion limit")),
        json_case("deep-json-nesting", format!("{}{}", "{\"a\":".repeat(50_000), "}".repeat(50_000)), Rejected("nest more than")),
        case("broken-documents-5mb", "---\nkind: [\n".repeat((5 << 20) / 12), Rejected("invalid YAML")),
        case("manifest-5mb", big_manifest(), Accepted),
        case("ten-thousand-policies", (0..10_000).map(|i| format!("---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p{i}, namespace: app}}\nspec: {{podSelector: {{matchLabels: {{none: x}}}}}}\n")).collect::<String>(), Accepted),
    ];
    let mut not_utf8 = ports("{port: 83}").into_bytes();
    not_utf8.extend_from_slice(b"# caf\xe9\n");
    v.push(Case {
        name: "not-utf8",
        ext: "yaml",
        bytes: not_utf8,
        expect: Rejected("not UTF-8"),
    });
    let mut garbage = Vec::with_capacity(1 << 16);
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..(1 << 16) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        garbage.push(x as u8);
    }
    v.push(Case {
        name: "binary-garbage",
        ext: "yaml",
        bytes: garbage,
        expect: Rejected("not UTF-8"),
    });
    v.push(Case {
        name: "utf16",
        ext: "json",
        bytes: "{\"kind\": \"Namespace\"}"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect(),
        expect: Rejected(""),
    });
    v
}

/// The classic "billion laughs": nine levels of aliases, each ten of the one before.
fn alias_bomb() -> String {
    let mut text = String::from("a0: &a0 [lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text.push_str("kind: Namespace\n");
    text
}

/// About 5 MB of valid Namespaces.
fn big_manifest() -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < 5 << 20 {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ns-{i}, labels: {{team: t{i}, tier: backend}}}}\n"
        ));
        i += 1;
    }
    text
}

fn write_case(dir: &Path, c: &Case) {
    std::fs::write(dir.join(format!("zz-{}.{}", c.name, c.ext)), &c.bytes).unwrap();
}

fn max_child_rss_mib() -> i64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss() / 1024
}

#[test]
fn the_corpus_is_large_enough_and_named_uniquely() {
    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn compile_strict_names_each_hostile_input_and_renders_the_good_policy() {
    let mut failures = Vec::new();
    let mut slowest = (Duration::ZERO, "");
    for c in cases() {
        let dir = TempDir::new("corpus");
        std::fs::write(dir.path.join("good.yaml"), GOOD).unwrap();
        write_case(&dir.path, &c);
        let start = Instant::now();
        let out = Command::new(BIN)
            .args(["compile", "--strict", "--node", "node-1", "--manifests"])
            .arg(&dir.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let took = start.elapsed();
        slowest = slowest.max((took, c.name));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mut problems = Vec::new();
        if stderr.contains("panicked") {
            problems.push("panicked".to_string());
        }
        if took > MAX_RUN {
            problems.push(format!("took {took:?}"));
        }
        if !stdout.contains(GOOD_CHAIN) {
            problems.push("the good policy is not rendered".to_string());
        }
        if let Some(l) = stderr.lines().find(|l| l.len() > MAX_LOG_LINE) {
            problems.push(format!("a log line of {} bytes", l.len()));
        }
        match c.expect {
            Accepted if out.status.code() != Some(0) => {
                problems.push(format!("exit {:?}, want 0", out.status.code()))
            }
            Rejected(_) if out.status.code() != Some(1) => {
                problems.push(format!("exit {:?}, want 1", out.status.code()))
            }
            Rejected(needle) if !stderr.contains(needle) => {
                problems.push(format!("no {needle:?} in the report"))
            }
            _ => {}
        }
        if !problems.is_empty() {
            let tail: String = stderr
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            failures.push(format!(
                "{} ({:?}): {}\n{tail}",
                c.name,
                c.expect,
                problems.join("; ")
            ));
        }
    }
    let rss = max_child_rss_mib();
    eprintln!(
        "slowest case: {} in {:?}; largest resident set {rss} MiB",
        slowest.1, slowest.0
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(rss < MAX_RSS_MIB, "a compile used {rss} MiB");
}

#[test]
fn a_running_agent_with_the_whole_corpus_enforces_the_good_policy() {
    common::require_root();
    let ns = NetNs::new("corpus");
    let dir = TempDir::new("corpus-dir");
    std::fs::write(dir.path.join("good.yaml"), GOOD).unwrap();
    // Each case's objects under names of their own: cases reuse `app/bad` and `app/p`, and
    // which version of one key wins across files is not what this test is about.
    for mut c in cases() {
        for (from, to) in [
            (
                "{name: bad, namespace: app}".to_string(),
                format!("{{name: bad-{}, namespace: app}}", c.name),
            ),
            (
                "{name: \"p\", namespace: \"app\"".to_string(),
                format!("{{name: \"p-{}\", namespace: \"app\"", c.name),
            ),
        ] {
            if let Ok(text) = std::str::from_utf8(&c.bytes) {
                c.bytes = text.replace(&from, &to).into_bytes();
            }
        }
        write_case(&dir.path, &c);
    }
    let logs = TempDir::new("corpus-log");
    let log = logs.path.join("agent.log");
    let mut agent = Command::new("ip")
        .args(["netns", "exec", &ns.name, BIN, "run", "--node", "node-1"])
        .arg("--datastore")
        .arg(format!("dir:{}", dir.path.display()))
        .args(["--iptables-backend", "nft"])
        .env_remove("NODENAME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start agent");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Kill(&mut agent);
    // The first read of megabytes of manifests takes a while in a debug build; then the
    // kernel must hold exactly what compile renders.
    let start = Instant::now();
    while !ns
        .exec_ok(&["iptables-nft-save", "-t", "filter"])
        .contains(GOOD_CHAIN)
    {
        assert!(
            start.elapsed() < MAX_RUN * 2,
            "the good policy is not enforced"
        );
        assert!(guard.0.try_wait().unwrap().is_none(), "the agent exited");
        std::thread::sleep(Duration::from_millis(500));
    }
    let took = start.elapsed() + wait_converged(&ns, &dir.path, "nft", &log);
    let save = ns.exec_ok(&["iptables-nft-save", "-t", "filter"]);
    assert!(save.contains(GOOD_CHAIN), "{save}");
    // Quiet at rest: the broken files are not reported again while nothing changes. The
    // kernel holds the rules a moment before the agent says so ("first full apply done", and
    // the post-write check after it: a CI run once saw 3 such lines land in the 2 s after
    // convergence), so rest is a window of QUIET without a new line, which must come
    // within REST_WITHIN.
    const QUIET: Duration = Duration::from_secs(3);
    const REST_WITHIN: Duration = Duration::from_secs(30);
    let rest_start = Instant::now();
    let mut seen = std::fs::read_to_string(&log).unwrap();
    let converged_lines = seen.lines().count();
    loop {
        std::thread::sleep(QUIET);
        let now = std::fs::read_to_string(&log).unwrap();
        if now.lines().count() == seen.lines().count() {
            break;
        }
        assert!(
            rest_start.elapsed() < REST_WITHIN,
            "the agent keeps logging at rest; its last {QUIET:?}:\n{}",
            now.lines()
                .skip(seen.lines().count())
                .collect::<Vec<_>>()
                .join("\n")
        );
        seen = now;
    }
    let text = seen;
    let trailing: Vec<&str> = text.lines().skip(converged_lines).collect();
    if !trailing.is_empty() {
        eprintln!(
            "logged after convergence, before rest:\n{}",
            trailing.join("\n")
        );
    }
    assert!(guard.0.try_wait().unwrap().is_none(), "the agent exited");
    assert!(!text.contains("panicked"), "{text}");
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= MAX_LOG_LINE, "a log line of {longest} bytes");
    let in_sync = text
        .lines()
        .find(|l| l.contains("datastore in sync"))
        .unwrap_or("");
    eprintln!(
        "converged (checked against compile) after {took:?} with {} files; {in_sync}",
        cases().len() + 1
    );
}
