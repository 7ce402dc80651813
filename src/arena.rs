//! The byte arena: tasks' key and payload bytes of up to [`ARENA_BYTES_MAX`]
//! bytes together, in pages of fixed-size entries, one size class per page.
//!
//! Why not one allocation per task: a schedule and a cancel each paid a
//! general-purpose `malloc`/`free` (≈ 200 and ≈ 100 instructions with glibc,
//! a quarter of an in-memory schedule's) and every chunk carried the
//! allocator's 8-byte header and rounding to 16 bytes. Here an entry is a
//! free-list pop or a bump, a free is a push, and an entry is its length
//! rounded up to 8 bytes. This is the segregated-fit ("size class") design
//! of slab allocators (Bonwick, *The Slab Allocator*, USENIX 1994) and of
//! mimalloc's pages (Leijen et al., *Mimalloc: Free List Sharding in
//! Action*, 2019), reduced to one owner behind the engine's lock.
//!
//! Memory follows the live entries page by page: a page whose last entry is
//! freed is given back to the allocator at once, unless it is the only
//! page of its class with room (kept so that one task scheduled and
//! cancelled over and over does not allocate a page each time). There is
//! no compaction: a page stays held while any one of its entries is live,
//! so after most tasks of a class are gone at random the pages left can
//! be mostly free (their free entries are reused first, by the next tasks
//! of that class). [`ArenaStats::bytes_reserved`] tells what is held.
//!
//! Nothing here panics on a handle it did not issue, one already freed or
//! one given with the wrong length (a bug elsewhere): each page keeps a
//! bitmap of its entries in use, so a read of a free entry gives an empty
//! slice and a second free of an entry not reused since is ignored, both
//! `debug_assert`ed. (A stale handle to an entry reused since names the
//! new entry: no arena can tell; the engine's model tests count entries.)

/// Longest entry (key and payload together, in bytes) the arena holds;
/// longer ones get an allocation of their own.
pub(crate) const ARENA_BYTES_MAX: usize = 1024;

/// Entry sizes are multiples of it: the size classes are 8, 16, …,
/// [`ARENA_BYTES_MAX`] bytes.
const STRIDE_ALIGN: usize = 8;

/// Size classes: class `c` holds entries of `(c + 1) * STRIDE_ALIGN` bytes.
const CLASSES: usize = ARENA_BYTES_MAX / STRIDE_ALIGN;

/// Bytes of one page: 8 192 entries of 8 bytes, 64 of 1 024.
const PAGE_BYTES: usize = 64 * 1024;

/// A page's bytes are zeroed this many at a time as its entries are handed
/// out, so an entry's store makes no zeroing call of its own (one `memset`
/// per ~11 entries of 88 bytes), and the memory zeroed ahead of use is at
/// most this. Below glibc's `rep stosb` threshold (2 KiB): vector stores.
const ZEROED_AHEAD: usize = 1024;

/// "None" for page and entry links.
const NIL: u32 = u32::MAX;

const _: () = assert!(ARENA_BYTES_MAX.is_multiple_of(STRIDE_ALIGN));
const _: () = assert!(PAGE_BYTES / ARENA_BYTES_MAX >= 2);
// A free entry keeps the next free entry's index in its first 4 bytes.
const _: () = assert!(STRIDE_ALIGN >= 4);

/// Where one entry is: its page and its index in the page. Meaningful only
/// to the arena that issued it, with the length it was stored with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ArenaSlot {
    page: u32,
    index: u32,
}

