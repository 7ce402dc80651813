//! Cancelling far tasks: a cancel takes a far task out of the far index
//! directly (`locate_for_cancel` + `drop_far`, since 74530b5) instead of
//! putting it back in the slab and the wheel first. Files whose far tasks
//! are all cancelled, duplicates and mixes in one call, log faults, and
//! cancels racing compaction and promotion (written by a reviewing helper).

mod common;

use common::far::{at, cfg, due, gated, key, poisoned, schedule_far, Gated, HOUR, MINUTE};
use common::{SimHarness, Stop, TestResult};
use kairos::{CancelError, CancelOutcome, Engine, RescheduleOutcome};
use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan, Storage};
use kairos_wal::SimStorage;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const C0: CancelOutcome = CancelOutcome::Cancelled { deliveries: 0 };
const NF: CancelOutcome = CancelOutcome::NotFound;

fn overflow_files_of(sim: &SimStorage, dir: &std::path::Path) -> TestResult<Vec<PathBuf>> {
    let dir = dir.join("overflow");
    let mut v: Vec<PathBuf> = sim
        .list(&dir)?
        .into_iter()
        .filter(|n| n.ends_with(".ovf"))
        .map(|n| dir.join(n))
        .collect();
    v.sort();
    Ok(v)
}

/// Runs minute by minute to `until_ms`, acking; the keys fired.
fn run_to(h: &SimHarness, until_ms: u64) -> TestResult<BTreeSet<Vec<u8>>> {
    let mut fired = BTreeSet::new();
    while h.clock.wall_ms() < until_ms {
        for d in h.advance(MINUTE)? {
            assert!(d.fired_ms() >= d.due_ms(), "early: {:?}", d.key());
            assert!(fired.insert(d.key().to_vec()), "twice: {:?}", d.key());
            h.engine().consumer().ack(&d)?;
        }
    }
    Ok(fired)
}

/// Every far task of overflow file 1 cancelled (one, and many with
/// duplicates): Stats right at once, the next checkpoint deletes the file,
/// the promotion never reads it, nothing fires, across a crash too.
#[test]
fn cancelling_every_far_task_of_a_file_lets_the_checkpoint_delete_it() -> TestResult {
    for stop in [Stop::ProcessCrash, Stop::PowerCut] {
        let mut h = SimHarness::new(901, cfg())?;
        schedule_far(h.engine(), 10)?;
        h.engine()
            .schedule_after(b"near", Duration::from_secs(30), b"n")?;
        h.engine().checkpoint()?;
        let s = h.engine().stats();
        assert_eq!((s.far, s.pending, s.payloads_on_disk), (10, 11, 10));
        assert_eq!(overflow_files_of(&h.sim, &h.dir)?.len(), 1);
        assert_eq!(h.engine().cancel(&key(0))?, C0);
        let k: Vec<Vec<u8>> = (1..10).map(key).collect();
        let mut keys: Vec<&[u8]> = k.iter().map(|k| k.as_slice()).collect();
        keys.push(&k[0]);
        keys.push(b"absent");
        let outcomes = h.engine().cancel_many(&keys)?;
        let mut expected = vec![C0; 9];
        expected.extend([NF, NF]);
        assert_eq!(outcomes, expected);
        let s = h.engine().stats();
        assert_eq!(
            (
                s.far,
                s.pending,
                s.scheduled,
                s.payloads_on_disk,
                s.far_promoted,
                s.payloads_read_back
            ),
            (0, 1, 1, 0, 0, 0),
            "{s:?}"
        );
        let report = h.engine().checkpoint()?;
        assert_eq!(report.overflow_files_removed, 1, "{report:?}");
        assert!(overflow_files_of(&h.sim, &h.dir)?.is_empty());
        // The promotion reaches where the file's cursor was: no read of the
        // deleted file (it would poison), nothing fires but "near".
        let fired = run_to(&h, due(10) + 60_000)?;
        assert_eq!(fired, BTreeSet::from([b"near".to_vec()]));
        assert_eq!(poisoned(h.engine()), None);
        h.restart(stop)?;
        let s = h.engine().stats();
        assert_eq!((s.far, s.pending), (0, 0), "{stop:?}");
    }
    Ok(())
}

