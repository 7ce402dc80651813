//! Far tasks: tasks due beyond the far span (`Config::far_span`: the resident
//! window within the horizon), kept out of
//! the timing wheel and the task slab.
//!
//! A far task's key, due time and payload live in one entry of an overflow
//! file (`crate::overflow`, sorted by due time); memory holds only a
//! [`FarEntry`] — the key's 64-bit keyed hash, the task id and the entry's
//! place on disk, packed into 20 bytes — in a [`FarIndex`]. A lookup by key compares
//! hashes; a hash match is confirmed by reading the entry from disk (the
//! rare collision of two keys on one 64-bit hash is resolved there, as the
//! issue and DESIGN.md's tombstone index allow). Once a far task's due time
//! is within the far span from now, the engine reads its overflow file
//! sequentially and *promotes* it into the wheel (`engine/far.rs`).
//!
//! The hash must be the same after a restart (the checkpoint stores it, and
//! open reads no overflow entry of a task still beyond the far span), so it
//! is SipHash-1-3 (Aumasson & Bernstein
//! 2012, the keyed PRF hash tables use against flooding) keyed by the data
//! directory's random store id rather than a per-process seed.

use siphasher::sip::SipHasher13;

/// The keyed hash of far-task keys (see the module docs).
#[derive(Debug, Clone)]
pub struct KeyHasher {
    sip: SipHasher13,
    /// The bits of SipHash's value kept: all of them, unless a test called
    /// [`weaken_key_hash_for_tests`].
    kept: u64,
}

/// The process's far-key hash width, fixed by the first [`KeyHasher`] made
/// (or by [`weaken_key_hash_for_tests`] before it).
static KEPT_HASH_BITS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Test hook, not for use in production: makes every [`KeyHasher`] of this
/// process give one of only `2^bits` values (`bits` < 64), so that
/// distinct far-task keys share a hash — the collision the engine resolves
/// against disk, which a 64-bit SipHash never shows a test. Each value is
/// spread over all 64 bits (the far index takes its shard from the top
/// bits), and a directory written this way must be read this way: its
/// checkpoint holds the weak hashes.
///
/// Call it before any `KeyHasher` is made and any checkpoint is read or
/// written (before the first engine opens): the width is fixed once per
/// process. Returns `Err` with the width
/// already fixed if it differs from `bits`. Checkpoints record a weakened
/// width in their header ([`checkpoint_hash_word`]): a directory written
/// by such a process is refused by an ordinary one, and an ordinary
/// directory by such a process, rather than misread.
#[doc(hidden)]
pub fn weaken_key_hash_for_tests(bits: u32) -> Result<(), u32> {
    let bits = bits.min(64);
    match *KEPT_HASH_BITS.get_or_init(|| bits) {
        fixed if fixed == bits => Ok(()),
        fixed => Err(fixed),
    }
}

/// The word a checkpoint's reserved header field holds: 0 (what every
/// released build writes and reads) unless this process weakened its
/// far-key hash ([`weaken_key_hash_for_tests`]), then a marker naming the
/// width kept. A checkpoint is read only by a process whose word is the
/// same, so a directory written with weak hashes is refused by an ordinary
/// process, and the other way round: with the other width, a lookup by key
/// would miss its far task, and a schedule of a live far task's key would
/// make a second task of that key.
pub(crate) fn checkpoint_hash_word() -> u64 {
    match *KEPT_HASH_BITS.get_or_init(|| 64) {
        64.. => 0,
        // "WEAKHASH" less its last byte, then the width kept.
        bits => 0x5745_414B_4841_5300 | u64::from(bits),
    }
}

impl KeyHasher {
    /// The hasher of the data directory whose store id is `store_id`.
    pub fn new(store_id: &[u8; 16]) -> KeyHasher {
        let bits = *KEPT_HASH_BITS.get_or_init(|| 64);
        KeyHasher {
            sip: SipHasher13::new_with_key(store_id),
            kept: if bits >= 64 {
                u64::MAX
            } else {
                (1 << bits) - 1
            },
        }
    }

    /// The key's 64-bit hash. ~20 ns for a 24-byte key.
    pub fn hash(&self, key: &[u8]) -> u64 {
        let hash = self.sip.hash(key);
        if self.kept == u64::MAX {
            hash
        } else {
            // Weakened for a test: spread the few values kept over all the
            // bits (Fibonacci hashing; 0 stays 0, a value like any other).
            (hash & self.kept).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
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

/// One far task: what a [`FarIndex`] gives and takes (it stores it packed
/// into 20 bytes, see [`FarIndex`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FarEntry {
    /// [`KeyHasher::hash`] of its key.
    pub hash: u64,
    /// Its overflow entry: [`pack_loc`] of (file, byte offset).
    pub loc: u64,
    /// Its task id (0 marks a removed entry).
    pub id: u64,
}

impl FarEntry {
    /// The overflow file holding its entry.
    pub fn file(&self) -> u32 {
        unpack_loc(self.loc).0
    }
}

/// Bits of a task id a [`FarIndex`] keeps: a far task whose id is 2^48 or
/// more (after 2.8 · 10^14 tasks: nine years at a million a second) is not
/// taken into the index ([`FarIndex::can_hold`]; it stays in the wheel).
pub const FAR_ID_BITS: u32 = 48;

/// Overflow files a [`FarIndex`] holds live far tasks of at once, at most
/// (each such file has a 16-bit slot, see [`FarIndex`]): a far task in one
/// more file is not taken into the index ([`FarIndex::can_hold`]; it stays
/// in the wheel). A checkpoint keeps 128 overflow files or fewer.
pub const FAR_FILES_MAX: usize = 1 << 16;

/// The bits of a hash below its shard's ([`SHARD_BITS`]): what a
/// [`Packed`] entry keeps of it (its shard holds the rest).
const HASH_LOW_MASK: u64 = u64::MAX >> SHARD_BITS;

/// Bits of the id in [`Packed::mid`]; the rest are in [`Packed::high`].
const ID_LOW_BITS: u32 = 40;

/// A [`FarEntry`] as a shard stores it: 20 bytes, not 24 — the hash's 56
/// bits below the shard's, the id's 48 bits ([`FAR_ID_BITS`]), the file's
/// 16-bit slot ([`FAR_FILES_MAX`]) and the offset's 40 bits
/// ([`LOC_OFFSET_BITS`]). Packed to 4-byte alignment (fields are only ever
/// read and written by value: no reference to a field is taken, which the
/// compiler refuses for a packed struct anyway). Ordered by
/// `(high, mid)`, which is (hash, id) within a shard.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Packed {
    /// The hash's low 56 bits, then the id's top 8 bits (of 48).
    high: u64,
    /// The id's low 40 bits, the file's slot (16 bits), then the offset's
    /// top 8 bits (of 40).
    mid: u64,
    /// The offset's low 32 bits.
    low: u32,
}

const _: () = assert!(std::mem::size_of::<Packed>() == 20);

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("hash_low", &self.hash_low())
            .field("id", &self.id())
            .field("slot", &self.slot())
            .field("offset", &self.offset())
            .finish()
    }
}

impl Packed {
    const EMPTY: Packed = Packed {
        high: 0,
        mid: 0,
        low: 0,
    };

    /// `id < 2^48` and `offset < 2^40` (the caller checked).
    fn new(hash: u64, id: u64, slot: u16, offset: u64) -> Packed {
        debug_assert!(id >> FAR_ID_BITS == 0 && offset >> LOC_OFFSET_BITS == 0);
        Packed {
            high: ((hash & HASH_LOW_MASK) << SHARD_BITS) | (id >> ID_LOW_BITS),
            mid: ((id & ((1 << ID_LOW_BITS) - 1)) << 24) | (u64::from(slot) << 8) | (offset >> 32),
            low: offset as u32,
        }
    }

    /// The hash's bits below the shard's.
    fn hash_low(self) -> u64 {
        self.high >> SHARD_BITS
    }

    /// The hash's bits below the shard's, at the top of a `u64` (what
    /// [`bucket`] reads).
    fn hash_top(self) -> u64 {
        self.high & !0xFF
    }

    fn id(self) -> u64 {
        ((self.high & 0xFF) << ID_LOW_BITS) | (self.mid >> 24)
    }

    fn is_live(self) -> bool {
        self.id() != 0
    }

    fn slot(self) -> u16 {
        (self.mid >> 8) as u16
    }

    fn offset(self) -> u64 {
        ((self.mid & 0xFF) << 32) | u64::from(self.low)
    }

    /// (hash, id) order within a shard.
    fn order(self) -> (u64, u64) {
        (self.high, self.mid)
    }

    /// Makes it a tombstone: id 0, the rest kept (the hash keeps the
    /// sorted part in order).
    fn kill(&mut self) {
        self.high &= !0xFF;
        self.mid &= 0xFF_FFFF;
    }
}

/// The overflow files holding live far tasks: each one's count of them
/// and its 16-bit slot (what a [`Packed`] entry holds instead of the file's
/// 24-bit number; slots are reused once a file has no live entry left).
#[derive(Debug)]
struct FileSlots {
    /// Per file: live entries, slot.
    live: std::collections::BTreeMap<u32, (u64, u16)>,
    /// The file of each slot (that of a free slot: whichever held it last).
    file_of: Vec<u32>,
    /// Free slots.
    free: Vec<u16>,
    /// Slots at most: [`FAR_FILES_MAX`] (fewer in tests).
    cap: usize,
}

impl Default for FileSlots {
    fn default() -> Self {
        FileSlots {
            live: Default::default(),
            file_of: Vec::new(),
            free: Vec::new(),
            cap: FAR_FILES_MAX,
        }
    }
}

impl FileSlots {
    /// Heap bytes held, the map's estimated (see [`FarIndex::memory_bytes`]).
    fn memory_bytes(&self) -> usize {
        self.live.len() * 48
            + self.file_of.capacity() * std::mem::size_of::<u32>()
            + self.free.capacity() * std::mem::size_of::<u16>()
    }

    /// Whether an entry in `file` can be counted ([`FileSlots::add`]).
    fn can_hold(&self, file: u32) -> bool {
        self.live.contains_key(&file) || self.slots_left() > 0
    }

    /// Slots a file without one can still get: free ones, and those not
    /// yet handed out.
    fn slots_left(&self) -> usize {
        self.free.len() + self.cap.saturating_sub(self.file_of.len())
    }

