//! Checkpoints: writing the live state as of one LSN (`crate::checkpoint`
//! has the file format), deleting the log segments it covers, the background
//! thread that triggers them by log growth and time, and loading the newest
//! one at open.
//!
//! Protocol (a crash at any step leaves a directory that opens to the same
//! state): first move what leaves memory into a new overflow file
//! (`Shared::relocate`: chosen a range of slots per hold of the core lock,
//! the file written and made durable without the lock, then applied a batch
//! per hold — nothing the log says changes, so a crash here reopens from the
//! older checkpoint and deletes the new file); then, under the core lock,
//! read the log's last LSN `L` and begin snapshots of the slab, the far
//! index and the dead letters — the state in memory is exactly the effect
//! of the records up to `L`, since every change enqueues its record under
//! that lock —; encode the slab's tasks, the far tasks and the dead letters
//! from the snapshots a piece per hold (`TaskSlab::read_snapshot`,
//! `FarIndex::read_snapshot`, `Core::read_dead_snapshot`: what changed
//! since `L` in a part not read yet was saved or noted as it changed), writing it all
//! to `checkpoint/next.ckpt.tmp` a piece at a time between the holds — and,
//! between two holds, moving far tasks scheduled meanwhile out of memory
//! when enough wait (`Config::relocate_far_bytes`), as the background
//! thread would between checkpoints (a move changes where tasks live, not
//! the state at `L`; its file is not named by the checkpoint);
//! fdatasync the log up to `L` (so no LSN up to `L` can be lost
//! and reused after a crash); fdatasync the file, rename it to
//! `checkpoint/{L}.ckpt`, fsync the directory; remove older checkpoint files and overflow
//! files nothing refers to; remove the log segments whose records all lie at
//! or below `L` (`Wal::remove_segments_before`, which writes `TRIM` first).
//! Every hold of the core lock is bounded by a count of tasks (or 1/256 of
//! the far index) ([`CheckpointReport::longest_hold`]); the first one lists
//! the dead letters' ids, O(dead letters).

use super::wall_ms;
use super::{Core, Shared, Status};
use crate::checkpoint::{
    self, CheckpointEncoder, CheckpointHeader, PayloadAt, CHECKPOINT_DIR_NAME,
};
use crate::error::{CheckpointError, OpenError};
use crate::overflow::{self, OverflowWriter};
use crate::replay::Replay;
use crate::task::TaskState;
use crate::task::{PayloadStore, TaskId};
use crate::wheel::Tick;
use kairos_wal::storage::Storage;
use kairos_wal::{Lsn, Wal};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Memory a task takes in the wheel besides its key and payload, as
/// measured (BENCHMARKS.md: 112 bytes per wheel task with a 24-byte key and
/// no payload with a 72-byte slab entry holding those 24 bytes, ~104 since
/// the entry is 64 bytes; a 24-byte wheel node; the index): what each far task waiting to leave the wheel
/// counts toward [`crate::Config::relocate_far_bytes`] with its key and
/// payload.
pub(crate) const WHEEL_TASK_BYTES: u64 = 96;

/// The name a checkpoint is written under (`next.ckpt.tmp`, a leftover
/// temporary file if a crash interrupts it) before it is renamed after its
/// LSN.
const NEXT_CHECKPOINT_NAME: &str = "next.ckpt";

/// Overflow files kept at most (besides those about to be deleted): beyond
/// it, a checkpoint merges the smallest into its new file (up to
/// `MERGED_ENTRIES_MAX` live entries in all, the rest at the next
/// checkpoints). Far tasks leave memory in moves
/// of `relocate_far_bytes` (16 MiB: ~140 k tasks of a 24-byte key and no
/// payload), each its own file: the maximum is about 18 M such tasks before
/// any is merged. A smaller one makes a burst's checkpoints rewrite
/// still-live entries to keep the count down, and producers wait for
/// them: with 64 MiB moves, 8 files had a 20 M-task burst rewrite 13 M
/// entries; with 16 MiB moves, 32 files cost a 20 M-task burst (80 % far)
/// 0.72 → 0.48 M schedules/s (BENCHMARKS.md, session 24).
pub const OVERFLOW_FILES_MAX: usize = 128;

/// What [`crate::Engine::checkpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointReport {
    /// The checkpoint's LSN: it holds the state after every record up to it.
    pub lsn: u64,
    /// False if nothing was logged since the last checkpoint (none written;
    /// the other fields then describe that checkpoint).
    pub written: bool,
    /// Live tasks it holds.
    pub tasks: u64,
    /// Dead letters it holds.
    pub dead_letters: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Log segments deleted because it covers them.
    pub segments_removed: usize,
    /// Payloads moved to its overflow file: out of memory (tasks not due
    /// within `Config::payload_window`, and tasks going far), or out of
    /// overflow files being compacted (far tasks' entries copied forward are
    /// not counted).
    pub payloads_moved: u64,
    /// Overflow files deleted (no live task and no checkpoint refers to them).
    pub overflow_files_removed: usize,
    /// Time spent holding the engine's lock, all holds together (not the
    /// waits to take it):
    /// choosing what leaves memory (a range of slots per hold), pointing
    /// the moved tasks at the new overflow file once it is durable and
    /// taking far tasks out of the wheel (a batch of tasks per hold), and
    /// encoding the state from snapshots (about 65 536 tasks per hold, or a
    /// shard of the far index, 1/256 of it, when that is more).
    pub locked: Duration,
    /// The longest single hold of the engine's lock: the longest a
    /// producer, consumer or the driver waited on this checkpoint.
    pub longest_hold: Duration,
    /// Time the whole checkpoint took.
    pub elapsed: Duration,
}

/// Where an engine with a directory keeps its files.
#[derive(Debug)]
pub(crate) struct Disk {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    /// Overflow files kept open for reads of single entries
    /// ([`Disk::overflow_file`]).
    open_files: parking_lot::Mutex<OpenFiles>,
}

/// At most this many overflow files stay open for reads of single entries
/// (a cancel or reschedule of a far task, a payload read back at receive):
/// those reads then cost one `pread`, not an open, a size query, a `pread`
/// and a close. Few, so that an embedder's descriptors are not used up; the
/// files read most recently stay (far tasks cancelled soon after they were
/// scheduled sit in the newest files).
pub(crate) const OPEN_OVERFLOW_FILES_MAX: usize = 8;

/// The open overflow files, most recently used last, and how many times
/// files were forgotten (removed) so far: a file opened before a removal is
/// not kept afterwards, since it may be the removed one (its descriptor would
/// keep the deleted file's blocks allocated).
#[derive(Debug, Default)]
struct OpenFiles {
    files: Vec<(u32, Arc<overflow::EntryFile>)>,
    removals: u64,
    /// The engine stopped ([`Disk::close_overflow_files`]): nothing more is
    /// kept (the directory may be another engine's next).
    closed: bool,
}

impl Disk {
    pub fn new(storage: Arc<dyn Storage>, dir: PathBuf) -> Disk {
        Disk {
            storage,
            dir,
            open_files: parking_lot::Mutex::new(OpenFiles::default()),
        }
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join(CHECKPOINT_DIR_NAME)
    }

    pub fn overflow_dir(&self) -> PathBuf {
        self.dir.join(overflow::OVERFLOW_DIR_NAME)
    }

    /// Overflow file `file`, open for reading entries: kept open from an
    /// earlier call, or opened now and kept (the least recently used beyond
    /// [`OPEN_OVERFLOW_FILES_MAX`] is closed). Files are written once before
    /// anything refers to them, so a kept descriptor reads what a new one
    /// would. O(`OPEN_OVERFLOW_FILES_MAX`) plus the open.
    ///
    /// # Errors
    /// As [`overflow::EntryFile::open`].
    pub fn overflow_file(
        &self,
        file: u32,
    ) -> Result<Arc<overflow::EntryFile>, overflow::OverflowReadError> {
        let removals = {
            let mut open = self.open_files.lock();
            if let Some(i) = open.files.iter().position(|&(f, _)| f == file) {
                let kept = open.files.remove(i);
                let handle = Arc::clone(&kept.1);
                open.files.push(kept);
                return Ok(handle);
            }
            open.removals
        };
        let path = self.overflow_dir().join(overflow::file_name(file));
        let handle = Arc::new(overflow::EntryFile::open(self.storage.as_ref(), &path)?);
        self.keep_open(file, &handle, removals);
        Ok(handle)
    }

    /// Overflow file `file` if it is kept open now, without making it the
    /// most recently used: the prefetcher reads through it rather than
    /// open the file again, but does not decide which files stay open
    /// (the files that single reads — far cancels — use do). O(kept files).
    pub fn kept_overflow_file(&self, file: u32) -> Option<Arc<overflow::EntryFile>> {
        let open = self.open_files.lock();
        open.files
            .iter()
            .find(|&&(f, _)| f == file)
            .map(|(_, handle)| Arc::clone(handle))
    }

    /// Keeps `handle` of `file`, opened when `removals` files had been
    /// forgotten, unless a removal came since or it is kept already; true if
    /// kept.
    fn keep_open(&self, file: u32, handle: &Arc<overflow::EntryFile>, removals: u64) -> bool {
        let mut open = self.open_files.lock();
        if open.closed || open.removals != removals || open.files.iter().any(|&(f, _)| f == file) {
            return false;
        }
        if open.files.len() >= OPEN_OVERFLOW_FILES_MAX {
            open.files.remove(0);
        }
        open.files.push((file, Arc::clone(handle)));
        true
    }

    /// Closes the kept descriptors of `files`, about to be removed or just
    /// removed (a reader holding one still reads it until it lets go), and
    /// keeps none opened before now. O(kept files).
    fn forget_overflow_files(&self, files: &[u32]) {
        let mut open = self.open_files.lock();
        open.removals += 1;
        open.files.retain(|(f, _)| !files.contains(f));
    }

    /// Closes every kept descriptor and keeps none from now on: the engine
    /// stopped, and a later engine on the directory may delete the files
    /// (a descriptor kept by a handle that outlives the engine — a
    /// `Consumer` — would hold their blocks). O(kept files).
    pub fn close_overflow_files(&self) {
        let mut open = self.open_files.lock();
        open.closed = true;
        open.files.clear();
    }

    /// Overflow files kept open now (tests).
    #[cfg(test)]
    pub(crate) fn overflow_files_open(&self) -> Vec<u32> {
        self.open_files
            .lock()
            .files
            .iter()
            .map(|&(f, _)| f)
            .collect()
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
    /// Overflow files the checkpoint names.
    pub named_files: FileSet,
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
        let mut holds = Holds::default();
        {
            let mut core = holds.lock(self)?;
            let Some(wal) = core.wal.clone() else {
                return Err(CheckpointError::Closed);
            };
            if wal.last_lsn().0 == book.lsn {
                core.log_bytes_since_checkpoint = 0;
                // Nothing logged since: the state is the checkpoint's.
                let held = (
                    (core.tasks.len() + core.far.len()) as u64,
                    core.dead.len() as u64,
                );
                drop(core);
                return self.nothing_new(&book, &wal, held, &holds, started);
            }
        }
        // Overflow files mostly dead are chosen now; their live entries are
        // copied with what leaves memory into new overflow files (one per
        // group of at most VICTIM_ENTRIES_PER_MOVE live entries), written
        // and made durable outside the lock, before the state is encoded.
        let victims = self.read_compaction_victims(disk, &mut holds)?;
        let mut payloads_moved = 0;
        for group in victim_groups(victims) {
            payloads_moved += self.relocate(disk, group, &mut holds)?;
        }
        // The checkpoint is written to `next.ckpt.tmp` as it is encoded,
        // then named after `L` once the log is durable up to it. The state
        // must be the one at `L`: the slab, the far index and the dead
        // letters are encoded from snapshots begun in the hold that reads
        // `L` and read a piece per hold.
        let dir = disk.checkpoint_dir();
        create_dir(disk.storage.as_ref(), &disk.dir, &dir)?;
        let mut out = PieceFile::create(&disk.storage, &dir, NEXT_CHECKPOINT_NAME)?;
        let mut snapshot = Snapshots {
            shared: self,
            begun: false,
        };
        let (mut enc, header, wal, named) = {
            let mut core = holds.lock(self)?;
            let Some(wal) = core.wal.clone() else {
                return Err(CheckpointError::Closed);
            };
            // Above `book.lsn`: it was before the relocation, and LSNs only grow.
            let lsn = wal.last_lsn().0;
            core.log_bytes_since_checkpoint = 0;
            let header = CheckpointHeader {
                store_id: wal.store_id(),
                lsn,
                max_task_id: core.next_id.saturating_sub(1),
                created_ms: disk.storage.now_ms(),
            };
            // The overflow files the state at `L` refers to.
            let named: HashSet<u32> = core.far.files().chain(core.payloads.files()).collect();
            core.tasks.begin_snapshot();
            core.far.begin_snapshot();
            core.begin_dead_snapshot();
            snapshot.begun = true;
            #[cfg(test)]
            if self.hold_hook.lock().is_some() {
                STATE_AT_L.with(|f| *f.borrow_mut() = Some(tests::state_of(&core)));
            }
            (CheckpointEncoder::new(&header), header, wal, named)
        };
        let mut at = 0u64;
        // The tasks in the slab, the far tasks, then the dead letters, as
        // they were at `L`, a piece per hold.
        let (mut far_phase, mut dead_phase) = (false, false);
        // Whether a move may still run between the holds below (not after
        // one failed).
        let mut moves_inline = true;
        loop {
            let move_wanted;
            let done = {
                let mut core = holds.lock(self)?;
                move_wanted = core.relocation_wanted;
                let read = if dead_phase {
                    core.read_dead_snapshot(DEAD_LETTERS_PER_HOLD, |id, t| {
                        enc.push_dead(id, t);
                        enc.buffered() < WRITE_PIECE_BYTES
                    })
                } else if far_phase {
                    let push = |e: &crate::far::FarEntry| {
                        let (file, offset) = crate::far::unpack_loc(e.loc);
                        enc.push_far(&checkpoint::FarTask {
                            id: e.id,
                            key_hash: e.hash,
                            file,
                            offset,
                        });
                    };
                    core.far
                        .read_snapshot(FAR_ENTRIES_PER_HOLD, push)
                        .map(|done| {
                            dead_phase = done;
                            false
                        })
                } else {
                    let c = &mut *core;
                    let payloads = &c.payloads;
                    let read = c.tasks.read_snapshot(SLOTS_PER_ENCODE_HOLD, |t| {
                        push_task(&mut enc, t, payloads);
                        // Keys and payloads copied: a hold also ends at
                        // a piece's worth of bytes.
                        enc.buffered() < WRITE_PIECE_BYTES
                    });
                    // Arena entries of the saved tasks just read.
                    c.payloads.unpin(c.tasks.drain_unpinned());
                    if read == Some(true) {
                        // No saved task names an arena entry any more.
                        c.payloads.end_snapshot();
                        far_phase = true;
                    }
                    read.map(|_| false)
                };
                let Some(done) = read else {
                    // Nothing else begins or drops one: a bug. The file
                    // would lack tasks; stop rather than write it.
                    let cause = "checkpoint: a snapshot of the state ended while it was read";
                    self.poison_locked(&mut core, cause.into());
                    return Err(CheckpointError::Poisoned {
                        cause: cause.into(),
                    });
                };
                if done {
                    snapshot.begun = false;
                }
                done
            };
            // Written without the lock.
            if enc.buffered() >= WRITE_PIECE_BYTES {
                let piece = enc.drain();
                out.write(&piece, at)?;
                at += piece.len() as u64;
            }
            if done {
                break;
            }
            if move_wanted && moves_inline {
                // Far tasks scheduled since the checkpoint began leave
                // memory now, as they would between checkpoints, rather
                // than once it ends: producers held back until they do
                // (`Shared::await_relocation`) are not held for the whole
                // encoding. The move changes the state under the
                // snapshots' feet as a cancel (a task leaves the slab, its
                // saved copy is encoded) and a far insert (skipped by a
                // far shard not read yet) do; the file it writes is not
                // named by this checkpoint, and is deleted after it only
                // once no live task is in it. A move that fails does not
                // fail the checkpoint (which may be what frees the disk):
                // the tasks it did not move stay in memory, and none is
                // tried again before the checkpoint ends.
                match self.relocate(disk, Vec::new(), &mut holds) {
                    Ok(moved) => payloads_moved += moved,
                    Err(error @ (CheckpointError::Closed | CheckpointError::Poisoned { .. })) => {
                        return Err(error)
                    }
                    Err(error) => {
                        tracing::warn!(%error, "moving far tasks out of the wheel during a checkpoint failed");
                        self.core.lock().background_failures += 1;
                        moves_inline = false;
                    }
                }
            }
            #[cfg(test)]
            if let Some(hook) = self.hold_hook.lock().as_mut() {
                hook(self);
            }
        }
        let (tasks, dead_letters) = (enc.tasks() + enc.far_tasks(), enc.dead_letters());
        let rest = enc.finish();
        let bytes = at + rest.len() as u64;
        out.write(&rest, at)?;
        drop(rest);
        // Every record the checkpoint reflects must be durable before the
        // checkpoint exists: otherwise a crash could lose them and let new
        // records reuse their LSNs, which replay would skip as covered.
        if let Err(e) = wal.sync() {
            self.poison(format!("checkpoint: log sync failed: {e}"));
            return Err(e.into());
        }
        out.name(&checkpoint::file_name(header.lsn));
        out.finish()?;
        book.lsn = header.lsn;
        book.bytes = bytes;
        // Durable: the log-growth trigger follows it even if the
        // housekeeping below fails.
        holds.lock(self)?.last_checkpoint_bytes = bytes;
        // Files no live task refers to, and that the new checkpoint does not
        // name, can go.
        let unreferenced = {
            let mut core = holds.lock(self)?;
            let c = &mut *core;
            let gone: Vec<u32> = c
                .overflow_files
                .keys()
                .copied()
                .filter(|&f| {
                    c.payloads.live_in_file(f) + c.far.live_in_file(f) == 0 && !named.contains(&f)
                })
                .collect();
            let mut gone_entries = Vec::with_capacity(gone.len());
            for f in gone {
                gone_entries.push((f, c.overflow_files.remove(&f).unwrap_or(0)));
                // Its far tasks went since the relocation (cancelled,
                // rescheduled, promoted): the promotion must not read it.
                c.far_cursors.remove(&f);
            }
            gone_entries
        };
        // Removing what the new checkpoint made unneeded is housekeeping: the
        // checkpoint is durable. A failure does not keep the log from being
        // trimmed (an older checkpoint file left behind is never read while
        // this one reads back); it is reported once that is done
        // (`CheckpointError::Io`), and the next checkpoint retries.
        let mut housekeeping = remove_older(disk.storage.as_ref(), &dir, header.lsn);
        let files: Vec<u32> = unreferenced.iter().map(|&(f, _)| f).collect();
        let overflow_files_removed = match remove_overflow_files(disk, &files) {
            Ok(removed) => removed,
            Err(error) => {
                housekeeping = housekeeping.and(Err(error));
                // Those still there are known again, for the next checkpoint.
                let ovf_dir = disk.overflow_dir();
                let left: Vec<(u32, u64)> = unreferenced
                    .into_iter()
                    .filter(|&(f, _)| {
                        let path = ovf_dir.join(overflow::file_name(f));
                        disk.storage.exists(&path).unwrap_or(true)
                    })
                    .collect();
                let removed = files.len() - left.len();
                let mut core = holds.lock(self)?;
                for (f, entries) in left {
                    core.overflow_files.entry(f).or_insert(entries);
                }
                removed
            }
        };
        let segments_removed = wal
            .remove_segments_before(Lsn(header.lsn + 1))
            .map_err(CheckpointError::Trim)?;
        housekeeping?;
        if let Some(error) = holds.put_off.take() {
            return Err(error);
        }
        tracing::debug!(
            lsn = header.lsn,
            tasks,
            dead_letters,
            bytes,
            segments_removed,
            payloads_moved,
            overflow_files_removed,
            "checkpoint written"
        );
        Ok(CheckpointReport {
            lsn: header.lsn,
            written: true,
            tasks,
            dead_letters,
            bytes,
            segments_removed,
            payloads_moved,
            overflow_files_removed,
            locked: holds.total,
            longest_hold: holds.longest,
            elapsed: started.elapsed(),
        })
    }

