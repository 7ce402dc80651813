//! The demo's findings: the JSON report, the readable summary, and the
//! invariants that decide the exit status.

use super::consumers::Sample;
use serde::Serialize;

/// Lateness of deliveries that fell due while an engine was open: receipt
/// wall time − due time, in ms with µs resolution.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Lateness {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Deliveries measured.
    pub samples: usize,
    /// Deliveries left out: due during the restart gap, or redeliveries.
    pub excluded: usize,
}

impl Lateness {
    /// Lateness over the samples that fell due while an engine was open:
    /// first deliveries of generation 1, and first deliveries of later
    /// generations due after `reopened_at_ms` (the reopen returned).
    pub fn measure(samples: &[Sample], reopened_at_ms: u64) -> Lateness {
        let mut late_us: Vec<i64> = samples
            .iter()
            .filter(|s| s.attempt == 1 && (s.generation == 1 || s.due_ms >= reopened_at_ms))
            .map(|s| s.received_us as i64 - (s.due_ms as i64).saturating_mul(1000))
            .collect();
        late_us.sort_unstable();
        Lateness {
            p50: percentile_ms(&late_us, 0.50),
            p99: percentile_ms(&late_us, 0.99),
            p999: percentile_ms(&late_us, 0.999),
            max: late_us.last().map_or(0.0, |&us| us_to_ms(us)),
            samples: late_us.len(),
            excluded: samples.len() - late_us.len(),
        }
    }
}

/// Nearest-rank percentile of sorted µs values, in ms; 0 if empty.
fn percentile_ms(sorted_us: &[i64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted_us.len() as f64).ceil() as usize;
    us_to_ms(sorted_us[rank.clamp(1, sorted_us.len()) - 1])
}

/// µs as ms, rounded to the µs.
fn us_to_ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

