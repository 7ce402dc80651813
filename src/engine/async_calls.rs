//! The durable calls as futures, for async embedders: `schedule_async`, `cancel_async`,
//! `ack_async` and their batch forms, `reschedule_async`, `nack_async`,
//! `ack_and_schedule_async`, `sync_async`, and for dead letters `requeue_dead_letter_async` and
//! `purge_dead_letter_async`. Each does its blocking twin's work on its first poll,
//! then waits for the log's durability without blocking the polling thread
//! ([`kairos_wal::AppendTicket::durable`]): under `Sync` the log's writer thread commits the
//! record, gathered with every other caller's into one group commit, and wakes the future.
//!
//! How the two kinds of call share one code path: the calls that have an async form take a
//! [`WaitMode`]. [`Blocking`] waits on the calling thread, as every blocking call does;
//! [`Deferred`] keeps the ticket of what the call logged, and the async call awaits it after
//! the call's work is done and the engine's lock let go. A call's answer is then decided
//! exactly as its blocking twin's: the outcome it computed, or `Poisoned` if the log failed
//! before that outcome was durable.

use super::{batch_ids, Engine, NewTask, Shared};
use crate::consumer::{Consumer, Delivery};
use crate::error::{AckError, AckScheduleError, CancelError, ScheduleError, SyncError};
use crate::task::TaskId;
use crate::{AckScheduleOutcome, CancelOutcome, Due, NackOutcome, RescheduleOutcome};
use kairos_wal::AppendTicket;
use std::cell::Cell;
use std::time::Duration;

/// How a call waits for the durability of what it logged.
pub(crate) trait WaitMode {
    /// Waits for `ticket` on this thread ([`Blocking`]) or keeps it for the caller to await
    /// ([`Deferred`]). A failed wait poisons the engine and is returned as its cause.
    fn wait(&self, shared: &Shared, ticket: Option<AppendTicket>) -> Result<(), String>;
}

/// The blocking calls' way: [`Shared::wait_durable`] on the calling thread.
pub(crate) struct Blocking;

impl WaitMode for Blocking {
    #[inline]
    fn wait(&self, shared: &Shared, ticket: Option<AppendTicket>) -> Result<(), String> {
        shared.wait_durable(ticket)
    }
}

/// The async calls' way: the ticket is kept (the one with the highest LSN, if a call hands
/// over more than one: the log is durable in LSN order, so it covers the others) and awaited
/// by the caller once the call's work is done. [`WaitMode::wait`] answers `Ok` at once; a
/// failure is found by the await, and answers `Poisoned` as the blocking call would.
#[derive(Default)]
pub(crate) struct Deferred(Cell<Option<AppendTicket>>);

impl WaitMode for Deferred {
    fn wait(&self, _: &Shared, ticket: Option<AppendTicket>) -> Result<(), String> {
        if let Some(ticket) = ticket {
            let kept = match self.0.take() {
                Some(kept) if kept.last_lsn() >= ticket.last_lsn() => kept,
                // The earlier ticket is dropped: its append is still committed.
                _ => ticket,
            };
            self.0.set(Some(kept));
        }
        Ok(())
    }
}

impl Deferred {
    fn into_ticket(self) -> Option<AppendTicket> {
        self.0.into_inner()
    }
}

/// The `Poisoned` variant of a call's error.
trait FromPoison {
    fn poisoned(cause: String) -> Self;
}

impl FromPoison for ScheduleError {
    fn poisoned(cause: String) -> Self {
        ScheduleError::Poisoned { cause }
    }
}

impl FromPoison for CancelError {
    fn poisoned(cause: String) -> Self {
        CancelError::Poisoned { cause }
    }
}

impl FromPoison for AckError {
    fn poisoned(cause: String) -> Self {
        AckError::Poisoned { cause }
    }
}

impl FromPoison for AckScheduleError {
    fn poisoned(cause: String) -> Self {
        AckScheduleError::Ack(AckError::Poisoned { cause })
    }
}

impl Shared {
    /// Runs `call` with a [`Deferred`] wait, then awaits what it logged: its outcome once that
    /// is durable, or `Poisoned` (the engine poisoned) if the log failed first.
    async fn deferred<T, E: FromPoison>(
        &self,
        call: impl FnOnce(&Deferred) -> Result<T, E>,
    ) -> Result<T, E> {
        let deferred = Deferred::default();
        let outcome = call(&deferred);
        if let Some(ticket) = deferred.into_ticket() {
            if let Err(e) = ticket.durable().await {
                let cause = e.to_string();
                self.poison(cause.clone());
                return Err(E::poisoned(cause));
            }
        }
        outcome
    }

    /// [`Consumer::ack_many_async`] and [`Engine::ack_many_async`].
    async fn ack_many_async(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.deferred(|wait| self.ack_many_with(deliveries, wait))
            .await
    }

    /// [`Consumer::nack_async`] and [`Engine::nack_async`].
    async fn nack_async(
        &self,
        delivery: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.deferred(|wait| self.nack_with(delivery, retry_after, error, wait))
            .await
    }