    /// The report of a checkpoint with nothing new to write (no record since
    /// the last one): only the segments it covers are removed. `held`: the
    /// live tasks and dead letters the engine holds, which the last
    /// checkpoint holds too.
    fn nothing_new(
        &self,
        book: &CheckpointBook,
        wal: &Wal,
        (tasks, dead_letters): (u64, u64),
        holds: &Holds,
        started: Instant,
    ) -> Result<CheckpointReport, CheckpointError> {
        let segments_removed = wal
            .remove_segments_before(Lsn(book.lsn + 1))
            .map_err(CheckpointError::Trim)?;
        Ok(CheckpointReport {
            lsn: book.lsn,
            written: false,
            tasks,
            dead_letters,
            bytes: book.bytes,
            segments_removed,
            payloads_moved: 0,
            overflow_files_removed: 0,
            locked: holds.total,
            longest_hold: holds.longest,
            elapsed: started.elapsed(),
        })
    }

    /// Reads the overflow files worth compacting: those whose live entries
    /// are at most half of what they hold, and — so that their number stays
    /// bounded when long-lived tasks keep every file alive — the smallest
    /// ones beyond [`OVERFLOW_FILES_MAX`] (size-tiered, as LSM stores merge
    /// small runs).
    fn read_compaction_victims(
        &self,
        disk: &Disk,
        holds: &mut Holds,
    ) -> Result<Vec<Victim>, CheckpointError> {
        let candidates: Vec<(u32, u64, bool)> = {
            let core = holds.lock(self)?;
            let mut kept: Vec<(u64, u32)> = Vec::new();
            let mut victims = Vec::new();
            for (&f, &written) in &core.overflow_files {
                let live = core.payloads.live_in_file(f) + core.far.live_in_file(f);
                if live == 0 {
                    continue; // deleted after the checkpoint
                }
                if live * 2 <= written {
                    victims.push((f, live, false));
                } else {
                    kept.push((live, f));
                }
            }
            // The checkpoint adds one file: keep at most the maximum.
            if kept.len() >= OVERFLOW_FILES_MAX {
                kept.sort_unstable();
                let excess = kept.len() + 1 - OVERFLOW_FILES_MAX;
                // Merging one file into the new one saves nothing.
                let merge = if excess == 1 { 2 } else { excess };
                // The smallest first, up to MERGED_ENTRIES_MAX live entries
                // in all (but two files at least): the rest of the excess
                // goes at the next checkpoints.
                let mut total = 0u64;
                for (n, &(live, f)) in kept.iter().take(merge).enumerate() {
                    total = total.saturating_add(live);
                    if n >= 2 && total > MERGED_ENTRIES_MAX {
                        break;
                    }
                    victims.push((f, live, true));
                }
            }
            victims
        };
        Ok(candidates
            .into_iter()
            .map(|(file, live, merged)| Victim {
                file,
                live,
                merged,
                path: disk.overflow_dir().join(overflow::file_name(file)),
            })
            .collect())
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

    /// Counts a task just placed in the wheel toward
    /// [`crate::Config::relocate_far_tasks`] if it is due beyond the far span
    /// (a far task in the making; `bytes`: its key and payload), and wakes
    /// the checkpointer once there are enough: as many as the setting, or a
    /// quarter of the far tasks there are already if more, or
    /// [`crate::Config::relocate_far_bytes`] of memory (keys, payloads and
    /// [`WHEEL_TASK_BYTES`] each).
    pub(super) fn count_far_scheduled(&self, core: &mut Core, due_tick: Tick, bytes: usize) {
        // Set only when far tasks move between checkpoints (`relocates`).
        let Some(horizon_ticks) = self.relocation_horizon_ticks else {
            return;
        };
        // Counted from the wheel's tick, which is now but while paused (the
        // wheel stands still then).
        let from = if core.paused {
            core.wheel.elapsed().0.max(self.now_tick().0)
        } else {
            core.wheel.elapsed().0
        };
        if due_tick.0 <= from.saturating_add(horizon_ticks) {
            return;
        }
        core.far_scheduled += 1;
        core.far_scheduled_bytes = core
            .far_scheduled_bytes
            .saturating_add(WHEEL_TASK_BYTES.saturating_add(bytes as u64));
        let count = self.far_backlog_count(core);
        let bytes_max = self.config.relocate_far_bytes;
        if !core.relocation_wanted
            && (core.far_scheduled >= count || core.far_scheduled_bytes >= bytes_max)
        {
            core.relocation_wanted = true;
            self.checkpoint_cv.notify_all();
        }
        if self.far_backlog_full(core) {
            self.far_backlog
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether far tasks in the making fill twice what starts a move
    /// ([`Shared::far_backlog_count`], [`crate::Config::relocate_far_bytes`]):
    /// those scheduled since the last move started, and those it is taking
    /// out of the wheel (in memory until it is applied) — so that at most
    /// about twice that is in memory, not twice that on top of a move.
    fn far_backlog_full(&self, core: &Core) -> bool {
        let (moving, moving_bytes) = core.moving;
        core.far_scheduled.saturating_add(moving) >= self.far_backlog_count(core).saturating_mul(2)
            || core.far_scheduled_bytes.saturating_add(moving_bytes)
                >= self.config.relocate_far_bytes.saturating_mul(2)
    }

    /// Far tasks scheduled since the last move that start the next one:
    /// [`crate::Config::relocate_far_tasks`], or a quarter of the far tasks
    /// if more (`u64::MAX` when not set).
    fn far_backlog_count(&self, core: &Core) -> u64 {
        let every = self.config.relocate_far_tasks.unwrap_or(u64::MAX);
        every.max(core.far.len() as u64 / 4)
    }

    /// Holds a producer back while far tasks arrive faster than they are
    /// taken out of the wheel: while a move out of memory is under way or
    /// asked for, and far tasks in the making fill twice what starts one
    /// ([`crate::Config::relocate_far_tasks`], a quarter of the far tasks,
    /// [`crate::Config::relocate_far_bytes`]) — those scheduled beyond the
    /// far span since the last one started, with those the move under way
    /// takes out ([`Shared::far_backlog_full`]) — a schedule waits until a
    /// move starts (taking those scheduled) or ends — as LSM stores stall
    /// writes when compaction falls behind. Without it, a producer faster than the
    /// move keeps millions of far tasks whole in memory, and a checkpoint
    /// encodes them with their payloads. Not held back: an engine that does
    /// not move far tasks between checkpoints, one closing or poisoned,
    /// after a move failed (until one succeeds), or once the checkpointer
    /// thread has ended. Schedules, upserting reschedules and dead-letter
    /// requeues wait here; cancels, acks and receives never do.
    #[inline]
    pub(super) fn await_relocation(&self) {
        if self.far_backlog.load(std::sync::atomic::Ordering::Relaxed) {
            self.await_relocation_slow();
        }
    }

    /// [`Shared::await_relocation`] once the backlog flag is up.
    #[cold]
    fn await_relocation_slow(&self) {
        let mut core = self.core.lock();
        loop {
            let behind = self.far_backlog_full(&core);
            if !behind
                || !(core.relocating || core.relocation_wanted)
                || core.relocation_failed
                || core.checkpointer_gone
                || core.stop
                || core.status != Status::Open
            {
                return;
            }
            // Woken when the move starts or ends; the timeout only re-checks.
            self.relocation_cv
                .wait_for(&mut core, Duration::from_millis(100));
        }
    }

    /// Takes far tasks (and payloads due after the payload window) out of
    /// memory now, without a checkpoint, if a move is still wanted
    /// (`Core::relocation_wanted`: a checkpoint that ran meanwhile may have
    /// made it): [`Shared::relocate`] with no file to compact. Returns the
    /// payloads moved.
    pub(crate) fn relocate_now(&self) -> Result<u64, CheckpointError> {
        let Some(disk) = &self.disk else {
            return Err(CheckpointError::InMemory);
        };
        let _book = self.checkpointing.lock();
        // A checkpoint that held `checkpointing` meanwhile may have made the
        // move this was asked for.
        if !self.core.lock().relocation_wanted {
            return Ok(0);
        }
        self.relocate(disk, Vec::new(), &mut Holds::default())
    }

    /// The background checkpointer: waits for the log-growth trigger or the
    /// interval (measured in real time, whatever the engine's clock), takes a
    /// checkpoint, and repeats until the engine stops; between checkpoints it
    /// also takes far tasks out of the wheel when
    /// [`Shared::count_far_scheduled`] asks. A failed checkpoint or move is
    /// logged and retried at the next trigger; it never poisons the engine
    /// (the log and the previous checkpoint are intact).
    pub(crate) fn checkpointer_loop(&self) {
        let _gone = CheckpointerGone(self);
        let interval = self.config.checkpoint_interval;
        let mut last = Instant::now();
        loop {
            {
                let mut core = self.core.lock();
                loop {
                    if core.stop {
                        return;
                    }
                    if core.checkpoint_wanted || core.relocation_wanted {
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
                if !core.checkpoint_wanted && core.relocation_wanted {
                    drop(core);
                    match self.relocate_now() {
                        Ok(_) => {}
                        Err(CheckpointError::Closed | CheckpointError::Poisoned { .. }) => return,
                        Err(error) => {
                            tracing::warn!(%error, "moving far tasks out of the wheel failed");
                            self.core.lock().background_failures += 1;
                        }
                    }
                    continue;
                }
                core.checkpoint_wanted = false;
            }
            last = Instant::now();
            // A checkpoint written records its size itself (the log-growth
            // trigger), whatever its housekeeping's outcome.
            match self.checkpoint() {
                Ok(_) => {}
                Err(CheckpointError::Closed | CheckpointError::Poisoned { .. }) => return,
                Err(error) => {
                    tracing::warn!(%error, "background checkpoint failed");
                    self.core.lock().background_failures += 1;
                }
            }
        }
    }
}

/// Whether `config` takes far tasks out of the wheel between checkpoints
/// ([`crate::Config::relocate_far_tasks`]): it needs a horizon and a payload
/// window (far tasks exist only with both).
pub(super) fn relocates(config: &crate::Config) -> bool {
    config.relocate_far_tasks.is_some()
        && config.far_span().is_some()
        && config.payload_window.is_some()
}

/// Slab slots a checkpoint examines per hold of the engine's lock while it
/// chooses what leaves memory, and moves it applies per hold once the new
/// file is durable: each hold is bounded by a count of tasks (and a hold
/// choosing from memory also by [`WRITE_PIECE_BYTES`] of keys and payloads
/// copied), so producers, consumers and the driver are not stalled for long.
const SLOTS_PER_HOLD: u32 = 32_768;
/// See [`SLOTS_PER_HOLD`].
const MOVES_PER_HOLD: usize = 16_384;

/// The engine's lock taken by a checkpoint: how long it was held is added
/// to the checkpoint's [`Holds`] when it is released.
struct Hold<'a> {
    core: parking_lot::MutexGuard<'a, Core>,
    holds: &'a mut Holds,
    since: Instant,
}

impl std::ops::Deref for Hold<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl std::ops::DerefMut for Hold<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let held = self.since.elapsed();
        self.core.checkpoint_hold_max = self.core.checkpoint_hold_max.max(held);
        self.holds.total += held;
        self.holds.longest = self.holds.longest.max(held);
    }
}

impl Hold<'_> {
    /// Whether this stretch of the hold has lasted [`CHECKPOINT_HOLD_MAX`]
    /// (asked every [`CHECKPOINT_HOLD_CHECK_ENTRIES`] tasks).
    fn held_long(&self) -> bool {
        self.since.elapsed() >= CHECKPOINT_HOLD_MAX
    }

    /// Yields the engine's lock to a thread waiting for it (a fair
    /// hand-off: parking_lot's `MutexGuard::bump`), then holds it again;
    /// the next stretch counts from here. The caller must leave the core
    /// consistent first, as for any end of a hold.
    ///
    /// # Errors
    /// As [`Holds::lock`]: the engine was closed or poisoned meanwhile.
    fn bump(&mut self, shared: &Shared) -> Result<(), CheckpointError> {
        let held = self.since.elapsed();
        self.core.checkpoint_hold_max = self.core.checkpoint_hold_max.max(held);
        self.holds.total += held;
        self.holds.longest = self.holds.longest.max(held);
        #[cfg(test)]
        if let Some(hook) = shared.checkpoint_yield_hook.lock().as_mut() {
            parking_lot::MutexGuard::unlocked(&mut self.core, || hook(shared));
        }
        #[cfg(not(test))]
        let _ = shared;
        parking_lot::MutexGuard::bump(&mut self.core);
        self.since = Instant::now();
        match &self.core.status {
            Status::Open => Ok(()),
            Status::Closed => Err(CheckpointError::Closed),
            Status::Poisoned(cause) => Err(CheckpointError::Poisoned {
                cause: cause.clone(),
            }),
        }
    }
}

/// How long a checkpoint holds the engine's lock at most while it copies
/// tasks' keys and payloads into a new overflow file or points tasks at
/// one (each costs ~0.5-1 us, mostly cache misses, so a piece of 16 384
/// held it 8-14 ms): it then yields the lock to a waiting thread (the
/// driver, a producer, a consumer) and goes on. (Zero in unit tests: the
/// lock is yielded at every check.)
const CHECKPOINT_HOLD_MAX: Duration = if cfg!(test) {
    Duration::ZERO
} else {
    Duration::from_millis(1)
};

/// Tasks between two looks at the clock for [`CHECKPOINT_HOLD_MAX`]. (1 in
/// unit tests.)
const CHECKPOINT_HOLD_CHECK_ENTRIES: usize = if cfg!(test) { 1 } else { 256 };

/// The time a checkpoint spent holding the engine's lock, and a failure it
/// went on past.
#[derive(Default)]
struct Holds {
    total: Duration,
    longest: Duration,
    /// An overflow file chosen for compaction that could not be read (I/O
    /// error): left as it is, and the error reported once the checkpoint is
    /// written and the log trimmed (the first such error).
    put_off: Option<CheckpointError>,
}

impl Holds {
    /// Takes the engine's lock (the hold counts from when it is taken, not
    /// while waiting for it); refused while the engine is closed or
    /// poisoned.
    fn lock<'a>(&'a mut self, shared: &'a Shared) -> Result<Hold<'a>, CheckpointError> {
        let core = shared.core.lock();
        let hold = Hold {
            core,
            holds: self,
            since: Instant::now(),
        };
        match &hold.core.status {
            Status::Open => Ok(hold),
            Status::Closed => Err(CheckpointError::Closed),
            Status::Poisoned(cause) => Err(CheckpointError::Poisoned {
                cause: cause.clone(),
            }),
        }
    }
}

/// A task's key and payload in memory chosen for the new overflow file.
/// Nothing of the key or payload is kept: they are copied from the task
/// under the lock when the file is written (if it still waits with them).
/// When the move is applied, the task still holds them unless a reschedule
/// replaced a payload meanwhile; only then, or when the file also holds
/// compaction victims' entries, are they read back from the new file.
struct Move {
    due_ms: u64,
    id: u64,
    /// Its key's [`crate::far::KeyHasher`] hash, when it goes far (computed
    /// as the key is copied into the file).
    hash: u64,
    /// Its offset in the new file, once written ([`NOT_WRITTEN`]: not
    /// written; see [`Move::written`]).
    offset: u64,
    /// The task's slab slot.
    slot: u32,
    /// Key and payload bytes when chosen: only sizes the pieces the file is
    /// written in.
    len: u32,
    /// The task leaves the wheel as a far task (a first attempt due beyond
    /// the far span when chosen).
    far: bool,
}

/// [`Move::offset`] of an entry not written (no entry of an overflow file
/// starts there: files are far smaller than 2^64 bytes).
const NOT_WRITTEN: u64 = u64::MAX;

const _: () = assert!(std::mem::size_of::<Move>() <= 48);

impl Move {
    /// Its offset in the new file, if written.
    fn written(&self) -> Option<u64> {
        (self.offset != NOT_WRITTEN).then_some(self.offset)
    }
}

/// A live entry of a compaction victim chosen to be copied forward: a far
/// task's entry, or a wheel task's payload. Held by the million while a
/// checkpoint merges files (see [`MERGED_ENTRIES_MAX`]), so it is 24 bytes:
/// where the entry comes from, and its (due, id) order. Whose it is and
/// what becomes of it is found again when it is applied, from the entry
/// read back (its key) and where it came from.
#[derive(Clone, Copy)]
struct VictimMove {
    due_ms: u64,
    id: u64,
    /// Bit 63: written to the new file; bits 48..63: the victim's index;
    /// bits 0..48: the entry's offset in it.
    src: u64,
}

const _: () = assert!(std::mem::size_of::<VictimMove>() == 24);

/// Bits of [`VictimMove::src`] holding the offset.
const SRC_OFFSET_BITS: u32 = 48;
/// [`VictimMove::src`]'s written flag.
const SRC_WRITTEN: u64 = 1 << 63;

impl VictimMove {
    /// `None` if the victim's index or the offset does not fit (the entry
    /// then stays where it is, and its file with it).
    fn new(due_ms: u64, id: u64, v: u32, offset: u64) -> Option<VictimMove> {
        (v < (1 << (63 - SRC_OFFSET_BITS)) && offset < (1 << SRC_OFFSET_BITS)).then_some(
            VictimMove {
                due_ms,
                id,
                src: (u64::from(v) << SRC_OFFSET_BITS) | offset,
            },
        )
    }

