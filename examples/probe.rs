//! Hot-path probe for profiling: `cargo run --release --example probe -- schedule|cancel|expire|warm|many|holds|far-cancel|floor|every|recurring|sync|async N`
//! (`warm`: schedule, cancel all, then time scheduling them again into grown memory;
//! `many`: batches of 1 000 through `schedule_many` and `cancel_many`;
//! `holds`: every single `schedule` call timed, the longest ones printed — where the
//! engine's structures grow).
//! `PROBE_CLOCK=system` in the environment: the engine reads the system clocks, as a service's
//! does, instead of a manual clock (every mode but `expire` and those with their own setup).
//! Pair with `perf stat -e instructions` or `valgrind --tool=callgrind`.
use kairos::{Config, Engine, ManualClock};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("schedule", String::as_str);
    let n: usize = args.get(2).map_or(Ok(1_000_000), |s| s.parse())?;
    if what == "single" {
        let mode = args.get(3).map_or("buffered", String::as_str);
        return single_calls(n, mode);
    }
    if what == "every" {
        let every: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
        let mode = args.get(4).map_or("interval", String::as_str);
        return sync_every(n, every, mode);
    }
    if what == "far-cancel" {
        return far_cancel(n);
    }
    if what == "floor" {
        return fsync_floor(n);
    }
    if what == "recurring" {
        let how = args.get(3).map_or("joint", String::as_str);
        let mode = args.get(4).map_or("sync", String::as_str);
        return recurring(n, how, mode);
    }
    if what == "async" {
        let inflight: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
        let mode = args.get(4).map_or("sync", String::as_str);
        return async_inflight(n, inflight, mode);
    }
    if what == "sync" {
        let producers: usize = args.get(3).map_or(Ok(8), |s| s.parse())?;
        let mode = args.get(4).map_or("sync", String::as_str);
        return sync_producers(producers, n, mode);
    }
    let clock = ManualClock::new(1_700_000_000_000);
    let mut config = Config::default();
    config.pending_tasks_max = n + 1;
    // `PROBE_CLOCK=system`: the wall and monotonic clocks a service reads
    // (`SystemClock`) instead of the manual one, for the cost of reading them
    // (not with `expire`, which moves the manual clock).
    let engine = if std::env::var("PROBE_CLOCK").is_ok_and(|c| c == "system") && what != "expire" {
        Engine::in_memory(config, Arc::new(kairos::SystemClock::new()))?
    } else {
        Engine::in_memory(config, Arc::new(clock.clone()))?
    };
    let keys = keys(n);
    let payload = [7u8; 64];
    if what == "many" {
        return many(&engine, &keys, &payload);
    }
    if what == "holds" {
        return holds(&engine, &keys, &payload);
    }
    let rss_before = rss_bytes();
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        engine.schedule_after(k, delay(i), &payload)?;
    }
    let schedule = t.elapsed();
    let rss_per_task = rss_bytes().saturating_sub(rss_before) / n as u64;
    let t = Instant::now();
    match what {
        "cancel" => {
            for k in &keys {
                let _ = engine.cancel(k)?;
            }
        }
        "warm" => {
            // Schedule again into memory the first round already grew: the
            // engine's own work without the kernel's page faults.
            for k in &keys {
                let _ = engine.cancel(k)?;
            }
            let t = Instant::now();
            for (i, k) in keys.iter().enumerate() {
                engine.schedule_after(k, delay(i), &payload)?;
            }
            println!(
                "warm schedule {:.0} ns/op",
                t.elapsed().as_nanos() as f64 / n as f64
            );
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
        "schedule {:.0} ns/op; {what} {:.0} ns/op; RSS growth {rss_per_task} B/task (24-byte keys, 64-byte payloads)",
        schedule.as_nanos() as f64 / n as f64,
        second.as_nanos() as f64 / n as f64
    );
    Ok(())
}

