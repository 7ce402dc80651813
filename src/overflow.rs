//! Overflow files: the payloads of tasks not due soon, kept on disk instead
//! of in memory.
//!
//! A checkpoint moves the payloads of waiting tasks due later than
//! `Config::payload_window` out of memory into one new overflow file,
//! `DIR/overflow/{seq:016x}.ovf`, written once and never modified: entries
//! sorted by due time, so that the payloads coming due are read back
//! sequentially, ahead of their due time. A task then holds only the file's
//! number and the entry's offset. Files whose entries are mostly dead
//! (tasks fired, cancelled or rescheduled with a new payload) are compacted:
//! a later checkpoint copies their live entries into its new file, and a file
//! no live task and no checkpoint refers to is deleted.
//!
//! Layout (`wal/FORMAT.md`, "Overflow files"; every offset here mirrors it):
//! a 64-byte header, then entries laid end to end, each with its own CRC-32.
//! Reading trusts nothing: lengths are bounded before anything is allocated,
//! and an entry must carry the task id and key its reader expects.

use crate::checkpoint::{u32_at, u64_at};
use kairos_wal::format::StoreId;
use kairos_wal::storage::{OpenMode, Storage, StorageFile};
use std::io;
use std::path::{Path, PathBuf};

/// Name of the directory, inside a data directory, holding overflow files.
pub const OVERFLOW_DIR_NAME: &str = "overflow";
/// File-name suffix of an overflow file: `{seq:016x}.ovf`.
pub const OVERFLOW_SUFFIX: &str = ".ovf";
/// The header's magic bytes.
pub const OVERFLOW_MAGIC: [u8; 8] = *b"KAIROSOV";
/// The only format version this code reads and writes.
pub const OVERFLOW_FORMAT_VERSION: u32 = 1;
/// Bytes of the file header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of an entry before its key and payload.
pub const ENTRY_FIXED_BYTES: usize = 30;
/// Largest `entry_bytes` accepted: a 64 KiB key and a 16 MiB payload fit.
pub const ENTRY_BYTES_MAX: u32 = 17 * 1024 * 1024;

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = H_MAGIC + 8;
const H_CRC: usize = H_VERSION + 4;
const H_STORE_ID: usize = H_CRC + 4;
const H_SEQ: usize = H_STORE_ID + 16;
const H_ENTRIES: usize = H_SEQ + 8;
const H_RESERVED: usize = H_ENTRIES + 8;
const _: () = assert!(H_RESERVED + 16 == HEADER_BYTES);

// Entry offsets.
const E_BYTES: usize = 0;
const E_CRC: usize = E_BYTES + 4;
const E_ID: usize = E_CRC + 4;
const E_DUE: usize = E_ID + 8;
const E_KEY_LEN: usize = E_DUE + 8;
const E_PAYLOAD_LEN: usize = E_KEY_LEN + 2;
const _: () = assert!(E_PAYLOAD_LEN + 4 == ENTRY_FIXED_BYTES);

/// The file name of overflow file `seq`.
pub fn file_name(seq: u32) -> String {
    format!("{:016x}{OVERFLOW_SUFFIX}", u64::from(seq))
}

/// The number an overflow file name stands for; `None` for other names.
pub fn parse_file_name(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(OVERFLOW_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// One payload in an overflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The task it belongs to.
    pub task_id: u64,
    /// The task's due time when the file was written, UTC ms (the file's
    /// sort key; the task may have been rescheduled since).
    pub due_ms: u64,
    /// The task's key.
    pub key: Box<[u8]>,
    /// The payload.
    pub payload: Box<[u8]>,
}

/// Why an overflow entry could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OverflowReadError {
    /// The bytes there are not the entry expected.
    #[error("overflow file {path} is corrupt at byte offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the header or entry.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Reading failed.
    #[error("read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Builds an overflow file in memory, entry by entry in `(due_ms, task_id)`
/// order: each payload is copied once, into the file's bytes — whole
/// ([`OverflowWriter::finish`]), or a piece at a time
/// ([`OverflowWriter::drain`], then [`OverflowWriter::finish_parts`]) so a
/// large file is written as it is built.
#[derive(Debug)]
pub struct OverflowWriter {
    out: Vec<u8>,
    /// File offset of `out[0]` (bytes before it were drained).
    base: u64,
    entries: u64,
    last: Option<(u64, u64)>,
    store_id: StoreId,
    seq: u32,
}

impl OverflowWriter {
    /// Starts file `seq` of the store `store_id`.
    pub fn new(store_id: &StoreId, seq: u32) -> OverflowWriter {
        OverflowWriter {
            out: vec![0; HEADER_BYTES],
            base: 0,
            entries: 0,
            last: None,
            store_id: *store_id,
            seq,
        }
    }

    /// Appends an entry and returns its offset. Entries must come in
    /// strictly increasing `(due_ms, task_id)` order.
    ///
    /// # Panics
    /// If they do not (a bug in the caller: the file would not read back).
    pub fn push(&mut self, task_id: u64, due_ms: u64, key: &[u8], payload: &[u8]) -> u64 {
        assert!(
            self.last.is_none_or(|last| (due_ms, task_id) > last),
            "overflow entries out of order"
        );
        self.last = Some((due_ms, task_id));
        self.entries += 1;
        let offset = self.base + self.out.len() as u64;
        encode_entry(&mut self.out, task_id, due_ms, key, payload);
        offset
    }

    /// Bytes built and not yet drained.
    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    /// Takes the bytes built so far (the first piece starts with a zeroed
    /// header): `(file offset, bytes)`. Later entries' offsets are unchanged.
    pub fn drain(&mut self) -> (u64, Vec<u8>) {
        let at = self.base;
        let bytes = std::mem::take(&mut self.out);
        self.base += bytes.len() as u64;
        (at, bytes)
    }

    /// Ends a file written in pieces: its header and the last piece,
    /// `(file offset, bytes)`. The header must be written at offset 0 (over
    /// the zeros the first piece began with) before the file is synced.
    pub fn finish_parts(mut self) -> ([u8; HEADER_BYTES], (u64, Vec<u8>)) {
        let header = encode_header(&self.store_id, self.seq, self.entries);
        (header, self.drain())
    }

    /// Entries added so far.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// True when no entry was added.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The file's bytes, for a writer never drained (after a drain, the
    /// file's end comes from [`OverflowWriter::finish_parts`]).
    pub fn finish(mut self) -> Vec<u8> {
        assert_eq!(
            self.base, 0,
            "OverflowWriter::finish after drain: use finish_parts"
        );
        let header = encode_header(&self.store_id, self.seq, self.entries);
        self.out[..HEADER_BYTES].copy_from_slice(&header);
        self.out
    }

    /// A whole file from entries in any order (sorted here): its bytes and
    /// each entry's `(task_id, offset)` in file order.
    pub fn sorted(
        mut entries: Vec<Entry>,
        store_id: &StoreId,
        seq: u32,
    ) -> (Vec<u8>, Vec<(u64, u64)>) {
        entries.sort_unstable_by_key(|e| (e.due_ms, e.task_id));
        let mut w = OverflowWriter::new(store_id, seq);
        let offsets = entries
            .iter()
            .map(|e| (e.task_id, w.push(e.task_id, e.due_ms, &e.key, &e.payload)))
            .collect();
        (w.finish(), offsets)
    }
}

fn encode_header(store_id: &StoreId, seq: u32, entries: u64) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[H_MAGIC..H_VERSION].copy_from_slice(&OVERFLOW_MAGIC);
    b[H_VERSION..H_CRC].copy_from_slice(&OVERFLOW_FORMAT_VERSION.to_le_bytes());
    b[H_STORE_ID..H_SEQ].copy_from_slice(store_id);
    b[H_SEQ..H_ENTRIES].copy_from_slice(&u64::from(seq).to_le_bytes());
    b[H_ENTRIES..H_RESERVED].copy_from_slice(&entries.to_le_bytes());
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

fn encode_entry(out: &mut Vec<u8>, task_id: u64, due_ms: u64, key: &[u8], payload: &[u8]) {
    let start = out.len();
    let entry_bytes = (ENTRY_FIXED_BYTES - E_ID + key.len() + payload.len()) as u32;
    out.extend_from_slice(&entry_bytes.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&task_id.to_le_bytes());
    out.extend_from_slice(&due_ms.to_le_bytes());
    out.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start + E_ID..]);
    out[start + E_CRC..start + E_ID].copy_from_slice(&crc.to_le_bytes());
}

