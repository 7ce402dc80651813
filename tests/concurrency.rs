//! Cancel racing delivery: eight threads schedule and cancel while another thread moves a
//! manual clock and consumers receive. For every task exactly one of "cancel returned
//! `Cancelled`" and "a consumer received it" happens — never both, never neither — and a
//! task is received at most once, never before its due time.

mod common;

use common::{config, scaled, SimHarness, SplitMix, Stop, TestResult};
use kairos::{CancelOutcome, Delivery, Due, Durability, RecvError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const WORKERS: usize = 8;
const CONSUMERS: usize = 2;

/// What a worker saw for one of its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Never cancelled.
    NotAsked,
    Cancel(CancelOutcome),
}

/// The defaults' background work on (`Config::payload_prefetch`, background checkpoints and
/// far-task moves) with a tiny payload window and horizon, so that most tasks of
/// [`run_race_in`] with a due spread go far and come back while the race runs.
fn background_config(durability: Durability) -> kairos::Config {
    let mut c = config(durability);
    c.checkpoint_log_bytes = Some(2_048);
    c.checkpoint_interval = Some(Duration::from_millis(2));
    c.payload_prefetch = true;
    c.payload_window = Some(Duration::from_millis(2));
    c.horizon = Some(Duration::from_millis(20));
    c.resident_window = None;
    c.relocate_far_tasks = Some(8);
    c
}

fn run_race(seed: u64, durability: Durability, per_worker: usize) -> TestResult {
    run_race_in(seed, config(durability), 4, per_worker)
}

