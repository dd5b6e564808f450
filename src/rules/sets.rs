//! IP sets: what a set means (`SetDef`: the pods of a peer selector, or their named port),
//! its felix-style kernel name (`cali40s:` / `cali60s:` + hash, at most 31 characters), its
//! members, and the `ipset restore` text that creates and fills sets. Pure: the kernel side
//! (reading what exists, applying deltas) is `dataplane::ipsets`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use kube::core::Expression;
use sha2::{Digest, Sha224};

use crate::model::{IpFamily, LabelSel, NamedPort, NamespaceScope, PodInfo, Protocol};

/// Kernel limit on set names.
pub const MAX_SET_NAME_LEN: usize = 31;
/// felix's default `MaxIpsetSize`.
pub const DEFAULT_MAX_SET_SIZE: u32 = 1_048_576;
/// Prefixes of the sets we own (both families).
pub const OWNED_SET_PREFIXES: [&str; 2] = ["cali40", "cali60"];
/// Prefixes of the temporary sets the kernel writer builds a replacement in before swapping
/// it with the real set (felix's `cali4t`/`cali6t`). Ours too: one left behind by a crash is
/// found and destroyed.
pub const TEMP_SET_PREFIXES: [&str; 2] = ["cali4t", "cali6t"];

/// What a set holds, independent of IP family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetDef {
    /// IPs of the pods in `namespaces` whose labels match `pods`.
    Selector {
        namespaces: NamespaceScope,
        pods: LabelSel,
    },
    /// `ip,proto:port` of those pods for the container port called `port_name`.
    NamedPort {
        namespaces: NamespaceScope,
        pods: LabelSel,
        protocol: Protocol,
        port_name: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    HashNet,
    HashIpPort,
}

impl SetType {
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashNet => "hash:net",
            SetType::HashIpPort => "hash:ip,port",
        }
    }
}

impl SetDef {
    pub fn namespaces(&self) -> &NamespaceScope {
        match self {
            SetDef::Selector { namespaces, .. } | SetDef::NamedPort { namespaces, .. } => {
                namespaces
            }
        }
    }

    pub fn pods(&self) -> &LabelSel {
        match self {
            SetDef::Selector { pods, .. } | SetDef::NamedPort { pods, .. } => pods,
        }
    }

    pub fn set_type(&self) -> SetType {
        match self {
            SetDef::Selector { .. } => SetType::HashNet,
            SetDef::NamedPort { .. } => SetType::HashIpPort,
        }
    }

    /// The selector in Calico's syntax, as felix derives it from a Kubernetes peer:
    /// `(<namespace part>) && (<pod part>)`. Namespace labels carry felix's `pcns.` prefix.
    pub fn selector_string(&self) -> String {
        let ns = match self.namespaces() {
            NamespaceScope::Named(ns) => format!("projectcalico.org/namespace == '{ns}'"),
            NamespaceScope::Selector(sel) if sel.is_everything() => {
                "has(projectcalico.org/namespace)".to_string()
            }
            NamespaceScope::Selector(sel) => selector_terms(sel, "pcns."),
        };
        let mut pods = "projectcalico.org/orchestrator == 'k8s'".to_string();
        if !self.pods().is_everything() {
            pods.push_str(" && ");
            pods.push_str(&selector_terms(self.pods(), ""));
        }
        format!("({ns}) && ({pods})")
    }

    /// felix's `MakeUniqueID`: `s:` + base64url(sha224(`s:` + selector)); named ports use
    /// `n:` over `<selector id>,<proto>,<name>`.
    pub fn id(&self) -> String {
        let selector_id = unique_id("s", &self.selector_string());
        match self {
            SetDef::Selector { .. } => selector_id,
            SetDef::NamedPort {
                protocol,
                port_name,
                ..
            } => unique_id("n", &format!("{selector_id},{protocol},{port_name}")),
        }
    }

    /// Which members a pod contributes to this set (it must already match the set's
    /// selectors). A pod with no port of that name and protocol contributes nothing.
    pub fn members_of(&self, pod: &PodInfo) -> Vec<Member> {
        self.members_from(&pod.ips, &pod.named_ports)
    }

    /// `members_of` for a pod's addresses and named ports held in another form.
    pub fn members_from(&self, ips: &[IpAddr], named_ports: &[NamedPort]) -> Vec<Member> {
        match self {
            SetDef::Selector { .. } => ips.iter().map(|ip| Member::Addr(*ip)).collect(),
            SetDef::NamedPort {
                protocol,
                port_name,
                ..
            } => named_ports
                .iter()
                .filter(|p| p.protocol == *protocol && p.name == *port_name)
                .flat_map(|p| {
                    ips.iter()
                        .map(move |ip| Member::AddrPort(*ip, p.protocol, p.port))
                })
                .collect(),
        }
    }
}

/// `prefix:` + base64url(sha224(`prefix:` + text)), felix's `MakeUniqueID`.
pub(crate) fn unique_id(prefix: &str, text: &str) -> String {
    let digest = Sha224::digest(format!("{prefix}:{text}").as_bytes());
    format!("{prefix}:{}", URL_SAFE_NO_PAD.encode(digest))
}