    /// The victim's index.
    fn victim(&self) -> usize {
        ((self.src & !SRC_WRITTEN) >> SRC_OFFSET_BITS) as usize
    }

    /// The entry's offset in the victim.
    fn src_offset(&self) -> u64 {
        self.src & ((1 << SRC_OFFSET_BITS) - 1)
    }

    fn written(&self) -> bool {
        self.src & SRC_WRITTEN != 0
    }

    fn mark_written(&mut self) {
        self.src |= SRC_WRITTEN;
    }
}

/// An entry of the new overflow file in the making: `moves[i]` or
/// `victim_moves[i]`.
#[derive(Clone, Copy)]
enum Source {
    Memory(usize),
    Victim(usize),
}

/// Walks [`Move`]s and [`VictimMove`]s, each sorted by (due, id), together
/// in (due, id) order: the new file's order.
#[derive(Default)]
struct MergeCursor {
    memory: usize,
    victims: usize,
}

impl MergeCursor {
    fn next(&mut self, moves: &[Move], victim_moves: &[VictimMove]) -> Option<Source> {
        let memory = moves.get(self.memory).map(|m| (m.due_ms, m.id));
        let victim = victim_moves.get(self.victims).map(|m| (m.due_ms, m.id));
        match (memory, victim) {
            (Some(a), Some(b)) if b < a => {
                self.victims += 1;
                Some(Source::Victim(self.victims - 1))
            }
            (Some(_), _) => {
                self.memory += 1;
                Some(Source::Memory(self.memory - 1))
            }
            (None, Some(_)) => {
                self.victims += 1;
                Some(Source::Victim(self.victims - 1))
            }
            (None, None) => None,
        }
    }
}

/// (due, id) of a source.
fn order_of(source: Source, moves: &[Move], victim_moves: &[VictimMove]) -> (u64, u64) {
    match source {
        Source::Memory(i) => (moves[i].due_ms, moves[i].id),
        Source::Victim(j) => (victim_moves[j].due_ms, victim_moves[j].id),
    }
}

/// An overflow file being compacted, as [`Shared::read_compaction_victims`]
/// found it (header checked).
struct Victim {
    file: u32,
    /// Its live entries when chosen.
    live: u64,
    /// Chosen to bring the number of files down ([`OVERFLOW_FILES_MAX`]),
    /// not for its dead entries: the files so chosen must all go into one
    /// new file, or merging them saves nothing.
    merged: bool,
    path: PathBuf,
}

/// Live entries of compaction victims one move copies at most (besides
/// what leaves memory): a checkpoint compacting more splits them into
/// several moves, each writing its own file, so the [`VictimMove`]s (24
/// bytes each) held at once stay within about 24 MiB. Not split: a single larger
/// victim, and the files merged to bring their number down (each move out
/// of memory writes a file of ~140 k tasks of a 24-byte key and no
/// payload at the default `relocate_far_bytes`: eight of them exceed this).
const VICTIM_ENTRIES_PER_MOVE: u64 = 1 << 20;

/// Live entries of the files one checkpoint merges to bring their number
/// down, at most (unless the two smallest hold more): they go into one new
/// file, so their [`VictimMove`]s are held at once — 4 Mi of them, 96 MiB
/// (they were 64-byte [`Move`]s, 256 MiB, which RSS of a 20 M-task burst
/// showed as steps of ~270 MB for seconds at a time). A larger excess of
/// files is merged over the next checkpoints. (Without the limit, RSS of a
/// 100 M-task run rose by up to ~1.1 GB for tens of seconds at a time.)
const MERGED_ENTRIES_MAX: u64 = 4 * VICTIM_ENTRIES_PER_MOVE;

/// `victims` in groups of at most [`VICTIM_ENTRIES_PER_MOVE`] live entries
/// (a larger victim alone in its group), the merged ones
/// ([`Victim::merged`]) all in the first group whatever their size; at
/// least one group, maybe empty.
fn victim_groups(victims: Vec<Victim>) -> Vec<Vec<Victim>> {
    let (merged, victims): (Vec<Victim>, Vec<Victim>) = victims.into_iter().partition(|v| v.merged);
    let mut live = merged.iter().fold(0u64, |n, v| n.saturating_add(v.live));
    let mut groups: Vec<Vec<Victim>> = vec![merged];
    for v in victims {
        let last_empty = groups.last().is_some_and(|g| g.is_empty());
        if !last_empty && live.saturating_add(v.live) > VICTIM_ENTRIES_PER_MOVE {
            groups.push(Vec::new());
            live = 0;
        }
        live = live.saturating_add(v.live);
        if let Some(g) = groups.last_mut() {
            g.push(v);
        }
    }
    groups
}

/// Bytes of a new overflow file built before they are written (the file is
/// written in pieces of about this size as it is built), and of the pieces
/// files are read in while they are compacted or read back.
const WRITE_PIECE_BYTES: usize = 8 << 20;

/// The smallest piece a victim is read in while a new file is written
/// (each of a move's victims is read in a share of [`WRITE_PIECE_BYTES`],
/// but at least this).
const READER_PIECE_MIN_BYTES: usize = 256 << 10;

/// Keys and payloads copied out of files for one hold of the lock: entries
/// `spans[i]` of `bytes`, `(start, key length, payload length)`.
#[derive(Default)]
struct Piece {
    bytes: Vec<u8>,
    spans: Vec<Option<(usize, usize, usize)>>,
}

impl Piece {
    fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    fn push(&mut self, key: &[u8], payload: &[u8]) {
        self.spans
            .push(Some((self.bytes.len(), key.len(), payload.len())));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(payload);
    }

    fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let (at, k, p) = (*self.spans.get(i)?)?;
        Some((&self.bytes[at..at + k], &self.bytes[at + k..at + k + p]))
    }
}

/// A file written in pieces at given offsets, then made durable and given
/// its name: `NAME.tmp`, fdatasync, rename, directory fsync (a crash before
/// the rename leaves only the tmp file, which the next open removes). One
/// dropped before its rename — a failed write, sync or rename, or an error
/// of its caller's in between — removes its tmp file (best effort): nothing
/// refers to it, and a process whose checkpoints or moves keep failing (a
/// full disk) would otherwise pile up one per attempt until it reopens,
/// overflow files taking a new number each time.
struct PieceFile {
    storage: Arc<dyn Storage>,
    /// `None` once closed by [`PieceFile::finish`].
    file: Option<Box<dyn kairos_wal::storage::StorageFile>>,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    /// The tmp file may still be on disk under its tmp name (not renamed).
    tmp_left: bool,
}

impl PieceFile {
    fn create(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        name: &str,
    ) -> Result<PieceFile, CheckpointError> {
        let tmp = dir.join(format!("{name}{}", checkpoint::TMP_SUFFIX));
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { op, path, source }
        };
        match storage.remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &tmp)(e)),
        }
        let file = storage
            .open(&tmp, kairos_wal::storage::OpenMode::CreateNew)
            .map_err(io("create", &tmp))?;
        Ok(PieceFile {
            storage: Arc::clone(storage),
            file: Some(file),
            path: dir.join(name),
            dir: dir.to_path_buf(),
            tmp,
            tmp_left: true,
        })
    }

    fn write(&mut self, bytes: &[u8], at: u64) -> Result<(), CheckpointError> {
        let closed = || std::io::Error::other("the file was closed already");
        self.file
            .as_ref()
            .ok_or_else(closed)
            .and_then(|file| file.write_all_at(bytes, at))
            .map_err(|source| CheckpointError::Io {
                op: "write",
                path: self.tmp.clone(),
                source,
            })
    }

    /// Names the file `name` (in the same directory) when it is finished,
    /// instead of the name it was created with.
    fn name(&mut self, name: &str) {
        self.path = self.dir.join(name);
    }

    /// Syncs, renames and fsyncs the directory. After a failure of the
    /// last, the file is under its name (not durably): what refers to it
    /// is the caller's to settle.
    fn finish(mut self) -> Result<(), CheckpointError> {
        let err = |op, path: PathBuf| move |source| CheckpointError::Io { op, path, source };
        if let Some(file) = self.file.take() {
            file.sync_data()
                .map_err(err("fdatasync", self.tmp.clone()))?;
        }
        self.storage
            .rename(&self.tmp, &self.path)
            .map_err(err("rename", self.tmp.clone()))?;
        self.tmp_left = false;
        self.storage
            .sync_dir(&self.dir)
            .map_err(err("fsync dir", self.dir.clone()))
    }
}

impl Drop for PieceFile {
    fn drop(&mut self) {
        if !self.tmp_left {
            return;
        }
        drop(self.file.take());
        match self.storage.remove_file(&self.tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // The next open removes it.
            Err(e) => {
                tracing::warn!(file = %self.tmp.display(), error = %e, "cannot remove an unfinished file")
            }
        }
    }
}

/// Ends a move out of memory for the producers waiting on it
/// ([`Shared::await_relocation`]) however it ends — even by a panic: no
/// longer under way, failed unless `ok`.
struct MoveDone<'a> {
    shared: &'a Shared,
    ok: bool,
}

impl Drop for MoveDone<'_> {
    fn drop(&mut self) {
        {
            let mut core = self.shared.core.lock();
            core.relocating = false;
            core.moving = (0, 0);
            core.relocation_failed = !self.ok;
            // What it took out no longer counts.
            self.shared.far_backlog.store(
                self.shared.far_backlog_full(&core),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        self.shared.relocation_cv.notify_all();
    }
}

/// Marks the checkpointer gone when its loop ends, however it ends (a
/// panic included), so producers are no longer held back waiting for it.
struct CheckpointerGone<'a>(&'a Shared);

impl Drop for CheckpointerGone<'_> {
    fn drop(&mut self) {
        self.0.core.lock().checkpointer_gone = true;
        self.0.relocation_cv.notify_all();
    }
}

/// The earliest far task each overflow file gained: its due time (UTC ms)
/// and its entry's offset (entries are in (due, id) order, so no far task
/// of the file sits before it).
type Earliest = std::collections::BTreeMap<u32, (u64, u64)>;

impl Shared {
    /// Moves what a checkpoint takes out of memory, and compacts the victim
    /// files, before the state is encoded. What moves: payloads in memory
    /// of waiting tasks due after the payload window, waiting first
    /// attempts due beyond the far span (far tasks: key and payload leave
    /// memory, and the task the slab, the index and the wheel), and the
    /// live entries of `victims`. Chosen one lock hold at a time (a range
    /// of slots, or a piece of a victim file, per hold), copied into one
    /// new overflow file a piece at a time — keys and payloads in memory
    /// under the lock, victims' entries read without it — and made durable,
    /// then applied one hold at a time from what the file holds, read back:
    /// each move only if the task still holds what was written. A far task
    /// whose entry is already in a file (with its due time) becomes far in
    /// place, as it is seen. "Beyond the far span" is now + far span as the
    /// clock reads at each hold (choosing) and again at each apply: a far
    /// task promoted into the wheel meanwhile stays there.
    ///
    /// Memory: a [`Move`] (48 bytes) per task chosen in memory, a
    /// [`VictimMove`] (24 bytes) per victim's entry, and pieces of about
    /// [`WRITE_PIECE_BYTES`]; no key or payload is held beyond its piece,
    /// and no file is read whole.
    ///
    /// Nothing here changes what the log says, so no record needs to be
    /// durable first: a crash at any point reopens from the last checkpoint
    /// and the log, and the new file, named by no checkpoint yet, is
    /// deleted at open. Returns the payloads moved (far tasks' entries
    /// copied forward not counted). Every move scans the slab, a
    /// checkpoint's later groups of victims included: a move resets the
    /// count producers are held back by ([`Shared::await_relocation`]), so
    /// one that took nothing out of memory would let them run ahead for as
    /// long as the checkpoint lasts (a 20 M-task run had 4 M far tasks
    /// waiting whole in the wheel after seven such groups).
    fn relocate(
        &self,
        disk: &Disk,
        victims: Vec<Victim>,
        holds: &mut Holds,
    ) -> Result<u64, CheckpointError> {
        let mut done = MoveDone {
            shared: self,
            ok: false,
        };
        let result = self.relocate_inner(disk, victims, holds);
        done.ok = result.is_ok();
        result
    }

