//! Fuzz target `engine_model`: the engine on simulated storage against a reference model.
//!
//! The input is a setup and a sequence of operations ([`EngineModelInput`]). They run on an
//! at-least-once engine under [`Durability::Sync`] with the smallest segments the log allows,
//! a 1 ms tick, a [`SimStorage`] seeded from the input and a [`ManualClock`], and on a small
//! reference model (maps of live tasks, tasks cancelled while held, dead letters). After every
//! operation the body checks, exactly (every other step's schedule, schedule_many,
//! reschedule, cancel, cancel_many, ack, ack_many, ack_and_schedule and nack through their
//! async forms, run to completion on the spot: they must answer as the blocking calls do):
//!
//! * the operation's answer: ids (dense, never reused across crashes), `AlreadyExists`,
//!   `DuplicateKeyInBatch`, `TooManyPending`, `DueTooFar`, `InFlight`, every [`CancelOutcome`]
//!   (`Cancelled { deliveries }`, `AlreadyDelivered { attempt }`, `NotFound`), acks and their
//!   refusals (`LeaseExpired` / `NotOutstanding`, with the task id), `ack_and_schedule`
//!   (`Scheduled` with the new task's id, `CancelledWhileHeld`, an ack's refusals, the new
//!   task's `DueTooFar`), every [`NackOutcome`]
//!   (the retry's attempt number and due time, dead letter, finished), lease extensions,
//!   dead-letter requeue and purge; `Engine::sync` (`Ok`, nothing changes);
//! * paused deliveries ([`Engine::pause_deliveries`], [`Engine::resume_deliveries`]): while
//!   paused nothing is handed out and no lease expiry is processed, a lease that ran out is
//!   refused to its holder by the clock (`LeaseExpired`, or `NotOutstanding` when nothing
//!   follows) while its task still counts as in flight (`reschedule` is `InFlight`, `cancel`
//!   `AlreadyDelivered`); the resume hands out what fell due in due order — a task placed
//!   while paused with a due time before the pause began first, in placement order — after
//!   processing the leases that ran out; a reopen is never paused;
//! * the deliveries it caused, in order: task id, key, payload, due time, attempt and hand-out
//!   time — tasks fall due in deadline order, FIFO among equal deadlines; expired leases are
//!   retried with the policy's backoff or dead-lettered;
//! * a checkpoint: it succeeds and changes nothing the model sees; it writes nothing exactly when
//!   nothing was logged since the newest checkpoint, else it holds the model's live tasks and
//!   dead letters; its LSN never goes back (every later reopen then starts from it and replays
//!   only the log after it, and must still match the model);
//! * after a clean reopen, a process crash or a power cut: [`crate::Recovery`] (pending,
//!   overdue, redelivered, dead-lettered at open, dead letters; a clean shutdown reported as
//!   clean, no torn tail but after a power cut), then the deliveries at open (tasks in flight
//!   with `attempt + 1`, overdue tasks, oldest first);
//! * [`crate::Stats`] (scheduled, ready, in flight, pending, catch-up backlog, dead letters,
//!   payload bytes in memory) and every dead letter (key, payload, attempts, due time, time of
//!   death, error text);
//! * the running totals of [`crate::Stats`] (`tasks_scheduled`, `tasks_rescheduled`,
//!   `tasks_cancelled`, `deliveries`, `acks`, `nacks`, `lease_expiries`, `retries`,
//!   `tasks_dead_lettered`), exactly, against the model's own counts since the last open
//!   (reset at every reopen, process crash and power cut), and the two relations `Stats`
//!   documents between them.
//!
//! At the end every held delivery is acked, the clock moves past every task still waiting
//! (which must then all come out, in order), and the engine shuts down cleanly.
//!
//! Under `Sync` every returned call is durable, so the model treats a power cut like a process
//! crash: a lost acknowledged operation, a resurrected cancelled task, or a delivery the model
//! does not expect is a mismatch. The model is simpler than `tests/model.rs` in one respect:
//! the tick is always 1 ms (so an open is always on a tick boundary).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kairos_wal::{Durability, SimStorage};

use super::block_on;
use crate::clock::ms_to_system_time;
use crate::config::{DELAY_MAX_DEFAULT, LEASE_MAX, PENDING_TASKS_MAX_DEFAULT};
use crate::{
    AckError, AckScheduleError, AckScheduleOutcome, CancelOutcome, Config, DeadLetter, Delivery,
    Due, Engine, ManualClock, NackOutcome, NewTask, Recovery, RecvError, RescheduleOutcome,
    RetryPolicy, ScheduleError, TaskId,
};

/// Keys are `key-0` … `key-7`: few, so that collisions, reuse after a task finishes and
/// cancels of held tasks happen often.
pub const KEYS: u8 = 8;

/// Most operations decoded from one input (the rest of the input is ignored).
pub const OPS_MAX: usize = 200;

/// Wall time the manual clock starts at (UTC ms), a whole second.
pub const START_MS: u64 = 1_700_000_000_000;

/// The engine's data directory on the simulated disk.
const DATA_DIR: &str = "/fuzz/engine";

const DELAY_MAX_MS: u64 = DELAY_MAX_DEFAULT.as_millis() as u64;
const LEASE_MAX_MS: u64 = LEASE_MAX.as_millis() as u64;

/// About 463 days: past the wheel's coarse levels.
const LONG_MS: u64 = 40_000_000_000;

/// The leases a [`Setup`] chooses from, ms.
pub const LEASES_MS: [u64; 3] = [30, 5_000, LEASE_MAX_MS];

/// The `pending_tasks_max` a [`Setup`] chooses from.
pub const PENDING_MAX: [usize; 3] = [PENDING_TASKS_MAX_DEFAULT, 3, 6];

/// Far delays ([`When`] bytes 208..=255), ms: the last allowed delay and one past it too.
const FAR_MS: [u64; 8] = [
    3_600_000,
    7_200_001,
    86_400_000,
    2_592_000_000,
    LONG_MS,
    DELAY_MAX_MS,
    DELAY_MAX_MS + 1,
    LEASE_MAX_MS,
];

/// Large clock moves ([`Advance`] kind 3), ms.
const BIG_ADVANCE_MS: [u64; 4] = [3_600_000, LEASE_MAX_MS, 259_200_000, LONG_MS];

/// Wall-clock steps, ms.
const WALL_STEPS_MS: [i64; 8] = [-3_600_000, -1_000, -5, -1, 1, 5, 1_000, 3_600_000];

/// A nack's `retry_after`, ms (`None`: the policy's backoff); the last one is too far.
const NACK_DELAYS_MS: [Option<u64>; 8] = [
    None,
    None,
    None,
    Some(0),
    Some(1),
    Some(30),
    Some(5_000),
    Some(DELAY_MAX_MS + 1),
];

/// Leases asked of `extend_lease`, ms: the first and the last are invalid.
const EXTEND_LEASES_MS: [u64; 8] = [0, 1, 10, 30, 5_000, 60_000, LEASE_MAX_MS, LEASE_MAX_MS + 1];

/// The error text of every nack.
const NACK_ERROR: &str = "engine_model nack";

/// The error text the engine records for a delivery in flight at a restart (README: "Leases
/// do not survive a restart").
const LOST_LEASE_ERROR: &str = "in flight when the engine stopped (lease lost in a restart)";

// ---------------------------------------------------------------------------------------------
// The input

/// The engine configuration an input runs with (its first two bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// `RetryPolicy::max_attempts`, 1..=3.
    pub max_attempts: u32,
    /// `Config::lease`, ms, one of [`LEASES_MS`].
    pub lease_ms: u64,
    /// `Config::pending_tasks_max`, one of [`PENDING_MAX`].
    pub pending_max: usize,
    /// Seed of the simulated disk (power-cut outcomes, store id).
    pub seed: u8,
}

impl Setup {
    fn decode(config: u8, seed: u8) -> Setup {
        Setup {
            max_attempts: 1 + u32::from(config % 3),
            lease_ms: LEASES_MS[usize::from(config / 3 % 3)],
            pending_max: PENDING_MAX[usize::from(config / 9 % 3)],
            seed,
        }
    }

    /// The engine configuration.
    pub fn config(&self) -> Config {
        Config {
            segment_bytes: kairos_wal::SEGMENT_BYTES_MIN,
            durability: Durability::Sync,
            tick: Duration::from_millis(1),
            lease: Duration::from_millis(self.lease_ms),
            pending_tasks_max: self.pending_max,
            catch_up_tasks_per_sec: None,
            // Checkpoints are operations of the model, never background work.
            checkpoint_log_bytes: None,
            checkpoint_interval: None,
            payload_prefetch: false,
            // No far tasks: this model fixes every task's fire time when it
            // is scheduled, while a far task is mapped again by the wall
            // clock when promoted. Far tasks are checked by the model test
            // (`tests/model.rs`), the simulation and `tests/far.rs`.
            horizon: None,
            retry: RetryPolicy {
                max_attempts: self.max_attempts,
                backoff_initial: Duration::from_millis(5),
                backoff_max: Duration::from_secs(2),
                ..RetryPolicy::default()
            },
            ..Config::default()
        }
    }
}

/// When a scheduled task is due (one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// `Due::After(ms)`: 0..=79 ms, whole seconds up to 64 s, or one of the far delays (up to
    /// `delay_max`, and one millisecond past it).
    After(u64),
    /// `Due::At(now - ms)`: now or in the past (fires at once).
    Ago(u64),
}

impl When {
    fn decode(b: u8) -> When {
        match b {
            0..=79 => When::After(u64::from(b)),
            80..=143 => When::After(1_000 * u64::from(b - 79)),
            144..=207 => When::Ago(97 * u64::from(b - 144)),
            _ => When::After(FAR_MS[usize::from(b - 208) % FAR_MS.len()]),
        }
    }

    /// The engine's argument and the due time in UTC ms, with the wall clock at `wall_ms`.
    fn resolve(self, wall_ms: u64) -> (Due, u64) {
        match self {
            When::After(ms) => (Due::After(Duration::from_millis(ms)), wall_ms + ms),
            When::Ago(ms) => {
                let due_ms = wall_ms.saturating_sub(ms);
                (Due::At(ms_to_system_time(due_ms)), due_ms)
            }
        }
    }
}

