//! The async calls on the runtime most embedders use: tokio's multi-threaded scheduler (a
//! dev-dependency only; the engine has no runtime dependency). Producers schedule with
//! `schedule_async`, consumers take tasks with `recv_async` and settle them with `ack_async`,
//! `nack_async` or `ack_and_schedule_async`, on a real data directory under `Sync`; a manual
//! clock decides when tasks fall due. Then every task ended exactly as the model says, and a
//! reopen finds nothing left to deliver.

mod common;

use common::{config, open_fs, wait_until, TestResult, START_MS};
use kairos::{AckScheduleOutcome, Due, Durability, Engine, ManualClock, NackOutcome, RecvError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PRODUCERS: usize = 6;
const PER_PRODUCER: usize = 40;
const CONSUMERS: usize = 3;

/// What consumers did with each key, in order: `a` ack, `n` nack, `r` ack_and_schedule.
type Log = Arc<Mutex<BTreeMap<String, String>>>;

/// Settles a delivery by its key's number: a third acked, a third nacked once (then acked),
/// a third acked with one more run scheduled under the same key (then acked).
async fn settle(engine: &Engine, log: &Log, d: kairos::Delivery) -> Result<(), String> {
    let key = String::from_utf8_lossy(d.key()).into_owned();
    let n: usize = key
        .rsplit(':')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or("bad key")?;
    let first = d.attempt() == 1 && !log.lock().map_err(|e| e.to_string())?.contains_key(&key);
    let step = match (n % 3, first) {
        (1, true) => {
            let outcome = engine
                .nack_async(&d, Some(Duration::from_millis(5)), "try again")
                .await
                .map_err(|e| e.to_string())?;
            if !matches!(outcome, NackOutcome::Retry { .. }) {
                return Err(format!("{key}: {outcome:?}"));
            }
            'n'
        }
        (2, true) => {
            let next = engine
                .ack_and_schedule_async(&d, Due::After(Duration::from_millis(5)), b"again")
                .await
                .map_err(|e| e.to_string())?;
            if !matches!(next, AckScheduleOutcome::Scheduled(_)) {
                return Err(format!("{key}: {next:?}"));
            }
            'r'
        }
        _ => {
            engine.ack_async(&d).await.map_err(|e| e.to_string())?;
            'a'
        }
    };
    log.lock()
        .map_err(|e| e.to_string())?
        .entry(key)
        .or_default()
        .push(step);
    Ok(())
}

#[test]
fn producers_and_consumers_on_a_tokio_runtime() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let engine = Arc::new(open_fs(dir.path(), config(Durability::Sync), &clock)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;

    // Producers: each schedules its keys, 1–10 ms ahead, awaiting each schedule.
    runtime.block_on(async {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let engine = Arc::clone(&engine);
                tokio::spawn(async move {
                    for i in 0..PER_PRODUCER {
                        let key = format!("p{p}:order:{}", p * PER_PRODUCER + i);
                        let due = Due::After(Duration::from_millis(1 + (i % 10) as u64));
                        engine
                            .schedule_async(key.as_bytes(), due, b"first")
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        for producer in producers {
            producer.await.map_err(|e| e.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    let total = PRODUCERS * PER_PRODUCER;
    assert_eq!(engine.stats().pending, total);

    // Consumers: receive until the engine shuts down, settling each delivery.
    let log: Log = Arc::default();
    // Deliveries received so far (each is logged once settled).
    let received = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let engine = Arc::clone(&engine);
            let log = Arc::clone(&log);
            let received = Arc::clone(&received);
            runtime.spawn(async move {
                let consumer = engine.consumer();
                loop {
                    match consumer.recv_async().await {
                        Ok(d) => {
                            received.fetch_add(1, Ordering::SeqCst);
                            settle(&engine, &log, d).await?;
                        }
                        Err(RecvError::Closed) => return Ok::<(), String>(()),
                        Err(e) => return Err(e.to_string()),
                    }
                }
            })
        })
        .collect();

    // Everything falls due; the nacked ones are retried and the rescheduled ones run again
    // 5 ms later: advance until every key has its two steps or its one ack.
    let logged = |log: &Log| -> (usize, usize) {
        let log = log
            .lock()
            .map_or_else(|e| e.into_inner().clone(), |l| l.clone());
        let steps = log.values().map(String::len).sum();
        (steps, log.values().filter(|s| s.ends_with('a')).count())
    };
    let settled = |log: &Log| logged(log).1;
    for _ in 0..3 {
        clock.advance(Duration::from_millis(10));
        engine.run_until_idle();
        wait_until("consumers settle and log what is ready", || {
            let stats = engine.stats();
            stats.ready == 0
                && stats.in_flight == 0
                && logged(&log).0 == received.load(Ordering::SeqCst)
        })?;
    }
    assert_eq!(settled(&log), total);
    engine.shutdown()?;
    for consumer in consumers {
        runtime.block_on(consumer)??;
    }

    let log = log.lock().map_err(|e| e.to_string())?.clone();
    assert_eq!(log.len(), total);
    for (key, steps) in &log {
        let n: usize = key
            .rsplit(':')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or("key")?;
        let expected = match n % 3 {
            1 => "na",
            2 => "ra",
            _ => "a",
        };
        assert_eq!(steps, expected, "{key}");
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.acks, stats.nacks, stats.tasks_scheduled),
        (
            total as u64 + (total / 3) as u64,
            (total / 3) as u64,
            total as u64 + (total / 3) as u64
        )
    );
    drop(engine);

    // A reopen: nothing pending, nothing in flight, nothing redelivered.
    let engine = open_fs(dir.path(), config(Durability::Sync), &clock)?;
    let recovery = engine.recovery();
    assert_eq!((recovery.pending, recovery.redelivered), (0, 0));
    engine.shutdown()?;
    Ok(())
}
