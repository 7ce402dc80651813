//! Bodies of the fuzz targets in `fuzz/` (cargo-fuzz layout, its own workspace).
//!
//! They live in the library, not in the fuzz crate, so that ordinary tests can call them:
//! `tests/fuzz_corpus.rs` replays every committed corpus file through them on stable Rust,
//! and the named regression tests call them on the inputs that once failed. A fuzz target
//! only wraps its body in the allocation probe (`fuzz/src/lib.rs`).
//!
//! Each body turns arbitrary bytes into something the code under test reads from disk, runs
//! it, and checks properties that hold for *every* input. A panic in a body is a finding:
//! either the code under test panicked (it must not, whatever the disk holds) or one of the
//! body's own `assert!`s — the oracle — failed. Allocation is bounded too, but measuring it
//! needs a global allocator (and this crate denies `unsafe` outside one prefetch hint), so the harnesses do it:
//! they count the largest single allocation while a body runs and compare it with
//! [`allocation_bound`].
//!
//! | target | input | checks |
//! |---|---|---|
//! | [`wal_segment`] | [`SegmentImage`]: segment files (and `META`, `TRIM`, `CLOSED`) of one log directory | `kairos_wal::scan` and `Wal::open` agree (records, torn tail, error with file and offset); an open log appends at the next LSN, closes and reopens with the same records |
//! | [`record_body`] | a record type byte and a body | `Record::decode` never panics; what decodes re-encodes to the same bytes |
//! | [`checkpoint_file`] | a flags byte (fix checksums) and a checkpoint file | `checkpoint::decode` never panics; what decodes survives re-encoding; `Replay::from_checkpoint` never panics |
//! | [`overflow_file`] | a flags byte (fix checksums) and an overflow file | `overflow::decode`, `read_due`, `read_entry` and `PieceReader` never panic and agree; what decodes re-encodes to the same bytes |
//! | `verify_dir` (with the `cli` feature) | [`DirImage`]: arbitrary files with plausible or arbitrary names in a data directory: its log (`wal/`) and, under a flag, checkpoints (`checkpoint/`) and overflow files (`overflow/`), checksums optionally fixed up | the checking code of `kairos verify` returns a report (never panics) that agrees with `scan` (file and offset of corruption, records, torn tail) when it can start from the checkpoint, and names the checkpoint's damage (reading no log) when it cannot; a directory it passes, the engine opens with the live tasks and dead letters it counted, shuts down, reopens with the same, and runs a day on (far tasks promoted, due tasks delivered and acked) without being poisoned |
//! | [`engine_model`](fn@engine_model) | [`EngineModelInput`]: a setup and a sequence of schedule, schedule_many, reschedule, cancel, cancel_many, advance, wall step, ack, ack_many, nack, extend_lease, requeue, purge, clean reopen, process crash and power cut operations | the engine on `SimStorage` with a `ManualClock` (`Sync`, tiny segments) answers, delivers (order, key, payload, due time, attempt, hand-out time), recovers, counts (levels and running totals) and dead-letters exactly as a reference model says |
//!
//! Not a stable API: hidden from the docs, changed whenever the targets change.

use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kairos_wal::format::{
    self, Closed, StoreId, Synced, Trim, FRAME_CRC_OFFSET, FRAME_HEADER_BYTES,
    SEGMENT_HEADER_BYTES, SEG_HEADER_CRC_OFFSET, SEG_PREV_LAST_LSN_OFFSET, SEG_SEQ_OFFSET,
    SEG_STORE_ID_OFFSET, SEG_VERSION_OFFSET,
};
use kairos_wal::{
    Durability, Lsn, RecordView, RecoveryReport, ScanReport, SimStorage, Wal, WalError, WalOptions,
};

use crate::record::Record;

/// The `kairos verify` command, compiled here from the very file the binary compiles
/// (`src/cli/verify.rs`), so the fuzz target and the tests run the checking code the command
/// runs (see `fuzzing/cli.rs`).
#[cfg(feature = "cli")]
mod cli;

pub mod engine_model;
pub use engine_model::{engine_model, EngineModelInput};

/// The simulated log directory every target writes its image into.
pub const LOG_DIR: &str = "/fuzz/wal";

/// Separates segment files in a [`SegmentImage`] input.
pub const SEGMENT_SEPARATOR: &[u8] = b"\xF5SEG";

/// Separates files in a [`DirImage`] input.
pub const FILE_SEPARATOR: &[u8] = b"\xF5FIL";

/// Most segment files one [`SegmentImage`] makes (the rest of the input joins the last one).
pub const SEGMENTS_MAX: usize = 6;

/// Most files one [`DirImage`] makes (the rest of the input joins the last one).
pub const FILES_MAX: usize = 12;

/// Fixed allowance of [`allocation_bound`], bytes: bookkeeping that does not grow with the
/// input (paths, reports, small tables, an engine's initial structures).
pub const ALLOCATION_SLACK_BYTES: usize = 256 * 1024;

/// The largest single allocation a body may make for an input of `input_len` bytes: twice
/// the input (a file's bytes are copied into the simulated disk, then read back in one
/// buffer) plus [`ALLOCATION_SLACK_BYTES`]. A length field claiming 4 GiB in a 1 KiB input
/// must not allocate 4 GiB — nor 1 GiB, nor the 1 MiB read chunk.
pub fn allocation_bound(input_len: usize) -> usize {
    input_len
        .saturating_mul(2)
        .saturating_add(ALLOCATION_SLACK_BYTES)
}

fn log_dir() -> &'static Path {
    Path::new(LOG_DIR)
}

/// Splits `data` at `separator`, into at most `max` pieces (the last one keeps the rest).
fn split_at_separator<'a>(data: &'a [u8], separator: &[u8], max: usize) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut rest = data;
    while pieces.len() + 1 < max {
        match rest.windows(separator.len()).position(|w| w == separator) {
            Some(at) => {
                pieces.push(&rest[..at]);
                rest = &rest[at + separator.len()..];
            }
            None => break,
        }
    }
    pieces.push(rest);
    pieces
}

fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    let field = bytes.get(offset..offset + 8)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(field);
    Some(u64::from_le_bytes(b))
}

/// The store id a segment's header claims (bytes 16..32), if the file is that long.
fn claimed_store_id(segment: &[u8]) -> Option<StoreId> {
    let field = segment.get(SEG_STORE_ID_OFFSET..SEG_STORE_ID_OFFSET + 16)?;
    let mut id = [0u8; 16];
    id.copy_from_slice(field);
    Some(id)
}

/// The file name a segment's own header asks for (`seq`, `prev_last_lsn + 1`), or `None` if
/// the file is too short to say.
fn name_from_header(segment: &[u8]) -> Option<String> {
    let seq = u64_at(segment, SEG_SEQ_OFFSET)?;
    let prev_last = u64_at(segment, SEG_PREV_LAST_LSN_OFFSET)?;
    Some(format::segment_file_name(
        seq,
        Lsn(prev_last.wrapping_add(1)),
    ))
}

