//! Far tasks recovered in the checkpoint's order (grouped by shard, each
//! shard's sorted part then its tail and its tombstones), with and without
//! log records after the checkpoint naming far tasks (cancels, reschedules),
//! survive every reopen whole: each is found by its key and fires once, at
//! its due time, with its payload. (Written by a reviewing helper.)

mod common;

use common::far::{at, cfg, fire_one_minute, key};
use common::{SimHarness, Stop, TestResult, START_MS};
use kairos::RescheduleOutcome;
use std::collections::BTreeMap;

fn due(i: usize) -> u64 {
    START_MS + 2 * 3_600_000 + 1_000 * i as u64 + 500
}

#[test]
fn far_tasks_in_checkpoint_order_survive_reopen_with_and_without_records() -> TestResult {
    for (seed, records_after) in [(11u64, 0usize), (12, 1), (13, 2), (14, 3)] {
        let mut h = SimHarness::new(seed, cfg())?;
        let mut model: BTreeMap<Vec<u8>, (u64, Vec<u8>)> = BTreeMap::new();
        let n1 = 4000;
        let n2 = 1200;
        for i in 0..n1 {
            let p = format!("p{i}").into_bytes();
            h.engine().schedule(&key(i), at(due(i)), &p)?;
            model.insert(key(i), (due(i), p));
        }
        h.engine().checkpoint()?;
        assert_eq!(h.engine().stats().far, n1);
        // More far tasks: inserted one at a time into the shards' tails.
        for i in n1..n1 + n2 {
            let p = format!("p{i}").into_bytes();
            h.engine().schedule(&key(i), at(due(i)), &p)?;
            model.insert(key(i), (due(i), p));
        }
        // Some cancelled before the checkpoint: tombstones.
        for i in (0..n1).step_by(97) {
            assert!(h.engine().cancel(&key(i))?.is_cancelled());
            model.remove(&key(i));
        }
        h.engine().checkpoint()?;
        assert_eq!(h.engine().stats().far, model.len());
        if records_after >= 1 {
            // Records after the checkpoint naming far tasks by id.
            for i in (5..n1 + n2).step_by(53) {
                if model.remove(&key(i)).is_some() {
                    assert!(h.engine().cancel(&key(i))?.is_cancelled());
                }
            }
        }
        if records_after >= 2 {
            for i in (7..n1 + n2).step_by(41) {
                if let Some((_, p)) = model.get(&key(i)).cloned() {
                    let d = due(i) + 250;
                    let out = h.engine().reschedule(&key(i), at(d), None)?;
                    assert!(matches!(out, RescheduleOutcome::Rescheduled(_)), "{out:?}");
                    model.insert(key(i), (d, p));
                }
            }
        }
        h.restart(Stop::ProcessCrash)?;
        let far_after = h.engine().stats().far;
        assert_eq!(h.engine().stats().pending, model.len());
        if records_after >= 3 {
            // Checkpoint the recovered index and reopen again.
            h.engine().checkpoint()?;
            h.restart(Stop::Clean)?;
            assert_eq!(h.engine().stats().far, far_after);
        }
        // Every key still findable by key: a schedule of it is refused.
        for (k, _) in model.iter().step_by(13) {
            assert!(h.engine().schedule(k, at(due(0)), b"x").is_err(), "{k:?}");
        }
        let mut fired = BTreeMap::new();
        for _ in 0..(2 * 60 + 95) {
            fire_one_minute(&h, &mut fired)?;
        }
        assert_eq!(fired.len(), model.len(), "seed {seed}");
        assert_eq!(fired, model, "seed {seed}");
    }
    Ok(())
}
