//! Timing-wheel benches (criterion): the pure `kairos::wheel::Wheel`, without log, index or
//! channel. Reproduce with `cargo bench --bench wheel`.
//!
//! 1 M timers, 1 ms ticks, delays with the DESIGN.md mix (45 % ≤ 30 min, 35 % ≤ 7 d,
//! 20 % ≤ 30 d):
//! * `insert` — 1 M inserts into an empty wheel (slab growth included);
//! * `remove` — remove all 1 M by key, in random order;
//! * `advance_expire_jump` — one `advance` to 30 d + 1 ms hands out all 1 M, in order;
//! * `advance_expire_steps_1s` — the same in 1 s steps (2.59 M `advance` calls);
//! * `lifecycle` — insert 1 M, remove a random half, expire the rest with one jump (the
//!   research peer table's workload, in-memory structure only).

mod common;

use common::{delays_ms, DAY_MS};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kairos::wheel::{Expired, Tick, TimerKey, Wheel};
use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

const TIMER_COUNT: usize = 1_000_000;
const END_TICK: u64 = 30 * DAY_MS + 1;

/// Inserts one timer per delay into `wheel` (at elapsed 0, so due = delay) and returns the keys.
fn fill(wheel: &mut Wheel, delays: &[u64]) -> Vec<TimerKey> {
    (0u32..)
        .zip(delays)
        .map(|(item, &delay)| wheel.insert(Tick(delay), item))
        .collect::<Result<_, _>>()
        .expect("every mix delay is within the wheel's range")
}

fn bench_wheel(c: &mut Criterion) {
    let delays = delays_ms(TIMER_COUNT, 42);
    let mut filled = Wheel::new();
    let keys = fill(&mut filled, &delays);
    let mut shuffled = keys.clone();
    shuffled.shuffle(&mut StdRng::seed_from_u64(7));
    let half = &shuffled[..TIMER_COUNT / 2];

    let mut group = c.benchmark_group("wheel_1m");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(TIMER_COUNT as u64));

    group.bench_function("insert", |b| {
        b.iter_batched(
            Wheel::new,
            |mut wheel| {
                fill(&mut wheel, black_box(&delays));
                wheel
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("remove", |b| {
        b.iter_batched(
            || filled.clone(),
            |mut wheel| {
                for &key in &shuffled {
                    black_box(wheel.remove(key));
                }
                wheel
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("advance_expire_jump", |b| {
        b.iter_batched(
            || (filled.clone(), Vec::<Expired>::with_capacity(TIMER_COUNT)),
            |(mut wheel, mut out)| {
                wheel.advance(Tick(END_TICK), &mut out);
                assert_eq!(out.len(), TIMER_COUNT);
                (wheel, out)
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("advance_expire_steps_1s", |b| {
        b.iter_batched(
            || (filled.clone(), Vec::<Expired>::with_capacity(TIMER_COUNT)),
            |(mut wheel, mut out)| {
                for now in (1_000..END_TICK + 1_000).step_by(1_000) {
                    wheel.advance(Tick(now), &mut out);
                }
                assert_eq!(out.len(), TIMER_COUNT);
                (wheel, out)
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("lifecycle", |b| {
        b.iter_batched(
            || Vec::<Expired>::with_capacity(TIMER_COUNT),
            |mut out| {
                let mut wheel = Wheel::new();
                fill(&mut wheel, &delays);
                for &key in half {
                    black_box(wheel.remove(key));
                }
                wheel.advance(Tick(END_TICK), &mut out);
                assert_eq!(out.len(), TIMER_COUNT - half.len());
                (wheel, out)
            },
            BatchSize::PerIteration,
        )
    });

    group.finish();
}

criterion_group!(benches, bench_wheel);
criterion_main!(benches);
