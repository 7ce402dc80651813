//! Missing segments at either end of the log: the `TRIM` low-water mark written by
//! `remove_segments_before` (a deleted oldest segment is `MissingSegment`, an interrupted
//! removal leaves harmless leftovers), and the `CLOSED` high-water mark written at clean close
//! (a deleted or emptied newest segment is detected).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use kairos_wal::format::{self, Closed, Trim};
use kairos_wal::{
    scan, Durability, FaultKind, FaultOp, FaultPlan, FsStorage, Lsn, SimStorage, Storage, WalError,
    WalOptions,
};

/// 4 KiB segments: 200 records make four or more of them.
fn opts() -> WalOptions {
    options(Durability::Sync, 4096)
}

/// A log of records 1..=n in 4 KiB segments, closed cleanly. Written in Buffered mode, so no
/// MARK frame depends on thread timing: the same `n` always gives the same segments.
fn closed_log(seed: u64, n: u64) -> Result<SimStorage, WalError> {
    common::closed_log(seed, n, Durability::Buffered)
}

fn trim_path() -> PathBuf {
    dir().join(format::TRIM_FILE_NAME)
}

fn closed_path() -> PathBuf {
    dir().join(format::CLOSED_FILE_NAME)
}

fn store_id(sim: &SimStorage) -> Result<format::StoreId, Box<dyn std::error::Error>> {
    let meta = sim.read_file(&dir().join("META")).ok_or("no META")?;
    Ok(format::decode_meta(&meta)?)
}

fn read_trim(sim: &SimStorage) -> Result<Option<Trim>, Box<dyn std::error::Error>> {
    match sim.read_file(&trim_path()) {
        None => Ok(None),
        Some(bytes) => Ok(Some(Trim::decode(&bytes)?)),
    }
}

/// `(seq, first_lsn)` from a segment's file name.
fn name_of(segment: &Path) -> (u64, u64) {
    let name = segment.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let (seq, lsn) = format::parse_segment_file_name(name).unwrap_or((0, Lsn(0)));
    (seq, lsn.0)
}

fn scan_sim(sim: &SimStorage) -> Result<kairos_wal::ScanReport, WalError> {
    scan(sim, dir(), 1 << 20, &mut |_| {})
}

fn expect_missing<T: std::fmt::Debug>(result: Result<T, WalError>) -> (PathBuf, String) {
    match result {
        Err(WalError::MissingSegment { file, reason }) => (file, reason),
        other => panic!("expected MissingSegment, got {other:?}"),
    }
}

fn expect_corrupt<T: std::fmt::Debug>(result: Result<T, WalError>) -> (PathBuf, u64, String) {
    match result {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => (file, offset, reason),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Replays `report`/`replayed` as the suffix `first..=n` of the records `append_one` wrote.
fn assert_suffix(first_lsn: Lsn, replayed: &Replayed, n: u64) {
    let first = first_lsn.0;
    assert!((1..=n + 1).contains(&first), "first_lsn {first}");
    assert_eq!(
        replayed,
        &expected(n)[first as usize - 1..].to_vec(),
        "replay is not records {first}..={n}"
    );
}

// ---------------------------------------------------------------------------------------------
// The reported bug: a deleted oldest segment.

#[test]
fn deleted_oldest_segment_is_missing_on_open_and_scan() -> TestResult {
    let sim = closed_log(100, 200)?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 4, "{segs:?}");
    assert_eq!(read_trim(&sim)?, None, "nothing was ever removed");
    sim.remove_file(&segs[0])?;
    sim.sync_dir(dir())?;
    let before = snapshot(&sim, dir());

    let (file, reason) = expect_missing(open(&sim, opts()));
    assert_eq!(file, segs[1], "{reason}");
    assert!(reason.contains("seq 1..=1"), "{reason}");
    assert!(reason.contains("no TRIM"), "{reason}");
    let (file, _) = expect_missing(scan_sim(&sim));
    assert_eq!(file, segs[1]);
    assert_eq!(
        snapshot(&sim, dir()),
        before,
        "a refused open changed files"
    );

    // Two oldest gone: the reason names both.
    sim.remove_file(&segs[1])?;
    sim.sync_dir(dir())?;
    let (file, reason) = expect_missing(open(&sim, opts()));
    assert_eq!(file, segs[2]);
    assert!(reason.contains("seq 1..=2"), "{reason}");
    Ok(())
}

#[test]
fn deleted_oldest_segment_is_missing_on_a_real_disk() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _, _) = open_at(Arc::new(FsStorage), &wal_dir, opts())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    wal.close()?;
    let segs = segments(&FsStorage, &wal_dir);
    assert!(segs.len() >= 3, "{segs:?}");
    std::fs::remove_file(&segs[0])?;
    let (file, _) = expect_missing(open_at(Arc::new(FsStorage), &wal_dir, opts()));
    assert_eq!(file, segs[1]);
    let (file, _) = expect_missing(scan(&FsStorage, &wal_dir, 1 << 20, &mut |_| {}));
    assert_eq!(file, segs[1]);
    assert_eq!(segments(&FsStorage, &wal_dir), segs[1..].to_vec());
    Ok(())
}

