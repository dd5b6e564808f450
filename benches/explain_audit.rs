//! `explain` and `audit` benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench --bench explain_audit` writes synthetic clusters as manifest files (the
//! generator of `support/synthetic.rs`, as `synthetic_manifests` writes them) and prints,
//! each with `compile` of the same manifests measured in the same run as the baseline:
//! - `netpol-agent explain` on 10k pods / 1k policies / 300 namespaces (the whole command:
//!   process start, YAML, validation, evaluation), an allowed and a denied flow, median of 5;
//!   then the in-process split (reading the manifests, building the evaluator state, one
//!   `explain`, one `allowed`: the per-flow cost issue 13's conntrack re-evaluation pays);
//! - `netpol-agent audit` of a node with 1500 local pods (10k pods / 1k policies) over saved
//!   dumps of a clean kernel (reading a saved dump is the only kernel read), median of 5;
//!   then the in-process split excluding the kernel read (render what the node should hold,
//!   its provenance, the comparison).

#[path = "support/synthetic.rs"]
mod synthetic;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use netpol_agent::agent::{Calculation, OWNERSHIP};
use netpol_agent::calc_graph::update::RestoreScripts;
use netpol_agent::calc_graph::GraphConfig;
use netpol_agent::dataplane::audit::{audit, AuditInput};
use netpol_agent::datastore::manifests::load_paths;
use netpol_agent::iface_naming::CalicoResolver;
use netpol_agent::model::{IpFamily, Protocol};
use netpol_agent::rules::chains::kernel_chain_rules;
use netpol_agent::rules::sets;
use netpol_agent::rules::RuleConfig;
use netpol_agent::verdict::kernel::NodeView;
use netpol_agent::verdict::{Endpoint, Flow, State};

use synthetic::{namespace, pod, policy, Rng, Scale, APPS, NODE};

const BIN: &str = env!("CARGO_BIN_EXE_netpol-agent");
const RUNS: usize = 5;

fn write_manifests(path: &Path, scale: Scale) {
    let mut rng = Rng(42);
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).expect("manifest file"));
    let mut doc = |text: String| {
        w.write_all(b"---\n")
            .and_then(|_| w.write_all(text.as_bytes()))
            .expect("writing manifests");
    };
    for i in 0..scale.namespaces {
        doc(serde_yaml_ng::to_string(&namespace(i)).expect("yaml"));
    }
    for j in 0..scale.pods {
        let app = rng.below(APPS);
        doc(serde_yaml_ng::to_string(&pod(j, scale, app)).expect("yaml"));
    }
    for k in 0..scale.policies {
        doc(serde_yaml_ng::to_string(&policy(k, scale, &mut rng)).expect("yaml"));
    }
    w.flush().expect("writing manifests");
}

