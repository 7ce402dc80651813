//! The timing wheel: a pure hierarchical hashed timing wheel.
//!
//! Ticks go in, expired items come out. The wheel never reads a clock, does no I/O, spawns no
//! thread and allocates only its node slab; the engine converts time to [`Tick`]s (rounding due
//! times *up*, so nothing fires early) and decides when to call [`Wheel::advance`].
//!
//! Source: Varghese & Lauck, "Hashed and Hierarchical Timing Wheels", SOSP 1987, scheme 7;
//! the level arithmetic follows tokio's `runtime/time/wheel` (`level_for`, per-level occupancy
//! bitmaps, `rotate_right` + `trailing_zeros` to find the next slot).
//!
//! # Layout
//!
//! [`LEVELS`] levels of [`SLOTS_PER_LEVEL`] slots. A slot at level `k` spans `64^k` ticks, so
//! level 0 holds single ticks and the top level spans `64^6 = 2^36` ticks per slot, one rotation
//! of the top level being [`WHEEL_RANGE_TICKS`] `= 2^42`. Each slot is an intrusive, doubly
//! linked FIFO list threaded through a slab of 24-byte nodes (`u32` indices, `NIL = u32::MAX`
//! for none); each level keeps a `u64` bitmap of its non-empty slots. Freed nodes go on a free
//! list and are reused by the next insert.
//!
//! # Invariants
//!
//! With `elapsed` the wheel's current tick and, for a live node with due tick `due`:
//!
//! 1. `elapsed < due` and `due - elapsed < WHEEL_RANGE_TICKS`.
//! 2. The node sits at level `level_for(elapsed, due)` — the level of the highest bit in which
//!    `elapsed` and `due` differ, capped at the top level — in slot `slot_for(due, level)`.
//!    Its position is therefore a *function of `(elapsed, due)`*, which is why a node needs no
//!    level/slot field: `remove` recomputes it.
//! 3. Below the top level, every occupied slot lies strictly after `elapsed`'s own slot in the
//!    same rotation of that level (node and `elapsed` agree on all higher bits). At the top level,
//!    an occupied slot at or before `elapsed`'s slot holds nodes of the *next* rotation (allowed
//!    by invariant 1); one after it holds nodes of the current rotation. Consequently every
//!    occupied slot starts after `elapsed`, and any occupied slot of a lower level starts before
//!    any occupied slot of a higher level.
//! 4. Nodes with equal due ticks sit in the same list (by 2) in insertion order.
//!
//! `advance` keeps 2 and 3 because it never moves `elapsed` past the start of an occupied slot
//! without processing that slot: for every other node, `elapsed` stays within the node's
//! higher-level block and before its slot, so the highest differing bit stays in the same level.

#![forbid(unsafe_code)]

use std::fmt;
use std::num::NonZeroU32;

/// A tick count since the engine's origin (the engine's default tick is 1 ms).
///
/// Plain newtype: the wheel only compares and subtracts ticks; converting wall or monotonic
/// time to ticks, and rounding due times up to a whole tick, is the caller's job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tick(pub u64);

/// Number of slots in each level of the wheel: 64, so a level's occupancy fits one `u64` bitmap
/// and a slot index is 6 bits of a tick (as in tokio and the Linux kernel wheel).
pub const SLOTS_PER_LEVEL: usize = 64;

/// Number of levels of the wheel. With 64 slots per level the wheel covers `64^7 = 2^42` ticks
/// (≈ 139 years of 1 ms ticks), far beyond the engine's horizon.
pub const LEVELS: usize = 7;

/// How far ahead of [`Wheel::elapsed`] a due tick may lie, exclusive, in ticks:
/// `SLOTS_PER_LEVEL ^ LEVELS = 2^42`. [`Wheel::insert`] returns [`InsertError::TooFar`] for a due
/// tick `due - elapsed >= WHEEL_RANGE_TICKS`.
pub const WHEEL_RANGE_TICKS: u64 = (SLOTS_PER_LEVEL as u64).pow(LEVELS as u32);

/// Most timers one wheel can hold at once: node indices are `u32` and `u32::MAX` means "no node".
/// [`Wheel::insert`] returns [`InsertError::Full`] beyond it (never reached in practice:
/// it would take ~96 GiB of nodes).
pub const TIMER_COUNT_MAX: u32 = NIL;

/// Bits of a tick per level (`log2(SLOTS_PER_LEVEL)`).
const SLOT_BITS: u32 = SLOTS_PER_LEVEL.trailing_zeros();
/// Mask of one slot index within a level.
const SLOT_MASK: u64 = SLOTS_PER_LEVEL as u64 - 1;
/// The "no node" index of list links and the free list.
const NIL: u32 = u32::MAX;

// The occupancy bitmap is a u64 and slots are selected by bit fields of a tick.
const _: () = assert!(SLOTS_PER_LEVEL == 64 && SLOTS_PER_LEVEL.is_power_of_two());
const _: () = assert!(LEVELS >= 1 && SLOT_BITS as usize * LEVELS < 64);
const _: () = assert!(WHEEL_RANGE_TICKS == 1 << (SLOT_BITS as usize * LEVELS));
const _: () = assert!(WHEEL_RANGE_TICKS == 1 << 42);

/// Handle to one inserted timer, for [`Wheel::remove`].
///
/// Holds the node index and that node's generation at insert time. Once the timer is removed or
/// expires the node's generation changes, so the key goes *stale* and `remove` returns `None`,
/// even after the node is reused (until one node is reused 2^31 times, when the generation
/// wraps). A key is meaningful only to the wheel that issued it.
///
/// 8 bytes, and `Option<TimerKey>` is 8 bytes too: a live node's generation is odd, so never 0
/// (the niche `None` takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey(u32, NonZeroU32);

const _: () = assert!(std::mem::size_of::<Option<TimerKey>>() == 8);