/// Makes every checksum of a would-be segment valid: the header's, then each frame's, walking
/// frames by their length fields as long as they fit. Lets the fuzzer reach the rules that
/// only apply to frames whose checksum matches.
fn fix_segment_checksums(segment: &mut [u8]) {
    if segment.len() < SEGMENT_HEADER_BYTES {
        return;
    }
    let crc = crc32(&segment[..SEG_HEADER_CRC_OFFSET]);
    segment[SEG_HEADER_CRC_OFFSET..SEG_HEADER_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    let version =
        u16::from_le_bytes([segment[SEG_VERSION_OFFSET], segment[SEG_VERSION_OFFSET + 1]]);
    let mut position = SEGMENT_HEADER_BYTES;
    if version >= 2 {
        // A version-2 segment: the mark slots (those not all zero) get valid checksums too.
        if segment.len() < format::SEGMENT_FRAMES_OFFSET {
            return;
        }
        for index in 0..format::MARK_SLOT_COUNT {
            let at = format::MARK_SLOTS_OFFSET + index * format::MARK_SLOT_BYTES;
            let slot = &mut segment[at..at + format::MARK_SLOT_BYTES];
            if slot.iter().any(|&b| b != 0) {
                let crc = crc32(&slot[..format::SLOT_CRC_OFFSET]);
                slot[format::SLOT_CRC_OFFSET..format::SLOT_CRC_OFFSET + 4]
                    .copy_from_slice(&crc.to_le_bytes());
            }
        }
        position = format::SEGMENT_FRAMES_OFFSET;
    }
    while segment.len() - position >= FRAME_HEADER_BYTES {
        let mut len = [0u8; 4];
        len.copy_from_slice(&segment[position..position + 4]);
        let body_bytes = u32::from_le_bytes(len) as usize;
        let Some(end) = (position + FRAME_HEADER_BYTES)
            .checked_add(body_bytes)
            .filter(|end| *end <= segment.len())
        else {
            return;
        };
        let (head, body) = segment[position..end].split_at(FRAME_HEADER_BYTES);
        let crc = format::frame_crc(head, body);
        segment[position + FRAME_CRC_OFFSET..position + FRAME_CRC_OFFSET + 4]
            .copy_from_slice(&crc.to_le_bytes());
        position = end;
    }
}

/// Makes the checksum of a 32-byte `META` or 48-byte `TRIM`/`CLOSED` valid (the CRC is the
/// last four bytes, over everything before them); other sizes are left alone.
fn fix_small_file_checksum(bytes: &mut [u8]) {
    if bytes.len() == format::META_BYTES || bytes.len() == format::BOUND_FILE_BYTES {
        let at = bytes.len() - 4;
        let crc = crc32(&bytes[..at]);
        bytes[at..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// CRC-32 (IEEE 802.3, as `crc32fast::hash` computes it), bit by bit: the fuzz inputs are
/// small, and the library does not depend on `crc32fast` itself.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

// ---------------------------------------------------------------------------------------------
// wal_segment

/// Flags byte of a [`SegmentImage`] input.
pub mod segment_flags {
    /// Write no `META` (a directory whose identity file is missing).
    pub const NO_META: u8 = 0x01;
    /// Make every header and frame checksum valid before writing.
    pub const FIX_CHECKSUMS: u8 = 0x02;
    /// Write a valid `TRIM` with the `seq` and `lsn` that follow the two leading bytes.
    pub const TRIM: u8 = 0x04;
    /// Write a valid `CLOSED` with the `seq` and `lsn` that follow (after `TRIM`'s, if any).
    pub const CLOSED: u8 = 0x08;
    /// Leave a `*.tmp` file behind (open removes it; scan ignores it).
    pub const TMP_FILE: u8 = 0x10;
    /// Name segment `i` with `seq = i + 1` instead of the `seq` its header claims.
    pub const NAME_BY_POSITION: u8 = 0x20;
    /// Write a valid `SYNCED` with the `seq` and `lsn` that follow (after `CLOSED`'s, if any).
    pub const SYNCED: u8 = 0x40;
}

/// The decoded input of [`wal_segment`]: the files of one log directory.
///
/// Layout: a flags byte ([`segment_flags`]); a byte choosing `record_bytes_max` (0: the
/// default 16 MiB, `n`: `64 × n` bytes); `TRIM`'s, `CLOSED`'s then `SYNCED`'s `seq` and `lsn` (two
/// little-endian u64 each, only if their flag is set); then the segment files' contents,
/// separated by [`SEGMENT_SEPARATOR`]. Each segment is named after the `seq` and
/// `prev_last_lsn + 1` its own header claims (or after its position, see the flags), so a
/// segment produced by the real writer keeps its real name. `META` carries the store id the
/// first segment claims, so the real writer's segments belong to the directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentImage {
    /// [`segment_flags`].
    pub flags: u8,
    /// Selects `record_bytes_max` (0: default, `n`: `64 × n` bytes).
    pub record_limit: u8,
    /// `TRIM`'s `(seq, lsn)`, if written.
    pub trim: Option<(u64, u64)>,
    /// `CLOSED`'s `(seq, lsn)`, if written.
    pub closed: Option<(u64, u64)>,
    /// `SYNCED`'s `(seq, lsn)`, if written.
    pub synced: Option<(u64, u64)>,
    /// The segment files' bytes, oldest first.
    pub segments: Vec<Vec<u8>>,
}

impl SegmentImage {
    /// Decodes any bytes (never fails: missing fields read as zeros).
    pub fn decode(data: &[u8]) -> SegmentImage {
        let flags = data.first().copied().unwrap_or(0);
        let record_limit = data.get(1).copied().unwrap_or(0);
        let mut rest = data.get(2..).unwrap_or(&[]);
        let mut take_pair = || {
            let mut b = [0u8; 16];
            let n = rest.len().min(16);
            b[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            (u64_at(&b, 0).unwrap_or(0), u64_at(&b, 8).unwrap_or(0))
        };
        let trim = (flags & segment_flags::TRIM != 0).then(&mut take_pair);
        let closed = (flags & segment_flags::CLOSED != 0).then(&mut take_pair);
        let synced = (flags & segment_flags::SYNCED != 0).then(&mut take_pair);
        let segments = split_at_separator(rest, SEGMENT_SEPARATOR, SEGMENTS_MAX)
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        SegmentImage {
            flags,
            record_limit,
            trim,
            closed,
            synced,
            segments,
        }
    }

    /// The input that decodes to this image (for writing seed corpora). `trim`, `closed` and
    /// `synced` must agree with the flags, and no segment may contain [`SEGMENT_SEPARATOR`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.flags, self.record_limit];
        for (seq, lsn) in self
            .trim
            .iter()
            .chain(self.closed.iter())
            .chain(self.synced.iter())
        {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&lsn.to_le_bytes());
        }
        for (i, segment) in self.segments.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(SEGMENT_SEPARATOR);
            }
            out.extend_from_slice(segment);
        }
        out
    }

    /// The `record_bytes_max` the log is read with.
    pub fn record_bytes_max(&self) -> u32 {
        match self.record_limit {
            0 => kairos_wal::RECORD_BYTES_MAX_DEFAULT,
            n => u32::from(n) * 64,
        }
    }

    /// Writes the image into `sim` under [`LOG_DIR`].
    pub fn write_to(&self, sim: &SimStorage) {
        let dir = log_dir();
        let fix = self.flags & segment_flags::FIX_CHECKSUMS != 0;
        let store_id = self
            .segments
            .first()
            .and_then(|s| claimed_store_id(s))
            .unwrap_or([0x5A; 16]);
        if self.flags & segment_flags::NO_META == 0 {
            sim.write_file(
                &dir.join(format::META_FILE_NAME),
                &format::encode_meta(&store_id),
            );
        }
        if let Some((seq, lsn)) = self.trim {
            let trim = Trim {
                store_id,
                seq,
                first_lsn: Lsn(lsn),
            };
            sim.write_file(&dir.join(format::TRIM_FILE_NAME), &trim.encode());
        }
        if let Some((seq, lsn)) = self.closed {
            let closed = Closed {
                store_id,
                seq,
                last_lsn: Lsn(lsn),
            };
            sim.write_file(&dir.join(format::CLOSED_FILE_NAME), &closed.encode());
        }
        if let Some((seq, lsn)) = self.synced {
            let synced = Synced {
                store_id,
                seq,
                synced_lsn: Lsn(lsn),
            };
            sim.write_file(&dir.join(format::SYNCED_FILE_NAME), &synced.encode());
        }
        if self.flags & segment_flags::TMP_FILE != 0 {
            sim.write_file(
                &dir.join("0000000000000009-0000000000000001.seg.tmp"),
                b"tmp",
            );
        }
        for (i, segment) in self.segments.iter().enumerate() {
            let mut bytes = segment.clone();
            if fix {
                fix_segment_checksums(&mut bytes);
            }
            let position = i as u64 + 1;
            let name = match name_from_header(&bytes) {
                Some(name) if self.flags & segment_flags::NAME_BY_POSITION == 0 => name,
                _ => {
                    let first =
                        u64_at(&bytes, SEG_PREV_LAST_LSN_OFFSET).map_or(1, |p| p.wrapping_add(1));
                    format::segment_file_name(position, Lsn(first))
                }
            };
            sim.write_file(&dir.join(name), &bytes);
        }
    }
}

