//! Power cuts under `Interval` and `Buffered` lose only an unsynced suffix (README,
//! "Durability contracts"): after the cut and a reopen, the engine's state equals the state
//! after some prefix of the calls made, and that prefix reaches at least the last completed
//! `sync()` or `checkpoint()`. No task resurrected, none half-changed (a reschedule's due time
//! with the old payload), none duplicated, no corruption reported, no repair needed.
//!
//! Each seed draws a configuration (durability, kind of cut, horizon and resident window so
//! that far tasks and payloads on disk come and go, background far-task moves, proof before
//! ack, stale history and timed I/O on the simulated disk) and runs random calls against a
//! model: schedule, schedule_many, cancel, cancel_many, reschedule (with and without a new
//! payload), clock advances with deliveries, ack, nack (retry or dead letter), checkpoint,
//! sync, a process crash, and a checkpoint with an injected fault. The model's state is
//! recorded after every call and every delivery. Then the power goes (`PowerCut`: unsynced
//! writes kept at random, torn; or `PowerCutDropUnsynced`), the engine reopens, time runs
//! past every due time, and what it delivers (key, due time, payload, attempt) and its dead
//! letters must equal one recorded state at or after the last sync point. In the two-cut runs
//! a second series of calls on other keys follows the first cut, and each series must match
//! a prefix of its own; the first series (no deliveries in it) must also show at the end
//! exactly what an engine opened on a copy of the disk showed right after the first cut — its
//! state must not move between the two reopens.
//!
//! Added in session 30 from a helper's hunt (30 000 runs, no violation); the simulation
//! (`tests/simulation.rs`) checks `Interval`/`Buffered` seeds across process crashes only.

mod common;

use common::{config, drain, scale, SimHarness, SplitMix, Stop, TestResult, START_MS};
use kairos::kairos_wal::{FaultKind, FaultOp, FaultPlan, SimStorage, Storage};
use kairos::{
    CancelOutcome, Config, Delivery, Due, Durability, Engine, ManualClock, NackOutcome, NewTask,
    RescheduleOutcome, ScheduleError, TaskId,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// A nack or lease failure past this many attempts dead-letters the task.
const MAX_ATTEMPTS: u32 = 3;

/// A live task as the model knows it.
#[derive(Clone, Debug, PartialEq)]
struct ModelTask {
    id: u64,
    /// Due time (UTC ms); `None` once a restart made it due again at once (redelivery).
    due_ms: Option<u64>,
    payload: Vec<u8>,
    /// Deliveries so far.
    deliveries: u32,
    /// Held by a consumer now.
    in_flight: bool,
}

impl ModelTask {
    /// A task just scheduled.
    fn scheduled(id: TaskId, due_ms: u64, payload: Vec<u8>) -> ModelTask {
        ModelTask {
            id: id.0,
            due_ms: Some(due_ms),
            payload,
            deliveries: 0,
            in_flight: false,
        }
    }
}

/// The model: live tasks by key, and dead letters (key, payload, attempts), sorted.
#[derive(Clone, Debug, Default)]
struct Model {
    live: BTreeMap<Vec<u8>, ModelTask>,
    dead: Vec<(Vec<u8>, Vec<u8>, u32)>,
}

/// What a reopened engine shows: per key (due time, payload, attempt of its next delivery),
/// and the dead letters.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    tasks: BTreeMap<Vec<u8>, (Option<u64>, Vec<u8>, u32)>,
    dead: Vec<(Vec<u8>, Vec<u8>, u32)>,
}

impl Model {
    /// What a reopen after a cut at this state must show: a held task comes again with its
    /// next attempt (due at once), or is dead-lettered if that was its last.
    fn expected(&self) -> Observed {
        let mut tasks = BTreeMap::new();
        let mut dead = self.dead.clone();
        for (key, t) in &self.live {
            if t.in_flight && t.deliveries >= MAX_ATTEMPTS {
                dead.push((key.clone(), t.payload.clone(), t.deliveries));
            } else {
                let due = if t.in_flight { None } else { t.due_ms };
                tasks.insert(key.clone(), (due, t.payload.clone(), t.deliveries + 1));
            }
        }
        dead.sort();
        Observed { tasks, dead }
    }

