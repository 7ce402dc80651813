//! What happened to every task, recorded lock-free by the demo's threads and
//! tallied at the end.
//!
//! One cell of atomics per task (indexed by task index), so recording costs a
//! few uncontended atomic operations and never distorts the lateness being
//! measured. The deliveries of one task are serialized by the engine (a task
//! is delivered again only after its previous delivery was nacked, its lease
//! expired, or the engine restarted), so a receipt can read what the previous
//! one left in the cell.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

const SCHEDULED: u16 = 1;
/// A cancel answered `Cancelled`.
const CANCELLED: u16 = 1 << 1;
/// A cancel answered `AlreadyDelivered`: cancelled while a consumer held it.
const CANCEL_IN_FLIGHT: u16 = 1 << 2;
/// Dead-lettered (seen through a nack, or among the engine's dead letters).
const DEAD: u16 = 1 << 3;
/// Finished: cancelled (either answer), acked or dead-lettered.
const RESOLVED: u16 = 1 << 4;
/// A delivery that repeats an attempt number already received, or a receipt
/// or an ack after a successful ack.
const DUPLICATE: u16 = 1 << 5;

/// In [`TaskCell::last`]: the latest delivery's nack was sent (cleared if
/// the nack was refused).
const LAST_NACKED: u32 = 1;
/// In [`TaskCell::last`]: the latest delivery's ack or nack was refused
/// because its lease had expired.
const LAST_EXPIRED: u32 = 1 << 1;
/// [`TaskCell::last`] holds the attempt above this shift, the generation
/// between it and the two flag bits.
const LAST_ATTEMPT_SHIFT: u32 = 16;
const LAST_GENERATION_MASK: u32 = (1 << LAST_ATTEMPT_SHIFT) - 4;

#[derive(Debug, Default)]
struct TaskCell {
    receipts: AtomicU32,
    acks: AtomicU32,
    /// Bit `n - 1` once attempt `n` was received (attempts past 32 share bit 31).
    attempts_seen: AtomicU32,
    /// The latest receipt: attempt (capped at 65 535) << 16 | generation << 2
    /// | [`LAST_EXPIRED`] | [`LAST_NACKED`]; 0 before the first.
    last: AtomicU32,
    /// `Cancelled { deliveries }` or `AlreadyDelivered { attempt }`.
    cancel_mark: AtomicU32,
    /// The attempt whose ack or nack was refused because its engine had shut
    /// down (0: none).
    refused_closed: AtomicU32,
    flags: AtomicU16,
}

/// How a redelivery (attempt > 1) came about, judged from the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The previous attempt was nacked.
    Nack,
    /// The previous attempt's lease expired: its ack was refused for that, or
    /// it was neither nacked nor interrupted by a restart.
    Lease,
    /// The previous attempt was received before the restart and not nacked.
    Restart,
    /// The previous receipt was not the previous attempt.
    Gap,
}

/// Counters that are not per task.
#[derive(Debug, Default)]
pub struct Events {
    /// Cancels planned by producers (paid orders).
    pub cancel_planned: AtomicU64,
    /// Cancels answered `AlreadyDelivered` (a consumer held the task).
    pub cancel_in_flight: AtomicU64,
    /// Cancels answered `NotFound` (the task had already finished).
    pub cancel_not_found: AtomicU64,
    /// Acks and nacks refused because the engine had shut down.
    pub refused_closed: AtomicU64,
    /// Acks and nacks refused because the delivery's lease had expired.
    pub refused_lease_expired: AtomicU64,
    /// Acks and nacks refused as not outstanding (stale).
    pub refused_stale: AtomicU64,
    /// Nacks the engine took (any outcome).
    pub nacked: AtomicU64,
    /// Of those, answered `Retry`: another attempt follows.
    pub retried: AtomicU64,
    /// Of those, answered `Finished`: the task was cancelled while held.
    pub nack_finished: AtomicU64,
    /// Deliveries the "crashing" consumer took and never answered.
    pub crashed_holding: AtomicU64,
    /// Deliveries with attempt > 1.
    pub redelivered: AtomicU64,
    /// Of those, after a nack of the previous attempt.
    pub redelivered_after_nack: AtomicU64,
    /// Of those, after the previous attempt's lease expired.
    pub redelivered_after_lease: AtomicU64,
    /// Of those, after the restart ended the previous attempt's lease.
    pub redelivered_after_restart: AtomicU64,
    /// Of those, whose previous receipt was not the previous attempt: an
    /// attempt counted that no consumer received.
    pub attempt_gaps: AtomicU64,
    /// Deliveries, and dead letters at the end, whose payload differs from
    /// what was scheduled.
    pub payload_mismatches: AtomicU64,
    /// Deliveries whose key is not one of this run's.
    pub foreign_keys: AtomicU64,
    /// Deliveries received before their due time.
    pub early: AtomicU64,
}

