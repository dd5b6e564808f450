//! Manifest loading: reads YAML or JSON manifests (multi-document, `kind: List` and typed
//! lists expanded) from text, files and directories, and keeps the objects the agent works
//! on: Pods, Namespaces, NetworkPolicies and ClusterNetworkPolicies, and the staged kinds
//! (`StagedNetworkPolicy`, `StagedClusterNetworkPolicy`, Calico's
//! `StagedKubernetesNetworkPolicy`). A broken document is reported as a
//! [`ManifestError`] and never hides the other documents; a file that is not UTF-8 or is too
//! large is reported and skipped, and nesting too deep is refused before parsing
//! (`super::limits` has the bounds and why). Each broken piece is parsed once: error
//! positions are moved to the file's lines, not found by parsing again.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Deserialize;

use super::limits::{self, MAX_MANIFEST_BYTES};
use crate::model::staged;
use crate::model::validate::shown_name;
pub use crate::model::K8sObject;
use serde_yaml_ng::{Mapping, Value};

#[derive(Debug, Clone, thiserror::Error)]
pub struct ManifestError {
    /// File path, or whatever name the caller gave the text.
    pub source_name: String,
    /// 1-based position of the document in its source; 0 when the whole file is at fault
    /// (not UTF-8, too large).
    pub document: usize,
    pub message: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.document {
            0 => write!(f, "{}: {}", self.source_name, self.message),
            n => write!(f, "{}: document {n}: {}", self.source_name, self.message),
        }
    }
}

const CORE_V1: &str = "v1";
const NETWORKING_V1: &str = "networking.k8s.io/v1";
const CLUSTER_POLICY_API: &str = crate::model::cluster_policy::API_VERSION;
/// List kinds whose items may omit their own kind (the API server's typed lists).
const TYPED_LISTS: [(&str, &str); 7] = [
    ("PodList", "Pod"),
    ("NamespaceList", "Namespace"),
    ("NetworkPolicyList", "NetworkPolicy"),
    ("ClusterNetworkPolicyList", "ClusterNetworkPolicy"),
    ("StagedNetworkPolicyList", staged::KIND),
    ("StagedClusterNetworkPolicyList", staged::CLUSTER_KIND),
    ("StagedKubernetesNetworkPolicyList", staged::CALICO_KIND),
];
const MANIFEST_EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Parses every document of `text`. Objects of kinds the agent does not use are skipped.
pub fn parse_manifests(text: &str, source_name: &str) -> (Vec<K8sObject>, Vec<ManifestError>) {
    let mut parsed = Parsed {
        source_name,
        objects: Vec::new(),
        errors: Vec::new(),
        unreported: 0,
    };
    let text = limits::strip_bom(text);
    if text.len() > MAX_MANIFEST_BYTES {
        parsed.error(0, too_large(text.len()));
        return (parsed.objects, parsed.errors);
    }
    let mut document = 0;
    for chunk in split_documents(text) {
        let line_offset = chunk.first_line - 1;
        if let Some(problem) = limits::nesting_problem(chunk.text) {
            document += 1;
            parsed.error(
                document,
                limits::shift_lines(&problem, line_offset).into_owned(),
            );
            continue;
        }
        let documents = serde_yaml_ng::Deserializer::from_str(chunk.text);
        for deserializer in documents {
            document += 1;
            match Value::deserialize(deserializer) {
                Ok(value) => parsed.document(document, value),
                Err(_) if parsed.errors.len() >= limits::MAX_REPORTED_PER_FILE => {
                    // Past the bound only counted: no message is formatted.
                    parsed.unreported += 1;
                    break;
                }
                Err(err) => {
                    let message = err.to_string();
                    let message = limits::shift_lines(&message, line_offset);
                    parsed.error(document, format!("invalid YAML: {message}"));
                    // After a syntax error the YAML parser only repeats it; the next chunk
                    // starts fresh.
                    break;
                }
            }
        }
    }
    if parsed.unreported > 0 {
        parsed.errors.push(ManifestError {
            source_name: source_name.to_string(),
            document: 0,
            message: format!(
                "{} more broken documents or objects, not reported one by one (at most {} per file)",
                parsed.unreported,
                limits::MAX_REPORTED_PER_FILE
            ),
        });
    }
    (parsed.objects, parsed.errors)
}

