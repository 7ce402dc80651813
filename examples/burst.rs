//! Firing on time after a burst of tasks left memory: `cargo run --release
//! --no-default-features --example burst -- N FROM_S TO_S [WINDOW_S|off]`.
//!
//! Opens an engine on a temporary directory (`Durability::Buffered`, real
//! clock, `Config::resident_window` = WINDOW_S seconds, default the
//! library's), schedules N tasks with 200-byte payloads due evenly between
//! FROM_S and TO_S seconds from now, takes a checkpoint (which moves every
//! task due beyond the window out of the wheel: a far entry, key and payload
//! on disk), then receives and acks them all on one consumer thread. Prints
//! how many were far after the checkpoint, how many were promoted back, and
//! the lateness of the hand-out (`Delivery::lateness`: fired − due) and of
//! the receipt (received − due), and the time of each `ack` call, p50 / p99
//! / p99.9 / max in ms, with the longest holds of the engine's lock by the
//! promotion and by checkpoints (`Stats::promotion_hold_max`,
//! `Stats::checkpoint_hold_max`). Not a test: it runs on the wall clock for
//! TO_S seconds.
use kairos::{Config, Due, Durability, Engine, NewTask};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(Ok(100_000), |s| s.parse())?;
    if n == 0 {
        return Err("N must be at least 1".into());
    }
    let from_s: u64 = args.get(2).map_or(Ok(70), |s| s.parse())?;
    let to_s: u64 = args.get(3).map_or(Ok(130), |s| s.parse())?;
    let mut config = Config::default();
    config.durability = Durability::Buffered;
    config.pending_tasks_max = config.pending_tasks_max.max(n + 1);
    match args.get(4).map(String::as_str) {
        None => {}
        Some("off") => config.resident_window = None,
        Some(s) => config.resident_window = Some(Duration::from_secs(s.parse()?)),
    }
    let dir = tempfile::tempdir()?;
    let engine = Engine::open(dir.path(), config)?;
    let payload = [7u8; 200];
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("burst:{i:012}:timeout").into_bytes())
        .collect();
    let span_ms = (to_s.saturating_sub(from_s) * 1000).max(1);
    for (c, ks) in keys.chunks(1000).enumerate() {
        let batch: Vec<NewTask<'_>> = ks
            .iter()
            .enumerate()
            .map(|(j, k)| {
                let i = (c * 1000 + j) as u64;
                NewTask {
                    key: k,
                    due: Due::After(Duration::from_millis(
                        from_s * 1000 + i * span_ms / n as u64,
                    )),
                    payload: &payload,
                }
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    engine.checkpoint()?;
    let far = engine.stats().far;
    let consumer = engine.consumer();
    let mut fired = Vec::with_capacity(n);
    let mut received = Vec::with_capacity(n);
    let mut acks = Vec::with_capacity(n);
    while fired.len() < n {
        let d = consumer.recv_timeout(Duration::from_secs(to_s + 60))?;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
        fired.push(d.lateness().as_secs_f64() * 1e3);
        received.push(now_ms.saturating_sub(d.due_ms()) as f64);
        let t0 = std::time::Instant::now();
        consumer.ack(&d)?;
        acks.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let stats = engine.stats();
    println!(
        "{n} tasks due in {from_s}..{to_s} s, window {:?}: {far} far after the checkpoint, \
         {} promoted, {} payloads read back",
        engine_window(&args),
        stats.far_promoted,
        stats.payloads_read_back
    );
    println!(
        "longest hold of the engine's lock: promotion {:.1} ms, checkpoint {:.1} ms",
        stats.promotion_hold_max.as_secs_f64() * 1e3,
        stats.checkpoint_hold_max.as_secs_f64() * 1e3
    );
    for (what, v) in [
        ("fired lateness", &mut fired),
        ("received lateness", &mut received),
        ("ack call", &mut acks),
    ] {
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
        println!(
            "{what} ms: p50 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1}",
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0)
        );
    }
    engine.shutdown()?;
    Ok(())
}

fn engine_window(args: &[String]) -> String {
    args.get(4).cloned().unwrap_or_else(|| "default".into())
}
