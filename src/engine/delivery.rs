//! The delivery side of the engine: the driver thread, the ready queue,
//! leases, acks, nacks, retries with backoff, dead letters.
//!
//! A task's path (states in [`TaskState`]): the driver finds it due and logs
//! its DELIVER record (`Ready`); once that is durable, the driver's hand-out
//! thread puts it in the ready queue. A consumer takes it under the core lock: at least once, the
//! task becomes `Leased` and its lease expiry is a timer in the wheel; at most
//! once, its ACK is logged (and waited for) before the consumer gets it. An
//! ack finishes a leased task; a nack or a lease expiry is a failed attempt:
//! RETRY at the backoff (back to `Scheduled`), or DEAD once `max_attempts`
//! deliveries have failed. Every transition is a log record written under
//! the lock before it takes effect (leases themselves are not logged: a
//! restart ends them all, see `Shared::load_replayed`).

use super::async_calls::{Blocking, WaitMode};
use super::{
    check_frame_bytes, status_to_ack_error, wall_ms, Core, DriverSleep, Due, NewTask, Now,
    ReadyEntry, RecordBatch, Shared, Status,
};
use crate::clock::ms_to_system_time;
use crate::config::{DeliveryGuarantee, BATCH_TASKS_MAX};
use crate::consumer::Delivery;
use crate::error::{AckError, AckScheduleError, RecvError};
use crate::record::{Record, ERROR_BYTES_MAX};
use crate::replay::DeadTask;
use crate::task::{PayloadStore, TaskId, TaskState};
use crate::wheel::{Expired, Tick};
use kairos_wal::AppendTicket;
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

/// What a nack (or a lease expiry) did with the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NackOutcome {
    /// Attempt `next_attempt` is due at `due`.
    Retry {
        /// The number the next delivery will carry.
        next_attempt: u32,
        /// When it is due.
        due: SystemTime,
    },
    /// The task had used its `max_attempts` deliveries: it is now a dead
    /// letter (see [`crate::Engine::dead_letters`]).
    DeadLettered,
    /// The task was cancelled while the consumer held it: it is finished,
    /// nothing follows.
    Finished,
}

/// What [`crate::Consumer::ack_and_schedule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckScheduleOutcome {
    /// The delivery is acknowledged and a new task with its key is
    /// scheduled, with this id (at most once: the delivery was finished when
    /// received, and only the new task was made).
    Scheduled(TaskId),
    /// The task was cancelled while the consumer held it (its cancel
    /// answered [`crate::CancelOutcome::AlreadyDelivered`]): the delivery is
    /// acknowledged and nothing is scheduled — the cancel ends the series.
    CancelledWhileHeld,
}

/// A task that exhausted its attempts, kept until requeued or purged.
/// (`Debug` shows the key as text, lossily, and the payload's length, as
/// [`crate::Delivery`]'s does.)
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The task's id.
    pub task_id: TaskId,
    /// Its key.
    pub key: Vec<u8>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Deliveries it had (= attempts made).
    pub attempts: u32,
    /// Due time of its last attempt, UTC ms.
    pub due_ms: u64,
    /// When it was dead-lettered, UTC ms.
    pub dead_ms: u64,
    /// The error of its last attempt (the nack's text, or a lease expiry).
    pub error: String,
}

impl DeadLetter {
    /// [`DeadLetter::due_ms`] as a `SystemTime`: the due time of its last
    /// attempt.
    pub fn due(&self) -> SystemTime {
        ms_to_system_time(self.due_ms)
    }

    /// [`DeadLetter::dead_ms`] as a `SystemTime`: when it was dead-lettered.
    pub fn dead_at(&self) -> SystemTime {
        ms_to_system_time(self.dead_ms)
    }
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter")
            .field("task_id", &self.task_id)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("payload_bytes", &self.payload.len())
            .field("attempts", &self.attempts)
            .field("due_ms", &self.due_ms)
            .field("dead_ms", &self.dead_ms)
            .field("error", &self.error)
            .finish()
    }
}

/// How a receive waits for a ready task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    Until(Instant),
    Forever,
}

/// Most records in one log frame from one driver pass (16-byte deliver
/// bodies + 5-byte record headers: frames of about 1.3 MiB, far below the
/// 1 GiB frame limit; retry and dead records carry at most 4 KiB of error).
const PASS_CHUNK_RECORDS: usize = 65_536;

/// Error text of a lease that expired: names the configured lease, not
/// this one's length, which [`crate::Consumer::extend_lease`] may have
/// changed (a task does not keep it).
fn lease_expired_error(lease: Duration) -> String {
    format!(
        "lease expired without ack or nack (Config::lease is {} ms)",
        lease.as_millis()
    )
}