/// A snapshot of [`Events`]; see there for each field.
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct EventTally {
    pub cancel_planned: u64,
    pub cancel_in_flight: u64,
    pub cancel_not_found: u64,
    pub refused_closed: u64,
    pub refused_lease_expired: u64,
    pub refused_stale: u64,
    pub nacked: u64,
    pub retried: u64,
    pub nack_finished: u64,
    pub crashed_holding: u64,
    pub redelivered: u64,
    pub redelivered_after_nack: u64,
    pub redelivered_after_lease: u64,
    pub redelivered_after_restart: u64,
    pub attempt_gaps: u64,
    pub payload_mismatches: u64,
    pub foreign_keys: u64,
    pub early: u64,
}

impl Events {
    /// Reads every counter.
    pub fn snapshot(&self) -> EventTally {
        let get = |c: &AtomicU64| c.load(Relaxed);
        EventTally {
            cancel_planned: get(&self.cancel_planned),
            cancel_in_flight: get(&self.cancel_in_flight),
            cancel_not_found: get(&self.cancel_not_found),
            refused_closed: get(&self.refused_closed),
            refused_lease_expired: get(&self.refused_lease_expired),
            refused_stale: get(&self.refused_stale),
            nacked: get(&self.nacked),
            retried: get(&self.retried),
            nack_finished: get(&self.nack_finished),
            crashed_holding: get(&self.crashed_holding),
            redelivered: get(&self.redelivered),
            redelivered_after_nack: get(&self.redelivered_after_nack),
            redelivered_after_lease: get(&self.redelivered_after_lease),
            redelivered_after_restart: get(&self.redelivered_after_restart),
            attempt_gaps: get(&self.attempt_gaps),
            payload_mismatches: get(&self.payload_mismatches),
            foreign_keys: get(&self.foreign_keys),
            early: get(&self.early),
        }
    }
}

/// Why an ack or nack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The engine had shut down (the restart).
    Closed,
    /// The delivery's lease had expired.
    LeaseExpired,
    /// Not outstanding (already finished, or from another engine).
    Stale,
}

/// Per-task records plus event counters, shared by every demo thread.
#[derive(Debug)]
pub struct Tracker {
    cells: Vec<TaskCell>,
    resolved: AtomicUsize,
    dead: AtomicUsize,
    /// Counters that are not per task.
    pub events: Events,
}

/// The per-task tally at the end of the run. Every scheduled task ends in
/// exactly one of `cancelled`, `acked`, `dead_lettered`, `abandoned`,
/// `lost` and `unacked`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Tasks scheduled.
    pub scheduled: u64,
    /// Tasks whose cancel returned `Cancelled`.
    pub cancelled: u64,
    /// Tasks received by a consumer at least once.
    pub delivered: u64,
    /// Tasks acked successfully.
    pub acked: u64,
    /// Tasks dead-lettered.
    pub dead_lettered: u64,
    /// Of those, tasks that were not planned to fail every attempt.
    pub dead_lettered_unplanned: u64,
    /// Tasks cancelled while a consumer held them (`AlreadyDelivered`) and
    /// not acked by that consumer: finished by the cancel.
    pub abandoned: u64,
    /// Of those, tasks whose holder's ack or nack was refused because the
    /// engine had shut down: still counted by the engine at the shutdown,
    /// but not recovered (their cancel is in the log).
    pub abandoned_at_shutdown: u64,
    /// Scheduled tasks never received and not finished.
    pub lost: u64,
    /// Tasks received but not finished.
    pub unacked: u64,
    /// Tasks received with an attempt number already received, or received
    /// or acked again after a successful ack.
    pub duplicates: u64,
    /// Tasks received after a cancel that promised no further delivery:
    /// more deliveries than `Cancelled { deliveries }` reported, or an
    /// attempt above the one `AlreadyDelivered { attempt }` reported.
    pub cancelled_then_delivered: u64,
    /// Deliveries whose lease was seen expiring: redeliveries caused by an
    /// expiry, and refused acks or nacks (lease expired) that no receipt
    /// followed.
    pub lease_expired: u64,
}

