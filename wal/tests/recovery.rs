//! Torn tails versus corruption, foreign and missing segments, locking, scan.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use kairos_wal::format::{FrameHeader, FrameKind, FRAME_HEADER_BYTES, SEGMENT_FRAMES_OFFSET};
use kairos_wal::{
    scan, scan_located, Durability, FsStorage, Lsn, SimStorage, Storage, TornTail, WalError,
    WalOptions,
};

/// A Buffered log of records 1..=n in one segment, dropped without close (no CLOSE, no MARK):
/// its frames sit at `buffered_frame_offset(i)`.
fn unsynced_log(seed: u64, n: u64) -> Result<(SimStorage, PathBuf), WalError> {
    let sim = SimStorage::new(seed);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    for i in 1..=n {
        append_one(&wal, i)?;
    }
    drop(wal);
    let seg = segments(&sim, dir())[0].clone();
    Ok((sim, seg))
}

/// A Sync log of records 1..=n with 4 KiB segments, closed cleanly.
fn closed_log(seed: u64, n: u64) -> Result<SimStorage, WalError> {
    common::closed_log(seed, n, Durability::Sync)
}

fn expect_corrupt(result: Result<impl std::fmt::Debug, WalError>) -> (PathBuf, u64, String) {
    match result {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => (file, offset, reason),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn torn_tail_cases_are_truncated_and_reported() -> TestResult {
    let n = 10;
    // Record 8's frame is damaged in each case; 1..=7 survive and LSN 8 is the first lost.
    let frame8 = buffered_frame_offset(8);
    let frame9 = buffered_frame_offset(9);
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "cut inside the frame header",
            Box::new(move |b| b.truncate(frame8 as usize + 10)),
        ),
        (
            "cut inside the body",
            Box::new(move |b| b.truncate(frame9 as usize - 3)),
        ),
        (
            "cut at the frame start, then zeros",
            Box::new(move |b| {
                b.truncate(frame8 as usize);
                b.resize(frame8 as usize + 700, 0);
            }),
        ),
        (
            "frame 8 zeroed, frames after it intact",
            Box::new(move |b| {
                b[frame8 as usize..frame9 as usize].fill(0);
            }),
        ),
        (
            "garbage from frame 8 on",
            Box::new(move |b| {
                for (k, byte) in b[frame8 as usize..].iter_mut().enumerate() {
                    *byte = (k * 37 + 11) as u8;
                }
            }),
        ),
        (
            "bit flip in frame 8's body",
            Box::new(move |b| b[frame8 as usize + 36] ^= 0x10),
        ),
        (
            "length field of frame 8 says 4 GiB",
            Box::new(move |b| {
                b[frame8 as usize..frame8 as usize + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            }),
        ),
    ];
    for (name, damage) in cases {
        let (sim, seg) = unsynced_log(20, n)?;
        let mut bytes = sim.read_file(&seg).ok_or("no segment")?;
        damage(&mut bytes);
        let damaged_len = bytes.len() as u64;
        sim.write_file(&seg, &bytes);

        let scanned = scan(&sim, dir(), 1 << 20, &mut |_| {})?;
        // Zeros to the end are what a `Sync` writer keeps ahead of its frames: cut off, not
        // reported as torn.
        let zeros_only = bytes[frame8 as usize..].iter().all(|&b| b == 0);
        let expected_tail = (!zeros_only).then(|| TornTail {
            file: seg.clone(),
            offset: frame8,
            bytes_truncated: damaged_len - frame8,
            first_lost_lsn: Lsn(8),
        });
        assert_eq!(scanned.torn_tail, expected_tail, "{name}");
        assert_eq!(
            sim.read_file(&seg).map(|b| b.len() as u64),
            Some(damaged_len),
            "scan wrote"
        );

        let (wal, report, replayed) = open(&sim, WalOptions::default())?;
        assert_eq!(report.torn_tail, expected_tail, "{name}");
        assert_eq!(replayed, expected(7), "{name}");
        assert_eq!(
            sim.read_file(&seg).map(|b| b.len() as u64),
            Some(frame8),
            "{name}"
        );
        assert_eq!(
            append_one(&wal, 8)?,
            8,
            "{name}: next append must reuse LSN 8"
        );
        wal.close()?;
        let (_wal, report, replayed) = open(&sim, WalOptions::default())?;
        assert_eq!((report.torn_tail, replayed), (None, expected(8)), "{name}");
    }
    Ok(())
}

#[test]
fn bit_flip_in_a_sealed_segment_is_corrupt_and_nothing_is_truncated() -> TestResult {
    let sim = closed_log(21, 200)?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 3);
    // Flip a bit inside the body of the first frame of the first (sealed) segment.
    let first_frame = SEGMENT_FRAMES_OFFSET as u64;
    flip_bit(
        &sim,
        &segs[0],
        first_frame + FRAME_HEADER_BYTES as u64 + 2,
        3,
    );
    let before = snapshot(&sim, dir());

    let (file, offset, reason) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!(
        (file.as_path(), offset),
        (segs[0].as_path(), first_frame),
        "{reason}"
    );
    let (file, offset, _) = expect_corrupt(scan(&sim, dir(), 1 << 20, &mut |_| {}));
    assert_eq!((file.as_path(), offset), (segs[0].as_path(), first_frame));
    assert_eq!(
        snapshot(&sim, dir()),
        before,
        "a failed open changed the files"
    );
    Ok(())
}

