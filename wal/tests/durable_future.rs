//! `AppendTicket::durable`: the future of an append's durability, for async callers. It
//! resolves only once the append has the log's durability (a power cut right after keeps it
//! under `Sync`), is woken by the log's progress (never polled in a loop here: each test parks
//! until woken), fails as `wait` does when the log is poisoned, and a dropped one still lets
//! the append happen.

mod common;

use common::*;
use kairos_wal::{Durability, FaultKind, FaultOp, FaultPlan, Record, SimStorage, Wal, WalError};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A waker that unparks the thread that made it, and counts its wakes.
struct Unpark(Thread, AtomicUsize);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.unpark();
    }
}

/// Longest a test waits to be woken before it calls the future lost (a liveness bound, not a
/// speed limit: the log answers in milliseconds).
const WOKEN_WITHIN: Duration = Duration::from_secs(60);

/// Runs `fut` to completion on this thread, polling it only after a wake (and once at the
/// start); returns its output and how many polls it took. Fails if it is not woken in
/// [`WOKEN_WITHIN`].
fn block_on<F: Future>(fut: F) -> Result<(F::Output, usize), String> {
    let mut fut = pin!(fut);
    let unpark = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    let mut polls = 0;
    loop {
        let seen = unpark.1.load(Ordering::SeqCst);
        polls += 1;
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Ok((out, polls));
        }
        let start = Instant::now();
        while unpark.1.load(Ordering::SeqCst) == seen {
            if start.elapsed() > WOKEN_WITHIN {
                return Err(format!("not woken within {WOKEN_WITHIN:?}"));
            }
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

fn append(wal: &Wal, i: u64) -> Result<kairos_wal::AppendTicket, WalError> {
    wal.append(&[Record {
        record_type: record_type(i),
        body: &body(i),
    }])
}

/// Under `Sync`, each append's future resolves only when it is durable: a power cut that drops
/// every unsynced byte right after keeps all of them. One thread and eight threads.
#[test]
fn a_sync_append_is_durable_when_its_future_resolves() -> TestResult {
    for threads in [1u64, 8] {
        let sim = SimStorage::new(threads);
        // A slow disk, so that a future that answered before the fdatasync would be caught.
        sim.set_sync_latency(Duration::from_millis(2));
        let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
        let per_thread = 20u64;
        std::thread::scope(|s| -> TestResult {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let wal = &wal;
                    s.spawn(move || -> Result<usize, String> {
                        let mut polls = 0;
                        for k in 0..per_thread {
                            let ticket = append(wal, t * 1000 + k).map_err(|e| e.to_string())?;
                            let (out, p) = block_on(ticket.durable())?;
                            out.map_err(|e| e.to_string())?;
                            polls += p;
                        }
                        Ok(polls)
                    })
                })
                .collect();
            for h in handles {
                let polls = h.join().map_err(|_| "a thread panicked")??;
                // Each future was pending at its first poll (2 ms syncs), and polled again only
                // when woken.
                assert!(polls >= per_thread as usize * 2, "{polls} polls");
            }
            Ok(())
        })?;
        let appended = threads * per_thread;
        assert!(wal.synced_lsn().0 >= appended);
        // The power goes while the log is open (its handles die with it).
        sim.power_cut_drop_unsynced();
        drop(wal);
        let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
        assert_eq!(replayed.len() as u64, appended, "{threads} threads");
    }
    Ok(())
}

/// Under `Buffered` the future resolves once the append is written to the OS: a process crash
/// right after keeps it.
#[test]
fn a_buffered_append_is_written_when_its_future_resolves() -> TestResult {
    let sim = SimStorage::new(7);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    for i in 1..=10 {
        let ticket = append(&wal, i)?;
        let (out, _) = block_on(ticket.durable())?;
        out?;
        assert!(wal.written_lsn().0 >= i);
    }
    sim.crash_process();
    drop(wal);
    let (_wal, _, replayed) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    assert_eq!(replayed, expected(10));
    Ok(())
}

/// A failed fdatasync fails the waiting futures with the OS error and poisons the log; a
/// future made after that fails at once.
#[test]
fn a_failed_sync_fails_the_future_and_poisons_the_log() -> TestResult {
    let sim = SimStorage::new(3);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    for i in 1..=3 {
        let (out, _) = block_on(append(&wal, i)?.durable())?;
        out?;
    }
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let (out, _) = block_on(append(&wal, 4)?.durable())?;
    match out {
        Err(WalError::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(5)),
        other => return Err(format!("expected EIO, got {other:?}").into()),
    }
    assert!(wal.poisoned().is_some());
    // The barrier of a poisoned log: its future answers the poison at the first poll.
    let (out, polls) = block_on(wal.barrier().durable())?;
    assert!(out.is_err());
    assert_eq!(polls, 1);
    Ok(())
}

