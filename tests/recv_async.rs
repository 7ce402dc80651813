//! `Consumer::recv_async`: a future woken when a task is ready, or when the engine stops —
//! polled by hand with counting wakers under a manual clock, and driven by a minimal
//! thread-parking executor on several threads (no async runtime is a dependency).

mod common;

use common::{config, memory_engine, SimHarness, TestResult, START_MS};
use kairos::{Config, Consumer, Delivery, DeliveryGuarantee, Durability, RecvError};
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

/// A waker that counts its wakes.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> (Arc<Counter>, Waker) {
    let c = Arc::new(Counter::default());
    (c.clone(), Waker::from(c))
}

fn wakes(c: &Counter) -> usize {
    c.0.load(Ordering::SeqCst)
}

/// A waker that unparks the thread that made it.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on this thread, parking while it is pending.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// A waiting future is not woken by a schedule or by a clock move that makes nothing due; it
/// is woken when its task falls due, and then answers it exactly.
#[test]
fn a_waiting_future_is_woken_when_a_task_falls_due() -> TestResult {
    let (engine, clock) = memory_engine(Config::default())?;
    let consumer = engine.consumer();
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut next = pin!(consumer.recv_async());
    assert!(next.as_mut().poll(&mut cx).is_pending());
    engine.schedule_after(b"session:7", Duration::from_secs(1), b"expire")?;
    clock.advance(Duration::from_millis(999));
    engine.run_until_idle();
    assert_eq!(wakes(&count), 0);
    assert!(next.as_mut().poll(&mut cx).is_pending());
    clock.advance(Duration::from_millis(1));
    engine.run_until_idle();
    assert!(wakes(&count) > 0, "not woken by its task");
    let Poll::Ready(got) = next.as_mut().poll(&mut cx) else {
        return Err("woken, but pending".into());
    };
    let d = got?;
    assert_eq!(
        (d.key(), d.payload(), d.due_ms(), d.attempt()),
        (
            b"session:7".as_slice(),
            b"expire".as_slice(),
            START_MS + 1_000,
            1
        )
    );
    consumer.ack(&d)?;
    engine.shutdown()?;
    Ok(())
}

/// Futures waiting on several consumers are all woken by a shutdown and answer `Closed`; a
/// new one answers `Closed` at its first poll.
#[test]
fn waiting_futures_answer_closed_after_shutdown() -> TestResult {
    let (engine, _clock) = memory_engine(Config::default())?;
    let consumers: Vec<Consumer> = (0..3).map(|_| engine.consumer()).collect();
    let mut futures: Vec<_> = consumers.iter().map(|c| Box::pin(c.recv_async())).collect();
    let counters: Vec<(Arc<Counter>, Waker)> = (0..3).map(|_| counter()).collect();
    for (f, (_, w)) in futures.iter_mut().zip(&counters) {
        assert!(f.as_mut().poll(&mut Context::from_waker(w)).is_pending());
    }
    engine.shutdown()?;
    for (f, (c, w)) in futures.iter_mut().zip(&counters) {
        assert!(wakes(c) > 0, "not woken by the shutdown");
        match f.as_mut().poll(&mut Context::from_waker(w)) {
            Poll::Ready(Err(RecvError::Closed)) => {}
            other => return Err(format!("expected Closed, got {other:?}").into()),
        }
    }
    let late = block_on(consumers[0].recv_async());
    assert_eq!(late.map(|d| d.task_id()), Err(RecvError::Closed));
    Ok(())
}

/// A failed fdatasync poisons the engine: a waiting future is woken and answers `Poisoned`.
#[test]
fn a_waiting_future_answers_poisoned_after_a_failed_sync() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let h = SimHarness::new(11, config(Durability::Buffered))?;
    let consumer = h.engine().consumer();
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut next = pin!(consumer.recv_async());
    assert!(next.as_mut().poll(&mut cx).is_pending());
    h.engine()
        .schedule_after(b"unsynced", Duration::from_secs(1), b"")?;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    assert!(h.engine().sync().is_err());
    assert!(wakes(&count) > 0, "not woken by the failure");
    match next.as_mut().poll(&mut cx) {
        Poll::Ready(Err(RecvError::Poisoned { cause })) => assert!(!cause.is_empty()),
        other => return Err(format!("expected Poisoned, got {other:?}").into()),
    }
    Ok(())
}

