//! Append, reopen, roll: exact LSNs and bodies back.

mod common;

use std::sync::Arc;

use common::*;
use kairos_wal::format::{self, FrameHeader, FrameKind, SEGMENT_FRAMES_OFFSET};
use kairos_wal::{
    Durability, FsStorage, Lsn, Record, ReplayError, SimStorage, Storage, Wal, WalError,
    WalOptions, RECORD_TYPE_USER_MAX,
};

#[test]
fn append_and_reopen_returns_exact_lsns_and_bodies() -> TestResult {
    let sim = SimStorage::new(1);
    let (wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(
        (report.records, report.last_lsn, replayed.len()),
        (0, Lsn(0), 0)
    );
    assert_eq!((report.segments, report.first_lsn), (1, Lsn(1)));
    assert!(!report.clean_shutdown);

    let batch = wal.append(&[
        Record {
            record_type: 1,
            body: b"alpha",
        },
        Record {
            record_type: 0xEF,
            body: b"",
        },
        Record {
            record_type: 7,
            body: &[0u8; 300],
        },
    ])?;
    assert_eq!((batch.first_lsn(), batch.last_lsn()), (Lsn(1), Lsn(3)));
    batch.wait()?;
    let single = wal.append(&[Record {
        record_type: 2,
        body: b"omega",
    }])?;
    assert_eq!((single.first_lsn(), single.last_lsn()), (Lsn(4), Lsn(4)));
    single.wait()?;
    assert_eq!(wal.last_lsn(), Lsn(4));
    assert_eq!(wal.synced_lsn(), Lsn(4));
    wal.close()?;

    let (wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(
        replayed,
        vec![
            (1, 1, b"alpha".to_vec()),
            (2, 0xEF, Vec::new()),
            (3, 7, vec![0u8; 300]),
            (4, 2, b"omega".to_vec()),
        ]
    );
    assert_eq!((report.records, report.last_lsn), (4, Lsn(4)));
    assert!(report.clean_shutdown);
    assert_eq!(report.torn_tail, None);
    // Appending continues after the CLOSE frame with the next LSN.
    assert_eq!(append_one(&wal, 5)?, 5);
    wal.close()?;
    let (_wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(report.last_lsn, Lsn(5));
    assert_eq!(replayed[4], (5, record_type(5), body(5)));
    Ok(())
}

#[test]
fn segment_layout_is_exactly_as_specified() -> TestResult {
    let sim = SimStorage::new(2);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    append_one(&wal, 1)?;
    wal.close()?;
    let segs = segments(&sim, dir());
    assert_eq!(
        segs,
        vec![dir().join("0000000000000001-0000000000000001.seg")]
    );
    let bytes = sim.read_file(&segs[0]).ok_or("segment missing")?;
    // header, DATA(1), CLOSE — Buffered mode writes no MARK.
    let data = data_frame_bytes(body(1).len());
    assert_eq!(bytes.len() as u64, SEGMENT_FRAMES_OFFSET as u64 + data + 32);
    let header = format::SegmentHeader::decode(&bytes)?;
    assert_eq!((header.seq, header.prev_last_lsn), (1, 0));
    let close = FrameHeader::parse(&bytes[SEGMENT_FRAMES_OFFSET + data as usize..]);
    assert_eq!(close.check_fields(), Ok(FrameKind::Close));
    assert_eq!((close.first_lsn, close.synced_lsn), (2, 1));
    Ok(())
}

#[test]
fn tiny_segments_roll_seal_and_reopen() -> TestResult {
    let sim = SimStorage::new(3);
    let opts = options(Durability::Sync, 4096);
    let (wal, _, _) = open(&sim, opts.clone())?;
    for i in 1..=300 {
        assert_eq!(append_one(&wal, i)?, i);
    }
    wal.close()?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 4, "only {} segments", segs.len());
    // Every segment but the last ends with SEAL and respects the size limit (+ control frames).
    let mut expected_first = 1;
    for (index, seg) in segs.iter().enumerate() {
        let bytes = sim.read_file(seg).ok_or("segment missing")?;
        assert!(
            bytes.len() <= 4096 + 64,
            "{} is {} bytes",
            seg.display(),
            bytes.len()
        );
        let header = format::SegmentHeader::decode(&bytes)?;
        assert_eq!(header.seq, index as u64 + 1);
        assert_eq!(header.first_lsn(), Lsn(expected_first));
        let name = seg.file_name().and_then(|n| n.to_str()).ok_or("name")?;
        assert_eq!(
            name,
            format::segment_file_name(header.seq, header.first_lsn())
        );
        let last = FrameHeader::parse(&bytes[bytes.len() - 32..]);
        let kind = if index + 1 < segs.len() {
            FrameKind::Seal
        } else {
            FrameKind::Close
        };
        assert_eq!(last.check_fields(), Ok(kind));
        expected_first = last.first_lsn;
    }
    assert_eq!(expected_first, 301);

    let (wal, report, replayed) = open(&sim, opts.clone())?;
    assert_eq!(replayed, expected(300));
    assert_eq!(report.segments, segs.len());
    assert!(report.clean_shutdown);
    drop(wal);
    let scanned = kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {})?;
    assert_eq!(scanned.segments.len(), segs.len());
    assert_eq!(scanned.segments.iter().map(|s| s.records).sum::<u64>(), 300);
    assert!(scanned.segments[..segs.len() - 1].iter().all(|s| s.sealed));
    for pair in scanned.segments.windows(2) {
        assert_eq!(pair[1].first_lsn.0, pair[0].last_lsn.0 + 1);
    }
    Ok(())
}

#[test]
fn a_frame_larger_than_a_segment_gets_its_own_segment() -> TestResult {
    let sim = SimStorage::new(4);
    let opts = options(Durability::Sync, 4096);
    let (wal, _, _) = open(&sim, opts.clone())?;
    append_one(&wal, 1)?;
    let big = vec![0xAB; 10_000];
    wal.append(&[Record {
        record_type: 9,
        body: &big,
    }])?
    .wait()?;
    append_one(&wal, 3)?;
    wal.close()?;
    let segs = segments(&sim, dir());
    assert_eq!(segs.len(), 3);
    let (_wal, _, replayed) = open(&sim, opts)?;
    assert_eq!(replayed[1], (2, 9, big));
    assert_eq!(replayed[2], (3, record_type(3), body(3)));
    Ok(())
}

#[test]
fn remove_segments_before_keeps_a_contiguous_suffix() -> TestResult {
    let sim = SimStorage::new(5);
    let opts = options(Durability::Sync, 4096);
    let (wal, _, _) = open(&sim, opts.clone())?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    let before = segments(&sim, dir()).len();
    // Nothing below LSN 1: nothing removed.
    assert_eq!(wal.remove_segments_before(Lsn(1))?, 0);
    let removed = wal.remove_segments_before(Lsn(150))?;
    assert!(removed >= 1);
    assert_eq!(segments(&sim, dir()).len(), before - removed);
    wal.close()?;
    let (_wal, report, replayed) = open(&sim, opts)?;
    assert!(report.first_lsn.0 > 1 && report.first_lsn.0 <= 150);
    assert_eq!(replayed.first().map(|r| r.0), Some(report.first_lsn.0));
    assert_eq!(replayed.last().map(|r| r.0), Some(200));
    let first = report.first_lsn.0;
    assert_eq!(replayed, expected(200)[first as usize - 1..].to_vec());
    Ok(())
}

#[test]
fn invalid_appends_are_refused_without_side_effects() -> TestResult {
    let sim = SimStorage::new(6);
    let opts = WalOptions {
        record_bytes_max: 100,
        ..WalOptions::default()
    };
    let (wal, _, _) = open(&sim, opts)?;
    assert!(matches!(
        wal.append(&[]),
        Err(WalError::InvalidRecord { .. })
    ));
    for record_type in [0, RECORD_TYPE_USER_MAX + 1, 0xFF] {
        let result = wal.append(&[Record {
            record_type,
            body: b"",
        }]);
        assert!(
            matches!(result, Err(WalError::InvalidRecord { .. })),
            "{record_type}"
        );
    }
    let result = wal.append(&[Record {
        record_type: 1,
        body: &[0; 101],
    }]);
    assert!(matches!(
        result,
        Err(WalError::RecordTooLarge {
            bytes: 101,
            max: 100
        })
    ));
    assert_eq!(wal.last_lsn(), Lsn(0));
    wal.append(&[Record {
        record_type: 1,
        body: &[0; 100],
    }])?
    .wait()?;
    assert_eq!(wal.last_lsn(), Lsn(1));
    Ok(())
}

#[test]
fn invalid_options_are_refused() {
    let sim = SimStorage::new(7);
    for opts in [
        options(Durability::Sync, 4095),
        options(Durability::Interval(std::time::Duration::ZERO), 1 << 20),
        WalOptions {
            record_bytes_max: u32::MAX,
            ..WalOptions::default()
        },
    ] {
        assert!(matches!(
            open(&sim, opts),
            Err(WalError::InvalidOptions { .. })
        ));
    }
}

#[test]
fn replay_error_aborts_open_and_names_the_record() -> TestResult {
    let sim = SimStorage::new(8);
    let (wal, _, _) = open(&sim, WalOptions::default())?;
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    wal.close()?;
    let mut seen = 0;
    let result = Wal::open(
        Arc::new(sim.clone()),
        dir(),
        WalOptions::default(),
        &mut |r| {
            seen += 1;
            if r.lsn == Lsn(3) {
                Err(ReplayError("no thanks".to_owned()))
            } else {
                Ok(())
            }
        },
    );
    match result {
        Err(WalError::Replay {
            lsn, file, source, ..
        }) => {
            assert_eq!(lsn, Lsn(3));
            assert_eq!(source.0, "no thanks");
            assert_eq!(file, segments(&sim, dir())[0]);
        }
        other => panic!("expected Replay, got {other:?}"),
    }
    assert_eq!(seen, 3);
    // The lock was released: a normal open works and nothing was lost.
    let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(replayed, expected(5));
    Ok(())
}

#[test]
fn leftover_tmp_files_are_removed_at_open() -> TestResult {
    let sim = SimStorage::new(9);
    let (wal, _, _) = open(&sim, WalOptions::default())?;
    append_one(&wal, 1)?;
    wal.close()?;
    sim.write_file(
        &dir().join("0000000000000002-0000000000000002.seg.tmp"),
        b"half",
    );
    sim.write_file(&dir().join("META.tmp"), b"half");
    let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(replayed, expected(1));
    assert_eq!(
        sim.list(dir())?,
        // SYNCED: the first segment on record (`proof_before_ack`).
        vec![
            "0000000000000001-0000000000000001.seg",
            "CLOSED",
            "META",
            "SYNCED"
        ]
    );
    Ok(())
}

#[test]
fn zero_byte_newest_segment_is_an_unwritten_roll() -> TestResult {
    let sim = SimStorage::new(10);
    // No marks: with them (or with proof before acknowledgement), each roll records its new
    // segment in SYNCED once created, and an emptied segment SYNCED names is corruption
    // (below).
    let opts = WalOptions {
        synced_mark_delay: None,
        proof_before_ack: false,
        ..options(Durability::Sync, 4096)
    };
    let (wal, _, _) = open(&sim, opts.clone())?;
    for i in 1..=120 {
        append_one(&wal, i)?;
    }
    // A crash, not a clean close: after a clean close `CLOSED` records the newest segment's
    // records as durable, and emptying that segment is corruption (`closed_log_*` tests).
    drop(wal);
    // Leave the state of a crash during a roll: the newest segment exists but holds 0 bytes.
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 2);
    let newest = segs[segs.len() - 1].clone();
    let sealed_last =
        kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {})?.segments[segs.len() - 2].last_lsn;
    sim.write_file(&newest, b"");

    let (wal, report, replayed) = open(&sim, opts)?;
    let torn = report.torn_tail.ok_or("unwritten segment not reported")?;
    assert_eq!(torn.file, newest);
    assert_eq!((torn.offset, torn.bytes_truncated), (0, 0));
    assert_eq!(torn.first_lost_lsn, Lsn(sealed_last.0 + 1));
    assert_eq!(replayed, expected(sealed_last.0));
    assert_eq!(append_one(&wal, sealed_last.0 + 1)?, sealed_last.0 + 1);
    wal.close()?;
    let bytes = sim.read_file(&newest).ok_or("segment not recreated")?;
    assert_eq!(
        format::SegmentHeader::decode(&bytes)?.seq,
        segs.len() as u64
    );
    Ok(())
}

