//! The corruption matrix through `kairos verify` (issue 5, item 5): the same images and the
//! same damage as `wal/tests/corruption_matrix.rs` (shared by path), through the checking code
//! of the command (`kairos::fuzzing::verify_log`, which runs `src/cli/verify.rs` itself) and,
//! for a handful of images, through the real binary. Each verdict must match the log's own
//! (`scan`): a directory the log opens verifies, with the same records and torn tail; one it
//! refuses fails naming the same file and offset. Never a panic.
//!
//! Memory is bounded: this test binary counts the largest single allocation of each case
//! (the allocation probe of the fuzz targets, compiled here by path) and holds it to
//! `kairos::fuzzing::allocation_bound` of the image's size — and a length field claiming
//! 4 GiB, in a frame, a record or a record body, allocates next to nothing.

#![cfg(feature = "cli")]

#[path = "../wal/tests/matrix_images/mod.rs"]
mod matrix_images;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod alloc_probe;

use std::path::Path;
use std::process::Command;

use alloc_probe::{largest_allocation_during, LargestAllocation};
use kairos::fuzzing::{allocation_bound, verify_log, VerifyOutcome};
use kairos_wal::format::{self, FrameHeader, FRAME_HEADER_BYTES, RECORD_HEADER_BYTES};
use matrix_images::*;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn scale() -> u64 {
    std::env::var("KAIROS_TEST_SCALE")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s >= 1)
        .unwrap_or(1)
}

fn images() -> Result<(Image, Image), kairos_wal::WalError> {
    Ok((closed_image(11, 110)?, crashed_image(12, 90, 110)?))
}

/// Verifies a case with the command's code, checking memory and agreement with the log.
fn verify_case(image: &Image, case: &Case) -> VerifyOutcome {
    let sim = Image::sim(&case.files);
    let size: usize = case.files.values().map(Vec::len).sum();
    let mut outcome = None;
    let largest = largest_allocation_during(|| {
        outcome = Some(verify_log(
            &sim,
            dir(),
            kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        ));
    });
    let outcome = outcome.unwrap_or_else(|| panic!("{case}: no outcome"));
    assert!(
        largest <= allocation_bound(size),
        "{case}: verify of {size} bytes made a {largest}-byte allocation"
    );
    let log = judge(image, case, scan_case(case, false));
    agree(case, &log, &outcome);
    outcome
}

/// The verdict of `kairos verify` must be the log's.
fn agree(case: &Case, log: &Outcome, verify: &VerifyOutcome) {
    match log {
        Outcome::Opened { survivors, torn } => {
            assert!(
                verify.ok,
                "{case}: the log opens but verify fails: {verify:?}"
            );
            assert_eq!(verify.records, *survivors, "{case}");
            assert_eq!(verify.bad_records, 0, "{case}");
            let torn = torn
                .as_ref()
                .map(|t| (t.file.clone(), t.offset, t.first_lost_lsn.0));
            assert_eq!(verify.torn_tail, torn, "{case}");
        }
        Outcome::Refused { file, offset, .. } => {
            assert!(!verify.ok, "{case}: the log is refused but verify passes");
            assert_eq!(
                verify.failure_file.as_ref(),
                Some(file),
                "{case}: {verify:?}"
            );
            assert_eq!(verify.failure_offset, *offset, "{case}: {verify:?}");
        }
    }
}

#[test]
fn every_bit_flip_verifies_as_the_log_reads_it() -> TestResult {
    let (closed, crashed) = images()?;
    // Each bit position at every offset at scale 2 and up; in CI two positions per offset
    // (the WAL matrix flips all eight through the log itself).
    let bits: &[u8] = if scale() >= 2 {
        &[0, 1, 2, 3, 4, 5, 6, 7]
    } else {
        &[0, 7]
    };
    for image in [&closed, &crashed] {
        let mut failed = 0;
        for_each_bit_flip(image, bits, |case| {
            failed += u64::from(!verify_case(image, &case).ok);
        });
        assert!(failed > 0);
    }
    Ok(())
}

#[test]
fn every_cut_and_zeroed_sector_verifies_as_the_log_reads_it() -> TestResult {
    let (closed, crashed) = images()?;
    // The crashed log again, acknowledged without proof: with its idle high-water mark
    // (SYNCED), cuts into synced records are damage to `verify` too; without, the opt-out's
    // documented limit reads the same to `verify` as to the log.
    let marked = crashed_marked_image(14, 90, 110)?;
    let unproven = crashed_unproven_image(15, 90, 110)?;
    for image in [&closed, &crashed, &marked, &unproven] {
        for_each_truncation(image, |case| {
            verify_case(image, &case);
        });
        for_each_zeroed_sector(image, |case| {
            verify_case(image, &case);
        });
    }
    Ok(())
}