#[test]
fn deleted_oldest_segment_after_a_trim_is_missing() -> TestResult {
    let sim = SimStorage::new(101);
    let (wal, _, _) = open(&sim, opts())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    assert!(wal.remove_segments_before(Lsn(100))? >= 1);
    wal.close()?;
    let trim = read_trim(&sim)?.ok_or("no TRIM")?;
    let segs = segments(&sim, dir());
    assert_eq!(name_of(&segs[0]), (trim.seq, trim.first_lsn.0));
    sim.remove_file(&segs[0])?;
    sim.sync_dir(dir())?;
    let before = snapshot(&sim, dir());
    let (file, reason) = expect_missing(open(&sim, opts()));
    assert_eq!(file, segs[1]);
    assert!(reason.contains("TRIM says"), "{reason}");
    expect_missing(scan_sim(&sim));
    assert_eq!(snapshot(&sim, dir()), before);

    // Every segment gone: TRIM itself proves one is missing.
    for seg in &segs[1..] {
        sim.remove_file(seg)?;
    }
    sim.sync_dir(dir())?;
    let (file, _) = expect_missing(open(&sim, opts()));
    assert_eq!(file, trim_path());
    let (file, _) = expect_missing(scan_sim(&sim));
    assert_eq!(file, trim_path());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// remove_segments_before and the mark.

#[test]
fn remove_segments_before_records_the_mark_and_reopens_from_it() -> TestResult {
    let sim = SimStorage::new(102);
    let (wal, _, _) = open(&sim, opts())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    let all = segments(&sim, dir());
    let removed = wal.remove_segments_before(Lsn(150))?;
    assert!(removed >= 1);
    let kept = segments(&sim, dir());
    assert_eq!(kept, all[removed..].to_vec());
    let trim = read_trim(&sim)?.ok_or("no TRIM")?;
    assert_eq!(trim.store_id, store_id(&sim)?);
    assert_eq!(name_of(&kept[0]), (trim.seq, trim.first_lsn.0));
    assert!(
        trim.first_lsn.0 <= 150,
        "the segment holding LSN 150 is kept"
    );
    // Nothing more below 150: no second TRIM write, nothing removed.
    assert_eq!(wal.remove_segments_before(Lsn(150))?, 0);
    assert_eq!(wal.remove_segments_before(Lsn(1))?, 0);
    assert_eq!(read_trim(&sim)?, Some(trim));
    wal.close()?;

    let (wal, report, replayed) = open(&sim, opts())?;
    assert_eq!(report.first_lsn, trim.first_lsn);
    assert!(report.clean_shutdown);
    assert_suffix(report.first_lsn, &replayed, 200);
    let scanned = scan_sim(&sim)?;
    assert!(scanned.leftover_segments.is_empty());
    assert_eq!(scanned.segments[0].first_lsn, trim.first_lsn);
    assert_eq!(scanned.segments[0].seq, trim.seq);

    // Segments sealed before this open can be removed too, and the mark only moves up; the
    // active segment is never removed, even for an LSN past the end.
    for i in 201..=260 {
        append_one(&wal, i)?;
    }
    let removed = wal.remove_segments_before(Lsn(u64::MAX))?;
    assert!(removed >= 1);
    let kept = segments(&sim, dir());
    assert_eq!(kept.len(), 1, "only the active segment stays");
    let trim2 = read_trim(&sim)?.ok_or("no TRIM")?;
    assert!(trim2.seq > trim.seq && trim2.first_lsn > trim.first_lsn);
    assert_eq!(name_of(&kept[0]), (trim2.seq, trim2.first_lsn.0));
    append_one(&wal, 261)?;
    drop(wal); // a crash this time
               // Record 261 rolls into a new segment if it does not fit in the active one, which depends
               // on how many MARK frames the writer put there while idle (thread timing).
    let on_disk = segments(&sim, dir());
    assert!(on_disk.len() <= 2, "{on_disk:?}");
    assert_eq!(name_of(&on_disk[0]), (trim2.seq, trim2.first_lsn.0));
    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_eq!(report.first_lsn, trim2.first_lsn);
    assert_eq!(report.segments, on_disk.len());
    assert_suffix(report.first_lsn, &replayed, 261);
    Ok(())
}

#[test]
fn leftover_segments_below_the_mark_are_ignored_by_scan_and_removed_by_open() -> TestResult {
    // The state a crash between writing TRIM and the removals leaves.
    let sim = closed_log(103, 200)?;
    let segs = segments(&sim, dir());
    let (seq, first_lsn) = name_of(&segs[3]);
    let trim = Trim {
        store_id: store_id(&sim)?,
        seq,
        first_lsn: Lsn(first_lsn),
    };
    sim.write_file(&trim_path(), &trim.encode());
    // Leftovers are not even read: damage in them does not matter.
    sim.write_file(&segs[1], b"garbage");

    let scanned = scan_sim(&sim)?;
    assert_eq!(scanned.leftover_segments, segs[..3].to_vec());
    assert_eq!(scanned.segments.len(), segs.len() - 3);
    assert_eq!(scanned.records, 200 - (first_lsn - 1));
    assert_eq!(segments(&sim, dir()), segs, "scan removed something");

    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_eq!(report.first_lsn, Lsn(first_lsn));
    assert_suffix(report.first_lsn, &replayed, 200);
    assert_eq!(segments(&sim, dir()), segs[3..].to_vec());
    // The removal was made durable.
    drop(_wal);
    sim.power_cut_drop_unsynced();
    assert_eq!(segments(&sim, dir()), segs[3..].to_vec());
    Ok(())
}

#[test]
fn a_crash_at_every_step_of_remove_segments_before_loses_nothing_at_or_above_the_mark() -> TestResult
{
    const N: u64 = 200;
    // Each case: an optional earlier removal (so an old TRIM exists), then the one under test.
    // The log is reopened first, so the writer is idle and every counted operation is the
    // removal's.
    for earlier in [None, Some(Lsn(80))] {
        let setup = |seed: u64| -> Result<(SimStorage, kairos_wal::Wal), WalError> {
            let sim = closed_log(seed, N)?;
            let (wal, _, _) = open(&sim, opts())?;
            if let Some(lsn) = earlier {
                assert!(wal.remove_segments_before(lsn)? >= 1);
            }
            Ok((sim, wal))
        };
        // A reference run: how many operations the removal takes, and the mark it writes.
        let (sim, wal) = setup(104)?;
        let before = sim.io_ops();
        assert!(wal.remove_segments_before(Lsn(150))? >= 1);
        let steps = sim.io_ops() - before;
        let mark = read_trim(&sim)?.ok_or("no TRIM")?.first_lsn;
        drop(wal);

        for step in 0..=steps {
            for (variant, seed) in (0..5u64).map(|v| (v, 1000 + step * 8 + v)) {
                let (sim, wal) = setup(seed)?;
                // Operation `step` fails (step == steps: none does), then the crash.
                sim.inject(FaultPlan {
                    after: step,
                    op: FaultOp::Any,
                    kind: FaultKind::Eio,
                });
                let result = wal.remove_segments_before(Lsn(150));
                assert_eq!(result.is_ok(), step == steps, "step {step}: {result:?}");
                drop(wal);
                match variant {
                    0 => sim.crash_process(),
                    1 => sim.power_cut_drop_unsynced(),
                    _ => sim.power_cut(),
                }
                let context =
                    format!("earlier {earlier:?}, step {step}/{steps}, variant {variant}");
                let (wal, report, replayed) =
                    open(&sim, opts()).map_err(|e| format!("{context}: reopen failed: {e}"))?;
                assert!(
                    report.first_lsn <= mark,
                    "{context}: first_lsn {} above the mark {mark}",
                    report.first_lsn
                );
                assert_suffix(report.first_lsn, &replayed, N);
                // What open left is a healthy log: no leftovers, the mark names the oldest
                // segment, and it survives another power cut and removal.
                let scanned = scan_sim(&sim)?;
                assert!(scanned.leftover_segments.is_empty(), "{context}");
                if let Some(trim) = read_trim(&sim)? {
                    assert_eq!(scanned.segments[0].seq, trim.seq, "{context}");
                }
                wal.remove_segments_before(Lsn(150))?;
                drop(wal);
                sim.power_cut();
                let (_wal, report, replayed) = open(&sim, opts())
                    .map_err(|e| format!("{context}: second reopen failed: {e}"))?;
                assert!(report.first_lsn <= mark, "{context}");
                assert_suffix(report.first_lsn, &replayed, N);
            }
        }
    }
    Ok(())
}

#[test]
fn a_segment_whose_successor_was_never_created_is_not_removed() -> TestResult {
    // The roll seals a segment, then fails to create the next one (the log is poisoned). The
    // sealed segment must not be removable: TRIM would name a segment that does not exist.
    let sim = SimStorage::new(105);
    let (wal, _, _) = open(&sim, opts())?;
    let mut n = 0;
    while segments(&sim, dir()).len() < 3 {
        n += 1;
        append_one(&wal, n)?;
    }
    let sealed_before = segments(&sim, dir()).len() - 1;
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Rename,
        kind: FaultKind::Eio,
    });
    let mut failed = false;
    for i in n + 1..=n + 100 {
        if append_one(&wal, i).is_err() {
            failed = true;
            break;
        }
        n = i;
    }
    assert!(failed, "the roll never happened");
    assert!(wal.poisoned().is_some());
    // Only the segments sealed before the failed roll go.
    assert_eq!(wal.remove_segments_before(Lsn(u64::MAX))?, sealed_before);
    drop(wal);
    sim.power_cut_drop_unsynced();
    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_suffix(report.first_lsn, &replayed, n);
    assert!(replayed.last().map(|r| r.0) == Some(n));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Damaged TRIM.

