//! The on-disk format, byte by byte: constants and codecs for the `META` file, the `TRIM`,
//! `CLOSED` and `SYNCED` bound files, segment headers, frames and records. `wal/FORMAT.md` is the specification; every constant here mirrors a
//! line of it, and each offset is built from the previous one so the two cannot drift apart
//! silently (the golden-vector test reads FORMAT.md itself).
//!
//! All integers are little-endian. Checksums are CRC-32 (IEEE 802.3, the `crc32fast`
//! polynomial), as in etcd's WAL and Kafka's v0/v1 messages.
//!
//! Sources followed: LevelDB `doc/log_format.md` (framing, type byte), etcd `wal/` (segment
//! names `{seq:016x}-{index:016x}`, tmp + rename + dir fsync), RocksDB predecessor-WAL info
//! (previous segment's last LSN in each header, to detect a missing file), fjall's journal
//! (batch = atomic frame), and PAR (Alagappan et al., FAST'18) for the `synced_lsn` field that
//! lets recovery tell a torn write from corruption.

use crate::Lsn;

/// Version of `META`, `TRIM`, `CLOSED` and `SYNCED`: 1, the first (their layout has not
/// changed since).
pub const FORMAT_VERSION: u16 = 1;

/// Version of the segment header written by this build: 2 adds the two mark slots after the
/// 64-byte header (frames start at [`SEGMENT_FRAMES_OFFSET`]). Version 1 segments (no slots,
/// frames from offset 64) are still read, and appended to until they roll.
pub const SEGMENT_FORMAT_VERSION: u16 = 2;

/// The oldest segment header version this build reads.
pub const SEGMENT_FORMAT_VERSION_MIN: u16 = 1;

/// A random identity of one log directory, chosen at creation and written in `META` and every
/// segment header, so a segment copied from another directory is refused.
pub type StoreId = [u8; 16];

/// File name of the store identity file inside the log directory.
pub const META_FILE_NAME: &str = "META";
/// File name of the lock file inside the log directory.
pub const LOCK_FILE_NAME: &str = "LOCK";
/// Suffix of segment files.
pub const SEGMENT_SUFFIX: &str = ".seg";
/// Suffix of files being created; leftovers are removed when the log opens.
pub const TMP_SUFFIX: &str = ".tmp";
/// File name of the low-water mark: the oldest segment that must still exist (written by
/// `Wal::remove_segments_before` before it deletes anything). Absent: segment 1 must exist.
pub const TRIM_FILE_NAME: &str = "TRIM";
/// File name of the high-water mark: the newest segment and last LSN at the last clean close.
/// Absent: no clean close recorded (nothing is checked).
pub const CLOSED_FILE_NAME: &str = "CLOSED";
/// File name of the running high-water mark: the newest segment and the highest LSN known
/// fdatasynced, written at each segment roll, at each open (with `proof_before_ack`), and
/// when the writer goes idle (`WalOptions::synced_mark_delay` after a sync that nothing
/// followed). Absent: none recorded (nothing is checked).
pub const SYNCED_FILE_NAME: &str = "SYNCED";

// ---------------------------------------------------------------------------------------------
// META: 32 bytes.

/// Magic at the start of `META`.
pub const META_MAGIC: [u8; 8] = *b"KAIROSMT";
/// `META` offset of the magic (8 bytes).
pub const META_MAGIC_OFFSET: usize = 0;
/// `META` offset of `format_version` (u16).
pub const META_VERSION_OFFSET: usize = META_MAGIC_OFFSET + META_MAGIC.len();
/// `META` offset of `flags` (u16, must be 0).
pub const META_FLAGS_OFFSET: usize = META_VERSION_OFFSET + 2;
/// `META` offset of `store_id` (16 bytes).
pub const META_STORE_ID_OFFSET: usize = META_FLAGS_OFFSET + 2;
/// `META` offset of `crc` (u32, CRC-32 of bytes `0..META_CRC_OFFSET`).
pub const META_CRC_OFFSET: usize = META_STORE_ID_OFFSET + 16;
/// Size of `META` in bytes.
pub const META_BYTES: usize = META_CRC_OFFSET + 4;
const _: () = assert!(META_BYTES == 32);

// ---------------------------------------------------------------------------------------------
// Segment header: 64 bytes.

/// Magic at the start of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"KAIROSWL";
/// Segment header offset of the magic (8 bytes).
pub const SEG_MAGIC_OFFSET: usize = 0;
/// Segment header offset of `format_version` (u16).
pub const SEG_VERSION_OFFSET: usize = SEG_MAGIC_OFFSET + SEGMENT_MAGIC.len();
/// Segment header offset of `header_bytes` (u16: where the first frame starts — 64 in version 1,
/// [`SEGMENT_FRAMES_OFFSET`] in version 2).
pub const SEG_HEADER_BYTES_OFFSET: usize = SEG_VERSION_OFFSET + 2;
/// Segment header offset of `flags` (u32, must be 0).
pub const SEG_FLAGS_OFFSET: usize = SEG_HEADER_BYTES_OFFSET + 2;
/// Segment header offset of `store_id` (16 bytes).
pub const SEG_STORE_ID_OFFSET: usize = SEG_FLAGS_OFFSET + 4;
/// Segment header offset of `seq` (u64, 1 for the first segment ever, +1 per roll).
pub const SEG_SEQ_OFFSET: usize = SEG_STORE_ID_OFFSET + 16;
/// Segment header offset of `prev_last_lsn` (u64): the last LSN of the previous segment (0 for
/// the first); the first LSN of this segment is `prev_last_lsn + 1`.
pub const SEG_PREV_LAST_LSN_OFFSET: usize = SEG_SEQ_OFFSET + 8;
/// Segment header offset of `created_ms` (u64, Unix ms; informational only).
pub const SEG_CREATED_MS_OFFSET: usize = SEG_PREV_LAST_LSN_OFFSET + 8;
/// Segment header offset of `header_crc` (u32, CRC-32 of bytes `0..SEG_HEADER_CRC_OFFSET`).
pub const SEG_HEADER_CRC_OFFSET: usize = SEG_CREATED_MS_OFFSET + 8;
/// Segment header offset of `reserved` (u32, must be 0).
pub const SEG_RESERVED_OFFSET: usize = SEG_HEADER_CRC_OFFSET + 4;
/// Size of the fixed segment header in bytes (the first frame of a version-1 segment starts
/// here; a version-2 segment has its mark slots here).
pub const SEGMENT_HEADER_BYTES: usize = SEG_RESERVED_OFFSET + 4;
const _: () = assert!(SEGMENT_HEADER_BYTES == 64);