#[test]
fn bit_flip_in_the_last_segment_of_a_closed_log_is_corrupt() -> TestResult {
    let sim = closed_log(22, 20)?;
    let seg = segments(&sim, dir())[0].clone();
    let bytes = sim.read_file(&seg).ok_or("no segment")?;
    // The log ends ... DATA(20), MARK, CLOSE; damage the last DATA frame's body.
    let last_data = bytes.len() as u64 - 64 - data_frame_bytes(body(20).len());
    flip_bit(&sim, &seg, last_data + FRAME_HEADER_BYTES as u64 + 1, 0);
    let before = snapshot(&sim, dir());
    let (file, offset, reason) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!((file, offset), (seg, last_data));
    assert!(reason.contains("already durable"), "{reason}");
    assert_eq!(snapshot(&sim, dir()), before);
    Ok(())
}

#[test]
fn bit_flip_in_the_last_synced_batch_after_a_process_crash_is_corrupt() -> TestResult {
    // Sync mode writes a MARK after each idle sync, so the last acked batch is protected.
    let sim = SimStorage::new(23);
    let (wal, _, _) = open(&sim, WalOptions::default())?;
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    // Wait until the writer has put the MARK after record 5 down (it follows the ack).
    let seg = segments(&sim, dir())[0].clone();
    let ends_with_mark = |bytes: &[u8]| {
        let bytes = &bytes[..frames_end(bytes)];
        let last = FrameHeader::parse(&bytes[bytes.len() - 32..]);
        last.check_fields() == Ok(FrameKind::Mark) && last.first_lsn == 6
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sim.read_file(&seg).is_some_and(|b| ends_with_mark(&b)) {
        assert!(std::time::Instant::now() < deadline, "MARK never written");
        std::thread::yield_now();
    }
    sim.crash_process();
    drop(wal);
    let len = sim.read_file(&seg).map_or(0, |b| frames_end(&b) as u64);
    let frame5 = len - 32 - data_frame_bytes(body(5).len());
    flip_bit(&sim, &seg, frame5 + FRAME_HEADER_BYTES as u64 + 2, 5);
    let (file, offset, _) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!((file, offset), (seg, frame5));
    Ok(())
}

#[test]
fn damaged_segment_header_is_corrupt_unless_it_is_an_unwritten_newest_segment() -> TestResult {
    let sim = closed_log(24, 200)?;
    let segs = segments(&sim, dir());
    flip_bit(&sim, &segs[1], 40, 0); // prev_last_lsn, covered by header_crc
    let (file, offset, _) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!((file, offset), (segs[1].clone(), 0));
    Ok(())
}

#[test]
fn segment_copied_from_another_log_is_foreign() -> TestResult {
    let ours = closed_log(25, 200)?;
    let theirs = closed_log(26, 200)?;
    let our_segs = segments(&ours, dir());
    let their_segs = segments(&theirs, dir());
    assert_eq!(
        our_segs[0], their_segs[0],
        "the first segment has the same name in any log"
    );
    // Replace our first segment with theirs: same name, valid, but another store id.
    let foreign = theirs.read_file(&their_segs[0]).ok_or("no segment")?;
    ours.write_file(&our_segs[0], &foreign);
    match open(&ours, WalOptions::default()) {
        Err(WalError::ForeignSegment { file }) => assert_eq!(file, our_segs[0]),
        other => panic!("expected ForeignSegment, got {other:?}"),
    }
    // Appended as a new newest segment, it is refused the same way.
    let ours = closed_log(25, 200)?;
    let next_seq = segments(&ours, dir()).len() as u64 + 1;
    let extra = dir().join(kairos_wal::format::segment_file_name(next_seq, Lsn(201)));
    ours.write_file(&extra, &foreign);
    assert!(matches!(
        scan(&ours, dir(), 1 << 20, &mut |_| {}),
        Err(WalError::ForeignSegment { file }) if file == extra
    ));
    Ok(())
}

#[test]
fn deleted_middle_segment_is_missing() -> TestResult {
    let sim = closed_log(27, 200)?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 3);
    sim.remove_file(&segs[1])?;
    sim.sync_dir(dir())?;
    let before = snapshot(&sim, dir());
    match open(&sim, WalOptions::default()) {
        Err(WalError::MissingSegment { file, reason }) => {
            assert_eq!(file, segs[2], "{reason}");
        }
        other => panic!("expected MissingSegment, got {other:?}"),
    }
    assert_eq!(snapshot(&sim, dir()), before);
    Ok(())
}