/// How far an [`Op::Advance`] moves the clock (two bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// By this many milliseconds.
    By(u64),
    /// To the next deadline the model knows of (a task's due time or a lease's end), plus
    /// `-1`, `0` or `1` ms (at least 1 ms); by 1 ms if there is none.
    ToNext(i8),
}

impl Advance {
    fn decode(kind: u8, arg: u8) -> Advance {
        match kind % 4 {
            0 => Advance::By(1 + u64::from(arg % 64)),
            1 => Advance::By(1_000 * (1 + u64::from(arg % 100))),
            2 => Advance::ToNext((arg % 3) as i8 - 1),
            _ => Advance::By(BIG_ADVANCE_MS[usize::from(arg % 4)]),
        }
    }
}

/// How an [`Op::AckMany`] is spoiled, if it is: the whole call must then fail and ack nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spoil {
    /// Not spoiled: acks held deliveries.
    No,
    /// The first delivery listed twice.
    Duplicate,
    /// A delivery that is no longer held, in the middle (not spoiled if there is none).
    Stale,
}

impl Spoil {
    fn decode(b: u8) -> Spoil {
        match b % 4 {
            0 | 1 => Spoil::No,
            2 => Spoil::Duplicate,
            _ => Spoil::Stale,
        }
    }
}

/// The kinds of [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum OpKind {
    Schedule,
    ScheduleMany,
    Reschedule,
    Cancel,
    CancelMany,
    Advance,
    StepWall,
    Ack,
    AckMany,
    Nack,
    ExtendLease,
    Reopen,
    ProcessCrash,
    PowerCut,
    RequeueDead,
    PurgeDead,
    Checkpoint,
    Pause,
    Resume,
    Sync,
    AckAndSchedule,
}

/// Opcode byte `% 32` → operation (the common ones appear several times). `Checkpoint` took
/// the last slot, a sixth `Advance`; `Pause` took a fifth `Schedule`, `Sync` a third `Cancel`,
/// and `Resume` a fifth `Advance` and a third `Ack` (so that an input is paused about a third
/// of the time, not half); `AckAndSchedule` took slot 20, the second `Ack` (so that acking
/// operations keep their share): [`EngineModelInput::encode`] writes the first opcode of a
/// kind, so no seed written before them decodes differently (and none of the committed
/// `regression-*` inputs, written by the fuzzer, uses slot 20).
const OPCODES: [OpKind; 32] = {
    use OpKind::*;
    [
        Schedule,
        Schedule,
        Schedule,
        Schedule,
        Pause,
        ScheduleMany,
        ScheduleMany,
        Reschedule,
        Reschedule,
        Cancel,
        Cancel,
        Sync,
        CancelMany,
        Advance,
        Advance,
        Advance,
        Advance,
        Resume,
        StepWall,
        Ack,
        AckAndSchedule,
        Resume,
        AckMany,
        Nack,
        Nack,
        ExtendLease,
        Reopen,
        ProcessCrash,
        PowerCut,
        RequeueDead,
        PurgeDead,
        Checkpoint,
    ]
};

/// One operation. `pick` bytes choose among the deliveries made so far (held ones if `fresh`,
/// else any, stale ones included) or among the dead letters (`pick % 8 == 7`: an id that is
/// none), modulo their number; an operation with nothing to pick from does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op {
    /// `schedule(key-K, when, payload of payload_len filler bytes)`.
    Schedule {
        key: u8,
        when: When,
        payload_len: u8,
    },
    /// `schedule_many` of 1..=4 keys (maybe repeated: `DuplicateKeyInBatch`), all due `when`.
    ScheduleMany { keys: Vec<u8>, when: When },
    /// `reschedule(key-K, when, new payload or none)`.
    Reschedule {
        key: u8,
        when: When,
        new_payload: bool,
    },
    /// `cancel(key-K)`.
    Cancel { key: u8 },
    /// `cancel_many` of 1..=4 keys (maybe repeated).
    CancelMany { keys: Vec<u8> },
    /// Moves wall and monotonic clock together.
    Advance(Advance),
    /// Steps the wall clock alone by one of a few amounts (±1 h, ±1 s, ±5 ms, ±1 ms).
    StepWall { ms: i64 },
    /// `ack` of a held delivery (`fresh`) or of any delivery made so far.
    Ack { pick: u8, fresh: bool },
    /// `ack_and_schedule` of a held delivery (`fresh`) or of any delivery made so far: the
    /// next task under its key due `when`, with a new payload or the delivery's own.
    AckAndSchedule {
        pick: u8,
        when: When,
        new_payload: bool,
        fresh: bool,
    },
    /// `ack_many` of 1..=4 held deliveries, maybe spoiled.
    AckMany { picks: Vec<u8>, spoil: Spoil },
    /// `nack` with `retry_after` (`None`: backoff; one too far).
    Nack {
        pick: u8,
        retry_after_ms: Option<u64>,
        fresh: bool,
    },
    /// `extend_lease` (0 and past `LEASE_MAX` are invalid).
    ExtendLease {
        pick: u8,
        lease_ms: u64,
        fresh: bool,
    },
    /// `shutdown`, then open again.
    Reopen,
    /// Dropped without shutdown, `SimStorage::crash_process`, open again.
    ProcessCrash,
    /// Dropped without shutdown, `SimStorage::power_cut`, open again.
    PowerCut,
    /// `requeue_dead_letter(id, when)`.
    RequeueDead { pick: u8, when: When },
    /// `purge_dead_letter(id)`.
    PurgeDead { pick: u8 },
    /// `checkpoint()` (no argument bytes).
    Checkpoint,
    /// `pause_deliveries()` (no argument bytes).
    Pause,
    /// `resume_deliveries()` (no argument bytes).
    Resume,
    /// `Engine::sync()` (no argument bytes).
    Sync,
}

impl Op {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Schedule { .. } => OpKind::Schedule,
            Op::ScheduleMany { .. } => OpKind::ScheduleMany,
            Op::Reschedule { .. } => OpKind::Reschedule,
            Op::Cancel { .. } => OpKind::Cancel,
            Op::CancelMany { .. } => OpKind::CancelMany,
            Op::Advance(_) => OpKind::Advance,
            Op::StepWall { .. } => OpKind::StepWall,
            Op::Ack { .. } => OpKind::Ack,
            Op::AckMany { .. } => OpKind::AckMany,
            Op::Nack { .. } => OpKind::Nack,
            Op::ExtendLease { .. } => OpKind::ExtendLease,
            Op::Reopen => OpKind::Reopen,
            Op::ProcessCrash => OpKind::ProcessCrash,
            Op::PowerCut => OpKind::PowerCut,
            Op::RequeueDead { .. } => OpKind::RequeueDead,
            Op::PurgeDead { .. } => OpKind::PurgeDead,
            Op::Checkpoint => OpKind::Checkpoint,
            Op::Pause => OpKind::Pause,
            Op::Resume => OpKind::Resume,
            Op::Sync => OpKind::Sync,
            Op::AckAndSchedule { .. } => OpKind::AckAndSchedule,
        }
    }
}

/// Reads bytes; past the end, zeros.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    /// A count byte (1..=4) and four key bytes.
    fn keys(&mut self) -> Vec<u8> {
        let n = 1 + usize::from(self.byte() % 4);
        let raw = [self.byte(), self.byte(), self.byte(), self.byte()];
        raw[..n].iter().map(|b| b % KEYS).collect()
    }

    /// A count byte (1..=4) and four pick bytes.
    fn picks(&mut self) -> Vec<u8> {
        let n = 1 + usize::from(self.byte() % 4);
        let raw = [self.byte(), self.byte(), self.byte(), self.byte()];
        raw[..n].to_vec()
    }

    /// A flags byte: "fresh" (a held delivery) unless `% 4 == 0`.
    fn fresh(&mut self) -> bool {
        !self.byte().is_multiple_of(4)
    }
}

/// The decoded input of [`engine_model`].
///
/// Layout: a setup byte (`% 3`: `max_attempts - 1`; `/ 3 % 3`: the lease from [`LEASES_MS`];
/// `/ 9 % 3`: `pending_tasks_max` from [`PENDING_MAX`]); the storage seed; then operations,
/// each an opcode byte (`% 32`, see [`OpKind`]) followed by a fixed number of argument bytes
/// for its kind (missing bytes read as zeros), at most [`OPS_MAX`] of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineModelInput {
    /// The configuration.
    pub setup: Setup,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

impl EngineModelInput {
    /// Decodes any bytes (never fails).
    pub fn decode(data: &[u8]) -> EngineModelInput {
        let mut r = Reader { data, at: 0 };
        let setup = Setup::decode(r.byte(), r.byte());
        let mut ops = Vec::new();
        while !r.done() && ops.len() < OPS_MAX {
            let op = match OPCODES[usize::from(r.byte() % 32)] {
                OpKind::Schedule => Op::Schedule {
                    key: r.byte() % KEYS,
                    when: When::decode(r.byte()),
                    payload_len: r.byte() % 49,
                },
                OpKind::ScheduleMany => Op::ScheduleMany {
                    keys: r.keys(),
                    when: When::decode(r.byte()),
                },
                OpKind::Reschedule => Op::Reschedule {
                    key: r.byte() % KEYS,
                    when: When::decode(r.byte()),
                    new_payload: r.byte() % 2 == 1,
                },
                OpKind::Cancel => Op::Cancel {
                    key: r.byte() % KEYS,
                },
                OpKind::CancelMany => Op::CancelMany { keys: r.keys() },
                OpKind::Advance => Op::Advance(Advance::decode(r.byte(), r.byte())),
                OpKind::StepWall => Op::StepWall {
                    ms: WALL_STEPS_MS[usize::from(r.byte() % 8)],
                },
                OpKind::Ack => Op::Ack {
                    pick: r.byte(),
                    fresh: r.fresh(),
                },
                OpKind::AckMany => Op::AckMany {
                    picks: r.picks(),
                    spoil: Spoil::decode(r.byte()),
                },
                OpKind::Nack => Op::Nack {
                    pick: r.byte(),
                    retry_after_ms: NACK_DELAYS_MS[usize::from(r.byte() % 8)],
                    fresh: r.fresh(),
                },
                OpKind::ExtendLease => Op::ExtendLease {
                    pick: r.byte(),
                    lease_ms: EXTEND_LEASES_MS[usize::from(r.byte() % 8)],
                    fresh: r.fresh(),
                },
                OpKind::Reopen => Op::Reopen,
                OpKind::ProcessCrash => Op::ProcessCrash,
                OpKind::PowerCut => Op::PowerCut,
                OpKind::RequeueDead => Op::RequeueDead {
                    pick: r.byte(),
                    when: When::decode(r.byte()),
                },
                OpKind::PurgeDead => Op::PurgeDead { pick: r.byte() },
                OpKind::Checkpoint => Op::Checkpoint,
                OpKind::Pause => Op::Pause,
                OpKind::Resume => Op::Resume,
                OpKind::Sync => Op::Sync,
                OpKind::AckAndSchedule => Op::AckAndSchedule {
                    pick: r.byte(),
                    when: When::decode(r.byte()),
                    new_payload: r.byte() % 2 == 1,
                    fresh: r.fresh(),
                },
            };
            ops.push(op);
        }
        EngineModelInput { setup, ops }
    }

