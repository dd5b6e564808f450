//! A fixed pod → interface map, for tests and CNIs whose naming follows no rule.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use super::{validate_pod_interface_name, InterfaceResolver, NamingError};
use crate::model::{ObjectKey, PodInfo};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticResolver {
    interface_by_pod: BTreeMap<ObjectKey, String>,
}

impl StaticResolver {
    /// Validates every interface name, and that no two pods claim the same interface (policy
    /// for one would silently land on the other).
    pub fn new(map: BTreeMap<ObjectKey, String>) -> Result<Self, NamingError> {
        let mut pod_by_interface: BTreeMap<&str, &ObjectKey> = BTreeMap::new();
        for (pod, name) in &map {
            validate_pod_interface_name(pod, name)?;
            if let Some(first) = pod_by_interface.insert(name, pod) {
                return Err(NamingError::DuplicateInterface {
                    name: name.clone(),
                    first: first.clone(),
                    second: pod.clone(),
                });
            }
        }
        Ok(StaticResolver {
            interface_by_pod: map,
        })
    }

    /// Parses a YAML mapping of `"namespace/pod"` to interface name. An empty document is an
    /// empty map.
    pub fn from_yaml(text: &str) -> Result<Self, NamingError> {
        // Through `Value` rather than straight into a map of strings: that way duplicate keys
        // are an error instead of the last one winning, and `~` or `123` are not quietly
        // turned into interface names.
        let document: Value =
            serde_yaml_ng::from_str(text).map_err(|err| NamingError::MapYaml {
                message: err.to_string(),
            })?;
        let entries = match document {
            Value::Null => return StaticResolver::new(BTreeMap::new()),
            Value::Mapping(entries) => entries,
            other => {
                return Err(NamingError::MapYaml {
                    message: format!(
                        "the document must be a mapping of \"namespace/pod\" to interface name, \
                         got {}",
                        describe(&other)
                    ),
                })
            }
        };
        let mut map = BTreeMap::new();
        for (key, value) in entries {
            let Value::String(key) = key else {
                return Err(NamingError::InvalidMapKey {
                    key: describe(&key),
                    problem: "keys must be strings",
                });
            };
            let pod = parse_pod_key(&key)?;
            let Value::String(interface) = value else {
                return Err(NamingError::InvalidMapValue {
                    key,
                    found: describe(&value),
                });
            };
            map.insert(pod, interface);
        }
        StaticResolver::new(map)
    }
}

fn parse_pod_key(key: &str) -> Result<ObjectKey, NamingError> {
    let invalid = |problem| NamingError::InvalidMapKey {
        key: key.to_string(),
        problem,
    };
    let (namespace, name) = key.split_once('/').ok_or_else(|| invalid("no '/'"))?;
    if namespace.is_empty() {
        return Err(invalid("the namespace is empty"));
    }
    if name.is_empty() {
        return Err(invalid("the pod name is empty"));
    }
    if name.contains('/') {
        return Err(invalid("more than one '/'"));
    }
    // Kubernetes names never contain whitespace: such a key could never match a pod.
    if key.chars().any(char::is_whitespace) {
        return Err(invalid("it contains whitespace"));
    }
    Ok(ObjectKey::new(namespace, name))
}

/// A short description of a YAML value for error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n} (quote it if it is a name)"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        Value::Tagged(tagged) => format!("a value tagged {}", tagged.tag),
    }
}

