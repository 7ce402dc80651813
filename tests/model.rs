//! Model-based property test: the engine against a `BTreeMap` reference queue, with clean
//! reopen and power cut as operations (mrecordlog's, sled's and redb's model tests).
//!
//! Each case runs a random sequence of operations — schedule (after a delay, or at an absolute
//! time that may be past), batch schedule, cancel, advance the clock (milliseconds to a year),
//! step the wall clock alone, ack, ack a stale delivery, clean reopen, power cut — on an
//! engine with `Durability::Sync` on `SimStorage` with tiny segments, and checks after every
//! step:
//!
//! * every outcome (ids aside) is exactly what the model predicts;
//! * the deliveries are exactly the tasks that fell due — keys, payloads, due times, attempts
//!   and hand-out times — in deadline order, FIFO among equal deadlines;
//! * after a reopen or a power cut, every task the model holds is still there (nothing
//!   acknowledged under `Sync` is lost), delivered-but-unacked tasks come again with
//!   `attempt + 1`, and `Engine::recovery()` counts them exactly.
//!
//! Time follows the README: firing follows the monotonic clock; a due time is converted with
//! the wall clock at the call and again at open, so a wall step moves no scheduled task until
//! the next open.

mod common;

use common::{drain, scale, SimHarness, Stop, TestResult, SMALL_SEGMENT_BYTES};
use kairos::clock::ms_to_system_time;
use kairos::{AckError, CancelOutcome, Config, Delivery, Due, Durability, NewTask, ScheduleError};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// Keys are drawn from a small set so that collisions, reuse after ack or cancel, and
/// cancels of delivered tasks all happen often.
const KEY_SPACE: u8 = 12;

/// About 463 days, in ms: past the wheel's coarse levels (2^36 ms ≈ 795 days is level 6).
const LONG_MS: u64 = 40_000_000_000;

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
    Cancel {
        key: u8,
    },
    Advance {
        ms: u64,
    },
    StepWall {
        ms: i64,
    },
    Ack {
        pick: usize,
    },
    AckStale {
        pick: usize,
    },
    /// `ack_many` of some outstanding deliveries; with `spoil`, one of them twice or a stale
    /// one too, so the whole call must fail and ack nothing.
    AckMany {
        picks: Vec<usize>,
        spoil: Option<bool>,
    },
    Reopen,
    ProcessCrash,
    PowerCut,
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
        4 => (0..KEY_SPACE).prop_map(|key| Op::Cancel { key }),
        6 => prop_oneof![8 => 1..=50u64, 2 => 1_000..=60_000u64, 1 => 1..=LONG_MS]
            .prop_map(|ms| Op::Advance { ms }),
        1 => prop_oneof![-3_600_000..=3_600_000i64, -5..=5i64].prop_map(|ms| Op::StepWall { ms }),
        3 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        1 => any::<usize>().prop_map(|pick| Op::AckStale { pick }),
        2 => (
            proptest::collection::vec(any::<usize>(), 1..=4),
            prop_oneof![3 => Just(None), 1 => any::<bool>().prop_map(Some)],
        )
            .prop_map(|(picks, spoil)| Op::AckMany { picks, spoil }),
        1 => Just(Op::Reopen),
        1 => Just(Op::ProcessCrash),
        1 => Just(Op::PowerCut),
    ]
}

/// The engine configurations the model runs against: tick and durability.
#[derive(Debug, Clone, Copy)]
struct Setup {
    tick_ms: u64,
    durability: Durability,
}

fn setup() -> impl Strategy<Value = Setup> {
    // Coarse ticks divide the clock's start time, so the first open is on a tick boundary.
    let tick_ms = prop_oneof![4 => Just(1u64), 1 => Just(8u64), 1 => Just(10u64)];
    let durability = prop_oneof![
        4 => Just(Durability::Sync),
        1 => Just(Durability::Buffered),
        1 => Just(Durability::Interval(Duration::from_millis(1))),
    ];
    (tick_ms, durability).prop_map(|(tick_ms, durability)| Setup {
        tick_ms,
        durability,
    })
}

#[derive(Debug, Clone)]
struct ModelTask {
    /// Scheduling order: ids are assigned in this order.
    seq: u64,
    due_ms: u64,
    payload: Vec<u8>,
    /// Deliveries so far; 0 = scheduled, else delivered and not acked.
    deliveries: u32,
    /// Monotonic time (ms) at which it fires: the start of its deadline's tick, fixed when it
    /// enters the wheel.
    fire_mono_ms: u64,
    /// Order of entering the wheel: FIFO among equal deadlines.
    rank: u64,
}

