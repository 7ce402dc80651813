//! Out-of-process crash tests (redb's and sled's crash loops): the test re-runs its own binary
//! as a child that works on a real directory, and SIGKILLs it at a random moment.
//!
//! The child reports each completed call on stdout only *after* the call returned, so every
//! line the parent reads names a call the engine acknowledged under `Durability::Sync`; the
//! pipe keeps lines written before the kill. After the kill the parent reopens the directory
//! and checks that each acknowledged call took effect.
//!
//! Checkpoints: in every round of the schedule/cancel loop the child takes one explicit
//! checkpoint (`Engine::checkpoint`) before the call the parent names, announcing it first;
//! in half the rounds the parent kills the child up to 20 ms after that announcement instead
//! of after a number of calls, so kills land while the checkpoint file is written and synced,
//! older checkpoints removed and covered segments deleted (a checkpoint here takes a few ms). Every other
//! group of three rounds also runs the background checkpointer with a 4 KiB log-growth trigger
//! (`Config::checkpoint_log_bytes`), racing the child's calls (it triggers while the state is
//! small: the trigger is at least the last checkpoint's size).

mod common;

use common::child::ChildProc;
use common::{key, payload, scale, scaled, TestResult, START_MS};
use kairos::{CancelOutcome, Config, Due, Durability, Engine, ManualClock};
use kairos_wal::FsStorage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Set in the child: the name of the test whose child body to run.
const ROLE_VAR: &str = "KAIROS_CRASH_CHILD";
/// Set in the child: the data directory.
const DIR_VAR: &str = "KAIROS_CRASH_DIR";
/// Set in the child: its round number.
const ROUND_VAR: &str = "KAIROS_CRASH_ROUND";
/// Set in the child: the wall-clock base of due times, ms.
const BASE_VAR: &str = "KAIROS_CRASH_BASE_MS";
/// How far ahead of the parent's start the due times begin, ms.
const BASE_AHEAD_MS: u64 = 3_600_000;
/// Set in the child: before which call it takes its checkpoint.
const CHECKPOINT_VAR: &str = "KAIROS_CRASH_CHECKPOINT_AT";