fn selector_terms(sel: &LabelSel, key_prefix: &str) -> String {
    let quoted = |vals: &BTreeSet<String>| {
        vals.iter()
            .map(|v| format!("'{v}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    sel.exprs()
        .iter()
        .map(|e| match e {
            Expression::Equal(k, v) => format!("{key_prefix}{k} == '{v}'"),
            Expression::NotEqual(k, v) => format!("{key_prefix}{k} != '{v}'"),
            Expression::In(k, vals) => format!("{key_prefix}{k} in {{ {} }}", quoted(vals)),
            Expression::NotIn(k, vals) => {
                format!("{key_prefix}{k} not in {{ {} }}", quoted(vals))
            }
            Expression::Exists(k) => format!("has({key_prefix}{k})"),
            Expression::DoesNotExist(k) => format!("! has({key_prefix}{k})"),
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

/// felix's `NameForMainIPSet`: `cali` + family digit + format version `0` + ID, cut to 31.
pub fn set_name(family: IpFamily, id: &str) -> String {
    let digit = match family {
        IpFamily::V4 => '4',
        IpFamily::V6 => '6',
    };
    let mut name = format!("cali{digit}0{id}");
    name.truncate(MAX_SET_NAME_LEN);
    name
}

/// Whether a kernel set is ours: a main set (`cali40`/`cali60`) or a temporary one
/// (`cali4t`/`cali6t`). Nothing else is ever modified or destroyed.
pub fn is_owned_set(name: &str) -> bool {
    OWNED_SET_PREFIXES.iter().any(|p| name.starts_with(p)) || is_temp_set(name)
}

/// The family of one of our sets, from its name (`cali4…`, `cali6…`); `None` for other names.
pub fn set_family(name: &str) -> Option<IpFamily> {
    if !is_owned_set(name) {
        return None;
    }
    match name.as_bytes().get(4) {
        Some(b'4') => Some(IpFamily::V4),
        Some(b'6') => Some(IpFamily::V6),
        _ => None,
    }
}

/// Whether a kernel set is one of our temporary sets (never desired, always destroyed).
pub fn is_temp_set(name: &str) -> bool {
    TEMP_SET_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// One entry of a set, printed the way `ipset save` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Member {
    /// A pod IP in a `hash:net` set (a host address prints without `/32`).
    Addr(IpAddr),
    /// A pod IP and one of its named ports in a `hash:ip,port` set.
    AddrPort(IpAddr, Protocol, u16),
}

impl Member {
    pub fn family(&self) -> IpFamily {
        match self {
            Member::Addr(ip) | Member::AddrPort(ip, _, _) => IpFamily::of(ip),
        }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Addr(ip) => write!(f, "{ip}"),
            Member::AddrPort(ip, proto, port) => write!(f, "{ip},{proto}:{port}"),
        }
    }
}

/// A set as the kernel should hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    pub name: String,
    pub family: IpFamily,
    pub set_type: SetType,
    pub members: BTreeSet<Member>,
}

impl SetSpec {
    pub fn create_line(&self, max_size: u32) -> String {
        create_line(
            &self.name,
            self.family,
            self.set_type,
            max_size,
            self.members.len(),
        )
    }
}

/// The `hashsize` a set created with `members` members gets: a quarter of them per bucket
/// rounded up to a power of two, between the kernel's minimum (64) and its default (1024).
///
/// Why not the default for every set: the kernel works out a hash set's memory size, which
/// every header read (`ipset list -terse`, our 1.5 s set check's netlink header dump) returns,
/// by visiting each bucket, so the check's cost grows with the sum of the sets' bucket counts,
/// not with their members. Most of our sets hold a handful of pods; at 1024 buckets each,
/// 554 sets of 61k members cost ~570k bucket visits per check (issue 20's idle profile:
/// `hash_net4_head`). The kernel doubles a table when one of its buckets fills, so a set
/// that grows later is never limited by this; and it ignores the table size when `create
/// -exist` meets an existing set (resizing changes it), so a set created by another size
/// stays as it is.
pub fn fitted_hashsize(members: usize) -> u32 {
    const MIN: usize = 64;
    const MAX: usize = 1024;
    members.div_ceil(4).next_power_of_two().clamp(MIN, MAX) as u32
}

/// The `ipset restore` line that creates set `name`, about to receive `members` members, the
/// way we create every set.
pub fn create_line(
    name: &str,
    family: IpFamily,
    set_type: SetType,
    max_size: u32,
    members: usize,
) -> String {
    let family = match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    };
    format!(
        "create {name} {} family {family} hashsize {} maxelem {max_size}",
        set_type.as_str(),
        fitted_hashsize(members)
    )
}

/// `ipset restore` input that creates every set and adds its members, in name order.
pub fn restore_script(sets: &BTreeMap<String, SetSpec>, max_size: u32) -> String {
    let mut out = String::new();
    for set in sets.values() {
        out.push_str(&set.create_line(max_size));
        out.push('\n');
        for m in &set.members {
            out.push_str(&format!("add {} {m}\n", set.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamedPort, ObjectKey};
    use std::collections::BTreeMap;

    fn sel(pairs: &[(&str, &str)]) -> LabelSel {
        LabelSel::from_exprs(
            pairs
                .iter()
                .map(|(k, v)| Expression::Equal(k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn names_fit_the_kernel_and_follow_felix() {
        let def = SetDef::Selector {
            namespaces: NamespaceScope::Named("default".into()),
            pods: sel(&[("hyapp", "client1")]),
        };
        assert_eq!(
            def.selector_string(),
            "(projectcalico.org/namespace == 'default') && (projectcalico.org/orchestrator == 'k8s' && hyapp == 'client1')"
        );
        let id = def.id();
        assert!(id.starts_with("s:") && id.len() == 40, "{id}");
        let v4 = set_name(IpFamily::V4, &id);
        assert_eq!(v4.len(), 31);
        assert!(v4.starts_with("cali40s:"));
        assert!(set_name(IpFamily::V6, &id).starts_with("cali60s:"));
        assert!(is_owned_set(&v4));
        assert!(is_owned_set("cali4t0") && is_temp_set("cali6t12"));
        assert!(!is_temp_set(&v4));
        assert!(!is_owned_set("KUBE-X") && !is_owned_set("cali-x") && !is_owned_set("cali41"));
    }

    #[test]
    fn equivalent_selectors_share_a_set() {
        let a = SetDef::Selector {
            namespaces: NamespaceScope::Selector(sel(&[("b", "2"), ("a", "1")])),
            pods: LabelSel::everything(),
        };
        let b = SetDef::Selector {
            namespaces: NamespaceScope::Selector(sel(&[("a", "1"), ("b", "2")])),
            pods: LabelSel::everything(),
        };
        assert_eq!(a.id(), b.id());
        let c = SetDef::Selector {
            namespaces: NamespaceScope::Selector(sel(&[("a", "1")])),
            pods: LabelSel::everything(),
        };
        assert_ne!(a.id(), c.id());
        let named = SetDef::NamedPort {
            namespaces: NamespaceScope::Selector(sel(&[("a", "1")])),
            pods: LabelSel::everything(),
            protocol: Protocol::Tcp,
            port_name: "http".into(),
        };
        assert!(named.id().starts_with("n:"));
        assert_eq!(named.set_type(), SetType::HashIpPort);
    }

    #[test]
    fn named_port_members_come_from_matching_ports() {
        let pod = PodInfo {
            key: ObjectKey::new("x", "a"),
            uid: None,
            node: None,
            labels: BTreeMap::new(),
            ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
            named_ports: vec![
                NamedPort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 8080,
                },
                NamedPort {
                    name: "http".into(),
                    protocol: Protocol::Udp,
                    port: 53,
                },
            ],
            sandbox_id: None,
        };
        let def = SetDef::NamedPort {
            namespaces: NamespaceScope::Named("x".into()),
            pods: LabelSel::everything(),
            protocol: Protocol::Tcp,
            port_name: "http".into(),
        };
        let members: Vec<String> = def.members_of(&pod).iter().map(|m| m.to_string()).collect();
        assert_eq!(members, ["10.0.0.1,tcp:8080", "fd00::1,tcp:8080"]);
    }

    #[test]
    fn restore_script_creates_then_adds() {
        let set = SetSpec {
            name: "cali40s:abc".into(),
            family: IpFamily::V4,
            set_type: SetType::HashNet,
            members: ["10.0.0.2", "10.0.0.1"]
                .iter()
                .map(|s| Member::Addr(s.parse().unwrap()))
                .collect(),
        };
        let script = restore_script(&BTreeMap::from([(set.name.clone(), set)]), 1024);
        assert_eq!(
            script,
            "create cali40s:abc hash:net family inet hashsize 64 maxelem 1024\nadd cali40s:abc 10.0.0.1\nadd cali40s:abc 10.0.0.2\n"
        );
    }

    #[test]
    fn hashsize_fits_the_members_within_the_kernels_bounds() {
        // The kernel's minimum is 64 buckets: small sets (most of ours) get it.
        assert_eq!(fitted_hashsize(0), 64);
        assert_eq!(fitted_hashsize(256), 64);
        // A quarter of the members per bucket, rounded up to a power of two.
        assert_eq!(fitted_hashsize(257), 128);
        assert_eq!(fitted_hashsize(1000), 256);
        // Never above the default: a big set starts as it always did and the kernel grows it.
        assert_eq!(fitted_hashsize(4096), 1024);
        assert_eq!(fitted_hashsize(1_000_000), 1024);
        assert!(
            create_line("cali40s:x", IpFamily::V6, SetType::HashIpPort, 7, 1000)
                .ends_with("hash:ip,port family inet6 hashsize 256 maxelem 7")
        );
    }
}
