//! What a denied packet is about, in the calculation graph's words: which local pod and
//! direction a chain belongs to and which policies isolate that pod there, and which pod
//! (anywhere in the cluster) holds an address. Pure data and lookups; the calculation loop
//! builds and publishes it (`Attribution`), the deny-log reader reads it.
//!
//! Guarantees: the chain map is rebuilt from the graph's own view of its programmed endpoints
//! (the same function that renders their chains lists the isolating policies), so a line never
//! names policies other than the ones the dropping chain jumps to, as of the last flush. The
//! address map follows every pod event incrementally (O(1) per event, no rescan of the
//! cluster: the pod's addresses before and after its events, both from the graph); an address
//! two pods claim names the last one seen, and a pod's removal only clears addresses still
//! mapped to it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::calc_graph::EndpointView;
use crate::model::{ObjectKey, Tier};
use crate::rules::cluster::cluster_policy_chain;
use crate::rules::{from_workload_chain, policy_chain, to_workload_chain, Direction};

/// The local pod a `cali-tw-`/`cali-fw-` chain belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainOwner {
    pub pod: ObjectKey,
    pub direction: Direction,
    /// The policies isolating the pod in this direction (its chain's jumps), in key order.
    pub policies: Vec<ObjectKey>,
}

/// The ClusterNetworkPolicy a `cali-pi-kcnp...`/`cali-po-kcnp...` chain renders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterChainOwner {
    pub tier: Tier,
    pub name: String,
}

/// Chain name → owner, for every programmed local endpoint, and for every active
/// ClusterNetworkPolicy's chains (their names are length-limited, so a hashed chain name can
/// only be read back through this map).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalChains {
    by_chain: HashMap<String, ChainOwner>,
    cluster: HashMap<String, ClusterChainOwner>,
    /// Policy chain (`cali-pi-`/`cali-po-`) → its NetworkPolicy (flow logs; empty otherwise).
    policies: HashMap<String, ObjectKey>,
}

impl LocalChains {
    pub fn from_views<'a>(views: impl IntoIterator<Item = EndpointView<'a>>) -> LocalChains {
        let mut by_chain = HashMap::new();
        for v in views {
            by_chain.insert(
                to_workload_chain(v.iface),
                ChainOwner {
                    pod: v.key.clone(),
                    direction: Direction::Ingress,
                    policies: v.ingress,
                },
            );
            by_chain.insert(
                from_workload_chain(v.iface),
                ChainOwner {
                    pod: v.key.clone(),
                    direction: Direction::Egress,
                    policies: v.egress,
                },
            );
        }
        LocalChains {
            by_chain,
            cluster: HashMap::new(),
            policies: HashMap::new(),
        }
    }

    /// Adds the chains of these NetworkPolicies, both directions (their names may be hashed,
    /// so only this map reads them back).
    pub fn with_policies(mut self, policies: impl IntoIterator<Item = ObjectKey>) -> LocalChains {
        for p in policies {
            for dir in [Direction::Ingress, Direction::Egress] {
                self.policies
                    .insert(policy_chain(dir, &p.namespace, &p.name), p.clone());
            }
        }
        self
    }

    /// The NetworkPolicy whose chain this is.
    pub fn policy_of_chain(&self, chain: &str) -> Option<&ObjectKey> {
        self.policies.get(chain)
    }

    /// Adds the chains of these ClusterNetworkPolicies (tier, name), both directions.
    pub fn with_cluster_policies<'a>(
        mut self,
        policies: impl IntoIterator<Item = (Tier, &'a str)>,
    ) -> LocalChains {
        for (tier, name) in policies {
            for dir in [Direction::Ingress, Direction::Egress] {
                self.cluster.insert(
                    cluster_policy_chain(dir, name),
                    ClusterChainOwner {
                        tier,
                        name: name.to_string(),
                    },
                );
            }
        }
        self
    }

    pub fn owner(&self, chain: &str) -> Option<&ChainOwner> {
        self.by_chain.get(chain)
    }

    /// The ClusterNetworkPolicy whose chain this is.
    pub fn cluster_owner(&self, chain: &str) -> Option<&ClusterChainOwner> {
        self.cluster.get(chain)
    }

    pub fn len(&self) -> usize {
        self.by_chain.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_chain.is_empty()
    }

    /// The local pods, each once.
    pub fn pods(&self) -> impl Iterator<Item = &ObjectKey> {
        self.by_chain
            .values()
            .filter(|o| o.direction == Direction::Ingress)
            .map(|o| &o.pod)
    }
}

