//! The storage layer: every byte the log reads or writes goes through [`Storage`].
//!
//! Two implementations ship with the crate:
//!
//! - [`FsStorage`] — the real file system through `std::fs`, with positional reads and writes
//!   (`pread`/`pwrite`), `fdatasync`, directory fsync and `flock`-style lock files. Never mmap.
//! - [`SimStorage`] — an in-memory file system, deterministic from a seed, that keeps synced and
//!   unsynced bytes (and synced and unsynced directory entries) apart so tests can cut the power,
//!   crash the process and inject I/O faults. It follows SQLite's crash VFS (`src/test6.c`),
//!   redb's crash-consistency backend and TigerBeetle's simulated storage. A power cut tears
//!   unsynced writes at 512-byte sectors into new, zero, garbage or stale bytes; with
//!   [`SimStorage::set_stale_history`] a stale sector may even show bytes that a synced
//!   truncation cut off (a file system that reuses blocks without zeroing them). With
//!   [`SimStorage::set_free_bytes`] its disk fills up: a write stores what fits, then fails
//!   with ENOSPC.
//!
//! The split mirrors raft-engine's `FileSystem` trait and redb's `StorageBackend`: the log knows
//! bytes and barriers, the storage knows files.

use std::io;
use std::path::Path;

mod fs;
mod sim;

pub use fs::FsStorage;
pub use sim::{SimStorage, SIM_NOW_MS, SIM_SECTOR_BYTES};

/// How [`Storage::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// Read only; the file must exist. Writes through the handle fail.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write a new, empty file; fails with `ErrorKind::AlreadyExists` if the path
    /// exists (`O_CREAT | O_EXCL`). The new directory entry is durable only after
    /// [`Storage::sync_dir`] on its parent.
    CreateNew,
}

