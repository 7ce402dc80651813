//! Recovery: reading a log directory back, deciding torn tail versus corruption.
//!
//! The decision rule (FORMAT.md, "Recovery"), after PAR (Alagappan et al., FAST'18) and etcd's
//! `repair.go`: scan every segment in order; the first invalid frame in the newest segment at
//! offset `o`, where LSN `x` was expected, is an unsynced torn write — truncated — only if no
//! evidence says LSN `x` was already durable. The evidence is the durable mark `D`: every LSN
//! of older (sealed, synced) segments, and the `synced_lsn` of every valid frame found *after*
//! the damage by resynchronising byte by byte. `D >= x` means acknowledged data is damaged:
//! [`WalError::Corrupt`], nothing truncated. Damage anywhere in an older segment is always
//! corruption.

use std::io;
use std::path::{Path, PathBuf};

use crate::format::{
    self, Closed, FrameHeader, FrameKind, HeaderError, MarkSlot, SegmentHeader, StoreId, Synced,
    Trim, BOUND_FILE_BYTES, FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES, MARK_SLOTS_OFFSET,
    MARK_SLOT_BYTES, MARK_SLOT_COUNT, META_BYTES, RECORD_HEADER_BYTES, SEGMENT_FRAMES_OFFSET,
    SEGMENT_HEADER_BYTES,
};
use crate::storage::OpenMode;
use crate::{Lsn, RecordView, ReplayError, Storage, StorageFile, WalError};

/// What [`Wal::open`](crate::Wal::open) found and did while recovering.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files in the log after recovery (including a newly created one).
    pub segments: usize,
    /// Records replayed.
    pub records: u64,
    /// LSN of the first record still in the log (`last_lsn + 1` if none is left; older
    /// segments may have been removed with
    /// [`Wal::remove_segments_before`](crate::Wal::remove_segments_before)).
    pub first_lsn: Lsn,
    /// LSN of the last record replayed (`Lsn(0)` for an empty log); the next append gets
    /// `last_lsn + 1`.
    pub last_lsn: Lsn,
    /// Whether the last thing in the log was a close marker (the previous run called
    /// [`Wal::close`](crate::Wal::close) successfully and nothing was damaged after it).
    /// `false` after a crash, and also on the first open of a new log, which has nothing to
    /// have closed (`last_lsn` is then `Lsn(0)`): check both before alerting on a crash.
    pub clean_shutdown: bool,
    /// The unsynced torn tail that was truncated, if any.
    pub torn_tail: Option<TornTail>,
}

/// An unsynced torn tail: bytes at the end of the newest segment that did not form valid
/// frames, with no evidence that any of their records had been made durable. [`Wal::open`]
/// truncates them (and fsyncs); [`scan`] only reports them. A tail of zeros only (what a `Sync`
/// writer keeps written ahead of its frames, `wal/FORMAT.md` "Writing rules") is truncated the
/// same way but not reported.
///
/// [`Wal::open`]: crate::Wal::open
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment file.
    pub file: PathBuf,
    /// Byte offset in `file` of the first invalid frame (0 for a segment whose header was
    /// never completely written; such a file is replaced by a fresh one).
    pub offset: u64,
    /// Bytes from `offset` to the end of the file that were (or would be) cut off.
    pub bytes_truncated: u64,
    /// The LSN the first invalid frame should have started with: no record at or after it
    /// survives, and the next append gets it.
    pub first_lost_lsn: Lsn,
}

/// The result of [`scan`]: what a read-only check of a log directory found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Every segment, oldest first.
    pub segments: Vec<SegmentInfo>,
    /// Valid records found (excluding any torn tail).
    pub records: u64,
    /// LSN of the last valid record (`Lsn(0)` if none).
    pub last_lsn: Lsn,
    /// Whether the log ends with a close marker and nothing after it.
    pub clean_shutdown: bool,
    /// The highest LSN a high-water mark records as durable — `CLOSED` (the last clean close),
    /// `SYNCED` (the last roll or idle sync) or the newest segment's mark slots (the sync before the
    /// last), whichever is highest; `Lsn(0)` without any.
    /// Damage at or below it is corruption, never a torn tail.
    pub high_water_lsn: Lsn,
    /// The unsynced torn tail [`Wal::open`](crate::Wal::open) would truncate, if any.
    pub torn_tail: Option<TornTail>,
    /// Segments older than the low-water mark in `TRIM`: leftovers of a
    /// [`Wal::remove_segments_before`](crate::Wal::remove_segments_before) cut short by a
    /// crash. Not checked, not counted; [`Wal::open`](crate::Wal::open) removes them.
    pub leftover_segments: Vec<PathBuf>,
    /// A torn mark slot of the newest segment (FORMAT.md, "Mark slots"): what a crash while
    /// the slot was being written leaves, so not damage — [`Wal::open`](crate::Wal::open)
    /// rewrites it as empty. (A torn slot in any other segment, or both slots torn, is
    /// [`WalError::Corrupt`].)
    pub torn_mark_slot: Option<TornMarkSlot>,
}

/// A torn mark slot of the newest segment, as [`scan`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornMarkSlot {
    /// The segment file.
    pub file: PathBuf,
    /// Which slot: 0 (at byte 64) or 1 (at byte 96).
    pub index: usize,
    /// Byte offset of the slot in `file`.
    pub offset: u64,
}

/// One segment as [`scan`] saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Path of the segment file.
    pub file: PathBuf,
    /// Sequence number of the segment.
    pub seq: u64,
    /// File size in bytes (including any torn tail).
    pub bytes: u64,
    /// Valid records in the segment.
    pub records: u64,
    /// LSN the first record of the segment has (or would have).
    pub first_lsn: Lsn,
    /// LSN of the last valid record; `first_lsn - 1` if the segment holds none.
    pub last_lsn: Lsn,
    /// Whether the segment ends with a SEAL frame (it was rolled).
    pub sealed: bool,
}

/// Per-record callback of the analysis: the record, its file and its frame's offset.
pub(crate) type Visit<'v> = dyn FnMut(RecordView<'_>, &Path, u64) -> Result<(), ReplayError> + 'v;

/// Everything the analysis learnt.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub segments: Vec<SegmentInfo>,
    pub records: u64,
    pub first_lsn: Lsn,
    pub last_lsn: Lsn,
    pub clean_shutdown: bool,
    pub torn_tail: Option<TornTail>,
    /// The newest segment, `None` if there is none.
    pub tail: Option<Tail>,
    /// Segments below the `TRIM` mark (ignored; open removes them).
    pub leftovers: Vec<PathBuf>,
    /// Highest LSN a high-water mark (`CLOSED`, `SYNCED` or the newest segment's mark slots)
    /// records as durable; 0 if none.
    pub high_water_lsn: Lsn,
    /// Highest LSN `CLOSED` or `SYNCED` records as durable (the files alone); 0 if none.
    pub marked_lsn: Lsn,
}

