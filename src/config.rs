//! Engine configuration: every limit is a named constant with its unit last.

use crate::wheel::WHEEL_RANGE_TICKS;
use kairos_wal::Durability;
use std::time::Duration;

/// Default tick: the wheel's resolution. 1 ms (tokio, Linux at HZ=1000).
pub const TICK_DEFAULT: Duration = Duration::from_millis(1);
/// Coarsest tick accepted: one hour.
pub const TICK_MAX: Duration = Duration::from_secs(3600);
/// Default segment roll size of the write-ahead log: 64 MiB (etcd's choice).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default longest key, in bytes.
pub const KEY_BYTES_MAX_DEFAULT: usize = 1024;
/// Hard ceiling for [`Config::key_bytes_max`]: keys are stored with a 16-bit length.
pub const KEY_BYTES_MAX_LIMIT: usize = u16::MAX as usize;
/// Default largest payload, in bytes: 1 MiB.
pub const PAYLOAD_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Hard ceiling for [`Config::payload_bytes_max`]: 16 MiB minus room for the
/// record's fixed fields and key, so one schedule always fits one log record.
pub const PAYLOAD_BYTES_MAX_LIMIT: usize = 16 * 1024 * 1024 - 128 * 1024;
/// Default largest number of live tasks (scheduled or delivered-unacked).
pub const PENDING_TASKS_MAX_DEFAULT: usize = 50_000_000;
/// Ceiling for [`Config::pending_tasks_max`]: 2^31 tasks (slots are `u32`,
/// and the wheel holds at most `u32::MAX` timers).
pub const PENDING_TASKS_LIMIT: usize = 1 << 31;
/// Default latest due time, relative to now: ten years (365-day years).
pub const DELAY_MAX_DEFAULT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Largest tasks in one `schedule_many` call (one log record batch).
pub const BATCH_TASKS_MAX: usize = 1_000_000;
/// Default lease (visibility timeout) of a delivery: 30 s (Amazon SQS's
/// default visibility timeout).
pub const LEASE_DEFAULT: Duration = Duration::from_secs(30);
/// Longest lease accepted: 12 hours (SQS's maximum visibility timeout).
pub const LEASE_MAX: Duration = Duration::from_secs(12 * 3600);
/// Default attempts per task before it is dead-lettered: 3.
pub const MAX_ATTEMPTS_DEFAULT: u32 = 3;
/// Default delay before the second attempt: 1 s.
pub const BACKOFF_INITIAL_DEFAULT: Duration = Duration::from_secs(1);
/// Default cap on the delay between attempts: 5 minutes.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(300);
/// Default growth factor of the delay between attempts: ×2 per attempt.
pub const BACKOFF_MULTIPLIER_DEFAULT: u32 = 2;
/// Default jitter: each delay is shortened by up to 20 %.
pub const BACKOFF_JITTER_PERCENT_DEFAULT: u8 = 20;
/// Default [`Config::checkpoint_log_bytes`]: 256 MiB (four default segments).
pub const CHECKPOINT_LOG_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Default [`Config::horizon`]: 18 days.
pub const HORIZON_DEFAULT: Duration = Duration::from_secs(18 * 24 * 3600);

/// Default [`Config::resident_window`]: 1 minute, the same as
/// [`PAYLOAD_WINDOW_DEFAULT`]: a task due later than that keeps no payload in
/// memory, so it might as well keep no wheel entry either (20 bytes instead
/// of about 112). Sessions up to 14 used 10 minutes: with the order-timeout
/// delay mix (45 % within 30 minutes, 35 % within 7 days, 20 % within 30
/// days) about 15 % of the tasks were then due within the window and cost
/// their payload besides; `kairos bench --tasks 20000000 --payload-bytes 200`
/// measured 68 B of RAM per wheel task while scheduling with 10 minutes,
/// 54 B with 1 minute (BENCHMARKS.md, session 15).
pub const RESIDENT_WINDOW_DEFAULT: Duration = Duration::from_secs(60);