#[test]
fn missing_meta_with_segments_is_corrupt() -> TestResult {
    let sim = closed_log(28, 3)?;
    sim.remove_file(&dir().join("META"))?;
    sim.sync_dir(dir())?;
    let (file, _, _) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!(file, dir().join("META"));
    Ok(())
}

#[test]
fn record_larger_than_the_configured_limit_is_corrupt_not_truncated() -> TestResult {
    let sim = SimStorage::new(29);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    append_one(&wal, 1)?;
    wal.append(&[kairos_wal::Record {
        record_type: 1,
        body: &[7; 500],
    }])?
    .wait()?;
    drop(wal);
    let small = WalOptions {
        record_bytes_max: 100,
        ..WalOptions::default()
    };
    let (_, offset, reason) = expect_corrupt(open(&sim, small));
    assert_eq!(offset, buffered_frame_offset(2));
    assert!(reason.contains("record_bytes_max"), "{reason}");
    let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(replayed.len(), 2);
    Ok(())
}

#[test]
fn huge_length_in_a_sealed_segment_is_corrupt() -> TestResult {
    let sim = closed_log(30, 200)?;
    let seg = segments(&sim, dir())[0].clone();
    let mut bytes = sim.read_file(&seg).ok_or("no segment")?;
    bytes[SEGMENT_FRAMES_OFFSET..SEGMENT_FRAMES_OFFSET + 4]
        .copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    sim.write_file(&seg, &bytes);
    let (file, offset, reason) = expect_corrupt(open(&sim, WalOptions::default()));
    assert_eq!((file, offset), (seg, SEGMENT_FRAMES_OFFSET as u64));
    assert!(reason.contains("exceeds"), "{reason}");
    Ok(())
}

#[test]
fn second_open_is_locked_on_sim_storage() -> TestResult {
    let sim = SimStorage::new(31);
    let (wal, _, _) = open(&sim, WalOptions::default())?;
    assert!(matches!(
        open(&sim, WalOptions::default()),
        Err(WalError::Locked { path }) if path == dir().join("LOCK")
    ));
    wal.close()?;
    let (_wal, _, _) = open(&sim, WalOptions::default())?;
    Ok(())
}

#[test]
fn second_open_is_locked_on_fs_storage() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _, _) = open_at(Arc::new(FsStorage), &wal_dir, WalOptions::default())?;
    assert!(matches!(
        open_at(Arc::new(FsStorage), &wal_dir, WalOptions::default()),
        Err(WalError::Locked { .. })
    ));
    drop(wal);
    let (wal, _, _) = open_at(Arc::new(FsStorage), &wal_dir, WalOptions::default())?;
    wal.close()?;
    Ok(())
}

/// A log on real files with records 1..=n, 4 KiB segments, closed cleanly.
fn fs_log(n: u64) -> Result<(tempfile::TempDir, PathBuf), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _, _) = open_at(
        Arc::new(FsStorage),
        &wal_dir,
        options(Durability::Sync, 4096),
    )?;
    for i in 1..=n {
        append_one(&wal, i)?;
    }
    wal.close()?;
    Ok((tmp, wal_dir))
}

fn scan_records(dir: &Path) -> (Result<kairos_wal::ScanReport, WalError>, Replayed) {
    let mut seen = Vec::new();
    let report = scan(&FsStorage, dir, 1 << 20, &mut |r| {
        seen.push((r.lsn.0, r.record_type, r.body.to_vec()));
    });
    (report, seen)
}

#[test]
fn scan_of_a_valid_directory() -> TestResult {
    let (_tmp, wal_dir) = fs_log(150)?;
    let (report, seen) = scan_records(&wal_dir);
    let report = report?;
    assert_eq!(seen, expected(150));
    assert_eq!((report.records, report.last_lsn), (150, Lsn(150)));
    assert!(report.clean_shutdown);
    assert_eq!(report.torn_tail, None);
    assert_eq!(report.segments.len(), segments(&FsStorage, &wal_dir).len());
    assert_eq!(report.segments[0].first_lsn, Lsn(1));
    Ok(())
}