#[test]
fn a_damaged_trim_is_corrupt_naming_the_file() -> TestResult {
    let sim = SimStorage::new(106);
    let (wal, _, _) = open(&sim, opts())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    wal.remove_segments_before(Lsn(100))?;
    wal.close()?;
    let good = sim.read_file(&trim_path()).ok_or("no TRIM")?;
    let trim = Trim::decode(&good)?;
    let other_log = Trim {
        store_id: [0xAA; 16],
        ..trim
    }
    .encode();
    let mut flipped = good.clone();
    flipped[30] ^= 0x04; // inside seq
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bit flip", flipped),
        ("truncated", good[..20].to_vec()),
        ("empty", Vec::new()),
        ("too long", [good.as_slice(), &[0]].concat()),
        ("another log's", other_log.to_vec()),
        ("a CLOSED file", {
            Closed {
                store_id: trim.store_id,
                seq: trim.seq,
                last_lsn: trim.first_lsn,
            }
            .encode()
            .to_vec()
        }),
    ];
    for (name, bytes) in cases {
        sim.write_file(&trim_path(), &bytes);
        let before = snapshot(&sim, dir());
        let (file, offset, reason) = expect_corrupt(open(&sim, opts()));
        assert_eq!((file, offset), (trim_path(), 0), "{name}: {reason}");
        assert!(reason.contains("TRIM"), "{name}: {reason}");
        let (file, _, _) = expect_corrupt(scan_sim(&sim));
        assert_eq!(file, trim_path(), "{name}");
        assert_eq!(snapshot(&sim, dir()), before, "{name}: files changed");
    }
    let mut future = good.clone();
    future[8] = 2;
    sim.write_file(&trim_path(), &future);
    assert!(matches!(
        open(&sim, opts()),
        Err(WalError::UnsupportedVersion { file, version: 2 }) if file == trim_path()
    ));
    sim.write_file(&trim_path(), &good);
    let (_wal, report, _) = open(&sim, opts())?;
    assert_eq!(report.first_lsn, trim.first_lsn);
    Ok(())
}

