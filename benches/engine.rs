//! Engine throughput benches (criterion). Figures and the machine they were
//! measured on are in BENCHMARKS.md; reproduce with `cargo bench --bench engine`.
//!
//! * in-memory engine, 1 M tasks with the DESIGN.md delay mix: schedule,
//!   cancel, the same two through `schedule_many`/`cancel_many` in batches
//!   of 1 000, and expire (advance a manual clock past every due time and
//!   receive every task);
//! * the same three phases on a peer in the same run: what a user writes
//!   instead — a `BTreeMap` ordered by due time plus a `HashMap` by key, behind
//!   a mutex (eager cancel, in-order expiry; the research note's B-tree peer);
//! * `Sync` on a real directory: single-task schedules from 1 and from 8
//!   producer threads (group commit), and batches of 1 000.

mod common;

use common::delays_ms;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kairos::{Config, Due, Durability, Engine, ManualClock, NewTask};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIX_TASKS: usize = 1_000_000;
const WALL_START_MS: u64 = 1_700_000_000_000;
const PAYLOAD: &[u8] = b"payload-64-bytes-payload-64-bytes-payload-64-bytes-payload-64-by";

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
            .schedule_after(k, Duration::from_millis(*d), PAYLOAD)
            .expect("schedule");
    }
}

/// Runs `phase` on a fresh in-memory engine per iteration (with every task
/// already scheduled if `prefill`) and returns the time spent in `phase` only.
fn time_phase(
    iters: u64,
    keys: &[Vec<u8>],
    delays: &[u64],
    prefill: bool,
    phase: impl Fn(&Engine, &ManualClock),
) -> Duration {
    let prepare = |engine: &Engine| {
        if prefill {
            schedule_all(engine, keys, delays);
        }
    };
    time_prepared(iters, prepare, phase)
}

/// Runs `prepare` (untimed), then `phase`, on a fresh in-memory engine per
/// iteration and returns the time spent in `phase` only.
fn time_prepared(
    iters: u64,
    prepare: impl Fn(&Engine),
    phase: impl Fn(&Engine, &ManualClock),
) -> Duration {
    (0..iters)
        .map(|_| {
            let clock = ManualClock::new(WALL_START_MS);
            let engine = memory_engine(&clock);
            prepare(&engine);
            let t = Instant::now();
            phase(&engine, &clock);
            t.elapsed()
        })
        .sum()
}

fn in_memory(c: &mut Criterion) {
    let keys = keys(MIX_TASKS);
    let delays = delays_ms(MIX_TASKS, 7);
    let mut g = c.benchmark_group("in_memory_1M");
    g.sample_size(10);
    g.throughput(Throughput::Elements(MIX_TASKS as u64));
    g.bench_function("schedule", |b| {
        b.iter_custom(|iters| {
            time_phase(iters, &keys, &delays, false, |engine, _| {
                schedule_all(engine, &keys, &delays)
            })
        })
    });
    g.bench_function("cancel", |b| {
        b.iter_custom(|iters| {
            time_phase(iters, &keys, &delays, true, |engine, _| {
                for k in &keys {
                    let _ = engine.cancel(k).expect("cancel");
                }
            })
        })
    });
    // `schedule` into an engine whose memory has grown once (the same 1 M
    // scheduled and cancelled, untimed): a long-running service's steady
    // state, without a fresh engine's first touch of every page.
    g.bench_function("schedule_into_grown", |b| {
        b.iter_custom(|iters| {
            let grow = |engine: &Engine| {
                schedule_all(engine, &keys, &delays);
                for k in &keys {
                    let _ = engine.cancel(k).expect("cancel");
                }
            };
            time_prepared(iters, grow, |engine, _| {
                schedule_all(engine, &keys, &delays)
            })
        })
    });
    // The same two phases through the batch calls, 1 000 tasks per call.
    g.bench_function("schedule_many_1000", |b| {
        b.iter_custom(|iters| {
            time_phase(iters, &keys, &delays, false, |engine, _| {
                for (ks, ds) in keys.chunks(1000).zip(delays.chunks(1000)) {
                    let batch: Vec<NewTask<'_>> = ks
                        .iter()
                        .zip(ds)
                        .map(|(k, d)| NewTask {
                            key: k,
                            due: Due::After(Duration::from_millis(*d)),
                            payload: PAYLOAD,
                        })
                        .collect();
                    engine.schedule_many(&batch).expect("schedule_many");
                }
                assert_eq!(engine.stats().pending, MIX_TASKS);
            })
        })
    });
    g.bench_function("cancel_many_1000", |b| {
        b.iter_custom(|iters| {
            time_phase(iters, &keys, &delays, true, |engine, _| {
                for ks in keys.chunks(1000) {
                    let batch: Vec<&[u8]> = ks.iter().map(Vec::as_slice).collect();
                    engine.cancel_many(&batch).expect("cancel_many");
                }
                // Every task was found and cancelled (one call, not per key).
                assert_eq!(engine.stats().pending, 0);
            })
        })
    });
    g.bench_function("expire", |b| {
        b.iter_custom(|iters| {
            time_phase(iters, &keys, &delays, true, |engine, clock| {
                let consumer = engine.consumer();
                clock.advance(Duration::from_secs(31 * 86_400));
                engine.run_until_idle();
                let mut received = 0;
                while consumer.try_recv().is_ok() {
                    received += 1;
                }
                assert_eq!(received, MIX_TASKS);
            })
        })
    });
    g.finish();
}

