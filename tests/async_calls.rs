//! The async forms of the durable calls (`schedule_async`, `schedule_many_async`,
//! `cancel_async`, `cancel_many_async`, `ack_async`, `ack_many_async`, and the dead-letter calls
//! `requeue_dead_letter_async`, `purge_dead_letter_async`): the same answers as
//! their blocking twins, durable when they resolve (a power cut right after keeps them),
//! pending — not blocking — while the log syncs, woken by the log (each test parks until
//! woken), `Poisoned` after a failed fdatasync, and not undone when dropped after the first
//! poll. Driven by a minimal thread-parking executor: no async runtime is a dependency.

mod common;

use common::{block_on_counted, config, memory_engine, SimHarness, Stop, TestResult};
use kairos::{
    AckError, AckScheduleError, AckScheduleOutcome, CancelError, CancelOutcome, Config, Due,
    Durability, NackOutcome, NewTask, RecvError, RescheduleOutcome, ScheduleError,
};
use kairos_wal::{FaultKind, FaultOp, FaultPlan};
use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

/// [`block_on_counted`]: the output and the number of polls (once at the start, then only
/// after a wake).
fn block_on<F: Future>(fut: F) -> Result<(F::Output, usize), String> {
    block_on_counted(fut)
}

/// [`block_on`]'s output alone.
fn run<F: Future>(fut: F) -> Result<F::Output, String> {
    block_on(fut).map(|(out, _)| out)
}

fn sync_config() -> Config {
    config(Durability::Sync)
}

fn after(ms: u64) -> Due {
    Due::After(Duration::from_millis(ms))
}

