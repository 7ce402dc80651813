//! Replays the committed fuzz corpus on stable Rust: every file under `fuzz/corpus/<target>/`
//! (and `fuzz/artifacts/<target>/`, where crash inputs land, if any are committed) goes
//! through the target's body in `kairos::fuzzing` — the code `cargo fuzz run` runs — with
//! the same allocation bound as the fuzz targets (their allocation probe is compiled here by
//! path). A finding of the fuzzer, once fixed, stays fixed: its input is committed to the
//! corpus and named below as a regression test.
//!
//! The seed corpus is written by the real writer: `write_seed_corpus` (ignored; run it with
//! `cargo test --test fuzz_corpus -- --ignored write_seed_corpus`) rebuilds the `seed-*`
//! files from the images of the corruption matrix.

#[path = "../wal/tests/matrix_images/mod.rs"]
mod matrix_images;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod alloc_probe;

use std::path::{Path, PathBuf};

use alloc_probe::{run_bounded, LargestAllocation};
use kairos::fuzzing;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Every input committed for `target`, sorted by path.
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for kind in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else {
            continue;
        };
        files.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file()),
        );
    }
    files.sort();
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= 3,
        "fuzz/corpus/{target}/ holds {} inputs: the seed corpus is missing",
        files.len()
    );
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        eprintln!("{target}: {}", file.display());
        run_bounded(target, &data, body);
    }
}

#[test]
fn wal_segment_corpus() {
    replay("wal_segment", fuzzing::wal_segment);
}

#[test]
fn record_body_corpus() {
    replay("record_body", fuzzing::record_body);
}

#[cfg(feature = "cli")]
#[test]
fn verify_dir_corpus() {
    replay("verify_dir", fuzzing::verify_dir);
}