/// Four threads each run a loop of `recv_async` + ack on a parking executor while tasks fall
/// due in batches: every task is received exactly once; the shutdown ends every loop with
/// `Closed`.
#[test]
fn async_consumers_on_threads_take_every_task_exactly_once() -> TestResult {
    const TASKS: usize = 2_000;
    let (engine, clock) = memory_engine(Config::default())?;
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let consumer = engine.consumer();
            let tx = tx.clone();
            std::thread::spawn(move || -> Result<(), String> {
                block_on(async {
                    loop {
                        match consumer.recv_async().await {
                            Ok(d) => {
                                consumer.ack(&d).map_err(|e| e.to_string())?;
                                tx.send(d.key().to_vec()).map_err(|e| e.to_string())?;
                            }
                            Err(RecvError::Closed) => return Ok(()),
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                })
            })
        })
        .collect();
    drop(tx);
    for batch in 0..(TASKS / 100) {
        for i in 0..100 {
            let key = format!("k{}", batch * 100 + i);
            engine.schedule_after(key.as_bytes(), Duration::from_millis(1), b"")?;
        }
        clock.advance(Duration::from_millis(1));
        engine.run_until_idle();
    }
    let mut seen = BTreeSet::new();
    for _ in 0..TASKS {
        let key = rx.recv_timeout(Duration::from_secs(60))?;
        assert!(seen.insert(key.clone()), "{key:?} received twice");
    }
    let expected: BTreeSet<Vec<u8>> = (0..TASKS).map(|i| format!("k{i}").into_bytes()).collect();
    assert_eq!(seen, expected);
    assert_eq!(engine.stats().acks, TASKS as u64);
    engine.shutdown()?;
    for w in workers {
        w.join().map_err(|_| "worker panicked")??;
    }
    assert!(rx.try_recv().is_err(), "a task received after all were");
    Ok(())
}

/// At most once, the future returns a task already finished (its ack record durable first).
#[test]
fn at_most_once_the_future_returns_finished_tasks() -> TestResult {
    let mut c = Config::default();
    c.delivery = DeliveryGuarantee::AtMostOnce;
    let (engine, clock) = memory_engine(c)?;
    let consumer = engine.consumer();
    engine.schedule_after(b"once", Duration::from_millis(5), b"p")?;
    clock.advance(Duration::from_millis(5));
    engine.run_until_idle();
    let d: Delivery = block_on(consumer.recv_async())?;
    assert_eq!((d.key(), d.attempt()), (b"once".as_slice(), 1));
    assert!(!consumer.holds(&d)?);
    assert_eq!(engine.stats().pending, 0);
    engine.shutdown()?;
    Ok(())
}

/// The future can move to another thread (a multi-threaded runtime's worker).
#[test]
fn the_future_is_send() -> TestResult {
    fn assert_send<T: Send>(_: &T) {}
    let (engine, _clock) = memory_engine(Config::default())?;
    let consumer = engine.consumer();
    let f = consumer.recv_async();
    assert_send(&f);
    drop(f);
    engine.shutdown()?;
    Ok(())
}

/// A waker that panics when woken (a bug in an executor's code) must not kill the thread that
/// wakes it — the engine's driver, which hands out due tasks — nor keep the other futures from
/// being woken: two futures wait, the first with a panicking waker; a task falls due; the
/// second is woken and gets it, the engine is not poisoned, and later tasks keep firing.
#[test]
fn a_waker_that_panics_stops_neither_the_driver_nor_the_other_futures() -> TestResult {
    struct Panics;
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("an executor's waker panicked (this test's, on purpose)");
        }
    }
    let (engine, clock) = memory_engine(Config::default())?;
    let (first, second) = (engine.consumer(), engine.consumer());
    let panicky = Waker::from(Arc::new(Panics));
    let mut a = pin!(first.recv_async());
    assert!(a
        .as_mut()
        .poll(&mut Context::from_waker(&panicky))
        .is_pending());
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut b = pin!(second.recv_async());
    assert!(b.as_mut().poll(&mut cx).is_pending());
    engine.schedule_after(b"order:1", Duration::from_secs(1), b"cancel")?;
    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    assert!(wakes(&count) > 0, "the second future was not woken");
    let Poll::Ready(got) = b.as_mut().poll(&mut cx) else {
        return Err("woken, but pending".into());
    };
    let d = got?;
    assert_eq!(d.key(), b"order:1");
    second.ack(&d)?;
    assert!(matches!(
        engine.cancel(b"no such key"),
        Ok(kairos::CancelOutcome::NotFound)
    ));
    // The driver still runs: a later task fires and is received.
    engine.schedule_after(b"order:2", Duration::from_secs(1), b"cancel")?;
    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    let d = second.try_recv()?;
    assert_eq!(d.key(), b"order:2");
    second.ack(&d)?;
    engine.shutdown()?;
    Ok(())
}
