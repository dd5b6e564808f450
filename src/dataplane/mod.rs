//! The node's dataplane: the desired state the calc graph's updates add up to, and applying
//! it to the kernel in the order that never leaves a rule naming a missing set: ipset
//! creations and additions, then iptables (per IP family), then ipset member removals and
//! set destructions. Only what updates marked dirty is looked at, unless a resync asks for
//! everything.
//!
//! - `iptables`: the table writer (plan, parse, backend), generic over the names it owns.
//! - `ipsets`: the IP set writer (the kernel side of `crate::rules::sets`).
//! - `driver`: the dataplane thread: absorbing updates, applying, the refresh and post-write
//!   timers, retries with back-off.
//! - `owned`: reading back what we own from `iptables-save`/`ipset save` text.

pub mod audit;
pub mod driver;
pub mod ipsets;
pub mod iptables;
pub mod owned;
pub mod sentinel;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::debug;

use crate::calc_graph::update::Update;
use crate::dataplane::ipsets::IpsetManager;
use crate::dataplane::iptables::{Backend, DesiredTable, Ownership, TableWriter};
use crate::dataplane::watch::Interest;
use crate::host::exec::Exec;
use crate::model::IpFamily;
use crate::rules::chains::kernel_chain_rules;
use crate::rules::sets::SetSpec;
use crate::rules::RuleConfig;

pub struct DataplaneConfig {
    pub families: Vec<IpFamily>,
    pub rules: RuleConfig,
    pub backend: Backend,
    /// The chains and rules the iptables writer owns (`agent::OWNERSHIP`).
    pub ownership: Ownership,
    /// What the change checks at rest watch (`agent::ours()`).
    pub interest: Interest,
    pub max_set_size: u32,
    pub exec: Exec,
}

/// What one apply did.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    pub iptables_lines: usize,
    /// `ipset restore` lines written.
    pub ipset_lines: u64,
    pub duration: Duration,
    /// Whether anything was dirty at all.
    pub wrote: bool,
    /// The IP sets this apply wrote to (created, changed or destroyed), when it wrote any
    /// `ipset restore` line.
    pub sets_written: BTreeSet<String>,
}

pub struct Dataplane {
    sets: BTreeMap<String, SetSpec>,
    tables: BTreeMap<IpFamily, DesiredTable>,
    ipsets: IpsetManager,
    writers: BTreeMap<IpFamily, TableWriter>,
    backend: Backend,
    dirty_sets: BTreeSet<String>,
    dirty_chains: BTreeMap<IpFamily, BTreeSet<String>>,
    /// Set by a resync: every chain is checked on the next apply.
    check_all: bool,
}

impl Dataplane {
    pub fn new(cfg: &DataplaneConfig) -> anyhow::Result<Dataplane> {
        let mut ipsets = IpsetManager::new(cfg.exec.clone(), cfg.max_set_size);
        ipsets.resync().context("reading the existing IP sets")?;
        let tables = cfg
            .families
            .iter()
            .map(|&f| {
                (
                    f,
                    DesiredTable {
                        chains: BTreeMap::new(),
                        kernel: kernel_chain_rules(&cfg.rules, f),
                        insert_mode: cfg.rules.insert_mode,
                    },
                )
            })
            .collect();
        let writers = cfg
            .families
            .iter()
            .map(|&f| {
                (
                    f,
                    TableWriter::new(cfg.exec.clone(), f, cfg.backend, cfg.ownership),
                )
            })
            .collect();
        // Sets left by an earlier run are checked on the first apply (after the datastore is
        // in sync): reused when still wanted, destroyed when not.
        let dirty_sets = ipsets.cached_names().into_iter().collect();
        Ok(Dataplane {
            sets: BTreeMap::new(),
            tables,
            ipsets,
            writers,
            backend: cfg.backend,
            dirty_sets,
            dirty_chains: BTreeMap::new(),
            check_all: true,
        })
    }

    /// Adds an update to the desired state (several updates coalesce into one apply).
    pub fn absorb(&mut self, update: &Update) {
        for h in &update.sets_created {
            self.sets.insert(
                h.name.clone(),
                SetSpec {
                    name: h.name.clone(),
                    family: h.family,
                    set_type: h.set_type,
                    members: BTreeSet::new(),
                },
            );
            self.dirty_sets.insert(h.name.clone());
        }
        for (name, members) in &update.members_added {
            if let Some(set) = self.sets.get_mut(name) {
                set.members.extend(members.iter().copied());
                self.dirty_sets.insert(name.clone());
            }
        }
        for (name, members) in &update.members_removed {
            if let Some(set) = self.sets.get_mut(name) {
                for m in members {
                    set.members.remove(m);
                }
                self.dirty_sets.insert(name.clone());
            }
        }
        for (_, name) in &update.sets_removed {
            self.sets.remove(name);
            self.dirty_sets.insert(name.clone());
        }
        for (family, chain) in &update.chains_upserted {
            if let Some(t) = self.tables.get_mut(family) {
                t.chains.insert(chain.name.clone(), chain.clone());
                self.dirty_chains
                    .entry(*family)
                    .or_default()
                    .insert(chain.name.clone());
            }
        }
        for (family, name) in &update.chains_removed {
            if let Some(t) = self.tables.get_mut(family) {
                t.chains.remove(name);
                self.dirty_chains
                    .entry(*family)
                    .or_default()
                    .insert(name.clone());
            }
        }
    }