/// Order-sensitive digest of a record sequence, to compare two readers without keeping the
/// records (so the harness allocates nothing per record). Also checks LSNs are dense.
#[derive(Clone)]
struct Digest {
    hasher: DefaultHasher,
    records: u64,
    last_lsn: Option<u64>,
}

impl Digest {
    fn new() -> Digest {
        Digest {
            hasher: DefaultHasher::new(),
            records: 0,
            last_lsn: None,
        }
    }

    fn add(&mut self, view: RecordView<'_>) {
        if let Some(last) = self.last_lsn {
            assert_eq!(
                Some(view.lsn.0),
                last.checked_add(1),
                "records are not handed out in dense LSN order"
            );
        }
        self.last_lsn = Some(view.lsn.0);
        self.records += 1;
        self.hasher.write_u64(view.lsn.0);
        self.hasher.write_u8(view.record_type);
        self.hasher.write_usize(view.body.len());
        self.hasher.write(view.body);
    }

    fn value(&self) -> (u64, u64) {
        (self.records, self.hasher.finish())
    }
}

/// What an error names, for comparing the errors of two readers.
fn error_site(error: &WalError) -> String {
    match error {
        WalError::Corrupt { file, offset, .. } => format!("Corrupt {} @{offset}", file.display()),
        WalError::ForeignSegment { file } => format!("ForeignSegment {}", file.display()),
        WalError::MissingSegment { file, .. } => format!("MissingSegment {}", file.display()),
        WalError::UnsupportedVersion { file, version } => {
            format!("UnsupportedVersion {} v{version}", file.display())
        }
        other => format!("other: {other}"),
    }
}

/// Checks that an error is one recovery may give for a bad directory image: typed, naming a
/// file of the directory (corruption with an offset within it).
fn assert_typed_damage(sim: &SimStorage, error: &WalError) {
    let file = match error {
        WalError::Corrupt { file, offset, .. } => {
            let len = sim.read_file(file).map(|b| b.len() as u64);
            if let Some(len) = len {
                assert!(*offset <= len, "{error}: offset past the end ({len} bytes)");
            }
            file
        }
        WalError::ForeignSegment { file }
        | WalError::MissingSegment { file, .. }
        | WalError::UnsupportedVersion { file, .. } => file,
        other => panic!("recovery of an image failed with an untyped error: {other}"),
    };
    assert!(
        file.starts_with(log_dir()),
        "{error}: names a file outside the log directory"
    );
}

fn options(record_bytes_max: u32) -> WalOptions {
    WalOptions {
        durability: Durability::Sync,
        record_bytes_max,
        ..WalOptions::default()
    }
}

/// Opens the log in [`LOG_DIR`], digesting the replayed records.
fn open_digest(
    sim: &SimStorage,
    record_bytes_max: u32,
) -> (Result<(Wal, RecoveryReport), WalError>, Digest) {
    let mut digest = Digest::new();
    let opened = Wal::open(
        Arc::new(sim.clone()),
        log_dir(),
        options(record_bytes_max),
        &mut |view| {
            digest.add(view);
            Ok(())
        },
    );
    (opened, digest)
}

/// Fuzz target `wal_segment`: arbitrary bytes as the segment files of one log directory
/// ([`SegmentImage`]), read by `kairos_wal::scan` and recovered by `Wal::open`.
///
/// # Panics
/// On a finding: the log panicked, or an oracle failed — scan and open disagree (records,
/// torn tail, or the error and what it names), an error is untyped or names no file of the
/// directory, or an opened log does not append at the next LSN, close cleanly and reopen with
/// the same records plus the appended one.
pub fn wal_segment(data: &[u8]) {
    let image = SegmentImage::decode(data);
    let record_bytes_max = image.record_bytes_max();
    let sim = SimStorage::new(0);
    image.write_to(&sim);

    let mut scanned = Digest::new();
    let scan = kairos_wal::scan(&sim, log_dir(), record_bytes_max, &mut |view| {
        scanned.add(view);
    });
    let (opened, replayed) = open_digest(&sim, record_bytes_max);
    match (scan, opened) {
        (Ok(report), Ok((wal, recovery))) => {
            check_open_agrees_with_scan(&sim, &report, &recovery, &scanned, &replayed);
            append_close_reopen(&sim, wal, &recovery, &replayed, record_bytes_max);
        }
        (Err(scan_error), Err(open_error)) => {
            assert_typed_damage(&sim, &scan_error);
            assert_eq!(
                error_site(&scan_error),
                error_site(&open_error),
                "scan and open disagree: {scan_error} / {open_error}"
            );
        }
        (Ok(report), Err(open_error)) => {
            panic!("scan found a readable log ({report:?}) but open failed: {open_error}")
        }
        (Err(scan_error), Ok((_, recovery))) => {
            panic!("scan failed ({scan_error}) but open recovered {recovery:?}")
        }
    }
}

