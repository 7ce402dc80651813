//! The consumer side: a handle that receives due tasks, and the delivery it
//! hands out. The ready queue behind it is internal.

use crate::clock::ms_to_system_time;
use crate::engine::{AckScheduleOutcome, NackOutcome, Shared, Wait};
use crate::error::{AckError, AckScheduleError, RecvError};
use crate::task::TaskId;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

/// A task handed to a consumer.
///
/// At least once (the default), the consumer holds a lease on it for
/// `Config::lease`: [`Consumer::ack`] finishes the task, [`Consumer::nack`]
/// reports a failed attempt (retried with backoff, or dead-lettered after
/// `max_attempts`), [`Consumer::extend_lease`] keeps a long job's lease
/// alive. A lease that expires counts as a failed attempt. At most once,
/// the task is already finished when the consumer gets it; ack is a no-op.
#[derive(Clone)]
pub struct Delivery {
    /// The engine instance that made it; only that one accepts its ack.
    pub(crate) engine_id: u64,
    pub(crate) task_id: TaskId,
    pub(crate) slot: u32,
    pub(crate) key: Box<[u8]>,
    pub(crate) payload: Vec<u8>,
    pub(crate) due_ms: u64,
    pub(crate) fired_ms: u64,
    pub(crate) attempt: u32,
    pub(crate) at_most_once: bool,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("task_id", &self.task_id)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("payload_bytes", &self.payload.len())
            .field("due_ms", &self.due_ms)
            .field("fired_ms", &self.fired_ms)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl Delivery {
    /// The engine-assigned id of the task.
    pub fn task_id(&self) -> TaskId {
        self.task_id
    }
    /// The caller-chosen key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    /// The payload bytes, taken out of the delivery without a copy — once
    /// it has been acked or nacked (those take the delivery by reference),
    /// or for a delivery taken at most once.
    pub fn into_payload(self) -> Vec<u8> {
        self.payload
    }
    /// The due time, UTC milliseconds since the Unix epoch.
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }
    /// The due time.
    pub fn due(&self) -> SystemTime {
        ms_to_system_time(self.due_ms)
    }
    /// Wall time at which the driver handed the task out, UTC ms.
    pub fn fired_ms(&self) -> u64 {
        self.fired_ms
    }
    /// How late the hand-out was: `fired − due`, zero if on time. A task that
    /// fell due while the engine was closed shows the downtime here.
    pub fn lateness(&self) -> Duration {
        Duration::from_millis(self.fired_ms.saturating_sub(self.due_ms))
    }
    /// 1 for the first delivery, 2 for the first redelivery (after a nack,
    /// a lease expiry or a restart), …
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// A handle for receiving due tasks. Clone it freely: any number of consumer
/// threads may receive, and each delivery goes to exactly one of them (a
/// task is handed to another consumer only after its lease ends).
///
/// A handle may outlive its [`crate::Engine`]: once the engine is shut down
/// or dropped, it answers [`RecvError::Closed`] and [`AckError::Closed`]
/// (or `Poisoned`), and keeps only a few tens of KiB of the engine's state —
/// the tasks' memory is freed then, not when the last handle goes.
///
/// A worker pool: each thread loops on [`Consumer::recv`] until the engine
/// stops, acks what it finished and nacks what failed (retried after the
/// [`crate::RetryPolicy`] backoff, dead-lettered after its last attempt).
///
/// ```
/// use kairos::{AckError, Config, Consumer, Delivery, Engine, ManualClock, RecvError};
/// use std::{sync::Arc, time::Duration};
///
/// // The work itself: `Err(text)` has the task tried again.
/// fn cancel_order(task: &Delivery) -> Result<(), String> {
///     match task.attempt() {
///         1 => Err("order service unavailable".into()),
///         _ => Ok(()),
///     }
/// }
///
/// fn worker(consumer: Consumer) -> Result<(), RecvError> {
///     loop {
///         let task = match consumer.recv() {
///             Ok(task) => task,
///             Err(RecvError::Closed) => return Ok(()), // the engine shut down
///             Err(e) => return Err(e),                 // Poisoned: alert, reopen
///         };
///         let answer = match cancel_order(&task) {
///             Ok(()) => consumer.ack(&task),
///             // `None`: after the retry policy's backoff.
///             Err(text) => consumer.nack(&task, None, &text).map(|_| ()),
///         };
///         match answer {
///             Ok(()) => {}
///             // Too late: the lease ran out (another attempt follows), or the task
///             // is finished. Nothing changed.
///             Err(AckError::LeaseExpired { .. } | AckError::NotOutstanding { .. }) => {}
///             Err(AckError::Closed) => return Ok(()),
///             Err(e) => eprintln!("task {:?}: {e}", task.task_id()),
///         }
///     }
/// }
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
/// let workers: Vec<_> = (0..2)
///     .map(|_| {
///         let consumer = engine.consumer();
///         std::thread::spawn(move || worker(consumer))
///     })
///     .collect();
///
/// engine.schedule_after(b"order:7:timeout", Duration::from_secs(60), b"")?;
/// // Attempt 1 fails; attempt 2, due within a second (the default backoff), succeeds.
/// for _ in 0..10_000 {
///     if engine.stats().pending == 0 {
///         break;
///     }
///     clock.advance(Duration::from_millis(100));
///     engine.run_until_idle();
///     std::thread::sleep(Duration::from_millis(1));
/// }
/// assert_eq!(engine.stats().pending, 0);
/// assert!(engine.dead_letters().is_empty());
///
/// engine.shutdown()?; // the workers' `recv` answers `Closed`
/// for w in workers {
///     w.join().expect("worker panicked")?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Consumer {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer").finish_non_exhaustive()
    }
}