    /// [`Shared::relocate`] but for the flags producers wait on.
    fn relocate_inner(
        &self,
        disk: &Disk,
        victims: Vec<Victim>,
        holds: &mut Holds,
    ) -> Result<u64, CheckpointError> {
        let now = wall_ms(self.now());
        let window_end = self
            .config
            .payload_window
            .map(|w| now.saturating_add(w.as_millis() as u64));
        // Tasks go far only with a far span and a payload window.
        let far_span_ms = match (self.config.far_span(), window_end) {
            (Some(h), Some(_)) => Some(h.as_millis() as u64),
            _ => None,
        };
        let mut moves: Vec<Move> = Vec::new();
        let hasher = {
            let mut core = holds.lock(self)?;
            // Every far task scheduled so far is seen by the scan below.
            core.moving = (core.far_scheduled, core.far_scheduled_bytes);
            core.far_scheduled = 0;
            core.far_scheduled_bytes = 0;
            core.relocation_wanted = false;
            core.relocating = true;
            // Full only if what it takes out is twice the setting already.
            self.far_backlog.store(
                self.far_backlog_full(&core),
                std::sync::atomic::Ordering::Relaxed,
            );
            self.relocation_cv.notify_all();
            core.hasher.clone()
        };
        // The victims' live entries, a piece of each file per hold — first,
        // so that a damaged victim, left alone, is no victim below.
        let mut victim_files: HashSet<u32> = HashSet::new();
        let mut victim_moves: Vec<VictimMove> = Vec::new();
        for (v, victim) in victims.iter().enumerate() {
            let before = victim_moves.len();
            if let Err(error) =
                self.choose_from_victim(disk, victim, v as u32, &hasher, &mut victim_moves, holds)
            {
                match error {
                    CheckpointError::Overflow(overflow::OverflowReadError::Corrupt { .. }) => {
                        // A damaged file is not compacted: its live entries
                        // are checked one by one when read (and a dead
                        // damaged entry must not block every later
                        // checkpoint).
                        tracing::warn!(%error, "damaged overflow file not compacted");
                        victim_moves.truncate(before);
                        continue;
                    }
                    CheckpointError::Overflow(overflow::OverflowReadError::Io { .. }) => {
                        // Nor one that cannot be read (a bad sector among its
                        // dead entries must not keep every later checkpoint
                        // from trimming the log): the checkpoint goes on and
                        // reports the error at its end.
                        tracing::warn!(%error, "unreadable overflow file not compacted");
                        victim_moves.truncate(before);
                        holds.put_off.get_or_insert(error);
                        continue;
                    }
                    error => return Err(error),
                }
            }
            victim_files.insert(victim.file);
        }
        // What goes far is due after now + far span, read at each hold (under
        // the lock): a far task promoted since the move began is within it,
        // and stays in the wheel.
        let far_after_now = || {
            let now = self.now();
            FarCut {
                after_ms: far_span_ms.map(|span| wall_ms(now).saturating_add(span)),
                now_tick: self.tick_of(now),
            }
        };
        // Memory: the slab, a range of slots per hold.
        if let Some(window_end) = window_end {
            let mut from = 0u32;
            loop {
                let mut core = holds.lock(self)?;
                let far_after = far_after_now();
                let end = from
                    .saturating_add(SLOTS_PER_HOLD)
                    .min(core.tasks.slots_len());
                let mut earliest = Earliest::new();
                for slot in from..end {
                    let Some(task) = core.tasks.get(slot) else {
                        continue;
                    };
                    if task.state != TaskState::Scheduled || task.due_ms <= window_end {
                        continue;
                    }
                    // Beyond the far span, a first attempt leaves the wheel:
                    // its key goes to disk with its payload, even an empty one.
                    // Only a task waiting for a tick ahead moves (asked only of
                    // those that would: it reads the task's wheel entry).
                    let far = far_after.beyond(task);
                    match core.payloads.get(&task.bytes) {
                        Some(payload)
                            if (far || !payload.is_empty())
                                && far_after.waits_ahead(&core, task) =>
                        {
                            let len = core
                                .payloads
                                .key(&task.bytes)
                                .len()
                                .saturating_add(payload.len());
                            moves.push(Move {
                                due_ms: task.due_ms,
                                id: task.id.0,
                                hash: 0,
                                offset: NOT_WRITTEN,
                                slot,
                                len: u32::try_from(len).unwrap_or(u32::MAX),
                                far,
                            });
                        }
                        Some(_) => {}
                        None => {
                            // On disk already: far where it is, if its entry
                            // says when it is due (in a victim file, it is
                            // copied forward with the file, below).
                            let Some((file, offset)) = task.bytes.on_disk_current() else {
                                continue;
                            };
                            let loc = crate::far::pack_loc(file, offset);
                            if let (true, false, Some(loc)) =
                                (far, victim_files.contains(&file), loc)
                            {
                                if !far_after.waits_ahead(&core, task) {
                                    continue;
                                }
                                let (id, due_ms) = (task.id.0, task.due_ms);
                                let hash = hasher.hash(core.payloads.key(&task.bytes));
                                // Not taken in (`FarIndex::can_hold`): it
                                // stays in the wheel, its payload on disk.
                                let entry = crate::far::FarEntry { hash, loc, id };
                                if core.far.insert(entry).is_ok() {
                                    self.forget_task(&mut core, slot);
                                    note_earliest(&mut earliest, file, due_ms, offset);
                                }
                            }
                        }
                    }
                }
                reset_far_cursors(&mut core, earliest);
                if end >= core.tasks.slots_len() {
                    break;
                }
                from = end;
            }
        }
        if moves.is_empty() && victim_moves.is_empty() {
            return Ok(0);
        }
        // The new file, in (due, id) order.
        let file = {
            let mut core = holds.lock(self)?;
            let file = core.next_overflow_file;
            let Some(next) = file.checked_add(1) else {
                return Ok(0);
            };
            core.next_overflow_file = next;
            file
        };
        moves.sort_unstable_by_key(|m| (m.due_ms, m.id));
        victim_moves.sort_unstable_by_key(|m| (m.due_ms, m.id));
        let store_id = holds.lock(self)?.wal.as_ref().map(|w| w.store_id());
        let Some(store_id) = store_id else {
            return Err(CheckpointError::Closed);
        };
        let dir = disk.overflow_dir();
        create_dir(disk.storage.as_ref(), &disk.dir, &dir)?;
        let name = overflow::file_name(file);
        // Never over a file still there: a checkpoint or tasks may name it.
        let path = dir.join(&name);
        let exists = disk.storage.exists(&path);
        if !matches!(exists, Ok(false)) {
            return Err(CheckpointError::Io {
                op: "create",
                path,
                source: exists.err().unwrap_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "an overflow file with this number is still on disk",
                    )
                }),
            });
        }
        let mut out = PieceFile::create(&disk.storage, &dir, &name)?;
        let mut writer = OverflowWriter::new(&store_id, file);
        // Each victim is read in increasing offsets (its file is in (due,
        // id) order too), in pieces that together stay near one piece.
        let reader_bytes = (WRITE_PIECE_BYTES / victims.len().max(1)).max(READER_PIECE_MIN_BYTES);
        let mut readers: Vec<Option<overflow::PieceReader>> =
            victims.iter().map(|_| None).collect();
        let mut piece = Piece::default();
        let mut order: Vec<Source> = Vec::new();
        let mut last = None;
        let mut cursor = MergeCursor::default();
        // Read before the first piece is copied: a payload replaced after
        // this changes it (see `apply_written_moves`).
        let replacements = self
            .payload_replacements
            .load(std::sync::atomic::Ordering::Relaxed);
        loop {
            // Victims' entries of this piece, read without the lock.
            piece.clear();
            order.clear();
            let mut bytes = 0usize;
            let mut from_memory = false;
            while order.len() < MOVES_PER_HOLD && bytes < WRITE_PIECE_BYTES {
                let Some(source) = cursor.next(&moves, &victim_moves) else {
                    break;
                };
                order.push(source);
                match source {
                    Source::Memory(i) => {
                        from_memory = true;
                        bytes = bytes.saturating_add(moves[i].len as usize);
                        piece.spans.push(None);
                    }
                    Source::Victim(j) => {
                        let vm = &victim_moves[j];
                        let reader = match &mut readers[vm.victim()] {
                            Some(r) => r,
                            slot => slot.insert(overflow::PieceReader::open(
                                disk.storage.as_ref(),
                                &victims[vm.victim()].path,
                                reader_bytes,
                            )?),
                        };
                        let (entry, _) = reader.entry_at(vm.src_offset())?;
                        bytes = bytes
                            .saturating_add(entry.key.len())
                            .saturating_add(entry.payload.len());
                        piece.push(entry.key, entry.payload);
                    }
                }
            }
            if order.is_empty() {
                break;
            }
            let mut core = if from_memory {
                Some(holds.lock(self)?)
            } else {
                None
            };
            for (i, &source) in order.iter().enumerate() {
                if let Some(core) = &mut core {
                    // Nothing to settle before yielding: each task is looked
                    // up afresh, and the move is applied later only if the
                    // task still holds what was copied (as between pieces).
                    if i > 0 && i.is_multiple_of(CHECKPOINT_HOLD_CHECK_ENTRIES) && core.held_long()
                    {
                        core.bump(self)?;
                    }
                    prefetch_ahead(core, &order, &moves, i);
                }
                // The writer needs strictly increasing (due, id). A task can
                // be chosen twice: a far task rescheduled with a new payload
                // at the same due time, while the victim holding its old
                // entry was read, is both in memory and in a victim. The
                // merge gives the memory one first; that one is written (if
                // the task still waits with it), the stale entry skipped.
                let (due_ms, id) = order_of(source, &moves, &victim_moves);
                if last == Some((due_ms, id)) {
                    continue;
                }
                let (key, payload) = match (piece.get(i), &core, source) {
                    (Some(kp), _, _) => kp,
                    (None, Some(core), Source::Memory(i)) => {
                        // Copied only if the task still waits with its
                        // payload in memory (whatever payload it now has:
                        // the move is applied only if it still has it).
                        let m = &moves[i];
                        let Some(task) = core.tasks.get_checked(m.slot, TaskId(m.id)) else {
                            continue;
                        };
                        if task.state != TaskState::Scheduled {
                            continue;
                        }
                        let Some(payload) = core.payloads.get(&task.bytes) else {
                            continue;
                        };
                        (core.payloads.key(&task.bytes), payload)
                    }
                    _ => continue,
                };
                last = Some((due_ms, id));
                let hash = match source {
                    Source::Memory(i) if moves[i].far => hasher.hash(key),
                    _ => 0,
                };
                let offset = writer.push(id, due_ms, key, payload);
                match source {
                    Source::Memory(i) => {
                        moves[i].offset = offset;
                        moves[i].hash = hash;
                    }
                    Source::Victim(j) => victim_moves[j].mark_written(),
                }
            }
            drop(core);
            // Written as it is built: the file's bytes are never whole in
            // memory.
            if writer.buffered() >= WRITE_PIECE_BYTES {
                let (at, bytes) = writer.drain();
                out.write(&bytes, at)?;
            }
        }
        drop(readers);
        let (header, (at, bytes)) = writer.finish_parts();
        out.write(&bytes, at)?;
        out.write(&header, 0)?;
        if let Err(e) = out.finish() {
            // Renamed into place, its directory's fsync failed (or whether
            // it was renamed is unknown): named by no checkpoint, used by
            // no task. Known from now on, so that the next checkpoint
            // deletes it rather than the next open.
            if !matches!(disk.storage.exists(&path), Ok(false)) {
                if let Ok(mut core) = holds.lock(self) {
                    core.overflow_files.entry(file).or_insert(0);
                }
            }
            return Err(e);
        }
        // Durable: known from now on, so that the checkpoint after a failed
        // read-back below deletes it (no task refers to it yet).
        holds.lock(self)?.overflow_files.entry(file).or_insert(0);
        let path = dir.join(&name);
        let moved_payloads = if victim_moves.is_empty() {
            self.apply_written_moves(
                disk,
                &path,
                file,
                &moves,
                replacements,
                holds,
                &far_after_now,
            )?
        } else {
            self.apply_read_back(
                disk,
                &path,
                file,
                &mut moves,
                &victims,
                &victim_moves,
                &hasher,
                holds,
                &far_after_now,
            )?
        };
        // Cursors of files left with no far task go.
        let mut core = holds.lock(self)?;
        let files: HashSet<u32> = core.far.files().collect();
        core.far_cursors.retain(|f, _| files.contains(f));
        Ok(moved_payloads)
    }

    /// Applies the moves of a file written from memory alone (no victim),
    /// durable at `path`, a piece per hold of the lock, from the offsets
    /// noted as it was written. A task still waiting under the same id with
    /// its payload in memory holds what was written unless a reschedule
    /// replaced a payload since (`replacements`, read before the first
    /// piece was copied, is then behind [`Shared::payload_replacements`]):
    /// only then are the entries read back and compared, as
    /// [`Shared::apply_read_back`] does. Returns the moves applied.
    #[allow(clippy::too_many_arguments)]
    fn apply_written_moves(
        &self,
        disk: &Disk,
        path: &Path,
        file: u32,
        moves: &[Move],
        replacements: u64,
        holds: &mut Holds,
        far_after_now: &dyn Fn() -> FarCut,
    ) -> Result<u64, CheckpointError> {
        let replaced = || {
            self.payload_replacements
                .load(std::sync::atomic::Ordering::Relaxed)
                != replacements
        };
        let mut reader: Option<overflow::PieceReader> = None;
        let mut piece = Piece::default();
        let mut moved = 0u64;
        let mut next = 0usize;
        while next < moves.len() {
            let mut end = next.saturating_add(MOVES_PER_HOLD).min(moves.len());
            let verify = replaced();
            piece.clear();
            if verify {
                // Read without the lock, in file order (the moves are in
                // (due, id) order, as written), about a piece's bytes.
                let reader = match &mut reader {
                    Some(r) => r,
                    none => none.insert(overflow::PieceReader::open(
                        disk.storage.as_ref(),
                        path,
                        WRITE_PIECE_BYTES,
                    )?),
                };
                for (k, m) in moves[next..end].iter().enumerate() {
                    if piece.bytes.len() >= WRITE_PIECE_BYTES {
                        end = next + k;
                        break;
                    }
                    let Some(offset) = m.written() else {
                        piece.spans.push(None);
                        continue;
                    };
                    let (entry, _) = reader.entry_at(offset)?;
                    if entry.task_id != m.id || entry.due_ms != m.due_ms {
                        return Err(overflow::OverflowReadError::Corrupt {
                            path: path.to_path_buf(),
                            offset,
                            reason: format!(
                                "entry of task {} read back, not {}",
                                entry.task_id, m.id
                            ),
                        }
                        .into());
                    }
                    piece.push(entry.key, entry.payload);
                }
            }
            let chunk = &moves[next..end];
            let mut core = holds.lock(self)?;
            // Replacements change under the lock: none since the check
            // above, none until this hold (or stretch of it) ends.
            if !verify && replaced() {
                continue;
            }
            let mut far_after = far_after_now();
            let mut earliest = Earliest::new();
            let mut live = 0u64;
            for (i, m) in chunk.iter().enumerate() {
                if i > 0 && i.is_multiple_of(CHECKPOINT_HOLD_CHECK_ENTRIES) && core.held_long() {
                    // Settle what this stretch applied, yield, go on.
                    if let Some(n) = core.overflow_files.get_mut(&file) {
                        *n += std::mem::take(&mut live);
                    }
                    reset_far_cursors(&mut core, std::mem::take(&mut earliest));
                    core.bump(self)?;
                    far_after = far_after_now();
                    if !verify && replaced() {
                        // A payload was replaced while the lock was away: the
                        // rest of the chunk is read back and compared.
                        end = next + i;
                        break;
                    }
                }
                if let Some(ahead) = chunk.get(i + PREFETCH_TASKS_AHEAD) {
                    if let Some(entry) = core.tasks.entry(ahead.slot) {
                        crate::prefetch::prefetch(entry);
                    }
                }
                // What taking it out of memory touches: its wheel node and
                // its key and payload bytes (freed).
                if let Some(task) = chunk
                    .get(i + PREFETCH_TASKS_AHEAD / 2)
                    .and_then(|ahead| core.tasks.get(ahead.slot))
                {
                    if let Some(node) = task.timer.and_then(|t| core.wheel.node_of(t)) {
                        crate::prefetch::prefetch(node);
                    }
                    if let Some(payload) = core.payloads.get(&task.bytes) {
                        crate::prefetch::prefetch_bytes(&payload[..payload.len().min(1)]);
                    }
                    let key = core.payloads.key(&task.bytes);
                    crate::prefetch::prefetch_bytes(&key[..key.len().min(1)]);
                }
                let Some(offset) = m.written() else {
                    continue;
                };
                let applied = if verify {
                    let Some((key, payload)) = piece.get(i) else {
                        continue;
                    };
                    apply_move(self, &mut core, m, (file, offset), payload, key, far_after)
                } else {
                    apply_written_move(self, &mut core, m, (file, offset), far_after)
                };
                if let Some(far) = applied {
                    live += 1;
                    moved += 1;
                    if far {
                        note_earliest(&mut earliest, file, m.due_ms, offset);
                    }
                }
            }
            if let Some(n) = core.overflow_files.get_mut(&file) {
                *n += live;
            }
            reset_far_cursors(&mut core, earliest);
            drop(core);
            next = end;
        }
        Ok(moved)
    }

    /// Applies the moves of a file written from memory and compaction
    /// victims, durable at `path`: tasks that still hold what the file
    /// holds now refer to it. The entries are read back from the file, in
    /// order, a piece at a time (a victim's entry finds its task again by
    /// its key). Returns the payload references moved.
    #[allow(clippy::too_many_arguments)]
    fn apply_read_back(
        &self,
        disk: &Disk,
        path: &Path,
        file: u32,
        moves: &mut [Move],
        victims: &[Victim],
        victim_moves: &[VictimMove],
        hasher: &crate::far::KeyHasher,
        holds: &mut Holds,
        far_after_now: &dyn Fn() -> FarCut,
    ) -> Result<u64, CheckpointError> {
        let mut written =
            overflow::PieceReader::open(disk.storage.as_ref(), path, WRITE_PIECE_BYTES)?;
        let mut piece = Piece::default();
        let mut moved_payloads = 0u64;
        let mut cursor = MergeCursor::default();
        // Per entry of the piece: where it came from, its offset in the new
        // file, its key's hash.
        let mut read: Vec<(Source, u64, u64)> = Vec::new();
        let mut last_read = overflow::HEADER_BYTES as u64;
        loop {
            piece.clear();
            read.clear();
            while read.len() < MOVES_PER_HOLD && piece.bytes.len() < WRITE_PIECE_BYTES {
                let Some(source) = cursor.next(moves, victim_moves) else {
                    break;
                };
                let (is_written, far) = match source {
                    Source::Memory(i) => (moves[i].written().is_some(), moves[i].far),
                    Source::Victim(j) => (victim_moves[j].written(), true),
                };
                if !is_written {
                    continue;
                }
                let (due_ms, id) = order_of(source, moves, victim_moves);
                let corrupt = |offset, reason| overflow::OverflowReadError::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason,
                };
                let Some((offset, entry)) = written.next_entry()? else {
                    return Err(corrupt(
                        last_read,
                        format!("the file ends before the entry of task {id}"),
                    )
                    .into());
                };
                last_read = offset;
                let expected = match source {
                    Source::Memory(i) => moves[i].offset,
                    Source::Victim(_) => offset,
                };
                if entry.task_id != id || entry.due_ms != due_ms || offset != expected {
                    return Err(corrupt(
                        offset,
                        format!("entry of task {} read back, not {id}", entry.task_id),
                    )
                    .into());
                }
                let hash = if far { hasher.hash(entry.key) } else { 0 };
                piece.push(entry.key, entry.payload);
                read.push((source, offset, hash));
            }
            if read.is_empty() {
                break;
            }
            let mut core = holds.lock(self)?;
            // Far only if still beyond the far span now: a task promoted
            // meanwhile (or come within it while the file was written) stays.
            let mut far_after = far_after_now();
            let mut earliest = Earliest::new();
            let mut live = 0u64;
            for (i, &(source, offset, hash)) in read.iter().enumerate() {
                if i > 0 && i.is_multiple_of(CHECKPOINT_HOLD_CHECK_ENTRIES) && core.held_long() {
                    // Settle what this stretch applied, yield, go on.
                    if let Some(n) = core.overflow_files.get_mut(&file) {
                        *n += std::mem::take(&mut live);
                    }
                    reset_far_cursors(&mut core, std::mem::take(&mut earliest));
                    core.bump(self)?;
                    far_after = far_after_now();
                }
                let Some((key, payload)) = piece.get(i) else {
                    continue;
                };
                let applied = match source {
                    Source::Memory(i) => {
                        moves[i].hash = hash;
                        let m = &moves[i];
                        apply_move(self, &mut core, m, (file, offset), payload, key, far_after)
                            .map(|far| Applied { far, payload: true })
                    }
                    Source::Victim(j) => {
                        let vm = &victim_moves[j];
                        let from = (victims[vm.victim()].file, vm.src_offset());
                        let to = (file, offset);
                        apply_victim_move(self, &mut core, vm, from, to, key, hash, far_after)
                    }
                };
                if let Some(applied) = applied {
                    live += 1;
                    if applied.far {
                        let due_ms = order_of(source, moves, victim_moves).0;
                        note_earliest(&mut earliest, file, due_ms, offset);
                    }
                    if applied.payload {
                        moved_payloads += 1;
                    }
                }
            }
            if let Some(n) = core.overflow_files.get_mut(&file) {
                *n += live;
            }
            reset_far_cursors(&mut core, earliest);
            drop(core);
        }
        Ok(moved_payloads)
    }

    /// Chooses the live entries of compaction victim `v` (`victim`), read a
    /// piece at a time; each piece's keys are hashed before the lock is
    /// taken, once per piece. Live: a far task's entry (copied forward as
    /// it is), or the payload of a task that still refers to it (it moves
    /// with it, and the task goes far when it is a waiting first attempt
    /// beyond the far span: [`apply_victim_move`]).
    ///
    /// # Errors
    /// [`CheckpointError::Overflow`] with `Corrupt` if the file is damaged
    /// or out of (due, id) order, or holds another count of entries than
    /// its header says (the caller then leaves the file alone); I/O errors.
    fn choose_from_victim(
        &self,
        disk: &Disk,
        victim: &Victim,
        v: u32,
        hasher: &crate::far::KeyHasher,
        moves: &mut Vec<VictimMove>,
        holds: &mut Holds,
    ) -> Result<(), CheckpointError> {
        let expected = overflow::read_entry_count(
            disk.storage.as_ref(),
            &victim.path,
            None,
            victim.file,
            None,
        )?;
        let mut reader =
            overflow::PieceReader::open(disk.storage.as_ref(), &victim.path, WRITE_PIECE_BYTES)?;
        // One piece: (offset, id, due, hash, key's span in `keys`).
        let mut batch: Vec<(u64, u64, u64, u64, usize, usize)> = Vec::new();
        let mut keys: Vec<u8> = Vec::new();
        let mut count = 0u64;
        let mut last: Option<(u64, u64)> = None;
        let mut done = false;
        while !done {
            batch.clear();
            keys.clear();
            while batch.len() < MOVES_PER_HOLD && keys.len() < WRITE_PIECE_BYTES {
                let Some((offset, entry)) = reader.next_entry()? else {
                    done = true;
                    break;
                };
                let order = (entry.due_ms, entry.task_id);
                if last.is_some_and(|last| order <= last) {
                    return Err(overflow::OverflowReadError::Corrupt {
                        path: victim.path.clone(),
                        offset,
                        reason: "entries out of (due time, task id) order".into(),
                    }
                    .into());
                }
                last = Some(order);
                count += 1;
                batch.push((
                    offset,
                    entry.task_id,
                    entry.due_ms,
                    hasher.hash(entry.key),
                    keys.len(),
                    entry.key.len(),
                ));
                keys.extend_from_slice(entry.key);
            }
            let core = holds.lock(self)?;
            for &(offset, id, due_ms, hash, at, key_len) in &batch {
                let key = &keys[at..at + key_len];
                let Some(chosen) = VictimMove::new(due_ms, id, v, offset) else {
                    continue;
                };
                if let Some(loc) = crate::far::pack_loc(victim.file, offset) {
                    if core.far.find(hash, loc, id).is_some() {
                        moves.push(chosen);
                        continue;
                    }
                }
                let tag = core.key_tag(key);
                let Some(slot) = core.find_slot(tag, key) else {
                    continue;
                };
                let Some(task) = core.tasks.get(slot) else {
                    continue;
                };
                if task.id.0 == id && task.bytes.on_disk() == Some((victim.file, offset)) {
                    moves.push(chosen);
                }
            }
        }
        if count != expected {
            // The moves chosen from it are dropped by the caller.
            return Err(overflow::OverflowReadError::Corrupt {
                path: victim.path.clone(),
                offset: 0,
                reason: format!("header counts {expected} entries, the file holds {count}"),
            }
            .into());
        }
        Ok(())
    }
}

/// What applying a move did: the task went (or stayed) far; its payload
/// moved (a task that goes far with its payload counts too).
struct Applied {
    far: bool,
    payload: bool,
}

