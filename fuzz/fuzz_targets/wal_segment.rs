//! Fuzz target `wal_segment`: see `kairos::fuzzing::wal_segment` for the input and what is checked.
#![no_main]

use kairos_fuzz::LargestAllocation;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fuzz_target!(|data: &[u8]| {
    kairos_fuzz::run_bounded("wal_segment", data, kairos::fuzzing::wal_segment);
});
