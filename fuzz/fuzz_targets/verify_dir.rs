//! Fuzz target `verify_dir`: see `kairos::fuzzing::verify_dir` for the input and what is checked.
#![no_main]

use kairos_fuzz::LargestAllocation;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fuzz_target!(|data: &[u8]| {
    kairos_fuzz::run_bounded("verify_dir", data, kairos::fuzzing::verify_dir);
});