/// The newest segment and what open must do with it.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    pub path: PathBuf,
    pub seq: u64,
    /// Last LSN of the segment before it (from the header or, if unwritten, the file name).
    pub prev_last_lsn: u64,
    /// Offset after the last valid frame: appends continue here (after truncation).
    pub valid_end: u64,
    /// Size of the file as found.
    pub file_len: u64,
    /// The segment ends with SEAL: open must roll to a new one.
    pub sealed: bool,
    /// The header was never completely written: open must replace the file.
    pub unwritten: bool,
    /// The mark slots of a version-2 segment as found (one may be torn: open rewrites it).
    pub slots: Option<[MarkSlot; MARK_SLOT_COUNT]>,
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> WalError {
    WalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(file: &Path, offset: u64, reason: impl Into<String>) -> WalError {
    WalError::Corrupt {
        file: file.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// A segment file as named in the directory.
#[derive(Debug, Clone)]
pub(crate) struct SegmentFile {
    pub path: PathBuf,
    pub seq: u64,
    pub first_lsn: Lsn,
}

/// Segment files of `dir` sorted by sequence number, and the names of leftover `.tmp` files.
///
/// # Errors
/// I/O errors; [`WalError::Corrupt`] if two segment files carry the same sequence number.
pub(crate) fn list_dir(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<(Vec<SegmentFile>, Vec<String>), WalError> {
    let names = storage.list(dir).map_err(|e| io_error("list", dir, e))?;
    let mut segments = Vec::new();
    let mut tmps = Vec::new();
    for name in names {
        if name.ends_with(format::TMP_SUFFIX) {
            tmps.push(name);
        } else if let Some((seq, first_lsn)) = format::parse_segment_file_name(&name) {
            segments.push(SegmentFile {
                path: dir.join(&name),
                seq,
                first_lsn,
            });
        } else if name.ends_with(format::SEGMENT_SUFFIX) {
            tracing::warn!(file = %dir.join(&name).display(), "ignoring a .seg file whose name does not parse");
        }
    }
    segments.sort_by_key(|s| s.seq);
    for pair in segments.windows(2) {
        if pair[0].seq == pair[1].seq {
            return Err(corrupt(
                &pair[1].path,
                0,
                format!("two segment files have sequence number {}", pair[1].seq),
            ));
        }
    }
    Ok((segments, tmps))
}

/// Reads the small fixed-size file `dir/name` into `bytes`: `Ok(false)` if it does not exist.
///
/// # Errors
/// I/O errors; [`WalError::Corrupt`] if its size is not `bytes.len()`.
fn read_fixed(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &mut [u8],
) -> Result<bool, WalError> {
    let path = dir.join(name);
    if !storage
        .exists(&path)
        .map_err(|e| io_error("stat", &path, e))?
    {
        return Ok(false);
    }
    let file = storage
        .open(&path, OpenMode::Read)
        .map_err(|e| io_error("open", &path, e))?;
    let len = file.len().map_err(|e| io_error("stat", &path, e))?;
    if len != bytes.len() as u64 {
        return Err(corrupt(
            &path,
            0,
            format!("{name} is {len} bytes, expected {}", bytes.len()),
        ));
    }
    read_exact_at(file.as_ref(), bytes, 0).map_err(|e| io_error("read", &path, e))?;
    Ok(true)
}

/// Turns a decoding error of `dir/name` into the error recovery reports.
fn header_error(dir: &Path, name: &str, error: HeaderError) -> WalError {
    match error {
        HeaderError::UnsupportedVersion(version) => WalError::UnsupportedVersion {
            file: dir.join(name),
            version,
        },
        e => corrupt(&dir.join(name), 0, format!("invalid {name}: {e}")),
    }
}

/// The store id of the log in `dir`, read from its `META` file (`FORMAT.md`, "META"), as
/// [`Wal::open`](crate::Wal::open) reads it: `Ok(None)` if `dir/META` does not exist.
///
/// For tools and other files of a data directory (a checkpoint, say) that must belong to the
/// log, without opening it (no lock is taken, nothing is written). Safe on an untrusted
/// directory: the file's length is checked against the fixed 32 bytes before any byte is
/// read, into a fixed buffer (nothing is allocated from the file). Reads one small file: O(1).
///
/// # Errors
/// - [`WalError::Io`] if checking for, opening, sizing or reading the file fails (`op` is
///   `"stat"`, `"open"` or `"read"`, `path` is `dir/META`).
/// - [`WalError::Corrupt`] naming `dir/META` at offset 0 if it is not exactly 32 bytes long
///   (empty, short or long), or its magic, CRC or flags are wrong.
/// - [`WalError::UnsupportedVersion`] if it declares a version this build cannot read.
///
/// ```
/// use std::path::Path;
/// use kairos_wal::{format, read_store_id, SimStorage, WalError};
///
/// let sim = SimStorage::new(1);
/// let dir = Path::new("/data/wal");
/// assert_eq!(read_store_id(&sim, dir).ok(), Some(None)); // no META: no log yet
/// sim.write_file(&dir.join("META"), &format::encode_meta(&[7; 16]));
/// assert_eq!(read_store_id(&sim, dir).ok(), Some(Some([7; 16])));
/// sim.write_file(&dir.join("META"), b"short");
/// assert!(matches!(read_store_id(&sim, dir), Err(WalError::Corrupt { .. })));
/// ```
pub fn read_store_id(storage: &dyn Storage, dir: &Path) -> Result<Option<StoreId>, WalError> {
    let name = format::META_FILE_NAME;
    let mut bytes = [0u8; META_BYTES];
    if !read_fixed(storage, dir, name, &mut bytes)? {
        return Ok(None);
    }
    format::decode_meta(&bytes)
        .map(Some)
        .map_err(|e| header_error(dir, name, e))
}

/// Checks that a bound file belongs to this log.
fn check_bound_store_id(
    dir: &Path,
    name: &str,
    found: &StoreId,
    store_id: &StoreId,
) -> Result<(), WalError> {
    if found == store_id {
        Ok(())
    } else {
        Err(corrupt(
            &dir.join(name),
            0,
            format!("{name} carries another log's store id than META"),
        ))
    }
}

/// Reads the bound file `dir/name` (`TRIM`, `CLOSED` or `SYNCED`) with `decode`: `Ok(None)`
/// if it does not exist.
///
/// # Errors
/// I/O errors; [`WalError::Corrupt`] (naming the file) for a damaged file or one of another
/// log; [`WalError::UnsupportedVersion`].
fn read_bound<T>(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    store_id: &StoreId,
    decode: fn(&[u8]) -> Result<T, HeaderError>,
    store_id_of: fn(&T) -> &StoreId,
) -> Result<Option<T>, WalError> {
    let mut bytes = [0u8; BOUND_FILE_BYTES];
    if !read_fixed(storage, dir, name, &mut bytes)? {
        return Ok(None);
    }
    let bound = decode(&bytes).map_err(|e| header_error(dir, name, e))?;
    check_bound_store_id(dir, name, store_id_of(&bound), store_id)?;
    Ok(Some(bound))
}

/// Reads `TRIM` of `dir` (the low-water mark): `Ok(None)` if it does not exist.
///
/// # Errors
/// As [`read_bound`].
pub(crate) fn read_trim(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
) -> Result<Option<Trim>, WalError> {
    let name = format::TRIM_FILE_NAME;
    read_bound(storage, dir, name, store_id, Trim::decode, |t| &t.store_id)
}

/// A high-water mark on record: segment `seq` existed and every LSN up to `lsn` was durable
/// when `file` was written; the log only grows past both.
#[derive(Clone, Copy, Debug)]
struct HighWater {
    /// `CLOSED` or `SYNCED`.
    file: &'static str,
    seq: u64,
    lsn: u64,
    /// Who wrote it, for messages.
    what: &'static str,
}

impl HighWater {
    /// "the last clean close recorded segment seq 3 and LSN 17 in CLOSED".
    fn recorded(&self) -> String {
        format!(
            "{} recorded segment seq {} and LSN {} in {}",
            self.what, self.seq, self.lsn, self.file
        )
    }
}

/// Both high-water marks of `dir` — `CLOSED` (the last clean close) and `SYNCED` (the last
/// roll or idle sync) — those that exist.
///
/// # Errors
/// As [`read_bound`].
fn read_high_water(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
) -> Result<Vec<HighWater>, WalError> {
    let mut marks = Vec::with_capacity(2);
    let closed = read_bound(
        storage,
        dir,
        format::CLOSED_FILE_NAME,
        store_id,
        Closed::decode,
        |c| &c.store_id,
    )?;
    if let Some(closed) = closed {
        marks.push(HighWater {
            file: format::CLOSED_FILE_NAME,
            seq: closed.seq,
            lsn: closed.last_lsn.0,
            what: "the last clean close",
        });
    }
    let synced = read_bound(
        storage,
        dir,
        format::SYNCED_FILE_NAME,
        store_id,
        Synced::decode,
        |s| &s.store_id,
    )?;
    if let Some(synced) = synced {
        marks.push(HighWater {
            file: format::SYNCED_FILE_NAME,
            seq: synced.seq,
            lsn: synced.synced_lsn.0,
            what: "the last roll or idle sync",
        });
    }
    Ok(marks)
}

/// For a directory without `META`: a new log unless a segment, `TRIM`, `CLOSED` or `SYNCED`
/// says one existed.
///
/// # Errors
/// [`WalError::Corrupt`] naming `META` if such a file exists; I/O errors.
pub(crate) fn check_meta_absent(
    storage: &dyn Storage,
    dir: &Path,
    segments: &[SegmentFile],
) -> Result<(), WalError> {
    let meta = dir.join(format::META_FILE_NAME);
    let mut found = segments.first().map(|s| s.path.clone());
    for name in [
        format::TRIM_FILE_NAME,
        format::CLOSED_FILE_NAME,
        format::SYNCED_FILE_NAME,
    ] {
        let path = dir.join(name);
        if found.is_none()
            && storage
                .exists(&path)
                .map_err(|e| io_error("stat", &path, e))?
        {
            found = Some(path);
        }
    }
    match found {
        Some(path) => Err(corrupt(
            &meta,
            0,
            format!("META is missing but {} exists", path.display()),
        )),
        None => Ok(()),
    }
}

/// Fills `buf` from `offset`.
///
/// # Errors
/// `UnexpectedEof` if the file ends first, or the read error.
pub(crate) fn read_exact_at(
    file: &dyn StorageFile,
    mut buf: &mut [u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        let n = file.read_at(buf, offset)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file ended before the expected bytes",
            ));
        }
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

/// Bytes read per chunk while scanning a segment.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// A window over a segment file read in chunks, so scanning many small frames costs few
/// reads. Requests are always within the file length checked up front, so a damaged length
/// field can never make it allocate more than the file holds.
struct SegmentReader<'f> {
    file: &'f dyn StorageFile,
    path: &'f Path,
    len: u64,
    buf: Vec<u8>,
    buf_offset: u64,
}

impl<'f> SegmentReader<'f> {
    fn new(file: &'f dyn StorageFile, path: &'f Path, len: u64) -> Self {
        SegmentReader {
            file,
            path,
            len,
            buf: Vec::new(),
            buf_offset: 0,
        }
    }

    /// The `n` bytes at `offset`.
    ///
    /// # Errors
    /// I/O errors, including a file that shrank under us.
    ///
    /// # Panics
    /// If the range exceeds the file length (a caller bug: every caller checks first).
    fn get(&mut self, offset: u64, n: usize) -> Result<&[u8], WalError> {
        assert!(
            offset + n as u64 <= self.len,
            "read of {n} bytes at {offset} past the end {}",
            self.len
        );
        let cached_end = self.buf_offset + self.buf.len() as u64;
        if offset < self.buf_offset || offset + n as u64 > cached_end {
            let want = n.max(READ_CHUNK_BYTES) as u64;
            let want = usize::try_from(want.min(self.len - offset)).unwrap_or(n);
            self.buf.clear();
            self.buf.try_reserve_exact(want).map_err(|_| {
                io_error(
                    "read",
                    self.path,
                    io::Error::new(io::ErrorKind::OutOfMemory, "cannot allocate read buffer"),
                )
            })?;
            self.buf.resize(want, 0);
            self.buf_offset = offset;
            if let Err(e) = read_exact_at(self.file, &mut self.buf, offset) {
                self.buf.clear();
                return Err(io_error("read", self.path, e));
            }
        }
        let start = usize::try_from(offset - self.buf_offset).unwrap_or(usize::MAX);
        Ok(&self.buf[start..start + n])
    }
}

/// What checking the frame at one offset found.
enum FrameCheck {
    /// A valid frame with the expected LSN.
    Valid {
        header: FrameHeader,
        kind: FrameKind,
    },
    /// Damage that a torn write can produce (short, bad length, bad CRC, unexpected LSN).
    Invalid(String),
    /// A frame whose CRC checks but whose content breaks the format: never a torn write.
    Malformed(String),
}

fn check_frame_at(
    reader: &mut SegmentReader<'_>,
    offset: u64,
    expected_lsn: u64,
    record_bytes_max: u32,
) -> Result<FrameCheck, WalError> {
    let remaining = reader.len - offset;
    if remaining < FRAME_HEADER_BYTES as u64 {
        return Ok(FrameCheck::Invalid(format!(
            "only {remaining} bytes left, a frame header needs {FRAME_HEADER_BYTES}"
        )));
    }
    let header = FrameHeader::parse(reader.get(offset, FRAME_HEADER_BYTES)?);
    let body_room = remaining - FRAME_HEADER_BYTES as u64;
    if header.body_bytes > FRAME_BODY_BYTES_MAX || u64::from(header.body_bytes) > body_room {
        return Ok(FrameCheck::Invalid(format!(
            "frame length {} exceeds the {} bytes left (limit {FRAME_BODY_BYTES_MAX})",
            header.body_bytes, body_room
        )));
    }
    let frame = reader.get(offset, FRAME_HEADER_BYTES + header.body_bytes as usize)?;
    let (head, body) = frame.split_at(FRAME_HEADER_BYTES);
    if format::frame_crc(head, body) != header.crc {
        return Ok(FrameCheck::Invalid("frame checksum mismatch".to_owned()));
    }
    let kind = match header.check_fields() {
        Ok(kind) => kind,
        Err(reason) => return Ok(FrameCheck::Malformed(reason.to_owned())),
    };
    if kind == FrameKind::Data {
        let checked =
            format::for_each_record(body, header.record_count, record_bytes_max, |_, _, _| {
                Ok::<(), ()>(())
            });
        if let Err(reason) = checked {
            return Ok(FrameCheck::Malformed(reason));
        }
    }
    if header.first_lsn != expected_lsn {
        return Ok(FrameCheck::Invalid(format!(
            "frame starts at LSN {} where {expected_lsn} was expected",
            header.first_lsn
        )));
    }
    Ok(FrameCheck::Valid { header, kind })
}

/// What scanning one segment's frames found.
struct FrameScan {
    /// Offset after the last valid frame.
    end: u64,
    /// LSN the next record would get.
    next_lsn: u64,
    records: u64,
    last_kind: Option<FrameKind>,
    damage: Option<Damage>,
}

/// The first invalid frame of a segment.
struct Damage {
    offset: u64,
    reason: String,
    /// Highest `synced_lsn` of the valid frames found after the damage (0 if none).
    synced_after: u64,
    /// Every byte from the damage to the end of the file is zero: the segment's preallocated
    /// tail (or an unsynced append that never reached the disk), not torn bytes.
    zero_tail: bool,
}

fn scan_frames(
    reader: &mut SegmentReader<'_>,
    frames_offset: u64,
    first_lsn: u64,
    record_bytes_max: u32,
    visit: &mut Visit<'_>,
) -> Result<FrameScan, WalError> {
    let path = reader.path;
    let mut scan = FrameScan {
        end: frames_offset,
        next_lsn: first_lsn,
        records: 0,
        last_kind: None,
        damage: None,
    };
    while scan.end < reader.len {
        let offset = scan.end;
        match check_frame_at(reader, offset, scan.next_lsn, record_bytes_max)? {
            FrameCheck::Valid { header, kind } => {
                if scan.last_kind == Some(FrameKind::Seal) {
                    return Err(corrupt(
                        path,
                        offset,
                        "a valid frame follows the SEAL frame",
                    ));
                }
                let frame_bytes = FRAME_HEADER_BYTES + header.body_bytes as usize;
                if kind == FrameKind::Data {
                    let frame = reader.get(offset, frame_bytes)?;
                    let body = &frame[FRAME_HEADER_BYTES..];
                    let first = header.first_lsn;
                    let replayed = format::for_each_record(
                        body,
                        header.record_count,
                        record_bytes_max,
                        |index, record_type, record_body| {
                            let lsn = Lsn(first + u64::from(index));
                            let view = RecordView {
                                lsn,
                                record_type,
                                body: record_body,
                            };
                            visit(view, path, offset).map_err(|source| WalError::Replay {
                                lsn,
                                file: path.to_path_buf(),
                                offset,
                                source,
                            })
                        },
                    );
                    match replayed {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(e),
                        Err(reason) => return Err(corrupt(path, offset, reason)),
                    }
                    scan.records += u64::from(header.record_count);
                    scan.next_lsn += u64::from(header.record_count);
                }
                scan.last_kind = Some(kind);
                scan.end = offset + frame_bytes as u64;
            }
            FrameCheck::Malformed(reason) => {
                return Err(corrupt(
                    path,
                    offset,
                    format!("{reason} (in a frame whose checksum is valid)"),
                ));
            }
            FrameCheck::Invalid(reason) => {
                let zero_tail = zero_from(reader, offset)?;
                // Zeros hold no frame to resynchronise on.
                let synced_after = if zero_tail {
                    0
                } else {
                    resync(reader, offset, scan.next_lsn, record_bytes_max)?
                };
                scan.damage = Some(Damage {
                    offset,
                    reason,
                    synced_after,
                    zero_tail,
                });
                break;
            }
        }
    }
    Ok(scan)
}

/// Whether every byte from `offset` to the end of the file is zero. Reads at most
/// [`ZERO_CHECK_BYTES`] at a time.
fn zero_from(reader: &mut SegmentReader<'_>, offset: u64) -> Result<bool, WalError> {
    let mut position = offset;
    while position < reader.len {
        let n = (reader.len - position).min(ZERO_CHECK_BYTES as u64) as usize;
        if reader.get(position, n)?.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        position += n as u64;
    }
    Ok(true)
}

/// Bytes [`zero_from`] reads at a time.
const ZERO_CHECK_BYTES: usize = 64 * 1024;

/// After damage at `damage_offset` where LSN `expected_lsn` was expected, finds every valid
/// frame further on (byte by byte, then frame by frame once one is found) and returns the
/// highest `synced_lsn` among them. Damaged bytes are never trusted: a candidate counts only
/// if its whole frame checks (length within the file, CRC, fields, records) and its LSN is
/// plausible for its position (at or after `expected_lsn`, at most one LSN per
/// [`RECORD_HEADER_BYTES`] bytes since the damage).
///
/// # Errors
/// I/O errors, or [`WalError::Corrupt`] if hashing candidates costs more than a few passes
/// over the file (crafted input) — refusing is the safe side.
fn resync(
    reader: &mut SegmentReader<'_>,
    damage_offset: u64,
    expected_lsn: u64,
    record_bytes_max: u32,
) -> Result<u64, WalError> {
    let len = reader.len;
    let budget = len.saturating_mul(4).saturating_add(1 << 20);
    let mut hashed = 0u64;
    let mut synced_after = 0u64;
    let mut position = damage_offset + 1;
    while len - position >= FRAME_HEADER_BYTES as u64 {
        let header = FrameHeader::parse(reader.get(position, FRAME_HEADER_BYTES)?);
        let lsn_window = (position - damage_offset) / RECORD_HEADER_BYTES as u64;
        let plausible = header.check_fields().is_ok()
            && header.first_lsn >= expected_lsn
            && header.first_lsn - expected_lsn <= lsn_window
            && u64::from(header.body_bytes) <= len - position - FRAME_HEADER_BYTES as u64;
        if !plausible {
            position += 1;
            continue;
        }
        let frame_bytes = FRAME_HEADER_BYTES + header.body_bytes as usize;
        hashed += frame_bytes as u64;
        if hashed > budget {
            return Err(corrupt(
                reader.path,
                damage_offset,
                "too many candidate frames after the damage to tell a torn tail from corruption",
            ));
        }
        let frame = reader.get(position, frame_bytes)?;
        let (head, body) = frame.split_at(FRAME_HEADER_BYTES);
        let valid = format::frame_crc(head, body) == header.crc
            && (header.kind != FrameKind::Data as u8
                || format::for_each_record(
                    body,
                    header.record_count,
                    record_bytes_max,
                    |_, _, _| Ok::<(), ()>(()),
                )
                .is_ok());
        if valid {
            synced_after = synced_after.max(header.synced_lsn);
            position += frame_bytes as u64;
        } else {
            position += 1;
        }
    }
    Ok(synced_after)
}

/// A segment whose header passed the checks of the first pass.
struct Checked {
    file: SegmentFile,
    /// `None` for an unwritten newest segment.
    header: Option<SegmentHeader>,
    len: u64,
    /// The mark slots of a version-2 segment (`None`: version 1, or unwritten).
    slots: Option<[MarkSlot; MARK_SLOT_COUNT]>,
}

/// Reads and checks the two mark slots of a version-2 segment (FORMAT.md, "Mark slots").
/// A crash can tear only the slot being written, and only in the newest segment: a torn slot
/// anywhere else, both slots torn, or a slot whose checksum matches but that names another
/// segment or an LSN the segment cannot have synced, is `Corrupt` at that slot.
fn read_mark_slots(
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    is_last: bool,
) -> Result<[MarkSlot; MARK_SLOT_COUNT], WalError> {
    let mut bytes = [0u8; MARK_SLOT_COUNT * MARK_SLOT_BYTES];
    read_exact_at(file, &mut bytes, MARK_SLOTS_OFFSET as u64)
        .map_err(|e| io_error("read", path, e))?;
    let mut slots = [MarkSlot::Empty; MARK_SLOT_COUNT];
    for (index, slot) in slots.iter_mut().enumerate() {
        let at = index * MARK_SLOT_BYTES;
        let offset = (MARK_SLOTS_OFFSET + at) as u64;
        *slot = MarkSlot::decode(&bytes[at..at + MARK_SLOT_BYTES]);
        if let MarkSlot::Mark { synced_lsn, seq } = *slot {
            if seq != header.seq {
                return Err(corrupt(
                    path,
                    offset,
                    format!(
                        "mark slot {index} names segment seq {seq}, but this is seq {}",
                        header.seq
                    ),
                ));
            }
            if synced_lsn <= header.prev_last_lsn {
                return Err(corrupt(
                    path,
                    offset,
                    format!(
                        "mark slot {index} records synced LSN {synced_lsn}, not after the previous segment's last LSN {}",
                        header.prev_last_lsn
                    ),
                ));
            }
        }
    }
    let torn: Vec<usize> = (0..MARK_SLOT_COUNT)
        .filter(|&i| slots[i] == MarkSlot::Torn)
        .collect();
    if let Some(&first) = torn.first() {
        let offset = (MARK_SLOTS_OFFSET + first * MARK_SLOT_BYTES) as u64;
        if !is_last {
            return Err(corrupt(
                path,
                offset,
                format!(
                    "mark slot {first} is damaged in a segment that is not the newest (only the newest segment's slots are written)"
                ),
            ));
        }
        if torn.len() == MARK_SLOT_COUNT {
            return Err(corrupt(
                path,
                offset,
                "both mark slots are damaged; a crash can tear only the one being written",
            ));
        }
    }
    Ok(slots)
}

/// The oldest segment that must exist: the one `TRIM` names, or segment 1 at LSN 1.
#[derive(Clone, Copy, Debug)]
struct Floor {
    seq: u64,
    first_lsn: u64,
    from_trim: bool,
}

impl Floor {
    fn new(trim: Option<&Trim>) -> Floor {
        match trim {
            Some(trim) => Floor {
                seq: trim.seq,
                first_lsn: trim.first_lsn.0,
                from_trim: true,
            },
            None => Floor {
                seq: 1,
                first_lsn: 1,
                from_trim: false,
            },
        }
    }

    /// Why this segment must exist, for error messages.
    fn rule(&self) -> String {
        if self.from_trim {
            format!(
                "{} says segment seq {} (first LSN {}) is the oldest that must exist",
                format::TRIM_FILE_NAME,
                self.seq,
                self.first_lsn
            )
        } else {
            format!(
                "there is no {} file, so segment seq 1 (first LSN 1) must exist",
                format::TRIM_FILE_NAME
            )
        }
    }

    /// Checks that `oldest` (the oldest segment at or above the floor) is the floor segment.
    fn check(&self, oldest: &SegmentFile) -> Result<(), WalError> {
        if oldest.seq > self.seq {
            return Err(WalError::MissingSegment {
                file: oldest.path.clone(),
                reason: format!(
                    "the oldest segment is seq {} (first LSN {}), but {}: seq {}..={} (LSNs from {}) missing",
                    oldest.seq,
                    oldest.first_lsn.0,
                    self.rule(),
                    self.seq,
                    oldest.seq - 1,
                    self.first_lsn
                ),
            });
        }
        if oldest.first_lsn.0 != self.first_lsn {
            return Err(corrupt(
                &oldest.path,
                0,
                format!(
                    "segment seq {} starts at LSN {}, but {}",
                    oldest.seq,
                    oldest.first_lsn.0,
                    self.rule()
                ),
            ));
        }
        Ok(())
    }
}

/// First pass: every header, before any frame — so a foreign, missing or future-version
/// segment is named as such rather than as damage in its neighbour. `files` are the segments
/// at or above `floor`, oldest first; the first must be the floor segment.
fn check_headers(
    storage: &dyn Storage,
    store_id: &StoreId,
    files: Vec<SegmentFile>,
    floor: &Floor,
) -> Result<Vec<Checked>, WalError> {
    let count = files.len();
    let mut checked: Vec<Checked> = Vec::with_capacity(count);
    for (index, segment) in files.into_iter().enumerate() {
        let is_last = index + 1 == count;
        let path = &segment.path;
        let file = storage
            .open(path, OpenMode::Read)
            .map_err(|e| io_error("open", path, e))?;
        let len = file.len().map_err(|e| io_error("stat", path, e))?;
        let header = read_segment_header(file.as_ref(), path, len, is_last)?;
        let mut slots = None;
        if let Some(header) = &header {
            if header.store_id != *store_id {
                return Err(WalError::ForeignSegment { file: path.clone() });
            }
            if header.seq != segment.seq || header.first_lsn() != segment.first_lsn {
                return Err(corrupt(
                    path,
                    0,
                    format!(
                        "header says seq {} first LSN {}, the file name says seq {} first LSN {}",
                        header.seq,
                        header.first_lsn().0,
                        segment.seq,
                        segment.first_lsn.0
                    ),
                ));
            }
            if header.has_mark_slots() {
                slots = Some(read_mark_slots(file.as_ref(), path, header, is_last)?);
            }
        } else if segment.first_lsn.0 == 0 {
            return Err(corrupt(path, 0, "segment file name says first LSN 0"));
        }
        if checked.is_empty() {
            floor.check(&segment)?;
        }
        if let Some(previous) = checked.last() {
            if previous.file.seq.checked_add(1) != Some(segment.seq) {
                return Err(WalError::MissingSegment {
                    file: path.clone(),
                    reason: format!(
                        "segment seq {} follows seq {}: seq {}..={} missing",
                        segment.seq,
                        previous.file.seq,
                        previous.file.seq.saturating_add(1),
                        segment.seq.saturating_sub(1)
                    ),
                });
            }
        }
        checked.push(Checked {
            file: segment,
            header,
            len,
            slots,
        });
    }
    Ok(checked)
}

/// Reads and checks every segment of `dir` for the log `store_id`, calling `visit` for every
/// valid record in LSN order, and decides what the newest segment's tail is. Segments below
/// the `TRIM` mark are left out (listed in [`Analysis::leftovers`]). Never writes.
pub(crate) fn analyze(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
    record_bytes_max: u32,
    visit: &mut Visit<'_>,
) -> Result<Analysis, WalError> {
    // The high-water marks are read before the directory is listed, and TRIM after it: a mark
    // only ever names a segment that already exists durably and LSNs already written, and the
    // log only grows past it, so everything a mark read now names is in the listing even
    // when a live writer (an unlocked `scan`) rolls and records a newer mark meanwhile; a
    // removal writes TRIM before it deletes anything, so a segment missing from the listing
    // is below whatever TRIM says next. (Their errors are reported in the order the files are
    // checked — listing, TRIM, marks — so that `scan` names the same damage `open` does,
    // which lists the directory before it gets here.)
    let marks = read_high_water(storage, dir, store_id);
    let (files, _) = list_dir(storage, dir)?;
    let trim = read_trim(storage, dir, store_id)?;
    let marks = marks?;
    let floor = Floor::new(trim.as_ref());
    let (leftovers, files): (Vec<SegmentFile>, Vec<SegmentFile>) =
        files.into_iter().partition(|f| f.seq < floor.seq);
    for leftover in &leftovers {
        tracing::info!(
            file = %leftover.path.display(),
            trim_seq = floor.seq,
            "segment below the TRIM mark: leftover of an interrupted removal"
        );
    }
    if files.is_empty() {
        if trim.is_some() {
            return Err(WalError::MissingSegment {
                file: dir.join(format::TRIM_FILE_NAME),
                reason: format!(
                    "no segment at or after seq {} exists, but {}",
                    floor.seq,
                    floor.rule()
                ),
            });
        }
        if let Some(mark) = marks.first() {
            return Err(WalError::MissingSegment {
                file: dir.join(mark.file),
                reason: format!("no segment exists, but {}", mark.recorded()),
            });
        }
    }
    let checked = check_headers(storage, store_id, files, &floor)?;
    // The high-water marks of the last clean close and the last roll or idle sync: segment `seq`
    // existed and every LSN up to `lsn` was durable; the log only grows past both.
    if let Some(newest) = checked.last() {
        for mark in &marks {
            if newest.file.seq < mark.seq {
                return Err(WalError::MissingSegment {
                    file: dir.join(mark.file),
                    reason: format!(
                        "the newest segment is seq {}, but {}: seq {}..={} missing",
                        newest.file.seq,
                        mark.recorded(),
                        newest.file.seq + 1,
                        mark.seq
                    ),
                });
            }
        }
    }
    let high_water = marks.iter().copied().max_by_key(|m| m.lsn);
    let high_water_lsn = high_water.map_or(0, |m| m.lsn);
    let mut analysis = Analysis {
        leftovers: leftovers.into_iter().map(|f| f.path).collect(),
        high_water_lsn: Lsn(high_water_lsn),
        marked_lsn: Lsn(high_water_lsn),
        ..Analysis::default()
    };
    let count = checked.len();
    // Last LSN of the previous segment.
    let mut previous_last: Option<u64> = None;
    for (index, segment) in checked.into_iter().enumerate() {
        let is_last = index + 1 == count;
        let path = &segment.file.path;
        let len = segment.len;
        let Some(header) = segment.header else {
            // An unwritten newest segment: its name is all we know.
            let first = segment.file.first_lsn.0;
            check_lsn_continuity(path, previous_last, first - 1)?;
            if high_water_lsn >= first {
                return Err(corrupt(
                    path,
                    0,
                    format!(
                        "the newest segment has no valid header, but LSN {first} in it was durable ({})",
                        high_water.map(|m| m.recorded()).unwrap_or_default()
                    ),
                ));
            }
            // A mark is written only after the segment it names was created completely
            // (header and slots synced, then renamed): that header was durable.
            if let Some(mark) = marks.iter().find(|m| m.seq == segment.file.seq) {
                return Err(corrupt(
                    path,
                    0,
                    format!(
                        "the newest segment has no valid header, but it was durable: {}",
                        mark.recorded()
                    ),
                ));
            }
            analysis.torn_tail = Some(TornTail {
                file: path.clone(),
                offset: 0,
                bytes_truncated: len,
                first_lost_lsn: Lsn(first),
            });
            analysis.segments.push(SegmentInfo {
                file: path.clone(),
                seq: segment.file.seq,
                bytes: len,
                records: 0,
                first_lsn: Lsn(first),
                last_lsn: Lsn(first - 1),
                sealed: false,
            });
            if analysis.segments.len() == 1 {
                analysis.first_lsn = Lsn(first);
            }
            analysis.last_lsn = Lsn(first - 1);
            analysis.clean_shutdown = false;
            analysis.tail = Some(Tail {
                path: path.clone(),
                seq: segment.file.seq,
                prev_last_lsn: first - 1,
                valid_end: 0,
                file_len: len,
                sealed: false,
                unwritten: true,
                slots: None,
            });
            break;
        };
        check_lsn_continuity(path, previous_last, header.prev_last_lsn)?;
        let first_lsn = header.prev_last_lsn + 1;
        let file = storage
            .open(path, OpenMode::Read)
            .map_err(|e| io_error("open", path, e))?;
        // Measured again, after the mark slots were read: on a live log (an unlocked `scan`)
        // the writer may have synced and slotted more since the first measure, and a slot's
        // frames are always written before the slot — so every frame a slot read earlier
        // vouches for lies within this length. (Under open's lock nothing changes.)
        let len = file.len().map_err(|e| io_error("stat", path, e))?.max(len);
        let mut reader = SegmentReader::new(file.as_ref(), path, len);
        let scan = scan_frames(
            &mut reader,
            header.frames_offset(),
            first_lsn,
            record_bytes_max,
            visit,
        )?;
        // The mark slots (version 2): every LSN up to `slot_mark` was durable in this segment.
        let slot_mark = segment
            .slots
            .as_ref()
            .map_or(0, |slots| format::slots_mark(slots));
        let sealed = scan.last_kind == Some(FrameKind::Seal);
        if !is_last {
            if let Some(damage) = &scan.damage {
                return Err(corrupt(
                    path,
                    damage.offset,
                    format!("{} (in a sealed segment)", damage.reason),
                ));
            }
            if !sealed {
                return Err(corrupt(
                    path,
                    scan.end,
                    "segment does not end with a SEAL frame but a newer segment exists",
                ));
            }
        }
        if is_last && sealed && header.seq == u64::MAX {
            // Open would have to roll past it, and no segment can follow seq u64::MAX. The
            // writer checks before it seals, so it never leaves this behind; decided here,
            // where scan and open share it, so a directory that verifies also opens.
            return Err(corrupt(
                path,
                scan.end - FRAME_HEADER_BYTES as u64,
                "segment seq u64::MAX is sealed, but no segment can follow it (the sequence number space is exhausted)",
            ));
        }
        let mut valid_end = scan.end;
        if let Some(damage) = &scan.damage {
            // Every LSN of older segments is durable (they were synced before sealing), and so
            // is every LSN up to the last clean close.
            let durable_mark = header.prev_last_lsn.max(damage.synced_after);
            if durable_mark >= scan.next_lsn {
                return Err(corrupt(
                    path,
                    damage.offset,
                    format!(
                        "{}; LSN {} was already durable (a later frame records synced LSN {})",
                        damage.reason, scan.next_lsn, durable_mark
                    ),
                ));
            }
            if high_water_lsn >= scan.next_lsn {
                return Err(corrupt(
                    path,
                    damage.offset,
                    format!(
                        "{}; LSN {} was already durable ({})",
                        damage.reason,
                        scan.next_lsn,
                        high_water.map(|m| m.recorded()).unwrap_or_default()
                    ),
                ));
            }
            if slot_mark >= scan.next_lsn {
                return Err(corrupt(
                    path,
                    damage.offset,
                    format!(
                        "{}; LSN {} was already durable (the segment's mark slot records synced LSN {})",
                        damage.reason, scan.next_lsn, slot_mark
                    ),
                ));
            }
            // Zeros to the end are the preallocated tail the writer keeps ahead of its frames
            // under `Sync` (or an append that never reached the disk): nothing torn to report,
            // only cut off.
            if !damage.zero_tail {
                tracing::warn!(
                    file = %path.display(),
                    offset = damage.offset,
                    bytes = len - damage.offset,
                    first_lost_lsn = scan.next_lsn,
                    reason = %damage.reason,
                    "unsynced torn tail"
                );
                analysis.torn_tail = Some(TornTail {
                    file: path.clone(),
                    offset: damage.offset,
                    bytes_truncated: len - damage.offset,
                    first_lost_lsn: Lsn(scan.next_lsn),
                });
            }
            valid_end = damage.offset;
        }
        if is_last && scan.next_lsn - 1 < high_water_lsn {
            return Err(corrupt(
                path,
                scan.end,
                format!(
                    "the log ends at LSN {}, but {}: durable records are missing",
                    scan.next_lsn - 1,
                    high_water.map(|m| m.recorded()).unwrap_or_default()
                ),
            ));
        }
        if scan.next_lsn - 1 < slot_mark {
            return Err(corrupt(
                path,
                scan.end,
                format!(
                    "the segment ends at LSN {}, but its mark slot records LSN {} as synced: durable records are missing",
                    scan.next_lsn - 1,
                    slot_mark
                ),
            ));
        }
        if analysis.segments.is_empty() {
            analysis.first_lsn = Lsn(first_lsn);
        }
        analysis.segments.push(SegmentInfo {
            file: path.clone(),
            seq: header.seq,
            bytes: len,
            records: scan.records,
            first_lsn: Lsn(first_lsn),
            last_lsn: Lsn(scan.next_lsn - 1),
            sealed,
        });
        analysis.records += scan.records;
        analysis.last_lsn = Lsn(scan.next_lsn - 1);
        analysis.clean_shutdown = scan.damage.is_none() && scan.last_kind == Some(FrameKind::Close);
        previous_last = Some(scan.next_lsn - 1);
        if is_last {
            analysis.high_water_lsn = analysis.high_water_lsn.max(Lsn(slot_mark));
            analysis.tail = Some(Tail {
                path: path.clone(),
                seq: header.seq,
                prev_last_lsn: header.prev_last_lsn,
                valid_end,
                file_len: len,
                sealed,
                unwritten: false,
                slots: segment.slots,
            });
        }
    }
    if analysis.segments.is_empty() {
        analysis.first_lsn = Lsn(1);
    }
    Ok(analysis)
}

/// Reads the header of a segment; `Ok(None)` if it is the newest segment and its header was
/// never completely written (no more than a header's worth of bytes, none of them a valid
/// header).
fn read_segment_header(
    file: &dyn StorageFile,
    path: &Path,
    len: u64,
    is_last: bool,
) -> Result<Option<SegmentHeader>, WalError> {
    // A version-2 header is followed by its mark slots; the creation protocol syncs both
    // before the segment gets its name, so only the newest segment can be found shorter.
    let short_newest = is_last && len <= SEGMENT_FRAMES_OFFSET as u64;
    if len < SEGMENT_HEADER_BYTES as u64 {
        if short_newest {
            return Ok(None);
        }
        return Err(corrupt(
            path,
            0,
            format!(
                "segment of {len} bytes is shorter than its {SEGMENT_HEADER_BYTES}-byte header"
            ),
        ));
    }
    let mut bytes = [0u8; SEGMENT_FRAMES_OFFSET];
    let head = &mut bytes[..len.min(SEGMENT_FRAMES_OFFSET as u64) as usize];
    read_exact_at(file, head, 0).map_err(|e| io_error("read", path, e))?;
    // Without a valid header, a short newest file is unwritten only if it holds no more than
    // a version-2 creation writes (zeros past the header: empty slots) — a version-1 segment
    // of up to 128 bytes can hold frames.
    let unwritten_if_invalid = short_newest && head[SEGMENT_HEADER_BYTES..].iter().all(|&b| b == 0);
    match SegmentHeader::decode(head) {
        Ok(header) if len < header.frames_offset() => {
            if short_newest {
                return Ok(None);
            }
            Err(corrupt(
                path,
                len,
                format!(
                    "segment of {len} bytes is shorter than its {}-byte header and mark slots",
                    header.frames_offset()
                ),
            ))
        }
        Ok(header) => Ok(Some(header)),
        Err(HeaderError::UnsupportedVersion(version)) => Err(WalError::UnsupportedVersion {
            file: path.to_path_buf(),
            version,
        }),
        Err(HeaderError::BadMagic | HeaderError::BadCrc | HeaderError::Short)
            if unwritten_if_invalid =>
        {
            Ok(None)
        }
        Err(e) => Err(corrupt(path, 0, format!("invalid segment header: {e}"))),
    }
}

/// Checks that a segment starts right after the previous segment's last LSN.
fn check_lsn_continuity(
    path: &Path,
    previous_last: Option<u64>,
    prev_last_lsn: u64,
) -> Result<(), WalError> {
    let Some(prev_last) = previous_last else {
        return Ok(());
    };
    if prev_last_lsn > prev_last {
        return Err(WalError::MissingSegment {
            file: path.to_path_buf(),
            reason: format!(
                "segment starts after LSN {prev_last_lsn} but the previous one ends at LSN {prev_last}: LSNs {}..={prev_last_lsn} missing",
                prev_last + 1
            ),
        });
    }
    if prev_last_lsn < prev_last {
        return Err(corrupt(
            path,
            0,
            format!(
                "segment starts after LSN {prev_last_lsn} but the previous one already ends at LSN {prev_last}"
            ),
        ));
    }
    Ok(())
}

/// Read-only check of a log directory that may be untrusted: no writes, no mmap, every length
/// checked against limits and the bytes remaining before anything is allocated. The directory
/// lock is taken for the duration if `dir/LOCK` exists and is free; otherwise the scan runs
/// unlocked (a live log may then show its in-flight tail as torn; the high-water marks are
/// read before the directory is listed, so a roll and a newer `SYNCED` meanwhile cannot make
/// a healthy live log look damaged).
///
/// `record_bytes_max` is the largest record body accepted (clamped to
/// [`RECORD_BYTES_MAX_LIMIT`](crate::format::RECORD_BYTES_MAX_LIMIT)); `visit` sees every
/// valid record in LSN order — on an error, those before the damage.
///
/// An empty or missing-`META` directory with no segments is an empty log. Segments below the
/// `TRIM` mark (left over by an interrupted removal) are not checked; they are listed in
/// [`ScanReport::leftover_segments`].
///
/// # Errors
/// [`WalError::Corrupt`] (file and offset of the damage), [`WalError::ForeignSegment`],
/// [`WalError::MissingSegment`], [`WalError::UnsupportedVersion`], or [`WalError::Io`]. A torn
/// tail is not an error: it is reported in [`ScanReport::torn_tail`].
pub fn scan(
    storage: &dyn Storage,
    dir: &Path,
    record_bytes_max: u32,
    visit: &mut dyn FnMut(RecordView<'_>),
) -> Result<ScanReport, WalError> {
    let mut adapter = |view: RecordView<'_>, _: &Path, _: u64| {
        visit(view);
        Ok(())
    };
    scan_with(storage, dir, record_bytes_max, &mut adapter)
}

/// Where [`scan_located`] found a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPlace<'a> {
    /// The segment file holding the record.
    pub file: &'a Path,
    /// Byte offset in `file` of the DATA frame holding the record.
    pub frame_offset: u64,
    /// Byte offset in `file` of the record itself: its 5-byte record header (type, body
    /// length), which its body follows.
    pub offset: u64,
}

/// [`scan`], telling `visit` where each record lies: its segment file, the offset of its
/// frame and its own offset. For tools that show a log record by record (`kairos dump`).
///
/// # Errors
/// As [`scan`].
pub fn scan_located(
    storage: &dyn Storage,
    dir: &Path,
    record_bytes_max: u32,
    visit: &mut dyn FnMut(RecordView<'_>, RecordPlace<'_>),
) -> Result<ScanReport, WalError> {
    // The analysis names each record's file and frame; records follow each other in the
    // frame body from its header on (`format::for_each_record` checked the whole frame
    // before handing out its first record). One path is kept per segment, not per record.
    let mut file: Option<PathBuf> = None;
    let mut frame_offset = 0u64;
    let mut next = 0u64;
    let mut adapter = |view: RecordView<'_>, path: &Path, frame: u64| {
        let same_file = file.as_deref() == Some(path);
        if !same_file {
            file = Some(path.to_path_buf());
        }
        if !same_file || frame != frame_offset {
            frame_offset = frame;
            next = frame + FRAME_HEADER_BYTES as u64;
        }
        let offset = next;
        next = offset + RECORD_HEADER_BYTES as u64 + view.body.len() as u64;
        visit(
            view,
            RecordPlace {
                file: path,
                frame_offset: frame,
                offset,
            },
        );
        Ok(())
    };
    scan_with(storage, dir, record_bytes_max, &mut adapter)
}