/// One page: entries of one size class.
#[derive(Debug)]
struct Page {
    /// The page's bytes, in an allocation of `capacity * stride` made
    /// once: zeroed [`ZEROED_AHEAD`] bytes at a time as entries are handed
    /// out (so a new page is not touched, by `calloc` or otherwise, long
    /// before it is used), then an entry is a copy into its place. Holds
    /// the `bump * stride` bytes handed out, and up to [`ZEROED_AHEAD`]
    /// more. Empty, with no allocation, while the page is given back.
    bytes: Vec<u8>,
    /// Entry size in bytes.
    stride: u32,
    /// Entries the page holds.
    capacity: u32,
    /// Entries below it have been handed out at least once.
    bump: u32,
    /// Head of the list of freed entries (linked through their first bytes).
    free_head: u32,
    /// One bit per entry, set while it is in use: frees and reads of an
    /// entry not in use are refused.
    in_use: Vec<u64>,
    /// Entries in use.
    live: u32,
    /// Position in its class's `with_room` list, or [`NIL`] when full.
    room_at: u32,
}

impl Page {
    fn is_full(&self) -> bool {
        self.free_head == NIL && self.bump == self.capacity
    }

    /// Whether entry `index` is in use (false past the page's entries).
    fn is_in_use(&self, index: u32) -> bool {
        self.in_use
            .get(index as usize / 64)
            .is_some_and(|w| w & (1 << (index % 64)) != 0)
    }

    /// Marks entry `index` (below `capacity`) in use or free.
    fn set_in_use(&mut self, index: u32, in_use: bool) {
        if let Some(w) = self.in_use.get_mut(index as usize / 64) {
            if in_use {
                *w |= 1 << (index % 64);
            } else {
                *w &= !(1 << (index % 64));
            }
        }
    }
}

/// Figures of an arena, for stats and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ArenaStats {
    /// Entries in use.
    pub entries: usize,
    /// Pages held.
    pub pages: usize,
    /// Bytes of the pages held (64 KiB each, of which up to a stride's
    /// worth at the end is unused), counted whether or not their entries
    /// have been touched yet: address space, an upper bound on resident
    /// memory.
    pub bytes_reserved: usize,
}

/// Entries of key and payload bytes in pages by size class. See the module
/// documentation. Not `Clone`: an [`ArenaSlot`] names one arena's entry.
#[derive(Debug)]
pub(crate) struct ByteArena {
    /// Pages by number; a given-back page stays as an empty placeholder
    /// until its number is reused.
    pages: Vec<Page>,
    /// Numbers of given-back pages, for reuse.
    vacant_pages: Vec<u32>,
    /// Per class, the pages with at least one entry free; allocation takes
    /// from the last.
    with_room: Vec<Vec<u32>>,
    entries: usize,
    pages_held: usize,
}

impl Default for ByteArena {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            vacant_pages: Vec::new(),
            with_room: (0..CLASSES).map(|_| Vec::new()).collect(),
            entries: 0,
            pages_held: 0,
        }
    }
}

/// The class of an entry of `len` bytes (`1..=ARENA_BYTES_MAX`).
fn class_of(len: usize) -> usize {
    (len - 1) / STRIDE_ALIGN
}

impl ByteArena {
    /// Stores `first` followed by `second` in one entry and returns where;
    /// `None` if together they are empty or longer than
    /// [`ARENA_BYTES_MAX`] (the caller allocates them elsewhere). O(1); a
    /// new page (64 KiB) when the class has none with room.
    #[inline]
    pub fn store(&mut self, first: &[u8], second: &[u8]) -> Option<ArenaSlot> {
        let len = first.len() + second.len();
        if len == 0 || len > ARENA_BYTES_MAX {
            return None;
        }
        let class = class_of(len);
        let page_no = match self.with_room[class].last() {
            Some(&p) => p,
            None => self.new_page(class),
        };
        let page = self.pages.get_mut(page_no as usize)?;
        let stride = page.stride as usize;
        let (index, next_free) = if page.free_head != NIL {
            let at = page.free_head as usize * stride;
            let link = page.bytes.get(at..at + 4)?;
            let next = u32::from_le_bytes([link[0], link[1], link[2], link[3]]);
            (page.free_head, next)
        } else {
            // A page with room and no free entry has bump < capacity.
            let end = (page.bump as usize + 1) * stride;
            if end > page.bytes.len() {
                // Within the allocation: no reallocation.
                let size = page.capacity as usize * stride;
                page.bytes
                    .resize(end.next_multiple_of(ZEROED_AHEAD).min(size), 0);
            }
            (page.bump, NIL)
        };
        let at = index as usize * stride;
        let (key, rest) = page.bytes.get_mut(at..at + len)?.split_at_mut(first.len());
        key.copy_from_slice(first);
        rest.copy_from_slice(second);
        if page.free_head != NIL {
            page.free_head = next_free;
        } else {
            page.bump += 1;
        }
        page.set_in_use(index, true);
        page.live += 1;
        if page.is_full() {
            page.room_at = NIL;
            self.with_room[class].pop();
        }
        self.entries += 1;
        Some(ArenaSlot {
            page: page_no,
            index,
        })
    }