/// Everything the demo reports; serialized as the `--json` object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Tasks the run was asked to schedule.
    pub tasks: u32,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// `sync`, `interval` or `buffered`.
    pub durability: String,
    /// Background sync period under `interval`, ms.
    pub interval_ms: Option<u64>,
    /// The data directory.
    pub dir: String,
    /// The workload seed (rerun with `--seed` to repeat the mix).
    pub seed: u64,
    /// Log segment roll size, bytes.
    pub segment_bytes: u64,
    /// Producer threads.
    pub producers: usize,
    /// Tasks per `schedule_many`.
    pub batch: usize,
    /// Receiver threads per generation.
    pub consumers: usize,
    /// Acker threads per generation.
    pub ackers: usize,
    /// Lease of each delivery, ms.
    pub lease_ms: u64,
    /// Deliveries a task gets before it is dead-lettered.
    pub max_attempts: u32,
    /// Retry delay of each nack, ms.
    pub retry_ms: u64,
    /// Deliveries the crashing consumer was to hold.
    pub crash_holding: usize,
    /// Wall time of the whole run, ms.
    pub elapsed_ms: u64,

    /// Tasks scheduled.
    pub scheduled: u64,
    /// Time from start until the last producer finished, ms.
    pub schedule_ms: u64,
    /// Time during which at least one `schedule_many` call was running, ms.
    pub schedule_busy_ms: u64,
    /// `scheduled / schedule_busy_ms`: tasks per second of time spent inside
    /// `schedule_many` calls. Unpaced (`--rate 0`), the saturated throughput.
    pub schedule_per_sec: f64,
    /// Orders arriving per second, or null for as fast as possible.
    pub rate: Option<f64>,
    /// Cancels planned (paid orders).
    pub cancel_planned: u64,
    /// Cancels that returned `Cancelled`.
    pub cancelled: u64,
    /// Cancels that came too late: `AlreadyDelivered` or `NotFound`.
    pub cancel_too_late: u64,
    /// Of those, `AlreadyDelivered`: a consumer held the task; no retry or
    /// redelivery follows, the consumer may still ack it.
    pub cancel_in_flight: u64,
    /// Of those, `NotFound` (already finished).
    pub cancel_not_found: u64,
    /// Unique tasks a consumer received (at least once). A task nacked and
    /// then cancelled while waiting for its retry counts here and in
    /// `cancelled` too, so `delivered + cancelled` can exceed `scheduled`.
    pub delivered: u64,
    /// Unique tasks acked.
    pub acked: u64,
    /// Tasks dead-lettered (all attempts failed).
    pub dead_lettered: u64,
    /// Of those, tasks not planned to fail every attempt (a lease expiry or
    /// the restart used up their attempts); expected 0, a warning otherwise.
    pub dead_lettered_unplanned: u64,
    /// Dead letters in the engine at the end (`kairos dead-letters list DIR`).
    pub dead_letters_kept: u64,
    /// Tasks cancelled while a consumer held them and not acked by it.
    pub abandoned: u64,
    /// Deliveries received (all attempts).
    pub receipts: u64,
    /// Deliveries with attempt > 1: the sum of the three `redelivered_after_*`
    /// and `attempt_gaps`.
    pub redelivered: u64,
    /// Of those, after the previous attempt was nacked.
    pub redelivered_after_nack: u64,
    /// Of those, after the previous attempt's lease expired.
    pub redelivered_after_lease: u64,
    /// Of those, after the restart ended the previous attempt's lease (its
    /// ack or nack was refused at shutdown, or it was never answered).
    pub redelivered_after_restart: u64,
    /// Nacks the engine took.
    pub nacked: u64,
    /// Of those, answered `Retry`.
    pub retried: u64,
    /// Of those, answered `Finished` (the task was cancelled while held).
    pub nack_finished: u64,
    /// Leases seen expiring: redeliveries after an expiry, plus acks or nacks
    /// refused for an expired lease that no redelivery followed.
    pub lease_expired: u64,
    /// Deliveries the crashing consumer took and never answered.
    pub crashed_holding: u64,
    /// Acks and nacks refused; the sum of the three `ack_refused_*`.
    pub ack_refused: u64,
    /// Of those, because the engine had shut down (the restart).
    pub ack_refused_closed: u64,
    /// Of those, because the lease had expired.
    pub ack_refused_lease_expired: u64,
    /// Of those, as not outstanding.
    pub ack_refused_stale: u64,
    /// Scheduled tasks never received and not finished (cancelled, acked,
    /// dead-lettered, or cancelled in flight).
    pub lost: u64,
    /// Tasks with an attempt number delivered twice, or received or acked
    /// again after a successful ack. A redelivery after a nack, a lease
    /// expiry or the restart carries the next attempt number: no duplicate.
    pub duplicates: u64,
    /// Redeliveries whose previous receipt was not the previous attempt (an
    /// attempt was counted that no consumer received).
    pub attempt_gaps: u64,
    /// Tasks received after a cancel that promised no further delivery:
    /// more deliveries than `Cancelled { deliveries }` reported, or a later
    /// attempt than `AlreadyDelivered { attempt }`.
    pub cancelled_then_delivered: u64,
    /// Deliveries received before their due time.
    pub early: u64,
    /// Tasks received but not finished at the end.
    pub unacked: u64,
    /// Deliveries, and dead letters kept at the end, whose payload was not
    /// the one scheduled.
    pub payload_mismatches: u64,
    /// Deliveries with a key this run never scheduled.
    pub foreign_keys: u64,
    /// Lateness of deliveries due while an engine was open.
    pub lateness_ms: Lateness,

    /// When the restart began, ms after the start.
    pub restart_at_ms: u64,
    /// `engine.shutdown()` duration, ms.
    pub shutdown_ms: u64,
    /// Pause between shutdown and reopen, ms.
    pub downtime_ms: u64,
    /// `Engine::open` duration (recovery), ms.
    pub reopen_ms: u64,
    /// Live tasks (scheduled, ready, in flight) in the engine's stats once
    /// `shutdown()` returned: the state the log was closed with.
    pub pending_at_shutdown: u64,
    /// Of those, tasks cancelled in a consumer's hands whose ack was refused
    /// at the shutdown: finished, so not recovered.
    pub abandoned_at_shutdown: u64,
    /// `engine.recovery().pending` after the reopen.
    pub recovered_pending: u64,
    /// Deliveries in flight at the shutdown on their last attempt,
    /// dead-lettered at the reopen (`engine.recovery().dead_lettered`).
    pub recovered_dead_lettered: u64,
    /// Recovered tasks that fell due during the downtime.
    pub recovered_overdue: u64,
    /// Recovered tasks in flight at the shutdown (delivered, not answered):
    /// delivered again, attempt + 1.
    pub recovered_redelivered: u64,
    /// Log records replayed at the reopen.
    pub recovered_records: u64,
    /// Whether the log ended with a clean-close marker.
    pub recovered_clean_shutdown: bool,
    /// A torn tail found at the reopen (there should be none after a clean
    /// shutdown), as `file@offset (N bytes)`.
    pub recovered_torn_tail: Option<String>,
    /// Live tasks left when the run ended.
    pub pending_at_end: u64,

    /// `--horizon`, ms, or null if not given.
    pub horizon_ms: Option<u64>,
    /// The engine's `Config::payload_window`, ms (the horizon, or the
    /// engine's default), or null if payloads stay in memory.
    pub payload_window_ms: Option<u64>,
    /// How often the demo took a checkpoint, ms (half the horizon), or null
    /// (no `--horizon`: only the engine's own checkpoints).
    pub checkpoint_every_ms: Option<u64>,
    /// Checkpoints the demo took and wrote (the engine's own background
    /// checkpoints are not counted).
    pub checkpoints: u64,
    /// Payloads those checkpoints moved to overflow files (out of memory,
    /// or out of older overflow files being compacted).
    pub payloads_moved: u64,
    /// The most live tasks seen with their payload on disk
    /// (`Stats::payloads_on_disk`, sampled every poll and at each shutdown).
    pub payloads_on_disk_max: u64,
    /// Payloads read back from overflow files, by the prefetcher or by a
    /// consumer: `Stats::payloads_read_back` summed over both engine
    /// generations, each read once its `shutdown()` returned.
    pub overflow_promoted: u64,
    /// The engine's own count of deliveries (`Stats::deliveries`, summed
    /// over both engine generations, each read once its `shutdown()`
    /// returned): must equal `receipts`.
    pub engine_deliveries: u64,
    /// `Stats::acks`, summed likewise: deliveries acked (a task cancelled in
    /// the consumer's hands and acked by it included).
    pub engine_acks: u64,
    /// `Stats::nacks`, summed likewise: must equal `nacked`.
    pub engine_nacks: u64,
    /// `Stats::retries`, summed likewise: nacks and lease expiries followed
    /// by another attempt.
    pub engine_retries: u64,
    /// `Stats::lease_expiries`, summed likewise: leases the engine ended by
    /// the clock (those the restart ended are not counted).
    pub engine_lease_expiries: u64,
    /// `Stats::tasks_dead_lettered`, summed likewise; with
    /// `recovered_dead_lettered`, must equal `dead_letters_kept` (the demo
    /// neither requeues nor purges a dead letter).
    pub engine_dead_lettered: u64,
    /// Whether the run gave up waiting for every task to resolve.
    pub timed_out: bool,

    /// The p99 lateness bound checked, ms.
    pub max_p99_ms: f64,
    /// Whether a p99 above the bound fails the run (`--max-p99-ms` given)
    /// or only warns (the default: lateness depends on the machine's load).
    pub p99_is_gate: bool,
    /// Whether every invariant held.
    pub ok: bool,
    /// The invariants that broke, in words.
    pub violations: Vec<String>,
    /// Figures outside their aim that do not fail the run, in words.
    pub warnings: Vec<String>,
}

