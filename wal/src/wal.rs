//! [`Wal`]: the log handle, the writer state that owns the active segment, and the writer
//! thread.
//!
//! One writer at a time appends (STYLE: "one owner appends to the log"): whoever holds the
//! [`Writer`] behind its mutex. Callers encode and checksum their frame bodies on their own
//! threads, take an LSN range and enqueue under one short lock, and wait. Whoever writes
//! drains *every* queued frame, in LSN order, with one `write`. Under [`Durability::Sync`] that
//! is the writer thread, woken by the waiters, which then makes them durable with one
//! `fdatasync` and wakes them all: group commit, as in okaywal, etcd's `Save` and RocksDB's
//! write groups — unless a waiter is alone (at most one frame queued, and one in the round
//! before): then it commits its round itself, write, `fdatasync` and proof, sparing the two
//! thread switches (BENCHMARKS.md, "A lone Sync call commits its own round"). Under
//! `Interval` and `Buffered` a waiting appender writes the queue itself, taking the writer
//! state for one `write` (RocksDB's write-group leader writes its group's WAL records;
//! PostgreSQL backends write WAL themselves, with the WAL writer as a background flusher):
//! handing each write to the thread cost two thread switches, 10–40 µs per call on this 2-core
//! VM against ~1.5 µs for the whole call (BENCHMARKS.md, "Single calls under Buffered and
//! Interval"). A lone [`Wal::sync`] caller (no round led by another) likewise commits its
//! round itself, in any mode. The writer thread keeps the other syncs (interval, roll,
//! close, concurrent `sync` callers), the idle marks and the writes nobody waits for. A
//! failed write or sync poisons the log for good (PostgreSQL's `data_sync_retry = off`,
//! fjall's `Poisoned`, redb's `PreviousIo`) — all but three writes no acknowledgement depends
//! on: the zeros a `Sync` writer keeps ahead of its frames, an optimisation
//! ([`Writer::write_zeros_ahead`]), and the two idle marks, evidence of syncs already made
//! and proven by other means ([`Writer::write_mark_frame`], [`Writer::write_idle_mark`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::format::{
    self, Closed, FrameKind, MarkSlot, SegmentHeader, StoreId, Synced, Trim, FRAME_BODY_BYTES_MAX,
    FRAME_HEADER_BYTES, MARK_SLOTS_OFFSET, MARK_SLOT_BYTES, MARK_SLOT_COUNT, RECORD_HEADER_BYTES,
    SEGMENT_FORMAT_VERSION, SEGMENT_FRAMES_OFFSET,
};
use crate::recovery::{self, Analysis};
use crate::storage::{LockGuard, OpenMode};
use crate::{
    Durability, Lsn, Record, RecordView, RecoveryReport, ReplayError, Storage, StorageFile,
    WalError, WalOptions, RECORD_TYPE_USER_MAX, SEGMENT_BYTES_MIN,
};

/// A segmented, append-only write-ahead log with group commit.
///
/// `Wal` is `Send + Sync`: share it behind an `Arc` and append from any thread. Inside, the
/// writer state owns the active segment file; one writer at a time holds it (the writer
/// thread, under `Interval` and `Buffered` a waiting appender, under `Sync` a lone waiting
/// caller committing its own round, or in any mode a lone [`Wal::sync`] caller). See the
/// crate documentation for the format and the durability contract of each [`Durability`]
/// mode.
pub struct Wal {
    shared: Arc<Shared>,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    store_id: StoreId,
    /// The writer state, shared with the writer thread and the tickets (see [`Writer`]).
    writer_state: Arc<Mutex<Writer>>,
    writer: Option<JoinHandle<Result<(), WalError>>>,
    // Dropped after `writer` has been joined (see `Drop`), so no other open can start while
    // the writer may still touch the files.
    _lock: Option<Box<dyn LockGuard>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("durability", &self.shared.durability)
            .field("last_lsn", &self.last_lsn())
            .finish_non_exhaustive()
    }
}

/// A claim on one append: its LSN range, and a way to wait until it has the log's durability.
///
/// Dropping a ticket without waiting is fine: the append still happens.
#[must_use = "an append is not durable until `wait` returns Ok"]
pub struct AppendTicket {
    shared: Arc<Shared>,
    /// Under `Interval` and `Buffered`, [`AppendTicket::wait`] writes what is queued itself;
    /// under `Sync`, a lone caller's commits its round itself.
    writer: Arc<Mutex<Writer>>,
    first_lsn: Lsn,
    last_lsn: Lsn,
    /// Whether [`AppendTicket::wait`] returned: a ticket dropped without it asks the writer
    /// thread to write its frame.
    settled: bool,
}

impl std::fmt::Debug for AppendTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendTicket")
            .field("first_lsn", &self.first_lsn)
            .field("last_lsn", &self.last_lsn)
            .finish()
    }
}

/// State shared by the handle, the tickets and the writer thread.
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer: new frames, a sync request, or a stop.
    writer_wake: Condvar,
    /// Wakes waiters: the written/synced marks moved, the log was poisoned, or the writer ended.
    progress: Condvar,
    /// Told of a failure that poisoned the log on a background thread
    /// ([`Wal::on_background_failure`]).
    failure_hook: Mutex<Option<FailureHook>>,
    durability: Durability,
    record_bytes_max: u32,
    /// Sealed segments still on disk whose successor exists durably, oldest first.
    sealed: Mutex<Vec<SealedSegment>>,
}

#[derive(Debug, Clone)]
struct SealedSegment {
    path: PathBuf,
    seq: u64,
    last_lsn: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Running,
    /// `close`: drain, sync, write CLOSE, sync, exit.
    Close,
    /// `Drop`: drain per the durability mode, exit.
    Drop,
}

struct State {
    /// LSN the next appended record gets.
    next_lsn: u64,
    queue: Vec<PendingFrame>,
    /// Highest LSN written to the OS.
    written_lsn: u64,
    /// Highest LSN fdatasynced.
    synced_lsn: u64,
    /// Highest LSN acknowledged as durable (`AppendTicket::wait` under Sync, `Wal::sync`): with
    /// `proof_before_ack`, the highest a durable mark proves; else `synced_lsn`.
    acked_lsn: u64,
    /// Highest LSN a `Wal::sync` caller wants synced.
    sync_wanted: u64,
    poison: Option<Poison>,
    stop: Stop,
    writer_done: bool,
    /// A lone waiter is committing its own round (write, fdatasync, proof): an appender under
    /// `Sync`, or a `Wal::sync` caller in any mode; other waiters wake the writer thread (which
    /// waits for the writer state) and wait.
    leading: bool,
    /// The writer thread waits without a deadline: a leader's round that leaves an idle mark
    /// to write must wake it, so that it waits for the mark's deadline instead.
    writer_waits_untimed: bool,
    /// Frames in the last round committed: more than one, and callers leave the rounds to the
    /// writer thread (see [`AppendTicket::wait`]).
    last_round_frames: usize,
    /// Wakers of [`Durable`] futures waiting for progress, all taken (the list emptied)
    /// wherever `progress` is notified and woken once the state lock is let go; a future's
    /// slot is `None` once it was dropped or done.
    wakers: Vec<Option<std::task::Waker>>,
    /// Counts the emptyings of `wakers`: a future's filing `(epoch, index)` names its slot
    /// only while the epoch is current (else it files anew).
    wakers_epoch: u64,
}

impl State {
    /// Takes every [`Durable`] future's waker out of the list (they poll when woken, and file
    /// again if still waiting). Called with the state lock held, next to each
    /// `progress.notify_all()`; the caller wakes them with [`DurableWakers::wake`] once it has
    /// let the lock go: a waker's `wake` (or drop) runs the executor's code, which may drop
    /// another future or ticket of this log (a task dropped when woken), and so take this lock.
    /// O(1) when none is filed.
    fn take_durable_wakers(&mut self) -> DurableWakers {
        if self.wakers.is_empty() {
            return DurableWakers(Vec::new());
        }
        self.wakers_epoch += 1;
        DurableWakers(std::mem::take(&mut self.wakers))
    }
}

/// Wakers taken out of [`State::wakers`], to wake once the state lock is let go.
#[must_use = "the futures are woken only by `wake`"]
struct DurableWakers(Vec<Option<std::task::Waker>>);

impl DurableWakers {
    /// Wakes them; call with the state lock let go (the writer state may still be held).
    ///
    /// A waker runs the executor's code; one that panics is caught and logged (ERROR), so
    /// that it neither keeps the wakers after it from being woken (their futures would wait
    /// for ever) nor unwinds the thread that wakes it — the log's writer, whose death poisons
    /// the log.
    fn wake(self) {
        for waker in self.0.into_iter().flatten() {
            // `AssertUnwindSafe`: the waker is consumed, and nothing of the log is borrowed.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake())).is_err() {
                tracing::error!(
                    "a Durable future's waker panicked when woken; the other futures are woken \
                     and the log goes on"
                );
            }
        }
    }
}

/// What the owner of a log is told of a failure that poisoned it on a background thread
/// ([`Wal::on_background_failure`]).
type FailureHook = Arc<dyn Fn(&WalError) + Send + Sync>;

impl Shared {
    /// The mark an append's ticket is done at ([`AppendTicket::wait`], [`Durable`]): the
    /// acknowledged (fdatasynced, proven) LSN under `Sync`, the written one otherwise.
    fn ticket_done_mark(&self, state: &State) -> u64 {
        match self.durability {
            Durability::Sync => state.acked_lsn,
            Durability::Interval(_) | Durability::Buffered => state.written_lsn,
        }
    }

    /// Tells the owner's hook, if one is set, of `error`: a failure of the writer thread or
    /// the write-back thread that poisoned the log. Called with no lock of the log held, so
    /// that the hook may take its owner's locks (an owner's thread that holds them while it
    /// appends or waits for the log takes the log's locks after its own).
    fn report_background_failure(&self, error: &WalError) {
        let hook = self.failure_hook.lock().clone();
        if let Some(hook) = hook {
            hook(error);
        }
    }
}

/// One append waiting for the writer.
struct PendingFrame {
    first_lsn: u64,
    record_count: u32,
    body: Vec<u8>,
    body_crc: crc32fast::Hasher,
}

/// The failure that poisoned the log, kept so every waiter can get its own copy.
#[derive(Clone, Debug)]
struct Poison {
    op: &'static str,
    path: PathBuf,
    kind: io::ErrorKind,
    raw_os_error: Option<i32>,
    message: String,
}

impl Poison {
    fn from_error(error: &WalError) -> Poison {
        match error {
            WalError::Io { op, path, source } => Poison {
                op,
                path: path.clone(),
                kind: source.kind(),
                raw_os_error: source.raw_os_error(),
                message: source.to_string(),
            },
            other => Poison {
                op: "write",
                path: PathBuf::new(),
                kind: io::ErrorKind::Other,
                raw_os_error: None,
                message: other.to_string(),
            },
        }
    }