/// Parses the entry at the start of `b` (which holds at least its fixed
/// part); `Ok(None)` if `b` is shorter than the whole entry. The entry's
/// total length is `8 + entry_bytes`.
fn parse_entry(b: &[u8]) -> Result<Option<(Entry, usize)>, String> {
    Ok(parse_entry_ref(b)?.map(|(e, total)| {
        (
            Entry {
                task_id: e.task_id,
                due_ms: e.due_ms,
                key: e.key.into(),
                payload: e.payload.into(),
            },
            total,
        )
    }))
}

/// An entry's fields as they lie in a buffer ([`PieceReader`]): nothing
/// copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The task it belongs to.
    pub task_id: u64,
    /// The task's due time when the file was written, UTC ms.
    pub due_ms: u64,
    /// The task's key.
    pub key: &'a [u8],
    /// The payload.
    pub payload: &'a [u8],
}

/// [`parse_entry`] without copying the key and payload.
fn parse_entry_ref(b: &[u8]) -> Result<Option<(EntryRef<'_>, usize)>, String> {
    let entry_bytes = u32_at(b, E_BYTES);
    if entry_bytes > ENTRY_BYTES_MAX {
        return Err(format!(
            "entry length {entry_bytes} exceeds {ENTRY_BYTES_MAX}"
        ));
    }
    let total = E_ID + entry_bytes as usize;
    if total < ENTRY_FIXED_BYTES {
        return Err(format!(
            "entry length {entry_bytes} is shorter than an entry"
        ));
    }
    let Some(all) = b.get(..total) else {
        return Ok(None);
    };
    if crc32fast::hash(&all[E_ID..]) != u32_at(all, E_CRC) {
        return Err("entry CRC mismatch".into());
    }
    let key_len = usize::from(u16::from_le_bytes([all[E_KEY_LEN], all[E_KEY_LEN + 1]]));
    let payload_len = u32_at(all, E_PAYLOAD_LEN) as usize;
    if ENTRY_FIXED_BYTES + key_len + payload_len != total || key_len == 0 {
        return Err("entry lengths do not add up".into());
    }
    Ok(Some((
        EntryRef {
            task_id: u64_at(all, E_ID),
            due_ms: u64_at(all, E_DUE),
            key: &all[ENTRY_FIXED_BYTES..ENTRY_FIXED_BYTES + key_len],
            payload: &all[ENTRY_FIXED_BYTES + key_len..],
        },
        total,
    )))
}

/// Reads an overflow file a piece at a time: entry by entry from the start
/// ([`PieceReader::next_entry`]), or at offsets a caller already knows
/// ([`PieceReader::entry_at`]) — in increasing order they are read
/// sequentially, each piece once. Memory: one buffer of about `piece_bytes`
/// (more for a single larger entry, at most [`ENTRY_BYTES_MAX`] + 8), never
/// the whole file. Trusts nothing: every entry's length is bounded by the
/// file's size and [`ENTRY_BYTES_MAX`] before it is read, and its CRC is
/// checked. For compaction, which copies a file's live entries forward, and
/// for reading back a file just written. The header is not read (see
/// [`read_entry_count`]).
pub struct PieceReader {
    file: Box<dyn StorageFile>,
    path: PathBuf,
    len: u64,
    piece_bytes: usize,
    /// Bytes of the file from offset `buf_at` on.
    buf: Vec<u8>,
    buf_at: u64,
    /// Where [`PieceReader::next_entry`] goes on.
    next: u64,
}

impl PieceReader {
    /// Opens the overflow file at `path` (one open, one size query).
    ///
    /// # Errors
    /// [`OverflowReadError::Io`].
    pub fn open(
        storage: &dyn Storage,
        path: &Path,
        piece_bytes: usize,
    ) -> Result<PieceReader, OverflowReadError> {
        let io_err = |source| OverflowReadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
        let len = file.len().map_err(io_err)?;
        Ok(PieceReader {
            file,
            path: path.to_path_buf(),
            len,
            piece_bytes: piece_bytes.max(ENTRY_FIXED_BYTES),
            buf: Vec::new(),
            buf_at: HEADER_BYTES as u64,
            next: HEADER_BYTES as u64,
        })
    }

    /// The entry at `offset` and the offset of the one after it.
    ///
    /// # Errors
    /// [`OverflowReadError::Corrupt`] if no whole, intact entry starts
    /// there (inside the header, at or past the file's end, a bad length or
    /// CRC); I/O errors.
    pub fn entry_at(&mut self, offset: u64) -> Result<(EntryRef<'_>, u64), OverflowReadError> {
        let (start, total) = self.load(offset)?;
        let corrupt = |path: &Path, reason: String| OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        match parse_entry_ref(&self.buf[start..]) {
            Ok(Some((entry, n))) if n == total => Ok((entry, offset + total as u64)),
            Ok(_) => Err(corrupt(&self.path, "entry lengths do not add up".into())),
            Err(reason) => Err(corrupt(&self.path, reason)),
        }
    }

    /// The next entry in file order and its offset, from the first on;
    /// `None` at the file's end.
    ///
    /// # Errors
    /// As [`PieceReader::entry_at`]: the first damaged entry ends the
    /// reading.
    pub fn next_entry(&mut self) -> Result<Option<(u64, EntryRef<'_>)>, OverflowReadError> {
        let offset = self.next;
        if offset >= self.len {
            return Ok(None);
        }
        let (_, total) = self.load(offset)?;
        self.next = offset + total as u64;
        let (entry, _) = self.entry_at(offset)?;
        Ok(Some((offset, entry)))
    }