impl Report {
    /// Checks the invariants and fills `ok` and `violations`.
    pub fn judge(&mut self) {
        let mut v = Vec::new();
        let zero = [
            ("lost", self.lost),
            ("duplicates", self.duplicates),
            ("attempt_gaps", self.attempt_gaps),
            ("cancelled_then_delivered", self.cancelled_then_delivered),
            ("early", self.early),
            ("unacked", self.unacked),
            ("payload_mismatches", self.payload_mismatches),
            ("foreign_keys", self.foreign_keys),
            ("pending_at_end", self.pending_at_end),
        ];
        for (name, value) in zero {
            if value != 0 {
                v.push(format!("{name} = {value}, expected 0"));
            }
        }
        if self.scheduled != u64::from(self.tasks) {
            v.push(format!(
                "scheduled {} of {} tasks",
                self.scheduled, self.tasks
            ));
        }
        let expected = self
            .pending_at_shutdown
            .saturating_sub(self.abandoned_at_shutdown + self.recovered_dead_lettered);
        if self.recovered_pending != expected {
            v.push(format!(
                "recovered_pending {} != pending_at_shutdown {} - abandoned_at_shutdown {} \
                 - recovered_dead_lettered {}",
                self.recovered_pending,
                self.pending_at_shutdown,
                self.abandoned_at_shutdown,
                self.recovered_dead_lettered
            ));
        }
        if self.dead_letters_kept != self.dead_lettered {
            v.push(format!(
                "the engine keeps {} dead letters, the run saw {} tasks dead-lettered",
                self.dead_letters_kept, self.dead_lettered
            ));
        }
        // The engine's own totals against what the run's threads saw.
        if self.engine_deliveries != self.receipts {
            v.push(format!(
                "the engine counted {} deliveries (Stats::deliveries), its consumers received {}",
                self.engine_deliveries, self.receipts
            ));
        }
        if self.engine_nacks != self.nacked {
            v.push(format!(
                "the engine counted {} nacks (Stats::nacks), it took {} from the consumers",
                self.engine_nacks, self.nacked
            ));
        }
        if self.engine_dead_lettered + self.recovered_dead_lettered != self.dead_letters_kept {
            v.push(format!(
                "the engine keeps {} dead letters, its totals dead-lettered {} \
                 (Stats::tasks_dead_lettered) and the reopen {}",
                self.dead_letters_kept, self.engine_dead_lettered, self.recovered_dead_lettered
            ));
        }
        if !self.recovered_clean_shutdown {
            v.push("the reopen did not find a clean shutdown".into());
        }
        if let Some(torn) = &self.recovered_torn_tail {
            v.push(format!(
                "the reopen found a torn tail after a clean shutdown: {torn}"
            ));
        }
        let mut warnings = Vec::new();
        if self.lateness_ms.p99 > self.max_p99_ms {
            let text = format!(
                "p99 lateness {:.3} ms exceeds {} ms",
                self.lateness_ms.p99, self.max_p99_ms
            );
            if self.p99_is_gate {
                v.push(text);
            } else {
                warnings.push(
                    text + " (is the machine busy? pass --max-p99-ms to make it fail the run)",
                );
            }
        }
        if self.dead_lettered_unplanned > 0 {
            warnings.push(format!(
                "{} tasks not planned to fail were dead-lettered: a lease expiry or the restart \
                 used up their attempts (is the machine busy? see --lease-ms)",
                self.dead_lettered_unplanned
            ));
        }
        self.warnings = warnings;
        if self.timed_out {
            v.push("timed out before every task was delivered or cancelled".into());
        }
        self.ok = v.is_empty();
        self.violations = v;
    }