#[test]
fn a_trim_that_disagrees_with_the_oldest_segment_name_is_corrupt() -> TestResult {
    let sim = closed_log(107, 200)?;
    let segs = segments(&sim, dir());
    let (seq, first_lsn) = name_of(&segs[2]);
    let trim = Trim {
        store_id: store_id(&sim)?,
        seq,
        first_lsn: Lsn(first_lsn + 1),
    };
    sim.write_file(&trim_path(), &trim.encode());
    let (file, _, reason) = expect_corrupt(open(&sim, opts()));
    assert_eq!(file, segs[2], "{reason}");
    Ok(())
}

#[test]
fn missing_meta_with_only_a_trim_is_corrupt() -> TestResult {
    let sim = SimStorage::new(108);
    sim.write_file(
        &trim_path(),
        &Trim {
            store_id: [1; 16],
            seq: 3,
            first_lsn: Lsn(50),
        }
        .encode(),
    );
    let (file, _, _) = expect_corrupt(open(&sim, opts()));
    assert_eq!(file, dir().join("META"));
    let (file, _, _) = expect_corrupt(scan_sim(&sim));
    assert_eq!(file, dir().join("META"));
    assert_eq!(sim.list(dir())?, vec![format::TRIM_FILE_NAME]);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CLOSED: the newest segment after a clean close.

#[test]
fn clean_close_records_the_newest_segment_and_last_lsn() -> TestResult {
    let sim = SimStorage::new(109);
    let (wal, _, _) = open(&sim, opts())?;
    wal.close()?;
    let closed = Closed::decode(&sim.read_file(&closed_path()).ok_or("no CLOSED")?)?;
    assert_eq!((closed.seq, closed.last_lsn), (1, Lsn(0)));
    assert_eq!(closed.store_id, store_id(&sim)?);

    let (wal, _, _) = open(&sim, opts())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    // Not touched while the log is open: it only ever understates the log.
    assert_eq!(
        Closed::decode(&sim.read_file(&closed_path()).ok_or("no CLOSED")?)?,
        closed
    );
    wal.close()?;
    let closed = Closed::decode(&sim.read_file(&closed_path()).ok_or("no CLOSED")?)?;
    let segs = segments(&sim, dir());
    assert_eq!(closed.seq, name_of(&segs[segs.len() - 1]).0);
    assert_eq!(closed.last_lsn, Lsn(200));
    // A later crashed run that trims everything it can still reopens.
    let (wal, _, _) = open(&sim, opts())?;
    for i in 201..=300 {
        append_one(&wal, i)?;
    }
    wal.remove_segments_before(Lsn(u64::MAX))?;
    drop(wal);
    sim.power_cut();
    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_suffix(report.first_lsn, &replayed, 300);
    Ok(())
}

#[test]
fn deleted_newest_segment_after_a_clean_close_is_missing() -> TestResult {
    let sim = closed_log(110, 200)?;
    let segs = segments(&sim, dir());
    let newest = segs[segs.len() - 1].clone();
    sim.remove_file(&newest)?;
    sim.sync_dir(dir())?;
    let before = snapshot(&sim, dir());
    let (file, reason) = expect_missing(open(&sim, opts()));
    assert_eq!(file, closed_path(), "{reason}");
    let (file, _) = expect_missing(scan_sim(&sim));
    assert_eq!(file, closed_path());
    assert_eq!(snapshot(&sim, dir()), before);
    // Every segment gone.
    for seg in &segs[..segs.len() - 1] {
        sim.remove_file(seg)?;
    }
    sim.sync_dir(dir())?;
    let (file, _) = expect_missing(open(&sim, opts()));
    assert_eq!(file, closed_path());
    Ok(())
}

#[test]
fn emptied_or_cut_newest_segment_after_a_clean_close_is_corrupt() -> TestResult {
    let sim = closed_log(111, 200)?;
    let segs = segments(&sim, dir());
    let newest = segs[segs.len() - 1].clone();
    let original = sim.read_file(&newest).ok_or("no segment")?;
    let frames = data_frame_offsets(&original);
    assert!(frames.len() >= 2);
    let last_frame = frames[frames.len() - 1];
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("emptied", Vec::new(), 0),
        ("header only", original[..64].to_vec(), 0),
        ("header and mark slots only", original[..128].to_vec(), 128),
        (
            "cut at the last data frame",
            original[..last_frame as usize].to_vec(),
            last_frame,
        ),
        (
            "cut inside the last data frame",
            original[..last_frame as usize + 40].to_vec(),
            last_frame,
        ),
    ];
    for (name, bytes, at) in cases {
        sim.write_file(&newest, &bytes);
        let before = snapshot(&sim, dir());
        let (file, offset, reason) = expect_corrupt(open(&sim, opts()));
        assert_eq!((file, offset), (newest.clone(), at), "{name}: {reason}");
        assert!(reason.contains("CLOSED"), "{name}: {reason}");
        expect_corrupt(scan_sim(&sim));
        assert_eq!(snapshot(&sim, dir()), before, "{name}");
    }
    // Losing only the CLOSE frame loses no record: still a torn tail.
    let close_frame = original.len() - format::FRAME_HEADER_BYTES;
    sim.write_file(&newest, &original[..close_frame]);
    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_eq!(replayed, expected(200));
    assert!(!report.clean_shutdown);
    Ok(())
}