    /// Makes the whole entry at `offset` lie in the buffer; returns where
    /// it starts there and its total length (only bounded, not checked).
    fn load(&mut self, offset: u64) -> Result<(usize, usize), OverflowReadError> {
        let corrupt = |path: &Path, reason: &str| OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: reason.into(),
        };
        if offset < HEADER_BYTES as u64 || offset >= self.len {
            return Err(corrupt(&self.path, "no entry at this offset"));
        }
        if self.len - offset < ENTRY_FIXED_BYTES as u64 {
            return Err(corrupt(&self.path, "file ends inside an entry"));
        }
        let buffered = |r: &PieceReader, n: u64| {
            offset >= r.buf_at && offset + n <= r.buf_at + r.buf.len() as u64
        };
        if !buffered(self, ENTRY_FIXED_BYTES as u64) {
            self.fill(offset, self.piece_bytes)?;
        }
        let start = (offset - self.buf_at) as usize;
        let entry_bytes = u32_at(&self.buf[start..], E_BYTES);
        let total = E_ID as u64 + u64::from(entry_bytes);
        if entry_bytes > ENTRY_BYTES_MAX || total < ENTRY_FIXED_BYTES as u64 {
            return Err(corrupt(&self.path, "bad entry length"));
        }
        if offset + total > self.len {
            return Err(corrupt(&self.path, "entry runs past the file's end"));
        }
        if !buffered(self, total) {
            self.fill(offset, self.piece_bytes.max(total as usize))?;
        }
        Ok(((offset - self.buf_at) as usize, total as usize))
    }

    /// Reads `want` bytes (fewer at the file's end) from `offset` into the
    /// buffer.
    fn fill(&mut self, offset: u64, want: usize) -> Result<(), OverflowReadError> {
        let n = (self.len - offset).min(want as u64) as usize;
        self.buf.clear();
        self.buf.resize(n, 0);
        self.buf_at = offset;
        let io_err = |source| OverflowReadError::Io {
            path: self.path.clone(),
            source,
        };
        if !read_exact_at(self.file.as_ref(), &mut self.buf, offset).map_err(io_err)? {
            self.buf.clear();
            return Err(OverflowReadError::Corrupt {
                path: self.path.clone(),
                offset,
                reason: "file shrank while being read".into(),
            });
        }
        Ok(())
    }
}

fn read_exact_at(file: &dyn StorageFile, buf: &mut [u8], offset: u64) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            return Ok(false);
        }
        done += n;
    }
    Ok(true)
}

/// Reads the entry at `offset` of the overflow file at `path` and checks it
/// belongs to task `task_id` and, if `key` is given, has that key (a far
/// task's key is not in memory: the entry is where it is read from). Two
/// small reads; the payload is
/// allocated only after its length is bounded by [`ENTRY_BYTES_MAX`] and the
/// file's size. To read many entries of one file, open it once with
/// [`EntryFile::open`].
///
/// # Errors
/// [`OverflowReadError::Corrupt`] if the bytes are not that task's entry;
/// [`OverflowReadError::Io`].
pub fn read_entry(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
    task_id: u64,
    key: Option<&[u8]>,
) -> Result<Entry, OverflowReadError> {
    EntryFile::open(storage, path)?.read(offset, task_id, key)
}

/// An overflow file opened once to read entries at known offsets
/// ([`read_entry`] for each, without an open, a size query and a close per
/// entry: a batch of cancels of far tasks reads many entries of few files).
/// The size is taken at open: files are written once, before anything
/// refers to them.
#[derive(Debug)]
pub struct EntryFile {
    file: Box<dyn StorageFile>,
    len: u64,
    path: PathBuf,
}

/// Bytes [`EntryFile::read`] reads at once from an entry's start: its fixed
/// part, a key and a payload of a few hundred bytes. A larger entry takes a
/// second read.
const ENTRY_READ_GUESS_BYTES: u64 = 512;

impl EntryFile {
    /// Opens the file at `path` for reading and takes its size.
    ///
    /// # Errors
    /// [`OverflowReadError::Io`].
    pub fn open(storage: &dyn Storage, path: &Path) -> Result<EntryFile, OverflowReadError> {
        let io_err = |source| OverflowReadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
        let len = file.len().map_err(io_err)?;
        Ok(EntryFile {
            file,
            len,
            path: path.to_path_buf(),
        })
    }

    /// [`read_due`] of this file, through this descriptor (no open, size
    /// query or close), with a growing chunk: the entries from `offset` on
    /// due by `due_until`, the first `first_chunk_bytes` read at once, then
    /// twice as many each time every entry of a chunk was due, up to
    /// `chunk_bytes_max` (more for a single larger entry) — so that finding
    /// the entry at `offset` not due costs one small read (or one read of
    /// that entry, if larger), and a long run of due entries few reads. Also
    /// returns the due time of the entry it stopped at.
    ///
    /// # Errors
    /// As [`read_due`].
    pub fn read_due(
        &self,
        offset: u64,
        due_until: u64,
        first_chunk_bytes: usize,
        chunk_bytes_max: usize,
    ) -> Result<DueEntries, OverflowReadError> {
        read_due_in(
            self.file.as_ref(),
            self.len,
            &self.path,
            offset,
            due_until,
            Chunks {
                first: first_chunk_bytes,
                max: chunk_bytes_max,
            },
            READ_DUE_ENTRIES_MAX,
        )
    }

    /// [`read_entry`] of this file: the entry at `offset`, checked against
    /// `task_id` and `key` (if given).
    ///
    /// # Errors
    /// As [`read_entry`].
    pub fn read(
        &self,
        offset: u64,
        task_id: u64,
        key: Option<&[u8]>,
    ) -> Result<Entry, OverflowReadError> {
        let path = &self.path;
        let io_err = |source| OverflowReadError::Io {
            path: path.clone(),
            source,
        };
        let corrupt = |reason: String| OverflowReadError::Corrupt {
            path: path.clone(),
            offset,
            reason,
        };
        let file = self.file.as_ref();
        // One read for a typical entry: its fixed part and what follows, up
        // to ENTRY_READ_GUESS_BYTES (within the file); a second for the rest
        // of a larger one.
        let first = ENTRY_READ_GUESS_BYTES.min(self.len.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; first];
        if offset < HEADER_BYTES as u64
            || first < ENTRY_FIXED_BYTES
            || !read_exact_at(file, &mut buf, offset).map_err(io_err)?
        {
            return Err(corrupt("no entry at this offset".into()));
        }
        let entry_bytes = u32_at(&buf, E_BYTES);
        let total = E_ID as u64 + u64::from(entry_bytes);
        if entry_bytes > ENTRY_BYTES_MAX || offset.saturating_add(total) > self.len {
            return Err(corrupt(format!(
                "entry length {entry_bytes} runs past the file"
            )));
        }
        // `total` is within the file (checked above), so it fits a usize
        // as the file's bytes do.
        let total = total as usize;
        if total > first {
            buf.resize(total, 0);
            if !read_exact_at(file, &mut buf[first..], offset + first as u64).map_err(io_err)? {
                return Err(corrupt("file ends inside the entry".into()));
            }
        } else {
            buf.truncate(total);
        }
        let entry = match parse_entry(&buf).map_err(corrupt)? {
            Some((e, _)) => e,
            None => return Err(corrupt("file ends inside the entry".into())),
        };
        if entry.task_id != task_id || key.is_some_and(|k| *entry.key != *k) {
            return Err(corrupt(format!(
                "entry belongs to task {} (key {:?}), expected task {task_id}",
                entry.task_id,
                String::from_utf8_lossy(&entry.key)
            )));
        }
        Ok(entry)
    }
}

/// Reads the entries of the overflow file at `path` from `offset` on, in
/// file order (due time order), while their `due_ms` is at most `due_until`,
/// reading about `chunk_bytes` at a time (more for a larger entry), at most
/// 65 536 of them. Returns them with their offsets, the offset to continue
/// from — the file's length at its end, otherwise the first entry not taken
/// — and that entry's due time, read with the entry whole and checked (CRC),
/// so that a caller can trust it without reading the entry again
/// ([`DueEntries`]). A read that meets a damaged entry after reading some
/// stops before it without an error: the entries before it are returned,
/// with `next` the damaged entry's offset and `next_due_ms` the last
/// returned entry's due time (a lower bound), so the caller reads on from
/// there and gets the error.
///
/// # Errors
/// [`OverflowReadError::Corrupt`] if the entry at `offset` (the first one
/// the call would return) is damaged; I/O errors.
pub fn read_due(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
    due_until: u64,
    chunk_bytes: usize,
) -> Result<DueEntries, OverflowReadError> {
    read_due_at_most(
        storage,
        path,
        offset,
        due_until,
        chunk_bytes,
        READ_DUE_ENTRIES_MAX,
    )
}