/// The reference queue and the clock as the engine sees it.
#[derive(Debug)]
struct Model {
    tasks: BTreeMap<Vec<u8>, ModelTask>,
    next_seq: u64,
    next_rank: u64,
    wall_ms: u64,
    mono_ms: u64,
    /// Monotonic time at which the running engine opened: its tick 0.
    origin_ms: u64,
    tick_ms: u64,
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

impl Model {
    fn new(wall_ms: u64, tick_ms: u64) -> Model {
        Model {
            tasks: BTreeMap::new(),
            next_seq: 0,
            next_rank: 0,
            wall_ms,
            mono_ms: 0,
            origin_ms: 0,
            tick_ms,
        }
    }

    /// When a task due at `due_ms` fires if scheduled now: at the start of the first tick at or
    /// after its due time; `None` if it is due already (it fires at once).
    fn fire_time(&self, due_ms: u64) -> Option<u64> {
        if due_ms <= self.wall_ms {
            return None;
        }
        let due_since_origin = self.mono_ms - self.origin_ms + due_ms - self.wall_ms;
        Some(self.origin_ms + due_since_origin.div_ceil(self.tick_ms) * self.tick_ms)
    }

    /// Adds a scheduled task; returns whether it is overdue (due now or before).
    fn add(&mut self, key: Vec<u8>, due_ms: u64, payload: Vec<u8>) -> bool {
        let seq = self.next_seq;
        self.next_seq += 1;
        let rank = self.next_rank;
        self.next_rank += 1;
        let fire = self.fire_time(due_ms);
        let task = ModelTask {
            seq,
            due_ms,
            payload,
            deliveries: 0,
            fire_mono_ms: fire.unwrap_or(self.mono_ms),
            rank,
        };
        assert!(self.tasks.insert(key, task).is_none());
        fire.is_none()
    }

    /// Hands out every task matching `pick` in the order given by `order`, raising its delivery
    /// count, and returns what the engine must deliver.
    fn hand_out<O: Ord>(
        &mut self,
        pick: impl Fn(&[u8], &ModelTask) -> bool,
        order: impl Fn(&ModelTask) -> O,
    ) -> Vec<Expected> {
        let mut chosen: Vec<(O, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(k, t)| pick(k, t))
            .map(|(k, t)| (order(t), k.clone()))
            .collect();
        chosen.sort_by(|a, b| a.0.cmp(&b.0));
        let now = self.wall_ms;
        chosen
            .into_iter()
            .map(|(_, k)| {
                let t = self.tasks.get_mut(&k).expect("chosen from the map");
                t.deliveries += 1;
                (k, t.payload.clone(), t.due_ms, t.deliveries, now)
            })
            .collect()
    }

    /// What a clock advance hands out: scheduled tasks whose monotonic deadline has come, in
    /// deadline order, FIFO among equal deadlines.
    fn fire_due(&mut self) -> Vec<Expected> {
        let mono = self.mono_ms;
        self.hand_out(
            |_, t| t.deliveries == 0 && t.fire_mono_ms <= mono,
            |t| (t.fire_mono_ms, t.rank),
        )
    }

    /// A new engine incarnation starts its tick grid at the moment of opening, which `run`
    /// keeps on a wall-clock tick boundary (see `align_for_open`).
    fn open(&mut self) {
        assert_eq!(self.wall_ms % self.tick_ms, 0, "open off a tick boundary");
        self.origin_ms = self.mono_ms;
    }

    /// Whether open hands a still-scheduled task out at once: it fell due while closed.
    fn overdue_at_open(&self, due_ms: u64) -> bool {
        due_ms <= self.wall_ms
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

    /// What an open hands out at once (unacked deliveries and overdue tasks, oldest first),
    /// after re-placing every other task by the wall clock. Call after [`Model::open`].
    fn reopen(&mut self) -> Vec<Expected> {
        let overdue: Vec<Vec<u8>> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.deliveries > 0 || self.overdue_at_open(t.due_ms))
            .map(|(k, _)| k.clone())
            .collect();
        let expected = self.hand_out(|k, _| overdue.iter().any(|o| o == k), |t| (t.due_ms, t.seq));
        let mut waiting: Vec<(u64, u64, Vec<u8>)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.deliveries == 0)
            .map(|(k, t)| (t.due_ms, t.seq, k.clone()))
            .collect();
        waiting.sort();
        for (_, _, k) in waiting {
            let rank = self.next_rank;
            self.next_rank += 1;
            let due_ms = self.tasks[&k].due_ms;
            let fire = self.fire_time(due_ms).expect("not overdue at open");
            let t = self.tasks.get_mut(&k).expect("listed from the map");
            t.fire_mono_ms = fire;
            t.rank = rank;
        }
        expected
    }