    /// The original I/O error, for callers whose appends it failed.
    fn to_error(&self) -> WalError {
        let source = match self.raw_os_error {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.kind, self.message.clone()),
        };
        WalError::Io {
            op: self.op,
            path: self.path.clone(),
            source,
        }
    }

    fn cause(&self) -> String {
        format!("{} {}: {}", self.op, self.path.display(), self.message)
    }
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> WalError {
    WalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn invalid_options(reason: impl Into<String>) -> WalError {
    WalError::InvalidOptions {
        reason: reason.into(),
    }
}

fn check_options(options: &WalOptions) -> Result<(), WalError> {
    if options.segment_bytes < SEGMENT_BYTES_MIN {
        return Err(invalid_options(format!(
            "segment_bytes {} is below the minimum {SEGMENT_BYTES_MIN}",
            options.segment_bytes
        )));
    }
    if options.record_bytes_max > format::RECORD_BYTES_MAX_LIMIT {
        return Err(invalid_options(format!(
            "record_bytes_max {} is above the limit {}",
            options.record_bytes_max,
            format::RECORD_BYTES_MAX_LIMIT
        )));
    }
    if options
        .synced_mark_delay
        .is_some_and(|d| d > crate::SYNCED_MARK_DELAY_MAX)
    {
        return Err(invalid_options(format!(
            "synced_mark_delay {:?} is above the limit {:?}",
            options.synced_mark_delay,
            crate::SYNCED_MARK_DELAY_MAX
        )));
    }
    if options.durability == Durability::Interval(Duration::ZERO) {
        return Err(invalid_options(
            "Durability::Interval needs a non-zero interval",
        ));
    }
    Ok(())
}

/// The segment being appended to.
#[derive(Debug)]
struct Active {
    file: Box<dyn StorageFile>,
    path: PathBuf,
    seq: u64,
    /// Bytes of the segment written so far (the offset of the next frame).
    len: u64,
    /// The file's length, or more: `len`, or more under `Sync`, where the writer keeps zeros
    /// written ahead of its frames ([`PREALLOCATE_BYTES`]). An upper bound, not the length: a
    /// write of zeros that failed or came out short counts as written in full
    /// ([`Writer::write_zeros_ahead`]). Never below `len`.
    file_len: u64,
    /// Where the segment's first frame starts (64 in a version-1 segment, 128 with slots).
    frames_offset: u64,
    /// The writer's place in the mark slots; `None` in a version-1 segment (no slots).
    slots: Option<SlotCursor>,
}

impl Active {
    /// Writes `synced_lsn` (already durable) into the segment's next mark slot, if it has
    /// slots and the LSN is above what they hold; not synced here. Returns whether it wrote.
    fn write_mark_slot(&mut self, synced_lsn: u64) -> Result<bool, WalError> {
        let Some(cursor) = &mut self.slots else {
            return Ok(false);
        };
        if synced_lsn <= cursor.mark {
            return Ok(false);
        }
        let offset = (MARK_SLOTS_OFFSET + cursor.next * MARK_SLOT_BYTES) as u64;
        self.file
            .write_all_at(&MarkSlot::encode(self.seq, synced_lsn), offset)
            .map_err(|e| io_error("write", &self.path, e))?;
        cursor.mark = synced_lsn;
        cursor.next = (cursor.next + 1) % MARK_SLOT_COUNT;
        Ok(true)
    }

    /// The highest LSN the slots hold once the last slot write is durable (`None`: a
    /// version-1 segment, which has none).
    fn slots_mark(&self) -> Option<u64> {
        self.slots.map(|cursor| cursor.mark)
    }
}

/// Where the next mark of a version-2 segment goes (FORMAT.md, "Mark slots").
#[derive(Clone, Copy, Debug)]
struct SlotCursor {
    /// The slot the next mark is written to: never the one holding `mark`, so a torn write
    /// leaves the highest durable mark readable.
    next: usize,
    /// The highest LSN written to a slot (the segment's `prev_last_lsn` before any).
    mark: u64,
}

impl SlotCursor {
    /// The cursor for slots as recovery found them (a torn one already rewritten as empty).
    fn resume(slots: &[MarkSlot; MARK_SLOT_COUNT], prev_last_lsn: u64) -> SlotCursor {
        let mark = format::slots_mark(slots).max(prev_last_lsn);
        let holder = slots.iter().position(
            |slot| matches!(slot, MarkSlot::Mark { synced_lsn, .. } if *synced_lsn == mark),
        );
        SlotCursor {
            next: holder.map_or(0, |h| (h + 1) % MARK_SLOT_COUNT),
            mark,
        }
    }
}

/// Creates segment `seq` following LSN `prev_last_lsn`: header into `NAME.tmp`, fdatasync,
/// rename to `NAME`, fsync the directory (etcd's `cut`). A crash at any point leaves either
/// no segment or a complete, durable header.
fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
    seq: u64,
    prev_last_lsn: u64,
) -> Result<Active, WalError> {
    let name = format::segment_file_name(seq, Lsn(prev_last_lsn + 1));
    let path = dir.join(&name);
    let tmp = dir.join(format!("{name}{}", format::TMP_SUFFIX));
    let header = SegmentHeader {
        format_version: SEGMENT_FORMAT_VERSION,
        store_id: *store_id,
        seq,
        prev_last_lsn,
        created_ms: storage.now_ms(),
    };
    let file = storage
        .open(&tmp, OpenMode::CreateNew)
        .map_err(|e| io_error("create", &tmp, e))?;
    // The header, then both mark slots, empty (zeros).
    let mut bytes = [0u8; SEGMENT_FRAMES_OFFSET];
    bytes[..format::SEGMENT_HEADER_BYTES].copy_from_slice(&header.encode());
    file.write_all_at(&bytes, 0)
        .map_err(|e| io_error("write", &tmp, e))?;
    file.sync_data()
        .map_err(|e| io_error("fdatasync", &tmp, e))?;
    storage
        .rename(&tmp, &path)
        .map_err(|e| io_error("rename", &tmp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| io_error("fsync dir", dir, e))?;
    tracing::debug!(file = %path.display(), seq, first_lsn = prev_last_lsn + 1, "created segment");
    Ok(Active {
        file,
        path,
        seq,
        len: header.frames_offset(),
        file_len: header.frames_offset(),
        frames_offset: header.frames_offset(),
        slots: Some(SlotCursor {
            next: 0,
            mark: prev_last_lsn,
        }),
    })
}

/// Replaces the small file `dir/name` with `bytes`, crash-safely: write `name.tmp` (a stale
/// one is removed first), fdatasync, rename over `name`, fsync the directory. A crash leaves
/// the old file or the new one, and at most a `.tmp` leftover.
fn write_file_atomically(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), WalError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}{}", format::TMP_SUFFIX));
    if storage
        .exists(&tmp)
        .map_err(|e| io_error("stat", &tmp, e))?
    {
        storage
            .remove_file(&tmp)
            .map_err(|e| io_error("remove", &tmp, e))?;
    }
    let file = storage
        .open(&tmp, OpenMode::CreateNew)
        .map_err(|e| io_error("create", &tmp, e))?;
    file.write_all_at(bytes, 0)
        .map_err(|e| io_error("write", &tmp, e))?;
    file.sync_data()
        .map_err(|e| io_error("fdatasync", &tmp, e))?;
    drop(file);
    storage
        .rename(&tmp, &path)
        .map_err(|e| io_error("rename", &tmp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| io_error("fsync dir", dir, e))
}

/// Writes `META` for a new log: tmp, fdatasync, rename, fsync the directory.
/// Records in `SYNCED` that segment `seq` exists and every LSN up to `synced_lsn` is durable
/// (replace protocol: two syncs and a rename). Only valid when both are true.
fn write_synced(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
    seq: u64,
    synced_lsn: u64,
) -> Result<(), WalError> {
    let synced = Synced {
        store_id: *store_id,
        seq,
        synced_lsn: Lsn(synced_lsn),
    };
    write_file_atomically(storage, dir, format::SYNCED_FILE_NAME, &synced.encode())
}

fn create_meta(storage: &dyn Storage, dir: &Path) -> Result<StoreId, WalError> {
    let store_id = storage
        .random_id()
        .map_err(|e| io_error("random store id", dir, e))?;
    write_file_atomically(
        storage,
        dir,
        format::META_FILE_NAME,
        &format::encode_meta(&store_id),
    )?;
    Ok(store_id)
}

/// Creates `dir` if needed, making every new directory entry durable (each created
/// directory's parent is fsynced, outermost first), then takes the lock.
fn prepare_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn LockGuard>, WalError> {
    let mut created = Vec::new();
    for ancestor in dir.ancestors().filter(|p| !p.as_os_str().is_empty()) {
        if storage
            .exists(ancestor)
            .map_err(|e| io_error("stat", ancestor, e))?
        {
            break;
        }
        created.push(ancestor);
    }
    if !created.is_empty() {
        storage
            .create_dir_all(dir)
            .map_err(|e| io_error("create dir", dir, e))?;
        for new_dir in created.iter().rev() {
            if let Some(parent) = new_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                storage
                    .sync_dir(parent)
                    .map_err(|e| io_error("fsync dir", parent, e))?;
            }
        }
    }
    let lock_path = dir.join(format::LOCK_FILE_NAME);
    let lock = storage.lock(&lock_path).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            WalError::Locked {
                path: lock_path.clone(),
            }
        } else {
            io_error("lock", &lock_path, e)
        }
    })?;
    if !created.is_empty() {
        storage
            .sync_dir(dir)
            .map_err(|e| io_error("fsync dir", dir, e))?;
    }
    Ok(lock)
}

/// The sequence number after `seq`.
///
/// # Errors
/// [`WalError::Corrupt`] if `seq` is `u64::MAX` (only a crafted file name gets there).
fn next_seq(seq: u64, path: &Path) -> Result<u64, WalError> {
    seq.checked_add(1).ok_or_else(|| WalError::Corrupt {
        file: path.to_path_buf(),
        offset: 0,
        reason: "segment sequence number space exhausted".to_owned(),
    })
}

/// Before open cuts a torn tail off: zeros over every non-zero 64 KiB of it, fdatasynced, so
/// that no byte cut off can come back. A later write that extends the file over the cut
/// region and is not synced may show, after a power cut, what the medium held there
/// (FORMAT.md, "Assumptions about the disk": stale bytes) — and the zeros a `Sync` writer
/// writes ahead of its frames extend the file by 64 KiB at a time, so valid frames of the
/// cut-off history would replay after this history's last frame, as records nobody appended
/// (test: `stale_bytes_under_the_zeros_ahead_never_replay_as_records_of_this_history`).
fn scrub_cut_tail(file: &dyn StorageFile, path: &Path, from: u64, to: u64) -> Result<(), WalError> {
    const CHUNK: u64 = 64 * 1024;
    let zeros = vec![0u8; CHUNK as usize];
    let mut buf = vec![0u8; CHUNK as usize];
    let mut wrote = false;
    let mut at = from;
    while at < to {
        let n = (to - at).min(CHUNK) as usize;
        let mut got = 0;
        while got < n {
            match file.read_at(&mut buf[got..n], at + got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) => return Err(io_error("read", path, e)),
            }
        }
        if buf[..got].iter().any(|&b| b != 0) {
            file.write_all_at(&zeros[..n], at)
                .map_err(|e| io_error("write", path, e))?;
            wrote = true;
        }
        at += n as u64;
    }
    if wrote {
        file.sync_data()
            .map_err(|e| io_error("fdatasync", path, e))?;
    }
    Ok(())
}