/// `text` cut to at most [`ERROR_BYTES_MAX`] bytes at a character boundary.
fn clip_error(text: &str) -> &str {
    if text.len() <= ERROR_BYTES_MAX {
        return text;
    }
    let mut end = ERROR_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Shared {
    /// The tick at which a lease of `lease` taken at engine time `now_ns` ends: the first
    /// tick that starts at or after `now_ns + lease`. So a lease never ends early: its holder
    /// may act on it for at least `lease`, and the driver expires it less than a tick after.
    ///
    /// The end is also at least `lease` (in ticks, rounded up) past the wheel's `elapsed`
    /// tick, so the wheel never refuses the timer as elapsed: `extend_lease` reads the clock
    /// before it takes the lock, and the driver may have moved the wheel past that reading
    /// meanwhile.
    fn lease_end(&self, now_ns: u128, elapsed: Tick, lease: Duration) -> Tick {
        let to_ticks =
            |ns: u128| u64::try_from(super::div_ceil_u128(ns, self.tick_ns)).unwrap_or(u64::MAX);
        let end = to_ticks(now_ns.saturating_add(lease.as_nanos()));
        let lease_ticks = to_ticks(lease.as_nanos()).max(1);
        Tick(end.max(elapsed.0.saturating_add(lease_ticks)))
    }

    /// Takes the next ready task for a consumer.
    pub(crate) fn receive(&self, wait: Wait) -> Result<Delivery, RecvError> {
        let mut core = self.core.lock();
        loop {
            match &core.status {
                Status::Open => {}
                Status::Poisoned(cause) => {
                    return Err(RecvError::Poisoned {
                        cause: cause.clone(),
                    })
                }
                Status::Closed => return Err(RecvError::Closed),
            }
            if let Some(entry) = core.ready.pop_front() {
                let Some(task) = core.tasks.get_checked(entry.slot, entry.id) else {
                    continue;
                };
                if task.state != TaskState::Ready {
                    continue;
                }
                if let Some(at) = task.bytes.on_disk() {
                    // Its payload is still on disk (the prefetcher did not get
                    // to it): read it without holding the engine's lock.
                    let key: Box<[u8]> = core.payloads.key(&task.bytes).into();
                    let (slot, id) = (entry.slot, entry.id);
                    core.receiving.push(entry);
                    drop(core);
                    let read = self.read_payload_at(at.0, at.1, id.0, &key);
                    core = self.core.lock();
                    let same = |e: &ReadyEntry| {
                        e.slot == entry.slot && e.id == entry.id && e.fired_ms == entry.fired_ms
                    };
                    match core.receiving.iter().position(same) {
                        Some(i) => {
                            core.receiving.swap_remove(i);
                        }
                        // Taken back meanwhile (rescheduled, or released by a
                        // shutdown): this hand-out is void.
                        None => continue,
                    }
                    // Decide from the task as it is now, not from the read:
                    // cancelled, finished or rescheduled meanwhile, there is
                    // nothing to deliver; its payload moved meanwhile (read
                    // back into memory by the prefetcher, or to another file
                    // by a checkpoint, which may then have deleted this one),
                    // the read is moot and `take_ready` loads it from where it
                    // is; still at `at`, the read is the payload, and a failed
                    // read is damage to durable data.
                    let still_at = match core.tasks.get_checked(slot, id) {
                        Some(t) if t.state == TaskState::Ready => t.bytes.on_disk() == Some(at),
                        _ => continue,
                    };
                    // Stopped meanwhile (a shutdown under way, which takes
                    // the delivery back from the queue): the answer is the
                    // status's, whatever the read gave — a failed read does
                    // not turn a closed engine poisoned.
                    if core.status != Status::Open {
                        core.ready.push_front(entry);
                        continue;
                    }
                    let payload = match read {
                        Ok(payload) if still_at => Some(payload),
                        Err(cause) if still_at => {
                            self.poison_locked(&mut core, cause.clone());
                            return Err(RecvError::Poisoned { cause });
                        }
                        _ => None,
                    };
                    if let Some(payload) = payload {
                        let c = &mut *core;
                        if let Some(t) = c.tasks.get_mut(slot) {
                            let new_ref = c.payloads.put(&key, &payload);
                            let old = std::mem::replace(&mut t.bytes, new_ref);
                            c.release_bytes(slot, old);
                            c.payloads_read_back += 1;
                        }
                    }
                }
                return self.take_ready(core, entry);
            }
            match wait {
                Wait::No => return Err(RecvError::Empty),
                Wait::Forever => self.ready_cv.wait(&mut core),
                Wait::Until(deadline) => {
                    if self.ready_cv.wait_until(&mut core, deadline).timed_out()
                        && core.ready.is_empty()
                    {
                        return Err(match &core.status {
                            Status::Open => RecvError::Timeout,
                            Status::Poisoned(cause) => RecvError::Poisoned {
                                cause: cause.clone(),
                            },
                            Status::Closed => RecvError::Closed,
                        });
                    }
                }
            }
        }
    }

    /// Wakes every consumer waiting for the ready queue: those blocked in
    /// `recv` (the condvar) and those in [`crate::Consumer::recv_async`]
    /// (their wakers, woken after the waiters' lock is let go; the caller
    /// may hold the core lock, so a waker must not poll inline — none of
    /// the usual executors' does).
    ///
    /// A waker runs the executor's code; one that panics is caught and
    /// logged (ERROR), so that it neither keeps the wakers after it from
    /// being woken nor unwinds the calling thread — the driver, which hands
    /// out every due task.
    pub(super) fn notify_ready(&self) {
        self.ready_cv.notify_all();
        let wakers: smallvec::SmallVec<[std::task::Waker; 4]> =
            self.async_waiters.lock().iter().cloned().collect();
        for waker in wakers {
            // `AssertUnwindSafe`: the waker is consumed; nothing of the
            // engine is borrowed by it.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake())).is_err() {
                tracing::error!(
                    "a recv_async future's waker panicked when woken; the other consumers are \
                     woken and the engine goes on"
                );
            }
        }
    }

    /// Files `waker` for the next [`Shared::notify_ready`] under `id` (a new
    /// id if `None`); returns the id. O(1).
    pub(crate) fn register_async_waiter(&self, id: Option<u64>, waker: &std::task::Waker) -> u64 {
        self.async_waiters.lock().register(id, waker)
    }

    /// How many wakers of `recv_async` futures are filed.
    #[cfg(test)]
    pub(crate) fn async_waiters(&self) -> usize {
        self.async_waiters.lock().len()
    }

    /// Drops the waker filed under `id`. O(1).
    pub(crate) fn forget_async_waiter(&self, id: u64) {
        self.async_waiters.lock().forget(id);
    }

    /// Hands the ready task of `entry` to the calling consumer: leases it
    /// (at least once) or finishes it (at most once, waiting for its ack
    /// record's durability before returning it).
    fn take_ready(
        &self,
        mut core: parking_lot::MutexGuard<'_, Core>,
        entry: ReadyEntry,
    ) -> Result<Delivery, RecvError> {
        let at_most_once = self.config.delivery == DeliveryGuarantee::AtMostOnce;
        let c = &mut *core;
        if let Err(cause) = self.load_payload_locked(c, entry.slot) {
            self.poison_locked(c, cause.clone());
            return Err(RecvError::Poisoned { cause });
        }
        // After the payload is in memory (a read from disk, on a rare path): the lease starts
        // as the consumer gets the task.
        let now_ns = self.now_ns();
        let Some(task) = c.tasks.get_mut(entry.slot) else {
            return Err(RecvError::Empty);
        };
        let delivery = Delivery {
            engine_id: self.engine_id,
            task_id: entry.id,
            slot: entry.slot,
            key: c.payloads.key(&task.bytes).into(),
            payload: c.payloads.get(&task.bytes).unwrap_or_default().to_vec(),
            due_ms: task.due_ms,
            fired_ms: entry.fired_ms,
            attempt: task.deliveries,
            at_most_once,
        };
        c.totals.deliveries += 1;
        if at_most_once {
            let ticket = self.log_ids(&mut core, crate::record::RECORD_ACK, [entry.id], |id| {
                Record::Ack { id }
            });
            let ticket = match ticket {
                Ok(ticket) => ticket,
                Err(cause) => return Err(RecvError::Poisoned { cause }),
            };
            self.forget_task(&mut core, entry.slot);
            drop(core);
            self.wait_durable(ticket)
                .map_err(|cause| RecvError::Poisoned { cause })?;
            return Ok(delivery);
        }
        // Lease expiry: a timer in the wheel at now + lease.
        let due = self.lease_end(now_ns, c.wheel.elapsed(), self.config.lease);
        let timer = c.wheel.insert(due, entry.slot).ok();
        if let Some(task) = c.tasks.get_mut(entry.slot) {
            task.state = TaskState::Leased;
            task.timer = timer;
        }
        c.ready_count -= 1;
        c.in_flight_count += 1;
        if timer.is_some() && self.driver_should_wake(c, due) {
            self.driver_cv.notify_all();
        }
        Ok(delivery)
    }

    /// Whether the driver, as it sleeps now, would miss a deadline at `due`.
    pub(super) fn driver_should_wake(&self, core: &Core, due: Tick) -> bool {
        match core.sleep {
            DriverSleep::Busy => false,
            DriverSleep::Forever => true,
            DriverSleep::Until(t) => due < t,
        }
    }

    /// Checks that `d` is a lease its holder may still act on; returns the
    /// task's state (`Leased`, or `Abandoned` if it was cancelled while held).
    ///
    /// The refusals depend only on the log's state and the clock, never on
    /// whether the driver has processed an expiry yet: `LeaseExpired` when
    /// this delivery's attempt is over (its lease ran out, or it was nacked)
    /// and the task lives on for another attempt; `NotOutstanding` when the
    /// task is finished or will be at its lease's end (acked, cancelled,
    /// dead-lettered), unknown, or the delivery is another engine's.
    fn check_lease(&self, core: &Core, d: &Delivery, now: Tick) -> Result<TaskState, AckError> {
        let task_id = d.task_id.0;
        let not_outstanding = AckError::NotOutstanding { task_id };
        let lease_expired = AckError::LeaseExpired { task_id };
        if d.engine_id != self.engine_id {
            return Err(not_outstanding);
        }
        let Some(task) = core.tasks.get_checked(d.slot, d.task_id) else {
            return Err(not_outstanding);
        };
        let held = matches!(task.state, TaskState::Leased | TaskState::Abandoned);
        if !held || task.deliveries != d.attempt {
            return Err(lease_expired);
        }
        // Past its deadline but perhaps not yet processed by the driver: the
        // answer is the one the driver's processing will make true.
        let deadline = task.timer.and_then(|t| core.wheel.due(t));
        if deadline.is_none_or(|deadline| deadline <= now) {
            let finished = task.state == TaskState::Abandoned
                || task.deliveries >= self.config.retry.max_attempts;
            return Err(if finished {
                not_outstanding
            } else {
                lease_expired
            });
        }
        Ok(task.state)
    }

    /// A ticket for everything logged so far (`None` without a log): an
    /// answer derived from state that an earlier, maybe not yet durable,
    /// record made (a task cancelled while held, a key already gone) waits
    /// on it, so the answer never outlives a crash that undoes that record.
    pub(super) fn barrier_locked(core: &Core) -> Option<AppendTicket> {
        core.wal.as_deref().map(kairos_wal::Wal::barrier)
    }

    /// Lets go of the engine's lock and waits until everything logged before it is as durable
    /// as the mode promises: for an answer that rests on records (this call's or another
    /// caller's) without logging one of its own — `NotFound`, `AlreadyExists`, a refusal —
    /// so that no crash undoes it. Waits for nothing without a log or with nothing pending.
    ///
    /// # Errors
    /// The log's failure (the engine is then poisoned).
    pub(super) fn wait_logged(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
    ) -> Result<(), String> {
        self.wait_logged_with(core, &Blocking)
    }

    /// [`Shared::wait_logged`], waiting as `wait` says.
    pub(super) fn wait_logged_with<W: WaitMode>(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        wait: &W,
    ) -> Result<(), String> {
        let ticket = Self::barrier_locked(&core);
        drop(core);
        wait.wait(self, ticket)
    }

    /// A refusal of [`Shared::check_lease`], returned once everything logged so far is
    /// durable ([`Shared::wait_logged`]): it may rest on a record not durable yet (a cancel of
    /// the held task, a cancel of its retry).
    fn refused(&self, core: parking_lot::MutexGuard<'_, Core>, refusal: AckError) -> AckError {
        self.refused_with(core, refusal, &Blocking)
    }

    /// [`Shared::refused`], waiting as `wait` says.
    fn refused_with<W: WaitMode>(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        refusal: AckError,
        wait: &W,
    ) -> AckError {
        match self.wait_logged_with(core, wait) {
            Ok(()) => refusal,
            Err(cause) => AckError::Poisoned { cause },
        }
    }

    /// Acks deliveries with one log write: all of them, or none if any is
    /// not outstanding.
    pub(crate) fn ack_many(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.ack_many_with(deliveries, &Blocking)
    }

    /// [`Shared::ack_many`], waiting for durability as `wait` says.
    pub(crate) fn ack_many_with<W: WaitMode>(
        &self,
        deliveries: &[Delivery],
        wait: &W,
    ) -> Result<(), AckError> {
        if deliveries.len() > BATCH_TASKS_MAX {
            return Err(AckError::BatchTooLarge {
                tasks: deliveries.len(),
                max: BATCH_TASKS_MAX,
            });
        }
        if deliveries.is_empty() {
            // Nothing to log, but `Closed` after a shutdown, as any call.
            return self.core.lock().check_open().map_err(status_to_ack_error);
        }
        if deliveries.iter().all(|d| d.at_most_once) {
            // Finished when it was received: nothing to do.
            return Ok(());
        }
        let now = self.now_tick();
        // The keys' index tags, hashed before the lock is taken.
        let tags: smallvec::SmallVec<[u32; 1]> = deliveries
            .iter()
            .filter(|d| !d.at_most_once)
            .map(|d| self.index_probe.tag(d.key()))
            .collect();
        let mut core = self.core.lock();
        core.check_open().map_err(status_to_ack_error)?;
        let mut seen: Option<HashSet<u32>> = (deliveries.len() > 1).then(HashSet::new);
        let mut logged = Vec::with_capacity(deliveries.len());
        for d in deliveries.iter().filter(|d| !d.at_most_once) {
            let state = match self.check_lease(&core, d, now) {
                Ok(state) => state,
                Err(refusal) => return Err(self.refused_with(core, refusal, wait)),
            };
            if seen.as_mut().is_some_and(|seen| !seen.insert(d.slot)) {
                return Err(AckError::NotOutstanding {
                    task_id: d.task_id.0,
                });
            }
            // An abandoned task was finished by its cancel record already.
            if state == TaskState::Leased {
                logged.push(d.task_id);
            }
        }
        let ticket = if logged.is_empty() {
            // Only tasks cancelled while held: their cancel record must be
            // durable before the ack answers.
            Self::barrier_locked(&core)
        } else {
            self.log_ids(&mut core, crate::record::RECORD_ACK, logged, |id| {
                Record::Ack { id }
            })
            .map_err(|cause| AckError::Poisoned { cause })?
        };
        // Every delivery not at most once (abandoned ones too): `tags` has one each.
        core.totals.acks += tags.len() as u64;
        for (d, &tag) in deliveries.iter().filter(|d| !d.at_most_once).zip(&tags) {
            self.forget_task_tagged(
                &mut core,
                d.slot,
                Some(crate::index::Found::tagged(d.slot, tag)),
            );
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| AckError::Poisoned { cause })
    }

    /// [`crate::Consumer::ack_and_schedule`]: the ACK of `d` and the
    /// SCHEDULE of a new task with its key in one log frame, so a replay
    /// applies both or neither; the held task's key passes to the new task
    /// under one hold of the lock (no call sees the key free in between).
    pub(crate) fn ack_and_schedule(
        &self,
        d: &Delivery,
        due: Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.ack_and_schedule_with(d, due, payload, &Blocking)
    }

    /// [`Shared::ack_and_schedule`], waiting for durability as `wait` says.
    pub(crate) fn ack_and_schedule_with<W: WaitMode>(
        &self,
        d: &Delivery,
        due: Due,
        payload: &[u8],
        wait: &W,
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        let new = NewTask {
            key: d.key(),
            due,
            payload,
        };
        if d.at_most_once {
            // Finished when it was received: only the schedule is left.
            let id = self.schedule_batch_with(std::slice::from_ref(&new), wait)?;
            return Ok(AckScheduleOutcome::Scheduled(id));
        }
        let now = self.now();
        let (due_ms, due_tick) = self.prepare(&new, now)?;
        check_frame_bytes(std::slice::from_ref(&new))?;
        let tag = self.index_probe.tag(d.key());
        // Over 1 KiB: allocated and copied before the lock.
        let prebuilt = PayloadStore::prebuild(d.key(), payload);
        self.await_relocation();
        // Read after any wait above, as `ack` reads it just before the lock:
        // a lease that ran out meanwhile refuses the call.
        let now_tick = self.now_tick();
        let mut core = self.core.lock();
        core.check_open().map_err(status_to_ack_error)?;
        let state = match self.check_lease(&core, d, now_tick) {
            Ok(state) => state,
            Err(refusal) => return Err(self.refused_with(core, refusal, wait).into()),
        };
        if state == TaskState::Abandoned {
            // Finished by its cancel record already (and its key is no
            // longer its own): as `ack`, once that record is durable.
            core.totals.acks += 1;
            self.forget_task_tagged(&mut core, d.slot, None);
            self.wait_logged_with(core, wait)
                .map_err(|cause| AckError::Poisoned { cause })?;
            return Ok(AckScheduleOutcome::CancelledWhileHeld);
        }
        // The held task leaves as the new one comes: the pending count
        // stays, so there is no `TooManyPending`.
        self.check_horizon(&core, due_ms, due_tick)?;
        let id = TaskId(core.next_id);
        let mut batch = RecordBatch::default();
        batch.push(&Record::Ack { id: d.task_id });
        batch.push(&Record::Schedule {
            id,
            due_ms,
            key: d.key(),
            payload,
        });
        let ticket = self
            .append_locked(&mut core, &batch.records())
            .map_err(|cause| AckError::Poisoned { cause })?;
        core.next_id += 1;
        core.totals.acks += 1;
        self.forget_task_tagged(
            &mut core,
            d.slot,
            Some(crate::index::Found::tagged(d.slot, tag)),
        );
        if self.place_task(&mut core, id, &new, prebuilt, tag, due_ms, due_tick) {
            self.driver_cv.notify_all();
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| AckError::Poisoned { cause })?;
        Ok(AckScheduleOutcome::Scheduled(id))
    }

    /// A failed attempt reported by the consumer.
    pub(crate) fn nack(
        &self,
        d: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.nack_with(d, retry_after, error, &Blocking)
    }

    /// [`Shared::nack`], waiting for durability as `wait` says.
    pub(crate) fn nack_with<W: WaitMode>(
        &self,
        d: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
        wait: &W,
    ) -> Result<NackOutcome, AckError> {
        if d.at_most_once {
            return Err(AckError::NotOutstanding {
                task_id: d.task_id.0,
            });
        }
        if let Some(delay) = retry_after {
            if delay > self.config.delay_max {
                return Err(AckError::RetryTooFar {
                    // Rounded up, as `max_ms` down: never the same figure.
                    retry_after_ms: u64::try_from(delay.as_nanos().div_ceil(1_000_000))
                        .unwrap_or(u64::MAX),
                    max_ms: u64::try_from(self.config.delay_max.as_millis()).unwrap_or(u64::MAX),
                });
            }
        }
        let now = self.now();
        let now_tick = self.tick_of(now);
        let mut core = self.core.lock();
        core.check_open().map_err(status_to_ack_error)?;
        let state = match self.check_lease(&core, d, now_tick) {
            Ok(state) => state,
            Err(refusal) => return Err(self.refused_with(core, refusal, wait)),
        };
        core.totals.nacks += 1;
        if state == TaskState::Abandoned {
            self.forget_task(&mut core, d.slot);
            self.wait_logged_with(core, wait)
                .map_err(|cause| AckError::Poisoned { cause })?;
            return Ok(NackOutcome::Finished);
        }
        let mut batch = RecordBatch::default();
        let outcome = self.fail_attempt(&mut core, d.slot, retry_after, error, now, &mut batch);
        let ticket = self
            .append_locked(&mut core, &batch.records())
            .map_err(|cause| AckError::Poisoned { cause })?;
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| AckError::Poisoned { cause })?;
        Ok(outcome)
    }

    /// Moves a lease's deadline to `lease` from now (heartbeat).
    pub(crate) fn extend_lease(&self, d: &Delivery, lease: Duration) -> Result<(), AckError> {
        if d.at_most_once {
            return Err(AckError::NotOutstanding {
                task_id: d.task_id.0,
            });
        }
        if lease < Duration::from_millis(1) || lease > crate::config::LEASE_MAX {
            // Rounded away from the range, so the error never names an accepted lease.
            let lease_ms = if lease > crate::config::LEASE_MAX {
                lease.as_nanos().div_ceil(1_000_000)
            } else {
                lease.as_millis()
            };
            return Err(AckError::InvalidLease {
                lease_ms: u64::try_from(lease_ms).unwrap_or(u64::MAX),
                max_ms: crate::config::LEASE_MAX.as_millis() as u64,
            });
        }
        let now_ns = self.now_ns();
        let now = self.tick_at(now_ns);
        let mut core = self.core.lock();
        core.check_open().map_err(status_to_ack_error)?;
        if let Err(refusal) = self.check_lease(&core, d, now) {
            return Err(self.refused(core, refusal));
        }
        let due = self.lease_end(now_ns, core.wheel.elapsed(), lease);
        let c = &mut *core;
        if let Some(task) = c.tasks.get_mut(d.slot) {
            if let Some(old) = task.timer.take() {
                c.wheel.remove(old);
            }
            task.timer = c.wheel.insert(due, d.slot).ok();
        }
        if self.driver_should_wake(c, due) {
            self.driver_cv.notify_all();
        }
        Ok(())
    }

    /// A failed attempt of the leased task in `slot` (nack or lease expiry):
    /// pushes its RETRY or DEAD record to `batch` and applies it. The caller
    /// appends `batch` under the same lock.
    fn fail_attempt(
        &self,
        core: &mut Core,
        slot: u32,
        retry_after: Option<Duration>,
        error: &str,
        now: Now,
        batch: &mut RecordBatch,
    ) -> NackOutcome {
        let error = clip_error(error);
        let now_ms = wall_ms(now);
        let Some(task) = core.tasks.get_mut(slot) else {
            return NackOutcome::Finished;
        };
        if let Some(timer) = task.timer.take() {
            core.wheel.remove(timer);
        }
        let id = task.id;
        if task.deliveries >= self.config.retry.max_attempts {
            let mut unreadable = None;
            batch.push(&Record::Dead {
                id,
                dead_ms: now_ms,
                error: error.as_bytes(),
            });
            let dead = DeadTask {
                key: core.payloads.key(&task.bytes).into(),
                // Delivered, so its payload was read into memory then; if
                // not, it is read now, and an unreadable one poisons.
                payload: match core.payloads.get(&task.bytes) {
                    Some(p) => p.into(),
                    None => match self.read_payload(task, core.payloads.key(&task.bytes)) {
                        Ok(p) => p,
                        Err(cause) => {
                            unreadable = Some(cause);
                            Box::default()
                        }
                    },
                },
                due_ms: task.due_ms,
                deliveries: task.deliveries,
                dead_ms: now_ms,
                error: error.as_bytes().into(),
            };
            core.insert_dead(id.0, dead);
            core.totals.tasks_dead_lettered += 1;
            self.forget_task(core, slot);
            if let Some(cause) = unreadable {
                self.poison_locked(core, cause);
            }
            return NackOutcome::DeadLettered;
        }
        let delay = retry_after.unwrap_or_else(|| self.config.retry.backoff(id.0, task.deliveries));
        let delay_ms = u64::try_from(delay.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let due_ms = now_ms.saturating_add(delay_ms);
        batch.push(&Record::Retry {
            id,
            due_ms,
            error: error.as_bytes(),
        });
        task.state = TaskState::Scheduled;
        task.due_ms = due_ms;
        let next_attempt = task.deliveries.saturating_add(1);
        core.in_flight_count -= 1;
        core.totals.retries += 1;
        let due_tick = self.placement_tick(core, due_ms, self.due_tick(due_ms, now));
        match core.wheel.insert(due_tick, slot) {
            Ok(timer) => {
                if let Some(task) = core.tasks.get_mut(slot) {
                    task.timer = Some(timer);
                }
                if self.driver_should_wake(core, due_tick) {
                    self.driver_cv.notify_all();
                }
            }
            Err(_) => {
                core.push_overdue(slot, id);
                if core.sleep != DriverSleep::Busy {
                    self.driver_cv.notify_all();
                }
            }
        }
        NackOutcome::Retry {
            next_attempt,
            due: ms_to_system_time(due_ms),
        }
    }

    /// At a clean shutdown: logs a RELEASE for every task handed out but not
    /// received — in the ready queue, or taken by a consumer still reading
    /// its payload from disk — so it is delivered again after reopen without
    /// counting as an attempt.
    pub(super) fn release_ready_locked(&self, core: &mut Core) {
        let mut batch = RecordBatch::default();
        let mut entries: Vec<ReadyEntry> = core.ready.drain(..).collect();
        entries.append(&mut core.receiving);
        for e in entries {
            let Some(task) = core.tasks.get_mut(e.slot).filter(|t| t.id == e.id) else {
                continue;
            };
            if task.state != TaskState::Ready {
                continue;
            }
            task.state = TaskState::Scheduled;
            task.deliveries = task.deliveries.saturating_sub(1);
            core.ready_count -= 1;
            batch.push(&Record::Release { id: e.id });
        }
        if !batch.is_empty() {
            // A failure poisons the engine; shutdown then reports it.
            let _ = self.append_locked(core, &batch.records());
        }
    }

    /// A copy of every dead letter, oldest id first, returned once everything logged so far
    /// is durable: the list reflects records that may not be yet (a purge or requeue that just
    /// took a dead letter, a nack that made one), and must not outlive a crash that undoes
    /// them. Without a log, or with nothing pending, it waits for nothing.
    /// Up to `max` dead letters whose ids are above `after` (all with
    /// `None`), oldest id first: found under the lock in O(log dead
    /// letters) (they are kept in id order), and only those copied.
    pub(super) fn dead_letters_after(&self, after: Option<TaskId>, max: usize) -> Vec<DeadLetter> {
        let core = self.core.lock();
        let floor = after.map_or(0, |id| id.0);
        let out: Vec<DeadLetter> = core
            .dead
            .after(floor)
            .take(max)
            .map(|(id, d)| DeadLetter {
                task_id: TaskId(id),
                key: d.key.to_vec(),
                payload: d.payload.to_vec(),
                attempts: d.deliveries,
                due_ms: d.due_ms,
                dead_ms: d.dead_ms,
                error: String::from_utf8_lossy(&d.error).into_owned(),
            })
            .collect();
        // A failed wait has poisoned the engine; the list is still what memory held (this
        // call has no error to return), and every later call reports the poisoning.
        let _ = self.wait_logged(core);
        out
    }

    /// The driver's tick for a clock reading.
    pub(super) fn tick_of(&self, now: Now) -> Tick {
        self.tick_at(now.engine_ns)
    }

    /// The tick that engine time `engine_ns` falls in.
    pub(super) fn tick_at(&self, engine_ns: u128) -> Tick {
        Tick((engine_ns / self.tick_ns) as u64)
    }
}

