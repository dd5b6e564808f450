//! The kernel writer for iptables: for one (table, IP family) it owns our `cali-` chains
//! and our rules in the kernel chains (`FORWARD`, `INPUT`, `OUTPUT`), and brings the kernel
//! to the desired state with one `<tool>-restore --noflush --wait` per apply.
//!
//! - `backend`: legacy/nft, the tool names, backend detection, running save and restore.
//! - `parse`: the table model and `iptables-save` parsing.
//! - `plan`: the diff (model + desired → restore operations) and its effect on the model.
//! - this file: `TableWriter`, which keeps a trusted cache of the table (read with one save
//!   when it has none, updated from what it wrote after each successful restore), and
//!   retries with backoff after a failure, re-reading the kernel first.
//!
//! Other programs' chains and rules are never touched: only chains named `cali-…` and rules
//! whose first comment is `cali:<hash>` are ours.

pub mod backend;
pub mod parse;
pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::anyhow;

use crate::backoff::{Backoff, Policy};
use crate::host::exec::Exec;
use crate::model::IpFamily;
use crate::rules::chains::KernelChainRules;
use crate::rules::token::restore_line_problem;
use crate::rules::{Chain, ChainInsertMode};
use crate::telemetry::metrics::IptablesMetrics;

pub use backend::{detect_backend, older_reader_caveat, tool_name, Backend, BackendMode};
pub use parse::{KernelRule, Ownership, TableState};
pub use plan::{Op, Plan};

/// The table the writer programs (netpol-agent only needs filter).
pub const TABLE: &str = "filter";

/// Everything we want in one table of one IP family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredTable {
    /// Our chains by name (every name starts with `cali-`).
    pub chains: BTreeMap<String, Arc<Chain>>,
    /// Our rules in chains we do not own.
    pub kernel: Vec<KernelChainRules>,
    pub insert_mode: ChainInsertMode,
}

impl DesiredTable {
    /// Nothing of ours: applying it removes everything we own.
    pub fn empty() -> DesiredTable {
        DesiredTable {
            chains: BTreeMap::new(),
            kernel: Vec::new(),
            insert_mode: ChainInsertMode::Insert,
        }
    }