// ---------------------------------------------------------------------------------------------
// Mark slots (segment version 2): two 32-byte slots after the header, rewritten in place.

/// Offset of the first mark slot in a version-2 segment.
pub const MARK_SLOTS_OFFSET: usize = SEGMENT_HEADER_BYTES;
/// Number of mark slots; the writer alternates between them, so a torn slot write leaves the
/// other slot readable.
pub const MARK_SLOT_COUNT: usize = 2;
/// Mark slot offset of `synced_lsn` (u64: every LSN up to it was fdatasynced).
pub const SLOT_SYNCED_LSN_OFFSET: usize = 0;
/// Mark slot offset of `seq` (u64: the segment's own `seq`, binding the slot to its file).
pub const SLOT_SEQ_OFFSET: usize = SLOT_SYNCED_LSN_OFFSET + 8;
/// Mark slot offset of `reserved` (8 bytes, 0).
pub const SLOT_RESERVED_OFFSET: usize = SLOT_SEQ_OFFSET + 8;
/// Mark slot offset of `slot_crc` (u32, CRC-32 of slot bytes `0..SLOT_CRC_OFFSET`).
pub const SLOT_CRC_OFFSET: usize = SLOT_RESERVED_OFFSET + 8;
/// Mark slot offset of the trailing `reserved` (u32, 0).
pub const SLOT_RESERVED2_OFFSET: usize = SLOT_CRC_OFFSET + 4;
/// Size of one mark slot.
pub const MARK_SLOT_BYTES: usize = SLOT_RESERVED2_OFFSET + 4;
const _: () = assert!(MARK_SLOT_BYTES == 32);
/// Where the first frame of a version-2 segment starts (its `header_bytes`): the header and
/// both slots.
pub const SEGMENT_FRAMES_OFFSET: usize = MARK_SLOTS_OFFSET + MARK_SLOT_COUNT * MARK_SLOT_BYTES;
const _: () = assert!(SEGMENT_FRAMES_OFFSET == 128);

// ---------------------------------------------------------------------------------------------
// Frame header: 32 bytes, then `body_bytes` of body.

/// Frame header offset of `body_bytes` (u32).
pub const FRAME_BODY_BYTES_OFFSET: usize = 0;
/// Frame header offset of `crc` (u32): CRC-32 of header bytes `0..4` followed by header bytes
/// `8..32` and the body.
pub const FRAME_CRC_OFFSET: usize = FRAME_BODY_BYTES_OFFSET + 4;
/// Frame header offset of `kind` (u8, see [`FrameKind`]).
pub const FRAME_KIND_OFFSET: usize = FRAME_CRC_OFFSET + 4;
/// Frame header offset of `reserved` (3 bytes, must be 0).
pub const FRAME_RESERVED_OFFSET: usize = FRAME_KIND_OFFSET + 1;
/// Frame header offset of `record_count` (u32).
pub const FRAME_RECORD_COUNT_OFFSET: usize = FRAME_RESERVED_OFFSET + 3;
/// Frame header offset of `first_lsn` (u64): LSN of the first record (for SEAL, CLOSE and MARK:
/// the next LSN to be assigned).
pub const FRAME_FIRST_LSN_OFFSET: usize = FRAME_RECORD_COUNT_OFFSET + 4;
/// Frame header offset of `synced_lsn` (u64): the highest LSN known to be fdatasynced when the
/// frame was written.
pub const FRAME_SYNCED_LSN_OFFSET: usize = FRAME_FIRST_LSN_OFFSET + 8;
/// Size of a frame header in bytes.
pub const FRAME_HEADER_BYTES: usize = FRAME_SYNCED_LSN_OFFSET + 8;
const _: () = assert!(FRAME_HEADER_BYTES == 32);

/// Largest frame body (all records of one append, with their record headers), in bytes.
/// Recovery refuses a larger `body_bytes` before reading or allocating anything.
pub const FRAME_BODY_BYTES_MAX: u32 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Record inside a DATA frame body: 5-byte header, then the body.

/// Record header offset of `record_type` (u8).
pub const RECORD_TYPE_OFFSET: usize = 0;
/// Record header offset of `body_len` (u32).
pub const RECORD_BODY_LEN_OFFSET: usize = RECORD_TYPE_OFFSET + 1;
/// Size of a record header in bytes.
pub const RECORD_HEADER_BYTES: usize = RECORD_BODY_LEN_OFFSET + 4;
const _: () = assert!(RECORD_HEADER_BYTES == 5);

/// Largest value accepted for `WalOptions::record_bytes_max`: one record must fit in a frame.
pub const RECORD_BYTES_MAX_LIMIT: u32 = FRAME_BODY_BYTES_MAX - RECORD_HEADER_BYTES as u32;
const _: () = assert!(crate::RECORD_BYTES_MAX_DEFAULT <= RECORD_BYTES_MAX_LIMIT);

