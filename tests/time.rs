//! Time at tick granularity, as the README states it: due times round *up* to the tick (never
//! early, at most a tick late), "a due time already past fires at once", tasks that fell due
//! while the engine was closed are delivered promptly after open and counted in
//! `Recovery::overdue`, and (per the engine's own comment) the tick grid starts on a
//! wall-clock tick boundary so a task due on a boundary fires exactly then.
//!
//! These use a coarse 10 ms tick and a manual clock, where every millisecond is visible.

mod common;

use common::{config, drain, SimHarness, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::{Config, Durability, Engine, ManualClock};
use std::sync::Arc;
use std::time::Duration;

const TICK_MS: u64 = 10;

fn coarse() -> Config {
    let mut c = config(Durability::Sync);
    c.tick = Duration::from_millis(TICK_MS);
    c
}

/// Advances 1 ms at a time until something comes out; returns the wall time it came out at.
fn first_delivery_at(h: &SimHarness, limit_ms: u64) -> TestResult<Option<u64>> {
    for _ in 0..limit_ms {
        if !h.advance(Duration::from_millis(1))?.is_empty() {
            return Ok(Some(h.clock.wall_ms()));
        }
    }
    Ok(None)
}

#[test]
fn due_times_round_up_to_the_tick_never_early_at_most_a_tick_late() -> TestResult {
    // START_MS is on a 10 ms boundary, so the grid is too.
    for due_offset in [1u64, 9, 10, 11, 15, 20, 1_234] {
        let h = SimHarness::new(due_offset, coarse())?;
        h.engine()
            .schedule_at(b"t", ms_to_system_time(START_MS + due_offset), b"")?;
        let at = first_delivery_at(&h, due_offset + 2 * TICK_MS)?.ok_or("never fired")?;
        assert_eq!(
            at,
            START_MS + due_offset.div_ceil(TICK_MS) * TICK_MS,
            "due at +{due_offset} ms"
        );
    }
    Ok(())
}

/// README: "a due time already past fires at once". Here the due time is 1 ms in the past
/// but inside the current 10 ms tick.
#[test]
fn past_due_time_inside_the_current_tick_fires_at_once() -> TestResult {
    let h = SimHarness::new(1, coarse())?;
    assert!(h.advance(Duration::from_millis(5))?.is_empty());
    h.engine()
        .schedule_at(b"past", ms_to_system_time(START_MS + 4), b"")?;
    let ds = drain(h.engine())?;
    assert_eq!(
        ds.len(),
        1,
        "a task due 1 ms ago was not handed out at once (it waits for the next tick at +10 ms)"
    );
    Ok(())
}

/// README: tasks that fell due while the engine was closed are delivered promptly after open;
/// `Recovery::overdue` counts them. Here the engine reopens at +12 ms; the task was due at
/// +11 ms, inside the tick that the reopened engine's grid starts in.
#[test]
fn task_due_during_downtime_is_overdue_at_open_with_a_coarse_tick() -> TestResult {
    let mut h = SimHarness::new(2, coarse())?;
    h.engine()
        .schedule_at(b"closed", ms_to_system_time(START_MS + 11), b"")?;
    h.stop(Stop::Clean)?;
    h.clock.advance(Duration::from_millis(12));
    h.start()?;
    let overdue = h.engine().recovery().overdue;
    let at_open = drain(h.engine())?.len();
    assert_eq!(
        (overdue, at_open),
        (1, 1),
        "a task that fell due while closed is neither counted overdue nor delivered at open"
    );
    Ok(())
}

/// The engine starts its tick grid on a wall-clock tick boundary "so that a task due at a
/// whole millisecond fires at that millisecond rather than up to a tick later". A fresh clock
/// (monotonic time zero, as `Engine::open` gives with a new `SystemClock`) must not defeat
/// that: here the wall clock starts 3 ms past a boundary and the task is due on the next one.
#[test]
fn tick_grid_is_aligned_to_wall_clock_on_a_fresh_clock() -> TestResult {
    let clock = ManualClock::new(START_MS + 3);
    let engine = Engine::in_memory(coarse(), Arc::new(clock.clone()))?;
    engine.schedule_at(b"boundary", ms_to_system_time(START_MS + 10), b"")?;
    let mut fired_at = None;
    for _ in 0..20 {
        clock.advance(Duration::from_millis(1));
        if !drain(&engine)?.is_empty() {
            fired_at = Some(clock.wall_ms() - START_MS);
            break;
        }
    }
    assert_eq!(
        fired_at,
        Some(10),
        "due on a wall-clock tick boundary (+10 ms), fired at +{fired_at:?} ms"
    );
    engine.shutdown()?;
    Ok(())
}

/// The same with a clock whose monotonic time is well past zero: the alignment works there.
#[test]
fn tick_grid_is_aligned_to_wall_clock_on_a_running_clock() -> TestResult {
    let clock = ManualClock::new(START_MS + 3);
    clock.advance_monotonic(Duration::from_secs(1));
    let engine = Engine::in_memory(coarse(), Arc::new(clock.clone()))?;
    engine.schedule_at(b"boundary", ms_to_system_time(START_MS + 10), b"")?;
    let mut fired_at = None;
    for _ in 0..20 {
        clock.advance(Duration::from_millis(1));
        if !drain(&engine)?.is_empty() {
            fired_at = Some(clock.wall_ms() - START_MS);
            break;
        }
    }
    assert_eq!(fired_at, Some(10));
    engine.shutdown()?;
    Ok(())
}