    /// The bytes that decode to this input (for writing seed corpora).
    ///
    /// # Panics
    /// If a field holds a value no byte decodes to (a key ≥ [`KEYS`], a delay not in the
    /// tables, more than four keys, …) or there are more than [`OPS_MAX`] operations.
    pub fn encode(&self) -> Vec<u8> {
        let s = &self.setup;
        let config = inverse(&(s.max_attempts, s.lease_ms, s.pending_max), |b| {
            let d = Setup::decode(b, 0);
            (d.max_attempts, d.lease_ms, d.pending_max)
        });
        let mut out = vec![config, s.seed];
        assert!(self.ops.len() <= OPS_MAX, "too many operations");
        for op in &self.ops {
            let kind = op.kind();
            let opcode = (0u8..32)
                .find(|&b| OPCODES[usize::from(b)] == kind)
                .unwrap_or_else(|| panic!("no opcode for {kind:?}"));
            out.push(opcode);
            let key = |k: u8| {
                assert!(k < KEYS, "key {k} out of range");
                k
            };
            let list = |items: &[u8], out: &mut Vec<u8>| {
                assert!((1..=4).contains(&items.len()), "{items:?}: 1..=4 items");
                out.push(items.len() as u8 - 1);
                out.extend((0..4).map(|i| items.get(i).copied().unwrap_or(0)));
            };
            let fresh = |f: bool| u8::from(f);
            match op {
                Op::Schedule {
                    key: k,
                    when,
                    payload_len,
                } => {
                    assert!(*payload_len < 49, "payload_len {payload_len}");
                    out.extend([key(*k), inverse(when, When::decode), *payload_len]);
                }
                Op::ScheduleMany { keys, when } => {
                    keys.iter().for_each(|k| {
                        key(*k);
                    });
                    list(keys, &mut out);
                    out.push(inverse(when, When::decode));
                }
                Op::Reschedule {
                    key: k,
                    when,
                    new_payload,
                } => out.extend([key(*k), inverse(when, When::decode), u8::from(*new_payload)]),
                Op::Cancel { key: k } => out.push(key(*k)),
                Op::CancelMany { keys } => {
                    keys.iter().for_each(|k| {
                        key(*k);
                    });
                    list(keys, &mut out);
                }
                Op::Advance(advance) => {
                    let pair = (0u8..4)
                        .flat_map(|k| (0..=u8::MAX).map(move |a| (k, a)))
                        .find(|&(k, a)| Advance::decode(k, a) == *advance)
                        .unwrap_or_else(|| panic!("{advance:?} has no encoding"));
                    out.extend([pair.0, pair.1]);
                }
                Op::StepWall { ms } => out.push(inverse(ms, |b| WALL_STEPS_MS[usize::from(b % 8)])),
                Op::Ack { pick, fresh: f } => out.extend([*pick, fresh(*f)]),
                Op::AckAndSchedule {
                    pick,
                    when,
                    new_payload,
                    fresh: f,
                } => out.extend([
                    *pick,
                    inverse(when, When::decode),
                    u8::from(*new_payload),
                    fresh(*f),
                ]),
                Op::AckMany { picks, spoil } => {
                    list(picks, &mut out);
                    out.push(inverse(spoil, Spoil::decode));
                }
                Op::Nack {
                    pick,
                    retry_after_ms,
                    fresh: f,
                } => out.extend([
                    *pick,
                    inverse(retry_after_ms, |b| NACK_DELAYS_MS[usize::from(b % 8)]),
                    fresh(*f),
                ]),
                Op::ExtendLease {
                    pick,
                    lease_ms,
                    fresh: f,
                } => out.extend([
                    *pick,
                    inverse(lease_ms, |b| EXTEND_LEASES_MS[usize::from(b % 8)]),
                    fresh(*f),
                ]),
                Op::Reopen
                | Op::ProcessCrash
                | Op::PowerCut
                | Op::Checkpoint
                | Op::Pause
                | Op::Resume
                | Op::Sync => {}
                Op::RequeueDead { pick, when } => out.extend([*pick, inverse(when, When::decode)]),
                Op::PurgeDead { pick } => out.push(*pick),
            }
        }
        out
    }
}

/// The first byte that decodes to `want`.
fn inverse<T: PartialEq + fmt::Debug>(want: &T, decode: impl Fn(u8) -> T) -> u8 {
    (0..=u8::MAX)
        .find(|&b| decode(b) == *want)
        .unwrap_or_else(|| panic!("{want:?} has no encoding"))
}

// ---------------------------------------------------------------------------------------------
// The model

/// A lease the model knows a consumer holds.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// Monotonic time (ms) at which it ends.
    fire_mono_ms: u64,
    /// Order of entering the wheel (FIFO among equal deadlines).
    rank: u64,
}

#[derive(Debug, Clone)]
struct ModelTask {
    id: u64,
    due_ms: u64,
    payload: Vec<u8>,
    /// Deliveries so far.
    deliveries: u32,
    /// Monotonic time (ms) at which it falls due (meaningless while held).
    fire_mono_ms: u64,
    /// Order of entering the wheel.
    rank: u64,
    /// Held by a consumer (attempt `deliveries`) until then.
    lease: Option<Lease>,
}

/// A task cancelled while a consumer held it: the holder may still ack or nack it.
#[derive(Debug, Clone)]
struct Abandoned {
    attempt: u32,
    lease: Lease,
    payload_len: usize,
}

/// A dead letter as the model expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dead {
    key: Vec<u8>,
    payload: Vec<u8>,
    attempts: u32,
    due_ms: u64,
    dead_ms: u64,
    error: String,
}

/// A delivery as the model expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    id: u64,
    key: String,
    payload: Vec<u8>,
    due_ms: u64,
    attempt: u32,
    fired_ms: u64,
}

impl Expected {
    fn of(d: &Delivery) -> Expected {
        Expected {
            id: d.task_id().0,
            key: String::from_utf8_lossy(d.key()).into_owned(),
            payload: d.payload().to_vec(),
            due_ms: d.due_ms(),
            attempt: d.attempt(),
            fired_ms: d.fired_ms(),
        }
    }
}

/// What acting on a delivery must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Held, task live.
    Live,
    /// Held, task cancelled meanwhile.
    Abandoned,
    /// Refused: `LeaseExpired`.
    Expired,
    /// Refused: `NotOutstanding`.
    NotOutstanding,
}

/// The running totals of [`crate::Stats`] as the model counts them since the engine was last
/// opened: each is raised where the model applies the change it counts (see [`Stats`]'s
/// fields for what they count), and all start at 0 again at every open.
///
/// [`Stats`]: crate::Stats
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    /// [`Model::add`]: a schedule, a batch's task, a reschedule of a free key, a requeue, the
    /// new task of an `ack_and_schedule`.
    tasks_scheduled: u64,
    /// A reschedule answered `Rescheduled`.
    tasks_rescheduled: u64,
    /// A cancel answered `Cancelled` ([`cancel_in_model`]). Never of a far task: this
    /// target has none (`horizon: None`), so the engine's count in `drop_far` is checked by
    /// `tests/stats_totals.rs` only.
    tasks_cancelled: u64,
    /// [`Model::hand_out`]: every hand-out is received at once (`drain`).
    deliveries: u64,
    /// [`Model::finish`]: an accepted ack (of `ack`, `ack_many`, `ack_and_schedule`), of a
    /// task cancelled while held too.
    acks: u64,
    /// An accepted nack, of a task cancelled while held too.
    nacks: u64,
    /// [`Model::pass`]: leases the driver ends, of tasks cancelled while held too.
    lease_expiries: u64,
    /// [`Model::fail`] answering `Retry`.
    retries: u64,
    /// [`Model::fail`] answering `DeadLettered` (not the open's dead letters).
    tasks_dead_lettered: u64,
    /// Nacks and lease expiries of tasks cancelled while held: the failed attempts neither
    /// retried nor dead-lettered (not a total of `Stats`; its second relation needs it).
    finished_abandoned: u64,
}

/// The reference engine: live tasks by key, abandoned tasks and dead letters by id, and the
/// clock as the engine sees it.
#[derive(Debug)]
struct Model {
    tasks: BTreeMap<Vec<u8>, ModelTask>,
    abandoned: BTreeMap<u64, Abandoned>,
    dead: BTreeMap<u64, Dead>,
    next_id: u64,
    next_rank: u64,
    /// Numbers the payloads made so far.
    next_payload: u64,
    wall_ms: u64,
    mono_ms: u64,
    lease_ms: u64,
    pending_max: usize,
    retry: RetryPolicy,
    /// Deliveries are paused: the driver hands nothing out and processes no lease expiry.
    paused: bool,
    /// Monotonic time (ms) the wheel stands still at while paused: the clock at the pause.
    paused_at_mono_ms: u64,
    /// The running totals since the engine was last opened.
    totals: Totals,
}