// ---------------------------------------------------------------------------------------------
// Bound files (`TRIM`, `CLOSED`, `SYNCED`): 48 bytes, one layout, told apart by the magic.

/// Magic at the start of `TRIM`.
pub const TRIM_MAGIC: [u8; 8] = *b"KAIROSTR";
/// Magic at the start of `CLOSED`.
pub const CLOSED_MAGIC: [u8; 8] = *b"KAIROSCL";
/// Magic at the start of `SYNCED`.
pub const SYNCED_MAGIC: [u8; 8] = *b"KAIROSSY";
/// Bound file offset of the magic (8 bytes).
pub const BOUND_MAGIC_OFFSET: usize = 0;
/// Bound file offset of `format_version` (u16).
pub const BOUND_VERSION_OFFSET: usize = BOUND_MAGIC_OFFSET + TRIM_MAGIC.len();
/// Bound file offset of `flags` (u16, must be 0).
pub const BOUND_FLAGS_OFFSET: usize = BOUND_VERSION_OFFSET + 2;
/// Bound file offset of `store_id` (16 bytes, equal to META's).
pub const BOUND_STORE_ID_OFFSET: usize = BOUND_FLAGS_OFFSET + 2;
/// Bound file offset of `seq` (u64, at least 1).
pub const BOUND_SEQ_OFFSET: usize = BOUND_STORE_ID_OFFSET + 16;
/// Bound file offset of `lsn` (u64): `TRIM` — first LSN of segment `seq` (at least 1);
/// `CLOSED` — last LSN of the log at the clean close (0 if it held none); `SYNCED` — highest
/// LSN fdatasynced when it was written.
pub const BOUND_LSN_OFFSET: usize = BOUND_SEQ_OFFSET + 8;
/// Bound file offset of `crc` (u32, CRC-32 of bytes `0..BOUND_CRC_OFFSET`).
pub const BOUND_CRC_OFFSET: usize = BOUND_LSN_OFFSET + 8;
/// Size of a bound file in bytes.
pub const BOUND_FILE_BYTES: usize = BOUND_CRC_OFFSET + 4;
const _: () = assert!(BOUND_FILE_BYTES == 48);
const _: () = assert!(CLOSED_MAGIC.len() == TRIM_MAGIC.len());
const _: () = assert!(SYNCED_MAGIC.len() == TRIM_MAGIC.len());

/// The contents of `TRIM`: segment `seq`, whose first record has LSN `first_lsn`, is the
/// oldest segment that must exist; older ones are leftovers of a removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trim {
    /// Identity of the log directory (equal to META's).
    pub store_id: StoreId,
    /// Sequence number of the oldest segment that must exist (at least 1).
    pub seq: u64,
    /// First LSN of that segment (at least 1).
    pub first_lsn: Lsn,
}

/// The contents of `CLOSED`: at the last clean close the newest segment was `seq` and the log
/// ended at `last_lsn`, both durable. The log only grows past them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed {
    /// Identity of the log directory (equal to META's).
    pub store_id: StoreId,
    /// Sequence number of the newest segment at the close (at least 1).
    pub seq: u64,
    /// Last LSN of the log at the close (0 if it held no record).
    pub last_lsn: Lsn,
}

/// The contents of `SYNCED`: when it was last written, the newest segment was `seq` and every
/// LSN up to `synced_lsn` was fdatasynced. Like [`Closed`], a high-water mark the log only
/// grows past; unlike it, written while the log runs — at each segment roll, at each open with
/// `proof_before_ack`, and by the writer a configurable delay after a sync that no append
/// followed — so that damage to synced records is recognisable after an unclean shutdown too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synced {
    /// Identity of the log directory (equal to META's).
    pub store_id: StoreId,
    /// Sequence number of the newest segment when it was written (at least 1).
    pub seq: u64,
    /// Highest LSN fdatasynced when it was written.
    pub synced_lsn: Lsn,
}

fn encode_bound(magic: &[u8; 8], store_id: &StoreId, seq: u64, lsn: u64) -> [u8; BOUND_FILE_BYTES] {
    let mut b = [0u8; BOUND_FILE_BYTES];
    b[BOUND_MAGIC_OFFSET..BOUND_VERSION_OFFSET].copy_from_slice(magic);
    b[BOUND_VERSION_OFFSET..BOUND_FLAGS_OFFSET].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[BOUND_FLAGS_OFFSET..BOUND_STORE_ID_OFFSET].copy_from_slice(&0u16.to_le_bytes());
    b[BOUND_STORE_ID_OFFSET..BOUND_SEQ_OFFSET].copy_from_slice(store_id);
    b[BOUND_SEQ_OFFSET..BOUND_LSN_OFFSET].copy_from_slice(&seq.to_le_bytes());
    b[BOUND_LSN_OFFSET..BOUND_CRC_OFFSET].copy_from_slice(&lsn.to_le_bytes());
    let crc = crc32(&b[..BOUND_CRC_OFFSET]);
    b[BOUND_CRC_OFFSET..BOUND_FILE_BYTES].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Checks length, magic, version (before the CRC, so a future layout is named as such), CRC,
/// flags and `seq >= 1`; returns `(store_id, seq, lsn)`.
fn decode_bound(magic: &[u8; 8], bytes: &[u8]) -> Result<(StoreId, u64, u64), HeaderError> {
    if bytes.len() < BOUND_FILE_BYTES {
        return Err(HeaderError::Short);
    }
    if bytes.len() > BOUND_FILE_BYTES {
        return Err(HeaderError::Invalid("longer than 48 bytes"));
    }
    if bytes[BOUND_MAGIC_OFFSET..BOUND_VERSION_OFFSET] != magic[..] {
        return Err(HeaderError::BadMagic);
    }
    let version = u16_at(bytes, BOUND_VERSION_OFFSET);
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnsupportedVersion(version));
    }
    if crc32(&bytes[..BOUND_CRC_OFFSET]) != u32_at(bytes, BOUND_CRC_OFFSET) {
        return Err(HeaderError::BadCrc);
    }
    if u16_at(bytes, BOUND_FLAGS_OFFSET) != 0 {
        return Err(HeaderError::Invalid("flags are not 0"));
    }
    let seq = u64_at(bytes, BOUND_SEQ_OFFSET);
    if seq == 0 {
        return Err(HeaderError::Invalid("seq is 0"));
    }
    let mut store_id = [0u8; 16];
    store_id.copy_from_slice(&bytes[BOUND_STORE_ID_OFFSET..BOUND_SEQ_OFFSET]);
    Ok((store_id, seq, u64_at(bytes, BOUND_LSN_OFFSET)))
}