    fn scheduled(&self) -> usize {
        self.tasks.values().filter(|t| t.deliveries == 0).count()
    }
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

/// Runs one operation sequence against engine and model; an `Err` names the failing step.
fn run(seed: u64, setup: Setup, ops: &[Op]) -> TestResult {
    let mut config = Config::default();
    config.segment_bytes = SMALL_SEGMENT_BYTES;
    config.durability = setup.durability;
    config.tick = Duration::from_millis(setup.tick_ms);
    let mut h = SimHarness::new(seed, config)?;
    let mut model = Model::new(h.clock.wall_ms(), setup.tick_ms);
    // Deliveries of the running engine not yet acked, and deliveries that must be refused
    // (acked already, or from an earlier incarnation).
    let mut outstanding: Vec<Delivery> = Vec::new();
    let mut stale: Vec<Delivery> = Vec::new();

    for (step, op) in ops.iter().enumerate() {
        let at =
            |what: String| -> common::BoxError { format!("step {step} {op:?}: {what}").into() };
        let now_ms = h.clock.wall_ms();
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
                let got = h.engine().schedule(&k, due, &p);
                if model.tasks.contains_key(&k) {
                    if !matches!(got, Err(ScheduleError::AlreadyExists { .. })) {
                        return Err(at(format!("expected AlreadyExists, got {got:?}")));
                    }
                } else {
                    got.map_err(|e| at(format!("schedule failed: {e}")))?;
                    if model.add(k, due_ms, p) {
                        // Due already: handed out at once, without a clock move.
                        let ds = drain(h.engine())?;
                        check("overdue deliveries", &ds, &model.fire_due()).map_err(at)?;
                        outstanding.extend(ds);
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
                let got = h.engine().schedule_many(&batch);
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
                    for (k, p) in ks.into_iter().zip(ps) {
                        let overdue = model.add(k, now_ms + delay_ms, p);
                        assert!(!overdue, "a batch is due at least 1 ms ahead");
                    }
                }
            }
            Op::Cancel { key } => {
                let k = key_bytes(*key);
                let expected = match model.tasks.get(&k) {
                    None => CancelOutcome::NotFound,
                    Some(t) if t.deliveries == 0 => CancelOutcome::Cancelled,
                    Some(_) => CancelOutcome::AlreadyDelivered,
                };
                let got = h
                    .engine()
                    .cancel(&k)
                    .map_err(|e| at(format!("cancel failed: {e}")))?;
                if got != expected {
                    return Err(at(format!(
                        "cancel returned {got:?}, model says {expected:?}"
                    )));
                }
                if got == CancelOutcome::Cancelled {
                    model.tasks.remove(&k);
                }
            }
            Op::Advance { ms } => {
                let ds = h.advance(Duration::from_millis(*ms))?;
                model.wall_ms += ms;
                model.mono_ms += ms;
                check("deliveries", &ds, &model.fire_due()).map_err(at)?;
                outstanding.extend(ds);
            }
            Op::StepWall { ms } => {
                h.clock.step_wall(*ms);
                model.wall_ms = model.wall_ms.saturating_add_signed(*ms);
                let ds = drain(h.engine())?;
                check("deliveries after a wall step", &ds, &[]).map_err(at)?;
            }
            Op::Ack { pick } => {
                if outstanding.is_empty() {
                    continue;
                }
                let d = outstanding.remove(pick % outstanding.len());
                h.engine()
                    .ack(&d)
                    .map_err(|e| at(format!("ack of {d:?} failed: {e}")))?;
                model.tasks.remove(d.key());
                stale.push(d);
            }
            Op::AckStale { pick } => {
                if stale.is_empty() {
                    continue;
                }
                let d = &stale[pick % stale.len()];
                match h.engine().ack(d) {
                    Err(AckError::NotOutstanding { task_id }) if task_id == d.task_id().0 => {}
                    other => {
                        return Err(at(format!("stale ack of {d:?} returned {other:?}")));
                    }
                }
            }
            Op::AckMany { picks, spoil } => {
                if outstanding.is_empty() {
                    continue;
                }
                let mut chosen: Vec<usize> = picks.iter().map(|p| p % outstanding.len()).collect();
                chosen.sort_unstable();
                chosen.dedup();
                let mut batch: Vec<Delivery> =
                    chosen.iter().map(|&i| outstanding[i].clone()).collect();
                let spoiled = match spoil {
                    Some(true) => {
                        batch.push(batch[0].clone());
                        true
                    }
                    Some(false) if !stale.is_empty() => {
                        batch.insert(batch.len() / 2, stale[picks[0] % stale.len()].clone());
                        true
                    }
                    _ => false,
                };
                let got = h.engine().ack_many(&batch);
                if spoiled {
                    if !matches!(got, Err(AckError::NotOutstanding { .. })) {
                        return Err(at(format!("spoiled ack_many returned {got:?}")));
                    }
                } else {
                    got.map_err(|e| at(format!("ack_many failed: {e}")))?;
                    for &i in chosen.iter().rev() {
                        let d = outstanding.remove(i);
                        model.tasks.remove(d.key());
                        stale.push(d);
                    }
                }
            }
            Op::Reopen | Op::ProcessCrash | Op::PowerCut => {
                let how = match op {
                    Op::Reopen => Stop::Clean,
                    // Only `Sync` promises anything across a power cut.
                    Op::PowerCut if setup.durability == Durability::Sync => Stop::PowerCut,
                    _ => Stop::ProcessCrash,
                };
                stale.append(&mut outstanding);
                h.stop(how)?;
                model.align_for_open(&h.clock);
                h.start()?;
                let recovery = h.engine().recovery().clone();
                model.open();
                let redelivered = model.tasks.len() - model.scheduled();
                let overdue = model
                    .tasks
                    .values()
                    .filter(|t| t.deliveries == 0 && model.overdue_at_open(t.due_ms))
                    .count();
                if recovery.pending != model.tasks.len()
                    || recovery.redelivered != redelivered
                    || recovery.overdue != overdue
                {
                    return Err(at(format!(
                        "recovery {recovery:?}, model: {} pending, {redelivered} redelivered, \
                         {overdue} overdue",
                        model.tasks.len()
                    )));
                }
                if how == Stop::Clean && !recovery.wal.clean_shutdown {
                    return Err(at(format!("clean shutdown not reported: {recovery:?}")));
                }
                let ds = drain(h.engine())?;
                check("deliveries at open", &ds, &model.reopen()).map_err(at)?;
                outstanding.extend(ds);
            }
        }
        let stats = h.engine().stats();
        let scheduled = model.scheduled();
        if stats.scheduled != scheduled
            || stats.delivered_unacked != model.tasks.len() - scheduled
            || stats.ready != 0
        {
            return Err(at(format!(
                "stats {stats:?}, model: {scheduled} scheduled, {} delivered",
                model.tasks.len() - scheduled
            )));
        }
    }

    // Finally every task still scheduled must come out, in order, once the clock passes it.
    let last = model
        .tasks
        .values()
        .map(|t| t.fire_mono_ms)
        .max()
        .unwrap_or(0);
    let by = last.saturating_sub(model.mono_ms) + 1;
    let ds = h.advance(Duration::from_millis(by))?;
    model.wall_ms += by;
    model.mono_ms += by;
    check("final deliveries", &ds, &model.fire_due())?;
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
        Ack { pick: 0 },
        AckStale { pick: 0 },
        PowerCut,
        Ack { pick: 1 },
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
        AckStale { pick: 3 },
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
        Ack { pick: 0 },
        PowerCut,
        Reopen,
        ProcessCrash,
        Advance { ms: LONG_MS },
    ];
    let setups = [
        Setup {
            tick_ms: 1,
            durability: Durability::Sync,
        },
        Setup {
            tick_ms: 10,
            durability: Durability::Buffered,
        },
        Setup {
            tick_ms: 8,
            durability: Durability::Interval(Duration::from_millis(1)),
        },
    ];
    for setup in setups {
        run(7, setup, &ops).map_err(|e| format!("{setup:?}: {e}"))?;
    }
    Ok(())
}
