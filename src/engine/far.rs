//! Far tasks in the engine (`crate::far`): finding one by key (its hash in
//! memory, its key on disk), turning one back into an ordinary task, and
//! promoting those coming within the far span into the wheel.

use super::{wall_ms, Core, Now, Shared, Status};
use crate::far::{pack_loc, unpack_loc, FarEntry, FarIndex};
use crate::overflow;
use crate::replay::LiveTask;
use crate::task::{PayloadRef, Task, TaskId, TaskState};
use crate::wheel::InsertError;
use parking_lot::MutexGuard;

/// Bytes read from an overflow file at a time by the promotion, at most:
/// a read wanting `n` entries reads `n` × [`PROMOTE_ENTRY_BYTES_GUESS`]
/// bytes, at least [`PROMOTE_CHUNK_BYTES_MIN`] (one more read follows if
/// its entries are larger), so that a pass over many files, each wanting
/// its share of [`PROMOTE_ENTRIES_MAX`], does not read a whole
/// mebibyte of each for a few hundred entries.
const PROMOTE_CHUNK_BYTES: usize = 1024 * 1024;
/// See [`PROMOTE_CHUNK_BYTES`].
const PROMOTE_CHUNK_BYTES_MIN: usize = 64 * 1024;
/// See [`PROMOTE_CHUNK_BYTES`]: an entry's 30 bytes, a 24-byte key and a
/// payload of about 70 bytes.
const PROMOTE_ENTRY_BYTES_GUESS: usize = 128;

/// The bytes one read of the promotion asks for when it wants `entries`.
fn promote_chunk_bytes(entries: usize) -> usize {
    entries
        .saturating_mul(PROMOTE_ENTRY_BYTES_GUESS)
        .clamp(PROMOTE_CHUNK_BYTES_MIN, PROMOTE_CHUNK_BYTES)
}

/// Entries the promotion holds read but not yet in the wheel, shared
/// equally among the files with far tasks due, each at least
/// [`PROMOTE_FILE_ENTRIES_MIN`] (so more in all when over 128 files are due;
/// and a file keeps what it read at a larger share while more files fall
/// due: with the 128 files a checkpoint keeps, ~128 k entries at worst). A
/// pass reads each file up to its share;
/// the tasks of all files up to the earliest (due, id) where a file stopped
/// with more due are put in the wheel in (due, id) order, in holds of the
/// lock of about [`PROMOTE_HOLD_MAX`]; the entries read after it wait for
/// the next pass (kept, not read again, unless a checkpoint moved the
/// file's cursor meanwhile).
/// Without it, every far task coming within the far span was read whole
/// (key and payload) and put in the wheel under one hold: all of a million
/// due at the same moment. (100 in unit tests.)
const PROMOTE_ENTRIES_MAX: usize = if cfg!(test) { 100 } else { 65_536 };

/// How long the promotion holds the core lock at most while putting the
/// tasks of one pass in the wheel (each costs ~0.5-1 us, mostly cache
/// misses, so 65 536 held it 27-51 ms): it then yields the lock to a waiting
/// thread (the driver, a caller) and goes on. The tail of firing after a
/// burst of tasks came back from far follows it (`examples/burst.rs`).
/// (Zero in unit tests: the lock is yielded after every task.)
const PROMOTE_HOLD_MAX: std::time::Duration = if cfg!(test) {
    std::time::Duration::ZERO
} else {
    std::time::Duration::from_millis(1)
};

/// Entries put in the wheel between two looks at the clock for
/// [`PROMOTE_HOLD_MAX`]. (1 in unit tests.)
const PROMOTE_HOLD_CHECK_ENTRIES: usize = if cfg!(test) { 1 } else { 256 };

/// Entries one pass reads from each file at least, however many files are
/// due (each gets an equal share of [`PROMOTE_ENTRIES_MAX`]). (10 in unit
/// tests.)
const PROMOTE_FILE_ENTRIES_MIN: usize = if cfg!(test) { 10 } else { 512 };

/// A file's entries read by [`Shared::promote_far`] but not yet promoted.
struct Carried {
    /// The overflow file's number.
    file: u32,
    /// The file's cursor as the last pass left it (where `entries` begin).
    at: FarCursor,
    /// Entries read, in file order, from `at` on.
    entries: std::collections::VecDeque<(u64, overflow::Entry)>,
    /// Where reading goes on (after the last of `entries`).
    read_end: FarCursor,
    /// (due, id) of the last entry read.
    last: Option<(u64, u64)>,
}

impl Carried {
    fn at(file: u32, cursor: FarCursor) -> Carried {
        Carried {
            file,
            at: cursor,
            entries: Default::default(),
            read_end: cursor,
            last: None,
        }
    }

    /// Adds entries read after the others, keeping them in strictly
    /// increasing (due, id) order. An entry that is not after the greatest
    /// read before it (the file is damaged: the writer sorts every file)
    /// is gone past if no far task owns it (`owned(offset, entry)`, asked
    /// only then: a cancelled task's, a near task's payload — read by
    /// offset, never by the promotion): `Ok(n)`, the number gone past.
    /// `Err((offset, task id))` for one a far task owns: placing it would
    /// break the order the passes rely on (an entry held back behind the
    /// cutoff could wait behind itself for ever), and `kairos verify`
    /// reports such a far task as damaged ([`overflow::walk_far_entries`]).
    fn take(
        &mut self,
        got: Vec<(u64, overflow::Entry)>,
        mut owned: impl FnMut(u64, &overflow::Entry) -> bool,
    ) -> Result<u64, (u64, u64)> {
        let mut skipped = 0;
        for (offset, entry) in got {
            let order = (entry.due_ms, entry.task_id);
            if self.last.is_some_and(|last| order <= last) {
                if owned(offset, &entry) {
                    return Err((offset, entry.task_id));
                }
                tracing::warn!(
                    file = %overflow::file_name(self.file),
                    offset,
                    task = entry.task_id,
                    "an overflow entry out of (due time, task id) order that no far task \
                     needs is skipped"
                );
                skipped += 1;
                continue;
            }
            self.last = Some(order);
            self.entries.push_back((offset, entry));
        }
        Ok(skipped)
    }
}

/// Where a cancel found its task ([`Shared::locate_for_cancel`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Located {
    /// In the slab (and the wheel or a queue, or held by a consumer): its
    /// index entry as the lookup found it, so that a cancel removes it
    /// without a second probe ([`crate::index::TaskIndex::remove_found`]).
    Slot(crate::index::Found),
    /// A far task: its entry in the far index, and the entry's position
    /// there when found (valid until the index next changes).
    Far { pos: usize, entry: FarEntry },
}

/// Overflow entries of far tasks read ahead without the engine's lock, by
/// (packed location, task id), in that order: see
/// [`Shared::lock_reading_far`]. Empty — no allocation to make or free — for
/// the calls that match no far task, nearly all of them.
#[derive(Debug, Default)]
pub(super) struct FarReads(Vec<((u64, u64), Result<overflow::Entry, String>)>);

impl FarReads {
    /// The read of the entry at packed location `loc` for task `id`, if
    /// one was made (`Err`: it failed). O(log n): a binary search.
    fn get(&self, loc: u64, id: u64) -> Option<&Result<overflow::Entry, String>> {
        let at = self.0.binary_search_by_key(&(loc, id), |(k, _)| *k).ok()?;
        Some(&self.0[at].1)
    }
}