/// Parses a manifest file's bytes: a byte-order mark is read past; bytes that are not UTF-8,
/// or more than `MAX_MANIFEST_BYTES` of them, are one error for the whole file (document 0)
/// and nothing of it is used.
pub fn parse_manifest_bytes(
    bytes: &[u8],
    source_name: &str,
) -> (Vec<K8sObject>, Vec<ManifestError>) {
    let whole_file = |message| {
        let error = ManifestError {
            source_name: source_name.to_string(),
            document: 0,
            message,
        };
        (Vec::new(), vec![error])
    };
    if bytes.len() > MAX_MANIFEST_BYTES {
        return whole_file(too_large(bytes.len()));
    }
    match limits::decode(bytes) {
        Ok(text) => parse_manifests(text, source_name),
        Err(problem) => whole_file(problem),
    }
}

/// Reads at most one byte more than a manifest may have, so a huge file is refused without
/// reading it all.
pub fn read_manifest_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    fs::File::open(path)?
        .take(MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn too_large(len: usize) -> String {
    let more = if len > MAX_MANIFEST_BYTES {
        "more than"
    } else {
        "at most"
    };
    format!(
        "the file holds {more} {} MiB; a manifest file may hold at most {} MiB (each object \
         at most the API server's 3 MiB); skipped",
        MAX_MANIFEST_BYTES >> 20,
        MAX_MANIFEST_BYTES >> 20
    )
}

/// Loads every manifest under `paths`. A path is a file (read whatever its name) or a
/// directory, searched recursively for `.yaml`, `.yml` and `.json` files, which are read in
/// path order. A path that cannot be read is an error; a bad document in a readable file, or
/// a readable file that is not UTF-8 text, is only reported.
pub fn load_paths(paths: &[PathBuf]) -> anyhow::Result<(Vec<K8sObject>, Vec<ManifestError>)> {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for file in manifest_files(paths)? {
        let bytes =
            read_manifest_file(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let (file_objects, file_errors) = parse_manifest_bytes(&bytes, &file.display().to_string());
        objects.extend(file_objects);
        errors.extend(file_errors);
    }
    Ok((objects, errors))
}

/// The manifest files `load_paths` reads, in the order it reads them.
pub fn manifest_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let metadata =
            fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if metadata.is_dir() {
            let mut found = Vec::new();
            collect_manifest_files(path, &mut found, &mut HashSet::new())?;
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn collect_manifest_files(
    dir: &Path,
    found: &mut Vec<PathBuf>,
    visited: &mut HashSet<PathBuf>,
) -> anyhow::Result<()> {
    // Symlinked directories are followed, so remember where we have been to survive loops.
    let canonical =
        fs::canonicalize(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !visited.insert(canonical) {
        return Ok(());
    }
    let entries =
        fs::read_dir(dir).with_context(|| format!("cannot read directory {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read directory {}", dir.display()))?;
        let path = entry.path();
        // Hidden entries are skipped: a ConfigMap volume keeps the real files in hidden
        // `..<timestamp>` directories behind the visible symlinks, and reading both would
        // load every object twice.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let metadata =
            fs::metadata(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if metadata.is_dir() {
            collect_manifest_files(&path, found, visited)?;
        } else if has_manifest_extension(&path) {
            found.push(path);
        }
    }
    Ok(())
}

fn has_manifest_extension(path: &Path) -> bool {
    path.extension().and_then(OsStr::to_str).is_some_and(|ext| {
        MANIFEST_EXTENSIONS
            .iter()
            .any(|known| ext.eq_ignore_ascii_case(known))
    })
}

/// A piece of the stream holding one document (occasionally more), parsed on its own so
/// that a syntax error in one document does not lose the documents after it.
struct Chunk<'a> {
    text: &'a str,
    /// 1-based line of the source where the chunk starts, for error messages (the YAML
    /// parser counts lines from the start of the chunk).
    first_line: usize,
}

/// Splits at `---` document markers. The YAML spec forbids a `---` at the start of a line
/// inside any scalar, so such a line always starts a new document and splitting there is
/// safe. A leading chunk holding only comments, blank lines or directives belongs to the
/// first document and is not split off.
fn split_documents(text: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let mut chunk_start = 0;
    let mut chunk_first_line = 1;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if offset > chunk_start && is_document_marker(line) {
            let previous = &text[chunk_start..offset];
            if !(chunks.is_empty() && is_preamble(previous)) {
                chunks.push(Chunk {
                    text: previous,
                    first_line: chunk_first_line,
                });
                chunk_start = offset;
                chunk_first_line = index + 1;
            }
        }
        offset += line.len();
    }
    chunks.push(Chunk {
        text: &text[chunk_start..],
        first_line: chunk_first_line,
    });
    chunks
}

fn is_document_marker(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

fn is_preamble(text: &str) -> bool {
    text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line.starts_with('%')
    })
}

/// Where one item of a list came from, for error messages and kind defaulting.
struct ListItem<'a> {
    index: usize,
    /// Typed lists (`PodList`, ...) as returned by the API server omit each item's kind and
    /// apiVersion.
    default_kind: Option<&'static str>,
    default_api_version: Option<&'a str>,
}

