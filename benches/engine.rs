//! Engine throughput benches (criterion). Figures and the machine they were
//! measured on are in BENCHMARKS.md; reproduce with `cargo bench --bench engine`.
//!
//! * in-memory engine, 1 M tasks with the DESIGN.md delay mix: schedule,
//!   cancel, and expire (advance a manual clock past every due time and
//!   receive every task);
//! * `Sync` on a real directory: single-task schedules from 1 and from 8
//!   producer threads (group commit), and batches of 1 000.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kairos::{Config, Durability, Engine, ManualClock, NewTask};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIX_TASKS: usize = 1_000_000;
const WALL_START_MS: u64 = 1_700_000_000_000;

/// Delays in ms with the DESIGN.md mix: 45 % ≤ 30 min, 35 % ≤ 7 d, 20 % ≤ 30 d.
fn delays_ms(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let p: f64 = rng.random();
            let max = if p < 0.45 {
                30 * 60_000
            } else if p < 0.80 {
                7 * 86_400_000
            } else {
                30 * 86_400_000
            };
            rng.random_range(1..=max)
        })
        .collect()
}

fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("order:{i:012}:timeout").into_bytes())
        .collect()
}

fn memory_engine(clock: &ManualClock) -> Engine {
    let mut config = Config::default();
    config.pending_tasks_max = 2 * MIX_TASKS;
    Engine::in_memory(config, Arc::new(clock.clone())).expect("in-memory engine")
}

fn schedule_all(engine: &Engine, keys: &[Vec<u8>], delays: &[u64]) {
    for (k, d) in keys.iter().zip(delays) {
        engine
            .schedule_after(
                k,
                Duration::from_millis(*d),
                b"payload-64-bytes-payload-64-bytes-payload-64-bytes-payload-64-by",
            )
            .expect("schedule");
    }
}

fn in_memory(c: &mut Criterion) {
    let keys = keys(MIX_TASKS);
    let delays = delays_ms(MIX_TASKS, 7);
    let mut g = c.benchmark_group("in_memory_1M");
    g.sample_size(10);
    g.throughput(Throughput::Elements(MIX_TASKS as u64));

    g.bench_function("schedule", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let clock = ManualClock::new(WALL_START_MS);
                let engine = memory_engine(&clock);
                let t = Instant::now();
                schedule_all(&engine, &keys, &delays);
                total += t.elapsed();
            }
            total
        })
    });

    g.bench_function("cancel", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let clock = ManualClock::new(WALL_START_MS);
                let engine = memory_engine(&clock);
                schedule_all(&engine, &keys, &delays);
                let t = Instant::now();
                for k in &keys {
                    engine.cancel(k).expect("cancel");
                }
                total += t.elapsed();
            }
            total
        })
    });

    g.bench_function("expire", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let clock = ManualClock::new(WALL_START_MS);
                let engine = memory_engine(&clock);
                schedule_all(&engine, &keys, &delays);
                let consumer = engine.consumer();
                let t = Instant::now();
                clock.advance(Duration::from_secs(31 * 86_400));
                engine.run_until_idle();
                let mut received = 0;
                while consumer.try_recv().is_ok() {
                    received += 1;
                }
                total += t.elapsed();
                assert_eq!(received, MIX_TASKS);
            }
            total
        })
    });
    g.finish();
}

fn sync_engine(dir: &std::path::Path) -> Engine {
    let mut config = Config::default();
    config.durability = Durability::Sync;
    Engine::open(dir, config).expect("open")
}

/// Single-task `Sync` schedules from `producers` threads; returns elapsed.
fn sync_producers(producers: usize, per_producer: usize) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = sync_engine(dir.path());
    let t = Instant::now();
    std::thread::scope(|s| {
        for p in 0..producers {
            let engine = &engine;
            s.spawn(move || {
                for i in 0..per_producer {
                    let key = format!("p{p}:order:{i:012}");
                    engine
                        .schedule_after(key.as_bytes(), Duration::from_secs(3600), &[0u8; 100])
                        .expect("schedule");
                }
            });
        }
    });
    let elapsed = t.elapsed();
    engine.shutdown().expect("shutdown");
    elapsed
}

fn sync_disk(c: &mut Criterion) {
    let mut g = c.benchmark_group("sync_schedule");
    g.sample_size(10);
    const PER_PRODUCER: usize = 500;
    for producers in [1usize, 8] {
        g.throughput(Throughput::Elements((producers * PER_PRODUCER) as u64));
        g.bench_with_input(
            BenchmarkId::new("producers", producers),
            &producers,
            |b, &producers| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| sync_producers(producers, PER_PRODUCER))
                        .sum()
                })
            },
        );
    }
    const BATCH: usize = 1_000;
    const BATCHES: usize = 50;
    g.throughput(Throughput::Elements((BATCH * BATCHES) as u64));
    g.bench_function("batch_1000", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().expect("tempdir");
                let engine = sync_engine(dir.path());
                let keys = keys(BATCH * BATCHES);
                let payload = [0u8; 100];
                let t = Instant::now();
                for chunk in keys.chunks(BATCH) {
                    let tasks: Vec<NewTask<'_>> = chunk
                        .iter()
                        .map(|k| NewTask {
                            key: k,
                            due: kairos::Due::After(Duration::from_secs(3600)),
                            payload: &payload,
                        })
                        .collect();
                    engine.schedule_many(&tasks).expect("schedule_many");
                }
                total += t.elapsed();
                engine.shutdown().expect("shutdown");
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, in_memory, sync_disk);
criterion_main!(benches);
