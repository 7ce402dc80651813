//! What the far-task tests share: a one-hour horizon with a one-minute
//! payload window (tasks due 2 h out go far at a checkpoint), keys and due
//! times by index.

use super::gate::{Gate, GateStorage};
use super::{config, TaskMap, TestResult, START_MS};
use kairos::{CancelError, Config, Due, Durability, Engine, ManualClock};
use kairos_wal::SimStorage;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// One minute.
pub const MINUTE: Duration = Duration::from_secs(60);
/// One hour: the horizon of [`cfg`].
pub const HOUR: Duration = Duration::from_secs(3600);

/// A one-hour horizon (the whole of it resident: no
/// [`Config::resident_window`], so the horizon alone decides what goes far),
/// a one-minute payload window, no prefetch thread (the driver promotes,
/// deterministically), `Sync`.
pub fn cfg() -> Config {
    let mut c = config(Durability::Sync);
    c.payload_window = Some(MINUTE);
    c.horizon = Some(HOUR);
    c.resident_window = None;
    c.payload_prefetch = false;
    c
}

/// [`cfg`] with one attempt per task: a task nacked once is a dead letter.
pub fn cfg_one_attempt() -> Config {
    let mut c = cfg();
    c.retry.max_attempts = 1;
    c
}

/// Due at `ms` (UTC).
pub fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// The key of far task `i`.
pub fn key(i: usize) -> Vec<u8> {
    format!("far-{i:04}").into_bytes()
}

/// Task `i` is due 2 h + `i` minutes after the start: beyond [`cfg`]'s
/// horizon, so a checkpoint makes it far.
pub fn due(i: usize) -> u64 {
    START_MS + 2 * 3_600_000 + 60_000 * i as u64
}

/// Runs the clock minute by minute up to `until_ms`, acking everything;
/// returns key → (due, payload), checking none fires early or twice.
pub fn fire_all(engine: &Engine, clock: &ManualClock, until_ms: u64) -> TestResult<TaskMap> {
    let mut fired = std::collections::BTreeMap::new();
    let consumer = engine.consumer();
    while clock.wall_ms() < until_ms {
        clock.advance(MINUTE);
        for d in super::drain(engine)? {
            assert!(d.fired_ms() >= d.due_ms(), "early: {:?}", d.key());
            let again = fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
            assert!(
                again.is_none(),
                "twice: {:?}",
                String::from_utf8_lossy(d.key())
            );
            consumer.ack(&d)?;
        }
    }
    Ok(fired)
}

/// Checks `expected` tasks pending, takes a checkpoint on top, checks again,
/// then, if `crash`, kills the process (dropping `engine`, `sim` losing
/// nothing synced) and returns the engine `reopen` opens, checked the same
/// way; otherwise `engine`.
pub fn checkpoint_then_maybe_crash(
    engine: Engine,
    sim: &kairos_wal::SimStorage,
    crash: bool,
    expected: usize,
    reopen: impl FnOnce() -> Result<Engine, kairos::OpenError>,
) -> TestResult<Engine> {
    assert_eq!(engine.stats().pending, expected, "{:?}", engine.stats());
    engine.checkpoint()?;
    assert_eq!(engine.stats().pending, expected, "{:?}", engine.stats());
    if !crash {
        return Ok(engine);
    }
    drop(engine);
    sim.crash_process();
    let e = reopen()?;
    assert_eq!(e.stats().pending, expected, "{:?}", e.stats());
    Ok(e)
}

/// An engine on simulated storage behind a [`Gate`], with a manual clock.
pub struct Gated {
    pub sim: SimStorage,
    pub gate: Arc<Gate>,
    pub clock: ManualClock,
    pub dir: PathBuf,
    pub engine: Engine,
}

/// Opens a [`Gated`] engine on a fresh disk from `seed` with [`cfg`].
pub fn gated(seed: u64) -> TestResult<Gated> {
    gated_with(seed, cfg())
}

/// [`gated`] with another configuration.
pub fn gated_with(seed: u64, config: Config) -> TestResult<Gated> {
    let sim = SimStorage::new(seed);
    let gate = Arc::new(Gate::default());
    let storage = GateStorage {
        inner: sim.clone(),
        gate: Arc::clone(&gate),
    };
    let clock = ManualClock::new(START_MS);
    let dir = PathBuf::from("/kairos");
    let engine = Engine::open_with(&dir, config, Arc::new(storage), Arc::new(clock.clone()))?;
    Ok(Gated {
        sim,
        gate,
        clock,
        dir,
        engine,
    })
}

/// Schedules tasks `0..n` at [`due`] with the payload `payload {i}`.
pub fn schedule_far(engine: &Engine, n: usize) -> TestResult {
    for i in 0..n {
        engine.schedule(&key(i), at(due(i)), format!("payload {i}").as_bytes())?;
    }
    Ok(())
}