    /// [`Consumer::ack_and_schedule_async`] and [`Engine::ack_and_schedule_async`].
    async fn ack_and_schedule_async(
        &self,
        delivery: &Delivery,
        due: Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.deferred(|wait| self.ack_and_schedule_with(delivery, due, payload, wait))
            .await
    }
}

/// Async forms of the durable calls.
///
/// Each returns a future that does nothing until it is first polled. Its first poll does the
/// work of the blocking call — validation, the engine's lock, the log append, the change in
/// memory — on the polling thread; it then waits for the log's durability without blocking:
/// under `Sync` the log's writer thread commits the record (one group commit with every
/// concurrent caller's, async or not) and wakes the future; under `Interval`/`Buffered` it
/// writes it to the OS. The answer is the blocking call's, exactly: the same outcomes, errors
/// and durability when it resolves. No async runtime is a dependency; the futures are `Send`.
///
/// What a poll may still block on (as [`Consumer::recv_async`]'s): a read of a far task's
/// overflow entry from disk (a schedule, cancel or dead letter's requeue of a key whose hash
/// matches a far task's; the requeue reads it under the engine's lock, as its blocking twin),
/// and a schedule's (or requeue's) wait while far tasks are moved out of memory faster than
/// they are made ([`crate::Config::relocate_far_tasks`]), as the blocking call waits. A waker
/// is woken by the thread that made the record durable (the log's writer thread, or a
/// blocking caller committing its own round) and must not poll inline (as no usual executor's
/// does).
///
/// **Dropping a future after its first poll does not undo its call**: the change is made and
/// logged, and becomes durable as any other; only its answer is lost (a failure of the log
/// poisons the engine, as always). A lone async caller under `Sync` pays one hand-off to the
/// writer thread and back that a lone blocking caller does not (it commits its own round).
///
/// Follows the `Future` contract of `std::future` (lazy, woken by its waker); the durable
/// wait is group commit as in the blocking calls (PostgreSQL's and SQLite's committing
/// backends wait on a shared flush likewise).
impl Engine {
    /// [`Engine::schedule`] as a future (see the notes on this `impl` block).
    ///
    /// # Errors
    /// As [`Engine::schedule`].
    pub async fn schedule_async(
        &self,
        key: &[u8],
        due: Due,
        payload: &[u8],
    ) -> Result<TaskId, ScheduleError> {
        let task = [NewTask { key, due, payload }];
        let shared = &*self.shared;
        shared
            .deferred(|wait| shared.schedule_batch_with(&task, wait))
            .await
    }