/// Applies the analysis to the newest segment — truncate a torn tail, replace an unwritten
/// segment, roll past a sealed one, create the first — and returns the segment to append to.
fn prepare_active(
    storage: &dyn Storage,
    dir: &Path,
    store_id: &StoreId,
    analysis: &Analysis,
) -> Result<(Active, bool), WalError> {
    let last = analysis.last_lsn.0;
    let Some(tail) = &analysis.tail else {
        return Ok((create_segment(storage, dir, store_id, 1, last)?, true));
    };
    if tail.unwritten {
        storage
            .remove_file(&tail.path)
            .map_err(|e| io_error("remove", &tail.path, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| io_error("fsync dir", dir, e))?;
        let active = create_segment(storage, dir, store_id, tail.seq, tail.prev_last_lsn)?;
        return Ok((active, false));
    }
    let path = &tail.path;
    let file = storage
        .open(path, OpenMode::ReadWrite)
        .map_err(|e| io_error("open", path, e))?;
    if tail.valid_end < tail.file_len {
        scrub_cut_tail(file.as_ref(), path, tail.valid_end, tail.file_len)?;
        file.set_len(tail.valid_end)
            .map_err(|e| io_error("truncate", path, e))?;
    }
    // A mark slot torn by the crash is rewritten empty, so that the segment, once sealed,
    // has no damaged slot (recovery refuses one in any segment but the newest).
    let mut slots = tail.slots;
    if let Some(found) = &mut slots {
        for (index, slot) in found.iter_mut().enumerate() {
            if *slot == MarkSlot::Torn {
                let offset = (MARK_SLOTS_OFFSET + index * MARK_SLOT_BYTES) as u64;
                tracing::warn!(
                    file = %path.display(),
                    slot = index,
                    offset,
                    "rewriting a torn mark slot of the newest segment as empty"
                );
                file.write_all_at(&[0u8; MARK_SLOT_BYTES], offset)
                    .map_err(|e| io_error("write", path, e))?;
                *slot = MarkSlot::Empty;
            }
        }
    }
    // Whatever was replayed becomes durable before any later frame can claim it is.
    file.sync_data()
        .map_err(|e| io_error("fdatasync", path, e))?;
    if tail.sealed {
        let seq = next_seq(tail.seq, path)?;
        return Ok((create_segment(storage, dir, store_id, seq, last)?, true));
    }
    let active = Active {
        file,
        path: path.clone(),
        seq: tail.seq,
        len: tail.valid_end,
        file_len: tail.valid_end,
        frames_offset: if slots.is_some() {
            SEGMENT_FRAMES_OFFSET as u64
        } else {
            format::SEGMENT_HEADER_BYTES as u64
        },
        slots: slots.map(|found| SlotCursor::resume(&found, tail.prev_last_lsn)),
    };
    Ok((active, false))
}

impl Wal {
    /// Opens the log in `dir`, creating it if absent (directory, `META` with a fresh random
    /// store id, first segment), and recovers it.
    ///
    /// Steps: create `dir` (mode 0700) and fsync its parent if it was missing; take `dir/LOCK`;
    /// remove leftover `*.tmp` files; read or create `META`; read `CLOSED`, `SYNCED` and `TRIM`; read
    /// every segment from the one `TRIM` names (segment 1 without it) in order, calling
    /// `replay` once per surviving record in LSN order; remove segments below the `TRIM` mark
    /// (left over by an interrupted [`Wal::remove_segments_before`]); truncate an unsynced torn
    /// tail of the newest segment (see [`TornTail`](crate::TornTail)) and fdatasync it; roll to
    /// a new segment if the newest one is sealed; fsync the directory (so every adopted segment
    /// is durably named); start the writer thread.
    ///
    /// On error, `replay` may already have seen a prefix of the records; discard what it built.
    ///
    /// # Errors
    /// - [`WalError::InvalidOptions`] for options out of range;
    /// - [`WalError::Locked`] if the log is open elsewhere (this or another process);
    /// - [`WalError::Corrupt`] (with file and offset) if durable data is damaged — nothing is
    ///   truncated or skipped;
    /// - [`WalError::ForeignSegment`], [`WalError::MissingSegment`],
    ///   [`WalError::UnsupportedVersion`];
    /// - [`WalError::Replay`] if `replay` returned an error;
    /// - [`WalError::Io`] for any failed file operation.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        options: WalOptions,
        replay: &mut dyn FnMut(RecordView<'_>) -> Result<(), ReplayError>,
    ) -> Result<(Wal, RecoveryReport), WalError> {
        check_options(&options)?;
        let lock = prepare_dir(storage.as_ref(), dir)?;
        let (segments, tmps) = recovery::list_dir(storage.as_ref(), dir)?;
        for name in &tmps {
            let path = dir.join(name);
            tracing::info!(file = %path.display(), "removing leftover temporary file");
            storage
                .remove_file(&path)
                .map_err(|e| io_error("remove", &path, e))?;
        }
        if !tmps.is_empty() {
            storage
                .sync_dir(dir)
                .map_err(|e| io_error("fsync dir", dir, e))?;
        }
        let store_id = match recovery::read_store_id(storage.as_ref(), dir)? {
            Some(id) => id,
            None => {
                recovery::check_meta_absent(storage.as_ref(), dir, &segments)?;
                create_meta(storage.as_ref(), dir)?
            }
        };
        let mut adapter = |view: RecordView<'_>, _: &Path, _: u64| replay(view);
        let analysis = recovery::analyze(
            storage.as_ref(),
            dir,
            &store_id,
            options.record_bytes_max,
            &mut adapter,
        )?;
        // Segments below the TRIM mark: a removal was cut short after TRIM was durable.
        for path in &analysis.leftovers {
            tracing::info!(file = %path.display(), "removing a segment below the TRIM mark");
            storage
                .remove_file(path)
                .map_err(|e| io_error("remove", path, e))?;
        }
        if !analysis.leftovers.is_empty() {
            storage
                .sync_dir(dir)
                .map_err(|e| io_error("fsync dir", dir, e))?;
        }
        let (active, created) = prepare_active(storage.as_ref(), dir, &store_id, &analysis)?;
        // Every segment file recovery adopted must have a durable directory entry before a
        // record is acknowledged in it: a roll whose directory fsync failed (the log was then
        // poisoned) left its new segment's rename in the page cache only, and after a process
        // crash recovery finds and adopts it; a power cut would undo the rename and take
        // acknowledged records with it.
        storage
            .sync_dir(dir)
            .map_err(|e| io_error("fsync dir", dir, e))?;
        let last = analysis.last_lsn.0;
        let marks_rolls = options.proof_before_ack
            || (options.synced_mark_delay.is_some() && options.durability != Durability::Buffered);
        let mut marked = analysis.marked_lsn.0;
        if options.proof_before_ack
            || (marks_rolls
                && analysis
                    .tail
                    .as_ref()
                    .is_some_and(|t| t.sealed || t.unwritten))
        {
            // Record the active segment, and every replayed LSN (durable: `prepare_active`
            // synced them), in SYNCED before anything is acknowledged in it, so that deleting
            // or emptying it later is refused. Without proof, only where open finished a roll
            // (the newest segment was sealed) or replaced an unwritten segment, as a roll does.
            // With proof, always: the segment may be one whose roll, or an earlier open, was
            // cut short before its SYNCED, or one written without proof; a version-1 segment
            // has no slots, and SYNCED proves its replayed records instead.
            write_synced(storage.as_ref(), dir, &store_id, active.seq, last)?;
            marked = marked.max(last);
        }
        let sealed: Vec<SealedSegment> = analysis
            .segments
            .iter()
            .filter(|s| s.sealed)
            .map(|s| SealedSegment {
                path: s.file.clone(),
                seq: s.seq,
                last_lsn: s.last_lsn.0,
            })
            .collect();
        let report = RecoveryReport {
            segments: analysis.segments.len() + usize::from(created),
            records: analysis.records,
            first_lsn: analysis.first_lsn,
            last_lsn: analysis.last_lsn,
            clean_shutdown: analysis.clean_shutdown,
            torn_tail: analysis.torn_tail.clone(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_lsn: last + 1,
                leading: false,
                writer_waits_untimed: false,
                last_round_frames: 0,
                wakers: Vec::new(),
                wakers_epoch: 0,
                queue: Vec::new(),
                written_lsn: last,
                synced_lsn: last,
                acked_lsn: last,
                sync_wanted: 0,
                poison: None,
                stop: Stop::Running,
                writer_done: false,
            }),
            writer_wake: Condvar::new(),
            progress: Condvar::new(),
            failure_hook: Mutex::new(None),
            durability: options.durability,
            record_bytes_max: options.record_bytes_max,
            sealed: Mutex::new(sealed),
        });
        let writer = Writer {
            shared: Arc::clone(&shared),
            storage: Arc::clone(&storage),
            dir: dir.to_path_buf(),
            store_id,
            segment_bytes: options.segment_bytes,
            active,
            written: last,
            synced: last,
            proven: last,
            proof: options.proof_before_ack,
            recorded_synced: last,
            buf: Vec::new(),
            buf_last_lsn: last,
            last_sync: Instant::now(),
            last_batch_frames: 0,
            synced_mark_delay: options.synced_mark_delay.filter(|_| {
                options.durability != Durability::Buffered && storage.allows_timed_io()
            }),
            marked,
            idle_mark_failed: 0,
            marks_rolls,
            writeback: None,
            writes_back: options.durability != Durability::Sync && storage.allows_timed_io(),
            writeback_from: 0,
        };
        let writer_state = Arc::new(Mutex::new(writer));
        let thread_state = Arc::clone(&writer_state);
        let thread_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("kairos-wal-writer".to_owned())
            .spawn(move || run_writer(&thread_state, thread_shared))
            .map_err(|e| io_error("spawn writer thread", dir, e))?;
        tracing::info!(
            dir = %dir.display(),
            records = report.records,
            last_lsn = report.last_lsn.0,
            clean_shutdown = report.clean_shutdown,
            torn_tail = report.torn_tail.is_some(),
            "opened log"
        );
        let wal = Wal {
            shared,
            storage,
            dir: dir.to_path_buf(),
            store_id,
            writer_state,
            writer: Some(handle),
            _lock: Some(lock),
        };
        Ok((wal, report))
    }

    /// Enqueues `records` as one atomic frame: after a crash either all of them survive or
    /// none does. LSNs are assigned densely in call order (calls are totally ordered; hold your
    /// own lock around `append` to make log order equal your apply order). Encodes and
    /// checksums the frame on the calling thread; never blocks on I/O (the queue is unbounded).
    /// It is written (and under `Sync` synced) when the ticket is waited for — by the waiting
    /// thread, except under `Sync` with other callers waiting: then by the writer thread's
    /// group commit — or dropped (by the writer thread), or sooner with a frame appended later.
    /// A ticket held and not yet waited for under `Sync` leaves its frame in memory until then:
    /// nothing is acknowledged before [`AppendTicket::wait`] returns.
    ///
    /// # Errors
    /// At once, appending nothing: [`WalError::InvalidRecord`] for an empty batch, a record
    /// type outside `1..=RECORD_TYPE_USER_MAX` or more than `u32::MAX` records;
    /// [`WalError::RecordTooLarge`] for a body over `record_bytes_max` or a batch over
    /// [`FRAME_BODY_BYTES_MAX`]; [`WalError::Poisoned`] after an I/O failure;
    /// [`WalError::Closed`] while closing.
    pub fn append(&self, records: &[Record<'_>]) -> Result<AppendTicket, WalError> {
        let Some(last) = records.len().checked_sub(1) else {
            return Err(WalError::InvalidRecord {
                reason: "an append needs at least one record".to_owned(),
            });
        };
        let record_count = u32::try_from(records.len()).map_err(|_| WalError::InvalidRecord {
            reason: format!("{} records in one append exceed u32::MAX", records.len()),
        })?;
        let mut body_bytes = 0usize;
        for record in records {
            if record.record_type == 0 || record.record_type > RECORD_TYPE_USER_MAX {
                return Err(WalError::InvalidRecord {
                    reason: format!(
                        "record type {:#04x} is reserved (user types are 0x01..={RECORD_TYPE_USER_MAX:#04x})",
                        record.record_type
                    ),
                });
            }
            if record.body.len() > self.shared.record_bytes_max as usize {
                return Err(WalError::RecordTooLarge {
                    bytes: record.body.len(),
                    max: self.shared.record_bytes_max,
                });
            }
            body_bytes = body_bytes.saturating_add(RECORD_HEADER_BYTES + record.body.len());
        }
        if body_bytes > FRAME_BODY_BYTES_MAX as usize {
            return Err(WalError::RecordTooLarge {
                bytes: body_bytes,
                max: FRAME_BODY_BYTES_MAX,
            });
        }
        let mut body = Vec::with_capacity(body_bytes);
        for record in records {
            format::encode_record(&mut body, record.record_type, record.body);
        }
        let mut body_crc = crc32fast::Hasher::new();
        body_crc.update(&body);

        let mut state = self.shared.state.lock();
        if let Some(poison) = &state.poison {
            return Err(WalError::Poisoned {
                cause: poison.cause(),
            });
        }
        if state.stop != Stop::Running {
            return Err(WalError::Closed);
        }
        let first_lsn = state.next_lsn;
        let Some(next) = first_lsn.checked_add(u64::from(record_count)) else {
            return Err(WalError::InvalidRecord {
                reason: "the LSN space is exhausted".to_owned(),
            });
        };
        state.next_lsn = next;
        state.queue.push(PendingFrame {
            first_lsn,
            record_count,
            body,
            body_crc,
        });
        drop(state);
        Ok(AppendTicket {
            shared: Arc::clone(&self.shared),
            writer: Arc::clone(&self.writer_state),
            first_lsn: Lsn(first_lsn),
            last_lsn: Lsn(first_lsn + last as u64),
            settled: false,
        })
    }

    /// A ticket for everything appended so far: its [`AppendTicket::wait`] returns once every
    /// earlier append has the log's durability. Appends nothing. Callers that answer from state
    /// an earlier, possibly not yet durable, append produced wait on it before answering.
    pub fn barrier(&self) -> AppendTicket {
        let last = Lsn(self.shared.state.lock().next_lsn - 1);
        AppendTicket {
            shared: Arc::clone(&self.shared),
            writer: Arc::clone(&self.writer_state),
            first_lsn: last,
            last_lsn: last,
            settled: false,
        }
    }

    /// The durability mode the log was opened with.
    pub fn durability(&self) -> Durability {
        self.shared.durability
    }

    /// The last LSN assigned so far (`Lsn(0)` if none): appended, not necessarily written.
    pub fn last_lsn(&self) -> Lsn {
        Lsn(self.shared.state.lock().next_lsn - 1)
    }

    /// The last LSN known to be fdatasynced (with `proof_before_ack`, possibly not yet
    /// proven, so not yet acknowledged: what [`AppendTicket::wait`] and [`Wal::sync`] wait for
    /// can lag it by one group commit).
    pub fn synced_lsn(&self) -> Lsn {
        Lsn(self.shared.state.lock().synced_lsn)
    }

    /// The last LSN written to the OS: every record up to it survives a process crash.
    pub fn written_lsn(&self) -> Lsn {
        Lsn(self.shared.state.lock().written_lsn)
    }

    /// `Some(description of the failed operation)` once the log is poisoned; it stays poisoned
    /// until it is dropped and opened again.
    pub fn poisoned(&self) -> Option<String> {
        self.shared.state.lock().poison.as_ref().map(Poison::cause)
    }

    /// The log's store id (from `META`): files that belong with this log (a checkpoint, say)
    /// carry it, so that a file from another directory is recognised.
    pub fn store_id(&self) -> StoreId {
        self.store_id
    }

    /// The directory the log lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Forces an fdatasync of everything appended so far and waits for it, in any durability
    /// mode — with `proof_before_ack` (the default), until a durable mark proves it too.
    /// Returns at once if everything already is. A lone caller commits the round on its own
    /// thread (one `write` of what is queued, the fdatasync, the proof); concurrent callers
    /// and appenders share the writer thread's group commit.
    ///
    /// # Errors
    /// [`WalError::Io`] if the sync (or a write before it) failed — the log is then poisoned;
    /// [`WalError::Poisoned`] if it already was; [`WalError::Closed`] while closing, unless
    /// everything appended already is durable.
    pub fn sync(&self) -> Result<(), WalError> {
        sync_shared(&self.shared, &self.writer_state)
    }

    /// Sets the hook told of a failure that poisons the log on one of its own threads — the
    /// writer thread (an `Interval` sync, a `Sync` round, a write of frames no caller waits
    /// for, a panic of its storage) or the write-back thread (a `Buffered` or `Interval`
    /// write-back fdatasync) — with that failure, from that thread, with no lock of the log
    /// held: so that an owner can act on it (poison itself, wake whoever waits on it) while
    /// nobody appends. Each of the two threads reports at most once (the log's poison names
    /// the first failure of all); a failure that races with this call may be reported twice. Failures of a caller's own write, sync or close are returned to
    /// that caller and not reported here (a `Sync` round the writer thread ran may be both).
    /// If the log is poisoned already, the hook is called at once, on this thread. Replaces a
    /// hook set before.
    ///
    /// The hook must not wait for this log's progress (an append's ticket, `sync`, `close`)
    /// or drop the `Wal`: the thread calling it is one that progress needs.
    pub fn on_background_failure(&self, hook: impl Fn(&WalError) + Send + Sync + 'static) {
        let hook: FailureHook = Arc::new(hook);
        *self.shared.failure_hook.lock() = Some(Arc::clone(&hook));
        // A failure before the hook was set found none; one after it may report twice.
        let poisoned = self
            .shared
            .state
            .lock()
            .poison
            .as_ref()
            .map(Poison::to_error);
        if let Some(error) = poisoned {
            hook(&error);
        }
    }

    /// A handle that runs [`Wal::sync`] without keeping the log open: the log can be closed
    /// or dropped while a sync through it waits, which then returns `Ok` if the close made
    /// everything it waited for durable (and proven), else [`WalError::Closed`]. For callers
    /// that wait outside whatever owns the `Wal` (an engine's `sync` racing its shutdown).
    /// Holds no lock; while it lives it keeps the log's writer state (the active segment's
    /// open file among it) alive, as a pending [`AppendTicket`] does: keep it for a call, not
    /// for the life of a process.
    pub fn sync_handle(&self) -> SyncHandle {
        SyncHandle {
            shared: Arc::clone(&self.shared),
            writer: Arc::clone(&self.writer_state),
        }
    }

    /// Removes every sealed segment whose records all have LSNs below `lsn`. Call it once a
    /// checkpoint covers those records. The active segment is never removed. Returns the
    /// number of files removed.
    ///
    /// Before deleting anything it durably records the new low-water mark — the oldest segment
    /// kept and its first LSN — in `TRIM` (tmp, fdatasync, rename, directory fsync); then it
    /// removes the segments and fsyncs the directory once. After a crash at any point, open
    /// finds either the old mark with every segment, or the new mark with some segments below
    /// it left over (they are removed then). A deleted segment at or above the mark is
    /// reported as [`WalError::MissingSegment`].
    ///
    /// # Errors
    /// [`WalError::Io`] if writing `TRIM`, a removal or the directory sync failed (the log is
    /// not poisoned: the segments still on disk stay valid, and a later call retries).
    pub fn remove_segments_before(&self, lsn: Lsn) -> Result<usize, WalError> {
        let mut sealed = self.shared.sealed.lock();
        let count = sealed.iter().take_while(|s| s.last_lsn < lsn.0).count();
        let Some(newest_removed) = count.checked_sub(1).map(|i| sealed[i].clone()) else {
            return Ok(0);
        };
        // Sealed segments are listed only once their successor exists durably (`roll`), so
        // the segment the mark names is on disk.
        let trim = Trim {
            store_id: self.store_id,
            seq: next_seq(newest_removed.seq, &newest_removed.path)?,
            first_lsn: Lsn(newest_removed.last_lsn + 1),
        };
        write_file_atomically(
            self.storage.as_ref(),
            &self.dir,
            format::TRIM_FILE_NAME,
            &trim.encode(),
        )?;
        tracing::debug!(seq = trim.seq, first_lsn = trim.first_lsn.0, "wrote TRIM");
        for _ in 0..count {
            let path = sealed[0].path.clone();
            self.storage
                .remove_file(&path)
                .map_err(|e| io_error("remove", &path, e))?;
            sealed.remove(0);
            tracing::debug!(file = %path.display(), "removed segment");
        }
        self.storage
            .sync_dir(&self.dir)
            .map_err(|e| io_error("fsync dir", &self.dir, e))?;
        Ok(count)
    }

    /// Clean close: waits for queued appends, syncs, writes a CLOSE frame recording the final
    /// LSN, syncs it, records the newest segment and last LSN in `CLOSED` (so a later open
    /// detects a deleted or truncated newest segment), stops the writer and releases the lock.
    /// The next open reports `clean_shutdown`.
    ///
    /// # Errors
    /// [`WalError::Poisoned`] if an I/O failure poisoned the log earlier, or the error of the
    /// final writes and syncs. The lock is released either way.
    pub fn close(mut self) -> Result<(), WalError> {
        let result = self.stop_writer(Stop::Close);
        tracing::info!(dir = %self.dir.display(), ok = result.is_ok(), "closed log");
        result
    }

    fn stop_writer(&mut self, stop: Stop) -> Result<(), WalError> {
        let Some(handle) = self.writer.take() else {
            return Ok(());
        };
        {
            let mut state = self.shared.state.lock();
            if state.stop == Stop::Running {
                state.stop = stop;
            }
            self.shared.writer_wake.notify_all();
        }
        match handle.join() {
            Ok(result) => result,
            Err(_) => Err(WalError::Poisoned {
                cause: "the writer thread panicked".to_owned(),
            }),
        }
    }
}

