//! Fail every I/O operation once (issue 5, item 3; SQLite's I/O-error tests, redb's fault
//! countdown). A fixed workload — open, single and batch schedules with segment rolls,
//! cancels, a checkpoint (which deletes the segments it covers), more schedules, a reschedule,
//! deliveries, acks, nacks, a dead letter, a second checkpoint (which deletes more segments and
//! the first checkpoint file), the dead letter's requeue, shutdown — runs once without faults
//! to count its I/O operations and record every answer. Then for every N and every fault kind
//! it runs again on a fresh simulated disk whose N-th operation fails. Each run must:
//!
//! * never panic, and answer every call either exactly as the fault-free run did or with a
//!   typed error — and once a call has failed for I/O, every later call that needs the log
//!   fails too (a failed write or fsync poisons; nothing more is acknowledged). A failed
//!   checkpoint is the exception the engine documents: `CheckpointError::Io` (the checkpoint
//!   file) and `CheckpointError::Trim` (trimming the log) leave the engine usable, and the workload
//!   goes on, every later answer still the fault-free run's (a checkpoint's count of segments
//!   removed aside: a later one removes what the failed one did not); a `Wal` error from
//!   syncing the log, or `Poisoned`, poisons like any other failure;
//! * after a power cut that drops everything unsynced, reopen without repair into a state
//!   that keeps every acknowledged effect: a task whose schedule returned `Ok` (and that no
//!   acknowledged cancel, ack or dead letter finished) is still there; a task whose cancel
//!   returned `Cancelled`, or whose ack returned `Ok`, never comes back. Calls that failed
//!   leave their task's fate open, and the check skips those tasks.

mod common;

use common::{TestResult, START_MS};
use kairos::checkpoint::{CHECKPOINT_DIR_NAME, CHECKPOINT_SUFFIX};
use kairos::{
    CheckpointError, CheckpointReport, Config, Consumer, Delivery, Due, Durability, Engine,
    ManualClock, NewTask, RecvError, RetryPolicy,
};
use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan, Storage};
use kairos_wal::SimStorage;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const DIR: &str = "/kairos";

fn config() -> Config {
    let mut c = Config::default();
    c.durability = Durability::Sync;
    c.segment_bytes = common::SMALL_SEGMENT_BYTES;
    c.lease = Duration::from_secs(60);
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    c.payload_prefetch = false;
    // Short enough that the first checkpoint moves payloads to disk and
    // the tasks due after 4 s out of the wheel (far), and the clock moves
    // below promote them back: every I/O of those steps is failed too.
    c.payload_window = Some(Duration::from_secs(2));
    c.horizon = Some(Duration::from_secs(4));
    let mut retry = RetryPolicy::default();
    retry.max_attempts = 2;
    retry.backoff_jitter_percent = 0;
    c.retry = retry;
    c
}

fn open(sim: &SimStorage, clock: &ManualClock) -> Result<Engine, kairos::OpenError> {
    Engine::open_with(
        Path::new(DIR),
        config(),
        Arc::new(sim.clone()),
        Arc::new(clock.clone()),
    )
}

/// What became of a task, as far as acknowledged calls tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Scheduled (or requeued) and not finished by an acknowledged call.
    Live,
    /// A cancel answered `Cancelled`, or an ack returned `Ok`: it never comes back.
    Finished,
    /// Dead-lettered by an acknowledged nack.
    Dead,
}

/// The workload's record of answers and acknowledged effects.
#[derive(Default)]
struct Run {
    answers: Vec<String>,
    fates: BTreeMap<Vec<u8>, Fate>,
    /// Tasks a failed call touched: their fate is unknown.
    uncertain: BTreeSet<Vec<u8>>,
    /// Whether a call has failed (the engine must refuse everything after).
    failed: bool,
    /// Segments each acknowledged checkpoint removed.
    segments_removed: Vec<usize>,
    /// Checkpoints that failed and left the engine usable.
    checkpoints_failed: usize,
}

