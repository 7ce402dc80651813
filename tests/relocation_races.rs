//! A checkpoint's relocation (`engine/checkpointing.rs`) racing with calls:
//! the move is chosen, then held at the creation of its overflow file (a
//! storage wrapper blocks that open) while cancels, reschedules (new due
//! time, new payload), duplicate schedules, promotions and deliveries run,
//! then applied over several batches; every task fires once, on time, with
//! its payload, also after a crash. (Written by a reviewing helper.) Also
//! held at the rename of the new file: payloads replaced after they were
//! copied are not moved.
mod common;

use common::far::{at, cfg, checkpoint_then_maybe_crash, fire_all, HOUR, MINUTE};
use common::gate::{Gate, GateStorage};
use common::{TestResult, START_MS};
use kairos::{CancelOutcome, Engine, ManualClock};
use kairos_wal::storage::{OpenMode, Storage};
use kairos_wal::SimStorage;
use std::path::Path;
use std::sync::Arc;

fn open_on(
    storage: Arc<dyn Storage>,
    clock: &ManualClock,
    prefetch: bool,
) -> Result<Engine, kairos::OpenError> {
    let mut c = cfg();
    c.payload_prefetch = prefetch;
    Engine::open_with("/kairos", c, storage, Arc::new(clock.clone()))
}

/// Tens of thousands of moves (several apply batches), calls and promotions
/// while the new file is written and while the batches are applied.
#[test]
fn many_moves_with_calls_and_promotion_in_between() -> TestResult {
    for (crash, prefetch) in [(false, false), (true, false)] {
        let sim = SimStorage::new(7);
        let gate = Arc::new(Gate::default());
        let storage = GateStorage {
            inner: sim.clone(),
            gate: Arc::clone(&gate),
        };
        let clock = ManualClock::new(START_MS);
        let engine = open_on(Arc::new(storage.clone()), &clock, prefetch)?;
        let mut model = std::collections::BTreeMap::new();
        let n = 30_000usize;
        let a = |i: usize| format!("A{i}").into_bytes();
        let b = |i: usize| format!("B{i}").into_bytes();
        for i in 0..n {
            let due = START_MS + 2 * 3_600_000 + 1_000 * (i as u64 % 3_600);
            let p = format!("pa{i}").into_bytes();
            engine.schedule(&a(i), at(due), &p)?;
            model.insert(a(i), (due, p));
        }
        engine.checkpoint()?;
        assert_eq!(engine.stats().far, n);
        // 60 % cancelled: file 1 is compacted at the next checkpoint.
        for i in (0..n).filter(|i| i % 5 < 3) {
            let _ = engine.cancel(&a(i))?;
            model.remove(&a(i));
        }
        for i in 0..n {
            let due = START_MS + 2 * 3_600_000 + 1_000 * (i as u64 % 3_600) + 500;
            let p = format!("pb{i}").into_bytes();
            engine.schedule(&b(i), at(due), &p)?;
            model.insert(b(i), (due, p));
        }
        gate.arm_mode(Path::new("/kairos/overflow"), OpenMode::CreateNew);
        std::thread::scope(|s| -> TestResult {
            let ckpt = s.spawn(|| engine.checkpoint());
            gate.wait_hit();
            // Planned, not applied: calls on tasks of every kind.
            let step = |i: usize,
                        model: &mut std::collections::BTreeMap<Vec<u8>, (u64, Vec<u8>)>|
             -> TestResult {
                match i % 7 {
                    0 => {
                        let k = b(i);
                        assert_eq!(
                            engine.cancel(&k)?,
                            CancelOutcome::Cancelled { deliveries: 0 }
                        );
                        model.remove(&k);
                    }
                    1 => {
                        let k = b(i);
                        let due = model[&k].0 + 3_600_000;
                        engine.reschedule(&k, at(due), None)?;
                        model.get_mut(&k).unwrap().0 = due;
                    }
                    2 => {
                        let k = b(i);
                        let due = model[&k].0;
                        engine.reschedule(&k, at(due), Some(b"new"))?;
                        model.insert(k, (due, b"new".to_vec()));
                    }
                    3 if i % 5 >= 3 => {
                        let k = a(i);
                        let due = model[&k].0 + 2 * 3_600_000;
                        engine.reschedule(&k, at(due), None)?;
                        model.get_mut(&k).unwrap().0 = due;
                    }
                    4 if i % 5 >= 3 => {
                        let k = a(i);
                        assert_eq!(
                            engine.cancel(&k)?,
                            CancelOutcome::Cancelled { deliveries: 0 }
                        );
                        model.remove(&k);
                    }
                    _ => {}
                }
                Ok(())
            };
            for i in 0..n / 2 {
                step(i, &mut model)?;
            }
            // B tasks with i % 7 == 5: rescheduled to fire soon, handed out
            // (Ready), then rescheduled back to their first due time (the
            // delivery released: a waiting first attempt again). Those with
            // i % 7 == 6 fire and are received and acked before the apply.
            let soon = clock.wall_ms() + 10_000;
            let back: Vec<(Vec<u8>, u64)> = (0..n)
                .filter(|i| i % 7 == 5 || i % 7 == 6)
                .map(|i| (b(i), model[&b(i)].0))
                .collect();
            for (k, _) in &back {
                engine.reschedule(k, at(soon), None)?;
            }
            clock.advance(MINUTE);
            engine.run_until_idle();
            let consumer = engine.consumer();
            let mut received = Vec::new();
            for (k, due) in &back {
                let i: usize = std::str::from_utf8(&k[1..]).unwrap().parse().unwrap();
                if i % 7 == 5 {
                    engine.reschedule(k, at(*due), None)?;
                }
            }
            while let Ok(d) = consumer.try_recv() {
                received.push(d);
            }
            for d in &received {
                let i: usize = std::str::from_utf8(&d.key()[1..]).unwrap().parse().unwrap();
                assert_eq!(i % 7, 6, "{:?}", String::from_utf8_lossy(d.key()));
                consumer.ack(d)?;
                model.remove(d.key());
            }
            // Some A tasks come within the horizon: promoted meanwhile.
            clock.advance(HOUR / 2 - MINUTE);
            engine.run_until_idle();
            gate.release();
            // And more calls while the batches are applied.
            for i in n / 2..n {
                step(i, &mut model)?;
                if i % 3000 == 0 {
                    clock.advance(MINUTE);
                    engine.run_until_idle();
                }
            }
            let r = ckpt.join().map_err(|_| "checkpoint thread panicked")??;
            eprintln!("{r:?}");
            Ok(())
        })?;
        // Another checkpoint on top, then maybe a crash.
        let engine = checkpoint_then_maybe_crash(engine, &sim, crash, model.len(), || {
            open_on(Arc::new(sim.clone()), &clock, prefetch)
        })?;
        let fired = fire_all(&engine, &clock, START_MS + 6 * 3_600_000)?;
        if fired != model {
            let missing: Vec<_> = model
                .keys()
                .filter(|k| !fired.contains_key(*k))
                .take(5)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            let wrong: Vec<_> = model
                .iter()
                .filter(|(k, v)| fired.get(*k).is_some_and(|f| f != *v))
                .take(5)
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        v.clone(),
                        fired[k].clone(),
                    )
                })
                .collect();
            panic!("crash {crash} prefetch {prefetch}: {} fired, {} expected; missing {missing:?}; wrong {wrong:?}", fired.len(), model.len());
        }
    }
    Ok(())
}

