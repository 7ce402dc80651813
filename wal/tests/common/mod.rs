//! Helpers shared by the integration tests: each case should read as a few lines of data.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kairos_wal::format::{
    self, FrameKind, MarkSlot, SegmentHeader, FRAME_HEADER_BYTES, MARK_SLOTS_OFFSET,
    MARK_SLOT_BYTES, RECORD_HEADER_BYTES, SEGMENT_FRAMES_OFFSET, SEGMENT_SUFFIX,
};
use kairos_wal::{
    Durability, Record, RecoveryReport, SimStorage, Storage, Wal, WalError, WalOptions,
};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The log directory used on SimStorage.
pub const DIR: &str = "/data/wal";

pub fn dir() -> &'static Path {
    Path::new(DIR)
}

/// A replayed record: (lsn, type, body).
pub type Replayed = Vec<(u64, u8, Vec<u8>)>;

pub fn options(durability: Durability, segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        durability,
        ..WalOptions::default()
    }
}

/// Opens the log on `storage` at `dir`, collecting every replayed record.
pub fn open_at(
    storage: Arc<dyn Storage>,
    dir: &Path,
    options: WalOptions,
) -> Result<(Wal, RecoveryReport, Replayed), WalError> {
    let mut replayed = Vec::new();
    let (wal, report) = Wal::open(storage, dir, options, &mut |r| {
        replayed.push((r.lsn.0, r.record_type, r.body.to_vec()));
        Ok(())
    })?;
    Ok((wal, report, replayed))
}

/// Opens the log on a [`SimStorage::process`] view of `sim`: after a power cut or crash, the
/// old log's threads can touch nothing (a writer mid-roll cannot finish the roll in the new
/// image, as no real process outlives a power cut).
pub fn open(
    sim: &SimStorage,
    options: WalOptions,
) -> Result<(Wal, RecoveryReport, Replayed), WalError> {
    open_at(Arc::new(sim.process()), dir(), options)
}

/// The deterministic body of record number `i` (varying lengths, 0..=70 bytes).
pub fn body(i: u64) -> Vec<u8> {
    let len = (i * 7 % 71) as usize;
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

/// The record type of record number `i`.
pub fn record_type(i: u64) -> u8 {
    (i % 0xEF) as u8 + 1
}

/// Appends record `i` alone and waits for it.
pub fn append_one(wal: &Wal, i: u64) -> Result<u64, WalError> {
    append_body(wal, i, &body(i))
}

/// Appends one record `i` (its type [`record_type`]) with body `b` and waits for it; its LSN.
pub fn append_body(wal: &Wal, i: u64, b: &[u8]) -> Result<u64, WalError> {
    let ticket = wal.append(&[Record {
        record_type: record_type(i),
        body: b,
    }])?;
    let lsn = ticket.last_lsn().0;
    ticket.wait()?;
    Ok(lsn)
}

/// What replaying records 1..=n appended with `append_one(wal, lsn)` must give.
pub fn expected(n: u64) -> Replayed {
    (1..=n).map(|i| (i, record_type(i), body(i))).collect()
}

/// Size of a DATA frame with one record of `body_len` bytes.
pub fn data_frame_bytes(body_len: usize) -> u64 {
    (FRAME_HEADER_BYTES + RECORD_HEADER_BYTES + body_len) as u64
}

/// Offset of the frame of record `i` in the first segment of a log written only by
/// `append_one(wal, 1..)` without syncs (Buffered mode, no MARK frames).
pub fn buffered_frame_offset(i: u64) -> u64 {
    SEGMENT_FRAMES_OFFSET as u64 + (1..i).map(|k| data_frame_bytes(body(k).len())).sum::<u64>()
}

/// Segment files of the log, oldest first.
pub fn segments(storage: &dyn Storage, dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<String> = storage
        .list(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.ends_with(SEGMENT_SUFFIX))
        .collect();
    names.sort();
    names.into_iter().map(|n| dir.join(n)).collect()
}

/// Every file of a SimStorage directory with its bytes.
pub fn snapshot(sim: &SimStorage, dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    sim.list(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| {
            let path = dir.join(n);
            sim.read_file(&path).map(|bytes| (path, bytes))
        })
        .collect()
}

/// Flips bit `bit` of byte `offset` of a SimStorage file (durably).
pub fn flip_bit(sim: &SimStorage, path: &Path, offset: u64, bit: u8) {
    let mut bytes = sim.read_file(path).unwrap_or_default();
    bytes[offset as usize] ^= 1 << bit;
    sim.write_file(path, &bytes);
}

/// Checks that `replayed` is exactly records 1..=n as appended by `append_one`.
pub fn assert_prefix(replayed: &Replayed, at_least: u64, at_most: u64) -> u64 {
    let n = replayed.len() as u64;
    assert!(
        (at_least..=at_most).contains(&n),
        "{n} records survived, expected {at_least}..={at_most}"
    );
    assert_eq!(
        replayed,
        &expected(n),
        "survivors are not the appended prefix"
    );
    n
}

/// A log of records 1..=n in 4 KiB segments, written in `durability` mode and closed cleanly.
pub fn closed_log(seed: u64, n: u64, durability: Durability) -> Result<SimStorage, WalError> {
    let sim = SimStorage::new(seed);
    let (wal, _, _) = open(&sim, options(durability, 4096))?;
    for i in 1..=n {
        append_one(&wal, i)?;
    }
    wal.close()?;
    Ok(sim)
}

/// The two mark slots of a version-2 segment image.
pub fn slots_of(bytes: &[u8]) -> [MarkSlot; 2] {
    core::array::from_fn(|i| {
        let at = MARK_SLOTS_OFFSET + i * MARK_SLOT_BYTES;
        MarkSlot::decode(&bytes[at..at + MARK_SLOT_BYTES])
    })
}

/// The highest LSN the mark slots of a version-2 segment image record (0 if none).
pub fn slots_mark(bytes: &[u8]) -> u64 {
    kairos_wal::format::slots_mark(&slots_of(bytes))
}

/// Offsets of the DATA frames of a version-2 segment image, with the first LSN of each.
pub fn data_frames(bytes: &[u8]) -> Vec<(usize, u64)> {
    data_frames_from(bytes, SEGMENT_FRAMES_OFFSET)
}

/// [`data_frames`] of a segment whose frames start at `at` (64 in a version-1 segment).
pub fn data_frames_from(bytes: &[u8], mut at: usize) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        let header = format::FrameHeader::parse(&bytes[at..]);
        if header.kind == FrameKind::Data as u8 {
            out.push((at, header.first_lsn));
        }
        at += FRAME_HEADER_BYTES + header.body_bytes as usize;
    }
    out
}

