//! Checkpoint files: the live task set and the dead letters as of one LSN, so
//! that recovery reads the checkpoint and then only the log after it, and the
//! log's older segments can be deleted.
//!
//! Layout (`wal/FORMAT.md`, "Checkpoint files"; every offset here mirrors it):
//! a 64-byte header (magic, format version, header CRC, the log's store id,
//! the LSN, the largest task id, the creation time), then blocks — each a
//! 16-byte header (length, CRC-32, kind, entry count) and a body of entries
//! laid end to end — TASKS blocks, FAR blocks (format version 2: far tasks,
//! whose key and payload are only in their overflow entry), DEAD blocks, and
//! one END block carrying the totals, which ends the file. Version 1 files
//! (no FAR blocks, a 16-byte END body) are still read. A file is written
//! under a temporary name, fdatasynced, renamed and its directory fsynced
//! (etcd's snapshotter, LevelDB's CURRENT), so a crash at any step leaves the
//! old checkpoint or the new one, never a mix.
//!
//! Reading trusts nothing: every length is bounded by a limit and by the bytes
//! left in the file before anything is allocated, every block's CRC is checked
//! before its entries are parsed, and the entries must fill their block
//! exactly. Damage is a [`CheckpointReadError::Corrupt`] naming file and
//! offset. No memory maps.

use crate::replay::{DeadTask, LiveTask};
use kairos_wal::format::StoreId;
use kairos_wal::storage::{OpenMode, Storage, StorageFile};
use std::io;
use std::path::{Path, PathBuf};

/// Name of the directory, inside a data directory, holding checkpoint files.
pub const CHECKPOINT_DIR_NAME: &str = "checkpoint";
/// File-name suffix of a checkpoint: `{lsn:016x}.ckpt`.
pub const CHECKPOINT_SUFFIX: &str = ".ckpt";
/// Suffix of a checkpoint being written; leftovers are removed at open.
pub const TMP_SUFFIX: &str = ".tmp";

/// The header's magic bytes.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"KAIROSCP";
/// The format version this code writes (it reads
/// [`CHECKPOINT_FORMAT_VERSION_MIN`] to this one).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 2;
/// The oldest checkpoint format version this build still reads (version 1
/// has no FAR blocks and a 16-byte END body).
pub const CHECKPOINT_FORMAT_VERSION_MIN: u32 = 1;
/// Bytes of the file header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of a block header.
pub const BLOCK_HEADER_BYTES: usize = 16;
/// Largest block body accepted, bytes. One entry (a 64 KiB key and a payload
/// of up to 16 MiB) always fits.
pub const BLOCK_BODY_BYTES_MAX: u32 = 32 * 1024 * 1024;
/// Blocks are cut once their body reaches this size.
pub const BLOCK_BODY_BYTES_TARGET: usize = 1024 * 1024;

/// Block kind: live tasks.
pub const BLOCK_TASKS: u8 = 1;
/// Block kind: dead letters.
pub const BLOCK_DEAD: u8 = 2;
/// Block kind: totals; the last block of the file.
pub const BLOCK_END: u8 = 3;
/// Block kind: far tasks (version 2), after the TASKS blocks.
pub const BLOCK_FAR: u8 = 4;
/// Bytes of a FAR entry: `task_id u64, key_hash u64, file u32, offset u64`.
pub const FAR_ENTRY_BYTES: usize = 28;

/// Fixed bytes of a task entry (before its key and payload).
pub const TASK_ENTRY_FIXED_BYTES: usize = 28;
/// Fixed bytes of a dead-letter entry (before its key, payload and error).
pub const DEAD_ENTRY_FIXED_BYTES: usize = 36;
/// Bytes of the END block's body.
pub const END_BODY_BYTES: usize = 24;
/// Bytes of the END block's body in version 1 (no far-task count).
pub const END_BODY_BYTES_V1: usize = 16;
/// Task entry flag: the task is in flight (delivered, not yet settled).
pub const TASK_FLAG_IN_FLIGHT: u8 = 1;
/// Task entry payload kind: the payload follows the key in the entry.
pub const PAYLOAD_INLINE: u8 = 0;
/// Task entry payload kind: the payload is in an overflow file; after the
/// key come the file's number (u32) and the entry's offset (u64).
pub const PAYLOAD_OVERFLOW: u8 = 1;
/// Bytes after the key of a [`PAYLOAD_OVERFLOW`] entry.
pub const OVERFLOW_REF_BYTES: usize = 12;

/// Where a checkpointed task's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadAt<'a> {
    /// In the checkpoint itself.
    Inline(&'a [u8]),
    /// In overflow file `file` at byte `offset`.
    Overflow {
        /// The overflow file's number.
        file: u32,
        /// The entry's offset in it.
        offset: u64,
    },
}

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = H_MAGIC + 8;
const H_CRC: usize = H_VERSION + 4;
const H_STORE_ID: usize = H_CRC + 4;
const H_LSN: usize = H_STORE_ID + 16;
const H_MAX_ID: usize = H_LSN + 8;
const H_CREATED_MS: usize = H_MAX_ID + 8;
const H_RESERVED: usize = H_CREATED_MS + 8;
const _: () = assert!(H_RESERVED + 8 == HEADER_BYTES);

// Block header offsets.
const B_BODY_BYTES: usize = 0;
const B_CRC: usize = B_BODY_BYTES + 4;
const B_KIND: usize = B_CRC + 4;
const B_RESERVED: usize = B_KIND + 1;
const B_COUNT: usize = B_RESERVED + 3;
const _: () = assert!(B_COUNT + 4 == BLOCK_HEADER_BYTES);

/// What a checkpoint header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointHeader {
    /// The store id of the log the checkpoint belongs to.
    pub store_id: StoreId,
    /// The state is the one after applying every log record with an LSN up
    /// to and including this one.
    pub lsn: u64,
    /// The largest task id ever assigned up to `lsn` (ids are never reused).
    pub max_task_id: u64,
    /// Wall-clock creation time, UTC ms (for humans only).
    pub created_ms: u64,
}

/// A whole checkpoint: the header and the state it records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its LSN, largest task id and creation time.
    pub header: Option<CheckpointHeader>,
    /// Live tasks by id (ascending when read back from a file the engine wrote).
    pub tasks: Vec<(u64, LiveTask)>,
    /// Dead letters by id.
    pub dead: Vec<(u64, DeadTask)>,
    /// Far tasks (due beyond the far span when the checkpoint was written):
    /// no key in the checkpoint, only its hash and the overflow entry
    /// holding key, due time and payload.
    pub far: Vec<FarTask>,
}

/// A far task as a checkpoint records it (`crate::far`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FarTask {
    /// Its task id.
    pub id: u64,
    /// `crate::far::KeyHasher::hash` of its key under the store id.
    pub key_hash: u64,
    /// The overflow file holding its entry.
    pub file: u32,
    /// The entry's byte offset in that file (≥ 64).
    pub offset: u64,
}