/// Kills per crash test: `KAIROS_CRASH_KILLS` if set, else `ci` scaled by
/// `KAIROS_TEST_SCALE`.
fn kill_count(ci: usize) -> u64 {
    std::env::var("KAIROS_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| scaled(ci, 1_000) as u64)
}

fn child_role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

fn env_u64(name: &str) -> TestResult<u64> {
    Ok(std::env::var(name)?.parse()?)
}

/// Marks protocol lines in the child's stdout. libtest writes `test NAME ... ` before running a
/// test without a newline, so a protocol line may share its line with that prefix.
const MARK: &str = "@@kairos:";

/// Starts this test binary running only `test` in child mode.
fn spawn_child(test: &str, dir: &Path, round: u64, base_ms: u64) -> TestResult<ChildProc> {
    spawn_child_with(test, dir, round, base_ms, None)
}

/// [`spawn_child`], telling the child before which call to take a checkpoint.
fn spawn_child_with(
    test: &str,
    dir: &Path,
    round: u64,
    base_ms: u64,
    checkpoint_at: Option<u64>,
) -> TestResult<ChildProc> {
    let mut env = vec![
        (ROLE_VAR, test.to_string()),
        (DIR_VAR, dir.display().to_string()),
        (ROUND_VAR, round.to_string()),
        (BASE_VAR, base_ms.to_string()),
    ];
    if let Some(at) = checkpoint_at {
        env.push((CHECKPOINT_VAR, at.to_string()));
    }
    ChildProc::spawn(test, MARK, &env)
}

/// Prints one protocol line (in the child).
fn report(line: &str) -> TestResult {
    common::child::report(MARK, line)
}

// ---------------------------------------------------------------------------------------------

const SIGKILL_TEST: &str = "sigkill_while_scheduling_loses_no_returned_call";

/// Tiny segments, so kills land during segment rolls too.
fn crash_config(durability: Durability) -> Config {
    let mut c = Config::default();
    c.durability = durability;
    c.segment_bytes = common::SMALL_SEGMENT_BYTES;
    c
}

/// The child's configuration in `round`: its mode, and in every other group of three rounds
/// the background checkpointer with a tiny log-growth trigger. Every checkpoint takes the
/// tasks (due an hour ahead) out of the wheel as far tasks: they are beyond the one-minute
/// resident window. In every fourth round there is no resident window and the horizon ends
/// 50 ms after the base of the due times (`base_ms`; task `i` is due at `base_ms + i`), with a
/// 20 ms payload window: the prefetch thread promotes far tasks back into the wheel as the
/// horizon reaches them (real time moves it 1 ms per ms), so kills land in promotions too.
fn child_config(round: u64, base_ms: u64, now_ms: u64) -> Config {
    let mut c = crash_config(mode_of(round).1);
    c.checkpoint_interval = None;
    c.checkpoint_log_bytes = background_checkpoints(round).then_some(4096);
    if marks_at_every_idle(round) {
        // The log's idle high-water mark (SYNCED) after every sync that nothing followed,
        // instead of 10 ms later (the busy child seldom pauses that long): kills land while
        // it is written.
        c.synced_mark_delay = Some(Duration::ZERO);
    }
    if far_tasks(round) {
        c.payload_window = Some(Duration::from_millis(20));
        c.resident_window = None;
        c.horizon = Some(Duration::from_millis(
            base_ms.saturating_sub(now_ms).max(20) + 50,
        ));
    }
    c
}

fn marks_at_every_idle(round: u64) -> bool {
    round / 6 % 2 == 1
}

fn far_tasks(round: u64) -> bool {
    round % 4 == 3
}

/// Far tasks the newest readable checkpoint of `dir` holds (0 if none).
fn newest_checkpoint_far_tasks(dir: &Path) -> usize {
    let ckpt_dir = dir.join(kairos::checkpoint::CHECKPOINT_DIR_NAME);
    let Ok((files, _)) = kairos::checkpoint::list(&FsStorage, &ckpt_dir) else {
        return 0;
    };
    files
        .iter()
        .rev()
        .find_map(|(_, name)| kairos::checkpoint::read(&FsStorage, &ckpt_dir.join(name)).ok())
        .map_or(0, |c| c.far.len())
}

fn background_checkpoints(round: u64) -> bool {
    round / 3 % 2 == 1
}

/// Each round runs under one mode; every mode keeps every returned call across a process
/// crash (README, "Durability contracts").
fn mode_of(round: u64) -> (&'static str, Durability) {
    match round % 3 {
        0 => ("sync", Durability::Sync),
        1 => ("interval", Durability::Interval(Duration::from_millis(20))),
        _ => ("buffered", Durability::Buffered),
    }
}

fn crash_key(round: u64, i: u64) -> Vec<u8> {
    key(&format!("r{round}-"), i as usize)
}

fn crash_payload(round: u64, i: u64) -> Vec<u8> {
    payload(&format!("crash-r{round}"), i as usize, 100)
}

/// The child's calls, the same in parent and child: in every five, four schedules (task
/// `4g..4g+4`, due `base + task` ms) and a cancel of the second of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashOp {
    Schedule(u64),
    Cancel(u64),
}

fn crash_op(n: u64) -> CrashOp {
    let (group, r) = (n / 5, n % 5);
    if r < 4 {
        CrashOp::Schedule(4 * group + r)
    } else {
        CrashOp::Cancel(4 * group + 1)
    }
}

/// How many tasks a round's first `ops` calls leave live: `crash_state(..).len()` without
/// building it (the parent asks for every earlier round at each kill).
fn crash_live(ops: u64) -> usize {
    // Every fifth call cancels a task an earlier call of its group scheduled.
    (ops - 2 * (ops / 5)) as usize
}

/// A round's live tasks after its first `ops` calls.
fn crash_state(round: u64, base_ms: u64, ops: u64) -> common::TaskMap {
    let mut state = common::TaskMap::new();
    for n in 0..ops {
        match crash_op(n) {
            CrashOp::Schedule(i) => {
                state.insert(crash_key(round, i), (base_ms + i, crash_payload(round, i)));
            }
            CrashOp::Cancel(i) => {
                state.remove(&crash_key(round, i));
            }
        }
    }
    state
}