    /// The `len` bytes stored at `at` (the length given to
    /// [`ByteArena::store`]). O(1).
    pub fn get(&self, at: ArenaSlot, len: usize) -> &[u8] {
        let bytes = self.pages.get(at.page as usize).and_then(|page| {
            if len > page.stride as usize || !page.is_in_use(at.index) {
                return None;
            }
            let start = at.index as usize * page.stride as usize;
            page.bytes.get(start..start + len)
        });
        debug_assert!(bytes.is_some(), "arena entry {at:?} of {len} bytes");
        bytes.unwrap_or_default()
    }

    /// Frees the entry at `at` (stored with `len` bytes): it is reused by
    /// the next entry of its class, and its page is given back if that was
    /// its last entry (see the module documentation). O(1).
    pub fn free(&mut self, at: ArenaSlot, len: usize) {
        let Some(page) = self.pages.get_mut(at.page as usize) else {
            debug_assert!(false, "free of {at:?}: no such page");
            return;
        };
        if len > page.stride as usize || !page.is_in_use(at.index) {
            debug_assert!(false, "free of {at:?} ({len} bytes): not an entry in use");
            return;
        }
        let class = class_of(page.stride as usize);
        let start = at.index as usize * page.stride as usize;
        let Some(link) = page.bytes.get_mut(start..start + 4) else {
            debug_assert!(false, "free of {at:?}: no such entry");
            return;
        };
        link.copy_from_slice(&page.free_head.to_le_bytes());
        page.free_head = at.index;
        page.set_in_use(at.index, false);
        page.live -= 1;
        self.entries -= 1;
        let with_room = &mut self.with_room[class];
        if page.room_at == NIL {
            page.room_at = with_room.len() as u32;
            with_room.push(at.page);
        }
        if page.live == 0 && with_room.len() > 1 {
            self.give_back(at.page, class);
        }
    }

