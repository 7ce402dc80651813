//! The public API's rustdoc, claim by claim: each test asserts, with exact values, a
//! behaviour an embedder reads in the docs of `Engine`, `Consumer`, `Config`, the error
//! types, `Stats`, `Recovery` or the clock, and that no other test pinned. The doc item
//! each test checks is named in its comment.

mod common;

use common::{config, drain, SimHarness, Stop, TestResult, START_MS};
use kairos::config::{
    KEY_BYTES_MAX_LIMIT, LEASE_MAX, PAYLOAD_BYTES_MAX_LIMIT, PENDING_TASKS_LIMIT, TICK_MAX,
};
use kairos::{
    AckError, CancelError, CancelOutcome, CheckpointError, Config, Due, Durability, Engine,
    ManualClock, NackOutcome, NewTask, OpenError, RecvError, RescheduleOutcome, RetryPolicy,
    ScheduleError, Stats, SyncError,
};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

macro_rules! assert_matches {
    ($e:expr, $p:pat $(if $g:expr)?) => {
        match $e {
            $p $(if $g)? => {}
            ref other => panic!("expected {}, got {:?}", stringify!($p), other),
        }
    };
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An in-memory engine on a manual clock at `START_MS`.
fn in_memory(c: Config) -> TestResult<(Engine, ManualClock)> {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(c, Arc::new(clock.clone()))?;
    Ok((engine, clock))
}

/// The reason `Config::check` gives, or `None` if it accepts the configuration.
fn check_reason(c: &Config) -> Option<String> {
    match c.check() {
        Ok(()) => None,
        Err(OpenError::InvalidConfig { reason }) => Some(reason),
        Err(other) => Some(format!("not InvalidConfig: {other}")),
    }
}

/// `(scheduled, ready, in_flight, dead_letters, pending)`.
fn counts(s: Stats) -> (usize, usize, usize, usize, usize) {
    (s.scheduled, s.ready, s.in_flight, s.dead_letters, s.pending)
}

// ----------------------------------------------------------------------------------------
// Config limits

/// `Config::check`: "InvalidConfig naming the first bad field and its limit", for every field
/// with a limit; and each limit itself is accepted (the field docs give them as inclusive
/// ranges: tick 1 ms..=1 h, key_bytes_max 1..=65535, payload_bytes_max ≤ the limit,
/// pending_tasks_max 1..=2^31, lease 1 ms..=12 h, delay_max at most tick × 2^41, segment_bytes
/// at least 4 KiB, synced_mark_delay at most its maximum).
#[test]
fn config_check_names_each_bad_field_and_accepts_each_limit() {
    type Tweak = fn(&mut Config);
    let bad: [(Tweak, &str); 25] = [
        (
            |c| c.tick = TICK_MAX + ms(1),
            "tick must be a whole number of milliseconds in 1 ms..=1 h, got 3600.001s",
        ),
        (
            |c| c.tick = Duration::from_micros(999),
            "tick must be a whole number of milliseconds in 1 ms..=1 h, got 999µs",
        ),
        (
            |c| c.horizon = Some(ms(59_999)),
            "horizon 59.999s is shorter than payload_window 60s",
        ),
        (
            |c| c.key_bytes_max = KEY_BYTES_MAX_LIMIT + 1,
            "key_bytes_max must be in 1..=65535, got 65536",
        ),
        (
            |c| c.key_bytes_max = 0,
            "key_bytes_max must be in 1..=65535, got 0",
        ),
        (
            |c| c.payload_bytes_max = PAYLOAD_BYTES_MAX_LIMIT + 1,
            "payload_bytes_max must be ≤ 16646144, got 16646145",
        ),
        (
            |c| c.pending_tasks_max = PENDING_TASKS_LIMIT + 1,
            "pending_tasks_max must be in 1..=2147483648, got 2147483649",
        ),
        (
            |c| c.pending_tasks_max = 0,
            "pending_tasks_max must be in 1..=2147483648, got 0",
        ),
        (
            |c| c.delay_max = Duration::ZERO,
            "delay_max must be above zero, got 0ns",
        ),
        (
            |c| c.delay_max = ms((1 << 41) + 1),
            "delay_max 2199023255.553s exceeds the wheel's range of 2199023255552 ms at this tick",
        ),
        (
            |c| c.lease = Duration::ZERO,
            "lease must be a whole number of milliseconds in 1 ms..=43200s, got 0ns",
        ),
        (
            |c| c.lease = LEASE_MAX + ms(1),
            "lease must be a whole number of milliseconds in 1 ms..=43200s, got 43200.001s",
        ),
        (
            |c| c.lease = Duration::from_micros(1_500),
            "lease must be a whole number of milliseconds in 1 ms..=43200s, got 1.5ms",
        ),
        (
            |c| c.retry.max_attempts = 0,
            "retry.max_attempts must be at least 1",
        ),
        (
            |c| c.retry.backoff_multiplier = 0,
            "retry.backoff_multiplier must be at least 1",
        ),
        (
            |c| c.retry.backoff_jitter_percent = 101,
            "retry.backoff_jitter_percent must be ≤ 100, got 101",
        ),
        (
            |c| c.retry.backoff_max = c.delay_max + ms(1),
            "retry.backoff_max 315360000.001s exceeds delay_max 315360000s",
        ),
        (
            |c| c.catch_up_tasks_per_sec = Some(0),
            "catch_up_tasks_per_sec must be at least 1 (or None)",
        ),
        (
            |c| c.relocate_far_tasks = Some(0),
            "relocate_far_tasks must be at least 1 (or None)",
        ),
        (
            |c| c.relocate_far_bytes = 0,
            "relocate_far_bytes must be at least 1",
        ),
        (
            |c| c.checkpoint_log_bytes = Some(0),
            "checkpoint_log_bytes must be at least 1 (or None)",
        ),
        (
            |c| c.checkpoint_interval = Some(Duration::ZERO),
            "checkpoint_interval must be positive (or None)",
        ),
        (
            |c| c.durability = Durability::Interval(Duration::ZERO),
            "durability Interval needs a non-zero interval",
        ),
        (
            |c| c.segment_bytes = kairos::kairos_wal::SEGMENT_BYTES_MIN - 1,
            "segment_bytes must be ≥ 4096, got 4095",
        ),
        (
            |c| c.synced_mark_delay = Some(kairos::kairos_wal::SYNCED_MARK_DELAY_MAX + ms(1)),
            "synced_mark_delay must be ≤ 3600s (or None), got 3600.001s",
        ),
    ];
    for (tweak, reason) in bad {
        let mut c = Config::default();
        tweak(&mut c);
        assert_eq!(check_reason(&c).as_deref(), Some(reason));
        let shown = c.check().map_err(|e| e.to_string());
        assert_eq!(shown, Err(format!("invalid configuration: {reason}")));
    }

    let limits: [Tweak; 11] = [
        |c| c.tick = TICK_MAX,
        |c| c.tick = ms(1),
        |c| c.key_bytes_max = KEY_BYTES_MAX_LIMIT,
        |c| c.key_bytes_max = 1,
        |c| c.payload_bytes_max = PAYLOAD_BYTES_MAX_LIMIT,
        |c| c.payload_bytes_max = 0,
        |c| c.pending_tasks_max = PENDING_TASKS_LIMIT,
        |c| c.lease = LEASE_MAX,
        |c| c.delay_max = ms(1 << 41),
        |c| c.segment_bytes = kairos::kairos_wal::SEGMENT_BYTES_MIN,
        |c| c.synced_mark_delay = Some(kairos::kairos_wal::SYNCED_MARK_DELAY_MAX),
    ];
    for (i, tweak) in limits.into_iter().enumerate() {
        let mut c = Config::default();
        tweak(&mut c);
        assert_eq!(check_reason(&c), None, "limit #{i}: {c:?}");
    }
    // delay_max is bounded by the tick: at a 10 ms tick, ten times as far.
    let mut c = Config::default();
    c.tick = ms(10);
    c.delay_max = ms(10 << 41);
    assert_eq!(check_reason(&c), None);
    c.delay_max += ms(1);
    assert!(check_reason(&c).is_some_and(|r| r.starts_with("delay_max ")));
}

/// `Config::far_span`: the horizon, or the resident window (at least the payload window) if
/// shorter; `None` without a horizon.
#[test]
fn far_span_is_the_horizon_or_the_shorter_resident_window() {
    let with = |horizon: Option<u64>, resident: Option<u64>, payload: Option<u64>| {
        let mut c = Config::default();
        c.horizon = horizon.map(ms);
        c.resident_window = resident.map(ms);
        c.payload_window = payload.map(ms);
        c.far_span()
    };
    assert_eq!(Config::default().far_span(), Some(ms(60_000)));
    assert_eq!(with(None, Some(60_000), Some(60_000)), None);
    assert_eq!(
        with(Some(1_000_000), None, Some(60_000)),
        Some(ms(1_000_000))
    );
    assert_eq!(
        with(Some(1_000_000), Some(10_000), Some(60_000)),
        Some(ms(60_000)),
        "a window shorter than payload_window counts as payload_window"
    );
    assert_eq!(
        with(Some(1_000_000), Some(5_000_000), Some(60_000)),
        Some(ms(1_000_000)),
        "only where shorter than the horizon"
    );
    assert_eq!(with(Some(1_000_000), Some(10_000), None), Some(ms(10_000)));
}

/// `RetryPolicy::backoff`: `min(backoff_max, initial × multiplier^(n−1))`; a multiplier of 1
/// keeps the delay constant, and a jitter of 100 % may take all of it but never adds.
#[test]
fn backoff_follows_the_documented_formula() {
    let mut p = RetryPolicy::default();
    p.backoff_jitter_percent = 0;
    let secs: Vec<u64> = (1..=11).map(|n| p.backoff(1, n).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    p.backoff_multiplier = 3;
    p.backoff_initial = ms(10);
    let millis: Vec<u128> = (1..=4).map(|n| p.backoff(1, n).as_millis()).collect();
    assert_eq!(millis, [10, 30, 90, 270]);
    p.backoff_multiplier = 1;
    assert_eq!(p.backoff(1, 50), ms(10));
    // "≥ 1": attempt 0 is treated as the first.
    assert_eq!(p.backoff(1, 0), ms(10));
    p.backoff_jitter_percent = 100;
    for id in 0..100 {
        assert!(p.backoff(id, 1) <= ms(10));
    }
}

// ----------------------------------------------------------------------------------------
// Error texts

/// The `Display` texts of the errors a caller logs name the key (lossy UTF-8), the task id,
/// the sizes and the limits, with the values of the call that failed.
#[test]
fn error_texts_name_the_key_the_task_and_the_limit() -> TestResult {
    let mut c = config(Durability::Sync);
    c.key_bytes_max = 8;
    c.payload_bytes_max = 4;
    c.pending_tasks_max = 3;
    c.lease = ms(1_000);
    c.delay_max = ms(10_000);
    c.retry.backoff_max = ms(1_000);
    let (e, _clock) = in_memory(c)?;
    let text = |r: Result<kairos::TaskId, ScheduleError>| r.map_err(|e| e.to_string());
    let err = |s: &str| Err(s.to_string());
    assert_eq!(text(e.schedule_after(b"", ms(1), b"")), err("empty key"));
    assert_eq!(
        text(e.schedule_after(b"123456789", ms(1), b"")),
        err("key is 9 bytes, the maximum is 8")
    );
    assert_eq!(
        text(e.schedule_after(b"k", ms(1), b"12345")),
        err("payload is 5 bytes, the maximum is 4")
    );
    assert_eq!(
        text(e.schedule_after(b"k", ms(10_001), b"")),
        err("due time 1700000010001 ms is past the latest accepted 1700000010000 ms (now + delay_max)")
    );
    assert_eq!(
        text(e.schedule_at(b"k", UNIX_EPOCH - ms(1), b"")),
        err("due time is before the Unix epoch")
    );
    // "saturated at u64::MAX".
    assert_matches!(
        e.schedule_after(b"k", Duration::MAX, b""),
        Err(ScheduleError::DueTooFar {
            due_ms: u64::MAX,
            max_ms: 1_700_000_010_000
        })
    );

    let held = e.schedule_after(b"held", Duration::ZERO, b"")?;
    assert_eq!(
        text(e.schedule_after(b"held", ms(1), b"")),
        err("a task with key \"held\" is already pending")
    );
    let batch = [
        NewTask {
            key: b"d",
            due: Due::After(ms(1)),
            payload: b"",
        },
        NewTask {
            key: b"d",
            due: Due::After(ms(1)),
            payload: b"",
        },
    ];
    assert_eq!(
        e.schedule_many(&batch).map_err(|e| e.to_string()),
        Err("key \"d\" appears twice in one batch".to_string())
    );
    // Lossily as UTF-8: an invalid byte shows as U+FFFD.
    e.schedule_after(b"\xff", ms(5_000), b"")?;
    assert_matches!(
        e.schedule_after(b"\xff", ms(1), b""),
        Err(ScheduleError::AlreadyExists { ref key }) if key == "\u{FFFD}"
    );
    e.schedule_after(b"third", ms(5_000), b"")?;
    assert_eq!(
        text(e.schedule_after(b"fourth", ms(1), b"")),
        err("3 tasks are pending; the maximum is 3")
    );
    let d = drain(&e)?.pop().ok_or("the due task")?;
    assert_eq!(d.task_id(), held);
    assert_eq!(
        e.reschedule(b"held", Due::After(ms(1)), None)
            .map_err(|e| e.to_string()),
        Err("task \"held\" is held by a consumer".to_string())
    );
    assert_eq!(
        text(e.requeue_dead_letter(kairos::TaskId(999), Due::After(ms(1)))),
        err("no dead letter with task id 999")
    );

    let ack_text = |r: Result<(), AckError>| r.map_err(|e| e.to_string());
    assert_eq!(
        ack_text(e.extend_lease(&d, Duration::ZERO)),
        Err("lease of 0 ms is not in 1..=43200000 ms".to_string())
    );
    assert_eq!(
        e.nack(&d, Some(ms(10_001)), "x").map_err(|e| e.to_string()),
        Err("retry after 10001 ms is past the maximum delay of 10000 ms".to_string())
    );
    assert_eq!(
        e.nack(&d, Some(ms(5)), "x")?,
        NackOutcome::Retry {
            next_attempt: 2,
            due: UNIX_EPOCH + ms(START_MS + 5)
        }
    );
    assert_eq!(
        ack_text(e.ack(&d)),
        Err(format!(
            "the attempt of task {}'s delivery is over (lease expired or nacked); the task is retried",
            held.0
        ))
    );
    assert!(e.cancel(b"held")?.is_cancelled());
    assert_eq!(
        ack_text(e.ack(&d)),
        Err(format!(
            "delivery of task {} is not outstanding (finished, stale, from another engine, or given twice to one ack_many)",
            held.0
        ))
    );

    let consumer = e.consumer();
    assert_eq!(
        consumer
            .try_recv()
            .map_err(|e| e.to_string())
            .err()
            .as_deref(),
        Some("no task is ready")
    );
    assert_eq!(
        consumer
            .recv_timeout(Duration::ZERO)
            .map_err(|e| e.to_string())
            .err()
            .as_deref(),
        Some("timed out waiting for a task")
    );
    e.shutdown()?;
    let closed = "the engine is shut down";
    assert_eq!(text(e.schedule_after(b"k", ms(1), b"")), err(closed));
    assert_eq!(
        e.cancel(b"k").map_err(|e| e.to_string()),
        Err(closed.to_string())
    );
    assert_eq!(ack_text(e.ack(&d)), Err(closed.to_string()));
    assert_eq!(
        consumer
            .try_recv()
            .map_err(|e| e.to_string())
            .err()
            .as_deref(),
        Some(closed)
    );
    assert_eq!(e.sync().map_err(|e| e.to_string()), Err(closed.to_string()));
    assert_eq!(
        e.checkpoint().map_err(|e| e.to_string()).err().as_deref(),
        Some("an in-memory engine has no checkpoints")
    );
    Ok(())
}

/// `OpenError::Locked` names the directory and its lock file; `CheckpointError::Closed` says
/// the engine is shut down.
#[test]
fn a_second_open_names_the_directory_and_its_lock_file() -> TestResult {
    let mut h = SimHarness::new(1, config(Durability::Sync))?;
    let second = h.open().map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(
        second,
        Err("data directory /kairos is already open (lock held on /kairos/LOCK)".to_string())
    );
    h.engine().shutdown()?;
    assert_matches!(h.engine().checkpoint(), Err(CheckpointError::Closed));
    assert_eq!(
        h.engine()
            .checkpoint()
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err("engine is shut down".to_string())
    );
    h.stop(Stop::Clean)?;
    h.start()?; // released
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Stats and limits

/// `Stats::pending` is `scheduled + ready + in_flight`, and `payload_bytes_in_memory` counts
/// "live tasks and dead letters": a dead letter's payload stays counted until it is purged.
/// `Consumer::ready` is `Stats::ready`.
#[test]
fn stats_pending_is_the_sum_and_dead_letter_payloads_count_in_memory() -> TestResult {
    let mut c = config(Durability::Sync);
    c.retry.max_attempts = 1;
    let (e, clock) = in_memory(c)?;
    e.schedule_after(b"a", Duration::ZERO, &[1; 10])?;
    e.schedule_after(b"b", Duration::ZERO, &[2; 200])?;
    e.schedule_after(b"c", ms(1_000), &[3; 3_000])?;
    e.run_until_idle();
    let consumer = e.consumer();
    let s = e.stats();
    assert_eq!(counts(s), (1, 2, 0, 0, 3));
    assert_eq!(consumer.ready(), 2);
    assert_eq!(s.payload_bytes_in_memory, 3_210);
    let a = consumer.try_recv()?;
    assert_eq!(a.key(), b"a");
    assert_eq!((counts(e.stats()), consumer.ready()), ((1, 1, 1, 0, 3), 1));
    assert_eq!(e.nack(&a, None, "no")?, NackOutcome::DeadLettered);
    let s = e.stats();
    assert_eq!(counts(s), (1, 1, 0, 1, 2));
    assert_eq!(
        s.payload_bytes_in_memory, 3_210,
        "the dead letter's 10 bytes stay"
    );
    assert!(e.purge_dead_letter(a.task_id())?);
    assert!(!e.purge_dead_letter(a.task_id())?);
    assert_eq!(e.stats().payload_bytes_in_memory, 3_200);
    clock.advance(ms(1_000));
    for d in drain(&e)? {
        e.ack(&d)?;
    }
    let s = e.stats();
    assert_eq!((counts(s), s.payload_bytes_in_memory), ((0, 0, 0, 0, 0), 0));
    Ok(())
}

/// `Config::pending_tasks_max`: "a task cancelled while a consumer holds it counts until its
/// holder answers or the lease ends, though its key is free at once".
#[test]
fn a_task_cancelled_while_held_counts_against_pending_until_its_holder_answers() -> TestResult {
    let mut c = config(Durability::Sync);
    c.pending_tasks_max = 1;
    c.lease = ms(1_000);
    let (e, clock) = in_memory(c)?;
    for answer in ["ack", "nack", "lease end"] {
        e.schedule_after(b"k", Duration::ZERO, b"")?;
        let d = drain(&e)?.pop().ok_or("due")?;
        assert_eq!(
            e.cancel(b"k")?,
            CancelOutcome::AlreadyDelivered { attempt: 1 }
        );
        assert_eq!(e.stats().pending, 1, "{answer}");
        assert_matches!(
            e.schedule_after(b"k", ms(1), b""),
            Err(ScheduleError::TooManyPending { pending: 1, max: 1 })
        );
        match answer {
            "ack" => e.ack(&d)?,
            "nack" => assert_eq!(e.nack(&d, None, "x")?, NackOutcome::Finished),
            _ => {
                clock.advance(ms(999));
                e.run_until_idle();
                assert_eq!(e.stats().pending, 1, "one tick before the lease ends");
                clock.advance(ms(1));
                e.run_until_idle();
            }
        }
        assert_eq!(e.stats().pending, 0, "{answer}");
        // The key was free all along; now there is room too.
        e.schedule_after(b"k", ms(10), b"")?;
        assert!(e.cancel(b"k")?.is_cancelled());
    }
    Ok(())
}

/// `Config::key_bytes_max` and `payload_bytes_max` lowered later "do not touch tasks already
/// stored: they fire and can be cancelled, but a reschedule of one with a longer key is
/// refused (`KeyTooLong`), and so is the requeue of a dead letter with one"; "a reschedule
/// without a new payload keeps theirs, but the requeue of a dead letter with a larger payload
/// is refused (`PayloadTooLarge`)". A refusal changes nothing.
#[test]
fn limits_lowered_later_keep_stored_tasks_and_refuse_their_reschedule_or_requeue() -> TestResult {
    let mut c = config(Durability::Sync);
    c.retry.max_attempts = 1;
    let mut h = SimHarness::new(7, c)?;
    let big = [9u8; 64];
    let e = h.engine();
    let long_key = b"long-key-waiting";
    let long = e.schedule_after(long_key, ms(10_000), &big)?;
    let short = e.schedule_after(b"w2", ms(10_000), &big)?;
    e.schedule_after(b"cancel-me-longer", ms(10_000), b"")?;
    e.schedule_after(b"dead-with-long-key", Duration::ZERO, b"p")?;
    e.schedule_after(b"d2", Duration::ZERO, &big)?;
    let mut dead_ids = Vec::new();
    for d in drain(e)? {
        assert_eq!(e.nack(&d, None, "x")?, NackOutcome::DeadLettered);
        dead_ids.push((d.key().to_vec(), d.task_id()));
    }
    dead_ids.sort();
    h.stop(Stop::Clean)?;
    h.config.key_bytes_max = 8;
    h.config.payload_bytes_max = 8;
    h.start()?;
    let e = h.engine();
    assert_eq!(e.recovery().pending, 3);
    assert_matches!(
        e.reschedule(long_key, Due::After(ms(1)), None),
        Err(ScheduleError::KeyTooLong { bytes: 16, max: 8 })
    );
    assert_eq!(
        e.reschedule(b"w2", Due::After(ms(20_000)), None)?,
        RescheduleOutcome::Rescheduled(short)
    );
    assert_eq!(
        e.cancel(b"cancel-me-longer")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    let (d2, long_dead) = (dead_ids[0].1, dead_ids[1].1);
    assert_matches!(
        e.requeue_dead_letter(long_dead, Due::After(ms(1))),
        Err(ScheduleError::KeyTooLong { bytes: 18, max: 8 })
    );
    assert_matches!(
        e.requeue_dead_letter(d2, Due::After(ms(1))),
        Err(ScheduleError::PayloadTooLarge { bytes: 64, max: 8 })
    );
    assert_eq!(e.dead_letters().len(), 2, "refusals change nothing");
    let fired = h.advance(ms(10_000))?;
    assert_eq!(fired.len(), 1);
    assert_eq!(
        (fired[0].task_id(), fired[0].key(), fired[0].payload()),
        (long, &long_key[..], &big[..])
    );
    let fired = h.advance(ms(10_000))?;
    assert_eq!(fired.len(), 1);
    assert_eq!((fired[0].task_id(), fired[0].payload()), (short, &big[..]));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Acks, nacks and deliveries

/// `Engine::ack_many`: "all of them, or none if any is not outstanding"; "the error names the
/// first offending task (also for a delivery listed twice)".
#[test]
fn ack_many_names_the_first_offending_delivery_and_acks_none() -> TestResult {
    let (e, _clock) = in_memory(config(Durability::Sync))?;
    for k in [&b"a"[..], b"b", b"c", b"d"] {
        e.schedule_after(k, Duration::ZERO, b"")?;
    }
    let ds = drain(&e)?;
    let [a, b, c, d] = <[_; 4]>::try_from(ds).map_err(|_| "four deliveries")?;
    e.ack(&a)?;
    e.nack(&d, Some(ms(60_000)), "later")?;
    let id = |x: &kairos::Delivery| x.task_id().0;
    assert_matches!(
        e.ack_many(&[b.clone(), a.clone(), d.clone()]),
        Err(AckError::NotOutstanding { task_id }) if task_id == id(&a)
    );
    assert_matches!(
        e.ack_many(&[b.clone(), d.clone(), a.clone()]),
        Err(AckError::LeaseExpired { task_id }) if task_id == id(&d)
    );
    assert_matches!(
        e.ack_many(&[b.clone(), c.clone(), b.clone()]),
        Err(AckError::NotOutstanding { task_id }) if task_id == id(&b)
    );
    assert_eq!(counts(e.stats()), (1, 0, 2, 0, 3), "nothing was acked");
    e.consumer().ack_many(&[c, b])?;
    assert_eq!(counts(e.stats()), (1, 0, 0, 0, 1));
    Ok(())
}

/// `Consumer::nack`: the error text is "kept, up to 4 KiB, with a dead letter" — cut at a
/// character boundary, so it stays valid UTF-8.
#[test]
fn a_nack_error_text_is_kept_up_to_4_kib() -> TestResult {
    let mut c = config(Durability::Sync);
    c.retry.max_attempts = 1;
    let mut h = SimHarness::new(11, c)?;
    let e = h.engine();
    let texts = [
        "x".repeat(5_000),
        "é".repeat(3_000),
        "ab€".repeat(1_000),
        "short".into(),
    ];
    for i in 0..texts.len() {
        e.schedule_after(format!("k{i}").as_bytes(), Duration::ZERO, b"")?;
    }
    for (d, text) in drain(e)?.iter().zip(&texts) {
        assert_eq!(e.nack(d, None, text)?, NackOutcome::DeadLettered);
    }
    let want = [
        "x".repeat(4_096),
        "é".repeat(2_048),
        // "ab€" is 5 bytes: 819 of them are 4 095 bytes, and the next 'a' makes 4 096.
        format!("{}a", "ab€".repeat(819)),
        "short".to_string(),
    ];
    let errors = |e: &Engine| {
        e.dead_letters()
            .into_iter()
            .map(|d| d.error)
            .collect::<Vec<_>>()
    };
    assert_eq!(errors(e), want);
    h.restart(Stop::PowerCut)?;
    assert_eq!(errors(h.engine()), want, "as logged");
    Ok(())
}

/// `Due::At`: "stored as UTC milliseconds, rounded up" — a due time between two milliseconds
/// is never delivered early; `Delivery::due` is the stored time; `Delivery::lateness` is zero
/// for an on-time hand-out.
#[test]
fn an_absolute_due_time_between_milliseconds_rounds_up() -> TestResult {
    let (e, clock) = in_memory(config(Durability::Sync))?;
    let at = UNIX_EPOCH + ms(START_MS + 5) + Duration::from_micros(1);
    e.schedule_at(b"k", at, b"")?;
    clock.advance(ms(5));
    assert!(drain(&e)?.is_empty(), "5 ms is before the due time");
    clock.advance(ms(1));
    let d = drain(&e)?.pop().ok_or("due at +6 ms")?;
    assert_eq!(d.due_ms(), START_MS + 6);
    assert_eq!(d.due(), UNIX_EPOCH + ms(START_MS + 6));
    assert_eq!((d.fired_ms(), d.lateness()), (START_MS + 6, Duration::ZERO));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Stopping

/// `Consumer::recv`: `Closed` "once the engine is shut down (or dropped)" — also for a
/// consumer blocked in `recv` when the engine is dropped, and for one that outlives it;
/// `Consumer::iter` ends when the engine stops; `RecvError::Closed` means "nothing is left to
/// receive": a task handed out but not received is taken back by the shutdown.
#[test]
fn consumers_see_closed_once_the_engine_is_dropped_or_shut_down() -> TestResult {
    let (e, _clock) = in_memory(config(Durability::Sync))?;
    let consumer = e.consumer();
    let blocked = std::thread::spawn({
        let consumer = consumer.clone();
        move || consumer.recv()
    });
    drop(e);
    assert_eq!(
        blocked.join().map_err(|_| "recv panicked")?.err(),
        Some(RecvError::Closed)
    );
    assert_eq!(consumer.try_recv().err(), Some(RecvError::Closed));
    assert_eq!(
        consumer.recv_timeout(Duration::MAX).err(),
        Some(RecvError::Closed)
    );
    assert_eq!(consumer.iter().count(), 0);

    let (e, _clock) = in_memory(config(Durability::Sync))?;
    e.schedule_after(b"k", Duration::ZERO, b"")?;
    e.run_until_idle();
    let consumer = e.consumer();
    assert_eq!(consumer.ready(), 1);
    // A timeout too long for an `Instant` waits like `recv`: the ready task comes.
    let d = consumer.recv_timeout(Duration::MAX)?;
    consumer.nack(&d, Some(Duration::ZERO), "again")?;
    e.run_until_idle();
    assert_eq!(consumer.ready(), 1);
    e.shutdown()?;
    assert_eq!(consumer.try_recv().err(), Some(RecvError::Closed));
    assert_eq!(consumer.iter().count(), 0);
    assert_eq!(e.stats().ready, 0, "taken back");
    Ok(())
}

/// `Engine::run_until_idle`: "Returns at once if the engine is stopped" — with tasks due.
/// `Engine::shutdown` is idempotent; `sync` and `cancel` answer `Closed` after it.
#[test]
fn run_until_idle_returns_at_once_after_shutdown() -> TestResult {
    let h = SimHarness::new(13, config(Durability::Buffered))?;
    let e = h.engine();
    e.schedule_after(b"k", ms(1), b"")?;
    e.shutdown()?;
    h.clock.advance(ms(10));
    e.run_until_idle();
    e.shutdown()?;
    assert_matches!(e.sync(), Err(SyncError::Closed));
    assert_matches!(e.cancel(b"k"), Err(CancelError::Closed));
    Ok(())
}

/// `Engine::pause_deliveries` / `resume_deliveries`: "Idempotent"; `deliveries_paused` says
/// which; `Config::deliveries_paused` opens paused.
#[test]
fn pause_and_resume_are_idempotent() -> TestResult {
    let mut c = config(Durability::Sync);
    c.deliveries_paused = true;
    let (e, clock) = in_memory(c)?;
    assert!(e.deliveries_paused());
    e.schedule_after(b"a", Duration::ZERO, b"")?;
    e.pause_deliveries();
    assert!(drain(&e)?.is_empty());
    e.resume_deliveries();
    e.resume_deliveries();
    assert!(!e.deliveries_paused());
    let got = drain(&e)?;
    assert_eq!(got.len(), 1);
    e.pause_deliveries();
    e.pause_deliveries();
    assert!(e.deliveries_paused());
    e.schedule_after(b"b", ms(5), b"")?;
    clock.advance(ms(5));
    assert!(drain(&e)?.is_empty());
    e.resume_deliveries();
    assert_eq!(drain(&e)?.len(), 1);
    Ok(())
}

/// `Consumer::recv_timeout`: the timeout is real time, also on a `ManualClock`: moving the
/// clock past it does not end the wait, and it ends once that much real time has passed.
#[test]
fn recv_timeout_waits_real_time_on_a_manual_clock() -> TestResult {
    let (e, clock) = in_memory(config(Durability::Sync))?;
    let consumer = e.consumer();
    let mover = std::thread::spawn(move || {
        std::thread::sleep(ms(10));
        clock.advance(Duration::from_secs(3600));
    });
    let started = std::time::Instant::now();
    assert_eq!(
        consumer.recv_timeout(ms(100)).err(),
        Some(RecvError::Timeout)
    );
    assert!(started.elapsed() >= ms(100), "{:?}", started.elapsed());
    mover.join().map_err(|_| "the clock mover panicked")?;
    Ok(())
}

/// `Engine`: a drop without `shutdown` is a process crash — every returned call is kept, also
/// under `Buffered` (nothing was synced), but a task waiting unreceived in the ready queue at
/// the drop has used its attempt, and one on its last attempt is dead-lettered.
#[test]
fn a_drop_keeps_returned_calls_and_uses_up_the_attempt_of_tasks_handed_out() -> TestResult {
    let mut c = config(Durability::Buffered);
    c.retry.max_attempts = 2;
    let mut h = SimHarness::new(12, c)?;
    h.engine().schedule_after(b"ready", Duration::ZERO, b"")?;
    h.engine()
        .schedule_after(b"later", Duration::from_secs(60), b"")?;
    let _ = h.engine().cancel(b"later")?;
    h.engine()
        .schedule_after(b"later", Duration::from_secs(60), b"again")?;
    h.engine().run_until_idle();
    assert_eq!(h.engine().stats().ready, 1);
    h.restart(Stop::ProcessCrash)?;
    let r = h.engine().recovery().clone();
    assert_eq!((r.pending, r.redelivered, r.dead_lettered), (2, 1, 0));
    h.engine().run_until_idle();
    let d = h.engine().consumer().try_recv()?;
    assert_eq!((d.key(), d.attempt()), (&b"ready"[..], 2));
    h.restart(Stop::ProcessCrash)?;
    let r = h.engine().recovery().clone();
    assert_eq!((r.pending, r.redelivered, r.dead_lettered), (1, 0, 1));
    assert_eq!(h.engine().dead_letters()[0].key, b"ready");
    Ok(())
}

/// `Engine::shutdown`: on a poisoned engine it fails, and releases the directory all the same,
/// so the directory reopens while the poisoned `Engine` value still exists.
#[test]
fn a_failed_shutdown_releases_the_directory() -> TestResult {
    use kairos::kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let h = SimHarness::new(13, config(Durability::Sync))?;
    h.engine()
        .schedule_after(b"a", Duration::from_secs(10), b"")?;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    assert_matches!(
        h.engine()
            .schedule_after(b"b", Duration::from_secs(10), b""),
        Err(ScheduleError::Poisoned { .. })
    );
    assert_matches!(h.open(), Err(OpenError::Locked { .. }));
    assert!(h.engine().shutdown().is_err());
    let reopened = h.open()?;
    assert!(reopened.lookup(b"a")?.is_some());
    reopened.shutdown()?;
    Ok(())
}

/// `Recovery::wal`: `clean_shutdown` is false on the first open of a new directory (with
/// `last_lsn` 0), true after `shutdown` — and after a drop that logged nothing since — and
/// false after a drop that followed a change.
#[test]
fn clean_shutdown_is_false_for_a_new_directory_and_after_a_drop() -> TestResult {
    let mut h = SimHarness::new(11, config(Durability::Sync))?;
    let fresh = h.engine().recovery().wal.clone();
    assert!(!fresh.clean_shutdown);
    assert_eq!(
        (fresh.last_lsn, fresh.records),
        (kairos::kairos_wal::Lsn(0), 0)
    );
    h.engine()
        .schedule_after(b"k", Duration::from_secs(60), b"")?;
    h.restart(Stop::Clean)?;
    assert!(h.engine().recovery().wal.clean_shutdown);
    h.restart(Stop::ProcessCrash)?;
    assert!(
        h.engine().recovery().wal.clean_shutdown,
        "nothing logged since the close"
    );
    let _ = h.engine().cancel(b"k")?;
    h.restart(Stop::ProcessCrash)?;
    let crashed = &h.engine().recovery().wal;
    assert!(!crashed.clean_shutdown);
    assert_ne!(crashed.last_lsn, kairos::kairos_wal::Lsn(0));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Task ids

/// `TaskId`: "unique for the life of a data directory (never reused, even after a restart),
/// increasing in scheduling order" — also when every task is finished and a checkpoint has
/// deleted the log that named them, across each kind of stop, under `Sync`.
#[test]
fn task_ids_are_never_reused_after_a_restart_under_sync() -> TestResult {
    for (n, how) in [Stop::Clean, Stop::ProcessCrash, Stop::PowerCutDropUnsynced]
        .into_iter()
        .enumerate()
    {
        let mut h = SimHarness::new(20 + n as u64, config(Durability::Sync))?;
        let e = h.engine();
        let mut last = kairos::TaskId(0);
        for i in 0..3 {
            let id = e.schedule_after(format!("k{i}").as_bytes(), Duration::ZERO, b"")?;
            assert!(id > last, "{how:?}");
            last = id;
        }
        for d in drain(e)? {
            e.ack(&d)?;
        }
        let report = e.checkpoint()?;
        assert_eq!((report.tasks, report.written), (0, true));
        h.restart(how)?;
        let again = h.engine().schedule_after(b"k0", ms(1), b"")?;
        assert!(again > last, "{how:?}: {again:?} after {last:?}");
        h.restart(how)?;
        let third = h.engine().schedule_after(b"k1", ms(1), b"")?;
        assert!(third > again, "{how:?}: {third:?} after {again:?}");
    }
    Ok(())
}

/// Under `Buffered` (and `Interval`), a power loss that takes an unsynced schedule away takes
/// its id with it: the next schedule after the reopen gets the same id (`TaskId`'s docs say
/// so). After `Engine::sync`, it does not.
#[test]
fn a_power_loss_under_buffered_gives_a_lost_schedule_id_again() -> TestResult {
    let mut h = SimHarness::new(30, config(Durability::Buffered))?;
    let kept = h.engine().schedule_after(b"kept", ms(10), b"")?;
    h.engine().sync()?;
    let lost = h.engine().schedule_after(b"lost", ms(10), b"")?;
    h.restart(Stop::PowerCutDropUnsynced)?;
    assert_eq!(h.engine().recovery().pending, 1);
    let next = h.engine().schedule_after(b"other", ms(10), b"")?;
    assert_eq!((kept.0 + 1, next), (lost.0, lost));
    h.engine().sync()?;
    h.restart(Stop::PowerCutDropUnsynced)?;
    assert!(h.engine().schedule_after(b"after-sync", ms(10), b"")? > next);
    Ok(())
}

// ----------------------------------------------------------------------------------------
// fdatasyncs

/// The fdatasyncs of one call, counted on the simulated disk once the driver is idle.
fn syncs_of(h: &SimHarness, call: impl FnOnce(&Engine) -> TestResult) -> TestResult<u64> {
    h.engine().run_until_idle();
    let before = h.sim.sync_count();
    call(h.engine())?;
    h.engine().run_until_idle();
    Ok(h.sim.sync_count() - before)
}

/// `schedule_many`, `cancel_many` and `ack_many`: "one log write (one fdatasync under
/// `Sync`)", plus the small second one of the durable mark with `proof_before_ack` (the
/// default; `Config::proof_before_ack`: "a lone caller pays a second fdatasync"). `sync`
/// under `Buffered` costs the same; a second `sync` with nothing new costs none.
#[test]
fn batches_and_sync_cost_one_fdatasync_plus_the_proof() -> TestResult {
    for proof in [true, false] {
        let extra = u64::from(proof);
        let mut c = config(Durability::Sync);
        c.proof_before_ack = proof;
        let h = SimHarness::new(40, c)?;
        let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("k{i}").into_bytes()).collect();
        let tasks: Vec<NewTask<'_>> = keys
            .iter()
            .map(|k| NewTask {
                key: k,
                due: Due::After(ms(10)),
                payload: b"p",
            })
            .collect();
        let n = syncs_of(&h, |e| Ok(e.schedule_many(&tasks).map(drop)?))?;
        assert_eq!(n, 1 + extra, "schedule_many, proof {proof}");
        let n = syncs_of(&h, |e| {
            let refs: Vec<&[u8]> = keys[..50].iter().map(|k| &k[..]).collect();
            Ok(e.cancel_many(&refs).map(drop)?)
        })?;
        assert_eq!(n, 1 + extra, "cancel_many, proof {proof}");
        h.clock.advance(ms(10));
        h.engine().run_until_idle();
        let ds = drain(h.engine())?;
        assert_eq!(ds.len(), 50);
        let n = syncs_of(&h, |e| Ok(e.ack_many(&ds)?))?;
        assert_eq!(n, 1 + extra, "ack_many, proof {proof}");
        assert_eq!(syncs_of(&h, |e| Ok(e.sync()?))?, 0, "sync under Sync");

        let mut c = config(Durability::Buffered);
        c.proof_before_ack = proof;
        let b = SimHarness::new(41, c)?;
        assert_eq!(syncs_of(&b, |e| Ok(e.schedule_many(&tasks).map(drop)?))?, 0);
        assert_eq!(
            syncs_of(&b, |e| Ok(e.sync()?))?,
            1 + extra,
            "sync, proof {proof}"
        );
        assert_eq!(syncs_of(&b, |e| Ok(e.sync()?))?, 0, "nothing new");
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Pause

/// `Engine::pause_deliveries`: "A lease that runs out while paused is over for its holder
/// (ack, nack and extend are refused, by the clock), but its expiry waits for the resume:
/// until then the task counts as in flight, `reschedule` of its key is `InFlight` and
/// `cancel` answers `AlreadyDelivered`." At the resume the cancelled one is finished and the
/// other retried after its backoff.
#[test]
fn a_lease_run_out_while_paused_stays_in_flight_until_the_resume() -> TestResult {
    let mut c = config(Durability::Sync);
    c.lease = ms(1_000);
    c.retry.backoff_jitter_percent = 0;
    let h = SimHarness::new(50, c)?;
    let e = h.engine();
    e.schedule_after(b"resched", Duration::ZERO, b"")?;
    e.schedule_after(b"cancel", Duration::ZERO, b"")?;
    let ds = drain(e)?;
    assert_eq!(ds.len(), 2);
    e.pause_deliveries();
    h.clock.advance(ms(1_000));
    e.run_until_idle();
    for d in &ds {
        assert_matches!(e.ack(d), Err(AckError::LeaseExpired { .. }));
        assert_matches!(e.nack(d, None, "x"), Err(AckError::LeaseExpired { .. }));
        assert_matches!(
            e.extend_lease(d, ms(1_000)),
            Err(AckError::LeaseExpired { .. })
        );
    }
    assert_eq!(counts(e.stats()), (0, 0, 2, 0, 2));
    assert_matches!(
        e.reschedule(b"resched", Due::After(ms(1)), None),
        Err(ScheduleError::InFlight { ref key }) if key == "resched"
    );
    assert_eq!(
        e.cancel(b"cancel")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    h.clock.advance(ms(60_000));
    e.run_until_idle();
    assert_eq!(
        counts(e.stats()),
        (0, 0, 2, 0, 2),
        "a minute later, still paused"
    );

    e.resume_deliveries();
    e.run_until_idle();
    assert_eq!(counts(e.stats()), (1, 0, 0, 0, 1));
    let again = h.advance(ms(1_000))?;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].key(), again[0].attempt()), (&b"resched"[..], 2));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Lease and retry bounds

/// `Consumer::extend_lease`: the lease must be in "1 ms..=12 h" (`InvalidLease` otherwise),
/// so a sub-millisecond one is refused as the zero one is; and an error's text never names a
/// value inside the range it says was missed (a lease a fraction of a millisecond past 12 h
/// shows as 43 200 001 ms, not 43 200 000). `Consumer::nack`'s `RetryTooFar` likewise.
#[test]
fn lease_and_retry_bounds_hold_to_the_millisecond_and_their_texts_say_so() -> TestResult {
    let mut c = config(Durability::Sync);
    c.delay_max = ms(10_000);
    c.retry.backoff_max = ms(1_000);
    let (e, _clock) = in_memory(c)?;
    e.schedule_after(b"k", Duration::ZERO, b"")?;
    let d = drain(&e)?.pop().ok_or("due")?;
    let micros = Duration::from_micros;
    assert_matches!(
        e.extend_lease(&d, micros(500)),
        Err(AckError::InvalidLease {
            lease_ms: 0,
            max_ms: 43_200_000
        })
    );
    assert_matches!(
        e.extend_lease(&d, LEASE_MAX + micros(1)),
        Err(AckError::InvalidLease {
            lease_ms: 43_200_001,
            max_ms: 43_200_000
        })
    );
    assert_eq!(
        e.extend_lease(&d, LEASE_MAX + micros(1))
            .map_err(|e| e.to_string()),
        Err("lease of 43200001 ms is not in 1..=43200000 ms".to_string())
    );
    e.extend_lease(&d, ms(1))?;
    e.extend_lease(&d, LEASE_MAX)?;
    assert_eq!(
        e.nack(&d, Some(ms(10_000) + micros(1)), "x")
            .map_err(|e| e.to_string()),
        Err("retry after 10001 ms is past the maximum delay of 10000 ms".to_string())
    );
    assert_matches!(
        e.nack(&d, Some(ms(10_000)), "x")?,
        NackOutcome::Retry {
            next_attempt: 2,
            ..
        }
    );
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Types

/// `Engine` "is `Send + Sync`: share it by reference or in an `Arc`"; a `Consumer` is cloned
/// into "any number of consumer threads", so it and its `Delivery` cross threads too; the
/// error types are `std::error::Error + Send + Sync + 'static`, so `?` boxes them (as
/// `anyhow` does).
#[test]
fn the_handles_cross_threads_and_the_errors_box() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    send_sync::<Engine>();
    send_sync::<Arc<Engine>>();
    send_sync::<kairos::Consumer>();
    send_sync::<kairos::Delivery>();
    send_sync::<Stats>();
    send_sync::<kairos::Recovery>();
    send_sync::<ManualClock>();
    send_sync::<kairos::SystemClock>();
    // What calls return, kept or sent to another thread (a dead-letter page, a lookup, a
    // checkpoint's report from a maintenance thread), and the configuration.
    send_sync::<kairos::DeadLetter>();
    send_sync::<kairos::TaskInfo>();
    send_sync::<kairos::CheckpointReport>();
    send_sync::<kairos::CancelOutcome>();
    send_sync::<kairos::NackOutcome>();
    send_sync::<kairos::RescheduleOutcome>();
    send_sync::<kairos::NewTask<'static>>();
    send_sync::<Config>();
    error::<OpenError>();
    error::<ScheduleError>();
    error::<CancelError>();
    error::<AckError>();
    error::<RecvError>();
    error::<SyncError>();
    error::<CheckpointError>();
    error::<kairos::ShutdownError>();
    error::<kairos::LookupError>();
    error::<kairos::kairos_wal::WalError>();
}

// ----------------------------------------------------------------------------------------
// Memory

/// `Engine::cancel`: "A cancelled task's memory (entry, key, payload, wheel node) is freed at
/// once" — its payload bytes leave `Stats::payload_bytes_in_memory` with the answer, for a
/// waiting task, a retry, and one handed out but not received.
#[test]
fn a_cancel_frees_the_payload_at_once() -> TestResult {
    let (e, _clock) = in_memory(config(Durability::Sync))?;
    e.schedule_after(b"wait", ms(1_000), &[1; 2_000])?;
    e.schedule_after(b"retry", Duration::ZERO, &[2; 300])?;
    e.schedule_after(b"ready", Duration::ZERO, &[3; 40])?;
    e.run_until_idle();
    let retry = e.consumer().try_recv()?;
    assert_eq!(retry.key(), b"retry");
    e.nack(&retry, Some(ms(500)), "x")?;
    assert_eq!(e.stats().payload_bytes_in_memory, 2_340);
    assert_eq!(
        e.cancel(b"wait")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    assert_eq!(e.stats().payload_bytes_in_memory, 340);
    assert_eq!(
        e.cancel(b"retry")?,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    assert_eq!(e.stats().payload_bytes_in_memory, 40);
    assert_eq!(
        e.cancel(b"ready")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    let s = e.stats();
    assert_eq!((counts(s), s.payload_bytes_in_memory), ((0, 0, 0, 0, 0), 0));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// At most once under the weaker durability modes

/// `DeliveryGuarantee::AtMostOnce`: "Nothing is delivered twice across a process crash in
/// every durability mode … under `Interval` or `Buffered` a power loss can take the ack with
/// the rest of the unsynced suffix (until … `Engine::sync`), and the task is then delivered
/// again."
#[test]
fn at_most_once_under_interval_and_buffered_redelivers_only_after_a_power_loss() -> TestResult {
    for (n, durability) in [
        Durability::Buffered,
        Durability::Interval(Duration::from_secs(3_600)),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = config(durability);
        c.delivery = kairos::DeliveryGuarantee::AtMostOnce;
        let mut h = SimHarness::new(60 + n as u64, c)?;
        let id = h.engine().schedule_after(b"k", ms(10), b"p")?;
        h.engine().sync()?;
        let first = h.advance(ms(10))?;
        assert_eq!(first.len(), 1);
        h.restart(Stop::ProcessCrash)?;
        assert_eq!(h.engine().recovery().pending, 0, "{durability:?}");
        assert!(
            drain(h.engine())?.is_empty(),
            "{durability:?}: twice after a crash"
        );

        h.engine().schedule_after(b"lost-ack", ms(10), b"q")?;
        h.engine().sync()?;
        let got = h.advance(ms(10))?;
        assert_eq!(got.len(), 1);
        h.restart(Stop::PowerCutDropUnsynced)?;
        assert_eq!(h.engine().recovery().pending, 1, "{durability:?}");
        let again = drain(h.engine())?;
        assert_eq!(again.len(), 1, "{durability:?}");
        assert_eq!(
            (again[0].task_id(), again[0].attempt(), again[0].payload()),
            (got[0].task_id(), 1, &b"q"[..]),
            "{durability:?}"
        );
        // After `sync`, the ack survives the power loss.
        h.engine().sync()?;
        h.restart(Stop::PowerCutDropUnsynced)?;
        assert_eq!(h.engine().recovery().pending, 0, "{durability:?}");
        assert!(drain(h.engine())?.is_empty());
        assert!(id < got[0].task_id());
    }
    Ok(())
}

/// `clock::system_time_to_ms`: `None` "for a time before it or past `u64::MAX` ms";
/// `ms_to_system_time` gives every `u64` back.
#[test]
fn time_conversions_cover_the_whole_u64_range() {
    use kairos::clock::{ms_to_system_time, system_time_to_ms};
    let last = ms_to_system_time(u64::MAX);
    assert_eq!(system_time_to_ms(last), Some(u64::MAX));
    assert_eq!(system_time_to_ms(last + ms(1)), None);
    assert_eq!(
        system_time_to_ms(last + Duration::from_micros(999)),
        Some(u64::MAX)
    );
    assert_eq!(system_time_to_ms(UNIX_EPOCH), Some(0));
    assert_eq!(
        system_time_to_ms(UNIX_EPOCH + Duration::from_micros(1_999)),
        Some(1)
    );
}

/// The call errors (`ScheduleError`, `CancelError`, `LookupError`, `AckError`, `SyncError`,
/// like `RecvError`) are `Clone + PartialEq + Eq`: a caller keeps or compares them whole.
#[test]
fn call_errors_compare_and_clone() -> TestResult {
    let (engine, _clock) = in_memory(Config::default())?;
    engine.schedule_after(b"k", ms(10), b"")?;
    let refused = engine.schedule_after(b"k", ms(10), b"").unwrap_err();
    assert_eq!(
        refused,
        ScheduleError::AlreadyExists {
            key: "k".to_owned()
        }
    );
    assert_eq!(refused.clone(), refused);
    engine.shutdown()?;
    assert_eq!(engine.cancel(b"k"), Err(CancelError::Closed));
    assert_eq!(engine.sync(), Err(SyncError::Closed));
    Ok(())
}

/// `Consumer::holds`: true while the delivery's attempt is the outstanding lease on its task;
/// false once it is cancelled while held, acked, nacked, its lease ran out (processed), for a
/// delivery taken at most once, and for one from before a restart; `Closed` after a shutdown.
/// `Consumer::lookup` answers as `Engine::lookup`.
#[test]
fn a_consumer_tells_whether_it_still_holds_a_delivery() -> TestResult {
    let mut c = Config::default();
    c.lease = ms(100);
    let (engine, clock) = in_memory(c)?;
    let consumer = engine.consumer();
    let take = |key: &[u8]| -> TestResult<kairos::Delivery> {
        engine.schedule_after(key, Duration::ZERO, b"")?;
        engine.run_until_idle();
        Ok(consumer.try_recv()?)
    };
    let acked = take(b"acked")?;
    assert!(consumer.holds(&acked)?);
    assert_eq!(
        consumer.lookup(b"acked")?.map(|t| t.state),
        Some(kairos::TaskState::Leased)
    );
    consumer.ack(&acked)?;
    assert!(!consumer.holds(&acked)?);
    assert_eq!(consumer.lookup(b"acked")?, None);
    let cancelled = take(b"cancelled")?;
    assert_eq!(
        engine.cancel(b"cancelled")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    assert!(!consumer.holds(&cancelled)?);
    let nacked = take(b"nacked")?;
    consumer.nack(&nacked, Some(ms(1)), "failed")?;
    assert!(!consumer.holds(&nacked)?);
    // Its next attempt is held by whoever receives it, in that attempt only.
    clock.advance(ms(1));
    engine.run_until_idle();
    let again = consumer.try_recv()?;
    assert_eq!((again.task_id(), again.attempt()), (nacked.task_id(), 2));
    assert!(consumer.holds(&again)?);
    assert!(!consumer.holds(&nacked)?);
    consumer.ack(&again)?;
    let expired = take(b"expired")?;
    assert!(consumer.holds(&expired)?);
    clock.advance(ms(100));
    engine.run_until_idle();
    assert!(!consumer.holds(&expired)?);
    engine.shutdown()?;
    assert_eq!(consumer.holds(&expired), Err(kairos::LookupError::Closed));

    // At most once: finished when received.
    let mut c = Config::default();
    c.delivery = kairos::DeliveryGuarantee::AtMostOnce;
    let (engine, _clock) = in_memory(c)?;
    engine.schedule_after(b"once", Duration::ZERO, b"")?;
    engine.run_until_idle();
    let consumer = engine.consumer();
    let once = consumer.try_recv()?;
    assert!(!consumer.holds(&once)?);

    // A delivery from before a restart: the task is held again, by another attempt.
    let mut h = SimHarness::new(29, config(Durability::Sync))?;
    h.engine().schedule_after(b"k", Duration::ZERO, b"")?;
    h.engine().run_until_idle();
    let before = h.engine().consumer().try_recv()?;
    h.restart(Stop::Clean)?;
    h.engine().run_until_idle();
    let consumer = h.engine().consumer();
    let after = consumer.try_recv()?;
    assert_eq!((after.task_id(), after.attempt()), (before.task_id(), 2));
    assert!(consumer.holds(&after)?);
    assert!(!consumer.holds(&before)?);
    Ok(())
}
