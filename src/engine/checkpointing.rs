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

use super::wall_ms;
use super::{Core, Shared, Status};
use crate::checkpoint::{
    self, CheckpointEncoder, CheckpointHeader, PayloadAt, CHECKPOINT_DIR_NAME,
};
use crate::error::{CheckpointError, OpenError};
use crate::overflow::{self, OverflowWriter};
use crate::replay::{IdMap, Replay};
use crate::task::TaskId;
use crate::task::TaskState;
use kairos_wal::storage::Storage;
use kairos_wal::{Lsn, Wal};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Overflow files kept at most (besides those about to be deleted): beyond
/// it, a checkpoint merges the smallest into its new file.
pub const OVERFLOW_FILES_MAX: usize = 8;

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
    /// Payloads moved to its overflow file: out of memory (tasks not due
    /// within `Config::payload_window`, and tasks going far), or out of
    /// overflow files being compacted (far tasks' entries copied forward are
    /// not counted).
    pub payloads_moved: u64,
    /// Overflow files deleted (no live task and no checkpoint refers to them).
    pub overflow_files_removed: usize,
    /// Time spent taking and holding the engine's lock: to copy the state
    /// and what moves into the new overflow file, then (after the files are
    /// durable) to point the moved tasks at the new file and take far tasks
    /// out of the wheel. The scan for unreferenced files that follows,
    /// O(live tasks), is not counted.
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

    pub fn overflow_dir(&self) -> PathBuf {
        self.dir.join(overflow::OVERFLOW_DIR_NAME)
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
    pub named_files: HashSet<u32>,
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
        self.checkpoint_allowed()?;
        // Overflow files mostly dead are read now, outside the lock; their
        // live entries are copied into this checkpoint's overflow file.
        let victims = self.read_compaction_victims(disk)?;
        let locked_at = Instant::now();
        let plan = {
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
                let segments_removed = wal
                    .remove_segments_before(Lsn(lsn + 1))
                    .map_err(CheckpointError::Trim)?;
                return Ok(CheckpointReport {
                    lsn,
                    written: false,
                    tasks: 0,
                    dead_letters: 0,
                    bytes: book.bytes,
                    segments_removed,
                    payloads_moved: 0,
                    overflow_files_removed: 0,
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
            let window_end = self
                .config
                .payload_window
                .map(|w| wall_ms(self.now()).saturating_add(w.as_millis() as u64));
            let horizon_end = match (self.config.horizon, window_end) {
                (Some(h), Some(_)) => {
                    Some(wall_ms(self.now()).saturating_add(h.as_millis() as u64))
                }
                _ => None,
            };
            let mut in_place = Vec::new();
            let moves = plan_moves(
                &mut core,
                window_end,
                horizon_end,
                victims,
                &header.store_id,
                &mut in_place,
            );
            let (enc, named) = encode(&core, &header, &moves, &in_place);
            let (tasks, dead) = (enc.tasks() + enc.far_tasks(), enc.dead_letters());
            Plan {
                bytes: enc.finish(),
                header,
                tasks,
                dead,
                wal,
                moves,
                in_place,
                named,
                locked: locked_at.elapsed(),
            }
        };
        let Plan {
            bytes,
            header,
            tasks,
            dead: dead_letters,
            wal,
            moves,
            in_place,
            named,
            locked,
        } = plan;
        // Every record the checkpoint reflects must be durable before the
        // checkpoint exists: otherwise a crash could lose them and let new
        // records reuse their LSNs, which replay would skip as covered.
        if let Err(e) = wal.sync() {
            self.poison(format!("checkpoint: log sync failed: {e}"));
            return Err(e.into());
        }
        // The overflow file the checkpoint refers to is durable first.
        if let Some(m) = &moves {
            let dir = disk.overflow_dir();
            create_dir(disk.storage.as_ref(), &disk.dir, &dir)?;
            checkpoint::write_file(
                disk.storage.as_ref(),
                &dir,
                &overflow::file_name(m.file),
                &m.bytes,
            )
            .map_err(|(op, path, source)| CheckpointError::Io { op, path, source })?;
        }
        let dir = disk.checkpoint_dir();
        create_dir(disk.storage.as_ref(), &disk.dir, &dir)?;
        let name = checkpoint::file_name(header.lsn);
        checkpoint::write_file(disk.storage.as_ref(), &dir, &name, &bytes)
            .map_err(|(op, path, source)| CheckpointError::Io { op, path, source })?;
        book.lsn = header.lsn;
        book.bytes = bytes.len() as u64;
        let payloads_moved = moves.as_ref().map_or(0, |m| m.tasks.len() as u64);
        // Durable: the moved payloads now live in the new file.
        let mut locked = locked;
        let unreferenced = {
            let mut core = self.core.lock();
            let applying = Instant::now();
            apply_moves(self, &mut core, moves, in_place);
            locked += applying.elapsed();
            // Files no live task refers to, and that the new checkpoint does
            // not name, can go.
            let referenced = referenced_files(&core);
            let gone: Vec<u32> = core
                .overflow_files
                .keys()
                .copied()
                .filter(|f| !referenced.contains(f) && !named.contains(f))
                .collect();
            for f in &gone {
                core.overflow_files.remove(f);
            }
            gone
        };
        remove_older(disk.storage.as_ref(), &dir, header.lsn)?;
        let overflow_files_removed = remove_overflow_files(disk, &unreferenced)?;
        let segments_removed = wal
            .remove_segments_before(Lsn(header.lsn + 1))
            .map_err(CheckpointError::Trim)?;
        tracing::debug!(
            lsn = header.lsn,
            tasks,
            dead_letters,
            bytes = bytes.len(),
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
            bytes: bytes.len() as u64,
            segments_removed,
            payloads_moved,
            overflow_files_removed,
            locked,
            elapsed: started.elapsed(),
        })
    }

    /// `Ok` while the engine is open; its refusal otherwise.
    fn checkpoint_allowed(&self) -> Result<(), CheckpointError> {
        match &self.core.lock().status {
            Status::Open => Ok(()),
            Status::Closed => Err(CheckpointError::Closed),
            Status::Poisoned(cause) => Err(CheckpointError::Poisoned {
                cause: cause.clone(),
            }),
        }
    }

    /// Reads the overflow files worth compacting: those whose live entries
    /// are at most half of what they hold, and — so that their number stays
    /// bounded when long-lived tasks keep every file alive — the smallest
    /// ones beyond [`OVERFLOW_FILES_MAX`] (size-tiered, as LSM stores merge
    /// small runs).
    fn read_compaction_victims(&self, disk: &Disk) -> Result<Vec<Victim>, CheckpointError> {
        let candidates: Vec<u32> = {
            let core = self.core.lock();
            let mut kept: Vec<(u64, u32)> = Vec::new();
            let mut victims = Vec::new();
            for (&f, &written) in &core.overflow_files {
                let live = core.payloads.live_in_file(f) + core.far.live_in_file(f);
                if live == 0 {
                    continue; // deleted after the checkpoint
                }
                if live * 2 <= written {
                    victims.push(f);
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
                victims.extend(kept.iter().take(merge).map(|&(_, f)| f));
            }
            victims
        };
        let mut out = Vec::new();
        for f in candidates {
            let path = disk.overflow_dir().join(overflow::file_name(f));
            // A read that fails fails the checkpoint (typed; nothing durable
            // changed, the engine goes on). A damaged file is not compacted:
            // its live entries are checked one by one when read (and a dead
            // damaged entry must not block every later checkpoint).
            match overflow::read_file(disk.storage.as_ref(), &path, None, Some(f)) {
                Ok(entries) => out.push((f, entries)),
                Err(e @ overflow::OverflowReadError::Io { .. }) => return Err(e.into()),
                Err(error) => tracing::warn!(%error, "damaged overflow file not compacted"),
            }
        }
        Ok(out)
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

/// An overflow file being compacted: its number and its entries with their
/// offsets.
type Victim = (u32, Vec<(u64, overflow::Entry)>);

/// What a checkpoint moves to its new overflow file.
pub(super) struct Moves {
    /// The new file's number.
    file: u32,
    /// Its bytes.
    bytes: Vec<u8>,
    /// `(slot, id, offset in the new file, what the task held, due time
    /// written)` per task.
    tasks: Vec<(u32, TaskId, u64, Held, u64)>,
    /// Tasks of `tasks` that leave the wheel as far tasks (due beyond the
    /// horizon): id → (key hash, due time planned).
    to_far: IdMap<(u64, u64)>,
    /// Far tasks whose entry moves (their file is compacted): `(key hash,
    /// id, old packed location, offset in the new file, due time)`.
    far_moved: Vec<(u64, u64, u64, u64, u64)>,
}

/// A task whose key and payload are in an overflow file already, at an
/// entry with its due time, that becomes far without moving.
pub(super) struct InPlaceFar {
    slot: u32,
    id: TaskId,
    hash: u64,
    file: u32,
    offset: u64,
    due_ms: u64,
}

/// What a task's payload reference was when its move was planned; the move
/// applies only if it still is.
enum Held {
    /// In memory (these bytes: compared, since a reschedule may replace them).
    Memory,
    /// In an older overflow file being compacted.
    Disk(u32, u64),
}

struct Plan {
    bytes: Vec<u8>,
    header: CheckpointHeader,
    tasks: u64,
    dead: u64,
    wal: Arc<Wal>,
    moves: Option<Moves>,
    in_place: Vec<InPlaceFar>,
    /// Overflow files the checkpoint refers to.
    named: HashSet<u32>,
    locked: Duration,
}

/// Chooses what goes into the new overflow file: payloads in memory of
/// waiting tasks due after `window_end`, and the live entries of the
/// compaction victims. `None` if nothing moves.
fn plan_moves(
    core: &mut Core,
    window_end: Option<u64>,
    horizon_end: Option<u64>,
    victims: Vec<Victim>,
    store_id: &kairos_wal::format::StoreId,
    in_place: &mut Vec<InPlaceFar>,
) -> Option<Moves> {
    // What moves, by (due, id) — the file's order — and from where; each
    // payload is then copied once, straight into the file's bytes.
    let mut items: Vec<(u64, u64, u32, From)> = Vec::new();
    let mut to_far: IdMap<(u64, u64)> = IdMap::default();
    let victim_files: HashSet<u32> = victims.iter().map(|(f, _)| *f).collect();
    if let Some(window_end) = window_end {
        for (slot, task) in core.tasks.iter_slots() {
            if task.state != TaskState::Scheduled || task.due_ms <= window_end {
                continue;
            }
            // Beyond the horizon, a first attempt leaves the wheel: its key
            // goes to disk with its payload, even an empty one.
            let far = horizon_end.is_some_and(|end| task.due_ms > end) && task.deliveries == 0;
            let Some(payload) = core.payloads.get(&task.bytes) else {
                // On disk already: far where it is, if its entry says when
                // it is due.
                if let (true, Some((file, offset))) = (far, task.bytes.on_disk_current()) {
                    if victim_files.contains(&file) {
                        // Copied forward with its file: far at its new place.
                        to_far.insert(task.id.0, (core.hasher.hash(task.key()), task.due_ms));
                    } else if crate::far::pack_loc(file, offset).is_some() {
                        let hash = core.hasher.hash(task.key());
                        in_place.push(InPlaceFar {
                            slot,
                            id: task.id,
                            hash,
                            file,
                            offset,
                            due_ms: task.due_ms,
                        });
                    }
                }
                continue;
            };
            if far {
                to_far.insert(task.id.0, (core.hasher.hash(task.key()), task.due_ms));
            }
            if far || !payload.is_empty() {
                items.push((task.due_ms, task.id.0, slot, From::Memory));
            }
        }
    }
    let mut far_victims: Vec<(u64, u64, u64, usize, usize)> = Vec::new();
    for (v, (file, entries)) in victims.iter().enumerate() {
        for (e, (offset, entry)) in entries.iter().enumerate() {
            if let Some(loc) = crate::far::pack_loc(*file, *offset) {
                let hash = core.hasher.hash(&entry.key);
                if core.far.find(hash, loc, entry.task_id).is_some() {
                    items.push((entry.due_ms, entry.task_id, u32::MAX, From::FarVictim(v, e)));
                    far_victims.push((hash, entry.task_id, loc, v, e));
                    continue;
                }
            }
            let tag = core.key_tag(&entry.key);
            let Some(slot) = core.find_slot(tag, &entry.key) else {
                continue;
            };
            let Some(task) = core.tasks.get(slot) else {
                continue;
            };
            if task.id.0 != entry.task_id || task.bytes.on_disk() != Some((*file, *offset)) {
                continue;
            }
            items.push((entry.due_ms, entry.task_id, slot, From::Victim(v, e)));
        }
    }
    if items.is_empty() {
        return None;
    }
    items.sort_unstable_by_key(|&(due, id, _, _)| (due, id));
    let file = core.next_overflow_file;
    core.next_overflow_file = core.next_overflow_file.checked_add(1)?;
    let mut writer = OverflowWriter::new(store_id, file);
    let mut tasks = Vec::with_capacity(items.len());
    let mut far_moved = Vec::with_capacity(far_victims.len());
    let far_hash: IdMap<(u64, u64)> = far_victims
        .iter()
        .map(|&(hash, id, loc, _, _)| (id, (hash, loc)))
        .collect();
    for (due, id, slot, from) in items {
        if let From::FarVictim(v, e) = from {
            let (_, entries) = &victims[v];
            let (_, entry) = &entries[e];
            let offset = writer.push(id, due, &entry.key, &entry.payload);
            if let Some(&(hash, loc)) = far_hash.get(&id) {
                far_moved.push((hash, id, loc, offset, due));
            }
            continue;
        }
        let (offset, held) = match from {
            From::Memory => {
                let Some(task) = core.tasks.get(slot) else {
                    continue;
                };
                let payload = core.payloads.get(&task.bytes).unwrap_or_default();
                (writer.push(id, due, task.key(), payload), Held::Memory)
            }
            From::Victim(v, e) => {
                let (file, entries) = &victims[v];
                let (old_offset, entry) = &entries[e];
                let offset = writer.push(id, due, &entry.key, &entry.payload);
                (offset, Held::Disk(*file, *old_offset))
            }
            From::FarVictim(..) => continue,
        };
        if crate::far::pack_loc(file, offset).is_none() {
            to_far.remove(&id);
        }
        tasks.push((slot, TaskId(id), offset, held, due));
    }
    let bytes = writer.finish();
    Some(Moves {
        file,
        bytes,
        tasks,
        to_far,
        far_moved,
    })
}

/// Where a moved payload comes from.
#[derive(Clone, Copy)]
enum From {
    /// The task's payload in memory.
    Memory,
    /// Entry `.1` of compaction victim `.0`.
    Victim(usize, usize),
    /// Entry `.1` of compaction victim `.0`, a far task's.
    FarVictim(usize, usize),
}

/// After the checkpoint naming the new file is durable: tasks whose payload
/// reference is still what was copied now refer to the new file, and their
/// payload memory is freed.
fn apply_moves(shared: &Shared, core: &mut Core, moves: Option<Moves>, in_place: Vec<InPlaceFar>) {
    // New far tasks, with their due times.
    let mut new_far: Vec<(crate::far::FarEntry, u64)> = Vec::new();
    // Slots of tasks going far, forgotten in slot order (fewer cache misses
    // when most of the slab goes).
    let mut forget: Vec<u32> = Vec::new();
    for t in in_place {
        let still = core.tasks.get_checked(t.slot, t.id).is_some_and(|task| {
            task.state == TaskState::Scheduled
                && task.deliveries == 0
                && task.bytes.on_disk_current() == Some((t.file, t.offset))
        });
        if let (true, Some(loc)) = (still, crate::far::pack_loc(t.file, t.offset)) {
            forget.push(t.slot);
            let entry = crate::far::FarEntry {
                hash: t.hash,
                loc,
                id: t.id.0,
            };
            new_far.push((entry, t.due_ms));
        }
    }
    if let Some(moves) = moves {
        apply_file_moves(core, moves, &mut new_far, &mut forget);
    }
    forget.sort_unstable();
    for slot in forget {
        shared.forget_task(core, slot);
    }
    // A file that gets new far tasks is read by the promotion from its
    // start again (an in-place one may sit before where it stopped), once
    // the earliest of them comes within the horizon.
    let mut earliest: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for (e, due) in &new_far {
        let d = earliest.entry(e.file()).or_insert(*due);
        *d = (*d).min(*due);
    }
    core.far.add(new_far.into_iter().map(|(e, _)| e).collect());
    shared
        .far_tasks
        .store(core.far.len(), std::sync::atomic::Ordering::Relaxed);
    let files: Vec<u32> = core.far.files().collect();
    core.far_cursors.retain(|f, _| files.contains(f));
    for (file, due) in earliest {
        let next_due_ms = match core.far_cursors.get(&file) {
            Some(c) => c.next_due_ms.min(due),
            None => due,
        };
        core.far_generation = core.far_generation.wrapping_add(1);
        let generation = core.far_generation;
        core.far_cursors.insert(
            file,
            super::far::FarCursor {
                offset: overflow::HEADER_BYTES as u64,
                next_due_ms: next_due_ms.max(1),
                generation,
            },
        );
    }
}

/// [`apply_moves`] for the tasks whose entries went into the new file.
fn apply_file_moves(
    core: &mut Core,
    moves: Moves,
    new_far: &mut Vec<(crate::far::FarEntry, u64)>,
    forget: &mut Vec<u32>,
) {
    let Moves {
        file,
        bytes,
        tasks,
        to_far,
        far_moved,
    } = moves;
    let mut moved = 0;
    for (hash, id, old_loc, offset, due) in far_moved {
        if let (Some(pos), Some(loc)) = (
            core.far.find(hash, old_loc, id),
            crate::far::pack_loc(file, offset),
        ) {
            core.far.remove(pos);
            new_far.push((crate::far::FarEntry { hash, loc, id }, due));
            moved += 1;
        }
    }
    for (slot, id, offset, held, due) in tasks {
        let Some(task) = core.tasks.get_checked(slot, id) else {
            continue;
        };
        // A task that fell due meanwhile keeps its payload in memory.
        if task.state != TaskState::Scheduled {
            continue;
        }
        let still = match held {
            Held::Memory => match core.payloads.get(&task.bytes) {
                Some(p) => overflow_payload(&bytes, offset) == Some(p),
                None => false,
            },
            Held::Disk(f, o) => task.bytes.on_disk() == Some((f, o)),
        };
        if !still {
            continue;
        }
        if let Some(&(hash, due_ms)) = to_far.get(&id.0) {
            let loc = crate::far::pack_loc(file, offset);
            if let (Some(loc), true) = (loc, task.due_ms == due_ms && task.deliveries == 0) {
                forget.push(slot);
                let entry = crate::far::FarEntry {
                    hash,
                    loc,
                    id: id.0,
                };
                new_far.push((entry, due_ms));
                moved += 1;
                continue;
            }
        }
        let due_current = match held {
            Held::Memory => task.due_ms == due,
            Held::Disk(..) => task.bytes.on_disk_current().is_some(),
        };
        let key: Box<[u8]> = task.key().into();
        let new_ref = core.payloads.put_on_disk(&key, file, offset, due_current);
        if let Some(task) = core.tasks.get_mut(slot) {
            let old = std::mem::replace(&mut task.bytes, new_ref);
            core.payloads.release(old);
            moved += 1;
        }
    }
    core.overflow_files.insert(file, moved);
}

/// The payload bytes of the entry at `offset` of an overflow file's bytes.
fn overflow_payload(file: &[u8], offset: u64) -> Option<&[u8]> {
    let at = usize::try_from(offset).ok()?;
    let fixed = file.get(at..at + overflow::ENTRY_FIXED_BYTES)?;
    let key_len = usize::from(u16::from_le_bytes([fixed[24], fixed[25]]));
    let payload_len = u32::from_le_bytes([fixed[26], fixed[27], fixed[28], fixed[29]]) as usize;
    let start = at + overflow::ENTRY_FIXED_BYTES + key_len;
    file.get(start..start + payload_len)
}

/// Overflow files some live task refers to.
fn referenced_files(core: &Core) -> HashSet<u32> {
    core.tasks
        .iter()
        .filter_map(|t| t.bytes.on_disk().map(|(f, _)| f))
        .chain(core.far.files())
        .collect()
}

/// Encodes the live state. Tasks a consumer holds after a cancel
/// (`Abandoned`) are finished as far as the log is concerned (their CANCEL
/// is logged), so they are left out; `Ready` and `Leased` tasks are in flight.
/// Payloads planned to move are written as references to the new file.
fn encode(
    core: &Core,
    header: &CheckpointHeader,
    moves: &Option<Moves>,
    in_place: &[InPlaceFar],
) -> (CheckpointEncoder, HashSet<u32>) {
    let in_place: IdMap<&InPlaceFar> = in_place.iter().map(|t| (t.id.0, t)).collect();
    let mut named = HashSet::new();
    let moved: IdMap<(u32, u64)> = moves
        .iter()
        .flat_map(|m| {
            m.tasks
                .iter()
                .map(move |(_, id, offset, _, _)| (id.0, (m.file, *offset)))
        })
        .collect();
    let mut enc = CheckpointEncoder::new(header);
    let to_far = moves.as_ref().map(|m| &m.to_far);
    let mut far_tasks: Vec<checkpoint::FarTask> = Vec::new();
    for task in core.tasks.iter() {
        if let (Some(&(key_hash, _)), Some(&(file, offset))) = (
            to_far.and_then(|t| t.get(&task.id.0)),
            moved.get(&task.id.0),
        ) {
            far_tasks.push(checkpoint::FarTask {
                id: task.id.0,
                key_hash,
                file,
                offset,
            });
            continue;
        }
        if let Some(t) = in_place.get(&task.id.0) {
            far_tasks.push(checkpoint::FarTask {
                id: t.id.0,
                key_hash: t.hash,
                file: t.file,
                offset: t.offset,
            });
            continue;
        }
        let in_flight = match task.state {
            TaskState::Scheduled => false,
            TaskState::Ready | TaskState::Leased => true,
            TaskState::Abandoned => continue,
        };
        let payload = match (moved.get(&task.id.0), &task.bytes) {
            (Some(&(file, offset)), _) => PayloadAt::Overflow { file, offset },
            (None, bytes) => match (core.payloads.get(bytes), bytes.on_disk()) {
                (Some(p), _) => PayloadAt::Inline(p),
                (None, Some((file, offset))) => PayloadAt::Overflow { file, offset },
                (None, None) => PayloadAt::Inline(&[]),
            },
        };
        if let PayloadAt::Overflow { file, .. } = payload {
            named.insert(file);
        }
        enc.push_task(
            task.id.0,
            task.due_ms,
            task.deliveries,
            in_flight,
            task.key(),
            payload,
        );
    }
    let far_moved: IdMap<u64> = moves
        .iter()
        .flat_map(|m| {
            m.far_moved
                .iter()
                .map(|&(_, id, _, offset, _)| (id, offset))
        })
        .collect();
    for e in core.far.iter() {
        let (file, offset) = match (far_moved.get(&e.id), moves) {
            (Some(&offset), Some(m)) => (m.file, offset),
            _ => crate::far::unpack_loc(e.loc),
        };
        far_tasks.push(checkpoint::FarTask {
            id: e.id,
            key_hash: e.hash,
            file,
            offset,
        });
    }
    for t in &far_tasks {
        named.insert(t.file);
        enc.push_far(t);
    }
    let mut dead: Vec<_> = core.dead.iter().collect();
    dead.sort_unstable_by_key(|(id, _)| **id);
    for (id, t) in dead {
        enc.push_dead(*id, t);
    }
    (enc, named)
}

fn remove_overflow_files(disk: &Disk, files: &[u32]) -> Result<usize, CheckpointError> {
    if files.is_empty() {
        return Ok(0);
    }
    let dir = disk.overflow_dir();
    for f in files {
        let path = dir.join(overflow::file_name(*f));
        match disk.storage.remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CheckpointError::Io {
                    op: "remove",
                    path,
                    source,
                })
            }
        }
    }
    disk.storage
        .sync_dir(&dir)
        .map_err(|source| CheckpointError::Io {
            op: "fsync dir",
            path: dir.clone(),
            source,
        })?;
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
                let named_files: HashSet<u32> = c
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

/// Before the engine starts on a recovered state: leftover temporary files
/// and overflow files no live task refers to (written by a checkpoint that
/// never became durable, or left by an interrupted deletion) are removed;
/// an overflow file a task refers to must exist. Returns the number the next
/// overflow file gets, and the entry count of each file kept (from its
/// header), so that compaction knows how much of a file is dead.
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
    let needed: HashSet<u32> = replay
        .tasks()
        .filter_map(|t| t.payload_at.map(|(f, _)| f))
        .chain(replay.dead_payloads_on_disk().values().map(|&(f, _)| f))
        .chain(replay.far().map(|t| t.file))
        .collect();
    let referenced: HashSet<u32> = needed
        .iter()
        .copied()
        .chain(
            checkpoint
                .iter()
                .flat_map(|c| c.named_files.iter().copied()),
        )
        .collect();
    let present: HashSet<u32> = files.iter().map(|(f, _)| *f).collect();
    if let Some(missing) = needed.iter().find(|f| !present.contains(f)) {
        return Err(OpenError::CheckpointMismatch {
            path: checkpoint.map_or_else(|| ovf_dir.clone(), |c| c.path.clone()),
            reason: format!(
                "it refers to overflow file {}, which is missing",
                ovf_dir.join(overflow::file_name(*missing)).display()
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
            // A file a task needs must read back (its header here; each
            // entry when its payload is read).
            let n = overflow::read_entry_count(
                storage,
                &ovf_dir.join(name),
                checkpoint.map(|c| &c.store_id),
                *f,
            )?;
            written.push((*f, n));
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
