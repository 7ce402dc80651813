//! The resident window (`Config::resident_window`, default 1 minute):
//! with the default configuration, waiting first attempts due within the
//! 18-day horizon but later than the window leave memory like far tasks
//! (24 bytes each, key and payload in an overflow file), come back into the
//! wheel once due within the window, and fire on their tick across
//! checkpoints and every kind of reopen; cancel and reschedule find them by
//! key.

mod common;

use common::far::fire_one_minute;
use common::{config, SimHarness, Stop, TaskMap, TestResult, START_MS};
use kairos::config::{HORIZON_DEFAULT, PAYLOAD_WINDOW_DEFAULT, RESIDENT_WINDOW_DEFAULT};
use kairos::{CancelOutcome, Config, Due, Durability, RescheduleOutcome, ScheduleError};
use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60 * SECOND_MS;
const DAY_MS: u64 = 24 * 60 * MINUTE_MS;

/// The default configuration, as tests use it (explicit checkpoints, the
/// driver promoting), with its windows checked.
fn cfg() -> Config {
    let c = config(Durability::Sync);
    assert_eq!(
        (c.horizon, c.resident_window, c.payload_window),
        (
            Some(HORIZON_DEFAULT),
            Some(RESIDENT_WINDOW_DEFAULT),
            Some(PAYLOAD_WINDOW_DEFAULT)
        )
    );
    c
}

fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// The tasks: (key, due after the start in ms, payload). Due in 1 s: within
/// the default resident window. 5 min, 30 min, 7 days and 17 days: within
/// the horizon, beyond the default window (5 min is within a 10-minute
/// one). 30 days: beyond the horizon.
fn tasks() -> Vec<(Vec<u8>, u64, Vec<u8>)> {
    [
        ("one-second", SECOND_MS),
        ("five-minutes", 5 * MINUTE_MS),
        ("half-hour", 30 * MINUTE_MS),
        ("half-hour-b", 30 * MINUTE_MS + 7),
        ("week", 7 * DAY_MS),
        ("week-b", 7 * DAY_MS + 3 * MINUTE_MS),
        ("seventeen-days", 17 * DAY_MS),
        ("month", 30 * DAY_MS),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (k, after))| {
        // Every other payload empty: its key still goes to disk.
        let payload = if i % 2 == 0 {
            Vec::new()
        } else {
            format!("payload of {k} ").repeat(i).into_bytes()
        };
        (k.as_bytes().to_vec(), START_MS + after, payload)
    })
    .collect()
}

/// Runs the clock until every task of `model` has had its chance to fire:
/// a jump to a quarter of an hour before each due time (nothing is due in
/// between), then a minute at a time past it, acking everything. Each task
/// must fire in the minute it is due, once. Returns what fired.
fn fire(h: &SimHarness, model: &TaskMap) -> TestResult<TaskMap> {
    let mut fired = BTreeMap::new();
    let mut dues: Vec<u64> = model.values().map(|(due, _)| *due).collect();
    dues.sort_unstable();
    dues.dedup();
    for due in dues {
        let now = h.clock.wall_ms();
        let jump_to = due.saturating_sub(15 * MINUTE_MS);
        if jump_to > now {
            let got = h.advance(Duration::from_millis(jump_to - now))?;
            assert!(got.is_empty(), "fired during a jump: {:?}", got[0].key());
        }
        while h.clock.wall_ms() <= due {
            fire_one_minute(h, &mut fired)?;
        }
    }
    Ok(fired)
}

#[test]
fn tasks_beyond_the_resident_window_leave_memory_and_fire_on_their_tick() -> TestResult {
    for (seed, stop) in [
        (1, None),
        (2, Some(Stop::Clean)),
        (3, Some(Stop::ProcessCrash)),
        (4, Some(Stop::PowerCut)),
    ] {
        let mut h = SimHarness::new(seed, cfg())?;
        let mut model: TaskMap = BTreeMap::new();
        for (key, due, payload) in tasks() {
            h.engine().schedule(&key, at(due), &payload)?;
            model.insert(key, (due, payload));
        }
        h.engine().checkpoint()?;
        let stats = h.engine().stats();
        // Seven beyond the window, six of them within the horizon; the one
        // within it stays in the wheel.
        assert_eq!((stats.far, stats.pending), (7, 8), "seed {seed}");
        if let Some(stop) = stop {
            h.restart(stop)?;
            let stats = h.engine().stats();
            assert_eq!((stats.far, stats.pending), (7, 8), "{stop:?}");
        }
        assert_eq!(fire(&h, &model)?, model, "seed {seed}");
        let stats = h.engine().stats();
        assert_eq!((stats.far, stats.far_promoted, stats.pending), (0, 7, 0));
    }
    Ok(())
}

