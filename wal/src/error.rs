//! Errors.
use std::path::PathBuf;

use crate::Lsn;

/// Error returned by a replay callback.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(pub String);

/// Every error of the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// I/O failed.
    #[error("{op} {path:?}: {source}")]
    Io { op: &'static str, path: PathBuf, #[source] source: std::io::Error },
    /// Locked elsewhere.
    #[error("log directory is locked: {path:?}")]
    Locked { path: PathBuf },
    /// Corrupt.
    #[error("corrupt log: {file:?} at offset {offset}: {reason}")]
    Corrupt { file: PathBuf, offset: u64, reason: String },
    /// Foreign.
    #[error("segment belongs to another log: {file:?}")]
    ForeignSegment { file: PathBuf },
    /// Missing.
    #[error("missing segment before {file:?}: {reason}")]
    MissingSegment { file: PathBuf, reason: String },
    /// Version.
    #[error("unsupported format version {version} in {file:?}")]
    UnsupportedVersion { file: PathBuf, version: u16 },
    /// Poisoned.
    #[error("log is poisoned by an earlier I/O failure: {cause}")]
    Poisoned { cause: String },
    /// Too large.
    #[error("record of {bytes} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge { bytes: usize, max: u32 },
    /// Invalid.
    #[error("invalid record: {reason}")]
    InvalidRecord { reason: String },
    /// Closed.
    #[error("log is closed")]
    Closed,
    /// Replay failed.
    #[error("replay failed at {lsn:?} ({file:?} offset {offset}): {source}")]
    Replay { lsn: Lsn, file: PathBuf, offset: u64, #[source] source: ReplayError },
}