    /// Counts one more live entry in `file`; its slot, or `None` (nothing
    /// counted) if it has none and none is left.
    fn add(&mut self, file: u32, n: u64) -> Option<u16> {
        use std::collections::btree_map::Entry;
        match self.live.entry(file) {
            Entry::Occupied(mut o) => {
                o.get_mut().0 += n;
                Some(o.get().1)
            }
            Entry::Vacant(v) => {
                let slot = match self.free.pop() {
                    Some(slot) => slot,
                    None if self.file_of.len() >= self.cap => return None,
                    None => {
                        let slot = u16::try_from(self.file_of.len()).ok()?;
                        self.file_of.push(file);
                        slot
                    }
                };
                self.file_of[usize::from(slot)] = file;
                v.insert((n, slot));
                Some(slot)
            }
        }
    }

    /// Counts one live entry of `file` less, freeing its slot at none.
    fn sub(&mut self, file: u32) {
        if let Some((n, slot)) = self.live.get_mut(&file) {
            *n -= 1;
            if *n == 0 {
                self.free.push(*slot);
                self.live.remove(&file);
            }
        }
    }

    fn file(&self, slot: u16) -> u32 {
        self.file_of.get(usize::from(slot)).copied().unwrap_or(0)
    }

    /// The entry `p` of shard `s`, as it was given.
    fn unpack(&self, s: usize, p: Packed) -> FarEntry {
        FarEntry {
            hash: ((s as u64) << (64 - SHARD_BITS)) | p.hash_low(),
            loc: (u64::from(self.file(p.slot())) << LOC_OFFSET_BITS) | p.offset(),
            id: p.id(),
        }
    }
}

/// Entries per directory bucket the index aims at.
const BUCKET_ENTRIES: usize = 4;

/// Shards of a [`FarIndex`], by the top [`SHARD_BITS`] bits of the hash.
const SHARDS: usize = 1 << SHARD_BITS;
/// See [`SHARDS`].
const SHARD_BITS: u32 = 8;

/// Entries per block of a shard's sorted part: 2048 × 20 B = 40 KiB, under
/// glibc's smallest mmap threshold (128 KiB), so that blocks come from the
/// heap and a block freed by one merge is reused as it is by the next.
const BLOCK: usize = 1 << BLOCK_BITS;
/// See [`BLOCK`].
const BLOCK_BITS: u32 = 11;

/// A shard's tail is merged into its sorted part once it holds more than
/// `1/TAIL_FRACTION` of the sorted part and more than [`TAIL_MERGE_MIN`]
/// entries (so that small shards do not merge at every insert).
const TAIL_FRACTION: usize = 8;
/// See [`TAIL_FRACTION`].
const TAIL_MERGE_MIN: usize = 64;

/// A shard holding at least this many entries is rebuilt once removed
/// entries are more than `1/SHRINK_FRACTION` of them (their memory given
/// back).
const SHRINK_MIN: usize = 64;
/// See [`SHRINK_MIN`].
const SHRINK_FRACTION: usize = 4;

/// The far tasks: [`FarEntry`]s in 256 shards by the top 8 bits of the
/// hash, each an array sorted by hash with a directory of the first entry
/// of each range of hashes — a static hash table at 100 % load (about 21
/// bytes per task in all, where a SwissTable of the same 24-byte entries
/// would take 27–54 depending on where its power-of-two growth stands).
///
/// An entry is stored in 20 bytes (`Packed`), not the 24 of a [`FarEntry`]:
/// the hash without the 8 bits its shard gives, the id in 48 bits
/// ([`FAR_ID_BITS`]), and instead of the file's number a 16-bit slot in a
/// table of the files holding live far tasks ([`FAR_FILES_MAX`]; a slot is
/// reused once its file has none left). A far task the index cannot hold
/// ([`FarIndex::can_hold`]) stays in the wheel. (Session 36: 20 M tasks,
/// 80 % far, measured BENCHMARKS.md's figures per far task.)
///
/// Lookup is O(1) expected: the top bits of the hash pick a shard, the next
/// ones a directory bucket of about 4 entries (`BUCKET_ENTRIES`), scanned in
/// order (hashes are uniform: SipHash under a secret key). Removal leaves a
/// tombstone (id 0); a shard is rebuilt once tombstones are more than a
/// quarter of it. Entries are added in bulk — [`FarIndex::build`] at open
/// (O(n log n)), [`FarIndex::add`] (a merge, O(n + m log m)) — or one at a
/// time, [`FarIndex::insert`]: O(1) into its shard's unsorted tail with a
/// hash table of positions (~30 B per entry there), merged into the shard's
/// sorted part once the tail holds more than an eighth of it (a sort of the
/// tail and a merge: amortised O(log n) per insert). Sharding keeps every
/// rebuild and merge to 1/256 of the index: a checkpoint takes tasks out of
/// the wheel one lock hold at a time, each findable by key as soon as it
/// leaves, and no hold may grow with the whole index.
///
/// Memory follows the live entries while they are being inserted and
/// removed, not only after a rebuild: a shard's sorted part is stored in
/// fixed blocks of 2048 entries (`BLOCK`; only its last block is shorter,
/// allocated to its length), and a merge works in place, allocating only
/// the blocks the shard grows by (and a vector of its tail, to sort) and
/// freeing those it shrinks by — no array is ever held twice, and the allocator gets back blocks of one size
/// it reuses as they are, instead of holes between arrays of ever-changing
/// sizes. Measured (20 M entries inserted one at a time by one thread, half
/// removed by another; release build, glibc 2.36; with 24-byte entries,
/// before they were packed into 20): ~28–30 B of RSS per entry while
/// inserting and no growth while removing, against 28–43 B and +60 % (94 B
/// per live entry) with one array per shard rebuilt by copying.
/// At most `u32::MAX` entries per shard, and `usize::MAX >> 8` (2^24 on
/// 32-bit targets) — the engine's task limit is 2^31.
#[derive(Debug)]
pub struct FarIndex {
    shards: Box<[Shard]>,
    live: usize,
    /// Live entries per overflow file, and the files' slots.
    files: FileSlots,
    /// The snapshot being read, if any ([`FarIndex::begin_snapshot`]).
    snapshot: Option<Box<Snapshot>>,
}

/// The changes a [`FarIndex`] snapshot must undo in the shards not read yet
/// (the technique of a fuzzy checkpoint made exact: read the live structure
/// piece by piece, and log what changes under the reader's feet).
#[derive(Debug)]
struct Snapshot {
    /// Shards below it have been read: changes to them no longer matter.
    next_shard: usize,
    /// Per shard not read yet, the entries live at the snapshot and
    /// removed since (as they were), given when the shard is read. An entry
    /// is removed once (a tombstone is not removed again) unless inserted
    /// again, which `inserted` tells: no entry is noted twice.
    removed: Box<[Vec<FarEntry>]>,
    /// Per shard not read yet, the ids of entries inserted since the
    /// snapshot: not part of it, so skipped when the shard is read (and
    /// the shard's set dropped then, so that a long snapshot under many
    /// inserts holds only the sets of the shards still to read). (The
    /// engine inserts when it moves far tasks out of memory: a checkpoint
    /// does before its snapshot, and also while it encodes one, for the far
    /// tasks scheduled meanwhile; the slab's snapshot encodes those.)
    inserted: Box<[std::collections::HashSet<u64, foldhash::fast::RandomState>]>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            next_shard: 0,
            removed: (0..SHARDS).map(|_| Vec::new()).collect(),
            inserted: (0..SHARDS).map(|_| Default::default()).collect(),
        }
    }
}

impl Snapshot {
    fn note_insert(&mut self, e: &FarEntry) {
        let s = shard_of(e.hash);
        if s >= self.next_shard {
            self.inserted[s].insert(e.id);
        }
    }

    fn note_remove(&mut self, e: &FarEntry) {
        let s = shard_of(e.hash);
        if s >= self.next_shard && !self.inserted[s].remove(&e.id) {
            self.removed[s].push(*e);
        }
    }
}

/// One shard of a [`FarIndex`]. Its entries are numbered: the sorted part
/// `0..sorted`, then the tail `sorted..sorted + tail.len()`.
#[derive(Debug, Default)]
struct Shard {
    /// The sorted part, by (hash, id), in blocks of [`BLOCK`] entries; the
    /// last block may be shorter.
    blocks: Vec<Box<[Packed]>>,
    /// Length of the sorted part.
    sorted: usize,
    /// Entries inserted one at a time since the last merge, in insertion
    /// order. Its capacity is kept across merges (it is needed again).
    tail: Vec<Packed>,
    /// Positions (in `tail`) of the tail's entries, by hash.
    tail_index: hashbrown::HashTable<u32>,
    /// `dir[b]` = index of the first sorted entry whose hash's `bits` bits
    /// after the shard's are ≥ `b`; `2^bits + 1` entries (empty while the
    /// sorted part is).
    dir: Vec<u32>,
    bits: u32,
    /// Live entries, in both parts.
    live: usize,
}

impl Default for FarIndex {
    fn default() -> Self {
        FarIndex {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            live: 0,
            files: FileSlots::default(),
            snapshot: None,
        }
    }
}

/// The shard of `hash`.
fn shard_of(hash: u64) -> usize {
    (hash >> (64 - SHARD_BITS)) as usize
}

/// A position in the index: shard, then place in the shard's entries.
fn position(shard: usize, at: usize) -> usize {
    (at << SHARD_BITS) | shard
}

fn unposition(pos: usize) -> (usize, usize) {
    (pos & (SHARDS - 1), pos >> SHARD_BITS)
}

/// The hash a shard's tail table files an entry under. hashbrown takes its
/// 7-bit control tag from the top bits, which every hash of one shard
/// shares (they chose the shard), and its probe start from the low bits:
/// rotated right, both come from bits that differ between entries, so a
/// lookup does not visit every entry of the shard's tail.
/// (Takes a whole hash or its bits below the shard's: the same.)
fn tail_hash(hash: u64) -> u64 {
    (hash & HASH_LOW_MASK).rotate_right(SHARD_BITS)
}

/// Writes a sorted part block by block: every block but the last holds
/// [`BLOCK`] entries; each is allocated for `min(BLOCK, expected left)`
/// entries, so a shard smaller than a block takes no more than it holds
/// (a wrong `expected` costs a reallocation, never a wrong layout).
struct BlockWriter {
    blocks: Vec<Box<[Packed]>>,
    current: Vec<Packed>,
    written: usize,
    expected: usize,
}

impl BlockWriter {
    fn new(expected: usize) -> BlockWriter {
        BlockWriter {
            blocks: Vec::with_capacity(expected.div_ceil(BLOCK)),
            current: Vec::new(),
            written: 0,
            expected,
        }
    }