    /// A restart (process crash): held tasks come again at once, or go dead after their last
    /// attempt.
    fn settle(&mut self) {
        let held: Vec<Vec<u8>> = self
            .live
            .iter()
            .filter(|(_, t)| t.in_flight)
            .map(|(key, _)| key.clone())
            .collect();
        for key in held {
            let Some(t) = self.live.get_mut(&key) else {
                continue;
            };
            if t.deliveries >= MAX_ATTEMPTS {
                let payload = std::mem::take(&mut t.payload);
                let attempts = t.deliveries;
                self.live.remove(&key);
                self.dead.push((key, payload, attempts));
            } else {
                t.in_flight = false;
                t.due_ms = None;
            }
        }
        self.dead.sort();
    }

    /// Checks a delivery against the model and records it.
    fn deliver(&mut self, d: &Delivery, now_ms: u64, what: &str) -> TestResult {
        let Some(t) = self.live.get_mut(d.key()) else {
            return Err(format!("{what}: delivered an unknown task {d:?}").into());
        };
        if t.id != d.task_id().0
            || t.in_flight
            || t.due_ms.is_some_and(|due| due > now_ms)
            || d.payload() != &t.payload[..]
            || d.attempt() != t.deliveries + 1
        {
            return Err(format!("{what}: delivery {d:?} against the model's {t:?}").into());
        }
        t.deliveries += 1;
        t.in_flight = true;
        Ok(())
    }

    /// Whether `d` is the attempt the model holds for its task.
    fn holds(&self, d: &Delivery) -> bool {
        self.live
            .get(d.key())
            .is_some_and(|t| t.id == d.task_id().0 && t.in_flight && t.deliveries == d.attempt())
    }
}

/// A reopened engine's state matches `expected`: the same tasks with the same payloads and
/// attempts, due times equal where the model knows them, the same dead letters.
fn matches(expected: &Observed, got: &Observed) -> bool {
    expected.dead == got.dead
        && expected.tasks.len() == got.tasks.len()
        && expected.tasks.iter().all(|(key, (due, payload, attempt))| {
            got.tasks
                .get(key)
                .is_some_and(|(got_due, got_payload, got_attempt)| {
                    got_payload == payload
                        && got_attempt == attempt
                        && due.is_none_or(|due| *got_due == Some(due))
                })
        })
}

impl Observed {
    /// One line per task and dead letter (payloads by length and first bytes), for failures.
    fn summary(&self) -> String {
        let shown = |p: &[u8]| {
            format!(
                "{}B {:?}",
                p.len(),
                String::from_utf8_lossy(&p[..p.len().min(8)])
            )
        };
        let mut lines: Vec<String> = self
            .tasks
            .iter()
            .map(|(key, (due, p, attempt))| {
                let due = due.map(|d| (d - START_MS) / 1000);
                format!(
                    "{} due +{due:?} s, {}, attempt {attempt}",
                    String::from_utf8_lossy(key),
                    shown(p)
                )
            })
            .collect();
        lines.extend(self.dead.iter().map(|(key, p, attempts)| {
            format!(
                "dead {}, {}, {attempts} attempts",
                String::from_utf8_lossy(key),
                shown(p)
            )
        }));
        lines.join("; ")
    }
}

fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// A payload named by `tag`: empty to 20 KiB (a fifth of them 3-20 KiB).
fn payload(rng: &mut SplitMix, tag: u64) -> Vec<u8> {
    let len = match rng.range(0, 9) {
        0 => 0,
        1..=5 => rng.range(1, 40),
        6 | 7 => rng.range(40, 1500),
        _ => rng.range(3000, 20000),
    };
    let mut p = format!("p{tag}:").into_bytes();
    p.extend((0..len).map(|j| (tag * 31 + j) as u8));
    p
}