/// On an in-memory engine (nothing to wait for), each async call answers exactly what its
/// blocking twin answers for the same sequence: ids, refusals, outcomes.
#[test]
fn async_calls_answer_as_the_blocking_calls() -> TestResult {
    let (engine, clock) = memory_engine(Config::default())?;
    assert_eq!(run(engine.schedule_async(b"a", after(10), b"pa"))??.0, 1);
    assert!(matches!(
        run(engine.schedule_async(b"a", after(20), b"pa"))?,
        Err(ScheduleError::AlreadyExists { .. })
    ));
    let many = [
        NewTask {
            key: b"b",
            due: after(30),
            payload: b"pb",
        },
        NewTask {
            key: b"c",
            due: after(40),
            payload: b"pc",
        },
    ];
    let ids: Vec<u64> = run(engine.schedule_many_async(&many))??
        .into_iter()
        .map(|id| id.0)
        .collect();
    assert_eq!(ids, [2, 3]);
    assert!(run(engine.schedule_many_async(&[]))??.is_empty());
    assert!(matches!(
        run(engine.schedule_async(b"", after(1), b""))?,
        Err(ScheduleError::EmptyKey)
    ));
    assert_eq!(
        run(engine.cancel_async(b"b"))??,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    assert_eq!(run(engine.cancel_async(b"b"))??, CancelOutcome::NotFound);
    // "a" falls due and is received: then a cancel is too late, and the ack settles it.
    clock.advance(Duration::from_millis(10));
    engine.run_until_idle();
    let consumer = engine.consumer();
    let d = consumer.try_recv()?;
    assert_eq!(d.key(), b"a");
    assert_eq!(
        run(engine.cancel_many_async(&[b"a", b"c", b"zz", b"c"]))??,
        [
            CancelOutcome::AlreadyDelivered { attempt: 1 },
            CancelOutcome::Cancelled { deliveries: 0 },
            CancelOutcome::NotFound,
            CancelOutcome::NotFound,
        ]
    );
    run(consumer.ack_async(&d))??;
    assert!(matches!(
        run(consumer.ack_async(&d))?,
        Err(AckError::NotOutstanding { .. })
    ));
    assert!(matches!(
        run(consumer.nack_async(&d, None, "late"))?,
        Err(AckError::NotOutstanding { .. })
    ));
    // A recurring task: ack_and_schedule_async hands the key on; a nack retries it.
    run(engine.schedule_async(b"r", after(5), b"run"))??;
    clock.advance(Duration::from_millis(5));
    engine.run_until_idle();
    let run1 = consumer.try_recv()?;
    let next = run(consumer.ack_and_schedule_async(&run1, after(5), b"run"))??;
    assert_eq!(next, AckScheduleOutcome::Scheduled(kairos::TaskId(5)));
    assert!(matches!(
        run(consumer.ack_and_schedule_async(&run1, after(5), b"run"))?,
        Err(AckScheduleError::Ack(AckError::NotOutstanding { .. }))
    ));
    clock.advance(Duration::from_millis(5));
    engine.run_until_idle();
    let run2 = consumer.try_recv()?;
    assert_eq!(run2.task_id().0, 5);
    assert!(matches!(
        run(consumer.nack_async(&run2, Some(Duration::from_millis(1)), "busy"))??,
        NackOutcome::Retry { .. }
    ));
    // Rescheduling the retry keeps its id; a free key gets a new task.
    assert_eq!(
        run(engine.reschedule_async(b"r", after(50), None))??,
        RescheduleOutcome::Rescheduled(kairos::TaskId(5))
    );
    assert_eq!(
        run(engine.reschedule_async(b"new", after(50), Some(b"n")))??,
        RescheduleOutcome::Scheduled(kairos::TaskId(6))
    );
    assert_eq!(
        run(engine.cancel_async(b"new"))??,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    assert_eq!(
        run(engine.cancel_async(b"r"))??,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    assert!(matches!(
        run(consumer.ack_many_async(&[d.clone(), d]))?,
        Err(AckError::NotOutstanding { .. })
    ));
    let stats = engine.stats();
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    engine.shutdown()?;
    assert!(matches!(
        run(engine.schedule_async(b"x", after(1), b""))?,
        Err(ScheduleError::Closed)
    ));
    assert!(matches!(
        run(engine.cancel_async(b"x"))?,
        Err(CancelError::Closed)
    ));
    Ok(())
}

/// Under `Sync`, on a slow disk: each future is pending at its first poll (the poll does not
/// wait for the fdatasync), is polled again only when woken, and what it answered survives a
/// power cut that drops every unsynced byte right after — schedules, a cancel (never
/// delivered) and an ack (never redelivered).
#[test]
fn a_resolved_async_call_survives_a_power_cut() -> TestResult {
    let mut h = SimHarness::new(5, sync_config())?;
    h.sim.set_sync_latency(Duration::from_millis(2));
    let engine = h.engine();
    let mut polls = Vec::new();
    for i in 0..6u64 {
        let key = format!("order:{i}");
        let (id, p) = block_on(engine.schedule_async(key.as_bytes(), after(1000), b"pay"))?;
        assert_eq!(id?.0, i + 1);
        polls.push(p);
    }
    // A seventh task, moved an hour later by reschedule_async (same id, new payload).
    run(engine.schedule_async(b"moved", after(1000), b"old"))??;
    let (moved, p) = block_on(engine.reschedule_async(b"moved", after(3_601_000), Some(b"new")))?;
    assert_eq!(moved?, RescheduleOutcome::Rescheduled(kairos::TaskId(7)));
    polls.push(p);
    let (outcome, p) = block_on(engine.cancel_async(b"order:0"))?;
    assert_eq!(outcome?, CancelOutcome::Cancelled { deliveries: 0 });
    polls.push(p);
    // Five fall due and are received (order:0 was cancelled); order:1 is acked, the other
    // four stay held.
    let got = h.advance(Duration::from_millis(1000))?;
    assert_eq!(got.len(), 5);
    let d = got
        .iter()
        .find(|d| d.key() == b"order:1")
        .ok_or("order:1 not delivered")?;
    let consumer = engine.consumer();
    let (acked, p) = block_on(consumer.ack_async(d))?;
    acked?;
    polls.push(p);
    // order:2 is acked with its next run scheduled in the same frame; order:3 is nacked to
    // a retry in an hour.
    let d2 = got
        .iter()
        .find(|d| d.key() == b"order:2")
        .ok_or("order:2 not delivered")?;
    let (next, p) = block_on(consumer.ack_and_schedule_async(d2, after(2000), b"next"))?;
    assert!(matches!(next?, AckScheduleOutcome::Scheduled(_)));
    polls.push(p);
    let d3 = got
        .iter()
        .find(|d| d.key() == b"order:3")
        .ok_or("order:3 not delivered")?;
    let hour = Duration::from_secs(3600);
    let (retry, p) = block_on(consumer.nack_async(d3, Some(hour), "busy"))?;
    assert!(matches!(retry?, NackOutcome::Retry { .. }));
    polls.push(p);
    assert!(polls.iter().all(|&p| p >= 2), "polls per call: {polls:?}");
    // The power goes while the engine runs; then it is gone.
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    // order:0 cancelled, order:1 acked, order:3 waiting for its retry: the two still held
    // are delivered again at once; order:2's next run at its due time; then order:3's retry.
    let keys_of = |ds: &[kairos::Delivery]| {
        let mut keys: Vec<Vec<u8>> = ds.iter().map(|d| d.key().to_vec()).collect();
        keys.sort();
        keys
    };
    let got = h.advance(Duration::from_millis(1))?;
    assert_eq!(keys_of(&got), [b"order:4".to_vec(), b"order:5".to_vec()]);
    let got = h.advance(Duration::from_millis(2000))?;
    assert_eq!(keys_of(&got), [b"order:2".to_vec()]);
    assert_eq!(got[0].payload(), b"next");
    let got = h.advance(Duration::from_secs(3600))?;
    assert_eq!(keys_of(&got), [b"moved".to_vec(), b"order:3".to_vec()]);
    let moved = got.iter().find(|d| d.key() == b"moved").ok_or("moved")?;
    assert_eq!(moved.payload(), b"new");
    Ok(())
}

/// Eight threads, each awaiting its own schedules, under `Sync`: every task is durable once its
/// future resolves (a power cut right after keeps all of them).
#[test]
fn concurrent_async_schedules_are_all_durable() -> TestResult {
    let mut h = SimHarness::new(8, sync_config())?;
    h.sim.set_sync_latency(Duration::from_millis(1));
    let engine = h.engine();
    let (threads, each) = (8usize, 25usize);
    std::thread::scope(|s| -> TestResult {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<(), String> {
                    for k in 0..each {
                        let key = format!("t{t}:k{k}");
                        run(engine.schedule_async(key.as_bytes(), after(500), b"p"))?
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for handle in handles {
            handle.join().map_err(|_| "a thread panicked")??;
        }
        Ok(())
    })?;
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    assert_eq!(h.engine().stats().pending, threads * each);
    assert_eq!(h.advance(Duration::from_millis(500))?.len(), threads * each);
    Ok(())
}

/// A failed fdatasync answers `Poisoned` to the waiting future and poisons the engine: the
/// next call, blocking or not, is refused as `Poisoned` too.
#[test]
fn a_failed_sync_answers_poisoned() -> TestResult {
    let h = SimHarness::new(9, sync_config())?;
    let engine = h.engine();
    run(engine.schedule_async(b"before", after(100), b""))??;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let failed = run(engine.schedule_async(b"during", after(100), b""))?;
    assert!(
        matches!(failed, Err(ScheduleError::Poisoned { ref cause }) if cause.contains("os error 5")),
        "{failed:?}"
    );
    assert!(matches!(
        run(engine.cancel_async(b"before"))?,
        Err(CancelError::Poisoned { .. })
    ));
    assert!(matches!(
        engine.schedule_after(b"after", Duration::from_millis(1), b""),
        Err(ScheduleError::Poisoned { .. })
    ));
    // The engine itself is poisoned (not only its log): consumers are told.
    assert!(matches!(
        engine.consumer().try_recv(),
        Err(RecvError::Poisoned { .. })
    ));
    Ok(())
}

/// A future dropped after its first poll (pending on the fdatasync) does not undo its call:
/// the task is scheduled, and a clean reopen finds it.
#[test]
fn a_dropped_future_does_not_undo_its_call() -> TestResult {
    let mut h = SimHarness::new(13, sync_config())?;
    h.sim.set_sync_latency(Duration::from_millis(5));
    let engine = h.engine();
    let mut cx = Context::from_waker(Waker::noop());
    {
        let mut fut = Box::pin(engine.schedule_async(b"dropped", after(50), b"still here"));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    // A future never polled does nothing at all.
    drop(engine.schedule_async(b"never-polled", after(50), b""));
    assert_eq!(h.engine().stats().pending, 1);
    h.restart(Stop::Clean)?;
    let got = h.advance(Duration::from_millis(50))?;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].key(), got[0].payload()),
        (&b"dropped"[..], &b"still here"[..])
    );
    Ok(())
}

/// The futures can be handed to a multi-threaded executor.
#[test]
fn the_futures_are_send() -> TestResult {
    fn assert_send<T: Send>(_: &T) {}
    let (engine, clock) = memory_engine(Config::default())?;
    let consumer = engine.consumer();
    engine.schedule_after(b"k", Duration::from_millis(1), b"")?;
    clock.advance(Duration::from_millis(1));
    engine.run_until_idle();
    let d = consumer.try_recv()?;
    assert_send(&consumer.nack_async(&d, None, "e"));
    assert_send(&consumer.ack_and_schedule_async(&d, after(1), b""));
    assert_send(&engine.nack_async(&d, None, "e"));
    assert_send(&engine.ack_and_schedule_async(&d, after(1), b""));
    assert_send(&engine.ack_async(&d));
    assert_send(&consumer.ack_async(&d));
    assert_send(&engine.schedule_async(b"k", after(1), b""));
    assert_send(&engine.schedule_many_async(&[]));
    assert_send(&engine.cancel_async(b"k"));
    assert_send(&engine.reschedule_async(b"k", after(1), None));
    assert_send(&engine.cancel_many_async(&[]));
    assert_send(&engine.ack_many_async(&[]));
    assert_send(&consumer.ack_many_async(&[]));
    assert_send(&engine.sync_async());
    assert_send(&engine.requeue_dead_letter_async(kairos::TaskId(1), after(1)));
    assert_send(&engine.purge_dead_letter_async(kairos::TaskId(1)));
    Ok(())
}

/// The refusals that rest on an earlier record — `AlreadyExists`, `NotFound`, `NotOutstanding` —
/// answer only once that record is durable, as the blocking calls do: each is pending at its
/// first poll while another future's record (polled once, then dropped) is still being
/// synced, and what it answered survives a power cut right after.
#[test]
fn an_async_refusal_waits_for_the_record_it_rests_on() -> TestResult {
    let mut h = SimHarness::new(21, sync_config())?;
    h.sim.set_sync_latency(Duration::from_millis(20));
    let mut cx = Context::from_waker(Waker::noop());
    let engine = h.engine();
    // A schedule polled once: made and logged, its fdatasync under way.
    let mut first = Box::pin(engine.schedule_async(b"k", after(1000), b"p"));
    assert!(first.as_mut().poll(&mut cx).is_pending());
    let (dup, polls) = block_on(engine.schedule_async(b"k", after(1000), b"q"))?;
    assert!(
        matches!(dup, Err(ScheduleError::AlreadyExists { .. })),
        "{dup:?}"
    );
    assert!(polls >= 2, "AlreadyExists answered at the first poll");
    drop(first);
    // A cancel polled once; a second cancel of the key finds it gone.
    run(engine.schedule_async(b"c", after(1000), b""))??;
    let mut cancel = Box::pin(engine.cancel_async(b"c"));
    assert!(cancel.as_mut().poll(&mut cx).is_pending());
    let (gone, polls) = block_on(engine.cancel_async(b"c"))?;
    assert_eq!(gone?, CancelOutcome::NotFound);
    assert!(polls >= 2, "NotFound answered at the first poll");
    drop(cancel);
    // A delivery acked by a future polled once; a second ack is refused.
    run(engine.schedule_async(b"d", after(0), b""))??;
    let got = h.advance(Duration::from_millis(1))?;
    let d = got
        .iter()
        .find(|d| d.key() == b"d")
        .ok_or("d not delivered")?;
    let consumer = engine.consumer();
    let mut ack = Box::pin(consumer.ack_async(d));
    assert!(ack.as_mut().poll(&mut cx).is_pending());
    let (again, polls) = block_on(consumer.ack_async(d))?;
    assert!(
        matches!(again, Err(AckError::NotOutstanding { .. })),
        "{again:?}"
    );
    assert!(polls >= 2, "NotOutstanding answered at the first poll");
    drop(ack);
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    // "k" scheduled, "c" cancelled, "d" acked: only "k" is left, and comes when due.
    assert_eq!(h.engine().stats().pending, 1);
    assert!(h.advance(Duration::from_millis(1))?.is_empty());
    let got = h.advance(Duration::from_millis(1000))?;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].key(), got[0].payload()), (&b"k"[..], &b"p"[..]));
    Ok(())
}