/// `probe many N`: schedules the N tasks into the fresh engine in batches of
/// 1 000 (`schedule_many`), then cancels them in batches (`cancel_many`).
fn many(
    engine: &Engine,
    keys: &[Vec<u8>],
    payload: &[u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let n = keys.len();
    let delays: Vec<Duration> = (0..n).map(delay).collect();
    let t = Instant::now();
    for (ks, ds) in keys.chunks(1000).zip(delays.chunks(1000)) {
        let batch: Vec<kairos::NewTask<'_>> = ks
            .iter()
            .zip(ds)
            .map(|(k, d)| kairos::NewTask {
                key: k,
                due: kairos::Due::After(*d),
                payload,
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    let schedule = t.elapsed();
    let t = Instant::now();
    for ks in keys.chunks(1000) {
        let batch: Vec<&[u8]> = ks.iter().map(Vec::as_slice).collect();
        engine.cancel_many(&batch)?;
    }
    println!(
        "schedule_many {:.0} ns/op; cancel_many {:.0} ns/op (batches of 1 000)",
        schedule.as_nanos() as f64 / n as f64,
        t.elapsed().as_nanos() as f64 / n as f64
    );
    Ok(())
}

/// `probe holds N`: times each of N single `schedule` calls into the fresh
/// engine and prints the calls over 1 ms (call number, duration) and the
/// longest: the engine's lock is held throughout a call, so these are also
/// the longest waits a concurrent producer or the driver could see.
fn holds(
    engine: &Engine,
    keys: &[Vec<u8>],
    payload: &[u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut over_1ms = Vec::new();
    let mut longest = Duration::ZERO;
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        let delay = delay(i);
        let call = Instant::now();
        engine.schedule_after(k, delay, payload)?;
        let took = call.elapsed();
        longest = longest.max(took);
        if took > Duration::from_millis(1) {
            over_1ms.push((i, took));
        }
    }
    for (i, took) in &over_1ms {
        println!("call {i}: {:.1} ms", took.as_secs_f64() * 1e3);
    }
    println!(
        "{} calls in {:.2} s; {} over 1 ms; longest {:.1} ms",
        keys.len(),
        t.elapsed().as_secs_f64(),
        over_1ms.len(),
        longest.as_secs_f64() * 1e3
    );
    Ok(())
}

/// `probe far-cancel N`: schedules N tasks due 200–230 days ahead (beyond
/// the horizon) on a temporary directory (`Buffered`), checkpoints so that
/// they all sit in overflow files, then cancels them: single `cancel` calls
/// for the first half, `cancel_many` in batches of 1 000 for the rest;
/// prints ns per cancel of each.
fn far_cancel(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.durability = durability("buffered");
    config.pending_tasks_max = n + 1;
    let engine = Engine::open(dir.path(), config)?;
    let keys = keys(n);
    for (c, chunk) in keys.chunks(1000).enumerate() {
        let batch: Vec<kairos::NewTask<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(i, k)| kairos::NewTask {
                key: k,
                due: kairos::Due::After(Duration::from_secs(200 * 86_400) + delay(c * 1000 + i)),
                payload: &[],
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    engine.checkpoint()?;
    let far = engine.stats().far;
    let half = n / 2;
    let t = Instant::now();
    for k in &keys[..half] {
        let _ = engine.cancel(k)?;
    }
    let single = t.elapsed();
    let t = Instant::now();
    for chunk in keys[half..].chunks(1000) {
        let batch: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        engine.cancel_many(&batch)?;
    }
    let many = t.elapsed();
    println!(
        "{far} far tasks; cancel {:.0} ns/op; cancel_many {:.0} ns/op; pending after {}",
        single.as_nanos() as f64 / half as f64,
        many.as_nanos() as f64 / (n - half) as f64,
        engine.stats().pending
    );
    Ok(())
}

/// `probe single N [buffered|interval|sync]`: N single `schedule` calls,
/// then N single `cancel` calls, from one thread on a temporary directory
/// with the given durability; prints ns per call of each.
fn single_calls(n: usize, mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.durability = durability(mode);
    let engine = Engine::open(dir.path(), config)?;
    let keys = keys(n);
    let payload = [7u8; 64];
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        engine.schedule_after(k, delay(i), &payload)?;
    }
    let schedule = t.elapsed();
    let t = Instant::now();
    for k in &keys {
        let _ = engine.cancel(k)?;
    }
    println!(
        "{mode}: schedule {:.0} ns/op; cancel {:.0} ns/op",
        schedule.as_nanos() as f64 / n as f64,
        t.elapsed().as_nanos() as f64 / n as f64
    );
    Ok(())
}

/// `probe every N K [interval|buffered|sync]`: N single schedules on one
/// thread, with `Engine::sync` after every K-th (so every K-th call, and all
/// before it, survive a power loss as under `Sync`); prints schedules/s.
fn sync_every(n: usize, every: usize, mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    // `interval`: a second, so that the engine's own background syncs stay out of the way.
    config.durability = match mode {
        "interval" => kairos::Durability::Interval(Duration::from_secs(1)),
        other => durability(other),
    };
    let engine = Engine::open(dir.path(), config)?;
    let keys = keys(n);
    let payload = [7u8; 100];
    let every = every.max(1);
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        engine.schedule_after(k, Duration::from_secs(3600), &payload)?;
        if (i + 1) % every == 0 {
            engine.sync()?;
        }
    }
    let elapsed = t.elapsed();
    engine.shutdown()?;
    println!(
        "{mode}, sync every {every}: {:.0} schedules/s",
        n as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// `probe recurring N [joint|split] [sync|interval|buffered]`: one recurring
/// task run N times on a temporary directory (a manual clock moved a second
/// per run): each run's delivery is finished and the next run scheduled by
/// `ack_and_schedule` (`joint`) or by `ack` then `schedule` (`split`); only
/// those calls are timed. Prints runs/s.
fn recurring(n: usize, how: &str, mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.durability = durability(mode);
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::open_with(
        dir.path(),
        config,
        Arc::new(kairos::kairos_wal::FsStorage),
        Arc::new(clock.clone()),
    )?;
    let consumer = engine.consumer();
    let second = Duration::from_secs(1);
    engine.schedule_after(b"report:hourly", second, &[7u8; 100])?;
    let mut timed = Duration::ZERO;
    for _ in 0..n {
        clock.advance(second);
        engine.run_until_idle();
        let run = consumer.try_recv()?;
        let t = Instant::now();
        if how == "split" {
            consumer.ack(&run)?;
            engine.schedule_after(run.key(), second, run.payload())?;
        } else {
            consumer.ack_and_schedule(&run, kairos::Due::After(second), run.payload())?;
        }
        timed += t.elapsed();
    }
    engine.shutdown()?;
    println!(
        "{mode}, {how}: {:.0} runs/s ({:.1} µs per run's calls)",
        n as f64 / timed.as_secs_f64(),
        timed.as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}

/// `probe sync N P [sync|interval|buffered]`: P threads each schedule N single
/// tasks under the given durability (default `Sync`) on a temporary directory;
/// prints tasks/s.
fn sync_producers(
    producers: usize,
    per_producer: usize,
    mode: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.durability = durability(mode);
    // `sync-noproof`: `Sync` acknowledging after the data's fdatasync, before a mark proves it.
    config.proof_before_ack = mode != "sync-noproof";
    let engine = Engine::open(dir.path(), config)?;
    let t = Instant::now();
    std::thread::scope(|s| {
        for p in 0..producers {
            let engine = &engine;
            s.spawn(move || {
                for i in 0..per_producer {
                    let key = format!("p{p}:order:{i:012}");
                    if let Err(e) = engine.schedule_after(
                        key.as_bytes(),
                        Duration::from_secs(3600),
                        &[0u8; 100],
                    ) {
                        eprintln!("schedule: {e}");
                        return;
                    }
                }
            });
        }
    });
    let elapsed = t.elapsed();
    engine.shutdown()?;
    let total = producers * per_producer;
    println!(
        "{mode}: {producers} producers x {per_producer}: {:.0} tasks/s",
        total as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// `async N P [MODE]`: ONE thread schedules N tasks through `schedule_async`, keeping P
/// futures in flight (a minimal executor: poll every pending future when woken, top up to P),
/// on a fresh temporary directory — what an async service gets from one executor thread.
/// Compare `sync N 1` (one thread, blocking calls) and `sync N/8 8`.
fn async_inflight(n: usize, inflight: usize, mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    struct Flag(AtomicBool, std::thread::Thread);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
            self.1.unpark();
        }
    }
    type Call<'a> =
        Pin<Box<dyn Future<Output = Result<kairos::TaskId, kairos::ScheduleError>> + 'a>>;
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.durability = durability(mode);
    let engine = Engine::open(dir.path(), config)?;
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("a:order:{i:012}").into_bytes())
        .collect();
    let payload = [0u8; 100];
    let flag = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let mut pending: Vec<Call<'_>> = Vec::with_capacity(inflight);
    let (mut next, mut done) = (0, 0);
    let t = Instant::now();
    while done < n {
        while pending.len() < inflight && next < n {
            let due = kairos::Due::After(Duration::from_secs(3600));
            pending.push(Box::pin(engine.schedule_async(&keys[next], due, &payload)));
            next += 1;
        }
        flag.0.store(false, Ordering::SeqCst);
        let mut i = 0;
        while i < pending.len() {
            match pending[i].as_mut().poll(&mut cx) {
                Poll::Ready(result) => {
                    result?;
                    drop(pending.swap_remove(i));
                    done += 1;
                }
                Poll::Pending => i += 1,
            }
        }
        let more = pending.len() < inflight && next < n;
        if !more && done < n && !flag.0.load(Ordering::SeqCst) {
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }
    let elapsed = t.elapsed();
    drop(pending);
    engine.shutdown()?;
    println!(
        "{mode}: 1 thread, {inflight} schedule_async in flight, {n} tasks: {:.0} tasks/s",
        n as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// The floor a durable single call sits on, on this disk: N appends of a 160-byte record, each
/// followed by an fdatasync (what SQLite `synchronous=FULL` does per commit), then N appends
/// each followed by a 32-byte rewrite at the file's head and a second fdatasync (what a lone
/// `Sync` call with `proof_before_ack` costs the log), in a fresh file.
fn fsync_floor(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let record = [5u8; 160];
    // Appending extends the file, so each fdatasync also commits the new size
    // (on ext4 a journal commit); into a file whose bytes were written as
    // zeros and synced beforehand it only writes the data.
    for (label, proof, prezeroed) in [
        ("1 fdatasync", false, false),
        ("2 fdatasyncs", true, false),
        ("1 fdatasync, file pre-zeroed", false, true),
        ("2 fdatasyncs, file pre-zeroed", true, true),
    ] {
        let file = std::fs::File::create(dir.path().join(format!("floor-{proof}-{prezeroed}")))?;
        let zeroed = if prezeroed {
            4096 + n * record.len()
        } else {
            4096
        };
        file.write_all_at(&vec![0u8; zeroed], 0)?;
        file.sync_all()?;
        let mut offset = 4096u64;
        let t = Instant::now();
        for i in 0..n {
            file.write_all_at(&record, offset)?;
            offset += record.len() as u64;
            file.sync_data()?;
            if proof {
                file.write_all_at(&(i as u64).to_le_bytes().repeat(4), 64)?;
                file.sync_data()?;
            }
        }
        let per_op = t.elapsed() / n as u32;
        println!(
            "floor, {label} per append: {:.0} appends/s ({:.1} us each)",
            1.0 / per_op.as_secs_f64(),
            per_op.as_secs_f64() * 1e6
        );
    }
    Ok(())
}

/// N 24-byte keys, `order:000000000042:timeout` style.
fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("order:{i:012}:timeout").into_bytes())
        .collect()
}

/// `sync`, `interval` (100 ms) or, for anything else, `buffered`.
fn durability(mode: &str) -> kairos::Durability {
    match mode {
        "sync" | "sync-noproof" => kairos::Durability::Sync,
        "interval" => kairos::Durability::Interval(Duration::from_millis(100)),
        _ => kairos::Durability::Buffered,
    }
}

/// Resident set size from /proc/self/status (0 where unavailable).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The delay of task `i`: spread over 1 ms – 30 days by a multiplicative hash.
fn delay(i: usize) -> Duration {
    Duration::from_millis((i as u64).wrapping_mul(2_654_435_761) % (30 * 86_400_000) + 1)
}