/// A seed's configuration.
#[derive(Debug)]
struct Setup {
    durability: Durability,
    cut: Stop,
    horizon: Option<Duration>,
    resident_window: Option<Duration>,
    relocate_far_tasks: Option<u64>,
    proof_before_ack: bool,
    stale_history: bool,
    timed_io: bool,
    faulty_checkpoint_at_end: bool,
    calls: u64,
}

impl Setup {
    fn draw(rng: &mut SplitMix) -> Setup {
        let durability = match rng.range(0, 3) {
            0 => Durability::Buffered,
            1 => Durability::Interval(Duration::from_millis(1)),
            2 => Durability::Interval(Duration::from_millis(30)),
            _ => Durability::Interval(Duration::from_secs(3600)),
        };
        let cut = if rng.chance(50) {
            Stop::PowerCut
        } else {
            Stop::PowerCutDropUnsynced
        };
        let minute = Duration::from_secs(60);
        let (horizon, resident_window) = match rng.range(0, 3) {
            0 => (Some(2 * minute), None),
            1 => (Some(10 * minute), Some(minute)),
            2 => (Some(Duration::from_secs(18 * 86_400)), Some(minute)),
            _ => (None, None),
        };
        Setup {
            durability,
            cut,
            horizon,
            resident_window,
            relocate_far_tasks: rng.chance(40).then(|| rng.range(1, 6)),
            proof_before_ack: rng.chance(70),
            stale_history: rng.chance(20),
            timed_io: rng.chance(20),
            faulty_checkpoint_at_end: rng.chance(20),
            calls: rng.range(5, 200),
        }
    }
}

/// One series of calls, between the start (or a cut) and the next cut.
struct Series {
    /// The model after each call and delivery, with what it was.
    states: Vec<(String, Model)>,
    /// Index into `states` of the last completed sync or checkpoint.
    sync_point: usize,
    /// The state a copy of the disk showed right after the cut, if observed.
    at_reopen: Option<Observed>,
}

/// One seed's run.
struct Run {
    rng: SplitMix,
    setup: Setup,
    h: SimHarness,
    /// Payload tags, for payloads that differ.
    tag: u64,
    /// The latest due time given, so the final drain runs past it.
    max_due_ms: u64,
    /// Distinct keys each series draws from.
    keys: u64,
    trace: Vec<String>,
}

impl Run {
    fn new(seed: u64) -> TestResult<Run> {
        let mut rng = SplitMix(seed);
        let setup = Setup::draw(&mut rng);
        let mut c = config(setup.durability);
        c.horizon = setup.horizon;
        c.resident_window = setup.resident_window;
        if setup.horizon.is_some() {
            c.payload_window = Some(Duration::from_secs(60));
        }
        c.relocate_far_tasks = setup.relocate_far_tasks;
        c.proof_before_ack = setup.proof_before_ack;
        c.retry.max_attempts = MAX_ATTEMPTS;
        let h = SimHarness::new(seed, c)?;
        h.sim.set_stale_history(setup.stale_history);
        h.sim.set_timed_io(setup.timed_io);
        let keys = rng.range(4, 40);
        Ok(Run {
            rng,
            setup,
            h,
            tag: 0,
            max_due_ms: START_MS,
            keys,
            trace: Vec::new(),
        })
    }

    fn key(&mut self, prefix: char) -> Vec<u8> {
        format!("{prefix}{}", self.rng.range(0, self.keys)).into_bytes()
    }

