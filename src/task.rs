//! Tasks as the engine holds them: ids, the one state enum, the per-task
//! entry, and the component that decides where payload bytes live.

use crate::arena::{ArenaSlot, ByteArena};
use crate::replay::TaskKey;
use crate::wheel::TimerKey;

/// Engine-assigned task id, increasing in scheduling order: unique for the
/// life of a data directory — never reused after a restart for a schedule the
/// log kept. Under `Sync` that is every id a call returned; under `Interval`
/// and `Buffered` a power loss that takes unsynced schedules away (see
/// [`crate::Durability`]) takes their ids too, and later schedules are given
/// them again, unless [`crate::Engine::sync`] ran after them. An in-memory
/// engine's ids are unique for its life.
///
/// Displays as its number:
///
/// ```
/// assert_eq!(kairos::TaskId(42).to_string(), "42");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TaskId(pub u64);

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// Where a task stands. This is the single place task state is defined.
///
/// ```text
/// Scheduled ──due──▶ Ready ──received──▶ Leased ──ack──▶ (finished)
///     ▲                │                   │ ├─nack / lease expiry, attempts left──▶ Scheduled
///     └───release──────┘                   │ └─nack / lease expiry, none left──▶ dead letter
///                                          └─cancel──▶ Abandoned ──ack / nack / expiry──▶ (finished)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting for its due time (first attempt or a retry): in the timing
    /// wheel, the overdue queue or the catch-up backlog. Cancel answers
    /// `Cancelled`.
    Scheduled,
    /// Due and handed out (its deliver record is logged), waiting in the
    /// ready queue for a consumer. Cancel still answers `Cancelled`: no
    /// consumer has it.
    Ready,
    /// Received by a consumer, which holds its lease (its expiry is a timer
    /// in the wheel). Cancel answers `AlreadyDelivered`.
    Leased,
    /// Leased, then cancelled: the holder may still ack or nack, but no
    /// retry or redelivery follows. Its key is free again.
    Abandoned,
}

/// Key and payload bytes that fit in a task's entry itself
/// ([`PayloadRef::Small`]): as many as fit beside the two length bytes
/// before the byte where the largest variant (`OnDisk`) keeps the niche
/// that tells the variants apart, so `PayloadRef` stays 32 bytes (checked
/// below) and the entry does not grow.
pub const SMALL_BYTES: usize = 26;

/// Where a task's variable-length bytes (key and payload) live. One
/// component ([`PayloadStore`]) decides. Keys stay in memory in every
/// variant: the index compares them.
#[derive(Debug, Clone)]
pub enum PayloadRef {
    /// Key and payload in the entry itself, when together they take at
    /// most [`SMALL_BYTES`] bytes (a typical key with an empty or tiny
    /// payload): no allocation to make on schedule or free on cancel, and
    /// no allocator chunk (32 bytes and more) per task.
    Small {
        /// Bytes used of `bytes`: the key, then the payload.
        len: u8,
        /// Length of the key prefix.
        key_len: u8,
        /// Key bytes followed by payload bytes, then unused zeros.
        bytes: [u8; SMALL_BYTES],
    },
    /// Key and payload in memory, in one entry of the payload store's
    /// arena (`crate::arena`), when together they take at most
    /// `ARENA_BYTES_MAX` (1 024) bytes: the key's `key_len` bytes, then
    /// the payload. Read and freed through the [`PayloadStore`] that made
    /// it; a clone names the same entry (valid while the original is).
    Pooled {
        /// The arena entry.
        at: ArenaSlot,
        /// Bytes of the entry: key and payload.
        len: u32,
        /// Length of the key prefix.
        key_len: u32,
    },
    /// Key and payload in memory, in one allocation of their own (longer
    /// than the arena holds, or a replayed key's allocation kept): the key's
    /// `key_len` bytes, then the payload.
    Inline {
        /// Key bytes followed by payload bytes.
        bytes: Box<[u8]>,
        /// Length of the key prefix of `bytes`.
        key_len: u32,
    },
    /// Key in memory; the payload in overflow file `file` (`crate::overflow`)
    /// at byte `offset`, read back before the task is delivered.
    OnDisk {
        /// The key bytes.
        key: Box<[u8]>,
        /// The overflow file's number.
        file: u32,
        /// Byte offset of the task's entry in it.
        offset: u64,
        /// The entry's due time is the task's (false once a reschedule
        /// kept the payload but moved the due time, or when not known):
        /// only then can a checkpoint make the task far in place.
        due_current: bool,
    },
}

impl PayloadRef {
    /// Where the payload is on disk, if it is there and that entry's due
    /// time is the task's.
    pub fn on_disk_current(&self) -> Option<(u32, u64)> {
        match self {
            PayloadRef::OnDisk {
                file,
                offset,
                due_current: true,
                ..
            } => Some((*file, *offset)),
            _ => None,
        }
    }

    /// Marks the on-disk entry's due time as no longer the task's.
    pub fn due_moved(&mut self) {
        if let PayloadRef::OnDisk { due_current, .. } = self {
            *due_current = false;
        }
    }

    /// Where the payload is on disk, if it is not in memory.
    pub fn on_disk(&self) -> Option<(u32, u64)> {
        match self {
            PayloadRef::Small { .. } | PayloadRef::Pooled { .. } | PayloadRef::Inline { .. } => {
                None
            }
            PayloadRef::OnDisk { file, offset, .. } => Some((*file, *offset)),
        }
    }
}

