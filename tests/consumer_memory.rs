//! A `Consumer` kept beyond its engine keeps none of the engine's memory:
//! once `Engine::shutdown` returns, or the engine is dropped, the task
//! slab, the payloads (arena and heap), the wheel, the index and the far
//! index are freed although the consumer still holds the engine's shared
//! state; and every answer the consumer (and, after a shutdown, the engine
//! handle) gives is what it gave before they were.
//!
//! Memory is counted exactly: this binary's global allocator adds up the
//! bytes allocated and not freed. One test function, so no other test of
//! this binary allocates meanwhile. Measured when written: 118 MB held by
//! 100 000 in-memory tasks of 1 KiB, 18 MB by 100 000 far tasks (the far
//! index, and the slab and index that held them before the checkpoint);
//! after the close, 42 KB held in each case — the shared state itself and
//! its empty structures (the far index's 256 shards) — where all of it
//! stayed until the consumer was dropped before the fix.

mod common;

use common::{TestResult, START_MS};
use kairos::{
    AckError, Config, Delivery, Due, Durability, Engine, ManualClock, NackOutcome, NewTask,
    RecvError,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to `System` unchanged; the counter is
// only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated and not freed, process-wide.
fn live() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// Tasks of each case.
const TASKS: usize = 100_000;

/// What each case ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    Shutdown,
    Drop,
}

/// Where the tasks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// An in-memory engine, 1 KiB payloads (heap allocations with their key).
    Memory,
    /// On disk, far tasks (their 24-byte entries in the far index).
    Far,
}

fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// One case: `TASKS` tasks, plus three due at once — one received and
/// held, one nacked into a dead letter, one left in the ready queue — and
/// a consumer kept; then `close`. Checks the answers after it, then that
/// the memory went back to within a few KiB of what it was before the
/// engine opened.
fn case(place: Place, close: Close, dir: &Path) -> TestResult {
    let base = live();
    let clock = ManualClock::new(START_MS);
    let mut c = Config::default();
    c.retry.max_attempts = 1;
    c.lease = Duration::from_secs(3600);
    let engine = match place {
        Place::Memory => Engine::in_memory(c, Arc::new(clock.clone()))?,
        Place::Far => {
            c.durability = Durability::Buffered;
            c.checkpoint_log_bytes = None;
            c.checkpoint_interval = None;
            c.payload_prefetch = false;
            common::open_fs(dir, c, &clock)?
        }
    };
    let payload = match place {
        Place::Memory => vec![b'p'; 1024],
        Place::Far => vec![b'p'; 64],
    };
    let keys: Vec<Vec<u8>> = (0..TASKS)
        .map(|i| format!("order:{i:06}:timeout").into_bytes())
        .collect();
    // An hour on (in memory), or two days (beyond the far span).
    let due_ms = match place {
        Place::Memory => START_MS + 3_600_000,
        Place::Far => START_MS + 2 * 86_400_000,
    };
    for chunk in keys.chunks(10_000) {
        let tasks: Vec<NewTask<'_>> = chunk
            .iter()
            .map(|k| NewTask {
                key: k,
                due: at(due_ms),
                payload: &payload,
            })
            .collect();
        engine.schedule_many(&tasks)?;
    }
    drop(keys);
    if place == Place::Far {
        engine.checkpoint()?;
        assert_eq!(engine.stats().far, TASKS);
    }
    for k in ["held", "dead", "ready"] {
        engine.schedule(
            k.as_bytes(),
            at(START_MS + 1_000),
            format!("{k}!").as_bytes(),
        )?;
    }
    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    let consumer = engine.consumer();
    let held: Delivery = consumer.try_recv()?;
    assert_eq!(held.key(), b"held");
    let dead = consumer.try_recv()?;
    assert_eq!(dead.key(), b"dead");
    assert!(matches!(
        consumer.nack(&dead, None, "failed")?,
        NackOutcome::DeadLettered
    ));
    let before = engine.stats();
    assert_eq!(
        (before.scheduled, before.ready, before.in_flight),
        (TASKS, 1, 1)
    );
    assert_eq!((before.pending, before.dead_letters), (TASKS + 2, 1));
    let held_bytes = live() - base;
    eprintln!("{place:?}, {close:?}: {held_bytes} bytes held by the engine");
    assert!(held_bytes > TASKS * payload.len(), "{held_bytes}");

    match close {
        Close::Shutdown => {
            engine.shutdown()?;
            // The handle answers as before: the counters of the state the
            // log was closed with (the ready task taken back), the dead
            // letter listed.
            let mut expected = before;
            expected.scheduled += 1;
            expected.ready = 0;
            assert_eq!(engine.stats(), expected);
            let letters = engine.dead_letters();
            assert_eq!(letters.len(), 1);
            assert_eq!(
                (&letters[0].key[..], &letters[0].payload[..]),
                (&b"dead"[..], &b"dead!"[..])
            );
            assert_eq!(letters[0].error, "failed");
            assert!(matches!(
                engine.schedule(b"more", at(START_MS + 5_000), b""),
                Err(kairos::ScheduleError::Closed)
            ));
            assert!(matches!(
                engine.cancel(b"ready"),
                Err(kairos::CancelError::Closed)
            ));
            // Taken back by the shutdown.
            assert_eq!(consumer.ready(), 0);
            drop(engine);
        }
        Close::Drop => {
            drop(engine);
            // A drop takes nothing back: the ready task is still counted.
            assert_eq!(consumer.ready(), 1);
        }
    }
    // The consumer's answers.
    assert_eq!(consumer.try_recv().err(), Some(RecvError::Closed));
    assert_eq!(consumer.recv().err(), Some(RecvError::Closed));
    assert_eq!(
        consumer.recv_timeout(Duration::from_millis(1)).err(),
        Some(RecvError::Closed)
    );
    assert_eq!(consumer.iter().count(), 0);
    assert!(matches!(consumer.ack(&held), Err(AckError::Closed)));
    assert!(matches!(consumer.ack(&dead), Err(AckError::Closed)));
    assert!(matches!(consumer.ack_many(&[]), Err(AckError::Closed)));
    assert!(matches!(
        consumer.ack_many(&[held.clone(), dead.clone()]),
        Err(AckError::Closed)
    ));
    assert!(matches!(
        consumer.nack(&held, None, "late"),
        Err(AckError::Closed)
    ));
    assert!(matches!(
        consumer.nack(&held, Some(Duration::from_secs(1)), "late"),
        Err(AckError::Closed)
    ));
    assert!(matches!(
        consumer.extend_lease(&held, Duration::from_secs(60)),
        Err(AckError::Closed)
    ));
    assert!(matches!(
        consumer.extend_lease(&held, Duration::ZERO),
        Err(AckError::InvalidLease { .. })
    ));
    assert_eq!(held.payload(), b"held!");
    assert_eq!(consumer.clone().ready(), consumer.ready());

    // The memory: what the consumer and the deliveries keep.
    let kept = live().saturating_sub(base);
    eprintln!("{place:?}, {close:?}: {kept} bytes kept with the consumer");
    assert!(
        kept < 256 << 10,
        "{place:?}, {close:?}: {kept} bytes still held after the engine closed (of {held_bytes})"
    );
    drop((consumer, held, dead));
    Ok(())
}

#[test]
fn a_consumer_kept_beyond_its_engine_keeps_none_of_its_memory() -> TestResult {
    for place in [Place::Memory, Place::Far] {
        for close in [Close::Shutdown, Close::Drop] {
            let dir = tempfile::tempdir()?;
            case(place, close, dir.path())?;
        }
    }
    Ok(())
}
