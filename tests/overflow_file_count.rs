//! A reviewer's test: the overflow file count stays within
//! `OVERFLOW_FILES_MAX` (128) when far tasks leave memory between
//! checkpoints, one file per move.
//!
//! Each move here writes a file of 25 far tasks (by `relocate_far_bytes`,
//! as the default 16 MiB writes one of ~140 k). Files merged to bring the
//! count down must go into one new file whatever their size: before they
//! did, with `VICTIM_ENTRIES_PER_MOVE` scaled down to 30 in the same
//! proportion as 578 k : 1 Mi (64 MiB moves then) (`sed -i 's/^const VICTIM_ENTRIES_PER_MOVE:
//! u64 = 1 << 20;/const VICTIM_ENTRIES_PER_MOVE: u64 = 30;/'
//! src/engine/checkpointing.rs`), every merged file landed in a group of its
//! own, each group wrote its own file, and the count grew by the moves
//! between checkpoints without bound (33, 36, … 90 files by round 29).

mod common;

use common::far::{at, cfg, due, key};
use common::{wait_until, TestResult, START_MS};
use kairos::{Engine, ManualClock};
use kairos_wal::storage::Storage;
use kairos_wal::SimStorage;
use std::path::Path;
use std::sync::Arc;

#[test]
fn overflow_files_stay_bounded_with_moves_between_checkpoints() -> TestResult {
    let sim = SimStorage::new(9);
    let clock = ManualClock::new(START_MS);
    let mut c = cfg();
    c.relocate_far_tasks = Some(u64::MAX);
    // 25 tasks of an 8-byte key, empty payload: 25 × (96 + 8).
    c.relocate_far_bytes = 25 * 104;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    let engine = Engine::open_with("/kairos", c, Arc::new(sim.clone()), Arc::new(clock.clone()))?;
    let overflow_files = || -> TestResult<usize> {
        let dir = Path::new("/kairos/overflow");
        Ok(sim
            .list(dir)
            .unwrap_or_default()
            .iter()
            .filter(|n| sim.read_file(&dir.join(n)).is_some())
            .count())
    };
    let mut i = 0;
    let mut worst = 0;
    // 50 rounds of 3 moves: 150 files written, beyond the maximum.
    for round in 0..50 {
        // Three moves between checkpoints.
        for _ in 0..3 {
            for _ in 0..25 {
                engine.schedule(&key(i), at(due(i)), b"")?;
                i += 1;
            }
            wait_until("a move", || engine.stats().far == i)?;
        }
        engine.checkpoint()?;
        let files = overflow_files()?;
        worst = worst.max(files);
        eprintln!("round {round}: {i} far tasks, {files} overflow files");
    }
    assert_eq!(engine.stats().pending, i);
    assert!(
        worst > 100,
        "{worst}: the test no longer reaches the maximum"
    );
    assert!(
        worst <= 128 + 3,
        "{worst} overflow files (OVERFLOW_FILES_MAX 128)"
    );
    Ok(())
}