/// `run_race` with `config`, each task due 0..`spread_ms` ms after it is scheduled.
fn run_race_in(seed: u64, config: kairos::Config, spread_ms: u64, per_worker: usize) -> TestResult {
    let durability = config.durability;
    let mut h = SimHarness::new(seed, config)?;
    let done_scheduling = AtomicBool::new(false);
    let done_all = AtomicBool::new(false);
    let answers: Mutex<BTreeMap<Vec<u8>, Answer>> = Mutex::new(BTreeMap::new());
    let received: Mutex<Vec<(Delivery, u64)>> = Mutex::new(Vec::new());
    let engine = h.engine();
    let clock = &h.clock;

    std::thread::scope(|s| -> TestResult {
        let mut workers = Vec::new();
        for w in 0..WORKERS {
            let answers = &answers;
            workers.push(s.spawn(move || -> TestResult {
                let mut rng = SplitMix(seed ^ ((w as u64 + 1) * 0x9E37));
                let mut mine: Vec<Vec<u8>> = Vec::new();
                let mut local = BTreeMap::new();
                for i in 0..per_worker {
                    // Many tasks share each due instant: the next few milliseconds.
                    let due_ms = clock.wall_ms() + rng.range(0, spread_ms);
                    let k = format!("w{w}-{i}").into_bytes();
                    engine.schedule(&k, Due::At(kairos::clock::ms_to_system_time(due_ms)), b"x")?;
                    local.insert(k.clone(), Answer::NotAsked);
                    mine.push(k);
                    if rng.chance(60) {
                        let pick = mine.swap_remove(rng.next_u64() as usize % mine.len());
                        let outcome = engine.cancel(&pick)?;
                        local.insert(pick, Answer::Cancel(outcome));
                    }
                }
                answers.lock().map_err(|_| "poisoned")?.extend(local);
                Ok(())
            }));
        }
        // The clock: a millisecond at a time while the workers run.
        let ticker = s.spawn(|| {
            while !done_scheduling.load(Ordering::Acquire) {
                clock.advance(Duration::from_millis(1));
                engine.run_until_idle();
            }
        });
        let mut consumers = Vec::new();
        for _ in 0..CONSUMERS {
            let (received, done_all) = (&received, &done_all);
            consumers.push(s.spawn(move || -> TestResult {
                let consumer = engine.consumer();
                let mut local = Vec::new();
                loop {
                    match consumer.recv_timeout(Duration::from_millis(5)) {
                        Ok(d) => {
                            // Ack every other delivery: a cancel after the ack says NotFound.
                            if d.task_id().0.is_multiple_of(2) {
                                consumer.ack(&d)?;
                            }
                            local.push((d, clock.wall_ms()));
                        }
                        Err(RecvError::Timeout) if done_all.load(Ordering::Acquire) => {
                            while let Ok(d) = consumer.try_recv() {
                                local.push((d, clock.wall_ms()));
                            }
                            break;
                        }
                        Err(RecvError::Timeout) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                received.lock().map_err(|_| "poisoned")?.extend(local);
                Ok(())
            }));
        }
        for w in workers {
            w.join().map_err(|_| "worker panicked")??;
        }
        done_scheduling.store(true, Ordering::Release);
        ticker.join().map_err(|_| "ticker panicked")?;
        // Past every due time; everything not cancelled is now in the ready queue.
        clock.advance(Duration::from_millis(spread_ms + 10));
        engine.run_until_idle();
        done_all.store(true, Ordering::Release);
        for c in consumers {
            c.join().map_err(|_| "consumer panicked")??;
        }
        Ok(())
    })?;

    let answers = answers.into_inner().map_err(|_| "poisoned")?;
    let received = received.into_inner().map_err(|_| "poisoned")?;
    assert_eq!(answers.len(), WORKERS * per_worker);
    let mut times: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for (d, seen_at) in &received {
        assert!(d.fired_ms() >= d.due_ms(), "{d:?} fired early");
        assert!(*seen_at >= d.due_ms());
        assert_eq!(d.attempt(), 1);
        *times.entry(d.key().to_vec()).or_default() += 1;
    }
    let (mut cancelled, mut raced) = (0, 0);
    for (k, answer) in &answers {
        let n = times.get(k).copied().unwrap_or(0);
        let name = String::from_utf8_lossy(k);
        match answer {
            Answer::Cancel(CancelOutcome::Cancelled { .. }) => {
                assert_eq!(n, 0, "{name}: cancelled and delivered");
                cancelled += 1;
            }
            Answer::Cancel(CancelOutcome::AlreadyDelivered { .. }) => {
                assert_eq!(n, 1, "{name}: AlreadyDelivered but received {n} times");
                raced += 1;
            }
            Answer::Cancel(CancelOutcome::NotFound) => {
                // Only a task that was delivered and acked is gone.
                assert_eq!(n, 1, "{name}: NotFound but received {n} times");
                raced += 1;
            }
            Answer::Cancel(other) => return Err(format!("{name}: {other:?}").into()),
            Answer::NotAsked => assert_eq!(n, 1, "{name}: received {n} times"),
        }
    }
    assert_eq!(
        times.len() + cancelled,
        answers.len(),
        "unknown keys received"
    );
    assert_eq!(h.engine().stats().scheduled, 0);
    let stats = h.engine().stats();
    eprintln!(
        "{durability:?}: {} tasks, {cancelled} cancelled, {raced} lost the race to delivery; \
         far tasks promoted {}, payloads read back {}",
        answers.len(),
        stats.far_promoted,
        stats.payloads_read_back
    );

    // The same answers hold after a restart: cancelled tasks stay cancelled, delivered
    // unacked ones come again — unless a cancel found them held by a consumer
    // (`AlreadyDelivered`: no redelivery follows) — nothing else. (Only `Sync` promises this
    // across a power cut.)
    h.restart(if durability == Durability::Sync {
        Stop::PowerCut
    } else {
        Stop::ProcessCrash
    })?;
    let unacked: BTreeMap<Vec<u8>, u64> = received
        .iter()
        .filter(|(d, _)| !d.task_id().0.is_multiple_of(2))
        .filter(|(d, _)| {
            !matches!(
                answers.get(d.key()),
                Some(Answer::Cancel(CancelOutcome::AlreadyDelivered { .. }))
            )
        })
        .map(|(d, _)| (d.key().to_vec(), d.due_ms()))
        .collect();
    assert_eq!(h.engine().recovery().pending, unacked.len());
    let again = common::drain(h.engine())?;
    let again_keys: BTreeMap<Vec<u8>, u64> = again
        .iter()
        .map(|d| (d.key().to_vec(), d.due_ms()))
        .collect();
    assert_eq!(again_keys, unacked);
    assert!(again.iter().all(|d| d.attempt() == 2));
    // Nothing cancelled or acked comes back later either.
    assert!(h.advance(Duration::from_secs(3_600))?.is_empty());
    h.stop(Stop::Clean)
}

#[test]
fn cancel_or_deliver_exactly_once_under_concurrency_sync() -> TestResult {
    run_race(61, Durability::Sync, scaled(300, 20_000))
}

#[test]
fn cancel_or_deliver_exactly_once_under_concurrency_buffered() -> TestResult {
    run_race(62, Durability::Buffered, scaled(500, 40_000))
}

/// The race with the background work of the defaults on: tasks due up to 300 ms out go to
/// overflow files (checkpoints and moves between them, every few KiB of log), are prefetched
/// and promoted back while workers cancel them and consumers receive.
#[test]
fn cancel_or_deliver_exactly_once_with_background_work_sync() -> TestResult {
    run_race_in(
        64,
        background_config(Durability::Sync),
        300,
        scaled(300, 20_000),
    )
}

#[test]
fn cancel_or_deliver_exactly_once_with_background_work_buffered() -> TestResult {
    run_race_in(
        65,
        background_config(Durability::Buffered),
        300,
        scaled(500, 40_000),
    )
}

/// Consumers blocked in `recv` wake with `Closed` when the engine is shut down or dropped,
/// and a consumer handle outliving its engine neither hangs nor panics.
#[test]
fn blocked_consumers_wake_when_the_engine_stops() -> TestResult {
    for shutdown in [true, false] {
        let mut h = SimHarness::new(63, config(Durability::Sync))?;
        let consumers: Vec<_> = (0..3).map(|_| h.engine().consumer()).collect();
        let answers = std::thread::scope(|s| -> TestResult<Vec<Result<Delivery, RecvError>>> {
            let waiting: Vec<_> = consumers
                .iter()
                .map(|c| s.spawn(move || c.recv()))
                .collect();
            if shutdown {
                h.engine().shutdown()?;
            } else {
                h.stop(Stop::ProcessCrash)?;
            }
            waiting
                .into_iter()
                .map(|w| w.join().map_err(|_| "consumer panicked".into()))
                .collect()
        })?;
        for a in answers {
            assert_eq!(
                a.map(|d| d.task_id()),
                Err(RecvError::Closed),
                "shutdown: {shutdown}"
            );
        }
        for c in &consumers {
            assert_eq!(c.try_recv().map(|d| d.task_id()), Err(RecvError::Closed));
            assert_eq!(
                c.recv_timeout(Duration::from_millis(1))
                    .map(|d| d.task_id()),
                Err(RecvError::Closed)
            );
        }
    }
    Ok(())
}