impl Trim {
    /// Encodes the 48-byte `TRIM` file.
    pub fn encode(&self) -> [u8; BOUND_FILE_BYTES] {
        encode_bound(&TRIM_MAGIC, &self.store_id, self.seq, self.first_lsn.0)
    }

    /// Decodes and checks a `TRIM` file (exactly [`BOUND_FILE_BYTES`] bytes).
    ///
    /// # Errors
    /// [`HeaderError`]: wrong size or magic, unsupported version, checksum mismatch, non-zero
    /// flags, `seq` 0 or `first_lsn` 0.
    pub fn decode(bytes: &[u8]) -> Result<Trim, HeaderError> {
        let (store_id, seq, first_lsn) = decode_bound(&TRIM_MAGIC, bytes)?;
        if first_lsn == 0 {
            return Err(HeaderError::Invalid("first_lsn is 0"));
        }
        Ok(Trim {
            store_id,
            seq,
            first_lsn: Lsn(first_lsn),
        })
    }
}

impl Closed {
    /// Encodes the 48-byte `CLOSED` file.
    pub fn encode(&self) -> [u8; BOUND_FILE_BYTES] {
        encode_bound(&CLOSED_MAGIC, &self.store_id, self.seq, self.last_lsn.0)
    }

    /// Decodes and checks a `CLOSED` file (exactly [`BOUND_FILE_BYTES`] bytes).
    ///
    /// # Errors
    /// [`HeaderError`]: wrong size or magic, unsupported version, checksum mismatch, non-zero
    /// flags or `seq` 0.
    pub fn decode(bytes: &[u8]) -> Result<Closed, HeaderError> {
        let (store_id, seq, last_lsn) = decode_bound(&CLOSED_MAGIC, bytes)?;
        Ok(Closed {
            store_id,
            seq,
            last_lsn: Lsn(last_lsn),
        })
    }
}

impl Synced {
    /// Encodes the 48-byte `SYNCED` file.
    pub fn encode(&self) -> [u8; BOUND_FILE_BYTES] {
        encode_bound(&SYNCED_MAGIC, &self.store_id, self.seq, self.synced_lsn.0)
    }

    /// Decodes and checks a `SYNCED` file (exactly [`BOUND_FILE_BYTES`] bytes).
    ///
    /// # Errors
    /// [`HeaderError`]: wrong size or magic, unsupported version, checksum mismatch, non-zero
    /// flags or `seq` 0.
    pub fn decode(bytes: &[u8]) -> Result<Synced, HeaderError> {
        let (store_id, seq, synced_lsn) = decode_bound(&SYNCED_MAGIC, bytes)?;
        Ok(Synced {
            store_id,
            seq,
            synced_lsn: Lsn(synced_lsn),
        })
    }
}

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// One append: `record_count >= 1` records, written and recovered atomically.
    Data = 1,
    /// The last frame of a rolled segment, written after everything before it was synced, then
    /// synced itself. Nothing follows it in its segment.
    Seal = 2,
    /// Written at clean close after a sync, then synced.
    Close = 3,
    /// Written (not synced) after a group commit's fdatasync when nothing else is queued, so
    /// the sync is on record for recovery's durable mark.
    Mark = 4,
}

impl FrameKind {
    /// The kind for a `kind` byte, or `None` if unknown.
    pub fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::Seal),
            3 => Some(FrameKind::Close),
            4 => Some(FrameKind::Mark),
            _ => None,
        }
    }
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(b)
}

fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Why a `META` file or segment header was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than the fixed size.
    #[error("shorter than the fixed header size")]
    Short,
    /// The magic does not match.
    #[error("wrong magic")]
    BadMagic,
    /// A format version this build cannot read.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u16),
    /// The checksum does not match.
    #[error("header checksum mismatch")]
    BadCrc,
    /// A field holds a value the format forbids (named in the text).
    #[error("{0}")]
    Invalid(&'static str),
}

/// Encodes `META` for `store_id`.
pub fn encode_meta(store_id: &StoreId) -> [u8; META_BYTES] {
    let mut b = [0u8; META_BYTES];
    b[META_MAGIC_OFFSET..META_VERSION_OFFSET].copy_from_slice(&META_MAGIC);
    b[META_VERSION_OFFSET..META_FLAGS_OFFSET].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[META_FLAGS_OFFSET..META_STORE_ID_OFFSET].copy_from_slice(&0u16.to_le_bytes());
    b[META_STORE_ID_OFFSET..META_CRC_OFFSET].copy_from_slice(store_id);
    let crc = crc32(&b[..META_CRC_OFFSET]);
    b[META_CRC_OFFSET..META_BYTES].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes `META` and returns the store id.
///
/// # Errors
/// [`HeaderError`] if `bytes` is not exactly a valid `META` of a supported version.
pub fn decode_meta(bytes: &[u8]) -> Result<StoreId, HeaderError> {
    if bytes.len() < META_BYTES {
        return Err(HeaderError::Short);
    }
    if bytes.len() > META_BYTES {
        return Err(HeaderError::Invalid("META is longer than 32 bytes"));
    }
    if bytes[META_MAGIC_OFFSET..META_VERSION_OFFSET] != META_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let version = u16_at(bytes, META_VERSION_OFFSET);
    if crc32(&bytes[..META_CRC_OFFSET]) != u32_at(bytes, META_CRC_OFFSET) {
        return Err(HeaderError::BadCrc);
    }
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnsupportedVersion(version));
    }
    if u16_at(bytes, META_FLAGS_OFFSET) != 0 {
        return Err(HeaderError::Invalid("META flags are not 0"));
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&bytes[META_STORE_ID_OFFSET..META_CRC_OFFSET]);
    Ok(id)
}