/// [`read_due`], but at most `entries_max` entries (at least one).
///
/// # Errors
/// As [`read_due`].
pub fn read_due_at_most(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
    due_until: u64,
    chunk_bytes: usize,
    entries_max: usize,
) -> Result<DueEntries, OverflowReadError> {
    let io_err = |source| OverflowReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
    let len = file.len().map_err(io_err)?;
    read_due_in(
        file.as_ref(),
        len,
        path,
        offset,
        due_until,
        Chunks {
            first: chunk_bytes,
            max: chunk_bytes,
        },
        entries_max,
    )
}

/// What [`read_due`], [`read_due_at_most`] and [`EntryFile::read_due`]
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueEntries {
    /// The entries due, with their offsets, in file order.
    pub entries: Vec<(u64, Entry)>,
    /// Where to continue from: the first entry not taken (read and checked
    /// whole), or the file's length at its end.
    pub next: u64,
    /// The due time of the entry at `next` as the file has it (checked with
    /// the entry's CRC); `None` at the file's end. When the read stopped
    /// before a damaged entry at `next`, the due time of the last entry
    /// returned instead: a lower bound (at most the `due_until` asked for).
    pub next_due_ms: Option<u64>,
}

/// How much [`read_due_in`] reads at a time: `first`, then twice as much
/// after each chunk whose entries were all due, up to `max`.
#[derive(Debug, Clone, Copy)]
struct Chunks {
    first: usize,
    max: usize,
}

/// [`read_due_at_most`] of the open `file` (at `path`), `len` bytes long,
/// reading `chunks` at a time. Damage found after at least one entry was
/// read ends the read there without an error: the entries before it are
/// returned, `next` is the damaged entry's offset and `next_due_ms` the due
/// time of the last entry returned (a lower bound, at most `due_until`, so
/// a caller reads on from `next` and gets the error then). A reader that
/// can go past damage no live task needs (`crate::engine`'s promotion of
/// far tasks) thus has every intact entry before it.
fn read_due_in(
    file: &dyn StorageFile,
    len: u64,
    path: &Path,
    offset: u64,
    due_until: u64,
    chunks: Chunks,
    entries_max: usize,
) -> Result<DueEntries, OverflowReadError> {
    let mut out = Vec::new();
    match read_due_into(
        file,
        len,
        path,
        offset,
        due_until,
        chunks,
        entries_max,
        &mut out,
    ) {
        Ok((next, next_due_ms)) => Ok(DueEntries {
            entries: out,
            next,
            next_due_ms,
        }),
        Err(OverflowReadError::Corrupt {
            offset: damaged_at, ..
        }) if out.last().is_some_and(|(last, _)| *last < damaged_at) => {
            let next_due_ms = out.last().map(|(_, e)| e.due_ms);
            Ok(DueEntries {
                entries: out,
                next: damaged_at,
                next_due_ms,
            })
        }
        Err(e) => Err(e),
    }
}

/// [`read_due_in`]'s body: the entries read go into `out` (kept when it
/// fails); returns where to continue and that entry's due time.
#[allow(clippy::too_many_arguments)]
fn read_due_into(
    file: &dyn StorageFile,
    len: u64,
    path: &Path,
    mut offset: u64,
    due_until: u64,
    chunks: Chunks,
    entries_max: usize,
    out: &mut Vec<(u64, Entry)>,
) -> Result<(u64, Option<u64>), OverflowReadError> {
    let entries_max = entries_max.max(1);
    let io_err = |source| OverflowReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let chunk_max = chunks.max.max(ENTRY_FIXED_BYTES);
    let mut chunk_bytes = chunks.first.clamp(ENTRY_FIXED_BYTES, chunk_max);
    offset = offset.max(HEADER_BYTES as u64);
    while offset < len {
        let corrupt = |reason: String| OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let want = (len - offset).min(chunk_bytes as u64) as usize;
        chunk_bytes = chunk_bytes.saturating_mul(2).min(chunk_max);
        let mut buf = vec![0u8; want];
        if !read_exact_at(file, &mut buf, offset).map_err(io_err)? {
            return Err(corrupt("file shrank while being read".into()));
        }
        let mut at = 0;
        while buf.len() - at >= ENTRY_FIXED_BYTES {
            let entry_offset = offset + at as u64;
            match parse_entry(&buf[at..]) {
                Err(reason) => {
                    return Err(OverflowReadError::Corrupt {
                        path: path.to_path_buf(),
                        offset: entry_offset,
                        reason,
                    })
                }
                Ok(None) => break,
                Ok(Some((entry, n))) => {
                    if entry.due_ms > due_until || out.len() >= entries_max {
                        return Ok((entry_offset, Some(entry.due_ms)));
                    }
                    out.push((entry_offset, entry));
                    at += n;
                }
            }
        }
        if at == 0 && buf.len() < ENTRY_FIXED_BYTES {
            return Err(corrupt("file ends inside an entry".into()));
        }
        if at == 0 {
            // One entry larger than the chunk: read exactly it.
            let entry_bytes = u32_at(&buf, E_BYTES);
            let total = E_ID as u64 + u64::from(entry_bytes);
            if entry_bytes > ENTRY_BYTES_MAX || offset + total > len {
                return Err(corrupt(format!(
                    "entry length {entry_bytes} runs past the file"
                )));
            }
            let mut one = vec![0u8; total as usize];
            if !read_exact_at(file, &mut one, offset).map_err(io_err)? {
                return Err(corrupt("file ends inside the entry".into()));
            }
            match parse_entry(&one).map_err(corrupt)? {
                Some((entry, n)) => {
                    if entry.due_ms > due_until || out.len() >= entries_max {
                        return Ok((offset, Some(entry.due_ms)));
                    }
                    out.push((offset, entry));
                    at = n;
                }
                None => return Err(corrupt("file ends inside the entry".into())),
            }
        }
        offset += at as u64;
    }
    Ok((offset, None))
}

/// Entries [`read_due`] returns at most per call.
const READ_DUE_ENTRIES_MAX: usize = 65_536;

/// Bytes [`walk_far_entries`] reads at once.
const ORDER_WALK_PIECE_BYTES: usize = 1 << 20;

/// What [`walk_far_entries`] found of the far tasks' entries of a file:
/// offsets, ascending, each one of the `far_offsets` it was given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FarWalk {
    /// Entries that are not after the greatest (due time, task id) of the
    /// entries read before them: the promotion cannot place them.
    pub out_of_order: Vec<u64>,
    /// Offsets at which the reading never found an entry beginning (one
    /// inside another entry, a crafted checkpoint's): the promotion, which
    /// reads the file entry after entry, never finds those far tasks.
    pub unreached: Vec<u64>,
}