/// `key` and `payload` in a [`PayloadRef::Small`], if they fit.
fn small(key: &[u8], payload: &[u8]) -> Option<PayloadRef> {
    let len = key.len() + payload.len();
    if len > SMALL_BYTES {
        return None;
    }
    let mut bytes = [0u8; SMALL_BYTES];
    bytes[..key.len()].copy_from_slice(key);
    bytes[key.len()..len].copy_from_slice(payload);
    Some(PayloadRef::Small {
        // Both at most SMALL_BYTES (checked above).
        len: len as u8,
        key_len: key.len() as u8,
        bytes,
    })
}

/// Decides where payload bytes live and reads them back.
///
/// In memory a task's key and payload are one entry: in the task's own
/// entry when they fit ([`SMALL_BYTES`]), else in the store's arena
/// (`crate::arena`: no allocator call per task, each entry its length
/// rounded up to 8 bytes), else (over 1 KiB together) one allocation.
/// While a slab snapshot is read, an arena entry that a task the snapshot
/// saved as it was (a clone naming the same entry) still needs is kept when
/// its live task releases it ([`PayloadStore::release_kept`]) and freed once
/// the snapshot has read that clone ([`PayloadStore::unpin`]).
#[derive(Debug, Default)]
pub struct PayloadStore {
    bytes_in_memory: usize,
    /// Live tasks whose payload is in each overflow file, by file number.
    on_disk: std::collections::HashMap<u32, u64>,
    /// Entries of [`PayloadRef::Pooled`].
    arena: ByteArena,
    /// Arena entries released while a snapshot's saved task still names
    /// them, with their lengths: freed when it has been read.
    kept: std::collections::HashMap<ArenaSlot, u32, foldhash::fast::RandomState>,
}

