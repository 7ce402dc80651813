//! `Engine::lookup`: a live task's id, due time, state and deliveries by
//! key, changing nothing — through every state, for keys no live task has,
//! for far tasks read in place from their overflow file (across a crash),
//! after shutdown and on a damaged overflow entry. The model test
//! (`tests/model.rs`) checks every key's lookup after every step as well.

mod common;

use common::far::{at, cfg, due, key as far_key, schedule_far};
use common::{config, SimHarness, Stop, TestResult, START_MS};
use kairos::{
    CancelError, CancelOutcome, Config, Durability, Engine, LookupError, ManualClock, NackOutcome,
    RetryPolicy, TaskId, TaskInfo, TaskState,
};
use kairos_wal::storage::Storage;
use std::sync::Arc;
use std::time::Duration;

fn in_memory(config: Config) -> TestResult<(Engine, ManualClock)> {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(config, Arc::new(clock.clone()))?;
    Ok((engine, clock))
}

/// `(id, due_ms, state, deliveries)` of a lookup, `None` for no task.
fn seen(engine: &Engine, key: &[u8]) -> TestResult<Option<(TaskId, u64, TaskState, u32)>> {
    Ok(engine
        .lookup(key)?
        .map(|i: TaskInfo| (i.id, i.due_ms, i.state, i.deliveries)))
}

#[test]
fn lookup_follows_a_task_through_scheduled_ready_leased_and_retry() -> TestResult {
    let (engine, clock) = in_memory(config(Durability::Sync))?;
    let consumer = engine.consumer();
    let due_ms = START_MS + 10_000;
    let id = engine.schedule_after(b"order:1", Duration::from_secs(10), b"p")?;
    assert_eq!(
        seen(&engine, b"order:1")?,
        Some((id, due_ms, TaskState::Scheduled, 0))
    );
    let info = engine.lookup(b"order:1")?.ok_or("no task")?;
    assert_eq!(info.due(), kairos::clock::ms_to_system_time(due_ms));

    // Due and handed out, not received yet: Ready.
    clock.advance(Duration::from_secs(10));
    engine.run_until_idle();
    assert_eq!(
        seen(&engine, b"order:1")?,
        Some((id, due_ms, TaskState::Ready, 0))
    );

    // Received: Leased, the holder's attempt.
    let d = consumer.try_recv()?;
    assert_eq!(d.attempt(), 1);
    assert_eq!(
        seen(&engine, b"order:1")?,
        Some((id, due_ms, TaskState::Leased, 1))
    );

    // Nacked with a retry in 5 s: Scheduled again, at the retry's due time.
    let retry_ms = clock.wall_ms() + 5_000;
    assert_eq!(
        consumer.nack(&d, Some(Duration::from_secs(5)), "busy")?,
        NackOutcome::Retry {
            next_attempt: 2,
            due: kairos::clock::ms_to_system_time(retry_ms)
        }
    );
    assert_eq!(
        seen(&engine, b"order:1")?,
        Some((id, retry_ms, TaskState::Scheduled, 1))
    );

    clock.advance(Duration::from_secs(5));
    engine.run_until_idle();
    let d = consumer.try_recv()?;
    assert_eq!((d.attempt(), d.due_ms()), (2, retry_ms));
    assert_eq!(
        seen(&engine, b"order:1")?,
        Some((id, retry_ms, TaskState::Leased, 2))
    );

    // Finished: the key is free.
    consumer.ack(&d)?;
    assert_eq!(seen(&engine, b"order:1")?, None);
    Ok(())
}

