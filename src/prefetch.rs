//! Cache prefetch hints: ask the CPU to start loading memory a loop or a
//! call will need shortly, so that several misses to memory overlap. Hints
//! only: nothing the program computes changes (a no-op off x86_64).

/// Bytes in a cache line on the targets this is tuned for (x86_64).
pub(crate) const CACHE_LINE_BYTES: usize = 64;

/// Starts loading the cache line holding `address` (any address: a
/// prefetch never faults). One of the crate's two `unsafe` places (the other:
/// `index::Table`).
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn prefetch_address(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` requires SSE, part of the x86_64 baseline
    // every x86_64 target compiles for. A prefetch never faults and has no
    // effect visible to the program, whatever the address: it is a hint,
    // not an access of memory in Rust's sense, so the pointer made from an
    // integer here is never dereferenced. Tested with live, stale and wild
    // addresses in `tests::prefetch_changes_nothing` and
    // `tests::any_address_may_be_prefetched`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Asks the CPU to start loading the cache lines `value` occupies (a value
/// of up to 64 bytes spans at most two; larger ones every line in
/// between). A hint: it changes nothing the program computes (a no-op off
/// x86_64).
///
/// Recovery reads millions of tasks in due order from a vector in
/// checkpoint order, one random read each; issuing the read a few tasks
/// ahead overlaps the misses (10 M tasks: the load loop took 3.4–4.2 s
/// instead of 5.5 s on the 2-core VM of BENCHMARKS.md).
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    let start = (value as *const T).cast::<i8>();
    // The start of each line the value touches (none for a zero-sized one):
    // `wrapping_add`/`wrapping_sub` only compute addresses, they never
    // dereference.
    let size = std::mem::size_of::<T>();
    let offset = start as usize % CACHE_LINE_BYTES;
    let first = start.wrapping_sub(offset);
    let lines = if size == 0 {
        0
    } else {
        (offset + size).div_ceil(CACHE_LINE_BYTES)
    };
    for line in 0..lines {
        let at = first.wrapping_add(line * CACHE_LINE_BYTES);
        prefetch_address(at as usize);
    }
}

/// [`prefetch`] for the cache lines of a byte slice's first 256 bytes
/// (none if empty): a key and the start of its payload; a large payload is
/// read as a stream anyway, and prefetching all of it would evict what the
/// loop needs next.
#[inline(always)]
pub(crate) fn prefetch_bytes(bytes: &[u8]) {
    let bytes = &bytes[..bytes.len().min(4 * CACHE_LINE_BYTES)];
    // One byte per line: the lines from the first byte's to the last's.
    let start = bytes.as_ptr() as usize % CACHE_LINE_BYTES;
    for at in (0..bytes.len() + start).step_by(CACHE_LINE_BYTES) {
        if let Some(byte) = bytes.get(at.saturating_sub(start)) {
            prefetch(byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_changes_nothing() {
        let v: Vec<u64> = (0..1_000).collect();
        for x in &v {
            prefetch(x);
        }
        prefetch(&());
        prefetch(&v[v.len() - 1]);
        let boxed: Box<[u8]> = vec![7u8; 3].into();
        prefetch(&boxed[2]);
        // A value spanning several lines.
        let wide = [9u8; 300];
        prefetch(&wide);
        assert_eq!(wide, [9u8; 300]);
        assert_eq!(v, (0..1_000).collect::<Vec<u64>>());
        assert_eq!(&*boxed, &[7, 7, 7]);
    }

    #[test]
    fn any_address_may_be_prefetched() {
        let live = vec![5u8; 4096];
        let freed = {
            let v = vec![1u64; 1 << 16];
            v.as_ptr() as usize
        };
        let inside = live.as_ptr() as usize + 100;
        for address in [0, 1, 63, freed, inside, usize::MAX / 2, usize::MAX] {
            prefetch_address(address);
        }
        prefetch_bytes(&[]);
        prefetch_bytes(&live);
        // Nothing the program can see changed.
        assert!(live.iter().all(|&b| b == 5));
    }
}
