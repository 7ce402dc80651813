//! Model-based property test: the engine against a `BTreeMap` reference queue, with clean
//! reopen and power cut as operations (mrecordlog's, sled's and redb's model tests).
//!
//! Each case runs a random sequence of operations — schedule (after a delay, or at an absolute
//! time that may be past), batch schedule, reschedule (upsert), cancel, advance the clock
//! (milliseconds to a year), step the wall clock alone, ack, ack many (some spoiled), nack
//! (with or without a retry delay), extend a lease, pause and resume deliveries, clean reopen,
//! process crash, power cut, `Engine::sync` then a power cut (which then loses nothing in any
//! durability mode),
//! checkpoint (alone, or followed at once by a clean reopen, process crash or power cut) —
//! on an at-least-once engine with short leases, a small `max_attempts` and a fast backoff,
//! with `SimStorage` and tiny segments, and checks after every step:
//!
//! * every outcome (ids aside) is exactly what the model predicts — including which acks are
//!   refused because the lease expired, and each nack's retry time or dead letter;
//! * the deliveries are exactly the tasks that fell due — keys, payloads, due times, attempts
//!   and hand-out times — in deadline order, FIFO among equal deadlines (lease expiries share
//!   the wheel and its FIFO order);
//! * after a reopen or a power cut, every task the model holds is still there (nothing
//!   acknowledged under `Sync` is lost), tasks in flight come again with `attempt + 1` or are
//!   dead-lettered when their attempts are used up, tasks cancelled in flight never come back,
//!   dead letters are kept, and `Engine::recovery()` and `Engine::stats()` count it all exactly;
//! * a checkpoint changes nothing the model sees: it succeeds, holds the model's live tasks and
//!   dead letters (or writes nothing when nothing was logged since the last one), its LSN never
//!   goes back, and a reopen from it (plus the log after it) gives the same state as from the
//!   whole log.
//!
//! Time follows the README: firing follows the monotonic clock; a due time is converted with
//! the wall clock at the call and again at open, so a wall step moves no scheduled task until
//! the next open.

mod common;

use common::{block_on, drain, scale, SimHarness, Stop, TestResult, SMALL_SEGMENT_BYTES};
use kairos::clock::ms_to_system_time;
use kairos::{
    AckError, AckScheduleError, AckScheduleOutcome, CancelOutcome, Config, Delivery, Due,
    Durability, NackOutcome, NewTask, RescheduleOutcome, RetryPolicy, ScheduleError, TaskState,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// Keys are drawn from a small set so that collisions, reuse after ack or cancel, and
/// cancels of delivered tasks all happen often.
const KEY_SPACE: u8 = 12;

/// About 463 days, in ms: past the wheel's coarse levels (2^36 ms ≈ 795 days is level 6).
const LONG_MS: u64 = 40_000_000_000;

/// The error text a lease expiry records (checked through the dead letters).
const NACK_ERROR: &str = "model nack";

#[derive(Debug, Clone, Copy)]
enum When {
    /// `Due::After(ms)`.
    After(u64),
    /// `Due::At(wall + offset)`: may be in the past (fires at once).
    At(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Schedule {
        key: u8,
        when: When,
        payload_bytes: usize,
    },
    ScheduleBatch {
        keys: Vec<u8>,
        delay_ms: u64,
    },
    Reschedule {
        key: u8,
        delay_ms: u64,
        new_payload: bool,
    },
    Cancel {
        key: u8,
    },
    Advance {
        ms: u64,
    },
    StepWall {
        ms: i64,
    },
    /// Ack one delivery of this incarnation that the model says is held (`fresh`), or any
    /// delivery ever made (acked, expired, cancelled, from an earlier incarnation).
    Ack {
        pick: usize,
        fresh: bool,
    },
    /// `ack_and_schedule` of a delivery picked as for `Ack`: the next task under its key
    /// `delay_ms` from now, with a new payload or the delivery's own.
    AckAndSchedule {
        pick: usize,
        fresh: bool,
        delay_ms: u64,
        new_payload: bool,
    },
    /// `ack_many` of some held deliveries; with `spoil`, one of them twice or another delivery
    /// too, so the whole call must fail and ack nothing.
    AckMany {
        picks: Vec<usize>,
        spoil: Option<bool>,
    },
    Nack {
        pick: usize,
        retry_after_ms: Option<u64>,
    },
    ExtendLease {
        pick: usize,
        lease_ms: u64,
    },
    Reopen,
    ProcessCrash,
    PowerCut,
    /// `Engine::sync`, then at once a power cut: in every durability mode nothing returned
    /// before it may be lost (under `Interval` and `Buffered` a plain power cut promises
    /// nothing, and the model runs it as a process crash).
    SyncThenPowerCut,
    /// `Engine::pause_deliveries`.
    Pause,
    /// `Engine::resume_deliveries`.
    Resume,
    /// `Engine::checkpoint`, then maybe at once a clean reopen, process crash or power cut.
    Checkpoint {
        then: Option<Restart>,
    },
}

/// A restart right after a checkpoint (or a sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    Reopen,
    ProcessCrash,
    PowerCut,
    /// A power cut right after `Engine::sync`: the real thing, in every mode.
    PowerCutAfterSync,
}

fn delay_ms() -> impl Strategy<Value = u64> {
    prop_oneof![12 => 1..=80u64, 4 => 1_000..=100_000u64, 1 => 1..=LONG_MS]
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        8 => delay_ms().prop_map(When::After),
        1 => Just(When::After(0)),
        2 => (-5_000..=200i64).prop_map(When::At),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEY_SPACE, when(), 0..=48usize).prop_map(|(key, when, payload_bytes)| {
            Op::Schedule { key, when, payload_bytes }
        }),
        2 => (proptest::collection::vec(0..KEY_SPACE, 1..=4), delay_ms())
            .prop_map(|(keys, delay_ms)| Op::ScheduleBatch { keys, delay_ms }),
        2 => (0..KEY_SPACE, delay_ms(), any::<bool>()).prop_map(|(key, delay_ms, new_payload)| {
            Op::Reschedule { key, delay_ms, new_payload }
        }),
        4 => (0..KEY_SPACE).prop_map(|key| Op::Cancel { key }),
        6 => prop_oneof![8 => 1..=50u64, 2 => 1_000..=60_000u64, 1 => 1..=LONG_MS]
            .prop_map(|ms| Op::Advance { ms }),
        1 => prop_oneof![-3_600_000..=3_600_000i64, -5..=5i64].prop_map(|ms| Op::StepWall { ms }),
        3 => any::<usize>().prop_map(|pick| Op::Ack { pick, fresh: true }),
        1 => any::<usize>().prop_map(|pick| Op::Ack { pick, fresh: false }),
        2 => (any::<usize>(), any::<bool>(), delay_ms(), any::<bool>()).prop_map(
            |(pick, fresh, delay_ms, new_payload)| Op::AckAndSchedule { pick, fresh, delay_ms, new_payload }
        ),
        2 => (
            proptest::collection::vec(any::<usize>(), 1..=4),
            prop_oneof![3 => Just(None), 1 => any::<bool>().prop_map(Some)],
        )
            .prop_map(|(picks, spoil)| Op::AckMany { picks, spoil }),
        2 => (any::<usize>(), prop_oneof![2 => Just(None), 1 => (0..=40u64).prop_map(Some)])
            .prop_map(|(pick, retry_after_ms)| Op::Nack { pick, retry_after_ms }),
        1 => (any::<usize>(), 1..=200u64).prop_map(|(pick, lease_ms)| Op::ExtendLease { pick, lease_ms }),
        1 => Just(Op::Reopen),
        1 => Just(Op::Pause),
        2 => Just(Op::Resume),
        1 => Just(Op::ProcessCrash),
        1 => Just(Op::PowerCut),
        1 => Just(Op::SyncThenPowerCut),
        1 => prop_oneof![
            2 => Just(None),
            1 => Just(Some(Restart::Reopen)),
            1 => Just(Some(Restart::ProcessCrash)),
            1 => Just(Some(Restart::PowerCut)),
        ]
        .prop_map(|then| Op::Checkpoint { then }),
    ]
}