/// The driver thread's body: [`drive`], with a hand-out thread beside it
/// that waits for each pass's records to be durable and then puts its
/// deliveries in the ready queue, so that the driver goes on to the next
/// pass meanwhile (a task falling due while a pass's fdatasync — and under
/// `Config::proof_before_ack` the one proving it — is under way is logged
/// at once and rides the next group commit, instead of waiting for both
/// before its own). Passes are handed out in order. The hand-out thread
/// ends when the driver does, after the last pass is handed out: a clean
/// shutdown finds every delivery logged in the ready queue. If that thread
/// cannot be started, the driver waits for each pass itself.
pub(super) fn driver_loop(shared: &Shared) {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<AppendTicket>>();
        let started = if handout_thread_refused() {
            Err(std::io::Error::other("refused by a test"))
        } else {
            std::thread::Builder::new()
                .name("kairos-handout".into())
                .spawn_scoped(scope, move || {
                    super::poison_on_panic(shared, "kairos-handout", || handout_loop(shared, rx))
                })
        };
        #[cfg(test)]
        shared.handout_thread.store(
            if started.is_ok() {
                HANDOUT_THREAD_STARTED
            } else {
                HANDOUT_THREAD_REFUSED
            },
            std::sync::atomic::Ordering::SeqCst,
        );
        drive(shared, started.is_ok().then_some(tx));
        // The sender is gone: the hand-out thread finishes and is joined.
    });
    shared.idle_cv.notify_all();
    shared.notify_ready();
}

