//! Namespaces: name and labels, with the `kubernetes.io/metadata.name` label the API server
//! sets.

use super::*;

/// Validates a Namespace. Its labels always include `kubernetes.io/metadata.name=<name>`.
pub fn namespace(ns: &Namespace) -> Result<NamespaceInfo, ValidationError> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let ctx = ErrorContext {
        kind: NAMESPACE_KIND,
        object: &name,
    };
    require_name(&ns.metadata, &ctx)?;
    // The name becomes a label value below, so it has to be a valid one; the API server
    // demands a DNS-1123 label, which is stricter.
    if let Some(problem) = dns1123_label_problem(&name) {
        return Err(ctx.error(
            "metadata.name",
            format!("namespace name {} is invalid: {problem}", shown(&name)),
        ));
    }
    let mut labels = validated_labels(ns.metadata.labels.as_ref(), &ctx)?;
    // The API server sets this label on every namespace and overwrites any other value.
    labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.clone());
    Ok(NamespaceInfo { name, labels })
}