impl Run {
    /// Records a call's answer; on `Ok`, applies `effect`; on `Err`, marks `keys` uncertain.
    fn call<T: std::fmt::Debug, E: std::fmt::Debug>(
        &mut self,
        what: &str,
        keys: &[&[u8]],
        result: Result<T, E>,
        effect: impl FnOnce(&mut Self, &T),
    ) -> Option<T> {
        match result {
            Ok(v) => {
                self.answers.push(format!("{what}: Ok({v:?})"));
                effect(self, &v);
                Some(v)
            }
            Err(e) => {
                self.answers.push(format!("{what}: Err({e:?})"));
                self.failed = true;
                self.uncertain.extend(keys.iter().map(|k| k.to_vec()));
                None
            }
        }
    }
}

impl Run {
    /// Records a checkpoint's answer (without the segments it removed, which depend on
    /// whether an earlier checkpoint failed). `None` if the failure poisoned the engine (the
    /// workload stops); a failure the engine survives lets it go on.
    fn checkpoint(
        &mut self,
        what: &str,
        result: Result<CheckpointReport, CheckpointError>,
    ) -> Option<()> {
        match result {
            Ok(r) => {
                self.answers.push(format!(
                    "{what}: Ok(lsn {}, written {}, tasks {}, dead letters {}, {} B)",
                    r.lsn, r.written, r.tasks, r.dead_letters, r.bytes
                ));
                self.segments_removed.push(r.segments_removed);
                Some(())
            }
            Err(e) => {
                self.answers.push(format!("{what}: Err({e:?})"));
                if common::checkpoint_error_poisons(&e) {
                    self.failed = true;
                    None
                } else {
                    self.checkpoints_failed += 1;
                    Some(())
                }
            }
        }
    }
}

fn k(i: usize) -> Vec<u8> {
    format!("task-{i:02}").into_bytes()
}

/// Receives everything ready now; `Err` if the engine refuses.
fn receive(consumer: &Consumer) -> Result<Vec<Delivery>, RecvError> {
    let mut out = Vec::new();
    loop {
        match consumer.try_recv() {
            Ok(d) => out.push(d),
            Err(RecvError::Empty) => return Ok(out),
            Err(e) => return Err(e),
        }
    }
}

fn keys_of(ds: &[Delivery]) -> Vec<String> {
    ds.iter()
        .map(|d| format!("{}#{}", String::from_utf8_lossy(d.key()), d.attempt()))
        .collect()
}

/// The fixed workload. Stops at the first failed call (everything after must fail too, which
/// `run_with_fault` checks separately on a few calls).
fn workload(sim: &SimStorage, clock: &ManualClock, run: &mut Run) -> Option<()> {
    let engine = run.call("open", &[], open(sim, clock), |_, _| ())?;
    let finished = calls(&engine, clock, run);
    if run.failed {
        // Poisoned: nothing more is acknowledged, whatever the call.
        // (A failed shutdown has reported its error; shutting down again is a no-op.)
        let failed_in_shutdown = run
            .answers
            .last()
            .is_some_and(|a| a.starts_with("shutdown"));
        let later = [
            engine
                .schedule_after(b"later", Duration::from_secs(1), b"")
                .is_err(),
            engine.cancel(b"task-05").is_err(),
            engine.consumer().try_recv().is_err(),
            engine.shutdown().is_err() || failed_in_shutdown,
        ];
        run.answers
            .push(format!("calls after the failure refused: {later:?}"));
    }
    finished
}

