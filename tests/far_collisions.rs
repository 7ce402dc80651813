//! Far tasks whose keys share one hash. The far index holds a key's 64-bit
//! hash, not the key, and resolves a hash shared by two keys against their
//! overflow entries on disk (`src/far.rs`); with SipHash no test ever sees
//! such a collision, so this binary weakens the hash
//! (`kairos::far::weaken_key_hash_for_tests`) to a single value: *every*
//! far key collides with every other, and each lookup, cancel, duplicate
//! check, reschedule, promotion, checkpoint and recovery of a far task has
//! to tell them apart by the key on disk.
//!
//! Every test here calls [`weak`] first: the width is fixed once per
//! process, and a directory written under it must be read under it.

mod common;

use common::far::{at, cfg, due, fire_all, key, poisoned, HOUR, MINUTE};
use common::{SimHarness, Stop, TaskMap, TestResult, START_MS};
use kairos::{CancelOutcome, Engine, RescheduleOutcome, ScheduleError};
use std::collections::BTreeMap;
use std::time::Duration;

/// Far-key hashes in this binary keep this many bits: one value for every key.
const HASH_BITS: u32 = 0;

/// Weakens this process's far-key hash (idempotent; see the module docs).
fn weak() {
    assert_eq!(
        kairos::far::weaken_key_hash_for_tests(HASH_BITS),
        Ok(()),
        "a KeyHasher was made before the hash was weakened"
    );
}

const C0: CancelOutcome = CancelOutcome::Cancelled { deliveries: 0 };
const NF: CancelOutcome = CancelOutcome::NotFound;

fn payload(i: usize) -> Vec<u8> {
    format!("payload {i}").into_bytes()
}

/// Schedules far tasks `0..n` (each due 2 h + i min out) and records them in `model`.
fn schedule_far(engine: &Engine, n: usize, model: &mut TaskMap) -> TestResult {
    for i in 0..n {
        engine.schedule(&key(i), at(due(i)), &payload(i))?;
        model.insert(key(i), (due(i), payload(i)));
    }
    Ok(())
}

/// The weakened hash really is one value: two different keys hash alike.
#[test]
fn the_weakened_hash_makes_every_key_collide() {
    weak();
    let h = kairos::far::KeyHasher::new(&[7; 16]);
    assert_eq!(h.hash(b"far-0000"), h.hash(b"another key entirely"));
    assert_eq!(
        kairos::far::weaken_key_hash_for_tests(HASH_BITS + 1),
        Err(HASH_BITS)
    );
}

