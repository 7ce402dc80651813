//! The idle high-water mark (`SYNCED`, `WalOptions::synced_mark_delay`): written once the
//! writer has been idle for the delay after a sync, it lets recovery refuse damage to synced
//! records that an unclean shutdown would otherwise leave indistinguishable from a torn write
//! (`wal/FORMAT.md`, "Missing files") — and writing it never costs a record.

mod common;
mod matrix_images;

use std::time::Duration;

use common::*;
use kairos_wal::format::{Synced, MARK_SLOTS_OFFSET, SEGMENT_FRAMES_OFFSET, SYNCED_FILE_NAME};
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, SimStorage, Storage, WalError, WalOptions,
};
use matrix_images::wait_for_synced_mark;

/// The idle mark alone: without `proof_before_ack`, which also records every roll (and the
/// first segment) in `SYNCED` (its own tests: `wal/tests/proof.rs`).
fn marked(durability: Durability, segment_bytes: u64, delay: Option<Duration>) -> WalOptions {
    WalOptions {
        synced_mark_delay: delay,
        proof_before_ack: false,
        ..options(durability, segment_bytes)
    }
}

fn synced_file(sim: &SimStorage) -> Option<Synced> {
    sim.read_file(&dir().join(SYNCED_FILE_NAME))
        .map(|bytes| Synced::decode(&bytes).expect("SYNCED decodes"))
}

/// `(seq, first LSN)` of the newest segment file.
fn newest_segment(sim: &SimStorage) -> (std::path::PathBuf, u64, u64) {
    let newest = segments(sim, dir()).pop().expect("a segment");
    let name = newest.file_name().expect("a name").to_string_lossy();
    let (seq, first) = kairos_wal::format::parse_segment_file_name(&name).expect("segment name");
    (newest.clone(), seq, first.0)
}

#[test]
fn an_idle_log_records_how_far_it_synced_in_its_newest_segment() -> TestResult {
    let sim = SimStorage::new(1);
    sim.set_timed_io(true);
    let options = marked(Durability::Sync, 4096, Some(Duration::from_millis(1)));
    let (wal, _, _) = open(&sim, options.clone())?;
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    wait_for_synced_mark(&sim, dir(), 5);
    let (_, seq, _) = newest_segment(&sim);
    assert_eq!(synced_file(&sim).map(|s| s.seq), Some(seq));
    // More appends roll the log; the mark follows the newest segment.
    for i in 6..=80 {
        append_one(&wal, i)?;
    }
    wait_for_synced_mark(&sim, dir(), 80);
    let (_, newest_seq, _) = newest_segment(&sim);
    assert!(newest_seq > seq, "80 appends did not roll 4 KiB segments");
    assert_eq!(synced_file(&sim).map(|s| s.seq), Some(newest_seq));
    wal.close()?;
    let (_wal, report, replayed) = open(&sim, options)?;
    assert!(report.clean_shutdown);
    assert_eq!(replayed, expected(80));
    Ok(())
}

/// A log that synced records 1..=40 in 4 KiB segments, went idle long enough to write its
/// mark, and then lost power. Returns the disk and the newest segment (path, first LSN).
fn idle_then_power_cut(seed: u64) -> Result<(SimStorage, std::path::PathBuf, u64), WalError> {
    let sim = SimStorage::new(seed);
    sim.set_timed_io(true);
    let (wal, _, _) = open(
        &sim,
        marked(Durability::Sync, 4096, Some(Duration::from_millis(1))),
    )?;
    for i in 1..=40 {
        append_one(&wal, i)?;
    }
    wait_for_synced_mark(&sim, dir(), 40);
    drop(wal);
    sim.set_timed_io(false);
    sim.power_cut();
    let (newest, _, first) = newest_segment(&sim);
    assert!(first <= 40, "the newest segment holds no synced record");
    Ok((sim, newest, first))
}