/// Tests: while above 0 (tests refusing at the moment), a driver starting
/// up does not start its hand-out thread, as if the spawn had failed, so
/// that the driver's own wait runs.
#[cfg(test)]
pub(super) static REFUSE_HANDOUT_THREAD: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// `Shared::handout_thread` before the driver has decided.
#[cfg(test)]
pub(super) const HANDOUT_THREAD_UNKNOWN: u8 = 0;
/// `Shared::handout_thread`: the driver has a hand-out thread.
#[cfg(test)]
pub(super) const HANDOUT_THREAD_STARTED: u8 = 1;
/// `Shared::handout_thread`: it has none (refused by a test).
#[cfg(test)]
pub(super) const HANDOUT_THREAD_REFUSED: u8 = 2;

/// Whether a test refuses the hand-out thread.
#[cfg(test)]
fn handout_thread_refused() -> bool {
    REFUSE_HANDOUT_THREAD.load(std::sync::atomic::Ordering::SeqCst) > 0
}

/// Never outside unit tests.
#[cfg(not(test))]
fn handout_thread_refused() -> bool {
    false
}

/// Waits for each pass's tickets in order, then hands out that pass's
/// deliveries (the oldest of `Core::handouts_pending`). A failed wait has
/// poisoned the engine: that pass's deliveries are not handed out (nor any
/// later pass's: the log is poisoned).
fn handout_loop(shared: &Shared, rx: std::sync::mpsc::Receiver<Vec<AppendTicket>>) {
    for tickets in rx {
        let durable = shared.all_durable(tickets);
        let mut core = shared.core.lock();
        #[cfg(test)]
        if *shared.panic_in_pass.lock() == Some(true) {
            panic!("a hand-out pass panicked (test)");
        }
        shared.hand_out_passes(&mut core, 1, durable);
        drop(core);
        shared.idle_cv.notify_all();
    }
}