    fn push(&mut self, e: Packed) {
        if self.current.capacity() == 0 {
            let left = self.expected.saturating_sub(self.written).clamp(1, BLOCK);
            self.current.reserve_exact(left);
        }
        self.current.push(e);
        self.written += 1;
        if self.current.len() == BLOCK {
            self.blocks
                .push(std::mem::take(&mut self.current).into_boxed_slice());
        }
    }

    /// The blocks and the number of entries.
    fn finish(mut self) -> (Vec<Box<[Packed]>>, usize) {
        if !self.current.is_empty() {
            self.blocks.push(self.current.into_boxed_slice());
        }
        (self.blocks, self.written)
    }
}

impl Shard {
    /// A shard of `entries`, sorted by (hash, id), all live; `expected` is
    /// how many there are (a hint for the blocks' sizes).
    fn from_sorted(entries: impl IntoIterator<Item = Packed>, expected: usize) -> Shard {
        let mut out = BlockWriter::new(expected);
        for e in entries {
            out.push(e);
        }
        let (blocks, n) = out.finish();
        let mut shard = Shard {
            blocks,
            sorted: n,
            live: n,
            ..Shard::default()
        };
        shard.build_dir();
        shard
    }

    /// Rebuilds the directory of the sorted part.
    fn build_dir(&mut self) {
        let n = self.sorted;
        self.bits = if n < 2 * BUCKET_ENTRIES {
            0
        } else {
            (n / BUCKET_ENTRIES).ilog2()
        };
        self.dir.clear();
        if n > 0 {
            let len = (1usize << self.bits) + 1;
            if self.dir.capacity() > 2 * len {
                self.dir.shrink_to(len);
            }
            self.dir.reserve_exact(len);
            let mut i = 0usize;
            for b in 0..(1u64 << self.bits) {
                while i < n && bucket_top(self.sorted_entry(i).hash_top(), self.bits) < b {
                    i += 1;
                }
                self.dir.push(i as u32);
            }
            self.dir.push(n as u32);
        }
    }

    /// Sorted entry `at` (`at < sorted`).
    fn sorted_entry(&self, at: usize) -> Packed {
        self.blocks[at >> BLOCK_BITS][at & (BLOCK - 1)]
    }

    /// Entry `at` of the shard, in either part.
    fn entry(&self, at: usize) -> Option<Packed> {
        if at < self.sorted {
            Some(self.sorted_entry(at))
        } else {
            self.tail.get(at - self.sorted).copied()
        }
    }

    fn entry_mut(&mut self, at: usize) -> Option<&mut Packed> {
        if at < self.sorted {
            self.blocks
                .get_mut(at >> BLOCK_BITS)?
                .get_mut(at & (BLOCK - 1))
        } else {
            self.tail.get_mut(at - self.sorted)
        }
    }

    /// Entries held, live or not.
    fn held(&self) -> usize {
        self.sorted + self.tail.len()
    }

    /// Every entry held (tombstones too), sorted part first.
    fn entries(&self) -> impl Iterator<Item = Packed> + '_ {
        self.blocks
            .iter()
            .flat_map(|b| b.iter())
            .chain(self.tail.iter())
            .copied()
    }

    /// Merges `new` (live entries of this shard, already counted in
    /// `live`) and the tail into the sorted part, dropping tombstones, in
    /// place: the live sorted entries slide down over the tombstones, the
    /// blocks grow (or shrink) to the new length, and the sorted new
    /// entries are merged in from the back. O(n + m log m); what it
    /// allocates is the blocks the shard grows by (its last block
    /// reallocated to its new length) and a vector of the tail's live
    /// entries to sort. (A merge that built new blocks and freed the old
    /// ones made glibc keep both when the threads inserting and removing
    /// differ — a block goes back to the arena of the thread that allocated
    /// it: 20 M entries inserted by one thread, half removed by another,
    /// left RSS 60 % above its peak.)
    fn merge(&mut self, mut new: Vec<Packed>) {
        new.extend(self.tail.drain(..).filter(|e| e.is_live()));
        self.tail_index.clear();
        if self.tail.capacity() > 2 * (self.live / TAIL_FRACTION).max(TAIL_MERGE_MIN) {
            // The shard shrank: do not keep a tail sized for what it was.
            self.tail.shrink_to(self.live / TAIL_FRACTION);
            self.tail_index.shrink_to(0, |_| 0);
        }
        new.sort_unstable_by_key(|e| e.order());
        let mut kept = 0;
        for at in 0..self.sorted {
            let e = self.sorted_entry(at);
            if e.is_live() {
                if kept != at {
                    self.set(kept, e);
                }
                kept += 1;
            }
        }
        let total = kept + new.len();
        self.resize_sorted(total);
        // From the back: `at` is the next place to fill, `old` the number
        // of kept entries not placed yet (`at` ≥ `old` throughout).
        let mut old = kept;
        let mut at = total;
        for e in new.into_iter().rev() {
            while old > 0 {
                let o = self.sorted_entry(old - 1);
                if o.order() <= e.order() {
                    break;
                }
                at -= 1;
                old -= 1;
                self.set(at, o);
            }
            at -= 1;
            self.set(at, e);
        }
        self.sorted = total;
        self.live = total;
        self.build_dir();
    }

    fn set(&mut self, at: usize, e: Packed) {
        self.blocks[at >> BLOCK_BITS][at & (BLOCK - 1)] = e;
    }

    /// Makes the sorted part `n` entries long (its first `min(n, sorted)`
    /// kept): every block but the last full, the last allocated to its
    /// length; blocks beyond are freed, missing ones added.
    fn resize_sorted(&mut self, n: usize) {
        const EMPTY: Packed = Packed::EMPTY;
        let blocks = n.div_ceil(BLOCK);
        self.blocks.truncate(blocks);
        for b in 0..blocks {
            let want = if b + 1 == blocks {
                n - b * BLOCK
            } else {
                BLOCK
            };
            match self.blocks.get_mut(b) {
                Some(block) if block.len() == want => {}
                Some(block) => {
                    let mut grown = std::mem::take(block).into_vec();
                    grown.resize(want, EMPTY);
                    *block = grown.into_boxed_slice();
                }
                None => self.blocks.push(vec![EMPTY; want].into_boxed_slice()),
            }
        }
        self.sorted = self.sorted.min(n);
    }

    fn candidates(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let range = if self.dir.is_empty() {
            0..0
        } else {
            let b = bucket_top(hash << SHARD_BITS, self.bits) as usize;
            self.dir[b] as usize..self.dir[b + 1] as usize
        };
        range
            .chain(
                self.tail_index
                    .iter_hash(tail_hash(hash))
                    .map(|&p| self.sorted + p as usize),
            )
            .filter(move |&p| {
                self.entry(p)
                    .is_some_and(|e| e.hash_low() == hash & HASH_LOW_MASK && e.is_live())
            })
    }

    fn memory_bytes(&self) -> usize {
        let entry = std::mem::size_of::<Packed>();
        self.blocks.iter().map(|b| b.len() * entry).sum::<usize>()
            + self.blocks.capacity() * std::mem::size_of::<Box<[Packed]>>()
            + self.tail.capacity() * entry
            + self.dir.capacity() * 4
            + (self.tail_index.capacity() * 8).div_ceil(7) * 5
    }
}

impl FarIndex {
    /// An index of `entries` (removed ones, id 0, are dropped). O(n log n);
    /// entries grouped by shard (a checkpoint's order) are sorted a shard at
    /// a time, in O(n) passes when each shard's run is mostly sorted.
    ///
    /// # Errors
    /// An entry the index cannot hold ([`FarIndex::can_hold`]: an id of
    /// 2^48 or more, or more than [`FAR_FILES_MAX`] files): what and why.
    /// (The engine never makes such a far task: a directory it wrote has
    /// none.)
    ///
    /// # Panics
    /// Never; more than `u32::MAX` entries in a shard are not indexable and
    /// are refused by the engine's task limit long before.
    pub fn build(mut entries: Vec<FarEntry>) -> Result<FarIndex, String> {
        entries.retain(|e| e.id != 0);
        if let Some(e) = entries.iter().find(|e| e.id >> FAR_ID_BITS != 0) {
            return Err(format!(
                "far task {} has an id of {FAR_ID_BITS} bits or more, which no engine makes far",
                e.id
            ));
        }
        if entries.is_sorted_by_key(|e| shard_of(e.hash)) {
            // Grouped by shard, as a checkpoint lists them (each shard's
            // sorted part, then its tail): each shard's run is sorted on its
            // own, by a stable sort that finds the sorted part as one run
            // and merges the rest into it — O(m) passes over a run that fits
            // in cache, where one sort of everything took most of an open.
            let mut start = 0;
            while let Some(first) = entries.get(start) {
                let shard = shard_of(first.hash);
                let end = start + entries[start..].partition_point(|e| shard_of(e.hash) == shard);
                entries[start..end].sort_by_key(|e| (e.hash, e.id));
                start = end;
            }
        } else {
            entries.sort_unstable_by_key(|e| (e.hash, e.id));
        }
        let mut index = FarIndex {
            live: entries.len(),
            ..FarIndex::default()
        };
        // Counted in a hash map (a few files, millions of entries: a search
        // of the ordered map per entry was a tenth of an open), then given
        // slots, which entries are then packed with through another.
        let mut per_file: std::collections::HashMap<u32, u64, foldhash::fast::RandomState> =
            std::collections::HashMap::default();
        for e in &entries {
            *per_file.entry(e.file()).or_insert(0) += 1;
        }
        if per_file.len() > FAR_FILES_MAX {
            return Err(format!(
                "far tasks in {} overflow files, more than the {FAR_FILES_MAX} an engine keeps",
                per_file.len()
            ));
        }
        let mut files: Vec<(u32, u64)> = per_file.into_iter().collect();
        files.sort_unstable();
        let mut slot_of: std::collections::HashMap<u32, u16, foldhash::fast::RandomState> =
            std::collections::HashMap::default();
        for (file, n) in files {
            let Some(slot) = index.files.add(file, n) else {
                return Err(format!("no slot for overflow file {file}"));
            };
            slot_of.insert(file, slot);
        }
        let pack = |e: FarEntry| {
            let (file, offset) = unpack_loc(e.loc);
            Packed::new(e.hash, e.id, slot_of[&file], offset)
        };
        // Sorted by hash, so each shard's entries are one run: copied into
        // the shard's blocks from the back, the array giving its memory
        // back as it goes (a shrinking reallocation of a large block is
        // done in place), so the index is not held twice.
        for s in (0..SHARDS).rev() {
            let start = entries.partition_point(|e| shard_of(e.hash) < s);
            let run = entries.len() - start;
            index.shards[s] = Shard::from_sorted(entries.drain(start..).map(pack), run);
            if s % 16 == 0 {
                entries.shrink_to_fit();
            }
        }
        Ok(index)
    }