#[test]
fn after_an_idle_sync_synced_frames_cut_off_are_corruption_not_a_torn_tail() -> TestResult {
    let (sim, newest, _) = idle_then_power_cut(2)?;
    // Outside damage after the crash: the newest segment loses its end, from inside its
    // first frame (synced records) on.
    let bytes = sim.read_file(&newest).ok_or("newest segment")?;
    let cut = SEGMENT_FRAMES_OFFSET + 10;
    assert!(bytes.len() > cut);
    sim.write_file(&newest, &bytes[..cut]);
    let pristine = snapshot(&sim, dir());
    for result in [
        kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {}).map(|_| ()),
        open(&sim, WalOptions::default()).map(|_| ()),
    ] {
        match result {
            Err(WalError::Corrupt { file, reason, .. }) => {
                assert_eq!(file, newest);
                assert!(reason.contains("SYNCED"), "{reason}");
            }
            other => panic!("synced records cut off were not refused: {other:?}"),
        }
    }
    // Open refused without writing anything.
    assert_eq!(snapshot(&sim, dir()), pristine);
    // Without SYNCED, and with the newest segment's mark slots emptied too (they prove the
    // records synced before the last sync: `tests/mark_slots.rs`), the same damage is the
    // documented blind spot: a torn tail.
    sim.remove_file(&dir().join(SYNCED_FILE_NAME))?;
    let mut cut_bytes = bytes[..cut].to_vec();
    cut_bytes[MARK_SLOTS_OFFSET..SEGMENT_FRAMES_OFFSET].fill(0);
    sim.write_file(&newest, &cut_bytes);
    let (_wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert!(report.torn_tail.is_some());
    assert!((replayed.len() as u64) < 40);
    Ok(())
}

#[test]
fn after_an_idle_sync_a_deleted_newest_segment_is_a_missing_segment() -> TestResult {
    let (sim, newest, _) = idle_then_power_cut(3)?;
    sim.remove_file(&newest)?;
    match open(&sim, WalOptions::default()) {
        Err(WalError::MissingSegment { file, reason }) => {
            assert_eq!(file, dir().join(SYNCED_FILE_NAME));
            assert!(reason.contains("the last roll or idle sync"), "{reason}");
        }
        other => panic!("a deleted newest segment was not refused: {other:?}"),
    }
    Ok(())
}

#[test]
fn after_an_idle_sync_a_power_cut_loses_nothing_and_reopens() -> TestResult {
    let (sim, _, _) = idle_then_power_cut(4)?;
    let (_wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(replayed, expected(40));
    assert!(!report.clean_shutdown);
    Ok(())
}

#[test]
fn no_mark_without_timed_io_under_buffered_or_when_turned_off() -> TestResult {
    let cases = [
        // (timed I/O allowed, durability, delay)
        (false, Durability::Sync, Some(Duration::from_millis(1))),
        (true, Durability::Buffered, Some(Duration::from_millis(1))),
        (true, Durability::Sync, None),
    ];
    for (timed, durability, delay) in cases {
        let sim = SimStorage::new(5);
        sim.set_timed_io(timed);
        let (wal, _, _) = open(&sim, marked(durability, 4096, delay))?;
        for i in 1..=5 {
            append_one(&wal, i)?;
        }
        wal.sync()?;
        // Real time: the writer would have written the mark 1 ms after the sync.
        std::thread::sleep(Duration::from_millis(50));
        let names = sim.list(dir())?;
        assert!(
            !names.iter().any(|n| n.starts_with(SYNCED_FILE_NAME)),
            "{timed} {durability:?} {delay:?}: {names:?}"
        );
        drop(wal);
    }
    Ok(())
}

#[test]
fn options_reject_a_delay_over_the_limit() {
    let sim = SimStorage::new(6);
    let options = marked(
        Durability::Sync,
        4096,
        Some(kairos_wal::SYNCED_MARK_DELAY_MAX + Duration::from_millis(1)),
    );
    assert!(matches!(
        open(&sim, options),
        Err(WalError::InvalidOptions { .. })
    ));
}

/// Waits (real time, at most 30 s) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Asserts that the disk goes quiet — no operation for 100 ms — within 10 s: the writer,
/// idle, does not try its mark again and again (it would every millisecond or so).
fn assert_quiet(sim: &SimStorage, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ops = sim.io_ops();
        std::thread::sleep(Duration::from_millis(100));
        if sim.io_ops() == ops {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the writer kept doing I/O while idle"
        );
    }
}

