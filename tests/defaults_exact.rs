//! An exact model of the engine with the defaults an embedder runs — the payload prefetcher,
//! background checkpoints and background far-task moves all on — with short triggers and
//! windows, so that tasks keep going to overflow files, being promoted, prefetched and
//! compacted while the calls go on. On `SimStorage` (with process crashes, and power cuts —
//! after `Engine::sync` under `Buffered`) and on the real file system (`FsStorage` in a
//! temporary directory).
//!
//! Every task is received and acked as soon as it is handed out, so nothing is in flight at
//! a stop and the model is exact whatever the background threads' timing: after every step
//! the live tasks are exactly the model's; after every clock move, every task due by then was
//! delivered exactly once — with its key, payload and due time, never early — and in due
//! order; cancel and reschedule answers are the model's; a reopen keeps every task.
//!
//! `KAIROS_DEFAULTS_SEEDS=N` runs N seeds (`KAIROS_DEFAULTS_BASE=B` from B),
//! `KAIROS_DEFAULTS_SEED=S` one seed with its steps printed.

mod common;

use common::{SplitMix, START_MS};
use kairos::{
    CancelOutcome, Clock, Config, Delivery, Due, Durability, Engine, ManualClock, RecvError,
    RescheduleOutcome, ScheduleError,
};
use kairos_wal::{FsStorage, SimStorage, Storage};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Task {
    id: u64,
    due_ms: u64,
    payload: Vec<u8>,
    attempt: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disk {
    Sim,
    Fs,
}

struct Run {
    seed: u64,
    rng: SplitMix,
    disk: Disk,
    sim: SimStorage,
    fs_dir: Option<tempfile::TempDir>,
    clock: ManualClock,
    config: Config,
    engine: Option<Engine>,
    model: BTreeMap<Vec<u8>, Task>,
    keys: u64,
    next_tag: u64,
    verbose: bool,
    trace: Vec<String>,
    delivered: u64,
    /// Per live task: the monotonic ms by which it must be handed out — its due time mapped
    /// by the clocks when it was placed (or at the last open). Firing follows the monotonic
    /// clock, far tasks the wall clock; with forward wall steps only, the second comes first.
    deadline: BTreeMap<Vec<u8>, u64>,
    /// A wall step happened: due order is no longer the hand-out order (a far task follows
    /// the wall clock, a task in the wheel the monotonic one).
    stepped: bool,
    /// Dead letters: id → (key, payload).
    dead: BTreeMap<u64, (Vec<u8>, Vec<u8>)>,
    /// Acks only.
    final_drain: bool,
    /// `Engine::pause_deliveries` is in force: nothing is handed out.
    paused: bool,
    /// The next drain follows a resume: tasks due before the pause come first, in the order
    /// they were placed, so the due order is not checked.
    resumed: bool,
    promoted: u64,
    read_back: u64,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Run {
    fn new(seed: u64, disk: Disk, verbose: bool) -> Run {
        let mut rng = SplitMix(seed);
        let mut c = Config::default();
        c.segment_bytes = common::SMALL_SEGMENT_BYTES;
        c.durability = match (disk, rng.range(0, 3)) {
            (Disk::Fs, 0) | (Disk::Sim, 0..=2) => Durability::Sync,
            _ => Durability::Buffered,
        };
        c.lease = kairos::config::LEASE_MAX;
        c.checkpoint_log_bytes = Some([1, 512, 4_096, 16_384][rng.range(0, 3) as usize]);
        c.checkpoint_interval =
            [None, Some(1), Some(5), Some(50)][rng.range(0, 3) as usize].map(Duration::from_millis);
        let window = [1, 10, 100, 1_000][rng.range(0, 3) as usize];
        c.payload_window = Some(Duration::from_millis(window));
        let span = window + [0, 10, 1_000, 60_000][rng.range(0, 3) as usize];
        if rng.chance(50) {
            c.resident_window = Some(Duration::from_millis(span));
        } else {
            c.resident_window = None;
            c.horizon = Some(Duration::from_millis(span));
        }
        c.relocate_far_tasks = [None, Some(1), Some(4), Some(64)][rng.range(0, 3) as usize];
        c.payload_prefetch = true;
        c.retry.max_attempts = rng.range(1, 3) as u32;
        let keys = rng.range(8, 64);
        let sim = SimStorage::new(seed);
        let fs_dir = (disk == Disk::Fs).then(|| tempfile::tempdir().expect("temp dir"));
        let mut run = Run {
            seed,
            rng,
            disk,
            sim,
            fs_dir,
            clock: ManualClock::new(START_MS),
            config: c,
            engine: None,
            model: BTreeMap::new(),
            keys,
            next_tag: 0,
            verbose,
            trace: Vec::new(),
            delivered: 0,
            dead: BTreeMap::new(),
            deadline: BTreeMap::new(),
            stepped: false,
            final_drain: false,
            paused: false,
            resumed: false,
            promoted: 0,
            read_back: 0,
        };
        run.log(format!("seed {seed} {disk:?}: {:?}", run.config));
        run
    }

    fn log(&mut self, line: String) {
        if self.verbose {
            eprintln!("{line}");
        }
        self.trace.push(line);
        if self.trace.len() > 60 {
            self.trace.remove(0);
        }
    }

    fn dir(&self) -> PathBuf {
        match &self.fs_dir {
            Some(d) => d.path().join("data"),
            None => PathBuf::from("/kairos"),
        }
    }

    fn open(&mut self) -> Result<(), String> {
        let storage: Arc<dyn Storage> = match self.disk {
            Disk::Sim => Arc::new(self.sim.clone()),
            Disk::Fs => Arc::new(FsStorage),
        };
        let engine = Engine::open_with(
            self.dir(),
            self.config.clone(),
            storage,
            Arc::new(self.clock.clone()),
        )
        .map_err(|e| format!("open: {e}"))?;
        let pending = engine.recovery().pending;
        if pending != self.model.len() {
            return Err(format!(
                "open recovered {pending} tasks, the model holds {}",
                self.model.len()
            ));
        }
        self.engine = Some(engine);
        // An open converts every due time by the wall clock again.
        let placed: Vec<(Vec<u8>, u64)> = self
            .model
            .iter()
            .map(|(k, t)| (k.clone(), t.due_ms))
            .collect();
        for (k, due) in placed {
            self.place(&k, due);
        }
        // Pausing is not durable: a reopen follows the config.
        if self.paused {
            self.paused = false;
            self.resumed = true;
        }
        self.check_dead()?;
        // Tasks due while closed (none: the clock does not move while closed) and the
        // settling of the open.
        self.drain("open")
    }

    fn mono_ms(&self) -> u64 {
        self.clock.now_monotonic().as_millis() as u64
    }

    /// Notes `key`'s deadline for a due time placed now.
    fn place(&mut self, key: &[u8], due_ms: u64) {
        let at = self.mono_ms() + due_ms.saturating_sub(self.clock.wall_ms());
        self.deadline.insert(key.to_vec(), at);
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine")
    }

    fn key(&mut self) -> Vec<u8> {
        format!("key-{}", self.rng.range(0, self.keys - 1)).into_bytes()
    }

    fn payload(&mut self) -> Vec<u8> {
        self.next_tag += 1;
        let mut p = format!("t{};", self.next_tag).into_bytes();
        let len = match self.rng.range(0, 9) {
            0 => 0,
            1..=6 => self.rng.range(0, 40),
            7 | 8 => self.rng.range(40, 1_200),
            _ => self.rng.range(1_200, 5_000),
        } as usize;
        let fill = self.rng.next_u64();
        p.extend((0..len).map(|i| (fill >> (i % 8 * 8)) as u8 ^ i as u8));
        p
    }

    /// Mostly ahead; now and then now or in the past (fires at the next pass).
    fn due_ms(&mut self) -> u64 {
        if self.rng.chance(4) {
            return self.clock.wall_ms() - self.rng.range(0, 10_000);
        }
        let ms = match self.rng.range(0, 9) {
            0..=2 => self.rng.range(1, 20),
            3..=4 => self.rng.range(20, 2_000),
            5..=7 => self.rng.range(2_000, 120_000),
            _ => self.rng.range(120_000, 3 * 3_600_000),
        };
        self.clock.wall_ms() + ms
    }

    fn due(&mut self, due_ms: u64) -> Due {
        let now = self.clock.wall_ms();
        if due_ms >= now && self.rng.chance(50) {
            Due::After(Duration::from_millis(due_ms - now))
        } else {
            Due::At(kairos::clock::ms_to_system_time(due_ms))
        }
    }

    /// Receives and acks everything handed out, checking each against the model, then checks
    /// that nothing due by now is left.
    fn drain(&mut self, what: &str) -> Result<(), String> {
        self.engine().run_until_idle();
        let consumer = self.engine().consumer();
        let now = self.clock.wall_ms();
        let now_mono = self.mono_ms();
        let mut last_due = 0;
        // A nack whose retry is due by now makes another pass hand it out.
        let mut retry_now = false;
        loop {
            let d: Delivery = match consumer.try_recv() {
                Ok(d) => d,
                Err(RecvError::Empty) if retry_now => {
                    retry_now = false;
                    last_due = 0;
                    self.engine().run_until_idle();
                    continue;
                }
                Err(RecvError::Empty) => break,
                Err(e) => return Err(format!("{what}: receive: {e}")),
            };
            let key = d.key().to_vec();
            let k = String::from_utf8_lossy(&key).into_owned();
            let Some(task) = self.model.remove(&key) else {
                return Err(format!("{what}: {k} delivered, the model has no such task"));
            };
            let got = Task {
                id: d.task_id().0,
                due_ms: d.due_ms(),
                payload: d.payload().to_vec(),
                attempt: d.attempt(),
            };
            if got != task {
                return Err(format!(
                    "{what}: {k} delivered as id {} due {} payload {} B, the model has id {} \
                     due {} payload {} B (payloads equal: {})",
                    got.id,
                    got.due_ms,
                    got.payload.len(),
                    task.id,
                    task.due_ms,
                    task.payload.len(),
                    got.payload == task.payload
                ));
            }
            self.deadline.remove(&key);
            if d.fired_ms() < d.due_ms() || d.due_ms() > now {
                return Err(format!(
                    "{what}: {k} early: due {} fired {} now {now}",
                    d.due_ms(),
                    d.fired_ms()
                ));
            }
            if self.paused {
                return Err(format!(
                    "{what}: {k} handed out while deliveries are paused"
                ));
            }
            if d.due_ms() < last_due && !self.resumed && !self.stepped {
                return Err(format!(
                    "{what}: {k} due {} handed out after a task due {last_due}",
                    d.due_ms()
                ));
            }
            last_due = d.due_ms();
            self.delivered += 1;
            if !self.final_drain && self.rng.chance(25) {
                // A nack with a retry delay: the next attempt is due then, or the task is a
                // dead letter once its attempts are used.
                let after = self.rng.range(0, 5_000);
                let r = consumer.nack(&d, Some(Duration::from_millis(after)), "nack");
                let max = self.config.retry.max_attempts;
                match r {
                    Ok(kairos::NackOutcome::Retry { next_attempt, due })
                        if task.attempt < max && next_attempt == task.attempt + 1 =>
                    {
                        let due_ms = kairos::clock::system_time_to_ms(due).unwrap_or(0);
                        retry_now |= after == 0;
                        if due_ms != now + after {
                            return Err(format!(
                                "{what}: {k} nacked at {now} + {after} ms is due {due_ms}"
                            ));
                        }
                        self.place(&key, due_ms);
                        self.model.insert(
                            key,
                            Task {
                                due_ms,
                                attempt: next_attempt,
                                ..task
                            },
                        );
                    }
                    Ok(kairos::NackOutcome::DeadLettered) if task.attempt >= max => {
                        self.dead.insert(task.id, (key, task.payload));
                    }
                    r => {
                        return Err(format!(
                            "{what}: nack of {k} attempt {} -> {r:?}",
                            task.attempt
                        ))
                    }
                }
                self.log(format!("nack {k} +{after} ms"));
            } else {
                consumer
                    .ack(&d)
                    .map_err(|e| format!("{what}: ack {k}: {e}"))?;
            }
        }
        self.resumed = false;
        let late = self
            .model
            .iter()
            .find(|(k, _)| !self.paused && self.deadline.get(*k).is_none_or(|&at| at <= now_mono));
        if let Some((k, t)) = late {
            return Err(format!(
                "{what}: {} (id {}) due {} (monotonic deadline {:?}) not handed out by {now} \
                 (monotonic {now_mono})",
                String::from_utf8_lossy(k),
                t.id,
                t.due_ms,
                self.deadline.get(k)
            ));
        }
        let stats = self.engine().stats();
        if stats.pending != self.model.len()
            || stats.ready != 0
            || stats.in_flight != 0
            || stats.dead_letters != self.dead.len()
        {
            return Err(format!(
                "{what}: stats {stats:?}, the model holds {}",
                self.model.len()
            ));
        }
        Ok(())
    }

    /// The dead letters are the model's, with their keys and payloads.
    fn check_dead(&mut self) -> Result<(), String> {
        let got: BTreeMap<u64, (Vec<u8>, Vec<u8>)> = self
            .engine()
            .dead_letters()
            .into_iter()
            .map(|d| (d.task_id.0, (d.key, d.payload)))
            .collect();
        if got != self.dead {
            return Err(format!(
                "dead letters {:?}, the model has {:?}",
                got.iter()
                    .map(|(id, (k, p))| (id, String::from_utf8_lossy(k), p.len()))
                    .collect::<Vec<_>>(),
                self.dead
                    .iter()
                    .map(|(id, (k, p))| (id, String::from_utf8_lossy(k), p.len()))
                    .collect::<Vec<_>>()
            ));
        }
        self.log(format!("{} dead letters as the model says", got.len()));
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.range(0, 99) {
            84 if !self.final_drain => {
                if self.paused {
                    self.engine().resume_deliveries();
                    self.paused = false;
                    self.resumed = true;
                    self.log("resume deliveries".into());
                } else {
                    self.engine().pause_deliveries();
                    self.paused = true;
                    self.log("pause deliveries".into());
                }
            }
            0..=29 => {
                let key = self.key();
                let due_ms = self.due_ms();
                let due = self.due(due_ms);
                let payload = self.payload();
                let r = self.engine().schedule(&key, due, &payload);
                self.log(format!(
                    "schedule {} due {due_ms} -> {r:?}",
                    String::from_utf8_lossy(&key)
                ));
                match (r, self.model.contains_key(&key)) {
                    (Ok(id), false) => {
                        let task = Task {
                            id: id.0,
                            due_ms,
                            payload,
                            attempt: 1,
                        };
                        self.place(&key, due_ms);
                        self.model.insert(key, task);
                    }
                    (Err(ScheduleError::AlreadyExists { .. }), true) => {}
                    (r, live) => return Err(format!("schedule: {r:?}, model live {live}")),
                }
            }
            30..=39 => {
                let key = self.key();
                let due_ms = self.due_ms();
                let due = self.due(due_ms);
                let payload = self.rng.chance(60).then(|| self.payload());
                let r = self.engine().reschedule(&key, due, payload.as_deref());
                self.log(format!(
                    "reschedule {} due {due_ms} payload {:?} -> {r:?}",
                    String::from_utf8_lossy(&key),
                    payload.as_ref().map(Vec::len)
                ));
                match (r, self.model.get_mut(&key)) {
                    (Ok(RescheduleOutcome::Rescheduled(id)), Some(t)) if id.0 == t.id => {
                        t.due_ms = due_ms;
                        if let Some(p) = payload {
                            t.payload = p;
                        }
                        self.place(&key, due_ms);
                    }
                    (Ok(RescheduleOutcome::Scheduled(id)), None) => {
                        let task = Task {
                            id: id.0,
                            due_ms,
                            payload: payload.unwrap_or_default(),
                            attempt: 1,
                        };
                        self.place(&key, due_ms);
                        self.model.insert(key, task);
                    }
                    (r, t) => return Err(format!("reschedule: {r:?}, model {t:?}")),
                }
            }
            40..=54 => {
                let key = self.key();
                let r = self.engine().cancel(&key);
                self.log(format!("cancel {} -> {r:?}", String::from_utf8_lossy(&key)));
                self.deadline.remove(&key);
                match (r, self.model.remove(&key)) {
                    (Ok(CancelOutcome::Cancelled { deliveries }), Some(t))
                        if deliveries + 1 == t.attempt => {}
                    (Ok(CancelOutcome::NotFound), None) => {}
                    (r, t) => return Err(format!("cancel: {r:?}, model {t:?}")),
                }
            }
            55..=84 => {
                let ms = match self.rng.range(0, 9) {
                    0..=3 => self.rng.range(1, 20),
                    4..=6 => self.rng.range(20, 5_000),
                    7 | 8 => self.rng.range(5_000, 600_000),
                    _ => self.rng.range(600_000, 4 * 3_600_000),
                };
                self.clock.advance(Duration::from_millis(ms));
                self.log(format!("advance {ms} ms -> {}", self.clock.wall_ms()));
                self.drain("advance")?;
            }
            86 | 87 if !self.dead.is_empty() => {
                let i = self.rng.range(0, self.dead.len() as u64 - 1) as usize;
                let (&id, (key, payload)) = self.dead.iter().nth(i).expect("a dead letter");
                let (key, payload) = (key.clone(), payload.clone());
                let k = String::from_utf8_lossy(&key).into_owned();
                if self.rng.chance(30) {
                    let r = self.engine().purge_dead_letter(kairos::TaskId(id));
                    self.log(format!("purge dead letter {id} ({k}) -> {r:?}"));
                    if !matches!(r, Ok(true)) {
                        return Err(format!("purge of dead letter {id}: {r:?}"));
                    }
                    self.dead.remove(&id);
                } else {
                    let due_ms = self.due_ms();
                    let due = self.due(due_ms);
                    let r = self.engine().requeue_dead_letter(kairos::TaskId(id), due);
                    self.log(format!(
                        "requeue dead letter {id} ({k}) due {due_ms} -> {r:?}"
                    ));
                    match (r, self.model.contains_key(&key)) {
                        (Ok(new), false) => {
                            self.dead.remove(&id);
                            let task = Task {
                                id: new.0,
                                due_ms,
                                payload,
                                attempt: 1,
                            };
                            self.place(&key, due_ms);
                            self.model.insert(key, task);
                        }
                        (Err(ScheduleError::AlreadyExists { .. }), true) => {}
                        (r, live) => {
                            return Err(format!("requeue of {id} ({k}): {r:?}, live {live}"))
                        }
                    }
                }
            }
            88 => self.check_dead()?,
            89 => {
                // A forward wall step (a backward one would make the deadlines unknowable).
                let ms = match self.rng.range(0, 2) {
                    0 => self.rng.range(1, 50),
                    1 => self.rng.range(50, 60_000),
                    _ => self.rng.range(60_000, 4 * 3_600_000),
                };
                self.clock.step_wall(ms as i64);
                self.stepped = true;
                self.log(format!("wall step +{ms} ms -> {}", self.clock.wall_ms()));
            }
            85..=88 => {
                // Real time for the background work (the checkpoint interval, a move).
                let us = self.rng.range(0, 3_000);
                std::thread::sleep(Duration::from_micros(us));
                self.log(format!("sleep {us} µs"));
            }
            90..=93 => {
                let r = self.engine().checkpoint();
                self.log(format!("checkpoint -> {:?}", r.as_ref().map(|c| c.lsn)));
                r.map_err(|e| format!("checkpoint: {e}"))?;
            }
            _ => {
                let engine = self.engine.take().expect("engine");
                self.count(&engine);
                let how = self.rng.range(0, 3);
                match how {
                    0 => {
                        engine.shutdown().map_err(|e| format!("shutdown: {e}"))?;
                        drop(engine);
                        self.log("clean restart".into());
                    }
                    _ => {
                        let cut = self.disk == Disk::Sim && how == 3;
                        if cut && self.config.durability != Durability::Sync {
                            // Every call that returned before `sync` survives a power cut.
                            engine.sync().map_err(|e| format!("sync: {e}"))?;
                        }
                        drop(engine);
                        if cut {
                            self.sim.power_cut();
                        } else if self.disk == Disk::Sim {
                            self.sim.crash_process();
                        }
                        self.log(format!(
                            "{} and reopen",
                            if cut { "power cut" } else { "crash" }
                        ));
                    }
                }
                self.open()?;
            }
        }
        // A due time already past fires at once: received before anything else happens (a
        // task left in the ready queue at a crash would count the attempt).
        self.drain("after the step")
    }

    fn count(&mut self, engine: &Engine) {
        let stats = engine.stats();
        self.promoted += stats.far_promoted;
        self.read_back += stats.payloads_read_back;
    }

    /// Deliveries, far tasks promoted and payloads read back.
    fn run(mut self, steps: usize) -> Result<[u64; 3], String> {
        self.open()?;
        for i in 0..steps {
            if let Err(e) = self.step() {
                return Err(format!(
                    "seed {} ({:?}) step {i}: {e}\nlast steps:\n  {}",
                    self.seed,
                    self.disk,
                    self.trace.join("\n  ")
                ));
            }
        }
        // Everything left fires.
        self.final_drain = true;
        if self.paused {
            self.engine().resume_deliveries();
            self.paused = false;
            self.resumed = true;
        }
        self.clock.advance(Duration::from_secs(10 * 3_600));
        self.drain("final").map_err(|e| {
            format!(
                "seed {} final: {e}\n  {}",
                self.seed,
                self.trace.join("\n  ")
            )
        })?;
        self.check_dead()?;
        if let Some(engine) = self.engine.take() {
            self.count(&engine);
            engine
                .shutdown()
                .map_err(|e| format!("final shutdown: {e}"))?;
        }
        Ok([self.delivered, self.promoted, self.read_back])
    }
}

fn seeds(disk: Disk, default: u64, base: u64, steps: usize) {
    if let Some(seed) = env_u64("KAIROS_DEFAULTS_SEED") {
        match Run::new(seed, disk, true).run(steps) {
            Ok(n) => eprintln!("seed {seed} passed: [deliveries, promoted, read back] {n:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let count = env_u64("KAIROS_DEFAULTS_SEEDS").unwrap_or(default);
    let base = env_u64("KAIROS_DEFAULTS_BASE").unwrap_or(base);
    let started = std::time::Instant::now();
    let mut total = [0; 3];
    for seed in base..base + count {
        match Run::new(seed, disk, false).run(steps) {
            Ok(n) => (0..3).for_each(|i| total[i] += n[i]),
            Err(e) => panic!(
                "{e}\nreplay (timing may differ): KAIROS_DEFAULTS_SEED={seed} cargo test \
                 --release --test defaults_exact {disk:?}"
            ),
        }
    }
    eprintln!(
        "{disk:?}: {count} seeds from {base} in {:.1} s: {} deliveries, {} far tasks promoted, \
         {} payloads read back",
        started.elapsed().as_secs_f64(),
        total[0],
        total[1],
        total[2]
    );
    assert!(total[1] > 0, "no far task was promoted");
}

#[test]
fn defaults_on_sim_storage() {
    seeds(Disk::Sim, 40 * common::scale() as u64, 1, 400);
}

#[test]
fn defaults_on_the_file_system() {
    seeds(Disk::Fs, 4 * common::scale() as u64, 1_000_000, 300);
}