    fn validate(&self, ownership: &Ownership) -> anyhow::Result<()> {
        let (prefix, max_len) = (ownership.chain_prefix, ownership.max_chain_len);
        for (name, chain) in &self.chains {
            if *name != chain.name {
                return Err(anyhow!(
                    "chain {} is filed under the name {name}",
                    chain.name
                ));
            }
            if !ownership.owns_chain(name) || name.len() > max_len {
                return Err(anyhow!(
                    "chain name {name:?} must start with {prefix} and have at most {max_len} characters"
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for k in &self.kernel {
            if ownership.owns_chain(&k.chain) {
                return Err(anyhow!("kernel-chain rules for our own chain {}", k.chain));
            }
            if !seen.insert(k.chain.as_str()) {
                return Err(anyhow!("kernel chain {} listed twice", k.chain));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Default, Clone)]
pub struct WriterStats {
    /// Restore invocations (successful or not).
    pub restore_calls: u64,
    pub restore_errors: u64,
    pub save_calls: u64,
    /// Restore lines committed (without the `*table` and `COMMIT` lines).
    pub lines_written: u64,
}

/// Writes one table (filter) of one IP family through one backend.
pub struct TableWriter {
    exec: Exec,
    family: IpFamily,
    backend: Backend,
    ownership: Ownership,
    /// How often and how patiently a failed restore is retried (re-reading in between).
    retry: Policy,
    /// What the kernel holds, as far as we know; `None`: read it before the next diff.
    cache: Option<TableState>,
    /// `--wait` flags the restore tool accepts (probed on first use).
    restore_flags: Option<Vec<String>>,
    stats: WriterStats,
    metrics: IptablesMetrics,
    /// Process ids of the restores run since `take_restore_pids`.
    restore_pids: Vec<u32>,
    /// Called as each try starts (see [`TableWriter::on_each_try`]).
    on_try: Option<TryHook>,
    /// Where chain deletions go: with the updates until a restore of both fails.
    deletions: plan::ChainDeletions,
}

/// What a writer calls as each try of an apply starts.
pub type TryHook = std::sync::Arc<dyn Fn() + Send + Sync>;

impl TableWriter {
    /// A writer of the chains and rules `ownership` says are ours, and nothing else.
    pub fn new(exec: Exec, family: IpFamily, backend: Backend, ownership: Ownership) -> Self {
        TableWriter {
            exec,
            family,
            backend,
            ownership,
            retry: Policy::IPTABLES_RESTORE,
            cache: None,
            restore_flags: None,
            stats: WriterStats::default(),
            metrics: crate::telemetry::metrics::global().iptables(family, TABLE),
            restore_pids: Vec::new(),
            on_try: None,
            deletions: plan::ChainDeletions::WithUpdates,
        }
    }

    /// `hook` runs as each try of an apply starts: the dataplane loop counts it as a turn,
    /// so an agent retrying against a lock someone else holds stays live (every family's
    /// tries together can outlast the watchdog), while a single restore that hangs still
    /// goes stale.
    pub fn on_each_try(&mut self, hook: TryHook) {
        self.on_try = Some(hook);
    }

    pub fn with_retry(mut self, retry: Policy) -> Self {
        self.retry = retry;
        self
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn save_tool(&self) -> String {
        tool_name(self.family, self.backend, "save")
    }

    pub fn restore_tool(&self) -> String {
        tool_name(self.family, self.backend, "restore")
    }

    /// Brings the kernel to `desired`. `dirty`: chains that may have changed since the last
    /// apply (names); kernel-chain rules, and which chains exist, are always checked against
    /// the cache. With no cache (first call, after a failure, or after `invalidate`) it first
    /// reads the kernel with one save and treats everything as dirty. Returns the lines
    /// written.
    ///
    /// On failure (xtables lock held too long, a concurrent writer, a rule the kernel
    /// refuses) it drops the cache, re-reads, recomputes and retries with backoff; after the
    /// last retry it returns the error. A failed restore commits nothing, so the rules of the
    /// previous apply stay in force.
    pub fn apply(
        &mut self,
        desired: &DesiredTable,
        dirty: &BTreeSet<String>,
    ) -> anyhow::Result<usize> {
        desired.validate(&self.ownership)?;
        let mut written = 0;
        let mut backoff = Backoff::new(self.retry);
        let mut attempt = 0;
        loop {
            if let Some(hook) = &self.on_try {
                hook();
            }
            match self.try_apply(desired, dirty, &mut written) {
                Ok(()) => return Ok(written),
                Err(e) => {
                    self.cache = None;
                    let Some(wait) = backoff.next_wait() else {
                        return Err(e.context(format!(
                            "{} {TABLE}: giving up after {} attempts",
                            self.restore_tool(),
                            attempt + 1
                        )));
                    };
                    tracing::warn!(
                        family = ?self.family,
                        backend = self.backend.as_str(),
                        attempt = attempt + 1,
                        "iptables update failed, re-reading and retrying in {wait:?}: {e:#}"
                    );
                    std::thread::sleep(wait);
                    attempt += 1;
                }
            }
        }
    }

    fn try_apply(
        &mut self,
        desired: &DesiredTable,
        dirty: &BTreeSet<String>,
        written: &mut usize,
    ) -> anyhow::Result<()> {
        // The cache is taken out while we work: on any error it stays dropped.
        let (mut state, all_dirty) = match self.cache.take() {
            Some(state) => (state, false),
            None => (self.read_kernel()?, true),
        };
        let plan = plan::plan_table(
            &state,
            desired,
            (!all_dirty).then_some(dirty),
            self.deletions,
        );
        let mut trusted = true;
        for ops in [&plan.main, &plan.deferred] {
            if ops.is_empty() {
                continue;
            }
            if let Err(e) = self.restore(ops) {
                if plan::split_after_failure(self.backend, self.deletions, ops) {
                    // It may have failed for another reason (a lock, a concurrent writer);
                    // splitting costs a restore per chain removal, refusing costs the update.
                    self.deletions = plan::ChainDeletions::Separate;
                    tracing::warn!(
                        family = ?self.family,
                        "{} failed on a transaction that deletes chains beside other updates; chains are deleted in a second transaction from now on (felix's nft way): {e:#}",
                        self.restore_tool()
                    );
                }
                return Err(e);
            }
            *written += ops.len();
            if trusted {
                if let Err(e) = plan::apply_ops(&mut state, ops) {
                    tracing::warn!(
                        "writer model disagrees with its own update ({e}); re-reading next time"
                    );
                    trusted = false;
                }
            }
        }
        if trusted {
            self.export_gauges(&state);
            self.cache = Some(state);
        }
        Ok(())
    }

    /// Forget the cache: the next apply re-reads (the agent calls this on its refresh timer,
    /// IptablesRefreshInterval, and a short while after writes,
    /// IptablesPostWriteCheckIntervalSecs).
    pub fn invalidate(&mut self) {
        self.cache = None;
    }

    /// Removes every chain and kernel-chain rule we own (cleanup), nothing else.
    pub fn remove_all(&mut self) -> anyhow::Result<()> {
        self.invalidate();
        self.apply(&DesiredTable::empty(), &BTreeSet::new())?;
        Ok(())
    }

    /// The process ids of the restores this writer ran since the last call.
    pub fn take_restore_pids(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.restore_pids)
    }

    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// The table as the writer last saw or wrote it, if it trusts that.
    pub fn cached(&self) -> Option<&TableState> {
        self.cache.as_ref()
    }

    fn read_kernel(&mut self) -> anyhow::Result<TableState> {
        self.stats.save_calls += 1;
        self.metrics.save_calls.inc();
        let saved = backend::run_save(&self.exec, &self.save_tool(), Some(TABLE))
            .inspect_err(|_| self.metrics.save_errors.inc())?;
        parse::parse_save(&saved, TABLE, self.ownership)
    }

    /// Our chains and rules in the table as the writer now knows it.
    fn export_gauges(&self, state: &TableState) {
        let (mut chains, mut rules) = (0, 0);
        for (name, chain) in &state.chains {
            if self.ownership.owns_chain(name) {
                chains += 1;
                rules += chain.len();
            } else {
                rules += chain.iter().filter(|r| r.hash.is_some()).count();
            }
        }
        self.metrics.chains.set(chains as i64);
        self.metrics.rules.set(rules as i64);
    }

    fn restore(&mut self, ops: &[Op]) -> anyhow::Result<()> {
        let tool = self.restore_tool();
        let flags = match &self.restore_flags {
            Some(f) => f.clone(),
            None => {
                let f = backend::probe_restore_flags(&self.exec, &tool);
                self.restore_flags = Some(f.clone());
                f
            }
        };
        // The last gate before the kernel: a line that is not made of safe words (see
        // `rules::token`) is refused, never written.
        if let Some((index, why)) = ops
            .iter()
            .enumerate()
            .find_map(|(i, op)| restore_line_problem(&op.line()).map(|why| (i, why)))
        {
            anyhow::bail!(
                "refusing to write an unsafe restore line ({} of {}): {why}",
                index + 1,
                ops.len()
            );
        }
        self.stats.restore_calls += 1;
        self.metrics.restore_calls.inc();
        tracing::debug!(lines = ops.len(), "{tool}");
        tracing::trace!(script = %Plan::script(ops, TABLE), "restore input");
        let pids = &mut self.restore_pids;
        let mut note_pid = |pid| pids.push(pid);
        match backend::run_restore(
            &self.exec,
            &tool,
            &flags,
            TABLE,
            ops.iter().map(Op::line),
            &mut note_pid,
        ) {
            Ok(()) => {
                self.stats.lines_written += ops.len() as u64;
                self.metrics.lines.inc_by(ops.len() as u64);
                Ok(())
            }
            Err(e) => {
                self.stats.restore_errors += 1;
                self.metrics.restore_errors.inc();
                Err(e)
            }
        }
    }
}