/// Why a checkpoint file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointReadError {
    /// The file is damaged or not a checkpoint: the byte offset of the
    /// damage and what is wrong there.
    #[error("checkpoint {path} is corrupt at byte offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the damaged header, block or entry.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Written by a format version this code does not know.
    #[error("checkpoint {path} has format version {version}; this build reads versions {CHECKPOINT_FORMAT_VERSION_MIN} to {CHECKPOINT_FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The checkpoint belongs to another data directory's log.
    #[error(
        "checkpoint {path} belongs to another data directory (store id differs from the log's)"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// Reading the file failed.
    #[error("read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// The file name of the checkpoint at `lsn`.
pub fn file_name(lsn: u64) -> String {
    format!("{lsn:016x}{CHECKPOINT_SUFFIX}")
}

/// The LSN a checkpoint file name stands for; `None` for other names.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(CHECKPOINT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Encodes a checkpoint into blocks, entry by entry, without holding more
/// than one block in memory besides what the caller keeps.
#[derive(Debug)]
pub struct CheckpointEncoder {
    out: Vec<u8>,
    block: Vec<u8>,
    block_kind: u8,
    block_count: u32,
    tasks: u64,
    dead: u64,
    far: u64,
}

impl CheckpointEncoder {
    /// Starts a checkpoint with its header.
    pub fn new(header: &CheckpointHeader) -> CheckpointEncoder {
        let mut out = Vec::with_capacity(HEADER_BYTES);
        out.extend_from_slice(&encode_header(header));
        CheckpointEncoder {
            out,
            block: Vec::new(),
            block_kind: BLOCK_TASKS,
            block_count: 0,
            tasks: 0,
            dead: 0,
            far: 0,
        }
    }

    fn start_entry(&mut self, kind: u8) {
        if self.block_kind != kind
            || self.block.len() >= BLOCK_BODY_BYTES_TARGET
            || self.block_count == u32::MAX
        {
            self.flush();
            self.block_kind = kind;
        }
        self.block_count += 1;
    }

    fn flush(&mut self) {
        if self.block_count > 0 {
            push_block(
                &mut self.out,
                self.block_kind,
                self.block_count,
                &self.block,
            );
        }
        self.block.clear();
        self.block_count = 0;
    }

    /// Adds a live task. Keys are 1..=65 535 bytes and payloads below 4 GiB
    /// (the engine's limits are far below); longer ones are cut to fit and
    /// the file then fails to read back rather than misreading.
    pub fn push_task(
        &mut self,
        id: u64,
        due_ms: u64,
        deliveries: u32,
        in_flight: bool,
        key: &[u8],
        payload: PayloadAt<'_>,
    ) {
        self.start_entry(BLOCK_TASKS);
        self.tasks += 1;
        let b = &mut self.block;
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&due_ms.to_le_bytes());
        b.extend_from_slice(&deliveries.to_le_bytes());
        b.push(if in_flight { TASK_FLAG_IN_FLIGHT } else { 0 });
        match payload {
            PayloadAt::Inline(payload) => {
                b.push(PAYLOAD_INLINE);
                b.extend_from_slice(&len_u16(key.len()).to_le_bytes());
                b.extend_from_slice(&len_u32(payload.len()).to_le_bytes());
                b.extend_from_slice(key);
                b.extend_from_slice(payload);
            }
            PayloadAt::Overflow { file, offset } => {
                b.push(PAYLOAD_OVERFLOW);
                b.extend_from_slice(&len_u16(key.len()).to_le_bytes());
                b.extend_from_slice(&(OVERFLOW_REF_BYTES as u32).to_le_bytes());
                b.extend_from_slice(key);
                b.extend_from_slice(&file.to_le_bytes());
                b.extend_from_slice(&offset.to_le_bytes());
            }
        }
    }

    /// Adds a far task. Call after every [`CheckpointEncoder::push_task`]
    /// and before any [`CheckpointEncoder::push_dead`].
    pub fn push_far(&mut self, t: &FarTask) {
        self.start_entry(BLOCK_FAR);
        self.far += 1;
        let b = &mut self.block;
        b.extend_from_slice(&t.id.to_le_bytes());
        b.extend_from_slice(&t.key_hash.to_le_bytes());
        b.extend_from_slice(&t.file.to_le_bytes());
        b.extend_from_slice(&t.offset.to_le_bytes());
    }

    /// Adds a dead letter.
    pub fn push_dead(&mut self, id: u64, t: &DeadTask) {
        self.start_entry(BLOCK_DEAD);
        self.dead += 1;
        let b = &mut self.block;
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&t.due_ms.to_le_bytes());
        b.extend_from_slice(&t.dead_ms.to_le_bytes());
        b.extend_from_slice(&t.deliveries.to_le_bytes());
        b.extend_from_slice(&len_u16(t.key.len()).to_le_bytes());
        b.extend_from_slice(&len_u32(t.payload.len()).to_le_bytes());
        b.extend_from_slice(&len_u16(t.error.len()).to_le_bytes());
        b.extend_from_slice(&t.key);
        b.extend_from_slice(&t.payload);
        b.extend_from_slice(&t.error);
    }

    /// Live tasks added so far.
    pub fn tasks(&self) -> u64 {
        self.tasks
    }

    /// Dead letters added so far.
    pub fn dead_letters(&self) -> u64 {
        self.dead
    }

    /// Far tasks added so far.
    pub fn far_tasks(&self) -> u64 {
        self.far
    }

    /// Bytes encoded and not yet drained.
    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    /// Takes the bytes encoded so far (whole blocks; the first piece starts
    /// with the header), for a caller writing the file as it is built: the
    /// pieces, then [`CheckpointEncoder::finish`]'s bytes, laid end to end,
    /// are the file.
    pub fn drain(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Ends the file with the END block and returns its bytes (after a
    /// [`CheckpointEncoder::drain`], only those not drained).
    pub fn finish(mut self) -> Vec<u8> {
        self.flush();
        let mut end = [0u8; END_BODY_BYTES];
        end[..8].copy_from_slice(&self.tasks.to_le_bytes());
        end[8..16].copy_from_slice(&self.dead.to_le_bytes());
        end[16..].copy_from_slice(&self.far.to_le_bytes());
        push_block(&mut self.out, BLOCK_END, 0, &end);
        self.out
    }
}

fn len_u16(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn encode_header(h: &CheckpointHeader) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[H_MAGIC..H_VERSION].copy_from_slice(&CHECKPOINT_MAGIC);
    b[H_VERSION..H_CRC].copy_from_slice(&CHECKPOINT_FORMAT_VERSION.to_le_bytes());
    b[H_STORE_ID..H_LSN].copy_from_slice(&h.store_id);
    b[H_LSN..H_MAX_ID].copy_from_slice(&h.lsn.to_le_bytes());
    b[H_MAX_ID..H_CREATED_MS].copy_from_slice(&h.max_task_id.to_le_bytes());
    b[H_CREATED_MS..H_RESERVED].copy_from_slice(&h.created_ms.to_le_bytes());
    b[H_RESERVED..].copy_from_slice(&crate::far::checkpoint_hash_word().to_le_bytes());
    let crc = header_crc(&b);
    b[H_CRC..H_STORE_ID].copy_from_slice(&crc.to_le_bytes());
    b
}

fn header_crc(b: &[u8; HEADER_BYTES]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..H_CRC]);
    h.update(&b[H_STORE_ID..]);
    h.finalize()
}