/// The fields of a segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Header version: [`SEGMENT_FORMAT_VERSION`] for segments this build creates, 1 for older
    /// ones (no mark slots).
    pub format_version: u16,
    /// Identity of the log directory the segment belongs to.
    pub store_id: StoreId,
    /// Segment sequence number: 1 for the first segment, +1 per roll.
    pub seq: u64,
    /// Last LSN of the previous segment (0 if none); this segment's first LSN is one more.
    pub prev_last_lsn: u64,
    /// Creation time in Unix milliseconds; informational only.
    pub created_ms: u64,
}

impl SegmentHeader {
    /// The LSN the first record of this segment gets.
    pub fn first_lsn(&self) -> Lsn {
        Lsn(self.prev_last_lsn.saturating_add(1))
    }

    /// Where this segment's first frame starts: 64 for version 1, [`SEGMENT_FRAMES_OFFSET`]
    /// (header and mark slots) for version 2.
    pub fn frames_offset(&self) -> u64 {
        if self.has_mark_slots() {
            SEGMENT_FRAMES_OFFSET as u64
        } else {
            SEGMENT_HEADER_BYTES as u64
        }
    }

    /// Whether the segment has mark slots (version 2 and later).
    pub fn has_mark_slots(&self) -> bool {
        self.format_version >= 2
    }

    /// Encodes the 64-byte header (`header_bytes` is [`SegmentHeader::frames_offset`]; a
    /// version-2 segment's file continues with its two mark slots, zeroed at creation).
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[SEG_MAGIC_OFFSET..SEG_VERSION_OFFSET].copy_from_slice(&SEGMENT_MAGIC);
        b[SEG_VERSION_OFFSET..SEG_HEADER_BYTES_OFFSET]
            .copy_from_slice(&self.format_version.to_le_bytes());
        b[SEG_HEADER_BYTES_OFFSET..SEG_FLAGS_OFFSET]
            .copy_from_slice(&(self.frames_offset() as u16).to_le_bytes());
        b[SEG_FLAGS_OFFSET..SEG_STORE_ID_OFFSET].copy_from_slice(&0u32.to_le_bytes());
        b[SEG_STORE_ID_OFFSET..SEG_SEQ_OFFSET].copy_from_slice(&self.store_id);
        b[SEG_SEQ_OFFSET..SEG_PREV_LAST_LSN_OFFSET].copy_from_slice(&self.seq.to_le_bytes());
        b[SEG_PREV_LAST_LSN_OFFSET..SEG_CREATED_MS_OFFSET]
            .copy_from_slice(&self.prev_last_lsn.to_le_bytes());
        b[SEG_CREATED_MS_OFFSET..SEG_HEADER_CRC_OFFSET]
            .copy_from_slice(&self.created_ms.to_le_bytes());
        let crc = crc32(&b[..SEG_HEADER_CRC_OFFSET]);
        b[SEG_HEADER_CRC_OFFSET..SEG_RESERVED_OFFSET].copy_from_slice(&crc.to_le_bytes());
        b[SEG_RESERVED_OFFSET..SEGMENT_HEADER_BYTES].copy_from_slice(&0u32.to_le_bytes());
        b
    }

    /// Decodes and checks a header from the first [`SEGMENT_HEADER_BYTES`] of `bytes`.
    ///
    /// # Errors
    /// [`HeaderError`]: too short, wrong magic, unsupported version (checked before the CRC, so
    /// a future layout is reported as such), checksum mismatch, or a forbidden field value.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderError> {
        if bytes.len() < SEGMENT_HEADER_BYTES {
            return Err(HeaderError::Short);
        }
        if bytes[SEG_MAGIC_OFFSET..SEG_VERSION_OFFSET] != SEGMENT_MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16_at(bytes, SEG_VERSION_OFFSET);
        if !(SEGMENT_FORMAT_VERSION_MIN..=SEGMENT_FORMAT_VERSION).contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        if crc32(&bytes[..SEG_HEADER_CRC_OFFSET]) != u32_at(bytes, SEG_HEADER_CRC_OFFSET) {
            return Err(HeaderError::BadCrc);
        }
        let header_bytes = usize::from(u16_at(bytes, SEG_HEADER_BYTES_OFFSET));
        if version == 1 && header_bytes != SEGMENT_HEADER_BYTES {
            return Err(HeaderError::Invalid("header_bytes is not 64 (version 1)"));
        }
        if version >= 2 && header_bytes != SEGMENT_FRAMES_OFFSET {
            return Err(HeaderError::Invalid("header_bytes is not 128 (version 2)"));
        }
        if u32_at(bytes, SEG_FLAGS_OFFSET) != 0 {
            return Err(HeaderError::Invalid("flags are not 0"));
        }
        if u32_at(bytes, SEG_RESERVED_OFFSET) != 0 {
            return Err(HeaderError::Invalid("reserved bytes are not 0"));
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(&bytes[SEG_STORE_ID_OFFSET..SEG_SEQ_OFFSET]);
        let header = SegmentHeader {
            format_version: version,
            store_id,
            seq: u64_at(bytes, SEG_SEQ_OFFSET),
            prev_last_lsn: u64_at(bytes, SEG_PREV_LAST_LSN_OFFSET),
            created_ms: u64_at(bytes, SEG_CREATED_MS_OFFSET),
        };
        if header.seq == 0 {
            return Err(HeaderError::Invalid("seq is 0"));
        }
        if header.prev_last_lsn == u64::MAX {
            return Err(HeaderError::Invalid("prev_last_lsn is u64::MAX"));
        }
        Ok(header)
    }
}

