//! Paused deliveries (`Engine::pause_deliveries`, `Engine::resume_deliveries`,
//! `Config::deliveries_paused`) on a manual clock: while paused nothing is handed out, no
//! lease expiry is processed and nothing is logged as delivered, while schedule, cancel,
//! reschedule, ack, checkpoints and promotions of far tasks go on; resume catches up in due
//! order; the catch-up rate limit counts from the resume; a paused open that crashes leaves no
//! delivery behind to count as an attempt.

mod common;

use common::{config, drain, SimHarness, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::{
    AckError, CancelOutcome, Config, Delivery, Due, Durability, RescheduleOutcome, TaskId,
};
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Due `offset_ms` after [`START_MS`].
fn at(offset_ms: u64) -> Due {
    Due::At(ms_to_system_time(START_MS + offset_ms))
}

/// Sync, a 1 s lease, 3 attempts, retries 1 s after a failed attempt (no jitter).
fn cfg(paused: bool) -> Config {
    let mut c = config(Durability::Sync);
    c.lease = ms(1_000);
    c.retry.max_attempts = 3;
    c.retry.backoff_initial = ms(1_000);
    c.retry.backoff_multiplier = 1;
    c.retry.backoff_max = ms(1_000);
    c.retry.backoff_jitter_percent = 0;
    c.deliveries_paused = paused;
    c
}

/// `(key, attempt, fired_ms)` of each delivery, in order.
fn seen(ds: &[Delivery]) -> Vec<(String, u32, u64)> {
    ds.iter()
        .map(|d| {
            (
                String::from_utf8_lossy(d.key()).into_owned(),
                d.attempt(),
                d.fired_ms(),
            )
        })
        .collect()
}

fn owned(v: &[(&str, u32, u64)]) -> Vec<(String, u32, u64)> {
    v.iter().map(|&(k, a, f)| (k.to_owned(), a, f)).collect()
}

/// Opened paused, an engine hands out nothing however far the clock moves, while cancel and
/// reschedule work; resume hands out everything due, overdue first then in due order, each
/// once; across a clean restart too (the config opens it paused again).
#[test]
fn opened_paused_hands_out_nothing_until_resumed() -> TestResult {
    let mut h = SimHarness::new(7_100, cfg(true))?;
    assert!(h.engine().deliveries_paused());
    let e = h.engine();
    let ids: Vec<TaskId> = ["a", "b", "c", "d"]
        .iter()
        .zip([3_000, 1_000, 2_000, 4_000])
        .map(|(k, due)| e.schedule(k.as_bytes(), at(due), b"p"))
        .collect::<Result<_, _>>()?;
    assert_eq!(ids.len(), 4);
    h.clock.advance(ms(10_000));
    assert!(drain(e)?.is_empty(), "handed out while paused");
    // Already past: overdue, but paused.
    e.schedule(b"late", at(500), b"")?;
    assert!(drain(e)?.is_empty());
    assert_eq!(e.cancel(b"c")?, CancelOutcome::Cancelled { deliveries: 0 });
    assert_eq!(
        e.reschedule(b"d", at(9_500), None)?,
        RescheduleOutcome::Rescheduled(ids[3])
    );
    let s = e.stats();
    assert_eq!((s.scheduled, s.ready, s.in_flight, s.pending), (4, 0, 0, 4));

    // Nothing was logged as delivered: a clean restart opens paused again.
    h.restart(Stop::Clean)?;
    let e = h.engine();
    assert!(e.deliveries_paused());
    assert_eq!((e.recovery().pending, e.recovery().redelivered), (4, 0));
    h.clock.advance(ms(1_000));
    assert!(drain(e)?.is_empty());

    e.resume_deliveries();
    assert!(!e.deliveries_paused());
    let now = START_MS + 11_000;
    let got = drain(e)?;
    // The catch-up backlog found at open (everything was due), oldest first.
    assert_eq!(
        seen(&got),
        owned(&[
            ("late", 1, now),
            ("b", 1, now),
            ("a", 1, now),
            ("d", 1, now)
        ])
    );
    e.ack_many(&got)?;
    assert_eq!(e.stats().pending, 0);
    Ok(())
}

/// Paused at run time: tasks handed out before stay receivable; tasks falling due wait; a
/// lease that runs out is over for its holder (ack refused) but its expiry waits for the
/// resume, which retries it after its backoff and hands out what fell due, in due order.
#[test]
fn paused_at_run_time_then_resumed() -> TestResult {
    let h = SimHarness::new(7_101, cfg(false))?;
    let e = h.engine();
    e.schedule(b"early", at(1_000), b"")?;
    e.schedule(b"mid", at(2_000), b"")?;
    e.schedule(b"late", at(3_000), b"")?;
    h.clock.advance(ms(1_000));
    e.run_until_idle();
    assert_eq!(e.stats().ready, 1);

    e.pause_deliveries();
    e.pause_deliveries(); // idempotent
    h.clock.advance(ms(5_000));
    let got = drain(e)?;
    assert_eq!(seen(&got), owned(&[("early", 1, START_MS + 1_000)]));
    // Received at 6 s, its 1 s lease runs out at 7 s: then refused, but its expiry is not
    // processed while paused. A task scheduled in the past waits too.
    h.clock.advance(ms(2_000));
    e.schedule(b"past", at(500), b"")?;
    assert!(drain(e)?.is_empty());
    assert!(matches!(e.ack(&got[0]), Err(AckError::LeaseExpired { .. })));
    let s = e.stats();
    assert_eq!((s.scheduled, s.ready, s.in_flight), (3, 0, 1));

    e.resume_deliveries();
    e.resume_deliveries(); // idempotent
    let now = START_MS + 8_000;
    let got = drain(e)?;
    assert_eq!(
        seen(&got),
        owned(&[("past", 1, now), ("mid", 1, now), ("late", 1, now)])
    );
    e.ack_many(&got)?;
    // "early" failed its first attempt at the resume; retried 1 s later.
    let s = e.stats();
    assert_eq!((s.scheduled, s.in_flight, s.pending), (1, 0, 1));
    h.clock.advance(ms(999));
    assert!(drain(e)?.is_empty());
    h.clock.advance(ms(1));
    let got = drain(e)?;
    assert_eq!(seen(&got), owned(&[("early", 2, START_MS + 9_000)]));
    e.ack_many(&got)?;
    assert_eq!(e.stats().pending, 0);
    Ok(())
}

/// A paused open writes no delivery: killed before any shutdown, the next open finds no
/// delivery in flight, so the backlog is delivered at attempt 1 (an unpaused open that
/// crashed counts its deliveries as attempts: attempt 2).
#[test]
fn a_crash_after_a_paused_open_counts_no_attempt() -> TestResult {
    for (paused, attempt) in [(true, 1), (false, 2)] {
        let mut h = SimHarness::new(7_102, cfg(false))?;
        h.engine().schedule(b"x", at(1_000), b"")?;
        h.engine().schedule(b"y", at(2_000), b"")?;
        h.stop(Stop::Clean)?;
        h.clock.advance(ms(5_000));
        h.config.deliveries_paused = paused;
        h.start()?;
        h.engine().run_until_idle();
        h.restart(Stop::ProcessCrash)?;
        assert_eq!(
            h.engine().recovery().redelivered,
            2 - usize::from(paused) * 2
        );
        h.engine().resume_deliveries();
        let got = drain(h.engine())?;
        let now = START_MS + 5_000;
        assert_eq!(
            seen(&got),
            owned(&[("x", attempt, now), ("y", attempt, now)]),
            "paused: {paused}"
        );
    }
    Ok(())
}

/// With a catch-up rate limit, a resume after a long pause does not release the backlog found
/// at open all at once: the rate counts from the resume.
#[test]
fn catch_up_rate_counts_from_the_resume() -> TestResult {
    let mut c = cfg(false);
    c.catch_up_tasks_per_sec = Some(1_000);
    let mut h = SimHarness::new(7_103, c)?;
    for i in 0..50u64 {
        h.engine()
            .schedule(format!("t{i:02}").as_bytes(), at(1_000 + i), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(ms(60_000));
    h.config.deliveries_paused = true;
    h.start()?;
    let e = h.engine();
    h.clock.advance(ms(10_000));
    assert!(drain(e)?.is_empty());
    e.resume_deliveries();
    // One at once, then one per millisecond.
    let got = drain(e)?;
    assert_eq!(got.len(), 1);
    h.clock.advance(ms(9));
    let more = drain(e)?;
    assert_eq!(more.len(), 9);
    let keys: Vec<String> = got
        .iter()
        .chain(&more)
        .map(|d| String::from_utf8_lossy(d.key()).into_owned())
        .collect();
    let expected: Vec<String> = (0..10).map(|i| format!("t{i:02}")).collect();
    assert_eq!(keys, expected);
    Ok(())
}

/// Far tasks are promoted while paused (out of the overflow store, into the wheel), and handed
/// out at the resume; a checkpoint taken while paused, and a reopen, lose nothing.
#[test]
fn far_tasks_promoted_while_paused_fire_at_the_resume() -> TestResult {
    let day = 86_400_000u64;
    let mut h = SimHarness::new(7_104, cfg(false))?;
    h.engine().schedule(b"far", at(30 * day), b"far payload")?;
    h.engine().schedule(b"near", at(1_000), b"near payload")?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, 1);
    h.engine().pause_deliveries();
    h.clock.advance(ms(30 * day + 5_000));
    assert!(drain(h.engine())?.is_empty());
    let s = h.engine().stats();
    assert_eq!((s.far, s.far_promoted, s.scheduled), (0, 1, 2));
    h.engine().checkpoint()?;
    h.restart(Stop::ProcessCrash)?;
    // Opened unpaused (its config): both handed out at once, oldest first.
    let got = drain(h.engine())?;
    let now = START_MS + 30 * day + 5_000;
    assert_eq!(seen(&got), owned(&[("near", 1, now), ("far", 1, now)]));
    assert_eq!(got[1].payload(), b"far payload");
    Ok(())
}

/// A resume after 30 days paused: the wheel catches up in one pass — what fell due, in due
/// order, a far task promoted meanwhile included, nothing early, nothing twice.
#[test]
fn a_month_paused_then_resumed() -> TestResult {
    let day = 86_400_000u64;
    let h = SimHarness::new(7_105, cfg(false))?;
    let e = h.engine();
    e.pause_deliveries();
    e.schedule(b"d29", at(29 * day), b"")?;
    e.schedule(b"d40", at(40 * day), b"")?;
    e.schedule(b"s1", at(1_000), b"")?;
    e.schedule(b"d20", at(20 * day), b"")?;
    e.checkpoint()?;
    for _ in 0..30 {
        h.clock.advance(ms(day));
        assert!(drain(e)?.is_empty());
    }
    e.resume_deliveries();
    let now = START_MS + 30 * day;
    let got = drain(e)?;
    assert_eq!(
        seen(&got),
        owned(&[("s1", 1, now), ("d20", 1, now), ("d29", 1, now)])
    );
    e.ack_many(&got)?;
    h.clock.advance(ms(10 * day - 1));
    assert!(drain(e)?.is_empty());
    h.clock.advance(ms(1));
    let got = drain(e)?;
    assert_eq!(seen(&got), owned(&[("d40", 1, now + 10 * day)]));
    Ok(())
}

/// A task due at once, rescheduled into the wheel before the driver took it from the overdue
/// queue, is handed out at its new time in due order — not ahead of a task due before it
/// (its stale overdue entry once passed for live when the same pass expired it in the
/// wheel). Found by the model test (tests/model.rs) with pauses.
#[test]
fn a_task_rescheduled_out_of_the_overdue_queue_keeps_due_order() -> TestResult {
    let h = SimHarness::new(7_106, cfg(true))?;
    let e = h.engine();
    e.schedule(b"now", at(0), b"")?;
    e.schedule(b"one", at(1), b"")?;
    h.clock.advance(ms(1));
    assert_eq!(
        e.reschedule(b"now", at(2), None)?,
        RescheduleOutcome::Rescheduled(TaskId(1))
    );
    h.clock.advance(ms(1));
    assert!(drain(e)?.is_empty());
    e.resume_deliveries();
    let got = drain(e)?;
    let now = START_MS + 2;
    assert_eq!(seen(&got), owned(&[("one", 1, now), ("now", 1, now)]));
    Ok(())
}

/// Placed while paused with a due time already past — a schedule, a reschedule, a nack
/// asking for a retry now — a task keeps its place in due order at the resume among the
/// tasks that fell due during the pause; only one due before the pause began comes ahead of
/// them all (found by a reviewing helper: all of them came first).
#[test]
fn placed_in_the_past_while_paused_keeps_due_order() -> TestResult {
    let h = SimHarness::new(7_107, cfg(false))?;
    let e = h.engine();
    e.schedule(b"x", at(100), b"")?;
    e.schedule(b"y", at(100), b"")?;
    h.clock.advance(ms(100));
    let held = drain(e)?;
    assert_eq!(
        seen(&held),
        owned(&[("x", 1, START_MS + 100), ("y", 1, START_MS + 100)])
    );
    e.pause_deliveries();
    e.schedule(b"a", at(1_000), b"")?;
    e.schedule(b"b", at(2_000), b"")?;
    e.schedule(b"r", at(9_000), b"")?;
    h.clock.advance(ms(950));
    // A retry due now (1.05 s), while paused.
    assert!(matches!(
        e.nack(&held[1], Some(Duration::ZERO), "again")?,
        kairos::NackOutcome::Retry {
            next_attempt: 2,
            ..
        }
    ));
    h.clock.advance(ms(9_050));
    e.schedule(b"c", at(1_500), b"")?; // past, after the pause began
    e.schedule(b"old", at(50), b"")?; // past, before the pause began
    assert_eq!(
        e.reschedule(b"r", at(500), None)?,
        RescheduleOutcome::Rescheduled(TaskId(5))
    );
    assert!(drain(e)?.is_empty());
    e.resume_deliveries();
    let now = START_MS + 10_100;
    let got = drain(e)?;
    // x's lease ran out at 1.1 s: its retry is 1 s after the resume.
    assert_eq!(
        seen(&got),
        owned(&[
            ("old", 1, now),
            ("r", 1, now),
            ("a", 1, now),
            ("y", 2, now),
            ("c", 1, now),
            ("b", 1, now),
        ])
    );
    Ok(())
}

/// While paused, a task waiting in the overdue queue (due before the pause began) that is
/// rescheduled to such a due time again is placed anew: at the resume it comes after the
/// tasks placed before its reschedule — "in the order they were placed", as a task
/// rescheduled in the wheel goes after those already at its tick — also once the queue has
/// been compacted. Its first entry used to pass for live and hand it out at its old place
/// (found by the `engine_model` fuzz target once it paused and resumed).
#[test]
fn a_task_rescheduled_within_the_overdue_queue_goes_to_its_back() -> TestResult {
    let h = SimHarness::new(7_108, cfg(false))?;
    let e = h.engine();
    e.pause_deliveries();
    e.schedule(b"first", at(0), b"")?;
    e.schedule(b"second", at(0), b"")?;
    assert_eq!(
        e.reschedule(b"first", at(0), None)?,
        RescheduleOutcome::Rescheduled(TaskId(1))
    );
    e.schedule(b"third", at(0), b"")?;
    e.resume_deliveries();
    let got = drain(e)?;
    assert_eq!(
        seen(&got),
        owned(&[
            ("second", 1, START_MS),
            ("first", 1, START_MS),
            ("third", 1, START_MS)
        ])
    );
    e.ack_many(&got)?;

    // Past the compaction threshold (1 024 entries): the last entry of each task is kept.
    e.pause_deliveries();
    e.schedule(b"b", at(0), b"")?;
    e.schedule(b"a", at(0), b"")?;
    for _ in 0..1_100 {
        e.reschedule(b"b", at(0), None)?;
    }
    e.resume_deliveries();
    let got = drain(e)?;
    assert_eq!(seen(&got), owned(&[("a", 1, START_MS), ("b", 1, START_MS)]));
    Ok(())
}
