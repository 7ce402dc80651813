//! Far tasks: tasks due beyond the horizon (`Config::horizon`), kept out of
//! the timing wheel and the task slab.
//!
//! A far task's key, due time and payload live in one entry of an overflow
//! file (`crate::overflow`, sorted by due time); memory holds only a
//! [`FarEntry`] — the key's 64-bit keyed hash, the task id and the entry's
//! place on disk, 24 bytes — in a [`FarIndex`]. A lookup by key compares
//! hashes; a hash match is confirmed by reading the entry from disk (the
//! rare collision of two keys on one 64-bit hash is resolved there, as the
//! issue and DESIGN.md's tombstone index allow). Once a far task's due time
//! is within the horizon from now, the engine reads its overflow file
//! sequentially and *promotes* it into the wheel (`engine/far.rs`).
//!
//! The hash must be the same after a restart (the checkpoint stores it, and
//! open reads no overflow entry of a task still beyond the horizon), so it
//! is SipHash-1-3 (Aumasson & Bernstein
//! 2012, the keyed PRF hash tables use against flooding) keyed by the data
//! directory's random store id rather than a per-process seed.

use siphasher::sip::SipHasher13;

/// The keyed hash of far-task keys (see the module docs).
#[derive(Debug, Clone)]
pub struct KeyHasher(SipHasher13);

impl KeyHasher {
    /// The hasher of the data directory whose store id is `store_id`.
    pub fn new(store_id: &[u8; 16]) -> KeyHasher {
        KeyHasher(SipHasher13::new_with_key(store_id))
    }

    /// The key's 64-bit hash. ~20 ns for a 24-byte key.
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.0.hash(key)
    }
}

/// Bits of a [`FarEntry::loc`] holding the entry's byte offset in its file
/// (1 TiB); the file number takes the 24 bits above.
pub const LOC_OFFSET_BITS: u32 = 40;
/// Largest overflow file number a far task can be in.
pub const LOC_FILE_MAX: u32 = (1 << (64 - LOC_OFFSET_BITS)) - 1;

/// `(file, offset)` packed into one `u64`; `None` if either is too large
/// (the task then stays in the wheel).
pub fn pack_loc(file: u32, offset: u64) -> Option<u64> {
    (file <= LOC_FILE_MAX && offset < (1 << LOC_OFFSET_BITS))
        .then(|| (u64::from(file) << LOC_OFFSET_BITS) | offset)
}

/// The `(file, offset)` of a packed location.
pub fn unpack_loc(loc: u64) -> (u32, u64) {
    (
        (loc >> LOC_OFFSET_BITS) as u32,
        loc & ((1 << LOC_OFFSET_BITS) - 1),
    )
}

/// One far task in memory: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FarEntry {
    /// [`KeyHasher::hash`] of its key.
    pub hash: u64,
    /// Its overflow entry: [`pack_loc`] of (file, byte offset).
    pub loc: u64,
    /// Its task id (0 marks a removed entry).
    pub id: u64,
}

const _: () = assert!(std::mem::size_of::<FarEntry>() == 24);

impl FarEntry {
    /// The overflow file holding its entry.
    pub fn file(&self) -> u32 {
        unpack_loc(self.loc).0
    }
}

/// Entries per directory bucket the index aims at.
const BUCKET_ENTRIES: usize = 4;