fn check_open_agrees_with_scan(
    sim: &SimStorage,
    report: &ScanReport,
    recovery: &RecoveryReport,
    scanned: &Digest,
    replayed: &Digest,
) {
    assert_eq!(
        scanned.value(),
        replayed.value(),
        "scan and open read different records"
    );
    assert_eq!(
        report.records, scanned.records,
        "scan miscounted its records"
    );
    assert_eq!(
        recovery.records, replayed.records,
        "open miscounted its records"
    );
    assert_eq!(report.last_lsn, recovery.last_lsn);
    assert_eq!(report.torn_tail, recovery.torn_tail);
    assert_eq!(report.clean_shutdown, recovery.clean_shutdown);
    if let Some(last) = replayed.last_lsn {
        assert_eq!(
            recovery.last_lsn,
            Lsn(last),
            "last_lsn is not the last record's"
        );
    }
    if let Some(torn) = &recovery.torn_tail {
        assert!(torn.file.starts_with(log_dir()));
        assert_eq!(torn.first_lost_lsn.0, recovery.last_lsn.0 + 1);
        // Open cut the torn bytes (or replaced an unwritten segment by a fresh header).
        let len = sim.read_file(&torn.file).map_or(0, |b| b.len() as u64);
        if torn.offset > 0 {
            assert_eq!(len, torn.offset, "open did not truncate the torn tail");
        }
    }
}

fn append_close_reopen(
    sim: &SimStorage,
    wal: Wal,
    recovery: &RecoveryReport,
    replayed: &Digest,
    record_bytes_max: u32,
) {
    // The log never hands out LSN u64::MAX (the LSN after the last one must exist), and
    // says so with an error: an image whose log ends at u64::MAX - 1 takes no append.
    let next = recovery
        .last_lsn
        .0
        .checked_add(1)
        .filter(|next| *next < u64::MAX);
    let appended = wal
        .append(&[kairos_wal::Record {
            record_type: 1,
            body: b"fuzz",
        }])
        .and_then(|ticket| {
            let lsn = ticket.last_lsn();
            ticket.wait().map(|()| lsn)
        });
    match (next, appended) {
        (Some(next), Ok(lsn)) => assert_eq!(lsn, Lsn(next), "append after recovery"),
        // LSNs are exhausted: refusing is right, panicking or wrapping is not.
        (None, Err(_)) => {
            drop(wal);
            return;
        }
        (next, appended) => panic!("append after recovery to LSN {next:?} gave {appended:?}"),
    }
    if let Err(e) = wal.close() {
        panic!("close after recovery failed: {e}");
    }
    let (reopened, digest) = open_digest(sim, record_bytes_max);
    let (wal, again) = match reopened {
        Ok(opened) => opened,
        Err(e) => panic!("a log that opened, appended and closed does not reopen: {e}"),
    };
    assert_eq!(
        again.records,
        replayed.records + 1,
        "reopen lost or invented records"
    );
    assert!(
        again.clean_shutdown,
        "a cleanly closed log reopens as unclean"
    );
    assert_eq!(
        again.torn_tail, None,
        "a cleanly closed log reopens with a torn tail"
    );
    assert_eq!(again.last_lsn, Lsn(recovery.last_lsn.0 + 1));
    let mut expected = replayed.clone();
    expected.add(RecordView {
        lsn: again.last_lsn,
        record_type: 1,
        body: b"fuzz",
    });
    assert_eq!(
        digest.value(),
        expected.value(),
        "reopen did not give the recovered records and the appended one"
    );
    drop(wal);
}

// ---------------------------------------------------------------------------------------------
// record_body

/// Fuzz target `record_body`: the first byte is a record type, the rest its body, through
/// [`Record::decode`].
///
/// # Panics
/// On a finding: decode panicked, or a body that decodes does not re-encode to exactly the
/// same bytes (the encoding is canonical: every decodable body has one meaning and one
/// spelling), or the decoded record reports another type.
pub fn record_body(data: &[u8]) {
    let Some((&record_type, body)) = data.split_first() else {
        return;
    };
    let Ok(record) = Record::decode(record_type, body) else {
        return;
    };
    assert_eq!(record.record_type(), record_type, "{record:?}");
    let mut encoded = Vec::new();
    record.encode_into(&mut encoded);
    assert_eq!(encoded, body, "re-encoding {record:?} changed its bytes");
    assert_eq!(Record::decode(record_type, &encoded), Ok(record));
}

// ---------------------------------------------------------------------------------------------
// checkpoint_file

/// Makes the header and block checksums of a checkpoint image valid where the lengths allow,
/// so that the fuzzer reaches entry parsing (what [`checkpoint_file`] does when bit 0 of its
/// flags byte is set). Stops at the first block whose length runs past the end.
pub fn fix_checkpoint_crcs(bytes: &mut [u8]) {
    use crate::checkpoint::{BLOCK_HEADER_BYTES, HEADER_BYTES};
    if bytes.len() < HEADER_BYTES {
        return;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[..12]);
    h.update(&bytes[16..HEADER_BYTES]);
    let crc = h.finalize().to_le_bytes();
    bytes[12..16].copy_from_slice(&crc);
    let mut at = HEADER_BYTES;
    while at + BLOCK_HEADER_BYTES <= bytes.len() {
        let len =
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let body = at + BLOCK_HEADER_BYTES;
        let Some(end) = body.checked_add(len).filter(|&e| e <= bytes.len()) else {
            return;
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes[at..at + 4]);
        h.update(&bytes[at + 8..end]);
        let crc = h.finalize().to_le_bytes();
        bytes[at + 4..at + 8].copy_from_slice(&crc);
        at = end;
    }
}

/// Fuzz target `checkpoint_file`: a flags byte (bit 0: fix the checksums with
/// [`fix_checkpoint_crcs`]), then the bytes of a checkpoint file, through
/// [`crate::checkpoint::decode`], [`crate::replay::Replay::from_checkpoint`] and
/// [`crate::replay::Replay::add_far`].
///
/// # Panics
/// On a finding: decoding or restoring panicked, a file that decodes does not survive
/// re-encoding (encode what was read — tasks, far tasks, dead letters — decode that: the same
/// state must come back), or the replay refuses or changes the far tasks of a file that
/// decodes.
pub fn checkpoint_file(data: &[u8]) {
    use crate::checkpoint::{decode, CheckpointEncoder};
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if flags & 1 != 0 {
        fix_checkpoint_crcs(&mut bytes);
    }
    let path = std::path::Path::new("fuzz.ckpt");
    let Ok(read) = decode(&bytes, path) else {
        return;
    };
    let Some(header) = read.header else {
        panic!("a checkpoint read back without its header");
    };
    let mut enc = CheckpointEncoder::new(&header);
    for (id, t) in &read.tasks {
        let payload = match t.payload_at {
            Some((file, offset)) => crate::checkpoint::PayloadAt::Overflow { file, offset },
            None => crate::checkpoint::PayloadAt::Inline(&t.payload),
        };
        enc.push_task(*id, t.due_ms, t.deliveries, t.in_flight, &t.key, payload);
    }
    for t in &read.far {
        enc.push_far(t);
    }
    for (id, t) in &read.dead {
        enc.push_dead(*id, t);
    }
    assert_eq!(enc.far_tasks(), read.far.len() as u64);
    let again = decode(&enc.finish(), path).expect("a re-encoded checkpoint reads back");
    assert_eq!(again, read, "re-encoding changed the checkpoint");
    let (tasks, far) = (read.tasks.len(), read.far.len());
    let Ok(mut replay) =
        crate::replay::Replay::from_checkpoint(header.max_task_id, read.tasks, read.dead, true)
    else {
        return;
    };
    // The reader refused duplicate ids and ids above the largest one: so does `add_far`.
    if let Err(e) = replay.add_far(read.far.clone()) {
        panic!("add_far refused the far tasks of a checkpoint that reads: {e}");
    }
    assert_eq!(replay.far_tasks(), far);
    assert_eq!(replay.live_tasks(), tasks + far);
    let mut sorted = read.far;
    sorted.sort_unstable_by_key(|t| t.id);
    assert_eq!(
        replay.take_far(),
        sorted,
        "take_far gives back other far tasks"
    );
}