/// The engine configurations the model runs against.
#[derive(Debug, Clone, Copy)]
struct Setup {
    tick_ms: u64,
    durability: Durability,
    lease_ms: u64,
    max_attempts: u32,
}

fn setup() -> impl Strategy<Value = Setup> {
    // Coarse ticks divide the clock's start time, so the first open is on a tick boundary.
    let tick_ms = prop_oneof![4 => Just(1u64), 1 => Just(8u64), 1 => Just(10u64)];
    let durability = prop_oneof![
        4 => Just(Durability::Sync),
        1 => Just(Durability::Buffered),
        1 => Just(Durability::Interval(Duration::from_millis(1))),
    ];
    let lease_ms = prop_oneof![2 => Just(30u64), 1 => Just(5_000u64), 1 => Just(30_000u64)];
    (tick_ms, durability, lease_ms, 1..=3u32).prop_map(
        |(tick_ms, durability, lease_ms, max_attempts)| Setup {
            tick_ms,
            durability,
            lease_ms,
            max_attempts,
        },
    )
}

impl Setup {
    fn config(&self) -> Config {
        let mut config = Config::default();
        config.segment_bytes = SMALL_SEGMENT_BYTES;
        config.durability = self.durability;
        config.tick = Duration::from_millis(self.tick_ms);
        config.lease = Duration::from_millis(self.lease_ms);
        let mut retry = RetryPolicy::default();
        retry.max_attempts = self.max_attempts;
        retry.backoff_initial = Duration::from_millis(5);
        retry.backoff_max = Duration::from_secs(2);
        config.retry = retry;
        // Checkpoints are operations of the sequence, never background work.
        config.checkpoint_log_bytes = None;
        config.checkpoint_interval = None;
        config.payload_prefetch = false;
        // The whole 18-day horizon resident, as before the resident window
        // existed: with a 1-minute span, wall steps back make checkpoints
        // compact tasks into far ones in ways this model does not follow
        // (which overflow file a payload is in, and which files a
        // checkpoint compacts). tests/resident_window.rs, tests/far*.rs and
        // the simulation (half its far spans set as a resident window)
        // cover far tasks.
        config.resident_window = None;
        config
    }
}

/// A lease the model knows a consumer holds.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// Monotonic time (ms) at which its expiry fires.
    fire_mono_ms: u64,
    /// Order of entering the wheel (FIFO among equal deadlines).
    rank: u64,
}

#[derive(Debug, Clone)]
struct ModelTask {
    id: u64,
    /// Scheduling order: ids are assigned in this order.
    seq: u64,
    due_ms: u64,
    payload: Vec<u8>,
    /// Deliveries so far.
    deliveries: u32,
    /// Monotonic time (ms) at which it fires: the start of its deadline's tick, fixed when it
    /// enters the wheel. Meaningless while in flight.
    fire_mono_ms: u64,
    /// Order of entering the wheel: FIFO among equal deadlines.
    rank: u64,
    /// Held by a consumer (attempt `deliveries`), with this lease.
    lease: Option<Lease>,
    /// Out of the wheel, beyond the horizon (a checkpoint moved it to an
    /// overflow file); its fire time is fixed again when it is promoted.
    far: bool,
    /// Far in the newest checkpoint, and no record logged for it since
    /// (a promotion logs nothing): an open starts it far again.
    far_at_checkpoint: bool,
    /// Its payload is in an overflow file: `Some(true)` if that entry's due
    /// time is still the task's (a checkpoint can then make it far in
    /// place), `Some(false)` if not (or not known, after a reopen).
    on_disk: Option<bool>,
}

/// A task cancelled while a consumer held it: the holder may still ack or nack it.
#[derive(Debug, Clone)]
struct Abandoned {
    attempt: u32,
    lease: Lease,
}

/// A dead letter as the model expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dead {
    key: Vec<u8>,
    payload: Vec<u8>,
    attempts: u32,
    error: String,
}

/// The reference queue and the clock as the engine sees it.
#[derive(Debug)]
struct Model {
    tasks: BTreeMap<Vec<u8>, ModelTask>,
    abandoned: BTreeMap<u64, Abandoned>,
    dead: BTreeMap<u64, Dead>,
    next_seq: u64,
    next_rank: u64,
    wall_ms: u64,
    mono_ms: u64,
    /// Monotonic time at which the running engine opened: its tick 0.
    origin_ms: u64,
    tick_ms: u64,
    lease_ms: u64,
    retry: RetryPolicy,
    /// `Config::far_span` (the resident window, by default) and
    /// `Config::payload_window`, ms.
    horizon_ms: u64,
    window_ms: u64,
    /// Monotonic ms of the start of the tick the wheel has reached (its
    /// last driver pass): a task placed at or before it is overdue.
    elapsed_mono_ms: u64,
    /// Deliveries paused: a pass only promotes far tasks (the wheel stands
    /// still), and a task due at once waits in the overdue queue, which the
    /// resume hands out before the wheel's.
    paused: bool,
}

/// What a delivery must look like: key, payload, due time, attempt, hand-out time.
type Expected = (Vec<u8>, Vec<u8>, u64, u32, u64);

fn observed(ds: &[Delivery]) -> Vec<Expected> {
    ds.iter()
        .map(|d| {
            (
                d.key().to_vec(),
                d.payload().to_vec(),
                d.due_ms(),
                d.attempt(),
                d.fired_ms(),
            )
        })
        .collect()
}

/// What acting on a delivery must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Held, task live.
    Live,
    /// Held, task cancelled meanwhile (abandoned).
    Abandoned,
    /// Refused: `LeaseExpired`.
    Expired,
    /// Refused: `NotOutstanding`.
    NotOutstanding,
}