#[test]
fn a_failure_at_each_step_of_writing_the_idle_mark_poisons_nothing_and_loses_nothing() -> TestResult
{
    // The idle mark's steps: stat SYNCED.tmp, create it, write, fdatasync, rename it over
    // SYNCED, fsync the directory. The fault is armed before the last append, whose own
    // operations come first and are counted by a run without a fault; so failing operation
    // `append_ops + k` fails the mark's step k, for every k. The log is not poisoned: the next
    // append is acknowledged, and the next idle period writes the mark. Then the power goes.
    const STEPS: u64 = 6;
    let opts = marked(Durability::Sync, 4096, Some(Duration::from_millis(300)));
    // Records 1..=9 appended and the log closed (`CLOSED` records LSN 9: the reopened log
    // owes no mark for it, so none can run, whatever the machine's pauses, while a fault
    // counts down), then reopened.
    let reopened = |seed: u64| -> Result<(SimStorage, kairos_wal::Wal), WalError> {
        let sim = SimStorage::new(seed);
        sim.set_timed_io(true);
        let (wal, _, _) = open(&sim, opts.clone())?;
        for i in 1..=9 {
            append_one(&wal, i)?;
        }
        wal.close()?;
        let (wal, _, _) = open(&sim, opts.clone())?;
        Ok((sim, wal))
    };
    let append_ops = {
        let (sim, wal) = reopened(99)?;
        let before = sim.io_ops();
        append_one(&wal, 10)?;
        let ops = sim.io_ops() - before;
        wait_for_synced_mark(&sim, dir(), 10);
        assert_eq!(sim.io_ops() - before, ops + STEPS, "the idle mark's steps");
        ops
    };
    for k in 0..STEPS {
        for kind in [FaultKind::Eio, FaultKind::ShortWrite, FaultKind::Enospc] {
            let what = format!("fault at step {k}, {kind:?}");
            let (sim, wal) = reopened(100 + k)?;
            let before = sim.io_ops();
            sim.inject(FaultPlan {
                after: append_ops + k,
                op: FaultOp::Any,
                kind,
            });
            append_one(&wal, 10).map_err(|e| format!("{what} hit the append itself: {e}"))?;
            assert_eq!(sim.io_ops() - before, append_ops, "{what}");
            // The mark, after 300 ms: it stops at step k.
            wait_until(&format!("{what}: the idle mark did not run"), || {
                sim.io_ops() - before > append_ops + k
            });
            assert_quiet(&sim, &what);
            assert_eq!(sim.io_ops() - before, append_ops + k + 1, "{what}");
            assert_eq!(
                wal.poisoned(),
                None,
                "{what}: the idle mark poisoned the log"
            );
            // Up to the rename, SYNCED is not replaced (there is none: the log was only
            // closed); after it, it is (its directory fsync failed).
            assert_eq!(
                synced_file(&sim).map(|s| s.synced_lsn.0),
                (k == STEPS - 1).then_some(10),
                "{what}"
            );
            // The log goes on, and the next idle period writes the mark.
            append_one(&wal, 11).map_err(|e| format!("{what}: append 11: {e}"))?;
            wait_for_synced_mark(&sim, dir(), 11);
            drop(wal);
            sim.set_timed_io(false);
            sim.power_cut();
            let (_wal, report, replayed) = open(&sim, WalOptions::default())
                .map_err(|e| format!("{what}: reopen failed: {e}"))?;
            assert_eq!(replayed, expected(11), "{what}");
            assert_eq!(
                report.torn_tail.map(|t| t.first_lost_lsn.0).unwrap_or(12),
                12
            );
            let names = sim.list(dir())?;
            assert!(
                !names.iter().any(|n| n.ends_with(".tmp")),
                "{what}: {names:?}"
            );
        }
    }
    Ok(())
}