struct Parsed<'a> {
    source_name: &'a str,
    objects: Vec<K8sObject>,
    errors: Vec<ManifestError>,
    /// Problems past `limits::MAX_REPORTED_PER_FILE`, counted in one closing error.
    unreported: usize,
}

impl Parsed<'_> {
    fn error(&mut self, document: usize, message: String) {
        if self.errors.len() >= limits::MAX_REPORTED_PER_FILE {
            self.unreported += 1;
            return;
        }
        self.errors.push(ManifestError {
            source_name: self.source_name.to_string(),
            document,
            message: limits::brief(message),
        });
    }

    fn document(&mut self, document: usize, mut value: Value) {
        if let Err(err) = value.apply_merge() {
            self.error(document, format!("invalid YAML merge key: {err}"));
            return;
        }
        let mapping = match value {
            Value::Null => return,
            Value::Mapping(mapping) => mapping,
            other => {
                self.error(
                    document,
                    format!(
                        "expected an object with apiVersion and kind, found {}",
                        value_type(&other)
                    ),
                );
                return;
            }
        };
        let list_kind = match string_field(&mapping, "kind") {
            Some(kind) if is_list_kind(kind) => kind.to_string(),
            _ => return self.object(document, mapping, None),
        };
        // A generic List mixes kinds, so its items must say what they are.
        let default_kind = TYPED_LISTS
            .iter()
            .find(|(list, _)| *list == list_kind)
            .map(|(_, kind)| *kind);
        let default_api_version = default_kind.and_then(|_| string_field(&mapping, "apiVersion"));
        match mapping.get("items") {
            None | Some(Value::Null) => {}
            Some(Value::Sequence(items)) => {
                for (index, item) in items.iter().enumerate() {
                    let item_context = ListItem {
                        index,
                        default_kind,
                        default_api_version,
                    };
                    match item {
                        Value::Mapping(item) => {
                            self.object(document, item.clone(), Some(item_context))
                        }
                        other => self.error(
                            document,
                            format!(
                                "{list_kind} items[{index}]: expected an object, found {}",
                                value_type(other)
                            ),
                        ),
                    }
                }
            }
            Some(other) => self.error(
                document,
                format!(
                    "{list_kind}: items must be a list, found {}",
                    value_type(other)
                ),
            ),
        }
    }

    fn object(&mut self, document: usize, mut mapping: Mapping, item: Option<ListItem<'_>>) {
        let item_prefix = item
            .as_ref()
            .map(|item| format!("items[{}]: ", item.index))
            .unwrap_or_default();
        if let Some(item) = &item {
            if let Some(kind) = item.default_kind {
                if !mapping.contains_key("kind") {
                    mapping.insert("kind".into(), kind.into());
                }
            }
            if let Some(api_version) = item.default_api_version {
                if !mapping.contains_key("apiVersion") {
                    mapping.insert("apiVersion".into(), api_version.into());
                }
            }
        }

        let Some(kind) = string_field(&mapping, "kind").map(str::to_string) else {
            self.error(document, format!("{item_prefix}object has no kind"));
            return;
        };
        let expected_api_version = match kind.as_str() {
            "Pod" | "Namespace" => CORE_V1,
            "NetworkPolicy" => NETWORKING_V1,
            "ClusterNetworkPolicy" => CLUSTER_POLICY_API,
            staged::KIND | staged::CLUSTER_KIND => staged::API_VERSION,
            staged::CALICO_KIND => staged::CALICO_API_VERSION,
            list if is_list_kind(list) => {
                self.error(
                    document,
                    format!("{item_prefix}a {kind} inside a list is not supported"),
                );
                return;
            }
            _ => {
                tracing::debug!(
                    source = self.source_name,
                    document,
                    kind = %shown_name(&kind),
                    "skipping an object of a kind the agent does not use"
                );
                return;
            }
        };
        let described = format!("{item_prefix}{}", describe(&kind, &mapping));
        let api_version = string_field(&mapping, "apiVersion");
        if api_version != Some(expected_api_version) {
            let found = match api_version {
                Some(api_version) => format!("apiVersion {}", shown_name(api_version)),
                None => "no apiVersion".to_string(),
            };
            self.error(
                document,
                format!(
                    "{described}: {found} is not supported; {kind} must be {expected_api_version}"
                ),
            );
            return;
        }

        let value = Value::Mapping(mapping);
        // Through serde_path_to_error, so that a wrongly typed value is named by its path
        // (`spec.ingress[0].ports[0].port`), as the API server names the field it refuses.
        let object = match kind.as_str() {
            "Pod" => serde_path_to_error::deserialize(value).map(K8sObject::Pod),
            "Namespace" => serde_path_to_error::deserialize(value).map(K8sObject::Namespace),
            "ClusterNetworkPolicy" => {
                serde_path_to_error::deserialize(value).map(K8sObject::ClusterNetworkPolicy)
            }
            staged::KIND => {
                serde_path_to_error::deserialize(value).map(K8sObject::StagedNetworkPolicy)
            }
            staged::CALICO_KIND => serde_path_to_error::deserialize(value).map(
                |s: crate::model::StagedNetworkPolicy| {
                    K8sObject::StagedNetworkPolicy(crate::model::StagedNetworkPolicy {
                        calico: true,
                        ..s
                    })
                },
            ),
            staged::CLUSTER_KIND => {
                serde_path_to_error::deserialize(value).map(K8sObject::StagedClusterNetworkPolicy)
            }
            _ => serde_path_to_error::deserialize(value).map(K8sObject::NetworkPolicy),
        };
        match object {
            Ok(object) => self.objects.push(object),
            Err(err) => {
                let path = err.path().to_string();
                let problem = err.into_inner();
                let at = if path == "." {
                    String::new()
                } else {
                    format!(" at {}", shown_name(&path))
                };
                self.error(
                    document,
                    format!("{described}: invalid object{at}: {problem}"),
                );
            }
        }
    }
}

