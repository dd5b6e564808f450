//! The Kubernetes objects an agent under test reads from a directory datastore (`run
//! --datastore dir:<dir>`, also `compile --manifests <dir>`): namespaces, pods and policies,
//! written into that directory as manifest files.
//!
//! Tests and benchmarks used to format this YAML by hand, each its own way (pods with or
//! without `podIP`, files written in place, where a running agent could read one
//! half-written, or through a rename). One helper per test chore: here a pod is written as
//! a user or kubectl would write it, and every file lands whole.
//!
//! Self-contained (std, k8s-openapi, serde, serde_yaml_ng only), so that
//! `benches/support/synthetic.rs`, which benchmarks without `common` include, can include
//! this file on its own.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// A Namespace with no labels.
pub fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A Running pod on `node` with addresses `ips` (at most one per family, IPv4 first in a
/// dual-stack cluster, as the kubelet reports them). The status carries both `podIP` and
/// `podIPs`, as the API server returns a pod, so the agent reads what it would read from a
/// real cluster. Fields the helper does not take (a uid, container ports) are set on the
/// returned value.
pub fn pod(namespace: &str, name: &str, labels: &[(&str, &str)], node: &str, ips: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("x".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: ips.first().map(|ip| ip.to_string()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..Default::default()
        }),
    }
}

/// The YAML documents of one manifest file, in the order added; each starts with `---`, so
/// a test may split the file it wrote back into its documents.
#[derive(Default)]
pub struct Manifest {
    text: String,
}

impl Manifest {
    pub fn new() -> Manifest {
        Manifest::default()
    }

    /// A typed object (k8s-openapi's `Namespace`, `Pod`, `NetworkPolicy`, or any object
    /// whose serialization carries its `apiVersion` and `kind`).
    pub fn object(&mut self, object: &impl Serialize) -> &mut Manifest {
        let yaml = serde_yaml_ng::to_string(object).expect("a k8s object serializes to YAML");
        self.yaml(&yaml)
    }

    /// YAML text of one or more documents, as written: for a policy easier to read as YAML
    /// than as a struct, and for objects the typed API cannot express.
    pub fn yaml(&mut self, text: &str) -> &mut Manifest {
        let text = text.strip_prefix("---\n").unwrap_or(text);
        self.text.push_str("---\n");
        self.text.push_str(text);
        if !text.ends_with('\n') {
            self.text.push('\n');
        }
        self
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Writes (or replaces) `dir/file` whole; see [`write_atomic`].
    pub fn write(&self, dir: &Path, file: &str) {
        write_atomic(dir, file, &self.text);
    }
}

/// Writes `text` to `dir/file` through a temporary file in the same directory and a rename:
/// an agent watching `dir` sees the old file or the new one, never one half-written. The
/// temporary name starts with a dot, which the directory datastore skips, so its reads
/// between the write and the rename do not see it either. `dir` is created if missing.
pub fn write_atomic(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let path = dir.join(file);
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
