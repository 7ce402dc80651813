//! # kairos-wal — a segmented, CRC-checked write-ahead log
//!
//! The log of Kairos: an append-only sequence of *records* (a caller-chosen type byte and a
//! body), each with a dense *LSN* (log sequence number, from 1), kept in *segment* files in one
//! directory. It knows bytes, records, LSNs and segments — never what the records mean.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kairos_wal::{FsStorage, Record, Wal, WalOptions};
//!
//! # fn main() -> Result<(), kairos_wal::WalError> {
//! let dir = std::path::Path::new("/tmp/kairos-demo/wal");
//! let mut replayed = Vec::new();
//! let (wal, report) = Wal::open(Arc::new(FsStorage), dir, WalOptions::default(), &mut |r| {
//!     replayed.push((r.lsn, r.record_type, r.body.to_vec()));
//!     Ok(())
//! })?;
//! assert_eq!(report.records, replayed.len() as u64);
//! let ticket = wal.append(&[Record { record_type: 1, body: b"hello" }])?;
//! ticket.wait()?; // fdatasynced (Durability::Sync, the default)
//! wal.close()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Layout
//!
//! `DIR/META` (store identity), `DIR/LOCK` (lock file), and segments
//! `DIR/{seq:016x}-{first_lsn:016x}.seg`. Each segment is a 64-byte header and two
//! 32-byte mark slots (frames start at byte 128; at 64 in a version-1 segment), followed by
//! *frames*; a frame is one [`Wal::append`] (all its records survive a crash or none does).
//! Every byte is specified in `FORMAT.md` next to this crate; [`mod@format`] holds the constants
//! and codecs. Segments roll at [`WalOptions::segment_bytes`]; once a checkpoint covers their
//! records, [`Wal::remove_segments_before`] deletes them after recording the new oldest
//! segment in `DIR/TRIM`. A clean close records the newest segment and last LSN in
//! `DIR/CLOSED`; the log records the same in `DIR/SYNCED` at each segment roll, at each open
//! (with [`WalOptions::proof_before_ack`]), and once appends pause for
//! [`WalOptions::synced_mark_delay`] after a sync. So a deleted segment is reported
//! ([`WalError::MissingSegment`]) whether it was between two others, the oldest, or — after a
//! clean close, or a crash more than the delay after the last sync — the newest.
//!
//! ## Durability
//!
//! - [`Durability::Sync`]: [`AppendTicket::wait`] returns once the frame is fdatasynced and,
//!   with [`WalOptions::proof_before_ack`] (the default), proven by a durable mark.
//!   A lone caller (at most one frame queued, and one in the round before) commits its round
//!   itself: `write`, fdatasync and proof on its own thread, with no hand-off to the writer
//!   thread and back. Concurrent callers leave it to group commit: the writer thread drains
//!   every queued append, writes them with one `write`, syncs once, and wakes all their
//!   waiters.
//! - [`Durability::Interval`]: `wait` returns once the frame is written to the OS (survives a
//!   process crash) — written by the waiting thread itself, with every frame queued before
//!   it, in one `write` (more, and the syncs of a roll, when the segment rolls), with no
//!   hand-off to the writer thread; the writer fdatasyncs in the
//!   background every interval, so a power cut loses at most about one interval.
//! - [`Durability::Buffered`]: written to the OS (as under `Interval`, by the waiting thread),
//!   synced by the log only when a segment rolls, on [`Wal::sync`] and on [`Wal::close`].
//!
//! [`AppendTicket::durable`] is `wait` as a future for async callers ([`Durable`]): the same
//! answer, but the writer thread does the work (under `Sync` it commits the append with the
//! concurrent ones; it never leads a round itself) and wakes the future, wherever the log's
//! written or durable marks move, it is poisoned or its writer ends.
//!
//! A failed write or fdatasync *poisons* the log: every waiter gets the error, nothing more is
//! acknowledged, and only dropping and reopening (which re-reads the disk) recovers. A sync is
//! never retried (PostgreSQL's fsyncgate, 2018). The exceptions are writes no acknowledgement
//! depends on, whose failure is only logged: the zeros a `Sync` writer keeps ahead of its
//! frames, and the idle marks — the MARK frame after a sync, the idle `SYNCED`
//! (`wal/FORMAT.md`, "Writing rules").
//!
//! ## Recovery
//!
//! [`Wal::open`] replays every surviving record in LSN order. Bytes at the end of the newest
//! segment that do not form valid frames are an unsynced *torn tail* — truncated and reported
//! ([`TornTail`]) — unless a later valid frame records that those LSNs had been synced, or
//! they lie in an older, sealed segment: then durable data is damaged and open fails with
//! [`WalError::Corrupt`] naming the file and offset. Nothing durable is ever skipped or
//! truncated. [`scan`] performs the same checks read-only, for tools and untrusted input.
//!
//! ## Assumptions about the disk
//!
//! Only `fdatasync` of a file and `fsync` of a directory are barriers. Anything not yet
//! synced may be lost, torn at 512-byte granularity, zero-filled or persisted out of order.
//! A synced byte is assumed to read back as written; damage to synced data is detected (CRC-32)
//! and reported, not repaired — there is no second copy. The one blind spot: bit rot in the
//! very last synced frames when no later frame recording their sync reached the disk looks
//! exactly like a torn write and is truncated.
//!
//! ## I/O
//!
//! Every file operation goes through [`Storage`]: [`FsStorage`] for real files (positional
//! `write`/`read`, never mmap; files 0600, directories 0700) and [`SimStorage`], an in-memory
//! file system that can cut the power, crash the process and inject faults.
//!
//! ## Sources followed
//!
//! LevelDB `doc/log_format.md` (framing), etcd's WAL (segment names, tmp + rename + directory
//! fsync, torn-write repair of the last file only, lengths checked before allocating),
//! RocksDB's predecessor-WAL records (each segment names its predecessor's last LSN, so a
//! missing file is detected), fjall's journal (a batch is atomic; a corrupt checksum is an
//! error, a missing end is a torn tail), okaywal (group fsync), TigerBeetle's journal and
//! PAR (Alagappan et al., FAST'18: tell a crash from corruption with persisted evidence) and
//! SQLite's crash VFS (the simulated storage).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod recovery;
mod wal;