/// A full disk when the idle mark falls due (with and without proof before acknowledgement):
/// the appends before it went into the zeros a `Sync` writer keeps ahead of its frames (no
/// room needed), but `SYNCED.tmp` does not fit. The log is not poisoned, and the writer does
/// not try the mark again while idle; once room comes back the next append is acknowledged and
/// the next idle period records it. A crash or power cut, before or after, keeps every append.
#[test]
fn a_full_disk_when_the_idle_mark_falls_due_poisons_nothing() -> TestResult {
    let tmp = dir().join(format!("{SYNCED_FILE_NAME}.tmp"));
    for proof in [false, true] {
        for room_back in [false, true] {
            for (cut, seed) in [(0u64, 40u64), (1, 41), (2, 42), (2, 43)] {
                let what = format!("proof {proof}, room back {room_back}, cut {cut}, seed {seed}");
                let sim = SimStorage::new(seed);
                sim.set_timed_io(true);
                let opts = WalOptions {
                    proof_before_ack: proof,
                    ..marked(Durability::Sync, 1 << 20, Some(Duration::from_millis(1)))
                };
                let (wal, _, _) = open(&sim, opts.clone())?;
                append_one(&wal, 1)?;
                wait_for_synced_mark(&sim, dir(), 1);
                sim.set_free_bytes(Some(0));
                for i in 2..=5 {
                    append_one(&wal, i).map_err(|e| format!("{what}: append {i}: {e}"))?;
                }
                // The mark was tried (its tmp file created, its write refused) and given up.
                wait_until(&format!("{what}: no idle mark tried"), || {
                    sim.read_file(&tmp).is_some()
                });
                assert_quiet(&sim, &what);
                assert_eq!(
                    wal.poisoned(),
                    None,
                    "{what}: the idle mark poisoned the log"
                );
                assert_eq!(synced_file(&sim).map(|s| s.synced_lsn.0), Some(1), "{what}");
                let mut acked = 5;
                if room_back {
                    sim.set_free_bytes(None);
                    append_one(&wal, 6).map_err(|e| format!("{what}: append 6: {e}"))?;
                    acked = 6;
                    wait_for_synced_mark(&sim, dir(), 6);
                    assert!(sim.read_file(&tmp).is_none(), "{what}");
                }
                drop(wal);
                sim.set_timed_io(false);
                match cut {
                    0 => sim.crash_process(),
                    1 => sim.power_cut_drop_unsynced(),
                    _ => sim.power_cut(),
                }
                sim.set_free_bytes(None);
                let (_wal, report, replayed) =
                    open(&sim, opts).map_err(|e| format!("{what}: reopen failed: {e}"))?;
                assert_eq!(replayed, expected(acked), "{what}");
                if let Some(torn) = report.torn_tail {
                    // Only a random power cut, and only the MARK after the last sync.
                    assert_eq!((cut, torn.first_lost_lsn.0), (2, acked + 1), "{what}");
                }
                assert!(
                    sim.read_file(&tmp).is_none(),
                    "{what}: open removes the leftover"
                );
            }
        }
    }
    Ok(())
}

/// A simulated disk whose `list` pauses after reading the directory, as a descheduled
/// reader would.
#[derive(Debug)]
struct SlowList {
    inner: SimStorage,
}