/// Why [`Wheel::insert`] refused a timer. The item is not stored in any case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertError {
    /// `due <= elapsed`: the timer is already due; the caller fires it at once.
    Elapsed,
    /// `due - elapsed >= WHEEL_RANGE_TICKS`: beyond the wheel's range; the caller keeps it
    /// elsewhere (the overflow store) and inserts it later.
    TooFar,
    /// The wheel already holds [`TIMER_COUNT_MAX`] timers.
    Full,
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Elapsed => "due tick is not after the wheel's elapsed tick",
            Self::TooFar => "due tick is WHEEL_RANGE_TICKS or more after the wheel's elapsed tick",
            Self::Full => "timing wheel holds TIMER_COUNT_MAX timers",
        })
    }
}

impl std::error::Error for InsertError {}

/// One timer handed out by [`Wheel::advance`]: its due tick and the caller's item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expired {
    /// The tick the timer was inserted for (`<=` the `now` passed to `advance`).
    pub due: Tick,
    /// The caller's item, as passed to [`Wheel::insert`].
    pub item: u32,
}

/// One timer in the slab: 24 bytes on every target (checked below).
///
/// Live nodes have an odd `generation` and are linked into the slot list given by invariant 2;
/// free nodes have an even `generation` and use `next` as the free-list link.
#[derive(Clone, Copy, Debug)]
struct Node {
    due: u64,
    item: u32,
    next: u32,
    prev: u32,
    generation: u32,
}

const _: () = assert!(std::mem::size_of::<Node>() == 24);

/// Head and tail node indices of one slot's FIFO list; [`NIL`] when empty.
#[derive(Clone, Copy, Debug)]
struct SlotList {
    head: u32,
    tail: u32,
}

impl SlotList {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
    };
}

/// The next slot `advance` must process: where it is and the tick at which it starts.
#[derive(Clone, Copy, Debug)]
struct Expiration {
    level: usize,
    slot: usize,
    deadline: u64,
}

/// A hierarchical hashed timing wheel (Varghese & Lauck 1987, scheme 7; tokio
/// `runtime/time/wheel`): timers keyed by due [`Tick`], carrying a `u32` item.
///
/// Insert and remove are O(1); [`Wheel::next_deadline`] is O(LEVELS); [`Wheel::advance`] costs
/// amortised O(1) per expired timer (each timer cascades at most `LEVELS - 1` times) plus
/// O(LEVELS) per non-empty slot it visits, and never walks empty ticks. Memory: 24 bytes per
/// slab node (the slab keeps its high-water mark; freed nodes are reused at once) plus ~3.6 KiB
/// of slot heads. No method panics (internal invariants are `debug_assert`ed).
#[derive(Clone)]
pub struct Wheel {
    /// The wheel's current tick: every timer due at or before it has been handed out.
    elapsed_tick: u64,
    /// Live timers.
    len: usize,
    /// Slab of nodes, live and free.
    nodes: Vec<Node>,
    /// Head of the free list threaded through `Node::next`.
    free_head: u32,
    /// Slab size limit; `TIMER_COUNT_MAX` except in tests.
    timer_count_max: u32,
    /// Per level, bit `s` set iff slot `s` is non-empty.
    occupied: [u64; LEVELS],
    /// Per level and slot, the FIFO list of nodes.
    lists: [[SlotList; SLOTS_PER_LEVEL]; LEVELS],
    /// Slots processed by `advance` (test-only work counter).
    #[cfg(test)]
    slots_processed: u64,
}

