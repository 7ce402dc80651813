//! The allocation probe of the fuzz targets: a global allocator that remembers the largest
//! single allocation the current thread made, so a target can check that a body allocated no
//! more than its input justifies ([`kairos::fuzzing::allocation_bound`]) — a length field
//! claiming 4 GiB must not become a 4 GiB buffer. libFuzzer's own `-malloc_limit_mb` needs a
//! sanitizer's malloc hooks, which `--sanitizer=none` does not have.
//!
//! `tests/fuzz_corpus.rs` at the root compiles this same file (by path) to check the corpus
//! replay the same way on stable Rust.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Largest allocation (bytes) since the last [`largest_allocation_during`] began.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting the size of every allocation and reallocation made by the
/// current thread. Install it with `#[global_allocator]`.
pub struct LargestAllocation;

fn note(size: usize) {
    // A const-initialised `Cell` needs no destructor and never allocates; `try_with` only
    // fails while the thread is being torn down, when nothing is being measured.
    let _ = LARGEST.try_with(|largest| {
        if size > largest.get() {
            largest.set(size);
        }
    });
}

// SAFETY: every method forwards to `System` with its arguments unchanged, so `System`'s
// guarantees are ours; the only addition is bookkeeping in a thread-local `Cell`.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract for `layout`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`; the caller
        // upholds `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns the largest single allocation (bytes) the current thread made
/// meanwhile. Allocations of other threads (the log's writer thread) are not seen.
pub fn largest_allocation_during(f: impl FnOnce()) -> usize {
    LARGEST.with(|largest| largest.set(0));
    f();
    LARGEST.with(Cell::get)
}

/// Runs a target body on `data` and panics if any single allocation exceeded
/// [`kairos::fuzzing::allocation_bound`] for the input's length.
pub fn run_bounded(target: &str, data: &[u8], body: impl FnOnce(&[u8])) {
    let largest = largest_allocation_during(|| body(data));
    let bound = kairos::fuzzing::allocation_bound(data.len());
    assert!(
        largest <= bound,
        "{target}: a {}-byte input made a {largest}-byte allocation (bound {bound})",
        data.len()
    );
}