/// The batch forms under `Sync` on a slow disk: `schedule_many_async`, `cancel_many_async`
/// and `ack_many_async` are pending at their first poll and what they answered survives a
/// power cut right after.
#[test]
fn resolved_async_batches_survive_a_power_cut() -> TestResult {
    let mut h = SimHarness::new(22, sync_config())?;
    h.sim.set_sync_latency(Duration::from_millis(2));
    let engine = h.engine();
    let keys: Vec<String> = (0..6).map(|i| format!("b:{i}")).collect();
    let batch: Vec<NewTask> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| NewTask {
            key: k.as_bytes(),
            due: after(if i < 2 { 10 } else { 1000 }),
            payload: b"p",
        })
        .collect();
    let (ids, polls) = block_on(engine.schedule_many_async(&batch))?;
    assert_eq!(ids?.len(), 6);
    assert!(polls >= 2, "schedule_many_async: {polls} poll(s)");
    let (outcomes, polls) = block_on(engine.cancel_many_async(&[b"b:2", b"b:3", b"none"]))?;
    assert_eq!(
        outcomes?,
        [
            CancelOutcome::Cancelled { deliveries: 0 },
            CancelOutcome::Cancelled { deliveries: 0 },
            CancelOutcome::NotFound,
        ]
    );
    assert!(polls >= 2, "cancel_many_async: {polls} poll(s)");
    let got = h.advance(Duration::from_millis(10))?;
    assert_eq!(got.len(), 2);
    let (acked, polls) = block_on(engine.consumer().ack_many_async(&got))?;
    acked?;
    assert!(polls >= 2, "ack_many_async: {polls} poll(s)");
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    // b:0 and b:1 acked (not delivered again), b:2 and b:3 cancelled: b:4 and b:5 are left.
    assert!(h.advance(Duration::from_millis(1))?.is_empty());
    let mut left: Vec<Vec<u8>> = h
        .advance(Duration::from_millis(1000))?
        .iter()
        .map(|d| d.key().to_vec())
        .collect();
    left.sort();
    assert_eq!(left, [b"b:4".to_vec(), b"b:5".to_vec()]);
    Ok(())
}