fn is_list_kind(kind: &str) -> bool {
    kind == "List" || TYPED_LISTS.iter().any(|(list, _)| *list == kind)
}

fn string_field<'a>(mapping: &'a Mapping, key: &str) -> Option<&'a str> {
    mapping.get(key).and_then(Value::as_str)
}

/// `Pod prod/web`, `Namespace prod`, or the kind alone when the name is unknown.
fn describe(kind: &str, mapping: &Mapping) -> String {
    let metadata = mapping.get("metadata");
    let field = |key: &str| {
        metadata
            .and_then(|metadata| metadata.get(key))
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
    };
    match (field("namespace"), field("name")) {
        (Some(namespace), Some(name)) => {
            format!("{kind} {}", shown_name(&format!("{namespace}/{name}")))
        }
        (None, Some(name)) => format!("{kind} {}", shown_name(name)),
        (_, None) => format!("{kind} (unnamed)"),
    }
}

fn value_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "an object",
        Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(objects: &[K8sObject]) -> Vec<String> {
        objects
            .iter()
            .map(|object| match object {
                K8sObject::Pod(pod) => {
                    format!("Pod {}", pod.metadata.name.clone().unwrap_or_default())
                }
                K8sObject::Namespace(ns) => {
                    format!("Namespace {}", ns.metadata.name.clone().unwrap_or_default())
                }
                K8sObject::NetworkPolicy(np) => {
                    format!(
                        "NetworkPolicy {}",
                        np.metadata.name.clone().unwrap_or_default()
                    )
                }
                K8sObject::ClusterNetworkPolicy(cnp) => format!(
                    "ClusterNetworkPolicy {}",
                    cnp.metadata.name.clone().unwrap_or_default()
                ),
                K8sObject::StagedNetworkPolicy(s) => format!(
                    "{} {}",
                    if s.calico {
                        staged::CALICO_KIND
                    } else {
                        staged::KIND
                    },
                    s.metadata.name.clone().unwrap_or_default()
                ),
                K8sObject::StagedClusterNetworkPolicy(s) => format!(
                    "{} {}",
                    staged::CLUSTER_KIND,
                    s.metadata.name.clone().unwrap_or_default()
                ),
            })
            .collect()
    }

    const POLICY: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: prod}