#[test]
fn segment_damage_verifies_as_the_log_reads_it() -> TestResult {
    let (closed, crashed) = images()?;
    let marked = crashed_marked_image(14, 90, 110)?;
    let unproven = crashed_unproven_image(15, 90, 110)?;
    let foreign = closed_image(13, 110)?;
    for image in [&closed, &crashed, &marked, &unproven] {
        for (case, expected) in segment_cases(image, &foreign) {
            let outcome = verify_case(image, &case);
            let log = judge(image, &case, scan_case(&case, false));
            expect(&case, expected, &log, image);
            assert_eq!(outcome.ok, matches!(log, Outcome::Opened { .. }), "{case}");
        }
    }
    Ok(())
}

/// The file, inside a segment of `image`, of the DATA frame holding LSN `lsn`, and its offset.
fn frame_of(image: &Image, lsn: u64) -> FrameSpan {
    frames(image)
        .into_iter()
        .find(|f| f.records > 0 && (f.first..f.first + f.records).contains(&lsn))
        .unwrap_or_else(|| panic!("no frame holds LSN {lsn}"))
}

/// Rewrites the CRC of the frame at `offset` of `bytes` so that it checks again.
fn fix_frame_crc(bytes: &mut [u8], offset: usize) {
    let header = FrameHeader::parse(&bytes[offset..]);
    let end = offset + FRAME_HEADER_BYTES + header.body_bytes as usize;
    let (head, body) = bytes[offset..end].split_at(FRAME_HEADER_BYTES);
    let crc = format::frame_crc(head, body);
    bytes[offset + format::FRAME_CRC_OFFSET..offset + format::FRAME_CRC_OFFSET + 4]
        .copy_from_slice(&crc.to_le_bytes());
}

/// Offset in `bytes` of the body of record `index` of the DATA frame at `at`.
fn record_body_offset(bytes: &[u8], at: usize, index: u64) -> usize {
    let mut record = at + FRAME_HEADER_BYTES;
    for _ in 0..index {
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[record + 1..record + 5]);
        record += RECORD_HEADER_BYTES + u32::from_le_bytes(len) as usize;
    }
    record + RECORD_HEADER_BYTES
}

/// A case made by `edit` on the bytes of the segment holding LSN `lsn`, given the frame.
fn edited(image: &Image, lsn: u64, name: &str, edit: impl FnOnce(&mut Vec<u8>, usize)) -> Case {
    let frame = frame_of(image, lsn);
    let mut files = image.files.clone();
    if let Some(bytes) = files.get_mut(&frame.file) {
        edit(bytes, frame.offset as usize);
    }
    Case {
        name: format!("{}: {name}", image.name),
        files,
        damage: Some((frame.file.clone(), frame.end)),
        must_keep: image.synced,
        known_limit: false,
    }
}

#[test]
fn four_gib_length_fields_allocate_nothing() -> TestResult {
    let (closed, crashed) = images()?;
    let last = crashed.records.len() as u64;
    let schedule_lsn = (1..=last)
        .rev()
        .find(|&l| crashed.records[l as usize - 1].1 == 1)
        .unwrap_or(1);
    let cases = [
        // An unsynced frame of the newest segment claims 4 GiB: a torn tail.
        edited(&crashed, last, "frame length 4 GiB (unsynced)", |b, at| {
            b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }),
        // A frame of a sealed segment claims 4 GiB: corruption.
        edited(&closed, 2, "frame length 4 GiB (sealed)", |b, at| {
            b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }),
        // A frame whose checksum is valid holds a record claiming 4 GiB: corruption.
        edited(
            &crashed,
            3,
            "record length 4 GiB (checksum valid)",
            |b, at| {
                let record = at + FRAME_HEADER_BYTES + 1;
                b[record..record + 4].copy_from_slice(&u32::MAX.to_le_bytes());
                fix_frame_crc(b, at);
            },
        ),
        // A valid frame holds a schedule record whose payload claims 4 GiB: a bad record.
        edited(
            &crashed,
            schedule_lsn,
            "payload length 4 GiB (record valid)",
            |b, at| {
                let frame = frame_of(&crashed, schedule_lsn);
                let body = record_body_offset(b, at, schedule_lsn - frame.first);
                // SCHEDULE: payload_len (u32) at offset 18 of the body.
                b[body + 18..body + 22].copy_from_slice(&u32::MAX.to_le_bytes());
                fix_frame_crc(b, at);
            },
        ),
    ];
    for case in &cases {
        let sim = Image::sim(&case.files);
        let mut outcome = None;
        let mut scanned = None;
        let largest = largest_allocation_during(|| {
            scanned = Some(kairos_wal::scan(&sim, dir(), u32::MAX, &mut |_| {}).is_ok());
            outcome = Some(verify_log(&sim, dir(), u32::MAX));
        });
        let outcome = outcome.ok_or("no outcome")?;
        assert!(largest < 64 * 1024, "{case}: a {largest}-byte allocation");
        eprintln!(
            "{case}: largest allocation {largest} bytes; {:?}",
            outcome.failure_message
        );
        if case.name.contains("unsynced") {
            assert!(
                outcome.ok && outcome.torn_tail.is_some(),
                "{case}: {outcome:?}"
            );
        } else if case.name.contains("payload") {
            assert_eq!(scanned, Some(true));
            assert!(
                !outcome.ok && outcome.bad_records >= 1,
                "{case}: {outcome:?}"
            );
            assert!(
                outcome.json.contains("payload 4294967295"),
                "{case}: {outcome:?}"
            );
        } else {
            let (file, at) = case.damage.clone().ok_or("no damage")?;
            assert!(!outcome.ok, "{case}");
            assert_eq!(outcome.failure_file, Some(file), "{case}");
            assert!(outcome.failure_offset.is_some_and(|o| o <= at), "{case}");
        }
    }
    Ok(())
}

