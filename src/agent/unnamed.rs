//! Local pods without a host interface: the check that keeps a configuration that does not
//! fit the node's CNI from enforcing nothing in silence.
//!
//! A resolver can answer with a name no interface has (the `calico` scheme computes one for
//! any pod), or with none at all; either way the pod's traffic never meets its chains (it
//! meets the dispatch chains' "Unknown interface" drop if its interface matches a prefix, and
//! nothing of ours if it does not). A pod just created may lack its interface for a moment
//! (the CNI is still wiring it), so a pod counts only once it has been without one for the
//! grace period (`FELIX_INTERFACEGRACEPERIOD`). Then:
//! - one warning per pod, naming the interfaces that do carry its address on this node (host
//!   routes in any table, neighbour entries: `host::wiring`), which is what the operator needs
//!   to set the prefix, scheme or bridge right;
//! - `netpol_local_pods_without_interface` counts such pods;
//! - when *every* local pod with an address is such a pod, the configuration fits nothing on
//!   this node and readiness fails with the reason (the DaemonSet shows the node not ready);
//!   while some pods are enforced, the agent stays ready: one pod without an interface (a
//!   second CNI through Multus, a stuck sandbox) must not take the node's status with it.
//!
//! An interface found once is not looked at again until the pod is named to another one, so a check
//! costs one lookup (`host::iface_probe`, one ioctl) per new pod, not per pod; a pod already
//! reported is looked at again only every [`REPORTED_RETEST`] (a node whose setting fits nothing
//! has every pod so: 1500 pods every 2 s with libc's `if_nametoindex`, a socket opened per name,
//! cost 0.4 % of a core). The caller runs a check only when the graph changed or [`Unnamed::due`]
//! says a test is due, so a node at rest with every interface found does no work at all.
//! [`Unnamed::check`] is pure over what it is given; the caller supplies the clock, the
//! existence test and the node's wiring.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::model::ObjectKey;

#[derive(Debug)]
struct Entry {
    /// The interface the pod was named to, when last checked.
    iface: Option<String>,
    /// Since when it has been without an existing interface (`None`: it has one).
    missing_since: Option<Instant>,
    warned: bool,
    /// When a reported pod's interface is tested again.
    retest_at: Option<Instant>,
}

/// How often a pod already reported without an interface is tested again.
pub const REPORTED_RETEST: Duration = Duration::from_secs(30);

/// A pod past the grace period without an interface, to be reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub pod: ObjectKey,
    pub ips: Vec<IpAddr>,
    pub iface: Option<String>,
}

/// What a report concludes about the configuration, from the names of the interfaces that
/// carry the pod's address (`host::wiring`) and FELIX_INTERFACEPREFIX. When one of them has a
/// configured prefix, the prefix fits this node's CNI and blaming it would send the operator
/// the wrong way: the scheme named that pod otherwise or not at all, which a sandbox being
/// stopped or recreated past the grace period also causes (seen with containerd under
/// emulation), as does a scheme that does not fit.
pub fn conclusion(carrier_names: &[String], prefixes: &[String]) -> String {
    let fitting = carrier_names
        .iter()
        .find(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())));
    match fitting {
        Some(name) => format!(
            "{name} has a configured prefix (FELIX_INTERFACEPREFIX={}), but the naming scheme did not name it for this pod: its sandbox is being stopped or recreated, or its address in the datastore is not yet the new one; if neither, FELIX_INTERFACENAMESCHEME does not fit this node's CNI (docs/install.md: Choosing the configuration for your CNI)",
            prefixes.join(",")
        ),
        None => format!(
            "FELIX_INTERFACEPREFIX={} and the naming scheme do not fit this node's CNI (docs/install.md: Choosing the configuration for your CNI)",
            prefixes.join(",")
        ),
    }
}

/// What one check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Pods newly past the grace period: warn about each once.
    pub newly: Vec<Report>,
    /// Pods past the grace period now.
    pub without: usize,
    /// Local pods with an address.
    pub local: usize,
}

