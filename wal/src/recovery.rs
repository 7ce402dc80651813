//! Recovery and scan.
use std::path::{Path, PathBuf};

use crate::{Lsn, RecordView, Storage, WalError};

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Segments.
    pub segments: usize,
    /// Records.
    pub records: u64,
    /// Last LSN.
    pub last_lsn: Lsn,
    /// Close marker last.
    pub clean_shutdown: bool,
    /// Torn tail.
    pub torn_tail: Option<TornTail>,
}

/// Torn tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// File.
    pub file: PathBuf,
    /// Offset.
    pub offset: u64,
    /// Bytes.
    pub bytes_truncated: u64,
    /// First lost LSN.
    pub first_lost_lsn: Lsn,
}

/// Scan result.
#[derive(Clone, Debug, Default)]
pub struct ScanReport {
    /// Segments.
    pub segments: Vec<SegmentInfo>,
    /// Records.
    pub records: u64,
    /// Last LSN.
    pub last_lsn: Lsn,
    /// Clean.
    pub clean_shutdown: bool,
    /// Torn.
    pub torn_tail: Option<TornTail>,
}

/// One segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// File.
    pub file: PathBuf,
    /// Bytes.
    pub bytes: u64,
    /// Records.
    pub records: u64,
    /// First LSN.
    pub first_lsn: Lsn,
    /// Last LSN.
    pub last_lsn: Lsn,
    /// Sealed.
    pub sealed: bool,
}

/// Read-only check of a log directory.
pub fn scan(
    storage: &dyn Storage,
    dir: &Path,
    record_bytes_max: u32,
    visit: &mut dyn FnMut(RecordView<'_>),
) -> Result<ScanReport, WalError> {
    let _ = (storage, dir, record_bytes_max, visit);
    unimplemented!()
}
