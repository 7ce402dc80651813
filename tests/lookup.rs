//! `Engine::lookup`: a live task's id, due time, state and deliveries by
//! key, changing nothing — through every state, for keys no live task has,
//! for far tasks read in place from their overflow file (across a crash),
//! after shutdown (and during one) and on a damaged overflow entry, and on
//! a thread of its own against background moves, promotion, prefetching,
//! cancels and reschedules. The model test
//! (`tests/model.rs`) checks every key's lookup after every step as well.

mod common;

use common::far::{at, cfg, due, key as far_key, schedule_far};
use common::{config, SimHarness, Stop, TestResult, START_MS};
use kairos::{
    CancelError, CancelOutcome, Config, Durability, Engine, LookupError, ManualClock, NackOutcome,
    RetryPolicy, ScheduleError, TaskId, TaskInfo, TaskState,
};
use kairos_wal::storage::Storage;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
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

/// What every call on an engine poisoned by `cause` says (the remedy included).
fn poisoned_message(cause: &str) -> String {
    format!(
        "the engine is poisoned: {cause} (a poisoned engine takes no more changes: shut it \
         down, deal with the cause, and open the directory again)"
    )
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
    assert_eq!(
        LookupError::Poisoned {
            cause: cause.clone()
        }
        .to_string(),
        poisoned_message(&cause)
    );
    // Every call after it says so alike: a failed read poisoned the engine.
    let Err(cancelled) = h.engine().cancel(b"other") else {
        return Err("a cancel on a poisoned engine".into());
    };
    assert!(matches!(cancelled, CancelError::Poisoned { .. }));
    assert_eq!(cancelled.to_string(), poisoned_message(&cause));
    let Err(scheduled) = h
        .engine()
        .schedule_after(b"other", Duration::from_secs(1), b"")
    else {
        return Err("a schedule on a poisoned engine".into());
    };
    assert!(matches!(scheduled, ScheduleError::Poisoned { .. }));
    assert_eq!(scheduled.to_string(), poisoned_message(&cause));
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

/// Keys of the race test.
const RACE_KEYS: usize = 300;

/// Key `i` of the race test.
fn race_key(i: usize) -> Vec<u8> {
    format!("k-{i:05}").into_bytes()
}

/// Due 3 to 35 minutes on: each goes far at a checkpoint or move, comes
/// back within the one-minute far span as the clock runs, then falls due.
fn race_due(i: usize) -> u64 {
    START_MS + 3 * 60_000 + (i as u64 % 97) * 20_000 + i as u64
}

/// Where a reschedule moves task `i`.
fn race_new_due(i: usize) -> u64 {
    race_due(i) + 7 * 60_000
}

/// Lookups on a thread of their own while background checkpoints and far
/// moves take tasks out of memory, the clock brings them back (promotion,
/// the prefetcher reading their payloads) and hands them out, and another
/// thread cancels a third of the keys and reschedules another third: a
/// key never touched always answers its id and due time (`Scheduled`, or
/// `Ready` once due: nobody receives), a key whose cancel returned `None`,
/// one whose reschedule returned the new due time; in between, either.
#[test]
fn lookup_under_background_moves_promotion_and_prefetch() -> TestResult {
    let mut c = config(Durability::Sync);
    c.payload_window = Some(Duration::from_secs(60));
    c.resident_window = Some(Duration::from_secs(60));
    c.horizon = Some(Duration::from_secs(3600));
    c.payload_prefetch = true;
    c.checkpoint_interval = Some(Duration::from_millis(5));
    c.relocate_far_tasks = Some(16);
    let h = SimHarness::new(901, c)?;
    let engine = h.engine();
    let mut ids = Vec::new();
    for i in 0..RACE_KEYS {
        ids.push(engine.schedule(&race_key(i), at(race_due(i)), format!("p{i}").as_bytes())?);
    }
    engine.checkpoint()?;
    // 0: untouched; 1: cancel done; 2: reschedule done.
    let flags: Vec<AtomicU8> = (0..RACE_KEYS).map(|_| AtomicU8::new(0)).collect();
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    std::thread::scope(|s| -> TestResult {
        let checker = s.spawn(|| -> TestResult {
            while !stop.load(Ordering::SeqCst) {
                for i in 0..RACE_KEYS {
                    let before = flags[i].load(Ordering::SeqCst);
                    let got = engine.lookup(&race_key(i))?;
                    let after = flags[i].load(Ordering::SeqCst);
                    lookups.fetch_add(1, Ordering::Relaxed);
                    // Due tasks are handed out (no consumer takes them).
                    let got = got.map(|t| {
                        let state = if t.state == TaskState::Ready {
                            TaskState::Scheduled
                        } else {
                            t.state
                        };
                        (t.id, t.due_ms, state, t.deliveries)
                    });
                    let orig = Some((ids[i], race_due(i), TaskState::Scheduled, 0));
                    let moved = Some((ids[i], race_new_due(i), TaskState::Scheduled, 0));
                    let ok = match (i % 3, before, after) {
                        (0, 0, 0) => got == orig,
                        (1, 1, _) => got.is_none(),
                        (1, 0, _) => got.is_none() || got == orig,
                        (2, 2, _) => got == moved,
                        (2, 0, _) => got == orig || got == moved,
                        _ => false,
                    };
                    assert!(ok, "key {i}: {got:?} (flags {before}->{after})");
                }
            }
            Ok(())
        });
        let mutator = s.spawn(|| -> TestResult {
            for (i, flag) in flags.iter().enumerate() {
                match i % 3 {
                    1 => {
                        let out = engine.cancel(&race_key(i))?;
                        assert!(
                            matches!(out, CancelOutcome::Cancelled { deliveries: 0 }),
                            "{i}: {out:?}"
                        );
                        flag.store(1, Ordering::SeqCst);
                    }
                    2 => {
                        engine.reschedule(
                            &race_key(i),
                            at(race_new_due(i)),
                            Some(format!("q{i}").as_bytes()),
                        )?;
                        flag.store(2, Ordering::SeqCst);
                    }
                    _ => {}
                }
                std::thread::sleep(Duration::from_micros(300));
            }
            Ok(())
        });
        for _ in 0..180 {
            h.clock.advance(Duration::from_secs(10));
            engine.run_until_idle();
            std::thread::sleep(Duration::from_millis(1));
        }
        mutator.join().expect("mutator")?;
        stop.store(true, Ordering::SeqCst);
        checker.join().expect("checker")?;
        Ok(())
    })?;
    assert!(lookups.load(Ordering::Relaxed) >= RACE_KEYS as u64);
    // All done: every key answers exactly, handed out once due.
    let now = h.clock.wall_ms();
    for (i, &id) in ids.iter().enumerate() {
        let expected = match i % 3 {
            1 => None,
            0 => Some(race_due(i)),
            _ => Some(race_new_due(i)),
        }
        .map(|due_ms| {
            let state = if due_ms <= now {
                TaskState::Ready
            } else {
                TaskState::Scheduled
            };
            (id, due_ms, state, 0)
        });
        assert_eq!(seen(engine, &race_key(i))?, expected, "key {i}");
    }
    assert_eq!(engine.stats().pending, RACE_KEYS - RACE_KEYS / 3);
    Ok(())
}