impl Shared {
    /// Waits until each of `tickets` is durable; false as soon as one
    /// fails (the engine is then poisoned).
    fn all_durable(&self, tickets: Vec<AppendTicket>) -> bool {
        tickets
            .into_iter()
            .all(|ticket| self.wait_durable(Some(ticket)).is_ok())
    }

    /// Takes the `passes` oldest passes of `Core::handouts_pending` and, if
    /// their records are `durable`, puts their deliveries in the ready queue
    /// (those cancelled or rescheduled meanwhile are skipped when popped).
    fn hand_out_passes(&self, core: &mut Core, passes: usize, durable: bool) {
        debug_assert!(
            passes <= core.handouts_pending.len(),
            "a pass handed out twice"
        );
        for _ in 0..passes {
            let Some(entries) = core.handouts_pending.pop_front() else {
                break;
            };
            if durable && !entries.is_empty() {
                core.ready.extend(entries);
                self.notify_ready();
            }
        }
    }
}

/// The driver: advances the wheel by the clock, logs deliveries and failed
/// leases, hands due tasks to the ready queue once their records are
/// durable (through `handouts` when there is a hand-out thread), sleeps
/// until the next deadline. Never blocks on consumers: the ready queue is
/// unbounded.
fn drive(shared: &Shared, handouts_tx: Option<std::sync::mpsc::Sender<Vec<AppendTicket>>>) {
    let mut expired: Vec<Expired> = Vec::new();
    let mut due: Vec<(u32, TaskId)> = Vec::new();
    let mut handouts: Vec<ReadyEntry> = Vec::new();
    let mut batch = RecordBatch::default();
    let rate = shared.config.catch_up_tasks_per_sec.map(u128::from);
    let mut core = shared.core.lock();
    loop {
        if core.stop {
            break;
        }
        core.sleep = DriverSleep::Busy;
        #[cfg(test)]
        if *shared.panic_in_pass.lock() == Some(false) {
            panic!("a driver pass panicked (test)");
        }
        let mut now = shared.now();
        let driver_promotes = shared.driver_promotes();
        // When the driver promotes far tasks: once the first is within the
        // far span. When the prefetch thread does (well ahead of their due
        // time), the driver still does it once one is due already — the
        // clock jumped (a manual clock's advance, a wall-clock step), or the
        // prefetch thread fell behind — before it advances the wheel, so
        // that no task due later is handed out first, and `run_until_idle`
        // finds every task that fell due handed out.
        let promotion_due = |core: &Core, now: Now| {
            let at = if driver_promotes {
                shared.next_promotion_ms(core)
            } else {
                shared.next_far_due_ms(core)
            };
            at.is_some_and(|at| at <= wall_ms(now))
        };
        if promotion_due(&core, now) {
            core = shared.promote_far(core);
            if core.stop {
                break;
            }
            // The promotion let go of the lock: read the clock again under
            // it (a task placed meanwhile by a later reading must not be
            // handed out with an earlier hand-out time), and promote again
            // first if that reading needs it — else the wheel could pass a
            // far task this promotion left out (the clock jumped by more
            // than the far span), which would then come after tasks due
            // later.
            now = shared.now();
            if promotion_due(&core, now) {
                continue;
            }
        }
        let now_tick = shared.tick_of(now);
        due.clear();
        // Paused: nothing is taken, and the wheel stands still (it catches
        // up, in due order, at resume).
        let paused = core.paused;
        if !paused {
            // Live entries only, taken before the wheel advances: once it
            // clears the timers of what it expires, a stale entry of a task
            // rescheduled into the wheel would pass for live and hand the
            // task out ahead of tasks due before it.
            core.take_overdue(&mut due);
        }
        // The catch-up backlog, oldest first, within the rate limit.
        let mut next_token_ns = None;
        if !paused && !core.backlog.is_empty() {
            let allowed = match rate {
                None => u64::MAX,
                Some(rate) => {
                    let since_ns = now.engine_ns.saturating_sub(core.catch_up_start_ns);
                    let earned =
                        u64::try_from(since_ns * rate / 1_000_000_000 + 1).unwrap_or(u64::MAX);
                    earned.saturating_sub(core.backlog_taken)
                }
            };
            let mut taken = 0;
            while taken < allowed {
                let Some((slot, id)) = core.backlog.pop_front() else {
                    break;
                };
                if core.tasks.waits_in_backlog(slot, id) {
                    due.push((slot, id));
                    taken += 1;
                }
            }
            core.backlog_taken += taken;
            if let (Some(rate), false) = (rate, core.backlog.is_empty()) {
                // When the next task is earned: taken = rate × t + 1.
                let at = u128::from(core.backlog_taken) * 1_000_000_000 / rate;
                next_token_ns = Some(core.catch_up_start_ns + at + 1);
            }
        }
        if !paused && now_tick > core.wheel.elapsed() {
            expired.clear();
            core.wheel.advance(now_tick, &mut expired);
            for e in &expired {
                if let Some(t) = core.tasks.get_mut(e.item) {
                    t.timer = None;
                    due.push((e.item, t.id));
                }
            }
        }
        if due.is_empty() {
            core.processed_ns = now.engine_ns;
            core.processed_wall_ns = now.wall_ns;
            shared.idle_cv.notify_all();
            let wheel_ns = core
                .wheel
                .next_deadline()
                .filter(|_| !paused)
                .map(|d| u128::from(d.0) * shared.tick_ns);
            // Far tasks to promote: see `promotion_due`.
            let promote_ms = if driver_promotes {
                shared.next_promotion_ms(&core)
            } else {
                shared.next_far_due_ms(&core)
            };
            let promote_ns =
                promote_ms.map(|ms| u128::from(shared.due_tick(ms, now).0) * shared.tick_ns);
            let next_ns = [wheel_ns, next_token_ns, promote_ns]
                .into_iter()
                .flatten()
                .min();
            core.sleep = match next_ns {
                None => DriverSleep::Forever,
                Some(ns) => {
                    DriverSleep::Until(Tick(u64::try_from(ns / shared.tick_ns).unwrap_or(u64::MAX)))
                }
            };
            match next_ns {
                Some(at_ns) if !shared.clock.is_manual() => {
                    let wait_ns = at_ns.saturating_sub(shared.now_ns());
                    let wait = Duration::from_nanos(u64::try_from(wait_ns).unwrap_or(u64::MAX));
                    if !wait.is_zero() {
                        shared.driver_cv.wait_for(&mut core, wait);
                    }
                }
                _ => shared.driver_cv.wait(&mut core),
            }
            continue;
        }
        // The wall clock read again, after the monotonic reading that made these tasks due:
        // `now` reads the wall clock first (for due-time arithmetic), so a driver preempted
        // between its two readings would stamp tasks with a wall time before they fell due.
        let fired_ms = crate::clock::system_time_to_ms(shared.clock.now_wall())
            .unwrap_or(0)
            .max(wall_ms(now));
        let lease_error = lease_expired_error(shared.config.lease);
        handouts.clear();
        batch.clear();
        for &(slot, id) in &due {
            // Cancelled meanwhile, or stale: entries from the wheel had their
            // timer cleared above; an overdue or backlog entry whose task has
            // a timer again (it was rescheduled, or leased) is stale. Read
            // first: `get_mut` would copy the task for a checkpoint's
            // snapshot.
            if !core
                .tasks
                .get(slot)
                .is_some_and(|t| t.id == id && t.timer.is_none())
            {
                continue;
            }
            let Some(task) = core.tasks.get_mut(slot) else {
                continue;
            };
            match task.state {
                TaskState::Scheduled => {
                    task.state = TaskState::Ready;
                    task.timer = None;
                    task.deliveries = task.deliveries.saturating_add(1);
                    core.tasks.set_in_backlog(slot, false);
                    core.ready_count += 1;
                    batch.push(&Record::Deliver { id, fired_ms });
                    handouts.push(ReadyEntry { slot, id, fired_ms });
                }
                TaskState::Leased => {
                    core.totals.lease_expiries += 1;
                    shared.fail_attempt(&mut core, slot, None, &lease_error, now, &mut batch);
                }
                // Cancelled while held, and its holder never answered.
                TaskState::Abandoned => {
                    core.totals.lease_expiries += 1;
                    shared.forget_task(&mut core, slot);
                }
                TaskState::Ready => {}
            }
        }
        // One frame per chunk keeps a huge pass (a backlog after downtime)
        // within the log's frame size.
        let mut tickets = Vec::new();
        let mut from = 0;
        while from < batch.len() {
            let to = (from + PASS_CHUNK_RECORDS).min(batch.len());
            let records = batch.records_from(from);
            match shared.append_locked(&mut core, &records[..to - from]) {
                // `None`: an engine without a log.
                Ok(ticket) => tickets.extend(ticket),
                Err(cause) => {
                    shared.poison_locked(&mut core, cause);
                    return;
                }
            }
            from = to;
        }
        if tickets.is_empty() {
            // No log: consumers may take them now.
            if !handouts.is_empty() {
                core.ready.extend(handouts.drain(..));
                shared.notify_ready();
            }
            continue;
        }
        // Handed out once durable; meanwhile in the core, where a
        // reschedule finds (and drops) a task's entry.
        core.handouts_pending
            .push_back(std::mem::take(&mut handouts));
        // Sent under the lock: the hand-out thread takes passes in order.
        let unsent = match &handouts_tx {
            Some(tx) => tx.send(tickets).err().map(|e| e.0),
            None => Some(tickets),
        };
        if let Some(tickets) = unsent {
            // No hand-out thread (it could not start, or it ended: passes it
            // was sent are lost with it): wait here. The log syncs a prefix,
            // so these records durable means every earlier pass's are too.
            drop(core);
            let durable = shared.all_durable(tickets);
            core = shared.core.lock();
            let passes = core.handouts_pending.len();
            shared.hand_out_passes(&mut core, passes, durable);
            shared.idle_cv.notify_all();
            if !durable {
                return;
            }
        }
    }
}