/// `Engine::sync_async` on a `Buffered` engine (calls written to the OS, not synced): once it
/// resolves, everything before it survives a power cut that drops every unsynced byte — the
/// async form of per-call durability. In memory it answers at once; after a shutdown `Closed`.
#[test]
fn sync_async_makes_a_buffered_engine_durable() -> TestResult {
    let mut h = SimHarness::new(23, config(Durability::Buffered))?;
    h.sim.set_sync_latency(Duration::from_millis(2));
    let engine = h.engine();
    run(engine.schedule_async(b"kept", after(100), b"k"))??;
    run(engine.schedule_async(b"paid", after(100), b""))??;
    assert_eq!(
        run(engine.cancel_async(b"paid"))??,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    let (synced, polls) = block_on(engine.sync_async())?;
    synced?;
    assert!(polls >= 2, "sync_async resolved at its first poll");
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    let got = h.advance(Duration::from_millis(100))?;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].key(), got[0].payload()), (&b"kept"[..], &b"k"[..]));

    let (memory, _clock) = memory_engine(Config::default())?;
    assert_eq!(block_on(memory.sync_async())?.1, 1);
    h.engine().shutdown()?;
    assert!(matches!(
        run(h.engine().sync_async())?,
        Err(kairos::SyncError::Closed)
    ));
    Ok(())
}