spec:
  podSelector: {}
";

    #[test]
    fn a_wrongly_typed_value_is_named_by_its_path() {
        let text = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 80}, {port: [80], protocol: TCP}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: x, labels: {app: [a]}}
---
apiVersion: v1
kind: Namespace
metadata: {name: good}
";
        let (objects, errors) = parse_manifests(text, "typed.yaml");
        assert_eq!(names(&objects), ["Namespace good"]);
        let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(
            messages[0].contains("NetworkPolicy x/p: invalid object at spec.ingress[0].ports[1].port: invalid type: sequence"),
            "{messages:?}"
        );
        assert!(
            messages[1].contains(
                "Pod x/web: invalid object at metadata.labels.app: invalid type: sequence"
            ),
            "{messages:?}"
        );
    }

    #[test]
    fn multi_document_stream_with_a_list_is_expanded_in_order() {
        let text = format!(
            "\
# leading comment
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {{name: prod}}
- apiVersion: v1
  kind: Service
  metadata: {{name: skipped}}
- apiVersion: v1
  kind: Pod
  metadata: {{name: web, namespace: prod}}
  spec: {{containers: [{{name: main, image: nginx}}]}}
---
{POLICY}"
        );
        let (objects, errors) = parse_manifests(&text, "stream.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            names(&objects),
            ["Namespace prod", "Pod web", "NetworkPolicy deny-all"]
        );
    }

    #[test]
    fn typed_lists_supply_missing_item_kind_and_api_version() {
        let text = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicyList
items:
- metadata: {name: a, namespace: prod}
  spec: {podSelector: {}}
- metadata: {name: b, namespace: prod}
  spec: {podSelector: {}}
---
apiVersion: v1
kind: PodList
items:
- metadata: {name: p}
";
        let (objects, errors) = parse_manifests(text, "lists.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            names(&objects),
            ["NetworkPolicy a", "NetworkPolicy b", "Pod p"]
        );
    }

    #[test]
    fn unknown_kinds_are_skipped_silently() {
        let text = format!(
            "\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec: {{replicas: 3}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
---
{POLICY}"
        );
        let (objects, errors) = parse_manifests(&text, "mixed.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(names(&objects), ["NetworkPolicy deny-all"]);
    }

    #[test]
    fn broken_document_is_reported_and_the_others_load() {
        let text = format!(
            "\
apiVersion: v1
kind: Namespace
metadata: {{name: prod}}
---
apiVersion: v1
kind: Pod
metadata: {{name: broken, namespace: prod}}
spec:
  containers: not-a-list
---
{POLICY}"
        );
        let (objects, errors) = parse_manifests(&text, "app.yaml");
        assert_eq!(
            names(&objects),
            ["Namespace prod", "NetworkPolicy deny-all"]
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        let error = &errors[0];
        assert_eq!(
            (error.source_name.as_str(), error.document),
            ("app.yaml", 2)
        );
        assert!(
            error.message.contains("Pod prod/broken"),
            "{}",
            error.message
        );
        assert!(
            error
                .to_string()
                .starts_with("app.yaml: document 2: Pod prod/broken: "),
            "{error}"
        );
    }

    #[test]
    fn yaml_syntax_error_loses_only_its_own_document() {
        let text = format!(
            "\
apiVersion: v1
kind: Namespace
metadata: {{name: prod}}
---
apiVersion: v1
kind: Pod
metadata: {{name: [unclosed
---
{POLICY}"
        );
        let (objects, errors) = parse_manifests(&text, "syntax.yaml");
        assert_eq!(
            names(&objects),
            ["Namespace prod", "NetworkPolicy deny-all"]
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].document, 2);
        // Positions are the source's, not the document's: the unclosed `[` is on line 7.
        assert!(
            errors[0].message.contains("line 7 column 18"),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn network_policy_with_another_api_version_is_rejected() {
        let text = "\
apiVersion: extensions/v1beta1
kind: NetworkPolicy
metadata: {name: old, namespace: prod}
spec: {podSelector: {}}
---
kind: NetworkPolicy
metadata: {name: unversioned}
spec: {podSelector: {}}
";
        let (objects, errors) = parse_manifests(text, "old.yaml");
        assert!(objects.is_empty(), "{:?}", names(&objects));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].document, 1);
        assert!(
            errors[0].message.contains("NetworkPolicy prod/old"),
            "{}",
            errors[0].message
        );
        assert!(
            errors[0].message.contains("extensions/v1beta1"),
            "{}",
            errors[0].message
        );
        assert!(
            errors[0].message.contains("networking.k8s.io/v1"),
            "{}",
            errors[0].message
        );
        assert_eq!(errors[1].document, 2);
        assert!(
            errors[1].message.contains("no apiVersion"),
            "{}",
            errors[1].message
        );
    }

    #[test]
    fn empty_documents_are_skipped_but_counted() {
        let text = "---\n---\n# only a comment\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: 7\n---\n";
        let (objects, errors) = parse_manifests(text, "sparse.yaml");
        assert!(objects.is_empty());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].document, 3);
        let (objects, errors) = parse_manifests("", "empty.yaml");
        assert!(objects.is_empty() && errors.is_empty());
    }

    #[test]
    fn json_documents_and_lists_are_read() {
        let text = r#"{
	"apiVersion": "v1",
	"kind": "List",
	"items": [
		{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}},
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}
	]
}"#;
        let (objects, errors) = parse_manifests(text, "list.json");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(names(&objects), ["Namespace prod", "Pod web"]);
    }

    #[test]
    fn malformed_objects_and_list_items_are_reported() {
        let text = "\
- just a list
---
plain scalar
---
metadata: {name: kindless}
---
apiVersion: v1
kind: List
items:
- 42
- apiVersion: v1
  kind: Pod
  metadata: {name: bad-item}
  spec: {containers: 5}
---
apiVersion: v1
kind: List
items: nope
";
        let (objects, errors) = parse_manifests(text, "bad.yaml");
        assert!(objects.is_empty());
        let summary: Vec<(usize, bool)> = errors
            .iter()
            .map(|error| (error.document, error.message.is_empty()))
            .collect();
        assert_eq!(
            summary,
            [
                (1, false),
                (2, false),
                (3, false),
                (4, false),
                (4, false),
                (5, false)
            ]
        );
        assert!(
            errors[0].message.contains("a list"),
            "{}",
            errors[0].message
        );
        assert!(
            errors[2].message.contains("no kind"),
            "{}",
            errors[2].message
        );
        assert!(
            errors[3].message.contains("items[0]"),
            "{}",
            errors[3].message
        );
        assert!(
            errors[4].message.contains("items[1]: Pod bad-item"),
            "{}",
            errors[4].message
        );
        assert!(
            errors[5].message.contains("items must be a list"),
            "{}",
            errors[5].message
        );
    }

    #[test]
    fn wrong_api_version_for_core_kinds_is_rejected() {
        let text = "apiVersion: apps/v1\nkind: Pod\nmetadata: {name: p}\n";
        let (objects, errors) = parse_manifests(text, "pod.yaml");
        assert!(objects.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("apps/v1"),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn document_markers_are_recognised_only_at_line_start() {
        assert!(is_document_marker("---"));
        assert!(is_document_marker("---\n"));
        assert!(is_document_marker("--- # comment\n"));
        assert!(is_document_marker("---\r\n"));
        assert!(!is_document_marker("----\n"));
        assert!(!is_document_marker(" ---\n"));
        let text = "a: |\n  ---\n  text\n---\nb: 1\n";
        let chunks = split_documents(text);
        let lines: Vec<usize> = chunks.iter().map(|chunk| chunk.first_line).collect();
        assert_eq!(lines, [1, 4]);
        assert_eq!(chunks[0].text, "a: |\n  ---\n  text\n");
    }

    /// A scratch directory removed when dropped.
    struct ScratchDir(PathBuf);

    impl ScratchDir {
        fn new(test: &str) -> ScratchDir {
            let path = std::env::temp_dir().join(format!(
                "netpol-agent-manifests-{}-{test}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).expect("create scratch dir");
            ScratchDir(path)
        }

        fn write(&self, relative: &str, text: &str) -> PathBuf {
            let path = self.0.join(relative);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).expect("create parent dir");
            }
            fs::write(&path, text).expect("write file");
            path
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn pod_yaml(name: &str) -> String {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n")
    }

    #[test]
    fn directories_are_walked_recursively_in_path_order() {
        let dir = ScratchDir::new("walk");
        dir.write("b.yaml", &pod_yaml("b"));
        dir.write("a/z.yml", &pod_yaml("a-z"));
        dir.write(
            "a/c.JSON",
            r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a-c"}}"#,
        );
        dir.write("notes.txt", &pod_yaml("ignored-extension"));
        dir.write(".hidden/x.yaml", &pod_yaml("ignored-hidden"));
        dir.write("c.yaml", "apiVersion: v1\nkind: Pod\nspec: 1\n");
        let explicit = dir.write("explicit.txt", &pod_yaml("explicit"));

        let (objects, errors) =
            load_paths(&[dir.0.clone(), explicit.clone()]).expect("paths are readable");
        // explicit.txt is read once: the walk skips it for its extension, naming it reads it.
        assert_eq!(
            names(&objects),
            ["Pod a-c", "Pod a-z", "Pod b", "Pod explicit"]
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].source_name,
            dir.0.join("c.yaml").display().to_string()
        );
        assert_eq!(errors[0].document, 1);
    }

    #[test]
    fn missing_path_is_an_error() {
        let dir = ScratchDir::new("missing");
        let missing = dir.0.join("does-not-exist.yaml");
        let err = load_paths(std::slice::from_ref(&missing)).expect_err("missing path");
        assert!(err.to_string().contains("does-not-exist.yaml"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loops_are_walked_once() {
        let dir = ScratchDir::new("loop");
        dir.write("sub/p.yaml", &pod_yaml("p"));
        std::os::unix::fs::symlink(&dir.0, dir.0.join("sub/back")).expect("symlink");
        let (objects, errors) = load_paths(std::slice::from_ref(&dir.0)).expect("readable");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(names(&objects), ["Pod p"]);
    }

    #[test]
    fn cluster_network_policies_and_their_lists_are_read() {
        let text = "\
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-metadata}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {}}
  egress: [{action: Deny, to: [{networks: [169.254.169.254/32]}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicyList
items:
- metadata: {name: baseline}
  spec: {tier: Baseline, priority: 0, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: too-old}
";
        let (objects, errors) = parse_manifests(text, "cnp.yaml");
        assert_eq!(
            names(&objects),
            [
                "ClusterNetworkPolicy deny-metadata",
                "ClusterNetworkPolicy baseline"
            ]
        );
        let K8sObject::ClusterNetworkPolicy(first) = &objects[0] else {
            panic!("{objects:?}")
        };
        let egress = first.spec.as_ref().unwrap().egress.as_ref().unwrap();
        assert_eq!(
            egress[0].to.as_ref().unwrap()[0].networks.as_deref(),
            Some(&["169.254.169.254/32".to_string()][..])
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].message.contains("ClusterNetworkPolicy too-old")
                && errors[0]
                    .message
                    .contains("policy.networking.k8s.io/v1alpha2"),
            "{}",
            errors[0].message
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in r#"(---\n|[-a-z:{}\[\] \n\t"'&*!|>%#]){0,200}"#) {
            let (objects, errors) = parse_manifests(&text, "fuzz.yaml");
            proptest::prop_assert!(objects.len() + errors.len() <= text.len() + 1);
        }
    }

    #[test]
    fn staged_kinds_ours_and_calicos_are_read() {
        let text = "\
apiVersion: netpol-agent.io/v1alpha1
kind: StagedNetworkPolicy
metadata: {name: default-deny, namespace: shop}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: projectcalico.org/v3
kind: StagedKubernetesNetworkPolicy
metadata: {name: old-allow, namespace: shop}
spec: {stagedAction: Delete}
---
apiVersion: netpol-agent.io/v1alpha1
kind: StagedClusterNetworkPolicyList
items:
- metadata: {name: admin-deny}
  spec: {stagedAction: Set, tier: Admin, priority: 1, subject: {namespaces: {}}}
---
apiVersion: projectcalico.org/v3
kind: StagedNetworkPolicy
metadata: {name: calico-format, namespace: shop}
spec: {selector: all()}
";
        let (objects, errors) = parse_manifests(text, "staged.yaml");
        assert_eq!(
            names(&objects),
            [
                "StagedNetworkPolicy default-deny",
                "StagedKubernetesNetworkPolicy old-allow",
                "StagedClusterNetworkPolicy admin-deny"
            ]
        );
        let K8sObject::StagedNetworkPolicy(first) = &objects[0] else {
            panic!("{objects:?}")
        };
        let spec = first.spec.as_ref().unwrap();
        assert_eq!(spec.staged_action, None);
        assert_eq!(
            spec.policy.policy_types.as_deref(),
            Some(&["Ingress".to_string()][..])
        );
        let K8sObject::StagedNetworkPolicy(calico) = &objects[1] else {
            panic!("{objects:?}")
        };
        assert!(calico.calico);
        assert_eq!(
            calico.spec.as_ref().unwrap().staged_action.as_deref(),
            Some("Delete")
        );
        let K8sObject::StagedClusterNetworkPolicy(cluster) = &objects[2] else {
            panic!("{objects:?}")
        };
        assert_eq!(cluster.spec.as_ref().unwrap().policy.priority, Some(1));
        // Calico's own policy format is not read: refused with the apiVersion we take.
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].message.contains("netpol-agent.io/v1alpha1"),
            "{}",
            errors[0].message
        );
        // Written back as what it was read as.
        let yaml = serde_yaml_ng::to_string(calico).unwrap();
        assert!(
            yaml.contains("kind: StagedKubernetesNetworkPolicy"),
            "{yaml}"
        );
        assert!(yaml.contains("stagedAction: Delete"), "{yaml}");
    }
}
