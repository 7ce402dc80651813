//! Fuzz target `overflow_file`: see `kairos::fuzzing::overflow_file` for the input and what is
//! checked.
#![no_main]

use kairos_fuzz::LargestAllocation;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fuzz_target!(|data: &[u8]| {
    kairos_fuzz::run_bounded("overflow_file", data, kairos::fuzzing::overflow_file);
});