    /// [`Engine::schedule_many`] as a future: one log write for the batch.
    ///
    /// # Errors
    /// As [`Engine::schedule_many`].
    pub async fn schedule_many_async(
        &self,
        tasks: &[NewTask<'_>],
    ) -> Result<Vec<TaskId>, ScheduleError> {
        if tasks.is_empty() {
            return self.schedule_many(tasks);
        }
        let shared = &*self.shared;
        let first = shared
            .deferred(|wait| shared.schedule_batch_with(tasks, wait))
            .await?;
        Ok(batch_ids(first, tasks.len()))
    }

    /// [`Engine::reschedule`] as a future (upsert: a live task gets the new due time and
    /// payload, a free key a new task).
    ///
    /// # Errors
    /// As [`Engine::reschedule`].
    pub async fn reschedule_async(
        &self,
        key: &[u8],
        due: Due,
        payload: Option<&[u8]>,
    ) -> Result<RescheduleOutcome, ScheduleError> {
        let shared = &*self.shared;
        shared
            .deferred(|wait| shared.reschedule_with(key, due, payload, wait))
            .await
    }

    /// [`Engine::sync`] as a future: everything logged before the call fdatasynced (and
    /// proven), in any durability mode — per-call durability for an `Interval` or `Buffered`
    /// engine in async code. The log's writer thread syncs and wakes it; a shutdown while it
    /// waits makes everything durable too (then `Ok`). In memory, `Ok` at once.
    ///
    /// # Errors
    /// As [`Engine::sync`]: [`SyncError::Closed`] after a shutdown; [`SyncError::Poisoned`] if
    /// the engine was poisoned, or a write or fdatasync failed now (which poisons it).
    pub async fn sync_async(&self) -> Result<(), SyncError> {
        let Some(log) = self.shared.sync_handle()? else {
            return Ok(());
        };
        log.sync_async()
            .await
            .map_err(|e| self.shared.sync_failed(e))
    }

    /// [`Engine::cancel`] as a future. Under `Sync`, `Cancelled` is durable when it resolves.
    ///
    /// # Errors
    /// As [`Engine::cancel`].
    pub async fn cancel_async(&self, key: &[u8]) -> Result<CancelOutcome, CancelError> {
        let shared = &*self.shared;
        let mut outcomes = shared
            .deferred(|wait| shared.cancel_many_with(&[key], wait))
            .await?;
        outcomes.pop().ok_or(CancelError::Closed)
    }

    /// [`Engine::cancel_many`] as a future: one log write for the batch.
    ///
    /// # Errors
    /// As [`Engine::cancel_many`].
    pub async fn cancel_many_async(
        &self,
        keys: &[&[u8]],
    ) -> Result<Vec<CancelOutcome>, CancelError> {
        let shared = &*self.shared;
        shared
            .deferred(|wait| shared.cancel_many_with(keys, wait))
            .await
    }

    /// [`Engine::requeue_dead_letter`] as a future: dead letter `id` back as a new task (new
    /// id, same key and payload, a fresh attempt count), due at `due`. Under `Sync`, the new
    /// task (and the dead letter's removal, logged in the same write) is durable when it
    /// resolves; so is the record a refusal rests on (`NotDeadLetter` for a dead letter
    /// another call just requeued or purged, `AlreadyExists`, `TooManyPending`). Its first poll
    /// may block as the blocking call's does on a far task's entry with the key's hash (read
    /// under the engine's lock) and on far tasks being moved out (see the notes on this `impl`
    /// block); the fdatasync it never waits for on the polling thread.
    ///
    /// # Errors
    /// As [`Engine::requeue_dead_letter`].
    pub async fn requeue_dead_letter_async(
        &self,
        id: TaskId,
        due: Due,
    ) -> Result<TaskId, ScheduleError> {
        let shared = &*self.shared;
        shared
            .deferred(|wait| shared.requeue_dead_letter_with(id, due, wait))
            .await
    }

    /// [`Engine::purge_dead_letter`] as a future: deletes dead letter `id` for good; `false`
    /// if there was none. Under `Sync`, `true` is durable when it resolves, and so is `false`:
    /// it resolves once the record that removed the dead letter (another call's purge or
    /// requeue) is.
    ///
    /// # Errors
    /// As [`Engine::purge_dead_letter`].
    pub async fn purge_dead_letter_async(&self, id: TaskId) -> Result<bool, CancelError> {
        let shared = &*self.shared;
        shared
            .deferred(|wait| shared.purge_dead_letter_with(id, wait))
            .await
    }

    /// [`Engine::ack`] as a future (same as [`Consumer::ack_async`]).
    ///
    /// # Errors
    /// As [`Consumer::ack`].
    pub async fn ack_async(&self, delivery: &Delivery) -> Result<(), AckError> {
        self.ack_many_async(std::slice::from_ref(delivery)).await
    }

    /// [`Engine::ack_many`] as a future (same as [`Consumer::ack_many_async`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_many`].
    pub async fn ack_many_async(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.shared.ack_many_async(deliveries).await
    }

    /// [`Engine::nack`] as a future (same as [`Consumer::nack_async`]).
    ///
    /// # Errors
    /// As [`Consumer::nack`].
    pub async fn nack_async(
        &self,
        delivery: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.shared.nack_async(delivery, retry_after, error).await
    }

    /// [`Engine::ack_and_schedule`] as a future (same as
    /// [`Consumer::ack_and_schedule_async`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_and_schedule`].
    pub async fn ack_and_schedule_async(
        &self,
        delivery: &Delivery,
        due: Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.shared
            .ack_and_schedule_async(delivery, due, payload)
            .await
    }
}

impl Consumer {
    /// [`Consumer::ack`] as a future, for a consumer that receives with
    /// [`Consumer::recv_async`]: it resolves once the ACK record has the log's durability,
    /// without blocking the polling thread (see the notes on [`Engine::schedule_async`]'s
    /// `impl` block; dropping it after its first poll does not undo the ack).
    ///
    /// # Errors
    /// As [`Consumer::ack`].
    pub async fn ack_async(&self, delivery: &Delivery) -> Result<(), AckError> {
        self.ack_many_async(std::slice::from_ref(delivery)).await
    }

    /// [`Consumer::ack_many`] as a future: one log write for the batch.
    ///
    /// # Errors
    /// As [`Consumer::ack_many`].
    pub async fn ack_many_async(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.shared.ack_many_async(deliveries).await
    }

    /// [`Consumer::nack`] as a future: it resolves once the RETRY or DEAD record has the log's
    /// durability (as [`Consumer::ack_async`]).
    ///
    /// # Errors
    /// As [`Consumer::nack`].
    pub async fn nack_async(
        &self,
        delivery: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.shared.nack_async(delivery, retry_after, error).await
    }

    /// [`Consumer::ack_and_schedule`] as a future: it resolves once the frame of the ACK and
    /// the next task's SCHEDULE has the log's durability (as [`Consumer::ack_async`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_and_schedule`]; `Poisoned` comes as
    /// `AckScheduleError::Ack(AckError::Poisoned { .. })`, as there.
    pub async fn ack_and_schedule_async(
        &self,
        delivery: &Delivery,
        due: Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.shared
            .ack_and_schedule_async(delivery, due, payload)
            .await
    }
}