impl Checked {
    /// Every local pod is without an interface: the configuration fits nothing here.
    pub fn fits_nothing(&self) -> bool {
        self.local > 0 && self.without == self.local
    }
}

pub struct Unnamed {
    grace: Duration,
    pods: BTreeMap<ObjectKey, Entry>,
}

impl Unnamed {
    pub fn new(grace: Duration) -> Unnamed {
        Unnamed {
            grace,
            pods: BTreeMap::new(),
        }
    }

    /// `local`: every local pod with an address and the interface it is named to
    /// (`CalcGraph::local_pod_interfaces`); `exists`: whether an interface is on the node.
    pub fn check(
        &mut self,
        now: Instant,
        local: Vec<(ObjectKey, Vec<IpAddr>, Option<String>)>,
        exists: impl Fn(&str) -> bool,
    ) -> Checked {
        let mut seen = BTreeMap::new();
        let mut out = Checked {
            local: local.len(),
            ..Checked::default()
        };
        for (pod, ips, iface) in local {
            let entry = self.pods.remove(&pod).unwrap_or(Entry {
                iface: None,
                missing_since: Some(now),
                warned: false,
                retest_at: None,
            });
            let renamed = entry.iface != iface;
            let found_before = entry.missing_since.is_none() && !renamed;
            let not_due = !renamed && entry.retest_at.is_some_and(|t| now < t);
            let mut entry = Entry {
                warned: entry.warned && !renamed,
                // Named to another interface: a new grace period for the new name.
                missing_since: if renamed {
                    Some(now)
                } else {
                    entry.missing_since.or(Some(now))
                },
                iface: iface.clone(),
                retest_at: entry.retest_at.filter(|_| !renamed),
            };
            if found_before || (!not_due && iface.as_deref().is_some_and(&exists)) {
                entry.missing_since = None;
                entry.warned = false;
                entry.retest_at = None;
            } else if let Some(since) = entry.missing_since {
                if entry.warned && !not_due {
                    entry.retest_at = Some(now + REPORTED_RETEST);
                }
                if now.duration_since(since) >= self.grace {
                    out.without += 1;
                    if !entry.warned {
                        entry.warned = true;
                        entry.retest_at = Some(now + REPORTED_RETEST);
                        out.newly.push(Report {
                            pod: pod.clone(),
                            ips,
                            iface,
                        });
                    }
                }
            }
            seen.insert(pod, entry);
        }
        // Pods gone (deleted, moved, lost their address) are forgotten.
        self.pods = seen;
        out
    }