/// The workload's calls on an open engine; stops at the first failed one.
fn calls(engine: &Engine, clock: &ManualClock, run: &mut Run) -> Option<()> {
    let payload = [7u8; 300]; // a few hundred bytes: the 4 KiB segments roll often
    for i in 0..10 {
        let key = k(i);
        let due = Duration::from_secs(1 + i as u64);
        run.call(
            "schedule",
            &[&key],
            engine.schedule_after(&key, due, &payload),
            |r, _| {
                r.fates.insert(key.clone(), Fate::Live);
            },
        )?;
    }
    let batch_keys: Vec<Vec<u8>> = (10..20).map(k).collect();
    let batch: Vec<NewTask<'_>> = batch_keys
        .iter()
        .map(|key| NewTask {
            key,
            due: Due::After(Duration::from_secs(5)),
            payload: &payload,
        })
        .collect();
    let refs: Vec<&[u8]> = batch_keys.iter().map(Vec::as_slice).collect();
    run.call(
        "schedule_many",
        &refs,
        engine.schedule_many(&batch),
        |r, _| {
            for key in &batch_keys {
                r.fates.insert(key.clone(), Fate::Live);
            }
        },
    )?;
    for i in [0, 10] {
        let key = k(i);
        let _ = run.call("cancel", &[&key], engine.cancel(&key), |r, o| {
            if o.is_cancelled() {
                r.fates.insert(key.clone(), Fate::Finished);
            }
        })?;
    }
    // Covers the segments rolled so far: they are deleted.
    run.checkpoint("checkpoint", engine.checkpoint())?;
    // More records (and rolls) for the second checkpoint to cover; due after the workload.
    for i in 20..30 {
        let key = k(i);
        run.call(
            "schedule",
            &[&key],
            engine.schedule_after(&key, Duration::from_secs(100), &payload),
            |r, _| {
                r.fates.insert(key.clone(), Fate::Live);
            },
        )?;
    }
    let key = k(1);
    run.call(
        "reschedule",
        &[&key],
        engine.reschedule(&key, Due::After(Duration::from_secs(20)), Some(b"new")),
        |_, _| (),
    )?;
    clock.advance(Duration::from_secs(10));
    engine.run_until_idle();
    let consumer = engine.consumer();
    let ds = run.call("receive", &[], receive(&consumer), |_, _| ())?;
    run.answers.push(format!("received {:?}", keys_of(&ds)));
    // Ack the first ten at once, one more alone, nack three, leave the rest held.
    let (acked, rest) = ds.split_at(ds.len().min(10));
    let acked_keys: Vec<&[u8]> = acked.iter().map(Delivery::key).collect();
    run.call("ack_many", &acked_keys, engine.ack_many(acked), |r, _| {
        for d in acked {
            r.fates.insert(d.key().to_vec(), Fate::Finished);
        }
    })?;
    let Some((single, rest)) = rest.split_first() else {
        return Some(());
    };
    run.call("ack", &[single.key()], consumer.ack(single), |r, _| {
        r.fates.insert(single.key().to_vec(), Fate::Finished);
    })?;
    let (nacked, held) = rest.split_at(rest.len().min(3));
    for d in nacked {
        run.call(
            "nack",
            &[d.key()],
            consumer.nack(d, Some(Duration::from_secs(1)), "failed"),
            |_, _| (),
        )?;
    }
    if let Some(d) = held.last() {
        // `AlreadyDelivered`: the cancel is logged, no redelivery follows.
        let _ = run.call("cancel held", &[d.key()], engine.cancel(d.key()), |r, o| {
            if !matches!(o, kairos::CancelOutcome::NotFound) {
                r.fates.insert(d.key().to_vec(), Fate::Finished);
            }
        })?;
    }
    clock.advance(Duration::from_secs(2));
    engine.run_until_idle();
    let again = run.call("receive retries", &[], receive(&consumer), |_, _| ())?;
    run.answers.push(format!("received {:?}", keys_of(&again)));
    for d in &again {
        // The second attempt of a nacked task is its last: this nack dead-letters it.
        run.call(
            "nack last",
            &[d.key()],
            consumer.nack(d, None, "failed again"),
            |r, _| {
                r.fates.insert(d.key().to_vec(), Fate::Dead);
            },
        )?;
    }
    let dead = engine.dead_letters();
    run.answers.push(format!(
        "dead letters {:?}",
        dead.iter().map(|d| d.task_id).collect::<Vec<_>>()
    ));
    // Deletes the first checkpoint file and the segments written since.
    run.checkpoint("second checkpoint", engine.checkpoint())?;
    if let Some(first) = dead.first() {
        let key = first.key.clone();
        run.call(
            "requeue",
            &[&key],
            engine.requeue_dead_letter(first.task_id, Due::After(Duration::from_secs(30))),
            |r, _| {
                r.fates.insert(key.clone(), Fate::Live);
            },
        )?;
    }
    run.call("shutdown", &[], engine.shutdown(), |_, _| ())?;
    Some(())
}