/// Tasks chosen to go far fall due while the new file is written; the apply
/// may run before the driver hands them out.
#[test]
fn far_moves_falling_due_before_the_apply_fire_once() -> TestResult {
    for crash in [false, true] {
        let sim = SimStorage::new(11);
        let gate = Arc::new(Gate::default());
        let storage = GateStorage {
            inner: sim.clone(),
            gate: Arc::clone(&gate),
        };
        let clock = ManualClock::new(START_MS);
        let engine = open_on(Arc::new(storage.clone()), &clock, false)?;
        let mut model = std::collections::BTreeMap::new();
        for i in 0..200usize {
            let due = START_MS + 2 * 3_600_000 + 1_000 * i as u64;
            let k = format!("T{i}").into_bytes();
            let p = format!("p{i}").into_bytes();
            engine.schedule(&k, at(due), &p)?;
            model.insert(k, (due, p));
        }
        gate.arm_mode(Path::new("/kairos/overflow"), OpenMode::CreateNew);
        std::thread::scope(|s| -> TestResult {
            let ckpt = s.spawn(|| engine.checkpoint());
            gate.wait_hit();
            clock.advance(3 * HOUR);
            gate.release();
            ckpt.join().map_err(|_| "checkpoint thread panicked")??;
            Ok(())
        })?;
        let engine = if crash {
            engine.checkpoint()?;
            drop(engine);
            sim.crash_process();
            open_on(Arc::new(sim.clone()), &clock, false)?
        } else {
            engine
        };
        let fired = fire_all(&engine, &clock, START_MS + 4 * 3_600_000)?;
        assert_eq!(fired, model, "crash {crash}: {:?}", engine.stats());
    }
    Ok(())
}

/// Takes a checkpoint that the armed `gate` pauses; meanwhile advances the
/// clock by `by` and lets the driver promote; then lets it finish.
fn checkpoint_promoting_meanwhile(
    engine: &Engine,
    gate: &Gate,
    clock: &ManualClock,
    by: std::time::Duration,
) -> TestResult {
    std::thread::scope(|s| -> TestResult {
        let ckpt = s.spawn(|| engine.checkpoint());
        gate.wait_hit();
        clock.advance(by);
        engine.run_until_idle();
        gate.release();
        ckpt.join().map_err(|_| "checkpoint thread panicked")??;
        Ok(())
    })
}