    /// Figures of the arena. O(1).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            entries: self.entries,
            pages: self.pages_held,
            bytes_reserved: self.pages_held * PAGE_BYTES,
        }
    }

    /// A fresh page for `class`, listed as having room; returns its number.
    #[inline(never)]
    fn new_page(&mut self, class: usize) -> u32 {
        let stride = ((class + 1) * STRIDE_ALIGN) as u32;
        let capacity = (PAGE_BYTES / stride as usize) as u32;
        let with_room = &mut self.with_room[class];
        let page = Page {
            bytes: Vec::with_capacity(capacity as usize * stride as usize),
            stride,
            capacity,
            bump: 0,
            free_head: NIL,
            in_use: vec![0; (capacity as usize).div_ceil(64)],
            live: 0,
            room_at: with_room.len() as u32,
        };
        let number = match self.vacant_pages.pop() {
            Some(n) => {
                self.pages[n as usize] = page;
                n
            }
            None => {
                self.pages.push(page);
                (self.pages.len() - 1) as u32
            }
        };
        with_room.push(number);
        self.pages_held += 1;
        number
    }

    /// Gives page `number` (empty, listed as having room) back to the
    /// allocator.
    fn give_back(&mut self, number: u32, class: usize) {
        let with_room = &mut self.with_room[class];
        let room_at = self.pages[number as usize].room_at as usize;
        with_room.swap_remove(room_at);
        if let Some(&moved) = with_room.get(room_at) {
            self.pages[moved as usize].room_at = room_at as u32;
        }
        let page = &mut self.pages[number as usize];
        page.bytes = Vec::new();
        page.in_use = Vec::new();
        page.room_at = NIL;
        page.bump = 0;
        page.free_head = NIL;
        self.vacant_pages.push(number);
        self.pages_held -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes of entry `n` with `len` bytes: tell entries apart.
    fn bytes_of(n: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (n.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
            .collect()
    }

    #[test]
    fn refuses_empty_and_over_long_entries() {
        let mut arena = ByteArena::default();
        assert_eq!(arena.store(b"", b""), None);
        let long = vec![1u8; ARENA_BYTES_MAX + 1];
        assert_eq!(arena.store(&long, b""), None);
        assert!(arena.store(&long[..ARENA_BYTES_MAX - 1], b"x").is_some());
        assert_eq!(arena.stats().entries, 1);
    }

    #[test]
    fn entries_take_their_length_rounded_to_eight_bytes() {
        let mut arena = ByteArena::default();
        // 88 bytes (a 24-byte key and a 64-byte payload): 744 to a page.
        let per_page = PAGE_BYTES / 88;
        let slots: Vec<ArenaSlot> = (0..per_page + 1)
            .map(|i| {
                let b = bytes_of(i as u64, 88);
                arena.store(&b[..24], &b[24..]).expect("stored")
            })
            .collect();
        assert_eq!(arena.stats().pages, 2);
        for (i, &at) in slots.iter().enumerate() {
            assert_eq!(arena.get(at, 88), bytes_of(i as u64, 88).as_slice());
        }
        // 81..=88 bytes share the class; 89 starts another.
        arena.store(&[3u8; 81], b"").expect("stored");
        assert_eq!(arena.stats().pages, 2);
        arena.store(&[3u8; 89], b"").expect("stored");
        assert_eq!(arena.stats().pages, 3);
    }

    #[test]
    fn a_freed_entry_is_reused_and_empty_pages_are_given_back() {
        let mut arena = ByteArena::default();
        let per_page = PAGE_BYTES / 64;
        let slots: Vec<ArenaSlot> = (0..3 * per_page)
            .map(|i| arena.store(&bytes_of(i as u64, 64), b"").expect("stored"))
            .collect();
        assert_eq!(arena.stats().pages, 3);
        // Freeing one entry makes room where it was.
        arena.free(slots[5], 64);
        let again = arena.store(&bytes_of(99, 64), b"").expect("stored");
        assert_eq!(again, slots[5]);
        assert_eq!(arena.stats().pages, 3);
        // Emptying the first two pages gives one back; the other stays,
        // the class's only page with room.
        for &at in &slots[..2 * per_page] {
            arena.free(at, 64);
        }
        assert_eq!(arena.stats().pages, 2);
        assert_eq!(arena.stats().entries, per_page);
        for (i, &at) in slots.iter().enumerate().skip(2 * per_page) {
            assert_eq!(arena.get(at, 64), bytes_of(i as u64, 64).as_slice());
        }
        // Emptying everything keeps one page.
        for &at in &slots[2 * per_page..] {
            arena.free(at, 64);
        }
        assert_eq!(arena.stats().pages, 1);
        assert_eq!(arena.stats().entries, 0);
        // A given-back page's number is reused.
        let n = arena.pages.len();
        for i in 0..2 * per_page {
            arena.store(&bytes_of(i as u64, 64), b"").expect("stored");
        }
        assert_eq!(arena.pages.len(), n);
    }

    /// A handle the arena did not issue: debug builds stop at it (a bug
    /// elsewhere); release builds read nothing and free nothing.
    #[test]
    fn bad_handles_assert_in_debug_and_are_ignored_in_release() {
        let mut arena = ByteArena::default();
        let at = arena.store(b"abc", b"def").expect("stored");
        let bogus = ArenaSlot { page: 7, index: 0 };
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            arena.get(bogus, 6).to_vec()
        }));
        let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            arena.free(bogus, 6);
        }));
        if cfg!(debug_assertions) {
            assert!(read.is_err() && freed.is_err());
        } else {
            assert_eq!(read.ok(), Some(Vec::new()));
            assert!(freed.is_ok());
        }
        assert_eq!(arena.get(at, 6), b"abcdef");
        assert_eq!(arena.stats().entries, 1);
    }

    /// A second free of an entry, a free with a length past its class and
    /// a read of a freed entry change nothing: the next two entries are
    /// distinct and the counts stay exact (in debug builds each asserts).
    #[test]
    fn double_frees_and_wrong_lengths_change_nothing() {
        let mut arena = ByteArena::default();
        let a = arena.store(b"abcd", b"efgh").expect("stored");
        let b = arena.store(b"ijkl", b"mnop").expect("stored");
        arena.free(a, 8);
        let quietly = |f: &mut dyn FnMut()| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            assert_eq!(r.is_err(), cfg!(debug_assertions));
        };
        quietly(&mut || arena.free(a, 8));
        quietly(&mut || arena.free(b, 9));
        quietly(&mut || assert!(arena.get(a, 8).is_empty()));
        assert_eq!(arena.stats().entries, 1);
        let c = arena.store(b"qrst", b"uvwx").expect("stored");
        let d = arena.store(b"yz01", b"2345").expect("stored");
        assert_ne!(c, d);
        assert_eq!(c, a, "the freed entry is reused once");
        assert_eq!(
            [arena.get(b, 8), arena.get(c, 8), arena.get(d, 8)],
            [&b"ijklmnop"[..], b"qrstuvwx", b"yz012345"]
        );
        assert_eq!(arena.stats().entries, 3);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Store(usize),
        /// Free the `n`-th live entry (mod their count).
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => prop_oneof![1usize..=40, 1usize..=ARENA_BYTES_MAX].prop_map(Op::Store),
            2 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        /// Against a model: every live entry reads back its bytes, entries
        /// and pages counted exactly, and no page is held beyond the live
        /// entries' needs plus one page with room per class.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec(op(), 1..400)) {
            let mut arena = ByteArena::default();
            let mut live: Vec<(ArenaSlot, usize, u64)> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Store(len) => {
                        let b = bytes_of(n as u64, len);
                        let split = len / 3;
                        let at = arena.store(&b[..split], &b[split..]).expect("stored");
                        prop_assert!(live.iter().all(|&(a, _, _)| a != at));
                        live.push((at, len, n as u64));
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (at, len, _) = live.swap_remove(i % live.len());
                        arena.free(at, len);
                    }
                    Op::Free(_) => {}
                }
                for &(at, len, n) in &live {
                    let expected = bytes_of(n, len);
                    prop_assert_eq!(arena.get(at, len), expected.as_slice());
                }
                prop_assert_eq!(arena.stats().entries, live.len());
                // Memory follows the live entries: every page held has a
                // live entry, except at most one per class.
                let mut empty_by_class = vec![0usize; CLASSES];
                let mut held = 0;
                for page in arena.pages.iter().filter(|p| p.bytes.capacity() > 0) {
                    held += 1;
                    // Never reallocated: one allocation per page.
                    prop_assert_eq!(
                        page.bytes.capacity(),
                        page.capacity as usize * page.stride as usize
                    );
                    // Zeroed ahead of the entries handed out by less
                    // than ZEROED_AHEAD bytes.
                    let handed_out = page.bump as usize * page.stride as usize;
                    prop_assert!(page.bytes.len() >= handed_out);
                    prop_assert!(page.bytes.len() < handed_out + ZEROED_AHEAD);
                    if page.live == 0 {
                        empty_by_class[class_of(page.stride as usize)] += 1;
                    }
                }
                prop_assert_eq!(held, arena.stats().pages);
                prop_assert!(empty_by_class.iter().all(|&k| k <= 1));
                let live_pages: usize = arena.pages.iter().map(|p| usize::from(p.live > 0)).sum();
                prop_assert!(live_pages <= live.len());
            }
        }
    }
}
