//! What happened to every task, recorded lock-free by the demo's threads and
//! tallied at the end.
//!
//! One cell of atomics per task (indexed by task index), so recording costs a
//! few uncontended atomic operations and never distorts the lateness being
//! measured.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

const SCHEDULED: u8 = 1;
const CANCELLED: u8 = 1 << 1;
/// Received or acked again after an ack had succeeded.
const DUPLICATE: u8 = 1 << 2;

#[derive(Debug, Default)]
struct TaskCell {
    receipts: AtomicU32,
    acks: AtomicU32,
    flags: AtomicU8,
}

/// Counters that are not per task.
#[derive(Debug, Default)]
pub struct Events {
    /// Cancels planned by producers (paid orders).
    pub cancel_planned: AtomicU64,
    /// Cancels answered `AlreadyDelivered`.
    pub cancel_already_delivered: AtomicU64,
    /// Cancels answered `NotFound` (the task had already fired and been acked).
    pub cancel_not_found: AtomicU64,
    /// Acks refused because the engine shut down or the delivery was stale;
    /// those tasks are delivered again after the restart.
    pub ack_failed: AtomicU64,
    /// Deliveries whose payload differs from what was scheduled.
    pub payload_mismatches: AtomicU64,
    /// Deliveries whose key is not one of this run's.
    pub foreign_keys: AtomicU64,
    /// Deliveries received before their due time.
    pub early: AtomicU64,
}

/// A snapshot of [`Events`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EventTally {
    /// See [`Events::cancel_planned`].
    pub cancel_planned: u64,
    /// See [`Events::cancel_already_delivered`].
    pub cancel_already_delivered: u64,
    /// See [`Events::cancel_not_found`].
    pub cancel_not_found: u64,
    /// See [`Events::ack_failed`].
    pub ack_failed: u64,
    /// See [`Events::payload_mismatches`].
    pub payload_mismatches: u64,
    /// See [`Events::foreign_keys`].
    pub foreign_keys: u64,
    /// See [`Events::early`].
    pub early: u64,
}

impl Events {
    /// Reads every counter.
    pub fn snapshot(&self) -> EventTally {
        EventTally {
            cancel_planned: self.cancel_planned.load(Relaxed),
            cancel_already_delivered: self.cancel_already_delivered.load(Relaxed),
            cancel_not_found: self.cancel_not_found.load(Relaxed),
            ack_failed: self.ack_failed.load(Relaxed),
            payload_mismatches: self.payload_mismatches.load(Relaxed),
            foreign_keys: self.foreign_keys.load(Relaxed),
            early: self.early.load(Relaxed),
        }
    }
}

/// Per-task records plus event counters, shared by every demo thread.
#[derive(Debug)]
pub struct Tracker {
    cells: Vec<TaskCell>,
    resolved: AtomicUsize,
    /// Counters that are not per task.
    pub events: Events,
}

/// The per-task tally at the end of the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Tasks scheduled.
    pub scheduled: u64,
    /// Tasks whose cancel returned `Cancelled`.
    pub cancelled: u64,
    /// Tasks received by a consumer at least once.
    pub delivered: u64,
    /// Tasks acked successfully at least once.
    pub acked: u64,
    /// Scheduled tasks neither cancelled nor received.
    pub lost: u64,
    /// Tasks received or acked again after a successful ack.
    pub duplicates: u64,
    /// Tasks received more than once, the first ack having failed because
    /// the engine shut down (the at-least-once redelivery after a restart).
    pub redelivered: u64,
    /// Tasks cancelled (`Cancelled`) and yet received.
    pub cancelled_then_delivered: u64,
    /// Tasks received but never acked.
    pub unacked: u64,
}

impl Tracker {
    /// A tracker for tasks `0..tasks`.
    pub fn new(tasks: u32) -> Tracker {
        Tracker {
            cells: (0..tasks).map(|_| TaskCell::default()).collect(),
            resolved: AtomicUsize::new(0),
            events: Events::default(),
        }
    }

    /// Tasks finished so far: cancelled, or received and acked.
    pub fn resolved(&self) -> usize {
        self.resolved.load(Relaxed)
    }

    /// Records that the task was scheduled (its `schedule_many` returned Ok).
    pub fn on_scheduled(&self, index: u32) {
        self.cell(index).flags.fetch_or(SCHEDULED, Relaxed);
    }

    /// Records a cancel that returned `Cancelled`.
    pub fn on_cancelled(&self, index: u32) {
        self.cell(index).flags.fetch_or(CANCELLED, Relaxed);
        self.resolved.fetch_add(1, Relaxed);
    }

    /// Records that a consumer received the task.
    pub fn on_receipt(&self, index: u32) {
        let cell = self.cell(index);
        cell.receipts.fetch_add(1, Relaxed);
        if cell.acks.load(Relaxed) > 0 {
            cell.flags.fetch_or(DUPLICATE, Relaxed);
        }
    }

    /// Records a successful ack.
    pub fn on_ack(&self, index: u32) {
        let cell = self.cell(index);
        if cell.acks.fetch_add(1, Relaxed) == 0 {
            self.resolved.fetch_add(1, Relaxed);
        } else {
            cell.flags.fetch_or(DUPLICATE, Relaxed);
        }
    }

    /// Adds one to an event counter.
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Tallies every task. Call once the threads are joined.
    pub fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for cell in &self.cells {
            let flags = cell.flags.load(Relaxed);
            let receipts = cell.receipts.load(Relaxed);
            let acks = cell.acks.load(Relaxed);
            let scheduled = flags & SCHEDULED != 0;
            let cancelled = flags & CANCELLED != 0;
            let duplicate = flags & DUPLICATE != 0;
            t.scheduled += u64::from(scheduled);
            t.cancelled += u64::from(cancelled);
            t.delivered += u64::from(receipts > 0);
            t.acked += u64::from(acks > 0);
            t.lost += u64::from(scheduled && !cancelled && receipts == 0);
            t.duplicates += u64::from(duplicate);
            t.redelivered += u64::from(receipts > 1 && !duplicate);
            t.cancelled_then_delivered += u64::from(cancelled && receipts > 0);
            t.unacked += u64::from(receipts > 0 && acks == 0);
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
        let t = Tracker::new(6);
        (0..6).for_each(|i| t.on_scheduled(i));
        t.on_cancelled(0); // paid in time
        t.on_receipt(1); // delivered and acked
        t.on_ack(1);
        t.on_receipt(2); // ack failed at shutdown, redelivered, acked
        t.on_receipt(2);
        t.on_ack(2);
        t.on_receipt(3); // delivered again after a successful ack
        t.on_ack(3);
        t.on_receipt(3);
        t.on_cancelled(4); // cancelled and yet delivered
        t.on_receipt(4);
        // 5: lost
        let tally = t.tally();
        assert_eq!(tally.scheduled, 6);
        assert_eq!(tally.cancelled, 2);
        assert_eq!(tally.delivered, 4);
        assert_eq!(tally.acked, 3);
        assert_eq!(tally.lost, 1);
        assert_eq!(tally.duplicates, 1);
        assert_eq!(tally.redelivered, 1);
        assert_eq!(tally.cancelled_then_delivered, 1);
        assert_eq!(tally.unacked, 1);
        assert_eq!(t.resolved(), 5);
    }
}