/// Cancel, cancel_many, duplicate detection and reschedule of far tasks
/// that all share one hash, with a checkpoint, a compaction and a stop of
/// each kind in between: each call finds exactly the task its key names,
/// and every task left fires once, at its due time, with its payload.
#[test]
fn far_tasks_sharing_one_hash_are_told_apart_by_key() -> TestResult {
    weak();
    for (seed, stop) in [
        (1, Stop::Clean),
        (2, Stop::ProcessCrash),
        (3, Stop::PowerCut),
        (4, Stop::PowerCutDropUnsynced),
    ] {
        let mut h = SimHarness::new(seed, cfg())?;
        let mut model = TaskMap::new();
        schedule_far(h.engine(), 12, &mut model)?;
        h.engine()
            .schedule_after(b"near", Duration::from_secs(30), b"n")?;
        model.insert(b"near".to_vec(), (START_MS + 30_000, b"n".to_vec()));
        let first = h.engine().checkpoint()?;
        assert_eq!(h.engine().stats().far, 12, "{stop:?}");
        // Nothing logged since: nothing written, and the report describes the
        // checkpoint there is (far tasks counted).
        let again = h.engine().checkpoint()?;
        assert!(!again.written);
        assert_eq!((again.lsn, again.tasks), (first.lsn, 13), "{again:?}");

        // Duplicates are found among twelve candidates; a new key is not one.
        for i in [0, 3, 11] {
            match h.engine().schedule(&key(i), at(due(40)), b"dup") {
                Err(ScheduleError::AlreadyExists { .. }) => {}
                other => panic!("{stop:?}: duplicate far key {i}: {other:?}"),
            }
        }
        h.engine().schedule(&key(12), at(due(12)), &payload(12))?;
        model.insert(key(12), (due(12), payload(12)));

        // Cancels take the task named and no other.
        assert_eq!(h.engine().cancel(&key(5))?, C0);
        assert_eq!(h.engine().cancel(&key(5))?, NF);
        assert_eq!(h.engine().cancel(b"far-absent")?, NF);
        model.remove(&key(5));
        let k1 = key(1);
        let k9 = key(9);
        let outcomes = h.engine().cancel_many(&[&k1, b"far-absent", &k9, &k1])?;
        assert_eq!(outcomes, vec![C0, NF, C0, NF], "{stop:?}");
        model.remove(&key(1));
        model.remove(&key(9));

        // Reschedules: one far task into the wheel, one to a later far time,
        // one absent key upserted.
        let soon = START_MS + 45_000;
        assert!(matches!(
            h.engine().reschedule(&key(7), at(soon), None)?,
            RescheduleOutcome::Rescheduled(_)
        ));
        model.insert(key(7), (soon, payload(7)));
        assert!(matches!(
            h.engine()
                .reschedule(&key(8), at(due(30)), Some(b"moved"))?,
            RescheduleOutcome::Rescheduled(_)
        ));
        model.insert(key(8), (due(30), b"moved".to_vec()));
        assert!(matches!(
            h.engine().reschedule(&key(20), at(due(20)), Some(b"new"))?,
            RescheduleOutcome::Scheduled(_)
        ));
        model.insert(key(20), (due(20), b"new".to_vec()));

        // A checkpoint moves the new ones far too, then a stop and reopen,
        // then another checkpoint (compacting the first file's dead entries).
        h.engine().checkpoint()?;
        h.restart(stop)?;
        assert_eq!(h.engine().stats().pending, model.len(), "{stop:?}");
        assert_eq!(h.engine().cancel(&key(2))?, C0);
        model.remove(&key(2));
        h.engine().checkpoint()?;
        h.restart(Stop::ProcessCrash)?;
        match h.engine().schedule(&key(4), at(due(40)), b"dup") {
            Err(ScheduleError::AlreadyExists { .. }) => {}
            other => panic!("{stop:?}: duplicate far key 4 after reopen: {other:?}"),
        }

        let fired = fire_all(h.engine(), &h.clock, due(31) + 60_000)?;
        assert_eq!(fired, model, "{stop:?}");
        assert_eq!(poisoned(h.engine()), None, "{stop:?}");
        assert_eq!(h.engine().stats().pending, 0, "{stop:?}");
    }
    Ok(())
}

/// Far tasks sharing one hash cancelled and rescheduled while the
/// promotion brings their file into the wheel — before, between and after
/// the minutes it promotes — fire exactly as a model says.
#[test]
fn colliding_far_tasks_through_promotion() -> TestResult {
    weak();
    let mut h = SimHarness::new(11, cfg())?;
    let mut model = TaskMap::new();
    schedule_far(h.engine(), 30, &mut model)?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 30);
    let mut fired: TaskMap = BTreeMap::new();
    let consumer = h.engine().consumer();
    // Task i is due 2 h + i min out; the horizon is 1 h: minute by minute,
    // the tasks cross into the wheel one at a time while others stay far.
    let mut minute: usize = 0;
    while h.clock.wall_ms() < due(30) + 60_000 {
        minute += 1;
        // Task i is due at minute 120 + i. Every five minutes: cancel the
        // task whose due time is crossing the horizon now (being promoted);
        // reschedule one still far to 3 h out with a new payload; cancel
        // one promoted into the wheel a while ago.
        let cancel_at = |i: usize, model: &mut TaskMap| -> TestResult {
            let expected = if model.remove(&key(i)).is_some() {
                C0
            } else {
                NF
            };
            assert_eq!(
                h.engine().cancel(&key(i))?,
                expected,
                "minute {minute}: {i}"
            );
            Ok(())
        };
        match minute % 5 {
            0 if (60..90).contains(&minute) => cancel_at(minute - 60, &mut model)?,
            1 if (60..90).contains(&minute) && minute - 40 < 30 => {
                let j = minute - 40;
                let new_due = h.clock.wall_ms() + 3 * 3_600_000;
                let out = h.engine().reschedule(&key(j), at(new_due), Some(b"re"))?;
                let was = model.insert(key(j), (new_due, b"re".to_vec()));
                assert_eq!(
                    matches!(out, RescheduleOutcome::Rescheduled(_)),
                    was.is_some(),
                    "minute {minute}: reschedule {j}"
                );
            }
            2 if (120..145).contains(&minute) => cancel_at(minute - 115, &mut model)?,
            _ => {}
        }
        if minute.is_multiple_of(45) {
            h.engine().checkpoint()?;
        }
        h.clock.advance(MINUTE);
        for d in common::drain(h.engine())? {
            assert!(d.fired_ms() >= d.due_ms(), "early: {:?}", d.key());
            let expected = model.remove(d.key());
            assert_eq!(
                expected,
                Some((d.due_ms(), d.payload().to_vec())),
                "minute {minute}: {:?}",
                String::from_utf8_lossy(d.key())
            );
            fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
            consumer.ack(&d)?;
        }
    }
    // What is left is due later (rescheduled 3 h out): it fires after a reopen.
    drop(consumer);
    h.restart(Stop::PowerCut)?;
    let rest = fire_all(
        h.engine(),
        &h.clock,
        h.clock.wall_ms() + 4 * HOUR.as_millis() as u64,
    )?;
    assert_eq!(rest, model);
    assert!(!fired.is_empty());
    assert_eq!(poisoned(h.engine()), None);
    Ok(())
}