impl Consumer {
    /// Blocks until a task is delivered.
    ///
    /// # Errors
    /// [`RecvError::Closed`] once the engine is shut down (or dropped);
    /// [`RecvError::Poisoned`] if it stopped after an I/O failure — as the
    /// failure happens, also one no call waited for (the log's `Interval`
    /// sync, a write-back), or after a panic in a thread delivery needs.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        self.shared.receive(Wait::Forever)
    }

    /// Like [`Consumer::recv`], giving up after `timeout` with
    /// [`RecvError::Timeout`]. The timeout is real time (an [`Instant`]),
    /// also for an engine on a [`crate::ManualClock`]: moving that clock
    /// does not bring it on. One too long for an `Instant` waits like
    /// [`Consumer::recv`].
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.shared.receive(Wait::Until(deadline)),
            None => self.recv(),
        }
    }

    /// Receives the next delivery without blocking a thread: the returned
    /// future is ready when a task is (or when the engine stops, with the
    /// answers of [`Consumer::recv`]), for consumers on an async runtime
    /// (tokio, async-std, smol, ...; Kairos depends on none). Any number of
    /// futures may wait at once, on any consumers of the engine; each task
    /// goes to one of them (a task made ready wakes every waiting future,
    /// as it wakes every blocked `recv`, and one takes it). So each task
    /// made ready costs a poll of every waiting future, each taking the
    /// engine's lock: a few waiting futures that hand tasks on to workers
    /// scale better than thousands waiting at once.
    ///
    /// Dropping the future before it is ready gives nothing up: it holds no
    /// task until it returns one (cancel-safe, for `select!` and timeouts),
    /// and its waker is forgotten at once.
    ///
    /// A poll takes the engine's lock as [`Consumer::try_recv`] does and
    /// does the same work, so it can briefly block its thread where
    /// `try_recv` would: reading the payload of a task kept on disk
    /// ([`crate::Config::payload_window`]) and, at most once
    /// ([`crate::DeliveryGuarantee::AtMostOnce`]), waiting for the task's
    /// ack record to be durable (one fdatasync under `Sync`) before
    /// returning it. At least once with payloads in memory, a poll never
    /// waits for the disk. The engine wakes a waiting future's waker while
    /// it holds its internal lock, so a waker must only schedule the future
    /// (as every common executor's does), never poll it inline: that poll
    /// would wait for the lock its own wake holds.
    ///
    /// ```
    /// use kairos::{Config, Engine, ManualClock};
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::sync::Arc;
    /// use std::task::{Context, Poll, Waker};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    /// let consumer = engine.consumer();
    /// let mut next = pin!(consumer.recv_async());
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(next.as_mut().poll(&mut cx).is_pending()); // nothing due yet
    /// engine.schedule_after(b"session:42", std::time::Duration::ZERO, b"")?;
    /// engine.run_until_idle();
    /// let Poll::Ready(delivery) = next.as_mut().poll(&mut cx) else {
    ///     panic!("a due task was not received");
    /// };
    /// consumer.ack(&delivery?)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Consumer::recv`]: the future answers [`RecvError::Closed`] once
    /// the engine is shut down or dropped, [`RecvError::Poisoned`] once it
    /// stopped after a failure.
    pub fn recv_async(&self) -> Recv<'_> {
        Recv {
            consumer: self,
            waiter: None,
        }
    }

    /// Returns a ready task without blocking, or [`RecvError::Empty`].
    pub fn try_recv(&self) -> Result<Delivery, RecvError> {
        self.shared.receive(Wait::No)
    }

    /// A blocking iterator over deliveries; it ends when the engine stops —
    /// shut down, dropped, or poisoned (by an I/O failure, or by a panic in
    /// one of its threads: a bug) alike. To tell them apart (a poisoned
    /// engine wants an alert and a reopen), loop on
    /// [`Consumer::recv`] instead: it returns [`RecvError::Closed`] or
    /// [`RecvError::Poisoned`] with the cause.
    pub fn iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(move || self.recv().ok())
    }

    /// Acknowledges a delivery: the task is finished and will not be
    /// delivered again. Under `Durability::Sync` the ack is durable when this
    /// returns. At most once: a no-op.
    ///
    /// # Errors
    /// [`AckError::LeaseExpired`] if this attempt is over (the lease ran
    /// out, or it was nacked) and the task will be tried again;
    /// [`AckError::NotOutstanding`] if the task is finished (acked,
    /// cancelled, dead-lettered — also when the last attempt's lease ran
    /// out) or the delivery is from before a restart or another engine;
    /// `Closed`; `Poisoned`. An error changes nothing, except `Poisoned`,
    /// whose outcome is unknown (the ack record may have reached the disk;
    /// see [`AckError`]). The answer depends on
    /// the log and the clock only, never on the driver's timing.
    pub fn ack(&self, delivery: &Delivery) -> Result<(), AckError> {
        self.shared.ack_many(std::slice::from_ref(delivery))
    }

    /// Acknowledges many deliveries with one log write: all of them, or none
    /// if any is not outstanding (the error names the first) — a delivery
    /// given twice is, the second time ([`AckError::NotOutstanding`]).
    ///
    /// # Errors
    /// As [`Consumer::ack`], plus `BatchTooLarge`.
    pub fn ack_many(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.shared.ack_many(deliveries)
    }

    /// Acknowledges `delivery` and schedules a new task with the same key,
    /// due at `due`, with `payload`, in one log write: after any crash either
    /// both happened or neither did (and the delivery comes again). This is
    /// how a recurring task under one key is made crash-safe: an `ack`
    /// followed by a `schedule` loses the next occurrence to a crash in
    /// between, and a `schedule` first is
    /// [`crate::ScheduleError::AlreadyExists`] (the held task owns the key
    /// until it is acked). Pass `delivery.payload()` to keep the payload.
    /// Under `Durability::Sync` both are durable when this returns.
    ///
    /// If the task was cancelled while held (the cancel answered
    /// [`crate::CancelOutcome::AlreadyDelivered`]), the delivery is
    /// acknowledged and nothing is scheduled
    /// ([`AckScheduleOutcome::CancelledWhileHeld`]): a cancel ends the
    /// series. At most once ([`crate::DeliveryGuarantee::AtMostOnce`]) the
    /// delivery finished when it was received, so this is a plain schedule
    /// of its key: a cancel made meanwhile found nothing to stop it.
    ///
    /// Cost: O(1), an ack and a schedule under one hold of the engine's lock
    /// and one log append (one group commit under `Sync`). The new task is
    /// a task of its own: a new id, attempt count 0, counted in
    /// [`crate::Stats::tasks_scheduled`]; the ack counts in
    /// [`crate::Stats::acks`] (at least once: at most once, receipts count
    /// no acks).
    ///
    /// ```
    /// use kairos::{AckScheduleOutcome, Config, Due, Engine, ManualClock};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    /// let consumer = engine.consumer();
    /// let hour = Duration::from_secs(3600);
    /// engine.schedule_after(b"report:daily", hour, b"team-a")?;
    /// for _ in 0..3 {
    ///     clock.advance(hour);
    ///     engine.run_until_idle();
    ///     let run = consumer.try_recv()?;
    ///     // ... the work ...
    ///     let next = consumer.ack_and_schedule(&run, Due::After(hour), run.payload())?;
    ///     assert!(matches!(next, AckScheduleOutcome::Scheduled(_)));
    /// }
    /// assert_eq!(engine.stats().acks, 3);
    /// assert_eq!(engine.stats().pending, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`AckScheduleError::Ack`] as [`Consumer::ack`] answers
    /// (`LeaseExpired`, `NotOutstanding`, `Closed`, `Poisoned`);
    /// [`AckScheduleError::Schedule`] as [`crate::Engine::schedule`] refuses
    /// the new task (payload too large, due time out of range; at most once
    /// also `AlreadyExists`, `TooManyPending`). The new task's payload and
    /// due time are checked first, so their refusal comes before any about
    /// the delivery. An error changes nothing, except `Poisoned`, whose
    /// outcome is unknown (both records or neither, after a reopen).
    pub fn ack_and_schedule(
        &self,
        delivery: &Delivery,
        due: crate::Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.shared.ack_and_schedule(delivery, due, payload)
    }

    /// Reports a failed attempt with its `error` text (kept, up to 4 KiB,
    /// with a dead letter). If the task has deliveries left, its next attempt
    /// is due `retry_after` from now, or after the retry policy's backoff if
    /// `None`; otherwise it is dead-lettered. If the task was cancelled while
    /// held, it is finished. Under `Sync` the outcome is durable when this
    /// returns.
    ///
    /// # Errors
    /// As [`Consumer::ack`] (an expired lease was already counted as the
    /// failure); `RetryTooFar` past `Config::delay_max`; at most once,
    /// `NotOutstanding`.
    pub fn nack(
        &self,
        delivery: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.shared.nack(delivery, retry_after, error)
    }

    /// Heartbeat: the lease now ends `lease` from now (1 ms..=12 h; at the
    /// first tick that starts at or after that, as `Config::lease`), for
    /// work that takes longer than `Config::lease`. Not logged: a restart
    /// ends every lease.
    ///
    /// # Errors
    /// As [`Consumer::ack`]; `InvalidLease`; `NotOutstanding` for a
    /// delivery taken at most once (it holds no lease).
    pub fn extend_lease(&self, delivery: &Delivery, lease: Duration) -> Result<(), AckError> {
        self.shared.extend_lease(delivery, lease)
    }

    /// Whether `delivery`'s attempt is still this engine's outstanding lease
    /// on its task: the task is live under its key, held by a consumer, in
    /// this attempt. `false` once it was cancelled while held (the cancel
    /// answered [`crate::CancelOutcome::AlreadyDelivered`]), acked, nacked,
    /// dead-lettered, or its lease ran out and the driver processed that;
    /// also for a delivery taken at most once (already finished when
    /// received) and for one from another engine (before a restart). A
    /// worker checks it before irreversible work without holding the
    /// [`crate::Engine`]; the answer can be out of date at once (a cancel may
    /// follow it), so the compensation on `AlreadyDelivered` still has to be
    /// there. Durability and cost as [`crate::Engine::lookup`].
    ///
    /// ```
    /// use kairos::{CancelOutcome, Config, Engine, ManualClock};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    /// engine.schedule_after(b"order:9:timeout", Duration::ZERO, b"")?;
    /// engine.run_until_idle();
    /// let consumer = engine.consumer();
    /// let task = consumer.try_recv()?;
    /// assert!(consumer.holds(&task)?);
    /// // The payment arrives while the consumer holds the task.
    /// assert_eq!(engine.cancel(b"order:9:timeout")?, CancelOutcome::AlreadyDelivered { attempt: 1 });
    /// assert!(!consumer.holds(&task)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::Engine::lookup`]: `Closed` after a shutdown, `Poisoned`.
    pub fn holds(&self, delivery: &Delivery) -> Result<bool, crate::LookupError> {
        self.shared.holds(delivery)
    }

    /// A key's live task, as [`crate::Engine::lookup`] answers, for a worker
    /// that has only its consumer.
    ///
    /// # Errors
    /// As [`crate::Engine::lookup`].
    pub fn lookup(&self, key: &[u8]) -> Result<Option<crate::TaskInfo>, crate::LookupError> {
        self.shared.lookup(key)
    }

    /// Deliveries waiting in the engine's ready queue: handed out, not yet
    /// received. After a clean [`crate::Engine::shutdown`] 0 (the shutdown
    /// took them back); after the engine was dropped or poisoned, the count
    /// it had then, though none of them can be received any more (they are
    /// delivered again after the next open).
    pub fn ready(&self) -> usize {
        self.shared.ready_count()
    }
}

