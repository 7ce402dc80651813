//! kairos-wal: segmented, CRC-checked write-ahead log (stub surface; being implemented).
#![forbid(unsafe_code)]

mod error;
mod recovery;
mod wal;

pub mod format;
pub mod storage;

pub use error::{ReplayError, WalError};
pub use recovery::{scan, RecoveryReport, ScanReport, SegmentInfo, TornTail};
pub use storage::{FsStorage, SimStorage, Storage, StorageFile};
pub use wal::{AppendTicket, Wal};

/// Log sequence number: dense, the first record is `Lsn(1)`; `Lsn(0)` means "none".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

/// Default roll threshold (64 MiB).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Smallest accepted roll threshold (4 KiB).
pub const SEGMENT_BYTES_MIN: u64 = 4 * 1024;
/// Default largest record body (16 MiB).
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 16 * 1024 * 1024;
/// Largest caller-chosen record type.
pub const RECORD_TYPE_USER_MAX: u8 = 0xEF;

/// When an appended frame counts as done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fdatasync before `wait` returns (group commit).
    Sync,
    /// Written at once, synced in the background every interval.
    Interval(std::time::Duration),
    /// Written to the OS; synced only at roll/close.
    Buffered,
}

/// Options for [`Wal::open`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Roll threshold in bytes.
    pub segment_bytes: u64,
    /// Durability mode.
    pub durability: Durability,
    /// Largest record body accepted by append and recovery, in bytes.
    pub record_bytes_max: u32,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            durability: Durability::Sync,
            record_bytes_max: RECORD_BYTES_MAX_DEFAULT,
        }
    }
}

/// One record to append.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// Caller-chosen type, 1..=RECORD_TYPE_USER_MAX.
    pub record_type: u8,
    /// Body bytes.
    pub body: &'a [u8],
}

/// A record read back.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    /// Its LSN.
    pub lsn: Lsn,
    /// Its type.
    pub record_type: u8,
    /// Its body.
    pub body: &'a [u8],
}
