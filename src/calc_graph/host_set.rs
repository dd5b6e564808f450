//! The this-host set (`cali40this-host` / `cali60this-host`, felix's names) of IPVS mode:
//! the node's own addresses, without those on `kube-ipvs0` (the ClusterIPs, which must count
//! as "not this host" so Service traffic is tagged). The addresses come from outside (the
//! agent reads them at the edge and hands them in with `CalcGraph::set_host_addresses`); the
//! set exists only while IPVS support is on, and is emitted as deltas like every other set.
//!
//! Owns: the addresses wanted and the set as last emitted. Invariants: the set is created
//! once, before its first members, and after a flush holds exactly the wanted addresses of
//! its family. It feeds only the `Update`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::IpFamily;
use crate::rules::ipvs::this_host_set;
use crate::rules::sets::{Member, SetSpec, SetType};

use super::update::{FamilyState, SetHeader, Update};

#[derive(Default)]
pub(super) struct HostSet {
    wanted: BTreeSet<IpAddr>,
    /// What the last flush emitted; `None` before the set was created.
    emitted: Option<BTreeSet<IpAddr>>,
}

impl HostSet {
    pub(super) fn set(&mut self, addrs: impl IntoIterator<Item = IpAddr>) {
        self.wanted = addrs.into_iter().collect();
    }

    pub(super) fn addresses(&self) -> &BTreeSet<IpAddr> {
        &self.wanted
    }

    /// Creates the set on the first flush (hash:net: a host address prints without `/32`),
    /// then adds and removes members as the addresses change.
    pub(super) fn flush(&mut self, enabled: bool, families: &[IpFamily], update: &mut Update) {
        if !enabled {
            return;
        }
        let before = match self.emitted.take() {
            Some(b) => b,
            None => {
                for &family in families {
                    update.sets_created.push(SetHeader {
                        name: this_host_set(family),
                        family,
                        set_type: SetType::HashNet,
                    });
                }
                BTreeSet::new()
            }
        };
        for &family in families {
            let of = |s: &BTreeSet<IpAddr>, other: &BTreeSet<IpAddr>| -> BTreeSet<Member> {
                s.difference(other)
                    .filter(|ip| IpFamily::of(ip) == family)
                    .map(|ip| Member::Addr(*ip))
                    .collect()
            };
            let added = of(&self.wanted, &before);
            let removed = of(&before, &self.wanted);
            if !added.is_empty() {
                update.members_added.insert(this_host_set(family), added);
            }
            if !removed.is_empty() {
                update
                    .members_removed
                    .insert(this_host_set(family), removed);
            }
        }
        self.emitted = Some(self.wanted.clone());
    }

    /// Adds the set as of the last flush to a family's snapshot.
    pub(super) fn snapshot(&self, family: IpFamily, state: &mut FamilyState) {
        let Some(emitted) = &self.emitted else {
            return;
        };
        let name = this_host_set(family);
        state.sets.insert(
            name.clone(),
            SetSpec {
                name,
                family,
                set_type: SetType::HashNet,
                members: emitted
                    .iter()
                    .filter(|ip| IpFamily::of(ip) == family)
                    .map(|ip| Member::Addr(*ip))
                    .collect(),
            },
        );
    }
}