pub mod format;
pub mod storage;

pub use error::{ReplayError, WalError};
pub use recovery::{
    read_store_id, scan, scan_located, RecordPlace, RecoveryReport, ScanReport, SegmentInfo,
    TornMarkSlot, TornTail,
};
pub use storage::{
    FaultKind, FaultOp, FaultPlan, FsStorage, LockGuard, OpenMode, SimStorage, Storage, StorageFile,
};
pub use wal::{AppendTicket, Durable, SyncHandle, Wal};

/// A log sequence number. Dense: the first record ever appended is `Lsn(1)` and each record
/// gets the next one; `Lsn(0)` means "none".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Default segment roll threshold: 64 MiB (etcd uses 64 MB).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Smallest accepted segment roll threshold: 4 KiB (tests use it to roll constantly).
pub const SEGMENT_BYTES_MIN: u64 = 4 * 1024;
/// Default largest record body: 16 MiB.
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 16 * 1024 * 1024;
/// Default delay of the idle high-water mark ([`WalOptions::synced_mark_delay`]): 10 ms. Long
/// next to a group commit's gathering (100 µs) and the gaps between a busy producer's appends,
/// so a steady stream of appends never pays for it; short enough that an unclean shutdown
/// rarely comes within it of the last sync.
pub const SYNCED_MARK_DELAY_DEFAULT: std::time::Duration = std::time::Duration::from_millis(10);
/// Largest accepted [`WalOptions::synced_mark_delay`]: one hour.
pub const SYNCED_MARK_DELAY_MAX: std::time::Duration = std::time::Duration::from_secs(3600);
/// Largest record type a caller may use; `0` and `0xF0..=0xFF` are reserved.
pub const RECORD_TYPE_USER_MAX: u8 = 0xEF;

const _: () = assert!(SEGMENT_BYTES_MIN <= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(SEGMENT_BYTES_MIN > format::SEGMENT_FRAMES_OFFSET as u64 * 2);

/// When an appended frame counts as done ([`AppendTicket::wait`] returns).
///
/// In the `kairos` engine (its `Config::durability`) this is when a call that changes state —
/// schedule, cancel, ack, nack, … — returns: once its record's frame is done in this sense.
/// The engine's README states each mode's contract in the engine's terms (what survives a
/// process crash, what survives a power loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// After an fdatasync of the frame. Concurrent appends share one fdatasync (group commit).
    /// Survives power loss.
    Sync,
    /// After the frame is written to the OS; fdatasynced in the background every interval
    /// (must be non-zero). Survives a process crash; a power cut loses at most the last
    /// interval or so. Written back as it goes, like `Buffered`.
    Interval(std::time::Duration),
    /// After the frame is written to the OS; synced only at segment roll, [`Wal::sync`] and
    /// [`Wal::close`]. Survives a process crash; a power cut may lose anything unsynced.
    /// Every 4 MiB written, a thread of the log fdatasyncs the active segment while appends go
    /// on (write-back: the syncs appends must wait for — a roll's — then find little left to
    /// write; these syncs acknowledge nothing, and a failed one poisons the log). Not on a
    /// storage that does not allow background I/O ([`Storage::allows_timed_io`]).
    Buffered,
}