impl Model {
    fn new(setup: &Setup) -> Model {
        Model {
            tasks: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            dead: BTreeMap::new(),
            next_id: 1,
            next_rank: 0,
            next_payload: 0,
            wall_ms: START_MS,
            mono_ms: 0,
            lease_ms: setup.lease_ms,
            pending_max: setup.pending_max,
            retry: setup.config().retry,
            paused: false,
            paused_at_mono_ms: 0,
            totals: Totals::default(),
        }
    }

    fn rank(&mut self) -> u64 {
        self.next_rank += 1;
        self.next_rank
    }

    fn payload(&mut self, len: usize) -> Vec<u8> {
        let seq = self.next_payload;
        self.next_payload += 1;
        let mut p = format!("payload-{seq}:").into_bytes();
        p.extend((0..len).map(|i| (seq as usize + i) as u8));
        p
    }

    /// Live tasks as the engine counts them against `pending_tasks_max`.
    fn live(&self) -> usize {
        self.tasks.len() + self.abandoned.len()
    }

    /// When a task due at `due_ms` falls due if placed now (1 ms ticks): the clock now if it
    /// is due already (it is handed out at once). While paused the wheel stands still at
    /// the pause, so a task due already goes at its own time (mapped by the current wall and
    /// monotonic readings) in due order among those falling due during the pause — unless
    /// that is at or before the pause: then at the pause itself, ahead of them all, in
    /// placement order (the engine's overdue queue).
    fn fire_time(&self, due_ms: u64) -> u64 {
        if due_ms > self.wall_ms {
            return self.mono_ms + (due_ms - self.wall_ms);
        }
        if !self.paused {
            return self.mono_ms;
        }
        let mapped = self.mono_ms.saturating_sub(self.wall_ms - due_ms);
        mapped.max(self.paused_at_mono_ms)
    }

    fn lease_now(&mut self, lease_ms: u64) -> Lease {
        Lease {
            fire_mono_ms: self.mono_ms + lease_ms.max(1),
            rank: self.rank(),
        }
    }

    /// Adds a new task (one the engine creates and counts in `tasks_scheduled`: never a
    /// recovered one); returns its id.
    fn add(&mut self, key: Vec<u8>, due_ms: u64, payload: Vec<u8>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.totals.tasks_scheduled += 1;
        let rank = self.rank();
        let fire_mono_ms = self.fire_time(due_ms);
        self.tasks.insert(
            key,
            ModelTask {
                id,
                due_ms,
                payload,
                deliveries: 0,
                fire_mono_ms,
                rank,
                lease: None,
            },
        );
        id
    }

    /// Puts a waiting task (back) in the wheel at `due_ms`.
    fn place(&mut self, key: &[u8], due_ms: u64) {
        let rank = self.rank();
        let fire = self.fire_time(due_ms);
        if let Some(t) = self.tasks.get_mut(key) {
            t.due_ms = due_ms;
            t.fire_mono_ms = fire;
            t.rank = rank;
            t.lease = None;
        }
    }

    /// Hands out the waiting tasks `keys`, in this order: each gets one more delivery and a
    /// lease (taken by the consumer in the same order).
    fn hand_out(&mut self, keys: Vec<Vec<u8>>) -> Vec<Expected> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let lease = self.lease_now(self.lease_ms);
            let fired_ms = self.wall_ms;
            if let Some(t) = self.tasks.get_mut(&k) {
                t.deliveries += 1;
                t.lease = Some(lease);
                self.totals.deliveries += 1;
                out.push(Expected {
                    id: t.id,
                    key: String::from_utf8_lossy(&k).into_owned(),
                    payload: t.payload.clone(),
                    due_ms: t.due_ms,
                    attempt: t.deliveries,
                    fired_ms,
                });
            }
        }
        out
    }

    /// A failed attempt of the held task `key` (nack or lease expiry).
    fn fail(&mut self, key: &[u8], retry_after_ms: Option<u64>, error: &str) -> NackOutcome {
        let Some(t) = self.tasks.get(key).cloned() else {
            return NackOutcome::Finished;
        };
        if t.deliveries >= self.retry.max_attempts {
            self.tasks.remove(key);
            self.dead.insert(
                t.id,
                Dead {
                    key: key.to_vec(),
                    payload: t.payload,
                    attempts: t.deliveries,
                    due_ms: t.due_ms,
                    dead_ms: self.wall_ms,
                    error: error.to_owned(),
                },
            );
            self.totals.tasks_dead_lettered += 1;
            return NackOutcome::DeadLettered;
        }
        let delay_ms = retry_after_ms.unwrap_or_else(|| {
            let d = self.retry.backoff(t.id, t.deliveries);
            u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        let due_ms = self.wall_ms + delay_ms;
        self.place(key, due_ms);
        self.totals.retries += 1;
        NackOutcome::Retry {
            next_attempt: t.deliveries + 1,
            due: ms_to_system_time(due_ms),
        }
    }

    /// What the driver does at the current time: leases that ended are failed attempts (in
    /// deadline order, FIFO among equal deadlines) and abandoned tasks whose lease ended are
    /// forgotten; then waiting tasks whose deadline has come are handed out in the same order.
    /// Returns the expiries (keys) and the deliveries. While paused: nothing.
    fn pass(&mut self) -> (usize, Vec<Expected>) {
        if self.paused {
            return (0, Vec::new());
        }
        let mono = self.mono_ms;
        let mut expired: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter_map(|(k, t)| {
                t.lease
                    .filter(|l| l.fire_mono_ms <= mono)
                    .map(|l| (l.fire_mono_ms, l.rank, k.clone()))
            })
            .collect();
        expired.sort();
        let expiries = expired.len();
        self.totals.lease_expiries += expiries as u64;
        let error = format!(
            "lease expired without ack or nack (Config::lease is {} ms)",
            self.lease_ms
        );
        for (_, _, k) in expired {
            self.fail(&k, None, &error);
        }
        // A lease of a task cancelled while held that runs out is an expiry too: it finishes
        // the task.
        let before = self.abandoned.len();
        self.abandoned.retain(|_, a| a.lease.fire_mono_ms > mono);
        let finished = (before - self.abandoned.len()) as u64;
        self.totals.lease_expiries += finished;
        self.totals.finished_abandoned += finished;
        let mut due: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.lease.is_none() && t.fire_mono_ms <= mono)
            .map(|(k, t)| (t.fire_mono_ms, t.rank, k.clone()))
            .collect();
        due.sort();
        (
            expiries,
            self.hand_out(due.into_iter().map(|(_, _, k)| k).collect()),
        )
    }

    /// The next deadline after now: a waiting task's or a lease's.
    fn next_deadline(&self) -> Option<u64> {
        let tasks = self.tasks.values().map(|t| match t.lease {
            Some(l) => l.fire_mono_ms,
            None => t.fire_mono_ms,
        });
        let abandoned = self.abandoned.values().map(|a| a.lease.fire_mono_ms);
        tasks.chain(abandoned).filter(|&f| f > self.mono_ms).min()
    }

    /// What acting on delivery `d` must answer (`current`: made by the running engine). A
    /// lease that ran out but whose expiry is not processed yet (paused) is refused by the
    /// clock, as its expiry will answer: `NotOutstanding` if nothing follows (cancelled, or
    /// the last attempt), else `LeaseExpired`.
    fn held(&self, d: &Delivery, current: bool) -> Held {
        if !current {
            return Held::NotOutstanding;
        }
        let id = d.task_id().0;
        let ran_out = |l: &Lease| l.fire_mono_ms <= self.mono_ms;
        if let Some(a) = self.abandoned.get(&id) {
            return match (a.attempt == d.attempt(), ran_out(&a.lease)) {
                (true, false) => Held::Abandoned,
                (true, true) => Held::NotOutstanding,
                (false, _) => Held::Expired,
            };
        }
        match self.tasks.get(d.key()) {
            Some(t) if t.id == id => match t.lease {
                Some(l) if t.deliveries == d.attempt() && ran_out(&l) => {
                    if t.deliveries >= self.retry.max_attempts {
                        Held::NotOutstanding
                    } else {
                        Held::Expired
                    }
                }
                Some(_) if t.deliveries == d.attempt() => Held::Live,
                _ if t.deliveries >= d.attempt() => Held::Expired,
                _ => Held::NotOutstanding,
            },
            _ => Held::NotOutstanding,
        }
    }

    /// An (accepted) ack of the held delivery `d`: its task is finished.
    fn finish(&mut self, d: &Delivery) {
        self.totals.acks += 1;
        if self.abandoned.remove(&d.task_id().0).is_none() {
            self.tasks.remove(d.key());
        }
    }

    /// The engine stopped: leases end, abandoned tasks are finished, tasks in flight are
    /// retried at open (their interrupted attempt counts) or dead-lettered when their attempts
    /// are used up. Returns the keys to redeliver at open and the number dead-lettered.
    fn settle_after_stop(&mut self) -> (Vec<Vec<u8>>, usize) {
        self.abandoned.clear();
        let in_flight: Vec<Vec<u8>> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.lease.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        let (mut redelivered, mut dead) = (Vec::new(), 0);
        for k in in_flight {
            let Some(t) = self.tasks.get_mut(&k) else {
                continue;
            };
            t.lease = None;
            if t.deliveries >= self.retry.max_attempts {
                if let Some(t) = self.tasks.remove(&k) {
                    self.dead.insert(
                        t.id,
                        Dead {
                            key: k,
                            payload: t.payload,
                            attempts: t.deliveries,
                            due_ms: t.due_ms,
                            dead_ms: self.wall_ms,
                            error: LOST_LEASE_ERROR.into(),
                        },
                    );
                    dead += 1;
                }
            } else {
                redelivered.push(k);
            }
        }
        (redelivered, dead)
    }

    /// The open: every waiting task not due yet is placed by the wall clock (oldest first),
    /// then the tasks in flight before and the overdue ones are handed out, oldest first (by
    /// due time, then id).
    fn reopen(&mut self, backlog: &[Vec<u8>]) -> Vec<Expected> {
        let mut waiting: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(k, _)| !backlog.contains(k))
            .map(|(k, t)| (t.due_ms, t.id, k.clone()))
            .collect();
        waiting.sort();
        for (due_ms, _, k) in waiting {
            self.place(&k, due_ms);
        }
        let mut now: Vec<(u64, u64, Vec<u8>)> = backlog
            .iter()
            .filter_map(|k| self.tasks.get(k).map(|t| (t.due_ms, t.id, k.clone())))
            .collect();
        now.sort();
        self.hand_out(now.into_iter().map(|(_, _, k)| k).collect())
    }

    fn scheduled(&self) -> usize {
        self.tasks.values().filter(|t| t.lease.is_none()).count()
    }

    fn in_flight(&self) -> usize {
        self.tasks.values().filter(|t| t.lease.is_some()).count() + self.abandoned.len()
    }

    fn payload_bytes(&self) -> usize {
        self.tasks.values().map(|t| t.payload.len()).sum::<usize>()
            + self
                .abandoned
                .values()
                .map(|a| a.payload_len)
                .sum::<usize>()
            + self.dead.values().map(|d| d.payload.len()).sum::<usize>()
    }

    /// The dead letter id a pick byte names: one of them, or (`% 8 == 7`, or none exist) an
    /// id that is no dead letter.
    fn dead_pick(&self, pick: u8) -> u64 {
        if self.dead.is_empty() || pick % 8 == 7 {
            return 1_000_000 + u64::from(pick);
        }
        self.dead
            .keys()
            .nth(usize::from(pick) % self.dead.len())
            .copied()
            .unwrap_or(0)
    }
}

