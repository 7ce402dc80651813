//! The engine: tombstone index + timing wheel + write-ahead log + driver.
//!
//! Concurrency model. One mutex guards the [`Core`] (wheel, index, tasks,
//! overdue queue, ready queue, dead letters, log handle). Every state change
//! takes the lock, checks, appends its log record (which only enqueues it to
//! the log's queue, so the lock is never held across I/O), applies
//! the change in memory and releases the lock; the caller then waits for the
//! record's durability. Because records are enqueued under the lock, the
//! log's order is the order in which changes took effect, and a later record
//! is never durable before an earlier one (the log syncs a prefix). Hence:
//!
//! * `cancel` returns `Cancelled` only after its cancel record is durable
//!   (under `Sync`), and the task left memory before any consumer could
//!   receive it;
//! * the driver's hand-out thread puts a task in the ready queue only after
//!   its deliver record is durable, and a consumer takes it from there under the lock, so a task
//!   a consumer received answers cancel with `AlreadyDelivered`.
//!
//! So for a task never delivered, exactly one of "cancel returned
//! `Cancelled`" and "a consumer received it" happens, across crashes too.
//! The delivery side (ready queue, leases, acks, retries, dead letters, the
//! driver) is in [`delivery`].

mod async_calls;
mod checkpointing;
#[cfg(test)]
mod counting;
mod dead;
mod delivery;
mod far;
mod lookup;
mod payloads;

pub use lookup::TaskInfo;

pub use checkpointing::CheckpointReport;

pub(crate) use delivery::Wait;
pub use delivery::{AckScheduleOutcome, DeadLetter, NackOutcome};

use crate::clock::{system_time_to_ms, system_time_to_ns, Clock, SystemClock};
use crate::config::DeliveryGuarantee;
use crate::config::{Config, BATCH_TASKS_MAX};
use crate::consumer::{Consumer, Delivery};
use crate::error::{
    AckError, AckScheduleError, CancelError, CheckpointError, OpenError, ScheduleError,
    ShutdownError, SyncError,
};
use crate::far::{FarEntry, FarIndex, KeyHasher};
use crate::index::{Found, TaskIndex};
use crate::prefetch::prefetch;
use crate::record::{Record, ID_ONLY_BYTES, RECORD_CANCEL, RECORD_SCHEDULE, SCHEDULE_FIXED_BYTES};
use crate::replay::{DeadTask, LiveTask, Replay};
use crate::task::{PayloadStore, Task, TaskId, TaskSlab, TaskState};
use crate::wheel::{InsertError, Tick, Wheel, WHEEL_RANGE_TICKS};
use async_calls::{Blocking, WaitMode};
use kairos_wal::format::{FRAME_BODY_BYTES_MAX, RECORD_HEADER_BYTES};
use kairos_wal::storage::LockGuard;
use kairos_wal::{
    AppendTicket, FsStorage, RecoveryReport, ReplayError, Storage, Wal, WalError, WalOptions,
};
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::task::{Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// When a task is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At an absolute wall-clock time (stored as UTC milliseconds, rounded up).
    At(SystemTime),
    /// After a delay from now.
    After(Duration),
}

/// One task for [`Engine::schedule_many`].
#[derive(Debug, Clone, Copy)]
pub struct NewTask<'a> {
    /// Caller-chosen key, 1..=`Config::key_bytes_max` bytes.
    pub key: &'a [u8],
    /// When it is due.
    pub due: Due,
    /// Payload, up to `Config::payload_bytes_max` bytes.
    pub payload: &'a [u8],
}

/// What a cancel did. Exact, across crashes too: see the crate docs
/// ("Cancel and delivery").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "the outcome says whether the task will never be delivered (`Cancelled`) or a consumer already has it (`AlreadyDelivered`)"]
pub enum CancelOutcome {
    /// The task was waiting — for its first delivery, or for its next
    /// attempt after `deliveries` failed ones — or was due but not yet
    /// received by any consumer; it will never be delivered (again). Under
    /// `Sync` the cancel is durable when this is returned.
    Cancelled {
        /// Deliveries the task had before (0: no consumer ever received it).
        deliveries: u32,
    },
    /// A consumer holds the task right now (delivery `attempt`). No retry or
    /// redelivery of it will follow (the cancel is logged); the holder may
    /// still ack it. The caller should compensate for the work in progress.
    ///
    /// The key is free from now on, though the holder still has the task: a
    /// schedule (or reschedule) of it makes a new task, and a second cancel
    /// answers [`CancelOutcome::NotFound`].
    AlreadyDelivered {
        /// The attempt the consumer holds.
        attempt: u32,
    },
    /// No live task has this key (never scheduled, cancelled, finished, or
    /// dead-lettered).
    NotFound,
}

impl CancelOutcome {
    /// True for [`CancelOutcome::Cancelled`].
    pub fn is_cancelled(&self) -> bool {
        matches!(self, CancelOutcome::Cancelled { .. })
    }
}

/// What [`Engine::reschedule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RescheduleOutcome {
    /// The waiting task with this key got the new due time (and payload, if
    /// given); it keeps its id and attempt count.
    Rescheduled(TaskId),
    /// No task with this key was live: a new task was scheduled (upsert).
    Scheduled(TaskId),
}

/// What recovery found when the engine was opened.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Recovery {
    /// The log's own report: records replayed, torn tail truncated, clean shutdown.
    /// `wal.clean_shutdown` says whether the log ends with a clean close: it
    /// is `false` after a crash (or a drop without [`Engine::shutdown`]) that
    /// followed any change since the last clean close, and also on the first
    /// open of a new directory, where `wal.last_lsn` is `Lsn(0)`: nothing was
    /// ever logged.
    pub wal: RecoveryReport,
    /// Live tasks after recovery.
    pub pending: usize,
    /// Of those, tasks due in the past at open and not in flight before:
    /// they fell due while the engine was closed, or were handed out but
    /// taken back unreceived — by a clean shutdown, or at most once by this
    /// open after a crash (they come again as the same attempt). With
    /// `redelivered`, the catch-up backlog.
    pub overdue: usize,
    /// Of those, tasks in flight when the engine last stopped — at a crash,
    /// or held by a consumer at a clean shutdown (delivered, never acked):
    /// they are delivered again, attempt + 1.
    pub redelivered: usize,
    /// Tasks in flight when the engine last stopped (crash or clean
    /// shutdown) whose attempts were used up: dead-lettered at open.
    pub dead_lettered: usize,
    /// Dead letters kept.
    pub dead_letters: usize,
    /// The newest checkpoint file, when the open passed over it for an
    /// older one because it is damaged, or does not fit the log or its
    /// name: what is wrong with it (the file, and the byte offset of the
    /// damage where there is one). The older checkpoint and the log after
    /// it gave the state; the next checkpoint replaces the damaged file.
    /// `None` when the newest checkpoint was used, or there is none.
    pub skipped_checkpoint: Option<String>,
    /// Damaged overflow entries that no far task needed (their tasks
    /// cancelled, moved or finished since the file was written) which the
    /// open's promotion of far tasks went past (each also a `tracing`
    /// warning naming the file and offset; so is each far task the replay
    /// held by id because a record needed its damaged entry, and a later
    /// record finished). Not 0: the disk damaged data nothing
    /// needed any more; `kairos verify` names where (see
    /// [`Stats::overflow_damage_skipped`] for the engine's later promotions).
    pub overflow_damage_skipped: u64,
}

/// Counters for observing an engine (backpressure, throughput). Cheap: one
/// lock.
///
/// Two kinds. **Levels** say what is there now: `scheduled`, `ready`,
/// `in_flight`, `catch_up_backlog`, `dead_letters`, `pending`, the payload
/// and memory figures. **Running totals** (`u64`) count what this engine did
/// since it was opened, to graph as rates (throughput, retry and failure
/// rates): `payloads_read_back`, `far_promoted`, `overflow_damage_skipped`,
/// `background_failures`, and
/// the task totals `tasks_scheduled`, `tasks_rescheduled`,
/// `tasks_cancelled`, `deliveries`, `acks`, `nacks`, `lease_expiries`,
/// `retries`, `tasks_dead_lettered`, `dead_letters_requeued`,
/// `dead_letters_purged`. Every total starts at 0 at each open —
/// recovery replays the log's records but no counts: what the open itself
/// did is in [`Engine::recovery`] — and never decreases; after
/// [`Engine::shutdown`] they stay as they were when the engine stopped. A
/// total counts a change as the engine applies it in memory, under its lock,
/// where it also logs the change's record (for a nack and an at-most-once
/// receipt, just before): if the log fails then, or has failed already (the
/// engine is poisoned, the call answers `Poisoned`), a change counted stays
/// counted, though the call failed and a reopen may not find the change.
///
/// Between the totals, at any moment of one open (with deliveries at least
/// once, [`DeliveryGuarantee::AtLeastOnce`], the default): every delivery
/// ends in exactly one ack, nack or lease expiry, or is still held, so
/// `deliveries == acks + nacks + lease_expiries + in_flight`; and every nack
/// or lease expiry either retries the task, dead-letters it, or finishes a
/// task cancelled while held, so `nacks + lease_expiries >= retries +
/// tasks_dead_lettered` (equal when no task was cancelled while held). The
/// dead letters kept are those the open found plus those made since, less
/// those requeued or purged: `dead_letters == Recovery::dead_letters +
/// tasks_dead_lettered - dead_letters_requeued - dead_letters_purged`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Tasks waiting for a due time (first attempt or retry), including the
    /// catch-up backlog.
    pub scheduled: usize,
    /// Due tasks waiting in the ready queue for a consumer.
    pub ready: usize,
    /// Tasks a consumer holds (leased, not yet acked or nacked).
    pub in_flight: usize,
    /// Of `scheduled`: the backlog found at open not yet handed out (see
    /// [`Config::catch_up_tasks_per_sec`]).
    pub catch_up_backlog: usize,
    /// Dead letters kept.
    pub dead_letters: usize,
    /// Live tasks in all (`scheduled + ready + in_flight`), the figure
    /// [`Config::pending_tasks_max`] limits.
    pub pending: usize,
    /// Payload bytes held in memory (live tasks and dead letters).
    pub payload_bytes_in_memory: usize,
    /// Live tasks whose payload is on disk, in an overflow file (see
    /// [`Config::payload_window`]), far tasks included.
    pub payloads_on_disk: usize,
    /// Payloads read back into memory from overflow files since open
    /// (ahead of their due time by the prefetcher, when received, or with a
    /// far task promoted or found within the payload window).
    pub payloads_read_back: u64,
    /// Of `scheduled`: far tasks — due beyond [`Config::far_span`], out of
    /// the wheel, about 21 bytes of memory each (a 20-byte entry in the far
    /// index), key and payload on disk.
    pub far: usize,
    /// Far tasks moved back into the wheel since open, by promotion or by a
    /// reschedule finding them (those already within the far span
    /// at open are placed by the open itself and not counted).
    pub far_promoted: u64,
    /// Damaged overflow entries that no far task needed (their tasks
    /// cancelled or moved since the file was written) which the promotion
    /// of far tasks went past since open — entries that do not read back,
    /// and entries that read back but out of (due time, task id) order
    /// (each also a `tracing` warning naming the file and offset; those the
    /// open's own promotion went past are in
    /// [`Recovery::overflow_damage_skipped`]). A far task's own
    /// damaged entry is not counted: it poisons the engine. Not 0: the disk
    /// damaged data nothing needed any more — `kairos verify` names where.
    /// The payload prefetcher's own goings-past of damage are not counted
    /// (only logged): it can meet the entry the promotion counted, and an
    /// entry a live task needs, which that task's delivery reports.
    pub overflow_damage_skipped: u64,
    /// The longest a checkpoint (background or explicit), or a move of far
    /// tasks between checkpoints ([`Config::relocate_far_tasks`]), held the
    /// engine's lock at once since open: the longest every other call —
    /// schedule, cancel, receive, the driver's hand-outs — could have waited
    /// on one.
    /// See [`CheckpointReport::longest_hold`].
    pub checkpoint_hold_max: Duration,
    /// The longest the promotion of far tasks into the wheel held the
    /// engine's lock without a chance for a waiting thread to take it,
    /// since open: it offers the lock to waiting callers (and to the driver,
    /// when the prefetch thread promotes) after about a millisecond;
    /// reading the overflow files happens outside it. Above a millisecond
    /// when a single task's insertion grows a table.
    pub promotion_hold_max: Duration,
    /// Bytes of the pages holding live tasks' keys and payloads in memory
    /// when together they take 27 bytes to 1 KiB (shorter ones live in the
    /// task's entry, longer ones in an allocation of their own): 64 KiB
    /// pages, each of one entry size (multiples of 8 bytes). A page is
    /// given back once its last entry is freed, except the one page of its
    /// size kept with room; a page stays while any entry in it is live (or
    /// kept for a checkpoint reading it), so after many tasks are gone the
    /// pages can be partly free (reused first by new tasks). Address space
    /// reserved, an upper bound on the resident bytes (a page's tail is
    /// touched only when used).
    pub arena_bytes: usize,
    /// Checkpoint work that failed since open without a caller to tell:
    /// background checkpoints (`Config::checkpoint_log_bytes`,
    /// `Config::checkpoint_interval`) and moves of far tasks out of the
    /// wheel (between checkpoints, or inside any checkpoint, which goes on
    /// without them). Each is also a `tracing` warning with its error, and
    /// is tried again at the next trigger; none poisons the engine (the log
    /// and the previous checkpoint are intact). A count that keeps rising
    /// while the log grows means the data directory needs attention (a
    /// full disk, a damaged overflow file): the log is not trimmed meanwhile.
    /// A panic of the checkpointer or the prefetch thread (a bug) counts
    /// too: the engine goes on without that thread (no more background
    /// checkpoints or moves), and its shutdown answers `Poisoned`.
    pub background_failures: u64,
    /// Tasks created since open: one per task accepted by
    /// [`Engine::schedule`], [`Engine::schedule_at`],
    /// [`Engine::schedule_after`] and [`Engine::schedule_many`] (each task of
    /// the batch), by an [`Engine::reschedule`] of a key with no live task
    /// ([`RescheduleOutcome::Scheduled`]), by [`Engine::ack_and_schedule`]
    /// ([`AckScheduleOutcome::Scheduled`]), and by
    /// [`Engine::requeue_dead_letter`] (the new task it makes). Not counted:
    /// refused calls (nothing was created), a reschedule of a live task
    /// (`tasks_rescheduled`), a retry (`retries`), tasks recovered at open.
    /// Starts at 0 at every open (recovery replays no counts); never
    /// decreases.
    pub tasks_scheduled: u64,
    /// Reschedules of a live task since open: each [`Engine::reschedule`]
    /// answered [`RescheduleOutcome::Rescheduled`] (a waiting task — far
    /// ones included —, or a due one no consumer had received yet, given a
    /// new due time). A reschedule that made a new task counts in
    /// `tasks_scheduled` instead. Starts at 0 at every open; never
    /// decreases.
    pub tasks_rescheduled: u64,
    /// Tasks cancelled since open: each [`CancelOutcome::Cancelled`] that
    /// [`Engine::cancel`] or [`Engine::cancel_many`] answered (one per key
    /// that got it) — a task waiting for its first delivery or a retry, or
    /// due but not received by any consumer, that will never be delivered
    /// (again). Not counted: [`CancelOutcome::AlreadyDelivered`] (the
    /// holder's ack or nack, or its lease's end, counts when it comes) and
    /// [`CancelOutcome::NotFound`]. Starts at 0 at every open; never
    /// decreases.
    pub tasks_cancelled: u64,
    /// Deliveries since open: each time a consumer received a task
    /// ([`Consumer::recv`], `try_recv`, `recv_timeout`, `iter`). A task
    /// received again — after a nack, a lease expiry or a restart — counts
    /// again; at most once ([`DeliveryGuarantee::AtMostOnce`]) each receipt
    /// counts too. Not counted: a due task handed to the ready queue that no
    /// consumer received (cancelled or rescheduled first, or taken back by a
    /// clean shutdown). Starts at 0 at every open; never decreases.
    pub deliveries: u64,
    /// Deliveries acknowledged since open: one per delivery in each
    /// [`Engine::ack`] / [`Engine::ack_many`] / [`Engine::ack_and_schedule`]
    /// (or [`Consumer`]) call that was accepted, a delivery whose task was
    /// cancelled while held included (its ack is accepted). Not counted: refused acks, and
    /// deliveries at most once (finished when received; their `ack` does
    /// nothing). Starts at 0 at every open; never decreases.
    pub acks: u64,
    /// Deliveries reported failed since open: each accepted
    /// [`Engine::nack`] (or [`Consumer::nack`]), whatever its
    /// [`NackOutcome`] (a retry, a dead letter, or nothing for a task
    /// cancelled while held). Refused nacks are not counted. Starts at 0 at
    /// every open; never decreases.
    pub nacks: u64,
    /// Leases that ran out without an ack or a nack since open, as the
    /// driver ended them (less than a tick after their end; none while
    /// deliveries are paused): each retried its task, dead-lettered it, or
    /// — cancelled while held — finished it. Not counted: leases ended by a
    /// restart (their tasks are in [`Recovery::redelivered`] and
    /// [`Recovery::dead_lettered`]). Starts at 0 at every open; never
    /// decreases.
    pub lease_expiries: u64,
    /// Failed attempts since open — nacks and lease expiries — after which
    /// the task waits for another attempt ([`NackOutcome::Retry`]: a RETRY
    /// record). Starts at 0 at every open; never decreases.
    pub retries: u64,
    /// Tasks made dead letters since open: by a nack or a lease expiry of
    /// their last attempt ([`crate::RetryPolicy::max_attempts`]). Not
    /// counted: tasks dead-lettered by the open itself
    /// ([`Recovery::dead_lettered`]). Requeues and purges of dead letters
    /// take nothing off. Starts at 0 at every open; never decreases.
    pub tasks_dead_lettered: u64,
    /// Dead letters requeued since open ([`Engine::requeue_dead_letter`]
    /// answered a new task; its task counts in `tasks_scheduled` too). Not
    /// counted: refused requeues. Starts at 0 at every open; never
    /// decreases.
    pub dead_letters_requeued: u64,
    /// Dead letters purged since open ([`Engine::purge_dead_letter`]
    /// answered `true`). Starts at 0 at every open; never decreases.
    pub dead_letters_purged: u64,
}