impl PayloadStore {
    /// Stores `key` and `payload` for a new task and returns where they went.
    /// O(1). Keys longer than `u32::MAX` bytes are refused by config
    /// validation (`key_bytes_max`) long before they get here.
    #[inline]
    pub fn put(&mut self, key: &[u8], payload: &[u8]) -> PayloadRef {
        self.bytes_in_memory += payload.len();
        if let Some(small) = small(key, payload) {
            return small;
        }
        let key_len = u32::try_from(key.len()).expect("key length fits u32 (key_bytes_max)");
        if let Some(at) = self.arena.store(key, payload) {
            return PayloadRef::Pooled {
                at,
                // At most ARENA_BYTES_MAX.
                len: (key.len() + payload.len()) as u32,
                key_len,
            };
        }
        let mut bytes = Vec::with_capacity(key.len() + payload.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(payload);
        PayloadRef::Inline {
            bytes: bytes.into_boxed_slice(),
            key_len,
        }
    }

    /// The bytes of a task whose key and payload together are too long for
    /// the arena (over 1 KiB), built without the store (before the engine's
    /// lock is taken: the copy of a large payload is not made under it);
    /// `None` for shorter ones, which [`PayloadStore::put`] places. Hand the
    /// result to [`PayloadStore::adopt`] (dropping it instead is harmless:
    /// it is one allocation, not counted yet).
    pub fn prebuild(key: &[u8], payload: &[u8]) -> Option<PayloadRef> {
        if key.len() + payload.len() <= crate::arena::ARENA_BYTES_MAX {
            return None;
        }
        let key_len = u32::try_from(key.len()).ok()?;
        let mut bytes = Vec::with_capacity(key.len() + payload.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(payload);
        Some(PayloadRef::Inline {
            bytes: bytes.into_boxed_slice(),
            key_len,
        })
    }

    /// Takes bytes made by [`PayloadStore::prebuild`] as a new task's. O(1).
    pub fn adopt(&mut self, built: PayloadRef) -> PayloadRef {
        if let PayloadRef::Inline { bytes, key_len } = &built {
            self.bytes_in_memory += bytes.len() - *key_len as usize;
        } else {
            debug_assert!(false, "only prebuilt bytes are adopted");
        }
        built
    }

    /// [`PayloadStore::put`] for a replayed task's key: a long key's
    /// allocation becomes the task's bytes as it is when the payload is
    /// empty (recovery hands over millions of keys it has just read); a
    /// short one, held inline by [`TaskKey`], needs no allocation to free.
    pub fn put_owned(&mut self, key: TaskKey, payload: &[u8]) -> PayloadRef {
        if !payload.is_empty() {
            return self.put(&key, payload);
        }
        match key.into_heap() {
            Ok(key) => {
                let key_len =
                    u32::try_from(key.len()).expect("key length fits u32 (key_bytes_max)");
                PayloadRef::Inline {
                    bytes: key,
                    key_len,
                }
            }
            Err(inline) => self.put(&inline, payload),
        }
    }

    /// The task's key (always in memory). O(1).
    #[inline]
    pub fn key<'a>(&'a self, at: &'a PayloadRef) -> &'a [u8] {
        match at {
            PayloadRef::Small { bytes, key_len, .. } => &bytes[..usize::from(*key_len)],
            PayloadRef::Pooled { at, len, key_len } => {
                let bytes = self.arena.get(*at, *len as usize);
                &bytes[..(*key_len as usize).min(bytes.len())]
            }
            PayloadRef::Inline { bytes, key_len } => &bytes[..*key_len as usize],
            PayloadRef::OnDisk { key, .. } => key,
        }
    }

    /// The payload if it is in memory (`None`: on disk, see
    /// [`PayloadRef::on_disk`]). O(1).
    pub fn get<'a>(&'a self, at: &'a PayloadRef) -> Option<&'a [u8]> {
        match at {
            PayloadRef::Small {
                bytes,
                len,
                key_len,
                ..
            } => Some(&bytes[usize::from(*key_len)..usize::from(*len)]),
            PayloadRef::Pooled { at, len, key_len } => {
                let bytes = self.arena.get(*at, *len as usize);
                Some(&bytes[(*key_len as usize).min(bytes.len())..])
            }
            PayloadRef::Inline { bytes, key_len } => Some(&bytes[*key_len as usize..]),
            PayloadRef::OnDisk { .. } => None,
        }
    }

    /// Frees the kept entries among `read` (entries named by saved tasks
    /// the slab's snapshot has just read: [`TaskSlab::drain_unpinned`]);
    /// the others are still their live tasks'. O(entries given).
    pub fn unpin(&mut self, read: impl IntoIterator<Item = ArenaSlot>) {
        if self.kept.is_empty() {
            return;
        }
        for at in read {
            if let Some(len) = self.kept.remove(&at) {
                self.arena.free(at, len as usize);
            }
        }
    }

    /// Frees every kept entry: the slab's snapshot has ended or been
    /// dropped, and no saved task names one. O(entries kept), at most the
    /// snapshot's saved tasks.
    pub fn end_snapshot(&mut self) {
        for (at, len) in std::mem::take(&mut self.kept) {
            self.arena.free(at, len as usize);
        }
    }

    /// Arena entries released while a saved task of a snapshot names them.
    pub(crate) fn entries_kept_for_snapshot(&self) -> usize {
        self.kept.len()
    }

    /// Entries, pages and bytes of the arena (for stats and tests).
    pub(crate) fn arena_stats(&self) -> crate::arena::ArenaStats {
        self.arena.stats()
    }

    /// [`PayloadStore::put_on_disk`] taking the key's allocation.
    pub fn put_on_disk_owned(
        &mut self,
        key: Box<[u8]>,
        file: u32,
        offset: u64,
        due_current: bool,
    ) -> PayloadRef {
        *self.on_disk.entry(file).or_default() += 1;
        PayloadRef::OnDisk {
            key,
            file,
            offset,
            due_current,
        }
    }

    /// A task whose payload is in overflow file `file` at `offset`
    /// (`due_current`: that entry's due time is the task's).
    pub fn put_on_disk(
        &mut self,
        key: &[u8],
        file: u32,
        offset: u64,
        due_current: bool,
    ) -> PayloadRef {
        *self.on_disk.entry(file).or_default() += 1;
        PayloadRef::OnDisk {
            key: key.into(),
            file,
            offset,
            due_current,
        }
    }

    /// Forgets a task's bytes: their memory is freed at once (an arena
    /// entry is reused by the next task of its size) and an overflow entry
    /// just stops counting as live. Every `PayloadRef` the store made must
    /// come back here or to [`PayloadStore::release_kept`]: dropping one
    /// instead leaks its arena entry.
    pub fn release(&mut self, at: PayloadRef) {
        self.release_inner(at, false);
    }

    /// [`PayloadStore::release`] for bytes a snapshot's saved task still
    /// names ([`TaskSlab::snapshot_names`]): an arena entry is kept, not
    /// freed, until [`PayloadStore::unpin`] or
    /// [`PayloadStore::end_snapshot`].
    pub fn release_kept(&mut self, at: PayloadRef) {
        self.release_inner(at, true);
    }

    fn release_inner(&mut self, at: PayloadRef, keep: bool) {
        match &at {
            PayloadRef::Small { len, key_len, .. } => {
                self.bytes_in_memory -= usize::from(*len - *key_len);
            }
            PayloadRef::Pooled { at, len, key_len } => {
                self.bytes_in_memory -= (*len - *key_len) as usize;
                if keep {
                    self.kept.insert(*at, *len);
                } else {
                    self.arena.free(*at, *len as usize);
                }
            }
            PayloadRef::Inline { bytes, key_len } => {
                self.bytes_in_memory -= bytes.len() - *key_len as usize;
            }
            PayloadRef::OnDisk { file, .. } => {
                if let Some(n) = self.on_disk.get_mut(file) {
                    *n -= 1;
                    if *n == 0 {
                        self.on_disk.remove(file);
                    }
                }
            }
        }
    }

    /// Live tasks whose payload is in overflow file `file`.
    pub fn live_in_file(&self, file: u32) -> u64 {
        self.on_disk.get(&file).copied().unwrap_or(0)
    }

    /// Overflow files holding the payload of a live task.
    pub fn files(&self) -> impl Iterator<Item = u32> + '_ {
        self.on_disk.keys().copied()
    }

    /// Live tasks whose payload is on disk.
    pub fn tasks_on_disk(&self) -> u64 {
        self.on_disk.values().sum()
    }

    /// Payload bytes currently held in memory (keys not counted).
    pub fn bytes_in_memory(&self) -> usize {
        self.bytes_in_memory
    }
}

/// One live task: a small fixed entry (64 bytes) plus the reference to its
/// key and payload. Its key's index tag is not kept: removing the index
/// entry hashes the key again, except on a cancel or an ack, which hash it
/// before taking the engine's lock.
/// (Cloned only by a slab snapshot, [`TaskSlab::begin_snapshot`].)
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub id: TaskId,
    pub due_ms: u64,
    /// The key and payload bytes.
    pub bytes: PayloadRef,
    pub state: TaskState,
    /// Deliveries made so far (survives restarts through the deliver records).
    pub deliveries: u32,
    /// The task's wheel entry while it waits there.
    pub timer: Option<TimerKey>,
    /// Whether it waits in the catch-up backlog found at open (its entry
    /// there is live): set when the open (or a promotion the wheel cannot
    /// take) puts it there, cleared when it is handed out, rescheduled or
    /// goes to the overdue queue (a reschedule to a past due time, a retry
    /// due at once), so an entry left behind in the backlog neither counts
    /// in `Stats::catch_up_backlog` nor takes a catch-up token when the task
    /// waits untimed again. Set only on a task `Scheduled` with no timer,
    /// and cleared as it leaves that state or gets a timer. Changed through
    /// [`TaskSlab::set_in_backlog`] once the task is in the slab, which
    /// counts the tasks that have it ([`TaskSlab::in_backlog`]).
    pub in_backlog: bool,
}