    /// `n` keys drawn, without repeats (so maybe fewer).
    fn distinct_keys(&mut self, prefix: char, n: u64) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for _ in 0..n {
            let key = self.key(prefix);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// EIO or a short write, for a fault.
    fn fault_kind(&mut self) -> FaultKind {
        if self.rng.chance(50) {
            FaultKind::Eio
        } else {
            FaultKind::ShortWrite
        }
    }

    /// Receives what the engine hands out now, checking each delivery against the model and
    /// recording the model after each (`label`: how the trace names it).
    fn hand_out(
        &mut self,
        m: &mut Model,
        series: &mut Series,
        held: &mut Vec<Delivery>,
        what: &str,
        label: &str,
    ) -> TestResult {
        let now_ms = self.h.clock.wall_ms();
        for d in drain(self.h.engine())? {
            m.deliver(&d, now_ms, what)?;
            let done = format!("{label} {}", String::from_utf8_lossy(d.key()));
            self.trace.push(format!("{what}: {done}"));
            series.states.push((done, m.clone()));
            held.push(d);
        }
        Ok(())
    }

    /// A due time from now: within 10 minutes, within an hour, or up to 5 hours.
    fn due(&mut self, now_ms: u64) -> u64 {
        let secs = match self.rng.range(0, 9) {
            0..=3 => self.rng.range(1, 600),
            4..=6 => self.rng.range(600, 3600),
            _ => self.rng.range(3600, 5 * 3600),
        };
        let due = now_ms + secs * 1000;
        self.max_due_ms = self.max_due_ms.max(due);
        due
    }

    fn payload(&mut self) -> Vec<u8> {
        self.tag += 1;
        payload(&mut self.rng, self.tag)
    }

    /// Runs a series of calls on keys starting with `prefix` (with deliveries, acks and nacks
    /// unless `settled_only`), then cuts the power and reopens; with `observe_reopen` (only
    /// with `settled_only`), first observes what a copy of the disk reopens to.
    fn series(
        &mut self,
        prefix: char,
        settled_only: bool,
        observe_reopen: bool,
    ) -> TestResult<Series> {
        let mut m = Model::default();
        let mut series = Series {
            states: vec![("start".into(), m.clone())],
            sync_point: 0,
            at_reopen: None,
        };
        let mut held: Vec<Delivery> = Vec::new();
        let mut cut_in_checkpoint = false;
        for step in 0..self.setup.calls {
            let now_ms = self.h.clock.wall_ms();
            let pick = self.rng.range(0, 99);
            if settled_only && ((54..83).contains(&pick) || (92..94).contains(&pick)) {
                continue;
            }
            let what = format!("{prefix} step {step}");
            let done: String = if pick < 22 {
                let key = self.key(prefix);
                let due = self.due(now_ms);
                let p = self.payload();
                let r = self.h.engine().schedule(&key, at(due), &p);
                match (m.live.contains_key(&key), r) {
                    (true, Err(ScheduleError::AlreadyExists { .. })) => {}
                    (false, Ok(id)) => {
                        m.live.insert(key.clone(), ModelTask::scheduled(id, due, p));
                    }
                    (live, r) => {
                        return Err(format!("{what}: schedule (live {live}): {r:?}").into())
                    }
                }
                format!("schedule {}", String::from_utf8_lossy(&key))
            } else if pick < 32 {
                let n = self.rng.range(1, 8);
                let keys = self.distinct_keys(prefix, n);
                let mut items = Vec::new();
                for key in &keys {
                    let due = self.due(now_ms);
                    items.push((key.clone(), due, self.payload()));
                }
                let tasks: Vec<NewTask> = items
                    .iter()
                    .map(|(key, due, payload)| NewTask {
                        key,
                        due: at(*due),
                        payload,
                    })
                    .collect();
                let r = self.h.engine().schedule_many(&tasks);
                let any_live = keys.iter().any(|k| m.live.contains_key(k));
                match (any_live, r) {
                    (true, Err(ScheduleError::AlreadyExists { .. })) => {}
                    (false, Ok(ids)) => {
                        for ((key, due, payload), id) in items.into_iter().zip(ids) {
                            m.live.insert(key, ModelTask::scheduled(id, due, payload));
                        }
                    }
                    (live, r) => {
                        return Err(format!("{what}: schedule_many (live {live}): {r:?}").into())
                    }
                }
                format!("schedule_many of {}", keys.len())
            } else if pick < 42 {
                let n = if self.rng.chance(50) {
                    1
                } else {
                    self.rng.range(2, 6)
                };
                let keys = self.distinct_keys(prefix, n);
                let outcomes = if let [key] = &keys[..] {
                    vec![self.h.engine().cancel(key)?]
                } else {
                    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                    self.h.engine().cancel_many(&refs)?
                };
                for (key, outcome) in keys.iter().zip(outcomes) {
                    let expected = match m.live.get(key) {
                        None => CancelOutcome::NotFound,
                        Some(t) if t.in_flight => CancelOutcome::AlreadyDelivered {
                            attempt: t.deliveries,
                        },
                        Some(t) => CancelOutcome::Cancelled {
                            deliveries: t.deliveries,
                        },
                    };
                    if expected != outcome {
                        return Err(format!(
                            "{what}: cancel {key:?}: {outcome:?}, model {expected:?}"
                        )
                        .into());
                    }
                    m.live.remove(key);
                }
                format!("cancel of {}", keys.len())
            } else if pick < 54 {
                let key = self.key(prefix);
                let due = self.due(now_ms);
                let new_payload = self.rng.chance(50).then(|| self.payload());
                let r = self
                    .h
                    .engine()
                    .reschedule(&key, at(due), new_payload.as_deref());
                match (m.live.get_mut(&key), r) {
                    (Some(t), Err(ScheduleError::InFlight { .. })) if t.in_flight => {}
                    (Some(t), Ok(RescheduleOutcome::Rescheduled(id)))
                        if !t.in_flight && id.0 == t.id =>
                    {
                        t.due_ms = Some(due);
                        if let Some(p) = new_payload {
                            t.payload = p;
                        }
                    }
                    (None, Ok(RescheduleOutcome::Scheduled(id))) => {
                        let payload = new_payload.unwrap_or_default();
                        m.live
                            .insert(key.clone(), ModelTask::scheduled(id, due, payload));
                    }
                    (t, r) => return Err(format!("{what}: reschedule (model {t:?}): {r:?}").into()),
                }
                format!("reschedule {}", String::from_utf8_lossy(&key))
            } else if pick < 66 {
                let by_ms = self.rng.range(1, 1200) * 1000;
                self.h.clock.advance(Duration::from_millis(by_ms));
                self.hand_out(&mut m, &mut series, &mut held, &what, "delivered")?;
                continue;
            } else if pick < 83 {
                if held.is_empty() {
                    continue;
                }
                let i = self.rng.range(0, held.len() as u64 - 1) as usize;
                let d = held.swap_remove(i);
                let holds = m.holds(&d);
                if pick < 76 {
                    self.h.engine().ack(&d)?;
                    if holds {
                        m.live.remove(d.key());
                    }
                    format!("ack {}", String::from_utf8_lossy(d.key()))
                } else {
                    let after_ms = self.rng.range(1, 600) * 1000;
                    let after = Duration::from_millis(after_ms);
                    let outcome = self.h.engine().nack(&d, Some(after), "boom")?;
                    let last_attempt = d.attempt() >= MAX_ATTEMPTS;
                    match outcome {
                        NackOutcome::Finished if !holds => {}
                        NackOutcome::Retry { next_attempt, .. }
                            if holds && !last_attempt && next_attempt == d.attempt() + 1 =>
                        {
                            if let Some(t) = m.live.get_mut(d.key()) {
                                t.in_flight = false;
                                t.due_ms = Some(now_ms + after_ms);
                            }
                            self.max_due_ms = self.max_due_ms.max(now_ms + after_ms);
                        }
                        NackOutcome::DeadLettered if holds && last_attempt => {
                            if let Some(t) = m.live.remove(d.key()) {
                                m.dead.push((d.key().to_vec(), t.payload, t.deliveries));
                                m.dead.sort();
                            }
                        }
                        outcome => {
                            return Err(format!(
                                "{what}: nack of attempt {} (model holds {holds}): {outcome:?}",
                                d.attempt()
                            )
                            .into())
                        }
                    }
                    format!("nack {}", String::from_utf8_lossy(d.key()))
                }
            } else if pick < 88 {
                self.h
                    .engine()
                    .checkpoint()
                    .map_err(|e| format!("{what}: checkpoint: {e}"))?;
                series.sync_point = series.states.len() - 1;
                self.trace.push(format!("{what}: checkpoint"));
                continue;
            } else if pick < 92 {
                self.h.engine().sync()?;
                series.sync_point = series.states.len() - 1;
                self.trace.push(format!("{what}: sync"));
                continue;
            } else if pick < 94 {
                // A process crash loses nothing written; held tasks come again at once.
                self.h.restart(Stop::ProcessCrash)?;
                m.settle();
                held.clear();
                series.states.push(("process crash".into(), m.clone()));
                self.trace.push(format!("{what}: process crash"));
                self.hand_out(&mut m, &mut series, &mut held, &what, "redelivered")?;
                continue;
            } else if pick < 96 {
                // The power goes during (or right after) a checkpoint that a fault broke.
                let after = self.rng.range(0, 40);
                let kind = self.fault_kind();
                self.h.sim.inject(FaultPlan {
                    after,
                    op: FaultOp::Any,
                    kind,
                });
                if self.h.engine().checkpoint().is_ok() {
                    series.sync_point = series.states.len() - 1;
                }
                self.trace.push(format!(
                    "{what}: checkpoint with {kind:?} after {after} ops"
                ));
                cut_in_checkpoint = true;
                break;
            } else {
                continue;
            };
            self.trace.push(format!("{what}: {done}"));
            series.states.push((done, m.clone()));
        }
        if self.setup.faulty_checkpoint_at_end && !cut_in_checkpoint {
            let after = self.rng.range(0, 60);
            let op = match self.rng.range(0, 4) {
                0 => FaultOp::Any,
                1 => FaultOp::Sync,
                2 => FaultOp::Rename,
                3 => FaultOp::Write,
                _ => FaultOp::Open,
            };
            let kind = self.fault_kind();
            self.h.sim.inject(FaultPlan { after, op, kind });
            for _ in 0..self.rng.range(1, 2) {
                if self.h.engine().checkpoint().is_ok() {
                    series.sync_point = series.states.len() - 1;
                }
            }
            self.trace.push(format!(
                "{prefix}: checkpoints with {kind:?} on {op:?} after {after}"
            ));
        }
        self.h.stop(self.setup.cut)?;
        if observe_reopen {
            // Every due time is known here (no deliveries in a series that observes its
            // reopen): the final drain must show exactly this state for these keys.
            let observed = observe_a_copy(
                &self.h.sim,
                &self.h.dir,
                &self.h.config,
                self.h.clock.wall_ms(),
                self.max_due_ms + 60_000,
            )
            .map_err(|e| format!("observing a copy of the disk after the cut: {e}"))?;
            series.at_reopen = Some(observed);
        }
        self.h
            .start()
            .map_err(|e| format!("reopen after {:?}: {e}", self.setup.cut))?;
        self.trace
            .push(format!("{prefix}: {:?}, reopened", self.setup.cut));
        Ok(series)
    }
}

/// Runs `clock` past `until_ms`, receiving and acking everything `engine` hands out: its
/// state after a reopen.
fn observe(engine: &Engine, clock: &ManualClock, until_ms: u64) -> TestResult<Observed> {
    let mut dead: Vec<_> = engine
        .dead_letters()
        .into_iter()
        .map(|d| (d.key, d.payload, d.attempts))
        .collect();
    dead.sort();
    let mut tasks = BTreeMap::new();
    loop {
        for d in drain(engine)? {
            let key = d.key().to_vec();
            if d.due_ms() > clock.wall_ms() {
                return Err(format!("delivered early after the reopen: {d:?}").into());
            }
            let seen = (Some(d.due_ms()), d.payload().to_vec(), d.attempt());
            if tasks.insert(key, seen).is_some() {
                return Err(format!("delivered twice after the reopen: {d:?}").into());
            }
            engine.ack(&d)?;
        }
        if clock.wall_ms() > until_ms {
            break;
        }
        clock.advance(Duration::from_secs(600));
    }
    let stats = engine.stats();
    if stats.pending != 0 {
        return Err(format!("tasks left pending after the drain: {stats:?}").into());
    }
    Ok(Observed { tasks, dead })
}

/// What an engine opened on a copy of `sim`'s files (at the clock's time, with `config`)
/// shows: the state the original's next open starts from, observed without touching it.
fn observe_a_copy(
    sim: &SimStorage,
    dir: &Path,
    config: &Config,
    now_ms: u64,
    until_ms: u64,
) -> TestResult<Observed> {
    let copy = SimStorage::new(0);
    for sub in ["", "wal", "checkpoint", "overflow"] {
        let from = dir.join(sub);
        if !sim.exists(&from)? {
            continue;
        }
        for name in sim.list(&from)? {
            let path = from.join(&name);
            let bytes = sim.read_file(&path).ok_or("a listed file vanished")?;
            copy.write_file(&path, &bytes);
        }
    }
    let clock = ManualClock::new(START_MS);
    clock.advance(Duration::from_millis(now_ms - START_MS));
    let engine = Engine::open_with(dir, config.clone(), Arc::new(copy), Arc::new(clock.clone()))?;
    let observed = observe(&engine, &clock, until_ms)?;
    engine.shutdown()?;
    Ok(observed)
}

/// Runs `seed`, with a second series on other keys after the first cut if `two_cuts`.
fn run(seed: u64, two_cuts: bool) -> TestResult {
    let mut run = Run::new(seed)?;
    let setup = format!("seed {seed} (two cuts: {two_cuts}): {:?}", run.setup);
    let mut all = vec![(
        'k',
        run.series('k', two_cuts, two_cuts)
            .map_err(|e| format!("{setup}: {e}"))?,
    )];
    if two_cuts {
        all.push((
            'b',
            run.series('b', true, false)
                .map_err(|e| format!("{setup}: {e}"))?,
        ));
    }
    let got = observe(run.h.engine(), &run.h.clock, run.max_due_ms + 60_000)
        .map_err(|e| format!("{setup}: {e}"))?;
    for (prefix, series) in &all {
        let mine = |key: &[u8]| key.first() == Some(&(*prefix as u8));
        let got = Observed {
            tasks: got
                .tasks
                .iter()
                .filter(|(key, _)| mine(key))
                .map(|(key, v)| (key.clone(), v.clone()))
                .collect(),
            dead: got
                .dead
                .iter()
                .filter(|(key, _, _)| mine(key))
                .cloned()
                .collect(),
        };
        let hit = series
            .states
            .iter()
            .rposition(|(_, m)| matches(&m.expected(), &got));
        if hit.is_none_or(|i| i < series.sync_point) {
            let (sync_what, at_sync) = &series.states[series.sync_point];
            return Err(format!(
                "{setup}: series {prefix}: the reopened state matches recorded state {hit:?} of \
                 {}, the last sync point is {} ({sync_what})\ngot {}\nat the sync point \
                 {}\ntrace:\n  {}",
                series.states.len() - 1,
                series.sync_point,
                got.summary(),
                at_sync.expected().summary(),
                run.trace.join("\n  ")
            )
            .into());
        }
        if let Some(at_reopen) = &series.at_reopen {
            if *at_reopen != got {
                return Err(format!(
                    "{setup}: series {prefix} changed after its reopen (the second series and \
                     cut must not touch it)\nat the reopen {}\nat the end {}\ntrace:\n  {}",
                    at_reopen.summary(),
                    got.summary(),
                    run.trace.join("\n  ")
                )
                .into());
            }
        }
    }
    run.h.stop(Stop::Clean)?;
    Ok(())
}

#[test]
fn a_power_cut_under_interval_or_buffered_keeps_a_prefix_from_the_last_sync_on() -> TestResult {
    for seed in 0..100 * scale() as u64 {
        run(seed, false)?;
    }
    Ok(())
}

#[test]
fn two_power_cuts_each_keep_a_prefix_of_their_series() -> TestResult {
    for seed in 10_000..10_000 + 50 * scale() as u64 {
        run(seed, true)?;
    }
    Ok(())
}