// ---------------------------------------------------------------------------------------------
// overflow_file

/// Makes the header and entry checksums of an overflow file image valid where the lengths
/// allow (what [`overflow_file`] does when bit 0 of its flags byte is set).
pub fn fix_overflow_crcs(bytes: &mut [u8]) {
    use crate::overflow::{ENTRY_FIXED_BYTES, HEADER_BYTES};
    if bytes.len() < HEADER_BYTES {
        return;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[..12]);
    h.update(&bytes[16..HEADER_BYTES]);
    let crc = h.finalize().to_le_bytes();
    bytes[12..16].copy_from_slice(&crc);
    let mut at = HEADER_BYTES;
    while at + ENTRY_FIXED_BYTES <= bytes.len() {
        let len =
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let Some(end) = (at + 8).checked_add(len).filter(|&e| e <= bytes.len()) else {
            return;
        };
        let crc = crc32fast::hash(&bytes[at + 8..end]).to_le_bytes();
        bytes[at + 4..at + 8].copy_from_slice(&crc);
        at = end;
    }
}

/// Fuzz target `overflow_file`: a flags byte (bit 0: fix the checksums with
/// [`fix_overflow_crcs`]), then the bytes of an overflow file, through
/// [`crate::overflow::decode`], [`crate::overflow::read_due`],
/// [`crate::overflow::read_entry`] and [`crate::overflow::PieceReader`] (on a
/// simulated disk).
///
/// # Panics
/// On a finding: a reader panicked; a file that decodes does not re-encode to the same bytes
/// (the layout is canonical: sorted entries, exact lengths); the sequential and the
/// per-entry readers disagree with the whole-file reader.
pub fn overflow_file(data: &[u8]) {
    use crate::overflow::{decode, read_due, read_entry, OverflowWriter, PieceReader};
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if flags & 1 != 0 {
        fix_overflow_crcs(&mut bytes);
    }
    let sim = SimStorage::new(0);
    let path = std::path::Path::new("/fuzz.ovf");
    sim.write_file(path, &bytes);
    let whole = decode(&bytes, None, None);
    let sequential = read_due(&sim, path, 0, u64::MAX, 256);
    // The piece reader (compaction's), in small pieces so entries straddle
    // them: every entry it yields is intact, whatever the file.
    let mut pieces = Vec::new();
    if let Ok(mut reader) = PieceReader::open(&sim, path, 64) {
        while let Ok(Some((offset, e))) = reader.next_entry() {
            pieces.push((
                offset,
                e.task_id,
                e.due_ms,
                e.key.to_vec(),
                e.payload.to_vec(),
            ));
        }
    }
    let Ok(entries) = whole else {
        return;
    };
    let expected: Vec<_> = entries
        .iter()
        .map(|(o, e)| (*o, e.task_id, e.due_ms, e.key.to_vec(), e.payload.to_vec()))
        .collect();
    assert_eq!(pieces, expected, "PieceReader disagrees with decode");
    // At known offsets, backwards (each a new piece).
    if let Ok(mut reader) = PieceReader::open(&sim, path, 64) {
        for (offset, id, due, key, payload) in expected.iter().rev() {
            let (e, _) = reader
                .entry_at(*offset)
                .expect("an entry decode accepted, by offset");
            assert_eq!(
                (e.task_id, e.due_ms, e.key, e.payload),
                (*id, *due, &key[..], &payload[..])
            );
        }
    }
    match sequential {
        Ok(read) => assert_eq!(read.entries, entries, "read_due disagrees with decode"),
        Err(e) => panic!("read_due refused a file decode accepts: {e}"),
    }
    for (offset, e) in &entries {
        let one = read_entry(&sim, path, *offset, e.task_id, Some(&e.key))
            .expect("an entry decode accepted");
        assert_eq!(&one, e);
    }
    let mut store_id = [0u8; 16];
    store_id.copy_from_slice(&bytes[16..32]);
    let seq = u64::from_le_bytes(bytes[32..40].try_into().unwrap_or_default());
    if let Ok(seq) = u32::try_from(seq) {
        let (again, _) = OverflowWriter::sorted(
            entries.iter().map(|(_, e)| e.clone()).collect(),
            &store_id,
            seq,
        );
        assert_eq!(again, bytes, "re-encoding changed the file");
    }
}

// ---------------------------------------------------------------------------------------------
// verify_dir

/// Bits of a [`DirImage`]'s flags byte.
pub mod dir_flags {
    /// Make the checksums valid before writing: of `META`, `TRIM`, `CLOSED`, `SYNCED`,
    /// segment headers, mark slots and frames, and (with [`DATA_FILES`]) of checkpoint
    /// headers and blocks and of overflow file headers and entries.
    pub const FIX_CHECKSUMS: u8 = 0x01;
    /// The kind bytes 9 to 12 name checkpoint and overflow files
    /// ([`super::file_kinds::CHECKPOINT`] to [`super::file_kinds::OVERFLOW_BY_POSITION`]);
    /// without this bit they name log files (modulo 8), as they did before these kinds existed.
    pub const DATA_FILES: u8 = 0x02;
}