/// Child: makes its calls until killed (a cap keeps a forgotten child from running for
/// ever), reporting each after it returned.
fn sigkill_child() -> TestResult {
    let dir = std::env::var(DIR_VAR)?;
    let round = env_u64(ROUND_VAR)?;
    let base_ms = env_u64(BASE_VAR)?;
    let checkpoint_at = env_u64(CHECKPOINT_VAR).ok();
    let now_ms = kairos::clock::system_time_to_ms(std::time::SystemTime::now()).unwrap_or(0);
    let engine = Engine::open(&dir, child_config(round, base_ms, now_ms))?;
    report(&format!("ready {}", engine.recovery().pending))?;
    for n in 0..100_000u64 {
        if checkpoint_at == Some(n) {
            report("checkpoint begin")?;
            let r = engine.checkpoint()?;
            report(&format!(
                "checkpoint lsn {} written {} took {} us promoted {} segments removed {}",
                r.lsn,
                r.written,
                r.elapsed.as_micros(),
                engine.stats().far_promoted,
                r.segments_removed
            ))?;
        }
        match crash_op(n) {
            CrashOp::Schedule(i) => {
                let due = Due::At(kairos::clock::ms_to_system_time(base_ms + i));
                engine.schedule(&crash_key(round, i), due, &crash_payload(round, i))?;
            }
            CrashOp::Cancel(i) => {
                let outcome = engine.cancel(&crash_key(round, i))?;
                if !outcome.is_cancelled() {
                    return Err(format!("cancel {i}: {outcome:?}").into());
                }
            }
        }
        report(&format!("op {n}"))?;
    }
    Ok(())
}