#[test]
fn scan_located_names_each_records_file_frame_and_offset() -> TestResult {
    // Frames of one to three records over 4 KiB segments, so records sit at every position
    // in a frame and frames in several segments.
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _, _) = open_at(
        Arc::new(FsStorage),
        &wal_dir,
        options(Durability::Sync, 4096),
    )?;
    let mut i = 1;
    while i <= 150 {
        let bodies: Vec<Vec<u8>> = (i..(i + i % 3 + 1).min(151)).map(body).collect();
        let records: Vec<kairos_wal::Record<'_>> = bodies
            .iter()
            .enumerate()
            .map(|(k, b)| kairos_wal::Record {
                record_type: record_type(i + k as u64),
                body: b,
            })
            .collect();
        wal.append(&records)?.wait()?;
        i += bodies.len() as u64;
    }
    wal.close()?;
    let mut seen = Vec::new();
    let mut places = Vec::new();
    let report = scan_located(&FsStorage, &wal_dir, 1 << 20, &mut |r, place| {
        seen.push((r.lsn.0, r.record_type, r.body.to_vec()));
        places.push((place.file.to_path_buf(), place.frame_offset, place.offset));
    })?;
    assert_eq!(seen, expected(150));
    assert!(report.segments.len() >= 3, "{report:?}");
    let mut files = std::collections::BTreeMap::new();
    for ((lsn, kind, bytes), (file, frame_offset, offset)) in seen.iter().zip(&places) {
        let segment = report
            .segments
            .iter()
            .find(|s| (s.first_lsn.0..=s.last_lsn.0).contains(lsn))
            .ok_or("no segment")?;
        assert_eq!(file, &segment.file, "LSN {lsn}");
        let data = files
            .entry(file.clone())
            .or_insert_with(|| std::fs::read(file).unwrap_or_default());
        let frame = FrameHeader::parse(&data[*frame_offset as usize..]);
        assert!(
            (frame.first_lsn..frame.first_lsn + u64::from(frame.record_count)).contains(lsn),
            "LSN {lsn}: frame at {frame_offset} is {frame:?}"
        );
        let at = *offset as usize;
        assert_eq!(data[at], *kind, "LSN {lsn} at {offset}");
        let len = u32::from_le_bytes(data[at + 1..at + 5].try_into()?) as usize;
        assert_eq!(
            &data[at + 5..at + 5 + len],
            &bytes[..],
            "LSN {lsn} at {offset}"
        );
    }
    Ok(())
}

#[test]
fn scan_of_a_torn_directory_reports_without_writing() -> TestResult {
    let (_tmp, wal_dir) = fs_log(150)?;
    let last = segments(&FsStorage, &wal_dir).pop().ok_or("no segment")?;
    let len = std::fs::metadata(&last)?.len();
    // Cut the CLOSE frame and the MARK before it in half: only control frames are torn.
    let cut = len - 32 - 16;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)?
        .set_len(cut)?;
    let (report, seen) = scan_records(&wal_dir);
    let report = report?;
    assert_eq!(seen, expected(150));
    let torn = report.torn_tail.ok_or("no torn tail")?;
    assert_eq!(
        (torn.file, torn.offset, torn.bytes_truncated),
        (last.clone(), len - 64, 16)
    );
    assert_eq!(torn.first_lost_lsn, Lsn(151));
    assert!(!report.clean_shutdown);
    assert_eq!(
        std::fs::metadata(&last)?.len(),
        cut,
        "scan must not truncate"
    );
    Ok(())
}

#[test]
fn scan_of_a_corrupt_directory_names_file_and_offset() -> TestResult {
    let (_tmp, wal_dir) = fs_log(150)?;
    let first = segments(&FsStorage, &wal_dir)[0].clone();
    let mut bytes = std::fs::read(&first)?;
    bytes[SEGMENT_FRAMES_OFFSET + FRAME_HEADER_BYTES] ^= 0x01;
    std::fs::write(&first, &bytes)?;
    let (report, seen) = scan_records(&wal_dir);
    let (file, offset, _) = expect_corrupt(report);
    assert_eq!((file, offset), (first, SEGMENT_FRAMES_OFFSET as u64));
    assert!(seen.is_empty());
    Ok(())
}

#[test]
fn scan_of_an_empty_or_missing_log_directory() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let report = scan(&FsStorage, tmp.path(), 1 << 20, &mut |_| {})?;
    assert_eq!((report.records, report.segments.len()), (0, 0));
    assert!(matches!(
        scan(&FsStorage, &tmp.path().join("absent"), 1 << 20, &mut |_| {}),
        Err(WalError::Io { .. })
    ));
    Ok(())
}