fn key_bytes(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

// ---------------------------------------------------------------------------------------------
// Running an input

/// Where a mismatch happened: the step and its operation.
struct At<'a> {
    step: usize,
    op: Option<&'a Op>,
}

impl At<'_> {
    /// Reports a mismatch between the engine and the model (the finding).
    fn fail(&self, what: impl fmt::Display) -> ! {
        match self.op {
            Some(op) => panic!("engine_model: step {} {op:?}: {what}", self.step),
            None => panic!("engine_model: after the last step: {what}"),
        }
    }

    fn check_deliveries(&self, what: &str, got: &[Delivery], expected: &[Expected]) {
        let got: Vec<Expected> = got.iter().map(Expected::of).collect();
        if got != expected {
            self.fail(format_args!(
                "{what} differ:\n  engine {got:?}\n  model  {expected:?}"
            ));
        }
    }
}

/// Every delivery made so far (a few stale ones dropped) and the incarnation that made it.
#[derive(Default)]
struct Deliveries {
    all: Vec<(Delivery, u32)>,
    incarnation: u32,
}

impl Deliveries {
    fn add(&mut self, ds: Vec<Delivery>) {
        let inc = self.incarnation;
        self.all.extend(ds.into_iter().map(|d| (d, inc)));
    }

    fn status(&self, model: &Model, i: usize) -> Held {
        let (d, inc) = &self.all[i];
        model.held(d, *inc == self.incarnation)
    }

    /// The delivery an operation acts on: the `pick`-th of those held (`fresh`) or of all
    /// ever made; `None` if there is none.
    fn pick(&self, model: &Model, pick: u8, fresh: bool) -> Option<usize> {
        let candidates: Vec<usize> = if fresh {
            self.held(model)
        } else {
            (0..self.all.len()).collect()
        };
        (!candidates.is_empty()).then(|| candidates[usize::from(pick) % candidates.len()])
    }

    /// Indices of the deliveries the model says are held.
    fn held(&self, model: &Model) -> Vec<usize> {
        (0..self.all.len())
            .filter(|&i| matches!(self.status(model, i), Held::Live | Held::Abandoned))
            .collect()
    }

    /// Indices of the deliveries the model says are refused.
    fn refused(&self, model: &Model) -> Vec<usize> {
        (0..self.all.len())
            .filter(|&i| matches!(self.status(model, i), Held::Expired | Held::NotOutstanding))
            .collect()
    }

    /// Keeps memory bounded: forgets all but the newest finished deliveries.
    fn prune(&mut self, model: &Model) {
        const KEEP: usize = 64;
        if self.all.len() <= 2 * KEEP {
            return;
        }
        let len = self.all.len();
        let keep: Vec<bool> = (0..len)
            .map(|i| i + KEEP >= len || self.status(model, i) != Held::NotOutstanding)
            .collect();
        let mut flags = keep.into_iter();
        self.all.retain(|_| flags.next().unwrap_or(true));
    }
}

/// How often each outcome happened in one run (see [`engine_model_run`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Outcome name → count.
    pub counts: BTreeMap<&'static str, u64>,
}

impl Coverage {
    fn hit(&mut self, what: &'static str) {
        self.add(what, 1);
    }

    fn add(&mut self, what: &'static str, n: usize) {
        if n > 0 {
            *self.counts.entry(what).or_insert(0) += n as u64;
        }
    }

    /// How often `what` happened.
    pub fn get(&self, what: &str) -> u64 {
        self.counts.get(what).copied().unwrap_or(0)
    }

    /// Adds another run's counts.
    pub fn merge(&mut self, other: &Coverage) {
        for (k, v) in &other.counts {
            *self.counts.entry(k).or_insert(0) += v;
        }
    }
}

/// Every outcome the seed corpus must exercise at least once (checked by
/// `tests/fuzz_corpus.rs`): each operation with effect, and each of its answers.
pub const OUTCOMES: &[&str] = &[
    "schedule",
    "schedule:overdue",
    "schedule:already-exists",
    "schedule:too-far",
    "schedule:too-many-pending",
    "schedule-many",
    "schedule-many:duplicate",
    "schedule-many:already-exists",
    "reschedule:rescheduled",
    "reschedule:scheduled",
    "reschedule:in-flight",
    "cancel:cancelled",
    "cancel:cancelled-after-attempts",
    "cancel:already-delivered",
    "cancel:not-found",
    "cancel-many",
    "advance",
    "step-wall",
    "delivery",
    "redelivery",
    "lease-expired",
    "lease-expired:abandoned",
    "ack",
    "ack:abandoned",
    "ack:lease-expired",
    "ack:not-outstanding",
    "ack-many",
    "ack-many:spoiled",
    "ack-and-schedule",
    "ack-and-schedule:overdue",
    "ack-and-schedule:own-payload",
    "ack-and-schedule:cancelled-while-held",
    "ack-and-schedule:lease-expired",
    "ack-and-schedule:not-outstanding",
    "ack-and-schedule:too-far",
    "nack:retry",
    "nack:dead-lettered",
    "nack:finished",
    "nack:refused",
    "nack:too-far",
    "extend-lease",
    "extend-lease:invalid",
    "reopen",
    "process-crash",
    "power-cut",
    "open:redelivered",
    "open:overdue",
    "open:dead-lettered",
    "requeue",
    "requeue:not-dead-letter",
    "purge",
    "purge:none",
    "checkpoint",
    "checkpoint:unchanged",
    "pause",
    "resume",
    "paused:lease-ran-out",
    "sync",
    // Not required: "checkpoint:segments-removed" (counted when reached). Whether a segment is
    // sealed when a checkpoint runs depends on where segments roll, which MARK frames (written
    // when the writer finds nothing queued after a sync: timing) shift from run to run.
];

/// Opens the engine on the simulated disk.
fn open(sim: &SimStorage, clock: &ManualClock, config: &Config, at: &At<'_>) -> Engine {
    match Engine::open_with(
        Path::new(DATA_DIR),
        config.clone(),
        Arc::new(sim.clone()),
        Arc::new(clock.clone()),
    ) {
        Ok(engine) => engine,
        Err(e) => at.fail(format_args!("open failed: {e}")),
    }
}

/// Waits until the driver has handed out what is due now, then receives all of it.
fn drain(engine: &Engine, at: &At<'_>) -> Vec<Delivery> {
    engine.run_until_idle();
    let consumer = engine.consumer();
    let mut out = Vec::new();
    loop {
        match consumer.try_recv() {
            Ok(d) => out.push(d),
            Err(RecvError::Empty) => return out,
            Err(e) => at.fail(format_args!("receive failed: {e}")),
        }
    }
}

/// What a schedule-like call must answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Ids(Vec<u64>),
    TooFar,
    TooManyPending,
    AlreadyExists,
    Duplicate,
    InFlight,
    NotDeadLetter,
}

fn answer_of(got: &Result<Vec<TaskId>, ScheduleError>) -> Option<Answer> {
    match got {
        Ok(ids) => Some(Answer::Ids(ids.iter().map(|id| id.0).collect())),
        Err(e) => error_answer(e),
    }
}

fn error_answer(e: &ScheduleError) -> Option<Answer> {
    Some(match e {
        ScheduleError::DueTooFar { .. } => Answer::TooFar,
        ScheduleError::TooManyPending { .. } => Answer::TooManyPending,
        ScheduleError::AlreadyExists { .. } => Answer::AlreadyExists,
        ScheduleError::DuplicateKeyInBatch { .. } => Answer::Duplicate,
        ScheduleError::InFlight { .. } => Answer::InFlight,
        ScheduleError::NotDeadLetter { .. } => Answer::NotDeadLetter,
        _ => return None,
    })
}

fn check_answer(at: &At<'_>, got: &Result<Vec<TaskId>, ScheduleError>, expected: &Answer) {
    if answer_of(got).as_ref() != Some(expected) {
        at.fail(format_args!("returned {got:?}, model says {expected:?}"));
    }
}

/// What acting on a delivery of status `held` must answer when refused.
fn refusal(held: Held, d: &Delivery) -> Option<AckError> {
    let task_id = d.task_id().0;
    match held {
        Held::Expired => Some(AckError::LeaseExpired { task_id }),
        Held::NotOutstanding => Some(AckError::NotOutstanding { task_id }),
        Held::Live | Held::Abandoned => None,
    }
}

/// Same variant and task id.
fn same_refusal(got: &AckError, expected: &AckError) -> bool {
    match (got, expected) {
        (AckError::LeaseExpired { task_id: a }, AckError::LeaseExpired { task_id: b })
        | (AckError::NotOutstanding { task_id: a }, AckError::NotOutstanding { task_id: b }) => {
            a == b
        }
        _ => false,
    }
}