/// Default [`Config::relocate_far_tasks`]: 2^20 (about a million).
pub const RELOCATE_FAR_TASKS_DEFAULT: u64 = 1 << 20;

/// Default [`Config::relocate_far_bytes`]: 16 MiB (so at most about 32 MiB
/// of far tasks wait whole in memory: ~280 k tasks of a 24-byte key and no
/// payload). Measured against 64 MiB on a 20 M-task burst, 80 % far
/// (BENCHMARKS.md, session 24): RAM per wheel task while scheduling
/// 66–73 → 44–45 B (0-byte payloads) and 74–85 → 52–59 B (200 B); the schedule
/// rate the same or higher, since a checkpoint moves far tasks while it
/// encodes.
pub const RELOCATE_FAR_BYTES_DEFAULT: u64 = 16 << 20;

/// Default [`Config::payload_window`]: 1 minute.
pub const PAYLOAD_WINDOW_DEFAULT: Duration = Duration::from_secs(60);
/// Default [`Config::checkpoint_interval`]: 10 minutes.
pub const CHECKPOINT_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);

/// What a delivery means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryGuarantee {
    /// At-least-once (default): a delivery carries a lease; the consumer
    /// acks or nacks it; a lease that expires redelivers the task (attempt
    /// + 1) until [`RetryPolicy::max_attempts`], then it is dead-lettered.
    AtLeastOnce,
    /// At-most-once: the task is finished (its ack logged, and durable under
    /// `Sync`) before a consumer receives it. No lease, no retry: a crash
    /// while the consumer works loses that task. Nothing is delivered twice
    /// across a process crash in every durability mode, and across a power
    /// loss under `Sync`; under `Interval` or `Buffered` a power loss can
    /// take the ack with the rest of the unsynced suffix (until the next
    /// background sync, segment roll, checkpoint or
    /// [`Engine::sync`](crate::Engine::sync)), and the task is then
    /// delivered again.
    AtMostOnce,
}

/// When a failed attempt is retried. A failed attempt is a nack, or a lease
/// that expired. After attempt `n` fails (`n < max_attempts`), attempt `n+1`
/// is due `min(backoff_max, backoff_initial × backoff_multiplier^(n−1))`
/// later, shortened by a jitter of up to `backoff_jitter_percent` % that is a
/// fixed function of the task id and `n` (so runs are reproducible). After
/// attempt `max_attempts` fails, the task is dead-lettered. (Exponential
/// backoff with jitter as in the AWS architecture blog's "Exponential
/// Backoff and Jitter"; `max_attempts` = SQS's `maxReceiveCount`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Deliveries a task gets before it is dead-lettered, ≥ 1. Default
    /// [`MAX_ATTEMPTS_DEFAULT`].
    pub max_attempts: u32,
    /// Delay before the second attempt. Default [`BACKOFF_INITIAL_DEFAULT`].
    pub backoff_initial: Duration,
    /// Cap on any delay between attempts. Default [`BACKOFF_MAX_DEFAULT`].
    pub backoff_max: Duration,
    /// Growth of the delay per attempt, ≥ 1. Default [`BACKOFF_MULTIPLIER_DEFAULT`].
    pub backoff_multiplier: u32,
    /// Largest share of a delay removed at random, 0..=100 %. Default
    /// [`BACKOFF_JITTER_PERCENT_DEFAULT`].
    pub backoff_jitter_percent: u8,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: MAX_ATTEMPTS_DEFAULT,
            backoff_initial: BACKOFF_INITIAL_DEFAULT,
            backoff_max: BACKOFF_MAX_DEFAULT,
            backoff_multiplier: BACKOFF_MULTIPLIER_DEFAULT,
            backoff_jitter_percent: BACKOFF_JITTER_PERCENT_DEFAULT,
        }
    }
}

