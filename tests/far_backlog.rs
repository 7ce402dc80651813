//! Far tasks scheduled faster than the checkpointer takes them out of the
//! wheel: a move also starts by bytes (`Config::relocate_far_bytes`), and
//! producers wait while the move is behind (`Shared::await_relocation`),
//! so memory stays bounded whatever the payload size and producer speed.

mod common;

use common::far::{at, cfg, due, fire_all, key};
use common::gate::{Gate, GateStorage};
use common::{wait_until, TaskMap, TestResult, START_MS};
use kairos::{CancelOutcome, Engine, ManualClock};
use kairos_wal::storage::OpenMode;
use kairos_wal::SimStorage;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// An engine on gated simulated storage, moving far tasks after `count` of
/// them or `bytes` of their keys and payloads, with no checkpoint trigger.
fn open(gate: &Arc<Gate>, clock: &ManualClock, count: u64, bytes: u64) -> TestResult<Engine> {
    let storage = GateStorage {
        inner: SimStorage::new(5),
        gate: Arc::clone(gate),
    };
    let mut c = cfg();
    c.relocate_far_tasks = Some(count);
    c.relocate_far_bytes = bytes;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    Ok(Engine::open_with(
        "/kairos",
        c,
        Arc::new(storage),
        Arc::new(clock.clone()),
    )?)
}

/// Schedules far task `i` with a payload of `len` bytes.
fn schedule(engine: &Engine, i: usize, len: usize, model: &mut TaskMap) -> TestResult {
    let payload = vec![b'a' + (i % 26) as u8; len];
    engine.schedule(&key(i), at(due(i)), &payload)?;
    model.insert(key(i), (due(i), payload));
    Ok(())
}

/// With a count far out of reach, the bytes start the move: ten tasks of
/// 196 bytes (96 counted for the wheel's own memory, an 8-byte key, a
/// 92-byte payload) against a 1 960-byte setting.
#[test]
fn far_tasks_leave_the_wheel_once_their_bytes_reach_relocate_far_bytes() -> TestResult {
    let gate = Arc::new(Gate::default());
    let clock = ManualClock::new(START_MS);
    let engine = open(&gate, &clock, 1_000_000, 1_960)?;
    let mut model = TaskMap::new();
    for i in 0..9 {
        schedule(&engine, i, 92, &mut model)?;
    }
    assert_eq!(engine.stats().far, 0, "1 764 bytes are not enough");
    schedule(&engine, 9, 92, &mut model)?;
    wait_until("10 far tasks", || engine.stats().far == 10)?;
    assert_eq!(engine.stats().pending, 10);
    assert_eq!(fire_all(&engine, &clock, due(9) + 60_000)?, model);
    Ok(())
}

/// A move held at its file's creation: producers go on until the tasks it
/// takes out and those arrived since it started are twice the setting, then
/// a schedule (of any task) waits — cancels do not — until the move ends;
/// nothing is lost or fired twice.
#[test]
fn producers_wait_while_far_tasks_outrun_the_move() -> TestResult {
    let gate = Arc::new(Gate::default());
    let clock = ManualClock::new(START_MS);
    let engine = open(&gate, &clock, 10, 1 << 30)?;
    let mut model = TaskMap::new();
    gate.arm_mode(Path::new("/kairos/overflow"), OpenMode::CreateNew);
    // The 10th starts a move, held when it creates its file.
    for i in 0..10 {
        schedule(&engine, i, 8, &mut model)?;
    }
    gate.wait_hit();
    // Ten more arrive while it is held: none waits (the 10th sets the
    // backlog: with the 10 being moved, twice the setting in memory).
    for i in 10..20 {
        schedule(&engine, i, 8, &mut model)?;
    }
    std::thread::scope(|s| -> TestResult {
        let (done_tx, done_rx) = mpsc::channel();
        let engine = &engine;
        let producer = s.spawn(move || -> TestResult<TaskMap> {
            let mut mine = TaskMap::new();
            schedule(engine, 20, 8, &mut mine)?;
            // A near task waits too (due in 10 minutes, within the horizon).
            let near = START_MS + 600_000;
            engine.schedule(b"near", at(near), b"n")?;
            mine.insert(b"near".to_vec(), (near, b"n".to_vec()));
            done_tx.send(()).map_err(|e| e.to_string())?;
            Ok(mine)
        });
        // Held back while the move is: a wait that cannot end by itself.
        let held = done_rx.recv_timeout(Duration::from_millis(200));
        // Cancels are not held back.
        let cancelled = engine.cancel(&key(3));
        // Released before anything is asserted: a failing test must not
        // leave the checkpointer blocked (closing the engine joins it).
        gate.release();
        assert_eq!(
            held,
            Err(mpsc::RecvTimeoutError::Timeout),
            "a schedule went through while the move was twice behind"
        );
        assert_eq!(cancelled?, CancelOutcome::Cancelled { deliveries: 0 });
        model.remove(&key(3));
        let mine = producer.join().map_err(|_| "producer panicked")??;
        model.extend(mine);
        Ok(())
    })?;
    // Everything scheduled while it was held leaves the wheel in the moves
    // that follow; task 20 is counted toward the next one.
    wait_until("19 far tasks", || engine.stats().far >= 19)?;
    assert_eq!(engine.stats().pending, 21);
    assert_eq!(fire_all(&engine, &clock, due(20) + 60_000)?, model);
    Ok(())
}