/// A mark slot of a version-2 segment, as read.
///
/// The writer records, in one slot, the highest LSN that was fdatasynced *before* the sync it
/// is about to issue, and alternates between the two slots; so after that sync the slot is
/// durable, and a slot never claims an LSN that was not already durable when it was written.
/// Recovery takes the highest valid slot as a lower bound of what the segment held durably —
/// evidence that survives a cut of the segment's tail, where the `synced_lsn` of later frames
/// does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkSlot {
    /// All 32 bytes zero: never written.
    Empty,
    /// A slot whose checksum matches.
    Mark {
        /// Every LSN up to this one was fdatasynced before the slot was written.
        synced_lsn: u64,
        /// The `seq` of the segment the slot was written in.
        seq: u64,
    },
    /// Neither zero nor a matching checksum: torn while being written (or damaged).
    Torn,
}

impl MarkSlot {
    /// Encodes a slot recording `synced_lsn` in segment `seq`.
    pub fn encode(seq: u64, synced_lsn: u64) -> [u8; MARK_SLOT_BYTES] {
        let mut b = [0u8; MARK_SLOT_BYTES];
        b[SLOT_SYNCED_LSN_OFFSET..SLOT_SEQ_OFFSET].copy_from_slice(&synced_lsn.to_le_bytes());
        b[SLOT_SEQ_OFFSET..SLOT_RESERVED_OFFSET].copy_from_slice(&seq.to_le_bytes());
        let crc = crc32(&b[..SLOT_CRC_OFFSET]);
        b[SLOT_CRC_OFFSET..SLOT_RESERVED2_OFFSET].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a slot from the first [`MARK_SLOT_BYTES`] of `bytes` (fewer bytes: `Torn`).
    /// Field rules (reserved bytes zero) are part of validity: a slot that breaks them with a
    /// matching checksum is reported as `Torn` too — the caller decides what a bad slot means.
    pub fn decode(bytes: &[u8]) -> MarkSlot {
        let Some(b) = bytes.get(..MARK_SLOT_BYTES) else {
            return MarkSlot::Torn;
        };
        if b.iter().all(|&x| x == 0) {
            return MarkSlot::Empty;
        }
        let reserved_zero = b[SLOT_RESERVED_OFFSET..SLOT_CRC_OFFSET]
            .iter()
            .all(|&x| x == 0)
            && b[SLOT_RESERVED2_OFFSET..].iter().all(|&x| x == 0);
        if !reserved_zero || crc32(&b[..SLOT_CRC_OFFSET]) != u32_at(b, SLOT_CRC_OFFSET) {
            return MarkSlot::Torn;
        }
        MarkSlot::Mark {
            synced_lsn: u64_at(b, SLOT_SYNCED_LSN_OFFSET),
            seq: u64_at(b, SLOT_SEQ_OFFSET),
        }
    }
}

/// The highest LSN the mark slots `slots` (a segment's, as read) record as synced; 0 if
/// none does (empty or torn slots record nothing). Recovery's proof of durability from the
/// slots (FORMAT.md, "Mark slots").
pub fn slots_mark(slots: &[MarkSlot]) -> u64 {
    slots
        .iter()
        .map(|slot| match slot {
            MarkSlot::Mark { synced_lsn, .. } => *synced_lsn,
            MarkSlot::Empty | MarkSlot::Torn => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The fields of a frame header (the CRC is computed, not stored here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Bytes of body after the 32-byte header.
    pub body_bytes: u32,
    /// The `kind` byte as found (see [`FrameKind::from_byte`]).
    pub kind: u8,
    /// The three reserved bytes as found (0 in a valid frame).
    pub reserved: [u8; 3],
    /// Records in the body.
    pub record_count: u32,
    /// LSN of the first record, or the next LSN for SEAL/CLOSE/MARK.
    pub first_lsn: u64,
    /// Highest LSN known fdatasynced when the frame was written.
    pub synced_lsn: u64,
    /// The stored CRC.
    pub crc: u32,
}

impl FrameHeader {
    /// Reads the header fields from the first [`FRAME_HEADER_BYTES`] of `bytes` (no checks).
    ///
    /// # Panics
    /// If `bytes` is shorter than [`FRAME_HEADER_BYTES`] (a caller bug).
    pub fn parse(bytes: &[u8]) -> FrameHeader {
        assert!(
            bytes.len() >= FRAME_HEADER_BYTES,
            "frame header needs {FRAME_HEADER_BYTES} bytes, got {}",
            bytes.len()
        );
        FrameHeader {
            body_bytes: u32_at(bytes, FRAME_BODY_BYTES_OFFSET),
            crc: u32_at(bytes, FRAME_CRC_OFFSET),
            kind: bytes[FRAME_KIND_OFFSET],
            reserved: [
                bytes[FRAME_RESERVED_OFFSET],
                bytes[FRAME_RESERVED_OFFSET + 1],
                bytes[FRAME_RESERVED_OFFSET + 2],
            ],
            record_count: u32_at(bytes, FRAME_RECORD_COUNT_OFFSET),
            first_lsn: u64_at(bytes, FRAME_FIRST_LSN_OFFSET),
            synced_lsn: u64_at(bytes, FRAME_SYNCED_LSN_OFFSET),
        }
    }

    /// Checks the fields that do not need the body: a known kind, zero reserved bytes, a record
    /// count consistent with the kind and body size, `first_lsn >= 1`, `synced_lsn <
    /// first_lsn` (and `== first_lsn - 1` for SEAL/CLOSE/MARK), and no LSN overflow.
    ///
    /// # Errors
    /// A static description of the first violated rule.
    pub fn check_fields(&self) -> Result<FrameKind, &'static str> {
        let kind = FrameKind::from_byte(self.kind).ok_or("unknown frame kind")?;
        if self.reserved != [0; 3] {
            return Err("reserved frame bytes are not 0");
        }
        if self.first_lsn == 0 {
            return Err("first_lsn is 0");
        }
        if self.synced_lsn >= self.first_lsn {
            return Err("synced_lsn is not below first_lsn");
        }
        match kind {
            FrameKind::Data => {
                if self.record_count == 0 {
                    return Err("DATA frame without records");
                }
                if u64::from(self.record_count) * RECORD_HEADER_BYTES as u64
                    > u64::from(self.body_bytes)
                {
                    return Err("record_count does not fit in body_bytes");
                }
                if self
                    .first_lsn
                    .checked_add(u64::from(self.record_count))
                    .is_none()
                {
                    return Err("LSN overflow");
                }
            }
            FrameKind::Seal | FrameKind::Close | FrameKind::Mark => {
                if self.record_count != 0 || self.body_bytes != 0 {
                    return Err("control frame with a body");
                }
                if self.synced_lsn != self.first_lsn - 1 {
                    return Err("control frame synced_lsn is not first_lsn - 1");
                }
            }
        }
        Ok(kind)
    }
}

/// Encodes a frame header for a body whose CRC state is `body_crc` (a hasher fed exactly the
/// body bytes). Splitting the CRC this way lets appenders checksum their bodies in parallel
/// while the writer fills in `synced_lsn` at write time (`crc32fast::Hasher::combine`).
pub fn encode_frame_header(
    kind: FrameKind,
    body_bytes: u32,
    record_count: u32,
    first_lsn: u64,
    synced_lsn: u64,
    body_crc: &crc32fast::Hasher,
) -> [u8; FRAME_HEADER_BYTES] {
    let mut b = [0u8; FRAME_HEADER_BYTES];
    b[FRAME_BODY_BYTES_OFFSET..FRAME_CRC_OFFSET].copy_from_slice(&body_bytes.to_le_bytes());
    b[FRAME_KIND_OFFSET] = kind as u8;
    b[FRAME_RECORD_COUNT_OFFSET..FRAME_FIRST_LSN_OFFSET]
        .copy_from_slice(&record_count.to_le_bytes());
    b[FRAME_FIRST_LSN_OFFSET..FRAME_SYNCED_LSN_OFFSET].copy_from_slice(&first_lsn.to_le_bytes());
    b[FRAME_SYNCED_LSN_OFFSET..FRAME_HEADER_BYTES].copy_from_slice(&synced_lsn.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&b[..FRAME_CRC_OFFSET]);
    hasher.update(&b[FRAME_KIND_OFFSET..]);
    hasher.combine(body_crc);
    b[FRAME_CRC_OFFSET..FRAME_KIND_OFFSET].copy_from_slice(&hasher.finalize().to_le_bytes());
    b
}

/// Encodes a whole frame (header + body).
///
/// # Panics
/// If `body` is longer than [`FRAME_BODY_BYTES_MAX`] (a caller bug; appends check first).
pub fn encode_frame(
    kind: FrameKind,
    record_count: u32,
    first_lsn: u64,
    synced_lsn: u64,
    body: &[u8],
) -> Vec<u8> {
    let body_bytes = u32::try_from(body.len())
        .ok()
        .filter(|n| *n <= FRAME_BODY_BYTES_MAX);
    let Some(body_bytes) = body_bytes else {
        panic!("frame body of {} bytes exceeds the maximum", body.len());
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(body);
    let header = encode_frame_header(
        kind,
        body_bytes,
        record_count,
        first_lsn,
        synced_lsn,
        &hasher,
    );
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(body);
    frame
}

/// The CRC a frame with this 32-byte `header` and `body` must carry.
pub fn frame_crc(header: &[u8], body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..FRAME_CRC_OFFSET]);
    hasher.update(&header[FRAME_KIND_OFFSET..FRAME_HEADER_BYTES]);
    hasher.update(body);
    hasher.finalize()
}

/// Appends one record (`record_type`, `body_len` u32 LE, body) to a frame body.
///
/// # Panics
/// If `body` is longer than `u32::MAX` bytes (appends check the limit first).
pub fn encode_record(out: &mut Vec<u8>, record_type: u8, body: &[u8]) {
    let Ok(len) = u32::try_from(body.len()) else {
        panic!("record body of {} bytes does not fit u32", body.len());
    };
    out.push(record_type);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
}

/// Walks the `record_count` records of a DATA frame body, calling `visit(index, type, body)`
/// for each, after checking each record's type (`1..=RECORD_TYPE_USER_MAX`) and length
/// (`<= record_bytes_max`, within the body) and that the records fill the body exactly.
/// `visit` is called only for records that have passed every check of the whole body, so a
/// malformed body reports nothing.
///
/// # Errors
/// A description of the first violated rule, or the first error `visit` returns.
pub fn for_each_record<E>(
    body: &[u8],
    record_count: u32,
    record_bytes_max: u32,
    mut visit: impl FnMut(u32, u8, &[u8]) -> Result<(), E>,
) -> Result<Result<(), E>, String> {
    // First pass: structure only.
    let mut position = 0usize;
    for index in 0..record_count {
        let header_end = position + RECORD_HEADER_BYTES;
        if header_end > body.len() {
            return Err(format!("record {index} header runs past the frame body"));
        }
        let record_type = body[position + RECORD_TYPE_OFFSET];
        if record_type == 0 || record_type > crate::RECORD_TYPE_USER_MAX {
            return Err(format!(
                "record {index} has reserved type {record_type:#04x}"
            ));
        }
        let len = u32_at(body, position + RECORD_BODY_LEN_OFFSET);
        if len > record_bytes_max {
            return Err(format!(
                "record {index} body of {len} bytes exceeds record_bytes_max {record_bytes_max}"
            ));
        }
        let end = header_end.saturating_add(len as usize);
        if end > body.len() {
            return Err(format!("record {index} body runs past the frame body"));
        }
        position = end;
    }
    if position != body.len() {
        return Err(format!(
            "{} bytes after the last record in the frame body",
            body.len() - position
        ));
    }
    // Second pass: hand out the records.
    let mut position = 0usize;
    for index in 0..record_count {
        let record_type = body[position];
        let len = u32_at(body, position + RECORD_BODY_LEN_OFFSET) as usize;
        let start = position + RECORD_HEADER_BYTES;
        if let Err(e) = visit(index, record_type, &body[start..start + len]) {
            return Ok(Err(e));
        }
        position = start + len;
    }
    Ok(Ok(()))
}

/// The file name of segment `seq` whose first LSN is `first_lsn`:
/// `{seq:016x}-{first_lsn:016x}.seg`.
pub fn segment_file_name(seq: u64, first_lsn: Lsn) -> String {
    format!("{seq:016x}-{:016x}{SEGMENT_SUFFIX}", first_lsn.0)
}

/// Parses a segment file name into `(seq, first_lsn)`; `None` unless it is exactly
/// `{16 lowercase hex}-{16 lowercase hex}.seg`.
pub fn parse_segment_file_name(name: &str) -> Option<(u64, Lsn)> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    let (seq, lsn) = stem.split_once('-')?;
    let hex16 = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    Some((hex16(seq)?, Lsn(hex16(lsn)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_roundtrip_and_reject_near_misses() {
        let name = segment_file_name(0x2a, Lsn(0x1000));
        assert_eq!(name, "000000000000002a-0000000000001000.seg");
        assert_eq!(parse_segment_file_name(&name), Some((0x2a, Lsn(0x1000))));
        for bad in [
            "000000000000002A-0000000000001000.seg",
            "000000000000002a-0000000000001000.seg.tmp",
            "02a-0000000000001000.seg",
            "000000000000002a_0000000000001000.seg",
            "+00000000000002a-0000000000001000.seg",
            "META",
        ] {
            assert_eq!(parse_segment_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_checks_version_before_crc_and_rejects_flags() {
        let header = SegmentHeader {
            format_version: SEGMENT_FORMAT_VERSION,
            store_id: [7; 16],
            seq: 3,
            prev_last_lsn: 10,
            created_ms: 5,
        };
        let mut bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        assert_eq!(header.first_lsn(), Lsn(11));
        bytes[SEG_VERSION_OFFSET] = 3;
        assert_eq!(
            SegmentHeader::decode(&bytes),
            Err(HeaderError::UnsupportedVersion(3))
        );
        let v1 = SegmentHeader {
            format_version: 1,
            ..header
        };
        assert_eq!(SegmentHeader::decode(&v1.encode()), Ok(v1));
        assert_eq!(v1.frames_offset(), 64);
        assert_eq!(header.frames_offset(), 128);
        let mut bytes = header.encode();
        bytes[SEG_SEQ_OFFSET] ^= 1;
        assert_eq!(SegmentHeader::decode(&bytes), Err(HeaderError::BadCrc));
        assert_eq!(SegmentHeader::decode(&bytes[..63]), Err(HeaderError::Short));
    }

    #[test]
    fn mark_slots_round_trip_and_tell_empty_from_torn() {
        let slot = MarkSlot::encode(3, 17);
        assert_eq!(
            MarkSlot::decode(&slot),
            MarkSlot::Mark {
                synced_lsn: 17,
                seq: 3
            }
        );
        assert_eq!(MarkSlot::decode(&[0; MARK_SLOT_BYTES]), MarkSlot::Empty);
        assert_eq!(MarkSlot::decode(&slot[..31]), MarkSlot::Torn);
        for byte in 0..MARK_SLOT_BYTES {
            let mut bad = slot;
            bad[byte] ^= 0x10;
            assert_eq!(MarkSlot::decode(&bad), MarkSlot::Torn, "byte {byte}");
        }
    }

    #[test]
    fn records_are_checked_before_any_is_visited() {
        let mut body = Vec::new();
        encode_record(&mut body, 1, b"ok");
        encode_record(&mut body, 0xF0, b"reserved type");
        let mut seen = 0;
        let result = for_each_record(&body, 2, 1024, |_, _, _| -> Result<(), ()> {
            seen += 1;
            Ok(())
        });
        assert!(result.is_err());
        assert_eq!(seen, 0);
    }

    #[test]
    fn control_frame_rules() {
        let frame = encode_frame(FrameKind::Mark, 0, 5, 4, &[]);
        let header = FrameHeader::parse(&frame);
        assert_eq!(header.check_fields(), Ok(FrameKind::Mark));
        assert_eq!(frame_crc(&frame, &[]), header.crc);
        let frame = encode_frame(FrameKind::Mark, 0, 5, 3, &[]);
        assert!(FrameHeader::parse(&frame).check_fields().is_err());
    }
}