impl Drop for Wal {
    /// Stops the writer after it has written — and synced as its mode requires (and, with
    /// `proof_before_ack`, proven, for whoever still waits) — what was queued, then releases
    /// the lock: like a process crash for anything not durable. Never panics.
    fn drop(&mut self) {
        if let Err(e) = self.stop_writer(Stop::Drop) {
            tracing::debug!(error = %e, "log dropped after an error");
        }
    }
}

/// [`Wal::sync`] on the log's shared state (also [`SyncHandle::sync`]). A lone caller (no
/// round led by another caller under way) commits the round itself — write what is queued,
/// fdatasync, and with `proof_before_ack` the proof — on its own thread, as a lone appender
/// under `Sync` does ([`AppendTicket::wait`]): no hand-off to the writer thread and back.
/// Callers that find a round led by another wake the writer thread, whose group commit takes
/// them all in one fdatasync once that round is done.
fn sync_shared(shared: &Shared, writer: &Mutex<Writer>) -> Result<(), WalError> {
    let mut state = shared.state.lock();
    if let Some(poison) = &state.poison {
        return Err(WalError::Poisoned {
            cause: poison.cause(),
        });
    }
    let target = state.next_lsn - 1;
    if state.acked_lsn >= target {
        return Ok(());
    }
    if state.stop != Stop::Running {
        return Err(WalError::Closed);
    }
    // Recorded even when this caller leads: a close or drop whose last round comes before the
    // leader's then syncs it too (a close syncs everything anyway; a drop under `Interval` or
    // `Buffered` syncs only what is wanted).
    state.sync_wanted = state.sync_wanted.max(target);
    let mut writer_woken = false;
    loop {
        if state.acked_lsn >= target {
            return Ok(());
        }
        if let Some(poison) = &state.poison {
            return Err(poison.to_error());
        }
        if state.writer_done {
            return Err(WalError::Closed);
        }
        if state.stop == Stop::Running && !state.leading {
            state.leading = true;
            parking_lot::MutexGuard::unlocked(&mut state, || {
                writer.lock().commit_rounds(target);
            });
            // A panic in the rounds poisoned the log: nobody waits for a leader then.
            state.leading = false;
            continue;
        }
        // Another caller leads a round, or the log is closing: the writer thread commits
        // (a close syncs, and proves, everything appended).
        if !writer_woken {
            shared.writer_wake.notify_one();
            writer_woken = true;
        }
        shared.progress.wait(&mut state);
    }
}