/// The running totals of [`Stats`] (see there what each counts), kept in
/// the [`Core`]: each is a plain `+= 1` (or `+= n`) under the engine's lock,
/// on the path that makes the change.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    tasks_scheduled: u64,
    tasks_rescheduled: u64,
    tasks_cancelled: u64,
    deliveries: u64,
    acks: u64,
    nacks: u64,
    lease_expiries: u64,
    retries: u64,
    tasks_dead_lettered: u64,
    dead_letters_requeued: u64,
    dead_letters_purged: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Open,
    Closed,
    Poisoned(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverSleep {
    /// Working; will look at the wheel again before sleeping.
    Busy,
    /// Sleeping until this tick (or a wake-up).
    Until(Tick),
    /// Sleeping until woken (nothing scheduled, or a manual clock).
    Forever,
}

/// See [`Core::push_overdue`].
const OVERDUE_KEPT_MIN: usize = 1024;

/// Drops every entry of `queue` but the last of each task (slot and id),
/// keeping the order of those left: a task placed in the overdue queue again
/// is handed out at its new place, after the tasks placed before it. O(n).
fn keep_last_entries(queue: &mut VecDeque<(u32, TaskId)>) {
    let mut seen = HashSet::with_capacity(queue.len());
    let mut last: Vec<bool> = queue
        .iter()
        .rev()
        .map(|&entry| seen.insert(entry))
        .collect();
    last.reverse();
    let mut last = last.into_iter();
    queue.retain(|_| last.next().unwrap_or(true));
}

/// Everything behind the engine's one lock.
struct Core {
    status: Status,
    wheel: Wheel,
    tasks: TaskSlab,
    /// The tombstone index: key → task slot (tags only; keys live in
    /// the tasks).
    index: TaskIndex,
    payloads: PayloadStore,
    /// Tasks due at once (scheduled in the past, retried without backoff),
    /// in order; entries of cancelled tasks are skipped by id check.
    overdue: VecDeque<(u32, TaskId)>,
    /// A task waiting in `overdue` was placed there again (a reschedule to a
    /// due time already past): its earlier entry names it still but is
    /// stale, so the next drain keeps only the last entry of each task
    /// ([`keep_last_entries`]). Set only then: the hot path pays nothing.
    overdue_replaced: bool,
    /// The backlog found at open (overdue during downtime, in flight at a
    /// crash), oldest first, handed out at most at
    /// `Config::catch_up_tasks_per_sec`; stale entries skipped by id check.
    backlog: VecDeque<(u32, TaskId)>,
    /// Backlog tasks handed out so far (for the rate limit).
    backlog_taken: u64,
    /// Engine time, ns, from which the catch-up rate limit counts: the open,
    /// or the last [`Engine::resume_deliveries`].
    catch_up_start_ns: u128,
    /// Deliveries paused ([`Engine::pause_deliveries`]): the driver hands
    /// nothing out and the wheel stands still (no lease expires); it
    /// catches up, in due order, at [`Engine::resume_deliveries`].
    paused: bool,
    /// Due tasks waiting for a consumer, in hand-out order.
    ready: VecDeque<ReadyEntry>,
    /// Tasks in state `Ready`.
    ready_count: usize,
    /// The deliveries of driver passes whose records are not durable yet,
    /// oldest pass first: each joins `ready` once they are
    /// (`delivery::handout_loop`). Kept here, not with the hand-out thread,
    /// so that a reschedule drops a task's entry wherever it waits.
    handouts_pending: VecDeque<Vec<ReadyEntry>>,
    /// Ready entries a consumer took out of `ready` and whose payload it is
    /// reading from disk with the lock let go (`Shared::receive`): still
    /// handed out and unreceived, so a shutdown releases them and a
    /// reschedule drops them, as it does entries in `ready`.
    receiving: Vec<ReadyEntry>,
    /// Tasks in state `Leased` or `Abandoned`.
    in_flight_count: usize,
    /// Dead letters by task id. Changed through [`Core::insert_dead`] and
    /// [`Core::remove_dead`] once open (a checkpoint's snapshot of them).
    dead: dead::DeadLetters,
    /// The dead letters as they were at a checkpoint's LSN, while it reads
    /// them ([`Core::begin_dead_snapshot`]).
    dead_snapshot: Option<Box<DeadSnapshot>>,
    next_id: u64,
    wal: Option<Arc<Wal>>,
    sleep: DriverSleep,
    stop: bool,
    /// Engine time (ns) of the driver's last look at the clock before it
    /// went idle: `run_until_idle` waits until it has caught up with a clock
    /// reading, even within one tick (catch-up tokens are earned in ns).
    processed_ns: u128,
    /// The wall reading (ns since the epoch) of that same look: a forward
    /// wall step can bring far tasks within the far span, so
    /// `run_until_idle` waits for a pass after it too.
    processed_wall_ns: i128,
    /// Log bytes appended since the last checkpoint (record bodies and
    /// headers).
    log_bytes_since_checkpoint: u64,
    /// Size of the last checkpoint written or loaded, bytes.
    last_checkpoint_bytes: u64,
    /// The log grew enough: the checkpointer should run.
    checkpoint_wanted: bool,
    /// Overflow files in use: number → entries written to it (live ones
    /// are counted by the payload store).
    overflow_files: std::collections::BTreeMap<u32, u64>,
    /// Number of the next overflow file.
    next_overflow_file: u32,
    /// Payloads read back from overflow files so far (prefetched or read
    /// at receive).
    payloads_read_back: u64,
    /// The hash of far tasks' keys (keyed by the store id).
    hasher: KeyHasher,
    /// Far tasks: due beyond the far span (`Config::far_span`), out of the slab and the wheel.
    far: FarIndex,
    /// Per overflow file holding far tasks, where promotion stands.
    far_cursors: std::collections::BTreeMap<u32, far::FarCursor>,
    /// A promotion of far tasks is under way (`Shared::promote_far`): by
    /// the prefetch thread, or by the driver when far tasks are already due
    /// (a clock step). One at a time; the other waits on `promote_cv`.
    promoting: bool,
    /// Far tasks moved back into the wheel so far.
    far_promoted: u64,
    /// [`Stats::overflow_damage_skipped`].
    overflow_damage_skipped: u64,
    /// [`Stats::background_failures`].
    background_failures: u64,
    /// The task totals of [`Stats`] ([`Stats::tasks_scheduled`] and after).
    totals: Totals,
    /// The longest single hold of this lock by a checkpoint since open.
    checkpoint_hold_max: Duration,
    /// See [`Stats::promotion_hold_max`].
    promotion_hold_max: Duration,
    /// First attempts due beyond the far span scheduled since far tasks were
    /// last taken out of the wheel ([`Config::relocate_far_tasks`]).
    far_scheduled: u64,
    /// Memory of those `far_scheduled` tasks as
    /// [`Config::relocate_far_bytes`] counts it (key, payload and
    /// `checkpointing::WHEEL_TASK_BYTES` each).
    far_scheduled_bytes: u64,
    /// `far_scheduled` and `far_scheduled_bytes` as they stood when the move
    /// under way started (0 when none is): the far tasks in the making it
    /// takes out of the wheel, still in memory until it is applied.
    moving: (u64, u64),
    /// The checkpointer is asked to take them out (without a checkpoint).
    relocation_wanted: bool,
    /// A move out of memory (`Shared::relocate`) is under way.
    relocating: bool,
    /// The last move out of memory failed: producers are not held back
    /// for the next one (`Shared::await_relocation`).
    relocation_failed: bool,
    /// The checkpointer thread has ended: nothing moves far tasks in the
    /// background any more, so producers are not held back.
    checkpointer_gone: bool,
    /// Raised by each reset of a promotion cursor (`far::FarCursor`).
    far_generation: u32,
    /// The earliest due time of the tasks checkpoints made far (or moved
    /// while far) since the promotion last set it to `u64::MAX`: a pass
    /// that sees it within its span stops ([`Shared::promote_far`]).
    far_reset_due_min: u64,
    /// The engine's counters as they stood when it stopped and its memory
    /// was released ([`Core::release_memory`]): what [`Engine::stats`]
    /// answers from then on.
    closed_stats: Option<Stats>,
    /// Tests: promotion passes that stopped for it.
    #[cfg(test)]
    promote_interrupts: u64,
    /// Tests: scans of the tasks for the entries the prefetcher needs past
    /// damage (`Core::needed_entries_after`).
    #[cfg(test)]
    needed_entry_scans: u64,
}

/// The structures [`Core::release_memory`] took out of a stopped engine,
/// freed when this is dropped (after the engine's lock is let go).
struct ReleasedMemory {
    _wheel: Wheel,
    _tasks: TaskSlab,
    _index: TaskIndex,
    _payloads: PayloadStore,
    _overdue: VecDeque<(u32, TaskId)>,
    _backlog: VecDeque<(u32, TaskId)>,
    _ready: VecDeque<ReadyEntry>,
    _handouts_pending: VecDeque<Vec<ReadyEntry>>,
    _receiving: Vec<ReadyEntry>,
    _dead: dead::DeadLetters,
    _dead_snapshot: Option<Box<DeadSnapshot>>,
    _far: FarIndex,
    _far_cursors: std::collections::BTreeMap<u32, far::FarCursor>,
}

/// One ready-queue entry; stale (skipped) unless the slot still holds task
/// `id` in state `Ready`.
#[derive(Debug, Clone, Copy)]
struct ReadyEntry {
    slot: u32,
    id: TaskId,
    /// Wall time of the hand-out, UTC ms (from its deliver record).
    fired_ms: u64,
}

impl Core {
    /// Queues task `slot`/`id`, due at once, for the driver's next pass.
    /// While deliveries are paused nothing drains the queue, so once it
    /// holds more than [`OVERDUE_KEPT_MIN`] entries and more than twice as
    /// many as there are tasks, the entries of tasks cancelled or placed
    /// again since (a task rescheduled to the past over and over adds one
    /// each time) are dropped: amortised O(1).
    fn push_overdue(&mut self, slot: u32, id: TaskId) {
        // Out of the backlog, if it was there: its entry there is stale.
        // (Read first: `get_mut` copies the task for a checkpoint's snapshot.)
        self.tasks.set_in_backlog(slot, false);
        self.overdue.push_back((slot, id));
        if self.paused && self.overdue.len() > OVERDUE_KEPT_MIN.max(2 * self.tasks.len()) {
            let tasks = &self.tasks;
            self.overdue
                .retain(|&(slot, id)| tasks.waits_untimed(slot, id));
            keep_last_entries(&mut self.overdue);
            self.overdue_replaced = false;
        }
    }

    /// The overdue queue's live entries, in order, each task once at the
    /// place of its last entry: see [`Core::overdue_replaced`].
    fn take_overdue(&mut self, out: &mut Vec<(u32, TaskId)>) {
        if std::mem::take(&mut self.overdue_replaced) {
            keep_last_entries(&mut self.overdue);
        }
        let tasks = &self.tasks;
        out.extend(
            self.overdue
                .drain(..)
                .filter(|&(slot, id)| tasks.waits_untimed(slot, id)),
        );
    }

    /// The key's tag in the index.
    fn key_tag(&self, key: &[u8]) -> u32 {
        self.index.tag(key)
    }

    /// The slot of the live task with `key` (whose tag is `tag`), if any.
    fn find_slot(&self, tag: u32, key: &[u8]) -> Option<u32> {
        self.index.find(tag, |slot| self.holds_key(slot, key))
    }

    /// Whether the task in `slot` has `key`: the index's check of a tag
    /// match, out of line so that the probe around it (a schedule's finds
    /// almost no match) keeps its registers.
    #[inline(never)]
    fn holds_key(&self, slot: u32, key: &[u8]) -> bool {
        self.tasks
            .get(slot)
            .is_some_and(|t| self.payloads.key(&t.bytes) == key)
    }

    /// [`Core::find_slot`] as the index entry found (its slot, and where it
    /// is, for removing it without a second probe:
    /// [`TaskIndex::remove_found`]).
    #[inline]
    fn find_entry(&self, tag: u32, key: &[u8]) -> Option<Found> {
        self.index.find_entry(tag, |slot| self.holds_key(slot, key))
    }

    /// Adds a dead letter.
    fn insert_dead(&mut self, id: u64, task: DeadTask) {
        if let Some(snapshot) = &mut self.dead_snapshot {
            snapshot.inserted.insert(id);
        }
        self.dead.insert(id, task);
    }

    /// Removes a dead letter (requeued or purged); whether there was one.
    fn remove_dead(&mut self, id: u64) -> bool {
        let Some(task) = self.dead.remove(id) else {
            return false;
        };
        if let Some(snapshot) = &mut self.dead_snapshot {
            let unread = snapshot.ids[snapshot.next..].binary_search(&id).is_ok();
            if !snapshot.inserted.remove(&id) && unread {
                // Live at the snapshot and not read yet: kept for it, as
                // it was.
                snapshot.removed.insert(id, task);
            }
        }
        true
    }

    /// Starts a snapshot of the dead letters: their ids now, sorted (8 bytes
    /// each, O(D log D) in the caller's hold); until it ends, one removed
    /// before it is read is kept as it was and one added is noted.
    fn begin_dead_snapshot(&mut self) {
        let ids: Vec<u64> = self.dead.ids().collect();
        self.dead_snapshot = Some(Box::new(DeadSnapshot {
            ids,
            next: 0,
            removed: HashMap::default(),
            inserted: HashSet::default(),
        }));
    }

    /// Reads the next `max` dead letters of the snapshot (at least one), in
    /// id order, passing each to `emit`, and stops early after one for
    /// which `emit` returns false (a budget of bytes). Whether all have
    /// been read (the snapshot then ends), or `None` if none is under way.
    fn read_dead_snapshot(
        &mut self,
        max: usize,
        mut emit: impl FnMut(u64, &DeadTask) -> bool,
    ) -> Option<bool> {
        let snapshot = self.dead_snapshot.as_mut()?;
        let end = snapshot
            .next
            .saturating_add(max.max(1))
            .min(snapshot.ids.len());
        while snapshot.next < end {
            let id = snapshot.ids[snapshot.next];
            snapshot.next += 1;
            let go_on = if let Some(task) = snapshot.removed.remove(&id) {
                emit(id, &task)
            } else if snapshot.inserted.contains(&id) {
                true
            } else {
                self.dead.get(id).is_none_or(|task| emit(id, task))
            };
            if !go_on {
                break;
            }
        }
        let done = snapshot.next == snapshot.ids.len();
        if done {
            self.dead_snapshot = None;
        }
        Some(done)
    }

    /// Stores `task`, whose key's tag is `tag`, in the slab and the index;
    /// `None` if the slab is full.
    fn insert_task(&mut self, task: Task, tag: u32) -> Option<u32> {
        let slot = self.tasks.insert(task)?;
        self.index.insert(tag, slot);
        Some(slot)
    }

    /// Gives back the bytes the task in `slot` held (just removed or
    /// replaced): freed at once, unless the checkpoint snapshot under way
    /// saved that task as it was and still names them (then kept until it
    /// has read it).
    fn release_bytes(&mut self, slot: u32, bytes: crate::task::PayloadRef) {
        if self.tasks.snapshot_names(slot, &bytes) {
            self.payloads.release_kept(bytes);
        } else {
            self.payloads.release(bytes);
        }
    }

    /// The counters of [`Engine::stats`], from the structures.
    fn stats(&self) -> Stats {
        let core = self;
        let pending = core.tasks.len() + core.far.len();
        Stats {
            scheduled: pending - core.ready_count - core.in_flight_count,
            ready: core.ready_count,
            in_flight: core.in_flight_count,
            catch_up_backlog: {
                debug_assert_eq!(
                    core.tasks.in_backlog(),
                    core.backlog
                        .iter()
                        .filter(|&&(slot, id)| core.tasks.waits_in_backlog(slot, id))
                        .count(),
                    "tasks marked in the backlog against its live entries"
                );
                core.tasks.in_backlog()
            },
            dead_letters: core.dead.len(),
            pending,
            payload_bytes_in_memory: core.payloads.bytes_in_memory() + core.dead.payload_bytes(),
            payloads_on_disk: core.payloads.tasks_on_disk() as usize + core.far.len(),
            payloads_read_back: core.payloads_read_back,
            far: core.far.len(),
            far_promoted: core.far_promoted,
            overflow_damage_skipped: core.overflow_damage_skipped,
            background_failures: core.background_failures,
            tasks_scheduled: core.totals.tasks_scheduled,
            tasks_rescheduled: core.totals.tasks_rescheduled,
            tasks_cancelled: core.totals.tasks_cancelled,
            deliveries: core.totals.deliveries,
            acks: core.totals.acks,
            nacks: core.totals.nacks,
            lease_expiries: core.totals.lease_expiries,
            retries: core.totals.retries,
            tasks_dead_lettered: core.totals.tasks_dead_lettered,
            dead_letters_requeued: core.totals.dead_letters_requeued,
            dead_letters_purged: core.totals.dead_letters_purged,
            checkpoint_hold_max: core.checkpoint_hold_max,
            promotion_hold_max: core.promotion_hold_max,
            arena_bytes: core.payloads.arena_stats().bytes_reserved,
        }
    }

    /// Once the engine has stopped — its threads joined, every call
    /// answered `Closed` or `Poisoned` from the status alone — replaces the
    /// structures that hold its tasks (the slab, the index, the wheel, the
    /// payload store with its arena, the far index, the queues) with empty
    /// ones, so that a [`Consumer`] kept beyond the engine keeps none of
    /// their memory. The counters stay ([`Consumer::ready`] answers as
    /// before), and [`Engine::stats`] answers from then on what it did
    /// before this (`closed_stats`). The dead letters go too unless
    /// `keep_dead` (after [`Engine::shutdown`] the handle still lists them).
    /// Returns what it took out, to be dropped with the lock let go.
    fn release_memory(&mut self, keep_dead: bool) -> ReleasedMemory {
        if self.closed_stats.is_none() {
            self.closed_stats = Some(self.stats());
        }
        let index = self.index.empty_like();
        // Prefetches before the lock (a call refused as `Closed`) look
        // at no freed table.
        index.publish();
        ReleasedMemory {
            _wheel: std::mem::take(&mut self.wheel),
            _tasks: std::mem::take(&mut self.tasks),
            _index: std::mem::replace(&mut self.index, index),
            _payloads: std::mem::take(&mut self.payloads),
            _overdue: std::mem::take(&mut self.overdue),
            _backlog: std::mem::take(&mut self.backlog),
            _ready: std::mem::take(&mut self.ready),
            _handouts_pending: std::mem::take(&mut self.handouts_pending),
            _receiving: std::mem::take(&mut self.receiving),
            _dead: if keep_dead {
                dead::DeadLetters::default()
            } else {
                std::mem::take(&mut self.dead)
            },
            _dead_snapshot: self.dead_snapshot.take(),
            _far: std::mem::take(&mut self.far),
            _far_cursors: std::mem::take(&mut self.far_cursors),
        }
    }

    fn check_open(&self) -> Result<(), Status> {
        match &self.status {
            Status::Open => Ok(()),
            other => Err(other.clone()),
        }
    }
}

/// Runs `body`, the loop of the engine's thread `name` that delivery needs
/// (the driver, the hand-out thread). A panic in it (a bug) poisons the
/// engine at once with the panic's message, so that calls and consumers
/// answer `Poisoned` instead of waiting on a thread that is gone (a
/// consumer blocked in `recv` would wait forever, and tasks scheduled
/// meanwhile would never fire); the thread then ends without unwinding
/// further (the default panic hook has already printed it).
/// Needs a build that unwinds: with `panic = "abort"` the process ends.
pub(super) fn poison_on_panic(shared: &Shared, name: &str, body: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        let message = panic_message(panic.as_ref());
        shared.poison(format!("the {name} thread panicked: {message}"));
    }
}

/// Runs `body`, the loop of the engine's background thread `name` (the
/// checkpointer, the prefetch thread), whose work the engine can do without:
/// a panic in it (a bug) is counted in [`Stats::background_failures`] and
/// logged at once, and the engine goes on without the thread (producers no
/// longer wait for its moves; the driver promotes far tasks itself); the
/// panic then goes on unwinding, so a shutdown's join reports it as
/// `Poisoned`.
fn count_panic(shared: &Shared, name: &str, body: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        tracing::error!(
            panic = panic_message(panic.as_ref()),
            "the {name} thread panicked; the engine goes on without it"
        );
        shared.core.lock().background_failures += 1;
        std::panic::resume_unwind(panic);
    }
}

/// A panic payload's message, if it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// How many tasks ahead recovery's load loop prefetches: enough to keep
/// several misses to memory in flight while the loop works on the current
/// task, few enough that the lines are still cached when it gets there.
const PREFETCH_AHEAD: usize = 16;

/// How many keys ahead `schedule_many` and `cancel_many` prefetch the index
/// bucket each key's lookup reads: the lookups' misses overlap.
const BATCH_PREFETCH_AHEAD: usize = 8;

/// For a loop over `tags` looking each up in `index`, at step `i`: starts
/// loading the bucket of the lookup [`BATCH_PREFETCH_AHEAD`] steps ahead
/// (at step 0, of every lookup up to it).
fn prefetch_lookups(index: &TaskIndex, tags: &[u32], i: usize) {
    let first = if i == 0 { 0 } else { i + BATCH_PREFETCH_AHEAD };
    for &tag in tags.iter().take(i + BATCH_PREFETCH_AHEAD + 1).skip(first) {
        index.prefetch(tag);
    }
}