impl Model {
    fn new(wall_ms: u64, setup: &Setup) -> Model {
        Model {
            tasks: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            dead: BTreeMap::new(),
            next_seq: 0,
            next_rank: 0,
            wall_ms,
            mono_ms: 0,
            origin_ms: 0,
            tick_ms: setup.tick_ms,
            lease_ms: setup.lease_ms,
            retry: setup.config().retry,
            horizon_ms: millis(setup.config().far_span()),
            window_ms: millis(setup.config().payload_window),
            elapsed_mono_ms: 0,
            paused: false,
        }
    }

    /// A checkpoint: payloads of waiting tasks due after the payload window
    /// go to disk; first attempts due beyond the horizon leave the wheel.
    fn checkpoint(&mut self) {
        let (wall, window, horizon) = (self.wall_ms, self.window_ms, self.horizon_ms);
        for t in self.tasks.values_mut() {
            if t.far || t.lease.is_some() || t.due_ms <= wall.saturating_add(window) {
                continue;
            }
            let far = t.deliveries == 0 && t.due_ms > wall.saturating_add(horizon);
            match t.on_disk {
                None if far => t.far = true,
                None if !t.payload.is_empty() => t.on_disk = Some(true),
                Some(true) if far => t.far = true,
                _ => {}
            }
        }
        for t in self.tasks.values_mut() {
            t.far_at_checkpoint = t.far;
        }
    }