    /// The readable summary, for a terminal (lines ending in newlines).
    pub fn summary(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_summary(&mut text);
        text
    }

    /// Writes [`Report::summary`] to `out`.
    fn write_summary(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        let secs = |ms: u64| ms as f64 / 1000.0;
        writeln!(
            out,
            "Kairos demo: {} order timeouts, time scale {}x (30 days -> {}), durability {}{}",
            self.tasks,
            self.time_scale,
            span_text(30.0 * 86_400.0 / self.time_scale),
            self.durability,
            self.interval_ms
                .map_or(String::new(), |ms| format!(" ({ms} ms)")),
        )?;
        writeln!(
            out,
            "  data directory   {} (segments of {} bytes, seed {})",
            self.dir, self.segment_bytes, self.seed
        )?;
        writeln!(
            out,
            "  scheduled        {} in {:.2} s, {} producers in batches of {}{}: {:.0} tasks/s while scheduling",
            self.scheduled,
            secs(self.schedule_ms),
            self.producers,
            self.batch,
            self.rate.map_or(String::new(), |r| format!(", arriving at {r:.0}/s")),
            self.schedule_per_sec,
        )?;
        writeln!(
            out,
            "  paid (cancelled) {} of {} planned; {} too late ({} in a consumer's hands, {} already finished)",
            self.cancelled,
            self.cancel_planned,
            self.cancel_too_late,
            self.cancel_in_flight,
            self.cancel_not_found
        )?;
        writeln!(
            out,
            "  delivered        {} tasks, {} acked, {} dead-lettered, {} abandoned (cancelled in a consumer's hands)",
            self.delivered, self.acked, self.dead_lettered, self.abandoned
        )?;
        writeln!(
            out,
            "  retries          {} nacks ({} retried); {} deliveries with attempt > 1: {} after a nack, {} after a lease expiry, {} after the restart",
            self.nacked,
            self.retried,
            self.redelivered,
            self.redelivered_after_nack,
            self.redelivered_after_lease,
            self.redelivered_after_restart
        )?;
        writeln!(
            out,
            "  leases           {} ms; {} expired; a consumer crashed holding {}",
            self.lease_ms, self.lease_expired, self.crashed_holding
        )?;
        writeln!(
            out,
            "  engine totals    {} deliveries, {} acks, {} nacks, {} lease expiries, {} retries, {} dead-lettered (Stats, both opens)",
            self.engine_deliveries,
            self.engine_acks,
            self.engine_nacks,
            self.engine_lease_expiries,
            self.engine_retries,
            self.engine_dead_lettered
        )?;
        if self.dead_letters_kept > 0 {
            writeln!(
                out,
                "  dead letters     {} kept: kairos dead-letters list {}",
                self.dead_letters_kept, self.dir
            )?;
        }
        self.write_restart(out)?;
        self.write_overflow(out)?;
        let l = &self.lateness_ms;
        writeln!(
            out,
            "  lateness         p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms ({} deliveries; {} due during the restart or redelivered, not counted)",
            l.p50, l.p99, l.p999, l.max, l.samples, l.excluded
        )?;
        writeln!(
            out,
            "  invariants       lost {}, unacked {}, duplicates {}, attempt gaps {}, cancelled-then-delivered {}, early {}",
            self.lost,
            self.unacked,
            self.duplicates,
            self.attempt_gaps,
            self.cancelled_then_delivered,
            self.early
        )?;
        writeln!(out, "  elapsed          {:.1} s", secs(self.elapsed_ms))?;
        self.write_verdict(out)
    }