/// How a [`DirImage`] file is named, from its first byte: `% 8`, except 8 itself (`SYNCED`)
/// and, when the flags byte has [`dir_flags::DATA_FILES`], 9 to 12 themselves (a checkpoint or
/// an overflow file).
///
/// Why a flag: every byte value already named a log file (`kind % 8`; 8 was `META` before
/// `SYNCED` took it), so giving 9 to 12 a new meaning outright would rename files of the
/// committed corpus. No committed input made before the data files has bit 1 of its flags
/// set (their flags bytes are 0 and 1), so under the flag the new kinds change nothing for
/// them: every earlier input decodes exactly as it did. Without the flag, 9 to 12 still
/// mean `TRIM`, `CLOSED`, `LOCK` and a segment.
pub mod file_kinds {
    /// `META`.
    pub const META: u8 = 0;
    /// `TRIM`.
    pub const TRIM: u8 = 1;
    /// `CLOSED`.
    pub const CLOSED: u8 = 2;
    /// `LOCK`.
    pub const LOCK: u8 = 3;
    /// A segment named after the `seq` and `prev_last_lsn + 1` its header claims.
    pub const SEGMENT: u8 = 4;
    /// A segment named after its position among the files (`seq = index + 1`).
    pub const SEGMENT_BY_POSITION: u8 = 5;
    /// A leftover `*.tmp` file.
    pub const TMP: u8 = 6;
    /// An arbitrary name: the next byte is its length (at most 24), then the name's bytes
    /// (mapped onto `[a-z0-9.-]`).
    pub const ARBITRARY: u8 = 7;
    /// `SYNCED` (only the byte 8 itself; other kinds are taken modulo 8).
    pub const SYNCED: u8 = 8;
    /// With [`super::dir_flags::DATA_FILES`] (only the byte 9 itself): a checkpoint in the
    /// data directory's `checkpoint/`, named as the engine names it after the LSN its header
    /// claims (`{lsn:016x}.ckpt`, bytes 32..40), or after its position (`lsn = index + 1`) if
    /// it is too short to say.
    pub const CHECKPOINT: u8 = 9;
    /// With [`super::dir_flags::DATA_FILES`] (only the byte 10 itself): an overflow file in the
    /// data directory's `overflow/`, named after the file number its header claims
    /// (`{n:016x}.ovf`, bytes 32..40), or after its position (`n = index + 1`) if it is too
    /// short to say or the number does not fit in 32 bits.
    pub const OVERFLOW: u8 = 10;
    /// With [`super::dir_flags::DATA_FILES`] (only the byte 11 itself): a checkpoint named
    /// after its position (`lsn = index + 1`), whatever its header claims.
    pub const CHECKPOINT_BY_POSITION: u8 = 11;
    /// With [`super::dir_flags::DATA_FILES`] (only the byte 12 itself): an overflow file named
    /// after its position (`n = index + 1`), whatever its header claims.
    pub const OVERFLOW_BY_POSITION: u8 = 12;
}

/// The directory of the data directory a [`DirFile`] is written into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilePlace {
    /// The log directory, [`LOG_DIR`].
    Log,
    /// `checkpoint/`, beside the log directory.
    Checkpoint,
    /// `overflow/`, beside the log directory.
    Overflow,
}

/// One file of a [`DirImage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFile {
    /// The directory it is in.
    pub place: FilePlace,
    /// Its name in that directory.
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl DirFile {
    /// Where it is written on the simulated disk.
    pub fn path(&self) -> PathBuf {
        let dir = match self.place {
            FilePlace::Log => log_dir().to_path_buf(),
            FilePlace::Checkpoint => data_dir().join(crate::checkpoint::CHECKPOINT_DIR_NAME),
            FilePlace::Overflow => data_dir().join(crate::overflow::OVERFLOW_DIR_NAME),
        };
        dir.join(&self.name)
    }
}

/// The data directory [`LOG_DIR`] is the log of (its parent): where a [`DirImage`]'s
/// checkpoints and overflow files go, and the directory the engine opens.
fn data_dir() -> &'static Path {
    log_dir().parent().unwrap_or(log_dir())
}

/// The decoded input of `verify_dir` (with the `cli` feature): a small data directory of
/// arbitrary files — its log, and (with [`dir_flags::DATA_FILES`]) checkpoints and overflow
/// files.
///
/// Layout: a flags byte ([`dir_flags`]); a byte choosing `record_bytes_max` as in
/// [`SegmentImage`]; then files separated by [`FILE_SEPARATOR`], each a [`file_kinds`] byte
/// (and, for an arbitrary name, the name) followed by the contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirImage {
    /// [`dir_flags`].
    pub flags: u8,
    /// Selects `record_bytes_max` (0: default, `n`: `64 × n` bytes).
    pub record_limit: u8,
    /// The files, in input order (a later file of the same path replaces an earlier one).
    pub files: Vec<DirFile>,
}

impl DirImage {
    /// Decodes any bytes (never fails).
    pub fn decode(data: &[u8]) -> DirImage {
        let flags = data.first().copied().unwrap_or(0);
        let record_limit = data.get(1).copied().unwrap_or(0);
        let rest = data.get(2..).unwrap_or(&[]);
        let data_files = flags & dir_flags::DATA_FILES != 0;
        let mut files = Vec::new();
        for (index, piece) in split_at_separator(rest, FILE_SEPARATOR, FILES_MAX)
            .into_iter()
            .enumerate()
        {
            let Some((&kind, mut bytes)) = piece.split_first() else {
                continue;
            };
            let by_position = index as u64 + 1;
            let kind = match kind {
                // Kind 8 was `META` (8 % 8) before `SYNCED` joined; every other kind keeps its
                // meaning, so the committed corpus mostly decodes as it did.
                file_kinds::SYNCED => kind,
                file_kinds::CHECKPOINT..=file_kinds::OVERFLOW_BY_POSITION if data_files => kind,
                _ => kind % 8,
            };
            let mut place = FilePlace::Log;
            let name = match kind {
                file_kinds::SYNCED => format::SYNCED_FILE_NAME.to_owned(),
                file_kinds::META => format::META_FILE_NAME.to_owned(),
                file_kinds::TRIM => format::TRIM_FILE_NAME.to_owned(),
                file_kinds::CLOSED => format::CLOSED_FILE_NAME.to_owned(),
                file_kinds::LOCK => format::LOCK_FILE_NAME.to_owned(),
                file_kinds::SEGMENT => name_from_header(bytes)
                    .unwrap_or_else(|| format::segment_file_name(by_position, Lsn(1))),
                file_kinds::SEGMENT_BY_POSITION => {
                    let first =
                        u64_at(bytes, SEG_PREV_LAST_LSN_OFFSET).map_or(1, |p| p.wrapping_add(1));
                    format::segment_file_name(by_position, Lsn(first))
                }
                file_kinds::TMP => format!(
                    "{}{}",
                    format::segment_file_name(by_position, Lsn(1)),
                    format::TMP_SUFFIX
                ),
                file_kinds::CHECKPOINT | file_kinds::CHECKPOINT_BY_POSITION => {
                    place = FilePlace::Checkpoint;
                    let lsn = u64_at(bytes, DATA_FILE_NUMBER_OFFSET)
                        .filter(|_| kind == file_kinds::CHECKPOINT)
                        .unwrap_or(by_position);
                    crate::checkpoint::file_name(lsn)
                }
                file_kinds::OVERFLOW | file_kinds::OVERFLOW_BY_POSITION => {
                    place = FilePlace::Overflow;
                    let n = u64_at(bytes, DATA_FILE_NUMBER_OFFSET)
                        .filter(|_| kind == file_kinds::OVERFLOW)
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(index as u32 + 1);
                    crate::overflow::file_name(n)
                }
                _ => {
                    let len = usize::from(bytes.first().copied().unwrap_or(0) % 25);
                    let raw = bytes
                        .get(1..1 + len)
                        .unwrap_or(bytes.get(1..).unwrap_or(&[]));
                    bytes = &bytes[(1 + raw.len()).min(bytes.len())..];
                    arbitrary_name(raw)
                }
            };
            files.push(DirFile {
                place,
                name,
                bytes: bytes.to_vec(),
            });
        }
        DirImage {
            flags,
            record_limit,
            files,
        }
    }

