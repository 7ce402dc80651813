//! The error type of the log.

use std::path::PathBuf;

use crate::Lsn;

/// The error a replay callback of [`Wal::open`](crate::Wal::open) returns to abort the open;
/// its `Display` is the string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(pub String);

/// Every way a log operation can fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A file operation failed. If it was a write or sync of the writer, the log is poisoned.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation, e.g. `"write"`, `"fdatasync"`, `"rename"`.
        op: &'static str,
        /// The file or directory it was applied to.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// The log directory is locked by another open, in this process or another.
    #[error("log directory is locked by another open: {}", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// Durable data is damaged: a checksum or structure error in a sealed segment or below the
    /// durable mark, or a frame whose checksum is valid but whose content breaks the format.
    /// Nothing was truncated or skipped.
    #[error("corrupt log: {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// Byte offset of the damaged frame or header in `file`.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A segment carries another log's store id (it was copied from another directory).
    #[error("segment belongs to another log: {}", file.display())]
    ForeignSegment {
        /// The foreign segment.
        file: PathBuf,
    },
    /// A segment is missing: between two others (sequence numbers or LSNs jump), below the
    /// oldest present one (it is not the one `TRIM` names, or not segment 1 when there is no
    /// `TRIM`), or above the newest (the last clean close or idle sync, recorded in `CLOSED`
    /// or `SYNCED`, saw it).
    #[error("missing segment (detected at {}): {reason}", file.display())]
    MissingSegment {
        /// The segment right after the gap; if no segment follows it, the file that proves
        /// the missing one existed (`TRIM`, `CLOSED` or `SYNCED`).
        file: PathBuf,
        /// Which sequence numbers or LSNs are missing.
        reason: String,
    },
    /// A file was written in a format version this build cannot read.
    #[error("unsupported format version {version} in {}", file.display())]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// The version it declares.
        version: u16,
    },
    /// A write or sync failed (this call's or an earlier one); the log accepts nothing more
    /// until it is reopened.
    #[error("log is poisoned by a failed write or sync: {cause}")]
    Poisoned {
        /// The operation that failed, its path and its error.
        cause: String,
    },
    /// A record body (or a whole append) is larger than allowed.
    #[error("record of {bytes} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge {
        /// The size offered, in bytes.
        bytes: usize,
        /// The limit, in bytes.
        max: u32,
    },
    /// An append was refused: empty, a reserved record type, or too many records.
    #[error("invalid record: {reason}")]
    InvalidRecord {
        /// Why.
        reason: String,
    },
    /// [`WalOptions`](crate::WalOptions) out of range.
    #[error("invalid options: {reason}")]
    InvalidOptions {
        /// Which option and why.
        reason: String,
    },
    /// The log is closing or its writer has stopped.
    #[error("log is closed")]
    Closed,
    /// The replay callback of [`Wal::open`](crate::Wal::open) refused a record.
    #[error("replay failed at LSN {lsn} ({} offset {offset}): {source}", file.display())]
    Replay {
        /// The record's LSN.
        lsn: Lsn,
        /// Its segment.
        file: PathBuf,
        /// Offset of its frame in the segment.
        offset: u64,
        /// The callback's error.
        #[source]
        source: ReplayError,
    },
}