/// Address → pod (`namespace/name`), cluster-wide, kept up to date event by event. Only the
/// address map is kept (a pod's previous addresses come from the graph before its event is
/// applied), each pod's name once: about 20 MB at 150k pods.
#[derive(Clone, Debug, Default)]
pub struct Addresses {
    by_ip: HashMap<IpAddr, Arc<str>>,
}

impl Addresses {
    /// The pod `pod` held `old` and now holds `new` (empty: it is gone or not a workload).
    /// An old address another pod has taken since is left to that pod.
    pub fn set(&mut self, pod: &ObjectKey, old: &[IpAddr], new: &[IpAddr]) {
        let name = format!("{}/{}", pod.namespace, pod.name);
        for ip in old {
            if !new.contains(ip) && self.by_ip.get(ip).is_some_and(|p| **p == *name) {
                self.by_ip.remove(ip);
            }
        }
        let mut shared: Option<Arc<str>> = None;
        for ip in new {
            if self.by_ip.get(ip).is_some_and(|p| **p == *name) {
                continue;
            }
            let value = shared
                .get_or_insert_with(|| Arc::from(name.as_str()))
                .clone();
            self.by_ip.insert(*ip, value);
        }
    }

    /// The pod holding `ip`, as `namespace/name`.
    pub fn pod(&self, ip: &IpAddr) -> Option<&Arc<str>> {
        self.by_ip.get(ip)
    }

    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }
}

/// The shared view: the calculation loop writes, the deny-log reader reads. The chain map is
/// swapped whole (readers hold an `Arc` of the one they looked at); the address map is
/// updated in place under a short write lock per batch of events.
#[derive(Debug, Default)]
pub struct Attribution {
    chains: RwLock<Arc<LocalChains>>,
    addresses: RwLock<Addresses>,
    /// Bumped by every address update: a reader holding lines back for an unknown address
    /// looks again only when this moved.
    address_generation: AtomicU64,
    /// Flow logs only (`with_labels`): each known pod's labels as `key=value`, sorted, for
    /// the records' `source_labels`/`dest_labels`. Empty otherwise: deny logs name pods only,
    /// and at 150k pods the labels are tens of MiB.
    labels: Option<RwLock<HashMap<ObjectKey, Arc<[String]>>>>,
}

impl Attribution {
    /// An attribution that also keeps the pods' labels (flow logs).
    pub fn with_labels() -> Attribution {
        Attribution {
            labels: Some(RwLock::default()),
            ..Attribution::default()
        }
    }

    /// Whether labels are kept (`with_labels`).
    pub fn keeps_labels(&self) -> bool {
        self.labels.is_some()
    }

    /// Sets (or, with `None`, forgets) pods' labels; nothing unless labels are kept.
    pub fn update_labels(
        &self,
        changes: impl IntoIterator<
            Item = (
                ObjectKey,
                Option<std::collections::BTreeMap<String, String>>,
            ),
        >,
    ) {
        let Some(labels) = &self.labels else {
            return;
        };
        let mut labels = labels.write().unwrap_or_else(|p| p.into_inner());
        for (pod, now) in changes {
            match now {
                Some(map) => {
                    let list: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    labels.insert(pod, list.into());
                }
                None => {
                    labels.remove(&pod);
                }
            }
        }
    }

    /// A pod's labels as `key=value`, sorted by key (`None`: unknown, or labels not kept).
    pub fn labels_of(&self, pod: &ObjectKey) -> Option<Arc<[String]>> {
        let labels = self.labels.as_ref()?;
        let labels = labels.read().unwrap_or_else(|p| p.into_inner());
        labels.get(pod).cloned()
    }