fn check_refusal<T: fmt::Debug>(at: &At<'_>, got: &Result<T, AckError>, expected: &AckError) {
    match got {
        Err(e) if same_refusal(e, expected) => {}
        other => at.fail(format_args!("returned {other:?}, model says {expected:?}")),
    }
}

fn check_stats(at: &At<'_>, engine: &Engine, model: &Model) {
    let (entries, named) = engine.arena_entries_accounted();
    if entries != named {
        at.fail(format_args!(
            "{entries} payload arena entries in use, {named} named by tasks: a leak"
        ));
    }
    let s = engine.stats();
    let expected = (
        model.scheduled(),
        0,
        model.in_flight(),
        0,
        model.dead.len(),
        model.live(),
        model.payload_bytes(),
    );
    let got = (
        s.scheduled,
        s.ready,
        s.in_flight,
        s.catch_up_backlog,
        s.dead_letters,
        s.pending,
        // Payloads a checkpoint moved to an overflow file are not in memory
        // (which ones is not modelled; their bytes are checked on delivery):
        // exact while none is on disk, at most the model's otherwise.
        if s.payloads_on_disk > 0 && s.payload_bytes_in_memory <= model.payload_bytes() {
            model.payload_bytes()
        } else {
            s.payload_bytes_in_memory
        },
    );
    if got != expected {
        at.fail(format_args!(
            "stats {s:?}; model (scheduled, ready, in_flight, catch_up_backlog, dead_letters, \
             pending, payload_bytes) = {expected:?}"
        ));
    }
    check_totals(at, &s, &model.totals);
    check_relations(at, &s, &model.totals);
}

/// The running totals in `s` are the model's, exactly.
fn check_totals(at: &At<'_>, s: &crate::Stats, model: &Totals) {
    let got = Totals {
        tasks_scheduled: s.tasks_scheduled,
        tasks_rescheduled: s.tasks_rescheduled,
        tasks_cancelled: s.tasks_cancelled,
        deliveries: s.deliveries,
        acks: s.acks,
        nacks: s.nacks,
        lease_expiries: s.lease_expiries,
        retries: s.retries,
        tasks_dead_lettered: s.tasks_dead_lettered,
        // Not in `Stats`.
        finished_abandoned: model.finished_abandoned,
    };
    if got != *model {
        at.fail(format_args!(
            "running totals differ:\n  engine {got:?}\n  model  {model:?}"
        ));
    }
}

/// The relations `Stats` documents between its totals hold in `s` (a running engine's):
/// every delivery ends in one ack, nack or lease expiry or is still held; every nack or lease
/// expiry retries, dead-letters, or finishes a task cancelled while held (the model counts
/// those: `model.finished_abandoned`).
fn check_relations(at: &At<'_>, s: &crate::Stats, model: &Totals) {
    let ended = s.acks + s.nacks + s.lease_expiries + s.in_flight as u64;
    if s.deliveries != ended {
        at.fail(format_args!(
            "deliveries {} != acks + nacks + lease_expiries + in_flight = {ended}: {s:?}",
            s.deliveries
        ));
    }
    let followed = s.retries + s.tasks_dead_lettered + model.finished_abandoned;
    if s.nacks + s.lease_expiries != followed {
        at.fail(format_args!(
            "nacks + lease_expiries = {} != retries + tasks_dead_lettered + {} finished (cancelled \
             while held) = {followed}: {s:?}",
            s.nacks + s.lease_expiries,
            model.finished_abandoned
        ));
    }
}