/// The future of [`Consumer::recv_async`]: a delivery, or why none will come.
#[must_use = "futures do nothing unless polled"]
pub struct Recv<'a> {
    consumer: &'a Consumer,
    /// Its waker's id among the engine's async waiters, once it has waited.
    waiter: Option<u64>,
}

impl fmt::Debug for Recv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recv")
            .field("waiting", &self.waiter.is_some())
            .finish_non_exhaustive()
    }
}

impl Future for Recv<'_> {
    type Output = Result<Delivery, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = &self.consumer.shared;
        let first = match shared.receive(Wait::No) {
            Err(RecvError::Empty) => RecvError::Empty,
            answer => return Poll::Ready(self.done(answer)),
        };
        debug_assert_eq!(first, RecvError::Empty);
        #[cfg(test)]
        if let Some(mut hook) = shared.recv_async_hook.lock().take() {
            hook(shared);
        }
        // Filed before looking again, so that a task made ready after this
        // look wakes the future: nothing falls between the two.
        let id = shared.register_async_waiter(self.waiter, cx.waker());
        self.waiter = Some(id);
        match shared.receive(Wait::No) {
            Err(RecvError::Empty) => Poll::Pending,
            answer => Poll::Ready(self.done(answer)),
        }
    }
}

impl Recv<'_> {
    /// Forgets this future's waker as it returns `answer`.
    fn done(&mut self, answer: Result<Delivery, RecvError>) -> Result<Delivery, RecvError> {
        if let Some(id) = self.waiter.take() {
            self.consumer.shared.forget_async_waiter(id);
        }
        answer
    }
}