/// Median wall time of `RUNS` runs of the binary, and the last exit status.
fn time_bin(args: &[&str]) -> (Duration, i32) {
    let mut times = Vec::new();
    let mut code = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = Command::new(BIN)
            .args(args)
            .env_remove("NODENAME")
            .output()
            .expect("run netpol-agent");
        times.push(start.elapsed());
        code = out.status.code().unwrap_or(-1);
        assert!(
            code <= 1,
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    times.sort();
    (times[RUNS / 2], code)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let dir = std::env::temp_dir().join(format!("npa-bench-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    explain_figures(&dir);
    audit_figures(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

fn explain_figures(dir: &Path) {
    let scale = Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local: 110,
        dual: false,
        cluster_policies: 0,
    };
    let file = dir.join("explain.yaml");
    write_manifests(&file, scale);
    let m = file.display().to_string();
    println!(
        "explain: {} pods / {} policies / {} namespaces ({} MiB of YAML)",
        scale.pods,
        scale.policies,
        scale.namespaces,
        std::fs::metadata(&file).map(|x| x.len()).unwrap_or(0) >> 20
    );

    // In process first: find an allowed and a denied flow to time the binary on.
    let start = Instant::now();
    let (objects, errors) = load_paths(&[PathBuf::from(&m)]).expect("manifests");
    assert!(errors.is_empty());
    let load = start.elapsed();
    let start = Instant::now();
    let (state, invalid) = State::from_objects(RuleConfig::default(), &objects);
    assert!(invalid.is_empty());
    let build = start.elapsed();
    let keys: Vec<String> = state.pods().iter().map(|p| p.key.to_string()).collect();
    let mut rng = Rng(7);
    let flows: Vec<Flow> = (0..2000)
        .map(|_| Flow {
            src: Endpoint::Pod(state.pods()[rng.below(keys.len())].key.clone()),
            dst: Endpoint::Pod(state.pods()[rng.below(keys.len())].key.clone()),
            protocol: Protocol::Tcp,
            port: [8080, 9090, 443, 8050][rng.below(4)],
        })
        .collect();
    let resolved: Vec<_> = flows
        .iter()
        .map(|f| state.resolve(f).expect("flow"))
        .collect();
    let start = Instant::now();
    let mut allowed = 0usize;
    for _ in 0..50 {
        for r in &resolved {
            allowed += usize::from(state.allowed(r));
        }
    }
    let per_allowed = start.elapsed() / (50 * resolved.len() as u32);
    let start = Instant::now();
    let verdicts: Vec<_> = resolved
        .iter()
        .take(500)
        .map(|r| state.explain(r))
        .collect();
    let per_explain = start.elapsed() / verdicts.len() as u32;
    let allow_i = verdicts
        .iter()
        .position(|v| v.action == netpol_agent::verdict::Action::Allow)
        .expect("an allowed flow");
    let deny_i = verdicts
        .iter()
        .position(|v| {
            v.action == netpol_agent::verdict::Action::Deny
                && matches!(v.ingress.tiers.first().map(|t| &t.detail), Some(netpol_agent::verdict::TierDetail::NetworkPolicy(np)) if !np.policies.is_empty())
        })
        .expect("a denied flow");

    let (compile, _) = time_bin(&["compile", "--manifests", &m, "--node", NODE]);
    println!(
        "  baseline: netpol-agent compile (same manifests)      {:>8.1} ms",
        ms(compile)
    );
    for (what, i) in [("allowed", allow_i), ("denied", deny_i)] {
        let f = &flows[i];
        let (from, to, port) = (f.src.to_string(), f.dst.to_string(), f.port.to_string());
        let (t, code) = time_bin(&[
            "explain",
            "--manifests",
            &m,
            "--from",
            &from,
            "--to",
            &to,
            "--port",
            &port,
        ]);
        println!(
            "  netpol-agent explain, {what:<7} ({from} -> {to}:{port}, exit {code}) {:>8.1} ms  ratio to compile {:.2}",
            ms(t),
            t.as_secs_f64() / compile.as_secs_f64()
        );
    }
    println!(
        "  in process: read+parse manifests {:.1} ms, build evaluator state {:.1} ms, explain one flow {:.1} µs, allowed() one flow {:.2} µs ({} of {} sampled flows allowed)",
        ms(load),
        ms(build),
        per_explain.as_secs_f64() * 1e6,
        per_allowed.as_secs_f64() * 1e6,
        allowed / 50,
        resolved.len()
    );
}

fn audit_figures(dir: &Path) {
    let scale = Scale {
        pods: 10_000,
        policies: 1_000,
        namespaces: 300,
        local: 1_500,
        dual: false,
        cluster_policies: 0,
    };
    let file = dir.join("audit.yaml");
    write_manifests(&file, scale);
    let m = file.display().to_string();
    let (t, s) = (dir.join("node.iptables"), dir.join("node.ipset"));
    let (ts, ss) = (t.display().to_string(), s.display().to_string());
    // The node's kernel: exactly what it should hold (a clean audit).
    let out = Command::new(BIN)
        .args([
            "compile",
            "--manifests",
            &m,
            "--node",
            NODE,
            "--iptables-out",
            &ts,
            "--ipsets-out",
            &ss,
        ])
        .output()
        .expect("compile");
    assert!(out.status.success());
    println!(
        "audit: node with {} local pods of {} pods / {} policies ({} iptables lines)",
        scale.local,
        scale.pods,
        scale.policies,
        std::fs::read_to_string(&t)
            .map(|x| x.lines().count())
            .unwrap_or(0)
    );
    let (compile, _) = time_bin(&["compile", "--manifests", &m, "--node", NODE]);
    println!(
        "  baseline: netpol-agent compile (same manifests)      {:>8.1} ms",
        ms(compile)
    );
    let (a, code) = time_bin(&[
        "audit",
        "--node",
        NODE,
        "--manifests",
        &m,
        "--iptables-save",
        &ts,
        "--ipset-save",
        &ss,
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "the compiled kernel audits clean");
    println!(
        "  netpol-agent audit over saved dumps (clean, exit 0)   {:>8.1} ms  ratio to compile {:.2}",
        ms(a),
        a.as_secs_f64() / compile.as_secs_f64()
    );

    // In process, without the manifests and the kernel read.
    let (objects, _) = load_paths(std::slice::from_ref(&file)).expect("manifests");
    let iptables = std::fs::read_to_string(&t).expect("dump");
    let sets = std::fs::read_to_string(&s).expect("dump");
    let cfg = RuleConfig::default();
    let start = Instant::now();
    let calc = Calculation::of_objects(
        GraphConfig {
            node_name: NODE.into(),
            families: vec![IpFamily::V4],
            rules: cfg.clone(),
        },
        Box::new(CalicoResolver::default()),
        &objects,
    );
    let desired = calc.snapshot();
    let fam = &desired.families[&IpFamily::V4];
    let kernel_rules = kernel_chain_rules(&cfg, IpFamily::V4);
    let RestoreScripts {
        ipsets: want_ipsets,
        iptables: want_iptables,
    } = fam.restore_scripts(&cfg, IpFamily::V4, sets::DEFAULT_MAX_SET_SIZE);
    let render = start.elapsed();
    let start = Instant::now();
    let provenance = calc.provenance(IpFamily::V4);
    let prov = start.elapsed();
    let start = Instant::now();
    let report = audit(&AuditInput {
        family: IpFamily::V4,
        iptables_save: &iptables,
        ipset_save: &sets,
        want_iptables: &want_iptables,
        want_ipsets: &want_ipsets,
        kernel_rules: &kernel_rules,
        provenance: &provenance,
        ownership: &OWNERSHIP,
        view: NodeView {
            pod_prefixes: cfg.interface_prefixes.clone(),
            bridge: None,
        },
        append_mode: false,
    });
    let compare = start.elapsed();
    assert!(report.findings.is_empty());
    let text = report.to_text("bench");
    println!(
        "  in process, excluding the kernel read: render {:.1} ms + provenance {:.1} ms + compare/inventory {:.1} ms = {:.1} ms ({} chains, {} rules, {} report lines)",
        ms(render),
        ms(prov),
        ms(compare),
        ms(render + prov + compare),
        report.chains.len(),
        report.rule_count(),
        text.lines().count()
    );
}
