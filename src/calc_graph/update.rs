//! The complete desired state of one node (per IP family: our sets with their members, our
//! chains), and the `Update` deltas the calc graph emits to move it. Applying every update in
//! order to an empty state gives the same state as compiling the final objects from scratch;
//! the property tests hold the calc graph to that.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::model::IpFamily;
use crate::rules::chains::kernel_chain_rules;
use crate::rules::render::restore_script;
use crate::rules::sets::{Member, SetSpec, SetType};
use crate::rules::{Chain, RuleConfig};

/// What one IP family of a node must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyState {
    pub sets: BTreeMap<String, SetSpec>,
    /// Shared with the calc graph's record of what it emitted (a chain is not copied on its
    /// way to the dataplane).
    pub chains: BTreeMap<String, Arc<Chain>>,
}

/// One family's desired state as restore scripts, rendered by [`FamilyState::restore_scripts`]:
/// the one place objects become script text for `compile`, `audit`, the benches, the fuzz
/// targets and the tests (the agent itself writes deltas, never whole scripts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreScripts {
    /// `ipset restore` input: every set created, then its members.
    pub ipsets: String,
    /// `iptables-restore --noflush` input for the filter table: our chains, then our rules
    /// in the kernel's chains as `cfg.insert_mode` places them.
    pub iptables: String,
}

impl FamilyState {
    pub fn restore_scripts(
        &self,
        cfg: &RuleConfig,
        family: IpFamily,
        max_set_size: u32,
    ) -> RestoreScripts {
        RestoreScripts {
            ipsets: crate::rules::sets::restore_script(&self.sets, max_set_size),
            iptables: restore_script(
                &self.chains,
                &kernel_chain_rules(cfg, family),
                cfg.insert_mode,
            ),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub families: BTreeMap<IpFamily, FamilyState>,
}

/// A set to create (its members arrive as additions in the same update).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SetHeader {
    pub name: String,
    pub family: IpFamily,
    pub set_type: SetType,
}

/// Deltas from one flush of the calc graph. Within an update, order matters to the writer,
/// not to the content: sets created, members added, chains written, chains removed, members
/// removed, sets removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub sets_created: Vec<SetHeader>,
    pub members_added: BTreeMap<String, BTreeSet<Member>>,
    pub members_removed: BTreeMap<String, BTreeSet<Member>>,
    pub sets_removed: Vec<(IpFamily, String)>,
    pub chains_upserted: Vec<(IpFamily, Arc<Chain>)>,
    pub chains_removed: Vec<(IpFamily, String)>,
}

impl Update {
    pub fn is_empty(&self) -> bool {
        self.sets_created.is_empty()
            && self.members_added.is_empty()
            && self.members_removed.is_empty()
            && self.sets_removed.is_empty()
            && self.chains_upserted.is_empty()
            && self.chains_removed.is_empty()
    }

    /// Number of individual changes (members, sets, chains): the size of the update.
    pub fn len(&self) -> usize {
        self.sets_created.len()
            + self
                .members_added
                .values()
                .map(BTreeSet::len)
                .sum::<usize>()
            + self
                .members_removed
                .values()
                .map(BTreeSet::len)
                .sum::<usize>()
            + self.sets_removed.len()
            + self.chains_upserted.len()
            + self.chains_removed.len()
    }
}

impl DesiredState {
    /// Applies an update. Panics only on an internal inconsistency (a member added to a set
    /// that was never created), which the tests are there to catch.
    pub fn apply(&mut self, update: &Update) {
        for header in &update.sets_created {
            let fam = self.families.entry(header.family).or_default();
            fam.sets.insert(
                header.name.clone(),
                SetSpec {
                    name: header.name.clone(),
                    family: header.family,
                    set_type: header.set_type,
                    members: BTreeSet::new(),
                },
            );
        }
        for (name, members) in &update.members_added {
            let set = self.set_mut(name);
            set.members.extend(members.iter().copied());
        }
        for (name, members) in &update.members_removed {
            let set = self.set_mut(name);
            for m in members {
                set.members.remove(m);
            }
        }
        for (family, chain) in &update.chains_upserted {
            self.families
                .entry(*family)
                .or_default()
                .chains
                .insert(chain.name.clone(), chain.clone());
        }
        for (family, name) in &update.chains_removed {
            if let Some(fam) = self.families.get_mut(family) {
                fam.chains.remove(name);
            }
        }
        for (family, name) in &update.sets_removed {
            if let Some(fam) = self.families.get_mut(family) {
                fam.sets.remove(name);
            }
        }
    }

    fn set_mut(&mut self, name: &str) -> &mut SetSpec {
        self.families
            .values_mut()
            .find_map(|f| f.sets.get_mut(name))
            .unwrap_or_else(|| panic!("update touches set {name} that was never created"))
    }
}
