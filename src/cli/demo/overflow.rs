//! Payloads on disk during a demo run. With `--horizon` the main thread takes
//! a checkpoint every half horizon, so that the payloads of tasks not due
//! within the horizon move to overflow files; with or without it, it watches
//! how many payloads are on disk and counts those read back. At each
//! shutdown it also adds up the engine's running totals (`Stats`), which the
//! report checks against what the run's own threads saw.

use super::context::Context;
use anyhow::Context as _;
use kairos::Engine;
use std::time::{Duration, Instant};

/// Shortest period between two of the demo's checkpoints.
const CHECKPOINT_EVERY_MIN: Duration = Duration::from_millis(10);

/// How often the demo takes a checkpoint for a payload window of `horizon`:
/// every half horizon (at least [`CHECKPOINT_EVERY_MIN`]), so that a task
/// scheduled more than 1.5 horizons ahead has its payload moved to disk
/// before it comes due.
pub fn checkpoint_every(horizon: Duration) -> Duration {
    (horizon / 2).max(CHECKPOINT_EVERY_MIN)
}

/// What the run saw of the payloads on disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct OverflowFindings {
    /// Checkpoints the demo took that were written (the engine's own
    /// background ones are not counted).
    pub checkpoints: u64,
    /// Payloads those checkpoints moved to overflow files (compaction
    /// included).
    pub payloads_moved: u64,
    /// The largest `Stats::payloads_on_disk` sampled.
    pub payloads_on_disk_max: u64,
    /// Payloads read back from overflow files: `Stats::payloads_read_back`
    /// summed over the engine generations.
    pub promoted: u64,
}

/// The engine's own running totals (`Stats::deliveries`, `acks`, `nacks`,
/// `retries`, `lease_expiries`, `tasks_dead_lettered`), summed over the
/// engine generations: each starts at 0 at its open and is read once its
/// `shutdown()` has returned (no consumer receives, acks or nacks any more,
/// so the figures are final).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineTotals {
    /// `Stats::deliveries`: receipts by a consumer.
    pub deliveries: u64,
    /// `Stats::acks`.
    pub acks: u64,
    /// `Stats::nacks`.
    pub nacks: u64,
    /// `Stats::retries`: failed attempts (nacks and lease expiries)
    /// followed by another attempt.
    pub retries: u64,
    /// `Stats::lease_expiries`: leases the engine ended by the clock (not
    /// those the restart ended).
    pub lease_expiries: u64,
    /// `Stats::tasks_dead_lettered` (not those dead-lettered by the reopen).
    pub dead_lettered: u64,
}

/// Takes the demo's checkpoints and samples the engine's payload figures;
/// driven by the main thread between its polls. Adds up the engine's
/// totals at each shutdown.
#[derive(Debug)]
pub struct Watch {
    every: Option<Duration>,
    next: Instant,
    findings: OverflowFindings,
    totals: EngineTotals,
}

impl Watch {
    /// A watch taking a checkpoint every `every`, or none (`None`).
    pub fn new(every: Option<Duration>) -> Watch {
        Watch {
            every,
            next: Instant::now() + every.unwrap_or_default(),
            findings: OverflowFindings::default(),
            totals: EngineTotals::default(),
        }
    }

    /// Takes a checkpoint if one is due, and samples the payloads on disk.
    /// Does nothing during the restart (no engine). A failed checkpoint is
    /// an unexpected error: it ends the run.
    pub fn tick(&mut self, ctx: &Context) -> anyhow::Result<()> {
        let Some(engine) = ctx.cell.current() else {
            return Ok(());
        };
        if let Some(every) = self.every {
            if Instant::now() >= self.next {
                let report = engine.checkpoint().context("checkpoint failed")?;
                if report.written {
                    self.findings.checkpoints += 1;
                    self.findings.payloads_moved += report.payloads_moved;
                }
                self.next = Instant::now() + every;
            }
        }
        self.sample(&engine);
        Ok(())
    }

    /// Counts the read-backs and the totals of an engine generation once
    /// its `shutdown()` has returned (the prefetcher is stopped and no
    /// consumer receives any more, so the counts are final).
    pub fn on_shutdown(&mut self, engine: &Engine) {
        self.sample(engine);
        let stats = engine.stats();
        self.findings.promoted += stats.payloads_read_back;
        let t = &mut self.totals;
        t.deliveries += stats.deliveries;
        t.acks += stats.acks;
        t.nacks += stats.nacks;
        t.retries += stats.retries;
        t.lease_expiries += stats.lease_expiries;
        t.dead_lettered += stats.tasks_dead_lettered;
    }

    /// The engine's totals over the generations shut down so far.
    pub fn engine_totals(&self) -> EngineTotals {
        self.totals
    }

    /// What the watch found.
    pub fn findings(&self) -> OverflowFindings {
        self.findings
    }

    fn sample(&mut self, engine: &Engine) {
        let on_disk = engine.stats().payloads_on_disk as u64;
        let max = &mut self.findings.payloads_on_disk_max;
        *max = (*max).max(on_disk);
    }
}