/// A segment image up to the end of its last frame: without the zeros a `Sync` writer keeps
/// written ahead of its frames (frames walked by their length fields from the first, stopping
/// at a header that does not check or does not fit).
pub fn frames_end(bytes: &[u8]) -> usize {
    let mut at = SEGMENT_FRAMES_OFFSET;
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        let header = format::FrameHeader::parse(&bytes[at..]);
        let end = at + FRAME_HEADER_BYTES + header.body_bytes as usize;
        if header.check_fields().is_err() || end > bytes.len() {
            break;
        }
        at = end;
    }
    at.min(bytes.len())
}

/// A version-1 segment (no slots) of store `store_id`, seq 1, holding one DATA frame per
/// record, each synced on its own (`synced_lsn` = the LSN before it).
pub fn version_1_segment(store_id: [u8; 16], records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut segment = SegmentHeader {
        format_version: 1,
        store_id,
        seq: 1,
        prev_last_lsn: 0,
        created_ms: 0,
    }
    .encode()
    .to_vec();
    for (lsn, (record_type, body)) in (1u64..).zip(records) {
        let mut frame_body = Vec::new();
        format::encode_record(&mut frame_body, *record_type, body);
        segment.extend(format::encode_frame(
            FrameKind::Data,
            1,
            lsn,
            lsn - 1,
            &frame_body,
        ));
    }
    segment
}

/// Cuts the segment `newest` (whose intact bytes are `bytes`) at the start of, and 20 bytes
/// into, each DATA frame of `frames`, and asserts that each cut is refused as corruption at
/// that frame, named by the mark slot that proves it, with no file changed by the refused
/// open. Leaves the last cut in place.
pub fn assert_frame_cuts_refused(
    sim: &SimStorage,
    newest: &Path,
    bytes: &[u8],
    frames: &[(usize, u64)],
    options: &WalOptions,
) {
    for &(offset, lsn) in frames {
        for cut in [offset, offset + 20] {
            sim.write_file(newest, &bytes[..cut]);
            let before = snapshot(sim, dir());
            match open(sim, options.clone()) {
                Err(WalError::Corrupt {
                    file,
                    reason,
                    offset: at,
                }) => {
                    assert_eq!(file, newest);
                    assert!(reason.contains("mark slot"), "cut {cut}: {reason}");
                    assert_eq!(at, offset as u64, "cut {cut} (LSN {lsn})");
                }
                other => panic!("cut at {cut} (LSN {lsn}) was not refused: {other:?}"),
            }
            assert_eq!(snapshot(sim, dir()), before, "open wrote after refusing");
        }
    }
}

/// The failures a hook set by `Wal::on_background_failure` was told of: the name of the
/// thread that told it, and the error's text.
pub type Reports = Arc<std::sync::Mutex<Vec<(Option<String>, String)>>>;

/// Sets a hook on `wal` that records each failure it is told of.
pub fn hook_into(wal: &Wal) -> Reports {
    let reports: Reports = Arc::default();
    let sink = Arc::clone(&reports);
    wal.on_background_failure(move |error| {
        let thread = std::thread::current().name().map(str::to_owned);
        if let Ok(mut reports) = sink.lock() {
            reports.push((thread, error.to_string()));
        }
    });
    reports
}

/// What the hook of [`hook_into`] was told so far.
pub fn reports_of(reports: &Reports) -> Vec<(Option<String>, String)> {
    reports.lock().map(|r| r.clone()).unwrap_or_default()
}