#[test]
fn cancel_reschedule_and_duplicates_find_them_by_key_across_a_crash() -> TestResult {
    let mut h = SimHarness::new(5, cfg())?;
    let mut model: TaskMap = BTreeMap::new();
    for (key, due, payload) in tasks() {
        h.engine().schedule(&key, at(due), &payload)?;
        model.insert(key, (due, payload));
    }
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 7);
    let e = h.engine();
    assert!(matches!(
        e.schedule_after(b"week", Duration::from_secs(60), b"x"),
        Err(ScheduleError::AlreadyExists { .. })
    ));
    assert_eq!(
        e.cancel(b"week")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    assert_eq!(e.cancel(b"week")?, CancelOutcome::NotFound);
    model.remove(b"week".as_slice());
    // Sooner, into the resident window, its (non-empty) payload kept from
    // disk.
    let sooner = START_MS + 40 * SECOND_MS;
    assert!(matches!(
        e.reschedule(b"week-b", at(sooner), None)?,
        RescheduleOutcome::Rescheduled(_)
    ));
    let kept = model.remove(b"week-b".as_slice()).ok_or("no week-b")?.1;
    assert!(!kept.is_empty());
    model.insert(b"week-b".to_vec(), (sooner, kept));
    // Later, with a new payload.
    let later = START_MS + 9 * DAY_MS;
    e.reschedule(b"half-hour-b", at(later), Some(b"new"))?;
    model.insert(b"half-hour-b".to_vec(), (later, b"new".to_vec()));
    h.restart(Stop::ProcessCrash)?;
    assert_eq!(h.engine().stats().pending, 7);
    // The cancelled key is free again.
    h.engine()
        .schedule(b"week", at(START_MS + 8 * DAY_MS), b"again")?;
    model.insert(b"week".to_vec(), (START_MS + 8 * DAY_MS, b"again".to_vec()));
    h.engine().checkpoint()?;
    assert_eq!(fire(&h, &model)?, model);
    Ok(())
}

#[test]
fn the_window_is_bounded_by_the_payload_window_and_the_horizon() -> TestResult {
    // (horizon, resident window, payload window) → the far span, and the
    // far tasks of the eight after a checkpoint at the start.
    let minutes = |m: u64| Some(Duration::from_secs(60 * m));
    for (horizon, resident, payload_window, span, far) in [
        // The default: beyond 1 min.
        (Some(HORIZON_DEFAULT), minutes(1), minutes(1), minutes(1), 7),
        // A 10-minute window (the default up to session 14) keeps the
        // 5-minute task.
        (
            Some(HORIZON_DEFAULT),
            minutes(10),
            minutes(1),
            minutes(10),
            6,
        ),
        // A window shorter than the payload window counts as the payload
        // window: beyond 6 min (the 5-minute task stays).
        (Some(HORIZON_DEFAULT), minutes(2), minutes(6), minutes(6), 6),
        // ... and a longer payload window keeps the half hours in memory.
        (
            Some(HORIZON_DEFAULT),
            minutes(2),
            minutes(40),
            minutes(40),
            4,
        ),
        // No window: the horizon alone, beyond 18 days.
        (
            Some(HORIZON_DEFAULT),
            None,
            minutes(1),
            Some(HORIZON_DEFAULT),
            1,
        ),
        // A horizon shorter than the window rules: beyond 2 min.
        (minutes(2), minutes(10), minutes(1), minutes(2), 7),
        // No horizon: nothing goes far.
        (None, minutes(10), minutes(1), None, 0),
    ] {
        let mut c = cfg();
        c.horizon = horizon;
        c.resident_window = resident;
        c.payload_window = payload_window;
        assert_eq!(
            c.far_span(),
            span,
            "{horizon:?} {resident:?} {payload_window:?}"
        );
        let h = SimHarness::new(6, c)?;
        for (key, due, payload) in tasks() {
            h.engine().schedule(&key, at(due), &payload)?;
        }
        h.engine().checkpoint()?;
        assert_eq!(
            h.engine().stats().far,
            far,
            "{horizon:?} {resident:?} {payload_window:?}"
        );
    }
    Ok(())
}