/// `config` with one attempt: a nack makes a dead letter.
fn one_attempt(durability: Durability) -> Config {
    let mut c = config(durability);
    c.retry.max_attempts = 1;
    c
}

/// Schedules each key (payload `p` + key) due in 10 ms, lets them fall due and nacks each
/// one's only attempt: dead letters, in key order.
fn dead_letters_of(
    engine: &kairos::Engine,
    clock: &kairos::ManualClock,
    keys: &[&str],
) -> TestResult<Vec<kairos::TaskId>> {
    for key in keys {
        engine.schedule(key.as_bytes(), after(10), format!("p{key}").as_bytes())?;
    }
    let got = common::advance(clock, engine, Duration::from_millis(10))?;
    let mut ids = Vec::new();
    for key in keys {
        let d = got
            .iter()
            .find(|d| d.key() == key.as_bytes())
            .ok_or("not delivered")?;
        assert_eq!(engine.nack(d, None, "boom")?, NackOutcome::DeadLettered);
        ids.push(d.task_id());
    }
    Ok(ids)
}

/// `requeue_dead_letter_async` and `purge_dead_letter_async` answer exactly what their
/// blocking twins answer, on two in-memory engines taken through the same sequence: a new id
/// for a requeue (the task keeps its key and payload and is delivered when due),
/// `NotDeadLetter` for a dead letter already requeued and for an unknown id, `AlreadyExists`
/// when a live task has the key; a purge `true`, then `false`; `Closed` after a shutdown.
#[test]
fn dead_letter_async_calls_answer_as_the_blocking_calls() -> TestResult {
    let unknown = kairos::TaskId(999);
    let mut answers: Vec<Vec<String>> = Vec::new();
    for asynchronous in [false, true] {
        let (engine, clock) = memory_engine(one_attempt(Durability::Sync))?;
        let [a, b, c] = dead_letters_of(&engine, &clock, &["a", "b", "c"])?[..] else {
            return Err("three dead letters".into());
        };
        let requeue = |id, due| -> Result<Result<kairos::TaskId, ScheduleError>, String> {
            if asynchronous {
                run(engine.requeue_dead_letter_async(id, due))
            } else {
                Ok(engine.requeue_dead_letter(id, due))
            }
        };
        let purge = |id| -> Result<Result<bool, CancelError>, String> {
            if asynchronous {
                run(engine.purge_dead_letter_async(id))
            } else {
                Ok(engine.purge_dead_letter(id))
            }
        };
        let mut seen = Vec::new();
        let new = requeue(a, after(5))??;
        assert!(new.0 > c.0, "a new id: {new:?}");
        seen.push(format!("{new:?}"));
        let again = requeue(a, after(5))?;
        assert!(
            matches!(again, Err(ScheduleError::NotDeadLetter { task_id }) if task_id == a.0),
            "{again:?}"
        );
        seen.push(format!("{again:?}"));
        let none = requeue(unknown, after(5))?;
        assert!(
            matches!(none, Err(ScheduleError::NotDeadLetter { task_id: 999 })),
            "{none:?}"
        );
        seen.push(format!("{none:?}"));
        engine.schedule(b"b", after(1000), b"live")?;
        let taken = requeue(b, after(5))?;
        assert!(
            matches!(taken, Err(ScheduleError::AlreadyExists { .. })),
            "{taken:?}"
        );
        seen.push(format!("{taken:?}"));
        assert!(purge(c)??);
        assert!(!purge(c)??);
        assert!(!purge(unknown)??);
        seen.push(format!("{:?}", purge(b)?));
        // The requeued task: same key and payload, the new id, delivered when due.
        let got = common::advance(&clock, &engine, Duration::from_millis(5))?;
        assert_eq!(got.len(), 1);
        assert_eq!(
            (
                got[0].key(),
                got[0].payload(),
                got[0].task_id(),
                got[0].attempt()
            ),
            (&b"a"[..], &b"pa"[..], new, 1)
        );
        assert!(engine.dead_letters().is_empty());
        engine.shutdown()?;
        seen.push(format!("{:?}", requeue(a, after(5))?));
        seen.push(format!("{:?}", purge(a)?));
        assert!(
            seen.ends_with(&["Err(Closed)".into(), "Err(Closed)".into()]),
            "{seen:?}"
        );
        answers.push(seen);
    }
    assert_eq!(answers[0], answers[1]);
    Ok(())
}