/// What [`Shared::promote_at_open`] found: the tasks promoted, the cursors,
/// a read failure, if any, and the damaged entries no far task needed that
/// it went past.
pub(super) type PromotedAtOpen = (
    Vec<(u64, LiveTask)>,
    std::collections::BTreeMap<u32, FarCursor>,
    Option<String>,
    u64,
);

/// Where the promotion stands in one overflow file holding far tasks.
#[derive(Debug, Clone, Copy)]
pub(super) struct FarCursor {
    /// Byte offset of the next entry to read.
    pub offset: u64,
    /// Its due time, UTC ms (0: not known yet — read it).
    pub next_due_ms: u64,
    /// The engine-wide count of cursor resets when a checkpoint last reset
    /// this one (new far tasks in the file): a promotion that read the file
    /// meanwhile must not move the reset cursor past them, even if it
    /// started at the same offset.
    pub generation: u32,
}

impl FarCursor {
    /// Whether `other` is this cursor, not moved or reset since.
    fn same_place(&self, other: &FarCursor) -> bool {
        self.offset == other.offset && self.generation == other.generation
    }

    /// A cursor at the start of a file.
    pub fn start() -> FarCursor {
        FarCursor {
            offset: overflow::HEADER_BYTES as u64,
            next_due_ms: 0,
            generation: 0,
        }
    }
}

impl Shared {
    /// The far task whose key is `key`, with its overflow entry, if any.
    /// Reads one overflow entry per task whose key hash matches (almost
    /// always just the task sought). Called with the core lock held.
    ///
    /// `Err`: an entry could not be read or is damaged — durable data is
    /// unreadable; the caller poisons the engine.
    pub(super) fn find_far(
        &self,
        core: &Core,
        key: &[u8],
        reads: &FarReads,
    ) -> Result<Option<(usize, overflow::Entry)>, String> {
        if core.far.is_empty() {
            return Ok(None);
        }
        let Some(disk) = &self.disk else {
            return Ok(None);
        };
        let hash = core.hasher.hash(key);
        for pos in core.far.candidates(hash) {
            let e = core.far.get(pos);
            let entry = match reads.get(e.loc, e.id) {
                Some(Ok(entry)) => entry.clone(),
                // Read ahead and failed: the far task is still there, so
                // the failure stands (never retried into a success).
                Some(Err(cause)) => return Err(cause.clone()),
                // Not read ahead (a checkpoint, or a move between
                // checkpoints, moved it meanwhile): read under the lock.
                None => {
                    let (file, offset) = unpack_loc(e.loc);
                    disk.overflow_file(file)
                        .and_then(|f| f.read(offset, e.id, None))
                        .map_err(|err| unreadable(&format!("far task {}", e.id), &err))?
                }
            };
            if *entry.key == *key {
                return Ok(Some((pos, entry)));
            }
        }
        Ok(None)
    }