/// The engine's poison cause, if it is poisoned (asked with a cancel of a key
/// no task has: harmless otherwise).
pub fn poisoned(engine: &Engine) -> Option<String> {
    match engine.cancel(b"probe: no such key") {
        Err(CancelError::Poisoned { cause }) => Some(cause),
        _ => None,
    }
}

/// Advances `h`'s clock by a minute, acking every delivery: each must be
/// due within that minute (not early, not late) and delivered once
/// (recorded in `fired`: key → due time, payload).
pub fn fire_one_minute(h: &super::SimHarness, fired: &mut TaskMap) -> TestResult {
    let before = h.clock.wall_ms();
    for d in h.advance(MINUTE)? {
        assert!(d.fired_ms() >= d.due_ms(), "early: {:?}", d.key());
        assert!(
            d.due_ms() > before,
            "late: {:?} due {} fired after {before}",
            d.key(),
            d.due_ms()
        );
        let again = fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
        assert!(again.is_none(), "delivered twice: {:?}", d.key());
        h.engine().consumer().ack(&d)?;
    }
    Ok(())
}

/// Overflow file `n` of the data directory `dir`.
pub fn overflow_file(dir: &std::path::Path, n: u32) -> PathBuf {
    dir.join("overflow").join(kairos::overflow::file_name(n))
}

/// A data directory at `dir` on the real file system ([`cfg_one_attempt`]): far tasks `0..n`
/// (key [`key`], due [`due`], payload `payload {i}`) made far by one checkpoint (overflow file
/// 1), then `cancelled` cancelled (their entries stay); shut down cleanly. Returns what must
/// fire: key → (due, payload).
pub fn far_dir(dir: &std::path::Path, n: usize, cancelled: &[usize]) -> TestResult<TaskMap> {
    let clock = ManualClock::new(START_MS);
    let engine = super::open_fs(dir, cfg_one_attempt(), &clock)?;
    let mut model = TaskMap::new();
    for i in 0..n {
        let payload = format!("payload {i}").into_bytes();
        engine.schedule(&key(i), at(due(i)), &payload)?;
        model.insert(key(i), (due(i), payload));
    }
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, n);
    for &i in cancelled {
        assert!(engine.cancel(&key(i))?.is_cancelled());
        model.remove(&key(i));
    }
    engine.shutdown()?;
    Ok(model)
}

/// The entries of overflow file `n` of data directory `dir` (on the real file system): key →
/// (offset, task id).
pub fn overflow_entries(
    dir: &std::path::Path,
    n: u32,
) -> TestResult<std::collections::BTreeMap<Vec<u8>, (u64, u64)>> {
    Ok(kairos::overflow::read_file(
        &kairos_wal::FsStorage,
        &overflow_file(dir, n),
        None,
        Some(n),
    )?
    .into_iter()
    .map(|(offset, e)| (e.key.to_vec(), (offset, e.task_id)))
    .collect())
}

/// Runs `engine` to `until_ms` minute by minute, acking everything; what fired, key → (due,
/// payload), checking nothing fires twice and the engine is not poisoned.
pub fn fire_on(engine: &Engine, clock: &ManualClock, until_ms: u64) -> TestResult<TaskMap> {
    let mut fired = TaskMap::new();
    loop {
        for d in super::drain(engine)? {
            let again = fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
            assert!(
                again.is_none(),
                "twice: {:?}",
                String::from_utf8_lossy(d.key())
            );
            engine.consumer().ack(&d)?;
        }
        if let Some(cause) = poisoned(engine) {
            return Err(format!("poisoned: {cause}").into());
        }
        if clock.wall_ms() >= until_ms {
            return Ok(fired);
        }
        clock.advance(MINUTE);
    }
}

/// Opens the data directory `dir` (real file system) with [`cfg_one_attempt`] at `at_ms`,
/// runs the clock to `until_ms` acking everything ([`fire_on`]), shuts down cleanly; what
/// fired.
pub fn fire_dir(dir: &std::path::Path, at_ms: u64, until_ms: u64) -> TestResult<TaskMap> {
    let clock = ManualClock::new(at_ms);
    let engine = super::open_fs(dir, cfg_one_attempt(), &clock)?;
    let fired = fire_on(&engine, &clock, until_ms)?;
    engine.shutdown()?;
    Ok(fired)
}

/// The overflow entry holding the task of `key` in data directory `dir` on `sim` (every
/// overflow file read whole): its file's name, its offset and its task id.
pub fn sim_entry_of(
    sim: &SimStorage,
    dir: &std::path::Path,
    key: &[u8],
) -> TestResult<(String, u64, u64)> {
    use kairos_wal::Storage;
    let dir = dir.join("overflow");
    for name in sim.list(&dir)? {
        for (offset, entry) in kairos::overflow::read_file(sim, &dir.join(&name), None, None)? {
            if *entry.key == *key {
                return Ok((name, offset, entry.task_id));
            }
        }
    }
    Err(format!("no overflow entry of {:?}", String::from_utf8_lossy(key)).into())
}