impl Shared {
    /// Removes dead letter `id`. Returns false if there was none.
    pub(super) fn purge_dead_letter(&self, id: TaskId) -> Result<bool, crate::CancelError> {
        self.purge_dead_letter_with(id, &Blocking)
    }

    /// [`Shared::purge_dead_letter`], waiting for durability as `wait` says.
    pub(super) fn purge_dead_letter_with<W: WaitMode>(
        &self,
        id: TaskId,
        wait: &W,
    ) -> Result<bool, crate::CancelError> {
        let mut core = self.core.lock();
        core.check_open().map_err(super::status_to_cancel_error)?;
        if !core.dead.contains(id.0) {
            // Gone by a record (a purge, a requeue) that may not be durable yet.
            self.wait_logged_with(core, wait)
                .map_err(|cause| crate::CancelError::Poisoned { cause })?;
            return Ok(false);
        }
        let ticket = self
            .log_ids(&mut core, crate::record::RECORD_PURGE, [id], |id| {
                Record::Purge { id }
            })
            .map_err(|cause| crate::CancelError::Poisoned { cause })?;
        core.remove_dead(id.0);
        core.totals.dead_letters_purged += 1;
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| crate::CancelError::Poisoned { cause })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CancelOutcome, Config, Due, Engine, ManualClock};
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    use kairos_wal::SimStorage;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    const START_MS: u64 = 1_700_000_000_000;

    /// A dead letter's `Debug` shows its key as text and its payload's
    /// length, as a delivery's does (it showed both as byte arrays).
    #[test]
    fn a_dead_letters_debug_shows_the_key_as_text_and_the_payload_length() {
        let d = DeadLetter {
            task_id: TaskId(7),
            key: b"order:7".to_vec(),
            payload: vec![0; 300],
            attempts: 3,
            due_ms: 10,
            dead_ms: 20,
            error: "boom".into(),
        };
        assert_eq!(
            format!("{d:?}"),
            "DeadLetter { task_id: TaskId(7), key: \"order:7\", payload_bytes: 300, \
             attempts: 3, due_ms: 10, dead_ms: 20, error: \"boom\" }"
        );
        // The times as `SystemTime`, as `Delivery::due` and `TaskInfo::due` give them.
        let epoch = std::time::SystemTime::UNIX_EPOCH;
        assert_eq!(d.due(), epoch + Duration::from_millis(10));
        assert_eq!(d.dead_at(), epoch + Duration::from_millis(20));
    }

    /// While paused nothing drains the overdue queue, yet it stays within
    /// twice the live tasks (plus `OVERDUE_KEPT_MIN`) however often tasks
    /// due before the pause are rescheduled, or scheduled and cancelled;
    /// the one live task is handed out once at the resume.
    #[test]
    fn the_overdue_queue_stays_bounded_while_paused() {
        let clock = ManualClock::new(START_MS);
        let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone())).unwrap();
        engine.pause_deliveries();
        let past = Due::At(crate::clock::ms_to_system_time(START_MS - 1_000));
        engine.schedule(b"k", past, b"").unwrap();
        let mut longest = 0;
        for i in 0..20_000u32 {
            let key = format!("n{i}");
            engine.reschedule(b"k", past, None).unwrap();
            engine.schedule(key.as_bytes(), past, b"").unwrap();
            let _ = engine.cancel(key.as_bytes()).unwrap();
            if i % 100 == 0 {
                engine.run_until_idle();
                longest = longest.max(engine.shared.core.lock().overdue.len());
            }
        }
        assert!(
            longest <= super::super::OVERDUE_KEPT_MIN + 1,
            "{longest} entries"
        );
        engine.resume_deliveries();
        engine.run_until_idle();
        let consumer = engine.consumer();
        assert_eq!(
            consumer.try_recv().map(|d| d.key().to_vec()),
            Ok(b"k".to_vec())
        );
        assert!(consumer.try_recv().is_err());
    }

    /// Paused for an hour, the relocation trigger counts a task due in 10 s
    /// from now as near, as when running (not from the wheel's stand-still
    /// tick an hour back, beyond the far span).
    #[test]
    fn a_near_task_scheduled_while_paused_does_not_count_as_far() {
        for paused in [false, true] {
            let clock = ManualClock::new(START_MS);
            let config = Config {
                checkpoint_interval: None,
                checkpoint_log_bytes: None,
                ..Config::default()
            };
            let engine = Engine::open_with(
                "/k",
                config,
                Arc::new(SimStorage::new(3)),
                Arc::new(clock.clone()),
            )
            .unwrap();
            assert!(engine.shared.relocation_horizon_ticks.is_some());
            if paused {
                engine.pause_deliveries();
            }
            clock.advance(std::time::Duration::from_secs(3_600));
            engine.run_until_idle();
            for i in 0..100 {
                let key = format!("t{i}");
                engine
                    .schedule_after(key.as_bytes(), std::time::Duration::from_secs(10), b"p")
                    .unwrap();
            }
            assert_eq!(
                engine.shared.core.lock().far_scheduled,
                0,
                "paused: {paused}"
            );
        }
    }

    /// Opens an engine on `sim` whose driver has no hand-out thread (the
    /// spawn refused, as if it had failed), and checks that it has none.
    /// Engines other tests open meanwhile may go without one too: the same
    /// contract holds either way.
    fn engine_without_handout_thread(sim: &SimStorage, clock: &ManualClock) -> Engine {
        struct Refusal;
        impl Drop for Refusal {
            fn drop(&mut self) {
                REFUSE_HANDOUT_THREAD.fetch_sub(1, Ordering::SeqCst);
            }
        }
        REFUSE_HANDOUT_THREAD.fetch_add(1, Ordering::SeqCst);
        let refusal = Refusal;
        let engine = Engine::open_with(
            "/k",
            Config::default(),
            Arc::new(sim.clone()),
            Arc::new(clock.clone()),
        )
        .expect("open");
        // The driver decides when it starts: wait for it before lifting the refusal.
        let decided = || engine.shared.handout_thread.load(Ordering::SeqCst);
        wait_until("the driver started", || decided() != HANDOUT_THREAD_UNKNOWN);
        drop(refusal);
        assert_eq!(decided(), HANDOUT_THREAD_REFUSED);
        engine
    }

    fn at(offset_ms: u64) -> Due {
        Due::At(ms_to_system_time(START_MS + offset_ms))
    }

    /// Polls `done` every millisecond until it holds; panics naming `what`
    /// after 30 s.
    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The driver's own wait: each pass is handed out once its records are
    /// durable, in due order, and nothing cancelled or not yet due is.
    #[test]
    fn without_a_hand_out_thread_the_driver_hands_out_each_pass_itself() {
        let sim = SimStorage::new(11);
        let clock = ManualClock::new(START_MS);
        let engine = engine_without_handout_thread(&sim, &clock);
        let consumer = engine.consumer();
        for (key, due_ms) in [("a", 1_000), ("b", 2_000), ("c", 2_000), ("d", 3_000)] {
            engine
                .schedule(key.as_bytes(), at(due_ms), key.as_bytes())
                .expect("schedule");
        }
        assert_eq!(
            engine.cancel(b"c").expect("cancel"),
            CancelOutcome::Cancelled { deliveries: 0 }
        );
        let mut got = Vec::new();
        for _ in 0..3 {
            clock.advance(Duration::from_secs(1));
            engine.run_until_idle();
            let mut pass = Vec::new();
            while let Ok(d) = consumer.try_recv() {
                assert_eq!(d.key(), d.payload());
                pass.push(String::from_utf8_lossy(d.key()).into_owned());
                consumer.ack(&d).expect("ack");
            }
            got.push(pass);
        }
        assert_eq!(got, [vec!["a"], vec!["b"], vec!["d"]]);
        assert_eq!(engine.stats().pending, 0);
        assert_eq!(
            engine.cancel(b"a").expect("cancel"),
            CancelOutcome::NotFound,
            "acked tasks are gone"
        );
        engine.shutdown().expect("shutdown");
    }

    /// A pass whose fdatasync fails is not handed out: the engine is
    /// poisoned, `run_until_idle` still returns, and no consumer gets it.
    #[test]
    fn without_a_hand_out_thread_a_failed_sync_hands_nothing_out() {
        let sim = SimStorage::new(12);
        let clock = ManualClock::new(START_MS);
        let engine = engine_without_handout_thread(&sim, &clock);
        let consumer = engine.consumer();
        engine.schedule(b"x", at(1_000), b"x").expect("schedule");
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        clock.advance(Duration::from_secs(1));
        engine.run_until_idle();
        // The failed wait poisons the engine (run_until_idle returns at once) before the
        // driver takes its pass out of the pending ones: wait for that, then look.
        wait_until("the failed pass settled", || {
            engine.shared.core.lock().handouts_pending.is_empty()
        });
        assert!(
            engine.shared.core.lock().ready.is_empty(),
            "the delivery whose record did not sync is not handed out"
        );
        assert!(matches!(
            consumer.try_recv(),
            Err(RecvError::Poisoned { .. })
        ));
        assert!(engine.schedule(b"y", at(5_000), b"y").is_err());
    }

    #[test]
    fn error_texts_are_clipped_at_a_character_boundary() {
        let long = "é".repeat(ERROR_BYTES_MAX);
        let clipped = clip_error(&long);
        assert!(clipped.len() <= ERROR_BYTES_MAX);
        assert!(clipped.len() >= ERROR_BYTES_MAX - 1);
        assert_eq!(clip_error("short"), "short");
    }

    /// A task made ready between a poll's first look and the filing of its waker wakes no
    /// one (nothing is filed yet): the poll's second look finds it.
    #[test]
    fn a_task_made_ready_while_the_waker_is_filed_is_not_missed(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let clock = ManualClock::new(1_700_000_000_000);
        let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
        let consumer = engine.consumer();
        *engine.shared.recv_async_hook.lock() = Some(Box::new(|shared| {
            let task = crate::NewTask {
                key: b"between",
                due: crate::Due::After(std::time::Duration::ZERO),
                payload: b"",
            };
            assert!(shared.schedule_one(&task).is_ok());
            shared.run_until_idle();
        }));
        let mut next = Box::pin(consumer.recv_async());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::future::Future::poll(next.as_mut(), &mut cx) {
            std::task::Poll::Ready(Ok(d)) => assert_eq!(d.key(), b"between"),
            other => return Err(format!("expected the task, got {other:?}").into()),
        }
        assert!(
            engine.shared.recv_async_hook.lock().is_none(),
            "hook not run"
        );
        engine.shutdown()?;
        Ok(())
    }
}