fn scan_with(
    storage: &dyn Storage,
    dir: &Path,
    record_bytes_max: u32,
    visit: &mut Visit<'_>,
) -> Result<ScanReport, WalError> {
    let record_bytes_max = record_bytes_max.min(format::RECORD_BYTES_MAX_LIMIT);
    let lock_path = dir.join(format::LOCK_FILE_NAME);
    let _lock = match storage.exists(&lock_path) {
        Ok(true) => storage.lock(&lock_path).ok(),
        _ => None,
    };
    let store_id = match read_store_id(storage, dir)? {
        Some(id) => id,
        None => {
            let (segments, _) = list_dir(storage, dir)?;
            check_meta_absent(storage, dir, &segments)?;
            return Ok(ScanReport::default());
        }
    };
    let analysis = analyze(storage, dir, &store_id, record_bytes_max, visit)?;
    let torn_mark_slot = analysis.tail.as_ref().and_then(|tail| {
        let index = tail
            .slots
            .as_ref()?
            .iter()
            .position(|slot| *slot == MarkSlot::Torn)?;
        Some(TornMarkSlot {
            file: tail.path.clone(),
            index,
            offset: (MARK_SLOTS_OFFSET + index * MARK_SLOT_BYTES) as u64,
        })
    });
    Ok(ScanReport {
        segments: analysis.segments,
        records: analysis.records,
        last_lsn: analysis.last_lsn,
        clean_shutdown: analysis.clean_shutdown,
        high_water_lsn: analysis.high_water_lsn,
        torn_tail: analysis.torn_tail,
        leftover_segments: analysis.leftovers,
        torn_mark_slot,
    })
}