#[test]
fn lookup_answers_none_for_every_key_no_live_task_has() -> TestResult {
    let mut c = config(Durability::Sync);
    let mut retry = RetryPolicy::default();
    retry.max_attempts = 1;
    c.retry = retry;
    c.key_bytes_max = 16;
    let (engine, clock) = in_memory(c)?;
    let consumer = engine.consumer();

    // Never scheduled, empty, longer than any key may be.
    assert_eq!(seen(&engine, b"nobody")?, None);
    assert_eq!(seen(&engine, b"")?, None);
    assert_eq!(seen(&engine, &[b'k'; 17])?, None);

    // Cancelled while waiting.
    engine.schedule_after(b"cancelled", Duration::from_secs(1), b"")?;
    assert!(engine.cancel(b"cancelled")?.is_cancelled());
    assert_eq!(seen(&engine, b"cancelled")?, None);

    // Cancelled while a consumer holds it: the key is free, the holder
    // still acks.
    engine.schedule_after(b"held", Duration::from_secs(1), b"")?;
    // Dead-lettered after its only attempt.
    engine.schedule_after(b"dead", Duration::from_secs(1), b"")?;
    // Rescheduled: same id, the new due time.
    let kept = engine.schedule_after(b"moved", Duration::from_secs(1), b"")?;
    engine.reschedule(b"moved", kairos::Due::After(Duration::from_secs(60)), None)?;
    assert_eq!(
        seen(&engine, b"moved")?,
        Some((kept, START_MS + 60_000, TaskState::Scheduled, 0))
    );

    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    let first = consumer.try_recv()?;
    let second = consumer.try_recv()?;
    let (held, dead) = if first.key() == b"held" {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(
        engine.cancel(b"held")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    assert_eq!(seen(&engine, b"held")?, None);
    consumer.ack(&held)?;
    assert_eq!(seen(&engine, b"held")?, None);

    assert_eq!(
        consumer.nack(&dead, None, "boom")?,
        NackOutcome::DeadLettered
    );
    assert_eq!(seen(&engine, b"dead")?, None);
    assert_eq!(engine.dead_letters().len(), 1);

    assert_eq!(
        seen(&engine, b"moved")?,
        Some((kept, START_MS + 60_000, TaskState::Scheduled, 0))
    );
    Ok(())
}

/// A far task is looked up in its overflow file, where it stays: the far
/// count and the payloads on disk do not change; the same answer after a
/// process crash and after a power cut.
#[test]
fn lookup_of_a_far_task_reads_it_in_place_across_restarts() -> TestResult {
    for stop in [Stop::ProcessCrash, Stop::PowerCut, Stop::Clean] {
        let mut h = SimHarness::new(341, cfg())?;
        let ids: Vec<TaskId> = (0..3)
            .map(|i| h.engine().schedule(&far_key(i), at(due(i)), b"far"))
            .collect::<Result<_, _>>()?;
        h.engine().checkpoint()?;
        for round in 0..2 {
            let before = h.engine().stats();
            assert_eq!(before.far, 3, "{stop:?} round {round}");
            for (i, id) in ids.iter().enumerate() {
                assert_eq!(
                    seen(h.engine(), &far_key(i))?,
                    Some((*id, due(i), TaskState::Scheduled, 0)),
                    "{stop:?} round {round} task {i}"
                );
            }
            let after = h.engine().stats();
            assert_eq!(
                (after.far, after.payloads_on_disk, after.pending),
                (before.far, before.payloads_on_disk, before.pending),
                "{stop:?} round {round}: the lookup moved a far task"
            );
            h.restart(stop)?;
        }
    }
    Ok(())
}

#[test]
fn lookup_after_shutdown_is_closed() -> TestResult {
    let (engine, _clock) = in_memory(config(Durability::Sync))?;
    engine.schedule_after(b"a", Duration::from_secs(1), b"")?;
    engine.shutdown()?;
    assert!(matches!(engine.lookup(b"a"), Err(LookupError::Closed)));
    assert_eq!(
        engine.lookup(b"a").map_err(|e| e.to_string()),
        Err("the engine is shut down".to_owned())
    );
    Ok(())
}

/// A far task whose overflow entry is damaged: the lookup reports the
/// damage (file and offset), poisons the engine as a cancel of it would,
/// and a reopen refuses nothing it did not refuse before.
#[test]
fn lookup_of_a_damaged_far_entry_poisons_and_names_the_file() -> TestResult {
    let mut h = SimHarness::new(342, cfg())?;
    schedule_far(h.engine(), 1)?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 1);
    h.restart(Stop::Clean)?;
    let dir = h.dir.join("overflow");
    let file = h
        .sim
        .list(&dir)?
        .into_iter()
        .find(|n| n.ends_with(".ovf"))
        .ok_or("no overflow file")?;
    let path = dir.join(&file);
    let mut bytes = h.sim.read_file(&path).ok_or("overflow file vanished")?;
    let last = bytes.len() - 2;
    bytes[last] ^= 0x10;
    h.sim.write_file(&path, &bytes);

    let Err(LookupError::Poisoned { cause }) = h.engine().lookup(&far_key(0)) else {
        return Err("a damaged far entry was looked up".into());
    };
    assert!(cause.contains(&file), "cause names no file: {cause}");
    assert!(matches!(
        h.engine().cancel(b"other"),
        Err(CancelError::Poisoned { .. })
    ));
    assert!(matches!(
        h.engine().lookup(b"other"),
        Err(LookupError::Poisoned { .. })
    ));
    Ok(())
}

/// A key whose far candidates are not it (another key of the same hash
/// bucket is far, this one is not): `None`, and nothing moves.
#[test]
fn lookup_of_a_near_task_beside_far_ones() -> TestResult {
    let h = SimHarness::new(343, cfg())?;
    schedule_far(h.engine(), 5)?;
    let near = h
        .engine()
        .schedule_after(b"near", Duration::from_secs(30), b"n")?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 5);
    assert_eq!(
        seen(h.engine(), b"near")?,
        Some((near, START_MS + 30_000, TaskState::Scheduled, 0))
    );
    assert_eq!(seen(h.engine(), b"far-9999")?, None);
    assert_eq!(h.engine().stats().far, 5);
    Ok(())
}