/// A way to force an fdatasync of the log from a thread that does not own the [`Wal`]
/// ([`Wal::sync_handle`]): it keeps the log's shared state and its writer state (as an
/// [`AppendTicket`] does), not the [`Wal`], so the log may close meanwhile.
#[derive(Clone)]
pub struct SyncHandle {
    shared: Arc<Shared>,
    writer: Arc<Mutex<Writer>>,
}

impl std::fmt::Debug for SyncHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncHandle").finish_non_exhaustive()
    }
}

impl SyncHandle {
    /// [`Wal::sync`]: everything appended so far, fdatasynced (and, with `proof_before_ack`,
    /// proven). Returns at once if everything already is.
    ///
    /// # Errors
    /// As [`Wal::sync`]; [`WalError::Closed`] also when the log was closed or dropped before
    /// everything this call waits for was durable.
    pub fn sync(&self) -> Result<(), WalError> {
        sync_shared(&self.shared, &self.writer)
    }

    /// [`SyncHandle::sync`] as a future, for async callers: it resolves once everything
    /// appended before this call is fdatasynced (and, with `proof_before_ack`, proven), in any
    /// durability mode, without blocking the polling thread: the writer thread does the sync
    /// (it never leads a round itself) and wakes it, as [`AppendTicket::durable`]'s future.
    ///
    /// # Errors
    /// As [`SyncHandle::sync`]: [`WalError::Io`] (the log poisoned, now or before), and
    /// [`WalError::Closed`] when the writer stopped first (a poisoned log answers its poison).
    pub fn sync_async(&self) -> Durable {
        let mut state = self.shared.state.lock();
        let target = state.next_lsn - 1;
        if state.acked_lsn < target && state.stop == Stop::Running {
            // As `sync_shared`: the writer thread's next round syncs (and proves) up to it.
            state.sync_wanted = state.sync_wanted.max(target);
        }
        drop(state);
        Durable {
            ticket: AppendTicket {
                shared: Arc::clone(&self.shared),
                writer: Arc::clone(&self.writer),
                first_lsn: Lsn(target),
                last_lsn: Lsn(target),
                // Nothing of its own to commit when dropped.
                settled: true,
            },
            filed: None,
            writer_woken: false,
            sync: true,
        }
    }
}

impl AppendTicket {
    /// LSN of the first record of the append.
    pub fn first_lsn(&self) -> Lsn {
        self.first_lsn
    }

    /// LSN of the last record of the append.
    pub fn last_lsn(&self) -> Lsn {
        self.last_lsn
    }

    /// Blocks until the append has the log's durability: [`Durability::Sync`] — fdatasynced
    /// (by this call itself when it is alone: at most one frame queued, and one in the round
    /// before; else by the writer thread, concurrent appenders sharing one fdatasync) and, with
    /// [`WalOptions::proof_before_ack`](crate::WalOptions::proof_before_ack) (the default),
    /// proven by a durable mark that no cut of the tail removes (the next group commit's
    /// fdatasync carries it when one at least as large is queued, else a second one);
    /// `Interval`/`Buffered` —
    /// written to the OS (survives a process crash, not necessarily a power cut): this call
    /// writes every frame queued so far itself, with one `write` (waiting for the writer
    /// state if another thread holds it), unless its frame is written already.
    ///
    /// # Errors
    /// [`WalError::Io`] with the original failure if the write or sync of this append (or one
    /// before it) failed, or — with `proof_before_ack`, until its proof is durable — of a later
    /// one whose sync was to carry that proof: the log is then poisoned and the append may or
    /// may not survive a reopen; [`WalError::Closed`] if the writer stopped without completing it.
    pub fn wait(mut self) -> Result<(), WalError> {
        let result = self.wait_inner();
        self.settled = true;
        result
    }

    fn wait_inner(&self) -> Result<(), WalError> {
        let shared = &self.shared;
        let sync_mode = shared.durability == Durability::Sync;
        let writes_itself = !sync_mode;
        // Under Sync: whether this call woke the writer thread to commit its frame.
        let mut writer_woken = false;
        let mut state = shared.state.lock();
        loop {
            let done = shared.ticket_done_mark(&state);
            if done >= self.last_lsn.0 {
                return Ok(());
            }
            if let Some(poison) = &state.poison {
                return Err(poison.to_error());
            }
            if state.writer_done {
                return Err(WalError::Closed);
            }
            if sync_mode && state.stop == Stop::Running {
                if !state.leading && state.queue.len() <= 1 && state.last_round_frames <= 1 {
                    // A lone caller (at most one frame queued, and one in the last
                    // round): it commits its round itself — one write, one fdatasync, the
                    // proof — with no hand-off to the writer thread and back, two thread
                    // switches that cost 10–40 µs here. SQLite's and PostgreSQL's committing
                    // backends flush their own WAL likewise.
                    state.leading = true;
                    parking_lot::MutexGuard::unlocked(&mut state, || {
                        self.writer.lock().commit_rounds(self.last_lsn.0);
                    });
                    // A panic in the rounds poisoned the log: nobody waits for a leader then.
                    state.leading = false;
                    continue;
                }
                // Concurrent callers: the writer thread's group commit gathers them into
                // shared fdatasyncs.
                if !writer_woken {
                    shared.writer_wake.notify_one();
                    writer_woken = true;
                }
            }
            if writes_itself && !state.queue.is_empty() {
                // Write what is queued (this frame among it, unless a writer took it and is
                // writing it now: then this waits for that write, and writes what came after,
                // which costs its appenders nothing). No thread hand-off: the frame is in the
                // OS when this returns, one `write` later.
                parking_lot::MutexGuard::unlocked(&mut state, || {
                    self.writer.lock().write_queued();
                });
                continue;
            }
            shared.progress.wait(&mut state);
        }
    }
}

impl AppendTicket {
    /// [`AppendTicket::wait`] as a future, for async callers: it resolves once the append has
    /// the log's durability (the same rules and errors as `wait`), without blocking the
    /// polling thread — under `Sync` the writer thread commits the append (a `Durable` never
    /// commits a round itself, as a lone blocking caller does), under `Interval`/`Buffered` it
    /// writes it to the OS. Needs no particular async runtime.
    ///
    /// Each poll takes the log's state lock briefly; while pending the future files its waker,
    /// which the log wakes whenever its written or durable marks move, it is poisoned or its
    /// writer ends (with the state lock let go, so a waker may drop another future or ticket of
    /// the log; but on the thread that moved them, maybe the writer thread holding the writer
    /// state: the waker must not poll inline, as no usual executor's does). Dropping the
    /// future before it resolves is as dropping the ticket: the append still happens.
    ///
    /// Cost: O(1) per poll; every pending `Durable` of the log is woken per group commit.
    pub fn durable(self) -> Durable {
        Durable {
            ticket: self,
            filed: None,
            writer_woken: false,
            sync: false,
        }
    }
}

/// The future of [`AppendTicket::durable`]: `Ok(())` once the append has the log's durability;
/// of [`SyncHandle::sync_async`]: `Ok(())` once everything appended before it is synced.
///
/// # Errors
/// As [`AppendTicket::wait`]: [`WalError::Io`] if the log was poisoned before the append was
/// durable (the append may or may not survive a reopen), [`WalError::Closed`] if the writer
/// stopped without completing it.
#[must_use = "futures do nothing unless polled"]
pub struct Durable {
    ticket: AppendTicket,
    /// Where its waker is filed in `State::wakers`: `(epoch, index)`.
    filed: Option<(u64, usize)>,
    /// Whether it asked the writer thread to write (and under `Sync` commit) the append.
    writer_woken: bool,
    /// A [`SyncHandle::sync_async`]: done at the acknowledged (fdatasynced, proven) mark in
    /// every durability mode, not only under `Sync`.
    sync: bool,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// Takes its waker out of the list, if it is still filed there; the caller drops it once
    /// the state lock is let go (dropping a waker runs the executor's code).
    fn unfile(&mut self, state: &mut State) -> Option<std::task::Waker> {
        let (epoch, index) = self.filed.take()?;
        if epoch != state.wakers_epoch {
            return None;
        }
        state.wakers.get_mut(index).and_then(Option::take)
    }
}

impl std::future::Future for Durable {
    type Output = Result<(), WalError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        let shared = Arc::clone(&this.ticket.shared);
        let mut state = shared.state.lock();
        let done = if this.sync {
            state.acked_lsn
        } else {
            shared.ticket_done_mark(&state)
        };
        let answer = if done >= this.ticket.last_lsn.0 {
            Some(Ok(()))
        } else if let Some(poison) = &state.poison {
            Some(Err(poison.to_error()))
        } else if state.writer_done {
            Some(Err(WalError::Closed))
        } else {
            None
        };
        if let Some(answer) = answer {
            let unfiled = this.unfile(&mut state);
            this.ticket.settled = true;
            drop(state);
            drop(unfiled);
            return Poll::Ready(answer);
        }
        if !this.writer_woken {
            // The writer thread writes the queued frames (and under `Sync` commits them,
            // gathering concurrent appends into one fdatasync), as for a dropped ticket.
            shared.writer_wake.notify_one();
            this.writer_woken = true;
        }
        // A waker replaced here is dropped once the lock is let go.
        let mut replaced = None;
        match this.filed {
            Some((epoch, index)) if epoch == state.wakers_epoch => {
                if let Some(slot) = state.wakers.get_mut(index) {
                    match slot {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => replaced = slot.replace(cx.waker().clone()),
                    }
                }
            }
            _ => {
                state.wakers.push(Some(cx.waker().clone()));
                this.filed = Some((state.wakers_epoch, state.wakers.len() - 1));
            }
        }
        drop(state);
        drop(replaced);
        Poll::Pending
    }
}

impl Drop for Durable {
    /// Forgets its waker; the ticket it holds is then dropped as any ticket is (if it did not
    /// resolve, the writer thread still writes and commits the append).
    fn drop(&mut self) {
        if self.filed.is_some() {
            let shared = Arc::clone(&self.ticket.shared);
            let mut state = shared.state.lock();
            let unfiled = self.unfile(&mut state);
            drop(state);
            drop(unfiled);
        }
    }
}

impl Drop for AppendTicket {
    /// A ticket dropped without [`AppendTicket::wait`]: the writer thread writes its frame (at
    /// once, as if it had been waited for), so that "written to the OS at once" holds under
    /// `Interval` and `Buffered` whether or not anyone waits; under `Sync` it commits it.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let state = self.shared.state.lock();
        if self.shared.durability == Durability::Sync {
            // Nobody leads a round for it: the writer thread commits it. (Its frame is still
            // queued, or a round under way commits it: a round that leaves frames unproven
            // leaves frames queued, and wakes the writer thread for them.)
            if state.acked_lsn < self.last_lsn.0 {
                self.shared.writer_wake.notify_one();
            }
            return;
        }
        if state.written_lsn < self.last_lsn.0 && !state.queue.is_empty() {
            self.shared.writer_wake.notify_one();
        }
    }
}

/// One round of work for the writer.
struct Work {
    batch: Vec<PendingFrame>,
    sync_wanted: u64,
    stop: Stop,
    interval_due: bool,
    /// The idle high-water mark is due: nothing was appended for `synced_mark_delay` after
    /// the last sync.
    mark_due: bool,
    poisoned: bool,
    /// The LSN a leader's round commits for its caller — a lone appender under `Sync`, a lone
    /// `Wal::sync` caller in any mode — (0: none): synced and proven before the round ends,
    /// as `sync_wanted` is.
    awaited: u64,
}

/// Marks the writer as gone when its thread ends, however it ends.
struct DoneGuard(Arc<Shared>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.writer_done = true;
        self.0.progress.notify_all();
        let wakers = state.take_durable_wakers();
        // A panic on the writer thread (a storage bug) poisoned the log as it unwound
        // (`PoisonOnUnwind`): the owner is told, as of a failure (the writer state, let go by
        // the unwinding, and the state are not held here).
        let panicked = std::thread::panicking()
            .then(|| state.poison.as_ref().map(Poison::to_error))
            .flatten();
        drop(state);
        wakers.wake();
        if let Some(error) = panicked {
            self.0.report_background_failure(&error);
        }
    }
}