impl RetryPolicy {
    /// The delay before attempt `failed_attempt + 1` of task `task_id`, after
    /// attempt `failed_attempt` (≥ 1) failed. Pure: the same inputs give the
    /// same delay.
    pub fn backoff(&self, task_id: u64, failed_attempt: u32) -> Duration {
        let exponent = failed_attempt.saturating_sub(1);
        let mut delay = self.backoff_initial;
        for _ in 0..exponent {
            delay = delay.saturating_mul(self.backoff_multiplier);
            if delay >= self.backoff_max {
                break;
            }
        }
        let delay = delay.min(self.backoff_max);
        let jitter = u128::from(self.backoff_jitter_percent.min(100));
        if jitter == 0 {
            return delay;
        }
        // SplitMix64 of (id, attempt): a fixed pseudo-random share in 0..1.
        let mut z = task_id ^ u64::from(failed_attempt).rotate_left(32);
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let nanos = delay.as_nanos();
        // nanos × jitter% × (z / 2^64), in integers.
        let cut = ((nanos * jitter / 100) * u128::from(z >> 32)) >> 32;
        Duration::from_nanos(u64::try_from(nanos - cut).unwrap_or(u64::MAX))
    }
}

/// How an engine is set up. Build with [`Config::default`] and adjust fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Wheel resolution. Due times round *up* to a tick, so a task is never
    /// delivered early and at most one tick late (plus scheduling noise).
    /// Whole milliseconds, 1 ms..=[`TICK_MAX`]. Default [`TICK_DEFAULT`].
    pub tick: Duration,
    /// When a call returns relative to its record reaching stable storage,
    /// and so what it survives: the crate docs' table, ["What a returned
    /// call survives"](crate#what-a-returned-call-survives).
    /// Default [`Durability::Sync`]; [`Durability::Interval`] needs a
    /// non-zero interval (checked by in-memory engines too, which otherwise
    /// ignore this field). Its background sync runs on real time, like
    /// `checkpoint_interval`: moving a [`crate::ManualClock`] does not bring
    /// it on (call [`crate::Engine::sync`] in deterministic tests).
    pub durability: Durability,
    /// Log segment roll size in bytes, at least
    /// [`kairos_wal::SEGMENT_BYTES_MIN`] (4 KiB). Default
    /// [`SEGMENT_BYTES_DEFAULT`] (64 MiB).
    pub segment_bytes: u64,
    /// Longest key accepted, in bytes (1..=[`KEY_BYTES_MAX_LIMIT`]). Default
    /// [`KEY_BYTES_MAX_DEFAULT`] (1 KiB). Lowering it later does not touch
    /// tasks already stored: they fire and can be cancelled, but a
    /// reschedule of one with a longer key is refused (`KeyTooLong`), and
    /// so is the requeue of a dead letter with one
    /// ([`crate::Engine::requeue_dead_letter`]).
    pub key_bytes_max: usize,
    /// Largest payload accepted, in bytes (≤ [`PAYLOAD_BYTES_MAX_LIMIT`]).
    /// Default [`PAYLOAD_BYTES_MAX_DEFAULT`] (1 MiB). Lowering it later does
    /// not touch tasks already stored (they fire, and a reschedule without
    /// a new payload keeps theirs), but the requeue of a dead letter with a
    /// larger payload is refused (`PayloadTooLarge`).
    pub payload_bytes_max: usize,
    /// Largest number of live tasks; `schedule` beyond it is an error
    /// (1..=[`PENDING_TASKS_LIMIT`]). Default [`PENDING_TASKS_MAX_DEFAULT`]
    /// (50 M). Live: scheduled, or delivered and not yet finished — a task
    /// cancelled while a consumer holds it counts until its holder answers
    /// or the lease ends, though its key is free at once. Dead letters do
    /// not count.
    pub pending_tasks_max: usize,
    /// Latest due time accepted, relative to now, in whole milliseconds: a
    /// due time (rounded up to the millisecond, as every due time is) is
    /// accepted when it is at most now + `delay_max` rounded up. Above zero, and must fit
    /// the wheel: at most `tick × 2^41` (half the wheel's range; ≈ 69 years
    /// at 1 ms).
    /// Default [`DELAY_MAX_DEFAULT`] (10 years).
    pub delay_max: Duration,
    /// At-least-once (default) or at-most-once delivery.
    pub delivery: DeliveryGuarantee,
    /// How long a consumer holds a delivery before it is redelivered
    /// (visibility timeout), whole milliseconds, 1 ms..=[`LEASE_MAX`],
    /// counted from the moment the consumer received the task: the lease
    /// ends at the first tick that starts at or after receive + lease —
    /// never earlier, less than one `tick` later.
    /// Default [`LEASE_DEFAULT`]. Unused at most once.
    pub lease: Duration,
    /// Retries and dead letters. Unused at most once.
    pub retry: RetryPolicy,
    /// Most tasks per second handed out from the backlog found at open
    /// (tasks that fell due while the engine was closed, and deliveries in
    /// flight at a crash), oldest first; `None` (default) hands them all out
    /// at once. Tasks falling due after open are not limited.
    pub catch_up_tasks_per_sec: Option<u32>,
    /// Take a checkpoint in the background once the log has grown by this
    /// many bytes since the last one — or by the last checkpoint's size, if
    /// that is larger, so copying the live state never costs more than the
    /// log written since. `None`: no growth trigger. Default
    /// [`CHECKPOINT_LOG_BYTES_DEFAULT`]. Ignored in memory.
    pub checkpoint_log_bytes: Option<u64>,
    /// Also take one this often (real time) if anything was logged since the
    /// last. `None`: no time trigger. Default [`CHECKPOINT_INTERVAL_DEFAULT`].
    /// With both triggers `None`, checkpoints are taken only by
    /// [`crate::Engine::checkpoint`] (and `kairos checkpoint DIR`).
    pub checkpoint_interval: Option<Duration>,
    /// Payloads of waiting tasks due later than this from now leave memory
    /// at the next checkpoint (or the next move of far tasks,
    /// [`Config::relocate_far_tasks`]): they move to an overflow file on disk
    /// (`DIR/overflow/`) and are read back before delivery — ahead of their
    /// due time by the prefetcher ([`Config::payload_prefetch`]), or by the
    /// consumer that receives the task. Keys stay in memory, except those
    /// of far tasks ([`Config::far_span`]). `None`: payloads stay in memory
    /// (and no task goes far). Default [`PAYLOAD_WINDOW_DEFAULT`]. Ignored
    /// in memory.
    pub payload_window: Option<Duration>,
    /// Waiting first attempts due later than this from now leave the timing
    /// wheel at the next checkpoint (or sooner, [`Config::relocate_far_tasks`]): their key, due time and payload are
    /// written to an overflow file (or stay in the entry they are in, if its
    /// due time is still the task's) and memory keeps only 20 bytes (the
    /// key's hash, the task id and the entry's place; `crate::far`). They are
    /// read back sequentially and put in the wheel ("promoted") once their
    /// due time is within the far span ([`Config::far_span`]) from now, by the prefetcher (or, with
    /// [`Config::payload_prefetch`] off, by the driver thread), their due
    /// time then converted by the wall clock of that moment. Cancel,
    /// reschedule and duplicate-key checks find them by reading the entry
    /// from disk when the hash matches. Not taken out: retries, and tasks
    /// whose payload is in an entry with a stale due time (rescheduled
    /// without a new payload, or reopened). Needs `payload_window` (at most
    /// the horizon). `None`: every task stays in the wheel (far tasks a
    /// checkpoint made under another configuration come back into it at
    /// open). Default
    /// [`HORIZON_DEFAULT`] (18 days). Ignored in memory.
    ///
    /// With [`Config::resident_window`] shorter (the default), tasks within
    /// the horizon but due later than that window leave memory the same
    /// way; the horizon then only bounds the window.
    pub horizon: Option<Duration>,
    /// The part of the horizon whose tasks stay whole in memory: waiting
    /// first attempts due later than this from now are kept like far tasks
    /// ([`Config::horizon`]) — key, due time and payload in an overflow
    /// file, 20 bytes of memory each — and are promoted back into the wheel
    /// once due within this window from now. A task in the wheel's memory
    /// costs about 112 bytes plus its key and payload beyond 26 bytes; one
    /// kept out of it about 25, whatever its key and payload (a tiered
    /// design: a hot window in memory, the rest on disk behind a small
    /// entry). The price: a cancel or reschedule of such a
    /// task reads its entry from disk (the page cache, mostly),
    /// scheduling it costs a write to an overflow file besides the log, and
    /// bringing it back puts it in the wheel under the engine's lock, in
    /// holds of about a millisecond that the driver may wait for: a few
    /// milliseconds more at the tail of firing lateness while many are
    /// promoted (BENCHMARKS.md, sessions 15 and 16: 500 000 due over a
    /// minute, p99.9 8 ms and max 19 ms with the default window, 4 ms and
    /// 22 ms with 10 minutes).
    /// And while out of the wheel such a task follows wall-clock steps (its
    /// due time is converted again when it is promoted), where one in the
    /// wheel follows the monotonic clock: with the default, that is most
    /// first attempts due more than a minute out, once a move has taken
    /// them out (README, "Time").
    /// `None`: the whole horizon stays in memory. Used only when the
    /// horizon is set, and only where shorter than it; a window shorter
    /// than `payload_window` counts as `payload_window` (a task whose
    /// payload is kept in memory stays in the wheel).
    /// Default [`RESIDENT_WINDOW_DEFAULT`] (1 minute). Ignored in memory.
    pub resident_window: Option<Duration>,
    /// Also take far tasks out of the wheel between checkpoints, in the
    /// background, once this many first attempts due beyond the far span ([`Config::far_span`])
    /// have been scheduled since they last were — or a quarter of the far
    /// tasks there are already, if that is more (so the overflow files this
    /// writes grow geometrically and stay few, while at most about a fifth
    /// of the far tasks wait whole in the wheel) — or once they take
    /// [`Config::relocate_far_bytes`] of memory, whatever their count. The
    /// same move as a checkpoint's first step (payloads due after the payload window leave
    /// memory too), without writing a checkpoint: it bounds the memory of
    /// far tasks scheduled in bulk, which otherwise stay whole in the wheel
    /// until the next checkpoint. `None`: only checkpoints take them out.
    /// Default [`RELOCATE_FAR_TASKS_DEFAULT`]. Ignored in memory, without a
    /// horizon and without a payload window.
    pub relocate_far_tasks: Option<u64>,
    /// With [`Config::relocate_far_tasks`] set, also take far tasks out of
    /// the wheel once those scheduled since they last were take this many
    /// bytes of memory, however few they are — counted as their keys and
    /// payloads plus 96 bytes each (the wheel's own memory per task, besides
    /// the key: a slab entry, a wheel node, the index). With large payloads,
    /// or millions of far tasks (a quarter of which start a move), a count
    /// alone would let gigabytes wait in memory. A producer waits once twice
    /// this is in memory — scheduled since the last move started, or being
    /// taken out by it — until a move starts or ends. Default
    /// [`RELOCATE_FAR_BYTES_DEFAULT`] (16 MiB); at least 1.
    pub relocate_far_bytes: u64,
    /// Run a background thread that reads payloads coming due (within
    /// `payload_window`) back into memory, so that receiving a task does not
    /// wait on disk. Default true; deterministic tests turn it off (payloads
    /// are then read when a consumer receives the task). A round reads
    /// nothing of a file whose next entry is not due within the window,
    /// once it has read that entry (a 4 KiB read the first time). A read of an
    /// overflow file that fails (I/O) is tried again from where it stopped
    /// 1, 2, 4, … rounds later (a round every quarter of `payload_window`),
    /// at most 16. A damaged entry is gone past (a warning naming file and
    /// offset): the file is read on from the next entry a task still needs,
    /// or not again until the engine is reopened if none is left; a task
    /// whose own entry is damaged is read by the consumer receiving it,
    /// which reports the damage.
    pub payload_prefetch: bool,
    /// How long the log stays idle after an fdatasync before it records the
    /// synced position in its `SYNCED` file (two more syncs, once per idle
    /// period), so that a restart after a crash or power cut refuses a log
    /// whose synced records were cut off or deleted by outside damage
    /// instead of reading the gap as an unsynced torn tail
    /// (`kairos_wal::WalOptions::synced_mark_delay`; `wal/FORMAT.md`,
    /// "Missing files"). `None`: never. Default
    /// [`kairos_wal::SYNCED_MARK_DELAY_DEFAULT`] (10 ms), at most
    /// [`kairos_wal::SYNCED_MARK_DELAY_MAX`]. Not written under
    /// [`Durability::Buffered`] nor on simulated storage unless it allows
    /// timed I/O. With a delay set, each segment roll also records the new
    /// segment there (not under `Buffered`). Ignored in memory.
    pub synced_mark_delay: Option<Duration>,
    /// Proof before acknowledgement: under [`Durability::Sync`] a call returns
    /// only once a durable mark in the log that no cut of its tail can remove
    /// covers its record (and so does every sync of the log a checkpoint
    /// waits for, in any mode), so after an unclean shutdown, outside damage that would drop an
    /// acknowledged task — the last group commit's included — is refused as
    /// corruption instead of being truncated as a torn write
    /// (`kairos_wal::WalOptions::proof_before_ack`; `wal/FORMAT.md`, "Proof
    /// before acknowledgement"). The mark rides on the next group commit's
    /// fdatasync when one at least as large is queued already (calls keep
    /// coming), else it takes an fdatasync of its own; a lone caller pays a second
    /// fdatasync (BENCHMARKS.md, "Proof before acknowledgement"). Each segment
    /// roll also records the new segment in `SYNCED`. Default `true`; `false`
    /// acknowledges at the fdatasync itself and leaves the limit README
    /// describes. Ignored in memory.
    pub proof_before_ack: bool,
    /// Open with deliveries paused, as if [`crate::Engine::pause_deliveries`]
    /// were called before the driver's first pass: no task is handed out and
    /// no lease expires until [`crate::Engine::resume_deliveries`]. For tools
    /// that open a data directory to change or read it without delivering —
    /// `kairos checkpoint` and `kairos dead-letters` do — so that tasks
    /// already due are not logged as delivered and then taken back at
    /// shutdown. Deliveries in flight at a crash are still settled by the open
    /// (retried or dead-lettered). Default `false`.
    pub deliveries_paused: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tick: TICK_DEFAULT,
            durability: Durability::Sync,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            key_bytes_max: KEY_BYTES_MAX_DEFAULT,
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            pending_tasks_max: PENDING_TASKS_MAX_DEFAULT,
            delay_max: DELAY_MAX_DEFAULT,
            delivery: DeliveryGuarantee::AtLeastOnce,
            lease: LEASE_DEFAULT,
            retry: RetryPolicy::default(),
            catch_up_tasks_per_sec: None,
            checkpoint_log_bytes: Some(CHECKPOINT_LOG_BYTES_DEFAULT),
            checkpoint_interval: Some(CHECKPOINT_INTERVAL_DEFAULT),
            payload_window: Some(PAYLOAD_WINDOW_DEFAULT),
            horizon: Some(HORIZON_DEFAULT),
            resident_window: Some(RESIDENT_WINDOW_DEFAULT),
            relocate_far_tasks: Some(RELOCATE_FAR_TASKS_DEFAULT),
            relocate_far_bytes: RELOCATE_FAR_BYTES_DEFAULT,
            payload_prefetch: true,
            synced_mark_delay: Some(kairos_wal::SYNCED_MARK_DELAY_DEFAULT),
            proof_before_ack: true,
            deliveries_paused: false,
        }
    }
}