impl Storage for SlowList {
    fn allows_timed_io(&self) -> bool {
        self.inner.allows_timed_io()
    }
    fn create_dir_all(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.create_dir_all(p)
    }
    fn open(
        &self,
        p: &std::path::Path,
        m: kairos_wal::OpenMode,
    ) -> std::io::Result<Box<dyn kairos_wal::StorageFile>> {
        self.inner.open(p, m)
    }
    fn list(&self, d: &std::path::Path) -> std::io::Result<Vec<String>> {
        let names = self.inner.list(d)?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(names)
    }
    fn exists(&self, p: &std::path::Path) -> std::io::Result<bool> {
        self.inner.exists(p)
    }
    fn rename(&self, f: &std::path::Path, t: &std::path::Path) -> std::io::Result<()> {
        self.inner.rename(f, t)
    }
    fn remove_file(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
    fn sync_dir(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.sync_dir(p)
    }
    fn lock(&self, p: &std::path::Path) -> std::io::Result<Box<dyn kairos_wal::LockGuard>> {
        self.inner.lock(p)
    }
}

#[test]
fn a_scan_of_a_live_log_that_rolls_and_marks_meanwhile_finds_no_damage() -> TestResult {
    // Found in review: scan listed the directory, then read SYNCED — written meanwhile by
    // the live writer after a roll, naming a segment the listing lacked: MissingSegment on
    // a healthy log. The marks are now read before the listing.
    let sim = SimStorage::new(7);
    sim.set_timed_io(true);
    let (wal, _, _) = open(
        &sim,
        marked(Durability::Sync, 4096, Some(Duration::from_millis(1))),
    )?;
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    wait_for_synced_mark(&sim, dir(), 5);
    let slow = SlowList { inner: sim.clone() };
    let scanner = std::thread::spawn(move || {
        kairos_wal::scan(&slow, dir(), 1 << 20, &mut |_| {}).map(|r| r.last_lsn)
    });
    // While the scan (unlocked: the log holds the lock) waits between listing and reading:
    std::thread::sleep(Duration::from_millis(50));
    for i in 6..=80 {
        append_one(&wal, i)?; // rolls 4 KiB segments
    }
    wait_for_synced_mark(&sim, dir(), 80);
    let scanned = scanner.join().map_err(|_| "scan panicked")?;
    assert!(
        matches!(scanned, Ok(last) if last.0 >= 5),
        "a healthy live log was refused: {scanned:?}"
    );
    Ok(())
}

#[test]
fn each_roll_records_the_new_segment_so_deleting_it_after_a_crash_is_missing() -> TestResult {
    // A steady load (no idle pause, and no timed I/O at all on this disk): only the rolls
    // write SYNCED. Then the power goes, and the newest segment is deleted.
    for (delay, durability, refused) in [
        (Some(Duration::from_millis(10)), Durability::Sync, true),
        (
            Some(Duration::from_millis(10)),
            Durability::Interval(Duration::from_millis(5)),
            true,
        ),
        // The known limit, where no mark is written: a crash during the roll, as it looks.
        (None, Durability::Sync, false),
        (Some(Duration::from_millis(10)), Durability::Buffered, false),
    ] {
        let sim = SimStorage::new(7);
        let (wal, _, _) = open(&sim, marked(durability, 4096, delay))?;
        for i in 1..=120 {
            append_one(&wal, i)?;
        }
        wal.sync()?;
        let (newest, seq, first) = newest_segment(&sim);
        assert!(
            seq >= 3,
            "{durability:?}: 120 appends did not roll 4 KiB segments"
        );
        assert_eq!(
            synced_file(&sim).map(|s| (s.seq, s.synced_lsn.0)),
            refused.then_some((seq, first - 1)),
            "{durability:?} {delay:?}"
        );
        drop(wal);
        sim.power_cut();
        sim.remove_file(&newest)?;
        match open(&sim, WalOptions::default()) {
            Err(WalError::MissingSegment { file, reason }) if refused => {
                assert_eq!(file, dir().join(SYNCED_FILE_NAME));
                assert!(reason.contains(&format!("seq {seq}")), "{reason}");
            }
            Ok((_wal, _, replayed)) if !refused => {
                assert_eq!(replayed, expected(first - 1), "{durability:?} {delay:?}");
            }
            other => panic!("{durability:?} {delay:?}: {other:?}"),
        }
    }
    Ok(())
}