impl Tracker {
    /// A tracker for tasks `0..tasks`.
    pub fn new(tasks: u32) -> Tracker {
        Tracker {
            cells: (0..tasks).map(|_| TaskCell::default()).collect(),
            resolved: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            events: Events::default(),
        }
    }

    /// Tasks finished so far: cancelled, acked or dead-lettered.
    pub fn resolved(&self) -> usize {
        self.resolved.load(Relaxed)
    }

    /// Tasks known to be dead-lettered so far.
    pub fn dead_lettered(&self) -> usize {
        self.dead.load(Relaxed)
    }

    /// Records that the task was scheduled (its `schedule_many` returned Ok).
    pub fn on_scheduled(&self, index: u32) {
        self.cell(index).flags.fetch_or(SCHEDULED, Relaxed);
    }

    /// Records a cancel that returned `Cancelled { deliveries }`.
    pub fn on_cancelled(&self, index: u32, deliveries: u32) {
        let cell = self.cell(index);
        cell.cancel_mark.store(deliveries, Relaxed);
        cell.flags.fetch_or(CANCELLED, Relaxed);
        self.resolve(cell);
    }

    /// Records a cancel that returned `AlreadyDelivered { attempt }`: no
    /// retry or redelivery follows, so the task is finished.
    pub fn on_cancel_in_flight(&self, index: u32, attempt: u32) {
        let cell = self.cell(index);
        cell.cancel_mark.store(attempt, Relaxed);
        cell.flags.fetch_or(CANCEL_IN_FLIGHT, Relaxed);
        Self::count(&self.events.cancel_in_flight);
        self.resolve(cell);
    }

    /// Records that a consumer of engine generation `generation` received
    /// attempt `attempt` of the task, and classifies a redelivery.
    pub fn on_receipt(&self, index: u32, attempt: u32, generation: u32) {
        let cell = self.cell(index);
        cell.receipts.fetch_add(1, Relaxed);
        let bit = 1u32 << (attempt.clamp(1, 32) - 1);
        let repeated = cell.attempts_seen.fetch_or(bit, Relaxed) & bit != 0;
        let duplicate = repeated || cell.acks.load(Relaxed) > 0;
        if duplicate {
            cell.flags.fetch_or(DUPLICATE, Relaxed);
        }
        let now = (attempt.min(0xFFFF) << LAST_ATTEMPT_SHIFT)
            | ((generation << 2) & LAST_GENERATION_MASK);
        let previous = cell.last.swap(now, Relaxed);
        if attempt <= 1 {
            return;
        }
        let e = &self.events;
        Self::count(&e.redelivered);
        if duplicate {
            return; // counted as such
        }
        let counter = match Self::cause(previous, attempt, generation) {
            Cause::Nack => &e.redelivered_after_nack,
            Cause::Lease => &e.redelivered_after_lease,
            Cause::Restart => &e.redelivered_after_restart,
            Cause::Gap => &e.attempt_gaps,
        };
        Self::count(counter);
    }

    fn cause(previous: u32, attempt: u32, generation: u32) -> Cause {
        let previous_attempt = previous >> LAST_ATTEMPT_SHIFT;
        let previous_generation = (previous & LAST_GENERATION_MASK) >> 2;
        if previous_attempt + 1 != attempt.min(0xFFFF) {
            Cause::Gap
        } else if previous & LAST_NACKED != 0 {
            Cause::Nack
        } else if previous & LAST_EXPIRED != 0
            || previous_generation == ((generation << 2) & LAST_GENERATION_MASK) >> 2
        {
            Cause::Lease
        } else {
            Cause::Restart
        }
    }

    /// Records that a nack of the task's latest delivery is about to be
    /// sent (before the call, so that the next receipt, which the nack
    /// makes possible, always sees it).
    pub fn on_nack_sent(&self, index: u32) {
        self.cell(index).last.fetch_or(LAST_NACKED, Relaxed);
    }