    /// The iptables backend the writers use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The IP families programmed.
    pub fn families(&self) -> Vec<IpFamily> {
        self.writers.keys().copied().collect()
    }

    /// Process ids of the iptables restores run since the last call (every family).
    pub fn take_restore_pids(&mut self) -> Vec<u32> {
        self.writers
            .values_mut()
            .flat_map(|w| w.take_restore_pids())
            .collect()
    }

    pub fn is_dirty(&self) -> bool {
        self.check_all
            || !self.dirty_sets.is_empty()
            || self.dirty_chains.values().any(|c| !c.is_empty())
            // A set the kernel would not destroy yet (nf_tables releases its last reference a
            // moment after the rule goes) is tried again when its back-off is due, not at the
            // next change or refresh, which an idle node may not see for minutes.
            || self.ipsets.destroy_retry_due(std::time::Instant::now())
    }

    /// Re-reads the kernel on the next apply and checks everything (refresh timer).
    pub fn resync(&mut self) -> anyhow::Result<()> {
        self.resync_ipsets()?;
        self.invalidate_iptables();
        Ok(())
    }

    /// Re-reads the IP sets now and checks every set on the next apply (felix's
    /// IpsetsRefreshInterval).
    pub fn resync_ipsets(&mut self) -> anyhow::Result<()> {
        self.ipsets.resync()?;
        self.dirty_sets.extend(self.sets.keys().cloned());
        self.dirty_sets.extend(self.ipsets.cached_names());
        Ok(())
    }

    /// `hook` runs as each try of an iptables update starts, in every family (see
    /// [`TableWriter::on_each_try`]).
    pub fn on_each_try(&mut self, hook: iptables::TryHook) {
        for w in self.writers.values_mut() {
            w.on_each_try(hook.clone());
        }
    }

    /// Re-reads iptables on the next apply (post-write check).
    pub fn invalidate_iptables(&mut self) {
        for w in self.writers.values_mut() {
            w.invalidate();
        }
        self.check_all = true;
    }

    pub fn apply(&mut self) -> anyhow::Result<ApplyReport> {
        let start = Instant::now();
        if !self.is_dirty() {
            return Ok(ApplyReport::default());
        }
        let ipset_lines_before = self.ipsets.stats().lines;
        let dirty_specs: BTreeMap<String, SetSpec> = self
            .dirty_sets
            .iter()
            .filter_map(|n| self.sets.get(n).map(|s| (n.clone(), s.clone())))
            .collect();
        self.ipsets
            .apply_additions(&dirty_specs, &self.dirty_sets)
            .context("ipset additions")?;

        let mut lines = 0;
        for (family, writer) in self.writers.iter_mut() {
            let Some(table) = self.tables.get(family) else {
                continue;
            };
            let dirty = if self.check_all {
                table.chains.keys().cloned().collect()
            } else {
                self.dirty_chains.get(family).cloned().unwrap_or_default()
            };
            lines += writer
                .apply(table, &dirty)
                .with_context(|| format!("iptables ({family:?})"))?;
            self.dirty_chains.remove(family);
        }
        self.check_all = false;

        self.ipsets
            .apply_removals(&dirty_specs, &self.dirty_sets)
            .context("ipset removals")?;
        let ipset_lines = self.ipsets.stats().lines - ipset_lines_before;
        let dirty_sets = std::mem::take(&mut self.dirty_sets);
        let report = ApplyReport {
            iptables_lines: lines,
            ipset_lines,
            duration: start.elapsed(),
            wrote: true,
            sets_written: if ipset_lines > 0 {
                dirty_sets
            } else {
                BTreeSet::new()
            },
        };
        debug!(lines, ms = report.duration.as_secs_f64() * 1e3, "applied");
        Ok(report)
    }
}

/// Removes every chain, kernel-chain rule and IP set netpol-agent owns, and nothing else.
pub fn cleanup(
    exec: &Exec,
    backend: Backend,
    ownership: Ownership,
    families: &[IpFamily],
) -> anyhow::Result<()> {
    for &family in families {
        TableWriter::new(exec.clone(), family, backend, ownership)
            .remove_all()
            .with_context(|| format!("removing our iptables rules ({family:?})"))?;
    }
    let mut ipsets = IpsetManager::new(exec.clone(), crate::rules::sets::DEFAULT_MAX_SET_SIZE);
    ipsets.resync()?;
    ipsets.destroy_all_owned()
}
