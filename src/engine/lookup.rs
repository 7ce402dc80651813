//! Looking a live task up by its key ([`Engine::lookup`]): where it stands
//! without changing anything.

use super::{Engine, Shared, Status};
use crate::error::LookupError;
use crate::task::{TaskId, TaskState};
use std::time::SystemTime;

/// What [`Engine::lookup`] reports about a live task: its id, due time,
/// state and how many deliveries it has had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// The engine-assigned id ([`Engine::schedule`] returned it).
    pub id: TaskId,
    /// When it is (or was) due, UTC milliseconds since the Unix epoch: the
    /// due time of its first attempt, or of its next attempt after a nack
    /// or an expired lease; after a reschedule, the new one.
    pub due_ms: u64,
    /// [`TaskState::Scheduled`] (waiting for its due time, or due and about
    /// to be handed out), [`TaskState::Ready`] (handed out, waiting for a
    /// consumer) or [`TaskState::Leased`] (a consumer holds it). Never
    /// [`TaskState::Abandoned`]: a task cancelled while held no longer owns
    /// its key.
    pub state: TaskState,
    /// Deliveries consumers have received so far: 0 until a consumer first
    /// receives it (also while [`TaskState::Ready`]); while
    /// [`TaskState::Leased`], the attempt the holder has. The same count a
    /// cancel would report in [`crate::CancelOutcome::Cancelled`].
    pub deliveries: u32,
}

impl TaskInfo {
    /// [`TaskInfo::due_ms`] as a `SystemTime`.
    pub fn due(&self) -> SystemTime {
        crate::clock::ms_to_system_time(self.due_ms)
    }
}

impl Engine {
    /// The live task with `key`, if any: its id, due time, state and
    /// deliveries ([`TaskInfo`]). Changes nothing: a task due beyond
    /// [`crate::Config::far_span`] stays in its overflow file. `None` for a
    /// key no live task has — never scheduled, cancelled (also while a
    /// consumer held it), finished, dead-lettered — and for the empty key.
    /// A key longer than `Config::key_bytes_max` is looked up like any
    /// other: a task scheduled under a larger limit (the directory reopened
    /// with a lower one) is found, as it still fires and can be cancelled.
    ///
    /// It returns once everything logged before it is as durable as the
    /// mode promises, as a cancel answering `NotFound` does: under `Sync`
    /// (it may wait for a group commit in flight) no crash undoes what it
    /// answered; under `Interval` or `Buffered` a power cut may, as it may
    /// undo the calls it reflects ([`Engine::sync`] first makes it durable).
    /// An in-memory engine never waits. It may be out of date by the time
    /// the caller reads it: the driver, consumers and other callers go on
    /// meanwhile.
    ///
    /// Cost: one index lookup under the engine's lock, O(1); a key that may
    /// belong to a far task costs one read of its overflow entry, made with
    /// the lock let go (it is then taken twice). The payload is not
    /// returned (nor read).
    ///
    /// A consumer can check before irreversible work that the task it holds
    /// was not cancelled meanwhile (a cancel answering
    /// [`crate::CancelOutcome::AlreadyDelivered`] frees the key at once, so
    /// the key then has no live task, or a new one):
    ///
    /// ```
    /// use kairos::{CancelOutcome, Config, Delivery, Engine, ManualClock, TaskState};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    /// let still_held = |d: &Delivery| -> Result<bool, kairos::LookupError> {
    ///     Ok(engine.lookup(d.key())?.is_some_and(|t| {
    ///         t.id == d.task_id() && t.state == TaskState::Leased && t.deliveries == d.attempt()
    ///     }))
    /// };
    ///
    /// engine.schedule_after(b"order:9:timeout", Duration::ZERO, b"")?;
    /// engine.run_until_idle();
    /// let consumer = engine.consumer();
    /// let task = consumer.try_recv()?;
    /// assert!(still_held(&task)?);
    ///
    /// // The payment arrives while the consumer holds the task.
    /// assert_eq!(engine.cancel(b"order:9:timeout")?, CancelOutcome::AlreadyDelivered { attempt: 1 });
    /// assert!(!still_held(&task)?);
    /// engine.schedule_after(b"order:9:timeout", Duration::from_secs(60), b"")?; // a new task
    /// assert!(!still_held(&task)?);
    /// consumer.ack(&task)?; // still accepted: the holder finishes its attempt
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The answer can be out of date at once (a cancel may follow it), and a
    /// lease that ran out is seen only once the driver has processed its
    /// expiry; it narrows the window, the compensation on
    /// `AlreadyDelivered` still has to be there.
    ///
    /// # Errors
    /// [`LookupError::Closed`] after a shutdown; [`LookupError::Poisoned`]
    /// once a write or sync has failed, or when a far task's overflow entry
    /// cannot be read (which poisons the engine, as a cancel of it would).
    pub fn lookup(&self, key: &[u8]) -> Result<Option<TaskInfo>, LookupError> {
        self.shared.lookup(key)
    }
}

impl Shared {
    /// [`crate::Consumer::holds`].
    pub(crate) fn holds(&self, delivery: &crate::Delivery) -> Result<bool, LookupError> {
        if delivery.engine_id != self.engine_id {
            // From another open of the directory (or another engine): not
            // this engine's delivery, whatever its task does now. Still
            // `Closed` or `Poisoned` as a lookup would answer.
            return self.lookup(delivery.key()).map(|_| false);
        }
        Ok(self.lookup(delivery.key())?.is_some_and(|t| {
            t.id == delivery.task_id()
                && t.state == TaskState::Leased
                && t.deliveries == delivery.attempt()
        }))
    }

    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Option<TaskInfo>, LookupError> {
        let (mut core, reads, _) = self
            .lock_reading_far(std::iter::once(key))
            .map_err(|cause| LookupError::Poisoned { cause })?;
        core.check_open().map_err(|status| match status {
            Status::Poisoned(cause) => LookupError::Poisoned { cause },
            _ => LookupError::Closed,
        })?;
        let tag = core.key_tag(key);
        let info = match core.find_slot(tag, key) {
            Some(slot) => core.tasks.get(slot).map(|t| TaskInfo {
                id: t.id,
                due_ms: t.due_ms,
                state: t.state,
                // A ready task's hand-out reached no consumer yet (as for a
                // cancel's `Cancelled { deliveries }`).
                deliveries: if t.state == TaskState::Ready {
                    t.deliveries.saturating_sub(1)
                } else {
                    t.deliveries
                },
            }),
            None => match self.find_far(&core, key, &reads) {
                Ok(found) => found.map(|(pos, entry)| TaskInfo {
                    id: TaskId(core.far.get(pos).id),
                    due_ms: entry.due_ms,
                    state: TaskState::Scheduled,
                    deliveries: 0,
                }),
                Err(cause) => {
                    self.poison_locked(&mut core, cause.clone());
                    return Err(LookupError::Poisoned { cause });
                }
            },
        };
        self.wait_logged(core)
            .map_err(|cause| LookupError::Poisoned { cause })?;
        Ok(info)
    }
}