    /// The input that decodes to this image, for files named by kind (for seed corpora):
    /// each file is given with the [`file_kinds`] byte that names it.
    pub fn encode(flags: u8, record_limit: u8, files: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = vec![flags, record_limit];
        for (i, (kind, bytes)) in files.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(FILE_SEPARATOR);
            }
            out.push(*kind);
            out.extend_from_slice(bytes);
        }
        out
    }

    /// The `record_bytes_max` the directory is checked with.
    pub fn record_bytes_max(&self) -> u32 {
        match self.record_limit {
            0 => kairos_wal::RECORD_BYTES_MAX_DEFAULT,
            n => u32::from(n) * 64,
        }
    }

    /// Writes the image into `sim`: log files under [`LOG_DIR`], checkpoints and overflow
    /// files beside it (fixing checksums if the flags say so).
    pub fn write_to(&self, sim: &SimStorage) {
        for file in &self.files {
            let mut bytes = file.bytes.clone();
            if self.flags & dir_flags::FIX_CHECKSUMS != 0 {
                match file.place {
                    FilePlace::Checkpoint => fix_checkpoint_crcs(&mut bytes),
                    FilePlace::Overflow => fix_overflow_crcs(&mut bytes),
                    FilePlace::Log if file.name.ends_with(format::SEGMENT_SUFFIX) => {
                        fix_segment_checksums(&mut bytes);
                    }
                    FilePlace::Log => fix_small_file_checksum(&mut bytes),
                }
            }
            sim.write_file(&file.path(), &bytes);
        }
    }
}

/// Where the headers of checkpoints and overflow files hold the number their file is named
/// after: a checkpoint's LSN, an overflow file's number (bytes 32..40 of both).
const DATA_FILE_NUMBER_OFFSET: usize = 32;

/// A file name from arbitrary bytes: letters, digits, `.` and `-` only, never `.` or `..`.
fn arbitrary_name(raw: &[u8]) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdef-.segtmpMETATRIMCLOSEDLOCKxyz";
    let name: String = raw
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    if name.is_empty() || name.chars().all(|c| c == '.') {
        format!("x{name}")
    } else {
        name
    }
}

/// What `kairos verify` concluded about a directory, as the tests and fuzz targets see it:
/// the fields of its `--json` report that matter for a verdict.
#[cfg(feature = "cli")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyOutcome {
    /// Whether every record checks (exit status 0).
    pub ok: bool,
    /// The file the failure names, if any.
    pub failure_file: Option<PathBuf>,
    /// The byte offset the failure names, if any.
    pub failure_offset: Option<u64>,
    /// The failure's message, if any.
    pub failure_message: Option<String>,
    /// Records read (up to the damage, if any).
    pub records: u64,
    /// Records whose body does not decode or does not replay.
    pub bad_records: u64,
    /// The torn tail: file, offset and first lost LSN.
    pub torn_tail: Option<(PathBuf, u64, u64)>,
    /// Tasks live at the end of the log (far tasks and tasks in flight included).
    pub live_tasks: u64,
    /// Dead letters kept at the end of the log.
    pub dead_letters: u64,
    /// The whole report as `kairos verify --json` prints it.
    pub json: String,
}

/// Runs the checking code of `kairos verify` on the log directory `log_dir` of `storage` —
/// the binary's own code (`src/cli/verify.rs`), which the binary runs on the real file
/// system — and reads its report.
///
/// # Panics
/// If the report does not serialize or lacks a field a report always has (a finding).
#[cfg(feature = "cli")]
pub fn verify_log(
    storage: &dyn kairos_wal::Storage,
    log_dir: &Path,
    record_bytes_max: u32,
) -> VerifyOutcome {
    use serde_json::Value;
    // A log directory named `wal` sits in a data directory, as the engine
    // opens it: its checkpoints are checked too (as `kairos verify DIR` does).
    let checkpoint_dir = (log_dir.file_name() == Some(std::ffi::OsStr::new("wal")))
        .then(|| {
            log_dir
                .parent()
                .map(|d| d.join(crate::checkpoint::CHECKPOINT_DIR_NAME))
        })
        .flatten();
    let report = cli::verify::check(
        storage,
        log_dir.to_path_buf(),
        checkpoint_dir,
        record_bytes_max,
    );
    let (json, value) = match (
        serde_json::to_string_pretty(&report),
        serde_json::to_value(&report),
    ) {
        (Ok(json), Ok(value)) => (json, value),
        (Err(e), _) | (_, Err(e)) => panic!("the verify report does not serialize: {e}"),
    };
    let number = |v: &Value, field: &str| match v[field].as_u64() {
        Some(n) => n,
        None => panic!("verify report without {field}: {json}"),
    };
    let path = |v: &Value| v.as_str().map(PathBuf::from);
    let error = &value["error"];
    let torn = &value["torn_tail"];
    VerifyOutcome {
        ok: match value["ok"].as_bool() {
            Some(ok) => ok,
            None => panic!("verify report without ok: {json}"),
        },
        failure_file: path(&error["file"]),
        failure_offset: error["offset"].as_u64(),
        failure_message: error["message"].as_str().map(str::to_owned),
        records: number(&value, "records"),
        bad_records: number(&value, "bad_records"),
        live_tasks: number(&value, "live_tasks"),
        dead_letters: number(&value, "dead_letters"),
        torn_tail: (!torn.is_null()).then(|| {
            (
                path(&torn["file"]).unwrap_or_default(),
                number(torn, "offset"),
                number(torn, "first_lost_lsn"),
            )
        }),
        json,
    }
}

