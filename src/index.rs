//! The tombstone index: key → task slot, giving O(1) cancel wherever a task
//! is (DESIGN.md: "tombstone index").
//!
//! The index stores no key bytes. Each entry is the task's slab slot plus a
//! 32-bit *tag* of the key's hash; the key lives once, in its task, and a
//! lookup confirms a tag match by comparing it there. The tag rejects almost
//! every non-matching entry without touching the task — at a million tasks
//! each such touch is a cache miss — and the table grows by rehashing tags
//! alone, never reading tasks or key bytes.
//!
//! Layout: open addressing over 64-byte, cache-line-aligned buckets of
//! seven entries, tags and slots side by side, so a lookup reads one cache
//! line of the index when its home bucket has not overflowed (an absent
//! key's lookup read 1.6 buckets on average at the 3/4 load limit), where
//! a SwissTable (`hashbrown`) reads two lines at random for a key it finds
//! — its control bytes and, apart from them, its entries. A key found is
//! then compared in its task, as before. A bucket that was full when an
//! insert passed it counts that entry (its *overflow*), so a lookup stops at
//! the first bucket with none, and a removal needs no tombstones: it lowers
//! the counts along the removed entry's probe. After the F14 hash table's
//! chunks (Facebook's folly, `F14Table.h`: "outbound overflow count").
//! The table doubles at 3/4 full and never shrinks, like `hashbrown`, but
//! not all at once: the entries move to the doubled table a few buckets per
//! insert or removal (incremental rehashing, as Redis's `dict` does), while
//! lookups read both tables, so no single call pays for moving them all (at
//! 11 M entries that was one 0.75-second hold of the engine's lock).

use std::hash::BuildHasher;

/// Entries per bucket.
const WAYS: usize = 7;
/// `Bucket::meta` bits marking which ways hold an entry.
const OCCUPIED_MASK: u32 = (1 << WAYS) - 1;
/// `Bucket::meta`'s overflow count starts at this bit.
const OVERFLOW_SHIFT: u32 = 8;
/// The overflow count saturates here and then stays: lookups past a
/// saturated bucket keep probing, which costs time, never correctness.
const OVERFLOW_MAX: u32 = u32::MAX >> OVERFLOW_SHIFT;
/// Load limit: the table doubles before it holds more than this fraction
/// (numerator / denominator) of `buckets × WAYS` entries.
/// 3/4: with seven-entry buckets and linear probing, a lookup of an absent
/// key read 1.6 buckets on average at 3/4 full, and 4.3 at 7/8 (one
/// measurement with random tags while choosing the limit;
/// `absent_probes_stay_short` holds the 3/4 case under 2).
const LOAD_NUMERATOR: usize = 3;
const LOAD_DENOMINATOR: usize = 4;
/// Buckets of a table's first allocation.
const MIN_BUCKETS: usize = 4;
/// Buckets of the old table moved to the new one by each insert or
/// removal while the table grows: at most `4 × WAYS` entries per call. Any
/// number from one up ends the move before the new table fills: its load
/// limit is twice the old table's, and the move takes fewer calls than the
/// old table has entries.
const MIGRATE_BUCKETS: usize = 4;

/// Seven entries in one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Bucket {
    tags: [u32; WAYS],
    /// Bits 0..7: the ways holding an entry; bits 8..32: the overflow count
    /// (entries whose probe passed this bucket while it was full).
    meta: u32,
    slots: [u32; WAYS],
    _pad: u32,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

impl Bucket {
    /// An empty bucket (what a [`Table::zeroed`] is made of).
    #[cfg(test)]
    const EMPTY: Bucket = Bucket {
        tags: [0; WAYS],
        meta: 0,
        slots: [0; WAYS],
        _pad: 0,
    };

    /// Ways holding an entry under `tag`, as a bit set.
    #[inline]
    fn matches(&self, tag: u32) -> u32 {
        let mut m = 0;
        for (way, &t) in self.tags.iter().enumerate() {
            m |= u32::from(t == tag) << way;
        }
        m & self.meta
    }

    #[inline]
    fn overflow(&self) -> u32 {
        self.meta >> OVERFLOW_SHIFT
    }

    fn add_overflow(&mut self) {
        if self.overflow() < OVERFLOW_MAX {
            self.meta += 1 << OVERFLOW_SHIFT;
        }
    }

    fn sub_overflow(&mut self) {
        let overflow = self.overflow();
        if overflow > 0 && overflow < OVERFLOW_MAX {
            self.meta -= 1 << OVERFLOW_SHIFT;
        }
    }

    /// Puts the entry in the first free way; false if the bucket is full.
    #[inline]
    fn put(&mut self, tag: u32, slot: u32) -> bool {
        let free = !self.meta & OCCUPIED_MASK;
        if free == 0 {
            return false;
        }
        let way = free.trailing_zeros();
        self.tags[way as usize] = tag;
        self.slots[way as usize] = slot;
        self.meta |= 1 << way;
        true
    }
}

/// Key → slot map over keys stored elsewhere (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TaskIndex {
    /// A power of two of buckets, or none before the first insert: the
    /// table new entries go to.
    buckets: Table,
    /// Entries held, in both tables.
    len: usize,
    /// 64 − log2(buckets), for [`home_of`]; 0 (unused) with no buckets.
    shift: u32,
    /// While the table grows, the table before the doubling, whose entries
    /// are moving to `buckets` ([`TaskIndex::migrate`]); empty otherwise.
    /// It takes no inserts. Its overflow counts are not lowered as buckets
    /// are moved (a removal from it lowers them as ever), so they may count
    /// entries gone (a longer probe, never a missed entry).
    old: Table,
    /// `old`'s [`home_of`] shift.
    old_shift: u32,
    /// Entries still in `old`.
    old_len: usize,
    /// Buckets of `old` below it have been emptied into `buckets`.
    migrated: usize,
    /// Shared with callers that prefetch without the engine's lock.
    probe: std::sync::Arc<IndexProbe>,
}

/// What a thread needs to compute a key's tag and prefetch the bucket it
/// would be filed in, without the lock that guards the index: the hasher
/// (fixed for the index's life) and the table's address and shift (updated
/// when it grows; read racily, so possibly stale — a prefetch of a stale
/// address costs a wasted memory read, never a fault or a wrong result).
#[derive(Debug, Default)]
pub(crate) struct IndexProbe {
    /// The index's hasher: tags computed here are the index's.
    hasher: foldhash::fast::RandomState,
    /// Address of the table's first bucket (0: none published yet).
    table_addr: std::sync::atomic::AtomicUsize,
    /// The table's [`home_of`] shift (0: none published yet).
    shift: std::sync::atomic::AtomicU32,
}