fn check_dead_letters(at: &At<'_>, engine: &Engine, model: &Model) {
    let got: BTreeMap<u64, Dead> = engine
        .dead_letters()
        .into_iter()
        .map(|d: DeadLetter| {
            (
                d.task_id.0,
                Dead {
                    key: d.key,
                    payload: d.payload,
                    attempts: d.attempts,
                    due_ms: d.due_ms,
                    dead_ms: d.dead_ms,
                    error: d.error,
                },
            )
        })
        .collect();
    if got != model.dead {
        at.fail(format_args!(
            "dead letters differ:\n  engine {got:?}\n  model  {:?}",
            model.dead
        ));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Clean,
    ProcessCrash,
    PowerCut,
}

fn check_recovery(at: &At<'_>, recovery: &Recovery, expected: [usize; 5], how: Option<Stop>) {
    let got = [
        recovery.pending,
        recovery.overdue,
        recovery.redelivered,
        recovery.dead_lettered,
        recovery.dead_letters,
    ];
    if got != expected {
        at.fail(format_args!(
            "recovery {recovery:?}; model (pending, overdue, redelivered, dead_lettered, \
             dead_letters) = {expected:?}"
        ));
    }
    if how == Some(Stop::Clean) && !recovery.wal.clean_shutdown {
        at.fail(format_args!(
            "a clean shutdown reopened as unclean: {recovery:?}"
        ));
    }
    if matches!(how, None | Some(Stop::Clean | Stop::ProcessCrash))
        && recovery.wal.torn_tail.is_some()
    {
        at.fail(format_args!(
            "a torn tail without a power cut: {recovery:?}"
        ));
    }
}

/// Runs one input against engine and model and returns what it exercised.
///
/// # Panics
/// On a mismatch between the engine and the model (see the module docs).
pub fn engine_model_run(data: &[u8]) -> Coverage {
    let input = EngineModelInput::decode(data);
    let config = input.setup.config();
    let sim = SimStorage::new(u64::from(input.setup.seed));
    let clock = ManualClock::new(START_MS);
    let mut model = Model::new(&input.setup);
    let mut ds = Deliveries::default();
    let mut cov = Coverage::default();
    let start = At { step: 0, op: None };
    let mut engine = open(&sim, &clock, &config, &start);
    check_recovery(&start, engine.recovery(), [0; 5], None);
    // LSN of the newest checkpoint.
    let mut checkpoint_lsn = 0;

    for (step, op) in input.ops.iter().enumerate() {
        let at = At { step, op: Some(op) };
        // Every other step's durable calls go through their async forms (run to completion
        // here), which must answer exactly as the blocking ones.
        let via_async = step % 2 == 1;
        // Deliveries an open makes (instead of a driver pass).
        let mut at_open: Option<Vec<Expected>> = None;
        match op {
            Op::Schedule {
                key,
                when,
                payload_len,
            } => {
                let k = key_bytes(*key);
                let p = model.payload(usize::from(*payload_len));
                let (due, due_ms) = when.resolve(model.wall_ms);
                let got = if via_async {
                    block_on(engine.schedule_async(&k, due, &p))
                } else {
                    engine.schedule(&k, due, &p)
                }
                .map(|id| vec![id]);
                let expected = if due_ms > model.wall_ms + DELAY_MAX_MS {
                    cov.hit("schedule:too-far");
                    Answer::TooFar
                } else if model.tasks.contains_key(&k) {
                    // A live key is `AlreadyExists` at the pending limit too.
                    cov.hit("schedule:already-exists");
                    Answer::AlreadyExists
                } else if model.live() >= model.pending_max {
                    cov.hit("schedule:too-many-pending");
                    Answer::TooManyPending
                } else {
                    cov.hit("schedule");
                    if due_ms <= model.wall_ms {
                        cov.hit("schedule:overdue");
                    }
                    Answer::Ids(vec![model.add(k, due_ms, p)])
                };
                check_answer(&at, &got, &expected);
            }
            Op::ScheduleMany { keys, when } => {
                let ks: Vec<Vec<u8>> = keys.iter().map(|k| key_bytes(*k)).collect();
                let ps: Vec<Vec<u8>> = (0..ks.len()).map(|i| model.payload(i * 5)).collect();
                let (due, due_ms) = when.resolve(model.wall_ms);
                let batch: Vec<NewTask<'_>> = ks
                    .iter()
                    .zip(&ps)
                    .map(|(k, p)| NewTask {
                        key: k,
                        due,
                        payload: p,
                    })
                    .collect();
                let got = if via_async {
                    block_on(engine.schedule_many_async(&batch))
                } else {
                    engine.schedule_many(&batch)
                };
                let mut distinct = ks.clone();
                distinct.sort();
                distinct.dedup();
                let expected = if due_ms > model.wall_ms + DELAY_MAX_MS {
                    cov.hit("schedule:too-far");
                    Answer::TooFar
                } else if distinct.len() != ks.len() {
                    cov.hit("schedule-many:duplicate");
                    Answer::Duplicate
                } else if ks.iter().any(|k| model.tasks.contains_key(k)) {
                    cov.hit("schedule-many:already-exists");
                    Answer::AlreadyExists
                } else if model.live() + ks.len() > model.pending_max {
                    cov.hit("schedule:too-many-pending");
                    Answer::TooManyPending
                } else {
                    cov.hit("schedule-many");
                    let ids = ks
                        .into_iter()
                        .zip(ps)
                        .map(|(k, p)| model.add(k, due_ms, p))
                        .collect();
                    Answer::Ids(ids)
                };
                check_answer(&at, &got, &expected);
            }
            Op::Reschedule {
                key,
                when,
                new_payload,
            } => {
                let k = key_bytes(*key);
                let p = model.payload(3);
                let payload = new_payload.then_some(p.as_slice());
                let (due, due_ms) = when.resolve(model.wall_ms);
                let got = if via_async {
                    block_on(engine.reschedule_async(&k, due, payload))
                } else {
                    engine.reschedule(&k, due, payload)
                };
                let live = model.tasks.get(&k).map(|t| (t.id, t.lease.is_some()));
                let expected = if due_ms > model.wall_ms + DELAY_MAX_MS {
                    cov.hit("schedule:too-far");
                    Err(Answer::TooFar)
                } else {
                    match live {
                        Some((_, true)) => {
                            cov.hit("reschedule:in-flight");
                            Err(Answer::InFlight)
                        }
                        Some((id, false)) => {
                            cov.hit("reschedule:rescheduled");
                            model.totals.tasks_rescheduled += 1;
                            if let (Some(p), Some(t)) = (payload, model.tasks.get_mut(&k)) {
                                t.payload = p.to_vec();
                            }
                            model.place(&k, due_ms);
                            Ok(RescheduleOutcome::Rescheduled(TaskId(id)))
                        }
                        None if model.live() >= model.pending_max => {
                            cov.hit("schedule:too-many-pending");
                            Err(Answer::TooManyPending)
                        }
                        None => {
                            cov.hit("reschedule:scheduled");
                            let p = payload.unwrap_or(&[]).to_vec();
                            Ok(RescheduleOutcome::Scheduled(TaskId(
                                model.add(k, due_ms, p),
                            )))
                        }
                    }
                };
                let matches = match (&got, &expected) {
                    (Ok(g), Ok(e)) => g == e,
                    (Err(g), Err(e)) => error_answer(g).as_ref() == Some(e),
                    _ => false,
                };
                if !matches {
                    at.fail(format_args!("returned {got:?}, model says {expected:?}"));
                }
            }
            Op::Cancel { key } => {
                let k = key_bytes(*key);
                let got = if via_async {
                    block_on(engine.cancel_async(&k))
                } else {
                    engine.cancel(&k)
                };
                let expected = cancel_in_model(&mut model, &k, &mut cov);
                match got {
                    Ok(outcome) if outcome == expected => {}
                    other => at.fail(format_args!("returned {other:?}, model says {expected:?}")),
                }
            }
            Op::CancelMany { keys } => {
                let ks: Vec<Vec<u8>> = keys.iter().map(|k| key_bytes(*k)).collect();
                let refs: Vec<&[u8]> = ks.iter().map(Vec::as_slice).collect();
                let got = if via_async {
                    block_on(engine.cancel_many_async(&refs))
                } else {
                    engine.cancel_many(&refs)
                };
                cov.hit("cancel-many");
                let expected: Vec<CancelOutcome> = ks
                    .iter()
                    .map(|k| cancel_in_model(&mut model, k, &mut cov))
                    .collect();
                match got {
                    Ok(outcomes) if outcomes == expected => {}
                    other => at.fail(format_args!("returned {other:?}, model says {expected:?}")),
                }
            }
            Op::Advance(advance) => {
                let ms = match *advance {
                    Advance::By(ms) => ms,
                    Advance::ToNext(offset) => match model.next_deadline() {
                        Some(next) => next
                            .saturating_add_signed(i64::from(offset))
                            .saturating_sub(model.mono_ms)
                            .max(1),
                        None => 1,
                    },
                };
                cov.hit("advance");
                clock.advance(Duration::from_millis(ms));
                model.wall_ms += ms;
                model.mono_ms += ms;
            }
            Op::StepWall { ms } => {
                cov.hit("step-wall");
                clock.step_wall(*ms);
                model.wall_ms = model.wall_ms.saturating_add_signed(*ms);
            }
            Op::Ack { pick, fresh } => {
                if let Some(i) = ds.pick(&model, *pick, *fresh) {
                    let held = ds.status(&model, i);
                    let d = ds.all[i].0.clone();
                    let got = if via_async {
                        block_on(engine.ack_async(&d))
                    } else {
                        engine.ack(&d)
                    };
                    match refusal(held, &d) {
                        None => {
                            if let Err(e) = got {
                                at.fail(format_args!("ack of {d:?} ({held:?}) failed: {e}"));
                            }
                            cov.hit(if held == Held::Abandoned {
                                "ack:abandoned"
                            } else {
                                "ack"
                            });
                            model.finish(&d);
                        }
                        Some(expected) => {
                            cov.hit(if held == Held::Expired {
                                "ack:lease-expired"
                            } else {
                                "ack:not-outstanding"
                            });
                            check_refusal(&at, &got, &expected);
                        }
                    }
                }
            }
            Op::AckMany { picks, spoil } => {
                let held = ds.held(&model);
                if let (false, Some(&first_pick)) = (held.is_empty(), picks.first()) {
                    let mut chosen: Vec<usize> = picks
                        .iter()
                        .map(|p| held[usize::from(*p) % held.len()])
                        .collect();
                    chosen.sort_unstable();
                    chosen.dedup();
                    let mut batch: Vec<Delivery> =
                        chosen.iter().map(|&i| ds.all[i].0.clone()).collect();
                    let refused = ds.refused(&model);
                    let expected_error = match spoil {
                        Spoil::Duplicate => batch.first().cloned().map(|first| {
                            batch.push(first.clone());
                            AckError::NotOutstanding {
                                task_id: first.task_id().0,
                            }
                        }),
                        Spoil::Stale if !refused.is_empty() => {
                            let bad = refused[usize::from(first_pick) % refused.len()];
                            let d = ds.all[bad].0.clone();
                            let error = refusal(ds.status(&model, bad), &d);
                            batch.insert(batch.len() / 2, d);
                            error
                        }
                        _ => None,
                    };
                    let got = if via_async {
                        block_on(engine.ack_many_async(&batch))
                    } else {
                        engine.ack_many(&batch)
                    };
                    match expected_error {
                        Some(expected) => {
                            cov.hit("ack-many:spoiled");
                            check_refusal(&at, &got, &expected);
                        }
                        None => {
                            if let Err(e) = got {
                                at.fail(format_args!("ack_many of {batch:?} failed: {e}"));
                            }
                            cov.hit("ack-many");
                            for d in &batch {
                                model.finish(d);
                            }
                        }
                    }
                }
            }
            Op::AckAndSchedule {
                pick,
                when,
                new_payload,
                fresh,
            } => {
                if let Some(i) = ds.pick(&model, *pick, *fresh) {
                    let held = ds.status(&model, i);
                    let d = ds.all[i].0.clone();
                    let p = if *new_payload {
                        model.payload(5)
                    } else {
                        d.payload().to_vec()
                    };
                    let (due, due_ms) = when.resolve(model.wall_ms);
                    let got = if via_async {
                        block_on(engine.ack_and_schedule_async(&d, due, &p))
                    } else {
                        engine.ack_and_schedule(&d, due, &p)
                    };
                    let max_ms = model.wall_ms + DELAY_MAX_MS;
                    // The new task's due time is checked before the lease (as a nack's
                    // `retry_after`): too far is refused whatever the delivery's state.
                    let expected = if due_ms > max_ms {
                        cov.hit("ack-and-schedule:too-far");
                        Err(AckScheduleError::Schedule(ScheduleError::DueTooFar {
                            due_ms,
                            max_ms,
                        }))
                    } else if let Some(refused) = refusal(held, &d) {
                        cov.hit(if held == Held::Expired {
                            "ack-and-schedule:lease-expired"
                        } else {
                            "ack-and-schedule:not-outstanding"
                        });
                        Err(AckScheduleError::Ack(refused))
                    } else if held == Held::Abandoned {
                        // A cancel ends the series: acked, nothing scheduled.
                        cov.hit("ack-and-schedule:cancelled-while-held");
                        model.finish(&d);
                        Ok(AckScheduleOutcome::CancelledWhileHeld)
                    } else {
                        // The held task leaves as the new one comes, under the same key (no
                        // `AlreadyExists`, no `TooManyPending`).
                        cov.hit("ack-and-schedule");
                        if due_ms <= model.wall_ms {
                            cov.hit("ack-and-schedule:overdue");
                        }
                        if !*new_payload {
                            cov.hit("ack-and-schedule:own-payload");
                        }
                        model.finish(&d);
                        let id = model.add(d.key().to_vec(), due_ms, p);
                        Ok(AckScheduleOutcome::Scheduled(TaskId(id)))
                    };
                    // Exactly: the outcome and the new id, the refusal's variant and task id,
                    // `DueTooFar`'s due time and limit.
                    if got != expected {
                        at.fail(format_args!("returned {got:?}, model says {expected:?}"));
                    }
                }
            }
            Op::Nack {
                pick,
                retry_after_ms,
                fresh,
            } => {
                if let Some(i) = ds.pick(&model, *pick, *fresh) {
                    let held = ds.status(&model, i);
                    let d = ds.all[i].0.clone();
                    let retry_after = retry_after_ms.map(Duration::from_millis);
                    let got = if via_async {
                        block_on(engine.nack_async(&d, retry_after, NACK_ERROR))
                    } else {
                        engine.nack(&d, retry_after, NACK_ERROR)
                    };
                    if retry_after_ms.is_some_and(|ms| ms > DELAY_MAX_MS) {
                        cov.hit("nack:too-far");
                        if !matches!(got, Err(AckError::RetryTooFar { .. })) {
                            at.fail(format_args!("returned {got:?}, model says RetryTooFar"));
                        }
                    } else if let Some(expected) = refusal(held, &d) {
                        cov.hit("nack:refused");
                        check_refusal(&at, &got, &expected);
                    } else {
                        model.totals.nacks += 1;
                        let expected = if held == Held::Abandoned {
                            model.abandoned.remove(&d.task_id().0);
                            model.totals.finished_abandoned += 1;
                            NackOutcome::Finished
                        } else {
                            model.fail(d.key(), *retry_after_ms, NACK_ERROR)
                        };
                        cov.hit(match expected {
                            NackOutcome::Retry { .. } => "nack:retry",
                            NackOutcome::DeadLettered => "nack:dead-lettered",
                            _ => "nack:finished",
                        });
                        if got.as_ref().ok() != Some(&expected) {
                            at.fail(format_args!("returned {got:?}, model says {expected:?}"));
                        }
                    }
                }
            }
            Op::ExtendLease {
                pick,
                lease_ms,
                fresh,
            } => {
                if let Some(i) = ds.pick(&model, *pick, *fresh) {
                    let held = ds.status(&model, i);
                    let d = ds.all[i].0.clone();
                    let got = engine.extend_lease(&d, Duration::from_millis(*lease_ms));
                    if *lease_ms == 0 || *lease_ms > LEASE_MAX_MS {
                        cov.hit("extend-lease:invalid");
                        if !matches!(got, Err(AckError::InvalidLease { .. })) {
                            at.fail(format_args!("returned {got:?}, model says InvalidLease"));
                        }
                    } else if let Some(expected) = refusal(held, &d) {
                        check_refusal(&at, &got, &expected);
                    } else {
                        if let Err(e) = got {
                            at.fail(format_args!("extend_lease of {d:?} failed: {e}"));
                        }
                        cov.hit("extend-lease");
                        let lease = model.lease_now(*lease_ms);
                        if let Some(a) = model.abandoned.get_mut(&d.task_id().0) {
                            a.lease = lease;
                        } else if let Some(t) = model.tasks.get_mut(d.key()) {
                            t.lease = Some(lease);
                        }
                    }
                }
            }
            Op::Reopen | Op::ProcessCrash | Op::PowerCut => {
                let how = match op {
                    Op::Reopen => Stop::Clean,
                    Op::ProcessCrash => Stop::ProcessCrash,
                    _ => Stop::PowerCut,
                };
                match how {
                    Stop::Clean => {
                        cov.hit("reopen");
                        if let Err(e) = engine.shutdown() {
                            at.fail(format_args!("shutdown failed: {e}"));
                        }
                        // After a shutdown the totals stay as they were when it stopped.
                        check_totals(&at, &engine.stats(), &model.totals);
                        drop(engine);
                    }
                    Stop::ProcessCrash => {
                        cov.hit("process-crash");
                        drop(engine);
                        sim.crash_process();
                    }
                    Stop::PowerCut => {
                        cov.hit("power-cut");
                        drop(engine);
                        sim.power_cut();
                    }
                }
                ds.incarnation += 1;
                // Not durable: an engine opens paused only if its config says so.
                model.paused = false;
                let (redelivered, dead_lettered) = model.settle_after_stop();
                engine = open(&sim, &clock, &config, &at);
                // A new engine: every total starts at 0 (what the open itself did — the tasks
                // it recovered, redelivers or dead-lettered — is in its `Recovery`, not in
                // them); the deliveries it makes at open count.
                model.totals = Totals::default();
                let mut backlog: Vec<Vec<u8>> = model
                    .tasks
                    .iter()
                    .filter(|(k, t)| t.due_ms <= model.wall_ms && !redelivered.contains(k))
                    .map(|(k, _)| k.clone())
                    .collect();
                let overdue = backlog.len();
                cov.add("open:overdue", overdue);
                cov.add("open:redelivered", redelivered.len());
                cov.add("open:dead-lettered", dead_lettered);
                let expected = [
                    model.tasks.len(),
                    overdue,
                    redelivered.len(),
                    dead_lettered,
                    model.dead.len(),
                ];
                check_recovery(&at, engine.recovery(), expected, Some(how));
                backlog.extend(redelivered);
                at_open = Some(model.reopen(&backlog));
            }
            Op::RequeueDead { pick, when } => {
                let id = model.dead_pick(*pick);
                let (due, due_ms) = when.resolve(model.wall_ms);
                let got = engine
                    .requeue_dead_letter(TaskId(id), due)
                    .map(|id| vec![id]);
                let expected = match model.dead.get(&id).cloned() {
                    None => {
                        cov.hit("requeue:not-dead-letter");
                        Answer::NotDeadLetter
                    }
                    Some(_) if due_ms > model.wall_ms + DELAY_MAX_MS => {
                        cov.hit("schedule:too-far");
                        Answer::TooFar
                    }
                    Some(dead) if model.tasks.contains_key(&dead.key) => {
                        cov.hit("schedule:already-exists");
                        Answer::AlreadyExists
                    }
                    Some(_) if model.live() >= model.pending_max => {
                        cov.hit("schedule:too-many-pending");
                        Answer::TooManyPending
                    }
                    Some(dead) => {
                        cov.hit("requeue");
                        model.dead.remove(&id);
                        Answer::Ids(vec![model.add(dead.key, due_ms, dead.payload)])
                    }
                };
                check_answer(&at, &got, &expected);
            }
            Op::PurgeDead { pick } => {
                let id = model.dead_pick(*pick);
                let got = engine.purge_dead_letter(TaskId(id));
                let expected = model.dead.remove(&id).is_some();
                cov.hit(if expected { "purge" } else { "purge:none" });
                match got {
                    Ok(purged) if purged == expected => {}
                    other => at.fail(format_args!("returned {other:?}, model says {expected}")),
                }
            }
            Op::Checkpoint => {
                let report = match engine.checkpoint() {
                    Ok(report) => report,
                    Err(e) => at.fail(format_args!("checkpoint failed: {e}")),
                };
                // Every checkpoint succeeds and is durable before it returns, so the newest
                // one on disk is the last one taken: nothing is written exactly when nothing
                // was logged since it.
                let fits = report.lsn >= checkpoint_lsn
                    && report.written == (report.lsn != checkpoint_lsn)
                    && (!report.written
                        || (report.tasks == model.tasks.len() as u64
                            && report.dead_letters == model.dead.len() as u64));
                if !fits {
                    at.fail(format_args!(
                        "checkpoint {report:?} after one at LSN {checkpoint_lsn}; model: {} live \
                         tasks (and {} cancelled while held), {} dead letters",
                        model.tasks.len(),
                        model.abandoned.len(),
                        model.dead.len()
                    ));
                }
                checkpoint_lsn = report.lsn;
                cov.hit(if report.written {
                    "checkpoint"
                } else {
                    "checkpoint:unchanged"
                });
                if report.segments_removed > 0 {
                    cov.hit("checkpoint:segments-removed");
                }
            }
            Op::Pause => {
                cov.hit("pause");
                engine.pause_deliveries();
                if !model.paused {
                    model.paused = true;
                    model.paused_at_mono_ms = model.mono_ms;
                }
                if !engine.deliveries_paused() {
                    at.fail("not paused after pause_deliveries");
                }
            }
            Op::Resume => {
                cov.hit("resume");
                engine.resume_deliveries();
                model.paused = false;
                if engine.deliveries_paused() {
                    at.fail("paused after resume_deliveries");
                }
            }
            Op::Sync => {
                cov.hit("sync");
                if let Err(e) = engine.sync() {
                    at.fail(format_args!("sync failed: {e}"));
                }
            }
        }
        if model.paused {
            let ran_out = model
                .tasks
                .values()
                .filter_map(|t| t.lease)
                .chain(model.abandoned.values().map(|a| a.lease))
                .filter(|l| l.fire_mono_ms <= model.mono_ms)
                .count();
            cov.add("paused:lease-ran-out", ran_out);
        }
        let got = drain(&engine, &at);
        let expected = match at_open {
            Some(expected) => expected,
            None => {
                let finished_before = model.totals.finished_abandoned;
                let (expiries, expected) = model.pass();
                cov.add("lease-expired", expiries);
                let finished = model.totals.finished_abandoned - finished_before;
                cov.add("lease-expired:abandoned", finished as usize);
                expected
            }
        };
        at.check_deliveries("deliveries", &got, &expected);
        cov.add("delivery", got.len());
        cov.add("redelivery", got.iter().filter(|d| d.attempt() > 1).count());
        ds.add(got);
        ds.prune(&model);
        check_stats(&at, &engine, &model);
        check_dead_letters(&at, &engine, &model);
    }

    // The end: deliveries resumed if paused (what fell due meanwhile comes out), every held
    // delivery acked, then every task still waiting comes out, in order, once the clock
    // passes it; then a clean shutdown.
    let at = At { step: 0, op: None };
    if model.paused {
        engine.resume_deliveries();
        model.paused = false;
        let got = drain(&engine, &at);
        let (_, expected) = model.pass();
        at.check_deliveries("deliveries at the final resume", &got, &expected);
        ds.add(got);
    }
    let held: Vec<Delivery> = ds
        .held(&model)
        .into_iter()
        .map(|i| ds.all[i].0.clone())
        .collect();
    if let Err(e) = engine.ack_many(&held) {
        at.fail(format_args!("ack_many of every held delivery failed: {e}"));
    }
    for d in &held {
        model.finish(d);
    }
    if let Some(last) = model.tasks.values().map(|t| t.fire_mono_ms).max() {
        let by = last.saturating_sub(model.mono_ms) + 1;
        clock.advance(Duration::from_millis(by));
        model.wall_ms += by;
        model.mono_ms += by;
    }
    let got = drain(&engine, &at);
    let (_, expected) = model.pass();
    at.check_deliveries("final deliveries", &got, &expected);
    if model.scheduled() != 0 {
        at.fail("tasks left waiting in the model");
    }
    check_stats(&at, &engine, &model);
    check_dead_letters(&at, &engine, &model);
    if let Err(e) = engine.shutdown() {
        at.fail(format_args!("final shutdown failed: {e}"));
    }
    check_totals(&at, &engine.stats(), &model.totals);
    cov
}

/// The model side of a cancel of `key`: its answer, applied.
fn cancel_in_model(model: &mut Model, key: &[u8], cov: &mut Coverage) -> CancelOutcome {
    let Some(t) = model.tasks.remove(key) else {
        cov.hit("cancel:not-found");
        return CancelOutcome::NotFound;
    };
    match t.lease {
        None => {
            cov.hit(if t.deliveries > 0 {
                "cancel:cancelled-after-attempts"
            } else {
                "cancel:cancelled"
            });
            model.totals.tasks_cancelled += 1;
            CancelOutcome::Cancelled {
                deliveries: t.deliveries,
            }
        }
        Some(lease) => {
            cov.hit("cancel:already-delivered");
            model.abandoned.insert(
                t.id,
                Abandoned {
                    attempt: t.deliveries,
                    lease,
                    payload_len: t.payload.len(),
                },
            );
            CancelOutcome::AlreadyDelivered {
                attempt: t.deliveries,
            }
        }
    }
}

/// Fuzz target `engine_model`: arbitrary bytes as a setup and a sequence of operations
/// ([`EngineModelInput`]) run on the engine (simulated storage, manual clock, `Sync`, tiny
/// segments) and on a reference model; see the module docs for what is checked.
///
/// # Panics
/// On a finding: the engine panicked, or its answer, its deliveries, its recovery report, its
/// stats or its dead letters differ from the model's after some operation.
pub fn engine_model(data: &[u8]) {
    engine_model_run(data);
}
