//! felix's `VethNameForWorkload`: prefix + the start of sha1("<namespace>.<pod>") in hex.

use sha1::{Digest, Sha1};

use super::MAX_IFACE_NAME_LEN;
use super::{
    parse_prefix_list, validate_pod_interface_name, InterfaceResolver, NamingError, PrefixListError,
};
use crate::model::{ObjectKey, PodInfo};

/// The prefix felix uses when `FELIX_INTERFACEPREFIX` is unset.
pub const DEFAULT_CALICO_PREFIX: &str = "cali";

/// Hex characters of the hash that follow the prefix, as in felix.
const HASH_HEX_CHARS: usize = 11;

/// Names veths the way Calico's CNI plugin does. Only the first prefix of the list names
/// interfaces; the others (as in felix) describe interfaces that something else created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalicoResolver {
    naming_prefix: String,
    prefixes: Vec<String>,
}

impl CalicoResolver {
    pub fn new(prefix_list: &str) -> Result<Self, NamingError> {
        let prefixes = parse_prefix_list(prefix_list)?;
        let naming_prefix = prefixes
            .first()
            .cloned()
            .ok_or_else(|| PrefixListError::Empty {
                list: prefix_list.to_string(),
            })?;
        // Kept constructible because felix accepts such prefixes too, but each resolve will
        // refuse the name; say so once up front instead of only per pod.
        if naming_prefix.len() + HASH_HEX_CHARS > MAX_IFACE_NAME_LEN {
            tracing::warn!(
                prefix = %naming_prefix,
                "calico interface prefix is longer than {} bytes: every veth name would exceed \
                 {MAX_IFACE_NAME_LEN} bytes and will be refused",
                MAX_IFACE_NAME_LEN - HASH_HEX_CHARS
            );
        }
        Ok(CalicoResolver {
            naming_prefix,
            prefixes,
        })
    }

    /// Every configured prefix, the naming one first.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }
}

impl Default for CalicoResolver {
    fn default() -> Self {
        CalicoResolver {
            naming_prefix: DEFAULT_CALICO_PREFIX.to_string(),
            prefixes: vec![DEFAULT_CALICO_PREFIX.to_string()],
        }
    }
}

fn hashed_veth_name(prefix: &str, pod: &ObjectKey) -> String {
    let digest = Sha1::digest(format!("{}.{}", pod.namespace, pod.name).as_bytes());
    let mut hash_hex = hex::encode(digest);
    // Hex is ASCII, so cutting at any byte count stays on a character boundary.
    hash_hex.truncate(HASH_HEX_CHARS);
    format!("{prefix}{hash_hex}")
}

impl InterfaceResolver for CalicoResolver {
    fn resolve(&self, pod: &PodInfo) -> Result<String, NamingError> {
        let name = hashed_veth_name(&self.naming_prefix, &pod.key);
        validate_pod_interface_name(&pod.key, &name)?;
        Ok(name)
    }

    fn scheme(&self) -> &'static str {
        "calico"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::pod;
    use super::super::BadName;
    use super::*;

    #[test]
    fn first_prefix_of_the_list_names_the_veth() {
        let resolver = CalicoResolver::new("eni,veth,foo").unwrap();
        assert_eq!(
            resolver.resolve(&pod("namespace", "podname", None)),
            Ok("eni82111e10a96".to_string())
        );
        assert_eq!(resolver.prefixes(), ["eni", "veth", "foo"]);
    }

    #[test]
    fn default_prefix_is_cali() {
        let expected = Ok("cali82111e10a96".to_string());
        let podname = pod("namespace", "podname", None);
        assert_eq!(CalicoResolver::default().resolve(&podname), expected);
        assert_eq!(
            CalicoResolver::new("cali").unwrap().resolve(&podname),
            expected
        );
    }

    #[test]
    fn namespace_and_name_both_feed_the_hash() {
        let resolver = CalicoResolver::default();
        let a = resolver.resolve(&pod("ns-a", "web", None)).unwrap();
        let b = resolver.resolve(&pod("ns-b", "web", None)).unwrap();
        let c = resolver.resolve(&pod("ns-a", "web2", None)).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn five_byte_prefix_gives_a_too_long_name_which_is_refused() {
        let resolver = CalicoResolver::new("veth-").unwrap();
        let err = resolver
            .resolve(&pod("namespace", "podname", None))
            .unwrap_err();
        assert_eq!(
            err,
            NamingError::BadName {
                pod: Some(ObjectKey::new("namespace", "podname")),
                bad: BadName::TooLong {
                    name: "veth-82111e10a96".to_string(),
                    len: 16,
                },
            }
        );
        let message = err.to_string();
        assert!(message.contains("namespace/podname"), "{message}");
        assert!(message.contains("16 bytes"), "{message}");
    }

    #[test]
    fn empty_prefix_list_is_rejected() {
        assert!(matches!(
            CalicoResolver::new(" ,, "),
            Err(NamingError::PrefixList(PrefixListError::Empty { .. }))
        ));
    }
}