impl Drop for Recv<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.consumer.shared.forget_async_waiter(id);
        }
    }
}

/// The wakers of the futures waiting in [`Consumer::recv_async`], by id: a
/// dense vector (woken in one pass) and where each id's entry is in it, so
/// that filing and forgetting a waker are O(1) however many futures wait —
/// every one of them files its waker again after each wake-up.
#[derive(Default)]
pub(crate) struct AsyncWaiters {
    next_id: u64,
    wakers: Vec<(u64, Waker)>,
    /// The position in `wakers` of each id's entry.
    at: std::collections::HashMap<u64, usize, foldhash::fast::RandomState>,
}

impl AsyncWaiters {
    /// Files `waker` under `id` (replacing the one there unless it wakes the
    /// same task), or under a new id if `id` is `None` or unknown; returns
    /// the id.
    pub(crate) fn register(&mut self, id: Option<u64>, waker: &Waker) -> u64 {
        if let Some(&i) = id.and_then(|id| self.at.get(&id)) {
            let entry = &mut self.wakers[i];
            if !entry.1.will_wake(waker) {
                entry.1 = waker.clone();
            }
            return entry.0;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.at.insert(id, self.wakers.len());
        self.wakers.push((id, waker.clone()));
        id
    }

    /// Drops the waker filed under `id`, if any.
    pub(crate) fn forget(&mut self, id: u64) {
        if let Some(i) = self.at.remove(&id) {
            self.wakers.swap_remove(i);
            // The last entry moved into the gap.
            if let Some(&(moved, _)) = self.wakers.get(i) {
                self.at.insert(moved, i);
            }
        }
    }

    /// The wakers filed.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Waker> {
        self.wakers.iter().map(|e| &e.1)
    }