    /// A driver pass promotes the far tasks now within the horizon, in (due,
    /// id) order: each enters the wheel at its due time mapped by the clocks
    /// of now — even a past one, as long as the wheel has not reached its
    /// tick (it then expires in order with the others); one due before the
    /// wheel's tick is overdue, handed out first.
    fn promote(&mut self) {
        let until = self.wall_ms.saturating_add(self.horizon_ms);
        let mut due: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.far && t.due_ms <= until)
            .map(|(k, t)| (t.due_ms, t.seq, k.clone()))
            .collect();
        due.sort();
        for (due_ms, _, k) in due {
            let rank = self.rank();
            let fire = self.wheel_or_overdue(self.mapped_fire_ms(due_ms));
            let on_disk = (due_ms > self.wall_ms.saturating_add(self.window_ms)).then_some(true);
            let t = self.tasks.get_mut(&k).expect("listed from the map");
            t.far = false;
            t.on_disk = on_disk;
            t.fire_mono_ms = fire;
            t.rank = rank;
        }
    }

    fn rank(&mut self) -> u64 {
        self.next_rank += 1;
        self.next_rank
    }

    /// When a task due at `due_ms` fires if placed now: at the start of the first tick at or
    /// after its due time; `None` if it is due already (it fires at once).
    fn fire_time(&self, due_ms: u64) -> Option<u64> {
        if due_ms <= self.wall_ms {
            return None;
        }
        let due_since_origin = self.mono_ms - self.origin_ms + due_ms - self.wall_ms;
        Some(self.origin_ms + due_since_origin.div_ceil(self.tick_ms) * self.tick_ms)
    }

    /// The fire time of a task due at once (at `due_ms`, past): now; while
    /// paused, its own tick (the current one at the latest), in due order
    /// with the tasks that fell due during the pause and wait in the
    /// stand-still wheel — or 0 if that tick is not after the wheel's (the
    /// overdue queue, handed out ahead of them all).
    fn overdue_fire_ms(&self, due_ms: u64) -> u64 {
        if !self.paused {
            return self.mono_ms;
        }
        let now_tick_start =
            self.origin_ms + (self.mono_ms - self.origin_ms) / self.tick_ms * self.tick_ms;
        self.wheel_or_overdue(self.mapped_fire_ms(due_ms).min(now_tick_start))
    }

    /// The start of the tick of wall time `due_ms` by the clocks of now, even
    /// when it is past (the engine's `mapped_tick`; the tick of the open at
    /// the earliest).
    fn mapped_fire_ms(&self, due_ms: u64) -> u64 {
        let since_origin = (self.mono_ms - self.origin_ms + due_ms).saturating_sub(self.wall_ms);
        self.origin_ms + since_origin.div_ceil(self.tick_ms) * self.tick_ms
    }

    /// `fire` if the wheel takes it (after the tick it has reached), else 0:
    /// the overdue queue, handed out before the wheel's.
    fn wheel_or_overdue(&self, fire: u64) -> u64 {
        if fire > self.elapsed_mono_ms {
            fire
        } else {
            0
        }
    }

    /// A lease taken now: its expiry fires at the first tick that starts `lease_ms` or more
    /// from now (a lease never ends early).
    fn lease_now(&mut self, lease_ms: u64) -> Lease {
        let end_tick = (self.mono_ms - self.origin_ms + lease_ms).div_ceil(self.tick_ms);
        Lease {
            fire_mono_ms: self.origin_ms + end_tick * self.tick_ms,
            rank: self.rank(),
        }
    }

    /// Adds a scheduled task; returns whether it is overdue (due now or before).
    fn add(&mut self, key: Vec<u8>, id: u64, due_ms: u64, payload: Vec<u8>) -> bool {
        let seq = self.next_seq;
        self.next_seq += 1;
        let rank = self.rank();
        let fire = self.fire_time(due_ms);
        let task = ModelTask {
            id,
            seq,
            due_ms,
            payload,
            deliveries: 0,
            fire_mono_ms: fire.unwrap_or(self.overdue_fire_ms(due_ms)),
            rank,
            lease: None,
            far: false,
            far_at_checkpoint: false,
            on_disk: None,
        };
        assert!(self.tasks.insert(key, task).is_none());
        fire.is_none()
    }

    /// Puts a waiting task back in the wheel at `due_ms` (retry or reschedule).
    fn place(&mut self, key: &[u8], due_ms: u64) {
        let rank = self.rank();
        let fire = self
            .fire_time(due_ms)
            .unwrap_or(self.overdue_fire_ms(due_ms));
        let t = self.tasks.get_mut(key).expect("placed task is live");
        t.due_ms = due_ms;
        t.fire_mono_ms = fire;
        t.rank = rank;
        t.lease = None;
    }

    /// Hands out every waiting task matching `pick` in the order given by `order`, raising
    /// its delivery count, and returns what the engine must deliver (and the consumer then
    /// leases, in this order).
    fn hand_out<O: Ord>(
        &mut self,
        pick: impl Fn(&[u8], &ModelTask) -> bool,
        order: impl Fn(&ModelTask) -> O,
    ) -> Vec<Expected> {
        let mut chosen: Vec<(O, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(k, t)| t.lease.is_none() && pick(k, t))
            .map(|(k, t)| (order(t), k.clone()))
            .collect();
        chosen.sort_by(|a, b| a.0.cmp(&b.0));
        let now = self.wall_ms;
        let lease_ms = self.lease_ms;
        chosen
            .into_iter()
            .map(|(_, k)| {
                let lease = self.lease_now(lease_ms);
                let t = self.tasks.get_mut(&k).expect("chosen from the map");
                t.deliveries += 1;
                t.far_at_checkpoint = false;
                t.lease = Some(lease);
                t.on_disk = None;
                (k, t.payload.clone(), t.due_ms, t.deliveries, now)
            })
            .collect()
    }

    /// A failed attempt of the held task `key` (nack, or lease expiry): retry at the backoff
    /// (or `retry_after_ms`), or a dead letter once its attempts are used up.
    fn fail(&mut self, key: &[u8], retry_after_ms: Option<u64>, error: &str) -> NackOutcome {
        let t = self.tasks[key].clone();
        if t.deliveries >= self.retry.max_attempts {
            self.tasks.remove(key);
            self.dead.insert(
                t.id,
                Dead {
                    key: key.to_vec(),
                    payload: t.payload,
                    attempts: t.deliveries,
                    error: error.to_string(),
                },
            );
            return NackOutcome::DeadLettered;
        }
        let delay_ms = retry_after_ms.unwrap_or_else(|| {
            let d = self.retry.backoff(t.id, t.deliveries);
            u64::try_from(d.as_nanos().div_ceil(1_000_000)).expect("small backoff")
        });
        let due_ms = self.wall_ms + delay_ms;
        self.place(key, due_ms);
        NackOutcome::Retry {
            next_attempt: t.deliveries + 1,
            due: ms_to_system_time(due_ms),
        }
    }

    /// One driver pass after a clock move: hands out waiting tasks whose deadline has come (in
    /// deadline order, FIFO among equal deadlines) and expires leases whose deadline has come.
    fn pass(&mut self) -> Vec<Expected> {
        self.promote();
        if self.paused {
            return Vec::new();
        }
        let mono = self.mono_ms;
        // A far task is out of the wheel: its fire time is set when it is
        // promoted (a wall step back after it was scheduled can leave an
        // old one behind it).
        let handed = self.hand_out(
            |_, t| !t.far && t.fire_mono_ms <= mono,
            |t| (t.fire_mono_ms, t.rank),
        );
        // Leases just taken (by `hand_out`) cannot have expired: they end after `mono`.
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
        let error = format!(
            "lease expired without ack or nack (Config::lease is {} ms)",
            self.lease_ms
        );
        for (_, _, k) in expired {
            self.fail(&k, None, &error);
        }
        self.abandoned.retain(|_, a| a.lease.fire_mono_ms > mono);
        self.elapsed_mono_ms =
            self.origin_ms + (mono - self.origin_ms) / self.tick_ms * self.tick_ms;
        handed
    }

    /// An ack of the held delivery `d`: its task is finished (the key may belong to a new
    /// task by now if `d`'s was cancelled in flight).
    fn finish(&mut self, d: &Delivery) {
        if self.abandoned.remove(&d.task_id().0).is_none() {
            self.tasks.remove(d.key());
        }
    }

    /// What acting on delivery `d` of the running incarnation must answer.
    fn held(&self, d: &Delivery, current: bool) -> Held {
        if !current {
            return Held::NotOutstanding;
        }
        let id = d.task_id().0;
        // A lease past its deadline by the clock is over for its holder even
        // before the driver processes it (it does not while paused).
        let lapsed = |l: &Lease| l.fire_mono_ms <= self.mono_ms;
        if let Some(a) = self.abandoned.get(&id) {
            return match a.attempt == d.attempt() {
                true if lapsed(&a.lease) => Held::NotOutstanding,
                true => Held::Abandoned,
                false => Held::Expired,
            };
        }
        match self.tasks.get(d.key()) {
            Some(t) if t.id == id => match t.lease {
                Some(l) if t.deliveries == d.attempt() && lapsed(&l) => {
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

    /// A new engine incarnation starts its tick grid at the moment of opening, which `run`
    /// keeps on a wall-clock tick boundary (see `align_for_open`).
    fn open(&mut self) {
        assert_eq!(self.wall_ms % self.tick_ms, 0, "open off a tick boundary");
        // The engine's config does not open it paused.
        self.paused = false;
        self.origin_ms = self.mono_ms;
        self.elapsed_mono_ms = self.mono_ms;
    }

    /// Moves both clocks to the next wall-clock tick boundary (while the engine is stopped).
    ///
    /// Why: with a coarse tick, the engine hands out a due time inside the current tick only
    /// at the tick's end (see `tests/time.rs`), so the model keeps opens on a boundary and
    /// past due times a whole tick back, where every reading of the README agrees.
    fn align_for_open(&mut self, clock: &kairos::ManualClock) {
        let by = (self.tick_ms - self.wall_ms % self.tick_ms) % self.tick_ms;
        clock.advance(Duration::from_millis(by));
        self.wall_ms += by;
        self.mono_ms += by;
    }

    /// The engine stopped: leases end, tasks cancelled in flight are finished, tasks in flight
    /// are retried (their interrupted attempt counts) or dead-lettered. Returns the keys to
    /// redeliver at open and the number dead-lettered.
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
            let t = self.tasks.get_mut(&k).expect("listed from the map");
            t.lease = None;
            if t.deliveries >= self.retry.max_attempts {
                let t = self.tasks.remove(&k).expect("listed from the map");
                self.dead.insert(
                    t.id,
                    Dead {
                        key: k,
                        payload: t.payload,
                        attempts: t.deliveries,
                        error: "in flight when the engine stopped (lease lost in a restart)".into(),
                    },
                );
                dead += 1;
            } else {
                // Handed out at open whatever its due time (a wall step may have moved it
                // into the future).
                redelivered.push(k);
            }
        }
        (redelivered, dead)
    }

    /// What an open hands out at once (tasks in flight before, and overdue tasks, oldest
    /// first), after re-placing every other task by the wall clock. Call after
    /// [`Model::open`].
    fn reopen(&mut self, overdue_keys: &[Vec<u8>]) -> Vec<Expected> {
        // Far tasks within the horizon are placed with the others; where an
        // entry's due time stands is no longer known.
        let until = self.wall_ms.saturating_add(self.horizon_ms);
        for t in self.tasks.values_mut() {
            // The open starts from the checkpoint: a task far there and
            // untouched since is far again, even if promoted meanwhile.
            if t.far_at_checkpoint && t.lease.is_none() {
                t.far = true;
            }
            if t.far && t.due_ms <= until {
                t.far = false;
                t.on_disk = Some(true);
            }
            if !t.far && t.on_disk.is_some() {
                t.on_disk = Some(false);
            }
        }
        let expected = self.hand_out(
            |k, _| overdue_keys.iter().any(|o| o == k),
            |t| (t.due_ms, t.seq),
        );
        let mut waiting: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.lease.is_none() && !t.far)
            .map(|(k, t)| (t.due_ms, t.seq, k.clone()))
            .collect();
        waiting.sort();
        for (_, _, k) in waiting {
            let due_ms = self.tasks[&k].due_ms;
            assert!(self.fire_time(due_ms).is_some(), "not overdue at open");
            self.place(&k, due_ms);
        }
        expected
    }

    fn scheduled(&self) -> usize {
        self.tasks.values().filter(|t| t.lease.is_none()).count()
    }

    fn in_flight(&self) -> usize {
        self.tasks.values().filter(|t| t.lease.is_some()).count() + self.abandoned.len()
    }
}

