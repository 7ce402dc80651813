//! Fuzz target `engine_model`: see `kairos::fuzzing::engine_model` for the input and what is checked.
#![no_main]

use kairos_fuzz::LargestAllocation;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fuzz_target!(|data: &[u8]| {
    kairos_fuzz::run_bounded("engine_model", data, kairos::fuzzing::engine_model);
});
