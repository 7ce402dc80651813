//! What the idle high-water mark (`SYNCED`, `WalOptions::synced_mark_delay`) costs a producer
//! that pauses between appends: one producer appends 100-byte records under `Sync` on a real
//! disk, sleeping `gap` between appends, with the mark off and at its default (10 ms), in
//! alternating runs. Prints the append latency (median, p99) and the appends per second.
//!
//! ```sh
//! cargo run --release -p kairos-wal --example idle_mark_cost -- [N] [DIR]
//! ```
//!
//! `N` appends per run with a gap (default 200; ten times as many without a gap); `DIR` a
//! directory on the disk to measure (default: the system's temporary directory). Count the
//! syncs with `strace -f -c -e trace=fdatasync,fsync,rename`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_wal::{Durability, FsStorage, Record, Wal, WalOptions, SYNCED_MARK_DELAY_DEFAULT};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Appends `n` records, `gap` apart; returns (median µs, p99 µs, appends per second).
fn run(parent: &Path, gap: Duration, delay: Option<Duration>, n: usize) -> Result<(f64, f64, f64)> {
    let tmp = tempfile::tempdir_in(parent)?;
    let options = WalOptions {
        durability: Durability::Sync,
        synced_mark_delay: delay,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open(
        Arc::new(FsStorage),
        &tmp.path().join("wal"),
        options,
        &mut |_| Ok(()),
    )?;
    let body = [7u8; 100];
    let mut latencies_us = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        wal.append(&[Record {
            record_type: 1,
            body: &body,
        }])?
        .wait()?;
        latencies_us.push(t.elapsed().as_secs_f64() * 1e6);
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    wal.close()?;
    latencies_us.sort_by(f64::total_cmp);
    Ok((latencies_us[n / 2], latencies_us[n * 99 / 100], rate))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let parent = args.next().map_or_else(std::env::temp_dir, Into::into);
    println!("gap_ms round mark  n      p50_us   p99_us   appends_per_s");
    for gap_ms in [0u64, 5, 12, 20, 50] {
        let gap = Duration::from_millis(gap_ms);
        let n = if gap_ms == 0 { n * 10 } else { n };
        for round in 0..3 {
            for delay in [None, Some(SYNCED_MARK_DELAY_DEFAULT)] {
                let (p50, p99, rate) = run(&parent, gap, delay, n.max(1))?;
                println!(
                    "{gap_ms:>6} {round:>5} {:<5} {n:<6} {p50:>7.0} {p99:>8.0} {rate:>10.0}",
                    if delay.is_some() { "on" } else { "off" }
                );
            }
        }
    }
    Ok(())
}