impl IndexProbe {
    /// The key's tag, as [`TaskIndex::tag`] computes it (same hasher); no
    /// lock needed.
    pub fn tag(&self, key: &[u8]) -> u32 {
        let hash = self.hasher.hash_one(key);
        (hash ^ (hash >> 32)) as u32
    }

    /// Starts loading the bucket `tag` is filed in into the cache (its home
    /// bucket only).
    pub fn prefetch(&self, tag: u32) {
        use std::sync::atomic::Ordering::Relaxed;
        let (base, shift) = (self.table_addr.load(Relaxed), self.shift.load(Relaxed));
        // No table published yet. The two are read apart, so they may come
        // from different tables (the wrapping arithmetic keeps that a wrong
        // prefetch, never an overflow).
        if base == 0 || shift == 0 {
            return;
        }
        let at = home_of(tag, shift).wrapping_mul(std::mem::size_of::<Bucket>());
        crate::prefetch::prefetch_address(base.wrapping_add(at));
    }
}

/// The bucket a probe for `tag` starts at, in a table of `2^(64 - shift)`
/// buckets: Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4), the top bits of
/// the tag times 2^64/φ, so the bucket depends on every bit of the tag, and
/// doubling the table sends bucket `b`'s entries to buckets `2b` and `2b+1`.
#[inline]
fn home_of(tag: u32, shift: u32) -> usize {
    (u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

/// The most entries `buckets` buckets hold before the table doubles.
fn capacity_of(buckets: usize) -> usize {
    buckets * WAYS / LOAD_DENOMINATOR * LOAD_NUMERATOR
}

/// A table of buckets: a slice of [`Bucket`]s, 64-byte aligned, in an
/// allocation that starts zeroed.
///
/// Why not a `Vec<Bucket>`: a new table should cost nothing until used,
/// and std's default allocator on 64-bit Unix gives memory that is zeroed
/// without being written (`calloc`, which for a block it maps fresh from
/// the kernel — glibc: at or above its mmap threshold, 128 KiB rising to
/// 32 MiB — writes nothing) only at its own alignment (16 bytes), while a
/// `Bucket` wants 64 (`alloc_zeroed` at 64 allocates, then writes every
/// byte: at 11 M entries, a 256 MiB pass with its page faults, 0.15–0.6 s
/// under the engine's lock when the table doubled). So the table
/// over-allocates one bucket at 16-byte alignment and starts at the first
/// 64-byte boundary in it. (Elsewhere — a smaller block, another global
/// allocator, a 32-bit target — the allocator may write the zeros itself:
/// slower, never wrong.)
struct Table {
    /// The first bucket (dangling, aligned, when `len` is 0).
    first: std::ptr::NonNull<Bucket>,
    /// Buckets in the table.
    len: usize,
    /// The allocation and its layout; `None` for an empty table.
    allocation: Option<(std::ptr::NonNull<u8>, std::alloc::Layout)>,
}

// SAFETY: a `Table` owns its buckets (plain integers) exclusively, as a
// `Vec<Bucket>` would: no shared state, nothing tied to a thread.
#[allow(unsafe_code)]
unsafe impl Send for Table {}
// SAFETY: shared access only reads the buckets (`Deref`); writes need
// `&mut Table`.
#[allow(unsafe_code)]
unsafe impl Sync for Table {}

impl Default for Table {
    fn default() -> Self {
        Table {
            first: std::ptr::NonNull::dangling(),
            len: 0,
            allocation: None,
        }
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("buckets", &self.len).finish()
    }
}

impl Table {
    /// A table of `n` empty buckets, zeroed by the allocator (not written
    /// here). Panics (as `vec!` does) if the size overflows `isize`; aborts
    /// through [`std::alloc::handle_alloc_error`] if memory runs out.
    #[allow(unsafe_code)]
    fn zeroed(n: usize) -> Table {
        if n == 0 {
            return Table::default();
        }
        let align = std::mem::align_of::<Bucket>();
        let layout = n
            .checked_add(1)
            .and_then(|b| b.checked_mul(std::mem::size_of::<Bucket>()))
            .and_then(|size| std::alloc::Layout::from_size_align(size, 16).ok());
        let Some(layout) = layout else {
            panic!("capacity overflow: {n} index buckets");
        };
        // SAFETY: `layout` has a non-zero size (at least one bucket).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(base) = std::ptr::NonNull::new(base) else {
            std::alloc::handle_alloc_error(layout);
        };
        let offset = (align - base.as_ptr() as usize % align) % align;
        // `base` is 16-aligned (the layout asks for it), so the offset is 0,
        // 16, 32 or 48 and the `n` buckets after it end within the `n + 1`
        // allocated. Checked in release builds too: the bound is what makes
        // the slice below stay inside the allocation.
        assert!(
            offset.is_multiple_of(16)
                && offset + n * std::mem::size_of::<Bucket>() <= layout.size()
        );
        // SAFETY: `offset` < 64 bytes, within the allocation (size ≥ 64);
        // the result is non-null and 64-aligned.
        let first = unsafe { base.add(offset) }.cast::<Bucket>();
        Table {
            first,
            len: n,
            allocation: Some((base, layout)),
        }
    }
}

impl std::ops::Deref for Table {
    type Target = [Bucket];
    #[allow(unsafe_code)]
    fn deref(&self) -> &[Bucket] {
        // SAFETY: `first` is 64-aligned and non-null, and, when `len` > 0,
        // points at `len` buckets inside the live allocation this table
        // owns, all initialised (zeroed bytes are a valid, empty `Bucket`:
        // `repr(C)` integers only; `zeroed_table_is_all_empty_buckets`).
        // With `len` 0 a dangling aligned pointer is allowed.
        unsafe { std::slice::from_raw_parts(self.first.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Table {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut [Bucket] {
        // SAFETY: as for `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.first.as_ptr(), self.len) }
    }
}

impl Drop for Table {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if let Some((base, layout)) = self.allocation.take() {
            // SAFETY: `base` was returned by `alloc_zeroed(layout)` in
            // `Table::zeroed` and is freed once (taken out of the table).
            unsafe { std::alloc::dealloc(base.as_ptr(), layout) };
        }
    }
}

/// [`TaskIndex::find`] in one table (`shift` its [`home_of`] shift): the
/// slot, with the bucket and the way of its entry.
#[inline(always)]
fn find_in(
    buckets: &[Bucket],
    shift: u32,
    tag: u32,
    is_key: &mut impl FnMut(u32) -> bool,
) -> Option<(u32, usize, usize)> {
    if buckets.is_empty() {
        return None;
    }
    let mask = buckets.len() - 1;
    let mut at = home_of(tag, shift);
    // A probe never needs more than every bucket once (the bound only
    // matters with saturated overflow counts).
    for _ in 0..buckets.len() {
        let bucket = &buckets[at];
        let mut ways = bucket.matches(tag);
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            let slot = bucket.slots[way];
            if is_key(slot) {
                return Some((slot, at, way));
            }
            ways &= ways - 1;
        }
        if bucket.overflow() == 0 {
            return None;
        }
        at = (at + 1) & mask;
    }
    None
}

/// Adds an entry to a table with room (below its load limit, so some
/// bucket has a free way and the probe ends).
#[inline]
fn insert_in(buckets: &mut [Bucket], shift: u32, tag: u32, slot: u32) {
    let mask = buckets.len() - 1;
    let mut at = home_of(tag, shift);
    while !buckets[at].put(tag, slot) {
        buckets[at].add_overflow();
        at = (at + 1) & mask;
    }
}

/// Removes the entry of `slot` under `tag` from one table, lowering the
/// overflow counts its probe passed; whether it was there.
#[inline]
fn remove_in(buckets: &mut [Bucket], shift: u32, tag: u32, slot: u32) -> bool {
    if buckets.is_empty() {
        return false;
    }
    let mask = buckets.len() - 1;
    let home = home_of(tag, shift);
    let mut at = home;
    for _ in 0..buckets.len() {
        let bucket = &mut buckets[at];
        let mut ways = bucket.matches(tag);
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            if bucket.slots[way] == slot {
                remove_at(buckets, shift, tag, at, way);
                return true;
            }
            ways &= ways - 1;
        }
        if bucket.overflow() == 0 {
            return false;
        }
        at = (at + 1) & mask;
    }
    false
}

/// Removes the entry in way `way` of bucket `at` (in the table, filed under
/// `tag`), lowering the overflow counts of the buckets its probe passed.
#[inline]
fn remove_at(buckets: &mut [Bucket], shift: u32, tag: u32, at: usize, way: usize) {
    let mask = buckets.len() - 1;
    buckets[at].meta &= !(1 << way);
    let mut passed = home_of(tag, shift);
    while passed != at {
        buckets[passed].sub_overflow();
        passed = (passed + 1) & mask;
    }
}

/// An entry a lookup found ([`TaskIndex::find_entry`]): its slot, its tag
/// and, if it was in the table new entries go to, its bucket and way there,
/// so that removing it next ([`TaskIndex::remove_found`]) needs no second
/// probe. Sixteen bytes, so that `Option<Found>` comes back in two
/// registers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    /// The entry's slot.
    pub slot: u32,
    tag: u32,
    /// `bucket × 8 + way + 1`; [`Found::UNPLACED`] if not known.
    at: std::num::NonZeroU64,
}

impl Found {
    /// `at` of an entry whose place is not known.
    const UNPLACED: std::num::NonZeroU64 = std::num::NonZeroU64::MAX;

    /// The entry of `slot` under `tag`, found in way `way` of bucket
    /// `bucket` of the table new entries go to.
    #[inline]
    fn placed(slot: u32, tag: u32, bucket: usize, way: usize) -> Found {
        // A bucket number is below 2^58 (64-byte buckets in memory), so
        // this neither overflows nor reaches `UNPLACED`.
        let at = std::num::NonZeroU64::new(((bucket as u64) << 3 | way as u64) + 1)
            .unwrap_or(Found::UNPLACED);
        Found { slot, tag, at }
    }

    /// The entry of `slot` known by its tag only: [`TaskIndex::remove_found`]
    /// probes for it as [`TaskIndex::remove`] does.
    pub fn tagged(slot: u32, tag: u32) -> Found {
        Found {
            slot,
            tag,
            at: Found::UNPLACED,
        }
    }

    /// Bucket and way, if known.
    #[inline]
    fn place(&self) -> Option<(usize, usize)> {
        (self.at != Found::UNPLACED).then(|| {
            let at = self.at.get() - 1;
            ((at >> 3) as usize, (at & 7) as usize)
        })
    }
}

impl TaskIndex {
    /// The key's tag: this index's (per-engine random) hasher folded to 32 bits.
    pub fn tag(&self, key: &[u8]) -> u32 {
        self.probe.tag(key)
    }

    /// The index's [`IndexProbe`].
    pub fn probe(&self) -> std::sync::Arc<IndexProbe> {
        self.probe.clone()
    }

    /// The bucket a probe for `tag` starts at; the table has buckets.
    #[inline]
    fn home(&self, tag: u32) -> usize {
        home_of(tag, self.shift)
    }

    /// Starts loading the bucket a lookup of `tag` reads first into the
    /// cache (a hint: nothing else changes), for a loop over many keys to
    /// issue a few lookups ahead. Only the home bucket: a probe that
    /// overflows into the next bucket reads that one unprefetched.
    /// While the table grows, the bucket of the old table too, unless the
    /// move has emptied it.
    #[inline]
    pub fn prefetch(&self, tag: u32) {
        if self.buckets.is_empty() {
            return;
        }
        crate::prefetch::prefetch(&self.buckets[self.home(tag)]);
        if !self.old.is_empty() {
            let at = home_of(tag, self.old_shift);
            if at >= self.migrated {
                crate::prefetch::prefetch(&self.old[at]);
            }
        }
    }

    /// The slot whose entry has `tag` and for which `is_key(slot)` holds.
    /// O(1) expected (one cache line, unless the home bucket overflowed;
    /// while the table grows, a line of each table for a key not in the new
    /// one); `is_key` runs only on tag matches.
    #[inline]
    pub fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let found = find_in(&self.buckets, self.shift, tag, &mut is_key);
        if found.is_some() || self.old_len == 0 {
            return found.map(|(slot, _, _)| slot);
        }
        self.find_old(tag, is_key)
    }

    /// [`TaskIndex::find`], with where the entry is (for
    /// [`TaskIndex::remove_found`]). Always inlined: a single cancel's
    /// lookup costs ~20 instructions more as a call.
    #[inline(always)]
    pub fn find_entry(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<Found> {
        if let Some((slot, at, way)) = find_in(&self.buckets, self.shift, tag, &mut is_key) {
            return Some(Found::placed(slot, tag, at, way));
        }
        if self.old_len == 0 {
            return None;
        }
        self.find_old(tag, is_key)
            .map(|slot| Found::tagged(slot, tag))
    }

    /// [`TaskIndex::find`] in the old table, while the table grows.
    #[cold]
    #[inline(never)]
    fn find_old(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        find_in(&self.old, self.old_shift, tag, &mut is_key).map(|(slot, _, _)| slot)
    }

    /// Adds `slot` under `tag`. The caller has checked that the key is absent.
    /// O(1): at its load limit the table starts doubling (a zeroed
    /// allocation, not written here), and while it grows each insert first
    /// moves [`MIGRATE_BUCKETS`] buckets of entries to the new table.
    #[inline]
    pub fn insert(&mut self, tag: u32, slot: u32) {
        if self.old_len > 0 {
            self.migrate(MIGRATE_BUCKETS);
        }
        if self.len >= capacity_of(self.buckets.len()) {
            self.start_growth();
        }
        self.insert_no_grow(tag, slot);
    }

    /// [`TaskIndex::insert`] into the new table, which has room (below its
    /// load limit, so some bucket has a free way and the probe ends).
    fn insert_no_grow(&mut self, tag: u32, slot: u32) {
        insert_in(&mut self.buckets, self.shift, tag, slot);
        self.len += 1;
    }

    /// Starts the doubling of a table at its load limit: the entries stay
    /// where they are (the old table) and move a few buckets per call. A
    /// doubling still under way is finished first (not reached in use: a
    /// move ends in fewer calls than a doubling's worth of inserts).
    fn start_growth(&mut self) {
        debug_assert_eq!(self.old_len, 0, "a doubling started before the last ended");
        self.move_to((self.buckets.len() * 2).max(MIN_BUCKETS));
    }

    /// Makes a zeroed table of `buckets` (a power of two, holding every
    /// entry below its load limit) the one new entries go to, and the
    /// current one the old table, its entries to move ([`TaskIndex::migrate`]);
    /// a move still under way is finished first.
    fn move_to(&mut self, buckets: usize) {
        self.finish_growth();
        let old = std::mem::replace(&mut self.buckets, Table::zeroed(buckets));
        let old_shift = std::mem::replace(&mut self.shift, 64 - buckets.trailing_zeros());
        self.publish();
        if self.len > 0 {
            self.old = old;
            self.old_shift = old_shift;
            self.old_len = self.len;
            self.migrated = 0;
        }
    }

    /// Moves the entries of the next `buckets` buckets of the old table to
    /// the new one, old buckets in order, so their entries land in (nearly)
    /// ascending new buckets (doubling sends bucket `b`'s entries to `2b`
    /// and `2b + 1`): a sequential write rather than a random one. Frees the
    /// old table once it is empty.
    #[inline(never)]
    fn migrate(&mut self, buckets: usize) {
        let end = self.migrated.saturating_add(buckets).min(self.old.len());
        for at in self.migrated..end {
            let bucket = &mut self.old[at];
            let mut ways = bucket.meta & OCCUPIED_MASK;
            // Emptied, overflow count kept: probes of entries filed further
            // on still pass it.
            bucket.meta &= !OCCUPIED_MASK;
            let (tags, slots) = (bucket.tags, bucket.slots);
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                insert_in(&mut self.buckets, self.shift, tags[way], slots[way]);
                self.old_len -= 1;
                ways &= ways - 1;
            }
        }
        self.migrated = end;
        if self.old_len == 0 || self.migrated == self.old.len() {
            debug_assert_eq!(self.old_len, 0, "entries left in a moved table");
            self.drop_old();
        }
    }

    /// Frees the old table (emptied). Here, under the caller's lock: giving
    /// back a table of 128 MiB took 8–11 ms (the kernel unmapping its
    /// pages); freeing it on a thread of its own was tried and measured
    /// worse (20–26 ms for the call that coincided), the unmapping still
    /// holding up this thread's page faults.
    fn drop_old(&mut self) {
        self.old = Table::default();
        self.old_len = 0;
        self.migrated = 0;
    }

    /// Moves every entry still in the old table to the new one (the old
    /// table is empty exactly when `old_len` is 0: it is freed as its last
    /// entry leaves).
    fn finish_growth(&mut self) {
        if self.old_len > 0 {
            self.migrate(usize::MAX);
        }
    }

    /// Makes room for `additional` more entries without another doubling,
    /// at once (every entry moved now): for bulk loads, not the schedule
    /// path.
    fn reserve(&mut self, additional: usize) {
        self.finish_growth();
        let needed = self.len.saturating_add(additional);
        if needed <= capacity_of(self.buckets.len()) {
            return;
        }
        let mut buckets = self.buckets.len().max(MIN_BUCKETS);
        while capacity_of(buckets) < needed {
            buckets *= 2;
        }
        self.move_to(buckets);
        self.finish_growth();
    }

    /// Points the shared [`IndexProbe`] at this index's table. Done when the
    /// table grows; to be called again when this index replaces another
    /// sharing its probe (one built by [`TaskIndex::empty_like`]), so that
    /// prefetches find the table in use. Only speed depends on it: a reader
    /// may see the address and the shift of different tables, and then
    /// prefetches a line that is not the bucket (never a fault).
    pub fn publish(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.probe
            .table_addr
            .store(self.buckets.as_ptr() as usize, Relaxed);
        self.probe.shift.store(self.shift, Relaxed);
    }

    /// An empty index with this one's hasher (tags computed by either
    /// match), to be filled on another thread and swapped in.
    pub fn empty_like(&self) -> TaskIndex {
        TaskIndex {
            probe: self.probe.clone(),
            ..TaskIndex::default()
        }
    }

    /// [`TaskIndex::tag`] as a function another thread can call.
    pub fn tagger(&self) -> impl Fn(&[u8]) -> u32 + Sync + '_ {
        move |key| self.tag(key)
    }

    /// Adds every `(tag, slot)` of `entries` (reordering the slice) without
    /// comparing keys, which live elsewhere: returns, for each run of slots
    /// filed under one tag, `(first slot of the run, other slot)` for every
    /// other slot of it, runs one after the other, for the caller to compare
    /// the keys within each run (at 10 M keys, about ten thousand pairs;
    /// linear in the entries however long a run is). If two keys of a run
    /// are equal, the index is not usable.
    ///
    /// For recovery's millions of entries, on a thread of their own: they
    /// are added in the order of the bucket each hashes to, so the table is
    /// written front to back rather than at random, which at 10 M entries on
    /// a 2-core VM is the difference between a cache and TLB miss per entry
    /// (~350 ns) and a sequential write.
    ///
    /// Cost: O(n log n) for the sort, then O(1) expected per entry.
    pub fn insert_batch_unchecked(&mut self, entries: &mut [(u32, u32)]) -> Vec<(u32, u32)> {
        self.reserve(entries.len());
        let shift = self.shift;
        // Equal tags hash alike, so they end up next to each other.
        entries.sort_unstable_by_key(|&(tag, slot)| (home_of(tag, shift), tag, slot));
        // Each slot after the first of a run under one tag, paired with the
        // run's first slot: linear in the entries, however long a run is.
        let mut pairs = Vec::new();
        let mut run_start = 0;
        for (n, &(tag, slot)) in entries.iter().enumerate() {
            if entries[run_start].0 != tag {
                run_start = n;
            }
            if run_start < n {
                pairs.push((entries[run_start].1, slot));
            }
            self.insert_no_grow(tag, slot);
        }
        pairs
    }

    /// Removes the entry of `slot` (filed under `tag`); false if absent.
    /// O(1) expected: the probe of [`TaskIndex::find`], then the overflow
    /// counts of the buckets it passed are lowered. While the table grows,
    /// first moves [`MIGRATE_BUCKETS`] buckets of entries, as an insert
    /// does, so a doubling ends even when inserts stop.
    pub fn remove(&mut self, tag: u32, slot: u32) -> bool {
        if self.old_len > 0 {
            return self.remove_growing(tag, slot);
        }
        let removed = remove_in(&mut self.buckets, self.shift, tag, slot);
        self.len -= usize::from(removed);
        removed
    }

    /// Removes the entry a lookup found ([`TaskIndex::find_entry`]) or one
    /// known by its tag ([`Found::tagged`], then as [`TaskIndex::remove`]);
    /// false if absent. Where the lookup found it is checked first — that
    /// way of that bucket holds the slot under the tag — and the index is
    /// probed again if not (the table grew or moved entries since), so a
    /// stale `Found` costs time, never a wrong removal.
    #[inline]
    pub fn remove_found(&mut self, found: Found) -> bool {
        if let Some((at, way)) = found.place() {
            if self.old_len == 0
                && self.buckets.get(at).is_some_and(|b| {
                    b.meta & (1 << way) != 0
                        && b.tags[way] == found.tag
                        && b.slots[way] == found.slot
                })
            {
                remove_at(&mut self.buckets, self.shift, found.tag, at, way);
                self.len -= 1;
                return true;
            }
        }
        self.remove(found.tag, found.slot)
    }

    /// [`TaskIndex::remove`] while the table grows.
    #[cold]
    #[inline(never)]
    fn remove_growing(&mut self, tag: u32, slot: u32) -> bool {
        self.migrate(MIGRATE_BUCKETS);
        let removed = remove_in(&mut self.buckets, self.shift, tag, slot)
            || self.old_len > 0 && {
                let found = remove_in(&mut self.old, self.old_shift, tag, slot);
                self.old_len -= usize::from(found);
                found
            };
        self.len -= usize::from(removed);
        if self.old_len == 0 {
            self.drop_old();
        }
        removed
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of slot `s` in these tests: `keys[s]`.
    fn find(index: &TaskIndex, keys: &[&[u8]], tag: u32, key: &[u8]) -> Option<u32> {
        index.find(tag, |s| keys[s as usize] == key)
    }

    #[test]
    fn colliding_tags_are_told_apart_by_key() {
        let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
        let mut index = TaskIndex::default();
        // Force every key onto the same tag.
        for slot in 0..3 {
            index.insert(7, slot);
        }
        for (slot, key) in keys.iter().enumerate() {
            assert_eq!(find(&index, &keys, 7, key), Some(slot as u32));
        }
        assert_eq!(find(&index, &keys, 7, b"d"), None);
        assert_eq!(find(&index, &keys, 8, b"a"), None);
        assert!(index.remove(7, 1));
        assert!(!index.remove(7, 1));
        assert_eq!(find(&index, &keys, 7, b"b"), None);
        assert_eq!(find(&index, &keys, 7, b"a"), Some(0));
        assert_eq!(find(&index, &keys, 7, b"c"), Some(2));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn grows_from_tags_alone_and_matches_a_hashmap() {
        let keys: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| format!("key-{i}").into_bytes())
            .collect();
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut index = TaskIndex::default();
        // Only 64 distinct tags: long collision chains through every growth.
        let tag = |i: usize| (i % 64) as u32;
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(find(&index, &key_refs, tag(i), key), None);
            index.insert(tag(i), i as u32);
        }
        for i in (0..keys.len()).step_by(3) {
            assert!(index.remove(tag(i), i as u32));
        }
        for (i, key) in keys.iter().enumerate() {
            let expected = (i % 3 != 0).then_some(i as u32);
            assert_eq!(find(&index, &key_refs, tag(i), key), expected, "key {i}");
        }
        assert_eq!(index.len(), keys.len() - keys.len().div_ceil(3));
    }

    #[test]
    fn tags_depend_on_the_key() {
        let index = TaskIndex::default();
        assert_eq!(index.tag(b"order:1"), index.tag(b"order:1"));
        let distinct: std::collections::HashSet<u32> = (0..1000)
            .map(|i| index.tag(format!("k{i}").as_bytes()))
            .collect();
        assert!(distinct.len() > 990, "{} distinct tags", distinct.len());
    }

    #[test]
    fn an_unchecked_batch_names_every_pair_under_one_tag() {
        let mut index = TaskIndex::default();
        // Slots 0..6 under tags 5, 9, 5, 7, 5, 9.
        let mut batch: Vec<(u32, u32)> = [5, 9, 5, 7, 5, 9]
            .iter()
            .enumerate()
            .map(|(slot, &tag)| (tag, slot as u32))
            .collect();
        let mut pairs = index.insert_batch_unchecked(&mut batch);
        pairs
            .iter_mut()
            .for_each(|p| *p = (p.0.min(p.1), p.0.max(p.1)));
        pairs.sort_unstable();
        assert_eq!(pairs, [(0, 2), (0, 4), (1, 5)]);
        assert_eq!(index.len(), 6);
        let keys: Vec<&[u8]> = vec![b"a", b"b", b"c", b"d", b"e", b"f"];
        for (slot, tag) in [(0u32, 5u32), (1, 9), (2, 5), (3, 7), (4, 5), (5, 9)] {
            assert_eq!(find(&index, &keys, tag, keys[slot as usize]), Some(slot));
        }
        let other = index.empty_like();
        assert_eq!(other.tag(b"k"), index.tag(b"k"));
        assert_eq!((index.tagger())(b"k"), index.tag(b"k"));
    }

    /// One key listed n times (a damaged checkpoint, or a log replayed with the key rule off)
    /// must not cost O(n²) memory before the duplicate is reported.
    #[test]
    fn pairs_under_one_tag_stay_linear() {
        let n = 4_000u32;
        let mut index = TaskIndex::default();
        let mut batch: Vec<(u32, u32)> = (0..n).map(|slot| (7, slot)).collect();
        let pairs = index.insert_batch_unchecked(&mut batch);
        assert!(
            pairs.len() <= 2 * n as usize,
            "{} pairs for {n} entries under one tag",
            pairs.len()
        );
    }

    /// Checks the table's bookkeeping against its entries: the count, and
    /// each bucket's overflow count equal to the entries whose probe from
    /// their home bucket passed it.
    fn check_invariants(index: &TaskIndex) {
        let n = index.buckets.len();
        let mut passed = vec![0u32; n];
        let mut entries = 0;
        for (at, bucket) in index.buckets.iter().enumerate() {
            let mut ways = bucket.meta & OCCUPIED_MASK;
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                entries += 1;
                let mut b = index.home(bucket.tags[way]);
                while b != at {
                    passed[b] += 1;
                    b = (b + 1) & (n - 1);
                }
                ways &= ways - 1;
            }
        }
        assert_eq!(entries, index.len - index.old_len);
        for (at, bucket) in index.buckets.iter().enumerate() {
            assert_eq!(bucket.overflow(), passed[at], "bucket {at} of {n}");
        }
        // The old table, while the table grows: its entries only in buckets
        // not moved yet, its overflow counts never below the entries whose
        // probe passes (they may count entries gone).
        let n = index.old.len();
        let mut passed = vec![0u32; n];
        let mut entries = 0;
        for (at, bucket) in index.old.iter().enumerate() {
            let mut ways = bucket.meta & OCCUPIED_MASK;
            assert!(
                ways == 0 || at >= index.migrated,
                "entry in moved bucket {at}"
            );
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                entries += 1;
                let mut b = home_of(bucket.tags[way], index.old_shift);
                while b != at {
                    passed[b] += 1;
                    b = (b + 1) & (n - 1);
                }
                ways &= ways - 1;
            }
        }
        assert_eq!(entries, index.old_len);
        for (at, bucket) in index.old.iter().enumerate() {
            assert!(bucket.overflow() >= passed[at], "old bucket {at} of {n}");
        }
    }

    /// Entries that wrapped round the end of the old table (filed in its
    /// first buckets, their home in its last) are found and removed while
    /// the doubling is under way, before and after their buckets move.
    #[test]
    fn entries_wrapped_round_the_old_table_are_found_during_growth() {
        let mut index = TaskIndex::default();
        // A 64-bucket table (capacity 336): 40 tags whose home there is the
        // last bucket, so 33 of them wrap round to buckets 0.., then other
        // tags up to the load limit.
        index.reserve(capacity_of(64));
        assert_eq!(index.buckets.len(), 64);
        let last: Vec<u32> = (1u32..).filter(|&t| index.home(t) == 63).take(40).collect();
        let others: Vec<u32> = (1u32..)
            .filter(|&t| index.home(t) != 63)
            .take(capacity_of(64) - last.len())
            .collect();
        let tags: Vec<u32> = last.iter().chain(&others).copied().collect();
        for (slot, &tag) in tags.iter().enumerate() {
            index.insert(tag, slot as u32);
        }
        assert_eq!((index.buckets.len(), index.old_len), (64, 0));
        // Starts the doubling: every entry is still in the old table.
        let extra = (1u32..).find(|t| !tags.contains(t)).unwrap_or(0);
        index.insert(extra, tags.len() as u32);
        assert_eq!((index.buckets.len(), index.old_len), (128, tags.len()));
        check_invariants(&index);
        for (slot, &tag) in tags.iter().enumerate() {
            assert_eq!(
                index.find(tag, |s| s == slot as u32),
                Some(slot as u32),
                "slot {slot}"
            );
        }
        // A wrapped entry removed from the old table before any move.
        let wrapped = 39u32;
        assert!(index.remove(last[39], wrapped));
        assert_eq!(index.find(last[39], |s| s == wrapped), None);
        check_invariants(&index);
        // The rest found after every step of the move.
        while index.old_len > 0 {
            index.migrate(1);
            check_invariants(&index);
            for (slot, &tag) in tags.iter().enumerate().filter(|&(s, _)| s != 39) {
                assert_eq!(
                    index.find(tag, |s| s == slot as u32),
                    Some(slot as u32),
                    "slot {slot}"
                );
            }
        }
        assert_eq!(index.len, tags.len());
    }

    /// A bulk `reserve` (recovery's batches) in the middle of a doubling
    /// finishes it first and keeps every entry.
    #[test]
    fn reserve_during_growth_keeps_every_entry() {
        let mut index = TaskIndex::default();
        let mut slot = 0u32;
        while index.buckets.len() < 1024 || index.old_len == 0 {
            index.insert(slot.wrapping_mul(0x9E37_79B9), slot);
            slot += 1;
        }
        assert!(index.old_len > 0, "a doubling under way");
        let mut batch: Vec<(u32, u32)> = (slot..slot + 10_000)
            .map(|s| (s.wrapping_mul(0x9E37_79B9), s))
            .collect();
        let pairs = index.insert_batch_unchecked(&mut batch);
        assert!(pairs.is_empty());
        assert_eq!(index.old_len, 0);
        assert!(index.old.is_empty());
        check_invariants(&index);
        for s in 0..slot + 10_000 {
            assert_eq!(
                index.find(s.wrapping_mul(0x9E37_79B9), |x| x == s),
                Some(s),
                "slot {s}"
            );
        }
    }

    #[test]
    fn zeroed_table_is_all_empty_buckets() {
        // 4 MiB: a block the allocator maps fresh from the kernel (too slow
        // under Miri, which checks the smaller ones).
        let sizes: &[usize] = if cfg!(miri) {
            &[1, 3, 4, 1024]
        } else {
            &[1, 3, 4, 1024, 1 << 16]
        };
        for &n in sizes {
            let mut table = Table::zeroed(n);
            assert_eq!(table.len(), n);
            assert_eq!(table.as_ptr() as usize % 64, 0, "cache-line aligned");
            let empty = Bucket::EMPTY;
            for b in table.iter() {
                assert_eq!(
                    (b.tags, b.meta, b.slots, b._pad),
                    (empty.tags, 0, empty.slots, 0)
                );
            }
            // Every bucket writable, the last included (within the allocation).
            for b in table.iter_mut() {
                assert!(b.put(7, 9));
            }
            assert!(table.iter().all(|b| b.matches(7) == 1));
        }
        let empty = Table::zeroed(0);
        assert!(empty.is_empty());
        assert!(Table::default().is_empty());
    }

    /// A doubling moves the entries a few buckets per call, never all at
    /// once, and every entry is found, and can be removed, in whichever
    /// table it is meanwhile.
    #[test]
    fn growth_moves_a_few_buckets_per_call() {
        let mut index = TaskIndex::default();
        let tag_of = |slot: u32| slot.wrapping_mul(0x9E37_79B9) ^ 0x5bd1_e995;
        let mut slot = 0u32;
        // Fill to the load limit of a 4 096-bucket table.
        while index.len < capacity_of(4096) {
            index.insert(tag_of(slot), slot);
            slot += 1;
        }
        index.finish_growth();
        assert_eq!((index.buckets.len(), index.old_len), (4096, 0));
        // The next insert starts the doubling and moves nothing yet (the
        // step runs before the doubling starts).
        index.insert(tag_of(slot), slot);
        slot += 1;
        assert_eq!(index.buckets.len(), 8192);
        assert_eq!(index.old_len, capacity_of(4096));
        check_invariants(&index);
        let mut removed = std::collections::HashSet::new();
        let mut calls = 0;
        while index.old_len > 0 {
            let before = index.old_len;
            // Alternate: an insert, a removal of an entry (in either table),
            // then every 97th entry (a different set each time) looked up.
            if calls % 2 == 0 {
                index.insert(tag_of(slot), slot);
                slot += 1;
            } else {
                let victim = calls * 7 % slot;
                if removed.insert(victim) {
                    assert!(index.remove(tag_of(victim), victim), "slot {victim}");
                }
            }
            assert!(before - index.old_len <= MIGRATE_BUCKETS * WAYS + 1);
            calls += 1;
            for s in (calls % 97..slot).step_by(97) {
                let want = (!removed.contains(&s)).then_some(s);
                assert_eq!(index.find(tag_of(s), |x| x == s), want, "slot {s}");
            }
        }
        // One call per four old buckets, at most.
        assert!(calls as usize <= 4096 / MIGRATE_BUCKETS, "{calls} calls");
        assert!(index.old.is_empty(), "old table freed");
        check_invariants(&index);
        for s in 0..slot {
            let want = (!removed.contains(&s)).then_some(s);
            assert_eq!(index.find(tag_of(s), |x| x == s), want, "slot {s}");
        }
        assert_eq!(index.len, slot as usize - removed.len());
    }

    #[test]
    fn prefetching_any_address_changes_nothing() {
        let mut index = TaskIndex::default();
        let probe = index.probe();
        probe.prefetch(1); // no table yet
        index.insert(5, 9);
        // A stale table address (the table grows and moves): still harmless.
        let stale = probe.table_addr.load(std::sync::atomic::Ordering::Relaxed);
        for slot in 0..10_000 {
            index.insert(slot * 7919, slot);
        }
        crate::prefetch::prefetch_address(stale);
        probe.prefetch(5);
        // An address published without its shift, and the other way round
        // (a reader racing the first growth): no overflow, no fault.
        let fresh = IndexProbe::default();
        fresh
            .table_addr
            .store(0x1000, std::sync::atomic::Ordering::Relaxed);
        fresh.prefetch(u32::MAX);
        fresh.shift.store(2, std::sync::atomic::Ordering::Relaxed);
        fresh
            .table_addr
            .store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
        fresh.prefetch(u32::MAX);
        assert_eq!(index.find(5, |s| s == 9), Some(9));
        assert_eq!(probe.tag(b"k"), index.tag(b"k"));
    }

    /// Random tags (seeded) at 3/4 full, just before the table doubles: a
    /// probe for an absent tag reads fewer than two buckets on average (the
    /// load limit's reason). The probe is walked here bucket by bucket, by
    /// the overflow counts `find` follows.
    #[test]
    fn absent_probes_stay_short() {
        let mut index = TaskIndex::default();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u32
        };
        let full = capacity_of(16_384);
        for slot in 0..full as u32 {
            index.insert(next(), slot);
        }
        assert_eq!(index.buckets.len(), 16_384);
        check_invariants(&index);
        let mut probed = 0;
        for _ in 0..10_000 {
            let mut at = index.home(next());
            probed += 1;
            while index.buckets[at].overflow() > 0 {
                at = (at + 1) & (index.buckets.len() - 1);
                probed += 1;
            }
        }
        assert!(probed < 20_000, "{probed} buckets for 10 000 absent probes");
    }

    /// A saturated overflow count is never lowered: lookups past it probe
    /// further, and every entry is still found; the next growth rebuilds
    /// exact counts.
    #[test]
    fn a_saturated_overflow_count_costs_probes_not_answers() {
        let mut index = TaskIndex::default();
        for slot in 0..60 {
            index.insert(slot * 0x0101_0101, slot);
        }
        let buckets = index.buckets.len();
        // Sixteen tags with home bucket 0: they fill it and overflow.
        let same_home: Vec<u32> = (1u32..).filter(|&t| index.home(t) == 0).take(16).collect();
        for (n, &tag) in same_home.iter().enumerate() {
            index.insert(tag, 1_000 + n as u32);
        }
        assert_eq!(index.buckets.len(), buckets, "no growth in between");
        index.buckets[0].meta |= OVERFLOW_MAX << OVERFLOW_SHIFT;
        for (n, &tag) in same_home.iter().enumerate() {
            assert_eq!(
                index.find(tag, |s| s == 1_000 + n as u32),
                Some(1_000 + n as u32)
            );
        }
        for (n, &tag) in same_home.iter().enumerate().step_by(2) {
            assert!(index.remove(tag, 1_000 + n as u32));
        }
        assert_eq!(index.buckets[0].overflow(), OVERFLOW_MAX, "stays saturated");
        for (n, &tag) in same_home.iter().enumerate() {
            let expected = (n % 2 == 1).then_some(1_000 + n as u32);
            assert_eq!(index.find(tag, |s| s == 1_000 + n as u32), expected);
        }
        for slot in 0..60 {
            assert_eq!(index.find(slot * 0x0101_0101, |s| s == slot), Some(slot));
        }
        // Growth reinserts every entry: exact counts again.
        for slot in 2_000..2_000 + capacity_of(buckets) as u32 {
            index.insert(slot.wrapping_mul(0x9E37_79B9), slot);
        }
        assert!(index.buckets.len() > buckets);
        check_invariants(&index);
    }

    /// After every insert and remove in a long churn, the bookkeeping holds;
    /// removing everything leaves no overflow count behind.
    #[test]
    fn overflow_counts_follow_inserts_and_removes() {
        let mut index = TaskIndex::default();
        // Few distinct homes: long overflow chains.
        let tag = |slot: u32| (slot % 37).wrapping_mul(0x0101_0101);
        for slot in 0..3_000 {
            index.insert(tag(slot), slot);
        }
        check_invariants(&index);
        for slot in (0..3_000).step_by(2) {
            assert!(index.remove(tag(slot), slot));
            assert!(!index.remove(tag(slot), slot));
        }
        check_invariants(&index);
        for slot in (1..3_000).step_by(2) {
            assert_eq!(index.find(tag(slot), |s| s == slot), Some(slot));
            assert!(index.remove(tag(slot), slot));
        }
        check_invariants(&index);
        assert!(index.buckets.iter().all(|b| b.meta == 0));
    }

    /// A `Found` kept while the table changed — grown (during and after
    /// the doubling), its way emptied and filled by another slot, its slot
    /// removed and inserted again elsewhere — removes its slot if present
    /// and nothing else, as [`TaskIndex::remove`] would.
    #[test]
    fn a_stale_found_removes_its_slot_and_nothing_else() {
        let mut index = TaskIndex::default();
        let mut model: std::collections::BTreeMap<u32, u32> = Default::default();
        // Few distinct homes: long overflow chains.
        fn tag(slot: u32) -> u32 {
            (slot % 37).wrapping_mul(0x0101_0101)
        }
        fn put(index: &mut TaskIndex, model: &mut std::collections::BTreeMap<u32, u32>, slot: u32) {
            index.insert(tag(slot), slot);
            model.insert(slot, tag(slot));
        }
        for slot in 0..500 {
            put(&mut index, &mut model, slot);
        }
        let found = |index: &TaskIndex, slot: u32| {
            index.find_entry(tag(slot), |s| s == slot).expect("present")
        };
        // Kept before the table grows: growth still under way, then over.
        let before_growth: Vec<Found> = (0..50).map(|s| found(&index, s)).collect();
        let mut next = 500;
        while index.old_len == 0 {
            put(&mut index, &mut model, next);
            next += 1;
        }
        assert!(index.remove_found(before_growth[0]));
        model.remove(&0);
        assert!(!index.remove_found(before_growth[0]));
        while index.old_len > 0 {
            put(&mut index, &mut model, next);
            next += 1;
        }
        for f in &before_growth[1..] {
            assert!(index.remove_found(*f));
            assert!(!index.remove_found(*f));
            model.remove(&f.slot);
        }
        check_invariants(&index);
        // Its slot removed, its way given to another slot under the same
        // tag (in a small table: the way freed is the first free one): the
        // other stays.
        let mut small = TaskIndex::default();
        for slot in [1, 2, 3] {
            small.insert(9, slot);
        }
        let kept = small.find_entry(9, |s| s == 2).expect("present");
        assert!(small.remove(9, 2));
        small.insert(9, 4);
        assert_eq!(small.find_entry(9, |s| s == 4).map(|f| f.at), Some(kept.at));
        assert!(!small.remove_found(kept));
        assert_eq!(small.len(), 3);
        for slot in [1, 3, 4] {
            assert_eq!(small.find(9, |s| s == slot), Some(slot));
        }
        // Its slot removed and inserted again (wherever it lands now).
        let kept = found(&index, 200);
        assert!(index.remove(tag(200), 200));
        put(&mut index, &mut model, 200);
        assert!(index.remove_found(kept));
        model.remove(&200);
        assert!(!index.remove_found(kept));
        check_invariants(&index);
        assert_eq!(index.len(), model.len());
        for (&slot, &t) in &model {
            assert_eq!(index.find(t, |s| s == slot), Some(slot), "slot {slot}");
        }
    }

    proptest::proptest! {
        /// Inserts, removes and finds against a `HashMap` model, with tags
        /// drawn from a small set (collisions, overflow chains, growth).
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..3, 0u32..400, 0u32..64), 1..600)) {
            let mut index = TaskIndex::default();
            let mut model: std::collections::HashMap<u32, u32> = Default::default();
            for (op, slot, tag) in ops {
                match op {
                    0 => {
                        if let std::collections::hash_map::Entry::Vacant(v) = model.entry(slot) {
                            v.insert(tag);
                            index.insert(tag, slot);
                        }
                    }
                    1 => {
                        let expected = model.get(&slot) == Some(&tag);
                        proptest::prop_assert_eq!(index.remove(tag, slot), expected);
                        if expected {
                            model.remove(&slot);
                        }
                    }
                    _ => {
                        let expected = (model.get(&slot) == Some(&tag)).then_some(slot);
                        proptest::prop_assert_eq!(index.find(tag, |s| s == slot), expected);
                    }
                }
                check_invariants(&index);
            }
            check_invariants(&index);
            for (&slot, &tag) in &model {
                proptest::prop_assert_eq!(index.find(tag, |s| s == slot), Some(slot));
            }
        }
    }
}