    /// Takes the engine's lock with the reads of [`Shared::lock_reading_far`]: a
    /// read that failed for a far task still at that place poisons the
    /// engine (durable data unreadable), whether or not the call needs that
    /// task, and its cause is returned — unless the engine stopped while
    /// the reads were made (a shutdown under way, its tasks not yet
    /// released): the lock is then returned for the caller to answer
    /// `Closed` (or the poisoning that came first), as it would a moment
    /// later, and a closed engine is not turned poisoned.
    pub(super) fn lock_with(&self, reads: &FarReads) -> Result<MutexGuard<'_, Core>, String> {
        let mut core = self.core.lock();
        if core.status != Status::Open {
            return Ok(core);
        }
        let failed = reads.0.iter().find_map(|&((loc, id), ref read)| {
            let cause = read.as_ref().err()?;
            let (file, offset) = unpack_loc(loc);
            let still = core
                .far
                .find_by_place(pack_loc(file, offset)?, id)
                .is_some();
            still.then(|| cause.clone())
        });
        if let Some(cause) = failed {
            self.poison_locked(&mut core, cause.clone());
            return Err(cause);
        }
        Ok(core)
    }

    /// Takes the engine's lock for a call naming `keys`, with the overflow
    /// entries of the far tasks whose key hash matches one of them read
    /// without the lock, so that the caller tells them apart by key without
    /// disk I/O under the lock. Under the lock, the far index is looked up
    /// for every key; if any matched, the lock is let go, their entries are
    /// read, and it is taken again (an entry a checkpoint moved meanwhile is
    /// read under the lock by [`Shared::find_far`]). A call whose keys match
    /// no far task — a schedule of new keys, almost always — takes the lock
    /// once.
    ///
    /// Entries are never rewritten in place (a file is written once; a
    /// moved task gets a new file number), so an entry read here is still
    /// right later if the far task is still at that place. A failed read is
    /// kept: it is reported (and poisons the engine) if the far task is
    /// still at that place once the lock is taken ([`Shared::lock_with`]).
    ///
    /// Returns the guard, the entries read, and whether any key may be a far
    /// task's: `false` only if no key's hash matched under the hold
    /// returned.
    pub(super) fn lock_reading_far<'k>(
        &self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<(MutexGuard<'_, Core>, FarReads, bool), String> {
        // Nothing read yet: no failed read to check on this first hold.
        let core = self.core.lock();
        if core.far.is_empty() || self.disk.is_none() {
            return Ok((core, FarReads::default(), false));
        }
        self.reading_far(core, keys)
    }

    /// [`Shared::lock_reading_far`] from the hold `core` once it is known
    /// that the engine has far tasks (and a disk).
    pub(super) fn reading_far<'s, 'k>(
        &'s self,
        core: MutexGuard<'s, Core>,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<(MutexGuard<'s, Core>, FarReads, bool), String> {
        let mut wanted: Vec<(u64, u64)> = Vec::new();
        for key in keys {
            let hash = core.hasher.hash(key);
            wanted.extend(core.far.candidates(hash).map(|pos| {
                let e = core.far.get(pos);
                (e.loc, e.id)
            }));
        }
        if wanted.is_empty() {
            return Ok((core, FarReads::default(), false));
        }
        drop(core);
        let mut reads = FarReads::default();
        self.read_far_entries(&mut reads, wanted);
        Ok((self.lock_with(&reads)?, reads, true))
    }

    /// Reads the overflow entries `wanted` (packed location, task id) into
    /// `reads` (empty), without the engine's lock.
    fn read_far_entries(&self, reads: &mut FarReads, mut wanted: Vec<(u64, u64)>) {
        debug_assert!(reads.0.is_empty(), "reads are filled once, in order");
        let Some(disk) = &self.disk else {
            return;
        };
        // In file order (a location's top bits are its file), each file
        // opened once; a key named twice is read once (a failure is not
        // retried).
        wanted.sort_unstable();
        wanted.dedup();
        let mut open: Option<(u32, Result<std::sync::Arc<overflow::EntryFile>, String>)> = None;
        for (loc, id) in wanted {
            let (file, offset) = unpack_loc(loc);
            let opened = match open.take() {
                Some((f, opened)) if f == file => opened,
                _ => disk.overflow_file(file).map_err(|err| err.to_string()),
            };
            let read = match &opened {
                Ok(f) => f
                    .read(offset, id, None)
                    .map_err(|err| unreadable(&format!("far task {id}"), &err)),
                Err(err) => Err(format!("cannot read far task {id}: {err}")),
            };
            // `wanted` is sorted and without repeats: so is `reads`.
            reads.0.push(((loc, id), read));
            open = Some((file, opened));
        }
    }

    /// The slot of the live task with `key`, wherever it is: a far task is
    /// first made an ordinary one (in the slab and the wheel). `Err` as
    /// [`Shared::find_far`].
    pub(super) fn locate(
        &self,
        core: &mut Core,
        key: &[u8],
        reads: &FarReads,
    ) -> Result<Option<u32>, String> {
        let tag = core.key_tag(key);
        if let Some(slot) = core.find_slot(tag, key) {
            return Ok(Some(slot));
        }
        match self.find_far(core, key, reads)? {
            None => Ok(None),
            Some((pos, entry)) => Ok(self.unfar(core, pos, entry, self.now())),
        }
    }

    /// Where the live task with `key` is, for a cancel: its slab slot, or
    /// — a far task — its far-index entry, left where it is (a cancel takes
    /// it out of the far index directly, without putting it back in the
    /// slab and the wheel first). Poisons the engine if a far task's entry
    /// cannot be read (the cause is returned). `tag` is the key's
    /// ([`Core::key_tag`]).
    pub(super) fn locate_for_cancel(
        &self,
        core: &mut Core,
        key: &[u8],
        tag: u32,
        reads: &FarReads,
    ) -> Result<Option<Located>, String> {
        if let Some(found) = core.find_entry(tag, key) {
            return Ok(Some(Located::Slot(found)));
        }
        match self.find_far(core, key, reads) {
            Ok(found) => Ok(found.map(|(pos, _)| Located::Far {
                pos,
                entry: core.far.get(pos),
            })),
            Err(cause) => {
                self.poison_locked(core, cause.clone());
                Err(cause)
            }
        }
    }

    /// Takes the far task `e` out of the far index, once its cancel is
    /// logged: it is forgotten like a cancelled task in the slab (its
    /// overflow entry is dead; the file goes when nothing refers to it).
    /// `pos` is where [`Shared::locate_for_cancel`] found it: still right
    /// unless the index changed since (another cancel of the same call may
    /// have rebuilt its shard), in which case it is looked up again. Counts
    /// in [`crate::Stats::tasks_cancelled`].
    pub(super) fn drop_far(&self, core: &mut Core, pos: usize, e: FarEntry) {
        core.totals.tasks_cancelled += 1;
        let pos = if core.far.entry_at(pos) == Some(e) {
            Some(pos)
        } else {
            core.far.find(e.hash, e.loc, e.id)
        };
        // Found under the same hold of the lock that logged the cancel.
        debug_assert!(pos.is_some(), "cancelled far task {} not found", e.id);
        if let Some(pos) = pos {
            core.far.remove(pos);
        }
    }

    /// [`Shared::locate`], poisoning the engine if a far task's entry
    /// cannot be read (the cause is returned).
    pub(super) fn locate_or_poison(
        &self,
        core: &mut Core,
        key: &[u8],
        reads: &FarReads,
    ) -> Result<Option<u32>, String> {
        self.locate(core, key, reads)
            .inspect_err(|cause| self.poison_locked(core, cause.clone()))
    }

    /// Whether a far task has `key`, poisoning the engine if its entry
    /// cannot be read (the cause is returned).
    pub(super) fn far_key_or_poison(
        &self,
        core: &mut Core,
        key: &[u8],
        reads: &FarReads,
    ) -> Result<bool, String> {
        match self.find_far(core, key, reads) {
            Ok(found) => Ok(found.is_some()),
            Err(cause) => {
                self.poison_locked(core, cause.clone());
                Err(cause)
            }
        }
    }

    /// Moves far task `pos` (whose entry is `entry`) into the slab and the
    /// wheel (or the overdue queue if it is due); returns its slot. Its
    /// payload is kept in memory if it is due within the payload window,
    /// otherwise it stays on disk where it is.
    pub(super) fn unfar(
        &self,
        core: &mut Core,
        pos: usize,
        entry: overflow::Entry,
        now: Now,
    ) -> Option<u32> {
        let e = core.far.get(pos);
        if e.id != entry.task_id {
            return None;
        }
        let slot = core.tasks.vacant_slot()?;
        core.far.remove(pos)?;
        let (file, offset) = unpack_loc(e.loc);
        let window_end = self.config.payload_window.map_or(u64::MAX, |w| {
            wall_ms(now).saturating_add(w.as_millis() as u64)
        });
        let bytes = if entry.due_ms <= window_end {
            core.payloads_read_back += 1;
            core.payloads.put(&entry.key, &entry.payload)
        } else {
            core.payloads.put_on_disk(&entry.key, file, offset, true)
        };
        self.insert_waiting(core, TaskId(e.id), &entry.key, bytes, entry.due_ms, now);
        core.far_promoted += 1;
        Some(slot)
    }

    /// Puts a waiting task (first attempt) in the slab, the index and the
    /// wheel, or the overdue queue if its tick has passed.
    fn insert_waiting(
        &self,
        core: &mut Core,
        id: TaskId,
        key: &[u8],
        bytes: PayloadRef,
        due_ms: u64,
        now: Now,
    ) {
        let Some(slot) = core.tasks.vacant_slot() else {
            core.payloads.release(bytes);
            return;
        };
        // Mapped by the clocks of now, but not rounded to "due at once" when
        // it is past: a task whose tick the wheel has not reached yet (the
        // clock jumped past it in one step) still expires in due order with
        // the others in this driver pass; only one due before the wheel's
        // last tick goes to the overdue queue.
        let due_tick = self.mapped_tick(due_ms, now);
        let placed = core.wheel.insert(due_tick, slot);
        let task = Task {
            id,
            bytes,
            due_ms,
            state: TaskState::Scheduled,
            deliveries: 0,
            timer: placed.ok(),
            // The backlog below, if the wheel refuses it.
            in_backlog: matches!(placed, Err(InsertError::TooFar | InsertError::Full)),
        };
        core.insert_task(task, core.key_tag(key));
        match placed {
            Ok(_) => {}
            Err(InsertError::Elapsed) => core.push_overdue(slot, id),
            Err(e) => {
                // Out of the wheel's range or full: ruled out by delay_max
                // and pending_tasks_max. Never early: the backlog entry is
                // handed out when the driver gets to it.
                tracing::error!(?id, ?e, "wheel refused a promoted task");
                core.backlog.push_back((slot, id));
            }
        }
        self.driver_cv.notify_all();
    }

    /// At open: takes out of `far` the far tasks due within the far span
    /// (every file read sequentially up to the first entry beyond it), as
    /// live tasks to place with the others — the overdue ones join the
    /// catch-up backlog in due order. Without a horizon (far tasks turned
    /// off since a checkpoint made some) every far task is taken: nothing
    /// would promote them later. Returns them and the promotion cursor of
    /// each file still holding far tasks; `Err` if a file cannot be read
    /// (the caller poisons the engine).
    pub(super) fn promote_at_open(
        &self,
        far: &mut FarIndex,
        hasher: &crate::far::KeyHasher,
        now: Now,
    ) -> PromotedAtOpen {
        let mut out = Vec::new();
        let mut cursors = std::collections::BTreeMap::new();
        let mut skipped = 0;
        let Some(disk) = &self.disk else {
            for f in far.files() {
                cursors.insert(f, FarCursor::start());
            }
            return (out, cursors, None, 0);
        };
        let until = self.config.far_span().map_or(u64::MAX, |horizon| {
            wall_ms(now).saturating_add(horizon.as_millis() as u64)
        });
        let storage = disk.storage.as_ref();
        let files: Vec<u32> = far.files().collect();
        for file in files {
            let path = disk.overflow_dir().join(overflow::file_name(file));
            let mut cursor = FarCursor::start();
            loop {
                let read =
                    overflow::read_due(storage, &path, cursor.offset, until, PROMOTE_CHUNK_BYTES);
                let overflow::DueEntries {
                    entries,
                    next,
                    next_due_ms: next_due,
                } = match read {
                    Ok(r) => r,
                    Err(e @ overflow::OverflowReadError::Corrupt { offset, .. })
                        if offset == cursor.offset.max(overflow::HEADER_BYTES as u64) =>
                    {
                        // As `promote_far_now`: past an entry no far task needs.
                        let first = far.first_live_in_file_from(file, offset);
                        match past_damage(file, offset, first, &e) {
                            Ok(next) => {
                                skipped += 1;
                                cursor = next;
                                if cursor.next_due_ms == u64::MAX {
                                    break;
                                }
                                continue;
                            }
                            Err(cause) => return (out, cursors, Some(cause), skipped),
                        }
                    }
                    Err(e) => {
                        return (
                            out,
                            cursors,
                            Some(format!("cannot promote far tasks: {e}")),
                            skipped,
                        )
                    }
                };
                for (offset, entry) in entries {
                    let Some(loc) = pack_loc(file, offset) else {
                        continue;
                    };
                    let Some(pos) = far.find(hasher.hash(&entry.key), loc, entry.task_id) else {
                        continue;
                    };
                    far.remove(pos);
                    out.push((
                        entry.task_id,
                        LiveTask {
                            key: entry.key.into(),
                            payload: Box::default(),
                            payload_at: Some((file, offset)),
                            due_ms: entry.due_ms,
                            deliveries: 0,
                            in_flight: false,
                            last_error: Box::default(),
                        },
                    ));
                }
                cursor = FarCursor {
                    offset: next,
                    next_due_ms: next_due.unwrap_or(u64::MAX).max(1),
                    generation: 0,
                };
                if next_due.is_none_or(|d| d > until) {
                    break;
                }
            }
            let left = far.live_in_file(file);
            if left > 0 && cursor.next_due_ms == u64::MAX {
                // Read to its end, and far tasks said to be in it were not
                // (truncated, or an entry whose key does not hash to its far
                // task's): they would never fire.
                return (out, cursors, Some(missing_far_tasks(file, left)), skipped);
            }
            if left > 0 {
                cursors.insert(file, cursor);
            }
        }
        (out, cursors, None, skipped)
    }

    /// Whether the driver thread promotes far tasks itself: when no
    /// prefetch thread runs (it does otherwise, off the driver's path).
    pub(super) fn driver_promotes(&self) -> bool {
        !(self.config.payload_prefetch && self.config.payload_window.is_some())
    }

    /// The wall time (UTC ms) before which nothing needs promoting, if any
    /// far task waits: the earliest next due time of the files' cursors,
    /// less the far span.
    pub(super) fn next_promotion_ms(&self, core: &Core) -> Option<u64> {
        let horizon_ms = self.config.far_span()?.as_millis() as u64;
        if core.stop || core.check_open().is_err() {
            return None;
        }
        core.far_cursors
            .values()
            .map(|c| c.next_due_ms.saturating_sub(horizon_ms))
            .min()
    }

    /// The earliest due time (UTC ms) of a far task not yet promoted, if
    /// any: the smallest of the files' cursors.
    pub(super) fn next_far_due_ms(&self, core: &Core) -> Option<u64> {
        core.far_cursors.values().map(|c| c.next_due_ms).min()
    }

    /// [`Shared::promote_far_now`], one promotion at a time: a second caller
    /// (the driver finding far tasks already due while the prefetch thread
    /// promotes, or the other way round) waits for the first to end, then
    /// promotes what is left. Takes and returns the core lock.
    pub(super) fn promote_far<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
    ) -> MutexGuard<'a, Core> {
        while core.promoting {
            if core.stop {
                return core;
            }
            self.promote_cv.wait(&mut core);
        }
        /// Clears `Core::promoting` if the promotion unwinds (its guard of
        /// the lock is gone by then); disarmed on return, where the lock is
        /// held and cleared below.
        struct Unwinding<'s> {
            shared: &'s Shared,
            armed: bool,
        }
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if self.armed {
                    self.shared.core.lock().promoting = false;
                    self.shared.promote_cv.notify_all();
                }
            }
        }
        core.promoting = true;
        let mut unwinding = Unwinding {
            shared: self,
            armed: true,
        };
        let mut core = self.promote_far_now(core);
        unwinding.armed = false;
        drop(unwinding);
        core.promoting = false;
        self.promote_cv.notify_all();
        core
    }

    /// Promotes every far task due within the far span from now into the
    /// wheel: reads each overflow file holding far tasks sequentially from
    /// where it stopped, up to the first entry beyond the far span, without
    /// the lock; then, under it (yielded to waiting threads about every
    /// [`PROMOTE_HOLD_MAX`]), moves the tasks still far (not cancelled or
    /// rescheduled meanwhile) into the wheel in (due time, id) order across
    /// files — the order an open would place them in. Takes and returns the
    /// core lock. A read failure poisons the engine: far tasks that cannot
    /// be read back would never fire. Only through [`Shared::promote_far`].
    fn promote_far_now<'a>(&'a self, mut core: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        let (Some(disk), Some(horizon)) = (&self.disk, self.config.far_span()) else {
            return core;
        };
        let horizon_ms = horizon.as_millis() as u64;
        // Entries read but not yet promoted, by file: kept from one pass to
        // the next while the file's cursor stays where the last pass left it.
        let mut carried: std::collections::HashMap<u32, Carried> = Default::default();
        loop {
            if core.stop || core.check_open().is_err() {
                return core;
            }
            let now = self.now();
            let until = wall_ms(now).saturating_add(horizon_ms);
            let due: Vec<(u32, FarCursor)> = core
                .far_cursors
                .iter()
                .filter(|(_, c)| c.next_due_ms <= until)
                .map(|(&f, &c)| (f, c))
                .collect();
            if due.is_empty() {
                return core;
            }
            // Lowered by every checkpoint that makes tasks far (or moves
            // far ones) from now on; only the promotion under way (one at
            // a time: `Core::promoting`) resets it.
            core.far_reset_due_min = u64::MAX;
            drop(core);
            // A checkpoint may have moved a cursor meanwhile: what was read
            // from where it was is read again from where it is.
            carried.retain(|f, c| {
                due.iter()
                    .any(|(file, cursor)| file == f && c.at.same_place(cursor))
            });
            let storage = disk.storage.as_ref();
            let per_file = (PROMOTE_ENTRIES_MAX / due.len()).max(PROMOTE_FILE_ENTRIES_MIN);
            let mut moved: Vec<(u32, FarCursor, FarCursor)> = Vec::new();
            let mut failed = None;
            // The earliest (due, id) at which a file's reading stopped with
            // more due: entries after it wait for the next pass, so that
            // tasks go in the wheel in (due, id) order across files.
            let mut cutoff: Option<(u64, u64)> = None;
            for &(file, start) in &due {
                let path = disk.overflow_dir().join(overflow::file_name(file));
                let c = carried
                    .entry(file)
                    .or_insert_with(|| Carried::at(file, start));
                while c.entries.len() < per_file && c.read_end.next_due_ms <= until {
                    let read = overflow::read_due_at_most(
                        storage,
                        &path,
                        c.read_end.offset,
                        until,
                        promote_chunk_bytes(per_file - c.entries.len()),
                        per_file - c.entries.len(),
                    );
                    let overflow::DueEntries {
                        entries: got,
                        next,
                        next_due_ms: next_due,
                    } = match read {
                        Ok(r) => r,
                        Err(e @ overflow::OverflowReadError::Corrupt { offset, .. })
                            if offset == c.read_end.offset =>
                        {
                            // Damage where this read began: an entry no far
                            // task needs any more (cancelled, promoted,
                            // moved) is gone past, to the next one a far
                            // task does need.
                            let mut locked = self.core.lock();
                            let first = locked.far.first_live_in_file_from(file, offset);
                            let past = past_damage(file, offset, first, &e);
                            if past.is_ok() {
                                locked.overflow_damage_skipped += 1;
                            }
                            drop(locked);
                            match past {
                                Ok(next) => {
                                    c.read_end = FarCursor {
                                        generation: start.generation,
                                        ..next
                                    };
                                    continue;
                                }
                                Err(cause) => {
                                    failed = Some((file, start, cause));
                                    break;
                                }
                            }
                        }
                        Err(e) => {
                            failed = Some((file, start, format!("cannot promote far tasks: {e}")));
                            break;
                        }
                    };
                    let got_none = got.is_empty();
                    let owned = |offset: u64, entry: &overflow::Entry| {
                        self.core.lock().far_owner(file, offset, entry).is_some()
                    };
                    match c.take(got, owned) {
                        Ok(0) => {}
                        Ok(skipped) => self.core.lock().overflow_damage_skipped += skipped,
                        Err((offset, id)) => {
                            failed = Some((
                                file,
                                start,
                                format!(
                                    "cannot promote far tasks: overflow file {} has the entry \
                                     of far task {id} out of (due time, task id) order at \
                                     offset {offset} (`kairos salvage` lists the tasks whose \
                                     entries are damaged)",
                                    overflow::file_name(file)
                                ),
                            ));
                            break;
                        }
                    }
                    c.read_end = FarCursor {
                        offset: next,
                        next_due_ms: next_due.unwrap_or(u64::MAX).max(1),
                        generation: start.generation,
                    };
                    if got_none && c.read_end.next_due_ms <= until {
                        // Nothing read, yet the next entry is said to be due.
                        failed = Some((
                            file,
                            start,
                            format!(
                                "cannot promote far tasks: overflow file {} reads no entry \
                                 at offset {next}",
                                overflow::file_name(file)
                            ),
                        ));
                        break;
                    }
                }
                if failed.is_some() {
                    break;
                }
                if c.read_end.next_due_ms <= until {
                    if let Some(last) = c.last {
                        cutoff = Some(cutoff.map_or(last, |cut| cut.min(last)));
                    }
                }
            }
            // The entries up to the cutoff, from every file read; each
            // file's cursor stops at the first it keeps.
            let mut entries: Vec<(u32, u64, overflow::Entry)> = Vec::new();
            if failed.is_none() {
                for &(file, start) in &due {
                    let Some(c) = carried.get_mut(&file) else {
                        continue;
                    };
                    while let Some((offset, entry)) = c.entries.pop_front() {
                        if cutoff.is_some_and(|cut| (entry.due_ms, entry.task_id) > cut) {
                            c.entries.push_front((offset, entry));
                            break;
                        }
                        entries.push((file, offset, entry));
                    }
                    c.at = match c.entries.front() {
                        Some((offset, entry)) => FarCursor {
                            offset: *offset,
                            next_due_ms: entry.due_ms.max(1),
                            generation: start.generation,
                        },
                        None => c.read_end,
                    };
                    moved.push((file, start, c.at));
                }
            }
            entries.sort_unstable_by_key(|(_, _, e)| (e.due_ms, e.task_id));
            core = self.core.lock();
            // Stopped meanwhile (a shutdown waits for this pass): nothing
            // is applied, and a failed read does not turn a closed engine
            // poisoned — the far tasks stay where they are on disk.
            if core.stop || core.check_open().is_err() {
                return core;
            }
            let mut held_since = std::time::Instant::now();
            if let Some((file, start, cause)) = failed {
                // A checkpoint may have compacted the file meanwhile (its far
                // tasks moved to the new file, their cursor dropped or reset)
                // and deleted it: the read is then moot, and the next pass
                // reads from the cursors as they are now. Otherwise durable
                // data is unreadable.
                let moot = core
                    .far_cursors
                    .get(&file)
                    .is_none_or(|c| c.offset != start.offset || c.generation != start.generation);
                if !moot {
                    self.poison_locked(&mut core, cause);
                    return core;
                }
            }
            let mut now = now;
            // A checkpoint that made far tasks due by `until` (a compaction
            // moving a file's far tasks to a new file, mostly) since this
            // pass took its cursors — while it read, or while the lock was
            // yielded below — ends the pass: those tasks would otherwise go
            // in the wheel after the other files' tasks due at the same
            // time, out of (due, id) order. Tasks made far due later (a
            // relocation's, beyond the far span) do not concern it.
            let mut interrupted = core.far_reset_due_min <= until;
            let mut pending = entries.into_iter();
            let mut unchecked = 0;
            while !interrupted {
                unchecked += 1;
                if unchecked == PROMOTE_HOLD_CHECK_ENTRIES {
                    unchecked = 0;
                }
                if unchecked == 0 && held_since.elapsed() >= PROMOTE_HOLD_MAX {
                    // Let waiting threads in before putting in the rest:
                    // callers scheduling, cancelling (which makes its task's
                    // `find` fail below), acking, and the driver handing out
                    // what fell due when this is the prefetch thread (when
                    // it is the driver, hand-outs wait for the whole pass).
                    note_hold(&mut core, held_since);
                    #[cfg(test)]
                    if let Some(hook) = self.promote_yield_hook.lock().as_mut() {
                        MutexGuard::unlocked(&mut core, || hook(self));
                    }
                    MutexGuard::bump(&mut core);
                    if core.stop || core.check_open().is_err() {
                        // The cursors stay where this pass began: the tasks
                        // promoted already are no longer far, and a later
                        // read skips them.
                        return core;
                    }
                    now = self.now();
                    held_since = std::time::Instant::now();
                    interrupted = core.far_reset_due_min <= until;
                    if interrupted {
                        break;
                    }
                }
                let Some((file, offset, entry)) = pending.next() else {
                    break;
                };
                if let Some(pos) = core.far_owner(file, offset, &entry) {
                    self.unfar(&mut core, pos, entry, now);
                }
            }
            if interrupted {
                // The cursors stay where this pass began; what it read and
                // did not put in the wheel is kept for the next pass, which
                // reads again only the files whose cursor the checkpoint
                // moved (those promoted already are no longer far: the next
                // pass skips them).
                #[cfg(test)]
                {
                    core.promote_interrupts += 1;
                }
                let rest: Vec<_> = pending.collect();
                for (file, offset, entry) in rest.into_iter().rev() {
                    if let Some(c) = carried.get_mut(&file) {
                        c.entries.push_front((offset, entry));
                    }
                }
                for (file, start) in &due {
                    if let Some(c) = carried.get_mut(file) {
                        c.at = *start;
                    }
                }
                note_hold(&mut core, held_since);
                continue;
            }
            // A checkpoint may have moved a file's far tasks meanwhile (and
            // reset or removed its cursor): only a cursor still where this
            // read started moves on.
            let c = &mut *core;
            let mut missing = None;
            for (file, start, end) in moved {
                if let Some(cur) = c.far_cursors.get_mut(&file) {
                    if cur.offset == start.offset && cur.generation == start.generation {
                        let left = c.far.live_in_file(file);
                        if left > 0 && end.next_due_ms != u64::MAX {
                            *cur = end;
                        } else {
                            c.far_cursors.remove(&file);
                            if left > 0 {
                                // Read to its end (every entry read was due
                                // within the far span and is promoted now),
                                // yet far tasks said to be in it are not.
                                missing.get_or_insert(missing_far_tasks(file, left));
                            }
                        }
                    }
                }
            }
            if let Some(cause) = missing {
                self.poison_locked(&mut core, cause);
                return core;
            }
            note_hold(&mut core, held_since);
        }
    }
}