#[test]
fn arbitrary_small_inputs_never_fail() {
    // A cheap sweep on stable Rust: every 1- and 2-byte input and a few structured ones.
    let mut inputs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    inputs.extend((0..=255u8).flat_map(|a| [vec![a, 0], vec![a, 1], vec![a, 0xFF]]));
    inputs.push(Vec::new());
    for data in &inputs {
        run_bounded("wal_segment", data, fuzzing::wal_segment);
        run_bounded("record_body", data, fuzzing::record_body);
        #[cfg(feature = "cli")]
        run_bounded("verify_dir", data, fuzzing::verify_dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: inputs that once failed a target, committed under `fuzz/corpus/<target>/` by
// `write_seed_corpus` (as `regression-*`) and named here.

/// A `wal_segment` input: one segment, seq `seq` and first LSN `prev_last + 1` (TRIM names
/// it), holding one record, then a SEAL if `sealed`.
fn single_segment_input(seq: u64, prev_last: u64, sealed: bool) -> Vec<u8> {
    use kairos::fuzzing::{segment_flags, SegmentImage};
    use kairos_wal::format::{encode_frame, encode_record, FrameKind, SegmentHeader};
    let mut segment = SegmentHeader {
        store_id: [7; 16],
        seq,
        prev_last_lsn: prev_last,
        created_ms: 0,
    }
    .encode()
    .to_vec();
    let first = prev_last.wrapping_add(1);
    let mut body = Vec::new();
    encode_record(&mut body, 1, b"x");
    segment.extend(encode_frame(FrameKind::Data, 1, first, first - 1, &body));
    if sealed {
        segment.extend(encode_frame(FrameKind::Seal, 0, first + 1, first, &[]));
    }
    SegmentImage {
        flags: segment_flags::TRIM,
        record_limit: 0,
        trim: Some((seq, first)),
        closed: None,
        segments: vec![segment],
    }
    .encode()
}

fn regression(target: &str, name: &str, input: &[u8], body: fn(&[u8])) {
    let path = fuzz_dir().join("corpus").join(target).join(name);
    let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        committed,
        input,
        "{} is not the regression input",
        path.display()
    );
    run_bounded(target, input, body);
}

/// `wal_segment` found that `scan` (and so `kairos verify`) accepted a log whose newest
/// segment is sealed with seq u64::MAX while `Wal::open` refused it: open must roll past
/// it and cannot. Fixed in `wal/src/recovery.rs` (the shared analysis refuses it, so scan
/// and open agree) and `wal/src/wal.rs` (the writer checks the next seq before sealing).
#[test]
fn regression_wal_segment_sealed_segment_with_the_last_seq() {
    let input = single_segment_input(u64::MAX, 0, true);
    regression(
        "wal_segment",
        "regression-sealed-seq-max",
        &input,
        fuzzing::wal_segment,
    );
}

/// A `verify_dir` input: the directory the real writer leaves for one SCHEDULE of task id
/// `id` (written `Buffered`, then closed: no MARK races, so the bytes are reproducible).
fn one_schedule_dir_input(id: u64) -> Vec<u8> {
    use kairos::fuzzing::{file_kinds, DirImage, LOG_DIR};
    use kairos_wal::{Durability, Record, SimStorage, Storage, Wal, WalOptions};
    let mut body = Vec::new();
    body.extend_from_slice(&id.to_le_bytes());
    body.extend_from_slice(&1_700_000_000_000u64.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(b"kp");
    let sim = SimStorage::new(41);
    let dir = Path::new(LOG_DIR);
    let options = WalOptions {
        durability: Durability::Buffered,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open(std::sync::Arc::new(sim.clone()), dir, options, &mut |_| {
        Ok(())
    })
    .expect("open");
    let record = Record {
        record_type: 1,
        body: &body,
    };
    wal.append(&[record])
        .and_then(|ticket| ticket.wait())
        .expect("append");
    wal.close().expect("close");
    let files: Vec<(u8, Vec<u8>)> = sim
        .list(dir)
        .expect("list")
        .into_iter()
        .map(|name| {
            let kind = match name.as_str() {
                "META" => file_kinds::META,
                "CLOSED" => file_kinds::CLOSED,
                _ => file_kinds::SEGMENT,
            };
            (kind, sim.read_file(&dir.join(name)).expect("file"))
        })
        .collect();
    let list: Vec<(u8, &[u8])> = files.iter().map(|(k, b)| (*k, b.as_slice())).collect();
    DirImage::encode(0, 0, &list)
}

/// `verify_dir` (with its oracle "what verify passes, the engine opens") found that a
/// SCHEDULE of task id u64::MAX passed `kairos verify` while `Engine::open` panicked
/// computing the next id (`max_id + 1`; a release build wraps to id 0 and the directory
/// fails replay at the next open). Fixed in `Record::decode` (`src/record.rs`): such a
/// body does not decode, so verify reports a bad record and open a replay error.
#[cfg(feature = "cli")]
#[test]
fn regression_verify_dir_schedule_with_the_last_task_id() {
    let input = one_schedule_dir_input(u64::MAX);
    regression(
        "verify_dir",
        "regression-schedule-id-max",
        &input,
        fuzzing::verify_dir,
    );
    let mut body = u64::MAX.to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.push(b'k');
    assert!(kairos::record::Record::decode(1, &body).is_err());
    body[..8].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    assert!(kairos::record::Record::decode(1, &body).is_ok());
}

// ---------------------------------------------------------------------------------------------
// The seed corpus.

mod seeds {
    use super::matrix_images::*;
    use kairos::fuzzing::{file_kinds, segment_flags, DirImage, SegmentImage, SEGMENT_SEPARATOR};
    use kairos_wal::format::{self, Closed, Trim, FRAME_HEADER_BYTES, FRAME_RESERVED_OFFSET};
    use kairos_wal::{Durability, SimStorage, Wal, WalOptions};
    use std::path::Path;
    use std::sync::Arc;

    fn name(path: &Path) -> String {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// `image` as a `wal_segment` input (the segments, TRIM and CLOSED as the writer left them).
    pub fn segment_input(files: &Files, flags: u8) -> Vec<u8> {
        let mut flags = flags;
        let mut image = SegmentImage::default();
        if let Some(bytes) = files.get(&dir().join(format::TRIM_FILE_NAME)) {
            if let Ok(trim) = Trim::decode(bytes) {
                flags |= segment_flags::TRIM;
                image.trim = Some((trim.seq, trim.first_lsn.0));
            }
        }
        if let Some(bytes) = files.get(&dir().join(format::CLOSED_FILE_NAME)) {
            if let Ok(closed) = Closed::decode(bytes) {
                flags |= segment_flags::CLOSED;
                image.closed = Some((closed.seq, closed.last_lsn.0));
            }
        }
        image.flags = flags;
        image.segments = segments_of(files)
            .iter()
            .map(|p| files[p].clone())
            .collect();
        for segment in &image.segments {
            assert!(
                !segment
                    .windows(SEGMENT_SEPARATOR.len())
                    .any(|w| w == SEGMENT_SEPARATOR),
                "a segment contains the separator"
            );
        }
        let input = image.encode();
        assert_eq!(SegmentImage::decode(&input), image);
        input
    }

    /// `files` as a `verify_dir` input, each file with the kind that names it.
    pub fn dir_input(files: &Files, flags: u8, extra: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list: Vec<(u8, &[u8])> = Vec::new();
        for (path, bytes) in files {
            let kind = match name(path).as_str() {
                format::META_FILE_NAME => file_kinds::META,
                format::TRIM_FILE_NAME => file_kinds::TRIM,
                format::CLOSED_FILE_NAME => file_kinds::CLOSED,
                format::LOCK_FILE_NAME => file_kinds::LOCK,
                _ => file_kinds::SEGMENT,
            };
            list.push((kind, bytes));
        }
        list.extend_from_slice(extra);
        let input = DirImage::encode(flags, 0, &list);
        assert_eq!(DirImage::decode(&input).files.len(), list.len());
        input
    }

    /// A closed log whose oldest segments were removed: TRIM names the new oldest.
    pub fn trimmed_files() -> Files {
        let sim = SimStorage::new(21);
        let options = WalOptions {
            durability: Durability::Sync,
            segment_bytes: 4096,
            ..WalOptions::default()
        };
        let open = |sim: &SimStorage| {
            Wal::open(Arc::new(sim.clone()), dir(), options.clone(), &mut |_| {
                Ok(())
            })
            .map(|(wal, _)| wal)
        };
        let wal = open(&sim).expect("open");
        for i in 1..=150 {
            let (record_type, body) = kairos_record(i);
            let ticket = wal
                .append(&[kairos_wal::Record {
                    record_type,
                    body: &body,
                }])
                .expect("append");
            ticket.wait().expect("wait");
        }
        let removed = wal
            .remove_segments_before(kairos_wal::Lsn(100))
            .expect("remove");
        assert!(removed >= 1);
        wal.close().expect("close");
        files_of(&sim)
    }

    /// Damage helpers: each returns a modified copy.
    pub fn flip(files: &Files, path: &Path, offset: usize) -> Files {
        let mut files = files.clone();
        if let Some(b) = files.get_mut(path) {
            b[offset] ^= 0x10;
        }
        files
    }

    pub fn cut(files: &Files, path: &Path, len: usize) -> Files {
        let mut files = files.clone();
        if let Some(b) = files.get_mut(path) {
            b.truncate(len);
        }
        files
    }

    pub fn edit(files: &Files, path: &Path, f: impl FnOnce(&mut Vec<u8>)) -> Files {
        let mut files = files.clone();
        if let Some(b) = files.get_mut(path) {
            f(b);
        }
        files
    }

    pub fn frame_at(image: &Image, file: &Path, nth: usize) -> FrameSpan {
        frames(image)
            .into_iter()
            .filter(|f| f.file == file)
            .nth(nth)
            .expect("frame")
    }

    pub const RESERVED: usize = FRAME_RESERVED_OFFSET;
    pub const FRAME: usize = FRAME_HEADER_BYTES;
}

/// Rebuilds the seed corpus (`fuzz/corpus/<target>/seed-*`) from the real writer.
#[test]
#[ignore = "writes fuzz/corpus; run by hand after a format change"]
fn write_seed_corpus() -> Result<(), Box<dyn std::error::Error>> {
    use kairos::fuzzing::{file_kinds, segment_flags};
    use matrix_images::*;
    use seeds::*;

    let closed = closed_image(31, 110)?;
    let crashed = crashed_image(32, 90, 110)?;
    let trimmed = trimmed_files();
    let closed_segs = closed.segments();
    let crashed_segs = crashed.segments();
    let newest = crashed_segs[crashed_segs.len() - 1].clone();
    let last_frame = frames(&crashed)
        .into_iter()
        .rfind(|f| f.records > 0)
        .ok_or("no frame")?;
    let sealed_frame = frame_at(&closed, &closed_segs[0], 3);

    let mut segment_seeds: Vec<(&str, Vec<u8>)> = vec![
        ("closed", segment_input(&closed.files, 0)),
        ("crashed", segment_input(&crashed.files, 0)),
        ("trimmed", segment_input(&trimmed, 0)),
        (
            "torn-tail",
            segment_input(
                &cut(&crashed.files, &newest, last_frame.offset as usize + 40),
                0,
            ),
        ),
        (
            "sealed-bit-flip",
            segment_input(&flip(&closed.files, &closed_segs[0], 300), 0),
        ),
        (
            "length-4gib",
            segment_input(
                &edit(&crashed.files, &newest, |b| {
                    let at = last_frame.offset as usize;
                    b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
                }),
                0,
            ),
        ),
        (
            "zeroed-sector",
            segment_input(&edit(&crashed.files, &newest, |b| b[512..1024].fill(0)), 0),
        ),
        (
            // With checksums fixed: a frame whose CRC matches but whose reserved byte is set.
            "malformed-valid-crc",
            segment_input(
                &edit(&closed.files, &closed_segs[0], |b| {
                    b[sealed_frame.offset as usize + RESERVED] = 1;
                }),
                segment_flags::FIX_CHECKSUMS,
            ),
        ),
        (
            "unwritten-newest",
            segment_input(
                &cut(&crashed.files, &newest, 40),
                segment_flags::NAME_BY_POSITION,
            ),
        ),
        (
            "header-only",
            segment_input(&cut(&crashed.files, &crashed_segs[0], 64), 0),
        ),
    ];
    segment_seeds.push((
        "tmp-and-no-meta",
        segment_input(
            &crashed.files,
            segment_flags::TMP_FILE | segment_flags::NO_META,
        ),
    ));

    let bad_payload = {
        // A valid frame holding a SCHEDULE whose payload length claims 4 GiB.
        let frame = frame_at(&crashed, &crashed_segs[0], 0);
        edit(&crashed.files, &crashed_segs[0], |b| {
            let body = frame.offset as usize + FRAME + 5;
            b[body + 18..body + 22].copy_from_slice(&u32::MAX.to_le_bytes());
        })
    };
    let dir_seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "closed",
            dir_input(&closed.files, 0, &[(file_kinds::LOCK, b"")]),
        ),
        ("crashed", dir_input(&crashed.files, 0, &[])),
        ("trimmed", dir_input(&trimmed, 0, &[])),
        ("bad-payload-fixed-crc", dir_input(&bad_payload, 1, &[])),
        (
            "odd-names",
            dir_input(
                &crashed.files,
                0,
                &[
                    (file_kinds::TMP, b"leftover"),
                    (file_kinds::ARBITRARY, b"\x08abcdefghsomething"),
                    (file_kinds::SEGMENT_BY_POSITION, b"KAIROSWL"),
                ],
            ),
        ),
        (
            "sealed-cut",
            dir_input(&cut(&closed.files, &closed_segs[0], 1000), 0, &[]),
        ),
    ];

    let mut record_seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    for i in 1..=5 {
        let (record_type, body) = kairos_record(i);
        let name = ["schedule", "schedule-2", "deliver", "ack", "cancel"][i as usize - 1];
        record_seeds.push((name, [&[record_type][..], &body].concat()));
    }
    let id = 7u64.to_le_bytes();
    let time = 1_700_000_000_000u64.to_le_bytes();
    let with_error = |t: u8, error: &[u8]| {
        [
            &[t][..],
            &id,
            &time,
            &(error.len() as u16).to_le_bytes(),
            error,
        ]
        .concat()
    };
    record_seeds.push(("retry", with_error(5, b"timeout")));
    record_seeds.push(("dead", with_error(6, b"")));
    record_seeds.push(("purge", [&[7u8][..], &id].concat()));
    record_seeds.push(("release", [&[9u8][..], &id].concat()));
    record_seeds.push((
        "reschedule-payload",
        [&[8u8][..], &id, &time, &[1], &3u32.to_le_bytes(), b"new"].concat(),
    ));
    record_seeds.push((
        "reschedule-keep",
        [&[8u8][..], &id, &time, &[0], &0u32.to_le_bytes()].concat(),
    ));
    record_seeds.push((
        "schedule-lengths-4gib",
        [
            &[1u8][..],
            &id,
            &time,
            &u16::MAX.to_le_bytes(),
            &u32::MAX.to_le_bytes(),
        ]
        .concat(),
    ));
    record_seeds.push(("unknown-type", vec![0xEF, 1, 2, 3]));

    // Regressions and edges of the number spaces.
    segment_seeds.push((
        "regression-sealed-seq-max",
        single_segment_input(u64::MAX, 0, true),
    ));
    segment_seeds.push((
        "seed-lsn-near-max",
        single_segment_input(1, u64::MAX - 3, false),
    ));
    segment_seeds.push((
        "seed-lsn-exhausted",
        single_segment_input(1, u64::MAX - 2, false),
    ));

    let dir_seeds = [
        dir_seeds,
        vec![
            (
                "regression-schedule-id-max",
                one_schedule_dir_input(u64::MAX),
            ),
            ("seed-one-schedule", one_schedule_dir_input(1)),
        ],
    ]
    .concat();

    let mut total = 0;
    for (target, seeds) in [
        ("wal_segment", &segment_seeds),
        ("verify_dir", &dir_seeds),
        ("record_body", &record_seeds),
    ] {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds.iter() {
            let file = if name.starts_with("regression-") || name.starts_with("seed-") {
                (*name).to_owned()
            } else {
                format!("seed-{name}")
            };
            std::fs::write(dir.join(file), bytes)?;
            total += bytes.len();
        }
    }
    assert!(total < 200 * 1024, "seed corpus of {total} bytes");
    eprintln!("seed corpus: {total} bytes");
    Ok(())
}