    /// Whether a check is due although the graph did not change: a pod is still within its
    /// grace period, or a reported one is due to be tested again.
    pub fn due(&self, now: Instant) -> bool {
        self.pods.values().any(|e| {
            e.missing_since.is_some() && (!e.warned || e.retest_at.is_none_or(|t| now >= t))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, iface: Option<&str>) -> (ObjectKey, Vec<IpAddr>, Option<String>) {
        (
            ObjectKey::new("x", name),
            vec!["10.0.0.1".parse().unwrap()],
            iface.map(String::from),
        )
    }

    #[test]
    fn reported_once_after_the_grace_period_and_forgotten_when_fixed() {
        let grace = Duration::from_secs(30);
        let mut u = Unnamed::new(grace);
        let t0 = Instant::now();
        let exists = |i: &str| i == "cali-ok";
        let local = || {
            vec![
                pod("a", Some("cali-ok")),
                pod("b", Some("cali-gone")),
                pod("c", None),
            ]
        };
        let first = u.check(t0, local(), exists);
        assert_eq!((first.without, first.newly.len(), first.local), (0, 0, 3));
        let later = u.check(t0 + grace, local(), exists);
        assert_eq!(later.without, 2);
        let names: Vec<&str> = later.newly.iter().map(|r| r.pod.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert!(!later.fits_nothing());
        // Once each.
        let again = u.check(t0 + grace * 2, local(), exists);
        assert_eq!((again.without, again.newly.len()), (2, 0));
        // b's interface appears; c is deleted: nothing left.
        let fixed = |i: &str| i == "cali-ok" || i == "cali-gone";
        let last = u.check(t0 + grace * 3, local()[..2].to_vec(), fixed);
        assert_eq!((last.without, last.newly.len(), last.local), (0, 0, 2));
    }

    #[test]
    fn found_interfaces_are_not_looked_at_again_unless_renamed() {
        let mut u = Unnamed::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let calls = std::cell::Cell::new(0);
        let exists = |_: &str| {
            calls.set(calls.get() + 1);
            true
        };
        u.check(t0, vec![pod("a", Some("i1"))], exists);
        u.check(t0, vec![pod("a", Some("i1"))], exists);
        assert_eq!(calls.get(), 1);
        u.check(t0, vec![pod("a", Some("i2"))], exists);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn reported_pods_are_tested_again_only_every_retest_period() {
        let grace = Duration::from_secs(5);
        let mut u = Unnamed::new(grace);
        let t0 = Instant::now();
        let calls = std::cell::Cell::new(0);
        let missing = |_: &str| {
            calls.set(calls.get() + 1);
            false
        };
        let local = || vec![pod("a", Some("cali1"))];
        u.check(t0, local(), missing);
        assert!(
            u.due(t0),
            "within its grace period a pod is tested at each check"
        );
        let reported = u.check(t0 + grace, local(), missing);
        assert_eq!((reported.newly.len(), calls.get()), (1, 2));
        // Reported: not tested (and no check due) until the retest period has passed; still
        // counted without an interface meanwhile.
        let t1 = t0 + grace + Duration::from_secs(1);
        assert!(!u.due(t1));
        let quiet = u.check(t1, local(), missing);
        assert_eq!((quiet.without, quiet.newly.len(), calls.get()), (1, 0, 2));
        let t2 = t0 + grace + REPORTED_RETEST;
        assert!(u.due(t2));
        u.check(t2, local(), missing);
        assert_eq!(calls.get(), 3);
        assert!(!u.due(t2));
        // Renamed: tested at once.
        u.check(t2, vec![pod("a", Some("cali9"))], missing);
        assert_eq!(calls.get(), 4);
        // Found: nothing is due any more.
        let found = u.check(t2 + grace, vec![pod("a", Some("cali9"))], |_| true);
        assert_eq!(found.without, 0);
        assert!(!u.due(t2 + grace * 100));
    }

    #[test]
    fn every_pod_without_an_interface_fits_nothing() {
        let grace = Duration::from_secs(5);
        let mut u = Unnamed::new(grace);
        let t0 = Instant::now();
        let local = || vec![pod("a", Some("cali1")), pod("b", Some("cali2"))];
        u.check(t0, local(), |_| false);
        let c = u.check(t0 + grace, local(), |_| false);
        assert!(c.fits_nothing());
        // No local pod at all is not a misfit.
        assert!(!u.check(t0 + grace, vec![], |_| false).fits_nothing());
    }

    #[test]
    fn the_conclusion_blames_the_prefix_only_when_no_carrier_has_it() {
        let prefixes = vec!["cali".to_string(), "veth-".to_string()];
        // Routed through an interface of ours: the prefix fits, the scheme did not name it.
        let own = conclusion(&["eth0".into(), "veth-e18df9a782".into()], &prefixes);
        assert!(
            own.starts_with("veth-e18df9a782 has a configured prefix"),
            "{own}"
        );
        assert!(own.contains("being stopped or recreated"), "{own}");
        assert!(
            own.contains("FELIX_INTERFACENAMESCHEME does not fit"),
            "{own}"
        );
        // Routed through another CNI's interfaces, a bridge, or nothing: the prefix is wrong.
        for names in [vec!["vethbar01".to_string()], vec!["cni0".into()], vec![]] {
            let other = conclusion(&names, &prefixes);
            assert_eq!(
                other,
                "FELIX_INTERFACEPREFIX=cali,veth- and the naming scheme do not fit this node's CNI (docs/install.md: Choosing the configuration for your CNI)"
            );
        }
    }
}