// Kept small: a lookup touches one or two cache lines of the slab. The slab
// slot (task or free-list link) is the entry's real size. (Aligning slots to
// cache lines was tried: a `Vec` of 64-byte-aligned slots cannot grow with
// `realloc`, and the copies cost more than the alignment saved.)
const _: () = assert!(std::mem::size_of::<PayloadRef>() <= 32);
const _: () = assert!(std::mem::size_of::<Task>() == 64);
const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// A slab: tasks addressed by a dense `u32` slot, with a free list so a
/// cancelled task's slot is reused at once.
#[derive(Debug, Default)]
pub(crate) struct TaskSlab {
    slots: Vec<Slot>,
    free_head: Option<u32>,
    len: usize,
    /// Tasks with [`Task::in_backlog`] set.
    in_backlog: usize,
    /// The snapshot being read, if any ([`TaskSlab::begin_snapshot`]).
    snapshot: Option<Box<SlabSnapshot>>,
    /// Arena entries named by saved tasks the snapshot has read since the
    /// last [`TaskSlab::drain_unpinned`].
    unpinned: Vec<ArenaSlot>,
}

/// What a [`TaskSlab`] snapshot needs to give the slots as they were when
/// it began while they keep changing: each slot not read yet is saved as
/// it was before its first change (copy before write).
#[derive(Debug, Default)]
struct SlabSnapshot {
    /// Slots below it have been read.
    next_slot: u32,
    /// Slots the slab had when the snapshot began: those beyond are newer.
    slots_at_begin: u32,
    /// Slots changed since the snapshot, not read yet: what they held then
    /// (`None`: vacant).
    saved: std::collections::HashMap<u32, Option<Task>, foldhash::fast::RandomState>,
}

#[derive(Debug)]
enum Slot {
    Occupied(Task),
    Vacant { next_free: Option<u32> },
}

impl TaskSlab {
    pub fn len(&self) -> usize {
        self.len
    }

    /// How many tasks wait in the catch-up backlog ([`Task::in_backlog`]).
    /// O(1).
    pub fn in_backlog(&self) -> usize {
        self.in_backlog
    }

    /// Sets or clears [`Task::in_backlog`] of the task in `slot` (none:
    /// nothing), keeping [`TaskSlab::in_backlog`] right. Copies the task for
    /// the snapshot under way, as [`TaskSlab::get_mut`] does, only if the
    /// flag changes.
    pub fn set_in_backlog(&mut self, slot: u32, on: bool) {
        if self.get(slot).is_none_or(|t| t.in_backlog == on) {
            return;
        }
        if let Some(task) = self.get_mut(slot) {
            task.in_backlog = on;
            if on {
                self.in_backlog += 1;
            } else {
                self.in_backlog -= 1;
            }
        }
    }

    /// Makes room for `additional` more tasks without growing the slab.
    pub fn reserve(&mut self, additional: usize) {
        self.slots.reserve(additional);
    }

    /// Slots in the slab, occupied or not: every slot is below it.
    pub fn slots_len(&self) -> u32 {
        // The slab never holds more than 2^32 slots (`insert`).
        self.slots.len() as u32
    }

    /// The slot the next [`TaskSlab::insert`] will use; `None` if 2^32
    /// slots are in use.
    pub fn vacant_slot(&self) -> Option<u32> {
        match self.free_head {
            Some(slot) => Some(slot),
            None => u32::try_from(self.slots.len()).ok(),
        }
    }

    /// Saves `slot` as it is for the snapshot under way, before its first
    /// change, if it has not been read yet.
    #[inline]
    fn save_for_snapshot(&mut self, slot: u32) {
        if self.snapshot.is_some() {
            self.save_for_snapshot_under_way(slot);
        }
    }