impl InterfaceResolver for StaticResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        self.interface_by_pod
            .get(&pod.key)
            .cloned()
            .ok_or_else(|| NamingError::NotMapped {
                pod: pod.key.clone(),
            })
    }

    fn scheme(&self) -> &'static str {
        "static"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::pod;
    use super::super::{BadName, NameProblem};
    use super::*;

    #[test]
    fn yaml_map_resolves_each_pod() {
        let resolver = StaticResolver::from_yaml(
            "# test fixture\n\"default/web-1\": eth-web1\nkube-system/dns: \"tap0\"\n",
        )
        .unwrap();
        assert_eq!(
            resolver.resolve(&pod("default", "web-1", None)),
            Ok("eth-web1".to_string())
        );
        assert_eq!(
            resolver.resolve(&pod("kube-system", "dns", None)),
            Ok("tap0".to_string())
        );
    }

    #[test]
    fn flow_style_yaml_is_accepted() {
        let resolver = StaticResolver::from_yaml(r#"{"default/web-1": "eth-web1"}"#).unwrap();
        assert_eq!(
            resolver.resolve(&pod("default", "web-1", None)),
            Ok("eth-web1".to_string())
        );
    }

    #[test]
    fn unknown_pod_is_not_mapped() {
        let resolver = StaticResolver::from_yaml("default/web-1: eth-web1\n").unwrap();
        let err = resolver
            .resolve(&pod("default", "web-2", None))
            .unwrap_err();
        assert_eq!(
            err,
            NamingError::NotMapped {
                pod: ObjectKey::new("default", "web-2")
            }
        );
        assert!(err.to_string().contains("default/web-2"));
        // Same name in another namespace is another pod.
        assert!(resolver.resolve(&pod("other", "web-1", None)).is_err());
    }

    #[test]
    fn sixteen_byte_name_in_map_is_rejected_naming_the_entry() {
        let err = StaticResolver::from_yaml("default/web-1: eth-web1-toolong1\n").unwrap_err();
        assert_eq!(
            err,
            NamingError::BadName {
                pod: Some(ObjectKey::new("default", "web-1")),
                bad: BadName::TooLong {
                    name: "eth-web1-toolong1".to_string(),
                    len: 17,
                },
            }
        );
        let err = StaticResolver::new(BTreeMap::from([(
            ObjectKey::new("default", "web-1"),
            "x".repeat(16),
        )]))
        .unwrap_err();
        assert!(matches!(
            err,
            NamingError::BadName {
                bad: BadName::TooLong { len: 16, .. },
                ..
            }
        ));
        assert!(err.to_string().contains("default/web-1"));
    }

    #[test]
    fn malformed_name_in_map_is_rejected() {
        assert!(matches!(
            StaticResolver::from_yaml("default/web-1: \"eth/1\"\n"),
            Err(NamingError::BadName {
                bad: BadName::Invalid {
                    problem: NameProblem::Slash,
                    ..
                },
                ..
            })
        ));
        assert!(matches!(
            StaticResolver::from_yaml("default/web-1: \"\"\n"),
            Err(NamingError::BadName {
                bad: BadName::Invalid {
                    problem: NameProblem::Empty,
                    ..
                },
                ..
            })
        ));
    }

    #[test]
    fn duplicate_keys_are_rejected_not_overwritten() {
        assert!(matches!(
            StaticResolver::from_yaml("default/web-1: eth-a\ndefault/web-1: eth-b\n"),
            Err(NamingError::MapYaml { .. })
        ));
    }

    #[test]
    fn two_pods_on_one_interface_are_rejected() {
        assert_eq!(
            StaticResolver::from_yaml("default/web-1: eth-a\ndefault/web-2: eth-a\n"),
            Err(NamingError::DuplicateInterface {
                name: "eth-a".to_string(),
                first: ObjectKey::new("default", "web-1"),
                second: ObjectKey::new("default", "web-2"),
            })
        );
    }

    #[test]
    fn malformed_keys_are_rejected() {
        for key in ["web-1", "/web-1", "default/", "a/b/c", "default/ web-1"] {
            assert!(
                matches!(
                    StaticResolver::from_yaml(&format!("\"{key}\": eth0\n")),
                    Err(NamingError::InvalidMapKey { .. })
                ),
                "{key:?} was accepted"
            );
        }
        assert!(matches!(
            StaticResolver::from_yaml("[1]: eth0\n"),
            Err(NamingError::InvalidMapKey { .. })
        ));
    }

    #[test]
    fn non_string_values_are_rejected() {
        for value in ["~", "123", "[eth0]", "true"] {
            assert!(
                matches!(
                    StaticResolver::from_yaml(&format!("default/web-1: {value}\n")),
                    Err(NamingError::InvalidMapValue { .. })
                ),
                "{value:?} was accepted"
            );
        }
    }

    #[test]
    fn document_must_be_a_mapping_or_empty() {
        assert!(matches!(
            StaticResolver::from_yaml("- default/web-1\n"),
            Err(NamingError::MapYaml { .. })
        ));
        assert!(matches!(
            StaticResolver::from_yaml("default/web-1: [unclosed\n"),
            Err(NamingError::MapYaml { .. })
        ));
        let empty = StaticResolver::from_yaml("# nothing mapped yet\n").unwrap();
        assert!(matches!(
            empty.resolve(&pod("default", "web-1", None)),
            Err(NamingError::NotMapped { .. })
        ));
    }
}
