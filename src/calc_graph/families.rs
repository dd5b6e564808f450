//! The families calculator: local pods with addresses of a family the agent does not program
//! (`FELIX_IPV6SUPPORT=false` on a dual-stack node). Their traffic in that family meets no
//! rule of ours, so it is open whatever the policies say.
//!
//! Owns: the programmed families and, per such local pod, its addresses outside them.
//! Invariants: a pod is listed iff it is local and has such an address; kept as pods come and
//! go (O(1) per local pod upsert, nothing per flush) so the agent can refuse readiness naming
//! them instead of staying ready in silence (issue 35). Feeds nothing else in the graph.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::{IpFamily, ObjectKey};

pub(super) struct Families {
    programmed: Vec<IpFamily>,
    outside: BTreeMap<ObjectKey, Vec<IpAddr>>,
}

impl Families {
    pub(super) fn new(programmed: Vec<IpFamily>) -> Families {
        Families {
            programmed,
            outside: BTreeMap::new(),
        }
    }

    /// Records a local pod's addresses (or its leaving: `ips` empty).
    pub(super) fn note_pod(&mut self, key: &ObjectKey, ips: &[IpAddr]) {
        let outside: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| !self.programmed.contains(&IpFamily::of(ip)))
            .collect();
        if outside.is_empty() {
            self.outside.remove(key);
        } else {
            self.outside.insert(key.clone(), outside);
        }
    }

    pub(super) fn outside(&self) -> &BTreeMap<ObjectKey, Vec<IpAddr>> {
        &self.outside
    }
}