fn block_crc(header: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[B_BODY_BYTES..B_CRC]);
    h.update(&header[B_KIND..BLOCK_HEADER_BYTES]);
    h.update(body);
    h.finalize()
}

fn push_block(out: &mut Vec<u8>, kind: u8, count: u32, body: &[u8]) {
    let mut header = [0u8; BLOCK_HEADER_BYTES];
    header[B_BODY_BYTES..B_CRC].copy_from_slice(&len_u32(body.len()).to_le_bytes());
    header[B_KIND] = kind;
    header[B_COUNT..].copy_from_slice(&count.to_le_bytes());
    let crc = block_crc(&header, body);
    header[B_CRC..B_KIND].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
}

/// Little-endian integers at byte `at` of `b` (shared with `crate::overflow`).
/// Panics if `b` is too short: callers check lengths first.
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes a header. `Err((offset, reason))` for damage; the version is
/// checked before the CRC, so a file of a future layout is reported as such.
fn decode_header(b: &[u8]) -> Result<Result<(CheckpointHeader, u32), u32>, String> {
    let Ok(b) = <&[u8; HEADER_BYTES]>::try_from(b) else {
        return Err(format!(
            "header is {} bytes, expected {HEADER_BYTES}",
            b.len()
        ));
    };
    if b[H_MAGIC..H_VERSION] != CHECKPOINT_MAGIC {
        return Err("bad magic: not a Kairos checkpoint".into());
    }
    let version = u32_at(b, H_VERSION);
    if !(CHECKPOINT_FORMAT_VERSION_MIN..=CHECKPOINT_FORMAT_VERSION).contains(&version) {
        return Ok(Err(version));
    }
    if u32_at(b, H_CRC) != header_crc(b) {
        return Err("header CRC mismatch".into());
    }
    let reserved = u64_at(b, H_RESERVED);
    if reserved != crate::far::checkpoint_hash_word() {
        return Err(if reserved >> 8 == 0x0057_4541_4B48_4153 || reserved == 0 {
            // One side weakened its far-key hash (`far::weaken_key_hash_for_tests`).
            format!(
                "written with far-key hashes of {} bits, read with {} (a test hook weakens \
                 them: a directory written so is read only so)",
                if reserved == 0 { 64 } else { reserved & 0xFF },
                match crate::far::checkpoint_hash_word() {
                    0 => 64,
                    w => w & 0xFF,
                }
            )
        } else {
            "reserved header bytes are not zero".into()
        });
    }
    let mut store_id = [0u8; 16];
    store_id.copy_from_slice(&b[H_STORE_ID..H_LSN]);
    Ok(Ok((
        CheckpointHeader {
            store_id,
            lsn: u64_at(b, H_LSN),
            max_task_id: u64_at(b, H_MAX_ID),
            created_ms: u64_at(b, H_CREATED_MS),
        },
        version,
    )))
}

/// Reads a checkpoint from bytes in memory (the fuzz target's entry point;
/// files go through [`read`], which streams block by block).
///
/// # Errors
/// As [`read`], with `path` used only in messages.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointReadError> {
    let source = SliceSource(bytes);
    read_from(&source, bytes.len() as u64, path)
}

/// Reads the header of the checkpoint file at `path` (cheap: 64 bytes).
///
/// # Errors
/// As [`read`].
pub fn read_header(
    storage: &dyn Storage,
    path: &Path,
) -> Result<CheckpointHeader, CheckpointReadError> {
    let io_err = |source| CheckpointReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
    let len = file.len().map_err(io_err)?;
    let source = FileSource(file.as_ref());
    header_from(&source, len, path).map(|(h, _)| h)
}

/// Reads and checks the whole checkpoint file at `path`. Memory: one block
/// (at most [`BLOCK_BODY_BYTES_MAX`]) besides the state returned.
///
/// # Errors
/// [`CheckpointReadError::Corrupt`] (offset and reason) for any damage — a
/// bad magic, CRC, length, entry, duplicate id, an id above the header's
/// largest, a missing or misplaced END block, bytes after it;
/// [`CheckpointReadError::UnsupportedVersion`]; [`CheckpointReadError::Io`].
pub fn read(storage: &dyn Storage, path: &Path) -> Result<Checkpoint, CheckpointReadError> {
    let io_err = |source| CheckpointReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
    let len = file.len().map_err(io_err)?;
    read_from(&FileSource(file.as_ref()), len, path)
}

trait Source {
    /// Fills `buf` from `offset`; `Ok(false)` if the source ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool>;
}

struct SliceSource<'a>(&'a [u8]);

impl Source for SliceSource<'_> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(false);
        };
        match self.0.get(start..).and_then(|rest| rest.get(..buf.len())) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

struct FileSource<'a>(&'a dyn StorageFile);

impl Source for FileSource<'_> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.0.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Ok(false);
            }
            done += n;
        }
        Ok(true)
    }
}

fn header_from(
    source: &dyn Source,
    len: u64,
    path: &Path,
) -> Result<(CheckpointHeader, u32), CheckpointReadError> {
    let corrupt = |offset: u64, reason: String| CheckpointReadError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    if len < HEADER_BYTES as u64 {
        return Err(corrupt(
            0,
            format!("file is {len} bytes, shorter than the {HEADER_BYTES}-byte header"),
        ));
    }
    let mut b = [0u8; HEADER_BYTES];
    if !source
        .read_exact_at(&mut b, 0)
        .map_err(|source| CheckpointReadError::Io {
            path: path.to_path_buf(),
            source,
        })?
    {
        return Err(corrupt(0, "file ends inside the header".into()));
    }
    match decode_header(&b).map_err(|reason| corrupt(0, reason))? {
        Ok(h) => Ok(h),
        Err(version) => Err(CheckpointReadError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        }),
    }
}

