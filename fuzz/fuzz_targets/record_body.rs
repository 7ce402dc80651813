//! Fuzz target `record_body`: see `kairos::fuzzing::record_body` for the input and what is checked.
#![no_main]

use kairos_fuzz::LargestAllocation;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fuzz_target!(|data: &[u8]| {
    kairos_fuzz::run_bounded("record_body", data, kairos::fuzzing::record_body);
});
