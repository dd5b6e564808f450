//! Writes a synthetic cluster (`support/synthetic.rs`, the one the benchmarks build in memory)
//! as a multi-document YAML manifest file, for what needs the cluster on disk: the directory
//! datastore at scale, `netpol-agent compile` comparisons across versions, idle-cost runs.
//!
//! `cargo bench --bench synthetic_manifests -- OUT [PODS [POLICIES [NAMESPACES [LOCAL [SEED [CNPS]]]]]] [--dual]`
//! (defaults 10000 pods, 1000 policies, 300 namespaces, 110 pods on `node-0`, seed 42, no
//! ClusterNetworkPolicies (CNPS: how many per tier); `--dual`: dual-stack pods and ipBlocks).
//! The same arguments give the same bytes.

#[path = "support/synthetic.rs"]
mod synthetic;

use std::io::Write;

use synthetic::{cluster_policies, namespace, pod, policy, Rng, Scale, APPS};

fn arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i).map_or(default, |a| {
        a.parse()
            .unwrap_or_else(|_| panic!("argument {i} ({a:?}) is not a number"))
    })
}

fn main() {
    // `cargo bench` passes `--bench` first; skip flags.
    let dual = std::env::args().any(|a| a == "--dual");
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let Some(out) = args.first() else {
        eprintln!(
            "usage: synthetic_manifests OUT [PODS [POLICIES [NAMESPACES [LOCAL [SEED [CNPS]]]]]]"
        );
        std::process::exit(2);
    };
    let scale = Scale {
        pods: arg(&args, 1, 10_000),
        policies: arg(&args, 2, 1_000),
        namespaces: arg(&args, 3, 300),
        local: arg(&args, 4, 110),
        dual,
        cluster_policies: arg(&args, 6, 0),
    };
    let mut rng = Rng(arg(&args, 5, 42) as u64);
    let file = std::fs::File::create(out).unwrap_or_else(|e| panic!("creating {out}: {e}"));
    let mut w = std::io::BufWriter::new(file);
    let mut doc = |text: String| {
        w.write_all(b"---\n")
            .and_then(|_| w.write_all(text.as_bytes()))
            .expect("writing the manifest file");
    };
    for i in 0..scale.namespaces {
        doc(serde_yaml_ng::to_string(&namespace(i)).expect("yaml"));
    }
    // The same draws as `synthetic::build`: one app per pod, then the policies.
    for j in 0..scale.pods {
        let app = rng.below(APPS);
        doc(serde_yaml_ng::to_string(&pod(j, scale, app)).expect("yaml"));
    }
    for k in 0..scale.policies {
        doc(serde_yaml_ng::to_string(&policy(k, scale, &mut rng)).expect("yaml"));
    }
    for cnp in cluster_policies(scale, &mut rng) {
        doc(serde_yaml_ng::to_string(&cnp).expect("yaml"));
    }
    w.flush().expect("writing the manifest file");
    eprintln!(
        "wrote {out}: {} namespaces, {} pods ({} on {}), {} policies, {} cluster policies",
        scale.namespaces,
        scale.pods,
        scale.local,
        synthetic::NODE,
        scale.policies,
        2 * scale.cluster_policies
    );
}