    /// Whether an entry of task `id` in overflow file `file` can be taken
    /// in ([`FarIndex::insert`]): `id` below 2^48 ([`FAR_ID_BITS`]) and the
    /// file one of the [`FAR_FILES_MAX`] the index can hold at once. (Its
    /// offset is below 2^40 if it packed into a location: [`pack_loc`].)
    /// A far task that cannot be taken in stays in the wheel. O(log files).
    pub fn can_hold(&self, id: u64, file: u32) -> bool {
        id >> FAR_ID_BITS == 0 && self.files.can_hold(file)
    }

    /// Lets the index hold far tasks of at most `files` overflow files at
    /// once (instead of [`FAR_FILES_MAX`]), for tests of what the engine
    /// does with a far task the index cannot take in.
    #[cfg(test)]
    pub(crate) fn limit_files_for_tests(&mut self, files: usize) {
        self.files.cap = files.min(FAR_FILES_MAX);
    }

    /// Adds `new` entries, dropping the removed ones: each shard's live
    /// entries (in order already) and its sorted new ones are merged,
    /// O(n + m log m).
    ///
    /// # Errors
    /// One of them cannot be taken in ([`FarIndex::can_hold`]): it is
    /// returned, and none is added.
    pub fn add(&mut self, new: Vec<FarEntry>) -> Result<(), FarEntry> {
        let new: Vec<FarEntry> = new.into_iter().filter(|e| e.id != 0).collect();
        let mut new_files = std::collections::BTreeSet::new();
        for e in &new {
            if e.id >> FAR_ID_BITS != 0 {
                return Err(*e);
            }
            if !self.files.live.contains_key(&e.file()) {
                new_files.insert(e.file());
                if new_files.len() > self.files.slots_left() {
                    return Err(*e);
                }
            }
        }
        let mut by_shard: Vec<Vec<Packed>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for e in new {
            if let Some(snapshot) = &mut self.snapshot {
                snapshot.note_insert(&e);
            }
            let (file, offset) = unpack_loc(e.loc);
            let Some(slot) = self.files.add(file, 1) else {
                debug_assert!(false, "slots counted above");
                continue;
            };
            self.live += 1;
            by_shard[shard_of(e.hash)].push(Packed::new(e.hash, e.id, slot, offset));
        }
        for (shard, new) in self.shards.iter_mut().zip(by_shard) {
            if !new.is_empty() || !shard.tail.is_empty() || shard.live < shard.held() {
                shard.live += new.len();
                shard.merge(new);
            }
        }
        Ok(())
    }

    /// Adds one entry (its id must not be 0 and not be in the index
    /// already): into its shard's tail, merged into the shard's sorted part
    /// once it holds more than an eighth of it (amortised O(log n)).
    /// Positions given before an insert are not valid after it (a merge
    /// reorders).
    ///
    /// # Errors
    /// It cannot be taken in ([`FarIndex::can_hold`]; nothing changed):
    /// it is returned. An id of 0 is ignored.
    pub fn insert(&mut self, entry: FarEntry) -> Result<(), FarEntry> {
        if entry.id == 0 {
            return Ok(());
        }
        if entry.id >> FAR_ID_BITS != 0 {
            return Err(entry);
        }
        let s = shard_of(entry.hash);
        if u32::try_from(self.shards[s].tail.len()).is_err() {
            // (`add` notes it for the snapshot.)
            // Not reachable under the engine's task limit; stays correct.
            return self.add(vec![entry]);
        }
        let (file, offset) = unpack_loc(entry.loc);
        let Some(slot) = self.files.add(file, 1) else {
            return Err(entry);
        };
        if let Some(snapshot) = &mut self.snapshot {
            snapshot.note_insert(&entry);
        }
        let shard = &mut self.shards[s];
        let at = shard.tail.len() as u32;
        shard
            .tail
            .push(Packed::new(entry.hash, entry.id, slot, offset));
        let tail = &shard.tail;
        shard
            .tail_index
            .insert_unique(tail_hash(entry.hash), at, |&p| {
                tail_hash(tail[p as usize].hash_low())
            });
        shard.live += 1;
        if shard.tail.len() > (shard.sorted / TAIL_FRACTION).max(TAIL_MERGE_MIN) {
            shard.merge(Vec::new());
        }
        self.live += 1;
        Ok(())
    }

    /// Positions of the live entries whose hash is `hash` (usually none or
    /// one). O(1) expected.
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let s = shard_of(hash);
        self.shards[s]
            .candidates(hash)
            .map(move |at| position(s, at))
    }

    /// Position of the live entry `(hash, loc, id)`, if present.
    pub fn find(&self, hash: u64, loc: u64, id: u64) -> Option<usize> {
        self.candidates(hash).find(|&p| {
            let e = self.get(p);
            e.loc == loc && e.id == id
        })
    }

    /// Position of the live entry at `loc` with task `id`, whatever its
    /// hash. O(n): for checks, not for the hot path.
    pub fn find_by_place(&self, loc: u64, id: u64) -> Option<usize> {
        self.shards.iter().enumerate().find_map(|(s, shard)| {
            shard
                .entries()
                .position(|p| p.is_live() && self.files.unpack(s, p).loc == loc && p.id() == id)
                .map(|at| position(s, at))
        })
    }

    /// The live far task whose entry comes first in overflow file `file`
    /// at or after byte `offset`: `(its entry's offset, its task id)`.
    /// O(n) over the whole index: for going past a damaged entry (see
    /// `Shared::promote_far`), not for the hot path.
    pub fn first_live_in_file_from(&self, file: u32, offset: u64) -> Option<(u64, u64)> {
        if self.live_in_file(file) == 0 {
            return None;
        }
        self.iter()
            .filter_map(|e| {
                let (f, at) = unpack_loc(e.loc);
                (f == file && at >= offset).then_some((at, e.id))
            })
            .min()
    }

    /// The entry at `pos` (from [`FarIndex::candidates`] or
    /// [`FarIndex::find`]).
    ///
    /// # Panics
    /// If `pos` is not a position the index gave (a caller's bug).
    pub fn get(&self, pos: usize) -> FarEntry {
        let (s, at) = unposition(pos);
        match self.shards[s].entry(at) {
            Some(p) => self.files.unpack(s, p),
            None => panic!("far index position {pos} was not given by the index"),
        }
    }

    /// The entry at `pos`, tombstone or not (a tombstone has id 0, and its
    /// location may name another file since), or `None` if there is no
    /// position `pos` — for a position kept across changes of the index,
    /// checked against the entry it gave before it is used.
    pub fn entry_at(&self, pos: usize) -> Option<FarEntry> {
        let (s, at) = unposition(pos);
        let p = self.shards.get(s)?.entry(at)?;
        Some(self.files.unpack(s, p))
    }

    /// Removes the entry at `pos` (a tombstone until its shard is rebuilt,
    /// which happens once tombstones are more than a quarter of it);
    /// returns it, or `None` if it was removed already. Positions given
    /// before a removal are not valid after it.
    pub fn remove(&mut self, pos: usize) -> Option<FarEntry> {
        let (s, at) = unposition(pos);
        let p = self.shards.get(s)?.entry(at)?;
        if !p.is_live() {
            return None;
        }
        let out = self.files.unpack(s, p);
        let shard = &mut self.shards[s];
        if let Some(e) = shard.entry_mut(at) {
            e.kill();
        }
        if let Some(snapshot) = &mut self.snapshot {
            snapshot.note_remove(&out);
        }
        shard.live -= 1;
        let held = shard.held();
        if held >= SHRINK_MIN && (held - shard.live) * SHRINK_FRACTION > held {
            shard.merge(Vec::new());
        }
        self.live -= 1;
        self.files.sub(out.file());
        Some(out)
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The live entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = FarEntry> + '_ {
        self.shards.iter().enumerate().flat_map(move |(s, shard)| {
            shard
                .entries()
                .filter(|p| p.is_live())
                .map(move |p| self.files.unpack(s, p))
        })
    }

    /// Live entries in overflow file `file`.
    pub fn live_in_file(&self, file: u32) -> u64 {
        self.files.live.get(&file).map_or(0, |&(n, _)| n)
    }

    /// Overflow files holding live far tasks.
    pub fn files(&self) -> impl Iterator<Item = u32> + '_ {
        self.files.live.keys().copied()
    }

    /// Starts a snapshot: the live entries as they are now, read a few
    /// shards at a time ([`FarIndex::read_snapshot`]) while the index keeps
    /// changing, each piece in a short hold of the caller's lock — so a
    /// checkpoint encodes millions of far tasks without stopping the engine
    /// for as long (the hold that starts it is O(1)). Until it ends, every
    /// removal from a shard not read yet keeps the entry as it was (24
    /// bytes, in a vector per shard) and every insert into one notes the
    /// task id (a hash set): memory grows with the changes, not with the
    /// index. A snapshot already under way is dropped.
    pub(crate) fn begin_snapshot(&mut self) {
        self.snapshot = Some(Box::default());
    }

    /// Reads the next shards of the snapshot, at least one and, past the
    /// first, while at most `entries_max` entries have been read (live,
    /// tombstones, and those removed since the snapshot): passes each entry
    /// of the snapshot held in them to `emit`. Returns whether every shard
    /// has been read (the snapshot then ends), or `None`
    /// if no snapshot is under way. O(entries read): one shard is 1/256 of
    /// the index, more than `entries_max` in a large one.
    pub(crate) fn read_snapshot(
        &mut self,
        entries_max: usize,
        mut emit: impl FnMut(&FarEntry),
    ) -> Option<bool> {
        let snapshot = self.snapshot.as_mut()?;
        let mut read = 0usize;
        while snapshot.next_shard < SHARDS {
            let s = snapshot.next_shard;
            let shard = &self.shards[s];
            let size = shard.held() + snapshot.removed[s].len();
            if read > 0 && read.saturating_add(size) > entries_max {
                break;
            }
            read += size;
            let inserted = std::mem::take(&mut snapshot.inserted[s]);
            for p in shard.entries().filter(|p| p.is_live()) {
                if inserted.is_empty() || !inserted.contains(&p.id()) {
                    emit(&self.files.unpack(s, p));
                }
            }
            for e in std::mem::take(&mut snapshot.removed[s]) {
                emit(&e);
            }
            snapshot.next_shard += 1;
        }
        let done = snapshot.next_shard == SHARDS;
        if done {
            self.snapshot = None;
        }
        Some(done)
    }

    /// Drops the snapshot under way, if any (a checkpoint that failed).
    pub(crate) fn abort_snapshot(&mut self) {
        self.snapshot = None;
    }

    /// Whether a snapshot is under way.
    #[cfg(test)]
    pub(crate) fn snapshot_active(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Takes every entry out (live ones and tombstones, whose location may
    /// name another file since: see [`FarIndex::entry_at`]), leaving the
    /// index empty — for a rebuild, which drops the tombstones. A snapshot
    /// under way is dropped. Holds the index and the entries it returns at
    /// once (for tests; the engine builds its index at open).
    pub fn take_entries(&mut self) -> Vec<FarEntry> {
        let mut out = Vec::with_capacity(self.shards.iter().map(Shard::held).sum());
        for (s, shard) in self.shards.iter().enumerate() {
            out.extend(shard.entries().map(|p| self.files.unpack(s, p)));
        }
        *self = FarIndex::default();
        out
    }

    /// Heap bytes held: the shards and the table of files' slots (its map
    /// counted at about 48 bytes per file, a B-tree's entry and its share
    /// of a node).
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(Shard::memory_bytes).sum::<usize>()
            + self.shards.len() * std::mem::size_of::<Shard>()
            + self.files.memory_bytes()
    }
}