/// Under `Sync` on a slow disk, `requeue_dead_letter_async` and `purge_dead_letter_async` are
/// pending at their first poll (the poll does not wait for the fdatasync), and what they
/// answered survives a power cut that drops every unsynced byte right after: the purged dead
/// letter is gone, the requeued one is a live task (its key and payload, the id answered)
/// and no longer a dead letter.
#[test]
fn resolved_dead_letter_async_calls_survive_a_power_cut() -> TestResult {
    let mut h = SimHarness::new(24, one_attempt(Durability::Sync))?;
    let [x, y] = dead_letters_of(h.engine(), &h.clock, &["x", "y"])?[..] else {
        return Err("two dead letters".into());
    };
    h.sim.set_sync_latency(Duration::from_millis(20));
    let engine = h.engine();
    let (new, polls) = block_on(engine.requeue_dead_letter_async(x, after(1000)))?;
    let new = new?;
    assert!(polls >= 2, "requeue_dead_letter_async: {polls} poll(s)");
    let (purged, polls) = block_on(engine.purge_dead_letter_async(y))?;
    assert!(purged?);
    assert!(polls >= 2, "purge_dead_letter_async: {polls} poll(s)");
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    let dead: Vec<_> = h
        .engine()
        .dead_letters()
        .iter()
        .map(|d| d.task_id)
        .collect();
    assert!(
        dead.is_empty(),
        "dead letters after the power cut: {dead:?}"
    );
    assert_eq!(h.engine().stats().pending, 1);
    assert!(h.advance(Duration::from_millis(999))?.is_empty());
    let got = h.advance(Duration::from_millis(1))?;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].key(), got[0].payload(), got[0].task_id()),
        (&b"x"[..], &b"px"[..], new)
    );
    Ok(())
}