    /// How many are filed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        debug_assert_eq!(self.at.len(), self.wakers.len());
        self.wakers.len()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Engine, ManualClock};
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Many futures wait; every third is dropped (entries leave from the middle of the
    /// filed wakers) and the others are polled again with new wakers (each replaces its own
    /// entry, wherever the removals moved it): a task made ready wakes exactly the wakers
    /// filed last, once each — none of the replaced or dropped ones.
    #[test]
    fn wakers_filed_dropped_and_replaced_in_any_order_wake_exactly_the_filed_ones(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let clock = ManualClock::new(1_700_000_000_000);
        let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
        let consumer = engine.consumer();
        let counters = |n: usize| -> Vec<Arc<Counter>> { (0..n).map(|_| Arc::default()).collect() };
        let (first, second) = (counters(100), counters(100));
        let mut futures: Vec<_> = (0..100)
            .map(|_| Some(Box::pin(consumer.recv_async())))
            .collect();
        for (f, c) in futures.iter_mut().zip(&first) {
            let waker = Waker::from(c.clone());
            let f = f.as_mut().ok_or("no future")?;
            assert!(f
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
        }
        for i in (0..100).step_by(3) {
            futures[i] = None;
        }
        assert_eq!(consumer.shared.async_waiters(), 66);
        for (f, c) in futures.iter_mut().zip(&second) {
            if let Some(f) = f {
                let waker = Waker::from(c.clone());
                assert!(f
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending());
            }
        }
        assert_eq!(consumer.shared.async_waiters(), 66);
        engine.schedule_after(b"k", std::time::Duration::ZERO, b"")?;
        engine.run_until_idle();
        for i in 0..100 {
            let woken = |c: &[Arc<Counter>]| c[i].0.load(Ordering::SeqCst);
            assert_eq!(
                woken(&first),
                0,
                "future {i}: a replaced or dropped waker was woken"
            );
            assert_eq!(woken(&second), usize::from(i % 3 != 0), "future {i}");
        }
        drop(futures);
        assert_eq!(consumer.shared.async_waiters(), 0);
        engine.shutdown()?;
        Ok(())
    }

    /// A pending `recv_async` files one waker; dropping it, or its answer, forgets it — so
    /// futures made and dropped in a loop (a `select!` with a timeout) leave nothing behind.
    #[test]
    fn a_recv_async_forgets_its_waker_when_dropped_or_answered(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let clock = ManualClock::new(1_700_000_000_000);
        let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
        let consumer = engine.consumer();
        let waiters = || consumer.shared.async_waiters();
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..1_000 {
            let mut next = Box::pin(consumer.recv_async());
            assert!(next.as_mut().poll(&mut cx).is_pending());
            assert!(next.as_mut().poll(&mut cx).is_pending());
            assert_eq!(waiters(), 1);
        }
        assert_eq!(waiters(), 0);
        let mut next = Box::pin(consumer.recv_async());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        engine.schedule_after(b"k", std::time::Duration::ZERO, b"")?;
        engine.run_until_idle();
        assert!(next.as_mut().poll(&mut cx).is_ready());
        assert_eq!(waiters(), 0);
        drop(next);
        assert_eq!(waiters(), 0);
        engine.shutdown()?;
        Ok(())
    }
}