/// A file system as the log sees it: a flat set of directories holding regular files.
///
/// Durability contract the log relies on (and nothing more): bytes written to a file are durable
/// once [`StorageFile::sync_data`] returns `Ok`; a create, rename or remove is durable once
/// [`Storage::sync_dir`] on the parent directory returns `Ok`. Anything else may be lost, torn
/// at 512-byte granularity, zero-filled or persisted out of order by a power cut.
///
/// All methods may be called from several threads at once.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Creates `path` and any missing parents (like `mkdir -p`); directories get mode 0700 on
    /// Unix. Succeeds if it already exists.
    ///
    /// # Errors
    /// The underlying I/O error.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Opens the regular file at `path` in `mode` (new files get mode 0600 on Unix).
    ///
    /// # Errors
    /// `NotFound` if it does not exist (except [`OpenMode::CreateNew`]), `AlreadyExists` for
    /// `CreateNew` on an existing path, or any other I/O error.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;

    /// Names (not paths) of the regular files directly in `dir`, sorted ascending.
    /// Directories, symlinks and names that are not UTF-8 are left out.
    ///
    /// # Errors
    /// `NotFound` if `dir` does not exist, or any other I/O error.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;

    /// Whether a file or directory exists at `path`.
    ///
    /// # Errors
    /// An I/O error other than "not found" (for example a permission error on a parent).
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// Atomically renames `from` to `to`, replacing `to` if it exists. Durable after
    /// [`Storage::sync_dir`] on the parent directory.
    ///
    /// # Errors
    /// The underlying I/O error.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the file at `path`. Durable after [`Storage::sync_dir`] on the parent directory.
    ///
    /// # Errors
    /// `NotFound` or any other I/O error.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Makes the creates, renames and removes done so far in directory `path` durable (an
    /// `fsync` of the directory).
    ///
    /// # Errors
    /// The underlying I/O error. A failed directory sync must be treated like a failed
    /// `fdatasync`: the caller must not assume anything became durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Takes an exclusive, non-blocking lock on the file at `path` (created if absent) for as
    /// long as the returned guard lives. The lock excludes other processes and other opens in
    /// this process alike.
    ///
    /// # Errors
    /// `ErrorKind::WouldBlock` if someone else holds it, or any other I/O error.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn LockGuard>>;

    /// 16 random bytes, used for the store id of a new log. The default reads the operating
    /// system's random source (`getrandom`); [`SimStorage`] returns bytes from its seed so a
    /// simulated run is reproducible.
    ///
    /// # Errors
    /// The random source failed.
    fn random_id(&self) -> io::Result<[u8; 16]> {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(id)
    }

    /// Whether the log may do I/O of its own accord, on a timer or on a thread beside the
    /// writer: the idle high-water mark (`SYNCED`, written `WalOptions::synced_mark_delay` after
    /// a sync that nothing followed) and the write-back of `Buffered` and `Interval` logs (an
    /// fdatasync of the active segment every few MiB on a thread of its own). The default says
    /// yes. [`SimStorage`] says no unless [`SimStorage::set_timed_io`] turned it on: its fault
    /// plans count operations and its runs must replay from a seed, and I/O whose timing
    /// depends on how long a test step took, or on thread scheduling, would break both.
    /// Interval durability's own syncs are not affected (they are what the caller asked for).
    /// A storage that wraps another should answer as the one it wraps does.
    fn allows_timed_io(&self) -> bool {
        true
    }

    /// Wall-clock time in milliseconds since the Unix epoch, recorded in segment headers for
    /// humans only (never used for decisions). The default reads `SystemTime`;
    /// [`SimStorage`] returns a constant so its images are reproducible.
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// An open regular file. Reads and writes are positional (`pread`/`pwrite`): there is no cursor,
/// so a handle can be shared between threads.
// `len` is a fallible system call (`fstat`), not a container size: no `is_empty` twin.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync + std::fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at or past the
    /// end of the file).
    ///
    /// # Errors
    /// The underlying I/O error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file if needed (a gap reads as zeros).
    /// The bytes are visible to reads at once and durable only after [`StorageFile::sync_data`].
    ///
    /// # Errors
    /// The underlying I/O error; on error a prefix of `buf` may have been written.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Current length of the file in bytes.
    ///
    /// # Errors
    /// The underlying I/O error.
    fn len(&self) -> io::Result<u64>;

    /// Truncates or extends (with zeros) the file to `len` bytes. Durable after
    /// [`StorageFile::sync_data`].
    ///
    /// # Errors
    /// The underlying I/O error.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// `fdatasync`: makes every write and length change made so far through any handle of this
    /// file durable. A failure must never be retried as if it could succeed later: the kernel
    /// may already have dropped the dirty pages (PostgreSQL's "fsyncgate", 2018).
    ///
    /// # Errors
    /// The underlying I/O error.
    fn sync_data(&self) -> io::Result<()>;
}

/// A held lock from [`Storage::lock`]; the lock is released when the guard is dropped.
pub trait LockGuard: Send + Sync + std::fmt::Debug {}

/// A fault for [`SimStorage::inject`]: the matching operation number `after` (counting from 0,
/// from the moment of injection) fails once with `kind`.
///
/// `FaultPlan { after: 0, op: FaultOp::Sync, kind: FaultKind::Eio }` makes the very next
/// `sync_data`/`sync_dir` fail with EIO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultPlan {
    /// How many matching operations succeed before the one that fails.
    pub after: u64,
    /// Which operations count.
    pub op: FaultOp,
    /// How the chosen operation fails.
    pub kind: FaultKind,
}

/// The class of operation a [`FaultPlan`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// Every counted operation (everything [`SimStorage::io_ops`] counts).
    Any,
    /// `write_all_at` and `set_len`.
    Write,
    /// `sync_data` and `sync_dir`.
    Sync,
    /// `open` in any mode.
    Open,
    /// `rename`.
    Rename,
}

/// How an injected fault fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The operation fails with EIO and has no effect.
    Eio,
    /// The operation fails with ENOSPC ("no space left on device") and has no effect.
    Enospc,
    /// A write stores a seeded-random strict prefix of its bytes, then fails with EIO. Other
    /// operations fail like [`FaultKind::Eio`].
    ShortWrite,
}