/// The far tasks: a flat array of [`FarEntry`] sorted by hash, with a
/// directory of the first entry of each range of hashes — a static hash
/// table at 100 % load (about 25 bytes per task in all, where a SwissTable
/// of the same entries would take 27–54 depending on where its power-of-two
/// growth stands).
///
/// Lookup is O(1) expected: the top bits of the hash pick a directory
/// bucket of about 4 entries (`BUCKET_ENTRIES`), scanned in order (hashes
/// are uniform: SipHash under a secret key). Removal leaves a tombstone
/// (id 0), dropped when the array is rebuilt. Entries are added in bulk —
/// [`FarIndex::build`] at open (O(n log n)), [`FarIndex::add`] (a merge,
/// O(n + m log m)) — or one at a time, [`FarIndex::insert`]: O(1) into an
/// unsorted tail with a hash table of its positions (~30 B per entry there),
/// merged into the sorted array once the tail outgrows it (amortised
/// O(1) per insert). A checkpoint takes tasks out of the wheel one lock
/// hold at a time, and each must be findable by key as soon as it leaves.
/// At most `u32::MAX` entries (the engine's task limit is 2^31).
#[derive(Debug, Default)]
pub struct FarIndex {
    /// The sorted part (`..sorted`), then the tail in insertion order.
    entries: Vec<FarEntry>,
    /// Length of the sorted part.
    sorted: usize,
    /// Positions (in `entries`) of the tail's entries, by hash.
    tail: hashbrown::HashTable<u32>,
    /// `dir[b]` = index of the first entry whose hash's top `bits` bits are
    /// ≥ `b`; `2^bits + 1` entries (empty while `entries` is).
    dir: Vec<u32>,
    bits: u32,
    live: usize,
    /// Live entries per overflow file.
    per_file: std::collections::BTreeMap<u32, u64>,
}

impl FarIndex {
    /// An index of `entries` (removed ones, id 0, are dropped).
    ///
    /// # Panics
    /// Never; more than `u32::MAX` entries are not indexable and are
    /// refused by the engine's task limit long before.
    pub fn build(mut entries: Vec<FarEntry>) -> FarIndex {
        entries.retain(|e| e.id != 0);
        entries.sort_unstable_by_key(|e| (e.hash, e.id));
        entries.shrink_to_fit();
        FarIndex::from_sorted(entries)
    }

    /// Adds `new` entries, dropping the removed ones: the live entries (in
    /// order already) and the sorted new ones are merged, O(n + m log m).
    /// With nothing new, the array is still rebuilt once tombstones are
    /// more than half of it (their 24 bytes each are then given back).
    pub fn add(&mut self, mut new: Vec<FarEntry>) {
        new.retain(|e| e.id != 0);
        if new.is_empty() && self.live * 2 >= self.entries.len() && self.tail.is_empty() {
            return;
        }
        let sorted = self.sorted;
        let mut old = self.take_entries();
        // The tail joins the new entries; the sorted part stays in order.
        new.extend(old.drain(sorted.min(old.len())..).filter(|e| e.id != 0));
        new.sort_unstable_by_key(|e| (e.hash, e.id));
        let mut merged = Vec::with_capacity(old.len() + new.len());
        let mut old = old.into_iter().filter(|e| e.id != 0).peekable();
        let mut new = new.into_iter().peekable();
        loop {
            let take_old = match (old.peek(), new.peek()) {
                (Some(a), Some(b)) => (a.hash, a.id) <= (b.hash, b.id),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let next = if take_old { old.next() } else { new.next() };
            merged.extend(next);
        }
        merged.shrink_to_fit();
        *self = FarIndex::from_sorted(merged);
    }

    /// The index of `entries`, sorted by (hash, id), all live.
    fn from_sorted(entries: Vec<FarEntry>) -> FarIndex {
        let n = entries.len();
        let bits = if n < 2 * BUCKET_ENTRIES {
            0
        } else {
            (n / BUCKET_ENTRIES).ilog2()
        };
        let mut dir = Vec::new();
        if n > 0 {
            dir.reserve_exact((1usize << bits) + 1);
            let mut i = 0usize;
            for b in 0..(1u64 << bits) {
                while i < n && bucket(entries[i].hash, bits) < b {
                    i += 1;
                }
                dir.push(i as u32);
            }
            dir.push(n as u32);
        }
        let mut per_file = std::collections::BTreeMap::new();
        for e in &entries {
            *per_file.entry(e.file()).or_insert(0) += 1;
        }
        FarIndex {
            entries,
            sorted: n,
            tail: hashbrown::HashTable::new(),
            dir,
            bits,
            live: n,
            per_file,
        }
    }

    /// Rebuilds the sorted array when removed entries are more than half of
    /// it (their memory is given back); otherwise does nothing. The tail
    /// stays as it is.
    pub fn shrink(&mut self) {
        if self.live * 2 < self.entries.len() {
            self.add(Vec::new());
        }
    }

    /// Adds one entry (its id must not be 0 and not be in the index
    /// already). O(1) amortised: into the tail, which is merged into the
    /// sorted array once it holds more than the array (and 65 536 entries).
    pub fn insert(&mut self, entry: FarEntry) {
        if entry.id == 0 {
            return;
        }
        let Ok(pos) = u32::try_from(self.entries.len()) else {
            // Not reachable under the engine's task limit; stays correct.
            self.add(vec![entry]);
            return;
        };
        self.entries.push(entry);
        let entries = &self.entries;
        self.tail
            .insert_unique(entry.hash, pos, |&p| entries[p as usize].hash);
        self.live += 1;
        *self.per_file.entry(entry.file()).or_insert(0) += 1;
        if self.tail.len() > self.sorted.max(TAIL_MERGE_MIN) {
            self.add(Vec::new());
        }
    }

    /// Positions of the live entries whose hash is `hash`.
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let range = if self.dir.is_empty() {
            0..0
        } else {
            let b = bucket(hash, self.bits) as usize;
            self.dir[b] as usize..self.dir[b + 1] as usize
        };
        range
            .chain(self.tail.iter_hash(hash).map(|&p| p as usize))
            .filter(move |&p| {
                let e = &self.entries[p];
                e.hash == hash && e.id != 0
            })
    }