/// Fuzz target `verify_dir`: arbitrary bytes as a small data directory ([`DirImage`]: a log,
/// and with [`dir_flags::DATA_FILES`] checkpoints and overflow files), checked by the code
/// `kairos verify` runs.
///
/// # Panics
/// On a finding: the check panicked, or its report contradicts itself or the scan — `ok`
/// with a failure or bad records, `ok` for a log the scan refuses, a corrupt log reported
/// without its file and offset, a failure or torn tail naming a file outside the data
/// directory, a checkpoint it cannot start from not reported as the failure (the log is then
/// not read) — or the engine does not open, shut down and reopen a directory the check
/// passed, as `verify` promises it does, opens it with other live tasks or dead letters than
/// the check counted at the end of the log, or is poisoned (a damaged overflow entry a task
/// needs, found by a promotion or a delivery) when its clock then runs a day on.
#[cfg(feature = "cli")]
pub fn verify_dir(data: &[u8]) {
    let image = DirImage::decode(data);
    let record_bytes_max = image.record_bytes_max();
    let sim = SimStorage::new(0);
    image.write_to(&sim);
    let outcome = verify_log(&sim, log_dir(), record_bytes_max);
    if outcome.ok {
        assert_eq!(outcome.failure_message, None, "{outcome:?}");
        assert_eq!(outcome.bad_records, 0, "{outcome:?}");
    }
    if let Some(file) = &outcome.failure_file {
        assert!(file.starts_with(data_dir()), "{outcome:?}");
    }
    // The checkpoint the check starts from, as it chooses it: when there is one and it cannot
    // start from it (damaged with no older one to fall back on, another directory's, or an
    // overflow file it needs refused), that is the failure and the log is not read at all.
    let checkpoint_dir = data_dir().join(crate::checkpoint::CHECKPOINT_DIR_NAME);
    if let Err(failure) = cli::verify::start_from_checkpoint(&sim, &checkpoint_dir, log_dir()) {
        assert!(
            !outcome.ok,
            "verify passed a directory whose checkpoint it cannot start from ({}): {outcome:?}",
            failure.message
        );
        assert_eq!(outcome.failure_file, failure.file, "{outcome:?}");
        assert_eq!(outcome.failure_offset, failure.offset, "{outcome:?}");
        assert_eq!(outcome.records, 0, "{outcome:?}");
        assert_eq!(outcome.torn_tail, None, "{outcome:?}");
        return;
    }
    let scan = kairos_wal::scan(&sim, log_dir(), record_bytes_max, &mut |_| {});
    match &scan {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert!(!outcome.ok, "verify passed a corrupt log: {outcome:?}");
            assert_eq!(outcome.failure_file.as_ref(), Some(file), "{outcome:?}");
            assert_eq!(outcome.failure_offset, Some(*offset), "{outcome:?}");
        }
        Err(e) => {
            assert!(
                !outcome.ok,
                "verify passed a log the scan refuses ({e}): {outcome:?}"
            );
            assert!(outcome.failure_file.is_some(), "{e}: {outcome:?}");
        }
        Ok(report) => {
            assert_eq!(outcome.records, report.records, "{outcome:?}");
            let torn = report
                .torn_tail
                .as_ref()
                .map(|t| (t.file.clone(), t.offset, t.first_lost_lsn.0));
            assert_eq!(outcome.torn_tail, torn, "{outcome:?}");
        }
    }
    if outcome.ok && record_bytes_max == kairos_wal::RECORD_BYTES_MAX_DEFAULT {
        engine_opens(&sim, &outcome);
    }
}

/// "A directory that verifies also opens" (`src/cli/verify.rs`): the engine opens the
/// directory `verify` passed (with `outcome`), with the live tasks and dead letters it
/// counted (tasks in flight whose attempts are used up become dead letters at open), shuts
/// down cleanly, reopens with the same tasks and dead letters, and runs [`RUN_ON`] on without
/// being poisoned: what falls due is promoted, delivered and acked.
#[cfg(feature = "cli")]
fn engine_opens(sim: &SimStorage, outcome: &VerifyOutcome) {
    let clock = crate::ManualClock::new(kairos_wal::storage::SIM_NOW_MS);
    let open = || {
        crate::Engine::open_with(
            data_dir(),
            crate::Config::default(),
            Arc::new(sim.clone()),
            Arc::new(clock.clone()),
        )
    };
    let engine = match open() {
        Ok(engine) => engine,
        Err(e) => panic!("verify passed a directory the engine does not open: {e}\n{outcome:?}"),
    };
    let first = engine.recovery().clone();
    let dead_lettered = first.dead_lettered as u64;
    assert_eq!(
        (
            first.pending as u64 + dead_lettered,
            first.dead_letters as u64
        ),
        (outcome.live_tasks, outcome.dead_letters + dead_lettered),
        "the engine opened other live tasks and dead letters than verify counted \
         (live, dead): {first:?}\n{outcome:?}"
    );
    if let Err(e) = engine.shutdown() {
        panic!("the engine opened a verified directory but does not shut down: {e}");
    }
    drop(engine);
    let engine = match open() {
        Ok(engine) => engine,
        Err(e) => panic!(
            "the engine opened and shut down a verified directory, then does not reopen it: \
             {e}\n{outcome:?}"
        ),
    };
    let again = engine.recovery().clone();
    assert_eq!(
        (again.pending, again.dead_letters),
        (first.pending, first.dead_letters),
        "a clean shutdown and reopen changed the live tasks and dead letters (live, dead): \
         {again:?} after {first:?}"
    );
    // Then the clock runs a day on: what falls due is promoted (far tasks, from their
    // overflow entries), delivered (payloads read back from theirs) and acked. Verify
    // checked every entry a live task needs, so nothing poisons the engine.
    clock.advance(RUN_ON);
    engine.run_until_idle();
    let consumer = engine.consumer();
    loop {
        match consumer.try_recv() {
            Ok(delivery) => {
                if let Err(e) = consumer.ack(&delivery) {
                    panic!("a delivery from a verified directory cannot be acked: {e}");
                }
            }
            Err(crate::RecvError::Empty) => break,
            Err(e) => {
                panic!("the engine running a verified directory fails a receive: {e}\n{outcome:?}")
            }
        }
    }
    if let Err(crate::CancelError::Poisoned { cause }) = engine.cancel(b"\0fuzz: no such key") {
        panic!("the engine running a verified directory is poisoned: {cause}\n{outcome:?}");
    }
    if let Err(e) = engine.shutdown() {
        panic!("the engine reopened a verified directory but does not shut down: {e}");
    }
}

/// How far [`engine_opens`] runs the clock after the reopen: a day, beyond the far tasks of
/// the seed corpus (due hours after [`kairos_wal::storage::SIM_NOW_MS`]).
#[cfg(feature = "cli")]
const RUN_ON: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Runs `fut` to completion on this thread (a minimal executor for the async calls in tests and
/// fuzz bodies: no async runtime is a dependency), polling it once at the start and then only
/// after its waker was woken; returns its output and how many polls it took.
///
/// # Errors
/// A message if a pending future goes [`WOKEN_WITHIN`] without being woken (a lost wake-up: the
/// engine answers in milliseconds). Spurious unparks do not count as wakes.
pub fn block_on_counted<F: std::future::Future>(fut: F) -> Result<(F::Output, usize), String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    /// A waker that counts its wakes and unparks the polling thread.
    struct Unpark(std::thread::Thread, AtomicUsize);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.unpark();
        }
    }
    let mut fut = std::pin::pin!(fut);
    let unpark = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
    let waker = std::task::Waker::from(Arc::clone(&unpark));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut polls = 0;
    loop {
        let seen = unpark.1.load(Ordering::SeqCst);
        polls += 1;
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Ok((out, polls));
        }
        let start = std::time::Instant::now();
        while unpark.1.load(Ordering::SeqCst) == seen {
            if start.elapsed() > WOKEN_WITHIN {
                return Err(format!("not woken within {WOKEN_WITHIN:?}"));
            }
            std::thread::park_timeout(std::time::Duration::from_millis(100));
        }
    }
}

/// Longest [`block_on_counted`] waits for a pending future's wake (liveness, not speed).
pub const WOKEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// [`block_on_counted`]'s output alone.
///
/// # Panics
/// On a lost wake-up (see [`block_on_counted`]): in a fuzz body, a finding.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    match block_on_counted(fut) {
        Ok((out, _)) => out,
        Err(lost) => panic!("{lost}"),
    }
}
