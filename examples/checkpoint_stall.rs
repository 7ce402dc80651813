//! How long a producer waits while a checkpoint moves tasks out of memory:
//! `cargo run --release --no-default-features --example checkpoint_stall -- [N] [ROUNDS]`.
//!
//! Opens an engine on a temporary directory (`Durability::Buffered`, so
//! that the log's syncs do not blur the engine's lock; no background
//! checkpoints), schedules N tasks (default 1 000 000) with 200-byte
//! payloads due in two to three hours — beyond the payload window and the
//! resident window, so a checkpoint writes them all to an overflow file and
//! takes them out of the wheel — then, while one thread schedules more such
//! tasks one call at a time, takes a checkpoint. Prints, per round (default
//! 3, each on a new engine), the checkpoint's time, the part of it spent
//! holding the engine's lock, its longest single hold
//! (`CheckpointReport::longest_hold`), and the producer's calls made during
//! the checkpoint with their latency p50 / p99 / p99.9 / max in µs. Not a
//! test: it runs on the wall clock.
use kairos::{Config, Due, Durability, Engine, NewTask};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(Ok(1_000_000), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    for round in 0..rounds {
        run(round, n)?;
    }
    Ok(())
}

fn run(round: usize, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    config.durability = Durability::Buffered;
    config.pending_tasks_max = config.pending_tasks_max.max(4 * n + 1_000_000);
    config.checkpoint_interval = None;
    config.checkpoint_log_bytes = None;
    let dir = tempfile::tempdir()?;
    let engine = Engine::open(dir.path(), config)?;
    let payload = [7u8; 200];
    let due = |i: usize| Due::After(Duration::from_secs(7_200) + Duration::from_millis(i as u64));
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("stall:{i:012}:timeout").into_bytes())
        .collect();
    for (c, ks) in keys.chunks(1000).enumerate() {
        let batch: Vec<NewTask<'_>> = ks
            .iter()
            .enumerate()
            .map(|(j, k)| NewTask {
                key: k,
                due: due(c * 1000 + j),
                payload: &payload,
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    drop(keys);
    let stop = AtomicBool::new(false);
    let checkpointing = AtomicBool::new(false);
    let (report, mut latencies_us) = std::thread::scope(|s| {
        let producer = s.spawn(|| -> Result<Vec<f64>, kairos::ScheduleError> {
            let mut latencies_us = Vec::new();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("more:{i:012}:timeout");
                let t = Instant::now();
                engine.schedule(key.as_bytes(), due(n + i), &payload)?;
                let elapsed = t.elapsed();
                if checkpointing.load(Ordering::Relaxed) {
                    latencies_us.push(elapsed.as_secs_f64() * 1e6);
                }
                i += 1;
            }
            Ok(latencies_us)
        });
        std::thread::sleep(Duration::from_millis(200));
        checkpointing.store(true, Ordering::Relaxed);
        let t = Instant::now();
        let report = engine.checkpoint().map(|r| (r, t.elapsed()));
        checkpointing.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        let latencies = producer.join();
        (report, latencies)
    });
    let (report, took) = report?;
    let mut latencies_us = match latencies_us.as_mut() {
        Ok(Ok(v)) => std::mem::take(v),
        Ok(Err(e)) => return Err(format!("producer: {e}").into()),
        Err(_) => return Err("the producer panicked".into()),
    };
    latencies_us.sort_by(f64::total_cmp);
    let q = |p: f64| {
        latencies_us
            .get(((latencies_us.len().saturating_sub(1)) as f64 * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "round {round}: {n} tasks + producer; checkpoint {:.0} ms, {:.0} ms holding the lock, longest hold {:.1} ms; {} producer calls during it: p50 {:.1} us, p99 {:.1} us, p99.9 {:.0} us, max {:.0} us; far {}",
        took.as_secs_f64() * 1e3,
        report.locked.as_secs_f64() * 1e3,
        report.longest_hold.as_secs_f64() * 1e3,
        latencies_us.len(),
        q(0.5),
        q(0.99),
        q(0.999),
        q(1.0),
        engine.stats().far
    );
    engine.shutdown()?;
    Ok(())
}