/// A dead letter gone by another call's record that is not durable yet (a requeue or a purge
/// polled once, its fdatasync under way): `purge_dead_letter_async`'s `false` and
/// `requeue_dead_letter_async`'s `NotDeadLetter` answer only once that record is durable, as
/// the blocking calls do, and what they answered survives a power cut right after.
#[test]
fn a_dead_letter_async_refusal_waits_for_the_record_it_rests_on() -> TestResult {
    let mut h = SimHarness::new(25, one_attempt(Durability::Sync))?;
    let [x, y] = dead_letters_of(h.engine(), &h.clock, &["x", "y"])?[..] else {
        return Err("two dead letters".into());
    };
    h.sim.set_sync_latency(Duration::from_millis(20));
    let mut cx = Context::from_waker(Waker::noop());
    let engine = h.engine();
    let mut requeue = Box::pin(engine.requeue_dead_letter_async(x, after(1000)));
    assert!(requeue.as_mut().poll(&mut cx).is_pending());
    let (gone, polls) = block_on(engine.purge_dead_letter_async(x))?;
    assert!(!gone?);
    assert!(polls >= 2, "purge's false answered at the first poll");
    drop(requeue);
    let mut purge = Box::pin(engine.purge_dead_letter_async(y));
    assert!(purge.as_mut().poll(&mut cx).is_pending());
    let (again, polls) = block_on(engine.requeue_dead_letter_async(y, after(1000)))?;
    assert!(
        matches!(again, Err(ScheduleError::NotDeadLetter { .. })),
        "{again:?}"
    );
    assert!(polls >= 2, "NotDeadLetter answered at the first poll");
    drop(purge);
    h.sim.power_cut_drop_unsynced();
    h.restart(Stop::ProcessCrash)?;
    // x requeued, y purged.
    assert!(h.engine().dead_letters().is_empty());
    let got = h.advance(Duration::from_millis(1000))?;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].key(), got[0].payload()), (&b"x"[..], &b"px"[..]));
    Ok(())
}

/// A failed fdatasync answers `Poisoned` to `requeue_dead_letter_async` and
/// `purge_dead_letter_async` (each on an engine of its own), and poisons the engine.
#[test]
fn a_failed_sync_answers_poisoned_to_the_dead_letter_async_calls() -> TestResult {
    for purge in [false, true] {
        let h = SimHarness::new(26, one_attempt(Durability::Sync))?;
        let engine = h.engine();
        let [dead] = dead_letters_of(engine, &h.clock, &["d"])?[..] else {
            return Err("one dead letter".into());
        };
        h.sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        let cause = if purge {
            match run(engine.purge_dead_letter_async(dead))? {
                Err(CancelError::Poisoned { cause }) => cause,
                other => return Err(format!("purge answered {other:?}").into()),
            }
        } else {
            match run(engine.requeue_dead_letter_async(dead, after(10)))? {
                Err(ScheduleError::Poisoned { cause }) => cause,
                other => return Err(format!("requeue answered {other:?}").into()),
            }
        };
        assert!(cause.contains("os error 5"), "{cause}");
        assert!(matches!(
            engine.consumer().try_recv(),
            Err(RecvError::Poisoned { .. })
        ));
    }
    Ok(())
}