impl Config {
    /// How far ahead tasks stay whole in the wheel's memory: waiting first
    /// attempts due later than this from now become far tasks (out of the
    /// wheel, 20 bytes of memory each; see [`Config::horizon`]) and are
    /// promoted back once due within it. The horizon, or the resident
    /// window (at least the payload window) if shorter; `None` when the
    /// horizon is `None`. No task goes far without a payload window either
    /// (nor in memory), whatever this returns. O(1).
    pub fn far_span(&self) -> Option<Duration> {
        let horizon = self.horizon?;
        Some(match self.resident_window {
            Some(window) => window
                .max(self.payload_window.unwrap_or(Duration::ZERO))
                .min(horizon),
            None => horizon,
        })
    }

    /// The tick in whole milliseconds.
    pub(crate) fn tick_ms(&self) -> u64 {
        // validate() caps the tick at TICK_MAX, so this never saturates.
        u64::try_from(self.tick.as_millis()).unwrap_or(u64::MAX)
    }

    /// Checks every field against its limits, as [`crate::Engine::open`]
    /// does before it touches the directory: lets a caller refuse a
    /// configuration before acting on it. O(1).
    ///
    /// # Errors
    /// [`crate::OpenError::InvalidConfig`] naming the first bad field and
    /// its limit.
    #[doc(alias = "validate")]
    pub fn check(&self) -> Result<(), crate::OpenError> {
        self.validate()
            .map_err(|reason| crate::OpenError::InvalidConfig { reason })
    }

