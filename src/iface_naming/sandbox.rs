//! Prefix + the start of the pod's sandbox (pause) container ID, a scheme some CNIs use.

use super::{
    validate_pod_interface_name, InterfaceResolver, NamingError, PrefixListError,
    MAX_IFACE_NAME_LEN,
};
use crate::model::{ObjectKey, PodInfo};

/// Sandbox-ID characters every name must keep: one team saw two sandboxes on a node share
/// their first 9, so 10 is the least that has kept names apart.
pub const MIN_SANDBOX_ID_CHARS: usize = 10;

/// Longest prefix that still leaves [`MIN_SANDBOX_ID_CHARS`] of the sandbox ID.
pub const MAX_SANDBOX_PREFIX_LEN: usize = MAX_IFACE_NAME_LEN - MIN_SANDBOX_ID_CHARS;

/// Names veths `<prefix><first 15 - len(prefix) characters of the sandbox ID>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxResolver {
    prefix: String,
}

impl SandboxResolver {
    pub fn new(prefix: &str) -> Result<Self, NamingError> {
        if prefix.is_empty() {
            return Err(NamingError::EmptySandboxPrefix);
        }
        if prefix.len() > MAX_SANDBOX_PREFIX_LEN {
            return Err(NamingError::SandboxPrefixTooLong {
                prefix: prefix.to_string(),
                len: prefix.len(),
            });
        }
        if let Some(problem) = crate::rules::iface::forbidden_char_problem(prefix) {
            return Err(PrefixListError::Invalid {
                prefix: prefix.to_string(),
                problem,
            }
            .into());
        }
        Ok(SandboxResolver {
            prefix: prefix.to_string(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn id_chars(&self) -> usize {
        MAX_IFACE_NAME_LEN.saturating_sub(self.prefix.len())
    }
}

impl SandboxResolver {
    /// The interface name of `pod` whose sandbox ID is `sandbox_id`, with every check the
    /// scheme makes: whatever told us the ID (the annotation, the container runtime), the
    /// name comes out of here.
    pub fn name_for(
        &self,
        pod: &ObjectKey,
        sandbox_id: Option<&str>,
    ) -> Result<String, NamingError> {
        // An empty ID (e.g. an annotation set before the runtime filled it in) means the same
        // as no ID.
        let sandbox_id = sandbox_id
            .filter(|id| !id.is_empty())
            .ok_or_else(|| NamingError::SandboxIdUnknown { pod: pod.clone() })?;
        // The whole ID is checked, not just the part used: anything else in it (a
        // `containerd://` scheme, upper case) means it is not the ID the CNI named the veth by.
        if let Some(found) = sandbox_id
            .chars()
            .find(|c| !matches!(c, '0'..='9' | 'a'..='f'))
        {
            return Err(NamingError::SandboxIdNotHex {
                pod: pod.clone(),
                sandbox_id: sandbox_id.to_string(),
                found,
            });
        }
        let needed = self.id_chars();
        let too_short = || NamingError::SandboxIdTooShort {
            pod: pod.clone(),
            sandbox_id: sandbox_id.to_string(),
            len: sandbox_id.len(),
            needed,
        };
        let id_part = sandbox_id.get(..needed).ok_or_else(too_short)?;
        let name = format!("{}{id_part}", self.prefix);
        validate_pod_interface_name(pod, &name)?;
        Ok(name)
    }
}

impl InterfaceResolver for SandboxResolver {
    /// Reads the ID from the pod itself (`compile`: the `netpol-agent.io/sandbox-id`
    /// annotation).
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        self.name_for(&pod.key, pod.sandbox_id.as_deref())
    }

    fn scheme(&self) -> &'static str {
        "sandbox"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::pod;
    use super::*;

    const SANDBOX_ID: &str = "13dd25c5cb7e0f4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a";

    fn resolve(prefix: &str, sandbox_id: Option<&str>) -> Result<String, NamingError> {
        SandboxResolver::new(prefix)?.resolve(&pod("default", "web-1", sandbox_id))
    }

    #[test]
    fn five_byte_prefix_keeps_ten_id_characters() {
        assert_eq!(
            resolve("veth-", Some(SANDBOX_ID)),
            Ok("veth-13dd25c5cb".to_string())
        );
    }

    #[test]
    fn four_byte_prefix_keeps_eleven_id_characters() {
        assert_eq!(
            resolve("hybr", Some(SANDBOX_ID)),
            Ok("hybr13dd25c5cb7".to_string())
        );
    }

    #[test]
    fn six_byte_prefix_is_rejected_with_the_reason() {
        let err = SandboxResolver::new("veth--").unwrap_err();
        assert_eq!(
            err,
            NamingError::SandboxPrefixTooLong {
                prefix: "veth--".to_string(),
                len: 6,
            }
        );
        let message = err.to_string();
        assert!(message.contains("at least 10 characters"), "{message}");
        assert!(message.contains("unique"), "{message}");
    }

    #[test]
    fn empty_or_malformed_prefix_is_rejected() {
        assert_eq!(
            SandboxResolver::new(""),
            Err(NamingError::EmptySandboxPrefix)
        );
        assert!(matches!(
            SandboxResolver::new("v/e"),
            Err(NamingError::PrefixList(PrefixListError::Invalid { .. }))
        ));
    }

    #[test]
    fn missing_sandbox_id_is_reported_for_the_pod() {
        let unknown = NamingError::SandboxIdUnknown {
            pod: ObjectKey::new("default", "web-1"),
        };
        assert_eq!(resolve("veth-", None), Err(unknown.clone()));
        assert_eq!(resolve("veth-", Some("")), Err(unknown.clone()));
        let message = unknown.to_string();
        assert!(message.contains("default/web-1"), "{message}");
        assert!(message.contains("not known yet"), "{message}");
    }

    #[test]
    fn sandbox_id_shorter_than_needed_is_rejected() {
        assert_eq!(
            resolve("veth-", Some("13dd25c5c")),
            Err(NamingError::SandboxIdTooShort {
                pod: ObjectKey::new("default", "web-1"),
                sandbox_id: "13dd25c5c".to_string(),
                len: 9,
                needed: 10,
            })
        );
        assert_eq!(
            resolve("veth-", Some("13dd25c5cb")),
            Ok("veth-13dd25c5cb".to_string())
        );
        assert!(matches!(
            resolve("hybr", Some("13dd25c5cb")),
            Err(NamingError::SandboxIdTooShort { needed: 11, .. })
        ));
    }

    #[test]
    fn sandbox_id_that_is_not_lowercase_hex_is_rejected() {
        for (sandbox_id, found) in [
            ("13DD25C5CB7E0F4A", 'D'),
            ("containerd://13dd25c5cb7e0f4a", 'o'),
            ("13dd25c5cb7e0f4g", 'g'),
            (" 13dd25c5cb7e0f4a", ' '),
        ] {
            match resolve("veth-", Some(sandbox_id)) {
                Err(NamingError::SandboxIdNotHex { found: got, .. }) => {
                    assert_eq!(got, found, "for {sandbox_id:?}")
                }
                other => panic!("{sandbox_id:?} gave {other:?}"),
            }
        }
    }
}
