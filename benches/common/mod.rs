//! What the benches share: the DESIGN.md workload.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// One day in milliseconds.
pub const DAY_MS: u64 = 86_400_000;

/// `n` delays in ms with the DESIGN.md mix: 45 % ≤ 30 min, 35 % ≤ 7 d,
/// 20 % ≤ 30 d; the same `seed` gives the same delays.
pub fn delays_ms(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let p: f64 = rng.random();
            let max = if p < 0.45 {
                30 * 60_000
            } else if p < 0.80 {
                7 * DAY_MS
            } else {
                30 * DAY_MS
            };
            rng.random_range(1..=max)
        })
        .collect()
}