/// Why `what` (a task's payload, a far task) cannot be read from its overflow
/// entry: the read's error, and for damage (not an I/O error) the way out —
/// an operator's `kairos salvage`, which lists and can discard such tasks.
pub(super) fn unreadable(what: &str, err: &overflow::OverflowReadError) -> String {
    match err {
        overflow::OverflowReadError::Corrupt { .. } => format!(
            "cannot read {what}: {err} (`kairos salvage` lists the tasks whose entries are \
             damaged)"
        ),
        _ => format!("cannot read {what}: {err}"),
    }
}

impl Core {
    /// Where in the far index the far task that owns `entry` — read at
    /// `offset` of overflow file `file` — is (a position for
    /// [`FarIndex::remove`]), or `None` if no far task does: the entry is a
    /// cancelled, promoted or moved task's, or a near task's payload. Found
    /// by the hash of the entry's key, its place and its task id. O(1)
    /// expected (one far-index lookup).
    fn far_owner(&self, file: u32, offset: u64, entry: &overflow::Entry) -> Option<usize> {
        let loc = pack_loc(file, offset)?;
        self.far
            .find(self.hasher.hash(&entry.key), loc, entry.task_id)
    }
}

/// Where the promotion reads on after finding the entry at `offset` of
/// overflow file `file` damaged, given the
/// first live far task of that file at or after `offset` (`first`: its
/// entry's offset and task id, [`FarIndex::first_live_in_file_from`]);
/// `error`: that read's.
///
/// A far task whose own entry is damaged cannot be promoted: `Err`, the
/// cause that poisons the engine, naming the file, the offset and the
/// task (`kairos salvage` cancels such tasks). An entry no far task needs
/// — its task cancelled, promoted or moved since the file was written, or
/// a near task's payload (read on its own when that task is delivered) —
/// is gone past: the reading goes on at the next far task's entry (entries
/// between are no far task's either), with its due time not known yet
/// (`next_due_ms` 0: read it), or ends when no far task is left after the
/// damage (`next_due_ms` `u64::MAX`; far tasks left before it are then
/// reported missing, as at any file's end). Each skip is logged (WARN).
fn past_damage(
    file: u32,
    offset: u64,
    first: Option<(u64, u64)>,
    error: &overflow::OverflowReadError,
) -> Result<FarCursor, String> {
    match first {
        Some((at, id)) if at == offset => Err(format!(
            "cannot promote far tasks: {error} (the entry of far task {id}; `kairos salvage` \
             lists the tasks whose entries are damaged)"
        )),
        next => {
            tracing::warn!(
                file = %overflow::file_name(file),
                offset,
                %error,
                "a damaged overflow entry that no far task needs is skipped"
            );
            Ok(match next {
                Some((at, _)) => FarCursor {
                    offset: at,
                    next_due_ms: 0,
                    generation: 0,
                },
                None => FarCursor {
                    offset,
                    next_due_ms: u64::MAX,
                    generation: 0,
                },
            })
        }
    }
}