    /// The position of the live entry (`hash`, `loc`, `id`), if any.
    pub fn find(&self, hash: u64, loc: u64, id: u64) -> Option<usize> {
        self.candidates(hash).find(|&p| {
            let e = &self.entries[p];
            e.loc == loc && e.id == id
        })
    }

    /// The position of the live entry of task `id` at `loc`, whatever its
    /// hash. O(n): for the rare failed read only.
    pub fn find_by_place(&self, loc: u64, id: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.loc == loc && e.id == id)
    }

    /// The entry at `pos` (live or removed).
    ///
    /// # Panics
    /// If `pos` is not a position this index handed out.
    pub fn get(&self, pos: usize) -> FarEntry {
        self.entries[pos]
    }

    /// Removes the live entry at `pos` and returns it (`None` if removed
    /// already or out of range). O(1): the entry becomes a tombstone (its
    /// 24 bytes stay until the next rebuild).
    pub fn remove(&mut self, pos: usize) -> Option<FarEntry> {
        let e = self.entries.get_mut(pos)?;
        if e.id == 0 {
            return None;
        }
        let out = *e;
        e.id = 0;
        self.live -= 1;
        if let Some(n) = self.per_file.get_mut(&out.file()) {
            *n -= 1;
            if *n == 0 {
                self.per_file.remove(&out.file());
            }
        }
        Some(out)
    }

    /// Live far tasks.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no far task is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The live entries, in hash order.
    pub fn iter(&self) -> impl Iterator<Item = &FarEntry> {
        self.entries.iter().filter(|e| e.id != 0)
    }

    /// Live far tasks whose entry is in overflow file `file`.
    pub fn live_in_file(&self, file: u32) -> u64 {
        self.per_file.get(&file).copied().unwrap_or(0)
    }

    /// Overflow files holding live far tasks.
    pub fn files(&self) -> impl Iterator<Item = u32> + '_ {
        self.per_file.keys().copied()
    }

    /// Takes every entry out (live ones and tombstones), leaving the index
    /// empty — for a rebuild.
    pub fn take_entries(&mut self) -> Vec<FarEntry> {
        let out = std::mem::take(&mut self.entries);
        *self = FarIndex::default();
        out
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<FarEntry>()
            + self.dir.capacity() * 4
            + self.tail.capacity() * 5
    }
}

/// The tail is merged into the sorted array once it holds more entries than
/// the array and more than this many (so that small indexes do not merge at
/// every insert).
const TAIL_MERGE_MIN: usize = 65_536;

