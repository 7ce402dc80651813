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

/// A manual clock whose wall time can be stepped without waking the engine (a reading may be
/// taken under the engine's lock, which a waker takes) and, once armed, steps back by an hour
/// right after its next reading — as if another thread (or NTP) stepped it between
/// `run_until_idle` taking its target and the driver's next pass.
#[derive(Debug)]
struct StepsBackAfterNextRead {
    inner: ManualClock,
    armed: std::sync::atomic::AtomicBool,
    /// Milliseconds added to the inner clock's wall time.
    offset_ms: std::sync::atomic::AtomicI64,
}

impl kairos::Clock for StepsBackAfterNextRead {
    fn now_wall(&self) -> std::time::SystemTime {
        self.now_wall_and_monotonic().0
    }
    fn now_monotonic(&self) -> Duration {
        self.now_wall_and_monotonic().1
    }
    fn now_wall_and_monotonic(&self) -> (std::time::SystemTime, Duration) {
        use std::sync::atomic::Ordering::SeqCst;
        let (wall, monotonic) = self.inner.now_wall_and_monotonic();
        let offset_ms = self.offset_ms.load(SeqCst);
        let wall = if offset_ms >= 0 {
            wall + Duration::from_millis(offset_ms.unsigned_abs())
        } else {
            wall - Duration::from_millis(offset_ms.unsigned_abs())
        };
        if self.armed.swap(false, SeqCst) {
            self.offset_ms.fetch_sub(3_600_000, SeqCst);
        }
        (wall, monotonic)
    }
    fn is_manual(&self) -> bool {
        true
    }
    fn register_waker(&self, waker: std::task::Waker) {
        self.inner.register_waker(waker);
    }
    fn unregister_waker(&self, waker: &std::task::Waker) {
        self.inner.unregister_waker(waker);
    }
}

/// `run_until_idle` returns when the wall clock is stepped back after it read its target: the
/// driver's passes then read the earlier time and never reach that target (it spun, waking
/// the driver for ever). A task due by the monotonic clock still fires.
#[test]
fn run_until_idle_returns_when_the_wall_clock_steps_back_meanwhile() -> TestResult {
    let clock = Arc::new(StepsBackAfterNextRead {
        inner: ManualClock::new(START_MS),
        armed: std::sync::atomic::AtomicBool::new(false),
        offset_ms: std::sync::atomic::AtomicI64::new(0),
    });
    let engine = Arc::new(Engine::in_memory(config(Durability::Sync), clock.clone())?);
    engine.schedule_after(b"k", Duration::from_millis(5), b"p")?;
    clock.inner.advance(Duration::from_millis(5));
    engine.run_until_idle();
    // The driver is idle, waiting for the clock to move. The wall clock moves 10 ms without
    // waking it, so the next run_until_idle's target (the next reading) is ahead of the
    // driver's last pass; the pass it asks for reads an hour earlier than that target.
    clock
        .offset_ms
        .store(10, std::sync::atomic::Ordering::SeqCst);
    clock.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || {
            engine.run_until_idle();
            let _ = tx.send(());
        })
    };
    // Generous: the call takes microseconds; before the fix it never returned.
    let returned = rx.recv_timeout(Duration::from_secs(60)).is_ok();
    assert!(
        returned,
        "run_until_idle did not return after a backward wall step"
    );
    let _ = waiter.join();
    assert_eq!(
        clock.offset_ms.load(std::sync::atomic::Ordering::SeqCst),
        10 - 3_600_000,
        "the wall clock was not stepped back"
    );
    let got = drain(&engine)?;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key(), b"k");
    engine.shutdown()?;
    Ok(())
}

/// A [`ManualClock`] whose next combined reading on the driver's thread, once armed, gives a
/// wall time `lag_ms` older than the monotonic one — as when the driver is preempted between
/// reading the wall clock and the monotonic clock.
#[derive(Debug)]
struct PreemptedDriver {
    inner: ManualClock,
    lag_ms: u64,
    armed: std::sync::atomic::AtomicBool,
}

impl kairos::Clock for PreemptedDriver {
    fn now_wall(&self) -> std::time::SystemTime {
        self.inner.now_wall()
    }
    fn now_monotonic(&self) -> Duration {
        self.inner.now_monotonic()
    }
    fn now_wall_and_monotonic(&self) -> (std::time::SystemTime, Duration) {
        let (wall, mono) = self.inner.now_wall_and_monotonic();
        if std::thread::current().name() == Some("kairos-driver")
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            (wall - Duration::from_millis(self.lag_ms), mono)
        } else {
            (wall, mono)
        }
    }
    fn is_manual(&self) -> bool {
        true
    }
    fn register_waker(&self, waker: std::task::Waker) {
        self.inner.register_waker(waker);
    }
    fn unregister_waker(&self, waker: &std::task::Waker) {
        self.inner.unregister_waker(waker);
    }
}

/// `Delivery::fired_ms` is the wall time at hand-out: read after the monotonic reading that
/// made the task due, so a driver preempted between its two clock readings does not stamp a
/// task with a wall time before its due time (it did, by the length of the preemption: seen
/// 1–2 ms early on a loaded machine by a helper's kill hunt).
#[test]
fn fired_ms_is_never_before_due_when_the_driver_is_preempted_between_its_clock_readings(
) -> TestResult {
    let inner = ManualClock::new(START_MS);
    let clock = Arc::new(PreemptedDriver {
        inner: inner.clone(),
        lag_ms: 5,
        armed: false.into(),
    });
    let engine = Engine::open_with(
        "/data",
        config(Durability::Sync),
        Arc::new(kairos_wal::SimStorage::new(7)),
        Arc::clone(&clock) as Arc<dyn kairos::Clock>,
    )?;
    engine.schedule(
        b"k",
        kairos::Due::At(ms_to_system_time(START_MS + 100)),
        b"",
    )?;
    // The driver sleeps until the clock moves; its first reading after the move lags.
    engine.run_until_idle();
    clock.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    inner.advance(Duration::from_millis(100));
    engine.run_until_idle();
    let got = drain(&engine)?;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].due_ms(), got[0].fired_ms()),
        (START_MS + 100, START_MS + 100)
    );
    assert!(
        !clock.armed.load(std::sync::atomic::Ordering::SeqCst),
        "the lag was read"
    );
    engine.shutdown()?;
    Ok(())
}