mod sim;

/// Seeds of the simulation run here (times `KAIROS_TEST_SCALE`): a fifth of
/// `tests/simulation.rs`'s, from another base.
const SIM_SEEDS: u64 = sim::CI_SEEDS / 5;

/// The deterministic simulation (`tests/sim/mod.rs`: random calls, crashes,
/// power cuts, I/O faults, checkpoints against a model) with every far key
/// on one hash: half its seeds put tasks far, so every far lookup reads all
/// far tasks' entries to find its key. Replay a seed with the command a
/// failure prints (`--test far_collisions`).
#[test]
fn simulation_with_every_far_key_on_one_hash() {
    weak();
    let counters = sim::simulation(SIM_SEEDS * common::scale() as u64, 3_000_000);
    // The run tested something: far tasks sharing the hash were there to tell apart (2 629
    // checkpoints of 7 010 left two or more in the 1 000 seeds of session 32). Not asked of
    // one seed replayed (`KAIROS_SIM_SEED`): half the seeds put no task far.
    assert!(
        std::env::var_os("KAIROS_SIM_SEED").is_some() || counters.checkpoints_leaving_far_tasks > 0,
        "no checkpoint left two far tasks: the collisions were never exercised"
    );
}

/// The same with the engine's background work on (`sim::Mode::Background`: the prefetcher,
/// background checkpoints and far-task moves): every far lookup reads every far task's entry
/// while moves and compactions change where they are. A fifth of the seeds above.
#[test]
fn simulation_with_every_far_key_on_one_hash_and_background_work() {
    weak();
    sim::simulation_in(
        sim::Mode::Background,
        SIM_SEEDS / 5 * common::scale() as u64,
        3_500_000,
    );
}

/// A checkpoint records that it was written with weakened far-key hashes, and
/// each kind of process refuses the other's: with the other width a lookup by
/// key would miss a live far task, and a schedule of its key make a second
/// task of it (a reviewer's finding: an ordinary reopen then verified OK).
/// Here the weak process finds a checkpoint whose header says "full hashes"
/// (the word patched to 0, the header CRC fixed up): the open refuses it,
/// naming both widths. The ordinary side is the same comparison: a released
/// build writes and expects 0.
#[test]
fn a_checkpoint_written_with_the_other_hash_width_is_refused() -> TestResult {
    weak();
    let mut h = SimHarness::new(21, cfg())?;
    let mut model = TaskMap::new();
    schedule_far(h.engine(), 4, &mut model)?;
    let report = h.engine().checkpoint()?;
    h.stop(Stop::Clean)?;
    let path = h
        .dir
        .join("checkpoint")
        .join(kairos::checkpoint::file_name(report.lsn));
    let mut bytes = h.sim.read_file(&path).ok_or("checkpoint file")?;
    assert_eq!(
        bytes[56..64],
        (0x5745_414B_4841_5300u64 | u64::from(HASH_BITS)).to_le_bytes(),
        "the weak width is recorded"
    );
    // The same directory reopens in this (weak) process.
    h.start()?;
    assert_eq!(h.engine().stats().far, 4);
    h.stop(Stop::Clean)?;
    // As an ordinary build would have written it.
    bytes[56..64].fill(0);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..12]);
    hasher.update(&bytes[16..64]);
    bytes[12..16].copy_from_slice(&hasher.finalize().to_le_bytes());
    h.sim.write_file(&path, &bytes);
    match h.open() {
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("far-key hashes of 64 bits, read with 0"), "{e}");
        }
        Ok(_) => panic!("a checkpoint of full far-key hashes opened with weak ones"),
    }
    Ok(())
}