    /// Checks every field; the error names the first bad one.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.tick < Duration::from_millis(1)
            || self.tick > TICK_MAX
            || !self.tick.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(format!(
                "tick must be a whole number of milliseconds in 1 ms..=1 h, got {:?}",
                self.tick
            ));
        }
        if let (Some(h), Some(w)) = (self.horizon, self.payload_window) {
            if h < w {
                return Err(format!(
                    "horizon {h:?} is shorter than payload_window {w:?}"
                ));
            }
        }
        if self.key_bytes_max == 0 || self.key_bytes_max > KEY_BYTES_MAX_LIMIT {
            return Err(format!(
                "key_bytes_max must be in 1..={KEY_BYTES_MAX_LIMIT}, got {}",
                self.key_bytes_max
            ));
        }
        if self.payload_bytes_max > PAYLOAD_BYTES_MAX_LIMIT {
            return Err(format!(
                "payload_bytes_max must be ≤ {PAYLOAD_BYTES_MAX_LIMIT}, got {}",
                self.payload_bytes_max
            ));
        }
        if self.pending_tasks_max == 0 || self.pending_tasks_max > PENDING_TASKS_LIMIT {
            return Err(format!(
                "pending_tasks_max must be in 1..={PENDING_TASKS_LIMIT}, got {}",
                self.pending_tasks_max
            ));
        }
        if self.delay_max.is_zero() {
            // Every due time but an overdue one would be refused: a field
            // left unset, not a queue anyone wants.
            return Err("delay_max must be above zero, got 0ns".into());
        }
        // Half the wheel's range: the other half absorbs driver lag.
        let wheel_range_ms = u128::from(WHEEL_RANGE_TICKS / 2) * u128::from(self.tick_ms());
        if self.delay_max.as_millis() > wheel_range_ms {
            return Err(format!(
                "delay_max {:?} exceeds the wheel's range of {wheel_range_ms} ms at this tick",
                self.delay_max
            ));
        }
        if self.lease < Duration::from_millis(1)
            || self.lease > LEASE_MAX
            || !self.lease.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(format!(
                "lease must be a whole number of milliseconds in 1 ms..={LEASE_MAX:?}, got {:?}",
                self.lease
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err("retry.max_attempts must be at least 1".into());
        }
        if self.retry.backoff_multiplier == 0 {
            return Err("retry.backoff_multiplier must be at least 1".into());
        }
        if self.retry.backoff_jitter_percent > 100 {
            return Err(format!(
                "retry.backoff_jitter_percent must be ≤ 100, got {}",
                self.retry.backoff_jitter_percent
            ));
        }
        if self.retry.backoff_max > self.delay_max {
            return Err(format!(
                "retry.backoff_max {:?} exceeds delay_max {:?}",
                self.retry.backoff_max, self.delay_max
            ));
        }
        if self.catch_up_tasks_per_sec == Some(0) {
            return Err("catch_up_tasks_per_sec must be at least 1 (or None)".into());
        }
        if self.relocate_far_tasks == Some(0) {
            return Err("relocate_far_tasks must be at least 1 (or None)".into());
        }
        if self.relocate_far_bytes == 0 {
            return Err("relocate_far_bytes must be at least 1".into());
        }
        if self.checkpoint_log_bytes == Some(0) {
            return Err("checkpoint_log_bytes must be at least 1 (or None)".into());
        }
        if self.checkpoint_interval == Some(Duration::ZERO) {
            return Err("checkpoint_interval must be positive (or None)".into());
        }
        if self.durability == Durability::Interval(Duration::ZERO) {
            return Err("durability Interval needs a non-zero interval".into());
        }
        if self.segment_bytes < kairos_wal::SEGMENT_BYTES_MIN {
            return Err(format!(
                "segment_bytes must be ≥ {}, got {}",
                kairos_wal::SEGMENT_BYTES_MIN,
                self.segment_bytes
            ));
        }
        if let Some(delay) = self.synced_mark_delay {
            if delay > kairos_wal::SYNCED_MARK_DELAY_MAX {
                return Err(format!(
                    "synced_mark_delay must be ≤ {:?} (or None), got {delay:?}",
                    kairos_wal::SYNCED_MARK_DELAY_MAX
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check` accepts the defaults and names the first bad field, as
    /// `Engine::open` reports it.
    #[test]
    fn check_accepts_the_defaults_and_names_a_bad_field() {
        assert!(Config::default().check().is_ok());
        let bad = Config {
            segment_bytes: 10,
            ..Config::default()
        };
        match bad.check() {
            Err(crate::OpenError::InvalidConfig { reason }) => {
                assert!(reason.contains("segment_bytes"), "{reason}");
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    /// A zero interval is refused by `check` (before the directory is touched), not first by
    /// the log after `open` has created the directory and its lock file.
    #[test]
    fn check_refuses_a_zero_interval() {
        let bad = Config {
            durability: Durability::Interval(Duration::ZERO),
            ..Config::default()
        };
        match bad.check() {
            Err(crate::OpenError::InvalidConfig { reason }) => {
                assert!(reason.contains("Interval"), "{reason}");
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
        let good = Config {
            durability: Durability::Interval(Duration::from_millis(1)),
            ..Config::default()
        };
        assert!(good.check().is_ok());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_without_jitter() {
        let p = RetryPolicy {
            backoff_jitter_percent: 0,
            backoff_max: Duration::from_secs(5),
            ..RetryPolicy::default()
        };
        let secs: Vec<u64> = (1..=5).map(|n| p.backoff(7, n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 5, 5]);
        assert_eq!(p.backoff(7, 1000), Duration::from_secs(5));
    }

    #[test]
    fn jitter_only_shortens_and_is_reproducible() {
        let p = RetryPolicy {
            backoff_jitter_percent: 50,
            ..RetryPolicy::default()
        };
        let mut distinct = std::collections::HashSet::new();
        for id in 0..200 {
            let d = p.backoff(id, 2);
            assert!(
                d <= Duration::from_secs(2) && d >= Duration::from_secs(1),
                "{d:?}"
            );
            assert_eq!(d, p.backoff(id, 2));
            distinct.insert(d);
        }
        assert!(
            distinct.len() > 150,
            "jitter spreads retries: {}",
            distinct.len()
        );
    }

    #[test]
    fn delivery_settings_are_validated() {
        let bad = [
            Config {
                lease: Duration::ZERO,
                ..Config::default()
            },
            Config {
                lease: LEASE_MAX + Duration::from_millis(1),
                ..Config::default()
            },
            Config {
                retry: RetryPolicy {
                    max_attempts: 0,
                    ..RetryPolicy::default()
                },
                ..Config::default()
            },
            Config {
                retry: RetryPolicy {
                    backoff_jitter_percent: 101,
                    ..RetryPolicy::default()
                },
                ..Config::default()
            },
            Config {
                catch_up_tasks_per_sec: Some(0),
                ..Config::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert!(Config::default().validate().is_ok());
    }
}