fn read_from(
    source: &dyn Source,
    len: u64,
    path: &Path,
) -> Result<Checkpoint, CheckpointReadError> {
    let (header, version) = header_from(source, len, path)?;
    let corrupt = |offset: u64, reason: String| CheckpointReadError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let io_err = |source| CheckpointReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = Checkpoint {
        header: Some(header),
        ..Checkpoint::default()
    };
    let mut ids = SeenIds::new(header.max_task_id, len);
    let mut offset = HEADER_BYTES as u64;
    let mut seen_dead = false;
    let mut seen_far = false;
    loop {
        let left = len - offset;
        if left < BLOCK_HEADER_BYTES as u64 {
            return Err(corrupt(offset, "file ends before the END block".into()));
        }
        let mut bh = [0u8; BLOCK_HEADER_BYTES];
        if !source.read_exact_at(&mut bh, offset).map_err(io_err)? {
            return Err(corrupt(offset, "file ends inside a block header".into()));
        }
        let body_bytes = u32_at(&bh, B_BODY_BYTES);
        let kind = bh[B_KIND];
        let count = u32_at(&bh, B_COUNT);
        if body_bytes > BLOCK_BODY_BYTES_MAX {
            return Err(corrupt(
                offset,
                format!("block length {body_bytes} exceeds the limit {BLOCK_BODY_BYTES_MAX}"),
            ));
        }
        if u64::from(body_bytes) > left - BLOCK_HEADER_BYTES as u64 {
            return Err(corrupt(
                offset,
                format!(
                    "block length {body_bytes} runs past the end of the file ({} bytes left)",
                    left - BLOCK_HEADER_BYTES as u64
                ),
            ));
        }
        let mut body = vec![0u8; body_bytes as usize];
        if !source
            .read_exact_at(&mut body, offset + BLOCK_HEADER_BYTES as u64)
            .map_err(io_err)?
        {
            return Err(corrupt(offset, "file ends inside a block".into()));
        }
        if u32_at(&bh, B_CRC) != block_crc(&bh, &body) {
            return Err(corrupt(offset, "block CRC mismatch".into()));
        }
        if bh[B_RESERVED..B_COUNT] != [0, 0, 0] {
            return Err(corrupt(offset, "reserved block bytes are not zero".into()));
        }
        let body_offset = offset + BLOCK_HEADER_BYTES as u64;
        let next = body_offset + u64::from(body_bytes);
        match kind {
            BLOCK_TASKS if !seen_dead && !seen_far => {
                parse_tasks(
                    &body,
                    count,
                    &header,
                    (body_offset, &mut ids),
                    &mut out.tasks,
                )
                .map_err(|(at, reason)| corrupt(body_offset + at as u64, reason))?;
            }
            BLOCK_TASKS => {
                return Err(corrupt(
                    offset,
                    "TASKS block after a FAR or DEAD block".into(),
                ))
            }
            BLOCK_FAR if version >= 2 && !seen_dead => {
                seen_far = true;
                parse_far(&body, count, &header, (body_offset, &mut ids), &mut out.far)
                    .map_err(|(at, reason)| corrupt(body_offset + at as u64, reason))?;
            }
            BLOCK_FAR if version >= 2 => {
                return Err(corrupt(offset, "FAR block after a DEAD block".into()))
            }
            BLOCK_DEAD => {
                seen_dead = true;
                parse_dead(
                    &body,
                    count,
                    &header,
                    (body_offset, &mut ids),
                    &mut out.dead,
                )
                .map_err(|(at, reason)| corrupt(body_offset + at as u64, reason))?;
            }
            BLOCK_END => {
                let end_bytes = if version >= 2 {
                    END_BODY_BYTES
                } else {
                    END_BODY_BYTES_V1
                };
                if body.len() != end_bytes || count != 0 {
                    return Err(corrupt(offset, "malformed END block".into()));
                }
                let (tasks, dead) = (u64_at(&body, 0), u64_at(&body, 8));
                let far = if version >= 2 { u64_at(&body, 16) } else { 0 };
                if tasks != out.tasks.len() as u64
                    || dead != out.dead.len() as u64
                    || far != out.far.len() as u64
                {
                    return Err(corrupt(
                        offset,
                        format!(
                            "END block counts {tasks} tasks, {far} far tasks and {dead} dead letters, the file holds {}, {} and {}",
                            out.tasks.len(),
                            out.far.len(),
                            out.dead.len()
                        ),
                    ));
                }
                if next != len {
                    return Err(corrupt(
                        next,
                        format!("{} bytes after the END block", len - next),
                    ));
                }
                if let SeenIds::Listed(ids) = &mut ids {
                    ids.sort_unstable();
                    if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
                        return Err(corrupt(
                            w[0].1.max(w[1].1),
                            format!("task id {} appears twice", w[0].0),
                        ));
                    }
                }
                return Ok(out);
            }
            other => return Err(corrupt(offset, format!("unknown block kind {other}"))),
        }
        offset = next;
    }
}

type EntryError = (usize, String);

/// The ids of a checkpoint's entries seen so far, to refuse an id listed
/// twice (in any blocks).
enum SeenIds {
    /// One bit per id in 1..=max_task_id: the duplicate is found at its
    /// entry, in O(1) per id, with a table that stays in cache (2.5 MB for
    /// 20 M ids, where sorting 10 M ids took most of a second).
    Bitmap(Vec<u64>),
    /// (id, file offset of its entry), sorted and checked at the END
    /// block: when the largest id is too large for a bitmap this file could
    /// justify.
    Listed(Vec<(u64, u64)>),
}

impl SeenIds {
    /// A bitmap when it takes at most as many bytes as the file: a file
    /// cannot make the reader allocate more than it is long (a 365-byte
    /// input once allocated a 512 KiB bitmap, when small files were allowed
    /// 1 MiB).
    fn new(max_task_id: u64, file_bytes: u64) -> SeenIds {
        let words = max_task_id / 64 + 1;
        if words.saturating_mul(8) <= file_bytes {
            SeenIds::Bitmap(vec![0; words as usize])
        } else {
            SeenIds::Listed(Vec::new())
        }
    }
}

/// The block body's file offset, and the ids seen so far.
type Ids<'a> = (u64, &'a mut SeenIds);

fn check_id(
    id: u64,
    at: usize,
    header: &CheckpointHeader,
    ids: &mut Ids<'_>,
) -> Result<(), EntryError> {
    if id == 0 || id == u64::MAX || id > header.max_task_id {
        return Err((
            at,
            format!("task id {id} outside 1..={}", header.max_task_id),
        ));
    }
    match &mut ids.1 {
        SeenIds::Bitmap(bits) => {
            let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
            // The id is at most max_task_id (checked above): in range.
            if let Some(w) = bits.get_mut(word) {
                if *w & bit != 0 {
                    return Err((at, format!("task id {id} appears twice")));
                }
                *w |= bit;
            }
        }
        SeenIds::Listed(list) => list.push((id, ids.0 + at as u64)),
    }
    Ok(())
}

