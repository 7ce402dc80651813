//! Hot-path probe for profiling: `cargo run --release --example probe -- schedule|cancel|expire N`.
//! Pair with `perf stat -e instructions` or `valgrind --tool=callgrind`.
use kairos::{Config, Engine, ManualClock};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("schedule", String::as_str);
    let n: usize = args.get(2).map_or(Ok(1_000_000), |s| s.parse())?;
    let clock = ManualClock::new(1_700_000_000_000);
    let mut config = Config::default();
    config.pending_tasks_max = n + 1;
    let engine = Engine::in_memory(config, Arc::new(clock.clone()))?;
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("order:{i:012}:timeout").into_bytes())
        .collect();
    let payload = [7u8; 64];
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        let delay =
            Duration::from_millis((i as u64).wrapping_mul(2_654_435_761) % (30 * 86_400_000) + 1);
        engine.schedule_after(k, delay, &payload)?;
    }
    let schedule = t.elapsed();
    let t = Instant::now();
    match what {
        "cancel" => {
            for k in &keys {
                engine.cancel(k)?;
            }
        }
        "expire" => {
            let consumer = engine.consumer();
            clock.advance(Duration::from_secs(31 * 86_400));
            engine.run_until_idle();
            let mut got = 0;
            while consumer.try_recv().is_ok() {
                got += 1;
            }
            assert_eq!(got, n);
        }
        _ => {}
    }
    let second = t.elapsed();
    println!(
        "schedule {:.0} ns/op; {what} {:.0} ns/op",
        schedule.as_nanos() as f64 / n as f64,
        second.as_nanos() as f64 / n as f64
    );
    Ok(())
}
