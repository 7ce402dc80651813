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
    let bad: [(Tweak, &str); 24] = [
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
            "delivery of task {} is not outstanding (finished, stale, or from another engine)",
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
