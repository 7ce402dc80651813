//! `kairos verify`, `inspect` and `dump` on a data directory the engine itself wrote with far
//! tasks (a one-hour horizon): far tasks in the checkpoint, records above it naming them
//! (cancel, reschedule with and without a payload), a compacted overflow file, a clean
//! shutdown or a crash.

#![cfg(feature = "cli")]

mod common;

use common::far::{at, cfg, due, key, MINUTE};

use common::cli::{json, path, run};
use common::{open_fs, TestResult, START_MS};
use kairos::ManualClock;
use std::time::Duration;

#[test]
fn verify_inspect_and_dump_read_a_directory_the_engine_wrote_with_far_tasks() -> TestResult {
    for clean in [true, false] {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&dir, cfg(), &clock)?;
        for i in 0..20 {
            engine.schedule(&key(i), at(due(i)), format!("payload {i}").as_bytes())?;
        }
        engine.schedule_after(b"near", Duration::from_secs(30), b"n")?;
        engine.schedule_after(b"mid", 30 * MINUTE, b"m")?;
        engine.checkpoint()?;
        assert_eq!(engine.stats().far, 20);
        // Most of the first file dies; reschedules with and without a payload.
        for i in 0..12 {
            let _ = engine.cancel(&key(i))?;
        }
        engine.reschedule(&key(12), at(due(12) + 3_600_000), None)?;
        engine.reschedule(&key(13), at(due(13)), Some(b"new 13"))?;
        engine.checkpoint()?;
        // Records above the newest checkpoint naming far tasks.
        let _ = engine.cancel(&key(14))?;
        engine.reschedule(&key(15), at(due(15) + 60_000), None)?;
        engine.reschedule(&key(16), at(due(16)), Some(b"new 16"))?;
        let far = engine.stats().far;
        let pending = engine.stats().pending;
        assert_eq!(pending, 2 + 20 - 13);
        if clean {
            engine.shutdown()?;
        }
        drop(engine);

        let v = json(&run(&["verify", "--json", path(&dir)], 0).0);
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(v["live_tasks"], pending as u64, "{v}");
        assert_eq!(v["far_tasks"], far as u64, "{v}");
        let (stdout, _) = run(&["inspect", path(&dir)], 0);
        assert!(!stdout.contains("DAMAGED"), "{stdout}");
        let (stdout, _) = run(&["dump", "--key", "far-0017", path(&dir)], 0);
        assert!(
            stdout.contains("far-0017") || stdout.contains("FAR"),
            "{stdout}"
        );
        let (stdout, _) = run(&["dump", path(&dir)], 0);
        assert!(stdout.contains("FAR task="), "{stdout}");

        // And the engine reopens on it to the same state.
        let engine = open_fs(&dir, cfg(), &clock)?;
        assert_eq!(engine.stats().pending, pending);
        engine.shutdown()?;
    }
    Ok(())
}