/// Counts a hold of the engine's lock by the promotion, taken at `since`,
/// in [`crate::Stats::promotion_hold_max`].
fn note_hold(core: &mut Core, since: std::time::Instant) {
    core.promotion_hold_max = core.promotion_hold_max.max(since.elapsed());
}

/// Why `left` far tasks of overflow file `file` cannot be promoted: the file
/// was read to its end without finding their entries.
fn missing_far_tasks(file: u32, left: u64) -> String {
    format!(
        "cannot promote far tasks: overflow file {} ends without the entries of {left} far \
         task(s) it should hold (truncated, or a key that does not hash to its far task's)",
        overflow::file_name(file)
    )
}

#[cfg(test)]
mod tests {
    use crate::engine::counting::{Counting, Seen};
    use crate::{Config, Due, Durability, Engine, ManualClock};
    use kairos_wal::storage::Storage;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    const START_MS: u64 = 1_700_000_000_000;
    /// Due time of the first far task: beyond the one-hour horizon.
    const FIRST_DUE: u64 = START_MS + 2 * 3_600_000;

    /// An engine on `sim` with a one-hour horizon (all of it resident) and
    /// the driver promoting.
    fn engine(sim: &kairos_wal::SimStorage, clock: &ManualClock) -> Engine {
        engine_on(Arc::new(sim.clone()), clock)
    }