/// Bytes written to the active segment under `Buffered` or `Interval` between two write-backs
/// handed to the write-back thread (RocksDB's `bytes_per_sync`, done with an fdatasync on a
/// thread of its own, since the standard library offers no `sync_file_range`): the OS then
/// holds at most about this much unwritten log when the writer itself must sync — at a roll,
/// an interval sync, a checkpoint's `Wal::sync` — so that sync, which appends wait behind, is
/// short. Under `Sync` every batch is synced anyway.
pub(crate) const WRITEBACK_BYTES: u64 = 4 << 20;

/// The write-back thread's mailbox: the segment to fdatasync next (the newest request wins).
#[derive(Default)]
struct WritebackState {
    request: Option<PathBuf>,
    stop: bool,
}

/// The write-back thread of a `Buffered` or `Interval` log ([`WRITEBACK_BYTES`]): it
/// fdatasyncs the segment the writer names while the writer goes on writing. Its syncs make
/// nothing acknowledged or recorded (`synced_lsn` does not move); a failed one poisons the log
/// like any failed fdatasync.
struct Writeback {
    state: Mutex<WritebackState>,
    wake: Condvar,
}

impl Writeback {
    /// Starts the thread for the log of `shared` on `storage`.
    fn spawn(
        shared: Arc<Shared>,
        storage: Arc<dyn Storage>,
        dir: &Path,
    ) -> Result<(Arc<Writeback>, JoinHandle<()>), WalError> {
        let writeback = Arc::new(Writeback {
            state: Mutex::new(WritebackState::default()),
            wake: Condvar::new(),
        });
        let mailbox = Arc::clone(&writeback);
        let handle = std::thread::Builder::new()
            .name("kairos-wal-writeback".to_owned())
            .spawn(move || mailbox.run(&shared, storage.as_ref()))
            .map_err(|e| io_error("spawn write-back thread", dir, e))?;
        Ok((writeback, handle))
    }

    fn request(&self, path: &Path) {
        let mut state = self.state.lock();
        state.request = Some(path.to_path_buf());
        self.wake.notify_one();
    }

    fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
    }

    fn run(&self, shared: &Shared, storage: &dyn Storage) {
        loop {
            let path = {
                let mut state = self.state.lock();
                loop {
                    if state.stop {
                        return;
                    }
                    if let Some(path) = state.request.take() {
                        break path;
                    }
                    self.wake.wait(&mut state);
                }
            };
            let synced = storage
                .open(&path, OpenMode::Read)
                .and_then(|file| file.sync_data());
            match synced {
                Ok(()) => {}
                // A sealed segment removed after a checkpoint meanwhile: nothing to write back.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let error = io_error("fdatasync (write-back)", &path, e);
                    tracing::error!(error = %error, "log poisoned");
                    let mut state = shared.state.lock();
                    if state.poison.is_none() {
                        state.poison = Some(Poison::from_error(&error));
                    }
                    state.queue.clear();
                    shared.progress.notify_all();
                    let wakers = state.take_durable_wakers();
                    shared.writer_wake.notify_all();
                    drop(state);
                    wakers.wake();
                    shared.report_background_failure(&error);
                    return;
                }
            }
        }
    }
}

/// Longest a `Sync` writer waits for the appenders released by its last
/// fdatasync to append again, so that they share the next one. Small next to
/// one fdatasync here (0.1–2.5 ms).
const GROUP_COMMIT_GATHER: Duration = Duration::from_micros(100);

/// Under `Sync`, how far ahead of its frames the writer keeps the active segment's file
/// written with zeros ([`Writer::flush`]): one append in this many bytes extends the file.
const PREALLOCATE_BYTES: u64 = 64 * 1024;

/// Under `Sync`, only a write of fewer bytes than this writes zeros ahead of its frames
/// ([`PREALLOCATE_BYTES`]) when it extends the file.
const PREALLOCATE_WRITE_BYTES_MAX: u64 = 16 * 1024;

/// Whether a `Sync` round whose frames were just fdatasynced leaves its proof to the next
/// round's fdatasync: only when `queued` frames wait already and they are at least the
/// `round_frames` of this round (a full round follows at once). A lone appender's round (one
/// frame) carries its proof whenever another frame waits, as before.
fn carries_proof(queued: usize, round_frames: usize) -> bool {
    queued > 0 && queued >= round_frames
}

/// Capacity of the writer's batch buffer kept between batches, in bytes.
const WRITE_BUFFER_KEEP_BYTES: usize = 4 << 20;

/// Records `error` as the log's poison (unless one is recorded already), drops the queued
/// frames and wakes every waiter and the writer thread. Called with the writer state held, so
/// that nothing is written after the failure.
fn poison(shared: &Shared, error: &WalError) {
    tracing::error!(error = %error, "log poisoned");
    let mut state = shared.state.lock();
    if state.poison.is_none() {
        state.poison = Some(Poison::from_error(error));
    }
    state.queue.clear();
    shared.progress.notify_all();
    let wakers = state.take_durable_wakers();
    shared.writer_wake.notify_all();
    drop(state);
    wakers.wake();
}

/// Poisons the log if dropped armed: a write by an appender that panicked half-way (its
/// frames taken from the queue, maybe partly written) must not let a later write go on after
/// them as if they were there.
struct PoisonOnUnwind<'a> {
    shared: &'a Shared,
    armed: bool,
}

impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed {
            poison(
                self.shared,
                &WalError::Poisoned {
                    cause: "a thread writing the log panicked".to_owned(),
                },
            );
        }
    }
}

/// What the writer thread does next: `Work`, or wait (until the instant, if any).
enum Decision {
    Work(Work),
    Wait(Option<Instant>),
}

/// The writer thread's body: takes work under the writer state and processes it; waits with
/// the writer state let go.
fn run_writer(writer: &Mutex<Writer>, shared: Arc<Shared>) -> Result<(), WalError> {
    let _done = DoneGuard(Arc::clone(&shared));
    let result = writer_loop(writer, &shared);
    let writeback = writer.lock().writeback.take();
    if let Some((writeback, handle)) = writeback {
        writeback.stop();
        if handle.join().is_err() {
            tracing::error!("the log's write-back thread panicked");
        }
    }
    result
}

fn writer_loop(writer: &Mutex<Writer>, shared: &Shared) -> Result<(), WalError> {
    loop {
        // Lock order: the writer state, then the shared state.
        let mut gather_until: Option<Instant> = None;
        let (mut w, work) = loop {
            let w = writer.lock();
            let mut state = shared.state.lock();
            match w.decide(&mut state, &mut gather_until) {
                Decision::Work(work) => {
                    drop(state);
                    break (w, work);
                }
                Decision::Wait(until) => {
                    // Let appenders write meanwhile; still under the state lock, so no wake-up
                    // is missed.
                    drop(w);
                    match until {
                        Some(until) => {
                            shared.writer_wake.wait_until(&mut state, until);
                        }
                        None => {
                            state.writer_waits_untimed = true;
                            shared.writer_wake.wait(&mut state);
                            state.writer_waits_untimed = false;
                        }
                    }
                }
            }
        };
        if work.poisoned {
            let state = shared.state.lock();
            let cause = state.poison.as_ref().map(Poison::cause).unwrap_or_default();
            return Err(WalError::Poisoned { cause });
        }
        let stop = work.stop;
        // Dropped before `w` if `process` panics: the poison is recorded while the writer
        // state is still held, so no appender writes after what the panic lost.
        let mut unwinding = PoisonOnUnwind {
            shared,
            armed: true,
        };
        let result = w.process(work);
        unwinding.armed = false;
        if let Err(error) = &result {
            // Before the writer state is let go: an appender waiting for it must find the log
            // poisoned, not write after the frames this failure lost.
            poison(shared, error);
        }
        drop(w);
        if let (Stop::Running, Err(error)) = (stop, &result) {
            // An interval sync, or a round whose callers learn it from their tickets: the
            // owner learns it now, whether or not anyone waits (a close's caller gets its
            // error from `close`).
            shared.report_background_failure(error);
        }
        match (stop, result) {
            (Stop::Running, _) => {}
            (_, Err(e)) => return Err(e),
            (_, Ok(())) => return Ok(()),
        }
    }
}

/// The writer state: it alone touches the active segment. Behind a mutex shared by the writer
/// thread and the [`AppendTicket`]s; lock order: this mutex, then [`Shared::state`]. The writer
/// thread holds it while it decides and works, never while it waits.
struct Writer {
    shared: Arc<Shared>,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    store_id: StoreId,
    segment_bytes: u64,
    active: Active,
    /// Highest LSN written to the OS.
    written: u64,
    /// Highest LSN fdatasynced.
    synced: u64,
    /// Highest LSN a durable mark proves synced (a mark slot, a sealed segment, `SYNCED`):
    /// no damage to the tail can drop it unnoticed.
    proven: u64,
    /// [`WalOptions::proof_before_ack`](crate::WalOptions::proof_before_ack).
    proof: bool,
    /// Highest `synced_lsn` recorded in a frame on disk.
    recorded_synced: u64,
    /// Frames encoded but not yet written.
    buf: Vec<u8>,
    /// Last LSN in `buf`.
    buf_last_lsn: u64,
    last_sync: Instant,
    /// Frames in the last batch written (for group-commit gathering).
    last_batch_frames: usize,
    /// `WalOptions::synced_mark_delay`, or `None` where the mark is not written (Buffered, or
    /// a storage that does not allow timed I/O).
    synced_mark_delay: Option<Duration>,
    /// Highest LSN recorded as synced in `SYNCED` or `CLOSED`.
    marked: u64,
    /// Highest synced LSN whose idle `SYNCED` write failed ([`Writer::write_idle_mark`]): the
    /// idle mark is not tried again until a later sync passes it (0: none failed).
    idle_mark_failed: u64,
    /// Whether each roll records the new segment in `SYNCED` (`proof_before_ack`, or
    /// `synced_mark_delay` set and not `Buffered`; unlike the idle mark, not a timed write: it
    /// is part of the roll).
    marks_rolls: bool,
    /// The write-back thread (`Buffered` and `Interval`, on a storage that allows timed and
    /// background I/O), started with the first write-back; `None` where there is none.
    writeback: Option<(Arc<Writeback>, JoinHandle<()>)>,
    /// Whether this log writes back ([`WRITEBACK_BYTES`]).
    writes_back: bool,
    /// Offset in the active segment up to which write-back was requested.
    writeback_from: u64,
}

impl Writer {
    /// Writes every queued frame, if the log is not poisoned, and publishes the new written
    /// mark — what an appender waiting under `Interval` or `Buffered` does instead of handing
    /// the write to the writer thread (whoever holds the [`Writer`] writes, one at a time, in
    /// LSN order: the queue is taken whole under the state lock). A failed write poisons the
    /// log as the writer thread's would. Under `Interval`, the first write after a sync wakes
    /// the writer thread, whose interval sync it now owes.
    fn write_queued(&mut self) {
        let batch = {
            let mut state = self.shared.state.lock();
            // After the writer thread ended (its last round took the queue), nothing is left
            // to write, and the directory may be another handle's by now.
            if state.poison.is_some() || state.writer_done || state.queue.is_empty() {
                return;
            }
            std::mem::take(&mut state.queue)
        };
        let was_synced = self.written == self.synced;
        if self.poisoning(|w| w.write_batch(batch)) {
            self.publish();
            if matches!(self.shared.durability, Durability::Interval(_))
                && was_synced
                && self.written > self.synced
            {
                self.shared.writer_wake.notify_one();
            }
        }
    }