/// The index of the first task of `new` whose key an earlier task of it
/// has, if any (what a scan with a set of the keys seen stops at). Equal
/// keys have equal tags (`tags[i]` is `new[i]`'s), so the scan keeps a
/// small open-addressing table of the indices seen by tag (linear probing,
/// at most half full) and compares keys only under an equal tag: O(n)
/// expected, no key hashed again, no allocation for a single task. (It
/// replaced a function that collected and sorted (tag, index) pairs: with
/// it `schedule_many` took 1 253 instructions per task in `valgrind
/// --tool=callgrind`, 126 of them in the sort; with the table, 1 074.)
fn first_repeated_key(new: &[NewTask<'_>], tags: &[u32]) -> Option<usize> {
    if new.len() < 2 {
        return None;
    }
    // At least twice the tasks, a power of two: probes stay short.
    let bits = (new.len() * 2).next_power_of_two().trailing_zeros().max(1);
    let mask = (1usize << bits) - 1;
    // `i + 1` of a task seen; 0: empty.
    let mut seen = vec![0u32; mask + 1];
    for (i, (t, &tag)) in new.iter().zip(tags).enumerate() {
        // Fibonacci hashing: the top bits of the product.
        let mut at = (u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        loop {
            match seen[at] {
                0 => {
                    // `new.len() <= BATCH_TASKS_MAX`, far below u32::MAX.
                    seen[at] = i as u32 + 1;
                    break;
                }
                earlier => {
                    let earlier = earlier as usize - 1;
                    if tags[earlier] == tag && new[earlier].key == t.key {
                        return Some(i);
                    }
                    at = (at + 1) & mask;
                }
            }
        }
    }
    None
}

/// A task's handle in recovery's load: due time, id, its index in the
/// tasks read, and its key's tag.
type Handle = (u64, u64, u32, u32);

/// The handles of `tasks` sorted oldest first (equal due times in id
/// order), and the indices (ascending) of those `dies` is true for. Each
/// key's tag is computed here, in the order the keys were read (and
/// allocated), rather than in due order, when each key would be a cache
/// miss. Sorting 24-byte handles rather than the tasks themselves; each
/// half on a thread of its own, then merged.
fn sorted_handles(
    tasks: &[(u64, LiveTask)],
    index: &TaskIndex,
    dies: impl Fn(&LiveTask) -> bool + Sync,
) -> (Vec<Handle>, Vec<u32>) {
    let tag = index.tagger();
    let build = |from: usize, part: &[(u64, LiveTask)]| {
        let mut handles: Vec<Handle> = Vec::with_capacity(part.len());
        let mut dying = Vec::new();
        for (i, (id, t)) in part.iter().enumerate() {
            // Fits: the caller checked there are fewer than 2^32 tasks.
            let i = (from + i) as u32;
            handles.push((t.due_ms, *id, i, tag(&t.key)));
            if dies(t) {
                dying.push(i);
            }
        }
        handles.sort_unstable_by_key(|&(due_ms, id, _, _)| (due_ms, id));
        (handles, dying)
    };
    let mid = tasks.len() / 2;
    let (first, second) = tasks.split_at(mid);
    let ((a, mut dying), (b, dying_b)) = std::thread::scope(|s| {
        let other = std::thread::Builder::new()
            .name("kairos-open-sort".into())
            .spawn_scoped(s, || build(mid, second));
        let a = build(0, first);
        let b = match other {
            Ok(h) => h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => build(mid, second),
        };
        (a, b)
    });
    dying.extend(dying_b);
    // Merge the two sorted halves.
    let mut order = Vec::with_capacity(a.len() + b.len());
    let (mut x, mut y) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let take_a = match (x.peek(), y.peek()) {
            (Some(p), Some(q)) => (p.0, p.1) <= (q.0, q.1),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_a { x.next() } else { y.next() };
        order.extend(next);
    }
    (order, dying)
}

/// State shared by the engine handle, the driver thread and consumers.
pub(crate) struct Shared {
    config: Config,
    clock: Arc<dyn Clock>,
    tick_ns: u128,
    /// [`Config::far_span`] in ticks when far tasks are also moved between
    /// checkpoints ([`Config::relocate_far_tasks`]; on disk only), so the
    /// schedule path counts them without a division.
    relocation_horizon_ticks: Option<u64>,
    origin_monotonic: Duration,
    /// Wall-clock phase of the tick grid at open: engine time starts here so
    /// that tick boundaries fall on wall-clock tick boundaries.
    grid_phase_ns: u128,
    core: Mutex<Core>,
    /// The index's hasher and table address, for a prefetch before the lock.
    index_probe: Arc<crate::index::IndexProbe>,
    /// The driver waits here; notified on an earlier deadline, a clock move,
    /// a stop.
    driver_cv: Condvar,
    /// `run_until_idle` waits here for the driver to catch up.
    idle_cv: Condvar,
    /// Consumers wait here for the ready queue.
    ready_cv: Condvar,
    /// Consumers waiting in [`Consumer::recv_async`]: woken wherever
    /// `ready_cv` is notified ([`Shared::notify_ready`]).
    async_waiters: Mutex<crate::consumer::AsyncWaiters>,
    /// Distinguishes this engine instance (this open) from every other in
    /// the process, so a delivery is only ever acked by the engine that made it.
    engine_id: u64,
    /// The storage and data directory (none in memory).
    disk: Option<checkpointing::Disk>,
    /// Held for the whole of a checkpoint, and of a move of far tasks between
    /// checkpoints; the newest checkpoint's LSN.
    checkpointing: Mutex<checkpointing::CheckpointBook>,
    /// The checkpointer waits here (with the core lock).
    checkpoint_cv: Condvar,
    /// Producers held back by [`Shared::await_relocation`] wait here (with
    /// the core lock); notified when a move out of memory starts or ends.
    relocation_cv: Condvar,
    /// Signalled when a promotion of far tasks ends (`Core::promoting`).
    promote_cv: Condvar,
    /// The payload prefetcher waits here (with the core lock).
    prefetch_cv: Condvar,
    /// Twice what starts a move of far tasks out of the wheel has been
    /// scheduled since the last one started: read without the lock by
    /// [`Shared::await_relocation`] (the lock is taken only when set).
    far_backlog: std::sync::atomic::AtomicBool,
    /// Payloads replaced by a reschedule so far (changed under the core
    /// lock) — the only way a waiting task changes its payload and keeps
    /// its id. A move out of memory that sees this unchanged since it began
    /// copying applies its moves without reading its file back.
    payload_replacements: std::sync::atomic::AtomicU64,
    /// Tests: run between two holds of a checkpoint's encoding (the lock
    /// is free), to change the state under its feet.
    #[cfg(test)]
    hold_hook: Mutex<Option<HoldHook>>,
    /// Tests: run once by a `recv_async` poll between its first look at the
    /// ready queue and the filing of its waker (taken out as it runs).
    #[cfg(test)]
    pub(crate) recv_async_hook: Mutex<Option<HoldHook>>,
    /// Tests: run where the promotion yields the lock (unlocked), to change
    /// the state under its feet.
    #[cfg(test)]
    promote_yield_hook: Mutex<Option<HoldHook>>,
    /// Tests: run where a checkpoint yields the lock in the middle of a
    /// hold (unlocked), to change the state under its feet.
    #[cfg(test)]
    checkpoint_yield_hook: Mutex<Option<HoldHook>>,
    /// Tests: whether the driver started its hand-out thread
    /// (`delivery::HANDOUT_THREAD_*`).
    #[cfg(test)]
    handout_thread: std::sync::atomic::AtomicU8,
    /// Tests: the driver (`Some(false)`) or the hand-out thread
    /// (`Some(true)`) panics at its next pass, as a bug would.
    #[cfg(test)]
    panic_in_pass: Mutex<Option<bool>>,
}

/// The dead letters at a checkpoint's LSN while it reads them (see
/// [`Core::begin_dead_snapshot`]).
#[derive(Debug)]
struct DeadSnapshot {
    /// Their ids, ascending.
    ids: Vec<u64>,
    /// `ids[..next]` have been read.
    next: usize,
    /// Removed since, before they were read, as they were.
    removed: HashMap<u64, DeadTask, foldhash::fast::RandomState>,
    /// Added since (not part of the snapshot).
    inserted: HashSet<u64, foldhash::fast::RandomState>,
}

/// See `Shared::hold_hook`.
#[cfg(test)]
type HoldHook = Box<dyn FnMut(&Shared) + Send>;

/// A background thread: its name, whether it runs, its body.
type BackgroundThread = (&'static str, bool, fn(&Shared));

/// Source of [`Shared::engine_id`].
static NEXT_ENGINE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An embedded delayed-task engine.
///
/// Schedule tasks with a key, a due time and a payload; cancel them by key in
/// O(1); receive them when due through a [`Consumer`]; acknowledge them. With
/// a directory, every change is in a write-ahead log first and survives
/// crashes per the configured [`kairos_wal::Durability`].
///
/// `Engine` is `Send + Sync`: share it by reference or in an `Arc`. Dropping
/// it without [`Engine::shutdown`] stops it like a process crash would, and
/// never panics: every call that returned is kept, in every durability mode
/// (its record is with the OS; a power loss before it is synced is another
/// matter), but the log is not closed cleanly, and a task handed out at the
/// drop — held by a consumer, or waiting unreceived in the ready queue —
/// has used that attempt: it comes again as attempt + 1 after the next
/// open, or is dead-lettered if that was its last. An engine on disk dropped
/// while open says so in a `tracing` warning. Once it is dropped (or shut
/// down), the memory of its tasks — keys, payloads, the timing wheel, the
/// indexes — is freed even while [`Consumer`] handles of it are kept.
pub struct Engine {
    shared: Arc<Shared>,
    /// Registered with the clock; unregistered when the engine drops.
    clock_waker: Waker,
    driver: Mutex<Option<JoinHandle<()>>>,
    /// The checkpointer and the payload prefetcher, if running.
    background: Mutex<Vec<JoinHandle<()>>>,
    /// Held for the whole of [`Engine::shutdown`]: a second call (another
    /// thread's) waits for the first to finish, instead of finding the
    /// threads and the log taken and returning while the first still
    /// closes the log.
    shutting_down: Mutex<()>,
    dir_lock: Mutex<Option<Box<dyn LockGuard>>>,
    recovery: Recovery,
    dir: Option<PathBuf>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// Wakes the driver when a manual clock moves.
struct DriverWaker(Weak<Shared>);

impl Wake for DriverWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(shared) = self.0.upgrade() {
            // Take the lock so the notification cannot slip in between the
            // driver reading the clock and starting to wait.
            let _core = shared.core.lock();
            shared.driver_cv.notify_all();
        }
    }
}

impl Engine {
    /// Opens (or creates) the engine stored in directory `dir` with the real
    /// file system and the system clock. Tasks that fell due while it was
    /// closed are delivered at once, oldest first (at
    /// [`Config::catch_up_tasks_per_sec`] if set; none while
    /// [`Config::deliveries_paused`]); deliveries never acked are delivered
    /// again as attempt + 1, or dead-lettered if that was their last
    /// ([`Engine::recovery`] counts both).
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] (checked before the directory is
    /// touched); [`OpenError::Io`] if the directory cannot be created or
    /// locked (a path that is a file, or not writable); [`OpenError::Locked`]
    /// if the directory is open elsewhere; [`OpenError::Wal`] if the log
    /// cannot be read or recovered (I/O errors, corruption naming file and
    /// offset, a foreign or missing segment); [`OpenError::Checkpoint`],
    /// [`OpenError::Overflow`] and [`OpenError::CheckpointMismatch`] for a
    /// checkpoint or overflow file that is damaged or does not fit the log;
    /// [`OpenError::FarEntryUnreadable`] for a far task live (or a dead
    /// letter) at the end of the log whose entry a record after the
    /// checkpoint needed and does not read back.
    /// An empty path is refused as [`OpenError::Io`] (`InvalidInput`).
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine, OpenError> {
        Self::open_with(
            dir,
            config,
            Arc::new(FsStorage),
            Arc::new(SystemClock::new()),
        )
    }

    /// [`Engine::open`] with an explicit storage (e.g. `kairos_wal::SimStorage`
    /// for crash tests, or `kairos_wal::FsStorage`, the real file system
    /// `open` uses) and clock (e.g. [`crate::ManualClock`]). A `SimStorage`
    /// clone shares its files: keep one to cut the power and to open the
    /// same directory again (the example of [`Engine::sync`] does). Drop the
    /// engine before the cut: its threads could otherwise go on writing to
    /// the new image ([`kairos_wal::SimStorage::power_cut`]).
    ///
    /// # Errors
    /// As [`Engine::open`].
    pub fn open_with(
        dir: impl AsRef<Path>,
        config: Config,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
    ) -> Result<Engine, OpenError> {
        config.check()?;
        let dir = dir.as_ref().to_path_buf();
        if dir.as_os_str().is_empty() {
            // `create_dir_all("")` succeeds and the files would land in the
            // working directory: an unset variable, most likely.
            return Err(OpenError::Io {
                op: "open data directory",
                path: dir,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the data directory path is empty",
                ),
            });
        }
        storage
            .create_dir_all(&dir)
            .map_err(|source| OpenError::Io {
                op: "create directory",
                path: dir.clone(),
                // `create_dir_all` fails so only where the path itself is
                // something else than a directory (a parent that is one
                // fails with "Not a directory"): "File exists" would not
                // say what to fix.
                source: if source.kind() == std::io::ErrorKind::AlreadyExists {
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "it exists and is not a directory",
                    )
                } else {
                    source
                },
            })?;
        let lock_path = dir.join("LOCK");
        let dir_lock = storage.lock(&lock_path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::WouldBlock {
                OpenError::Locked { path: dir.clone() }
            } else {
                OpenError::Io {
                    op: "lock",
                    path: lock_path.clone(),
                    source,
                }
            }
        })?;
        let options = WalOptions {
            segment_bytes: config.segment_bytes,
            durability: config.durability,
            synced_mark_delay: config.synced_mark_delay,
            proof_before_ack: config.proof_before_ack,
            ..WalOptions::default()
        };
        let loaded = checkpointing::load(storage.as_ref(), &dir)?;
        let wal_dir = dir.join("wal");
        if let Some(loaded) = &loaded {
            let loaded = &loaded.meta;
            match kairos_wal::read_store_id(storage.as_ref(), &wal_dir) {
                // A checkpoint without its log: refuse rather than start a
                // new, empty log beside it.
                Ok(None) => {
                    let meta = wal_dir.join(kairos_wal::format::META_FILE_NAME);
                    return Err(OpenError::CheckpointMismatch {
                        path: loaded.path.clone(),
                        reason: format!("the log's {} is missing", meta.display()),
                    });
                }
                // Another directory's checkpoint: say so before replaying
                // anything on it (its overflow files would look foreign too).
                Ok(Some(store_id)) if store_id != loaded.store_id => {
                    return Err(OpenError::CheckpointMismatch {
                        path: loaded.path.clone(),
                        reason: "it belongs to another log (store id differs)".into(),
                    });
                }
                Ok(Some(_)) => {}
                Err(WalError::Io { op, path, source }) => {
                    return Err(OpenError::Io { op, path, source })
                }
                // A damaged META (wrong size, magic, CRC or version): the
                // log's own open below reports it, as it would without a
                // checkpoint.
                Err(_) => {}
            }
        }
        let (mut replay, mut checkpoint) = match loaded {
            Some(l) => (l.replay, Some(l.meta)),
            // The key rule is checked once, on the tasks the replay ends
            // with, by the index `load_replayed` builds.
            None => (Replay::new(true).without_key_rule(), None),
        };
        let covered = checkpoint.as_ref().map_or(0, |c| c.lsn);
        let mut replayed_after = 0u64;
        let overflow_dir = dir.join(crate::overflow::OVERFLOW_DIR_NAME);
        // Far tasks exist only with a checkpoint; their key hash is keyed
        // by its store id (checked against the log's above).
        let far_hasher = checkpoint
            .as_ref()
            .map(|c| crate::far::KeyHasher::new(&c.store_id));
        // A read that failed (EIO, ENOSPC: not a missing file, not bytes read and found
        // wrong) says nothing about the entry: the open fails at that record, rather than
        // hold the task by id as for damage (`Replay::apply_with`).
        // The reason a held task's entry did not read is given without the
        // file and offset, which `OpenError::FarEntryUnreadable` names.
        let read_failed: std::cell::Cell<Option<String>> = std::cell::Cell::new(None);
        let mut resolve = |t: &crate::checkpoint::FarTask| {
            use crate::overflow::OverflowReadError;
            let path = overflow_dir.join(crate::overflow::file_name(t.file));
            let e = crate::overflow::read_entry(storage.as_ref(), &path, t.offset, t.id, None)
                .map_err(|e| match e {
                    OverflowReadError::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        "the overflow file is missing".to_owned()
                    }
                    OverflowReadError::Io { .. } => {
                        read_failed.set(Some(format!(
                            "cannot read the overflow entry of far task {}: {e}",
                            t.id
                        )));
                        e.to_string()
                    }
                    OverflowReadError::Corrupt { reason, .. } => reason,
                })?;
            if far_hasher
                .as_ref()
                .is_some_and(|h| h.hash(&e.key) != t.key_hash)
            {
                return Err(
                    "the key in the entry does not hash to the key hash the checkpoint \
                     holds for the task"
                        .to_owned(),
                );
            }
            Ok((e.key, e.due_ms))
        };
        let opened = Wal::open(Arc::clone(&storage), &wal_dir, options, &mut |view| {
            if view.lsn.0 <= covered {
                return Ok(());
            }
            replayed_after += 1;
            let record = Record::decode(view.record_type, view.body)
                .map_err(|e| ReplayError(e.to_string()))?;
            replay
                .apply_with(&record, &mut resolve)
                .map_err(|e| ReplayError(e.to_string()))?;
            match read_failed.take() {
                Some(failed) => Err(ReplayError(failed)),
                None => Ok(()),
            }
        });
        let (wal, report) = opened.map_err(|e| match e {
            WalError::Locked { .. } => OpenError::Locked { path: dir.clone() },
            // Replaying the log on an older checkpoint because the newest one
            // is damaged, and the log does not fit it: the damage is the news.
            WalError::Replay { .. }
                if checkpoint
                    .as_ref()
                    .is_some_and(|c| c.newer_damaged.is_some()) =>
            {
                checkpoint
                    .as_mut()
                    .and_then(|c| c.newer_damaged.take())
                    .unwrap_or(OpenError::Wal(e))
            }
            other => OpenError::Wal(other),
        })?;
        if let Some(meta) = &mut checkpoint {
            checkpointing::check_against_log(meta, &wal, replayed_after)?;
        }
        // A far task whose entry a record needed and could not read is
        // finished by a later record (fired and acked, cancelled) or the
        // directory cannot be served: no key, due time or payload for it.
        if let Err(held) = replay.unresolved_at_end() {
            return Err(OpenError::FarEntryUnreadable {
                task_id: held.task.id,
                dead_letter: held.dead_letter,
                path: overflow_dir.join(crate::overflow::file_name(held.task.file)),
                offset: held.task.offset,
                reason: held.task.why,
            });
        }
        if checkpoint.is_none() && report.first_lsn.0 > 1 {
            // Segments were deleted after a checkpoint that is gone: replaying
            // what is left would silently lose the tasks before it.
            return Err(OpenError::CheckpointMismatch {
                path: dir.join(crate::checkpoint::CHECKPOINT_DIR_NAME),
                reason: format!(
                    "there is no checkpoint, but the log starts at LSN {}: the checkpoint that \
                     covers the records before it is missing",
                    report.first_lsn.0
                ),
            });
        }
        let checkpoint_bytes = checkpoint.as_ref().map_or(0, |c| c.bytes);
        let (next_overflow_file, overflow_written) =
            checkpointing::prepare_overflow(storage.as_ref(), &dir, &replay, checkpoint.as_ref())?;
        let disk = OpenedDisk {
            disk: checkpointing::Disk::new(storage, dir.clone()),
            found: FoundOnDisk {
                checkpoint_lsn: covered,
                checkpoint_bytes,
                next_overflow_file,
                overflow_written,
            },
        };
        let checkpoint_path = checkpoint
            .as_ref()
            .map_or_else(|| dir.clone(), |c| c.path.clone());
        let skipped_checkpoint = checkpoint
            .as_ref()
            .and_then(|c| c.newer_damaged.as_ref())
            .map(|e| e.to_string());
        let mut engine = Self::start(config, clock, Some(wal), replay, report, Some(disk))
            .map_err(|reason| OpenError::CheckpointMismatch {
                path: checkpoint_path,
                reason,
            })?;
        engine.recovery.skipped_checkpoint = skipped_checkpoint;
        *engine.dir_lock.get_mut() = Some(dir_lock);
        engine.dir = Some(dir);
        Ok(engine)
    }

    /// An engine with no directory: nothing is written anywhere, everything
    /// is lost when it stops. For tests and benchmarks.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`].
    pub fn in_memory(config: Config, clock: Arc<dyn Clock>) -> Result<Engine, OpenError> {
        config.check()?;
        Self::start(
            config,
            clock,
            None,
            Replay::new(false),
            RecoveryReport::default(),
            None,
        )
        .map_err(|reason| OpenError::InvalidConfig { reason })
    }

    fn start(
        config: Config,
        clock: Arc<dyn Clock>,
        wal: Option<Wal>,
        replay: Replay,
        wal_report: RecoveryReport,
        opened: Option<OpenedDisk>,
    ) -> Result<Engine, String> {
        let (disk, found) = match opened {
            Some(o) => (Some(o.disk), Some(o.found)),
            None => (None, None),
        };
        let tick_ns = config.tick.as_nanos();
        let relocation_horizon_ticks = match (&disk, config.far_span()) {
            (Some(_), Some(horizon)) if checkpointing::relocates(&config) => {
                // tick_ns ≥ 1 ms (validated).
                Some(u64::try_from(horizon.as_nanos() / tick_ns).unwrap_or(u64::MAX))
            }
            _ => None,
        };
        // Start the tick grid on a wall-clock tick boundary, so that a task
        // due at a whole millisecond fires at that millisecond rather than up
        // to a tick later.
        let grid_phase_ns = system_time_to_ns(clock.now_wall()).rem_euclid(tick_ns as i128) as u128;
        let origin_monotonic = clock.now_monotonic();
        // In memory there are no far tasks; any key does.
        let wal_store_id = wal.as_ref().map_or([0; 16], |w| w.store_id());
        let core = Core {
            status: Status::Open,
            wheel: Wheel::new(),
            tasks: TaskSlab::default(),
            index: TaskIndex::default(),
            payloads: PayloadStore::default(),
            overdue: VecDeque::new(),
            overdue_replaced: false,
            backlog: VecDeque::new(),
            backlog_taken: 0,
            catch_up_start_ns: grid_phase_ns,
            paused: config.deliveries_paused,
            ready: VecDeque::new(),
            handouts_pending: VecDeque::new(),
            receiving: Vec::new(),
            ready_count: 0,
            in_flight_count: 0,
            dead: dead::DeadLetters::default(),
            dead_snapshot: None,
            next_id: replay.max_id().saturating_add(1),
            wal: wal.map(Arc::new),
            sleep: DriverSleep::Busy,
            stop: false,
            processed_ns: 0,
            processed_wall_ns: i128::MIN,
            log_bytes_since_checkpoint: 0,
            last_checkpoint_bytes: 0,
            checkpoint_wanted: false,
            overflow_files: std::collections::BTreeMap::new(),
            next_overflow_file: 1,
            payloads_read_back: 0,
            hasher: KeyHasher::new(&wal_store_id),
            far: FarIndex::default(),
            far_cursors: std::collections::BTreeMap::new(),
            promoting: false,
            far_promoted: 0,
            overflow_damage_skipped: 0,
            background_failures: 0,
            totals: Totals::default(),
            checkpoint_hold_max: Duration::ZERO,
            promotion_hold_max: Duration::ZERO,
            far_scheduled: 0,
            far_scheduled_bytes: 0,
            moving: (0, 0),
            relocation_wanted: false,
            relocating: false,
            relocation_failed: false,
            checkpointer_gone: false,
            far_generation: 0,
            far_reset_due_min: u64::MAX,
            closed_stats: None,
            #[cfg(test)]
            promote_interrupts: 0,
            #[cfg(test)]
            needed_entry_scans: 0,
        };
        let index_probe = core.index.probe();
        let shared = Arc::new(Shared {
            index_probe,
            config,
            clock,
            tick_ns,
            relocation_horizon_ticks,
            origin_monotonic,
            grid_phase_ns,
            core: Mutex::new(core),
            driver_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            ready_cv: Condvar::new(),
            async_waiters: Mutex::default(),
            engine_id: NEXT_ENGINE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            disk,
            checkpointing: Mutex::new(checkpointing::CheckpointBook::default()),
            checkpoint_cv: Condvar::new(),
            relocation_cv: Condvar::new(),
            promote_cv: Condvar::new(),
            prefetch_cv: Condvar::new(),
            far_backlog: std::sync::atomic::AtomicBool::new(false),
            payload_replacements: std::sync::atomic::AtomicU64::new(0),
            #[cfg(test)]
            hold_hook: Mutex::new(None),
            #[cfg(test)]
            recv_async_hook: Mutex::new(None),
            #[cfg(test)]
            promote_yield_hook: Mutex::new(None),
            #[cfg(test)]
            checkpoint_yield_hook: Mutex::new(None),
            #[cfg(test)]
            handout_thread: std::sync::atomic::AtomicU8::new(delivery::HANDOUT_THREAD_UNKNOWN),
            #[cfg(test)]
            panic_in_pass: Mutex::new(None),
        });
        let recovery = shared.load_replayed(replay, wal_report)?;
        // A failure of the log's own threads (an `Interval` sync, a write-back) poisons the
        // engine at once, so that consumers blocked in `recv` and the driver learn it then,
        // not at the next call that appends. A weak handle: the log, which the engine owns,
        // keeps the hook.
        let wal = shared.core.lock().wal.clone();
        if let Some(wal) = wal {
            let weak = Arc::downgrade(&shared);
            wal.on_background_failure(move |error| {
                if let Some(shared) = weak.upgrade() {
                    shared.poison(error.to_string());
                }
            });
        }
        // Before any thread starts: a checkpointer woken by the records the open logged
        // (settled deliveries) must not take an overflow file number still on disk.
        if let Some(found) = found {
            shared.take_found_on_disk(found);
        }
        let clock_waker = Waker::from(Arc::new(DriverWaker(Arc::downgrade(&shared))));
        shared.clock.register_waker(clock_waker.clone());
        let driver_shared = Arc::clone(&shared);
        let driver = std::thread::Builder::new()
            .name("kairos-driver".into())
            .spawn(move || {
                poison_on_panic(&driver_shared, "kairos-driver", || {
                    delivery::driver_loop(&driver_shared)
                })
            });
        let driver = match driver {
            Ok(handle) => Some(handle),
            Err(e) => {
                shared.poison(format!("cannot start the driver thread: {e}"));
                None
            }
        };
        use checkpointing::relocates;
        let mut background = Vec::new();
        let on_disk = shared.disk.is_some();
        let config = &shared.config;
        let threads: [BackgroundThread; 2] = [
            (
                "kairos-checkpointer",
                on_disk
                    && (config.checkpoint_log_bytes.is_some()
                        || config.checkpoint_interval.is_some()
                        || relocates(config)),
                Shared::checkpointer_loop,
            ),
            (
                "kairos-prefetch",
                on_disk && config.payload_window.is_some() && config.payload_prefetch,
                Shared::prefetch_loop,
            ),
        ];
        for (name, wanted, body) in threads {
            if !wanted {
                continue;
            }
            let thread_shared = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(name.into())
                .spawn(move || count_panic(&thread_shared, name, || body(&thread_shared)))
            {
                Ok(handle) => background.push(handle),
                Err(e) => shared.poison(format!("cannot start the {name} thread: {e}")),
            }
        }
        Ok(Engine {
            shared,
            clock_waker,
            driver: Mutex::new(driver),
            background: Mutex::new(background),
            shutting_down: Mutex::new(()),
            dir_lock: Mutex::new(None),
            recovery,
            dir: None,
        })
    }

    /// Schedules a task. `key` must not belong to a live task. A due time
    /// already past fires at once (as overdue).
    ///
    /// Returns the task's id. Under `Sync` the task is durable when this
    /// returns; under `Interval`/`Buffered` it is written to the OS.
    ///
    /// Cost: O(1) (hash insert, wheel insert, one log append); with far
    /// tasks ([`Config::far_span`]), plus one read of an overflow entry per
    /// far task whose key hash matches (almost always only the same key,
    /// which is then refused as `AlreadyExists`). A far task's entry that
    /// cannot be read poisons the engine (`Poisoned`).
    ///
    /// # Errors
    /// See [`ScheduleError`]: bad key/payload/due time, `AlreadyExists`,
    /// `TooManyPending`, `Closed`, `Poisoned`.
    pub fn schedule(&self, key: &[u8], due: Due, payload: &[u8]) -> Result<TaskId, ScheduleError> {
        self.shared.schedule_one(&NewTask { key, due, payload })
    }

    /// [`Engine::schedule`] with a delay from now.
    pub fn schedule_after(
        &self,
        key: &[u8],
        delay: Duration,
        payload: &[u8],
    ) -> Result<TaskId, ScheduleError> {
        self.schedule(key, Due::After(delay), payload)
    }

    /// [`Engine::schedule`] at an absolute wall-clock time.
    pub fn schedule_at(
        &self,
        key: &[u8],
        at: SystemTime,
        payload: &[u8],
    ) -> Result<TaskId, ScheduleError> {
        self.schedule(key, Due::At(at), payload)
    }

    /// Schedules many tasks with one log write (under `Sync`, one group
    /// commit: one fdatasync, plus the small one of its durable mark with
    /// [`Config::proof_before_ack`]): all of them or none. Returns their ids
    /// in order.
    ///
    /// # Errors
    /// As [`Engine::schedule`], plus `DuplicateKeyInBatch` and
    /// `BatchTooLarge` (more than [`BATCH_TASKS_MAX`] tasks).
    pub fn schedule_many(&self, tasks: &[NewTask<'_>]) -> Result<Vec<TaskId>, ScheduleError> {
        if tasks.is_empty() {
            // Nothing to log, but answered as any call is: `Closed` after a
            // shutdown, as `cancel_many` and `ack_many` answer an empty batch.
            self.shared
                .core
                .lock()
                .check_open()
                .map_err(status_to_schedule_error)?;
            return Ok(Vec::new());
        }
        let first = self.shared.schedule_batch(tasks)?;
        Ok(batch_ids(first, tasks.len()))
    }

    /// Cancels the live task with `key`.
    ///
    /// Cost: O(1). A cancelled task's memory (entry, key, payload, wheel
    /// node) is freed at once; a far task ([`Config::far_span`]) is found by
    /// its key hash and one read of its overflow entry (before the engine's
    /// lock is taken) and taken out of the far index directly (its 20-byte
    /// entry is given back when its shard is next rebuilt).
    ///
    /// # Errors
    /// `Closed`; `Poisoned` (the outcome is then unknown: the engine stopped
    /// before the cancel was durable).
    pub fn cancel(&self, key: &[u8]) -> Result<CancelOutcome, CancelError> {
        self.shared.cancel_one(key)
    }

    /// Cancels many keys with one log write (one group commit under `Sync`,
    /// as [`Engine::schedule_many`]); returns one outcome per key, in order. A key listed twice gets its
    /// outcome first and [`CancelOutcome::NotFound`] after.
    ///
    /// # Errors
    /// As [`Engine::cancel`], plus `BatchTooLarge` (more than
    /// [`BATCH_TASKS_MAX`] keys), which changes nothing.
    pub fn cancel_many(&self, keys: &[&[u8]]) -> Result<Vec<CancelOutcome>, CancelError> {
        self.shared.cancel_many(keys)
    }

    /// Reschedules the live task with `key` (upsert): a task waiting for
    /// its first delivery or its next attempt gets the new due time, and
    /// `payload` if given, keeping its id and attempt count; a due task not
    /// yet received by a consumer is taken back and rescheduled. If no task
    /// with `key` is live, schedules a new one (`payload` or empty).
    ///
    /// So `None` ("keep the payload") on a key whose task finished since the
    /// caller last saw it — fired and acked, cancelled, dead-lettered —
    /// schedules a task with an empty payload ([`RescheduleOutcome::Scheduled`]
    /// tells): pass the payload wherever a task without it would be wrong.
    ///
    /// Cost: O(1) (index lookup, wheel remove + insert, one log append); a
    /// far task ([`Config::far_span`]) is found by one read of its overflow
    /// entry and put back in the wheel first.
    ///
    /// # Errors
    /// As [`Engine::schedule`] (bad key, payload or due time, `TooManyPending`
    /// for a new task, `Closed`, `Poisoned`), plus [`ScheduleError::InFlight`]
    /// when a consumer holds the task now: it is not changed (cancel it, or
    /// let the consumer nack it).
    pub fn reschedule(
        &self,
        key: &[u8],
        due: Due,
        payload: Option<&[u8]>,
    ) -> Result<RescheduleOutcome, ScheduleError> {
        self.shared.reschedule(key, due, payload)
    }

    /// Acknowledges a delivery (same as [`Consumer::ack`]).
    ///
    /// # Errors
    /// See [`Consumer::ack`].
    pub fn ack(&self, delivery: &Delivery) -> Result<(), AckError> {
        self.shared.ack_many(std::slice::from_ref(delivery))
    }

    /// Acknowledges many deliveries with one log write (one group commit
    /// under `Sync`, as [`Engine::schedule_many`]): all of them, or none if
    /// any is not outstanding.
    ///
    /// # Errors
    /// As [`Engine::ack`]; the error names the first offending task (also
    /// for a delivery listed twice).
    pub fn ack_many(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.shared.ack_many(deliveries)
    }

    /// Acknowledges a delivery and schedules the next task with its key in
    /// one log write (same as [`Consumer::ack_and_schedule`]).
    ///
    /// # Errors
    /// See [`Consumer::ack_and_schedule`].
    pub fn ack_and_schedule(
        &self,
        delivery: &Delivery,
        due: Due,
        payload: &[u8],
    ) -> Result<AckScheduleOutcome, AckScheduleError> {
        self.shared.ack_and_schedule(delivery, due, payload)
    }

    /// Reports a failed attempt (same as [`Consumer::nack`]).
    ///
    /// # Errors
    /// See [`Consumer::nack`].
    pub fn nack(
        &self,
        delivery: &Delivery,
        retry_after: Option<Duration>,
        error: &str,
    ) -> Result<NackOutcome, AckError> {
        self.shared.nack(delivery, retry_after, error)
    }

    /// Extends a lease (same as [`Consumer::extend_lease`]).
    ///
    /// # Errors
    /// See [`Consumer::extend_lease`].
    pub fn extend_lease(&self, delivery: &Delivery, lease: Duration) -> Result<(), AckError> {
        self.shared.extend_lease(delivery, lease)
    }

    /// A new consumer handle.
    pub fn consumer(&self) -> Consumer {
        Consumer {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The engine's counters: levels (scheduled, ready, in flight,
    /// backlog, dead letters, memory) and running totals since open
    /// (deliveries, acks, nacks, ...): see [`Stats`]. After a shutdown, the
    /// figures as they stood when the engine stopped.
    ///
    /// Cost: one hold of the engine's lock, independent of the number of
    /// tasks and dead letters (a sum over the overflow files): the levels
    /// are counted as they change (the catch-up backlog's tasks by the task
    /// slab, the dead letters' payload bytes as they come and go).
    pub fn stats(&self) -> Stats {
        let core = self.shared.core.lock();
        core.closed_stats.unwrap_or_else(|| core.stats())
    }

    /// For tests and fuzzing: the payload arena's entries in use, and how
    /// many of them the engine can name — live tasks' keys and payloads
    /// there, and entries kept for the tasks a checkpoint's snapshot saved
    /// and has not read yet. Equal unless an entry leaked. O(live tasks).
    #[doc(hidden)]
    pub fn arena_entries_accounted(&self) -> (usize, usize) {
        let core = self.shared.core.lock();
        let named = core
            .tasks
            .iter()
            .filter(|t| matches!(t.bytes, crate::task::PayloadRef::Pooled { .. }))
            .count()
            + core.payloads.entries_kept_for_snapshot();
        (core.payloads.arena_stats().entries, named)
    }

    /// For tests: the key index's entries, and the tasks in memory that
    /// must have one (every task but an abandoned one: a cancel of a leased
    /// task takes its entry out, its key free again). Equal unless an entry
    /// was left behind or lost. O(live tasks).
    #[doc(hidden)]
    pub fn index_entries_accounted(&self) -> (usize, usize) {
        let core = self.shared.core.lock();
        let keyed = core
            .tasks
            .iter()
            .filter(|t| t.state != TaskState::Abandoned)
            .count();
        (core.index.len(), keyed)
    }

    /// The dead letters, oldest id first. O(dead letters) with their
    /// payloads copied. Returned once the records the list reflects are as
    /// durable as the mode promises (a purge or requeue another caller just
    /// made, a nack that made a dead letter): it may block on the log's
    /// pending commit (under `Sync`, the fdatasync — two with the proof
    /// before acknowledgement — of the round under way), and waits for
    /// nothing when nothing is pending. On a poisoned engine (that wait, or
    /// an earlier write or sync, failed) the list is what memory holds,
    /// which may reflect changes that never became durable; a call that
    /// returns a `Result` ([`Engine::lookup`], a schedule, a cancel) answers
    /// `Poisoned` then.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.shared.dead_letters_after(None, usize::MAX)
    }

    /// A page of the dead letters: up to `max` of them whose ids are above
    /// `after` (from the first with `None`), oldest id first — to go
    /// through many dead letters without copying them all at once: pass
    /// the last id of a page as `after` for the next; an empty page is the
    /// end (with `max` above 0: `max` 0 always answers an empty page). A walk sees each dead letter at most once; one requeued or
    /// purged during it is not seen after that, and one made during it
    /// (it keeps its task's id, which may be below the walk's position) is
    /// seen only if its id is above where the walk is. Durability as for
    /// [`Engine::dead_letters`].
    ///
    /// Cost: O(log dead letters) under the engine's lock to find the first
    /// (they are kept in id order), plus copying the `max` returned (key,
    /// payload, error).
    pub fn dead_letters_after(&self, after: Option<TaskId>, max: usize) -> Vec<DeadLetter> {
        self.shared.dead_letters_after(after, max)
    }

    /// Puts dead letter `id` back as a new task (new id, same key and
    /// payload, a fresh attempt count), due at `due`; removes the dead
    /// letter. One log write.
    ///
    /// # Errors
    /// [`ScheduleError::NotDeadLetter`] if there is no such dead letter;
    /// `AlreadyExists` if a live task has its key now; bad due time;
    /// `KeyTooLong` or `PayloadTooLarge` if its key or payload exceeds the
    /// limits of the configuration in use (lowered since it was scheduled);
    /// `TooManyPending`; `Closed`; `Poisoned`.
    pub fn requeue_dead_letter(&self, id: TaskId, due: Due) -> Result<TaskId, ScheduleError> {
        self.shared.requeue_dead_letter(id, due)
    }

    /// Deletes dead letter `id` for good. Returns false if there was none.
    ///
    /// # Errors
    /// `Closed`; `Poisoned`.
    pub fn purge_dead_letter(&self, id: TaskId) -> Result<bool, CancelError> {
        self.shared.purge_dead_letter(id)
    }

    /// Writes a checkpoint now: the live tasks and dead letters as of the
    /// log's last record, so that recovery reads it and only the log after
    /// it; then deletes the log segments it covers. Also run in the
    /// background by log growth and time (`Config::checkpoint_log_bytes`,
    /// `Config::checkpoint_interval`). Returns once the checkpoint is durable.
    ///
    /// Cost: first what leaves memory (payloads due after the payload
    /// window, far tasks) and the live entries of compacted overflow files
    /// go to a new overflow file: chosen and copied a range of tasks per
    /// hold of the engine's lock, the file written and synced without it,
    /// then applied a batch per hold (O(live tasks + bytes moved) in all, in
    /// short holds). Then the state is encoded from snapshots of the tasks
    /// in memory, the far tasks and the dead letters taken in one short
    /// hold (it sorts the dead letters' ids), about 65 536 tasks per hold (far tasks a shard at a time, 1/256
    /// of them, when that is more; calls go on in between; the file still holds
    /// the state of one log LSN; a task changed before it is encoded is
    /// copied first, so memory grows with what changes meanwhile), and
    /// written to a temporary file in 8 MiB pieces between the holds; the
    /// file is synced and renamed. The report's
    /// `locked` adds the holds up; `longest_hold` is the longest. A crash at
    /// any step leaves the old or the new checkpoint usable
    /// (`wal/FORMAT.md`, "Checkpoint files").
    ///
    /// # Errors
    /// [`CheckpointError::InMemory`] for an engine without a directory;
    /// `Closed`; `Poisoned`; [`CheckpointError::Io`] if writing the file
    /// failed (the engine goes on; the previous checkpoint and the log are
    /// intact), or if removing the files the checkpoint made unneeded did
    /// (then it was written and the log trimmed all the same; either way a
    /// later checkpoint retries); [`CheckpointError::Wal`] if syncing the log failed (that
    /// poisons the engine, as any failed sync does);
    /// [`CheckpointError::Trim`] if the checkpoint was written but deleting
    /// the log segments it covers failed, and [`CheckpointError::Overflow`]
    /// if an overflow file being compacted could not be read (the engine
    /// goes on in both cases, and a later checkpoint retries).
    pub fn checkpoint(&self) -> Result<CheckpointReport, CheckpointError> {
        self.shared.checkpoint()
    }

    /// Makes every call that returned before this one durable: waits until
    /// everything logged so far is on stable storage (fdatasync), whatever
    /// the engine's [`crate::Durability`] — `Sync` durability for the calls that
    /// need it, in an engine that runs under `Interval` or `Buffered`
    /// (RocksDB's `SyncWAL`, a `WriteOptions::sync` write after the fact).
    /// Schedules, cancels (a `Cancelled` answer), reschedules, acks, nacks
    /// and the deliveries handed out before the call survive a power cut
    /// once it returns.
    ///
    /// Under `Sync` every returned call already is durable, and this returns
    /// without an fdatasync unless records still are being committed (a
    /// call's, or the driver's delivery records no caller waits for); an engine
    /// opened [`Engine::in_memory`] has nothing to make durable and returns
    /// `Ok` at once.
    ///
    /// Cost: one fdatasync shared with the log's other writers (group
    /// commit), so a batch of calls followed by one `sync` pays for one;
    /// with `proof_before_ack` (the default) a second, small one for the
    /// durable mark that proves the first (`wal/FORMAT.md`). It holds the
    /// engine's lock only to find the log: other calls and deliveries go on
    /// while it waits. Returns at once if everything logged already is
    /// durable.
    ///
    /// A shutdown may run while this waits: it closes the log cleanly,
    /// which makes everything durable, and this then returns `Ok` (or
    /// `Closed`, if the close ended before what it waited for was proven).
    ///
    /// A payment's cancel made to survive a power cut, in an engine that
    /// runs under `Interval` (the simulated disk of [`Engine::open_with`]
    /// loses every unsynced byte):
    ///
    /// ```
    /// use kairos::kairos_wal::SimStorage;
    /// use kairos::{CancelOutcome, Config, Durability, Engine, ManualClock};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let disk = SimStorage::new(1);
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let mut config = Config::default();
    /// config.durability = Durability::Interval(Duration::from_secs(1));
    /// let open = || {
    ///     Engine::open_with("/orders", config.clone(), Arc::new(disk.clone()), Arc::new(clock.clone()))
    /// };
    ///
    /// let engine = open()?;
    /// engine.schedule_after(b"order:1:timeout", Duration::from_secs(1800), b"")?;
    /// engine.schedule_after(b"order:2:timeout", Duration::from_secs(1800), b"")?;
    /// // Order 1 is paid: make the cancel durable before confirming the payment.
    /// assert_eq!(engine.cancel(b"order:1:timeout")?, CancelOutcome::Cancelled { deliveries: 0 });
    /// engine.sync()?;
    ///
    /// drop(engine); // the process dies,
    /// disk.power_cut_drop_unsynced(); // then the power: what was not synced is gone
    /// let engine = open()?;
    /// assert!(engine.lookup(b"order:1:timeout")?.is_none());
    /// assert!(engine.lookup(b"order:2:timeout")?.is_some());
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`SyncError::Closed`] after [`Engine::shutdown`] (see above for one
    /// that runs meanwhile); [`SyncError::Poisoned`] if the engine was
    /// poisoned, or a write or fdatasync failed now — that poisons the
    /// engine, as any failed sync does.
    pub fn sync(&self) -> Result<(), SyncError> {
        self.shared.sync_log()
    }

    /// What recovery found at open.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Waits until the driver has handed out every task due at the clock's
    /// current time. With a [`crate::ManualClock`]: advance the clock, then
    /// call this; afterwards `try_recv` sees exactly what fell due (and lease
    /// expiries up to now are processed). A rate-limited catch-up backlog is
    /// handed out only as far as the rate allows at this time. While
    /// deliveries are paused ([`Engine::pause_deliveries`]) nothing is handed
    /// out and this returns once the driver has gone idle. Returns at once
    /// if the engine is stopped. A wall clock stepped back while this waits
    /// is waited for only as far as it then reads.
    pub fn run_until_idle(&self) {
        self.shared.run_until_idle();
    }

    /// Pauses deliveries: from the driver's next pass, no task is handed out
    /// to consumers and the timing wheel stands still, so nothing is logged
    /// as delivered and no lease's expiry is processed. Everything else goes
    /// on: schedule, cancel, reschedule, ack and nack of held leases,
    /// checkpoints, far tasks promoted as they come within reach. Tasks
    /// already handed out — in the ready queue, or logged as delivered by a
    /// pass under way — stay receivable.
    ///
    /// A lease that runs out while paused is over for its holder (ack, nack
    /// and extend are refused, by the clock), but its expiry waits for the
    /// resume: until then the task counts as in flight, `reschedule` of its
    /// key is [`crate::ScheduleError::InFlight`] and `cancel` answers
    /// `AlreadyDelivered`.
    ///
    /// A maintenance switch (the `kairos` offline commands open paused:
    /// [`Config::deliveries_paused`]); not durable: an engine opens paused
    /// only if its config says so. Idempotent. O(1).
    pub fn pause_deliveries(&self) {
        self.shared.core.lock().paused = true;
        self.shared.driver_cv.notify_all();
    }

    /// Resumes deliveries paused by [`Engine::pause_deliveries`] or
    /// [`Config::deliveries_paused`]: the driver catches up at once, as after
    /// a stall — every task that fell due meanwhile is handed out in due
    /// order, tasks placed while paused with a due time already past
    /// included; only those due before the pause began come first, in the
    /// order they were placed (a reschedule places a task anew, after them).
    /// Leases that ran out are processed (retried after their backoff, or
    /// dead-lettered). The tasks that fell due during
    /// the pause are not rate-limited; a catch-up backlog found at open and
    /// not handed out yet goes on at [`Config::catch_up_tasks_per_sec`],
    /// counted afresh from the resume. Idempotent. O(1) here; the catch-up is
    /// the driver's.
    pub fn resume_deliveries(&self) {
        let now = self.shared.now();
        let mut core = self.shared.core.lock();
        if core.paused {
            core.paused = false;
            core.catch_up_start_ns = now.engine_ns;
            core.backlog_taken = 0;
            // `run_until_idle` waits for a pass after this.
            core.processed_ns = 0;
            core.processed_wall_ns = i128::MIN;
        }
        self.shared.driver_cv.notify_all();
    }

    /// Whether deliveries are paused ([`Engine::pause_deliveries`]).
    pub fn deliveries_paused(&self) -> bool {
        self.shared.core.lock().paused
    }

    /// Stops the engine cleanly: stops the driver, takes back deliveries no
    /// consumer received (they are delivered again after the next open,
    /// without counting as an attempt), syncs the log and writes a
    /// clean-close marker, releases the directory. Leases held by consumers
    /// end: those tasks are delivered again after the next open (attempt +
    /// 1). Idempotent; calls from several threads at once run one after the
    /// other, each returning once the engine is shut down (the log closed,
    /// the directory released).
    ///
    /// Then frees the memory of the tasks (keys, payloads, the timing wheel,
    /// the indexes, the far tasks), which [`Consumer`] handles kept beyond
    /// the engine would otherwise hold. Every call answers as it would
    /// without it (what needs the engine is `Closed` or `Poisoned`);
    /// [`Engine::stats`] gives the counters the log was closed with,
    /// [`Engine::dead_letters`] still lists the dead letters (freed with
    /// the handle), [`Consumer::ready`] still counts as before.
    ///
    /// # Errors
    /// The log could not be flushed ([`ShutdownError::Wal`]), or the engine
    /// was already poisoned — or is while this runs: a background sync of
    /// the log (a write-back) failing as the log closes poisons it even if
    /// the close's own sync succeeded (after a failed fdatasync the OS may
    /// have dropped the pages it could not write, and a later fdatasync does
    /// not tell). The engine is stopped and its directory
    /// released all the same: this is how a poisoned engine is let go
    /// before [`Engine::open`] recovers the directory (dropping it does the
    /// same).
    pub fn shutdown(&self) -> Result<(), ShutdownError> {
        let _one_at_a_time = self.shutting_down.lock();
        {
            let mut core = self.shared.core.lock();
            if core.status == Status::Open {
                core.status = Status::Closed;
            }
            core.stop = true;
            self.shared.driver_cv.notify_all();
            self.shared.notify_ready();
            self.shared.checkpoint_cv.notify_all();
            self.shared.prefetch_cv.notify_all();
            self.shared.relocation_cv.notify_all();
            self.shared.promote_cv.notify_all();
        }
        // The driver finishes its pass first: tasks it logged as delivered
        // reach the ready queue (no consumer can take them now), so the
        // release below finds every one of them.
        self.join_driver();
        self.join_background();
        // A checkpoint a caller is taking finishes first (it holds the log).
        let checkpointing = self.shared.checkpointing.lock();
        if let Some(disk) = &self.shared.disk {
            disk.close_overflow_files();
        }
        let (wal, released) = {
            let mut core = self.shared.core.lock();
            if core.status == Status::Closed {
                self.shared.release_ready_locked(&mut core);
            }
            // Nothing reads the tasks from here on: a consumer kept beyond
            // the engine keeps none of their memory.
            let released = core.release_memory(true);
            (core.wal.take(), released)
        };
        drop(released);
        drop(checkpointing);
        let result = match wal.map(Arc::try_unwrap) {
            Some(Ok(wal)) => wal.close().map_err(ShutdownError::from),
            // Nothing else keeps the log once the checkpointer is joined and
            // no checkpoint runs; if something did, it is dropped like a crash.
            Some(Err(_)) => Err(ShutdownError::Poisoned {
                cause: "the log was still in use at shutdown".into(),
            }),
            None => Ok(()),
        };
        self.dir_lock.lock().take();
        match self.shared.poison_cause() {
            Some(cause) if result.is_ok() => Err(ShutdownError::Poisoned { cause }),
            _ => result,
        }
    }

    fn join_background(&self) {
        let handles = std::mem::take(&mut *self.background.lock());
        for handle in handles {
            if handle.join().is_err() {
                self.shared.poison("a background thread panicked".into());
            }
        }
    }

    fn join_driver(&self) {
        if let Some(handle) = self.driver.lock().take() {
            // A panic in the driver is a bug; it has already poisoned nothing
            // on disk, so report it through the status instead of re-panicking.
            if handle.join().is_err() {
                self.shared.poison("the driver thread panicked".into());
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let wal = {
            let mut core = self.shared.core.lock();
            if core.status == Status::Open {
                core.status = Status::Closed;
                if self.shared.disk.is_some() {
                    // Like a crash: what was not yet durable may be lost, and
                    // deliveries handed out come back as a new attempt.
                    tracing::warn!(
                        dir = ?self.dir,
                        "kairos engine dropped without shutdown: reopened as after a crash"
                    );
                }
            }
            core.stop = true;
            self.shared.driver_cv.notify_all();
            self.shared.notify_ready();
            self.shared.checkpoint_cv.notify_all();
            self.shared.prefetch_cv.notify_all();
            self.shared.promote_cv.notify_all();
            core.wal.take()
        };
        self.join_driver();
        self.join_background();
        if let Some(disk) = &self.shared.disk {
            disk.close_overflow_files();
        }
        // Nothing reads the tasks or the dead letters from here on: a
        // consumer kept beyond the engine keeps none of their memory.
        let released = self.shared.core.lock().release_memory(false);
        drop(released);
        // Dropping the log without close: like a crash for anything not durable.
        drop(wal);
        self.shared.clock.unregister_waker(&self.clock_waker);
        self.dir_lock.get_mut().take();
    }
}

fn status_to_schedule_error(s: Status) -> ScheduleError {
    match s {
        Status::Poisoned(cause) => ScheduleError::Poisoned { cause },
        _ => ScheduleError::Closed,
    }
}

fn status_to_cancel_error(s: Status) -> CancelError {
    match s {
        Status::Poisoned(cause) => CancelError::Poisoned { cause },
        _ => CancelError::Closed,
    }
}

fn status_to_ack_error(s: Status) -> AckError {
    match s {
        Status::Poisoned(cause) => AckError::Poisoned { cause },
        _ => AckError::Closed,
    }
}

fn key_lossy(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl Shared {
    /// Tasks in the ready queue.
    pub(crate) fn ready_count(&self) -> usize {
        self.core.lock().ready_count
    }

    pub(crate) fn poison_cause(&self) -> Option<String> {
        match &self.core.lock().status {
            Status::Poisoned(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// [`Engine::sync`].
    fn sync_log(&self) -> Result<(), SyncError> {
        match self.sync_handle()? {
            Some(log) => log.sync().map_err(|e| self.sync_failed(e)),
            None => Ok(()),
        }
    }

    /// The log's [`kairos_wal::SyncHandle`] for [`Engine::sync`] and [`Engine::sync_async`] (`None` in
    /// memory): a handle, not the log, so that a shutdown meanwhile can still close the log
    /// (it takes sole ownership of it) while the caller waits.
    fn sync_handle(&self) -> Result<Option<kairos_wal::SyncHandle>, SyncError> {
        let core = self.core.lock();
        core.check_open().map_err(|status| match status {
            Status::Poisoned(cause) => SyncError::Poisoned { cause },
            _ => SyncError::Closed,
        })?;
        Ok(core.wal.as_ref().map(|wal| wal.sync_handle()))
    }

    /// A failed sync: `Closed`, or the engine poisoned with its cause.
    fn sync_failed(&self, e: WalError) -> SyncError {
        match e {
            WalError::Closed => SyncError::Closed,
            e => {
                let cause = e.to_string();
                self.poison(cause.clone());
                SyncError::Poisoned { cause }
            }
        }
    }

    fn poison(&self, cause: String) {
        let mut core = self.core.lock();
        self.poison_locked(&mut core, cause);
    }

    /// Marks the engine poisoned (keeping the first cause) and stops the driver.
    fn poison_locked(&self, core: &mut Core, cause: String) {
        if !matches!(core.status, Status::Poisoned(_)) {
            tracing::error!(%cause, "kairos engine poisoned");
            core.status = Status::Poisoned(cause);
        }
        core.stop = true;
        self.driver_cv.notify_all();
        self.idle_cv.notify_all();
        self.notify_ready();
        self.checkpoint_cv.notify_all();
        self.prefetch_cv.notify_all();
        self.relocation_cv.notify_all();
        self.promote_cv.notify_all();
    }

    /// Waits for a log ticket; a failure poisons the engine and is returned
    /// as its cause.
    #[inline]
    fn wait_durable(&self, ticket: Option<AppendTicket>) -> Result<(), String> {
        match ticket {
            // An in-memory engine's calls, and calls that logged nothing.
            None => Ok(()),
            Some(ticket) => self.wait_ticket(ticket),
        }
    }

    /// [`Shared::wait_durable`] for a call that appended.
    fn wait_ticket(&self, ticket: AppendTicket) -> Result<(), String> {
        ticket.wait().map_err(|e| {
            let cause = e.to_string();
            self.poison(cause.clone());
            cause
        })
    }

    /// Engine time in nanoseconds: monotonic time since open, plus the grid
    /// phase (so tick boundaries fall on wall-clock tick boundaries).
    fn now_ns(&self) -> u128 {
        self.engine_ns(self.clock.now_monotonic())
    }

    /// [`Shared::now_ns`] for a monotonic reading already taken.
    fn engine_ns(&self, monotonic: Duration) -> u128 {
        monotonic.saturating_sub(self.origin_monotonic).as_nanos() + self.grid_phase_ns
    }

    /// Both readings a schedule needs, taken together (one lock on a manual
    /// clock).
    fn now(&self) -> Now {
        let (wall, monotonic) = self.clock.now_wall_and_monotonic();
        Now {
            wall_ns: system_time_to_ns(wall),
            engine_ns: self.engine_ns(monotonic),
        }
    }

    fn now_tick(&self) -> Tick {
        self.tick_at(self.now_ns())
    }

    /// Maps an absolute due time to the first tick at or after it, using the
    /// current wall and monotonic readings. `Tick(0)` if already past.
    fn due_tick(&self, due_ms: u64, now: Now) -> Tick {
        let until_due_ns = i128::from(due_ms) * 1_000_000 - now.wall_ns;
        let due_mono_ns = now.engine_ns as i128 + until_due_ns;
        if until_due_ns <= 0 || due_mono_ns <= 0 {
            // Already due: overdue, handed out at once (not at the next tick).
            return Tick(0);
        }
        let ticks = div_ceil_u128(due_mono_ns as u128, self.tick_ns);
        Tick(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    /// The tick at which to put a task due at `due_ms` in the wheel, given
    /// its `due_tick` ([`Shared::due_tick`]): the same, unless deliveries
    /// are paused and it is due already. Then it goes at its own tick (the
    /// current one at the latest) instead of `Tick(0)`, the overdue queue:
    /// the wheel stands still while paused, so at the resume it comes out in
    /// due order among the tasks that fell due during the pause; only one
    /// due at or before the wheel's last tick, before the pause began, still
    /// goes to the overdue queue, handed out ahead of them all. O(1).
    #[inline]
    fn placement_tick(&self, core: &Core, due_ms: u64, due_tick: Tick) -> Tick {
        if !core.paused || due_tick.0 != 0 {
            return due_tick;
        }
        self.paused_overdue_tick(due_ms)
    }

    /// [`Shared::placement_tick`] of a task due already while paused.
    #[inline(never)]
    fn paused_overdue_tick(&self, due_ms: u64) -> Tick {
        let now = self.now();
        self.mapped_tick(due_ms, now).min(self.tick_of(now))
    }

    /// The tick of wall time `due_ms` by the current wall and monotonic
    /// readings, even when it is past (`Tick(0)` before engine time 0).
    fn mapped_tick(&self, due_ms: u64, now: Now) -> Tick {
        let due_mono_ns = now.engine_ns as i128 + i128::from(due_ms) * 1_000_000 - now.wall_ns;
        if due_mono_ns <= 0 {
            return Tick(0);
        }
        let ticks = div_ceil_u128(due_mono_ns as u128, self.tick_ns);
        Tick(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    /// Rebuilds the wheel, index and dead letters from a replay. Deliveries
    /// in flight at a crash are settled with one log write: at least once,
    /// a retry (the interrupted attempt counts) or, with attempts used up, a
    /// dead letter; at most once, a release (no consumer received them: the
    /// ack is logged before a consumer gets a task).
    ///
    /// # Errors
    /// Two live tasks with one key, far tasks aside (the engine replays
    /// without the key rule, `Replay::without_key_rule`, and this index,
    /// built anyway, checks it once): the reason.
    fn load_replayed(&self, replay: Replay, wal: RecoveryReport) -> Result<Recovery, String> {
        let now = self.now();
        let now_ms = wall_ms(now);
        let dead_on_disk = replay.dead_payloads_on_disk().clone();
        let mut replay = replay;
        // In the checkpoint's order, grouped by shard: what FarIndex::build
        // sorts fastest.
        let far_entries: Vec<FarEntry> = replay
            .take_far_unordered()
            .iter()
            .map(|t| {
                Ok(FarEntry {
                    hash: t.key_hash,
                    loc: crate::far::pack_loc(t.file, t.offset).ok_or_else(|| {
                        format!(
                            "far task {} at offset {} of overflow file {}: not a place an entry can be",
                            t.id, t.offset, t.file
                        )
                    })?,
                    id: t.id,
                })
            })
            .collect::<Result<_, String>>()?;
        let mut far_index = FarIndex::build(far_entries)?;
        let hasher = self.core.lock().hasher.clone();
        let (promoted, far_cursors, far_error, damage_skipped) =
            self.promote_at_open(&mut far_index, &hasher, now);
        // Damaged entries of far tasks the log finished after needing them
        // (the open has checked that none is live: `unresolved_at_end`). Not
        // counted here: the promotion counts the entry if it reads that far
        // in the file (once, not twice).
        for u in replay.unresolved() {
            tracing::warn!(
                file = %crate::overflow::file_name(u.file),
                offset = u.offset,
                task = u.id,
                error = %u.why,
                "the overflow entry of a far task the log finished does not read back (damaged, \
                 or its file missing); nothing needs it"
            );
        }
        let (mut live, dead) = replay.into_parts();
        live.extend(promoted);
        let tasks = live;
        if u32::try_from(tasks.len()).is_err() {
            return Err(format!(
                "{} live tasks, more than an engine can hold",
                tasks.len()
            ));
        }
        let mut core = self.core.lock();
        // Tasks in flight with their attempts used up become dead letters
        // below, and take no slot.
        let dies = |t: &LiveTask| {
            t.in_flight
                && !matches!(self.config.delivery, DeliveryGuarantee::AtMostOnce)
                && t.deliveries >= self.config.retry.max_attempts
        };
        let (order, dying) = sorted_handles(&tasks, &core.index, dies);
        let mut recovery = Recovery {
            wal,
            overflow_damage_skipped: damage_skipped,
            ..Recovery::default()
        };
        let mut settle = RecordBatch::default();
        let mut unreadable = far_error;
        core.dead = dead.into_iter().collect();
        // Dead letters whose payload a checkpoint had moved to disk: read
        // back now (dead letters are kept in memory whole).
        for (id, (file, offset)) in dead_on_disk {
            let Some(d) = core.dead.get(id) else {
                continue;
            };
            match self.read_payload_at(file, offset, id, &d.key) {
                Ok(p) => {
                    core.dead.set_payload(id, p);
                }
                Err(cause) => {
                    unreadable.get_or_insert(cause);
                }
            }
        }
        core.tasks.reserve(order.len());
        core.wheel.reserve(order.len());
        // The slab is empty: the tasks that do not die take slots 0, 1, 2…
        // in the order they were read (the checkpoint's, then the log's), so
        // the slab is filled by one sequential pass over them. Knowing that,
        // a second thread builds the index meanwhile; the wheel is filled
        // after, in due order, from the handles alone.
        let first_slot = core.tasks.vacant_slot();
        let planned = first_slot == Some(0) && core.tasks.len() == 0;
        // The slot of the task read `i`-th: `i`, less the dying before it.
        let slot_of = |i: u32| {
            let before = if dying.is_empty() {
                0
            } else {
                dying.partition_point(|&d| d < i)
            };
            // At most `i`: fits.
            i - before as u32
        };
        let mut filed: Vec<(u32, u32)> = Vec::with_capacity(order.len());
        for &(_, _, i, key_tag) in &order {
            if dying.is_empty() || dying.binary_search(&i).is_err() {
                filed.push((key_tag, slot_of(i)));
            }
        }
        let mut index = core.index.empty_like();
        let indexing = std::thread::Builder::new()
            .name("kairos-open-index".into())
            .spawn(move || {
                let pairs = index.insert_batch_unchecked(&mut filed);
                (index, pairs)
            });
        let mut slots_as_planned = planned;
        let mut next_slot = 0u32;
        // Slots of the tasks in flight at the crash, ascending: they join
        // the catch-up backlog rather than the wheel.
        let mut in_flight_slots: Vec<u32> = Vec::new();
        for (i, (id, t)) in tasks.into_iter().enumerate() {
            let id = TaskId(id);
            let mut deliveries = t.deliveries;
            if t.in_flight {
                match self.config.delivery {
                    DeliveryGuarantee::AtMostOnce => {
                        // Handed out, never received (a receive logs the ACK first):
                        // taken back, as a clean shutdown takes it back, so overdue.
                        settle.push(&Record::Release { id });
                        deliveries = deliveries.saturating_sub(1);
                        recovery.overdue += 1;
                    }
                    _ if deliveries >= self.config.retry.max_attempts => {
                        // The slots were planned with these taking none.
                        // Fits: fewer than 2^32 tasks (checked above).
                        slots_as_planned &=
                            !dying.is_empty() && dying.binary_search(&(i as u32)).is_ok();
                        let error = LOST_LEASE_ERROR.as_bytes();
                        let payload = match t.payload_at {
                            None => t.payload,
                            Some((file, offset)) => self
                                .read_payload_at(file, offset, id.0, &t.key)
                                .unwrap_or_else(|cause| {
                                    unreadable.get_or_insert(cause);
                                    Box::default()
                                }),
                        };
                        settle.push(&Record::Dead {
                            id,
                            dead_ms: now_ms,
                            error,
                        });
                        recovery.dead_lettered += 1;
                        core.dead.insert(
                            id.0,
                            DeadTask {
                                key: t.key.into(),
                                payload,
                                due_ms: t.due_ms,
                                deliveries,
                                dead_ms: now_ms,
                                error: error.into(),
                            },
                        );
                        continue;
                    }
                    _ => {
                        settle.push(&Record::Retry {
                            id,
                            due_ms: t.due_ms,
                            error: LOST_LEASE_ERROR.as_bytes(),
                        });
                        recovery.redelivered += 1;
                    }
                }
            }
            let task = Task {
                id,
                bytes: match t.payload_at {
                    // Whether the entry's due time is still the task's is
                    // not known here: assume not.
                    Some((file, offset)) => {
                        core.payloads
                            .put_on_disk_owned(t.key.into(), file, offset, false)
                    }
                    None => core.payloads.put_owned(t.key, &t.payload),
                },
                due_ms: t.due_ms,
                state: TaskState::Scheduled,
                deliveries,
                timer: None,
                in_backlog: false,
            };
            let Some(slot) = core.tasks.insert(task) else {
                slots_as_planned = false;
                break;
            };
            if t.in_flight {
                in_flight_slots.push(slot);
            }
            // A task the plan had dying takes a slot: every later slot moves.
            // Fits: fewer than 2^32 tasks.
            slots_as_planned &= slot == next_slot && dying.binary_search(&(i as u32)).is_err();
            next_slot = next_slot.wrapping_add(1);
        }
        // The wheel and the backlog, in due order (equal due times in id
        // order): one write to each task's entry (its timer), started a
        // few tasks ahead.
        let mut place = |c: &mut Core, due_ms: u64, id: u64, slot: u32| {
            let in_flight =
                !in_flight_slots.is_empty() && in_flight_slots.binary_search(&slot).is_ok();
            let placed = if in_flight {
                Err(InsertError::Elapsed)
            } else {
                c.wheel.insert(self.due_tick(due_ms, now), slot)
            };
            match placed {
                Ok(timer) => {
                    if let Some(task) = c.tasks.get_mut(slot) {
                        task.timer = Some(timer);
                    }
                }
                Err(_) => {
                    if !in_flight {
                        recovery.overdue += 1;
                    }
                    c.tasks.set_in_backlog(slot, true);
                    c.backlog.push_back((slot, TaskId(id)));
                }
            }
        };
        let c = &mut *core;
        if slots_as_planned {
            for (k, &(due_ms, id, i, _)) in order.iter().enumerate() {
                if let Some(&(_, _, ahead, _)) = order.get(k + PREFETCH_AHEAD) {
                    if let Some(entry) = c.tasks.entry(slot_of(ahead)) {
                        prefetch(entry);
                    }
                }
                if dying.is_empty() || dying.binary_search(&i).is_err() {
                    place(c, due_ms, id, slot_of(i));
                }
            }
        } else {
            // Not as planned (which does not happen): the handles' slots
            // are not the tasks'; place every task from the slab.
            let mut from_slab: Vec<(u64, u64, u32)> = c
                .tasks
                .iter_slots()
                .map(|(slot, t)| (t.due_ms, t.id.0, slot))
                .collect();
            from_slab.sort_unstable();
            for (due_ms, id, slot) in from_slab {
                place(c, due_ms, id, slot);
            }
        }
        let built = match indexing.map(|h| h.join()) {
            Ok(Ok(built)) if slots_as_planned => Some(built),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // No thread (or, which does not happen, slots not as planned):
            // the index is built here, from the slab.
            _ => None,
        };
        let c = &mut *core;
        let (index, pairs) = match built {
            Some(built) => built,
            None => {
                let mut filed: Vec<(u32, u32)> = c
                    .tasks
                    .iter_slots()
                    .map(|(slot, t)| (c.index.tag(c.payloads.key(&t.bytes)), slot))
                    .collect();
                let mut index = c.index.empty_like();
                let pairs = index.insert_batch_unchecked(&mut filed);
                (index, pairs)
            }
        };
        c.index = index;
        c.index.publish();
        let (tasks, payloads) = (&c.tasks, &c.payloads);
        let key_of = |slot: u32| tasks.get(slot).map(|t| payloads.key(&t.bytes));
        // `pairs` holds (first slot of a run under one tag, other slot of
        // that run), runs one after the other: compare keys within each run.
        let mut twice = None;
        let mut seen: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
        let mut run = None;
        for &(a, b) in &pairs {
            if run != Some(a) {
                run = Some(a);
                seen.clear();
                seen.extend(key_of(a));
            }
            if let Some(k) = key_of(b) {
                if !seen.insert(k) {
                    twice = Some(b);
                    break;
                }
            }
        }
        if let Some(a) = twice {
            // The engine is discarded: what was placed does not matter.
            return Err(format!(
                "two live tasks have key {:?}",
                key_of(a).map_or_else(String::new, |k| String::from_utf8_lossy(k).into())
            ));
        }
        core.far = far_index;
        core.far_cursors = far_cursors;
        let c = &mut *core;
        for file in c.far.files() {
            *c.overflow_files.entry(file).or_default() += c.far.live_in_file(file);
        }
        recovery.pending = core.tasks.len() + core.far.len();
        recovery.dead_letters = core.dead.len();
        let c = &mut *core;
        for task in c.tasks.iter() {
            if let Some((file, _)) = task.bytes.on_disk() {
                *c.overflow_files.entry(file).or_default() += 1;
            }
        }
        if let Some(last) = core.overflow_files.keys().next_back() {
            core.next_overflow_file = core.next_overflow_file.max(last.saturating_add(1));
        }
        if let Some(cause) = unreadable {
            self.poison_locked(&mut core, cause);
        }
        if !settle.is_empty() {
            // Waited for (before the driver starts): a power cut right after
            // open must not undo a dead letter made here. A failure poisons
            // the engine.
            let ticket = self.append_locked(&mut core, &settle.records());
            drop(core);
            if let Err(cause) = ticket.and_then(|ticket| self.wait_durable(ticket)) {
                tracing::error!(%cause, "could not log the settling of deliveries in flight");
            }
        }
        Ok(recovery)
    }

    /// Schedules one task: [`Shared::schedule_batch`] without the batch's
    /// bookkeeping (duplicate check, per-task vectors), so an in-memory
    /// schedule makes no allocation of its own but the task's key and
    /// payload when together they take more than 1 KiB (made before the
    /// lock; shorter ones go in the task's entry or the payload arena).
    ///
    /// Not inlined into its one caller (`Engine::schedule`): inlined, it took
    /// ~15 more instructions per call (callgrind, `probe schedule`).
    #[inline(never)]
    fn schedule_one(&self, t: &NewTask<'_>) -> Result<TaskId, ScheduleError> {
        // `prepare`, with the key's index bucket loading meanwhile (and
        // while the lock is taken) once the key's length is known to be valid.
        self.validate_shape(t)?;
        let tag = self.index_probe.tag(t.key);
        self.index_probe.prefetch(tag);
        let now = self.now();
        let due_ms = self.validate_due(t.due, now.wall_ns)?;
        let due_tick = self.due_tick(due_ms, now);
        check_frame_bytes(std::slice::from_ref(t))?;
        // Over 1 KiB: allocated and copied before the lock.
        let prebuilt = PayloadStore::prebuild(t.key, t.payload);

        self.await_relocation();
        // `lock_reading_far`, with the far reads (and their drop) only in
        // an engine that has far tasks: an in-memory one never does.
        let core = self.core.lock();
        let (mut core, reads) = if core.far.is_empty() || self.disk.is_none() {
            (core, None)
        } else {
            let (core, reads, far_match) = self
                .reading_far(core, std::iter::once(t.key))
                .map_err(|cause| ScheduleError::Poisoned { cause })?;
            (core, far_match.then_some(reads))
        };
        // `AlreadyExists` before `TooManyPending`, as in `schedule_batch`.
        core.check_open().map_err(status_to_schedule_error)?;
        if core.find_slot(tag, t.key).is_some()
            || match reads {
                Some(reads) => self
                    .far_key_or_poison(&mut core, t.key, &reads)
                    .map_err(|cause| ScheduleError::Poisoned { cause })?,
                None => false,
            }
        {
            return Err(self.already_exists(core, t.key));
        }
        // `check_room` without its second `check_open` (done above), the
        // refusal built out of line.
        if core.tasks.len() + core.far.len() >= self.config.pending_tasks_max {
            return Err(self.too_many_pending(core));
        }
        self.check_horizon(&core, due_ms, due_tick)?;
        let id = TaskId(core.next_id);
        let ticket = self.log_schedules(&mut core, std::slice::from_ref(t), &[due_ms], id.0)?;
        core.next_id += 1;
        if self.place_task(&mut core, id, t, prebuilt, tag, due_ms, due_tick) {
            self.driver_cv.notify_all();
        }
        drop(core);
        self.wait_durable(ticket)
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        Ok(id)
    }

    /// The `AlreadyExists` error for `key`, returned once everything logged
    /// so far is durable (the live task's schedule record among it). Out of
    /// line: a refusal, kept off `schedule_one`'s path.
    #[cold]
    #[inline(never)]
    fn already_exists(&self, core: parking_lot::MutexGuard<'_, Core>, key: &[u8]) -> ScheduleError {
        self.already_exists_with(core, key, &Blocking)
    }

    /// [`Shared::already_exists`], waiting as `wait` says.
    fn already_exists_with<W: WaitMode>(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        key: &[u8],
        wait: &W,
    ) -> ScheduleError {
        match self.wait_logged_with(core, wait) {
            Ok(()) => ScheduleError::AlreadyExists {
                key: key_lossy(key),
            },
            Err(cause) => ScheduleError::Poisoned { cause },
        }
    }

    /// [`Engine::reschedule`].
    fn reschedule(
        &self,
        key: &[u8],
        due: Due,
        payload: Option<&[u8]>,
    ) -> Result<RescheduleOutcome, ScheduleError> {
        self.reschedule_with(key, due, payload, &Blocking)
    }

    /// [`Shared::reschedule`], waiting for durability as `wait` says.
    fn reschedule_with<W: WaitMode>(
        &self,
        key: &[u8],
        due: Due,
        payload: Option<&[u8]>,
        wait: &W,
    ) -> Result<RescheduleOutcome, ScheduleError> {
        let new = NewTask {
            key,
            due,
            payload: payload.unwrap_or(&[]),
        };
        let now = self.now();
        let (due_ms, due_tick) = self.prepare(&new, now)?;
        check_frame_bytes(std::slice::from_ref(&new))?;
        // Over 1 KiB: allocated and copied before the lock.
        let mut prebuilt = PayloadStore::prebuild(key, new.payload);
        self.await_relocation();
        let (mut core, reads, _) = self
            .lock_reading_far(std::iter::once(key))
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        core.check_open().map_err(status_to_schedule_error)?;
        let tag = core.key_tag(key);
        let found = self
            .locate_or_poison(&mut core, key, &reads)
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        let Some(slot) = found else {
            // Upsert: a new task, under the same lock as the lookup.
            if let Err(refusal) = self.check_room(&core, 1) {
                return Err(self.room_refused_with(core, refusal, wait));
            }
            self.check_horizon(&core, due_ms, due_tick)?;
            let id = TaskId(core.next_id);
            let ticket =
                self.log_schedules(&mut core, std::slice::from_ref(&new), &[due_ms], id.0)?;
            core.next_id += 1;
            if self.place_task(&mut core, id, &new, prebuilt, tag, due_ms, due_tick) {
                self.driver_cv.notify_all();
            }
            drop(core);
            wait.wait(self, ticket)
                .map_err(|cause| ScheduleError::Poisoned { cause })?;
            return Ok(RescheduleOutcome::Scheduled(id));
        };
        let (id, state) = match core.tasks.get(slot) {
            Some(t) => (t.id, t.state),
            None => return Err(ScheduleError::Closed),
        };
        if matches!(state, TaskState::Leased | TaskState::Abandoned) {
            return Err(ScheduleError::InFlight {
                key: key_lossy(key),
            });
        }
        self.check_horizon(&core, due_ms, due_tick)?;
        let mut batch = RecordBatch::default();
        if state == TaskState::Ready {
            // Handed out but not received: take the delivery back first.
            batch.push(&Record::Release { id });
        }
        batch.push(&Record::Reschedule {
            id,
            due_ms,
            payload,
        });
        let ticket = self
            .append_locked(&mut core, &batch.records())
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        let c = &mut *core;
        c.totals.tasks_rescheduled += 1;
        if let Some(task) = c.tasks.get_mut(slot) {
            if state == TaskState::Ready {
                task.state = TaskState::Scheduled;
                task.deliveries = task.deliveries.saturating_sub(1);
                c.ready_count -= 1;
                // Its queue entry would pass for the next hand-out of the same task (same
                // id, state `Ready` again) with a stale hand-out time and place in line.
                // O(ready queue); rescheduling a task due but not received is rare.
                // Passes not yet durable hold entries too.
                let other = |e: &ReadyEntry| !(e.slot == slot && e.id == id);
                c.ready.retain(other);
                for pass in &mut c.handouts_pending {
                    pass.retain(other);
                }
                // And a consumer reading its payload drops its entry.
                c.receiving.retain(other);
            }
            // Scheduled without a timer and not in the catch-up backlog: it
            // waits in the overdue queue, where a new entry may join it.
            let queued = state == TaskState::Scheduled && task.timer.is_none() && !task.in_backlog;
            if let Some(timer) = task.timer.take() {
                c.wheel.remove(timer);
            }
            c.overdue_replaced |= queued;
            task.due_ms = due_ms;
            if let Some(payload) = payload {
                let bytes = match prebuilt.take() {
                    Some(built) => c.payloads.adopt(built),
                    None => c.payloads.put(key, payload),
                };
                let old = std::mem::replace(&mut task.bytes, bytes);
                c.release_bytes(slot, old);
                self.payload_replacements
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                task.bytes.due_moved();
            }
        }
        // Placed anew: out of the catch-up backlog if it waited there (its
        // entry there is left behind, stale).
        c.tasks.set_in_backlog(slot, false);
        let due_tick = self.placement_tick(c, due_ms, due_tick);
        let wake = match c.wheel.insert(due_tick, slot) {
            Ok(timer) => {
                if let Some(task) = c.tasks.get_mut(slot) {
                    task.timer = Some(timer);
                }
                self.driver_should_wake(c, due_tick)
            }
            Err(_) => {
                c.push_overdue(slot, id);
                c.sleep != DriverSleep::Busy
            }
        };
        if wake {
            self.driver_cv.notify_all();
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        Ok(RescheduleOutcome::Rescheduled(id))
    }

    /// [`Engine::requeue_dead_letter`].
    fn requeue_dead_letter(&self, dead_id: TaskId, due: Due) -> Result<TaskId, ScheduleError> {
        self.requeue_dead_letter_with(dead_id, due, &Blocking)
    }

    /// [`Shared::requeue_dead_letter`], waiting for durability as `wait` says.
    fn requeue_dead_letter_with<W: WaitMode>(
        &self,
        dead_id: TaskId,
        due: Due,
        wait: &W,
    ) -> Result<TaskId, ScheduleError> {
        let now = self.now();
        self.await_relocation();
        let mut core = self.core.lock();
        core.check_open().map_err(status_to_schedule_error)?;
        let Some(dead) = core.dead.get(dead_id.0) else {
            // Gone by a record (a purge, a requeue) that may not be durable yet.
            return Err(match self.wait_logged_with(core, wait) {
                Ok(()) => ScheduleError::NotDeadLetter { task_id: dead_id.0 },
                Err(cause) => ScheduleError::Poisoned { cause },
            });
        };
        let (key, payload) = (dead.key.clone(), dead.payload.clone());
        let new = NewTask {
            key: &key,
            due,
            payload: &payload,
        };
        let (due_ms, due_tick) = self.prepare(&new, now)?;
        check_frame_bytes(std::slice::from_ref(&new))?;
        // `AlreadyExists` before `TooManyPending`, as in `schedule_one`.
        let tag = core.key_tag(&key);
        if core.find_slot(tag, &key).is_some()
            || self
                .far_key_or_poison(&mut core, &key, &far::FarReads::default())
                .map_err(|cause| ScheduleError::Poisoned { cause })?
        {
            return Err(self.already_exists_with(core, &key, wait));
        }
        if let Err(refusal) = self.check_room(&core, 1) {
            return Err(self.room_refused_with(core, refusal, wait));
        }
        self.check_horizon(&core, due_ms, due_tick)?;
        let id = TaskId(core.next_id);
        let mut batch = RecordBatch::default();
        batch.push(&Record::Purge { id: dead_id });
        batch.push(&Record::Schedule {
            id,
            due_ms,
            key: &key,
            payload: &payload,
        });
        let ticket = self
            .append_locked(&mut core, &batch.records())
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        core.next_id += 1;
        core.remove_dead(dead_id.0);
        core.totals.dead_letters_requeued += 1;
        if self.place_task(&mut core, id, &new, None, tag, due_ms, due_tick) {
            self.driver_cv.notify_all();
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        Ok(id)
    }

    /// Schedules a non-empty batch atomically; returns the first id (the
    /// batch's ids are consecutive).
    fn schedule_batch(&self, new: &[NewTask<'_>]) -> Result<TaskId, ScheduleError> {
        self.schedule_batch_with(new, &Blocking)
    }

    /// [`Shared::schedule_batch`], waiting for durability as `wait` says
    /// (the async calls defer it to their caller's `.await`).
    fn schedule_batch_with<W: WaitMode>(
        &self,
        new: &[NewTask<'_>],
        wait: &W,
    ) -> Result<TaskId, ScheduleError> {
        if new.len() > BATCH_TASKS_MAX {
            return Err(ScheduleError::BatchTooLarge {
                tasks: new.len(),
                max: BATCH_TASKS_MAX,
            });
        }
        let now = self.now();
        let mut due_ms: SmallVec<[u64; 1]> = SmallVec::with_capacity(new.len());
        let mut due_ticks: SmallVec<[Tick; 1]> = SmallVec::with_capacity(new.len());
        for t in new {
            let (ms, tick) = self.prepare(t, now)?;
            due_ms.push(ms);
            due_ticks.push(tick);
        }
        // Tags hashed before the lock is taken.
        let tags: SmallVec<[u32; 1]> = new.iter().map(|t| self.index_probe.tag(t.key)).collect();
        if let Some(twice) = first_repeated_key(new, &tags) {
            return Err(ScheduleError::DuplicateKeyInBatch {
                key: key_lossy(new[twice].key),
            });
        }
        check_frame_bytes(new)?;
        // Keys and payloads over 1 KiB together: allocated and copied
        // before the lock (no vector at all when there are none).
        let mut prebuilt: Vec<Option<crate::task::PayloadRef>> = Vec::new();
        if new
            .iter()
            .any(|t| t.key.len() + t.payload.len() > crate::arena::ARENA_BYTES_MAX)
        {
            prebuilt = new
                .iter()
                .map(|t| PayloadStore::prebuild(t.key, t.payload))
                .collect();
        }

        self.await_relocation();
        let (mut core, reads, far_match) = self
            .lock_reading_far(new.iter().map(|t| t.key))
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        // A key already live is `AlreadyExists` even at the pending limit:
        // the call would be refused with room to spare too, and a producer
        // retrying a schedule it made learns that it did.
        core.check_open().map_err(status_to_schedule_error)?;
        for (i, (t, &tag)) in new.iter().zip(&tags).enumerate() {
            prefetch_lookups(&core.index, &tags, i);
            if core.find_slot(tag, t.key).is_some() {
                return Err(self.already_exists_with(core, t.key, wait));
            }
        }
        if far_match {
            for t in new {
                if self
                    .far_key_or_poison(&mut core, t.key, &reads)
                    .map_err(|cause| ScheduleError::Poisoned { cause })?
                {
                    return Err(self.already_exists_with(core, t.key, wait));
                }
            }
        }
        if let Err(refusal) = self.check_room(&core, new.len()) {
            return Err(self.room_refused_with(core, refusal, wait));
        }
        for (&ms, &tick) in due_ms.iter().zip(&due_ticks) {
            self.check_horizon(&core, ms, tick)?;
        }
        let first_id = core.next_id;
        let ticket = self.log_schedules(&mut core, new, &due_ms, first_id)?;
        core.next_id += new.len() as u64;
        let mut wake_driver = false;
        for (i, t) in new.iter().enumerate() {
            let id = TaskId(first_id + i as u64);
            let built = prebuilt.get_mut(i).and_then(Option::take);
            wake_driver |=
                self.place_task(&mut core, id, t, built, tags[i], due_ms[i], due_ticks[i]);
        }
        if wake_driver {
            self.driver_cv.notify_all();
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| ScheduleError::Poisoned { cause })?;
        Ok(TaskId(first_id))
    }

    /// `schedule_one`'s refusal of one more task at `pending_tasks_max` (the
    /// engine open): [`Shared::check_room`]'s `TooManyPending`, answered as
    /// [`Shared::room_refused`] answers it. Out of line.
    #[cold]
    #[inline(never)]
    fn too_many_pending(&self, core: parking_lot::MutexGuard<'_, Core>) -> ScheduleError {
        let refusal = self.pending_limit_reached(&core);
        self.room_refused(core, refusal)
    }

    /// `TooManyPending`, with the live tasks counted now.
    fn pending_limit_reached(&self, core: &Core) -> ScheduleError {
        ScheduleError::TooManyPending {
            pending: core.tasks.len() + core.far.len(),
            max: self.config.pending_tasks_max,
        }
    }

    /// A refusal of [`Shared::check_room`]: `TooManyPending` counts live tasks whose
    /// schedule records may not be durable yet (another caller's, still being synced), so it
    /// is returned once everything logged so far is, as `AlreadyExists` is; `Closed` and
    /// `Poisoned` at once. Out of line, as [`Shared::already_exists`].
    #[cold]
    #[inline(never)]
    fn room_refused(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        refusal: ScheduleError,
    ) -> ScheduleError {
        self.room_refused_with(core, refusal, &Blocking)
    }

    /// [`Shared::room_refused`], waiting as `wait` says.
    fn room_refused_with<W: WaitMode>(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        refusal: ScheduleError,
        wait: &W,
    ) -> ScheduleError {
        if !matches!(refusal, ScheduleError::TooManyPending { .. }) {
            return refusal;
        }
        match self.wait_logged_with(core, wait) {
            Ok(()) => refusal,
            Err(cause) => ScheduleError::Poisoned { cause },
        }
    }

    /// Checks a task's shape and due time (no lock needed); returns its due
    /// time in UTC ms and its due tick.
    fn prepare(&self, t: &NewTask<'_>, now: Now) -> Result<(u64, Tick), ScheduleError> {
        self.validate_shape(t)?;
        let due_ms = self.validate_due(t.due, now.wall_ns)?;
        Ok((due_ms, self.due_tick(due_ms, now)))
    }

    /// Refuses `adding` more tasks if that would pass `pending_tasks_max`,
    /// or if the engine is not open.
    #[inline]
    fn check_room(&self, core: &Core, adding: usize) -> Result<(), ScheduleError> {
        core.check_open().map_err(status_to_schedule_error)?;
        if core.tasks.len() + core.far.len() + adding > self.config.pending_tasks_max {
            return Err(self.pending_limit_reached(core));
        }
        Ok(())
    }

    /// Refuses a due tick past the wheel's range (reachable when the wheel
    /// lags behind the clock).
    fn check_horizon(&self, core: &Core, due_ms: u64, due_tick: Tick) -> Result<(), ScheduleError> {
        let horizon = Tick(core.wheel.elapsed().0.saturating_add(WHEEL_RANGE_TICKS - 1));
        if due_tick <= horizon {
            return Ok(());
        }
        let excess_ms = (due_tick.0 - horizon.0).saturating_mul(self.config.tick_ms());
        Err(ScheduleError::DueTooFar {
            due_ms,
            max_ms: due_ms.saturating_sub(excess_ms),
        })
    }

    /// Appends the schedule records of `new` (if the engine has a log), under
    /// the core lock so log order is apply order.
    #[inline]
    fn log_schedules(
        &self,
        core: &mut Core,
        new: &[NewTask<'_>],
        due_ms: &[u64],
        first_id: u64,
    ) -> Result<Option<AppendTicket>, ScheduleError> {
        if core.wal.is_none() {
            return Ok(None);
        }
        self.log_schedules_to_wal(core, new, due_ms, first_id)
    }

    /// [`Shared::log_schedules`] with a log.
    fn log_schedules_to_wal(
        &self,
        core: &mut Core,
        new: &[NewTask<'_>],
        due_ms: &[u64],
        first_id: u64,
    ) -> Result<Option<AppendTicket>, ScheduleError> {
        let (bodies, ends) = encode_schedules(new, due_ms, first_id);
        let mut records = Vec::with_capacity(new.len());
        let mut start = 0;
        for &end in &ends {
            records.push(kairos_wal::Record {
                record_type: RECORD_SCHEDULE,
                body: &bodies[start..end],
            });
            start = end;
        }
        self.append_locked(core, &records)
            .map_err(|cause| ScheduleError::Poisoned { cause })
    }

    /// Stores a validated, logged task in the slab, the index and the wheel
    /// (or the overdue queue), with the key and payload of `new` in the
    /// payload store (`prebuilt`: made by [`PayloadStore::prebuild`] for
    /// `new` before the lock). Returns whether the driver must be woken.
    #[allow(clippy::too_many_arguments)]
    fn place_task(
        &self,
        core: &mut Core,
        id: TaskId,
        new: &NewTask<'_>,
        prebuilt: Option<crate::task::PayloadRef>,
        key_tag: u32,
        due_ms: u64,
        due_tick: Tick,
    ) -> bool {
        // pending_tasks_max ≤ u32::MAX (validated), so a slot always exists.
        let Some(slot) = core.tasks.vacant_slot() else {
            return false;
        };
        // The wheel entry first, so the task is written once, complete, and
        // never read back (at a million tasks that read is a cache miss).
        let due_tick = self.placement_tick(core, due_ms, due_tick);
        let placed = core.wheel.insert(due_tick, slot);
        let task_bytes = new.key.len() + new.payload.len();
        let task = Task {
            id,
            bytes: match prebuilt {
                Some(built) => core.payloads.adopt(built),
                None => core.payloads.put(new.key, new.payload),
            },
            due_ms,
            state: TaskState::Scheduled,
            deliveries: 0,
            timer: placed.ok(),
            in_backlog: false,
        };
        let stored = core.insert_task(task, key_tag);
        debug_assert_eq!(stored, Some(slot));
        core.totals.tasks_scheduled += 1;
        self.count_far_scheduled(core, due_tick, task_bytes);
        match placed {
            Ok(_) => match core.sleep {
                DriverSleep::Busy => false,
                DriverSleep::Forever => true,
                DriverSleep::Until(t) => due_tick < t,
            },
            Err(InsertError::Elapsed) => {
                core.push_overdue(slot, id);
                core.sleep != DriverSleep::Busy
            }
            Err(e @ (InsertError::TooFar | InsertError::Full)) => {
                // Ruled out by `check_horizon` (range) and by
                // `pending_tasks_max` (count). Never fire early: the task
                // stays scheduled, without a timer, and is placed again by
                // the next open.
                debug_assert!(false, "wheel refused task {id:?}: {e:?}");
                tracing::error!(?id, ?e, "wheel refused a task");
                false
            }
        }
    }

    fn validate_shape(&self, t: &NewTask<'_>) -> Result<(), ScheduleError> {
        if t.key.is_empty() {
            return Err(ScheduleError::EmptyKey);
        }
        if t.key.len() > self.config.key_bytes_max {
            return Err(ScheduleError::KeyTooLong {
                bytes: t.key.len(),
                max: self.config.key_bytes_max,
            });
        }
        if t.payload.len() > self.config.payload_bytes_max {
            return Err(ScheduleError::PayloadTooLarge {
                bytes: t.payload.len(),
                max: self.config.payload_bytes_max,
            });
        }
        Ok(())
    }

    /// The due time in UTC ms (rounded up), checked against `delay_max`.
    #[inline]
    fn validate_due(&self, due: Due, wall_ns: i128) -> Result<u64, ScheduleError> {
        due_ms_checked(due, wall_ns, self.config.delay_max)
    }

    /// What cancelling the task in `slot` answers, and whether it is
    /// cancelled outright (`Some(true)`: forget it), or abandoned in flight
    /// (`Some(false)`), or left alone (`None`).
    fn cancel_decision(core: &Core, slot: u32) -> (CancelOutcome, Option<(TaskId, bool)>) {
        match core.tasks.get(slot) {
            Some(t) => match t.state {
                TaskState::Scheduled => (
                    CancelOutcome::Cancelled {
                        deliveries: t.deliveries,
                    },
                    Some((t.id, true)),
                ),
                // Handed out, but no consumer has it: its deliver record
                // reached nobody.
                TaskState::Ready => (
                    CancelOutcome::Cancelled {
                        deliveries: t.deliveries.saturating_sub(1),
                    },
                    Some((t.id, true)),
                ),
                TaskState::Leased => (
                    CancelOutcome::AlreadyDelivered {
                        attempt: t.deliveries,
                    },
                    Some((t.id, false)),
                ),
                // Not reachable by key (its index entry is gone).
                TaskState::Abandoned => (CancelOutcome::NotFound, None),
            },
            None => (CancelOutcome::NotFound, None),
        }
    }

    /// Answers `NotFound` once everything logged so far is durable: the task
    /// may have left by a record not yet durable (an ack, a cancel), and the
    /// answer must not outlive a crash that undoes it.
    fn not_found(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
    ) -> Result<CancelOutcome, CancelError> {
        self.wait_logged(core)
            .map_err(|cause| CancelError::Poisoned { cause })?;
        Ok(CancelOutcome::NotFound)
    }

    /// Applies a logged cancel to the task whose index entry is `found`.
    /// An outright cancel counts in [`Stats::tasks_cancelled`].
    fn apply_cancel(&self, core: &mut Core, found: Found, outright: bool) {
        if outright {
            core.totals.tasks_cancelled += 1;
            self.forget_task_tagged(core, found.slot, Some(found));
        } else if let Some(t) = core.tasks.get_mut(found.slot) {
            // The holder may still ack or nack; nothing follows either way.
            t.state = TaskState::Abandoned;
            core.index.remove_found(found);
        }
    }

    /// Cancels one key: [`Shared::cancel_many`] without the outcome vector
    /// and duplicate tracking, so an in-memory cancel allocates nothing.
    fn cancel_one(&self, key: &[u8]) -> Result<CancelOutcome, CancelError> {
        // The key's index bucket starts loading while the lock is taken.
        let tag = self.index_probe.tag(key);
        self.index_probe.prefetch(tag);
        let core = self.core.lock();
        if !core.far.is_empty() && self.disk.is_some() {
            return self.cancel_one_maybe_far(core, key, tag);
        }
        // No far task: the key's task, if any, is in the slab
        // (`Shared::locate_for_cancel` without the far reads).
        core.check_open().map_err(status_to_cancel_error)?;
        match core.find_entry(tag, key) {
            Some(found) => self.cancel_slot(core, found),
            None => self.not_found(core),
        }
    }

    /// [`Shared::cancel_one`] in an engine with far tasks: the key's
    /// overflow entry, if its hash matches one, is read with the lock let go
    /// ([`Shared::reading_far`]).
    #[cold]
    #[inline(never)]
    fn cancel_one_maybe_far(
        &self,
        core: parking_lot::MutexGuard<'_, Core>,
        key: &[u8],
        tag: u32,
    ) -> Result<CancelOutcome, CancelError> {
        let (mut core, reads, _) = self
            .reading_far(core, std::iter::once(key))
            .map_err(|cause| CancelError::Poisoned { cause })?;
        core.check_open().map_err(status_to_cancel_error)?;
        let found = self
            .locate_for_cancel(&mut core, key, tag, &reads)
            .map_err(|cause| CancelError::Poisoned { cause })?;
        match found {
            None => self.not_found(core),
            Some(far::Located::Slot(found)) => self.cancel_slot(core, found),
            Some(far::Located::Far { pos, entry: e }) => {
                let ticket = self
                    .log_ids(&mut core, RECORD_CANCEL, [TaskId(e.id)], |id| {
                        Record::Cancel { id }
                    })
                    .map_err(|cause| CancelError::Poisoned { cause })?;
                self.drop_far(&mut core, pos, e);
                drop(core);
                self.wait_durable(ticket)
                    .map_err(|cause| CancelError::Poisoned { cause })?;
                Ok(CancelOutcome::Cancelled { deliveries: 0 })
            }
        }
    }

    /// The rest of [`Shared::cancel_one`] once the key's task is found in
    /// its index entry `found`, under the hold `core`.
    #[inline]
    fn cancel_slot(
        &self,
        mut core: parking_lot::MutexGuard<'_, Core>,
        found: Found,
    ) -> Result<CancelOutcome, CancelError> {
        let slot = found.slot;
        let (outcome, action) = Self::cancel_decision(&core, slot);
        let Some((id, outright)) = action else {
            return self.not_found(core);
        };
        let ticket = self
            .log_ids(&mut core, RECORD_CANCEL, [id], |id| Record::Cancel { id })
            .map_err(|cause| CancelError::Poisoned { cause })?;
        self.apply_cancel(&mut core, found, outright);
        drop(core);
        self.wait_durable(ticket)
            .map_err(|cause| CancelError::Poisoned { cause })?;
        Ok(outcome)
    }

    fn cancel_many(&self, keys: &[&[u8]]) -> Result<Vec<CancelOutcome>, CancelError> {
        self.cancel_many_with(keys, &Blocking)
    }

    /// [`Shared::cancel_many`], waiting for durability as `wait` says.
    fn cancel_many_with<W: WaitMode>(
        &self,
        keys: &[&[u8]],
        wait: &W,
    ) -> Result<Vec<CancelOutcome>, CancelError> {
        if keys.len() > BATCH_TASKS_MAX {
            return Err(CancelError::BatchTooLarge {
                tasks: keys.len(),
                max: BATCH_TASKS_MAX,
            });
        }
        // Tags hashed before the lock is taken.
        let tags: SmallVec<[u32; 1]> = keys.iter().map(|k| self.index_probe.tag(k)).collect();
        let (mut core, reads, _) = self
            .lock_reading_far(keys.iter().copied())
            .map_err(|cause| CancelError::Poisoned { cause })?;
        core.check_open().map_err(status_to_cancel_error)?;
        let mut outcomes = Vec::with_capacity(keys.len());
        let mut victims: SmallVec<[(CancelVictim, TaskId); 1]> = SmallVec::new();
        // Only a multi-key call can name a key twice; a single cancel allocates nothing.
        // Task ids: unique across the slab and the far index.
        let mut seen: Option<HashSet<u64, foldhash::fast::RandomState>> = (keys.len() > 1)
            .then(|| HashSet::with_capacity_and_hasher(keys.len(), Default::default()));
        let mut first = |id: u64| seen.as_mut().is_none_or(|seen| seen.insert(id));
        for (i, (key, &tag)) in keys.iter().zip(&tags).enumerate() {
            prefetch_lookups(&core.index, &tags, i);
            let found = self
                .locate_for_cancel(&mut core, key, tag, &reads)
                .map_err(|cause| CancelError::Poisoned { cause })?;
            let outcome = match found {
                None => CancelOutcome::NotFound,
                Some(far::Located::Slot(found)) => {
                    let slot = found.slot;
                    // `find_entry` gives only slots holding a task with the key.
                    let Some(id) = core.tasks.get(slot).map(|t| t.id.0) else {
                        outcomes.push(CancelOutcome::NotFound);
                        continue;
                    };
                    if first(id) {
                        let (outcome, action) = Self::cancel_decision(&core, slot);
                        if let Some((id, outright)) = action {
                            victims.push((CancelVictim::Slot { found, outright }, id));
                        }
                        outcome
                    } else {
                        // The same key twice in one call: the second finds it gone.
                        CancelOutcome::NotFound
                    }
                }
                Some(far::Located::Far { pos, entry: e }) => {
                    if first(e.id) {
                        victims.push((CancelVictim::Far { pos, entry: e }, TaskId(e.id)));
                        CancelOutcome::Cancelled { deliveries: 0 }
                    } else {
                        CancelOutcome::NotFound
                    }
                }
            };
            outcomes.push(outcome);
        }
        let ids = victims.iter().map(|&(_, id)| id);
        let ticket = self
            .log_ids(&mut core, RECORD_CANCEL, ids, |id| Record::Cancel { id })
            .map_err(|cause| CancelError::Poisoned { cause })?
            .or_else(|| Self::barrier_locked(&core));
        for (victim, _) in victims {
            match victim {
                CancelVictim::Slot { found, outright } => {
                    self.apply_cancel(&mut core, found, outright)
                }
                CancelVictim::Far { pos, entry } => self.drop_far(&mut core, pos, entry),
            }
        }
        drop(core);
        wait.wait(self, ticket)
            .map_err(|cause| CancelError::Poisoned { cause })?;
        Ok(outcomes)
    }

    /// Appends one id-only record (`record(id)`, of type `record_type`) per
    /// id in one log write, under the core lock. Encodes nothing without a
    /// log.
    fn log_ids(
        &self,
        core: &mut Core,
        record_type: u8,
        ids: impl IntoIterator<Item = TaskId>,
        record: impl Fn(TaskId) -> Record<'static>,
    ) -> Result<Option<AppendTicket>, String> {
        if core.wal.is_none() {
            return Ok(None);
        }
        let mut bodies = Vec::new();
        for id in ids {
            record(id).encode_into(&mut bodies);
        }
        self.append_fixed(core, record_type, &bodies, ID_ONLY_BYTES)
    }

    /// Removes a task from every structure and frees its memory.
    fn forget_task(&self, core: &mut Core, slot: u32) {
        // The index entry is found by the key's tag, not kept in the task
        // (whose entry stays at 64 bytes); an abandoned task has none.
        let Some(tag) = core.tasks.get(slot).map(|t| {
            (t.state != TaskState::Abandoned)
                .then(|| Found::tagged(slot, core.index.tag(core.payloads.key(&t.bytes))))
        }) else {
            return;
        };
        self.forget_task_tagged(core, slot, tag);
    }

    /// [`Shared::forget_task`] when the key's index entry is known, by its
    /// tag at least (`None`: only for a task without an index entry, an
    /// abandoned one); `found` is the entry of `slot`.
    fn forget_task_tagged(&self, core: &mut Core, slot: u32, found: Option<Found>) {
        if let Some(task) = core.tasks.remove(slot) {
            if let Some(timer) = task.timer {
                core.wheel.remove(timer);
            }
            match task.state {
                TaskState::Scheduled => {}
                TaskState::Ready => core.ready_count -= 1,
                TaskState::Leased | TaskState::Abandoned => core.in_flight_count -= 1,
            }
            // Absent already for an abandoned task.
            if let Some(found) = found {
                core.index.remove_found(found);
            }
            core.release_bytes(slot, task.bytes);
            // Overdue, backlog and ready entries, if any, are skipped by
            // their id and state checks.
        }
    }

    /// Appends records (if the engine has a log) while the caller holds the
    /// core lock, so log order is apply order. An append error poisons the
    /// engine and is returned as its cause.
    fn append_locked(
        &self,
        core: &mut Core,
        records: &[kairos_wal::Record<'_>],
    ) -> Result<Option<AppendTicket>, String> {
        let Some(wal) = &core.wal else {
            return Ok(None);
        };
        if records.is_empty() {
            return Ok(None);
        }
        let bytes: usize = records
            .iter()
            .map(|r| r.body.len() + RECORD_HEADER_BYTES)
            .sum();
        let appended = wal.append(records);
        if appended.is_ok() {
            self.count_log_bytes(core, bytes as u64);
        }
        appended.map(Some).map_err(|e| {
            let cause = e.to_string();
            // Input the log refuses (size, type) is checked by the engine
            // before it gets here; if one slips through, it is still no
            // reason to stop the engine: nothing was written.
            if !matches!(
                e,
                WalError::RecordTooLarge { .. } | WalError::InvalidRecord { .. }
            ) {
                self.poison_locked(core, cause.clone());
            }
            cause
        })
    }

    /// [`Shared::append_locked`] for bodies of one fixed size laid end to end.
    fn append_fixed(
        &self,
        core: &mut Core,
        record_type: u8,
        bodies: &[u8],
        body_bytes: usize,
    ) -> Result<Option<AppendTicket>, String> {
        if core.wal.is_none() {
            return Ok(None);
        }
        let records: Vec<kairos_wal::Record<'_>> = bodies
            .chunks_exact(body_bytes)
            .map(|body| kairos_wal::Record { record_type, body })
            .collect();
        self.append_locked(core, &records)
    }

    fn run_until_idle(&self) {
        let target = self.now();
        let target_ns = target.engine_ns;
        let mut core = self.core.lock();
        loop {
            if core.stop {
                return;
            }
            // A wall clock stepped back meanwhile (by another thread, or
            // NTP) is waited for only as far as it reads now: the driver's
            // passes read the stepped-back time, and would never reach the
            // target read before the step.
            let wall_target_ns = target.wall_ns.min(self.now().wall_ns);
            if core.processed_ns >= target_ns
                && core.processed_wall_ns >= wall_target_ns
                && (core.overdue.is_empty() || core.paused)
                && core.sleep != DriverSleep::Busy
                && core.handouts_pending.is_empty()
            {
                return;
            }
            self.driver_cv.notify_all();
            self.idle_cv.wait(&mut core);
        }
    }
}

/// Encodes schedule bodies back to back; returns the bytes and each body's end.
fn encode_schedules(new: &[NewTask<'_>], due_ms: &[u64], first_id: u64) -> (Vec<u8>, Vec<usize>) {
    let total: usize = new
        .iter()
        .map(|t| SCHEDULE_FIXED_BYTES + t.key.len() + t.payload.len())
        .sum();
    let mut bodies = Vec::with_capacity(total);
    let mut ends = Vec::with_capacity(new.len());
    for (i, t) in new.iter().enumerate() {
        Record::Schedule {
            id: TaskId(first_id + i as u64),
            due_ms: due_ms[i],
            key: t.key,
            payload: t.payload,
        }
        .encode_into(&mut bodies);
        ends.push(bodies.len());
    }
    (bodies, ends)
}

/// Refuses a batch whose records would not fit in one log frame.
fn check_frame_bytes(new: &[NewTask<'_>]) -> Result<(), ScheduleError> {
    let body_bytes: usize = new
        .iter()
        .map(|t| RECORD_HEADER_BYTES + SCHEDULE_FIXED_BYTES + t.key.len() + t.payload.len())
        .sum();
    if body_bytes > FRAME_BODY_BYTES_MAX as usize {
        return Err(ScheduleError::BatchTooManyBytes {
            bytes: body_bytes,
            max: FRAME_BODY_BYTES_MAX as usize,
        });
    }
    Ok(())
}

/// Error text logged for a delivery whose lease a restart ended.
const LOST_LEASE_ERROR: &str = "in flight when the engine stopped (lease lost in a restart)";

/// Record bodies of several types laid end to end, appended as one frame.
#[derive(Debug, Default)]
struct RecordBatch {
    bodies: Vec<u8>,
    /// (record type, end of its body in `bodies`).
    ends: Vec<(u8, usize)>,
}

impl RecordBatch {
    fn push(&mut self, record: &Record<'_>) {
        record.encode_into(&mut self.bodies);
        self.ends.push((record.record_type(), self.bodies.len()));
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn clear(&mut self) {
        self.bodies.clear();
        self.ends.clear();
    }

    /// The records from `from` (an index into the pushes) to the end.
    fn records_from(&self, from: usize) -> Vec<kairos_wal::Record<'_>> {
        let mut start = match from {
            0 => 0,
            i => self.ends[i - 1].1,
        };
        self.ends[from..]
            .iter()
            .map(|&(record_type, end)| {
                let body = &self.bodies[start..end];
                start = end;
                kairos_wal::Record { record_type, body }
            })
            .collect()
    }

    fn records(&self) -> Vec<kairos_wal::Record<'_>> {
        self.records_from(0)
    }
}

/// Wall time of a clock reading, UTC ms (0 before the epoch).
fn wall_ms(now: Now) -> u64 {
    u64::try_from(now.wall_ns.div_euclid(1_000_000)).unwrap_or(0)
}

/// A data directory's storage, with what its open found there beyond the
/// replayed state ([`FoundOnDisk`]).
struct OpenedDisk {
    disk: checkpointing::Disk,
    found: FoundOnDisk,
}

/// What an open found on disk that the replayed state does not say: the
/// checkpoint it started from (LSN, bytes; 0 without one), the overflow file
/// number after every file present (also files only the checkpoint names, or
/// only tasks settled at open used), and each overflow file kept with its
/// entry count. [`Shared::take_found_on_disk`] records it before the engine's
/// threads start.
struct FoundOnDisk {
    checkpoint_lsn: u64,
    checkpoint_bytes: u64,
    next_overflow_file: u32,
    overflow_written: Vec<(u32, u64)>,
}

impl Shared {
    /// Records what the open found on disk ([`FoundOnDisk`]): so that no
    /// move or checkpoint reuses the number of an overflow file still on
    /// disk (its rename would replace a file the checkpoint names), and the
    /// checkpointer knows the checkpoint it starts from. Called before the
    /// engine's threads start.
    fn take_found_on_disk(&self, found: FoundOnDisk) {
        let mut book = self.checkpointing.lock();
        book.lsn = found.checkpoint_lsn;
        book.bytes = found.checkpoint_bytes;
        let mut core = self.core.lock();
        core.last_checkpoint_bytes = found.checkpoint_bytes;
        core.next_overflow_file = core.next_overflow_file.max(found.next_overflow_file);
        // Every file kept (also those only the checkpoint still names: the
        // next checkpoint deletes them) with its entry count.
        for (file, entries) in found.overflow_written {
            let written = core.overflow_files.entry(file).or_default();
            *written = (*written).max(entries);
        }
    }
}

/// One reading of both clocks, for due-time arithmetic.
#[derive(Debug, Clone, Copy)]
struct Now {
    /// Wall time, ns since the Unix epoch (negative before it).
    wall_ns: i128,
    /// Engine time ([`Shared::now_ns`]).
    engine_ns: u128,
}

/// [`Shared::validate_due`]: the due time in UTC ms (rounded up), checked
/// against `delay_max`: accepted when it is at most the latest due time in
/// ms, wall reading + `delay_max` rounded up too ([`latest_due_ms`], what
/// `DueTooFar` reports) — so a delay of exactly `delay_max` is accepted
/// whatever the sub-millisecond part of the reading (rounding the due time
/// up and the limit down refused it at every reading but a whole
/// millisecond), and every due time accepted is at most the `max_ms` a
/// refusal at that reading reports. A delay from a wall time after the
/// epoch — nearly every call — is worked out inline in `u64`: both below
/// 2^62 ns (146 years), their sum cannot overflow, and the figures are
/// [`due_ms_general`]'s (`due_ms_fast_path_matches_the_general_one`).
#[inline]
fn due_ms_checked(due: Due, wall_ns: i128, delay_max: Duration) -> Result<u64, ScheduleError> {
    const LIMIT_NS: u64 = 1 << 62;
    if let Due::After(d) = due {
        if let Ok(wall) = u64::try_from(wall_ns) {
            if wall < LIMIT_NS && d.as_secs() < LIMIT_NS / 1_000_000_000 {
                let due_ns = wall + d.as_secs() * 1_000_000_000 + u64::from(d.subsec_nanos());
                let due_ms = due_ns.div_ceil(1_000_000);
                let delay_max_ns = u64::try_from(delay_max.as_nanos()).unwrap_or(u64::MAX);
                if due_ms <= wall.saturating_add(delay_max_ns).div_ceil(1_000_000) {
                    return Ok(due_ms);
                }
            }
        }
    }
    due_ms_general(due, wall_ns, delay_max)
}

/// [`due_ms_checked`] for any due time and wall reading, in `i128`.
#[inline(never)]
fn due_ms_general(due: Due, wall_ns: i128, delay_max: Duration) -> Result<u64, ScheduleError> {
    let due_ns: i128 = match due {
        Due::At(at) => {
            if at < std::time::UNIX_EPOCH {
                return Err(ScheduleError::DueBeforeEpoch);
            }
            if system_time_to_ms(at).is_none() {
                // Past u64::MAX ms: far beyond any delay_max.
                return Err(ScheduleError::DueTooFar {
                    due_ms: u64::MAX,
                    max_ms: latest_due_ms(wall_ns, delay_max),
                });
            }
            system_time_to_ns(at)
        }
        Due::After(d) => wall_ns.saturating_add(d.as_nanos().min(i128::MAX as u128) as i128),
    };
    let Ok(due_ns) = u128::try_from(due_ns) else {
        return Err(ScheduleError::DueBeforeEpoch);
    };
    let due_ms = div_ceil_u128(due_ns, 1_000_000);
    let max_ms = latest_due_ms(wall_ns, delay_max);
    match u64::try_from(due_ms) {
        Ok(due_ms) if due_ms <= max_ms => Ok(due_ms),
        _ => Err(ScheduleError::DueTooFar {
            due_ms: u64::try_from(due_ms).unwrap_or(u64::MAX),
            max_ms,
        }),
    }
}

/// The latest due time accepted at `wall_ns`: wall time + `delay_max` in UTC
/// ms, rounded up as due times are (a wall time before the epoch counts as
/// the epoch; saturated at `u64::MAX`). What `DueTooFar` reports: a due time
/// is accepted exactly when its ms are at most this.
fn latest_due_ms(wall_ns: i128, delay_max: Duration) -> u64 {
    let latest_ns = u128::try_from(wall_ns)
        .unwrap_or(0)
        .saturating_add(delay_max.as_nanos());
    u64::try_from(div_ceil_u128(latest_ns, 1_000_000)).unwrap_or(u64::MAX)
}

/// `n / d`, rounded up. Divides in 64 bits whenever both fit (always in
/// practice: 2^64 ns is 584 years), since the 128-bit division routine
/// costs several times as much on the schedule path.
#[inline]
fn div_ceil_u128(n: u128, d: u128) -> u128 {
    if let (Ok(n), Ok(d)) = (u64::try_from(n), u64::try_from(d)) {
        return u128::from(n.div_ceil(d));
    }
    n.div_ceil(d)
}

/// A task a `cancel_many` call cancels, once its record is logged.
#[derive(Clone, Copy, Debug)]
enum CancelVictim {
    /// In the slab, its index entry as the lookup found it (removed there
    /// unless an earlier victim's removal moved it: [`TaskIndex::remove_found`]
    /// checks); `outright`: forgotten at once (else left `Abandoned` to its
    /// holder).
    Slot { found: Found, outright: bool },
    /// A far task: taken out of the far index (`pos`: where it was found).
    Far {
        pos: usize,
        entry: crate::far::FarEntry,
    },
}

/// The ids of a batch of `n` tasks scheduled at once: consecutive from `first`.
fn batch_ids(first: TaskId, n: usize) -> Vec<TaskId> {
    (0..n as u64).map(|i| TaskId(first.0 + i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in the driver (`in_handout` false) or the hand-out thread
    /// (true) — a bug — poisons the engine at once with its message: a
    /// consumer blocked in `recv` wakes with `Poisoned`, and calls answer
    /// `Poisoned`, instead of waiting for a thread that is gone. On disk
    /// (only passes with log records go through the hand-out thread).
    fn a_thread_panic_poisons_the_engine_at_once(in_handout: bool) {
        let clock = crate::ManualClock::new(1_700_000_000_000);
        // The hand-out thread waits for passes' log records: an engine on disk.
        let dir = tempfile::tempdir().expect("temporary directory");
        let engine = Engine::open_with(
            dir.path(),
            Config::default(),
            Arc::new(kairos_wal::storage::FsStorage),
            Arc::new(clock.clone()),
        )
        .expect("open");
        let consumer = engine.consumer();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            let _ = tx.send(consumer.recv_timeout(Duration::from_secs(60)));
        });
        *engine.shared.panic_in_pass.lock() = Some(in_handout);
        engine
            .schedule_after(b"now", Duration::ZERO, b"")
            .expect("schedule");
        let got = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the consumer woke");
        waiting.join().expect("consumer thread");
        let thread = if in_handout {
            "the kairos-handout thread panicked: a hand-out pass panicked (test)"
        } else {
            "the kairos-driver thread panicked: a driver pass panicked (test)"
        };
        match got {
            Err(crate::RecvError::Poisoned { cause }) => assert_eq!(cause, thread),
            other => panic!("expected Poisoned, got {other:?}"),
        }
        let refused = engine.schedule_after(b"later", Duration::from_secs(1), b"");
        assert!(
            matches!(&refused, Err(ScheduleError::Poisoned { cause }) if cause == thread),
            "{refused:?}"
        );
        assert_eq!(
            refused.map_err(|e| e.to_string()).unwrap_err(),
            format!(
                "the engine is poisoned: {thread} ({})",
                crate::error::POISON_REMEDY
            )
        );
        match engine.shutdown() {
            Err(e @ crate::ShutdownError::Poisoned { .. }) => assert_eq!(
                e.to_string(),
                format!(
                    "the engine was poisoned: {thread} (it is shut down; deal with the cause \
                     and open the directory again)"
                )
            ),
            other => panic!("expected Poisoned, got {other:?}"),
        }
    }

    #[test]
    fn a_driver_panic_poisons_the_engine_at_once() {
        a_thread_panic_poisons_the_engine_at_once(false);
    }

    #[test]
    fn a_hand_out_panic_poisons_the_engine_at_once() {
        a_thread_panic_poisons_the_engine_at_once(true);
    }

    /// `first_repeated_key` stops where a scan with a set of the keys seen
    /// would, whatever the tags (here few, so that unequal keys share them).
    #[test]
    fn first_repeated_key_matches_a_set_scan() {
        proptest::proptest!(|(keys in proptest::collection::vec(0u8..12, 0..40), tag_mod in 1u32..5)| {
            let owned: Vec<Vec<u8>> = keys.iter().map(|k| vec![*k]).collect();
            let new: Vec<NewTask<'_>> = owned
                .iter()
                .map(|k| NewTask { key: k, due: Due::After(Duration::ZERO), payload: &[] })
                .collect();
            // Equal keys, equal tags: a tag is a function of the key.
            let tags: Vec<u32> = keys.iter().map(|k| u32::from(*k) % tag_mod).collect();
            let mut seen = HashSet::new();
            let expected = keys.iter().position(|k| !seen.insert(*k));
            proptest::prop_assert_eq!(first_repeated_key(&new, &tags), expected);
        });
    }

    /// A delay's due time by the `u64` fast path is the `i128` path's, at
    /// and around its bounds, for accepted and refused ones alike.
    #[test]
    fn due_ms_fast_path_matches_the_general_one() {
        let limit = 1u64 << 62;
        let walls = [
            0i128,
            1,
            999_999,
            1_000_000,
            1_700_000_000_123_456_789,
            i128::from(limit) - 1,
            i128::from(limit),
            i128::from(u64::MAX),
            -1,
            -1_000_001,
        ];
        let delays = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999_999),
            Duration::from_millis(1),
            Duration::new(86_400, 1),
            Duration::from_secs(18 * 86_400),
            Duration::new(18 * 86_400, 1),
            Duration::from_secs(limit / 1_000_000_000 - 1),
            Duration::from_secs(limit / 1_000_000_000),
            Duration::MAX,
        ];
        let maxes = [
            Duration::ZERO,
            Duration::from_secs(18 * 86_400),
            Duration::MAX,
        ];
        for wall in walls {
            for d in delays {
                for max in maxes {
                    let fast = format!("{:?}", due_ms_checked(Due::After(d), wall, max));
                    let general = format!("{:?}", due_ms_general(Due::After(d), wall, max));
                    assert_eq!(fast, general, "wall {wall} ns, delay {d:?}, max {max:?}");
                }
            }
        }
    }

    /// The 64-bit fast path and the 128-bit fallback agree with plain
    /// division at every boundary between them, rounding both ways.
    #[test]
    fn div_ceil_u128_matches_plain_division_at_the_boundaries() {
        let big = u128::from(u64::MAX);
        let cases = [
            (0u128, 1u128),
            (1, 1),
            (999_999, 1_000_000),
            (1_000_000, 1_000_000),
            (1_000_001, 1_000_000),
            (big, 1_000_000),
            (big + 1, 1_000_000),
            (big - 1, 7),
            (big, big),
            (big + 1, big),
            (big * 3 + 5, big + 1),
            (u128::MAX, 1_000_000),
            (u128::MAX, 1),
            (5, big + 1),
        ];
        for (n, d) in cases {
            let up = n / d + u128::from(n % d != 0);
            assert_eq!(div_ceil_u128(n, d), up, "ceil {n} / {d}");
        }
    }
}