/// Writes a case under `root/wal/` on the real file system.
fn write_real(case: &Case, root: &Path) -> Result<(), std::io::Error> {
    let wal = root.join("wal");
    std::fs::create_dir_all(&wal)?;
    for (path, bytes) in &case.files {
        if let Some(name) = path.file_name() {
            std::fs::write(wal.join(name), bytes)?;
        }
    }
    Ok(())
}

#[test]
fn the_binary_gives_the_same_verdicts() -> TestResult {
    let (closed, crashed) = images()?;
    let foreign = closed_image(13, 110)?;
    let mut cases = vec![
        Case {
            name: "closed: intact".into(),
            files: closed.files.clone(),
            damage: None,
            must_keep: closed.synced,
            known_limit: false,
        },
        edited(&crashed, 110, "frame length 4 GiB (unsynced)", |b, at| {
            b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }),
        edited(&closed, 5, "frame length 4 GiB (sealed)", |b, at| {
            b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }),
    ];
    let flip_once = |image: &Image, at: u64| {
        let mut chosen = None;
        for_each_bit_flip(image, &[3], |case| {
            if chosen.is_none()
                && case
                    .damage
                    .as_ref()
                    .is_some_and(|(f, o)| *o == at && f.to_string_lossy().ends_with(".seg"))
            {
                chosen = Some(case);
            }
        });
        chosen
    };
    cases.extend(flip_once(&closed, 200));
    cases.extend(flip_once(&crashed, 100));
    for (case, _) in segment_cases(&crashed, &foreign).into_iter().take(3) {
        cases.push(case);
    }
    let image_of = |case: &Case| {
        if case.name.starts_with("closed") {
            &closed
        } else {
            &crashed
        }
    };
    for case in &cases {
        let image = image_of(case);
        let library = verify_case(image, case);
        let tmp = tempfile::tempdir()?;
        write_real(case, tmp.path())?;
        let out = Command::new(env!("CARGO_BIN_EXE_kairos"))
            .args(["verify", "--json"])
            .arg(tmp.path())
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report: serde_json::Value = serde_json::from_str(&stdout)
            .map_err(|e| format!("{case}: not JSON ({e}): {stdout}"))?;
        assert_eq!(out.status.success(), library.ok, "{case}: {stdout}");
        assert_eq!(report["ok"].as_bool(), Some(library.ok), "{case}");
        assert_eq!(report["records"].as_u64(), Some(library.records), "{case}");
        // Each log starts at LSN 1: the last LSN read (before any damage) is the count.
        assert_eq!(report["last_lsn"].as_u64(), Some(library.records), "{case}");
        let name = |p: Option<&str>| p.and_then(|p| Path::new(p).file_name().map(|n| n.to_owned()));
        assert_eq!(
            name(report["error"]["file"].as_str()),
            library
                .failure_file
                .as_deref()
                .and_then(|p| p.file_name().map(|n| n.to_owned())),
            "{case}: {stdout}"
        );
        assert_eq!(
            report["error"]["offset"].as_u64(),
            library.failure_offset,
            "{case}"
        );
        assert_eq!(
            report["torn_tail"]["offset"].as_u64(),
            library.torn_tail.as_ref().map(|t| t.1),
            "{case}"
        );
    }
    Ok(())
}
