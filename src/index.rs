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
//! The table doubles at 3/4 full and never shrinks, like `hashbrown`.

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
    /// An empty bucket.
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
    /// A power of two of buckets, or none before the first insert.
    buckets: Vec<Bucket>,
    /// Entries held.
    len: usize,
    /// 64 − log2(buckets), for [`home_of`]; 0 (unused) with no buckets.
    shift: u32,
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
    #[inline]
    pub fn prefetch(&self, tag: u32) {
        if self.buckets.is_empty() {
            return;
        }
        crate::prefetch::prefetch(&self.buckets[self.home(tag)]);
    }

    /// The slot whose entry has `tag` and for which `is_key(slot)` holds.
    /// O(1) expected (one cache line, unless the home bucket overflowed);
    /// `is_key` runs only on tag matches.
    pub fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut at = self.home(tag);
        // A probe never needs more than every bucket once (the bound only
        // matters with saturated overflow counts).
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[at];
            let mut ways = bucket.matches(tag);
            while ways != 0 {
                let slot = bucket.slots[ways.trailing_zeros() as usize];
                if is_key(slot) {
                    return Some(slot);
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

    /// Adds `slot` under `tag`. The caller has checked that the key is absent.
    /// O(1) amortized; doubling rehashes tags alone.
    pub fn insert(&mut self, tag: u32, slot: u32) {
        self.reserve(1);
        self.insert_no_grow(tag, slot);
    }

    /// [`TaskIndex::insert`] into a table with room (below its load limit,
    /// so some bucket has a free way and the probe ends).
    fn insert_no_grow(&mut self, tag: u32, slot: u32) {
        let mask = self.buckets.len() - 1;
        let mut at = self.home(tag);
        while !self.buckets[at].put(tag, slot) {
            self.buckets[at].add_overflow();
            at = (at + 1) & mask;
        }
        self.len += 1;
    }

    /// Makes room for `additional` more entries without another doubling.
    fn reserve(&mut self, additional: usize) {
        let needed = self.len.saturating_add(additional);
        if needed <= capacity_of(self.buckets.len()) {
            return;
        }
        let mut buckets = self.buckets.len().max(MIN_BUCKETS);
        while capacity_of(buckets) < needed {
            buckets *= 2;
        }
        let old = std::mem::replace(&mut self.buckets, vec![Bucket::EMPTY; buckets]);
        self.shift = 64 - buckets.trailing_zeros();
        self.publish();
        self.len = 0;
        // Old buckets in order: their entries land in (nearly) ascending
        // new buckets, a sequential write rather than a random one.
        for bucket in &old {
            let mut ways = bucket.meta & OCCUPIED_MASK;
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                self.insert_no_grow(bucket.tags[way], bucket.slots[way]);
                ways &= ways - 1;
            }
        }
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
            buckets: Vec::new(),
            len: 0,
            shift: 0,
            probe: self.probe.clone(),
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
    /// counts of the buckets it passed are lowered.
    pub fn remove(&mut self, tag: u32, slot: u32) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let mask = self.buckets.len() - 1;
        let home = self.home(tag);
        let mut at = home;
        for _ in 0..self.buckets.len() {
            let bucket = &mut self.buckets[at];
            let mut ways = bucket.matches(tag);
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                if bucket.slots[way] == slot {
                    bucket.meta &= !(1 << way);
                    self.len -= 1;
                    let mut passed = home;
                    while passed != at {
                        self.buckets[passed].sub_overflow();
                        passed = (passed + 1) & mask;
                    }
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

    /// Number of entries.
    #[cfg(test)]
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
        assert_eq!(entries, index.len);
        for (at, bucket) in index.buckets.iter().enumerate() {
            assert_eq!(bucket.overflow(), passed[at], "bucket {at} of {n}");
        }
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
            }
            check_invariants(&index);
            for (&slot, &tag) in &model {
                proptest::prop_assert_eq!(index.find(tag, |s| s == slot), Some(slot));
            }
        }
    }
}