/// No checkpoint after the cancels: the promotion reaches the file whose
/// far tasks are all cancelled, reads it, finds none live, drops its
/// cursor without poisoning; a later checkpoint then deletes the file.
#[test]
fn promotion_of_a_file_whose_far_tasks_are_all_cancelled() -> TestResult {
    let mut h = SimHarness::new(902, cfg())?;
    schedule_far(h.engine(), 6)?;
    h.engine().checkpoint()?;
    for i in 0..6 {
        assert_eq!(h.engine().cancel(&key(i))?, C0);
    }
    let fired = run_to(&h, due(6) + 60_000)?;
    assert!(fired.is_empty());
    assert_eq!(poisoned(h.engine()), None);
    let s = h.engine().stats();
    assert_eq!((s.far, s.far_promoted, s.pending), (0, 0, 0));
    let report = h.engine().checkpoint()?;
    assert_eq!(report.overflow_files_removed, 1, "{report:?}");
    h.restart(Stop::PowerCut)?;
    assert_eq!(h.engine().stats().pending, 0);
    Ok(())
}

/// cancel_many mixing far tasks, wheel tasks, an in-flight task, duplicates
/// of each, an absent key; then the cancelled far key scheduled again at
/// once (before any checkpoint) by a reschedule, which must not find the
/// cancelled far task. Across every kind of stop.
#[test]
fn cancel_many_mixing_far_slab_in_flight_and_duplicates() -> TestResult {
    for (seed, stop) in [
        (903, Stop::Clean),
        (904, Stop::ProcessCrash),
        (905, Stop::PowerCut),
        (906, Stop::PowerCutDropUnsynced),
    ] {
        let mut h = SimHarness::new(seed, cfg())?;
        schedule_far(h.engine(), 5)?;
        h.engine().checkpoint()?;
        assert_eq!(h.engine().stats().far, 5);
        // In the wheel: one within the payload window, one within the horizon.
        h.engine()
            .schedule_after(b"near", Duration::from_secs(30), b"n")?;
        h.engine().schedule_after(b"mid", 30 * MINUTE, b"m")?;
        // In flight.
        h.engine().schedule_after(b"now", Duration::ZERO, b"x")?;
        let ds = h.advance(Duration::from_millis(10))?;
        assert_eq!(ds.len(), 1);
        let outcomes = h.engine().cancel_many(&[
            &key(0),
            b"near",
            &key(0),
            &key(1),
            b"near",
            b"absent",
            &key(1),
            b"mid",
            b"now",
            b"now",
        ])?;
        assert_eq!(
            outcomes,
            vec![
                C0,
                C0,
                NF,
                C0,
                NF,
                NF,
                NF,
                C0,
                CancelOutcome::AlreadyDelivered { attempt: 1 },
                NF
            ]
        );
        // The in-flight one is abandoned to its holder: pending until acked.
        h.engine().consumer().ack(&ds[0])?;
        let s = h.engine().stats();
        assert_eq!((s.far, s.pending, s.far_promoted), (3, 3, 0), "{s:?}");
        // Its key is free at once, before any checkpoint: a reschedule
        // (an upsert) makes a new task rather than finding the far one.
        assert!(matches!(
            h.engine()
                .reschedule(&key(0), at(due(0) + 5 * 60_000), Some(b"again"))?,
            RescheduleOutcome::Scheduled(_)
        ));
        assert_eq!(h.engine().stats().pending, 4);
        h.restart(stop)?;
        let s = h.engine().stats();
        assert_eq!((s.pending, s.far), (4, 3), "{stop:?} {s:?}");
        let fired = run_to(&h, due(6) + 60_000)?;
        let expected: BTreeSet<Vec<u8>> = [key(0), key(2), key(3), key(4)].into();
        assert_eq!(fired, expected, "{stop:?}");
    }
    Ok(())
}