/// A configured duration in ms (`None`: never).
fn millis(d: Option<Duration>) -> u64 {
    d.map_or(u64::MAX, |d| d.as_millis() as u64)
}

fn key_bytes(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn payload_for(seq: u64, len: usize) -> Vec<u8> {
    let mut p = format!("payload-{seq}:").into_bytes();
    p.extend((0..len).map(|i| (seq as usize + i) as u8));
    p
}

fn check(what: &str, got: &[Delivery], expected: &[Expected]) -> Result<(), String> {
    if observed(got) == expected {
        Ok(())
    } else {
        Err(format!(
            "{what} differ:\n  got      {:?}\n  expected {expected:?}",
            observed(got)
        ))
    }
}

/// Every delivery made so far and whether it is from the running incarnation.
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

    /// The delivery a `pick` byte chooses — among those held now if `fresh`, else among all
    /// ever made — with what acting on it must answer; `None` if there is none to choose.
    fn pick(&self, model: &Model, pick: usize, fresh: bool) -> Option<(Delivery, Held)> {
        let candidates: Vec<usize> = if fresh {
            self.held(model)
        } else {
            (0..self.all.len()).collect()
        };
        let i = *candidates.get(pick % candidates.len().max(1))?;
        Some((self.all[i].0.clone(), self.status(model, i)))
    }

    /// Indices of deliveries the model says are held now.
    fn held(&self, model: &Model) -> Vec<usize> {
        (0..self.all.len())
            .filter(|&i| {
                matches!(
                    model.held(&self.all[i].0, self.all[i].1 == self.incarnation),
                    Held::Live | Held::Abandoned
                )
            })
            .collect()
    }

    fn status(&self, model: &Model, i: usize) -> Held {
        model.held(&self.all[i].0, self.all[i].1 == self.incarnation)
    }
}

fn expected_refusal(held: Held, got: &Result<impl std::fmt::Debug, AckError>) -> bool {
    match held {
        Held::Expired => matches!(got, Err(AckError::LeaseExpired { .. })),
        Held::NotOutstanding => matches!(got, Err(AckError::NotOutstanding { .. })),
        Held::Live | Held::Abandoned => false,
    }
}