    /// [`engine`] on any storage.
    fn engine_on(storage: Arc<dyn Storage>, clock: &ManualClock) -> Engine {
        let config = Config {
            durability: Durability::Sync,
            horizon: Some(Duration::from_secs(3600)),
            payload_window: Some(Duration::from_secs(60)),
            resident_window: None,
            payload_prefetch: false,
            ..Config::default()
        };
        Engine::open_with("/kairos", config, storage, Arc::new(clock.clone())).unwrap()
    }

    /// Schedules `n` tasks `{prefix}-{i:03}` (payload: the key) due at
    /// `FIRST_DUE + i % 30` ms, then takes a checkpoint: one overflow file
    /// of far tasks. Appends (due, key) to `scheduled`, in schedule order.
    fn one_file(engine: &Engine, prefix: &str, n: u64, scheduled: &mut Vec<(u64, String)>) {
        for i in 0..n {
            let key = format!("{prefix}-{i:03}");
            let due_ms = FIRST_DUE + i % 30;
            let at = Due::At(UNIX_EPOCH + Duration::from_millis(due_ms));
            engine.schedule(key.as_bytes(), at, key.as_bytes()).unwrap();
            scheduled.push((due_ms, key));
        }
        engine.checkpoint().unwrap();
    }

    /// An engine (`engine`) on a new simulated storage seeded `seed`, with
    /// three overflow files of `n` far tasks each (`one_file`, prefixes
    /// `a`, `b`, `c`): the clock, the engine, and (due, key) of every task
    /// in schedule order.
    fn three_files(seed: u64, n: u64) -> (ManualClock, Engine, Vec<(u64, String)>) {
        let sim = kairos_wal::SimStorage::new(seed);
        let clock = ManualClock::new(START_MS);
        let engine = engine(&sim, &clock);
        let mut scheduled = Vec::new();
        for prefix in ["a", "b", "c"] {
            one_file(&engine, prefix, n, &mut scheduled);
        }
        (clock, engine, scheduled)
    }