/// A far task is promoted once due within the far span — with a window
/// shorter than the payload window, the payload window: 40 minutes ahead
/// here, not 2.
#[test]
fn promotion_leads_by_the_payload_window_when_the_window_is_shorter() -> TestResult {
    let mut c = cfg();
    c.resident_window = Some(Duration::from_secs(2 * 60));
    c.payload_window = Some(Duration::from_secs(40 * 60));
    let h = SimHarness::new(7, c)?;
    let due = START_MS + 60 * MINUTE_MS;
    h.engine().schedule(b"hour", at(due), b"p")?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 1);
    // 25 minutes on, due in 35: within the 40-minute span, promoted.
    let got = h.advance(Duration::from_millis(25 * MINUTE_MS))?;
    assert!(got.is_empty());
    let stats = h.engine().stats();
    assert_eq!((stats.far, stats.far_promoted, stats.pending), (0, 1, 1));
    let mut model: TaskMap = BTreeMap::new();
    model.insert(b"hour".to_vec(), (due, b"p".to_vec()));
    assert_eq!(fire(&h, &model)?, model);
    Ok(())
}

/// Pins down the clock a task follows (README, "Time"): in the wheel, the
/// monotonic clock; out of it (far), the wall clock, its due time converted
/// again when promoted. With the default window a task due in 30 minutes
/// is far once a checkpoint has moved it, so a wall step back of an hour
/// delays it; with the whole horizon resident it fires after its 30
/// monotonic minutes.
#[test]
fn a_wall_step_back_delays_a_task_only_once_it_is_far() -> TestResult {
    let mut seen = Vec::new();
    for resident in [None, Some(RESIDENT_WINDOW_DEFAULT)] {
        let mut c = cfg();
        c.resident_window = resident;
        let h = SimHarness::new(8, c)?;
        h.engine()
            .schedule(b"order-1", at(START_MS + 30 * MINUTE_MS), b"cancel order 1")?;
        h.engine().checkpoint()?;
        let far = h.engine().stats().far;
        h.clock.step_wall(-60 * MINUTE_MS as i64);
        let got = h.advance(Duration::from_millis(31 * MINUTE_MS))?;
        seen.push((resident, far, got.len()));
    }
    assert_eq!(
        seen,
        vec![(None, 0, 1), (Some(RESIDENT_WINDOW_DEFAULT), 1, 0)]
    );
    Ok(())
}

/// A task already due on the monotonic clock never goes far, whatever its
/// wall-clock due time says after a backward wall step (README, "Time"):
/// the catch-up backlog found at open and held by a pause, the same backlog
/// held back by `catch_up_tasks_per_sec`, and a task placed overdue while
/// deliveries are paused all stay in the wheel through a checkpoint after a
/// wall step back of an hour, and go out at the resume, or at the rate. A
/// checkpoint used to take them out of the wheel as far tasks (due "more
/// than a minute out" by the stepped wall clock), so they waited up to the
/// hour of the step.
#[test]
fn a_task_already_due_stays_in_the_wheel_after_a_wall_step_back() -> TestResult {
    // The backlog found at open, held by a pause.
    let mut h = SimHarness::new(9, cfg())?;
    h.engine().schedule(b"a", at(START_MS + SECOND_MS), b"pa")?;
    h.engine()
        .schedule(b"b", at(START_MS + 2 * SECOND_MS), b"pb")?;
    h.stop(Stop::Clean)?;
    h.clock.advance(Duration::from_secs(10));
    h.config.deliveries_paused = true;
    h.start()?;
    assert_eq!(h.engine().stats().catch_up_backlog, 2);
    h.clock.step_wall(-60 * MINUTE_MS as i64);
    h.engine().checkpoint()?;
    let stats = h.engine().stats();
    assert_eq!((stats.catch_up_backlog, stats.far), (2, 0));
    h.engine().resume_deliveries();
    let got = common::keys(&common::drain(h.engine())?);
    assert_eq!(got, ["a", "b"], "the backlog goes out at the resume");

    // The same backlog, one task a second.
    let mut c = cfg();
    c.catch_up_tasks_per_sec = Some(1);
    let mut h = SimHarness::new(10, c)?;
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        h.engine()
            .schedule(k.as_bytes(), at(START_MS + (i as u64 + 1) * SECOND_MS), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(Duration::from_secs(120));
    h.start()?;
    assert_eq!(common::keys(&common::drain(h.engine())?), ["a"]);
    h.clock.step_wall(-60 * MINUTE_MS as i64);
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 0);
    let got = common::keys(&h.advance(Duration::from_secs(2))?);
    assert_eq!(got, ["b", "c"], "two more seconds, two more tasks");

    // A task placed overdue while paused.
    let h = SimHarness::new(11, cfg())?;
    h.clock.advance(Duration::from_secs(10));
    h.engine().pause_deliveries();
    h.engine()
        .schedule(b"past", at(START_MS + SECOND_MS), b"p")?;
    h.clock.step_wall(-60 * MINUTE_MS as i64);
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 0);
    h.engine().resume_deliveries();
    assert_eq!(common::keys(&common::drain(h.engine())?), ["past"]);
    Ok(())
}