/// Reads the overflow file at `path` as the promotion of far tasks reads
/// it, and reports the far tasks' entries (at `far_offsets`, ascending) it
/// could not promote ([`FarWalk`]): those out of (due time, task id) order
/// — not after the greatest (due, id) of the entries read before them —
/// and those it never reaches. The file is read sequentially from its
/// first entry; an entry out of order that no far task owns is gone past
/// (it does not raise the greatest), and a damaged entry ends the
/// sequential reading, which goes on at the next of `far_offsets` after it
/// (as the promotion does; entries between are no far task's). The header
/// is not read. The writer sorts every file, so only damage that kept each
/// entry's CRC whole puts one out of order; the promotion, which starts
/// where its cursor is rather than at the first entry, finds a subset of
/// these (`kairos verify` and `kairos salvage` report them as damaged far
/// tasks). Memory: one piece of about 1 MiB.
///
/// # Errors
/// I/O errors ([`OverflowReadError::Io`]); damage is gone past, not an
/// error.
pub fn walk_far_entries(
    storage: &dyn Storage,
    path: &Path,
    far_offsets: &[u64],
) -> Result<FarWalk, OverflowReadError> {
    let mut reader = PieceReader::open(storage, path, ORDER_WALK_PIECE_BYTES)?;
    let mut greatest: Option<(u64, u64)> = None;
    let mut walk = FarWalk::default();
    let mut reached = vec![false; far_offsets.len()];
    loop {
        let at = reader.next;
        if let Ok(i) = far_offsets.binary_search(&at) {
            reached[i] = true;
        }
        match reader.next_entry() {
            Ok(None) => break,
            Ok(Some((offset, entry))) => {
                let order = (entry.due_ms, entry.task_id);
                if greatest.is_some_and(|g| order <= g) {
                    if far_offsets.binary_search(&offset).is_ok() {
                        walk.out_of_order.push(offset);
                    }
                } else {
                    greatest = Some(order);
                }
            }
            Err(OverflowReadError::Corrupt { .. }) => {
                let after = far_offsets.partition_point(|&o| o <= at);
                match far_offsets.get(after) {
                    Some(&next) => reader.next = next,
                    None => break,
                }
            }
            Err(e) => return Err(e),
        }
    }
    walk.unreached = far_offsets
        .iter()
        .zip(reached)
        .filter(|(_, reached)| !reached)
        .map(|(&offset, _)| offset)
        .collect();
    Ok(walk)
}

/// The entry count in the header of the overflow file number `seq` at
/// `path` (one 64-byte read; the header is checked: magic, version, CRC,
/// the store id if given, the number).
///
/// Given `last_referenced`, the largest entry offset a task or dead letter
/// refers to, also checks that the entry there lies whole within the file
/// (a size query and one read of its fixed part, no payload): a file cut
/// short is found when the engine opens, not when a task's payload is
/// first needed days later.
///
/// # Errors
/// [`OverflowReadError::Corrupt`] for a bad header or a file that ends
/// before the entry at `last_referenced` does; I/O errors.
pub fn read_entry_count(
    storage: &dyn Storage,
    path: &Path,
    store_id: Option<&StoreId>,
    seq: u32,
    last_referenced: Option<u64>,
) -> Result<u64, OverflowReadError> {
    let io_err = |source| OverflowReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let corrupt = |reason: &str| OverflowReadError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        reason: reason.into(),
    };
    let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
    let mut header = [0u8; HEADER_BYTES];
    if !read_exact_at(file.as_ref(), &mut header, 0).map_err(io_err)? {
        return Err(corrupt("file ends inside the header"));
    }
    if header[H_MAGIC..H_VERSION] != OVERFLOW_MAGIC
        || u32_at(&header, H_VERSION) != OVERFLOW_FORMAT_VERSION
        || u32_at(&header, H_CRC) != header_crc(&header)
    {
        return Err(corrupt("bad header (magic, version or CRC)"));
    }
    if store_id.is_some_and(|id| header[H_STORE_ID..H_SEQ] != id[..]) {
        return Err(corrupt("belongs to another data directory (store id)"));
    }
    if u64_at(&header, H_SEQ) != u64::from(seq) {
        return Err(corrupt("its header names another file number"));
    }
    if let Some(offset) = last_referenced {
        let len = file.len().map_err(io_err)?;
        let cut = |reason: String| OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: format!("{reason}; the file is {len} bytes (cut short?)"),
        };
        let mut fixed = [0u8; ENTRY_FIXED_BYTES];
        if offset < HEADER_BYTES as u64
            || !read_exact_at(file.as_ref(), &mut fixed, offset).map_err(io_err)?
        {
            return Err(cut("no whole entry where a task's entry should be".into()));
        }
        let entry_bytes = u32_at(&fixed, E_BYTES);
        let end = offset + E_ID as u64 + u64::from(entry_bytes);
        if entry_bytes > ENTRY_BYTES_MAX || end > len {
            return Err(cut(format!(
                "a task's entry of {entry_bytes} bytes here runs past the end of the file"
            )));
        }
    }
    Ok(u64_at(&header, H_ENTRIES))
}

/// Reads a whole overflow file from bytes in memory, checking the header
/// (magic, version, CRC, store id if given, sequence number) and every entry;
/// returns the entries with their offsets. For `kairos verify`-style checks,
/// compaction and the fuzz target.
///
/// # Errors
/// `Err((offset, reason))` at the first damage.
pub fn decode(
    bytes: &[u8],
    store_id: Option<&StoreId>,
    seq: Option<u32>,
) -> Result<Vec<(u64, Entry)>, (u64, String)> {
    decode_from(&mut SliceBytes(bytes), store_id, seq).map_err(|e| match e {
        DecodeFailure::Corrupt(offset, reason) => (offset, reason),
        // A slice neither fails to read nor shrinks.
        DecodeFailure::Io(e) => (0, e.to_string()),
        DecodeFailure::Shrank(offset) => (offset, "file shrank while being read".into()),
    })
}

/// The bytes of an overflow file by offset, for [`decode_from`]: a slice in
/// memory ([`decode`]) or a file read a window at a time ([`read_file`]).
trait FileBytes {
    /// The file's length.
    fn len(&self) -> u64;
    /// The `n` bytes at `at` (`at + n` is at most [`FileBytes::len`]);
    /// `Ok(None)` if the file ended first (it shrank while being read).
    fn get(&mut self, at: u64, n: usize) -> io::Result<Option<&[u8]>>;
}

struct SliceBytes<'a>(&'a [u8]);

impl FileBytes for SliceBytes<'_> {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn get(&mut self, at: u64, n: usize) -> io::Result<Option<&[u8]>> {
        let start = usize::try_from(at).unwrap_or(usize::MAX);
        Ok(self.0.get(start..).and_then(|rest| rest.get(..n)))
    }
}

/// A file read sequentially through a window of [`FILE_WINDOW_BYTES`] (or
/// one entry, when an entry is larger): memory follows the entries, not the
/// file's size, whatever its length field says.
struct WindowBytes<'a> {
    file: &'a dyn StorageFile,
    len: u64,
    buf: Vec<u8>,
    /// The file offset of `buf[0]`.
    buf_at: u64,
}

/// The window [`read_file`] reads an overflow file through.
const FILE_WINDOW_BYTES: usize = 1 << 20;

impl FileBytes for WindowBytes<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn get(&mut self, at: u64, n: usize) -> io::Result<Option<&[u8]>> {
        let end = at.saturating_add(n as u64);
        if at < self.buf_at || end > self.buf_at + self.buf.len() as u64 {
            let want = (self.len.saturating_sub(at)).min(FILE_WINDOW_BYTES.max(n) as u64);
            self.buf.clear();
            self.buf.resize(want as usize, 0);
            self.buf_at = at;
            if !read_exact_at(self.file, &mut self.buf, at)? {
                self.buf.clear();
                return Ok(None);
            }
        }
        let start = (at - self.buf_at) as usize;
        Ok(self.buf.get(start..start + n))
    }
}