/// The directory bucket in a shard of `2^bits` buckets of a hash whose
/// bits below the shard's are `top`'s top 56 (`hash << SHARD_BITS`): the
/// first `bits` of them.
fn bucket_top(top: u64, bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        top >> (64 - bits)
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
        let mut index = FarIndex::build(entries.clone()).unwrap();
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
        let rebuilt = FarIndex::build(index.take_entries()).unwrap();
        assert_eq!(rebuilt.len(), 5_000);
        assert_eq!(rebuilt.iter().count(), 5_000);
        assert!(
            rebuilt.memory_bytes()
                <= 5_000 * 20 + 5_000 + SHARDS * (std::mem::size_of::<Shard>() + 16 + 8)
        );
        rebuilt.check();
    }

    /// The first live far task of a file at or after an offset, against a
    /// scan of the entries kept in a plain list.
    #[test]
    fn first_live_in_file_from_is_the_least_live_offset_not_before() {
        let hasher = KeyHasher::new(&[9; 16]);
        let entries: Vec<FarEntry> = (1..=3_000u64)
            .map(|id| entry(hasher.hash(format!("k{id}").as_bytes()), id))
            .collect();
        let mut index = FarIndex::build(entries.clone()).unwrap();
        let mut live = entries.clone();
        for (i, e) in entries.iter().enumerate() {
            if i % 5 == 0 || (1_000..1_400).contains(&e.id) {
                let pos = index.find(e.hash, e.loc, e.id).unwrap();
                index.remove(pos);
                live.retain(|l| l.id != e.id);
            }
        }
        for file in 1..=4u32 {
            for offset in (0..3_200u64).step_by(7) {
                let want = live
                    .iter()
                    .filter_map(|e| {
                        let (f, at) = unpack_loc(e.loc);
                        (f == file && at >= offset).then_some((at, e.id))
                    })
                    .min();
                assert_eq!(index.first_live_in_file_from(file, offset), want);
            }
        }
        assert_eq!(
            index.first_live_in_file_from(3, 64 + 1_000),
            Some((64 + 1_400, 1_400))
        );
    }

    impl FarIndex {
        /// Checks every invariant: each shard's entries are its own, its
        /// sorted part is sorted and its directory right, its tail indexed
        /// and bounded; live counts and per-file counts agree.
        fn check(&self) {
            let mut live = 0;
            let mut per_file = std::collections::BTreeMap::new();
            for (s, shard) in self.shards.iter().enumerate() {
                let entries: Vec<FarEntry> =
                    shard.entries().map(|p| self.files.unpack(s, p)).collect();
                assert!(entries.iter().all(|e| shard_of(e.hash) == s));
                // Every block but the last is full; the sorted part is
                // sorted and its directory right.
                let lens: Vec<usize> = shard.blocks.iter().map(|b| b.len()).collect();
                assert_eq!(lens.iter().sum::<usize>(), shard.sorted);
                if let Some((_, full)) = lens.split_last() {
                    assert!(full.iter().all(|&n| n == BLOCK));
                }
                let sorted: Vec<FarEntry> = entries[..shard.sorted].to_vec();
                // A tombstone keeps its hash but has id 0: order by
                // hash over all entries, by (hash, id) over the live ones.
                assert!(sorted.windows(2).all(|w| w[0].hash <= w[1].hash));
                let live_sorted: Vec<&FarEntry> = sorted.iter().filter(|e| e.id != 0).collect();
                assert!(live_sorted
                    .windows(2)
                    .all(|w| (w[0].hash, w[0].id) < (w[1].hash, w[1].id)));
                for (at, e) in sorted.iter().enumerate() {
                    let b = bucket_top(e.hash << SHARD_BITS, shard.bits) as usize;
                    assert!((shard.dir[b] as usize..shard.dir[b + 1] as usize).contains(&at));
                }
                assert_eq!(shard.tail_index.len(), shard.tail.len());
                assert!(shard.tail.len() <= (shard.sorted / TAIL_FRACTION).max(TAIL_MERGE_MIN));
                let shard_live = entries.iter().filter(|e| e.id != 0).count();
                assert_eq!(shard.live, shard_live);
                let held = shard.held();
                // Inserts can take a shard of < 64 entries holding
                // up to 63 tombstones past 64 without a rebuild.
                assert!(
                    held < SHRINK_MIN
                        || (held - shard_live) * SHRINK_FRACTION <= held
                        || held - shard_live < SHRINK_MIN
                );
                live += shard_live;
                for e in entries.iter().filter(|e| e.id != 0) {
                    *per_file.entry(e.file()).or_insert(0u64) += 1;
                }
            }
            assert_eq!(self.live, live);
            let counts: std::collections::BTreeMap<u32, u64> =
                self.files.live.iter().map(|(&f, &(n, _))| (f, n)).collect();
            assert_eq!(counts, per_file);
            // Each live file has a slot of its own, naming it, not free.
            let mut slots = std::collections::BTreeSet::new();
            for (&file, &(_, slot)) in &self.files.live {
                assert!(slots.insert(slot), "slot {slot} given twice");
                assert_eq!(self.files.file(slot), file);
                assert!(!self.files.free.contains(&slot));
            }
            assert_eq!(
                slots.len() + self.files.free.len(),
                self.files.file_of.len()
            );
        }
    }

    #[test]
    fn entries_inserted_one_at_a_time_are_found_before_and_after_merging() {
        let hasher = KeyHasher::new(&[5; 16]);
        let e = |id: u64| entry(hasher.hash(&id.to_le_bytes()), id);
        let mut index = FarIndex::build((1..=100_000).map(e).collect()).unwrap();
        index.check();
        // Into the tails: found at once, alongside the sorted parts.
        for id in 100_001..=130_000 {
            index.insert(e(id)).unwrap();
            let x = e(id);
            assert_eq!(index.get(index.find(x.hash, x.loc, x.id).unwrap()), x);
        }
        assert!(index.shards.iter().any(|s| !s.tail.is_empty()));
        index.check();
        // Removing from either part leaves a tombstone there.
        for id in (1..=130_000).step_by(4) {
            let x = e(id);
            let pos = index.find(x.hash, x.loc, x.id).unwrap();
            assert_eq!(index.remove(pos), Some(x));
            assert_eq!(index.find(x.hash, x.loc, x.id), None);
        }
        index.check();
        let live = |id: u64| !(id - 1).is_multiple_of(4);
        // A hash shared by a sorted entry and a tail entry gives both.
        let twin = FarEntry {
            id: 500_000,
            ..e(2)
        };
        index.insert(twin).unwrap();
        assert_eq!(index.candidates(twin.hash).count(), 2);
        // Growing the index fivefold one at a time merges every tail into
        // its shard's array on the way (`check`: tails stay bounded).
        for id in 200_001..=700_000 {
            index.insert(e(id)).unwrap();
        }
        index.check();
        let expected = (1..=130_000u64).filter(|&id| live(id)).count() + 1 + 500_000;
        assert_eq!(index.len(), expected);
        assert_eq!(index.iter().count(), expected);
        for id in (1..=130_000).chain(200_001..=700_000) {
            let x = e(id);
            assert_eq!(
                index.find(x.hash, x.loc, x.id).is_some(),
                id > 130_000 || live(id),
                "{id}"
            );
        }
        assert!(index.find(twin.hash, twin.loc, twin.id).is_some());
        // Removing most of it shrinks the shards (`check`: tombstones at
        // most half of every shard of some size).
        for id in 200_001..=690_000 {
            let x = e(id);
            let pos = index.find(x.hash, x.loc, x.id).unwrap();
            index.remove(pos);
        }
        index.check();
        assert_eq!(index.len(), expected - 490_000);
        assert!(index.memory_bytes() < 200_000 * 20);
        // Id 0 is never inserted.
        index.insert(FarEntry { id: 0, ..e(3) }).unwrap();
        assert_eq!(index.len(), expected - 490_000);
    }

    /// Reviewer's probe: a lookup in a shard's tail visits (almost) only
    /// entries with the hash sought, although every hash of a shard shares
    /// its top byte.
    #[test]
    fn a_tail_lookup_does_not_visit_the_whole_shard() {
        let hasher = KeyHasher::new(&[9; 16]);
        let mut index = FarIndex::default();
        let in_shard_0 = (1..).map(|i: u64| (i, hasher.hash(&i.to_le_bytes())));
        let mut shard0 = in_shard_0.filter(|&(_, h)| shard_of(h) == 0);
        for (id, h) in shard0.by_ref().take(TAIL_MERGE_MIN) {
            index.insert(entry(h, id)).unwrap();
        }
        assert_eq!(index.shards[0].tail.len(), TAIL_MERGE_MIN);
        let mut visited = 0;
        for (_, h) in shard0.take(1_000) {
            visited += index.shards[0].tail_index.iter_hash(tail_hash(h)).count();
        }
        // hashbrown's 7-bit tags let about 1 in 128 entries of a probed
        // group through (well under 0.2 per lookup here); with the shard's
        // top byte as the tag every entry of a group did (about 14 per
        // lookup with 200 in the tail, 7 with 64).
        assert!(
            visited < 300,
            "{visited} tail entries visited in 1 000 absent lookups"
        );
    }

    #[test]
    fn adding_merges_and_drops_removed_entries() {
        let hasher = KeyHasher::new(&[3; 16]);
        let e = |id: u64| entry(hasher.hash(&id.to_le_bytes()), id);
        let mut index = FarIndex::build((1..=1_000).map(e).collect()).unwrap();
        for id in (1..=1_000).step_by(3) {
            let x = e(id);
            let pos = index.find(x.hash, x.loc, x.id).unwrap();
            index.remove(pos);
        }
        index
            .add(
                (1_001..=1_500)
                    .map(e)
                    .chain([FarEntry { id: 0, ..e(9) }])
                    .collect(),
            )
            .unwrap();
        let expected: Vec<u64> = (1..=1_500)
            .filter(|id| id > &1_000 || (id - 1) % 3 != 0)
            .collect();
        assert_eq!(index.len(), expected.len());
        for &id in &expected {
            let x = e(id);
            assert!(index.find(x.hash, x.loc, x.id).is_some(), "{id}");
        }
        index.check();
        // Nothing new, but tombstones: rebuilt, memory back.
        let mut shrinking = FarIndex::build((1..=100).map(e).collect()).unwrap();
        for id in 1..=60 {
            let x = e(id);
            let pos = shrinking.find(x.hash, x.loc, x.id).unwrap();
            shrinking.remove(pos);
        }
        shrinking.add(Vec::new()).unwrap();
        let held: usize = shrinking.shards.iter().map(Shard::held).sum();
        assert_eq!((shrinking.len(), held), (40, 40));
        shrinking.check();
        assert_eq!(index.iter().count(), expected.len());
        let per_file: u64 = (1..=3).map(|f| index.live_in_file(f)).sum();
        assert_eq!(per_file, expected.len() as u64);
    }

    #[test]
    fn a_kept_position_is_checked_against_its_entry() {
        let hasher = KeyHasher::new(&[4; 16]);
        let e = |id: u64| entry(hasher.hash(&id.to_le_bytes()), id);
        let mut index = FarIndex::build((1..=20_000).map(e).collect()).unwrap();
        let x = e(7);
        let pos = index.find(x.hash, x.loc, x.id).unwrap();
        assert_eq!(index.entry_at(pos), Some(x));
        assert_eq!(index.entry_at(usize::MAX), None);
        // Removing the rest of its shard rebuilds it: the kept position
        // no longer gives `x` (another entry, a tombstone or nothing).
        let shard = shard_of(x.hash);
        let others: Vec<FarEntry> = (8..=20_000)
            .map(e)
            .filter(|o| shard_of(o.hash) == shard)
            .collect();
        for o in &others[..others.len() / 2] {
            let p = index.find(o.hash, o.loc, o.id).unwrap();
            index.remove(p);
        }
        assert_ne!(index.entry_at(pos), Some(x));
        let moved = index.find(x.hash, x.loc, x.id).unwrap();
        assert_eq!(index.entry_at(moved), Some(x));
        // A removed entry's position gives its tombstone.
        index.remove(moved);
        assert_eq!(index.entry_at(moved).map(|t| t.id), Some(0));
    }

    /// Inserts, removals and bulk adds in a random order against a
    /// reference set: every merge (in place, growing or shrinking a shard's
    /// blocks) keeps exactly the live entries, sorted, with a right
    /// directory.
    #[test]
    fn random_operations_match_a_reference_set() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Few distinct top bytes, so that shards hold several blocks.
        let e = |id: u64| {
            let h = KeyHasher::new(&[6; 16]).hash(&id.to_le_bytes());
            entry((h >> 8) | ((id % 4) << 56), id)
        };
        let mut index = FarIndex::build((1..=5_000).map(e).collect()).unwrap();
        let mut live: std::collections::BTreeSet<u64> = (1..=5_000).collect();
        let mut next_id = 5_001u64;
        for round in 0..30_000u32 {
            match next() % 10 {
                0..=4 => {
                    index.insert(e(next_id)).unwrap();
                    live.insert(next_id);
                    next_id += 1;
                }
                5..=8 => {
                    let Some(&id) = live.range(next() % next_id..).next() else {
                        continue;
                    };
                    let x = e(id);
                    let pos = index.find(x.hash, x.loc, x.id).expect("live entry found");
                    assert_eq!(index.remove(pos), Some(x));
                    live.remove(&id);
                }
                _ => {
                    let n = next() % 200;
                    index.add((next_id..next_id + n).map(e).collect()).unwrap();
                    live.extend(next_id..next_id + n);
                    next_id += n;
                }
            }
            if round % 5_000 == 0 {
                index.check();
            }
        }
        index.check();
        assert_eq!(index.len(), live.len());
        let mut ids: Vec<u64> = index.iter().map(|x| x.id).collect();
        ids.sort_unstable();
        assert!(ids.iter().eq(live.iter()));
        for id in 1..next_id {
            let x = e(id);
            assert_eq!(
                index.find(x.hash, x.loc, x.id).is_some(),
                live.contains(&id)
            );
        }
        assert!(index.shards.iter().any(|s| s.blocks.len() > 2));
    }

    /// Entries grouped by shard, each shard's run a sorted part then an
    /// unsorted tail (a checkpoint's order), build the same index as the
    /// same entries in any order.
    #[test]
    fn entries_grouped_by_shard_build_the_same_index() {
        let hasher = KeyHasher::new(&[9; 16]);
        let mut entries: Vec<FarEntry> = (1..=20_000u64)
            .map(|id| entry(hasher.hash(format!("k{id}").as_bytes()), id))
            .collect();
        entries.sort_unstable_by_key(|e| (e.hash, e.id));
        // Within each shard, its last fifth reversed (the tail), and a removed
        // entry (id 0) among them.
        let mut grouped = Vec::new();
        for s in 0..SHARDS {
            let mut run: Vec<FarEntry> = entries
                .iter()
                .filter(|e| shard_of(e.hash) == s)
                .copied()
                .collect();
            let cut = run.len() * 4 / 5;
            run[cut..].reverse();
            if let Some(e) = run.get_mut(cut) {
                e.id = 0;
            }
            grouped.extend(run);
        }
        assert!(grouped.is_sorted_by_key(|e| shard_of(e.hash)));
        assert!(!grouped.is_sorted_by_key(|e| (e.hash, e.id)));
        let mut scattered = grouped.clone();
        scattered.sort_unstable_by_key(|e| e.id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        assert!(!scattered.is_sorted_by_key(|e| shard_of(e.hash)));
        let from_grouped = FarIndex::build(grouped.clone()).unwrap();
        let from_scattered = FarIndex::build(scattered).unwrap();
        from_grouped.check();
        assert_eq!(from_grouped.len(), 20_000 - SHARDS);
        assert!(from_grouped.iter().eq(from_scattered.iter()));
        for e in grouped.iter().filter(|e| e.id != 0) {
            assert!(from_grouped.find(e.hash, e.loc, e.id).is_some());
        }
    }

    #[test]
    fn equal_hashes_are_all_candidates() {
        let entries: Vec<FarEntry> = (1..=50).map(|id| entry(42 + id % 2, id)).collect();
        let index = FarIndex::build(entries).unwrap();
        assert_eq!(index.candidates(42).count(), 25);
        assert_eq!(index.candidates(43).count(), 25);
        assert_eq!(index.candidates(44).count(), 0);
        // Extreme hashes land in the first and last buckets.
        let index =
            FarIndex::build((1..=100).map(|id| entry(u64::MAX - id % 2, id)).collect()).unwrap();
        assert_eq!(index.candidates(u64::MAX).count(), 50);
        let index = FarIndex::build((1..=100).map(|id| entry(id % 2, id)).collect()).unwrap();
        assert_eq!(index.candidates(0).count(), 50);
    }

    #[test]
    fn empty_index_finds_nothing() {
        let index = FarIndex::build(Vec::new()).unwrap();
        assert_eq!(index.candidates(5).count(), 0);
        assert!(index.is_empty());
    }

    /// A packed entry gives back every bit of what it was given, at the
    /// extremes of each field.
    #[test]
    fn packed_entries_keep_every_field_whole() {
        let id_max = (1u64 << FAR_ID_BITS) - 1;
        let offset_max = (1u64 << LOC_OFFSET_BITS) - 1;
        let mut files = FileSlots::default();
        for (hash, id, file, offset) in [
            (u64::MAX, id_max, LOC_FILE_MAX, offset_max),
            (0, 1, 0, 0),
            (0x8000_0000_0000_0001, 1 << 40, 7, 1 << 32),
            (0x00FF_FFFF_FFFF_FF00, (1 << 40) - 1, 1, (1 << 32) - 1),
            (0x0123_4567_89AB_CDEF, 0xFF00_0000_0001, 2, 0xAB_0000_0001),
        ] {
            let slot = files.add(file, 1).unwrap();
            let p = Packed::new(hash, id, slot, offset);
            let e = files.unpack(shard_of(hash), p);
            assert_eq!(
                e,
                FarEntry {
                    hash,
                    loc: pack_loc(file, offset).unwrap(),
                    id
                }
            );
            assert!(p.is_live());
            let mut dead = p;
            dead.kill();
            assert_eq!(
                (dead.id(), dead.hash_low(), dead.is_live()),
                (0, p.hash_low(), false)
            );
        }
        // Slot 65 535, the last.
        let p = Packed::new(1, 1, u16::MAX, offset_max);
        assert_eq!((p.slot(), p.offset(), p.id()), (u16::MAX, offset_max, 1));
        // (hash, id) order, whatever the rest.
        let a = Packed::new(5, 1 << 41, 0, 9);
        let b = Packed::new(5, (1 << 41) + 1, 9, 0);
        let c = Packed::new(6, 1, 0, 0);
        assert!(a.order() < b.order() && b.order() < c.order());
    }

    /// Ids of 48 bits or more and files beyond the slots are refused
    /// whole (nothing changes); a file's slot is freed with its last live
    /// entry and given to the next file.
    #[test]
    fn entries_the_index_cannot_hold_are_refused() {
        let hasher = KeyHasher::new(&[2; 16]);
        let at = |id: u64, file: u32| FarEntry {
            hash: hasher.hash(&id.to_le_bytes()),
            loc: pack_loc(file, 64 + id % 1_000).unwrap(),
            id,
        };
        let mut index = FarIndex::default();
        index.limit_files_for_tests(2);
        let big = at(1 << FAR_ID_BITS, 1);
        assert!(!index.can_hold(big.id, 1));
        assert_eq!(index.insert(big), Err(big));
        assert_eq!(index.add(vec![at(1, 1), big]), Err(big));
        assert!(index.is_empty());
        index.insert(at(1, 10)).unwrap();
        index.insert(at(2, 11)).unwrap();
        index.insert(at(3, 11)).unwrap();
        // Two files hold the two slots: a third is refused, theirs not.
        assert!(!index.can_hold(4, 12));
        assert!(index.can_hold(4, 10) && index.can_hold(4, 11));
        assert_eq!(index.insert(at(4, 12)), Err(at(4, 12)));
        assert_eq!(index.add(vec![at(5, 10), at(6, 12)]), Err(at(6, 12)));
        assert_eq!(index.len(), 3);
        index.check();
        // File 10's last entry goes: its slot is file 12's.
        let e = at(1, 10);
        index
            .remove(index.find(e.hash, e.loc, e.id).unwrap())
            .unwrap();
        assert!(index.can_hold(4, 12) && index.can_hold(4, 10));
        index.insert(at(4, 12)).unwrap();
        assert!(!index.can_hold(7, 10));
        index.add(vec![at(5, 11), at(6, 12)]).unwrap();
        index.check();
        for (id, file) in [(2, 11), (3, 11), (4, 12), (5, 11), (6, 12)] {
            let e = at(id, file);
            assert_eq!(index.get(index.find(e.hash, e.loc, e.id).unwrap()), e);
        }
        assert_eq!(index.find(e.hash, e.loc, e.id), None);
        assert_eq!((index.live_in_file(11), index.live_in_file(12)), (3, 2));
        assert_eq!(index.files().collect::<Vec<_>>(), [11, 12]);
        // A build refuses what no engine makes far.
        assert!(FarIndex::build(vec![at(1, 1), big]).is_err());
        let many: Vec<FarEntry> = (1..=FAR_FILES_MAX as u64 + 1)
            .map(|i| at(i, i as u32))
            .collect();
        assert!(FarIndex::build(many[1..].to_vec()).is_ok());
        let err = FarIndex::build(many).unwrap_err();
        assert!(err.contains("65537 overflow files"), "{err}");
    }

    #[test]
    fn locations_pack_and_refuse_what_does_not_fit() {
        assert_eq!(unpack_loc(pack_loc(5, 1234).unwrap()), (5, 1234));
        let max = pack_loc(LOC_FILE_MAX, (1 << LOC_OFFSET_BITS) - 1).unwrap();
        assert_eq!(unpack_loc(max), (LOC_FILE_MAX, (1 << LOC_OFFSET_BITS) - 1));
        assert_eq!(pack_loc(LOC_FILE_MAX + 1, 0), None);
        assert_eq!(pack_loc(1, 1 << LOC_OFFSET_BITS), None);
    }

    // A reviewer's tests: the in-place merge against a model.

    /// Checks `index` against the reference `model` (id → entry): every
    /// invariant, the live set, lookups of live and removed entries,
    /// candidate counts per hash, kept positions.
    fn agree(
        index: &FarIndex,
        model: &std::collections::BTreeMap<u64, FarEntry>,
        removed: &[FarEntry],
    ) {
        index.check();
        assert_eq!(index.len(), model.len());
        assert_eq!(index.is_empty(), model.is_empty());
        let mut got: Vec<FarEntry> = index.iter().collect();
        got.sort_unstable_by_key(|e| e.id);
        let want: Vec<FarEntry> = model.values().copied().collect();
        assert_eq!(got, want);
        let mut per_hash: std::collections::HashMap<u64, usize> = Default::default();
        for e in model.values() {
            *per_hash.entry(e.hash).or_default() += 1;
        }
        for e in model.values() {
            let pos = index.find(e.hash, e.loc, e.id).expect("live entry found");
            assert_eq!(index.get(pos), *e);
            assert_eq!(index.entry_at(pos), Some(*e));
            assert_eq!(index.candidates(e.hash).count(), per_hash[&e.hash]);
            for p in index.candidates(e.hash) {
                assert_eq!(index.get(p).hash, e.hash);
            }
        }
        for e in removed {
            assert_eq!(index.find(e.hash, e.loc, e.id), None, "removed {e:?} found");
        }
        for e in model.values().step_by(model.len() / 8 + 1) {
            let pos = index.find(e.hash, e.loc, e.id).unwrap();
            assert_eq!(index.find_by_place(e.loc, e.id), Some(pos));
        }
        let blocks: usize = index
            .shards
            .iter()
            .map(|s| s.blocks.iter().map(|b| b.len()).sum::<usize>())
            .sum();
        assert!(index.memory_bytes() >= blocks * std::mem::size_of::<Packed>());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// `n` single inserts into shard `top`, hashes from a pool of
        /// `pool` values (0: all distinct).
        Insert { top: u8, n: usize, pool: u64 },
        /// A bulk add of `n` entries (and an id-0 one if `zero`).
        Add {
            top: u8,
            n: usize,
            pool: u64,
            zero: bool,
        },
        /// Removes `n` live entries of shard `top` (all if `n` ≥ its live).
        Remove { top: u8, n: usize, seed: u64 },
        /// Removes every live entry of shard `top` but `keep`.
        ShrinkTo { top: u8, keep: usize },
        /// Remove at a position kept across other removals, checked with
        /// `entry_at` first (as `drop_far` does).
        KeptPositions { top: u8, n: usize },
        /// `add(vec![])`: merges every shard with a tail or tombstones.
        AddNothing,
        /// `build(take_entries())`.
        Rebuild,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let top = prop_oneof![Just(0u8), Just(1u8), Just(255u8)];
        let pool = prop_oneof![Just(0u64), Just(1u64), Just(3u64), Just(50u64)];
        let n = prop_oneof![
            0usize..5,
            60usize..70,
            2040usize..2060,
            0usize..3000,
            4090usize..4100
        ];
        prop_oneof![
            (top.clone(), n.clone(), pool.clone()).prop_map(|(top, n, pool)| Op::Insert {
                top,
                n,
                pool
            }),
            (top.clone(), n.clone(), pool, any::<bool>())
                .prop_map(|(top, n, pool, zero)| Op::Add { top, n, pool, zero }),
            (top.clone(), n.clone(), any::<u64>()).prop_map(|(top, n, seed)| Op::Remove {
                top,
                n,
                seed
            }),
            (
                top.clone(),
                prop_oneof![
                    Just(0usize),
                    Just(1),
                    Just(2047),
                    Just(2048),
                    Just(2049),
                    0usize..100
                ]
            )
                .prop_map(|(top, keep)| Op::ShrinkTo { top, keep }),
            (top, 1usize..300).prop_map(|(top, n)| Op::KeptPositions { top, n }),
            Just(Op::AddNothing),
            Just(Op::Rebuild),
        ]
    }

    fn run_ops(ops: Vec<Op>) {
        let mut index = FarIndex::default();
        let mut model: std::collections::BTreeMap<u64, FarEntry> = Default::default();
        let mut removed: Vec<FarEntry> = Vec::new();
        let mut next_id = 1u64;
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let make = |top: u8, pool: u64, n: u64, r: u64| {
            // Ids unique but not increasing (a bijection mod 2^39).
            let id = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & ((1 << 39) - 1)) + 1;
            let low = if pool == 0 {
                r
            } else {
                (r % pool).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            };
            entry((u64::from(top) << 56) | (low >> 8), id)
        };
        for op in ops {
            match op {
                Op::Insert { top, n, pool } => {
                    for _ in 0..n {
                        let e = make(top, pool, next_id, rand());
                        next_id += 1;
                        index.insert(e).unwrap();
                        model.insert(e.id, e);
                    }
                }
                Op::Add { top, n, pool, zero } => {
                    let mut batch: Vec<FarEntry> = (0..n)
                        .map(|_| {
                            let e = make(top, pool, next_id, rand());
                            next_id += 1;
                            e
                        })
                        .collect();
                    for e in &batch {
                        model.insert(e.id, *e);
                    }
                    if zero {
                        batch.push(FarEntry {
                            id: 0,
                            ..make(top, pool, 1, rand())
                        });
                    }
                    // Unsorted, as a caller may give them.
                    batch.reverse();
                    index.add(batch).unwrap();
                }
                Op::Remove { top, n, seed } => {
                    let mut ids: Vec<u64> = model
                        .values()
                        .filter(|e| shard_of(e.hash) == usize::from(top))
                        .map(|e| e.id)
                        .collect();
                    let mut s = seed | 1;
                    for i in (1..ids.len()).rev() {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        ids.swap(i, (s % (i as u64 + 1)) as usize);
                    }
                    for id in ids.into_iter().take(n) {
                        let e = model.remove(&id).unwrap();
                        let pos = index.find(e.hash, e.loc, e.id).expect("live found");
                        assert_eq!(index.remove(pos), Some(e));
                        removed.push(e);
                    }
                }
                Op::ShrinkTo { top, keep } => {
                    let ids: Vec<u64> = model
                        .values()
                        .filter(|e| shard_of(e.hash) == usize::from(top))
                        .map(|e| e.id)
                        .collect();
                    let drop_n = ids.len().saturating_sub(keep);
                    for id in ids.into_iter().take(drop_n) {
                        let e = model.remove(&id).unwrap();
                        let pos = index.find(e.hash, e.loc, e.id).expect("live found");
                        assert_eq!(index.remove(pos), Some(e));
                        removed.push(e);
                    }
                }
                Op::KeptPositions { top, n } => {
                    // As cancel_many: find all first, then remove each at its
                    // kept position if `entry_at` still gives it.
                    let victims: Vec<(usize, FarEntry)> = model
                        .values()
                        .filter(|e| shard_of(e.hash) == usize::from(top))
                        .take(n)
                        .map(|e| (index.find(e.hash, e.loc, e.id).unwrap(), *e))
                        .collect();
                    for (pos, e) in victims {
                        let pos = if index.entry_at(pos) == Some(e) {
                            pos
                        } else {
                            index.find(e.hash, e.loc, e.id).expect("still live")
                        };
                        assert_eq!(index.remove(pos), Some(e));
                        model.remove(&e.id);
                        removed.push(e);
                    }
                }
                Op::AddNothing => index.add(Vec::new()).unwrap(),
                Op::Rebuild => {
                    let all = index.take_entries();
                    assert!(index.is_empty());
                    let mut live: Vec<u64> =
                        all.iter().filter(|e| e.id != 0).map(|e| e.id).collect();
                    live.sort_unstable();
                    assert!(live.iter().eq(model.keys()));
                    index = FarIndex::build(all).unwrap();
                }
            }
            agree(&index, &model, &removed);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: std::env::var("KAIROS_FAR_INDEX_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48), ..Default::default() })]
        #[test]
        fn random_operations_agree_with_a_model_step_by_step(ops in proptest::collection::vec(op(), 1..14)) {
            run_ops(ops);
        }
    }

    /// Exact sizes around a block: a shard built, grown or shrunk to
    /// 0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 BLOCK ± 1 entries by each path.
    #[test]
    fn shards_grown_and_shrunk_across_block_boundaries() {
        let sizes = [
            0usize,
            1,
            63,
            64,
            65,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            2 * BLOCK - 1,
            2 * BLOCK,
            2 * BLOCK + 1,
        ];
        for &start in &sizes {
            for &target in &sizes {
                // Grow or shrink by single inserts / removals, then by add.
                for path in 0..3 {
                    let mut ops = vec![Op::Add {
                        top: 7,
                        n: start,
                        pool: 0,
                        zero: false,
                    }];
                    if target >= start {
                        let n = target - start;
                        ops.push(match path {
                            0 => Op::Insert { top: 7, n, pool: 0 },
                            1 => Op::Add {
                                top: 7,
                                n,
                                pool: 0,
                                zero: true,
                            },
                            _ => Op::Insert { top: 7, n, pool: 2 },
                        });
                    } else {
                        ops.push(Op::ShrinkTo {
                            top: 7,
                            keep: target,
                        });
                    }
                    ops.push(Op::AddNothing);
                    ops.push(Op::Insert {
                        top: 7,
                        n: 3,
                        pool: 0,
                    });
                    ops.push(Op::ShrinkTo { top: 7, keep: 0 });
                    ops.push(Op::AddNothing);
                    ops.push(Op::Insert {
                        top: 7,
                        n: 70,
                        pool: 0,
                    });
                    run_ops(ops);
                }
            }
        }
    }

    /// One step of a snapshot test.
    #[derive(Debug, Clone)]
    enum SnapOp {
        /// A new task: (hash, due to go in the tail or merge).
        Insert(u64),
        /// Remove the `n`-th live entry (mod the count).
        Remove(usize),
        /// Remove the `n`-th live entry and insert it again at another
        /// place (a far task moved: same key, so same hash and shard).
        Move(usize),
        /// Read shards holding up to this many entries.
        Read(usize),
        /// A batch add (a relocation's merge).
        Add(Vec<u64>),
    }

    /// Hashes from few top bytes, so that shards hold many entries and
    /// reads stop inside the run of shards.
    fn snap_hash() -> impl proptest::strategy::Strategy<Value = u64> + Clone {
        use proptest::prelude::*;
        (0u64..6, any::<u64>()).prop_map(|(top, low)| (top << 61) | (low >> 3))
    }

    fn snap_op() -> impl proptest::strategy::Strategy<Value = SnapOp> {
        use proptest::prelude::*;
        let hash = snap_hash();
        prop_oneof![
            3 => hash.clone().prop_map(SnapOp::Insert),
            3 => any::<usize>().prop_map(SnapOp::Remove),
            2 => any::<usize>().prop_map(SnapOp::Move),
            2 => (0usize..400).prop_map(SnapOp::Read),
            1 => proptest::collection::vec(hash, 0..40).prop_map(SnapOp::Add),
        ]
    }

    /// Runs `ops` on an index of `initial` entries with a snapshot begun
    /// after `before` of them, and checks the snapshot gives exactly the
    /// entries live when it began, each once, and that the index itself
    /// ends as a model says.
    fn run_snapshot(initial: Vec<u64>, ops: Vec<SnapOp>, before: usize) {
        let mut next_id = 1u64;
        let mut fresh = |hash: u64| {
            let e = FarEntry {
                hash,
                loc: pack_loc(1, next_id * 8).unwrap(),
                id: next_id,
            };
            next_id += 1;
            e
        };
        let mut index = FarIndex::build(initial.into_iter().map(&mut fresh).collect()).unwrap();
        let mut model: std::collections::BTreeMap<u64, FarEntry> =
            index.iter().map(|e| (e.id, e)).collect();
        let mut expected: Option<Vec<FarEntry>> = None;
        let mut got: Vec<FarEntry> = Vec::new();
        let begin_at = before.min(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            if i == begin_at {
                index.begin_snapshot();
                expected = Some(model.values().copied().collect());
            }
            match op {
                SnapOp::Insert(hash) => {
                    let e = fresh(hash);
                    index.insert(e).unwrap();
                    model.insert(e.id, e);
                }
                SnapOp::Remove(n) | SnapOp::Move(n) if !model.is_empty() => {
                    let e = *model.values().nth(n % model.len()).unwrap();
                    let pos = index.find(e.hash, e.loc, e.id).expect("live");
                    assert_eq!(index.remove(pos), Some(e));
                    model.remove(&e.id);
                    if let SnapOp::Move(_) = op {
                        let moved = FarEntry {
                            loc: pack_loc(2, e.id * 8).unwrap(),
                            ..e
                        };
                        index.insert(moved).unwrap();
                        model.insert(moved.id, moved);
                    }
                }
                SnapOp::Remove(_) | SnapOp::Move(_) => {}
                SnapOp::Read(max) => {
                    index.read_snapshot(max, |e| got.push(*e));
                }
                SnapOp::Add(hashes) => {
                    let new: Vec<FarEntry> = hashes.into_iter().map(&mut fresh).collect();
                    for e in &new {
                        model.insert(e.id, *e);
                    }
                    index.add(new).unwrap();
                }
            }
        }
        if expected.is_none() {
            index.begin_snapshot();
            expected = Some(model.values().copied().collect());
        }
        // (A read that reaches the last shard ends it.)
        while index.snapshot_active() {
            assert!(index.read_snapshot(100, |e| got.push(*e)).is_some());
        }
        got.sort_unstable_by_key(|e| e.id);
        assert_eq!(Some(got), expected, "the snapshot is the index as it began");
        let mut now: Vec<FarEntry> = index.iter().collect();
        now.sort_unstable_by_key(|e| e.id);
        assert_eq!(now, model.values().copied().collect::<Vec<_>>());
        // With no snapshot, nothing is noted and nothing is read.
        index.insert(fresh(5)).unwrap();
        assert_eq!(index.read_snapshot(0, |_| panic!("no snapshot")), None);
    }

    #[test]
    fn a_snapshot_read_in_pieces_is_the_index_as_it_began() {
        use SnapOp::*;
        // Removed before its shard is read, moved, then removed again; an
        // entry inserted and removed unseen; reads in between.
        let ops = vec![
            Remove(0),
            Move(3),
            Insert(1 << 61),
            Read(1),
            Remove(7),
            Move(0),
            Remove(0),
            Add(vec![2 << 61, 5 << 61]),
            Read(10),
            Remove(2),
            Insert(3),
        ];
        let initial: Vec<u64> = (0..40u64).map(|i| (i % 6) << 61 | i).collect();
        run_snapshot(initial.clone(), ops.clone(), 0);
        run_snapshot(initial, ops, 3);
        // Aborted: changes are no longer noted, nothing comes out.
        let mut index = FarIndex::build(vec![entry(1, 1), entry(2 << 61, 2)]).unwrap();
        index.begin_snapshot();
        index.abort_snapshot();
        let pos = index.find(1, entry(1, 1).loc, 1).unwrap();
        index.remove(pos);
        assert_eq!(index.read_snapshot(usize::MAX, |_| panic!("aborted")), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn a_snapshot_under_random_changes_is_the_index_as_it_began(
            initial in proptest::collection::vec(snap_hash(), 0..300),
            ops in proptest::collection::vec(snap_op(), 0..200),
            before in 0usize..50,
        ) {
            run_snapshot(initial, ops, before);
        }
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

    /// xorshift64, for the random inputs below.
    fn xs(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn entry_at(hash: u64, id: u64, loc_off: u64) -> FarEntry {
        FarEntry {
            hash,
            loc: pack_loc((id % 5) as u32 + 1, 64 + loc_off).unwrap(),
            id,
        }
    }

    /// Grouped input (with equal hashes, ties on (hash, id), id-0 entries,
    /// one huge shard, empty) builds the same index, entry for entry, as
    /// the same input scattered, and every invariant holds.
    #[test]
    fn grouped_build_matches_global_sort_on_random_inputs() {
        let mut s = 0x1234_5678_9abc_def1u64;
        for round in 0..200 {
            let n = (xs(&mut s) % 3000) as usize;
            let mode = round % 5;
            let mut v: Vec<FarEntry> = (0..n)
                .map(|i| {
                    let r = xs(&mut s);
                    let hash = match mode {
                        0 => r,                         // uniform
                        1 => r & 0x00FF_0000_0000_000F, // one huge shard (0), many equal hashes
                        2 => (r % 4) << 62,             // 4 shards, equal hashes
                        3 => u64::MAX - (r % 3),        // last shard, equal hashes
                        _ => (r & 0xFF00_0000_0000_0000) | (r % 7),
                    };
                    let id = if r.is_multiple_of(17) {
                        0
                    } else {
                        1 + i as u64
                    };
                    entry_at(hash, id, i as u64)
                })
                .collect();
            // Grouped: by shard, each shard sorted part then reversed tail.
            v.sort_by_key(|x| (shard_of(x.hash), x.hash, x.id));
            let mut grouped = Vec::new();
            let mut start = 0;
            while start < v.len() {
                let sh = shard_of(v[start].hash);
                let end = start + v[start..].partition_point(|x| shard_of(x.hash) == sh);
                let mut run = v[start..end].to_vec();
                let cut = run.len() * (xs(&mut s) % 5) as usize / 4;
                let len = run.len();
                run[cut.min(len)..].reverse();
                grouped.extend(run);
                start = end;
            }
            assert!(grouped.is_sorted_by_key(|x| shard_of(x.hash)));
            let mut scattered = grouped.clone();
            scattered.reverse();
            let a = FarIndex::build(grouped.clone()).unwrap();
            a.check();
            let b = FarIndex::build(scattered).unwrap();
            b.check();
            let live = grouped.iter().filter(|x| x.id != 0).count();
            assert_eq!(a.len(), live);
            let av: Vec<_> = a.iter().collect();
            let bv: Vec<_> = b.iter().collect();
            assert_eq!(av, bv, "round {round}");
            for x in grouped.iter().filter(|x| x.id != 0) {
                assert!(a.find(x.hash, x.loc, x.id).is_some());
            }
        }
    }
}