/// A lookup that reads a far task's entry while a shutdown is under way
/// (the engine closed, its tasks not yet released: the shutdown waits for
/// a checkpoint, held here at its overflow file's rename) and fails to
/// read it answers `Closed`, as it would a moment later: it does not poison
/// the closed engine, whose shutdown then releases the ready tasks and
/// succeeds. (Before, the failed read turned the closed engine poisoned and
/// the shutdown failed with that cause.)
#[test]
fn a_far_read_failing_during_a_shutdown_answers_closed_and_poisons_nothing() -> TestResult {
    use common::far::gated;
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let g = gated(347)?;
    let engine = &g.engine;
    schedule_far(engine, 2)?;
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 2);
    // One more far task: the next checkpoint writes an overflow file.
    engine.schedule(&far_key(2), at(due(2)), b"far")?;
    g.gate.arm_rename(std::path::Path::new("/kairos/overflow"));
    std::thread::scope(|s| -> TestResult {
        let checkpoint = s.spawn(|| engine.checkpoint());
        g.gate.wait_hit();
        let shutdown = s.spawn(|| engine.shutdown());
        // The shutdown has closed the engine and waits for the checkpoint.
        let consumer = engine.consumer();
        let closed = common::wait_until("the engine closed", || {
            consumer.try_recv().err() == Some(kairos::RecvError::Closed)
        });
        if closed.is_err() {
            g.gate.release();
        }
        closed?;
        // The far entry cannot be read (its file opened, or read through a
        // kept descriptor): nothing else does I/O now.
        g.sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Any,
            kind: FaultKind::Eio,
        });
        let looked = engine.lookup(&far_key(0));
        g.sim.clear_faults();
        // Let the threads finish before anything is asserted.
        g.gate.release();
        let _ = checkpoint.join().expect("checkpoint thread");
        let shut = shutdown.join().expect("shutdown thread");
        assert!(matches!(looked, Err(LookupError::Closed)), "{looked:?}");
        assert!(shut.is_ok(), "{shut:?}");
        Ok(())
    })?;
    assert!(matches!(
        engine.cancel(&far_key(0)),
        Err(CancelError::Closed)
    ));
    Ok(())
}
