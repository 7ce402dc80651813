//! The tombstone index: key → task slot, giving O(1) cancel wherever a task
//! is (DESIGN.md: "tombstone index").
//!
//! The index stores no key bytes. Each entry is the task's slab slot plus a
//! 32-bit *tag* of the key's hash (8 bytes + the table's 1 control byte); the
//! key lives once, in its task, and a lookup confirms a tag match by comparing
//! it there. The tag rejects almost every non-matching entry without touching
//! the task — at a million tasks each such touch is a cache miss — and the
//! table grows by rehashing tags alone, never reading tasks or key bytes.
//! Built on `hashbrown::HashTable` (SwissTable, Abseil's design).

use hashbrown::HashTable;
use std::hash::BuildHasher;

/// One entry: the task's slot and its key's tag.
#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    tag: u32,
}

/// Key → slot map over keys stored elsewhere (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TaskIndex {
    table: HashTable<Entry>,
    hasher: foldhash::fast::RandomState,
}

/// The hash the table files a tag under: the tag spread over 64 bits. The
/// table takes bucket positions from the low bits and its 7-bit control byte
/// from the top bits, so both depend on every bit of the tag.
fn table_hash(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(tag)
}

impl TaskIndex {
    /// The key's tag: this index's (per-engine random) hasher folded to 32 bits.
    pub fn tag(&self, key: &[u8]) -> u32 {
        let hash = self.hasher.hash_one(key);
        (hash ^ (hash >> 32)) as u32
    }

    /// The slot whose entry has `tag` and for which `is_key(slot)` holds.
    /// O(1) expected; `is_key` runs only on tag matches.
    pub fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        self.table
            .find(table_hash(tag), |e| e.tag == tag && is_key(e.slot))
            .map(|e| e.slot)
    }

    /// Adds `slot` under `tag`. The caller has checked that the key is absent.
    pub fn insert(&mut self, tag: u32, slot: u32) {
        self.table
            .insert_unique(table_hash(tag), Entry { slot, tag }, |e| table_hash(e.tag));
    }

    /// An empty index with this one's hasher (tags computed by either
    /// match), to be filled on another thread and swapped in.
    pub fn empty_like(&self) -> TaskIndex {
        TaskIndex {
            table: HashTable::new(),
            hasher: self.hasher.clone(),
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
    /// are added in the order of the table position each hashes to, so the
    /// table is written front to back rather than at random, which at 10 M
    /// entries on a 2-core VM is the difference between a cache and TLB
    /// miss per entry (~350 ns) and a sequential write. hashbrown probes
    /// from `hash & bucket_mask`, and a table holding `capacity` entries has
    /// the power of two of buckets just above `capacity × 8 / 7`; a wrong
    /// guess of that costs speed only, never correctness.
    ///
    /// Cost: O(n log n) for the sort, then O(1) expected per entry.
    pub fn insert_batch_unchecked(&mut self, entries: &mut [(u32, u32)]) -> Vec<(u32, u32)> {
        self.table.reserve(entries.len(), |e| table_hash(e.tag));
        let buckets = (self.table.capacity().saturating_mul(8) / 7)
            .max(1)
            .next_power_of_two() as u64;
        let mask = buckets - 1;
        // Equal tags hash alike, so they end up next to each other.
        entries.sort_unstable_by_key(|&(tag, slot)| (table_hash(tag) & mask, tag, slot));
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
            self.table
                .insert_unique(table_hash(tag), Entry { slot, tag }, |e| table_hash(e.tag));
        }
        pairs
    }

    /// Removes the entry of `slot` (filed under `tag`); false if absent.
    pub fn remove(&mut self, tag: u32, slot: u32) -> bool {
        match self.table.find_entry(table_hash(tag), |e| e.slot == slot) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
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
}