    /// Runs `work` on the writer state for a waiting appender: a failure (or a panic) poisons
    /// the log before the writer state is let go, as the writer thread's does. Returns whether
    /// `work` succeeded.
    fn poisoning(&mut self, work: impl FnOnce(&mut Writer) -> Result<(), WalError>) -> bool {
        let shared = Arc::clone(&self.shared);
        let mut guard = PoisonOnUnwind {
            shared: &shared,
            armed: true,
        };
        let result = work(self);
        guard.armed = false;
        match result {
            Ok(()) => true,
            Err(error) => {
                poison(&shared, &error);
                false
            }
        }
    }

    /// A leader's rounds (a lone appender under `Sync`, [`AppendTicket::wait`]; a lone
    /// `Wal::sync` caller in any mode, `sync_shared`): until `awaited` is acked,
    /// commits everything queued — written, fdatasynced and, with `proof_before_ack`, proven
    /// unless the next round's fdatasync is to carry the proof (then that next round follows at
    /// once, led by the same caller, who waits for it anyway) — as the writer thread's rounds
    /// would, publishing the new marks after each. A failure poisons the log as the writer
    /// thread's would. Wakes the writer thread if the rounds leave it an idle mark to write and
    /// it waits without a deadline.
    fn commit_rounds(&mut self, awaited: u64) {
        loop {
            let work = {
                let mut state = self.shared.state.lock();
                if state.poison.is_some()
                    || state.writer_done
                    || state.stop != Stop::Running
                    || state.acked_lsn >= awaited
                {
                    break;
                }
                Work {
                    batch: std::mem::take(&mut state.queue),
                    sync_wanted: state.sync_wanted,
                    stop: Stop::Running,
                    interval_due: false,
                    mark_due: false,
                    poisoned: false,
                    awaited,
                }
            };
            if !self.poisoning(|w| w.process(work)) {
                return;
            }
        }
        let state = self.shared.state.lock();
        // The last round left frames queued (its proof is to ride on their fdatasync), or an
        // idle mark to write: the writer thread goes on from here.
        if !state.queue.is_empty() || (self.mark_deadline().is_some() && state.writer_waits_untimed)
        {
            self.shared.writer_wake.notify_one();
        }
    }

    /// What the writer thread does next: the work to take now (taken from `state`), or how
    /// long to wait for more (the caller waits with the writer state let go, so that
    /// appenders write meanwhile). `gather_until`: the end of the group commit's gathering
    /// wait under way, if any.
    fn decide(&self, state: &mut State, gather_until: &mut Option<Instant>) -> Decision {
        let interval = match self.shared.durability {
            Durability::Interval(d) => Some(d),
            Durability::Sync | Durability::Buffered => None,
        };
        if state.poison.is_some() {
            state.queue.clear();
            if state.stop != Stop::Running {
                return Decision::Work(Work {
                    batch: Vec::new(),
                    sync_wanted: 0,
                    stop: state.stop,
                    interval_due: false,
                    mark_due: false,
                    poisoned: true,
                    awaited: 0,
                });
            }
            return Decision::Wait(None);
        }
        let interval_due =
            interval.is_some_and(|d| self.written > self.synced && self.last_sync.elapsed() >= d);
        if !state.queue.is_empty()
            || state.sync_wanted > self.acked()
            || state.stop != Stop::Running
            || interval_due
        {
            if self.should_gather(state) {
                let until =
                    *gather_until.get_or_insert_with(|| Instant::now() + GROUP_COMMIT_GATHER);
                if Instant::now() < until {
                    return Decision::Wait(Some(until));
                }
            }
            return Decision::Work(Work {
                batch: std::mem::take(&mut state.queue),
                sync_wanted: state.sync_wanted,
                stop: state.stop,
                interval_due,
                mark_due: false,
                poisoned: false,
                awaited: 0,
            });
        }
        // Idle. The interval sync comes first; the mark only once everything is synced.
        let deadline = match interval {
            // An interval too long for an `Instant` (`Duration::MAX`): never due.
            Some(d) if self.written > self.synced => self.last_sync.checked_add(d),
            _ => self.mark_deadline(),
        };
        match deadline {
            Some(deadline) if Instant::now() >= deadline && self.written == self.synced => {
                Decision::Work(Work {
                    batch: Vec::new(),
                    sync_wanted: 0,
                    stop: Stop::Running,
                    interval_due: false,
                    mark_due: true,
                    poisoned: false,
                    awaited: 0,
                })
            }
            deadline => Decision::Wait(deadline),
        }
    }

    /// When the idle high-water mark falls due, if one is wanted: `synced_mark_delay` after
    /// the last sync, once every written LSN is synced and some synced LSN is not in `SYNCED`
    /// (or `CLOSED`) yet — and not the one whose idle mark just failed (tried again only once
    /// a later sync passes it: [`Writer::write_idle_mark`]).
    fn mark_deadline(&self) -> Option<Instant> {
        let delay = self.synced_mark_delay?;
        (self.written == self.synced && self.synced > self.marked.max(self.idle_mark_failed))
            .then(|| self.last_sync + delay)
    }

    /// Group commit, gathering: under `Sync`, when the last batch held more
    /// frames than are queued now, the appenders it released are probably
    /// about to append again; wait briefly (at most [`GROUP_COMMIT_GATHER`])
    /// so they share this fdatasync instead of alternating between a batch of
    /// one and a batch of the rest. A lone appender (last batch of one) never
    /// waits.
    fn should_gather(&self, state: &State) -> bool {
        self.shared.durability == Durability::Sync
            && state.stop == Stop::Running
            && state.sync_wanted <= self.acked()
            && !state.queue.is_empty()
            && state.queue.len() < self.last_batch_frames
    }

    fn process(&mut self, work: Work) -> Result<(), WalError> {
        let had_batch = !work.batch.is_empty();
        if had_batch {
            self.last_batch_frames = work.batch.len();
        }
        if had_batch {
            self.write_batch(work.batch)?;
        }
        let need_sync = (had_batch && self.shared.durability == Durability::Sync)
            || work.sync_wanted > self.synced
            || work.awaited > self.synced
            || work.interval_due
            || work.stop == Stop::Close;
        if need_sync && self.written > self.synced {
            self.sync()?;
        }
        if self.proof && self.synced > self.proven {
            let sync_mode = self.shared.durability == Durability::Sync;
            // Someone waits for these LSNs: an appender under Sync, a `Wal::sync` caller.
            let awaited = (had_batch && sync_mode)
                || work.sync_wanted > self.proven
                || work.awaited > self.proven;
            // Under Sync, the next round's fdatasync carries the mark at no extra cost (in a
            // segment with slots: a version-1 segment's syncs record none) when a round at
            // least as large as this one is queued already. With fewer frames queued, those
            // are stragglers of a few producers, the rest of whom wait for this proof: carrying
            // it would hold this round's callers for another round and split the producers
            // into two cohorts taking turns (3.3–3.6 calls per fdatasync with eight producers
            // against 3.8–4.0 proving at once, BENCHMARKS.md). A clean close proves everything
            // with CLOSED below.
            let carried = (sync_mode
                && self.active.slots.is_some()
                && work.stop == Stop::Running
                && carries_proof(self.shared.state.lock().queue.len(), self.last_batch_frames))
                || work.stop == Stop::Close;
            if awaited && !carried {
                self.prove()?;
            }
        }
        self.publish();
        match work.stop {
            Stop::Close => {
                self.write_control(FrameKind::Close)?;
                self.cut_preallocated()?;
                self.sync_file()?;
                // The high-water mark: this segment and every LSN so far are durable now.
                let closed = Closed {
                    store_id: self.store_id,
                    seq: self.active.seq,
                    last_lsn: Lsn(self.written),
                };
                write_file_atomically(
                    self.storage.as_ref(),
                    &self.dir,
                    format::CLOSED_FILE_NAME,
                    &closed.encode(),
                )?;
                // CLOSED proves every LSN: release whoever waits for a proof.
                self.proven = self.written;
                self.publish();
                Ok(())
            }
            Stop::Drop => Ok(()),
            Stop::Running if work.mark_due => {
                // Nothing was appended since (decide checked under the queue's lock, and
                // anything appended since waits behind this).
                if self.written == self.synced
                    && self.synced > self.marked.max(self.idle_mark_failed)
                {
                    self.write_idle_mark();
                }
                Ok(())
            }
            Stop::Running => {
                if self.synced > self.recorded_synced
                    && self.synced == self.written
                    && self.shared.state.lock().queue.is_empty()
                {
                    self.write_mark_frame();
                }
                Ok(())
            }
        }
    }

    fn publish(&self) {
        let mut state = self.shared.state.lock();
        if state.poison.is_some() {
            // A failed write-back sync poisoned the log meanwhile: acknowledge nothing more.
            return;
        }
        state.written_lsn = self.written;
        state.synced_lsn = self.synced;
        state.acked_lsn = self.acked();
        state.last_round_frames = self.last_batch_frames;
        self.shared.progress.notify_all();
        let wakers = state.take_durable_wakers();
        drop(state);
        wakers.wake();
    }

    /// Encodes and writes a batch with as few writes as possible (one unless it rolls).
    fn write_batch(&mut self, batch: Vec<PendingFrame>) -> Result<(), WalError> {
        self.buf.clear();
        for frame in batch {
            let frame_bytes = (FRAME_HEADER_BYTES + frame.body.len()) as u64;
            let end = self.active.len + self.buf.len() as u64;
            if end > self.active.frames_offset && end + frame_bytes > self.segment_bytes {
                self.flush()?;
                self.roll()?;
            }
            let header = format::encode_frame_header(
                FrameKind::Data,
                frame.body.len() as u32,
                frame.record_count,
                frame.first_lsn,
                self.synced,
                &frame.body_crc,
            );
            debug_assert_eq!(
                frame.first_lsn,
                self.buf_last_lsn.max(self.written) + 1,
                "frames must be written in LSN order"
            );
            self.buf.extend_from_slice(&header);
            self.buf.extend_from_slice(&frame.body);
            self.buf_last_lsn = frame.first_lsn + u64::from(frame.record_count) - 1;
        }
        self.flush()
    }