    /// Records a nack the engine took: `Retry` (`retry`), dead letter
    /// (`dead`), or neither (`Finished`: cancelled while held).
    pub fn on_nacked(&self, index: u32, retry: bool, dead: bool) {
        let e = &self.events;
        Self::count(&e.nacked);
        if retry {
            Self::count(&e.retried);
        } else if dead {
            self.on_dead_lettered(index);
        } else {
            Self::count(&e.nack_finished);
        }
    }

    /// Records that the ack or nack of attempt `attempt` was refused.
    pub fn on_refused(&self, index: u32, attempt: u32, why: Refusal) {
        let cell = self.cell(index);
        cell.last.fetch_and(!LAST_NACKED, Relaxed);
        let e = &self.events;
        match why {
            Refusal::Closed => {
                cell.refused_closed.store(attempt, Relaxed);
                Self::count(&e.refused_closed);
            }
            Refusal::LeaseExpired => {
                cell.last.fetch_or(LAST_EXPIRED, Relaxed);
                Self::count(&e.refused_lease_expired);
            }
            Refusal::Stale => Self::count(&e.refused_stale),
        }
    }

    /// Records a successful ack.
    pub fn on_ack(&self, index: u32) {
        let cell = self.cell(index);
        if cell.acks.fetch_add(1, Relaxed) == 0 {
            self.resolve(cell);
        } else {
            cell.flags.fetch_or(DUPLICATE, Relaxed);
        }
    }

    /// Records that the task is a dead letter (idempotent).
    pub fn on_dead_lettered(&self, index: u32) {
        let cell = self.cell(index);
        if cell.flags.fetch_or(DEAD, Relaxed) & DEAD == 0 {
            self.dead.fetch_add(1, Relaxed);
            self.resolve(cell);
        }
    }

    /// Adds one to an event counter.
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    fn resolve(&self, cell: &TaskCell) {
        if cell.flags.fetch_or(RESOLVED, Relaxed) & RESOLVED == 0 {
            self.resolved.fetch_add(1, Relaxed);
        }
    }

    /// Tallies every task; `poison(index)` says whether a task was planned
    /// to fail every attempt. Call once the threads are joined.
    pub fn tally(&self, poison: impl Fn(u32) -> bool) -> Tally {
        let mut t = Tally {
            lease_expired: self.events.redelivered_after_lease.load(Relaxed),
            ..Tally::default()
        };
        for (index, cell) in (0u32..).zip(&self.cells) {
            let flags = cell.flags.load(Relaxed);
            let has = |flag: u16| flags & flag != 0;
            let receipts = cell.receipts.load(Relaxed);
            let acked = cell.acks.load(Relaxed) > 0;
            let mark = cell.cancel_mark.load(Relaxed);
            let max_attempt = 32 - cell.attempts_seen.load(Relaxed).leading_zeros();
            let finished = has(RESOLVED);
            t.scheduled += u64::from(has(SCHEDULED));
            t.cancelled += u64::from(has(CANCELLED));
            t.delivered += u64::from(receipts > 0);
            t.acked += u64::from(acked);
            t.dead_lettered += u64::from(has(DEAD));
            t.dead_lettered_unplanned += u64::from(has(DEAD) && !poison(index));
            let abandoned = has(CANCEL_IN_FLIGHT) && !acked;
            t.abandoned += u64::from(abandoned);
            t.abandoned_at_shutdown +=
                u64::from(abandoned && cell.refused_closed.load(Relaxed) == mark);
            t.lost += u64::from(has(SCHEDULED) && !finished && receipts == 0);
            t.unacked += u64::from(receipts > 0 && !finished);
            t.duplicates += u64::from(has(DUPLICATE));
            t.cancelled_then_delivered += u64::from(
                (has(CANCELLED) && (receipts > mark || max_attempt > mark))
                    || (has(CANCEL_IN_FLIGHT) && max_attempt > mark),
            );
            // A refusal for an expired lease that no receipt followed.
            t.lease_expired += u64::from(cell.last.load(Relaxed) & LAST_EXPIRED != 0);
        }
        t
    }