    pub fn publish_chains(&self, chains: LocalChains) {
        if let Ok(mut c) = self.chains.write() {
            *c = Arc::new(chains);
        }
    }

    pub fn chains(&self) -> Arc<LocalChains> {
        self.chains
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Applies address changes (pod, old addresses, new addresses), one write lock for all.
    pub fn update_addresses<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a ObjectKey, &'a [IpAddr], &'a [IpAddr])>,
    ) {
        let mut addresses = self.addresses.write().unwrap_or_else(|p| p.into_inner());
        for (pod, old, new) in changes {
            addresses.set(pod, old, new);
        }
        self.address_generation.fetch_add(1, Ordering::Release);
    }

    /// How many address updates were applied so far.
    pub fn address_generation(&self) -> u64 {
        self.address_generation.load(Ordering::Acquire)
    }

    pub fn pod_of(&self, ip: &IpAddr) -> Option<ObjectKey> {
        let addresses = self.addresses.read().unwrap_or_else(|p| p.into_inner());
        let name = addresses.pod(ip)?;
        let (ns, pod) = name.split_once('/')?;
        Some(ObjectKey::new(ns, pod))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ObjectKey {
        let (ns, name) = s.split_once('/').unwrap();
        ObjectKey::new(ns, name)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_follow_pods_and_never_unmap_another_pods_address() {
        fn a_name(a: &Addresses, ip: &str) -> Option<String> {
            a.pod(&ip.parse().unwrap()).map(|p| p.to_string())
        }
        let mut a = Addresses::default();
        a.set(&key("x/a"), &[], &[ip("10.0.0.1"), ip("fd00::1")]);
        assert_eq!(a_name(&a, "fd00::1").as_deref(), Some("x/a"));
        // A new pod takes over the address (the old one is being deleted).
        a.set(&key("x/b"), &[], &[ip("10.0.0.1")]);
        assert_eq!(a_name(&a, "10.0.0.1").as_deref(), Some("x/b"));
        // The old pod going away leaves the new owner alone.
        a.set(&key("x/a"), &[ip("10.0.0.1"), ip("fd00::1")], &[]);
        assert_eq!(a_name(&a, "10.0.0.1").as_deref(), Some("x/b"));
        assert_eq!(a_name(&a, "fd00::1"), None);
        // A changed address moves.
        a.set(&key("x/b"), &[ip("10.0.0.1")], &[ip("10.0.0.2")]);
        assert_eq!(a_name(&a, "10.0.0.1"), None);
        assert_eq!(a_name(&a, "10.0.0.2").as_deref(), Some("x/b"));
        // Unchanged: nothing moves.
        a.set(&key("x/b"), &[ip("10.0.0.2")], &[ip("10.0.0.2")]);
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn chains_name_their_pod_direction_and_policies() {
        let pod = key("x/a");
        let views = vec![EndpointView {
            key: &pod,
            iface: "cali1234567890a",
            ingress: vec![key("x/deny")],
            egress: vec![],
        }];
        let chains = LocalChains::from_views(views);
        let tw = chains.owner("cali-tw-cali1234567890a").unwrap();
        assert_eq!(
            (tw.pod.clone(), tw.direction, tw.policies.clone()),
            (pod.clone(), Direction::Ingress, vec![key("x/deny")])
        );
        let fw = chains.owner("cali-fw-cali1234567890a").unwrap();
        assert_eq!(fw.direction, Direction::Egress);
        assert!(fw.policies.is_empty());
        assert_eq!(chains.pods().collect::<Vec<_>>(), vec![&pod]);
        let shared = Attribution::default();
        shared.publish_chains(chains.clone());
        assert_eq!(*shared.chains(), chains);
        shared.update_addresses([(&pod, &[][..], &[ip("10.0.0.1")][..])]);
        assert_eq!(shared.pod_of(&ip("10.0.0.1")), Some(pod));
    }
}
