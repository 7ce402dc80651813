//! A damaged length field must not make recovery allocate what it claims: recovery checks it
//! against the frame limit and the bytes left in the file first. Measured with a counting
//! global allocator, so this file is its own test binary with a single test.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use kairos_wal::format::FRAME_BODY_BYTES_MAX;
use kairos_wal::{scan, Durability, Lsn, WalOptions};

/// Delegates to the system allocator and remembers the largest single request.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` unchanged, which upholds `GlobalAlloc`'s contract;
// the only addition is an atomic maximum of the requested sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with `layout`; same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn huge_length_fields_allocate_nothing() -> TestResult {
    for huge in [
        u32::MAX,
        FRAME_BODY_BYTES_MAX,
        FRAME_BODY_BYTES_MAX + 1,
        0x8000_0000,
    ] {
        let (sim, seg) = {
            let sim = kairos_wal::SimStorage::new(70);
            let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
            for i in 1..=10 {
                append_one(&wal, i)?;
            }
            drop(wal);
            let seg = segments(&sim, dir())[0].clone();
            (sim, seg)
        };
        let frame8 = buffered_frame_offset(8) as usize;
        let mut bytes = sim.read_file(&seg).ok_or("no segment")?;
        bytes[frame8..frame8 + 4].copy_from_slice(&huge.to_le_bytes());
        let len = bytes.len() as u64;
        sim.write_file(&seg, &bytes);
        drop(bytes);

        LARGEST.store(0, Ordering::SeqCst);
        let report = scan(&sim, dir(), 1 << 20, &mut |_| {})?;
        let (wal, recovered, replayed) = open(&sim, WalOptions::default())?;
        let largest = LARGEST.load(Ordering::SeqCst);
        assert!(
            largest < 1 << 20,
            "length {huge:#x}: allocated {largest} bytes at once"
        );

        let torn = report.torn_tail.ok_or("no torn tail")?;
        assert_eq!((torn.offset, torn.first_lost_lsn), (frame8 as u64, Lsn(8)));
        assert_eq!(torn.bytes_truncated, len - frame8 as u64);
        assert_eq!(recovered.torn_tail, Some(torn));
        assert_eq!(replayed, expected(7));
        drop(wal);
    }
    Ok(())
}