    /// [`TaskSlab::save_for_snapshot`] while a snapshot is under way.
    #[cold]
    #[inline(never)]
    fn save_for_snapshot_under_way(&mut self, slot: u32) {
        let Some(snapshot) = &mut self.snapshot else {
            return;
        };
        if slot < snapshot.next_slot || slot >= snapshot.slots_at_begin {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(v) = snapshot.saved.entry(slot) {
            v.insert(match self.slots.get(slot as usize) {
                Some(Slot::Occupied(t)) => Some(t.clone()),
                _ => None,
            });
        }
    }

    /// Starts a snapshot: the tasks as they are now, read a range of slots
    /// at a time ([`TaskSlab::read_snapshot`]) while the slab keeps
    /// changing, each range in a short hold of the caller's lock. Until it
    /// ends, the first change to a slot not read yet (`get_mut`, `remove`,
    /// `insert` into a freed slot) saves what the slot held (a clone of its
    /// task: a key and payload in the entry or in an allocation of their own
    /// are copied, an arena entry is named, and the caller keeps it valid:
    /// its release by the live task goes to [`PayloadStore::release_kept`]
    /// while [`TaskSlab::snapshot_names`] says so): memory grows with the
    /// slots changed, not with the slab. A snapshot already under way is
    /// dropped. O(1).
    pub fn begin_snapshot(&mut self) {
        self.unpinned.clear();
        self.snapshot = Some(Box::new(SlabSnapshot {
            next_slot: 0,
            slots_at_begin: self.slots_len(),
            saved: Default::default(),
        }));
    }

    /// Reads the next `slots_max` slots (at least one) of the snapshot:
    /// passes each task it held in them to `emit`, in slot order, and stops
    /// early after a task for which `emit` returns false (a budget of
    /// bytes). Returns whether every slot has been read (the snapshot then
    /// ends), or `None` if no snapshot is under way. O(slots read).
    pub fn read_snapshot(
        &mut self,
        slots_max: u32,
        mut emit: impl FnMut(&Task) -> bool,
    ) -> Option<bool> {
        let snapshot = self.snapshot.as_mut()?;
        let end = snapshot
            .next_slot
            .saturating_add(slots_max.max(1))
            .min(snapshot.slots_at_begin);
        let mut slot = snapshot.next_slot;
        while slot < end {
            let saved = if snapshot.saved.is_empty() {
                None
            } else {
                snapshot.saved.remove(&slot)
            };
            let go_on = match saved {
                Some(saved) => saved.is_none_or(|t| {
                    if let PayloadRef::Pooled { at, .. } = t.bytes {
                        self.unpinned.push(at);
                    }
                    emit(&t)
                }),
                None => match self.slots.get(slot as usize) {
                    Some(Slot::Occupied(t)) => emit(t),
                    _ => true,
                },
            };
            slot += 1;
            if !go_on {
                break;
            }
        }
        snapshot.next_slot = slot;
        let done = slot == snapshot.slots_at_begin;
        if done {
            self.snapshot = None;
        }
        Some(done)
    }

    /// Drops the snapshot under way, if any (a checkpoint that failed).
    pub fn abort_snapshot(&mut self) {
        self.snapshot = None;
        self.unpinned.clear();
    }

    /// Whether `bytes`, released by the live task in `slot`, are still
    /// named by the task the snapshot under way saved for that slot (an
    /// arena entry to keep: [`PayloadStore::release_kept`]). O(1).
    pub fn snapshot_names(&self, slot: u32, bytes: &PayloadRef) -> bool {
        let (Some(snapshot), PayloadRef::Pooled { at, .. }) = (&self.snapshot, bytes) else {
            return false;
        };
        matches!(
            snapshot.saved.get(&slot),
            Some(Some(t)) if matches!(t.bytes, PayloadRef::Pooled { at: named, .. } if named == *at)
        )
    }

    /// The arena entries named by saved tasks read since the last call (for
    /// [`PayloadStore::unpin`]).
    pub fn drain_unpinned(&mut self) -> std::vec::Drain<'_, ArenaSlot> {
        self.unpinned.drain(..)
    }

    /// Whether a snapshot is under way.
    #[cfg(test)]
    pub fn snapshot_active(&self) -> bool {
        self.snapshot.is_some()
    }

    /// The first slot the snapshot under way has not read yet.
    #[cfg(test)]
    fn snapshot_next_slot(&self) -> Option<u32> {
        self.snapshot.as_ref().map(|s| s.next_slot)
    }

    /// Stores `task`, returning its slot. `None` if 2^32 slots are in use.
    #[inline]
    pub fn insert(&mut self, task: Task) -> Option<u32> {
        if let Some(slot) = self.free_head {
            self.save_for_snapshot(slot);
        }
        self.len += 1;
        self.in_backlog += usize::from(task.in_backlog);
        if let Some(slot) = self.free_head {
            let entry = &mut self.slots[slot as usize];
            if let Slot::Vacant { next_free } = *entry {
                self.free_head = next_free;
            }
            *entry = Slot::Occupied(task);
            return Some(slot);
        }
        let Ok(slot) = u32::try_from(self.slots.len()) else {
            self.len -= 1;
            self.in_backlog -= usize::from(task.in_backlog);
            return None;
        };
        self.slots.push(Slot::Occupied(task));
        Some(slot)
    }