/// Options for [`Wal::open`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Roll threshold in bytes: a frame that would take the active segment past it goes to a
    /// new segment (a single larger frame gets a segment of its own). Default
    /// [`SEGMENT_BYTES_DEFAULT`], at least [`SEGMENT_BYTES_MIN`].
    pub segment_bytes: u64,
    /// Durability mode; default [`Durability::Sync`].
    pub durability: Durability,
    /// Largest record body in bytes accepted by [`Wal::append`] and by recovery (a valid frame
    /// holding a larger record is reported as corrupt, never truncated). Default
    /// [`RECORD_BYTES_MAX_DEFAULT`], at most [`format::RECORD_BYTES_MAX_LIMIT`].
    pub record_bytes_max: u32,
    /// The idle high-water mark: when this long has passed since the last fdatasync and nothing
    /// was appended since, the writer records the segment and the highest synced LSN in the
    /// file `SYNCED` (tmp, fdatasync, rename, directory fsync: two syncs, once per idle
    /// period). Recovery then refuses — `Corrupt` or `MissingSegment` naming `SYNCED` — a log
    /// whose synced records were cut off or deleted after an unclean shutdown, damage it could
    /// otherwise not tell from a torn write (`wal/FORMAT.md`, "Missing files"). `None`: never
    /// written. Not written under [`Durability::Buffered`], nor on a storage that does not
    /// allow timed I/O ([`Storage::allows_timed_io`], asked once, at open). `Some(0)`: whenever
    /// the writer goes idle after a sync. With a delay set (and not under `Buffered`), each
    /// segment roll also records the new segment in `SYNCED` (two more syncs per roll, on any
    /// storage), so a deleted newest segment is a `MissingSegment`. A failure writing the idle
    /// mark poisons nothing (nothing acknowledged depends on it: it is logged at debug level,
    /// the old `SYNCED` stays, and the mark is tried again at the next idle period after a
    /// later sync); a failure writing a roll's poisons the log like any other failed write or
    /// sync. Default [`SYNCED_MARK_DELAY_DEFAULT`], at most
    /// [`SYNCED_MARK_DELAY_MAX`]. An append that arrives while the mark is being written waits
    /// for it (at most the two syncs).
    pub synced_mark_delay: Option<std::time::Duration>,
    /// Proof before acknowledgement: an append's [`AppendTicket::wait`] under
    /// [`Durability::Sync`], and every [`Wal::sync`], return only once a durable mark that no
    /// cut of the segment's tail can remove records the append's LSN as synced — a mark slot in
    /// the segment's header area (FORMAT.md, "Mark slots"), or `SYNCED` in a version-1 segment.
    /// So after any unclean shutdown, damage that drops an acknowledged record — a cut, zeroed
    /// or flipped tail, a newest segment deleted or emptied — is refused as corruption instead
    /// of being read as a torn write (FORMAT.md, "Missing files", lists what `false` leaves
    /// exposed). The mark for one group commit rides on the next one's fdatasync when appends
    /// keep coming (under `Sync`: when a group commit at least as large is queued already);
    /// otherwise the writer pays a second fdatasync of its own (a 32-byte slot write). The cost falls on a lone appender under `Sync`, whose every
    /// append then waits for two fdatasyncs (BENCHMARKS.md, "Proof before acknowledgement").
    /// With it, each segment roll (and the creation of a log's first segment) also records the
    /// new segment in `SYNCED`, as `synced_mark_delay` does. Default `true`, the contract the
    /// README states; `false` acknowledges at the fdatasync itself.
    pub proof_before_ack: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            durability: Durability::Sync,
            record_bytes_max: RECORD_BYTES_MAX_DEFAULT,
            synced_mark_delay: Some(SYNCED_MARK_DELAY_DEFAULT),
            proof_before_ack: true,
        }
    }
}

/// One record to append: a caller-chosen type byte (`1..=RECORD_TYPE_USER_MAX`) and its body
/// (at most `record_bytes_max` bytes).
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The record type, `1..=RECORD_TYPE_USER_MAX`.
    pub record_type: u8,
    /// The body bytes.
    pub body: &'a [u8],
}

/// A record read back during replay or [`scan`]; the body borrows the reader's buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    /// The record's LSN.
    pub lsn: Lsn,
    /// The record type it was appended with.
    pub record_type: u8,
    /// The body it was appended with.
    pub body: &'a [u8],
}