/// Runs one operation sequence against engine and model; an `Err` names the failing step.
fn run(seed: u64, setup: Setup, ops: &[Op]) -> TestResult {
    let mut h = SimHarness::new(seed, setup.config())?;
    let mut model = Model::new(h.clock.wall_ms(), &setup);
    let mut ds = Deliveries::default();
    // LSN of the newest checkpoint.
    let mut checkpoint_lsn = 0;

    for (step, op) in ops.iter().enumerate() {
        // Every other step's schedule, reschedule, cancel, ack, nack and ack_and_schedule go
        // through the async calls, which must answer exactly as the blocking ones.
        let via_async = step % 2 == 1;
        let at =
            |what: String| -> common::BoxError { format!("step {step} {op:?}: {what}").into() };
        let now_ms = h.clock.wall_ms();
        let mut restart = None;
        match op {
            Op::Schedule {
                key,
                when,
                payload_bytes,
            } => {
                let k = key_bytes(*key);
                let p = payload_for(model.next_seq, *payload_bytes);
                // Past or present due times lie a whole tick back (see `align_for_open`).
                let tick = setup.tick_ms as i64;
                let when = match *when {
                    When::After(0) if tick > 1 => When::At(-tick),
                    When::At(o) if tick > 1 && o > -tick && o <= 0 => When::At(o - tick),
                    w => w,
                };
                let (due, due_ms) = match when {
                    When::After(ms) => (Due::After(Duration::from_millis(ms)), now_ms + ms),
                    When::At(offset) => {
                        let due_ms = now_ms.saturating_add_signed(offset);
                        (Due::At(ms_to_system_time(due_ms)), due_ms)
                    }
                };
                let got = if via_async {
                    block_on(h.engine().schedule_async(&k, due, &p))
                } else {
                    h.engine().schedule(&k, due, &p)
                };
                if model.tasks.contains_key(&k) {
                    if !matches!(got, Err(ScheduleError::AlreadyExists { .. })) {
                        return Err(at(format!("expected AlreadyExists, got {got:?}")));
                    }
                } else {
                    let id = got.map_err(|e| at(format!("schedule failed: {e}")))?;
                    if model.add(k, id.0, due_ms, p) {
                        // Due already: handed out at once, without a clock move.
                        let got = drain(h.engine())?;
                        check("overdue deliveries", &got, &model.pass()).map_err(at)?;
                        ds.add(got);
                    }
                }
            }
            Op::ScheduleBatch { keys, delay_ms } => {
                let ks: Vec<Vec<u8>> = keys.iter().map(|k| key_bytes(*k)).collect();
                let ps: Vec<Vec<u8>> = (0..ks.len())
                    .map(|i| payload_for(model.next_seq + i as u64, i * 5))
                    .collect();
                let batch: Vec<NewTask<'_>> = ks
                    .iter()
                    .zip(&ps)
                    .map(|(k, p)| NewTask {
                        key: k,
                        due: Due::After(Duration::from_millis(*delay_ms)),
                        payload: p,
                    })
                    .collect();
                let got = if via_async {
                    block_on(h.engine().schedule_many_async(&batch))
                } else {
                    h.engine().schedule_many(&batch)
                };
                let mut distinct = ks.clone();
                distinct.sort();
                distinct.dedup();
                if distinct.len() != ks.len() {
                    if !matches!(got, Err(ScheduleError::DuplicateKeyInBatch { .. })) {
                        return Err(at(format!("expected DuplicateKeyInBatch, got {got:?}")));
                    }
                } else if ks.iter().any(|k| model.tasks.contains_key(k)) {
                    if !matches!(got, Err(ScheduleError::AlreadyExists { .. })) {
                        return Err(at(format!("expected AlreadyExists, got {got:?}")));
                    }
                } else {
                    let ids = got.map_err(|e| at(format!("batch failed: {e}")))?;
                    if ids.len() != ks.len() || ids.windows(2).any(|w| w[0] >= w[1]) {
                        return Err(at(format!("ids not increasing: {ids:?}")));
                    }
                    for ((k, p), id) in ks.into_iter().zip(ps).zip(ids) {
                        let overdue = model.add(k, id.0, now_ms + delay_ms, p);
                        assert!(!overdue, "a batch is due at least 1 ms ahead");
                    }
                }
            }
            Op::Reschedule {
                key,
                delay_ms,
                new_payload,
            } => {
                let k = key_bytes(*key);
                let p = payload_for(model.next_seq, 3);
                let payload = new_payload.then_some(p.as_slice());
                let due = Due::After(Duration::from_millis(*delay_ms));
                let got = if via_async {
                    block_on(h.engine().reschedule_async(&k, due, payload))
                } else {
                    h.engine().reschedule(&k, due, payload)
                };
                let due_ms = now_ms + delay_ms;
                match model.tasks.get(&k).map(|t| (t.id, t.lease.is_some())) {
                    Some((_, true)) => {
                        if !matches!(got, Err(ScheduleError::InFlight { .. })) {
                            return Err(at(format!("expected InFlight, got {got:?}")));
                        }
                    }
                    Some((id, false)) => {
                        if got.as_ref().ok()
                            != Some(&RescheduleOutcome::Rescheduled(kairos::TaskId(id)))
                        {
                            return Err(at(format!("expected Rescheduled({id}), got {got:?}")));
                        }
                        let t = model.tasks.get_mut(&k).expect("live");
                        match payload {
                            Some(p) => {
                                t.payload = p.to_vec();
                                t.on_disk = None;
                            }
                            None if t.far || t.on_disk.is_some() => t.on_disk = Some(false),
                            None => {}
                        }
                        t.far = false;
                        t.far_at_checkpoint = false;
                        model.place(&k, due_ms);
                    }
                    None => match got {
                        Ok(RescheduleOutcome::Scheduled(id)) => {
                            model.add(k, id.0, due_ms, payload.unwrap_or(&[]).to_vec());
                        }
                        other => return Err(at(format!("expected Scheduled, got {other:?}"))),
                    },
                }
            }
            Op::Cancel { key } => {
                let k = key_bytes(*key);
                let expected = match model.tasks.get(&k) {
                    None => CancelOutcome::NotFound,
                    Some(t) if t.lease.is_none() => CancelOutcome::Cancelled {
                        deliveries: t.deliveries,
                    },
                    Some(t) => CancelOutcome::AlreadyDelivered {
                        attempt: t.deliveries,
                    },
                };
                let got = if via_async {
                    block_on(h.engine().cancel_async(&k))
                } else {
                    h.engine().cancel(&k)
                }
                .map_err(|e| at(format!("cancel failed: {e}")))?;
                if got != expected {
                    return Err(at(format!(
                        "cancel returned {got:?}, model says {expected:?}"
                    )));
                }
                if let Some(t) = model.tasks.remove(&k) {
                    if let Some(lease) = t.lease {
                        model.abandoned.insert(
                            t.id,
                            Abandoned {
                                attempt: t.deliveries,
                                lease,
                            },
                        );
                    }
                }
            }
            Op::Advance { ms } => {
                let got = h.advance(Duration::from_millis(*ms))?;
                model.wall_ms += ms;
                model.mono_ms += ms;
                check("deliveries", &got, &model.pass()).map_err(at)?;
                ds.add(got);
            }
            Op::StepWall { ms } => {
                h.clock.step_wall(*ms);
                model.wall_ms = model.wall_ms.saturating_add_signed(*ms);
                // The driver's pass promotes the far tasks now within the
                // far span; one a forward step made overdue is handed out in
                // it (nothing else is due: the monotonic clock stood still).
                let got = drain(h.engine())?;
                check("deliveries after a wall step", &got, &model.pass()).map_err(at)?;
                ds.add(got);
            }
            Op::Ack { pick, fresh } => {
                let Some((d, held)) = ds.pick(&model, *pick, *fresh) else {
                    continue;
                };
                let got = if via_async {
                    block_on(h.engine().ack_async(&d))
                } else {
                    h.engine().ack(&d)
                };
                match held {
                    Held::Live | Held::Abandoned => {
                        got.map_err(|e| at(format!("ack of {d:?} failed: {e}")))?;
                        model.finish(&d);
                    }
                    refused if expected_refusal(refused, &got) => {}
                    refused => {
                        return Err(at(format!("ack of {d:?} ({refused:?}) returned {got:?}")))
                    }
                }
            }
            Op::AckAndSchedule {
                pick,
                fresh,
                delay_ms,
                new_payload,
            } => {
                let Some((d, held)) = ds.pick(&model, *pick, *fresh) else {
                    continue;
                };
                let p = if *new_payload {
                    payload_for(model.next_seq, 11)
                } else {
                    d.payload().to_vec()
                };
                let due = Due::After(Duration::from_millis(*delay_ms));
                let got = if via_async {
                    block_on(h.engine().ack_and_schedule_async(&d, due, &p))
                } else {
                    h.engine().ack_and_schedule(&d, due, &p)
                };
                match (held, got) {
                    (Held::Live, Ok(AckScheduleOutcome::Scheduled(id))) => {
                        model.finish(&d);
                        if model.add(d.key().to_vec(), id.0, now_ms + delay_ms, p) {
                            let got = drain(h.engine())?;
                            check("overdue deliveries", &got, &model.pass()).map_err(at)?;
                            ds.add(got);
                        }
                    }
                    (Held::Abandoned, Ok(AckScheduleOutcome::CancelledWhileHeld)) => {
                        model.finish(&d);
                    }
                    (refused, Err(AckScheduleError::Ack(e)))
                        if expected_refusal(refused, &Err::<(), _>(e.clone())) => {}
                    (held, got) => {
                        return Err(at(format!(
                            "ack_and_schedule of {d:?} ({held:?}) returned {got:?}"
                        )))
                    }
                }
            }
            Op::AckMany { picks, spoil } => {
                let held = ds.held(&model);
                if held.is_empty() {
                    continue;
                }
                let mut chosen: Vec<usize> = picks.iter().map(|p| held[p % held.len()]).collect();
                chosen.sort_unstable();
                chosen.dedup();
                let mut batch: Vec<Delivery> =
                    chosen.iter().map(|&i| ds.all[i].0.clone()).collect();
                let refused: Vec<usize> = (0..ds.all.len())
                    .filter(|&i| {
                        matches!(ds.status(&model, i), Held::Expired | Held::NotOutstanding)
                    })
                    .collect();
                let spoiled = match spoil {
                    Some(true) => {
                        batch.push(batch[0].clone());
                        true
                    }
                    Some(false) if !refused.is_empty() => {
                        let bad = refused[picks[0] % refused.len()];
                        batch.insert(batch.len() / 2, ds.all[bad].0.clone());
                        true
                    }
                    _ => false,
                };
                let got = if via_async {
                    block_on(h.engine().ack_many_async(&batch))
                } else {
                    h.engine().ack_many(&batch)
                };
                if spoiled {
                    if got.is_ok() {
                        return Err(at("spoiled ack_many succeeded".into()));
                    }
                } else {
                    got.map_err(|e| at(format!("ack_many failed: {e}")))?;
                    for d in &batch {
                        model.finish(d);
                    }
                }
            }
            Op::Nack {
                pick,
                retry_after_ms,
            } => {
                let held = ds.held(&model);
                if held.is_empty() {
                    continue;
                }
                let i = held[pick % held.len()];
                let d = ds.all[i].0.clone();
                let retry_after = retry_after_ms.map(Duration::from_millis);
                let got = if via_async {
                    block_on(h.engine().nack_async(&d, retry_after, NACK_ERROR))
                } else {
                    h.engine().nack(&d, retry_after, NACK_ERROR)
                };
                let expected = match ds.status(&model, i) {
                    Held::Abandoned => {
                        model.abandoned.remove(&d.task_id().0);
                        NackOutcome::Finished
                    }
                    _ => model.fail(d.key(), *retry_after_ms, NACK_ERROR),
                };
                if got.as_ref().ok() != Some(&expected) {
                    return Err(at(format!(
                        "nack of {d:?} returned {got:?}, model says {expected:?}"
                    )));
                }
                // A retry due now is handed out at once.
                let got = drain(h.engine())?;
                check("deliveries after a nack", &got, &model.pass()).map_err(at)?;
                ds.add(got);
            }
            Op::ExtendLease { pick, lease_ms } => {
                let held = ds.held(&model);
                if held.is_empty() {
                    continue;
                }
                let i = held[pick % held.len()];
                let d = ds.all[i].0.clone();
                h.engine()
                    .extend_lease(&d, Duration::from_millis(*lease_ms))
                    .map_err(|e| at(format!("extend_lease of {d:?} failed: {e}")))?;
                let lease = model.lease_now(*lease_ms);
                if let Some(a) = model.abandoned.get_mut(&d.task_id().0) {
                    a.lease = lease;
                } else if let Some(t) = model.tasks.get_mut(d.key()) {
                    t.lease = Some(lease);
                }
            }
            Op::Pause => {
                h.engine().pause_deliveries();
                model.paused = true;
                let got = drain(h.engine())?;
                check("deliveries after a pause", &got, &[]).map_err(at)?;
            }
            Op::Resume => {
                h.engine().resume_deliveries();
                model.paused = false;
                let got = drain(h.engine())?;
                check("deliveries at a resume", &got, &model.pass()).map_err(at)?;
                ds.add(got);
            }
            Op::Reopen => restart = Some(Restart::Reopen),
            Op::ProcessCrash => restart = Some(Restart::ProcessCrash),
            Op::PowerCut => restart = Some(Restart::PowerCut),
            Op::SyncThenPowerCut => {
                h.engine()
                    .sync()
                    .map_err(|e| at(format!("sync failed: {e}")))?;
                restart = Some(Restart::PowerCutAfterSync);
            }
            Op::Checkpoint { then } => {
                let report = h
                    .engine()
                    .checkpoint()
                    .map_err(|e| at(format!("checkpoint failed: {e}")))?;
                // Nothing written exactly when nothing was logged since the newest checkpoint
                // (they all succeed here, and each one is durable before it returns).
                let fits = report.lsn >= checkpoint_lsn
                    && report.written == (report.lsn != checkpoint_lsn)
                    && (!report.written
                        || (report.tasks == model.tasks.len() as u64
                            && report.dead_letters == model.dead.len() as u64));
                if !fits {
                    return Err(at(format!(
                        "checkpoint {report:?} after one at LSN {checkpoint_lsn}; model: {} \
                         live tasks, {} dead letters",
                        model.tasks.len(),
                        model.dead.len()
                    )));
                }
                checkpoint_lsn = report.lsn;
                if report.written {
                    model.checkpoint();
                }
                let got = drain(h.engine())?;
                check("deliveries after a checkpoint", &got, &[]).map_err(at)?;
                restart = *then;
            }
        }
        if let Some(restart) = restart {
            let how = match restart {
                Restart::Reopen => Stop::Clean,
                // Only `Sync` promises anything across a power cut.
                Restart::PowerCut if setup.durability == Durability::Sync => Stop::PowerCut,
                // Everything logged is durable: a power cut loses nothing in any mode.
                Restart::PowerCutAfterSync => Stop::PowerCut,
                _ => Stop::ProcessCrash,
            };
            h.stop(how)?;
            ds.incarnation += 1;
            let (redelivered, dead_lettered) = model.settle_after_stop();
            model.align_for_open(&h.clock);
            h.start()?;
            let recovery = h.engine().recovery().clone();
            model.open();
            let mut overdue_keys: Vec<Vec<u8>> = model
                .tasks
                .iter()
                .filter(|(k, t)| t.due_ms <= model.wall_ms && !redelivered.contains(k))
                .map(|(k, _)| k.clone())
                .collect();
            let overdue = overdue_keys.len();
            let redelivered_count = redelivered.len();
            overdue_keys.extend(redelivered);
            let redelivered = redelivered_count;
            if recovery.pending != model.tasks.len()
                || recovery.redelivered != redelivered
                || recovery.overdue != overdue
                || recovery.dead_lettered != dead_lettered
                || recovery.dead_letters != model.dead.len()
            {
                return Err(at(format!(
                    "recovery {recovery:?}, model: {} pending, {redelivered} redelivered, \
                         {overdue} overdue, {dead_lettered} dead-lettered, {} dead letters",
                    model.tasks.len(),
                    model.dead.len()
                )));
            }
            if how == Stop::Clean && !recovery.wal.clean_shutdown {
                return Err(at(format!("clean shutdown not reported: {recovery:?}")));
            }
            let got = drain(h.engine())?;
            check("deliveries at open", &got, &model.reopen(&overdue_keys)).map_err(at)?;
            ds.add(got);
        }
        let (entries, named) = h.engine().arena_entries_accounted();
        if entries != named {
            return Err(at(format!(
                "{entries} payload arena entries in use, {named} named by tasks: a leak"
            )));
        }
        let stats = h.engine().stats();
        if stats.scheduled != model.scheduled()
            || stats.in_flight != model.in_flight()
            || stats.ready != 0
            || stats.dead_letters != model.dead.len()
        {
            return Err(at(format!(
                "stats {stats:?}, model: {} scheduled, {} in flight, {} dead letters",
                model.scheduled(),
                model.in_flight(),
                model.dead.len()
            )));
        }
        // Every key looks up as the model has it (consumers have received
        // everything due, so no task is `Ready`).
        for key in 0..KEY_SPACE {
            let k = key_bytes(key);
            let expected = model.tasks.get(&k).map(|t| {
                (
                    t.id,
                    t.due_ms,
                    if t.lease.is_some() {
                        TaskState::Leased
                    } else {
                        TaskState::Scheduled
                    },
                    t.deliveries,
                )
            });
            let got = h
                .engine()
                .lookup(&k)?
                .map(|i| (i.id.0, i.due_ms, i.state, i.deliveries));
            if got != expected {
                return Err(at(format!(
                    "lookup of key {key}: {got:?}, model {expected:?}"
                )));
            }
        }
    }

    // The dead letters are exactly the model's.
    let dead: BTreeMap<u64, Dead> = h
        .engine()
        .dead_letters()
        .into_iter()
        .map(|d| {
            (
                d.task_id.0,
                Dead {
                    key: d.key,
                    payload: d.payload,
                    attempts: d.attempts,
                    error: d.error,
                },
            )
        })
        .collect();
    if dead != model.dead {
        return Err(format!("dead letters {dead:?}, model {:?}", model.dead).into());
    }
    if model.paused {
        h.engine().resume_deliveries();
        model.paused = false;
        let got = drain(h.engine())?;
        check("deliveries at the last resume", &got, &model.pass())?;
        ds.add(got);
    }
    // Finally, with every held delivery acked, every task still scheduled must come out, in
    // order, once the clock passes it.
    let held: Vec<Delivery> = ds
        .held(&model)
        .into_iter()
        .map(|i| ds.all[i].0.clone())
        .collect();
    h.engine().ack_many(&held)?;
    for d in &held {
        model.finish(d);
    }
    // Far tasks get their fire time when promoted: first bring them all
    // within the horizon.
    if let Some(far_due) = model
        .tasks
        .values()
        .filter(|t| t.far)
        .map(|t| t.due_ms)
        .max()
    {
        let by = far_due - model.horizon_ms - model.wall_ms + 1;
        let got = h.advance(Duration::from_millis(by))?;
        model.wall_ms += by;
        model.mono_ms += by;
        check("deliveries promoting the far tasks", &got, &model.pass())?;
        h.engine().ack_many(&got)?;
        for d in &got {
            model.finish(d);
        }
    }
    let last = model
        .tasks
        .values()
        .map(|t| t.fire_mono_ms)
        .max()
        .unwrap_or(0);
    let by = last.saturating_sub(model.mono_ms) + 1;
    let got = h.advance(Duration::from_millis(by))?;
    model.wall_ms += by;
    model.mono_ms += by;
    check("final deliveries", &got, &model.pass())?;
    if model.scheduled() != 0 {
        return Err("tasks left scheduled in the model".into());
    }
    h.stop(Stop::Clean)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256 * scale() as u32,
        max_shrink_iters: 4_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_reference_model_across_reopen_and_power_cut(
        seed in any::<u64>(),
        setup in setup(),
        ops in proptest::collection::vec(op(), 1..=(150 * scale().min(10))),
    ) {
        run(seed, setup, &ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

/// A fixed sequence that touches every operation, so a regression shows up even without the
/// random search.
#[test]
fn model_fixed_sequence_covers_every_operation() -> TestResult {
    use Op::*;
    let ops = vec![
        Schedule {
            key: 1,
            when: When::After(10),
            payload_bytes: 3,
        },
        Schedule {
            key: 2,
            when: When::After(10),
            payload_bytes: 0,
        },
        Schedule {
            key: 3,
            when: When::After(5),
            payload_bytes: 40,
        },
        Schedule {
            key: 1,
            when: When::After(1),
            payload_bytes: 1,
        },
        Schedule {
            key: 6,
            when: When::After(0),
            payload_bytes: 1,
        },
        Schedule {
            key: 7,
            when: When::At(-1_000),
            payload_bytes: 2,
        },
        ScheduleBatch {
            keys: vec![4, 5, 4],
            delay_ms: 7,
        },
        ScheduleBatch {
            keys: vec![4, 5, 2],
            delay_ms: 7,
        },
        ScheduleBatch {
            keys: vec![4, 5],
            delay_ms: 10,
        },
        Cancel { key: 5 },
        Cancel { key: 5 },
        Advance { ms: 10 },
        Cancel { key: 1 },
        Checkpoint { then: None },
        Checkpoint { then: None },
        Ack {
            pick: 0,
            fresh: true,
        },
        Ack {
            pick: 0,
            fresh: false,
        },
        AckAndSchedule {
            pick: 0,
            fresh: true,
            delay_ms: 15,
            new_payload: true,
        },
        AckAndSchedule {
            pick: 0,
            fresh: false,
            delay_ms: 3,
            new_payload: false,
        },
        Checkpoint {
            then: Some(Restart::PowerCut),
        },
        PowerCut,
        Ack {
            pick: 1,
            fresh: true,
        },
        Nack {
            pick: 0,
            retry_after_ms: None,
        },
        Nack {
            pick: 0,
            retry_after_ms: Some(0),
        },
        ExtendLease {
            pick: 0,
            lease_ms: 90,
        },
        Reschedule {
            key: 3,
            delay_ms: 20,
            new_payload: true,
        },
        Reschedule {
            key: 11,
            delay_ms: 20,
            new_payload: false,
        },
        Advance { ms: 40 },
        Schedule {
            key: 3,
            when: When::After(2_000),
            payload_bytes: 9,
        },
        Schedule {
            key: 8,
            when: When::After(LONG_MS),
            payload_bytes: 9,
        },
        StepWall { ms: -3_600_000 },
        Schedule {
            key: 9,
            when: When::After(1_000),
            payload_bytes: 9,
        },
        Reopen,
        Advance { ms: 1_999 },
        StepWall { ms: 7_200_000 },
        Advance { ms: 1 },
        Ack {
            pick: 3,
            fresh: false,
        },
        AckAndSchedule {
            pick: 1,
            fresh: true,
            delay_ms: 1_000,
            new_payload: false,
        },
        AckMany {
            picks: vec![0, 1],
            spoil: Some(true),
        },
        AckMany {
            picks: vec![1],
            spoil: Some(false),
        },
        AckMany {
            picks: vec![0, 1, 2],
            spoil: None,
        },
        Ack {
            pick: 0,
            fresh: true,
        },
        Advance { ms: 100 },
        Checkpoint {
            then: Some(Restart::Reopen),
        },
        Advance { ms: 100 },
        PowerCut,
        Reopen,
        Checkpoint {
            then: Some(Restart::ProcessCrash),
        },
        ProcessCrash,
        Advance { ms: LONG_MS },
    ];
    let setups = [
        Setup {
            tick_ms: 1,
            durability: Durability::Sync,
            lease_ms: 30,
            max_attempts: 3,
        },
        Setup {
            tick_ms: 10,
            durability: Durability::Buffered,
            lease_ms: 5_000,
            max_attempts: 1,
        },
        Setup {
            tick_ms: 8,
            durability: Durability::Interval(Duration::from_millis(1)),
            lease_ms: 30,
            max_attempts: 2,
        },
    ];
    for setup in setups {
        run(7, setup, &ops).map_err(|e| format!("{setup:?}: {e}"))?;
    }
    Ok(())
}