    /// `scheduled` without the keys in `cancelled`, sorted by due time
    /// (stably: equal due times keep the schedule order).
    fn uncancelled_by_due(
        scheduled: Vec<(u64, String)>,
        cancelled: &[String],
    ) -> Vec<(u64, String)> {
        let mut left: Vec<(u64, String)> = scheduled
            .into_iter()
            .filter(|(_, key)| !cancelled.contains(key))
            .collect();
        left.sort_by_key(|(due, _)| *due);
        left
    }

    /// Advances the clock a minute at a time to a minute past the last
    /// due time, receiving and acking every task as it fires (none early,
    /// each payload its key): (due, key) of each, in firing order.
    fn fire_all(engine: &Engine, clock: &ManualClock) -> Vec<(u64, String)> {
        let consumer = engine.consumer();
        let mut fired = Vec::new();
        while clock.wall_ms() < FIRST_DUE + 60_000 {
            clock.advance(Duration::from_secs(60));
            engine.run_until_idle();
            while let Ok(d) = consumer.try_recv() {
                assert!(d.fired_ms() >= d.due_ms());
                assert_eq!(d.payload(), d.key());
                fired.push((d.due_ms(), String::from_utf8_lossy(d.key()).into_owned()));
                consumer.ack(&d).unwrap();
            }
        }
        fired
    }

    /// Three overflow files of far tasks due at the same 30 milliseconds,
    /// the ids rising file by file, each far beyond its share of what the
    /// promotion holds (`PROMOTE_ENTRIES_MAX`, 100 here): every task fires
    /// once, and all of them in (due, schedule order), the order they
    /// would have had in one pass, across the files and the passes.
    #[test]
    fn a_promotion_in_passes_keeps_due_then_id_order_across_files() {
        let (clock, engine, mut scheduled) = three_files(7, 400);
        assert_eq!(engine.stats().far, 1200, "{:?}", engine.stats());
        // Stable: equal due times keep the schedule order (the id order).
        scheduled.sort_by_key(|(due, _)| *due);
        let fired = fire_all(&engine, &clock);
        assert_eq!(fired, scheduled);
        assert_eq!(engine.stats().far_promoted, 1200);
        engine.shutdown().unwrap();
    }

