//! Corruption matrix (etcd `repair_test.go`, fjall's corrupt-journal fixtures): damage a small
//! log at every position; each case must end as "opened, lost only the unsynced tail" or a
//! typed error — never a panic, never silent loss of synced records.

mod common;

use common::*;
use kairos_wal::{format, Durability, SimStorage, WalError, WalOptions};

/// A cleanly closed Sync log with two segments or more, and its file images.
fn closed_two_segments() -> Result<(SimStorage, u64), WalError> {
    let sim = SimStorage::new(80);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 4096))?;
    let n = 90;
    for i in 1..=n {
        append_one(&wal, i)?;
    }
    wal.close()?;
    Ok((sim, n))
}

#[test]
fn every_single_bit_flip_in_a_closed_log_or_its_meta_is_detected() -> TestResult {
    let (sim, n) = closed_two_segments()?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 2);
    let pristine = snapshot(&sim, dir());
    let mut errors = 0;
    let meta = dir().join("META");
    for seg in segs.iter().chain([&meta]) {
        let original = pristine.get(seg).ok_or("missing")?.clone();
        for offset in 0..original.len() {
            let mut bytes = original.clone();
            bytes[offset] ^= 1 << (offset % 8);
            sim.write_file(seg, &bytes);
            match kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {}) {
                Err(
                    WalError::Corrupt { .. }
                    | WalError::UnsupportedVersion { .. }
                    | WalError::MissingSegment { .. },
                ) => errors += 1,
                Err(other) => panic!("{} offset {offset}: unexpected {other}", seg.display()),
                Ok(report) => {
                    // Only the final CLOSE frame may be lost this way: no record is. Or a
                    // mark slot of the newest segment was hit, which cannot be told from a
                    // slot torn by a crash; it held no record, and the other slot stands.
                    assert_eq!(report.records, n, "{} offset {offset}", seg.display());
                    let newest_slot = Some(seg) == segs.last()
                        && (format::MARK_SLOTS_OFFSET..format::SEGMENT_FRAMES_OFFSET)
                            .contains(&offset);
                    assert!(
                        report.torn_tail.is_some() || newest_slot,
                        "{} offset {offset}",
                        seg.display()
                    );
                }
            }
            sim.write_file(seg, &original);
        }
    }
    assert!(errors > 0);
    assert_eq!(snapshot(&sim, dir()), pristine);
    Ok(())
}

#[test]
fn every_truncation_of_an_unsynced_tail_opens_with_a_prefix() -> TestResult {
    let sim = SimStorage::new(81);
    // Without proof before acknowledgement (nothing here is acknowledged as durable): with it,
    // the first segment is on record in SYNCED, and a cut into its header area is corruption.
    let buffered = WalOptions {
        proof_before_ack: false,
        ..options(Durability::Buffered, 1 << 20)
    };
    let (wal, _, _) = open(&sim, buffered)?;
    let n = 25;
    for i in 1..=n {
        append_one(&wal, i)?;
    }
    drop(wal);
    let seg = segments(&sim, dir())[0].clone();
    let original = sim.read_file(&seg).ok_or("no segment")?;
    // Without marks: opening a cut that reads as an unwritten segment would otherwise record
    // the replacement segment in SYNCED, and the next (outside) cut of it is then corruption.
    let reopen = WalOptions {
        synced_mark_delay: None,
        proof_before_ack: false,
        ..WalOptions::default()
    };
    for cut in (64..original.len()).rev() {
        sim.write_file(&seg, &original[..cut]);
        let (wal, report, replayed) = open(&sim, reopen.clone())?;
        let survivors = assert_prefix(&replayed, 0, n);
        let boundary = buffered_frame_offset(survivors + 1);
        assert_eq!(
            report.torn_tail.is_some(),
            cut as u64 != boundary,
            "cut at {cut}"
        );
        drop(wal);
        sim.write_file(&seg, &original);
    }
    Ok(())
}

#[test]
fn every_truncation_of_a_sealed_segment_is_corrupt() -> TestResult {
    let (sim, _) = closed_two_segments()?;
    let first = segments(&sim, dir())[0].clone();
    let original = sim.read_file(&first).ok_or("no segment")?;
    for cut in 0..original.len() {
        sim.write_file(&first, &original[..cut]);
        let result = open(&sim, WalOptions::default());
        assert!(
            matches!(&result, Err(WalError::Corrupt { file, .. }) if *file == first),
            "cut at {cut}: {:?}",
            result.map(|(_, r, _)| r)
        );
    }
    Ok(())
}

#[test]
fn zeroing_any_sector_of_a_sealed_segment_is_corrupt() -> TestResult {
    let (sim, _) = closed_two_segments()?;
    let first = segments(&sim, dir())[0].clone();
    let original = sim.read_file(&first).ok_or("no segment")?;
    for start in (0..original.len()).step_by(512) {
        let mut bytes = original.clone();
        let end = (start + 512).min(bytes.len());
        bytes[start..end].fill(0);
        if bytes == original {
            // Already zeros (a reserved field at the end of the SEAL frame, depending on
            // where the writer's MARK frames put it): nothing was damaged.
            continue;
        }
        sim.write_file(&first, &bytes);
        let result = open(&sim, WalOptions::default());
        assert!(
            matches!(&result, Err(WalError::Corrupt { file, .. }) if *file == first),
            "sector at {start}: {:?}",
            result.map(|(_, r, _)| r)
        );
    }
    Ok(())
}