impl Default for Wheel {
    /// Same as [`Wheel::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Wheel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("elapsed", &self.elapsed())
            .field("len", &self.len)
            .field("next_deadline", &self.next_deadline())
            .field("slab_nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Wheel {
    /// An empty wheel whose elapsed tick is `Tick(0)`. O(1), no allocation.
    ///
    /// Source: Varghese & Lauck 1987, scheme 7; tokio `runtime/time/wheel`.
    #[must_use]
    pub fn new() -> Self {
        Self::with_elapsed(Tick(0))
    }

    /// An empty wheel whose elapsed tick is `elapsed` (e.g. the engine's current tick when it
    /// reopens). Timers due at or before `elapsed` cannot be inserted. O(1), no allocation.
    #[must_use]
    pub fn with_elapsed(elapsed: Tick) -> Self {
        Self {
            elapsed_tick: elapsed.0,
            len: 0,
            nodes: Vec::new(),
            free_head: NIL,
            timer_count_max: TIMER_COUNT_MAX,
            occupied: [0; LEVELS],
            lists: [[SlotList::EMPTY; SLOTS_PER_LEVEL]; LEVELS],
            #[cfg(test)]
            slots_processed: 0,
        }
    }

    /// The wheel's current tick: the largest `now` passed to [`Wheel::advance`], or the initial
    /// tick. Every timer due at or before it has been handed out. O(1).
    #[must_use]
    pub fn elapsed(&self) -> Tick {
        Tick(self.elapsed_tick)
    }

    /// Number of timers in the wheel (inserted, neither removed nor expired). O(1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the wheel holds no timer. O(1).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts a timer carrying `item`, due at tick `due`, and returns its key for
    /// [`Wheel::remove`]. O(1): the level is the highest bit in which `elapsed` and `due` differ
    /// (tokio's `level_for`), the timer is appended to its slot's list.
    ///
    /// # Errors
    ///
    /// * [`InsertError::Elapsed`] if `due <= elapsed` — the caller fires the item at once;
    /// * [`InsertError::TooFar`] if `due - elapsed >= WHEEL_RANGE_TICKS`;
    /// * [`InsertError::Full`] if the wheel holds [`TIMER_COUNT_MAX`] timers.
    ///
    /// Panics: none. Source: Varghese & Lauck 1987, scheme 7 (`START_TIMER`).
    #[inline]
    pub fn insert(&mut self, due: Tick, item: u32) -> Result<TimerKey, InsertError> {
        let due = due.0;
        if due <= self.elapsed_tick {
            return Err(InsertError::Elapsed);
        }
        if due - self.elapsed_tick >= WHEEL_RANGE_TICKS {
            return Err(InsertError::TooFar);
        }
        let (index, generation) = self.allocate(due, item)?;
        self.link(index);
        self.len += 1;
        let generation = NonZeroU32::new(generation).expect("a live generation is odd");
        Ok(TimerKey(index, generation))
    }

    /// Removes the timer of `key` and returns its item, or `None` if the key is stale (the timer
    /// was already removed or has expired) or unknown. O(1): eager unlink from its slot list;
    /// the node is freed at once and reused by the next insert.
    ///
    /// Panics: none. Source: Varghese & Lauck 1987, scheme 7 (`STOP_TIMER`).
    pub fn remove(&mut self, key: TimerKey) -> Option<u32> {
        let (index, generation) = (key.0, key.1.get());
        let node = self.nodes.get(index as usize)?;
        // Keys are issued with the odd generation of a live node; freeing makes it even.
        if node.generation != generation || !is_live(generation) {
            return None;
        }
        let item = node.item;
        self.unlink(index);
        self.release(index);
        Some(item)
    }

    /// The node holding timer `key` (live or not), for a cache prefetch
    /// before [`Wheel::remove`]; `None` if the key is out of range. O(1).
    #[must_use]
    pub fn node_of(&self, key: TimerKey) -> Option<&impl Sized> {
        self.nodes.get(key.0 as usize)
    }

    /// The due tick of the live timer `key`, or `None` if the key is stale
    /// (removed or expired) or unknown. O(1).
    #[must_use]
    pub fn due(&self, key: TimerKey) -> Option<Tick> {
        let (index, generation) = (key.0, key.1.get());
        let node = self.nodes.get(index as usize)?;
        (node.generation == generation && is_live(generation)).then_some(Tick(node.due))
    }

    /// The earliest tick at which [`Wheel::advance`] has work to do — the start of the first
    /// non-empty slot, where timers either expire or cascade to a finer level — or `None` if the
    /// wheel is empty. Always after `elapsed` and never later than the earliest due tick, so a
    /// driver may sleep until then; `advance` to any earlier tick hands out nothing.
    ///
    /// O(LEVELS): one `rotate_right` + `trailing_zeros` on each level's occupancy bitmap.
    /// Panics: none. Source: tokio `runtime/time/wheel` (`next_expiration`).
    #[must_use]
    pub fn next_deadline(&self) -> Option<Tick> {
        self.next_expiration()
            .map(|expiration| Tick(expiration.deadline))
    }

    /// Makes room for `additional` more timers without growing the node slab (recovery
    /// inserts millions at once; growth by doubling would copy them and fault twice the pages).
    pub fn reserve(&mut self, additional: usize) {
        self.nodes.reserve(additional);
    }

    /// Moves the wheel's time to `now` and appends to `out` every timer due at or before `now`,
    /// ordered by due tick and, among equal due ticks, by insertion order. Does nothing if
    /// `now <= elapsed`. Timers due later but sitting in a processed coarse slot cascade into
    /// finer levels.
    ///
    /// Cost: amortised O(1) per timer (at most `LEVELS - 1` cascades each) plus O(LEVELS) per
    /// non-empty slot visited; empty stretches of time are skipped whole, so a jump of years over
    /// an empty wheel costs O(LEVELS). Panics: none. Source: Varghese & Lauck 1987, scheme 7
    /// (`PER_TICK_BOOKKEEPING` + `EXPIRY_PROCESSING`); tokio `Wheel::poll`.
    pub fn advance(&mut self, now: Tick, out: &mut Vec<Expired>) {
        let now = now.0;
        if now <= self.elapsed_tick {
            return;
        }
        // Slots are processed in deadline order (invariant 3), so timers come out sorted by due
        // tick: every live timer is due at or after the start of its slot.
        while let Some(expiration) = self
            .next_expiration()
            .filter(|expiration| expiration.deadline <= now)
        {
            self.elapsed_tick = expiration.deadline;
            self.process_slot(expiration.level, expiration.slot, out);
        }
        self.elapsed_tick = now;
    }

    /// Takes the whole list of one slot whose start tick is `elapsed`, hands out the timers due
    /// at `elapsed` and re-inserts the rest at finer levels.
    ///
    /// Why this keeps equal due ticks in insertion order: by invariant 2 all timers due at one
    /// tick sit in the same list, in insertion order (invariant 4). The taken list is walked in
    /// order, and all its timers with one due tick go to the same target list (their position is
    /// a function of `(elapsed, due)`), which holds no timer of that due tick yet (they were all
    /// in the taken list); appending keeps their relative order. Timers due at `elapsed` are
    /// handed out in list order, i.e. FIFO.
    fn process_slot(&mut self, level: usize, slot: usize, out: &mut Vec<Expired>) {
        #[cfg(test)]
        {
            self.slots_processed += 1;
        }
        let list = std::mem::replace(&mut self.lists[level][slot], SlotList::EMPTY);
        self.occupied[level] &= !(1 << slot);
        let mut next = list.head;
        while next != NIL {
            let index = next;
            let node = self.nodes[index as usize];
            next = node.next;
            if node.due <= self.elapsed_tick {
                debug_assert_eq!(
                    node.due, self.elapsed_tick,
                    "timer due {} missed: found at level {level} slot {slot}",
                    node.due
                );
                out.push(Expired {
                    due: Tick(node.due),
                    item: node.item,
                });
                self.release(index);
            } else {
                self.link(index);
            }
        }
    }

    /// The first non-empty slot in deadline order, or `None` if the wheel is empty.
    ///
    /// The lowest non-empty level holds it (invariant 3), so the search stops there.
    fn next_expiration(&self) -> Option<Expiration> {
        (0..LEVELS).find_map(|level| self.level_expiration(level))
    }

    /// The first non-empty slot of `level` after `elapsed`'s own slot, with its start tick.
    fn level_expiration(&self, level: usize) -> Option<Expiration> {
        let occupied = self.occupied[level];
        if occupied == 0 {
            return None;
        }
        let shift = level as u32 * SLOT_BITS;
        let now_slot = (self.elapsed_tick >> shift) & SLOT_MASK;
        // Distance in slots from `now_slot`, searched from the slot after it: 1..=64, where 64
        // is `now_slot` itself one rotation later (possible only at the top level, invariant 3).
        let distance = u64::from(occupied.rotate_right(now_slot as u32 + 1).trailing_zeros()) + 1;
        debug_assert!(
            level == LEVELS - 1 || now_slot + distance < SLOTS_PER_LEVEL as u64,
            "level {level}: occupied slot {} not after elapsed {}",
            (now_slot + distance) & SLOT_MASK,
            self.elapsed_tick
        );
        let rotation_start = self.elapsed_tick & !((1 << (shift + SLOT_BITS)) - 1);
        // No overflow: the result is the start of a slot holding a timer, so <= its due tick.
        let deadline = rotation_start + ((now_slot + distance) << shift);
        Some(Expiration {
            level,
            slot: ((now_slot + distance) & SLOT_MASK) as usize,
            deadline,
        })
    }

    /// Takes a node from the free list, or grows the slab, and fills it with a live timer.
    /// Returns its index and (odd) generation.
    fn allocate(&mut self, due: u64, item: u32) -> Result<(u32, u32), InsertError> {
        if self.free_head != NIL {
            let index = self.free_head;
            let node = &mut self.nodes[index as usize];
            debug_assert!(!is_live(node.generation), "free node {index} is live");
            self.free_head = node.next;
            let generation = node.generation.wrapping_add(1);
            *node = Node {
                due,
                item,
                next: NIL,
                prev: NIL,
                generation,
            };
            return Ok((index, generation));
        }
        let index = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&index| index < self.timer_count_max)
            .ok_or(InsertError::Full)?;
        let generation = 1;
        self.nodes.push(Node {
            due,
            item,
            next: NIL,
            prev: NIL,
            generation,
        });
        Ok((index, generation))
    }