    /// Every task with its slot, in slot order.
    pub fn iter_slots(&self) -> impl Iterator<Item = (u32, &Task)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Occupied(t) => Some((i as u32, t)),
            Slot::Vacant { .. } => None,
        })
    }

    /// Every task, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &Task> {
        self.slots.iter().filter_map(|s| match s {
            Slot::Occupied(t) => Some(t),
            Slot::Vacant { .. } => None,
        })
    }

    pub fn get(&self, slot: u32) -> Option<&Task> {
        match self.slots.get(slot as usize) {
            Some(Slot::Occupied(t)) => Some(t),
            _ => None,
        }
    }

    /// The entry at `slot`, occupied or not, without reading it (for a
    /// prefetch: telling occupied from vacant would load it).
    pub fn entry(&self, slot: u32) -> Option<&impl Sized> {
        self.slots.get(slot as usize)
    }

    pub fn get_mut(&mut self, slot: u32) -> Option<&mut Task> {
        self.save_for_snapshot(slot);
        match self.slots.get_mut(slot as usize) {
            Some(Slot::Occupied(t)) => Some(t),
            _ => None,
        }
    }

    /// The task in `slot` if its id is `id` (a slot may have been reused).
    pub fn get_checked(&self, slot: u32, id: TaskId) -> Option<&Task> {
        self.get(slot).filter(|t| t.id == id)
    }

    /// Whether task `id` is in `slot`, waiting for a delivery and in no
    /// timer: due at once, what an entry of it in the overdue queue or the
    /// catch-up backlog stands for (a stale entry — the task finished,
    /// handed out, or placed in the wheel again since — fails this). O(1).
    pub fn waits_untimed(&self, slot: u32, id: TaskId) -> bool {
        self.get_checked(slot, id)
            .is_some_and(|t| t.state == TaskState::Scheduled && t.timer.is_none())
    }

    /// Whether task `id` in `slot` still waits in the catch-up backlog: a
    /// backlog entry naming it is live ([`Task::in_backlog`]).
    pub fn waits_in_backlog(&self, slot: u32, id: TaskId) -> bool {
        self.get_checked(slot, id)
            .is_some_and(|t| t.in_backlog && t.state == TaskState::Scheduled && t.timer.is_none())
    }

    pub fn remove(&mut self, slot: u32) -> Option<Task> {
        self.save_for_snapshot(slot);
        let entry = self.slots.get_mut(slot as usize)?;
        if !matches!(entry, Slot::Occupied(_)) {
            return None;
        }
        let old = std::mem::replace(
            entry,
            Slot::Vacant {
                next_free: self.free_head,
            },
        );
        self.free_head = Some(slot);
        self.len -= 1;
        match old {
            Slot::Occupied(t) => {
                self.in_backlog -= usize::from(t.in_backlog);
                Some(t)
            }
            Slot::Vacant { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64) -> Task {
        Task {
            id: TaskId(id),
            due_ms: 0,
            bytes: PayloadStore::default().put(b"k", b""),
            state: TaskState::Scheduled,
            deliveries: 0,
            timer: None,
            in_backlog: false,
        }
    }

    /// One step of a slab snapshot test.
    #[derive(Debug, Clone)]
    enum SlabOp {
        Insert,
        /// Remove the `n`-th occupied slot (mod their count).
        Remove(usize),
        /// Change the `n`-th task in place (a new due time).
        Change(usize),
        /// Read this many slots.
        Read(u32),
    }

    fn slab_op() -> impl proptest::strategy::Strategy<Value = SlabOp> {
        use proptest::prelude::*;
        prop_oneof![
            3 => Just(SlabOp::Insert),
            3 => any::<usize>().prop_map(SlabOp::Remove),
            2 => any::<usize>().prop_map(SlabOp::Change),
            2 => (0u32..12).prop_map(SlabOp::Read),
        ]
    }

    /// The snapshot gives the (id, due, key and payload) of every task as
    /// it was when it began, in slot order, whatever changed in between
    /// (tasks removed, their payloads replaced, their arena entries freed
    /// and taken by new tasks); the slab itself ends as a model says, and
    /// no arena entry is kept or leaked once it has been read.
    fn run_slab_snapshot(initial: usize, ops: Vec<SlabOp>, before: usize) {
        let mut slab = TaskSlab::default();
        let mut store = PayloadStore::default();
        let mut next_id = 1u64;
        // The bytes of task `id` at `version`: 30-byte key, 2–49-byte payload
        // (arena entries of a few classes).
        let bytes_of = |id: u64, version: u64| {
            let key = format!("{id:0>30}").into_bytes();
            let payload = vec![(id + version) as u8; 2 + ((id * 7 + version * 13) % 48) as usize];
            (key, payload)
        };
        // slot -> (id, due, version)
        type Model = std::collections::BTreeMap<u32, (u64, u64, u64)>;
        let mut model: Model = Default::default();
        let mut insert = |slab: &mut TaskSlab, store: &mut PayloadStore, model: &mut Model| {
            let (key, payload) = bytes_of(next_id, 0);
            let t = Task {
                bytes: store.put(&key, &payload),
                ..task(next_id)
            };
            let slot = slab.insert(t).expect("room");
            model.insert(slot, (next_id, 0, 0));
            next_id += 1;
        };
        // Slots whose saved task's entry is kept (released by the live task).
        let mut kept_slots = std::collections::BTreeSet::new();
        let release = |slab: &TaskSlab,
                       store: &mut PayloadStore,
                       kept_slots: &mut std::collections::BTreeSet<u32>,
                       slot: u32,
                       b: PayloadRef| {
            if slab.snapshot_names(slot, &b) {
                assert!(kept_slots.insert(slot), "an entry kept twice");
                store.release_kept(b);
            } else {
                store.release(b);
            }
        };
        for _ in 0..initial {
            insert(&mut slab, &mut store, &mut model);
        }
        let entry = |(id, due, version): (u64, u64, u64)| {
            let (key, payload) = bytes_of(id, version);
            (id, due, [key, payload].concat())
        };
        let mut expected = None;
        let mut got: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let begin_at = before.min(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            if i == begin_at {
                slab.begin_snapshot();
                expected = Some(model.values().copied().map(entry).collect::<Vec<_>>());
            }
            match op {
                SlabOp::Insert => insert(&mut slab, &mut store, &mut model),
                SlabOp::Remove(n) if !model.is_empty() => {
                    let slot = *model.keys().nth(n % model.len()).unwrap();
                    let (id, _, _) = model.remove(&slot).unwrap();
                    let t = slab.remove(slot).expect("occupied");
                    assert_eq!(t.id.0, id);
                    release(&slab, &mut store, &mut kept_slots, slot, t.bytes);
                }
                SlabOp::Change(n) if !model.is_empty() => {
                    // Even n: a new payload too; odd: the due time only (the
                    // saved task then shares its entry with the live one).
                    let slot = *model.keys().nth(n % model.len()).unwrap();
                    let m = model.get_mut(&slot).unwrap();
                    let t = slab.get_mut(slot).expect("occupied");
                    t.due_ms += 7;
                    m.1 = t.due_ms;
                    if n % 2 == 0 {
                        m.2 += 1;
                        let (key, payload) = bytes_of(m.0, m.2);
                        let old = std::mem::replace(&mut t.bytes, store.put(&key, &payload));
                        release(&slab, &mut store, &mut kept_slots, slot, old);
                    }
                }
                SlabOp::Remove(_) | SlabOp::Change(_) => {}
                SlabOp::Read(n) => {
                    if slab.snapshot_active() {
                        let done = slab.read_snapshot(n, |t| {
                            let bytes = [store.key(&t.bytes), store.get(&t.bytes).unwrap()];
                            got.push((t.id.0, t.due_ms, bytes.concat()));
                            t.id.0 % 5 != 0
                        });
                        store.unpin(slab.drain_unpinned());
                        if done == Some(true) {
                            store.end_snapshot();
                        }
                        // Kept only while their saved tasks are unread.
                        let read_to = slab.snapshot_next_slot().unwrap_or(u32::MAX);
                        kept_slots.retain(|&s| s >= read_to);
                        assert_eq!(store.entries_kept_for_snapshot(), kept_slots.len());
                    }
                }
            }
        }
        if expected.is_none() {
            slab.begin_snapshot();
            expected = Some(model.values().copied().map(entry).collect());
        }
        while slab.snapshot_active() {
            let read = slab.read_snapshot(3, |t| {
                let bytes = [store.key(&t.bytes), store.get(&t.bytes).unwrap()];
                got.push((t.id.0, t.due_ms, bytes.concat()));
                true
            });
            assert!(read.is_some());
            store.unpin(slab.drain_unpinned());
        }
        store.end_snapshot();
        assert_eq!(
            Some(got),
            expected,
            "the snapshot is the slab as it began, in slot order"
        );
        let now: Vec<_> = slab
            .iter_slots()
            .map(|(_, t)| {
                let bytes = [store.key(&t.bytes), store.get(&t.bytes).unwrap()];
                (t.id.0, t.due_ms, bytes.concat())
            })
            .collect();
        assert_eq!(now, model.values().copied().map(entry).collect::<Vec<_>>());
        assert_eq!(slab.read_snapshot(1, |_| panic!("no snapshot")), None);
        // Every entry is a live task's: none kept, none leaked.
        assert_eq!(store.entries_kept_for_snapshot(), 0);
        assert_eq!(store.arena_stats().entries, model.len());
    }

    #[test]
    fn a_slab_snapshot_read_in_pieces_is_the_slab_as_it_began() {
        use SlabOp::*;
        // A slot freed and reused before it is read; one changed twice; a
        // new slot at the end; reads in between.
        let ops = vec![
            Remove(2),
            Insert,
            Change(0),
            Read(1),
            Change(0),
            Change(5),
            Insert,
            Insert,
            Read(3),
            Remove(4),
            Remove(0),
            Insert,
        ];
        run_slab_snapshot(8, ops.clone(), 0);
        run_slab_snapshot(8, ops, 2);
        let mut slab = TaskSlab::default();
        slab.insert(task(1));
        slab.begin_snapshot();
        slab.abort_snapshot();
        assert!(!slab.snapshot_active());
        assert_eq!(slab.read_snapshot(1, |_| panic!("aborted")), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn a_slab_snapshot_under_random_changes_is_the_slab_as_it_began(
            initial in 0usize..40,
            ops in proptest::collection::vec(slab_op(), 0..120),
            before in 0usize..30,
        ) {
            run_slab_snapshot(initial, ops, before);
        }
    }

    #[test]
    fn slab_reuses_freed_slots() {
        let mut s = TaskSlab::default();
        let a = s.insert(task(1)).unwrap();
        let b = s.insert(task(2)).unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(s.remove(a).map(|t| t.id), Some(TaskId(1)));
        assert!(s.remove(a).is_none());
        assert_eq!(s.len(), 1);
        let c = s.insert(task(3)).unwrap();
        assert_eq!(c, a);
        assert!(s.get_checked(c, TaskId(1)).is_none());
        assert_eq!(s.get_checked(c, TaskId(3)).map(|t| t.id), Some(TaskId(3)));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn small_bytes_live_in_the_entry_larger_ones_in_the_arena_the_largest_apart() {
        let mut p = PayloadStore::default();
        let key = [b'k'; 20];
        for payload_len in [0, 6, 7, 100, 1004, 1005, 5000] {
            let payload = vec![b'p'; payload_len];
            let r = p.put(&key, &payload);
            let len = key.len() + payload_len;
            let (small, pooled) = (len <= SMALL_BYTES, len > SMALL_BYTES && len <= 1024);
            assert_eq!(
                matches!(r, PayloadRef::Small { .. }),
                small,
                "{payload_len}"
            );
            assert_eq!(
                matches!(r, PayloadRef::Pooled { .. }),
                pooled,
                "{payload_len}"
            );
            assert_eq!(p.key(&r), key);
            assert_eq!(p.get(&r), Some(&payload[..]));
            assert_eq!(r.on_disk(), None);
            assert_eq!(p.bytes_in_memory(), payload_len);
            assert_eq!(p.arena_stats().entries, usize::from(pooled));
            p.release(r);
            assert_eq!(p.bytes_in_memory(), 0);
            assert_eq!(p.arena_stats().entries, 0);
            let owned = p.put_owned(key.as_slice().into(), &payload);
            assert_eq!(matches!(owned, PayloadRef::Small { .. }), small);
            assert_eq!(p.key(&owned), key);
            assert_eq!(p.get(&owned), Some(&payload[..]));
            p.release(owned);
            assert_eq!(p.bytes_in_memory(), 0);
        }
        // A replayed key too long for the entry keeps its allocation when
        // the payload is empty.
        let long: Box<[u8]> = vec![b'k'; 40].into();
        let ptr = long.as_ptr();
        let owned = p.put_owned(TaskKey::from(long), b"");
        assert!(matches!(&owned, PayloadRef::Inline { bytes, .. } if bytes.as_ptr() == ptr));
        assert_eq!(p.key(&owned), &[b'k'; 40][..]);
        p.release(owned);
        // A key alone longer than the entry holds goes to the arena.
        let long = [b'k'; SMALL_BYTES + 1];
        let r = p.put(&long, b"");
        assert!(matches!(r, PayloadRef::Pooled { .. }));
        assert_eq!(p.key(&r), long);
        p.release(r);
    }

    /// While a slab snapshot is read, an arena entry is kept only while a
    /// saved task names it: released by its live task, it keeps its bytes
    /// until the snapshot reads that task, then is freed; entries no saved
    /// task names (a task placed after the snapshot began, or in a slot
    /// already read) are freed at once.
    #[test]
    fn arena_entries_are_kept_only_while_a_saved_task_names_them() {
        let mut p = PayloadStore::default();
        let mut slab = TaskSlab::default();
        let with = |p: &mut PayloadStore, id: u64, fill: u8| Task {
            bytes: p.put(&[fill; 30], &[fill; 9]),
            ..task(id)
        };
        // Tasks take the freed slot last made, so slots 0, 1, 2 in order.
        for (id, fill) in [(1, b'a'), (2, b'b'), (3, b'c')] {
            let t = with(&mut p, id, fill);
            slab.insert(t);
        }
        slab.begin_snapshot();
        let release = |slab: &mut TaskSlab, p: &mut PayloadStore, slot: u32| {
            let t = slab.remove(slot).expect("occupied");
            if slab.snapshot_names(slot, &t.bytes) {
                p.release_kept(t.bytes);
            } else {
                p.release(t.bytes);
            }
        };
        // Slot 1's task is saved and its entry kept.
        release(&mut slab, &mut p, 1);
        assert_eq!(p.entries_kept_for_snapshot(), 1);
        // A task placed since (into slot 1) is freed at once.
        let t = with(&mut p, 4, b'd');
        assert_eq!(slab.insert(t), Some(1));
        release(&mut slab, &mut p, 1);
        assert_eq!(
            (p.entries_kept_for_snapshot(), p.arena_stats().entries),
            (1, 3)
        );
        // New tasks do not reuse the kept entry.
        let t = with(&mut p, 5, b'e');
        assert_eq!(slab.insert(t), Some(1));
        let mut read = Vec::new();
        let emit = |read: &mut Vec<Vec<u8>>, p: &PayloadStore, t: &Task| {
            read.push([p.key(&t.bytes), p.get(&t.bytes).unwrap_or_default()].concat());
            true
        };
        assert_eq!(
            slab.read_snapshot(1, |t| emit(&mut read, &p, t)),
            Some(false)
        );
        assert_eq!(
            slab.read_snapshot(1, |t| emit(&mut read, &p, t)),
            Some(false)
        );
        // Slot 1's saved task read: its entry is freed, no sooner.
        assert_eq!(p.entries_kept_for_snapshot(), 1);
        p.unpin(slab.drain_unpinned());
        assert_eq!(
            (p.entries_kept_for_snapshot(), p.arena_stats().entries),
            (0, 3)
        );
        // Slot 0, already read, is released at once.
        release(&mut slab, &mut p, 0);
        assert_eq!(p.entries_kept_for_snapshot(), 0);
        assert_eq!(
            slab.read_snapshot(1, |t| emit(&mut read, &p, t)),
            Some(true)
        );
        p.end_snapshot();
        let expected: Vec<Vec<u8>> = [b'a', b'b', b'c'].map(|f| vec![f; 39]).to_vec();
        assert_eq!(read, expected);
        for slot in [1, 2] {
            release(&mut slab, &mut p, slot);
        }
        assert_eq!(p.arena_stats().entries, 0);
    }

    #[test]
    fn payload_store_counts_bytes() {
        let mut p = PayloadStore::default();
        let r = p.put(b"key", b"hello");
        assert_eq!(p.key(&r), b"key");
        assert_eq!(p.get(&r), Some(&b"hello"[..]));
        assert_eq!(p.bytes_in_memory(), 5);
        p.release(r);
        assert_eq!(p.bytes_in_memory(), 0);
    }
}