fn take<'a>(
    body: &'a [u8],
    at: &mut usize,
    n: usize,
    entry: usize,
) -> Result<&'a [u8], EntryError> {
    let s = body
        .get(*at..)
        .and_then(|rest| rest.get(..n))
        .ok_or_else(|| {
            (
                entry,
                format!("entry runs past the end of its block ({n} bytes wanted)"),
            )
        })?;
    *at += n;
    Ok(s)
}

fn parse_tasks(
    body: &[u8],
    count: u32,
    header: &CheckpointHeader,
    mut ids: Ids<'_>,
    out: &mut Vec<(u64, LiveTask)>,
) -> Result<(), EntryError> {
    let mut at = 0;
    for _ in 0..count {
        let entry = at;
        let fixed = take(body, &mut at, TASK_ENTRY_FIXED_BYTES, entry)?;
        let id = u64_at(fixed, 0);
        let due_ms = u64_at(fixed, 8);
        let deliveries = u32_at(fixed, 16);
        let flags = fixed[20];
        let payload_kind = fixed[21];
        let key_len = usize::from(u16_at(fixed, 22));
        let payload_len = u32_at(fixed, 24) as usize;
        if flags & !TASK_FLAG_IN_FLIGHT != 0 {
            return Err((entry, format!("unknown task flags {flags:#04x}")));
        }
        if payload_kind != PAYLOAD_INLINE && payload_kind != PAYLOAD_OVERFLOW {
            return Err((entry, format!("unknown payload kind {payload_kind}")));
        }
        if payload_kind == PAYLOAD_OVERFLOW && payload_len != OVERFLOW_REF_BYTES {
            return Err((entry, format!("overflow reference of {payload_len} bytes")));
        }

        if key_len == 0 {
            return Err((entry, "empty key".into()));
        }
        let in_flight = flags & TASK_FLAG_IN_FLIGHT != 0;
        if in_flight && deliveries == 0 {
            return Err((entry, format!("task {id} in flight with no delivery")));
        }
        check_id(id, entry, header, &mut ids)?;
        let key = take(body, &mut at, key_len, entry)?;
        let payload = take(body, &mut at, payload_len, entry)?;
        let (payload, payload_at) = if payload_kind == PAYLOAD_OVERFLOW {
            let file = u32_at(payload, 0);
            let offset = u64_at(payload, 4);
            if offset < crate::overflow::HEADER_BYTES as u64 {
                return Err((
                    entry,
                    format!("overflow offset {offset} inside the file header"),
                ));
            }
            (Box::default(), Some((file, offset)))
        } else {
            (payload.into(), None)
        };
        out.push((
            id,
            LiveTask {
                key: key.into(),
                payload,
                payload_at,
                due_ms,
                deliveries,
                in_flight,
                last_error: Box::default(),
            },
        ));
    }
    block_filled(body, at, count)
}

/// `Ok` if a block's `count` entries ended exactly at its body's end (`at`).
fn block_filled(body: &[u8], at: usize, count: u32) -> Result<(), EntryError> {
    if at != body.len() {
        return Err((
            at,
            format!(
                "{} bytes after the block's {count} entries",
                body.len() - at
            ),
        ));
    }
    Ok(())
}

fn parse_far(
    body: &[u8],
    count: u32,
    header: &CheckpointHeader,
    mut ids: Ids<'_>,
    out: &mut Vec<FarTask>,
) -> Result<(), EntryError> {
    let mut at = 0;
    for _ in 0..count {
        let entry = at;
        let b = take(body, &mut at, FAR_ENTRY_BYTES, entry)?;
        let t = FarTask {
            id: u64_at(b, 0),
            key_hash: u64_at(b, 8),
            file: u32_at(b, 16),
            offset: u64_at(b, 20),
        };
        if t.offset < crate::overflow::HEADER_BYTES as u64
            || crate::far::pack_loc(t.file, t.offset).is_none()
        {
            return Err((
                entry,
                format!(
                    "far task {} at offset {} of overflow file {}: not a place an entry can be",
                    t.id, t.offset, t.file
                ),
            ));
        }
        check_id(t.id, entry, header, &mut ids)?;
        // What the far index keeps of an id (`FarIndex::can_hold`): an
        // engine keeps a task with a larger id in the wheel.
        if t.id >> crate::far::FAR_ID_BITS != 0 {
            return Err((
                entry,
                format!(
                    "far task {}: an id of {} bits or more, which no engine makes far",
                    t.id,
                    crate::far::FAR_ID_BITS
                ),
            ));
        }
        out.push(t);
    }
    block_filled(body, at, count)
}

fn parse_dead(
    body: &[u8],
    count: u32,
    header: &CheckpointHeader,
    mut ids: Ids<'_>,
    out: &mut Vec<(u64, DeadTask)>,
) -> Result<(), EntryError> {
    let mut at = 0;
    for _ in 0..count {
        let entry = at;
        let fixed = take(body, &mut at, DEAD_ENTRY_FIXED_BYTES, entry)?;
        let id = u64_at(fixed, 0);
        let due_ms = u64_at(fixed, 8);
        let dead_ms = u64_at(fixed, 16);
        let deliveries = u32_at(fixed, 24);
        let key_len = usize::from(u16_at(fixed, 28));
        let payload_len = u32_at(fixed, 30) as usize;
        let error_len = usize::from(u16_at(fixed, 34));
        if key_len == 0 {
            return Err((entry, "empty key".into()));
        }
        if error_len > crate::record::ERROR_BYTES_MAX {
            return Err((
                entry,
                format!(
                    "error text of {error_len} bytes exceeds {}",
                    crate::record::ERROR_BYTES_MAX
                ),
            ));
        }
        check_id(id, entry, header, &mut ids)?;
        let key = take(body, &mut at, key_len, entry)?;
        let payload = take(body, &mut at, payload_len, entry)?;
        let error = take(body, &mut at, error_len, entry)?;
        out.push((
            id,
            DeadTask {
                key: key.into(),
                payload: payload.into(),
                due_ms,
                deliveries,
                dead_ms,
                error: error.into(),
            },
        ));
    }
    block_filled(body, at, count)
}

/// Files `(number, name)` by number ascending, and leftover temporary file names.
pub type NumberedListing<N> = (Vec<(N, String)>, Vec<String>);

/// Checkpoint files `(lsn, name)` by LSN ascending, and leftover temporary file names.
pub type Listing = NumberedListing<u64>;

/// The checkpoint files in `dir` (a data directory's `checkpoint/`), by LSN
/// ascending, and the names of leftover temporary files. A missing directory
/// holds none.
///
/// # Errors
/// The listing's I/O error.
pub fn list(storage: &dyn Storage, dir: &Path) -> io::Result<Listing> {
    list_numbered(storage, dir, parse_file_name)
}