    /// An overflow file whose entries are out of (due, id) order (the first
    /// and last swapped, each intact) poisons the engine when the promotion
    /// reads it, naming the file — it neither hangs nor promotes around it.
    #[test]
    fn entries_out_of_order_poison_the_promotion_instead_of_looping() {
        let sim = kairos_wal::SimStorage::new(8);
        let clock = ManualClock::new(START_MS);
        let (path, engine, _) = swapped(&sim, &clock, &[], (0, 149));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        clock.advance(Duration::from_secs(2 * 3600));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let driven = Arc::clone(&engine);
        std::thread::spawn(move || {
            driven.run_until_idle();
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the promotion did not return"
        );
        let at = Due::At(UNIX_EPOCH + Duration::from_millis(FIRST_DUE));
        let error = engine.schedule(b"after", at, b"").unwrap_err().to_string();
        assert!(
            error.contains("out of") && error.contains(name.as_str()),
            "{error}"
        );
    }

    /// One file of 150 far tasks `a-000`… (`one_file`), the tasks of
    /// `cancel` cancelled, then the entries at file positions `i` and `j`
    /// (in (due, id) order; all the same size) swapped, each intact: the
    /// file's path, the engine, and (due, key) of every task scheduled.
    fn swapped(
        sim: &kairos_wal::SimStorage,
        clock: &ManualClock,
        cancel: &[&str],
        (i, j): (usize, usize),
    ) -> (std::path::PathBuf, Arc<Engine>, Vec<(u64, String)>) {
        let engine = engine(sim, clock);
        let mut scheduled = Vec::new();
        one_file(&engine, "a", 150, &mut scheduled);
        for key in cancel {
            let outcome = engine.cancel(key.as_bytes()).unwrap();
            assert!(
                matches!(outcome, crate::CancelOutcome::Cancelled { .. }),
                "{outcome:?}"
            );
        }
        let dir = Path::new("/kairos/overflow");
        let names = sim.list(dir).unwrap();
        let [name] = names.as_slice() else {
            panic!("one overflow file expected: {names:?}");
        };
        let path = dir.join(name);
        let mut bytes = sim.read_file(&path).unwrap();
        let header = crate::overflow::HEADER_BYTES;
        let entry = (bytes.len() - header) / 150;
        assert_eq!((bytes.len() - header) % 150, 0, "equal entries expected");
        let (a, b) = (header + i * entry, header + j * entry);
        let first = bytes[a..a + entry].to_vec();
        bytes.copy_within(b..b + entry, a);
        bytes[b..b + entry].copy_from_slice(&first);
        sim.write_file(&path, &bytes);
        (path, Arc::new(engine), scheduled)
    }

    /// Entries out of (due, id) order that no far task owns (their tasks
    /// cancelled: `a-000`'s entry, first in the file, swapped with
    /// `a-030`'s, second — due at the same millisecond, a later id) are
    /// gone past, each counted: every other task fires once, in (due,
    /// schedule) order. Before, any order violation poisoned the engine.
    #[test]
    fn an_entry_out_of_order_that_no_far_task_owns_is_gone_past() {
        let sim = kairos_wal::SimStorage::new(9);
        let clock = ManualClock::new(START_MS);
        let cancelled = ["a-000".to_string(), "a-030".to_string()];
        let (_, engine, scheduled) = swapped(&sim, &clock, &["a-000", "a-030"], (0, 1));
        let fired = fire_all(&engine, &clock);
        assert_eq!(fired, uncancelled_by_due(scheduled, &cancelled));
        let stats = engine.stats();
        assert_eq!(
            (stats.far_promoted, stats.overflow_damage_skipped),
            (148, 1)
        );
    }

    /// An entry out of order that a far task owns (`a-030`'s, in its place
    /// second in the file, after `a-060`'s swapped in first — both of whose
    /// tasks were cancelled) poisons the engine when the promotion reads
    /// it, naming the file, the offset and the task: it cannot be placed
    /// in (due, id) order (`kairos verify` reports it as damaged).
    #[test]
    fn a_far_tasks_entry_out_of_order_poisons_the_promotion_naming_it() {
        let sim = kairos_wal::SimStorage::new(10);
        let clock = ManualClock::new(START_MS);
        let (path, engine, _) = swapped(&sim, &clock, &["a-000", "a-060"], (0, 2));
        let id = engine.lookup(b"a-030").unwrap().expect("a-030 is far").id.0;
        clock.advance(Duration::from_secs(2 * 3600));
        engine.run_until_idle();
        let at = Due::At(UNIX_EPOCH + Duration::from_millis(FIRST_DUE));
        let error = engine.schedule(b"after", at, b"").unwrap_err().to_string();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let entry = (sim.read_file(&path).unwrap().len() - crate::overflow::HEADER_BYTES) / 150;
        let offset = crate::overflow::HEADER_BYTES + entry;
        assert!(
            error.contains(&format!("far task {id} out of (due time, task id) order"))
                && error.contains(&format!("offset {offset}"))
                && error.contains(&name),
            "{error}"
        );
        assert_eq!(engine.stats().far_promoted, 0);
    }

    /// A promotion yields the lock after every task it puts in the wheel
    /// here (`PROMOTE_HOLD_MAX` is zero in unit tests) while another thread
    /// cancels far tasks and takes checkpoints, which rewrite the overflow
    /// files and move their cursors under the promotion's feet. Every task
    /// cancelled is never delivered; every other fires exactly once, at its
    /// due time, in (due, schedule) order.
    #[test]
    fn a_promotion_that_yields_the_lock_loses_and_repeats_nothing() {
        let (clock, engine, scheduled) = three_files(9, 300);
        assert_eq!(engine.stats().far, 900, "{:?}", engine.stats());
        let barrier = std::sync::Barrier::new(2);
        let cancelled: Vec<String> = std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                // Within the horizon of the first tasks, not yet due.
                clock.advance(Duration::from_secs(3600 + 1800));
                engine.run_until_idle();
            });
            barrier.wait();
            let mut cancelled = Vec::new();
            // Most of each file cancelled: checkpoints compact the files.
            for (n, (_, key)) in scheduled.iter().enumerate().filter(|(n, _)| n % 7 != 3) {
                let outcome = engine.cancel(key.as_bytes()).unwrap();
                assert_eq!(
                    outcome,
                    crate::CancelOutcome::Cancelled { deliveries: 0 },
                    "{key}"
                );
                cancelled.push(key.clone());
                if n % 20 == 0 {
                    engine.checkpoint().unwrap();
                }
            }
            cancelled
        });
        engine.run_until_idle();
        assert_eq!(engine.stats().far, 0, "{:?}", engine.stats());
        let expected = uncancelled_by_due(scheduled, &cancelled);
        let fired = fire_all(&engine, &clock);
        assert_eq!(fired, expected);
        // A task cancelled after its promotion counts as promoted.
        let promoted = engine.stats().far_promoted;
        assert!(
            (expected.len() as u64..=900).contains(&promoted),
            "{promoted}"
        );
        engine.shutdown().unwrap();
    }

    /// The checkpoint that ends a promotion pass, at a chosen yield: at the
    /// `k`-th yield of the lock (every task here), most of file `a`'s tasks
    /// are cancelled and a checkpoint compacts the file, moving its far
    /// tasks not yet promoted to a new file. The pass stops and the next
    /// reads again; every task left fires once, in (due, schedule) order —
    /// `a`'s tasks due at a millisecond before `b`'s and `c`'s.
    #[test]
    fn a_pass_overtaken_by_a_compaction_stops_and_keeps_the_order() {
        let mut interrupts = 0;
        for k in [0usize, 1, 7, 40, 99, 150, 300, 500] {
            let (clock, engine, scheduled) = three_files(10 + k as u64, 300);
            let doomed: Vec<String> = scheduled
                .iter()
                .enumerate()
                .filter(|(n, (_, key))| key.starts_with('a') && n % 7 != 3)
                .map(|(_, (_, key))| key.clone())
                .collect();
            let yields = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let cancelled = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let (seen, cancels, keys) = (Arc::clone(&yields), Arc::clone(&cancelled), doomed);
            *engine.shared.promote_yield_hook.lock() = Some(Box::new(move |shared| {
                if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) != k {
                    return;
                }
                for key in &keys {
                    // Promoted already or not, it is cancelled.
                    let outcome = shared.cancel_one(key.as_bytes()).unwrap();
                    assert_eq!(outcome, crate::CancelOutcome::Cancelled { deliveries: 0 });
                    cancels.lock().push(key.clone());
                }
                shared.checkpoint().unwrap();
            }));
            clock.advance(Duration::from_secs(3600 + 1800));
            engine.run_until_idle();
            *engine.shared.promote_yield_hook.lock() = None;
            assert_eq!(engine.stats().far, 0, "k {k}: {:?}", engine.stats());
            interrupts += engine.shared.core.lock().promote_interrupts;
            let cancelled = cancelled.lock().clone();
            let expected = uncancelled_by_due(scheduled, &cancelled);
            let fired = fire_all(&engine, &clock);
            assert_eq!(fired, expected, "k {k}");
            engine.shutdown().unwrap();
        }
        // The checkpoints of the early yields compacted file `a` while
        // some of its tasks were still far.
        assert!(interrupts > 0, "no pass stopped");
    }

    /// The number of the engine's one overflow file.
    fn only_overflow_file(engine: &Engine) -> u32 {
        let core = engine.shared.core.lock();
        let files: Vec<u32> = core.overflow_files.keys().copied().collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files[0]
    }

    /// The I/O of promotion, counted per overflow file: one file of far
    /// tasks, five due two hours on and five half an hour later, promoted in
    /// two steps — the first five (the read stops at the sixth entry, not
    /// within the far span yet), then the rest (the read reaches the file's
    /// end). Each step opens the file once and reads it once (the file is
    /// smaller than one chunk): the read gives the due time of the entry it
    /// stopped at, read whole and CRC-checked, which the cursor keeps.
    /// Likewise at open. (Before, every read was followed by another open
    /// of the file and a read of that entry's fixed part again: 2 opens and
    /// 2 reads for the first step, 2 opens and 1 read for the second, which
    /// stops at the file's end; 2 opens and 2 reads more at open.)
    #[test]
    fn a_promotion_opens_and_reads_each_overflow_file_once_per_read() {
        let storage = Counting::new(kairos_wal::SimStorage::new(11));
        let clock = ManualClock::new(START_MS);
        let engine = engine_on(Arc::new(storage.clone()), &clock);
        // Ten far tasks in one overflow file: five due at FIRST_DUE, five
        // half an hour later.
        let later = FIRST_DUE + 1_800_000;
        let ten_far = |engine: &Engine| {
            for i in 0..10u64 {
                let due_ms = if i < 5 { FIRST_DUE + i } else { later + i };
                let at = Due::At(UNIX_EPOCH + Duration::from_millis(due_ms));
                engine
                    .schedule(format!("k{i}").as_bytes(), at, b"p")
                    .unwrap();
            }
            engine.checkpoint().unwrap();
        };
        ten_far(&engine);
        assert_eq!(engine.stats().far, 10);
        let file = only_overflow_file(&engine);
        let one_read = |what: &str, before: Seen, far: usize| {
            let seen = storage.seen(file) - before;
            assert_eq!((seen.opens, seen.reads), (1, 1), "{what}: {seen:?}");
            assert_eq!(engine.stats().far, far, "{what}");
        };
        // The first five come within the far span; the sixth does not.
        let before = storage.seen(file);
        clock.advance(Duration::from_secs(3600 + 60));
        engine.run_until_idle();
        one_read("first step", before, 5);
        // The rest.
        let before = storage.seen(file);
        clock.advance(Duration::from_secs(1800));
        engine.run_until_idle();
        one_read("second step", before, 0);
        assert_eq!(engine.stats().far_promoted, 10);
        engine.shutdown().unwrap();

        // At open: the same file of ten far tasks (a new engine, the clock
        // back at the start), reopened once the first five are within the
        // far span. The open checks the file's header and the entry at the
        // largest offset a far task names (1 open, 2 reads); promotion at
        // open reads it once more.
        let storage = Counting::new(kairos_wal::SimStorage::new(12));
        let clock = ManualClock::new(START_MS);
        let engine = engine_on(Arc::new(storage.clone()), &clock);
        ten_far(&engine);
        let file = only_overflow_file(&engine);
        engine.shutdown().unwrap();
        clock.advance(Duration::from_secs(3600 + 60));
        let before = storage.seen(file);
        let engine = engine_on(Arc::new(storage.clone()), &clock);
        let seen = storage.seen(file) - before;
        assert_eq!((seen.opens, seen.reads), (1 + 1, 2 + 1), "open: {seen:?}");
        assert_eq!(engine.stats().far, 5);
        engine.shutdown().unwrap();
    }
}