fn bucket(hash: u64, bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        hash >> (64 - bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: u64, id: u64) -> FarEntry {
        FarEntry {
            hash,
            loc: pack_loc((id % 3) as u32 + 1, 64 + id).unwrap(),
            id,
        }
    }

    #[test]
    fn finds_every_entry_and_nothing_else() {
        let hasher = KeyHasher::new(&[7; 16]);
        let entries: Vec<FarEntry> = (1..=10_000u64)
            .map(|id| entry(hasher.hash(format!("k{id}").as_bytes()), id))
            .collect();
        let mut index = FarIndex::build(entries.clone());
        assert_eq!(index.len(), 10_000);
        for e in &entries {
            let pos = index.find(e.hash, e.loc, e.id).expect("present");
            assert_eq!(index.get(pos), *e);
            assert_eq!(index.candidates(e.hash).count(), 1);
        }
        assert_eq!(index.candidates(hasher.hash(b"absent")).count(), 0);
        let files: u64 = (1..=3).map(|f| index.live_in_file(f)).sum();
        assert_eq!(files, 10_000);
        // Remove every other one; the rest stay findable.
        for e in entries.iter().step_by(2) {
            let pos = index.find(e.hash, e.loc, e.id).unwrap();
            assert_eq!(index.remove(pos), Some(*e));
            assert_eq!(index.remove(pos), None);
        }
        assert_eq!(index.len(), 5_000);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(index.find(e.hash, e.loc, e.id).is_some(), i % 2 == 1);
        }
        let rebuilt = FarIndex::build(index.take_entries());
        assert_eq!(rebuilt.len(), 5_000);
        assert_eq!(rebuilt.iter().count(), 5_000);
        assert!(rebuilt.memory_bytes() <= 5_000 * 24 + 5_000);
    }

    #[test]
    fn entries_inserted_one_at_a_time_are_found_before_and_after_merging() {
        let hasher = KeyHasher::new(&[5; 16]);
        let e = |id: u64| entry(hasher.hash(&id.to_le_bytes()), id);
        let mut index = FarIndex::build((1..=1_000).map(e).collect());
        // Into the tail: found at once, alongside the sorted part.
        for id in 1_001..=2_000 {
            index.insert(e(id));
            let x = e(id);
            assert_eq!(index.get(index.find(x.hash, x.loc, x.id).unwrap()), x);
        }
        assert_eq!(index.sorted, 1_000);
        assert_eq!(index.len(), 2_000);
        // Removing from either part leaves a tombstone there.
        for id in (1..=2_000).step_by(4) {
            let x = e(id);
            let pos = index.find(x.hash, x.loc, x.id).unwrap();
            assert_eq!(index.remove(pos), Some(x));
            assert_eq!(index.find(x.hash, x.loc, x.id), None);
        }
        let live = |id: u64| !(id - 1).is_multiple_of(4);
        // A hash shared by a sorted entry and a tail entry gives both.
        let twin = FarEntry { id: 5_000, ..e(2) };
        index.insert(twin);
        assert_eq!(index.candidates(twin.hash).count(), 2);
        // The insert that takes the tail past TAIL_MERGE_MIN (it holds
        // 1 001) merges it into the array.
        let more = (TAIL_MERGE_MIN - 1_000) as u64;
        for id in 10_001..=10_000 + more {
            assert!(!index.tail.is_empty(), "merged early, at {id}");
            index.insert(e(id));
        }
        assert!(index.tail.is_empty(), "merged");
        assert_eq!(index.sorted, index.entries.len());
        let hashes: Vec<u64> = index.entries.iter().map(|x| x.hash).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]));
        let expected = (1..=2_000u64).filter(|&id| live(id)).count() + 1 + more as usize;
        assert_eq!(index.len(), expected);
        assert_eq!(index.iter().count(), expected);
        for id in (1..=2_000).chain(10_001..=10_000 + more) {
            let x = e(id);
            assert_eq!(
                index.find(x.hash, x.loc, x.id).is_some(),
                id > 2_000 || live(id),
                "{id}"
            );
        }
        assert!(index.find(twin.hash, twin.loc, twin.id).is_some());
        let per_file: u64 = (1..=3).map(|f| index.live_in_file(f)).sum();
        assert_eq!(per_file, expected as u64);
        // Id 0 is never inserted.
        index.insert(FarEntry { id: 0, ..e(3) });
        assert_eq!(index.len(), expected);
    }

    #[test]
    fn adding_merges_and_drops_removed_entries() {
        let hasher = KeyHasher::new(&[3; 16]);
        let e = |id: u64| entry(hasher.hash(&id.to_le_bytes()), id);
        let mut index = FarIndex::build((1..=1_000).map(e).collect());
        for id in (1..=1_000).step_by(3) {
            let x = e(id);
            let pos = index.find(x.hash, x.loc, x.id).unwrap();
            index.remove(pos);
        }
        index.add(
            (1_001..=1_500)
                .map(e)
                .chain([FarEntry { id: 0, ..e(9) }])
                .collect(),
        );
        let expected: Vec<u64> = (1..=1_500)
            .filter(|id| id > &1_000 || (id - 1) % 3 != 0)
            .collect();
        assert_eq!(index.len(), expected.len());
        for &id in &expected {
            let x = e(id);
            assert!(index.find(x.hash, x.loc, x.id).is_some(), "{id}");
        }
        // Nothing new, but tombstones are most of it: rebuilt, memory back.
        let mut shrinking = FarIndex::build((1..=100).map(e).collect());
        for id in 1..=60 {
            let x = e(id);
            let pos = shrinking.find(x.hash, x.loc, x.id).unwrap();
            shrinking.remove(pos);
        }
        shrinking.add(Vec::new());
        assert_eq!((shrinking.len(), shrinking.entries.len()), (40, 40));
        let hashes: Vec<u64> = index.iter().map(|x| x.hash).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(index.iter().count(), expected.len());
        let per_file: u64 = (1..=3).map(|f| index.live_in_file(f)).sum();
        assert_eq!(per_file, expected.len() as u64);
    }

    #[test]
    fn equal_hashes_are_all_candidates() {
        let entries: Vec<FarEntry> = (1..=50).map(|id| entry(42 + id % 2, id)).collect();
        let index = FarIndex::build(entries);
        assert_eq!(index.candidates(42).count(), 25);
        assert_eq!(index.candidates(43).count(), 25);
        assert_eq!(index.candidates(44).count(), 0);
        // Extreme hashes land in the first and last buckets.
        let index = FarIndex::build((1..=100).map(|id| entry(u64::MAX - id % 2, id)).collect());
        assert_eq!(index.candidates(u64::MAX).count(), 50);
        let index = FarIndex::build((1..=100).map(|id| entry(id % 2, id)).collect());
        assert_eq!(index.candidates(0).count(), 50);
    }

    #[test]
    fn empty_index_finds_nothing() {
        let index = FarIndex::build(Vec::new());
        assert_eq!(index.candidates(5).count(), 0);
        assert!(index.is_empty());
    }

    #[test]
    fn locations_pack_and_refuse_what_does_not_fit() {
        assert_eq!(unpack_loc(pack_loc(5, 1234).unwrap()), (5, 1234));
        let max = pack_loc(LOC_FILE_MAX, (1 << LOC_OFFSET_BITS) - 1).unwrap();
        assert_eq!(unpack_loc(max), (LOC_FILE_MAX, (1 << LOC_OFFSET_BITS) - 1));
        assert_eq!(pack_loc(LOC_FILE_MAX + 1, 0), None);
        assert_eq!(pack_loc(1, 1 << LOC_OFFSET_BITS), None);
    }

    const GOLDEN: u64 = 18_431_965_016_543_479_886;

    #[test]
    fn the_hash_is_stable_and_keyed() {
        // Stable across builds and restarts: the checkpoint stores it.
        let h = KeyHasher::new(&[0; 16]);
        assert_eq!(
            h.hash(b"order:1"),
            KeyHasher::new(&[0; 16]).hash(b"order:1")
        );
        assert_ne!(
            h.hash(b"order:1"),
            KeyHasher::new(&[1; 16]).hash(b"order:1")
        );
        assert_ne!(h.hash(b"order:1"), h.hash(b"order:2"));
        // Pinned: a change of hash function would strand every far task.
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(KeyHasher::new(&key).hash(b"order:1"), GOLDEN);
    }
}