/// The cancel's log write fails (reported by wait_durable): the engine is
/// poisoned; the record never written, the far task is back after the
/// reopen.
#[test]
fn a_far_cancel_whose_log_write_fails_drops_nothing() -> TestResult {
    for many in [false, true] {
        let mut h = SimHarness::new(907, cfg())?;
        schedule_far(h.engine(), 5)?;
        h.engine().checkpoint()?;
        h.sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Write,
            kind: FaultKind::Eio,
        });
        let got = if many {
            h.engine().cancel_many(&[&key(1), &key(2)]).map(|v| v[0])
        } else {
            h.engine().cancel(&key(1))
        };
        assert!(matches!(got, Err(CancelError::Poisoned { .. })), "{got:?}");
        // The append itself succeeded (buffered); the write failed in
        // wait_durable, after drop_far: the poisoned engine's Stats already
        // show the far task gone (as a slab cancel's would), but no
        // checkpoint can record it.
        assert_eq!(
            h.engine().stats().far,
            5 - 1 - usize::from(many),
            "many {many}"
        );
        assert!(h.engine().checkpoint().is_err());
        h.stop(Stop::ProcessCrash)?;
        h.sim.clear_faults();
        h.start()?;
        let s = h.engine().stats();
        assert_eq!((s.pending, s.far), (5, 5), "many {many}");
    }
    Ok(())
}

/// The cancel's sync fails (after the far entry was dropped in memory):
/// poisoned; after a power cut losing what was not synced, the task is back.
#[test]
fn a_far_cancel_whose_sync_fails_is_not_durable() -> TestResult {
    let mut h = SimHarness::new(908, cfg())?;
    schedule_far(h.engine(), 5)?;
    h.engine().checkpoint()?;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let got = h.engine().cancel(&key(1));
    assert!(matches!(got, Err(CancelError::Poisoned { .. })), "{got:?}");
    // A checkpoint must not record the drop.
    assert!(h.engine().checkpoint().is_err());
    h.stop(Stop::PowerCutDropUnsynced)?;
    h.sim.clear_faults();
    h.start()?;
    assert_eq!(h.engine().stats().far, 5);
    Ok(())
}

/// A cancel_many stopped in its read-ahead of overflow file 1 (no lock
/// held); meanwhile a checkpoint compacts file 1 (its far tasks move to a
/// new file) and deletes it. The read-ahead then fails on the deleted
/// file: not a poison (the tasks are no longer there); the cancel reads
/// the new place under the lock and drops the right entries; a crash
/// replays it.
#[test]
fn a_cancel_read_ahead_racing_a_compaction_that_deletes_the_file() -> TestResult {
    let Gated {
        sim,
        gate,
        clock,
        dir,
        engine,
    } = gated(909)?;
    schedule_far(&engine, 10)?;
    engine.checkpoint()?;
    for i in 0..6 {
        assert_eq!(engine.cancel(&key(i))?, C0);
    }
    // Reopened, so that no descriptor of the file is kept open from the
    // cancels above: the read-ahead below opens it, and fails once it is
    // deleted.
    drop(engine);
    sim.crash_process();
    let storage = common::gate::GateStorage {
        inner: sim.clone(),
        gate: Arc::clone(&gate),
    };
    let engine = Engine::open_with(&dir, cfg(), Arc::new(storage), Arc::new(clock.clone()))?;
    let files = overflow_files_of(&sim, &dir)?;
    assert_eq!(files.len(), 1);
    gate.arm(&files[0]);
    let (k7, k8) = (key(7), key(8));
    std::thread::scope(|s| -> TestResult {
        let cancel = s.spawn(|| engine.cancel_many(&[&k7, &k7, &k8]));
        gate.wait_hit();
        let report = engine.checkpoint()?;
        assert_eq!(report.overflow_files_removed, 1, "{report:?}");
        assert!(!overflow_files_of(&sim, &dir)?.contains(&files[0]));
        gate.release();
        let outcomes = cancel.join().map_err(|_| "cancel panicked")??;
        assert_eq!(outcomes, vec![C0, NF, C0]);
        Ok(())
    })?;
    assert_eq!(poisoned(&engine), None);
    assert_eq!(engine.stats().far, 2);
    drop(engine);
    sim.crash_process();
    let engine = Engine::open_with(&dir, cfg(), Arc::new(sim.clone()), Arc::new(clock.clone()))?;
    assert_eq!((engine.stats().far, engine.stats().pending), (2, 2));
    let fired = common::far::fire_all(&engine, &clock, due(10) + 60_000)?;
    let keys: BTreeSet<Vec<u8>> = fired.into_keys().collect();
    assert_eq!(keys, BTreeSet::from([key(6), key(9)]));
    Ok(())
}

