//! Local pods with addresses of a family the agent does not program (`FELIX_IPV6SUPPORT=false`
//! on a dual-stack node): their traffic in that family meets no rule of ours, so it is open
//! whatever the policies say. The graph keeps the list as pods come and go (O(1) per local
//! pod upsert, nothing per flush) so the agent can refuse readiness naming them instead of
//! staying ready in silence (issue 35).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::{IpFamily, ObjectKey};

use super::CalcGraph;

impl CalcGraph {
    /// Records a local pod's addresses (or its leaving: `ips` empty).
    pub(super) fn note_pod_families(&mut self, key: &ObjectKey, ips: &[IpAddr]) {
        let outside: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| !self.cfg.families.contains(&IpFamily::of(ip)))
            .collect();
        if outside.is_empty() {
            self.outside_families.remove(key);
        } else {
            self.outside_families.insert(key.clone(), outside);
        }
    }

    /// Local pods with addresses of a family not programmed, with those addresses.
    pub fn pods_outside_families(&self) -> &BTreeMap<ObjectKey, Vec<IpAddr>> {
        &self.outside_families
    }
}
