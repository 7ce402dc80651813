//! Checkpoints: writing the live state as of one LSN (`crate::checkpoint`
//! has the file format), deleting the log segments it covers, the background
//! thread that triggers them by log growth and time, and loading the newest
//! one at open.
//!
//! Protocol (a crash at any step leaves a directory that opens to the same
//! state): under the core lock, encode every live task and dead letter and
//! read the log's last LSN `L` — the state in memory is exactly the effect of
//! the records up to `L`, since every change enqueues its record under that
//! lock; release the lock; fdatasync the log up to `L` (so no LSN up to `L`
//! can be lost and reused after a crash); write `checkpoint/{L}.ckpt` (tmp,
//! fdatasync, rename, directory fsync); remove older checkpoint files; remove
//! the log segments whose records all lie at or below `L`
//! (`Wal::remove_segments_before`, which writes `TRIM` first).

use super::{Core, Shared, Status};
use crate::checkpoint::{self, CheckpointEncoder, CheckpointHeader, CHECKPOINT_DIR_NAME};
use crate::error::{CheckpointError, OpenError};
use crate::replay::Replay;
use crate::task::TaskState;
use kairos_wal::storage::Storage;
use kairos_wal::{Lsn, Wal};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What [`crate::Engine::checkpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointReport {
    /// The checkpoint's LSN: it holds the state after every record up to it.
    pub lsn: u64,
    /// False if nothing was logged since the last checkpoint (none written).
    pub written: bool,
    /// Live tasks it holds.
    pub tasks: u64,
    /// Dead letters it holds.
    pub dead_letters: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Log segments deleted because it covers them.
    pub segments_removed: usize,
    /// Time the engine's lock was held to copy the state.
    pub locked: Duration,
    /// Time the whole checkpoint took.
    pub elapsed: Duration,
}

/// Where an engine with a directory keeps its files.
#[derive(Debug)]
pub(crate) struct Disk {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
}

impl Disk {
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join(CHECKPOINT_DIR_NAME)
    }
}

/// Checkpoint bookkeeping, behind `Shared::checkpointing` (held for the
/// whole of a checkpoint, so two never overlap).
#[derive(Debug, Default)]
pub(crate) struct CheckpointBook {
    /// LSN of the newest checkpoint on disk (0: none).
    pub lsn: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The checkpoint loaded at open, if any.
pub(crate) struct Loaded {
    pub replay: Replay,
    pub meta: LoadedMeta,
}

/// Which checkpoint was loaded.
pub(crate) struct LoadedMeta {
    pub lsn: u64,
    pub bytes: u64,
    pub store_id: kairos_wal::format::StoreId,
    pub path: PathBuf,
    /// Why a newer checkpoint file could not be used, if one exists: the
    /// error reported if this older one does not fit the log either.
    pub newer_damaged: Option<OpenError>,
}

impl Shared {
    /// Takes a checkpoint now (see the module docs).
    pub(crate) fn checkpoint(&self) -> Result<CheckpointReport, CheckpointError> {
        let Some(disk) = &self.disk else {
            return Err(CheckpointError::InMemory);
        };
        let mut book = self.checkpointing.lock();
        let started = Instant::now();
        let (bytes, header, tasks, dead_letters, wal, locked) = {
            let mut core = self.core.lock();
            match &core.status {
                Status::Open => {}
                Status::Closed => return Err(CheckpointError::Closed),
                Status::Poisoned(cause) => {
                    return Err(CheckpointError::Poisoned {
                        cause: cause.clone(),
                    })
                }
            }
            let Some(wal) = core.wal.clone() else {
                return Err(CheckpointError::Closed);
            };
            let lsn = wal.last_lsn().0;
            core.log_bytes_since_checkpoint = 0;
            if lsn == book.lsn {
                drop(core);
                let segments_removed = wal.remove_segments_before(Lsn(lsn + 1))?;
                return Ok(CheckpointReport {
                    lsn,
                    written: false,
                    tasks: 0,
                    dead_letters: 0,
                    bytes: book.bytes,
                    segments_removed,
                    locked: Duration::ZERO,
                    elapsed: started.elapsed(),
                });
            }
            let header = CheckpointHeader {
                store_id: wal.store_id(),
                lsn,
                max_task_id: core.next_id.saturating_sub(1),
                created_ms: disk.storage.now_ms(),
            };
            let enc = encode(&core, &header);
            let (tasks, dead) = (enc.tasks(), enc.dead_letters());
            (enc.finish(), header, tasks, dead, wal, started.elapsed())
        };
        // Every record the checkpoint reflects must be durable before the
        // checkpoint exists: otherwise a crash could lose them and let new
        // records reuse their LSNs, which replay would skip as covered.
        if let Err(e) = wal.sync() {
            self.poison(format!("checkpoint: log sync failed: {e}"));
            return Err(e.into());
        }
        let dir = disk.checkpoint_dir();
        create_dir(disk.storage.as_ref(), &disk.dir, &dir)?;
        let name = checkpoint::file_name(header.lsn);
        checkpoint::write_file(disk.storage.as_ref(), &dir, &name, &bytes)
            .map_err(|(op, path, source)| CheckpointError::Io { op, path, source })?;
        book.lsn = header.lsn;
        book.bytes = bytes.len() as u64;
        remove_older(disk.storage.as_ref(), &dir, header.lsn)?;
        let segments_removed = wal.remove_segments_before(Lsn(header.lsn + 1))?;
        tracing::debug!(
            lsn = header.lsn,
            tasks,
            dead_letters,
            bytes = bytes.len(),
            segments_removed,
            "checkpoint written"
        );
        Ok(CheckpointReport {
            lsn: header.lsn,
            written: true,
            tasks,
            dead_letters,
            bytes: bytes.len() as u64,
            segments_removed,
            locked,
            elapsed: started.elapsed(),
        })
    }

    /// Counts appended log bytes and wakes the checkpointer when the log has
    /// grown enough (`Config::checkpoint_log_bytes`, or the size of the last
    /// checkpoint if larger, so that copying the live state costs at most
    /// as much as the log written).
    pub(super) fn count_log_bytes(&self, core: &mut Core, bytes: u64) {
        core.log_bytes_since_checkpoint += bytes;
        if let Some(threshold) = self.config.checkpoint_log_bytes {
            if !core.checkpoint_wanted
                && core.log_bytes_since_checkpoint >= threshold.max(core.last_checkpoint_bytes)
            {
                core.checkpoint_wanted = true;
                self.checkpoint_cv.notify_all();
            }
        }
    }

    /// The background checkpointer: waits for the log-growth trigger or the
    /// interval (measured in real time, whatever the engine's clock), takes a
    /// checkpoint, and repeats until the engine stops. A failed checkpoint
    /// is logged and retried at the next trigger; it never poisons the engine
    /// (the log and the previous checkpoint are intact).
    pub(crate) fn checkpointer_loop(&self) {
        let interval = self.config.checkpoint_interval;
        let mut last = Instant::now();
        loop {
            {
                let mut core = self.core.lock();
                loop {
                    if core.stop {
                        return;
                    }
                    if core.checkpoint_wanted {
                        break;
                    }
                    match interval {
                        Some(every) => {
                            let since = last.elapsed();
                            if since >= every && core.log_bytes_since_checkpoint > 0 {
                                break;
                            }
                            let wait = every.saturating_sub(since).max(Duration::from_millis(1));
                            self.checkpoint_cv.wait_for(&mut core, wait);
                            if last.elapsed() >= every && core.log_bytes_since_checkpoint == 0 {
                                last = Instant::now();
                            }
                        }
                        None => self.checkpoint_cv.wait(&mut core),
                    }
                }
                core.checkpoint_wanted = false;
            }
            last = Instant::now();
            match self.checkpoint() {
                Ok(report) => {
                    let mut core = self.core.lock();
                    if report.written {
                        core.last_checkpoint_bytes = report.bytes;
                    }
                }
                Err(CheckpointError::Closed | CheckpointError::Poisoned { .. }) => return,
                Err(error) => tracing::warn!(%error, "background checkpoint failed"),
            }
        }
    }
}

/// Encodes the live state. Tasks a consumer holds after a cancel
/// (`Abandoned`) are finished as far as the log is concerned (their CANCEL
/// is logged), so they are left out; `Ready` and `Leased` tasks are in flight.
fn encode(core: &Core, header: &CheckpointHeader) -> CheckpointEncoder {
    let mut enc = CheckpointEncoder::new(header);
    for task in core.tasks.iter() {
        let in_flight = match task.state {
            TaskState::Scheduled => false,
            TaskState::Ready | TaskState::Leased => true,
            TaskState::Abandoned => continue,
        };
        enc.push_task(
            task.id.0,
            task.due_ms,
            task.deliveries,
            in_flight,
            task.key(),
            core.payloads.get(&task.bytes),
        );
    }
    let mut dead: Vec<_> = core.dead.iter().collect();
    dead.sort_unstable_by_key(|(id, _)| **id);
    for (id, t) in dead {
        enc.push_dead(*id, t);
    }
    enc
}

fn create_dir(storage: &dyn Storage, parent: &Path, dir: &Path) -> Result<(), CheckpointError> {
    let io = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { op, path, source }
    };
    if storage.exists(dir).map_err(io("stat", dir))? {
        return Ok(());
    }
    storage
        .create_dir_all(dir)
        .map_err(io("create directory", dir))?;
    storage.sync_dir(parent).map_err(io("fsync dir", parent))
}

/// Removes checkpoint files older than `lsn` (and leftovers), then fsyncs
/// the directory.
fn remove_older(storage: &dyn Storage, dir: &Path, lsn: u64) -> Result<(), CheckpointError> {
    let io = |op, path: PathBuf| move |source| CheckpointError::Io { op, path, source };
    let (files, _) = checkpoint::list(storage, dir).map_err(io("list", dir.to_path_buf()))?;
    let mut removed = false;
    for (old, name) in files {
        if old < lsn {
            let path = dir.join(name);
            storage
                .remove_file(&path)
                .map_err(io("remove", path.clone()))?;
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(dir)
            .map_err(io("fsync dir", dir.to_path_buf()))?;
    }
    Ok(())
}

/// Loads the newest readable checkpoint of the data directory `dir`, after
/// removing leftover temporary files. `Ok(None)` if there is none.
///
/// A newest checkpoint that does not read back (damage after it was synced)
/// is reported unless an older one reads: that one is used, and the log must
/// still hold every record after it (checked during replay).
pub(crate) fn load(storage: &dyn Storage, dir: &Path) -> Result<Option<Loaded>, OpenError> {
    let ckpt_dir = dir.join(CHECKPOINT_DIR_NAME);
    let io = |op, path: PathBuf| move |source| OpenError::Io { op, path, source };
    let (files, tmps) =
        checkpoint::list(storage, &ckpt_dir).map_err(io("list", ckpt_dir.clone()))?;
    for name in &tmps {
        let path = ckpt_dir.join(name);
        tracing::info!(file = %path.display(), "removing leftover temporary checkpoint");
        storage
            .remove_file(&path)
            .map_err(io("remove", path.clone()))?;
    }
    if !tmps.is_empty() {
        storage
            .sync_dir(&ckpt_dir)
            .map_err(io("fsync dir", ckpt_dir.clone()))?;
    }
    let mut newest_error = None;
    for (lsn, name) in files.iter().rev() {
        let path = ckpt_dir.join(name);
        match checkpoint::read(storage, &path) {
            Ok(c) => {
                let Some(header) = c.header else { continue };
                if header.lsn != *lsn {
                    let e = OpenError::CheckpointMismatch {
                        path,
                        reason: format!("its name says LSN {lsn}, its header LSN {}", header.lsn),
                    };
                    newest_error.get_or_insert(e);
                    continue;
                }
                if let Some(e) = &newest_error {
                    tracing::warn!(error = %e, file = %path.display(), "newest checkpoint unreadable; trying an older one");
                }
                let bytes = storage
                    .open(&path, kairos_wal::storage::OpenMode::Read)
                    .and_then(|f| f.len())
                    .unwrap_or(0);
                let replay = Replay::from_checkpoint(header.max_task_id, c.tasks, c.dead, true)
                    .map_err(|e| OpenError::CheckpointMismatch {
                        path: path.clone(),
                        reason: e.0,
                    })?;
                return Ok(Some(Loaded {
                    replay,
                    meta: LoadedMeta {
                        lsn: header.lsn,
                        bytes,
                        store_id: header.store_id,
                        path,
                        newer_damaged: newest_error,
                    },
                }));
            }
            Err(e) => {
                newest_error.get_or_insert(OpenError::Checkpoint(e));
            }
        }
    }
    match newest_error {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// After the log opened: the checkpoint must belong to it, and the log must
/// hold every record after the checkpoint's LSN — `replayed_after` records
/// above it were replayed, and the log's LSNs are dense, so they must be
/// exactly `last_lsn - lsn` (fewer: segments after the checkpoint are gone).
pub(crate) fn check_against_log(
    loaded: &mut LoadedMeta,
    wal: &Wal,
    replayed_after: u64,
) -> Result<(), OpenError> {
    fits_log(loaded, wal, replayed_after).map_err(|e| loaded.newer_damaged.take().unwrap_or(e))
}

fn fits_log(loaded: &LoadedMeta, wal: &Wal, replayed_after: u64) -> Result<(), OpenError> {
    if wal.store_id() != loaded.store_id {
        return Err(OpenError::CheckpointMismatch {
            path: loaded.path.clone(),
            reason: "it belongs to another log (store id differs)".into(),
        });
    }
    if wal.last_lsn().0 < loaded.lsn {
        return Err(OpenError::CheckpointMismatch {
            path: loaded.path.clone(),
            reason: format!(
                "the log ends at LSN {}, before the checkpoint's LSN {}: synced log records are missing",
                wal.last_lsn().0,
                loaded.lsn
            ),
        });
    }
    if wal.last_lsn().0 - loaded.lsn != replayed_after {
        return Err(OpenError::CheckpointMismatch {
            path: loaded.path.clone(),
            reason: format!(
                "the log holds {replayed_after} records after the checkpoint's LSN {} but ends at LSN {}: segments after the checkpoint are missing",
                loaded.lsn,
                wal.last_lsn().0
            ),
        });
    }
    Ok(())
}