/// Files of `dir` whose name `parse` reads as a number, sorted by it, and
/// the names of leftover `*.tmp` files; a missing directory holds none.
/// (Checkpoint and overflow directories are listed alike.)
///
/// # Errors
/// The listing's I/O error.
pub(crate) fn list_numbered<N: Ord>(
    storage: &dyn Storage,
    dir: &Path,
    parse: fn(&str) -> Option<N>,
) -> io::Result<NumberedListing<N>> {
    let names = match storage.list(dir) {
        Ok(names) => names,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    let mut tmps = Vec::new();
    for name in names {
        if let Some(n) = parse(&name) {
            files.push((n, name));
        } else if name.ends_with(TMP_SUFFIX) {
            tmps.push(name);
        }
    }
    files.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok((files, tmps))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAR_4: FarTask = FarTask {
        id: 4,
        key_hash: 0x0102_0304_0506_0708,
        file: 4,
        offset: 64,
    };
    const FAR_8: FarTask = FarTask {
        id: 8,
        key_hash: 0xfedc_ba98_7654_3210,
        file: crate::far::LOC_FILE_MAX,
        offset: (1 << crate::far::LOC_OFFSET_BITS) - 1,
    };

    fn header() -> CheckpointHeader {
        CheckpointHeader {
            store_id: [7; 16],
            lsn: 42,
            max_task_id: 9,
            created_ms: 1_700_000_000_000,
        }
    }

    fn dead_9() -> DeadTask {
        DeadTask {
            key: b"k9".as_slice().into(),
            payload: b"p".as_slice().into(),
            due_ms: 300,
            deliveries: 3,
            dead_ms: 400,
            error: b"boom".as_slice().into(),
        }
    }

    /// Tasks 3, 5, 7, far tasks 4 and 8 (with the largest place that packs), dead letter 9;
    /// with `far` false, the same without the far tasks.
    fn encode_sample(far: bool) -> Vec<u8> {
        encode_sample_drained(far, false)
    }

    /// [`encode_sample`], draining the encoder after each entry if `drain`, the
    /// pieces and the end laid end to end.
    fn encode_sample_drained(far: bool, drain: bool) -> Vec<u8> {
        let mut enc = CheckpointEncoder::new(&header());
        let mut out = Vec::new();
        let mut piece = |enc: &mut CheckpointEncoder| {
            if drain {
                out.extend(enc.drain());
            }
        };
        piece(&mut enc);
        enc.push_task(3, 100, 0, false, b"k3", PayloadAt::Inline(b"payload"));
        piece(&mut enc);
        enc.push_task(5, 200, 2, true, b"k5", PayloadAt::Inline(b""));
        piece(&mut enc);
        enc.push_task(
            7,
            300,
            1,
            false,
            b"k7",
            PayloadAt::Overflow {
                file: 4,
                offset: 64,
            },
        );
        piece(&mut enc);
        if far {
            enc.push_far(&FAR_4);
            piece(&mut enc);
            enc.push_far(&FAR_8);
            piece(&mut enc);
        }
        enc.push_dead(9, &dead_9());
        piece(&mut enc);
        out.extend(enc.finish());
        out
    }

    fn sample() -> (CheckpointHeader, Vec<u8>) {
        (header(), encode_sample(true))
    }

    /// The blocks of an encoded file: (offset, kind, entry count, body).
    fn blocks(bytes: &[u8]) -> Vec<(usize, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = HEADER_BYTES;
        while at < bytes.len() {
            let len = u32_at(bytes, at) as usize;
            let body = bytes[at + BLOCK_HEADER_BYTES..at + BLOCK_HEADER_BYTES + len].to_vec();
            out.push((at, bytes[at + B_KIND], u32_at(bytes, at + B_COUNT), body));
            at += BLOCK_HEADER_BYTES + len;
        }
        out
    }

    /// A file of format `version` (header CRC recomputed) holding `blocks` as given.
    fn assemble(version: u32, blocks: &[(u8, u32, &[u8])]) -> Vec<u8> {
        let mut h = encode_header(&header());
        h[H_VERSION..H_CRC].copy_from_slice(&version.to_le_bytes());
        let crc = header_crc(&h);
        h[H_CRC..H_STORE_ID].copy_from_slice(&crc.to_le_bytes());
        let mut out = h.to_vec();
        for (kind, count, body) in blocks {
            push_block(&mut out, *kind, *count, body);
        }
        out
    }

    /// An END body: the counts, the far count only if given (version 2).
    fn end(tasks: u64, dead: u64, far: Option<u64>) -> Vec<u8> {
        let mut b = tasks.to_le_bytes().to_vec();
        b.extend_from_slice(&dead.to_le_bytes());
        if let Some(far) = far {
            b.extend_from_slice(&far.to_le_bytes());
        }
        b
    }

    /// The sample's TASKS, FAR and DEAD blocks: (kind, count, body).
    fn sample_blocks() -> [(u8, u32, Vec<u8>); 3] {
        let b = blocks(&encode_sample(true));
        assert_eq!(
            b.iter().map(|(_, k, n, _)| (*k, *n)).collect::<Vec<_>>(),
            [
                (BLOCK_TASKS, 3),
                (BLOCK_FAR, 2),
                (BLOCK_DEAD, 1),
                (BLOCK_END, 0)
            ]
        );
        [0, 1, 2].map(|i| (b[i].1, b[i].2, b[i].3.clone()))
    }

    fn corrupt_at(bytes: &[u8]) -> (u64, String) {
        match decode(bytes, Path::new("x")) {
            Err(CheckpointReadError::Corrupt { offset, reason, .. }) => (offset, reason),
            other => panic!("expected corruption, got {other:?}"),
        }
    }

    /// Drained after every entry, the pieces and the end are the same file
    /// as one encoded whole (what a checkpoint written as it is encoded
    /// relies on).
    #[test]
    fn drained_pieces_and_the_end_are_the_whole_file() {
        let mut enc = CheckpointEncoder::new(&header());
        assert_eq!(enc.drain().len(), HEADER_BYTES);
        assert_eq!(enc.buffered(), 0);
        for far in [false, true] {
            assert_eq!(encode_sample_drained(far, true), encode_sample(far));
        }
    }

    #[test]
    fn round_trip() {
        let (header, bytes) = sample();
        let c = decode(&bytes, Path::new("x")).unwrap();
        assert_eq!(c.header, Some(header));
        assert_eq!(c.tasks.len(), 3);
        assert_eq!(c.tasks[2].1.payload_at, Some((4, 64)));
        assert_eq!(c.tasks[0].0, 3);
        assert_eq!(&*c.tasks[0].1.payload, b"payload");
        assert!(c.tasks[1].1.in_flight);
        assert_eq!(c.tasks[1].1.deliveries, 2);
        assert_eq!(c.far, [FAR_4, FAR_8]);
        assert_eq!(c.dead.len(), 1);
        assert_eq!(c.dead[0].0, 9);
        assert_eq!(&*c.dead[0].1.error, b"boom");
        // The END block: 24 bytes, the counts in the order tasks, dead, far.
        let b = blocks(&bytes);
        assert_eq!(b[3].3, end(3, 1, Some(2)));
        // Far entries are exactly 28 bytes each, fields in place.
        assert_eq!(b[1].3.len(), 2 * FAR_ENTRY_BYTES);
        assert_eq!(b[1].3[..8], 4u64.to_le_bytes());
        assert_eq!(b[1].3[8..16], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(b[1].3[16..20], 4u32.to_le_bytes());
        assert_eq!(b[1].3[20..28], 64u64.to_le_bytes());
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error_not_a_panic() {
        let (_, v2) = sample();
        let [tasks, _, dead] = sample_blocks();
        let v1 = assemble(
            1,
            &[
                (tasks.0, tasks.1, &tasks.2),
                (dead.0, dead.1, &dead.2),
                (BLOCK_END, 0, &end(3, 1, None)),
            ],
        );
        assert!(decode(&v1, Path::new("x")).is_ok());
        for bytes in [v2, v1] {
            for cut in 0..bytes.len() {
                assert!(
                    decode(&bytes[..cut], Path::new("x")).is_err(),
                    "cut at {cut}"
                );
            }
            for at in 0..bytes.len() {
                for bit in 0..8 {
                    let mut b = bytes.clone();
                    b[at] ^= 1 << bit;
                    assert!(decode(&b, Path::new("x")).is_err(), "flip {at}.{bit}");
                }
            }
        }
    }

    #[test]
    fn version_1_still_reads() {
        let [tasks, _, dead] = sample_blocks();
        let v1 = assemble(
            1,
            &[
                (tasks.0, tasks.1, &tasks.2),
                (dead.0, dead.1, &dead.2),
                (BLOCK_END, 0, &end(3, 1, None)),
            ],
        );
        let c = decode(&v1, Path::new("x")).unwrap();
        let without_far = decode(&encode_sample(false), Path::new("x")).unwrap();
        assert_eq!(c, without_far);
        assert_eq!(c.header, Some(header()));
        assert_eq!(
            c.tasks.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            [3, 5, 7]
        );
        assert_eq!(c.far, []);
        assert_eq!(c.dead[0], (9, dead_9()));
        // Its header, read alone, too.
        let sim = kairos_wal::SimStorage::new(1);
        sim.write_file(Path::new("/c"), &v1);
        assert_eq!(read_header(&sim, Path::new("/c")).unwrap(), header());
        assert_eq!(read(&sim, Path::new("/c")).unwrap(), c);
        // Versions 0 and 3 are not read.
        for version in [0, 3] {
            let bytes = assemble(version, &[(BLOCK_END, 0, &end(0, 0, Some(0)))]);
            match decode(&bytes, Path::new("x")) {
                Err(CheckpointReadError::UnsupportedVersion { version: v, .. }) => {
                    assert_eq!(v, version);
                }
                other => panic!("version {version}: {other:?}"),
            }
        }
    }

    #[test]
    fn end_body_length_follows_the_version() {
        // A version 1 END body in a version 2 file, and the other way round.
        let v2_short = assemble(2, &[(BLOCK_END, 0, &end(0, 0, None))]);
        assert_eq!(corrupt_at(&v2_short), (64, "malformed END block".into()));
        let v1_long = assemble(1, &[(BLOCK_END, 0, &end(0, 0, Some(0)))]);
        assert_eq!(corrupt_at(&v1_long), (64, "malformed END block".into()));
        // The far count must match.
        let [_, far, _] = sample_blocks();
        let bytes = assemble(
            2,
            &[(far.0, far.1, &far.2), (BLOCK_END, 0, &end(0, 0, Some(1)))],
        );
        assert_eq!(
            corrupt_at(&bytes),
            (
                64 + 16 + 56,
                "END block counts 0 tasks, 1 far tasks and 0 dead letters, the file holds 0, 2 and 0"
                    .into()
            )
        );
    }

    #[test]
    fn blocks_out_of_order_are_refused_at_the_block() {
        let [tasks, far, dead] = sample_blocks();
        let (t, f, d) = (
            (tasks.0, tasks.1, &tasks.2[..]),
            (far.0, far.1, &far.2[..]),
            (dead.0, dead.1, &dead.2[..]),
        );
        let t_end = 64 + 16 + tasks.2.len() as u64;
        assert_eq!(far.2.len(), 56);
        // A FAR block in a version 1 file: a kind version 1 does not have.
        let bytes = assemble(1, &[t, f, d, (BLOCK_END, 0, &end(3, 1, None))]);
        assert_eq!(corrupt_at(&bytes), (t_end, "unknown block kind 4".into()));
        // A FAR block after a DEAD block.
        let bytes = assemble(2, &[t, d, f, (BLOCK_END, 0, &end(3, 1, Some(2)))]);
        let dead_end = t_end + 16 + dead.2.len() as u64;
        assert_eq!(
            corrupt_at(&bytes),
            (dead_end, "FAR block after a DEAD block".into())
        );
        // A TASKS block after a FAR block.
        let bytes = assemble(2, &[f, t, d, (BLOCK_END, 0, &end(3, 1, Some(2)))]);
        assert_eq!(
            corrupt_at(&bytes),
            (64 + 16 + 56, "TASKS block after a FAR or DEAD block".into())
        );
        // In order, the same blocks read.
        let bytes = assemble(2, &[t, f, d, (BLOCK_END, 0, &end(3, 1, Some(2)))]);
        assert_eq!(bytes, encode_sample(true));
    }

    #[test]
    fn a_far_id_that_is_also_a_task_id_is_refused_at_the_later_entry() {
        let mut enc = CheckpointEncoder::new(&header());
        enc.push_task(3, 100, 0, false, b"k3", PayloadAt::Inline(b"payload"));
        enc.push_far(&FAR_4);
        enc.push_far(&FarTask { id: 3, ..FAR_8 });
        let bytes = enc.finish();
        // Header, TASKS block (16 + 28 + 2 + 7), FAR block header, the first far entry.
        let second_far = 64 + (16 + 37) + 16 + 28;
        assert_eq!(
            corrupt_at(&bytes),
            (second_far, "task id 3 appears twice".into())
        );
        // And a far id twice.
        let mut enc = CheckpointEncoder::new(&header());
        enc.push_far(&FAR_4);
        enc.push_far(&FAR_4);
        let bytes = enc.finish();
        assert_eq!(
            corrupt_at(&bytes),
            (64 + 16 + 28, "task id 4 appears twice".into())
        );
        // And a far id that is a dead letter's.
        let mut enc = CheckpointEncoder::new(&header());
        enc.push_far(&FarTask { id: 9, ..FAR_4 });
        enc.push_dead(9, &dead_9());
        let bytes = enc.finish();
        assert_eq!(
            corrupt_at(&bytes),
            (64 + 44 + 16, "task id 9 appears twice".into())
        );
    }

    /// Ids are checked with a bitmap when the largest id is small for the
    /// file, and by sorting otherwise: both refuse the same duplicate at the
    /// same offset (the later entry), and accept the same file.
    #[test]
    fn an_id_twice_is_refused_alike_by_bitmap_and_by_sorting() {
        for max_task_id in [9, u64::MAX - 1] {
            let h = CheckpointHeader {
                max_task_id,
                ..header()
            };
            assert!(
                matches!(SeenIds::new(max_task_id, 200), SeenIds::Bitmap(_)) == (max_task_id == 9)
            );
            // Never larger than the file.
            assert!(matches!(
                SeenIds::new(64 * 100 - 1, 800),
                SeenIds::Bitmap(_)
            ));
            assert!(matches!(
                SeenIds::new(64 * 100 - 1, 799),
                SeenIds::Listed(_)
            ));
            let mut enc = CheckpointEncoder::new(&h);
            enc.push_task(3, 100, 0, false, b"k3", PayloadAt::Inline(b"payload"));
            enc.push_task(5, 100, 0, false, b"k5", PayloadAt::Inline(b""));
            enc.push_dead(3, &dead_9());
            let bytes = enc.finish();
            // Header, TASKS block header, the two tasks (28 + 2 + 7, 28 + 2),
            // DEAD block header.
            let dead_at = 64 + 16 + 37 + 30 + 16;
            assert_eq!(
                corrupt_at(&bytes),
                (dead_at, "task id 3 appears twice".into()),
                "max_task_id {max_task_id}"
            );
            let mut enc = CheckpointEncoder::new(&h);
            enc.push_task(3, 100, 0, false, b"k3", PayloadAt::Inline(b"payload"));
            enc.push_dead(9, &dead_9());
            let c = decode(&enc.finish(), Path::new("x")).map_err(|e| e.to_string());
            assert_eq!(c.map(|c| c.tasks.len() + c.dead.len()), Ok(2));
        }
    }

    #[test]
    fn far_entries_whose_place_does_not_pack_are_refused() {
        let max_offset = (1u64 << crate::far::LOC_OFFSET_BITS) - 1;
        for (file, offset, ok) in [
            (0, 64, true),
            (crate::far::LOC_FILE_MAX, max_offset, true),
            (crate::far::LOC_FILE_MAX + 1, 64, false),
            (u32::MAX, 64, false),
            (1, max_offset + 1, false),
            (1, u64::MAX, false),
            (1, 63, false),
            (1, 0, false),
        ] {
            let mut enc = CheckpointEncoder::new(&header());
            enc.push_far(&FAR_4);
            enc.push_far(&FarTask {
                file,
                offset,
                ..FAR_8
            });
            let bytes = enc.finish();
            if ok {
                let c = decode(&bytes, Path::new("x")).unwrap();
                assert_eq!(
                    c.far[1],
                    FarTask {
                        file,
                        offset,
                        ..FAR_8
                    }
                );
            } else {
                assert_eq!(
                    corrupt_at(&bytes),
                    (
                        64 + 16 + 28,
                        format!(
                            "far task 8 at offset {offset} of overflow file {file}: not a place \
                             an entry can be"
                        )
                    ),
                    "file {file}, offset {offset}"
                );
            }
        }
        // An id the far index cannot hold (2^48 or more), within
        // 1..=max_task_id.
        let big = 1u64 << crate::far::FAR_ID_BITS;
        for (id, ok) in [(big - 1, true), (big, false), (u64::MAX - 1, false)] {
            let h = CheckpointHeader {
                max_task_id: u64::MAX,
                ..header()
            };
            let mut enc = CheckpointEncoder::new(&h);
            enc.push_far(&FarTask { id, ..FAR_4 });
            let bytes = enc.finish();
            if ok {
                assert_eq!(decode(&bytes, Path::new("x")).unwrap().far[0].id, id);
            } else {
                assert_eq!(
                    corrupt_at(&bytes),
                    (
                        64 + 16,
                        format!(
                            "far task {id}: an id of 48 bits or more, which no engine makes far"
                        )
                    )
                );
            }
        }
        // An id outside 1..=max_task_id, at its entry.
        for id in [0, 10, u64::MAX] {
            let mut enc = CheckpointEncoder::new(&header());
            enc.push_far(&FarTask { id, ..FAR_4 });
            assert_eq!(
                corrupt_at(&enc.finish()),
                (64 + 16, format!("task id {id} outside 1..=9"))
            );
        }
    }

    #[test]
    fn far_golden_vector_matches_format_md() {
        const FORMAT_MD: &str = include_str!("../wal/FORMAT.md");
        let marker = "<!-- golden:checkpoint-far -->";
        let at = FORMAT_MD.find(marker).expect("FORMAT.md has the marker");
        let block = FORMAT_MD[at..]
            .split("```text")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("a hex block after the marker");
        let golden: Vec<u8> = block
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).expect("hex"))
            .collect();
        let store_id: [u8; 16] = core::array::from_fn(|i| i as u8);
        let hasher = crate::far::KeyHasher::new(&store_id);
        assert_eq!(hasher.hash(b""), 0xabac_0158_050f_c4dc);
        assert_eq!(hasher.hash(b"order:1"), 0xffcb_7e86_9b80_484e);
        let header = CheckpointHeader {
            store_id,
            lsn: 5,
            max_task_id: 9,
            created_ms: 1_700_000_000_000,
        };
        let far = FarTask {
            id: 7,
            key_hash: hasher.hash(b"order:1"),
            file: 3,
            offset: 64,
        };
        let mut enc = CheckpointEncoder::new(&header);
        enc.push_far(&far);
        let bytes = enc.finish();
        assert_eq!(bytes, golden);
        assert_eq!(bytes.len(), 64 + 16 + 28 + 16 + 24);
        let c = decode(&golden, Path::new("x")).unwrap();
        assert_eq!(
            (c.header, c.far, c.tasks.len()),
            (Some(header), vec![far], 0)
        );
    }

    #[test]
    fn file_names() {
        assert_eq!(file_name(0x2a), "000000000000002a.ckpt");
        assert_eq!(parse_file_name("000000000000002a.ckpt"), Some(42));
        assert_eq!(parse_file_name("2a.ckpt"), None);
        assert_eq!(parse_file_name("000000000000002a.ckpt.tmp"), None);
    }
}