    fn cell(&self, index: u32) -> &TaskCell {
        // Indices come from `Workload::index_of` or the producers' ranges,
        // both bounded by the task count the tracker was built with.
        &self.cells[index as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_classifies_each_fate() {
        let t = Tracker::new(10);
        (0..10).for_each(|i| t.on_scheduled(i));
        t.on_cancelled(0, 0); // paid in time
        t.on_receipt(1, 1, 1); // delivered and acked
        t.on_ack(1);
        t.on_receipt(2, 1, 1); // ack refused at shutdown, redelivered, acked
        t.on_refused(2, 1, Refusal::Closed);
        t.on_receipt(2, 2, 2);
        t.on_ack(2);
        t.on_receipt(3, 1, 1); // delivered again after a successful ack
        t.on_ack(3);
        t.on_receipt(3, 2, 1);
        t.on_receipt(4, 1, 1); // nacked, then cancelled while waiting: fine
        t.on_nack_sent(4);
        t.on_nacked(4, true, false);
        t.on_cancelled(4, 1);
        t.on_cancelled(5, 0); // cancelled and yet delivered
        t.on_receipt(5, 1, 1);
        // 6: lost
        t.on_receipt(7, 1, 1); // poison: nacked until dead
        t.on_nack_sent(7);
        t.on_nacked(7, true, false);
        t.on_receipt(7, 2, 1);
        t.on_nack_sent(7);
        t.on_nacked(7, false, true);
        t.on_receipt(8, 1, 1); // held by a crashed consumer: lease expiry
        t.on_receipt(8, 2, 1);
        t.on_cancel_in_flight(8, 2); // then cancelled while held, never acked
        t.on_receipt(9, 1, 1); // received, never finished
        let tally = t.tally(|i| i == 7);
        assert_eq!(tally.scheduled, 10);
        assert_eq!(tally.cancelled, 3);
        assert_eq!(tally.delivered, 8);
        assert_eq!(tally.acked, 3);
        assert_eq!(tally.dead_lettered, 1);
        assert_eq!(tally.dead_lettered_unplanned, 0);
        assert_eq!(tally.abandoned, 1);
        assert_eq!(tally.abandoned_at_shutdown, 0);
        assert_eq!(tally.lost, 1);
        assert_eq!(tally.unacked, 1);
        assert_eq!(tally.duplicates, 1);
        assert_eq!(tally.cancelled_then_delivered, 1);
        assert_eq!(tally.lease_expired, 1);
        let e = t.events.snapshot();
        assert_eq!(e.redelivered, 4);
        assert_eq!(e.redelivered_after_restart, 1);
        assert_eq!(e.redelivered_after_nack, 1);
        assert_eq!(e.redelivered_after_lease, 1);
        assert_eq!(e.attempt_gaps, 0);
        assert_eq!((e.nacked, e.retried), (3, 2));
        assert_eq!(t.resolved(), 8);
        assert_eq!(t.dead_lettered(), 1);
    }

    #[test]
    fn a_repeated_attempt_is_a_duplicate_and_a_skipped_one_a_gap() {
        let t = Tracker::new(3);
        t.on_scheduled(0);
        t.on_receipt(0, 1, 1);
        t.on_receipt(0, 1, 1); // the same attempt twice
        t.on_receipt(1, 1, 1);
        t.on_receipt(1, 3, 2); // attempt 2 never received
        t.on_receipt(2, 1, 1); // ack refused: lease expired; redelivered after the restart
        t.on_refused(2, 1, Refusal::LeaseExpired);
        t.on_receipt(2, 2, 2);
        let e = t.events.snapshot();
        assert_eq!(t.tally(|_| false).duplicates, 1);
        assert_eq!(e.attempt_gaps, 1);
        assert_eq!(e.redelivered_after_lease, 1);
        assert_eq!(e.redelivered_after_restart, 0);
    }

    #[test]
    fn a_cancel_in_flight_refused_at_shutdown_is_abandoned_there() {
        let t = Tracker::new(1);
        t.on_scheduled(0);
        t.on_receipt(0, 1, 1);
        t.on_cancel_in_flight(0, 1);
        t.on_refused(0, 1, Refusal::Closed);
        let tally = t.tally(|_| false);
        assert_eq!((tally.abandoned, tally.abandoned_at_shutdown), (1, 1));
        assert_eq!(
            (tally.lost, tally.unacked, tally.cancelled_then_delivered),
            (0, 0, 0)
        );
    }
}