/// A future dropped while pending forgets its waker, and its append is still committed (as a
/// dropped ticket's): after a close and reopen, every record is there.
#[test]
fn a_dropped_future_still_lets_its_append_happen() -> TestResult {
    let sim = SimStorage::new(11);
    sim.set_sync_latency(Duration::from_millis(5));
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    let unpark = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    for i in 1..=5 {
        let mut fut = Box::pin(append(&wal, i)?.durable());
        // Pending at the first poll (a 5 ms fdatasync); then dropped.
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    // The log's progress wakes nobody who is gone, and the appends were committed.
    let (out, _) = block_on(wal.barrier().durable())?;
    out?;
    assert!(wal.synced_lsn().0 >= 5);
    sim.power_cut_drop_unsynced();
    drop(wal);
    let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
    assert_eq!(replayed, expected(5));
    Ok(())
}

/// A waker may own the last reference to another future of the same log (a task an executor
/// that is shutting down drops when woken, a `select!` arm's future held by the waker of a
/// task): waking it, or replacing it, then drops that future. The log must not hold its state
/// lock while it wakes or drops wakers, or the writer thread deadlocks on itself.
#[test]
fn a_waker_that_drops_a_future_of_the_same_log_does_not_deadlock() -> TestResult {
    use std::sync::Mutex;
    /// Drops the future it holds when woken.
    struct DropOnWake(
        Mutex<Option<std::pin::Pin<Box<kairos_wal::Durable>>>>,
        Thread,
    );
    impl Wake for DropOnWake {
        fn wake(self: Arc<Self>) {
            drop(self.0.lock().map(|mut held| held.take()));
            self.1.unpark();
        }
    }
    let sim = SimStorage::new(17);
    sim.set_sync_latency(Duration::from_millis(20));
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    let plain = Waker::from(Arc::new(Unpark(
        std::thread::current(),
        AtomicUsize::new(0),
    )));
    // `held` is pending (its waker filed), then handed to the waker of `first`.
    let mut held = Box::pin(append(&wal, 1)?.durable());
    assert!(held
        .as_mut()
        .poll(&mut Context::from_waker(&plain))
        .is_pending());
    let dropper = Arc::new(DropOnWake(Mutex::new(Some(held)), std::thread::current()));
    let mut first = Box::pin(append(&wal, 2)?.durable());
    let dropper_waker = Waker::from(Arc::clone(&dropper));
    assert!(first
        .as_mut()
        .poll(&mut Context::from_waker(&dropper_waker))
        .is_pending());
    drop(dropper_waker);
    drop(dropper);
    // The group commit wakes both; `first` resolves.
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = {
        let wal_sync = wal.sync_handle();
        std::thread::spawn(move || {
            let _ = tx.send(wal_sync.sync());
        })
    };
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(synced) => synced?,
        Err(_) => {
            // The writer thread is stuck on the state lock it holds: leak the log (dropping it
            // would join that thread forever).
            std::mem::forget(wal);
            std::mem::forget(first);
            std::mem::forget(probe);
            return Err(
                "the log deadlocked: a waker dropped a Durable under the state lock".into(),
            );
        }
    }
    probe.join().map_err(|_| "probe panicked")?;
    let (out, _) = block_on(first)?;
    out?;
    Ok(())
}

/// `SyncHandle::sync_async` under `Buffered` (where appends are only written): it resolves
/// once everything appended before it is fdatasynced — a power cut that drops every unsynced
/// byte right after keeps all of it — polled again only when woken.
#[test]
fn sync_async_makes_a_buffered_log_durable() -> TestResult {
    let sim = SimStorage::new(17);
    sim.set_sync_latency(Duration::from_millis(2));
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    for i in 1..=8 {
        append_one(&wal, i)?; // written to the OS, not synced
    }
    let (out, polls) = block_on(wal.sync_handle().sync_async())?;
    out?;
    assert!(polls >= 2, "resolved at its first poll");
    assert!(wal.synced_lsn().0 >= 8);
    // Nothing left to sync: answers at the first poll.
    let (out, polls) = block_on(wal.sync_handle().sync_async())?;
    out?;
    assert_eq!(polls, 1);
    sim.power_cut_drop_unsynced();
    drop(wal);
    let (_wal, _, replayed) = open(&sim, options(Durability::Buffered, 1 << 20))?;
    assert_eq!(replayed, expected(8));
    Ok(())
}

/// A waker that panics when woken (a bug in an executor's code) must not kill the thread that
/// wakes it — the log's writer, whose death poisons the log — nor keep the other futures
/// waiting on the same progress from being woken: the panicking waker's future is filed first,
/// another's after it; the second resolves, nothing is poisoned, and the log takes appends.
#[test]
fn a_waker_that_panics_poisons_nothing_and_the_others_are_woken() -> TestResult {
    struct Panics;
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("an executor's waker panicked (this test's, on purpose)");
        }
    }
    let panicky = Waker::from(Arc::new(Panics));
    let mut exercised = 0;
    for seed in 0..5 {
        let sim = SimStorage::new(20 + seed);
        sim.set_sync_latency(Duration::from_millis(20));
        let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
        let mut first = Box::pin(append(&wal, 1)?.durable());
        // Pending at its first poll on a 20 ms fdatasync (a loaded machine may be slower than
        // that: then this round proves nothing, and the next tries again).
        if first
            .as_mut()
            .poll(&mut Context::from_waker(&panicky))
            .is_pending()
        {
            exercised += 1;
        }
        let (out, _) = block_on(append(&wal, 2)?.durable())?;
        out?;
        assert_eq!(wal.poisoned(), None);
        let (out, _) = block_on(append(&wal, 3)?.durable())?;
        out?;
        drop(first);
        wal.close()?;
        let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
        assert_eq!(replayed, expected(3));
    }
    assert!(exercised > 0, "no round had the panicking waker filed");
    Ok(())
}