/// Why [`decode_from`] stopped.
enum DecodeFailure {
    /// Damage at this offset.
    Corrupt(u64, String),
    /// Reading failed.
    Io(io::Error),
    /// The file ended before this offset's bytes could be read.
    Shrank(u64),
}

/// [`decode`]'s checks over `bytes`: the header first, then each entry in
/// turn, its length bounded (by [`ENTRY_BYTES_MAX`] and the bytes left)
/// before the rest of it is read.
fn decode_from(
    bytes: &mut dyn FileBytes,
    store_id: Option<&StoreId>,
    seq: Option<u32>,
) -> Result<Vec<(u64, Entry)>, DecodeFailure> {
    let corrupt = |offset: u64, reason: String| DecodeFailure::Corrupt(offset, reason);
    let len = bytes.len();
    if len < HEADER_BYTES as u64 {
        return Err(corrupt(
            0,
            format!("file is {len} bytes, shorter than the header"),
        ));
    }
    let mut header = [0u8; HEADER_BYTES];
    header.copy_from_slice(
        bytes
            .get(0, HEADER_BYTES)
            .map_err(DecodeFailure::Io)?
            .ok_or(DecodeFailure::Shrank(0))?,
    );
    if header[H_MAGIC..H_VERSION] != OVERFLOW_MAGIC {
        return Err(corrupt(0, "bad magic: not a Kairos overflow file".into()));
    }
    let version = u32_at(&header, H_VERSION);
    if version != OVERFLOW_FORMAT_VERSION {
        return Err(corrupt(
            0,
            format!("format version {version}; this build reads {OVERFLOW_FORMAT_VERSION}"),
        ));
    }
    if u32_at(&header, H_CRC) != header_crc(&header) {
        return Err(corrupt(0, "header CRC mismatch".into()));
    }
    if header[H_RESERVED..] != [0u8; 16] {
        return Err(corrupt(0, "reserved header bytes are not zero".into()));
    }
    if let Some(id) = store_id {
        if header[H_STORE_ID..H_SEQ] != id[..] {
            return Err(corrupt(
                0,
                "belongs to another data directory (store id)".into(),
            ));
        }
    }
    if let Some(seq) = seq {
        if u64_at(&header, H_SEQ) != u64::from(seq) {
            return Err(corrupt(
                0,
                format!(
                    "header says file {}, its name {seq}",
                    u64_at(&header, H_SEQ)
                ),
            ));
        }
    }
    let count = u64_at(&header, H_ENTRIES);
    let mut out = Vec::new();
    let mut at = HEADER_BYTES as u64;
    let mut last = (0u64, 0u64);
    while at < len {
        let left = len - at;
        if left < ENTRY_FIXED_BYTES as u64 {
            return Err(corrupt(at, "file ends inside an entry".into()));
        }
        let fixed = bytes
            .get(at, ENTRY_FIXED_BYTES)
            .map_err(DecodeFailure::Io)?
            .ok_or(DecodeFailure::Shrank(at))?;
        // The length is checked on the fixed part alone (as `parse_entry` checks it), so
        // no more than the bytes left — and at most one entry — is ever read.
        let parsed = match parse_entry(fixed).map_err(|r| corrupt(at, r))? {
            Some(parsed) => Some(parsed),
            None => {
                let total = E_ID as u64 + u64::from(u32_at(fixed, E_BYTES));
                if total > left {
                    return Err(corrupt(at, "file ends inside an entry".into()));
                }
                let whole = bytes
                    .get(at, total as usize)
                    .map_err(DecodeFailure::Io)?
                    .ok_or(DecodeFailure::Shrank(at))?;
                parse_entry(whole).map_err(|r| corrupt(at, r))?
            }
        };
        let Some((entry, n)) = parsed else {
            return Err(corrupt(at, "file ends inside an entry".into()));
        };
        let order = (entry.due_ms, entry.task_id);
        if !out.is_empty() && order <= last {
            return Err(corrupt(
                at,
                "entries out of (due time, task id) order".into(),
            ));
        }
        last = order;
        out.push((at, entry));
        at += n as u64;
    }
    if out.len() as u64 != count {
        // The header read whole: the damage is in the entries — where the file ends if it
        // holds fewer (cut at an entry boundary), at the first one too many otherwise — so
        // that a reader judging damage entry by entry (`kairos verify`, `kairos salvage`)
        // sees which entries are lost.
        let offset = usize::try_from(count)
            .ok()
            .and_then(|c| out.get(c))
            .map_or(at, |(o, _)| *o);
        return Err(corrupt(
            offset,
            format!(
                "header counts {count} entries, the file holds {}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// Reads the whole overflow file at `path`, as [`decode`] reads it from
/// memory, but sequentially through a window of about 1 MiB: memory follows
/// the entries that check, never the file's length (a file cut short, padded
/// with zeros or sparse, however long, fails at its first bad entry having
/// allocated little).
///
/// # Errors
/// As [`decode`], or an I/O error.
pub fn read_file(
    storage: &dyn Storage,
    path: &Path,
    store_id: Option<&StoreId>,
    seq: Option<u32>,
) -> Result<Vec<(u64, Entry)>, OverflowReadError> {
    let io_err = |source| OverflowReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = storage.open(path, OpenMode::Read).map_err(io_err)?;
    let len = file.len().map_err(io_err)?;
    let mut bytes = WindowBytes {
        file: file.as_ref(),
        len,
        buf: Vec::new(),
        buf_at: 0,
    };
    decode_from(&mut bytes, store_id, seq).map_err(|e| match e {
        DecodeFailure::Corrupt(offset, reason) => OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        },
        DecodeFailure::Io(source) => io_err(source),
        DecodeFailure::Shrank(offset) => OverflowReadError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: "file shrank while being read".into(),
        },
    })
}

/// Overflow files `(number, name)` by number, and leftover temporary names.
pub type Listing = crate::checkpoint::NumberedListing<u32>;

/// The overflow files in `dir`, by number, and leftover temporary names.
///
/// # Errors
/// The listing's I/O error (a missing directory holds none).
pub fn list(storage: &dyn Storage, dir: &Path) -> io::Result<Listing> {
    crate::checkpoint::list_numbered(storage, dir, parse_file_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_wal::SimStorage;

    fn entry(id: u64, due: u64, payload: &[u8]) -> Entry {
        Entry {
            task_id: id,
            due_ms: due,
            key: format!("k{id}").into_bytes().into(),
            payload: payload.into(),
        }
    }

    #[test]
    fn piece_reader_reads_in_order_and_at_offsets_across_pieces() {
        let big = vec![7u8; 1000];
        let entries = vec![
            entry(1, 10, b"one"),
            entry(2, 20, &big),
            entry(3, 30, b""),
            entry(4, 40, b"four"),
        ];
        let (bytes, offsets) = OverflowWriter::sorted(entries.clone(), &[9; 16], 3);
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        sim.write_file(path, &bytes);
        // Pieces of 64 bytes: the 1 000-byte entry is read whole on its own.
        let mut r = PieceReader::open(&sim, path, 64).unwrap();
        let mut seen = Vec::new();
        while let Some((offset, e)) = r.next_entry().unwrap() {
            seen.push((
                offset,
                e.task_id,
                e.due_ms,
                e.key.to_vec(),
                e.payload.to_vec(),
            ));
        }
        let want: Vec<_> = offsets
            .iter()
            .zip(&entries)
            .map(|(&(id, offset), e)| (offset, id, e.due_ms, e.key.to_vec(), e.payload.to_vec()))
            .collect();
        assert_eq!(seen, want);
        // At offsets, out of order; `entry_at` also gives the next offset.
        for &(offset, id, _, _, ref payload) in want.iter().rev() {
            let (e, next) = r.entry_at(offset).unwrap();
            assert_eq!((e.task_id, e.payload), (id, &payload[..]));
            let n = want.iter().position(|w| w.0 == offset).unwrap();
            let expect_next = want.get(n + 1).map_or(bytes.len() as u64, |w| w.0);
            assert_eq!(next, expect_next);
        }
    }

    #[test]
    fn piece_reader_refuses_damage_with_its_offset() {
        let (mut bytes, offsets) = OverflowWriter::sorted(
            vec![entry(1, 10, b"one"), entry(2, 20, b"two")],
            &[9; 16],
            3,
        );
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        sim.write_file(path, &bytes);
        let mut r = PieceReader::open(&sim, path, 4096).unwrap();
        let corrupt_at = |e: OverflowReadError| match e {
            OverflowReadError::Corrupt { offset, .. } => offset,
            other => panic!("{other}"),
        };
        // Inside the header, past the end, not an entry's start.
        assert_eq!(corrupt_at(r.entry_at(3).unwrap_err()), 3);
        let end = bytes.len() as u64;
        assert_eq!(corrupt_at(r.entry_at(end).unwrap_err()), end);
        assert!(r.entry_at(offsets[1].1 + 1).is_err());
        // A flipped payload byte: the CRC catches it, at that entry.
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        sim.write_file(path, &bytes);
        let mut r = PieceReader::open(&sim, path, 4096).unwrap();
        assert_eq!(r.next_entry().unwrap().unwrap().0, offsets[0].1);
        assert_eq!(corrupt_at(r.next_entry().unwrap_err()), offsets[1].1);
        // Cut inside the last entry.
        bytes.truncate(bytes.len() - 2);
        sim.write_file(path, &bytes);
        let mut r = PieceReader::open(&sim, path, 4096).unwrap();
        assert!(r.next_entry().is_ok());
        assert_eq!(corrupt_at(r.next_entry().unwrap_err()), offsets[1].1);
    }

    /// [`walk_far_entries`] reads as the promotion does: an entry not after the
    /// greatest before it is out of order (reported if a far task's; the
    /// greatest not raised by it), and a damaged entry is gone past to the
    /// next far task's entry after it.
    #[test]
    fn the_far_walk_reports_entries_not_after_the_greatest_before() {
        let (header, _) = OverflowWriter::sorted(Vec::new(), &[9; 16], 1);
        let mut bytes = header;
        let mut offsets = Vec::new();
        // (id, due) in file order; entry 5 is damaged below.
        let order = [
            (1, 10),
            (2, 50),
            (3, 20),
            (4, 30),
            (5, 60),
            (8, 95),
            (6, 45),
            (7, 80),
        ];
        for (id, due) in order {
            offsets.push(bytes.len() as u64);
            encode_entry(&mut bytes, id, due, format!("k{id}").as_bytes(), b"payload");
        }
        let damaged = offsets[4] as usize + ENTRY_FIXED_BYTES;
        bytes[damaged] ^= 1;
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        sim.write_file(path, &bytes);
        // Far tasks own the entries of tasks 3, 6 and 7; 4 is out of order too, no far
        // task's. After the damage the reading goes on at task 6's entry (task 8's, due
        // later than all, is not read: read, it would put 6's and 7's out of order).
        let far = [offsets[2], offsets[6], offsets[7]];
        let walk = walk_far_entries(&sim, path, &far).unwrap();
        assert_eq!(walk.out_of_order, [offsets[2], offsets[6]]);
        assert!(walk.unreached.is_empty());
        // Without a far task after the damage, the reading ends there.
        let walk = walk_far_entries(&sim, path, &far[..1]).unwrap();
        assert_eq!(walk.out_of_order, [offsets[2]]);
        // A sorted file has none.
        let (sorted, at) = OverflowWriter::sorted(
            vec![entry(1, 10, b"a"), entry(2, 10, b"b"), entry(3, 5, b"c")],
            &[9; 16],
            1,
        );
        sim.write_file(path, &sorted);
        let all: Vec<u64> = at.iter().map(|(_, o)| *o).collect();
        assert_eq!(
            walk_far_entries(&sim, path, &all).unwrap(),
            FarWalk::default()
        );
    }

    /// A far task's offset where no entry of the file's chain begins — a
    /// whole, intact entry inside another entry's payload — is unreached:
    /// the promotion, reading entry after entry, never finds it; reached
    /// once damage before it makes the reading jump there.
    #[test]
    fn the_far_walk_reports_offsets_inside_another_entry_as_unreached() {
        let mut nested = Vec::new();
        encode_entry(&mut nested, 9, 15, b"k9", b"inner");
        let (header, _) = OverflowWriter::sorted(Vec::new(), &[9; 16], 1);
        let mut bytes = header;
        let mut offsets = Vec::new();
        for (id, due, payload) in [(1, 10, &b"x"[..]), (2, 20, &nested), (3, 30, b"y")] {
            offsets.push(bytes.len() as u64);
            encode_entry(&mut bytes, id, due, format!("k{id}").as_bytes(), payload);
        }
        let inside = offsets[1] as usize
            + bytes[offsets[1] as usize..]
                .windows(nested.len())
                .position(|w| w == nested)
                .expect("the nested entry");
        let inside = inside as u64;
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        sim.write_file(path, &bytes);
        // It reads back on its own, as verify's check of each entry reads it.
        assert_eq!(
            read_entry(&sim, path, inside, 9, Some(b"k9"))
                .unwrap()
                .due_ms,
            15
        );
        let far = [offsets[0], inside, offsets[2]];
        let walk = walk_far_entries(&sim, path, &far).unwrap();
        assert_eq!(walk.unreached, [inside]);
        assert!(walk.out_of_order.is_empty());
        // Entry 1 damaged: the reading goes on at the next far offset, inside
        // entry 2, then on from the nested entry's end (entry 3).
        bytes[offsets[0] as usize + ENTRY_FIXED_BYTES] ^= 1;
        sim.write_file(path, &bytes);
        let walk = walk_far_entries(&sim, path, &far).unwrap();
        assert_eq!(walk, FarWalk::default());
    }

    #[test]
    fn written_sorted_and_read_back_by_offset() {
        let (bytes, offsets) = OverflowWriter::sorted(
            vec![
                entry(2, 50, b"two"),
                entry(1, 90, b"one"),
                entry(3, 50, b""),
            ],
            &[9; 16],
            7,
        );
        assert_eq!(offsets.iter().map(|o| o.0).collect::<Vec<_>>(), [2, 3, 1]);
        let all = decode(&bytes, Some(&[9; 16]), Some(7)).unwrap();
        assert_eq!(all.len(), 3);
        let sim = SimStorage::new(1);
        sim.write_file(Path::new("/o"), &bytes);
        let e = read_entry(&sim, Path::new("/o"), offsets[2].1, 1, Some(b"k1")).unwrap();
        assert_eq!(&*e.payload, b"one");
        assert!(read_entry(&sim, Path::new("/o"), offsets[2].1, 2, Some(b"k1")).is_err());
        assert!(read_entry(&sim, Path::new("/o"), offsets[2].1 + 1, 1, Some(b"k1")).is_err());
    }

    #[test]
    fn every_truncation_and_bit_flip_is_refused() {
        let (bytes, _) = OverflowWriter::sorted(
            vec![entry(1, 5, b"payload"), entry(2, 6, b"x")],
            &[1; 16],
            1,
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], None, None).is_err(), "cut {cut}");
        }
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[at] ^= 1 << bit;
                assert!(
                    decode(&b, Some(&[1; 16]), Some(1)).is_err(),
                    "flip {at}.{bit}"
                );
            }
        }
    }

    /// `read_file` (from disk, through a window) answers exactly as `decode` (from memory)
    /// for every cut and bit flip of a file whose middle entry is larger than the window.
    #[test]
    fn read_file_agrees_with_decode_through_its_window() {
        let big = vec![7u8; FILE_WINDOW_BYTES + 100];
        let (bytes, _) = OverflowWriter::sorted(
            vec![entry(1, 5, b"p"), entry(2, 6, &big), entry(3, 7, b"xyz")],
            &[1; 16],
            1,
        );
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        let both = |b: &[u8]| {
            sim.write_file(path, b);
            let from_disk = match read_file(&sim, path, Some(&[1; 16]), Some(1)) {
                Ok(entries) => Ok(entries),
                Err(OverflowReadError::Corrupt { offset, reason, .. }) => Err((offset, reason)),
                Err(e) => panic!("{e}"),
            };
            (decode(b, Some(&[1; 16]), Some(1)), from_disk)
        };
        let (whole, from_disk) = both(&bytes);
        assert_eq!(whole.as_ref().map(Vec::len), Ok(3));
        assert_eq!(whole, from_disk);
        let near_ends = (0..200).chain(bytes.len() - 200..bytes.len());
        for cut in near_ends.clone().chain([bytes.len() / 2]) {
            let (whole, from_disk) = both(&bytes[..cut]);
            assert!(whole.is_err(), "cut {cut}");
            assert_eq!(whole, from_disk, "cut {cut}");
        }
        for at in near_ends {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            let (whole, from_disk) = both(&b);
            assert_eq!(whole, from_disk, "flip {at}");
        }
        // Zeros after the last entry, as a sparse file's tail reads: damage at the old end.
        let mut padded = bytes.clone();
        padded.resize(bytes.len() + 4096, 0);
        let (whole, from_disk) = both(&padded);
        assert_eq!(whole.map_err(|e| e.0), Err(bytes.len() as u64));
        assert_eq!(from_disk.map_err(|e| e.0), Err(bytes.len() as u64));
    }

    #[test]
    fn read_due_refuses_stray_bytes_after_the_last_entry() {
        let (mut bytes, _) = OverflowWriter::sorted(vec![entry(1, 5, b"p")], &[1; 16], 1);
        bytes.extend_from_slice(b"ab");
        let sim = SimStorage::new(1);
        sim.write_file(Path::new("/o"), &bytes);
        for chunk in [1, 16, 64, 1 << 20] {
            // The entry before the stray bytes, then the error from there.
            let read = read_due(&sim, Path::new("/o"), 0, u64::MAX, chunk).unwrap();
            assert_eq!(read.entries.len(), 1);
            assert_eq!(read.next, bytes.len() as u64 - 2);
            assert_eq!(read.next_due_ms, Some(5));
            match read_due(&sim, Path::new("/o"), read.next, u64::MAX, chunk) {
                Err(OverflowReadError::Corrupt { offset, .. }) => assert_eq!(offset, read.next),
                other => panic!("expected damage at {}, got {other:?}", read.next),
            }
        }
    }

    /// A file of the simulated disk that records the length of each read.
    #[derive(Debug)]
    struct Reads {
        inner: Box<dyn StorageFile>,
        lens: std::sync::Mutex<Vec<usize>>,
    }

    impl StorageFile for Reads {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.lens.lock().unwrap().push(buf.len());
            self.inner.read_at(buf, offset)
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_all_at(buf, offset)
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.inner.sync_data()
        }
    }

    /// `read_due_in` with growing chunks: one first read when the entry at
    /// the offset is not due (its due time returned), reads doubling up to
    /// the cap while every entry is due, and an entry larger than the chunk
    /// read whole.
    #[test]
    fn read_due_grows_its_chunk_while_entries_are_due() {
        // 100 entries of 100 bytes (key "k1".."k100", padded payloads),
        // entry `i` due at 10 * i; then one of 5 000 bytes.
        let mut entries: Vec<Entry> = (1..=100u64)
            .map(|i| {
                let key_len = format!("k{i}").len();
                entry(i, 10 * i, &vec![b'p'; 100 - ENTRY_FIXED_BYTES - key_len])
            })
            .collect();
        entries.push(entry(101, 5_000, &[b'q'; 4_000]));
        let (bytes, offsets) = OverflowWriter::sorted(entries, &[9; 16], 3);
        let sim = SimStorage::new(1);
        let path = Path::new("/o");
        sim.write_file(path, &bytes);
        let len = bytes.len() as u64;
        let file = Reads {
            inner: sim.open(path, OpenMode::Read).unwrap(),
            lens: Default::default(),
        };
        let chunks = Chunks {
            first: 256,
            max: 2048,
        };
        let read = |offset: u64, until: u64| {
            file.lens.lock().unwrap().clear();
            let r = read_due_in(&file, len, path, offset, until, chunks, 1 << 16).unwrap();
            (r, std::mem::take(&mut *file.lens.lock().unwrap()))
        };
        let at = |i: usize| offsets[i].1;
        // Nothing due: one first read, the due time of the entry there.
        let (r, lens) = read(at(0), 9);
        assert_eq!(
            (r.entries.len(), r.next, r.next_due_ms),
            (0, at(0), Some(10))
        );
        assert_eq!(lens, [256]);
        // The 100 small entries due: 256, 512, 1024, then 2048 at a time
        // (each read from the first entry not whole in the last), and the
        // large entry found not due in the last chunk is read whole (its
        // CRC checked).
        let large = ENTRY_FIXED_BYTES + "k101".len() + 4_000;
        let (r, lens) = read(at(0), 1_000);
        assert_eq!(
            (r.entries.len(), r.next, r.next_due_ms),
            (100, at(100), Some(5_000))
        );
        assert_eq!(r.entries[99].0, at(99));
        assert_eq!(lens[..4], [256, 512, 1024, 2048]);
        assert_eq!(lens.last(), Some(&large));
        assert!(
            lens[4..lens.len() - 1].iter().all(|&n| n == 2048),
            "{lens:?}"
        );
        // The large entry, not due: a first read, then it whole.
        let (r, lens) = read(at(100), 4_999);
        assert_eq!(
            (r.entries.len(), r.next, r.next_due_ms),
            (0, at(100), Some(5_000))
        );
        assert_eq!(lens, [256, large]);
        // Due: taken, the file's end reached.
        let (r, _) = read(at(100), 5_000);
        assert_eq!((r.entries.len(), r.next, r.next_due_ms), (1, len, None));
        // At the end: no read.
        let (r, lens) = read(len, u64::MAX);
        assert_eq!((r.entries.len(), r.next, r.next_due_ms), (0, len, None));
        assert!(lens.is_empty());
    }

    #[test]
    fn names() {
        assert_eq!(file_name(10), "000000000000000a.ovf");
        assert_eq!(parse_file_name("000000000000000a.ovf"), Some(10));
        assert_eq!(parse_file_name("0000000100000000.ovf"), None);
    }
}