/// Far tasks of a file being compacted come within the far span while the
/// new file is written and are promoted into the wheel; the compaction then
/// leaves them there (it used to make them far again, to be promoted a
/// second time: found by a reviewing helper). Each is promoted once and
/// fires once, on time.
#[test]
fn far_tasks_promoted_during_a_compaction_stay_promoted() -> TestResult {
    let common::far::Gated {
        gate,
        clock,
        engine,
        ..
    } = common::far::gated(12)?;
    let mut model = std::collections::BTreeMap::new();
    let due = |i: u64| START_MS + 2 * 3_600_000 + 60_000 * i;
    for i in 0..40u64 {
        let k = format!("T{i:02}").into_bytes();
        engine.schedule(&k, at(due(i)), b"p")?;
        if i % 5 < 2 {
            model.insert(k, (due(i), b"p".to_vec()));
        }
    }
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 40);
    // 16 of 40 left: the file is a compaction victim at the next checkpoint.
    for i in (0..40u64).filter(|i| i % 5 >= 2) {
        let k = format!("T{i:02}").into_bytes();
        assert!(matches!(
            engine.cancel(&k)?,
            CancelOutcome::Cancelled { .. }
        ));
    }
    gate.arm_mode(Path::new("/kairos/overflow"), OpenMode::CreateNew);
    // Now + far span (1 h) reaches 2 h 30 min: tasks 0..=30 come in.
    checkpoint_promoting_meanwhile(&engine, &gate, &clock, 90 * MINUTE)?;
    let span_end = START_MS + 150 * 60_000;
    let still_far = model.values().filter(|(d, _)| *d > span_end).count();
    let stats = engine.stats();
    assert_eq!(
        (stats.far, stats.far_promoted),
        (still_far, 13),
        "{stats:?}"
    );
    let fired = fire_all(&engine, &clock, START_MS + 4 * 3_600_000)?;
    assert_eq!(fired, model);
    assert_eq!(engine.stats().far_promoted, 16, "{:?}", engine.stats());
    Ok(())
}

/// Far tasks promoted while a checkpoint reads its compaction victims, before
/// it scans the slab, stay promoted: the scan takes out of the wheel only
/// tasks due beyond now + far span as it stands at each hold (it used the
/// time the checkpoint began, made them far in place again, and they were
/// promoted twice: found by a reviewing helper).
#[test]
fn far_tasks_promoted_before_the_slab_scan_stay_promoted() -> TestResult {
    let common::far::Gated {
        sim,
        gate,
        clock,
        engine,
        ..
    } = common::far::gated(13)?;
    let mut model = std::collections::BTreeMap::new();
    // File 1: 40 far tasks due from 2 h on; file 2: 40 due from 10 h on,
    // 30 of them cancelled so that it is a compaction victim.
    for (prefix, first_due_h, file_tasks) in [("A", 2u64, 40u64), ("V", 10, 40)] {
        for i in 0..file_tasks {
            let k = format!("{prefix}{i:02}").into_bytes();
            let due = START_MS + first_due_h * 3_600_000 + 60_000 * i;
            engine.schedule(&k, at(due), b"p")?;
            model.insert(k, (due, b"p".to_vec()));
        }
        engine.checkpoint()?;
    }
    for i in 0..30u64 {
        let k = format!("V{i:02}").into_bytes();
        assert!(matches!(
            engine.cancel(&k)?,
            CancelOutcome::Cancelled { .. }
        ));
        model.remove(&k);
    }
    let dir = Path::new("/kairos/overflow");
    let mut names = sim.list(dir)?;
    names.sort();
    let victim = dir.join(names.last().ok_or("no overflow file")?);
    gate.arm(&victim);
    // Now + far span (1 h) reaches 2 h 30 min: tasks A00..=A30 come in.
    checkpoint_promoting_meanwhile(&engine, &gate, &clock, 90 * MINUTE)?;
    let stats = engine.stats();
    assert_eq!((stats.far, stats.far_promoted), (19, 31), "{stats:?}");
    let fired = fire_all(&engine, &clock, START_MS + 12 * 3_600_000)?;
    assert_eq!(fired, model);
    assert_eq!(engine.stats().far_promoted, 50, "{:?}", engine.stats());
    Ok(())
}