/// Applies one move of a key and payload in memory whose entry is durable
/// at `offset` of `file`, if the task still waits with what the entry holds
/// (`key`, `payload`, as read back). It goes far if it was chosen to and is
/// still due when it was, and beyond `far_after` ([`FarCut::takes_far`]:
/// due after now + the far span, waiting on a wheel timer still ahead).
/// `Some(true)`: it went far; `Some(false)`: its payload reference moved;
/// `None`: nothing changed.
fn apply_move(
    shared: &Shared,
    core: &mut Core,
    m: &Move,
    (file, offset): (u32, u64),
    payload: &[u8],
    key: &[u8],
    far_after: FarCut,
) -> Option<bool> {
    let task = core.tasks.get_checked(m.slot, TaskId(m.id))?;
    // A task that fell due meanwhile keeps its payload where it is.
    if task.state != TaskState::Scheduled
        || core.payloads.key(&task.bytes) != key
        || core.payloads.get(&task.bytes) != Some(payload)
    {
        return None;
    }
    let (due_current, far) = move_outcome(core, m, task, far_after);
    let to = (file, offset);
    relink(
        shared,
        core,
        m.slot,
        m.id,
        m.hash,
        key,
        to,
        far,
        due_current,
    )
}

/// What becomes of move `m`'s task as it is now (waiting, its payload in
/// memory): whether its due time is still the one written
/// (`due_current`), and whether it goes far — chosen to, a first attempt,
/// still due when it was, and beyond `far_after` ([`FarCut::takes_far`]:
/// due after now + the far span, waiting on a wheel timer still ahead).
fn move_outcome(
    core: &Core,
    m: &Move,
    task: &crate::task::Task,
    far_after: FarCut,
) -> (bool, bool) {
    let due_current = task.due_ms == m.due_ms;
    let far = m.far && due_current && far_after.takes_far(core, task);
    (due_current, far)
}

/// Where a move out of memory draws the line for far tasks, read at each
/// hold of the lock: due (UTC ms) after `after_ms` (now + the far span;
/// `None` without one), and waiting on a wheel timer after `now_tick`.
#[derive(Clone, Copy, Debug)]
struct FarCut {
    after_ms: Option<u64>,
    now_tick: Tick,
}

impl FarCut {
    /// Whether `task` waits for a tick still ahead: its wheel timer is
    /// after both the clock's tick and the wheel's. A task already due — in
    /// the overdue queue or the catch-up backlog (no timer), or with a timer
    /// the wheel, standing still while paused, has not reached — stays where
    /// it is, whatever its wall-clock due time says after a backward wall
    /// step (it is handed out at once, or at the resume).
    fn waits_ahead(&self, core: &Core, task: &crate::task::Task) -> bool {
        let now = self.now_tick.max(core.wheel.elapsed());
        task.timer
            .and_then(|timer| core.wheel.due(timer))
            .is_some_and(|due| due > now)
    }

    /// Whether `task`, waiting, is a first attempt due after `after_ms`: a
    /// far task if it also [`FarCut::waits_ahead`]. O(1), the task's entry
    /// only.
    fn beyond(&self, task: &crate::task::Task) -> bool {
        task.deliveries == 0 && self.after_ms.is_some_and(|end| task.due_ms > end)
    }

    /// Whether `task` (waiting) leaves the wheel as a far task: a first
    /// attempt, due after `after_ms`, waiting for a tick still ahead.
    fn takes_far(&self, core: &Core, task: &crate::task::Task) -> bool {
        self.beyond(task) && self.waits_ahead(core, task)
    }
}

/// How far ahead the loops over moves out of memory ask for the cache
/// lines they will read: a task's slab entry this many moves ahead, its key
/// and payload half as many (read from its entry, loaded by then). The
/// moves are in (due, id) order, so their slots are scattered over the
/// slab: without it, each move waits for two cache misses in turn.
const PREFETCH_TASKS_AHEAD: usize = 16;

/// Prefetches for the copy of `order[i]`'s successors into a new file:
/// the slab entry [`PREFETCH_TASKS_AHEAD`] moves ahead, the key and payload
/// bytes half as far.
fn prefetch_ahead(core: &Core, order: &[Source], moves: &[Move], i: usize) {
    if let Some(&Source::Memory(j)) = order.get(i + PREFETCH_TASKS_AHEAD) {
        if let Some(entry) = core.tasks.entry(moves[j].slot) {
            crate::prefetch::prefetch(entry);
        }
    }
    if let Some(&Source::Memory(j)) = order.get(i + PREFETCH_TASKS_AHEAD / 2) {
        if let Some(task) = core.tasks.get(moves[j].slot) {
            let key = core.payloads.key(&task.bytes);
            crate::prefetch::prefetch_bytes(key);
            if let Some(payload) = core.payloads.get(&task.bytes) {
                crate::prefetch::prefetch_bytes(payload);
            }
        }
    }
}

/// Applies one move of a key and payload in memory whose entry is durable
/// at `offset` of `file`, without the entry: the caller knows no payload was
/// replaced since the entry was copied from the task (see
/// [`Shared::apply_written_moves`]), so a task still waiting under the same
/// id with its payload in memory holds what the entry holds. Otherwise as
/// [`apply_move`].
fn apply_written_move(
    shared: &Shared,
    core: &mut Core,
    m: &Move,
    (file, offset): (u32, u64),
    far_after: FarCut,
) -> Option<bool> {
    let task = core.tasks.get_checked(m.slot, TaskId(m.id))?;
    // A task that fell due meanwhile keeps its payload where it is.
    if task.state != TaskState::Scheduled || core.payloads.get(&task.bytes).is_none() {
        return None;
    }
    let (due_current, far) = move_outcome(core, m, task, far_after);
    if far && crate::far::pack_loc(file, offset).is_some() && core.far.can_hold(m.id, file) {
        // Goes far (the index takes it in: `can_hold`, under this hold):
        // the key is not needed (it is in the entry).
        return relink(
            shared,
            core,
            m.slot,
            m.id,
            m.hash,
            &[],
            (file, offset),
            true,
            true,
        );
    }
    let key: Box<[u8]> = core.payloads.key(&task.bytes).into();
    relink(
        shared,
        core,
        m.slot,
        m.id,
        m.hash,
        &key,
        (file, offset),
        false,
        due_current,
    )
}

/// Points the task in `slot` (id `id`, key `key` hashing to `hash`) at its
/// entry at `(file, offset)`: as a far task, out of the slab and the wheel,
/// if `far` (and the place packs, and the far index takes it in:
/// `FarIndex::can_hold`), else by its payload reference (`due_current`: the
/// entry's due time is still the task's; `key` must then be the task's: a
/// caller passing none checked `can_hold` first). `Some(true)`: it went far;
/// `Some(false)`: its payload reference moved.
#[allow(clippy::too_many_arguments)]
fn relink(
    shared: &Shared,
    core: &mut Core,
    slot: u32,
    id: u64,
    hash: u64,
    key: &[u8],
    (file, offset): (u32, u64),
    far: bool,
    due_current: bool,
) -> Option<bool> {
    if let (true, Some(loc)) = (far, crate::far::pack_loc(file, offset)) {
        // Not taken in (`FarIndex::can_hold`): it stays in the wheel, its
        // payload on disk, as below.
        if core
            .far
            .insert(crate::far::FarEntry { hash, loc, id })
            .is_ok()
        {
            shared.forget_task(core, slot);
            return Some(true);
        }
    }
    let task = core.tasks.get_mut(slot)?;
    let new_ref = core.payloads.put_on_disk(key, file, offset, due_current);
    let old = std::mem::replace(&mut task.bytes, new_ref);
    core.release_bytes(slot, old);
    Some(false)
}

/// Applies one victim's entry copied forward, durable at `to`, if it is
/// still live where it came from (`from`): a far task's entry there (found
/// by `hash`, its key's) now points at `to`; a waiting task whose payload
/// is still there (found by `key`) refers to `to` instead, and leaves the
/// wheel as a far task if it is a first attempt due when the entry says and
/// beyond the far span (due after `far_after`, UTC ms: now + far span).
/// `None`: nothing changed.
#[allow(clippy::too_many_arguments)]
fn apply_victim_move(
    shared: &Shared,
    core: &mut Core,
    vm: &VictimMove,
    from: (u32, u64),
    (file, offset): (u32, u64),
    key: &[u8],
    hash: u64,
    far_after: FarCut,
) -> Option<Applied> {
    if let Some(old) = crate::far::pack_loc(from.0, from.1) {
        if let Some(pos) = core.far.find(hash, old, vm.id) {
            // One the index cannot take in stays where it is (its file is
            // kept while it refers to it). The removal only frees: the
            // insert after it succeeds when `can_hold` says so before.
            let loc =
                crate::far::pack_loc(file, offset).filter(|_| core.far.can_hold(vm.id, file))?;
            let was = core.far.remove(pos)?;
            let id = vm.id;
            if core
                .far
                .insert(crate::far::FarEntry { hash, loc, id })
                .is_err()
            {
                debug_assert!(false, "can_hold said it could");
                let _ = core.far.insert(was);
                return None;
            }
            return Some(Applied {
                far: true,
                payload: false,
            });
        }
    }
    let tag = core.key_tag(key);
    let slot = core.find_slot(tag, key)?;
    let task = core.tasks.get(slot)?;
    // A task that fell due meanwhile keeps its payload where it is.
    if task.id.0 != vm.id
        || task.state != TaskState::Scheduled
        || task.bytes.on_disk() != Some(from)
    {
        return None;
    }
    let due_current = task.due_ms == vm.due_ms;
    let far = due_current && far_after.takes_far(core, task);
    let to = (file, offset);
    let far = relink(shared, core, slot, vm.id, hash, key, to, far, due_current)?;
    Some(Applied { far, payload: true })
}

fn note_earliest(earliest: &mut Earliest, file: u32, due_ms: u64, offset: u64) {
    let (d, o) = earliest.entry(file).or_insert((due_ms, offset));
    *d = (*d).min(due_ms);
    *o = (*o).min(offset);
}

/// Files that gained far tasks are read by the promotion again from their
/// earliest new far task (a task that became far in place may sit before
/// where it stopped), once it comes within the far span. Not from the
/// file's start: what precedes it is no far task's (the file is in (due,
/// id) order) — payloads of wheel tasks, due within the far span, that
/// every reset made the promotion read and hold again (a 8 M-task run with
/// 200-byte payloads held 1–2 M of them at once).
fn reset_far_cursors(core: &mut Core, earliest: Earliest) {
    if earliest.is_empty() {
        return;
    }
    for (file, (due, offset)) in earliest {
        core.far_reset_due_min = core.far_reset_due_min.min(due);
        let (offset, next_due_ms) = match core.far_cursors.get(&file) {
            Some(c) => (c.offset.min(offset), c.next_due_ms.min(due)),
            None => (offset, due),
        };
        core.far_generation = core.far_generation.wrapping_add(1);
        let generation = core.far_generation;
        core.far_cursors.insert(
            file,
            super::far::FarCursor {
                offset: offset.max(overflow::HEADER_BYTES as u64),
                next_due_ms: next_due_ms.max(1),
                generation,
            },
        );
    }
}

/// Encodes one task of the slab. Tasks a consumer holds after a cancel
/// (`Abandoned`) are finished as far as the log is concerned (their CANCEL
/// is logged), so they are left out; `Ready` and `Leased` tasks are in
/// flight.
fn push_task(enc: &mut CheckpointEncoder, task: &crate::task::Task, payloads: &PayloadStore) {
    let in_flight = match task.state {
        TaskState::Scheduled => false,
        TaskState::Ready | TaskState::Leased => true,
        TaskState::Abandoned => return,
    };
    let payload = match (payloads.get(&task.bytes), task.bytes.on_disk()) {
        (Some(p), _) => PayloadAt::Inline(p),
        (None, Some((file, offset))) => PayloadAt::Overflow { file, offset },
        (None, None) => PayloadAt::Inline(&[]),
    };
    enc.push_task(
        task.id.0,
        task.due_ms,
        task.deliveries,
        in_flight,
        payloads.key(&task.bytes),
        payload,
    );
}

#[cfg(test)]
thread_local! {
    /// Tests: the state (as `tests::state_of` gives it) in the hold that
    /// read `L`, on the checkpointing thread.
    static STATE_AT_L: std::cell::RefCell<Option<tests::State>> =
        const { std::cell::RefCell::new(None) };
}

/// Dead letters a checkpoint encodes per hold of the engine's lock (a hold
/// also ends once [`WRITE_PIECE_BYTES`] are encoded).
const DEAD_LETTERS_PER_HOLD: usize = if cfg!(test) { 2 } else { 16_384 };

/// Slab slots a checkpoint encodes per hold of the engine's lock, from the
/// slab's snapshot (a few in unit tests, so that calls run between holds);
/// a hold also ends once [`WRITE_PIECE_BYTES`] are encoded.
const SLOTS_PER_ENCODE_HOLD: u32 = if cfg!(test) { 16 } else { 65_536 };

/// Far tasks a checkpoint encodes per hold of the engine's lock, from the
/// far index's snapshot (at least one shard: 1/256 of the far tasks; one
/// shard per hold in unit tests).
const FAR_ENTRIES_PER_HOLD: usize = if cfg!(test) { 1 } else { 65_536 };

/// The snapshots of the slab, the far index and the dead letters a
/// checkpoint is reading: dropped (under the lock) if the checkpoint stops
/// before they are read to the end, so they stop saving their changes.
struct Snapshots<'a> {
    shared: &'a Shared,
    begun: bool,
}

impl Drop for Snapshots<'_> {
    fn drop(&mut self) {
        if self.begun {
            let mut core = self.shared.core.lock();
            core.tasks.abort_snapshot();
            core.payloads.end_snapshot();
            core.far.abort_snapshot();
            core.dead_snapshot = None;
        }
    }
}