    fn write_restart(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        writeln!(
            out,
            "  restart          at {:.1} s: shutdown {} ms, down {} ms, reopen {} ms ({} records replayed, clean shutdown: {})",
            self.restart_at_ms as f64 / 1000.0,
            self.shutdown_ms,
            self.downtime_ms,
            self.reopen_ms,
            self.recovered_records,
            if self.recovered_clean_shutdown { "yes" } else { "no" }
        )?;
        writeln!(
            out,
            "                   {} pending at shutdown ({} abandoned), {} recovered ({} overdue, {} in flight: redelivered), {} dead-lettered at the reopen",
            self.pending_at_shutdown,
            self.abandoned_at_shutdown,
            self.recovered_pending,
            self.recovered_overdue,
            self.recovered_redelivered,
            self.recovered_dead_lettered
        )
    }

    fn write_overflow(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        let secs = |ms: u64| ms as f64 / 1000.0;
        let window = match (self.horizon_ms, self.payload_window_ms) {
            (Some(ms), _) => format!("horizon {} s", secs(ms)),
            (None, Some(ms)) => format!("payload window {} s (the engine's default)", secs(ms)),
            (None, None) => "payloads kept in memory".to_string(),
        };
        let checkpoints = self.checkpoint_every_ms.map_or(String::new(), |ms| {
            format!(
                ": {} checkpoints (every {} s) moved {} payloads to disk",
                self.checkpoints,
                secs(ms),
                self.payloads_moved
            )
        });
        writeln!(
            out,
            "  overflow         {window}{checkpoints}; at most {} on disk at once, {} read back",
            self.payloads_on_disk_max, self.overflow_promoted
        )
    }