#[test]
fn sigkill_while_scheduling_loses_no_returned_call() -> TestResult {
    if child_role().as_deref() == Some(SIGKILL_TEST) {
        return sigkill_child();
    }
    for ops in 0..=40 {
        assert_eq!(
            crash_live(ops),
            crash_state(0, 0, ops).len(),
            "after {ops} calls"
        );
    }
    let dir = tempfile::tempdir()?;
    // Due an hour from now in real time, so nothing fires while children run.
    let now_ms = kairos::clock::system_time_to_ms(std::time::SystemTime::now()).ok_or("clock")?;
    let base_ms = now_ms + BASE_AHEAD_MS;
    // CI: a few dozen kills; `KAIROS_CRASH_KILLS=1000` for a long run.
    let kills = kill_count(30);
    let mut rng = rand::rng();
    // round → calls acknowledged.
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut checkpoints, mut segments_removed) = (0u64, 0u64);
    let mut checkpoint_us: Vec<u64> = Vec::new();
    let (mut kills_in_checkpoint, mut kills_before_checkpoint_returned) = (0u64, 0u64);
    let (mut kills_while_marking, mut marked_rounds) = (0u64, 0u64);
    let mut synced_before: Option<Vec<u8>> = None;
    // Far tasks in the newest checkpoint after each kill of a round with a short horizon.
    let mut far_seen = 0usize;
    let mut far_promoted = 0u64;
    for round in 0..kills {
        let kill_after = rand::Rng::random_range(&mut rng, 1..=150u64);
        // The checkpoint comes before a call the child reaches; in half the rounds the kill
        // comes a moment after it began instead of after `kill_after` calls.
        let checkpoint_at = rand::Rng::random_range(&mut rng, 0..kill_after);
        let kill_in_checkpoint = rand::Rng::random_bool(&mut rng, 0.5).then(|| {
            // Microseconds after the child announced it: a checkpoint of this test takes a few
            // milliseconds (half a dozen fsyncs), so the kill lands at any of its steps.
            let most = match rand::Rng::random_range(&mut rng, 0..3) {
                0 => 500,
                1 => 5_000,
                _ => 20_000,
            };
            rand::Rng::random_range(&mut rng, 0..=most)
        });
        let mut child = spawn_child_with(
            SIGKILL_TEST,
            dir.path(),
            round,
            base_ms,
            Some(checkpoint_at),
        )?;
        let pending = match child.next_line()? {
            Some(l) if l.starts_with("ready ") => l["ready ".len()..].parse::<usize>()?,
            other => {
                return Err(child.fail(format!(
                    "round {round} ({}): child did not open: {other:?}",
                    mode_of(round).0
                )))
            }
        };
        // Every earlier round's acknowledged calls are in; its call in flight (a schedule or
        // a cancel) may be too.
        let (low, high) = acked.values().fold((0, 0), |(low, high), &k| {
            let (before, after) = (crash_live(k), crash_live(k + 1));
            (low + before.min(after), high + before.max(after))
        });
        if !(low..=high).contains(&pending) {
            return Err(child.fail(format!(
                "round {round}: child reopened with {pending} pending, expected {low}..={high}"
            )));
        }
        let mut count = 0;
        let mut checkpoint_returned = false;
        // A protocol line: a call (`true`), or the checkpoint's start or end.
        let mut line = |l: &str, count: &mut u64| -> Result<bool, String> {
            if l == format!("op {count}") {
                *count += 1;
                Ok(true)
            } else if l == "checkpoint begin" && *count == checkpoint_at {
                Ok(false)
            } else if let Some(rest) = l.strip_prefix("checkpoint lsn ") {
                checkpoints += 1;
                checkpoint_returned = true;
                if far_tasks(round) {
                    far_promoted += rest
                        .split(" promoted ")
                        .nth(1)
                        .and_then(|t| t.split(' ').next())
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                if let Some(us) = rest
                    .split(" took ")
                    .nth(1)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    checkpoint_us.push(us);
                }
                segments_removed += rest
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| format!("round {round}: bad line {l:?}"))?;
                Ok(false)
            } else {
                Err(format!("round {round}: unexpected line {l:?}"))
            }
        };
        loop {
            if kill_in_checkpoint.is_none() && count >= kill_after {
                break;
            }
            let Some(l) = child.next_line()? else {
                return Err(child.fail(format!("round {round}: the child ended")));
            };
            if let Err(e) = line(&l, &mut count) {
                return Err(child.fail(e));
            }
            if let (Some(delay_us), "checkpoint begin") = (kill_in_checkpoint, l.as_str()) {
                std::thread::sleep(Duration::from_micros(delay_us));
                kills_in_checkpoint += 1;
                break;
            }
        }
        child.kill()?;
        // Lines already in the pipe are acknowledged calls too.
        while let Some(l) = child.next_line()? {
            if let Err(e) = line(&l, &mut count) {
                return Err(child.fail(e));
            }
        }
        let (success, _) = child.wait()?;
        assert!(
            !success,
            "round {round}: the child finished before the kill"
        );
        if kill_in_checkpoint.is_some() && !checkpoint_returned {
            kills_before_checkpoint_returned += 1;
        }
        acked.insert(round, count);
        let wal_dir = dir.path().join("wal");
        if wal_dir.join("SYNCED.tmp").exists() {
            kills_while_marking += 1;
        }
        let synced_now = std::fs::read(wal_dir.join("SYNCED")).ok();
        if synced_now != synced_before {
            marked_rounds += 1;
        }
        synced_before = synced_now;
        if far_tasks(round) {
            far_seen += newest_checkpoint_far_tasks(dir.path());
        }
    }

    // Reopen on a manual clock past every due time: everything live comes out at once.
    let clock = ManualClock::new(base_ms + 3_600_000);
    let engine = Engine::open_with(
        dir.path(),
        crash_config(Durability::Sync),
        Arc::new(FsStorage),
        Arc::new(clock),
    )?;
    let got = common::by_key(&common::drain(&engine)?)?;
    let mut total = 0;
    for (&round, &count) in &acked {
        let prefix = format!("r{round}-").into_bytes();
        let mine: common::TaskMap = got
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        total += mine.len();
        // Exactly the acknowledged calls, plus perhaps the one in flight at the kill.
        let acknowledged = crash_state(round, base_ms, count);
        if mine != acknowledged && mine != crash_state(round, base_ms, count + 1) {
            let lost: Vec<_> = acknowledged
                .keys()
                .filter(|k| !mine.contains_key(*k))
                .collect();
            let extra: Vec<_> = mine
                .keys()
                .filter(|k| !acknowledged.contains_key(*k))
                .collect();
            return Err(format!(
                "round {round} ({}): {count} calls acknowledged; lost {lost:?}, unexpected {extra:?}",
                mode_of(round).0
            )
            .into());
        }
    }
    assert_eq!(total, got.len(), "tasks nobody scheduled");
    engine.shutdown()?;
    eprintln!(
        "{kills} SIGKILLs ({kills_in_checkpoint} a moment after a checkpoint began, \
         {kills_before_checkpoint_returned} of them before it returned), {} acknowledged calls, {checkpoints} checkpoints completed ({segments_removed} segments \
         removed; far tasks in the newest checkpoint after the kills of short-horizon rounds: \
         {far_seen}, promoted in those rounds before their checkpoint: {far_promoted}), {total} tasks recovered (scale {}); SYNCED rewritten in {marked_rounds} rounds, \
         {kills_while_marking} kills left a SYNCED.tmp \
         (killed while writing it)",
        acked.values().sum::<u64>(),
        scale()
    );
    checkpoint_us.sort_unstable();
    eprintln!(
        "checkpoint durations: median {} us, max {} us",
        checkpoint_us.get(checkpoint_us.len() / 2).unwrap_or(&0),
        checkpoint_us.last().unwrap_or(&0)
    );
    assert!(
        checkpoints > 0 && segments_removed > 0,
        "no checkpoint removed a segment"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------

const SCENARIO_07_TEST: &str = "scenario_07_cancel_survives_sigkill";

/// Child: on a manual clock, schedule +5 s, move to +1 s, cancel, report, wait to be killed.
fn scenario_07_child() -> TestResult {
    let dir = std::env::var(DIR_VAR)?;
    let clock = ManualClock::new(env_u64(BASE_VAR)?);
    let engine = Engine::open_with(
        &dir,
        crash_config(Durability::Sync),
        Arc::new(FsStorage),
        Arc::new(clock.clone()),
    )?;
    engine.schedule_after(
        b"order:7:timeout",
        Duration::from_secs(5),
        b"cancel order 7",
    )?;
    engine.schedule_after(
        b"order:8:timeout",
        Duration::from_secs(5),
        b"cancel order 8",
    )?;
    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    let outcome = engine.cancel(b"order:7:timeout")?;
    report(&format!("{outcome:?}"))?;
    loop {
        std::thread::park(); // until the SIGKILL
    }
}

/// Scenario 7 with a real SIGKILL: schedule +5 s, cancel at +1 s (Cancelled), kill, reopen at
/// +2 s, run past +10 s: never fires; a second cancel says NotFound.
#[test]
fn scenario_07_cancel_survives_sigkill() -> TestResult {
    if child_role().as_deref() == Some(SCENARIO_07_TEST) {
        return scenario_07_child();
    }
    for round in 0..scaled(1, 20) as u64 {
        let dir = tempfile::tempdir()?;
        let mut child = spawn_child(SCENARIO_07_TEST, dir.path(), round, START_MS)?;
        let line = child.next_line()?;
        if line.as_deref() != Some("Cancelled { deliveries: 0 }") {
            return Err(child.fail(format!("cancel at +1 s answered {line:?}, not Cancelled")));
        }
        child.kill()?;
        let (success, _) = child.wait()?;
        assert!(!success, "the child ended before the kill");

        let clock = ManualClock::new(START_MS + 2_000);
        let engine = Engine::open_with(
            dir.path(),
            crash_config(Durability::Sync),
            Arc::new(FsStorage),
            Arc::new(clock.clone()),
        )?;
        assert_eq!(engine.recovery().pending, 1);
        let mut fired = Vec::new();
        for _ in 0..9 {
            fired.extend(common::advance(&clock, &engine, Duration::from_secs(1))?);
        }
        assert_eq!(
            common::triples(&fired),
            vec![(
                "order:8:timeout".to_string(),
                b"cancel order 8".to_vec(),
                START_MS + 5_000
            )]
        );
        assert_eq!(engine.cancel(b"order:7:timeout")?, CancelOutcome::NotFound);
        engine.shutdown()?;
    }
    Ok(())
}