    /// Marks the (unlinked) node `index` free, staling its keys, and pushes it on the free list.
    fn release(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        debug_assert!(is_live(node.generation), "double free of node {index}");
        node.generation = node.generation.wrapping_add(1);
        node.next = self.free_head;
        node.prev = NIL;
        self.free_head = index;
        self.len -= 1;
    }

    /// Appends the live node `index` to the tail of the slot list invariant 2 gives it.
    fn link(&mut self, index: u32) {
        let due = self.nodes[index as usize].due;
        let level = level_for(self.elapsed_tick, due);
        let slot = slot_for(due, level);
        let list = &mut self.lists[level][slot];
        let tail = list.tail;
        list.tail = index;
        if tail == NIL {
            list.head = index;
            self.occupied[level] |= 1 << slot;
        } else {
            self.nodes[tail as usize].next = index;
        }
        let node = &mut self.nodes[index as usize];
        node.prev = tail;
        node.next = NIL;
    }

    /// Unlinks the live node `index` from the slot list invariant 2 gives it.
    fn unlink(&mut self, index: u32) {
        let Node {
            due, next, prev, ..
        } = self.nodes[index as usize];
        let level = level_for(self.elapsed_tick, due);
        let slot = slot_for(due, level);
        let list = &mut self.lists[level][slot];
        if prev == NIL {
            debug_assert_eq!(
                list.head, index,
                "node {index} due {due}: not its list head"
            );
            list.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            debug_assert_eq!(
                list.tail, index,
                "node {index} due {due}: not its list tail"
            );
            list.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        if list.head == NIL {
            self.occupied[level] &= !(1 << slot);
        }
    }

    /// A wheel that holds at most `timer_count_max` timers, to test [`InsertError::Full`].
    #[cfg(test)]
    fn with_timer_count_max(timer_count_max: u32) -> Self {
        Self {
            timer_count_max,
            ..Self::new()
        }
    }
}

/// Whether a node generation marks a live node (odd) rather than a free one (even).
fn is_live(generation: u32) -> bool {
    generation % 2 == 1
}

/// The level of a timer due at `due` when the wheel is at `elapsed`: the level of the highest
/// bit in which the two differ (bits below one slot ignored), capped at the top level, whose
/// slots wrap around (tokio's `level_for`).
fn level_for(elapsed: u64, due: u64) -> usize {
    let masked = (elapsed ^ due) | SLOT_MASK;
    // `masked >= SLOT_MASK > 0`, so `ilog2` cannot panic.
    let level = (masked.ilog2() / SLOT_BITS) as usize;
    level.min(LEVELS - 1)
}

/// The slot of a timer due at `due` within `level`: that level's 6-bit field of `due`.
fn slot_for(due: u64, level: usize) -> usize {
    ((due >> (level as u32 * SLOT_BITS)) & SLOT_MASK) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// The ticks `advance` must hand out exactly at: the classic cliffs (`2^31 - 1`, `2^32`),
    /// the top-level slot size `2^36 ± 1` and the last tick of the range.
    const BOUNDARY_DELTAS: [u64; 6] = [
        (1 << 31) - 1,
        1 << 32,
        (1 << 36) - 1,
        1 << 36,
        (1 << 36) + 1,
        WHEEL_RANGE_TICKS - 1,
    ];

    fn expired(due: u64, item: u32) -> Expired {
        Expired {
            due: Tick(due),
            item,
        }
    }

    /// Advances `wheel` to `now` and returns what it handed out.
    fn advance(wheel: &mut Wheel, now: u64) -> Vec<Expired> {
        let mut out = Vec::new();
        wheel.advance(Tick(now), &mut out);
        out
    }

    /// Drives `wheel` the way the engine's driver does — sleep until `next_deadline`, advance —
    /// checking that the tick before each deadline hands out nothing, until something expires.
    fn drive_to_next_expiry(wheel: &mut Wheel) -> Result<Vec<Expired>, Box<dyn std::error::Error>> {
        loop {
            let deadline = wheel
                .next_deadline()
                .ok_or("wheel emptied without expiry")?;
            assert!(
                deadline > wheel.elapsed(),
                "{deadline:?} <= {:?}",
                wheel.elapsed()
            );
            assert_eq!(advance(wheel, deadline.0 - 1), []);
            let out = advance(wheel, deadline.0);
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }

    #[test]
    fn constants_are_consistent() {
        assert_eq!(WHEEL_RANGE_TICKS, 1 << 42);
        assert_eq!(SLOT_BITS, 6);
        assert_eq!(std::mem::size_of::<Node>(), 24);
        assert_eq!(level_for(0, WHEEL_RANGE_TICKS - 1), LEVELS - 1);
        assert_eq!(level_for(0, 63), 0);
        assert_eq!(level_for(0, 64), 1);
        assert_eq!(
            level_for(WHEEL_RANGE_TICKS - 1, WHEEL_RANGE_TICKS),
            LEVELS - 1
        );
    }

    #[test]
    fn due_of_live_and_stale_keys() {
        let mut wheel = Wheel::new();
        let key = wheel.insert(Tick(5), 1).expect("in range");
        assert_eq!(wheel.due(key), Some(Tick(5)));
        assert_eq!(wheel.remove(key), Some(1));
        assert_eq!(wheel.due(key), None);
        let key = wheel.insert(Tick(3), 2).expect("in range");
        let mut out = Vec::new();
        wheel.advance(Tick(3), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(wheel.due(key), None, "expired");
    }

    #[test]
    fn empty_wheel_has_no_deadline() {
        let wheel = Wheel::new();
        assert_eq!(wheel.next_deadline(), None);
        assert_eq!((wheel.len(), wheel.is_empty()), (0, true));
        assert_eq!(wheel.elapsed(), Tick(0));
        assert_eq!(Wheel::default().elapsed(), Tick(0));
    }

    #[test]
    fn elapsed_for_due_at_or_before_elapsed() -> TestResult {
        let mut wheel = Wheel::new();
        assert_eq!(wheel.insert(Tick(0), 1), Err(InsertError::Elapsed));
        let mut wheel = Wheel::with_elapsed(Tick(100));
        assert_eq!(wheel.insert(Tick(100), 1), Err(InsertError::Elapsed));
        assert_eq!(wheel.insert(Tick(99), 1), Err(InsertError::Elapsed));
        assert_eq!(wheel.insert(Tick(0), 1), Err(InsertError::Elapsed));
        wheel.insert(Tick(101), 2)?;
        assert_eq!(advance(&mut wheel, 200), [expired(101, 2)]);
        assert_eq!(wheel.insert(Tick(150), 3), Err(InsertError::Elapsed));
        assert_eq!(wheel.insert(Tick(200), 3), Err(InsertError::Elapsed));
        assert!(wheel.is_empty());
        Ok(())
    }

    #[test]
    fn too_far_at_wheel_range() -> TestResult {
        for start in [
            0,
            12_345,
            WHEEL_RANGE_TICKS - 1,
            u64::MAX - WHEEL_RANGE_TICKS,
        ] {
            let mut wheel = Wheel::with_elapsed(Tick(start));
            let range_end = start + WHEEL_RANGE_TICKS;
            assert_eq!(wheel.insert(Tick(range_end), 1), Err(InsertError::TooFar));
            assert_eq!(wheel.insert(Tick(u64::MAX), 1), Err(InsertError::TooFar));
            wheel.insert(Tick(range_end - 1), 2)?;
            assert_eq!(wheel.len(), 1);
        }
        Ok(())
    }

    #[test]
    fn boundaries_fire_exactly_at_their_tick() -> TestResult {
        // Starts: aligned, unaligned, just before a top-level rotation, mid-rotation, and so
        // close to u64::MAX that the range ends exactly there.
        let starts = [
            0,
            12_345,
            WHEEL_RANGE_TICKS - 7,
            3 * WHEEL_RANGE_TICKS + (1 << 36) - 1,
            u64::MAX - WHEEL_RANGE_TICKS,
        ];
        for start in starts {
            for delta in BOUNDARY_DELTAS {
                let due = start + delta;
                // By jumping: nothing at due - 1, exactly the timer at due.
                let mut wheel = Wheel::with_elapsed(Tick(start));
                wheel.insert(Tick(due), 7)?;
                assert_eq!(
                    advance(&mut wheel, due - 1),
                    [],
                    "start {start} delta {delta}"
                );
                assert_eq!(advance(&mut wheel, due), [expired(due, 7)]);
                // By following next_deadline, as the driver does.
                let mut wheel = Wheel::with_elapsed(Tick(start));
                wheel.insert(Tick(due), 8)?;
                assert_eq!(drive_to_next_expiry(&mut wheel)?, [expired(due, 8)]);
                assert_eq!(wheel.elapsed(), Tick(due));
                assert!(wheel.is_empty());
            }
            // All at once, inserted in reverse: out in due order after one jump.
            let mut wheel = Wheel::with_elapsed(Tick(start));
            for (item, delta) in (0..6u32).zip(BOUNDARY_DELTAS).rev() {
                wheel.insert(Tick(start + delta), item)?;
            }
            let want: Vec<_> = (0..)
                .zip(BOUNDARY_DELTAS)
                .map(|(item, delta)| expired(start + delta, item))
                .collect();
            assert_eq!(advance(&mut wheel, u64::MAX), want, "start {start}");
        }
        Ok(())
    }

    #[test]
    fn top_level_wraps_into_next_rotation() -> TestResult {
        // Elapsed sits in the last top-level slot; the first timer lands in that same slot one
        // rotation later, the second in slot 0 of the next rotation, the third at a lower level.
        let start = WHEEL_RANGE_TICKS - 10;
        let mut wheel = Wheel::with_elapsed(Tick(start));
        let far = start + WHEEL_RANGE_TICKS - 1;
        assert_eq!(slot_for(far, LEVELS - 1), slot_for(start, LEVELS - 1));
        wheel.insert(Tick(far), 1)?;
        wheel.insert(Tick(WHEEL_RANGE_TICKS + 5), 2)?;
        wheel.insert(Tick(start + 3), 3)?;
        assert_eq!(wheel.next_deadline(), Some(Tick(start + 3)));
        assert_eq!(drive_to_next_expiry(&mut wheel)?, [expired(start + 3, 3)]);
        assert_eq!(wheel.next_deadline(), Some(Tick(WHEEL_RANGE_TICKS)));
        assert_eq!(
            drive_to_next_expiry(&mut wheel)?,
            [expired(WHEEL_RANGE_TICKS + 5, 2)]
        );
        assert_eq!(drive_to_next_expiry(&mut wheel)?, [expired(far, 1)]);
        Ok(())
    }

    #[test]
    fn due_at_u64_max_fires() -> TestResult {
        let mut wheel = Wheel::with_elapsed(Tick(u64::MAX - 100));
        wheel.insert(Tick(u64::MAX), 1)?;
        wheel.insert(Tick(u64::MAX - 64), 2)?;
        assert_eq!(
            advance(&mut wheel, u64::MAX),
            [expired(u64::MAX - 64, 2), expired(u64::MAX, 1)]
        );
        assert_eq!(wheel.insert(Tick(u64::MAX), 3), Err(InsertError::Elapsed));
        Ok(())
    }

    #[test]
    fn equal_due_fifo_across_cascades() -> TestResult {
        // A due tick with a distinct non-zero field at every level, so that inserting it at each
        // of `points` files it at level 6, 5, ..., 0: every later insert meets the earlier ones
        // only after they have cascaded down.
        let due: u64 = (3 << 36) + (5 << 30) + (7 << 24) + (11 << 18) + (13 << 12) + (17 << 6) + 19;
        for offset in [0, 1] {
            let mut points: Vec<u64> = (0..LEVELS as u32)
                .rev()
                .map(|level| (due & !((1 << (6 * (level + 1))) - 1)) + offset)
                .collect();
            points.push(due - 2);
            let mut wheel = Wheel::new();
            let mut levels = Vec::new();
            let mut removed = None;
            for (item, &at) in (0..).zip(&points) {
                assert_eq!(advance(&mut wheel, at), []);
                levels.push(level_for(wheel.elapsed().0, due));
                wheel.insert(Tick(due), item)?;
                // Decoys one tick either side, and one removed from the middle of the queue.
                wheel.insert(Tick(due + 1), 100 + item)?;
                wheel.insert(Tick(due - 1), 200 + item)?;
                if item == 3 {
                    removed = Some(wheel.insert(Tick(due), 300)?);
                }
            }
            assert_eq!(levels, [6, 5, 4, 3, 2, 1, 0, 0], "offset {offset}");
            assert_eq!(wheel.remove(removed.ok_or("no key")?), Some(300));
            let out = advance(&mut wheel, due + 1);
            let before: Vec<u32> = out
                .iter()
                .filter(|e| e.due == Tick(due - 1))
                .map(|e| e.item)
                .collect();
            assert_eq!(before, [200, 201, 202, 203, 204, 205, 206, 207]);
            let at_due: Vec<u32> = out
                .iter()
                .filter(|e| e.due == Tick(due))
                .map(|e| e.item)
                .collect();
            assert_eq!(at_due, [0, 1, 2, 3, 4, 5, 6, 7]);
            let after: Vec<u32> = out
                .iter()
                .filter(|e| e.due == Tick(due + 1))
                .map(|e| e.item)
                .collect();
            assert_eq!(after, [100, 101, 102, 103, 104, 105, 106, 107]);
            assert_eq!(out.len(), 3 * points.len());
            assert!(out.windows(2).all(|pair| pair[0].due <= pair[1].due));
            assert!(wheel.is_empty());
        }
        Ok(())
    }

    #[test]
    fn stale_key_after_remove_and_expiry() -> TestResult {
        let mut wheel = Wheel::new();
        let first = wheel.insert(Tick(10), 1)?;
        let second = wheel.insert(Tick(20), 2)?;
        assert_eq!(wheel.remove(first), Some(1));
        assert_eq!(wheel.remove(first), None);
        // The freed node is reused at once; the old key stays stale.
        let third = wheel.insert(Tick(30), 3)?;
        assert_eq!(wheel.nodes.len(), 2);
        assert_eq!(wheel.remove(first), None);
        assert_eq!(advance(&mut wheel, 25), [expired(20, 2)]);
        assert_eq!(wheel.remove(second), None);
        assert_eq!(wheel.remove(third), Some(3));
        assert_eq!(wheel.remove(third), None);
        // A key this wheel never issued.
        assert_eq!(wheel.remove(TimerKey(1_000, NonZeroU32::MIN)), None);
        assert!(wheel.is_empty());
        Ok(())
    }

    #[test]
    fn remove_frees_node_for_reuse() -> TestResult {
        let mut wheel = Wheel::new();
        let keep = wheel.insert(Tick(1 << 40), 0)?;
        for item in 1..10_000u32 {
            let key = wheel.insert(Tick(u64::from(item) << 20), item)?;
            assert_eq!(wheel.len(), 2);
            assert_eq!(wheel.remove(key), Some(item));
        }
        assert_eq!((wheel.len(), wheel.nodes.len()), (1, 2));
        // 2^40 is itself the start of top-level slot 16.
        assert_eq!(wheel.next_deadline(), Some(Tick(1 << 40)));
        assert_eq!(wheel.remove(keep), Some(0));
        assert_eq!(wheel.next_deadline(), None);
        Ok(())
    }

    #[test]
    fn remove_keeps_neighbours_linked() -> TestResult {
        // Head, middle and tail removal from one slot list, then the slot empties.
        let mut wheel = Wheel::new();
        let keys = (0..5)
            .map(|item| wheel.insert(Tick(500), item))
            .collect::<Result<Vec<_>, _>>()?;
        assert_eq!(wheel.remove(keys[0]), Some(0));
        assert_eq!(wheel.remove(keys[2]), Some(2));
        assert_eq!(wheel.remove(keys[4]), Some(4));
        assert_eq!(advance(&mut wheel, 500), [expired(500, 1), expired(500, 3)]);
        assert_eq!(wheel.occupied, [0; LEVELS]);
        Ok(())
    }

    #[test]
    fn insert_full_at_timer_count_max() -> TestResult {
        let mut wheel = Wheel::with_timer_count_max(2);
        let first = wheel.insert(Tick(5), 1)?;
        wheel.insert(Tick(6), 2)?;
        assert_eq!(wheel.insert(Tick(7), 3), Err(InsertError::Full));
        assert_eq!(wheel.len(), 2);
        assert_eq!(wheel.remove(first), Some(1));
        wheel.insert(Tick(7), 3)?;
        assert_eq!(advance(&mut wheel, 10), [expired(6, 2), expired(7, 3)]);
        Ok(())
    }

    #[test]
    fn advance_backwards_is_a_no_op() -> TestResult {
        let mut wheel = Wheel::with_elapsed(Tick(1_000));
        wheel.insert(Tick(1_500), 1)?;
        assert_eq!(advance(&mut wheel, 10), []);
        assert_eq!(advance(&mut wheel, 1_000), []);
        assert_eq!(wheel.elapsed(), Tick(1_000));
        assert_eq!(wheel.len(), 1);
        Ok(())
    }

    #[test]
    fn next_deadline_is_cascade_point_not_later_than_due() -> TestResult {
        let mut wheel = Wheel::new();
        let due = (1 << 36) + 5;
        wheel.insert(Tick(due), 1)?;
        // The top-level slot starts at 2^36: the cascade happens there, then at finer slots.
        assert_eq!(wheel.next_deadline(), Some(Tick(1 << 36)));
        assert_eq!(advance(&mut wheel, 1 << 36), []);
        assert_eq!(wheel.next_deadline(), Some(Tick(due)));
        Ok(())
    }

    #[test]
    fn big_jump_over_empty_wheel_visits_no_slot() -> TestResult {
        let mut wheel = Wheel::new();
        assert_eq!(advance(&mut wheel, u64::MAX - 1), []);
        assert_eq!(wheel.slots_processed, 0);
        assert_eq!(wheel.elapsed(), Tick(u64::MAX - 1));

        // One far timer cascades down at most once per level, however long the jump.
        let mut wheel = Wheel::new();
        wheel.insert(Tick(WHEEL_RANGE_TICKS - 1), 1)?;
        assert_eq!(
            advance(&mut wheel, u64::MAX),
            [expired(WHEEL_RANGE_TICKS - 1, 1)]
        );
        assert!(
            wheel.slots_processed <= LEVELS as u64,
            "{}",
            wheel.slots_processed
        );

        // Sparse timers: the work is bounded by timers x levels, not by ticks.
        let mut wheel = Wheel::new();
        let dues: Vec<u64> = (1..=100u64).map(|i| i * 40_000_000_007).collect();
        for (item, &due) in (0..).zip(&dues) {
            wheel.insert(Tick(due), item)?;
        }
        assert_eq!(advance(&mut wheel, 1 << 50).len(), dues.len());
        assert!(
            wheel.slots_processed <= 100 * LEVELS as u64,
            "{}",
            wheel.slots_processed
        );
        Ok(())
    }

    #[test]
    fn debug_shows_state() -> TestResult {
        let mut wheel = Wheel::with_elapsed(Tick(3));
        wheel.insert(Tick(9), 1)?;
        let text = format!("{wheel:?}");
        assert!(
            text.contains("elapsed: Tick(3)") && text.contains("len: 1"),
            "{text}"
        );
        assert_eq!(
            InsertError::TooFar.to_string(),
            "due tick is WHEEL_RANGE_TICKS or more after the wheel's elapsed tick"
        );
        Ok(())
    }

    // ----- model-based property test -----

    /// One step of a random history.
    #[derive(Clone, Debug)]
    enum Op {
        /// Insert at `elapsed + delta` (0 and >= range are expected to fail).
        Insert {
            delta: u64,
        },
        /// Insert another timer at the due tick of a live one (equal-due FIFO).
        InsertSameDue {
            pick: usize,
        },
        Remove {
            pick: usize,
        },
        RemoveStale {
            pick: usize,
        },
        Advance {
            step: u64,
        },
        /// Advance to the next multiple of `64^level`, plus `jitter - 1`.
        AdvanceToBoundary {
            level: u32,
            jitter: u64,
        },
        /// Advance to `next_deadline - 1` (nothing may come out), then to `next_deadline`.
        AdvanceToDeadline,
    }

    fn boundary_delta() -> impl Strategy<Value = u64> {
        let anchors: Vec<u64> = (1..LEVELS as u32)
            .map(|level| 1u64 << (6 * level))
            .chain([1 << 31, 1 << 32, WHEEL_RANGE_TICKS])
            .collect();
        (prop::sample::select(anchors), 0..5u64).prop_map(|(anchor, jitter)| anchor + jitter - 2)
    }

    fn delta() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..4u64,
            0..130u64,
            0..10_000u64,
            0..1u64 << 24,
            0..=WHEEL_RANGE_TICKS + 1,
            boundary_delta(),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => delta().prop_map(|delta| Op::Insert { delta }),
            2 => any::<usize>().prop_map(|pick| Op::InsertSameDue { pick }),
            2 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
            1 => any::<usize>().prop_map(|pick| Op::RemoveStale { pick }),
            3 => delta().prop_map(|step| Op::Advance { step }),
            1 => (1..LEVELS as u32 + 1, 0..3u64)
                .prop_map(|(level, jitter)| Op::AdvanceToBoundary { level, jitter }),
            2 => Just(Op::AdvanceToDeadline),
        ]
    }

    fn start_tick() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            0..1u64 << 50,
            Just(WHEEL_RANGE_TICKS - 3),
            Just(5 * WHEEL_RANGE_TICKS - (1 << 36) - 2),
            Just(u64::MAX - WHEEL_RANGE_TICKS - 5),
            Just(u64::MAX - 200),
        ]
    }

    /// The wheel next to its reference model: a queue ordered by `(due, insertion sequence)`.
    #[derive(Default)]
    struct Harness {
        wheel: Wheel,
        model: BTreeMap<(u64, u32), u32>,
        live: Vec<(TimerKey, (u64, u32))>,
        stale: Vec<TimerKey>,
        next_sequence: u32,
    }

    impl Harness {
        fn new(start: u64) -> Self {
            Self {
                wheel: Wheel::with_elapsed(Tick(start)),
                ..Self::default()
            }
        }

        fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
            let elapsed = self.wheel.elapsed().0;
            match *op {
                Op::Insert { delta } => {
                    if let Some(due) = elapsed.checked_add(delta) {
                        self.insert(due)?;
                    }
                }
                Op::InsertSameDue { pick } => {
                    if !self.live.is_empty() {
                        let (_, (due, _)) = self.live[pick % self.live.len()];
                        self.insert(due)?;
                    }
                }
                Op::Remove { pick } => {
                    if !self.live.is_empty() {
                        let (key, model_key) = self.live.swap_remove(pick % self.live.len());
                        prop_assert_eq!(self.wheel.remove(key), self.model.remove(&model_key));
                        self.stale.push(key);
                    }
                }
                Op::RemoveStale { pick } => {
                    if !self.stale.is_empty() {
                        let key = self.stale[pick % self.stale.len()];
                        prop_assert_eq!(self.wheel.remove(key), None);
                    }
                }
                Op::Advance { step } => self.advance(elapsed.saturating_add(step))?,
                Op::AdvanceToBoundary { level, jitter } => {
                    let mask = (1u64 << (6 * level)) - 1;
                    let boundary = (elapsed | mask).saturating_add(jitter);
                    self.advance(boundary)?;
                }
                Op::AdvanceToDeadline => {
                    if let Some(deadline) = self.wheel.next_deadline() {
                        self.advance(deadline.0 - 1)?;
                        let before = self.wheel.slots_processed;
                        self.advance(deadline.0)?;
                        // The deadline is not too early either: there was work at that tick.
                        prop_assert!(self.wheel.slots_processed > before);
                    }
                }
            }
            self.check()
        }

        fn insert(&mut self, due: u64) -> Result<(), TestCaseError> {
            let elapsed = self.wheel.elapsed().0;
            let item = self.next_sequence;
            self.next_sequence += 1;
            let want = if due <= elapsed {
                Err(InsertError::Elapsed)
            } else if due - elapsed >= WHEEL_RANGE_TICKS {
                Err(InsertError::TooFar)
            } else {
                Ok(())
            };
            match (self.wheel.insert(Tick(due), item), want) {
                (Ok(key), Ok(())) => {
                    self.model.insert((due, item), item);
                    self.live.push((key, (due, item)));
                }
                (Err(got), Err(want)) => prop_assert_eq!(got, want),
                (got, want) => {
                    prop_assert!(false, "insert {due} at {elapsed}: {got:?}, want {want:?}")
                }
            }
            Ok(())
        }

        fn advance(&mut self, now: u64) -> Result<(), TestCaseError> {
            let elapsed = self.wheel.elapsed().0;
            let mut out = Vec::new();
            self.wheel.advance(Tick(now), &mut out);
            let mut want = Vec::new();
            while let Some(entry) = self.model.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let ((due, _), item) = entry.remove_entry();
                want.push(expired(due, item));
            }
            prop_assert_eq!(out, want, "advance {} -> {}", elapsed, now);
            prop_assert_eq!(self.wheel.elapsed().0, now.max(elapsed));
            let model = &self.model;
            let stale = &mut self.stale;
            self.live.retain(|&(key, model_key)| {
                let live = model.contains_key(&model_key);
                if !live {
                    stale.push(key);
                }
                live
            });
            Ok(())
        }

        fn check(&self) -> Result<(), TestCaseError> {
            prop_assert_eq!(self.wheel.len(), self.model.len());
            prop_assert_eq!(self.wheel.is_empty(), self.model.is_empty());
            let elapsed = self.wheel.elapsed();
            match (self.wheel.next_deadline(), self.model.keys().next()) {
                (None, None) => {}
                (Some(deadline), Some(&(due, _))) => {
                    prop_assert!(
                        elapsed < deadline && deadline.0 <= due,
                        "{deadline:?} {due}"
                    )
                }
                (deadline, first) => prop_assert!(false, "{deadline:?} vs model {first:?}"),
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        #[test]
        fn wheel_matches_model(start in start_tick(), ops in prop::collection::vec(op(), 1..300)) {
            let mut harness = Harness::new(start);
            for op in &ops {
                harness.apply(op)?;
            }
            // Drain: everything left comes out in order, at the latest one range later.
            let end = harness.wheel.elapsed().0.saturating_add(WHEEL_RANGE_TICKS);
            harness.advance(end)?;
            prop_assert!(harness.wheel.is_empty());
        }
    }
}