/// The peer: a B-tree by (due, seq) and a hash map by key, behind a mutex.
#[derive(Default)]
struct BTreeQueue {
    by_due: BTreeMap<(u64, u64), Vec<u8>>,
    by_key: HashMap<Vec<u8>, (u64, u64, Vec<u8>)>,
    seq: u64,
}

impl BTreeQueue {
    fn schedule(&mut self, key: &[u8], due_ms: u64, payload: &[u8]) -> bool {
        if self.by_key.contains_key(key) {
            return false;
        }
        self.seq += 1;
        self.by_due.insert((due_ms, self.seq), key.to_vec());
        self.by_key
            .insert(key.to_vec(), (due_ms, self.seq, payload.to_vec()));
        true
    }

    fn cancel(&mut self, key: &[u8]) -> bool {
        match self.by_key.remove(key) {
            Some((due, seq, _)) => self.by_due.remove(&(due, seq)).is_some(),
            None => false,
        }
    }

    /// Pops every task due at or before `now_ms`, in order.
    fn expire(&mut self, now_ms: u64, out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        while let Some(entry) = self.by_due.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let key = entry.remove();
            if let Some((_, _, payload)) = self.by_key.remove(&key) {
                out.push((key, payload));
            }
        }
    }
}

fn peer_fill(keys: &[Vec<u8>], delays: &[u64]) -> Mutex<BTreeQueue> {
    let q = Mutex::new(BTreeQueue::default());
    for (k, d) in keys.iter().zip(delays) {
        assert!(q.lock().schedule(k, WALL_START_MS + d, PAYLOAD));
    }
    q
}

fn peer_btree(c: &mut Criterion) {
    let keys = keys(MIX_TASKS);
    let delays = delays_ms(MIX_TASKS, 7);
    let mut g = c.benchmark_group("peer_btreemap_1M");
    g.sample_size(10);
    g.throughput(Throughput::Elements(MIX_TASKS as u64));
    g.bench_function("schedule", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let t = Instant::now();
                    let q = peer_fill(&keys, &delays);
                    let elapsed = t.elapsed();
                    drop(q);
                    elapsed
                })
                .sum()
        })
    });
    g.bench_function("cancel", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let q = peer_fill(&keys, &delays);
                    let t = Instant::now();
                    for k in &keys {
                        assert!(q.lock().cancel(k));
                    }
                    t.elapsed()
                })
                .sum()
        })
    });
    g.bench_function("expire", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let q = peer_fill(&keys, &delays);
                    let mut out = Vec::new();
                    let t = Instant::now();
                    q.lock().expire(WALL_START_MS + 31 * 86_400_000, &mut out);
                    let received = out.len();
                    drop(out);
                    let elapsed = t.elapsed();
                    assert_eq!(received, MIX_TASKS);
                    elapsed
                })
                .sum()
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

criterion_group!(benches, in_memory, peer_btree, sync_disk);
criterion_main!(benches);