    /// Writes `buf` at the end of the active segment; under `Sync`, when a small write extends
    /// the file, then writes zeros ahead of it ([`Writer::write_zeros_ahead`]).
    fn flush(&mut self) -> Result<(), WalError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data_bytes = self.buf.len() as u64;
        let end = self.active.len + data_bytes;
        self.active
            .file
            .write_all_at(&self.buf, self.active.len)
            .map_err(|e| io_error("write", &self.active.path, e))?;
        let extends = end > self.active.file_len;
        self.active.file_len = self.active.file_len.max(end);
        self.active.len = end;
        if self.shared.durability == Durability::Sync
            && extends
            && data_bytes < PREALLOCATE_WRITE_BYTES_MAX
        {
            self.write_zeros_ahead();
        }
        self.buf.clear();
        if self.buf.capacity() > WRITE_BUFFER_KEEP_BYTES {
            // One huge append should not pin its size in memory for the life of the log.
            self.buf = Vec::new();
        }
        self.written = self.buf_last_lsn;
        self.recorded_synced = self.recorded_synced.max(self.synced);
        self.write_back()
    }

    /// Under `Sync`, after a small write that extended the active segment: zeros from its end
    /// up to [`PREALLOCATE_BYTES`] past it (never past the segment's size; a roll cuts them off
    /// before sealing), so that the fdatasyncs of the appends that follow overwrite bytes of
    /// the file instead of extending it, and write only data (extending, each would also commit
    /// the file's new size: on ext4 a journal commit, about a third of a small append's
    /// fdatasync). A large write extends the file itself: its one size commit is small next to
    /// its data, and zeros after it would add to what every sync writes.
    ///
    /// The zeros are an optimisation, written after the frames and apart from them, so that
    /// they can never fail an append whose frames were written: a failure of this write (an
    /// error, or a short write — a disk with room for the frames but not for the zeros fails
    /// with ENOSPC after storing the part that fits) is logged and ignored. The file then ends
    /// somewhere between the frames' end and where the zeros were meant to end, and
    /// `file_len` says the latter: an upper bound of the file's length is all that the writer
    /// needs of it (it decides when to write zeros again, and that a roll or a close must
    /// [`cut_preallocated`](Writer::cut_preallocated) — a `set_len` down to the frames' end,
    /// right whatever the file's length past them). Restoring the length with a `set_len`
    /// instead would be one more operation, on a disk that just failed one, whose own
    /// failure would leave the length unknown all the same. The appends that follow write
    /// into what zeros there are, then extend the file themselves until they pass
    /// `file_len`, where zeros are tried again. What was written of them before the
    /// appends' fdatasync reads, after a crash, as the zero tail recovery cuts off without
    /// calling it a torn tail, as the whole 64 KiB would.
    fn write_zeros_ahead(&mut self) {
        static ZEROS: [u8; PREALLOCATE_BYTES as usize] = [0; PREALLOCATE_BYTES as usize];
        let from = self.active.len;
        let to = (from + PREALLOCATE_BYTES).min(self.segment_bytes).max(from);
        if to == from {
            return;
        }
        // Counted as written whatever comes of the write: an upper bound (see above).
        self.active.file_len = self.active.file_len.max(to);
        let zeros = &ZEROS[..(to - from) as usize];
        if let Err(e) = self.active.file.write_all_at(zeros, from) {
            tracing::debug!(
                file = %self.active.path.display(),
                from,
                to,
                error = %e,
                "could not write the zeros ahead of the frames; going on without them"
            );
        }
    }

    /// Hands the active segment to the write-back thread once [`WRITEBACK_BYTES`] more were
    /// written to it (starting the thread the first time).
    fn write_back(&mut self) -> Result<(), WalError> {
        if !self.writes_back || self.active.len < self.writeback_from + WRITEBACK_BYTES {
            return Ok(());
        }
        if self.writeback.is_none() {
            self.writeback = Some(Writeback::spawn(
                Arc::clone(&self.shared),
                Arc::clone(&self.storage),
                &self.dir,
            )?);
        }
        if let Some((writeback, _)) = &self.writeback {
            writeback.request(&self.active.path);
        }
        self.writeback_from = self.active.len;
        Ok(())
    }

    fn sync_file(&mut self) -> Result<(), WalError> {
        self.active
            .file
            .sync_data()
            .map_err(|e| io_error("fdatasync", &self.active.path, e))?;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Syncs everything written. The same fdatasync makes durable a mark slot recording the
    /// previous sync's LSN (FORMAT.md, "Mark slots"), so the segment's header area says how far
    /// it was durable, one group commit behind, without a sync of its own.
    fn sync(&mut self) -> Result<(), WalError> {
        self.active.write_mark_slot(self.synced)?;
        self.sync_file()?;
        // The slot written above is durable now: it proves the previous sync's LSNs.
        if let Some(mark) = self.active.slots_mark() {
            self.proven = self.proven.max(mark);
        }
        self.synced = self.written;
        Ok(())
    }

    /// The highest LSN acknowledged as durable: `proven` with
    /// [`WalOptions::proof_before_ack`](crate::WalOptions::proof_before_ack), else `synced`.
    fn acked(&self) -> u64 {
        if self.proof {
            self.proven
        } else {
            self.synced
        }
    }

    /// Makes every synced LSN provable after any later damage to the tail: a mark slot naming
    /// `synced`, then an fdatasync (a version-1 segment has no slots: `SYNCED` instead).
    fn prove(&mut self) -> Result<(), WalError> {
        if self.active.write_mark_slot(self.synced)? {
            self.sync_file()?;
        } else if self.active.slots.is_none() && self.marked < self.synced {
            self.write_synced_file()?;
        }
        self.proven = self.synced;
        Ok(())
    }

    /// Records the active segment and the highest synced LSN in `SYNCED` (replace protocol:
    /// two syncs and a rename). Only valid when that LSN is durable.
    fn write_synced_file(&mut self) -> Result<(), WalError> {
        write_synced(
            self.storage.as_ref(),
            &self.dir,
            &self.store_id,
            self.active.seq,
            self.synced,
        )?;
        self.marked = self.synced;
        Ok(())
    }

    /// Puts the last sync on record while the writer goes idle: a MARK frame (not synced),
    /// so that damage to the batch just synced is recognisable as corruption after a process
    /// crash (FORMAT.md, "Frame": MARK). Only when everything written is synced.
    ///
    /// Evidence, which nothing waits for and nothing acknowledged depends on: an append is
    /// acknowledged by its sync (and, with proof before acknowledgement, by the mark slot or
    /// `SYNCED` that proves it) before this frame is written, and a power cut may take the
    /// frame anyway. So a failed write of it — an error, or a short write: a full disk stores
    /// the part that fits, then fails with ENOSPC — is logged (debug level) and ignored, and
    /// the log goes on. What got written of it is not counted as a frame: `len` stays where
    /// it began, so the next frame the writer writes — a DATA frame, a SEAL or a CLOSE, each
    /// at least as long as a MARK (32 bytes) — goes exactly over it, and the frames stay back
    /// to back: its bytes never lie between two frames, where recovery, finding valid frames
    /// after them, would call them corruption. `file_len` counts the whole MARK as written (an
    /// upper bound of the file's length, as after zeros ahead that failed). Until that next
    /// frame, the part written is the file's tail: after a crash, recovery finds an invalid
    /// frame with nothing synced at or after it (its LSN is the one after the last synced)
    /// and cuts it off as a torn tail holding no record — or as a zero tail, if only its 4
    /// leading zero bytes got written — the same as a crash during a whole MARK's write. Not
    /// retried by itself: the writer's next round that ends with nothing queued writes it
    /// again (in practice the next sync's MARK), and every frame's header records the synced
    /// LSN as well.
    fn write_mark_frame(&mut self) {
        let at = self.active.len;
        if let Err(error) = self.write_control(FrameKind::Mark) {
            self.active.file_len = self.active.file_len.max(at + FRAME_HEADER_BYTES as u64);
            tracing::debug!(
                file = %self.active.path.display(),
                offset = at,
                synced_lsn = self.synced,
                error = %error,
                "could not write the MARK frame after a sync; going on without it"
            );
        }
    }

    /// Records the sync in `SYNCED` once the writer has been idle for `synced_mark_delay` (the
    /// idle high-water mark), so that recovery after an unclean shutdown knows these LSNs were
    /// durable even if the frames proving it are cut off or their segment is gone. Only when
    /// everything written is synced, which it then is: nothing was appended meanwhile.
    ///
    /// Evidence, like the MARK frame ([`Writer::write_mark_frame`]): written after the fact,
    /// of LSNs already durable, and never counted as proof (`proven` does not move): an
    /// acknowledged LSN is proven by a mark slot, a seal or a `SYNCED` written by a roll, an
    /// open or a version-1 segment's proof — or, without proof before acknowledgement, by its
    /// sync alone. Nothing acknowledged waits for this one or depends on it. (Those other
    /// `SYNCED` writes do prove something, and their failure still poisons.) So a
    /// failure at any step of its replace protocol is logged (debug level) and ignored. The
    /// protocol leaves the old `SYNCED` (or none) until the rename, and renames only a new
    /// file already fdatasynced, which names LSNs already durable, so either file is true
    /// after a crash: a failed write, fdatasync or rename leaves the old one and at most a
    /// `SYNCED.tmp` (removed before the next replace, and at open); a failed directory fsync
    /// after the rename leaves whichever of the two the directory keeps. `marked` moves only
    /// on success. Not retried for this LSN (a full disk would fail it every
    /// `synced_mark_delay`): `idle_mark_failed` holds it off until a later sync, after which
    /// the next idle period tries again.
    fn write_idle_mark(&mut self) {
        match self.write_synced_file() {
            Ok(()) => {
                tracing::trace!(
                    synced_lsn = self.synced,
                    "recorded the idle high-water mark"
                );
            }
            Err(error) => {
                self.idle_mark_failed = self.synced;
                tracing::debug!(
                    synced_lsn = self.synced,
                    error = %error,
                    "could not record the idle high-water mark in SYNCED; going on without it"
                );
            }
        }
    }

    /// Writes a SEAL, CLOSE or MARK frame; only valid when everything written is synced.
    fn write_control(&mut self, kind: FrameKind) -> Result<(), WalError> {
        debug_assert_eq!(self.synced, self.written, "{kind:?} needs a synced log");
        let frame = format::encode_frame(kind, 0, self.written + 1, self.synced, &[]);
        self.active
            .file
            .write_all_at(&frame, self.active.len)
            .map_err(|e| io_error("write", &self.active.path, e))?;
        self.active.len += frame.len() as u64;
        self.active.file_len = self.active.file_len.max(self.active.len);
        self.recorded_synced = self.synced;
        Ok(())
    }

    /// Cuts the zeros written ahead of the frames off the active segment (before the fdatasync
    /// that seals or closes it), so that it ends with its last frame. Whenever `file_len` says
    /// there may be any: the `set_len` is right whether all of them, part of them (a zeros
    /// write that failed or came out short) or none got written.
    fn cut_preallocated(&mut self) -> Result<(), WalError> {
        if self.active.file_len > self.active.len {
            self.active
                .file
                .set_len(self.active.len)
                .map_err(|e| io_error("truncate", &self.active.path, e))?;
            self.active.file_len = self.active.len;
        }
        Ok(())
    }

    /// Syncs and seals the active segment, then starts the next one.
    fn roll(&mut self) -> Result<(), WalError> {
        // Before the SEAL: a sealed segment that nothing can follow would not reopen.
        let seq = next_seq(self.active.seq, &self.active.path)?;
        if self.written > self.synced {
            self.sync()?;
        }
        self.write_control(FrameKind::Seal)?;
        self.cut_preallocated()?;
        self.sync_file()?;
        let next = create_segment(
            self.storage.as_ref(),
            &self.dir,
            &self.store_id,
            seq,
            self.written,
        )?;
        // Removable only now that its successor exists durably: `remove_segments_before`
        // records the successor in TRIM as the oldest segment that must exist.
        self.shared.sealed.lock().push(SealedSegment {
            path: self.active.path.clone(),
            seq: self.active.seq,
            last_lsn: self.written,
        });
        tracing::debug!(sealed = %self.active.path.display(), last_lsn = self.written, "rolled segment");
        self.active = next;
        self.writeback_from = 0;
        if self.marks_rolls {
            // The new segment on record: deleting it (and with it every record synced into it
            // later) is then a missing segment, not a crash during this roll.
            self.write_synced_file()?;
        }
        // A sealed segment with a durable successor is durable to its end: no cut of the
        // newest segment's tail reaches its records.
        self.proven = self.written;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::carries_proof;

    /// A `Sync` round's proof rides on the next round only when a round at least as large is
    /// queued: stragglers of a larger round do not hold its callers another round.
    #[test]
    fn a_round_leaves_its_proof_only_to_a_round_as_large() {
        // (queued, frames of the round just synced) → carried
        let cases = [
            ((0, 1), false),
            ((1, 1), true),
            ((3, 1), true),
            ((0, 8), false),
            ((1, 8), false),
            ((7, 8), false),
            ((8, 8), true),
            ((9, 8), true),
        ];
        for ((queued, round), carried) in cases {
            assert_eq!(
                carries_proof(queued, round),
                carried,
                "{queued} queued after {round}"
            );
        }
    }
}