/// Offsets of the DATA frames of a segment image.
fn data_frame_offsets(image: &[u8]) -> Vec<u64> {
    let mut offsets = Vec::new();
    let mut at = format::SEGMENT_FRAMES_OFFSET;
    while at + format::FRAME_HEADER_BYTES <= image.len() {
        let header = format::FrameHeader::parse(&image[at..]);
        if header.kind == format::FrameKind::Data as u8 {
            offsets.push(at as u64);
        }
        at += format::FRAME_HEADER_BYTES + header.body_bytes as usize;
    }
    offsets
}

#[test]
fn a_damaged_closed_is_corrupt_naming_the_file() -> TestResult {
    let sim = closed_log(112, 50)?;
    let good = sim.read_file(&closed_path()).ok_or("no CLOSED")?;
    let mut flipped = good.clone();
    flipped[40] ^= 1;
    for bytes in [flipped, good[..47].to_vec()] {
        sim.write_file(&closed_path(), &bytes);
        let (file, offset, _) = expect_corrupt(open(&sim, opts()));
        assert_eq!((file, offset), (closed_path(), 0));
        expect_corrupt(scan_sim(&sim));
    }
    // Deleting CLOSED only loses its checks.
    sim.remove_file(&closed_path())?;
    sim.sync_dir(dir())?;
    let (_wal, report, replayed) = open(&sim, opts())?;
    assert_eq!(replayed, expected(50));
    assert!(report.clean_shutdown);
    Ok(())
}