/// A move out of memory with no compaction victim applies its moves from
/// the offsets it noted while writing, without reading the file back,
/// unless a reschedule replaced a payload since the copy began. Here tasks
/// get a new payload (same due time) after their old one was written and
/// before the move is applied (the rename of the new file is held): they
/// must stay in memory with the new payload, not go far pointing at the
/// old one. The others go far. Each fires once, with its latest payload.
#[test]
fn payloads_replaced_after_the_copy_are_not_moved() -> TestResult {
    let common::far::Gated {
        gate,
        clock,
        engine,
        ..
    } = common::far::gated(14)?;
    let mut model = std::collections::BTreeMap::new();
    for i in 0..40u64 {
        let k = format!("R{i:02}").into_bytes();
        let due = START_MS + 2 * 3_600_000 + 60_000 * i;
        engine.schedule(&k, at(due), b"old")?;
        model.insert(k, (due, b"old".to_vec()));
    }
    gate.arm_rename(Path::new("/kairos/overflow"));
    std::thread::scope(|s| -> TestResult {
        let ckpt = s.spawn(|| engine.checkpoint());
        gate.wait_hit();
        for i in (0..40u64).step_by(4) {
            let k = format!("R{i:02}").into_bytes();
            let due = model[&k].0;
            engine.reschedule(&k, at(due), Some(b"new"))?;
            model.insert(k, (due, b"new".to_vec()));
        }
        gate.release();
        ckpt.join().map_err(|_| "checkpoint thread panicked")??;
        Ok(())
    })?;
    assert_eq!(engine.stats().far, 30, "{:?}", engine.stats());
    let fired = fire_all(&engine, &clock, START_MS + 4 * 3_600_000)?;
    assert_eq!(fired, model);
    Ok(())
}

/// A consumer reading a task's payload from its overflow file while a
/// shutdown is under way (the engine closed, the shutdown waiting for a
/// checkpoint held at its new file's rename) whose read fails: it answers
/// `Closed`, as the consumer would a moment later, and does not poison the
/// closed engine; the shutdown takes the delivery back and succeeds, and
/// after a reopen the task is delivered as attempt 1. (Before, the failed
/// read turned the closed engine poisoned: `Poisoned` to the consumer, the
/// shutdown failing, the delivery not taken back.)
#[test]
fn a_payload_read_failing_during_a_shutdown_answers_closed() -> TestResult {
    let sim = SimStorage::new(71);
    let gate = Arc::new(Gate::default());
    let storage: Arc<dyn Storage> = Arc::new(GateStorage {
        inner: sim.clone(),
        gate: Arc::clone(&gate),
    });
    let clock = ManualClock::new(START_MS);
    let engine = open_on(Arc::clone(&storage), &clock, false)?;
    // Due in 10 minutes, beyond the payload window: its payload goes to
    // overflow file 1.
    engine.schedule(b"on disk", at(START_MS + 10 * 60_000), b"its payload")?;
    assert_eq!(engine.checkpoint()?.payloads_moved, 1);
    // Another one for the next checkpoint to move (to file 2).
    engine.schedule(b"later", at(START_MS + 20 * 60_000), b"later")?;
    clock.advance(10 * MINUTE);
    engine.run_until_idle();
    assert_eq!(engine.stats().ready, 1);
    let file = Path::new("/kairos/overflow/0000000000000001.ovf");
    // The consumer stops at its read of the payload.
    gate.arm(file);
    let consumer = engine.consumer();
    let other = engine.consumer();
    let engine = &engine;
    let (received, checkpoint, shutdown) = std::thread::scope(|s| {
        let receiving = s.spawn(|| consumer.try_recv());
        gate.wait_hit();
        // The checkpoint stops at the rename of file 2, the consumer still
        // held (the gate lets both go at once).
        gate.arm_rename(Path::new("/kairos/overflow"));
        let checkpoint = s.spawn(|| engine.checkpoint());
        gate.wait_hit();
        // The shutdown closes the engine, then waits for the checkpoint.
        let shutdown = s.spawn(|| engine.shutdown());
        let closed = common::wait_until("the engine closed", || {
            other.try_recv().err() == Some(kairos::RecvError::Closed)
        });
        gate.fail_reads_of(file);
        gate.release();
        (
            closed.and(Ok(receiving.join().expect("consumer thread"))),
            checkpoint.join().expect("checkpoint thread"),
            shutdown.join().expect("shutdown thread"),
        )
    });
    assert_eq!(received?.err(), Some(kairos::RecvError::Closed));
    assert!(
        matches!(checkpoint, Err(kairos::CheckpointError::Closed)),
        "{checkpoint:?}"
    );
    assert!(shutdown.is_ok(), "{shutdown:?}");
    // Taken back: attempt 1 after a reopen.
    gate.stop_failing_reads();
    let engine = open_on(storage, &clock, false)?;
    engine.run_until_idle();
    let d = engine.consumer().try_recv()?;
    assert_eq!(
        (d.key(), d.payload(), d.attempt()),
        (&b"on disk"[..], &b"its payload"[..], 1)
    );
    engine.shutdown()?;
    Ok(())
}