#[test]
fn zero_byte_newest_segment_that_synced_names_is_corruption() -> TestResult {
    let sim = SimStorage::new(11);
    let opts = options(Durability::Sync, 4096);
    let (wal, _, _) = open(&sim, opts.clone())?;
    for i in 1..=120 {
        append_one(&wal, i)?;
    }
    drop(wal);
    // The roll that created the newest segment completed and recorded it in SYNCED: its
    // header was durable, so an empty file is outside damage, not a crash during the roll.
    let newest = segments(&sim, dir()).pop().ok_or("no segment")?;
    sim.write_file(&newest, b"");
    let before = snapshot(&sim, dir());
    match open(&sim, opts) {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => {
            assert_eq!((file, offset), (newest, 0));
            assert!(reason.contains("SYNCED"), "{reason}");
        }
        other => panic!("an emptied segment SYNCED names was not refused: {other:?}"),
    }
    assert_eq!(snapshot(&sim, dir()), before);
    Ok(())
}

#[cfg(unix)]
#[test]
fn fs_storage_roundtrip_with_private_permissions() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("data").join("wal");
    let opts = options(Durability::Sync, 4096);
    let (wal, _, _) = open_at(Arc::new(FsStorage), &wal_dir, opts.clone())?;
    for i in 1..=150 {
        append_one(&wal, i)?;
    }
    wal.close()?;
    let (wal, report, replayed) = open_at(Arc::new(FsStorage), &wal_dir, opts)?;
    assert_eq!(replayed, expected(150));
    assert!(report.clean_shutdown);
    assert!(report.segments > 1);
    drop(wal);
    let mode = |p: &std::path::Path| -> std::io::Result<u32> {
        Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
    };
    assert_eq!(mode(&wal_dir)?, 0o700);
    for name in FsStorage.list(&wal_dir)? {
        assert_eq!(mode(&wal_dir.join(&name))?, 0o600, "{name}");
    }
    Ok(())
}

/// A dangling symbolic link where the lock file goes is not followed: its target (outside
/// the directory) is not created, and the lock fails naming the link. A link to an existing
/// file, and a missing lock file, lock as before.
#[cfg(unix)]
#[test]
fn a_dangling_lock_link_creates_nothing_outside_the_directory() {
    use kairos_wal::storage::{FsStorage, Storage};
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("created-through-the-link");
    let lock = dir.path().join("LOCK");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let error = match FsStorage.lock(&lock) {
        Err(e) => e,
        Ok(_) => panic!("locked through a dangling link"),
    };
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert!(!target.exists(), "the link's target was created");
    // A link to a file that exists: the file is locked, as before.
    std::fs::write(&target, b"").unwrap();
    let held = FsStorage
        .lock(&lock)
        .expect("lock through a link to a file");
    assert_eq!(
        FsStorage.lock(&lock).err().map(|e| e.kind()),
        Some(std::io::ErrorKind::WouldBlock)
    );
    drop(held);
    // A missing lock file is created.
    let fresh = dir.path().join("wal-LOCK");
    let _held = FsStorage.lock(&fresh).expect("lock a new file");
    assert!(fresh.exists());
}