/// cancel_many while the driver's promotion is stopped at its read of
/// file 1 (outside the lock). The cancelled one
/// (within the span being promoted) never fires; far_promoted counts only
/// what was promoted; the cursor logic sees no missing task.
#[test]
fn cancel_many_while_the_file_is_being_promoted() -> TestResult {
    let Gated {
        gate,
        clock,
        dir,
        engine,
        ..
    } = gated(910)?;
    schedule_far(&engine, 10)?;
    engine.checkpoint()?;
    let file1 = dir.join("overflow").join("0000000000000001.ovf");
    gate.arm(&file1);
    std::thread::scope(|s| -> TestResult {
        let driver = s.spawn(|| {
            clock.advance(HOUR + MINUTE);
            engine.run_until_idle();
        });
        gate.wait_hit();
        let out = engine.cancel_many(&[&key(0), &key(5), &key(0), &key(1)])?;
        assert_eq!(out, vec![C0, C0, NF, C0]);
        gate.release();
        driver.join().map_err(|_| "driver panicked")?;
        Ok(())
    })?;
    assert_eq!(poisoned(&engine), None);
    let s = engine.stats();
    // Due within now + 1 h: k0, k1 (cancelled) — nothing promoted.
    assert_eq!((s.far, s.far_promoted, s.pending), (7, 0, 7), "{s:?}");
    let fired = common::far::fire_all(&engine, &clock, due(10) + 60_000)?;
    let keys: BTreeSet<Vec<u8>> = fired.into_keys().collect();
    let expected: BTreeSet<Vec<u8>> = [2, 3, 4, 6, 7, 8, 9].into_iter().map(key).collect();
    assert_eq!(keys, expected);
    Ok(())
}

/// Descriptors of this test's overflow files (Linux: `/proc/self/fd`);
/// with `deleted`, only those of deleted files (links ending in
/// " (deleted)").
fn overflow_fds(dir: &std::path::Path, deleted: bool) -> TestResult<Vec<String>> {
    let prefix = dir.join("overflow");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy().into_owned();
        if target.starts_with(&*prefix.to_string_lossy())
            && (!deleted || target.ends_with(" (deleted)"))
        {
            out.push(target);
        }
    }
    Ok(out)
}

/// Cancels of far tasks keep their overflow file open for the next ones
/// (`Disk::overflow_file`), but a file that a checkpoint deletes is closed
/// with it: no descriptor keeps a deleted file's blocks allocated; the far
/// tasks moved to the new file still cancel and fire right.
#[test]
fn a_deleted_overflow_file_is_not_kept_open() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let clock = kairos::ManualClock::new(common::START_MS);
    let engine = common::open_fs(dir, cfg(), &clock)?;
    schedule_far(&engine, 20)?;
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 20);
    // Single cancels read file 1 (kept open); most of it is dead then.
    for i in 0..15 {
        assert_eq!(engine.cancel(&key(i))?, C0);
    }
    let report = engine.checkpoint()?;
    assert!(report.overflow_files_removed >= 1, "{report:?}");
    assert_eq!(overflow_fds(dir, true)?, Vec::<String>::new());
    // The rest, now in the compacted file: cancel one (its file kept open).
    assert_eq!(engine.cancel(&key(15))?, C0);
    assert_eq!(engine.cancel(&key(15))?, NF);
    assert_eq!(overflow_fds(dir, false)?.len(), 1);
    // A shutdown closes every kept file, though a consumer keeps the
    // engine's state alive, and a call after it keeps none open again.
    let consumer = engine.consumer();
    engine.shutdown()?;
    assert_eq!(overflow_fds(dir, false)?, Vec::<String>::new());
    assert!(engine.cancel(&key(16)).is_err());
    assert_eq!(overflow_fds(dir, false)?, Vec::<String>::new());
    drop(consumer);
    drop(engine);
    // Reopened: the others fire.
    let engine = common::open_fs(dir, cfg(), &clock)?;
    let fired = common::far::fire_all(&engine, &clock, due(20))?;
    let keys: Vec<Vec<u8>> = fired.into_keys().collect();
    assert_eq!(keys, (16..20).map(key).collect::<Vec<_>>());
    engine.shutdown()?;
    Ok(())
}