/// Removes the overflow files numbered `files` (each one tried) and fsyncs
/// their directory; returns how many were named, or the first failure.
fn remove_overflow_files(disk: &Disk, files: &[u32]) -> Result<usize, CheckpointError> {
    if files.is_empty() {
        return Ok(0);
    }
    disk.forget_overflow_files(files);
    let dir = disk.overflow_dir();
    // Each one tried: a file that cannot be removed keeps no other.
    let mut removed = Ok(());
    for f in files {
        let path = dir.join(overflow::file_name(*f));
        match disk.storage.remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                removed = removed.and(Err(CheckpointError::Io {
                    op: "remove",
                    path,
                    source,
                }))
            }
        }
    }
    // A reader that opened one of them between the forget above and its
    // removal may have kept it: let go of it now.
    disk.forget_overflow_files(files);
    disk.storage
        .sync_dir(&dir)
        .map_err(|source| CheckpointError::Io {
            op: "fsync dir",
            path: dir.clone(),
            source,
        })?;
    removed?;
    Ok(files.len())
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
    // Each one tried: a file that cannot be removed keeps no other.
    let mut result = Ok(());
    for (old, name) in files {
        if old < lsn {
            let path = dir.join(name);
            match storage.remove_file(&path) {
                Ok(()) => removed = true,
                Err(source) => result = result.and(Err(io("remove", path)(source))),
            }
        }
    }
    if removed {
        storage
            .sync_dir(dir)
            .map_err(io("fsync dir", dir.to_path_buf()))?;
    }
    result
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
    if !tmps.is_empty() || !files.is_empty() {
        // What this open sees, it relies on (a checkpoint lets it skip and
        // later delete log segments): make it durable first. A checkpoint
        // renamed into place whose directory fsync failed is visible but
        // could vanish in a power cut (as `Wal::open` does for segments).
        storage
            .sync_dir(dir)
            .map_err(io("fsync dir", dir.to_path_buf()))?;
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
                    .map_err(io("stat", path.clone()))?;
                let named_files: FileSet = c
                    .tasks
                    .iter()
                    .filter_map(|(_, t)| t.payload_at.map(|(f, _)| f))
                    .chain(c.far.iter().map(|t| t.file))
                    .collect();
                let mismatch = |e: crate::replay::RuleError| OpenError::CheckpointMismatch {
                    path: path.clone(),
                    reason: e.0,
                };
                // The key rule is checked once, on the tasks the replay ends
                // with, by the index `load_replayed` builds.
                let mut replay = Replay::from_checkpoint(header.max_task_id, c.tasks, c.dead, true)
                    .map_err(mismatch)?
                    .without_key_rule();
                replay.add_far(c.far).map_err(mismatch)?;
                return Ok(Some(Loaded {
                    replay,
                    meta: LoadedMeta {
                        lsn: header.lsn,
                        bytes,
                        store_id: header.store_id,
                        path,
                        named_files,
                        newer_damaged: newest_error,
                    },
                }));
            }
            // A read that failed says nothing about the file: the open
            // fails rather than fall back to an older checkpoint (whose
            // view of the overflow files is older too).
            Err(e @ checkpoint::CheckpointReadError::Io { .. }) => {
                return Err(OpenError::Checkpoint(e));
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

/// A set of overflow file numbers, with a fast hash: built at open from
/// every task's file number (two passes over 10 M far tasks took a tenth of
/// an open with SipHash).
pub(crate) type FileSet = HashSet<u32, foldhash::fast::RandomState>;

/// Before the engine starts on a recovered state: leftover temporary files
/// and overflow files no live task refers to (written by a checkpoint that
/// never became durable, or left by an interrupted deletion) are removed;
/// an overflow file a task refers to must exist. Returns the number the next
/// overflow file gets, and the entry count of each file kept (from its
/// header), so that compaction knows how much of a file is dead — 0 for a
/// file kept only because the newest checkpoint is damaged (not read), so
/// that the next checkpoint deletes it.
pub(crate) fn prepare_overflow(
    storage: &dyn Storage,
    dir: &Path,
    replay: &Replay,
    checkpoint: Option<&LoadedMeta>,
) -> Result<(u32, Vec<(u32, u64)>), OpenError> {
    let ovf_dir = dir.join(overflow::OVERFLOW_DIR_NAME);
    let io = |op, path: PathBuf| move |source| OpenError::Io { op, path, source };
    let (files, tmps) = overflow::list(storage, &ovf_dir).map_err(io("list", ovf_dir.clone()))?;
    // Files a live task or a dead letter needs, and files the checkpoint
    // names (kept until a later checkpoint no longer names them, so that the
    // checkpoint on disk always reads whole with its overflow files).
    // With the largest entry offset each refers to: the entry there must lie
    // whole within the file (checked below without reading a payload).
    // Hashed as `FileSet` is: one entry per task of up to 10 M at open.
    let mut last_referenced: HashMap<u32, u64, foldhash::fast::RandomState> = HashMap::default();
    for (f, offset) in replay
        .tasks()
        .filter_map(|t| t.payload_at)
        .chain(replay.dead_payloads_on_disk().values().copied())
        .chain(replay.far().map(|t| (t.file, t.offset)))
    {
        let last = last_referenced.entry(f).or_insert(offset);
        *last = (*last).max(offset);
    }
    let needed: FileSet = last_referenced.keys().copied().collect();
    let referenced: FileSet = needed
        .iter()
        .copied()
        .chain(
            checkpoint
                .iter()
                .flat_map(|c| c.named_files.iter().copied()),
        )
        .collect();
    let present: FileSet = files.iter().map(|(f, _)| *f).collect();
    if let Some(&missing) = needed.iter().find(|f| !present.contains(f)) {
        // How many need it (a second pass, on this error only).
        let needing = replay
            .tasks()
            .filter_map(|t| t.payload_at)
            .chain(replay.dead_payloads_on_disk().values().copied())
            .chain(replay.far().map(|t| (t.file, t.offset)))
            .filter(|(f, _)| *f == missing)
            .count();
        return Err(OpenError::CheckpointMismatch {
            path: checkpoint.map_or_else(|| ovf_dir.clone(), |c| c.path.clone()),
            reason: format!(
                "it refers to overflow file {}, which is missing: entries in it are needed by \
                 {needing} live {} or dead {} (`kairos salvage` lists them; `--discard` cancels \
                 them, losing their keys and payloads)",
                ovf_dir.join(overflow::file_name(missing)).display(),
                if needing == 1 { "task" } else { "tasks" },
                if needing == 1 { "letter" } else { "letters" },
            ),
        });
    }
    // Overflow files the checkpoint refers to are relied on from now on:
    // their directory entries are made durable (see `load`).
    let mut removed = !files.is_empty();
    for name in &tmps {
        let path = ovf_dir.join(name);
        storage
            .remove_file(&path)
            .map_err(io("remove", path.clone()))?;
        removed = true;
    }
    // Opening from an older checkpoint because the newest is damaged: the
    // newest may refer to files the older one does not; keep them all.
    let keep_unreferenced = checkpoint.is_some_and(|c| c.newer_damaged.is_some());
    for (f, name) in &files {
        if !referenced.contains(f) && !keep_unreferenced {
            let path = ovf_dir.join(name);
            tracing::info!(file = %path.display(), "removing an overflow file no task refers to");
            storage
                .remove_file(&path)
                .map_err(io("remove", path.clone()))?;
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(&ovf_dir)
            .map_err(io("fsync dir", ovf_dir.clone()))?;
    }
    let mut written = Vec::new();
    for (f, name) in &files {
        if referenced.contains(f) {
            // A file a task needs must read back (its header and the size
            // its last entry needs here; each entry when its payload is
            // read).
            let read = overflow::read_entry_count(
                storage,
                &ovf_dir.join(name),
                checkpoint.map(|c| &c.store_id),
                *f,
                last_referenced.get(f).copied(),
            );
            let n = match read {
                Ok(n) => n,
                // Named only by the checkpoint, no task or dead letter needs
                // it (their tasks finished after it): damage in it loses
                // nothing. Known with no entries, so that the next
                // checkpoint deletes it (as a missing one is not needed).
                Err(e @ overflow::OverflowReadError::Corrupt { .. }) if !needed.contains(f) => {
                    tracing::warn!(
                        error = %e,
                        "an overflow file no task needs does not read back; the next \
                         checkpoint removes it"
                    );
                    0
                }
                Err(e) => return Err(e.into()),
            };
            written.push((*f, n));
        } else if keep_unreferenced {
            // Kept only for the damaged newest checkpoint, which the next
            // checkpoint replaces: known with no entries (no task uses it,
            // its header is not read), so that checkpoint deletes it.
            written.push((*f, 0));
        }
    }
    Ok((
        files.last().map_or(1, |(f, _)| f.saturating_add(1)),
        written,
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Run by [`RemoveHook`] at the next removal, before it.
        static BEFORE_REMOVE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            std::cell::RefCell::new(None);
    }

    /// Simulated storage that runs [`BEFORE_REMOVE`] before a removal.
    #[derive(Debug)]
    struct RemoveHook(kairos_wal::SimStorage);

    impl Storage for RemoveHook {
        fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
            self.0.create_dir_all(path)
        }
        fn open(
            &self,
            path: &Path,
            mode: kairos_wal::storage::OpenMode,
        ) -> std::io::Result<Box<dyn kairos_wal::storage::StorageFile>> {
            self.0.open(path, mode)
        }
        fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
            self.0.list(dir)
        }
        fn exists(&self, path: &Path) -> std::io::Result<bool> {
            self.0.exists(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            self.0.rename(from, to)
        }
        fn remove_file(&self, path: &Path) -> std::io::Result<()> {
            if let Some(hook) = BEFORE_REMOVE.with(|h| h.borrow_mut().take()) {
                hook();
            }
            self.0.remove_file(path)
        }
        fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
            self.0.sync_dir(path)
        }
        fn lock(&self, path: &Path) -> std::io::Result<Box<dyn kairos_wal::storage::LockGuard>> {
            self.0.lock(path)
        }
    }

    /// A reader that opens a file after `remove_overflow_files` forgot it
    /// but before it is removed does not keep it open past the removal; nor
    /// is anything kept once the engine closed them all.
    #[test]
    fn a_file_opened_just_before_its_removal_is_not_kept() {
        use kairos_wal::storage::{OpenMode, Storage as _};
        let sim = kairos_wal::SimStorage::new(42);
        let disk = Arc::new(Disk::new(
            Arc::new(RemoveHook(sim.clone())),
            PathBuf::from("/d"),
        ));
        let dir = disk.overflow_dir();
        sim.create_dir_all(&dir).unwrap();
        for f in [1, 2] {
            sim.open(&dir.join(overflow::file_name(f)), OpenMode::CreateNew)
                .unwrap();
        }
        disk.overflow_file(1).unwrap();
        let reader = Arc::clone(&disk);
        BEFORE_REMOVE.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                reader.overflow_file(2).unwrap();
                assert_eq!(reader.overflow_files_open(), vec![1, 2]);
            }));
        });
        assert_eq!(remove_overflow_files(&disk, &[2]).unwrap(), 1);
        assert_eq!(disk.overflow_files_open(), vec![1]);
        disk.close_overflow_files();
        assert!(disk.overflow_files_open().is_empty());
        disk.overflow_file(1).unwrap();
        assert!(disk.overflow_files_open().is_empty());
    }

    /// The overflow files kept open: the most recently read
    /// [`OPEN_OVERFLOW_FILES_MAX`], least recently used closed first; a
    /// file that cannot be opened is not kept; a file removed is closed, and
    /// one opened before a removal is not kept (it may be the removed one).
    #[test]
    fn overflow_files_kept_open() {
        use kairos_wal::storage::{OpenMode, Storage as _};
        let sim = Arc::new(kairos_wal::SimStorage::new(41));
        let disk = Disk::new(sim.clone(), PathBuf::from("/d"));
        let dir = disk.overflow_dir();
        sim.create_dir_all(&dir).unwrap();
        let max = OPEN_OVERFLOW_FILES_MAX as u32;
        for f in 1..=max + 3 {
            let file = sim
                .open(&dir.join(overflow::file_name(f)), OpenMode::CreateNew)
                .unwrap();
            file.write_all_at(&f.to_le_bytes(), 0).unwrap();
        }
        for f in 1..=max + 2 {
            disk.overflow_file(f).unwrap();
        }
        assert_eq!(
            disk.overflow_files_open(),
            (3..=max + 2).collect::<Vec<_>>()
        );
        // A hit moves the file to the back; a miss evicts the front.
        disk.overflow_file(3).unwrap();
        disk.overflow_file(max + 3).unwrap();
        let mut kept: Vec<u32> = (5..=max + 2).collect();
        kept.extend([3, max + 3]);
        assert_eq!(disk.overflow_files_open(), kept);
        // Missing: an error, nothing kept.
        assert!(disk.overflow_file(99).is_err());
        assert_eq!(disk.overflow_files_open(), kept);
        // Removed: closed, and no longer readable.
        assert_eq!(remove_overflow_files(&disk, &[3, 6]).unwrap(), 2);
        kept.retain(|&f| f != 3 && f != 6);
        assert_eq!(disk.overflow_files_open(), kept);
        assert!(disk.overflow_file(3).is_err());
        // A descriptor opened before a removal (of whatever file) is used
        // once, not kept; one opened after it is.
        let path = dir.join(overflow::file_name(1));
        let handle = Arc::new(overflow::EntryFile::open(sim.as_ref(), &path).unwrap());
        let before = disk.open_files.lock().removals;
        disk.forget_overflow_files(&[2]);
        kept.retain(|&f| f != 2);
        assert!(!disk.keep_open(1, &handle, before));
        assert_eq!(disk.overflow_files_open(), kept);
        assert!(disk.keep_open(1, &handle, before + 1));
        kept.push(1);
        assert_eq!(disk.overflow_files_open(), kept);
    }

    /// An engine on simulated storage whose tasks due beyond one hour go
    /// far at a checkpoint, and nothing runs a checkpoint or a move but
    /// the test.
    fn far_engine(sim: &kairos_wal::SimStorage, clock: &crate::ManualClock) -> crate::Engine {
        relocating_far_engine(sim, clock, None)
    }

    /// [`far_engine`], and with `relocate_far_bytes` set, far tasks also
    /// leave the wheel between checkpoints once that many bytes of them
    /// wait (the background checkpointer thread's moves, and those a
    /// checkpoint makes while it encodes).
    fn relocating_far_engine(
        sim: &kairos_wal::SimStorage,
        clock: &crate::ManualClock,
        relocate_far_bytes: Option<u64>,
    ) -> crate::Engine {
        let c = crate::Config {
            horizon: Some(Duration::from_secs(3600)),
            resident_window: None,
            payload_window: Some(Duration::from_secs(60)),
            payload_prefetch: false,
            relocate_far_tasks: relocate_far_bytes.map(|_| 1 << 20),
            relocate_far_bytes: relocate_far_bytes
                .unwrap_or(crate::config::RELOCATE_FAR_BYTES_DEFAULT),
            checkpoint_interval: None,
            checkpoint_log_bytes: None,
            ..crate::Config::default()
        };
        crate::Engine::open_with("/k", c, Arc::new(sim.clone()), Arc::new(clock.clone()))
            .expect("open")
    }

    const START_MS: u64 = 1_700_000_000_000;

    fn at(ms: u64) -> crate::Due {
        crate::Due::At(std::time::UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Due time (UTC ms) of the `i`-th far task of a test: 2 hours on,
    /// a second apart (beyond the 1-hour horizon of [`far_engine`]).
    fn far_due(i: u64) -> u64 {
        START_MS + 2 * 3_600_000 + 1_000 * i
    }

    /// A 101-byte payload (kept in the arena, not inline in the task entry).
    fn arena_payload(tag: &str, i: u64) -> Vec<u8> {
        format!("{tag}{i:0>100}").into_bytes()
    }

    fn far_ids(engine: &crate::Engine) -> Vec<u64> {
        let mut ids: Vec<u64> = engine.shared.core.lock().far.iter().map(|e| e.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Keys and payloads in the payload arena, released between the holds
    /// in which a checkpoint encodes the slab (cancelled, rescheduled with a
    /// new payload) and their entries taken at once by new tasks of the
    /// same size: the file holds each task's key and payload as they were
    /// at its LSN, not the bytes that took their place.
    #[test]
    fn arena_entries_freed_during_a_checkpoint_keep_the_bytes_it_writes() {
        let sim = kairos_wal::SimStorage::new(5);
        let clock = crate::ManualClock::new(START_MS);
        let engine = far_engine(&sim, &clock);
        let n = 1_000usize;
        // 24-byte keys and 40-byte payloads: 64 bytes, one arena class.
        let key = |tag: &str, i: usize| format!("{tag}{i:0>23}").into_bytes();
        let payload = |tag: &str, i: usize| format!("{tag}{i:0>39}").into_bytes();
        let due = |i: usize| at(START_MS + 30_000 + i as u64);
        for i in 0..n {
            engine
                .schedule(&key("a", i), due(i), &payload("a", i))
                .expect("schedule");
        }
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let most_kept = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let kept_seen = Arc::clone(&most_kept);
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // From the end of the slab: slots not read yet.
            let (gone, changed) = (n - 1 - 2 * k, n - 2 - 2 * k);
            if changed < 2 * k + 32 {
                return;
            }
            assert!(matches!(
                shared.cancel_one(&key("a", gone)).expect("cancel"),
                crate::CancelOutcome::Cancelled { .. }
            ));
            shared
                .reschedule(
                    &key("a", changed),
                    due(changed),
                    Some(&payload("c", changed)),
                )
                .expect("reschedule");
            // Two new tasks of the same size take the entries just freed.
            for tag in ["x", "y"] {
                shared
                    .schedule_one(&crate::NewTask {
                        key: &key(tag, k),
                        due: due(k),
                        payload: &payload(tag, k),
                    })
                    .expect("schedule");
            }
            // The saved tasks' entries are kept; a task scheduled and
            // cancelled meanwhile (no saved task names its entry) is freed
            // at once.
            let kept = || shared.core.lock().payloads.entries_kept_for_snapshot();
            let before = kept();
            most_kept.fetch_max(before, std::sync::atomic::Ordering::Relaxed);
            shared
                .schedule_one(&crate::NewTask {
                    key: &key("z", k),
                    due: due(k),
                    payload: &payload("z", k),
                })
                .expect("schedule");
            let _ = shared.cancel_one(&key("z", k)).expect("cancel");
            assert_eq!(kept(), before, "hold {k}");
        }));
        let report = engine.checkpoint().expect("checkpoint");
        *engine.shared.hold_hook.lock() = None;
        let changed_calls = calls.load(std::sync::atomic::Ordering::Relaxed);
        assert!(changed_calls > 10, "{changed_calls} holds");
        // The cancelled tasks' entries were kept, and all freed by the end.
        assert!(kept_seen.load(std::sync::atomic::Ordering::Relaxed) > 0);
        assert_eq!(
            engine
                .shared
                .core
                .lock()
                .payloads
                .entries_kept_for_snapshot(),
            0
        );
        assert_eq!(
            engine.arena_entries_accounted().1,
            engine.arena_entries_accounted().0
        );
        let written = crate::checkpoint::read(
            &sim,
            &Path::new("/k/checkpoint").join(crate::checkpoint::file_name(report.lsn)),
        )
        .expect("read the checkpoint");
        let mut got: Vec<(Vec<u8>, Vec<u8>)> = written
            .tasks
            .iter()
            .map(|(_, t)| (t.key.to_vec(), t.payload.to_vec()))
            .collect();
        got.sort();
        let want: Vec<(Vec<u8>, Vec<u8>)> =
            (0..n).map(|i| (key("a", i), payload("a", i))).collect();
        assert_eq!(got.len(), n);
        assert!(got == want, "the keys and payloads at the checkpoint's LSN");
    }

    /// Tasks cancelled, rescheduled and scheduled anew — resident ones and
    /// far ones — between the holds in which a checkpoint encodes the slab
    /// and then the far index: the file holds the tasks of its LSN, each
    /// once, and the engine reopened from it and the log is the one the
    /// calls made.
    #[test]
    fn tasks_changed_between_the_holds_of_a_checkpoint_are_as_at_its_lsn() {
        let sim = kairos_wal::SimStorage::new(3);
        let clock = crate::ManualClock::new(START_MS);
        let engine = far_engine(&sim, &clock);
        let (n_res, n_far) = (2_000usize, 3_000usize);
        let res_due = |i: usize| START_MS + 30_000 + 10 * i as u64;
        let far_due = |i: usize| far_due(i as u64);
        for i in 0..n_far {
            engine
                .schedule(format!("f{i}").as_bytes(), at(far_due(i)), b"p")
                .expect("schedule");
        }
        engine.checkpoint().expect("first checkpoint");
        assert_eq!(far_ids(&engine).len(), n_far);
        // Resident tasks (within the payload window), and something new to
        // checkpoint.
        for i in 0..n_res {
            engine
                .schedule(format!("r{i}").as_bytes(), at(res_due(i)), b"r")
                .expect("schedule");
        }
        type State = (Vec<(u64, u64)>, Vec<u64>);
        let at_lsn: Arc<parking_lot::Mutex<Option<State>>> = Arc::default();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (counter, seen) = (Arc::clone(&calls), Arc::clone(&at_lsn));
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if k == 0 {
                // Nothing changed since `L` yet: the state to expect.
                let core = shared.core.lock();
                let mut tasks: Vec<(u64, u64)> =
                    core.tasks.iter().map(|t| (t.id.0, t.due_ms)).collect();
                tasks.sort_unstable();
                let mut far: Vec<u64> = core.far.iter().map(|e| e.id).collect();
                far.sort_unstable();
                *seen.lock() = Some((tasks, far));
            }
            let cancelled = |key: String| {
                assert_eq!(
                    shared.cancel_one(key.as_bytes()).expect("cancel"),
                    crate::CancelOutcome::Cancelled { deliveries: 0 },
                    "{key}"
                );
            };
            // A resident task cancelled (its slot freed, then taken by the
            // new one), one rescheduled with a new payload.
            cancelled(format!("r{}", 2 * k));
            shared
                .reschedule(
                    format!("r{}", 2 * k + 1).as_bytes(),
                    at(res_due(2 * k + 1) + 5_000),
                    Some(b"r2"),
                )
                .expect("reschedule");
            shared
                .schedule_one(&crate::NewTask {
                    key: format!("nr{k}").as_bytes(),
                    due: at(res_due(k) + 1),
                    payload: b"n",
                })
                .expect("schedule");
            // A far task cancelled, one moved back to the wheel, a new one.
            cancelled(format!("f{}", 3 * k));
            shared
                .reschedule(
                    format!("f{}", 3 * k + 1).as_bytes(),
                    at(far_due(3 * k + 1) + 3_600_000),
                    None,
                )
                .expect("reschedule");
            shared
                .schedule_one(&crate::NewTask {
                    key: format!("n{k}").as_bytes(),
                    due: at(far_due(k) + 500),
                    payload: b"q",
                })
                .expect("schedule");
        }));
        let report = engine.checkpoint().expect("second checkpoint");
        *engine.shared.hold_hook.lock() = None;
        let calls = calls.load(std::sync::atomic::Ordering::Relaxed);
        // 16 slots per hold, then one shard per hold, in unit tests.
        assert!(calls > n_res / 16 + 255, "{calls} calls");
        {
            let core = engine.shared.core.lock();
            assert!(!core.far.snapshot_active() && !core.tasks.snapshot_active());
        }
        // The file: exactly the tasks of its LSN.
        let written = crate::checkpoint::read(
            &sim,
            &Path::new("/k/checkpoint").join(crate::checkpoint::file_name(report.lsn)),
        )
        .expect("read the checkpoint");
        let (tasks, far_at_lsn) = at_lsn.lock().take().expect("hook ran");
        assert_eq!(tasks.len(), n_res);
        let mut got: Vec<(u64, u64)> = written
            .tasks
            .iter()
            .map(|(id, t)| (*id, t.due_ms))
            .collect();
        got.sort_unstable();
        assert_eq!(got, tasks, "the resident tasks at the checkpoint's LSN");
        let mut far: Vec<u64> = written.far.iter().map(|t| t.id).collect();
        far.sort_unstable();
        assert_eq!(
            far, far_at_lsn,
            "the far tasks at the checkpoint's LSN, each once"
        );
        drop(engine);
        // Reopened from the checkpoint and the log after it.
        let engine = far_engine(&sim, &clock);
        assert_eq!(
            engine.stats().pending,
            n_res + n_far,
            "each call cancels two, adds two"
        );
        for k in 0..calls {
            for key in [format!("r{}", 2 * k), format!("f{}", 3 * k)] {
                assert_eq!(
                    engine.cancel(key.as_bytes()).expect("cancel"),
                    crate::CancelOutcome::NotFound,
                    "{key}"
                );
            }
        }
        let consumer = engine.consumer();
        // Every resident task is due within 55 s.
        clock.advance(Duration::from_secs(60));
        engine.run_until_idle();
        let mut fired = std::collections::BTreeMap::new();
        while let Ok(d) = consumer.try_recv() {
            fired.insert(
                String::from_utf8_lossy(d.key()).into_owned(),
                (d.due_ms(), d.payload().to_vec()),
            );
        }
        for k in 0..calls {
            assert_eq!(
                fired.get(&format!("r{}", 2 * k + 1)),
                Some(&(res_due(2 * k + 1) + 5_000, b"r2".to_vec()))
            );
            assert_eq!(
                fired.get(&format!("nr{k}")),
                Some(&(res_due(k) + 1, b"n".to_vec()))
            );
        }
        assert_eq!(fired.get("r1999"), Some(&(res_due(1999), b"r".to_vec())));
    }

    /// Far tasks scheduled while a checkpoint encodes leave the wheel
    /// before it ends (the checkpoint makes the move the background
    /// thread, waiting for the checkpoint, cannot), some are cancelled
    /// while it still runs, and the file still holds exactly the state at
    /// its LSN; after a crash and a reopen every live task fires once, at
    /// its due time with its payload, and no cancelled one does.
    #[test]
    fn a_checkpoint_moves_far_tasks_scheduled_while_it_encodes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let sim = kairos_wal::SimStorage::new(23);
        let clock = crate::ManualClock::new(START_MS);
        // A move once ~10 tasks (~103 bytes each, as counted) wait.
        let engine = relocating_far_engine(&sim, &clock, Some(1_000));
        let (n_far, n_res, calls_scheduling, per_call) = (200u64, 100u64, 30usize, 10usize);
        for i in 0..n_far {
            engine
                .schedule(format!("f{i}").as_bytes(), at(far_due(i)), b"p")
                .expect("schedule");
        }
        engine.checkpoint().expect("first checkpoint");
        assert_eq!(engine.stats().far, n_far as usize);
        for i in 0..n_res {
            engine
                .schedule(format!("r{i}").as_bytes(), at(START_MS + 30_000 + i), b"r")
                .expect("schedule");
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let far_max = Arc::new(AtomicUsize::new(0));
        let (counter, seen) = (Arc::clone(&calls), Arc::clone(&far_max));
        let m_due = move |k: usize, j: usize| far_due(1_000 + (k * per_call + j) as u64);
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, Ordering::Relaxed);
            // Far tasks grow only by moves, and the checkpointer thread
            // cannot make one while this checkpoint runs.
            seen.fetch_max(shared.core.lock().far.len(), Ordering::Relaxed);
            if k >= calls_scheduling {
                return;
            }
            for j in 0..per_call {
                shared
                    .schedule_one(&crate::NewTask {
                        key: format!("m{k}-{j}").as_bytes(),
                        due: at(m_due(k, j)),
                        payload: format!("m{k}").as_bytes(),
                    })
                    .expect("schedule");
            }
            if k >= 2 {
                // Scheduled two holds ago: moved by now.
                assert_eq!(
                    shared
                        .cancel_one(format!("m{}-0", k - 2).as_bytes())
                        .expect("cancel"),
                    crate::CancelOutcome::Cancelled { deliveries: 0 }
                );
            }
        }));
        STATE_AT_L.with(|f| *f.borrow_mut() = None);
        let report = engine.checkpoint().expect("second checkpoint");
        *engine.shared.hold_hook.lock() = None;
        assert!(calls.load(Ordering::Relaxed) > calls_scheduling);
        let far_max = far_max.load(Ordering::Relaxed);
        assert!(
            far_max >= n_far as usize + (calls_scheduling - 2) * per_call / 2,
            "far tasks moved during the checkpoint: {far_max} far at most"
        );
        let at_lsn = STATE_AT_L
            .with(|f| f.borrow_mut().take())
            .expect("captured");
        assert_eq!(
            state_written(&sim, &report),
            at_lsn,
            "the state at the checkpoint's LSN"
        );
        {
            let core = engine.shared.core.lock();
            assert!(!core.far.snapshot_active() && !core.tasks.snapshot_active());
        }
        drop(engine);
        sim.crash_process();
        let engine = relocating_far_engine(&sim, &clock, Some(1_000));
        let cancelled = calls_scheduling - 2;
        let live = n_far as usize + n_res as usize + calls_scheduling * per_call - cancelled;
        assert_eq!(engine.stats().pending, live);
        let consumer = engine.consumer();
        clock.advance(Duration::from_secs(4 * 3600));
        engine.run_until_idle();
        let mut fired = std::collections::BTreeMap::new();
        while let Ok(d) = consumer.try_recv() {
            let key = String::from_utf8_lossy(d.key()).into_owned();
            let got = (d.due_ms(), d.payload().to_vec());
            assert!(fired.insert(key, got).is_none(), "fired twice");
            consumer.ack(&d).expect("ack");
        }
        let mut want = std::collections::BTreeMap::new();
        for i in 0..n_far {
            want.insert(format!("f{i}"), (far_due(i), b"p".to_vec()));
        }
        for i in 0..n_res {
            want.insert(format!("r{i}"), (START_MS + 30_000 + i, b"r".to_vec()));
        }
        for k in 0..calls_scheduling {
            for j in 0..per_call {
                if j == 0 && k < cancelled {
                    continue;
                }
                want.insert(
                    format!("m{k}-{j}"),
                    (m_due(k, j), format!("m{k}").into_bytes()),
                );
            }
        }
        assert_eq!(fired, want);
    }

    /// A far task the far index cannot take in (here: a second overflow
    /// file while the index may hold one) stays in the wheel, its payload
    /// on disk — whether its checkpoint wrote it (`relink`) or a later one
    /// finds it on disk already — until the index can: then a checkpoint
    /// takes it far where it is. Every task fires once, at its due time,
    /// with its payload; cancelled ones never.
    #[test]
    fn far_tasks_the_index_cannot_take_in_stay_in_the_wheel_until_it_can() {
        let sim = kairos_wal::SimStorage::new(37);
        let clock = crate::ManualClock::new(START_MS);
        let engine = far_engine(&sim, &clock);
        engine.shared.core.lock().far.limit_files_for_tests(1);
        let schedule = |from: u64, to: u64| {
            for i in from..to {
                engine
                    .schedule(
                        format!("f{i}").as_bytes(),
                        at(far_due(i)),
                        &arena_payload("p", i),
                    )
                    .expect("schedule");
            }
        };
        let cancel = |from: u64, to: u64| {
            for i in from..to {
                let got = engine.cancel(format!("f{i}").as_bytes()).expect("cancel");
                assert_eq!(
                    got,
                    crate::CancelOutcome::Cancelled { deliveries: 0 },
                    "f{i}"
                );
            }
        };
        schedule(0, 10);
        engine.checkpoint().expect("checkpoint");
        assert_eq!(far_ids(&engine).len(), 10);
        schedule(10, 20);
        engine.checkpoint().expect("checkpoint");
        // In a second file: not taken in.
        assert_eq!(far_ids(&engine), (1..=10).collect::<Vec<u64>>());
        assert_eq!(engine.stats().pending, 20);
        // Their payloads left memory all the same.
        assert_eq!(engine.stats().payloads_on_disk, 20);
        assert_eq!(engine.stats().payload_bytes_in_memory, 0);
        // Found on disk already, still refused while file 1 has a far task.
        cancel(0, 9);
        engine.checkpoint().expect("checkpoint");
        assert_eq!(far_ids(&engine), [10]);
        // File 1's last far task goes: the slot is free for the others.
        cancel(9, 10);
        engine.checkpoint().expect("checkpoint");
        assert_eq!(far_ids(&engine), (11..=20).collect::<Vec<u64>>());
        cancel(12, 13);
        let consumer = engine.consumer();
        clock.advance(Duration::from_secs(4 * 3600));
        engine.run_until_idle();
        let mut fired = Vec::new();
        while let Ok(d) = consumer.try_recv() {
            fired.push((
                String::from_utf8_lossy(d.key()).into_owned(),
                d.due_ms(),
                d.payload().to_vec(),
            ));
            consumer.ack(&d).expect("ack");
        }
        let want: Vec<(String, u64, Vec<u8>)> = (10..20)
            .filter(|&i| i != 12)
            .map(|i| (format!("f{i}"), far_due(i), arena_payload("p", i)))
            .collect();
        assert_eq!(fired, want);
    }

    /// What a checkpoint's own move takes out of memory includes tasks
    /// that were in the slab at its LSN (scheduled while the move before
    /// the snapshot copied, so not chosen by it), with payloads in the
    /// arena, while tasks of the same size scheduled between the holds may
    /// take freed arena entries: the file holds each task at `L` with its
    /// payload, no arena entry stays kept after it, and after a crash every
    /// task fires once with its payload. (Written by a reviewing helper.)
    #[test]
    fn tasks_in_the_slab_at_l_moved_during_the_checkpoint_keep_their_payloads() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let sim = kairos_wal::SimStorage::new(29);
        let clock = crate::ManualClock::new(START_MS);
        let engine = relocating_far_engine(&sim, &clock, Some(4_000));
        let mut want = std::collections::BTreeMap::new();
        let mut schedule = |tag: &str, i: u64, due: u64| {
            engine
                .schedule(
                    format!("{tag}{i}").as_bytes(),
                    at(due),
                    &arena_payload(tag, i),
                )
                .expect("schedule");
            want.insert(format!("{tag}{i}"), arena_payload(tag, i));
        };
        for i in 0..200 {
            schedule("f", i, far_due(i));
        }
        engine.checkpoint().expect("first checkpoint");
        for i in 0..2 {
            schedule("a", i, far_due(500 + i));
        }
        // While the move before the snapshot copies: ten tasks whose
        // payloads leave memory (due in 10 minutes, after the payload
        // window) and 25 far ones, in the slab at `L`, taken by none of
        // that move.
        let once = Arc::new(AtomicBool::new(false));
        let o = Arc::clone(&once);
        *engine.shared.checkpoint_yield_hook.lock() = Some(Box::new(move |shared: &Shared| {
            if o.swap(true, Ordering::Relaxed) {
                return;
            }
            for (tag, n, due) in [("w", 10, START_MS + 600_000), ("h", 25, far_due(600))] {
                for j in 0..n {
                    shared
                        .schedule_one(&crate::NewTask {
                            key: format!("{tag}{j}").as_bytes(),
                            due: at(due + j),
                            payload: &arena_payload(tag, j),
                        })
                        .expect("schedule");
                }
            }
        }));
        for j in 0..10 {
            want.insert(format!("w{j}"), arena_payload("w", j));
        }
        for j in 0..25 {
            want.insert(format!("h{j}"), arena_payload("h", j));
        }
        // Between the holds: tasks of the same size, due within the window.
        let calls = Arc::new(AtomicUsize::new(0));
        let far_max = Arc::new(AtomicUsize::new(0));
        let (counter, seen) = (Arc::clone(&calls), Arc::clone(&far_max));
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, Ordering::Relaxed) as u64;
            seen.fetch_max(shared.core.lock().far.len(), Ordering::Relaxed);
            if k < 20 {
                shared
                    .schedule_one(&crate::NewTask {
                        key: format!("n{k}").as_bytes(),
                        due: at(START_MS + 30_000 + k),
                        payload: &arena_payload("n", k),
                    })
                    .expect("schedule");
            }
        }));
        for k in 0..20 {
            want.insert(format!("n{k}"), arena_payload("n", k));
        }
        STATE_AT_L.with(|f| *f.borrow_mut() = None);
        let report = engine.checkpoint().expect("second checkpoint");
        *engine.shared.hold_hook.lock() = None;
        *engine.shared.checkpoint_yield_hook.lock() = None;
        assert!(once.load(Ordering::Relaxed), "the yield hook ran");
        let at_lsn = STATE_AT_L
            .with(|f| f.borrow_mut().take())
            .expect("captured");
        assert!(at_lsn.0.len() >= 35, "the h and w tasks in the slab at L");
        assert!(
            far_max.load(Ordering::Relaxed) >= 227,
            "the h tasks moved during the checkpoint"
        );
        assert_eq!(state_written(&sim, &report), at_lsn);
        assert_eq!(
            engine
                .shared
                .core
                .lock()
                .payloads
                .entries_kept_for_snapshot(),
            0
        );
        drop(engine);
        sim.crash_process();
        let engine = relocating_far_engine(&sim, &clock, Some(4_000));
        assert_eq!(fire_all(&engine, &clock), want);
    }

    /// Advances the clock 4 hours and returns what fired (key → payload),
    /// each acked; panics if a task fires twice.
    fn fire_all(
        engine: &crate::Engine,
        clock: &crate::ManualClock,
    ) -> std::collections::BTreeMap<String, Vec<u8>> {
        let consumer = engine.consumer();
        clock.advance(Duration::from_secs(4 * 3600));
        engine.run_until_idle();
        let mut fired = std::collections::BTreeMap::new();
        while let Ok(d) = consumer.try_recv() {
            let key = String::from_utf8_lossy(d.key()).into_owned();
            assert!(
                fired.insert(key, d.payload().to_vec()).is_none(),
                "fired twice"
            );
            consumer.ack(&d).expect("ack");
        }
        fired
    }

    /// A move a checkpoint makes while it encodes fails (the rename of its
    /// file): the checkpoint still completes (it may be what frees the
    /// disk), holding the state at its LSN; the tasks not moved stay in
    /// memory, producers are no longer held back, and after a crash
    /// nothing is lost or fired twice.
    #[test]
    fn a_failed_move_during_a_checkpoint_does_not_fail_it() {
        use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let sim = kairos_wal::SimStorage::new(31);
        let clock = crate::ManualClock::new(START_MS);
        let engine = relocating_far_engine(&sim, &clock, Some(4_000));
        let mut want = std::collections::BTreeMap::new();
        for i in 0..100 {
            let (key, p) = (format!("f{i}"), arena_payload("p", i));
            engine
                .schedule(key.as_bytes(), at(far_due(i)), &p)
                .expect("schedule");
            want.insert(key, p);
        }
        engine.checkpoint().expect("first checkpoint");
        for i in 0..50 {
            let (key, p) = (format!("r{i}"), arena_payload("r", i));
            engine
                .schedule(key.as_bytes(), at(START_MS + 30_000 + i), &p)
                .expect("schedule");
            want.insert(key, p);
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let faulty = sim.clone();
        // 25 far tasks (~200 bytes each as counted) per hook: a move wanted
        // at each of the next holds; the third one's rename fails.
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, Ordering::Relaxed) as u64;
            if k < 3 {
                for j in 0..25 {
                    shared
                        .schedule_one(&crate::NewTask {
                            key: format!("m{k}-{j}").as_bytes(),
                            due: at(far_due(1_000 + k * 100 + j)),
                            payload: &arena_payload("m", k * 100 + j),
                        })
                        .expect("schedule");
                }
            }
            if k == 2 {
                faulty.inject(FaultPlan {
                    after: 0,
                    op: FaultOp::Rename,
                    kind: FaultKind::Eio,
                });
            }
        }));
        for k in 0..3 {
            for j in 0..25 {
                want.insert(format!("m{k}-{j}"), arena_payload("m", k * 100 + j));
            }
        }
        STATE_AT_L.with(|f| *f.borrow_mut() = None);
        let report = engine
            .checkpoint()
            .expect("the checkpoint despite the failed move");
        *engine.shared.hold_hook.lock() = None;
        sim.clear_faults();
        assert!(report.written);
        let at_lsn = STATE_AT_L
            .with(|f| f.borrow_mut().take())
            .expect("captured");
        assert_eq!(state_written(&sim, &report), at_lsn);
        {
            let core = engine.shared.core.lock();
            assert!(!core.far.snapshot_active() && !core.tasks.snapshot_active());
            assert_eq!(core.payloads.entries_kept_for_snapshot(), 0);
            assert!(!core.relocating && core.relocation_failed);
            // The first two moves went through; the third's tasks wait.
            assert_eq!(core.far.len(), 150);
        }
        engine.checkpoint().expect("the next checkpoint");
        drop(engine);
        sim.crash_process();
        let engine = relocating_far_engine(&sim, &clock, Some(4_000));
        assert_eq!(fire_all(&engine, &clock), want);
    }

    /// Tasks (id, due) and far tasks (id, hash, file, offset), sorted.
    pub(super) type State = (Vec<(u64, u64)>, Vec<(u64, u64, u32, u64)>);

    /// The state a checkpoint at this moment must hold.
    pub(super) fn state_of(core: &Core) -> State {
        let mut tasks: Vec<(u64, u64)> = core
            .tasks
            .iter()
            .filter(|t| t.state != TaskState::Abandoned)
            .map(|t| (t.id.0, t.due_ms))
            .collect();
        tasks.sort_unstable();
        let mut far: Vec<(u64, u64, u32, u64)> = core
            .far
            .iter()
            .map(|e| {
                let (file, offset) = crate::far::unpack_loc(e.loc);
                (e.id, e.hash, file, offset)
            })
            .collect();
        far.sort_unstable();
        (tasks, far)
    }

    /// The state in the file the checkpoint of `report` wrote under `/k`.
    fn state_written(sim: &kairos_wal::SimStorage, report: &CheckpointReport) -> State {
        let written = crate::checkpoint::read(
            sim,
            &Path::new("/k/checkpoint").join(crate::checkpoint::file_name(report.lsn)),
        )
        .expect("read the checkpoint");
        state_in(&written)
    }

    /// The same of a checkpoint read back.
    fn state_in(c: &crate::checkpoint::Checkpoint) -> State {
        let mut tasks: Vec<(u64, u64)> = c.tasks.iter().map(|(id, t)| (*id, t.due_ms)).collect();
        tasks.sort_unstable();
        let mut far: Vec<(u64, u64, u32, u64)> = c
            .far
            .iter()
            .map(|t| (t.id, t.key_hash, t.file, t.offset))
            .collect();
        far.sort_unstable();
        (tasks, far)
    }

    /// Threads cancel, reschedule (near and far) and schedule far tasks
    /// while the clock advances (the driver promotes far tasks) and the main
    /// thread checkpoints over and over (a few tasks per hold under
    /// cfg(test)). Each checkpoint's tasks and far tasks must be the state
    /// captured in the hold that read `L`; reopened at the end, the engine
    /// holds exactly the model's tasks. (Written by a reviewing helper; a
    /// `>` for `>=` in `Snapshot::note_remove` fails it.)
    #[test]
    fn checkpoints_under_concurrent_calls_and_promotion_hold_the_state_at_their_lsn() {
        checkpoints_under_concurrent_calls(None);
    }

    /// The same with far tasks leaving the wheel in moves of a few dozen
    /// between checkpoints and during them (a checkpoint moves those
    /// scheduled while it encodes): each checkpoint still holds the state
    /// at its LSN, and the reopened engine the model's tasks.
    #[test]
    fn checkpoints_moving_far_tasks_while_they_encode_hold_the_state_at_their_lsn() {
        checkpoints_under_concurrent_calls(Some(4_000));
    }

    fn checkpoints_under_concurrent_calls(relocate_far_bytes: Option<u64>) {
        use rand::{Rng, SeedableRng};
        use std::sync::atomic::{AtomicBool, Ordering};
        let sim = kairos_wal::SimStorage::new(11);
        let clock = crate::ManualClock::new(START_MS);
        let engine = relocating_far_engine(&sim, &clock, relocate_far_bytes);
        let per_thread = 2_000usize;
        let threads = 2usize;
        let base = START_MS + 2 * 3_600_000;
        let key = |t: usize, i: usize| format!("t{t}-{i}").into_bytes();
        for t in 0..threads {
            for i in 0..per_thread {
                let due = base + (i as u64 * 5_393) % (3 * 3_600_000);
                engine
                    .schedule(&key(t, i), at(due), b"p")
                    .expect("schedule");
            }
        }
        engine.checkpoint().expect("first checkpoint");
        assert_eq!(engine.stats().far, threads * per_thread);
        // Let the other threads run between the holds.
        *engine.shared.hold_hook.lock() = Some(Box::new(|_: &Shared| {
            std::thread::sleep(Duration::from_micros(100));
        }));
        let stop = AtomicBool::new(false);
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let (models, checked) = std::thread::scope(|s| {
            let _stop_on_panic = StopOnDrop(&stop);
            let mut handles = Vec::new();
            for t in 0..threads {
                let engine = &engine;
                let stop = &stop;
                handles.push(s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                    // Key -> payload it holds now.
                    let mut live: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = (0..per_thread)
                        .map(|i| (key(t, i), b"p".to_vec()))
                        .collect();
                    let mut replaced = 0u64;
                    let mut gone = Vec::new();
                    let mut next = per_thread;
                    while !stop.load(Ordering::Relaxed) {
                        let pick = |rng: &mut rand::rngs::StdRng, live: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>| {
                            live.keys().nth(rng.random_range(0..live.len())).cloned()
                        };
                        match rng.random_range(0..4) {
                            0 => {
                                if let Some(k) = pick(&mut rng, &live) {
                                    assert!(matches!(
                                        engine.cancel(&k).expect("cancel"),
                                        crate::CancelOutcome::Cancelled { .. }
                                    ));
                                    live.remove(&k);
                                    gone.push(k);
                                }
                            }
                            1 | 2 => {
                                if let Some(k) = pick(&mut rng, &live) {
                                    let due = base + rng.random_range(0..3 * 3_600_000u64);
                                    // Half of them with a new payload: a move
                                    // then reads its entries back and compares.
                                    if rng.random_range(0..2) == 0 {
                                        replaced += 1;
                                        let p = format!("r{t}-{replaced}").into_bytes();
                                        engine
                                            .reschedule(&k, at(due), Some(&p))
                                            .expect("reschedule");
                                        live.insert(k, p);
                                    } else {
                                        engine.reschedule(&k, at(due), None).expect("reschedule");
                                    }
                                }
                            }
                            _ => {
                                let k = key(t, next);
                                next += 1;
                                let due = base + rng.random_range(0..3 * 3_600_000u64);
                                engine.schedule(&k, at(due), b"n").expect("schedule");
                                live.insert(k, b"n".to_vec());
                            }
                        }
                    }
                    (live, gone)
                }));
            }
            let ticker = {
                let clock = clock.clone();
                let stop = &stop;
                s.spawn(move || {
                    // Up to 100 minutes: nothing fires (due >= 2 h), far
                    // tasks due within an hour of now are promoted.
                    for _ in 0..100 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        clock.advance(Duration::from_secs(60));
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            };
            let mut checked = 0;
            for _ in 0..25 {
                std::thread::sleep(Duration::from_millis(40));
                STATE_AT_L.with(|f| *f.borrow_mut() = None);
                let report = engine.checkpoint().expect("checkpoint");
                if !report.written {
                    continue;
                }
                let (tasks, far) = STATE_AT_L
                    .with(|f| f.borrow_mut().take())
                    .expect("captured");
                let (got_tasks, got_far) = state_written(&sim, &report);
                assert_eq!(got_tasks, tasks, "TASKS: the slab at L");
                assert_eq!(got_far, far, "FAR: the far index at L");
                assert!(!engine.shared.core.lock().far.snapshot_active());
                checked += 1;
            }
            stop.store(true, Ordering::Relaxed);
            ticker.join().unwrap();
            let models: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            (models, checked)
        });
        assert!(checked > 10, "{checked}");
        let stats = engine.stats();
        eprintln!("checked {checked} checkpoints; {stats:?}");
        let expected: usize = models.iter().map(|(l, _)| l.len()).sum();
        assert_eq!(stats.pending, expected);
        drop(engine);
        sim.crash_process();
        let engine = relocating_far_engine(&sim, &clock, relocate_far_bytes);
        assert_eq!(engine.stats().pending, expected);
        // Every live task fires once, with the payload it was last given;
        // no cancelled one fires.
        let consumer = engine.consumer();
        clock.advance(Duration::from_secs(6 * 3600));
        engine.run_until_idle();
        let mut fired = std::collections::BTreeMap::new();
        while let Ok(d) = consumer.try_recv() {
            assert!(
                fired
                    .insert(d.key().to_vec(), d.payload().to_vec())
                    .is_none(),
                "fired twice"
            );
            consumer.ack(&d).expect("ack");
        }
        let mut want = std::collections::BTreeMap::new();
        for (live, _) in &models {
            want.extend(live.iter().map(|(k, p)| (k.clone(), p.clone())));
        }
        assert_eq!(fired.len(), want.len());
        assert!(
            fired == want,
            "a task fired with another payload, or not at all"
        );
    }

    /// A payload replaced while a checkpoint that began applying a move
    /// without reading its file back (nothing replaced so far) yields the
    /// lock mid-way: the rest of the move is read back and compared, so the
    /// task keeps its new payload (without that, it would point at the old
    /// one, written before). Deterministic: the replacement is made in the
    /// yield itself (every task yields in unit tests).
    #[test]
    fn a_payload_replaced_while_a_move_yields_the_lock_is_kept() {
        let sim = kairos_wal::SimStorage::new(21);
        let clock = crate::ManualClock::new(START_MS);
        let engine = far_engine(&sim, &clock);
        let n = 300u64;
        let due = |i: u64| START_MS + 2 * 3_600_000 + i * 1_000;
        for i in 0..n {
            engine
                .schedule(format!("m{i}").as_bytes(), at(due(i)), b"old")
                .expect("schedule");
        }
        let last = n - 1;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&done);
        *engine.shared.checkpoint_yield_hook.lock() = Some(Box::new(move |shared: &Shared| {
            // Once the move is being applied (the first task, id 1, went
            // far) and before it reaches the last task.
            let applying = shared.core.lock().far.iter().any(|e| e.id == 1);
            if applying && !flag.swap(true, std::sync::atomic::Ordering::Relaxed) {
                shared
                    .reschedule(format!("m{last}").as_bytes(), at(due(last)), Some(b"new"))
                    .expect("reschedule");
            }
        }));
        engine.checkpoint().expect("checkpoint");
        *engine.shared.checkpoint_yield_hook.lock() = None;
        assert!(
            done.load(std::sync::atomic::Ordering::Relaxed),
            "no yield while applying"
        );
        // The replaced one stays in memory (its entry no longer holds it).
        assert_eq!(engine.stats().far as u64, n - 1);
        let consumer = engine.consumer();
        clock.advance(Duration::from_secs(3 * 3600));
        engine.run_until_idle();
        let mut fired = std::collections::BTreeMap::new();
        while let Ok(d) = consumer.try_recv() {
            fired.insert(d.key().to_vec(), d.payload().to_vec());
            consumer.ack(&d).expect("ack");
        }
        assert_eq!(fired.len() as u64, n);
        for i in 0..n {
            let want: &[u8] = if i == last { b"new" } else { b"old" };
            assert_eq!(fired[format!("m{i}").as_bytes()], want, "m{i}");
        }
    }

    /// Dead letters requeued and purged between the holds in which a
    /// checkpoint encodes them (two per hold in unit tests): the file holds
    /// those of its LSN, each as it was.
    #[test]
    fn dead_letters_changed_between_the_holds_of_a_checkpoint_are_as_at_its_lsn() {
        let sim = kairos_wal::SimStorage::new(5);
        let clock = crate::ManualClock::new(START_MS);
        let engine = {
            let mut c = crate::Config {
                payload_prefetch: false,
                checkpoint_interval: None,
                checkpoint_log_bytes: None,
                ..crate::Config::default()
            };
            c.retry.max_attempts = 1;
            crate::Engine::open_with("/k", c, Arc::new(sim.clone()), Arc::new(clock.clone()))
                .expect("open")
        };
        let consumer = engine.consumer();
        let n = 40usize;
        // Dead letters: one attempt, nacked.
        let make_dead = |prefix: &str, count: usize| {
            for i in 0..count {
                engine
                    .schedule(
                        format!("{prefix}{i}").as_bytes(),
                        at(clock.wall_ms() + 1),
                        format!("p{i}").as_bytes(),
                    )
                    .expect("schedule");
            }
            clock.advance(Duration::from_millis(5));
            engine.run_until_idle();
            for _ in 0..count {
                let d = consumer.try_recv().expect("due");
                consumer.nack(&d, None, "failed").expect("nack");
            }
        };
        make_dead("d", n);
        let at_lsn: Vec<u64> = {
            let mut ids: Vec<u64> = engine.dead_letters().iter().map(|d| d.task_id.0).collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(at_lsn.len(), n);
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let ids = at_lsn.clone();
        *engine.shared.hold_hook.lock() = Some(Box::new(move |shared: &Shared| {
            let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // From the end: dead letters not read yet.
            if let Some(&id) = ids.get(ids.len().wrapping_sub(1 + 2 * k)) {
                assert!(shared.purge_dead_letter(TaskId(id)).expect("purge"));
            }
            if let Some(&id) = ids.get(ids.len().wrapping_sub(2 + 2 * k)) {
                shared
                    .requeue_dead_letter(TaskId(id), at(START_MS + 3_600_000))
                    .expect("requeue");
            }
        }));
        let report = engine.checkpoint().expect("checkpoint");
        *engine.shared.hold_hook.lock() = None;
        assert!(calls.load(std::sync::atomic::Ordering::Relaxed) > n / 2);
        assert!(engine.shared.core.lock().dead_snapshot.is_none());
        assert!(engine.dead_letters().is_empty(), "all purged or requeued");
        let written = crate::checkpoint::read(
            &sim,
            &Path::new("/k/checkpoint").join(crate::checkpoint::file_name(report.lsn)),
        )
        .expect("read the checkpoint");
        let got: Vec<u64> = written.dead.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            got, at_lsn,
            "the dead letters at the checkpoint's LSN, in id order"
        );
        let mut payloads: Vec<&[u8]> = written.dead.iter().map(|(_, d)| &*d.payload).collect();
        payloads.sort_unstable();
        let mut want: Vec<Vec<u8>> = (0..n).map(|i| format!("p{i}").into_bytes()).collect();
        want.sort_unstable();
        assert!(payloads.iter().eq(want.iter()), "each as it was");
        drop(engine);
        let engine = far_engine(&sim, &clock);
        assert!(engine.dead_letters().is_empty());
        assert_eq!(engine.stats().pending, n / 2, "the requeued ones");
    }

    /// A checkpoint that stops while it reads its snapshots (the engine
    /// poisoned between two holds) drops them: the slab and the far index
    /// stop saving their changes.
    #[test]
    fn a_checkpoint_stopped_mid_way_drops_its_snapshots() {
        let sim = kairos_wal::SimStorage::new(4);
        let clock = crate::ManualClock::new(START_MS);
        let engine = far_engine(&sim, &clock);
        for i in 0..600usize {
            engine
                .schedule(
                    format!("f{i}").as_bytes(),
                    at(START_MS + 2 * 3_600_000 + i as u64),
                    b"p",
                )
                .expect("schedule");
        }
        engine.checkpoint().expect("first checkpoint");
        engine
            .schedule(b"x", at(START_MS + 60_000), b"")
            .expect("schedule");
        *engine.shared.hold_hook.lock() = Some(Box::new(|shared: &Shared| {
            shared.poison("test: stopped".into());
        }));
        assert!(matches!(
            engine.checkpoint(),
            Err(CheckpointError::Poisoned { .. })
        ));
        let core = engine.shared.core.lock();
        assert!(!core.far.snapshot_active() && !core.tasks.snapshot_active());
        assert!(core.dead_snapshot.is_none());
    }

    #[test]
    fn victim_moves_pack_their_source_and_written_flag() {
        let max_v = (1u32 << (63 - SRC_OFFSET_BITS)) - 1;
        let max_offset = (1u64 << SRC_OFFSET_BITS) - 1;
        for (v, offset) in [(0, 64), (1, 12_345), (max_v, max_offset), (7, 0)] {
            let mut m = VictimMove::new(9, 10, v, offset).unwrap();
            assert_eq!(
                (m.victim(), m.src_offset(), m.written()),
                (v as usize, offset, false)
            );
            m.mark_written();
            assert_eq!(
                (m.victim(), m.src_offset(), m.written()),
                (v as usize, offset, true)
            );
            assert_eq!((m.due_ms, m.id), (9, 10));
        }
        assert!(VictimMove::new(1, 1, max_v + 1, 64).is_none());
        assert!(VictimMove::new(1, 1, 0, max_offset + 1).is_none());
    }

    #[test]
    fn the_merge_cursor_walks_both_kinds_in_due_then_id_order() {
        let memory = |due_ms, id| Move {
            due_ms,
            id,
            hash: 0,
            offset: NOT_WRITTEN,
            slot: 0,
            len: 0,
            far: false,
        };
        let moves = [memory(1, 5), memory(3, 1), memory(3, 4), memory(9, 9)];
        let victim_moves: Vec<VictimMove> = [(0, 7), (3, 2), (3, 9), (10, 1), (11, 0)]
            .iter()
            .map(|&(due, id)| VictimMove::new(due, id, 0, 64).unwrap())
            .collect();
        let mut cursor = MergeCursor::default();
        let mut seen = Vec::new();
        while let Some(source) = cursor.next(&moves, &victim_moves) {
            let kind = matches!(source, Source::Victim(_));
            seen.push((order_of(source, &moves, &victim_moves), kind));
        }
        let expected = vec![
            ((0, 7), true),
            ((1, 5), false),
            ((3, 1), false),
            ((3, 2), true),
            ((3, 4), false),
            ((3, 9), true),
            ((9, 9), false),
            ((10, 1), true),
            ((11, 0), true),
        ];
        assert_eq!(seen, expected);
    }

    fn victim(file: u32, live: u64) -> Victim {
        Victim {
            file,
            live,
            merged: false,
            path: PathBuf::new(),
        }
    }

    fn merged(file: u32, live: u64) -> Victim {
        Victim {
            merged: true,
            ..victim(file, live)
        }
    }

    fn files(groups: &[Vec<Victim>]) -> Vec<Vec<u32>> {
        groups
            .iter()
            .map(|g| g.iter().map(|v| v.file).collect())
            .collect()
    }

    #[test]
    fn victims_are_grouped_up_to_the_entries_per_move() {
        let max = VICTIM_ENTRIES_PER_MOVE;
        assert_eq!(files(&victim_groups(Vec::new())), [Vec::<u32>::new()]);
        let groups = victim_groups(vec![
            victim(1, max / 2),
            victim(2, max / 2),
            victim(3, 1),
            victim(4, max * 3),
            victim(5, 7),
        ]);
        // A larger victim alone; nothing over the limit otherwise.
        assert_eq!(files(&groups), [vec![1, 2], vec![3], vec![4], vec![5]]);
    }

    /// A reviewer's finding: a move out of memory at the defaults of then
    /// wrote a file of `relocate_far_bytes / (WHEEL_TASK_BYTES + key)` ≈
    /// 578 k far tasks (64 MiB, 20-byte keys, empty payloads), so two such
    /// files, merged because there were too many files, exceeded the
    /// entries per move: they landed in two groups, each writing its own
    /// file — two out for two in at every checkpoint, the count never
    /// brought down. (With 16 MiB moves, eight such files do.)
    #[test]
    fn files_merged_to_bound_their_number_go_into_one_file() {
        let per_move = (64 << 20) / (WHEEL_TASK_BYTES + 20);
        let groups = victim_groups(vec![merged(1, per_move), merged(2, per_move)]);
        assert_eq!(files(&groups), [vec![1, 2]]);
        let per_move = crate::config::RELOCATE_FAR_BYTES_DEFAULT / (WHEEL_TASK_BYTES + 20);
        let groups = victim_groups((1..=8).map(|f| merged(f, per_move)).collect());
        assert_eq!(files(&groups), [(1..=8).collect::<Vec<u32>>()]);
        // Mostly dead files are still split by entries, after the merged
        // ones (which they may join while there is room).
        let max = VICTIM_ENTRIES_PER_MOVE;
        let groups = victim_groups(vec![
            victim(3, max / 2),
            merged(1, max),
            victim(4, max / 2),
            merged(2, max),
            victim(5, 7),
        ]);
        assert_eq!(files(&groups), [vec![1, 2], vec![3, 4], vec![5]]);
        let groups = victim_groups(vec![merged(1, 10), victim(3, 20), victim(4, max)]);
        assert_eq!(files(&groups), [vec![1, 3], vec![4]]);
    }
}