    fn write_verdict(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        if self.ok {
            writeln!(
                out,
                "OK: every task was cancelled, acked or dead-lettered; no attempt delivered twice, none early"
            )?;
        } else {
            writeln!(out, "FAILED:")?;
            for v in &self.violations {
                writeln!(out, "  - {v}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(due_ms: u64, late_us: u64, attempt: u32, generation: u32) -> Sample {
        Sample {
            due_ms,
            received_us: due_ms * 1000 + late_us,
            attempt,
            generation,
        }
    }

    #[test]
    fn lateness_leaves_out_the_restart_gap_and_redeliveries() {
        let samples = [
            sample(1_000, 1_000, 1, 1),
            sample(1_001, 2_000, 1, 1),
            sample(1_500, 900_000, 1, 2), // due during the gap
            sample(1_002, 950_000, 2, 2), // redelivered
            sample(2_000, 3_000, 1, 2),
        ];
        let l = Lateness::measure(&samples, 1_900);
        assert_eq!(l.samples, 3);
        assert_eq!(l.excluded, 2);
        assert_eq!(l.p50, 2.0);
        assert_eq!(l.max, 3.0);
    }

    #[test]
    fn judge_flags_each_broken_invariant() {
        let mut r = Report {
            tasks: 10,
            scheduled: 10,
            recovered_clean_shutdown: true,
            max_p99_ms: 5.0,
            ..Report::default()
        };
        r.judge();
        assert!(r.ok, "{:?}", r.violations);
        r.lost = 1;
        r.recovered_pending = 3;
        r.judge();
        assert!(!r.ok);
        assert_eq!(r.violations.len(), 2);
    }

    #[test]
    fn judge_checks_the_engine_totals_against_the_run() {
        let agreeing = Report {
            tasks: 10,
            scheduled: 10,
            recovered_clean_shutdown: true,
            max_p99_ms: 5.0,
            receipts: 14,
            engine_deliveries: 14,
            nacked: 3,
            engine_nacks: 3,
            dead_lettered: 2,
            dead_letters_kept: 2,
            engine_dead_lettered: 1,
            recovered_dead_lettered: 1,
            ..Report::default()
        };
        let mut r = agreeing.clone();
        r.judge();
        assert!(r.ok, "{:?}", r.violations);
        for (broken, what) in [
            (
                Report {
                    engine_deliveries: 13,
                    ..agreeing.clone()
                },
                "deliveries",
            ),
            (
                Report {
                    engine_nacks: 4,
                    ..agreeing.clone()
                },
                "nacks",
            ),
            (
                Report {
                    engine_dead_lettered: 2,
                    ..agreeing.clone()
                },
                "dead letters",
            ),
        ] {
            let mut r = broken;
            r.judge();
            assert_eq!(r.violations.len(), 1, "{what}: {:?}", r.violations);
            assert!(r.violations[0].contains(what), "{what}: {:?}", r.violations);
        }
    }
}

/// A span of `secs` seconds in a unit that shows it: seconds with one decimal from 1 s up,
/// milliseconds below (`--time-scale 1e8` makes 30 days last 26 ms, which `0.0 s` hid).
fn span_text(secs: f64) -> String {
    if secs >= 0.95 {
        format!("{secs:.1} s")
    } else if secs >= 0.000_95 {
        format!("{:.1} ms", secs * 1000.0)
    } else {
        format!("{:.1} µs", secs * 1_000_000.0)
    }
}

#[cfg(test)]
mod span_tests {
    use super::span_text;

    #[test]
    fn spans_print_in_a_unit_that_shows_them() {
        assert_eq!(span_text(30.0), "30.0 s");
        assert_eq!(span_text(1.3), "1.3 s");
        assert_eq!(span_text(0.025_92), "25.9 ms");
        assert_eq!(span_text(0.002_592), "2.6 ms");
        assert_eq!(span_text(0.000_5), "500.0 µs");
    }
}