#[test]
fn a_crash_at_every_step_of_close_reopens_with_everything() -> TestResult {
    const N: u64 = 30;
    // Buffered appends, so no MARK frame written behind the test's back shifts the count of
    // operations; close syncs them all.
    let setup = |seed: u64| -> Result<(SimStorage, kairos_wal::Wal), WalError> {
        let sim = SimStorage::new(seed);
        let (wal, _, _) = open(&sim, options(Durability::Buffered, 4096))?;
        for i in 1..=N {
            append_one(&wal, i)?;
        }
        Ok((sim, wal))
    };
    let (sim, wal) = setup(113)?;
    let before = sim.io_ops();
    wal.close()?;
    let steps = sim.io_ops() - before;
    for step in 0..=steps {
        for variant in 0..3u64 {
            let (sim, wal) = setup(2000 + step * 4 + variant)?;
            sim.inject(FaultPlan {
                after: step,
                op: FaultOp::Any,
                kind: FaultKind::Eio,
            });
            let closed = wal.close();
            assert_eq!(closed.is_ok(), step == steps, "step {step}: {closed:?}");
            match variant {
                0 => sim.crash_process(),
                1 => sim.power_cut_drop_unsynced(),
                _ => sim.power_cut(),
            }
            let (_wal, report, replayed) = open(&sim, opts())
                .map_err(|e| format!("step {step}/{steps} variant {variant}: {e}"))?;
            // Close's first operation is the fdatasync of the appended records: if it failed,
            // a power cut may lose any of them (they were never acknowledged as durable).
            let at_least = if step == 0 && variant != 0 { 0 } else { N };
            assert_prefix(&replayed, at_least, N);
            assert_eq!(report.first_lsn, Lsn(1));
            if step == steps {
                assert!(report.clean_shutdown, "variant {variant}");
            }
        }
    }
    Ok(())
}
