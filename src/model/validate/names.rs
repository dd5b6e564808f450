//! The API machinery's rules for names and labels (qualified names, label values, DNS-1123
//! labels and subdomains, port names) and how a name is shown in an error: shared by every
//! kind.

use super::*;

/// The `namespace/name` key of a namespaced object (namespace `default` when absent or empty).
pub fn namespaced_key(meta: &ObjectMeta) -> ObjectKey {
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE);
    ObjectKey::new(namespace, meta.name.clone().unwrap_or_default())
}

pub(super) fn require_name(
    meta: &ObjectMeta,
    ctx: &ErrorContext<'_>,
) -> Result<(), ValidationError> {
    match meta.name.as_deref() {
        Some(name) if !name.is_empty() => Ok(()),
        _ => Err(ctx.error("metadata.name", "name is required")),
    }
}

/// The name and namespace of a Pod or NetworkPolicy, as the API server checks them: the name
/// a DNS-1123 subdomain (`ValidatePodName`, `ValidateNetworkPolicyName`), the namespace a
/// DNS-1123 label (`ValidateNamespaceName`). Manifests skip the API server, and names become
/// chain names, comments and log lines: nothing else may pass.
pub(super) fn check_names(
    meta: &ObjectMeta,
    ctx: &ErrorContext<'_>,
) -> Result<(), ValidationError> {
    require_name(meta, ctx)?;
    let name = meta.name.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_subdomain_problem(name) {
        return Err(ctx.error(
            "metadata.name",
            format!("name {} is invalid: {problem}", shown(name)),
        ));
    }
    if let Some(namespace) = meta.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        if let Some(problem) = dns1123_label_problem(namespace) {
            return Err(ctx.error(
                "metadata.namespace",
                format!("namespace {} is invalid: {problem}", shown(namespace)),
            ));
        }
    }
    Ok(())
}

pub(super) fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

pub(super) fn validated_labels(
    labels: Option<&BTreeMap<String, String>>,
    ctx: &ErrorContext<'_>,
) -> Result<BTreeMap<String, String>, ValidationError> {
    let Some(labels) = labels else {
        return Ok(BTreeMap::new());
    };
    for (key, value) in labels {
        if let Some(problem) = qualified_name_problem(key) {
            return Err(ctx.error(
                "metadata.labels",
                format!("label key {} is invalid: {problem}", shown(key)),
            ));
        }
        if let Some(problem) = label_value_problem(value) {
            return Err(ctx.error(
                "metadata.labels",
                format!(
                    "value {} of label {} is invalid: {problem}",
                    shown(value),
                    shown(key)
                ),
            ));
        }
    }
    Ok(labels.clone())
}

/// `[prefix/]name`: an optional DNS-subdomain prefix and a name of at most 63 characters.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("the prefix before '/' must not be empty".to_string());
        }
        if let Some(problem) = dns1123_subdomain_problem(prefix) {
            return Some(format!("prefix {}: {problem}", shown(prefix)));
        }
    }
    if name.is_empty() {
        return Some("the name must not be empty".to_string());
    }
    if name.contains('/') {
        return Some("a key may contain at most one '/'".to_string());
    }
    if name.len() > MAX_LABEL_NAME_LEN {
        return Some(format!(
            "the name part must be at most {MAX_LABEL_NAME_LEN} characters (it has {})",
            name.len()
        ));
    }
    if !is_label_token(name) {
        return Some(LABEL_TOKEN_RULE.to_string());
    }
    None
}

/// Empty, or at most 63 characters of the label-token grammar.
pub(super) fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > MAX_LABEL_VALUE_LEN {
        return Some(format!(
            "it must be at most {MAX_LABEL_VALUE_LEN} characters (it has {})",
            value.len()
        ));
    }
    if !is_label_token(value) {
        return Some(LABEL_TOKEN_RULE.to_string());
    }
    None
}

pub(super) const LABEL_TOKEN_RULE: &str =
    "it must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
pub(super) fn is_label_token(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Lowercase RFC 1123 labels joined by dots, at most 253 characters.
pub(super) fn dns1123_subdomain_problem(text: &str) -> Option<String> {
    if text.len() > MAX_DNS_SUBDOMAIN_LEN {
        return Some(format!(
            "it must be at most {MAX_DNS_SUBDOMAIN_LEN} characters (it has {})",
            text.len()
        ));
    }
    if !text.split('.').all(is_dns1123_label) {
        return Some(
            "it must be a lowercase DNS subdomain: labels of a-z, 0-9 and '-' separated by '.', \
             each starting and ending with a letter or digit (e.g. example.com)"
                .to_string(),
        );
    }
    None
}

pub(super) fn dns1123_label_problem(text: &str) -> Option<String> {
    if text.len() > MAX_DNS_LABEL_LEN {
        return Some(format!(
            "it must be at most {MAX_DNS_LABEL_LEN} characters (it has {})",
            text.len()
        ));
    }
    if !is_dns1123_label(text) {
        return Some(
            "it must consist of a-z, 0-9 and '-', and start and end with a letter or digit"
                .to_string(),
        );
    }
    None
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (length checked by the callers).
pub(super) fn is_dns1123_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    let is_alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            is_alnum(first) && is_alnum(last) && bytes.iter().all(|b| is_alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// IANA_SVC_NAME (RFC 6335): 1-15 of a-z, 0-9 and '-', at least one letter, no leading,
/// trailing or doubled '-'.
pub(super) fn port_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_PORT_NAME_LEN {
        return Some(format!(
            "it must be 1 to {MAX_PORT_NAME_LEN} characters long (it has {})",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("it may contain only lowercase letters a-z, digits and '-'".to_string());
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        return Some(
            "it must contain at least one letter (a numeric port must be written as a number, \
             not a string)"
                .to_string(),
        );
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("it must not start or end with '-'".to_string());
    }
    if name.contains("--") {
        return Some("it must not contain \"--\"".to_string());
    }
    None
}

/// A name as it appears in messages and logs: as it is when it is plain (printable ASCII
/// without spaces or quotes, and not long), else quoted, escaped and shortened by [`shown`].
/// Object keys are built before validation, so a rejected object's key may hold anything.
pub fn shown_name(name: &str) -> std::borrow::Cow<'_, str> {
    const PLAIN_MAX: usize = MAX_DNS_SUBDOMAIN_LEN + 1 + MAX_DNS_LABEL_LEN;
    let plain = !name.is_empty()
        && name.len() <= PLAIN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''));
    if plain {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(shown(name))
    }
}

/// A value quoted for a message (control characters escaped), shortened when long so that
/// the message stays readable and one hostile value cannot fill the log.
pub fn shown(value: &str) -> String {
    const SHOWN_CHARS: usize = 40;
    let char_count = value.chars().count();
    if char_count <= SHOWN_CHARS {
        format!("{value:?}")
    } else {
        let start: String = value.chars().take(SHOWN_CHARS).collect();
        format!("{start:?}... ({char_count} characters)")
    }
}
