//! A long-running process that opens and closes engines keeps nothing of
//! them: after each close — `shutdown`, a drop without it (a crash), a drop
//! of a poisoned engine, a failed open of a locked directory — no `kairos-*`
//! thread is left and the process holds as many descriptors as before, also
//! while consumer handles of the closed engines are kept; and the data
//! directory opened again and again stays as small as its (empty) live set.
//!
//! Counted from `/proc/self` (Linux only). One test function, so no other
//! test of this binary opens descriptors or starts threads meanwhile.
//! Measured when written (CI size, `KAIROS_TEST_SCALE=1`, ~2 s): up to 4
//! descriptors and 5 `kairos` threads while an engine runs, none after (a drop
//! that kept the cancels' overflow file open failed it at cycle 10: 7
//! descriptors for 6); the directory 9 files, 34 KiB.
#![cfg(target_os = "linux")]

mod common;

use common::{config, drain, open_fs, scaled, TestResult, START_MS};
use kairos::{Config, Due, Durability, Engine, ManualClock, OpenError, RecvError};
use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
use kairos_wal::SimStorage;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Descriptors the process holds.
fn fds() -> TestResult<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

/// Threads of the process named `kairos…` (the engine's and the log's).
fn kairos_threads() -> TestResult<usize> {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        // A thread that ended meanwhile has no `comm` any more.
        if let Ok(comm) = std::fs::read_to_string(task?.path().join("comm")) {
            if comm.starts_with("kairos") {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// `kairos_threads()` once joined threads are gone from `/proc`: a thread
/// that `join` returned for may still be listed for a moment while the
/// kernel finishes its exit, so this looks again, up to 1000 times.
fn kairos_threads_settled() -> TestResult<usize> {
    for _ in 0..1000 {
        if kairos_threads()? == 0 {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    kairos_threads()
}

/// Files under `dir` (recursively) and their bytes.
fn files(dir: &Path) -> TestResult<(usize, u64)> {
    let (mut n, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                n += 1;
                bytes += meta.len();
            }
        }
    }
    Ok((n, bytes))
}

fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Every background thread on: the checkpointer (log growth, interval,
/// moves of far tasks) and the payload prefetcher.
fn busy() -> Config {
    let mut c = Config::default();
    c.segment_bytes = 64 * 1024;
    c.durability = Durability::Buffered;
    c.checkpoint_log_bytes = Some(64 * 1024);
    c.checkpoint_interval = Some(Duration::from_millis(50));
    c.relocate_far_tasks = Some(50);
    c.payload_prefetch = true;
    c
}

/// Near and far tasks scheduled, checkpointed (far ones leave memory),
/// a third cancelled, the near ones fired and acked, the rest cancelled
/// (far ones read back from their overflow file), checkpointed again, one
/// far task cancelled last (its file kept open): nothing is left live.
fn churn(engine: &Engine, clock: &ManualClock, cycle: usize) -> TestResult {
    let key = |i: usize| format!("c{cycle}-{i}").into_bytes();
    let now = clock.wall_ms();
    for i in 0..100 {
        let due = if i % 2 == 0 {
            now + 1_000 + i as u64
        } else {
            now + 3_600_000 * (1 + i as u64 % 48)
        };
        engine.schedule(&key(i), at(due), &vec![b'p'; 40 + i])?;
    }
    engine.checkpoint()?;
    for i in (0..100).step_by(3) {
        let _ = engine.cancel(&key(i))?;
    }
    clock.advance(Duration::from_secs(2));
    let consumer = engine.consumer();
    for d in drain(engine)? {
        consumer.ack(&d)?;
    }
    for i in 2..100 {
        let _ = engine.cancel(&key(i))?;
    }
    engine.checkpoint()?;
    // After the checkpoint: the overflow file this far task's entry is read
    // from stays open (`Disk::overflow_file`) until the engine closes.
    let _ = engine.cancel(&key(1))?;
    assert_eq!(engine.stats().pending, 0, "cycle {cycle}");
    Ok(())
}

#[test]
fn closed_engines_leave_no_thread_descriptor_or_file_behind() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let clock = ManualClock::new(START_MS);
    let base = fds()?;
    assert_eq!(kairos_threads_settled()?, 0);
    let mut kept = Vec::new();
    let (mut open_fds_max, mut open_threads_max) = (0, 0);
    // 1. Open, churn and close on one directory: by shutdown, by a drop
    // without it, by both; a second open of the busy directory fails.
    let cycles = scaled(30, 600);
    for cycle in 0..cycles {
        let engine = open_fs(&dir, busy(), &clock)?;
        match open_fs(&dir, busy(), &clock) {
            Err(OpenError::Locked { .. }) => {}
            other => return Err(format!("cycle {cycle}: second open: {other:?}").into()),
        }
        churn(&engine, &clock, cycle)?;
        open_fds_max = open_fds_max.max(fds()? - base);
        open_threads_max = open_threads_max.max(kairos_threads()?);
        if cycle % 10 == 0 {
            kept.push(engine.consumer());
        }
        match cycle % 3 {
            0 => engine.shutdown()?,
            1 => {}
            _ => {
                engine.shutdown()?;
                engine.shutdown()?;
            }
        }
        drop(engine);
        assert_eq!(
            (kairos_threads_settled()?, fds()?),
            (0, base),
            "cycle {cycle}: kairos threads and descriptors after the engine closed"
        );
        let (n, bytes) = files(&dir)?;
        assert!(
            n <= 12 && bytes <= 256 * 1024,
            "cycle {cycle}: {n} files, {bytes} bytes for no live task"
        );
    }
    assert!(
        open_threads_max >= 4 && open_fds_max >= 2,
        "the engines did not run their threads ({open_threads_max}) or open their files \
         ({open_fds_max} descriptors)"
    );
    assert!(
        open_fds_max <= 16,
        "{open_fds_max} descriptors while an engine ran"
    );
    // 2. Many directories, one after another, each removed after.
    for cycle in 0..scaled(10, 200) {
        let d = tmp.path().join(format!("d{cycle}"));
        let engine = open_fs(&d, busy(), &clock)?;
        churn(&engine, &clock, cycle)?;
        if cycle % 2 == 0 {
            engine.shutdown()?;
        }
        drop(engine);
        std::fs::remove_dir_all(&d)?;
        assert_eq!(
            (kairos_threads_settled()?, fds()?),
            (0, base),
            "dir {cycle}"
        );
    }
    // 3. Poisoned engines (a failed sync of the log), with a consumer
    // waiting in `recv` on another thread meanwhile, dropped or shut down.
    for cycle in 0..scaled(40, 400) {
        let sim = SimStorage::new(cycle as u64);
        let mut c = config(Durability::Sync);
        c.checkpoint_log_bytes = Some(8 * 1024);
        c.payload_prefetch = true;
        let engine = Engine::open_with(
            PathBuf::from("/kairos"),
            c,
            Arc::new(sim.clone()),
            Arc::new(clock.clone()),
        )?;
        let consumer = engine.consumer();
        let waiting = std::thread::spawn(move || consumer.recv());
        for i in 0..20 {
            engine.schedule(
                format!("p{i}").as_bytes(),
                at(clock.wall_ms() + 5 + i * 3_600_000),
                b"a payload of some length",
            )?;
        }
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        assert!(engine
            .schedule(b"fails", at(clock.wall_ms() + 5), b"")
            .is_err());
        sim.clear_faults();
        assert!(
            engine
                .schedule(b"after", at(clock.wall_ms() + 5), b"")
                .is_err(),
            "cycle {cycle}: not poisoned"
        );
        if cycle % 2 == 0 {
            assert!(engine.shutdown().is_err());
        }
        kept.push(engine.consumer());
        drop(engine);
        match waiting
            .join()
            .map_err(|_| "the waiting consumer panicked")?
        {
            Err(RecvError::Poisoned { .. }) => {}
            other => return Err(format!("cycle {cycle}: recv: {other:?}").into()),
        }
        assert_eq!(
            (kairos_threads_settled()?, fds()?),
            (0, base),
            "poisoned {cycle}"
        );
    }
    // 4. In memory.
    for cycle in 0..scaled(40, 400) {
        let engine = Engine::in_memory(config(Durability::Sync), Arc::new(clock.clone()))?;
        for i in 0..100 {
            engine.schedule(format!("m{i}").as_bytes(), at(clock.wall_ms() + 10), b"m")?;
        }
        clock.advance(Duration::from_millis(20));
        let consumer = engine.consumer();
        for d in drain(&engine)?.iter().step_by(2) {
            consumer.ack(d)?;
        }
        kept.push(consumer);
        drop(engine);
        assert_eq!(
            (kairos_threads_settled()?, fds()?),
            (0, base),
            "in memory {cycle}"
        );
    }
    drop(kept);
    assert_eq!((kairos_threads_settled()?, fds()?), (0, base));
    let (n, bytes) = files(&dir)?;
    eprintln!(
        "while open: up to {open_fds_max} descriptors, {open_threads_max} kairos threads; \
         closed: none; the directory: {n} files, {bytes} bytes"
    );
    Ok(())
}
