//! Delivery semantics (issue 4) on a manual clock: leases and their expiry, heartbeats,
//! retries with backoff at exact times, dead letters (requeue, purge), cancel outcomes with
//! retries, upsert/reschedule, the catch-up backlog at open with and without a rate limit,
//! wall-clock steps, slow consumers and backpressure, at-most-once mode, and many consumers
//! with prompt acks. Everything that is persisted is also checked across a reopen.
//!
//! Time only moves when a test moves it (`ManualClock`); after every move the test waits for
//! the driver (`run_until_idle`), so every assertion is on exact values. Real threads race only
//! where that is the point (many consumers, a producer against slow consumers, and one bug
//! reproduction at the end), and no assertion depends on real time.

mod common;

use common::{config, drain, key, keys, scaled, SimHarness, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::{
    AckError, CancelOutcome, Config, Delivery, DeliveryGuarantee, Due, Durability, Engine,
    ManualClock, NackOutcome, NewTask, RecvError, RescheduleOutcome, ScheduleError, Stats, TaskId,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// `assert!(matches!(..))` that prints the value when it fails.
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {{
        let value = $value;
        assert!(
            matches!(value, $pattern $(if $guard)?),
            "{} = {:?}, expected {}",
            stringify!($value),
            value,
            stringify!($pattern $(if $guard)?)
        );
    }};
}

/// The three ways to stop an engine that a reopen must survive.
const STOPS: [Stop; 3] = [Stop::Clean, Stop::ProcessCrash, Stop::PowerCut];

/// Sync durability, tiny segments, a lease of `lease_ms`, `max_attempts`, backoff 1 s × 2^n
/// capped at 300 s, shortened by up to `jitter_percent` %.
fn cfg(lease_ms: u64, max_attempts: u32, jitter_percent: u8) -> Config {
    let mut c = config(Durability::Sync);
    c.lease = Duration::from_millis(lease_ms);
    c.retry.max_attempts = max_attempts;
    c.retry.backoff_initial = Duration::from_secs(1);
    c.retry.backoff_multiplier = 2;
    c.retry.backoff_max = Duration::from_secs(300);
    c.retry.backoff_jitter_percent = jitter_percent;
    c
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Wall time `offset_ms` after [`START_MS`].
fn at(offset_ms: u64) -> SystemTime {
    ms_to_system_time(START_MS + offset_ms)
}

/// Exactly one delivery, or an error naming what came.
fn one(ds: Vec<Delivery>) -> TestResult<Delivery> {
    match <[Delivery; 1]>::try_from(ds) {
        Ok([d]) => Ok(d),
        Err(ds) => Err(format!("expected one delivery, got {ds:?}").into()),
    }
}

/// (scheduled, ready, in_flight, dead_letters, pending).
fn counts(s: Stats) -> (usize, usize, usize, usize, usize) {
    (s.scheduled, s.ready, s.in_flight, s.dead_letters, s.pending)
}

/// Milliseconds a retry is delayed by a backoff (the engine rounds up to whole ms).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Dead letters as comparable tuples: (id, key, payload, attempts, due_ms, dead_ms, error).
type DeadRow = (u64, Vec<u8>, Vec<u8>, u32, u64, u64, String);

fn dead_rows(engine: &Engine) -> Vec<DeadRow> {
    engine
        .dead_letters()
        .into_iter()
        .map(|d| {
            (
                d.task_id.0,
                d.key,
                d.payload,
                d.attempts,
                d.due_ms,
                d.dead_ms,
                d.error,
            )
        })
        .collect()
}

// ----------------------------------------------------------------------------------------
// Leases

/// A lease runs exactly `Config::lease` from receipt. When it runs out the attempt has failed:
/// the holder's ack, nack and heartbeat are refused with `LeaseExpired` (whether or not the
/// driver has processed the expiry yet) and change nothing; attempt 2 comes after the backoff, exactly. The
/// stale delivery stays refused after the redelivery; the fresh one acks once.
#[test]
fn lease_expiry_redelivers_with_attempt_2_and_refuses_the_late_ack() -> TestResult {
    let h = SimHarness::new(401, cfg(10_000, 3, 0))?;
    let e = h.engine();
    let id = e.schedule_after(b"job", ms(1_000), b"payload")?;
    let d1 = one(h.advance(ms(1_000))?)?;
    assert_eq!(
        (d1.task_id(), d1.attempt(), d1.due_ms(), d1.fired_ms()),
        (id, 1, START_MS + 1_000, START_MS + 1_000)
    );
    assert_eq!(counts(e.stats()), (0, 0, 1, 0, 1));

    // One millisecond before the deadline the lease still holds.
    assert!(h.advance(ms(9_999))?.is_empty());
    assert_eq!(counts(e.stats()), (0, 0, 1, 0, 1));

    // At the deadline, before and after the driver has seen it: expired.
    h.clock.advance(ms(1));
    assert_matches!(e.ack(&d1), Err(AckError::LeaseExpired { task_id }) if task_id == id.0);
    e.run_until_idle();
    let consumer = e.consumer();
    assert_matches!(consumer.ack(&d1), Err(AckError::LeaseExpired { task_id }) if task_id == id.0);
    assert_matches!(
        consumer.nack(&d1, None, "too late"),
        Err(AckError::LeaseExpired { .. })
    );
    assert_matches!(
        consumer.extend_lease(&d1, ms(60_000)),
        Err(AckError::LeaseExpired { .. })
    );
    assert_eq!(
        counts(e.stats()),
        (1, 0, 0, 0, 1),
        "refusals changed nothing"
    );

    // Attempt 2 after the 1 s backoff, not a millisecond earlier.
    assert!(h.advance(ms(999))?.is_empty());
    let d2 = one(h.advance(ms(1))?)?;
    assert_eq!(
        (d2.task_id(), d2.attempt(), d2.payload()),
        (id, 2, &b"payload"[..])
    );
    assert_eq!(
        (d2.due_ms(), d2.fired_ms()),
        (START_MS + 12_000, START_MS + 12_000)
    );
    // The first delivery stays refused, and does not disturb the second.
    assert_matches!(e.ack(&d1), Err(AckError::LeaseExpired { .. }));
    assert_eq!(counts(e.stats()), (0, 0, 1, 0, 1));
    e.ack(&d2)?;
    assert_matches!(e.ack(&d2), Err(AckError::NotOutstanding { task_id }) if task_id == id.0);
    assert_matches!(e.nack(&d2, None, "x"), Err(AckError::NotOutstanding { .. }));
    assert_eq!(counts(e.stats()), (0, 0, 0, 0, 0));
    assert_eq!(e.cancel(b"job")?, CancelOutcome::NotFound);
    assert!(h.advance(ms(3_600_000))?.is_empty(), "delivered again");
    Ok(())
}

/// A delivery's payload can be taken out of it once acked (`into_payload`), the bytes it
/// was scheduled with.
#[test]
fn an_acked_deliverys_payload_is_taken_out_whole() -> TestResult {
    let h = SimHarness::new(403, cfg(10_000, 3, 0))?;
    let e = h.engine();
    let payload: Vec<u8> = (0..=255u8).cycle().take(3_000).collect();
    e.schedule_after(b"job", ms(5), &payload)?;
    let d = one(h.advance(ms(5))?)?;
    e.consumer().ack(&d)?;
    assert_eq!(d.into_payload(), payload);
    Ok(())
}

/// A heartbeat (`extend_lease`) moves the deadline to `lease` from now: heartbeats every 5 s
/// keep a 10 s lease alive for a minute; without them it runs out exactly 10 s after the
/// last one. A heartbeat outside 1 ms..=12 h is refused and changes nothing; an expired lease
/// cannot be revived.
#[test]
fn heartbeat_keeps_a_lease_alive() -> TestResult {
    let h = SimHarness::new(402, cfg(10_000, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"long-job", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    for _ in 0..12 {
        assert!(h.advance(ms(5_000))?.is_empty());
        e.extend_lease(&d, ms(10_000))?;
    }
    assert_eq!(counts(e.stats()), (0, 0, 1, 0, 1), "a minute of heartbeats");
    assert_matches!(
        e.extend_lease(&d, Duration::ZERO),
        Err(AckError::InvalidLease {
            lease_ms: 0,
            max_ms: 43_200_000
        })
    );
    assert_matches!(
        e.extend_lease(&d, kairos::config::LEASE_MAX + ms(1)),
        Err(AckError::InvalidLease {
            lease_ms: 43_200_001,
            ..
        })
    );
    // The refused heartbeats left the deadline at last heartbeat + 10 s.
    assert!(h.advance(ms(9_999))?.is_empty());
    assert_eq!(e.stats().in_flight, 1);
    assert!(h.advance(ms(1))?.is_empty());
    assert_eq!(counts(e.stats()), (1, 0, 0, 0, 1));
    assert_matches!(
        e.extend_lease(&d, ms(10_000)),
        Err(AckError::LeaseExpired { .. })
    );

    // The redelivery's lease can be extended too; acked inside the extension.
    let d2 = one(h.advance(ms(1_000))?)?;
    assert_eq!(d2.attempt(), 2);
    e.extend_lease(&d2, ms(30_000))?;
    assert!(h.advance(ms(29_999))?.is_empty());
    e.ack(&d2)?;
    assert_eq!(e.stats().pending, 0);
    assert!(h.advance(ms(3_600_000))?.is_empty());
    Ok(())
}

/// A lease is counted from the moment its consumer received the task, not from the start of
/// the tick it fell in: received 999 ms into a 1 s tick, a 1 s lease (and a heartbeat's) holds
/// for a full second, and ends at the next tick after it. (It ended at the tick's end: 1 ms
/// after the task was received, and the late ack was refused as `LeaseExpired`.)
#[test]
fn a_lease_received_late_in_a_coarse_tick_lasts_its_full_length() -> TestResult {
    let mut c = cfg(1_000, 3, 0);
    c.tick = ms(1_000);
    let h = SimHarness::new(412, c)?;
    let e = h.engine();
    let id = e.schedule_after(b"job", ms(1_000), b"")?;
    h.clock.advance(ms(1_999));
    e.run_until_idle();
    let d = e.consumer().try_recv()?;
    assert_eq!((d.task_id(), d.attempt()), (id, 1));
    // 999 ms of the lease: still held, by the clock and by the driver.
    assert!(h.advance(ms(999))?.is_empty());
    assert_eq!(e.stats().in_flight, 1);
    e.extend_lease(&d, ms(1_000))?;
    // The heartbeat, taken 998 ms into a tick, holds for its full second too, and ends at
    // the first tick that starts after it: 2 ms later.
    assert!(h.advance(ms(1_001))?.is_empty());
    assert_eq!(e.stats().in_flight, 1);
    h.clock.advance(ms(1));
    assert_matches!(e.ack(&d), Err(AckError::LeaseExpired { task_id }) if task_id == id.0);
    e.run_until_idle();
    assert_eq!(e.stats().in_flight, 0);
    Ok(())
}

/// The same with the default 1 ms tick: a 5 ms lease received 0.9 ms into a millisecond is
/// still held 4.2 ms later (it was refused).
#[test]
fn a_lease_received_mid_millisecond_lasts_its_full_length() -> TestResult {
    let h = SimHarness::new(413, cfg(5, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"job", ms(1), b"")?;
    h.clock.advance(ms(1));
    e.run_until_idle();
    h.clock.advance(Duration::from_micros(900));
    let d = e.consumer().try_recv()?;
    h.clock.advance(Duration::from_micros(4_200));
    e.run_until_idle();
    assert_eq!(e.stats().in_flight, 1);
    // A heartbeat 0.1 ms into a millisecond: held for its 5 ms, and until the next
    // millisecond starts.
    e.extend_lease(&d, ms(5))?;
    h.clock.advance(Duration::from_micros(5_899));
    e.run_until_idle();
    assert_eq!(e.stats().in_flight, 1);
    h.clock.advance(Duration::from_micros(1));
    assert_matches!(e.ack(&d), Err(AckError::LeaseExpired { .. }));
    Ok(())
}

/// Lease bounds over ticks from 1 ms to 1 h, leases from 1 ms to 30 s, received at offsets
/// from 0 to a tick minus 1 ns into a tick: the holder can ack 1 ns before receive + lease;
/// at the first tick start at or after it, the lease is over (by the clock and the driver).
#[test]
fn lease_bounds_hold_for_every_tick_lease_and_offset() -> TestResult {
    let mut seed = 4_700;
    for tick_ms in [1u64, 8, 10, 1_000, 3_600_000] {
        let tick = ms(tick_ms);
        for lease_ms in [1u64, 5, 999, 1_000, 1_001, 30_000] {
            let lease = ms(lease_ms);
            let offsets = [
                Duration::ZERO,
                Duration::from_nanos(1),
                Duration::from_micros(900),
                tick / 2,
                tick - Duration::from_nanos(1),
            ];
            for offset in offsets {
                for expired in [false, true] {
                    seed += 1;
                    let mut c = cfg(lease_ms, 3, 0);
                    c.tick = tick;
                    let h = SimHarness::new(seed, c)?;
                    let e = h.engine();
                    // The next tick boundary of the wall clock (the engine opened on one).
                    let due_ms = (START_MS / tick_ms + 1) * tick_ms;
                    let id = e.schedule(b"job", Due::At(ms_to_system_time(due_ms)), b"")?;
                    h.clock.advance(ms(due_ms - START_MS) + offset);
                    e.run_until_idle();
                    let d = e.consumer().try_recv()?;
                    let what =
                        format!("tick {tick_ms} ms, lease {lease_ms} ms, received {offset:?} in");
                    if expired {
                        let end_ns =
                            (offset + lease).as_nanos().div_ceil(tick.as_nanos()) * tick.as_nanos();
                        let wait_ns = u64::try_from(end_ns - offset.as_nanos())?;
                        h.clock.advance(Duration::from_nanos(wait_ns));
                        assert_matches!(
                            e.ack(&d),
                            Err(AckError::LeaseExpired { task_id }) if task_id == id.0
                        );
                        e.run_until_idle();
                        assert_eq!(e.stats().in_flight, 0, "{what}");
                    } else {
                        h.clock.advance(lease - Duration::from_nanos(1));
                        e.run_until_idle();
                        assert_eq!(e.stats().in_flight, 1, "{what}");
                        e.ack(&d).map_err(|err| format!("{what}: {err}"))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Leases across a reopen, for a clean shutdown, a process crash and a power cut (Sync):
/// a restart ends every lease. Held deliveries (plain or heartbeat-extended) come again at
/// once with attempt 2; a retry scheduled by a lease expiry before the stop fires at its exact
/// time with attempt 2; a task handed out but not yet received is released by a clean
/// shutdown (attempt 1 again) and counted as an attempt by a crash; an acked task stays
/// finished; deliveries from before the restart are refused with `NotOutstanding`.
#[test]
fn leases_across_reopen() -> TestResult {
    for (n, how) in STOPS.into_iter().enumerate() {
        let mut h = SimHarness::new(403 + n as u64, cfg(10_000, 3, 0))?;
        let e = h.engine();
        let a = e.schedule_after(b"A-held", ms(11_000), b"a")?;
        let b = e.schedule_after(b"B-expired", ms(1_000), b"b")?;
        let c = e.schedule_after(b"C-heartbeat", ms(1_000), b"c")?;
        let d = e.schedule_after(b"D-ready", ms(11_500), b"d")?;
        let acked = e.schedule_after(b"E-acked", ms(1_000), b"e")?;

        let first = h.advance(ms(1_000))?;
        assert_eq!(keys(&first), ["B-expired", "C-heartbeat", "E-acked"]);
        e.ack(&first[2])?;
        assert!(h.advance(ms(5_000))?.is_empty());
        e.extend_lease(&first[1], ms(10_000))?; // C until +16 s
        let held = one(h.advance(ms(5_000))?)?; // +11 s: A; B's lease ran out
        assert_eq!((held.task_id(), held.attempt()), (a, 1));
        assert_matches!(e.ack(&first[0]), Err(AckError::LeaseExpired { .. }));
        h.clock.advance(ms(500)); // +11.5 s: D handed out, nobody receives it
        e.run_until_idle();
        assert_eq!(counts(e.stats()), (1, 1, 2, 0, 4), "{how:?}");

        h.restart(how)?;
        let e = h.engine();
        let r = e.recovery();
        let crashed = how != Stop::Clean;
        assert_eq!(r.pending, 4, "{how:?}");
        assert_eq!(
            (r.redelivered, r.overdue, r.dead_lettered),
            (if crashed { 3 } else { 2 }, usize::from(!crashed), 0),
            "{how:?}: {r:?}"
        );
        // At once, oldest due time first: C (+1 s), A (+11 s), D (+11.5 s). B waits for +12 s.
        let again = drain(e)?;
        let got: Vec<(TaskId, u32, u64)> = again
            .iter()
            .map(|x| (x.task_id(), x.attempt(), x.due_ms()))
            .collect();
        let d_attempt = if crashed { 2 } else { 1 };
        assert_eq!(
            got,
            [
                (c, 2, START_MS + 1_000),
                (a, 2, START_MS + 11_000),
                (d, d_attempt, START_MS + 11_500)
            ],
            "{how:?}"
        );
        assert!(again.iter().all(|x| x.fired_ms() == START_MS + 11_500));
        for stale in [&first[0], &first[1], &held] {
            assert_matches!(e.ack(stale), Err(AckError::NotOutstanding { .. }));
        }
        assert_eq!(first[2].task_id(), acked);
        assert_eq!(e.cancel(b"E-acked")?, CancelOutcome::NotFound);

        assert!(h.advance(ms(499))?.is_empty(), "{how:?}: B early");
        let retried = one(h.advance(ms(1))?)?;
        assert_eq!(
            (retried.task_id(), retried.attempt(), retried.due_ms()),
            (b, 2, START_MS + 12_000)
        );
        e.ack_many(&again)?;
        e.ack(&retried)?;
        assert_eq!(e.stats().pending, 0);
        h.restart(how)?;
        assert_eq!(h.engine().recovery().pending, 0, "{how:?}");
        assert!(h.advance(ms(3_600_000))?.is_empty(), "{how:?}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// A lease that runs out on the last attempt dead-letters the task with the expiry as its
/// error; the dead letter and the attempt count survive every kind of reopen. A lease that a
/// restart ended on the last attempt dead-letters the task at open.
#[test]
fn lease_expiry_on_the_last_attempt_dead_letters() -> TestResult {
    for (n, how) in STOPS.into_iter().enumerate() {
        let mut h = SimHarness::new(410 + n as u64, cfg(10_000, 2, 0))?;
        let e = h.engine();
        let x = e.schedule_after(b"x", Duration::ZERO, b"px")?;
        let y = e.schedule_after(b"y", Duration::ZERO, b"py")?;
        assert_eq!(drain(e)?.len(), 2);
        assert!(h.advance(ms(10_000))?.is_empty()); // both expire; retries at +11 s
        let second = h.advance(ms(1_000))?;
        assert_eq!(
            second
                .iter()
                .map(|d| (d.task_id(), d.attempt()))
                .collect::<Vec<_>>(),
            [(x, 2), (y, 2)]
        );
        // x's last lease runs out; y's is ended by the restart.
        e.extend_lease(&second[1], ms(60_000))?;
        assert!(h.advance(ms(10_000))?.is_empty());
        let expected_x: DeadRow = (
            x.0,
            b"x".to_vec(),
            b"px".to_vec(),
            2,
            START_MS + 11_000,
            START_MS + 21_000,
            "lease expired without ack or nack (Config::lease is 10000 ms)".into(),
        );
        assert_eq!(dead_rows(e), std::slice::from_ref(&expected_x));
        assert_eq!(counts(e.stats()), (0, 0, 1, 1, 1));
        assert_eq!(e.cancel(b"x")?, CancelOutcome::NotFound);

        h.restart(how)?;
        let e = h.engine();
        assert_eq!(
            (e.recovery().dead_lettered, e.recovery().dead_letters),
            (1, 2),
            "{how:?}"
        );
        let rows = dead_rows(e);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], expected_x, "{how:?}");
        let (id, k, p, attempts, due_ms, dead_ms, _) = rows[1].clone();
        assert_eq!(
            (id, k, p, attempts, due_ms, dead_ms),
            (
                y.0,
                b"y".to_vec(),
                b"py".to_vec(),
                2,
                START_MS + 11_000,
                START_MS + 21_000
            ),
            "{how:?}"
        );
        assert!(drain(e)?.is_empty());
        h.restart(how)?;
        assert_eq!(dead_rows(h.engine()).len(), 2, "{how:?}");
        assert!(h.advance(ms(3_600_000))?.is_empty());
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Retries and dead letters

/// Nacks without a delay follow the policy exactly (jitter 0): 1, 2, 4 s, then the 5 s cap;
/// each attempt is delivered at its due millisecond, not before. The fifth failure
/// dead-letters the task with its last error; the key is then free. A nack with an explicit
/// delay uses it; one past `delay_max` is refused and changes nothing.
#[test]
fn nack_retries_at_the_exact_backoff_then_dead_letters() -> TestResult {
    let mut c = cfg(30_000, 5, 0);
    c.retry.backoff_max = ms(5_000);
    let h = SimHarness::new(420, c)?;
    let e = h.engine();
    let id = e.schedule_after(b"poison", ms(1_000), b"pp")?;
    let mut d = one(h.advance(ms(1_000))?)?;
    for (attempt, delay) in [(1u32, 1_000u64), (2, 2_000), (3, 4_000), (4, 5_000)] {
        assert_eq!(d.attempt(), attempt);
        let now = h.clock.wall_ms();
        let outcome = e.nack(&d, None, &format!("error {attempt}"))?;
        assert_eq!(
            outcome,
            NackOutcome::Retry {
                next_attempt: attempt + 1,
                due: ms_to_system_time(now + delay)
            }
        );
        assert_eq!(counts(e.stats()), (1, 0, 0, 0, 1));
        assert!(
            h.advance(ms(delay - 1))?.is_empty(),
            "attempt {} early",
            attempt + 1
        );
        d = one(h.advance(ms(1))?)?;
        assert_eq!(
            (d.task_id(), d.due_ms(), d.fired_ms(), d.payload()),
            (id, now + delay, now + delay, &b"pp"[..])
        );
    }
    assert_eq!(d.attempt(), 5);
    let now = h.clock.wall_ms();
    assert_eq!(e.nack(&d, None, "error 5")?, NackOutcome::DeadLettered);
    assert_eq!(
        dead_rows(e),
        [(
            id.0,
            b"poison".to_vec(),
            b"pp".to_vec(),
            5,
            now,
            now,
            "error 5".to_string()
        )]
    );
    assert_eq!(counts(e.stats()), (0, 0, 0, 1, 0));
    assert_matches!(e.ack(&d), Err(AckError::NotOutstanding { .. }));
    assert_eq!(e.cancel(b"poison")?, CancelOutcome::NotFound);
    assert!(h.advance(ms(3_600_000))?.is_empty());

    // An explicit delay overrides the policy.
    e.schedule_after(b"explicit", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    let now = h.clock.wall_ms();
    assert_matches!(
        e.nack(&d, Some(e.config().delay_max + ms(1)), "x"),
        Err(AckError::RetryTooFar { .. })
    );
    assert_eq!(e.stats().in_flight, 1, "a refused nack changed nothing");
    assert_eq!(
        e.nack(&d, Some(ms(250)), "busy")?,
        NackOutcome::Retry {
            next_attempt: 2,
            due: ms_to_system_time(now + 250)
        }
    );
    assert!(h.advance(ms(249))?.is_empty());
    let d = one(h.advance(ms(1))?)?;
    assert_eq!(d.attempt(), 2);
    // Zero: at once.
    e.nack(&d, Some(Duration::ZERO), "again")?;
    let d = one(drain(e)?)?;
    assert_eq!((d.attempt(), d.due_ms()), (3, h.clock.wall_ms()));
    e.ack(&d)?;
    Ok(())
}

/// With jitter, each retry is due exactly `RetryPolicy::backoff(task id, attempt)` after the
/// nack (rounded up to the millisecond) and delivered at that millisecond; the jitter only
/// shortens and spreads the retries.
#[test]
fn jittered_backoff_matches_the_policy() -> TestResult {
    let h = SimHarness::new(421, cfg(60_000, 3, 50))?;
    let e = h.engine();
    let policy = e.config().retry;
    let n = 40;
    for i in 0..n {
        e.schedule_after(&key("j-", i), ms(1_000), b"")?;
    }
    let mut held = h.advance(ms(1_000))?;
    assert_eq!(held.len(), n);
    let mut distinct = std::collections::BTreeSet::new();
    for attempt in 1..=2u32 {
        // id → expected due of the next attempt.
        let mut expected: BTreeMap<TaskId, u64> = BTreeMap::new();
        let now = h.clock.wall_ms();
        for d in &held {
            assert_eq!(d.attempt(), attempt);
            let delay = policy.backoff(d.task_id().0, attempt);
            let full = policy.backoff_initial * 2u32.pow(attempt - 1);
            assert!(delay <= full && delay >= full / 2, "{delay:?}");
            distinct.insert(delay);
            let due = now + ceil_ms(delay);
            assert_eq!(
                e.nack(d, None, "flaky")?,
                NackOutcome::Retry {
                    next_attempt: attempt + 1,
                    due: ms_to_system_time(due)
                }
            );
            expected.insert(d.task_id(), due);
        }
        held.clear();
        let last = expected.values().copied().max().ok_or("no tasks")?;
        while h.clock.wall_ms() < last {
            for d in h.advance(ms(1))? {
                let now = h.clock.wall_ms();
                assert_eq!(expected.get(&d.task_id()), Some(&now), "{d:?} at {now}");
                assert_eq!((d.due_ms(), d.fired_ms()), (now, now));
                held.push(d);
            }
        }
        assert_eq!(held.len(), n, "attempt {}", attempt + 1);
    }
    assert!(distinct.len() > n, "jitter spreads retries: {distinct:?}");
    e.ack_many(&held)?;
    assert_eq!(e.stats().pending, 0);
    Ok(())
}

/// Dead letters are kept durably with their last error, listed oldest id first, requeued as
/// a new task (new id, same key and payload, fresh attempt count; refused while the key is
/// live) and purged — across every kind of reopen.
#[test]
fn dead_letters_requeue_and_purge_survive_reopen() -> TestResult {
    for (n, how) in STOPS.into_iter().enumerate() {
        let mut h = SimHarness::new(430 + n as u64, cfg(30_000, 1, 0))?;
        let e = h.engine();
        let mut ids = Vec::new();
        for name in ["dl-a", "dl-b", "dl-c"] {
            ids.push(e.schedule_after(name.as_bytes(), Duration::ZERO, name.as_bytes())?);
        }
        for d in drain(e)? {
            let text = format!("failed {}", String::from_utf8_lossy(d.key()));
            assert_eq!(e.nack(&d, None, &text)?, NackOutcome::DeadLettered);
        }
        let before = dead_rows(e);
        assert_eq!(
            before
                .iter()
                .map(|r| (r.0, r.3, r.6.clone()))
                .collect::<Vec<_>>(),
            [
                (ids[0].0, 1, "failed dl-a".to_string()),
                (ids[1].0, 1, "failed dl-b".into()),
                (ids[2].0, 1, "failed dl-c".into())
            ]
        );

        h.restart(how)?;
        let e = h.engine();
        assert_eq!(e.recovery().dead_letters, 3, "{how:?}");
        assert_eq!(dead_rows(e), before, "{how:?}");
        assert_eq!(e.stats().dead_letters, 3);

        // Requeue is refused while the key is live again; allowed once it is not.
        e.schedule_after(b"dl-a", ms(60_000), b"someone else")?;
        assert_matches!(
            e.requeue_dead_letter(ids[0], Due::After(ms(1_000))),
            Err(ScheduleError::AlreadyExists { .. })
        );
        assert_eq!(
            e.cancel(b"dl-a")?,
            CancelOutcome::Cancelled { deliveries: 0 }
        );
        let requeued = e.requeue_dead_letter(ids[0], Due::After(ms(1_000)))?;
        assert!(requeued > ids[2], "a new id: {requeued:?}");
        assert_matches!(
            e.requeue_dead_letter(ids[0], Due::After(ms(1_000))),
            Err(ScheduleError::NotDeadLetter { task_id }) if task_id == ids[0].0
        );
        assert!(e.purge_dead_letter(ids[1])?);
        assert!(!e.purge_dead_letter(ids[1])?);
        assert!(!e.purge_dead_letter(TaskId(999_999))?);
        assert_matches!(
            e.requeue_dead_letter(ids[1], Due::After(Duration::ZERO)),
            Err(ScheduleError::NotDeadLetter { .. })
        );
        assert_eq!(dead_rows(e), [before[2].clone()]);

        h.restart(how)?;
        assert_eq!(dead_rows(h.engine()), [before[2].clone()], "{how:?}");
        let d = one(h.advance(ms(1_000))?)?;
        assert_eq!(
            (d.task_id(), d.key(), d.payload(), d.attempt()),
            (requeued, &b"dl-a"[..], &b"dl-a"[..], 1)
        );
        // A fresh attempt count: max_attempts is 1, so this failure dead-letters it again.
        assert_eq!(
            h.engine().nack(&d, None, "again")?,
            NackOutcome::DeadLettered
        );
        h.restart(how)?;
        let rows = dead_rows(h.engine());
        assert_eq!(
            rows.iter().map(|r| (r.0, r.6.clone())).collect::<Vec<_>>(),
            [
                (ids[2].0, "failed dl-c".to_string()),
                (requeued.0, "again".into())
            ],
            "{how:?}"
        );
        assert!(h.advance(ms(3_600_000))?.is_empty());
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// `dead_letters_after` walks the dead letters in pages, oldest id first: every page size
/// gives back exactly `dead_letters()`, a page ends where asked, `max` 0 and an `after` past
/// the last id give nothing; a purge during the walk is not seen after it, a dead letter made
/// during it with an id above the walk's position is; the same across a reopen.
#[test]
fn dead_letters_after_walks_pages_in_id_order() -> TestResult {
    let mut h = SimHarness::new(445, cfg(30_000, 1, 0))?;
    let e = h.engine();
    let mut ids = Vec::new();
    for i in 0..7 {
        let name = format!("page-{i}");
        ids.push(e.schedule_after(name.as_bytes(), Duration::ZERO, name.as_bytes())?);
    }
    // One more task, dead-lettered halfway through a walk below.
    let late = e.schedule_after(b"page-late", ms(1_000), b"late")?;
    for d in drain(e)? {
        assert_eq!(e.nack(&d, None, "no")?, NackOutcome::DeadLettered);
    }
    let all_dead = 8;
    let walk = |e: &Engine, page: usize| -> Vec<u64> {
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..=all_dead {
            let got = e.dead_letters_after(after, page);
            assert!(got.len() <= page, "page of {} over {page}", got.len());
            let Some(last) = got.last() else {
                return seen;
            };
            after = Some(last.task_id);
            seen.extend(got.iter().map(|d| d.task_id.0));
        }
        panic!("the walk did not end: {seen:?}");
    };
    let all: Vec<u64> = ids.iter().map(|id| id.0).collect();
    for page in [1, 2, 3, 7, 100] {
        assert_eq!(walk(h.engine(), page), all, "page {page}");
    }
    let e = h.engine();
    let full: Vec<u64> = e.dead_letters().iter().map(|d| d.task_id.0).collect();
    assert_eq!(full, all);
    // One page, with everything a dead letter carries.
    let page = e.dead_letters_after(Some(ids[1]), 2);
    assert_eq!(
        page.iter()
            .map(|d| (
                d.task_id,
                d.key.clone(),
                d.payload.clone(),
                d.attempts,
                d.error.clone()
            ))
            .collect::<Vec<_>>(),
        [
            (
                ids[2],
                b"page-2".to_vec(),
                b"page-2".to_vec(),
                1,
                "no".to_string()
            ),
            (
                ids[3],
                b"page-3".to_vec(),
                b"page-3".to_vec(),
                1,
                "no".to_string()
            ),
        ]
    );
    assert!(e.dead_letters_after(None, 0).is_empty());
    assert!(e.dead_letters_after(Some(ids[6]), 10).is_empty());
    assert!(e.dead_letters_after(Some(TaskId(u64::MAX)), 10).is_empty());

    // During a walk: purge one ahead of it, one behind it; a new dead letter (id above).
    let first = e.dead_letters_after(None, 3);
    assert_eq!(first.len(), 3);
    assert!(e.purge_dead_letter(ids[1])?);
    assert!(e.purge_dead_letter(ids[4])?);
    let d = one(h.advance(ms(1_000))?)?;
    assert_eq!(d.task_id(), late);
    let e = h.engine();
    assert_eq!(e.nack(&d, None, "late")?, NackOutcome::DeadLettered);
    let rest: Vec<u64> = e
        .dead_letters_after(first.last().map(|d| d.task_id), 100)
        .iter()
        .map(|d| d.task_id.0)
        .collect();
    assert_eq!(rest, [ids[3].0, ids[5].0, ids[6].0, late.0]);

    h.restart(Stop::PowerCut)?;
    assert_eq!(
        walk(h.engine(), 2),
        [ids[0].0, ids[2].0, ids[3].0, ids[5].0, ids[6].0, late.0]
    );
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Cancel outcomes with retries

/// The cancel outcome is exact at every stage: waiting for the first attempt or for a retry
/// (`Cancelled`, with the deliveries so far; never delivered again), due but not received
/// (`Cancelled`), held by a consumer (`AlreadyDelivered`: the key is free at once, the
/// holder's ack is Ok, its nack says `Finished`, an expiry or a restart brings nothing back),
/// finished (`NotFound`).
#[test]
fn cancel_outcomes_with_retries_are_exact() -> TestResult {
    let mut h = SimHarness::new(440, cfg(10_000, 3, 0))?;
    let e = h.engine();
    for k in [
        "wait",
        "retry",
        "ready",
        "held-ack",
        "held-nack",
        "held-expire",
        "held-restart",
    ] {
        e.schedule_after(k.as_bytes(), ms(1_000), b"")?;
    }
    assert_eq!(
        e.cancel(b"wait")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    let ds = h.advance(ms(1_000))?;
    assert_eq!(ds.len(), 6);
    let by: BTreeMap<String, Delivery> = keys(&ds).into_iter().zip(ds).collect();
    e.nack(&by["retry"], None, "fail")?;
    assert_eq!(
        e.cancel(b"retry")?,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    e.nack(&by["ready"], Some(Duration::ZERO), "fail")?;
    e.run_until_idle(); // attempt 2 handed out, not received
    assert_eq!(e.stats().ready, 1);
    assert_eq!(
        e.cancel(b"ready")?,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    assert_eq!(e.stats().ready, 0);

    for k in ["held-ack", "held-nack", "held-expire", "held-restart"] {
        assert_eq!(
            e.cancel(k.as_bytes())?,
            CancelOutcome::AlreadyDelivered { attempt: 1 },
            "{k}"
        );
        assert_eq!(e.cancel(k.as_bytes())?, CancelOutcome::NotFound, "{k}");
    }
    // The key is free at once; the new task is a different one.
    let fresh = e.schedule_after(b"held-ack", ms(60_000), b"new")?;
    e.ack(&by["held-ack"])?;
    assert_eq!(e.nack(&by["held-nack"], None, "x")?, NackOutcome::Finished);
    assert_eq!(counts(e.stats()), (1, 0, 2, 0, 3));
    e.extend_lease(&by["held-restart"], ms(60_000))?;
    assert!(
        h.advance(ms(10_000))?.is_empty(),
        "an abandoned lease expired: no retry"
    );
    assert_eq!(counts(e.stats()), (1, 0, 1, 0, 2));

    h.restart(Stop::ProcessCrash)?;
    let e = h.engine();
    assert_eq!(
        (e.recovery().pending, e.recovery().redelivered),
        (1, 0),
        "only the new task is live"
    );
    let d = one(h.advance(ms(60_000))?)?;
    assert_eq!((d.task_id(), d.payload()), (fresh, &b"new"[..]));
    assert!(h.advance(ms(3_600_000))?.is_empty());
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Upsert / reschedule

/// `reschedule` of a waiting task moves its due time (payload kept with `None`, replaced with
/// `Some`), keeping its id and attempt count; of a task handed out but not received takes it
/// back (attempt not counted); of a held task is `InFlight` and changes nothing; of an absent
/// key schedules a new task. Rescheduled due times and payloads survive a reopen.
#[test]
fn reschedule_waiting_ready_in_flight_and_absent() -> TestResult {
    let mut h = SimHarness::new(450, cfg(30_000, 3, 0))?;
    let e = h.engine();
    let later = e.schedule_after(b"later", ms(1_000), b"keep")?;
    let earlier = e.schedule_after(b"earlier", ms(5_000), b"old")?;
    let retry = e.schedule_after(b"retry", ms(1_000), b"r")?;
    let held = e.schedule_after(b"held", ms(1_000), b"h")?;
    let ready = e.schedule_after(b"ready", ms(1_000), b"q")?;

    assert_eq!(
        e.reschedule(b"later", Due::After(ms(3_000)), None)?,
        RescheduleOutcome::Rescheduled(later)
    );
    assert_eq!(
        e.reschedule(b"earlier", Due::At(at(2_000)), Some(b"new"))?,
        RescheduleOutcome::Rescheduled(earlier)
    );
    assert_matches!(
        e.reschedule(b"later", Due::After(e.config().delay_max + ms(1)), None),
        Err(ScheduleError::DueTooFar { .. })
    );
    let absent = match e.reschedule(b"absent", Due::After(ms(4_000)), Some(b"fresh"))? {
        RescheduleOutcome::Scheduled(id) => id,
        other => return Err(format!("absent key: {other:?}").into()),
    };
    let empty = match e.reschedule(b"absent-empty", Due::After(ms(4_000)), None)? {
        RescheduleOutcome::Scheduled(id) => id,
        other => return Err(format!("absent key: {other:?}").into()),
    };
    assert!(absent > ready && empty > absent);

    // +1 s: retry, ready and held are due; later and earlier no longer.
    h.clock.advance(ms(1_000));
    e.run_until_idle();
    let consumer = e.consumer();
    // Receive two of the three; "ready" stays in the ready queue.
    let first = vec![consumer.try_recv()?, consumer.try_recv()?];
    assert_eq!(keys(&first), ["retry", "held"]);
    assert_eq!(e.stats().ready, 1);
    e.nack(&first[0], None, "fail")?; // retry: attempt 2 due +2 s
    assert_eq!(
        e.reschedule(b"retry", Due::After(ms(3_500)), Some(b"r2"))?,
        RescheduleOutcome::Rescheduled(retry)
    );
    assert_eq!(
        e.reschedule(b"ready", Due::After(ms(2_500)), None)?,
        RescheduleOutcome::Rescheduled(ready)
    );
    assert_eq!(e.stats().ready, 0, "taken back from the ready queue");
    assert!(consumer.try_recv().is_err());
    assert_matches!(
        e.reschedule(b"held", Due::After(ms(10)), Some(b"x")),
        Err(ScheduleError::InFlight { ref key }) if key == "held"
    );
    assert_eq!(counts(e.stats()), (6, 0, 1, 0, 7));
    assert_eq!(first[1].task_id(), held);
    e.ack(&first[1])?; // unchanged by the refused reschedule

    // Survives a crash: +2 s earlier (new payload), +3 s later (payload kept), +3.5 s ready
    // (attempt 1: the taken-back hand-out does not count), +4 s absent and absent-empty,
    // +4.5 s retry (new payload, attempt 2).
    h.restart(Stop::ProcessCrash)?;
    let mut fired: Vec<(u64, String, Vec<u8>, u32, TaskId)> = Vec::new();
    for _ in 0..10_000 {
        for d in h.advance(ms(1))? {
            fired.push((
                h.clock.wall_ms() - START_MS,
                String::from_utf8_lossy(d.key()).into_owned(),
                d.payload().to_vec(),
                d.attempt(),
                d.task_id(),
            ));
            h.engine().ack(&d)?;
        }
    }
    let expected = vec![
        (2_000, "earlier".into(), b"new".to_vec(), 1, earlier),
        (3_000, "later".into(), b"keep".to_vec(), 1, later),
        (3_500, "ready".into(), b"q".to_vec(), 1, ready),
        (4_000, "absent".into(), b"fresh".to_vec(), 1, absent),
        (4_000, "absent-empty".into(), Vec::new(), 1, empty),
        (4_500, "retry".into(), b"r2".to_vec(), 2, retry),
    ];
    assert_eq!(fired, expected);
    Ok(())
}

/// A held task that was cancelled (`AlreadyDelivered`) no longer owns its key: `reschedule`
/// of the key schedules a new task rather than answering `InFlight`.
#[test]
fn reschedule_after_cancel_of_a_held_task_schedules_anew() -> TestResult {
    let h = SimHarness::new(451, cfg(30_000, 3, 0))?;
    let e = h.engine();
    let old = e.schedule_after(b"k", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    assert_eq!(
        e.cancel(b"k")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    let new = match e.reschedule(b"k", Due::After(ms(1_000)), Some(b"n"))? {
        RescheduleOutcome::Scheduled(id) => id,
        other => return Err(format!("{other:?}").into()),
    };
    assert!(new > old);
    e.ack(&d)?;
    let d = one(h.advance(ms(1_000))?)?;
    assert_eq!((d.task_id(), d.payload(), d.attempt()), (new, &b"n"[..], 1));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Catch-up after downtime

/// Schedules `n` tasks due over the first `n / 1000` seconds in a shuffled order (so
/// scheduling order is not due order), closes, and reopens `downtime` later. Returns the
/// expected hand-out order: (due_ms, id) ascending.
fn backlog_setup(h: &mut SimHarness, n: usize, downtime: Duration) -> TestResult<Vec<TaskId>> {
    let mut dues: Vec<u64> = (0..n as u64)
        .map(|i| 1_000 + i / 1_000 * 1_000 + i % 7)
        .collect();
    let mut rng = common::SplitMix(4_600 + n as u64);
    for i in (1..dues.len()).rev() {
        dues.swap(i, rng.next_u64() as usize % (i + 1));
    }
    let keys: Vec<Vec<u8>> = (0..n).map(|i| key("backlog-", i)).collect();
    let mut expected: Vec<(u64, TaskId)> = Vec::with_capacity(n);
    for (chunk, due_chunk) in keys.chunks(50_000).zip(dues.chunks(50_000)) {
        let batch: Vec<NewTask<'_>> = chunk
            .iter()
            .zip(due_chunk)
            .map(|(k, &due)| NewTask {
                key: k,
                due: Due::At(at(due)),
                payload: &k[8..],
            })
            .collect();
        let ids = h.engine().schedule_many(&batch)?;
        expected.extend(due_chunk.iter().map(|&d| START_MS + d).zip(ids));
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(downtime);
    h.start()?;
    expected.sort_unstable();
    Ok(expected.into_iter().map(|(_, id)| id).collect())
}

/// Without a rate limit the whole backlog found at open is handed out at once (no clock
/// movement), oldest due time first, equal due times in scheduling order, nothing lost,
/// nothing early, each with its downtime as lateness.
#[test]
fn catch_up_backlog_without_rate_limit() -> TestResult {
    let n = scaled(250_000, 1_000_000);
    let mut c = cfg(30_000, 3, 0);
    c.durability = Durability::Buffered;
    c.segment_bytes = 64 << 20;
    let mut h = SimHarness::new(460, c)?;
    let expected = backlog_setup(&mut h, n, Duration::from_secs(3_600))?;
    let e = h.engine();
    assert_eq!((e.recovery().overdue, e.recovery().pending), (n, n));
    let got = drain(e)?;
    let ids: Vec<TaskId> = got.iter().map(|d| d.task_id()).collect();
    assert!(ids == expected, "not oldest first, or tasks lost");
    let open_ms = h.clock.wall_ms();
    for d in &got {
        assert_eq!((d.attempt(), d.fired_ms()), (1, open_ms));
        assert_eq!(d.payload(), &d.key()[8..]);
        assert_eq!(d.lateness(), ms(open_ms - d.due_ms()));
    }
    let s = e.stats();
    assert_eq!((s.catch_up_backlog, s.in_flight, s.pending), (0, n, n));
    for chunk in got.chunks(100_000) {
        e.ack_many(chunk)?;
    }
    assert_eq!(e.stats().pending, 0);
    Ok(())
}

/// With `catch_up_tasks_per_sec = r`, after `t` seconds of engine time since open exactly
/// `floor(r·t) + 1` backlog tasks have been handed out (the driver hands them to the ready
/// queue whether or not consumers keep up), oldest first; `Stats::catch_up_backlog` counts
/// the rest; tasks falling due after open are not held back by the backlog; nothing is lost.
/// Deliveries in flight at a crash join the backlog in due-time order.
#[test]
fn catch_up_backlog_with_rate_limit() -> TestResult {
    let n = scaled(250_000, 1_000_000);
    let rate: u64 = 100_000;
    let mut c = cfg(LEASE_LONG_MS, 3, 0);
    c.durability = Durability::Buffered;
    c.segment_bytes = 64 << 20;
    c.catch_up_tasks_per_sec = Some(rate as u32);
    let mut h = SimHarness::new(461, c)?;
    let expected = backlog_setup(&mut h, n, Duration::from_secs(3_600))?;
    let e = h.engine();
    assert_eq!(e.recovery().overdue, n);
    let allowed = |elapsed_ms: u64| ((rate * elapsed_ms / 1_000 + 1) as usize).min(n);

    let consumer = e.consumer();
    let take = || -> TestResult<Vec<Delivery>> {
        let mut ds = Vec::new();
        loop {
            match consumer.try_recv() {
                Ok(d) => ds.push(d),
                Err(RecvError::Empty) => return Ok(ds),
                Err(err) => return Err(err.into()),
            }
        }
    };
    e.run_until_idle();
    let mut got: Vec<TaskId> = Vec::with_capacity(n);
    let first = take()?;
    got.extend(first.iter().map(|d| d.task_id()));
    e.ack_many(&first)?;
    assert_eq!(got.len(), 1, "one task at open");
    assert_eq!(e.stats().catch_up_backlog, n - 1);

    // A task due 5 ms after open comes at 5 ms even though the backlog is far from done.
    e.schedule_after(b"new-after-open", ms(5), b"")?;
    let mut elapsed = 0u64;
    let mut new_at = None;
    // Millisecond steps first, then uneven ones (1, 8, 15, … 50, 7, …), with a stretch in
    // which no consumer receives.
    let mut step = 1u64;
    while got.len() < n {
        h.clock.advance(ms(step));
        elapsed += step;
        e.run_until_idle();
        if elapsed >= 20 {
            step = (step + 6) % 50 + 1;
        }
        if (300..400).contains(&elapsed) {
            // Nobody receives: the driver still hands out exactly the allowed number.
            assert_eq!(
                got.len() + e.stats().ready,
                allowed(elapsed),
                "at {elapsed} ms"
            );
            continue;
        }
        let ds = take()?;
        for d in &ds {
            if d.key() == b"new-after-open" {
                new_at = Some(elapsed);
            } else {
                got.push(d.task_id());
            }
        }
        e.ack_many(&ds)?;
        assert_eq!(got.len(), allowed(elapsed), "at {elapsed} ms");
        assert_eq!(e.stats().catch_up_backlog, n - got.len());
    }
    assert_eq!(new_at, Some(5));
    assert!(got == expected, "not oldest first, or tasks lost");
    assert_eq!(e.stats().pending, 0, "{:?}", e.stats());
    assert!(h.advance(ms(3_600_000))?.is_empty());

    // In flight at a crash: part of the backlog, in due-time order with the overdue tasks.
    let e = h.engine();
    let old = e.schedule_after(b"held-at-crash", Duration::ZERO, b"")?;
    assert_eq!(one(drain(e)?)?.task_id(), old);
    let late = e.schedule_after(b"due-later-while-down", ms(2_000), b"")?;
    let mid = e.schedule_after(b"due-while-down", ms(1_000), b"")?;
    h.stop(Stop::ProcessCrash)?;
    h.clock.advance(ms(10_000));
    h.start()?;
    let e = h.engine();
    assert_eq!((e.recovery().overdue, e.recovery().redelivered), (2, 1));
    let at_open = one(drain(e)?)?;
    h.clock.advance(ms(1));
    let rest = drain(e)?;
    let order: Vec<(TaskId, u32)> = std::iter::once(&at_open)
        .chain(&rest)
        .map(|d| (d.task_id(), d.attempt()))
        .collect();
    assert_eq!(order, [(old, 2), (mid, 1), (late, 1)]);
    Ok(())
}

/// A lease long enough never to run out in the catch-up test (12 h).
const LEASE_LONG_MS: u64 = 12 * 3_600_000;

// ----------------------------------------------------------------------------------------
// Wall-clock steps

/// Lease and retry timers follow the monotonic clock: wall-clock steps of +1 h, −1 h and
/// −24 h neither expire a lease early nor delay it, nor move a retry.
#[test]
fn lease_and_retry_timers_ignore_wall_clock_steps() -> TestResult {
    let h = SimHarness::new(470, cfg(10_000, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"t", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    h.clock.step_wall(3_600_000);
    assert!(drain(e)?.is_empty());
    assert_eq!(e.stats().in_flight, 1, "a +1 h step expired the lease");
    h.clock.step_wall(-3_600_000 - 86_400_000);
    assert!(h.advance(ms(9_999))?.is_empty());
    assert_eq!(e.stats().in_flight, 1);
    assert!(h.advance(ms(1))?.is_empty());
    assert_eq!(e.stats().in_flight, 0, "a −24 h step stalled the lease");
    assert_matches!(e.ack(&d), Err(AckError::LeaseExpired { .. }));
    // The retry (1 s backoff) is due on the stepped wall clock and fires 1 s later.
    h.clock.step_wall(-3_600_000);
    h.clock.step_wall(3_600_000 * 2);
    assert!(h.advance(ms(999))?.is_empty());
    let d2 = one(h.advance(ms(1))?)?;
    assert_eq!(d2.attempt(), 2);
    // Due time and hand-out time are wall-clock readings: the retry was computed on the
    // wall clock of the expiry (−24 h at the time).
    assert_eq!(d2.due_ms(), START_MS + 11_000 - 86_400_000);
    assert_eq!(d2.fired_ms(), START_MS + 11_000 - 86_400_000 + 3_600_000);
    let now = h.clock.wall_ms();
    assert_eq!(
        e.nack(&d2, None, "x")?,
        NackOutcome::Retry {
            next_attempt: 3,
            due: ms_to_system_time(now + 2_000)
        }
    );
    h.clock.step_wall(-3_600_000);
    assert!(h.advance(ms(1_999))?.is_empty());
    assert_eq!(one(h.advance(ms(1))?)?.attempt(), 3);
    Ok(())
}

/// README/semantics: an absolute due time is mapped to the monotonic clock with the wall clock
/// when scheduled, and again at each open. So a wall step while running moves nothing, but a
/// task still pending at a reopen fires when the (stepped) wall clock reaches its due time.
#[test]
fn absolute_due_times_are_remapped_at_open_after_a_wall_step() -> TestResult {
    let mut h = SimHarness::new(471, cfg(30_000, 3, 0))?;
    h.engine().schedule_at(b"abs", at(60_000), b"")?;
    h.engine().schedule_after(b"rel", ms(60_000), b"")?;
    h.clock.step_wall(-3_600_000);
    // Running: both still fire at +60 s monotonic.
    assert!(h.advance(ms(59_999))?.is_empty());
    let both = h.advance(ms(1))?;
    assert_eq!(keys(&both), ["abs", "rel"]);
    h.engine().ack_many(&both)?;

    // Pending across a reopen after the step: due on the wall clock read at open.
    let wall = h.clock.wall_ms();
    h.engine()
        .schedule_at(b"abs2", ms_to_system_time(wall + 10_000), b"")?;
    h.stop(Stop::Clean)?;
    h.clock.step_wall(-3_600_000);
    h.start()?;
    assert!(h.advance(ms(3_600_000 + 9_999))?.is_empty());
    let d = one(h.advance(ms(1))?)?;
    assert_eq!(
        (d.key(), d.due_ms(), d.fired_ms()),
        (&b"abs2"[..], wall + 10_000, wall + 10_000)
    );
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Slow consumers and backpressure

/// Consumers stop receiving while producers keep scheduling: every schedule and cancel
/// still returns, the driver keeps its deadlines (each task is handed out at its due
/// millisecond: `fired_ms == due_ms`), and the ready queue grows by exactly what fell due.
/// When the consumers catch up, it drains to zero.
#[test]
fn slow_consumers_ready_queue_grows_then_drains() -> TestResult {
    let h = SimHarness::new(480, cfg(LEASE_LONG_MS, 3, 0))?;
    let e = h.engine();
    let consumer = e.consumer();
    let per_ms = 20;
    let millis = 500;
    let mut due_so_far = 0;
    let mut cancelled = 0;
    for t in 0..millis {
        for j in 0..per_ms {
            e.schedule_after(&key(&format!("s{t}-"), j), ms(1), b"")?;
        }
        // Cancel one task due later, keeping the cancel path busy too.
        if t % 10 == 0 {
            e.schedule_after(&key("c-", t), ms(1_000), b"")?;
            assert!(e.cancel(&key("c-", t))?.is_cancelled());
            cancelled += 1;
        }
        h.clock.advance(ms(1));
        e.run_until_idle();
        due_so_far += per_ms;
        let s = e.stats();
        assert_eq!(
            (s.ready, consumer.ready(), s.in_flight),
            (due_so_far, due_so_far, 0)
        );
    }
    assert_eq!(cancelled, millis / 10);
    // Catch up.
    let mut received = Vec::new();
    while let Ok(d) = consumer.try_recv() {
        assert_eq!(d.fired_ms(), d.due_ms(), "{d:?} handed out late");
        received.push(d);
    }
    assert_eq!(received.len(), per_ms * millis);
    assert_eq!(
        counts(e.stats()),
        (0, 0, per_ms * millis, 0, per_ms * millis)
    );
    for chunk in received.chunks(1_000) {
        consumer.ack_many(chunk)?;
    }
    assert_eq!(counts(e.stats()), (0, 0, 0, 0, 0));
    Ok(())
}

/// The same with real threads: a producer schedules as fast as it can while the clock moves
/// and no consumer runs; then eight consumers start and drain the queue; every task is
/// received exactly once.
#[test]
fn slow_consumers_with_threads() -> TestResult {
    let n = scaled(50_000, 1_000_000);
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(cfg(LEASE_LONG_MS, 3, 0), Arc::new(clock.clone()))?;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| -> TestResult {
        let producer = s.spawn(|| -> TestResult {
            for i in 0..n {
                engine.schedule_after(&key("p-", i), ms(1), b"")?;
            }
            Ok(())
        });
        let ticker = s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                clock.advance(ms(1));
                engine.run_until_idle();
            }
        });
        producer.join().map_err(|_| "producer panicked")??;
        clock.advance(ms(2));
        engine.run_until_idle();
        done.store(true, Ordering::Release);
        ticker.join().map_err(|_| "ticker panicked")?;
        Ok(())
    })?;
    assert_eq!(engine.stats().ready, n);
    let seen: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    std::thread::scope(|s| -> TestResult {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let c = engine.consumer();
                let seen = &seen;
                s.spawn(move || -> TestResult {
                    while let Ok(d) = c.try_recv() {
                        let i: usize = std::str::from_utf8(&d.key()[2..])?.parse()?;
                        assert!(!seen[i].swap(true, Ordering::Relaxed), "{d:?} twice");
                        c.ack(&d)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "consumer panicked")??;
        }
        Ok(())
    })?;
    assert!(seen.iter().all(|b| b.load(Ordering::Relaxed)));
    assert_eq!(counts(engine.stats()), (0, 0, 0, 0, 0));
    engine.shutdown()?;
    Ok(())
}

/// `pending_tasks_max` bounds scheduled + ready + in flight (dead letters are not counted):
/// beyond it `schedule`, `schedule_many`, an upsert of a new key and a requeue return
/// `TooManyPending` and change nothing (a live key is `AlreadyExists` first); finishing a task
/// makes room again.
#[test]
fn pending_tasks_max_gives_too_many_pending() -> TestResult {
    let mut c = cfg(30_000, 1, 0);
    c.pending_tasks_max = 10;
    let h = SimHarness::new(490, c)?;
    let e = h.engine();
    e.schedule_after(b"dead", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    assert_eq!(e.nack(&d, None, "x")?, NackOutcome::DeadLettered);
    let dead_id = d.task_id();
    for i in 0..10 {
        e.schedule_after(&key("p-", i), ms(1_000 + i as u64), b"")?;
    }
    let full = |r: Result<TaskId, ScheduleError>| {
        assert_matches!(
            r,
            Err(ScheduleError::TooManyPending {
                pending: 10,
                max: 10
            })
        );
    };
    full(e.schedule_after(b"one-more", ms(1), b""));
    // A live key is `AlreadyExists` at the limit too, alone or in a batch
    // that would not fit either.
    assert_matches!(
        e.schedule_after(&key("p-", 3), ms(1), b""),
        Err(ScheduleError::AlreadyExists { .. })
    );
    let live_key = key("p-", 4);
    assert_matches!(
        e.schedule_many(&[
            NewTask {
                key: b"one-more",
                due: Due::After(ms(1)),
                payload: b"",
            },
            NewTask {
                key: &live_key,
                due: Due::After(ms(1)),
                payload: b"",
            },
        ]),
        Err(ScheduleError::AlreadyExists { .. })
    );
    assert_matches!(
        e.reschedule(b"one-more", Due::After(ms(1)), None),
        Err(ScheduleError::TooManyPending { .. })
    );
    full(e.requeue_dead_letter(dead_id, Due::After(ms(1))));
    // Rescheduling a live task needs no room.
    e.reschedule(&key("p-", 0), Due::After(ms(1_000)), None)?;
    // Handed out and received tasks still count.
    let ds = h.advance(ms(1_004))?;
    assert_eq!(ds.len(), 5);
    e.run_until_idle();
    assert_eq!(counts(e.stats()), (5, 0, 5, 1, 10));
    full(e.schedule_after(b"one-more", ms(1), b""));
    h.clock.advance(ms(5));
    e.run_until_idle();
    assert_eq!(counts(e.stats()), (0, 5, 5, 1, 10));
    full(e.schedule_after(b"one-more", ms(1), b""));
    // Finishing two makes room for two, not three (a batch is all or nothing).
    e.ack_many(&ds[..2])?;
    let batch: Vec<Vec<u8>> = (0..3).map(|i| key("b-", i)).collect();
    let tasks: Vec<NewTask<'_>> = batch
        .iter()
        .map(|k| NewTask {
            key: k,
            due: Due::After(ms(1)),
            payload: b"",
        })
        .collect();
    assert_matches!(
        e.schedule_many(&tasks),
        Err(ScheduleError::TooManyPending {
            pending: 8,
            max: 10
        })
    );
    assert_eq!(e.stats().pending, 8);
    e.schedule_many(&tasks[..2])?;
    full(e.requeue_dead_letter(dead_id, Due::After(ms(1))));
    assert!(e.cancel(&batch[0])?.is_cancelled());
    e.requeue_dead_letter(dead_id, Due::After(ms(1)))?;
    assert_eq!(counts(e.stats()), (2, 5, 3, 0, 10));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// At most once

/// At most once: a delivery finishes its task before the consumer gets it. Ack is a no-op,
/// nack and heartbeat are `NotOutstanding`, cancel says `NotFound`; no lease expires and no
/// restart brings the task back. A task handed out but not yet received at a crash is
/// delivered after the reopen, once, as attempt 1.
#[test]
fn at_most_once_never_redelivers() -> TestResult {
    for (n, how) in STOPS.into_iter().enumerate() {
        let mut c = cfg(1_000, 3, 0);
        c.delivery = DeliveryGuarantee::AtMostOnce;
        let mut h = SimHarness::new(500 + n as u64, c)?;
        let e = h.engine();
        let got = e.schedule_after(b"got", ms(1_000), b"g")?;
        let pending = e.schedule_after(b"pending", ms(2_000), b"p")?;
        let d = one(h.advance(ms(1_000))?)?;
        assert_eq!((d.task_id(), d.attempt()), (got, 1));
        assert_eq!(counts(e.stats()), (1, 0, 0, 0, 1), "finished on receipt");
        e.ack(&d)?;
        e.ack(&d)?;
        e.ack_many(&[d.clone(), d.clone()])?;
        assert_matches!(e.nack(&d, None, "x"), Err(AckError::NotOutstanding { .. }));
        assert_matches!(
            e.extend_lease(&d, ms(1_000)),
            Err(AckError::NotOutstanding { .. })
        );
        assert_eq!(e.cancel(b"got")?, CancelOutcome::NotFound);
        assert!(h.advance(ms(999))?.is_empty(), "no lease, no expiry");
        // "pending" is handed out (+2 s) and not received before the stop.
        h.clock.advance(ms(1));
        e.run_until_idle();
        assert_eq!(e.stats().ready, 1);

        h.restart(how)?;
        let e = h.engine();
        assert_eq!(
            (e.recovery().pending, e.recovery().redelivered),
            (1, 0),
            "{how:?}"
        );
        let p = one(drain(e)?)?;
        assert_eq!((p.task_id(), p.attempt()), (pending, 1), "{how:?}");
        e.ack(&d)?; // a delivery from before the restart: still a no-op
        h.restart(how)?;
        assert_eq!(h.engine().recovery().pending, 0, "{how:?}");
        assert!(h.advance(ms(3_600_000))?.is_empty(), "{how:?}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Exclusive consumers

/// Eight consumers, a million tasks (CI: `KAIROS_TEST_SCALE` ≥ 1 runs the full size; it takes
/// about a second) due within one second of each other, prompt acks: every task is received
/// exactly once, as attempt 1, never before its due time, and nothing is left.
#[test]
fn eight_consumers_receive_each_of_a_million_tasks_exactly_once() -> TestResult {
    const CONSUMERS: usize = 8;
    let n = scaled(1_000_000, 2_000_000);
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(cfg(30_000, 3, 0), Arc::new(clock.clone()))?;
    let keys: Vec<Vec<u8>> = (0..n).map(|i| key("m-", i)).collect();
    for (c, chunk) in keys.chunks(100_000).enumerate() {
        let batch: Vec<NewTask<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(j, k)| NewTask {
                key: k,
                due: Due::At(at(10_000 + ((c * 100_000 + j) % 1_000) as u64)),
                payload: b"",
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    let acked = AtomicUsize::new(0);
    let per_consumer = std::thread::scope(|s| -> TestResult<Vec<Vec<(u64, u64)>>> {
        let workers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let c = engine.consumer();
                let (acked, clock) = (&acked, &clock);
                s.spawn(move || -> TestResult<Vec<(u64, u64)>> {
                    let mut mine = Vec::new();
                    loop {
                        match c.recv() {
                            Ok(d) => {
                                assert!(clock.wall_ms() >= d.due_ms(), "{d:?} early");
                                assert_eq!(d.attempt(), 1, "{d:?}");
                                c.ack(&d)?;
                                mine.push((d.task_id().0, d.due_ms()));
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(RecvError::Closed) => return Ok(mine),
                            Err(e) => return Err(e.into()),
                        }
                    }
                })
            })
            .collect();
        clock.advance(ms(10_000));
        for _ in 0..1_000 {
            clock.advance(ms(1));
            engine.run_until_idle();
        }
        // Real time only bounds a hang; the check is on counts.
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while acked.load(Ordering::Relaxed) < n && std::time::Instant::now() < deadline {
            std::thread::sleep(ms(2));
        }
        let s = engine.stats();
        engine.shutdown()?;
        assert_eq!(counts(s), (0, 0, 0, 0, 0));
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "consumer panicked")?)
            .collect()
    })?;
    let mut seen = vec![false; n + 1];
    let mut total = 0;
    for mine in &per_consumer {
        for &(id, due_ms) in mine {
            let id = id as usize;
            assert!(!seen[id], "task {id} delivered twice");
            seen[id] = true;
            assert_eq!(due_ms, START_MS + 10_000 + ((id - 1) % 1_000) as u64);
            total += 1;
        }
    }
    assert_eq!(total, n);
    let busy = per_consumer.iter().filter(|m| !m.is_empty()).count();
    eprintln!("{n} tasks, {busy} of {CONSUMERS} consumers received some");
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Engine bugs these tests found, fixed; kept as regression tests.

/// Under `Sync`, an ack that returns `Ok` is durable: the task is never delivered again. A
/// cancel that finds the task held (`AlreadyDelivered`) logs a CANCEL and marks the task
/// abandoned; the holder's ack then logs nothing and returns at once — before that CANCEL is
/// durable. A power cut at that moment loses the CANCEL, and the "acked" task is delivered again
/// (attempt 2) after the reopen. The same held for a nack answering `Finished`. Fixed: such an
/// ack or nack waits until everything logged before it (the CANCEL) is durable.
#[test]
fn ack_of_a_task_cancelled_while_held_is_durable_when_it_returns() -> TestResult {
    for nack in [false, true] {
        let mut h = SimHarness::new(900 + u64::from(nack), cfg(60_000, 3, 0))?;
        h.engine().schedule_after(b"k", Duration::ZERO, b"")?;
        let d = one(drain(h.engine())?)?;
        h.sim.set_sync_latency(ms(1_000));
        let finished = std::thread::scope(|s| -> TestResult<bool> {
            let canceller = s.spawn(|| h.engine().cancel(b"k"));
            // Threads genuinely race here: give the cancel time to be applied (it then waits
            // a second for its sync). Should it come later, the ack is logged and waits, and
            // the test passes without showing anything.
            std::thread::sleep(ms(100));
            let finished = if nack {
                h.engine().nack(&d, None, "x")? == NackOutcome::Finished
            } else {
                h.engine().ack(&d).is_ok()
            };
            h.sim.power_cut_drop_unsynced();
            let _ = canceller.join().map_err(|_| "canceller panicked")?;
            Ok(finished)
        })?;
        h.sim.set_sync_latency(Duration::ZERO);
        h.restart(Stop::PowerCutDropUnsynced)?;
        let again = drain(h.engine())?;
        assert!(
            !finished || again.is_empty(),
            "nack: {nack}: the {} returned, yet the task came back: {again:?}",
            if nack { "nack (Finished)" } else { "ack (Ok)" }
        );
    }
    Ok(())
}

/// The refusals are defined by what became of the task, not by how the attempt ended:
/// `LeaseExpired` when this delivery's attempt is over (lease ran out, or nacked) and the task
/// lives on for another attempt; `NotOutstanding` when it is finished. An ack after the
/// holder's own nack (attempts left) is therefore `LeaseExpired`, after a nack that
/// dead-lettered it `NotOutstanding`; both change nothing.
#[test]
fn ack_after_own_nack_is_refused_by_what_became_of_the_task() -> TestResult {
    let h = SimHarness::new(902, cfg(60_000, 2, 0))?;
    h.engine().schedule_after(b"k", Duration::ZERO, b"")?;
    let d = one(drain(h.engine())?)?;
    h.engine().nack(&d, None, "failed")?;
    assert_matches!(h.engine().ack(&d), Err(AckError::LeaseExpired { .. }));
    assert_matches!(
        h.engine().nack(&d, None, "again"),
        Err(AckError::LeaseExpired { .. })
    );
    h.clock.advance(ms(1_000));
    let d2 = one(drain(h.engine())?)?;
    assert_eq!(d2.attempt(), 2);
    assert_eq!(
        h.engine().nack(&d2, None, "last")?,
        NackOutcome::DeadLettered
    );
    assert_matches!(h.engine().ack(&d2), Err(AckError::NotOutstanding { .. }));
    assert_eq!(h.engine().dead_letters().len(), 1);
    Ok(())
}

/// The answer to a late ack does not depend on whether the driver has processed the expiry
/// yet: when the lease of the last attempt has run out, the task is (or is about to be) a dead
/// letter, so the ack is `NotOutstanding` before and after `run_until_idle`; the same for a
/// lease that ran out after a cancel abandoned the task.
#[test]
fn late_ack_answer_does_not_depend_on_the_driver() -> TestResult {
    let h = SimHarness::new(903, cfg(10_000, 1, 0))?;
    let e = h.engine();
    e.schedule_after(b"k", Duration::ZERO, b"")?;
    let d = one(drain(e)?)?;
    e.schedule_after(b"j", Duration::ZERO, b"")?;
    let dj = one(drain(e)?)?;
    assert!(matches!(
        e.cancel(b"j")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    ));
    h.clock.advance(ms(10_000));
    assert_matches!(e.ack(&d), Err(AckError::NotOutstanding { .. }));
    assert_matches!(e.ack(&dj), Err(AckError::NotOutstanding { .. }));
    e.run_until_idle();
    assert_eq!(e.dead_letters().len(), 1);
    assert_matches!(e.ack(&d), Err(AckError::NotOutstanding { .. }));
    assert_matches!(e.ack(&dj), Err(AckError::NotOutstanding { .. }));
    Ok(())
}

/// `Stats::catch_up_backlog` is "the backlog found at open not yet handed out". A backlog task
/// rescheduled to a later due time has left the backlog (it now waits in the wheel), but is
/// was still counted (4 instead of 3).
#[test]
fn catch_up_backlog_stat_excludes_rescheduled_tasks() -> TestResult {
    let mut c = cfg(60_000, 3, 0);
    c.catch_up_tasks_per_sec = Some(1);
    let mut h = SimHarness::new(904, c)?;
    for i in 0..5 {
        h.engine().schedule_after(&key("k", i), ms(1), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(ms(10_000));
    h.start()?;
    let e = h.engine();
    e.run_until_idle();
    assert_eq!(e.stats().catch_up_backlog, 4);
    e.reschedule(b"k3", Due::After(ms(60_000)), None)?;
    assert_eq!(e.stats().catch_up_backlog, 3);
    Ok(())
}

/// A backlog task that left the backlog and waits untimed again — rescheduled to a past due
/// time, handed out from the overdue queue, nacked to retry at once — is no longer the
/// backlog's: it is neither counted in `Stats::catch_up_backlog` nor handed out on a catch-up
/// token. Its old backlog entry used to look live again (it only checked that the task waited
/// without a timer): the stat said 2 where only `c` was left, and at the resume `a` took the
/// one token the rate allows, so `c` came a second late.
#[test]
fn a_task_that_left_the_backlog_takes_no_catch_up_token() -> TestResult {
    let mut c = cfg(60_000, 3, 0);
    c.catch_up_tasks_per_sec = Some(1);
    let mut h = SimHarness::new(906, c)?;
    for (k, due) in [(b"b", 1_000), (b"a", 2_000), (b"c", 3_000)] {
        h.engine()
            .schedule(k, Due::At(ms_to_system_time(START_MS + due)), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(ms(10_000));
    h.start()?;
    let e = h.engine();
    let got = drain(e)?;
    assert_eq!(keys(&got), ["b"], "one token at open");
    e.ack(&got[0])?;
    // `a` leaves the backlog: due in the past, it goes out at once, off the rate.
    let past = Due::At(ms_to_system_time(START_MS + 500));
    assert_matches!(
        e.reschedule(b"a", past, None)?,
        RescheduleOutcome::Rescheduled(_)
    );
    let got = drain(e)?;
    assert_eq!(keys(&got), ["a"]);
    assert_eq!(
        e.stats().catch_up_backlog,
        1,
        "only c is left of the backlog"
    );
    e.pause_deliveries();
    e.nack(&got[0], Some(Duration::ZERO), "retry now")?;
    assert_eq!(
        e.stats().catch_up_backlog,
        1,
        "a waits for its retry, not in the backlog"
    );
    // Counted afresh from the resume: one token at once, for c; a's retry is not rate-limited.
    e.resume_deliveries();
    let mut got = keys(&drain(e)?);
    got.sort();
    assert_eq!(got, ["a", "c"]);
    Ok(())
}

/// A clean shutdown while the driver waits for its deliver records to become durable: the
/// tasks of that pass are logged as delivered but not yet in the ready queue. The shutdown
/// used to release only the queue, so after reopen such a task looked in flight at a crash
/// (attempt raised, or dead-lettered with `max_attempts = 1`) though no consumer ever saw it.
/// Fixed: the shutdown lets the driver finish its pass, then releases the whole queue.
#[test]
fn clean_shutdown_during_a_delivery_pass_releases_its_tasks() -> TestResult {
    let mut h = SimHarness::new(905, cfg(60_000, 1, 0))?;
    h.sim.set_sync_latency(ms(300));
    h.engine().schedule_after(b"k", ms(1), b"p")?;
    h.clock.advance(ms(1));
    // The driver wakes, logs DELIVER and waits ~300 ms for its sync; the shutdown lands in
    // that wait (if it comes later, the task is simply in the queue: the test still holds).
    std::thread::sleep(ms(50));
    h.stop(Stop::Clean)?;
    h.sim.set_sync_latency(Duration::ZERO);
    h.start()?;
    let r = h.engine().recovery().clone();
    assert_eq!(
        (r.redelivered, r.dead_lettered, r.overdue),
        (0, 0, 1),
        "{r:?}"
    );
    let d = one(drain(h.engine())?)?;
    assert_eq!((d.key(), d.attempt()), (&b"k"[..], 1));
    h.engine().ack(&d)?;
    assert!(h.engine().dead_letters().is_empty());
    Ok(())
}

/// Polls `done` every millisecond for up to 20 s of real time (a condition reached by the
/// engine's threads, not by the manual clock).
fn eventually(what: &str, mut done: impl FnMut() -> bool) -> TestResult {
    for _ in 0..20_000 {
        if done() {
            return Ok(());
        }
        std::thread::sleep(ms(1));
    }
    Err(format!("not reached within 20 s: {what}").into())
}

/// The driver does not wait for a pass's records to be durable before the next pass: a task
/// falling due while the previous pass's fdatasync is under way is logged at once (its state
/// is `Ready`) while the earlier task is not yet handed out. Consumers still get each task
/// only once its deliver record is durable, in hand-out order.
#[test]
fn the_driver_logs_the_next_pass_while_the_last_one_syncs() -> TestResult {
    let h = SimHarness::new(908, cfg(60_000, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"a", ms(1), b"")?;
    e.schedule_after(b"b", ms(2), b"")?;
    let consumer = e.consumer();
    h.sim.set_sync_latency(ms(2_000));
    h.clock.advance(ms(1));
    eventually("a logged as delivered", || e.stats().ready == 1)?;
    h.clock.advance(ms(1));
    eventually("b logged as delivered", || e.stats().ready == 2)?;
    // a's sync (and the one proving it) takes 4 s: it is not handed out yet (this thread
    // would have to stall that long between the two checks for it to be).
    assert_matches!(consumer.try_recv(), Err(RecvError::Empty));
    h.sim.set_sync_latency(Duration::ZERO);
    let got = drain(e)?;
    assert_eq!(keys(&got), ["a", "b"]);
    assert_eq!(
        got.iter().map(Delivery::fired_ms).collect::<Vec<_>>(),
        [START_MS + 1, START_MS + 2]
    );
    Ok(())
}

/// Rescheduling a task whose pass is still syncing (logged as delivered, not yet in the ready
/// queue) drops that pass's entry for it too: when the task falls due again, a consumer gets
/// it once, from its new hand-out — not through the old entry, with the old hand-out time.
#[test]
fn reschedule_of_a_task_whose_pass_is_syncing_drops_its_entry() -> TestResult {
    let h = SimHarness::new(910, cfg(60_000, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"k", ms(1), b"")?;
    h.sim.set_sync_latency(ms(500));
    h.clock.advance(ms(1));
    eventually("k logged as delivered", || e.stats().ready == 1)?;
    // Returns once its own records are durable, after the pass's.
    e.reschedule(b"k", Due::After(ms(4)), None)?;
    h.clock.advance(ms(4));
    eventually("k logged as delivered again", || e.stats().ready == 1)?;
    h.sim.set_sync_latency(Duration::ZERO);
    let d = one(drain(e)?)?;
    assert_eq!(
        (d.key(), d.fired_ms(), d.attempt()),
        (&b"k"[..], START_MS + 5, 1)
    );
    h.clock.advance(ms(1_000));
    assert!(drain(e)?.is_empty(), "delivered once");
    Ok(())
}

/// A clean shutdown while several passes wait for their records to be durable: every task
/// they logged as delivered reaches the ready queue first and is released, so after reopen
/// each is delivered again as its first attempt (not as one in flight at a crash).
#[test]
fn clean_shutdown_with_several_passes_syncing_releases_them_all() -> TestResult {
    let mut h = SimHarness::new(909, cfg(60_000, 1, 0))?;
    for i in 0..3 {
        h.engine()
            .schedule_after(&key("k", i), ms(1 + i as u64), b"p")?;
    }
    h.sim.set_sync_latency(ms(300));
    for i in 0..3 {
        h.clock.advance(ms(1));
        let e = h.engine();
        eventually("the pass logged", || e.stats().ready == i + 1)?;
    }
    h.stop(Stop::Clean)?;
    h.sim.set_sync_latency(Duration::ZERO);
    h.start()?;
    let r = h.engine().recovery().clone();
    assert_eq!(
        (r.redelivered, r.dead_lettered, r.overdue),
        (0, 0, 3),
        "{r:?}"
    );
    let got = drain(h.engine())?;
    assert_eq!(keys(&got), ["k0", "k1", "k2"]);
    assert!(got.iter().all(|d| d.attempt() == 1));
    Ok(())
}

/// Found by the deterministic simulation (seed 23): rescheduling a task that was handed out but
/// not yet received left its ready-queue entry behind; when the task was handed out again, a
/// consumer received it through the stale entry — with the first hand-out's time (before the
/// new due time) and ahead of tasks handed out meanwhile. The reschedule now drops the entry.
#[test]
fn reschedule_of_a_ready_task_drops_its_queue_entry() -> TestResult {
    let h = SimHarness::new(906, cfg(60_000, 3, 0))?;
    let e = h.engine();
    e.schedule_after(b"k", ms(10), b"")?;
    h.clock.advance(ms(10));
    e.run_until_idle(); // handed out, not received
    assert_eq!(e.stats().ready, 1);
    e.reschedule(b"k", Due::After(ms(1_000)), None)?;
    e.schedule_after(b"j", ms(500), b"")?;
    h.clock.advance(ms(500));
    let first = one(drain(e)?)?;
    assert_eq!(first.key(), b"j");
    h.clock.advance(ms(500));
    let d = one(drain(e)?)?;
    assert_eq!(d.key(), b"k");
    assert_eq!(d.due_ms(), START_MS + 1_010);
    assert_eq!(
        d.fired_ms(),
        START_MS + 1_010,
        "fired at the new due time, not the old one"
    );
    assert_eq!(d.attempt(), 1);
    Ok(())
}

/// Found by the deterministic simulation: `run_until_idle` compared ticks, so a clock move
/// within one tick that earned catch-up tokens returned before the driver handed those tasks
/// out. It now waits for the driver to catch up with the clock reading itself.
#[test]
fn run_until_idle_waits_for_catch_up_tokens_earned_within_a_tick() -> TestResult {
    let mut c = cfg(60_000, 3, 0);
    c.tick = ms(10);
    c.catch_up_tasks_per_sec = Some(1_000);
    let mut h = SimHarness::new(907, c)?;
    for i in 0..50 {
        h.engine().schedule_after(&key("k", i), ms(10), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(ms(60_000));
    h.start()?;
    let first = drain(h.engine())?.len();
    assert_eq!(first, 1, "one token at open");
    for step in 1..=4u64 {
        h.clock.advance(ms(1)); // within the same 10 ms tick
        let got = drain(h.engine())?.len();
        assert_eq!(got, 1, "step {step}: one more token per ms at 1000/s");
    }
    Ok(())
}

/// After a poisoned engine's shutdown (its memory released), every call
/// answers from what it had: `stats` the counters at the shutdown, the dead
/// letters listed (all, or a page), a lookup, a cancel, a checkpoint and a
/// sync `Poisoned` with the original cause.
#[test]
fn a_poisoned_engine_answers_the_same_after_its_shutdown() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let h = SimHarness::new(446, cfg(30_000, 1, 0))?;
    let e = h.engine();
    let dead = e.schedule_after(b"dead", Duration::ZERO, b"d")?;
    for d in drain(e)? {
        assert_eq!(e.nack(&d, None, "no")?, NackOutcome::DeadLettered);
    }
    e.schedule_after(b"waiting", ms(60_000), b"w")?;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Write,
        kind: FaultKind::Eio,
    });
    let cause = match e.schedule_after(b"lost", ms(60_000), b"") {
        Err(kairos::ScheduleError::Poisoned { cause }) => cause,
        other => return Err(format!("{other:?}").into()),
    };
    h.sim.clear_faults();
    let before = e.stats();
    // The schedule that failed is in memory (its outcome is unknown).
    assert_eq!((before.pending, before.dead_letters), (2, 1));
    assert!(e.shutdown().is_err());
    assert_eq!(e.stats(), before);
    let listed = |ds: Vec<kairos::DeadLetter>| -> Vec<(TaskId, Vec<u8>)> {
        ds.into_iter().map(|d| (d.task_id, d.key)).collect()
    };
    assert_eq!(listed(e.dead_letters()), [(dead, b"dead".to_vec())]);
    assert_eq!(
        listed(e.dead_letters_after(None, 1)),
        [(dead, b"dead".to_vec())]
    );
    assert!(e.dead_letters_after(Some(dead), 1).is_empty());
    let poisoned = |what: &str, got: String| {
        assert!(got.contains(&cause), "{what}: {got}");
    };
    poisoned("lookup", format!("{:?}", e.lookup(b"waiting")));
    poisoned("cancel", format!("{:?}", e.cancel(b"waiting")));
    poisoned("checkpoint", format!("{:?}", e.checkpoint()));
    poisoned("sync", format!("{:?}", e.sync()));
    Ok(())
}

/// Two threads shutting the engine down at once (a signal handler and the main thread, say)
/// while a delivery pass waits for its fdatasync: neither call returns before the shutdown is
/// complete — the log closed (its `CLOSED` marker written) and the directory free for a reopen
/// — and the task the pass logged as delivered, which no consumer received, is taken back as
/// after a single shutdown: delivered again after the reopen as its first attempt, not
/// dead-lettered as an attempt lost in flight. (Before, the second call to get past the
/// driver's join found the log taken by the first, returned `Ok` and unlocked the directory
/// while the first was still closing the log.)
#[test]
fn concurrent_shutdowns_return_once_the_log_is_closed() -> TestResult {
    let mut h = SimHarness::new(911, cfg(60_000, 1, 0))?;
    h.engine().schedule_after(b"k", ms(1), b"p")?;
    h.sim.set_sync_latency(ms(300));
    h.clock.advance(ms(1));
    {
        let e = h.engine();
        eventually("the pass logged", || e.stats().ready == 1)?;
        let closed = h.wal_dir().join(kairos_wal::format::CLOSED_FILE_NAME);
        let (sim, closed) = (&h.sim, &closed);
        let answers = std::thread::scope(|s| {
            let calls: Vec<_> = (0..2)
                .map(|_| s.spawn(move || e.shutdown().map(|()| sim.read_file(closed).is_some())))
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().map_err(|_| "shutdown panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        for a in answers {
            assert!(a?, "a shutdown returned before the log was closed");
        }
    }
    h.stop(Stop::Clean)?;
    h.sim.set_sync_latency(Duration::ZERO);
    h.start()?;
    let r = h.engine().recovery().clone();
    assert!(r.wal.clean_shutdown, "{r:?}");
    assert_eq!(
        (r.redelivered, r.dead_lettered, r.overdue),
        (0, 0, 1),
        "{r:?}"
    );
    let d = one(drain(h.engine())?)?;
    assert_eq!((d.key(), d.attempt()), (&b"k"[..], 1));
    Ok(())
}