/// Runs the workload with the `n`-th I/O operation failing as `kind`; checks the answers
/// against `reference` and the reopened state against the acknowledged effects. Returns the
/// number of failed checkpoints the engine survived.
fn run_with_fault(n: u64, kind: FaultKind, reference: &[String]) -> TestResult<usize> {
    let sim = SimStorage::new(1_000 + n);
    let clock = ManualClock::new(START_MS);
    sim.inject(FaultPlan {
        after: n,
        op: FaultOp::Any,
        kind,
    });
    let mut run = Run::default();
    workload(&sim, &clock, &mut run);
    let at = |what: String| format!("fault at I/O op {n} ({kind:?}): {what}");
    for (i, answer) in run.answers.iter().enumerate() {
        let same = reference.get(i) == Some(answer);
        let refused = answer.contains(": Err(")
            || answer == "calls after the failure refused: [true, true, true, true]";
        if !same && !refused {
            return Err(at(format!(
                "answer {i} is {answer:?}, fault-free run said {:?}",
                reference.get(i)
            ))
            .into());
        }
    }
    // Power cut: only what was synced survives. Reopen without faults, without repair.
    sim.power_cut_drop_unsynced();
    sim.clear_faults();
    let engine = open(&sim, &clock).map_err(|e| at(format!("reopen failed: {e}")))?;
    // Run the clock far past every due time and every lease, acking what comes.
    let consumer = engine.consumer();
    let mut delivered: BTreeSet<Vec<u8>> = BTreeSet::new();
    for _ in 0..10 {
        clock.advance(Duration::from_secs(3_600));
        engine.run_until_idle();
        let ds = receive(&consumer)?;
        engine.ack_many(&ds)?;
        delivered.extend(ds.iter().map(|d| d.key().to_vec()));
    }
    let dead: BTreeSet<Vec<u8>> = engine.dead_letters().into_iter().map(|d| d.key).collect();
    for (key, fate) in &run.fates {
        if run.uncertain.contains(key) {
            continue;
        }
        let name = String::from_utf8_lossy(key);
        let ok = match fate {
            Fate::Live => delivered.contains(key) || dead.contains(key),
            Fate::Finished => !delivered.contains(key) && !dead.contains(key),
            Fate::Dead => dead.contains(key) && !delivered.contains(key),
        };
        if !ok {
            return Err(at(format!(
                "{name}: acknowledged as {fate:?}, but after reopen delivered={} dead={}; \
                 answers: {:#?}; recovery: {:?}",
                delivered.contains(key),
                dead.contains(key),
                run.answers,
                engine.recovery()
            ))
            .into());
        }
    }
    if engine.stats().pending != 0 {
        return Err(at(format!("tasks left pending: {:?}", engine.stats())).into());
    }
    engine.shutdown()?;
    Ok(run.checkpoints_failed)
}

#[test]
fn every_io_operation_failing_once_ends_in_a_typed_error_and_a_consistent_reopen() -> TestResult {
    // The fault-free run: its answers and its number of I/O operations.
    let sim = SimStorage::new(999);
    let clock = ManualClock::new(START_MS);
    let mut reference = Run::default();
    workload(&sim, &clock, &mut reference);
    assert!(
        !reference.failed,
        "fault-free run failed: {:?}",
        reference.answers
    );
    let ops = sim.io_ops();
    assert!(
        ops > 50,
        "only {ops} I/O operations: the workload is too small"
    );
    assert!(
        reference.answers.iter().any(|a| a.starts_with("nack last")),
        "the workload made no dead letter: {:?}",
        reference.answers
    );
    // Both checkpoints deleted segments; the second deleted the first checkpoint file.
    assert_eq!(
        reference.segments_removed.len(),
        2,
        "{:?}",
        reference.answers
    );
    assert!(
        reference.segments_removed.iter().all(|&n| n > 0),
        "a checkpoint deleted no segment: {:?}",
        reference.segments_removed
    );
    let checkpoints: Vec<String> = sim
        .list(&Path::new(DIR).join(CHECKPOINT_DIR_NAME))?
        .into_iter()
        .filter(|n| n.ends_with(CHECKPOINT_SUFFIX))
        .collect();
    assert_eq!(
        checkpoints.len(),
        1,
        "checkpoint files left: {checkpoints:?}"
    );
    let (mut runs, mut checkpoint_failures) = (0, 0);
    for n in 0..ops + 2 {
        for kind in [FaultKind::Eio, FaultKind::ShortWrite, FaultKind::Enospc] {
            checkpoint_failures += run_with_fault(n, kind, &reference.answers)?;
            runs += 1;
        }
    }
    eprintln!(
        "{runs} runs over {ops} I/O operations; {checkpoint_failures} failed checkpoints the \
         engine survived"
    );
    assert!(checkpoint_failures > 0);
    Ok(())
}
